//! Writes under a held lease id: renewal and payload.

use crate::store::StoreExt;
use std::collections::BTreeSet;

use mongodb::bson::doc;
use uuid::Uuid;

use super::{Fixture, assert_held, lease, raw, take};
use crate::key::LeaseKey;
use crate::store::{AcquireOutcome, LeaseRef, Store};

pub(super) async fn renewal_reports_exactly_the_lost_keys<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let mut leases = Vec::new();
    for key in ["k1", "k2", "k3", "k4", "k5"] {
        leases.push(take(&a, key).await);
    }
    // k2: taken over after expiry; k3: expired and deleted; k4: released;
    // k5: expired, not taken (still ours: renewal does not judge expiry).
    f.expire("k2").await;
    let (lb, tb) = take(&b, "k2").await;
    f.expire("k3").await;
    f.delete("k3").await;
    assert_eq!(a.release_by_id(vec![leases[3].0.clone()]).await.unwrap(), 1);
    f.expire("k5").await;

    let refs: Vec<LeaseRef> = leases.iter().map(|(l, _)| l.clone()).collect();
    let lost: BTreeSet<LeaseKey> = a.renew(refs).await.unwrap().into_iter().collect();
    assert_eq!(
        lost,
        BTreeSet::from(["k2".into(), "k3".into(), "k4".into()])
    );

    for i in [0, 4] {
        let (l, t) = &leases[i];
        assert_held(&raw(f, &l.key).await, "a", l, *t);
    }
    assert_held(&raw(f, "k2").await, "b", &lb, tb);
    assert_eq!(f.raw("k3").await, None);
    let k4 = raw(f, "k4").await;
    assert_eq!(
        (k4.lease_id, k4.expired),
        (None, true),
        "a released lease stays released"
    );

    // All kept: nothing lost.
    let kept = vec![leases[0].0.clone(), leases[4].0.clone()];
    assert!(a.renew(kept).await.unwrap().is_empty());
}

pub(super) async fn payload_is_set_only_under_the_holding_lease_id<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, ta) = take(&a, "k").await;
    let payload = doc! { "progress": 1, "note": "half way" };
    assert!(a.set_payload(la.clone(), payload.clone()).await.unwrap());
    assert_eq!(raw(f, "k").await.payload.as_ref(), Some(&payload));
    let info = a.inspect("k".into()).await.unwrap().unwrap();
    assert_eq!(info.payload.as_ref(), Some(&payload));

    // Under a wrong lease id: refused, unchanged.
    let wrong = lease("k", Uuid::new_v4());
    assert!(!a.set_payload(wrong, doc! { "progress": 2 }).await.unwrap());
    assert_eq!(raw(f, "k").await.payload.as_ref(), Some(&payload));

    // A retry of the acquisition keeps it; a new acquisition drops it.
    let retry = a.attempt("k".into(), la.lease_id, false).await.unwrap();
    assert_eq!(retry, AcquireOutcome::Acquired { token: ta });
    assert_eq!(raw(f, "k").await.payload.as_ref(), Some(&payload));
    f.expire("k").await;
    let (lb, tb) = take(&b, "k").await;
    assert_eq!(raw(f, "k").await.payload, None);
    assert!(!a.set_payload(la, doc! { "progress": 3 }).await.unwrap());
    assert_held(&raw(f, "k").await, "b", &lb, tb);
    assert_eq!(raw(f, "k").await.payload, None);
}
