//! A transaction whose lease is lost right after it commits leaves the key
//! free at the lease's own expiry: the check proves the lease without
//! renewing it. On a replica set of its own, started with test commands:
//! `failCommand` fails every write of the holder's manager (its renewals
//! and its release after the deadline), and nothing else.

use std::time::Duration;

use futures::FutureExt;
use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::bson::{Document, doc};

use crate::common;

const TTL: Duration = Duration::from_secs(4);
const HEARTBEAT: Duration = Duration::from_secs(1);
const MARGIN: Duration = Duration::from_secs(1);
/// The waiting owner's longest delay between two attempts (the default).
const RETRY_MAX: Duration = mongo_lease::DEFAULT_RETRY_MAX;
/// Hang guard of every wait: 10x the TTL, which each wait is shorter than.
const HANG: Duration = Duration::from_secs(40);

async fn manager(client: mongodb::Client) -> LeaseManager {
    LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(client.database("txn_lost"))
            .collection("job.lock")
            .ttl(TTL)
            .clock_skew(crate::common::clock_skew(TTL))
            .heartbeat_interval(HEARTBEAT)
            .safety_margin(MARGIN)
            .build(),
    )
    .await
    .unwrap()
}

/// The holder's renewals fail from its acquisition on; one second before
/// its local deadline it runs a transaction, which commits; then its token
/// fires at the deadline and its release fails too. Another owner waiting
/// from then gets the key within `retry_max` of the lease's expiry as the
/// acquisition wrote it (by the server's clock). A check that renewed the
/// lease by a TTL would have kept the key blocked until 4 s after the
/// check, 2 s after that expiry, with nobody using it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_right_before_the_lease_is_lost_does_not_keep_the_key_blocked() {
    let rs = ReplicaSet::start(
        ReplicaSetOptions::default()
            .extra_arg("--setParameter")
            .extra_arg("enableTestCommands=1"),
    )
    .await
    .expect("a replica set with test commands");
    let clients = common::Clients::default();
    let user = clients.connect(&rs.uri()).await;
    let holder = manager(
        clients
            .connect(&format!("{}&appName=holder", rs.uri()))
            .await,
    )
    .await;
    let waiter = manager(clients.connect(&rs.uri()).await).await;
    let locks = user.database("txn_lost").collection::<Document>("job.lock");
    let items = user.database("txn_lost").collection::<Document>("items");
    items.insert_one(doc! { "_id": 0 }).await.unwrap();

    let lease = holder.acquire("job").await.unwrap();
    let deadline = lease.status().deadline().expect("held");
    let admin = user.database("admin");
    admin
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": "alwaysOn",
            "data": {
                "failCommands": ["update", "findAndModify", "delete"],
                "appName": "holder",
                "errorCode": 2,
            },
        })
        .await
        .expect("the fail point");
    // The lease's expiry on the server, as its acquisition wrote it: no
    // renewal reaches the server from now on.
    let expires = *locks
        .find_one(doc! { "_id": "job" })
        .await
        .unwrap()
        .unwrap()
        .get_datetime("exp")
        .unwrap();

    // Late in the lease's validity, the scenario's own moment (not a
    // synchronisation): the transaction commits while the lease is held.
    tokio::time::sleep_until(deadline - HEARTBEAT).await;
    assert!(!lease.status().is_lost(), "lost before its local deadline");
    lease
        .with_transaction(&user, &items, |session, items| {
            async move {
                items
                    .update_one(doc! { "_id": 0 }, doc! { "$set": { "paid": true } })
                    .session(session)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await
        .expect("the transaction commits while the lease is held");
    assert_eq!(
        items.find_one(doc! { "_id": 0 }).await.unwrap().unwrap(),
        doc! { "_id": 0, "paid": true }
    );

    tokio::time::timeout(HANG, lease.status().lost())
        .await
        .expect("the token fires at the local deadline");
    let taken = tokio::time::timeout(HANG, waiter.acquire("job"))
        .await
        .expect("the other owner never got the key")
        .unwrap();
    let acquired = *locks
        .find_one(doc! { "_id": "job" })
        .await
        .unwrap()
        .unwrap()
        .get_datetime("acq")
        .unwrap();
    // A waiter retries about when the lease expires (its delay is capped by
    // the remaining time, + up to 10 ms), and never waits longer than
    // `retry_max` (1 s) between attempts: more than 10x that jitter and a
    // round trip, and half the 2 s a renewing check would add.
    let late = acquired.timestamp_millis() - expires.timestamp_millis();
    eprintln!("taken {late} ms after the lease's expiry as acquired");
    assert!(
        late <= RETRY_MAX.as_millis() as i64,
        "the key was blocked {late} ms past the lease's expiry ({expires}): \
         the transaction's check renewed it"
    );

    admin
        .run_command(doc! { "configureFailPoint": "failCommand", "mode": "off" })
        .await
        .unwrap();
    assert_eq!(taken.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}
