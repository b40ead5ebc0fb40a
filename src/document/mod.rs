//! In-document leases: the lock lives inside the user's own document, under
//! one field, and the release can write the document's new state in the same
//! atomic write ([`DocumentLease::commit`]).

mod lease;

pub use lease::DocumentLease;

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::Document;
use serde::de::DeserializeOwned;
use typed_builder::TypedBuilder;

use crate::actor::command::{AcquireMode, Target};
use crate::config::AcquireOptions;
use crate::document_update::check_create;
use crate::error::{Error, Operation, Result};
use crate::key::LeaseKey;
use crate::lease::Lease;
use crate::lock_id_fields::LockIdFields;
use crate::manager::LeaseManager;

/// Default field of the user's document that holds an in-document lease's
/// lock fields: `_lease`.
pub const DEFAULT_LEASE_FIELD: &str = "_lease";

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
    /// [`ttl`](crate::LeaseManagerOptions::ttl).
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
/// [`LeaseManager::documents`]: acquire a document's lease by its `_id`, and
/// get the document with it.
///
/// The same manager drives them as the lock collection's leases: the same
/// actor, FIFO local waiters, jittered retries, change-stream wake-up,
/// batched renewal in the heartbeat (one `updateMany` per collection and
/// TTL), the same fencing-token rule and lost-lease token. `T` is the type
/// the document is read as (`bson::Document` by default); the lock field is
/// removed before it is deserialised.
///
/// [`LeaseManager::documents`] gives a [`DocumentLeases`] handle on one user
/// collection; its acquires return a [`DocumentLease`]: the lease (the same
/// [`Lease`](crate::Lease) as for keys of the lock collection: fencing token, lost-lease
/// token, renewal in the manager's batched heartbeat) together with the
/// document as the acquire read it, in the same round trip.
///
/// # Document schema
///
/// The lock fields live under one field of the user's document (default
/// [`DEFAULT_LEASE_FIELD`], `_lease`), with the lock collection's names and
/// rules: `aid` (owner id), `lid` (lease id), `tok` (fencing token), `acq`,
/// `ts` and `exp` (server times of the acquisition, the last renewal, and
/// the expiry), `wt`/`yu` (fairness between owners). Acquire, renewal and
/// release write only that field; every other field of the document is the
/// user's, and only [`DocumentLease::update`] and [`DocumentLease::commit`]
/// write them, with the user's update.
///
/// A released document carries no lock field, except after a lease shorter
/// than [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) (by the
/// server's clock) or one another owner waited for: the field is then left
/// in the released state (no lease id `lid`, `exp` at the release time, the
/// fencing token `tok` kept, so that the next acquisition's token is
/// greater, see the "Fencing tokens" rule of the lock collection; `yu` if
/// another owner waited), which the next acquire takes over at once. The
/// manager removes a released field nobody took once its token is
/// `DELETE_MIN_TOKEN_AGE` old by the server's clock; shutdown waits for that
/// removal. A field left yielded (another owner waited, and did not take it)
/// stays.
///
/// # Examples
///
/// ```no_run
/// use mongodb::bson::doc;
/// use mongo_lease::{DocumentAcquireOptions, LeaseManager};
///
/// # async fn demo(manager: LeaseManager) -> mongo_lease::Result<()> {
/// let items = manager.documents::<mongodb::bson::Document>("workitem").await?;
/// let options = DocumentAcquireOptions::builder().create(doc! { "runs": 0 }).build();
/// let item = items.acquire_with("item-17", options).await?;
/// println!("runs so far: {}", item.document().get_i32("runs").unwrap_or(0));
/// // Write the new state and release, in one atomic write:
/// item.commit(doc! { "$inc": { "runs": 1 } }).await?;
/// # Ok(()) }
/// ```
pub struct DocumentLeases<T = Document> {
    manager: LeaseManager,
    place: crate::actor::command::Place,
    collection: Arc<str>,
    field: Arc<str>,
    /// The top-level `LockId` / `LockTime` fields kept true, if opened with
    /// them.
    lock_id: Option<Arc<LockIdFields>>,
    _document: PhantomData<fn() -> T>,
}

impl<T> Clone for DocumentLeases<T> {
    fn clone(&self) -> Self {
        DocumentLeases {
            manager: self.manager.clone(),
            place: self.place,
            collection: self.collection.clone(),
            field: self.field.clone(),
            lock_id: self.lock_id.clone(),
            _document: PhantomData,
        }
    }
}

impl<T> fmt::Debug for DocumentLeases<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DocumentLeases")
            .field("collection", &self.collection)
            .field("field", &self.field)
            .field("lock_id", &self.lock_id)
            .finish_non_exhaustive()
    }
}

impl LeaseManager {
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

    /// [`LeaseManager::documents`] with the lock fields under `field`, a
    /// top-level field name of the user's choice.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::documents`], and [`Error::InvalidConfig`] for a
    /// field name that is empty, `_id`, starts with `$` or contains `.` or
    /// NUL.
    pub async fn documents_in_field<T>(
        &self,
        collection: &str,
        field: &str,
    ) -> Result<DocumentLeases<T>> {
        let place = self.open_documents(collection, field, None).await?;
        Ok(DocumentLeases {
            manager: self.clone(),
            place,
            collection: collection.into(),
            field: field.into(),
            lock_id: None,
            _document: PhantomData,
        })
    }

    /// [`LeaseManager::documents`] on documents that other applications'
    /// clients lock by top-level `LockId` and `LockTime` fields
    /// ([`LockIdFields`]): each lease also stores its lease id as `LockId`
    /// and its last renewal's server time as `LockTime`, a document they
    /// lock is held until `LockTime + max_duration`, and a release writes
    /// `LockId: null, LockTime: null`. The other lock fields stay under
    /// [`DEFAULT_LEASE_FIELD`]. Every manager using these documents must
    /// open them the same way.
    ///
    /// Nothing is sent to MongoDB and no index is created.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::documents`], and [`Error::InvalidConfig`] for
    /// field names that are not top-level names other than `_id` or are
    /// equal, a `max_duration` under 1 ms or over a year, or a collection
    /// this manager already opened with [`DEFAULT_LEASE_FIELD`] and other
    /// fields.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use mongodb::bson::doc;
    /// use mongo_lease::{LeaseManager, LockIdFields};
    ///
    /// # async fn demo(manager: LeaseManager) -> mongo_lease::Result<()> {
    /// // Their clients take a lock over 60 s after its LockTime; our TTL is 20 s.
    /// let fields = LockIdFields::builder().max_duration(Duration::from_secs(60)).build();
    /// let items = manager.documents_with_lock_id::<mongodb::bson::Document>("workitem", fields).await?;
    /// let item = items.acquire("item-17").await?;
    /// // The new state with LockId: null and LockTime: null, in one write.
    /// item.commit(doc! { "$set": { "state": "done" } }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn documents_with_lock_id<T>(
        &self,
        collection: &str,
        fields: LockIdFields,
    ) -> Result<DocumentLeases<T>> {
        fields.check(DEFAULT_LEASE_FIELD)?;
        let fields = Arc::new(fields);
        let place = self
            .open_documents(collection, DEFAULT_LEASE_FIELD, Some(fields.clone()))
            .await?;
        Ok(DocumentLeases {
            manager: self.clone(),
            place,
            collection: collection.into(),
            field: DEFAULT_LEASE_FIELD.into(),
            lock_id: Some(fields),
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

    /// The top-level `LockId` / `LockTime` fields these leases keep true
    /// ([`LeaseManager::documents_with_lock_id`]), if any.
    pub fn lock_id_fields(&self) -> Option<&LockIdFields> {
        self.lock_id.as_deref()
    }

    /// Reads the lease of the document with `_id` `id`, with the server's
    /// clock, as [`LeaseManager::inspect`] reads a key: who holds it (or last
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
    /// [`Error::Shutdown`], [`Error::Refused`] if the server refuses the
    /// read, and other database errors ([`Error::Database`],
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
    pub async fn inspect(&self, id: impl Into<LeaseKey>) -> Result<Option<crate::info::LeaseInfo>> {
        self.manager
            .inspect_target(Target {
                place: self.place,
                key: id.into(),
            })
            .await
            .map_err(|e| e.refused_in(Operation::Inspect, &self.namespace()))
    }

    /// The top-level lock fields (`LockId`, `LockTime`), if any.
    fn top_fields(&self) -> impl Iterator<Item = &str> {
        self.lock_id
            .iter()
            .flat_map(|f| [f.lock_id.as_str(), f.lock_time.as_str()])
    }

    /// Every field the lease writes: the lock field, and `LockId` and
    /// `LockTime` if kept.
    fn lock_fields(&self) -> Arc<[String]> {
        std::iter::once(self.field.to_string())
            .chain(self.top_fields().map(str::to_string))
            .collect()
    }

    /// `database.collection` of these documents, as errors name it.
    fn namespace(&self) -> String {
        format!("{}.{}", self.manager.database_name(), self.collection)
    }

    /// Acquires the lease of the document with `_id` `id`, waiting as long
    /// as it takes, as [`LeaseManager::acquire`] does for a key; returns it
    /// with the document as the acquiring write left it.
    ///
    /// # Errors
    ///
    /// [`Error::DocumentNotFound`] if no document has this `_id` (see
    /// [`DocumentLeases::acquire_with`] to create it), [`Error::InvalidKey`]
    /// for an `_id` MongoDB refuses, [`Error::Database`] if the document
    /// cannot be read as `T` (the lease is then released),
    /// [`Error::Refused`] if the server refuses the acquire (e.g. a user
    /// without the `readWrite` role), [`Error::Shutdown`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire`]. To wait at most a given
    /// time:
    ///
    /// ```no_run
    /// # async fn demo(items: mongo_lease::DocumentLeases) -> mongo_lease::Result<()> {
    /// use std::time::Duration;
    ///
    /// if let Ok(item) = tokio::time::timeout(Duration::from_secs(5), items.acquire("item-17")).await {
    ///     item?.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
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
    /// Cancel safe, as [`LeaseManager::acquire`].
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

    /// One attempt, as [`LeaseManager::try_acquire`]: `Ok(None)` if the
    /// document's lease is held (by another owner, a local caller, or
    /// local waiters queue for it).
    ///
    /// # Errors
    ///
    /// As [`DocumentLeases::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire`].
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
    /// Cancel safe, as [`LeaseManager::acquire`].
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
            for name in self.top_fields() {
                check_create(create, name)?;
            }
        }
        if let Some(fields) = &self.lock_id {
            fields.check_ttl(options.ttl.unwrap_or(self.manager.ttl()))?;
        }
        let acquire = AcquireOptions {
            ttl: options.ttl,
            ..AcquireOptions::default()
        };
        let target = Target {
            place: self.place,
            key: id,
        };
        let Some(granted) = self
            .manager
            .request_target(target, mode, &acquire, options.create)
            .await
            .map_err(|e| e.refused_in(Operation::Acquire, &self.namespace()))?
        else {
            return Ok(None);
        };
        let (lease, document) = granted.take();
        let raw = document.unwrap_or_default();
        let lease = DocumentLease::new(Lease::new(lease), raw, self.lock_fields());
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
