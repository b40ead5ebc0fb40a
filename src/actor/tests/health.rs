//! `LeaseManager::health` (`src/health.rs`, published by
//! `src/actor/telemetry.rs`): renewals on time, held leases, the age of the
//! oldest confirmed renewal, under the paused clock.

use super::*;
use crate::status::LossReason;

#[tokio::test(start_paused = true)]
async fn health_follows_renewals_and_reads_unhealthy_after_a_lease_lost_to_its_deadline_until_the_server_answers()
 {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let idle = a.health();
    assert!(idle.is_healthy());
    assert_eq!((idle.held_leases, idle.oldest_renewal_age), (0, None));

    let lease = a.acquire("k").await.unwrap();
    let held = a.health();
    assert!(held.is_healthy());
    assert_eq!(held.held_leases, 1);
    assert_eq!(held.oldest_renewal_age, Some(Duration::ZERO));

    // The heartbeat at t0 + 1 s renewed it: half a heartbeat later, its
    // last confirmed renewal is 500 ms old.
    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 2).await;
    let renewed = a.health();
    assert!(renewed.is_healthy());
    assert_eq!(renewed.oldest_renewal_age, Some(HEARTBEAT / 2));

    // Renewals hang from now on: late, but the deadline (t0 + 1 s + 2.7 s)
    // is still ahead, so renewals are still on time; the age keeps growing.
    store.hang_renewals();
    sleep_until(t0 + HEARTBEAT * 3 + HEARTBEAT / 2).await;
    let late = a.health();
    assert!(late.is_healthy(), "{late:?}");
    assert_eq!(late.oldest_renewal_age, Some(Duration::from_millis(2_500)));

    soon(lease.status().lost()).await;
    assert_eq!(Instant::now(), t0 + HEARTBEAT + VALIDITY);
    assert_eq!(lease.status().lost_reason(), Some(LossReason::Expired));
    let lost = a.health();
    assert!(!lost.is_healthy(), "lost to its deadline: {lost:?}");
    assert_eq!((lost.held_leases, lost.oldest_renewal_age), (0, None));
    sleep(HEARTBEAT * 3).await;
    assert!(
        !a.health().is_healthy(),
        "stays unhealthy while the server has not answered"
    );

    store.set_fault(Op::Renew, None);
    let again = a.acquire("k2").await.unwrap();
    let recovered = a.health();
    assert!(recovered.is_healthy(), "{recovered:?}");
    assert_eq!(recovered.held_leases, 1);
    drop(again);
    a.shutdown().await.unwrap();
    assert_eq!(a.health().held_leases, 0);
}

#[tokio::test(start_paused = true)]
async fn a_lease_force_released_or_released_leaves_the_manager_healthy() {
    let db = MemoryDb::new();
    let (a, _, t0) = start(&db, "a");
    let taken = a.acquire("taken").await.unwrap();
    let released = a.acquire("released").await.unwrap();
    assert_eq!(a.health().held_leases, 2);
    assert_eq!(released.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(a.health().held_leases, 1);
    a.force_release("taken").await.unwrap();
    soon(taken.status().lost()).await;
    assert_eq!(
        taken.status().lost_reason(),
        Some(LossReason::ForceReleased)
    );
    let health = a.health();
    assert!(health.is_healthy(), "{health:?}");
    assert_eq!(health.held_leases, 0);
    // Through several heartbeats with nothing held.
    sleep_until(t0 + HEARTBEAT * 5).await;
    assert!(a.health().is_healthy());
}

#[tokio::test(start_paused = true)]
async fn the_oldest_renewal_is_the_oldest_among_leases_of_different_ttls_and_ages() {
    let db = MemoryDb::new();
    let (a, _, t0) = start(&db, "a");
    let _first = a.acquire("first").await.unwrap();
    sleep_until(t0 + HEARTBEAT / 4).await;
    let _second = a
        .acquire("second")
        .ttl(Duration::from_secs(6))
        .await
        .unwrap();
    // Acquired at t0 and t0 + 250 ms: the older one counts.
    assert_eq!(a.health().oldest_renewal_age, Some(HEARTBEAT / 4));
    // Both renewed at t0 + 1 s, whatever their TTL.
    sleep_until(t0 + HEARTBEAT + HEARTBEAT / 10).await;
    assert_eq!(a.health().oldest_renewal_age, Some(HEARTBEAT / 10));
}
