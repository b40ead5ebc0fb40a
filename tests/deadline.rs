//! The local deadline: a holder whose renewals cannot be confirmed is told
//! before anyone else can take its key. Uses its own mongod, frozen with SIGSTOP.

mod common;

use std::time::Duration;

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LockManager, LockManagerOptions};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(2);
const MARGIN: Duration = Duration::from_millis(300);

async fn manager(clients: &common::Clients, uri: &str) -> LockManager {
    let client = clients.connect(uri).await;
    LockManager::connect(
        LockManagerOptions::builder()
            .database(client.database("deadline"))
            .collection("job.lock")
            .ttl(TTL)
            .safety_margin(MARGIN)
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_fires_at_the_local_deadline_before_another_owner_can_acquire() {
    // Always a server of its own (whatever `MONGODB_URI` says): it is frozen.
    let rs = ReplicaSet::start(ReplicaSetOptions::default())
        .await
        .unwrap();
    let pid = rs.members()[0].pid().unwrap();
    let clients = common::Clients::default();
    let (a, b) = (
        manager(&clients, &rs.uri()).await,
        manager(&clients, &rs.uri()).await,
    );

    let started = Instant::now();
    let lease = a.acquire("job").await.unwrap();
    let old_token = lease.fencing_token();
    // The server stops answering: no renewal can be confirmed from now on.
    signal(pid, "-STOP");
    let contender = tokio::spawn(async move {
        let lease = b.acquire("job").await.unwrap();
        (Instant::now(), lease.fencing_token(), b, lease)
    });
    lease.lost().await;
    let fired = Instant::now();
    signal(pid, "-CONT");

    let since_acquire = fired - started;
    assert!(
        since_acquire >= TTL - MARGIN,
        "not before the deadline: fired after {since_acquire:?}"
    );
    // "Before the lease could expire on the server" is checked by ordering
    // (the token fired before the contender got the key), not by the clock.

    let (acquired, new_token, b, new_lease) = contender.await.unwrap();
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
