//! Per-lease TTL: the TTL given with an acquire or a renewal batch is the one
//! stored (`exp = $$NOW + ttl`, `ts = $$NOW`), except that under one lease
//! id `exp` never moves back (`exp = max(exp, $$NOW + ttl)`, "Late writes"
//! in `store`).

use crate::store::StoreExt;
use std::time::Duration;

use uuid::Uuid;

use super::{Fixture, TTL, lease};
use crate::store::{AcquireOutcome, Store};

/// A TTL other than the stores' default.
const LEASE_TTL: Duration = Duration::from_millis(7_250);

pub(super) async fn an_acquire_with_a_ttl_stores_exp_that_far_after_ts<F: Fixture>(f: &F) {
    assert_ne!(LEASE_TTL, TTL);
    let a = f.store("a").await;
    let outcome = a
        .acquire_with_ttl("k".into(), Uuid::new_v4(), false, LEASE_TTL)
        .await
        .unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Acquired { .. }),
        "{outcome:?}"
    );
    assert_eq!(f.lifetime("k").await, LEASE_TTL);
    // The default TTL for comparison.
    assert!(matches!(
        a.attempt("d".into(), Uuid::new_v4(), false).await.unwrap(),
        AcquireOutcome::Acquired { .. }
    ));
    assert_eq!(f.lifetime("d").await, TTL);
}

pub(super) async fn a_renewal_batch_with_a_ttl_keeps_exp_that_far_after_ts<F: Fixture>(f: &F) {
    assert!(LEASE_TTL < TTL);
    let a = f.store("a").await;
    let (k1, k2) = (Uuid::new_v4(), Uuid::new_v4());
    for (key, id) in [("k1", k1), ("k2", k2)] {
        a.acquire_with_ttl(key.into(), id, false, LEASE_TTL)
            .await
            .unwrap();
    }
    let lost = a
        .renew_with_ttl(vec![lease("k1", k1), lease("k2", k2)], TTL)
        .await
        .unwrap();
    assert!(lost.is_empty(), "{lost:?}");
    for key in ["k1", "k2"] {
        assert_eq!(f.lifetime(key).await, TTL, "{key}");
    }
    // Back to the shorter TTL: `exp` stays where the longer one put it,
    // as a renewal of the shorter TTL landing late must leave it.
    let expiry = async || {
        a.inspect("k1".into())
            .await
            .unwrap()
            .expect("k1")
            .expires_at
    };
    let before = expiry().await;
    a.renew_with_ttl(vec![lease("k1", k1)], LEASE_TTL)
        .await
        .unwrap();
    assert_eq!(expiry().await, before);
    assert!(f.lifetime("k1").await > LEASE_TTL);
    assert_eq!(f.lifetime("k2").await, TTL);
}
