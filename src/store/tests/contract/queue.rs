//! The queue of waiting owners ("Queue of waiting owners" in `store`):
//! registration by waiting attempts, handoff in the releasing write, the
//! head's claim on a free key, lapsed registrations, what never
//! registers, and the bound on the queue's entries.

use crate::store::OverrideEnd;
use crate::store::StoreExt;
use std::time::Duration;

use futures::StreamExt;
use uuid::Uuid;

use super::{Fixture, lease, raw, stores, take};
use crate::key::LeaseKey;
use crate::store::{AcquireOutcome, Announced, Announcement, KeyWrite, LeaseRef, Store};

/// A waiting attempt of `store` on `key` under `lease_id`, which must find
/// the key held by `holder` (and so registers), and report the token stored
/// on the key, `token`: that of the holder's lease, or of the last lease of
/// a free key kept for the head of the queue.
async fn wait(store: &impl Store, key: &str, lease_id: Uuid, holder: &str, token: u64) {
    match store.attempt(key.into(), lease_id, true).await {
        Ok(AcquireOutcome::Held {
            holder: h,
            token: t,
            ..
        }) if h == holder && t == Some(token) => {}
        other => panic!("waiting for {key:?} held by {holder:?} with token {token}: {other:?}"),
    }
}

/// The retry of `store` under `lease_id`, which must get the key handed to
/// it, with `token`.
async fn confirm(store: &impl Store, key: &str, lease_id: Uuid, token: u64) -> LeaseRef {
    match store.attempt(key.into(), lease_id, true).await {
        Ok(AcquireOutcome::Acquired { token: t }) if t == token => lease(key, lease_id),
        other => panic!("confirming {key:?} handed with token {token}: {other:?}"),
    }
}

/// The holder of `key` as stored, which must be a live lease: its owner id,
/// lease id and token.
async fn holder(f: &impl Fixture, key: &str) -> (String, Uuid, u64) {
    let r = raw(f, key).await;
    assert!(!r.expired, "{key:?} is not held: {r:?}");
    let lease_id = r
        .lease_id
        .unwrap_or_else(|| panic!("{key:?} released: {r:?}"));
    (r.owner, lease_id, r.token)
}

/// The holder of `key`, which must be `holder` (owner id and lease id),
/// handed the key with a token greater than `above`: its token.
async fn handed(f: &impl Fixture, key: &str, holder: (&str, Uuid), above: u64) -> u64 {
    let (owner, lease_id, token) = self::holder(f, key).await;
    assert_eq!((owner.as_str(), lease_id), holder, "{key:?} handed to");
    assert!(token > above, "{key:?}: token {token} > {above}");
    token
}

fn owners(names: &[&str]) -> Vec<String> {
    names.iter().map(|n| n.to_string()).collect()
}

pub(super) async fn waiting_owners_are_handed_the_key_in_arrival_order_with_greater_tokens<
    F: Fixture,
>(
    f: &F,
) {
    let [a, b, c, d] = stores(f, ["a", "b", "c", "d"]).await;
    let (la, ta) = take(&a, "k").await;
    let (lb, lc, ld) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    wait(&b, "k", lb, "a", ta).await;
    wait(&c, "k", lc, "a", ta).await;
    wait(&d, "k", ld, "a", ta).await;
    // A refreshed registration keeps its place.
    wait(&b, "k", lb, "a", ta).await;
    wait(&d, "k", ld, "a", ta).await;
    assert_eq!(f.queue("k").await, owners(&["b", "c", "d"]));

    // Each release hands the key to the first registered owner, in the
    // same write, with a greater token; its retry confirms it.
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let tb = handed(f, "k", ("b", lb), ta).await;
    assert_eq!(f.queue("k").await, owners(&["c", "d"]));
    let lb = confirm(&b, "k", lb, tb).await;
    // The others still wait, and keep their places.
    wait(&d, "k", ld, "b", tb).await;
    wait(&c, "k", lc, "b", tb).await;
    assert_eq!(f.queue("k").await, owners(&["c", "d"]));

    assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 1);
    let tc = handed(f, "k", ("c", lc), tb).await;
    let lc = confirm(&c, "k", lc, tc).await;

    assert_eq!(c.release_by_id(vec![lc]).await.unwrap(), 1);
    let td = handed(f, "k", ("d", ld), tc).await;
    let ld = confirm(&d, "k", ld, td).await;

    // Nobody waits any more: a release with no handoff, then anyone takes it.
    assert_eq!(d.release_by_id(vec![ld]).await.unwrap(), 1);
    let r = raw(f, "k").await;
    assert_eq!((r.lease_id, r.expired, r.yielded), (None, true, false));
    assert!(f.queue("k").await.is_empty());
    let (_, t) = take(&a, "k").await;
    assert!(t > td, "{t} > {td}");
}

pub(super) async fn a_free_key_is_kept_for_the_head_of_the_queue_and_lapsed_registrations_are_skipped<
    F: Fixture,
>(
    f: &F,
) {
    let [a, b, c, d] = stores(f, ["a", "b", "c", "d"]).await;
    let (_, ta) = take(&a, "k").await;
    let (lb, lc) = (Uuid::new_v4(), Uuid::new_v4());
    wait(&b, "k", lb, "a", ta).await;
    wait(&c, "k", lc, "a", ta).await;

    // The holder died: its lease expired, with b and c registered. Only b,
    // the head, may take it; c and a newcomer wait, and are told b holds it
    // (with the token of a's lease, the last one).
    f.expire("k").await;
    wait(&c, "k", lc, "b", ta).await;
    match d.attempt("k".into(), Uuid::new_v4(), false).await {
        Ok(AcquireOutcome::Held {
            holder,
            remaining,
            token,
            ..
        }) => {
            assert_eq!(holder, "b");
            let remaining = remaining.expect("until the head's registration expires");
            assert!(remaining > Duration::ZERO, "{remaining:?}");
            assert_eq!(token, Some(ta));
        }
        other => panic!("d should wait for the head: {other:?}"),
    }
    assert_eq!(f.queue("k").await, owners(&["b", "c"]));

    // b and c stopped retrying: their registrations lapse. c comes back:
    // it registers anew, alone, and takes the free key at its next attempt.
    f.lapse_registrations("k").await;
    assert!(f.queue("k").await.is_empty());
    let (lc2, tc) = take(&c, "k").await;
    let (owner, lease_id, token) = holder(f, "k").await;
    assert_eq!((owner.as_str(), lease_id, token), ("c", lc2.lease_id, tc));
    // A lapsed owner that comes back queues behind the live ones.
    wait(&b, "k", lb, "c", tc).await;
    wait(&d, "k", Uuid::new_v4(), "c", tc).await;
    assert_eq!(f.queue("k").await, owners(&["b", "d"]));
}

pub(super) async fn a_handed_lease_never_confirmed_expires_and_the_next_owner_takes_it<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b, c) = (f.store("a").await, f.store("b").await, f.store("c").await);
    let (la, ta) = take(&a, "k").await;
    let (lb, lc) = (Uuid::new_v4(), Uuid::new_v4());
    wait(&b, "k", lb, "a", ta).await;
    wait(&c, "k", lc, "a", ta).await;
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let (owner, _, tb) = holder(f, "k").await;
    assert_eq!(owner, "b");
    // The handed lease lasts the registration's `hx`: at most the
    // registration window (of the waiter's `retry_max` and safety margin),
    // at most the TTL.
    let window = b.profile().registration_window;
    assert_eq!(
        window,
        crate::store::registration_window(super::YIELD, super::MARGIN)
    );
    let lifetime = f.lifetime("k").await;
    assert_eq!(lifetime, super::TTL.min(window));

    // b died before confirming: once the handed lease expires, c (now the
    // head) takes the key with a greater token.
    f.expire("k").await;
    let tc = match c.attempt("k".into(), lc, true).await {
        Ok(AcquireOutcome::Acquired { token }) => token,
        other => panic!("c should take the expired handed lease: {other:?}"),
    };
    assert!(tc > tb, "{tc} > {tb}");
    // b's late confirmation finds the key held.
    match b.attempt("k".into(), lb, true).await {
        Ok(AcquireOutcome::Held { holder, .. }) => assert_eq!(holder, "c"),
        other => panic!("b's late confirmation: {other:?}"),
    }
}

pub(super) async fn try_acquire_and_foreign_documents_never_register<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, _) = take(&a, "k").await;
    // A try (not waiting) leaves no registration.
    match b.attempt("k".into(), Uuid::new_v4(), false).await {
        Ok(AcquireOutcome::Held { holder, .. }) => assert_eq!(holder, "a"),
        other => panic!("{other:?}"),
    }
    assert!(f.queue("k").await.is_empty());
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let r = raw(f, "k").await;
    assert_eq!((r.owner.as_str(), r.lease_id), ("a", None));

    // A foreign holder's lock is never modified by a waiting attempt.
    f.put_foreign("foreign", "other-app").await;
    let outcome = b.attempt("foreign".into(), Uuid::new_v4(), true).await;
    assert!(
        matches!(
            outcome,
            Ok(AcquireOutcome::Held {
                remaining: None,
                ..
            })
        ),
        "{outcome:?}"
    );
    assert!(f.foreign_unchanged("foreign").await);
}

pub(super) async fn release_owner_hands_over_and_force_release_frees_the_key_for_the_head<
    F: Fixture,
>(
    f: &F,
) {
    let [a, b, c, op] = stores(f, ["a", "b", "c", "operator"]).await;
    let (_, ta) = take(&a, "k1").await;
    let (_, ta2) = take(&a, "k2").await;
    let (lb1, lb2) = (Uuid::new_v4(), Uuid::new_v4());
    wait(&b, "k1", lb1, "a", ta).await;
    wait(&b, "k2", lb2, "a", ta2).await;

    // An operator's release of a's leases hands each one to its waiter.
    assert_eq!(
        op.release_owner("a".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        2
    );
    let tb = handed(f, "k1", ("b", lb1), ta).await;
    // So does a manager's release of its lease.
    let lb1 = confirm(&b, "k1", lb1, tb).await;
    let (_, _, tb2) = holder(f, "k2").await;
    assert!(tb2 > ta2);
    let lc = Uuid::new_v4();
    wait(&c, "k1", lc, "b", tb).await;
    assert_eq!(b.release_by_id(vec![lb1]).await.unwrap(), 1);
    let tc = handed(f, "k1", ("c", lc), tb).await;

    // A force release frees the key whoever holds it, and hands nothing:
    // the head of the queue takes it at its next attempt.
    let la = Uuid::new_v4();
    wait(&a, "k1", la, "c", tc).await;
    assert!(
        op.force_release("k1".into(), OverrideEnd::Immediately)
            .await
            .unwrap()
            .is_some()
    );
    let r = raw(f, "k1").await;
    assert_eq!((r.lease_id, r.expired, r.token), (None, true, tc));
    assert_eq!(f.queue("k1").await, owners(&["a"]));
    wait(&b, "k1", Uuid::new_v4(), "a", tc).await;
    match a.attempt("k1".into(), la, true).await {
        Ok(AcquireOutcome::Acquired { token }) => assert!(token > tc),
        other => panic!("the head takes the force-released key: {other:?}"),
    }
}

pub(super) async fn a_local_handoff_goes_to_the_first_registered_owner_instead<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, ta) = take(&a, "k").await;
    let lb = Uuid::new_v4();
    wait(&b, "k", lb, "a", ta).await;
    let local = Uuid::new_v4();
    let outcome = a
        .handoff_to("k".into(), (la.lease_id, local), super::TTL, true)
        .await
        .unwrap();
    assert_eq!(outcome, crate::store::HandoffOutcome::Released);
    let tb = handed(f, "k", ("b", lb), ta).await;
    // a's local waiter registers behind, and is handed the key next.
    wait(&a, "k", local, "b", tb).await;
    let lb = confirm(&b, "k", lb, tb).await;
    assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 1);
    let (owner, lease_id, _) = holder(f, "k").await;
    assert_eq!((owner.as_str(), lease_id), ("a", local));
}

pub(super) async fn delete_mode_hands_over_instead_of_deleting<F: Fixture>(f: &F) {
    let (a, b) = (
        f.delete_mode_store("a").await,
        f.delete_mode_store("b").await,
    );
    let (la, ta) = take(&a, "k").await;
    tokio::time::sleep(crate::store::DELETE_DELAY).await;
    let lb = Uuid::new_v4();
    wait(&b, "k", lb, "a", ta).await;
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let tb = handed(f, "k", ("b", lb), ta).await;
    let lb = confirm(&b, "k", lb, tb).await;
    // Nobody waits: the (old enough) lease's release deletes the document.
    tokio::time::sleep(crate::store::DELETE_DELAY).await;
    assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 1);
    assert!(f.raw("k").await.is_none());
}

pub(super) async fn a_handoff_is_announced_with_the_new_holders_owner_and_lease_ids<F: Fixture>(
    f: &F,
) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let mut writes = b.watch_releases(Announced::Writes);
    let opened = tokio::time::timeout(Duration::from_secs(30), writes.next()).await;
    assert!(
        matches!(opened, Ok(Some(Ok(Announcement::Opened)))),
        "{opened:?}"
    );
    let (la, ta) = take(&a, "k").await;
    let lb = Uuid::new_v4();
    wait(&b, "k", lb, "a", ta).await;
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let key = LeaseKey::from("k");
    let handed = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(item) = writes.next().await {
            match item.expect("the stream of writes") {
                // a's acquisition comes first, then the handoff.
                Announcement::Write(write) if write.key == key && write.lease_id == Some(lb) => {
                    return write;
                }
                _ => {}
            }
        }
        panic!("the stream of writes ended");
    })
    .await
    .expect("the handoff is announced");
    assert!(!handed.freed, "{handed:?}");
    assert_eq!(handed.owner.as_deref(), Some("b"));
    assert!(handed.keeps(lb, "b"));
    // With the handed lease's token, the one b's confirming retry gets.
    let tb = handed.token.expect("the handed token is announced");
    assert!(tb > ta, "{tb} > {ta}");
    confirm(&b, "k", lb, tb).await;
}

pub(super) async fn a_waiters_stream_announces_frees_and_handoffs_to_its_owner_alone<F: Fixture>(
    f: &F,
) {
    let [a, b, c] = stores(f, ["a", "b", "c"]).await;
    let mut writes = c.watch_releases(Announced::Waits);
    let opened = tokio::time::timeout(Duration::from_secs(30), writes.next()).await;
    assert!(
        matches!(opened, Ok(Some(Ok(Announcement::Opened)))),
        "{opened:?}"
    );
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut next = async || match tokio::time::timeout_at(give_up, writes.next()).await {
        Ok(Some(Ok(Announcement::Write(write)))) => write,
        other => panic!("{other:?}"),
    };
    let handoff = |write: &KeyWrite, key: &str, lease_id: Uuid, token: u64| {
        assert_eq!(
            (
                &write.key,
                write.freed,
                write.lease_id,
                write.owner.as_deref(),
                write.token
            ),
            (
                &LeaseKey::from(key),
                false,
                Some(lease_id),
                Some("c"),
                Some(token)
            ),
            "the handoff of {key:?} to c: {write:?}"
        );
    };
    // A small document: MongoDB logs the handoff as a replacement
    // (docs/mongodb-behaviour.md, B24). Announced to c, before c confirms.
    let (la, ta) = take(&a, "small").await;
    let lc = Uuid::new_v4();
    wait(&c, "small", lc, "a", ta).await;
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let tc = handed(f, "small", ("c", lc), ta).await;
    handoff(&next().await, "small", lc, tc);
    let small = confirm(&c, "small", lc, tc).await;

    // Another owner's acquisition, and a handoff to another owner: neither
    // is announced to c. With 20 more owners queued, MongoDB logs a
    // handoff as an update setting `aid`.
    let (la, ta) = take(&a, "k").await;
    let (lb, lc) = (Uuid::new_v4(), Uuid::new_v4());
    wait(&b, "k", lb, "a", ta).await;
    wait(&c, "k", lc, "a", ta).await;
    for i in 0..20 {
        let behind = f.store(&format!("w{i}")).await;
        wait(&behind, "k", Uuid::new_v4(), "a", ta).await;
    }
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let tb = handed(f, "k", ("b", lb), ta).await;
    let lb = confirm(&b, "k", lb, tb).await;
    // The handoff to c is announced, before c confirms it.
    assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 1);
    let tc = handed(f, "k", ("c", lc), tb).await;
    let mut seen = vec![next().await];
    // (The twin announces c's confirming retry of "small" too.)
    if seen[0].keeps(small.lease_id, "c") {
        seen = vec![next().await];
    }
    handoff(&seen[0], "k", lc, tc);
    let lc = confirm(&c, "k", lc, tc).await;
    // c's release of "k" hands it to the next owner (not announced); another
    // key acquired by another owner (not announced) and released
    // (announced).
    assert_eq!(c.release_by_id(vec![lc.clone()]).await.unwrap(), 1);
    let (l2, _) = take(&a, "k2").await;
    assert_eq!(a.release_by_id(vec![l2]).await.unwrap(), 1);
    let mut seen: Vec<KeyWrite> = Vec::new();
    while !seen.iter().any(|w| w.key == "k2") {
        seen.push(next().await);
    }
    // Before it, at most the twin's announcement of c's confirming retry.
    assert!(
        seen.iter()
            .all(|w| w.key == "k2" && w.freed || w.keeps(lc.lease_id, "c")),
        "only c's lease and the release of k2: {seen:?}"
    );
}

pub(super) async fn an_acquisition_is_announced_with_its_token<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let mut writes = a.watch_releases(Announced::Writes);
    let opened = tokio::time::timeout(Duration::from_secs(30), writes.next()).await;
    assert!(
        matches!(opened, Ok(Some(Ok(Announcement::Opened)))),
        "{opened:?}"
    );
    // An acquisition of a new key (an insert on MongoDB), its release, and
    // the acquisition of the released document (a replacement).
    let (l1, t1) = take(&a, "k").await;
    assert_eq!(a.release_by_id(vec![l1.clone()]).await.unwrap(), 1);
    let (l2, t2) = take(&a, "k").await;
    let key = LeaseKey::from("k");
    let mut seen: Vec<KeyWrite> = Vec::new();
    let give_up = tokio::time::Instant::now() + Duration::from_secs(30);
    while seen.len() < 3 {
        match tokio::time::timeout_at(give_up, writes.next()).await {
            Ok(Some(Ok(Announcement::Write(write)))) if write.key == key => seen.push(write),
            Ok(Some(Ok(_))) => {}
            other => panic!("after {seen:?}: {other:?}"),
        }
    }
    let read = |w: &KeyWrite| (w.freed, w.lease_id, w.token);
    assert_eq!(
        read(&seen[0]),
        (false, Some(l1.lease_id), Some(t1)),
        "{seen:?}"
    );
    assert!(seen[0].keeps(l1.lease_id, "a"), "{seen:?}");
    assert_eq!(read(&seen[1]), (true, None, None), "the release: {seen:?}");
    assert_eq!(
        read(&seen[2]),
        (false, Some(l2.lease_id), Some(t2)),
        "{seen:?}"
    );
    assert!(seen[2].keeps(l2.lease_id, "a"), "{seen:?}");
}

pub(super) async fn an_owner_that_leaves_the_queues_is_never_handed_a_key_and_the_others_keep_their_places<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b, c) = (f.store("a").await, f.store("b").await, f.store("c").await);
    let (la, ta) = take(&a, "k").await;
    let (_, _) = take(&a, "other").await;
    let (lb, lc) = (Uuid::new_v4(), Uuid::new_v4());
    wait(&b, "k", lb, "a", ta).await;
    wait(&c, "k", lc, "a", ta).await;
    assert_eq!(f.queue("k").await, owners(&["b", "c"]));

    // Only the documents naming b in their queue change; c keeps its place.
    assert_eq!(
        b.leave_queues(vec!["k".into(), "other".into(), "missing".into()])
            .await
            .unwrap(),
        1
    );
    assert_eq!(f.queue("k").await, owners(&["c"]));
    assert_eq!(
        b.leave_queues(vec!["k".into()]).await.unwrap(),
        0,
        "left once"
    );

    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    // Handed to c, not b.
    let token = handed(f, "k", ("c", lc), ta).await;
    confirm(&c, "k", lc, token).await;
}

pub(super) async fn beyond_the_bound_a_waiting_owner_does_not_register_until_an_entry_leaves<
    F: Fixture,
>(
    f: &F,
) {
    use crate::store::MAX_QUEUE;
    let [a, x, y] = stores(f, ["a", "x", "y"]).await;
    let (la, ta) = take(&a, "k").await;
    // The queue filled to its bound by distinct owners.
    let mut registered = Vec::new();
    for i in 0..MAX_QUEUE {
        let store = f.store(&format!("w{i:02}")).await;
        let lease_id = Uuid::new_v4();
        wait(&store, "k", lease_id, "a", ta).await;
        registered.push((store, lease_id));
    }
    let names: Vec<String> = (0..MAX_QUEUE).map(|i| format!("w{i:02}")).collect();
    assert_eq!(f.queue("k").await, names);

    // The next owner's waiting attempt is told who holds the key, as a
    // registering one is, but does not register.
    let lx = Uuid::new_v4();
    wait(&x, "k", lx, "a", ta).await;
    assert_eq!(f.queue("k").await, names, "an entry beyond the bound");

    // An owner already registered still refreshes its entry (another lease
    // id), in place: the release hands the key to it under that lease id.
    let (w00, _) = &registered[0];
    let l00 = Uuid::new_v4();
    wait(w00, "k", l00, "a", ta).await;
    assert_eq!(f.queue("k").await, names);
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let t00 = handed(f, "k", ("w00", l00), ta).await;
    confirm(w00, "k", l00, t00).await;

    // Its entry left: the next new owner registers, at the tail.
    assert_eq!(f.queue("k").await, names[1..]);
    wait(&x, "k", lx, "w00", t00).await;
    let mut names = names[1..].to_vec();
    names.push("x".into());
    assert_eq!(f.queue("k").await, names);

    // Full again: y does not register, and takes no key the queue keeps
    // for its head (w00's lease expired: the head, w01, may take it).
    let ly = Uuid::new_v4();
    wait(&y, "k", ly, "w00", t00).await;
    f.expire("k").await;
    wait(&y, "k", ly, "w01", t00).await;
    assert_eq!(f.queue("k").await, names, "an entry beyond the bound");
    let (w01, l01) = &registered[1];
    let t01 = match w01.attempt("k".into(), *l01, true).await {
        Ok(AcquireOutcome::Acquired { token }) if token > t00 => token,
        other => panic!("the head takes the free key kept for it: {other:?}"),
    };
    names.retain(|n| n != "w01");
    assert_eq!(f.queue("k").await, names);
    wait(&y, "k", ly, "w01", t01).await;
    names.push("y".into());
    assert_eq!(f.queue("k").await, names);
}

/// How many owners `store`'s attempt on `key` under `lease_id` is told are
/// ahead of it in the key's queue (it must find the key held).
async fn ahead(store: &impl Store, key: &str, lease_id: Uuid, waiting: bool) -> u32 {
    match store.attempt(key.into(), lease_id, waiting).await {
        Ok(AcquireOutcome::Held { ahead, .. }) => ahead,
        other => panic!("an attempt on {key:?} held by another owner: {other:?}"),
    }
}

pub(super) async fn a_waiting_attempt_is_told_how_many_owners_are_ahead_of_it<F: Fixture>(f: &F) {
    let [a, b, c, d, e] = stores(f, ["a", "b", "c", "d", "e"]).await;
    let (la, ta) = take(&a, "k").await;
    let (lb, lc, ld) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
    // Registering attempts, in arrival order; refreshes keep the places.
    assert_eq!(ahead(&b, "k", lb, true).await, 0);
    assert_eq!(ahead(&c, "k", lc, true).await, 1);
    assert_eq!(ahead(&d, "k", ld, true).await, 2);
    assert_eq!(ahead(&d, "k", ld, true).await, 2);
    assert_eq!(ahead(&b, "k", lb, true).await, 0);
    // An owner with no entry (a try registers nothing) has all of them
    // ahead.
    assert_eq!(ahead(&e, "k", Uuid::new_v4(), false).await, 3);
    assert_eq!(f.queue("k").await, owners(&["b", "c", "d"]));
    // The release hands the key to b: c is next, d behind it.
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let tb = handed(f, "k", ("b", lb), ta).await;
    assert_eq!(ahead(&d, "k", ld, true).await, 1);
    assert_eq!(ahead(&c, "k", lc, true).await, 0);
    // The holder's retry is granted, not told a place.
    confirm(&b, "k", lb, tb).await;
}
