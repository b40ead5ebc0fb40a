//! How a document with `LockId` / `LockTime` reads ([`TopLock::view`]);
//! what the server does with the BSON is tested on mongod
//! (`tests/document_lease/lock_id.rs`, and the store contract).

use std::time::Duration;

use mongodb::bson::{Bson, DateTime, doc};

use super::TopLock;
use crate::lock_id_fields::LockIdFields;
use crate::store::mongo::document::pipeline::fixtures::{LID, LOCK_FIELD};
use crate::store::mongo::rules::bson_lease_id;

fn top() -> TopLock {
    TopLock::new(
        &LockIdFields::builder()
            .max_duration(Duration::from_secs(60))
            .build(),
    )
}

fn at(ms: i64) -> DateTime {
    DateTime::from_millis(ms)
}

const NOW: i64 = 1_000_000_000;

#[test]
fn a_current_lease_reads_as_its_lock_field() {
    let lid = bson_lease_id(LID);
    let document = doc! {
        "_id": "k",
        "LockId": lid.clone(),
        "LockTime": at(NOW - 1_000),
        LOCK_FIELD: { "aid": "me", "lid": lid, "tok": 7_i64, "exp": at(NOW + 5_000) },
    };
    let view = top()
        .view(LOCK_FIELD, &document, Bson::DateTime(at(NOW)))
        .unwrap();
    assert_eq!(view.get_str("aid"), Ok("me"));
    assert_eq!(view.get("lid"), Some(&bson_lease_id(LID)));
    assert!(!view.contains_key(crate::foreign::OWNER));
}

#[test]
fn a_clients_live_lock_reads_as_a_foreign_holders_until_lock_time_plus_max_duration() {
    let theirs = uuid::Uuid::from_u128(42);
    let document = doc! {
        "_id": "k",
        "LockId": bson_lease_id(theirs),
        "LockTime": at(NOW - 59_000),
        // A lease of ours left behind, still live by its `exp`.
        LOCK_FIELD: { "aid": "me", "lid": bson_lease_id(LID), "tok": 7_i64, "exp": at(NOW + 5_000) },
    };
    let view = top()
        .view(LOCK_FIELD, &document, Bson::DateTime(at(NOW)))
        .unwrap();
    assert_eq!(
        view.get_str(crate::foreign::OWNER),
        Ok(theirs.to_string().as_str())
    );
    assert_eq!(
        view.get_datetime(crate::foreign::EXPIRY),
        Ok(&at(NOW + 1_000 + 1))
    );
    assert!(
        !view.contains_key("tok"),
        "read as a foreign holder's: {view}"
    );
}

#[test]
fn an_expired_client_lock_or_a_null_lock_id_leaves_the_lock_field_released() {
    for (lock_id, lock_time) in [
        (
            bson_lease_id(uuid::Uuid::from_u128(42)),
            Bson::DateTime(at(NOW - 60_001)),
        ),
        (Bson::Null, Bson::Null),
    ] {
        let document = doc! {
            "_id": "k",
            "LockId": lock_id,
            "LockTime": lock_time,
            LOCK_FIELD: { "aid": "me", "lid": bson_lease_id(LID), "tok": 7_i64, "exp": at(NOW + 5_000) },
        };
        let view = top()
            .view(LOCK_FIELD, &document, Bson::DateTime(at(NOW)))
            .unwrap();
        assert!(!view.contains_key("lid"), "no longer current: {view}");
        assert_eq!(view.get_datetime("exp"), Ok(&at(NOW)), "{view}");
        assert_eq!(
            view.get_i64("tok"),
            Ok(7),
            "the token rule continues: {view}"
        );
    }
    let bare = doc! { "_id": "k", "LockId": Bson::Null };
    assert_eq!(top().view(LOCK_FIELD, &bare, Bson::DateTime(at(NOW))), None);
}
