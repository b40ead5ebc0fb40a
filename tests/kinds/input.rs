//! Bad kinds and minimum holds are refused with `InvalidConfig` before any
//! round trip (command monitoring: nothing is sent).

use std::time::Duration;

use mongo_lease::{
    AcquireOptions, Error, LeaseKind, LeaseManager, MAX_PERMITS, ReleaseMode, Result,
};
use tokio_util::time::FutureExt as _;

use crate::common::{CommandLog, Fixture};

const TTL: Duration = Duration::from_secs(10);

#[track_caller]
fn assert_invalid_config<T: std::fmt::Debug>(result: Result<T>, what: &str) {
    match result {
        Err(Error::InvalidConfig { reason }) => eprintln!("{what}: {reason}"),
        other => panic!("{what}: expected InvalidConfig, got {other:?}"),
    }
}

/// The commands `log` recorded, replies left out.
fn sent(log: &CommandLog) -> Vec<String> {
    log.all()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !name.starts_with("ok:"))
        .collect()
}

fn kind(kind: LeaseKind) -> AcquireOptions {
    AcquireOptions::builder().kind(kind).build()
}

fn held_at_least(kind: LeaseKind, at_least: Duration) -> AcquireOptions {
    AcquireOptions::builder()
        .kind(kind)
        .hold_at_least(at_least)
        .build()
}

/// 0 permits, more than `MAX_PERMITS`, a minimum hold on a shared lease or
/// a permit, a minimum hold of 0: refused by every acquisition method,
/// before anything is sent.
#[tokio::test]
async fn bad_permits_and_minimum_holds_are_refused_before_any_round_trip() {
    let fx = Fixture::new("kinds_input").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let manager = LeaseManager::connect(options).await.unwrap();
    log.clear();

    assert_invalid_config(manager.semaphore("pool", 0), "a semaphore of 0 permits");
    assert_invalid_config(
        manager.semaphore("pool", MAX_PERMITS + 1),
        "a semaphore of MAX_PERMITS + 1 permits",
    );
    assert!(matches!(
        manager.semaphore("", 2),
        Err(Error::InvalidKey { .. })
    ));
    let largest = manager.semaphore("pool", MAX_PERMITS).unwrap();
    assert_eq!(largest.permits(), MAX_PERMITS);

    for permits in [0, MAX_PERMITS + 1] {
        let options = kind(LeaseKind::Permit { permits });
        let what = format!("{permits} permits");
        assert_invalid_config(manager.acquire_with("pool", &options).await, &what);
        assert_invalid_config(manager.try_acquire_with("pool", &options).await, &what);
        assert_invalid_config(
            manager
                .acquire_with("pool", &options)
                .timeout(Duration::from_secs(1))
                .await
                .ok()
                .transpose(),
            &what,
        );
    }
    let shared_held = held_at_least(LeaseKind::Shared, Duration::from_secs(5));
    assert_invalid_config(
        manager.acquire_with("pool", &shared_held).await,
        "hold_at_least on a shared lease",
    );
    assert_invalid_config(
        manager.try_acquire_with("pool", &shared_held).await,
        "hold_at_least on a shared lease (try)",
    );
    let permit_held = held_at_least(LeaseKind::Permit { permits: 2 }, Duration::from_secs(5));
    assert_invalid_config(
        manager.acquire_with("pool", &permit_held).await,
        "hold_at_least on a permit",
    );
    let pool = manager.semaphore("pool", 2).unwrap();
    assert_invalid_config(
        pool.acquire_with(&permit_held).await,
        "hold_at_least through Semaphore::acquire_with",
    );
    // The semaphore's own kind wins over the options', so this one is
    // refused for its minimum hold too.
    assert_invalid_config(
        pool.acquire_with(&held_at_least(LeaseKind::Exclusive, Duration::from_secs(5)))
            .await,
        "hold_at_least through Semaphore::acquire_with (exclusive in the options)",
    );
    assert_invalid_config(
        manager
            .acquire_with("pool", &held_at_least(LeaseKind::Exclusive, Duration::ZERO))
            .await,
        "a minimum hold of 0",
    );
    assert_eq!(sent(&log), Vec::<String>::new(), "nothing was sent");
    manager.shutdown().await.unwrap();
}

/// In `ReleaseMode::Delete` (a release deletes the key's document, which
/// holds every holder and the minimum hold), semaphores, shared leases and
/// minimum holds are refused before anything is sent; plain exclusive
/// leases still work.
#[tokio::test]
async fn kinds_and_minimum_holds_are_refused_in_delete_mode_before_any_round_trip() {
    let fx = Fixture::new("kinds_delete").await;
    let (mut options, log) = fx.monitored_options(TTL, "").await;
    options.release_mode = Some(ReleaseMode::Delete);
    let manager = LeaseManager::connect(options).await.unwrap();
    log.clear();

    assert_invalid_config(manager.semaphore("pool", 2), "a semaphore in delete mode");
    assert_invalid_config(manager.acquire_shared("pool").await, "acquire_shared");
    assert_invalid_config(
        manager.try_acquire_shared("pool").await,
        "try_acquire_shared",
    );
    assert_invalid_config(
        manager
            .acquire_shared("pool")
            .timeout(Duration::from_secs(1))
            .await
            .ok()
            .transpose(),
        "acquire_shared under a timeout",
    );
    assert_invalid_config(
        manager
            .try_acquire_with("pool", &kind(LeaseKind::Permit { permits: 2 }))
            .await,
        "a permit",
    );
    assert_invalid_config(
        manager
            .acquire_with(
                "pool",
                &held_at_least(LeaseKind::Exclusive, Duration::from_secs(5)),
            )
            .await,
        "hold_at_least",
    );
    assert_eq!(sent(&log), Vec::<String>::new(), "nothing was sent");
    let plain = manager.try_acquire("pool").await.unwrap().expect("free");
    assert_eq!(plain.kind(), LeaseKind::Exclusive);
    drop(plain);
    manager.shutdown().await.unwrap();
}
