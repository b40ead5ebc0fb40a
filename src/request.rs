//! Requests in the mongodb driver's style, whose chained methods set their
//! options and which are awaited directly: [`Acquire`], [`AcquireDocument`],
//! [`OpenDocuments`] and [`List`].

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
use crate::document::{DEFAULT_LEASE_FIELD, DocumentLease, DocumentLeases};
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::lease::Lease;
use crate::lease_group::LeaseGroup;
use crate::lock_id_fields::LockIdFields;
use crate::manager::LeaseManager;

impl LeaseManager {
    /// Acquires `key` (a string or any [`LeaseKey`], e.g. the `ObjectId` of
    /// the document being locked), waiting as long as it takes: a request
    /// ([`Acquire`]) whose options are chained before it is awaited.
    ///
    /// Local callers waiting for one key are served first in, first out,
    /// fairly with other managers (the crate docs' "Guarantees"); transient
    /// database errors are retried (and logged) while waiting.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for a key [`LeaseKey`] refuses;
    /// [`Error::InvalidConfig`] for options [`Acquire`] refuses;
    /// [`Error::KindMismatch`] for a key held as another kind;
    /// [`Error::Shutdown`] once the manager has shut down. Another
    /// application's lock document is no error: `acquire` waits until it is
    /// deleted or expires by its rule.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (see [`Acquire`]), so [`tokio::time::timeout`] over it
    /// waits at most a given time:
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
    /// `Ok(None)` if it is held (by anyone, a foreign holder included), or
    /// if local callers are already waiting for it (a try never jumps the
    /// queue). Costs one MongoDB round trip when the key is not held locally.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::acquire`], and database errors ([`Error::Refused`],
    /// [`Error::Database`], [`Error::Unreachable`]) when the attempt's
    /// outcome could not be established.
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
    /// them together: all of them, or none ([`LeaseGroup`]). The options of
    /// the request ([`Acquire`]) apply to every lease of the group.
    ///
    /// The keys are taken one at a time in [`LeaseKey`]'s order, so callers
    /// over overlapping keys never deadlock (docs/multi-key.md has the rules).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] also for no key or a key given twice;
    /// [`Error::InvalidConfig`] also with [`reentrant`](Acquire::reentrant);
    /// [`Error::AlreadyHeld`] if the request's caller already holds one of
    /// the keys; otherwise as [`LeaseManager::acquire`]. On an error the
    /// keys already taken are released.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the keys already taken
    /// (in the background), so [`tokio::time::timeout`] bounds the whole
    /// acquisition.
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
    /// `Ok(None)` as soon as one of them is held, after releasing the keys
    /// taken before it.
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

mod sealed {
    use super::*;

    /// How an acquisition waits, and what it gives for a lease `T`.
    pub trait Mode: Send + 'static {
        type Out<T: Send>: Send;
        /// Whether it waits ([`AcquireMode::Wait`]) or tries once.
        const WAITS: bool;
        /// The request's output, from the manager's answer.
        fn out<T: Send>(lease: Result<Option<T>>) -> Result<Self::Out<T>>;
    }

    impl Mode for Wait {
        type Out<T: Send> = T;
        const WAITS: bool = true;
        fn out<T: Send>(lease: Result<Option<T>>) -> Result<T> {
            lease?.ok_or(Error::Shutdown)
        }
    }

    impl Mode for NoWait {
        type Out<T: Send> = Option<T>;
        const WAITS: bool = false;
        fn out<T: Send>(lease: Result<Option<T>>) -> Result<Option<T>> {
            lease
        }
    }
}

use sealed::Mode;

/// The [`AcquireMode`] of a request that waits as `W` says.
fn mode<W: Mode>() -> AcquireMode {
    if W::WAITS {
        AcquireMode::Wait
    } else {
        AcquireMode::Try
    }
}

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
/// Each option applies to every lease of the request; a combination the
/// rules below refuse is [`Error::InvalidConfig`], before anything is sent.
///
/// # Cancel safety
///
/// Cancel safe: dropping the future removes the waiter from the key's
/// queue, and a lease granted at that moment (or a group's keys already
/// taken) is released, never leaked.
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
#[derive(Debug)]
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

    /// Holds the key shared ([`LeaseKind::Shared`], which has the rules
    /// between kinds), the read side of a read/write key. Needs
    /// [`ReleaseMode::Keep`](crate::ReleaseMode::Keep); not for a
    /// semaphore's permits.
    pub fn shared(mut self) -> Self {
        match self.options.kind {
            LeaseKind::Exclusive | LeaseKind::Shared => self.options.kind = LeaseKind::Shared,
            LeaseKind::Permit { .. } => self.refused = Some("a semaphore's permit is not shared"),
        }
        self
    }

    /// How many of a semaphore's permits the lease takes at once, all or
    /// none: 1 to the semaphore's number of permits. Default: 1. One
    /// [`Lease`] holds them (docs/kinds.md has the rules). For
    /// [`Semaphore::acquire`](crate::Semaphore::acquire) only.
    pub fn permits(mut self, count: u32) -> Self {
        self.options.permits_taken = Some(count);
        self
    }

    /// Keep the key held until the acquisition time plus `at_least`, by the
    /// server's clock, even if the lease is released (or its holder dies)
    /// earlier: a job guarded by such a lease runs at most once per
    /// `at_least` across processes (ShedLock's `lockAtLeastFor`). Exclusive
    /// leases only; at least 1 ms, and not longer than the TTL index another
    /// application keeps on `ts`. Needs
    /// [`ReleaseMode::Keep`](crate::ReleaseMode::Keep).
    pub fn hold_at_least(mut self, at_least: Duration) -> Self {
        self.options.hold_at_least = Some(at_least);
        self
    }

    /// A lease that is **not** renewed: it ends at its acquisition plus
    /// `at_most`, by the server's clock, even if its holder never releases
    /// it (ShedLock's `lockAtMostFor`); it reads lost
    /// ([`LossReason::Expired`](crate::LossReason::Expired)) at its local
    /// deadline. Instead of [`ttl`](Self::ttl); at least 10 ms, longer than
    /// the manager's safety margin plus its clock skew, and not shorter
    /// than [`hold_at_least`](Self::hold_at_least). [`Lease::set_ttl`]
    /// refuses such a lease, and a force release of it is noticed at its
    /// deadline.
    pub fn hold_at_most(mut self, at_most: Duration) -> Self {
        self.options.hold_at_most = Some(at_most);
        self
    }

    /// A payload written by the acquiring write itself, as
    /// [`Lease::set_payload`] writes it (with its limits), so that nobody
    /// reading the key ever sees this acquisition without it. Exclusive
    /// leases only.
    pub fn payload(mut self, payload: Document) -> Self {
        self.options.payload = Some(payload);
        self
    }

    /// Who acquires: an explicit caller ([`CallerId`], which has the rules
    /// of re-entry). Default: every acquisition is a caller of its own.
    pub fn caller(mut self, caller: CallerId) -> Self {
        self.options.caller = Some(caller);
        self
    }

    /// Re-enter a lease the [`caller`](Self::caller) already holds on the
    /// key, of the same kind, at once and with no round trip, as
    /// [`Lease::reenter`] does; this acquisition's `ttl` and `hold_at_least`
    /// are not applied. Needs a caller; not for `acquire_all`.
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

impl<'a, W: Mode> IntoFuture for Acquire<'a, LeaseKey, W> {
    type Output = Result<W::Out<Lease>>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (manager, key, options) = self.checked()?;
            W::out(manager.acquire_key(key, mode::<W>(), &options).await)
        })
    }
}

impl<'a, W: Mode> IntoFuture for Acquire<'a, Vec<LeaseKey>, W> {
    type Output = Result<W::Out<LeaseGroup>>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(async move {
            let (manager, keys, options) = self.checked()?;
            W::out(crate::lease_group::acquire_all(manager, keys, mode::<W>(), &options).await)
        })
    }
}

impl<T> DocumentLeases<T> {
    /// Acquires the lease of the document with `_id` `id`, waiting as long
    /// as it takes, as [`LeaseManager::acquire`] does for a key: a request
    /// ([`AcquireDocument`]).
    ///
    /// # Errors
    ///
    /// [`Error::DocumentNotFound`] if no document has this `_id` (see
    /// [`AcquireDocument::create`]), [`Error::InvalidKey`] for an `_id`
    /// MongoDB refuses, [`Error::Database`] if the document cannot be read
    /// as `T` (the lease is then released), [`Error::Refused`],
    /// [`Error::Shutdown`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire`]:
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
    /// document's lease is held.
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

    /// Fields of the document to create if none has this `_id` (or one
    /// holds nothing but its `_id`), without `_id` or the lock field
    /// ([`Error::InvalidUpdate`]). Concurrent acquires create it once; each
    /// attempt uses the fields of the local caller first in line. Default:
    /// none, and a missing document is [`Error::DocumentNotFound`].
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

impl<'a, T: DeserializeOwned + Send + Sync + 'a, W: Mode> IntoFuture for AcquireDocument<'a, T, W> {
    type Output = Result<W::Out<DocumentLease<T>>>;
    type IntoFuture = BoxFuture<'a, Self::Output>;

    fn into_future(self) -> Self::IntoFuture {
        let (id, ttl, create) = (self.id, self.ttl, self.create);
        let lease = self
            .documents
            .acquire_document(id, mode::<W>(), ttl, create);
        Box::pin(async move { W::out(lease.await) })
    }
}

impl LeaseManager {
    /// In-document leases on `collection` (in the lock collection's
    /// database): a request ([`OpenDocuments`]).
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
        OpenDocuments {
            manager: self,
            collection: collection.to_string(),
            field: None,
            lock_id: None,
            document: PhantomData,
        }
    }
}

/// In-document leases on a user collection, from [`LeaseManager::documents`]:
/// awaiting it gives `Result<DocumentLeases<T>>`. Nothing is sent to MongoDB
/// and no index is created.
///
/// # Errors
///
/// [`Error::InvalidConfig`] for a collection name MongoDB refuses, the lock
/// collection itself, a lock field that is not a top-level name other than
/// `_id`, or [`LockIdFields`] that do not hold; [`Error::Shutdown`].
#[must_use = "a request does nothing until it is awaited"]
pub struct OpenDocuments<'a, T> {
    manager: &'a LeaseManager,
    collection: String,
    field: Option<String>,
    lock_id: Option<LockIdFields>,
    document: PhantomData<fn() -> T>,
}

impl<T> OpenDocuments<'_, T> {
    /// The top-level field of the user's documents that holds the lock
    /// fields. Default: [`DEFAULT_LEASE_FIELD`], `_lease`.
    pub fn field(mut self, field: &str) -> Self {
        self.field = Some(field.to_string());
        self
    }

    /// Documents that other applications' clients lock by top-level
    /// `LockId` and `LockTime` fields ([`LockIdFields`], which has the
    /// rules). Every manager using these documents must open them the same
    /// way; a collection this manager already opened without these fields
    /// is refused.
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
            let field = self.field.as_deref().unwrap_or(DEFAULT_LEASE_FIELD);
            let lock_id = self.lock_id.map(Arc::new);
            DocumentLeases::open(self.manager, &self.collection, field, lock_id).await
        })
    }
}

impl LeaseManager {
    /// Every lease in the lock collection: a request ([`List`]).
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
        List { manager: self }
    }
}

/// Every lease in the lock collection, from [`LeaseManager::list`]: awaiting
/// it gives `Result<Vec<LeaseInfo>>` (held, expired or released and not yet
/// garbage-collected; a foreign holder's lock as [`LeaseInfo::foreign`]),
/// in key order, read with the server's clock in pages of 1 000 documents;
/// [`List::page`] reads one page.
///
/// # Errors
///
/// [`Error::Shutdown`] and database errors.
///
/// # Cancel safety
///
/// Cancel safe (reads).
#[derive(Debug)]
#[must_use = "a request does nothing until it is awaited"]
pub struct List<'a> {
    manager: &'a LeaseManager,
}

impl List<'_> {
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

impl<'a> IntoFuture for List<'a> {
    type Output = Result<Vec<LeaseInfo>>;
    type IntoFuture = BoxFuture<'a, Result<Vec<LeaseInfo>>>;

    fn into_future(self) -> Self::IntoFuture {
        Box::pin(self.manager.list_all())
    }
}
