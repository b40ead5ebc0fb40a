//! The shared side of a read/write key: [`LeaseManager::acquire_shared`] and
//! its timeout and try variants. The exclusive side is a plain
//! [`LeaseManager::acquire`] of the same key.
//!
//! A thin layer over [`LeaseManager::acquire_with`] with
//! [`LeaseKind::Shared`]; see [`LeaseKind`](crate::LeaseKind) for the rules between kinds.

use crate::config::AcquireOptions;
use crate::error::Result;
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::lease::Lease;
use crate::manager::LeaseManager;

/// The options of a shared lease with the manager's TTL.
fn shared() -> AcquireOptions {
    AcquireOptions::builder().kind(LeaseKind::Shared).build()
}

impl LeaseManager {
    /// Acquires `key` shared, waiting as long as it takes: the shared
    /// (read) side of a read/write key, whose exclusive (write) side is
    /// [`LeaseManager::acquire`] on the same key. Any number of shared
    /// leases, in any processes, hold the key at once; an exclusive lease
    /// excludes them all. The lease's [`kind`](Lease::kind) is
    /// [`LeaseKind::Shared`]; it is renewed, fenced (each shared holder gets
    /// its own fencing token, greater than every earlier one on the key) and
    /// lost like an exclusive lease.
    ///
    /// **Writer preference.** An exclusive acquirer that waits for shared
    /// holders marks the key, and while its mark is live no new shared
    /// acquisition succeeds (they wait, and `try_acquire_shared` returns
    /// `None`): the shared holders drain and the exclusive waiter gets the
    /// key however many shared acquirers keep arriving. The mark expires
    /// with the exclusive waiter's TTL if it stops waiting. This is the
    /// writer preference of Redisson's `RReadWriteLock` and of
    /// square/mongo-lock's shared locks.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`](crate::Error::InvalidKey) as
    /// [`LeaseManager::acquire`]; [`Error::InvalidConfig`](crate::Error::InvalidConfig)
    /// for a manager in [`ReleaseMode::Delete`](crate::ReleaseMode::Delete)
    /// (before anything is sent);
    /// [`Error::KindMismatch`](crate::Error::KindMismatch) if the key is
    /// held as permits of a semaphore (nothing is written; once every
    /// permit is free, the key takes any kind again; a key held by an
    /// exclusive lease is waited for);
    /// [`Error::Shutdown`](crate::Error::Shutdown) once the manager has
    /// shut down.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire`]: [`tokio::time::timeout`]
    /// over it waits at most a given time.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// use std::time::Duration;
    ///
    /// // Readers of the catalogue share it (here waiting at most 5 s)...
    /// let read = tokio::time::timeout(Duration::from_secs(5), manager.acquire_shared("catalogue"))
    ///     .await
    ///     .expect("the catalogue is written for longer than 5 s")?;
    /// read.release().await?;
    /// // ...and a writer has it alone.
    /// let write = manager.acquire("catalogue").await?;
    /// write.release().await?;
    /// # Ok(()) }
    /// ```
    pub async fn acquire_shared(&self, key: impl Into<LeaseKey>) -> Result<Lease> {
        self.acquire_with(key, &shared()).await
    }

    /// One attempt to acquire `key` shared: `Ok(None)` if an exclusive lease
    /// holds it, an exclusive waiter has marked it (see the writer
    /// preference on [`LeaseManager::acquire_shared`]), or local callers
    /// already wait for it (a try never jumps the queue). At most one
    /// MongoDB round trip.
    ///
    /// # Errors
    ///
    /// As [`LeaseManager::acquire_shared`], and database errors
    /// ([`Error::Database`](crate::Error::Database),
    /// [`Error::Unreachable`](crate::Error::Unreachable)) when the attempt's
    /// outcome could not be established.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`LeaseManager::acquire`].
    pub async fn try_acquire_shared(&self, key: impl Into<LeaseKey>) -> Result<Option<Lease>> {
        self.try_acquire_with(key, &shared()).await
    }
}
