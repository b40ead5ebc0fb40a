//! [`Semaphore`]: a key with `N` permits, shared by every process that uses
//! the lock collection.
//!
//! A thin layer over the manager's [`Acquire`] with [`LeaseKind::Permit`]: each permit is a [`Lease`](crate::Lease) like any other (renewed
//! by the manager's batched heartbeat, with a fencing token, a lost-lease
//! token and an owner-checked release); see [`LeaseKind`](crate::LeaseKind) for the rules
//! between kinds on one key.

use std::fmt;

use crate::config::AcquireOptions;
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::kind::{LeaseKind, PermitsChange};
use crate::manager::LeaseManager;
use crate::request::{Acquire, NoWait};

/// A counting semaphore on one key: at most [`permits`](Semaphore::permits)
/// permits taken at a time, across every manager (process) that uses the
/// lock collection; a lease takes one permit, or several at once
/// ([`Acquire::permits`]). Made by [`Semaphore::new`]; cheap to clone
/// (clones talk to the same manager).
///
/// Each permit is a [`Lease`](crate::Lease) of kind [`LeaseKind::Permit`]
/// (see there for the rules between kinds): a permit of a crashed process
/// comes back after its TTL, as in Redisson's `RPermitExpirableSemaphore`.
/// Acquiring a free permit is one MongoDB round trip.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
/// // At most three exports run at a time, across all processes.
/// let exports = mongo_lease::Semaphore::new(&manager, "exports", 3)?;
/// let permit = exports.acquire().await?;
/// tokio::select! {
///     _ = permit.status().lost() => eprintln!("permit lost: stop"),
///     _ = run_export(permit.fencing_token()) => {}
/// }
/// permit.release().await?;
/// # Ok(()) }
/// # async fn run_export(_fencing_token: u64) {}
/// ```
#[derive(Clone)]
pub struct Semaphore {
    manager: LeaseManager,
    key: LeaseKey,
    permits: u32,
}

impl Semaphore {
    /// A semaphore of `permits` permits on `key`, acquired through
    /// `manager`. Sends nothing: the key's document is written by the first
    /// acquisition.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] for a key MongoDB refuses as `_id` (see
    /// [`LeaseManager::acquire`]); [`Error::InvalidConfig`] for 0 permits,
    /// more than [`MAX_PERMITS`](crate::MAX_PERMITS), or a manager in
    /// [`ReleaseMode::Delete`](crate::ReleaseMode::Delete) (a release there
    /// deletes the key's document, which holds every permit).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// let pool = mongo_lease::Semaphore::new(&manager, "db-migrations-pool", 2)?;
    /// assert_eq!(pool.permits(), 2);
    /// # Ok(()) }
    /// ```
    pub fn new(
        manager: &LeaseManager,
        key: impl Into<LeaseKey>,
        permits: u32,
    ) -> Result<Semaphore> {
        let key = key.into();
        key.validate()?;
        let options = AcquireOptions {
            kind: LeaseKind::Permit { permits },
            ..AcquireOptions::default()
        };
        manager.check_shape(&options)?;
        Ok(Semaphore {
            manager: manager.clone(),
            key,
            permits,
        })
    }

    /// The key whose permits this semaphore hands out.
    pub fn key(&self) -> &LeaseKey {
        &self.key
    }

    /// How many holders the key admits at a time.
    pub fn permits(&self) -> u32 {
        self.permits
    }

    /// The kind of the leases this semaphore hands out:
    /// `LeaseKind::Permit { permits }`.
    pub fn kind(&self) -> LeaseKind {
        LeaseKind::Permit {
            permits: self.permits,
        }
    }

    /// Acquires a permit, waiting as long as it takes (Redisson's
    /// `RSemaphore::acquire`): a request ([`Acquire`]; several permits at
    /// once with [`Acquire::permits`], a TTL with [`Acquire::ttl`]). The
    /// permit is a [`Lease`](crate::Lease) whose [`kind`](crate::Lease::kind) is
    /// `LeaseKind::Permit { permits }`, with the manager's TTL by default.
    ///
    /// # Errors
    ///
    /// [`Error::KindMismatch`] if the key is held as something else
    /// (another number of permits, shared leases, an exclusive lease or its
    /// [`hold_at_least`](Acquire::hold_at_least)); otherwise as
    /// [`LeaseManager::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire`]: dropping the future removes
    /// the waiter, and a permit granted at that moment is released. To wait
    /// at most a given time:
    ///
    /// ```no_run
    /// # async fn demo(exports: mongo_lease::Semaphore) -> mongo_lease::Result<()> {
    /// use std::time::Duration;
    ///
    /// if let Ok(permit) = tokio::time::timeout(Duration::from_secs(5), exports.acquire()).await {
    ///     permit?.release().await?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn acquire(&self) -> Acquire<'_> {
        Acquire::new(&self.manager, self.key.clone(), self.kind())
    }

    /// One attempt: a permit if one is free now, `Ok(None)` if they are all
    /// held (or local callers already wait for one: a try never jumps the
    /// queue). At most one MongoDB round trip (Redisson's
    /// `RSemaphore::tryAcquire()`).
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire`], and database errors ([`Error::Database`],
    /// [`Error::Unreachable`]) when the attempt's outcome could not be
    /// established.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Semaphore::acquire`].
    pub fn try_acquire(&self) -> Acquire<'_, LeaseKey, NoWait> {
        Acquire::new(&self.manager, self.key.clone(), self.kind())
    }

    /// Changes the semaphore's number of permits to `permits`, for every
    /// process, if its live holders take no more than that (Redisson's
    /// `RSemaphore::trySetPermits`/`addPermits`, Curator's
    /// `SharedCount`-based resizing), in one conditional write of the key's
    /// document; this handle asks for `permits` from then on (its
    /// [`permits`](Semaphore::permits)), also if nothing is held.
    ///
    /// The answer is a [`PermitsChange`]. Once the number is set, the
    /// permits held keep their leases (and count against it), and every
    /// waiter tries again at once: those still asking for the old number
    /// fail with [`Error::KindMismatch`] naming the new one.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for 0 or more than
    /// [`MAX_PERMITS`](crate::MAX_PERMITS) permits, before anything is sent;
    /// [`Error::KindMismatch`] if the key is held as another kind (shared,
    /// exclusive, or its minimum hold); [`Error::Shutdown`], and database
    /// errors (the outcome is then unknown: the write is idempotent, call
    /// it again).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: dropping the future may leave the number changed
    /// on the server while this handle keeps the old one.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// use mongo_lease::PermitsChange;
    ///
    /// let mut pool = mongo_lease::Semaphore::new(&manager, "encoders", 4)?;
    /// match pool.set_permits(8).await? {
    ///     PermitsChange::TooManyHeld { held } => println!("{held} in use, try later"),
    ///     _ => assert_eq!(pool.permits(), 8),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn set_permits(&mut self, permits: u32) -> Result<PermitsChange> {
        LeaseKind::Permit { permits }.validate()?;
        let change = self
            .manager
            .set_permits_of(self.key.clone(), permits)
            .await?;
        if !matches!(change, PermitsChange::TooManyHeld { .. }) {
            self.permits = permits;
        }
        Ok(change)
    }

    /// How many permits are free now, by the server's clock (one round
    /// trip; 0 while a foreign holder's lock holds the key): a snapshot, so
    /// use [`Semaphore::try_acquire`] to take one.
    ///
    /// # Errors
    ///
    /// [`Error::KindMismatch`] as for [`Semaphore::acquire`];
    /// [`Error::Shutdown`] and database errors.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe (a read).
    pub async fn available(&self) -> Result<u32> {
        let info = self.manager.inspect(self.key.clone()).await?;
        free_permits(self.permits, info.as_ref())
    }
}

/// The free permits of a semaphore of `permits`, as read in `info`
/// (`None`: no document): what [`Semaphore::available`] returns.
fn free_permits(permits: u32, info: Option<&LeaseInfo>) -> Result<u32> {
    let Some(info) = info else {
        return Ok(permits);
    };
    if info.foreign {
        return Ok(0);
    }
    let requested = LeaseKind::Permit { permits };
    let stored = match info.kind {
        LeaseKind::Exclusive if info.held || info.hold_until.is_some() => LeaseKind::Exclusive,
        LeaseKind::Exclusive => return Ok(permits),
        _ if info.holders.is_empty() => return Ok(permits),
        kind if kind == requested => {
            let held: u32 = info.holders.iter().map(|h| h.permits).sum();
            return Ok(permits.saturating_sub(held));
        }
        kind => kind,
    };
    Err(Error::KindMismatch { stored, requested })
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("key", &self.key)
            .field("permits", &self.permits)
            .field("owner_id", &self.manager.owner_id())
            .finish()
    }
}

#[cfg(test)]
mod tests;
