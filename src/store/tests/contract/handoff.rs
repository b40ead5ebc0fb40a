//! The handoff to a local waiter ("Handoff to a local waiter" in `store`):
//! a new acquisition in the releasing write, or a release when another
//! owner waits, and nothing for a lease no longer held.

use crate::store::StoreExt;
use std::time::Duration;

use futures::StreamExt;
use mongodb::bson::doc;
use tokio::time::Instant;
use uuid::Uuid;

use super::{Fixture, TTL, assert_held, held, lease, raw, take, yielded};
use crate::key::LeaseKey;
use crate::kind::LeaseShape;
use crate::store::{Announced, Announcement, HandoffOutcome, KeyWrite, Store};

/// Hands the lease `from` of `key` to a new lease id (a plain lease, [`TTL`]).
async fn handoff(store: &impl Store, key: &str, from: Uuid) -> (Uuid, HandoffOutcome) {
    let to = Uuid::new_v4();
    let outcome = store
        .handoff_to(key.into(), (from, to), TTL, true)
        .await
        .unwrap();
    (to, outcome)
}

pub(super) async fn a_handoff_makes_the_waiter_the_holder_with_a_greater_token<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let (l1, t1) = take(&a, "k").await;
    assert!(a.set_payload(l1.clone(), doc! { "x": 1 }).await.unwrap());
    let (to, outcome) = handoff(&a, "k", l1.lease_id).await;
    let HandoffOutcome::Acquired { token: t2 } = outcome else {
        panic!("handed over: {outcome:?}");
    };
    assert!(t2 > t1, "{t2} > {t1}");
    let l2 = lease("k", to);
    let r = raw(f, "k").await;
    assert_eq!(r.payload, None, "a new acquisition starts without payload");
    assert_held(&r, "a", &l2, t2);
    // The old lease is gone: no renewal, release or second handoff.
    let lost: Vec<LeaseKey> = a.renew(vec![l1.clone()]).await.unwrap();
    assert_eq!(lost, vec![LeaseKey::from("k")]);
    assert_eq!(a.release_by_id(vec![l1.clone()]).await.unwrap(), 0);
    assert_eq!(handoff(&a, "k", l1.lease_id).await.1, HandoffOutcome::Lost);
    // The new one renews and releases as any lease.
    assert!(a.renew(vec![l2.clone()]).await.unwrap().is_empty());
    assert_eq!(a.release_by_id(vec![l2]).await.unwrap(), 1);
    let r = raw(f, "k").await;
    assert_eq!((r.lease_id, r.expired, r.token), (None, true, t2));
}

pub(super) async fn a_handoff_of_a_lease_taken_over_or_expired_is_lost<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (l1, t1) = take(&a, "k").await;
    f.expire("k").await;
    assert_eq!(handoff(&a, "k", l1.lease_id).await.1, HandoffOutcome::Lost);
    let r = raw(f, "k").await;
    assert_eq!(
        (r.lease_id, r.expired, r.token),
        (Some(l1.lease_id), true, t1)
    );
    let (lb, tb) = take(&b, "k").await;
    assert_eq!(handoff(&a, "k", l1.lease_id).await.1, HandoffOutcome::Lost);
    assert_held(&raw(f, "k").await, "b", &lb, tb);
    // Another owner's lease is never handed over by its lease id alone.
    assert_eq!(handoff(&a, "k", lb.lease_id).await.1, HandoffOutcome::Lost);
    assert_eq!(
        handoff(&a, "none", lb.lease_id).await.1,
        HandoffOutcome::Lost
    );
    assert_held(&raw(f, "k").await, "b", &lb, tb);
}

pub(super) async fn a_handoff_of_a_lease_another_owner_waits_for_yields_to_it<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (l1, t1) = take(&a, "k").await;
    held(&b, "k", true, "a").await;
    assert!(raw(f, "k").await.waiting);
    // A waiter that stopped retrying: its registration in the queue of
    // waiting owners lapsed, so the release yields (see `queue` for the
    // handoff to a live registration).
    f.lapse_registrations("k").await;
    assert_eq!(
        handoff(&a, "k", l1.lease_id).await.1,
        HandoffOutcome::Released
    );
    assert_eq!(raw(f, "k").await, yielded("a", t1));
    // Yielded: refused to its owner, taken by the waiting one.
    held(&a, "k", true, "a").await;
    let (_, tb) = take(&b, "k").await;
    assert!(tb > t1);
}

pub(super) async fn a_handoff_within_a_minimum_hold_releases_and_keeps_the_hold<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let shape = LeaseShape {
        hold_at_least: Some(Duration::from_secs(60)),
        ..LeaseShape::default()
    };
    let l1 = lease("k", Uuid::new_v4());
    let acquired = a.acquire_shaped("k".into(), l1.lease_id, false, TTL, shape);
    assert!(matches!(
        acquired.await.unwrap(),
        crate::store::AcquireOutcome::Acquired { .. }
    ));
    assert_eq!(
        handoff(&a, "k", l1.lease_id).await.1,
        HandoffOutcome::Released
    );
    let r = raw(f, "k").await;
    assert_eq!(
        (r.lease_id, r.expired),
        (None, false),
        "held until its hold"
    );
}

pub(super) async fn a_handoff_is_announced_as_a_new_lease_not_as_a_release<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let mut writes = b.watch_releases(Announced::Writes);
    // The stream opens in the background: wait for it to say so.
    let opened = tokio::time::timeout(Duration::from_secs(10), writes.next()).await;
    assert!(
        matches!(opened, Ok(Some(Ok(Announcement::Opened)))),
        "{opened:?}"
    );
    let (l1, t1) = take(&a, "k").await;
    let (to, outcome) = handoff(&a, "k", l1.lease_id).await;
    let HandoffOutcome::Acquired { token: t2 } = outcome else {
        panic!("handed over: {outcome:?}");
    };
    let (end, _) = take(&a, "end").await;
    assert_eq!(a.release_by_id(vec![end]).await.unwrap(), 1);

    let give_up = Instant::now() + Duration::from_secs(10);
    let mut seen: Vec<KeyWrite> = Vec::new();
    while !seen.iter().any(|w| w.key == "end" && w.freed) {
        let next = tokio::time::timeout_at(give_up, writes.next()).await;
        match next {
            Ok(Some(Ok(Announcement::Write(write)))) => seen.push(write),
            other => panic!("after {seen:?}: {other:?}"),
        }
    }
    let of_k: Vec<&KeyWrite> = seen.iter().filter(|w| w.key == "k").collect();
    assert_eq!(of_k.len(), 2, "{seen:?}");
    assert_eq!(
        (of_k[0].lease_id, of_k[0].token),
        (Some(l1.lease_id), Some(t1))
    );
    // MongoDB reports this small document's pipeline update as a
    // replacement (the owner id shown) or an update (not shown); either
    // way it sets the new lease id and frees nothing
    // (docs/mongodb-behaviour.md, B22).
    let handoff = of_k[1];
    assert_eq!(
        (handoff.freed, handoff.lease_id, handoff.token),
        (false, Some(to), Some(t2))
    );
    assert!(handoff.keeps(to, "a"), "{handoff:?}");
}

pub(super) async fn a_handoff_in_delete_mode_keeps_the_document<F: Fixture>(f: &F) {
    let a = f.delete_mode_store("a").await;
    let (l1, t1) = take(&a, "k").await;
    let (to, outcome) = handoff(&a, "k", l1.lease_id).await;
    let HandoffOutcome::Acquired { token: t2 } = outcome else {
        panic!("handed over: {outcome:?}");
    };
    assert!(t2 > t1);
    assert_held(&raw(f, "k").await, "a", &lease("k", to), t2);
}
