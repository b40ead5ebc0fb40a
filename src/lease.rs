//! [`Lease`]: one held key, with its fencing token and lost-lease signal.

use std::fmt;
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use uuid::Uuid;

use crate::actor::command::Command;
use crate::error::{Error, Result};

/// What [`Lease::release`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum ReleaseOutcome {
    /// The lease was still held and is now released: the key is free at once.
    Released,
    /// The lease had already been lost (its cancellation token had fired, or
    /// the server no longer had it under this lease id): work done since then
    /// was not protected by it.
    AlreadyLost,
}

impl ReleaseOutcome {
    /// `true` if the lease had been lost before the release.
    pub fn was_lost(self) -> bool {
        self == ReleaseOutcome::AlreadyLost
    }
}

/// A held lease on one key.
///
/// The manager renews it in the background until it is released or dropped.
/// Hold it for as long as you work under the lock; check its
/// [`cancellation_token`](Lease::cancellation_token) (or await
/// [`lost`](Lease::lost)) to stop when the lease is lost, and pass its
/// [`fencing_token`](Lease::fencing_token) to every resource you change, so a
/// stale holder's late writes can be refused.
///
/// Dropping a lease releases it in the background; prefer [`Lease::release`],
/// which waits and reports.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(manager: mongo_lease::LockManager) -> mongo_lease::Result<()> {
/// let lease = manager.acquire("invoice-42").await?;
/// let lost = lease.cancellation_token();
/// tokio::select! {
///     _ = lost.cancelled() => eprintln!("lease lost, stopping"),
///     _ = do_work(lease.fencing_token()) => {}
/// }
/// if lease.release().await?.was_lost() {
///     eprintln!("the lease was lost before the work finished");
/// }
/// # Ok(()) }
/// # async fn do_work(_token: u64) {}
/// ```
pub struct Lease {
    key: String,
    owner_id: Arc<str>,
    lease_id: Uuid,
    fencing_token: u64,
    cancel: CancellationToken,
    /// `None` once released explicitly, so `Drop` does nothing.
    commands: Option<mpsc::UnboundedSender<Command>>,
}

impl Lease {
    pub(crate) fn new(
        key: String,
        owner_id: Arc<str>,
        lease_id: Uuid,
        fencing_token: u64,
        cancel: CancellationToken,
        commands: mpsc::UnboundedSender<Command>,
    ) -> Self {
        Lease {
            key,
            owner_id,
            lease_id,
            fencing_token,
            cancel,
            commands: Some(commands),
        }
    }

    /// The key this lease holds.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The owner id of the manager that holds the lease (stored as `aid`).
    pub fn owner_id(&self) -> &str {
        &self.owner_id
    }

    /// The fencing token of this acquisition: strictly greater than every
    /// token issued before for this key, including after an expiry takeover
    /// and after the lock document was garbage-collected.
    ///
    /// Pass it with every write protected by the lease and have the resource
    /// refuse writes that carry a token lower than one it has seen (Martin
    /// Kleppmann, "How to do distributed locking", 2016).
    pub fn fencing_token(&self) -> u64 {
        self.fencing_token
    }

    /// A token that is cancelled when this lease is no longer held: when a
    /// renewal finds it gone or taken, when renewal could not be confirmed
    /// before the local deadline (*start of the last confirmed renewal + ttl −
    /// safety margin*, which comes before another owner can take the key), or
    /// when the manager releases it ([`LockManager::release_all`],
    /// [`LockManager::shutdown`], [`Lease::release`]).
    ///
    /// Clone it into the tasks that work under the lease.
    ///
    /// [`LockManager::release_all`]: crate::LockManager::release_all
    /// [`LockManager::shutdown`]: crate::LockManager::shutdown
    pub fn cancellation_token(&self) -> CancellationToken {
        self.cancel.clone()
    }

    /// Completes when the lease is lost (see [`Lease::cancellation_token`]).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future has no effect on the lease.
    pub fn lost(&self) -> WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// `true` once the lease has been lost.
    pub fn is_lost(&self) -> bool {
        self.cancel.is_cancelled()
    }

    /// Releases the lease and waits for MongoDB to confirm. The key is free at
    /// once for the next waiter, local or remote. Only this acquisition (owner
    /// id and lease id) is released: a stale holder can never release its
    /// successor's lease.
    ///
    /// # Errors
    ///
    /// [`Error::Shutdown`] if the manager has shut down (its leases were
    /// released then); [`Error::Database`] or [`Error::Unreachable`] if the
    /// release could not be confirmed (the lease then expires after its TTL).
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the first poll still releases the lease.
    pub async fn release(mut self) -> Result<ReleaseOutcome> {
        let commands = self.commands.take().ok_or(Error::Shutdown)?;
        let (respond_to, response) = oneshot::channel();
        commands
            .send(Command::Release {
                key: self.key.clone(),
                lease_id: self.lease_id,
                respond_to: Some(respond_to),
            })
            .map_err(|_| Error::Shutdown)?;
        response.await.map_err(|_| Error::Shutdown)?
    }
}

impl Drop for Lease {
    /// Releases the lease in the background (the manager logs a failure).
    fn drop(&mut self) {
        if let Some(commands) = self.commands.take() {
            let _ = commands.send(Command::Release {
                key: std::mem::take(&mut self.key),
                lease_id: self.lease_id,
                respond_to: None,
            });
        }
    }
}

impl fmt::Debug for Lease {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lease")
            .field("key", &self.key)
            .field("owner_id", &self.owner_id)
            .field("fencing_token", &self.fencing_token)
            .field("lost", &self.is_lost())
            .finish()
    }
}
