//! The two fixtures: the in-memory twin and a collection on MongoDB.

use std::time::Duration;

use mongodb::bson::{Bson, DateTime, Document, doc};
use tokio::time::Instant;
use uuid::Uuid;

use super::{FIELD, Fixture, MARGIN, Planted, Raw, TTL, YIELD};
use crate::config::ReleaseMode;
use crate::foreign::ForeignRules;
use crate::key::LeaseKey;
use crate::sim::others;
use crate::store::field;
use crate::store::memory::{ForeignWrite, MemoryDb, MemoryStore};
use crate::store::{AcquireOutcome, MongoStore, Store};

use super::super::pattern2_client;

/// The twin's user collection of in-document leases.
const DOCUMENTS: &str = "documents";

/// The twin's user collection of documents locked by `LockId` / `LockTime`.
const LOCK_ID_DOCUMENTS: &str = "lock_id_documents";

/// `LockIdFields` with `max` as `max_duration`.
fn lock_id_fields(max: Duration) -> Option<std::sync::Arc<crate::lock_id_fields::LockIdFields>> {
    Some(std::sync::Arc::new(
        crate::lock_id_fields::LockIdFields::builder()
            .max_duration(max)
            .build(),
    ))
}

// ----- the twin ---------------------------------------------------------------

pub(super) struct MemoryFixture {
    db: MemoryDb,
}

impl Fixture for MemoryFixture {
    type Store = MemoryStore;

    async fn new() -> Self {
        MemoryFixture {
            db: MemoryDb::new(),
        }
    }

    async fn store(&self, owner: &str) -> MemoryStore {
        self.db
            .store(owner, TTL)
            .with_yield_window(YIELD)
            .with_safety_margin(MARGIN)
            .with_light_acquire()
    }

    async fn delete_mode_store(&self, owner: &str) -> MemoryStore {
        self.store(owner)
            .await
            .with_release_mode(ReleaseMode::Delete)
    }

    async fn delaying_store(&self, owner: &str, delay: Duration) -> MemoryStore {
        self.store(owner).await.with_lock_delay(delay)
    }

    async fn expire(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        self.db.expire(key);
    }

    async fn delete(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        let doc = self.db.doc(key).expect("a document to delete");
        assert!(doc.is_free_at(Instant::now()), "deleting a live lease");
        // Strictly after `exp` and the last write's `ts` by the server's
        // clock, in its milliseconds, as the TTL monitor (the Mongo
        // fixture's condition): the token rule's time part then keeps the
        // next token above the deleted one's.
        let last = self.db.date(doc.exp.max(doc.renewed)).timestamp_millis();
        while self.db.date(self.db.server_now()).timestamp_millis() <= last {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        self.db.delete(key);
    }

    async fn put_foreign(&self, key: impl Into<LeaseKey>, owner: &str) {
        let now = self.db.date(self.db.server_now());
        let lock = doc! { field::RENEWED_AT: now, field::OWNER: owner };
        self.db.foreign_write(key, |_| ForeignWrite::Replace(lock));
    }

    async fn put_bare(&self, key: impl Into<LeaseKey>) {
        self.db
            .foreign_write(key, |_| ForeignWrite::Replace(Document::new()));
    }

    async fn pattern2_lock(&self, key: impl Into<LeaseKey>, value: &str, ttl_secs: i32) -> bool {
        let key = key.into();
        let found = others::pattern2_read(&self.db, key.clone());
        others::pattern2_lock(&self.db, key, found.as_ref(), value, i64::from(ttl_secs))
    }

    async fn pattern2_unlock(&self, key: impl Into<LeaseKey>, value: &str) -> bool {
        self.db.foreign_write(key, |doc| match doc {
            Some(doc) if doc.get_str("value") == Ok(value) => ForeignWrite::Delete,
            _ => ForeignWrite::Keep,
        })
    }

    async fn store_with_rules(&self, owner: &str, rules: ForeignRules) -> MemoryStore {
        self.db
            .clone()
            .with_foreign_rules(rules)
            .unwrap()
            .store(owner, TTL)
            .with_yield_window(YIELD)
            .with_safety_margin(MARGIN)
            .with_light_acquire()
    }

    async fn put_foreign_doc(&self, key: impl Into<LeaseKey>, fields: Vec<(&str, Planted)>) {
        let now = self.db.system_time(self.db.server_now());
        let mut doc = Document::new();
        for (name, value) in fields {
            let value = match value {
                Planted::Value(v) => v,
                Planted::At(ms) => {
                    let at = DateTime::from_system_time(now).timestamp_millis() + ms;
                    Bson::DateTime(DateTime::from_millis(at))
                }
            };
            doc.insert(name, value);
        }
        self.db.foreign_write(key, |_| ForeignWrite::Replace(doc));
    }

    async fn foreign_unchanged(&self, key: impl Into<LeaseKey>) -> bool {
        let key = &key.into();
        self.db.foreign(key).is_some() && self.db.doc(key).is_none()
    }

    async fn delete_now(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        assert!(self.db.doc(key).is_some(), "no document {key:?} to delete");
        self.db.delete(key);
    }

    async fn rewrite_owner(&self, key: impl Into<LeaseKey>, owner: &str) {
        let key = &key.into();
        assert!(self.db.doc(key).is_some(), "no document {key:?} to rewrite");
        self.db.set_owner(key, owner);
    }

    async fn documents(&self, owner: &str) -> std::sync::Arc<dyn Store> {
        self.store(owner)
            .await
            .documents(DOCUMENTS, FIELD, None)
            .expect("the twin's in-document leases")
    }

    async fn documents_with_lock_id(
        &self,
        owner: &str,
        max: Duration,
    ) -> std::sync::Arc<dyn Store> {
        self.store(owner)
            .await
            .documents(LOCK_ID_DOCUMENTS, FIELD, lock_id_fields(max))
            .expect("the twin's in-document leases with LockId / LockTime")
    }

    async fn client_lock(
        &self,
        key: impl Into<LeaseKey>,
        ahead_ms: i64,
        max: Duration,
    ) -> Option<Uuid> {
        let documents = self.db.documents(LOCK_ID_DOCUMENTS, FIELD);
        let now = documents.date(documents.server_now()).timestamp_millis();
        documents.lock_by_id(key, DateTime::from_millis(now + ahead_ms), max)
    }

    async fn client_unlock(&self, key: impl Into<LeaseKey>, lock_id: Uuid) -> bool {
        self.db
            .documents(LOCK_ID_DOCUMENTS, FIELD)
            .unlock_by_id(key, lock_id)
    }

    async fn expire_document(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        let documents = self.db.documents(DOCUMENTS, FIELD);
        assert!(
            documents.doc(key).is_some(),
            "no lease on {key:?} to expire"
        );
        documents.expire(key);
    }

    async fn cleanup(self) {}

    async fn expire_holder(&self, key: impl Into<LeaseKey>, lease_id: Uuid) {
        self.db.expire_holder(key, lease_id);
    }

    async fn reread(
        &self,
        store: &MemoryStore,
        key: impl Into<LeaseKey>,
        lease_id: Uuid,
        shape: crate::kind::LeaseShape,
    ) -> AcquireOutcome {
        store
            .reread_acquire(key.into(), lease_id, TTL, shape)
            .await
            .expect("a re-read")
    }

    async fn reread_document(
        &self,
        owner: &str,
        key: impl Into<LeaseKey>,
        lease_id: Uuid,
    ) -> AcquireOutcome {
        self.store(owner)
            .await
            .document_store(DOCUMENTS, FIELD)
            .reread_acquire(key.into(), lease_id, TTL, Default::default())
            .await
            .expect("a re-read")
    }

    async fn expire_mark(&self, key: impl Into<LeaseKey>) {
        self.db.expire_mark(key);
    }

    async fn lapse_registrations(&self, key: impl Into<LeaseKey>) {
        self.db.lapse_registrations(key);
    }

    async fn queue(&self, key: impl Into<LeaseKey>) -> Vec<String> {
        let now = Instant::now();
        self.db.doc(key).map_or_else(Vec::new, |doc| {
            doc.live_queue(now).map(|w| w.owner.clone()).collect()
        })
    }

    async fn expire_hold(&self, key: impl Into<LeaseKey>) {
        self.db.expire_hold(key);
    }

    async fn run_ahead(&self, key: impl Into<LeaseKey>, ahead: Duration) {
        self.db.run_ahead(key, ahead);
    }

    async fn lifetime(&self, key: impl Into<LeaseKey>) -> Duration {
        let doc = self.db.doc(key).expect("a document");
        doc.exp - doc.renewed
    }

    async fn raw(&self, key: impl Into<LeaseKey>) -> Option<Raw> {
        let key = &key.into();
        let now = Instant::now();
        self.db.doc(key).map(|d| Raw {
            expired: d.is_free_at(now),
            yielded: d.yield_until.is_some_and(|until| until > now),
            waiting: d.waiting_since.is_some(),
            owner: d.owner,
            lease_id: d.lease_id,
            token: d.token,
            payload: d.payload,
        })
    }
}

// ----- MongoDB ----------------------------------------------------------------

pub(super) struct MongoFixture {
    db: mongodb::Database,
    collection: String,
    /// The foreign documents written by `put_foreign`, as written.
    foreign: std::sync::Mutex<std::collections::HashMap<LeaseKey, Document>>,
}

impl MongoFixture {
    fn raw_collection(&self) -> mongodb::Collection<Document> {
        self.db.collection(&self.collection)
    }

    /// The user collection of [`Fixture::documents`].
    fn documents_collection(&self) -> String {
        format!("{}_documents", self.collection)
    }

    /// The user collection of [`Fixture::documents_with_lock_id`].
    fn lock_id_collection(&self) -> mongodb::Collection<Document> {
        self.db
            .collection(&format!("{}_lock_id_documents", self.collection))
    }
}

impl Fixture for MongoFixture {
    type Store = MongoStore;

    async fn new() -> Self {
        let client = mongodb::Client::with_uri_str(crate::testkit::shared_uri())
            .await
            .expect("a client of the test deployment");
        let fixture = MongoFixture {
            db: client.database("mongo_lease_contract"),
            collection: crate::testkit::unique_name("c"),
            foreign: Default::default(),
        };
        // Indexes as a manager creates them; a long grace keeps the TTL
        // monitor away from the scenario's documents.
        let timing = crate::config::LeaseManagerOptions::builder()
            .database(fixture.db.clone())
            .collection(fixture.collection.clone())
            .build()
            .timing()
            .expect("default timing");
        fixture
            .store("prepare")
            .await
            .prepare(Duration::from_secs(3600), &timing)
            .await
            .expect("prepare the lock collection");
        fixture
    }

    async fn store(&self, owner: &str) -> MongoStore {
        MongoStore::new(
            &self.db,
            &self.collection,
            owner.to_string(),
            TTL,
            YIELD,
            Duration::from_secs(30),
        )
        .with_safety_margin(MARGIN)
    }

    async fn delete_mode_store(&self, owner: &str) -> MongoStore {
        self.store(owner)
            .await
            .with_release_mode(ReleaseMode::Delete)
    }

    async fn delaying_store(&self, owner: &str, delay: Duration) -> MongoStore {
        self.store(owner).await.with_lock_delay(delay)
    }

    async fn expire(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        // `exp = min(exp, $$NOW)`: expired, but not so long ago that the TTL
        // monitor (grace: one hour) would delete the document meanwhile; not
        // before a minimum hold (`hl`), which outlives the holder.
        let result = self
            .raw_collection()
            .update_one(
                doc! { "_id": key },
                vec![
                    doc! { "$set": { "exp": { "$max": [{ "$min": ["$exp", "$$NOW"] }, "$hl"] } } },
                    // Restated as every write of the store does ("Read by
                    // other clients" in `store`).
                    doc! { "$set": { "ttl": { "$divide": [
                        { "$subtract": ["$exp", "$obtained_at"] },
                        1000.0,
                    ]}}},
                ],
            )
            .await
            .expect("expire the lease");
        assert_eq!(result.matched_count, 1, "no document to expire");
    }

    async fn delete(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        // Strictly after `exp` and the last write's `ts` by the server's
        // clock, as the TTL monitor (which deletes after `exp` + grace). The
        // condition holds within a millisecond; the bound is a liveness one.
        let due = doc! {
            "_id": key,
            "$expr": { "$gt": ["$$NOW", { "$max": ["$exp", "$ts"] }] },
        };
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            let result = self
                .raw_collection()
                .delete_one(due.clone())
                .await
                .expect("delete the document");
            if result.deleted_count == 1 {
                return;
            }
            assert!(
                self.raw(key).await.is_some(),
                "no document {key:?} to delete"
            );
            assert!(Instant::now() < give_up, "{key:?} never became due");
            tokio::task::yield_now().await;
        }
    }

    async fn reread(
        &self,
        store: &MongoStore,
        key: impl Into<LeaseKey>,
        lease_id: Uuid,
        shape: crate::kind::LeaseShape,
    ) -> AcquireOutcome {
        store
            .reread_acquire(key.into(), lease_id, TTL, shape)
            .await
            .expect("a re-read")
    }

    async fn reread_document(
        &self,
        owner: &str,
        key: impl Into<LeaseKey>,
        lease_id: Uuid,
    ) -> AcquireOutcome {
        self.store(owner)
            .await
            .reread_document(&self.documents_collection(), FIELD, key.into(), lease_id)
            .await
            .expect("a re-read")
    }

    async fn expire_holder(&self, key: impl Into<LeaseKey>, lease_id: Uuid) {
        let key = key.into();
        let lid = mongodb::bson::Uuid::from_bytes(lease_id.into_bytes());
        let entry = doc! { "$cond": [
            { "$eq": ["$$this.lid", lid] },
            { "$mergeObjects": ["$$this", { "exp": { "$min": ["$$this.exp", "$$NOW"] } }] },
            "$$this",
        ]};
        let result = self
            .raw_collection()
            .update_one(
                doc! { "_id": key.to_bson(), "hs.lid": lid },
                vec![
                    doc! { "$set": { "hs": { "$map": { "input": "$hs", "in": entry } } } },
                    doc! { "$set": { "exp": { "$ifNull": [{ "$max": "$hs.exp" }, "$$NOW"] } } },
                ],
            )
            .await
            .expect("expire the holder");
        assert_eq!(result.matched_count, 1, "no holder {lease_id} of {key:?}");
    }

    async fn expire_mark(&self, key: impl Into<LeaseKey>) {
        let key = key.into();
        let result = self
            .raw_collection()
            .update_one(
                doc! { "_id": key.to_bson(), "xw": { "$exists": true } },
                vec![doc! { "$set": { "xw.exp": { "$min": ["$xw.exp", "$$NOW"] } } }],
            )
            .await
            .expect("expire the waiting mark");
        assert_eq!(result.matched_count, 1, "no waiting mark on {key:?}");
    }

    async fn lapse_registrations(&self, key: impl Into<LeaseKey>) {
        let key = key.into();
        let lapsed = doc! { "$map": { "input": "$q", "in": { "$mergeObjects": [
            "$$this",
            { "re": { "$subtract": ["$$NOW", 1_i64] } },
        ]}}};
        let result = self
            .raw_collection()
            .update_one(
                doc! { "_id": key.to_bson(), "q": { "$exists": true } },
                vec![doc! { "$set": { "q": lapsed } }],
            )
            .await
            .expect("lapse the registrations");
        assert_eq!(result.matched_count, 1, "no queue on {key:?}");
    }

    async fn queue(&self, key: impl Into<LeaseKey>) -> Vec<String> {
        let key = key.into();
        let Some(doc) = self
            .raw_collection()
            .find_one(doc! { "_id": key.to_bson() })
            .projection(doc! { "q": 1, "now": "$$NOW" })
            .await
            .expect("read the queue")
        else {
            return Vec::new();
        };
        let now = doc.get_datetime("now").expect("now");
        doc.get_array("q")
            .map(|q| {
                q.iter()
                    .filter_map(Bson::as_document)
                    .filter(|e| e.get_datetime("re").is_ok_and(|re| re > now))
                    .map(|e| e.get_str("aid").expect("aid").to_string())
                    .collect()
            })
            .unwrap_or_default()
    }

    async fn expire_hold(&self, key: impl Into<LeaseKey>) {
        let key = key.into();
        let result = self
            .raw_collection()
            .update_one(
                doc! { "_id": key.to_bson(), "hl": { "$exists": true } },
                vec![doc! { "$set": {
                    "hl": { "$min": ["$hl", "$$NOW"] },
                    "exp": { "$min": ["$exp", "$$NOW"] },
                } }],
            )
            .await
            .expect("pass the minimum hold");
        assert_eq!(result.matched_count, 1, "no minimum hold on {key:?}");
    }

    async fn run_ahead(&self, key: impl Into<LeaseKey>, ahead: Duration) {
        let key = key.into();
        let result = self
            .raw_collection()
            .update_one(
                doc! { "_id": key.to_bson(), "lid": { "$exists": false } },
                vec![doc! { "$set": { "exp": { "$add": ["$$NOW", ahead.as_millis() as i64] } } }],
            )
            .await
            .expect("move exp ahead");
        assert_eq!(result.matched_count, 1, "no released document {key:?}");
    }

    async fn documents(&self, owner: &str) -> std::sync::Arc<dyn Store> {
        self.store(owner)
            .await
            .documents(&self.documents_collection(), FIELD, None)
            .expect("in-document leases")
    }

    async fn documents_with_lock_id(
        &self,
        owner: &str,
        max: Duration,
    ) -> std::sync::Arc<dyn Store> {
        let collection = self.lock_id_collection().name().to_string();
        self.store(owner)
            .await
            .documents(&collection, FIELD, lock_id_fields(max))
            .expect("in-document leases with LockId / LockTime")
    }

    async fn client_lock(
        &self,
        key: impl Into<LeaseKey>,
        ahead_ms: i64,
        max: Duration,
    ) -> Option<Uuid> {
        let key = key.into().to_bson();
        let now = DateTime::from_millis(DateTime::now().timestamp_millis() + ahead_ms);
        let cutoff = DateTime::from_millis(now.timestamp_millis() - max.as_millis() as i64);
        let lock_id = mongodb::bson::Uuid::new();
        let locked = self
            .lock_id_collection()
            .find_one_and_update(
                doc! { "_id": &key, "$or": [{ "LockId": null }, { "LockTime": { "$lt": cutoff } }] },
                doc! { "$set": { "LockId": lock_id, "LockTime": now } },
            )
            .upsert(true)
            .return_document(mongodb::options::ReturnDocument::After)
            .await;
        match locked {
            Ok(_) => Some(Uuid::from_bytes(lock_id.bytes())),
            Err(e) if e.to_string().contains("E11000") => None,
            Err(e) => panic!("the client's lock of {key}: {e}"),
        }
    }

    async fn client_unlock(&self, key: impl Into<LeaseKey>, lock_id: Uuid) -> bool {
        let lock_id = mongodb::bson::Uuid::from_bytes(lock_id.into_bytes());
        let result = self
            .lock_id_collection()
            .update_one(
                doc! { "_id": key.into().to_bson(), "LockId": lock_id },
                doc! { "$set": { "LockId": null, "LockTime": null } },
            )
            .await
            .expect("the client's unlock");
        result.modified_count == 1
    }

    async fn expire_document(&self, key: impl Into<LeaseKey>) {
        let key = key.into();
        let (exp, path) = (format!("{FIELD}.exp"), format!("${FIELD}.exp"));
        let result = self
            .db
            .collection::<Document>(&self.documents_collection())
            .update_one(
                doc! { "_id": key.to_bson(), &exp: { "$type": "date" } },
                vec![doc! { "$set": { exp: { "$min": [path, "$$NOW"] } } }],
            )
            .await
            .expect("expire the in-document lease");
        assert_eq!(result.matched_count, 1, "no lease on {key:?} to expire");
    }

    async fn cleanup(self) {
        self.raw_collection()
            .drop()
            .await
            .expect("drop the scenario's collection");
        self.db
            .collection::<Document>(&self.documents_collection())
            .drop()
            .await
            .expect("drop the scenario's user collection");
        self.lock_id_collection()
            .drop()
            .await
            .expect("drop the scenario's LockId / LockTime collection");
    }

    async fn put_foreign(&self, key: impl Into<LeaseKey>, owner: &str) {
        let key = key.into();
        let written = doc! { "_id": key.to_bson(), "ts": DateTime::now(), "aid": owner };
        self.raw_collection()
            .insert_one(written.clone())
            .await
            .expect("insert a foreign document");
        self.foreign.lock().unwrap().insert(key, written);
    }

    async fn store_with_rules(&self, owner: &str, rules: ForeignRules) -> MongoStore {
        self.store(owner).await.with_foreign(rules)
    }

    async fn put_foreign_doc(&self, key: impl Into<LeaseKey>, fields: Vec<(&str, Planted)>) {
        let key = key.into();
        let mut planted = doc! { "_id": key.to_bson() };
        for (name, value) in fields {
            let value = match value {
                Planted::Value(v) => Bson::from(doc! { "$literal": v }),
                Planted::At(ms) => Bson::from(doc! { "$add": ["$$NOW", ms] }),
            };
            planted.insert(name, value);
        }
        let result = self
            .raw_collection()
            .update_one(
                doc! { "_id": key.to_bson() },
                vec![doc! { "$replaceWith": planted }],
            )
            .upsert(true)
            .await
            .expect("write a foreign document");
        assert!(result.upserted_id.is_some(), "{key:?} was free");
        let written = self
            .raw_collection()
            .find_one(doc! { "_id": key.to_bson() })
            .await
            .expect("read the foreign document")
            .expect("the foreign document");
        self.foreign.lock().unwrap().insert(key, written);
    }

    async fn put_bare(&self, key: impl Into<LeaseKey>) {
        let key = key.into();
        // The lock command of a client that upserts `_id` alone: `None`
        // before means acquired.
        let before = self
            .raw_collection()
            .find_one_and_update(
                doc! { "_id": key.to_bson() },
                doc! { "$setOnInsert": { "_id": key.to_bson() } },
            )
            .upsert(true)
            .await
            .expect("the other application's upsert");
        assert_eq!(before, None, "the other application acquired {key:?}");
        let written = doc! { "_id": key.to_bson() };
        self.foreign.lock().unwrap().insert(key, written);
    }

    async fn pattern2_lock(&self, key: impl Into<LeaseKey>, value: &str, ttl_secs: i32) -> bool {
        pattern2_client::lock(
            &self.raw_collection(),
            key.into().to_bson(),
            value,
            ttl_secs,
        )
        .await
    }

    async fn pattern2_unlock(&self, key: impl Into<LeaseKey>, value: &str) -> bool {
        pattern2_client::unlock(&self.raw_collection(), key.into().to_bson(), value).await
    }

    async fn foreign_unchanged(&self, key: impl Into<LeaseKey>) -> bool {
        let key = key.into();
        let written = self.foreign.lock().unwrap().get(&key).cloned();
        let stored = self
            .raw_collection()
            .find_one(doc! { "_id": key.to_bson() })
            .await
            .expect("read the document");
        // Byte for byte: field order and types included.
        let bytes = |d: Option<Document>| d.map(|d| mongodb::bson::to_vec(&d).expect("BSON"));
        written.is_some() && bytes(written) == bytes(stored)
    }

    async fn delete_now(&self, key: impl Into<LeaseKey>) {
        let key = key.into();
        let result = self
            .raw_collection()
            .delete_one(doc! { "_id": key.to_bson() })
            .await
            .expect("delete the document");
        assert_eq!(result.deleted_count, 1, "no document {key:?} to delete");
    }

    async fn rewrite_owner(&self, key: impl Into<LeaseKey>, owner: &str) {
        let key = key.into();
        let result = self
            .raw_collection()
            .update_one(
                doc! { "_id": key.to_bson() },
                doc! { "$set": { "aid": owner } },
            )
            .await
            .expect("rewrite the owner id");
        assert_eq!(result.matched_count, 1, "no document {key:?} to rewrite");
    }

    async fn lifetime(&self, key: impl Into<LeaseKey>) -> Duration {
        let key = key.into();
        let doc = self
            .raw_collection()
            .find_one(doc! { "_id": key.to_bson() })
            .await
            .expect("read the document")
            .expect("a document");
        let ms = |name: &str| doc.get_datetime(name).expect(name).timestamp_millis();
        Duration::from_millis((ms("exp") - ms("ts")) as u64)
    }

    async fn raw(&self, key: impl Into<LeaseKey>) -> Option<Raw> {
        let key = &key.into();
        let doc = self
            .raw_collection()
            .find_one(doc! { "_id": key })
            .projection(doc! {
                "aid": 1, "lid": 1, "tok": 1, "exp": 1, "wt": 1, "yu": 1, "data": 1,
                "now": "$$NOW",
            })
            .await
            .expect("read the document")?;
        let now = doc.get_datetime("now").expect("now");
        let date = |name: &str| doc.get_datetime(name).ok();
        Some(Raw {
            owner: doc.get_str("aid").expect("aid").to_string(),
            lease_id: match doc.get("lid") {
                Some(Bson::Binary(b)) => Some(Uuid::from_slice(&b.bytes).expect("a UUID")),
                None => None,
                Some(other) => panic!("lid {other}"),
            },
            token: doc.get_i64("tok").expect("tok") as u64,
            expired: date("exp").expect("exp") <= now,
            waiting: doc.contains_key("wt"),
            yielded: date("yu").is_some_and(|until| until > now),
            payload: doc.get_document("data").ok().cloned(),
        })
    }
}
