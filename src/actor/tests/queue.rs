//! The queue of waiting owners across managers ("Queue of waiting owners"
//! in `store`): arrival order, the handoff announced by the change stream
//! and confirmed in one attempt without the wake jitter, polling without a
//! change stream, and registrations kept live while a manager waits.

use super::*;

/// The owner ids registered in the queue of `key`, in order.
fn queued(db: &MemoryDb, key: &str) -> Vec<String> {
    let now = Instant::now();
    db.doc(key).map_or_else(Vec::new, |doc| {
        doc.live_queue(now).map(|w| w.owner.clone()).collect()
    })
}

#[tokio::test(start_paused = true)]
async fn waiting_managers_are_handed_the_key_in_arrival_order_each_confirmed_in_one_attempt() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start(&db, "b");
    let (c, sc, _) = start(&db, "c");
    let first = a.acquire("k").await.unwrap();
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    let wc = waiter(&c, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 2)).await;
    // Both streams of writes are open (their retries at the opening done).
    sleep(RELEASE_WAKE_JITTER + MS).await;
    assert_eq!(queued(&db, "k"), ["b", "c"]);

    let (b_calls, c_calls) = (sb.acquire_calls("k").len(), sc.acquire_calls("k").len());
    let first_token = first.fencing_token();
    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (b_at, lb) = soon(wb).await.unwrap().unwrap();
    assert!(
        b_at - released_at <= MS,
        "confirmed {:?} after the handoff: no wake jitter",
        b_at - released_at
    );
    assert_eq!(
        sb.acquire_calls("k").len(),
        b_calls + 1,
        "one attempt after the release: the confirmation"
    );
    assert!(lb.fencing_token() > first_token);
    assert!(!wc.is_finished(), "c came second");
    assert_eq!(queued(&db, "k"), ["c"]);

    let c_before = sc.acquire_calls("k").len();
    assert!(c_before >= c_calls);
    let b_token = lb.fencing_token();
    let released_at = Instant::now();
    assert_eq!(lb.release().await.unwrap(), ReleaseOutcome::Released);
    let (c_at, lc) = soon(wc).await.unwrap().unwrap();
    assert!(c_at - released_at <= MS, "{:?}", c_at - released_at);
    assert_eq!(sc.acquire_calls("k").len(), c_before + 1);
    assert!(lc.fencing_token() > b_token);
    assert!(queued(&db, "k").is_empty());
}

#[tokio::test(start_paused = true)]
async fn without_change_streams_a_handed_key_is_confirmed_at_the_next_poll() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start_without_change_streams(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    // Far from the handed lease's end (the registration window, 3 s).
    sleep(Duration::from_millis(100)).await;
    let first_token = first.fencing_token();
    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(
        db.holder("k").as_deref(),
        Some("b"),
        "handed in the release"
    );
    let calls = sb.acquire_calls("k").len();
    let (b_at, lb) = soon(wb).await.unwrap().unwrap();
    assert!(
        b_at - released_at <= RETRY_MAX + RETRY_INITIAL,
        "confirmed at its next poll: {:?} after the release",
        b_at - released_at
    );
    assert_eq!(sb.acquire_calls("k").len(), calls + 1);
    assert!(lb.fencing_token() > first_token);
}

#[tokio::test(start_paused = true)]
async fn a_registration_stays_live_while_its_manager_waits_longer_than_the_window() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    let window = crate::store::registration_window(RETRY_MAX);
    // Several windows, checked every half window: b keeps its place.
    for _ in 0..8 {
        sleep(window / 2).await;
        assert_eq!(queued(&db, "k"), ["b"]);
    }
    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (b_at, _) = soon(wb).await.unwrap().unwrap();
    assert!(b_at - released_at <= MS, "{:?}", b_at - released_at);
}

#[tokio::test(start_paused = true)]
async fn a_manager_that_shuts_down_while_registered_leaves_the_queue_and_is_never_handed_the_key() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start(&db, "b");
    let (c, _, _) = start(&db, "c");
    let first = a.acquire("k").await.unwrap();
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    let wc = waiter(&c, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 2)).await;
    assert_eq!(queued(&db, "k"), ["b", "c"]);

    b.shutdown().await.unwrap();
    assert!(matches!(soon(wb).await.unwrap(), Err(Error::Shutdown)));
    assert_eq!(sb.calls(Op::LeaveQueues), 1, "one write leaves b's queues");
    assert_eq!(
        sb.calls(Op::Release),
        0,
        "its entry was still there: nothing was handed to b, nothing to release"
    );
    assert_eq!(queued(&db, "k"), ["c"], "b left, c keeps its place");

    // The release hands the key to c, the next registered owner, not to
    // the stopped b (which would hold it, unconfirmed, until it expired).
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (_, lc) = soon(wc).await.unwrap().unwrap();
    assert_eq!(db.holder("k").as_deref(), Some("c"));
    assert_eq!(lc.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(start_paused = true)]
async fn a_key_handed_to_a_manager_as_it_shuts_down_is_released_by_its_shutdown() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    // b's leave is slow: a's release lands first and hands b the key.
    sb.set_latency(Op::LeaveQueues, Duration::from_millis(50));
    let shutdown = tokio::spawn({
        let b = b.clone();
        async move { b.shutdown().await }
    });
    assert!(matches!(soon(wb).await.unwrap(), Err(Error::Shutdown)));
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(
        db.holder("k").as_deref(),
        Some("b"),
        "handed to b's registration"
    );
    soon(shutdown).await.unwrap().unwrap();
    let doc = db.doc("k").expect("the lock document");
    assert!(
        doc.lease_id.is_none(),
        "b's shutdown released the key handed to it: {doc:?}"
    );
    assert!(a.try_acquire("k").await.unwrap().is_some(), "free at once");
}
