//! A lease's local deadline never outlives its document on the server:
//! whenever the holder of an exclusive lease in the lock collection gets
//! or renews it, its local deadline is no later than the instant its
//! document's `exp` passes, read then (in real time, at the server clock's
//! rate and step back then, less [`CLOCK_STEP_BACK`] for a later step).
//! And at every instant while the lease is live, whatever lands on the
//! server (a write of it sent long before, given up by its caller, or
//! one of another owner) and however the server's clock steps: its
//! [`watch`]er records each instant its document, as the server holds it
//! then, expires before the holder's local deadline
//! ([`Event::ExpiryNow`], judged by the checker, which leaves out leases
//! an operator's call may have ended).
//!
//! Mutual exclusion (`checker`) breaks only when another owner takes the
//! key in the gap, which needs a third coincidence in the schedule; this
//! property finds the gap itself. A document showing another acquisition
//! (another fencing token, or no lease id: released, ended by an operator)
//! is not this lease's: mutual exclusion and the telling of losses judge
//! that case.

use std::collections::BTreeMap;
use std::sync::Arc;

use tokio::time::Instant;

use super::checker::Violation;
use super::faults::CLOCK_STEP_BACK;
use super::history::{At, Event, History, LeaseNo};
use super::workload::Recorder;
use crate::key::LeaseKey;
use crate::status::LeaseState;
use crate::store::memory::MemoryDb;

/// A live exclusive lease of the lock collection that the [`watch`]er
/// follows, from its grant until its holder releases it (or its process
/// crashes); told lost or past its deadline, it is skipped.
pub(super) struct Followed {
    /// Its manager.
    pub manager: usize,
    /// Its key in the lock collection (without `locks/`).
    pub key: LeaseKey,
    /// Its fencing token.
    pub token: u64,
    /// Its state, which holds its local deadline now.
    pub state: Arc<LeaseState>,
    /// Whether the current gap (expiry before the deadline) was recorded.
    pub recorded: bool,
}

impl Followed {
    /// Whether the gap it shows now, if any, is to be recorded: the
    /// deadline now and the document's expiry in real time (now if the
    /// server no longer holds the key for it).
    fn gap(&mut self, db: &MemoryDb, now: Instant) -> Option<(Instant, Instant)> {
        let deadline = self.state.deadline().filter(|d| *d > now)?;
        let expiry = db
            .lease_expiry(&self.key, self.token)
            .map_or(now, |exp| db.real_at(exp));
        let gap = deadline > expiry + CLOCK_STEP_BACK;
        let new = gap && !self.recorded;
        self.recorded = gap;
        new.then_some((deadline, expiry))
    }
}

/// Records, on every change of `db` (its documents, or a step of the
/// server's clock at a failover; the steps back of a few milliseconds are
/// within the check's allowance), each followed lease whose document now
/// expires before its local deadline (once per gap), until the run ends.
pub(super) async fn watch(recorder: Recorder, db: MemoryDb) {
    let mut changes = db.changes();
    while changes.changed().await.is_ok() {
        let now = Instant::now();
        let gaps = recorder.followed_gaps(|followed| followed.gap(&db, now));
        for (lease, (deadline, expiry)) in gaps {
            recorder.push(Event::ExpiryNow {
                lease,
                deadline: recorder.at(deadline),
                expiry: recorder.at(expiry),
            });
        }
    }
}

/// Records when the document of lease `lease` (fencing token `token`) of
/// the lock collection's `key` (its place stripped) expires, if it is
/// still that lease's.
pub(super) fn record(recorder: &Recorder, db: &MemoryDb, key: &str, lease: LeaseNo, token: u64) {
    let Some(doc) = db.doc(key) else {
        return;
    };
    if doc.token != token || doc.lease_id.is_none() {
        return;
    }
    recorder.push(Event::ServerExpiry {
        lease,
        expiry: recorder.at(db.real_at(doc.exp)),
    });
}

/// The property of the module docs over `history`.
pub(super) fn check(history: &History) -> Vec<Violation> {
    // Each exclusive lease's key and latest local deadline.
    let mut deadlines: BTreeMap<LeaseNo, (String, At)> = BTreeMap::new();
    let mut found = Vec::new();
    for (index, entry) in history.entries().iter().enumerate() {
        match &entry.event {
            Event::Granted {
                lease,
                key,
                deadline,
                ..
            } => {
                deadlines.insert(*lease, (key.clone(), *deadline));
            }
            Event::Renewed { lease, deadline } => {
                if let Some((_, latest)) = deadlines.get_mut(lease) {
                    *latest = *deadline;
                }
            }
            Event::ServerExpiry { lease, expiry } => {
                let (key, deadline) = &deadlines[lease];
                if *deadline > *expiry + CLOCK_STEP_BACK {
                    found.push(Violation {
                        at: entry.at,
                        entry: index,
                        key: key.clone(),
                        what: format!(
                            "lease {lease} has its local deadline {deadline:?} after its \
                             document on the server expires, at {expiry:?}"
                        ),
                    });
                }
            }
            _ => {}
        }
    }
    found
}
