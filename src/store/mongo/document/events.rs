//! The change-stream stages of `watch_releases` on a user collection and
//! the reading of their events (which write changed who holds a document's
//! lease). What the server sends is tested against a real `mongod`
//! (`tests/document_lease/protocol.rs`).

use mongodb::bson::{Bson, Document, doc};

use super::super::rules::{LockPath, announced, read_lease_id};
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
/// event is reduced to what [`key_write`] reads. With `top_id` (the
/// top-level `LockId` kept for other clients), updates that set or remove
/// it are events too: another client's lock or unlock.
pub(super) fn release_events_pipeline(lock_field: &str, top_id: Option<&str>) -> [Document; 2] {
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
    let mut names = vec![f.clone(), lid.clone(), aid.clone()];
    names.extend(top_id.map(str::to_string));
    let any_set: Vec<Document> = names.iter().map(|name| set(name)).collect();
    let mut project = doc! {
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
    };
    if let Some(top_id) = top_id {
        project.insert(format!("fullDocument.{top_id}"), 1);
        project.insert(SET_TOP_ID, updated(top_id));
    }
    [
        doc! { "$match": { "$or": [
            { "operationType": { "$in": ["delete", "insert", "replace"] } },
            { "operationType": "update", "$or": [
                { "$expr": { "$or": any_set } },
                { "updateDescription.removedFields": { "$in": names } },
            ]},
        ]}},
        doc! { "$project": project },
    ]
}

/// The projected field of an update's new `LockId`.
const SET_TOP_ID: &str = "setTopId";

/// Reads one event of [`release_events_pipeline`] as the lock collection's
/// are read ([`LockPath::key_write`] under `F`), an update by the fields its
/// `$project` stage computed: `F.lid`, `F.aid` and `F.tok` as set one by
/// one or with `F` whole, the key freed if `F` or `F.lid` was removed or `F`
/// was set without a lease id. `None` for an event of another kind, or one
/// missing the fields its kind carries.
///
/// With `top_id` (`LockId` kept at the top), a write that leaves `LockId`
/// null or removes it frees the key, and one that sets it to another value
/// than the lock field's lease id is another client's lock: a write with
/// that lease id (a UUID, or none) and no owner id, which keeps no lease
/// of ours.
pub(super) fn key_write(
    lock_field: &str,
    top_id: Option<&str>,
    event: &Document,
) -> Option<KeyWrite> {
    let write = lock_field_write(lock_field, event)?;
    let Some(top_id) = top_id else {
        return Some(write);
    };
    let top = match event.get_str("operationType").ok()? {
        "insert" | "replace" => event
            .get_document("fullDocument")
            .ok()
            .map(|d| d.get(top_id).cloned().unwrap_or(Bson::Null)),
        "update" => {
            let removed = event
                .get_document("updateDescription")
                .and_then(|u| u.get_array("removedFields"))
                .is_ok_and(|r| r.iter().any(|f| f.as_str() == Some(top_id)));
            match event.get(SET_TOP_ID) {
                Some(value) => Some(value.clone()),
                None if removed => Some(Bson::Null),
                None => None,
            }
        }
        _ => None,
    };
    Some(match top {
        None => write,
        Some(Bson::Null) => KeyWrite {
            freed: true,
            ..write
        },
        Some(id) if read_lease_id(Some(&id)) == write.lease_id && write.lease_id.is_some() => write,
        Some(id) => KeyWrite {
            key: write.key,
            freed: false,
            lease_id: read_lease_id(Some(&id)),
            owner: None,
            token: None,
        },
    })
}

/// [`key_write`] by the lock field alone.
fn lock_field_write(lock_field: &str, event: &Document) -> Option<KeyWrite> {
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
