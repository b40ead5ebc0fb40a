//! Several keys at once on a real mongod (`acquire_all`, `try_acquire_all`):
//! taken in one canonical order, all held or none, released together, and
//! the loss of one is the loss of all.

use crate::common;

use std::future::IntoFuture;
use std::time::Duration;

use common::{Fixture, eventually, within};
use mongo_lease::{CallerId, Error, LeaseKey, LossReason, ReleaseOutcome};
use tokio_util::time::FutureExt as _;

const TTL: Duration = Duration::from_secs(10);
/// A hang guard, far above what each wait takes here.
const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn acquire_all_holds_every_key_and_releases_them_together() {
    let fx = Fixture::new("multi_all").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let group = a.acquire_all(["c", "a", "b"]).await.unwrap();
    let keys: Vec<&LeaseKey> = group.leases().iter().map(|l| l.key()).collect();
    assert_eq!(keys, ["a", "b", "c"], "in key order");
    for lease in group.leases() {
        let doc = fx.doc(lease.key().as_str().unwrap()).await;
        assert_eq!(doc.get_str("aid").unwrap(), a.owner_id());
        assert_eq!(doc.get_i64("tok").unwrap() as u64, lease.fencing_token());
    }
    assert_eq!(group.get("b").unwrap().key(), "b");
    assert!(b.try_acquire_all(["b", "z"]).await.unwrap().is_none());
    assert!(!group.status().is_lost());
    assert_eq!(group.release().await.unwrap(), ReleaseOutcome::Released);
    for key in ["a", "b", "c"] {
        assert!(fx.doc(key).await.get("lid").is_none(), "{key} released");
    }
    let all = b.try_acquire_all(["a", "b", "c", "z"]).await.unwrap();
    assert!(all.is_some(), "free again for another manager");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn managers_over_overlapping_keys_in_opposite_orders_never_deadlock() {
    let fx = Fixture::new("multi_order").await;
    let managers = fx.managers(3, TTL).await;
    let orders = [["x", "y", "z"], ["z", "y", "x"], ["y", "z", "x"]];
    let rounds = managers
        .iter()
        .zip(orders)
        .map(|(manager, order)| async move {
            let mut tokens = Vec::new();
            for _ in 0..10 {
                let group = manager.acquire_all(order).await.unwrap();
                tokens.push(group.get("y").unwrap().fencing_token());
                tokio::task::yield_now().await;
                assert_eq!(group.release().await.unwrap(), ReleaseOutcome::Released);
            }
            tokens
        });
    let tokens = within(
        LIMIT,
        "30 groups in opposite orders",
        futures::future::join_all(rounds),
    )
    .await;
    let mut all: Vec<u64> = tokens.into_iter().flatten().collect();
    all.sort();
    all.dedup();
    assert_eq!(all.len(), 30, "every group held y under its own token");
    for manager in managers {
        manager.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn try_acquire_all_gives_back_what_it_took_before_it_returns() {
    let fx = Fixture::new("multi_try").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let held = b.acquire("b").await.unwrap();
    assert!(a.try_acquire_all(["c", "b", "a"]).await.unwrap().is_none());
    // "a" was taken first (key order) and released before the answer.
    assert!(fx.doc("a").await.get("lid").is_none(), "a given back");
    assert!(
        fx.raw()
            .find_one(mongodb::bson::doc! {"_id": "c"})
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_acquire_all_given_up_leaves_no_key_held() {
    let fx = Fixture::new("multi_timeout").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let held = b.acquire("b").await.unwrap();
    let waited = a
        .acquire_all(["a", "b"])
        .into_future()
        .timeout(Duration::from_millis(300))
        .await;
    assert!(waited.is_err(), "b is held");
    eventually("a is given back", LIMIT, || async {
        fx.doc("a").await.get("lid").is_none()
    })
    .await;
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_loss_of_one_key_ends_the_whole_group() {
    let fx = Fixture::new("multi_loss").await;
    let (a, operator) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let group = a.acquire_all(["a", "b", "c"]).await.unwrap();
    let token = group.status().cancellation_token();
    operator.force_release("b").await.unwrap().expect("held");
    within(LIMIT, "the group told lost", token.cancelled()).await;
    for lease in group.leases() {
        within(LIMIT, "every member told lost", lease.status().lost()).await;
    }
    assert_eq!(
        group.status().lost_reason(),
        Some(LossReason::ForceReleased)
    );
    let first = group.get("a").unwrap().status().lost_reason();
    assert_eq!(
        first,
        Some(LossReason::GroupLost {
            key: "b".into(),
            reason: Box::new(LossReason::ForceReleased)
        })
    );
    // The others are released on the server: another owner takes them.
    let others = within(LIMIT, "the other keys", operator.acquire_all(["a", "c"])).await;
    let others = others.unwrap().release().await.unwrap();
    assert_eq!(others, ReleaseOutcome::Released);
    assert_eq!(group.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
    a.shutdown().await.unwrap();
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_key_lists_are_refused_before_anything_is_sent() {
    let fx = Fixture::new("multi_input").await;
    let manager = fx.manager(TTL).await;
    let none: [&str; 0] = [];
    let empty = manager.acquire_all(none).await;
    assert!(matches!(empty, Err(Error::InvalidKey { .. })), "{empty:?}");
    let twice = manager.try_acquire_all(["a", "b", "a"]).await;
    assert!(matches!(twice, Err(Error::InvalidKey { .. })), "{twice:?}");
    let bad = manager.acquire_all(["a", ""]).await;
    assert!(matches!(bad, Err(Error::InvalidKey { .. })), "{bad:?}");
    let refused = manager
        .acquire_all(["a"])
        .caller(CallerId::new())
        .reentrant()
        .await;
    assert!(
        matches!(refused, Err(Error::InvalidConfig { .. })),
        "{refused:?}"
    );
    let count = fx
        .raw()
        .count_documents(mongodb::bson::doc! {})
        .await
        .unwrap();
    assert_eq!(count, 0, "nothing was written");
    manager.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_caller_that_holds_one_of_the_keys_is_refused_and_keeps_its_lease() {
    let fx = Fixture::new("multi_holder").await;
    let manager = fx.manager(TTL).await;
    let caller = CallerId::new();
    let lease = manager.acquire("b").caller(caller).await.unwrap();
    let refused = within(
        LIMIT,
        "a refusal",
        manager.acquire_all(["a", "b"]).caller(caller),
    )
    .await;
    assert!(
        matches!(refused, Err(Error::AlreadyHeld { .. })),
        "{refused:?}"
    );
    assert!(fx.doc("a").await.get("lid").is_none(), "a given back");
    assert!(!lease.status().is_lost());
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}
