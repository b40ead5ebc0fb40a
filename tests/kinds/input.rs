//! Bad kinds and minimum holds are refused with `InvalidConfig` before any
//! round trip (command monitoring: nothing is sent).

use std::future::IntoFuture;
use std::time::Duration;

use mongo_lease::{Error, LeaseKind, LeaseManager, MAX_PERMITS, ReleaseMode, Result, Semaphore};
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

/// 0 permits, more than `MAX_PERMITS`, a minimum hold on a shared lease or
/// a permit, a minimum hold of 0: refused by every acquisition method,
/// before anything is sent.
#[tokio::test]
async fn bad_permits_and_minimum_holds_are_refused_before_any_round_trip() {
    let fx = Fixture::new("kinds_input").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let manager = LeaseManager::connect(options).await.unwrap();
    log.clear();

    assert_invalid_config(
        Semaphore::new(&manager, "pool", 0),
        "a semaphore of 0 permits",
    );
    assert_invalid_config(
        Semaphore::new(&manager, "pool", MAX_PERMITS + 1),
        "a semaphore of MAX_PERMITS + 1 permits",
    );
    assert!(matches!(
        Semaphore::new(&manager, "", 2),
        Err(Error::InvalidKey { .. })
    ));
    let largest = Semaphore::new(&manager, "pool", MAX_PERMITS).unwrap();
    assert_eq!(largest.permits(), MAX_PERMITS);

    // Permits are taken through a semaphore only: 0 of them, or more than
    // it has, refused by every acquisition method.
    let pool = Semaphore::new(&manager, "pool", 2).unwrap();
    for permits in [0, 3] {
        let what = format!("{permits} permits of 2");
        assert_invalid_config(pool.acquire().permits(permits).await, &what);
        assert_invalid_config(pool.try_acquire().permits(permits).await, &what);
        assert_invalid_config(
            pool.acquire()
                .permits(permits)
                .into_future()
                .timeout(Duration::from_secs(1))
                .await
                .ok()
                .transpose(),
            &what,
        );
    }
    let at_least = Duration::from_secs(5);
    assert_invalid_config(
        manager
            .acquire("pool")
            .shared()
            .hold_at_least(at_least)
            .await,
        "hold_at_least on a shared lease",
    );
    assert_invalid_config(
        manager
            .try_acquire("pool")
            .shared()
            .hold_at_least(at_least)
            .await,
        "hold_at_least on a shared lease (try)",
    );
    assert_invalid_config(
        pool.acquire().hold_at_least(at_least).await,
        "hold_at_least on a permit",
    );
    assert_invalid_config(
        pool.try_acquire().hold_at_least(at_least).await,
        "hold_at_least on a permit (try)",
    );
    assert_invalid_config(
        manager.acquire("pool").hold_at_least(Duration::ZERO).await,
        "a minimum hold of 0",
    );
    assert_eq!(sent(&log), Vec::<String>::new(), "nothing was sent");
    manager.shutdown().await.unwrap();
}

/// In `ReleaseMode::Delete` (a release deletes the key's document, which
/// holds every holder and the minimum hold), semaphores, shared leases and
/// minimum holds are refused before anything is sent; plain
/// leases still work.
#[tokio::test]
async fn kinds_and_minimum_holds_are_refused_in_delete_mode_before_any_round_trip() {
    let fx = Fixture::new("kinds_delete").await;
    let (mut options, log) = fx.monitored_options(TTL, "").await;
    options.release_mode = Some(ReleaseMode::Delete);
    let manager = LeaseManager::connect(options).await.unwrap();
    log.clear();

    assert_invalid_config(
        Semaphore::new(&manager, "pool", 2),
        "a semaphore in delete mode",
    );
    assert_invalid_config(
        manager.acquire("pool").shared().await,
        "acquire(..).shared()",
    );
    assert_invalid_config(
        manager.try_acquire("pool").shared().await,
        "try_acquire(..).shared()",
    );
    assert_invalid_config(
        manager
            .acquire("pool")
            .shared()
            .into_future()
            .timeout(Duration::from_secs(1))
            .await
            .ok()
            .transpose(),
        "acquire(..).shared() under a timeout",
    );
    assert_invalid_config(
        manager
            .acquire("pool")
            .hold_at_least(Duration::from_secs(5))
            .await,
        "hold_at_least",
    );
    assert_eq!(sent(&log), Vec::<String>::new(), "nothing was sent");
    let plain = manager.try_acquire("pool").await.unwrap().expect("free");
    assert_eq!(plain.kind(), LeaseKind::Exclusive);
    drop(plain);
    manager.shutdown().await.unwrap();
}
