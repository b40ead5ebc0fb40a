//! Duration control (`src/actor/duration.rs`): `Lease::set_ttl` while the
//! heartbeat's renewals are in flight, and leases held at most their TTL.

use super::*;
use crate::AcquireOptions;

const LATENCY: Duration = Duration::from_millis(200);

/// A longer TTL set while a heartbeat's renewal of the old one is in
/// flight: that renewal may land on the server after the new one, so the
/// deadline the new one's answer gives is counted with the old TTL; the
/// next heartbeat renews to the new TTL and counts with it.
#[tokio::test(start_paused = true)]
async fn a_longer_ttl_counts_in_the_deadline_from_the_next_heartbeat() {
    let db = MemoryDb::new();
    let (manager, store, t0) = start(&db, "a");
    let lease = manager.acquire("k").await.unwrap();
    store.set_latency(Op::Renew, LATENCY);
    // The heartbeat's renewal (old TTL) is in flight from t0 + 1 s.
    sleep_until(t0 + HEARTBEAT + LATENCY / 2).await;
    let sent = Instant::now();
    lease.set_ttl(Duration::from_secs(6)).await.unwrap();
    assert_eq!(Instant::now(), sent + LATENCY, "answered once confirmed");
    assert_eq!(lease.ttl(), Duration::from_secs(6));
    let deadline = lease.deadline().expect("held");
    assert!(
        deadline <= sent + VALIDITY,
        "counted with the old TTL: {:?} after the send",
        deadline - sent
    );
    // The next heartbeat renews to 6 s, and its answer counts with it.
    let tick = t0 + HEARTBEAT * 2;
    sleep_until(tick + LATENCY + MS).await;
    let doc = db.doc("k").unwrap();
    assert_eq!(doc.exp - doc.renewed, Duration::from_secs(6));
    assert_eq!(
        lease.deadline(),
        Some(tick + Duration::from_secs(6) - SAFETY_MARGIN)
    );
    manager.shutdown().await.unwrap();
}

/// A shorter TTL is the lease's at once: the deadline comes forward before
/// the renewal is even answered, and renewals use it from then on.
#[tokio::test(start_paused = true)]
async fn a_shorter_ttl_brings_the_deadline_forward_before_its_renewal_lands() {
    let db = MemoryDb::new();
    let (manager, store, t0) = start(&db, "a");
    let long = AcquireOptions::builder()
        .ttl(Duration::from_secs(9))
        .build();
    let lease = Arc::new(manager.acquire_with("k", &long).await.unwrap());
    assert_eq!(
        lease.deadline(),
        Some(t0 + Duration::from_secs(9) - SAFETY_MARGIN)
    );
    store.set_latency(Op::Renew, LATENCY);
    let short = Duration::from_secs(2);
    let setter = lease.clone();
    let set = started(async move { setter.set_ttl(short).await }).await;
    settle().await;
    assert_eq!(
        lease.deadline(),
        Some(t0 + short - SAFETY_MARGIN),
        "brought forward while the renewal is in flight"
    );
    set.await.unwrap().unwrap();
    let doc = db.doc("k").unwrap();
    assert_eq!(doc.exp - doc.renewed, short);
    // Renewed to 2 s at each tick: held past several of them.
    sleep_until(t0 + HEARTBEAT * 4).await;
    assert!(!lease.is_lost());
    assert_eq!(
        db.doc("k").unwrap().exp - db.doc("k").unwrap().renewed,
        short
    );
    manager.shutdown().await.unwrap();
}

/// A lease held at most its TTL is left out of every renewal and lost
/// `Expired` at its deadline, while the heartbeat renews another lease.
#[tokio::test(start_paused = true)]
async fn a_lease_held_at_most_is_never_renewed_and_lost_at_its_deadline() {
    let db = MemoryDb::new();
    let (manager, store, t0) = start(&db, "a");
    let other = manager.acquire("renewed").await.unwrap();
    let at_most = AcquireOptions::builder()
        .hold_at_most(Duration::from_millis(2_500))
        .build();
    let lease = manager.acquire_with("once", &at_most).await.unwrap();
    let deadline = t0 + Duration::from_millis(2_500) - SAFETY_MARGIN;
    assert_eq!(lease.deadline(), Some(deadline));
    lease.lost().await;
    assert_eq!(Instant::now(), deadline);
    assert_eq!(lease.lost_reason(), Some(crate::LossReason::Expired));
    for call in store.calls_of(Op::Renew) {
        assert!(!call.keys.contains(&LeaseKey::from("once")), "{call:?}");
    }
    assert!(store.calls(Op::Renew) >= 2, "the heartbeat ran");
    assert!(!other.is_lost());
    let refused = lease.set_ttl(TTL).await;
    assert!(
        matches!(refused, Err(Error::LeaseLost { .. })),
        "{refused:?}"
    );
    manager.shutdown().await.unwrap();
}
