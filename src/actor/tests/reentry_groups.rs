//! Re-entry and groups in the actor (`reentry.rs`, `lease_group.rs`),
//! under the paused clock: a re-entry costs no call of the store, and a
//! group's loss ends its other leases in the same step and releases them
//! (the simulation's property 9 covers the other paths: local deadlines,
//! takeovers, force releases).

use super::*;
use crate::caller::CallerId;
use crate::status::LossReason;

#[tokio::test(start_paused = true)]
async fn a_re_entry_and_an_entrys_release_call_no_store() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let caller = CallerId::new();
    let outer = a.acquire("k").caller(caller).reentrant().await.unwrap();
    let (acquires, releases) = (store.calls(Op::Acquire), store.calls(Op::Release));
    let inner = a.acquire("k").caller(caller).reentrant().await.unwrap();
    let entry = outer.reenter().unwrap();
    assert_eq!(inner.release().await.unwrap(), ReleaseOutcome::StillHeld);
    drop(entry);
    assert_eq!(outer.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(
        store.calls(Op::Acquire),
        acquires,
        "no acquire for the entries"
    );
    assert_eq!(
        store.calls(Op::Release),
        releases + 1,
        "one release, the last"
    );
    assert_released(&db, "k");
}

#[tokio::test(start_paused = true)]
async fn a_group_lease_deleted_by_someone_else_ends_the_group_at_once() {
    let db = MemoryDb::new();
    let (a, _, _) = start_watching_held(&db, "a");
    let group = a.acquire_all(["g1", "g2", "g3"]).await.unwrap();
    let t = Instant::now();
    db.delete("g2");
    soon(group.status().lost()).await;
    assert_eq!(Instant::now(), t, "in the step that found g2 gone");
    for lease in group.leases() {
        assert!(lease.status().is_lost(), "{} told", lease.key());
    }
    assert_eq!(group.status().lost_reason(), Some(LossReason::Deleted));
    settle().await;
    assert_released(&db, "g1");
    assert_released(&db, "g3");
    assert_eq!(group.release().await.unwrap(), ReleaseOutcome::AlreadyLost);
}
