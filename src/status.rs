//! What a held lease is doing: its local deadline, readable without the
//! manager task, and why it was lost ([`LossReason`]).
//!
//! Each held lease shares one [`LeaseState`] between the actor (which moves
//! the deadline at each confirmed renewal and records the loss) and the
//! caller's [`Lease`](crate::Lease) (which reads them). Reading needs no
//! message to the actor, so [`Lease::is_lost`](crate::Lease::is_lost) is
//! right even when the manager task has not run for a while (a starved
//! runtime, a paused thread): once the local deadline has passed, the lease
//! reads as lost, as DynamoDB's lock client's `isExpired()` does.

use std::fmt;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Why a lease is no longer held.
///
/// Read it with [`Lease::lost_reason`](crate::Lease::lost_reason) once the
/// lease's cancellation token has fired (or its local deadline has passed).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// Not renewed in time: no renewal was confirmed before the local
    /// deadline (the server unreachable, the process or the manager task
    /// stalled), or the server found the lease expired.
    Expired,
    /// Another holder has the key now.
    Taken {
        /// The owner id of the manager (or application) that holds it now.
        owner_id: String,
        /// The new holder's fencing token (greater than this lease's).
        fencing_token: u64,
    },
    /// The lease's document (or in-document lock field) was deleted by
    /// someone else.
    Deleted,
    /// The lease was force-released ([`LockManager::force_release`],
    /// [`LockManager::release_owner`]).
    ///
    /// [`LockManager::force_release`]: crate::LockManager::force_release
    /// [`LockManager::release_owner`]: crate::LockManager::release_owner
    ForceReleased,
    /// The holder released it ([`Lease::release`](crate::Lease::release),
    /// a drop, a commit, [`LockManager::release_all`](crate::LockManager::release_all)).
    Released,
    /// The manager shut down ([`LockManager::shutdown`](crate::LockManager::shutdown),
    /// or every handle dropped).
    Shutdown,
}

impl LossReason {
    /// A short label, for metrics and logs: `expired`, `taken`, `deleted`,
    /// `force_released`, `released` or `shutdown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LossReason::Expired => "expired",
            LossReason::Taken { .. } => "taken",
            LossReason::Deleted => "deleted",
            LossReason::ForceReleased => "force_released",
            LossReason::Released => "released",
            LossReason::Shutdown => "shutdown",
        }
    }

    /// `true` for the reasons that end a lease its holder did not give up:
    /// expired, taken, deleted, force-released.
    pub fn is_involuntary(&self) -> bool {
        !matches!(self, LossReason::Released | LossReason::Shutdown)
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Taken {
                owner_id,
                fencing_token,
            } => write!(f, "taken by {owner_id:?} (fencing token {fencing_token})"),
            other => f.write_str(other.as_str()),
        }
    }
}

/// The state one held lease shares between the actor and its handles.
pub(crate) struct LeaseState {
    cancel: CancellationToken,
    /// The local deadline, in nanoseconds after [`base`]; 0 once lost.
    deadline: AtomicU64,
    /// Why it was lost: set once, before the token fires.
    reason: OnceLock<LossReason>,
}

/// The instant local deadlines are counted from: the first one asked for
/// (tokio's clock, so that paused-clock tests move it).
pub(crate) fn base() -> Instant {
    static BASE: OnceLock<std::time::Instant> = OnceLock::new();
    Instant::from_std(*BASE.get_or_init(|| Instant::now().into_std()))
}

pub(crate) fn to_nanos(at: Instant) -> u64 {
    let nanos = at.saturating_duration_since(base()).as_nanos();
    // 1 past the base, so that 0 can mean "lost"; u64 nanoseconds last 584 years.
    u64::try_from(nanos).unwrap_or(u64::MAX).max(1)
}

impl LeaseState {
    /// A held lease whose local deadline is `deadline`.
    pub(crate) fn new(deadline: Instant) -> Self {
        LeaseState {
            cancel: CancellationToken::new(),
            deadline: AtomicU64::new(to_nanos(deadline)),
            reason: OnceLock::new(),
        }
    }

    /// The token that fires when the lease is lost.
    pub(crate) fn token(&self) -> &CancellationToken {
        &self.cancel
    }

    /// Moves the local deadline (a confirmed renewal).
    pub(crate) fn set_deadline(&self, deadline: Instant) {
        if !self.cancel.is_cancelled() {
            self.deadline.store(to_nanos(deadline), Ordering::Release);
        }
    }

    /// The local deadline; `None` once the lease is lost.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self.deadline.load(Ordering::Acquire) {
            0 => None,
            nanos => Some(base() + std::time::Duration::from_nanos(nanos)),
        }
    }

    /// `true` once the lease is lost: its token fired, or its local deadline
    /// has passed (even if the actor has not run since).
    pub(crate) fn is_lost(&self) -> bool {
        self.cancel.is_cancelled()
            || self
                .deadline()
                .is_none_or(|deadline| Instant::now() >= deadline)
    }

    /// Why the lease was lost: the recorded reason, or [`LossReason::Expired`]
    /// once the local deadline has passed without one; `None` while held.
    pub(crate) fn lost_reason(&self) -> Option<LossReason> {
        if let Some(reason) = self.reason.get() {
            return Some(reason.clone());
        }
        self.is_lost().then_some(LossReason::Expired)
    }

    /// Records why the lease was lost (the first reason wins) and fires its
    /// token. Returns `false` if it was already recorded lost.
    pub(crate) fn lose(&self, reason: LossReason) -> bool {
        let first = self.reason.set(reason).is_ok();
        self.deadline.store(0, Ordering::Release);
        self.cancel.cancel();
        first
    }
}

impl fmt::Debug for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseState")
            .field("deadline", &self.deadline())
            .field("reason", &self.reason.get())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_lease_reads_lost_once_its_deadline_passed_without_the_actor() {
        let state = LeaseState::new(Instant::now() + Duration::from_secs(10));
        assert!(!state.is_lost());
        assert_eq!(state.lost_reason(), None);
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(!state.is_lost());
        state.set_deadline(Instant::now() + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(9)).await;
        assert!(!state.is_lost(), "the renewal moved the deadline");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(state.is_lost());
        assert!(
            !state.token().is_cancelled(),
            "only the actor fires the token"
        );
        assert_eq!(state.lost_reason(), Some(LossReason::Expired));
    }

    #[tokio::test(start_paused = true)]
    async fn the_first_recorded_reason_wins_and_fires_the_token() {
        let state = LeaseState::new(Instant::now() + Duration::from_secs(10));
        assert!(state.lose(LossReason::Deleted));
        assert!(!state.lose(LossReason::Released));
        assert!(state.token().is_cancelled());
        assert!(state.is_lost());
        assert_eq!(state.deadline(), None);
        assert_eq!(state.lost_reason(), Some(LossReason::Deleted));
        state.set_deadline(Instant::now() + Duration::from_secs(10));
        assert_eq!(state.deadline(), None, "a lost lease stays lost");
    }
}
