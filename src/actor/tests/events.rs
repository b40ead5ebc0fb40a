//! A lease's events and loss reasons (`Lease::events`, `Lease::lost_reason`,
//! `src/status.rs`, `src/actor/loss.rs`): renewed, at risk, lost with each
//! reason the twin can produce, read as soon as the token has fired.

use super::*;
use crate::election::Election;
use crate::status::{LEASE_EVENTS_CAPACITY, LeaseEvent, LeaseEvents, LossReason};

/// Waits for the lease's token, then reads its reason at once: it must be
/// recorded before the token fires.
async fn reason_of(lease: &Lease) -> LossReason {
    soon(lease.status().lost()).await;
    lease
        .status()
        .lost_reason()
        .expect("the reason is recorded before the token fires")
}

/// The next event, failing the test if none comes within a minute of
/// paused time.
async fn next(events: &mut LeaseEvents) -> LeaseEvent {
    soon(events.recv()).await.expect("an event before the end")
}

/// The stream's last event is `Lost(reason)`, and it ends after it.
async fn assert_ends_lost(events: &mut LeaseEvents, reason: LossReason) {
    loop {
        match next(events).await {
            LeaseEvent::Lost(lost) => {
                assert_eq!(lost, reason);
                break;
            }
            LeaseEvent::Renewed { .. }
            | LeaseEvent::AtRisk { .. }
            | LeaseEvent::RevocationRequested { .. } => {}
        }
    }
    assert_eq!(soon(events.recv()).await, None, "nothing after Lost");
}

#[tokio::test(start_paused = true)]
async fn each_confirmed_renewal_sends_renewed_with_the_new_local_deadline() {
    let db = MemoryDb::new();
    let (a, _, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    assert_eq!(lease.status().deadline(), Some(t0 + VALIDITY));
    let mut events = lease.status().events();
    for tick in 1..=3 {
        match next(&mut events).await {
            LeaseEvent::Renewed { deadline, .. } => {
                assert_eq!(deadline, t0 + HEARTBEAT * tick + VALIDITY);
                assert_eq!(
                    lease.status().deadline(),
                    Some(deadline),
                    "moved before the event"
                );
            }
            other => panic!("expected Renewed, got {other:?}"),
        }
    }
    assert!(!lease.status().is_lost());
    assert_eq!(lease.status().lost_reason(), None);
}

#[tokio::test(start_paused = true)]
async fn a_failed_renewal_sends_at_risk_with_the_unchanged_deadline_then_renewed_by_the_retry() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    let mut events = lease.status().events();
    store.fail_next(Op::Renew, 1);
    match next(&mut events).await {
        LeaseEvent::AtRisk { deadline, error } => {
            assert_eq!(deadline, t0 + VALIDITY, "the acquisition's, unchanged");
            assert!(!error.is_empty());
            assert_eq!(Instant::now(), t0 + HEARTBEAT);
        }
        other => panic!("expected AtRisk, got {other:?}"),
    }
    assert!(!lease.status().is_lost(), "still held until its deadline");
    match next(&mut events).await {
        LeaseEvent::Renewed { deadline, .. } => {
            assert!(Instant::now() > t0 + HEARTBEAT, "the retry");
            assert_eq!(deadline, Instant::now() + VALIDITY, "from the retry's send");
        }
        other => panic!("expected Renewed, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn renewals_that_hang_send_at_risk_then_lost_expired_at_the_local_deadline() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    let mut events = lease.status().events();
    store.hang_renewals();
    assert!(matches!(
        next(&mut events).await,
        LeaseEvent::AtRisk { deadline, .. } if deadline == t0 + VALIDITY
    ));
    assert_eq!(reason_of(&lease).await, LossReason::Expired);
    assert_eq!(Instant::now(), t0 + VALIDITY);
    assert_ends_lost(&mut events, LossReason::Expired).await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_expired_on_the_server_and_taken_is_lost_taken_at_the_next_heartbeat() {
    let db = MemoryDb::new();
    let (a, _, t0) = start_without_change_streams(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    db.expire("k");
    assert!(matches!(
        db.try_take("k", "b", TTL),
        AcquireOutcome::Acquired { .. }
    ));
    let token = db.doc("k").expect("taken").token;
    assert_eq!(
        reason_of(&lease).await,
        LossReason::Taken {
            owner_id: "b".into(),
            fencing_token: token
        }
    );
    assert_eq!(Instant::now(), t0 + HEARTBEAT);
}

#[tokio::test(start_paused = true)]
async fn a_deleted_lease_is_lost_deleted_and_its_events_end_with_it() {
    let db = MemoryDb::new();
    let (a, _, _) = start_watching_held(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    let mut events = lease.status().events();
    let before = Instant::now();
    db.delete("k");
    assert_eq!(reason_of(&lease).await, LossReason::Deleted);
    assert_eq!(
        Instant::now(),
        before,
        "at once, through the stream of writes"
    );
    assert_ends_lost(&mut events, LossReason::Deleted).await;
}

#[tokio::test(start_paused = true)]
async fn by_default_a_deleted_lease_is_lost_deleted_at_the_next_heartbeat() {
    let db = MemoryDb::new();
    let (a, _, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    let mut events = lease.status().events();
    db.delete("k");
    assert_eq!(reason_of(&lease).await, LossReason::Deleted);
    assert_eq!(Instant::now(), t0 + HEARTBEAT, "found by the renewal");
    assert_ends_lost(&mut events, LossReason::Deleted).await;
}

#[tokio::test(start_paused = true)]
async fn a_lease_taken_by_another_owner_is_lost_taken_with_its_owner_id_and_token() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    let token = db.force_take("k", "b", TTL);
    assert!(token > lease.fencing_token());
    assert_eq!(
        reason_of(&lease).await,
        LossReason::Taken {
            owner_id: "b".into(),
            fencing_token: token
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_rewritten_owner_id_is_lost_taken_by_that_owner() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    db.set_owner("k", "intruder");
    assert_eq!(
        reason_of(&lease).await,
        LossReason::Taken {
            owner_id: "intruder".into(),
            fencing_token: lease.fencing_token()
        }
    );
}

#[tokio::test(start_paused = true)]
async fn a_payload_write_that_finds_the_lease_gone_records_why() {
    let db = MemoryDb::new();
    let (a, _, _) = start_without_change_streams(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    db.delete("k");
    let written = lease.set_payload(mongodb::bson::doc! { "x": 1 }).await;
    assert!(
        matches!(written, Err(Error::LeaseLost { .. })),
        "{written:?}"
    );
    assert_eq!(reason_of(&lease).await, LossReason::Deleted);
}

#[tokio::test(start_paused = true)]
async fn force_release_by_this_manager_or_another_is_lost_force_released() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let mine = a.acquire("mine").await.unwrap();
    let theirs = a.acquire("theirs").await.unwrap();
    a.force_release("mine").await.unwrap().expect("was held");
    assert_eq!(mine.status().lost_reason(), Some(LossReason::ForceReleased));
    b.force_release("theirs").await.unwrap().expect("was held");
    assert_eq!(reason_of(&theirs).await, LossReason::ForceReleased);
}

#[tokio::test(start_paused = true)]
async fn release_release_all_and_shutdown_end_leases_released_or_shutdown() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let released = a.acquire("released").await.unwrap();
    let mut released_events = released.status().events();
    let token = released.status().cancellation_token();
    assert_eq!(released.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(token.is_cancelled());
    assert_ends_lost(&mut released_events, LossReason::Released).await;

    let all = a.acquire("all").await.unwrap();
    a.release_all().await.unwrap();
    assert_eq!(reason_of(&all).await, LossReason::Released);

    let last = a.acquire("last").await.unwrap();
    a.shutdown().await.unwrap();
    assert_eq!(reason_of(&last).await, LossReason::Shutdown);
    let mut late = last.status().events();
    assert_ends_lost(&mut late, LossReason::Shutdown).await;
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_falls_behind_misses_old_events_but_never_the_loss() {
    let db = MemoryDb::new();
    let (a, _, t0) = start(&db, "a");
    let lease = a.acquire("k").await.unwrap();
    let mut events = lease.status().events();
    let renewals = LEASE_EVENTS_CAPACITY as u32 + 4;
    sleep_until(t0 + HEARTBEAT * renewals + HEARTBEAT / 2).await;
    db.delete("k");
    soon(lease.status().lost()).await;
    let mut seen = Vec::new();
    while let Some(event) = soon(events.recv()).await {
        seen.push(event);
    }
    assert_eq!(
        seen.len(),
        LEASE_EVENTS_CAPACITY,
        "the latest ones: {seen:?}"
    );
    assert_eq!(seen.last(), Some(&LeaseEvent::Lost(LossReason::Deleted)));
    assert!(matches!(
        seen[seen.len() - 2],
        LeaseEvent::Renewed { deadline, .. } if deadline == t0 + HEARTBEAT * renewals + VALIDITY
    ));
}

#[tokio::test(start_paused = true)]
async fn leadership_and_its_context_share_the_lease_s_reason_and_events() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let election = Election::new(&a, "leader").unwrap();
    let leadership = election.campaign().await.unwrap();
    let context = leadership.context();
    let mut events = context.status().events();
    db.delete("leader");
    soon(context.status().lost()).await;
    assert_eq!(context.status().lost_reason(), Some(LossReason::Deleted));
    assert_eq!(leadership.status().lost_reason(), Some(LossReason::Deleted));
    assert!(leadership.status().is_lost() && context.status().is_lost());
    assert_ends_lost(&mut events, LossReason::Deleted).await;
}

/// The real clock, and a lease short enough to wait out: the paused clock
/// moves only when the test yields to the runtime, which would let the
/// actor run.
fn short_timing() -> Timing {
    Timing {
        ttl: Duration::from_millis(300),
        heartbeat_interval: Duration::from_millis(100),
        safety_margin: Duration::from_millis(30),
        ..timing()
    }
}

#[tokio::test]
async fn is_lost_reads_true_past_the_deadline_while_the_actor_cannot_run() {
    let db = MemoryDb::new();
    let timing = short_timing();
    let store = db.store("a", timing.ttl);
    let a = LeaseManager::start(Arc::new(store), "a".into(), timing);
    let lease = a.acquire("k").await.unwrap();
    let deadline = lease.status().deadline().expect("held");
    // This single-threaded runtime runs the actor too: while this thread
    // sleeps, the actor cannot run (no heartbeat, no deadline timer).
    std::thread::sleep(deadline.saturating_duration_since(Instant::now()) + 10 * MS);
    assert!(
        lease.status().is_lost(),
        "past the deadline, read without the actor"
    );
    assert!(
        !lease.status().cancellation_token().is_cancelled(),
        "the actor has not run since"
    );
    assert_eq!(lease.status().lost_reason(), Some(LossReason::Expired));
    // Once it runs, it fires the token, and a late renewal cannot revive it.
    soon(lease.status().lost()).await;
    assert_eq!(lease.status().lost_reason(), Some(LossReason::Expired));
    assert!(lease.status().is_lost());
    a.shutdown().await.unwrap();
}

/// A holder with no stream of writes open (it merely holds) reads the
/// requests to release its followed leases at the heartbeat: told once, at
/// the next tick, not again at the ticks after.
#[tokio::test(start_paused = true)]
async fn by_default_a_release_request_is_told_at_the_next_heartbeat_once() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let lease = a.acquire("k").await.unwrap();
    let mut events = lease.status().events();
    sleep_until(t0 + HEARTBEAT / 2).await;
    assert_eq!(db.release_watchers(), 0, "merely holding: no stream");
    let reads_before = store.calls(Op::RequestRelease);
    assert!(b.request_release("k").await.unwrap());
    // Renewals go on meanwhile; a minute of paused time turns a request
    // never told into a failure.
    let by = soon(async {
        loop {
            match events.recv().await {
                Some(LeaseEvent::RevocationRequested { by }) => break by,
                Some(LeaseEvent::Renewed { .. }) => {}
                other => panic!("{other:?}"),
            }
        }
    })
    .await;
    assert_eq!(by, "b");
    assert_eq!(Instant::now(), t0 + HEARTBEAT, "read at the next tick");
    assert_eq!(store.calls(Op::RequestRelease), reads_before + 1);
    sleep_until(t0 + HEARTBEAT * 3 + HEARTBEAT / 2).await;
    assert_eq!(
        store.calls(Op::RequestRelease),
        reads_before + 1,
        "told: not read again"
    );
    while let Some(Some(event)) = futures::FutureExt::now_or_never(events.recv()) {
        assert!(matches!(event, LeaseEvent::Renewed { .. }), "{event:?}");
    }
    assert!(!lease.status().is_lost());
}

/// With `watch_held_leases`, the request is announced by the stream: told
/// at once, and the heartbeat reads nothing.
#[tokio::test(start_paused = true)]
async fn watching_held_leases_a_release_request_is_told_at_once() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let (b, _, _) = start(&db, "b");
    let lease = a.acquire("k").await.unwrap();
    let mut events = lease.status().events();
    sleep_until(t0 + HEARTBEAT / 2).await;
    assert!(b.request_release("k").await.unwrap());
    match next(&mut events).await {
        LeaseEvent::RevocationRequested { by } => assert_eq!(by, "b"),
        other => panic!("{other:?}"),
    }
    assert_eq!(Instant::now(), t0 + HEARTBEAT / 2, "at once");
    sleep_until(t0 + HEARTBEAT * 2 + HEARTBEAT / 2).await;
    assert_eq!(
        store.calls(Op::RequestRelease),
        1,
        "one read, of the stream's opening; none at the heartbeat"
    );
}
