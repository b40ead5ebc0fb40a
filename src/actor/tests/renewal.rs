//! Renewal timing (`src/actor/renewal.rs`): heartbeat batching, local
//! deadlines, leases lost to another owner, transient renewal failures.

use tokio_util::time::FutureExt as _;

use super::*;

// ----- 1. heartbeat batching ---------------------------------------------------

/// A heartbeat's batches beyond `RENEWALS_IN_FLIGHT` wait for one in
/// flight to be answered, and are then sent at once: every lease is still
/// renewed at each tick, with at most that many calls in flight.
#[tokio::test(start_paused = true)]
async fn a_heartbeats_batches_are_sent_a_few_at_a_time_as_they_are_answered() {
    use crate::actor::renewal::RENEWALS_IN_FLIGHT;
    const LATENCY: Duration = Duration::from_millis(100);
    let batches = 2 * RENEWALS_IN_FLIGHT + 1;
    let n = batches * BATCH;
    let db = MemoryDb::new();
    let (manager, store, t0) = start(&db, "a");
    let mut leases = Vec::new();
    for i in 0..n {
        leases.push(manager.acquire(format!("k{i}")).await.unwrap());
    }
    store.set_latency(Op::Renew, LATENCY);
    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 2).await;
    let calls = store.calls_of(Op::Renew);
    assert_eq!(calls.len(), batches);
    assert_eq!(store.max_in_flight(Op::Renew), RENEWALS_IN_FLIGHT);
    for (i, call) in calls.iter().enumerate() {
        // Sent at the tick, then one round of answers later each time.
        let round = u32::try_from(i / RENEWALS_IN_FLIGHT).unwrap();
        assert_eq!(call.at, t0 + HEARTBEAT + LATENCY * round, "call {i}");
    }
    for i in 0..n {
        let exp = db.doc(format!("k{i}")).unwrap().exp;
        assert!(exp > t0 + TTL, "k{i} renewed at the tick's round");
    }
    assert!(leases.iter().all(|l| !l.status().is_lost()));
    manager.shutdown().await.unwrap();
}

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
                assert_eq!(db.doc(format!("k{i}")).unwrap().exp, tick_at + TTL);
            }
        }
        assert!(leases.iter().all(|l| !l.status().is_lost()));
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
    store.set_fault(Op::Release, Some(Fault::Lost));

    let acquired_at = Instant::now();
    let lease = a.acquire("k").await.unwrap();
    let token = lease.status().cancellation_token();
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
    soon(lease.status().lost()).await;
    assert_eq!(Instant::now(), t0 + VALIDITY);
}

/// An acquire answered after its local deadline (counted from its send, as
/// the write may have landed then; here a server that answered 3 s late)
/// is never handed out, lost at once: it is given back and the waiter's
/// next attempt takes the key under a new lease id.
#[tokio::test(start_paused = true)]
async fn an_acquire_answered_after_its_deadline_is_given_back_and_tried_again() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    store.fault_next(Op::Acquire, Fault::Delay(TTL), 1);
    let lease = a.acquire("k").await.unwrap();
    assert!(
        !lease.status().is_lost(),
        "handed out with a deadline ahead"
    );
    let calls = store.acquire_calls("k");
    assert_eq!(calls.len(), 2, "the late one, then a fresh one");
    assert_eq!(calls[0], t0);
    assert!(
        calls[1] >= t0 + TTL,
        "retried once the late one was answered"
    );
    assert_eq!(
        store.leases_released(),
        1,
        "the late acquisition given back"
    );
    sleep_until(calls[1] + VALIDITY - MS).await;
    assert!(
        !lease.status().is_lost(),
        "its deadline counts from the fresh attempt"
    );
    assert_eq!(db.holder("k").as_deref(), Some("a"));
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
    assert!(
        !lease.status().is_lost(),
        "the confirmed renewal moved the deadline"
    );
    assert_eq!(
        db.doc("k").unwrap().exp,
        t0 + Duration::from_millis(1_400) + TTL
    );
    soon(lease.status().lost()).await;
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
    soon(lease.status().lost()).await;
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
        timeout(held_for, lease.status().lost()).await.is_err(),
        "lease lost while renewed"
    );
    assert!(!slow.status().is_lost());
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
    // Without a change stream, only the heartbeat can notice.
    let (a, store, t0) = start_without_change_streams(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 2).await;
    assert!(!lease.status().is_lost());
    let their_token = db.force_take("k", "intruder", TTL);

    soon(lease.status().lost()).await;
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
    let (a, _, t0) = start_without_change_streams(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    sleep_until(t0 + HEARTBEAT / 2).await;
    db.expire("k");
    // Nobody took it: the renewal still matches the lease id and extends it,
    // as on MongoDB (renewals do not check expiry).
    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 2).await;
    assert!(!lease.status().is_lost());
    assert_eq!(db.holder("k").as_deref(), Some("a"));
    // Taken after expiry: lost at the next renewal.
    db.expire("k");
    db.try_take("k", "b", TTL);
    soon(lease.status().lost()).await;
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
    assert!(!lease.status().is_lost());
    assert_eq!(
        db.doc("k").unwrap().exp,
        calls[3].at + TTL,
        "the last retry renewed it"
    );
    // Heartbeats resume; the lease lives on.
    assert!(timeout(TTL * 3, lease.status().lost()).await.is_err());
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
    assert!(
        !lease.status().is_lost(),
        "a confirmed renewal moved the deadline"
    );
    let saved_by = store.calls_of(Op::Renew)[failed].at;
    assert!(saved_by < t0 + VALIDITY, "{:?}", saved_by - t0);
    assert_eq!(db.doc("k").unwrap().exp, saved_by + TTL);
    assert!(timeout(TTL * 3, lease.status().lost()).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn renewals_failing_until_the_deadline_lose_the_lease_exactly_then() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    store.fail_renewals();

    soon(lease.status().lost()).await;
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

/// A TTL index on `ts` of another application (`expireAfterSeconds` shorter
/// than the TTL, found by `connect`) caps the TTL of local deadlines: a holder
/// whose renewals fail gives up `safety_margin` before MongoDB may delete its
/// document, not at the end of the (longer) TTL.
#[tokio::test(start_paused = true)]
async fn a_ttl_cap_from_a_ts_index_shortens_the_local_deadline() {
    let cap = Duration::from_secs(2);
    let db = MemoryDb::new();
    let store = db.store("a", TTL);
    let t0 = Instant::now();
    let capped = Timing {
        ttl_cap: Some(cap),
        ..timing()
    };
    assert_eq!(capped.local_validity(), cap - SAFETY_MARGIN);
    let a = LeaseManager::start(Arc::new(store.clone()), "a".into(), capped);
    let lease = a.acquire("k").await.unwrap();
    store.fail_renewals();

    soon(lease.status().lost()).await;
    assert_eq!(Instant::now(), t0 + cap - SAFETY_MARGIN);
    assert!(Instant::now() < t0 + VALIDITY);
}

/// A cap longer than the TTL changes nothing.
#[tokio::test(start_paused = true)]
async fn a_ttl_cap_longer_than_the_ttl_keeps_the_ttl_deadline() {
    let db = MemoryDb::new();
    let store = db.store("a", TTL);
    let t0 = Instant::now();
    let capped = Timing {
        ttl_cap: Some(TTL * 10),
        ..timing()
    };
    let a = LeaseManager::start(Arc::new(store.clone()), "a".into(), capped);
    let lease = a.acquire("k").await.unwrap();
    store.fail_renewals();

    soon(lease.status().lost()).await;
    assert_eq!(Instant::now(), t0 + VALIDITY);
}

// ----- per-lease TTL -----------------------------------------------------------

const LONG_TTL: Duration = Duration::from_secs(6);

#[tokio::test(start_paused = true)]
async fn leases_of_two_ttls_renew_in_one_call_per_ttl_and_batch_each_to_its_own_ttl() {
    let n = 150_usize;
    let db = MemoryDb::new();
    let (manager, store, t0) = start(&db, "a");
    let mut leases = Vec::new();
    for i in 0..n {
        leases.push(manager.acquire(format!("short{i}")).await.unwrap());
        let long = manager
            .acquire(format!("long{i}"))
            .ttl(LONG_TTL)
            .await
            .unwrap();
        assert_eq!(long.ttl(), LONG_TTL);
        leases.push(long);
    }
    assert_eq!(leases[0].ttl(), TTL, "the manager's TTL by default");
    for i in 0..n {
        assert_eq!(db.doc(format!("short{i}")).unwrap().exp, t0 + TTL);
        assert_eq!(db.doc(format!("long{i}")).unwrap().exp, t0 + LONG_TTL);
    }
    let per_ttl = n.div_ceil(BATCH);

    for tick in 1..=3_u32 {
        let before = store.calls(Op::Renew);
        let tick_at = t0 + HEARTBEAT * tick;
        sleep_until(tick_at + HEARTBEAT / 2).await;
        let calls = store.calls_of(Op::Renew).split_off(before);
        assert_eq!(
            calls.len(),
            2 * per_ttl,
            "tick {tick}: one call per TTL and batch"
        );
        for call in &calls {
            assert_eq!(call.at, tick_at);
            let short = call
                .keys
                .iter()
                .filter(|k| k.as_str().is_some_and(|k| k.starts_with("short")))
                .count();
            assert!(
                short == 0 || short == call.keys.len(),
                "a batch mixes TTLs: {:?}",
                call.keys
            );
        }
        for i in 0..n {
            assert_eq!(db.doc(format!("short{i}")).unwrap().exp, tick_at + TTL);
            assert_eq!(db.doc(format!("long{i}")).unwrap().exp, tick_at + LONG_TTL);
        }
    }
    assert!(leases.iter().all(|l| !l.status().is_lost()));
    manager.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn each_lease_loses_at_the_local_deadline_of_its_own_ttl() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let short = a.acquire("short").await.unwrap();
    let long = a.acquire("long").ttl(LONG_TTL).await.unwrap();
    store.hang_renewals();

    soon(short.status().lost()).await;
    assert_eq!(Instant::now(), t0 + VALIDITY);
    assert!(!long.status().is_lost());
    soon(long.status().lost()).await;
    assert_eq!(Instant::now(), t0 + LONG_TTL - SAFETY_MARGIN);
}

#[tokio::test(start_paused = true)]
async fn a_lease_ttl_that_breaks_the_heartbeat_rule_is_refused_before_any_round_trip() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    // HEARTBEAT (1 s) is not shorter than 1.2 s - SAFETY_MARGIN (0.3 s).
    for ttl in [Duration::from_millis(1_200), Duration::from_millis(5)] {
        let error = a.acquire("k").ttl(ttl).await.unwrap_err();
        assert!(matches!(error, Error::InvalidConfig { .. }), "{error}");
        let error = a.try_acquire("k").ttl(ttl).await.unwrap_err();
        assert!(error.is_invalid_input(), "{error}");
        let error = a
            .acquire("k")
            .ttl(ttl)
            .into_future()
            .timeout(HEARTBEAT)
            .await
            .ok()
            .transpose()
            .unwrap_err();
        assert!(error.is_invalid_input(), "{error}");
    }
    assert_eq!(store.calls(Op::Acquire), 0, "nothing was sent");
    let ok = a
        .acquire("k")
        .ttl(Duration::from_millis(1_400))
        .await
        .unwrap();
    assert_eq!(ok.ttl(), Duration::from_millis(1_400));
}

/// A waiter's TTL travels with the attempt made for it: when the first
/// waiter (the manager's TTL) went away during the attempt, the next one (a
/// longer TTL) gets the lease, whose local deadline follows the TTL that was
/// written, not its own longer one, until a renewal writes its own.
#[tokio::test(start_paused = true)]
async fn a_lease_granted_to_a_later_waiter_keeps_the_deadline_of_the_ttl_written() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    store.set_latency(Op::Acquire, Duration::from_millis(100));
    store.hang_renewals();
    let first = waiter(&a, "k").await;
    let second = {
        let a = a.clone();
        started(async move { a.acquire("k").ttl(LONG_TTL).await }).await
    };
    first.abort();
    let lease = soon(second).await.unwrap().unwrap();
    assert_eq!(lease.ttl(), LONG_TTL);
    assert_eq!(
        db.doc("k").unwrap().exp,
        t0 + Duration::from_millis(100) + TTL,
        "written for the first waiter"
    );
    soon(lease.status().lost()).await;
    assert_eq!(Instant::now(), t0 + VALIDITY, "the written TTL's deadline");
}
