//! The BSON of the acquire, renewal and release commands
//! [`DocumentStore`](super::DocumentStore) sends: the lock collection's
//! protocol (`super::super::pipeline`) with every lock field under the lock
//! field `F` of the user's document, and the user's other fields never
//! written by acquire, renewal or release. Writes under a lease are built in
//! [`write`](super::write), the change-stream stages in
//! [`events`](super::events). Pure functions of their arguments: the unit
//! tests below check their shape without a server; what the server does
//! with them is tested against a real `mongod`
//! (`tests/document_lease/protocol.rs`).

use mongodb::bson::{Bson, Document, doc};
use uuid::Uuid;

use super::super::pipeline::{bson_lease_id, token_at_older_than};
use crate::key::LeaseKey;
use crate::store::{LeaseRef, TOKEN_TIME_SHIFT, field};

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
    pub(super) fn var(&self, name: &str) -> String {
        format!("${}.{name}", self.field)
    }

    /// The field path expression `$F`.
    pub(super) fn whole(&self) -> String {
        format!("${}", self.field)
    }

    /// The temporary top-level field that keeps `F` while the user's update
    /// pipeline runs ([`write_pipeline`](super::write::write_pipeline)).
    pub(super) fn stash(&self) -> String {
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
/// if the document has no `F`. An empty `F` (`{}`) is a foreign holder's.
pub(super) fn lock_view(paths: &Paths, document: &Document, now: Bson) -> Option<Document> {
    let mut view = match document.get(paths.field())? {
        Bson::Document(lock) => lock.clone(),
        _ => Document::new(),
    };
    view.insert("now", now);
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
    let keys: Vec<Bson> = leases.iter().map(|l| l.key.to_bson()).collect();
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
    let keys: Vec<Bson> = keys.iter().map(|k| k.to_bson()).collect();
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

/// The lock field, lease id and lease of the unit tests of the builders.
#[cfg(test)]
pub(super) mod fixtures {
    use super::Paths;
    use crate::store::LeaseRef;
    use uuid::Uuid;

    /// The lease id of [`lease`].
    pub(in crate::store::mongo::document) const LID: Uuid =
        Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);

    /// The lock field `_lease`.
    pub(in crate::store::mongo::document) fn paths() -> Paths {
        Paths::new("_lease")
    }

    /// The lease `LID` of key `"k"`.
    pub(in crate::store::mongo::document) fn lease() -> LeaseRef {
        LeaseRef {
            key: "k".into(),
            lease_id: LID,
            kind: crate::kind::LeaseKind::Exclusive,
        }
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::DateTime;

    use super::super::write::held_removable_filter;
    use super::fixtures::{LID, lease, paths};
    use super::*;

    /// The `$cond` of an acquire stage's `$replaceWith`, and the
    /// `$mergeObjects` of its winning branch.
    fn cond_and_took(stage: &Document) -> (&Vec<Bson>, &Vec<Bson>) {
        let cond = stage
            .get_document("$replaceWith")
            .unwrap()
            .get_array("$cond")
            .unwrap();
        let took = cond[1]
            .as_document()
            .unwrap()
            .get_array("$mergeObjects")
            .unwrap();
        (cond, took)
    }

    #[test]
    fn acquire_merges_the_lock_field_into_the_document_and_never_replaces_it() {
        let pipeline = acquire_pipeline(&paths(), "me", 5_000, LID, false, None);
        assert_eq!(pipeline.len(), 1);
        let (cond, took) = cond_and_took(&pipeline[0]);
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
        let (_, took) = cond_and_took(&pipeline[0]);
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
        let (cond, _) = cond_and_took(&pipeline[1]);
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
            Some(doc! { "tok": 3_i64, "now": now.clone() })
        );
        let foreign = doc! { "_id": "k", "_lease": "mine, hands off" };
        assert_eq!(
            lock_view(&paths(), &foreign, now.clone()),
            Some(doc! { "now": now.clone() })
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
}
