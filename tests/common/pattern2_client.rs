//! The `{_id, value, ttl, obtained_at}` pattern's client (npm
//! `distributed-locks-mongodb` 1.0.3) by its exact commands, on any
//! collection: shared by the integration tests (`common::others`) and the
//! store contract's MongoDB fixture, which includes this file by path.

use mongodb::Collection;
use mongodb::bson::{Bson, Document, doc};

/// Locks `key` as `value` for `ttl` seconds: a `findOne` projecting
/// `current_date: "$$NOW"`; if nothing is there, an upsert matching `{_id,
/// value}`; if the lock found is past `obtained_at + ttl` seconds, an
/// upsert guarded by its old `value` and `obtained_at`. Returns whether it
/// holds the lock (a lock not past it, or an E11000 of the upsert: not).
pub async fn lock(coll: &Collection<Document>, key: Bson, value: &str, ttl: i32) -> bool {
    let projection = doc! {
        "_id": 1, "value": 1, "ttl": 1, "obtained_at": 1, "current_date": "$$NOW",
    };
    let found = coll
        .find_one(doc! { "_id": key.clone() })
        .projection(projection)
        .await
        .expect("pattern 2's findOne");
    let set = doc! {
        "$set": { "_id": key.clone(), "value": value, "ttl": ttl },
        "$currentDate": { "obtained_at": { "$type": "date" } },
    };
    let filter = match found {
        None => doc! { "_id": key.clone(), "value": value },
        Some(lock) => {
            // Its check: `current_date > obtained_at + ttl` seconds.
            let (Ok(now), Ok(obtained_at)) = (
                lock.get_datetime("current_date"),
                lock.get_datetime("obtained_at"),
            ) else {
                return false;
            };
            let ttl_ms = match lock.get("ttl") {
                Some(Bson::Int32(n)) => i64::from(*n) * 1000,
                Some(Bson::Int64(n)) => n * 1000,
                Some(Bson::Double(x)) => (x * 1000.0) as i64,
                _ => return false,
            };
            if now.timestamp_millis() <= obtained_at.timestamp_millis() + ttl_ms {
                return false;
            }
            doc! {
                "_id": key.clone(),
                "value": lock.get("value").cloned().unwrap_or(Bson::Null),
                "obtained_at": *obtained_at,
            }
        }
    };
    match coll.update_one(filter, set).upsert(true).await {
        Ok(_) => true,
        Err(e) if e.to_string().contains("E11000") => false,
        Err(e) => panic!("pattern 2's upsert of {key:?}: {e}"),
    }
}

/// Its release, `deleteOne({_id, value})`: whether it deleted.
pub async fn unlock(coll: &Collection<Document>, key: Bson, value: &str) -> bool {
    coll.delete_one(doc! { "_id": key, "value": value })
        .await
        .expect("pattern 2's deleteOne")
        .deleted_count
        == 1
}
