//! Duration control (`src/actor/duration.rs`): `Lease::set_ttl` while the
//! heartbeat's renewals are in flight, and leases held at most their TTL.

use super::*;

const LATENCY: Duration = Duration::from_millis(200);

/// A longer TTL set while a heartbeat's renewal of the old one is in
/// flight: that renewal may land on the server after the new one, but
/// under one lease id `exp` never moves back ("Late writes" in `store`),
/// so the new one's answer counts the deadline with the new TTL at once.
#[tokio::test(start_paused = true)]
async fn a_longer_ttl_counts_in_the_deadline_from_its_own_renewal() {
    let db = MemoryDb::new();
    let (manager, store, t0) = start(&db, "a");
    let lease = manager.acquire("k").await.unwrap();
    store.set_latency(Op::Renew, LATENCY);
    // The heartbeat's renewal (old TTL) is in flight from t0 + 1 s.
    sleep_until(t0 + HEARTBEAT + LATENCY / 2).await;
    let sent = Instant::now();
    let long = Duration::from_secs(6);
    lease.set_ttl(long).await.unwrap();
    assert_eq!(Instant::now(), sent + LATENCY, "answered once confirmed");
    assert_eq!(lease.ttl(), long);
    assert_eq!(lease.status().deadline(), Some(sent + long - SAFETY_MARGIN));
    // The old TTL's renewal landed after it, and cut nothing.
    sleep_until(t0 + HEARTBEAT + LATENCY + MS).await;
    let doc = db.doc("k").unwrap();
    assert!(doc.exp >= sent + long, "{:?}", doc.exp - sent);
    // The next heartbeat renews to 6 s.
    let tick = t0 + HEARTBEAT * 2;
    sleep_until(tick + LATENCY + MS).await;
    let doc = db.doc("k").unwrap();
    assert_eq!(doc.exp - doc.renewed, long);
    assert_eq!(lease.status().deadline(), Some(tick + long - SAFETY_MARGIN));
    manager.shutdown().await.unwrap();
}

/// A shorter TTL is the lease's at once, for the renewals sent from then
/// on; the server's expiry and the local deadline stay where the longer
/// TTL's confirmed write put them (under one lease id `exp` never moves
/// back), and the renewals keep the lease held once that has passed.
#[tokio::test(start_paused = true)]
async fn a_shorter_ttl_renews_to_it_and_moves_nothing_back() {
    let db = MemoryDb::new();
    let (manager, store, t0) = start(&db, "a");
    let lease = manager
        .acquire("k")
        .ttl(Duration::from_secs(9))
        .await
        .unwrap();
    let deadline = t0 + Duration::from_secs(9) - SAFETY_MARGIN;
    assert_eq!(lease.status().deadline(), Some(deadline));
    store.set_latency(Op::Renew, LATENCY);
    let short = Duration::from_secs(2);
    lease.set_ttl(short).await.unwrap();
    assert_eq!(lease.ttl(), short);
    assert_eq!(
        lease.status().deadline(),
        Some(deadline),
        "nothing moved back"
    );
    let doc = db.doc("k").unwrap();
    assert_eq!(doc.exp, t0 + Duration::from_secs(9), "nor on the server");
    // Renewed to 2 s at each tick: held past the 9 s, then `exp` is 2 s
    // after each renewal.
    sleep_until(t0 + HEARTBEAT * 10 + LATENCY + MS).await;
    assert!(!lease.status().is_lost());
    let doc = db.doc("k").unwrap();
    assert_eq!(doc.exp - doc.renewed, short);
    assert_eq!(
        lease.status().deadline(),
        Some(t0 + HEARTBEAT * 10 + short - SAFETY_MARGIN)
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
    let lease = manager
        .acquire("once")
        .hold_at_most(Duration::from_millis(2_500))
        .await
        .unwrap();
    let deadline = t0 + Duration::from_millis(2_500) - SAFETY_MARGIN;
    assert_eq!(lease.status().deadline(), Some(deadline));
    lease.status().lost().await;
    assert_eq!(Instant::now(), deadline);
    assert_eq!(
        lease.status().lost_reason(),
        Some(crate::status::LossReason::Expired)
    );
    for call in store.calls_of(Op::Renew) {
        assert!(!call.keys.contains(&LeaseKey::from("once")), "{call:?}");
    }
    assert!(store.calls(Op::Renew) >= 2, "the heartbeat ran");
    assert!(!other.status().is_lost());
    let refused = lease.set_ttl(TTL).await;
    assert!(
        matches!(refused, Err(Error::LeaseLost { .. })),
        "{refused:?}"
    );
    manager.shutdown().await.unwrap();
}
