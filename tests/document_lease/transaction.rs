//! The transaction helper: writes committed only while the lease is held,
//! in-document leases fencing a transaction, snapshot reads and majority
//! commits, a clear error on a standalone server. The retries are in
//! `transaction_retry.rs`.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::FutureExt;
use mongo_lease::testkit::Standalone;
use mongo_lease::{Error, Lease, LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::bson::{Document, doc};
use mongodb::{Client, Collection};

use crate::common::{self, Fixture};
use crate::support::{LONG_TTL as TTL, items_count, seed_txn_items, stored_lid};

/// How long a lost lease's token may take to fire: it fires within
/// milliseconds (a change event or the helper's check); this only turns a
/// hang into a failure.
const LOST_WITHIN: Duration = Duration::from_secs(30);

/// The happy path: the callback's writes are committed, its value comes
/// back, and the lease stays held under its lease id; the check wrote
/// `ts` and left `exp` to the manager's renewals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_commits_the_callbacks_writes_while_the_lease_is_held() {
    let fx = Fixture::new("txn_ok").await;
    let manager = fx.manager(TTL).await;
    let items = seed_txn_items(&fx, doc! { "_id": 1, "n": 0 }).await;
    let lease = manager.acquire("job").await.unwrap();
    let lid = stored_lid(&fx, "job")
        .await
        .expect("a held lease has a lid");
    let before = fx.doc("job").await;
    let renewed_before = *before.get_datetime("ts").unwrap();

    let n = lease
        .with_transaction(&fx.client, &items, |session, items| {
            async move {
                items
                    .update_one(doc! { "_id": 1 }, doc! { "$inc": { "n": 1 } })
                    .session(&mut *session)
                    .await?;
                items
                    .insert_one(doc! { "_id": 2, "by": "job" })
                    .session(&mut *session)
                    .await?;
                let one = items
                    .find_one(doc! { "_id": 1 })
                    .session(&mut *session)
                    .await?
                    .expect("read in the transaction");
                Ok(one.get_i32("n").unwrap())
            }
            .boxed()
        })
        .await
        .expect("the transaction commits");

    assert_eq!(n, 1, "the callback reads its own write");
    assert_eq!(
        items.find_one(doc! { "_id": 1 }).await.unwrap().unwrap(),
        doc! { "_id": 1, "n": 1 }
    );
    assert_eq!(
        items.find_one(doc! { "_id": 2 }).await.unwrap().unwrap(),
        doc! { "_id": 2, "by": "job" }
    );
    assert!(!lease.status().is_lost());
    let lock = fx.doc("job").await;
    assert_eq!(lock.get("lid"), Some(&lid), "the same acquisition holds it");
    let renewed = *lock.get_datetime("ts").unwrap();
    let expires = *lock.get_datetime("exp").unwrap();
    assert!(
        renewed >= renewed_before,
        "the check wrote ts: {renewed} < {renewed_before}"
    );
    assert_eq!(
        &expires,
        before.get_datetime("exp").unwrap(),
        "the check leaves exp alone (no heartbeat within the long TTL's first third)"
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// A lease expired by the server's clock (a driver write moves `exp` into
/// the past; the holder's manager has not noticed: no heartbeat in this
/// test, and moving `exp` is no write its change stream reports) cannot
/// commit: the check matches nothing, the transaction is aborted and none
/// of the callback's writes is visible. The manager then checks the lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_lease_cannot_commit_and_its_writes_are_not_visible() {
    let fx = Fixture::new("txn_expired").await;
    let manager = fx.manager(TTL).await;
    let items = fx.db.collection::<Document>("items");
    let lease = manager.acquire("job").await.unwrap();
    fx.expire("job").await;
    let expired = *fx.doc("job").await.get_datetime("exp").unwrap();
    assert!(!lease.status().is_lost(), "the manager has not noticed yet");

    let runs = AtomicU32::new(0);
    let result = lease
        .with_transaction(&fx.client, (&items, &runs), |session, (items, runs)| {
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                items
                    .insert_one(doc! { "_id": "late", "by": "expired holder" })
                    .session(&mut *session)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await;

    assert!(
        matches!(&result, Err(Error::LeaseLost { key }) if *key == "job"),
        "{result:?}"
    );
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "no retry after a lost lease"
    );
    assert_eq!(
        items.count_documents(doc! {}).await.unwrap(),
        0,
        "the aborted transaction's write is not visible"
    );
    // The manager checks the lease at once, by a renewal under its lease
    // id: nobody took it, so the renewal succeeds and the lease stays held.
    common::eventually(
        "the manager's check renews the lease",
        LOST_WITHIN,
        || async { fx.doc("job").await.get_datetime("exp").unwrap() > &expired },
    )
    .await;
    assert!(
        !lease.status().is_lost(),
        "an expired lease nobody took is renewed"
    );
    drop(lease);
    manager.shutdown().await.unwrap();
}

/// Another manager takes the lease over while the holder's transaction
/// runs (after the transaction's first write, before its check): the
/// holder cannot commit, none of its writes is visible, the new holder's
/// lease is untouched, and the old holder's token fires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_whose_lease_is_taken_over_during_the_transaction_cannot_commit() {
    let fx = Fixture::new("txn_takeover").await;
    let holder = fx.manager(TTL).await;
    let usurper = fx.manager(TTL).await;
    let items = fx.db.collection::<Document>("items");
    let lease = holder.acquire("job").await.unwrap();

    let runs = AtomicU32::new(0);
    let taken = tokio::sync::Mutex::new(None);
    let result = lease
        .with_transaction(
            &fx.client,
            (&items, &runs, &taken, &fx, &usurper),
            |session, (items, runs, taken, fx, usurper)| {
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    items
                        .insert_one(doc! { "_id": "stale", "by": "old holder" })
                        .session(&mut *session)
                        .await?;
                    let mut taken = taken.lock().await;
                    if taken.is_none() {
                        // The takeover, outside the transaction: the lease
                        // expires, and another manager acquires it.
                        *taken = Some(fx.take_over("job", usurper).await);
                    }
                    Ok(())
                }
                .boxed()
            },
        )
        .await;

    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert!(runs.load(Ordering::SeqCst) >= 1);
    assert_eq!(
        items.count_documents(doc! {}).await.unwrap(),
        0,
        "the old holder's write is not visible"
    );
    let new_lease = taken.into_inner().expect("the takeover happened");
    let lock = fx.doc("job").await;
    assert_eq!(lock.get_str("aid").unwrap(), new_lease.owner_id());
    assert_eq!(
        lock.get_i64("tok").unwrap() as u64,
        new_lease.fencing_token()
    );
    assert!(new_lease.fencing_token() > lease.fencing_token());
    tokio::time::timeout(LOST_WITHIN, lease.status().lost())
        .await
        .expect("the old holder's token fires");
    // The new holder can commit.
    new_lease
        .with_transaction(&fx.client, &items, |session, items| {
            async move {
                items
                    .insert_one(doc! { "_id": "fresh", "by": "new holder" })
                    .session(session)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await
        .expect("the new holder commits");
    assert_eq!(items.count_documents(doc! {}).await.unwrap(), 1);
    assert_eq!(new_lease.release().await.unwrap(), ReleaseOutcome::Released);
    drop(lease);
    usurper.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

/// A standalone server has no transactions: `Error::Unsupported` with the
/// server's reason (the callback's first command fails), and nothing is
/// written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standalone_server_gives_unsupported() {
    let server = Standalone::start().await.expect("a standalone mongod");
    // Declared after the server: shut down before it is stopped.
    let clients = common::Clients::default();
    let client = clients.connect(&server.uri()).await;
    let manager = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(client.database("app"))
            .collection("workitem.lock")
            .ttl(TTL)
            .clock_skew(crate::common::clock_skew(TTL))
            .build(),
    )
    .await
    .expect("a manager on a standalone server");
    let items = client.database("app").collection::<Document>("items");
    let lease = manager.acquire("job").await.unwrap();

    let runs = AtomicU32::new(0);
    let result = lease
        .with_transaction(&client, (&items, &runs), |session, (items, runs)| {
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                items
                    .insert_one(doc! { "_id": 1 })
                    .session(&mut *session)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await;

    match result {
        Err(Error::Unsupported { reason }) => assert!(
            reason.contains("Transaction numbers are only allowed on a replica set member"),
            "{reason}"
        ),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    assert!(runs.load(Ordering::SeqCst) <= 1, "not retried");
    assert_eq!(items.count_documents(doc! {}).await.unwrap(), 0);
    assert!(!lease.status().is_lost());
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// Under `lease`, in one transaction: sets the state of the work item
/// `item-1` to `state` and inserts the audit entry `audit_id` (its event
/// the state).
async fn set_state_audited(
    lease: &Lease,
    client: &Client,
    workitems: &Collection<Document>,
    audit: &Collection<Document>,
    state: &'static str,
    audit_id: &'static str,
) -> mongo_lease::Result<()> {
    lease
        .with_transaction(client, (workitems, audit), |session, (workitems, audit)| {
            async move {
                workitems
                    .update_one(
                        doc! { "_id": "item-1" },
                        doc! { "$set": { "state": state } },
                    )
                    .session(&mut *session)
                    .await?;
                audit
                    .insert_one(doc! { "_id": audit_id, "event": state })
                    .session(&mut *session)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await
}

/// An in-document lease fences a transaction the same way, by its lock
/// field: the transaction commits while the lease is held (and renews the
/// lock field, leaving the user's fields to the callback), and is refused
/// once the lease expired by the server's clock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_document_lease_fences_a_transaction_by_its_lock_field() {
    let fx = Fixture::new("txn_doc").await;
    let manager = fx.manager(TTL).await;
    let workitems = fx.db.collection::<Document>("workitem");
    let audit = fx.db.collection::<Document>("audit");
    let leases = manager.documents::<Document>("workitem").await.unwrap();
    let item = leases
        .acquire("item-1")
        .create(doc! { "state": "new" })
        .await
        .unwrap();
    let lock_before = workitems
        .find_one(doc! { "_id": "item-1" })
        .await
        .unwrap()
        .unwrap()
        .get_document("_lease")
        .unwrap()
        .clone();

    set_state_audited(
        item.lease(),
        &fx.client,
        &workitems,
        &audit,
        "seen",
        "item-1",
    )
    .await
    .expect("the transaction commits under the in-document lease");
    let stored = workitems
        .find_one(doc! { "_id": "item-1" })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(stored.get_str("state").unwrap(), "seen");
    let lock = stored.get_document("_lease").unwrap();
    for name in ["lid", "aid", "tok", "acq"] {
        assert_eq!(lock.get(name), lock_before.get(name), "{name} unchanged");
    }
    assert!(lock.get_datetime("ts").unwrap() >= lock_before.get_datetime("ts").unwrap());
    assert_eq!(audit.count_documents(doc! {}).await.unwrap(), 1);

    // The lease expires by the server's clock (its holder has not noticed).
    workitems
        .update_one(
            doc! { "_id": "item-1" },
            doc! { "$set": { "_lease.exp": mongodb::bson::DateTime::from_millis(0) } },
        )
        .await
        .unwrap();
    let result = set_state_audited(
        item.lease(),
        &fx.client,
        &workitems,
        &audit,
        "late",
        "item-1-late",
    )
    .await;
    assert!(matches!(result, Err(Error::LeaseLost { .. })), "{result:?}");
    assert_eq!(
        workitems
            .find_one(doc! { "_id": "item-1" })
            .await
            .unwrap()
            .unwrap()
            .get_str("state")
            .unwrap(),
        "seen",
        "the refused transaction's write is not visible"
    );
    assert_eq!(audit.count_documents(doc! {}).await.unwrap(), 1);
    assert_eq!(item.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// What the helper sends, seen by the client's command monitor: the
/// callback's first command starts the transaction with read concern
/// `snapshot`; the lease check is an `update` of the lock document in the
/// same transaction, filtered on its lease id and `exp > $$NOW`; the commit
/// asks for write concern `majority`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_reads_a_snapshot_checks_the_lock_and_commits_with_majority() {
    use mongodb::event::{EventHandler, command::CommandEvent};
    let fx = Fixture::new("txn_cmds").await;
    let manager = fx.manager(TTL).await;
    let lease = manager.acquire("job").await.unwrap();
    let lid = stored_lid(&fx, "job").await.unwrap();
    let sent = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(String, Document)>::new()));
    let mut options = mongodb::options::ClientOptions::parse(common::uri())
        .await
        .unwrap();
    let sink = sent.clone();
    options.command_event_handler = Some(EventHandler::callback(move |event| {
        if let CommandEvent::Started(started) = event {
            sink.lock()
                .unwrap()
                .push((started.command_name, started.command));
        }
    }));
    let client = mongodb::Client::with_options(options).unwrap();
    let items = client
        .database(fx.db.name())
        .collection::<Document>("items");

    lease
        .with_transaction(&client, &items, |session, items| {
            async move {
                items.find_one(doc! {}).session(&mut *session).await?;
                items
                    .insert_one(doc! { "_id": 1 })
                    .session(&mut *session)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await
        .unwrap();
    let sent = sent.lock().unwrap().clone();
    client.shutdown().await;

    let names: Vec<&str> = sent.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(
        names,
        ["find", "insert", "update", "commitTransaction"],
        "{sent:?}"
    );
    let first = &sent[0].1;
    assert_eq!(first.get_bool("startTransaction"), Ok(true), "{first}");
    assert_eq!(
        first.get_document("readConcern").unwrap().get_str("level"),
        Ok("snapshot")
    );
    let txn = first
        .get("txnNumber")
        .cloned()
        .expect("a transaction number");
    let check = &sent[2].1;
    assert_eq!(check.get_str("update"), Ok("workitem.lock"));
    assert_eq!(
        check.get("txnNumber"),
        Some(&txn),
        "in the same transaction"
    );
    assert_eq!(check.get_bool("autocommit"), Ok(false));
    let statement = &check.get_array("updates").unwrap()[0];
    let filter = statement.as_document().unwrap().get_document("q").unwrap();
    // The lease as an exclusive one (`lid` at the top) or as a holder of a
    // shared or semaphore key (an entry of `hs`).
    let exclusive = filter.get_array("$or").unwrap()[0].as_document().unwrap();
    assert_eq!(exclusive.get("lid"), Some(&lid));
    assert_eq!(
        filter
            .get_document("$expr")
            .unwrap()
            .get_array("$or")
            .unwrap()[0],
        mongodb::bson::Bson::from(doc! { "$and": [
            { "$eq": ["$lid", lid.clone()] },
            { "$gt": ["$exp", "$$NOW"] },
        ]})
    );
    let commit = &sent[3].1;
    assert_eq!(commit.get("txnNumber"), Some(&txn));
    assert_eq!(
        commit.get_document("writeConcern").unwrap().get_str("w"),
        Ok("majority")
    );
    assert_eq!(items_count(&fx).await, 1);
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// The callback of the kinds' transactions: one increment.
fn increment<'s>(
    session: &'s mut mongodb::ClientSession,
    items: &'s mut Collection<Document>,
) -> futures::future::BoxFuture<'s, mongodb::error::Result<()>> {
    async move {
        items
            .update_one(doc! { "_id": 1 }, doc! { "$inc": { "n": 1 } })
            .session(session)
            .await?;
        Ok(())
    }
    .boxed()
}

/// A permit of a semaphore key fences a transaction as an exclusive lease
/// does (the check finds and renews its entry of `hs`), and the check of a
/// lease held at least never moves `exp` below its minimum hold (`hl`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_and_a_lease_held_at_least_fence_a_transaction() {
    let fx = Fixture::new("txn_kinds").await;
    let manager = fx.manager(TTL).await;
    let items = seed_txn_items(&fx, doc! { "_id": 1, "n": 0 }).await;
    let pool = mongo_lease::Semaphore::new(&manager, "pool", 2).unwrap();
    let lease = pool.acquire().await.unwrap();
    let other = pool.acquire().await.unwrap();
    lease
        .with_transaction(&fx.client, items.clone(), increment)
        .await
        .expect("a permit's transaction commits");
    assert!(!lease.status().is_lost() && !other.status().is_lost());
    assert!(manager.force_release("pool").await.unwrap().is_some());
    let released = lease
        .with_transaction(&fx.client, items.clone(), increment)
        .await;
    assert!(
        matches!(released, Err(Error::LeaseLost { .. })),
        "after a force release: {released:?}"
    );

    let at_least = Duration::from_secs(3600);
    let job = manager
        .acquire("job")
        .hold_at_least(at_least)
        .await
        .unwrap();
    job.with_transaction(&fx.client, items.clone(), increment)
        .await
        .expect("the transaction commits");
    let lock = fx.doc("job").await;
    let (hl, exp) = (
        lock.get_datetime("hl").unwrap(),
        lock.get_datetime("exp").unwrap(),
    );
    assert_eq!(exp, hl, "the check keeps exp at hl, not ts + ttl");
    assert_eq!(
        items.find_one(doc! { "_id": 1 }).await.unwrap().unwrap(),
        doc! { "_id": 1, "n": 2 }
    );
    drop((lease, other, job));
    manager.shutdown().await.unwrap();
}
