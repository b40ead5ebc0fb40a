//! The lock-delay property: after an operator's call ends a lease on the
//! server at server time `t` (a force release that ended a lease of ours,
//! a release by owner id of a live exclusive lease, or of the live shared
//! holders or permits of a key that no other owner holds), nobody is
//! granted its key before `t + delay`, less the server clock's allowed
//! step (a server ahead frees it sooner in real time; the delay shortened
//! by its allowed rate). `t` is no earlier than the call's start; grants
//! that an operator's call may have ended before their reply came
//! (`forced`) are left out, as for the other overlap checks.
//!
//! A shared or semaphore key counts only where the history shows, at the
//! grant, that no other manager's lease may have been live on the server
//! when the call applied ([`Checker::held_alone`]): the server delays a key
//! all of whose live holders are the owner's, or were ended by an earlier
//! release by owner id (docs/lock-delay.md), and a lease whose holder lost
//! it, or an attempt whose reply had not come, may be live there unseen.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Checker, Kind};
use crate::sim::history::{At, LeaseNo, OpNo, WaiterNo};

/// What the lock-delay property tracks.
#[derive(Default)]
pub(super) struct LockDelays {
    /// The operator's calls in flight: when each started, the leases of
    /// the lock collection it may end live (a release by owner id: its
    /// manager's leases live and not already ended by an earlier call),
    /// and its lock-delay once recorded.
    calls: BTreeMap<OpNo, (At, Vec<LeaseNo>, Option<Duration>)>,
    /// Per key, before when nobody may be granted it.
    until: BTreeMap<String, At>,
    /// Per shared or semaphore key, the releases by owner id that ended
    /// a live lease in it: the manager, when the call started and
    /// returned, and before when nobody may be granted the key if the
    /// manager held it alone ([`Checker::held_alone`]).
    alone: BTreeMap<String, Vec<OwnerEnd>>,
    /// The releases by owner id that returned without an error: the
    /// manager whose owner id each named, when it started and returned.
    owner_releases: Vec<(usize, At, At)>,
    /// Every wait: its manager, key, start, and its end with whether it
    /// was granted (`None` while it waits).
    waits: BTreeMap<WaiterNo, Wait>,
}

/// A release by owner id that ended a live shared holder or permit.
#[derive(Clone, Copy)]
struct OwnerEnd {
    manager: usize,
    started: At,
    returned: At,
    until: At,
}

/// A wait, as [`LockDelays::waits`] keeps it.
struct Wait {
    manager: usize,
    /// Its keys in the lock collection (a group's wait, `groups.rs`,
    /// names its keys joined by `+`).
    keys: Vec<String>,
    started: At,
    ended: Option<(At, bool)>,
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
                    l.manager == manager && l.key.starts_with("locks/") && !l.ended && !l.forced
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

    /// The call `op` returned (`ok`: without an error): the keys it
    /// delayed are not granted before its start + its delay (in real
    /// time): a force release's key, and the keys of a release by owner
    /// id's leases still live now (live on the server when it applied),
    /// shared and semaphore keys only if held alone (checked at a grant).
    pub(super) fn lock_delay_call_ended(&mut self, op: OpNo, ok: bool) {
        let Some((start, ends, delay)) = self.lock_delays.calls.remove(&op) else {
            return;
        };
        let target = self.ops.get(&op).map(|call| call.target.clone());
        if let (true, Some(Err(manager))) = (ok, &target) {
            let returned = (*manager, start, self.now);
            self.lock_delays.owner_releases.push(returned);
        }
        let Some(delay) = delay else {
            return;
        };
        let ppm = f64::from(self.bounds.server_faster_ppm);
        let until = start + delay.mul_f64(1e6 / (1e6 + ppm));
        let mut keys = Vec::new();
        match target {
            Some(Ok(key)) => keys.push(key),
            Some(Err(manager)) => {
                for l in ends.iter().map(|n| &self.leases[n]).filter(|l| !l.ended) {
                    if l.kind == Kind::Exclusive {
                        keys.push(l.key.clone());
                        continue;
                    }
                    let end = OwnerEnd {
                        manager,
                        started: start,
                        returned: self.now,
                        until,
                    };
                    self.lock_delays
                        .alone
                        .entry(l.key.clone())
                        .or_default()
                        .push(end);
                }
            }
            None => {}
        }
        for key in keys {
            let at = self.lock_delays.until.entry(key).or_default();
            *at = (*at).max(until);
        }
    }

    /// The wait `waiter` of `manager` for `key` started.
    pub(super) fn lock_delay_wait_started(&mut self, waiter: WaiterNo, manager: usize, key: &str) {
        // A group's wait (`groups.rs`) names its keys joined by `+`.
        let keys = key.split('+').filter(|k| k.starts_with("locks/"));
        let wait = Wait {
            manager,
            keys: keys.map(str::to_string).collect(),
            started: self.now,
            ended: None,
        };
        self.lock_delays.waits.insert(waiter, wait);
    }

    /// The wait `waiter` ended, `granted` or not.
    pub(super) fn lock_delay_wait_ended(&mut self, waiter: WaiterNo, granted: bool) {
        let now = self.now;
        if let Some(wait) = self.lock_delays.waits.get_mut(&waiter) {
            wait.ended.get_or_insert((now, granted));
        }
    }

    /// The manager crashed: its waits end, none granted.
    pub(super) fn lock_delay_crashed(&mut self, manager: usize) {
        let now = self.now;
        for wait in self
            .lock_delays
            .waits
            .values_mut()
            .filter(|w| w.manager == manager)
        {
            wait.ended.get_or_insert((now, false));
        }
    }

    /// Whether, as far as the history shows now, no lease of a manager
    /// other than `end.manager` may have been live on the server in `key`
    /// when the release by owner id `end` applied (between its start and
    /// its return), but the one granted now from an attempt sent at `sent`
    /// by `grantee`:
    /// - each of their leases whose attempt was sent before the call
    ///   returned was answered released before its start, or ended by a
    ///   release by owner id that started after its grant and returned
    ///   before the start (its place is kept as ended, `xl`), or ended long
    ///   enough before the start that no write sent before could hold it
    ///   since (the landing bound, the TTL and the clock's step);
    /// - each of their waits for `key` that ran while the call did, or a
    ///   landing bound, a TTL and a step before, ended granted (a lease
    ///   above): another may have sent an attempt whose reply never came.
    fn held_alone(&self, key: &str, end: OwnerEnd, (grantee, sent): (usize, At)) -> bool {
        if grantee != end.manager && sent <= end.returned {
            return false;
        }
        let step = self.bounds.clock_skew.max(self.bounds.clock_step_back);
        let margin = self.bounds.landing + self.bounds.ttl + step;
        let past = |at: At| at + margin < end.started;
        let ended_by_owner_release = |l: &super::Lease| {
            (self.lock_delays.owner_releases.iter()).any(|&(m, started, returned)| {
                m == l.manager && started > l.granted_at && returned <= end.started
            })
        };
        let leases_gone = (self.leases.values())
            .filter(|l| l.key == key && l.manager != end.manager && l.sent_at <= end.returned)
            .all(|l| {
                l.released_at.is_some_and(|at| at <= end.started)
                    || l.ended_at.is_some_and(past)
                    || ended_by_owner_release(l)
            });
        let waits_seen = (self.lock_delays.waits.values())
            .filter(|w| w.manager != end.manager && w.started <= end.returned)
            .filter(|w| w.keys.iter().any(|k| k == key))
            .all(|w| match w.ended {
                Some((_, true)) => true,
                Some((at, false)) => past(at),
                None => false,
            });
        leases_gone && waits_seen
    }

    /// A grant of `key` (not `forced`) to `grantee` from an attempt sent at
    /// `sent` before its lock-delay's end.
    pub(super) fn check_lock_delay(
        &mut self,
        lease: LeaseNo,
        key: &str,
        forced: bool,
        (grantee, sent): (usize, At),
    ) {
        let step = self.bounds.clock_step_back.max(self.bounds.clock_skew);
        let alone = (self.lock_delays.alone.get(key).into_iter().flatten())
            .filter(|end| end.returned <= self.now && self.now + step < end.until)
            .filter(|end| self.held_alone(key, **end, (grantee, sent)))
            .map(|end| end.until)
            .max();
        let until = self
            .lock_delays
            .until
            .get(key)
            .copied()
            .into_iter()
            .chain(alone)
            .max();
        let Some(until) = until else {
            return;
        };
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
