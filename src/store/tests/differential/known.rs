//! The divergences known today, in one table ([`KNOWN`]): each with a
//! one-line reason naming the side and the code, and whether the seed stops
//! there (the two sides' states differ from then on) or goes on (nothing a
//! later step reads differs). Remove an entry once its side is fixed: the
//! seeds that met it then check the fix. docs/safety.md ("The twin against
//! `mongod`") says why none changes a verdict.

use std::collections::BTreeMap;

use mongodb::bson::Document;

use super::compare::Divergence;
use super::ops::Op;
use super::world::OWNERS;
use crate::key::LeaseKey;

/// A divergence, with what the step did and the documents after it.
pub(super) struct Seen<'a> {
    pub op: &'a Op,
    pub divergence: &'a Divergence,
    pub twin_docs: &'a BTreeMap<LeaseKey, Document>,
    pub mongo_docs: &'a BTreeMap<LeaseKey, Document>,
}

/// One known divergence.
pub(super) struct Known {
    pub name: &'static str,
    pub reason: &'static str,
    /// The seed stops at it (the states differ from then on).
    pub stops: bool,
    pub matches: fn(&Seen<'_>) -> bool,
}

/// The known divergences: the twin's first, then `MongoStore`'s, then those
/// of the other applications' equivalents on the twin.
pub(super) const KNOWN: &[Known] = &[
    // ----- the twin ---------------------------------------------------------
    Known {
        name: "release by owner with a lock-delay marks, then deletes",
        reason: "release by owner in delete mode by a store with a lock-delay: mongod marks \
                 every lease released, then deletes in its follow-up (two events), the twin \
                 deletes at once those it does not delay (one) (memory::ops release_owner_leases)",
        stops: false,
        matches: |seen| {
            matches!(seen.op, Op::ReleaseOwner { .. })
                && seen.divergence.path.starts_with("announced")
                && fewer_in_twin(seen)
        },
    },
    Known {
        name: "one release of several holders of a key announced once",
        reason: "a general release of several leases of one shared or semaphore key: mongod \
                 writes once per lease (a round per key, so that the count is of leases) and \
                 announces each, the twin releases them in one write (memory::ops release_in)",
        stops: false,
        matches: |seen| {
            let Op::Release { leases, .. } = seen.op else {
                return false;
            };
            let shared_key = leases
                .iter()
                .enumerate()
                .any(|(i, l)| leases[..i].iter().any(|m| m.key == l.key));
            shared_key && seen.divergence.path.starts_with("announced") && fewer_in_twin(seen)
        },
    },
    Known {
        name: "which refusal first",
        reason: "an acquire both refuse before sending (a payload and hold_at_least on a shared \
                 or semaphore lease): the twin reports InvalidConfig (the shape first), mongod \
                 Unsupported (the payload first) (memory::ops acquire)",
        stops: false,
        matches: |seen| {
            matches!(seen.op, Op::Acquire { payload: Some(_), shape, .. }
                if shape.hold_at_least.is_some() && shape.kind.is_multi_holder())
                && seen.divergence.path == "reply.error"
        },
    },
    Known {
        name: "a holder's acquisition logged as a replacement",
        reason: "a shared or permit acquisition that rewrites an existing document: mongod may \
                 log the pipeline update as a replacement, whose event announces it (freed, no \
                 lid), where the twin announces only an insert or a removed lid \
                 (MemoryDb::announce_taken)",
        stops: false,
        matches: |seen| {
            seen.divergence.path.starts_with("announced")
                && matches!(seen.op, Op::Acquire { shape, .. } if shape.kind.is_multi_holder())
        },
    },
    Known {
        name: "an acquisition by the last owner shows no aid",
        reason: "an acquisition of a key whose last owner is the same (a handoff to a local \
                 waiter, a re-acquisition): mongod's update event sets lid and tok, not aid \
                 (unchanged), so it shows no owner and that owner's waiter's stream does not \
                 carry it; the twin announces the owner (MemoryDb::announce_acquisition)",
        stops: false,
        matches: |seen| {
            let d = seen.divergence;
            let owner = match seen.op {
                Op::Acquire { owner, .. }
                | Op::LightAcquire { owner, .. }
                | Op::Handoff { owner, .. } => *owner,
                _ => return false,
            };
            let no_aid = d.path.starts_with("announced.writes")
                && d.path.ends_with(".owner")
                && d.mongo == "null";
            no_aid || d.path == "announced.waits (b)" && OWNERS[owner] == "b"
        },
    },
    // ----- MongoStore -------------------------------------------------------
    Known {
        name: "a repeated request to release is not announced",
        reason: "request_release by the owner that asked last: only rv.at changes, and \
                 mongod's change stream filter ($match on updatedFields.rv) misses the update \
                 event's dotted field rv.at; the twin announces it (mongo::watch \
                 release_events_pipeline)",
        stops: false,
        matches: |seen| {
            matches!(seen.op, Op::RequestRelease { .. })
                && seen.divergence.path.starts_with("announced")
                && seen.divergence.mongo == "[]"
        },
    },
    // ----- the other applications' equivalents on the twin ----------------------
    Known {
        name: "pattern 2 takeover drops our fields",
        reason: "a pattern 2 takeover of a lease of ours: the twin keeps our top fields as \
                 Doc::stored renders them beside its fields, mongod every field \
                 (MemoryDb::foreign_write); nothing reads them in a foreign lock",
        stops: false,
        matches: |seen| {
            seen.divergence.twin == "(missing)"
                && seen.divergence.note == "a field on one side only"
                && both(seen, |d| d.contains_key("value"))
        },
    },
];

impl Seen<'_> {
    /// The twin's document of the divergence's key.
    fn twin_doc(&self) -> Option<&Document> {
        self.divergence
            .key
            .as_ref()
            .and_then(|k| self.twin_docs.get(k))
    }

    /// The mongod's document of the divergence's key.
    fn mongo_doc(&self) -> Option<&Document> {
        self.divergence
            .key
            .as_ref()
            .and_then(|k| self.mongo_docs.get(k))
    }
}

/// Whether the twin announced fewer writes than mongod (the divergence's
/// note on the lists' lengths).
fn fewer_in_twin(seen: &Seen<'_>) -> bool {
    let counts: Vec<usize> = seen
        .divergence
        .note
        .split(" against ")
        .filter_map(|n| n.split(' ').next()?.parse().ok())
        .collect();
    matches!(counts[..], [twin, mongo] if twin < mongo)
}

/// Whether both sides have the document and `test` holds for each.
fn both(seen: &Seen<'_>, test: impl Fn(&Document) -> bool) -> bool {
    [seen.twin_doc(), seen.mongo_doc()]
        .iter()
        .all(|d| d.is_some_and(&test))
}

/// The known divergence `seen` is, if any.
pub(super) fn known(seen: &Seen<'_>) -> Option<&'static Known> {
    KNOWN.iter().find(|k| (k.matches)(seen))
}
