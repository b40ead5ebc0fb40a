//! The payload with the acquisition (`AcquireRequest::payload`): written by
//! the acquiring write itself, a retry under the same lease id included;
//! nothing of it written by an attempt that does not acquire; refused,
//! before anything is sent, for other kinds and for in-document leases.

use mongodb::bson::{Document, doc};
use uuid::Uuid;

use super::{Fixture, raw};
use crate::error::Error;
use crate::kind::{LeaseKind, LeaseShape};
use crate::store::{AcquireOutcome, AcquireRequest, Store, StoreExt};

/// An exclusive, waiting acquire of `key` under `lease_id` with `payload`.
async fn acquire_with(
    store: &impl Store,
    key: &str,
    lease_id: Uuid,
    shape: LeaseShape,
    payload: Option<Document>,
) -> crate::error::Result<AcquireOutcome> {
    let request = AcquireRequest {
        key: key.into(),
        lease_id,
        waiting: true,
        ttl: super::TTL,
        shape,
        create: None,
        payload,
    };
    store.acquire(request).await.map(|(outcome, _)| outcome)
}

pub(super) async fn an_acquisition_with_a_payload_writes_it_in_the_same_write<F: Fixture>(f: &F) {
    let [a, b] = super::stores(f, ["a", "b"]).await;
    let (first, mine) = (doc! { "addr": "10.0.0.7:8080" }, Uuid::new_v4());
    let shape = LeaseShape::default();
    let outcome = acquire_with(&a, "k", mine, shape, Some(first.clone())).await;
    assert!(
        matches!(outcome, Ok(AcquireOutcome::Acquired { .. })),
        "{outcome:?}"
    );
    assert_eq!(raw(f, "k").await.payload, Some(first.clone()));
    let info = a.inspect("k".into()).await.unwrap().expect("held");
    assert_eq!(info.payload, Some(first.clone()));

    // Another owner's attempt with its own payload does not acquire and
    // writes nothing of it.
    let theirs = doc! { "addr": "10.0.0.8:8080" };
    let outcome = acquire_with(&b, "k", Uuid::new_v4(), shape, Some(theirs.clone())).await;
    assert!(
        matches!(outcome, Ok(AcquireOutcome::Held { .. })),
        "{outcome:?}"
    );
    assert_eq!(raw(f, "k").await.payload, Some(first.clone()));

    // A retry under the same lease id without a payload keeps it; with
    // one, writes it.
    let outcome = acquire_with(&a, "k", mine, shape, None).await;
    assert!(
        matches!(outcome, Ok(AcquireOutcome::Acquired { .. })),
        "{outcome:?}"
    );
    assert_eq!(raw(f, "k").await.payload, Some(first));
    let second = doc! { "addr": "10.0.0.9:8080" };
    let outcome = acquire_with(&a, "k", mine, shape, Some(second.clone())).await;
    assert!(
        matches!(outcome, Ok(AcquireOutcome::Acquired { .. })),
        "{outcome:?}"
    );
    assert_eq!(raw(f, "k").await.payload, Some(second));

    // The next acquisition with a payload, after an expiry: its own.
    f.expire("k").await;
    let outcome = acquire_with(&b, "k", Uuid::new_v4(), shape, Some(theirs.clone())).await;
    assert!(
        matches!(outcome, Ok(AcquireOutcome::Acquired { .. })),
        "{outcome:?}"
    );
    assert_eq!(raw(f, "k").await.payload, Some(theirs));
    // And one without a payload starts without one.
    f.expire("k").await;
    let outcome = acquire_with(&a, "k", Uuid::new_v4(), shape, None).await;
    assert!(
        matches!(outcome, Ok(AcquireOutcome::Acquired { .. })),
        "{outcome:?}"
    );
    assert_eq!(raw(f, "k").await.payload, None);
}

pub(super) async fn a_payload_with_a_shared_or_document_acquisition_is_refused<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let shared = LeaseShape {
        kind: LeaseKind::Shared,
        ..LeaseShape::default()
    };
    let outcome = acquire_with(&a, "s", Uuid::new_v4(), shared, Some(doc! { "x": 1 })).await;
    assert!(
        matches!(outcome, Err(Error::Unsupported { .. })),
        "{outcome:?}"
    );
    assert!(f.raw("s").await.is_none(), "nothing was written");
    let documents = f.documents("a").await;
    let request = AcquireRequest {
        key: "d".into(),
        lease_id: Uuid::new_v4(),
        waiting: false,
        ttl: super::TTL,
        shape: LeaseShape::default(),
        create: None,
        payload: Some(doc! { "x": 1 }),
    };
    let outcome = documents.acquire(request).await;
    assert!(
        matches!(outcome, Err(Error::Unsupported { .. })),
        "{outcome:?}"
    );
    // The same store acquires without one.
    assert!(matches!(
        a.attempt("s".into(), Uuid::new_v4(), false).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
}

pub(super) async fn a_key_handed_to_a_waiting_owner_carries_the_payload_it_registered_with<
    F: Fixture,
>(
    f: &F,
) {
    let [a, b] = super::stores(f, ["a", "b"]).await;
    let (held, _) = super::take(&a, "k").await;
    let (theirs, waiting) = (doc! { "addr": "10.0.0.8:8080" }, Uuid::new_v4());
    let shape = LeaseShape::default();
    let outcome = acquire_with(&b, "k", waiting, shape, Some(theirs.clone())).await;
    assert!(
        matches!(outcome, Ok(AcquireOutcome::Held { .. })),
        "{outcome:?}"
    );
    assert_eq!(f.queue("k").await, vec!["b".to_string()]);
    assert_eq!(
        raw(f, "k").await.payload,
        None,
        "the holder's document is unchanged"
    );
    // The release hands the key to b's registration, with b's payload.
    assert_eq!(a.release_by_id(vec![held]).await.unwrap(), 1);
    let handed = raw(f, "k").await;
    assert_eq!(handed.owner, "b");
    assert_eq!(handed.lease_id, Some(waiting));
    assert_eq!(handed.payload, Some(theirs.clone()));
    // b's next attempt under that lease id confirms it, payload kept.
    let outcome = acquire_with(&b, "k", waiting, shape, Some(theirs.clone())).await;
    assert!(
        matches!(outcome, Ok(AcquireOutcome::Acquired { .. })),
        "{outcome:?}"
    );
    assert_eq!(raw(f, "k").await.payload, Some(theirs));

    // A registration without a payload hands over none.
    let (held, _) = super::take(&a, "n").await;
    let waiting = Uuid::new_v4();
    let outcome = acquire_with(&b, "n", waiting, shape, None).await;
    assert!(
        matches!(outcome, Ok(AcquireOutcome::Held { .. })),
        "{outcome:?}"
    );
    assert!(a.set_payload(held.clone(), doc! { "x": 1 }).await.unwrap());
    assert_eq!(a.release_by_id(vec![held]).await.unwrap(), 1);
    let handed = raw(f, "n").await;
    assert_eq!((handed.owner.as_str(), handed.payload), ("b", None));
}
