//! Shared/exclusive (read/write) keys across managers: shared holders
//! overlap, an exclusive holder excludes everyone, a waiting exclusive
//! acquirer is not starved, a lost shared lease's token fires.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongo_lease::{LeaseKind, ReleaseOutcome};
use mongodb::bson::doc;
use tokio_util::sync::CancellationToken;
use tokio_util::time::FutureExt as _;

use crate::common::Fixture;
use crate::support::LIVENESS;

const TTL: Duration = Duration::from_secs(10);

/// Two managers hold the key shared at once: the second acquisition
/// returns while the first lease is held, both show in `inspect` as live
/// holders, and an exclusive acquirer is refused meanwhile.
#[tokio::test]
async fn shared_holders_of_two_managers_hold_the_key_at_once() {
    let fx = Fixture::new("shared_overlap").await;
    let (a, b, c) = (
        fx.manager(TTL).await,
        fx.manager(TTL).await,
        fx.manager(TTL).await,
    );
    let first = a.acquire("catalogue").shared().await.unwrap();
    let second = tokio::time::timeout(LIVENESS, b.acquire("catalogue").shared())
        .await
        .expect("the second shared acquisition waited for the first")
        .unwrap();
    assert_eq!(
        (first.kind(), second.kind()),
        (LeaseKind::Shared, LeaseKind::Shared)
    );
    assert!(
        !first.status().is_lost() && !second.status().is_lost(),
        "both held at once"
    );
    assert!(second.fencing_token() > first.fencing_token());
    let info = c.inspect("catalogue").await.unwrap().unwrap();
    assert!(info.held);
    assert_eq!(info.kind, LeaseKind::Shared);
    let holders: Vec<_> = info
        .holders
        .iter()
        .map(|h| (h.owner_id.as_str(), h.fencing_token))
        .collect();
    assert_eq!(
        holders,
        [
            (a.owner_id(), first.fencing_token()),
            (b.owner_id(), second.fencing_token())
        ]
    );
    // A third shared holder, in the same manager as the first, also joins.
    let third = a
        .try_acquire("catalogue")
        .shared()
        .await
        .unwrap()
        .expect("shared");
    assert!(
        c.try_acquire("catalogue").await.unwrap().is_none(),
        "exclusive refused"
    );
    for lease in [first, second, third] {
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    }
    let exclusive = c.try_acquire("catalogue").await.unwrap().expect("free");
    assert_eq!(exclusive.kind(), LeaseKind::Exclusive);
    drop(exclusive);
    for m in [a, b, c] {
        m.shutdown().await.unwrap();
    }
}

/// An exclusive holder excludes shared and exclusive acquirers of other
/// managers (and of its own); once it releases, a shared acquirer gets the key.
#[tokio::test]
async fn an_exclusive_holder_excludes_shared_and_exclusive_acquirers() {
    let fx = Fixture::new("shared_excluded").await;
    let (a, b) = (fx.manager(TTL).await, fx.manager(TTL).await);
    let writer = a.acquire("catalogue").await.unwrap();
    assert!(b.try_acquire("catalogue").shared().await.unwrap().is_none());
    assert!(b.try_acquire("catalogue").await.unwrap().is_none());
    assert!(a.try_acquire("catalogue").shared().await.unwrap().is_none());
    // A waiting shared acquirer does not get it either (it times out while
    // the exclusive lease is held; the bound is not a verdict on speed).
    assert!(
        b.acquire("catalogue")
            .shared()
            .into_future()
            .timeout(Duration::from_millis(300))
            .await
            .ok()
            .transpose()
            .unwrap()
            .is_none()
    );
    assert!(!writer.status().is_lost());
    let info = b.inspect("catalogue").await.unwrap().unwrap();
    assert_eq!(
        (info.kind, info.owner_id.as_str()),
        (LeaseKind::Exclusive, a.owner_id())
    );
    assert!(info.holders.is_empty());
    let token = writer.fencing_token();
    assert_eq!(writer.release().await.unwrap(), ReleaseOutcome::Released);
    let reader = tokio::time::timeout(LIVENESS, b.acquire("catalogue").shared())
        .await
        .expect("hang")
        .expect("free after the exclusive release");
    assert_eq!(reader.kind(), LeaseKind::Shared);
    assert!(reader.fencing_token() > token);
    drop(reader);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// What the loop of shared acquirers saw, in its own (sequential) order.
#[derive(Debug, Default)]
struct Readers {
    /// Tokens of the shared acquisitions that succeeded, in order.
    acquired: Vec<u64>,
    /// Index in `acquired` at the loop's first refusal (the writer's mark).
    first_refusal: Option<usize>,
    refusals: usize,
}

/// Writer preference: two managers keep the key shared with overlapping
/// holders (each new shared lease acquired before the previous one is
/// released), and an exclusive acquirer in a third manager still gets it.
/// Its waiting mark stops new shared acquisitions: from the loop's first
/// refusal (read in the document: the writer's mark `xw`), no shared
/// acquisition succeeds until the writer has held the key and released it
/// (every later shared token is greater than the writer's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_exclusive_waiter_gets_the_key_while_shared_acquirers_keep_arriving() {
    /// Shared acquisitions before the writer starts.
    const WARM_UP: usize = 5;
    /// Pace of the loop's attempts once refused: no verdict rests on it.
    const PACE: Duration = Duration::from_millis(5);
    let fx = Fixture::new("shared_writer").await;
    let readers = [fx.manager(TTL).await, fx.manager(TTL).await];
    let writer = fx.manager(TTL).await;
    let seen: Arc<Mutex<Readers>> = Arc::default();
    let stop = CancellationToken::new();
    let (count_tx, mut count_rx) = tokio::sync::watch::channel(0_usize);
    let raw = fx.raw();
    let writer_id = writer.owner_id().to_owned();
    let first = readers[0].acquire("catalogue").shared().await.unwrap();
    let reading = {
        let (readers, seen, stop) = (readers.clone(), seen.clone(), stop.clone());
        tokio::spawn(async move {
            let mut previous = Some(first);
            let mut turn = 1;
            while !stop.is_cancelled() {
                let manager = &readers[turn % 2];
                turn += 1;
                match manager.try_acquire("catalogue").shared().await.unwrap() {
                    Some(next) => {
                        let count = {
                            let mut seen_now = seen.lock().unwrap();
                            seen_now.acquired.push(next.fencing_token());
                            seen_now.acquired.len()
                        };
                        count_tx.send_replace(count);
                        // Overlap: the next one is in before this one leaves.
                        if let Some(previous) = previous.replace(next) {
                            assert_eq!(previous.release().await.unwrap(), ReleaseOutcome::Released);
                        }
                    }
                    None => {
                        let first_refusal = {
                            let mut seen_now = seen.lock().unwrap();
                            seen_now.refusals += 1;
                            let at = seen_now.acquired.len();
                            seen_now.first_refusal.get_or_insert(at);
                            seen_now.refusals == 1
                        };
                        if first_refusal {
                            // The previous shared lease is still held, so no
                            // exclusive lease can hold the key: the refusal is
                            // the writer's waiting mark.
                            let doc = raw
                                .find_one(doc! { "_id": "catalogue" })
                                .await
                                .unwrap()
                                .unwrap();
                            let mark = doc.get_document("xw").unwrap_or_else(|_| {
                                panic!("refused without a waiting mark: {doc}")
                            });
                            assert_eq!(mark.get_str("aid").unwrap(), writer_id);
                            assert!(previous.as_ref().is_some_and(|p| !p.status().is_lost()));
                        }
                        // Leave, so that the key drains.
                        if let Some(previous) = previous.take() {
                            assert_eq!(previous.release().await.unwrap(), ReleaseOutcome::Released);
                        }
                        tokio::time::sleep(PACE).await;
                    }
                }
            }
            if let Some(previous) = previous {
                assert_eq!(previous.release().await.unwrap(), ReleaseOutcome::Released);
            }
        })
    };
    tokio::time::timeout(LIVENESS, count_rx.wait_for(|n| *n >= WARM_UP))
        .await
        .expect("the shared holders did not get going")
        .unwrap();
    let exclusive = tokio::time::timeout(LIVENESS, writer.acquire("catalogue"))
        .await
        .expect("the exclusive waiter was starved by the shared acquirers")
        .unwrap();
    let writer_token = exclusive.fencing_token();
    assert!(!exclusive.status().is_lost());
    let info = writer.inspect("catalogue").await.unwrap().unwrap();
    assert_eq!(info.kind, LeaseKind::Exclusive);
    assert!(
        info.holders.is_empty(),
        "no shared holder beside the writer"
    );
    // Shared acquirers keep arriving while the writer holds the key: they
    // are refused (the tokens checked below show that none got in).
    let refusals = seen.lock().unwrap().refusals;
    crate::common::eventually(
        "shared acquirers refused while the writer holds the key",
        LIVENESS,
        || {
            let now = seen.lock().unwrap().refusals;
            async move { now >= refusals + 3 }
        },
    )
    .await;
    assert!(!exclusive.status().is_lost());
    assert_eq!(exclusive.release().await.unwrap(), ReleaseOutcome::Released);
    // The loop gets the key shared again after the writer's release.
    let after = seen.lock().unwrap().acquired.len();
    tokio::time::timeout(LIVENESS, count_rx.wait_for(|n| *n > after))
        .await
        .expect("the shared acquirers never got the key back")
        .unwrap();
    stop.cancel();
    tokio::time::timeout(LIVENESS, reading)
        .await
        .expect("the loop did not stop")
        .unwrap();

    let seen = std::mem::take(&mut *seen.lock().unwrap());
    let first_refusal = seen.first_refusal.expect("the loop was never refused");
    assert!(first_refusal >= WARM_UP, "{seen:?}");
    let late: Vec<_> = seen.acquired[first_refusal..]
        .iter()
        .filter(|t| **t < writer_token)
        .collect();
    assert!(
        late.is_empty(),
        "shared acquisitions {late:?} succeeded after the writer's mark, before the \
         writer (token {writer_token}) held the key: {seen:?}"
    );
    assert!(seen.acquired.last().is_some_and(|t| *t > writer_token));
    eprintln!(
        "{} shared acquisitions, writer's mark met at the {}th, {} refusals",
        seen.acquired.len(),
        first_refusal,
        seen.refusals
    );
    for m in readers.into_iter().chain([writer]) {
        m.shutdown().await.unwrap();
    }
}

/// A shared lease released by an operator's `force_release` (from another
/// manager) is lost: its token fires, and so does the other shared
/// holder's; the key is then free for an exclusive acquirer.
#[tokio::test]
async fn a_force_released_shared_lease_is_lost_and_its_token_fires() {
    let fx = Fixture::new("shared_force").await;
    // No lock-delay (docs/lock-delay.md): a force-released key is free at once.
    let mut options = fx.options(TTL).await;
    options.lock_delay = Some(std::time::Duration::ZERO);
    let (a, b, operator) = (
        fx.manager(TTL).await,
        fx.manager(TTL).await,
        mongo_lease::LeaseManager::connect(options).await.unwrap(),
    );
    let reader_a = a.acquire("catalogue").shared().await.unwrap();
    let reader_b = b.acquire("catalogue").shared().await.unwrap();
    let was = operator
        .force_release("catalogue")
        .immediately()
        .await
        .unwrap()
        .expect("the key was held");
    assert_eq!(was.kind, LeaseKind::Shared);
    assert_eq!(was.holders.len(), 2);
    for lease in [&reader_a, &reader_b] {
        tokio::time::timeout(LIVENESS, lease.status().lost())
            .await
            .expect("the lost shared lease's token did not fire");
    }
    assert_eq!(
        reader_a.release().await.unwrap(),
        ReleaseOutcome::AlreadyLost
    );
    let exclusive = operator
        .try_acquire("catalogue")
        .await
        .unwrap()
        .expect("free after the force release");
    assert!(exclusive.fencing_token() > reader_b.fencing_token());
    drop(reader_b);
    drop(exclusive);
    for m in [a, b, operator] {
        m.shutdown().await.unwrap();
    }
}
