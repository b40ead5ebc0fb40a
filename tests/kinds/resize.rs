//! The number of permits of a semaphore changed while permits are held
//! (`Semaphore::set_permits`), across managers: refused while more are
//! held than the new number, then set for everyone; waiters asking for the
//! old number are told the new one at once; the manager that holds permits
//! and changes the number takes more of the new one.

use std::time::Duration;

use mongo_lease::{Error, LeaseKind, PermitsChange, ReleaseOutcome, Semaphore};

use crate::common::Fixture;

const TTL: Duration = Duration::from_secs(10);
/// A hang guard only: each step takes milliseconds.
const LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_number_of_permits_changes_for_every_process_when_no_more_are_held() {
    let fx = Fixture::new("sem_resize").await;
    let [a, b, c] = fx.managers(3, TTL).await.try_into().unwrap();
    let mut sa = Semaphore::new(&a, "pool", 2).unwrap();
    let sb = Semaphore::new(&b, "pool", 2).unwrap();
    let mut sc = Semaphore::new(&c, "pool", 2).unwrap();
    let two = sa.acquire().permits(2).await.unwrap();
    // b waits for a permit of 2 (whether its first attempt runs before
    // the change or after, it ends the same way).
    let waiting = {
        let sb = sb.clone();
        tokio::spawn(async move { sb.acquire().await })
    };

    // Not below what is held.
    assert_eq!(
        sc.set_permits(1).await.unwrap(),
        PermitsChange::TooManyHeld { held: 2 }
    );
    assert_eq!(sc.permits(), 2, "unchanged");
    // The holder grows it to 3 and takes the third itself.
    assert_eq!(sa.set_permits(3).await.unwrap(), PermitsChange::Set);
    assert_eq!(sa.permits(), 3);
    let info = c.inspect("pool").await.unwrap().unwrap();
    assert_eq!(info.kind, LeaseKind::Permit { permits: 3 });
    let third = crate::common::within(LIMIT, "a third permit", sa.acquire())
        .await
        .unwrap();
    // b's waiter asked for 2: told that the key has 3 now (the change
    // announces itself as a release, which wakes it).
    match crate::common::within(LIMIT, "the old number's waiter", waiting)
        .await
        .unwrap()
    {
        Err(Error::KindMismatch { stored, requested }) => {
            assert_eq!(stored, LeaseKind::Permit { permits: 3 });
            assert_eq!(requested, LeaseKind::Permit { permits: 2 });
        }
        other => panic!("a waiter of the old number: {other:?}"),
    }
    // c follows: full at 3.
    assert_eq!(sc.set_permits(3).await.unwrap(), PermitsChange::Set);
    assert!(sc.try_acquire().await.unwrap().is_none());
    assert_eq!(two.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(third.release().await.unwrap(), ReleaseOutcome::Released);
    // Nothing held: nothing stored, the next acquisition sets its own number.
    assert_eq!(sc.set_permits(5).await.unwrap(), PermitsChange::NothingHeld);
    let one = sb.acquire().await.unwrap();
    assert_eq!(one.kind(), LeaseKind::Permit { permits: 2 });
    assert_eq!(one.release().await.unwrap(), ReleaseOutcome::Released);
    for manager in [a, b, c] {
        manager.shutdown().await.unwrap();
    }
}
