//! Acquire timing (`src/actor/acquire.rs`): FIFO fairness with one attempt in
//! flight, capped retries, local handoff and yields, cancel safety, acquire
//! errors, `try_acquire`, and `acquire` under a timeout.

use tokio_util::time::FutureExt as _;

use super::*;
use crate::store::memory::ForeignWrite;

// ----- 5. FIFO fairness, one attempt in flight, capped retries -------------------------

#[tokio::test(start_paused = true)]
async fn local_waiters_are_served_in_order_by_one_retry_loop() {
    const HOLD: Duration = Duration::from_millis(100);
    const LATENCY: Duration = Duration::from_millis(5);
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    store.set_latency(Op::Acquire, LATENCY);
    store.set_latency(Op::Handoff, LATENCY);
    db.force_take("k", "remote", TTL);
    let remote_exp = t0 + TTL;

    let grants = contend(&a, "k", 5, HOLD).await;
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
            "handoff: one round trip"
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
    assert_eq!(calls.len(), polls + 1, "the winning poll");
    assert_eq!(store.calls(Op::Handoff), 4, "then one write per handoff");
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
    assert_eq!(sa.acquire_calls("k"), vec![t0]);
    let handoffs: Vec<Instant> = sa.calls_of(Op::Handoff).iter().map(|c| c.at).collect();
    assert_eq!(handoffs, vec![released_at], "handed over in the release");
    assert!(second.fencing_token() > 1);
    assert_eq!(db.holder("k").as_deref(), Some("a"));
}

/// Cross-process fairness: a manager whose tasks keep re-acquiring a key
/// would otherwise keep it from another manager's waiter forever. A release
/// that another owner waited for yields the key to it, and the next release
/// yields it back.
#[tokio::test(start_paused = true)]
async fn a_release_that_another_owner_waited_for_hands_the_key_to_it() {
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

    // The local waiter now waits on the other owner (registered in the
    // key's queue), whose release hands the key back in the same write.
    soon(db.changed_until("k", |d| !d.queue.is_empty())).await;
    let released_at = Instant::now();
    assert_eq!(
        remote_lease.release().await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(
        db.holder("k").as_deref(),
        Some("a"),
        "handed in the release"
    );
    let (local_at, _) = soon(local).await.unwrap().unwrap();
    assert!(local_at - released_at <= RELEASE_WAKE_JITTER);
    assert_eq!(db.holder("k").as_deref(), Some("a"));
}

/// A waiter that gave up after registering costs the releasing manager's
/// next waiter one give-back, not a yield window nor its registration: the
/// release hands the key to the registration, whose manager (still
/// running) gives it back at once, to the next registered owner.
#[tokio::test(start_paused = true)]
async fn a_key_handed_to_an_owner_whose_waiter_gave_up_is_given_back_at_once() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let remote = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| !d.queue.is_empty())).await;
    remote.abort();
    let local = waiter(&a, "k").await;

    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (granted_at, _) = soon(local).await.unwrap().unwrap();
    assert!(
        granted_at - released_at <= RELEASE_WAKE_JITTER,
        "granted {:?} after the release",
        granted_at - released_at
    );
    assert_eq!(sb.calls(Op::Release), 1, "b gave the handed key back");
    assert_eq!(db.holder("k").as_deref(), Some("a"));
}

/// The stream of writes stays open while a registration whose waiters left
/// may still be handed the key, across heartbeats (the heartbeat closes a
/// stream nothing needs): the handoff to it is seen and given back at once,
/// not left held until its TTL.
#[tokio::test(start_paused = true)]
async fn a_registration_whose_waiter_gave_up_keeps_the_stream_open_until_it_lapses() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let remote = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| !d.queue.is_empty())).await;
    remote.abort();
    // A heartbeat of b's passes; its registration is still live.
    sleep(HEARTBEAT + MS).await;
    assert_eq!(queued_owners(&db, "k"), ["b"], "still registered");
    assert_eq!(db.release_watchers(), 1, "b's stream: a merely holds");

    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    soon(db.changed_until("k", |d| d.owner == "b" && d.lease_id.is_none())).await;
    assert_eq!(sb.calls(Op::Release), 1, "b gave the handed key back");
    assert_eq!(db.holder("k"), None);
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
    let mut pending = Box::pin(a.acquire("late").into_future());
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
    // The write lands but the reply is lost, and so is the re-read's.
    store.fault_next(Op::Acquire, Fault::FailAfterApply, 2);
    store.fail_next(Op::Inspect, 1);
    let error = a.try_acquire("k").await.unwrap_err();
    assert!(error.is_transient(), "{error:?}");
    settle().await;
    assert_eq!(store.calls(Op::Release), 1);
    assert_released(&db, "k");
}

#[tokio::test(start_paused = true)]
async fn an_acquisition_only_a_re_read_shows_is_confirmed_at_once_by_a_write() {
    const LATENCY: Duration = Duration::from_millis(20);
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    store.set_latency(Op::Acquire, LATENCY);
    // The write lands but its reply is lost, and so is the reply to it
    // sent again; the re-read finds the lease.
    store.fault_next(Op::Acquire, Fault::FailAfterApply, 2);
    let lease = soon(a.try_acquire("k")).await.unwrap().expect("the lease");
    let sent = store.acquire_calls("k");
    assert_eq!(sent.len(), 3, "sent twice, then one retry: {sent:?}");
    assert_eq!(sent[1], sent[0] + LATENCY, "sent again at once");
    assert_eq!(sent[2], sent[1] + LATENCY, "at once after the re-read");
    let doc = db.doc("k").unwrap();
    assert_eq!(doc.acquired, sent[0] + LATENCY, "the same acquisition");
    assert_eq!(lease.fencing_token(), doc.token);
    // Its local deadline counts from the write that confirmed it.
    assert_eq!(lease.status().deadline(), Some(sent[2] + VALIDITY));
    assert_eq!(store.calls(Op::Release), 0);
}

// ----- acquire errors ------------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn transient_acquire_failures_are_retried_for_waiters_and_reported_to_a_try() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    store.fail_next(Op::Acquire, 2);
    store.fail_next(Op::Inspect, 1);
    assert!(a.try_acquire("t").await.unwrap_err().is_transient());
    assert_eq!(
        store.acquire_calls("t").len(),
        2,
        "a try makes one attempt, sent twice"
    );
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

    // Two attempts land unseen, each sent twice (their re-reads fail too);
    // the third, under the same lease id, is recognised as ours: same
    // acquisition, same token.
    store.fault_next(Op::Acquire, Fault::FailAfterApply, 4);
    store.fail_next(Op::Inspect, 2);
    let lease = soon(a.acquire("w")).await.unwrap();
    let sent = store.acquire_calls("w");
    assert_eq!(sent.len(), 5);
    assert_eq!((sent[1], sent[3]), (sent[0], sent[2]), "sent again at once");
    let calls = [sent[0], sent[2], sent[4]];
    let doc = db.doc("w").unwrap();
    assert_eq!(doc.acquired, calls[0], "one acquisition, not three");
    assert_eq!(lease.fencing_token(), doc.token);
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
    assert!(!lease.status().is_lost());
}

#[tokio::test(start_paused = true)]
async fn a_foreign_lock_is_waited_for_with_capped_backoff_and_its_deletion_wakes_the_waiters() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let lock = mongodb::bson::doc! { "ts": db.date(db.server_now()), "aid": "java-app-1" };
    db.foreign_write("f", |_| ForeignWrite::Replace(lock));
    let written = db.foreign("f").expect("the foreign lock");
    assert!(a.try_acquire("f").await.unwrap().is_none());
    let first = waiter(&a, "f").await;
    let second = waiter(&a, "f").await;

    // Its expiry is unknown: the waiters poll with the plain backoff, capped
    // by `retry_max`, and the stream of releases stays open.
    sleep(10 * RETRY_MAX).await;
    assert!(!first.is_finished() && !second.is_finished());
    assert_eq!(db.release_watchers(), 1, "the release watch is open");
    let calls = store.acquire_calls("f");
    assert!(calls.len() >= 10, "{} polls in 10 s", calls.len());
    for gap in calls.windows(2).map(|pair| pair[1] - pair[0]) {
        assert!(gap <= RETRY_MAX + MS, "a poll after {gap:?}");
    }
    assert_eq!(db.foreign("f"), Some(written), "never modified");
    assert_eq!(db.doc("f"), None);

    // Its owner deletes it: the delete event wakes the first waiter at once.
    let deleted_at = Instant::now();
    db.delete("f");
    let (granted_at, lease) = soon(first).await.unwrap().unwrap();
    assert!(
        granted_at - deleted_at <= RETRY_INITIAL,
        "granted {:?} after the delete",
        granted_at - deleted_at
    );
    drop(lease);
    let (_, lease) = soon(second).await.unwrap().unwrap();
    assert_eq!(db.holder("f").as_deref(), Some("a"));
    drop(lease);
}

// ----- 8. try_acquire, and acquire under a timeout ---------------------------------------

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
async fn acquire_under_a_timeout_gives_up_exactly_at_the_timeout() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    db.force_take("k", "remote", TTL);
    let t = Instant::now();
    let wait = Duration::from_millis(700);
    assert!(
        a.acquire("k")
            .into_future()
            .timeout(wait)
            .await
            .ok()
            .transpose()
            .unwrap()
            .is_none()
    );
    assert_eq!(Instant::now(), t + wait);
    let polls = store.acquire_calls("k").len();
    sleep(TTL * 2).await;
    assert_eq!(store.acquire_calls("k").len(), polls);

    let lease = a
        .acquire("free")
        .into_future()
        .timeout(wait)
        .await
        .ok()
        .transpose()
        .unwrap()
        .expect("free key");
    assert_eq!(
        Instant::now(),
        t + wait + TTL * 2,
        "a free key is granted at once"
    );
    assert_eq!(lease.key(), "free");
}

/// The owner ids live in the queue of `key`, in order.
fn queued_owners(db: &MemoryDb, key: &str) -> Vec<String> {
    let now = Instant::now();
    db.doc(key).map_or_else(Vec::new, |doc| {
        doc.live_queue(now).map(|w| w.owner.clone()).collect()
    })
}

/// Shutdown while a waiter's attempt whose outcome is unknown waits for
/// its retry, and shutdown's leaving of the queues fails: the attempt's
/// write may have landed, so shutdown still releases under its lease id
/// rather than leave the key held until the lease expires (the seeded
/// fault run on `mongod`, seed 12: write concern errors on every write of
/// one manager, then a clean shutdown).
#[tokio::test(start_paused = true)]
async fn shutdown_releases_an_ambiguous_attempt_even_when_leaving_the_queues_fails() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    // The write lands but its reply is lost (sent again, the same), and so
    // is the re-read's.
    store.fault_next(Op::Acquire, Fault::FailAfterApply, 2);
    store.fail_next(Op::Inspect, 1);
    let local = waiter(&a, "k").await;
    settle().await;
    assert_eq!(store.acquire_calls("k").len(), 2, "the retry waits");
    assert!(db.doc("k").unwrap().lease_id.is_some(), "the write landed");
    store.fault_next(Op::LeaveQueues, Fault::FailAfterApply, 1);
    a.shutdown().await.unwrap();
    assert_shutdown(soon(local).await.unwrap());
    assert_eq!(store.acquire_calls("k").len(), 2, "no retry");
    assert_eq!(store.calls(Op::LeaveQueues), 1);
    assert_released(&db, "k");
}
