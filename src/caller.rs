//! [`CallerId`]: who acquires within one process, for re-entry.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// The identity of one local caller, named explicitly: the "same caller"
/// of a re-entrant acquisition ([`Acquire::caller`]).
///
/// Java's reentrant locks (Redisson's `RLock`, Curator's
/// `InterProcessMutex`, Hazelcast's `FencedLock`) take the calling thread
/// as the caller. An async task has no such identity that survives a
/// `tokio::spawn` or a `join!`, so mongo-lease asks for one: create a
/// `CallerId` where a unit of work starts and pass it (it is `Copy`) to the
/// code that acquires keys for that work, including tasks it spawns. Two
/// acquisitions with the same `CallerId` are the same caller, whatever task
/// runs them; acquisitions without one are always different callers.
///
/// An acquisition whose caller already holds the key never waits on itself:
/// with [`Acquire::reentrant`] it re-enters the lease (same lease,
/// same fencing token, one more entry to release), without it it fails at
/// once with [`Error::AlreadyHeld`]. The rules are in docs/reentrancy.md.
///
/// Ids are unique within the process (a counter), never stored in MongoDB.
///
/// # Examples
///
/// ```no_run
/// use mongo_lease::{CallerId, LeaseManager};
///
/// # async fn demo(manager: LeaseManager) -> mongo_lease::Result<()> {
/// let me = CallerId::new();
/// let outer = manager.acquire("invoice-42").caller(me).reentrant().await?;
/// // Deeper in the same unit of work: re-enters, at once.
/// let inner = manager.acquire("invoice-42").caller(me).reentrant().await?;
/// assert_eq!(inner.fencing_token(), outer.fencing_token());
/// inner.release().await?; // still held by `outer`
/// outer.release().await?; // released now
/// # Ok(()) }
/// ```
///
/// [`Acquire::caller`]: crate::Acquire::caller
/// [`Acquire::reentrant`]: crate::Acquire::reentrant
/// [`Error::AlreadyHeld`]: crate::Error::AlreadyHeld
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallerId(u64);

impl CallerId {
    /// A new caller, different from every other of this process.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        CallerId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

impl fmt::Debug for CallerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CallerId({})", self.0)
    }
}
