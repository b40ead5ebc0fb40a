//! The waiting owners a read shows (`LeaseInfo::waiters`): the live
//! entries of the queue in order, then an exclusive waiter's mark on a
//! shared key; a lapsed registration is not shown.

use crate::store::StoreExt;

use uuid::Uuid;

use super::kinds::{held_as, shape, take_as};
use super::{Fixture, stores, take};
use crate::info::LeaseInfo;
use crate::kind::LeaseKind;
use crate::store::{AcquireOutcome, Store};

fn owners(info: &LeaseInfo) -> Vec<&str> {
    info.waiters.iter().map(|w| w.owner_id.as_str()).collect()
}

async fn inspect(store: &impl Store, key: &str) -> LeaseInfo {
    store
        .inspect(key.into())
        .await
        .unwrap()
        .expect("a lock document")
}

pub(super) async fn a_read_shows_the_registered_owners_in_order_then_an_exclusive_mark<
    F: Fixture,
>(
    f: &F,
) {
    let [a, b, c] = stores(f, ["a", "b", "c"]).await;
    let (la, _) = take(&a, "k").await;
    assert!(inspect(&a, "k").await.waiters.is_empty());
    for store in [&b, &c] {
        let outcome = store.attempt("k".into(), Uuid::new_v4(), true).await;
        assert!(
            matches!(outcome, Ok(AcquireOutcome::Held { .. })),
            "{outcome:?}"
        );
    }
    // A try (not waiting) registers nothing.
    let [d] = stores(f, ["d"]).await;
    d.attempt("k".into(), Uuid::new_v4(), false).await.unwrap();
    let info = inspect(&a, "k").await;
    assert_eq!(owners(&info), ["b", "c"]);
    for w in &info.waiters {
        assert_eq!(w.kind, LeaseKind::Exclusive);
        assert!(w.registered_at.is_some_and(|at| at <= info.server_time));
        assert!(w.expires_at > info.server_time);
    }
    assert!(info.waiters[0].registered_at <= info.waiters[1].registered_at);
    let listed = a.list(None, 10).await.unwrap().0;
    assert_eq!(owners(&listed[0]), ["b", "c"]);
    // The release hands the key to b, which leaves the queue.
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    assert_eq!(owners(&inspect(&a, "k").await), ["c"]);
    // A lapsed registration is not shown.
    f.lapse_registrations("k").await;
    assert!(inspect(&a, "k").await.waiters.is_empty());

    // An exclusive waiter on a shared key: its mark, without a place.
    take_as(&a, "s", shape(LeaseKind::Shared)).await;
    held_as(&b, "s", shape(LeaseKind::Exclusive), true, "a").await;
    let info = inspect(&c, "s").await;
    assert_eq!(owners(&info), ["b"]);
    assert_eq!(info.waiters[0].registered_at, None);
    f.expire_mark("s").await;
    assert!(inspect(&c, "s").await.waiters.is_empty());

    // A shared acquisition of a free key drops its queue (the whole
    // document is rewritten as a shared key's).
    let (lq, _) = take(&a, "q").await;
    for store in [&b, &d] {
        let outcome = store.attempt("q".into(), Uuid::new_v4(), true).await;
        assert!(
            matches!(outcome, Ok(AcquireOutcome::Held { .. })),
            "{outcome:?}"
        );
    }
    assert_eq!(owners(&inspect(&c, "q").await), ["b", "d"]);
    // Handed to b; d waits on; b's lease expires unconfirmed.
    assert_eq!(a.release_by_id(vec![lq]).await.unwrap(), 1);
    assert_eq!(owners(&inspect(&c, "q").await), ["d"]);
    f.expire("q").await;
    take_as(&c, "q", shape(LeaseKind::Shared)).await;
    assert!(inspect(&c, "q").await.waiters.is_empty());
}
