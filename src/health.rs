//! [`Health`]: whether a manager's renewals are on time, for liveness probes.

use std::time::Duration;

/// Whether a manager's renewals are on time: returned by
/// [`LockManager::health`](crate::LockManager::health).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Leases held by the manager.
    pub held_leases: usize,
    /// Age of the oldest lease's last confirmed renewal (or acquisition);
    /// `None` when no lease is held.
    pub oldest_renewal_age: Option<Duration>,
    /// `true` while every held lease's last confirmed renewal is younger
    /// than its TTL minus the safety margin (no local deadline passed).
    pub renewals_on_time: bool,
}

impl Health {
    /// `true` while renewals are on time (see [`Health::renewals_on_time`]).
    pub fn is_healthy(&self) -> bool {
        self.renewals_on_time
    }
}
