//! Deterministic tests of the actor's timing logic, under tokio's paused clock,
//! against [`MemoryStore`].
//!
//! Every test runs with `start_paused = true`: time only moves when every task
//! is idle (auto-advance to the next timer) or when a test sleeps, so instants
//! derived from the manager's start are exact. Durations are whole
//! milliseconds, the resolution of tokio's timers, so the assertions can use
//! `==` on instants wherever the logic defines them. The only randomness is
//! the backoff jitter; assertions about retries use its documented bounds.

use std::collections::HashSet;
use std::future::{Future, IntoFuture};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::{JoinHandle, yield_now};
use tokio::time::{Instant, sleep, sleep_until, timeout};

use super::write_stream::RELEASE_WAKE_JITTER;
use crate::config::Timing;
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::lease::Lease;
use crate::manager::LeaseManager;
use crate::status::ReleaseOutcome;
use crate::store::AcquireOutcome;
use crate::store::memory::{Doc, Fault, MemoryDb, MemoryStore, Op};

mod acquire;
mod duration;
mod events;
mod group_commit;
mod handoff;
mod health;
mod kinds;
mod loss_detection;
mod memory;
mod metrics;
mod places;
mod queue;
mod reentry_groups;
mod release;
mod renewal;

const MS: Duration = Duration::from_millis(1);
const TTL: Duration = Duration::from_secs(3);
const HEARTBEAT: Duration = Duration::from_secs(1);
const SAFETY_MARGIN: Duration = Duration::from_millis(300);
/// `ttl - safety_margin`: how long a lease stays safe after the start of its
/// last confirmed renewal (or of its acquisition).
const VALIDITY: Duration = Duration::from_millis(2_700);
const RETRY_INITIAL: Duration = Duration::from_millis(10);
const RETRY_MAX: Duration = Duration::from_secs(1);
const BATCH: usize = 100;
const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

fn timing() -> Timing {
    let timing = Timing {
        ttl: TTL,
        heartbeat_interval: HEARTBEAT,
        safety_margin: SAFETY_MARGIN,
        // Taken off every local deadline besides the margin: none here, so
        // that the deadlines are the TTL less the margin
        // (`a_local_deadline_keeps_the_clock_skew_short_of_the_expiry` has one).
        clock_skew: Duration::ZERO,
        operation_timeout: OPERATION_TIMEOUT,
        retry_initial: RETRY_INITIAL,
        retry_max: RETRY_MAX,
        renewal_batch_size: BATCH,
        release_mode: crate::config::ReleaseMode::Keep,
        ttl_cap: None,
        watch_held_leases: false,
        contended_for: crate::config::CONTENDED_FOR,
    };
    assert_eq!(timing.local_validity(), VALIDITY);
    timing
}

/// Starts a manager with owner id `owner` on `db`. Returns the manager, a clone
/// of its store (knobs and counters) and the instant it started: its heartbeat
/// ticks at `t0 + k * HEARTBEAT`.
fn start(db: &MemoryDb, owner: &str) -> (LeaseManager, MemoryStore, Instant) {
    let store = db.store(owner, TTL);
    let t0 = Instant::now();
    let manager = LeaseManager::start(Arc::new(store.clone()), owner.into(), timing());
    (manager, store, t0)
}

/// As [`start`], with `watch_held_leases`: the stream of writes stays open
/// while a lease is held, so that a write taking one away is noticed at once.
fn start_watching_held(db: &MemoryDb, owner: &str) -> (LeaseManager, MemoryStore, Instant) {
    let store = db.store(owner, TTL);
    let t0 = Instant::now();
    let watching = Timing {
        watch_held_leases: true,
        ..timing()
    };
    let manager = LeaseManager::start(Arc::new(store.clone()), owner.into(), watching);
    (manager, store, t0)
}

/// As [`start`], on a deployment without change streams (a standalone
/// server): only the heartbeat notices writes by others.
fn start_without_change_streams(
    db: &MemoryDb,
    owner: &str,
) -> (LeaseManager, MemoryStore, Instant) {
    let store = db.store(owner, TTL).without_change_streams();
    let t0 = Instant::now();
    let manager = LeaseManager::start(Arc::new(store.clone()), owner.into(), timing());
    (manager, store, t0)
}

/// A manager whose next poll after a failed attempt is at least a second
/// away (equal jitter on a 2 s step), so that only a wake-up (a release
/// announced, a stream that opened) makes it retry sooner.
fn start_slow_polls(db: &MemoryDb, owner: &str) -> (LeaseManager, MemoryStore) {
    let store = db.store(owner, TTL);
    let slow_polls = Timing {
        retry_initial: Duration::from_secs(2),
        retry_max: Duration::from_secs(10),
        ..timing()
    };
    let manager = LeaseManager::start(Arc::new(store.clone()), owner.into(), slow_polls);
    (manager, store)
}

/// Lets every runnable task (the actors) run, without moving the clock.
async fn settle() {
    for _ in 0..50 {
        yield_now().await;
    }
}

/// Awaits an event the test is waiting for. Fails the test if it has not
/// happened after a minute of paused time: a broken actor would otherwise
/// keep the heartbeat ticking through virtual time forever.
async fn soon<F: IntoFuture>(fut: F) -> F::Output {
    timeout(Duration::from_secs(60), fut)
        .await
        .expect("no progress after 60 s of paused time")
}

/// Polls `fut` once (so that an `acquire` inside it has sent its command and
/// holds its place in the queue), then runs the rest in a task.
async fn started<F>(fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut fut = Box::pin(fut);
    assert!(
        futures::poll!(&mut fut).is_pending(),
        "an acquire is never answered synchronously"
    );
    tokio::spawn(fut)
}

/// `n` tasks, queued in order `0..n`, each acquiring `key` from `manager`,
/// holding it for `hold` and releasing it; returns, in the order the leases
/// were granted, each task's index, the instant of its grant and its
/// fencing token.
async fn contend(
    manager: &LeaseManager,
    key: &str,
    n: usize,
    hold: Duration,
) -> Vec<(usize, Instant, u64)> {
    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..n {
        let (manager, grants, key) = (manager.clone(), grants.clone(), key.to_string());
        tasks.push(
            started(async move {
                let lease = manager.acquire(key.as_str()).await.unwrap();
                grants
                    .lock()
                    .unwrap()
                    .push((i, Instant::now(), lease.fencing_token()));
                sleep(hold).await;
                assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
            })
            .await,
        );
    }
    for task in tasks {
        soon(task).await.unwrap();
    }
    grants.lock().unwrap().clone()
}

/// `manager.acquire(key)` in a task, queued before this returns; the task
/// yields the instant the lease was granted, with the lease.
async fn waiter(
    manager: &LeaseManager,
    key: impl Into<LeaseKey>,
) -> JoinHandle<Result<(Instant, Lease)>> {
    let key = &key.into();
    let (manager, key) = (manager.clone(), key.clone());
    started(async move {
        let lease = manager.acquire(key).await?;
        Ok((Instant::now(), lease))
    })
    .await
}

fn assert_released(db: &MemoryDb, key: impl Into<LeaseKey>) {
    let key = &key.into();
    let doc = db
        .doc(key)
        .unwrap_or_else(|| panic!("no document for {key}"));
    assert_eq!(doc.lease_id, None, "{key} should be released: {doc:?}");
    assert!(doc.exp <= Instant::now(), "{key} should be free: {doc:?}");
}

fn assert_shutdown<T: std::fmt::Debug>(result: Result<T>) {
    assert!(
        matches!(result, Err(Error::Shutdown)),
        "expected Error::Shutdown, got {result:?}"
    );
}
