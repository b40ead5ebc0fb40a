//! Several permits of a semaphore in one lease (`Semaphore::acquire().permits(k)`)
//! across managers: all or none, never more permits taken than the
//! semaphore has, a waiter for several served when enough are free, and
//! bad counts refused before anything is sent.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongo_lease::{Error, ReleaseOutcome, Semaphore};

use crate::common::Fixture;

const TTL: Duration = Duration::from_secs(10);
/// A hang guard only: each step takes milliseconds.
const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn k_permits_are_taken_all_or_none_across_managers() {
    let fx = Fixture::new("sem_many").await;
    let [a, b, c] = fx.managers(3, TTL).await.try_into().unwrap();
    let (sa, sb, sc) = (
        Semaphore::new(&a, "slots", 3).unwrap(),
        Semaphore::new(&b, "slots", 3).unwrap(),
        Semaphore::new(&c, "slots", 3).unwrap(),
    );
    let two = sa.acquire().permits(2).await.unwrap();
    assert_eq!(sb.available().await.unwrap(), 1);
    // Two more are not free: nothing is taken.
    assert!(sb.try_acquire().permits(2).await.unwrap().is_none());
    assert_eq!(sc.available().await.unwrap(), 1);
    let info = c.inspect("slots").await.unwrap().unwrap();
    let taken: Vec<u32> = info.holders.iter().map(|h| h.permits).collect();
    assert_eq!(taken, [2]);

    // A waiter for two, in another process, while one more is taken.
    let waiting = {
        let sb = sb.clone();
        tokio::spawn(async move { sb.acquire().permits(2).await.unwrap() })
    };
    let one = sc.acquire().await.unwrap();
    assert_eq!(sc.available().await.unwrap(), 0);
    assert_eq!(two.release().await.unwrap(), ReleaseOutcome::Released);
    let b_two = crate::common::within(LIMIT, "the waiter's two permits", waiting)
        .await
        .unwrap();
    let info = c.inspect("slots").await.unwrap().unwrap();
    let mut taken: Vec<(String, u32)> = info
        .holders
        .iter()
        .map(|h| (h.owner_id.clone(), h.permits))
        .collect();
    taken.sort();
    let mut expected = vec![(b.owner_id().to_string(), 2), (c.owner_id().to_string(), 1)];
    expected.sort();
    assert_eq!(taken, expected);
    assert!(b_two.fencing_token() > one.fencing_token());
    assert_eq!(b_two.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(one.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(sa.available().await.unwrap(), 3);
    for manager in [a, b, c] {
        manager.shutdown().await.unwrap();
    }
}

/// Tasks of three managers take 1, 2 or 3 permits of 4 in turn: the
/// permits inside never exceed 4, and every task gets its permits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_taking_one_to_three_of_four_permits_never_exceed_four() {
    let fx = Fixture::new("sem_many_bound").await;
    let managers = fx.managers(3, TTL).await;
    // (permits inside now, the most ever)
    let inside = Arc::new(Mutex::new((0u32, 0u32)));
    let mut tasks = Vec::new();
    for (m, manager) in managers.iter().enumerate() {
        for k in 1..=3u32 {
            let semaphore = Semaphore::new(manager, "pool", 4).unwrap();
            let inside = inside.clone();
            tasks.push(tokio::spawn(async move {
                for _ in 0..3 {
                    let lease = semaphore.acquire().permits(k).await.unwrap();
                    {
                        let mut inside = inside.lock().unwrap();
                        inside.0 += k;
                        inside.1 = inside.1.max(inside.0);
                    }
                    tokio::time::sleep(Duration::from_millis(5 * (m as u64 + 1))).await;
                    inside.lock().unwrap().0 -= k;
                    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
                }
            }));
        }
    }
    for task in tasks {
        crate::common::within(LIMIT, "every task's permits", task)
            .await
            .unwrap();
    }
    let (now, most) = *inside.lock().unwrap();
    assert_eq!(now, 0);
    assert!(most <= 4, "{most} permits of 4 taken at once");
    for manager in managers {
        manager.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_number_of_permits_is_refused_before_anything_is_sent() {
    let fx = Fixture::new("sem_many_bad").await;
    let manager = fx.manager(TTL).await;
    let semaphore = Semaphore::new(&manager, "bad", 3).unwrap();
    for k in [0, 4] {
        match semaphore.acquire().permits(k).await {
            Err(Error::InvalidConfig { reason }) => {
                assert!(reason.contains("1 to 3 permits"), "{reason}")
            }
            other => panic!("{k} permits of 3: {other:?}"),
        }
        assert!(matches!(
            semaphore.try_acquire().permits(k).await,
            Err(Error::InvalidConfig { .. })
        ));
    }
    assert!(matches!(
        manager.acquire("x").permits(2).await,
        Err(Error::InvalidConfig { .. })
    ));
    assert!(
        manager.inspect("bad").await.unwrap().is_none(),
        "nothing written"
    );
    manager.shutdown().await.unwrap();
}
