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
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::{JoinHandle, yield_now};
use tokio::time::{Instant, sleep, sleep_until, timeout};

use super::release_watch::RELEASE_WAKE_JITTER;
use crate::config::Timing;
use crate::error::{Error, Result};
use crate::lease::{Lease, ReleaseOutcome};
use crate::manager::LockManager;
use crate::store::AcquireOutcome;
use crate::store::memory::{Doc, Fault, MemoryDb, MemoryStore, Op};

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
        operation_timeout: OPERATION_TIMEOUT,
        retry_initial: RETRY_INITIAL,
        retry_max: RETRY_MAX,
        renewal_batch_size: BATCH,
    };
    assert_eq!(timing.local_validity(), VALIDITY);
    timing
}

/// Starts a manager with owner id `owner` on `db`. Returns the manager, a clone
/// of its store (knobs and counters) and the instant it started: its heartbeat
/// ticks at `t0 + k * HEARTBEAT`.
fn start(db: &MemoryDb, owner: &str) -> (LockManager, MemoryStore, Instant) {
    let store = db.store(owner, TTL);
    let t0 = Instant::now();
    let manager = LockManager::start(Arc::new(store.clone()), owner.into(), timing());
    (manager, store, t0)
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
async fn soon<F: Future>(fut: F) -> F::Output {
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

/// `manager.acquire(key)` in a task, queued before this returns; the task
/// yields the instant the lease was granted, with the lease.
async fn waiter(manager: &LockManager, key: &str) -> JoinHandle<Result<(Instant, Lease)>> {
    let (manager, key) = (manager.clone(), key.to_string());
    started(async move {
        let lease = manager.acquire(key).await?;
        Ok((Instant::now(), lease))
    })
    .await
}

fn assert_released(db: &MemoryDb, key: &str) {
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

// ----- 1. heartbeat batching ---------------------------------------------------

#[tokio::test(start_paused = true)]
async fn each_heartbeat_renews_every_lease_in_ceil_n_over_batch_calls() {
    for n in [10_usize, 250, 1000] {
        let db = MemoryDb::new();
        let (manager, store, t0) = start(&db, "a");
        let mut leases = Vec::new();
        for i in 0..n {
            leases.push(manager.acquire(format!("k{i}")).await.unwrap());
        }
        assert_eq!(
            Instant::now(),
            t0,
            "acquiring takes no time at zero latency"
        );
        let per_tick = n.div_ceil(BATCH);

        for tick in 1..=3_u32 {
            let before = store.calls(Op::Renew);
            let tick_at = t0 + HEARTBEAT * tick;
            // Half-way between two ticks: this tick's renewals have all landed.
            sleep_until(tick_at + HEARTBEAT / 2).await;
            let calls = store.calls_of(Op::Renew).split_off(before);
            assert_eq!(calls.len(), per_tick, "n = {n}, tick {tick}: renew calls");
            let mut renewed = HashSet::new();
            for call in &calls {
                assert_eq!(call.at, tick_at, "renewals are issued at the tick");
                assert!(call.keys.len() <= BATCH, "a batch of {}", call.keys.len());
                for key in &call.keys {
                    assert!(
                        renewed.insert(key.clone()),
                        "{key} renewed twice in one tick"
                    );
                }
            }
            assert_eq!(
                renewed.len(),
                n,
                "n = {n}, tick {tick}: every lease renewed"
            );
            for i in 0..n {
                assert_eq!(db.doc(&format!("k{i}")).unwrap().exp, tick_at + TTL);
            }
        }
        assert!(leases.iter().all(|l| !l.is_lost()));
        assert_eq!(store.leases_renewed(), 3 * n);
        manager.shutdown().await.unwrap();
        assert_eq!(
            store.calls(Op::Release),
            per_tick,
            "shutdown releases in batches too"
        );
        assert_eq!(store.leases_released(), n);
    }
}

#[tokio::test(start_paused = true)]
async fn an_idle_manager_issues_no_commands() {
    let db = MemoryDb::new();
    let (manager, store, t0) = start(&db, "a");
    sleep_until(t0 + HEARTBEAT * 5 + HEARTBEAT / 2).await;
    assert!(store.log().is_empty(), "{:?}", store.log());

    // A lease held for a while then released: renewals stop with it.
    let lease = manager.acquire("k").await.unwrap();
    sleep(HEARTBEAT * 2).await;
    assert_eq!(store.calls(Op::Renew), 2);
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    sleep(HEARTBEAT * 5).await;
    assert_eq!(store.calls(Op::Renew), 2);
}

// ----- 2. local deadline ----------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn hung_renewals_fire_the_token_exactly_at_the_local_deadline_before_server_expiry() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    // Acquire between heartbeat ticks: the deadline counts from the acquire.
    sleep(Duration::from_millis(250)).await;
    store.hang_renewals();
    // The holder's give-back after the deadline never lands either, so the
    // other owner can only take over by server-side expiry.
    store.set_fault(Op::Release, Some(Fault::Hang));

    let acquired_at = Instant::now();
    let lease = a.acquire("k").await.unwrap();
    let token = lease.cancellation_token();
    let other = waiter(&b, "k").await;

    sleep_until(acquired_at + VALIDITY - MS).await;
    assert!(!token.is_cancelled(), "cancelled before the deadline");
    assert!(
        !other.is_finished(),
        "another owner got the key while we hold it"
    );

    soon(token.cancelled()).await;
    let lost_at = Instant::now();
    assert_eq!(
        lost_at,
        acquired_at + VALIDITY,
        "deadline = acquire start + ttl - margin"
    );
    let renewals: Vec<Instant> = store.calls_of(Op::Renew).iter().map(|c| c.at).collect();
    assert_eq!(
        renewals[0],
        t0 + HEARTBEAT,
        "first renewal at the first tick"
    );
    assert!(
        renewals.len() >= 2 && renewals[1] >= t0 + 2 * HEARTBEAT,
        "a renewal hung for a heartbeat interval is abandoned and retried, \
         one batch at a time: {renewals:?}"
    );
    assert!(
        renewals.windows(2).all(|w| w[1] - w[0] >= HEARTBEAT),
        "{renewals:?}"
    );
    let doc = db.doc("k").unwrap();
    assert_eq!(doc.owner, "a");
    assert_eq!(doc.exp, acquired_at + TTL, "server expiry from the acquire");
    assert!(
        lost_at < doc.exp,
        "the holder knows before the server lets the key go"
    );
    assert_eq!(
        store.calls(Op::Release),
        1,
        "the actor tries to give the key back"
    );

    let (taken_at, taken) = soon(other).await.unwrap().unwrap();
    assert!(
        taken_at >= doc.exp && taken_at <= doc.exp + RETRY_INITIAL + 2 * MS,
        "the other owner takes over at server expiry: {:?} after it",
        taken_at - doc.exp
    );
    assert!(taken.fencing_token() > lease.fencing_token());
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_counts_from_the_start_of_the_acquire_not_its_reply() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    store.set_latency(Op::Acquire, Duration::from_millis(200));
    store.hang_renewals();
    let lease = a.acquire("k").await.unwrap();
    assert_eq!(Instant::now(), t0 + Duration::from_millis(200));
    assert_eq!(
        db.doc("k").unwrap().exp,
        t0 + Duration::from_millis(200) + TTL
    );
    soon(lease.lost()).await;
    assert_eq!(Instant::now(), t0 + VALIDITY);
}

#[tokio::test(start_paused = true)]
async fn the_deadline_counts_from_the_start_of_the_last_confirmed_renewal() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    // The renewal at the first tick is confirmed 400 ms after it was sent;
    // every later one hangs.
    store.set_latency(Op::Renew, Duration::from_millis(400));
    sleep_until(t0 + HEARTBEAT + MS).await;
    store.hang_renewals();
    sleep_until(t0 + VALIDITY + MS).await;
    assert!(!lease.is_lost(), "the confirmed renewal moved the deadline");
    assert_eq!(
        db.doc("k").unwrap().exp,
        t0 + Duration::from_millis(1_400) + TTL
    );
    soon(lease.lost()).await;
    assert_eq!(
        Instant::now(),
        t0 + HEARTBEAT + VALIDITY,
        "from the renewal's start"
    );
}

#[tokio::test(start_paused = true)]
async fn a_deadline_release_frees_the_key_at_once() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    store.hang_renewals();
    let lease = a.acquire("k").await.unwrap();
    soon(lease.lost()).await;
    assert_eq!(Instant::now(), t0 + VALIDITY);
    settle().await;
    assert_released(&db, "k");
    assert!(matches!(
        db.try_take("k", "b", TTL),
        AcquireOutcome::Acquired { .. }
    ));
}

#[tokio::test(start_paused = true)]
async fn renewed_leases_are_kept_over_many_ttls() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    let slow = a.acquire("slow").await.unwrap();
    // Renewals of "slow" take a while on the server but are confirmed in time.
    store.set_latency(Op::Renew, Duration::from_millis(400));

    let held_for = TTL * 20 + HEARTBEAT / 2;
    assert!(
        timeout(held_for, lease.lost()).await.is_err(),
        "lease lost while renewed"
    );
    assert!(!slow.is_lost());
    assert_eq!(store.calls(Op::Renew), 60, "one renewal per tick");
    let last_tick = t0 + HEARTBEAT * 60;
    assert_eq!(
        db.doc("k").unwrap().exp,
        last_tick + Duration::from_millis(400) + TTL
    );
    assert!(matches!(
        db.try_take("k", "b", TTL),
        AcquireOutcome::Held { .. }
    ));
}

// ----- 3. lost to another owner -----------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_renewal_that_finds_the_lease_taken_cancels_the_token_at_that_heartbeat() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 2).await;
    assert!(!lease.is_lost());
    let their_token = db.force_take("k", "intruder", TTL);

    soon(lease.lost()).await;
    assert_eq!(
        Instant::now(),
        t0 + HEARTBEAT * 2,
        "lost at the next heartbeat"
    );
    let releases = store.calls(Op::Release);
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
    assert_eq!(
        store.calls(Op::Release),
        releases,
        "nothing to release on the server"
    );
    let doc = db.doc("k").unwrap();
    assert_eq!((doc.owner.as_str(), doc.token), ("intruder", their_token));
    assert!(
        doc.lease_id.is_some() && doc.exp > Instant::now(),
        "theirs untouched: {doc:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_lease_lost_to_expiry_on_the_server_is_detected_at_the_next_heartbeat() {
    let db = MemoryDb::new();
    let (a, _, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    sleep_until(t0 + HEARTBEAT / 2).await;
    db.expire("k");
    // Nobody took it: the renewal still matches the lease id and extends it,
    // as on MongoDB (renewals do not check expiry).
    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 2).await;
    assert!(!lease.is_lost());
    assert_eq!(db.holder("k").as_deref(), Some("a"));
    // Taken after expiry: lost at the next renewal.
    db.expire("k");
    db.try_take("k", "b", TTL);
    soon(lease.lost()).await;
    assert_eq!(Instant::now(), t0 + HEARTBEAT * 2);
}

// ----- 4. transient renewal failures ------------------------------------------------

#[tokio::test(start_paused = true)]
async fn transient_renewal_failures_are_retried_with_backoff_and_the_lease_kept() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    store.fail_next(Op::Renew, 3);

    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 2).await;
    let calls = store.calls_of(Op::Renew);
    assert_eq!(calls.len(), 4, "1 failed renewal + 3 retries: {calls:?}");
    assert_eq!(calls[0].at, t0 + HEARTBEAT);
    for (attempt, pair) in calls.windows(2).enumerate() {
        let gap = pair[1].at - pair[0].at;
        let step = RETRY_INITIAL * 2_u32.pow(attempt as u32);
        assert!(
            gap >= step / 2 && gap <= step + MS,
            "retry {attempt} after {gap:?}, expected {:?}..={step:?}",
            step / 2
        );
    }
    assert!(!lease.is_lost());
    assert_eq!(
        db.doc("k").unwrap().exp,
        calls[3].at + TTL,
        "the last retry renewed it"
    );
    // Heartbeats resume; the lease lives on.
    assert!(timeout(TTL * 3, lease.lost()).await.is_err());
    assert_eq!(store.calls(Op::Renew), 4 + 9);
}

#[tokio::test(start_paused = true)]
async fn a_retry_that_succeeds_just_before_the_deadline_keeps_the_lease() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    store.fail_renewals();
    // Renewal retries are at most heartbeat / 2 = 500 ms apart: healing at
    // 2.15 s leaves one more retry before the deadline at 2.7 s.
    sleep_until(t0 + Duration::from_millis(2_150)).await;
    let failed = store.calls(Op::Renew);
    assert!(failed >= 5, "renewals retried while failing: {failed}");
    store.set_fault(Op::Renew, None);

    sleep_until(t0 + VALIDITY + MS).await;
    assert!(!lease.is_lost(), "a confirmed renewal moved the deadline");
    let saved_by = store.calls_of(Op::Renew)[failed].at;
    assert!(saved_by < t0 + VALIDITY, "{:?}", saved_by - t0);
    assert_eq!(db.doc("k").unwrap().exp, saved_by + TTL);
    assert!(timeout(TTL * 3, lease.lost()).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn renewals_failing_until_the_deadline_lose_the_lease_exactly_then() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    store.fail_renewals();

    soon(lease.lost()).await;
    assert_eq!(Instant::now(), t0 + VALIDITY);
    let retries = store.calls(Op::Renew);
    assert!(retries >= 5, "renewal retried: {retries}");
    settle().await;
    assert_released(&db, "k");
    sleep(TTL * 2).await;
    assert_eq!(
        store.calls(Op::Renew),
        retries,
        "no retries for a lost lease"
    );
}

// ----- 5. FIFO fairness, one attempt in flight, capped retries -------------------------

#[tokio::test(start_paused = true)]
async fn local_waiters_are_served_in_order_by_one_retry_loop() {
    const HOLD: Duration = Duration::from_millis(100);
    const LATENCY: Duration = Duration::from_millis(5);
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    store.set_latency(Op::Acquire, LATENCY);
    db.force_take("k", "remote", TTL);
    let remote_exp = t0 + TTL;

    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..5 {
        let (a, grants) = (a.clone(), grants.clone());
        tasks.push(
            started(async move {
                let lease = a.acquire("k").await.unwrap();
                grants
                    .lock()
                    .unwrap()
                    .push((i, Instant::now(), lease.fencing_token()));
                sleep(HOLD).await;
                assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
            })
            .await,
        );
    }
    for task in tasks {
        soon(task).await.unwrap();
    }

    let grants = grants.lock().unwrap().clone();
    let order: Vec<usize> = grants.iter().map(|g| g.0).collect();
    assert_eq!(order, vec![0, 1, 2, 3, 4], "first come, first served");
    let first = grants[0].1;
    assert!(
        first >= remote_exp && first <= remote_exp + RETRY_INITIAL + LATENCY + 2 * MS,
        "first grant {:?} after the holder's expiry",
        first - remote_exp
    );
    for pair in grants.windows(2) {
        assert_eq!(
            pair[1].1 - pair[0].1,
            HOLD + LATENCY,
            "handoff: release, then one round trip"
        );
        assert!(pair[1].2 > pair[0].2, "fencing tokens increase");
    }

    assert_eq!(
        store.max_acquires_in_flight_per_key(),
        1,
        "one attempt in flight per key"
    );
    let calls = store.acquire_calls("k");
    let polls = calls.iter().filter(|at| **at < first - LATENCY).count();
    // Backoff 10 ms doubling to 1 s over a 3 s wait: about a dozen polls, for
    // all five waiters together.
    assert!(
        (3..=15).contains(&polls),
        "{polls} polls while the key was held remotely"
    );
    assert_eq!(
        calls.len(),
        polls + 1 + 4,
        "the winning poll, then one attempt per handoff"
    );
}

#[tokio::test(start_paused = true)]
async fn retries_are_capped_by_the_holders_remaining_time() {
    // Without the cap a waiter polls every 0.5-1 s by then and would be up to
    // 1 s late; with it, it tries again right at the expiry. Five keys make a
    // lucky pass of a broken cap unlikely.
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let holds: [u64; 5] = [2_300, 2_700, 3_100, 3_650, 4_050];
    let mut waiters = Vec::new();
    for (i, hold) in holds.iter().enumerate() {
        let key = format!("k{i}");
        db.force_take(&key, "remote", Duration::from_millis(*hold));
        waiters.push((
            key.clone(),
            t0 + Duration::from_millis(*hold),
            waiter(&a, &key).await,
        ));
    }
    for (key, exp, waiter) in waiters {
        let (at, _lease) = soon(waiter).await.unwrap().unwrap();
        assert!(
            at >= exp && at <= exp + RETRY_INITIAL + MS,
            "{key}: acquired {:?} after the holder's expiry",
            at.saturating_duration_since(exp)
        );
        assert!(store.acquire_calls(&key).len() <= 15);
    }
}

// ----- 6. local handoff -------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_released_key_goes_to_the_next_local_waiter_at_once() {
    let db = MemoryDb::new();
    let (a, sa, t0) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    // A `try_acquire` elsewhere does not wait, so it leaves no mark.
    assert!(b.try_acquire("k").await.unwrap().is_none());
    assert_eq!(db.doc("k").unwrap().waiting_since, None);
    let local = waiter(&a, "k").await;

    sleep_until(t0 + Duration::from_millis(2_500)).await;
    assert_eq!(
        sa.acquire_calls("k"),
        vec![t0],
        "no polling while the key is held locally"
    );

    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (granted_at, second) = soon(local).await.unwrap().unwrap();
    assert_eq!(granted_at, released_at, "no backoff before a local handoff");
    assert_eq!(sa.acquire_calls("k"), vec![t0, released_at]);
    assert!(second.fencing_token() > 1);
    assert_eq!(db.holder("k").as_deref(), Some("a"));
}

/// Cross-process fairness: a manager whose tasks keep re-acquiring a key
/// would otherwise keep it from another manager's waiter forever. A release
/// that another owner waited for yields the key to it, and the next release
/// yields it back.
#[tokio::test(start_paused = true)]
async fn a_release_that_another_owner_waited_for_yields_the_key_to_it() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let remote = waiter(&b, "k").await;
    let local = waiter(&a, "k").await;
    soon(db.changed_until("k", |d| d.waiting_since.is_some())).await;

    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (remote_at, remote_lease) = soon(remote).await.unwrap().unwrap();
    assert!(
        remote_at - released_at <= RELEASE_WAKE_JITTER,
        "the waiting owner got the key {:?} after the release",
        remote_at - released_at
    );
    assert!(!local.is_finished(), "the releasing manager took it back");
    assert!(
        sa.acquire_calls("k").contains(&released_at),
        "the local waiter did try at once"
    );

    // The local waiter now waits on the other owner, which yields it back.
    soon(db.changed_until("k", |d| d.waiting_since.is_some())).await;
    let released_at = Instant::now();
    assert_eq!(
        remote_lease.release().await.unwrap(),
        ReleaseOutcome::Released
    );
    assert!(db.doc("k").unwrap().yield_until.is_some());
    let (local_at, _) = soon(local).await.unwrap().unwrap();
    assert!(local_at - released_at <= RELEASE_WAKE_JITTER);
    assert_eq!(db.holder("k").as_deref(), Some("a"));
}

/// A waiter that gave up after marking the lease costs the releasing
/// manager's next waiter one yield window, no more.
#[tokio::test(start_paused = true)]
async fn a_yield_to_an_owner_that_gave_up_lasts_one_yield_window() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let remote = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.waiting_since.is_some())).await;
    remote.abort();
    let local = waiter(&a, "k").await;

    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (granted_at, _) = soon(local).await.unwrap().unwrap();
    // The yield window is the store's (the default retry_max, 1 s here).
    let window = RETRY_MAX;
    assert!(
        granted_at >= released_at + window && granted_at <= released_at + window + RETRY_INITIAL,
        "granted {:?} after the release; the yield window is {window:?}",
        granted_at - released_at
    );
    assert!(sa.acquire_calls("k").len() > 2, "it kept trying meanwhile");
    assert_eq!(db.holder("k").as_deref(), Some("a"));
}

// ----- 7. cancel safety -------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn a_dropped_acquire_leaves_the_queue_and_stops_polling() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    db.force_take("k", "remote", TTL);

    assert!(
        timeout(Duration::from_millis(500), a.acquire("k"))
            .await
            .is_err()
    );
    let polls = store.acquire_calls("k").len();
    assert!(polls >= 2);
    tokio::select! {
        lease = a.acquire("k") => panic!("got {lease:?}"),
        _ = sleep(Duration::from_millis(500)) => {}
    }
    // No stale retry is left behind: a new caller's attempt starts at once.
    let polls = store.acquire_calls("k").len();
    assert!(a.try_acquire("k").await.unwrap().is_none());
    assert_eq!(store.acquire_calls("k").len(), polls + 1);
    let polls = polls + 1;
    sleep_until(t0 + TTL * 4).await;
    assert_eq!(
        store.acquire_calls("k").len(),
        polls,
        "polled with nobody waiting"
    );
    assert_eq!(
        db.doc("k").unwrap().owner,
        "remote",
        "acquired with nobody waiting"
    );

    // The key is not stuck for later callers.
    let lease = a
        .try_acquire("k")
        .await
        .unwrap()
        .expect("free after the expiry");
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_acquire_never_leaks_a_lease() {
    const LATENCY: Duration = Duration::from_millis(50);
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    store.set_latency(Op::Acquire, LATENCY);

    // Dropped while the attempt is in flight, at, and just after the moment
    // it lands: whichever the actor sees first, the key ends up free.
    for after in [20_u64, 49, 50, 51] {
        let key = format!("k{after}");
        match timeout(Duration::from_millis(after), a.acquire(key.as_str())).await {
            Ok(lease) => {
                assert!(after >= 50, "{key}: granted before the store answered");
                drop(lease);
            }
            Err(_) => assert!(after <= 50, "{key}: not granted after the store answered"),
        }
        sleep(LATENCY + MS).await;
        assert_released(&db, &key);
        assert!(matches!(
            db.try_take(&key, "b", TTL),
            AcquireOutcome::Acquired { .. }
        ));
    }

    // Granted, but the reply is never read: the lease inside the dropped
    // reply channel releases itself.
    let releases = store.calls(Op::Release);
    let mut pending = Box::pin(a.acquire("late"));
    assert!(futures::poll!(&mut pending).is_pending());
    sleep(LATENCY * 2).await;
    assert_eq!(db.holder("late").as_deref(), Some("a"), "granted meanwhile");
    drop(pending);
    settle().await;
    assert_released(&db, "late");
    assert_eq!(store.calls(Op::Release), releases + 1);
}

#[tokio::test(start_paused = true)]
async fn an_ambiguous_acquire_with_nobody_waiting_is_given_back() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    // The write lands but the reply is lost.
    store.fault_next(Op::Acquire, Fault::FailAfterApply, 1);
    let error = a.try_acquire("k").await.unwrap_err();
    assert!(error.is_transient(), "{error:?}");
    settle().await;
    assert_eq!(store.calls(Op::Release), 1);
    assert_released(&db, "k");
}

// ----- acquire errors ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn transient_acquire_failures_are_retried_for_waiters_and_reported_to_a_try() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    store.fail_next(Op::Acquire, 1);
    assert!(a.try_acquire("t").await.unwrap_err().is_transient());
    assert_eq!(store.acquire_calls("t").len(), 1, "a try makes one attempt");
    settle().await;
    let releases: Vec<_> = store
        .calls_of(Op::Release)
        .into_iter()
        .flat_map(|c| c.keys)
        .collect();
    assert_eq!(
        releases,
        ["t"],
        "the outcome is unknown: the try's lease id is given back"
    );

    // Two attempts land unseen; the third, under the same lease id, is
    // recognised as ours: same acquisition, same token.
    store.fault_next(Op::Acquire, Fault::FailAfterApply, 2);
    let lease = soon(a.acquire("w")).await.unwrap();
    let calls = store.acquire_calls("w");
    assert_eq!(calls.len(), 3);
    assert_eq!(lease.fencing_token(), 1, "one acquisition, not three");
    for (attempt, pair) in calls.windows(2).enumerate() {
        let step = RETRY_INITIAL * 2_u32.pow(attempt as u32);
        let gap = pair[1] - pair[0];
        assert!(
            gap >= step / 2 && gap <= step + MS,
            "retry {attempt} after {gap:?}"
        );
    }
    assert_eq!(
        store.calls(Op::Release),
        1,
        "nothing given back while someone waits"
    );
    assert!(!lease.is_lost());
}

#[tokio::test(start_paused = true)]
async fn a_foreign_document_fails_every_waiter_without_retrying() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    db.put_foreign("f");
    // Both waiters queue on the same attempt.
    store.set_latency(Op::Acquire, 5 * MS);
    let first = waiter(&a, "f").await;
    let second = waiter(&a, "f").await;
    for w in [first, second] {
        let result = soon(w).await.unwrap();
        assert!(
            matches!(result, Err(Error::ForeignDocument { .. })),
            "{result:?}"
        );
    }
    sleep(TTL).await;
    assert_eq!(store.acquire_calls("f").len(), 1);
}

// ----- 8. try_acquire and acquire_timeout ----------------------------------------------

#[tokio::test(start_paused = true)]
async fn try_acquire_never_jumps_the_queue_and_costs_no_round_trip_when_busy_locally() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");

    let held = a.try_acquire("held").await.unwrap().expect("free key");
    assert_eq!(store.calls(Op::Acquire), 1);
    assert!(a.try_acquire("held").await.unwrap().is_none());
    assert_eq!(store.calls(Op::Acquire), 1, "held locally: no store call");

    db.force_take("queued", "remote", TTL);
    let _queued = waiter(&a, "queued").await;
    settle().await;
    let calls = store.calls(Op::Acquire);
    assert!(a.try_acquire("queued").await.unwrap().is_none());
    assert_eq!(
        store.calls(Op::Acquire),
        calls,
        "local waiters: no store call"
    );

    db.force_take("remote", "remote", TTL);
    assert!(a.try_acquire("remote").await.unwrap().is_none());
    assert_eq!(
        store.calls(Op::Acquire),
        calls + 1,
        "held remotely: one attempt, no retry"
    );
    sleep(TTL * 2).await;
    assert_eq!(store.acquire_calls("remote").len(), 1);
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn acquire_timeout_gives_up_exactly_at_the_timeout() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    db.force_take("k", "remote", TTL);
    let t = Instant::now();
    let wait = Duration::from_millis(700);
    assert!(a.acquire_timeout("k", wait).await.unwrap().is_none());
    assert_eq!(Instant::now(), t + wait);
    let polls = store.acquire_calls("k").len();
    sleep(TTL * 2).await;
    assert_eq!(store.acquire_calls("k").len(), polls);

    let lease = a
        .acquire_timeout("free", wait)
        .await
        .unwrap()
        .expect("free key");
    assert_eq!(
        Instant::now(),
        t + wait + TTL * 2,
        "a free key is granted at once"
    );
    assert_eq!(lease.key(), "free");
}

// ----- 9. shutdown -------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn shutdown_releases_everything_and_refuses_later_calls() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let mut leases = Vec::new();
    for key in ["k1", "k2", "k3"] {
        leases.push(a.acquire(key).await.unwrap());
    }
    db.force_take("r", "remote", TTL);
    let waiters = [waiter(&a, "r").await, waiter(&a, "r").await];
    settle().await;

    a.shutdown().await.unwrap();
    for lease in &leases {
        assert!(lease.is_lost(), "{} not cancelled", lease.key());
        assert_released(&db, lease.key());
    }
    let releases = store.calls_of(Op::Release);
    assert_eq!(releases.len(), 1, "one batch: {releases:?}");
    let mut keys = releases[0].keys.clone();
    keys.sort();
    assert_eq!(keys, ["k1", "k2", "k3"]);
    for waiter in waiters {
        assert_shutdown(soon(waiter).await.unwrap());
    }
    assert_eq!(db.holder("r").as_deref(), Some("remote"));

    assert_shutdown(a.acquire("x").await);
    assert_shutdown(a.clone().try_acquire("x").await);
    assert_shutdown(a.acquire_timeout("x", TTL).await);
    assert_shutdown(a.release_all().await);
    assert_shutdown(a.shutdown().await);
    for lease in leases {
        assert_shutdown(lease.release().await);
    }
    settle().await;
    assert_eq!(store.handles(), 1, "the actor has stopped");
    assert_eq!(store.calls(Op::Release), 1);
    assert_eq!(store.calls(Op::Acquire), 3 + 1, "the waiters polled once");
}

#[tokio::test(start_paused = true)]
async fn dropping_every_handle_and_lease_stops_the_actor_and_releases() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let l1 = a.acquire("k1").await.unwrap();
    let l2 = a.acquire("k2").await.unwrap();
    drop(a);
    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 2).await;
    assert_eq!(
        store.renew_batch_sizes(),
        vec![2],
        "leases outlive the handle and stay renewed"
    );
    assert!(store.handles() > 1);

    drop(l1);
    settle().await;
    assert_released(&db, "k1");
    assert_eq!(db.holder("k2").as_deref(), Some("a"));
    assert!(store.handles() > 1, "a lease keeps the actor alive");
    drop(l2);
    settle().await;
    assert_released(&db, "k2");
    assert_eq!(store.calls(Op::Release), 2);
    assert_eq!(store.handles(), 1, "the actor has stopped");
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_at_once_even_while_a_renewal_hangs() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    store.set_operation_timeout(Some(OPERATION_TIMEOUT));
    let lease = a.acquire("k").await.unwrap();
    store.hang_renewals();
    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 2).await;
    assert_eq!(store.in_flight(Op::Renew), 1);

    let shutdown = started({
        let a = a.clone();
        async move { a.shutdown().await }
    })
    .await;
    settle().await;
    assert!(lease.is_lost());
    assert_released(&db, "k");
    // Only the reply waits for the hung renewal, bounded by the operation timeout.
    soon(shutdown).await.unwrap().unwrap();
    assert!(Instant::now() <= t0 + HEARTBEAT + OPERATION_TIMEOUT);
}

#[tokio::test(start_paused = true)]
async fn shutdown_does_not_wait_for_in_flight_renewals() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    store.set_operation_timeout(Some(OPERATION_TIMEOUT));
    let _lease = a.acquire("k").await.unwrap();
    store.hang_renewals();
    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 2).await;
    let asked_at = Instant::now();
    a.shutdown().await.unwrap();
    assert_eq!(
        Instant::now(),
        asked_at,
        "the release landed at once; nothing else matters"
    );
}

// ----- 10. release_all ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn release_all_cancels_local_leases_with_one_command_by_owner() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let l1 = a.acquire("k1").await.unwrap();
    let l2 = a.acquire("k2").await.unwrap();
    let l3 = a.acquire("k3").await.unwrap();
    // Left by an earlier process with the same owner id.
    db.put(
        "old",
        Doc {
            owner: "a".into(),
            ..Doc::held("a", 7, TTL)
        },
    );
    db.force_take("theirs", "b", TTL);
    // A local waiter keeps waiting and gets k3 afterwards.
    let next = waiter(&a, "k3").await;
    settle().await;

    assert_eq!(a.release_all().await.unwrap(), 4);
    assert_eq!(store.calls(Op::ReleaseOwner), 1);
    assert_eq!(store.calls(Op::Release), 0);
    for lease in [&l1, &l2, &l3] {
        assert!(lease.is_lost(), "{} not cancelled", lease.key());
    }
    assert_released(&db, "k1");
    assert_released(&db, "k2");
    assert_released(&db, "old");
    assert_eq!(db.holder("theirs").as_deref(), Some("b"));

    let (_, k3) = soon(next).await.unwrap().unwrap();
    assert!(k3.fencing_token() > l3.fencing_token());
    assert!(!k3.is_lost());
    assert_eq!(db.holder("k3").as_deref(), Some("a"));

    assert_eq!(l1.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
    assert_eq!(
        store.calls(Op::Release),
        0,
        "a cancelled lease needs no release"
    );
    drop((l2, l3));
    settle().await;
    assert_eq!(
        db.holder("k3").as_deref(),
        Some("a"),
        "old leases cannot release k3"
    );
}

#[tokio::test(start_paused = true)]
async fn release_all_spares_an_acquisition_in_flight() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    store.set_latency(Op::Acquire, Duration::from_millis(50));
    store.set_latency(Op::ReleaseOwner, Duration::from_millis(100));
    let t = Instant::now();
    let pending = waiter(&a, "f").await;
    sleep(Duration::from_millis(10)).await;
    let release_all = started({
        let a = a.clone();
        async move { a.release_all().await }
    })
    .await;
    // The acquire lands at +50 ms, the release by owner at +110 ms.
    let (granted_at, lease) = soon(pending).await.unwrap().unwrap();
    assert_eq!(granted_at, t + Duration::from_millis(50));
    assert_eq!(soon(release_all).await.unwrap().unwrap(), 0);
    assert_eq!(Instant::now(), t + Duration::from_millis(110));
    assert!(!lease.is_lost());
    assert_eq!(
        db.holder("f").as_deref(),
        Some("a"),
        "the in-flight lease id was left out"
    );
}

#[tokio::test(start_paused = true)]
async fn release_all_spares_an_acquisition_started_while_it_is_in_flight() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    store.set_latency(Op::ReleaseOwner, Duration::from_millis(100));
    let release_all = started({
        let a = a.clone();
        async move { a.release_all().await }
    })
    .await;
    settle().await;
    sleep(Duration::from_millis(10)).await;
    let lease = a.acquire("n").await.unwrap();
    soon(release_all).await.unwrap().unwrap();
    assert!(!lease.is_lost());
    assert_eq!(
        db.holder("n").as_deref(),
        Some("a"),
        "our live lease was released on the server: another owner can take it \
         while our token is not cancelled"
    );
}

// ----- read model, payload, observers ----------------------------------------

#[tokio::test(start_paused = true)]
async fn set_payload_on_a_lease_taken_on_the_server_reports_it_lost_and_fires_its_token() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    lease
        .set_payload(mongodb::bson::doc! { "addr": "x" })
        .await
        .unwrap();
    let info = a.inspect("k").await.unwrap().unwrap();
    assert_eq!(info.payload, Some(mongodb::bson::doc! { "addr": "x" }));
    assert!(info.held);
    assert_eq!(info.time_to_expiry(), TTL);

    db.force_take("k", "b", TTL);
    let result = lease.set_payload(mongodb::bson::doc! { "addr": "y" }).await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert!(lease.is_lost(), "a confirmed loss fires the token");
    assert_eq!(store.calls(Op::SetPayload), 2);
    // Known lost locally: answered without a round trip.
    let result = lease.set_payload(mongodb::bson::doc! {}).await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })));
    assert_eq!(store.calls(Op::SetPayload), 2);
}

#[tokio::test(start_paused = true)]
async fn observers_share_one_stream_per_key_get_the_current_state_first_and_stop_when_gone() {
    let db = MemoryDb::new();
    let (a, _store, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let mut first = a.observe("k").await.unwrap();
    assert_eq!(soon(first.recv()).await.unwrap().unwrap(), None);
    let lease = b.acquire("k").await.unwrap();
    let held = soon(first.recv()).await.unwrap().unwrap().unwrap();
    assert!(held.held && held.owner_id == "b");

    let mut second = a.observe("k").await.unwrap();
    let current = soon(second.recv()).await.unwrap().unwrap().unwrap();
    assert_eq!(
        current.fencing_token, held.fencing_token,
        "current state first"
    );
    settle().await;
    assert_eq!(db.observers(), 1, "one stream for both subscribers");

    // An expiry without a write is reported at the expiry.
    std::mem::forget(lease);
    db.expire("k");
    let expired = soon(first.recv()).await.unwrap().unwrap().unwrap();
    assert!(!expired.held);
    assert_eq!(
        soon(second.recv()).await.unwrap().unwrap().unwrap(),
        expired
    );

    drop(first);
    drop(second);
    settle().await;
    assert_eq!(db.observers(), 0, "the hub stops with its last subscriber");
    let mut third = a.observe("k").await.unwrap();
    assert!(!soon(third.recv()).await.unwrap().unwrap().unwrap().held);
    a.shutdown().await.unwrap();
    assert!(soon(third.recv()).await.is_none(), "ends on shutdown");
}

#[tokio::test(start_paused = true)]
async fn force_release_of_a_local_lease_cancels_it_and_serves_the_next_waiter() {
    let db = MemoryDb::new();
    let (a, _store, _) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    let next = waiter(&a, "k").await;
    let released = a.force_release("k").await.unwrap().expect("held");
    assert_eq!(released.fencing_token, lease.fencing_token());
    assert!(lease.is_lost());
    let (_, second) = soon(next).await.unwrap().unwrap();
    assert!(second.fencing_token() > lease.fencing_token());
    assert_eq!(a.force_release("other").await.unwrap(), None);
    let (page, next) = a.list_page(None, 10).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(next, None);
}

// ----- prompt wake-up on releases by other owners -------------------------------

/// A waiter whose next poll is at least a second away gets the key within
/// `RELEASE_WAKE_JITTER` of another owner's release, in one attempt; its
/// release stream is open only while it waits.
#[tokio::test(start_paused = true)]
async fn a_release_by_another_owner_wakes_local_waiters_at_once() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let b_store = db.store("b", TTL);
    let slow_polls = Timing {
        retry_initial: Duration::from_secs(2),
        retry_max: Duration::from_secs(10),
        ..timing()
    };
    let b = LockManager::start(Arc::new(b_store.clone()), "b".into(), slow_polls);
    assert_eq!(
        db.release_watchers(),
        0,
        "nothing to watch before anyone waits"
    );

    let lease = a.acquire("k").await.unwrap();
    let waiting = waiter(&b, "k").await;
    settle().await;
    assert_eq!(
        b_store.acquire_calls("k").len(),
        1,
        "the first attempt found the key held"
    );
    assert_eq!(
        db.release_watchers(),
        1,
        "b watches releases while it waits"
    );

    // Its next poll is at least 1 s away (equal jitter on a 2 s step).
    sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    let (acquired_at, lease) = soon(waiting).await.unwrap().unwrap();
    assert!(
        acquired_at - released_at <= RELEASE_WAKE_JITTER,
        "woken by the release: {:?} after it",
        acquired_at - released_at
    );
    assert_eq!(
        b_store.acquire_calls("k").len(),
        2,
        "one more attempt, right after the release"
    );

    // Nobody waits any more: the next heartbeat closes the stream.
    sleep(HEARTBEAT).await;
    assert_eq!(db.release_watchers(), 0);
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
}
