//! The queue of waiting owners on a real `mongod` ("Queue of waiting
//! owners" in the lock protocol): managers in several processes (each with
//! its own client) are handed the key in arrival order, in the releasing
//! write, with strictly increasing fencing tokens; a waiter whose process
//! died holds a handed key at most its registration's `hx`.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Fixture;
use mongo_lease::{LeaseManager, ReleaseOutcome};
use mongodb::bson::{Document, doc};

/// A hang guard only: each step takes milliseconds.
const LIMIT: Duration = Duration::from_secs(60);

/// The owner ids of the entries of `doc`'s queue, in order.
fn queued(doc: &Document) -> Vec<String> {
    doc.get_array("q")
        .map(|q| {
            q.iter()
                .filter_map(|e| e.as_document()?.get_str("aid").ok().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// Waits until the queue of `key` names `owners`, in order.
async fn queue_is(fx: &Fixture, key: &str, owners: &[&str]) {
    common::eventually(&format!("queue {owners:?}"), LIMIT, || async {
        queued(&fx.doc(key).await) == owners
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn managers_in_three_processes_are_handed_the_key_in_arrival_order() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("queue_order").await;
    let holder = fx.manager(TTL).await;
    let mut waiters: Vec<LeaseManager> = Vec::new();
    for _ in 0..3 {
        waiters.push(fx.manager(TTL).await);
    }
    let first = holder.acquire("k").await.unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    let mut arrived: Vec<String> = Vec::new();
    for manager in &waiters {
        let owner = manager.owner_id().to_string();
        let (manager, served) = (manager.clone(), served.clone());
        tasks.push(tokio::spawn(async move {
            let lease = manager.acquire("k").await.unwrap();
            served
                .lock()
                .unwrap()
                .push((manager.owner_id().to_string(), lease.fencing_token()));
            assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
        }));
        // Registered before the next one arrives.
        arrived.push(owner);
        let names: Vec<&str> = arrived.iter().map(String::as_str).collect();
        queue_is(&fx, "k", &names).await;
    }
    let first_token = first.fencing_token();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    for task in tasks {
        tokio::time::timeout(LIMIT, task)
            .await
            .expect("every waiter is served")
            .unwrap();
    }
    let served = served.lock().unwrap().clone();
    let order: Vec<String> = served.iter().map(|(owner, _)| owner.clone()).collect();
    assert_eq!(order, arrived, "served in arrival order");
    let mut previous = first_token;
    for (owner, token) in &served {
        assert!(*token > previous, "{owner}: token {token} after {previous}");
        previous = *token;
    }
    let doc = fx.doc("k").await;
    assert!(doc.get("lid").is_none() && doc.get("q").is_none(), "{doc}");
    holder.shutdown().await.unwrap();
    for manager in waiters {
        manager.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_process_died_holds_a_handed_key_at_most_its_registration() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("queue_dead").await;
    let holder = fx.manager(TTL).await;
    let first = holder.acquire("k").await.unwrap();
    // A process that registers as a waiter, then dies (its runtime dropped).
    let (db, collection) = (fx.db.name().to_owned(), fx.collection.clone());
    let dead = fx.crashed_process(TTL, async move |manager| {
        let owner = manager.owner_id().to_string();
        let waiting = {
            let manager = manager.clone();
            tokio::spawn(async move { manager.acquire("k").await })
        };
        let client = mongodb::Client::with_uri_str(common::uri())
            .await
            .expect("client");
        let raw = client.database(&db).collection::<Document>(&collection);
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            let doc = raw.find_one(doc! { "_id": "k" }).await.unwrap().unwrap();
            if queued(&doc) == [owner.as_str()] {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "never registered");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        std::mem::forget(waiting);
        std::mem::forget(manager);
        owner
    });
    let survivor = fx.manager(TTL).await;
    let next = {
        let survivor = survivor.clone();
        tokio::spawn(async move { survivor.acquire("k").await })
    };
    queue_is(&fx, "k", &[dead.as_str(), survivor.owner_id()]).await;

    // The release hands the key to the dead waiter, for its `hx` only:
    // the registration window (2 * retry_max + 1 s + safety margin = 6 s
    // by default), not its TTL.
    let first_token = first.fencing_token();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let handed = fx.doc("k").await;
    assert_eq!(handed.get_str("aid").unwrap(), dead);
    let ms = |doc: &Document, name: &str| doc.get_datetime(name).unwrap().timestamp_millis();
    let hx = ms(&handed, "exp") - ms(&handed, "ts");
    assert_eq!(hx, 6_000, "{handed}");
    assert!(handed.get_i64("tok").unwrap() as u64 > first_token);

    // The survivor, next in the queue, takes it once that expires.
    let lease = tokio::time::timeout(LIMIT, next)
        .await
        .expect("the next waiter is served")
        .unwrap()
        .unwrap();
    let taken = fx.doc("k").await;
    assert_eq!(taken.get_str("aid").unwrap(), survivor.owner_id());
    assert!(
        ms(&taken, "acq") >= ms(&handed, "exp"),
        "taken at {} (server time), before the handed lease expired at {}",
        ms(&taken, "acq"),
        ms(&handed, "exp")
    );
    assert!(lease.fencing_token() > handed.get_i64("tok").unwrap() as u64);
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    survivor.shutdown().await.unwrap();
}
