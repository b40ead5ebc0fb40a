//! A registration in a key's queue of waiting owners whose payload the
//! waiter left behind does not share, and a release after a force release,
//! on a real mongod ("Queue of waiting owners" in docs/protocol.md). Each
//! test synchronises on the lock document and the managers' answers.

use crate::common;

use std::future::IntoFuture;
use std::time::Duration;

use common::{Fixture, within};
use mongo_lease::{LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::Collection;
use mongodb::bson::{Bson, Document, doc};

const TTL: Duration = Duration::from_secs(10);
/// Hang guard only.
const BOUND: Duration = Duration::from_secs(60);

/// The key's document with the server's `$$NOW` as `now`.
async fn doc_now(coll: &Collection<Document>, key: &str) -> Option<Document> {
    coll.find_one(doc! { "_id": key })
        .projection(doc! {
            "aid": 1, "lid": 1, "tok": 1, "exp": 1, "q": 1, "data": 1, "now": "$$NOW",
        })
        .await
        .unwrap()
}

/// The lease id (`lid`) of `owner`'s live entry in the key's queue, if any.
fn queue_entry(doc: &Document, owner: &str) -> Option<Bson> {
    let now = doc.get_datetime("now").ok()?;
    doc.get_array("q").ok()?.iter().find_map(|e| {
        let e = e.as_document()?;
        let live = e.get_datetime("re").ok()? > now;
        (e.get_str("aid").ok()? == owner && live).then(|| e.get("lid").cloned())?
    })
}

/// Scenario: waiter W1 with a payload registers B in the key's queue (the
/// entry carries W1's payload); W2, without a payload, waits behind it;
/// W1 leaves while the attempt is scheduled; the holder releases, handing
/// the key to B's registration with W1's payload. The event grants the
/// handed lease to W2 (`grant_handed` checks the first waiter's shape,
/// not the registration's payload).
///
/// Checked: the document of a lease acquired without a payload has no
/// `data` ("absent after a new acquisition without one"), i.e. W2 is not
/// handed a lease whose document carries the payload of a caller that
/// left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_handed_on_the_event_to_a_waiter_without_payload_carries_none() {
    let fx = Fixture::new("atk_payload").await;
    // Refreshes far apart: none between W1's leave and the release.
    let opts = |mut o: LeaseManagerOptions| {
        o.retry_max = Duration::from_secs(5);
        o
    };
    let a = LeaseManager::connect(opts(fx.options(TTL).await))
        .await
        .unwrap();
    let b = LeaseManager::connect(opts(fx.options(TTL).await))
        .await
        .unwrap();
    let coll = fx.raw();

    let held = a.acquire("k").await.unwrap();
    let w1 = tokio::spawn({
        let b = b.clone();
        async move { b.acquire("k").payload(doc! { "w": 1 }).await }
    });
    common::eventually("W1's registration", BOUND, || async {
        doc_now(&coll, "k")
            .await
            .and_then(|d| queue_entry(&d, b.owner_id()))
            .is_some()
    })
    .await;
    let registered = doc_now(&coll, "k").await.unwrap();
    eprintln!("after W1 registered: {registered}");
    // W2 queues behind W1 (its first poll sends the request).
    let (queued_tx, queued_rx) = tokio::sync::oneshot::channel::<()>();
    let w2 = tokio::spawn({
        let b = b.clone();
        async move {
            let acquire = b.acquire("k").into_future();
            tokio::pin!(acquire);
            assert!(futures::poll!(&mut acquire).is_pending());
            queued_tx.send(()).unwrap();
            acquire.await
        }
    });
    within(BOUND, "W2 queued", queued_rx).await.unwrap();
    w1.abort();
    let _ = w1.await;
    // B's actor has handled W1's leave (a round trip of its mailbox).
    let _ = b.inspect("other").await;
    let before = doc_now(&coll, "k").await.unwrap();
    let Some(entry) = queue_entry(&before, b.owner_id()) else {
        panic!("B's registration is gone before the release");
    };
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    let second = within(BOUND, "W2's lease", w2).await.unwrap().unwrap();
    let d = doc_now(&coll, "k").await.unwrap();
    eprintln!("W2 holds token {}; document {d}", second.fencing_token());
    let info = b.inspect("k").await.unwrap().unwrap();
    let handed_to_entry = d.get("lid") == Some(&entry);
    let token = second.fencing_token();
    let _ = second.release().await.unwrap();
    for m in [b, a] {
        m.shutdown().await.unwrap();
    }
    assert!(
        info.payload.is_none(),
        "W2 acquired without a payload (handed on the event: {handed_to_entry}), yet its \
         lease (token {}) shows the payload {:?} of W1, who left",
        token,
        info.payload
    );
}

/// Scenario: a handoff racing an operator's force release. A holds the
/// key with a local waiter behind it; another manager's force release
/// (not immediate) returns; then A releases. The release must answer
/// `AlreadyLost` (property 7), and must not hand the key to the local
/// waiter (the handoff's filter needs the released lease still in place):
/// the document shows no lease and keeps the force release's `nb`.
/// Regression test (passes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_after_a_force_release_answers_lost_and_hands_nothing_over() {
    let fx = Fixture::new("atk_force").await;
    let a = fx.manager(TTL).await;
    let op = fx.manager(TTL).await;
    let held = a.acquire("k").await.unwrap();
    let (queued_tx, queued_rx) = tokio::sync::oneshot::channel::<()>();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move {
            let acquire = a.acquire("k").into_future();
            tokio::pin!(acquire);
            assert!(futures::poll!(&mut acquire).is_pending());
            queued_tx.send(()).unwrap();
            acquire.await
        }
    });
    within(BOUND, "the local waiter queued", queued_rx)
        .await
        .unwrap();
    let was = op.force_release("k").await.unwrap().expect("k was held");
    assert_eq!(was.fencing_token, held.fencing_token());
    let forced = fx.doc("k").await;
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
    let after = fx.doc("k").await;
    assert!(
        !after.contains_key("lid"),
        "handed over after a force release: {after}"
    );
    assert_eq!(after.get("tok"), forced.get("tok"), "{after}");
    assert_eq!(after.get("nb"), forced.get("nb"), "{after}");
    waiter.abort();
    let _ = waiter.await;
    for m in [op, a] {
        m.shutdown().await.unwrap();
    }
}
