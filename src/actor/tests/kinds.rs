//! Kinds of lease (`src/actor/acquire.rs`, `KeyState::admits`): permits of
//! a semaphore held by one manager's tasks and by several managers, shared
//! waiters served one after another, an exclusive waiter among shared
//! holders (local FIFO, and the waiting mark across managers), kind
//! mismatches, one renewal call for every kind, the loss of one permit,
//! `hold_at_least`, and the change-stream wake-up of a permit waiter.

use tokio_util::time::FutureExt as _;

use super::*;
use crate::semaphore::Semaphore;
use crate::store::memory::Doc;
use crate::{kind::LeaseKind, kind::PermitsChange};

/// A semaphore of `n` permits on `key`, acquired through `manager`.
fn semaphore(manager: &LeaseManager, key: &str, n: u32) -> Semaphore {
    Semaphore::new(manager, key, n).unwrap()
}

/// `pool.acquire()` in a task, queued before this returns; the task yields
/// the instant the permit was granted, with the permit.
async fn permit_waiter(pool: &Semaphore) -> JoinHandle<Result<(Instant, Lease)>> {
    let pool = pool.clone();
    started(async move {
        let lease = pool.acquire().await?;
        Ok((Instant::now(), lease))
    })
    .await
}

/// `manager.acquire(key).shared()` in a task, queued before this returns;
/// the task yields the instant the lease was granted, with the lease.
async fn shared_waiter(manager: &LeaseManager, key: &str) -> JoinHandle<Result<(Instant, Lease)>> {
    let (manager, key) = (manager.clone(), key.to_string());
    started(async move {
        let lease = manager.acquire(key).shared().await?;
        Ok((Instant::now(), lease))
    })
    .await
}

/// The owner ids of the live holders in `hs` of `key`, oldest first.
fn holder_owners(db: &MemoryDb, key: &str) -> Vec<String> {
    let doc: Doc = db.doc(key).expect("a document");
    doc.live_holders(Instant::now())
        .map(|h| h.owner.clone())
        .collect()
}

fn assert_mismatch<T: std::fmt::Debug>(result: Result<T>, stored: LeaseKind, requested: LeaseKind) {
    match result {
        Err(Error::KindMismatch {
            stored: s,
            requested: r,
            ..
        }) if s == stored && r == requested => {}
        other => panic!("expected KindMismatch({stored} / {requested}), got {other:?}"),
    }
}

// ----- semaphores -----------------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn the_waiter_after_n_local_permits_waits_without_a_round_trip_and_gets_the_first_permit_released()
 {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let three = semaphore(&a, "pool", 3);
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(three.acquire().await.unwrap());
    }
    let tokens: Vec<u64> = held.iter().map(Lease::fencing_token).collect();
    assert!(tokens.windows(2).all(|t| t[0] < t[1]), "{tokens:?}");
    assert!(
        held.iter()
            .all(|l| l.kind() == LeaseKind::Permit { permits: 3 })
    );
    let fourth = permit_waiter(&three).await;
    let fifth = permit_waiter(&three).await;
    settle().await;
    sleep(HEARTBEAT / 2).await;
    assert_eq!(
        store.acquire_calls("pool").len(),
        3,
        "every permit is held here: the fourth and fifth wait locally"
    );
    assert!(!fourth.is_finished() && !fifth.is_finished());

    let second = held.remove(1);
    let released_at = Instant::now();
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, fourth_lease) = soon(fourth).await.unwrap().unwrap();
    assert_eq!(at, released_at, "served once the release is confirmed");
    assert!(fourth_lease.fencing_token() > tokens[2]);
    settle().await;
    assert!(!fifth.is_finished(), "FIFO: the fifth waits for the next");
    assert_eq!(holder_owners(&db, "pool"), ["a", "a", "a"]);

    let released_at = Instant::now();
    assert_eq!(
        held.remove(0).release().await.unwrap(),
        ReleaseOutcome::Released
    );
    let (at, fifth_lease) = soon(fifth).await.unwrap().unwrap();
    assert_eq!(at, released_at);
    assert!(fifth_lease.fencing_token() > fourth_lease.fencing_token());
    assert_eq!(store.max_acquires_in_flight_per_key(), 1);
    assert_eq!(store.acquire_calls("pool").len(), 5);
}

/// Two managers hold the two permits; a third one's waiter, whose polls
/// are seconds apart, gets the permit one of them releases within
/// `RELEASE_WAKE_JITTER`, woken by the change stream.
#[tokio::test(start_paused = true)]
async fn a_permit_released_by_another_manager_wakes_the_waiting_manager_at_once() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let (c, c_store) = start_slow_polls(&db, "c");
    let two = |m: &LeaseManager| semaphore(m, "pool", 2);
    let _la = two(&a).acquire().await.unwrap();
    let lb = two(&b).acquire().await.unwrap();
    let waiting = permit_waiter(&two(&c)).await;
    settle().await;
    sleep(RELEASE_WAKE_JITTER + MS).await;
    let attempts = c_store.acquire_calls("pool").len();
    assert_eq!(attempts, 2, "held, and held again once c's stream opened");
    assert!(two(&a).try_acquire().await.unwrap().is_none());

    // c's next poll is at least a second away.
    sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    assert_eq!(lb.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, lc) = soon(waiting).await.unwrap().unwrap();
    assert!(
        at - released_at <= RELEASE_WAKE_JITTER,
        "woken {:?} after the release",
        at - released_at
    );
    assert_eq!(c_store.acquire_calls("pool").len(), attempts + 1);
    assert_eq!(holder_owners(&db, "pool"), ["a", "c"]);
    let info = c.inspect("pool").await.unwrap().expect("a document");
    assert!(info.held);
    assert_eq!(info.kind, LeaseKind::Permit { permits: 2 });
    let tokens: Vec<u64> = info.holders.iter().map(|h| h.fencing_token).collect();
    assert_eq!(tokens.last(), Some(&lc.fencing_token()));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_asking_another_number_of_permits_gets_kind_mismatch_while_the_others_continue() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (two, three) = (semaphore(&a, "pool", 2), semaphore(&a, "pool", 3));
    let p1 = two.acquire().await.unwrap();
    let _p2 = two.acquire().await.unwrap();
    let next = permit_waiter(&two).await;
    // Refused at once: the permits held here are live in the store too.
    assert_mismatch(
        soon(three.acquire()).await,
        LeaseKind::Permit { permits: 2 },
        LeaseKind::Permit { permits: 3 },
    );
    assert_mismatch(
        soon(a.acquire("pool")).await,
        LeaseKind::Permit { permits: 2 },
        LeaseKind::Exclusive,
    );
    assert_eq!(store.acquire_calls("pool").len(), 2);
    let released_at = Instant::now();
    assert_eq!(p1.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, _) = soon(next).await.unwrap().unwrap();
    assert_eq!(at, released_at, "the waiter behind the refused ones");

    // Held elsewhere: the store's answer fails the waiter of 3 permits
    // only; the waiter of 2 behind it gets its permit.
    let (b, b_store, _) = start(&db, "b");
    b_store.set_latency(Op::Acquire, 10 * MS);
    let _held = db.try_take_as("other", "c", TTL, LeaseKind::Permit { permits: 2 });
    let t = Instant::now();
    let wrong = permit_waiter(&semaphore(&b, "other", 3)).await;
    let right = permit_waiter(&semaphore(&b, "other", 2)).await;
    assert_mismatch(
        soon(wrong).await.unwrap(),
        LeaseKind::Permit { permits: 2 },
        LeaseKind::Permit { permits: 3 },
    );
    let (at, lease) = soon(right).await.unwrap().unwrap();
    assert_eq!(
        at - t,
        20 * MS,
        "its own attempt, right after the refused one"
    );
    assert_eq!(lease.kind(), LeaseKind::Permit { permits: 2 });
    assert_eq!(holder_owners(&db, "other"), ["c", "b"]);
}

/// One lease of a key lost on the server (a permit that expired there and
/// was taken by another owner) cancels its own token only.
#[tokio::test(start_paused = true)]
async fn a_lost_permit_fires_only_its_own_token() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let two = semaphore(&a, "pool", 2);
    let p1 = two.acquire().await.unwrap();
    let p2 = two.acquire().await.unwrap();
    // (The key's insert is announced: a's check of its holders ends here.)
    settle().await;
    let checks = store.calls(Op::Renew);
    db.expire_holder("pool", p1.lease_id());
    let taken = db.try_take_as("pool", "b", TTL, LeaseKind::Permit { permits: 2 });
    assert!(
        matches!(taken, AcquireOutcome::Acquired { .. }),
        "{taken:?}"
    );
    settle().await;
    assert!(
        !p1.status().is_lost(),
        "an acquisition beside it is not announced"
    );
    assert_eq!(store.calls(Op::Renew), checks);

    sleep_until(t0 + HEARTBEAT).await;
    soon(p1.status().lost()).await;
    settle().await;
    assert!(
        !p2.status().is_lost(),
        "the other permit of the key is still held"
    );
    let sizes = store.renew_batch_sizes();
    assert_eq!(sizes[checks..], [2], "both in one renewal");
    assert_eq!(holder_owners(&db, "pool"), ["a", "b"]);
    assert_eq!(p1.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
    assert_eq!(p2.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(holder_owners(&db, "pool"), ["b"]);
}

// ----- shared and exclusive -------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn shared_waiters_of_one_manager_are_served_one_after_another_without_waiting_for_a_release()
{
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    store.set_latency(Op::Acquire, 10 * MS);
    let t = Instant::now();
    let mut waiters = Vec::new();
    for _ in 0..3 {
        waiters.push(shared_waiter(&a, "rw").await);
    }
    let mut leases = Vec::new();
    for waiter in waiters {
        let (at, lease) = soon(waiter).await.unwrap().unwrap();
        leases.push((at - t, lease));
    }
    let delays: Vec<Duration> = leases.iter().map(|(d, _)| *d).collect();
    assert_eq!(
        delays,
        [10 * MS, 20 * MS, 30 * MS],
        "one attempt each, in turn"
    );
    assert!(leases.iter().all(|(_, l)| !l.status().is_lost()));
    assert_eq!(holder_owners(&db, "rw"), ["a", "a", "a"]);
    assert_eq!(store.max_acquires_in_flight_per_key(), 1);
    let info = a.inspect("rw").await.unwrap().expect("a document");
    assert_eq!((info.kind, info.holders.len()), (LeaseKind::Shared, 3));
}

#[tokio::test(start_paused = true)]
async fn an_exclusive_waiter_behind_local_shared_holders_gets_the_key_after_them_and_a_later_shared_waiter_waits_for_it()
 {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let s1 = a.acquire("rw").shared().await.unwrap();
    let s2 = a.acquire("rw").shared().await.unwrap();
    let exclusive = waiter(&a, "rw").await;
    let later = shared_waiter(&a, "rw").await;
    settle().await;
    assert_eq!(store.acquire_calls("rw").len(), 2, "both wait locally");
    assert!(a.try_acquire("rw").shared().await.unwrap().is_none());

    assert_eq!(s1.release().await.unwrap(), ReleaseOutcome::Released);
    settle().await;
    assert!(!exclusive.is_finished() && !later.is_finished());
    let released_at = Instant::now();
    assert_eq!(s2.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, x) = soon(exclusive).await.unwrap().unwrap();
    assert_eq!(at, released_at);
    assert_eq!(x.kind(), LeaseKind::Exclusive);
    settle().await;
    assert!(
        !later.is_finished(),
        "local FIFO: after the exclusive lease"
    );
    assert_eq!(db.holder("rw").as_deref(), Some("a"));

    let (released_at, token) = (Instant::now(), x.fencing_token());
    assert_eq!(x.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, s3) = soon(later).await.unwrap().unwrap();
    assert_eq!(at, released_at);
    assert!(s3.fencing_token() > token);
}

/// The exclusive waiter at the head goes away: the shared waiter behind it
/// joins the local shared holder at once.
#[tokio::test(start_paused = true)]
async fn a_cancelled_exclusive_head_waiter_lets_the_shared_waiter_behind_it_start() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let _s1 = a.acquire("rw").shared().await.unwrap();
    let t = Instant::now();
    let exclusive = {
        let a = a.clone();
        started(async move {
            a.acquire("rw")
                .into_future()
                .timeout(100 * MS)
                .await
                .ok()
                .transpose()
        })
        .await
    };
    let behind = shared_waiter(&a, "rw").await;
    assert!(soon(exclusive).await.unwrap().unwrap().is_none());
    let (at, _) = soon(behind).await.unwrap().unwrap();
    assert_eq!(at - t, 100 * MS, "started when the head went away");
    assert_eq!(holder_owners(&db, "rw"), ["a", "a"]);
}

/// Manager A keeps a shared lease and keeps asking for more; B's exclusive
/// waiter marks the key (`xw`), which stops A's new shared acquisitions, and
/// keeps the mark live past its TTL while it waits: A's holder drains and B
/// gets the key.
#[tokio::test(start_paused = true)]
async fn an_exclusive_waiter_in_another_manager_is_not_starved_by_shared_acquisitions() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let s1 = a.acquire("rw").shared().await.unwrap();
    let exclusive = waiter(&b, "rw").await;
    settle().await;
    let marked_by = |db: &MemoryDb| {
        db.doc("rw")
            .and_then(|d| d.exclusive_waiter)
            .filter(|(_, exp)| *exp > Instant::now())
            .map(|(owner, _)| owner)
    };
    assert_eq!(marked_by(&db).as_deref(), Some("b"));
    let more = shared_waiter(&a, "rw").await;
    // Longer than the TTL: the mark is kept live by b's retries.
    sleep(TTL + HEARTBEAT).await;
    assert_eq!(marked_by(&db).as_deref(), Some("b"));
    assert!(!more.is_finished(), "no shared acquisition while b waits");
    assert!(!exclusive.is_finished());
    assert!(!s1.status().is_lost());

    let released_at = Instant::now();
    assert_eq!(s1.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, x) = soon(exclusive).await.unwrap().unwrap();
    assert!(
        at - released_at <= RELEASE_WAKE_JITTER,
        "{:?}",
        at - released_at
    );
    assert_eq!(
        marked_by(&db),
        None,
        "the exclusive acquisition removed its mark"
    );
    settle().await;
    assert!(!more.is_finished(), "a's shared waiter waits for b's lease");

    let released_at = Instant::now();
    assert_eq!(x.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, _) = soon(more).await.unwrap().unwrap();
    assert!(
        at - released_at <= RELEASE_WAKE_JITTER,
        "{:?}",
        at - released_at
    );
}

#[tokio::test(start_paused = true)]
async fn force_release_of_a_shared_key_cancels_every_local_holder_and_serves_the_exclusive_waiter()
{
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let s1 = a.acquire("rw").shared().await.unwrap();
    let s2 = a.acquire("rw").shared().await.unwrap();
    let exclusive = waiter(&a, "rw").await;
    let before = a
        .force_release("rw")
        .immediately()
        .await
        .unwrap()
        .expect("held");
    assert_eq!((before.kind, before.holders.len()), (LeaseKind::Shared, 2));
    assert!(s1.status().is_lost() && s2.status().is_lost());
    let (_, x) = soon(exclusive).await.unwrap().unwrap();
    assert!(x.fencing_token() > s2.fencing_token());
}

// ----- one heartbeat for every kind -------------------------------------------------

#[tokio::test(start_paused = true)]
async fn one_heartbeat_renews_exclusive_shared_and_permit_leases_of_one_ttl_in_one_store_call() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let _x = a.acquire("x").await.unwrap();
    let _s = [
        a.acquire("s").shared().await.unwrap(),
        a.acquire("s").shared().await.unwrap(),
    ];
    let _p = [
        semaphore(&a, "p", 2).acquire().await.unwrap(),
        semaphore(&a, "p", 2).acquire().await.unwrap(),
    ];
    settle().await;
    sleep_until(t0 + HEARTBEAT + MS).await;
    // (Before it, the inserts of "s" and "p", announced, were checked.)
    let at_heartbeat: Vec<usize> = store
        .calls_of(Op::Renew)
        .iter()
        .filter(|c| c.at == t0 + HEARTBEAT)
        .map(|c| c.keys.len())
        .collect();
    assert_eq!(at_heartbeat, [5]);
    let renewed_exp = t0 + HEARTBEAT + TTL;
    assert_eq!(db.doc("x").unwrap().exp, renewed_exp);
    for key in ["s", "p"] {
        let doc = db.doc(key).unwrap();
        assert!(doc.holders.iter().all(|h| h.exp == renewed_exp), "{doc:?}");
        assert_eq!(doc.exp, renewed_exp);
    }
}

// ----- holding at least -------------------------------------------------------------

/// A lease held at least 5 s and released after 100 ms: the key stays held
/// until exactly `hl` for everyone, and the manager waiting since before the
/// release (woken by it, then told how long remains) gets it at `hl`.
#[tokio::test(start_paused = true)]
async fn a_release_before_hold_until_keeps_the_key_until_then_and_the_waiting_manager_gets_it_at_hold_until()
 {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let (b, b_store, _) = start(&db, "b");
    let (c, _, _) = start(&db, "c");
    let hold = Duration::from_secs(5);
    let t = Instant::now();
    let job = a.acquire("job").hold_at_least(hold).await.unwrap();
    let (hold_until, token) = (t + hold, job.fencing_token());
    let doc = db.doc("job").unwrap();
    assert_eq!((doc.hold_until, doc.exp), (Some(hold_until), hold_until));
    let waiting = waiter(&b, "job").await;
    sleep(100 * MS).await;
    assert_eq!(job.release().await.unwrap(), ReleaseOutcome::Released);
    let doc = db.doc("job").unwrap();
    assert_eq!(
        (doc.lease_id, doc.exp),
        (None, hold_until),
        "released, held until hl"
    );
    let info = c.inspect("job").await.unwrap().expect("a document");
    assert_eq!(info.hold_until, Some(db.system_time(hold_until)));
    assert!(info.held, "the key reads as held until hl");

    sleep_until(hold_until - MS).await;
    assert!(c.try_acquire("job").await.unwrap().is_none());
    assert!(!waiting.is_finished());
    let (at, lease) = soon(waiting).await.unwrap().unwrap();
    assert!(
        at >= hold_until && at - hold_until <= RETRY_INITIAL,
        "acquired {:?} after hl",
        at - hold_until
    );
    assert!(db.doc("job").unwrap().acquired >= hold_until);
    assert!(lease.fencing_token() > token);
    let late = b_store.acquire_calls("job");
    assert_eq!(
        late.iter().filter(|at| **at >= hold_until).count(),
        1,
        "one attempt from hl on"
    );
}

// ----- several leases of one key ----------------------------------------------------

/// A try beside local shared holders is not busy locally: the store
/// decides, in one round trip.
#[tokio::test(start_paused = true)]
async fn a_try_for_a_shared_key_beside_local_shared_holders_asks_the_store() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let _s1 = a.acquire("rw").shared().await.unwrap();
    let s2 = a.try_acquire("rw").shared().await.unwrap();
    assert!(s2.is_some(), "shared beside shared");
    assert_eq!(store.acquire_calls("rw").len(), 2);
    assert!(a.try_acquire("rw").await.unwrap().is_none());
    assert_eq!(
        store.acquire_calls("rw").len(),
        2,
        "an exclusive try is busy locally"
    );
}

/// Each lease of a key has its own deadline: with renewals hanging, two
/// permits acquired 500 ms apart are lost 500 ms apart.
#[tokio::test(start_paused = true)]
async fn leases_of_one_key_are_lost_each_at_its_own_deadline() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    store.hang_renewals();
    let two = semaphore(&a, "pool", 2);
    let first = two.acquire().await.unwrap();
    sleep(Duration::from_millis(500)).await;
    let second = two.acquire().await.unwrap();
    soon(first.status().lost()).await;
    assert_eq!(Instant::now(), t0 + VALIDITY);
    assert!(!second.status().is_lost());
    soon(second.status().lost()).await;
    assert_eq!(Instant::now(), t0 + Duration::from_millis(500) + VALIDITY);
}

#[tokio::test(start_paused = true)]
async fn release_all_and_shutdown_release_every_lease_of_every_kind() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let mut leases = Vec::new();
    for _ in 0..2 {
        leases.push(a.acquire("s").shared().await.unwrap());
        leases.push(semaphore(&a, "p", 3).acquire().await.unwrap());
    }
    assert_eq!(a.release_all().await.unwrap(), 4);
    assert!(leases.iter().all(|l| l.status().is_lost()));
    assert!(holder_owners(&db, "s").is_empty() && holder_owners(&db, "p").is_empty());
    let releases = store.calls_of(Op::Release);
    assert_eq!(releases.len(), 1, "one batch: {releases:?}");
    assert_eq!(releases[0].keys.len(), 4, "one entry per lease");

    let mut leases = Vec::new();
    for _ in 0..2 {
        leases.push(a.acquire("s").shared().await.unwrap());
        leases.push(semaphore(&a, "p", 3).acquire().await.unwrap());
    }
    leases.push(a.acquire("x").await.unwrap());
    a.shutdown().await.unwrap();
    assert!(leases.iter().all(|l| l.status().is_lost()));
    let releases = store.calls_of(Op::Release);
    assert_eq!(releases.len(), 2, "one batch more: {releases:?}");
    assert_eq!(releases[1].keys.len(), 5, "one entry per lease");
    assert!(holder_owners(&db, "s").is_empty() && holder_owners(&db, "p").is_empty());
    assert_released(&db, "x");
}

/// An observer of a shared key sees each holder's expiry, the first one
/// included (the key stays held by the other).
#[tokio::test(start_paused = true)]
async fn an_observer_of_a_shared_key_sees_each_holders_expiry() {
    let db = MemoryDb::new();
    let (a, _, _) = start(&db, "a");
    let t = Instant::now();
    for (owner, ttl) in [("b", HEARTBEAT), ("c", TTL)] {
        let taken = db.try_take_as("rw", owner, ttl, LeaseKind::Shared);
        assert!(
            matches!(taken, AcquireOutcome::Acquired { .. }),
            "{taken:?}"
        );
    }
    let mut states = a.observe("rw").await.unwrap();
    let mut next = async || {
        let info = soon(states.recv())
            .await
            .unwrap()
            .unwrap()
            .expect("a document");
        let owners: Vec<String> = info.holders.iter().map(|h| h.owner_id.clone()).collect();
        (Instant::now() - t, info.held, owners)
    };
    assert_eq!(
        next().await,
        (Duration::ZERO, true, vec!["b".into(), "c".into()])
    );
    assert_eq!(next().await, (HEARTBEAT, true, vec!["c".into()]));
    assert_eq!(next().await, (TTL, false, vec![]));
}

/// Without change streams, a waiter that found every permit held starts
/// its next attempt as soon as its own manager's permit release is
/// confirmed, not at its next poll (seconds away).
#[tokio::test(start_paused = true)]
async fn a_local_permit_release_starts_the_waiters_attempt_at_once_without_change_streams() {
    let db = MemoryDb::new();
    let store = db.store("a", TTL).without_change_streams();
    let slow_polls = Timing {
        retry_initial: Duration::from_secs(2),
        retry_max: Duration::from_secs(10),
        ..timing()
    };
    let a = LeaseManager::start(Arc::new(store.clone()), "a".into(), slow_polls);
    let two = semaphore(&a, "pool", 2);
    let mine = two.acquire().await.unwrap();
    let taken = db.try_take_as("pool", "b", TTL, LeaseKind::Permit { permits: 2 });
    assert!(
        matches!(taken, AcquireOutcome::Acquired { .. }),
        "{taken:?}"
    );
    let waiting = permit_waiter(&two).await;
    settle().await;
    assert_eq!(store.acquire_calls("pool").len(), 2, "found both held");
    sleep(Duration::from_millis(500)).await;
    let released_at = Instant::now();
    assert_eq!(mine.release().await.unwrap(), ReleaseOutcome::Released);
    let (at, _) = soon(waiting).await.unwrap().unwrap();
    assert_eq!(at, released_at);
    assert_eq!(holder_owners(&db, "pool"), ["b", "a"]);
}

#[tokio::test(start_paused = true)]
async fn an_unseen_acquisition_for_a_waiter_that_left_never_blocks_the_next_waiter_of_another_kind()
{
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    // The exclusive waiter's acquisition lands but its reply is lost (sent
    // again, the same); the waiter leaves before the retry (the re-read
    // fails too).
    store.fault_next(Op::Acquire, Fault::FailAfterApply, 2);
    store.fail_next(Op::Inspect, 1);
    let exclusive = waiter(&a, "k").await;
    settle().await;
    assert_eq!(store.acquire_calls("k").len(), 2);
    let reader = shared_waiter(&a, "k").await;
    exclusive.abort();
    let left = Instant::now();
    let (at, lease) = soon(reader).await.unwrap().unwrap();
    // The lease id of the unseen acquisition is given back, and the shared
    // waiter's attempt goes under a new one: it does not wait for the
    // orphaned exclusive lease to expire.
    assert!(at - left < TTL / 2, "granted {:?} after", at - left);
    assert_eq!(lease.kind(), LeaseKind::Shared);
    assert_eq!(store.calls(Op::Release), 1, "{:?}", store.log());
    assert_eq!(holder_owners(&db, "k"), ["a"]);
}

#[tokio::test(start_paused = true)]
async fn a_permit_whose_reply_is_lost_and_whose_reread_is_stale_is_retried_not_refused() {
    let db = MemoryDb::new();
    db.keep_snapshots(Duration::from_secs(10));
    let (a, store, _) = start(&db, "a");
    let two = semaphore(&a, "pool", 2);
    let _first = two.acquire().await.unwrap();
    sleep(Duration::from_millis(100)).await;
    let mut three = semaphore(&a, "pool", 3);
    assert_eq!(three.set_permits(3).await.unwrap(), PermitsChange::Set);
    sleep(Duration::from_millis(100)).await;
    // The acquisition of one permit of 3 lands, its reply is lost, and the
    // re-read is a snapshot from before the change to 3 permits: it reads
    // the key as held as 2 permits, without this acquisition.
    store.fault_next(Op::Acquire, Fault::FailAfterApply, 2);
    store.fault_next(Op::Inspect, Fault::Stale(Duration::from_millis(150)), 1);
    let second = soon(three.acquire()).await.unwrap();
    assert_eq!(second.kind(), LeaseKind::Permit { permits: 3 });
    let doc = db.doc("pool").unwrap();
    let taken: Vec<_> = doc
        .holders
        .iter()
        .map(|h| (h.lease_id, h.permits))
        .collect();
    assert!(taken.contains(&(Some(second.lease_id()), 1)), "{taken:?}");
    // Two of 3 permits are taken: two more are not free (the lease id of
    // the landed acquisition is not reused for them).
    assert!(three.try_acquire().permits(2).await.unwrap().is_none());
    assert_eq!(db.doc("pool").unwrap().permits_used(Instant::now()), 2);
}

#[tokio::test(start_paused = true)]
async fn a_permit_that_landed_unseen_before_the_number_changed_is_given_back_and_refused() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let _theirs = semaphore(&b, "pool", 2).acquire().await.unwrap();
    // a's acquisition of one permit of 2 lands, its reply is lost and so is
    // the re-read: it retries under the same lease id.
    sa.fault_next(Op::Acquire, Fault::FailAfterApply, 2);
    sa.fail_next(Op::Inspect, 1);
    let two = semaphore(&a, "pool", 2);
    let mine = started(async move { two.acquire().await }).await;
    settle().await;
    assert_eq!(holder_owners(&db, "pool"), ["b", "a"]);
    // Meanwhile b makes it a semaphore of 3.
    let mut three = semaphore(&b, "pool", 3);
    assert_eq!(three.set_permits(3).await.unwrap(), PermitsChange::Set);
    // The retry finds its entry on a key of 3 permits: a permit of 2 is
    // not granted (it would count against 2 on a key of 3), and the entry
    // is given back.
    assert_mismatch(
        soon(mine).await.unwrap(),
        LeaseKind::Permit { permits: 3 },
        LeaseKind::Permit { permits: 2 },
    );
    settle().await;
    assert_eq!(sa.calls(Op::Release), 1, "{:?}", sa.log());
    assert_eq!(holder_owners(&db, "pool"), ["b"]);
    assert_eq!(db.doc("pool").unwrap().permits, Some(3));
}

/// An acquisition of one permit whose write the server holds up past the
/// operation timeout may land at any time later, even after a retry under
/// its lease id was answered `Held` ("Late writes" in `store`): an
/// acquisition of another number of permits never goes under that lease
/// id, or it would take the landed entry, of one permit, for its own.
#[tokio::test(start_paused = true)]
async fn a_lease_id_whose_attempt_may_still_land_is_never_reused_for_another_number_of_permits() {
    let db = MemoryDb::new();
    let (a, sa, _) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    sa.set_operation_timeout(Some(OPERATION_TIMEOUT));
    let pool = |m: &LeaseManager| semaphore(m, "pool", 3);
    let _mine = pool(&a).acquire().await.unwrap();
    let theirs = pool(&b).acquire().permits(2).await.unwrap();
    // a's acquisition of one more permit: held up on the server, given up
    // at the operation timeout, and retried under the same lease id, which
    // is answered held.
    let held_up = OPERATION_TIMEOUT * 3;
    sa.fault_next(Op::Acquire, Fault::Unanswered(held_up), 1);
    let sent = Instant::now();
    let one = started({
        let pool = pool(&a);
        async move { pool.acquire().await }
    })
    .await;
    sleep(OPERATION_TIMEOUT + OPERATION_TIMEOUT / 2).await;
    assert!(
        sa.calls(Op::Acquire) >= 3,
        "the held-up send and its retries"
    );
    one.abort();
    assert_eq!(theirs.release().await.unwrap(), ReleaseOutcome::Released);
    // The held-up send lands: one permit under the old lease id.
    sleep_until(sent + held_up + OPERATION_TIMEOUT / 10).await;
    assert_eq!(db.doc("pool").unwrap().permits_used(Instant::now()), 2);

    let two = soon(pool(&a).acquire().permits(2)).await.unwrap();
    let doc = db.doc("pool").unwrap();
    let entry = doc
        .holders
        .iter()
        .find(|h| h.lease_id == Some(two.lease_id()))
        .map(|h| h.permits);
    assert_eq!(
        entry,
        Some(2),
        "the new lease's entry takes its two permits"
    );
    assert_eq!(doc.permits_used(Instant::now()), 3, "{:?}", doc.holders);
}

/// The twin's side of `tests/manager/reread.rs`'s
/// `a_late_first_send_is_not_taken_by_an_attempt_of_another_shape`: a
/// permit waiter's first send, held back 3 s past its 1 s operation
/// timeout, is sent again and answered; its waiter leaves; the held-back
/// send lands (under the same lease id, a permit B released meanwhile).
/// The waiter of 2 permits that follows goes under a new lease id
/// (`replies::answered`), so it is not granted beside B's live permit.
#[tokio::test(start_paused = true)]
async fn a_late_first_send_is_not_taken_by_a_waiter_of_another_number_of_permits() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let (b, _, _) = start(&db, "b");
    let pool_b = semaphore(&b, "late", 2);
    let (b1, b2) = (
        pool_b.acquire().await.unwrap(),
        pool_b.acquire().await.unwrap(),
    );
    store.set_operation_timeout(Some(Duration::from_secs(1)));
    store.fault_next(Op::Acquire, Fault::Delay(Duration::from_secs(3)), 1);
    let pool_a = semaphore(&a, "late", 2);
    let one = started({
        let pool_a = pool_a.clone();
        async move {
            let one = pool_a.acquire();
            one.into_future().timeout(Duration::from_millis(1500)).await
        }
    })
    .await;
    let two = started(async move { pool_a.acquire().permits(2).await }).await;
    assert!(
        soon(one).await.unwrap().is_err(),
        "the waiter of one permit gives up"
    );
    assert_eq!(
        store.acquire_calls("late")[..2],
        [t0, t0 + Duration::from_secs(1)]
    );
    assert_eq!(b1.release().await.unwrap(), ReleaseOutcome::Released);
    sleep_until(t0 + Duration::from_secs(3) + MS).await;
    assert!(
        holder_owners(&db, "late").contains(&"a".to_string()),
        "the held-back send landed: {:?}",
        db.doc("late")
    );
    // Taking that permit as its own would grant it at its next attempt.
    let granted = two.timeout(TTL).await;
    assert!(
        !matches!(granted, Ok(Ok(Ok(_)))) || b2.status().is_lost(),
        "2 permits granted beside B's live one: {:?}",
        db.doc("late")
    );
}
