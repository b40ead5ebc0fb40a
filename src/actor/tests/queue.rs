//! The queue of waiting owners across managers ("Queue of waiting owners"
//! in `store`): arrival order, the handoff announced by the change stream
//! and confirmed in one attempt without the wake jitter, polling without a
//! change stream, and registrations kept live while a manager waits.

use super::*;
use crate::store::KeyWrite;

/// The owner ids registered in the queue of `key`, in order.
fn queued(db: &MemoryDb, key: &str) -> Vec<String> {
    let now = Instant::now();
    db.doc(key).map_or_else(Vec::new, |doc| {
        doc.live_queue(now).map(|w| w.owner.clone()).collect()
    })
}

/// The renew calls of `store` from `since` on that name `key`, with when
/// they were sent.
fn renewals_of(store: &MemoryStore, key: &str, since: Instant) -> Vec<Instant> {
    let key = LeaseKey::from(key);
    store
        .calls_of(Op::Renew)
        .into_iter()
        .filter(|c| c.at >= since && c.keys.contains(&key))
        .map(|c| c.at)
        .collect()
}

/// Two managers on one twin: `a` holds "k" (`first`), `b` (store `sb`)
/// waits for it (`wb`), registered in the key's queue.
struct Queued {
    db: MemoryDb,
    a: LeaseManager,
    b: LeaseManager,
    sb: MemoryStore,
    first: Lease,
    wb: JoinHandle<Result<(Instant, Lease)>>,
}

async fn a_holds_b_queued() -> Queued {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    Queued {
        db,
        a,
        b,
        sb,
        first,
        wb,
    }
}

/// Three managers on one twin: `a` holds "k" (`first`); `b` (store `sb`),
/// then `c` (store `sc`), wait for it (`wb`, `wc`), registered in that
/// order.
struct TwoQueued {
    db: MemoryDb,
    a: LeaseManager,
    b: LeaseManager,
    c: LeaseManager,
    sb: MemoryStore,
    sc: MemoryStore,
    first: Lease,
    wb: JoinHandle<Result<(Instant, Lease)>>,
    wc: JoinHandle<Result<(Instant, Lease)>>,
}

async fn a_holds_b_then_c_queued() -> TwoQueued {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start(&db, "b");
    let (c, sc, _) = start(&db, "c");
    let first = a.acquire("k").await.unwrap();
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    let wc = waiter(&c, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 2)).await;
    TwoQueued {
        db,
        a,
        b,
        c,
        sb,
        sc,
        first,
        wb,
        wc,
    }
}

/// A task waiting for a lease ([`waiter`]).
type Waiting = JoinHandle<Result<(Instant, Lease)>>;

/// Releases `lease`, then each lease the `waiters` are handed in turn,
/// checking that each heard its handoff on the event, at once.
async fn handed_on_at_once<const N: usize>(mut lease: Lease, waiters: [(&str, Waiting); N]) {
    for (name, waiter) in waiters {
        let released = Instant::now();
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
        let (at, next) = soon(waiter).await.unwrap().unwrap();
        assert_eq!(at, released, "{name} heard the handoff at once");
        lease = next;
    }
}

#[tokio::test(start_paused = true)]
async fn waiting_managers_are_handed_the_key_in_arrival_order_each_granted_on_the_event() {
    let TwoQueued {
        db,
        a: _a,
        b: _b,
        c: _c,
        sb,
        sc,
        first,
        wb,
        wc,
    } = a_holds_b_then_c_queued().await;
    // Both streams of writes are open (their retries at the opening done).
    sleep(RELEASE_WAKE_JITTER + MS).await;
    assert_eq!(queued(&db, "k"), ["b", "c"]);

    let (b_calls, c_calls) = (sb.acquire_calls("k").len(), sc.acquire_calls("k").len());
    let first_token = first.fencing_token();
    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (b_at, lb) = soon(wb).await.unwrap().unwrap();
    assert_eq!(b_at, released_at, "granted on the event: no wake jitter");
    assert_eq!(
        sb.acquire_calls("k").len(),
        b_calls,
        "no attempt after the release: granted on the event"
    );
    assert_eq!(
        lb.fencing_token(),
        db.doc("k").unwrap().token,
        "the handed token"
    );
    assert!(lb.fencing_token() > first_token);
    // Its renewal, at once, sets its expiry to its TTL (the handoff wrote
    // only the registration's `hx`).
    soon(db.changed_until("k", |d| d.exp >= released_at + TTL)).await;
    assert_eq!(renewals_of(&sb, "k", released_at), [released_at]);
    assert!(!wc.is_finished(), "c came second");
    assert_eq!(queued(&db, "k"), ["c"]);

    let c_before = sc.acquire_calls("k").len();
    assert!(c_before >= c_calls);
    let b_token = lb.fencing_token();
    let released_at = Instant::now();
    assert_eq!(lb.release().await.unwrap(), ReleaseOutcome::Released);
    let (c_at, lc) = soon(wc).await.unwrap().unwrap();
    assert_eq!(c_at, released_at);
    assert_eq!(sc.acquire_calls("k").len(), c_before);
    assert!(lc.fencing_token() > b_token);
    assert!(queued(&db, "k").is_empty());
    assert_eq!(lc.release().await.unwrap(), ReleaseOutcome::Released);
}

#[tokio::test(start_paused = true)]
async fn a_handoff_event_no_later_than_the_registration_is_confirmed_by_an_attempt() {
    let Queued {
        db,
        a: _a,
        b: _b,
        sb,
        first,
        wb,
    } = a_holds_b_queued().await;
    sleep(RELEASE_WAKE_JITTER + MS).await;
    let registered = db.doc("k").unwrap().queue[0].lease_id;

    // An event showing b's registered lease id with a token no greater
    // than the one b's registration found: it may predate that attempt
    // (e.g. a stream far behind), so b checks with an attempt, which finds
    // a still holding the key, and keeps waiting.
    let calls = sb.acquire_calls("k").len();
    db.announce(KeyWrite {
        key: "k".into(),
        freed: false,
        lease_id: Some(registered),
        owner: Some("b".into()),
        token: Some(first.fencing_token()),
    });
    soon(async {
        while sb.acquire_calls("k").len() == calls {
            tokio::task::yield_now().await;
        }
    })
    .await;
    sleep(MS).await;
    assert!(!wb.is_finished(), "not granted on an old event");
    assert_eq!(db.holder("k").as_deref(), Some("a"));
    assert_eq!(queued(&db, "k"), ["b"], "still registered");

    // The real handoff is granted on its event.
    let calls = sb.acquire_calls("k").len();
    let first_token = first.fencing_token();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (_, lb) = soon(wb).await.unwrap().unwrap();
    assert_eq!(sb.acquire_calls("k").len(), calls);
    assert!(lb.fencing_token() > first_token);
}

#[tokio::test(start_paused = true)]
async fn a_handoff_too_late_for_its_registration_is_confirmed_by_an_attempt() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    // Its refreshes are seconds apart (its `retry_max` is 10 s).
    let (b, sb) = start_slow_polls(&db, "b");
    let first = a.acquire("k").await.unwrap();
    // A waiter whose lease, granted on the event, would be safe until 1.1 s
    // after its registering attempt was sent (TTL 1.4 s − safety margin
    // 0.3 s).
    let ttl = HEARTBEAT + SAFETY_MARGIN + Duration::from_millis(100);
    let wb = started({
        let b = b.clone();
        async move { b.acquire("k").ttl(ttl).await }
    })
    .await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    // Its stream of writes is open (its retry at the opening done).
    sleep(RELEASE_WAKE_JITTER + MS).await;
    let registered_at = *sb.acquire_calls("k").last().unwrap();
    let calls = sb.acquire_calls("k").len();
    sleep_until(registered_at + ttl - SAFETY_MARGIN + Duration::from_millis(100)).await;
    assert_eq!(sb.acquire_calls("k").len(), calls, "no refresh meanwhile");
    let first_token = first.fencing_token();
    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let lb = soon(wb).await.unwrap().unwrap();
    assert_eq!(
        sb.acquire_calls("k")[calls..],
        [released_at],
        "confirmed by one attempt, at once"
    );
    assert!(lb.fencing_token() > first_token);
}

#[tokio::test(start_paused = true)]
async fn a_handoff_while_round_trips_are_slow_is_confirmed_by_an_attempt() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start(&db, "b");
    // b's attempts take 300 ms: a lease granted on the event would have
    // less than ten of them (3 s) before its deadline (2.7 s after the
    // registering attempt's send at most), so b confirms it instead.
    let slow = Duration::from_millis(300);
    sb.set_latency(Op::Acquire, slow);
    let first = a.acquire("k").await.unwrap();
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    // The retry at its stream's opening, answered.
    soon(async {
        while sb.acquire_calls("k").len() < 2 {
            sleep(MS).await;
        }
    })
    .await;
    sleep(slow + MS).await;
    let calls = sb.acquire_calls("k").len();
    let first_token = first.fencing_token();
    let released_at = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (b_at, lb) = soon(wb).await.unwrap().unwrap();
    assert_eq!(
        sb.acquire_calls("k")[calls..],
        [released_at],
        "confirmed by one attempt, at once"
    );
    assert_eq!(b_at, released_at + slow);
    assert!(lb.fencing_token() > first_token);
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
    let window = crate::store::registration_window(RETRY_MAX, Duration::ZERO);
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
async fn a_waiter_with_a_minimum_hold_leaves_the_queue_at_shutdown_too() {
    // Its waiting attempt registers like any exclusive one: a manager that
    // stops must leave that queue, or a release hands the key to nobody.
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let wb = started({
        let b = b.clone();
        async move {
            b.acquire("k")
                .hold_at_least(Duration::from_millis(500))
                .await
        }
    })
    .await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    assert_eq!(queued(&db, "k"), ["b"]);

    b.shutdown().await.unwrap();
    assert!(matches!(soon(wb).await.unwrap(), Err(Error::Shutdown)));
    assert_eq!(sb.calls(Op::LeaveQueues), 1, "one write leaves b's queues");
    assert!(queued(&db, "k").is_empty(), "b left");
    // The release frees the key: nothing is handed to the stopped b.
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(db.doc("k").expect("a document").lease_id, None);
}

#[tokio::test(start_paused = true)]
async fn a_registration_whose_outcome_is_unknown_is_left_at_shutdown_too() {
    // b's waiting attempt registers, but its reply and its re-read's are
    // lost: b cannot tell it registered, so it must leave the queue at
    // shutdown all the same, or a release hands the key to nobody.
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start(&db, "b");
    let first = a.acquire("k").await.unwrap();
    sb.fault_next(Op::Acquire, Fault::FailAfterApply, 2);
    sb.fail_next(Op::Inspect, 1);
    sb.set_latency(Op::Acquire, Duration::from_secs(5));
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    assert_eq!(queued(&db, "k"), ["b"]);

    b.shutdown().await.unwrap();
    assert!(matches!(soon(wb).await.unwrap(), Err(Error::Shutdown)));
    assert!(queued(&db, "k").is_empty(), "b left");
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(db.doc("k").expect("a document").lease_id, None);
}

#[tokio::test(start_paused = true)]
async fn a_key_handed_to_a_manager_as_it_shuts_down_is_released_by_its_shutdown() {
    let Queued {
        db,
        a,
        b,
        sb,
        first,
        wb,
    } = a_holds_b_queued().await;
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

#[tokio::test(start_paused = true)]
async fn a_handed_key_that_only_a_re_read_shows_is_granted_after_a_write_renews_it() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, sb, _) = start_without_change_streams(&db, "b");
    let first = a.acquire("k").await.unwrap();
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |d| d.queue.len() == 1)).await;
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let handed = db.doc("k").unwrap();
    assert_eq!(handed.owner, "b", "handed in the release");
    // b's confirming attempt fails before applying, sent again too; its
    // re-read finds the handed lease (b's owner id and lease id), which
    // lasts only `hx` from the handoff.
    sb.fail_next(Op::Acquire, 2);
    let calls = sb.acquire_calls("k").len();
    let (_, lb) = soon(wb).await.unwrap().unwrap();
    let sent = sb.acquire_calls("k");
    assert_eq!(
        sent.len(),
        calls + 3,
        "the read is confirmed by a write: {sent:?}"
    );
    assert_eq!(sent[calls + 2], sent[calls], "retried at once");
    assert_eq!(lb.fencing_token(), handed.token, "the handed lease");
    assert_eq!(lb.status().deadline(), Some(sent[calls + 2] + VALIDITY));
    let doc = db.doc("k").unwrap();
    assert!(
        lb.status().deadline().unwrap() <= doc.exp,
        "the local deadline is within the server's expiry"
    );
}

#[tokio::test(start_paused = true)]
async fn a_waiter_behind_another_in_a_quiet_queue_keeps_no_stream_until_it_is_next() {
    let TwoQueued {
        db,
        a: _a,
        b: _b,
        c: _c,
        first,
        wb,
        wc,
        ..
    } = a_holds_b_then_c_queued().await;
    settle().await;
    assert_eq!(db.release_watchers(), 2, "each waiter opens its stream");

    // c's refresh finds b ahead of it and the key's token unchanged: c
    // stops reading its stream (the `getMore` it had sent waits on), and a
    // heartbeat a whole interval later closes it; b, next, keeps its own.
    sleep(RETRY_MAX + 2 * HEARTBEAT).await;
    assert_eq!(db.release_watchers(), 1, "the head of the queue alone");
    assert_eq!(db.release_readers(), 1);
    assert_eq!(queued(&db, "k"), ["b", "c"]);

    // a's release hands the key to b, granted on the event.
    let released = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, second) = soon(wb).await.unwrap().unwrap();
    assert_eq!(at, released, "b heard the handoff at once");

    // c's next attempt finds itself next and opens its stream again, so
    // b's release hands the key to c on the event too.
    sleep(RETRY_MAX + HEARTBEAT).await;
    settle().await;
    let released = Instant::now();
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, _third) = soon(wc).await.unwrap().unwrap();
    assert_eq!(at, released, "c heard the handoff at once");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_behind_another_reopens_its_stream_when_the_key_changes_hands() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let (c, _, _) = start(&db, "c");
    let (d, sd, _) = start(&db, "d");
    let first = a.acquire("k").await.unwrap();
    // c also waits for a key it is next for, so its stream stays open and
    // it hears its handoff of "k" at once wherever it is in that queue.
    let _k2 = a.acquire("k2").await.unwrap();
    let _c2 = waiter(&c, "k2").await;
    let mut waiting = Vec::new();
    for (i, manager) in [&b, &c, &d].into_iter().enumerate() {
        waiting.push(waiter(manager, "k").await);
        soon(db.changed_until("k", |doc| doc.queue.len() == i + 1)).await;
    }
    let [wb, wc, wd] = <[_; 3]>::try_from(waiting).ok().unwrap();
    sleep(RETRY_MAX + 2 * HEARTBEAT).await;
    assert_eq!(
        db.release_watchers(),
        2,
        "b, next for k, and c, next for k2; d behind both in a quiet queue"
    );

    // a's release hands "k" to b: the token changes, so d's next attempt,
    // c still ahead of it, opens d's stream again.
    let released = Instant::now();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (_, second) = soon(wb).await.unwrap().unwrap();
    soon(async {
        while !sd
            .calls_of(Op::Acquire)
            .iter()
            .any(|call| call.at > released)
        {
            sleep(MS).await;
        }
    })
    .await;
    settle().await;
    // Two quick handoffs, to c and then to d, each heard on the event.
    handed_on_at_once(second, [("c", wc), ("d", wd)]).await;
}

/// A manager with a queue bound of `bound` ("Bound" in "Queue of waiting
/// owners"), as [`start`].
fn start_bounded(db: &MemoryDb, owner: &str, bound: usize) -> (LeaseManager, MemoryStore) {
    let store = db.store(owner, TTL).with_queue_bound(bound);
    let manager = LeaseManager::start(Arc::new(store.clone()), owner.into(), timing());
    (manager, store)
}

#[tokio::test(start_paused = true)]
async fn a_waiter_beyond_a_full_queue_reads_no_stream_until_it_registers() {
    let db = MemoryDb::new();
    let [(a, _), (b, _), (c, _), (d, sd)] =
        ["a", "b", "c", "d"].map(|owner| start_bounded(&db, owner, 2));
    let first = a.acquire("k").await.unwrap();
    let mut waiting = Vec::new();
    for (i, manager) in [&b, &c].into_iter().enumerate() {
        waiting.push(waiter(manager, "k").await);
        soon(db.changed_until("k", |doc| doc.queue.len() == i + 1)).await;
    }
    let [wb, wc] = <[_; 2]>::try_from(waiting).ok().unwrap();
    sleep(RELEASE_WAKE_JITTER + MS).await;
    assert_eq!(db.release_readers(), 2, "b and c, registered, read theirs");

    // d finds the queue full: it opens no stream, and its refreshes poll.
    let wd = waiter(&d, "k").await;
    sleep(RELEASE_WAKE_JITTER + MS).await;
    assert_eq!(queued(&db, "k"), ["b", "c"]);
    assert_eq!(db.release_watchers(), 2, "d beyond the queue opens none");
    assert_eq!(db.release_readers(), 2);

    // a's release hands the key to b; d's next refresh finds room,
    // registers and reads its stream again.
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (_, second) = soon(wb).await.unwrap().unwrap();
    let d_calls = sd.acquire_calls("k").len();
    sleep(RETRY_MAX + MS).await;
    assert!(sd.acquire_calls("k").len() > d_calls);
    assert_eq!(queued(&db, "k"), ["c", "d"]);
    settle().await;
    assert_eq!(db.release_readers(), 2, "c and d read theirs; b holds");

    // Two quick handoffs, to c and then to d, each heard on the event.
    handed_on_at_once(second, [("c", wc), ("d", wd)]).await;
}

#[tokio::test(start_paused = true)]
async fn a_quiet_waiter_stops_reading_its_stream_and_reads_it_again_with_nothing_missed() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    // c's heartbeat is far off: what stops its stream before then is the
    // answer that finds its key quiet.
    let slow = Timing {
        ttl: Duration::from_secs(60),
        heartbeat_interval: Duration::from_secs(30),
        ..timing()
    };
    let sc = db.store("c", Duration::from_secs(60));
    let c = LeaseManager::start(Arc::new(sc.clone()), "c".into(), slow);
    let first = a.acquire("k").await.unwrap();
    let wb = waiter(&b, "k").await;
    soon(db.changed_until("k", |doc| doc.queue.len() == 1)).await;
    let wc = waiter(&c, "k").await;
    soon(db.changed_until("k", |doc| doc.queue.len() == 2)).await;
    sleep(RELEASE_WAKE_JITTER + MS).await;
    assert_eq!(db.release_readers(), 2);

    // c's refresh finds b ahead of it and the key's token unchanged: c
    // stops reading its stream, whose last `getMore` waits on at most
    // `RELEASE_EVENTS_AWAIT`; the stream stays open.
    sleep(2 * RETRY_MAX + crate::store::RELEASE_EVENTS_AWAIT).await;
    assert_eq!(db.release_readers(), 1, "b, next, alone reads its stream");
    assert_eq!(db.release_watchers(), 2, "c's stream is paused, not closed");

    // a's release hands the key to b. c's next refresh finds itself next
    // and reads its stream again, opening none; b's release hands the key
    // to c on the event.
    let opened = db.release_streams_opened();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let (_, second) = soon(wb).await.unwrap().unwrap();
    sleep(RETRY_MAX + MS).await;
    settle().await;
    assert_eq!(db.release_readers(), 1, "c reads again; b holds");
    assert_eq!(db.release_streams_opened(), opened);
    let released = Instant::now();
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, _third) = soon(wc).await.unwrap().unwrap();
    assert_eq!(at, released, "c heard the handoff at once");
}
