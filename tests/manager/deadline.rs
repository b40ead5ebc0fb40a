//! The local deadline: a holder whose renewals cannot be confirmed is told
//! before anyone else can take its key. Uses its own mongod, frozen with SIGSTOP.

use crate::common;

use std::time::Duration;

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LeaseManager, LeaseManagerOptions};
use tokio::time::Instant;

/// Long enough that half the safety margin is far more than the lateness
/// of a timer and a task's wake-up here (milliseconds).
const TTL: Duration = Duration::from_secs(3);
const MARGIN: Duration = Duration::from_secs(1);
/// The clock skew the holder allows for (a failover to a member ahead; none
/// here, one member): taken off the deadline besides the margin.
const SKEW: Duration = Duration::from_millis(500);
/// What the local deadline keeps short of the server's expiry.
const SHORT_OF: Duration = MARGIN.saturating_add(SKEW);
/// Hang guard of every wait: 10x the TTL, which each wait is shorter than.
const HANG: Duration = Duration::from_secs(30);
/// The commands that write a lease's `exp`: its acquisition and renewals.
const WRITES: [&str; 3] = ["findAndModify", "update", "insert"];

async fn manager(client: mongodb::Client) -> LeaseManager {
    LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(client.database("deadline"))
            .collection("job.lock")
            .ttl(TTL)
            .safety_margin(MARGIN)
            .clock_skew(SKEW)
            .build(),
    )
    .await
    .unwrap()
}

fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

/// The holder is told its lease is lost by its local deadline (the start of
/// its last confirmed write + TTL − safety margin − clock skew): not
/// before, and at least half of the margin and skew before the lease
/// expires on the server. The
/// server's expiry is read from the server (`exp − ts` of the lease) and
/// placed in local time by the last confirmed write's own round trip: that
/// write's `$$NOW` came after it was sent, so the lease expires on the
/// server no earlier than that send + `exp − ts`. Then the server resumes
/// and another owner takes the key, after the holder was told.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_fires_at_the_local_deadline_before_another_owner_can_acquire() {
    // Always a server of its own (whatever `MONGODB_URI` says): it is frozen.
    let rs = ReplicaSet::start(ReplicaSetOptions::default())
        .await
        .unwrap();
    let pid = rs.members()[0].pid().unwrap();
    let clients = common::Clients::default();
    let (client, writes) = clients.connect_timed(&rs.uri()).await;
    let a = manager(client.clone()).await;
    let b = manager(clients.connect(&rs.uri()).await).await;

    let started = Instant::now();
    let lease = a.acquire("job").await.unwrap();
    let old_token = lease.fencing_token();
    // What each of the holder's writes gives the lease on the server: its
    // `exp` is that long after its `$$NOW` (`ts`).
    let doc = client
        .database("deadline")
        .collection::<mongodb::bson::Document>("job.lock")
        .find_one(mongodb::bson::doc! { "_id": "job" })
        .await
        .unwrap()
        .unwrap();
    let ms = |name: &str| doc.get_datetime(name).unwrap().timestamp_millis();
    let server_ttl = Duration::from_millis(u64::try_from(ms("exp") - ms("ts")).unwrap());
    // The server stops answering: no renewal can be confirmed from now on.
    signal(pid, "-STOP");
    let contender = tokio::spawn(async move {
        let lease = b.acquire("job").await.unwrap();
        (Instant::now(), lease.fencing_token(), b, lease)
    });
    if tokio::time::timeout(HANG, lease.status().lost())
        .await
        .is_err()
    {
        signal(pid, "-CONT");
        panic!("the token did not fire within {HANG:?} of the server's freeze");
    }
    let fired = Instant::now();
    signal(pid, "-CONT");

    let since_acquire = fired - started;
    assert!(
        since_acquire >= TTL - SHORT_OF,
        "not before the deadline: fired after {since_acquire:?}"
    );
    // Before the lease could expire on the server, by half the safety
    // margin and the skew at least: the other half covers the lateness of
    // the timer and of this task's wake-up (milliseconds). Without them the
    // token would fire at the server's expiry, 0 to 1 round trip before it.
    let last = writes
        .last_confirmed(&WRITES, fired)
        .expect("the acquisition was confirmed");
    let expires_no_earlier = last.sent + server_ttl;
    assert!(
        fired + SHORT_OF / 2 <= expires_no_earlier,
        "the token fired {:?} after the last confirmed write ({}) was sent; \
         the lease expires on the server {server_ttl:?} after that write, and \
         the holder must know {:?} before",
        fired - last.sent,
        last.name,
        SHORT_OF / 2
    );
    eprintln!(
        "token fired {:?} before the server's earliest expiry",
        expires_no_earlier - fired
    );

    let (acquired, new_token, b, new_lease) = tokio::time::timeout(HANG, contender)
        .await
        .expect("the other owner did not get the key after the server resumed")
        .unwrap();
    assert!(
        fired < acquired,
        "the holder knew {:?} before the new owner got the key",
        acquired - fired
    );
    assert!(new_token > old_token);
    eprintln!(
        "margin between loss signal and takeover: {:?}",
        acquired - fired
    );
    drop(lease);
    assert_eq!(
        new_lease.release().await.unwrap(),
        mongo_lease::ReleaseOutcome::Released
    );
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
