//! Property 17, an override waits for the holder: after an operator's
//! default override (a force release, a release by owner id, without
//! `immediately`) ended a live exclusive lease L (the call started after
//! L's grant and returned without an error, having ended a lease of ours:
//! L itself for a force release, which returns it), nobody is granted
//! L's key by an attempt sent after the call started before L's holder
//! was told, released it, or its local deadline passed, whichever comes
//! first. An override asked for `immediately` frees the key after the
//! lock-delay only (property 14), and one in flight meanwhile on the same
//! key or owner id exempts the grant.
//!
//! The leases an override ends are exempt from the overlap checks
//! (`forced`), as their holders learn of it late; this property is what
//! still holds for them under the default.

use std::collections::BTreeMap;

use super::Checker;
use crate::sim::history::{At, LeaseNo, OpNo};

/// What property 17 tracks.
#[derive(Default)]
pub(super) struct OverrideWaits {
    /// The operator's calls in flight: when each started, what it
    /// concerns (a key, or a manager's leases in the lock collection),
    /// whether it asked for `immediately`, and the exclusive leases of
    /// that key or owner id live at its start.
    calls: BTreeMap<OpNo, Call>,
    /// Per lease a default override ended: the call and its start.
    ended: BTreeMap<LeaseNo, (OpNo, At)>,
    /// The immediate overrides: their start, end (`None`: in flight) and
    /// what they concern.
    immediate: Vec<(At, Option<At>, Result<String, usize>)>,
}

struct Call {
    start: At,
    target: Result<String, usize>,
    immediately: bool,
    live: Vec<LeaseNo>,
    /// What it ended, as it returned: a force release's lease's token
    /// (`Some(Some(token))`), a release by owner id's leases (`Some(None)`).
    ended: Option<Option<u64>>,
}

impl Checker {
    /// An operator's override `op` of `target` (a key, or a manager's owner
    /// id) starts, `immediately` or by default.
    pub(super) fn override_started(
        &mut self,
        op: OpNo,
        target: Result<&String, usize>,
        immediately: bool,
    ) {
        let target = target.cloned();
        let live = self
            .leases
            .iter()
            .filter(|(_, l)| {
                let concerns = match &target {
                    Ok(key) => l.key == *key,
                    Err(manager) => l.manager == *manager && l.key.starts_with("locks/"),
                };
                // (Not one an immediate override ended already.)
                concerns && l.kind == super::Kind::Exclusive && !l.ended && !l.at_once
            })
            .map(|(n, _)| *n)
            .collect();
        if immediately {
            let at = self.now;
            self.override_waits
                .immediate
                .push((at, None, target.clone()));
        }
        let call = Call {
            start: self.now,
            target,
            immediately,
            live,
            ended: None,
        };
        self.override_waits.calls.insert(op, call);
    }

    /// The override `op` ended leases of ours: the lease of fencing token
    /// `token` (a force release), or some (a release by owner id).
    pub(super) fn overridden(&mut self, op: OpNo, token: Option<u64>) {
        if let Some(call) = self.override_waits.calls.get_mut(&op) {
            call.ended = Some(token);
        }
    }

    /// The operator's call `op` returned, `ok` without an error.
    pub(super) fn override_ended(&mut self, op: OpNo, ok: bool) {
        let Some(call) = self.override_waits.calls.remove(&op) else {
            return;
        };
        if call.immediately {
            // One that failed may still land, up to `landing` later.
            let now = match ok {
                true => self.now,
                false => self.now + self.bounds.landing,
            };
            if let Some(immediate) =
                self.override_waits
                    .immediate
                    .iter_mut()
                    .find(|(start, end, target)| {
                        *start == call.start && end.is_none() && *target == call.target
                    })
            {
                immediate.1 = Some(now);
            }
            return;
        }
        let (true, Some(token)) = (ok, call.ended) else {
            return;
        };
        for lease in call.live {
            let l = &self.leases[&lease];
            if token.is_none_or(|token| token == l.token) {
                self.override_waits
                    .ended
                    .entry(lease)
                    .or_insert((op, call.start));
            }
        }
    }

    /// Lease `lease` of `key` is granted, by an attempt sent no earlier
    /// than `sent_after`: not while the holder of a lease a default
    /// override ended may still run, if the attempt was sent after that
    /// call started.
    pub(super) fn check_override_wait(&mut self, lease: LeaseNo, key: &str, sent_after: At) {
        let now = self.now;
        let waits = &mut self.override_waits;
        waits
            .ended
            .retain(|ended, _| self.leases.get(ended).is_some_and(|l| !l.ended));
        let mut found = Vec::new();
        for (ended, (op, start)) in &waits.ended {
            let l = &self.leases[ended];
            if l.key != key || sent_after < *start {
                continue;
            }
            let exempt = waits.immediate.iter().any(|(from, to, target)| {
                let concerns = match target {
                    Ok(k) => k == key,
                    Err(manager) => *manager == l.manager,
                };
                concerns && *from <= now && to.is_none_or(|to| to >= *start)
            });
            if !exempt {
                found.push(format!(
                    "lease {lease} granted at {now:?}, by an attempt sent after the default \
                     override {op} started at {start:?}, while lease {ended} (manager {}), which \
                     it ended, was neither told nor past its local deadline {:?}",
                    l.manager, l.deadline
                ));
            }
        }
        for what in found {
            self.violation(key, what);
        }
    }
}
