//! [`DocumentStore`]: the lock protocol inside the user's own documents
//! (in-document leases), on one user collection.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use mongodb::Collection;
use mongodb::bson::Document;
use uuid::Uuid;

use super::MongoStore;
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::lease::LeaseInfo;
use crate::store::{AcquireOutcome, Announcement, DocumentWrite, LeaseRef, LockPlace, Store};

/// In-document leases on one user collection, lock fields under one field.
#[derive(Clone)]
pub(crate) struct DocumentStore {
    /// The lock collection's store: owner id, TTL, yield window, timeout.
    locks: MongoStore,
    coll: Collection<Document>,
    field: Arc<str>,
}

impl DocumentStore {
    /// In-document leases on `collection` (the lock collection's database,
    /// same concerns), with the lock fields under `field`. Sends nothing.
    pub(crate) fn new(locks: &MongoStore, collection: &str, field: &str) -> Result<Self> {
        crate::document::check_collection(collection)?;
        crate::document::check_field(field)?;
        Ok(DocumentStore {
            locks: locks.clone(),
            coll: locks.sibling(collection),
            field: field.into(),
        })
    }
}

fn todo<T: Send + 'static>() -> BoxFuture<'static, Result<T>> {
    Box::pin(async {
        Err(Error::Unsupported {
            reason: "in-document leases: not implemented yet".into(),
        })
    })
}

impl Store for DocumentStore {
    fn acquire_with_ttl(
        &self,
        _key: LeaseKey,
        _lease_id: Uuid,
        _waiting: bool,
        _ttl: Duration,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        todo()
    }

    #[cfg(test)]
    fn default_ttl(&self) -> Duration {
        Duration::from_millis(self.locks.ttl_ms() as u64)
    }

    fn renew_with_ttl(
        &self,
        _leases: Vec<LeaseRef>,
        _ttl: Duration,
    ) -> BoxFuture<'static, Result<Vec<LeaseKey>>> {
        todo()
    }

    fn release(&self, _leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<u64>> {
        todo()
    }

    fn release_owner(&self, _except: Vec<Uuid>) -> BoxFuture<'static, Result<u64>> {
        todo()
    }

    fn release_by_owner(&self, _owner: String) -> BoxFuture<'static, Result<u64>> {
        todo()
    }

    fn delete_released(&self, _keys: Vec<LeaseKey>) -> BoxFuture<'static, Result<u64>> {
        todo()
    }

    fn inspect(&self, _key: LeaseKey) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        todo()
    }

    fn list(
        &self,
        _after: Option<LeaseKey>,
        _limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<LeaseKey>)>> {
        todo()
    }

    fn force_release(&self, _key: LeaseKey) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        todo()
    }

    fn set_payload(
        &self,
        _lease: LeaseRef,
        _payload: Document,
    ) -> BoxFuture<'static, Result<bool>> {
        todo()
    }

    fn observe(&self, _key: LeaseKey) -> BoxStream<'static, Result<Option<LeaseInfo>>> {
        Box::pin(futures::stream::empty())
    }

    fn watch_releases(&self) -> BoxStream<'static, Result<Announcement>> {
        Box::pin(futures::stream::empty())
    }

    fn place(&self) -> LockPlace {
        LockPlace {
            database: self.coll.namespace().db,
            collection: self.coll.name().to_string(),
            field: Some(self.field.to_string()),
        }
    }

    fn removes_on_release(&self) -> bool {
        true
    }

    fn acquire_document(
        &self,
        _key: LeaseKey,
        _lease_id: Uuid,
        _waiting: bool,
        _ttl: Duration,
        _create: Option<Document>,
    ) -> BoxFuture<'static, Result<(AcquireOutcome, Option<Document>)>> {
        todo()
    }

    fn write_document(
        &self,
        _lease: LeaseRef,
        _token: u64,
        _write: DocumentWrite,
    ) -> BoxFuture<'static, Result<Option<Document>>> {
        todo()
    }
}
