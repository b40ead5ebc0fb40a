//! [`Semaphore`]: a key with `N` permits, shared by every process that uses
//! the lock collection.

use crate::config::AcquireOptions;
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::kind::{LeaseKind, PermitsChange};
use crate::manager::LeaseManager;
use crate::request::{Acquire, NoWait};

/// A counting semaphore on one key: at most [`permits`](Semaphore::permits)
/// permits taken at a time, across every manager (process) that uses the
/// lock collection. Cheap to clone. Each permit is a [`Lease`](crate::Lease)
/// of kind [`LeaseKind::Permit`] (which has the rules between kinds), so a
/// permit of a crashed process comes back after its TTL.
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
#[derive(Clone, Debug)]
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
    /// [`Error::InvalidKey`] for a key [`LeaseKey`] refuses;
    /// [`Error::InvalidConfig`] for 0 permits, more than
    /// [`MAX_PERMITS`](crate::MAX_PERMITS), or a manager in
    /// [`ReleaseMode::Delete`](crate::ReleaseMode::Delete).
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

    /// Acquires a permit, waiting as long as it takes: a request
    /// ([`Acquire`]; several permits at once with [`Acquire::permits`]).
    ///
    /// # Errors
    ///
    /// [`Error::KindMismatch`] if the key is held as something else
    /// (another number of permits, shared leases, an exclusive lease or its
    /// minimum hold); otherwise as [`LeaseManager::acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire`]:
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
    /// held, as [`LeaseManager::try_acquire`] answers.
    ///
    /// # Errors
    ///
    /// As [`Semaphore::acquire`] and [`LeaseManager::try_acquire`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Semaphore::acquire`].
    pub fn try_acquire(&self) -> Acquire<'_, LeaseKey, NoWait> {
        Acquire::new(&self.manager, self.key.clone(), self.kind())
    }

    /// Changes the semaphore's number of permits to `permits`, for every
    /// process, if its live holders take no more than that
    /// ([`PermitsChange`]); this handle asks for `permits` from then on
    /// unless too many are held, and waiters asking for the old number fail
    /// with [`Error::KindMismatch`].
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for 0 or more than
    /// [`MAX_PERMITS`](crate::MAX_PERMITS) permits, before anything is sent;
    /// [`Error::KindMismatch`] as for [`Semaphore::acquire`];
    /// [`Error::Shutdown`], and database errors (the outcome is then
    /// unknown: the write is idempotent, call it again).
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
    /// trip; 0 while a foreign holder's lock holds the key, and while a
    /// lock-delay lasts, [`LeaseInfo::lock_delay_until`]: no acquisition
    /// can take a permit before its end).
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
    // An acquisition during a lock-delay is answered held, whatever its
    // kind (docs/lock-delay.md).
    if info.foreign || info.lock_delay_until.is_some() {
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

#[cfg(test)]
mod tests;
