//! The lock-delay property: after an operator's call ends a lease on the
//! server at server time `t` (a force release that ended a lease of ours,
//! a release by owner id of a live exclusive lease), nobody is granted its
//! key before `t + delay`, less the server clock's allowed step (a server
//! ahead frees it sooner in real time; the delay shortened by its allowed
//! rate). `t` is no earlier than the
//! call's start; grants that an operator's call may have ended before
//! their reply came (`forced`) are left out, as for the other overlap
//! checks.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Checker, Kind};
use crate::sim::history::{At, LeaseNo, OpNo};

/// What the lock-delay property tracks.
#[derive(Default)]
pub(super) struct LockDelays {
    /// The operator's calls in flight: when each started, the exclusive
    /// leases of the lock collection it may end live (a release by owner
    /// id: its manager's leases live and not already ended by an earlier
    /// call), and its lock-delay once recorded.
    calls: BTreeMap<OpNo, (At, Vec<LeaseNo>, Option<Duration>)>,
    /// Per key, before when nobody may be granted it.
    until: BTreeMap<String, At>,
}

impl Checker {
    /// An operator's call `op` starts; `manager` for a release of its
    /// owner id. Before the call marks the leases it concerns.
    pub(super) fn lock_delay_call_started(&mut self, op: OpNo, manager: Option<usize>) {
        let ends: Vec<LeaseNo> = match manager {
            Some(manager) => self
                .leases
                .iter()
                .filter(|(_, l)| {
                    l.manager == manager
                        && l.kind == Kind::Exclusive
                        && l.key.starts_with("locks/")
                        && !l.ended
                        && !l.forced
                })
                .map(|(n, _)| *n)
                .collect(),
            None => Vec::new(),
        };
        self.lock_delays.calls.insert(op, (self.now, ends, None));
    }

    /// The call `op` ended leases with a lock-delay of `delay`.
    pub(super) fn lock_delay_recorded(&mut self, op: OpNo, delay: Duration) {
        if let Some(call) = self.lock_delays.calls.get_mut(&op) {
            call.2 = Some(delay);
        }
    }

    /// The call `op` returned: the keys it delayed are not granted before
    /// its start + its delay (in real time): a force release's key, and
    /// the keys of a release by owner id's leases still live now (live on
    /// the server when it applied).
    pub(super) fn lock_delay_call_ended(&mut self, op: OpNo) {
        let Some((start, ends, Some(delay))) = self.lock_delays.calls.remove(&op) else {
            return;
        };
        let ppm = f64::from(self.bounds.server_faster_ppm);
        let until = start + delay.mul_f64(1e6 / (1e6 + ppm));
        let keys: Vec<String> = match &self.ops.get(&op).map(|call| &call.target) {
            Some(Ok(key)) => vec![key.clone()],
            Some(Err(_)) => ends
                .iter()
                .map(|n| &self.leases[n])
                .filter(|l| !l.ended)
                .map(|l| l.key.clone())
                .collect(),
            None => Vec::new(),
        };
        for key in keys {
            let at = self.lock_delays.until.entry(key).or_default();
            *at = (*at).max(until);
        }
    }

    /// A grant of `key` (not `forced`) before its lock-delay's end.
    pub(super) fn check_lock_delay(&mut self, lease: LeaseNo, key: &str, forced: bool) {
        let Some(until) = self.lock_delays.until.get(key).copied() else {
            return;
        };
        let step = self.bounds.clock_step_back.max(self.bounds.clock_skew);
        if !forced && self.now + step < until {
            self.violation(
                key,
                format!(
                    "lease {lease} granted {:?} before the lock-delay's end {until:?}",
                    until - self.now
                ),
            );
        }
    }
}
