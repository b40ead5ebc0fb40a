//! A released permit wakes a waiter in another process through the change
//! stream, not through its next poll.

use std::time::Duration;

use mongo_lease::{LeaseKind, LeaseManager, ReleaseOutcome, Semaphore};
use tokio::time::Instant;

use crate::common::{self, Fixture};

/// The waiter's backoff (`retry_initial` and `retry_max`): 1 h. Capped by
/// the remaining time of the permit it waits for (TTL 300 s), its next poll
/// is still minutes away, so only the release's change event can wake it
/// within the hang guard below.
const POLL: Duration = Duration::from_secs(3600);
const TTL: Duration = Duration::from_secs(300);
/// A hang guard only: the handoff takes milliseconds.
const HANDOFF_LIMIT: Duration = Duration::from_secs(60);

#[tokio::test]
async fn a_released_permit_wakes_another_managers_waiter_at_once() {
    let fx = Fixture::new("sem_wake").await;
    let holder = fx.manager(TTL).await;
    let pool = Semaphore::new(&holder, "pool", 2).unwrap();
    let first = pool.acquire().await.unwrap();
    let second = pool.acquire().await.unwrap();

    let (mut options, log) = fx.monitored_options(TTL, "").await;
    options.retry_initial = POLL;
    options.retry_max = POLL;
    let waiter = LeaseManager::connect(options).await.unwrap();
    let waiting = {
        let pool = Semaphore::new(&waiter, "pool", 2).unwrap();
        tokio::spawn(async move {
            let permit = pool.acquire().await.unwrap();
            (Instant::now(), permit)
        })
    };
    common::eventually("the waiter's change stream is open", HANDOFF_LIMIT, || {
        let opened = log.count("ok:aggregate");
        async move { opened >= 1 }
    })
    .await;
    // Writes before the stream opened were not announced, so its opening
    // retries the key at once; that attempt finds it full too.
    common::eventually("the retry when the stream opened", HANDOFF_LIMIT, || {
        let back = log.count("ok:findAndModify");
        async move { back >= 2 }
    })
    .await;
    assert_eq!(log.count("findAndModify"), 2, "two attempts so far");
    assert!(!waiting.is_finished(), "the key is full");

    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    let released_at = Instant::now();
    let (acquired_at, permit) = tokio::time::timeout(HANDOFF_LIMIT, waiting)
        .await
        .expect("the release did not wake the waiter")
        .unwrap();
    assert_eq!(
        log.count("findAndModify"),
        3,
        "the first attempt, the one when the stream opened, then the one the release woke"
    );
    assert_eq!(permit.kind(), LeaseKind::Permit { permits: 2 });
    assert!(!first.status().is_lost(), "the other permit is still held");
    eprintln!(
        "cross-process permit handoff after release: {:?}",
        acquired_at - released_at
    );
    assert_eq!(permit.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    holder.shutdown().await.unwrap();
    waiter.shutdown().await.unwrap();
}
