//! Unit tests of the builders in `pipeline.rs`: the structure of their BSON,
//! without a server.

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
    let pipeline = acquire_pipeline(LOCK_FIELD, "me", 5_000, LID, false, None, None);
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
        ["aid", "lid", "tok", "acq", "ts", "exp", "data", "wt", "tr"]
    );
    assert_eq!(acquired.get("lid"), Some(&bson_lease_id(LID)));
    // A retry's expiry never moves back ("Late writes" in `store`).
    assert_eq!(
        acquired.get_document("exp").unwrap(),
        &doc! { "$cond": [
            { "$and": [
                { "$eq": ["$_lease.lid", bson_lease_id(LID)] },
                { "$eq": ["$_lease.aid", { "$literal": "me" }] },
            ]},
            { "$max": ["$_lease.exp", { "$add": ["$$NOW", 5_000_i64] }] },
            { "$add": ["$$NOW", 5_000_i64] },
        ]}
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
        "only a lock field of our layout is taken over"
    );
}

#[test]
fn acquire_follows_the_token_rule_under_the_lock_field() {
    let pipeline = acquire_pipeline(LOCK_FIELD, "me", 5_000, LID, false, None, None);
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
    let pipeline = acquire_pipeline(LOCK_FIELD, "me", 5_000, LID, true, Some(&create), None);
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
            "_lease.exp": { "$max": ["$_lease.exp", { "$add": ["$$NOW", 7_000_i64] }] },
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
            "$expr": { "$and": [
                old.clone(),
                { "$not": [{ "$gt": ["$_lease.hl", "$$NOW"] }] },
                { "$not": [{ "$gt": ["$_lease.nb", "$$NOW"] }] },
            ]},
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
}
