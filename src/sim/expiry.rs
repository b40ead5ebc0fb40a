//! A lease's local deadline never outlives its document on the server:
//! whenever the holder of an exclusive lease in the lock collection gets
//! or renews it, its local deadline is no later than the instant its
//! document's `exp` passes, read then (in real time, at the server clock's
//! rate and step back then, less [`CLOCK_STEP_BACK`] for a later step).
//!
//! Mutual exclusion (`checker`) breaks only when another owner takes the
//! key in the gap, which needs a third coincidence in the schedule; this
//! property finds the gap itself. A document showing another acquisition
//! (another fencing token, or no lease id: released, ended by an operator)
//! is not this lease's: mutual exclusion and the telling of losses judge
//! that case.

use std::collections::BTreeMap;

use super::checker::Violation;
use super::faults::CLOCK_STEP_BACK;
use super::history::{At, Event, History, LeaseNo};
use super::workload::Recorder;
use crate::store::memory::MemoryDb;

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
