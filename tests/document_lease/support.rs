//! Helpers shared by the in-document lease tests: the user collection of
//! work items and its documents as stored, managers connected as separate
//! processes, and the TTL of tests that decide themselves when a lease
//! changes.

use std::time::Duration;

use mongo_lease::{DocumentLeases, LeaseManager};
use mongodb::Collection;
use mongodb::bson::{Bson, Document, doc};

use crate::common::{self, CommandLog, Fixture};

/// Long enough that no heartbeat (every TTL / 3) renews a lease while a
/// test runs (a test takes well under a second, so this is over 100x that):
/// the tests decide when the lock document changes.
pub(crate) const LONG_TTL: Duration = Duration::from_secs(300);

/// The user collection of work items.
pub(crate) const ITEMS: &str = "workitem";

/// Bound that only turns a hang into a failure: what it bounds takes
/// milliseconds (or one TTL of a few seconds) here.
pub(crate) const HANG: Duration = Duration::from_secs(60);

/// The user collection of work items of the fixture's database.
pub(crate) fn items(fx: &Fixture) -> Collection<Document> {
    fx.db.collection(ITEMS)
}

/// Stores the work item `item` (a plain insert, as the user's other code
/// would).
pub(crate) async fn insert_item(fx: &Fixture, item: Document) {
    items(fx)
        .insert_one(item)
        .await
        .expect("insert the work item");
}

/// The work item `id` as stored (panics if there is none).
pub(crate) async fn stored(fx: &Fixture, id: &str) -> Document {
    items(fx)
        .find_one(doc! { "_id": id })
        .await
        .expect("read the work item")
        .unwrap_or_else(|| panic!("no work item {id:?}"))
}

/// The lock fields of the work item `id` (`_lease`), if it has any.
pub(crate) async fn lock_fields(fx: &Fixture, id: &str) -> Option<Document> {
    stored(fx, id).await.get_document("_lease").ok().cloned()
}

/// The document's BSON bytes: equal bytes are equal fields, values, types
/// and field order.
pub(crate) fn bytes(document: &Document) -> Vec<u8> {
    let mut out = Vec::new();
    document.to_writer(&mut out).expect("encode");
    out
}

/// A manager with its own client (as if in its own process) and owner id `name`.
pub(crate) async fn connect_as(fx: &Fixture, name: &str, ttl: Duration) -> LeaseManager {
    let mut options = fx.options(ttl).await;
    options.owner_id = Some(name.into());
    LeaseManager::connect(options).await.expect("connect")
}

/// The in-document leases of `manager` on the work items.
pub(crate) async fn work_items(manager: &LeaseManager) -> DocumentLeases<Document> {
    manager.documents(ITEMS).await.expect("documents")
}

/// The usual prologue: stores the work item `item` ([`insert_item`]), then
/// connects the manager `holder` ([`connect_as`]) and opens its in-document
/// leases of the work items ([`work_items`]).
pub(crate) async fn item_and_holder(
    fx: &Fixture,
    item: Document,
    ttl: Duration,
) -> (LeaseManager, DocumentLeases<Document>) {
    insert_item(fx, item).await;
    let manager = connect_as(fx, "holder", ttl).await;
    let handle = work_items(&manager).await;
    (manager, handle)
}

/// A manager as [`connect_as`], with `watch_held_leases` (its change stream
/// of writes stays open while it holds a lease), whose client logs its
/// commands, so a test can tell when that stream is open.
pub(crate) async fn monitored_as(
    fx: &Fixture,
    name: &str,
    ttl: Duration,
) -> (LeaseManager, CommandLog) {
    let (mut options, log) = fx.monitored_options(ttl, "").await;
    options.owner_id = Some(name.into());
    options.watch_held_leases = true;
    (LeaseManager::connect(options).await.expect("connect"), log)
}

/// Waits (bounded) until the manager that `log` monitors has its change
/// stream of writes to the work items open: a write before that is left to
/// the heartbeat (the stream starts after the acquire).
pub(crate) async fn wait_until_watching(fx: &Fixture, log: &CommandLog) {
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

/// The lease id stored in the lock document of `key`, if any.
pub(crate) async fn stored_lid(fx: &Fixture, key: &str) -> Option<Bson> {
    fx.doc(key).await.get("lid").cloned()
}

/// The transaction tests' user collection, `items` (apart from the work
/// items of the in-document leases).
pub(crate) fn txn_items(fx: &Fixture) -> Collection<Document> {
    fx.db.collection("items")
}

/// Stores `seed` in the transaction tests' user collection (a plain insert,
/// before the test's lease) and returns that collection.
pub(crate) async fn seed_txn_items(fx: &Fixture, seed: Document) -> Collection<Document> {
    let items = txn_items(fx);
    items.insert_one(seed).await.expect("seed");
    items
}

/// How many documents the collection `items` holds (the transaction tests' user collection).
pub(crate) async fn items_count(fx: &Fixture) -> u64 {
    txn_items(fx).count_documents(doc! {}).await.unwrap()
}
