//! Unit tests of the builders in `pipeline.rs`: the structure of each command's
//! BSON and the reading of replies, without a server.

use mongodb::bson::DateTime;

use std::time::Duration;

use super::*;
use crate::store::replies::classify;
use crate::store::{AcquireOutcome, Announced, KeyWrite, LeaseRef};
use crate::token::TOKEN_TIME_SHIFT;

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

/// The parts of the acquire pipeline's `$replaceWith: { $cond: [wins,
/// acquired, lost] }`, its one stage before the restatement of `ts` and
/// `exp` (`restated`).
fn acquire_parts(waiting: bool) -> (Document, Document, Bson) {
    let pipeline = acquire_pipeline("me", 30_000, LID, waiting, None, 3_000, None);
    assert_eq!(pipeline.len(), 2, "one stage, restated: {pipeline:?}");
    assert_eq!(pipeline[1], restated());
    let cond = at(&pipeline[0], "$replaceWith.$cond").as_array().unwrap();
    assert_eq!(cond.len(), 3);
    (
        cond[0].as_document().unwrap().clone(),
        cond[1].as_document().unwrap().clone(),
        cond[2].clone(),
    )
}

/// The acquire pipeline's "a retry of this acquisition" condition, as
/// built for owner `me` and lease id `LID`: not taken over by another lock
/// pattern's client (no `value`).
fn mine_condition() -> Document {
    doc! { "$and": [
        { "$eq": ["$lid", bson_lease_id(LID)] },
        { "$eq": ["$aid", { "$literal": "me" }] },
        { "$eq": [{ "$type": "$value" }, "missing"] },
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
        AcquireOutcome::Held {
            holder,
            remaining,
            token,
            ..
        } => {
            assert_eq!(holder, "other");
            assert_eq!(remaining, Some(Duration::from_secs(30)));
            assert_eq!(token, Some(7));
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
    assert_eq!(read_lease_id(Some(&bson_lease_id(LID))), Some(LID));
    assert_eq!(read_lease_id(None), None);
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
    // A retry's expiry never moves back ("Late writes" in `store`).
    assert_eq!(
        at(&acquired, "exp"),
        &bson(doc! { "$cond": [
            mine.clone(),
            { "$max": ["$exp", { "$add": ["$$NOW", 30_000_i64] }] },
            { "$add": ["$$NOW", 30_000_i64] },
        ]})
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
    // The queue keeps the other owners' live entries.
    assert_eq!(
        at(&acquired, "q"),
        &bson(crate::store::mongo::acquire::queue_after_acquisition("me"))
    );
    let names: Vec<&str> = acquired.keys().map(String::as_str).collect();
    assert_eq!(
        names,
        [
            "_id", "aid", "lid", "tok", "acq", "ts", "exp", "data", "wt", "tr", "q"
        ]
    );
}

#[test]
fn acquire_wins_on_a_document_it_inserts_a_retry_or_an_expired_lease_not_yielded_by_us_nor_kept_for_the_queue()
 {
    let (wins, _, _) = acquire_parts(false);
    let our_layout = doc! { "$and": [
        { "$eq": [{ "$type": "$exp" }, "date"] },
        { "$eq": [{ "$type": "$tok" }, "long"] },
        { "$eq": [{ "$type": "$value" }, "missing"] },
    ]};
    let yielded_by_us = doc! { "$and": [
        { "$eq": ["$aid", { "$literal": "me" }] },
        { "$gt": ["$yu", "$$NOW"] },
    ]};
    assert_eq!(
        wins,
        doc! { "$or": [
            // Inserting: `_ins: null` (from the filter) and `_id` only; an
            // existing bare `{_id}` is a foreign holder's lock.
            { "$and": [
                { "$eq": [{ "$type": "$_ins" }, "null"] },
                { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 2] },
            ]},
            mine_condition(),
            { "$and": [
                our_layout,
                { "$lte": ["$exp", "$$NOW"] },
                { "$not": [yielded_by_us] },
                crate::store::mongo::acquire::queue_allows("me"),
            ]},
        ]}
    );
}

#[test]
fn a_losing_attempt_returns_the_document_unchanged_unless_waiting() {
    let (_, _, lost) = acquire_parts(false);
    assert_eq!(lost, Bson::from("$$ROOT"));
}

#[test]
fn a_losing_waiting_attempt_marks_and_registers_only_on_a_live_lease_of_another_owner_or_a_queue() {
    let (_, _, lost) = acquire_parts(true);
    let cond = at(lost.as_document().unwrap(), "$cond").as_array().unwrap();
    let our_layout = doc! { "$and": [
        { "$eq": [{ "$type": "$exp" }, "date"] },
        { "$eq": [{ "$type": "$tok" }, "long"] },
        { "$eq": [{ "$type": "$value" }, "missing"] },
    ]};
    assert_eq!(
        cond[0],
        bson(doc! { "$or": [
            { "$and": [
                our_layout.clone(),
                { "$eq": [{ "$type": "$lid" }, "binData"] },
                { "$not": [{ "$lte": ["$exp", "$$NOW"] }] },
                { "$not": [{ "$eq": ["$aid", { "$literal": "me" }] }] },
            ]},
            { "$and": [our_layout, { "$not": [queue_allows("me")] }] },
        ]})
    );
    assert_eq!(
        cond[1],
        bson(doc! { "$mergeObjects": ["$$ROOT", {
            "wt": { "$ifNull": ["$wt", "$$NOW"] },
            "q": registered("me", bson_lease_id(LID), 30_000, 3_000, None),
        }] })
    );
    let (shared_live, mark) = crate::store::mongo::acquire::exclusive_waiter_mark("me", 30_000);
    assert_eq!(
        cond[2],
        bson(doc! { "$cond": [shared_live, mark, "$$ROOT"] }),
        "else, on live shared holders, its waiting mark"
    );
}

#[test]
fn an_owner_id_is_written_and_compared_literally_never_as_an_expression() {
    let pipeline = acquire_pipeline("$tok", 1, LID, true, None, 3_000, None);
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
            kind: crate::kind::LeaseKind::Exclusive,
        },
        LeaseRef {
            key: "b".into(),
            lease_id: other,
            kind: crate::kind::LeaseKind::Exclusive,
        },
    ];
    assert_eq!(
        payload_filter("me", &leases[0]),
        doc! {
            "_id": "a",
            "lid": bson_lease_id(LID),
            "aid": { "$eq": "me" },
            "value": { "$exists": false },
        }
    );
    assert_eq!(
        payload_update(doc! { "x": 1 }),
        doc! { "$set": { "data": { "x": 1 } } }
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
    let [matched, projected] = release_events_pipeline(Announced::Writes, "a");
    assert_eq!(
        matched,
        doc! { "$match": { "$or": [
            { "operationType": { "$in": ["delete", "insert", "replace"] } },
            { "operationType": "update", "$or": [
                { "updateDescription.updatedFields.lid": { "$exists": true } },
                { "updateDescription.updatedFields.aid": { "$exists": true } },
                { "updateDescription.removedFields": { "$in": ["lid", "aid"] } },
                { "updateDescription.updatedFields.rl": { "$exists": true } },
                { "updateDescription.updatedFields.rv": { "$exists": true } },
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
            "fullDocument.tok",
            "updateDescription.updatedFields.lid",
            "updateDescription.updatedFields.aid",
            "updateDescription.updatedFields.tok",
            "updateDescription.updatedFields.rl",
            "updateDescription.updatedFields.rv",
            "updateDescription.removedFields",
            "holders",
        ]
    );
}

#[test]
fn announced_writes_are_read_from_each_kind_of_event() {
    let key = doc! { "_id": "k" };
    let write = |freed, lease_id, owner: Option<&str>, token| KeyWrite {
        key: "k".into(),
        freed,
        lease_id,
        owner: owner.map(str::to_string),
        token,
    };
    let event = |kind: &str, rest: Document| {
        let mut e = doc! { "operationType": kind, "documentKey": key.clone() };
        e.extend(rest);
        e
    };
    let full = doc! { "fullDocument": {
        "aid": "me", "lid": bson_lease_id(LID), "tok": 12_i64,
    }};
    assert_eq!(
        key_write(&event("delete", doc! {})),
        Some(write(true, None, None, None))
    );
    assert_eq!(
        key_write(&event("insert", full.clone())),
        Some(write(false, Some(LID), Some("me"), Some(12)))
    );
    assert_eq!(
        key_write(&event("replace", full)),
        Some(write(false, Some(LID), Some("me"), Some(12)))
    );
    assert_eq!(
        key_write(&event(
            "replace",
            doc! { "fullDocument": { "aid": "x", "lid": "not a uuid", "tok": 3_i32 } }
        )),
        Some(write(false, None, Some("x"), Some(3))),
        "an int32 token is read too"
    );
    assert_eq!(
        key_write(&event("replace", doc! { "fullDocument": { "aid": "x" } })),
        Some(write(true, None, Some("x"), None))
    );
    for token in [Bson::Int64(-1), Bson::from("12"), Bson::Double(12.0)] {
        let full = doc! { "fullDocument": {
            "aid": "x", "lid": bson_lease_id(LID), "tok": token.clone(),
        }};
        assert_eq!(
            key_write(&event("insert", full)),
            Some(write(false, Some(LID), Some("x"), None)),
            "not a token: {token}"
        );
    }
    let update = |updated: Document, removed: Vec<&str>| {
        event(
            "update",
            doc! { "updateDescription": { "updatedFields": updated, "removedFields": removed } },
        )
    };
    assert_eq!(
        key_write(&update(
            doc! { "exp": DateTime::from_millis(5) },
            vec!["lid"]
        )),
        Some(write(true, None, None, None)),
        "a release"
    );
    assert_eq!(
        key_write(&update(doc! { "aid": "other" }, vec![])),
        Some(write(false, None, Some("other"), None))
    );
    assert_eq!(
        key_write(&update(doc! {}, vec!["aid"])),
        Some(write(false, None, None, None))
    );
    assert_eq!(
        key_write(&update(doc! { "lid": bson_lease_id(LID) }, vec![])),
        Some(write(false, Some(LID), None, None))
    );
    assert_eq!(
        key_write(&update(
            doc! { "aid": "b", "lid": bson_lease_id(LID), "tok": 13_i64, "q": [] },
            vec!["wt"]
        )),
        Some(write(false, Some(LID), Some("b"), Some(13))),
        "a handoff to a registered owner, as an update"
    );
    assert_eq!(
        key_write(&update(
            doc! { "rl": DateTime::from_millis(5), "aid": "b", "tok": 14_i64, "hs": [] },
            vec!["pm"]
        )),
        Some(write(true, None, None, None)),
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
            token: None,
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
        token: None,
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
            ahead: 0,
            holder: "them".into(),
            remaining: Some(Duration::from_millis(9_000)),
            token: Some(5),
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
            ahead: 0,
            holder: "me".into(),
            remaining: Some(Duration::from_millis(3_000)),
            token: Some(5),
        }
    );
    released.insert("aid", "them");
    assert_eq!(
        classify(&"k".into(), "me", LID, &released),
        AcquireOutcome::Held {
            ahead: 0,
            holder: "them".into(),
            remaining: Some(Duration::ZERO),
            token: Some(5),
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
                ahead: 0,
                holder: holder.into(),
                remaining: None,
                token: None,
            },
            "{foreign}"
        );
    }
}

#[test]
fn a_foreign_lock_is_deleted_only_while_it_is_the_document_read() {
    let stored = doc! { "_id": "k", "aid": "java-app-1", "ts": DateTime::from_millis(5) };
    let found = doc! { "_id": "k", "aid": "java-app-1", STORED: stored.clone() };
    assert_eq!(
        foreign_filter(&"k".into(), &found),
        doc! { "_id": "k", "$expr": { "$eq": ["$$ROOT", { "$literal": stored }] } }
    );
}

#[tokio::test]
async fn a_force_releases_delete_takes_a_bare_lock_only_while_it_is_still_bare() {
    let db = super::shared_test_db().await;
    let coll = db.collection::<Document>(&crate::testkit::unique_name("bare"));
    coll.insert_one(doc! { "_id": "k" }).await.unwrap();
    let mut projection = info_projection();
    projection.insert(STORED, "$$ROOT");
    let found = coll
        .find_one(doc! { "_id": "k" })
        .projection(projection)
        .await
        .unwrap()
        .expect("the bare lock");
    let filter = foreign_filter(&"k".into(), &found);
    // Another client's field since the read: not the lock read any more.
    let changed = doc! { "$set": { "holder": "y" } };
    coll.update_one(doc! { "_id": "k" }, changed).await.unwrap();
    let deleted = coll.delete_one(filter.clone()).await.unwrap();
    assert_eq!(deleted.deleted_count, 0);
    let bare_again = doc! { "$unset": { "holder": "" } };
    coll.update_one(doc! { "_id": "k" }, bare_again)
        .await
        .unwrap();
    let deleted = coll.delete_one(filter).await.unwrap();
    assert_eq!(deleted.deleted_count, 1);
    coll.drop().await.unwrap();
}
