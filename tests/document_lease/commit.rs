//! In-document leases through the public API: turns of two managers on one
//! work item, commit refused after a lost lease, creation under concurrent
//! acquires, lost-lease tokens.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mongo_lease::{DocumentAcquireOptions, DocumentLeases, Error, LockManager, ReleaseOutcome};
use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Binary, Bson, DateTime, Document, Timestamp, doc, oid::ObjectId};
use mongodb::{Client, Collection};
use serde::Deserialize;

use crate::common::{self, CommandLog, Fixture};

/// The user collection of work items.
const ITEMS: &str = "workitem";

/// Bound that only turns a hang into a failure: what it bounds takes
/// milliseconds (or one TTL of a few seconds) here.
const HANG: Duration = Duration::from_secs(60);

fn items(fx: &Fixture) -> Collection<Document> {
    fx.db.collection(ITEMS)
}

/// The work item `id` as stored (panics if there is none).
async fn stored(fx: &Fixture, id: &str) -> Document {
    items(fx)
        .find_one(doc! { "_id": id })
        .await
        .expect("read the work item")
        .unwrap_or_else(|| panic!("no work item {id:?}"))
}

/// The lock fields of the work item `id` (`_lease`), if it has any.
async fn lock_fields(fx: &Fixture, id: &str) -> Option<Document> {
    stored(fx, id).await.get_document("_lease").ok().cloned()
}

/// The document's BSON bytes: equal bytes are equal fields, values, types
/// and field order.
fn bytes(document: &Document) -> Vec<u8> {
    let mut out = Vec::new();
    document.to_writer(&mut out).expect("encode");
    out
}

/// A manager with its own client (as if in its own process) and owner id `name`.
async fn connect_as(fx: &Fixture, name: &str, ttl: Duration) -> LockManager {
    let mut options = fx.options(ttl).await;
    options.owner_id = Some(name.into());
    LockManager::connect(options).await.expect("connect")
}

async fn work_items(manager: &LockManager) -> DocumentLeases<Document> {
    manager.documents(ITEMS).await.expect("documents")
}

/// A manager as [`connect_as`] whose client logs its commands, so a test
/// can tell when its change stream of writes to the work items is open.
async fn monitored_as(fx: &Fixture, name: &str, ttl: Duration) -> (LockManager, CommandLog) {
    let (mut options, log) = fx.monitored_options(ttl, "").await;
    options.owner_id = Some(name.into());
    (LockManager::connect(options).await.expect("connect"), log)
}

/// Waits (bounded) until the manager that `log` monitors has its change
/// stream of writes to the work items open: a write before that is left to
/// the heartbeat (the stream starts after the acquire).
async fn wait_until_watching(fx: &Fixture, log: &CommandLog) {
    let ns = format!("{}.{ITEMS}", fx.db.name());
    common::eventually("the holder's change stream of writes is open", HANG, || {
        let open = log.all().iter().any(|(name, reply)| {
            name == "ok:aggregate"
                && reply
                    .get_document("cursor")
                    .and_then(|c| c.get_str("ns"))
                    .is_ok_and(|n| n == ns)
        });
        async move { open }
    })
    .await;
}

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
    items(&fx)
        .insert_one(doc! { "_id": "item", "counter": 0_i64, "state": "new" })
        .await
        .unwrap();
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
    let mut reads = Vec::new();
    for worker in workers {
        reads.extend(worker.await.unwrap());
    }
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
    items(&fx)
        .insert_one(doc! { "_id": "item", "counter": 0_i64, "state": "new" })
        .await
        .unwrap();

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
            let manager = LockManager::connect(
                mongo_lease::LockManagerOptions::builder()
                    .database(client.database(&db))
                    .collection(lock_collection)
                    .owner_id("frozen")
                    .ttl(TTL)
                    .build(),
            )
            .await
            .expect("connect");
            let items = work_items(&manager).await;
            let item = items.acquire("item").await.unwrap();
            let token = item.lease().cancellation_token();
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
    assert!(!item.lease().is_lost());
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
        LockManager::connect(
            mongo_lease::LockManagerOptions::builder()
                .database(client.database(db.name()))
                .collection("workitem.lock")
                .owner_id(name)
                .ttl(TTL)
                .build(),
        )
    };
    let holder = connect(holder_client.clone(), "holder").await.unwrap();
    let item = work_items(&holder).await.acquire("item").await.unwrap();
    let token = item.lease().cancellation_token();
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
    assert!(!item.lease().is_lost());

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

/// Four managers race for the same missing work items with
/// `DocumentAcquireOptions::create`, each with its own fields: each item is
/// created once, by the one winner, with the winner's fields; the others
/// find it held (`try_acquire`) or get it after the creator, as it stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_document_is_created_exactly_once_under_concurrent_acquires() {
    const ROUNDS: usize = 10;
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dcreate").await;
    let names = ["m0", "m1", "m2", "m3"];
    let mut managers = Vec::new();
    for name in names {
        managers.push(connect_as(&fx, name, TTL).await);
    }
    let mut handles = Vec::new();
    for manager in &managers {
        handles.push(work_items(manager).await);
    }
    let create = |name: &str| {
        DocumentAcquireOptions::builder()
            .create(doc! { "created_by": name, "turns": 0 })
            .build()
    };

    for round in 0..ROUNDS {
        let id = format!("fresh-{round}");
        let attempts = handles.iter().zip(names).map(|(items, name)| {
            let (items, id, options) = (items.clone(), id.clone(), create(name));
            tokio::spawn(async move {
                let lease = items.try_acquire_with(id, options).await.unwrap();
                lease.map(|lease| (name, lease))
            })
        });
        let mut winners: Vec<_> = futures::future::join_all(attempts)
            .await
            .into_iter()
            .filter_map(|r| r.unwrap())
            .collect();
        assert_eq!(winners.len(), 1, "round {round}: {winners:?}");
        let (winner, lease) = winners.pop().unwrap();
        assert_eq!(
            lease.document(),
            &doc! { "_id": id.as_str(), "created_by": winner, "turns": 0 }
        );
        let count = items(&fx)
            .count_documents(doc! { "_id": id.as_str() })
            .await
            .unwrap();
        assert_eq!(count, 1);
        let mut item = stored(&fx, &id).await;
        assert!(item.remove("_lease").is_some(), "{item:?}");
        assert_eq!(
            item,
            doc! { "_id": id.as_str(), "created_by": winner, "turns": 0 }
        );
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    }

    // Waiting acquires: the creator's lease first, the others in turn after
    // it, each reading the item as the previous commit left it.
    let id = "waited";
    let turns = handles.iter().zip(names).map(|(items, name)| {
        let (items, options) = (items.clone(), create(name));
        tokio::spawn(async move {
            let item = items.acquire_with(id, options).await.unwrap();
            let seen = item.document().clone();
            item.commit(doc! { "$inc": { "turns": 1 }, "$push": { "by": name } })
                .await
                .unwrap();
            seen
        })
    });
    let seen: Vec<Document> = futures::future::join_all(turns)
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    let count = items(&fx)
        .count_documents(doc! { "_id": id })
        .await
        .unwrap();
    assert_eq!(count, 1);
    let item = stored(&fx, id).await;
    assert_eq!(item.get_i32("turns").unwrap(), 4, "{item:?}");
    let by: Vec<&str> = item
        .get_array("by")
        .unwrap()
        .iter()
        .map(|b| b.as_str().unwrap())
        .collect();
    let creator = item.get_str("created_by").unwrap();
    assert_eq!(
        by.first(),
        Some(&creator),
        "the creator's turn came first: {item:?}"
    );
    let mut sorted = by.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, names);
    for s in &seen {
        assert_eq!(
            s.get_str("created_by").unwrap(),
            creator,
            "re-created: {s:?}"
        );
    }
    let mut first_reads: Vec<i32> = seen.iter().map(|s| s.get_i32("turns").unwrap()).collect();
    first_reads.sort_unstable();
    assert_eq!(first_reads, [0, 1, 2, 3]);
    for manager in managers {
        manager.shutdown().await.unwrap();
    }
}

/// A work item with fields of many BSON types, including top-level fields
/// named like the lock fields (`aid`, `lid`, `tok`, `ts`, `exp`, ...): they
/// are the user's, and the lock fields live under `_lease` only.
fn rich_item(id: &str) -> Document {
    doc! {
        "_id": id,
        "title": "réparer la pompe n° 3",
        "counter": 41_i64,
        "small": 7_i32,
        "ratio": 0.5,
        "flag": true,
        "nothing": Bson::Null,
        "tags": ["a", "b", { "nested": [1, 2.5, "c"] }],
        "nested": { "z": 1, "a": { "deep": Bson::Null, "list": [] } },
        "when": DateTime::from_millis(1_700_000_000_123),
        "bytes": Binary { subtype: BinarySubtype::Generic, bytes: vec![0, 1, 2, 255] },
        "oid": ObjectId::parse_str("64b7f0c2a1b2c3d4e5f60718").unwrap(),
        "stamp": Timestamp { time: 1_700_000_000, increment: 3 },
        "aid": "the user's aid",
        "lid": 7,
        "tok": "not a token",
        "acq": [],
        "ts": { "x": 1 },
        "exp": "never",
        "wt": false,
        "yu": Bson::Null,
    }
}

/// Acquire (also with fields to create, on an existing item), heartbeat
/// renewals and release write only the lock field: the rest of the item,
/// and a neighbouring item nobody acquires, stay byte-for-byte as they
/// were (values, types, field order); once the manager has shut down, the
/// item is exactly the original again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renewal_and_release_never_change_the_users_fields() {
    /// Short, so that renewals come every second, yet each renewal has
    /// 1.7 s to land before the holder would give the lease up.
    const TTL: Duration = Duration::from_secs(3);
    let fx = Fixture::new("dfields").await;
    let original = rich_item("item");
    let neighbour = rich_item("neighbour");
    items(&fx)
        .insert_many([original.clone(), neighbour.clone()])
        .await
        .unwrap();
    let manager = connect_as(&fx, "holder", TTL).await;
    let handle = work_items(&manager).await;
    let options = DocumentAcquireOptions::builder()
        .create(doc! { "counter": 0_i64, "title": "overwritten?" })
        .build();
    let item = handle.acquire_with("item", options).await.unwrap();
    assert_eq!(bytes(item.raw_document()), bytes(&original));
    assert_eq!(item.document(), &original);

    let without_lock = |mut d: Document| {
        let lock = d.remove("_lease");
        (d, lock)
    };
    let (now, lock) = without_lock(stored(&fx, "item").await);
    assert_eq!(bytes(&now), bytes(&original), "after acquire: {now:?}");
    let lock = lock.expect("no lock field after acquire");
    let first_ts = *lock.as_document().unwrap().get_datetime("ts").unwrap();

    // Two renewals by the heartbeat (each moves `_lease.ts`).
    let mut renewals = 0;
    let mut last_ts = first_ts;
    let start = tokio::time::Instant::now();
    while renewals < 2 {
        assert!(start.elapsed() < HANG, "no two renewals in {HANG:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (now, lock) = without_lock(stored(&fx, "item").await);
        assert_eq!(bytes(&now), bytes(&original), "after a renewal: {now:?}");
        let ts = *lock
            .expect("lock field gone while held")
            .as_document()
            .unwrap()
            .get_datetime("ts")
            .unwrap();
        if ts != last_ts {
            renewals += 1;
            last_ts = ts;
        }
    }
    assert!(!item.lease().is_lost());

    assert_eq!(item.release().await.unwrap(), ReleaseOutcome::Released);
    let (now, _) = without_lock(stored(&fx, "item").await);
    assert_eq!(bytes(&now), bytes(&original), "after release: {now:?}");
    // Shutdown waits for the removal of a short lease's remaining `{tok}`.
    manager.shutdown().await.unwrap();
    assert_eq!(bytes(&stored(&fx, "item").await), bytes(&original));
    assert_eq!(bytes(&stored(&fx, "neighbour").await), bytes(&neighbour));
}

/// Someone else's write removes the lock field of a held item (`$unset`):
/// the holder's token fires without waiting for its next heartbeat, and
/// its commit is refused with `LeaseLost`, writing nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_whose_lock_field_someone_removes_fires_its_token_and_cannot_commit() {
    /// Heartbeat every 100 s: the loss is found by the write's change event.
    const TTL: Duration = Duration::from_secs(300);
    let fx = Fixture::new("dunset").await;
    items(&fx)
        .insert_one(doc! { "_id": "item", "state": "new" })
        .await
        .unwrap();
    let (manager, log) = monitored_as(&fx, "holder", TTL).await;
    let handle = work_items(&manager).await;
    let item = handle.acquire("item").await.unwrap();
    let old_token = item.lease().fencing_token();
    wait_until_watching(&fx, &log).await;
    let unset = items(&fx)
        .update_one(doc! { "_id": "item" }, doc! { "$unset": { "_lease": "" } })
        .await
        .unwrap();
    assert_eq!(unset.modified_count, 1);
    let removed_at = tokio::time::Instant::now();
    // A hang guard only (this takes milliseconds); below the heartbeat
    // interval, so only the change event can have found the loss.
    tokio::time::timeout(TTL / 6, item.lease().lost())
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
    let other = connect_as(&fx, "other", TTL).await;
    let next = work_items(&other)
        .await
        .try_acquire("item")
        .await
        .unwrap()
        .expect("the item is free");
    assert!(next.lease().fencing_token() > old_token);
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
    items(&fx)
        .insert_one(doc! { "_id": "item", "state": "new" })
        .await
        .unwrap();
    let (holder, log) = monitored_as(&fx, "holder", TTL).await;
    let handle = work_items(&holder).await;
    let mut item = handle.acquire("item").await.unwrap();
    let old_token = item.lease().fencing_token();
    wait_until_watching(&fx, &log).await;
    // As if the holder had stopped renewing long ago.
    items(&fx)
        .update_one(
            doc! { "_id": "item" },
            doc! { "$set": { "_lease.exp": DateTime::from_millis(0) } },
        )
        .await
        .unwrap();
    let successor = connect_as(&fx, "successor", TTL).await;
    let taken = work_items(&successor)
        .await
        .try_acquire("item")
        .await
        .unwrap()
        .expect("an expired lease is taken over at once");
    assert!(taken.lease().fencing_token() > old_token);
    // A hang guard only (this takes milliseconds); below the heartbeat
    // interval, so only the takeover's change event can have found the loss.
    tokio::time::timeout(TTL / 6, item.lease().lost())
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
    assert!(!taken.lease().is_lost());
    assert_eq!(taken.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    successor.shutdown().await.unwrap();
}

/// `update` writes under the lease and keeps it (same lock fields, still
/// held against another manager), returning the document as written, for
/// update operators and pipelines alike (a pipeline that sets the lock
/// field leaves the lease as it was); `commit`, by operators or pipeline,
/// then writes and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_keeps_the_lease_and_returns_the_written_document() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dupdate").await;
    items(&fx)
        .insert_one(doc! { "_id": "item", "counter": 0, "state": "new" })
        .await
        .unwrap();
    let manager = connect_as(&fx, "holder", TTL).await;
    let other = connect_as(&fx, "other", TTL).await;
    let theirs = work_items(&other).await;
    let mut item = work_items(&manager).await.acquire("item").await.unwrap();
    let lock = lock_fields(&fx, "item").await.expect("lock fields");
    let token = item.lease().fencing_token();

    let written = item
        .update(doc! { "$inc": { "counter": 1 }, "$set": { "state": "working" } })
        .await
        .unwrap()
        .clone();
    assert_eq!(
        written,
        doc! { "_id": "item", "counter": 1, "state": "working" }
    );
    assert_eq!(item.raw_document(), &written);
    assert!(!item.lease().is_lost());
    let after = lock_fields(&fx, "item").await.expect("lock fields");
    assert_eq!(after.get("lid"), lock.get("lid"), "{after:?}");
    assert_eq!(after.get("tok"), lock.get("tok"), "{after:?}");
    assert!(
        theirs.try_acquire("item").await.unwrap().is_none(),
        "not held after update"
    );

    let written = item
        .update(vec![
            doc! { "$set": { "counter": { "$add": ["$counter", 10] } } },
        ])
        .await
        .unwrap()
        .clone();
    assert_eq!(
        written,
        doc! { "_id": "item", "counter": 11, "state": "working" }
    );
    assert_eq!(stored(&fx, "item").await.get_i32("counter").unwrap(), 11);

    // A pipeline's stages cannot change the lease: the lock field is
    // restored after them.
    let written = item
        .update(vec![doc! { "$set": { "_lease": "forged", "note": "x" } }])
        .await
        .unwrap()
        .clone();
    assert_eq!(
        written,
        doc! { "_id": "item", "counter": 11, "state": "working", "note": "x" }
    );
    let after = lock_fields(&fx, "item").await.expect("lock fields");
    assert_eq!(after.get("lid"), lock.get("lid"), "{after:?}");
    assert!(!item.lease().is_lost());

    let done = item
        .commit(doc! { "$set": { "state": "done" }, "$unset": { "note": "" } })
        .await
        .unwrap();
    assert_eq!(done, doc! { "_id": "item", "counter": 11, "state": "done" });
    let next = theirs
        .try_acquire("item")
        .await
        .unwrap()
        .expect("free after commit");
    assert!(next.lease().fencing_token() > token);
    assert_eq!(next.document(), &done);
    // A commit by pipeline writes and releases alike.
    let again = next
        .commit(vec![doc! { "$set": { "state": "again" } }])
        .await
        .unwrap();
    assert_eq!(
        again,
        doc! { "_id": "item", "counter": 11, "state": "again" }
    );
    let last = work_items(&manager)
        .await
        .try_acquire("item")
        .await
        .unwrap()
        .expect("held after a pipeline commit");
    assert_eq!(last.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[derive(Debug, Deserialize, PartialEq)]
struct WorkItem {
    #[serde(rename = "_id")]
    id: String,
    state: String,
    runs: i32,
    #[serde(default)]
    log: Vec<String>,
}

/// Typed documents: `documents::<WorkItem>` reads the item (created, then
/// updated, then committed) as a `WorkItem`; an item that is not a
/// `WorkItem` is a `Database` error and its lease is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_documents_are_read_as_the_users_type() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dtyped").await;
    let manager = connect_as(&fx, "holder", TTL).await;
    let typed = manager.documents::<WorkItem>(ITEMS).await.unwrap();
    let options = DocumentAcquireOptions::builder()
        .create(doc! { "state": "new", "runs": 0 })
        .build();
    let mut item = typed.acquire_with("typed", options).await.unwrap();
    let expected = |state: &str, runs, log: &[&str]| WorkItem {
        id: "typed".into(),
        state: state.into(),
        runs,
        log: log.iter().map(|s| s.to_string()).collect(),
    };
    assert_eq!(item.document(), &expected("new", 0, &[]));
    let updated = item
        .update(doc! { "$set": { "state": "working" }, "$inc": { "runs": 1 } })
        .await
        .unwrap();
    assert_eq!(updated, &expected("working", 1, &[]));
    let done = item
        .commit(
            doc! { "$set": { "state": "done" }, "$inc": { "runs": 1 }, "$push": { "log": "a" } },
        )
        .await
        .unwrap();
    assert_eq!(done, expected("done", 2, &["a"]));

    // Not a WorkItem (`state` is a number): refused, and released.
    items(&fx)
        .insert_one(doc! { "_id": "odd", "state": 5, "runs": 0 })
        .await
        .unwrap();
    let odd = typed.acquire("odd").await;
    assert!(matches!(odd, Err(Error::Database(_))), "{odd:?}");
    let raw = work_items(&manager).await;
    let again = raw
        .try_acquire("odd")
        .await
        .unwrap()
        .expect("the lease of an unreadable item was not released");
    assert_eq!(
        again.document(),
        &doc! { "_id": "odd", "state": 5, "runs": 0 }
    );
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// The fields to create are given to a missing item, and to an item that
/// holds nothing but its `_id`; an item with fields of its own keeps them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_fills_a_missing_or_bare_document_and_leaves_others_as_they_are() {
    let fx = Fixture::new("dbare").await;
    items(&fx)
        .insert_many([
            doc! { "_id": "bare" },
            doc! { "_id": "full", "state": "mine" },
        ])
        .await
        .unwrap();
    let manager = connect_as(&fx, "holder", Duration::from_secs(30)).await;
    let handle = work_items(&manager).await;
    let options = DocumentAcquireOptions::builder()
        .create(doc! { "state": "new", "runs": 0 })
        .build();
    for (id, expected) in [
        (
            "missing",
            doc! { "_id": "missing", "state": "new", "runs": 0 },
        ),
        ("bare", doc! { "_id": "bare", "state": "new", "runs": 0 }),
        ("full", doc! { "_id": "full", "state": "mine" }),
    ] {
        let item = handle.acquire_with(id, options.clone()).await.unwrap();
        assert_eq!(item.document(), &expected, "{id}");
        assert_eq!(item.release().await.unwrap(), ReleaseOutcome::Released);
    }
    manager.shutdown().await.unwrap();
    assert_eq!(items(&fx).count_documents(doc! {}).await.unwrap(), 3);
    assert_eq!(
        stored(&fx, "full").await,
        doc! { "_id": "full", "state": "mine" }
    );
}

/// With the lock fields under a field of the user's choice (`lock`), the
/// lock lives there only: a `_lease` field is the user's own, untouched by
/// acquire and release and writable by the user's updates, while updates
/// of `lock` are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_field_of_the_users_choice_holds_the_lock() {
    let fx = Fixture::new("dfield").await;
    items(&fx)
        .insert_one(doc! { "_id": "item", "_lease": "the user's own", "state": "new" })
        .await
        .unwrap();
    let manager = connect_as(&fx, "holder", Duration::from_secs(30)).await;
    let handle = manager
        .documents_in_field::<Document>(ITEMS, "lock")
        .await
        .unwrap();
    assert_eq!(handle.field(), "lock");
    let mut item = handle.acquire("item").await.unwrap();
    assert_eq!(
        item.document(),
        &doc! { "_id": "item", "_lease": "the user's own", "state": "new" }
    );
    let now = stored(&fx, "item").await;
    assert_eq!(now.get_str("_lease").unwrap(), "the user's own");
    let lock = now.get_document("lock").expect("the lock under `lock`");
    assert_eq!(lock.get_str("aid").unwrap(), "holder");
    assert!(lock.contains_key("lid"), "{now:?}");

    let refused = item
        .update(doc! { "$set": { "lock.aid": "forged" } })
        .await
        .cloned();
    assert!(
        matches!(refused, Err(Error::InvalidUpdate { .. })),
        "{refused:?}"
    );
    let written = item
        .commit(doc! { "$set": { "_lease": "changed by the user", "state": "done" } })
        .await
        .unwrap();
    assert_eq!(
        written,
        doc! { "_id": "item", "_lease": "changed by the user", "state": "done" }
    );
    manager.shutdown().await.unwrap();
    assert_eq!(
        stored(&fx, "item").await,
        doc! { "_id": "item", "_lease": "changed by the user", "state": "done" }
    );
}

/// Dropping an in-document lease releases it in the background: another
/// manager gets the item long before the lease could have expired, and the
/// item's own fields are left as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_document_lease_releases_it() {
    /// Far longer than the bound below: only a release can free the item.
    const TTL: Duration = Duration::from_secs(300);
    let fx = Fixture::new("ddrop").await;
    items(&fx)
        .insert_one(doc! { "_id": "item", "state": "new" })
        .await
        .unwrap();
    let holder = connect_as(&fx, "holder", TTL).await;
    let other = connect_as(&fx, "other", TTL).await;
    let item = work_items(&holder).await.acquire("item").await.unwrap();
    let token = item.lease().fencing_token();
    drop(item);
    let next = work_items(&other)
        .await
        .acquire_timeout("item", HANG)
        .await
        .unwrap()
        .expect("the dropped lease was not released");
    assert!(next.lease().fencing_token() > token);
    assert_eq!(next.document(), &doc! { "_id": "item", "state": "new" });
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
    assert_eq!(
        stored(&fx, "item").await,
        doc! { "_id": "item", "state": "new" }
    );
}

/// An update MongoDB refuses (`$inc` of a string) is a `Database` error
/// and writes nothing: after `update` the lease is still held; after
/// `commit` it is released (another manager gets the item long before it
/// could have expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_the_server_refuses_writes_nothing_and_a_failed_commit_releases() {
    const TTL: Duration = Duration::from_secs(300);
    let fx = Fixture::new("drefused").await;
    items(&fx)
        .insert_one(doc! { "_id": "item", "state": "new" })
        .await
        .unwrap();
    let holder = connect_as(&fx, "holder", TTL).await;
    let other = connect_as(&fx, "other", TTL).await;
    let mut item = work_items(&holder).await.acquire("item").await.unwrap();
    let lock = lock_fields(&fx, "item").await.expect("lock fields");
    let bad = doc! { "$inc": { "state": 1 }, "$set": { "touched": true } };

    let update = item.update(bad.clone()).await.cloned();
    assert!(matches!(update, Err(Error::Database(_))), "{update:?}");
    assert!(!item.lease().is_lost());
    let mut now = stored(&fx, "item").await;
    let still = now.remove("_lease").expect("lock field");
    assert_eq!(still.as_document().unwrap().get("lid"), lock.get("lid"));
    assert_eq!(now, doc! { "_id": "item", "state": "new" });

    let commit = item.commit(bad).await;
    assert!(matches!(commit, Err(Error::Database(_))), "{commit:?}");
    let next = work_items(&other)
        .await
        .acquire_timeout("item", HANG)
        .await
        .unwrap()
        .expect("the lease of a failed commit was not released");
    assert_eq!(next.document(), &doc! { "_id": "item", "state": "new" });
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Work items keyed by an `ObjectId`, a number or a document (`_id`s of any
/// type MongoDB accepts): each is acquired by its own `_id`, the lease's key
/// is that `_id`, and numbers follow MongoDB's identity (`7_i32` and
/// `7_i64` are the same item).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_of_any_id_type_are_leased_by_their_id() {
    let fx = Fixture::new("dids").await;
    let oid = ObjectId::parse_str("64b7f0c2a1b2c3d4e5f60718").unwrap();
    items(&fx)
        .insert_many([
            doc! { "_id": oid, "runs": 0 },
            doc! { "_id": 7_i32, "runs": 0 },
            doc! { "_id": { "shard": "eu", "n": 1 }, "runs": 0 },
        ])
        .await
        .unwrap();
    let holder = connect_as(&fx, "holder", Duration::from_secs(30)).await;
    let other = connect_as(&fx, "other", Duration::from_secs(30)).await;
    let (mine, theirs) = (work_items(&holder).await, work_items(&other).await);
    let ids: [Bson; 3] = [
        oid.into(),
        Bson::Int32(7),
        doc! { "shard": "eu", "n": 1 }.into(),
    ];
    for id in &ids {
        let item = mine.acquire(id.clone()).await.unwrap();
        assert_eq!(item.id(), &mongo_lease::LeaseKey::from(id.clone()));
        assert_eq!(item.document().get("_id"), Some(id));
        assert!(
            theirs.try_acquire(id.clone()).await.unwrap().is_none(),
            "{id}"
        );
        item.commit(doc! { "$inc": { "runs": 1 } }).await.unwrap();
    }
    // The same number as an int64: the same item.
    let same = theirs.acquire(7_i64).await.unwrap();
    assert_eq!(same.document().get_i32("runs").unwrap(), 1);
    same.commit(doc! { "$inc": { "runs": 1 } }).await.unwrap();
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
    for (id, runs) in ids.iter().zip([1, 2, 1]) {
        let item = items(&fx)
            .find_one(doc! { "_id": id.clone() })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(item.get_i32("runs").unwrap(), runs, "{item:?}");
        assert!(!item.contains_key("_lease"), "{item:?}");
    }
    assert_eq!(items(&fx).count_documents(doc! {}).await.unwrap(), 3);
}

/// Without fields to create it, a missing item is `DocumentNotFound`, in
/// every acquire variant, and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_document_without_create_is_not_found_and_not_created() {
    let fx = Fixture::new("dmissing").await;
    let manager = connect_as(&fx, "holder", Duration::from_secs(30)).await;
    let handle = work_items(&manager).await;
    let not_found = |result: &mongo_lease::Result<_>| {
        matches!(result, Err(Error::DocumentNotFound { id, .. })
            if id == &mongo_lease::LeaseKey::from("missing"))
    };
    let r = handle.acquire("missing").await.map(drop);
    assert!(not_found(&r), "{r:?}");
    let r = handle.try_acquire("missing").await.map(drop);
    assert!(not_found(&r), "{r:?}");
    let r = handle.acquire_timeout("missing", HANG).await.map(drop);
    assert!(not_found(&r), "{r:?}");
    assert_eq!(items(&fx).count_documents(doc! {}).await.unwrap(), 0);
    manager.shutdown().await.unwrap();
}

/// Bad input gets a clear error and nothing is sent: updates that would
/// write the lock field (`$set`, `$unset`, `$inc` inside it, `$rename` onto
/// it), empty updates and replacement documents are `InvalidUpdate`, and the
/// lease stays held; fields to create naming `_id` or the lock field are
/// `InvalidUpdate`; bad lock field and collection names are `InvalidConfig`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_clear_error_and_nothing_is_sent() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dbad").await;
    items(&fx)
        .insert_one(doc! { "_id": "item", "state": "new" })
        .await
        .unwrap();
    let (options, log) = fx.monitored_options(TTL, "").await;
    let manager = LockManager::connect(options).await.unwrap();
    let handle = work_items(&manager).await;
    let mut item = handle.acquire("item").await.unwrap();
    let lock = lock_fields(&fx, "item").await.expect("lock fields");

    let bad: Vec<mongo_lease::DocumentUpdate> = vec![
        doc! { "$set": { "_lease.lid": "forged" } }.into(),
        doc! { "$set": { "_lease": { "forged": true } } }.into(),
        doc! { "$set": { "state": "forged" }, "$inc": { "_lease.tok": 1 } }.into(),
        doc! { "$unset": { "_lease": "", "forged": "" } }.into(),
        doc! { "$rename": { "state": "_lease" }, "$set": { "forged": 1 } }.into(),
        doc! { "state": "forged" }.into(),
        doc! {}.into(),
        Vec::<Document>::new().into(),
    ];
    for update in bad {
        let result = item.update(update.clone()).await.cloned();
        assert!(
            matches!(result, Err(Error::InvalidUpdate { .. })),
            "{update:?}: {result:?}"
        );
    }
    assert!(!item.lease().is_lost());
    let mut now = stored(&fx, "item").await;
    assert_eq!(now.remove("_lease"), Some(Bson::Document(lock)));
    assert_eq!(now, doc! { "_id": "item", "state": "new" });
    let commit = item
        .commit(doc! { "$set": { "_lease.aid": "forged", "state": "forged" } })
        .await;
    assert!(
        matches!(commit, Err(Error::InvalidUpdate { .. })),
        "{commit:?}"
    );

    for (name, create) in [
        ("_id", doc! { "_id": "other", "state": "forged" }),
        (
            "_lease",
            doc! { "_lease": { "aid": "forged" }, "state": "forged" },
        ),
    ] {
        let options = DocumentAcquireOptions::builder().create(create).build();
        let result = handle.try_acquire_with("new-item", options).await;
        assert!(
            matches!(&result, Err(Error::InvalidUpdate { reason }) if reason.contains(name)),
            "{result:?}"
        );
    }
    let sent: Vec<_> = log
        .all()
        .into_iter()
        .filter(|(_, command)| format!("{command:?}").contains("forged"))
        .collect();
    assert!(sent.is_empty(), "refused input was sent: {sent:?}");
    assert_eq!(
        items(&fx)
            .count_documents(doc! { "_id": { "$ne": "item" } })
            .await
            .unwrap(),
        0
    );

    for field in ["", "_id", "$lease", "a.b", "a\0b"] {
        let result = manager.documents_in_field::<Document>(ITEMS, field).await;
        assert!(
            matches!(result, Err(Error::InvalidConfig { .. })),
            "field {field:?}: {result:?}"
        );
    }
    for collection in ["", "a$b", "system.items", ".items", "items.", "a\0b"] {
        let result = manager.documents::<Document>(collection).await;
        assert!(
            matches!(result, Err(Error::InvalidConfig { .. })),
            "collection {collection:?}: {result:?}"
        );
    }
    manager.shutdown().await.unwrap();
    let mut collections = fx.db.list_collection_names().await.unwrap();
    collections.sort();
    assert_eq!(collections, [ITEMS, fx.collection.as_str()]);
}
