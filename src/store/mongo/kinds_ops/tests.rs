//! The renewal hint of holder leases ([`MongoStore`]'s `holder_ids`) on a
//! real `mongod`: it never keeps a lease that the actor dropped without a
//! release or a renewal (at its local deadline, after a force release).

use std::time::Duration;

use uuid::Uuid;

use super::MongoStore;
use crate::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::{AcquireOutcome, LeaseRef, Store};

/// The TTL of the scenario's leases.
const TTL: Duration = Duration::from_millis(200);

async fn take_permit(store: &MongoStore, key: &str) -> LeaseRef {
    let lease = LeaseRef {
        key: key.into(),
        lease_id: Uuid::new_v4(),
    };
    let shape = LeaseShape {
        kind: LeaseKind::Permit { permits: 2 },
        hold_at_least: None,
    };
    let outcome = store
        .acquire_shaped(lease.key.clone(), lease.lease_id, false, TTL, shape)
        .await
        .unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Acquired { .. }),
        "{outcome:?}"
    );
    lease
}

#[tokio::test]
async fn the_holder_hint_forgets_a_holder_lease_dropped_without_release_or_renewal() {
    let db = super::super::handle::shared_test_db().await;
    let (collection, store) = super::super::handle::test_store(&db, "hint", TTL);
    // A permit the actor drops at its local deadline: never renewed nor
    // released through the store again.
    let dropped = take_permit(&store, "k1").await;
    assert!(store.holder_ids().contains_key(&dropped.lease_id));
    // Two TTLs later (local clock), the next renewal batch forgets it,
    // while a holder lease it renews is kept.
    tokio::time::sleep(3 * TTL).await;
    let held = take_permit(&store, "k2").await;
    let lost = store.renew_with_ttl(vec![held.clone()], TTL).await.unwrap();
    assert_eq!(lost, Vec::new());
    let hint = store.holder_ids().clone();
    assert!(hint.contains_key(&held.lease_id), "{hint:?}");
    assert!(!hint.contains_key(&dropped.lease_id), "{hint:?}");
    db.collection::<mongodb::bson::Document>(&collection)
        .drop()
        .await
        .unwrap();
}
