//! In-document leases opened with `LockIdFields`, on documents that another
//! client locks by top-level `LockId` / `LockTime` fields, that client
//! played by its exact commands: lock with `findOneAndUpdate({_id, $or:
//! [{LockId: null}, {LockTime: {$lt: now - maxDuration}}]}, {$set: {LockId:
//! <new UUID>, LockTime: now}, $setOnInsert: {...}}, upsert, ReturnDocument.After)`,
//! a duplicate key error (E11000) meaning "already locked"; unlock with
//! `updateOne({_id, LockId: <its id>}, {$set: {<new state>, LockId: null,
//! LockTime: null}})`. `now` is its own clock, set by each test.

use std::time::Duration;

use mongo_lease::{Error, LeaseManager, LockIdFields, ReleaseOutcome};
use mongodb::Collection;
use mongodb::bson::{Bson, DateTime, Document, doc, spec::BinarySubtype};

use crate::common::{self, Fixture};
use crate::support::{HANG, ITEMS, insert_item, items, stored};

/// The other client's `maxDuration` in most tests: far longer than a test.
const MAX: Duration = Duration::from_secs(60);

/// The lease's TTL in most tests: at most `MAX`, and no heartbeat runs
/// during a test (every TTL / 3).
const TTL: Duration = Duration::from_secs(30);

/// The other client's lock of `id` at its clock's `now`, with `max` as its
/// `maxDuration`: its `LockId`, or `None` for E11000 ("already locked").
async fn client_lock(
    items: &Collection<Document>,
    id: &str,
    now: DateTime,
    max: Duration,
) -> Option<Bson> {
    let cutoff = DateTime::from_millis(now.timestamp_millis() - max.as_millis() as i64);
    let lock_id = Bson::from(mongodb::bson::Uuid::new());
    let locked = items
        .find_one_and_update(
            doc! { "_id": id, "$or": [{ "LockId": null }, { "LockTime": { "$lt": cutoff } }] },
            doc! {
                "$set": { "LockId": lock_id.clone(), "LockTime": now },
                "$setOnInsert": { "_id": id, "Value": "created" },
            },
        )
        .upsert(true)
        .return_document(mongodb::options::ReturnDocument::After)
        .await;
    match locked {
        Ok(Some(after)) => {
            assert_eq!(after.get("LockId"), Some(&lock_id));
            Some(lock_id)
        }
        Ok(None) => panic!("an upsert returning the document after returned none"),
        Err(e) if e.to_string().contains("E11000") => None,
        Err(e) => panic!("the client's lock of {id:?}: {e}"),
    }
}

/// The other client's unlock of `id` under `lock_id`, writing `value`:
/// whether it matched (modified one document).
async fn client_unlock(
    items: &Collection<Document>,
    id: &str,
    lock_id: &Bson,
    value: &str,
) -> bool {
    let result = items
        .update_one(
            doc! { "_id": id, "LockId": lock_id.clone() },
            doc! { "$set": { "Value": value, "LockId": null, "LockTime": null } },
        )
        .await
        .expect("the client's unlock");
    result.modified_count == 1
}

/// `now` by this machine's clock, moved by `offset_ms`.
fn clock(offset_ms: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() + offset_ms)
}

fn fields(max: Duration) -> LockIdFields {
    LockIdFields::builder().max_duration(max).build()
}

async fn lock_id_items(manager: &LeaseManager, max: Duration) -> mongo_lease::DocumentLeases {
    manager
        .documents(ITEMS)
        .lock_id(fields(max))
        .await
        .expect("open the work items with LockId / LockTime")
}

/// `LockId` of the stored work item `id` is a UUID equal to `_lease.lid`,
/// and `LockTime` equals `_lease.ts`: our lease, as the client reads it.
fn assert_ours(stored: &Document) {
    let lease = stored.get_document("_lease").expect("the lease field");
    match stored.get("LockId") {
        Some(Bson::Binary(b)) if b.subtype == BinarySubtype::Uuid => {}
        other => panic!("LockId is not a UUID: {other:?} in {stored}"),
    }
    assert_eq!(stored.get("LockId"), lease.get("lid"), "{stored}");
    assert_eq!(stored.get("LockTime"), lease.get("ts"), "{stored}");
}

/// Held both ways on one document: while mongo-lease holds it the client's
/// lock fails with E11000; `commit` writes the new state with `LockId:
/// null, LockTime: null` and the client locks it at once; while the client
/// holds it mongo-lease finds it held by that `LockId` until `LockTime +
/// maxDuration` (`try_acquire` is `None`, an `acquire` waits), and the
/// client's unlock frees it for the waiting `acquire`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mongo_lease_and_the_client_exclude_each_other_on_one_document() {
    let fx = Fixture::new("lockid_both").await;
    let manager = fx.manager(TTL).await;
    let leases = lock_id_items(&manager, MAX).await;
    let raw = items(&fx);
    insert_item(&fx, doc! { "_id": "a", "Value": "new" }).await;

    let lease = leases.try_acquire("a").await.unwrap().expect("free");
    assert_ours(&stored(&fx, "a").await);
    assert_eq!(
        client_lock(&raw, "a", clock(0), MAX).await,
        None,
        "held by mongo-lease"
    );
    lease
        .commit(doc! { "$set": { "Value": "ours" } })
        .await
        .unwrap();
    let after = stored(&fx, "a").await;
    assert_eq!(after.get("LockId"), Some(&Bson::Null), "{after}");
    assert_eq!(after.get("LockTime"), Some(&Bson::Null), "{after}");
    assert_eq!(after.get_str("Value"), Ok("ours"));

    let theirs = client_lock(&raw, "a", clock(0), MAX)
        .await
        .expect("free to the client right after the commit");
    assert!(
        leases.try_acquire("a").await.unwrap().is_none(),
        "held by the client"
    );
    let info = leases
        .inspect("a")
        .await
        .unwrap()
        .expect("the client's lock");
    assert!(info.held && info.foreign, "{info:?}");
    let Bson::Binary(id) = &theirs else {
        unreachable!()
    };
    assert_eq!(
        info.owner_id,
        uuid::Uuid::from_slice(&id.bytes).unwrap().to_string()
    );
    let lock_time = stored(&fx, "a")
        .await
        .get_datetime("LockTime")
        .copied()
        .unwrap();
    let expires = DateTime::from_system_time(info.expires_at).timestamp_millis();
    assert_eq!(
        expires,
        lock_time.timestamp_millis() + MAX.as_millis() as i64 + 1
    );

    let waiting = tokio::spawn({
        let leases = leases.clone();
        async move { leases.acquire("a").await }
    });
    // Held by the client whatever the waiting acquire did so far.
    assert_eq!(client_lock(&raw, "a", clock(0), MAX).await, None);
    assert_eq!(stored(&fx, "a").await.get("LockId"), Some(&theirs));
    assert!(client_unlock(&raw, "a", &theirs, "theirs").await);
    let lease = common::within(HANG, "the waiting acquire", waiting)
        .await
        .unwrap()
        .expect("acquired once the client unlocked");
    assert_eq!(lease.document().get_str("Value"), Ok("theirs"));
    assert_ours(&stored(&fx, "a").await);
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    let after = stored(&fx, "a").await;
    assert_eq!(after.get("LockId"), Some(&Bson::Null), "{after}");
    assert!(
        client_lock(&raw, "a", clock(0), MAX).await.is_some(),
        "free after release"
    );
    manager.shutdown().await.unwrap();
}

/// A client's lock whose `LockTime` is older than `maxDuration` (by the
/// server's clock) is taken over by mongo-lease's acquire, and the client's
/// late unlock, filtered on its old `LockId`, then matches nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_client_lock_is_taken_over_and_its_late_unlock_misses() {
    let fx = Fixture::new("lockid_expired").await;
    let manager = fx.manager(TTL).await;
    let leases = lock_id_items(&manager, MAX).await;
    let raw = items(&fx);
    // A lock taken `MAX` + 10 s ago (it creates the document).
    let old = client_lock(&raw, "b", clock(-(MAX.as_millis() as i64) - 10_000), MAX)
        .await
        .expect("free");
    let lease = leases
        .try_acquire("b")
        .await
        .unwrap()
        .expect("expired by the client's rule: taken over");
    assert_ours(&stored(&fx, "b").await);
    assert!(
        !client_unlock(&raw, "b", &old, "late").await,
        "the late unlock misses"
    );
    assert_eq!(client_lock(&raw, "b", clock(0), MAX).await, None);
    assert_eq!(stored(&fx, "b").await.get_str("Value"), Ok("created"));
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// A client whose clock runs ahead by more than `maxDuration` takes a live
/// lease over: from then on every write of that lease, which is
/// conditional on `LockId`, misses (the update is refused as lost and
/// writes nothing, the release leaves the client's lock as it is).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_client_takeover_no_write_of_the_old_lease_lands() {
    let fx = Fixture::new("lockid_taken").await;
    let manager = fx.manager(TTL).await;
    let leases = lock_id_items(&manager, MAX).await;
    let raw = items(&fx);
    insert_item(&fx, doc! { "_id": "c", "Value": "new" }).await;
    let mut lease = leases.acquire("c").await.unwrap();
    let ahead = MAX.as_millis() as i64 + 10_000;
    let theirs = client_lock(&raw, "c", clock(ahead), MAX)
        .await
        .expect("a clock ahead by more than maxDuration takes it over");
    let error = lease
        .update(doc! { "$set": { "Value": "late" } })
        .await
        .expect_err("lost");
    assert!(matches!(error, Error::LeaseLost { .. }), "{error}");
    common::within(
        HANG,
        "the lost lease's token",
        lease.lease().status().lost(),
    )
    .await;
    let (lost, _) = lease.into_parts();
    let _ = lost.release().await;
    let after = stored(&fx, "c").await;
    assert_eq!(after.get("LockId"), Some(&theirs), "{after}");
    assert_eq!(after.get_str("Value"), Ok("new"));
    assert!(client_unlock(&raw, "c", &theirs, "theirs").await);
    manager.shutdown().await.unwrap();
}

/// The transaction helper's check of a lease is conditional on `LockId`
/// too: after a client's takeover (its clock ahead by more than
/// `maxDuration`, so the lease field alone still reads live), a fenced
/// transaction is refused as lost and its writes are not committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_transaction_after_a_client_takeover_does_not_commit() {
    use futures::FutureExt;
    let fx = Fixture::new("lockid_txn").await;
    let manager = fx.manager(TTL).await;
    let leases = lock_id_items(&manager, MAX).await;
    let raw = items(&fx);
    insert_item(&fx, doc! { "_id": "t", "Value": "new" }).await;
    let audit: Collection<Document> = fx.db.collection("audit");
    audit
        .insert_one(doc! { "_id": 0 })
        .await
        .expect("create the audit collection");
    let (lease, _) = leases.acquire("t").await.unwrap().into_parts();
    let ahead = MAX.as_millis() as i64 + 10_000;
    client_lock(&raw, "t", clock(ahead), MAX)
        .await
        .expect("taken over");
    let fenced = lease
        .with_transaction(&fx.client, &audit, |session, audit| {
            async move {
                audit
                    .insert_one(doc! { "_id": 1 })
                    .session(&mut *session)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await;
    assert!(matches!(fenced, Err(Error::LeaseLost { .. })), "{fenced:?}");
    assert_eq!(
        audit.count_documents(doc! {}).await.unwrap(),
        1,
        "not committed"
    );
    drop(lease);
    manager.shutdown().await.unwrap();
}

/// The user's update cannot write `LockId` or `LockTime`: update operators
/// naming them are refused before anything is sent, and an update
/// pipeline's stages that set them are undone (they are kept aside and
/// restored, as the lease field is); a commit with a pipeline writes the
/// new state with `LockId: null, LockTime: null`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_updates_never_change_lock_id_or_lock_time() {
    let fx = Fixture::new("lockid_updates").await;
    let manager = fx.manager(TTL).await;
    let leases = lock_id_items(&manager, MAX).await;
    let raw = items(&fx);
    insert_item(&fx, doc! { "_id": "u", "Value": "new" }).await;
    let mut lease = leases.acquire("u").await.unwrap();
    let before = stored(&fx, "u").await;
    for update in [
        doc! { "$set": { "LockId": null } },
        doc! { "$unset": { "LockTime": "" } },
        doc! { "$rename": { "Value": "LockTime" } },
    ] {
        let error = lease.update(update.clone()).await.expect_err("refused");
        assert!(
            matches!(error, Error::InvalidUpdate { .. }),
            "{update}: {error}"
        );
    }
    let pipeline = vec![doc! { "$set": { "Value": "piped", "LockId": null, "LockTime": "x" } }];
    lease.update(pipeline).await.unwrap();
    let after = stored(&fx, "u").await;
    assert_ours(&after);
    assert_eq!(after.get("LockId"), before.get("LockId"));
    assert_eq!(after.get("LockTime"), before.get("LockTime"));
    assert_eq!(after.get_str("Value"), Ok("piped"));
    assert_eq!(client_lock(&raw, "u", clock(0), MAX).await, None);
    let pipeline = vec![doc! { "$set": { "Value": "done", "LockId": "mine" } }];
    let done = lease.commit(pipeline).await.unwrap();
    assert!(
        !done.contains_key("LockId"),
        "the typed document is read without it"
    );
    let after = stored(&fx, "u").await;
    assert_eq!(after.get("LockId"), Some(&Bson::Null), "{after}");
    assert_eq!(after.get("LockTime"), Some(&Bson::Null), "{after}");
    assert_eq!(after.get_str("Value"), Ok("done"));
    assert!(client_lock(&raw, "u", clock(0), MAX).await.is_some());
    manager.shutdown().await.unwrap();
}

/// Each heartbeat's renewal writes `LockTime` (the server's time), so the
/// client keeps finding the document locked; after a client's takeover (its
/// clock ahead by more than `maxDuration`) the next renewal, conditional on
/// `LockId`, matches nothing: the lease is lost and the client's `LockId`
/// and `LockTime` stay as it wrote them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_write_lock_time_and_miss_after_a_client_takeover() {
    const SHORT_TTL: Duration = Duration::from_millis(1_500);
    let fx = Fixture::new("lockid_renew").await;
    let manager = fx.manager(SHORT_TTL).await;
    let leases = lock_id_items(&manager, MAX).await;
    let raw = items(&fx);
    insert_item(&fx, doc! { "_id": "r", "Value": "new" }).await;
    let lease = leases.acquire("r").await.unwrap();
    let acquired = stored(&fx, "r")
        .await
        .get_datetime("LockTime")
        .copied()
        .unwrap();
    common::eventually("a renewal writes LockTime", HANG, || async {
        let now = stored(&fx, "r").await;
        assert_ours(&now);
        now.get_datetime("LockTime").copied().unwrap() > acquired
    })
    .await;
    let ahead = MAX.as_millis() as i64 + 10_000;
    let theirs = client_lock(&raw, "r", clock(ahead), MAX)
        .await
        .expect("taken over");
    let taken = stored(&fx, "r").await;
    common::within(
        HANG,
        "the renewal that finds the lease lost",
        lease.lease().status().lost(),
    )
    .await;
    let after = stored(&fx, "r").await;
    assert_eq!(after.get("LockId"), Some(&theirs), "{after}");
    assert_eq!(after.get("LockTime"), taken.get("LockTime"), "{after}");
    drop(lease);
    manager.shutdown().await.unwrap();
    let after = stored(&fx, "r").await;
    assert_eq!(
        after.get("LockId"),
        Some(&theirs),
        "shutdown released nothing of theirs"
    );
}

/// A mongo-lease holder whose process dies without releasing: the client
/// finds the document locked until the lease's last `LockTime` plus
/// `maxDuration` by its clock, and locks it after that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holder_is_taken_over_by_the_client_after_max_duration() {
    const SHORT_MAX: Duration = Duration::from_millis(1_500);
    let fx = Fixture::new("lockid_crash").await;
    insert_item(&fx, doc! { "_id": "d", "Value": "new" }).await;
    fx.crashed_process(Duration::from_secs(1), |manager| async move {
        let leases = lock_id_items(&manager, SHORT_MAX).await;
        let lease = leases.acquire("d").await.expect("acquire");
        std::mem::forget(lease);
    });
    let raw = items(&fx);
    assert_ours(&stored(&fx, "d").await);
    let start = std::time::Instant::now();
    let taken_at = loop {
        let lock_time = stored(&fx, "d")
            .await
            .get_datetime("LockTime")
            .copied()
            .unwrap();
        let now = clock(0);
        match client_lock(&raw, "d", now, SHORT_MAX).await {
            Some(_) => break (lock_time, now),
            None => {
                // Refused only while held by its rule (how many attempts
                // come that early depends on the machine's speed).
                assert!(
                    now.timestamp_millis() - lock_time.timestamp_millis()
                        <= SHORT_MAX.as_millis() as i64,
                    "refused past LockTime + maxDuration"
                );
            }
        }
        // Only turns a hang into a failure: the takeover is due 1.5 s after LockTime.
        assert!(start.elapsed() < HANG, "never taken over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let (lock_time, now) = taken_at;
    assert!(now.timestamp_millis() - lock_time.timestamp_millis() > SHORT_MAX.as_millis() as i64);
}

/// A lease's TTL over `maxDuration` is refused before anything is sent,
/// on acquire and on `set_ttl`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ttl_over_max_duration_is_refused() {
    let fx = Fixture::new("lockid_ttl").await;
    let manager = fx.manager(TTL).await;
    let leases = lock_id_items(&manager, Duration::from_secs(20)).await;
    insert_item(&fx, doc! { "_id": "e" }).await;
    let error = leases
        .try_acquire("e")
        .await
        .expect_err("TTL 30 s over 20 s");
    assert!(matches!(error, Error::InvalidConfig { .. }), "{error}");
    assert!(
        stored(&fx, "e").await.get("LockId").is_none(),
        "nothing written"
    );
    let lease = leases
        .try_acquire("e")
        .ttl(Duration::from_secs(15))
        .await
        .unwrap()
        .expect("free");
    let error = lease
        .lease()
        .set_ttl(Duration::from_secs(25))
        .await
        .expect_err("over 20 s");
    assert!(matches!(error, Error::InvalidConfig { .. }), "{error}");
    let error = manager
        .documents::<Document>(ITEMS)
        .lock_id(fields(Duration::from_secs(10)))
        .await
        .expect_err("opened with another max_duration");
    assert!(matches!(error, Error::InvalidConfig { .. }), "{error}");
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}
