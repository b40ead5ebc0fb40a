//! A registration in a key's queue of waiting owners whose waiter left, or
//! whose payload another waiter does not share, and a release after a force
//! release, on a real mongod ("Queue of waiting owners" in docs/protocol.md).
//!
//! Each test synchronises on the lock document and on the commands a
//! manager sends (its client's command monitor), never on sleeps: a
//! verdict compares server times of the document's own fields.

use crate::common;

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{Clients, Fixture, within};
use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::bson::{Bson, Document, doc};
use mongodb::{Client, Collection};

const TTL: Duration = Duration::from_secs(10);
/// Hang guard only.
const BOUND: Duration = Duration::from_secs(60);

/// Names of the commands a client started, in order.
#[derive(Clone, Default)]
struct Started(Arc<Mutex<Vec<String>>>);

impl Started {
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    /// Whether a command named `name` started at index `from` or later.
    fn since(&self, from: usize, name: &str) -> bool {
        self.0.lock().unwrap()[from..].iter().any(|n| n == name)
    }
}

/// A client for `uri` named `app` (for `failCommand`'s `appName`) whose
/// started commands are recorded.
async fn monitored_client(clients: &Clients, uri: &str, app: &str) -> (Client, Started) {
    use mongodb::event::{EventHandler, command::CommandEvent};
    let started = Started::default();
    let mut options = mongodb::options::ClientOptions::parse(uri).await.unwrap();
    options.app_name = Some(app.into());
    let sink = started.clone();
    options.command_event_handler = Some(EventHandler::callback(move |event| {
        if let CommandEvent::Started(s) = event {
            sink.0.lock().unwrap().push(s.command_name);
        }
    }));
    (clients.add(Client::with_options(options).unwrap()), started)
}

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

/// Scenario: a waiter leaves while its registering attempt is in flight,
/// and that attempt fails transiently (its outcome unknown). The actor
/// counts the key registered (`may_have_registered`), gives the lease id
/// back, takes a new one, and only then forgets the key, remembering the
/// *new* lease id in `gave_up`. The registration still in the key's queue
/// is under the *old* one: a release hands the key to it, and the handoff
/// event is not recognised (`give_back_handed` compares with the new id),
/// so the key stays held by a manager nobody waits in until the handed
/// lease expires (`hx`), instead of being given back at once.
///
/// Checked: after the handoff to the stale registration, the key is given
/// back (its `lid` changes) before the handed lease's own expiry, by the
/// server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_leaves_during_a_failed_refresh_has_its_handed_key_given_back() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("ATTACK_LOG").unwrap_or_else(|_| "off".into()))
        .try_init();
    let rs = ReplicaSet::start(
        ReplicaSetOptions::default()
            .extra_arg("--setParameter")
            .extra_arg("enableTestCommands=1"),
    )
    .await
    .expect("a replica set with test commands");
    let clients = Clients::default();
    let (a_client, _) = monitored_client(&clients, &rs.uri(), "atk-a").await;
    let (b_client, b_started) = monitored_client(&clients, &rs.uri(), "atk-b").await;
    let options = |client: &Client| {
        LeaseManagerOptions::builder()
            .database(client.database("d"))
            .collection("job.lock")
            .ttl(TTL)
            .clock_skew(common::clock_skew(TTL))
            // R = 2 * 3 s + 1 s + 1 s = 8 s: the registration outlives
            // the failed refresh; hx = min(TTL, R) = 8 s.
            .retry_max(Duration::from_secs(3))
            .build()
    };
    let a = LeaseManager::connect(options(&a_client)).await.unwrap();
    let b = LeaseManager::connect(options(&b_client)).await.unwrap();
    let coll: Collection<Document> = a_client.database("d").collection("job.lock");

    let held = a.acquire("k").await.unwrap();
    let waiter = tokio::spawn({
        let b = b.clone();
        async move { b.acquire("k").await }
    });
    // B registered in k's queue.
    within(BOUND, "B's registration", async {
        while doc_now(&coll, "k")
            .await
            .and_then(|d| queue_entry(&d, b.owner_id()))
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    // B's acquire and re-read now fail (ExceededTimeLimit, transient here,
    // no retry label, no change of the driver's view of the server),
    // each after a short block: its next refresh is in flight a while.
    let mark = b_started.len();
    rs.fail_command(
        "alwaysOn".into(),
        doc! {
            "failCommands": ["findAndModify", "find"], "appName": "atk-b",
            "errorCode": 262, "errorLabels": [],
            "blockConnection": true, "blockTimeMS": 100,
        },
    )
    .await
    .unwrap();
    within(BOUND, "B's refresh in flight", async {
        while !b_started.since(mark, "findAndModify") {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    // The waiter leaves while the refresh is in flight.
    waiter.abort();
    let _ = waiter.await;
    let after_leave = b_started.len();
    // The refresh fails; with nobody waiting the actor gives its lease id
    // back (an `update`), then forgets the key.
    within(BOUND, "B's give-back after the failed refresh", async {
        while !b_started.since(after_leave, "update") {
            eprintln!("B: {:?}", &b_started.0.lock().unwrap()[mark..]);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    rs.clear_fail_command().await.unwrap();
    eprintln!(
        "B's commands since the fail point: {:?}",
        &b_started.0.lock().unwrap()[mark..]
    );

    let before = doc_now(&coll, "k").await.unwrap();
    eprintln!("before the release: {before}");
    let Some(entry) = queue_entry(&before, b.owner_id()) else {
        panic!("B's registration lapsed before the release: {before}");
    };
    eprintln!("B's stale registration: lid {entry}");
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);

    // The release handed k to B's stale registration.
    let handed = doc_now(&coll, "k").await.unwrap();
    assert_eq!(handed.get_str("aid").unwrap(), b.owner_id(), "{handed}");
    assert_eq!(handed.get("lid"), Some(&entry), "{handed}");
    let handed_exp = *handed.get_datetime("exp").unwrap();
    eprintln!("handed to B: {handed}");

    // B, whose waiter left, must give it back at once (on the event).
    let verdict = within(BOUND, "the give-back or the handed lease's expiry", async {
        loop {
            let d = doc_now(&coll, "k").await.unwrap();
            let now = *d.get_datetime("now").unwrap();
            if d.get("lid") != Some(&entry) {
                break Ok(d);
            }
            if now >= handed_exp {
                break Err(d);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    if let Err(d) = &verdict {
        eprintln!("still held by B's stale registration at its expiry: {d}");
    }
    for m in [b, a] {
        m.shutdown().await.unwrap();
    }
    let d = verdict.expect(
        "k stayed held by B (lease id of a registration whose waiter left) until the \
         handed lease expired: B never gave it back",
    );
    eprintln!("given back before the handed expiry: {d}");
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
    within(BOUND, "W1's registration", async {
        while doc_now(&coll, "k")
            .await
            .and_then(|d| queue_entry(&d, b.owner_id()))
            .is_none()
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
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
