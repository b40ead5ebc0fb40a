//! Holding at least ("Holding at least" in `store`): an exclusive lease
//! acquired with `hold_at_least` keeps its key until acquisition + that
//! long by the server's clock, whatever its holder does.

use crate::store::OverrideEnd;
use crate::store::StoreExt;
use std::time::{Duration, SystemTime};

use uuid::Uuid;

use super::kinds::take_as;
use super::{Fixture, retry_as};
use crate::info::LeaseInfo;
use crate::kind::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::{AcquireOutcome, LeaseRef, Store};

/// How long the scenarios hold at least: longer than the stores' TTL.
const AT_LEAST: Duration = Duration::from_secs(90);

fn held_at_least(at_least: Duration) -> LeaseShape {
    LeaseShape {
        kind: LeaseKind::Exclusive,
        hold_at_least: Some(at_least),
        permits_taken: None,
    }
}

async fn info(store: &impl Store, key: &str) -> LeaseInfo {
    store
        .inspect(key.into())
        .await
        .unwrap()
        .expect("a document")
}

/// `until - now`, zero if past.
fn until(until: SystemTime, now: SystemTime) -> Duration {
    until.duration_since(now).unwrap_or_default()
}

/// An attempt by `store` on `key`, which must be held by `holder`, with a
/// remaining time between what reads just before and just after show.
async fn held_until_hold(store: &impl Store, key: &str, holder: &str) -> Duration {
    let before = info(store, key).await;
    let hold = before.hold_until.expect("a minimum hold");
    let outcome = store
        .attempt(key.into(), Uuid::new_v4(), true)
        .await
        .unwrap();
    let after = info(store, key).await;
    let AcquireOutcome::Held {
        holder: h,
        remaining: Some(remaining),
        ..
    } = outcome
    else {
        panic!("{key:?} held until its minimum hold: {outcome:?}");
    };
    assert_eq!(h, holder);
    let (most, least) = (
        until(hold, before.server_time),
        until(hold, after.server_time),
    );
    assert!(
        least <= remaining && remaining <= most,
        "held until hl: {least:?} <= {remaining:?} <= {most:?}"
    );
    remaining
}

pub(super) async fn a_lease_released_early_stays_held_until_its_minimum_hold<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, ta) = take_as(&a, "k", held_at_least(AT_LEAST)).await;
    let acquired = info(&a, "k").await;
    assert!(acquired.held);
    assert_eq!(
        acquired.hold_until,
        Some(acquired.acquired_at + AT_LEAST),
        "hl = acquisition + hold_at_least"
    );
    assert_eq!(acquired.expires_at, acquired.acquired_at + AT_LEAST);

    // A retry under the same lease id: the same token, the same hold.
    let again = retry_as(&a, &la, held_at_least(AT_LEAST)).await;
    assert_eq!(again, AcquireOutcome::Acquired { token: ta });
    assert_eq!(info(&a, "k").await.hold_until, acquired.hold_until);

    assert_eq!(a.release_by_id(vec![la.clone()]).await.unwrap(), 1);
    let released = info(&a, "k").await;
    assert!(released.held, "the key stays held until hl");
    assert_eq!(released.fencing_token, ta);
    assert_eq!(released.hold_until, acquired.hold_until);
    assert!(released.expires_at >= acquired.acquired_at + AT_LEAST);

    held_until_hold(&b, "k", "a").await;
    held_until_hold(&a, "k", "a").await;
    assert_eq!(a.renew(vec![la]).await.unwrap().len(), 1, "released");
}

pub(super) async fn a_lease_held_at_least_is_free_once_its_hold_has_passed<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, ta) = take_as(&a, "k", held_at_least(AT_LEAST)).await;
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    f.expire_hold("k").await;
    assert!(!info(&b, "k").await.held);
    let (_, tb) = super::take(&b, "k").await;
    assert!(tb > ta);
    let taken = info(&b, "k").await;
    assert_eq!(
        taken.hold_until, None,
        "an acquisition without it removes hl"
    );
    assert!(taken.expires_at < taken.acquired_at + AT_LEAST);

    // A crashed holder (never released): the key is free after its hold too.
    let (_, tc) = take_as(&a, "c", held_at_least(AT_LEAST)).await;
    f.expire("c").await;
    held_until_hold(&b, "c", "a").await;
    f.expire_hold("c").await;
    let (_, td) = super::take(&b, "c").await;
    assert!(td > tc);
}

pub(super) async fn renewal_never_lowers_the_expiry_below_the_minimum_hold<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let (la, _) = take_as(&a, "k", held_at_least(AT_LEAST)).await;
    let (lp, _) = super::take(&a, "plain").await;
    let before = info(&a, "k").await;
    let plain_before = info(&a, "plain").await;
    let lost = a
        .renew_with_ttl(vec![la.clone(), lp], Duration::from_secs(5))
        .await
        .unwrap();
    assert!(lost.is_empty());
    let after = info(&a, "k").await;
    assert!(
        after.expires_at >= before.hold_until.unwrap(),
        "exp = max(exp, now + ttl, hl)"
    );
    assert_eq!(after.expires_at, before.expires_at, "never back");
    assert!(after.renewed_at >= before.renewed_at);
    let plain = info(&a, "plain").await;
    assert_eq!(plain.expires_at, plain_before.expires_at, "never back");
    assert!(plain.hold_until.is_none());
}

pub(super) async fn force_release_frees_a_lease_held_at_least<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, ta) = take_as(&a, "k", held_at_least(AT_LEAST)).await;
    let forced = b
        .force_release("k".into(), OverrideEnd::Immediately)
        .await
        .unwrap()
        .expect("held");
    assert_eq!((forced.owner_id.as_str(), forced.fencing_token), ("a", ta));
    assert!(forced.hold_until.is_some());
    let freed = info(&b, "k").await;
    assert!(!freed.held && freed.hold_until.is_none());
    let (lb, tb): (LeaseRef, u64) = super::take(&b, "k").await;
    assert!(tb > ta);
    assert_eq!(a.renew(vec![la]).await.unwrap().len(), 1);
    assert!(b.renew(vec![lb]).await.unwrap().is_empty());

    // Also after an early release, while the key waits for its hold.
    let (lc, _) = take_as(&a, "r", held_at_least(AT_LEAST)).await;
    assert_eq!(a.release_by_id(vec![lc]).await.unwrap(), 1);
    assert!(
        b.force_release("r".into(), OverrideEnd::Immediately)
            .await
            .unwrap()
            .is_some()
    );
    super::take(&b, "r").await;
}

pub(super) async fn delete_mode_never_deletes_a_key_before_its_minimum_hold<F: Fixture>(f: &F) {
    let (keep, del) = (f.store("a").await, f.delete_mode_store("d").await);
    let (la, _) = take_as(&keep, "k", held_at_least(AT_LEAST)).await;
    // A token old enough for delete mode's rule (its own duration).
    tokio::time::sleep(crate::store::DELETE_DELAY).await;
    assert_eq!(keep.release_by_id(vec![la]).await.unwrap(), 1);
    assert_eq!(del.delete_released(vec!["k".into()]).await.unwrap(), 0);
    assert!(info(&del, "k").await.held);
    held_until_hold(&del, "k", "a").await;

    // Nor a release in delete mode itself, its token old enough (the
    // first write a release tries there is the delete): `hl` keeps the
    // document, marked released.
    let (ld, _) = take_as(&del, "m", held_at_least(AT_LEAST)).await;
    tokio::time::sleep(crate::store::DELETE_DELAY).await;
    assert_eq!(del.release_by_id(vec![ld]).await.unwrap(), 1);
    assert!(info(&keep, "m").await.held, "kept until its minimum hold");
    held_until_hold(&keep, "m", "d").await;
    // Nor an operator's immediate release by owner id without a
    // lock-delay, which deletes what it can at once: `hl` is not its to end.
    let (_, _) = take_as(&keep, "o", held_at_least(AT_LEAST)).await;
    tokio::time::sleep(crate::store::DELETE_DELAY).await;
    let ended = del
        .release_owner("a".into(), crate::store::OverrideEnd::Immediately)
        .await
        .unwrap();
    assert!(ended >= 1, "{ended}");
    held_until_hold(&del, "o", "a").await;
}
