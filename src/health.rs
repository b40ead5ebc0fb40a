//! [`Health`]: whether a manager's renewals are on time, for liveness probes,
//! read from a few atomics the manager task publishes (`HealthBoard`).

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

#[cfg(doc)]
use crate::status::LossReason;
use crate::status::{from_nanos, to_nanos};

/// Whether a manager's renewals are on time: returned by
/// [`LeaseManager::health`](crate::LeaseManager::health). Answer a liveness
/// probe with a failure when [`Health::is_healthy`] is false (the CLI's
/// `/healthz` answers 503): the process's leases are lost or about to be,
/// and a restart starts over cleanly.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Health {
    /// Leases held by the manager (each shared holder and permit counts one).
    pub held_leases: usize,
    /// Age of the oldest held lease's last confirmed renewal (or
    /// acquisition), as of the manager task's last heartbeat or acquisition;
    /// `None` when no lease is held. The
    /// [`RENEWAL_LAG`](crate::telemetry::RENEWAL_LAG) gauge's reading.
    pub oldest_renewal_age: Option<Duration>,
    /// `false` once a held lease's local deadline has passed, and after a
    /// lease was lost as [`LossReason::Expired`] until the server confirms
    /// a renewal or answers an acquisition of this manager again; `true`
    /// otherwise.
    pub renewals_on_time: bool,
}

impl Health {
    /// `true` while renewals are on time (see [`Health::renewals_on_time`]).
    pub fn is_healthy(&self) -> bool {
        self.renewals_on_time
    }
}

/// No instant (an empty minimum).
const NONE: i64 = i64::MAX;

/// What the manager task publishes for [`Health`], in [`to_nanos`]'s units.
/// Between the task's publications, an acquisition lowers the two minimums
/// at once, while a renewal or a release raises them only at the next one.
#[derive(Debug)]
pub(crate) struct HealthBoard {
    held: AtomicUsize,
    /// The earliest local deadline of a held lease.
    earliest_deadline: AtomicI64,
    /// The oldest last confirmed renewal (or acquisition) of a held lease.
    oldest_renewal: AtomicI64,
    /// A lease was lost for not being renewed in time since the server last
    /// confirmed a renewal or answered an acquisition.
    missed: AtomicBool,
}

impl Default for HealthBoard {
    fn default() -> Self {
        HealthBoard {
            held: AtomicUsize::new(0),
            earliest_deadline: AtomicI64::new(NONE),
            oldest_renewal: AtomicI64::new(NONE),
            missed: AtomicBool::new(false),
        }
    }
}

impl HealthBoard {
    /// A lease is held from now on: confirmed `renewed_at`, lost at `deadline`.
    pub(crate) fn lease_started(&self, renewed_at: Instant, deadline: Instant) {
        self.held.fetch_add(1, Ordering::AcqRel);
        self.earliest_deadline
            .fetch_min(to_nanos(deadline), Ordering::AcqRel);
        self.oldest_renewal
            .fetch_min(to_nanos(renewed_at), Ordering::AcqRel);
    }

    /// A held lease ended.
    pub(crate) fn lease_ended(&self) {
        if self.held.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.publish(None, None);
        }
    }

    /// The minimums over the held leases, as the task computed them.
    pub(crate) fn publish(&self, earliest_deadline: Option<Instant>, oldest: Option<Instant>) {
        self.earliest_deadline
            .store(earliest_deadline.map_or(NONE, to_nanos), Ordering::Release);
        self.oldest_renewal
            .store(oldest.map_or(NONE, to_nanos), Ordering::Release);
    }

    /// A lease was lost for not being renewed in time ([`LossReason::Expired`]).
    pub(crate) fn renewal_missed(&self) {
        self.missed.store(true, Ordering::Release);
    }

    /// The server confirmed a renewal or answered an acquisition.
    pub(crate) fn server_answered(&self) {
        self.missed.store(false, Ordering::Release);
    }

    /// The reading at this instant.
    pub(crate) fn read(&self) -> Health {
        let now = Instant::now();
        let held_leases = self.held.load(Ordering::Acquire);
        let at = |nanos: i64| (held_leases > 0 && nanos != NONE).then(|| from_nanos(nanos));
        let deadline = at(self.earliest_deadline.load(Ordering::Acquire));
        let oldest = at(self.oldest_renewal.load(Ordering::Acquire));
        let late = deadline.is_some_and(|deadline| now >= deadline);
        Health {
            held_leases,
            oldest_renewal_age: oldest.map(|renewed| now.saturating_duration_since(renewed)),
            renewals_on_time: !late && !self.missed.load(Ordering::Acquire),
        }
    }
}

#[cfg(test)]
mod tests;
