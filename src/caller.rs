//! [`CallerId`]: who acquires within one process, for re-entry.

use std::sync::atomic::{AtomicU64, Ordering};

/// The identity of one local caller, named explicitly: the "same caller"
/// of a re-entrant acquisition ([`Acquire::caller`](crate::Acquire::caller)).
///
/// An async task has no identity that survives a `tokio::spawn` or a
/// `join!`, so create a `CallerId` where a unit of work starts and pass it
/// (it is `Copy`) to the code that acquires keys for that work. Two
/// acquisitions with the same `CallerId` are the same caller; acquisitions
/// without one are always different callers. Unique within the process,
/// never stored in MongoDB.
///
/// An acquisition whose caller already holds the key never waits on itself:
/// with [`Acquire::reentrant`](crate::Acquire::reentrant) it re-enters the
/// lease, without it it fails at once with
/// [`Error::AlreadyHeld`](crate::Error::AlreadyHeld) (docs/reentrancy.md).
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CallerId(u64);

impl CallerId {
    /// A new caller, different from every other of this process.
    #[allow(clippy::new_without_default)]
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        CallerId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}
