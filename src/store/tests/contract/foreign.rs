//! Other applications' lock documents: foreign holders' locks are read as
//! held, never modified, and deleted only by a force release.

use crate::store::StoreExt;
use std::time::Duration;

use uuid::Uuid;

use super::{Fixture, TTL, lease, take};
use crate::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::{AcquireOutcome, Store};

pub(super) async fn inspect_and_list_show_a_foreign_lock_as_held_by_its_foreign_holder<
    F: Fixture,
>(
    f: &F,
) {
    let a = f.store("a").await;
    f.put_foreign("f", "java-app-1").await;
    let info = a
        .inspect("f".into())
        .await
        .unwrap()
        .expect("a foreign lock");
    assert!(info.held && info.foreign, "{info:?}");
    assert_eq!(
        (
            info.key.as_str().unwrap(),
            info.owner_id.as_str(),
            info.fencing_token
        ),
        ("f", "java-app-1", 0)
    );
    // Its `ts`, written "now" by the other application: a server time near
    // the read's (the bound only turns a wrong field into a failure).
    let skew = |a: std::time::SystemTime, b: std::time::SystemTime| {
        a.duration_since(b)
            .or_else(|_| b.duration_since(a))
            .unwrap()
    };
    assert!(skew(info.renewed_at, info.server_time) < Duration::from_secs(60));
    assert_eq!(info.acquired_at, info.renewed_at);
    assert_eq!(info.expires_at, info.server_time, "expiry unknown");
    assert_eq!(info.time_to_expiry(), Duration::MAX);
    assert_eq!(info.payload, None);

    take(&a, "g").await;
    let (page, next) = a.list(None, 10).await.unwrap();
    assert_eq!(next, None);
    let seen: Vec<_> = page
        .iter()
        .map(|i| {
            (
                i.key.as_str().unwrap(),
                i.owner_id.as_str(),
                i.held,
                i.foreign,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [("f", "java-app-1", true, true), ("g", "a", true, false)]
    );
    assert_eq!(page[0].renewed_at, info.renewed_at);
    assert!(f.foreign_unchanged("f").await);
}

pub(super) async fn force_release_deletes_a_foreign_lock<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    f.put_foreign("f", "java-app-1").await;
    let before = a.force_release("f".into()).await.unwrap();
    let before = before.expect("the foreign lock, as it was");
    assert!(before.foreign && before.held);
    assert_eq!(before.owner_id, "java-app-1");
    assert_eq!(f.raw("f").await, None);
    assert!(!f.foreign_unchanged("f").await);
    assert_eq!(a.inspect("f".into()).await.unwrap(), None);
    // Free now: the next acquisition is ours.
    take(&a, "f").await;
}

pub(super) async fn release_by_owner_never_touches_a_foreign_document_with_the_same_aid<
    F: Fixture,
>(
    f: &F,
) {
    let a = f.store("java-app-1").await;
    f.put_foreign("f", "java-app-1").await;
    let (l, _) = take(&a, "ours").await;
    assert_eq!(a.release_all(Vec::new()).await.unwrap(), 1);
    assert!(f.foreign_unchanged("f").await);
    // Nor do renewal, release and payload under any lease id.
    let stray = lease("f", Uuid::new_v4());
    assert_eq!(a.renew(vec![stray.clone()]).await.unwrap(), ["f"]);
    assert_eq!(a.release(vec![stray.clone()]).await.unwrap(), 0);
    let payload = mongodb::bson::doc! { "x": 1 };
    assert!(!a.set_payload(stray, payload).await.unwrap());
    assert!(f.foreign_unchanged("f").await);
    assert_eq!(a.release(vec![l]).await.unwrap(), 0, "released already");
}

/// A bare `{_id}` (another application's lock by an upsert of `_id` alone,
/// released by a delete) is never taken, by any kind of acquisition, nor
/// marked; reads show it held by a foreign holder of owner id `""`, and a
/// force release deletes it.
pub(super) async fn a_bare_id_document_is_a_foreign_holders_lock_of_every_kind<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    f.put_bare("b").await;
    let foreign = AcquireOutcome::Held {
        holder: String::new(),
        remaining: None,
        token: None,
    };
    let shapes = [
        LeaseShape::default(),
        LeaseShape {
            kind: LeaseKind::Exclusive,
            hold_at_least: Some(Duration::from_secs(1)),
            permits_taken: None,
        },
        LeaseShape {
            kind: LeaseKind::Shared,
            hold_at_least: None,
            permits_taken: None,
        },
        LeaseShape {
            kind: LeaseKind::Permit { permits: 2 },
            hold_at_least: None,
            permits_taken: None,
        },
    ];
    for shape in shapes {
        for waiting in [false, true] {
            let outcome = a
                .acquire_shaped("b".into(), Uuid::new_v4(), waiting, TTL, shape)
                .await
                .unwrap();
            assert_eq!(outcome, foreign, "{shape:?}, waiting: {waiting}");
            assert!(
                f.foreign_unchanged("b").await,
                "{shape:?}, waiting: {waiting}"
            );
        }
    }
    assert_eq!(a.release_all(Vec::new()).await.unwrap(), 0);
    assert_eq!(a.release_by_owner(String::new()).await.unwrap(), 0);
    assert_eq!(
        a.release(vec![lease("b", Uuid::new_v4())]).await.unwrap(),
        0
    );
    assert!(f.foreign_unchanged("b").await);

    let info = a
        .inspect("b".into())
        .await
        .unwrap()
        .expect("a foreign lock");
    assert!(info.held && info.foreign, "{info:?}");
    assert_eq!((info.owner_id.as_str(), info.fencing_token), ("", 0));
    assert_eq!(info.expires_at, info.server_time, "expiry unknown");
    let (page, _) = a.list(None, 10).await.unwrap();
    let seen: Vec<_> = page
        .iter()
        .map(|i| (i.key.clone(), i.owner_id.as_str(), i.held, i.foreign))
        .collect();
    assert_eq!(seen, [(info.key.clone(), "", true, true)]);

    let before = a.force_release("b".into()).await.unwrap();
    let before = before.expect("the bare lock, as it was");
    assert!(before.foreign && before.held && before.owner_id.is_empty());
    assert_eq!(f.raw("b").await, None);
    take(&a, "b").await;
}
