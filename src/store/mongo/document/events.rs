//! The change-stream stages of `watch_releases` on a user collection and
//! the reading of their events (which write changed who holds a document's
//! lease). What the server sends is tested against a real `mongod`
//! (`tests/document_lease/protocol.rs`).

use mongodb::bson::{Document, doc};

use super::super::rules::{LockPath, announced};
use crate::store::{KeyWrite, field};

/// The change-stream stages of `watch_releases` on a user collection: the
/// writes that may change who holds a document's lease — deletes, inserts,
/// replacements, and updates whose `updateDescription` sets or removes `F`,
/// `F.lid` or `F.aid` — filtered on the server, so that renewals (`F.ts`,
/// `F.exp`), payload writes, waiting marks and the user's writes to other
/// fields cost no event. `updatedFields` names embedded fields by dotted
/// paths (`"F.lid"`), read with `$getField`; a new `F` shows whole (`"F"`).
/// The server may log an update pipeline's write (an acquisition) as a
/// `replace` event instead, when the change is large for the document (a
/// small document acquired or taken over): its `fullDocument.F` tells the
/// lease id, owner id and token (docs/mongodb-behaviour.md, B12, B15). Each
/// event is reduced to what [`key_write`] reads.
pub(super) fn release_events_pipeline(lock_field: &str) -> [Document; 2] {
    let updated = |name: &str| {
        doc! { "$getField": { "field": { "$literal": name }, "input": "$updateDescription.updatedFields" } }
    };
    let set = |name: &str| doc! { "$ne": [{ "$type": updated(name) }, "missing"] };
    let at = LockPath::under(lock_field);
    let (f, lid, aid, tok) = (
        lock_field.to_string(),
        at.at(field::LEASE_ID),
        at.at(field::OWNER),
        at.at(field::TOKEN),
    );
    [
        doc! { "$match": { "$or": [
            { "operationType": { "$in": ["delete", "insert", "replace"] } },
            { "operationType": "update", "$or": [
                { "$expr": { "$or": [set(&f), set(&lid), set(&aid)] } },
                { "updateDescription.removedFields": { "$in": [&f, &lid, &aid] } },
            ]},
        ]}},
        doc! { "$project": {
            "operationType": 1,
            "documentKey._id": 1,
            format!("fullDocument.{lid}"): 1,
            format!("fullDocument.{aid}"): 1,
            format!("fullDocument.{tok}"): 1,
            "updateDescription.removedFields": 1,
            "setLock": updated(&f),
            "setLid": updated(&lid),
            "setAid": updated(&aid),
            "setTok": updated(&tok),
        }},
    ]
}

/// Reads one event of [`release_events_pipeline`] as the lock collection's
/// are read ([`LockPath::key_write`] under `F`), an update by the fields its
/// `$project` stage computed: `F.lid`, `F.aid` and `F.tok` as set one by
/// one or with `F` whole, the key freed if `F` or `F.lid` was removed or `F`
/// was set without a lease id. `None` for an event of another kind, or one
/// missing the fields its kind carries.
pub(super) fn key_write(lock_field: &str, event: &Document) -> Option<KeyWrite> {
    let at = LockPath::under(lock_field);
    at.key_write(event, |key, event| {
        let removed = |name: &str| {
            event
                .get_document("updateDescription")
                .and_then(|u| u.get_array("removedFields"))
                .is_ok_and(|r| r.iter().any(|f| f.as_str() == Some(name)))
        };
        let whole = event.get_document("setLock").ok();
        let set_whole = event.contains_key("setLock");
        let set =
            |one: &str, name: &str| event.get(one).or_else(|| whole.and_then(|l| l.get(name)));
        let freed = removed(lock_field)
            || removed(&at.at(field::LEASE_ID))
            || (set_whole && !whole.is_some_and(|l| l.contains_key(field::LEASE_ID)));
        Some(announced(
            key,
            freed,
            set("setLid", field::LEASE_ID),
            set("setAid", field::OWNER),
            set("setTok", field::TOKEN),
        ))
    })
}

#[cfg(test)]
mod tests;
