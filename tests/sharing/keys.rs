//! Keys of any BSON type MongoDB accepts as `_id`: the lock document's `_id`
//! is exactly the key, so an `ObjectId` key excludes another application
//! locking the same `ObjectId`; refused kinds fail before any round trip;
//! numbers of equal value are one key. The CLI's `--key-json`:
//! `cli/tests/sharing/keys.rs`.

use std::future::IntoFuture;
use std::time::Duration;

use mongo_lease::{Election, Error, LeaseKey, LeaseManager, ReleaseOutcome};
use mongodb::bson::{
    Binary, Bson, DateTime, Document, JavaScriptCodeWithScope, Regex, Timestamp, doc,
    oid::ObjectId, spec::BinarySubtype,
};
use tokio_util::time::FutureExt as _;

use crate::common::{self, Fixture};

const TTL: Duration = Duration::from_secs(30);
const OID: &str = "5087b72181a445980ae47d13";

fn oid() -> ObjectId {
    OID.parse().unwrap()
}

/// Another application's lock of `_id` in the pattern's layout.
fn foreign_lock(id: impl Into<Bson>) -> Document {
    doc! { "_id": id.into(), "ts": DateTime::now(), "aid": "other-application" }
}

fn is_duplicate_key(e: &mongodb::error::Error) -> bool {
    matches!(
        *e.kind,
        mongodb::error::ErrorKind::Write(mongodb::error::WriteFailure::WriteError(ref w))
            if w.code == 11000
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_objectid_key_is_stored_as_that_objectid_and_excludes_another_applications_insert() {
    let fx = Fixture::new("keys_oid").await;
    let manager = fx.manager(TTL).await;
    let lease = manager.acquire(oid()).await.unwrap();
    assert_eq!(lease.key().to_bson(), Bson::ObjectId(oid()));

    let stored = fx
        .raw()
        .find_one(doc! { "_id": oid() })
        .await
        .unwrap()
        .expect("a lock document under the ObjectId itself");
    assert_eq!(stored.get("_id"), Some(&Bson::ObjectId(oid())));
    assert_eq!(
        fx.raw()
            .count_documents(doc! { "_id": oid().to_hex() })
            .await
            .unwrap(),
        0,
        "no string key beside it"
    );

    let err = fx
        .raw()
        .insert_one(foreign_lock(oid()))
        .await
        .expect_err("the other application's lock must fail while mongo-lease holds it");
    assert!(is_duplicate_key(&err), "E11000 expected, got {err}");

    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_of_each_type_come_back_equal_and_are_stored_with_their_type() {
    let fx = Fixture::new("keys_types").await;
    let manager = fx.manager(TTL).await;
    let uuid = uuid::Uuid::new_v4();
    let keys: Vec<(LeaseKey, Bson)> = vec![
        (7_i32.into(), Bson::Int32(7)),
        (8_i64.into(), Bson::Int64(8)),
        (
            uuid.into(),
            Bson::Binary(Binary {
                subtype: BinarySubtype::Uuid,
                bytes: uuid.as_bytes().to_vec(),
            }),
        ),
        (
            DateTime::from_millis(1_700_000_000_123).into(),
            Bson::DateTime(DateTime::from_millis(1_700_000_000_123)),
        ),
        (
            doc! { "tenant": 3_i64, "item": "a" }.into(),
            Bson::Document(doc! { "tenant": 3_i64, "item": "a" }),
        ),
    ];
    for (key, stored) in keys {
        let lease = manager.acquire(&key).await.unwrap();
        assert_eq!(lease.key(), &key);
        assert_eq!(lease.key().to_bson(), stored);

        let info = manager.inspect(&key).await.unwrap().expect("a lease");
        assert!(info.held, "{key}");
        assert_eq!(info.key.to_bson(), stored, "inspect keeps the type");
        let listed = manager.list().await.unwrap();
        assert!(
            listed.iter().any(|i| i.key.to_bson() == stored && i.held),
            "list shows {key} with its type: {listed:?}"
        );

        let doc = fx
            .raw()
            .find_one(doc! { "_id": stored.clone() })
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("no lock document for {key}"));
        assert_eq!(
            doc.get("_id"),
            Some(&stored),
            "the _id is the key, type included"
        );

        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
        let info = manager.inspect(&key).await.unwrap().expect("released");
        assert!(!info.held, "{key} released");
    }
    manager.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_keys_fail_with_invalid_key_before_any_round_trip() {
    let fx = Fixture::new("keys_refused").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let manager = LeaseManager::connect(options).await.unwrap();
    let refused: Vec<(LeaseKey, &str)> = vec![
        (Bson::Array(vec![Bson::Int32(1)]).into(), "array"),
        (
            Bson::RegularExpression(Regex {
                pattern: "^a".into(),
                options: String::new(),
            })
            .into(),
            "regular expression",
        ),
        (Bson::Undefined.into(), "undefined"),
        (doc! { "a": { "$b": 1 } }.into(), "'$'"),
        (doc! { "$a": 1 }.into(), "'$'"),
        ("".into(), "empty"),
        ("x".repeat(mongo_lease::MAX_KEY_LEN + 1).into(), "limit"),
        (
            doc! { "k": "x".repeat(mongo_lease::MAX_KEY_LEN) }.into(),
            "limit",
        ),
    ];
    log.clear();
    for (key, why) in refused {
        let check = |result: Result<(), Error>, call: &str| match result {
            Err(Error::InvalidKey { reason }) => {
                assert!(reason.contains(why), "{call}({key:?}): {reason}")
            }
            other => panic!("{call}({key:?}): expected InvalidKey, got {other:?}"),
        };
        check(manager.try_acquire(&key).await.map(|_| ()), "try_acquire");
        check(manager.acquire(&key).await.map(|_| ()), "acquire");
        check(
            manager
                .acquire(&key)
                .into_future()
                .timeout(Duration::from_secs(1))
                .await
                .ok()
                .transpose()
                .map(|_| ()),
            "acquire under a timeout",
        );
        check(manager.inspect(&key).await.map(|_| ()), "inspect");
        check(manager.observe(&key).await.map(|_| ()), "observe");
        check(
            manager.force_release(&key).await.map(|_| ()),
            "force_release",
        );
        check(Election::new(&manager, &key).map(|_| ()), "Election::new");
    }
    assert_eq!(log.all(), Vec::new(), "no command was sent");
    manager.shutdown().await.unwrap();
}

/// Every BSON type that a key can hold, inserted as `_id` by the driver into
/// a scratch collection: MongoDB's verdict must be the key check's verdict.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_key_check_accepts_exactly_the_ids_mongodb_accepts() {
    let fx = Fixture::new("keys_accepted").await;
    let manager = fx.manager(TTL).await;
    let scratch = fx.db.collection::<Document>("scratch");
    let dbpointer = LeaseKey::from_extended_json(&format!(
        r#"{{"$dbPointer":{{"$ref":"a.b","$id":{{"$oid":"{OID}"}}}}}}"#
    ))
    .unwrap()
    .into_bson();
    let candidates: Vec<(&str, Bson)> = vec![
        ("null", Bson::Null),
        ("bool", Bson::Boolean(true)),
        ("MinKey", Bson::MinKey),
        ("MaxKey", Bson::MaxKey),
        ("double", Bson::Double(2.5)),
        ("decimal", Bson::Decimal128("1.5".parse().unwrap())),
        (
            "timestamp",
            Bson::Timestamp(Timestamp {
                time: 1,
                increment: 2,
            }),
        ),
        ("code", Bson::JavaScriptCode("f()".into())),
        (
            "code with scope",
            Bson::JavaScriptCodeWithScope(JavaScriptCodeWithScope {
                code: "g()".into(),
                scope: doc! { "x": 1 },
            }),
        ),
        ("symbol", Bson::Symbol("s".into())),
        ("DBPointer", dbpointer),
        ("int32", Bson::Int32(1)),
        ("int64", Bson::Int64(2)),
        // Not "s": MongoDB takes the symbol "s" and the string "s" for one `_id`.
        ("string", Bson::String("str".into())),
        ("ObjectId", Bson::ObjectId(oid())),
        ("date", Bson::DateTime(DateTime::from_millis(5))),
        (
            "binary",
            Bson::Binary(Binary {
                subtype: BinarySubtype::Generic,
                bytes: vec![1, 2],
            }),
        ),
        ("document", Bson::Document(doc! { "a": 1 })),
        ("document with array", Bson::Document(doc! { "a": [1, 2] })),
        (
            "document with regex",
            Bson::Document(
                doc! { "a": Bson::RegularExpression(Regex { pattern: "x".into(), options: String::new() }) },
            ),
        ),
        ("array", Bson::Array(vec![Bson::Int32(1)])),
        ("empty array", Bson::Array(Vec::new())),
        (
            "regex",
            Bson::RegularExpression(Regex {
                pattern: "x".into(),
                options: String::new(),
            }),
        ),
        ("undefined", Bson::Undefined),
        ("$ field", Bson::Document(doc! { "$a": 1 })),
        ("nested $ field", Bson::Document(doc! { "a": { "$b": 1 } })),
    ];
    let mut disagreements = Vec::new();
    for (name, value) in candidates {
        let mongodb = scratch.insert_one(doc! { "_id": value.clone() }).await;
        let ours = manager.inspect(value.clone()).await;
        let (mongodb_accepts, we_accept) = (mongodb.is_ok(), ours.is_ok());
        eprintln!(
            "{name:>20}: MongoDB {} / key check {}",
            if mongodb_accepts {
                "accepts"
            } else {
                "refuses"
            },
            if we_accept { "accepts" } else { "refuses" },
        );
        if let Err(e) = &ours {
            assert!(matches!(e, Error::InvalidKey { .. }), "{name}: {e:?}");
        }
        if mongodb_accepts != we_accept {
            disagreements.push((name, mongodb.err().map(|e| e.to_string()), ours.err()));
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
    manager.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_32_bit_and_a_64_bit_one_are_the_same_key_locally_and_in_mongodb() {
    let fx = Fixture::new("keys_numbers").await;
    let manager = fx.manager(TTL).await;
    let other = fx.manager(TTL).await;
    let lease = manager.acquire(1_i32).await.unwrap();
    assert!(manager.try_acquire(1_i64).await.unwrap().is_none(), "local");
    assert!(
        manager
            .try_acquire(Bson::Double(1.0))
            .await
            .unwrap()
            .is_none(),
        "local"
    );
    assert!(other.try_acquire(1_i64).await.unwrap().is_none(), "remote");

    // A local waiter for 1_i64 gets the key when the 1_i32 lease is released.
    // Polled once before it is spawned: its command is in the manager's
    // queue ahead of the release, whatever the scheduler does, so it
    // really waits (a task not yet run would find the key free later).
    let mut waiter = Box::pin({
        let manager = manager.clone();
        async move { manager.acquire(1_i64).await }
    });
    assert!(
        futures::poll!(&mut waiter).is_pending(),
        "waits while 1 is held"
    );
    let waiter = tokio::spawn(waiter);
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    let second = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the waiter gets the key")
        .unwrap()
        .unwrap();
    assert_eq!(second.key(), &LeaseKey::from(1_i32));
    assert_eq!(
        fx.raw().count_documents(doc! {}).await.unwrap(),
        1,
        "one lock document for 1 and NumberLong(1)"
    );
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// The next state from `observer`, within a bound that only turns a hang
/// into a failure.
async fn next(observer: &mut mongo_lease::LeaseObserver) -> Option<mongo_lease::LeaseInfo> {
    tokio::time::timeout(Duration::from_secs(20), observer.recv())
        .await
        .expect("a state within the bound")
        .expect("the stream goes on")
        .expect("no error")
}

/// Whether the manager that `log` monitors has its stream of releases open:
/// it sent the `aggregate` of that stream (the one whose pipeline has a
/// `$project` stage; an observer's has a `$match` only), and every
/// `aggregate` it sent was answered.
fn watching_releases(log: &common::CommandLog) -> bool {
    let sent = log.all().iter().any(|(name, command)| {
        name == "aggregate"
            && command.get_array("pipeline").is_ok_and(|stages| {
                stages
                    .iter()
                    .any(|s| s.as_document().is_some_and(|s| s.contains_key("$project")))
            })
    });
    sent && log.count("ok:aggregate") == log.count("aggregate")
}

/// Observers and waiters follow a document key through the change stream:
/// its events are matched on `documentKey._id` equal to the whole document.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_and_a_waiter_of_a_document_key_follow_its_lease() {
    let fx = Fixture::new("keys_observe").await;
    let holder = fx.manager(TTL).await;
    // The waiter's backoff is longer than the bound it is given below (and
    // its first retry is capped by the holder's remaining lease time, ~TTL,
    // also longer): only the change stream's delete/update event can wake it
    // within the bound.
    let (mut options, log) = fx.monitored_options(TTL, "").await;
    options.retry_initial = Duration::from_secs(600);
    options.retry_max = Duration::from_secs(600);
    let other = LeaseManager::connect(options).await.unwrap();
    let key = LeaseKey::from(doc! { "tenant": 3_i64, "item": oid() });

    let mut observer = other.observe(&key).await.unwrap();
    assert_eq!(observer.key(), &key);
    let first = observer.recv().await.unwrap().unwrap();
    assert!(first.is_none(), "free at first: {first:?}");

    let lease = holder.acquire(&key).await.unwrap();
    let held = next(&mut observer).await.expect("a lease");
    assert!(held.held && held.owner_id == holder.owner_id());
    assert_eq!(held.key.to_bson(), key.to_bson());

    let waiter = tokio::spawn({
        let (other, key) = (other.clone(), key.clone());
        async move { other.acquire(key).await }
    });
    // The waiter really waits before the release: its failed attempt marks
    // the lease (`wt`), which only an acquire that will wait does.
    common::eventually(
        "the waiter marks the lease",
        Duration::from_secs(20),
        || async {
            fx.raw()
                .find_one(doc! { "_id": key.to_bson() })
                .await
                .unwrap()
                .is_some_and(|d| d.contains_key("wt"))
        },
    )
    .await;
    // ...and its manager's stream of releases is open (it opens after the
    // failed attempt; a release before that would be left to the backoff).
    common::eventually(
        "the waiter's stream of releases is open",
        Duration::from_secs(20),
        || async { watching_releases(&log) },
    )
    .await;
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    // The waiter's waiting mark may show first, as a held state; the release
    // then frees the key, or hands it to the waiter registered in its queue
    // of waiting owners.
    loop {
        let state = next(&mut observer).await.expect("the document stays");
        if !state.held || state.owner_id == other.owner_id() {
            break;
        }
        assert_eq!(state.owner_id, holder.owner_id(), "{state:?}");
    }
    let taken = tokio::time::timeout(Duration::from_secs(20), waiter)
        .await
        .expect("the change stream wakes the waiter (its backoff is 600 s)")
        .unwrap()
        .unwrap();
    assert_eq!(taken.key(), &key);
    drop(observer);
    assert_eq!(taken.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}
