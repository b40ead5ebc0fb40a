//! Releasing: yield, batches, by owner, forced, and the announcements of releases.

use crate::store::OverrideEnd;
use crate::store::StoreExt;
use std::collections::BTreeSet;
use std::time::Duration;

use futures::StreamExt;
use tokio::time::Instant;
use uuid::Uuid;

use super::{Fixture, Raw, assert_held, held, lease, raw, take};
use crate::key::LeaseKey;
use crate::store::{Announced, Store};

pub(super) async fn release_of_an_unmarked_lease_does_not_yield<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let (l1, t1) = take(&a, "k").await;
    assert_eq!(a.release_by_id(vec![l1]).await.unwrap(), 1);
    assert!(!raw(f, "k").await.yielded);
    let (l2, t2) = take(&a, "k").await;
    assert!(t2 > t1);
    assert_held(&raw(f, "k").await, "a", &l2, t2);
}

pub(super) async fn release_clears_the_lease_id_and_yields_only_when_marked<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (l1, t1) = take(&a, "k1").await;
    let (l2, t2) = take(&a, "k2").await;
    let (l3, t3) = take(&a, "k3").await;
    held(&b, "k2", true, "a").await;
    // A waiter that stopped retrying: its registration lapsed, so the
    // release yields instead of handing the key over ("Queue of waiting
    // owners" in `store`).
    f.lapse_registrations("k2").await;

    // A wrong lease id releases nothing (one lease, then a batch).
    let stranger = lease("k3", Uuid::new_v4());
    assert_eq!(a.release_by_id(vec![stranger.clone()]).await.unwrap(), 0);
    let wrong = vec![stranger, lease("k1", Uuid::new_v4())];
    assert_eq!(a.release_by_id(wrong).await.unwrap(), 0);
    assert_held(&raw(f, "k3").await, "a", &l3, t3);

    // A batch release: both released; only the marked one yields.
    assert_eq!(
        a.release_by_id(vec![l1.clone(), l2.clone()]).await.unwrap(),
        2
    );
    let released = |token, yielded| Raw {
        owner: "a".into(),
        lease_id: None,
        token,
        expired: true,
        waiting: false,
        yielded,
        payload: None,
    };
    assert_eq!(raw(f, "k1").await, released(t1, false));
    assert_eq!(raw(f, "k2").await, released(t2, true));

    // Releasing again matches nothing; a late renewal cannot revive them.
    assert_eq!(
        a.release_by_id(vec![l1.clone(), l2.clone()]).await.unwrap(),
        0
    );
    assert_eq!(a.release_by_id(vec![l1.clone()]).await.unwrap(), 0);
    let lost: BTreeSet<LeaseKey> = a.renew(vec![l1, l2]).await.unwrap().into_iter().collect();
    assert_eq!(lost, BTreeSet::from(["k1".into(), "k2".into()]));
    assert_eq!(raw(f, "k1").await, released(t1, false));

    // A single release of the right lease.
    assert_eq!(a.release_by_id(vec![l3]).await.unwrap(), 1);
    assert_eq!(raw(f, "k3").await, released(t3, false));
}

pub(super) async fn force_release_releases_a_live_lease_of_any_owner<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let (_, tb) = take(&b, "k").await;
    let before = a
        .force_release("k".into(), OverrideEnd::Immediately)
        .await
        .unwrap()
        .expect("held");
    assert!(before.held);
    assert_eq!((before.owner_id.as_str(), before.fencing_token), ("b", tb));
    let r = raw(f, "k").await;
    assert_eq!((r.lease_id, r.expired, r.yielded), (None, true, false));
    assert_eq!(
        a.force_release("k".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        a.force_release("nothing".into(), OverrideEnd::Immediately)
            .await
            .unwrap(),
        None
    );
    let (_, ta) = take(&a, "k").await;
    assert!(ta > tb);
}

pub(super) async fn releases_and_deletes_are_announced_expiries_and_renewals_are_not<F: Fixture>(
    f: &F,
) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let mut releases = super::freed_keys(a.watch_releases(Announced::Waits));
    // The stream opens in the background: release a probe key until the
    // stream reports it, so that it sees everything below.
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let (probe, _) = take(&a, "probe").await;
        assert_eq!(a.release_by_id(vec![probe]).await.unwrap(), 1);
        tokio::select! {
            event = releases.next() => match event {
                Some(Ok(key)) if key == "probe" => break,
                other => panic!("before any release: {other:?}"),
            },
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
        assert!(
            Instant::now() < give_up,
            "the stream of releases never opened"
        );
    }

    // The stream is not read while the writes below are made: read again,
    // it announces them all (B33).
    let (l1, _) = take(&a, "k1").await;
    let (l2, _) = take(&a, "k2").await;
    let (l3, _) = take(&b, "k3").await;
    take(&b, "k4").await;
    // Not releases: acquisitions, renewals, waiting marks, expiries.
    assert!(
        a.renew(vec![l1.clone(), l2.clone()])
            .await
            .unwrap()
            .is_empty()
    );
    held(&a, "k4", true, "b").await;
    f.expire("k2").await;
    // Releases: a release, a delete (the TTL monitor), a forced release.
    assert_eq!(a.release_by_id(vec![l1]).await.unwrap(), 1);
    f.delete("k2").await;
    assert!(
        a.force_release("k3".into(), OverrideEnd::Immediately)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(b.release_by_id(vec![l3]).await.unwrap(), 0);
    let (end, _) = take(&a, "end").await;
    assert_eq!(a.release_by_id(vec![end]).await.unwrap(), 1);

    let mut seen = Vec::new();
    while seen.last().is_none_or(|k| k != "end") {
        match releases.next().await {
            Some(Ok(key)) if key == "probe" => {}
            Some(Ok(key)) => seen.push(key),
            other => panic!("after {seen:?}: {other:?}"),
        }
    }
    assert_eq!(seen, ["k1", "k2", "k3", "end"]);
}
