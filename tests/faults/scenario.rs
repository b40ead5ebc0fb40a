//! What the fault scenarios share: one scenario at a time, the quick and
//! soak rounds, the replica set, the workers' parameters, waiting for
//! progress, and the checks and figures every scenario ends with.

use std::time::Duration;

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions, monotonic_ns};
use mongodb::Client;
use mongodb::bson::doc;
use mongodb::options::WriteConcern;
use tokio::time::Instant;

use crate::checker::Report;
use crate::harness::{Fleet, Params};

/// At most three scenarios at a time in this binary (each starts its own
/// replica set and worker processes). Their verdicts do not depend on the
/// machine's speed, and they wait far more than they compute: with three at
/// a time the binary keeps two cores about a third busy.
pub async fn scenario_slot() -> tokio::sync::SemaphorePermit<'static> {
    static SCENARIOS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(3);
    SCENARIOS.acquire().await.expect("never closed")
}

/// How long to keep injecting faults: `None` for the quick run, in which
/// each scenario injects a fixed number of faults.
fn soak() -> Option<Duration> {
    if let Some(secs) = std::env::var("MONGO_LEASE_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        return Some(Duration::from_secs(secs));
    }
    std::env::var("MONGO_LEASE_SOAK")
        .is_ok_and(|v| !v.is_empty() && v != "0")
        .then_some(Duration::from_secs(300))
}

/// Repeats a fault `quick` times, or until the soak duration has passed.
pub struct Rounds {
    started: Instant,
    pub done: usize,
    quick: usize,
}

impl Rounds {
    pub fn new(quick: usize) -> Rounds {
        Rounds {
            started: Instant::now(),
            done: 0,
            quick,
        }
    }
    pub fn next(&mut self) -> bool {
        let more = match soak() {
            Some(d) => self.started.elapsed() < d || self.done == 0,
            None => self.done < self.quick,
        };
        self.done += more as usize;
        more
    }
}

/// A dedicated 3-member replica set with fast elections. Faults need
/// servers of our own, so this ignores `MONGODB_URI`.
pub async fn three_members(proxied: bool) -> ReplicaSet {
    ReplicaSet::start(ReplicaSetOptions::default().members(3).proxied(proxied))
        .await
        .expect("3-member replica set")
}

/// Waits until member 0 is primary and returns its index. Member 0 has the
/// highest priority: after a restart it takes the primary role back by a
/// priority takeover once it caught up, at a moment of its own. Once it is
/// primary, no takeover moves the role, so a fault injected on "the
/// primary" right after this hits the primary.
pub async fn settled_primary(rs: &ReplicaSet) -> usize {
    // A hang guard only: the takeover comes within seconds of a restart.
    let limit = Duration::from_secs(60);
    let started = Instant::now();
    while rs.primary().await != Some(0) {
        assert!(
            started.elapsed() < limit,
            "member 0 (highest priority) is not primary after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    0
}

/// Waits for `n` more completed critical sections (from history index `from`).
pub async fn progress(fleet: &Fleet, from: usize, n: usize, limit: Duration) {
    fleet
        .history
        .wait_count(&format!("{n} critical sections"), "cs", from, n, limit)
        .await;
}

/// Time until a majority write through `client` succeeds (a failover's
/// length as clients see it).
pub async fn write_probe(client: &Client, started: Instant) -> Duration {
    let probe = client
        .database("probe")
        .collection::<mongodb::bson::Document>("probe");
    loop {
        let r = tokio::time::timeout(
            Duration::from_secs(5),
            probe
                .insert_one(doc! { "t": monotonic_ns() as i64 })
                .write_concern(WriteConcern::majority()),
        )
        .await;
        if matches!(r, Ok(Ok(_))) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no successful write for 60 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The fewest critical sections with both fenced steps applied that a
/// scenario's verdict is judged on.
const MIN_WORK: usize = 10;

/// Waits until the fleet has completed [`MIN_WORK`] critical sections (and
/// a few more, for those a checker may not count as valid),
/// stops the workers, checks the lock collection is left clean, runs the
/// checker and prints the common figures.
pub async fn finish(name: &str, fleet: &mut Fleet) -> Report {
    // Enough work to judge, whatever the machine's speed: wait for it (the
    // limit is a hang guard) rather than count on the scenario's length to
    // have produced it (a run of (e) once ended its three crashes with 9).
    progress(fleet, 0, MIN_WORK + 5, Duration::from_secs(60)).await;
    fleet.stop_all(Duration::from_secs(60)).await;
    let gc = fleet.assert_no_lock_left().await;
    let report = fleet.check().await;
    eprintln!(
        "FIGURE {name}: {}; lock documents deleted {:.1} s after shutdown",
        report.summary(),
        gc.as_secs_f64()
    );
    assert!(
        report.valid >= MIN_WORK,
        "{name}: too little work to judge: {}",
        report.summary()
    );
    report
}

pub fn params(ttl_secs: f64) -> Params {
    Params {
        workers: 4,
        tasks: 2,
        keys: 2,
        ttl: Duration::from_secs_f64(ttl_secs),
        retry_max: Duration::from_secs(1),
        hold_ms: (5, 40),
        long_hold_pct: 5,
        mixed: false,
    }
}

/// The protocol's bound on the time from a holder's crash to the takeover
/// of its key, in seconds: the lease expires after the TTL; a free key is
/// kept for the live head of its queue of waiting owners, and the
/// registration of a waiter that crashed too lapses at most one
/// registration window after its last refresh (`2 × retry_max + 1 s +
/// safety margin`, the workers' margin being the default `ttl / 10`; "Queue
/// of waiting owners" in the crate's `store` docs); a waiter then retries
/// within `retry_max`. Without a dead registration ahead of it the
/// takeover comes TTL + about 10 ms after the crash (the figures printed).
pub fn takeover_bound(p: &Params) -> f64 {
    let safety_margin = p.ttl / mongo_lease::DEFAULT_SAFETY_MARGIN_DIVISOR;
    let registration_window = 2 * p.retry_max + Duration::from_secs(1) + safety_margin;
    (p.ttl + registration_window + p.retry_max).as_secs_f64()
}

pub fn summarize(xs: &[f64]) -> String {
    if xs.is_empty() {
        return "n/a".into();
    }
    let min = xs.iter().cloned().fold(f64::INFINITY, f64::min);
    let max = xs.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    format!("{min:.2}-{max:.2} s over {}", xs.len())
}
