//! Duration control on a real mongod: a held lease's TTL changed by
//! `Lease::set_ttl` (confirmed by the server before it returns, kept by the
//! heartbeat), and leases held at most a duration
//! (`Acquire::hold_at_most`: never renewed, ended at their deadline
//! with `LossReason::Expired`, free for others only at the server's expiry).

use crate::common;

use std::time::Duration;

use common::{Fixture, eventually, within};
use mongo_lease::{Error, LeaseEvent, LeaseManager, LossReason};
use mongodb::bson::Document;

const TTL: Duration = Duration::from_secs(2);

/// `exp − ts` of the lock document of `key`, in milliseconds: the TTL its
/// last write gave it.
fn written_ttl_ms(doc: &Document) -> i64 {
    doc.get_datetime("exp").unwrap().timestamp_millis()
        - doc.get_datetime("ts").unwrap().timestamp_millis()
}

/// The renewals (`update` commands on the lock collection) in `log`.
fn renewals(log: &common::CommandLog) -> usize {
    log.all()
        .into_iter()
        .filter(|(name, cmd)| name == "update" && cmd.get_str("update") == Ok("workitem.lock"))
        .count()
}

/// `Lease::set_ttl` renews at once to the new TTL, and the heartbeat keeps
/// it. Under one lease id `exp` never moves back ("Late writes" in
/// `store`): a shorter TTL leaves `exp` and the local deadline where the
/// last confirmed write put them, and the renewals follow it once that has
/// passed; a longer one moves both at once.
#[tokio::test]
async fn set_ttl_renews_at_once_to_the_new_ttl_and_the_heartbeat_keeps_it() {
    let fx = Fixture::new("set_ttl").await;
    let manager = fx.manager(TTL).await;
    let lease = manager.acquire("job").await.unwrap();
    assert_eq!(written_ttl_ms(&fx.doc("job").await), 2_000);
    let exp = |doc: &Document| doc.get_datetime("exp").unwrap().timestamp_millis();
    let acquired_exp = exp(&fx.doc("job").await);
    let deadline = lease.status().deadline().expect("held");

    // Shorter: nothing moves back; the renewals use it.
    let short = Duration::from_millis(1_200);
    lease.set_ttl(short).await.unwrap();
    assert_eq!(lease.ttl(), short);
    assert!(exp(&fx.doc("job").await) >= acquired_exp, "exp never back");
    assert!(lease.status().deadline().expect("held") >= deadline);
    eventually("the renewals follow the 1.2 s TTL", TTL * 10, || async {
        written_ttl_ms(&fx.doc("job").await) == 1_200
    })
    .await;
    assert!(!lease.status().is_lost());

    // Longer: confirmed by the server when the call returns.
    let start = tokio::time::Instant::now();
    lease.set_ttl(Duration::from_secs(7)).await.unwrap();
    assert_eq!(lease.ttl(), Duration::from_secs(7));
    let after = fx.doc("job").await;
    assert_eq!(written_ttl_ms(&after), 7_000);
    let deadline = lease.status().deadline().expect("still held");
    assert!(
        deadline >= start + Duration::from_secs(6),
        "the deadline follows the 7 s TTL: {:?} after the call",
        deadline - start
    );
    // The next heartbeat renews to the new TTL too.
    let ts = after.get_datetime("ts").unwrap().timestamp_millis();
    eventually("the heartbeat renewed the lease", TTL * 10, || async {
        fx.doc("job")
            .await
            .get_datetime("ts")
            .unwrap()
            .timestamp_millis()
            > ts
    })
    .await;
    assert_eq!(written_ttl_ms(&fx.doc("job").await), 7_000);
    assert!(!lease.release().await.unwrap().was_lost());
}

#[tokio::test]
async fn set_ttl_refuses_bad_ttls_and_leases_held_at_most_and_writes_nothing() {
    let fx = Fixture::new("set_ttl_bad").await;
    let manager = fx.manager(TTL).await;
    let lease = manager.acquire("job").await.unwrap();
    let before = fx.doc("job").await;
    for bad in [
        Duration::ZERO,
        Duration::from_millis(5),
        Duration::from_millis(700),
    ] {
        let refused = lease.set_ttl(bad).await;
        assert!(
            matches!(refused, Err(Error::InvalidConfig { .. })),
            "{bad:?}: {refused:?}"
        );
    }
    let refused = lease.set_ttl(Duration::MAX).await;
    assert!(
        matches!(refused, Err(Error::InvalidConfig { .. })),
        "{refused:?}"
    );
    assert_eq!(lease.ttl(), TTL);
    assert_eq!(
        written_ttl_ms(&fx.doc("job").await),
        written_ttl_ms(&before)
    );

    let at_most = manager
        .acquire("once")
        .hold_at_most(Duration::from_secs(5))
        .await
        .unwrap();
    let refused = at_most.set_ttl(Duration::from_secs(10)).await;
    assert!(
        matches!(refused, Err(Error::InvalidConfig { .. })),
        "{refused:?}"
    );
    assert_eq!(written_ttl_ms(&fx.doc("once").await), 5_000);

    // A lease released is lost for set_ttl.
    let key_lease = manager.acquire("gone").await.unwrap();
    manager.release_all().await.unwrap();
    let refused = key_lease.set_ttl(Duration::from_secs(3)).await;
    assert!(
        matches!(refused, Err(Error::LeaseLost { .. })),
        "{refused:?}"
    );
    drop((lease, at_most));
}

#[tokio::test]
async fn bad_hold_at_most_options_are_refused_before_any_round_trip() {
    let fx = Fixture::new("hold_at_most_bad").await;
    let manager = fx.manager(TTL).await;
    let cases = [
        manager.acquire("k").hold_at_most(Duration::from_millis(5)),
        // Not longer than the safety margin (TTL / 10).
        manager
            .acquire("k")
            .hold_at_most(Duration::from_millis(200)),
        manager
            .acquire("k")
            .hold_at_most(Duration::from_secs(3))
            .ttl(Duration::from_secs(3)),
        manager
            .acquire("k")
            .hold_at_most(Duration::from_secs(3))
            .hold_at_least(Duration::from_secs(4)),
        manager.acquire("k").hold_at_most(Duration::MAX),
    ];
    for request in cases {
        let what = format!("{request:?}");
        let refused = request.await;
        assert!(
            matches!(refused, Err(Error::InvalidConfig { .. })),
            "{what}: {refused:?}"
        );
    }
    assert!(
        fx.raw()
            .find_one(mongodb::bson::doc! {})
            .await
            .unwrap()
            .is_none(),
        "nothing was written"
    );
}

#[tokio::test]
async fn a_lease_held_at_most_is_never_renewed_and_ends_expired_at_its_deadline() {
    let fx = Fixture::new("hold_at_most").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let holder = LeaseManager::connect(options).await.unwrap();
    let other = fx.manager(TTL).await;
    // Renewed beside it: the heartbeat runs, and leaves the other one alone.
    let renewed = holder.acquire("renewed").await.unwrap();
    let at_most = Duration::from_millis(1_500);
    let start = tokio::time::Instant::now();
    let lease = holder.acquire("once").hold_at_most(at_most).await.unwrap();
    let acquired = fx.doc("once").await;
    assert_eq!(lease.ttl(), at_most);
    let acq = acquired.get_datetime("acq").unwrap().timestamp_millis();
    let exp = acquired.get_datetime("exp").unwrap().timestamp_millis();
    assert_eq!(exp - acq, 1_500, "it ends at acquisition + D on the server");
    let returned = tokio::time::Instant::now();
    let deadline = lease.status().deadline().expect("held");
    let validity = at_most - Duration::from_millis(200) - common::clock_skew(TTL);
    assert!(
        start + validity <= deadline && deadline <= returned + validity,
        "local deadline: the write's send + D − the safety margin − the clock skew, got {:?}",
        deadline - start
    );
    let mut events = lease.status().events();
    // Another owner cannot take it while it is held.
    assert!(other.try_acquire("once").await.unwrap().is_none());
    log.clear();

    within(at_most * 10, "the lease's end", lease.status().lost()).await;
    assert!(
        tokio::time::Instant::now() >= deadline,
        "told at its deadline, not before"
    );
    assert_eq!(lease.status().lost_reason(), Some(LossReason::Expired));
    let mut seen = Vec::new();
    while let Some(event) = within(at_most, "the events", events.recv()).await {
        seen.push(event);
    }
    assert_eq!(
        seen,
        vec![LeaseEvent::Lost(LossReason::Expired)],
        "never renewed, lost once"
    );
    // The heartbeat renewed the other lease meanwhile, never this one: no
    // write naming it sets an expiry 1 500 ms after the server's now (its
    // release at the deadline sets none).
    assert!(renewals(&log) >= 1, "the heartbeat ran");
    for (name, cmd) in log.all() {
        if name == "update" && cmd.get_str("update") == Ok("workitem.lock") {
            let text = format!("{cmd:?}");
            let renews_it = text.contains("\"once\"") && text.contains("Int64(1500)");
            assert!(!renews_it, "renewed the lease held at most: {text}");
        }
    }
    // The key is free once it ended.
    let next = within(TTL * 10, "the next holder", other.acquire("once")).await;
    assert!(next.unwrap().fencing_token() > lease.fencing_token());
    assert!(!renewed.status().is_lost());
    drop(lease);
}
