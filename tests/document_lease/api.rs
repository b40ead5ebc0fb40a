//! In-document leases through the public API, its surface: the user's
//! fields kept by acquire, renewal and release, `update`, typed documents,
//! a lock field of the user's choice, release on drop, refused updates,
//! ids of any type, bad input.

use std::future::IntoFuture;
use std::time::Duration;

use mongo_lease::{Error, LeaseManager, Operation, ReleaseOutcome};
use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Binary, Bson, DateTime, Document, Timestamp, doc, oid::ObjectId};
use serde::Deserialize;
use tokio_util::time::FutureExt as _;

use crate::common::Fixture;
use crate::support::{
    HANG, ITEMS, bytes, connect_as, insert_item, items, lock_fields, stored, work_items,
};

/// A work item with fields of many BSON types, including top-level fields
/// named like the lock fields (`aid`, `lid`, `tok`, `ts`, `exp`, ...): they
/// are the user's, and the lock fields live under `_lease` only.
fn rich_item(id: &str) -> Document {
    doc! {
        "_id": id,
        "title": "réparer la pompe n° 3",
        "counter": 41_i64,
        "small": 7_i32,
        "ratio": 0.5,
        "flag": true,
        "nothing": Bson::Null,
        "tags": ["a", "b", { "nested": [1, 2.5, "c"] }],
        "nested": { "z": 1, "a": { "deep": Bson::Null, "list": [] } },
        "when": DateTime::from_millis(1_700_000_000_123),
        "bytes": Binary { subtype: BinarySubtype::Generic, bytes: vec![0, 1, 2, 255] },
        "oid": ObjectId::parse_str("64b7f0c2a1b2c3d4e5f60718").unwrap(),
        "stamp": Timestamp { time: 1_700_000_000, increment: 3 },
        "aid": "the user's aid",
        "lid": 7,
        "tok": "not a token",
        "acq": [],
        "ts": { "x": 1 },
        "exp": "never",
        "wt": false,
        "yu": Bson::Null,
    }
}

/// Acquire (also with fields to create, on an existing item), heartbeat
/// renewals and release write only the lock field: the rest of the item,
/// and a neighbouring item nobody acquires, stay byte-for-byte as they
/// were (values, types, field order); once the manager has shut down, the
/// item is exactly the original again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_renewal_and_release_never_change_the_users_fields() {
    /// Short, so that renewals come every second, yet each renewal has
    /// 1.7 s to land before the holder would give the lease up.
    const TTL: Duration = Duration::from_secs(3);
    let fx = Fixture::new("dfields").await;
    let original = rich_item("item");
    let neighbour = rich_item("neighbour");
    items(&fx)
        .insert_many([original.clone(), neighbour.clone()])
        .await
        .unwrap();
    let manager = connect_as(&fx, "holder", TTL).await;
    let handle = work_items(&manager).await;
    let item = handle
        .acquire("item")
        .create(doc! { "counter": 0_i64, "title": "overwritten?" })
        .await
        .unwrap();
    assert_eq!(bytes(item.raw_document()), bytes(&original));
    assert_eq!(item.document(), &original);

    let without_lock = |mut d: Document| {
        let lock = d.remove("_lease");
        (d, lock)
    };
    let (now, lock) = without_lock(stored(&fx, "item").await);
    assert_eq!(bytes(&now), bytes(&original), "after acquire: {now:?}");
    let lock = lock.expect("no lock field after acquire");
    let first_ts = *lock.as_document().unwrap().get_datetime("ts").unwrap();

    // Two renewals by the heartbeat (each moves `_lease.ts`).
    let mut renewals = 0;
    let mut last_ts = first_ts;
    let start = tokio::time::Instant::now();
    while renewals < 2 {
        assert!(start.elapsed() < HANG, "no two renewals in {HANG:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
        let (now, lock) = without_lock(stored(&fx, "item").await);
        assert_eq!(bytes(&now), bytes(&original), "after a renewal: {now:?}");
        let ts = *lock
            .expect("lock field gone while held")
            .as_document()
            .unwrap()
            .get_datetime("ts")
            .unwrap();
        if ts != last_ts {
            renewals += 1;
            last_ts = ts;
        }
    }
    assert!(!item.lease().status().is_lost());

    assert_eq!(item.release().await.unwrap(), ReleaseOutcome::Released);
    let (now, _) = without_lock(stored(&fx, "item").await);
    assert_eq!(bytes(&now), bytes(&original), "after release: {now:?}");
    // Shutdown waits for the removal of a short lease's remaining `{tok}`.
    manager.shutdown().await.unwrap();
    assert_eq!(bytes(&stored(&fx, "item").await), bytes(&original));
    assert_eq!(bytes(&stored(&fx, "neighbour").await), bytes(&neighbour));
}

/// `update` writes under the lease and keeps it (same lock fields, still
/// held against another manager), returning the document as written, for
/// update operators and pipelines alike (a pipeline that sets the lock
/// field leaves the lease as it was); `commit`, by operators or pipeline,
/// then writes and releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_keeps_the_lease_and_returns_the_written_document() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dupdate").await;
    insert_item(&fx, doc! { "_id": "item", "counter": 0, "state": "new" }).await;
    let manager = connect_as(&fx, "holder", TTL).await;
    let other = connect_as(&fx, "other", TTL).await;
    let theirs = work_items(&other).await;
    let mut item = work_items(&manager).await.acquire("item").await.unwrap();
    let lock = lock_fields(&fx, "item").await.expect("lock fields");
    let token = item.lease().fencing_token();

    let written = item
        .update(doc! { "$inc": { "counter": 1 }, "$set": { "state": "working" } })
        .await
        .unwrap()
        .clone();
    assert_eq!(
        written,
        doc! { "_id": "item", "counter": 1, "state": "working" }
    );
    assert_eq!(item.raw_document(), &written);
    assert!(!item.lease().status().is_lost());
    let after = lock_fields(&fx, "item").await.expect("lock fields");
    assert_eq!(after.get("lid"), lock.get("lid"), "{after:?}");
    assert_eq!(after.get("tok"), lock.get("tok"), "{after:?}");
    assert!(
        theirs.try_acquire("item").await.unwrap().is_none(),
        "not held after update"
    );

    let written = item
        .update(vec![
            doc! { "$set": { "counter": { "$add": ["$counter", 10] } } },
        ])
        .await
        .unwrap()
        .clone();
    assert_eq!(
        written,
        doc! { "_id": "item", "counter": 11, "state": "working" }
    );
    assert_eq!(stored(&fx, "item").await.get_i32("counter").unwrap(), 11);

    // A pipeline's stages cannot change the lease: the lock field is
    // restored after them.
    let written = item
        .update(vec![doc! { "$set": { "_lease": "forged", "note": "x" } }])
        .await
        .unwrap()
        .clone();
    assert_eq!(
        written,
        doc! { "_id": "item", "counter": 11, "state": "working", "note": "x" }
    );
    let after = lock_fields(&fx, "item").await.expect("lock fields");
    assert_eq!(after.get("lid"), lock.get("lid"), "{after:?}");
    assert!(!item.lease().status().is_lost());

    let done = item
        .commit(doc! { "$set": { "state": "done" }, "$unset": { "note": "" } })
        .await
        .unwrap();
    assert_eq!(done, doc! { "_id": "item", "counter": 11, "state": "done" });
    let next = theirs
        .try_acquire("item")
        .await
        .unwrap()
        .expect("free after commit");
    assert!(next.lease().fencing_token() > token);
    assert_eq!(next.document(), &done);
    // A commit by pipeline writes and releases alike.
    let again = next
        .commit(vec![doc! { "$set": { "state": "again" } }])
        .await
        .unwrap();
    assert_eq!(
        again,
        doc! { "_id": "item", "counter": 11, "state": "again" }
    );
    let last = work_items(&manager)
        .await
        .try_acquire("item")
        .await
        .unwrap()
        .expect("held after a pipeline commit");
    assert_eq!(last.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[derive(Debug, Deserialize, PartialEq)]
struct WorkItem {
    #[serde(rename = "_id")]
    id: String,
    state: String,
    runs: i32,
    #[serde(default)]
    log: Vec<String>,
}

/// Typed documents: `documents::<WorkItem>` reads the item (created, then
/// updated, then committed) as a `WorkItem`; an item that is not a
/// `WorkItem` is a `Database` error and its lease is released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_documents_are_read_as_the_users_type() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dtyped").await;
    let manager = connect_as(&fx, "holder", TTL).await;
    let typed = manager.documents::<WorkItem>(ITEMS).await.unwrap();
    let mut item = typed
        .acquire("typed")
        .create(doc! { "state": "new", "runs": 0 })
        .await
        .unwrap();
    let expected = |state: &str, runs, log: &[&str]| WorkItem {
        id: "typed".into(),
        state: state.into(),
        runs,
        log: log.iter().map(|s| s.to_string()).collect(),
    };
    assert_eq!(item.document(), &expected("new", 0, &[]));
    let updated = item
        .update(doc! { "$set": { "state": "working" }, "$inc": { "runs": 1 } })
        .await
        .unwrap();
    assert_eq!(updated, &expected("working", 1, &[]));
    let done = item
        .commit(
            doc! { "$set": { "state": "done" }, "$inc": { "runs": 1 }, "$push": { "log": "a" } },
        )
        .await
        .unwrap();
    assert_eq!(done, expected("done", 2, &["a"]));

    // Not a WorkItem (`state` is a number): refused, and released.
    insert_item(&fx, doc! { "_id": "odd", "state": 5, "runs": 0 }).await;
    let odd = typed.acquire("odd").await;
    assert!(matches!(odd, Err(Error::Database(_))), "{odd:?}");
    let raw = work_items(&manager).await;
    let again = raw
        .try_acquire("odd")
        .await
        .unwrap()
        .expect("the lease of an unreadable item was not released");
    assert_eq!(
        again.document(),
        &doc! { "_id": "odd", "state": 5, "runs": 0 }
    );
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// With the lock fields under a field of the user's choice (`lock`), the
/// lock lives there only: a `_lease` field is the user's own, untouched by
/// acquire and release and writable by the user's updates, while updates
/// of `lock` are refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_field_of_the_users_choice_holds_the_lock() {
    let fx = Fixture::new("dfield").await;
    insert_item(
        &fx,
        doc! { "_id": "item", "_lease": "the user's own", "state": "new" },
    )
    .await;
    let manager = connect_as(&fx, "holder", Duration::from_secs(30)).await;
    let handle = manager
        .documents::<Document>(ITEMS)
        .field("lock")
        .await
        .unwrap();
    assert_eq!(handle.field(), "lock");
    let mut item = handle.acquire("item").await.unwrap();
    assert_eq!(
        item.document(),
        &doc! { "_id": "item", "_lease": "the user's own", "state": "new" }
    );
    let now = stored(&fx, "item").await;
    assert_eq!(now.get_str("_lease").unwrap(), "the user's own");
    let lock = now.get_document("lock").expect("the lock under `lock`");
    assert_eq!(lock.get_str("aid").unwrap(), "holder");
    assert!(lock.contains_key("lid"), "{now:?}");

    let refused = item
        .update(doc! { "$set": { "lock.aid": "forged" } })
        .await
        .cloned();
    assert!(
        matches!(refused, Err(Error::InvalidUpdate { .. })),
        "{refused:?}"
    );
    let written = item
        .commit(doc! { "$set": { "_lease": "changed by the user", "state": "done" } })
        .await
        .unwrap();
    assert_eq!(
        written,
        doc! { "_id": "item", "_lease": "changed by the user", "state": "done" }
    );
    manager.shutdown().await.unwrap();
    assert_eq!(
        stored(&fx, "item").await,
        doc! { "_id": "item", "_lease": "changed by the user", "state": "done" }
    );
}

/// Dropping an in-document lease releases it in the background: another
/// manager gets the item long before the lease could have expired, and the
/// item's own fields are left as they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_document_lease_releases_it() {
    /// Far longer than the bound below: only a release can free the item.
    const TTL: Duration = Duration::from_secs(300);
    let fx = Fixture::new("ddrop").await;
    insert_item(&fx, doc! { "_id": "item", "state": "new" }).await;
    let holder = connect_as(&fx, "holder", TTL).await;
    let other = connect_as(&fx, "other", TTL).await;
    let item = work_items(&holder).await.acquire("item").await.unwrap();
    let token = item.lease().fencing_token();
    drop(item);
    let next = work_items(&other)
        .await
        .acquire("item")
        .into_future()
        .timeout(HANG)
        .await
        .ok()
        .transpose()
        .unwrap()
        .expect("the dropped lease was not released");
    assert!(next.lease().fencing_token() > token);
    assert_eq!(next.document(), &doc! { "_id": "item", "state": "new" });
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
    assert_eq!(
        stored(&fx, "item").await,
        doc! { "_id": "item", "state": "new" }
    );
}

/// An update MongoDB refuses (`$inc` of a string) is refused (`Refused`,
/// naming the write and the collection) and writes nothing: after `update` the lease is still held; after
/// `commit` it is released (another manager gets the item long before it
/// could have expired).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_the_server_refuses_writes_nothing_and_a_failed_commit_releases() {
    const TTL: Duration = Duration::from_secs(300);
    let fx = Fixture::new("drefused").await;
    insert_item(&fx, doc! { "_id": "item", "state": "new" }).await;
    let holder = connect_as(&fx, "holder", TTL).await;
    let other = connect_as(&fx, "other", TTL).await;
    let mut item = work_items(&holder).await.acquire("item").await.unwrap();
    let lock = lock_fields(&fx, "item").await.expect("lock fields");
    let bad = doc! { "$inc": { "state": 1 }, "$set": { "touched": true } };

    let update = item.update(bad.clone()).await.cloned();
    assert!(
        matches!(
            update,
            Err(Error::Refused {
                operation: Operation::Write,
                ..
            })
        ),
        "{update:?}"
    );
    assert!(!item.lease().status().is_lost());
    let mut now = stored(&fx, "item").await;
    let still = now.remove("_lease").expect("lock field");
    assert_eq!(still.as_document().unwrap().get("lid"), lock.get("lid"));
    assert_eq!(now, doc! { "_id": "item", "state": "new" });

    let commit = item.commit(bad).await;
    assert!(
        matches!(
            commit,
            Err(Error::Refused {
                operation: Operation::Write,
                ..
            })
        ),
        "{commit:?}"
    );
    let next = work_items(&other)
        .await
        .acquire("item")
        .into_future()
        .timeout(HANG)
        .await
        .ok()
        .transpose()
        .unwrap()
        .expect("the lease of a failed commit was not released");
    assert_eq!(next.document(), &doc! { "_id": "item", "state": "new" });
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// Work items keyed by an `ObjectId`, a number or a document (`_id`s of any
/// type MongoDB accepts): each is acquired by its own `_id`, the lease's key
/// is that `_id`, and numbers follow MongoDB's identity (`7_i32` and
/// `7_i64` are the same item).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_of_any_id_type_are_leased_by_their_id() {
    let fx = Fixture::new("dids").await;
    let oid = ObjectId::parse_str("64b7f0c2a1b2c3d4e5f60718").unwrap();
    items(&fx)
        .insert_many([
            doc! { "_id": oid, "runs": 0 },
            doc! { "_id": 7_i32, "runs": 0 },
            doc! { "_id": { "shard": "eu", "n": 1 }, "runs": 0 },
        ])
        .await
        .unwrap();
    let holder = connect_as(&fx, "holder", Duration::from_secs(30)).await;
    let other = connect_as(&fx, "other", Duration::from_secs(30)).await;
    let (mine, theirs) = (work_items(&holder).await, work_items(&other).await);
    let ids: [Bson; 3] = [
        oid.into(),
        Bson::Int32(7),
        doc! { "shard": "eu", "n": 1 }.into(),
    ];
    for id in &ids {
        let item = mine.acquire(id.clone()).await.unwrap();
        assert_eq!(item.key(), &mongo_lease::LeaseKey::from(id.clone()));
        assert_eq!(item.document().get("_id"), Some(id));
        assert!(
            theirs.try_acquire(id.clone()).await.unwrap().is_none(),
            "{id}"
        );
        item.commit(doc! { "$inc": { "runs": 1 } }).await.unwrap();
    }
    // The same number as an int64: the same item.
    let same = theirs.acquire(7_i64).await.unwrap();
    assert_eq!(same.document().get_i32("runs").unwrap(), 1);
    same.commit(doc! { "$inc": { "runs": 1 } }).await.unwrap();
    holder.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
    for (id, runs) in ids.iter().zip([1, 2, 1]) {
        let item = items(&fx)
            .find_one(doc! { "_id": id.clone() })
            .await
            .unwrap()
            .unwrap();
        assert_eq!(item.get_i32("runs").unwrap(), runs, "{item:?}");
        assert!(!item.contains_key("_lease"), "{item:?}");
    }
    assert_eq!(items(&fx).count_documents(doc! {}).await.unwrap(), 3);
}

/// Bad input gets a clear error and nothing is sent: updates that would
/// write the lock field (`$set`, `$unset`, `$inc` inside it, `$rename` onto
/// it), empty updates and replacement documents are `InvalidUpdate`, and the
/// lease stays held; fields to create naming `_id` or the lock field are
/// `InvalidUpdate`; bad lock field and collection names are `InvalidConfig`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_with_a_clear_error_and_nothing_is_sent() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dbad").await;
    insert_item(&fx, doc! { "_id": "item", "state": "new" }).await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let manager = LeaseManager::connect(options).await.unwrap();
    let handle = work_items(&manager).await;
    let mut item = handle.acquire("item").await.unwrap();
    let lock = lock_fields(&fx, "item").await.expect("lock fields");

    let bad: Vec<mongo_lease::DocumentUpdate> = vec![
        doc! { "$set": { "_lease.lid": "forged" } }.into(),
        doc! { "$set": { "_lease": { "forged": true } } }.into(),
        doc! { "$set": { "state": "forged" }, "$inc": { "_lease.tok": 1 } }.into(),
        doc! { "$unset": { "_lease": "", "forged": "" } }.into(),
        doc! { "$rename": { "state": "_lease" }, "$set": { "forged": 1 } }.into(),
        doc! { "state": "forged" }.into(),
        doc! {}.into(),
        Vec::<Document>::new().into(),
    ];
    for update in bad {
        let result = item.update(update.clone()).await.cloned();
        assert!(
            matches!(result, Err(Error::InvalidUpdate { .. })),
            "{update:?}: {result:?}"
        );
    }
    assert!(!item.lease().status().is_lost());
    let mut now = stored(&fx, "item").await;
    assert_eq!(now.remove("_lease"), Some(Bson::Document(lock)));
    assert_eq!(now, doc! { "_id": "item", "state": "new" });
    let commit = item
        .commit(doc! { "$set": { "_lease.aid": "forged", "state": "forged" } })
        .await;
    assert!(
        matches!(commit, Err(Error::InvalidUpdate { .. })),
        "{commit:?}"
    );

    for (name, create) in [
        ("_id", doc! { "_id": "other", "state": "forged" }),
        (
            "_lease",
            doc! { "_lease": { "aid": "forged" }, "state": "forged" },
        ),
    ] {
        let result = handle.try_acquire("new-item").create(create).await;
        assert!(
            matches!(&result, Err(Error::InvalidUpdate { reason }) if reason.contains(name)),
            "{result:?}"
        );
    }
    let sent: Vec<_> = log
        .all()
        .into_iter()
        .filter(|(_, command)| format!("{command:?}").contains("forged"))
        .collect();
    assert!(sent.is_empty(), "refused input was sent: {sent:?}");
    assert_eq!(
        items(&fx)
            .count_documents(doc! { "_id": { "$ne": "item" } })
            .await
            .unwrap(),
        0
    );

    for field in ["", "_id", "$lease", "a.b", "a\0b"] {
        let result = manager.documents::<Document>(ITEMS).field(field).await;
        assert!(
            matches!(result, Err(Error::InvalidConfig { .. })),
            "field {field:?}: {result:?}"
        );
    }
    for collection in ["", "a$b", "system.items", ".items", "items.", "a\0b"] {
        let result = manager.documents::<Document>(collection).await;
        assert!(
            matches!(result, Err(Error::InvalidConfig { .. })),
            "collection {collection:?}: {result:?}"
        );
    }
    manager.shutdown().await.unwrap();
    let mut collections = fx.db.list_collection_names().await.unwrap();
    collections.sort();
    assert_eq!(collections, [ITEMS, fx.collection.as_str()]);
}
