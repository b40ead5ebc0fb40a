//! In-document leases: the place [`Store::documents`] opens on a user
//! collection (the lock fields under [`FIELD`] of each user document).
//!
//! Every acquire passes `create: Some({})`, so that a missing user document
//! is created on MongoDB (the twin treats every document as existing). The
//! twin does not apply the user's updates: the scenarios assert only what
//! both stores do (the outcome of a write, and its release as the next
//! acquire sees it).

use crate::store::StoreExt;
use std::collections::BTreeSet;

use mongodb::bson::doc;
use tokio::time::Instant;
use uuid::Uuid;

use super::{FIELD, Fixture, TTL, lease};
use crate::config::DELETE_MIN_TOKEN_AGE;
use crate::key::LeaseKey;
use crate::store::{AcquireOutcome, DELETE_DELAY, DocumentWrite, LeaseRef, Store};

/// Acquires the document `key` under a new lease id, creating the document
/// if it is missing, which must succeed; checks the lock field of the
/// document returned and returns the lease and its token.
async fn take(store: &dyn Store, owner: &str, key: impl Into<LeaseKey>) -> (LeaseRef, u64) {
    let key = &key.into();
    let lease_id = Uuid::new_v4();
    let acquired = store
        .acquire_document(key.clone(), lease_id, false, TTL, Some(doc! {}))
        .await;
    let Ok((AcquireOutcome::Acquired { token }, Some(document))) = acquired else {
        panic!("acquiring {key:?}: {acquired:?}");
    };
    let lock = document.get_document(FIELD).expect("the lock field");
    assert_eq!(document.get("_id"), Some(&key.to_bson()), "{document}");
    assert_eq!(lock.get_str("aid"), Ok(owner), "{document}");
    assert_eq!(lock.get_i64("tok"), Ok(token as i64), "{document}");
    (lease(key, lease_id), token)
}

/// Acquires the document `key` under a new lease id, which must find its
/// lease held by `holder`.
async fn held(store: &dyn Store, key: impl Into<LeaseKey>, holder: &str) {
    let key = &key.into();
    let outcome = store
        .acquire_document(key.clone(), Uuid::new_v4(), false, TTL, Some(doc! {}))
        .await;
    match outcome {
        Ok((
            AcquireOutcome::Held {
                holder: h,
                remaining: Some(remaining),
                ..
            },
            _,
        )) if h == holder && remaining <= TTL => {}
        other => panic!("acquiring {key:?} held by {holder:?}: {other:?}"),
    }
}

/// A write of `{$set: {n}}` under a lease, releasing it if `release`.
fn set_n(n: i32, release: bool) -> DocumentWrite {
    DocumentWrite {
        update: doc! { "$set": { "n": n } }.into(),
        release,
        // Only a hint (the server's clock decides whether the lock field
        // goes): true of every lease here, acquired just before.
        too_young_to_delete: true,
    }
}

pub(super) async fn acquiring_a_free_document_takes_it_and_a_second_owner_finds_it_held<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b) = (f.documents("a").await, f.documents("b").await);
    let (_, token) = take(&*a, "a", "d").await;
    assert!(token > 0);
    held(&*b, "d", "a").await;
    // Another document is a lease of its own.
    let (_, other) = take(&*b, "b", "e").await;
    assert!(other > 0);
    held(&*a, "e", "b").await;
}

pub(super) async fn document_renewal_reports_exactly_the_leases_taken_over<F: Fixture>(f: &F) {
    let (a, b) = (f.documents("a").await, f.documents("b").await);
    let mut leases = Vec::new();
    for key in ["d1", "d2", "d3", "d4"] {
        leases.push(take(&*a, "a", key).await.0);
    }
    // d2: taken over after expiry; d3: released; d4: expired, not taken
    // (still ours: renewal does not judge expiry).
    f.expire_document("d2").await;
    let (_, tb) = take(&*b, "b", "d2").await;
    assert!(tb > 0);
    assert_eq!(a.release_by_id(vec![leases[2].clone()]).await.unwrap(), 1);
    f.expire_document("d4").await;

    let lost: BTreeSet<LeaseKey> = a.renew(leases.clone()).await.unwrap().into_iter().collect();
    assert_eq!(lost, BTreeSet::from(["d2".into(), "d3".into()]));

    held(&*b, "d1", "a").await;
    held(&*a, "d2", "b").await;
    held(&*b, "d4", "a").await;
    // Lost stays lost.
    let lost = a.renew(vec![leases[1].clone()]).await.unwrap();
    assert_eq!(lost, vec![LeaseKey::from("d2")]);
}

pub(super) async fn a_released_document_lease_is_taken_with_a_greater_token_also_after_its_removal<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b) = (f.documents("a").await, f.documents("b").await);
    let (la, ta) = take(&*a, "a", "d").await;
    assert_eq!(a.release_by_id(vec![la.clone()]).await.unwrap(), 1);
    assert_eq!(
        a.release_by_id(vec![la]).await.unwrap(),
        0,
        "released only once"
    );
    let started = Instant::now();
    let (lb, tb) = take(&*b, "b", "d").await;
    assert!(tb > ta, "{tb} after {ta}");

    // A young lease's release leaves the lock field released; once the
    // token is old enough (DELETE_DELAY: that rule's own duration), the
    // follow-up removes it, and the next acquisition still gets a greater
    // token. Young for sure if acquire and release took less than
    // DELETE_MIN_TOKEN_AGE here; on a slower run the release may have
    // removed the field itself.
    assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 1);
    let young = started.elapsed() < DELETE_MIN_TOKEN_AGE;
    tokio::time::sleep(DELETE_DELAY).await;
    let removed = b.delete_released(vec!["d".into()]).await.unwrap();
    assert!(
        removed == 1 || (!young && removed == 0),
        "removed {removed}"
    );
    assert_eq!(
        b.delete_released(vec!["d".into()]).await.unwrap(),
        0,
        "removed only once"
    );
    let (lc, tc) = take(&*a, "a", "d").await;
    assert!(tc > tb, "{tc} after {tb}");

    // The follow-up never touches a lock field acquired again.
    tokio::time::sleep(DELETE_DELAY).await;
    assert_eq!(b.delete_released(vec!["d".into()]).await.unwrap(), 0);
    assert_eq!(a.renew(vec![lc]).await.unwrap(), Vec::<LeaseKey>::new());
    held(&*b, "d", "a").await;
}

pub(super) async fn a_document_write_applies_only_under_the_held_lease<F: Fixture>(f: &F) {
    let (a, b) = (f.documents("a").await, f.documents("b").await);
    let (la, ta) = take(&*a, "a", "d").await;
    assert!(
        a.write_document(la.clone(), ta, set_n(1, false))
            .await
            .unwrap()
            .is_some()
    );
    // A lease id that does not hold the document; the holding lease id
    // under another owner id.
    let unknown = lease("d", Uuid::new_v4());
    assert_eq!(
        a.write_document(unknown, ta, set_n(2, false))
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        b.write_document(la.clone(), ta, set_n(3, false))
            .await
            .unwrap(),
        None
    );
    held(&*b, "d", "a").await;

    // A write that releases: the lease is no longer held, and the next
    // acquisition gets a greater token.
    assert!(
        a.write_document(la.clone(), ta, set_n(4, true))
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(
        a.write_document(la, ta, set_n(5, false)).await.unwrap(),
        None
    );
    let (_, tb) = take(&*b, "b", "d").await;
    assert!(tb > ta, "{tb} after {ta}");
}
