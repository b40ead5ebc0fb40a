//! [`MongoStore`]: the lock protocol on a real MongoDB deployment.

use std::collections::HashSet;
use std::future::IntoFuture;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::{
    CollectionOptions, IndexOptions, ReadConcern, ReadPreference, ReturnDocument,
    SelectionCriteria, WriteConcern,
};
use mongodb::{Collection, Database, IndexModel};
use uuid::Uuid;

use super::{AcquireOutcome, LeaseRef, Store, TOKEN_TIME_SHIFT, field, lease_info};
use crate::error::{Error, Result, is_transient_db_error};
use crate::lease::LeaseInfo;

/// Name of the TTL index that garbage-collects lock documents.
pub(crate) const GC_INDEX_NAME: &str = "mongo_lease_gc";
/// Name of the index that serves `release_all` (by owner id).
pub(crate) const OWNER_INDEX_NAME: &str = "mongo_lease_owner";

/// How many times a failed idempotent write is tried in all.
const WRITE_ATTEMPTS: u32 = 3;

/// The lock protocol on MongoDB. Cheap to clone (the collection handle is shared).
#[derive(Clone)]
pub(crate) struct MongoStore {
    pub(super) coll: Collection<Document>,
    owner: String,
    ttl_ms: i64,
    /// How long a release that another owner waited for keeps this owner
    /// from taking the key back (see "Fairness" in the module docs of `store`).
    yield_ms: i64,
    pub(super) operation_timeout: Duration,
}

pub(super) fn bson_lease_id(id: Uuid) -> Bson {
    Bson::from(mongodb::bson::Uuid::from_bytes(id.into_bytes()))
}

fn is_lease_id(value: Option<&Bson>, id: Uuid) -> bool {
    matches!(value, Some(Bson::Binary(b)) if b.bytes.as_slice() == id.as_bytes())
}

impl MongoStore {
    /// A store on `database.collection` with majority write and read concern and
    /// primary reads, whatever the client's defaults (MONGODB-FACTS Q8: only
    /// majority-acknowledged writes survive a failover).
    pub(crate) fn new(
        database: &Database,
        collection: &str,
        owner: String,
        ttl: Duration,
        yield_window: Duration,
        operation_timeout: Duration,
    ) -> Self {
        let options = CollectionOptions::builder()
            .write_concern(WriteConcern::majority())
            .read_concern(ReadConcern::majority())
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .build();
        MongoStore {
            coll: database.collection_with_options(collection, options),
            owner,
            ttl_ms: ttl.as_millis() as i64,
            yield_ms: yield_window.as_millis().min(i64::MAX as u128) as i64,
            operation_timeout,
        }
    }

    /// Bounds `op` by the operation timeout; a timeout is reported as
    /// [`Error::Unreachable`], which the callers treat as "outcome unknown".
    pub(super) async fn bounded<T>(
        &self,
        op: impl IntoFuture<Output = mongodb::error::Result<T>>,
    ) -> Result<T> {
        match tokio::time::timeout(self.operation_timeout, op).await {
            Ok(result) => result.map_err(Error::from),
            Err(_) => Err(Error::Unreachable {
                waited: self.operation_timeout,
                reason: "operation timed out".into(),
            }),
        }
    }

    /// Checks that the deployment answers and the collection is usable, and
    /// creates the indexes the protocol needs (idempotent).
    ///
    /// # Errors
    /// [`Error::Unreachable`] if no server answers within the operation timeout,
    /// [`Error::UnusableCollection`] for a capped collection or a non-TTL index on
    /// `exp`, [`Error::Database`] for anything else the server refuses.
    pub(crate) async fn prepare(&self, gc_grace: Duration) -> Result<()> {
        let waited = self.operation_timeout;
        let unreachable = |e: Error| match e {
            Error::Database(db) if is_transient_db_error(&db) => Error::Unreachable {
                waited,
                reason: db.to_string(),
            },
            other => other,
        };
        let db = self.coll.namespace().db;
        let name = self.coll.name().to_string();
        let database = self.coll.client().database(&db);
        self.bounded(database.run_command(doc! { "ping": 1 }))
            .await
            .map_err(unreachable)?;

        let collections: Vec<_> = self
            .bounded(async {
                database
                    .list_collections()
                    .filter(doc! { "name": &name })
                    .await?
                    .try_collect()
                    .await
            })
            .await
            .map_err(unreachable)?;
        if let Some(spec) = collections.first() {
            if spec.options.capped == Some(true) {
                return Err(Error::UnusableCollection {
                    reason: format!(
                        "{db}.{name} is a capped collection; leases need deletes and \
                         size-changing updates"
                    ),
                });
            }
            if spec.collection_type != mongodb::results::CollectionType::Collection {
                return Err(Error::UnusableCollection {
                    reason: format!("{db}.{name} is a view or timeseries, not a collection"),
                });
            }
        }

        let existing: Vec<IndexModel> = if collections.is_empty() {
            Vec::new()
        } else {
            self.bounded(async { self.coll.list_indexes().await?.try_collect().await })
                .await
                .map_err(unreachable)?
        };
        // A unique index on anything but `_id` would make leases of different
        // keys collide (E11000 on insert): refuse the collection up front.
        if let Some(index) = existing.iter().find(|index| {
            index.keys != doc! { field::ID: 1 }
                && index.options.as_ref().and_then(|o| o.unique) == Some(true)
        }) {
            return Err(Error::UnusableCollection {
                reason: format!(
                    "{db}.{name} has a unique index on {}; lock documents of different keys \
                     would collide. Drop it or use another collection",
                    index.keys
                ),
            });
        }
        let gc_index = existing
            .iter()
            .find(|index| index.keys == doc! { field::EXPIRES_AT: 1 });
        match gc_index {
            Some(index) => {
                let ttl = index.options.as_ref().and_then(|o| o.expire_after);
                if ttl.is_none() {
                    return Err(Error::UnusableCollection {
                        reason: format!(
                            "{db}.{name} has an index on `exp` that is not a TTL index \
                             (expireAfterSeconds); drop it or use another collection"
                        ),
                    });
                }
                if ttl != Some(gc_grace) {
                    tracing::debug!(existing = ?ttl, wanted = ?gc_grace, "keeping the existing TTL index on `exp`");
                }
            }
            None => {
                let model = IndexModel::builder()
                    .keys(doc! { field::EXPIRES_AT: 1 })
                    .options(
                        IndexOptions::builder()
                            .name(GC_INDEX_NAME.to_string())
                            .expire_after(gc_grace)
                            .build(),
                    )
                    .build();
                if !self.create_index(model).await.map_err(unreachable)? {
                    self.require_gc_index().await.map_err(unreachable)?;
                }
            }
        }
        if !existing.iter().any(|i| i.keys == doc! { field::OWNER: 1 }) {
            let model = IndexModel::builder()
                .keys(doc! { field::OWNER: 1 })
                .options(
                    IndexOptions::builder()
                        .name(OWNER_INDEX_NAME.to_string())
                        .build(),
                )
                .build();
            self.create_index(model).await.map_err(unreachable)?;
        }
        Ok(())
    }

    /// Creates `model`; `Ok(false)` if an index with the same name or keys but
    /// other options exists (IndexOptionsConflict / IndexKeySpecsConflict), for
    /// example created by another manager meanwhile: the caller checks it.
    async fn create_index(&self, model: IndexModel) -> Result<bool> {
        match self.bounded(self.coll.create_index(model)).await {
            Ok(_) => Ok(true),
            Err(Error::Database(e)) if matches!(command_code(&e), Some(85 | 86)) => {
                tracing::debug!(error = %e, "a conflicting index exists");
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    /// After a conflict creating the TTL index: there must now be a TTL index
    /// on `exp` (another manager's), not just an index that took its name.
    async fn require_gc_index(&self) -> Result<()> {
        let indexes: Vec<IndexModel> = self
            .bounded(async { self.coll.list_indexes().await?.try_collect().await })
            .await?;
        let ttl_on_exp = indexes.iter().any(|index| {
            index.keys == doc! { field::EXPIRES_AT: 1 }
                && index
                    .options
                    .as_ref()
                    .and_then(|o| o.expire_after)
                    .is_some()
        });
        if ttl_on_exp {
            return Ok(());
        }
        let ns = self.coll.namespace();
        Err(Error::UnusableCollection {
            reason: format!(
                "{ns} has an index named {GC_INDEX_NAME:?} that is not a TTL index on `exp`; \
                 lock documents would never be deleted. Drop it or use another collection"
            ),
        })
    }

    /// The projection every read of a lock document uses; `now` is the server's
    /// `$$NOW`, so the remaining lease time is computed on the server's clock.
    fn projection() -> Document {
        doc! {
            field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1,
            field::EXPIRES_AT: 1, field::YIELD_UNTIL: 1, "now": "$$NOW",
        }
    }

    /// The projection of reads that report a [`LeaseInfo`]: every field of
    /// the schema and the server's `$$NOW`.
    pub(super) fn info_projection() -> Document {
        doc! {
            field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1, field::ACQUIRED_AT: 1,
            field::RENEWED_AT: 1, field::EXPIRES_AT: 1, field::PAYLOAD: 1, "now": "$$NOW",
        }
    }

    /// Reads a document projected with [`MongoStore::info_projection`] into a
    /// [`LeaseInfo`] judged at its `now`.
    pub(super) fn projected_info(key: &str, doc: &Document) -> Option<LeaseInfo> {
        let now = doc.get_datetime("now").ok()?.to_system_time();
        lease_info(key, doc, now)
    }

    async fn inspect_key(&self, key: String) -> Result<Option<LeaseInfo>> {
        let found = self
            .bounded(
                self.coll
                    .find_one(doc! { field::ID: &key })
                    .projection(Self::info_projection()),
            )
            .await?;
        match found {
            None => Ok(None),
            Some(doc) => match Self::projected_info(&key, &doc) {
                Some(info) => Ok(Some(info)),
                None => Err(Error::ForeignDocument { key }),
            },
        }
    }

    async fn list_page(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> Result<(Vec<LeaseInfo>, Option<String>)> {
        let filter = match &after {
            Some(after) => doc! { field::ID: { "$type": "string", "$gt": after } },
            None => doc! { field::ID: { "$type": "string" } },
        };
        let docs: Vec<Document> = self
            .bounded(async {
                self.coll
                    .find(filter)
                    .sort(doc! { field::ID: 1 })
                    .limit(limit.min(i64::MAX as usize) as i64)
                    .projection(Self::info_projection())
                    .await?
                    .try_collect()
                    .await
            })
            .await?;
        let next = if docs.len() == limit {
            docs.last()
                .and_then(|d| d.get_str(field::ID).ok())
                .map(str::to_string)
        } else {
            None
        };
        let page = docs
            .iter()
            .filter_map(|doc| Self::projected_info(doc.get_str(field::ID).ok()?, doc))
            .collect();
        Ok((page, next))
    }

    /// One `findAndModify` (a retryable write) that releases `key` if a lease
    /// of our shape holds it now, whoever the owner; returns it as it was.
    async fn force_release_key(&self, key: String) -> Result<Option<LeaseInfo>> {
        let filter = doc! {
            field::ID: &key,
            field::LEASE_ID: { "$exists": true },
            field::TOKEN: { "$type": "long" },
            "$expr": { "$gt": [format!("${}", field::EXPIRES_AT), "$$NOW"] },
        };
        let before = self
            .bounded(
                self.coll
                    .find_one_and_update(filter, self.release_update())
                    .return_document(ReturnDocument::Before)
                    .projection(Self::info_projection()),
            )
            .await?;
        Ok(before.and_then(|doc| Self::projected_info(&key, &doc)))
    }

    async fn set_payload_of(&self, lease: LeaseRef, payload: Document) -> Result<bool> {
        let filter = doc! { field::ID: &lease.key, field::LEASE_ID: bson_lease_id(lease.lease_id) };
        let result = self
            .bounded(
                self.coll
                    .update_one(filter, doc! { "$set": { field::PAYLOAD: payload } }),
            )
            .await?;
        Ok(result.matched_count == 1)
    }

    /// The acquire update: one round trip, never an error when the key is held.
    ///
    /// An upsert on `_id` alone (an `$expr` is refused in an upsert filter on 6.0,
    /// MONGODB-FACTS Q1) whose pipeline replaces the document only if this
    /// acquisition wins: the document is new (only `_id`), already ours under
    /// this lease id (a retry), or ours in shape, expired by `$$NOW`, and not
    /// yielded by this owner to a waiting one. Otherwise the document is
    /// returned unchanged (no oplog entry), including a document of foreign
    /// shape; except that a `waiting` attempt on a lease held by another owner
    /// records `wt` if it is not set yet (one write per holding period).
    fn acquire_pipeline(&self, lease_id: Uuid, waiting: bool) -> Vec<Document> {
        let lid = bson_lease_id(lease_id);
        let fresh = doc! { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 1] };
        let mine = doc! { "$eq": [format!("${}", field::LEASE_ID), lid.clone()] };
        let our_shape = doc! { "$and": [
            { "$eq": [{ "$type": format!("${}", field::EXPIRES_AT) }, "date"] },
            { "$eq": [{ "$type": format!("${}", field::TOKEN) }, "long"] },
        ]};
        let expired = doc! { "$lte": [format!("${}", field::EXPIRES_AT), "$$NOW"] };
        let same_owner =
            doc! { "$eq": [format!("${}", field::OWNER), { "$literal": &self.owner }] };
        let yielded_by_us = doc! { "$and": [
            same_owner.clone(),
            { "$gt": [format!("${}", field::YIELD_UNTIL), "$$NOW"] },
        ]};
        let wins = doc! { "$or": [
            fresh,
            mine.clone(),
            { "$and": [our_shape.clone(), expired.clone(), { "$not": [yielded_by_us] }] },
        ]};
        let next_token = doc! { "$cond": [
            mine.clone(),
            format!("${}", field::TOKEN),
            { "$max": [
                { "$add": [{ "$ifNull": [format!("${}", field::TOKEN), 0_i64] }, 1_i64] },
                { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << TOKEN_TIME_SHIFT] },
            ]},
        ]};
        // A retry under the same lease id keeps the acquisition time, the
        // payload and the waiting mark; a new acquisition starts without them.
        let acquired_at = doc! { "$cond": [
            mine.clone(),
            { "$ifNull": [format!("${}", field::ACQUIRED_AT), "$$NOW"] },
            "$$NOW",
        ]};
        let keep = |name: &str| doc! { "$cond": [mine.clone(), format!("${name}"), "$$REMOVE"] };
        let acquired = doc! {
            field::ID: "$_id",
            field::OWNER: { "$literal": &self.owner },
            field::LEASE_ID: lid,
            field::TOKEN: next_token,
            field::ACQUIRED_AT: acquired_at,
            field::RENEWED_AT: "$$NOW",
            field::EXPIRES_AT: { "$add": ["$$NOW", self.ttl_ms] },
            field::PAYLOAD: keep(field::PAYLOAD),
            field::WAITING_SINCE: keep(field::WAITING_SINCE),
        };
        let lost = if waiting {
            let held_by_other = doc! { "$and": [
                our_shape,
                { "$eq": [{ "$type": format!("${}", field::LEASE_ID) }, "binData"] },
                { "$not": [expired] },
                { "$not": [same_owner] },
            ]};
            let marked = doc! { "$mergeObjects": ["$$ROOT", {
                field::WAITING_SINCE: { "$ifNull": [format!("${}", field::WAITING_SINCE), "$$NOW"] },
            }]};
            Bson::from(doc! { "$cond": [held_by_other, marked, "$$ROOT"] })
        } else {
            Bson::from("$$ROOT")
        };
        vec![doc! { "$replaceWith": { "$cond": [wins, acquired, lost] } }]
    }

    /// Reads what an acquire attempt found out of a returned or re-read document.
    fn classify(key: &str, owner: &str, lease_id: Uuid, doc: &Document) -> Result<AcquireOutcome> {
        let token = doc.get_i64(field::TOKEN);
        let expires = doc.get_datetime(field::EXPIRES_AT);
        let (Ok(token), Ok(expires)) = (token, expires) else {
            return Err(Error::ForeignDocument {
                key: key.to_string(),
            });
        };
        if is_lease_id(doc.get(field::LEASE_ID), lease_id) {
            return Ok(AcquireOutcome::Acquired {
                token: token as u64,
            });
        }
        let now = doc
            .get_datetime("now")
            .map(|d| d.timestamp_millis())
            .unwrap_or(expires.timestamp_millis());
        let holder = doc.get_str(field::OWNER).unwrap_or_default().to_string();
        // Yielded by this owner: free for others now, for us at `yu`.
        let until = match doc.get_datetime(field::YIELD_UNTIL) {
            Ok(until) if holder == owner => *expires.max(until),
            _ => *expires,
        };
        let remaining = until.timestamp_millis().saturating_sub(now).max(0) as u64;
        Ok(AcquireOutcome::Held {
            holder,
            remaining: Duration::from_millis(remaining),
        })
    }

    async fn read_lease(&self, key: &str) -> Result<Option<Document>> {
        self.bounded(
            self.coll
                .find_one(doc! { field::ID: key })
                .projection(Self::projection()),
        )
        .await
    }

    async fn acquire_once(
        &self,
        key: String,
        lease_id: Uuid,
        waiting: bool,
    ) -> Result<AcquireOutcome> {
        let attempt = self
            .bounded(
                self.coll
                    .find_one_and_update(
                        doc! { field::ID: &key },
                        self.acquire_pipeline(lease_id, waiting),
                    )
                    .upsert(true)
                    .return_document(ReturnDocument::After)
                    .projection(Self::projection()),
            )
            .await;
        match attempt {
            Ok(Some(doc)) => return Self::classify(&key, &self.owner, lease_id, &doc),
            Ok(None) => {}
            // A duplicate-key error from a concurrent upsert means "held": re-read.
            Err(Error::Database(e)) if is_duplicate_key(&e) && is_on_id_index(&e) => {}
            // On another unique index it would fail the same way every time.
            Err(Error::Database(e)) if is_duplicate_key(&e) => {
                return Err(Error::UnusableCollection {
                    reason: format!(
                        "a unique index other than `_id` refused the lease for {key:?}: {e}"
                    ),
                });
            }
            // Outcome unknown (network, failover, timeout): resolve by re-reading,
            // never by assuming (MONGODB-FACTS Q7).
            Err(e) if e.is_transient() => {
                tracing::debug!(key, error = %e, "acquire outcome unknown; re-reading");
            }
            Err(e) => return Err(e),
        }
        match self.read_lease(&key).await? {
            Some(doc) => Self::classify(&key, &self.owner, lease_id, &doc),
            // The document vanished between the write and the read: try again.
            None => Err(Error::Unreachable {
                waited: self.operation_timeout,
                reason: "lock document vanished during acquire".into(),
            }),
        }
    }

    fn lease_filter(leases: &[LeaseRef]) -> Document {
        let keys: Vec<&str> = leases.iter().map(|l| l.key.as_str()).collect();
        let ids: Vec<Bson> = leases.iter().map(|l| bson_lease_id(l.lease_id)).collect();
        doc! { field::ID: { "$in": keys }, field::LEASE_ID: { "$in": ids } }
    }

    async fn renew_batch(&self, leases: Vec<LeaseRef>) -> Result<Vec<String>> {
        let filter = Self::lease_filter(&leases);
        let update = vec![doc! { "$set": {
            field::RENEWED_AT: "$$NOW",
            field::EXPIRES_AT: { "$add": ["$$NOW", self.ttl_ms] },
        }}];
        // updateMany is not a retryable write; it is idempotent, so the actor retries
        // it. Judge by matchedCount: modifiedCount is lower when a renewal lands in
        // the same millisecond as the previous one (MONGODB-FACTS Q6).
        let result = self
            .bounded(self.coll.update_many(filter.clone(), update))
            .await?;
        if result.matched_count as usize == leases.len() {
            return Ok(Vec::new());
        }
        // Some leases are gone; the result does not say which, so ask.
        let kept: HashSet<String> = self
            .bounded(async {
                self.coll
                    .find(filter)
                    .projection(doc! { field::ID: 1 })
                    .await?
                    .try_collect::<Vec<Document>>()
                    .await
            })
            .await?
            .into_iter()
            .filter_map(|d| d.get_str(field::ID).ok().map(str::to_string))
            .collect();
        Ok(leases
            .into_iter()
            .filter(|l| !kept.contains(&l.key))
            .map(|l| l.key)
            .collect())
    }

    /// Marks matching leases released: `exp` moves to now (so the key is free at
    /// once) and `lid` is removed (so a late renewal cannot revive it). If
    /// another owner waited meanwhile (`wt`), the release yields: `yu` is set
    /// to now + the yield window, before which this owner cannot take the key
    /// back. The document stays until the TTL monitor deletes it, keeping its
    /// token.
    fn release_update(&self) -> Vec<Document> {
        let waited = doc! { "$ne": [{ "$type": format!("${}", field::WAITING_SINCE) }, "missing"] };
        vec![
            doc! { "$set": {
                field::EXPIRES_AT: { "$min": [format!("${}", field::EXPIRES_AT), "$$NOW"] },
                field::YIELD_UNTIL: { "$cond": [
                    waited,
                    { "$add": ["$$NOW", self.yield_ms] },
                    format!("${}", field::YIELD_UNTIL),
                ]},
            }},
            doc! { "$unset": [field::LEASE_ID, field::WAITING_SINCE] },
        ]
    }

    /// Releases the leases matching `filter`; `single` for one lease, which uses
    /// `updateOne` so that the driver's retryable writes report the original
    /// outcome. The write is idempotent, so a transient failure is also retried
    /// here (up to [`WRITE_ATTEMPTS`] in all). After such a failure an earlier
    /// attempt may have applied: a single lease that the retry no longer finds
    /// counts as released by us (the caller only releases leases whose local
    /// deadline has not passed, so nobody else can have taken it by expiry).
    async fn release_matching(&self, filter: Document, single: bool) -> Result<u64> {
        let mut attempt = 1;
        loop {
            let result = if single {
                self.bounded(self.coll.update_one(filter.clone(), self.release_update()))
                    .await
            } else {
                self.bounded(self.coll.update_many(filter.clone(), self.release_update()))
                    .await
            };
            match result {
                Ok(result) if single && attempt > 1 => return Ok(result.matched_count.max(1)),
                Ok(result) => return Ok(result.matched_count),
                Err(e) if e.is_transient() && attempt < WRITE_ATTEMPTS => {
                    tracing::debug!(error = %e, attempt, "release outcome unknown; retrying");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl MongoStore {
    /// A change stream of releases (an update that removed `lid`) and deletes
    /// (TTL monitor, operators), reduced to the key. Opening it is part of
    /// the stream's first poll, so the caller never waits for it.
    fn release_events(&self) -> BoxStream<'static, Result<String>> {
        let store = self.clone();
        let pipeline = [
            doc! { "$match": { "$or": [
                { "operationType": "delete" },
                { "operationType": "update", "updateDescription.removedFields": field::LEASE_ID },
            ]}},
            doc! { "$project": { "operationType": 1, "documentKey": 1 } },
        ];
        futures::stream::once(
            async move { store.bounded(store.coll.watch().pipeline(pipeline)).await },
        )
        .map(|opened| match opened {
            Ok(stream) => stream
                .filter_map(|event| async move {
                    match event {
                        Ok(event) => event
                            .document_key
                            .and_then(|k| k.get_str(field::ID).ok().map(str::to_string))
                            .map(Ok),
                        Err(e) => Some(Err(Error::from(e))),
                    }
                })
                .boxed(),
            Err(e) => futures::stream::iter([Err(e)]).boxed(),
        })
        .flatten()
        .boxed()
    }
}

impl Store for MongoStore {
    fn watch_releases(&self) -> BoxStream<'static, Result<String>> {
        self.release_events()
    }

    fn acquire(
        &self,
        key: String,
        lease_id: Uuid,
        waiting: bool,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        let store = self.clone();
        async move { store.acquire_once(key, lease_id, waiting).await }.boxed()
    }

    fn renew(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<Vec<String>>> {
        let store = self.clone();
        async move { store.renew_batch(leases).await }.boxed()
    }

    fn release(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move {
            if leases.is_empty() {
                return Ok(0);
            }
            store
                .release_matching(Self::lease_filter(&leases), leases.len() == 1)
                .await
        }
        .boxed()
    }

    fn release_owner(&self, except: Vec<Uuid>) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move {
            let except: Vec<Bson> = except.into_iter().map(bson_lease_id).collect();
            let filter = doc! {
                field::OWNER: &store.owner,
                field::LEASE_ID: { "$exists": true, "$nin": except },
            };
            store.release_matching(filter, false).await
        }
        .boxed()
    }

    fn inspect(&self, key: String) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let store = self.clone();
        async move { store.inspect_key(key).await }.boxed()
    }

    fn list(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<String>)>> {
        let store = self.clone();
        async move { store.list_page(after, limit).await }.boxed()
    }

    fn force_release(&self, key: String) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let store = self.clone();
        async move { store.force_release_key(key).await }.boxed()
    }

    fn set_payload(&self, lease: LeaseRef, payload: Document) -> BoxFuture<'static, Result<bool>> {
        let store = self.clone();
        async move { store.set_payload_of(lease, payload).await }.boxed()
    }

    fn observe(&self, key: String) -> BoxStream<'static, Result<Option<LeaseInfo>>> {
        super::observe::observe(self.clone(), key)
    }
}

pub(super) fn command_code(e: &mongodb::error::Error) -> Option<i32> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match &*e.kind {
        ErrorKind::Command(c) => Some(c.code),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some(w.code),
        _ => None,
    }
}

/// E11000: a write would duplicate a unique index's key.
fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    command_code(e) == Some(11000)
}

/// Whether a duplicate-key error is on the `_id` index: two upserts raced to
/// insert the same key, and the other one won (MONGODB-FACTS Q1). The server
/// names the index in the message: `... index: _id_ dup key: { _id: "k1" }`.
fn is_on_id_index(e: &mongodb::error::Error) -> bool {
    use mongodb::error::{ErrorKind, WriteFailure};
    let message = match &*e.kind {
        ErrorKind::Command(c) => c.message.as_str(),
        ErrorKind::Write(WriteFailure::WriteError(w)) => w.message.as_str(),
        _ => return false,
    };
    message.contains("index: _id_ ")
}
