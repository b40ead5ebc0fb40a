//! In-document leases: the lock lives inside the user's own document, under
//! one field, and the release can write the document's new state in the same
//! atomic write ([`DocumentLease::commit`]).
//!
//! [`LockManager::documents`] gives a [`DocumentLeases`] handle on one user
//! collection; its acquires return a [`DocumentLease`]: the lease (the same
//! [`Lease`] as for keys of the lock collection: fencing token, lost-lease
//! token, renewal in the manager's batched heartbeat) together with the
//! document as the acquire read it, in the same round trip.
//!
//! # Document schema
//!
//! The lock fields live under one field of the user's document (default
//! [`DEFAULT_LEASE_FIELD`], `_lease`), with the lock collection's names and
//! rules: `aid` (owner id), `lid` (lease id), `tok` (fencing token), `acq`,
//! `ts` and `exp` (server times of the acquisition, the last renewal, and
//! the expiry), `wt`/`yu` (fairness between owners). Acquire, renewal and
//! release write only that field; every other field of the document is the
//! user's, and only [`DocumentLease::update`] and [`DocumentLease::commit`]
//! write them, with the user's update.
//!
//! A released document carries no lock field, except after a lease shorter
//! than [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) (by the
//! server's clock) or one another owner waited for: the field is then left
//! in the released state (no lease id `lid`, `exp` at the release time, the
//! fencing token `tok` kept, so that the next acquisition's token is
//! greater, see the "Fencing tokens" rule of the lock collection; `yu` if
//! another owner waited), which the next acquire takes over at once. The
//! manager removes a released field nobody took once its token is
//! `DELETE_MIN_TOKEN_AGE` old by the server's clock; shutdown waits for that
//! removal. A field left yielded (another owner waited, and did not take it)
//! stays.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::{Bson, Document};
use serde::de::DeserializeOwned;
use typed_builder::TypedBuilder;

use crate::actor::command::{AcquireMode, Target};
use crate::config::AcquireOptions;
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::lease::{Lease, ReleaseOutcome};
use crate::manager::LockManager;

/// Default field of the user's document that holds an in-document lease's
/// lock fields: `_lease`.
pub const DEFAULT_LEASE_FIELD: &str = "_lease";

/// An update to a user's document under an in-document lease: what
/// MongoDB's `updateOne` takes.
///
/// # Examples
///
/// ```
/// use mongodb::bson::doc;
/// use mongo_lease::DocumentUpdate;
///
/// // Update operators:
/// let update: DocumentUpdate = doc! { "$set": { "state": "done" }, "$inc": { "runs": 1 } }.into();
/// // An aggregation pipeline:
/// let update: DocumentUpdate = vec![doc! { "$set": { "runs": { "$add": ["$runs", 1] } } }].into();
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum DocumentUpdate {
    /// A document of update operators (`$set`, `$inc`, `$push`, ...). It
    /// must not write the lease's lock field.
    Modifiers(Document),
    /// An update pipeline (`$set`, `$unset`, `$replaceWith`, ... stages). Its
    /// stages run between the lease's own stages, which keep the lock field
    /// in a temporary field and restore it afterwards, so the pipeline cannot
    /// change the lease; it must keep `_id`, and must not name a field or
    /// string starting with `__mongo_lease_` (reserved for that temporary
    /// field). It must also keep the document's other fields (`$$ROOT`): a
    /// stage that drops them (a `$replaceWith` naming only some, a `$project`
    /// that includes only some) drops them for good, and the lease with them:
    /// the write applies, the lock field is left released, and the lease is
    /// lost (docs/mongodb-behaviour.md, B14). Keep `$$ROOT`
    /// (`$replaceWith: { $mergeObjects: ["$$ROOT", ...] }`, `$unset` instead
    /// of an inclusion `$project`).
    Pipeline(Vec<Document>),
}

impl From<Document> for DocumentUpdate {
    fn from(update: Document) -> Self {
        DocumentUpdate::Modifiers(update)
    }
}

impl From<Vec<Document>> for DocumentUpdate {
    fn from(pipeline: Vec<Document>) -> Self {
        DocumentUpdate::Pipeline(pipeline)
    }
}

/// Options of one in-document acquisition
/// ([`DocumentLeases::acquire_with`] and its variants).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use mongodb::bson::doc;
/// use mongo_lease::DocumentAcquireOptions;
///
/// let options = DocumentAcquireOptions::builder()
///     .create(doc! { "state": "new", "runs": 0 })
///     .ttl(Duration::from_secs(60))
///     .build();
/// ```
#[derive(Debug, Clone, Default, PartialEq, TypedBuilder)]
#[non_exhaustive]
pub struct DocumentAcquireOptions {
    /// The lease's TTL, as [`AcquireOptions::ttl`]. Default: the manager's
    /// [`ttl`](crate::LockManagerOptions::ttl).
    #[builder(default, setter(strip_option))]
    pub ttl: Option<Duration>,
    /// Fields of the document to create if none has this `_id` (the `_id`
    /// is the one acquired; the document must not name `_id` or the lock
    /// field). Concurrent acquires that create the same document create it
    /// once: one of them wins, the others find it held. A document that
    /// exists but holds nothing but its `_id` is given these fields too.
    /// Local callers waiting for the same document are served first in,
    /// first out, each attempt with the fields of the caller first in line:
    /// a missing document is created only for a caller that gave fields,
    /// with its fields. Default: `None`, a missing document is
    /// [`Error::DocumentNotFound`] (for every local caller then waiting for
    /// it without fields; the next one with fields creates it).
    #[builder(default, setter(strip_option))]
    pub create: Option<Document>,
}

/// In-document leases on one user collection, from
/// [`LockManager::documents`]: acquire a document's lease by its `_id`, and
/// get the document with it.
///
/// The same manager drives them as the lock collection's leases: the same
/// actor, FIFO local waiters, jittered retries, change-stream wake-up,
/// batched renewal in the heartbeat (one `updateMany` per collection and
/// TTL), the same fencing-token rule and lost-lease token. `T` is the type
/// the document is read as (`bson::Document` by default); the lock field is
/// removed before it is deserialised.
///
/// # Examples
///
/// ```no_run
/// use mongodb::bson::doc;
/// use mongo_lease::{DocumentAcquireOptions, LockManager};
///
/// # async fn demo(manager: LockManager) -> mongo_lease::Result<()> {
/// let items = manager.documents::<mongodb::bson::Document>("workitem").await?;
/// let options = DocumentAcquireOptions::builder().create(doc! { "runs": 0 }).build();
/// let item = items.acquire_with("item-17", options).await?;
/// println!("runs so far: {}", item.document().get_i32("runs").unwrap_or(0));
/// // Write the new state and release, in one atomic write:
/// item.commit(doc! { "$inc": { "runs": 1 } }).await?;
/// # Ok(()) }
/// ```
pub struct DocumentLeases<T = Document> {
    manager: LockManager,
    place: crate::actor::command::Place,
    collection: Arc<str>,
    field: Arc<str>,
    _document: PhantomData<fn() -> T>,
}

impl<T> Clone for DocumentLeases<T> {
    fn clone(&self) -> Self {
        DocumentLeases {
            manager: self.manager.clone(),
            place: self.place,
            collection: self.collection.clone(),
            field: self.field.clone(),
            _document: PhantomData,
        }
    }
}

impl<T> fmt::Debug for DocumentLeases<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocumentLeases")
            .field("collection", &self.collection)
            .field("field", &self.field)
            .finish_non_exhaustive()
    }
}

impl LockManager {
    /// In-document leases on `collection` (in the lock collection's
    /// database), with the lock fields under [`DEFAULT_LEASE_FIELD`].
    ///
    /// Nothing is sent to MongoDB and no index is created.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for an empty collection name or one MongoDB
    /// refuses (`$`, NUL, a `system.` prefix), or the lock collection itself
    /// (its documents are lock documents), and [`Error::Shutdown`] once the
    /// manager has shut down.
    pub async fn documents<T>(&self, collection: &str) -> Result<DocumentLeases<T>> {
        self.documents_in_field(collection, DEFAULT_LEASE_FIELD)
            .await
    }

    /// [`LockManager::documents`] with the lock fields under `field`, a
    /// top-level field name of the user's choice.
    ///
    /// # Errors
    ///
    /// As [`LockManager::documents`], and [`Error::InvalidConfig`] for a
    /// field name that is empty, `_id`, starts with `$` or contains `.` or
    /// NUL.
    pub async fn documents_in_field<T>(
        &self,
        collection: &str,
        field: &str,
    ) -> Result<DocumentLeases<T>> {
        let place = self.open_documents(collection, field).await?;
        Ok(DocumentLeases {
            manager: self.clone(),
            place,
            collection: collection.into(),
            field: field.into(),
            _document: PhantomData,
        })
    }
}

impl<T: DeserializeOwned> DocumentLeases<T> {
    /// The user collection.
    pub fn collection(&self) -> &str {
        &self.collection
    }

    /// The field that holds the lock fields.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// Reads the lease of the document with `_id` `id`, with the server's
    /// clock, as [`LockManager::inspect`] reads a key: who holds it (or last
    /// held it), its fencing token, acquisition, renewal and expiry times.
    /// `Ok(None)` if there is no such document or it carries no lock field
    /// (never leased, or released). A lock field of foreign shape (the
    /// user's own value under that name) is shown as held by a foreign
    /// holder ([`LeaseInfo::foreign`](crate::LeaseInfo::foreign)). One round
    /// trip; reads only `_id` and the lock field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for an `_id` MongoDB refuses,
    /// [`Error::Shutdown`], and database errors ([`Error::Database`],
    /// [`Error::Unreachable`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(items: mongo_lease::DocumentLeases) -> mongo_lease::Result<()> {
    /// if let Some(info) = items.inspect("item-17").await? {
    ///     if info.held {
    ///         println!("{} holds it for {:?} more", info.owner_id, info.time_to_expiry());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, id: impl Into<LeaseKey>) -> Result<Option<crate::LeaseInfo>> {
        self.manager
            .inspect_target(Target {
                place: self.place,
                key: id.into(),
            })
            .await
    }

    /// Acquires the lease of the document with `_id` `id`, waiting as long
    /// as it takes, as [`LockManager::acquire`] does for a key; returns it
    /// with the document as the acquiring write left it.
    ///
    /// # Errors
    ///
    /// [`Error::DocumentNotFound`] if no document has this `_id` (see
    /// [`DocumentLeases::acquire_with`] to create it), [`Error::InvalidKey`]
    /// for an `_id` MongoDB refuses, [`Error::Database`] if the document
    /// cannot be read as `T` (the lease is then released),
    /// [`Error::Shutdown`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockManager::acquire`].
    pub async fn acquire(&self, id: impl Into<LeaseKey>) -> Result<DocumentLease<T>> {
        self.acquire_with(id, DocumentAcquireOptions::default())
            .await
    }

    /// [`DocumentLeases::acquire`] with options: the fields to create the
    /// document with if it does not exist, the lease's TTL.
    ///
    /// # Errors
    ///
    /// As [`DocumentLeases::acquire`] (no [`Error::DocumentNotFound`] with
    /// [`DocumentAcquireOptions::create`]), and [`Error::InvalidUpdate`] for
    /// a document to create that names `_id` or the lock field (nothing
    /// sent) or that a unique index of the collection other than `_id`'s
    /// refuses (nothing written),
    /// [`Error::InvalidConfig`] for a TTL that breaks the manager's timing
    /// rules.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockManager::acquire`].
    pub async fn acquire_with(
        &self,
        id: impl Into<LeaseKey>,
        options: DocumentAcquireOptions,
    ) -> Result<DocumentLease<T>> {
        match self.request(id.into(), AcquireMode::Wait, options).await? {
            Some(lease) => Ok(lease),
            None => Err(Error::Shutdown),
        }
    }

    /// [`DocumentLeases::acquire`], waiting at most `timeout`; `Ok(None)` if
    /// the lease could not be acquired in time.
    ///
    /// # Errors
    ///
    /// As [`DocumentLeases::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockManager::acquire`].
    pub async fn acquire_timeout(
        &self,
        id: impl Into<LeaseKey>,
        timeout: Duration,
    ) -> Result<Option<DocumentLease<T>>> {
        self.acquire_timeout_with(id, timeout, DocumentAcquireOptions::default())
            .await
    }

    /// [`DocumentLeases::acquire_with`], waiting at most `timeout`.
    ///
    /// # Errors
    ///
    /// As [`DocumentLeases::acquire_with`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockManager::acquire`].
    pub async fn acquire_timeout_with(
        &self,
        id: impl Into<LeaseKey>,
        timeout: Duration,
        options: DocumentAcquireOptions,
    ) -> Result<Option<DocumentLease<T>>> {
        match tokio::time::timeout(timeout, self.acquire_with(id, options)).await {
            Ok(result) => result.map(Some),
            Err(_elapsed) => Ok(None),
        }
    }

    /// One attempt, as [`LockManager::try_acquire`]: `Ok(None)` if the
    /// document's lease is held (by another owner, a local caller, or
    /// local waiters queue for it).
    ///
    /// # Errors
    ///
    /// As [`DocumentLeases::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockManager::acquire`].
    pub async fn try_acquire(&self, id: impl Into<LeaseKey>) -> Result<Option<DocumentLease<T>>> {
        self.try_acquire_with(id, DocumentAcquireOptions::default())
            .await
    }

    /// [`DocumentLeases::try_acquire`] with options.
    ///
    /// # Errors
    ///
    /// As [`DocumentLeases::acquire_with`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LockManager::acquire`].
    pub async fn try_acquire_with(
        &self,
        id: impl Into<LeaseKey>,
        options: DocumentAcquireOptions,
    ) -> Result<Option<DocumentLease<T>>> {
        self.request(id.into(), AcquireMode::Try, options).await
    }

    async fn request(
        &self,
        id: LeaseKey,
        mode: AcquireMode,
        options: DocumentAcquireOptions,
    ) -> Result<Option<DocumentLease<T>>> {
        if let Some(create) = &options.create {
            check_create(create, &self.field)?;
        }
        let acquire = AcquireOptions { ttl: options.ttl };
        let target = Target {
            place: self.place,
            key: id,
        };
        let Some(granted) = self
            .manager
            .request_target(target, mode, &acquire, options.create)
            .await?
        else {
            return Ok(None);
        };
        let raw = granted.document.unwrap_or_default();
        let lease = DocumentLease::new(granted.lease, raw, self.field.clone());
        match lease {
            Ok(lease) => Ok(Some(lease)),
            Err(failed) => {
                let (lease, error) = *failed;
                let _ = lease.release().await;
                Err(error)
            }
        }
    }
}

/// A held in-document lease, with the document as last read or written under
/// it (the lock field removed).
///
/// Dropping it releases the lease in the background, as for a [`Lease`]; the
/// document's own fields are then left as they are.
pub struct DocumentLease<T = Document> {
    lease: Lease,
    raw: Document,
    document: T,
    field: Arc<str>,
}

impl<T: DeserializeOwned> DocumentLease<T> {
    /// `raw` is the document as MongoDB returned it, lock field included.
    /// On a document that cannot be read as `T`, the lease is given back with
    /// the error.
    fn new(lease: Lease, mut raw: Document, field: Arc<str>) -> Result<Self, Box<(Lease, Error)>> {
        raw.remove(&*field);
        match mongodb::bson::from_document::<T>(raw.clone()) {
            Ok(document) => Ok(DocumentLease {
                lease,
                raw,
                document,
                field,
            }),
            Err(error) => Err(Box::new((
                lease,
                Error::Database(mongodb::error::Error::from(error)),
            ))),
        }
    }

    /// The document, as the acquire read it or the last
    /// [`DocumentLease::update`] wrote it (without the lock field).
    pub fn document(&self) -> &T {
        &self.document
    }

    /// The same document as BSON (without the lock field).
    pub fn raw_document(&self) -> &Document {
        &self.raw
    }

    /// The document's `_id` (the lease's key).
    pub fn id(&self) -> &LeaseKey {
        self.lease.key()
    }

    /// The lease: fencing token, lost-lease token, TTL, owner id.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// The lease and the document (as [`DocumentLease::document`]), apart:
    /// the lease stays held until released ([`Lease::release`], or dropped,
    /// as any [`Lease`]), and its fenced writes
    /// ([`Lease::with_transaction`], [`Lease::fence`]) still work, but the
    /// document's own writes under it ([`DocumentLease::update`],
    /// [`DocumentLease::commit`]) are no longer available.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(items: mongo_lease::DocumentLeases) -> mongo_lease::Result<()> {
    /// let item = items.acquire("item-17").await?;
    /// let (lease, document) = item.into_parts();
    /// lease.release().await?;
    /// println!("as it was while held: {document}");
    /// # Ok(()) }
    /// ```
    pub fn into_parts(self) -> (Lease, T) {
        (self.lease, self.document)
    }

    /// Writes `update` to the document if the lease is still held (by the
    /// server's clock, under its lease id), in one conditional write, and
    /// keeps the lease. Returns the document as written.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost: nothing was written, and
    /// the lease's token has fired. [`Error::InvalidUpdate`] for an update
    /// that is empty or writes the lock field, or a pipeline that names the
    /// reserved temporary field (nothing sent). [`Error::Database`] for an
    /// update MongoDB refuses (nothing written), or a result that cannot be
    /// read as `T` (the write happened). [`Error::Shutdown`]. An error for
    /// which [`Error::is_transient`] is true (the network, a failover, the
    /// manager's operation timeout) leaves the outcome unknown: the update
    /// may have been written. (The write is a retryable write: on a replica
    /// set the driver sends it once more after such an error, and a write
    /// that had landed is then answered as written.)
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future after the command was sent does
    /// not undo the write, which may or may not happen.
    pub async fn update(&mut self, update: impl Into<DocumentUpdate>) -> Result<&T> {
        let written = self.write(update.into(), false).await?;
        let mut raw = written;
        raw.remove(&*self.field);
        self.document = mongodb::bson::from_document(raw.clone())
            .map_err(|e| Error::Database(mongodb::error::Error::from(e)))?;
        self.raw = raw;
        Ok(&self.document)
    }

    /// Writes `update` to the document and releases the lease, in one atomic
    /// write conditional on the lease (by the server's clock, under its lease
    /// id): either both happen or neither. Returns the document as written.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease was lost: the update was **not**
    /// written. Otherwise as [`DocumentLease::update`]; if the result cannot
    /// be read as `T`, the write and the release happened. After any error
    /// the lease is released all the same (this `DocumentLease` is
    /// consumed, also by an [`Error::InvalidUpdate`] refused before anything
    /// was sent): acquire the document again to retry. After an error of
    /// unknown outcome ([`Error::is_transient`]), read the document to learn
    /// whether the update was written.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, as [`DocumentLease::update`]; if the future is
    /// dropped the lease is released anyway (or expires).
    pub async fn commit(mut self, update: impl Into<DocumentUpdate>) -> Result<T> {
        let written = self.write(update.into(), true).await?;
        self.lease.mark_released();
        let mut raw = written;
        raw.remove(&*self.field);
        mongodb::bson::from_document(raw)
            .map_err(|e| Error::Database(mongodb::error::Error::from(e)))
    }

    /// Releases the lease: removes the lock field (see the module docs for
    /// the short-lease case) and leaves every other field as it is.
    ///
    /// # Errors
    ///
    /// As [`Lease::release`].
    pub async fn release(self) -> Result<ReleaseOutcome> {
        self.lease.release().await
    }

    async fn write(&mut self, update: DocumentUpdate, release: bool) -> Result<Document> {
        check_update(&update, &self.field)?;
        self.lease.write_document(update, release).await
    }
}

impl<T: fmt::Debug> fmt::Debug for DocumentLease<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocumentLease")
            .field("lease", &self.lease)
            .field("document", &self.document)
            .finish()
    }
}

/// Checks a lock field name given to [`LockManager::documents_in_field`].
pub(crate) fn check_field(field: &str) -> Result<()> {
    if field.is_empty()
        || field == "_id"
        || field.starts_with('$')
        || field.contains('.')
        || field.contains('\0')
    {
        return Err(Error::InvalidConfig {
            reason: format!(
                "the lock field must be a top-level field name other than _id, \
                 without '.', '$' prefix or NUL; got {field:?}"
            ),
        });
    }
    Ok(())
}

/// Checks a user collection's name given to [`LockManager::documents`]:
/// what MongoDB accepts as a collection name.
pub(crate) fn check_collection(collection: &str) -> Result<()> {
    if collection.is_empty()
        || collection.contains('$')
        || collection.contains('\0')
        || collection.starts_with("system.")
        || collection.starts_with('.')
        || collection.ends_with('.')
    {
        return Err(Error::InvalidConfig {
            reason: format!(
                "not a collection name MongoDB accepts: {collection:?} (empty, '$', NUL, \
                 a 'system.' prefix, or a leading or trailing '.')"
            ),
        });
    }
    Ok(())
}

/// Checks a document to create: no `_id` (it is the acquired one), no lock field.
fn check_create(create: &Document, field: &str) -> Result<()> {
    for name in ["_id", field] {
        if create.contains_key(name) {
            return Err(Error::InvalidUpdate {
                reason: format!("the document to create must not contain {name:?}"),
            });
        }
    }
    Ok(())
}

/// Checks a user's update: not empty; operators only (or a pipeline); no
/// path that is the lock field or inside it.
pub(crate) fn check_update(update: &DocumentUpdate, field: &str) -> Result<()> {
    let invalid = |reason: String| Err(Error::InvalidUpdate { reason });
    match update {
        DocumentUpdate::Modifiers(update) => {
            if update.is_empty() {
                return invalid("the update is empty".into());
            }
            for (operator, value) in update {
                if !operator.starts_with('$') {
                    return invalid(format!(
                        "{operator:?} is not an update operator: use {{\"$set\": {{...}}}} \
                         (a replacement document is not supported)"
                    ));
                }
                let Bson::Document(paths) = value else {
                    return invalid(format!("the value of {operator} must be a document"));
                };
                // `$rename` names a path in its values too; other
                // operators' values are the user's data.
                let renamed = paths
                    .values()
                    .filter(|_| operator == "$rename")
                    .filter_map(|v| v.as_str());
                for path in paths.keys().map(String::as_str).chain(renamed) {
                    let head = path.split('.').next().unwrap_or(path);
                    if head == field {
                        return invalid(format!(
                            "{operator} writes {path:?}, inside the lease's lock field {field:?}"
                        ));
                    }
                }
            }
            Ok(())
        }
        DocumentUpdate::Pipeline(stages) => {
            if stages.is_empty() {
                return invalid("the update pipeline is empty".into());
            }
            if let Some(name) = stages.iter().find_map(reserved_name_in) {
                return invalid(format!(
                    "the update pipeline names {name:?}: names starting with \
                     {RESERVED_PREFIX:?} are reserved for the lease's own stages"
                ));
            }
            Ok(())
        }
    }
}

/// The prefix of the temporary field that keeps the lock field while the
/// user's update pipeline runs (the store's `write_pipeline`): a user's
/// pipeline that wrote it would decide what the lock field becomes.
pub(crate) const RESERVED_PREFIX: &str = "__mongo_lease_";

/// The first field name or string in `document` (at any depth) that
/// contains [`RESERVED_PREFIX`].
fn reserved_name_in(document: &Document) -> Option<String> {
    fn in_value(value: &Bson) -> Option<String> {
        match value {
            Bson::String(s) if s.contains(RESERVED_PREFIX) => Some(s.clone()),
            Bson::Document(d) => reserved_name_in(d),
            Bson::Array(values) => values.iter().find_map(in_value),
            _ => None,
        }
    }
    document.iter().find_map(|(name, value)| {
        if name.contains(RESERVED_PREFIX) {
            Some(name.clone())
        } else {
            in_value(value)
        }
    })
}

#[cfg(test)]
mod tests {
    use mongodb::bson::doc;

    use super::*;

    #[test]
    fn a_value_that_reads_like_the_lock_field_is_the_users_data() {
        for update in [
            doc! { "$set": { "label": "_lease" } },
            doc! { "$set": { "path": "_lease.lid" } },
            doc! { "$push": { "log": "_lease" } },
            doc! { "$rename": { "old": "new" } },
        ] {
            let update = DocumentUpdate::Modifiers(update);
            assert_eq!(
                check_update(&update, DEFAULT_LEASE_FIELD).ok(),
                Some(()),
                "{update:?}"
            );
        }
        for update in [
            doc! { "$rename": { "state": "_lease" } },
            doc! { "$rename": { "state": "_lease.x" } },
            doc! { "$rename": { "_lease": "state" } },
        ] {
            let update = DocumentUpdate::Modifiers(update);
            assert!(
                matches!(
                    check_update(&update, DEFAULT_LEASE_FIELD),
                    Err(Error::InvalidUpdate { .. })
                ),
                "{update:?}"
            );
        }
    }

    #[test]
    fn a_pipeline_that_names_the_reserved_field_is_refused() {
        for pipeline in [
            vec![doc! { "$set": { "__mongo_lease__lease": "mine" } }],
            vec![doc! { "$unset": ["__mongo_lease__lease"] }],
            vec![
                doc! { "$set": { "n": 1 } },
                doc! { "$replaceWith": { "$mergeObjects": ["$$ROOT", {
                    "a": [{ "b": "$__mongo_lease__lease.tok" }],
                }]}},
            ],
        ] {
            let update = DocumentUpdate::Pipeline(pipeline);
            assert!(
                matches!(
                    check_update(&update, DEFAULT_LEASE_FIELD),
                    Err(Error::InvalidUpdate { reason }) if reason.contains("reserved")
                ),
                "{update:?}"
            );
        }
        let fine =
            DocumentUpdate::Pipeline(vec![doc! { "$set": { "_lease": "x", "m": "__mongo" } }]);
        assert_eq!(check_update(&fine, DEFAULT_LEASE_FIELD).ok(), Some(()));
    }
}
