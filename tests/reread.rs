//! What an acquire's re-read proves, on a real `mongod` with the server's
//! `failCommand` fail point (a replica set of its own, started with test
//! commands enabled): a lease handed to a waiting manager's registration
//! and found only by the re-read after its confirming write failed is
//! granted only once a write of that manager renewed it, so its local
//! deadline never outlives the server's expiry.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LockManager, LockManagerOptions, ReleaseOutcome};
use mongodb::bson::{Document, doc};
use mongodb::event::{EventHandler, command::CommandEvent};

/// A hang guard only: each step takes milliseconds to a second.
const LIMIT: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(30);
const COLLECTION: &str = "reread.locks";

/// A manager of owner id `owner` on `rs`, through its own client (app name
/// `owner`, so that a fail point can name it), counting in `finds` the
/// `find` commands whose reply shows a document held by `owner`.
async fn manager(
    rs: &ReplicaSet,
    owner: &str,
    finds: Arc<AtomicU32>,
) -> (LockManager, mongodb::Client) {
    let mut options = mongodb::options::ClientOptions::parse(rs.uri())
        .await
        .unwrap();
    options.app_name = Some(owner.to_string());
    let owner_id = owner.to_string();
    options.command_event_handler = Some(EventHandler::callback(move |event| {
        // A re-read (`find`) whose reply shows the key held by this owner.
        if let CommandEvent::Succeeded(done) = event
            && done.command_name == "find"
            && done
                .reply
                .get_document("cursor")
                .and_then(|c| c.get_array("firstBatch"))
                .is_ok_and(|batch| {
                    batch.iter().any(|d| {
                        d.as_document()
                            .is_some_and(|d| d.get_str("aid") == Ok(owner_id.as_str()))
                    })
                })
        {
            finds.fetch_add(1, Ordering::SeqCst);
        }
    }));
    let client = mongodb::Client::with_options(options).unwrap();
    let manager = LockManager::connect(
        LockManagerOptions::builder()
            .database(client.database("app"))
            .collection(COLLECTION)
            .owner_id(owner.to_string())
            .ttl(TTL)
            .build(),
    )
    .await
    .unwrap();
    (manager, client)
}

/// Sets the `failCommand` fail point: `commands` of the client named
/// `app` fail with `code` (`mode`: e.g. "alwaysOn", "off").
async fn fail_point(
    admin: &mongodb::Database,
    mode: &str,
    app: &str,
    commands: &[&str],
    code: i32,
) {
    admin
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": mode,
            "data": { "failCommands": commands, "errorCode": code, "appName": app },
        })
        .await
        .expect("the fail point");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_lease_found_only_by_a_re_read_is_granted_after_a_write_renews_it() {
    let rs = ReplicaSet::start(
        ReplicaSetOptions::default()
            .extra_arg("--setParameter")
            .extra_arg("enableTestCommands=1"),
    )
    .await
    .expect("a replica set with test commands");
    let admin_client = mongodb::Client::with_uri_str(rs.uri()).await.unwrap();
    let admin = admin_client.database("admin");
    let locks = admin_client
        .database("app")
        .collection::<Document>(COLLECTION);
    // A hears of no handoff on a change stream (its streams cannot open):
    // its polls confirm the handed lease, as after a failover.
    fail_point(&admin, "alwaysOn", "reread-a", &["aggregate"], 2).await;
    let finds = Arc::new(AtomicU32::new(0));
    let (b, b_client) = manager(&rs, "reread-b", Arc::default()).await;
    let (a, a_client) = manager(&rs, "reread-a", finds.clone()).await;
    let held = b.acquire("k").await.unwrap();
    let waiter = tokio::spawn({
        let a = a.clone();
        async move { a.acquire("k").await }
    });
    common::eventually("A registered in k's queue", LIMIT, || async {
        locks
            .find_one(doc! { "_id": "k", "q.aid": "reread-a" })
            .await
            .unwrap()
            .is_some()
    })
    .await;

    // A's writes (and its change streams: one `failCommand` fail point at a
    // time, this one replaces the first) fail from now on (error 6, HostUnreachable: the driver
    // retries it once, and that fails too) without applying.
    fail_point(
        &admin,
        "alwaysOn",
        "reread-a",
        &["findAndModify", "update", "aggregate"],
        6,
    )
    .await;
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    let handed = locks.find_one(doc! { "_id": "k" }).await.unwrap().unwrap();
    assert_eq!(handed.get_str("aid").unwrap(), "reread-a", "handed to A");
    // A's next poll fails and its re-read finds the handed lease.
    common::eventually("A's re-read of the handed lease", LIMIT, || async {
        finds.load(Ordering::SeqCst) > 0
    })
    .await;
    fail_point(&admin, "off", "reread-a", &[], 0).await;

    let lease = tokio::time::timeout(LIMIT, waiter)
        .await
        .expect("granted")
        .unwrap()
        .unwrap();
    let deadline = lease.deadline().expect("live");
    let local_deadline =
        SystemTime::now() + deadline.saturating_duration_since(tokio::time::Instant::now());
    let doc = locks.find_one(doc! { "_id": "k" }).await.unwrap().unwrap();
    let exp = doc.get_datetime("exp").unwrap().to_system_time();
    assert_eq!(
        doc.get_i64("tok").unwrap() as u64,
        lease.fencing_token(),
        "the handed lease: {doc}"
    );
    // Granted from the read, its deadline would count from the failed
    // attempt's send + the TTL, while the handoff wrote only `hx` (6 s).
    assert!(
        local_deadline <= exp,
        "the local deadline ({local_deadline:?}) is within the server's expiry ({exp:?}): {doc}"
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
    common::shut_down(vec![a_client, b_client, admin_client]);
}
