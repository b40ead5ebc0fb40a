//! The operations of [`MongoStore`]: its [`Store`] implementation (acquire,
//! renewal, release, release by owner, inspect and list, force release,
//! payload, change streams), sending what [`pipeline`](super::pipeline)
//! builds and resolving ambiguous outcomes. The release family's writes are
//! in [`release`](super::release).

use std::collections::HashSet;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt, TryStreamExt};
use mongodb::Collection;
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::{FindOptions, Hint, ReturnDocument, UpdateModifications};
use uuid::Uuid;

use super::handle::{MongoStore, is_duplicate_key, is_on_id_index};
use super::kinds::{
    Released, exclusive_filter, force_release_any_filter, force_release_update, holder_filter,
    lease_ids, owner_holders_filter, renew_any_update, renew_exclusive_update,
};
use super::observe::observe;
use super::pipeline::{
    acquire_pipeline, acquire_projection, foreign_filter, id_index, info_projection, key_filter,
    key_write, keys_filter, list_min, payload_update, projected_info, release_events_pipeline,
    upsert_filter,
};
use super::rules::{owner_filter, payload_filter, read_lease_id};
use crate::config::ReleaseMode;
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::store::light_release::{LightAcquire, LightAcquired, LightForms, LightRelease};
use crate::store::{
    AcquireOutcome, Announcement, HandOver, LeaseRef, Store, field, release_instead, replies,
};

/// How many times a failed idempotent write is tried in all.
pub(super) const WRITE_ATTEMPTS: u32 = 3;

/// Runs the idempotent write `op` (which returns a count), trying again
/// after a transient failure, up to [`WRITE_ATTEMPTS`] in all. Returns the
/// count and whether an earlier attempt failed (and may have applied).
pub(super) async fn retried<Fut>(what: &str, op: impl Fn() -> Fut) -> Result<(u64, bool)>
where
    Fut: std::future::Future<Output = Result<u64>>,
{
    let mut attempt = 1;
    loop {
        match op().await {
            Ok(count) => return Ok((count, attempt > 1)),
            Err(e) if e.is_transient() && attempt < WRITE_ATTEMPTS => {
                tracing::debug!(error = %e, attempt, "{what} outcome unknown; retrying");
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The lease ids a document read by [`MongoStore::renew_matching`] holds:
/// the one at `path` (a dotted path), and those of the entries of `hs`.
fn held_lease_ids(doc: &Document, path: &str) -> Vec<Uuid> {
    let mut value = Some(Bson::Document(doc.clone()));
    for part in path.split('.') {
        value = match value {
            Some(Bson::Document(d)) => d.get(part).cloned(),
            _ => None,
        };
    }
    let mut ids: Vec<Uuid> = read_lease_id(value.as_ref()).into_iter().collect();
    if let Ok(entries) = doc.get_array(field::HOLDERS) {
        ids.extend(
            entries
                .iter()
                .filter_map(|e| read_lease_id(e.as_document()?.get(field::LEASE_ID))),
        );
    }
    ids
}

impl MongoStore {
    /// Reads `key`'s document with `projection`.
    async fn read_key(&self, key: &LeaseKey, projection: Document) -> Result<Option<Document>> {
        self.bounded(self.coll().find_one(key_filter(key)).projection(projection))
            .await
    }

    /// An exclusive acquisition (held at least `hold_ms` if `Some`) by the
    /// general pipeline (the actor tries the light acquire first where it
    /// may apply, `Store::acquire_light`).
    pub(super) async fn acquire_once(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl_ms: i64,
        hold_ms: Option<i64>,
    ) -> Result<AcquireOutcome> {
        let update = acquire_pipeline(
            self.owner(),
            ttl_ms,
            lease_id,
            waiting,
            hold_ms,
            self.registration_ms(),
        );
        self.acquire_by(key, update, acquire_projection(), |key, doc| {
            replies::exclusive(key, self.owner(), lease_id, ttl_ms, doc)
        })
        .await
    }

    /// One acquire attempt: the upsert `update` of `key`'s document,
    /// returning it projected with `projection`, read by `read`; a document
    /// that could not be returned (a racing upsert, an unknown outcome) is
    /// re-read with `projection` (docs/mongodb-behaviour.md, B1, B7), and
    /// `read`'s verdict on it is only what a read proves
    /// ([`replies::from_reread`]: never `Acquired`, no token in `Held`).
    pub(super) async fn acquire_by(
        &self,
        key: LeaseKey,
        update: Vec<Document>,
        projection: Document,
        read: impl Fn(&LeaseKey, &Document) -> AcquireOutcome,
    ) -> Result<AcquireOutcome> {
        let attempt = self
            .bounded(
                self.coll()
                    .find_one_and_update(upsert_filter(&key), update)
                    .upsert(true)
                    .return_document(ReturnDocument::After)
                    .projection(projection.clone()),
            )
            .await;
        match attempt {
            Ok(Some(doc)) => return Ok(read(&key, &doc)),
            Ok(None) => {}
            // A duplicate-key error from a concurrent upsert means "held": re-read.
            Err(Error::Database(e)) if is_duplicate_key(&e) && is_on_id_index(&e) => {}
            // On another unique index it would fail the same way every time.
            Err(Error::Database(e)) if is_duplicate_key(&e) => {
                return Err(Error::UnusableCollection {
                    reason: format!(
                        "a unique index other than `_id` refused the lease for {}: {e}",
                        key.to_extended_json()
                    ),
                });
            }
            // Outcome unknown (network, failover, timeout): resolve by re-reading,
            // never by assuming (docs/mongodb-behaviour.md, B7).
            Err(e) if e.is_transient() => {
                tracing::debug!(%key, error = %e, "acquire outcome unknown; re-reading");
            }
            Err(e) => return Err(e),
        }
        self.reread(key, projection, read).await
    }

    /// The re-read of an acquire attempt whose write did not return the
    /// document: `key`'s document with `projection`, read by `read`, worth
    /// only what a read proves ([`replies::from_reread`]).
    async fn reread(
        &self,
        key: LeaseKey,
        projection: Document,
        read: impl Fn(&LeaseKey, &Document) -> AcquireOutcome,
    ) -> Result<AcquireOutcome> {
        match self.read_key(&key, projection).await? {
            Some(doc) => Ok(replies::from_reread(read(&key, &doc))),
            // The document vanished between the write and the read: try again.
            None => Err(Error::Unreachable {
                waited: self.operation_timeout(),
                reason: "lock document vanished during acquire".into(),
                source: None,
            }),
        }
    }

    /// What the re-read after an unknown outcome of an acquisition of
    /// `shape` by this owner under `lease_id` (for `ttl`) answers now: the
    /// store contract's view of that path.
    #[cfg(test)]
    pub(crate) async fn reread_acquire(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        ttl: Duration,
        shape: crate::kind::LeaseShape,
    ) -> Result<AcquireOutcome> {
        let kind = shape.kind;
        if kind.is_multi_holder() {
            let projection = super::kinds::multi_acquire_projection(self.owner(), lease_id);
            return self
                .reread(key, projection, |key, doc| {
                    replies::classify_multi(key, kind, doc)
                })
                .await;
        }
        let ttl_ms = ttl_ms(ttl);
        self.reread(key, acquire_projection(), |key, doc| {
            replies::exclusive(key, self.owner(), lease_id, ttl_ms, doc)
        })
        .await
    }

    /// One `updateMany` for the batch: the plain renewal of exclusive leases
    /// when every lease of the batch is exclusive (its [`LeaseRef::kind`],
    /// encoded directly, `renewal`), else the renewal of any kinds.
    pub(super) async fn renew_batch(
        &self,
        leases: Vec<LeaseRef>,
        ttl_ms: i64,
    ) -> Result<Vec<LeaseRef>> {
        let plain = !leases.iter().any(|l| l.kind.is_multi_holder());
        let owner = self.owner();
        let (filter, update): (fn(&str, &[LeaseRef]) -> Document, _) = if plain {
            (exclusive_filter, renew_exclusive_update(ttl_ms))
        } else {
            (
                holder_filter,
                renew_any_update(owner, &lease_ids(&leases), ttl_ms),
            )
        };
        let filter = |leases: &[LeaseRef]| filter(owner, leases);
        // updateMany is not a retryable write; it is idempotent, so the actor retries
        // it. Judge by matchedCount: modifiedCount is lower when a renewal lands in
        // the same millisecond as the previous one (docs/mongodb-behaviour.md, B4).
        let raw = if plain {
            // Encoded directly: the filter names every key and lease id.
            self.renew_exclusive_raw(&leases, ttl_ms).await?
        } else {
            None
        };
        match raw {
            Some(matched) => {
                self.unrenewed(self.coll(), filter, leases, field::LEASE_ID, matched)
                    .await
            }
            None => {
                self.renew_matching(self.coll(), filter, update, leases, field::LEASE_ID)
                    .await
            }
        }
    }

    /// Renews `leases` by `update` on the documents of `coll` that match
    /// `filter(leases)` (one `updateMany`); returns those no longer held.
    /// The filter (a copy of every key and lease id of the batch, several
    /// times the batch's own size) is built again for the read below
    /// rather than kept or cloned, so one lives at a time. Also the
    /// in-document store's (`super::document`), on the user's collection,
    /// whose lease ids are at `lease_id_path`.
    ///
    /// When the batch names each key once, a matched count equal to its
    /// size means every lease was renewed; otherwise (some leases gone, or
    /// several leases of one key, which one document matches once) a read
    /// of the matching documents' lease ids (at `lease_id_path`, and in the
    /// entries of `hs`) tells which leases are still held.
    pub(super) async fn renew_matching(
        &self,
        coll: &Collection<Document>,
        filter: impl Fn(&[LeaseRef]) -> Document,
        update: Vec<Document>,
        leases: Vec<LeaseRef>,
        lease_id_path: &str,
    ) -> Result<Vec<LeaseRef>> {
        let result = self
            .bounded(coll.update_many(filter(&leases), update))
            .await?;
        self.unrenewed(coll, filter, leases, lease_id_path, result.matched_count)
            .await
    }

    /// The leases of a renewal of `leases` (by `filter`, on `coll`) that
    /// `matched` documents matched which are no longer held: none if the
    /// batch names each key once and every one matched; otherwise those a
    /// read of the matching documents' lease ids (at `lease_id_path`, and
    /// in the entries of `hs`) does not find.
    pub(super) async fn unrenewed(
        &self,
        coll: &Collection<Document>,
        filter: impl Fn(&[LeaseRef]) -> Document,
        leases: Vec<LeaseRef>,
        lease_id_path: &str,
        matched: u64,
    ) -> Result<Vec<LeaseRef>> {
        let keys: HashSet<&LeaseKey> = leases.iter().map(|l| &l.key).collect();
        if keys.len() == leases.len() && matched as usize == leases.len() {
            return Ok(Vec::new());
        }
        let holders = format!("{}.{}", field::HOLDERS, field::LEASE_ID);
        let kept: HashSet<(LeaseKey, Uuid)> = self
            .bounded(async {
                coll.find(filter(&leases))
                    .projection(doc! { field::ID: 1, lease_id_path: 1, holders: 1 })
                    .await?
                    .try_collect::<Vec<Document>>()
                    .await
            })
            .await?
            .into_iter()
            .flat_map(|d| {
                let key = d.get(field::ID).cloned().map(LeaseKey::from);
                held_lease_ids(&d, lease_id_path)
                    .into_iter()
                    .filter_map(move |id| Some((key.clone()?, id)))
            })
            .collect();
        Ok(leases
            .into_iter()
            .filter(|l| !kept.contains(&(l.key.clone(), l.lease_id)))
            .collect())
    }

    /// Applies `update` to the documents of `coll` matching `filter`
    /// (`updateOne` for a `single` lease, a retryable write; else
    /// `updateMany`), [`retried`]. The matched count, and whether an earlier
    /// attempt failed. Also the in-document store's (`super::document`), on
    /// the user's collection.
    pub(super) async fn update_matching(
        &self,
        coll: &Collection<Document>,
        what: &str,
        filter: &Document,
        update: impl Fn() -> UpdateModifications,
        single: bool,
    ) -> Result<(u64, bool)> {
        retried(what, || async {
            let result = if single {
                self.bounded(coll.update_one(filter.clone(), update()))
                    .await
            } else {
                self.bounded(coll.update_many(filter.clone(), update()))
                    .await
            };
            result.map(|r| r.matched_count)
        })
        .await
    }

    /// Reads `key`'s document projected with [`info_projection`] (with the
    /// server's now), as [`projected_info`] reads it.
    async fn read_info(&self, key: &LeaseKey) -> Result<Option<Document>> {
        self.read_key(key, info_projection()).await
    }

    async fn inspect_key(&self, key: LeaseKey) -> Result<Option<LeaseInfo>> {
        let found = self.read_info(&key).await?;
        Ok(found.and_then(|doc| projected_info(&key, &doc)))
    }

    async fn list_page(
        &self,
        after: Option<LeaseKey>,
        limit: usize,
    ) -> Result<(Vec<LeaseInfo>, Option<LeaseKey>)> {
        if after.as_ref().is_some_and(|a| a.to_bson() == Bson::MaxKey) {
            // Nothing sorts after MaxKey (and MongoDB refuses it as `min`).
            return Ok((Vec::new(), None));
        }
        // One more than `limit` when the inclusive `min` bound returns `after`.
        let fetch = limit.saturating_add(usize::from(after.is_some()));
        let mut options = FindOptions::builder()
            .sort(doc! { field::ID: 1 })
            .limit(fetch.min(i64::MAX as usize) as i64)
            .projection(info_projection())
            .build();
        if let Some(after) = &after {
            options.min = Some(list_min(after));
            options.hint = Some(Hint::Keys(id_index()));
        }
        let mut docs: Vec<Document> = self
            .bounded(async {
                self.coll()
                    .find(doc! {})
                    .with_options(options)
                    .await?
                    .try_collect()
                    .await
            })
            .await?;
        if after.is_some() && docs.len() < fetch {
            // A `min` bound's index scan stops before a `MaxKey` `_id`
            // (docs/mongodb-behaviour.md, B10): read it apart, on the last page.
            let max_key = self
                .bounded(
                    self.coll()
                        .find_one(doc! { field::ID: Bson::MaxKey })
                        .projection(info_projection()),
                )
                .await?;
            docs.extend(max_key);
        }
        let id = |d: &Document| d.get(field::ID).cloned().map(LeaseKey::from);
        if after.is_some() && docs.first().and_then(id) == after {
            docs.remove(0);
        }
        docs.truncate(limit);
        let next = if docs.len() == limit {
            docs.last().and_then(id)
        } else {
            None
        };
        let page = docs
            .iter()
            .filter_map(|doc| projected_info(&id(doc)?, doc))
            .collect();
        Ok((page, next))
    }

    /// One `findAndModify` (a retryable write) that releases `key` if a lease
    /// of our shape holds it now, whoever the owner; returns it as it was.
    /// Otherwise, if a foreign holder's lock document is there, one
    /// `deleteOne` (a retryable write) deletes it if it is still the document
    /// read ([`foreign_filter`]); a concurrent change wins, and nothing is
    /// reported released.
    async fn force_release_key(&self, key: LeaseKey) -> Result<Option<LeaseInfo>> {
        let before = self
            .bounded(
                self.coll()
                    .find_one_and_update(
                        force_release_any_filter(&key),
                        force_release_update(self.yield_ms()),
                    )
                    .return_document(ReturnDocument::Before)
                    .projection(info_projection()),
            )
            .await?;
        if let Some(doc) = before {
            return Ok(projected_info(&key, &doc));
        }
        let found = self.read_info(&key).await?;
        let Some((found, info)) = found
            .and_then(|doc| projected_info(&key, &doc).map(|info| (doc, info)))
            .filter(|(_, info)| info.foreign)
        else {
            return Ok(None);
        };
        let deleted = self
            .bounded(self.coll().delete_one(foreign_filter(&key, &found)))
            .await?;
        Ok((deleted.deleted_count == 1).then_some(info))
    }

    async fn set_payload_of(&self, lease: LeaseRef, payload: Document) -> Result<bool> {
        let result = self
            .bounded(self.coll().update_one(
                payload_filter(self.owner(), &lease),
                payload_update(payload.clone()),
            ))
            .await?;
        if result.matched_count == 1 {
            return Ok(true);
        }
        // Not an exclusive lease (any more): a holder of a shared or
        // semaphore key, if still one.
        self.set_holder_payload(lease, payload).await
    }

    /// A change stream of the writes that may change who holds a key
    /// ([`release_events_pipeline`]), each read by [`key_write`], after
    /// [`Announcement::Opened`]. Opening it is part of the stream's first
    /// poll, so the caller never waits for it.
    fn release_events(&self) -> BoxStream<'static, Result<Announcement>> {
        let store = self.clone();
        futures::stream::once(async move {
            store
                .bounded(store.coll().watch().pipeline(release_events_pipeline()))
                .await
        })
        .map(|opened| match opened {
            Ok(stream) => {
                let writes = stream
                    .with_type::<Document>()
                    .filter_map(|event| async move {
                        match event {
                            Ok(event) => key_write(&event).map(|w| Ok(Announcement::Write(w))),
                            Err(e) => Some(Err(Error::from(e))),
                        }
                    });
                futures::stream::iter([Ok(Announcement::Opened)])
                    .chain(writes)
                    .boxed()
            }
            Err(e) => futures::stream::iter([Err(e)]).boxed(),
        })
        .flatten()
        .boxed()
    }
}

impl Store for MongoStore {
    fn light_forms(&self) -> LightForms {
        LightForms {
            acquire: true,
            release: true,
        }
    }

    fn acquire_light(&self, requests: Vec<LightAcquire>) -> BoxFuture<'static, Vec<LightAcquired>> {
        let store = self.clone();
        async move { store.light_acquires(requests).await }.boxed()
    }

    fn release_light(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Vec<LightRelease>> {
        let store = self.clone();
        async move { store.light_releases(leases).await }.boxed()
    }

    fn place(&self) -> crate::store::LockPlace {
        crate::store::LockPlace {
            database: self.coll().namespace().db,
            collection: self.coll().name().to_string(),
            field: None,
        }
    }

    fn removes_on_release(&self) -> bool {
        self.release_mode() == ReleaseMode::Delete
    }

    fn documents(&self, collection: &str, field: &str) -> Result<std::sync::Arc<dyn Store>> {
        Ok(std::sync::Arc::new(super::document::DocumentStore::new(
            self, collection, field,
        )?))
    }

    fn watch_releases(&self) -> BoxStream<'static, Result<Announcement>> {
        self.release_events()
    }

    fn acquire_with_ttl(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        let store = self.clone();
        async move {
            store
                .acquire_once(key, lease_id, waiting, ttl_ms(ttl), None)
                .await
        }
        .boxed()
    }

    fn acquire_shaped(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl: Duration,
        shape: crate::kind::LeaseShape,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        let store = self.clone();
        async move {
            store
                .acquire_shape(key, lease_id, waiting, ttl_ms(ttl), shape)
                .await
        }
        .boxed()
    }

    fn renew_with_ttl(
        &self,
        leases: Vec<LeaseRef>,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<Vec<LeaseRef>>> {
        let store = self.clone();
        async move { store.renew_batch(leases, ttl_ms(ttl)).await }.boxed()
    }

    #[cfg(test)]
    fn default_ttl(&self) -> Duration {
        Duration::from_millis(self.ttl_ms().max(0) as u64)
    }

    fn release(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move {
            if leases.is_empty() {
                return Ok(0);
            }
            store.release_leases(leases, true).await
        }
        .boxed()
    }

    /// One `findOneAndUpdate` for a plain shape (`super::handoff`); a
    /// release for any other.
    fn hand_over(
        &self,
        key: LeaseKey,
        from: Uuid,
        to: Uuid,
        ttl: Duration,
        shape: crate::kind::LeaseShape,
        light: bool,
    ) -> BoxFuture<'static, Result<HandOver>> {
        if !shape.is_plain() {
            return release_instead(self, key, from);
        }
        let store = self.clone();
        async move {
            store
                .hand_over_once(key, from, to, ttl_ms(ttl), light)
                .await
        }
        .boxed()
    }

    fn release_young(&self, lease: LeaseRef) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move { store.release_leases(vec![lease], false).await }.boxed()
    }

    fn release_owner(&self, except: Vec<Uuid>) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move {
            let filter = doc! { "$or": [
                owner_filter(store.owner(), &except),
                owner_holders_filter(store.owner(), &except),
            ]};
            let released = Released::Owner {
                owner: store.owner(),
                except: except.clone(),
            };
            store.release_matching(filter, &released, false, true).await
        }
        .boxed()
    }

    fn leave_queues(&self, keys: Vec<LeaseKey>) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move { store.leave_queues_of(keys).await }.boxed()
    }

    fn registration_window(&self) -> Duration {
        self.registration()
    }

    fn release_by_owner(&self, owner: String) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move { store.release_leases_of(owner).await }.boxed()
    }

    fn delete_released(&self, keys: Vec<LeaseKey>) -> BoxFuture<'static, Result<u64>> {
        let store = self.clone();
        async move {
            if keys.is_empty() || store.release_mode() != ReleaseMode::Delete {
                return Ok(0);
            }
            store.delete_released_matching(keys_filter(&keys)).await
        }
        .boxed()
    }

    fn inspect(&self, key: LeaseKey) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let store = self.clone();
        async move { store.inspect_key(key).await }.boxed()
    }

    fn list(
        &self,
        after: Option<LeaseKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<LeaseKey>)>> {
        let store = self.clone();
        async move { store.list_page(after, limit).await }.boxed()
    }

    fn force_release(&self, key: LeaseKey) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let store = self.clone();
        async move { store.force_release_key(key).await }.boxed()
    }

    fn set_payload(&self, lease: LeaseRef, payload: Document) -> BoxFuture<'static, Result<bool>> {
        let store = self.clone();
        async move { store.set_payload_of(lease, payload).await }.boxed()
    }

    fn observe(&self, key: LeaseKey) -> BoxStream<'static, Result<Option<LeaseInfo>>> {
        observe(self.clone(), key)
    }
}

/// A TTL in milliseconds, as the pipelines add it to `$$NOW` (TTLs are
/// validated far below `i64::MAX` ms).
pub(super) fn ttl_ms(ttl: Duration) -> i64 {
    ttl.as_millis().min(i64::MAX as u128) as i64
}
