//! [`LeaseManager`]: the public, cloneable handle. It never touches MongoDB; it
//! sends commands to the actor and awaits the replies.

pub(crate) mod operator;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::actor::Actor;
use crate::actor::command::{AcquireMode, Command, Granted, Place, PlacedKey, Waiter, WaiterId};
use crate::actor::mailbox::Mailbox;
use crate::config::{AcquireOptions, LeaseManagerOptions, ReleaseMode, Timing, validate_owner_id};
use crate::error::{Error, Operation, Result};
use crate::foreign::ForeignRules;
use crate::health::HealthBoard;
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::lease::{Lease, LeaseObserver};
use crate::store::{DELETE_DELAY, MongoStore, OverrideEnd, Release, Store};
use crate::telemetry;
use tracing::Instrument;

/// A handle to this process's lease manager: acquire, release and shut down
/// leases stored in one MongoDB lock collection.
///
/// One manager task per [`LeaseManager::connect`] renews every held lease
/// with batched heartbeats and queues local waiters per key in FIFO order.
/// Clones are cheap and talk to the same manager. The manager stops at
/// [`LeaseManager::shutdown`], or once every handle and every [`Lease`] is
/// dropped (it then releases what it still holds).
///
/// # Examples
///
/// ```no_run
/// use mongo_lease::{LeaseManager, LeaseManagerOptions};
///
/// # async fn demo() -> mongo_lease::Result<()> {
/// let client = mongodb::Client::with_uri_str("mongodb://127.0.0.1:27017/?replicaSet=rs0").await?;
/// let manager = LeaseManager::connect(
///     LeaseManagerOptions::builder()
///         .database(client.database("app"))
///         .collection("workitem.lock")
///         .build(),
/// )
/// .await?;
///
/// let lease = manager.acquire("workitem-17").await?;
/// println!("holding {} with fencing token {}", lease.key(), lease.fencing_token());
/// lease.release().await?;
/// manager.shutdown().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct LeaseManager {
    inner: Arc<Inner>,
}

struct Inner {
    mailbox: Mailbox,
    /// The lock collection's store, for the reads and overrides that need
    /// no lease state. Weak: the task owns it.
    store: Weak<dyn Store>,
    owner_id: Arc<str>,
    timing: Timing,
    next_waiter: AtomicU64,
    /// What the manager task publishes for [`LeaseManager::health`].
    health: Arc<HealthBoard>,
    /// The lock collection as `database.collection`, for the errors that
    /// name it ([`Error::Refused`]).
    namespace: Arc<str>,
    /// The lock-delay of this manager's force releases and releases by
    /// owner id (the simulation reads it).
    #[cfg(any(test, feature = "sim"))]
    lock_delay: Duration,
}

impl LeaseManager {
    /// Checks `options`, makes sure the lock collection is usable (creating
    /// its TTL index if needed), and starts the manager task on the current
    /// tokio runtime. The deployment should be a replica set (a single-node
    /// one is fine): writes use majority write concern.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for inconsistent options (nothing is sent),
    /// [`Error::Unreachable`] if MongoDB does not answer within
    /// `operation_timeout`, [`Error::Unsupported`] for a server older than
    /// MongoDB 5.0, [`Error::UnusableCollection`], [`Error::Refused`] and
    /// [`Error::Database`].
    ///
    /// # Panics
    ///
    /// Outside a tokio runtime.
    pub async fn connect(options: LeaseManagerOptions) -> Result<LeaseManager> {
        let mut timing = options.timing()?;
        let lock_delay = options.lock_delay(&timing)?;
        let owner_id = options
            .owner_id
            .clone()
            .unwrap_or_else(|| crate::random::uuid().to_string());
        let foreign = ForeignRules {
            custom: options.foreign_lock.clone(),
            ts_expire_after: None,
        };
        let store = MongoStore::new(
            &options.database,
            &options.collection,
            owner_id.clone(),
            timing.ttl,
            timing.retry_max,
            timing.operation_timeout,
        )
        .with_release_mode(timing.release_mode)
        .with_safety_margin(timing.safety_margin)
        .with_lock_delay(lock_delay)
        .with_foreign(foreign.clone());
        let namespace = format!("{}.{}", options.database.name(), options.collection);
        let facts = store
            .prepare(options.gc_grace, &timing)
            .await
            .map_err(|e| e.refused_in(Operation::Connect, &namespace))?;
        timing.ttl_cap = facts.ttl_cap;
        if let Some(cap) = facts.ttl_cap {
            let most = cap.saturating_sub(timing.heartbeat_interval + timing.unsafe_time());
            if lock_delay > most {
                return Err(Error::InvalidConfig {
                    reason: format!(
                        "lock_delay ({lock_delay:?}) is longer than the collection's TTL index on `ts` \
                     ({cap:?}) allows: MongoDB may delete an overridden lease's document \
                     {cap:?} after its last renewal, so the lock-delay must be at most {most:?} \
                     (the index's time less heartbeat_interval, safety_margin and clock_skew)"
                    ),
                });
            }
        }
        // A rule for another application's locks says the collection is
        // shared with it.
        let shared = facts.shared || options.foreign_lock.is_some();
        if options.release_mode.is_none() && shared {
            timing.release_mode = ReleaseMode::Delete;
        }
        // `{_id, ts, aid}` expires as its TTL index on `ts` deletes it.
        let store = store
            .with_foreign(ForeignRules {
                ts_expire_after: facts.ttl_cap,
                ..foreign
            })
            .with_release_mode(timing.release_mode);
        Ok(Self::start(Arc::new(store), owner_id.into(), timing))
    }

    /// Spawns the actor over any store (the in-memory one in timing tests).
    pub(crate) fn start(store: Arc<dyn Store>, owner_id: Arc<str>, timing: Timing) -> LeaseManager {
        let profile = store.profile();
        let place = &profile.place;
        let namespace = format!("{}.{}", place.database, place.collection).into();
        let (commands, receiver) = mpsc::unbounded_channel();
        let actor = Actor::new(
            store.clone(),
            owner_id.clone(),
            timing.clone(),
            receiver,
            commands.downgrade(),
        );
        let health = actor.health_board();
        tokio::spawn(actor.run());
        LeaseManager {
            inner: Arc::new(Inner {
                mailbox: Mailbox::new(commands),
                store: Arc::downgrade(&store),
                owner_id,
                timing,
                next_waiter: AtomicU64::new(0),
                health,
                namespace,
                #[cfg(any(test, feature = "sim"))]
                lock_delay: profile.lock_delay,
            }),
        }
    }

    /// Whether this manager's renewals are on time, for liveness probes
    /// ([`Health`](crate::Health)): a few atomic loads, without a round trip
    /// or the manager task, so a starved task reads unhealthy once a held
    /// lease's local deadline has passed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn demo(manager: mongo_lease::LeaseManager) {
    /// let health = manager.health();
    /// if !health.is_healthy() {
    ///     eprintln!(
    ///         "renewals late: {} leases held, oldest renewal {:?} ago",
    ///         health.held_leases, health.oldest_renewal_age
    ///     );
    /// }
    /// # }
    /// ```
    pub fn health(&self) -> crate::health::Health {
        self.inner.health.read()
    }

    /// This manager's owner id, stored as `aid` in each lease it holds.
    pub fn owner_id(&self) -> &str {
        &self.inner.owner_id
    }

    /// The lease TTL this manager uses, unless an acquisition gives its own.
    pub(crate) fn ttl(&self) -> Duration {
        self.inner.timing.ttl
    }

    /// The lock-delay of this manager's involuntary ends
    /// ([`LeaseManagerOptions::lock_delay`](field@crate::LeaseManagerOptions::lock_delay)).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn lock_delay(&self) -> Duration {
        self.inner.lock_delay
    }

    /// Changes the number of permits of the semaphore key `key`
    /// ([`Semaphore::set_permits`](crate::Semaphore::set_permits)).
    pub(crate) async fn set_permits_of(
        &self,
        key: LeaseKey,
        permits: u32,
    ) -> Result<crate::kind::PermitsChange> {
        let call = |respond_to| Command::SetPermits {
            key,
            permits,
            respond_to,
        };
        self.inner.mailbox.call(call).await
    }

    /// Checks `options` against this manager's rules (kind, minimum hold,
    /// release mode) before anything is sent, as an acquisition does.
    pub(crate) fn check_shape(&self, options: &AcquireOptions) -> Result<()> {
        self.inner.timing.lease_shape(options).map(drop)
    }

    /// Acquires `key` (in the lock collection) with `options`.
    pub(crate) async fn acquire_key(
        &self,
        key: LeaseKey,
        mode: AcquireMode,
        options: &AcquireOptions,
    ) -> Result<Option<Lease>> {
        let granted = self
            .request_target(PlacedKey::lock(key), mode, options, None)
            .await?;
        Ok(granted.map(|granted| Lease::new(granted.take().0)))
    }

    /// Acquires `key` in its place (the lock collection, or a user
    /// collection of in-document leases); `create`: the fields to create a
    /// missing document with.
    pub(crate) async fn request_target(
        &self,
        key: PlacedKey,
        mode: AcquireMode,
        options: &AcquireOptions,
        create: Option<mongodb::bson::Document>,
    ) -> Result<Option<Granted>> {
        key.key.validate()?;
        let ttl = self.inner.timing.lease_ttl(options)?;
        let shape = self.inner.timing.lease_shape(options)?;
        if let Some(payload) = &options.payload {
            if key.place != Place::LOCKS {
                return Err(Error::InvalidConfig {
                    reason: "a payload with the acquisition applies to leases of the lock \
                             collection only, not to in-document leases"
                        .into(),
                });
            }
            crate::lease::check_payload(payload)?;
        }
        let id = self.inner.next_waiter.fetch_add(1, Ordering::Relaxed);
        let span = tracing::info_span!("acquire", key = %key, kind = %shape.kind, owner_id = %self.inner.owner_id);
        let metrics = telemetry::AcquireMetrics::start(shape.kind);
        let in_locks = key.place == Place::LOCKS;
        let mut guard = WaiterGuard {
            mailbox: &self.inner.mailbox,
            key: key.clone(),
            waiter: id,
            armed: true,
        };
        let result = self
            .inner
            .mailbox
            .call(|respond_to| Command::Acquire {
                key,
                waiter: Waiter {
                    id,
                    mode,
                    ttl,
                    create,
                    shape,
                    holder: options.caller,
                    reentrant: options.reentrant,
                    payload: options.payload.clone(),
                    at_most: options.hold_at_most.is_some(),
                    respond_to,
                },
            })
            .instrument(span)
            .await;
        guard.armed = false;
        let result = match in_locks {
            true => result.map_err(self.refused(Operation::Acquire)),
            false => result,
        };
        metrics.finish(telemetry::AcquireOutcome::of(&result));
        result
    }

    /// Opens (or finds) the place of in-document leases, as
    /// [`DocumentLeases::open`](crate::DocumentLeases::open) says.
    pub(crate) async fn open_documents(
        &self,
        collection: &str,
        field: &str,
        lock_id: Option<std::sync::Arc<crate::lock_id_fields::LockIdFields>>,
    ) -> Result<Place> {
        crate::document_update::check_field(field)?;
        crate::document_update::check_collection(collection)?;
        let (collection, field) = (collection.to_string(), field.to_string());
        self.inner
            .mailbox
            .call(|respond_to| Command::OpenDocuments {
                collection,
                field,
                lock_id,
                respond_to,
            })
            .await
    }

    /// Releases every lease this manager holds, in the lock collection and
    /// in each collection of in-document leases, by lease id, in batches of
    /// [`renewal_batch_size`](crate::LeaseManagerOptions::renewal_batch_size).
    /// Local waiters keep waiting. Returns how many leases the server
    /// released. Leases of an earlier process with the same owner id are
    /// not released ([`LeaseManager::release_owner`] ends them).
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`], or a database error if a release could not be
    /// confirmed (those leases then expire after their TTL; the releases in
    /// other collections still run to their end).
    pub async fn release_all(&self) -> Result<u64> {
        self.inner
            .mailbox
            .call(|respond_to| Command::ReleaseAll { respond_to })
            .await
    }

    /// Releases every held lease, fails every waiting acquire, and stops
    /// the manager task: later calls on any clone of this handle, or on its
    /// leases, return [`Error::Shutdown`].
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`] if the manager had already shut down; a database
    /// error if the final release could not be confirmed (leases then expire
    /// after their TTL).
    pub async fn shutdown(&self) -> Result<()> {
        self.inner
            .mailbox
            .call(|respond_to| Command::Shutdown { respond_to })
            .await
    }

    /// Reads `key` from the lock collection with the server's clock
    /// ([`LeaseInfo`]; a document not written by this crate is a foreign
    /// holder's lock, [`LeaseInfo::foreign`]). `Ok(None)` if the key has no
    /// lock document. One MongoDB round trip (majority read concern).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::Shutdown`], and database errors
    /// ([`Error::Refused`], [`Error::Database`], [`Error::Unreachable`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// if let Some(info) = manager.inspect("workitem-17").await? {
    ///     if info.held {
    ///         println!("{} holds it for {:?} more", info.owner_id, info.time_to_expiry());
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn inspect(&self, key: impl Into<LeaseKey>) -> Result<Option<LeaseInfo>> {
        let key = key.into();
        key.validate()?;
        self.store()?
            .inspect(key)
            .await
            .map_err(self.refused(Operation::Inspect))
    }

    /// The lock collection's database (in-document leases' collections are in it too).
    pub(crate) fn database_name(&self) -> &str {
        self.inner.namespace.split('.').next().unwrap_or_default()
    }

    /// The lock collection's store: [`Error::Shutdown`] once the manager
    /// began to shut down.
    fn store(&self) -> Result<Arc<dyn Store>> {
        if self.inner.mailbox.is_closed() {
            return Err(Error::Shutdown);
        }
        self.inner.store.upgrade().ok_or(Error::Shutdown)
    }

    /// `error` as met by `operation` on the lock collection: a server's
    /// refusal becomes [`Error::Refused`] naming both.
    fn refused(&self, operation: Operation) -> impl FnOnce(Error) -> Error + '_ {
        move |error| error.refused_in(operation, &self.inner.namespace)
    }

    /// [`LeaseManager::inspect`] of a key in any place, through the manager
    /// task, which holds the stores of in-document leases.
    pub(crate) async fn inspect_target(&self, key: PlacedKey) -> Result<Option<LeaseInfo>> {
        key.key.validate()?;
        self.inner
            .mailbox
            .call(|respond_to| Command::Inspect { key, respond_to })
            .await
    }

    /// Every lease of the lock collection, page by page.
    pub(crate) async fn list_all(&self) -> Result<Vec<LeaseInfo>> {
        let (mut all, mut after) = (Vec::new(), None);
        loop {
            let (page, next) = self.list_page(after.as_ref(), LIST_PAGE).await?;
            all.extend(page);
            if next.is_none() {
                return Ok(all);
            }
            after = next;
        }
    }

    /// One page of the lock collection ([`List::page`]).
    pub(crate) async fn list_page(
        &self,
        after: Option<&LeaseKey>,
        limit: usize,
    ) -> Result<(Vec<LeaseInfo>, Option<LeaseKey>)> {
        if limit == 0 {
            return Err(Error::InvalidConfig {
                reason: "a page of the list needs a limit of at least 1".into(),
            });
        }
        self.store()?
            .list(after.cloned(), limit)
            .await
            .map_err(self.refused(Operation::List))
    }

    /// **Operator override**: releases `key` whoever holds it, as if its
    /// holder had released it (the fencing token stays, so the next holder
    /// gets a greater one); the holder learns it at its next renewal.
    /// Logged at `warn`. The returned request ([`ForceRelease`](operator::ForceRelease),
    /// which says when the key is free again) resolves to the lease as it
    /// was if it was held, `None` if the key was free.
    ///
    /// A foreign holder's lock ([`LeaseInfo::foreign`]) is **deleted** at
    /// once if it still has the `aid` and `ts` just read (else `None`): the
    /// only call that ever modifies such a document.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::Shutdown`], and database errors.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not leave the key released.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// if let Some(was) = manager.force_release("job-1").await? {
    ///     println!("{} held job-1; free again at {:?}", was.owner_id, was.expires_at);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn force_release(&self, key: impl Into<LeaseKey>) -> operator::ForceRelease<'_> {
        operator::ForceRelease {
            manager: self,
            key: key.into(),
            end: OverrideEnd::AtExpiry,
        }
    }

    /// [`LeaseManager::force_release`], awaited.
    pub(crate) async fn force_release_key(
        &self,
        key: LeaseKey,
        end: OverrideEnd,
    ) -> Result<Option<LeaseInfo>> {
        key.validate()?;
        let release = Release::ForcedKey {
            key: key.clone(),
            end,
        };
        let result = self.store()?.release(release).await;
        match result.as_ref().map(|released| &released.was) {
            Ok(Some(info)) if info.foreign => tracing::warn!(
                %key,
                owner_id = info.owner_id,
                "foreign lock document deleted by force release (operator override)"
            ),
            Ok(Some(info)) => tracing::warn!(
                %key,
                owner_id = info.owner_id,
                token = info.fencing_token,
                "lease force-released (operator override)"
            ),
            Ok(None) => tracing::info!(%key, "force release: the key was not held"),
            Err(error) => tracing::warn!(%key, %error, "force release failed"),
        }
        let was = result.map_err(self.refused(Operation::ForceRelease))?.was;
        if let Some(info) = &was {
            // A lease of this manager it ended is lost before this returns,
            // if this manager holds it by then (one a handoff is granting
            // meanwhile is told by its next renewal).
            let call = |respond_to| Command::ForceReleased {
                key,
                was: info.clone(),
                respond_to,
            };
            let _ = self.inner.mailbox.call(call).await;
        }
        Ok(was)
    }

    /// **Operator override**: releases every lease held under `owner_id`
    /// (typically of a process that died or hung), as
    /// [`force_release`](LeaseManager::force_release) releases one; another
    /// application's lock document with the same `aid` is left alone, and
    /// this manager's own owner id is [`release_all`](LeaseManager::release_all).
    /// The returned request ([`ReleaseOwner`](operator::ReleaseOwner))
    /// resolves to how many lease documents were released (live, or
    /// expired without a release).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for an owner id that is empty or longer than
    /// [`MAX_OWNER_ID_LEN`](crate::MAX_OWNER_ID_LEN) bytes (before any round
    /// trip), [`Error::Shutdown`], and database errors (some of the leases
    /// may then have been released).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not leave the leases released.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// // The process that used owner id "worker-7" hangs: end its leases;
    /// // their keys are free once its leases could no longer be live.
    /// let released = manager.release_owner("worker-7").await?;
    /// println!("released {released} leases of worker-7");
    /// # Ok(()) }
    /// ```
    pub fn release_owner<'a>(&'a self, owner_id: &'a str) -> operator::ReleaseOwner<'a> {
        operator::ReleaseOwner {
            manager: self,
            owner_id,
            end: OverrideEnd::AtExpiry,
        }
    }

    /// [`LeaseManager::release_owner`], awaited.
    pub(crate) async fn release_owner_leases(
        &self,
        owner_id: &str,
        end: OverrideEnd,
    ) -> Result<u64> {
        validate_owner_id(owner_id)?;
        if owner_id == self.owner_id() {
            return self.release_all().await;
        }
        let store = self.store()?;
        let owner = owner_id.to_string();
        let result = async {
            let release = Release::OwnerLeases {
                owner: owner.clone(),
                end,
            };
            let released = store.release(release).await?;
            if released.follow_up_due {
                tokio::time::sleep(DELETE_DELAY).await;
                store.release(Release::ReleasedDocumentsOf(owner)).await?;
            }
            Ok(released.count)
        }
        .await;
        match &result {
            Ok(n) => tracing::warn!(
                owner_id,
                released = n,
                "leases of an owner id released (operator override)"
            ),
            Err(error) => tracing::warn!(owner_id, %error, "release by owner failed"),
        }
        result.map_err(self.refused(Operation::ReleaseOwner))
    }

    /// **Cooperative revocation**: asks the holders of `key` to release it
    /// (docs/revocation.md): marks the key's lock document, and each
    /// holder's followers get
    /// [`LeaseEvent::RevocationRequested`](crate::LeaseEvent::RevocationRequested),
    /// within milliseconds on a replica set (never on a standalone server).
    /// Nothing is taken away. Returns whether a lease held the key.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`], [`Error::Shutdown`], and database errors.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future may or may not leave the request written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// if manager.request_release("nightly-report").await? {
    ///     println!("asked the holder of nightly-report to let go");
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn request_release(&self, key: impl Into<LeaseKey>) -> Result<bool> {
        let key = key.into();
        key.validate()?;
        self.store()?
            .request_release(key)
            .await
            .map_err(self.refused(Operation::RequestRelease))
    }

    /// Observes `key`: a stream ([`LeaseObserver`]) whose first item is the
    /// key's current state, followed by every change in order.
    ///
    /// On a replica set changes arrive through a MongoDB change stream (one
    /// per key and manager) a few milliseconds after each majority write,
    /// none missed, also across a failover; on a standalone server the key
    /// is polled about every 0.5 s and short-lived states can be missed. An
    /// expiry is detected by a read at the expiry time, by the server's
    /// clock. The stream ends when the manager shuts down.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] and [`Error::Shutdown`]. Database errors arrive
    /// in the stream: transient ones are retried (logged at `warn`), a
    /// permanent one is the stream's last item.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// use futures::StreamExt;
    /// let mut changes = manager.observe("workitem-17").await?;
    /// while let Some(state) = changes.next().await {
    ///     match state? {
    ///         Some(info) if info.held => println!("held by {} ({})", info.owner_id, info.fencing_token),
    ///         _ => println!("free"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn observe(&self, key: impl Into<LeaseKey>) -> Result<LeaseObserver> {
        let key = key.into();
        key.validate()?;
        let changes = self
            .inner
            .mailbox
            .call(|respond_to| Command::Observe {
                key: key.clone(),
                respond_to,
            })
            .await?;
        Ok(LeaseObserver::new(key, changes))
    }
}

impl fmt::Debug for LeaseManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseManager")
            .field("owner_id", &self.inner.owner_id)
            .field("ttl", &self.inner.timing.ttl)
            .finish_non_exhaustive()
    }
}

/// Documents per page of [`LeaseManager::list`].
const LIST_PAGE: usize = 1_000;

/// Removes a waiter from the actor's queue when its acquire future is dropped
/// before the reply arrived (disarmed once the reply is in).
struct WaiterGuard<'a> {
    mailbox: &'a Mailbox,
    key: PlacedKey,
    waiter: WaiterId,
    armed: bool,
}

impl Drop for WaiterGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.mailbox.cancel_waiter(self.key.clone(), self.waiter);
        }
    }
}
