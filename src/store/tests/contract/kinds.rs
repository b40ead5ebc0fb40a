//! Shared and semaphore keys ("Shared and semaphore keys" in `store`):
//! permits, shared holders, the exclusive waiter's mark, kind mismatches,
//! renewal and release of one holder among several, and what is announced.

use crate::store::OverrideEnd;
use crate::store::StoreExt;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use uuid::Uuid;

use super::{Fixture, lease, retry_as};
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::{AcquireOutcome, Announced, Announcement, KeyWrite, LeaseRef, Store};

/// A lease of `kind`, without a minimum hold.
pub(super) fn shape(kind: LeaseKind) -> LeaseShape {
    LeaseShape {
        kind,
        hold_at_least: None,
        permits_taken: None,
    }
}

/// A permit of a semaphore of `n`.
fn permit(n: u32) -> LeaseShape {
    shape(LeaseKind::Permit { permits: n })
}

/// A shared lease.
fn shared() -> LeaseShape {
    shape(LeaseKind::Shared)
}

/// An attempt to acquire `key` as `shape` under a new lease id, with the
/// store's TTL; returns the lease it would be and the outcome.
pub(super) async fn attempt(
    store: &impl Store,
    key: &str,
    shape: LeaseShape,
    waiting: bool,
) -> (LeaseRef, AcquireOutcome) {
    attempt_for(store, key, shape, waiting, store.default_ttl()).await
}

/// [`attempt`] with the TTL `ttl`.
async fn attempt_for(
    store: &impl Store,
    key: &str,
    shape: LeaseShape,
    waiting: bool,
    ttl: Duration,
) -> (LeaseRef, AcquireOutcome) {
    let l = LeaseRef {
        kind: shape.kind,
        ..lease(key, Uuid::new_v4())
    };
    let outcome = store
        .acquire_shaped(l.key.clone(), l.lease_id, waiting, ttl, shape)
        .await
        .unwrap_or_else(|e| panic!("acquiring {key:?} as {shape:?}: {e}"));
    (l, outcome)
}

/// Acquires `key` as `shape`, which must succeed; the lease and its token.
pub(super) async fn take_as(store: &impl Store, key: &str, shape: LeaseShape) -> (LeaseRef, u64) {
    match attempt(store, key, shape, false).await {
        (l, AcquireOutcome::Acquired { token }) => (l, token),
        (_, other) => panic!("acquiring {key:?} as {shape:?}: {other:?}"),
    }
}

/// Acquires `key` as `shape`, which must find it held by `holder`; the
/// remaining time reported.
pub(super) async fn held_as(
    store: &impl Store,
    key: &str,
    shape: LeaseShape,
    waiting: bool,
    holder: &str,
) -> Duration {
    match attempt(store, key, shape, waiting).await {
        (
            _,
            AcquireOutcome::Held {
                holder: h,
                remaining: Some(remaining),
                ..
            },
        ) if h == holder => remaining,
        (_, other) => panic!("acquiring {key:?} as {shape:?}, held by {holder:?}: {other:?}"),
    }
}

/// Acquires `key` as `shape`, which must be refused as held as `stored`.
async fn mismatch(store: &impl Store, key: &str, shape: LeaseShape, stored: LeaseKind) {
    let (_, outcome) = attempt(store, key, shape, true).await;
    assert_eq!(
        outcome,
        AcquireOutcome::Mismatch { stored },
        "{shape:?} on {key:?}"
    );
}

/// The owner ids of `key`'s live holders, oldest first, and its kind.
async fn holders(store: &impl Store, key: &str) -> (LeaseKind, Vec<String>) {
    let info = store
        .inspect(key.into())
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("no document for {key:?}"));
    (
        info.kind,
        info.holders.into_iter().map(|h| h.owner_id).collect(),
    )
}

pub(super) async fn a_semaphore_admits_n_holders_then_is_held_until_the_earliest_expiry<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b, c) = (f.store("a").await, f.store("b").await, f.store("c").await);
    // The first permit expires well before the second (10 s vs the 30 s TTL).
    let (_, first) = attempt_for(&a, "k", permit(2), false, Duration::from_secs(10)).await;
    assert!(
        matches!(first, AcquireOutcome::Acquired { .. }),
        "{first:?}"
    );
    take_as(&b, "k", permit(2)).await;
    let before = a.inspect("k".into()).await.unwrap().unwrap();
    assert_eq!(before.kind, LeaseKind::Permit { permits: 2 });
    assert!(before.held);
    let earliest = before.holders[0].expires_at;
    assert!(earliest < before.holders[1].expires_at);

    let remaining = held_as(&c, "k", permit(2), false, "b").await;
    let bound = earliest.duration_since(before.server_time).unwrap();
    assert!(
        remaining <= bound && remaining > Duration::ZERO,
        "held until the earliest live holder's expiry: {remaining:?} (at most {bound:?})"
    );
    assert_eq!(holders(&c, "k").await.1, ["a", "b"], "nothing written");
}

pub(super) async fn a_crashed_holders_permit_comes_back_after_its_ttl<F: Fixture>(f: &F) {
    let (a, b, c) = (f.store("a").await, f.store("b").await, f.store("c").await);
    let (la, ta) = take_as(&a, "k", permit(2)).await;
    let (lb, tb) = take_as(&b, "k", permit(2)).await;
    held_as(&c, "k", permit(2), false, "b").await;

    f.expire_holder("k", la.lease_id).await;
    let (lc, tc) = take_as(&c, "k", permit(2)).await;
    assert!(tc > tb && tb > ta);
    assert_eq!(
        holders(&c, "k").await,
        (
            LeaseKind::Permit { permits: 2 },
            vec!["b".into(), "c".into()]
        )
    );
    assert_eq!(
        a.renew(vec![la.clone()]).await.unwrap(),
        vec![la.key.clone()]
    );
    assert!(b.renew(vec![lb]).await.unwrap().is_empty());
    assert!(c.renew(vec![lc]).await.unwrap().is_empty());
}

pub(super) async fn a_semaphore_of_another_number_or_kind_is_a_mismatch<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let stored = LeaseKind::Permit { permits: 2 };
    let (la, _) = take_as(&a, "k", permit(2)).await;
    mismatch(&b, "k", permit(3), stored).await;
    mismatch(&b, "k", shared(), stored).await;
    mismatch(&b, "k", shape(LeaseKind::Exclusive), stored).await;
    assert_eq!(holders(&b, "k").await, (stored, vec!["a".into()]));

    // Once every permit is free, the next acquisition stores its own number.
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    take_as(&b, "k", permit(3)).await;
    assert_eq!(
        holders(&b, "k").await,
        (LeaseKind::Permit { permits: 3 }, vec!["b".into()])
    );

    // A shared key refuses permits and the other way round.
    let (s, _) = take_as(&a, "s", shared()).await;
    mismatch(&b, "s", permit(2), LeaseKind::Shared).await;
    assert_eq!(a.release_by_id(vec![s]).await.unwrap(), 1);
    take_as(&b, "s", permit(2)).await;

    // A live exclusive holder: a mismatch for permits; shared holders wait.
    super::take(&a, "x").await;
    mismatch(&b, "x", permit(2), LeaseKind::Exclusive).await;
    held_as(&b, "x", shared(), true, "a").await;
}

pub(super) async fn fencing_tokens_strictly_increase_across_permits_and_after_all_were_released<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let mut last = 0;
    for round in 0..3 {
        let (la, ta) = take_as(&a, "k", permit(2)).await;
        let (lb, tb) = take_as(&b, "k", permit(2)).await;
        assert!(ta > last && tb > ta, "round {round}: {last} < {ta} < {tb}");
        let info = a.inspect("k".into()).await.unwrap().unwrap();
        assert_eq!(info.fencing_token, tb, "the top token is the latest");
        assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
        assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 1);
        last = tb;
    }
    // An exclusive acquisition after the permits goes on counting.
    let (_, t) = super::take(&a, "k").await;
    assert!(t > last);
}

pub(super) async fn a_retry_under_the_same_lease_id_gets_the_same_permit_back<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let (la, ta) = take_as(&a, "k", permit(1)).await;
    let again = retry_as(&a, &la, permit(1)).await;
    assert_eq!(again, AcquireOutcome::Acquired { token: ta });
    assert_eq!(holders(&a, "k").await.1, ["a"], "one entry, not two");
}

pub(super) async fn renewal_of_two_permits_of_one_key_reports_exactly_the_one_taken_over<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (l1, _) = take_as(&a, "k", permit(2)).await;
    let (l2, _) = take_as(&a, "k", permit(2)).await;
    let (other, _) = take_as(&a, "x", shape(LeaseKind::Exclusive)).await;
    assert!(
        a.renew(vec![l1.clone(), l2.clone(), other.clone()])
            .await
            .unwrap()
            .is_empty()
    );

    f.expire_holder("k", l1.lease_id).await;
    take_as(&b, "k", permit(2)).await;
    let lost = a
        .renew_with_ttl(vec![l1.clone(), l2.clone(), other], a.default_ttl())
        .await
        .unwrap();
    assert_eq!(lost, vec![l1]);
    assert_eq!(holders(&a, "k").await.1, ["a", "b"]);
}

pub(super) async fn release_of_one_permit_keeps_the_other<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, _) = take_as(&a, "k", permit(2)).await;
    let (lb, _) = take_as(&b, "k", permit(2)).await;
    assert_eq!(a.release_by_id(vec![la.clone()]).await.unwrap(), 1);
    assert_eq!(a.release_by_id(vec![la.clone()]).await.unwrap(), 0, "once");
    let info = b.inspect("k".into()).await.unwrap().unwrap();
    assert!(info.held);
    assert_eq!(info.holders.len(), 1);
    assert_eq!(info.holders[0].owner_id, "b");
    assert_eq!(info.expires_at, info.holders[0].expires_at);
    assert_eq!(a.renew(vec![la]).await.unwrap().len(), 1, "no revival");
    assert!(b.renew(vec![lb.clone()]).await.unwrap().is_empty());

    // The last release frees the key: an exclusive acquisition takes it.
    assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 1);
    let info = b.inspect("k".into()).await.unwrap().unwrap();
    assert!(!info.held && info.holders.is_empty());
    assert_eq!(info.kind, LeaseKind::Exclusive, "no holders, no permits");
    super::take(&a, "k").await;
}

pub(super) async fn a_shared_key_admits_many_holders_and_excludes_an_exclusive_one<F: Fixture>(
    f: &F,
) {
    let x = f.store("x").await;
    let mut leases = Vec::new();
    for owner in ["a", "b", "c", "a"] {
        let store = f.store(owner).await;
        leases.push((store.clone(), take_as(&store, "k", shared()).await.0));
    }
    assert_eq!(
        holders(&x, "k").await,
        (
            LeaseKind::Shared,
            ["a", "b", "c", "a"].map(String::from).to_vec()
        )
    );
    let remaining = held_as(&x, "k", shape(LeaseKind::Exclusive), false, "a").await;
    assert!(remaining > Duration::ZERO);
    assert_eq!(holders(&x, "k").await.1.len(), 4, "a try leaves no mark");

    // Batch release of one owner's two holders, in one call.
    let (store_a, l0) = leases[0].clone();
    let l3 = leases[3].1.clone();
    assert_eq!(store_a.release_by_id(vec![l0, l3]).await.unwrap(), 2);
    assert_eq!(holders(&x, "k").await.1, ["b", "c"]);
    for (store, l) in &leases[1..3] {
        assert_eq!(store.release_by_id(vec![l.clone()]).await.unwrap(), 1);
    }
    super::take(&x, "k").await;
    held_as(&store_a, "k", shared(), false, "x").await;
}

pub(super) async fn a_waiting_exclusive_mark_blocks_new_shared_holders_until_it_expires<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b, x) = (f.store("a").await, f.store("b").await, f.store("x").await);
    let ttl = x.default_ttl();
    let (la, _) = take_as(&a, "k", shared()).await;
    let remaining = held_as(&x, "k", shape(LeaseKind::Exclusive), true, "a").await;
    assert!(
        remaining <= ttl / 2,
        "a waiting exclusive attempt retries within half its TTL: {remaining:?}"
    );
    // While the mark is live, no new shared holder; the held one renews.
    let blocked = held_as(&b, "k", shared(), true, "x").await;
    assert!(blocked <= ttl, "{blocked:?}");
    assert!(a.renew(vec![la.clone()]).await.unwrap().is_empty());

    // A waiter that stopped renewing its mark blocks nobody.
    f.expire_mark("k").await;
    let (lb, _) = take_as(&b, "k", shared()).await;
    assert_eq!(holders(&b, "k").await.1, ["a", "b"]);

    // Its next attempt marks the key again; the holders drain; it gets the key.
    held_as(&x, "k", shape(LeaseKind::Exclusive), true, "b").await;
    held_as(&a, "k", shared(), false, "x").await;
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 1);
    let (lx, tx) = super::take(&x, "k").await;
    let info = x.inspect("k".into()).await.unwrap().unwrap();
    assert_eq!((info.kind, info.fencing_token), (LeaseKind::Exclusive, tx));
    assert!(info.holders.is_empty());
    held_as(&a, "k", shared(), false, "x").await;

    // Once the exclusive holder came and went, shared holders are back.
    assert_eq!(x.release_by_id(vec![lx]).await.unwrap(), 1);
    let (_, ta) = take_as(&a, "k", shared()).await;
    assert!(ta > tx);
}

pub(super) async fn release_owner_and_force_release_of_multi_holder_keys<F: Fixture>(f: &F) {
    let (a, b, c) = (f.store("a").await, f.store("b").await, f.store("c").await);
    let (la, _) = take_as(&a, "s", shared()).await;
    let (lb, _) = take_as(&b, "s", shared()).await;
    let (la2, _) = take_as(&a, "p", permit(3)).await;
    let (lc, _) = take_as(&c, "p", permit(3)).await;
    take_as(&a, "q", permit(3)).await;

    // A release of several holders' entries, by lease id.
    let both = vec![la.clone(), la2.clone()];
    assert_eq!(a.release_by_id(both).await.unwrap(), 2);
    assert_eq!(holders(&a, "s").await.1, ["b"]);
    assert_eq!(holders(&a, "p").await.1, ["c"]);
    assert_eq!(holders(&a, "q").await.1, ["a"], "not among them: kept");
    let lost = a.renew(vec![la.clone(), la2.clone()]).await.unwrap();
    assert_eq!(lost.len(), 2);

    assert_eq!(
        b.release_owner("c".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        1
    );
    assert!(holders(&a, "p").await.1.is_empty());
    assert!(!a.inspect("p".into()).await.unwrap().unwrap().held);
    assert_eq!(c.renew(vec![lc]).await.unwrap().len(), 1);

    take_as(&c, "s", shared()).await;
    let forced = c
        .force_release("s".into(), OverrideEnd::Immediately)
        .await
        .unwrap()
        .expect("a held key");
    assert_eq!(forced.kind, LeaseKind::Shared);
    let owners: Vec<&str> = forced.holders.iter().map(|h| h.owner_id.as_str()).collect();
    assert_eq!(owners, ["b", "c"], "as it was");
    let info = c.inspect("s".into()).await.unwrap().unwrap();
    assert!(!info.held && info.holders.is_empty());
    assert_eq!(b.renew(vec![lb]).await.unwrap().len(), 1);
    assert_eq!(
        c.force_release("s".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        None
    );
    super::take(&c, "s").await;
}

pub(super) async fn inspect_and_list_show_each_kind_with_its_holders<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (_, t1) = take_as(&a, "k1", permit(5)).await;
    let (_, t2) = take_as(&b, "k1", permit(5)).await;
    take_as(&a, "k2", shared()).await;
    let (_, t3) = super::take(&b, "k3").await;

    let info = a.inspect("k1".into()).await.unwrap().unwrap();
    assert_eq!(info.kind, LeaseKind::Permit { permits: 5 });
    assert_eq!((info.owner_id.as_str(), info.fencing_token), ("b", t2));
    let tokens: Vec<u64> = info.holders.iter().map(|h| h.fencing_token).collect();
    assert_eq!(tokens, [t1, t2]);
    for h in &info.holders {
        assert!(h.acquired_at <= h.renewed_at && h.renewed_at < h.expires_at);
        assert!(h.expires_at <= info.expires_at);
    }
    assert!(info.held && info.hold_until.is_none());

    let (page, _) = a.list(None, 10).await.unwrap();
    let kinds: Vec<(String, LeaseKind, usize)> = page
        .iter()
        .map(|i| (i.key.to_string(), i.kind, i.holders.len()))
        .collect();
    assert_eq!(
        kinds,
        [
            (
                LeaseKey::from("k1").to_string(),
                LeaseKind::Permit { permits: 5 },
                2
            ),
            (LeaseKey::from("k2").to_string(), LeaseKind::Shared, 1),
            (LeaseKey::from("k3").to_string(), LeaseKind::Exclusive, 0),
        ]
    );
    assert_eq!(page[2].fencing_token, t3);
}

pub(super) async fn a_holders_release_is_announced_its_renewal_and_acquisition_are_not<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, _) = take_as(&a, "k", shared()).await;
    let (lb, _) = take_as(&b, "k", shared()).await;
    let (lp, _) = take_as(&a, "p", permit(2)).await;
    let mut writes = a.watch_releases(Announced::Writes);
    // Liveness bound only: the stream opens in milliseconds.
    let opened = tokio::time::timeout(Duration::from_secs(30), writes.next()).await;
    assert!(
        matches!(opened, Ok(Some(Ok(Announcement::Opened)))),
        "the stream starts with Opened: {opened:?}"
    );

    assert!(
        a.renew(vec![la.clone(), lp.clone()])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(b.renew(vec![lb.clone()]).await.unwrap().is_empty());
    // Another holder's acquisition takes nothing from the holders.
    let c = f.store("c").await;
    take_as(&c, "k", shared()).await;
    take_as(&c, "p", permit(2)).await;
    assert_eq!(a.release_by_id(vec![lp]).await.unwrap(), 1);
    assert_eq!(b.release_by_id(vec![lb]).await.unwrap(), 1);

    let give_up = Instant::now() + Duration::from_secs(30);
    let mut seen: Vec<KeyWrite> = Vec::new();
    while seen.len() < 2 {
        match tokio::time::timeout_at(give_up, writes.next()).await {
            Ok(Some(Ok(Announcement::Write(w)))) => seen.push(w),
            other => panic!("after {seen:?}: {other:?}"),
        }
    }
    let freed = |key: &str| KeyWrite {
        key: key.into(),
        freed: true,
        lease_id: None,
        owner: None,
        token: None,
    };
    assert_eq!(
        seen,
        [freed("p"), freed("k")],
        "the two releases, not the renewals nor another holder's acquisition"
    );
    assert!(!seen[1].keeps(la.lease_id, "a"));
}

pub(super) async fn a_holders_payload_is_written_only_while_it_holds<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (la, _) = take_as(&a, "k", shared()).await;
    let (lb, _) = take_as(&b, "k", shared()).await;
    let payload = mongodb::bson::doc! { "progress": 1 };
    assert!(a.set_payload(la.clone(), payload.clone()).await.unwrap());
    assert!(b.set_payload(lb.clone(), payload.clone()).await.unwrap());
    assert!(
        !b.set_payload(la.clone(), payload.clone()).await.unwrap(),
        "another owner's lease id"
    );
    let stranger = lease("k", Uuid::new_v4());
    assert!(!a.set_payload(stranger, payload.clone()).await.unwrap());
    let info = a.inspect("k".into()).await.unwrap().unwrap();
    assert_eq!(
        info.payload, None,
        "a holder's payload is its own, not the key's"
    );
    assert_eq!(a.release_by_id(vec![la.clone()]).await.unwrap(), 1);
    assert!(!a.set_payload(la, payload.clone()).await.unwrap());
    assert!(b.set_payload(lb, payload).await.unwrap());
}

pub(super) async fn delete_mode_never_deletes_a_key_with_live_holders<F: Fixture>(f: &F) {
    let (keep, del) = (f.store("a").await, f.delete_mode_store("d").await);
    take_as(&keep, "s", shared()).await;
    let (lp, _) = take_as(&keep, "p", permit(2)).await;
    take_as(&keep, "p", permit(2)).await;
    // Tokens old enough for delete mode's rule (its own duration).
    tokio::time::sleep(crate::store::DELETE_DELAY).await;
    assert_eq!(keep.release_by_id(vec![lp]).await.unwrap(), 1);
    let keys: Vec<LeaseKey> = vec!["s".into(), "p".into()];
    assert_eq!(del.delete_released(keys).await.unwrap(), 0);
    assert_eq!(holders(&del, "s").await.1, ["a"]);
    assert_eq!(holders(&del, "p").await.1, ["a"]);
    // Once its last holder is gone, a delete-mode release by owner id
    // deletes the document.
    assert_eq!(
        del.release_owner("a".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        2
    );
    for key in ["s", "p"] {
        let left = del.inspect(key.into()).await.unwrap();
        assert!(left.as_ref().is_none_or(|i| !i.held), "{key}: {left:?}");
    }
}

pub(super) async fn racing_acquisitions_never_admit_more_than_n_permits<F: Fixture>(f: &F) {
    for round in 0..3 {
        let key = format!("k{round}");
        let mut stores = Vec::new();
        for i in 0..8 {
            stores.push(f.store(&format!("o{i}")).await);
        }
        let attempts = stores.iter().map(|s| {
            let key = key.clone();
            async move { attempt(s, &key, permit(3), false).await.1 }
        });
        let outcomes = futures::future::join_all(attempts).await;
        let won = outcomes
            .iter()
            .filter(|o| matches!(o, AcquireOutcome::Acquired { .. }))
            .count();
        assert!(won <= 3, "round {round}: {outcomes:?}");
        let (kind, live) = holders(&stores[0], &key).await;
        assert_eq!(kind, LeaseKind::Permit { permits: 3 });
        assert_eq!(live.len(), won, "round {round}: {outcomes:?}");
        // Those that lost find the key full, or lost a race and try again:
        // the key ends with exactly its permits taken.
        let mut total = won;
        for (store, o) in stores.iter().zip(&outcomes) {
            match o {
                AcquireOutcome::Acquired { .. } => {}
                AcquireOutcome::Held { .. } => {
                    if let (_, AcquireOutcome::Acquired { .. }) =
                        attempt(store, &key, permit(3), false).await
                    {
                        total += 1;
                    }
                }
                other => panic!("round {round}: {other:?}"),
            }
        }
        assert_eq!(total, 3, "round {round}");
        assert_eq!(holders(&stores[0], &key).await.1.len(), 3);
    }
}

pub(super) async fn a_waiting_shared_acquirer_makes_the_exclusive_holders_release_yield<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (l, _) = super::take(&a, "k").await;
    // A shared acquirer of another owner that will wait marks the
    // exclusive lease, as an exclusive one would ("Fairness between owners").
    held_as(&b, "k", shared(), true, "a").await;
    assert!(super::raw(f, "k").await.waiting, "marked as waited for");
    assert_eq!(a.release_by_id(vec![l]).await.unwrap(), 1);
    assert!(super::raw(f, "k").await.yielded, "the release yields");
    // The releasing owner finds the key held by itself until the end of
    // the yield window, as an exclusive, a shared or a permit acquirer...
    super::held(&a, "k", false, "a").await;
    held_as(&a, "k", shared(), false, "a").await;
    held_as(&a, "k", permit(2), false, "a").await;
    // ... while the waiting owner takes it at once.
    take_as(&b, "k", shared()).await;
}

pub(super) async fn a_bad_shape_is_refused_with_a_clear_error_and_nothing_written<F: Fixture>(
    f: &F,
) {
    let a = f.store("a").await;
    let bad = [
        shape(LeaseKind::Permit { permits: 0 }),
        shape(LeaseKind::Permit {
            permits: crate::kind::MAX_PERMITS + 1,
        }),
        LeaseShape {
            kind: LeaseKind::Shared,
            hold_at_least: Some(Duration::from_secs(5)),
            permits_taken: None,
        },
        LeaseShape {
            kind: LeaseKind::Permit { permits: 2 },
            hold_at_least: Some(Duration::from_secs(5)),
            permits_taken: None,
        },
    ];
    for shape in bad {
        let l = lease("k", Uuid::new_v4());
        let outcome = a
            .acquire_shaped(l.key.clone(), l.lease_id, true, a.default_ttl(), shape)
            .await;
        assert!(
            matches!(outcome, Err(crate::error::Error::InvalidConfig { .. })),
            "{shape:?}: {outcome:?}"
        );
    }
    assert_eq!(a.inspect("k".into()).await.unwrap(), None);
}

pub(super) async fn a_released_key_whose_expiry_ran_ahead_is_free_for_a_permit_not_a_mismatch<
    F: Fixture,
>(
    f: &F,
) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (l, _) = super::take(&a, "k").await;
    assert_eq!(a.release_by_id(vec![l]).await.unwrap(), 1);
    f.run_ahead("k", Duration::from_secs(5)).await;
    // No exclusive lease (`lid`) nor minimum hold: nobody holds the key (its
    // `exp` is a release's, on a clock that read ahead), so a permit and a
    // shared lease take it at once.
    let (permit_lease, _) = take_as(&b, "k", permit(2)).await;
    assert_eq!(b.release_by_id(vec![permit_lease]).await.unwrap(), 1);
    take_as(&b, "k", shared()).await;
}

pub(super) async fn an_owners_own_exclusive_mark_never_blocks_its_shared_acquisition<F: Fixture>(
    f: &F,
) {
    let (a, x) = (f.store("a").await, f.store("x").await);
    take_as(&a, "k", shared()).await;
    // x's exclusive waiter marks the key, then goes away (its manager
    // serves its waiters in order, so its next attempt is a shared one
    // only once no exclusive waiter of its own is ahead).
    held_as(&x, "k", shape(LeaseKind::Exclusive), true, "a").await;
    held_as(&a, "k", shared(), false, "x").await;
    take_as(&x, "k", shared()).await;
    assert_eq!(holders(&x, "k").await.1, ["a", "x"]);
}
