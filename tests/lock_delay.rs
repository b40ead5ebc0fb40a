//! Lock-delay (docs/lock-delay.md): after an operator ends a live lease
//! (force release, release by owner id), nobody is granted its key for the
//! operator's manager's lock-delay, by the server's clock; its default is
//! the safety margin.

mod common;

use std::time::Duration;

use common::{Fixture, within};
use mongo_lease::{Error, LeaseManager};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(10);
/// Hang guard of the waits below (each takes at most the delay and a
/// heartbeat here).
const GUARD: Duration = Duration::from_secs(60);
/// How far the server's `$$NOW` may step back between two writes
/// (docs/mongodb-behaviour.md, B3): the grant may come that much early.
const STEP_BACK: Duration = Duration::from_millis(50);

async fn operator(fx: &Fixture, delay: Option<Duration>) -> LeaseManager {
    let mut options = fx.options(TTL).await;
    options.lock_delay = delay;
    LeaseManager::connect(options).await.expect("connect")
}

/// A force release: the holder is told lost at its next renewal, a waiter
/// of another manager gets the key only once the delay has passed, with a
/// greater fencing token; the document shows `nb`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_key_is_granted_again_only_after_the_lock_delay() {
    const DELAY: Duration = Duration::from_millis(1500);
    let fx = Fixture::new("delay_force").await;
    let [holder, waiter] = [fx.manager(TTL).await, fx.manager(TTL).await];
    let op = operator(&fx, Some(DELAY)).await;
    assert_eq!(op.lock_delay(), DELAY);
    let lease = holder.acquire("job").await.unwrap();
    let wait = tokio::spawn({
        let waiter = waiter.clone();
        async move { waiter.acquire("job").await }
    });
    let start = Instant::now();
    let before = op
        .force_release("job")
        .immediately()
        .await
        .unwrap()
        .expect("held");
    assert_eq!(before.fencing_token, lease.fencing_token());
    let doc = fx.doc("job").await;
    assert_eq!(doc.get("nb"), doc.get("exp"), "{doc}");
    assert!(!doc.contains_key("lid"), "{doc}");
    // Nothing more to end: the delay stays.
    assert!(op.force_release("job").await.unwrap().is_none());
    assert!(waiter.try_acquire("job").await.unwrap().is_none());

    let next = within(GUARD, "the waiter's grant", wait)
        .await
        .unwrap()
        .unwrap();
    assert!(
        start.elapsed() + STEP_BACK >= DELAY,
        "granted {:?} after the force release",
        start.elapsed()
    );
    assert!(next.fencing_token() > lease.fencing_token());
    within(GUARD, "the holder told lost", lease.lost()).await;
    assert!(
        !fx.doc("job").await.contains_key("nb"),
        "a new acquisition removes nb"
    );
    for m in [holder, waiter, op] {
        m.shutdown().await.unwrap();
    }
}

/// A release by owner id delays every live lease of that owner, and no
/// waiting manager (registered in the key's queue) is handed one early.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_by_owner_delays_each_live_lease_it_ends() {
    const DELAY: Duration = Duration::from_millis(1500);
    let fx = Fixture::new("delay_owner").await;
    let [holder, waiter] = [fx.manager(TTL).await, fx.manager(TTL).await];
    let op = operator(&fx, Some(DELAY)).await;
    let a = holder.acquire("a").await.unwrap();
    let b = holder.acquire("b").await.unwrap();
    let waits: Vec<_> = ["a", "b"]
        .map(|key| {
            let waiter = waiter.clone();
            tokio::spawn(async move { waiter.acquire(key).await })
        })
        .into();
    // Registered in the queue: a release would hand it the key at once.
    common::eventually("the waiter registered on a", GUARD, || async {
        fx.doc("a")
            .await
            .get_array("q")
            .is_ok_and(|q| !q.is_empty())
    })
    .await;
    let start = Instant::now();
    assert_eq!(
        op.release_owner(holder.owner_id())
            .immediately()
            .await
            .unwrap(),
        2
    );
    for (wait, old) in waits.into_iter().zip([&a, &b]) {
        let next = within(GUARD, "a waiter's grant", wait)
            .await
            .unwrap()
            .unwrap();
        assert!(
            start.elapsed() + STEP_BACK >= DELAY,
            "{:?}",
            start.elapsed()
        );
        assert!(next.fencing_token() > old.fencing_token());
    }
    for m in [holder, waiter, op] {
        m.shutdown().await.unwrap();
    }
}

/// The default lock-delay is the manager's safety margin (a tenth of its
/// TTL by default); zero frees the key at once; more than an hour is
/// refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_delay_defaults_to_the_safety_margin_and_zero_frees_at_once() {
    let fx = Fixture::new("delay_default").await;
    let default = fx.manager(TTL).await;
    assert_eq!(default.lock_delay(), TTL / 10);
    let mut options = fx.options(TTL).await;
    options.safety_margin = Some(Duration::from_millis(700));
    let margin = LeaseManager::connect(options).await.unwrap();
    assert_eq!(margin.lock_delay(), Duration::from_millis(700));

    let none = operator(&fx, Some(Duration::ZERO)).await;
    let lease = default.acquire("k").await.unwrap();
    assert!(
        none.force_release("k")
            .immediately()
            .await
            .unwrap()
            .is_some()
    );
    let next = margin
        .try_acquire("k")
        .await
        .unwrap()
        .expect("free at once");
    assert!(next.fencing_token() > lease.fencing_token());

    let mut options = fx.options(TTL).await;
    options.lock_delay = Some(Duration::from_secs(7200));
    match LeaseManager::connect(options).await {
        Err(Error::InvalidConfig { reason }) => assert!(reason.contains("lock_delay"), "{reason}"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    for m in [default, margin, none] {
        m.shutdown().await.unwrap();
    }
}
