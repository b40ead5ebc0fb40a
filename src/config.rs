//! Options of a [`LeaseManager`](crate::LeaseManager), their defaults and validation.

use std::time::Duration;

use mongodb::Database;
use typed_builder::TypedBuilder;

use crate::error::{Error, Result};
use crate::kind::{LeaseKind, LeaseShape};

/// Default lease time-to-live: 30 s.
///
/// Choose a TTL well above your deployment's failover time (MongoDB 6.0 with
/// default election settings needs about 11 s to elect a new primary after a
/// crash), or expect leases to be lost during a failover.
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The default heartbeat interval is the TTL divided by this (10 s for the default TTL):
/// two renewals can fail before a lease is at risk.
pub const DEFAULT_HEARTBEAT_DIVISOR: u32 = 3;

/// The default safety margin is the TTL divided by this (3 s for the default TTL).
pub const DEFAULT_SAFETY_MARGIN_DIVISOR: u32 = 10;

/// Default [`LeaseManagerOptions::clock_skew`]: 1 s, the bound on how far
/// apart the replica set's members' clocks are that the fencing tokens
/// assume too ([`DELETE_MIN_TOKEN_AGE`]).
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(1);

/// The longest accepted [`LeaseManagerOptions::clock_skew`]: 1 s
/// ([`DELETE_MIN_TOKEN_AGE`]; a larger difference between the members'
/// clocks would also break the fencing tokens' order after a delete).
pub const MAX_CLOCK_SKEW: Duration = DELETE_MIN_TOKEN_AGE;

/// Default time an abandoned or released lock document stays in the collection
/// after its expiry before MongoDB's TTL monitor deletes it: 60 s.
pub const DEFAULT_GC_GRACE: Duration = Duration::from_secs(60);

/// Default bound on a single MongoDB operation, and on [`LeaseManager::connect`]: 10 s.
///
/// [`LeaseManager::connect`]: crate::LeaseManager::connect
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// Default first retry delay of a waiter's backoff against MongoDB: 10 ms.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_millis(10);

/// Default longest retry delay of a waiter's backoff against MongoDB: 1 s.
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(1);

/// Default number of leases renewed by one MongoDB command: 5 000.
///
/// The batch's `updateMany` costs about 22 µs per lease on MongoDB 6.0
/// (20–23 µs with 5 000 leases, 22–32 µs with 1 000, on an idle 2-core
/// machine; up to 4× more while other builds load it), so a full batch
/// takes about 0.11 s. That is the cost of writing the documents: a plain
/// `$set` of the same documents takes about as long (0.68–1.25× in the
/// same runs), and the filter
/// reads one `_id` index key per lease (`benches/throughput.rs`,
/// docs/mongodb-behaviour.md, B23). Batches keep each command far below the
/// 16 MiB command size limit. A heartbeat sends one batch at a time, the
/// next once it is answered (each names every key and lease id of its
/// leases, which the command holds several copies of while in flight), so
/// 100 000 leases are renewed in 20 commands, one after another.
pub const DEFAULT_RENEWAL_BATCH_SIZE: usize = 5_000;

/// Default [`ReleaseMode`]: [`ReleaseMode::Keep`], the released lock document
/// stays until MongoDB's TTL monitor deletes it.
pub const DEFAULT_RELEASE_MODE: ReleaseMode = ReleaseMode::Keep;

/// In [`ReleaseMode::Delete`], how old (by the server's clock) a lease's
/// fencing token must be before a release may delete its document: 1 s.
///
/// A token carries the server millisecond of its acquisition (`tok >> 20`),
/// and the first acquisition after a delete gets `ms($$NOW) * 2^20`. Deleting
/// only once `$$NOW` is at least this far past the token's millisecond makes
/// that next token greater, as long as the server's `$$NOW` does not step back
/// by this much between the delete and the next acquisition. Measured steps
/// back between concurrent writes to one document are up to 8 ms
/// (docs/mongodb-behaviour.md, B3); 1 s also covers the clock difference
/// between replica-set members across a failover when their clocks are
/// synchronised (NTP keeps them within milliseconds). A younger lease is
/// released as in [`ReleaseMode::Keep`] and its document is deleted once it
/// is this old.
pub const DELETE_MIN_TOKEN_AGE: Duration = Duration::from_secs(1);

/// What a release does with the lock document: see
/// [`LeaseManagerOptions::release_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ReleaseMode {
    /// The default: a release marks the document released (expiry moved to
    /// now, lease id removed) and keeps it; MongoDB's TTL monitor deletes it
    /// after the GC grace. The next acquisition continues from its fencing
    /// token, and a release that another manager waited for yields the key
    /// to it (see "Fairness between owners" in the crate docs).
    #[default]
    Keep,
    /// Compatibility mode, for collections shared with insert/delete clients
    /// (acquire = insert, duplicate key = held, release = delete): a release
    /// deletes the lock document, so such a client can lock the key at once.
    ///
    /// Fencing tokens stay strictly greater than every earlier token of the
    /// key: a document is deleted only once its token is
    /// [`DELETE_MIN_TOKEN_AGE`] old by the server's clock (see there for the
    /// assumption). A younger lease is marked released and its document
    /// deleted by the manager once old enough (never a new acquisition in
    /// between); until then an insert-style client still gets a
    /// duplicate-key error. A document whose token is ahead of the server's
    /// clock (after a failover to a member whose clock is behind) is left to
    /// the TTL monitor.
    ///
    /// Fairness between managers: a release that another mongo-lease manager
    /// waited for (the waiting mark, which insert-style clients never write)
    /// keeps the document and yields the key to that manager as in
    /// [`Keep`](ReleaseMode::Keep); the waiter normally takes it within
    /// milliseconds, and the waiter's own release deletes it. If nobody
    /// takes a yielded document, the TTL monitor deletes it after the GC grace.
    ///
    /// [`LeaseManager::force_release`](crate::LeaseManager::force_release)
    /// marks the lease released in both modes (the document stays until the
    /// TTL monitor deletes it, or until the next holder's release deletes it).
    Delete,
}

/// Longest accepted owner id, in bytes of UTF-8.
pub const MAX_OWNER_ID_LEN: usize = 256;

/// Options of a [`LeaseManager`](crate::LeaseManager), built with
/// [`LeaseManagerOptions::builder`]. Only `database` and `collection` are required.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use mongo_lease::{LeaseManager, LeaseManagerOptions};
///
/// # async fn demo(client: mongodb::Client) -> mongo_lease::Result<()> {
/// let options = LeaseManagerOptions::builder()
///     .database(client.database("app"))
///     .collection("workitem.lock")
///     .ttl(Duration::from_secs(20))
///     .build();
/// let manager = LeaseManager::connect(options).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, TypedBuilder)]
#[non_exhaustive]
pub struct LeaseManagerOptions {
    /// The database that holds the lock collection.
    ///
    /// The manager uses its own collection handle with majority write concern,
    /// majority read concern and primary reads, whatever the client's defaults:
    /// a lease acknowledged by only one member can be rolled back by a failover.
    pub database: Database,

    /// Name of the lock collection, e.g. `"workitem.lock"` beside a `workitem`
    /// collection whose documents are locked. Locking never modifies the locked
    /// documents themselves; the lock collection holds one document per key.
    #[builder(setter(into))]
    pub collection: String,

    /// This manager's owner id, stored as `aid` in every lease it holds.
    ///
    /// Default: a random UUID per manager. If you set it, it must be unique
    /// among live managers (two managers with one owner id cannot tell their
    /// leases apart in [`LeaseManager::release_all`](crate::LeaseManager::release_all)).
    /// Never use a web session id or anything secret: it is stored in clear in
    /// the database and shown by `mongo-lease list`.
    #[builder(default, setter(strip_option, into))]
    pub owner_id: Option<String>,

    /// Lease time-to-live. Default [`DEFAULT_TTL`]. A lease that is not renewed
    /// for this long (by the server's clock) can be taken over.
    #[builder(default = DEFAULT_TTL)]
    pub ttl: Duration,

    /// How often the heartbeat renews all held leases. Default: `ttl /`
    /// [`DEFAULT_HEARTBEAT_DIVISOR`]. Must be shorter than `ttl - safety_margin`.
    #[builder(default, setter(strip_option))]
    pub heartbeat_interval: Option<Duration>,

    /// How much earlier than the server-side expiry a holder is told its lease
    /// is lost when renewals cannot be confirmed. Default: `ttl /`
    /// [`DEFAULT_SAFETY_MARGIN_DIVISOR`].
    ///
    /// The local deadline of a lease is *start of the last confirmed renewal +
    /// ttl − safety_margin*, on the monotonic clock. It must cover the time the
    /// holder needs to stop its work and any difference in clock rate between
    /// this machine and the server.
    #[builder(default, setter(strip_option))]
    pub safety_margin: Option<Duration>,

    /// How far apart the clocks of the replica set's members may be: the
    /// most the server's clock (`$$NOW`, which decides expiry) may step
    /// forward or back between two writes, a failover to another member
    /// included. Default [`DEFAULT_CLOCK_SKEW`] (1 s), at most
    /// [`MAX_CLOCK_SKEW`] (1 s, which the fencing tokens assume).
    ///
    /// Every local deadline is this much earlier than the TTL and the
    /// safety margin alone give: after a failover to a member whose clock
    /// is ahead, every lease expires that much sooner in real time, before
    /// its holder hears of anything. So the local deadline of a lease is
    /// *send of its last confirmed write + ttl − safety_margin −
    /// clock_skew*, and `heartbeat_interval` must be shorter than *ttl −
    /// safety_margin − clock_skew*. Lower it (for leases of a few seconds)
    /// only where the members' clocks are known to stay that close (NTP
    /// keeps them within milliseconds), or on a single server, whose clock
    /// only steps when it is set.
    #[builder(default, setter(strip_option))]
    pub clock_skew: Option<Duration>,

    /// How long released or abandoned lock documents stay before MongoDB's TTL
    /// monitor deletes them. Default [`DEFAULT_GC_GRACE`]. Used only when the
    /// manager creates the TTL index; an existing TTL index on `exp` is kept.
    #[builder(default = DEFAULT_GC_GRACE)]
    pub gc_grace: Duration,

    /// Bound on each MongoDB operation and on [`LeaseManager::connect`](crate::LeaseManager::connect).
    /// Default [`DEFAULT_OPERATION_TIMEOUT`].
    #[builder(default = DEFAULT_OPERATION_TIMEOUT)]
    pub operation_timeout: Duration,

    /// First delay of a waiting acquire's jittered exponential backoff.
    /// Default [`DEFAULT_RETRY_INITIAL`].
    #[builder(default = DEFAULT_RETRY_INITIAL)]
    pub retry_initial: Duration,

    /// Longest delay of a waiting acquire's backoff; the delay is also capped by
    /// the holder's remaining lease time. Default [`DEFAULT_RETRY_MAX`].
    ///
    /// Also the yield window: after releasing a lease that another manager
    /// waited for, this manager cannot take the key back for this long, which
    /// gives a polling waiter time for its next retry.
    #[builder(default = DEFAULT_RETRY_MAX)]
    pub retry_max: Duration,

    /// Leases renewed per MongoDB command. Default [`DEFAULT_RENEWAL_BATCH_SIZE`].
    #[builder(default = DEFAULT_RENEWAL_BATCH_SIZE)]
    pub renewal_batch_size: usize,

    /// What a release does with the lock document. Default: chosen by
    /// [`connect`](crate::LeaseManager::connect) from the collection:
    /// [`ReleaseMode::Delete`] in a collection shared with other
    /// applications' lock clients (it holds a lock document of a layout
    /// `connect` recognises, or has a TTL index on `ts` or on `ExpireAt`, as
    /// their patterns create), so that a key released is free to their
    /// clients at once (docs/sharing.md); otherwise
    /// [`DEFAULT_RELEASE_MODE`] ([`ReleaseMode::Keep`]). Set it to fix the
    /// mode whatever the collection holds (e.g. `Keep` to use shared or
    /// semaphore leases in a shared collection). Applies to every release
    /// of this manager: explicit, on drop, after a lost deadline,
    /// [`release_all`](crate::LeaseManager::release_all), shutdown and
    /// [`release_owner`](crate::LeaseManager::release_owner).
    #[builder(default, setter(strip_option))]
    pub release_mode: Option<ReleaseMode>,

    /// The lock-delay, as Consul sessions have: after this manager ends
    /// another holder's live lease ([`force_release`](crate::LeaseManager::force_release),
    /// [`release_owner`](crate::LeaseManager::release_owner)), nobody is
    /// granted the key for this long, by the server's clock, so that the
    /// old holder, which learns of it only at its next renewal, has time
    /// to stop. Default: the [`safety_margin`](Self::safety_margin) (which
    /// is the old holder's too when the managers share their options).
    /// `Duration::ZERO` frees the key at once. At most [`MAX_LOCK_DELAY`].
    /// A delete or a rewrite of a lock document by another application
    /// cannot be delayed. See `docs/lock-delay.md`.
    #[builder(default, setter(strip_option))]
    pub lock_delay: Option<Duration>,

    /// Another application's lock document schema, when it shares the lock
    /// collection with a layout not recognised without it (docs/sharing.md
    /// lists those that are: `{_id, ts, aid}`, `{_id, value, ttl,
    /// obtained_at}`, `{_id, ExpireAt}`, a bare `{_id}`). Its locks are
    /// respected until they expire by its rule, then taken over; `connect`
    /// accepts a collection that holds them. Default: none.
    #[builder(default, setter(strip_option))]
    pub foreign_lock: Option<crate::foreign::ForeignLockRule>,

    /// Whether a lease taken away by someone else's write (a delete, a
    /// rewrite of its owner id or lease id, a force release) is noticed at
    /// once, within milliseconds, rather than at the next heartbeat.
    /// Default `false`.
    ///
    /// With `true`, the manager keeps a change stream of writes open while
    /// it holds any lease, and checks a held lease with a renewal as soon as
    /// a write may have taken it away. The price is on the server: it runs
    /// every open change stream over every write of the deployment, the
    /// other applications' included, so each such idle manager adds work to
    /// every write (100 of them cut an unrelated application's write rate
    /// to about half; see `docs/performance.md`, "Fleet").
    ///
    /// With `false`, the stream is open only while a key of this manager
    /// waits for another owner's lease (or a registration of its may be
    /// handed a lease): merely holding leases costs the server nothing per
    /// foreign write, and a lease taken away is noticed by the heartbeat's
    /// renewal, within one [`heartbeat_interval`](Self::heartbeat_interval).
    /// Either way a lease is never held locally past its local deadline.
    /// See `docs/performance.md`, "Loss detection".
    #[builder(default = false)]
    pub watch_held_leases: bool,
}

impl std::fmt::Debug for LeaseManagerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseManagerOptions")
            .field("database", &self.database.name())
            .field("collection", &self.collection)
            .field("owner_id", &self.owner_id)
            .field("ttl", &self.ttl)
            .field("heartbeat_interval", &self.heartbeat_interval)
            .field("safety_margin", &self.safety_margin)
            .field("clock_skew", &self.clock_skew)
            .field("gc_grace", &self.gc_grace)
            .field("operation_timeout", &self.operation_timeout)
            .field("release_mode", &self.release_mode)
            .field("lock_delay", &self.lock_delay)
            .field("foreign_lock", &self.foreign_lock)
            .field("watch_held_leases", &self.watch_held_leases)
            .finish_non_exhaustive()
    }
}

/// Validated timing settings shared by the actor and the store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Timing {
    pub ttl: Duration,
    pub heartbeat_interval: Duration,
    pub safety_margin: Duration,
    /// [`LeaseManagerOptions::clock_skew`]: taken off every local deadline
    /// besides the safety margin.
    pub clock_skew: Duration,
    pub operation_timeout: Duration,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub renewal_batch_size: usize,
    pub release_mode: ReleaseMode,
    /// The `expireAfterSeconds` of another application's TTL index on `ts`,
    /// when shorter than the TTL: MongoDB may delete a lease that long after
    /// its last renewal, so the local deadline uses it instead of the TTL
    /// (found by `connect`; see `src/store/mongo/prepare.rs`).
    pub ttl_cap: Option<Duration>,
    /// [`LeaseManagerOptions::watch_held_leases`]: the stream of writes
    /// stays open while a lease is held.
    pub watch_held_leases: bool,
    /// How long a key stays on the general forms after one was sent for
    /// it ([`CONTENDED_FOR`](crate::config::CONTENDED_FOR)
    /// for every manager; shorter in some simulated managers).
    pub contended_for: Duration,
}

impl Timing {
    /// The time a lease stays safe after the start of a confirmed renewal:
    /// the effective TTL minus the safety margin and the clock skew
    /// (`prepare` refuses a cap not longer than the heartbeat interval plus
    /// both).
    #[cfg(test)]
    pub fn local_validity(&self) -> Duration {
        self.validity_for(self.ttl)
    }

    /// [`Timing::local_validity`] of a lease with its own TTL `ttl`:
    /// `min(ttl, ttl_cap) − safety_margin − clock_skew`.
    pub fn validity_for(&self, ttl: Duration) -> Duration {
        self.ttl_cap
            .map_or(ttl, |cap| cap.min(ttl))
            .saturating_sub(self.unsafe_time())
    }

    /// What every local deadline keeps short of the server's expiry: the
    /// safety margin and the clock skew.
    pub fn unsafe_time(&self) -> Duration {
        self.safety_margin + self.clock_skew
    }
}

/// The options of one acquisition, as its request ([`Acquire`](crate::Acquire))
/// set them; each is documented on the request's method of the same name.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct AcquireOptions {
    pub(crate) ttl: Option<Duration>,
    pub(crate) kind: crate::kind::LeaseKind,
    pub(crate) hold_at_least: Option<Duration>,
    pub(crate) caller: Option<crate::caller::CallerId>,
    pub(crate) reentrant: bool,
    pub(crate) hold_at_most: Option<Duration>,
    pub(crate) payload: Option<mongodb::bson::Document>,
    /// [`Acquire::permits`](crate::Acquire::permits).
    pub(crate) permits_taken: Option<u32>,
}

fn invalid(reason: impl Into<String>) -> Error {
    Error::InvalidConfig {
        reason: reason.into(),
    }
}

impl Timing {
    /// The kind and minimum hold of a lease acquired with `options`, checked
    /// before any round trip (see [`Acquire::shared`] and
    /// [`Acquire::hold_at_least`]).
    pub(crate) fn lease_shape(&self, options: &AcquireOptions) -> Result<LeaseShape> {
        options.kind.validate()?;
        if options.reentrant && options.caller.is_none() {
            return Err(invalid(
                "reentrant needs a caller id (Acquire::caller): re-entry is by the same caller",
            ));
        }
        let shape = LeaseShape {
            kind: options.kind,
            hold_at_least: options.hold_at_least,
            permits_taken: options.permits_taken,
        };
        if let Some(at_most) = options.hold_at_most {
            self.check_hold_at_most(options, at_most)?;
        }
        if options.payload.is_some() && options.kind != LeaseKind::Exclusive {
            return Err(invalid(format!(
                "a payload with the acquisition applies to exclusive leases only, not to {} leases",
                options.kind
            )));
        }
        if let Some(taken) = shape.permits_taken {
            match options.kind {
                LeaseKind::Permit { permits } if (1..=permits).contains(&taken) => {}
                LeaseKind::Permit { permits } => {
                    return Err(invalid(format!(
                        "a lease takes 1 to {permits} permits of a semaphore of {permits}, \
                         not {taken}"
                    )));
                }
                kind => {
                    return Err(invalid(format!(
                        "permits(n) applies to a semaphore's permits, not to {kind} leases"
                    )));
                }
            }
        }
        if let Some(at_least) = shape.hold_at_least {
            if options.kind != LeaseKind::Exclusive {
                return Err(invalid(format!(
                    "hold_at_least applies to exclusive leases only, not to {} leases",
                    options.kind
                )));
            }
            if at_least < Duration::from_millis(1) {
                return Err(invalid(format!(
                    "hold_at_least must be at least 1 ms, got {at_least:?}"
                )));
            }
            if at_least.as_millis() > i64::MAX as u128 / 2 {
                return Err(invalid(format!("hold_at_least is too long: {at_least:?}")));
            }
            if let Some(cap) = self.ttl_cap.filter(|cap| at_least > *cap) {
                return Err(invalid(format!(
                    "hold_at_least ({at_least:?}) is longer than the TTL index on `ts` \
                     ({cap:?}), which would delete the key's document before then"
                )));
            }
        }
        if !shape.is_plain() && self.release_mode != ReleaseMode::Keep {
            return Err(invalid(
                "shared and semaphore leases and hold_at_least need ReleaseMode::Keep \
                 (a release in delete mode deletes the key's document; connect chooses \
                 delete mode in a collection shared with other lock clients unless \
                 LeaseManagerOptions::release_mode is set)",
            ));
        }
        Ok(shape)
    }

    /// The TTL of a lease acquired with `options`, checked before any round
    /// trip (see [`Acquire::ttl`]).
    pub(crate) fn lease_ttl(&self, options: &AcquireOptions) -> Result<Duration> {
        if let Some(at_most) = options.hold_at_most {
            self.check_hold_at_most(options, at_most)?;
            return Ok(at_most);
        }
        match options.ttl {
            Some(ttl) => self.renewed_ttl(ttl),
            None => Ok(self.ttl),
        }
    }

    /// Checks `at_most`, the [`Acquire::hold_at_most`] of `options`.
    fn check_hold_at_most(&self, options: &AcquireOptions, at_most: Duration) -> Result<()> {
        if options.ttl.is_some() {
            return Err(invalid(
                "give ttl or hold_at_most, not both: a lease held at most a duration \
                 is not renewed, and that duration is its TTL",
            ));
        }
        if at_most < Duration::from_millis(10) || at_most <= self.unsafe_time() {
            return Err(invalid(format!(
                "hold_at_most ({at_most:?}) must be at least 10 ms and longer than the \
                 manager's safety_margin ({:?}) plus its clock_skew ({:?})",
                self.safety_margin, self.clock_skew
            )));
        }
        if at_most.as_millis() > i64::MAX as u128 / 2 {
            return Err(invalid(format!("hold_at_most is too long: {at_most:?}")));
        }
        if let Some(at_least) = options.hold_at_least.filter(|l| *l > at_most) {
            return Err(invalid(format!(
                "hold_at_least ({at_least:?}) is longer than hold_at_most ({at_most:?})"
            )));
        }
        Ok(())
    }

    /// Checks `ttl`, the TTL of a lease the heartbeat renews (at its
    /// acquisition, [`Acquire::ttl`], or later,
    /// [`Lease::set_ttl`](crate::Lease::set_ttl)).
    pub(crate) fn renewed_ttl(&self, ttl: Duration) -> Result<Duration> {
        if ttl < Duration::from_millis(10) {
            return Err(invalid(format!(
                "the lease's ttl must be at least 10 ms, got {ttl:?}"
            )));
        }
        if ttl.as_millis() > i64::MAX as u128 / 2 {
            return Err(invalid(format!("the lease's ttl is too long: {ttl:?}")));
        }
        if self.heartbeat_interval >= ttl.saturating_sub(self.unsafe_time()) {
            return Err(invalid(format!(
                "the lease's ttl ({ttl:?}) minus the manager's safety_margin ({:?}) and \
                 clock_skew ({:?}) must be longer than the manager's heartbeat_interval \
                 ({:?}), or the lease expires between renewals",
                self.safety_margin, self.clock_skew, self.heartbeat_interval
            )));
        }
        Ok(ttl)
    }
}

impl LeaseManagerOptions {
    /// Checks the options and resolves defaults that depend on the TTL.
    pub(crate) fn timing(&self) -> Result<Timing> {
        let ttl = self.ttl;
        if ttl < Duration::from_millis(10) {
            return Err(invalid(format!("ttl must be at least 10 ms, got {ttl:?}")));
        }
        if ttl.as_millis() > i64::MAX as u128 / 2 {
            return Err(invalid(format!("ttl is too long: {ttl:?}")));
        }
        let safety_margin = self
            .safety_margin
            .unwrap_or(ttl / DEFAULT_SAFETY_MARGIN_DIVISOR);
        if safety_margin >= ttl {
            return Err(invalid(format!(
                "safety_margin ({safety_margin:?}) must be shorter than ttl ({ttl:?})"
            )));
        }
        let clock_skew = self.clock_skew.unwrap_or(DEFAULT_CLOCK_SKEW);
        if clock_skew > MAX_CLOCK_SKEW {
            return Err(invalid(format!(
                "clock_skew ({clock_skew:?}) must be at most {MAX_CLOCK_SKEW:?}: the fencing \
                 tokens assume the members' clocks that close"
            )));
        }
        let heartbeat_interval = self
            .heartbeat_interval
            .unwrap_or(ttl / DEFAULT_HEARTBEAT_DIVISOR);
        if heartbeat_interval.is_zero() {
            return Err(invalid("heartbeat_interval must be greater than zero"));
        }
        let valid = ttl.saturating_sub(safety_margin + clock_skew);
        if heartbeat_interval >= valid {
            return Err(invalid(format!(
                "heartbeat_interval ({heartbeat_interval:?}) must be shorter than ttl - \
                 safety_margin - clock_skew ({valid:?}), or leases expire between renewals \
                 (for a TTL of a few seconds, lower clock_skew, 1 s by default, if the \
                 members' clocks are that close)"
            )));
        }
        if self.operation_timeout.is_zero() {
            return Err(invalid("operation_timeout must be greater than zero"));
        }
        if self.retry_initial.is_zero() || self.retry_max < self.retry_initial {
            return Err(invalid(format!(
                "need 0 < retry_initial ({:?}) <= retry_max ({:?})",
                self.retry_initial, self.retry_max
            )));
        }
        if self.renewal_batch_size == 0 {
            return Err(invalid("renewal_batch_size must be at least 1"));
        }
        if self.collection.is_empty()
            || self.collection.contains('$')
            || self.collection.contains('\0')
        {
            return Err(invalid(format!(
                "collection name {:?} is not valid (empty, or contains '$' or NUL)",
                self.collection
            )));
        }
        if let Some(owner) = &self.owner_id {
            validate_owner_id(owner)?;
        }
        Ok(Timing {
            ttl,
            heartbeat_interval,
            safety_margin,
            clock_skew,
            operation_timeout: self.operation_timeout,
            retry_initial: self.retry_initial,
            retry_max: self.retry_max,
            renewal_batch_size: self.renewal_batch_size,
            release_mode: self.release_mode.unwrap_or(DEFAULT_RELEASE_MODE),
            ttl_cap: None,
            watch_held_leases: self.watch_held_leases,
            contended_for: CONTENDED_FOR,
        })
    }
}

/// How long a key stays on the general forms after one was sent for it
/// (the actor's memory, `Actor::contended`: a contended key costs no light
/// write that would not apply): every manager's `Timing::contended_for`.
/// The simulation also runs shorter ones, in proportion to its shorter
/// TTL.
pub(crate) const CONTENDED_FOR: Duration = Duration::from_secs(10);

/// The longest [`LeaseManagerOptions::lock_delay`](field@LeaseManagerOptions::lock_delay): one hour.
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(3600);

impl LeaseManagerOptions {
    /// The lock-delay of this manager: [`LeaseManagerOptions::lock_delay`](field@LeaseManagerOptions::lock_delay),
    /// or `timing`'s safety margin. An error above [`MAX_LOCK_DELAY`].
    pub(crate) fn lock_delay(&self, timing: &Timing) -> Result<Duration> {
        let delay = self.lock_delay.unwrap_or(timing.safety_margin);
        if delay > MAX_LOCK_DELAY {
            return Err(invalid(format!(
                "lock_delay ({delay:?}) must be at most {MAX_LOCK_DELAY:?}"
            )));
        }
        Ok(delay)
    }
}

pub(crate) fn validate_owner_id(owner: &str) -> Result<()> {
    if owner.is_empty() || owner.len() > MAX_OWNER_ID_LEN {
        return Err(invalid(format!(
            "owner_id must be 1 to {MAX_OWNER_ID_LEN} bytes, got {} bytes",
            owner.len()
        )));
    }
    Ok(())
}
