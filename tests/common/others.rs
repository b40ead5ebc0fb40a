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

// ----- the patterns with an expiry of their own -------------------------------

/// Pattern 1's collection setup, as its clients make it: a TTL index on
/// `ts` with `expire_after`, and a non-unique index on `aid`.
pub async fn pattern1_indexes(fx: &Fixture, expire_after: std::time::Duration) {
    use mongodb::IndexModel;
    use mongodb::options::IndexOptions;
    let ttl = IndexOptions::builder().expire_after(expire_after).build();
    let ts = IndexModel::builder()
        .keys(doc! { "ts": 1 })
        .options(ttl)
        .build();
    let aid = IndexModel::builder()
        .keys(doc! { "aid": 1 })
        .options(IndexOptions::builder().unique(false).build())
        .build();
    fx.raw()
        .create_indexes([ts, aid])
        .await
        .expect("pattern 1's indexes");
}

/// Pattern 1's lock by a client whose `ts` is `age` old (a holder that
/// locked then, and crashed or still works): its insert of `{_id, ts, aid}`,
/// returned as written.
pub async fn pattern1_lock(
    fx: &Fixture,
    key: &str,
    aid: &str,
    age: std::time::Duration,
) -> Document {
    let ts = DateTime::from_millis(DateTime::now().timestamp_millis() - age.as_millis() as i64);
    let written = doc! { "_id": key, "ts": ts, "aid": aid };
    fx.raw()
        .insert_one(written.clone())
        .await
        .expect("pattern 1's insert");
    written
}

/// Pattern 2's client (npm `distributed-locks-mongodb` 1.0.3) acquires
/// `key` as `value` for `ttl` seconds, by its exact commands: a `findOne`
/// projecting `current_date: "$$NOW"`; if nothing is there, an upsert
/// matching `{_id, value}`; if the lock found is past `obtained_at + ttl`
/// seconds, an upsert guarded by its old `value` and `obtained_at`. Returns
/// whether it holds the lock (an E11000 of a racing upsert: not).
pub async fn pattern2_lock(fx: &Fixture, key: &str, value: &str, ttl: i32) -> bool {
    super::pattern2_client::lock(&fx.raw(), key.into(), value, ttl).await
}

/// Pattern 2's release: `deleteOne({_id, value})`; whether it deleted.
pub async fn pattern2_unlock(fx: &Fixture, key: &str, value: &str) -> bool {
    super::pattern2_client::unlock(&fx.raw(), key.into(), value).await
}

/// Pattern 3's collection setup: a TTL index on `ExpireAt` with
/// `expireAfterSeconds: 0`.
pub async fn pattern3_index(fx: &Fixture) {
    use mongodb::IndexModel;
    use mongodb::options::IndexOptions;
    let ttl = IndexOptions::builder()
        .expire_after(std::time::Duration::ZERO)
        .build();
    let index = IndexModel::builder()
        .keys(doc! { "ExpireAt": 1 })
        .options(ttl)
        .build();
    fx.raw()
        .create_index(index)
        .await
        .expect("pattern 3's index");
}

/// Pattern 3's client (the C# article) acquires `key` for `lifetime` (its
/// own: one minute), by its exact command: `findOneAndUpdate({_id},
/// {$setOnInsert: {_id, ExpireAt: now + lifetime}}, upsert,
/// ReturnDocument.Before)`, `now` by its own clock. `None` (nothing before)
/// means acquired; the document found, or an E11000, that it is held.
pub async fn pattern3_lock(fx: &Fixture, key: &str, lifetime: std::time::Duration) -> bool {
    let expire_at =
        DateTime::from_millis(DateTime::now().timestamp_millis() + lifetime.as_millis() as i64);
    let before = fx
        .raw()
        .find_one_and_update(
            doc! { "_id": key },
            doc! { "$setOnInsert": { "_id": key, "ExpireAt": expire_at } },
        )
        .upsert(true)
        .return_document(mongodb::options::ReturnDocument::Before)
        .await;
    match before {
        Ok(before) => before.is_none(),
        Err(e) if e.to_string().contains("E11000") => false,
        Err(e) => panic!("pattern 3's lock of {key:?}: {e}"),
    }
}

/// Pattern 3's release: `deleteOne({_id})`.
pub async fn pattern3_unlock(fx: &Fixture, key: &str) {
    fx.raw()
        .delete_one(doc! { "_id": key })
        .await
        .expect("pattern 3's deleteOne");
}
