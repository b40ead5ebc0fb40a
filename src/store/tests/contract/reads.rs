//! Reads: listing leases page by page.

use super::{Fixture, take};
use crate::key::LeaseKey;
use crate::store::{Store, StoreExt};

pub(super) async fn list_pages_through_leases_in_key_order<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    take(&a, "k1").await;
    let (l2, _) = take(&b, "k2").await;
    take(&a, "k3").await;
    take(&b, "k4").await;
    f.put_foreign("k5", "other-app").await;
    assert_eq!(b.release_by_id(vec![l2]).await.unwrap(), 1);

    let mut seen = Vec::new();
    let mut after = None;
    loop {
        let (page, next) = a.list(after, 2).await.unwrap();
        assert!(page.len() <= 2);
        seen.extend(
            page.into_iter()
                .map(|i| (i.key, i.owner_id, i.held, i.foreign)),
        );
        match next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    let expected = [
        ("k1", "a", true, false),
        ("k2", "b", false, false),
        ("k3", "a", true, false),
        ("k4", "b", true, false),
        ("k5", "other-app", true, true),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(k, o, h, f)| (LeaseKey::from(*k), o.to_string(), *h, *f))
        .collect();
    assert_eq!(seen, expected, "a foreign lock is listed as held");
    assert!(a.inspect("none".into()).await.unwrap().is_none());
}
