//! Options of a [`LeaseManager`](crate::LeaseManager), their defaults and validation.

use std::time::Duration;

use mongodb::Database;
use typed_builder::TypedBuilder;

use crate::error::{Error, Result};
use crate::kind::{LeaseKind, LeaseShape};

/// Default lease time-to-live: 30 s. Choose a TTL well above your
/// deployment's failover time (docs/reliability.md).
pub const DEFAULT_TTL: Duration = Duration::from_secs(30);

/// The default heartbeat interval is the TTL divided by this (10 s for the default TTL):
/// two renewals can fail before a lease is at risk.
pub const DEFAULT_HEARTBEAT_DIVISOR: u32 = 3;

/// The default safety margin is the TTL divided by this (3 s for the default TTL).
pub const DEFAULT_SAFETY_MARGIN_DIVISOR: u32 = 10;

/// Default [`LeaseManagerOptions::clock_skew`]: 1 s, the [`MAX_CLOCK_SKEW`].
pub const DEFAULT_CLOCK_SKEW: Duration = Duration::from_secs(1);

/// The longest accepted [`LeaseManagerOptions::clock_skew`]: 1 s, as the
/// fencing tokens assume ([`DELETE_MIN_TOKEN_AGE`]).
pub const MAX_CLOCK_SKEW: Duration = DELETE_MIN_TOKEN_AGE;

/// Default time an abandoned or released lock document stays in the collection
/// after its expiry before MongoDB's TTL monitor deletes it: 60 s.
pub const DEFAULT_GC_GRACE: Duration = Duration::from_secs(60);

/// Default bound on a single MongoDB operation, and on
/// [`LeaseManager::connect`](crate::LeaseManager::connect): 10 s.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// Default first retry delay of a waiter's backoff against MongoDB: 10 ms.
pub const DEFAULT_RETRY_INITIAL: Duration = Duration::from_millis(10);

/// Default longest retry delay of a waiter's backoff against MongoDB: 1 s.
pub const DEFAULT_RETRY_MAX: Duration = Duration::from_secs(1);

/// Default number of leases renewed by one MongoDB command: 5 000, about
/// 0.11 s of `updateMany` on MongoDB 6.0 (docs/performance.md). A heartbeat
/// sends one batch at a time, the next once it is answered.
pub const DEFAULT_RENEWAL_BATCH_SIZE: usize = 5_000;

/// Default [`ReleaseMode`]: [`ReleaseMode::Keep`].
pub const DEFAULT_RELEASE_MODE: ReleaseMode = ReleaseMode::Keep;

/// In [`ReleaseMode::Delete`], how old (by the server's clock) a lease's
/// fencing token must be before a release may delete its document: 1 s.
///
/// Deleting only then keeps the next token greater, as long as the
/// server's clock does not step back by this much (docs/safety.md). A
/// younger lease is released as in [`ReleaseMode::Keep`] and its document
/// deleted once it is this old.
pub const DELETE_MIN_TOKEN_AGE: Duration = Duration::from_secs(1);

/// What a release does with the lock document: see
/// [`LeaseManagerOptions::release_mode`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum ReleaseMode {
    /// The default: a release marks the document released and keeps it;
    /// MongoDB's TTL monitor deletes it after the GC grace. The next
    /// acquisition continues from its fencing token.
    #[default]
    Keep,
    /// Compatibility mode, for collections shared with insert/delete clients
    /// (acquire = insert, duplicate key = held, release = delete): a release
    /// deletes the lock document, so such a client can lock the key at once.
    ///
    /// A document is deleted only once its token is [`DELETE_MIN_TOKEN_AGE`]
    /// old; a release that another mongo-lease manager waited for, and a
    /// force release, keep it as in [`Keep`](ReleaseMode::Keep) (docs/sharing.md).
    Delete,
}

/// Shortest accepted TTL of a lease: 10 ms.
const MIN_TTL: Duration = Duration::from_millis(10);

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
    /// The database that holds the lock collection. The manager uses
    /// majority write and read concerns and primary reads, whatever the
    /// client's defaults.
    pub database: Database,

    /// Name of the lock collection, e.g. `"workitem.lock"` beside a `workitem`
    /// collection whose documents are locked: one document per key.
    #[builder(setter(into))]
    pub collection: String,

    /// This manager's owner id, stored as `aid` in every lease it holds.
    ///
    /// Default: a random UUID per manager. If you set it, it must be unique
    /// among live managers, and never secret (it is stored in clear).
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
    /// is lost when renewals cannot be confirmed
    /// ([`LeaseStatus::deadline`](crate::LeaseStatus::deadline)): the time the
    /// holder needs to stop, and any difference in clock rate with the
    /// server. Default: `ttl /` [`DEFAULT_SAFETY_MARGIN_DIVISOR`].
    #[builder(default, setter(strip_option))]
    pub safety_margin: Option<Duration>,

    /// How far apart the clocks of the replica set's members may be: the
    /// most the server's clock (`$$NOW`) may step between two writes, a
    /// failover included. Every local deadline is this much earlier, and
    /// `heartbeat_interval` must be shorter than *ttl − safety_margin −
    /// clock_skew*. Default [`DEFAULT_CLOCK_SKEW`], at most
    /// [`MAX_CLOCK_SKEW`]; lower it only where the members' clocks are known
    /// to stay that close, or on a single server.
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

    /// What every release of this manager does with the lock document.
    /// Default: [`ReleaseMode::Delete`] in a collection
    /// [`connect`](crate::LeaseManager::connect) finds shared with other
    /// applications' lock clients (docs/sharing.md), otherwise
    /// [`DEFAULT_RELEASE_MODE`]. Set it to fix the mode whatever the
    /// collection holds.
    #[builder(default, setter(strip_option))]
    pub release_mode: Option<ReleaseMode>,

    /// The lock-delay: after this manager ends another holder's live lease
    /// ([`force_release`](crate::LeaseManager::force_release),
    /// [`release_owner`](crate::LeaseManager::release_owner)), nobody is
    /// granted the key for this long, by the server's clock
    /// (`docs/lock-delay.md`). Default: the
    /// [`safety_margin`](Self::safety_margin). At most [`MAX_LOCK_DELAY`].
    #[builder(default, setter(strip_option))]
    pub lock_delay: Option<Duration>,

    /// Another application's lock document schema, when it shares the lock
    /// collection with a layout not recognised without it (docs/sharing.md).
    /// Its locks are respected until they expire by its rule, then taken
    /// over. Default: none.
    #[builder(default, setter(strip_option))]
    pub foreign_lock: Option<crate::foreign::ForeignLockRule>,

    /// Whether a lease taken away by someone else's write (a delete, a
    /// rewrite of its owner id or lease id, a force release) is noticed at
    /// once, within milliseconds, rather than at the next heartbeat.
    /// Default `false`.
    ///
    /// With `true`, the manager keeps a change stream of writes open while
    /// it holds any lease, which costs the server work on every write of
    /// the deployment (`docs/performance.md`, "Fleet").
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
    pub clock_skew: Duration,
    pub operation_timeout: Duration,
    pub retry_initial: Duration,
    pub retry_max: Duration,
    pub renewal_batch_size: usize,
    pub release_mode: ReleaseMode,
    /// The `expireAfterSeconds` of another application's TTL index on `ts`,
    /// when shorter than the TTL: the local deadline uses it instead.
    pub ttl_cap: Option<Duration>,
    pub watch_held_leases: bool,
    /// [`CONTENDED_FOR`], shorter in some simulated managers.
    pub contended_for: Duration,
}

impl Timing {
    /// The time a lease stays safe after the start of a confirmed renewal.
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

/// Checks that `value` (named `what`) is at least `min`, and short enough
/// for the server's date arithmetic.
fn check_span(what: &str, value: Duration, min: Duration) -> Result<()> {
    if value < min {
        return Err(invalid(format!(
            "{what} must be at least {min:?}, got {value:?}"
        )));
    }
    if value.as_millis() > i64::MAX as u128 / 2 {
        return Err(invalid(format!("{what} is too long: {value:?}")));
    }
    Ok(())
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
            check_span("hold_at_least", at_least, Duration::from_millis(1))?;
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
    /// trip (see [`Acquire::ttl`] and [`Acquire::hold_at_most`]).
    pub(crate) fn lease_ttl(&self, options: &AcquireOptions) -> Result<Duration> {
        let Some(at_most) = options.hold_at_most else {
            return options
                .ttl
                .map_or(Ok(self.ttl), |ttl| self.renewed_ttl(ttl));
        };
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
        check_span("hold_at_most", at_most, Duration::ZERO)?;
        if let Some(at_least) = options.hold_at_least.filter(|l| *l > at_most) {
            return Err(invalid(format!(
                "hold_at_least ({at_least:?}) is longer than hold_at_most ({at_most:?})"
            )));
        }
        Ok(at_most)
    }

    /// Checks `ttl`, the TTL of a lease the heartbeat renews (at its
    /// acquisition, [`Acquire::ttl`], or later,
    /// [`Lease::set_ttl`](crate::Lease::set_ttl)).
    pub(crate) fn renewed_ttl(&self, ttl: Duration) -> Result<Duration> {
        check_span("the lease's ttl", ttl, MIN_TTL)?;
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
        check_span("ttl", ttl, MIN_TTL)?;
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
        if self.collection.is_empty() || self.collection.contains(['$', '\0']) {
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

/// How long a key stays on the general forms after one was sent for it
/// (`Actor::contended`).
pub(crate) const CONTENDED_FOR: Duration = Duration::from_secs(10);

/// The longest [`LeaseManagerOptions::lock_delay`](field@LeaseManagerOptions::lock_delay): one hour.
pub const MAX_LOCK_DELAY: Duration = Duration::from_secs(3600);

pub(crate) fn validate_owner_id(owner: &str) -> Result<()> {
    if owner.is_empty() || owner.len() > MAX_OWNER_ID_LEN {
        return Err(invalid(format!(
            "owner_id must be 1 to {MAX_OWNER_ID_LEN} bytes, got {} bytes",
            owner.len()
        )));
    }
    Ok(())
}
