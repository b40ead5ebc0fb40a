//! Several permits of a semaphore key in one lease ("Shared and semaphore
//! keys" in `store`): all or none, counted in the one conditional write; a
//! retry gets them back; renewal and release are per lease. The change of
//! the number of permits, only while no more are held.

use crate::store::StoreExt;

use super::kinds::{held_as, take_as};
use super::{Fixture, retry_as, stores};
use crate::error::Error;
use crate::kind::LeaseKind;
use crate::kind::{LeaseShape, PermitsChange};
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
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    let (lb, _) = take_as(&b, "k", permits(3, 2)).await;
    assert_eq!(taken(&b, "k").await, [("c".into(), 1), ("b".into(), 2)]);
    // A single permit of the same number counts as one.
    held_as(&a, "k", permits(3, 1), false, "b").await;
    assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 1);
    assert_eq!(c.release_by_id(vec![lc]).await.unwrap(), 1);
    // All of them at once on a free key.
    take_as(&a, "k", permits(3, 3)).await;
    held_as(&b, "k", permits(3, 1), false, "a").await;
}

pub(super) async fn the_number_of_permits_changes_only_when_no_more_are_held<F: Fixture>(f: &F) {
    let [a, b, c] = stores(f, ["a", "b", "c"]).await;
    let kind = |n| LeaseKind::Permit { permits: n };
    assert_eq!(
        a.set_permits("k".into(), 2).await.unwrap(),
        PermitsChange::NothingHeld,
        "no document"
    );
    let (la, _) = take_as(&a, "k", permits(3, 2)).await;
    let (lc, _) = take_as(&c, "k", permits(3, 1)).await;
    // 3 held: not 2.
    assert_eq!(
        b.set_permits("k".into(), 2).await.unwrap(),
        PermitsChange::TooManyHeld { held: 3 }
    );
    assert_eq!(b.inspect("k".into()).await.unwrap().unwrap().kind, kind(3));
    // 2 held: 2 it is. The old number is another kind now; the new one is full.
    assert_eq!(c.release_by_id(vec![lc]).await.unwrap(), 1);
    assert_eq!(
        b.set_permits("k".into(), 2).await.unwrap(),
        PermitsChange::Set
    );
    assert_eq!(b.inspect("k".into()).await.unwrap().unwrap().kind, kind(2));
    let (_, outcome) = super::kinds::attempt(&c, "k", permits(3, 1), true).await;
    assert!(
        matches!(outcome, AcquireOutcome::Mismatch { stored } if stored == kind(2)),
        "{outcome:?}"
    );
    held_as(&c, "k", permits(2, 1), true, "c").await;
    // Grown to 4: two more at once; a's lease holds on through it.
    assert_eq!(
        c.set_permits("k".into(), 4).await.unwrap(),
        PermitsChange::Set
    );
    let (lb, _) = take_as(&b, "k", permits(4, 2)).await;
    assert!(a.renew(vec![la.clone()]).await.unwrap().is_empty());
    assert_eq!(taken(&c, "k").await, [("a".into(), 2), ("b".into(), 2)]);
    // Nothing held (expired): nothing stored.
    f.expire_holder("k", la.lease_id).await;
    f.expire_holder("k", lb.lease_id).await;
    assert_eq!(
        c.set_permits("k".into(), 1).await.unwrap(),
        PermitsChange::NothingHeld
    );
    // Held as another kind: a mismatch; a bad number: refused.
    take_as(&a, "s", super::kinds::shape(LeaseKind::Shared)).await;
    match c.set_permits("s".into(), 2).await {
        Err(Error::KindMismatch { stored, .. }) => assert_eq!(stored, LeaseKind::Shared),
        other => panic!("{other:?}"),
    }
    super::take(&a, "x").await;
    match c.set_permits("x".into(), 2).await {
        Err(Error::KindMismatch { stored, .. }) => assert_eq!(stored, LeaseKind::Exclusive),
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        c.set_permits("k".into(), 0).await,
        Err(Error::InvalidConfig { .. })
    ));
}

pub(super) async fn a_retry_after_the_number_of_permits_changed_is_refused_while_others_hold<
    F: Fixture,
>(
    f: &F,
) {
    let [a, b] = stores(f, ["a", "b"]).await;
    let (la, ta) = take_as(&a, "k", permits(2, 1)).await;
    take_as(&b, "k", permits(2, 1)).await;
    assert_eq!(
        b.set_permits("k".into(), 3).await.unwrap(),
        PermitsChange::Set
    );
    // a's entry is a permit of 3 now: a retry asking for 2 is refused, and
    // neither renews the entry nor turns the key back to 2 permits.
    let before = a.inspect("k".into()).await.unwrap().unwrap();
    let retry = retry_as(&a, &la, permits(2, 1)).await;
    let stored = LeaseKind::Permit { permits: 3 };
    assert_eq!(retry, AcquireOutcome::OursAsAnotherKind { stored });
    let after = a.inspect("k".into()).await.unwrap().unwrap();
    assert_eq!(after.kind, stored);
    assert_eq!(after.holders, before.holders, "nothing written");
    // Asking for 3, it is a retry as before: the same entry, renewed (and
    // now the latest).
    let retry = retry_as(&a, &la, permits(3, 1)).await;
    assert_eq!(retry, AcquireOutcome::Acquired { token: ta });
    assert_eq!(taken(&a, "k").await, [("b".into(), 1), ("a".into(), 1)]);
    // The key's latest acquisition is still b's (the top owner id, token
    // and transitions).
    let info = a.inspect("k".into()).await.unwrap().unwrap();
    let latest = (info.owner_id.as_str(), info.fencing_token, info.transitions);
    assert_eq!(latest, ("b", before.fencing_token, before.transitions));
}
