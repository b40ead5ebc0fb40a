//! Mutual exclusion and fair waiting under contention, against a real mongod.

use crate::common;

use std::collections::HashMap;
use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Fixture;
use mongo_lease::ReleaseOutcome;
use mongodb::bson::{Document, doc};
use tokio_util::time::FutureExt as _;

const TTL: Duration = Duration::from_secs(10);
/// A hang guard on the contention test's tasks: 25x the 4.8 s the whole
/// test takes here.
const CONTENTION_BOUND: Duration = Duration::from_secs(120);

/// Several managers with separate clients (as separate processes), several tasks
/// each, few keys. Inside each critical section: an in-process check that no one
/// else holds the key, and a fenced read-modify-write of a counter in MongoDB
/// that refuses a token lower than one already written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_one_holder_per_key_and_no_fenced_write_refused() {
    const MANAGERS: usize = 4;
    const TASKS: usize = 4;
    const ROUNDS: usize = 12;
    const KEYS: [&str; 3] = ["a", "b", "c"];
    let fx = Fixture::new("exclusion").await;
    let counters = fx.db.collection::<Document>("workitem");
    let holders: Arc<Mutex<HashMap<String, (String, u64)>>> = Arc::default();
    let managers = fx.managers(MANAGERS, TTL).await;
    let mut tasks = Vec::new();
    for (m, manager) in managers.iter().enumerate() {
        for t in 0..TASKS {
            let (manager, holders, counters) = (manager.clone(), holders.clone(), counters.clone());
            tasks.push(tokio::spawn(async move {
                for round in 0..ROUNDS {
                    let key = KEYS[(m + t + round) % KEYS.len()];
                    let lease = manager.acquire(key).await.unwrap();
                    let me = format!("{}/{t}", manager.owner_id());
                    if let Some(other) = holders.lock().unwrap().insert(key.into(), (me.clone(), lease.fencing_token())) {
                        panic!("{me} acquired {key} while {other:?} held it");
                    }
                    // Read-modify-write of the protected counter, fenced by the token.
                    let current = counters.find_one(doc! { "_id": key }).await.unwrap();
                    let n = current.as_ref().and_then(|d| d.get_i64("n").ok()).unwrap_or(0);
                    tokio::task::yield_now().await;
                    let token = lease.fencing_token() as i64;
                    let written = counters
                        .update_one(
                            doc! { "_id": key, "$or": [{ "fence": { "$lt": token } }, { "fence": { "$exists": false } }] },
                            doc! { "$set": { "n": n + 1, "fence": token } },
                        )
                        .upsert(current.is_none())
                        .await
                        .unwrap();
                    assert!(written.matched_count == 1 || written.upserted_id.is_some(), "fenced write refused for {me} on {key}");
                    assert_eq!(holders.lock().unwrap().remove(key).map(|h| h.0), Some(me));
                    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
                }
            }));
        }
    }
    // A hang guard only: the 192 critical sections take under 5 s here (the
    // whole test: 4.8 s).
    common::within(CONTENTION_BOUND, "every task's rounds", async {
        for task in tasks {
            task.await.unwrap();
        }
    })
    .await;
    let mut total = 0;
    for key in KEYS {
        let doc = counters.find_one(doc! { "_id": key }).await.unwrap();
        total += doc.map(|d| d.get_i64("n").unwrap()).unwrap_or(0);
    }
    assert_eq!(total as usize, MANAGERS * TASKS * ROUNDS, "no lost update");
    for manager in managers {
        manager.shutdown().await.unwrap();
    }
}

/// Local waiters are served first in, first out, one at a time.
#[tokio::test]
async fn local_waiters_are_served_in_fifo_order() {
    let fx = Fixture::new("fifo").await;
    let manager = fx.manager(TTL).await;
    let holder = manager.acquire("k").await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut waiters = Vec::new();
    for i in 0..5 {
        let (manager, order) = (manager.clone(), order.clone());
        let (queued_tx, queued_rx) = tokio::sync::oneshot::channel::<()>();
        waiters.push(tokio::spawn(async move {
            let acquire = manager.acquire("k").into_future();
            tokio::pin!(acquire);
            // The first poll sends the request; then report that we are queued.
            assert!(futures::poll!(&mut acquire).is_pending());
            queued_tx.send(()).unwrap();
            let lease = acquire.await.unwrap();
            order.lock().unwrap().push(i);
            assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
        }));
        queued_rx.await.unwrap();
    }
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    // A hang guard only: each local handoff takes one write (milliseconds).
    for w in waiters {
        tokio::time::timeout(Duration::from_secs(60), w)
            .await
            .expect("a local waiter was never served")
            .unwrap();
    }
    assert_eq!(*order.lock().unwrap(), vec![0, 1, 2, 3, 4]);
    manager.shutdown().await.unwrap();
}

/// A dropped acquire leaves the queue; it never acquires (or leaks) the key later.
#[tokio::test]
async fn a_cancelled_acquire_never_takes_the_key() {
    let fx = Fixture::new("cancel").await;
    let a = fx.manager(TTL).await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let b = mongo_lease::LeaseManager::connect(options).await.unwrap();
    let holder = a.acquire("k").await.unwrap();
    assert!(
        b.acquire("k")
            .into_future()
            .timeout(Duration::from_millis(200))
            .await
            .ok()
            .transpose()
            .unwrap()
            .is_none()
    );
    // The timed-out acquire's last attempt may still be in flight: wait until
    // every attempt sent so far came back, so that the next reply counted is
    // the new acquire's own.
    let mut attempts = 0;
    common::eventually(
        "b's earlier attempts came back",
        Duration::from_secs(20),
        || {
            let all = log.all();
            let sent = all.iter().filter(|(n, _)| n == "findAndModify").count();
            let back = all.iter().filter(|(n, _)| n == "ok:findAndModify").count();
            attempts = back;
            async move { sent == back }
        },
    )
    .await;
    // Cancel by select! as well, once the acquire has tried the key.
    tokio::select! {
        _ = b.acquire("k") => panic!("held by a"),
        _ = common::eventually("b's attempt", Duration::from_secs(20), || {
            let tried = log.count("ok:findAndModify") > attempts;
            async move { tried }
        }) => {}
    }
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    // A third manager gets it: b, whose waiters are gone, did not take it.
    let c = fx.manager(TTL).await;
    let lease = c
        .acquire("k")
        .into_future()
        .timeout(Duration::from_secs(5))
        .await
        .ok()
        .transpose()
        .unwrap()
        .expect("free for c");
    let doc = fx.doc("k").await;
    assert_eq!(doc.get_str("aid").unwrap(), c.owner_id());
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    for m in [a, b, c] {
        m.shutdown().await.unwrap();
    }
}
