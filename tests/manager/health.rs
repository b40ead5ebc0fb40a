//! `LeaseManager::health` against a real MongoDB: healthy while leases are
//! renewed, unhealthy when the server is unreachable (through the test
//! kit's fault proxy) and when the manager task is starved (read without
//! it), healthy again once the server answers.

use crate::common;

use std::time::Duration;

use common::{Clients, Fixture};
use mongo_lease::{LeaseManager, LeaseManagerOptions, LossReason, ReleaseOutcome};

/// How long a wait for an event may take before the test fails. It only
/// turns a hang into a failure: the longest wait here is one lease's local
/// deadline (under 10 s) or a reconnection after a healed link.
const BOUND: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_is_lost_with_the_server_and_back_once_it_answers_again() {
    let (_rs, proxy, uri) = common::server_behind_proxy().await;
    let clients = Clients::default();
    let client = clients.connect(&uri).await;
    let manager = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(client.database("d"))
            .collection("job.lock")
            .ttl(Duration::from_secs(2))
            .clock_skew(common::clock_skew(Duration::from_secs(2)))
            .operation_timeout(Duration::from_millis(800))
            .build(),
    )
    .await
    .unwrap();
    let lease = manager.acquire("held").await.unwrap();
    let health = manager.health();
    assert!(health.is_healthy(), "{health:?}");
    assert_eq!(health.held_leases, 1);

    proxy.blackhole();
    common::within(BOUND, "the lease's loss", lease.status().lost()).await;
    assert_eq!(lease.status().lost_reason(), Some(LossReason::Expired));
    let health = manager.health();
    assert!(
        !health.is_healthy(),
        "lost to its deadline, server unreachable: {health:?}"
    );
    assert_eq!(health.held_leases, 0);

    proxy.reset();
    proxy.heal();
    let again = common::within(BOUND, "an acquire after the heal", manager.acquire("held"))
        .await
        .unwrap();
    let health = manager.health();
    assert!(health.is_healthy(), "{health:?}");
    assert_eq!(health.held_leases, 1);
    assert_eq!(again.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// The manager task runs on a runtime whose only thread is then blocked:
/// the handle, read from another thread, turns unhealthy once the lease's
/// local deadline has passed, though the task never ran to notice it.
#[test]
fn a_starved_manager_task_reads_unhealthy_once_a_deadline_passed() {
    const TTL: Duration = Duration::from_secs(10);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let fixture = runtime.block_on(Fixture::new("health_starved"));
    let (to_test, from_task) = std::sync::mpsc::channel();
    let (unblock, blocked) = std::sync::mpsc::channel::<()>();
    let task = std::thread::spawn(move || {
        runtime.block_on(async {
            let manager = fixture.manager(TTL).await;
            let lease = manager.acquire("k").await.unwrap();
            to_test.send(manager.clone()).unwrap();
            // Blocks the runtime's only thread: the manager task is starved.
            blocked.recv().unwrap();
            tokio::time::timeout(BOUND, lease.status().lost())
                .await
                .expect("the task, running again, marks the lease lost");
            assert_eq!(lease.status().lost_reason(), Some(LossReason::Expired));
            manager.shutdown().await.unwrap();
        });
        drop(fixture);
    });
    let manager: LeaseManager = from_task.recv().unwrap();
    let before = manager.health();
    assert_eq!(before.held_leases, 1);
    assert!(
        before.is_healthy(),
        "read well within the 9 s local deadline: {before:?}"
    );
    let started = std::time::Instant::now();
    let late = loop {
        let health = manager.health();
        if !health.is_healthy() {
            break health;
        }
        assert!(started.elapsed() < BOUND, "still healthy: {health:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(late.held_leases, 1, "still held: the task did not run");
    assert!(
        late.oldest_renewal_age.unwrap() >= TTL - TTL / 10 - common::clock_skew(TTL),
        "{late:?}"
    );
    unblock.send(()).unwrap();
    task.join().unwrap();
}
