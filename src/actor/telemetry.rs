//! What the actor reports about its leases: the [`HealthBoard`] that
//! [`LeaseManager::health`](crate::LeaseManager::health) reads, the metrics of
//! [`crate::telemetry`], and one tracing span per held lease (key, owner id,
//! fencing token) that the lease's later log lines are in.

use std::time::Duration;

use tokio::time::Instant;
use tracing::Span;

use super::command::PlacedKey;
use super::{Actor, Held};
use crate::health::HealthBoard;
use crate::status::LossReason;
use crate::telemetry;

impl Actor {
    /// Heartbeat (`heartbeat`: before its renewals are sent, also recording
    /// the renewal lag), and once a heartbeat's renewals are all answered:
    /// one pass over the held leases publishes their earliest local deadline
    /// and oldest confirmed renewal for [`Actor::health`].
    pub(super) fn publish_health(&mut self, heartbeat: bool) {
        let mut earliest: Option<Instant> = None;
        let mut oldest: Option<Instant> = None;
        for held in self.keys.values().flat_map(|state| &state.holders) {
            let renewed = held.deadline - self.timing.validity_for(held.ttl);
            earliest = Some(earliest.map_or(held.deadline, |e| e.min(held.deadline)));
            oldest = Some(oldest.map_or(renewed, |o| o.min(renewed)));
        }
        self.health.publish(earliest, oldest);
        if !heartbeat {
            return;
        }
        let lag = oldest.map_or(Duration::ZERO, |o| o.elapsed());
        telemetry::renewal_lag(&self.owner_id, lag);
    }

    /// A renewal batch sent at `sent_at` was answered (`ok`) or failed.
    pub(super) fn renewal_answered(&mut self, sent_at: Instant, ok: bool) {
        telemetry::renewal_answered(sent_at.elapsed(), ok);
        if ok {
            self.health.server_answered();
        }
    }

    /// After a renewal answer was handled: publishes the health board if it
    /// was the last renewal in flight since the heartbeat (it then has the
    /// renewals' new deadlines).
    pub(super) fn renewals_settled(&mut self) {
        if self.renewals.is_empty() && std::mem::take(&mut self.health_due) {
            self.publish_health(false);
        }
    }
}

/// A lease of `key` with fencing `token` is held from now on, confirmed
/// and lost at `(renewed_at, deadline)`: counts it, and returns its span
/// (`None` when no subscriber wants it, so that nothing is allocated).
pub(super) fn lease_started(
    health: &HealthBoard,
    owner_id: &str,
    key: &PlacedKey,
    token: u64,
    (renewed_at, deadline): (Instant, Instant),
) -> Option<Box<Span>> {
    telemetry::lease_started();
    health.lease_started(renewed_at, deadline);
    let span = tracing::info_span!(parent: None, "lease", %key, owner_id, fencing_token = token);
    (!span.is_disabled()).then(|| Box::new(span))
}

/// A held lease ended for `reason`: counts it and logs it in its span.
/// Called before its token fires, so that whoever the loss wakes reads the
/// health it left (a lease not renewed in time leaves the manager unhealthy).
pub(super) fn lease_ended(health: &HealthBoard, key: &PlacedKey, held: &Held, reason: &LossReason) {
    telemetry::lease_ended(reason);
    if *reason == LossReason::Expired {
        health.renewal_missed();
    }
    health.lease_ended();
    let _entered = held.enter_span();
    tracing::debug!(%key, token = held.token, %reason, "lease ended");
}

impl Held {
    /// Enters the lease's span (if a subscriber wanted one) for the log
    /// lines about it.
    pub(super) fn enter_span(&self) -> Option<tracing::span::Entered<'_>> {
        self.span.as_deref().map(Span::enter)
    }
}
