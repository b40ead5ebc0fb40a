//! Other applications' lock clients on the lock collection, by their exact
//! commands: an insert-style client (`{_id, ts, aid}`, released by a delete)
//! and a client that locks by upserting a bare `{_id}`. Shared by the
//! library's and the CLI's tests of sharing a collection.

use mongodb::bson::{DateTime, Document, doc};

use super::Fixture;

/// The insert-style client's owner id (`aid`).
pub const OTHER_APP: &str = "java-app-1";

/// The insert-style client acquires `key` as owner `aid`: it inserts its
/// lock document, returned as written.
pub async fn foreign_lock(fx: &Fixture, key: &str, aid: &str) -> Document {
    let written = doc! { "_id": key, "ts": DateTime::now(), "aid": aid };
    fx.raw()
        .insert_one(written.clone())
        .await
        .expect("the other application's insert");
    written
}

/// The insert-style client's acquire as owner `other-app`: `true` if it
/// inserted its lock document, `false` on E11000 (held).
pub async fn foreign_insert(fx: &Fixture, key: &str) -> bool {
    let lock = doc! { "_id": key, "ts": DateTime::now(), "aid": "other-app" };
    match fx.raw().insert_one(lock).await {
        Ok(_) => true,
        Err(e) if e.to_string().contains("E11000") => false,
        Err(e) => panic!("foreign insert of {key:?}: {e}"),
    }
}

/// The stored document of `key` as BSON bytes (field order and types included).
pub async fn stored_bytes(fx: &Fixture, key: &str) -> Option<Vec<u8>> {
    fx.raw()
        .find_one(doc! { "_id": key })
        .await
        .expect("read the document")
        .map(|d| mongodb::bson::to_vec(&d).expect("BSON"))
}

/// `doc` as BSON bytes, to compare with [`stored_bytes`].
pub fn bytes(doc: &Document) -> Option<Vec<u8>> {
    Some(mongodb::bson::to_vec(doc).expect("BSON"))
}

/// The key the bare-`{_id}` client locks.
pub const BARE: &str = "lock_bare";

/// A client that locks by upserting `_id` alone tries to lock `key`, with
/// its exact command: `findOneAndUpdate({_id}, {$setOnInsert: {_id}},
/// upsert, ReturnDocument.Before)`. Returns what it reads back: `None`
/// means it acquired (it inserted the bare `{_id}`), a document that the
/// key is held.
pub async fn bare_lock(fx: &Fixture, key: &str) -> Option<Document> {
    fx.raw()
        .find_one_and_update(doc! { "_id": key }, doc! { "$setOnInsert": { "_id": key } })
        .upsert(true)
        .return_document(mongodb::options::ReturnDocument::Before)
        .await
        .expect("the other client's lock command")
}

/// That client releases `key`: `deleteOne({_id})`.
pub async fn bare_unlock(fx: &Fixture, key: &str) {
    let deleted = fx.raw().delete_one(doc! { "_id": key }).await.unwrap();
    assert_eq!(deleted.deleted_count, 1, "the other client held {key}");
}
