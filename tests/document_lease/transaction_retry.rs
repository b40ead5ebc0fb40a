//! The transaction helper's retries: write conflicts (on the user's
//! document, or on the lock document renewed while the callback runs) run
//! the whole transaction again; commit errors provoked with `failCommand`
//! are retried as the driver documents, each write committed once.

use std::sync::atomic::{AtomicU32, Ordering};

use futures::FutureExt;
use mongo_lease::{LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::bson::{Document, doc};
use mongodb::error::TRANSIENT_TRANSACTION_ERROR;

use crate::common::{self, Fixture};
use crate::support::{LONG_TTL as TTL, seed_txn_items, stored_lid};

/// A write conflict on the user's own document (another client's write,
/// committed after the transaction's snapshot, to a document the
/// transaction then writes) is a `TransientTransactionError`: the whole
/// transaction runs again, and commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn write_conflict_on_the_users_document_is_retried_and_commits() {
    let fx = Fixture::new("txn_conflict").await;
    let manager = fx.manager(TTL).await;
    let items = seed_txn_items(&fx, doc! { "_id": 1, "n": 0, "outside": 0 }).await;
    let lease = manager.acquire("job").await.unwrap();

    let runs = AtomicU32::new(0);
    let first_error = std::sync::Mutex::new(None::<mongodb::error::Error>);
    let result = lease
        .with_transaction(
            &fx.client,
            (&items, &runs, &first_error),
            |session, (items, runs, first_error)| {
                async move {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    // The transaction's snapshot.
                    items
                        .find_one(doc! { "_id": 1 })
                        .session(&mut *session)
                        .await?;
                    if run == 1 {
                        // Another client's write, committed after the snapshot.
                        items
                            .update_one(doc! { "_id": 1 }, doc! { "$inc": { "outside": 1 } })
                            .await
                            .expect("the outside write");
                    }
                    let written = items
                        .update_one(doc! { "_id": 1 }, doc! { "$inc": { "n": 1 } })
                        .session(&mut *session)
                        .await;
                    if let Err(error) = &written {
                        first_error.lock().unwrap().get_or_insert(error.clone());
                    }
                    written?;
                    Ok(run)
                }
                .boxed()
            },
        )
        .await;

    assert_eq!(result.expect("committed after a retry"), 2);
    let error = first_error
        .into_inner()
        .unwrap()
        .expect("the first run conflicted");
    assert!(
        error.contains_label(TRANSIENT_TRANSACTION_ERROR),
        "a write conflict is a transient transaction error: {error}"
    );
    assert_eq!(
        items.find_one(doc! { "_id": 1 }).await.unwrap().unwrap(),
        doc! { "_id": 1, "n": 1, "outside": 1 },
        "the committed run's write, once, and the outside write"
    );
    assert!(!lease.status().is_lost());
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// A renewal of the lease (here played by a driver write doing what the
/// heartbeat does) that lands while the callback runs makes the check
/// conflict: the transaction runs again and commits, and the lease stays
/// held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_during_the_callback_makes_the_check_conflict_and_the_transaction_retry() {
    let fx = Fixture::new("txn_renewal").await;
    let manager = fx.manager(TTL).await;
    let items = fx.db.collection::<Document>("items");
    let lease = manager.acquire("job").await.unwrap();
    let lid = stored_lid(&fx, "job").await.unwrap();

    let runs = AtomicU32::new(0);
    let result = lease
        .with_transaction(
            &fx.client,
            (&items, &runs, &fx, &lid),
            |session, (items, runs, fx, lid)| {
                async move {
                    let run = runs.fetch_add(1, Ordering::SeqCst) + 1;
                    items
                        .insert_one(doc! { "_id": run, "run": run })
                        .session(&mut *session)
                        .await?;
                    if run == 1 {
                        // The heartbeat's renewal, committed after the
                        // transaction's snapshot.
                        let renewed = fx
                            .raw()
                            .update_one(
                                doc! { "_id": "job", "lid": (*lid).clone() },
                                vec![doc! { "$set": {
                                    "ts": "$$NOW",
                                    "exp": { "$add": ["$$NOW", TTL.as_millis() as i64] },
                                } }],
                            )
                            .await
                            .expect("the renewal");
                        assert_eq!(renewed.matched_count, 1);
                    }
                    Ok(run)
                }
                .boxed()
            },
        )
        .await;

    assert_eq!(result.expect("committed after a retry"), 2);
    assert_eq!(
        items.count_documents(doc! {}).await.unwrap(),
        1,
        "only the committed run's write is visible"
    );
    assert_eq!(
        items.find_one(doc! {}).await.unwrap().unwrap(),
        doc! { "_id": 2, "run": 2 }
    );
    assert!(!lease.status().is_lost());
    assert_eq!(fx.doc("job").await.get("lid"), Some(&lid));
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// The commit's own retries, provoked by the server's `failCommand` fail
/// point (on a replica set of its own, started with test commands
/// enabled): a commit that fails with a retryable error (89,
/// NetworkTimeout) twice carries `UnknownTransactionCommitResult` and
/// is sent again, without running the callback again; a commit that fails
/// with the `TransientTransactionError` label runs the whole transaction
/// again. Each time the callback's write is committed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commit_errors_are_retried_as_the_driver_documents() {
    use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
    use mongodb::event::{EventHandler, command::CommandEvent};
    let rs = ReplicaSet::start(
        ReplicaSetOptions::default()
            .extra_arg("--setParameter")
            .extra_arg("enableTestCommands=1"),
    )
    .await
    .expect("a replica set with test commands");
    let commits = std::sync::Arc::new(AtomicU32::new(0));
    let mut options = mongodb::options::ClientOptions::parse(rs.uri())
        .await
        .unwrap();
    let sink = commits.clone();
    options.command_event_handler = Some(EventHandler::callback(move |event| {
        if let CommandEvent::Started(started) = event {
            if started.command_name == "commitTransaction" {
                sink.fetch_add(1, Ordering::SeqCst);
            }
        }
    }));
    let client = mongodb::Client::with_options(options).unwrap();
    let manager_client = mongodb::Client::with_uri_str(rs.uri()).await.unwrap();
    let manager = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(manager_client.database("app"))
            .collection("workitem.lock")
            .ttl(TTL)
            .clock_skew(crate::common::clock_skew(TTL))
            .build(),
    )
    .await
    .unwrap();
    let items = client.database("app").collection::<Document>("items");
    let lease = manager.acquire("job").await.unwrap();
    let admin = client.database("admin");

    // Unknown commit result: the driver sends the commit twice (its own
    // retry of a retryable error), both fail; the helper sends it again.
    admin
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 2 },
            "data": { "failCommands": ["commitTransaction"], "errorCode": 89 },
        })
        .await
        .expect("the fail point");
    let runs = AtomicU32::new(0);
    insert_in_transaction(&lease, &client, &items, 1, &runs)
        .await
        .expect("committed by the third commit");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the callback ran once");
    assert_eq!(commits.load(Ordering::SeqCst), 3);

    // A transient error on the commit: the whole transaction runs again.
    commits.store(0, Ordering::SeqCst);
    admin
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": {
                "failCommands": ["commitTransaction"],
                "errorCode": 112,
                "errorLabels": ["TransientTransactionError"],
            },
        })
        .await
        .expect("the fail point");
    let runs = AtomicU32::new(0);
    insert_in_transaction(&lease, &client, &items, 2, &runs)
        .await
        .expect("committed by the second run");
    assert_eq!(runs.load(Ordering::SeqCst), 2, "the callback ran again");
    assert_eq!(commits.load(Ordering::SeqCst), 2);

    let mut ids: Vec<i32> = Vec::new();
    let mut cursor = items.find(doc! {}).await.unwrap();
    while cursor.advance().await.unwrap() {
        ids.push(cursor.current().get_i32("_id").unwrap());
    }
    ids.sort();
    assert_eq!(ids, [1, 2], "each committed once");
    assert!(!lease.status().is_lost());
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
    common::shut_down(vec![client, manager_client]);
}

/// Inserts `{_id: id}` into `items` in a transaction fenced by `lease`,
/// counting the callback's runs in `runs`.
async fn insert_in_transaction(
    lease: &mongo_lease::Lease,
    client: &mongodb::Client,
    items: &mongodb::Collection<Document>,
    id: i32,
    runs: &AtomicU32,
) -> mongo_lease::Result<()> {
    lease
        .with_transaction(client, (items, runs), move |session, (items, runs)| {
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                items
                    .insert_one(doc! { "_id": id })
                    .session(&mut *session)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await
}
