//! Unit tests of `events.rs`: the change-stream stages and the reading of
//! their events, without a server.

use mongodb::bson::Bson;

use super::super::super::rules::bson_lease_id;
use super::super::pipeline::fixtures::{LID, LOCK_FIELD};
use super::*;

#[test]
fn announced_writes_set_or_remove_the_lock_field_its_lease_id_or_owner_id() {
    let [matched, _] = release_events_pipeline(LOCK_FIELD, None);
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
    let p = LOCK_FIELD;
    let write = |freed, lease_id, owner: Option<&str>, token| KeyWrite {
        key: "k".into(),
        freed,
        lease_id,
        owner: owner.map(str::to_string),
        token,
    };
    let event = |kind: &str, rest: Document| {
        let mut e = doc! { "operationType": kind, "documentKey": { "_id": "k" } };
        e.extend(rest);
        e
    };
    let lid = bson_lease_id(LID);
    assert_eq!(
        key_write(p, None, &event("delete", doc! {})),
        Some(write(true, None, None, None))
    );
    assert_eq!(
        key_write(
            p,
            None,
            &event(
                "insert",
                doc! { "fullDocument": {
                    "_lease": { "aid": "me", "lid": lid.clone(), "tok": 5_i64 },
                } }
            )
        ),
        Some(write(false, Some(LID), Some("me"), Some(5)))
    );
    assert_eq!(
        key_write(
            p,
            None,
            &event("replace", doc! { "fullDocument": { "x": 1 } })
        ),
        Some(write(true, None, None, None))
    );
    assert_eq!(
        key_write(
            p,
            None,
            &event(
                "update",
                doc! { "setLock": { "aid": "me", "lid": lid.clone(), "tok": 1_i64 } }
            )
        ),
        Some(write(false, Some(LID), Some("me"), Some(1))),
        "an acquisition that sets the whole lock field"
    );
    assert_eq!(
        key_write(
            p,
            None,
            &event(
                "update",
                doc! { "setLid": lid.clone(), "setAid": "me", "setTok": 7_i64 }
            )
        ),
        Some(write(false, Some(LID), Some("me"), Some(7))),
        "an acquisition that sets the lock field's fields"
    );
    assert_eq!(
        key_write(
            p,
            None,
            &event(
                "update",
                doc! { "updateDescription": { "removedFields": ["_lease.lid"] } }
            )
        ),
        Some(write(true, None, None, None)),
        "a release"
    );
    assert_eq!(
        key_write(
            p,
            None,
            &event(
                "update",
                doc! { "updateDescription": { "removedFields": ["_lease"] } }
            )
        ),
        Some(write(true, None, None, None)),
        "a commit"
    );
    assert_eq!(key_write(p, None, &event("invalidate", doc! {})), None);
}

#[test]
fn with_lock_id_kept_a_null_lock_id_frees_the_key_and_another_one_is_another_clients_write() {
    let p = LOCK_FIELD;
    let write = |freed, lease_id| KeyWrite {
        key: "k".into(),
        freed,
        lease_id,
        owner: None,
        token: None,
    };
    let event = |kind: &str, rest: Document| {
        let mut e = doc! { "operationType": kind, "documentKey": { "_id": "k" } };
        e.extend(rest);
        e
    };
    let theirs = uuid::Uuid::from_u128(42);
    let their_id = bson_lease_id(theirs);
    let unlocked = event("update", doc! { "setTopId": Bson::Null });
    assert_eq!(
        key_write(p, Some("LockId"), &unlocked),
        Some(write(true, None))
    );
    let locked = event("update", doc! { "setTopId": their_id.clone() });
    assert_eq!(
        key_write(p, Some("LockId"), &locked),
        Some(write(false, Some(theirs)))
    );
    let inserted = event("insert", doc! { "fullDocument": { "LockId": their_id } });
    assert_eq!(
        key_write(p, Some("LockId"), &inserted),
        Some(write(false, Some(theirs)))
    );
    // Our acquisition sets both to its lease id: read as the lock field says.
    let ours = bson_lease_id(LID);
    let acquired = event(
        "update",
        doc! { "setLid": ours.clone(), "setAid": "me", "setTok": 7_i64, "setTopId": ours },
    );
    assert_eq!(
        key_write(p, Some("LockId"), &acquired),
        key_write(p, None, &acquired)
    );
    let [matched, _] = release_events_pipeline(p, Some("LockId"));
    assert!(matched.to_string().contains("\"LockId\""), "{matched}");
}
