//! Leases lost to someone else's write: another application deletes or
//! rewrites a held lease's document. With `watch_held_leases`, the
//! manager's one change stream of writes makes it check just the leases
//! concerned at once, so their tokens fire within milliseconds instead of
//! at the next heartbeat; by default (no stream while merely holding), and
//! without a change stream, the next renewal finds them lost because
//! renewals match the owner id (`aid`).
//!
//! The leases here last 600 s and the heartbeat of the watching holders
//! runs every 200 s: a loss noticed within the tests' liveness bound (10 s)
//! can only come from the stream, and the command log shows the one
//! renewal that checked it, covering only the leases written.

use std::time::Duration;

use futures::future::join_all;
use mongo_lease::testkit::Standalone;
use mongo_lease::{Lease, LeaseManager, ReleaseOutcome};
use mongodb::bson::{Document, doc};

use super::common::{CommandLog, Fixture, eventually, renewal::renewed_keys};

const TTL: Duration = Duration::from_secs(600);
const HEARTBEAT: Duration = Duration::from_secs(200);
/// Only turns a hang into a failure: a loss is noticed in milliseconds.
const BOUND: Duration = Duration::from_secs(10);

/// A manager with a command log and `watch_held_leases`, holding `keys`,
/// whose change stream of writes is open (its `aggregate` answered), with
/// the log cleared.
async fn holder(fx: &Fixture, keys: &[&str]) -> (LeaseManager, Vec<Lease>, CommandLog) {
    let (mut options, log) = fx.monitored_options(TTL, "").await;
    options.heartbeat_interval = Some(HEARTBEAT);
    options.watch_held_leases = true;
    let manager = LeaseManager::connect(options).await.unwrap();
    let mut leases = Vec::new();
    for key in keys {
        leases.push(manager.acquire(*key).await.unwrap());
    }
    eventually("the stream of writes is open", BOUND, || {
        let log = log.clone();
        async move { stream_open(&log.all()) }
    })
    .await;
    log.clear();
    (manager, leases, log)
}

/// Whether an `aggregate` opening a change stream was sent and answered.
fn stream_open(log: &[(String, Document)]) -> bool {
    let Some(sent) = log.iter().position(opens_stream) else {
        return false;
    };
    log[sent..].iter().any(|(name, _)| name == "ok:aggregate")
}

/// Whether a logged command is an `aggregate` opening a change stream.
fn opens_stream((name, command): &(String, Document)) -> bool {
    name == "aggregate"
        && command
            .get_array("pipeline")
            .ok()
            .and_then(|p| p.first())
            .and_then(|s| s.as_document())
            .is_some_and(|s| s.contains_key("$changeStream"))
}

/// The names of the commands sent (not the replies) in the log.
fn sent(log: &CommandLog) -> Vec<String> {
    log.all()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !name.starts_with("ok:"))
        .collect()
}

/// The keys of each renewal command in the log, sorted.
fn renewals(log: &CommandLog) -> Vec<Vec<String>> {
    log.all()
        .iter()
        .filter(|(name, _)| name == "update")
        .filter_map(|(_, command)| renewed_keys(command))
        .map(|keys| {
            let mut keys: Vec<String> = keys
                .iter()
                .filter_map(|k| k.as_str().map(str::to_string))
                .collect();
            keys.sort();
            keys
        })
        .collect()
}

async fn lost_soon(lease: &Lease) {
    tokio::time::timeout(BOUND, lease.status().lost())
        .await
        .unwrap_or_else(|_| panic!("{:?} not lost after {BOUND:?}", lease.key()));
}

#[tokio::test]
async fn a_lease_whose_document_is_deleted_by_id_is_lost_at_once_and_the_others_are_kept() {
    let fx = Fixture::new("loss_delete_id").await;
    let (manager, leases, log) = holder(&fx, &["k0", "k1", "k2"]).await;

    fx.raw().delete_one(doc! { "_id": "k1" }).await.unwrap();
    lost_soon(&leases[1]).await;
    assert_eq!(
        renewals(&log),
        [["k1"]],
        "one check of the lease written, no heartbeat renewal"
    );
    assert!(!leases[0].status().is_lost() && !leases[2].status().is_lost());
    for key in ["k0", "k2"] {
        let doc = fx.doc(key).await;
        assert_eq!(doc.get_str("aid").unwrap(), manager.owner_id());
    }
    manager.shutdown().await.unwrap();
}

#[tokio::test]
async fn deleting_every_document_of_an_owner_id_loses_every_lease_of_that_manager_at_once() {
    let fx = Fixture::new("loss_delete_aid").await;
    let other = fx.manager(TTL).await;
    let theirs = other.acquire("theirs").await.unwrap();
    let keys = ["k0", "k1", "k2", "k3"];
    let (manager, leases, log) = holder(&fx, &keys).await;

    // What a session listener of another application does when it sees the
    // owner's session end.
    let deleted = fx
        .raw()
        .delete_many(doc! { "aid": manager.owner_id() })
        .await
        .unwrap();
    assert_eq!(deleted.deleted_count, 4);
    join_all(leases.iter().map(lost_soon)).await;
    let checked: Vec<String> = renewals(&log).concat();
    let mut sorted = checked.clone();
    sorted.sort();
    assert_eq!(
        sorted, keys,
        "each lease checked once, by the checks of the writes: {checked:?}"
    );
    assert!(
        !theirs.status().is_lost(),
        "another manager's lease is unaffected"
    );
    manager.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test]
async fn rewriting_the_owner_id_of_a_held_lease_loses_it_at_once_and_leaves_the_document() {
    let fx = Fixture::new("loss_rewrite_aid").await;
    let (manager, leases, log) = holder(&fx, &["k", "kept"]).await;
    let before = fx.doc("k").await;

    fx.raw()
        .update_one(doc! { "_id": "k" }, doc! { "$set": { "aid": "other" } })
        .await
        .unwrap();
    lost_soon(&leases[0]).await;
    assert_eq!(renewals(&log), [["k"]]);
    assert!(!leases[1].status().is_lost());
    let after = fx.doc("k").await;
    assert_eq!(after.get_str("aid").unwrap(), "other");
    assert_eq!(
        after.get("lid"),
        before.get("lid"),
        "neither renewed nor released"
    );
    assert_eq!(after.get("exp"), before.get("exp"));
    manager.shutdown().await.unwrap();
}

#[tokio::test]
async fn writes_to_other_keys_own_writes_and_stale_releases_never_lose_a_held_lease() {
    let fx = Fixture::new("loss_harmless").await;
    let other = fx.manager(TTL).await;
    let handed = other.acquire("handoff").await.unwrap();
    let (manager, leases, log) = holder(&fx, &["k", "probe"]).await;

    // A handoff: this manager waits for `handoff`, the other releases it, and
    // the release event may arrive after this manager's acquire reply.
    let waiting = tokio::spawn({
        let manager = manager.clone();
        async move { manager.acquire("handoff").await }
    });
    eventually("the waiter has tried once", BOUND, || {
        let log = log.clone();
        async move { log.count("findAndModify") >= 1 }
    })
    .await;
    assert_eq!(handed.release().await.unwrap(), ReleaseOutcome::Released);
    let handoff = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    // Other keys written by another manager, by this one, by a third party;
    // a payload write on the held lease.
    for i in 0..3 {
        let theirs = other.acquire(format!("b{i}")).await.unwrap();
        let ours = manager.acquire(format!("a{i}")).await.unwrap();
        assert_eq!(theirs.release().await.unwrap(), ReleaseOutcome::Released);
        assert_eq!(ours.release().await.unwrap(), ReleaseOutcome::Released);
    }
    fx.raw()
        .insert_one(doc! { "_id": "foreign", "aid": "x", "ts": 1 })
        .await
        .unwrap();
    fx.raw().delete_one(doc! { "_id": "b0" }).await.unwrap();
    leases[0].set_payload(doc! { "x": 1 }).await.unwrap();
    // The probe is lost by the last write: every earlier event was handled.
    fx.raw().delete_one(doc! { "_id": "probe" }).await.unwrap();
    lost_soon(&leases[1]).await;

    assert!(!leases[0].status().is_lost());
    assert!(!handoff.status().is_lost());
    for keys in renewals(&log) {
        assert!(
            keys.iter().all(|k| k == "probe" || k == "handoff"),
            "only the probe, and the handoff's stale release, are checked: {keys:?}"
        );
    }
    let doc = fx.doc("k").await;
    assert_eq!(doc.get_str("aid").unwrap(), manager.owner_id());
    manager.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

// ----- by default: no stream while merely holding ---------------------------------------

/// One task's uncontended acquire + release: its own writes are not echoed
/// by a stream of writes (none is open), so each cycle is two commands,
/// as raw insert + delete.
#[tokio::test]
async fn one_tasks_uncontended_acquire_and_release_send_two_commands_per_cycle() {
    let fx = Fixture::new("loss_two_commands").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let manager = LeaseManager::connect(options).await.unwrap();
    // A first cycle, so that nothing of the connection's set-up is counted.
    let first = manager.acquire("k").await.unwrap();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    log.clear();
    const CYCLES: usize = 50;
    for _ in 0..CYCLES {
        let lease = manager.acquire("k").await.unwrap();
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    }
    let sent = sent(&log);
    assert_eq!(sent.len(), 2 * CYCLES, "{sent:?}");
    assert!(
        !sent
            .iter()
            .any(|name| name == "aggregate" || name == "getMore"),
        "no stream of writes: {sent:?}"
    );
    manager.shutdown().await.unwrap();
}

/// By default a holder opens no stream of writes, and a lease deleted by
/// someone else is found lost by the heartbeat's renewal.
#[tokio::test]
async fn by_default_a_holder_opens_no_stream_and_its_renewal_finds_a_deleted_lease() {
    let fx = Fixture::new("loss_default").await;
    let (mut options, log) = fx.monitored_options(TTL, "").await;
    options.heartbeat_interval = Some(Duration::from_millis(300));
    let manager = LeaseManager::connect(options).await.unwrap();
    let leases = [
        manager.acquire("k").await.unwrap(),
        manager.acquire("kept").await.unwrap(),
    ];
    // Two renewals of both leases, with no stream opened meanwhile.
    eventually("two heartbeat renewals", BOUND, || {
        let log = log.clone();
        async move { renewals(&log).len() >= 2 }
    })
    .await;
    let before = renewals(&log).len();
    fx.raw().delete_one(doc! { "_id": "k" }).await.unwrap();
    lost_soon(&leases[0]).await;
    assert_eq!(
        leases[0].status().lost_reason(),
        Some(mongo_lease::LossReason::Deleted)
    );
    assert!(!leases[1].status().is_lost());
    let after = renewals(&log);
    assert!(
        after[before..].iter().all(|keys| keys == &["k", "kept"]),
        "found by the heartbeat's renewal of every lease: {after:?}"
    );
    assert!(
        !log.all().iter().any(opens_stream),
        "merely holding opens no stream of writes"
    );
    manager.shutdown().await.unwrap();
}

/// A key that waits for another owner's lease opens the stream of writes
/// (a release wakes the waiter at once); once it merely holds the key, the
/// next heartbeat closes it (a `killCursors`).
#[tokio::test]
async fn a_waiting_key_opens_the_stream_and_the_heartbeat_closes_it_once_it_only_holds() {
    let fx = Fixture::new("loss_stream_waiting").await;
    let other = fx.manager(TTL).await;
    let theirs = other.acquire("k").await.unwrap();
    let (mut options, log) = fx.monitored_options(TTL, "").await;
    options.heartbeat_interval = Some(Duration::from_millis(300));
    let manager = LeaseManager::connect(options).await.unwrap();
    let waiting = tokio::spawn({
        let manager = manager.clone();
        async move { manager.acquire("k").await }
    });
    eventually("the waiter's stream is open", BOUND, || {
        let log = log.clone();
        async move { stream_open(&log.all()) }
    })
    .await;
    assert_eq!(theirs.release().await.unwrap(), ReleaseOutcome::Released);
    let ours = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("woken by the release")
        .unwrap()
        .unwrap();
    eventually("the stream closed", BOUND, || {
        let log = log.clone();
        async move { log.count("killCursors") >= 1 }
    })
    .await;
    assert!(!ours.status().is_lost());
    manager.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

// ----- without a change stream ---------------------------------------------------------

#[tokio::test]
async fn without_a_change_stream_a_rewritten_owner_id_is_lost_at_the_next_renewal() {
    // A `mongod` without `--replSet`: no change streams.
    let server = Standalone::start().await.expect("a standalone mongod");
    // Declared after the server: shut down before it is stopped.
    let clients = super::common::Clients::default();
    let client = clients.connect(&server.uri()).await;
    let heartbeat = Duration::from_millis(500);
    let mut options = mongo_lease::LeaseManagerOptions::builder()
        .database(client.database("poll"))
        .collection("leases")
        .ttl(Duration::from_secs(3))
        .clock_skew(crate::common::clock_skew(Duration::from_secs(3)))
        .build();
    options.heartbeat_interval = Some(heartbeat);
    let manager = LeaseManager::connect(options).await.unwrap();
    let lease = manager.acquire("k").await.unwrap();
    let raw = client.database("poll").collection::<Document>("leases");
    // Two renewals (each moves `ts`): renewals match the document as the
    // manager wrote it. The bound only turns a hang into a failure.
    let ts = || async {
        let doc = raw.find_one(doc! { "_id": "k" }).await.unwrap().unwrap();
        *doc.get_datetime("ts").unwrap()
    };
    for renewal in 1..=2 {
        let before = ts().await;
        eventually(
            &format!("renewal {renewal}"),
            Duration::from_secs(60),
            || async { ts().await > before },
        )
        .await;
    }
    assert!(!lease.status().is_lost());

    raw.update_one(doc! { "_id": "k" }, doc! { "$set": { "aid": "other" } })
        .await
        .unwrap();
    // Renewals matching only `_id` and `lid` would keep it forever.
    lost_soon(&lease).await;
    let doc = raw.find_one(doc! { "_id": "k" }).await.unwrap().unwrap();
    assert_eq!(doc.get_str("aid").unwrap(), "other", "left as rewritten");
    assert!(doc.contains_key("lid"), "not released by the loser");
    manager.shutdown().await.unwrap();
}
