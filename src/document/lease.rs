//! [`DocumentLease`]: a held in-document lease and its document.

use std::sync::Arc;

use mongodb::bson::Document;
use serde::de::DeserializeOwned;

use crate::document_update::{DocumentUpdate, check_update};
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::lease::Lease;
use crate::status::ReleaseOutcome;

/// A held in-document lease, with the document as last read or written under
/// it (the lock field removed, and `LockId` and `LockTime` with
/// [`LockIdFields`](crate::LockIdFields)).
///
/// Dropping it releases the lease in the background, as for a [`Lease`]; the
/// document's own fields are then left as they are.
#[derive(Debug)]
pub struct DocumentLease<T = Document> {
    lease: Lease,
    raw: Document,
    document: T,
    /// The fields the lease writes: the lock field first, then `LockId`
    /// and `LockTime` if kept.
    fields: Arc<[String]>,
}

impl<T: DeserializeOwned> DocumentLease<T> {
    /// `raw` is the document as MongoDB returned it, lock fields included
    /// (`fields`, removed here). On a document that cannot be read as `T`,
    /// the lease is given back with the error.
    pub(super) fn new(
        lease: Lease,
        mut raw: Document,
        fields: Arc<[String]>,
    ) -> Result<Self, Box<(Lease, Error)>> {
        remove_fields(&mut raw, &fields);
        match decode(raw.clone()) {
            Ok(document) => Ok(DocumentLease {
                lease,
                raw,
                document,
                fields,
            }),
            Err(error) => Err(Box::new((lease, error))),
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

    /// The document's `_id`: the lease's key.
    pub fn key(&self) -> &LeaseKey {
        self.lease.key()
    }

    /// The lease: fencing token, TTL, owner id.
    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// How the lease stands (see [`LeaseStatus`](crate::LeaseStatus)).
    pub fn status(&self) -> crate::status::LeaseStatus {
        self.lease.status()
    }

    /// The lease and the document, apart: the lease stays held until
    /// released or dropped, as any [`Lease`], but [`DocumentLease::update`]
    /// and [`DocumentLease::commit`] are no longer available.
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
    /// [`Error::LeaseLost`] if the lease was lost: nothing was written.
    /// [`Error::InvalidUpdate`] for an update [`DocumentUpdate`] refuses
    /// (nothing sent). [`Error::Refused`] for an update MongoDB refuses
    /// (nothing written); [`Error::Database`] for a result that cannot be
    /// read as `T` (the write happened). [`Error::Shutdown`]. An error for
    /// which [`Error::is_transient`] is true leaves the outcome unknown.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future after the command was sent does
    /// not undo the write, which may or may not happen.
    pub async fn update(&mut self, update: impl Into<DocumentUpdate>) -> Result<&T> {
        let mut raw = self.write(update.into(), false).await?;
        remove_fields(&mut raw, &self.fields);
        self.document = decode(raw.clone())?;
        self.raw = raw;
        Ok(&self.document)
    }

    /// Writes `update` to the document and releases the lease, in one atomic
    /// write conditional on the lease (by the server's clock, under its lease
    /// id): either both happen or neither. Returns the document as written.
    ///
    /// # Errors
    ///
    /// As [`DocumentLease::update`]. After any error the lease is released
    /// all the same (this `DocumentLease` is consumed): acquire the
    /// document again to retry.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, as [`DocumentLease::update`]; if the future is
    /// dropped the lease is released anyway (or expires).
    pub async fn commit(mut self, update: impl Into<DocumentUpdate>) -> Result<T> {
        let mut raw = self.write(update.into(), true).await?;
        self.lease.mark_released();
        remove_fields(&mut raw, &self.fields);
        decode(raw)
    }

    /// Releases the lease: removes the lock field (docs/in-document.md) and
    /// leaves every other field as it is.
    ///
    /// # Errors
    ///
    /// As [`Lease::release`].
    pub async fn release(self) -> Result<ReleaseOutcome> {
        self.lease.release().await
    }

    async fn write(&mut self, update: DocumentUpdate, release: bool) -> Result<Document> {
        for field in self.fields.iter() {
            check_update(&update, field)?;
        }
        self.lease.write_document(update, release).await
    }
}

/// `raw` read as `T`; a document that is not one is a database error.
fn decode<T: DeserializeOwned>(raw: Document) -> Result<T> {
    mongodb::bson::from_document(raw).map_err(|e| Error::Database(e.into()))
}

/// `raw` without the lease's `fields`.
fn remove_fields(raw: &mut Document, fields: &[String]) {
    for field in fields {
        raw.remove(field);
    }
}
