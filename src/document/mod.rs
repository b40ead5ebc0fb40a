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

use crate::actor::command::{AcquireMode, PlacedKey};
use crate::config::AcquireOptions;
use crate::document_update::check_create;
use crate::error::{Operation, Result};
use crate::key::LeaseKey;
use crate::lease::Lease;
use crate::lock_id_fields::LockIdFields;
use crate::manager::LeaseManager;

/// Default field of the user's document that holds an in-document lease's
/// lock fields: `_lease`.
pub const DEFAULT_LEASE_FIELD: &str = "_lease";

/// In-document leases on one user collection, from
/// [`LeaseManager::documents`]: acquire a document's lease by its `_id`, and
/// get the document (read as `T`) with it, in one round trip.
///
/// The lock fields live under one field of the user's document (default
/// [`DEFAULT_LEASE_FIELD`]), the only field acquire, renewal and release
/// write; docs/in-document.md has the schema, and what a release leaves.
///
/// # Examples
///
/// ```no_run
/// use mongodb::bson::doc;
/// use mongo_lease::LeaseManager;
///
/// # async fn demo(manager: LeaseManager) -> mongo_lease::Result<()> {
/// let items = manager.documents::<mongodb::bson::Document>("workitem").await?;
/// let item = items.acquire("item-17").create(doc! { "runs": 0 }).await?;
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

impl<T> DocumentLeases<T> {
    /// Opens in-document leases on `collection` with the lock fields under
    /// `field` (and `LockId` / `LockTime` at the top with `lock_id`).
    pub(crate) async fn open(
        manager: &LeaseManager,
        collection: &str,
        field: &str,
        lock_id: Option<Arc<LockIdFields>>,
    ) -> Result<DocumentLeases<T>> {
        if let Some(fields) = &lock_id {
            fields.check(field)?;
        }
        let place = manager
            .open_documents(collection, field, lock_id.clone())
            .await?;
        Ok(DocumentLeases {
            manager: manager.clone(),
            place,
            collection: collection.into(),
            field: field.into(),
            lock_id,
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
    /// ([`OpenDocuments::lock_id`](crate::OpenDocuments::lock_id)), if any.
    pub fn lock_id_fields(&self) -> Option<&LockIdFields> {
        self.lock_id.as_deref()
    }

    /// Reads the lease of the document with `_id` `id`, as
    /// [`LeaseManager::inspect`] reads a key; `Ok(None)` if there is no such
    /// document or it carries no lock field. One round trip.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::inspect`].
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
            .inspect_target(PlacedKey {
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

    /// Acquires the document `id` ([`AcquireDocument`]).
    pub(crate) async fn acquire_document(
        &self,
        id: LeaseKey,
        mode: AcquireMode,
        ttl: Option<Duration>,
        create: Option<Document>,
    ) -> Result<Option<DocumentLease<T>>> {
        if let Some(create) = &create {
            check_create(create, &self.field)?;
            for name in self.top_fields() {
                check_create(create, name)?;
            }
        }
        if let Some(fields) = &self.lock_id {
            fields.check_ttl(ttl.unwrap_or(self.manager.ttl()))?;
        }
        let acquire = AcquireOptions {
            ttl,
            ..AcquireOptions::default()
        };
        let target = PlacedKey {
            place: self.place,
            key: id,
        };
        let Some(granted) = self
            .manager
            .request_target(target, mode, &acquire, create)
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
