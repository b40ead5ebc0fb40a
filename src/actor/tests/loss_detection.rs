//! Leases taken away by someone else's write (`src/actor/write_stream.rs`):
//! by default noticed by the next heartbeat's renewal (merely holding leases
//! keeps no stream of writes open); with `watch_held_leases`, through the
//! stream of writes at once, by a renewal of just the leases concerned,
//! never by the event alone.

use super::*;
use crate::status::LossReason;
use crate::store::KeyWrite;

/// Half-way between the manager's start and its first heartbeat.
const BETWEEN_TICKS: Duration = Duration::from_millis(500);

/// The keys of each renewal call since `before` calls, with its instant.
fn renewals_since(store: &MemoryStore, before: usize) -> Vec<(Instant, Vec<LeaseKey>)> {
    store
        .calls_of(Op::Renew)
        .split_off(before)
        .into_iter()
        .map(|c| {
            let mut keys = c.keys;
            keys.sort();
            (c.at, keys)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_lease_deleted_by_someone_else_is_lost_at_once_by_a_check_of_that_lease_only() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let k1 = a.acquire("k1").await.unwrap();
    let k2 = a.acquire("k2").await.unwrap();
    sleep_until(t0 + BETWEEN_TICKS).await;
    let before = store.calls(Op::Renew);

    db.delete("k1");
    soon(k1.status().lost()).await;
    assert_eq!(
        Instant::now(),
        t0 + BETWEEN_TICKS,
        "lost at once, not at the heartbeat"
    );
    assert_eq!(
        renewals_since(&store, before),
        [(t0 + BETWEEN_TICKS, vec![LeaseKey::from("k1")])],
        "one check of the lease written, no renewal of the others"
    );
    settle().await;
    assert!(!k2.status().is_lost());
    assert_eq!(db.holder("k2").as_deref(), Some("a"));
    assert_eq!(k1.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
}

#[tokio::test(start_paused = true)]
async fn a_lease_whose_owner_id_is_rewritten_is_lost_at_once() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    sleep_until(t0 + BETWEEN_TICKS).await;
    let before = store.calls(Op::Renew);

    db.set_owner("k", "intruder");
    soon(lease.status().lost()).await;
    assert_eq!(Instant::now(), t0 + BETWEEN_TICKS);
    assert_eq!(
        renewals_since(&store, before),
        [(t0 + BETWEEN_TICKS, vec![LeaseKey::from("k")])]
    );
    assert_eq!(
        db.holder("k").as_deref(),
        Some("intruder"),
        "theirs untouched"
    );
}

#[tokio::test(start_paused = true)]
async fn by_default_a_holder_opens_no_stream_and_a_delete_is_lost_at_the_next_heartbeat() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let k1 = a.acquire("k1").await.unwrap();
    let k2 = a.acquire("k2").await.unwrap();
    sleep_until(t0 + BETWEEN_TICKS).await;
    assert_eq!(db.release_watchers(), 0, "merely holding: no stream");
    let before = store.calls(Op::Renew);

    db.delete("k1");
    let reason = soon(async {
        k1.status().lost().await;
        k1.status().lost_reason()
    })
    .await;
    assert_eq!(reason, Some(LossReason::Deleted));
    assert_eq!(Instant::now(), t0 + HEARTBEAT, "at the next heartbeat");
    assert_eq!(
        renewals_since(&store, before),
        [(
            t0 + HEARTBEAT,
            vec![LeaseKey::from("k1"), LeaseKey::from("k2")]
        )],
        "the heartbeat's one renewal found it gone"
    );
    assert!(!k2.status().is_lost());
    assert_eq!(db.release_watchers(), 0);
}

#[tokio::test(start_paused = true)]
async fn with_watch_held_leases_the_stream_stays_open_while_holding_and_a_delete_is_lost_at_once() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    sleep_until(t0 + HEARTBEAT * 3 + BETWEEN_TICKS).await;
    assert_eq!(db.release_watchers(), 1, "held: open, across heartbeats");
    let before = store.calls(Op::Renew);

    db.delete("k");
    let reason = soon(async {
        lease.status().lost().await;
        lease.status().lost_reason()
    })
    .await;
    assert_eq!(reason, Some(LossReason::Deleted));
    assert_eq!(
        Instant::now(),
        t0 + HEARTBEAT * 3 + BETWEEN_TICKS,
        "at once"
    );
    assert_eq!(
        renewals_since(&store, before),
        [(
            t0 + HEARTBEAT * 3 + BETWEEN_TICKS,
            vec![LeaseKey::from("k")]
        )],
        "one check of that lease"
    );
    sleep(HEARTBEAT).await;
    assert_eq!(db.release_watchers(), 0, "nothing held: closed");
}

#[tokio::test(start_paused = true)]
async fn a_stream_opens_while_a_key_waits_for_another_owner_and_closes_once_it_only_holds() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let theirs = a.acquire("k").await.unwrap();
    let waiting = waiter(&b, "k").await;
    settle().await;
    assert_eq!(db.release_watchers(), 1, "b waits: b's stream is open");
    assert_eq!(theirs.release().await.unwrap(), ReleaseOutcome::Released);
    let (_, ours) = soon(waiting).await.unwrap().unwrap();
    // The next heartbeat after the key is b's closes it (b merely holds).
    sleep(HEARTBEAT + MS).await;
    assert_eq!(db.release_watchers(), 0, "b merely holds: closed");
    assert!(!ours.status().is_lost());
}

#[tokio::test(start_paused = true)]
async fn without_a_change_stream_a_rewritten_owner_id_is_lost_at_the_next_heartbeat() {
    let db = MemoryDb::new();
    let (a, _, t0) = start_without_change_streams(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    sleep_until(t0 + BETWEEN_TICKS).await;

    db.set_owner("k", "intruder");
    soon(lease.status().lost()).await;
    assert_eq!(
        Instant::now(),
        t0 + HEARTBEAT,
        "renewals match the owner id"
    );
}

#[tokio::test(start_paused = true)]
async fn a_stale_event_makes_the_holder_check_but_never_loses_a_held_lease() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    sleep_until(t0 + BETWEEN_TICKS).await;
    let before = store.calls(Op::Renew);

    // E.g. the previous holder's release, delivered after our acquire reply.
    db.announce(KeyWrite {
        key: "k".into(),
        freed: true,
        lease_id: None,
        owner: None,
        token: None,
    });
    sleep(BETWEEN_TICKS / 2).await;
    assert_eq!(
        renewals_since(&store, before),
        [(t0 + BETWEEN_TICKS, vec![LeaseKey::from("k")])],
        "checked at once"
    );
    assert!(!lease.status().is_lost(), "the store says it is still held");
    sleep(HEARTBEAT * 3).await;
    assert!(!lease.status().is_lost());
    assert_eq!(db.holder("k").as_deref(), Some("a"));
}

#[tokio::test(start_paused = true)]
async fn writes_to_other_keys_and_the_holders_own_writes_cost_no_check() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let (b, _, _) = start(&db, "b");
    let lease = a.acquire("k").await.unwrap();
    sleep_until(t0 + BETWEEN_TICKS).await;
    let before = store.calls(Op::Renew);

    // Another owner's acquisitions and releases, and this manager's own of
    // other keys; then a payload write on the held lease.
    for i in 0..3 {
        let theirs = b.acquire(format!("b{i}")).await.unwrap();
        let ours = a.acquire(format!("a{i}")).await.unwrap();
        assert_eq!(theirs.release().await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(ours.release().await.unwrap(), ReleaseOutcome::Released);
    }
    db.delete("b0");
    lease
        .set_payload(mongodb::bson::doc! { "x": 1 })
        .await
        .unwrap();
    sleep_until(t0 + HEARTBEAT - MS).await;
    assert_eq!(
        renewals_since(&store, before),
        [],
        "no renewal before the heartbeat"
    );
    assert!(!lease.status().is_lost());
}

#[tokio::test(start_paused = true)]
async fn a_write_announced_while_the_acquire_is_in_flight_is_checked_once_granted() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let _other = a.acquire("other").await.unwrap();
    store.set_latency(Op::Acquire, Duration::from_millis(100));
    let acquiring = waiter(&a, "k").await;
    sleep(Duration::from_millis(50)).await;
    // Delivered before the acquire reply: it may concern the new lease.
    db.announce(KeyWrite {
        key: "k".into(),
        freed: true,
        lease_id: None,
        owner: None,
        token: None,
    });
    let (granted_at, lease) = soon(acquiring).await.unwrap().unwrap();
    assert_eq!(granted_at, t0 + Duration::from_millis(100));
    settle().await;
    assert_eq!(
        renewals_since(&store, 0),
        [(granted_at, vec![LeaseKey::from("k")])],
        "checked as soon as granted"
    );
    assert!(!lease.status().is_lost(), "the store says it is held");
}

/// A stale event (the lease stays held): it makes the holder check `key`.
fn announce_stale_write(db: &MemoryDb, key: &str) {
    db.announce(KeyWrite {
        key: key.into(),
        freed: true,
        lease_id: None,
        owner: None,
        token: None,
    });
}

/// A check's renewal counts as the lease's renewal in flight: the heartbeat
/// sends no second one for that lease meanwhile.
#[tokio::test(start_paused = true)]
async fn a_check_in_flight_at_a_heartbeat_tick_stands_for_that_ticks_renewal() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    store.set_latency(Op::Renew, Duration::from_millis(300));
    let check_at = t0 + HEARTBEAT - Duration::from_millis(100);
    sleep_until(check_at).await;

    // The check is in flight from 0.9 s to 1.2 s, over the tick at 1 s.
    announce_stale_write(&db, "k");
    sleep_until(t0 + HEARTBEAT * 2 + MS).await;
    assert_eq!(
        renewals_since(&store, 0),
        [
            (check_at, vec![LeaseKey::from("k")]),
            (t0 + HEARTBEAT * 2, vec![LeaseKey::from("k")]),
        ],
        "no second renewal of the lease at the tick while the check is in flight"
    );
    assert_eq!(store.max_in_flight(Op::Renew), 1);
    assert!(!lease.status().is_lost());
}

/// Renewals in flight are counted: a check's result counts one down, and the
/// heartbeat's renewal still pending (here: awaiting its retry) keeps the
/// heartbeat from sending another.
#[tokio::test(start_paused = true)]
async fn a_checks_result_does_not_end_the_heartbeats_renewal_still_pending() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    // The heartbeat's renewal at 1 s hangs past its bound (one heartbeat
    // interval): it times out at 2 s and is retried within RETRY_INITIAL.
    // The check at 1.05 s takes 0.1 s and is answered meanwhile.
    store.set_latency(Op::Renew, Duration::from_millis(1500));
    let check_at = t0 + HEARTBEAT + Duration::from_millis(50);
    sleep_until(check_at).await;
    assert_eq!(store.in_flight(Op::Renew), 1, "the heartbeat's renewal");
    store.set_latency(Op::Renew, Duration::from_millis(100));
    announce_stale_write(&db, "k");
    sleep_until(t0 + HEARTBEAT * 3 + MS).await;
    let renewals = renewals_since(&store, 0);
    let k = vec![LeaseKey::from("k")];
    assert_eq!(
        renewals[..2],
        [(t0 + HEARTBEAT, k.clone()), (check_at, k.clone())],
        "{renewals:?}"
    );
    let around_second_tick: Vec<Instant> = renewals[2..]
        .iter()
        .map(|(at, _)| *at)
        .filter(|at| *at < t0 + HEARTBEAT * 3)
        .collect();
    assert_eq!(
        around_second_tick.len(),
        1,
        "only the retry of the pending renewal, no new one at the tick of 2 s: {renewals:?}"
    );
    let retry = around_second_tick[0];
    assert!(
        retry >= t0 + HEARTBEAT * 2 && retry <= t0 + HEARTBEAT * 2 + RETRY_INITIAL,
        "{renewals:?}"
    );
    assert_eq!(
        renewals.last(),
        Some(&(t0 + HEARTBEAT * 3, k)),
        "the tick of 3 s renews it again"
    );
    assert_eq!(renewals.len(), 4, "{renewals:?}");
    assert!(!lease.status().is_lost());
}

/// A check is sent at once even while a heartbeat's batch is in flight and
/// others wait behind it (one heartbeat batch in flight at a time): a lease
/// taken away is found within a round trip, not after the heartbeat's
/// batches.
#[tokio::test(start_paused = true)]
async fn a_check_goes_beside_the_heartbeats_batch_in_flight_not_behind_those_waiting() {
    use crate::actor::renewal::RENEWALS_IN_FLIGHT;
    const LATENCY: Duration = Duration::from_millis(300);
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let batches = RENEWALS_IN_FLIGHT + 2;
    let mut leases = Vec::new();
    for i in 0..batches * BATCH {
        leases.push(a.acquire(format!("k{i}")).await.unwrap());
    }
    store.set_latency(Op::Renew, LATENCY);
    let check_at = t0 + HEARTBEAT + Duration::from_millis(50);
    sleep_until(check_at).await;
    assert_eq!(
        store.in_flight(Op::Renew),
        RENEWALS_IN_FLIGHT,
        "the heartbeat's batches in flight, the others waiting"
    );
    announce_stale_write(&db, "k0");
    sleep_until(t0 + HEARTBEAT * 2 - MS).await;
    let sent: Vec<(Instant, usize)> = store
        .calls_of(Op::Renew)
        .into_iter()
        .map(|c| (c.at, c.keys.len()))
        .collect();
    let mut first = vec![(t0 + HEARTBEAT, BATCH); RENEWALS_IN_FLIGHT];
    first.push((check_at, 1));
    assert_eq!(sent[..first.len()], first, "{sent:?}");
    let rest = &sent[first.len()..];
    assert_eq!(rest.len(), batches - RENEWALS_IN_FLIGHT, "{sent:?}");
    assert!(
        rest.iter()
            .all(|&(at, keys)| at >= t0 + HEARTBEAT + LATENCY && keys == BATCH),
        "the waiting batches go once the one in flight is answered: {sent:?}"
    );
    assert_eq!(store.max_in_flight(Op::Renew), RENEWALS_IN_FLIGHT + 1);
    assert!(leases.iter().all(|l| !l.status().is_lost()));
    a.shutdown().await.unwrap();
}
