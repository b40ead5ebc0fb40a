//! Leases taken away by someone else's write: renewals, releases and payload
//! writes match the owner id, and the announcement stream reports the
//! writes that may take a lease away.

use crate::store::StoreExt;
use std::time::Duration;

use futures::StreamExt;
use mongodb::bson::doc;
use tokio::time::Instant;

use super::{Fixture, raw, take};
use crate::store::{AcquireOutcome, Announced, Announcement, KeyWrite, Store};

pub(super) async fn renewal_reports_a_lease_lost_whose_owner_id_was_rewritten<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let (l1, _) = take(&a, "k1").await;
    let (l2, _) = take(&a, "k2").await;
    f.rewrite_owner("k1", "intruder").await;

    assert_eq!(a.renew(vec![l1.clone(), l2.clone()]).await.unwrap(), ["k1"]);
    assert!(
        !a.set_payload(l1.clone(), doc! { "x": 1 }).await.unwrap(),
        "no payload on a lease of another owner"
    );
    assert_eq!(a.release_by_id(vec![l1.clone()]).await.unwrap(), 0);
    let k1 = raw(f, "k1").await;
    assert_eq!(
        (k1.owner.as_str(), k1.lease_id, k1.payload),
        ("intruder", Some(l1.lease_id), None),
        "the rewritten document is left as it is"
    );
    assert!(a.renew(vec![l2]).await.unwrap().is_empty());
}

pub(super) async fn an_acquire_retry_under_a_lease_id_whose_owner_id_was_rewritten_finds_it_held<
    F: Fixture,
>(
    f: &F,
) {
    let a = f.store("a").await;
    let (l, token) = take(&a, "k").await;
    // Our own retry under the same lease id is the same acquisition...
    assert_eq!(
        a.attempt(l.key.clone(), l.lease_id, false).await.unwrap(),
        AcquireOutcome::Acquired { token }
    );
    f.rewrite_owner("k", "intruder").await;
    // ...but not once another application rewrote the owner id.
    match a.attempt(l.key.clone(), l.lease_id, false).await.unwrap() {
        AcquireOutcome::Held {
            holder,
            remaining,
            token: found,
            ..
        } => {
            assert_eq!(holder, "intruder");
            assert!(
                remaining.is_some_and(|r| r > Duration::ZERO),
                "{remaining:?}"
            );
            assert_eq!(found, Some(token), "the token stored, kept by the rewrite");
        }
        other => panic!("a retry took back a rewritten document: {other:?}"),
    }
    let k = raw(f, "k").await;
    assert_eq!(
        (k.owner.as_str(), k.lease_id, k.token),
        ("intruder", Some(l.lease_id), token),
        "the rewritten document is left as it is"
    );
}

pub(super) async fn foreign_deletes_and_owner_rewrites_are_announced_renewals_are_not<
    F: Fixture,
>(
    f: &F,
) {
    let a = f.store("a").await;
    let mut writes = a.watch_releases(Announced::Writes);
    // Liveness bound only: the stream opens in milliseconds.
    let opened = tokio::time::timeout(Duration::from_secs(30), writes.next()).await;
    assert!(
        matches!(opened, Ok(Some(Ok(Announcement::Opened)))),
        "the stream starts with Opened: {opened:?}"
    );

    let (k, tk) = take(&a, "k").await;
    assert!(a.renew(vec![k.clone()]).await.unwrap().is_empty());
    assert!(a.set_payload(k.clone(), doc! { "x": 1 }).await.unwrap());
    f.rewrite_owner("k", "intruder").await;
    f.delete_now("k").await;
    let (end, te) = take(&a, "end").await;

    let write = |key: &str, freed, lease_id, owner: Option<&str>, token| KeyWrite {
        key: key.into(),
        freed,
        lease_id,
        owner: owner.map(str::to_string),
        token,
    };
    let give_up = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    while seen.last().is_none_or(|w: &KeyWrite| w.key != "end") {
        let next = tokio::time::timeout_at(give_up, writes.next()).await;
        match next {
            Ok(Some(Ok(Announcement::Write(w)))) => seen.push(w),
            other => panic!("after {seen:?}: {other:?}"),
        }
    }
    assert_eq!(
        seen,
        [
            write("k", false, Some(k.lease_id), Some("a"), Some(tk)),
            write("k", false, None, Some("intruder"), None),
            write("k", true, None, None, None),
            write("end", false, Some(end.lease_id), Some("a"), Some(te)),
        ],
        "the acquisitions, the rewrite and the delete; not the renewal nor the payload"
    );
    assert!(!seen[1].keeps(k.lease_id, "a"));
    assert!(!seen[2].keeps(k.lease_id, "a"));
    assert!(seen[0].keeps(k.lease_id, "a"));
}
