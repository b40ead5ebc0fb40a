//! The BSON of the acquire, renewal and release commands
//! [`DocumentStore`](super::DocumentStore) sends: the lock collection's
//! protocol with every lock field under the lock field `F` of the user's
//! document (the shared rules of `rules`, called with `LockPath::under(F)`),
//! and the user's other fields never written by acquire, renewal or
//! release. What is specific to a user's document is here: the merge of
//! `F` into the document, the fields an acquire creates the document with,
//! the projection of the whole document, and the exclusive lease's
//! renewal, release and removal under `F`. Writes under a lease are built in
//! [`write`](super::write), the change-stream stages in
//! [`events`](super::events). Pure functions of their arguments: the unit
//! tests below check their shape without a server; what the server does
//! with them is tested against a real `mongod`
//! (`tests/document_lease/protocol.rs`).

use mongodb::bson::{Bson, Document, doc};
use uuid::Uuid;

use super::super::rules::{LockPath, bson_lease_id};
use crate::store::{LeaseRef, field};

/// The acquire update of a user's document: one `findAndModify` on `_id`
/// alone (never an `$expr` in an upsert filter, docs/mongodb-behaviour.md,
/// B1), with the lock collection's win rule and token rule applied to the
/// lock field `lock_field` ([`LockPath::wins`], [`LockPath::acquired`]): the
/// acquisition wins if `F` is missing, is ours under this lease id and
/// owner id (a retry), or is of our shape (int64 `tok`, date `exp`),
/// expired by `$$NOW` and not yielded by this owner. Winning merges the new
/// `F` into the document; losing leaves the document as it is (no write,
/// docs/mongodb-behaviour.md, B2), except that a `waiting` attempt marks
/// (`F.wt`) a live lease of another owner once. An `F` of any other shape
/// (the user's own `_lease` field) is a lock held by a foreign holder, never
/// modified.
///
/// With `create` (the upsert's fields), a document that has only `_id` (the
/// one an upsert starts from) first gets `create`'s fields, as literals.
pub(super) fn acquire_pipeline(
    lock_field: &str,
    owner: &str,
    ttl_ms: i64,
    lease_id: Uuid,
    waiting: bool,
    create: Option<&Document>,
) -> Vec<Document> {
    let at = LockPath::under(lock_field);
    let lid = bson_lease_id(lease_id);
    let wins = at.wins(owner, &lid, None);
    let took =
        doc! { "$mergeObjects": ["$$ROOT", { lock_field: at.acquired(owner, &lid, ttl_ms) }] };
    let lost = if waiting {
        let marked = doc! { "$mergeObjects": ["$$ROOT", { lock_field: { "$mergeObjects": [
            format!("${lock_field}"),
            { field::WAITING_SINCE: at.waiting_since() },
        ]}}]};
        Bson::from(doc! { "$cond": [at.held_by_other(owner), marked, "$$ROOT"] })
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

/// The lock field `lock_field` of `document` as the lock collection's readers
/// (`classify`, `lease_info`) read a lock document, with `now`: `F`'s fields
/// if it is a document; otherwise (a value of foreign shape) a document
/// without our fields, which they read as a foreign holder's lock. `None`
/// if the document has no `F`. An empty `F` (`{}`) is a foreign holder's.
pub(super) fn lock_view(lock_field: &str, document: &Document, now: Bson) -> Option<Document> {
    let mut view = match document.get(lock_field)? {
        Bson::Document(lock) => lock.clone(),
        _ => Document::new(),
    };
    view.insert("now", now);
    Some(view)
}

/// The projection of `inspect`: the lock field and the server's `$$NOW`.
pub(super) fn info_projection(lock_field: &str) -> Document {
    doc! { lock_field: 1, "now": "$$NOW" }
}

/// The documents of `leases` of `owner`: `_id` among their keys, `F.lid`
/// among their lease ids and `F.aid` the owner id (`exclusive_filter` of
/// the lock collection).
pub(super) fn lease_filter(lock_field: &str, owner: &str, leases: &[LeaseRef]) -> Document {
    let at = LockPath::under(lock_field);
    let keys: Vec<Bson> = leases.iter().map(|l| l.key.to_bson()).collect();
    let ids: Vec<Bson> = leases.iter().map(|l| bson_lease_id(l.lease_id)).collect();
    doc! {
        field::ID: { "$in": keys },
        at.at(field::LEASE_ID): { "$in": ids },
        at.at(field::OWNER): { "$eq": owner },
    }
}

/// The renewal: `F.ts = $$NOW`, `F.exp = $$NOW + ttl_ms`; nothing else changes.
pub(super) fn renew_update(lock_field: &str, ttl_ms: i64) -> Vec<Document> {
    let at = LockPath::under(lock_field);
    vec![doc! { "$set": {
        at.at(field::RENEWED_AT): "$$NOW",
        at.at(field::EXPIRES_AT): { "$add": ["$$NOW", ttl_ms] },
    }}]
}

/// The released state (`release_update` of the lock collection, under `F`):
/// `F.exp` moves to now, `F.lid` and `F.wt` are removed, and `F.yu` is set
/// to now + `yield_ms` if another owner waited (`F.wt`). The next acquire
/// takes it over with the next token.
pub(super) fn release_update(lock_field: &str, yield_ms: i64) -> Vec<Document> {
    let at = LockPath::under(lock_field);
    let waited = doc! { "$ne": [{ "$type": at.var(field::WAITING_SINCE) }, "missing"] };
    vec![
        doc! { "$set": {
            at.at(field::EXPIRES_AT): { "$min": [at.var(field::EXPIRES_AT), "$$NOW"] },
            at.at(field::YIELD_UNTIL): { "$cond": [
                waited,
                { "$add": ["$$NOW", yield_ms] },
                at.var(field::YIELD_UNTIL),
            ]},
        }},
        doc! { "$unset": [at.at(field::LEASE_ID), at.at(field::WAITING_SINCE)] },
    ]
}

/// Removes the lock field: what "delete" means for in-document leases.
pub(super) fn remove_update(lock_field: &str) -> Document {
    doc! { "$unset": { lock_field: "" } }
}

/// Sets the payload `F.data`; nothing else changes.
pub(super) fn payload_update(lock_field: &str, payload: Document) -> Document {
    doc! { "$set": { LockPath::under(lock_field).at(field::PAYLOAD): payload } }
}

#[cfg(test)]
pub(super) mod fixtures {
    use crate::store::LeaseRef;
    use uuid::Uuid;

    /// The lease id of [`lease`].
    pub(in crate::store::mongo::document) const LID: Uuid =
        Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);

    /// The lock field of the unit tests.
    pub(in crate::store::mongo::document) const LOCK_FIELD: &str = "_lease";

    /// The lease `LID` of key `"k"`.
    pub(in crate::store::mongo::document) fn lease() -> LeaseRef {
        LeaseRef {
            key: "k".into(),
            lease_id: LID,
        }
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::DateTime;

    use super::super::write::held_removable_filter;
    use super::fixtures::{LID, LOCK_FIELD, lease};
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
        let pipeline = acquire_pipeline(LOCK_FIELD, "me", 5_000, LID, false, None);
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
        let pipeline = acquire_pipeline(LOCK_FIELD, "me", 5_000, LID, false, None);
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
        let pipeline = acquire_pipeline(LOCK_FIELD, "me", 5_000, LID, true, Some(&create));
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
            lock_view(LOCK_FIELD, &ours, now.clone()),
            Some(doc! { "tok": 3_i64, "now": now.clone() })
        );
        let foreign = doc! { "_id": "k", "_lease": "mine, hands off" };
        assert_eq!(
            lock_view(LOCK_FIELD, &foreign, now.clone()),
            Some(doc! { "now": now.clone() })
        );
        assert_eq!(lock_view(LOCK_FIELD, &doc! { "_id": "k" }, now), None);
    }

    #[test]
    fn renewal_and_release_write_only_under_the_lock_field() {
        let p = LOCK_FIELD;
        assert_eq!(
            lease_filter(p, "me", &[lease()]),
            doc! {
                "_id": { "$in": ["k"] },
                "_lease.lid": { "$in": [bson_lease_id(LID)] },
                "_lease.aid": { "$eq": "me" },
            }
        );
        assert_eq!(
            renew_update(p, 7_000),
            vec![doc! { "$set": {
                "_lease.ts": "$$NOW",
                "_lease.exp": { "$add": ["$$NOW", 7_000_i64] },
            }}]
        );
        assert_eq!(
            release_update(p, 2_000),
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
        assert_eq!(remove_update(p), doc! { "$unset": { "_lease": "" } });
    }

    #[test]
    fn the_lock_field_is_removed_only_when_old_enough_unmarked_or_released() {
        let p = LOCK_FIELD;
        let old = doc! { "$gte": [
            { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << 20] },
            { "$add": ["$_lease.tok", 1_000_i64 << 20] },
        ]};
        let filter = doc! { "_id": "k" };
        assert_eq!(
            LockPath::under(p).deletable_filter(filter.clone(), 1_000, &[]),
            doc! { "$and": [filter.clone(), {
                "_lease.tok": { "$type": "long" },
                "_lease.wt": { "$exists": false },
                "$expr": old.clone(),
            }]}
        );
        assert_eq!(
            LockPath::under(p).released_filter(filter.clone(), 1_000, &[], &[]),
            doc! { "$and": [filter, {
                "_lease.lid": { "$exists": false },
                "_lease.tok": { "$type": "long" },
                "_lease.exp": { "$type": "date" },
                "$expr": { "$and": [old.clone(), { "$not": [{ "$gt": ["$_lease.yu", "$$NOW"] }] }] },
            }]}
        );
        assert_eq!(
            held_removable_filter(p, "me", &lease(), 1_000),
            doc! {
                "_id": "k",
                "_lease.lid": bson_lease_id(LID),
                "_lease.aid": { "$eq": "me" },
                "_lease.wt": { "$exists": false },
                "$expr": { "$and": [{ "$gt": ["$_lease.exp", "$$NOW"] }, old] },
            }
        );
        assert_eq!(
            LockPath::under(p).owner_filter("me", &[LID]),
            doc! {
                "_lease.aid": "me",
                "_lease.lid": { "$exists": true, "$nin": [bson_lease_id(LID)] },
                "_lease.tok": { "$type": "long" },
                "_lease.exp": { "$type": "date" },
            }
        );
    }
}
