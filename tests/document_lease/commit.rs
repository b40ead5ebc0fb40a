//! In-document leases through the public API, turns and losses: two
//! managers taking turns on one work item, a commit refused after a lost
//! lease (frozen past its TTL, taken over unnoticed), lost-lease tokens.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mongo_lease::{DocumentLease, Error, LeaseManager, ReleaseOutcome};
use mongodb::bson::{DateTime, Document, doc};
use mongodb::{Client, Collection};

use crate::common::{self, Fixture};
use crate::support::{
    HANG, ITEMS, connect_as, insert_item, items, lock_fields, monitored_as, stored,
    wait_until_watching, work_items,
};

/// Two managers (as two processes) take turns on one work item: each turn
/// reads the counter from its acquire and writes the value read + 1 with
/// its commit (a `$set`, not an `$inc`, so a turn that overlapped another
/// would overwrite it). Every read value is seen exactly once, and the
/// final counter equals the number of commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_taking_turns_on_one_work_item_never_lose_an_update() {
    const TURNS: i64 = 25;
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dturns").await;
    insert_item(
        &fx,
        doc! { "_id": "item", "counter": 0_i64, "state": "new" },
    )
    .await;
    let mut workers = Vec::new();
    for name in ["alpha", "bravo"] {
        let manager = connect_as(&fx, name, TTL).await;
        workers.push(tokio::spawn(async move {
            let items = work_items(&manager).await;
            let mut reads = Vec::new();
            for _ in 0..TURNS {
                let item = items.acquire("item").await.unwrap();
                let read = item.document().get_i64("counter").unwrap();
                // Paces the turn: an overlapping turn would read the same
                // value in this gap, and one of the two writes would be lost.
                tokio::time::sleep(Duration::from_millis(5)).await;
                let written = item
                    .commit(doc! {
                        "$set": { "counter": read + 1, "state": name },
                        "$push": { "turns": { "by": name, "read": read } },
                    })
                    .await
                    .unwrap();
                assert_eq!(written.get_i64("counter").unwrap(), read + 1, "{written:?}");
                assert!(!written.contains_key("_lease"), "{written:?}");
                reads.push(read);
            }
            manager.shutdown().await.unwrap();
            reads
        }));
    }
    // A hang guard only (HANG, 60 s): the 50 turns take under 4 s here (the
    // whole test: 3.7 s).
    let mut reads = Vec::new();
    common::within(HANG, "both managers' turns", async {
        for worker in workers {
            reads.extend(worker.await.unwrap());
        }
    })
    .await;
    reads.sort_unstable();
    assert_eq!(
        reads,
        (0..2 * TURNS).collect::<Vec<_>>(),
        "a value was read twice"
    );

    let item = stored(&fx, "item").await;
    assert_eq!(item.get_i64("counter").unwrap(), 2 * TURNS, "{item:?}");
    let turns = item.get_array("turns").unwrap();
    let in_order: Vec<i64> = turns
        .iter()
        .map(|t| t.as_document().unwrap().get_i64("read").unwrap())
        .collect();
    assert_eq!(in_order, (0..2 * TURNS).collect::<Vec<_>>());
    let handovers = turns
        .windows(2)
        .filter(|w| w[0].as_document().unwrap().get("by") != w[1].as_document().unwrap().get("by"))
        .count();
    eprintln!(
        "{} commits, {handovers} handovers between the two managers",
        2 * TURNS
    );
    // Both managers have shut down: the last commit released the lease.
    assert!(!item.contains_key("_lease"), "{item:?}");
}

/// The state the frozen holder tries to commit.
const FROZEN_STATE: &str = "written by the frozen holder";

/// What the frozen holder reports once it has thawed.
struct Thawed {
    /// Whether its lease's token had fired before it tried to commit.
    fired_before: bool,
    /// Its commit's result.
    commit: mongo_lease::Result<Document>,
    /// Whether its lease's token had fired when the commit returned.
    fired_after: bool,
    /// Whether its commit's update reached the server (else the manager
    /// refused it, having already found the lease lost).
    sent: bool,
}

/// A holder whose whole process freezes (a long GC pause, `SIGSTOP`) past
/// its TTL: its heartbeat cannot run, so its lease expires by the server's
/// clock and another manager takes the work item over and holds it. When
/// the holder thaws and commits, the commit is refused with `LeaseLost`,
/// its state is not written, and its lease's token has fired; the
/// successor's lease and state are intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_past_its_ttl_has_its_commit_refused_and_its_state_not_written() {
    const TTL: Duration = Duration::from_secs(2);
    let fx = Fixture::new("dfrozen").await;
    insert_item(
        &fx,
        doc! { "_id": "item", "counter": 0_i64, "state": "new" },
    )
    .await;

    // The frozen process: its own thread, single-threaded runtime and
    // client. Blocking the thread freezes its manager and its caller alike.
    let (held_tx, held_rx) = tokio::sync::oneshot::channel::<u64>();
    let (thaw_tx, thaw_rx) = std::sync::mpsc::channel::<()>();
    let (uri, db) = (common::uri(), fx.db.name().to_owned());
    let lock_collection = fx.collection.clone();
    let frozen = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async move {
            let sent = Arc::new(AtomicBool::new(false));
            let client = commit_monitored_client(&uri, FROZEN_STATE, sent.clone()).await;
            let manager = LeaseManager::connect(
                mongo_lease::LeaseManagerOptions::builder()
                    .database(client.database(&db))
                    .collection(lock_collection)
                    .owner_id("frozen")
                    .ttl(TTL)
                    .clock_skew(crate::common::clock_skew(TTL))
                    .build(),
            )
            .await
            .expect("connect");
            let items = work_items(&manager).await;
            let item = items.acquire("item").await.unwrap();
            let token = item.lease().status().cancellation_token();
            held_tx.send(item.lease().fencing_token()).unwrap();
            // Frozen: nothing on this thread runs until the test thaws it.
            thaw_rx.recv().expect("thaw");
            let fired_before = token.is_cancelled();
            let commit = item
                .commit(doc! {
                    "$set": { "state": FROZEN_STATE },
                    "$inc": { "counter": 100_i64 },
                })
                .await;
            let fired_after = token.is_cancelled();
            manager.shutdown().await.unwrap();
            Thawed {
                fired_before,
                commit,
                fired_after,
                sent: sent.load(Ordering::SeqCst),
            }
        })
    });
    let old_token = tokio::time::timeout(HANG, held_rx)
        .await
        .expect("the frozen holder did not acquire")
        .expect("the frozen holder failed");
    let expires = *lock_fields(&fx, "item")
        .await
        .expect("lock fields")
        .get_datetime("exp")
        .unwrap();

    // The successor waits for the frozen lease to expire, and holds the item.
    let successor = connect_as(&fx, "successor", Duration::from_secs(30)).await;
    let theirs = work_items(&successor).await;
    let item = tokio::time::timeout(HANG, theirs.acquire("item"))
        .await
        .expect("the frozen holder's lease was never taken over")
        .unwrap();
    assert!(item.lease().fencing_token() > old_token);
    let lock = lock_fields(&fx, "item").await.expect("lock fields");
    let taken = *lock.get_datetime("acq").unwrap();
    assert!(
        taken >= expires,
        "taken over at {taken} by the server's clock, before the frozen lease expired at {expires}"
    );
    assert_eq!(item.raw_document().get_i64("counter").unwrap(), 0);

    thaw_tx.send(()).unwrap();
    let thawed = tokio::task::spawn_blocking(move || frozen.join())
        .await
        .unwrap()
        .expect("the frozen process panicked");
    assert!(
        !thawed.fired_before,
        "the token fired while the holder's thread was frozen"
    );
    assert!(
        matches!(thawed.commit, Err(Error::LeaseLost { .. })),
        "{:?}",
        thawed.commit
    );
    assert!(thawed.fired_after, "LeaseLost, but the token has not fired");
    eprintln!(
        "the frozen holder's commit was refused {}",
        if thawed.sent {
            "by the server (conditional write matched nothing)"
        } else {
            "by its manager (the lease's local deadline had passed)"
        }
    );

    // Nothing of the frozen holder's state was written; the successor still
    // holds the item under the same lock fields.
    let now = stored(&fx, "item").await;
    assert_eq!(now.get_i64("counter").unwrap(), 0, "{now:?}");
    assert_eq!(now.get_str("state").unwrap(), "new", "{now:?}");
    let still = now.get_document("_lease").unwrap();
    for field in ["aid", "lid", "tok"] {
        assert_eq!(still.get(field), lock.get(field), "{now:?}");
    }
    assert!(!item.lease().status().is_lost());
    let written = item
        .commit(doc! { "$set": { "state": "done" }, "$inc": { "counter": 1_i64 } })
        .await
        .unwrap();
    assert_eq!(written.get_i64("counter").unwrap(), 1);
    successor.shutdown().await.unwrap();
    let last = stored(&fx, "item").await;
    assert_eq!(
        last,
        doc! { "_id": "item", "counter": 1_i64, "state": "done" }
    );
}

/// A client on the caller's runtime that sets `sent` when a write command
/// (`findAndModify` or `update`) containing `marker` (a commit's new state)
/// starts.
async fn commit_monitored_client(uri: &str, marker: &'static str, sent: Arc<AtomicBool>) -> Client {
    use mongodb::event::{EventHandler, command::CommandEvent};
    let mut options = mongodb::options::ClientOptions::parse(uri)
        .await
        .expect("uri");
    options.command_event_handler = Some(EventHandler::callback(move |event| {
        if let CommandEvent::Started(started) = event
            && ["findAndModify", "update"].contains(&started.command_name.as_str())
            && format!("{:?}", started.command).contains(marker)
        {
            sent.store(true, Ordering::SeqCst);
        }
    }));
    Client::with_options(options).expect("client")
}

/// The commit's conditional write itself refuses a lease lost on the
/// server that its holder has not noticed: on a standalone server (no
/// change stream) with a 100 s heartbeat, the holder still believes it
/// holds the item after another manager took it over, so its commit is sent
/// and matches nothing: `LeaseLost`, nothing written, the token fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_after_a_takeover_its_holder_has_not_noticed_is_refused_by_the_server() {
    const TTL: Duration = Duration::from_secs(300);
    const STATE: &str = "written after the takeover";
    let server = mongo_lease::testkit::Standalone::start()
        .await
        .expect("a standalone mongod");
    // Declared after the server: shut down before it is stopped.
    let clients = common::Clients::default();
    let raw = clients.connect(&server.uri()).await;
    let db = raw.database(&mongo_lease::testkit::unique_name("dunnoticed"));
    let items: Collection<Document> = db.collection(ITEMS);
    items
        .insert_one(doc! { "_id": "item", "state": "new" })
        .await
        .unwrap();
    let sent = Arc::new(AtomicBool::new(false));
    let holder_client = commit_monitored_client(&server.uri(), STATE, sent.clone()).await;
    let connect = |client: Client, name: &str| {
        LeaseManager::connect(
            mongo_lease::LeaseManagerOptions::builder()
                .database(client.database(db.name()))
                .collection("workitem.lock")
                .owner_id(name)
                .ttl(TTL)
                .clock_skew(crate::common::clock_skew(TTL))
                .build(),
        )
    };
    let holder = connect(holder_client.clone(), "holder").await.unwrap();
    let item = work_items(&holder).await.acquire("item").await.unwrap();
    let token = item.lease().status().cancellation_token();
    items
        .update_one(
            doc! { "_id": "item" },
            doc! { "$set": { "_lease.exp": DateTime::from_millis(0) } },
        )
        .await
        .unwrap();
    let successor = connect(clients.connect(&server.uri()).await, "successor")
        .await
        .unwrap();
    let taken = work_items(&successor)
        .await
        .try_acquire("item")
        .await
        .unwrap()
        .expect("an expired lease is taken over at once");
    assert!(taken.lease().fencing_token() > item.lease().fencing_token());
    // Nothing told the holder: no change stream here, next heartbeat in 100 s.
    assert!(!item.lease().status().is_lost());

    let commit = item.commit(doc! { "$set": { "state": STATE } }).await;
    assert!(matches!(commit, Err(Error::LeaseLost { .. })), "{commit:?}");
    assert!(sent.load(Ordering::SeqCst), "the commit was not sent");
    assert!(token.is_cancelled());
    let now = items
        .find_one(doc! { "_id": "item" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(now.get_str("state").unwrap(), "new", "{now:?}");
    assert_eq!(
        now.get_document("_lease").unwrap().get_str("aid").unwrap(),
        "successor"
    );
    assert_eq!(taken.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    successor.shutdown().await.unwrap();
    db.drop().await.unwrap();
    common::shut_down(vec![holder_client]);
}

/// The work item `item` (state `new`) held by a manager with owner id
/// `holder` and `watch_held_leases`, whose change stream of writes to the
/// work items is open: a loss is then found by a change event, before any
/// heartbeat.
async fn watched_holder(fx: &Fixture, ttl: Duration) -> (LeaseManager, DocumentLease<Document>) {
    insert_item(fx, doc! { "_id": "item", "state": "new" }).await;
    let (manager, log) = monitored_as(fx, "holder", ttl).await;
    let item = work_items(&manager).await.acquire("item").await.unwrap();
    wait_until_watching(fx, &log).await;
    (manager, item)
}

/// A manager with owner id `name` that gets the work item `item` at once
/// (`try_acquire`: the lost lease left it free or expired), with a fencing
/// token greater than the lost lease's `old_token`.
async fn taken_at_once(
    fx: &Fixture,
    name: &str,
    ttl: Duration,
    old_token: u64,
) -> (LeaseManager, DocumentLease<Document>) {
    let manager = connect_as(fx, name, ttl).await;
    let taken = work_items(&manager)
        .await
        .try_acquire("item")
        .await
        .unwrap()
        .expect("the lost lease's item is taken at once");
    assert!(taken.lease().fencing_token() > old_token);
    (manager, taken)
}

/// Someone else's write removes the lock field of a held item (`$unset`):
/// the holder's token fires without waiting for its next heartbeat, and
/// its commit is refused with `LeaseLost`, writing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_lock_field_someone_removes_fires_its_token_and_cannot_commit() {
    /// Heartbeat every 100 s: the loss is found by the write's change event.
    const TTL: Duration = Duration::from_secs(300);
    let fx = Fixture::new("dunset").await;
    let (manager, item) = watched_holder(&fx, TTL).await;
    let old_token = item.lease().fencing_token();
    let unset = items(&fx)
        .update_one(doc! { "_id": "item" }, doc! { "$unset": { "_lease": "" } })
        .await
        .unwrap();
    assert_eq!(unset.modified_count, 1);
    let removed_at = tokio::time::Instant::now();
    // A hang guard only (this takes milliseconds); below the heartbeat
    // interval, so only the change event can have found the loss.
    tokio::time::timeout(TTL / 6, item.lease().status().lost())
        .await
        .expect("the lost lease's token did not fire");
    eprintln!(
        "token fired {:?} after the lock field was removed",
        removed_at.elapsed()
    );
    let commit = item.commit(doc! { "$set": { "state": "written" } }).await;
    assert!(matches!(commit, Err(Error::LeaseLost { .. })), "{commit:?}");
    assert_eq!(
        stored(&fx, "item").await,
        doc! { "_id": "item", "state": "new" }
    );

    // The item is free: the next lease has a greater token.
    let (other, next) = taken_at_once(&fx, "other", TTL, old_token).await;
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// A lease that expired by the server's clock is taken over at once by
/// another manager, with a greater token; the old holder's token fires, and
/// its writes (`update`, `commit`) are refused with `LeaseLost`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_taken_over_after_expiry_fires_the_old_holders_token() {
    const TTL: Duration = Duration::from_secs(300);
    let fx = Fixture::new("dtakeover").await;
    let (holder, mut item) = watched_holder(&fx, TTL).await;
    let old_token = item.lease().fencing_token();
    // As if the holder had stopped renewing long ago.
    items(&fx)
        .update_one(
            doc! { "_id": "item" },
            doc! { "$set": { "_lease.exp": DateTime::from_millis(0) } },
        )
        .await
        .unwrap();
    let (successor, taken) = taken_at_once(&fx, "successor", TTL, old_token).await;
    // A hang guard only (this takes milliseconds); below the heartbeat
    // interval, so only the takeover's change event can have found the loss.
    tokio::time::timeout(TTL / 6, item.lease().status().lost())
        .await
        .expect("the old holder's token did not fire");
    let update = item.update(doc! { "$set": { "state": "updated" } }).await;
    assert!(matches!(update, Err(Error::LeaseLost { .. })), "{update:?}");
    let commit = item.commit(doc! { "$set": { "state": "committed" } }).await;
    assert!(matches!(commit, Err(Error::LeaseLost { .. })), "{commit:?}");
    let now = stored(&fx, "item").await;
    assert_eq!(now.get_str("state").unwrap(), "new", "{now:?}");
    assert_eq!(
        now.get_document("_lease").unwrap().get_str("aid").unwrap(),
        "successor"
    );
    assert!(!taken.lease().status().is_lost());
    assert_eq!(taken.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    successor.shutdown().await.unwrap();
}
