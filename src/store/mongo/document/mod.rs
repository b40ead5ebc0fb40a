//! [`DocumentStore`]: the lock protocol inside the user's own documents
//! (in-document leases), on one user collection.
//!
//! The lock collection's protocol (`crate::store`) with every lock field
//! under one field `F` of the user's document, and "delete" meaning the
//! removal of `F` (`$unset`), as in delete-on-release mode; what each write
//! does is docs/in-document.md, and `LockIdFields` its "Documents locked by
//! LockId and LockTime" (`top_lock`). Nothing here creates an index in the
//! user's collection; listing, observing, force release and release by
//! another owner id are not offered (`Error::Unsupported`).
//!
//! The BSON it sends is built by pure functions over the shared rules
//! (`rules`, under `F`), one file per concern.

mod events;
mod pipeline;
mod top_lock;
mod write;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use mongodb::Collection;
use mongodb::bson::{Bson, DateTime, Document};
use mongodb::options::ReturnDocument;
use uuid::Uuid;

use self::events::{key_write, release_events_pipeline};
use self::pipeline::{
    DOCUMENT, acquire_pipeline, acquire_projection, info_projection, lease_filter, lock_view,
    payload_update, release_update, remove_update, renew_update,
};
use self::top_lock::TopLock;
use self::write::{
    LockAfter, held_filter, held_removable_filter, held_waited_filter, write_operators,
    write_pipeline,
};
use super::MongoStore;
use super::handle::{min_token_age_ms, reread_after, ttl_ms};
use super::release::release_in_two_writes;
use super::rules::LockPath;
use super::rules::{key_filter, keys_filter};
use super::watch::announcements;
use crate::document_update::DocumentUpdate;
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::lock_id_fields::LockIdFields;
use crate::store::{
    AcquireOutcome, AcquireRequest, Announced, Announcement, DocumentWrite, LeaseRef, LockPlace,
    Release, Released, Store, StoreProfile, lease_info, replies,
};

/// In-document leases on one user collection, lock fields under one field.
#[derive(Clone)]
pub(crate) struct DocumentStore {
    /// The lock collection's store: owner id, TTL, yield window, timeout.
    locks: MongoStore,
    coll: Collection<Document>,
    /// The lock field `F`.
    field: Arc<str>,
    /// `LockId` / `LockTime` kept at the top, if opened with them.
    lock_id: Option<Arc<LockIdFields>>,
    top: Option<Arc<TopLock>>,
}

impl DocumentStore {
    /// In-document leases on `collection` (the lock collection's database,
    /// same concerns), with the lock fields under `field`. Sends nothing.
    pub(crate) fn new(
        locks: &MongoStore,
        collection: &str,
        field: &str,
        lock_id: Option<Arc<LockIdFields>>,
    ) -> Result<Self> {
        crate::document_update::check_collection(collection)?;
        crate::document_update::check_field(field)?;
        if let Some(fields) = &lock_id {
            fields.check(field)?;
        }
        Ok(DocumentStore {
            locks: locks.clone(),
            coll: locks.sibling(collection),
            field: field.into(),
            top: lock_id.as_deref().map(|f| Arc::new(TopLock::new(f))),
            lock_id,
        })
    }

    /// `filter`, only while the lease is current in `LockId` too (with
    /// `LockId` / `LockTime` kept).
    fn current(&self, filter: Document) -> Document {
        match &self.top {
            Some(top) => top.only_current(&self.field, filter),
            None => filter,
        }
    }

    /// The lock of `document` as read ([`lock_view`], or [`TopLock::view`]).
    fn view(&self, document: &Document, now: Bson) -> Option<Document> {
        match &self.top {
            Some(top) => top.view(&self.field, document, now),
            None => lock_view(&self.field, document, now),
        }
    }

    fn owner(&self) -> &str {
        self.locks.owner()
    }

    /// Where the lock fields are: under `F`.
    fn lock(&self) -> LockPath {
        LockPath::under(&self.field)
    }

    fn unsupported<T: Send + 'static>(&self, what: &str) -> BoxFuture<'static, Result<T>> {
        let reason = format!(
            "{what} is not available for in-document leases (collection {}, lock field {})",
            self.coll.name(),
            self.field
        );
        Box::pin(async move { Err(Error::Unsupported { reason }) })
    }

    /// Reads `key`'s document with `projection`.
    async fn read_key(&self, key: &LeaseKey, projection: Document) -> Result<Option<Document>> {
        let read = self.coll.find_one(key_filter(key)).projection(projection);
        self.locks.bounded(read).await
    }

    /// What an acquire read out of `projected` (the document and `now`, as
    /// [`acquire_projection`] returns them): the outcome by
    /// [`replies::in_document`] on the lock field, and the document.
    fn judge(
        &self,
        key: &LeaseKey,
        lease_id: Uuid,
        projected: Document,
    ) -> Result<(AcquireOutcome, Option<Document>)> {
        let now = projected.get("now").cloned().unwrap_or(Bson::Null);
        let Ok(document) = projected.get_document(DOCUMENT) else {
            return Err(Error::Unreachable {
                waited: self.locks.operation_timeout,
                reason: "the acquire's reply carried no document".into(),
                source: None,
            });
        };
        let view = self.view(document, now);
        let outcome = replies::in_document(key, self.owner(), lease_id, view.as_ref());
        Ok((outcome, Some(document.clone())))
    }

    async fn acquire_once(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl: Duration,
        create: Option<Document>,
    ) -> Result<(AcquireOutcome, Option<Document>)> {
        let update = acquire_pipeline(
            &self.field,
            self.owner(),
            ttl_ms(ttl),
            lease_id,
            waiting,
            create.as_ref(),
            self.top.as_deref(),
        );
        let attempt = self
            .locks
            .bounded(
                self.coll
                    .find_one_and_update(key_filter(&key), update)
                    .upsert(create.is_some())
                    .return_document(ReturnDocument::After)
                    .projection(acquire_projection()),
            )
            .await;
        match attempt {
            Ok(Some(projected)) => return self.judge(&key, lease_id, projected),
            Ok(None) if create.is_none() => {
                return Err(Error::DocumentNotFound { id: key });
            }
            Ok(None) => {}
            Err(e) => reread_after(&key, e, |e| Error::InvalidUpdate {
                reason: format!(
                    "a unique index of collection {} other than `_id` refused the document \
                     {}: {e}",
                    self.coll.name(),
                    key.to_extended_json()
                ),
            })?,
        }
        self.reread(key, lease_id, create.is_some()).await
    }

    /// The re-read of an acquire attempt (under `lease_id`, creating the
    /// document if `creates`) whose write did not return the document:
    /// its verdict is only what a read proves ([`replies::from_reread`]).
    pub(in crate::store::mongo) async fn reread(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        creates: bool,
    ) -> Result<(AcquireOutcome, Option<Document>)> {
        match self.read_key(&key, acquire_projection()).await? {
            Some(projected) => self
                .judge(&key, lease_id, projected)
                .map(|(outcome, document)| (replies::from_reread(outcome), document)),
            None if !creates => Err(Error::DocumentNotFound { id: key }),
            None => Err(Error::Unreachable {
                waited: self.locks.operation_timeout,
                reason: "document vanished during acquire".into(),
                source: None,
            }),
        }
    }

    async fn renew_batch(&self, leases: Vec<LeaseRef>, ttl: Duration) -> Result<Vec<LeaseRef>> {
        let filter =
            |leases: &[LeaseRef]| self.current(lease_filter(&self.field, self.owner(), leases));
        // Idempotent, judged by matchedCount (docs/mongodb-behaviour.md, B4).
        let mut update = renew_update(&self.field, ttl_ms(ttl));
        if let Some(top) = &self.top {
            update = top.renewing(update);
        }
        self.locks
            .renew_matching(
                &self.coll,
                filter,
                update,
                leases,
                &self.lock().at(crate::store::field::LEASE_ID),
            )
            .await
    }

    /// Releases the leases matching `filter` as the lock collection does in
    /// delete mode ([`release_in_two_writes`]), "delete" being the removal of
    /// the lock field: removed where the token is at least
    /// `DELETE_MIN_TOKEN_AGE` old and nobody waited; the rest left in the
    /// released state. With `LockId` / `LockTime` kept, only while the
    /// lease is current there, and both are set to null.
    async fn release_matching(&self, filter: Document, single: bool) -> Result<u64> {
        let filter = self.current(filter);
        let removable = self
            .lock()
            .deletable_filter(filter.clone(), min_token_age_ms(), &[]);
        let remove = || match &self.top {
            Some(top) => top.releasing_operators(&remove_update(&self.field)).into(),
            None => remove_update(&self.field).into(),
        };
        let release = || {
            let update = release_update(&self.field, self.locks.yield_ms);
            match &self.top {
                Some(top) => top.releasing(update).into(),
                None => update.into(),
            }
        };
        let (removed, marked) = release_in_two_writes(
            single,
            self.locks
                .update_matching(&self.coll, "release", &removable, remove, single),
            self.locks
                .update_matching(&self.coll, "release", &filter, release, single),
        )
        .await?;
        Ok(removed + marked)
    }

    /// Releases `leases` of this manager ([`DocumentStore::release_matching`]).
    async fn release_leases(&self, leases: Vec<LeaseRef>) -> Result<u64> {
        if leases.is_empty() {
            return Ok(0);
        }
        let filter = lease_filter(&self.field, self.owner(), &leases);
        self.release_matching(filter, leases.len() == 1).await
    }

    /// Delete mode's follow-up: removes the lock fields of `keys` left
    /// released whose token is now old enough.
    async fn remove_released(&self, keys: Vec<LeaseKey>) -> Result<u64> {
        if keys.is_empty() {
            return Ok(0);
        }
        let filter = self
            .lock()
            .released_filter(keys_filter(&keys), min_token_age_ms(), &[], &[]);
        let remove = || remove_update(&self.field).into();
        self.locks
            .update_matching(&self.coll, "lock field removal", &filter, remove, false)
            .await
    }

    /// One conditional `findAndModify` (a retryable write, no upsert) of
    /// `update` on the document matching `filter`; the document after it.
    async fn write_if(
        &self,
        filter: Document,
        update: impl Into<mongodb::options::UpdateModifications>,
    ) -> Result<Option<Document>> {
        self.locks
            .bounded(
                self.coll
                    .find_one_and_update(filter, update)
                    .return_document(ReturnDocument::After),
            )
            .await
    }

    async fn write(
        &self,
        lease: LeaseRef,
        token: u64,
        write: DocumentWrite,
    ) -> Result<Option<Document>> {
        let lock_field = &self.field;
        let owner = self.owner();
        let top = self.top.as_deref();
        // The lock field after the write, and `LockId` / `LockTime` null if
        // it releases.
        let operators = |user: &Document, after: LockAfter| {
            let update = write_operators(lock_field, user, after);
            match top {
                Some(top) if after != LockAfter::Kept => top.releasing_operators(&update),
                _ => update,
            }
        };
        match write.update {
            DocumentUpdate::Pipeline(stages) => {
                let mut update = write_pipeline(
                    lock_field,
                    owner,
                    token,
                    &stages,
                    write.release,
                    self.locks.yield_ms,
                    min_token_age_ms(),
                );
                if let Some(top) = top {
                    update = top.around_pipeline(
                        update,
                        stages.len(),
                        lock_field,
                        owner,
                        token,
                        write.release,
                    );
                }
                self.write_if(self.current(held_filter(lock_field, owner, &lease)), update)
                    .await
            }
            DocumentUpdate::Modifiers(user) if !write.release => {
                self.write_if(
                    self.current(held_filter(lock_field, owner, &lease)),
                    operators(&user, LockAfter::Kept),
                )
                .await
            }
            DocumentUpdate::Modifiers(user) => {
                // Each attempt is conditional on the lease being held, so at
                // most one applies; they differ in how the lock field ends.
                // A lease the actor knows is young cannot be removed yet.
                if !write.too_young_to_delete {
                    let removed = self
                        .write_if(
                            self.current(held_removable_filter(
                                lock_field,
                                owner,
                                &lease,
                                min_token_age_ms(),
                            )),
                            operators(&user, LockAfter::Removed),
                        )
                        .await?;
                    if removed.is_some() {
                        return Ok(removed);
                    }
                }
                let released = self
                    .write_if(
                        self.current(held_waited_filter(lock_field, owner, &lease, false)),
                        operators(&user, LockAfter::Released(None)),
                    )
                    .await?;
                if released.is_some() {
                    return Ok(released);
                }
                let until = DateTime::from_millis(
                    DateTime::now()
                        .timestamp_millis()
                        .saturating_add(self.locks.yield_ms),
                );
                self.write_if(
                    self.current(held_waited_filter(lock_field, owner, &lease, true)),
                    operators(&user, LockAfter::Released(Some(until))),
                )
                .await
            }
        }
    }

    async fn inspect_key(&self, key: LeaseKey) -> Result<Option<LeaseInfo>> {
        let mut projection = info_projection(&self.field);
        if let Some(top) = &self.top {
            projection = top.projecting(projection);
        }
        let found = self.read_key(&key, projection).await?;
        Ok(found.and_then(|found| {
            let now = *found.get_datetime("now").ok()?;
            let view = self.view(&found, Bson::DateTime(now))?;
            Some(lease_info(&key, &view, now.to_system_time()))
        }))
    }
}

impl Store for DocumentStore {
    /// No light form, no lock-delay (nor the operator's overrides that
    /// write it), a release that removes the lock field; the registration
    /// window is the lock collection's store's: in-document leases have no
    /// queue (nothing registers), but the window is the manager's all the
    /// same.
    fn profile(&self) -> StoreProfile {
        StoreProfile {
            place: Arc::new(LockPlace {
                database: self.coll.namespace().db,
                collection: self.coll.name().to_string(),
                field: Some(self.field.to_string()),
                lock_id: self.lock_id.as_ref().map(|f| f.lock_id.clone()),
            }),
            light_forms: Default::default(),
            removes_on_release: true,
            registration_window: self.locks.registration(),
            queue_bound: crate::store::MAX_QUEUE,
            lock_delay: Duration::ZERO,
            lock_id_fields: self.lock_id.clone(),
            #[cfg(test)]
            ttl: Duration::from_millis(self.locks.ttl_ms() as u64),
        }
    }

    fn renew_with_ttl(
        &self,
        leases: Vec<LeaseRef>,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<Vec<LeaseRef>>> {
        let store = self.clone();
        async move {
            if leases.is_empty() {
                return Ok(Vec::new());
            }
            store.renew_batch(leases, ttl).await
        }
        .boxed()
    }

    /// The leases by the release in two writes, the lock field removed
    /// where the token is old enough (a lease too young for it is released
    /// so too: the removal then matches nothing); the follow-up removes the
    /// lock fields left released. No operator's override here.
    fn release(&self, release: Release) -> BoxFuture<'static, Result<Released>> {
        let store = self.clone();
        async move {
            let count = match release {
                Release::Leases(leases) => store.release_leases(leases).await?,
                Release::LeaseTooYoungToDelete(lease) => store.release_leases(vec![lease]).await?,
                Release::ReleasedDocuments(keys) => store.remove_released(keys).await?,
                Release::OwnerLeases { .. } | Release::ReleasedDocumentsOf(_) => {
                    return store.unsupported("release by another owner id").await;
                }
                Release::ForcedKey { .. } => return store.unsupported("force release").await,
            };
            Ok(Released::count(count))
        }
        .boxed()
    }

    fn inspect(&self, key: LeaseKey) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let store = self.clone();
        async move { store.inspect_key(key).await }.boxed()
    }

    fn list(
        &self,
        _after: Option<LeaseKey>,
        _limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<LeaseKey>)>> {
        self.unsupported("listing")
    }

    fn set_payload(&self, lease: LeaseRef, payload: Document) -> BoxFuture<'static, Result<bool>> {
        let store = self.clone();
        async move {
            let result = store
                .locks
                .bounded(store.coll.update_one(
                    store.current(store.lock().payload_filter(store.owner(), &lease)),
                    payload_update(&store.field, payload),
                ))
                .await?;
            Ok(result.matched_count == 1)
        }
        .boxed()
    }

    fn observe(&self, key: LeaseKey) -> BoxStream<'static, Result<Option<LeaseInfo>>> {
        let reason = format!(
            "observing {} is not available for in-document leases (collection {})",
            key.to_extended_json(),
            self.coll.name()
        );
        futures::stream::iter([Err(Error::Unsupported { reason })]).boxed()
    }

    /// The writes that may change who holds a document's lease
    /// ([`release_events_pipeline`]), each read by [`key_write`].
    fn watch_releases(&self, _: Announced) -> BoxStream<'static, Result<Announcement>> {
        let store = self.clone();
        let lock_field = self.field.clone();
        let top_id = self.top.as_ref().map(|t| t.id().to_string());
        let open = async move {
            let top_id = store.top.as_ref().map(|t| t.id());
            let pipeline = release_events_pipeline(&store.field, top_id);
            store
                .locks
                .bounded(store.coll.watch().pipeline(pipeline))
                .await
        };
        announcements(open, move |event| {
            key_write(&lock_field, top_id.as_deref(), event).map(crate::store::Announcement::Write)
        })
    }

    fn acquire(
        &self,
        request: AcquireRequest,
    ) -> BoxFuture<'static, Result<(AcquireOutcome, Option<Document>)>> {
        let store = self.clone();
        async move {
            let AcquireRequest {
                key,
                lease_id,
                waiting,
                ttl,
                shape,
                create,
                payload,
            } = request;
            crate::store::document_shape(shape)?;
            crate::store::payload_applies(true, shape, payload.as_ref())?;
            if let Some(fields) = &store.lock_id {
                fields.check_ttl(ttl)?;
            }
            store
                .acquire_once(key, lease_id, waiting, ttl, create)
                .await
        }
        .boxed()
    }

    fn write_document(
        &self,
        lease: LeaseRef,
        token: u64,
        write: DocumentWrite,
    ) -> BoxFuture<'static, Result<Option<Document>>> {
        let store = self.clone();
        async move { store.write(lease, token, write).await }.boxed()
    }
}
