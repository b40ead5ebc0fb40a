//! Delete-on-release mode (`ReleaseMode::Delete`) and release by owner id.
//!
//! Delete mode's rule is about time: a release deletes the document only
//! once the server's clock is [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) past the token's
//! acquisition. The scenarios that need an old token wait [`DELETE_DELAY`]
//! (that rule's own duration, not a synchronisation); every verdict is a
//! count or a document read afterwards.

use crate::store::OverrideEnd;
use std::time::Instant;

use uuid::Uuid;

use super::{Fixture, assert_held, held, lease, raw, take, yielded};
use crate::config::DELETE_MIN_TOKEN_AGE;
use crate::store::{AcquireOutcome, DELETE_DELAY, StoreExt};

/// How long the four racers of
/// [`delete_mode_tokens_strictly_increase_over_tight_acquire_release_cycles`]
/// may take for their acquisitions before the scenario fails, rather
/// than spin for ever if a released key stayed held: 80x the 0.4 s they
/// took on a real `mongod` here.
const RACE_HANG: std::time::Duration = std::time::Duration::from_secs(30);

/// Acquisitions each racer makes in the race of four owners on one key.
const RACE_EACH: usize = 15;
/// Tight acquire-release cycles per round, alternating two owners.
const TIGHT_CYCLES: usize = 50;

/// Waits until every token issued so far is old enough to be deleted.
async fn age_tokens() {
    tokio::time::sleep(DELETE_DELAY).await;
}

pub(super) async fn delete_mode_release_deletes_the_document_once_its_token_is_old_enough<
    F: Fixture,
>(
    f: &F,
) {
    let a = f.delete_mode_store("a").await;
    // A lease older than DELETE_MIN_TOKEN_AGE: one release deletes it.
    let (l1, _) = take(&a, "old").await;
    age_tokens().await;
    assert_eq!(a.release_by_id(vec![l1.clone()]).await.unwrap(), 1);
    assert_eq!(
        f.raw("old").await,
        None,
        "released old lease deleted at once"
    );
    assert_eq!(
        a.release_by_id(vec![l1]).await.unwrap(),
        0,
        "released only once"
    );

    // A young lease: marked released, kept until its token is old enough.
    // Young for sure if its acquire and release took less than
    // DELETE_MIN_TOKEN_AGE here (the token's age by the server's clock at the
    // release is at most that); on a slower run the release may delete it.
    let started = Instant::now();
    let (l2, t2) = take(&a, "young").await;
    assert_eq!(a.release_by_id(vec![l2]).await.unwrap(), 1);
    let young = started.elapsed() < DELETE_MIN_TOKEN_AGE;
    if young {
        let kept = raw(f, "young").await;
        assert_eq!((kept.lease_id, kept.token, kept.expired), (None, t2, true));
        assert_eq!(a.delete_released(vec!["young".into()]).await.unwrap(), 0);
        assert!(f.raw("young").await.is_some(), "too young to delete");
    }
    age_tokens().await;
    let deleted = a.delete_released(vec!["young".into()]).await.unwrap();
    assert!(
        deleted == 1 || (!young && deleted == 0),
        "deleted {deleted}"
    );
    assert_eq!(f.raw("young").await, None);

    // A batch: old ones deleted, young ones kept released.
    let (l3, _) = take(&a, "b1").await;
    age_tokens().await;
    let started = Instant::now();
    let (l4, t4) = take(&a, "b2").await;
    assert_eq!(a.release_by_id(vec![l3, l4]).await.unwrap(), 2);
    assert_eq!(f.raw("b1").await, None);
    if started.elapsed() < DELETE_MIN_TOKEN_AGE {
        assert_eq!(raw(f, "b2").await.lease_id, None);
        assert_eq!(raw(f, "b2").await.token, t4);
    } else if f.raw("b2").await.is_some() {
        assert_eq!(
            raw(f, "b2").await.lease_id,
            None,
            "released, if not deleted"
        );
    }

    // The follow-up delete never touches a document acquired again.
    let (l5, t5) = take(&a, "b2").await;
    assert!(t5 > t4);
    age_tokens().await;
    assert_eq!(a.delete_released(vec!["b2".into()]).await.unwrap(), 0);
    assert_held(&raw(f, "b2").await, "a", &l5, t5);

    // Keep mode ignores the follow-up delete.
    let keep = f.store("k").await;
    let (l6, _) = take(&keep, "keep").await;
    age_tokens().await;
    assert_eq!(keep.release_by_id(vec![l6]).await.unwrap(), 1);
    assert_eq!(keep.delete_released(vec!["keep".into()]).await.unwrap(), 0);
    assert_eq!(raw(f, "keep").await.lease_id, None, "keep mode keeps it");
}

/// `Release::LeaseTooYoungToDelete` (a lease acquired less than `DELETE_DELAY` ago by
/// the manager's clock): only marked released, whatever its token's age by
/// the server's clock, and the follow-up delete removes it once its token is
/// old enough; the next acquisition in between continues from its token.
pub(super) async fn delete_mode_release_of_a_young_lease_only_marks_it_released<F: Fixture>(f: &F) {
    let (a, b) = (
        f.delete_mode_store("a").await,
        f.delete_mode_store("b").await,
    );
    let (l1, t1) = take(&a, "young").await;
    assert_eq!(a.release_too_young_to_delete(l1.clone()).await.unwrap(), 1);
    let kept = raw(f, "young").await;
    assert_eq!((kept.lease_id, kept.token, kept.expired), (None, t1, true));
    assert_eq!(
        a.release_too_young_to_delete(l1).await.unwrap(),
        0,
        "released only once"
    );
    let (l2, t2) = take(&b, "young").await;
    assert!(t2 > t1, "the next token continues from the kept one");
    // An old token too: never deleted by this release.
    age_tokens().await;
    assert_eq!(b.release_too_young_to_delete(l2).await.unwrap(), 1);
    assert_eq!(raw(f, "young").await.lease_id, None);
    assert_eq!(raw(f, "young").await.token, t2);
    assert_eq!(b.delete_released(vec!["young".into()]).await.unwrap(), 1);
    assert_eq!(f.raw("young").await, None, "the follow-up deletes it");
    // A lease lost to another owner: nothing released.
    let (l3, _) = take(&a, "lost").await;
    f.expire("lost").await;
    let (l4, t4) = take(&b, "lost").await;
    assert_eq!(a.release_too_young_to_delete(l3).await.unwrap(), 0);
    assert_held(&raw(f, "lost").await, "b", &l4, t4);
}

pub(super) async fn delete_mode_release_of_a_lost_lease_deletes_nothing<F: Fixture>(f: &F) {
    let (a, b) = (
        f.delete_mode_store("a").await,
        f.delete_mode_store("b").await,
    );
    let (la, _) = take(&a, "k").await;
    f.expire("k").await;
    let (lb, tb) = take(&b, "k").await;
    age_tokens().await;
    // A's lease was lost to B: its release (one lease, then a batch) and the
    // follow-up delete leave B's lease alone.
    assert_eq!(a.release_by_id(vec![la.clone()]).await.unwrap(), 0);
    let batch = vec![la, lease("x", Uuid::new_v4())];
    assert_eq!(a.release_by_id(batch).await.unwrap(), 0);
    assert_eq!(a.delete_released(vec!["k".into()]).await.unwrap(), 0);
    assert_held(&raw(f, "k").await, "b", &lb, tb);
    // A document of foreign layout is never deleted.
    f.put_foreign("foreign", "java-app-1").await;
    assert_eq!(a.delete_released(vec!["foreign".into()]).await.unwrap(), 0);
    assert!(f.foreign_unchanged("foreign").await);
}

pub(super) async fn delete_mode_tokens_strictly_increase_over_tight_acquire_release_cycles<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b) = (
        f.delete_mode_store("a").await,
        f.delete_mode_store("b").await,
    );
    // Four owners race on one key, each releasing at once what it gets:
    // acquisitions follow each other as fast as the server allows, often in
    // the same server millisecond. A token is recorded while its lease is
    // held, so the record is in acquisition order.
    let order = std::sync::Mutex::new(Vec::new());
    let mut racers = Vec::new();
    for owner in ["r1", "r2", "r3", "r4"] {
        racers.push(f.delete_mode_store(owner).await);
    }
    let race = futures::future::join_all(racers.iter().map(|store| async {
        let mut acquired = 0;
        while acquired < RACE_EACH {
            let lease_id = Uuid::new_v4();
            match store.attempt("race".into(), lease_id, false).await.unwrap() {
                AcquireOutcome::Acquired { token } => {
                    order.lock().unwrap().push(token);
                    assert_eq!(
                        store
                            .release_by_id(vec![lease("race", lease_id)])
                            .await
                            .unwrap(),
                        1
                    );
                    acquired += 1;
                }
                AcquireOutcome::Held { .. } => tokio::task::yield_now().await,
                other => panic!("unexpected outcome {other:?}"),
            }
        }
    }));
    let started = Instant::now();
    // A hang guard only: a released key is free at once, so each attempt
    // that finds it held waits for one racer's release only.
    if tokio::time::timeout(RACE_HANG, race).await.is_err() {
        panic!(
            "the racers got {} of {} acquisitions in {RACE_HANG:?}: a released key stays held",
            order.lock().unwrap().len(),
            4 * RACE_EACH
        );
    }
    eprintln!(
        "race of {} acquisitions: {:?}",
        4 * RACE_EACH,
        started.elapsed()
    );
    let order = order.into_inner().unwrap();
    assert_eq!(order.len(), 4 * RACE_EACH);
    for pair in order.windows(2) {
        assert!(pair[1] > pair[0], "token {} after {}", pair[1], pair[0]);
    }

    let mut last = 0;
    for round in 0..2 {
        // Tight cycles, alternating owners: young leases, documents kept.
        for i in 0..TIGHT_CYCLES {
            let store = if i % 2 == 0 { &a } else { &b };
            let (l, token) = take(store, "k").await;
            assert!(
                token > last,
                "round {round} cycle {i}: {token} after {last}"
            );
            last = token;
            assert_eq!(store.release_by_id(vec![l]).await.unwrap(), 1);
        }
        // Then a lease old enough to be deleted by its release, re-acquired
        // at once (often in the same server millisecond as the delete).
        let (l, token) = take(&a, "k").await;
        assert!(token > last);
        last = token;
        age_tokens().await;
        assert_eq!(a.release_by_id(vec![l]).await.unwrap(), 1);
        assert_eq!(f.raw("k").await, None, "round {round}: deleted");
        let (l, token) = take(&b, "k").await;
        assert!(
            token > last,
            "round {round}: {token} after a delete, last {last}"
        );
        last = token;
        assert_eq!(b.release_by_id(vec![l]).await.unwrap(), 1);
        // And a follow-up delete of a young released document.
        age_tokens().await;
        assert_eq!(b.delete_released(vec!["k".into()]).await.unwrap(), 1);
        let (l, token) = take(&a, "k").await;
        assert!(
            token > last,
            "round {round}: {token} after a follow-up delete"
        );
        last = token;
        assert_eq!(a.release_by_id(vec![l]).await.unwrap(), 1);
    }
}

pub(super) async fn delete_mode_release_of_a_waited_for_lease_yields_instead<F: Fixture>(f: &F) {
    let (a, b) = (
        f.delete_mode_store("a").await,
        f.delete_mode_store("b").await,
    );
    let (l1, t1) = take(&a, "k").await;
    age_tokens().await;
    held(&b, "k", true, "a").await;
    // A waiter that stopped retrying: its registration lapsed, so the
    // release yields instead of handing the key over ("Queue of waiting
    // owners" in `store`).
    f.lapse_registrations("k").await;
    assert_eq!(a.release_by_id(vec![l1]).await.unwrap(), 1);
    assert_eq!(
        raw(f, "k").await,
        yielded("a", t1),
        "kept and yielded to the waiting owner"
    );
    held(&a, "k", false, "a").await;
    let (l2, t2) = take(&b, "k").await;
    assert!(t2 > t1);
    assert_held(&raw(f, "k").await, "b", &l2, t2);
}

pub(super) async fn release_owner_releases_every_lease_of_that_owner_only<F: Fixture>(f: &F) {
    let (a, b, op) = (
        f.store("a").await,
        f.store("b").await,
        f.store("operator").await,
    );
    let (_, t1) = take(&a, "a1").await;
    let (_, _) = take(&a, "a2").await;
    let (la3, _) = take(&a, "a3").await;
    a.release_by_id(vec![la3]).await.unwrap();
    let (lb, tb) = take(&b, "b1").await;
    // Keep mode: both of a's unreleased leases are marked released.
    assert_eq!(
        op.release_owner("a".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        2
    );
    let r1 = raw(f, "a1").await;
    assert_eq!((r1.owner.as_str(), r1.lease_id, r1.token), ("a", None, t1));
    assert!(r1.expired);
    assert_eq!(raw(f, "a2").await.lease_id, None);
    assert_held(&raw(f, "b1").await, "b", &lb, tb);
    assert_eq!(
        op.release_owner("a".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        0
    );

    // Delete mode: old leases deleted at once, young ones before it returns.
    let del = f.delete_mode_store("operator").await;
    let (_, _) = take(&b, "b2").await;
    age_tokens().await;
    let (_, _) = take(&b, "b3").await;
    assert_eq!(
        del.release_owner("b".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        3
    );
    for key in ["b1", "b2", "b3"] {
        assert_eq!(f.raw(key).await, None, "{key} deleted");
    }
    assert!(
        f.raw("a1").await.is_some(),
        "another owner's documents stay"
    );
}
