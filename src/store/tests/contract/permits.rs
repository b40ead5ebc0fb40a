//! Several permits of a semaphore key in one lease ("Shared and semaphore
//! keys" in `store`): all or none, counted in the one conditional write; a
//! retry gets them back; renewal and release are per lease.

use crate::store::StoreExt;

use super::kinds::{held_as, take_as};
use super::{Fixture, retry_as, stores};
use crate::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::{AcquireOutcome, Store};

/// `k` permits of a semaphore of `n`.
fn permits(n: u32, k: u32) -> LeaseShape {
    LeaseShape {
        kind: LeaseKind::Permit { permits: n },
        hold_at_least: None,
        permits_taken: Some(k),
    }
}

/// The permits each live holder of `key` takes, oldest first.
async fn taken(store: &impl Store, key: &str) -> Vec<(String, u32)> {
    let info = store
        .inspect(key.into())
        .await
        .unwrap()
        .expect("a document");
    let holders = info.holders.iter();
    holders.map(|h| (h.owner_id.clone(), h.permits)).collect()
}

pub(super) async fn a_lease_takes_k_permits_all_or_none<F: Fixture>(f: &F) {
    let [a, b, c] = stores(f, ["a", "b", "c"]).await;
    let (la, _) = take_as(&a, "k", permits(3, 2)).await;
    // 2 of 3 taken: 2 more are not there, and nothing is written.
    held_as(&b, "k", permits(3, 2), true, "a").await;
    assert_eq!(taken(&c, "k").await, [("a".to_string(), 2)]);
    // One is.
    let (lc, _) = take_as(&c, "k", permits(3, 1)).await;
    assert_eq!(taken(&c, "k").await, [("a".into(), 2), ("c".into(), 1)]);
    held_as(&b, "k", permits(3, 1), true, "c").await;

    // A retry under the same lease id gets its permits back, whatever the others.
    let retry = retry_as(&a, &la, permits(3, 2)).await;
    assert!(
        matches!(retry, AcquireOutcome::Acquired { .. }),
        "{retry:?}"
    );
    assert!(a.renew(vec![la.clone()]).await.unwrap().is_empty());

    // Released as one: 2 free again, taken at once by b's 2.
    assert_eq!(a.release(vec![la]).await.unwrap(), 1);
    let (lb, _) = take_as(&b, "k", permits(3, 2)).await;
    assert_eq!(taken(&b, "k").await, [("c".into(), 1), ("b".into(), 2)]);
    // A single permit of the same number counts as one.
    held_as(&a, "k", permits(3, 1), false, "b").await;
    assert_eq!(b.release(vec![lb]).await.unwrap(), 1);
    assert_eq!(c.release(vec![lc]).await.unwrap(), 1);
    // All of them at once on a free key.
    take_as(&a, "k", permits(3, 3)).await;
    held_as(&b, "k", permits(3, 1), false, "a").await;
}
