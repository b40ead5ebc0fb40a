//! The BSON of every command [`MongoStore`](super::MongoStore) sends (filters,
//! update pipelines, projections, change-stream stages) and the reading of
//! what comes back, built on the protocol's rules at the top of a lock
//! document ([`rules`](super::rules): the shape test, the token rule, the
//! win rule, the token-age test). Pure functions of their arguments: the unit tests below
//! check their shape without a server; what the server does with them is
//! tested against a real `mongod` (`store::contract`, `tests/`).

use mongodb::bson::{Bson, Document, doc};
use uuid::Uuid;

use super::queue::{queue_after_acquisition, queue_allows, registered};
use super::rules::{LockPath, announced, bson_lease_id, freed};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::store::{FIELD_COUNT, KeyWrite, field, lease_info};

/// The filter of one key's document.
pub(super) fn key_filter(key: &LeaseKey) -> Document {
    doc! { field::ID: key }
}

/// The filter of an acquiring upsert of one key's document: `{_id: key,
/// _ins: null}`. `null` matches the missing `_ins` of every existing
/// document, and an insert copies the equality into the new document, so
/// that [`inserted`](super::rules::inserted) tells it from an existing bare `{_id}` (a foreign
/// holder's lock; "Document schema" in `store`, docs/mongodb-behaviour.md,
/// B29).
pub(in crate::store::mongo) fn upsert_filter(key: &LeaseKey) -> Document {
    doc! { field::ID: key, field::INSERTED: Bson::Null }
}

/// The acquire update: one round trip, never an error when the key is held.
///
/// An upsert on [`upsert_filter`] (an `$expr` is refused in an upsert filter on 6.0,
/// docs/mongodb-behaviour.md, B1) whose pipeline replaces the document only
/// if this acquisition (`owner`, `lease_id`) wins by the win rule
/// ([`LockPath::wins`]: the document is new, [`inserted`](super::rules::inserted); already ours
/// under this lease id and owner id, a retry; or ours in shape, expired by
/// `$$NOW`, and not yielded by this owner to a waiting one), writing the
/// lock fields of [`LockPath::acquired`] (the token by the token rule).
/// Otherwise the document is returned unchanged (no oplog entry,
/// docs/mongodb-behaviour.md, B2), including a document of foreign shape
/// (a bare `{_id}` too);
/// except that a `waiting` attempt on a lease held by another owner records
/// `wt` if it is not set yet (one write per holding period). A new
/// acquisition expires `ttl_ms` after `$$NOW`.
///
/// Held at least `hold_ms` (`Some`, see "Holding at least" in `store`): the acquisition writes `hl =
/// $$NOW + hold_ms` (a retry keeps it) and `exp = max($$NOW + ttl_ms, hl)`.
/// A waiting attempt that finds live shared holders leaves its mark
/// ([`exclusive_waiter_mark`](super::kinds::exclusive_waiter_mark)).
///
/// The queue of waiting owners (see "Queue of waiting owners" in `store`):
/// a free key whose queue has another owner's live entry at its head is
/// not won ([`queue_allows`]); a waiting attempt that finds the key held by
/// another owner, or kept for the head of the queue, registers, its entry
/// lasting `registration_ms` ([`registered`]); an acquisition leaves the
/// other owners' live entries ([`queue_after_acquisition`]).
pub(in crate::store::mongo) fn acquire_pipeline(
    owner: &str,
    ttl_ms: i64,
    lease_id: Uuid,
    waiting: bool,
    hold_ms: Option<i64>,
    registration_ms: i64,
) -> Vec<Document> {
    let at = LockPath::TOP;
    let lid = bson_lease_id(lease_id);
    let mine = at.retry(owner, &lid);
    let wins = at.wins(owner, &lid, Some(queue_allows(owner)));
    let mut acquired = doc! { field::ID: "$_id" };
    acquired.extend(at.acquired(owner, &lid, ttl_ms));
    acquired.insert(field::QUEUE, queue_after_acquisition(owner));
    if let Some(hold_ms) = hold_ms {
        let hold_until = doc! { "$cond": [
            mine,
            { "$ifNull": [format!("${}", field::HOLD_UNTIL), { "$add": ["$$NOW", hold_ms] }] },
            { "$add": ["$$NOW", hold_ms] },
        ]};
        acquired.insert(
            field::EXPIRES_AT,
            doc! { "$max": [{ "$add": ["$$NOW", ttl_ms] }, hold_until.clone()] },
        );
        acquired.insert(field::HOLD_UNTIL, hold_until);
    }
    let lost = if waiting {
        // A free key kept for the head of the queue (another owner).
        let kept_for_queue = doc! { "$and": [at.our_shape(), { "$not": [queue_allows(owner)] }] };
        let marked = doc! { "$mergeObjects": ["$$ROOT", {
            field::WAITING_SINCE: at.waiting_since(),
            field::QUEUE: registered(owner, lid, ttl_ms, registration_ms),
        }]};
        let (shared_live, mark) = super::kinds::exclusive_waiter_mark(owner, ttl_ms);
        Bson::from(doc! { "$cond": [
            { "$or": [at.held_by_other(owner), kept_for_queue] },
            marked,
            { "$cond": [shared_live, mark, "$$ROOT"] },
        ]})
    } else {
        Bson::from("$$ROOT")
    };
    vec![doc! { "$replaceWith": { "$cond": [wins, acquired, lost] } }]
}

/// The projection of reads that decide an acquire attempt; `now` is the
/// server's `$$NOW`, so the remaining lease time is computed on the server's clock.
pub(super) fn acquire_projection() -> Document {
    doc! {
        field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1,
        field::EXPIRES_AT: 1, field::YIELD_UNTIL: 1, "now": "$$NOW",
        field::PERMITS: 1, format!("{}.{}", field::EXCLUSIVE_WAITER, field::OWNER): 1,
        format!("{}.{}", field::QUEUE, field::OWNER): 1,
        format!("{}.{}", field::QUEUE, field::REGISTRATION_EXPIRES): 1,
    }
}

/// The projection of reads that report a [`LeaseInfo`]: every field of the
/// schema, the server's `$$NOW`, and the stored document's number of fields
/// ([`FIELD_COUNT`]: a force release deletes a foreign holder's lock only
/// while it has as many fields as read, [`foreign_filter`];
/// docs/mongodb-behaviour.md, B11).
pub(super) fn info_projection() -> Document {
    doc! {
        field::OWNER: 1, field::LEASE_ID: 1, field::TOKEN: 1, field::ACQUIRED_AT: 1,
        field::RENEWED_AT: 1, field::EXPIRES_AT: 1, field::PAYLOAD: 1, "now": "$$NOW",
        field::HOLDERS: 1, field::PERMITS: 1, field::HOLD_UNTIL: 1,
        FIELD_COUNT: { "$size": { "$objectToArray": "$$ROOT" } },
    }
}

/// Reads a document projected with [`info_projection`] into a [`LeaseInfo`]
/// judged at its `now` (a foreign holder's lock for a document of foreign
/// shape, a bare `{_id}` included). `None` without `now`.
pub(super) fn projected_info(key: &LeaseKey, doc: &Document) -> Option<LeaseInfo> {
    let now = doc.get_datetime("now").ok()?.to_system_time();
    Some(lease_info(key, doc, now))
}

/// Every lease document of `owner` not released yet (live, or expired
/// without a release), of our shape: an operator's release by owner id.
/// Another application's lock document with the same `aid` (no int64 `tok`)
/// never matches.
pub(super) fn owner_leases_filter(owner: &str) -> Document {
    doc! {
        field::OWNER: owner,
        field::LEASE_ID: { "$exists": true },
        field::TOKEN: { "$type": "long" },
        field::EXPIRES_AT: { "$type": "date" },
    }
}

/// The documents among `filter`'s that a release in delete mode deletes at
/// once ([`LockPath::deletable_filter`]): of our shape (int64 `tok`), not
/// waited for by another owner (no `wt`: such a release yields instead; no
/// `q`: it hands the key over or keeps the queue; no `hs`), with a token at
/// least `min_age_ms` old by the server's clock.
pub(super) fn deletable_filter(filter: Document, min_age_ms: i64) -> Document {
    LockPath::TOP.deletable_filter(filter, min_age_ms, &[field::HOLDERS, field::QUEUE])
}

/// Released documents of our shape among `filter`'s (no `lid`, int64 `tok`,
/// date `exp`), not yielded (`yu` not in the future) nor held at least
/// until later (`hl`), whose token is at least `min_age_ms` old: what the
/// follow-up delete of delete mode removes ([`LockPath::released_filter`]).
/// A new acquisition (which sets `lid`) never matches.
pub(super) fn released_filter(filter: Document, min_age_ms: i64) -> Document {
    LockPath::TOP.released_filter(
        filter,
        min_age_ms,
        &[field::HOLDERS, field::QUEUE],
        &[field::HOLD_UNTIL],
    )
}

/// The documents of `keys`.
pub(super) fn keys_filter(keys: &[LeaseKey]) -> Document {
    let keys: Vec<Bson> = keys.iter().map(|k| k.to_bson()).collect();
    doc! { field::ID: { "$in": keys } }
}

/// A foreign holder's lock document `found` (as read by an info read) under
/// `key`, only while it is still of foreign shape with the `aid` and `ts` it
/// had and as many fields ([`FIELD_COUNT`]; a bare `{_id}` only while still
/// bare): the filter of a force release's delete, so that a concurrent
/// change is not clobbered.
pub(super) fn foreign_filter(key: &LeaseKey, found: &Document) -> Document {
    let same = |name: &str| match found.get(name) {
        Some(value) => {
            doc! { "$expr": { "$eq": [format!("${name}"), { "$literal": value.clone() }] } }
        }
        None => doc! { name: { "$exists": false } },
    };
    let mut same_fields = vec![same(field::OWNER), same(field::RENEWED_AT)];
    if let Some(count) = found.get(FIELD_COUNT) {
        same_fields.push(doc! { "$expr": { "$eq": [
            { "$size": { "$objectToArray": "$$ROOT" } },
            { "$literal": count.clone() },
        ]}});
    }
    doc! {
        field::ID: key.to_bson(),
        "$and": same_fields,
        "$nor": [{ field::TOKEN: { "$type": "long" }, field::EXPIRES_AT: { "$type": "date" } }],
    }
}

/// Sets the payload; nothing else changes.
pub(super) fn payload_update(payload: Document) -> Document {
    doc! { "$set": { field::PAYLOAD: payload } }
}

/// The `min` bound of a page of `list` after `after`, with the `_id` index
/// as hint: unlike `{_id: {$gt: after}}`, which only matches keys of
/// `after`'s type (docs/mongodb-behaviour.md, B10), an index bound crosses
/// types in MongoDB's BSON order. It is inclusive: the page skips `after`.
pub(super) fn list_min(after: &LeaseKey) -> Document {
    doc! { field::ID: after }
}

/// The hint that goes with [`list_min`]: the `_id` index.
pub(super) fn id_index() -> Document {
    doc! { field::ID: 1 }
}

/// The change-stream stages of `watch_releases`: the writes that may change
/// who holds a key — deletes, inserts, replacements (the acquisition of an
/// existing document is one), updates that set or remove `lid` or `aid`
/// (a release, another application's rewrite), and updates that set `rl`
/// (a holder removed from a shared or semaphore key) — filtered on the server, so
/// that renewals (`ts`, `exp`), payload writes and waiting marks cost no
/// event; each reduced to what [`key_write`] reads (`lid`, `aid` and `tok`
/// of the full document or of `updatedFields`; docs/mongodb-behaviour.md,
/// B12).
pub(super) fn release_events_pipeline() -> [Document; 2] {
    let updated = |name: &str| format!("updateDescription.updatedFields.{name}");
    [
        doc! { "$match": { "$or": [
            { "operationType": { "$in": ["delete", "insert", "replace"] } },
            { "operationType": "update", "$or": [
                { updated(field::LEASE_ID): { "$exists": true } },
                { updated(field::OWNER): { "$exists": true } },
                { "updateDescription.removedFields": { "$in": [field::LEASE_ID, field::OWNER] } },
                { updated(field::RELEASED_AT): { "$exists": true } },
            ]},
        ]}},
        doc! { "$project": {
            "operationType": 1,
            "documentKey._id": 1,
            format!("fullDocument.{}", field::LEASE_ID): 1,
            format!("fullDocument.{}", field::OWNER): 1,
            format!("fullDocument.{}", field::TOKEN): 1,
            updated(field::LEASE_ID): 1,
            updated(field::OWNER): 1,
            updated(field::TOKEN): 1,
            updated(field::RELEASED_AT): 1,
            "updateDescription.removedFields": 1,
            HOLDERS_CHANGED: { "$anyElementTrue": [{ "$map": {
                "input": { "$objectToArray": { "$ifNull": ["$updateDescription.updatedFields", {}] } },
                "in": { "$eq": [{ "$arrayElemAt": [{ "$split": ["$$this.k", "."] }, 0] }, field::HOLDERS] },
            }}]},
        }},
    ]
}

/// Field of the events of [`release_events_pipeline`]: whether the update
/// changed `hs` (its `updatedFields` name `hs` or `hs.<i>...`), computed on
/// the server since those names are not known in advance.
const HOLDERS_CHANGED: &str = "holders";

/// Reads one event of [`release_events_pipeline`] (a raw change event
/// document) as [`LockPath::key_write`] does at the top of a lock document,
/// reading an update from its `updateDescription`. `None` for an event of
/// another kind, one missing the fields its kind carries
/// (`documentKey._id`, `fullDocument`, `updateDescription`), or the update
/// of a holder's acquisition on a shared or semaphore key (`hs` changed
/// without `rl`: the key's other holders keep their leases, and nothing was
/// freed).
pub(super) fn key_write(event: &Document) -> Option<KeyWrite> {
    LockPath::TOP.key_write(event, |key, event| {
        let update = event.get_document("updateDescription").ok()?;
        let empty = Document::new();
        let updated = update.get_document("updatedFields").unwrap_or(&empty);
        let removed = |name: &str| {
            update
                .get_array("removedFields")
                .is_ok_and(|r| r.iter().any(|f| f.as_str() == Some(name)))
        };
        // A holder added to `hs` (its entry, with the key's `aid`, `tok`,
        // ...) takes nothing from the other holders, and frees nothing.
        let holders = |name: &String| {
            name == field::HOLDERS || name.starts_with(&format!("{}.", field::HOLDERS))
        };
        if (updated.keys().any(holders) || event.get_bool(HOLDERS_CHANGED) == Ok(true))
            && !updated.contains_key(field::RELEASED_AT)
            && !updated.contains_key(field::LEASE_ID)
            && !removed(field::LEASE_ID)
        {
            return None;
        }
        // A holder removed from `hs` (`rl` set) frees a place on the key.
        if updated.contains_key(field::RELEASED_AT) {
            return Some(freed(key));
        }
        Some(announced(
            key,
            removed(field::LEASE_ID),
            updated.get(field::LEASE_ID),
            updated.get(field::OWNER),
            updated.get(field::TOKEN),
        ))
    })
}

/// The change-stream stage of observing one key: every event of its document.
pub(super) fn key_events_pipeline(key: &LeaseKey) -> [Document; 1] {
    [doc! { "$match": { "documentKey._id": key } }]
}

#[cfg(test)]
mod tests;
