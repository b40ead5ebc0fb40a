//! Revocation ("Revocation" in `store`): a request on a key held now marks
//! it, is announced to the stream of writes as a request (not as a write
//! that may take a lease away), changes no lease, and is refused on a free
//! key.

use crate::store::StoreExt;
use std::time::Duration;

use futures::StreamExt;

use super::{Fixture, raw, take};
use crate::store::{Announced, Announcement, Store};

/// Hang guard of the stream's next item (milliseconds here).
const GUARD: Duration = Duration::from_secs(30);

pub(super) async fn a_release_request_is_announced_and_changes_no_lease<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    let mut announcements = a.watch_releases(Announced::Writes);
    let first = tokio::time::timeout(GUARD, announcements.next())
        .await
        .unwrap();
    assert!(matches!(first, Some(Ok(Announcement::Opened))), "{first:?}");
    let (la, ta) = take(&a, "k").await;
    let before = raw(f, "k").await;
    assert!(b.request_release("k".into()).await.unwrap());
    assert_eq!(raw(f, "k").await, before, "no lease field changed");
    assert!(
        a.renew(vec![la.clone()]).await.unwrap().is_empty(),
        "still held"
    );
    loop {
        let next = tokio::time::timeout(GUARD, announcements.next())
            .await
            .unwrap();
        match next {
            Some(Ok(Announcement::RevocationRequested { key, by })) => {
                assert_eq!((key, by.as_str()), ("k".into(), "b"));
                break;
            }
            // The acquisition itself.
            Some(Ok(Announcement::Write(write))) if write.token == Some(ta) => {}
            other => panic!("{other:?}"),
        }
    }
    // Nothing to ask of a free key.
    assert_eq!(a.release_by_id(vec![la]).await.unwrap(), 1);
    assert!(!b.request_release("k".into()).await.unwrap());
    assert!(!b.request_release("missing".into()).await.unwrap());
}
