//! Re-entry on a real mongod: a second acquisition of a key by the holder of
//! a lease on it never waits on itself. With `Acquire::reentrant` it
//! re-enters the lease (same fencing token, counted, no write), without it
//! it fails at once; `Lease::reenter` counts an entry from the handle.

use crate::common;

use std::time::Duration;

use common::{Fixture, within};
use mongo_lease::{CallerId, Error, LossReason, ReleaseOutcome};

/// Long enough that no heartbeat renews during a test (heartbeat: 20 s).
const TTL: Duration = Duration::from_secs(60);
/// A hang guard, far above what each wait takes here.
const LIMIT: Duration = Duration::from_secs(20);

#[tokio::test]
async fn a_holder_re_enters_its_lease_with_the_same_token_and_no_write() {
    let fx = Fixture::new("reenter_same").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let manager = mongo_lease::LeaseManager::connect(options).await.unwrap();
    let other = fx.manager(TTL).await;
    let caller = CallerId::new();
    let outer = manager
        .acquire("job")
        .caller(caller)
        .reentrant()
        .await
        .unwrap();
    let stored = fx.doc("job").await;
    log.clear();

    let inner = within(
        LIMIT,
        "re-entry",
        manager.acquire("job").caller(caller).reentrant(),
    )
    .await
    .unwrap();
    let tried = manager
        .try_acquire("job")
        .caller(caller)
        .reentrant()
        .await
        .unwrap()
        .expect("a try re-enters too");
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    assert_eq!(tried.fencing_token(), outer.fencing_token());
    let writes: Vec<String> = log
        .all()
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| !name.starts_with("ok:") && name != "getMore")
        .collect();
    assert!(writes.is_empty(), "re-entry sent {writes:?}");

    // Released entry by entry: the key stays held until the last one.
    assert_eq!(outer.release().await.unwrap(), ReleaseOutcome::StillHeld);
    assert_eq!(tried.release().await.unwrap(), ReleaseOutcome::StillHeld);
    assert_eq!(
        fx.doc("job").await,
        stored,
        "an entry's release writes nothing"
    );
    assert!(other.try_acquire("job").await.unwrap().is_none());
    assert_eq!(inner.release().await.unwrap(), ReleaseOutcome::Released);
    let next = other.try_acquire("job").await.unwrap().expect("released");
    assert!(next.fencing_token() > stored.get_i64("tok").unwrap() as u64);
    manager.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_second_acquire_by_its_holder_fails_at_once_unless_reentrant() {
    let fx = Fixture::new("reenter_refused").await;
    let manager = fx.manager(TTL).await;
    let caller = CallerId::new();
    let lease = manager.acquire("job").caller(caller).await.unwrap();

    let again = within(LIMIT, "a refusal", manager.acquire("job").caller(caller)).await;
    assert!(
        matches!(&again, Err(Error::AlreadyHeld { key }) if key == "job"),
        "{again:?}"
    );
    let tried = manager.try_acquire("job").caller(caller).await;
    assert!(matches!(tried, Err(Error::AlreadyHeld { .. })), "{tried:?}");
    // Another kind cannot re-enter: refused too, even when reentrant.
    let shared = manager.acquire("job").caller(caller).reentrant().shared();
    let other_kind = within(LIMIT, "a refusal", shared).await;
    assert!(
        matches!(other_kind, Err(Error::AlreadyHeld { .. })),
        "{other_kind:?}"
    );
    // Another caller id is another caller: it waits for the lease as before.
    assert!(
        manager
            .try_acquire("job")
            .caller(CallerId::new())
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

#[tokio::test]
async fn acquires_of_one_caller_waiting_together_never_wait_on_each_other() {
    let fx = Fixture::new("reenter_waiting").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let blocker = b.acquire("job").await.unwrap();
    let caller = CallerId::new();
    // Three acquisitions of one caller wait behind another manager's lease.
    let waiting = async {
        tokio::join!(
            a.acquire("job").caller(caller).reentrant(),
            a.acquire("job").caller(caller).reentrant(),
            a.acquire("job").caller(caller),
        )
    };
    let release = async {
        tokio::task::yield_now().await;
        blocker.release().await.unwrap()
    };
    let ((first, second, third), _) = within(LIMIT, "the caller's acquisitions", async {
        tokio::join!(waiting, release)
    })
    .await;
    let (first, second) = (first.unwrap(), second.unwrap());
    assert_eq!(
        first.fencing_token(),
        second.fencing_token(),
        "one lease, re-entered"
    );
    assert!(matches!(third, Err(Error::AlreadyHeld { .. })), "{third:?}");
    drop(first);
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn lease_reenter_keeps_the_key_until_the_last_entry_is_released() {
    let fx = Fixture::new("reenter_handle").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let lease = a.acquire("job").await.unwrap();
    let entry = lease.reenter().unwrap();
    assert_eq!(entry.fencing_token(), lease.fencing_token());
    let task = tokio::spawn(async move { entry.release().await });
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::StillHeld);
    // Until the spawned entry is released, nobody else gets the key: the
    // release answered `StillHeld`, and the document still has a lease id.
    let entry_released = within(LIMIT, "the entry's release", task).await.unwrap();
    assert_eq!(entry_released.unwrap(), ReleaseOutcome::Released);
    assert!(b.try_acquire("job").await.unwrap().is_some());
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_loss_ends_every_entry_at_once() {
    let fx = Fixture::new("reenter_loss").await;
    // A short TTL: the holder learns of the force release at its next
    // renewal (1 s) if its change stream was not open yet.
    let ttl = Duration::from_secs(3);
    let (a, operator) = (fx.manager(ttl).await, fx.manager(ttl).await);
    let caller = CallerId::new();
    let outer = a.acquire("job").caller(caller).reentrant().await.unwrap();
    let inner = a.acquire("job").caller(caller).reentrant().await.unwrap();
    let entry = inner.reenter().unwrap();
    operator.force_release("job").await.unwrap().expect("held");
    within(LIMIT, "the outer entry told", outer.status().lost()).await;
    within(LIMIT, "the inner entry told", inner.status().lost()).await;
    within(LIMIT, "the third entry told", entry.status().lost()).await;
    assert_eq!(
        entry.status().lost_reason(),
        Some(LossReason::ForceReleased)
    );
    assert!(matches!(entry.reenter(), Err(Error::LeaseLost { .. })));
    for lease in [outer, inner, entry] {
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
    }
    a.shutdown().await.unwrap();
    operator.shutdown().await.unwrap();
}

#[tokio::test]
async fn reentrant_without_a_caller_id_is_refused_before_anything_is_sent() {
    let fx = Fixture::new("reenter_config").await;
    let manager = fx.manager(TTL).await;
    let refused = manager.acquire("job").reentrant().await;
    assert!(
        matches!(refused, Err(Error::InvalidConfig { .. })),
        "{refused:?}"
    );
    let none = fx
        .raw()
        .find_one(mongodb::bson::doc! { "_id": "job" })
        .await
        .unwrap();
    assert!(none.is_none(), "nothing was written: {none:?}");
    manager.shutdown().await.unwrap();
}
