//! The divergences known today, in one table ([`KNOWN`]): each with a
//! one-line reason and whether the seed stops there (the two sides' states
//! differ from then on) or goes on (nothing a verdict reads differs).
//! Remove an entry once the twin is fixed: the seeds that met it then
//! check the fix. Each is described in `/work/notes/differential.md`.

use std::collections::BTreeMap;

use mongodb::bson::{Bson, Document};

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

/// One known divergence.
pub(super) struct Known {
    pub name: &'static str,
    pub reason: &'static str,
    /// The seed stops at it (the states differ from then on).
    pub stops: bool,
    pub matches: fn(&Seen<'_>) -> bool,
}

/// The known divergences.
pub(super) const KNOWN: &[Known] = &[
    Known {
        name: "holder renewal keeps the top exp",
        reason: "renewing a holder of a shared or semaphore key: the twin keeps max(top exp, \
                 new), mongod sets the latest entry's (memory::kinds::renew_holders)",
        stops: true,
        matches: |seen| {
            matches!(seen.op, Op::Renew { .. })
                && seen.divergence.path == "exp"
                && both(seen, |d| d.contains_key("hs"))
        },
    },
    Known {
        name: "pattern 2 takeover drops our fields",
        reason: "a pattern 2 takeover of a lease of ours: the twin keeps _id, aid, tok, ts, exp \
                 beside its fields, mongod every field (MemoryDb::pattern2_write); nothing \
                 reads them in a foreign lock",
        stops: false,
        matches: |seen| {
            seen.divergence.twin == "(missing)"
                && seen.divergence.note == "a field on one side only"
                && both(seen, |d| d.contains_key("value"))
        },
    },
    Known {
        name: "no TTL monitor on other applications' indexes",
        reason: "the TTL pass: mongod deletes pattern 1's and 3's expired locks by their TTL \
                 indexes, the twin's delete_expired only ours (issue 40, point 3)",
        stops: true,
        matches: |seen| {
            matches!(seen.op, Op::TtlPass)
                && seen.mongo_doc().is_none()
                && seen
                    .twin_doc()
                    .is_some_and(|d| !crate::store::is_our_shape(d) && !d.contains_key("value"))
        },
    },
    Known {
        name: "GC index deletes a pattern 2 lock",
        reason: "the TTL pass: mongod's TTL index on exp deletes a pattern 2 lock that took a \
                 lease of ours over in place (our past exp kept), the twin does not (issue 40, \
                 point 2)",
        stops: true,
        matches: |seen| {
            matches!(seen.op, Op::TtlPass)
                && seen.mongo_doc().is_none()
                && seen
                    .twin_doc()
                    .is_some_and(|d| d.contains_key("value") && d.contains_key("exp"))
        },
    },
    Known {
        name: "release by owner leaves the last holders' document",
        reason: "release by owner in delete mode that removes the last holders of a shared or \
                 semaphore key: the twin runs the follow-up delete only for exclusive leases \
                 marked released, mongod for every document it changed (memory::ops \
                 release_by_owner)",
        stops: true,
        matches: |seen| {
            matches!(seen.op, Op::ReleaseByOwner { .. })
                && seen.mongo_doc().is_none()
                && seen.twin_doc().is_some_and(|d| {
                    crate::store::is_our_shape(d) && !d.contains_key("lid") && !d.contains_key("hs")
                })
                && seen.twin_docs.values().any(|d| d.contains_key("rl"))
        },
    },
    Known {
        name: "leave queues edits a pattern 2 lock",
        reason: "leave_queues on a pattern 2 lock that kept our q: mongod's updateMany (no \
                 shape test in its filter) removes the entry and counts it, the twin has no q \
                 there (mongo::handoff leave_queues_of; pattern2_write)",
        stops: false,
        matches: |seen| {
            let Op::LeaveQueues { owner, keys } = seen.op else {
                return false;
            };
            seen.divergence.path == "reply"
                && keys.iter().any(|k| {
                    seen.mongo_docs.get(k).is_some_and(|d| {
                        d.contains_key("value")
                            && d.get_array("q").is_ok_and(|q| {
                                q.is_empty() || q.iter().any(|e| owner_is(e, OWNERS[*owner]))
                            })
                    })
                })
        },
    },
    Known {
        name: "light handoff keeps rv",
        reason: "a handoff to a local waiter by the light form: mongod keeps a revocation \
                 request (rv), which the general form and the twin remove \
                 (mongo::handoff light_hand_over_update)",
        stops: true,
        matches: |seen| {
            matches!(seen.op, Op::HandOver { light: true, .. })
                && seen.divergence.path == "rv"
                && seen.divergence.twin == "(missing)"
        },
    },
    Known {
        name: "leave queues leaves an empty q",
        reason: "leave_queues removing a key's last entry: mongod leaves q: [] (and the dead \
                 entries), the twin removes q, as every other write that rewrites it \
                 (mongo::handoff leave_queues_of)",
        stops: true,
        matches: |seen| {
            matches!(seen.op, Op::LeaveQueues { .. })
                && seen.divergence.path == "q"
                && seen.divergence.twin == "(missing)"
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
];

/// Whether the entry `e` (of `q`) is `owner`'s.
fn owner_is(e: &Bson, owner: &str) -> bool {
    e.as_document().and_then(|e| e.get_str("aid").ok()) == Some(owner)
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
