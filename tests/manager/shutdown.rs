//! Shutdown, bad configuration and unreachable servers.

use crate::common;

use std::future::IntoFuture;
use std::time::{Duration, Instant};

use common::Fixture;
use futures::FutureExt;
use mongo_lease::{Error, LeaseManager, LeaseManagerOptions};
use mongodb::bson::doc;

const TTL: Duration = Duration::from_secs(10);
/// A hang guard on waits that take milliseconds here.
const BOUND: Duration = Duration::from_secs(30);

#[tokio::test]
async fn shutdown_releases_everything_and_later_calls_get_a_clear_error() {
    let fx = Fixture::new("shutdown").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let leases = vec![a.acquire("x").await.unwrap(), a.acquire("y").await.unwrap()];
    let _held_by_b = b.acquire("z").await.unwrap();
    let (queued_tx, queued_rx) = tokio::sync::oneshot::channel();
    let waiter = {
        let a = a.clone();
        tokio::spawn(async move {
            let acquire = a.acquire("z").into_future();
            tokio::pin!(acquire);
            assert!(futures::poll!(&mut acquire).is_pending(), "z is held by b");
            queued_tx.send(()).unwrap();
            acquire.await
        })
    };
    // Hang guards only: the shutdown and its end of the waiter take
    // milliseconds here.
    common::within(BOUND, "the waiter's first attempt", queued_rx)
        .await
        .unwrap();
    common::within(BOUND, "the shutdown with a waiter queued", a.shutdown())
        .await
        .unwrap();
    assert!(
        leases.iter().all(|l| l.status().is_lost()),
        "tokens of released leases fire"
    );
    assert!(matches!(
        common::within(BOUND, "the waiter's end at the shutdown", waiter)
            .await
            .unwrap(),
        Err(Error::Shutdown)
    ));
    for key in ["x", "y"] {
        let doc = fx.doc(key).await;
        assert!(doc.get("lid").is_none(), "{key} released: {doc}");
    }
    assert!(a.acquire("x").await.unwrap_err().is_shutdown());
    assert!(a.try_acquire("x").await.unwrap_err().is_shutdown());
    assert!(a.release_all().await.unwrap_err().is_shutdown());
    assert!(a.shutdown().await.unwrap_err().is_shutdown());
    for lease in leases {
        assert!(lease.release().await.unwrap_err().is_shutdown());
    }
    // The operator's calls too, though they need no lease state: a manager
    // that has shut down ends nobody's lease.
    assert!(
        a.force_release("z")
            .immediately()
            .await
            .unwrap_err()
            .is_shutdown()
    );
    assert!(a.force_release("z").await.unwrap_err().is_shutdown());
    assert!(
        a.release_owner(b.owner_id())
            .await
            .unwrap_err()
            .is_shutdown()
    );
    assert!(a.request_release("z").await.unwrap_err().is_shutdown());
    assert!(a.inspect("z").await.unwrap_err().is_shutdown());
    assert!(a.list().await.unwrap_err().is_shutdown());
    assert!(a.list().page(None, 10).await.unwrap_err().is_shutdown());
    let z = b.inspect("z").await.unwrap().expect("z's document");
    assert!(
        z.held && z.owner_id == b.owner_id(),
        "b still holds z: {z:?}"
    );
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn inconsistent_options_are_refused_before_contacting_the_server() {
    // Nothing listens on port 1: a refusal that needed the server would time out instead.
    let client =
        mongodb::Client::with_uri_str("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=60000")
            .await
            .unwrap();
    let base = || {
        LeaseManagerOptions::builder()
            .database(client.database("d"))
            .collection("l")
    };
    let cases = [
        base().ttl(Duration::ZERO).build(),
        base()
            .ttl(Duration::from_secs(3))
            .heartbeat_interval(Duration::from_secs(3))
            .build(),
        base()
            .ttl(Duration::from_secs(3))
            .safety_margin(Duration::from_secs(3))
            .build(),
        base()
            .ttl(Duration::from_secs(3))
            .heartbeat_interval(Duration::ZERO)
            .build(),
        base().owner_id("").build(),
        LeaseManagerOptions::builder()
            .database(client.database("d"))
            .collection("")
            .build(),
    ];
    for options in cases {
        let described = format!("{options:?}");
        // Refused at the first poll: before any round trip could even start.
        let error = LeaseManager::connect(options)
            .now_or_never()
            .unwrap_or_else(|| panic!("{described}: connect waited instead of refusing"))
            .unwrap_err();
        assert!(error.is_invalid_input(), "{described}: {error}");
    }
}

#[tokio::test]
async fn an_unreachable_server_is_a_bounded_wait_and_a_clear_error() {
    let client =
        mongodb::Client::with_uri_str("mongodb://127.0.0.1:1/?serverSelectionTimeoutMS=60000")
            .await
            .unwrap();
    let options = LeaseManagerOptions::builder()
        .database(client.database("d"))
        .collection("l")
        .operation_timeout(Duration::from_millis(500))
        .build();
    let started = Instant::now();
    let error = LeaseManager::connect(options).await.unwrap_err();
    assert!(matches!(error, Error::Unreachable { .. }), "{error}");
    assert!(error.is_transient());
    // Bounded by operation_timeout (0.5 s; about that is measured here),
    // not by serverSelectionTimeoutMS (60 s): 10 s is 20x the measured wait.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "bounded by operation_timeout"
    );
}

#[tokio::test]
async fn an_unusable_lock_collection_is_refused_untouched() {
    let fx = Fixture::new("unusable").await;
    fx.db
        .create_collection("capped.lock")
        .capped(true)
        .size(4096)
        .await
        .unwrap();
    let mut options = fx.options(TTL).await;
    options.collection = "capped.lock".into();
    let e = LeaseManager::connect(options).await.unwrap_err();
    assert!(matches!(e, Error::UnusableCollection { .. }), "{e}");

    let plain = fx.db.collection::<mongodb::bson::Document>("plainidx.lock");
    plain
        .create_index(
            mongodb::IndexModel::builder()
                .keys(doc! { "exp": 1 })
                .build(),
        )
        .await
        .unwrap();
    let mut options = fx.options(TTL).await;
    options.collection = "plainidx.lock".into();
    let e = LeaseManager::connect(options).await.unwrap_err();
    assert!(matches!(e, Error::UnusableCollection { .. }), "{e}");
    assert_eq!(
        plain.list_index_names().await.unwrap().len(),
        2,
        "indexes untouched"
    );
}

/// Right after `shutdown` answers, while the manager task may still hold
/// the store as it finishes: an operator's call of that manager is refused
/// too, and another manager's lease stays held.
#[tokio::test]
async fn an_override_right_after_shutdown_is_refused() {
    let fx = Fixture::new("shutdown_override").await;
    let other = fx.manager(TTL).await;
    let held = other.acquire("victim").await.unwrap();
    for round in 0..10 {
        let m = fx.manager(TTL).await;
        let _mine = m.acquire(format!("mine-{round}")).await.unwrap();
        m.shutdown().await.unwrap();
        let ended = m.force_release("victim").immediately().await;
        assert!(
            matches!(ended, Err(Error::Shutdown)),
            "round {round}: {ended:?}"
        );
    }
    assert!(!held.status().is_lost());
    let victim = other
        .inspect("victim")
        .await
        .unwrap()
        .expect("its document");
    assert!(victim.held, "{victim:?}");
    other.shutdown().await.unwrap();
}
