//! The members' clock skew (`LeaseManagerOptions::clock_skew`, docs/safety.md
//! "Assumptions"), on a real replica set whose members' clocks differ (an
//! `LD_PRELOAD` shim shifts one member's wall clock, `$$NOW` included): a
//! failover to a member whose clock is ahead expires every lease that much
//! sooner in real time, before its holder hears of anything, so every local
//! deadline keeps the clock skew short of the expiry besides the safety
//! margin.

use crate::common;

use std::time::Duration;

use common::clock::{ClockOffset, until_server_offset};
use common::{Clients, within};
use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LeaseEvent, LeaseManager, LeaseManagerOptions};
use mongodb::bson::doc;

/// A hang guard only: each wait below takes at most a few seconds.
const LIMIT: Duration = Duration::from_secs(60);
/// The member whose clock runs ahead, and by how much: inside the 1 s the
/// default `clock_skew` allows.
const AHEAD: usize = 1;
const AHEAD_MS: i64 = 800;
/// A lease of a few seconds, long enough that the failover (under half a
/// second here) ends well before it expires, with a safety margin shorter
/// than the clock difference (the default's for a 3 s TTL) and a heartbeat
/// that renews it soon after it is acquired.
const TTL: Duration = Duration::from_secs(5);
const SAFETY_MARGIN: Duration = Duration::from_millis(300);
const HEARTBEAT: Duration = Duration::from_millis(500);

/// A manager of owner id `name` whose client carries `name` as its app
/// name, so that a fail point can refuse its commands alone.
async fn manager(clients: &Clients, rs: &ReplicaSet, name: &str) -> LeaseManager {
    let mut options = mongodb::options::ClientOptions::parse(rs.uri())
        .await
        .unwrap();
    options.app_name = Some(name.to_string());
    // Finds the new primary soon after the failover (its shutdown too).
    options.heartbeat_freq = Some(Duration::from_millis(500));
    let client = clients.add(mongodb::Client::with_options(options).unwrap());
    LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(client.database("app"))
            .collection("skew.locks")
            .owner_id(name.to_string())
            .ttl(TTL)
            .safety_margin(SAFETY_MARGIN)
            .heartbeat_interval(HEARTBEAT)
            .build(),
    )
    .await
    .expect("connect")
}

/// A holder's lease is renewed on a member whose clock is right; its writes
/// are then refused (as from a partition) and a member whose clock runs
/// 800 ms ahead becomes primary. By that member's clock the lease expires
/// 800 ms early, and another manager acquires it then: the first holder's
/// local deadline (the default clock skew, 1 s, and the safety margin short
/// of the expiry) has passed by that time. With the safety margin alone
/// (300 ms) it would still be about 500 ms away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_failover_to_a_member_whose_clock_is_ahead_the_old_holder_is_lost_before_another_acquires()
 {
    let clock = ClockOffset::new(AHEAD_MS);
    let mut options = ReplicaSetOptions::default()
        .members(3)
        .extra_arg("--setParameter")
        .extra_arg("enableTestCommands=1");
    for (name, value) in clock.env() {
        options = options.member_env(AHEAD, name, value);
    }
    let rs = ReplicaSet::start(options).await.expect("a 3-member set");
    let clients = Clients::default();
    let direct = |i: usize| {
        let (clients, uri) = (&clients, rs.member_uri(i));
        async move { clients.connect(&uri).await }
    };
    let ahead = direct(AHEAD).await;
    let offset = until_server_offset(&ahead, AHEAD_MS, Duration::from_millis(20), LIMIT).await;
    eprintln!("member {AHEAD}'s clock runs {offset} ms ahead");

    let a = manager(&clients, &rs, "skew-a").await;
    let b = manager(&clients, &rs, "skew-b").await;
    let lease = a.acquire("k").await.unwrap();
    let mut events = lease.status().events();
    // Renewed once on member 0, whose clock is right.
    within(LIMIT, "a renewal of A's lease", async {
        while !matches!(events.recv().await, Some(LeaseEvent::Renewed { .. })) {}
    })
    .await;
    // From now on A's writes are refused (ShutdownInProgress), on every member.
    let refused = doc! {
        "failCommands": ["update", "findAndModify", "delete"],
        "appName": "skew-a",
        "errorCode": 91,
    };
    rs.fail_command("alwaysOn".into(), refused).await.unwrap();

    // Member AHEAD becomes primary: the third member may not stand for
    // election meanwhile, member 0 steps down.
    let third = direct(3 - AHEAD).await;
    third
        .database("admin")
        .run_command(doc! { "replSetFreeze": 60 })
        .await
        .expect("freeze the third member");
    rs.step_down_for(Duration::from_secs(60)).await.unwrap();
    assert_eq!(rs.wait_for_primary(LIMIT).await.unwrap(), AHEAD);

    // B tries as soon as the lease has expired by the new primary's clock.
    let mut found_held = false;
    let next = within(LIMIT, "B's acquisition", async {
        loop {
            match b.try_acquire("k").await {
                Ok(Some(next)) => break next,
                Ok(None) => found_held = true,
                Err(e) => eprintln!("B's try during the failover: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let a_lost = lease.status().is_lost();
    let left = lease
        .status()
        .deadline()
        .map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
    assert!(
        found_held,
        "the failover took longer than the lease: B never found it held on member {AHEAD}, \
         nothing is judged"
    );
    assert!(next.fencing_token() > lease.fencing_token());
    assert!(
        a_lost,
        "B acquired (token {} > {}) while A's lease was not lost: its local deadline was \
         {left:?} away",
        next.fencing_token(),
        lease.fencing_token()
    );

    rs.clear_fail_command().await.unwrap();
    drop(next);
    for m in [b, a] {
        m.shutdown().await.unwrap();
    }
}
