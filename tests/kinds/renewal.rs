//! Permits and shared leases are renewed by the manager's heartbeat, in the
//! same batched command as exclusive leases.

use std::time::Duration;

use mongo_lease::{LeaseKind, LeaseManager, ReleaseOutcome, Semaphore};
use mongodb::bson::Bson;

use crate::common::{self, Fixture, renewal::renewed_keys};
use crate::support::LIVENESS;

/// 3 s: a heartbeat every second, a safety margin of 0.3 s.
const TTL: Duration = Duration::from_secs(3);
const KEYS: [&str; 3] = ["catalogue", "job", "pool"];

/// A permit, a shared lease and an exclusive lease of one manager stay held
/// past twice their TTL by the server's clock: the heartbeat renews them
/// (each holder's entry too), and one renewal command per tick covers the
/// three kinds together.
#[tokio::test]
async fn permits_and_shared_leases_outlive_their_ttl_renewed_with_exclusive_leases_in_one_command()
{
    let fx = Fixture::new("kinds_renewal").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let holder = LeaseManager::connect(options).await.unwrap();
    let reader = fx.manager(TTL).await;
    let permit = Semaphore::new(&holder, "pool", 2)
        .unwrap()
        .acquire()
        .await
        .unwrap();
    let shared = holder.acquire("catalogue").shared().await.unwrap();
    let exclusive = holder.acquire("job").await.unwrap();
    let acquired = reader.inspect("pool").await.unwrap().unwrap().acquired_at;
    log.clear();

    // Until the server's clock is two TTLs past the first acquisition.
    let mut last_seen = acquired;
    common::eventually("two TTLs pass by the server's clock", LIVENESS, || {
        let reader = reader.clone();
        async move {
            let now = reader.inspect("pool").await.unwrap().unwrap().server_time;
            now >= acquired + 2 * TTL
        }
    })
    .await;
    for lease in [&permit, &shared, &exclusive] {
        assert!(!lease.status().is_lost(), "{:?} was lost", lease.kind());
    }
    for key in KEYS {
        let info = reader.inspect(key).await.unwrap().unwrap();
        assert!(info.held, "{key} expired: {info:?}");
        assert!(
            info.server_time >= acquired + 2 * TTL,
            "read at {:?}",
            info.server_time
        );
        if info.kind == LeaseKind::Exclusive {
            assert_eq!(info.owner_id, holder.owner_id());
            last_seen = last_seen.max(info.renewed_at);
        } else {
            assert_eq!(info.holders.len(), 1, "{key}: {:?}", info.holders);
            let entry = &info.holders[0];
            assert_eq!(entry.owner_id, holder.owner_id());
            assert!(
                entry.renewed_at > entry.acquired_at,
                "{key}'s holder entry was never renewed"
            );
        }
    }
    assert!(
        last_seen > acquired,
        "the exclusive lease was never renewed"
    );
    let full_ticks = log
        .all()
        .iter()
        .filter_map(|(name, command)| (name == "update").then_some(command))
        .filter_map(renewed_keys)
        .filter(|keys| {
            KEYS.iter()
                .all(|key| keys.contains(&Bson::String((*key).to_owned())))
        })
        .count();
    eprintln!("{full_ticks} renewal commands covered the three kinds at once");
    assert!(
        full_ticks >= 2,
        "expected renewal commands covering the three kinds at once, got {full_ticks}"
    );
    for lease in [permit, shared, exclusive] {
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    }
    holder.shutdown().await.unwrap();
    reader.shutdown().await.unwrap();
}
