//! Requests in the mongodb driver's style: each verb returns a request whose
//! chained methods set its options, and the request is awaited directly
//! (it is [`IntoFuture`]), as the driver's `collection.find_one(filter).sort(..).await`.
//! Each option is documented once, here, on its request type.
//!
//! - [`Acquire`]: one key or several ([`LeaseManager::acquire`],
//!   [`LeaseManager::try_acquire`], [`LeaseManager::acquire_all`],
//!   [`LeaseManager::try_acquire_all`]) and a semaphore's permits
//!   ([`Semaphore::acquire`](crate::Semaphore::acquire)).
//! - [`AcquireDocument`]: an in-document lease
//!   ([`DocumentLeases::acquire`](crate::DocumentLeases::acquire)).
//! - [`OpenDocuments`]: a collection of in-document leases
//!   ([`LeaseManager::documents`]).
//! - [`List`]: the leases of the lock collection ([`LeaseManager::list`]).
//!
//! A request checks its options when it is awaited, before anything is
//! sent: an invalid one is [`Error::InvalidConfig`].

use std::future::IntoFuture;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use mongodb::bson::Document;
use serde::de::DeserializeOwned;

use crate::actor::command::AcquireMode;
use crate::caller::CallerId;
use crate::config::AcquireOptions;
use crate::document::{DocumentLease, DocumentLeases};
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::lease::Lease;
use crate::lease_group::LeaseGroup;
use crate::lock_id_fields::LockIdFields;
use crate::manager::LeaseManager;

impl LeaseManager {
    /// Acquires `key`, waiting as long as it takes: a request ([`Acquire`])
    /// whose options (TTL, shared, payload, holder, minimum and maximum
    /// hold) are chained before it is awaited.
    ///
    /// `key` is a string (`"job-1"`) or any [`LeaseKey`]: the `_id` of the
    /// lock document, e.g. the `ObjectId` of the document being locked, so
    /// that every application locking that `_id` excludes this one.
    ///
    /// Local callers waiting for one key are served first in, first out; one
    /// retry loop per key talks to MongoDB, with jittered exponential backoff
    /// capped by the holder's remaining lease time. A key released by this
    /// manager goes to the next local waiter at once, unless another manager
    /// waited for that lease: then the release yields the key to it, and local
    /// waiters get it back after its next release, or after
    /// [`retry_max`](crate::LeaseManagerOptions::retry_max) if nobody else took
    /// it. Transient database errors are retried (and logged) while waiting.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for a key MongoDB refuses as `_id` (see
    /// [`LeaseKey`]), an empty key or one longer than
    /// [`MAX_KEY_LEN`](crate::MAX_KEY_LEN) bytes; [`Error::InvalidConfig`]
    /// for options the request's rules refuse (before anything is sent);
    /// [`Error::KindMismatch`] for a key held as another kind;
    /// [`Error::Shutdown`] once the manager has shut down. Another
    /// application's lock document is no error: `acquire` waits until it is
    /// deleted or expires by its rule, polling at least every
    /// [`retry_max`](crate::LeaseManagerOptions::retry_max).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future removes the waiter from the queue,
    /// and a lease granted at that moment is released, never leaked. So
    /// [`tokio::time::timeout`] over it waits at most a given time:
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// use std::time::Duration;
    ///
    /// match tokio::time::timeout(Duration::from_secs(5), manager.acquire("job-1")).await {
    ///     Ok(lease) => {
    ///         let lease = lease?; // acquired within 5 s
    ///         lease.release().await?;
    ///     }
    ///     // Dropped: neither a waiter nor a lease is left behind.
    ///     Err(_elapsed) => eprintln!("job-1 still held after 5 s"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn acquire(&self, key: impl Into<LeaseKey>) -> Acquire<'_> {
        Acquire::new(self, key.into(), LeaseKind::Exclusive)
    }

    /// One attempt to acquire `key`, with the options of [`Acquire`]:
    /// `Ok(None)` if it is held, by another owner or by a local caller, or
    /// if local callers are already waiting for it (a try never jumps the
    /// queue). Costs one MongoDB round trip when the key is not held locally.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::acquire`]; [`Error::Refused`] when the server
    /// refuses the command (for example a user without the `readWrite`
    /// role), and database errors ([`Error::Database`],
    /// [`Error::Unreachable`]) when the attempt's outcome could not be
    /// established. A key held by a foreign holder is `Ok(None)`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// match manager.try_acquire("nightly-report").await? {
    ///     Some(lease) => lease.release().await.map(drop)?,
    ///     None => println!("another worker runs the report"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn try_acquire(&self, key: impl Into<LeaseKey>) -> Acquire<'_, LeaseKey, NoWait> {
        Acquire::new(self, key.into(), LeaseKind::Exclusive)
    }

    /// Acquires every key of `keys`, waiting as long as it takes, and holds
    /// them together: all of them, or none ([`LeaseGroup`](crate::LeaseGroup)). The options of
    /// the request ([`Acquire`]) apply to every lease of the group.
    ///
    /// The keys are taken one at a time in [`LeaseKey`]'s order (MongoDB's
    /// order), whatever the order given, each as [`LeaseManager::acquire`]
    /// takes one (FIFO among local waiters, fair between managers). So
    /// callers over overlapping keys, in this process or any other, never
    /// deadlock: none holds a key another waits for while it waits for one
    /// that other holds. Keys already taken stay held, and renewed, while
    /// the next one is awaited. If a lease already taken is lost meanwhile,
    /// all are given back and the acquisition starts over.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for a key refused as by [`LeaseManager::acquire`],
    /// no key, or a key given twice; [`Error::InvalidConfig`] for options
    /// refused as by [`LeaseManager::acquire`] or with
    /// [`reentrant`](Acquire::reentrant) (all before anything is sent);
    /// [`Error::AlreadyHeld`] if the request's holder already holds one of
    /// the keys; otherwise as [`LeaseManager::acquire`]. On an error the
    /// keys already taken are released.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the keys already taken
    /// (in the background) and removes the waiter, so [`tokio::time::timeout`]
    /// bounds the whole acquisition.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// use std::time::Duration;
    /// let all = manager.acquire_all(["b", "a", "c"]);
    /// match tokio::time::timeout(Duration::from_secs(5), all).await {
    ///     Ok(group) => group?.release().await.map(drop)?,
    ///     Err(_) => eprintln!("not all three within 5 s; none is held"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn acquire_all<K: Into<LeaseKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Acquire<'_, Vec<LeaseKey>> {
        let keys = keys.into_iter().map(Into::into).collect();
        Acquire::new(self, keys, LeaseKind::Exclusive)
    }

    /// One attempt to acquire every key of `keys`, in [`LeaseKey`]'s order:
    /// `Ok(None)` as soon as one of them is held (as
    /// [`LeaseManager::try_acquire`] answers), after releasing the keys
    /// taken before it. Costs one round trip per key taken, plus the
    /// releases.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::acquire_all`] and [`LeaseManager::try_acquire`];
    /// the keys taken are released first.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire_all`].
    pub fn try_acquire_all<K: Into<LeaseKey>>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Acquire<'_, Vec<LeaseKey>, NoWait> {
        let keys = keys.into_iter().map(Into::into).collect();
        Acquire::new(self, keys, LeaseKind::Exclusive)
    }
}

/// An acquisition that waits as long as it takes: [`LeaseManager::acquire`].
#[derive(Debug)]
pub struct Wait;

/// An acquisition that makes one attempt and answers `None` if the key is
/// held: [`LeaseManager::try_acquire`].
#[derive(Debug)]
pub struct NoWait;

/// An acquisition of one key (`K` = [`LeaseKey`]) or of several held together
/// (`K` = `Vec<LeaseKey>`), waiting ([`Wait`]) or not ([`NoWait`]), from
/// [`LeaseManager::acquire`], [`LeaseManager::try_acquire`],
/// [`LeaseManager::acquire_all`], [`LeaseManager::try_acquire_all`] or
/// [`Semaphore::acquire`](crate::Semaphore::acquire). Awaiting it gives:
///
/// | request | output |
/// |---|---|
/// | `acquire(key)` | `Result<Lease>` |
/// | `try_acquire(key)` | `Result<Option<Lease>>` |
/// | `acquire_all(keys)` | `Result<LeaseGroup>` |
/// | `try_acquire_all(keys)` | `Result<Option<LeaseGroup>>` |
///
/// Each option applies to every lease of the request. Options are checked
/// when the request is awaited, before anything is sent: a combination
/// the rules below refuse is [`Error::InvalidConfig`].
///
/// # Cancel safety
///
/// Cancel safe: dropping the future removes the waiter from the key's
/// queue, and a lease granted at that moment is released, never leaked
/// (a group releases the keys it had taken, in the background). So
/// [`tokio::time::timeout`] over it waits at most a given time.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
/// use std::time::Duration;
/// use mongodb::bson::doc;
///
/// let report = manager
///     .acquire("report-2024")
///     .ttl(Duration::from_secs(120))
///     .payload(doc! { "host": "worker-3" })
///     .await?;
/// report.release().await?;
///
/// if let Some(read) = manager.try_acquire("catalogue").shared().await? {
///     read.release().await?;
/// }
/// # Ok(()) }
/// ```
#[must_use = "a request does nothing until it is awaited"]
pub struct Acquire<'a, K = LeaseKey, W = Wait> {
    manager: &'a LeaseManager,
    keys: K,
    options: AcquireOptions,
    /// An option that cannot apply to this request, refused when awaited.
    refused: Option<&'static str>,
    wait: PhantomData<W>,
}

impl<'a, K, W> Acquire<'a, K, W> {
    pub(crate) fn new(manager: &'a LeaseManager, keys: K, kind: LeaseKind) -> Self {
        Acquire {
            manager,
            keys,
            options: AcquireOptions {
                kind,
                ..AcquireOptions::default()
            },
            refused: None,
            wait: PhantomData,
        }
    }

    /// The lease's time-to-live, stored with it (`exp = $$NOW + ttl` at the
    /// acquisition and at each renewal). Default: the manager's
    /// [`ttl`](crate::LeaseManagerOptions::ttl).
    ///
    /// The manager's rule applies with its own heartbeat interval, safety
    /// margin and clock skew (not scaled with the lease's TTL):
    /// `heartbeat_interval < ttl − safety_margin − clock_skew`. At least 10 ms.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.options.ttl = Some(ttl);
        self
    }

    /// Holds the key shared ([`LeaseKind::Shared`]: the rules between kinds,
    /// writer preference included, are there): the shared (read) side of a
    /// read/write key, whose exclusive (write) side is the default. A key
    /// held as a semaphore's permits is [`Error::KindMismatch`] (nothing
    /// written). Needs [`ReleaseMode::Keep`](crate::ReleaseMode::Keep); not for a
    /// semaphore's permits.
    pub fn shared(mut self) -> Self {
        match self.options.kind {
            LeaseKind::Exclusive | LeaseKind::Shared => self.options.kind = LeaseKind::Shared,
            LeaseKind::Permit { .. } => self.refused = Some("a semaphore's permit is not shared"),
        }
        self
    }

    /// How many of a semaphore's permits the lease takes at once, all or
    /// none, in one conditional write (Redisson's
    /// `RSemaphore::acquire(permits)`): 1 to the semaphore's number of
    /// permits. Default: 1. One [`Lease`] holds them, with one fencing
    /// token, renewed, lost and released as one; it never holds some while
    /// waiting for the others, so two such callers never deadlock.
    ///
    /// A waiter for several permits blocks its manager's later waiters;
    /// across managers it may wait while single permits keep being taken.
    ///
    /// For [`Semaphore::acquire`](crate::Semaphore::acquire) only.
    pub fn permits(mut self, count: u32) -> Self {
        self.options.permits_taken = Some(count);
        self
    }

    /// Keep the key held until the acquisition time plus `at_least`, by the
    /// server's clock, even if the lease is released (or its holder dies)
    /// earlier: a job guarded by such a lease runs at most once per
    /// `at_least` across processes, however fast it ends and however far
    /// apart the processes' clocks and schedules are (ShedLock's
    /// `lockAtLeastFor`). The lease itself is renewed and lost as any other;
    /// only the key stays unavailable after its release. Exclusive leases
    /// only; at least 1 ms, and not longer than the TTL index another
    /// application keeps on `ts` (which would delete the document earlier).
    /// Needs [`ReleaseMode::Keep`](crate::ReleaseMode::Keep).
    pub fn hold_at_least(mut self, at_least: Duration) -> Self {
        self.options.hold_at_least = Some(at_least);
        self
    }

    /// A lease that is **not** renewed: it ends at its acquisition plus
    /// `at_most`, by the server's clock, even if its holder never releases
    /// it (ShedLock's `lockAtMostFor`). Its status reads lost
    /// ([`LossReason::Expired`](crate::LossReason::Expired)) at its local
    /// deadline, the acquiring write's send + `at_most` − the safety margin
    /// − the clock skew, when the manager releases it.
    ///
    /// It takes the place of [`ttl`](Self::ttl) (give one or the other);
    /// longer than the manager's safety margin plus its clock skew, at least
    /// 10 ms, and not shorter than [`hold_at_least`](Self::hold_at_least).
    /// Such a lease is checked by no renewal: a force release of it is
    /// noticed at its deadline, and [`Lease::set_ttl`] refuses it.
    pub fn hold_at_most(mut self, at_most: Duration) -> Self {
        self.options.hold_at_most = Some(at_most);
        self
    }

    /// A payload written by the acquiring write itself (field `data`, as
    /// [`Lease::set_payload`] writes it), so that nobody reading the key
    /// ([`LeaseManager::inspect`], [`LeaseManager::observe`],
    /// [`LeaseManager::list`]) ever sees this acquisition without it. The
    /// limits of [`Lease::set_payload`] apply ([`Error::InvalidPayload`]).
    /// Exclusive leases only.
    pub fn payload(mut self, payload: Document) -> Self {
        self.options.payload = Some(payload);
        self
    }

    /// Who acquires: an explicit caller ([`CallerId`]). While that caller
    /// holds the key, a second acquisition of it by the same caller never
    /// waits on itself: it re-enters the lease if
    /// [`reentrant`](Self::reentrant), and otherwise fails at once with
    /// [`Error::AlreadyHeld`] (a try too). Default: every acquisition is
    /// a caller of its own, and a second one waits in the key's queue like
    /// any other caller.
    pub fn caller(mut self, caller: CallerId) -> Self {
        self.options.caller = Some(caller);
        self
    }

    /// Re-enter a lease the [`caller`](Self::caller) already holds on the
    /// key, of the same kind: the acquisition returns at once, with no round
    /// trip, a [`Lease`] of the same acquisition (same fencing token, TTL and
    /// status), counted: the key is released when the last of its entries
    /// is released or dropped. This acquisition's `ttl` and `hold_at_least`
    /// are not applied (the lease keeps its own). Needs a caller id; one key
    /// at a time (not for `acquire_all`).
    pub fn reentrant(mut self) -> Self {
        self.options.reentrant = true;
        self
    }

    /// The manager, the keys and the options, or the refusal of an option.
    fn checked(self) -> Result<(&'a LeaseManager, K, AcquireOptions)> {
        match self.refused {
            Some(reason) => Err(Error::InvalidConfig {
                reason: reason.into(),
            }),
            None => Ok((self.manager, self.keys, self.options)),
        }
    }
}

impl<K, W> std::fmt::Debug for Acquire<'_, K, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Acquire")
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl<'a> IntoFuture for Acquire<'a, LeaseKey, Wait> {
    type Output = Result<Lease>;
    type IntoFuture = BoxFuture<'a, Result<Lease>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (manager, key, options) = self.checked()?;
            let lease = manager.acquire_key(key, AcquireMode::Wait, &options);
            lease.await?.ok_or(Error::Shutdown)
        })
    }
}

impl<'a> IntoFuture for Acquire<'a, LeaseKey, NoWait> {
    type Output = Result<Option<Lease>>;
    type IntoFuture = BoxFuture<'a, Result<Option<Lease>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (manager, key, options) = self.checked()?;
            manager.acquire_key(key, AcquireMode::Try, &options).await
        })
    }
}

impl<'a> IntoFuture for Acquire<'a, Vec<LeaseKey>, Wait> {
    type Output = Result<LeaseGroup>;
    type IntoFuture = BoxFuture<'a, Result<LeaseGroup>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (manager, keys, options) = self.checked()?;
            crate::lease_group::acquire_all(manager, keys, &options).await
        })
    }
}

impl<'a> IntoFuture for Acquire<'a, Vec<LeaseKey>, NoWait> {
    type Output = Result<Option<LeaseGroup>>;
    type IntoFuture = BoxFuture<'a, Result<Option<LeaseGroup>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (manager, keys, options) = self.checked()?;
            crate::lease_group::try_acquire_all(manager, keys, &options).await
        })
    }
}

impl<T> DocumentLeases<T> {
    /// Acquires the lease of the document with `_id` `id`, waiting as long
    /// as it takes, as [`LeaseManager::acquire`] does for a key; returns it
    /// with the document as the acquiring write left it.
    ///
    /// # Errors
    ///
    /// [`Error::DocumentNotFound`] if no document has this `_id` (see
    /// [`AcquireDocument::create`] to create it), [`Error::InvalidKey`]
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
    pub fn acquire(&self, id: impl Into<LeaseKey>) -> AcquireDocument<'_, T> {
        AcquireDocument::new(self, id.into())
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
    pub fn try_acquire(&self, id: impl Into<LeaseKey>) -> AcquireDocument<'_, T, NoWait> {
        AcquireDocument::new(self, id.into())
    }
}

/// An acquisition of an in-document lease, waiting ([`Wait`]) or not
/// ([`NoWait`]), from [`DocumentLeases::acquire`] or
/// [`DocumentLeases::try_acquire`]. Awaiting it gives `Result<DocumentLease<T>>`
/// (`Result<Option<DocumentLease<T>>>` for a try): the lease with the
/// document as the acquiring write left it.
///
/// # Cancel safety
///
/// Cancel safe, as [`Acquire`].
///
/// # Examples
///
/// ```no_run
/// # async fn demo(items: mongo_lease::DocumentLeases) -> mongo_lease::Result<()> {
/// use mongodb::bson::doc;
/// let item = items.acquire("item-17").create(doc! { "runs": 0 }).await?;
/// item.commit(doc! { "$inc": { "runs": 1 } }).await?;
/// # Ok(()) }
/// ```
#[must_use = "a request does nothing until it is awaited"]
pub struct AcquireDocument<'a, T, W = Wait> {
    documents: &'a DocumentLeases<T>,
    id: LeaseKey,
    ttl: Option<Duration>,
    create: Option<Document>,
    wait: PhantomData<W>,
}

impl<'a, T, W> AcquireDocument<'a, T, W> {
    pub(crate) fn new(documents: &'a DocumentLeases<T>, id: LeaseKey) -> Self {
        AcquireDocument {
            documents,
            id,
            ttl: None,
            create: None,
            wait: PhantomData,
        }
    }

    /// The lease's TTL, as [`Acquire::ttl`]. Default: the manager's
    /// [`ttl`](crate::LeaseManagerOptions::ttl).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// Fields of the document to create if none has this `_id` (the `_id`
    /// is the one acquired; the document must not name `_id` or the lock
    /// field, [`Error::InvalidUpdate`], and a unique index of the collection
    /// other than `_id`'s may refuse it, nothing written). Concurrent
    /// acquires that create the same document create it once: one of them
    /// wins, the others find it held. A document that exists but holds
    /// nothing but its `_id` is given these fields too. Local callers
    /// waiting for the same document are served first in, first out, each
    /// attempt with the fields of the caller first in line: a missing
    /// document is created only for a caller that gave fields, with its
    /// fields. Default: none, and a missing document is
    /// [`Error::DocumentNotFound`].
    pub fn create(mut self, fields: Document) -> Self {
        self.create = Some(fields);
        self
    }
}

impl<T, W> std::fmt::Debug for AcquireDocument<'_, T, W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcquireDocument")
            .field("id", &self.id)
            .field("ttl", &self.ttl)
            .field("create", &self.create)
            .finish_non_exhaustive()
    }
}

impl<'a, T: DeserializeOwned + Send + Sync + 'a> IntoFuture for AcquireDocument<'a, T, Wait> {
    type Output = Result<DocumentLease<T>>;
    type IntoFuture = BoxFuture<'a, Result<DocumentLease<T>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let lease =
                self.documents
                    .acquire_document(self.id, AcquireMode::Wait, self.ttl, self.create);
            lease.await?.ok_or(Error::Shutdown)
        })
    }
}

impl<'a, T: DeserializeOwned + Send + Sync + 'a> IntoFuture for AcquireDocument<'a, T, NoWait> {
    type Output = Result<Option<DocumentLease<T>>>;
    type IntoFuture = BoxFuture<'a, Result<Option<DocumentLease<T>>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            self.documents
                .acquire_document(self.id, AcquireMode::Try, self.ttl, self.create)
                .await
        })
    }
}

impl LeaseManager {
    /// In-document leases on `collection` (in the lock collection's
    /// database): a request ([`OpenDocuments`]) whose options name the lock
    /// field and other applications' `LockId` fields. Nothing is sent to
    /// MongoDB and no index is created.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// let items = manager.documents::<mongodb::bson::Document>("workitem").await?;
    /// let tasks = manager.documents::<mongodb::bson::Document>("task").field("lock").await?;
    /// # Ok(()) }
    /// ```
    pub fn documents<T>(&self, collection: &str) -> OpenDocuments<'_, T> {
        OpenDocuments::new(self, collection)
    }
}

/// In-document leases on a user collection, from [`LeaseManager::documents`]:
/// awaiting it gives `Result<DocumentLeases<T>>`. Nothing is sent to MongoDB
/// and no index is created.
///
/// # Errors
///
/// [`Error::InvalidConfig`] for an empty collection name or one MongoDB
/// refuses (`$`, NUL, a `system.` prefix), the lock collection itself (its
/// documents are lock documents), a lock field name that is empty, `_id`,
/// starts with `$` or contains `.` or NUL, or [`LockIdFields`] that do not
/// hold (see [`OpenDocuments::lock_id`]); [`Error::Shutdown`] once the
/// manager has shut down.
#[must_use = "a request does nothing until it is awaited"]
pub struct OpenDocuments<'a, T> {
    manager: &'a LeaseManager,
    collection: String,
    field: Option<String>,
    lock_id: Option<LockIdFields>,
    document: PhantomData<fn() -> T>,
}

impl<'a, T> OpenDocuments<'a, T> {
    pub(crate) fn new(manager: &'a LeaseManager, collection: &str) -> Self {
        OpenDocuments {
            manager,
            collection: collection.to_string(),
            field: None,
            lock_id: None,
            document: PhantomData,
        }
    }

    /// The top-level field of the user's documents that holds the lock
    /// fields. Default: [`DEFAULT_LEASE_FIELD`](crate::DEFAULT_LEASE_FIELD),
    /// `_lease`.
    pub fn field(mut self, field: &str) -> Self {
        self.field = Some(field.to_string());
        self
    }

    /// Documents that other applications' clients lock by top-level
    /// `LockId` and `LockTime` fields ([`LockIdFields`] says what each lease
    /// then writes and checks). Every manager using these documents must
    /// open them the same way. Refused: field names that are not top-level
    /// names other than `_id`, or equal; a `max_duration` under 1 ms or over
    /// a year; a collection this manager already opened without these
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
    /// let items = manager.documents::<mongodb::bson::Document>("workitem").lock_id(fields).await?;
    /// let item = items.acquire("item-17").await?;
    /// // The new state with LockId: null and LockTime: null, in one write.
    /// item.commit(doc! { "$set": { "state": "done" } }).await?;
    /// # Ok(()) }
    /// ```
    pub fn lock_id(mut self, fields: LockIdFields) -> Self {
        self.lock_id = Some(fields);
        self
    }
}

impl<T> std::fmt::Debug for OpenDocuments<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenDocuments")
            .field("collection", &self.collection)
            .field("field", &self.field)
            .field("lock_id", &self.lock_id)
            .finish_non_exhaustive()
    }
}

impl<'a, T: 'a> IntoFuture for OpenDocuments<'a, T> {
    type Output = Result<DocumentLeases<T>>;
    type IntoFuture = BoxFuture<'a, Result<DocumentLeases<T>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let field = self
                .field
                .as_deref()
                .unwrap_or(crate::document::DEFAULT_LEASE_FIELD);
            let lock_id = self.lock_id.map(Arc::new);
            DocumentLeases::open(self.manager, &self.collection, field, lock_id).await
        })
    }
}

impl LeaseManager {
    /// Every lease in the lock collection: a request ([`List`]) that reads
    /// them all when awaited, or one page with [`List::page`]. A document
    /// not written by this crate is listed as held by a foreign holder
    /// ([`LeaseInfo::foreign`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// for info in manager.list().await? {
    ///     println!("{} held by {}: {}", info.key, info.owner_id, info.held);
    /// }
    /// let (first_ten, next) = manager.list().page(None, 10).await?;
    /// # Ok(()) }
    /// ```
    pub fn list(&self) -> List<'_> {
        List::new(self)
    }
}

/// Every lease in the lock collection, from [`LeaseManager::list`]: awaiting
/// it gives `Result<Vec<LeaseInfo>>` (held, expired or released and not yet
/// garbage-collected), in key order, each read with the server's clock,
/// in pages of 1 000 documents; [`List::page`] reads one page.
///
/// # Errors
///
/// [`Error::Shutdown`] and database errors.
///
/// # Cancel safety
///
/// Cancel safe (reads).
#[must_use = "a request does nothing until it is awaited"]
pub struct List<'a> {
    manager: &'a LeaseManager,
}

impl<'a> List<'a> {
    pub(crate) fn new(manager: &'a LeaseManager) -> Self {
        List { manager }
    }

    /// One page: the leases among the next `limit` documents whose keys
    /// sort after `after` (from the first with `None`), in [`LeaseKey`]'s
    /// order, and the key to pass as `after` for the next page, `None`
    /// after the last page. One MongoDB round trip.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a `limit` of 0, [`Error::Shutdown`],
    /// and database errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn page(
        self,
        after: Option<&LeaseKey>,
        limit: usize,
    ) -> Result<(Vec<LeaseInfo>, Option<LeaseKey>)> {
        self.manager.list_page(after, limit).await
    }
}

impl std::fmt::Debug for List<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("List").finish_non_exhaustive()
    }
}

impl<'a> IntoFuture for List<'a> {
    type Output = Result<Vec<LeaseInfo>>;
    type IntoFuture = BoxFuture<'a, Result<Vec<LeaseInfo>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.manager.list_all())
    }
}
