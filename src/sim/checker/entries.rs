//! Properties 8 and 9: a re-entered lease is one lease, held until its last
//! entry is released; a group is handed out whole, and lost whole.
//!
//! Each re-entry ([`Event::Reentered`]) is an entry of its root lease (the
//! one granted): it must carry the root's fencing token, and the root stays
//! live (for every other property) until its last entry is released. The
//! root's token firing for a release while its holder still holds an entry
//! (and no release of its manager's owner id ran) is a violation: an
//! entry's release ended the lease under the others.
//!
//! A group ([`Event::GroupGranted`]) must not be handed out with a lease
//! its holder was told lost before; once one of its leases is told lost
//! for a reason other than a release or a shutdown, every other lease of
//! the group still held is told by the same instant.

use std::collections::BTreeMap;
use std::rc::Rc;

use super::Checker;
use crate::sim::history::{At, LeaseNo};

/// What properties 8 and 9 follow.
#[derive(Default)]
pub(super) struct Entries {
    /// Each entry's root lease.
    alias: BTreeMap<LeaseNo, LeaseNo>,
    /// Each root lease's fencing token and its entries not released yet.
    held: BTreeMap<LeaseNo, (u64, u32)>,
    /// When each lease was told lost.
    told_at: BTreeMap<LeaseNo, At>,
    /// Each lease of a group, with its group's leases.
    group: BTreeMap<LeaseNo, Rc<[LeaseNo]>>,
    /// Leases of a group that must be told lost by an instant, because
    /// another lease of the group was.
    must_tell: Vec<(At, LeaseNo, LeaseNo)>,
}

impl Checker {
    /// The lease `lease` is an entry of (itself if granted).
    pub(super) fn root(&self, lease: LeaseNo) -> LeaseNo {
        *self.entries.alias.get(&lease).unwrap_or(&lease)
    }

    /// `lease` was granted with `token`: one entry.
    pub(super) fn entry_granted(&mut self, lease: LeaseNo, token: u64) {
        self.entries.held.insert(lease, (token, 1));
    }

    /// An entry of `root` is released; whether it was its last (the lease
    /// ends with it).
    pub(super) fn entry_released(&mut self, root: LeaseNo) -> bool {
        match self.entries.held.get_mut(&root) {
            Some((_, n)) if *n > 1 => {
                *n -= 1;
                false
            }
            Some((_, n)) => {
                *n = 0;
                true
            }
            None => true,
        }
    }

    /// `lease`, a new entry of `of`, with `token`.
    pub(super) fn reentered(&mut self, lease: LeaseNo, of: LeaseNo, token: u64) {
        let root = self.root(of);
        let Some(key) = self.leases.get(&root).map(|l| l.key.clone()) else {
            return;
        };
        match self.entries.held.get_mut(&root) {
            Some((held_token, n)) if *n > 0 => {
                let held_token = *held_token;
                *n += 1;
                self.entries.alias.insert(lease, root);
                if token != held_token {
                    self.violation(
                        &key,
                        format!(
                            "entry {lease} of lease {root} has token {token}, not {held_token}"
                        ),
                    );
                }
            }
            _ => self.violation(
                &key,
                format!(
                    "lease {root} re-entered (entry {lease}) after its last entry was released"
                ),
            ),
        }
    }

    /// `lease` is told lost for `reason` (before the checker marks it so).
    pub(super) fn entries_told(&mut self, lease: LeaseNo, reason: &str) {
        let now = self.now;
        let Some(l) = self.leases.get(&lease) else {
            return;
        };
        if l.gone || l.told {
            return;
        }
        self.entries.told_at.insert(lease, now);
        let entries = self.entries.held.get(&lease).map_or(0, |(_, n)| *n);
        if reason == "released" && !l.ended && !l.forced && entries > 0 {
            let key = l.key.clone();
            self.violation(
                &key,
                format!(
                    "lease {lease} ended by a release while its holder holds {entries} of its entries"
                ),
            );
        }
        if reason == "released" || reason == "shutdown" {
            return;
        }
        let Some(group) = self.entries.group.get(&lease).cloned() else {
            return;
        };
        for &other in group.iter().filter(|&&other| other != lease) {
            self.entries.must_tell.push((now, other, lease));
        }
    }

    /// `leases`, just granted, were handed out as one group.
    pub(super) fn group_granted(&mut self, leases: &[LeaseNo]) {
        let group: Rc<[LeaseNo]> = leases.into();
        for &lease in leases {
            self.entries.group.insert(lease, group.clone());
            let told = self.entries.told_at.get(&lease).copied();
            if let Some(told) = told.filter(|told| *told < self.now) {
                let key = self.leases[&lease].key.clone();
                self.violation(
                    &key,
                    format!(
                        "group {leases:?} handed out though lease {lease} was told lost at {told:?}"
                    ),
                );
            }
        }
    }

    /// At `self.now`: every lease of a group that had to be told by an
    /// earlier instant was, or its holder let it go.
    pub(super) fn check_groups_told(&mut self) {
        let now = self.now;
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.entries.must_tell)
            .into_iter()
            .partition(|(at, _, _)| *at < now);
        self.entries.must_tell = later;
        for (at, lease, because) in due {
            let Some(l) = self.leases.get(&lease) else {
                continue;
            };
            if l.told || l.gone || self.crashed.contains(&l.manager) {
                continue;
            }
            let key = l.key.clone();
            self.violation(
                &key,
                format!(
                    "lease {lease} not told lost with lease {because} of its group (at {at:?})"
                ),
            );
        }
    }
}
