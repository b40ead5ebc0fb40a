//! Release timing (`src/actor/release.rs`, `shutdown.rs`, `write_stream.rs`,
//! `observers.rs`): shutdown, `release_all`, payload, observers, force release,
//! and the prompt wake-up on releases by other owners.

use tokio_util::time::FutureExt as _;

use super::*;
use crate::store::KeyWrite;

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
        assert!(lease.status().is_lost(), "{} not cancelled", lease.key());
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
    assert_shutdown(
        a.acquire("x")
            .into_future()
            .timeout(TTL)
            .await
            .ok()
            .transpose(),
    );
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
    assert!(lease.status().is_lost());
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
async fn release_all_cancels_local_leases_with_one_command_by_lease_id() {
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

    assert_eq!(a.release_all().await.unwrap(), 3);
    assert_eq!(store.calls(Op::Release), 1);
    assert_eq!(store.calls(Op::ReleaseOwner), 0);
    for lease in [&l1, &l2, &l3] {
        assert!(lease.status().is_lost(), "{} not cancelled", lease.key());
    }
    assert_released(&db, "k1");
    assert_released(&db, "k2");
    // By lease id only: an earlier process's lease expires on its own.
    assert_eq!(db.holder("old").as_deref(), Some("a"));
    assert_eq!(db.holder("theirs").as_deref(), Some("b"));

    let (_, k3) = soon(next).await.unwrap().unwrap();
    assert!(k3.fencing_token() > l3.fencing_token());
    assert!(!k3.status().is_lost());
    assert_eq!(db.holder("k3").as_deref(), Some("a"));

    assert_eq!(l1.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
    assert_eq!(
        store.calls(Op::Release),
        1,
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
    store.set_latency(Op::Release, Duration::from_millis(100));
    let held = a.acquire("k").await.unwrap();
    let t = Instant::now();
    let pending = waiter(&a, "f").await;
    sleep(Duration::from_millis(10)).await;
    let release_all = started({
        let a = a.clone();
        async move { a.release_all().await }
    })
    .await;
    // The acquire lands at +50 ms, the release at +110 ms.
    let (granted_at, lease) = soon(pending).await.unwrap().unwrap();
    assert_eq!(granted_at, t + Duration::from_millis(50));
    assert_eq!(soon(release_all).await.unwrap().unwrap(), 1);
    assert!(held.status().is_lost());
    assert_eq!(Instant::now(), t + Duration::from_millis(110));
    assert!(!lease.status().is_lost());
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
    store.set_latency(Op::Release, Duration::from_millis(100));
    let held = a.acquire("k").await.unwrap();
    let release_all = started({
        let a = a.clone();
        async move { a.release_all().await }
    })
    .await;
    settle().await;
    sleep(Duration::from_millis(10)).await;
    let lease = a.acquire("n").await.unwrap();
    assert_eq!(soon(release_all).await.unwrap().unwrap(), 1);
    assert!(held.status().is_lost() && !lease.status().is_lost());
    assert_eq!(
        db.holder("n").as_deref(),
        Some("a"),
        "our live lease was released on the server: another owner can take it \
         while our token is not cancelled"
    );
}

/// A release of all this manager's leases that the server holds up past
/// its caller's timeout and applies later ("Late writes" in `store`) ends
/// the leases it was sent for and none acquired since: it names them by
/// lease id, never by owner id.
#[tokio::test(start_paused = true)]
async fn release_all_landing_after_its_caller_gave_up_ends_no_lease_acquired_since() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    store.set_operation_timeout(Some(OPERATION_TIMEOUT));
    let old = a.acquire("k").await.unwrap();
    let held_up = OPERATION_TIMEOUT * 3;
    for op in [Op::Release, Op::ReleaseOwner] {
        store.set_fault(op, Some(Fault::Unanswered(held_up)));
    }
    let sent = Instant::now();
    assert!(a.release_all().await.is_err(), "given up by its caller");
    assert!(old.status().is_lost());
    for op in [Op::Release, Op::ReleaseOwner] {
        store.set_fault(op, None);
    }
    let new = a.acquire("n").await.unwrap();
    sleep_until(sent + held_up + HEARTBEAT).await;
    assert_released(&db, "k");
    assert_eq!(
        db.holder("n").as_deref(),
        Some("a"),
        "the late release ended a lease acquired after it was sent"
    );
    assert!(!new.status().is_lost());
}

// ----- read model, payload, observers ----------------------------------------

#[tokio::test(start_paused = true)]
async fn set_payload_on_a_lease_taken_on_the_server_reports_it_lost_and_fires_its_token() {
    let db = MemoryDb::new();
    // No change stream: the payload write itself must find the loss (with
    // one, the takeover's event may make the actor check the lease first).
    let (a, store, _) = start_without_change_streams(&db, "a");
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
    assert!(lease.status().is_lost(), "a confirmed loss fires the token");
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
    let released = a
        .force_release("k")
        .immediately()
        .await
        .unwrap()
        .expect("held");
    assert_eq!(released.fencing_token, lease.fencing_token());
    assert!(lease.status().is_lost());
    let (_, second) = soon(next).await.unwrap().unwrap();
    assert!(second.fencing_token() > lease.fencing_token());
    assert_eq!(a.force_release("other").await.unwrap(), None);
    let (page, next) = a.list().page(None, 10).await.unwrap();
    assert_eq!(page.len(), 1);
    assert_eq!(next, None);
}

// ----- prompt wake-up on releases by other owners -------------------------------

/// A waiter whose next poll is at least a second away gets the key within
/// `RELEASE_WAKE_JITTER` of another owner's release, which hands it the key
/// (it registered in the key's queue), granted on the event with no further
/// attempt; its release stream is open only while it waits (and while its
/// registration may still be handed the key), never while it merely holds.
#[tokio::test(start_paused = true)]
async fn a_release_by_another_owner_wakes_local_waiters_at_once() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, b_store) = start_slow_polls(&db, "b");
    assert_eq!(
        db.release_watchers(),
        0,
        "nothing to watch before anyone waits"
    );

    let lease = a.acquire("k").await.unwrap();
    settle().await;
    assert_eq!(db.release_watchers(), 0, "a merely holds: no stream");
    let waiting = waiter(&b, "k").await;
    settle().await;
    sleep(RELEASE_WAKE_JITTER + MS).await;
    assert_eq!(
        b_store.acquire_calls("k").len(),
        2,
        "the first attempt found the key held, and so did its retry once \
         b's stream opened (a release before then would not be announced)"
    );
    assert_eq!(db.release_watchers(), 1, "b watches writes while it waits");
    assert_eq!(db.release_readers(), 1, "and reads them");

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
        "no more attempt: b registered in the key's queue, so the release \
         handed it the key, and b was granted it on the event"
    );

    // Nobody waits any more: b stops reading its stream at once, though
    // b holds the lease, and the heartbeat that finds it paused for an
    // interval closes it.
    settle().await;
    assert_eq!(db.release_readers(), 0, "b merely holds: paused");
    assert_eq!(db.release_watchers(), 1);
    sleep(HEARTBEAT - MS).await;
    assert_eq!(
        db.release_watchers(),
        1,
        "a heartbeat within an interval of the pause keeps it"
    );
    sleep(2 * HEARTBEAT).await;
    assert_eq!(db.release_watchers(), 0, "b merely holds: closed");
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
}

/// Writes before a stream of writes opens are not announced: a release by
/// another owner that lands after the waiter's failed attempt but before its
/// stream opened wakes the waiter when the stream opens, not at its next
/// poll (at least a second later here).
#[tokio::test(start_paused = true)]
async fn a_release_before_the_waiters_stream_opens_wakes_it_once_the_stream_opens() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, b_store) = start_slow_polls(&db, "b");
    let lease = a.acquire("k").await.unwrap();
    b_store.hold_stream_opening();
    let waiting = waiter(&b, "k").await;
    settle().await;
    assert_eq!(
        b_store.acquire_calls("k").len(),
        1,
        "the first attempt found the key held"
    );

    // Its next poll is at least 1 s away (equal jitter on a 2 s step).
    sleep(Duration::from_millis(500)).await;
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    sleep(Duration::from_millis(100)).await;
    assert_eq!(
        b_store.acquire_calls("k").len(),
        1,
        "the release was not announced: b's stream is not open yet"
    );
    let opened_at = Instant::now();
    b_store.let_streams_open();
    let (acquired_at, lease) = soon(waiting).await.unwrap().unwrap();
    assert!(
        acquired_at - opened_at <= RELEASE_WAKE_JITTER,
        "woken when the stream opened: {:?} after it",
        acquired_at - opened_at
    );
    assert_eq!(
        b_store.acquire_calls("k").len(),
        2,
        "one more attempt, right after the stream opened"
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
}

/// The end of the tests of a stale `Held` answer: the attempt (100 ms of
/// latency) answers now that `x` holds `k`; `k` then expires, and the
/// waiter's next attempt starts at once (within the wake jitter), not at
/// its next poll, and gets the key.
async fn assert_stale_held_answer_retried_at_once(
    db: &MemoryDb,
    store: &MemoryStore,
    waiting: JoinHandle<Result<(Instant, Lease)>>,
) {
    settle().await;
    let answered_at = Instant::now();
    assert_eq!(store.acquire_calls("k").len(), 1);
    assert_eq!(db.holder("k").as_deref(), Some("x"), "the attempt found x");
    db.expire("k");
    let (acquired_at, lease) = soon(waiting).await.unwrap().unwrap();
    assert!(
        acquired_at - answered_at <= RELEASE_WAKE_JITTER + Duration::from_millis(100),
        "tried again at once: {:?} after the stale answer",
        acquired_at - answered_at
    );
    assert_eq!(
        store.acquire_calls("k").len(),
        2,
        "one more attempt, right after the stale answer"
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
}

/// A release announced while the waiter's attempt is in flight may have
/// landed after that attempt read the key: a `Held` answer is then stale, and
/// the waiter tries again at once rather than at its next poll (at least a
/// second later here).
#[tokio::test(start_paused = true)]
async fn a_release_announced_during_the_waiters_attempt_makes_a_held_answer_retry_at_once() {
    let db = MemoryDb::new();
    assert!(matches!(
        db.try_take("k", "x", TTL),
        AcquireOutcome::Acquired { .. }
    ));
    let (b, b_store) = start_slow_polls(&db, "b");
    // b's stream is open before it waits (it holds another key).
    let _other = b.acquire("other").await.unwrap();
    settle().await;
    b_store.set_latency(Op::Acquire, Duration::from_millis(100));
    let waiting = waiter(&b, "k").await;
    sleep(Duration::from_millis(50)).await;
    // x's release lands after b's attempt read the key, and its event comes
    // before the attempt's reply.
    db.announce(KeyWrite {
        key: "k".into(),
        freed: true,
        lease_id: None,
        owner: None,
        token: None,
    });
    sleep(Duration::from_millis(50)).await;
    assert_stale_held_answer_retried_at_once(&db, &b_store, waiting).await;
}

/// Likewise when the stream opens while the waiter's attempt is in flight:
/// a write before the opening was not announced, and the attempt may have
/// read the key before it, so a `Held` answer is retried at once.
#[tokio::test(start_paused = true)]
async fn a_stream_opening_during_the_waiters_attempt_makes_a_held_answer_retry_at_once() {
    let db = MemoryDb::new();
    assert!(matches!(
        db.try_take("k", "x", TTL),
        AcquireOutcome::Acquired { .. }
    ));
    let (b, b_store) = start_slow_polls(&db, "b");
    b_store.hold_stream_opening();
    // Holding another key makes b open its stream, which does not report
    // itself open yet.
    let _other = b.acquire("other").await.unwrap();
    settle().await;
    b_store.set_latency(Op::Acquire, Duration::from_millis(100));
    let waiting = waiter(&b, "k").await;
    sleep(Duration::from_millis(50)).await;
    b_store.let_streams_open();
    sleep(Duration::from_millis(50)).await;
    assert_stale_held_answer_retried_at_once(&db, &b_store, waiting).await;
}

// ----- delete-on-release mode ----------------------------------------------------

/// A manager in delete-on-release mode (store and timing alike).
fn start_delete_mode(db: &MemoryDb, owner: &str) -> (LeaseManager, MemoryStore, Instant) {
    let store = db
        .store(owner, TTL)
        .with_release_mode(crate::config::ReleaseMode::Delete);
    let t0 = Instant::now();
    let timing = Timing {
        release_mode: crate::config::ReleaseMode::Delete,
        ..timing()
    };
    let manager = LeaseManager::start(Arc::new(store.clone()), owner.into(), timing);
    (manager, store, t0)
}

#[tokio::test(start_paused = true)]
async fn delete_mode_deletes_an_old_lease_at_release_and_a_young_one_once_its_token_is_old() {
    use crate::store::DELETE_DELAY;
    let db = MemoryDb::new();
    let (a, store, _) = start_delete_mode(&db, "a");

    // Held longer than DELETE_MIN_TOKEN_AGE: one release call deletes it.
    let old = a.acquire("old").await.unwrap();
    sleep(DELETE_DELAY).await;
    assert!(!old.release().await.unwrap().was_lost());
    assert_eq!(db.doc("old"), None);
    settle().await;
    assert_eq!(store.calls(Op::Release), 1, "no follow-up for an old lease");

    // Young: marked released, deleted at acquisition + DELETE_DELAY.
    let acquired_at = Instant::now();
    let young = a.acquire("young").await.unwrap();
    assert!(!young.release().await.unwrap().was_lost());
    assert_released(&db, "young");
    sleep_until(acquired_at + DELETE_DELAY - MS).await;
    assert!(
        db.doc("young").is_some(),
        "kept until its token is old enough"
    );
    sleep_until(acquired_at + DELETE_DELAY).await;
    settle().await;
    assert_eq!(db.doc("young"), None);
    assert_eq!(
        store.calls(Op::Release),
        3,
        "release, then one follow-up delete"
    );

    // Re-acquired before the follow-up: never deleted.
    let again = a.acquire("again").await.unwrap();
    assert!(!again.release().await.unwrap().was_lost());
    let held = a.acquire("again").await.unwrap();
    sleep(DELETE_DELAY).await;
    settle().await;
    assert_eq!(db.holder("again").as_deref(), Some("a"));
    assert!(!held.status().is_lost());
    a.shutdown().await.unwrap();
}

/// The follow-up delete is timed from the acquire's reply, not its send: an
/// acquire that reached the server late (here 500 ms of latency, applied at
/// its end like a request queued under load) has a token that much younger,
/// and its released document is still deleted once the token is old enough.
#[tokio::test(start_paused = true)]
async fn delete_mode_times_the_follow_up_delete_from_the_acquires_reply() {
    use crate::store::DELETE_DELAY;
    let db = MemoryDb::new();
    let (a, store, _) = start_delete_mode(&db, "a");
    store.set_latency(Op::Acquire, Duration::from_millis(500));
    let young = a.acquire("slow").await.unwrap();
    let answered_at = Instant::now();
    assert!(!young.release().await.unwrap().was_lost());
    assert_released(&db, "slow");
    sleep_until(answered_at + DELETE_DELAY - MS).await;
    settle().await;
    assert!(
        db.doc("slow").is_some(),
        "kept until its token is old enough"
    );
    sleep_until(answered_at + DELETE_DELAY).await;
    settle().await;
    assert_eq!(
        db.doc("slow"),
        None,
        "deleted by the follow-up, timed from the reply"
    );
    a.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn delete_mode_shutdown_returns_once_young_leases_documents_are_deleted() {
    use crate::store::DELETE_DELAY;
    let db = MemoryDb::new();
    let (a, _, _) = start_delete_mode(&db, "a");
    let old = a.acquire("old").await.unwrap();
    sleep(DELETE_DELAY).await;
    let acquired_at = Instant::now();
    let young = a.acquire("young").await.unwrap();
    a.shutdown().await.unwrap();
    assert_eq!(Instant::now(), acquired_at + DELETE_DELAY);
    assert!(old.status().is_lost() && young.status().is_lost());
    assert_eq!(db.doc("old"), None);
    assert_eq!(db.doc("young"), None);
}
