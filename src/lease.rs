//! [`Lease`]: one held key, with its fencing token and lost-lease signal.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use mongodb::bson::Document;
use uuid::Uuid;

use crate::actor::command::{Changes, GrantedLease, PlacedKey};
use crate::actor::mailbox::Mailbox;
use crate::error::{Error, Operation, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::status::{LeaseStatus, ReleaseOutcome};
use crate::store::{DocumentWrite, LockPlace};

/// Largest accepted payload ([`Lease::set_payload`]), in bytes of BSON: 16 KiB.
pub const MAX_PAYLOAD_LEN: usize = 16 * 1024;

/// A held lease on one key.
///
/// The manager renews it in the background until it is released or dropped.
/// Follow its [`status`](Lease::status) to stop when the lease is lost, and
/// pass its [`fencing_token`](Lease::fencing_token) to every resource you
/// change. Dropping a lease releases it in the background; prefer
/// [`Lease::release`], which waits and reports.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
/// let lease = manager.acquire("invoice-42").await?;
/// tokio::select! {
///     _ = lease.status().lost() => eprintln!("lease lost, stopping"),
///     _ = do_work(lease.fencing_token()) => {}
/// }
/// if lease.release().await?.was_lost() {
///     eprintln!("the lease was lost before the work finished");
/// }
/// # Ok(()) }
/// # async fn do_work(_token: u64) {}
/// ```
pub struct Lease {
    granted: GrantedLease,
    /// Its TTL in nanoseconds: the granted one, then the last one
    /// [`Lease::set_ttl`] had confirmed.
    ttl_nanos: AtomicU64,
    /// Set once [`Lease::release`] has sent its release, so `Drop` does nothing.
    released: bool,
}

impl Lease {
    /// The caller's lease, from the actor's grant.
    pub(crate) fn new(granted: GrantedLease) -> Self {
        Lease {
            ttl_nanos: AtomicU64::new(nanos(granted.ttl)),
            granted,
            released: false,
        }
    }

    /// How this lease holds its key.
    pub fn kind(&self) -> crate::kind::LeaseKind {
        self.granted.kind
    }

    /// The key this lease holds (for an in-document lease, the document's `_id`).
    pub fn key(&self) -> &LeaseKey {
        &self.granted.key.key
    }

    /// Where the lock lives: the lock collection, or the user collection and
    /// lock field of an in-document lease.
    pub(crate) fn lock_place(&self) -> &LockPlace {
        &self.granted.place
    }

    /// The lease id of this acquisition (stored as `lid`).
    pub(crate) fn lease_id(&self) -> Uuid {
        self.granted.lease_id
    }

    /// Writes an in-document lease's document (and releases the lease too if
    /// `release`); the document as written, lock field included.
    pub(crate) async fn write_document(
        &self,
        update: crate::document_update::DocumentUpdate,
        release: bool,
    ) -> Result<Document> {
        self.granted
            .mailbox
            .write_document(
                self.granted.key.clone(),
                self.granted.lease_id,
                DocumentWrite {
                    update,
                    release,
                    too_young_to_delete: false,
                },
            )
            .await
            .map_err(|e| self.refused(Operation::Write, e))
    }

    /// `error` as met by `operation` on this lease's collection: a server's
    /// refusal becomes [`Error::Refused`] (see [`Error::refused_in`]).
    fn refused(&self, operation: Operation, error: Error) -> Error {
        error.refused_in(operation, &self.granted.place.namespace())
    }

    /// Makes the manager check this lease now by a renewal (the transaction
    /// helper found it not held): its token fires if the lease is gone.
    pub(crate) fn check_now(&self) {
        self.granted
            .mailbox
            .check_held(self.granted.key.clone(), self.granted.lease_id);
    }

    /// The lease was released by a write under it (`commit`): `Drop` sends nothing.
    pub(crate) fn mark_released(&mut self) {
        self.released = true;
    }

    /// The lease's TTL ([`Acquire::ttl`](crate::Acquire::ttl), or the
    /// manager's, until [`Lease::set_ttl`] changes it): each renewal sets the
    /// lease to expire this long after the server's now.
    pub fn ttl(&self) -> Duration {
        Duration::from_nanos(self.ttl_nanos.load(Ordering::Acquire))
    }

    /// Changes the lease's TTL to `ttl`: the manager renews the lease at
    /// once, and at every later renewal, to expire `ttl` after the server's
    /// now, and returns once the server confirmed it. A shorter TTL moves
    /// nothing back: it takes effect once the longer expiry has passed. The
    /// rules of [`Acquire::ttl`](crate::Acquire::ttl) apply.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] if `ttl` breaks those rules, or for a lease
    /// acquired with [`hold_at_most`](crate::Acquire::hold_at_most);
    /// [`Error::LeaseLost`]; [`Error::Shutdown`]; a database error if the
    /// renewal could not be confirmed (the heartbeat renews to `ttl` all
    /// the same, and [`Lease::ttl`] keeps the old value).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the first poll still changes the TTL
    /// (the renewal is sent), without telling [`Lease::ttl`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lease: mongo_lease::Lease) -> mongo_lease::Result<()> {
    /// use std::time::Duration;
    /// // The job turned out long: give the lease more room.
    /// lease.set_ttl(Duration::from_secs(120)).await?;
    /// assert_eq!(lease.ttl(), Duration::from_secs(120));
    /// # Ok(()) }
    /// ```
    pub async fn set_ttl(&self, ttl: Duration) -> Result<()> {
        self.granted
            .mailbox
            .set_ttl(self.granted.key.clone(), self.granted.lease_id, ttl)
            .await
            .map_err(|e| self.refused(Operation::SetTtl, e))?;
        self.ttl_nanos.store(nanos(ttl), Ordering::Release);
        Ok(())
    }

    /// The owner id of the manager that holds the lease (stored as `aid`).
    pub fn owner_id(&self) -> &str {
        &self.granted.owner_id
    }

    /// The fencing token of this acquisition: strictly greater than every
    /// token issued before for this key, also after the lock document was
    /// garbage-collected. Pass it with every write protected by the lease
    /// ([`Lease::fence`]).
    pub fn fencing_token(&self) -> u64 {
        self.granted.fencing_token
    }

    /// This lease as a member of a group ([`LeaseGroup`](crate::LeaseGroup)):
    /// its key, its lease id, and its manager's mailbox.
    pub(crate) fn member(&self) -> ((PlacedKey, Uuid), &Mailbox) {
        (
            (self.granted.key.clone(), self.granted.lease_id),
            &self.granted.mailbox,
        )
    }

    /// How the lease stands ([`LeaseStatus`]).
    pub fn status(&self) -> LeaseStatus {
        LeaseStatus::of(self.granted.state.clone())
    }

    /// Stores `payload` in the lease's document (field `data`), replacing the
    /// previous payload, for others to read ([`LeaseInfo::payload`]). The
    /// write is conditional on this acquisition. A new acquisition starts
    /// without payload.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidPayload`] if the payload is larger than
    /// [`MAX_PAYLOAD_LEN`] bytes of BSON, or has a field name that is empty,
    /// contains a dot or starts with `$` (nothing is sent);
    /// [`Error::LeaseLost`] if the lease is no longer held;
    /// [`Error::Shutdown`]; database errors ([`Error::Refused`],
    /// [`Error::Database`], [`Error::Unreachable`]).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not leave the payload written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(lease: mongo_lease::Lease) -> mongo_lease::Result<()> {
    /// use mongodb::bson::doc;
    /// lease.set_payload(doc! { "addr": "10.0.0.7:8080" }).await?;
    /// # Ok(()) }
    /// ```
    pub async fn set_payload(&self, payload: Document) -> Result<()> {
        self.handle()
            .set_payload(payload)
            .await
            .map_err(|e| self.refused(Operation::SetPayload, e))
    }

    /// A cheap, cloneable reference to this acquisition (no release on drop).
    pub(crate) fn handle(&self) -> LeaseHandle {
        LeaseHandle {
            key: self.granted.key.clone(),
            lease_id: self.granted.lease_id,
            mailbox: self.granted.mailbox.clone(),
        }
    }

    /// Re-enters this lease: another `Lease` of the same acquisition (same
    /// key, fencing token, TTL and status), counted as one more entry, with
    /// no round trip. The lease stays held until every entry is released or
    /// dropped (the others answer [`ReleaseOutcome::StillHeld`]). To
    /// re-enter by acquiring again, see docs/reentrancy.md.
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the lease is already lost; [`Error::Unsupported`]
    /// for an in-document lease ([`DocumentLease`](crate::DocumentLease),
    /// whose commit releases the lease whatever its entries).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// let lease = manager.acquire("report").await?;
    /// let entry = lease.reenter()?;
    /// let upload = tokio::spawn(async move {
    ///     // ... work under `entry.fencing_token()` ...
    ///     entry.release().await
    /// });
    /// lease.release().await?; // `StillHeld` while the upload runs
    /// upload.await.expect("upload task")?; // `Released`: the key is free
    /// # Ok(()) }
    /// ```
    pub fn reenter(&self) -> Result<Lease> {
        if self.granted.place.field.is_some() {
            return Err(Error::Unsupported {
                reason: "an in-document lease cannot be re-entered".into(),
            });
        }
        if self.granted.state.is_lost() {
            return Err(Error::LeaseLost {
                key: self.key().clone(),
            });
        }
        self.granted
            .mailbox
            .reenter(self.granted.key.clone(), self.granted.lease_id);
        Ok(Lease::new(self.granted.clone()))
    }

    /// Releases the lease and waits for MongoDB to confirm. The key is free at
    /// once for the next waiter. Only this acquisition (owner id and lease
    /// id) is released, never a successor's.
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`] if the manager has shut down (its leases were
    /// released then); [`Error::Refused`] if the server refuses the release
    /// (e.g. a user without the `readWrite` role); [`Error::Database`] or
    /// [`Error::Unreachable`] if the release could not be confirmed (in
    /// either case the lease then expires after its TTL).
    ///
    /// For a re-entered lease ([`Lease::reenter`]), this releases one entry.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the first poll still releases the lease.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        self.released = true;
        self.granted
            .mailbox
            .release(self.granted.key.clone(), self.granted.lease_id)
            .await
            .map_err(|e| self.refused(Operation::Release, e))
    }
}

impl Drop for Lease {
    /// Releases the lease in the background (the manager logs a failure).
    fn drop(&mut self) {
        if !self.released {
            self.granted
                .mailbox
                .release_in_background(self.granted.key.clone(), self.granted.lease_id);
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.granted.key.key)
            .field("owner_id", &self.granted.owner_id)
            .field("fencing_token", &self.granted.fencing_token)
            .field("ttl", &self.ttl())
            .field("lost", &self.granted.state.is_lost())
            .finish()
    }
}

/// `duration` in nanoseconds (a TTL: far below 584 years).
fn nanos(duration: Duration) -> u64 {
    u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX)
}

/// Refers to one acquisition without owning it: used by the election's
/// `LeaderContext` to set the payload while the `Leadership` owns the lease.
#[derive(Clone)]
pub(crate) struct LeaseHandle {
    key: PlacedKey,
    lease_id: Uuid,
    mailbox: Mailbox,
}

impl LeaseHandle {
    pub(crate) async fn set_payload(&self, payload: Document) -> Result<()> {
        check_payload(&payload)?;
        self.mailbox
            .set_payload(self.key.clone(), self.lease_id, payload)
            .await
    }
}

pub(crate) fn check_payload(payload: &Document) -> Result<()> {
    check_field_names(payload)?;
    let len = mongodb::bson::to_vec(payload)
        .map_err(|e| Error::InvalidPayload {
            reason: e.to_string(),
        })?
        .len();
    if len > MAX_PAYLOAD_LEN {
        return Err(Error::InvalidPayload {
            reason: format!("the payload is {len} bytes of BSON; the limit is {MAX_PAYLOAD_LEN}"),
        });
    }
    Ok(())
}

/// Field names must not be empty, contain dots or start with `$`: observers
/// rebuild the payload from change events, whose paths are dotted.
fn check_field_names(doc: &Document) -> Result<()> {
    fn check_value(value: &mongodb::bson::Bson) -> Result<()> {
        match value {
            mongodb::bson::Bson::Document(d) => check_field_names(d),
            mongodb::bson::Bson::Array(items) => items.iter().try_for_each(check_value),
            _ => Ok(()),
        }
    }
    for (name, value) in doc {
        if name.is_empty() || name.contains('.') || name.starts_with('$') {
            return Err(Error::InvalidPayload {
                reason: format!("field name {name:?} is empty, contains a dot or starts with '$'"),
            });
        }
        check_value(value)?;
    }
    Ok(())
}

/// The changes of one key, from
/// [`LeaseManager::observe`](crate::LeaseManager::observe): a
/// [`Stream`](futures::Stream) of `Result<Option<LeaseInfo>>`, in order
/// (`None`: no lock document; an `Err` ends the stream). Drop it to
/// unsubscribe. Items are queued without bound: keep reading.
#[derive(Debug)]
pub struct LeaseObserver {
    key: LeaseKey,
    changes: Changes,
}

impl LeaseObserver {
    /// The observer of `key`'s changes, as the actor answered `Observe`.
    pub(crate) fn new(key: LeaseKey, changes: Changes) -> Self {
        LeaseObserver { key, changes }
    }

    /// The observed key.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// The next state, or `None` once the stream has ended.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: no item is lost if the future is dropped.
    pub async fn recv(&mut self) -> Option<Result<Option<LeaseInfo>>> {
        self.changes.recv().await
    }
}

impl futures::Stream for LeaseObserver {
    type Item = Result<Option<LeaseInfo>>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.changes.poll_recv(cx)
    }
}
