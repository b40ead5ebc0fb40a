//! The metrics' names (the `pub const`s below) and the functions that
//! record them through the [`metrics`] facade. The library depends on no
//! exporter: install the recorder you like (for example
//! `metrics-exporter-prometheus`, as the CLI's `--http` does); without one,
//! recording costs next to nothing. Each event costs O(1); the renewal lag
//! and [`Health`](crate::Health) come from the heartbeat's own pass over the
//! held leases. Durations are in seconds, as Prometheus does. Gauges are
//! moved up and down, so several managers in one process add up; the
//! renewal lag, a maximum, is labelled by owner id instead.
//!
//! Tracing: each acquisition runs in an `acquire` span (key, kind, owner
//! id), and each held lease has a `lease` span (key, owner id, fencing
//! token) that the log lines about it (its end, its loss) are in; neither
//! allocates when no subscriber wants it.

use std::time::Duration;

use metrics::{counter, gauge, histogram};

use crate::kind::LeaseKind;
use crate::status::LossReason;

/// Counter: acquisitions asked of a manager, by `kind` ([`kind_label`])
/// and `outcome` (`acquired`, `not_acquired`, `timed_out`, `failed`).
pub const ACQUISITIONS: &str = "mongo_lease_acquisitions_total";

/// Histogram, seconds: from the caller's request to the lease handed over.
/// Label: `kind`.
pub const ACQUIRE_WAIT: &str = "mongo_lease_acquire_wait_seconds";

/// Gauge: acquisitions in progress in this process (the local queues'
/// depth).
pub const WAITERS: &str = "mongo_lease_waiters";

/// Gauge: leases held by this process's managers.
pub const HELD_LEASES: &str = "mongo_lease_held_leases";

/// Histogram, seconds: round trip of one renewal batch, failed ones
/// included.
pub const RENEWAL_DURATION: &str = "mongo_lease_renewal_duration_seconds";

/// Counter: renewal batches that failed (each is retried).
pub const RENEWAL_FAILURES: &str = "mongo_lease_renewal_failures_total";

/// Gauge, seconds: at each heartbeat, the age of the oldest confirmed
/// renewal among the leases a manager holds, as
/// [`Health::oldest_renewal_age`](crate::Health::oldest_renewal_age).
/// Label: `owner_id`.
pub const RENEWAL_LAG: &str = "mongo_lease_renewal_lag_seconds";

/// Counter: held leases that ended, by `reason` ([`LossReason::as_str`]);
/// alert on the involuntary ones ([`LossReason::is_involuntary`]).
pub const LEASES_ENDED: &str = "mongo_lease_leases_ended_total";

/// Counter: change streams of writes reopened after a failure, by `place`
/// (`locks` or `documents`).
pub const CHANGE_STREAM_RESTARTS: &str = "mongo_lease_change_stream_restarts_total";

/// `$metric!($name, $key => value, ...)` with `value` matched against the
/// listed literals, so that recording allocates nothing (the `metrics`
/// macros build a `Vec` per call for runtime label values). A second,
/// literal label may follow the list in parentheses: `("outcome" => "acquired")`.
macro_rules! static_label {
    ($metric:ident!($name:expr, $key:literal => $value:expr, [$($lit:literal),+] $rest:tt)) => {
        match $value {
            $($lit => static_label!(@one $metric, $name, $key => $lit, $rest),)+
            other => static_label!(@other $metric, $name, $key => other, $rest),
        }
    };
    ($metric:ident!($name:expr, $key:literal => $value:expr, [$($lit:literal),+])) => {
        static_label!($metric!($name, $key => $value, [$($lit),+] ()))
    };
    (@one $metric:ident, $name:expr, $key:literal => $lit:literal, ()) => {
        $metric!($name, $key => $lit)
    };
    (@one $metric:ident, $name:expr, $key:literal => $lit:literal, ($k2:literal => $v2:literal)) => {
        $metric!($name, $key => $lit, $k2 => $v2)
    };
    (@other $metric:ident, $name:expr, $key:literal => $value:ident, ()) => {
        $metric!($name, $key => $value.to_owned())
    };
    (@other $metric:ident, $name:expr, $key:literal => $value:ident, ($k2:literal => $v2:literal)) => {
        $metric!($name, $key => $value.to_owned(), $k2 => $v2)
    };
}

/// As [`static_label!`], for an acquisition's `kind` and `outcome`.
macro_rules! kind_and_outcome {
    ($metric:ident!($name:expr, $kind:expr, $outcome:expr)) => {
        match $outcome {
            AcquireOutcome::Acquired => static_label!($metric!($name, "kind" => $kind, ["exclusive", "shared", "permit"] ("outcome" => "acquired"))),
            AcquireOutcome::NotAcquired => static_label!($metric!($name, "kind" => $kind, ["exclusive", "shared", "permit"] ("outcome" => "not_acquired"))),
            AcquireOutcome::TimedOut => static_label!($metric!($name, "kind" => $kind, ["exclusive", "shared", "permit"] ("outcome" => "timed_out"))),
            AcquireOutcome::Failed => static_label!($metric!($name, "kind" => $kind, ["exclusive", "shared", "permit"] ("outcome" => "failed"))),
        }
    };
}

/// The `kind` label of a lease kind: `exclusive`, `shared` or `permit`.
pub fn kind_label(kind: LeaseKind) -> &'static str {
    match kind {
        LeaseKind::Shared => "shared",
        LeaseKind::Permit { .. } => "permit",
        _ => "exclusive",
    }
}

/// How an acquisition ended (the `outcome` label of [`ACQUISITIONS`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    Acquired,
    NotAcquired,
    TimedOut,
    Failed,
}

impl AcquireOutcome {
    /// The outcome of an acquisition that answered `result` (the `outcome`
    /// label's values are spelled in `kind_and_outcome!`).
    pub(crate) fn of<T>(result: &crate::error::Result<Option<T>>) -> Self {
        match result {
            Ok(Some(_)) => AcquireOutcome::Acquired,
            Ok(None) => AcquireOutcome::NotAcquired,
            Err(_) => AcquireOutcome::Failed,
        }
    }
}

/// One acquisition in progress, from the caller's request: counted in
/// [`WAITERS`] while it lives; [`AcquireMetrics::finish`] records its
/// outcome (and its wait, if it got a lease); dropped unfinished (the caller
/// went away), it counts as `timed_out`.
pub(crate) struct AcquireMetrics {
    kind: &'static str,
    started: tokio::time::Instant,
    outcome: Option<AcquireOutcome>,
}

impl AcquireMetrics {
    /// An acquisition of `kind` starts now.
    pub(crate) fn start(kind: LeaseKind) -> Self {
        gauge!(WAITERS).increment(1.0);
        AcquireMetrics {
            kind: kind_label(kind),
            started: tokio::time::Instant::now(),
            outcome: None,
        }
    }

    /// It ended with `outcome`.
    pub(crate) fn finish(mut self, outcome: AcquireOutcome) {
        self.outcome = Some(outcome);
    }
}

impl Drop for AcquireMetrics {
    fn drop(&mut self) {
        let outcome = self.outcome.unwrap_or(AcquireOutcome::TimedOut);
        gauge!(WAITERS).decrement(1.0);
        kind_and_outcome!(counter!(ACQUISITIONS, self.kind, outcome)).increment(1);
        if outcome == AcquireOutcome::Acquired {
            static_label!(
                histogram!(ACQUIRE_WAIT, "kind" => self.kind, ["exclusive", "shared", "permit"])
            )
            .record(self.started.elapsed());
        }
    }
}

/// A lease is held from now on.
pub(crate) fn lease_started() {
    gauge!(HELD_LEASES).increment(1.0);
}

/// A held lease ended for `reason`.
pub(crate) fn lease_ended(reason: &LossReason) {
    gauge!(HELD_LEASES).decrement(1.0);
    static_label!(counter!(LEASES_ENDED, "reason" => reason.as_str(), ["expired", "taken", "deleted", "force_released", "released", "shutdown"])).increment(1);
}

/// A renewal batch was answered (or failed, `ok == false`) `round_trip` after its send.
pub(crate) fn renewal_answered(round_trip: Duration, ok: bool) {
    histogram!(RENEWAL_DURATION).record(round_trip);
    if !ok {
        counter!(RENEWAL_FAILURES).increment(1);
    }
}

/// The renewal lag of manager `owner_id` at this heartbeat: the age of its
/// oldest confirmed renewal (zero when it holds no lease).
pub(crate) fn renewal_lag(owner_id: &str, lag: Duration) {
    gauge!(RENEWAL_LAG, "owner_id" => owner_id.to_owned()).set(lag);
}

/// The change stream of writes of a place was reopened after a failure;
/// `documents`: a user collection of in-document leases (else the lock
/// collection).
pub(crate) fn change_stream_restarted(documents: bool) {
    if documents {
        counter!(CHANGE_STREAM_RESTARTS, "place" => "documents").increment(1);
    } else {
        counter!(CHANGE_STREAM_RESTARTS, "place" => "locks").increment(1);
    }
}
