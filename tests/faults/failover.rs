//! Failures of the servers: step-downs, a killed primary, every member
//! restarted at once. Leases must survive a failover shorter than half
//! their TTL.

use std::time::Duration;

use mongo_lease::testkit::{ReplicaSet, monotonic_ns};
use tokio::time::Instant;

use crate::harness::{Fleet, Params};
use crate::scenario::{
    Rounds, finish, params, progress, scenario_slot, settled_primary, summarize, three_members,
    write_probe,
};

/// (b) The primary steps down every few seconds; leases (TTL 6 s) must
/// survive each failover.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn b_primary_step_down_every_few_seconds() {
    let _slot = scenario_slot().await;
    let rs = three_members(false).await;
    let (p, mut fleet) = working_fleet(&rs).await;
    let mut failovers = Outages::default();
    let mut rounds = Rounds::new(2);
    while rounds.next() {
        rs.wait_for_primary(Duration::from_secs(30)).await.unwrap();
        let from = fleet.history.len();
        let (old, took) = failovers
            .time(&fleet, rs.step_down_for(Duration::from_secs(2)))
            .await;
        let old = old.expect("step down");
        eprintln!("step-down of member {old}: writes again after {took:.2} s");
        progress(&fleet, from, 10, Duration::from_secs(60)).await;
        tokio::time::sleep(Duration::from_secs(2)).await; // "every few seconds"
    }
    judge_failovers("b_step_down", "step-downs", &p, &mut fleet, &failovers).await;
}

/// (c) The primary is killed with SIGKILL, then restarted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_primary_kill_9_and_restart() {
    let _slot = scenario_slot().await;
    let rs = three_members(false).await;
    let (p, mut fleet) = working_fleet(&rs).await;
    let mut failovers = Outages::default();
    let mut rounds = Rounds::new(1);
    while rounds.next() {
        let primary = settled_primary(&rs).await;
        let from = fleet.history.len();
        let (killed, took) = failovers.time(&fleet, rs.kill(primary)).await;
        killed.unwrap();
        eprintln!("kill -9 of primary {primary}: writes again after {took:.2} s");
        progress(&fleet, from, 10, Duration::from_secs(60)).await;
        rs.restart(primary).await.unwrap();
        let from = fleet.history.len();
        progress(&fleet, from, 10, Duration::from_secs(60)).await;
    }
    judge_failovers("c_kill_primary", "kills", &p, &mut fleet, &failovers).await;
}

/// (g) Every member is restarted (SIGTERM, then started again) at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn g_restart_all_members() {
    let _slot = scenario_slot().await;
    let rs = three_members(false).await;
    let (_, mut fleet) = working_fleet(&rs).await;
    let mut outages = Outages::default();
    let mut rounds = Rounds::new(1);
    while rounds.next() {
        let restart_all = async {
            let stopped = futures::future::join_all((0..3).map(|i| rs.stop(i))).await;
            stopped.into_iter().collect::<Result<Vec<_>, _>>().unwrap();
            let restarted = futures::future::join_all((0..3).map(|i| rs.restart(i))).await;
            restarted
                .into_iter()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
        };
        let ((), took) = outages.time(&fleet, restart_all).await;
        eprintln!("all members restarted: writes again after {took:.2} s");
        let from = fleet.history.len();
        progress(&fleet, from, 10, Duration::from_secs(60)).await;
    }
    let report = finish("g_restart_all", &mut fleet).await;
    let (kept, lost) = report.across(&outages.windows);
    eprintln!(
        "FIGURE g_restart_all: writes resumed after {}; leases held during the outage: kept {kept} / lost {lost}",
        summarize(&outages.lengths),
    );
}

/// The workers of a failover scenario (TTL 6 s, 4 keys, 30 % of holds
/// longer than TTL / 2) on `rs`, once they completed 10 critical sections.
async fn working_fleet(rs: &ReplicaSet) -> (Params, Fleet) {
    let p = Params {
        keys: 4,
        long_hold_pct: 30,
        ..params(6.0)
    };
    let mut fleet = Fleet::new(&rs.uri(), p.clone()).await;
    fleet.spawn_n(p.workers).await;
    progress(&fleet, 0, 10, Duration::from_secs(60)).await;
    (p, fleet)
}

/// The outages a scenario caused, as clients saw them.
#[derive(Default)]
struct Outages {
    /// From each fault's start until a majority write succeeded again, in
    /// seconds.
    lengths: Vec<f64>,
    /// The same spans in `CLOCK_MONOTONIC` nanoseconds (the workers' clock).
    windows: Vec<(u64, u64)>,
}

impl Outages {
    /// Injects `fault` once a worker of `fleet` has held a lease for 100 ms
    /// (longer than any short hold, `Params::hold_ms`: a long one, held
    /// half the TTL, so it is held through the fault), then waits until a
    /// majority write through the fleet's client succeeds; returns the
    /// fault's output and the outage's length in seconds.
    async fn time<T>(
        &mut self,
        fleet: &Fleet,
        fault: impl std::future::Future<Output = T>,
    ) -> (T, f64) {
        let (age, limit) = (Duration::from_millis(100), Duration::from_secs(60));
        fleet.history.wait_held_for(age, limit).await;
        let client = &fleet.client;
        let started = Instant::now();
        let t0 = monotonic_ns();
        let out = fault.await;
        let took = write_probe(client, started).await.as_secs_f64();
        self.lengths.push(took);
        self.windows.push((t0, monotonic_ns()));
        (out, took)
    }
}

/// Ends a scenario of `faults`: some lease was held during a failover, and
/// none was lost if every failover was shorter than TTL / 2 (otherwise
/// that verdict is reported as not checked).
async fn judge_failovers(
    name: &str,
    faults: &str,
    p: &Params,
    fleet: &mut Fleet,
    failovers: &Outages,
) {
    let report = finish(name, fleet).await;
    let (kept, lost) = report.across(&failovers.windows);
    eprintln!(
        "FIGURE {name}: {} {faults}, writes resumed after {}; leases held during a failover: kept {kept} / lost {lost}",
        failovers.lengths.len(),
        summarize(&failovers.lengths),
    );
    assert!(kept + lost > 0, "no lease was held during a failover");
    let longest = failovers.lengths.iter().cloned().fold(0.0, f64::max);
    if longest < p.ttl.as_secs_f64() / 2.0 {
        assert_eq!(
            report.lost, 0,
            "a lease was lost in a failover of at most {longest:.2} s (TTL {:?})",
            p.ttl
        );
    } else {
        eprintln!(
            "NOT CHECKED: {name}: \"no lease lost\": the longest failover took {longest:.2} s, not under TTL / 2 ({:?}); {} lost",
            p.ttl / 2,
            report.lost
        );
    }
}
