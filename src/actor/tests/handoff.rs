//! Handoff to a local waiter (`src/actor/handoff.rs`): one store call per
//! handoff, FIFO, cancel safety, a lost lease, the yield to another owner,
//! shutdown during a handoff, and an unknown outcome.

use super::*;

/// The latency of each handoff in these tests.
const LATENCY: Duration = Duration::from_millis(5);

#[tokio::test(start_paused = true)]
async fn a_release_with_a_local_waiter_hands_the_key_over_in_one_store_call() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    sa.set_latency(Op::Handoff, LATENCY);
    let first = a.acquire("k").await.unwrap();
    let (t1, lost) = (first.fencing_token(), first.status().cancellation_token());
    let local = waiter(&a, "k").await;

    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(
        Instant::now(),
        released_at + LATENCY,
        "confirmed by the write"
    );
    let (granted_at, second) = soon(local).await.unwrap().unwrap();
    assert_eq!(granted_at, released_at + LATENCY, "one round trip");
    assert!(second.fencing_token() > t1);
    assert!(lost.is_cancelled() && !second.status().is_lost());
    assert_eq!(sa.calls(Op::Handoff), 1);
    assert_eq!(sa.calls(Op::Release), 0);
    assert_eq!(sa.calls(Op::Acquire), 1, "only the first acquisition");
    let doc = db.doc("k").unwrap();
    assert_eq!(doc.lease_id, Some(second.lease_id()));
    assert_eq!(doc.token, second.fencing_token());

    // The handed-over lease renews and releases as any other.
    sleep(2 * HEARTBEAT).await;
    assert!(!second.status().is_lost());
    assert!(sa.calls(Op::Renew) >= 1);
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(sa.calls(Op::Release), 1, "nobody waits: a plain release");
    assert_released(&db, "k");
}

#[tokio::test(start_paused = true)]
async fn eight_local_waiters_are_served_first_in_first_out_by_handoffs() {
    const HOLD: Duration = Duration::from_millis(1);
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    sa.set_latency(Op::Handoff, LATENCY);
    let grants = contend(&a, "k", 8, HOLD).await;
    let order: Vec<usize> = grants.iter().map(|g| g.0).collect();
    assert_eq!(
        order,
        (0..8).collect::<Vec<_>>(),
        "first come, first served"
    );
    for pair in grants.windows(2) {
        assert_eq!(pair[1].1 - pair[0].1, HOLD + LATENCY, "one round trip");
        assert!(pair[1].2 > pair[0].2, "fencing tokens increase");
    }
    assert_eq!(sa.calls(Op::Acquire), 1);
    assert_eq!(sa.calls(Op::Handoff), 7, "one store call per handoff");
    assert_eq!(sa.calls(Op::Release), 1, "the last one, nobody waiting");
    assert_eq!(sa.max_acquires_in_flight_per_key(), 1);
    assert_released(&db, "k");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_gone_during_its_handoff_leaves_no_lease_behind() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    sa.set_latency(Op::Handoff, LATENCY);
    let first = a.acquire("k").await.unwrap();
    let local = waiter(&a, "k").await;
    let release = started(first.release()).await;
    settle().await;
    assert_eq!(sa.in_flight(Op::Handoff), 1);
    local.abort();
    assert_eq!(
        soon(release).await.unwrap().unwrap(),
        ReleaseOutcome::Released
    );
    // The lease handed to nobody is given back at once.
    soon(db.changed_until("k", |d| d.lease_id.is_none())).await;
    assert_eq!(sa.calls(Op::Release), 1);
    assert_released(&db, "k");
    let again = soon(a.acquire("k")).await.unwrap();
    assert_eq!(db.doc("k").unwrap().lease_id, Some(again.lease_id()));
}

#[tokio::test(start_paused = true)]
async fn a_handoff_of_a_lost_lease_answers_already_lost_and_the_waiter_acquires() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    let first = a.acquire("k").await.unwrap();
    let t1 = first.fencing_token();
    let local = waiter(&a, "k").await;
    // Expired on the server, not yet noticed locally.
    db.expire("k");
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
    let (_, second) = soon(local).await.unwrap().unwrap();
    assert!(second.fencing_token() > t1);
    assert_eq!(sa.calls(Op::Handoff), 1);
    assert_eq!(sa.calls(Op::Acquire), 2, "the waiter's own acquisition");
    assert_eq!(db.doc("k").unwrap().lease_id, Some(second.lease_id()));
}

#[tokio::test(start_paused = true)]
async fn a_handoff_yields_to_another_owner_that_waits() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let t1 = first.fencing_token();
    let remote = waiter(&b, "k").await;
    let local = waiter(&a, "k").await;
    soon(db.changed_until("k", |d| d.waiting_since.is_some())).await;

    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(sa.calls(Op::Handoff), 1);
    let (remote_at, remote_lease) = soon(remote).await.unwrap().unwrap();
    assert!(remote_at - released_at <= RELEASE_WAKE_JITTER);
    assert!(remote_lease.fencing_token() > t1);
    assert!(!local.is_finished(), "the releasing manager kept it");
    assert_eq!(db.holder("k").as_deref(), Some("b"));
    assert_eq!(
        remote_lease.release().await.unwrap(),
        ReleaseOutcome::Released
    );
    soon(local).await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn shutdown_during_a_handoff_gives_the_handed_over_lease_back() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    sa.set_latency(Op::Handoff, LATENCY);
    let first = a.acquire("k").await.unwrap();
    let local = waiter(&a, "k").await;
    let release = started(first.release()).await;
    settle().await;
    assert_eq!(sa.in_flight(Op::Handoff), 1);
    let shutdown = {
        let a = a.clone();
        started(async move { a.shutdown().await }).await
    };
    assert_shutdown(soon(local).await.unwrap());
    assert_eq!(
        soon(release).await.unwrap().unwrap(),
        ReleaseOutcome::Released
    );
    soon(shutdown).await.unwrap().unwrap();
    assert_eq!(sa.calls(Op::Handoff), 1);
    assert_released(&db, "k");
}

#[tokio::test(start_paused = true)]
async fn a_handoff_whose_outcome_is_unknown_is_recognised_by_the_waiters_retry() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    let first = a.acquire("k").await.unwrap();
    let t1 = first.fencing_token();
    let local = waiter(&a, "k").await;
    sa.fault_next(Op::Handoff, Fault::FailAfterApply, 1);
    let reply = first.release().await;
    assert!(reply.as_ref().is_err_and(|e| e.is_transient()), "{reply:?}");
    let (_, second) = soon(local).await.unwrap().unwrap();
    assert_eq!(sa.calls(Op::Handoff), 1);
    assert_eq!(sa.calls(Op::Acquire), 2, "a retry under the handed-over id");
    let doc = db.doc("k").unwrap();
    assert_eq!(doc.lease_id, Some(second.lease_id()));
    assert_eq!(doc.token, second.fencing_token(), "the handoff's own token");
    assert!(second.fencing_token() > t1);
}
