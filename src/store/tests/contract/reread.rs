//! What a re-read after an acquire whose outcome is unknown proves
//! (`store::replies`): a lease of ours that only a read shows is never
//! `Acquired` (its expiry is unknown: a handoff's `hx`, an earlier
//! attempt's TTL, or past), and a `Held` answer from a read carries no
//! token (it never orders a handoff after the attempt). The same holds
//! for in-document leases (`Store::documents`).

use crate::store::StoreExt;
use mongodb::bson::doc;
use uuid::Uuid;

use super::kinds::shape;
use super::{Fixture, TTL, raw, stores, take};
use crate::kind::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::AcquireOutcome;

pub(super) async fn a_handed_lease_confirmed_only_by_a_read_is_never_acquired<F: Fixture>(f: &F) {
    let [a, b] = stores(f, ["a", "b"]).await;
    let (la, ta) = take(&a, "k").await;
    let lb = Uuid::new_v4();
    match b.attempt("k".into(), lb, true).await {
        Ok(AcquireOutcome::Held { holder, .. }) if holder == "a" => {}
        other => panic!("b waits for a: {other:?}"),
    }
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let handed = raw(f, "k").await;
    assert_eq!(
        (handed.owner.as_str(), handed.lease_id),
        ("b", Some(lb)),
        "handed to b's registration in the release"
    );
    assert!(handed.token > ta);
    let plain = LeaseShape::default();
    assert_eq!(
        f.reread(&b, "k", lb, plain).await,
        AcquireOutcome::Unconfirmed {
            token: handed.token
        },
        "a read does not prove the handed lease's expiry"
    );
    // A write under that lease id confirms it; a read still never does.
    assert_eq!(
        b.attempt("k".into(), lb, true).await.unwrap(),
        AcquireOutcome::Acquired {
            token: handed.token
        }
    );
    assert_eq!(
        f.reread(&b, "k", lb, plain).await,
        AcquireOutcome::Unconfirmed {
            token: handed.token
        }
    );
}

pub(super) async fn an_expired_entry_of_ours_in_a_multi_holder_key_is_not_acquired<F: Fixture>(
    f: &F,
) {
    let [a, b] = stores(f, ["a", "b"]).await;
    let permit = shape(LeaseKind::Permit { permits: 2 });
    let acquire = |store: &F::Store, lease_id| {
        store.acquire_shaped("k".into(), lease_id, false, store.default_ttl(), permit)
    };
    let (la, lb) = (Uuid::new_v4(), Uuid::new_v4());
    let AcquireOutcome::Acquired { token: ta } = acquire(&a, la).await.unwrap() else {
        panic!("a's permit");
    };
    let AcquireOutcome::Acquired { token: tb } = acquire(&b, lb).await.unwrap() else {
        panic!("b's permit");
    };
    f.expire_holder("k", la).await;
    assert_eq!(
        f.reread(&a, "k", la, permit).await,
        AcquireOutcome::Unconfirmed { token: ta },
        "an expired entry of ours is not acquired"
    );
    assert_eq!(
        f.reread(&b, "k", lb, permit).await,
        AcquireOutcome::Unconfirmed { token: tb },
        "nor is a live one that only a read shows"
    );
    // A retry's write renews the expired entry: acquired again, same token.
    assert_eq!(
        acquire(&a, la).await.unwrap(),
        AcquireOutcome::Acquired { token: ta }
    );
}

pub(super) async fn a_held_answer_from_a_read_carries_no_token<F: Fixture>(f: &F) {
    let [a, b] = stores(f, ["a", "b"]).await;
    let (_la, _) = take(&a, "k").await;
    match f
        .reread(&b, "k", Uuid::new_v4(), LeaseShape::default())
        .await
    {
        AcquireOutcome::Held {
            holder,
            remaining: Some(_),
            token: None,
            ..
        } if holder == "a" => {}
        other => panic!("held by a, without a token: {other:?}"),
    }
}

pub(super) async fn an_in_document_lease_confirmed_only_by_a_read_is_never_acquired<F: Fixture>(
    f: &F,
) {
    let a = f.documents("a").await;
    let la = Uuid::new_v4();
    let acquire = || a.acquire_document("d".into(), la, false, TTL, Some(doc! {}));
    let Ok((AcquireOutcome::Acquired { token }, _)) = acquire().await else {
        panic!("a's lease on the document");
    };
    assert_eq!(
        f.reread_document("a", "d", la).await,
        AcquireOutcome::Unconfirmed { token },
        "a read does not prove the lease's expiry"
    );
    match f.reread_document("b", "d", Uuid::new_v4()).await {
        AcquireOutcome::Held {
            holder,
            remaining: Some(_),
            token: None,
            ..
        } if holder == "a" => {}
        other => panic!("held by a, without a token: {other:?}"),
    }
    f.expire_document("d").await;
    assert_eq!(
        f.reread_document("a", "d", la).await,
        AcquireOutcome::Unconfirmed { token },
        "nor is an expired lease of ours acquired"
    );
    // A retry's write renews it: acquired again, same token.
    assert!(matches!(
        acquire().await,
        Ok((AcquireOutcome::Acquired { token: t }, Some(_))) if t == token
    ));
}
