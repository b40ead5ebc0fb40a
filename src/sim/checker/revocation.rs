//! The revocation property: once faults have stopped, a request to release
//! a key that returned `true` reaches every lease of the key that was live
//! (and not ended by an operator) when the request started, within
//! [`TOLD_WITHIN`] of its return, unless the lease ended first.
//!
//! What the protocol does not promise is left out (docs/revocation.md,
//! "Limits"): a lease whose manager has no stream of writes is not told
//! (in the simulation every manager's stream works once faults stop, and a
//! failed one reopens within the bound); a request that lands while the
//! holder's acquisition is in flight may be missed, so only the leases
//! granted (recorded) before the request started are due. A lease that
//! ends before its due instant (released, told lost, expired, its process
//! crashed, ended by an operator) is not judged. The property decides on
//! the requests for the revocable holder's key (`sim/revocable.rs`),
//! which holds until told: holds of the other tasks mostly end first.

use std::collections::BTreeMap;
use std::time::Duration;

use super::Checker;
use crate::sim::history::{At, LeaseNo, OpNo};

/// How soon after a request returns its holders must be told: a stream
/// of writes that failed just before the faults stopped reopens (and reads
/// the requests) within its retry delay (5 s) and a heartbeat.
pub(crate) const TOLD_WITHIN: Duration = Duration::from_secs(8);

/// What the revocation property tracks.
#[derive(Default)]
pub(super) struct Requests {
    /// The requests in flight: the leases of their key live when each
    /// started.
    calls: BTreeMap<OpNo, Vec<LeaseNo>>,
    /// The leases that must be told, by when.
    due: BTreeMap<LeaseNo, At>,
}

impl Checker {
    /// A request to release `key` starts (checked only once faults stopped).
    pub(super) fn release_requested(&mut self, op: OpNo, key: &str) {
        if self.faults_stopped.is_none() {
            return;
        }
        let live: Vec<LeaseNo> = self.keys.get(key).map_or_else(Vec::new, |state| {
            state
                .live
                .iter()
                .copied()
                .filter(|n| !self.leases[n].forced)
                .collect()
        });
        self.requests.calls.insert(op, live);
    }

    /// The call `op` returned; `held`: the request found the key held.
    pub(super) fn release_request_ended(&mut self, op: OpNo, held: bool) {
        let Some(live) = self.requests.calls.remove(&op) else {
            return;
        };
        if held {
            for lease in live {
                self.requests
                    .due
                    .entry(lease)
                    .or_insert(self.now + TOLD_WITHIN);
            }
        }
    }

    /// The lease's follower was told of a request.
    pub(super) fn revocation_told(&mut self, lease: LeaseNo) {
        self.requests.due.remove(&lease);
    }

    /// At `now`: a lease still live past its due instant was not told.
    pub(super) fn check_requests(&mut self) {
        let now = self.now;
        let late: Vec<(LeaseNo, At)> = self
            .requests
            .due
            .iter()
            .filter(|(lease, due)| now > **due || self.leases[*lease].ended)
            .map(|(lease, due)| (*lease, *due))
            .collect();
        for (lease, due) in late {
            self.requests.due.remove(&lease);
            let l = &self.leases[&lease];
            if !l.ended && !l.forced {
                let key = l.key.clone();
                self.violation(
                    &key,
                    format!("lease {lease} not told of a request to release it by {due:?}"),
                );
            }
        }
    }
}
