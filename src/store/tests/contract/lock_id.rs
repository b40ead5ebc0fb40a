//! In-document leases with `LockId` / `LockTime` kept at the top
//! ([`Fixture::documents_with_lock_id`]), beside another client that locks
//! the same documents by those fields ([`Fixture::client_lock`],
//! [`Fixture::client_unlock`]; on MongoDB its exact commands).

use std::time::Duration;

use mongodb::bson::doc;
use uuid::Uuid;

use super::{Fixture, TTL, lease};
use crate::key::LeaseKey;
use crate::store::{AcquireOutcome, DocumentWrite, LeaseRef, Store, StoreExt};

/// The other client's `maxDuration`: at least the lease's [`TTL`].
const MAX: Duration = Duration::from_secs(60);

/// More than [`MAX`], in ms: a clock that far behind writes a lock already
/// expired; that far ahead, it takes over a lease renewed just before.
const PAST_MAX_MS: i64 = MAX.as_millis() as i64 + 10_000;

/// An acquire of the document `key` under a new lease id (creating it if
/// missing): its lease, and the outcome.
async fn attempt(store: &dyn Store, key: &str) -> (LeaseRef, AcquireOutcome) {
    let key = LeaseKey::from(key);
    let lease_id = Uuid::new_v4();
    let (outcome, _) = store
        .acquire_document(key.clone(), lease_id, false, TTL, Some(doc! {}))
        .await
        .expect("acquire");
    (lease(key, lease_id), outcome)
}

/// [`attempt`], which must acquire: the lease and its token.
async fn take(store: &dyn Store, key: &str) -> (LeaseRef, u64) {
    match attempt(store, key).await {
        (lease, AcquireOutcome::Acquired { token }) => (lease, token),
        (_, other) => panic!("acquiring {key:?}: {other:?}"),
    }
}

fn write(release: bool) -> DocumentWrite {
    DocumentWrite {
        update: doc! { "$set": { "n": 1 } }.into(),
        release,
        too_young_to_delete: true,
    }
}

pub(super) async fn documents_locked_by_lock_id_exclude_the_other_client_both_ways<F: Fixture>(
    f: &F,
) {
    let a = f.documents_with_lock_id("a", MAX).await;
    // Held by us: the client's lock fails.
    let (held, token) = take(&*a, "d").await;
    assert_eq!(f.client_lock("d", 0, MAX).await, None);
    // The commit frees it for the client at once.
    let committed = a.write_document(held, token, write(true)).await.unwrap();
    assert!(committed.is_some(), "committed under the lease");
    let theirs = f
        .client_lock("d", 0, MAX)
        .await
        .expect("free to the client after the commit");
    // Held by the client for about MAX, by its LockId, with no token.
    match attempt(&*a, "d").await {
        (
            _,
            AcquireOutcome::Held {
                holder,
                remaining: Some(remaining),
                token: None,
                ..
            },
        ) if holder == theirs.to_string()
            && remaining > MAX - Duration::from_secs(10)
            && remaining <= MAX + Duration::from_millis(1) => {}
        (_, other) => panic!("held by the client's {theirs} for about {MAX:?}: {other:?}"),
    }
    // Its unlock frees it for us; our release frees it for the client.
    assert!(f.client_unlock("d", theirs).await);
    let (held, _) = take(&*a, "d").await;
    assert_eq!(a.release_by_id(vec![held]).await.unwrap(), 1);
    assert!(
        f.client_lock("d", 0, MAX).await.is_some(),
        "free after release"
    );
}

pub(super) async fn a_client_lock_expired_by_its_rule_is_taken_over_and_a_client_takeover_ends_our_lease<
    F: Fixture,
>(
    f: &F,
) {
    let a = f.documents_with_lock_id("a", MAX).await;
    // A lock whose LockTime is more than MAX old: taken over at once.
    let old = f.client_lock("e", -PAST_MAX_MS, MAX).await.expect("free");
    let (held, token) = take(&*a, "e").await;
    assert!(!f.client_unlock("e", old).await, "its late unlock misses");
    assert_eq!(f.client_lock("e", 0, MAX).await, None, "held by us");
    // A client whose clock runs ahead by more than MAX takes it over: every
    // write of ours conditional on the lease misses from then on.
    let theirs = f
        .client_lock("e", PAST_MAX_MS, MAX)
        .await
        .expect("taken over");
    let lost = a.renew_with_ttl(vec![held.clone()], TTL).await.unwrap();
    assert_eq!(lost, vec![held.clone()], "the renewal misses");
    let written = a.write_document(held.clone(), token, write(false)).await;
    assert_eq!(written.unwrap(), None, "the write under the lease misses");
    assert!(!a.set_payload(held.clone(), doc! { "p": 1 }).await.unwrap());
    assert_eq!(
        a.release_by_id(vec![held]).await.unwrap(),
        0,
        "the release misses"
    );
    assert!(
        f.client_unlock("e", theirs).await,
        "the client's lock is intact"
    );
    let (_, next) = take(&*a, "e").await;
    assert!(next > token, "the token rule continues: {next} > {token}");
}
