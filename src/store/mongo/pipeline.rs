//! The BSON of every command [`MongoStore`](super::MongoStore) sends (filters,
//! update pipelines, projections, change-stream stages) and the reading of
//! what comes back. Pure functions of their arguments: the unit tests below
//! check their shape without a server; what the server does with them is
//! tested against a real `mongod` (`store::contract`, `tests/`).

use std::time::Duration;

use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Bson, Document, doc};
use uuid::Uuid;

use crate::key::LeaseKey;
use crate::lease::LeaseInfo;
use crate::store::{
    AcquireOutcome, FIELD_COUNT, KeyWrite, LeaseRef, TOKEN_TIME_SHIFT, field, foreign_owner,
    lease_info,
};

/// A lease id as stored in `lid`: a BSON UUID (binary subtype 4).
pub(in crate::store::mongo) fn bson_lease_id(id: Uuid) -> Bson {
    Bson::from(mongodb::bson::Uuid::from_bytes(id.into_bytes()))
}

/// Whether `value` (a document's `lid`) is the lease id `id`.
fn is_lease_id(value: Option<&Bson>, id: Uuid) -> bool {
    matches!(value, Some(Bson::Binary(b)) if b.bytes.as_slice() == id.as_bytes())
}

/// The filter of one key's document.
pub(super) fn key_filter(key: &LeaseKey) -> Document {
    doc! { field::ID: key }
}

/// Whether the document is new: only `_id` (what an upsert starts from).
pub(in crate::store::mongo) fn fresh_document() -> Document {
    doc! { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 1] }
}

/// Whether the document has this crate's shape: a date `exp` and an int64
/// `tok` (`store::is_our_shape`, as an expression).
pub(in crate::store::mongo) fn our_shape() -> Document {
    doc! { "$and": [
        { "$eq": [{ "$type": format!("${}", field::EXPIRES_AT) }, "date"] },
        { "$eq": [{ "$type": format!("${}", field::TOKEN) }, "long"] },
    ]}
}

/// The token of a new acquisition: `max(tok + 1, ms($$NOW) * 2^20)` (see
/// "Fencing tokens" in `store`).
pub(in crate::store::mongo) fn next_token() -> Document {
    doc! { "$max": [
        { "$add": [{ "$ifNull": [format!("${}", field::TOKEN), 0_i64] }, 1_i64] },
        { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << TOKEN_TIME_SHIFT] },
    ]}
}

/// The acquire update: one round trip, never an error when the key is held.
///
/// An upsert on `_id` alone (an `$expr` is refused in an upsert filter on 6.0,
/// docs/mongodb-behaviour.md, B1) whose pipeline replaces the document only
/// if this acquisition (`owner`, `lease_id`) wins: the document is new (only
/// `_id`), already ours under this lease id and owner id (a retry), or ours in shape,
/// expired by `$$NOW`, and not yielded by this owner to a waiting one.
/// Otherwise the document is returned unchanged (no oplog entry,
/// docs/mongodb-behaviour.md, B2), including a document of foreign shape;
/// except that a `waiting` attempt on a lease held by another owner records
/// `wt` if it is not set yet (one write per holding period). A new
/// acquisition expires `ttl_ms` after `$$NOW`.
///
/// Held at least `hold_ms` (`Some`, see "Holding at least" in `store`): the acquisition writes `hl =
/// $$NOW + hold_ms` (a retry keeps it) and `exp = max($$NOW + ttl_ms, hl)`.
/// A waiting attempt that finds live shared holders leaves its mark
/// ([`exclusive_waiter_mark`](super::kinds::exclusive_waiter_mark)).
pub(in crate::store::mongo) fn acquire_pipeline(
    owner: &str,
    ttl_ms: i64,
    lease_id: Uuid,
    waiting: bool,
    hold_ms: Option<i64>,
) -> Vec<Document> {
    let lid = bson_lease_id(lease_id);
    let fresh = fresh_document();
    let same_owner = doc! { "$eq": [format!("${}", field::OWNER), { "$literal": owner }] };
    // A retry: this lease id and owner id. A document another application
    // rewrote to another owner (keeping `lid`) is not ours any more.
    let mine = doc! { "$and": [
        { "$eq": [format!("${}", field::LEASE_ID), lid.clone()] },
        same_owner.clone(),
    ]};
    let our_shape = our_shape();
    let expired = doc! { "$lte": [format!("${}", field::EXPIRES_AT), "$$NOW"] };
    let yielded_by_us = doc! { "$and": [
        same_owner.clone(),
        { "$gt": [format!("${}", field::YIELD_UNTIL), "$$NOW"] },
    ]};
    let wins = doc! { "$or": [
        fresh,
        mine.clone(),
        { "$and": [our_shape.clone(), expired.clone(), { "$not": [yielded_by_us] }] },
    ]};
    let next_token = doc! { "$cond": [
        mine.clone(),
        format!("${}", field::TOKEN),
        next_token(),
    ]};
    // A retry under the same lease id keeps the acquisition time, the
    // payload and the waiting mark; a new acquisition starts without them.
    let acquired_at = doc! { "$cond": [
        mine.clone(),
        { "$ifNull": [format!("${}", field::ACQUIRED_AT), "$$NOW"] },
        "$$NOW",
    ]};
    let keep = |name: &str| doc! { "$cond": [mine.clone(), format!("${name}"), "$$REMOVE"] };
    let mut acquired = doc! {
        field::ID: "$_id",
        field::OWNER: { "$literal": owner },
        field::LEASE_ID: lid,
        field::TOKEN: next_token,
        field::ACQUIRED_AT: acquired_at,
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: { "$add": ["$$NOW", ttl_ms] },
        field::PAYLOAD: keep(field::PAYLOAD),
        field::WAITING_SINCE: keep(field::WAITING_SINCE),
    };
    if let Some(hold_ms) = hold_ms {
        let hold_until = doc! { "$cond": [
            mine.clone(),
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
        let held_by_other = doc! { "$and": [
            our_shape,
            { "$eq": [{ "$type": format!("${}", field::LEASE_ID) }, "binData"] },
            { "$not": [expired] },
            { "$not": [same_owner] },
        ]};
        let marked = doc! { "$mergeObjects": ["$$ROOT", {
            field::WAITING_SINCE: { "$ifNull": [format!("${}", field::WAITING_SINCE), "$$NOW"] },
        }]};
        let (shared_live, mark) = super::kinds::exclusive_waiter_mark(owner, ttl_ms);
        Bson::from(doc! { "$cond": [
            held_by_other,
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
    }
}

/// Reads what an acquire attempt (by `owner` under `lease_id`) found out of
/// a returned or re-read document, projected with [`acquire_projection`].
/// A document of foreign shape is held by a foreign holder (its `aid` as
/// owner id), with no known remaining time.
pub(in crate::store::mongo) fn classify(
    key: &LeaseKey,
    owner: &str,
    lease_id: Uuid,
    doc: &Document,
) -> AcquireOutcome {
    let token = doc.get_i64(field::TOKEN);
    let expires = doc.get_datetime(field::EXPIRES_AT);
    let (Ok(token), Ok(expires)) = (token, expires) else {
        tracing::trace!(%key, "held by a foreign holder");
        return AcquireOutcome::Held {
            holder: foreign_owner(doc),
            remaining: None,
        };
    };
    let holder = doc.get_str(field::OWNER).unwrap_or_default().to_string();
    if is_lease_id(doc.get(field::LEASE_ID), lease_id) && holder == owner {
        return AcquireOutcome::Acquired {
            token: token as u64,
        };
    }
    let now = doc
        .get_datetime("now")
        .map(|d| d.timestamp_millis())
        .unwrap_or(expires.timestamp_millis());
    // Live permits of a semaphore: never an exclusive acquisition's.
    if let Some(pm) = doc.get(field::PERMITS)
        && expires.timestamp_millis() > now
    {
        let permits = match pm {
            Bson::Int32(n) => u32::try_from(*n).unwrap_or(0),
            Bson::Int64(n) => u32::try_from(*n).unwrap_or(0),
            _ => 0,
        };
        return AcquireOutcome::Mismatch {
            stored: crate::LeaseKind::Permit { permits },
        };
    }
    // Yielded by this owner: free for others now, for us at `yu`.
    let until = match doc.get_datetime(field::YIELD_UNTIL) {
        Ok(until) if holder == owner => *expires.max(until),
        _ => *expires,
    };
    let remaining = until.timestamp_millis().saturating_sub(now).max(0) as u64;
    AcquireOutcome::Held {
        holder,
        remaining: Some(Duration::from_millis(remaining)),
    }
}

/// The projection of reads that report a [`LeaseInfo`]: every field of the
/// schema, the server's `$$NOW`, and the stored document's number of fields
/// ([`FIELD_COUNT`], which tells an empty placeholder from a foreign holder's
/// document with none of our fields; docs/mongodb-behaviour.md, B11).
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
/// shape). `None` without `now` or for an empty placeholder.
pub(super) fn projected_info(key: &LeaseKey, doc: &Document) -> Option<LeaseInfo> {
    let now = doc.get_datetime("now").ok()?.to_system_time();
    lease_info(key, doc, now)
}

/// Every lease held under `owner`, except those with a lease id in `except`.
/// Only documents of our shape: a foreign holder's lock document carrying
/// the same `aid` is never released.
pub(super) fn owner_filter(owner: &str, except: &[Uuid]) -> Document {
    let except: Vec<Bson> = except.iter().copied().map(bson_lease_id).collect();
    doc! {
        field::OWNER: owner,
        field::LEASE_ID: { "$exists": true, "$nin": except },
        field::TOKEN: { "$type": "long" },
        field::EXPIRES_AT: { "$type": "date" },
    }
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

/// The `$expr` condition "the server's `$$NOW` is at least `min_age_ms` past
/// the token's millisecond": `ms($$NOW) * 2^20 >= tok + min_age_ms * 2^20`,
/// in int64 arithmetic. It implies `ms($$NOW) >= (tok >> 20) + min_age_ms`,
/// so a token issued after a delete that passed it is greater than `tok`
/// unless `$$NOW` steps back by `min_age_ms` or more (see "Fencing tokens"
/// in `store`).
pub(super) fn token_older_than(min_age_ms: i64) -> Document {
    token_at_older_than(field::TOKEN, min_age_ms)
}

/// [`token_older_than`] for the token stored at `path` (`tok` in the lock
/// collection, `<field>.tok` in a user's document).
pub(in crate::store::mongo) fn token_at_older_than(path: &str, min_age_ms: i64) -> Document {
    doc! { "$gte": [
        { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << TOKEN_TIME_SHIFT] },
        { "$add": [format!("${path}"), min_age_ms << TOKEN_TIME_SHIFT] },
    ]}
}

/// The documents among `filter`'s that a release in delete mode deletes at
/// once: of our shape (int64 `tok`), not waited for by another owner (no
/// `wt`: such a release yields instead), with a token at least `min_age_ms`
/// old by the server's clock ([`token_older_than`]).
pub(super) fn deletable_filter(filter: Document, min_age_ms: i64) -> Document {
    doc! { "$and": [
        filter,
        {
            field::TOKEN: { "$type": "long" },
            field::WAITING_SINCE: { "$exists": false },
            field::HOLDERS: { "$exists": false },
            "$expr": token_older_than(min_age_ms),
        },
    ]}
}

/// Released documents of our shape among `filter`'s (no `lid`, int64 `tok`,
/// date `exp`), not yielded (`yu` not in the future), whose token is at least
/// `min_age_ms` old: what the follow-up delete of delete mode removes. A new
/// acquisition (which sets `lid`) never matches.
pub(super) fn released_filter(filter: Document, min_age_ms: i64) -> Document {
    doc! { "$and": [
        filter,
        {
            field::LEASE_ID: { "$exists": false },
            field::TOKEN: { "$type": "long" },
            field::EXPIRES_AT: { "$type": "date" },
            field::HOLDERS: { "$exists": false },
            "$expr": { "$and": [
                token_older_than(min_age_ms),
                { "$not": [{ "$gt": [format!("${}", field::YIELD_UNTIL), "$$NOW"] }] },
                { "$not": [{ "$gt": [format!("${}", field::HOLD_UNTIL), "$$NOW"] }] },
            ]},
        },
    ]}
}

/// The documents of `keys`.
pub(super) fn keys_filter(keys: &[LeaseKey]) -> Document {
    let keys: Vec<Bson> = keys.iter().map(|k| k.as_bson().clone()).collect();
    doc! { field::ID: { "$in": keys } }
}

/// A foreign holder's lock document `found` (as read by an info read) under
/// `key`, only while it is still of foreign shape with the `aid` and `ts` it
/// had: the filter of a force release's delete, so that a concurrent change
/// is not clobbered.
pub(super) fn foreign_filter(key: &LeaseKey, found: &Document) -> Document {
    let same = |name: &str| match found.get(name) {
        Some(value) => {
            doc! { "$expr": { "$eq": [format!("${name}"), { "$literal": value.clone() }] } }
        }
        None => doc! { name: { "$exists": false } },
    };
    doc! {
        field::ID: key.as_bson().clone(),
        "$and": [same(field::OWNER), same(field::RENEWED_AT)],
        "$nor": [{ field::TOKEN: { "$type": "long" }, field::EXPIRES_AT: { "$type": "date" } }],
    }
}

/// The document of `lease` of `owner`, only while it holds its lease id
/// and owner id.
pub(super) fn payload_filter(owner: &str, lease: &LeaseRef) -> Document {
    doc! {
        field::ID: &lease.key,
        field::LEASE_ID: bson_lease_id(lease.lease_id),
        field::OWNER: { "$eq": owner },
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
/// event; each reduced to what [`key_write`] reads
/// (docs/mongodb-behaviour.md, B12).
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
            updated(field::LEASE_ID): 1,
            updated(field::OWNER): 1,
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
/// document). `None` for an event of another kind, one missing the
/// fields its kind carries (`documentKey._id`, `fullDocument`,
/// `updateDescription`), or the update of a holder's acquisition on a
/// shared or semaphore key (`hs` changed without `rl`: the key's other
/// holders keep their leases, and nothing was freed).
pub(super) fn key_write(event: &Document) -> Option<KeyWrite> {
    let key = event_key(event)?;
    let lease_id = |doc: &Document| read_lease_id(doc.get(field::LEASE_ID));
    let owner = |doc: &Document| doc.get_str(field::OWNER).ok().map(str::to_string);
    match event.get_str("operationType").ok()? {
        "delete" => Some(KeyWrite {
            key,
            freed: true,
            lease_id: None,
            owner: None,
        }),
        "insert" | "replace" => {
            let doc = event.get_document("fullDocument").ok()?;
            Some(KeyWrite {
                key,
                freed: !doc.contains_key(field::LEASE_ID),
                lease_id: lease_id(doc),
                owner: owner(doc),
            })
        }
        "update" => {
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
                return Some(KeyWrite {
                    key,
                    freed: true,
                    lease_id: None,
                    owner: None,
                });
            }
            Some(KeyWrite {
                key,
                freed: removed(field::LEASE_ID),
                lease_id: lease_id(updated),
                owner: owner(updated),
            })
        }
        _ => None,
    }
}

/// The key of a change event's document (`documentKey._id`). Also read by
/// the in-document store's events (`document::events`).
pub(super) fn event_key(event: &Document) -> Option<LeaseKey> {
    let id = event.get_document("documentKey").ok()?.get(field::ID)?;
    Some(LeaseKey::from(id.clone()))
}

/// A lease id as stored (a UUID binary, [`bson_lease_id`]); `None` for a
/// missing value or one of another type.
pub(super) fn read_lease_id(value: Option<&Bson>) -> Option<Uuid> {
    match value {
        Some(Bson::Binary(b)) if b.subtype == BinarySubtype::Uuid => {
            Uuid::from_slice(&b.bytes).ok()
        }
        _ => None,
    }
}

/// The change-stream stage of observing one key: every event of its document.
pub(super) fn key_events_pipeline(key: &LeaseKey) -> [Document; 1] {
    [doc! { "$match": { "documentKey._id": key } }]
}

#[cfg(test)]
mod tests {
    use mongodb::bson::DateTime;

    use super::*;

    const LID: Uuid = Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);

    /// The value at a dotted `path` of `doc` (array items by index).
    fn at<'a>(doc: &'a Document, path: &str) -> &'a Bson {
        let mut parts = path.split('.');
        let mut node = doc
            .get(parts.next().unwrap())
            .unwrap_or_else(|| panic!("no {path} in {doc}"));
        for part in parts {
            node = match node {
                Bson::Document(d) => d.get(part),
                Bson::Array(items) => part.parse::<usize>().ok().and_then(|i| items.get(i)),
                _ => None,
            }
            .unwrap_or_else(|| panic!("no {path} in {doc}"));
        }
        node
    }

    fn bson(doc: Document) -> Bson {
        Bson::Document(doc)
    }

    /// The parts of the acquire pipeline's single `$replaceWith: { $cond: [wins, acquired, lost] }`.
    fn acquire_parts(waiting: bool) -> (Document, Document, Bson) {
        let pipeline = acquire_pipeline("me", 30_000, LID, waiting, None);
        assert_eq!(pipeline.len(), 1, "one stage: {pipeline:?}");
        let cond = at(&pipeline[0], "$replaceWith.$cond").as_array().unwrap();
        assert_eq!(cond.len(), 3);
        (
            cond[0].as_document().unwrap().clone(),
            cond[1].as_document().unwrap().clone(),
            cond[2].clone(),
        )
    }

    /// The acquire pipeline's "a retry of this acquisition" condition, as
    /// built for owner `me` and lease id `LID`.
    fn mine_condition() -> Document {
        doc! { "$and": [
            { "$eq": ["$lid", bson_lease_id(LID)] },
            { "$eq": ["$aid", { "$literal": "me" }] },
        ]}
    }

    #[test]
    fn acquire_counts_as_a_retry_only_under_this_lease_id_and_owner_id() {
        let (wins, acquired, _) = acquire_parts(false);
        assert_eq!(at(&wins, "$or.1"), &bson(mine_condition()));
        assert_eq!(at(&acquired, "tok.$cond.0"), &bson(mine_condition()));
    }

    #[test]
    fn classify_reports_a_document_with_our_lease_id_rewritten_to_another_owner_as_held() {
        let key = LeaseKey::from("k");
        let now = DateTime::from_millis(1_000_000);
        let exp = DateTime::from_millis(1_030_000);
        let stored = |aid: &str| {
            doc! {
                "aid": aid, "lid": bson_lease_id(LID), "tok": 7_i64, "exp": exp, "now": now,
            }
        };
        assert!(matches!(
            classify(&key, "me", LID, &stored("me")),
            AcquireOutcome::Acquired { token: 7 }
        ));
        match classify(&key, "me", LID, &stored("other")) {
            AcquireOutcome::Held { holder, remaining } => {
                assert_eq!(holder, "other");
                assert_eq!(remaining, Some(Duration::from_secs(30)));
            }
            other => panic!("expected held by other, got {other:?}"),
        }
    }

    #[test]
    fn lease_ids_are_stored_as_bson_uuids() {
        let Bson::Binary(binary) = bson_lease_id(LID) else {
            panic!("not binary");
        };
        assert_eq!(binary.subtype, mongodb::bson::spec::BinarySubtype::Uuid);
        assert_eq!(binary.bytes, LID.as_bytes());
        assert!(is_lease_id(Some(&bson_lease_id(LID)), LID));
        assert!(!is_lease_id(Some(&bson_lease_id(Uuid::nil())), LID));
        assert!(!is_lease_id(None, LID));
    }

    #[test]
    fn acquire_token_rule_is_max_of_previous_plus_one_and_server_ms_shifted_by_20() {
        let (_, acquired, _) = acquire_parts(false);
        let mine = mine_condition();
        assert_eq!(
            at(&acquired, "tok"),
            &bson(doc! { "$cond": [
                mine,
                "$tok",
                { "$max": [
                    { "$add": [{ "$ifNull": ["$tok", 0_i64] }, 1_i64] },
                    { "$multiply": [{ "$toLong": "$$NOW" }, 1_048_576_i64] },
                ]},
            ]})
        );
        assert_eq!(TOKEN_TIME_SHIFT, 20);
    }

    #[test]
    fn acquire_takes_the_lease_by_server_time_and_drops_the_last_acquisitions_fields() {
        let (_, acquired, _) = acquire_parts(false);
        let mine = mine_condition();
        assert_eq!(at(&acquired, "_id"), &Bson::from("$_id"));
        assert_eq!(at(&acquired, "aid"), &bson(doc! { "$literal": "me" }));
        assert_eq!(at(&acquired, "lid"), &bson_lease_id(LID));
        assert_eq!(at(&acquired, "ts"), &Bson::from("$$NOW"));
        assert_eq!(
            at(&acquired, "exp"),
            &bson(doc! { "$add": ["$$NOW", 30_000_i64] })
        );
        assert_eq!(
            at(&acquired, "acq"),
            &bson(doc! { "$cond": [mine.clone(), { "$ifNull": ["$acq", "$$NOW"] }, "$$NOW"] })
        );
        // Payload and waiting mark survive a retry only; the yield mark never does.
        assert_eq!(
            at(&acquired, "data"),
            &bson(doc! { "$cond": [mine.clone(), "$data", "$$REMOVE"] })
        );
        assert_eq!(
            at(&acquired, "wt"),
            &bson(doc! { "$cond": [mine, "$wt", "$$REMOVE"] })
        );
        let names: Vec<&str> = acquired.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            ["_id", "aid", "lid", "tok", "acq", "ts", "exp", "data", "wt"]
        );
    }

    #[test]
    fn acquire_wins_on_a_fresh_document_a_retry_or_an_expired_lease_not_yielded_by_us() {
        let (wins, _, _) = acquire_parts(false);
        let our_shape = doc! { "$and": [
            { "$eq": [{ "$type": "$exp" }, "date"] },
            { "$eq": [{ "$type": "$tok" }, "long"] },
        ]};
        let yielded_by_us = doc! { "$and": [
            { "$eq": ["$aid", { "$literal": "me" }] },
            { "$gt": ["$yu", "$$NOW"] },
        ]};
        assert_eq!(
            wins,
            doc! { "$or": [
                { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 1] },
                mine_condition(),
                { "$and": [our_shape, { "$lte": ["$exp", "$$NOW"] }, { "$not": [yielded_by_us] }] },
            ]}
        );
    }

    #[test]
    fn a_losing_attempt_returns_the_document_unchanged_unless_waiting() {
        let (_, _, lost) = acquire_parts(false);
        assert_eq!(lost, Bson::from("$$ROOT"));
    }

    #[test]
    fn a_losing_waiting_attempt_marks_only_a_live_lease_of_another_owner_and_only_once() {
        let (_, _, lost) = acquire_parts(true);
        let cond = at(lost.as_document().unwrap(), "$cond").as_array().unwrap();
        assert_eq!(
            cond[0],
            bson(doc! { "$and": [
                { "$and": [
                    { "$eq": [{ "$type": "$exp" }, "date"] },
                    { "$eq": [{ "$type": "$tok" }, "long"] },
                ]},
                { "$eq": [{ "$type": "$lid" }, "binData"] },
                { "$not": [{ "$lte": ["$exp", "$$NOW"] }] },
                { "$not": [{ "$eq": ["$aid", { "$literal": "me" }] }] },
            ]})
        );
        assert_eq!(
            cond[1],
            bson(doc! { "$mergeObjects": ["$$ROOT", { "wt": { "$ifNull": ["$wt", "$$NOW"] } }] })
        );
        let (shared_live, mark) = crate::store::mongo::kinds::exclusive_waiter_mark("me", 30_000);
        assert_eq!(
            cond[2],
            bson(doc! { "$cond": [shared_live, mark, "$$ROOT"] }),
            "else, on live shared holders, its waiting mark"
        );
    }

    #[test]
    fn an_owner_id_is_written_and_compared_literally_never_as_an_expression() {
        let pipeline = acquire_pipeline("$tok", 1, LID, true, None);
        let cond = at(&pipeline[0], "$replaceWith.$cond").as_array().unwrap();
        let acquired = cond[1].as_document().unwrap();
        assert_eq!(at(acquired, "aid"), &bson(doc! { "$literal": "$tok" }));
        let yielded_by_us = at(cond[0].as_document().unwrap(), "$or.2.$and.2.$not.0");
        assert_eq!(
            at(yielded_by_us.as_document().unwrap(), "$and.0"),
            &bson(doc! { "$eq": ["$aid", { "$literal": "$tok" }] })
        );
    }

    #[test]
    fn payload_filters_match_key_lease_id_and_owner_id() {
        let other = Uuid::from_u128(7);
        let leases = [
            LeaseRef {
                key: "a".into(),
                lease_id: LID,
            },
            LeaseRef {
                key: "b".into(),
                lease_id: other,
            },
        ];
        assert_eq!(
            payload_filter("me", &leases[0]),
            doc! { "_id": "a", "lid": bson_lease_id(LID), "aid": { "$eq": "me" } }
        );
        assert_eq!(
            payload_update(doc! { "x": 1 }),
            doc! { "$set": { "data": { "x": 1 } } }
        );
    }

    #[test]
    fn release_by_owner_skips_lease_ids_in_flight_released_and_foreign_documents() {
        assert_eq!(
            owner_filter("me", &[LID]),
            doc! {
                "aid": "me",
                "lid": { "$exists": true, "$nin": [bson_lease_id(LID)] },
                "tok": { "$type": "long" },
                "exp": { "$type": "date" },
            }
        );
    }

    #[test]
    fn reads_project_the_servers_now() {
        assert_eq!(at(&acquire_projection(), "now"), &Bson::from("$$NOW"));
        assert_eq!(at(&info_projection(), "now"), &Bson::from("$$NOW"));
        assert_eq!(list_min(&"k".into()), doc! { "_id": "k" });
        assert_eq!(list_min(&7_i64.into()), doc! { "_id": 7_i64 });
        assert_eq!(id_index(), doc! { "_id": 1 });
    }

    #[test]
    fn announced_writes_are_those_that_set_or_remove_the_lease_id_or_owner_id() {
        let [matched, projected] = release_events_pipeline();
        assert_eq!(
            matched,
            doc! { "$match": { "$or": [
                { "operationType": { "$in": ["delete", "insert", "replace"] } },
                { "operationType": "update", "$or": [
                    { "updateDescription.updatedFields.lid": { "$exists": true } },
                    { "updateDescription.updatedFields.aid": { "$exists": true } },
                    { "updateDescription.removedFields": { "$in": ["lid", "aid"] } },
                    { "updateDescription.updatedFields.rl": { "$exists": true } },
                ]},
            ]}}
        );
        let kept: Vec<&str> = projected
            .get_document("$project")
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(
            kept,
            [
                "operationType",
                "documentKey._id",
                "fullDocument.lid",
                "fullDocument.aid",
                "updateDescription.updatedFields.lid",
                "updateDescription.updatedFields.aid",
                "updateDescription.updatedFields.rl",
                "updateDescription.removedFields",
                "holders",
            ]
        );
    }

    #[test]
    fn announced_writes_are_read_from_each_kind_of_event() {
        let key = doc! { "_id": "k" };
        let write = |freed, lease_id, owner: Option<&str>| KeyWrite {
            key: "k".into(),
            freed,
            lease_id,
            owner: owner.map(str::to_string),
        };
        let event = |kind: &str, rest: Document| {
            let mut e = doc! { "operationType": kind, "documentKey": key.clone() };
            e.extend(rest);
            e
        };
        let full = doc! { "fullDocument": { "aid": "me", "lid": bson_lease_id(LID) } };
        assert_eq!(
            key_write(&event("delete", doc! {})),
            Some(write(true, None, None))
        );
        assert_eq!(
            key_write(&event("insert", full.clone())),
            Some(write(false, Some(LID), Some("me")))
        );
        assert_eq!(
            key_write(&event("replace", full)),
            Some(write(false, Some(LID), Some("me")))
        );
        assert_eq!(
            key_write(&event(
                "replace",
                doc! { "fullDocument": { "aid": "x", "lid": "not a uuid" } }
            )),
            Some(write(false, None, Some("x")))
        );
        assert_eq!(
            key_write(&event("replace", doc! { "fullDocument": { "aid": "x" } })),
            Some(write(true, None, Some("x")))
        );
        let update = |updated: Document, removed: Vec<&str>| {
            event(
                "update",
                doc! { "updateDescription": { "updatedFields": updated, "removedFields": removed } },
            )
        };
        assert_eq!(
            key_write(&update(doc! {}, vec!["lid"])),
            Some(write(true, None, None)),
            "a release"
        );
        assert_eq!(
            key_write(&update(doc! { "aid": "other" }, vec![])),
            Some(write(false, None, Some("other")))
        );
        assert_eq!(
            key_write(&update(doc! {}, vec!["aid"])),
            Some(write(false, None, None))
        );
        assert_eq!(
            key_write(&update(doc! { "lid": bson_lease_id(LID) }, vec![])),
            Some(write(false, Some(LID), None))
        );
        assert_eq!(
            key_write(&update(
                doc! { "rl": DateTime::from_millis(5), "aid": "b", "hs": [] },
                vec!["pm"]
            )),
            Some(write(true, None, None)),
            "a holder's release"
        );
        assert_eq!(
            key_write(&update(
                doc! { "aid": "b", "tok": 9_i64, "hs.2": { "aid": "b" } },
                vec![]
            )),
            None,
            "a holder's acquisition"
        );
        assert_eq!(
            key_write(&update(doc! { "aid": "b", "hs": [] }, vec![])),
            None
        );
        let mut projected = update(doc! { "aid": "b" }, vec![]);
        projected.insert("holders", true);
        assert_eq!(key_write(&projected), None, "as the server computed it");
        assert_eq!(key_write(&event("invalidate", doc! {})), None);
        assert_eq!(
            key_write(&doc! { "operationType": "delete", "documentKey": { "_id": 1 } }),
            Some(KeyWrite {
                key: 1.into(),
                freed: true,
                lease_id: None,
                owner: None,
            }),
            "a key of any BSON type"
        );
    }

    #[test]
    fn only_a_write_of_this_lease_id_under_this_owner_keeps_a_held_lease() {
        let other = Uuid::from_u128(9);
        let write = |freed, lease_id, owner: Option<&str>| KeyWrite {
            key: "k".into(),
            freed,
            lease_id,
            owner: owner.map(str::to_string),
        };
        assert!(write(false, Some(LID), Some("me")).keeps(LID, "me"));
        assert!(write(false, Some(LID), None).keeps(LID, "me"));
        assert!(!write(false, Some(LID), Some("other")).keeps(LID, "me"));
        assert!(!write(false, Some(other), Some("me")).keeps(LID, "me"));
        assert!(!write(false, None, Some("other")).keeps(LID, "me"));
        assert!(!write(false, None, None).keeps(LID, "me"));
        assert!(!write(true, None, None).keeps(LID, "me"));
    }

    fn returned(lid: Uuid, owner: &str, exp_ms: i64, now_ms: i64) -> Document {
        doc! {
            "_id": "k", "aid": owner, "lid": bson_lease_id(lid), "tok": 5_i64,
            "exp": DateTime::from_millis(exp_ms), "now": DateTime::from_millis(now_ms),
        }
    }

    #[test]
    fn classify_reads_our_lease_id_as_acquired_and_another_as_held_until_its_expiry() {
        let ours = returned(LID, "me", 10_000, 1_000);
        assert_eq!(
            classify(&"k".into(), "me", LID, &ours),
            AcquireOutcome::Acquired { token: 5 }
        );
        let theirs = returned(Uuid::from_u128(9), "them", 10_000, 1_000);
        assert_eq!(
            classify(&"k".into(), "me", LID, &theirs),
            AcquireOutcome::Held {
                holder: "them".into(),
                remaining: Some(Duration::from_millis(9_000)),
            }
        );
    }

    #[test]
    fn classify_counts_a_yield_against_the_yielding_owner_only() {
        let mut released = returned(Uuid::from_u128(9), "me", 1_000, 2_000);
        released.remove("lid");
        released.insert("yu", DateTime::from_millis(5_000));
        assert_eq!(
            classify(&"k".into(), "me", LID, &released),
            AcquireOutcome::Held {
                holder: "me".into(),
                remaining: Some(Duration::from_millis(3_000)),
            }
        );
        released.insert("aid", "them");
        assert_eq!(
            classify(&"k".into(), "me", LID, &released),
            AcquireOutcome::Held {
                holder: "them".into(),
                remaining: Some(Duration::ZERO),
            }
        );
    }

    #[test]
    fn classify_reads_a_document_of_foreign_shape_as_held_by_its_aid_with_no_known_expiry() {
        for (foreign, holder) in [
            (doc! { "_id": "k", "tok": 1, "exp": "tomorrow" }, ""),
            (
                doc! { "_id": "k", "aid": "java-app-1", "ts": DateTime::from_millis(5) },
                "java-app-1",
            ),
            (doc! { "_id": "k", "aid": 7_i64 }, r#"{"$numberLong":"7"}"#),
        ] {
            assert_eq!(
                classify(&"k".into(), "me", LID, &foreign),
                AcquireOutcome::Held {
                    holder: holder.into(),
                    remaining: None,
                },
                "{foreign}"
            );
        }
    }

    #[test]
    fn a_foreign_lock_is_deleted_only_while_it_is_the_document_read() {
        let ts = DateTime::from_millis(5);
        let found = doc! { "_id": "k", "aid": "java-app-1", "ts": ts, "now": ts };
        assert_eq!(
            foreign_filter(&"k".into(), &found),
            doc! {
                "_id": "k",
                "$and": [
                    { "$expr": { "$eq": ["$aid", { "$literal": "java-app-1" }] } },
                    { "$expr": { "$eq": ["$ts", { "$literal": ts }] } },
                ],
                "$nor": [{ "tok": { "$type": "long" }, "exp": { "$type": "date" } }],
            }
        );
        let bare = doc! { "_id": "k", "now": ts };
        assert_eq!(
            foreign_filter(&"k".into(), &bare)
                .get_array("$and")
                .unwrap(),
            &vec![
                Bson::from(doc! { "aid": { "$exists": false } }),
                Bson::from(doc! { "ts": { "$exists": false } }),
            ]
        );
    }

    #[test]
    fn delete_mode_deletes_only_tokens_old_enough_by_server_time_and_unmarked_leases() {
        let old_enough = doc! { "$gte": [
            { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << 20] },
            { "$add": ["$tok", 1_000_i64 << 20] },
        ]};
        assert_eq!(token_older_than(1_000), old_enough);
        let filter = doc! { "_id": "k" };
        assert_eq!(
            deletable_filter(filter.clone(), 1_000),
            doc! { "$and": [filter.clone(), {
                "tok": { "$type": "long" },
                "wt": { "$exists": false },
                "hs": { "$exists": false },
                "$expr": old_enough.clone(),
            }]}
        );
        assert_eq!(
            released_filter(filter.clone(), 1_000),
            doc! { "$and": [filter, {
                "lid": { "$exists": false },
                "tok": { "$type": "long" },
                "exp": { "$type": "date" },
                "hs": { "$exists": false },
                "$expr": { "$and": [
                    old_enough,
                    { "$not": [{ "$gt": ["$yu", "$$NOW"] }] },
                    { "$not": [{ "$gt": ["$hl", "$$NOW"] }] },
                ]},
            }]}
        );
    }

    #[test]
    fn release_by_owner_matches_unreleased_documents_of_our_shape_only() {
        assert_eq!(
            owner_leases_filter("w"),
            doc! {
                "aid": "w",
                "lid": { "$exists": true },
                "tok": { "$type": "long" },
                "exp": { "$type": "date" },
            }
        );
    }
}
