//! The BSON of every command [`DocumentStore`](super::DocumentStore) sends:
//! the lock collection's protocol (`super::super::pipeline`) with every lock
//! field under the lock field `F` of the user's document, and the user's
//! other fields never written by acquire, renewal or release. Pure functions
//! of their arguments: the unit tests below check their shape without a
//! server; what the server does with them is tested against a real `mongod`
//! (`tests/document_lease/protocol.rs`).

use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Bson, DateTime, Document, doc};
use uuid::Uuid;

use super::super::pipeline::{bson_lease_id, token_at_older_than};
use crate::key::LeaseKey;
use crate::store::{KeyWrite, LeaseRef, TOKEN_TIME_SHIFT, field};

/// The paths of the lock fields under the lock field `F` of a user's document.
#[derive(Debug, Clone)]
pub(super) struct Paths {
    field: String,
}

impl Paths {
    /// The lock fields under `field` (checked by `document::check_field`: a
    /// top-level name without `.` or `$`).
    pub(super) fn new(field: &str) -> Self {
        Paths {
            field: field.to_string(),
        }
    }

    /// The lock field `F` itself.
    pub(super) fn field(&self) -> &str {
        &self.field
    }

    /// The dotted path `F.<name>` of lock field `name` (one of [`field`]).
    pub(super) fn at(&self, name: &str) -> String {
        format!("{}.{name}", self.field)
    }

    /// The field path expression `$F.<name>`.
    fn var(&self, name: &str) -> String {
        format!("${}.{name}", self.field)
    }

    /// The field path expression `$F`.
    fn whole(&self) -> String {
        format!("${}", self.field)
    }

    /// The temporary top-level field that keeps `F` while the user's update
    /// pipeline runs ([`write_pipeline`]).
    fn stash(&self) -> String {
        format!("{}{}", crate::document::RESERVED_PREFIX, self.field)
    }
}

/// The filter of one document.
pub(super) fn id_filter(key: &LeaseKey) -> Document {
    doc! { field::ID: key }
}

/// The acquire update of a user's document: one `findAndModify` on `_id`
/// alone (never an `$expr` in an upsert filter, docs/mongodb-behaviour.md,
/// B1), with the lock collection's rules applied to `F`
/// (`acquire_pipeline` of the lock collection): the acquisition wins if `F`
/// is missing, is ours under this lease id and owner id (a retry), or is of
/// our shape (int64 `tok`, date `exp`), expired by `$$NOW` and not yielded
/// by this owner. Winning merges the new `F` into the document; losing
/// leaves the document as it is (no write, docs/mongodb-behaviour.md, B2),
/// except that a `waiting` attempt marks (`F.wt`) a live lease of another
/// owner once. An `F` of any other shape (the user's own `_lease` field) is
/// a lock held by a foreign holder, never modified.
///
/// With `create` (the upsert's fields), a document that has only `_id` (the
/// one an upsert starts from) first gets `create`'s fields, as literals.
pub(super) fn acquire_pipeline(
    paths: &Paths,
    owner: &str,
    ttl_ms: i64,
    lease_id: Uuid,
    waiting: bool,
    create: Option<&Document>,
) -> Vec<Document> {
    let lid = bson_lease_id(lease_id);
    let f = paths.field();
    let free = doc! { "$eq": [{ "$type": paths.whole() }, "missing"] };
    let same_owner = doc! { "$eq": [paths.var(field::OWNER), { "$literal": owner }] };
    let mine = doc! { "$and": [
        { "$eq": [paths.var(field::LEASE_ID), lid.clone()] },
        same_owner.clone(),
    ]};
    let our_shape = doc! { "$and": [
        { "$eq": [{ "$type": paths.var(field::EXPIRES_AT) }, "date"] },
        { "$eq": [{ "$type": paths.var(field::TOKEN) }, "long"] },
    ]};
    let expired = doc! { "$lte": [paths.var(field::EXPIRES_AT), "$$NOW"] };
    let yielded_by_us = doc! { "$and": [
        same_owner.clone(),
        { "$gt": [paths.var(field::YIELD_UNTIL), "$$NOW"] },
    ]};
    let wins = doc! { "$or": [
        free,
        mine.clone(),
        { "$and": [our_shape.clone(), expired.clone(), { "$not": [yielded_by_us] }] },
    ]};
    let next_token = doc! { "$cond": [
        mine.clone(),
        paths.var(field::TOKEN),
        { "$max": [
            { "$add": [{ "$ifNull": [paths.var(field::TOKEN), 0_i64] }, 1_i64] },
            { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << TOKEN_TIME_SHIFT] },
        ]},
    ]};
    let acquired_at = doc! { "$cond": [
        mine.clone(),
        { "$ifNull": [paths.var(field::ACQUIRED_AT), "$$NOW"] },
        "$$NOW",
    ]};
    let keep = |name: &str| doc! { "$cond": [mine.clone(), paths.var(name), "$$REMOVE"] };
    let acquired = doc! {
        field::OWNER: { "$literal": owner },
        field::LEASE_ID: lid,
        field::TOKEN: next_token,
        field::ACQUIRED_AT: acquired_at,
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: { "$add": ["$$NOW", ttl_ms] },
        field::PAYLOAD: keep(field::PAYLOAD),
        field::WAITING_SINCE: keep(field::WAITING_SINCE),
    };
    let took = doc! { "$mergeObjects": ["$$ROOT", { f: acquired }] };
    let lost = if waiting {
        let held_by_other = doc! { "$and": [
            our_shape,
            { "$eq": [{ "$type": paths.var(field::LEASE_ID) }, "binData"] },
            { "$not": [expired] },
            { "$not": [same_owner] },
        ]};
        let marked = doc! { "$mergeObjects": ["$$ROOT", { f: { "$mergeObjects": [paths.whole(), {
            field::WAITING_SINCE: { "$ifNull": [paths.var(field::WAITING_SINCE), "$$NOW"] },
        }]}}]};
        Bson::from(doc! { "$cond": [held_by_other, marked, "$$ROOT"] })
    } else {
        Bson::from("$$ROOT")
    };
    let mut stages = Vec::with_capacity(2);
    if let Some(create) = create {
        let only_id = doc! { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 1] };
        stages.push(doc! { "$replaceWith": { "$cond": [
            only_id,
            { "$mergeObjects": ["$$ROOT", { "$literal": create.clone() }] },
            "$$ROOT",
        ]}});
    }
    stages.push(doc! { "$replaceWith": { "$cond": [wins, took, lost] } });
    stages
}

/// The field of [`acquire_projection`] that holds the whole document.
pub(super) const DOCUMENT: &str = "doc";

/// The projection of an acquire: the whole document as stored (`doc`) and
/// the server's `$$NOW` (`now`), so that a held lease's remaining time is
/// computed on the server's clock (docs/mongodb-behaviour.md, B11).
pub(super) fn acquire_projection() -> Document {
    doc! { field::ID: 0, DOCUMENT: "$$ROOT", "now": "$$NOW" }
}

/// The lock field `F` of `document` as the lock collection's readers
/// (`classify`, `lease_info`) read a lock document, with `now`: `F`'s fields
/// if it is a document; otherwise (a value of foreign shape) a document
/// without our fields, which they read as a foreign holder's lock. `None`
/// if the document has no `F`. Carries a field count above one, so that an
/// empty `F` (`{}`) is a foreign holder's, not an empty placeholder.
pub(super) fn lock_view(paths: &Paths, document: &Document, now: Bson) -> Option<Document> {
    let mut view = match document.get(paths.field())? {
        Bson::Document(lock) => lock.clone(),
        _ => Document::new(),
    };
    view.insert("now", now);
    view.insert(crate::store::FIELD_COUNT, 2_i32);
    Some(view)
}

/// The projection of `inspect`: `F` and the server's `$$NOW`.
pub(super) fn info_projection(paths: &Paths) -> Document {
    doc! { paths.field(): 1, "now": "$$NOW" }
}

/// The documents of `leases` of `owner`: `_id` among their keys, `F.lid`
/// among their lease ids and `F.aid` the owner id (`lease_filter` of the
/// lock collection).
pub(super) fn lease_filter(paths: &Paths, owner: &str, leases: &[LeaseRef]) -> Document {
    let keys: Vec<Bson> = leases.iter().map(|l| l.key.as_bson().clone()).collect();
    let ids: Vec<Bson> = leases.iter().map(|l| bson_lease_id(l.lease_id)).collect();
    doc! {
        field::ID: { "$in": keys },
        paths.at(field::LEASE_ID): { "$in": ids },
        paths.at(field::OWNER): { "$eq": owner },
    }
}

/// The renewal: `F.ts = $$NOW`, `F.exp = $$NOW + ttl_ms`; nothing else changes.
pub(super) fn renew_update(paths: &Paths, ttl_ms: i64) -> Vec<Document> {
    vec![doc! { "$set": {
        paths.at(field::RENEWED_AT): "$$NOW",
        paths.at(field::EXPIRES_AT): { "$add": ["$$NOW", ttl_ms] },
    }}]
}

/// The released state (`release_update` of the lock collection, under `F`):
/// `F.exp` moves to now, `F.lid` and `F.wt` are removed, and `F.yu` is set
/// to now + `yield_ms` if another owner waited (`F.wt`). The next acquire
/// takes it over with the next token.
pub(super) fn release_update(paths: &Paths, yield_ms: i64) -> Vec<Document> {
    let waited = doc! { "$ne": [{ "$type": paths.var(field::WAITING_SINCE) }, "missing"] };
    vec![
        doc! { "$set": {
            paths.at(field::EXPIRES_AT): { "$min": [paths.var(field::EXPIRES_AT), "$$NOW"] },
            paths.at(field::YIELD_UNTIL): { "$cond": [
                waited,
                { "$add": ["$$NOW", yield_ms] },
                paths.var(field::YIELD_UNTIL),
            ]},
        }},
        doc! { "$unset": [paths.at(field::LEASE_ID), paths.at(field::WAITING_SINCE)] },
    ]
}

/// Removes the lock field: what "delete" means for in-document leases.
pub(super) fn remove_update(paths: &Paths) -> Document {
    doc! { "$unset": { paths.field(): "" } }
}

/// The documents among `filter`'s whose lock a release removes at once
/// (`deletable_filter` of the lock collection): `F` of our shape, not
/// waited for (no `F.wt`), its token at least `min_age_ms` old by `$$NOW`.
pub(super) fn removable_filter(paths: &Paths, filter: Document, min_age_ms: i64) -> Document {
    doc! { "$and": [
        filter,
        {
            paths.at(field::TOKEN): { "$type": "long" },
            paths.at(field::WAITING_SINCE): { "$exists": false },
            "$expr": token_at_older_than(&paths.at(field::TOKEN), min_age_ms),
        },
    ]}
}

/// Released locks of our shape among `filter`'s (no `F.lid`, int64 `F.tok`,
/// date `F.exp`), not yielded, whose token is at least `min_age_ms` old:
/// what the follow-up removal takes away (`released_filter` of the lock
/// collection). A new acquisition (which sets `F.lid`) never matches.
pub(super) fn released_filter(paths: &Paths, filter: Document, min_age_ms: i64) -> Document {
    doc! { "$and": [
        filter,
        {
            paths.at(field::LEASE_ID): { "$exists": false },
            paths.at(field::TOKEN): { "$type": "long" },
            paths.at(field::EXPIRES_AT): { "$type": "date" },
            "$expr": { "$and": [
                token_at_older_than(&paths.at(field::TOKEN), min_age_ms),
                { "$not": [{ "$gt": [paths.var(field::YIELD_UNTIL), "$$NOW"] }] },
            ]},
        },
    ]}
}

/// The documents of `keys`.
pub(super) fn keys_filter(keys: &[LeaseKey]) -> Document {
    let keys: Vec<Bson> = keys.iter().map(|k| k.as_bson().clone()).collect();
    doc! { field::ID: { "$in": keys } }
}

/// Every lease held under `owner` in this collection, except those with a
/// lease id in `except`; `F` of our shape only (`owner_filter` of the lock
/// collection).
pub(super) fn owner_filter(paths: &Paths, owner: &str, except: &[Uuid]) -> Document {
    let except: Vec<Bson> = except.iter().copied().map(bson_lease_id).collect();
    doc! {
        paths.at(field::OWNER): owner,
        paths.at(field::LEASE_ID): { "$exists": true, "$nin": except },
        paths.at(field::TOKEN): { "$type": "long" },
        paths.at(field::EXPIRES_AT): { "$type": "date" },
    }
}

/// The document of `lease` of `owner` while it holds its lease id and owner
/// id (renewal's condition, for `set_payload`).
pub(super) fn payload_filter(paths: &Paths, owner: &str, lease: &LeaseRef) -> Document {
    doc! {
        field::ID: &lease.key,
        paths.at(field::LEASE_ID): bson_lease_id(lease.lease_id),
        paths.at(field::OWNER): { "$eq": owner },
    }
}

/// Sets the payload `F.data`; nothing else changes.
pub(super) fn payload_update(paths: &Paths, payload: Document) -> Document {
    doc! { "$set": { paths.at(field::PAYLOAD): payload } }
}

/// The document of `lease` of `owner` while the lease is held by the
/// server's clock: its lease id, its owner id, and `F.exp > $$NOW`. The
/// filter of every write under the lease.
pub(super) fn held_filter(paths: &Paths, owner: &str, lease: &LeaseRef) -> Document {
    doc! {
        field::ID: &lease.key,
        paths.at(field::LEASE_ID): bson_lease_id(lease.lease_id),
        paths.at(field::OWNER): { "$eq": owner },
        "$expr": { "$gt": [paths.var(field::EXPIRES_AT), "$$NOW"] },
    }
}

/// [`held_filter`], only while the lock can be removed by the write that
/// releases it: not waited for (no `F.wt`) and its token at least
/// `min_age_ms` old by `$$NOW`.
pub(super) fn held_removable_filter(
    paths: &Paths,
    owner: &str,
    lease: &LeaseRef,
    min_age_ms: i64,
) -> Document {
    doc! {
        field::ID: &lease.key,
        paths.at(field::LEASE_ID): bson_lease_id(lease.lease_id),
        paths.at(field::OWNER): { "$eq": owner },
        paths.at(field::WAITING_SINCE): { "$exists": false },
        "$expr": { "$and": [
            { "$gt": [paths.var(field::EXPIRES_AT), "$$NOW"] },
            token_at_older_than(&paths.at(field::TOKEN), min_age_ms),
        ]},
    }
}

/// [`held_filter`] with a waiting mark (`F.wt`) or without one.
pub(super) fn held_waited_filter(
    paths: &Paths,
    owner: &str,
    lease: &LeaseRef,
    waited: bool,
) -> Document {
    let mut filter = held_filter(paths, owner, lease);
    filter.insert(paths.at(field::WAITING_SINCE), doc! { "$exists": waited });
    filter
}

/// How a write under an in-document lease leaves the lock field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LockAfter {
    /// Held as it was (`DocumentLease::update`).
    Kept,
    /// Removed (a release of a lease old enough and not waited for).
    Removed,
    /// The released state: no `F.lid` nor `F.wt`, `F.exp` and `F.ts` now.
    /// With `Some(until)`, yielded until then (another owner waited): the
    /// update operators have no server-time arithmetic, so `until` is the
    /// client's clock plus the yield window (`F.yu` only delays this
    /// owner's own next acquisition; it decides no lease).
    Released(Option<DateTime>),
}

/// The user's update operators `user` with ours merged in: an operator both
/// use gets the paths of both (they never overlap: the user's update never
/// names the lock field, `document::check_update`).
pub(super) fn merge_operators(user: &Document, ours: Document) -> Document {
    let mut merged = user.clone();
    for (operator, paths) in ours {
        match (merged.get_mut(&operator), paths) {
            (Some(Bson::Document(theirs)), Bson::Document(paths)) => theirs.extend(paths),
            (_, paths) => {
                merged.insert(operator, paths);
            }
        }
    }
    merged
}

/// The user's update operators plus what leaves the lock field `after`.
pub(super) fn write_operators(paths: &Paths, user: &Document, after: LockAfter) -> Document {
    let ours = match after {
        LockAfter::Kept => return user.clone(),
        LockAfter::Removed => remove_update(paths),
        LockAfter::Released(yielded) => {
            let mut ours = doc! {
                "$unset": { paths.at(field::LEASE_ID): "", paths.at(field::WAITING_SINCE): "" },
                "$currentDate": {
                    paths.at(field::EXPIRES_AT): true,
                    paths.at(field::RENEWED_AT): true,
                },
            };
            if let Some(until) = yielded {
                ours.insert("$set", doc! { paths.at(field::YIELD_UNTIL): until });
            }
            ours
        }
    };
    merge_operators(user, ours)
}

/// The user's update pipeline `user` run under the lease: a first stage
/// keeps `F` in a temporary top-level field (whatever the user's stages do
/// to `F`, it is restored from there), then the user's stages, then `F` is
/// restored and the temporary field removed. If the user's stages dropped
/// the temporary field (a `$replaceWith` that does not keep `$$ROOT`) or
/// changed it (it no longer holds this owner id and `token`), `F` is
/// restored in the released state with the lease's owner id and `token` (no
/// lease id): the lease is then lost, never a foreign holder's lock.
///
/// With `release`, `F` ends as [`release_update`] and the removal of
/// [`held_removable_filter`] would leave it: removed if not waited for and
/// the token at least `min_age_ms` old by `$$NOW`; otherwise released
/// (yielded if waited for).
pub(super) fn write_pipeline(
    paths: &Paths,
    owner: &str,
    token: u64,
    user: &[Document],
    release: bool,
    yield_ms: i64,
    min_age_ms: i64,
) -> Vec<Document> {
    let stash = paths.stash();
    let kept = |name: &str| format!("${stash}.{name}");
    let mut stages = Vec::with_capacity(user.len() + 4);
    stages.push(doc! { "$set": { &stash: paths.whole() } });
    stages.extend(user.iter().cloned());
    let fallback = doc! {
        field::OWNER: { "$literal": owner },
        field::TOKEN: { "$literal": token as i64 },
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: "$$NOW",
    };
    // Restored only if it still holds this lease (its owner id and token):
    // a stage that dropped or overwrote it must not decide the lock field.
    let still_ours = doc! { "$and": [
        { "$eq": [kept(field::OWNER), { "$literal": owner }] },
        { "$eq": [kept(field::TOKEN), { "$literal": token as i64 }] },
    ]};
    stages.push(
        doc! { "$set": { &stash: { "$cond": [still_ours, format!("${stash}"), fallback] } } },
    );
    if !release {
        stages.push(doc! { "$set": { paths.field(): format!("${stash}") } });
        stages.push(doc! { "$unset": [&stash] });
        return stages;
    }
    let waited = doc! { "$ne": [{ "$type": kept(field::WAITING_SINCE) }, "missing"] };
    let removable = doc! { "$and": [
        { "$not": [waited.clone()] },
        { "$eq": [{ "$type": kept(field::TOKEN) }, "long"] },
        token_at_older_than(&format!("{stash}.{}", field::TOKEN), min_age_ms),
    ]};
    let released = doc! { "$mergeObjects": [format!("${stash}"), {
        field::EXPIRES_AT: { "$min": [kept(field::EXPIRES_AT), "$$NOW"] },
        field::RENEWED_AT: "$$NOW",
        field::YIELD_UNTIL: { "$cond": [
            waited,
            { "$add": ["$$NOW", yield_ms] },
            kept(field::YIELD_UNTIL),
        ]},
    }]};
    stages.push(doc! { "$set": { paths.field(): { "$cond": [removable, "$$REMOVE", released] } } });
    stages.push(doc! { "$unset": [
        stash,
        paths.at(field::LEASE_ID),
        paths.at(field::WAITING_SINCE),
    ]});
    stages
}

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
/// lease id and owner id (docs/mongodb-behaviour.md, B12, B15). Each event is
/// reduced to what [`key_write`] reads.
pub(super) fn release_events_pipeline(paths: &Paths) -> [Document; 2] {
    let updated = |name: &str| {
        doc! { "$getField": { "field": { "$literal": name }, "input": "$updateDescription.updatedFields" } }
    };
    let set = |name: &str| doc! { "$ne": [{ "$type": updated(name) }, "missing"] };
    let (f, lid, aid) = (
        paths.field().to_string(),
        paths.at(field::LEASE_ID),
        paths.at(field::OWNER),
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
            "updateDescription.removedFields": 1,
            "setLock": updated(&f),
            "setLid": updated(&lid),
            "setAid": updated(&aid),
        }},
    ]
}

/// Reads one event of [`release_events_pipeline`]. `None` for an event of
/// another kind, or one missing the fields its kind carries.
pub(super) fn key_write(paths: &Paths, event: &Document) -> Option<KeyWrite> {
    let key = LeaseKey::from(
        event
            .get_document("documentKey")
            .ok()?
            .get(field::ID)?
            .clone(),
    );
    let lease_id = |value: Option<&Bson>| match value {
        Some(Bson::Binary(b)) if b.subtype == BinarySubtype::Uuid => {
            Uuid::from_slice(&b.bytes).ok()
        }
        _ => None,
    };
    let owner = |value: Option<&Bson>| value.and_then(Bson::as_str).map(str::to_string);
    match event.get_str("operationType").ok()? {
        "delete" => Some(KeyWrite {
            key,
            freed: true,
            lease_id: None,
            owner: None,
        }),
        "insert" | "replace" => {
            let doc = event.get_document("fullDocument").ok()?;
            let lock = doc.get_document(paths.field()).ok();
            Some(KeyWrite {
                key,
                freed: !lock.is_some_and(|l| l.contains_key(field::LEASE_ID)),
                lease_id: lease_id(lock.and_then(|l| l.get(field::LEASE_ID))),
                owner: owner(lock.and_then(|l| l.get(field::OWNER))),
            })
        }
        "update" => {
            let removed = |name: &str| {
                event
                    .get_document("updateDescription")
                    .and_then(|u| u.get_array("removedFields"))
                    .is_ok_and(|r| r.iter().any(|f| f.as_str() == Some(name)))
            };
            let whole = event.get_document("setLock").ok();
            let set_whole = event.contains_key("setLock");
            let lid = event
                .get("setLid")
                .or_else(|| whole.and_then(|l| l.get(field::LEASE_ID)));
            let aid = event
                .get("setAid")
                .or_else(|| whole.and_then(|l| l.get(field::OWNER)));
            let freed = removed(paths.field())
                || removed(&paths.at(field::LEASE_ID))
                || (set_whole && !whole.is_some_and(|l| l.contains_key(field::LEASE_ID)));
            Some(KeyWrite {
                key,
                freed,
                lease_id: lease_id(lid),
                owner: owner(aid),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LID: Uuid = Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);

    fn paths() -> Paths {
        Paths::new("_lease")
    }

    fn lease() -> LeaseRef {
        LeaseRef {
            key: "k".into(),
            lease_id: LID,
        }
    }

    #[test]
    fn acquire_merges_the_lock_field_into_the_document_and_never_replaces_it() {
        let pipeline = acquire_pipeline(&paths(), "me", 5_000, LID, false, None);
        assert_eq!(pipeline.len(), 1);
        let cond = pipeline[0]
            .get_document("$replaceWith")
            .unwrap()
            .get_array("$cond")
            .unwrap();
        let took = cond[1]
            .as_document()
            .unwrap()
            .get_array("$mergeObjects")
            .unwrap();
        assert_eq!(took[0], Bson::from("$$ROOT"));
        let acquired = took[1]
            .as_document()
            .unwrap()
            .get_document("_lease")
            .unwrap();
        assert_eq!(
            acquired.keys().map(String::as_str).collect::<Vec<_>>(),
            ["aid", "lid", "tok", "acq", "ts", "exp", "data", "wt"]
        );
        assert_eq!(acquired.get("lid"), Some(&bson_lease_id(LID)));
        assert_eq!(
            acquired.get_document("exp").unwrap(),
            &doc! { "$add": ["$$NOW", 5_000_i64] }
        );
        assert_eq!(
            cond[2],
            Bson::from("$$ROOT"),
            "a losing attempt writes nothing"
        );
        let wins = cond[0].as_document().unwrap().get_array("$or").unwrap();
        assert_eq!(
            wins[0],
            Bson::from(doc! { "$eq": [{ "$type": "$_lease" }, "missing"] }),
            "a document without the lock field is free"
        );
        assert_eq!(
            wins[2].as_document().unwrap().get_array("$and").unwrap()[0],
            Bson::from(doc! { "$and": [
                { "$eq": [{ "$type": "$_lease.exp" }, "date"] },
                { "$eq": [{ "$type": "$_lease.tok" }, "long"] },
            ]}),
            "only a lock field of our shape is taken over"
        );
    }

    #[test]
    fn acquire_follows_the_token_rule_under_the_lock_field() {
        let pipeline = acquire_pipeline(&paths(), "me", 5_000, LID, false, None);
        let cond = pipeline[0]
            .get_document("$replaceWith")
            .unwrap()
            .get_array("$cond")
            .unwrap();
        let took = cond[1]
            .as_document()
            .unwrap()
            .get_array("$mergeObjects")
            .unwrap();
        let token = took[1]
            .as_document()
            .unwrap()
            .get_document("_lease")
            .unwrap()
            .get_document("tok")
            .unwrap()
            .get_array("$cond")
            .unwrap()
            .clone();
        assert_eq!(
            token[1],
            Bson::from("$_lease.tok"),
            "a retry keeps its token"
        );
        assert_eq!(
            token[2],
            Bson::from(doc! { "$max": [
                { "$add": [{ "$ifNull": ["$_lease.tok", 0_i64] }, 1_i64] },
                { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << 20] },
            ]})
        );
    }

    #[test]
    fn a_creating_acquire_fills_only_a_document_that_has_only_its_id() {
        let create = doc! { "state": "new", "$odd": 1 };
        let pipeline = acquire_pipeline(&paths(), "me", 5_000, LID, true, Some(&create));
        assert_eq!(pipeline.len(), 2);
        assert_eq!(
            pipeline[0],
            doc! { "$replaceWith": { "$cond": [
                { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 1] },
                { "$mergeObjects": ["$$ROOT", { "$literal": create }] },
                "$$ROOT",
            ]}}
        );
        let cond = pipeline[1]
            .get_document("$replaceWith")
            .unwrap()
            .get_array("$cond")
            .unwrap();
        assert_eq!(
            cond[2],
            Bson::from(doc! { "$cond": [
                { "$and": [
                    { "$and": [
                        { "$eq": [{ "$type": "$_lease.exp" }, "date"] },
                        { "$eq": [{ "$type": "$_lease.tok" }, "long"] },
                    ]},
                    { "$eq": [{ "$type": "$_lease.lid" }, "binData"] },
                    { "$not": [{ "$lte": ["$_lease.exp", "$$NOW"] }] },
                    { "$not": [{ "$eq": ["$_lease.aid", { "$literal": "me" }] }] },
                ]},
                { "$mergeObjects": ["$$ROOT", { "_lease": { "$mergeObjects": ["$_lease", {
                    "wt": { "$ifNull": ["$_lease.wt", "$$NOW"] },
                }]}}]},
                "$$ROOT",
            ]}),
            "a waiting attempt marks only a live lease of another owner"
        );
    }

    #[test]
    fn the_lock_view_reads_a_foreign_shape_as_a_foreign_holder() {
        let now = Bson::DateTime(DateTime::from_millis(5));
        let ours = doc! { "_id": "k", "x": 1, "_lease": { "tok": 3_i64 } };
        assert_eq!(
            lock_view(&paths(), &ours, now.clone()),
            Some(doc! { "tok": 3_i64, "now": now.clone(), "nf": 2 })
        );
        let foreign = doc! { "_id": "k", "_lease": "mine, hands off" };
        assert_eq!(
            lock_view(&paths(), &foreign, now.clone()),
            Some(doc! { "now": now.clone(), "nf": 2 })
        );
        assert_eq!(lock_view(&paths(), &doc! { "_id": "k" }, now), None);
    }

    #[test]
    fn renewal_and_release_write_only_under_the_lock_field() {
        let p = paths();
        assert_eq!(
            lease_filter(&p, "me", &[lease()]),
            doc! {
                "_id": { "$in": ["k"] },
                "_lease.lid": { "$in": [bson_lease_id(LID)] },
                "_lease.aid": { "$eq": "me" },
            }
        );
        assert_eq!(
            renew_update(&p, 7_000),
            vec![doc! { "$set": {
                "_lease.ts": "$$NOW",
                "_lease.exp": { "$add": ["$$NOW", 7_000_i64] },
            }}]
        );
        assert_eq!(
            release_update(&p, 2_000),
            vec![
                doc! { "$set": {
                    "_lease.exp": { "$min": ["$_lease.exp", "$$NOW"] },
                    "_lease.yu": { "$cond": [
                        { "$ne": [{ "$type": "$_lease.wt" }, "missing"] },
                        { "$add": ["$$NOW", 2_000_i64] },
                        "$_lease.yu",
                    ]},
                }},
                doc! { "$unset": ["_lease.lid", "_lease.wt"] },
            ]
        );
        assert_eq!(remove_update(&p), doc! { "$unset": { "_lease": "" } });
    }

    #[test]
    fn the_lock_field_is_removed_only_when_old_enough_unmarked_or_released() {
        let p = paths();
        let old = doc! { "$gte": [
            { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << 20] },
            { "$add": ["$_lease.tok", 1_000_i64 << 20] },
        ]};
        let filter = doc! { "_id": "k" };
        assert_eq!(
            removable_filter(&p, filter.clone(), 1_000),
            doc! { "$and": [filter.clone(), {
                "_lease.tok": { "$type": "long" },
                "_lease.wt": { "$exists": false },
                "$expr": old.clone(),
            }]}
        );
        assert_eq!(
            released_filter(&p, filter.clone(), 1_000),
            doc! { "$and": [filter, {
                "_lease.lid": { "$exists": false },
                "_lease.tok": { "$type": "long" },
                "_lease.exp": { "$type": "date" },
                "$expr": { "$and": [old.clone(), { "$not": [{ "$gt": ["$_lease.yu", "$$NOW"] }] }] },
            }]}
        );
        assert_eq!(
            held_removable_filter(&p, "me", &lease(), 1_000),
            doc! {
                "_id": "k",
                "_lease.lid": bson_lease_id(LID),
                "_lease.aid": { "$eq": "me" },
                "_lease.wt": { "$exists": false },
                "$expr": { "$and": [{ "$gt": ["$_lease.exp", "$$NOW"] }, old] },
            }
        );
        assert_eq!(
            owner_filter(&p, "me", &[LID]),
            doc! {
                "_lease.aid": "me",
                "_lease.lid": { "$exists": true, "$nin": [bson_lease_id(LID)] },
                "_lease.tok": { "$type": "long" },
                "_lease.exp": { "$type": "date" },
            }
        );
    }

    #[test]
    fn writes_under_a_lease_require_it_held_by_server_time() {
        assert_eq!(
            held_filter(&paths(), "me", &lease()),
            doc! {
                "_id": "k",
                "_lease.lid": bson_lease_id(LID),
                "_lease.aid": { "$eq": "me" },
                "$expr": { "$gt": ["$_lease.exp", "$$NOW"] },
            }
        );
        assert_eq!(
            held_waited_filter(&paths(), "me", &lease(), true).get("_lease.wt"),
            Some(&Bson::from(doc! { "$exists": true }))
        );
    }

    #[test]
    fn the_users_operators_are_merged_with_ours_operator_by_operator() {
        let p = paths();
        let user =
            doc! { "$set": { "state": "done" }, "$unset": { "tmp": "" }, "$inc": { "n": 1 } };
        assert_eq!(write_operators(&p, &user, LockAfter::Kept), user);
        assert_eq!(
            write_operators(&p, &user, LockAfter::Removed),
            doc! { "$set": { "state": "done" }, "$unset": { "tmp": "", "_lease": "" }, "$inc": { "n": 1 } }
        );
        let until = DateTime::from_millis(9);
        assert_eq!(
            write_operators(&p, &user, LockAfter::Released(Some(until))),
            doc! {
                "$set": { "state": "done", "_lease.yu": until },
                "$unset": { "tmp": "", "_lease.lid": "", "_lease.wt": "" },
                "$inc": { "n": 1 },
                "$currentDate": { "_lease.exp": true, "_lease.ts": true },
            }
        );
        assert_eq!(
            write_operators(&p, &doc! { "$inc": { "n": 1 } }, LockAfter::Released(None)),
            doc! {
                "$inc": { "n": 1 },
                "$unset": { "_lease.lid": "", "_lease.wt": "" },
                "$currentDate": { "_lease.exp": true, "_lease.ts": true },
            }
        );
    }

    #[test]
    fn a_users_pipeline_runs_between_keeping_and_restoring_the_lock_field() {
        let p = paths();
        let user = vec![doc! { "$set": { "n": { "$add": ["$n", 1] } } }];
        let kept = write_pipeline(&p, "me", 42, &user, false, 2_000, 1_000);
        assert_eq!(
            kept[0],
            doc! { "$set": { "__mongo_lease__lease": "$_lease" } }
        );
        assert_eq!(kept[1], user[0]);
        assert_eq!(
            kept[2],
            doc! { "$set": { "__mongo_lease__lease": { "$cond": [
                { "$and": [
                    { "$eq": ["$__mongo_lease__lease.aid", { "$literal": "me" }] },
                    { "$eq": ["$__mongo_lease__lease.tok", { "$literal": 42_i64 }] },
                ]},
                "$__mongo_lease__lease",
                {
                    "aid": { "$literal": "me" },
                    "tok": { "$literal": 42_i64 },
                    "ts": "$$NOW",
                    "exp": "$$NOW",
                },
            ]}}}
        );
        assert_eq!(
            kept[3],
            doc! { "$set": { "_lease": "$__mongo_lease__lease" } }
        );
        assert_eq!(kept[4], doc! { "$unset": ["__mongo_lease__lease"] });
        let released = write_pipeline(&p, "me", 42, &user, true, 2_000, 1_000);
        assert_eq!(released.len(), 5);
        assert_eq!(
            released[4],
            doc! { "$unset": ["__mongo_lease__lease", "_lease.lid", "_lease.wt"] }
        );
        let cond = released[3]
            .get_document("$set")
            .unwrap()
            .get_document("_lease")
            .unwrap()
            .get_array("$cond")
            .unwrap();
        assert_eq!(cond[1], Bson::from("$$REMOVE"));
    }

    #[test]
    fn announced_writes_set_or_remove_the_lock_field_its_lease_id_or_owner_id() {
        let [matched, _] = release_events_pipeline(&paths());
        let or = matched
            .get_document("$match")
            .unwrap()
            .get_array("$or")
            .unwrap();
        assert_eq!(
            or[1].as_document().unwrap().get_array("$or").unwrap()[1],
            Bson::from(doc! { "updateDescription.removedFields": {
                "$in": ["_lease", "_lease.lid", "_lease.aid"],
            }})
        );
    }

    #[test]
    fn announced_writes_are_read_from_each_kind_of_event() {
        let p = paths();
        let write = |freed, lease_id, owner: Option<&str>| KeyWrite {
            key: "k".into(),
            freed,
            lease_id,
            owner: owner.map(str::to_string),
        };
        let event = |kind: &str, rest: Document| {
            let mut e = doc! { "operationType": kind, "documentKey": { "_id": "k" } };
            e.extend(rest);
            e
        };
        let lid = bson_lease_id(LID);
        assert_eq!(
            key_write(&p, &event("delete", doc! {})),
            Some(write(true, None, None))
        );
        assert_eq!(
            key_write(
                &p,
                &event(
                    "insert",
                    doc! { "fullDocument": { "_lease": { "aid": "me", "lid": lid.clone() } } }
                )
            ),
            Some(write(false, Some(LID), Some("me")))
        );
        assert_eq!(
            key_write(&p, &event("replace", doc! { "fullDocument": { "x": 1 } })),
            Some(write(true, None, None))
        );
        assert_eq!(
            key_write(
                &p,
                &event(
                    "update",
                    doc! { "setLock": { "aid": "me", "lid": lid.clone(), "tok": 1_i64 } }
                )
            ),
            Some(write(false, Some(LID), Some("me"))),
            "an acquisition that sets the whole lock field"
        );
        assert_eq!(
            key_write(
                &p,
                &event("update", doc! { "setLid": lid.clone(), "setAid": "me" })
            ),
            Some(write(false, Some(LID), Some("me"))),
            "an acquisition that sets the lock field's fields"
        );
        assert_eq!(
            key_write(
                &p,
                &event(
                    "update",
                    doc! { "updateDescription": { "removedFields": ["_lease.lid"] } }
                )
            ),
            Some(write(true, None, None)),
            "a release"
        );
        assert_eq!(
            key_write(
                &p,
                &event(
                    "update",
                    doc! { "updateDescription": { "removedFields": ["_lease"] } }
                )
            ),
            Some(write(true, None, None)),
            "a commit"
        );
        assert_eq!(key_write(&p, &event("invalidate", doc! {})), None);
    }
}
