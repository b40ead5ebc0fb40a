//! Leader transitions ("Leader transitions" in `store`): every write that
//! makes a new holder counts a change of owner id, and only that.

use crate::store::StoreExt;

use uuid::Uuid;

use super::kinds::{shape, take_as};
use super::{Fixture, TTL, stores, take};
use crate::kind::LeaseKind;
use crate::store::light_acquire::{LightAcquire, LightAcquired};
use crate::store::{AcquireOutcome, HandoffOutcome, Store};

async fn transitions(store: &impl Store, key: &str) -> u64 {
    let info = store.inspect(key.into()).await.unwrap();
    info.expect("a lock document").transitions
}

pub(super) async fn transitions_count_the_acquisitions_by_another_owner<F: Fixture>(f: &F) {
    let [a, b, c] = stores(f, ["a", "b", "c"]).await;
    // A new document: 0; the same owner again, by the general form, the
    // light one and a local handoff: still 0.
    let (l, _) = take(&a, "k").await;
    assert_eq!(transitions(&a, "k").await, 0);
    assert_eq!(a.release_by_id(vec![l]).await.unwrap(), 1);
    let lease_id = Uuid::new_v4();
    let light = a
        .acquire_light(vec![LightAcquire {
            key: "k".into(),
            lease_id,
            ttl: TTL,
            started: tokio::time::Instant::now(),
        }])
        .await;
    assert!(
        matches!(light[..], [LightAcquired::Acquired(_)]),
        "{light:?}"
    );
    assert_eq!(transitions(&a, "k").await, 0);
    let to = Uuid::new_v4();
    let handed = a
        .handoff_to("k".into(), (lease_id, to), TTL, true)
        .await
        .unwrap();
    assert!(
        matches!(handed, HandoffOutcome::Acquired { .. }),
        "{handed:?}"
    );
    assert_eq!(transitions(&a, "k").await, 0);
    assert_eq!(
        a.release_by_id(vec![super::lease("k", to)]).await.unwrap(),
        1
    );

    // Another owner, by the light form: 1; its retry: still 1.
    let lease_id = Uuid::new_v4();
    let request = LightAcquire {
        key: "k".into(),
        lease_id,
        ttl: TTL,
        started: tokio::time::Instant::now(),
    };
    let light = b.acquire_light(vec![request]).await;
    assert!(
        matches!(light[..], [LightAcquired::Acquired(_)]),
        "{light:?}"
    );
    assert_eq!(transitions(&b, "k").await, 1);
    let retry = b.attempt("k".into(), lease_id, true).await.unwrap();
    assert!(
        matches!(retry, AcquireOutcome::Acquired { .. }),
        "{retry:?}"
    );
    assert_eq!(transitions(&b, "k").await, 1);

    // Handed to a registered owner in the releasing write: 2.
    let registered = Uuid::new_v4();
    let waited = c.attempt("k".into(), registered, true).await.unwrap();
    assert!(matches!(waited, AcquireOutcome::Held { .. }), "{waited:?}");
    assert_eq!(
        transitions(&c, "k").await,
        1,
        "a registration is no transition"
    );
    let released = b
        .release_by_id(vec![super::lease("k", lease_id)])
        .await
        .unwrap();
    assert_eq!(released, 1);
    assert_eq!(transitions(&c, "k").await, 2);

    // Taken after an expiry by the general form: 3.
    f.expire("k").await;
    take(&a, "k").await;
    assert_eq!(transitions(&a, "k").await, 3);

    // Every kind counts; a second holder of the owner of the last
    // acquisition is none.
    f.expire("k").await;
    take_as(&b, "k", shape(LeaseKind::Shared)).await;
    assert_eq!(transitions(&b, "k").await, 4);
    take_as(&b, "k", shape(LeaseKind::Shared)).await;
    assert_eq!(transitions(&b, "k").await, 4);
    take_as(&c, "k", shape(LeaseKind::Shared)).await;
    assert_eq!(transitions(&c, "k").await, 5);
}
