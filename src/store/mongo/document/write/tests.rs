//! Unit tests of the builders in `write.rs`: the structure of their BSON,
//! without a server.

use super::super::super::rules::bson_lease_id;
use super::super::pipeline::fixtures::{LID, LOCK_FIELD, lease};
use super::*;

#[test]
fn writes_under_a_lease_require_it_held_by_server_time() {
    assert_eq!(
        held_filter(LOCK_FIELD, "me", &lease()),
        doc! {
            "_id": "k",
            "_lease.lid": bson_lease_id(LID),
            "_lease.aid": { "$eq": "me" },
            "$expr": { "$gt": ["$_lease.exp", "$$NOW"] },
        }
    );
    assert_eq!(
        held_waited_filter(LOCK_FIELD, "me", &lease(), true).get("_lease.wt"),
        Some(&Bson::from(doc! { "$exists": true }))
    );
}

#[test]
fn the_users_operators_are_merged_with_ours_operator_by_operator() {
    let p = LOCK_FIELD;
    let user = doc! { "$set": { "state": "done" }, "$unset": { "tmp": "" }, "$inc": { "n": 1 } };
    assert_eq!(write_operators(p, &user, LockAfter::Kept), user);
    assert_eq!(
        write_operators(p, &user, LockAfter::Removed),
        doc! { "$set": { "state": "done" }, "$unset": { "tmp": "", "_lease": "" }, "$inc": { "n": 1 } }
    );
    let until = DateTime::from_millis(9);
    assert_eq!(
        write_operators(p, &user, LockAfter::Released(Some(until))),
        doc! {
            "$set": { "state": "done", "_lease.yu": until },
            "$unset": { "tmp": "", "_lease.lid": "", "_lease.wt": "" },
            "$inc": { "n": 1 },
            "$currentDate": { "_lease.exp": true, "_lease.ts": true },
        }
    );
    assert_eq!(
        write_operators(p, &doc! { "$inc": { "n": 1 } }, LockAfter::Released(None)),
        doc! {
            "$inc": { "n": 1 },
            "$unset": { "_lease.lid": "", "_lease.wt": "" },
            "$currentDate": { "_lease.exp": true, "_lease.ts": true },
        }
    );
}

#[test]
fn a_users_pipeline_runs_between_keeping_and_restoring_the_lock_field() {
    let p = LOCK_FIELD;
    let user = vec![doc! { "$set": { "n": { "$add": ["$n", 1] } } }];
    let kept = write_pipeline(p, "me", 42, &user, false, 2_000, 1_000);
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
    let released = write_pipeline(p, "me", 42, &user, true, 2_000, 1_000);
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
