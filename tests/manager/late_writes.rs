//! Late writes ("Late writes" in `docs/protocol.md`, docs/safety.md "Late
//! writes and client-side timeouts"): a write of a lease that lands after
//! its manager gave up on it, and after later writes of the lease were
//! answered, is harmless, on a real `mongod` whose `failCommand` fail point
//! holds the write back (a replica set of its own, started with test
//! commands enabled) while a `FaultProxy` cuts its client off.

use crate::common;

use std::time::{Duration, SystemTime};

use common::{Clients, eventually, within};
use mongo_lease::testkit::{FaultProxy, ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LeaseEvent, LeaseManager, LeaseManagerOptions};
use mongodb::Database;
use mongodb::bson::{Document, doc};

/// A hang guard only: each wait below takes at most a few seconds.
const LIMIT: Duration = Duration::from_secs(60);
const HOLDER: &str = "late-holder";
/// The lease's TTL at first, and its heartbeat (the default, TTL / 3),
/// which bounds each renewal.
const TTL: Duration = Duration::from_secs(3);
/// How long the server holds the heartbeat's renewal back before it
/// applies it: longer than the heartbeat, after which the manager gave up
/// on it.
const HELD_BACK: Duration = Duration::from_millis(3500);
/// The TTL the holder sets meanwhile.
const LONGER_TTL: Duration = Duration::from_secs(30);

/// Sets the `failCommand` fail point on the member behind `admin`: the
/// holder's next `update` is held back [`HELD_BACK`], then applied. Returns
/// how many times the fail point had been entered before.
async fn held_back_update(admin: &Database) -> i64 {
    let data = doc! {
        "failCommands": ["update"],
        "appName": HOLDER,
        "blockConnection": true,
        "blockTimeMS": HELD_BACK.as_millis() as i64,
    };
    let answer = admin
        .run_command(
            doc! { "configureFailPoint": "failCommand", "mode": { "times": 1 }, "data": data },
        )
        .await
        .expect("the fail point");
    answer
        .get_i64("count")
        .or_else(|_| answer.get_i32("count").map(i64::from))
        .unwrap_or(0)
}

/// The holder's `update` commands running on the member behind `admin`.
async fn holders_updates(admin: &Database) -> Vec<Document> {
    use futures::TryStreamExt;
    admin
        .aggregate([
            doc! { "$currentOp": { "allUsers": true, "idleConnections": false } },
            doc! { "$match": { "appName": HOLDER, "command.update": { "$exists": true } } },
        ])
        .await
        .expect("$currentOp")
        .try_collect()
        .await
        .expect("$currentOp")
}

/// A heartbeat's renewal (TTL 3 s) is held back on the server; meanwhile
/// the holder sets a TTL of 30 s, which is confirmed, and its manager gives
/// up on the held-back renewal (it bounds each by the heartbeat interval).
/// The holder is then cut off from the server, as by a partition, and the
/// held-back renewal lands, 3.5 s after it was sent: the server's expiry
/// stays where the confirmed 30 s renewal put it, not before the holder's
/// local deadline (which would let another manager acquire the key while
/// the holder, told nothing, runs on for some 25 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_given_up_and_landing_after_a_longer_ttl_was_confirmed_cuts_no_expiry() {
    let rs = ReplicaSet::start(
        ReplicaSetOptions::default()
            .extra_arg("--setParameter")
            .extra_arg("enableTestCommands=1"),
    )
    .await
    .expect("a replica set with test commands");
    // The holder reaches the server through a proxy, which partitions it.
    let proxy = FaultProxy::start(([127, 0, 0, 1], rs.members()[0].port()).into())
        .await
        .unwrap();
    let clients = Clients::default();
    let direct = clients.connect(&rs.member_uri(0)).await;
    let admin = direct.database("admin");
    let client = clients
        .connect(&format!(
            "mongodb://{}/?directConnection=true&appName={HOLDER}",
            proxy.addr()
        ))
        .await;
    let holder = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(client.database("app"))
            .collection("late.locks")
            .ttl(TTL)
            .safety_margin(Duration::from_millis(500))
            .build(),
    )
    .await
    .expect("connect");
    let locks = direct.database("app").collection::<Document>("late.locks");

    let lease = holder.acquire("k").await.unwrap();
    let mut events = lease.status().events();
    // The holder's next `update`, the heartbeat's renewal, is held back.
    let entered = held_back_update(&admin).await;
    admin
        .run_command(doc! {
            "waitForFailPoint": "failCommand",
            "timesEntered": entered + 1,
            "maxTimeMS": LIMIT.as_millis() as i64,
        })
        .await
        .expect("the heartbeat's renewal held back");
    lease.set_ttl(LONGER_TTL).await.expect("the longer TTL set");
    within(
        LIMIT,
        "the manager gives up on the held-back renewal",
        async { while !matches!(events.recv().await, Some(LeaseEvent::AtRisk { .. })) {} },
    )
    .await;
    // Cut off by the proxy, not refused by a second `failCommand`: the
    // server's `configureFailPoint` waits until the held-back command has
    // left the first one, which would let it land before the refusal.
    proxy.blackhole();
    assert!(
        !holders_updates(&admin).await.is_empty(),
        "the held-back renewal landed before the holder was cut off: nothing judged"
    );
    eventually("the held-back renewal lands", LIMIT, || async {
        holders_updates(&admin).await.is_empty()
    })
    .await;

    let stored = locks.find_one(doc! { "_id": "k" }).await.unwrap().unwrap();
    let exp = stored.get_datetime("exp").unwrap().to_system_time();
    let deadline = lease.status().deadline().expect("held");
    let local_deadline =
        SystemTime::now() + deadline.saturating_duration_since(tokio::time::Instant::now());
    let from_now = |t: SystemTime| match t.duration_since(SystemTime::now()) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    };
    assert!(
        !lease.status().is_lost() && local_deadline <= exp,
        "the server's expiry is {:.2} s away and the holder's local deadline {:.2} s \
         (is_lost = {}): {stored}",
        from_now(exp),
        from_now(local_deadline),
        lease.status().is_lost()
    );

    proxy.heal();
    proxy.reset();
    drop(lease);
    holder.shutdown().await.unwrap();
}
