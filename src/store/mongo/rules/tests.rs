//! Unit tests of the rules in `rules.rs`: one rule, two paths. Each rule
//! under the lock field `_lease` is the lock collection's with every lock
//! field's path under `_lease`, and nothing else changed; and, on a real
//! `mongod`, what the token rule's first term does at either path.

use super::*;

const LID: Uuid = Uuid::from_u128(0x1234_5678_9abc_def0_1234_5678_9abc_def0);

/// The in-document path of the tests.
fn lease() -> LockPath {
    LockPath::under("_lease")
}

/// `value` with each field path expression `$name` (not `$$VAR`, not
/// `$_id`) written `$_lease.name`, and, with `keys`, each key naming a field
/// (not an operator, not `_id`) written `_lease.name`: the lock
/// collection's form moved under the lock field `_lease`.
fn moved(value: &Bson, keys: bool) -> Bson {
    match value {
        Bson::String(s) if s.starts_with('$') && !s.starts_with("$$") && s != "$_id" => {
            Bson::String(format!("$_lease.{}", &s[1..]))
        }
        Bson::Array(items) => Bson::Array(items.iter().map(|v| moved(v, keys)).collect()),
        Bson::Document(d) => Bson::Document(
            d.iter()
                .map(|(k, v)| {
                    let k = if keys && !k.starts_with('$') && k != "_id" {
                        format!("_lease.{k}")
                    } else {
                        k.clone()
                    };
                    (k, moved(v, keys))
                })
                .collect(),
        ),
        other => other.clone(),
    }
}

/// `value` without the lock collection's "not taken over" test (no
/// `value` field, [`LockPath::untaken`]): each `{ "$eq": [{ "$type":
/// "$value" }, "missing"] }` of an array and each `value` key of a
/// document removed. Only the top has it: the in-document path is the
/// top's form without it, moved under `_lease`.
fn untested(value: &Bson) -> Bson {
    let test = Bson::from(doc! { "$eq": [{ "$type": "$value" }, "missing"] });
    match value {
        Bson::Array(items) => {
            Bson::Array(items.iter().filter(|v| **v != test).map(untested).collect())
        }
        Bson::Document(d) => Bson::Document(
            d.iter()
                .filter(|(k, _)| k.as_str() != "value")
                .map(|(k, v)| (k.clone(), untested(v)))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// [`untested`] for a document.
fn untaken_removed(doc: Document) -> Document {
    match untested(&Bson::Document(doc)) {
        Bson::Document(d) => d,
        _ => unreachable!(),
    }
}

/// [`moved`] for an expression (field paths in values only).
fn expr(doc: Document) -> Bson {
    moved(&Bson::Document(doc), false)
}

/// [`moved`] for a query filter (field names in keys too).
fn filter(doc: Document) -> Bson {
    moved(&Bson::Document(doc), true)
}

#[test]
fn paths_name_the_lock_fields_at_the_top_or_under_the_lock_field() {
    assert_eq!(LockPath::TOP.at("tok"), "tok");
    assert_eq!(LockPath::TOP.var("tok"), "$tok");
    assert_eq!(lease().at("tok"), "_lease.tok");
    assert_eq!(lease().var("tok"), "$_lease.tok");
}

#[test]
fn the_token_rule_is_one_expression_at_either_path() {
    assert_eq!(
        next_token(),
        doc! { "$max": [
            { "$add": [{ "$ifNull": ["$tok", 0_i64] }, 1_i64] },
            { "$multiply": [{ "$toLong": "$$NOW" }, 1_048_576_i64] },
        ]}
    );
    assert_eq!(Bson::from(lease().next_token()), expr(next_token()));
}

#[test]
fn the_layout_test_and_the_token_age_test_are_one_expression_at_either_path() {
    assert_eq!(
        our_layout(),
        doc! { "$and": [
            { "$eq": [{ "$type": "$exp" }, "date"] },
            { "$eq": [{ "$type": "$tok" }, "long"] },
            { "$eq": [{ "$type": "$value" }, "missing"] },
        ]},
        "at the top, a lease another lock pattern's client took over is foreign"
    );
    assert_eq!(
        Bson::from(lease().our_layout()),
        expr(doc! { "$and": [
            { "$eq": [{ "$type": "$exp" }, "date"] },
            { "$eq": [{ "$type": "$tok" }, "long"] },
        ]})
    );
    assert_eq!(
        Bson::from(lease().our_layout()),
        expr(untaken_removed(our_layout()))
    );
    assert_eq!(
        LockPath::TOP.token_older_than(1_000),
        doc! { "$gte": [
            { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << 20] },
            { "$add": ["$tok", 1_000_i64 << 20] },
        ]}
    );
    assert_eq!(
        Bson::from(lease().token_older_than(1_000)),
        expr(LockPath::TOP.token_older_than(1_000))
    );
}

#[test]
fn the_win_rule_is_one_rule_at_either_path_with_its_own_absence() {
    let lid = bson_lease_id(LID);
    let top = LockPath::TOP.wins("me", &lid, None);
    let under = lease().wins("me", &lid, None);
    let (top, under) = (
        top.get_array("$or").unwrap(),
        under.get_array("$or").unwrap(),
    );
    assert_eq!(
        top[0],
        Bson::from(inserted()),
        "a lock document being inserted"
    );
    assert_eq!(
        under[0],
        Bson::from(doc! { "$eq": [{ "$type": "$_lease" }, "missing"] }),
        "a user's document without the lock field"
    );
    assert_eq!(
        top[1],
        Bson::from(doc! { "$and": [
            { "$eq": ["$lid", lid.clone()] },
            { "$eq": ["$aid", { "$literal": "me" }] },
            { "$eq": [{ "$type": "$value" }, "missing"] },
        ]}),
        "a retry under this lease id and owner id, not taken over"
    );
    assert_eq!(
        top[2],
        Bson::from(doc! { "$and": [
            our_layout(),
            { "$lte": ["$exp", "$$NOW"] },
            { "$not": [{ "$and": [
                { "$eq": ["$aid", { "$literal": "me" }] },
                { "$gt": ["$yu", "$$NOW"] },
            ]}] },
        ]}),
        "expired, of our layout, and not yielded by this owner"
    );
    assert_eq!(
        under[1..],
        [
            moved(&untested(&top[1]), false),
            moved(&untested(&top[2]), false)
        ]
    );
    let more = doc! { "$eq": [1, 1] };
    let with_more = LockPath::TOP.wins("me", &lid, Some(more.clone()));
    let free = with_more.get_array("$or").unwrap()[2]
        .as_document()
        .unwrap()
        .get_array("$and")
        .unwrap();
    assert_eq!(free.len(), 4);
    assert_eq!(free[3], Bson::from(more), "a further condition comes last");
}

#[test]
fn an_acquisition_writes_the_same_lock_fields_at_either_path() {
    let lid = bson_lease_id(LID);
    let top = LockPath::TOP.acquired("me", &lid, 30_000);
    assert_eq!(
        top.keys().map(String::as_str).collect::<Vec<_>>(),
        ["aid", "lid", "tok", "acq", "ts", "exp", "data", "wt", "tr"]
    );
    let mine = LockPath::TOP.retry("me", &lid);
    assert_eq!(
        top.get("tok"),
        Some(&Bson::from(doc! { "$cond": [mine, "$tok", next_token()] }))
    );
    assert_eq!(
        Bson::from(lease().acquired("me", &lid, 30_000)),
        expr(untaken_removed(top))
    );
    assert_eq!(
        Bson::from(lease().held_by_other("me")),
        expr(untaken_removed(LockPath::TOP.held_by_other("me")))
    );
    assert_eq!(
        Bson::from(lease().waiting_since()),
        expr(LockPath::TOP.waiting_since())
    );
}

#[test]
fn the_filters_of_leases_owners_and_delete_mode_are_one_filter_at_either_path() {
    let one = LeaseRef {
        key: "k".into(),
        lease_id: LID,
        kind: crate::kind::LeaseKind::Exclusive,
    };
    let keys = doc! { "_id": "k" };
    let untaken = Bson::from(doc! { "$exists": false });
    assert_eq!(
        payload_filter("me", &one),
        doc! {
            "_id": "k",
            "lid": bson_lease_id(LID),
            "aid": { "$eq": "me" },
            "value": { "$exists": false },
        }
    );
    let and = |filter: Document| filter.get_array("$and").unwrap()[1].clone();
    let deletable = LockPath::TOP.deletable_filter(keys.clone(), 1_000, &[]);
    let released = LockPath::TOP.released_filter(keys.clone(), 1_000, &[], &[]);
    for top in [and(deletable.clone()), and(released.clone())] {
        assert_eq!(
            top.as_document().unwrap().get("value"),
            Some(&untaken),
            "at the top, a lease another lock pattern's client took over is not ours"
        );
    }
    assert_eq!(
        Bson::from(lease().payload_filter("me", &one)),
        filter(untaken_removed(payload_filter("me", &one)))
    );
    assert_eq!(
        Bson::from(lease().deletable_filter(keys.clone(), 1_000, &[])),
        filter(untaken_removed(deletable))
    );
    assert_eq!(
        Bson::from(lease().released_filter(keys, 1_000, &[], &[])),
        filter(untaken_removed(released))
    );
}

#[test]
fn change_events_are_read_alike_at_either_path() {
    let lid = bson_lease_id(LID);
    let lock = doc! { "aid": "me", "lid": lid.clone(), "tok": 5_i64, "exp": 1_i64 };
    let event = |kind: &str, full: Document| {
        doc! { "operationType": kind, "documentKey": { "_id": "k" }, "fullDocument": full }
    };
    let no_update = |_: LeaseKey, _: &Document| -> Option<KeyWrite> { None };
    let held = KeyWrite {
        key: "k".into(),
        freed: false,
        lease_id: Some(LID),
        owner: Some("me".into()),
        token: Some(5),
    };
    for kind in ["insert", "replace"] {
        let top = event(kind, lock.clone());
        let under = event(kind, doc! { "x": 1, "_lease": lock.clone() });
        assert_eq!(LockPath::TOP.key_write(&top, no_update), Some(held.clone()));
        assert_eq!(lease().key_write(&under, no_update), Some(held.clone()));
        let released = doc! { "aid": "me", "tok": 5_i64 };
        let freed = Some(announced(
            "k".into(),
            true,
            None,
            Some(&"me".into()),
            Some(&5_i64.into()),
        ));
        assert_eq!(
            LockPath::TOP.key_write(&event(kind, released.clone()), no_update),
            freed
        );
        assert_eq!(
            lease().key_write(&event(kind, doc! { "_lease": released }), no_update),
            freed
        );
        assert_eq!(
            lease().key_write(&event(kind, doc! { "x": 1 }), no_update),
            Some(super::freed("k".into())),
            "a document without the lock field"
        );
    }
    let delete = doc! { "operationType": "delete", "documentKey": { "_id": "k" } };
    assert_eq!(
        LockPath::TOP.key_write(&delete, no_update),
        Some(super::freed("k".into()))
    );
    assert_eq!(
        lease().key_write(&delete, no_update),
        Some(super::freed("k".into()))
    );
    let update = doc! { "operationType": "update", "documentKey": { "_id": "k" } };
    assert_eq!(
        lease().key_write(&update, |key, _| Some(super::freed(key))),
        Some(super::freed("k".into())),
        "an update is read by the place's own reader"
    );
    assert_eq!(
        lease().key_write(&doc! { "operationType": "insert" }, no_update),
        None
    );
}

#[test]
fn stored_tokens_are_read_as_non_negative_integers() {
    assert_eq!(read_token(Some(&Bson::Int64(7))), Some(7));
    assert_eq!(read_token(Some(&Bson::Int32(7))), Some(7));
    assert_eq!(read_token(Some(&Bson::Int64(-1))), None);
    assert_eq!(read_token(Some(&Bson::from("7"))), None);
    assert_eq!(read_token(None), None);
}

/// The rules at either path on a real `mongod`.
#[cfg(feature = "testkit")]
mod on_mongod {
    use crate::store::StoreExt;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use mongodb::bson::{DateTime, Document, doc};
    use uuid::Uuid;

    use super::super::super::document::DocumentStore;
    use super::super::super::tests::{shared_test_db, test_store};
    use crate::store::{AcquireOutcome, Store};

    const TTL: Duration = Duration::from_secs(5);

    /// A token an hour ahead of the server's clock (one written under a
    /// clock that ran ahead), stored in a lock that expired a second ago
    /// and was released.
    fn ahead_of_the_clock() -> (i64, Document) {
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64;
        let token = (now_ms + 3_600_000) << 20;
        let lock = doc! {
            "aid": "other",
            "tok": token,
            "ts": DateTime::from_millis(now_ms - 2_000),
            "exp": DateTime::from_millis(now_ms - 1_000),
        };
        (token, lock)
    }

    /// The token of `store`'s acquisition of `key` (it must be acquired).
    async fn acquired(store: &impl Store, key: &str) -> u64 {
        let outcome = store
            .acquire_with_ttl(key.into(), Uuid::new_v4(), false, TTL)
            .await
            .unwrap();
        match outcome {
            AcquireOutcome::Acquired { token } => token,
            other => panic!("not acquired: {other:?}"),
        }
    }

    /// The token rule's first term in the lock collection: a lock whose
    /// token is ahead of the server's clock is taken with that token plus
    /// one, never with an equal or smaller one.
    #[tokio::test]
    async fn a_token_ahead_of_the_servers_clock_is_followed_by_the_next_one_in_the_lock_collection()
    {
        let db = shared_test_db().await;
        let (locks, store) = test_store(&db, "rules", TTL);
        let (token, lock) = ahead_of_the_clock();
        let mut document = doc! { "_id": "k" };
        document.extend(lock);
        let locks = db.collection::<Document>(&locks);
        locks.insert_one(document).await.unwrap();
        assert_eq!(acquired(&store, "k").await, token as u64 + 1);
        locks.drop().await.unwrap();
    }

    /// The same rule under the lock field of a user's document.
    #[tokio::test]
    async fn a_token_ahead_of_the_servers_clock_is_followed_by_the_next_one_in_a_users_document() {
        let db = shared_test_db().await;
        let (_, store) = test_store(&db, "rules", TTL);
        let (token, lock) = ahead_of_the_clock();
        let users = crate::testkit::unique_name("rules_documents");
        let documents = DocumentStore::new(&store, &users, "_lease", None).unwrap();
        let users = db.collection::<Document>(&users);
        users
            .insert_one(doc! { "_id": "d", "x": 1, "_lease": lock })
            .await
            .unwrap();
        assert_eq!(acquired(&documents, "d").await, token as u64 + 1);
        users.drop().await.unwrap();
    }
}
