//! Other applications' lock documents are held locks: a document that
//! `mongo-lease` did not write (here the common `{_id, ts, aid}` of an
//! application that acquires by insert and releases by delete) is held by a
//! foreign holder. It is never taken or modified, waiters get the key once
//! its owner deletes it, reads show it with its `aid` and `ts`, and only a
//! force release deletes it. Plain driver calls play the other application.

use std::future::IntoFuture;
use std::time::Duration;

use futures::StreamExt;
use mongo_lease::LeaseManager;
use mongodb::bson::doc;
use tokio_util::time::FutureExt as _;

use crate::common::others::{
    BARE, OTHER_APP, bare_lock, bare_unlock, bytes, foreign_lock, stored_bytes,
};
use crate::common::{self, Fixture};

const TTL: Duration = Duration::from_secs(3);
/// A liveness bound: only turns a hang into a failure.
const WAIT: Duration = Duration::from_secs(60);
async fn shutdown(manager: LeaseManager) {
    manager.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn try_acquire_returns_none_and_never_modifies_a_foreign_lock_nor_does_waiting_or_a_heartbeat()
 {
    let fx = Fixture::new("foreign_try").await;
    let m = fx.manager(TTL).await;
    let written = foreign_lock(&fx, "job", OTHER_APP).await;

    assert!(m.try_acquire("job").await.unwrap().is_none());
    assert_eq!(stored_bytes(&fx, "job").await, bytes(&written));

    // A waiting acquire that times out: it polled, and marked nothing.
    let waited = m
        .acquire("job")
        .into_future()
        .timeout(Duration::from_millis(500))
        .await
        .ok()
        .transpose()
        .unwrap();
    assert!(waited.is_none());
    assert_eq!(stored_bytes(&fx, "job").await, bytes(&written));

    // A heartbeat renews this manager's own lease, not the foreign lock.
    let lease = m.acquire("mine").await.unwrap();
    let acquired_ts = fx.doc("mine").await.get_datetime("ts").unwrap().to_owned();
    common::eventually("a heartbeat renewed \"mine\"", WAIT, || async {
        fx.doc("mine").await.get_datetime("ts").unwrap() > &acquired_ts
    })
    .await;
    assert_eq!(stored_bytes(&fx, "job").await, bytes(&written));
    assert!(!lease.status().is_lost());
    assert!(!lease.release().await.unwrap().was_lost());
    shutdown(m).await;
    assert_eq!(stored_bytes(&fx, "job").await, bytes(&written));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_waits_for_a_foreign_lock_and_is_woken_by_its_owners_delete() {
    let fx = Fixture::new("foreign_wait").await;
    let (mut options, log) = fx.monitored_options(TTL, "").await;
    // Polls far apart: within the test, only the change stream's delete
    // event can wake the waiter.
    options.retry_initial = Duration::from_secs(3600);
    options.retry_max = Duration::from_secs(3600);
    let m = LeaseManager::connect(options).await.unwrap();
    let written = foreign_lock(&fx, "job", OTHER_APP).await;

    let acquire = tokio::spawn({
        let m = m.clone();
        async move { m.acquire("job").await }
    });
    // Pending: its attempt found the key held, and the stream of releases
    // is open (its `aggregate` was answered).
    let pending = || {
        let all = log.all();
        let attempted = all.iter().any(|(name, cmd)| {
            name == "findAndModify" && cmd.get_str("findAndModify").is_ok() && {
                cmd.get_document("query")
                    .is_ok_and(|q| q.get_str("_id") == Ok("job"))
            }
        });
        let watching = all.iter().any(|(name, reply)| {
            name == "ok:aggregate"
                && reply
                    .get_document("cursor")
                    .is_ok_and(|c| c.contains_key("id"))
        });
        attempted && watching
    };
    common::eventually("the acquire is pending", WAIT, || async { pending() }).await;
    assert!(!acquire.is_finished());
    assert_eq!(stored_bytes(&fx, "job").await, bytes(&written));

    // The other application releases: it deletes its document.
    let deleted = fx
        .raw()
        .delete_one(doc! { "_id": "job", "aid": OTHER_APP })
        .await
        .unwrap();
    assert_eq!(deleted.deleted_count, 1);
    let lease = tokio::time::timeout(WAIT, acquire)
        .await
        .expect("woken by the delete")
        .unwrap()
        .unwrap();
    let doc = fx.doc("job").await;
    assert_eq!(doc.get_str("aid").unwrap(), m.owner_id());
    assert!(doc.get_i64("tok").is_ok() && doc.get_datetime("exp").is_ok());
    assert!(doc.get_datetime("acq").unwrap() >= written.get_datetime("ts").unwrap());
    assert!(!lease.release().await.unwrap().was_lost());
    shutdown(m).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_list_and_observe_show_a_foreign_lock_held_by_its_aid_since_its_ts() {
    let fx = Fixture::new("foreign_read").await;
    let m = fx.manager(TTL).await;
    let written = foreign_lock(&fx, "job", OTHER_APP).await;
    let ts = written.get_datetime("ts").unwrap().to_system_time();
    fx.raw()
        .insert_one(doc! { "_id": "odd", "ts": "yesterday", "aid": 42, "tok": 7 })
        .await
        .unwrap();
    let ours = m.acquire("mine").await.unwrap();

    let info = m.inspect("job").await.unwrap().expect("the foreign lock");
    assert!(info.foreign && info.held, "{info:?}");
    assert_eq!(info.owner_id, OTHER_APP);
    assert_eq!((info.acquired_at, info.renewed_at), (ts, ts));
    assert_eq!(info.fencing_token, 0);
    assert_eq!(info.expires_at, info.server_time, "unknown expiry");
    assert_eq!(info.time_to_expiry(), Duration::MAX);
    assert_eq!(info.payload, None);

    let odd = m.inspect("odd").await.unwrap().expect("the foreign lock");
    assert!(odd.foreign && odd.held);
    assert_eq!(
        odd.owner_id, r#"{"$numberInt":"42"}"#,
        "canonical Extended JSON"
    );
    // Its `tok` is not a fence of ours: a foreign lock reads with none.
    assert_eq!(odd.fencing_token, 0);
    assert_eq!(odd.renewed_at, odd.server_time, "its ts is not a date");

    let listed: Vec<_> = m
        .list()
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.key, i.owner_id, i.held, i.foreign))
        .collect();
    assert_eq!(
        listed,
        [
            ("job".into(), OTHER_APP.into(), true, true),
            ("mine".into(), m.owner_id().to_string(), true, false),
            ("odd".into(), r#"{"$numberInt":"42"}"#.into(), true, true),
        ]
    );

    // Observed as held by the foreign holder, then free once deleted.
    let mut observer = m.observe("job").await.unwrap();
    let first = tokio::time::timeout(WAIT, observer.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .expect("the foreign lock");
    assert!(first.foreign && first.held);
    assert_eq!((first.owner_id.as_str(), first.renewed_at), (OTHER_APP, ts));
    fx.raw().delete_one(doc! { "_id": "job" }).await.unwrap();
    let next = tokio::time::timeout(WAIT, observer.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(next, None);
    drop(observer);
    assert!(!ours.release().await.unwrap().was_lost());
    shutdown(m).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_release_deletes_a_foreign_lock_but_release_all_and_shutdown_with_its_aid_leave_it() {
    let fx = Fixture::new("foreign_release").await;
    let mut options = fx.options(TTL).await;
    options.owner_id = Some(OTHER_APP.into());
    let same_aid = LeaseManager::connect(options).await.unwrap();
    let operator = fx.manager(TTL).await;
    let written = foreign_lock(&fx, "theirs", OTHER_APP).await;
    let lease = same_aid.acquire("mine").await.unwrap();

    assert_eq!(same_aid.release_all().await.unwrap(), 1);
    assert!(lease.status().is_lost());
    assert_eq!(stored_bytes(&fx, "theirs").await, bytes(&written));
    let _again = same_aid.acquire("mine").await.unwrap();
    shutdown(same_aid).await;
    assert!(fx.doc("mine").await.get("lid").is_none(), "released");
    assert_eq!(stored_bytes(&fx, "theirs").await, bytes(&written));

    let before = operator
        .force_release("theirs")
        .await
        .unwrap()
        .expect("the foreign lock, as it was");
    assert!(before.foreign && before.held);
    assert_eq!(before.owner_id, OTHER_APP);
    assert_eq!(stored_bytes(&fx, "theirs").await, None, "deleted");
    assert_eq!(operator.force_release("theirs").await.unwrap(), None);
    let taken = operator.try_acquire("theirs").await.unwrap();
    assert!(taken.is_some(), "free once deleted");
    drop(taken);
    shutdown(operator).await;
}

// ----- a bare `{_id}`: a client that locks by an upsert of its `_id` alone --

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_id_lock_is_held_try_acquire_returns_none_and_a_waiter_gets_it_after_its_delete() {
    let fx = Fixture::new("foreign_bare").await;
    let (mut options, log) = fx.monitored_options(TTL, "").await;
    // Polls far apart: within the test, only the change stream's delete
    // event can wake the waiter.
    options.retry_initial = Duration::from_secs(3600);
    options.retry_max = Duration::from_secs(3600);
    let m = LeaseManager::connect(options).await.unwrap();
    assert_eq!(
        bare_lock(&fx, BARE).await,
        None,
        "the other client acquired"
    );
    let bare = doc! { "_id": BARE };

    assert!(m.try_acquire(BARE).await.unwrap().is_none());
    assert_eq!(stored_bytes(&fx, BARE).await, bytes(&bare));
    let info = m.inspect(BARE).await.unwrap().expect("a foreign lock");
    assert!(info.held && info.foreign, "{info:?}");
    assert_eq!((info.owner_id.as_str(), info.fencing_token), ("", 0));

    let acquire = tokio::spawn({
        let m = m.clone();
        async move { m.acquire(BARE).await }
    });
    // Pending: an attempt after the `try_acquire` found the key held, and
    // the stream of releases is open (its `aggregate` was answered).
    let pending = || {
        let all = log.all();
        let attempts = all
            .iter()
            .filter(|(name, cmd)| {
                name == "findAndModify"
                    && cmd
                        .get_document("query")
                        .is_ok_and(|q| q.get_str("_id") == Ok(BARE))
            })
            .count();
        let watching = all.iter().any(|(name, reply)| {
            name == "ok:aggregate"
                && reply
                    .get_document("cursor")
                    .is_ok_and(|c| c.contains_key("id"))
        });
        attempts >= 2 && watching
    };
    common::eventually("the acquire is pending", WAIT, || async { pending() }).await;
    assert!(!acquire.is_finished());
    assert_eq!(stored_bytes(&fx, BARE).await, bytes(&bare));

    bare_unlock(&fx, BARE).await;
    let lease = tokio::time::timeout(WAIT, acquire)
        .await
        .expect("woken by the delete")
        .unwrap()
        .unwrap();
    let doc = fx.doc(BARE).await;
    assert_eq!(doc.get_str("aid").unwrap(), m.owner_id());
    assert!(doc.get_i64("tok").is_ok() && doc.get_datetime("exp").is_ok());
    assert!(!lease.release().await.unwrap().was_lost());
    shutdown(m).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bare_id_client_still_locks_a_key_after_mongo_lease_released_it() {
    let fx = Fixture::new("foreign_bare_after").await;
    // Keep mode: the released document stays (ours, not bare) until the TTL
    // monitor deletes it; the client's command reads it back, so that client
    // sees the key held, and writes nothing.
    let m = fx.manager(TTL).await;
    let lease = m.acquire(BARE).await.unwrap();
    assert!(!lease.release().await.unwrap().was_lost());
    let released = fx.doc(BARE).await;
    assert!(released.get_i64("tok").is_ok() && released.get_datetime("exp").is_ok());
    assert!(!released.contains_key("lid"));
    let seen = bare_lock(&fx, BARE).await.expect("the released document");
    assert_eq!(seen, released);
    assert_eq!(stored_bytes(&fx, BARE).await, bytes(&released));
    // Ours again at once: a released document is free.
    let lease = m.try_acquire(BARE).await.unwrap().expect("free");
    assert!(!lease.release().await.unwrap().was_lost());
    shutdown(m).await;

    // Delete mode (for clients that lock by insert or upsert and release by
    // delete): once the release deleted the document, the client locks.
    let mut options = fx.options(TTL).await;
    options.release_mode = Some(mongo_lease::ReleaseMode::Delete);
    let m = LeaseManager::connect(options).await.unwrap();
    let key = "lock_bare_deleted";
    let lease = m.acquire(key).await.unwrap();
    assert!(!lease.release().await.unwrap().was_lost());
    // A young lease's document goes by the follow-up delete.
    common::eventually("the release deleted the document", WAIT, || async {
        stored_bytes(&fx, key).await.is_none()
    })
    .await;
    assert_eq!(bare_lock(&fx, key).await, None, "the other client acquired");
    assert!(m.try_acquire(key).await.unwrap().is_none());
    bare_unlock(&fx, key).await;
    let lease = m.try_acquire(key).await.unwrap().expect("free again");
    assert!(!lease.release().await.unwrap().was_lost());
    shutdown(m).await;
}
