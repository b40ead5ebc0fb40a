//! Safety under faults: several worker processes, each with its own lease
//! manager, on a real 3-member replica set, with failures injected.
//!
//! Each worker (a separate OS process: this test binary re-executed on the
//! ignored `worker_process` test) loops over acquire → fenced claim → hold →
//! fenced write → release on a few keys, and prints every event with a
//! `CLOCK_MONOTONIC` timestamp (one clock for all processes of the machine).
//! The checker (`checker::check`) then asserts mutual exclusion, that every
//! refused fenced step reached a holder already told its lease was lost, and
//! that no update was lost (the counters equal the applied writes, exactly).
//! After each scenario every manager shuts down and no lock document may be
//! left behind.
//!
//! At most three scenarios run at a time (`scenario::scenario_slot`); the
//! timing figures they print are for reading, and the bounds they assert
//! leave room for a loaded machine.
//! `MONGO_LEASE_SOAK=1` makes each one run for 5 minutes, repeating its
//! fault (`MONGO_LEASE_SOAK_SECS=<n>` for another duration).
//! Lines starting with `FIGURE` are the measured figures.
//!
//! The seeded fault runs (`seeded.rs`, docs/fault-runs.md) draw
//! `failCommand` fail points, step-downs, frozen members and killed workers
//! from a seed while the workers contend with every kind of lease
//! (`kinds.rs`); the same checker judges them.

mod checker;
mod clock_offset;
#[path = "../common/mod.rs"]
mod common;
mod failover;
mod harness;
mod holder_crashes;
mod kinds;
mod link_faults;
mod scenario;
mod seeded;
mod worker;

use std::time::Duration;

use harness::Fleet;
use scenario::{Rounds, finish, params, progress, scenario_slot, three_members};

/// The worker process. Not a test of its own: the scenarios start it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process of the fault scenarios, started by them"]
async fn worker_process() {
    let Ok(config) = std::env::var(worker::ENV) else {
        eprintln!(
            "not a worker: {} is not set (the fault scenarios start this)",
            worker::ENV
        );
        return;
    };
    if std::env::var_os("MONGO_LEASE_FAULTS_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("mongo_lease=debug"))
            .with_writer(std::io::stderr)
            .try_init();
    }
    worker::run(worker::Config::decode(&config)).await;
}

/// (a) No faults: the baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_no_faults() {
    let _slot = scenario_slot().await;
    let rs = three_members(false).await;
    let p = params(2.0);
    let mut fleet = Fleet::new(&rs.uri(), p.clone()).await;
    fleet.spawn_n(p.workers).await;
    let mut rounds = Rounds::new(1);
    while rounds.next() {
        progress(&fleet, 0, 60 * rounds.done, Duration::from_secs(120)).await;
    }
    let report = finish("a_no_faults", &mut fleet).await;
    assert_eq!(report.lost, 0, "no lease may be lost without a fault");
    assert_eq!(report.refused, 0);
}
