//! `DocumentLeases::inspect`: a document's lease read with the server's
//! clock, as `LeaseManager::inspect` reads a key; `DocumentLease::into_parts`.

use std::time::Duration;

use mongodb::bson::doc;

use crate::common::Fixture;
use crate::support::{connect_as, item_and_holder, items, work_items};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_who_holds_a_documents_lease_and_nothing_for_an_unleased_one() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dinspect").await;
    items(&fx)
        .insert_many([
            doc! { "_id": "item", "state": "new" },
            doc! { "_id": "theirs", "_lease": "mine, hands off" },
        ])
        .await
        .unwrap();
    let manager = connect_as(&fx, "holder", TTL).await;
    let handle = work_items(&manager).await;

    assert_eq!(handle.inspect("item").await.unwrap(), None, "never leased");
    assert_eq!(
        handle.inspect("missing").await.unwrap(),
        None,
        "no document"
    );
    // The lock collection knows nothing of a document's lease.
    let item = handle.acquire("item").await.unwrap();
    assert_eq!(manager.inspect("item").await.unwrap(), None);

    let info = handle.inspect("item").await.unwrap().expect("a held lease");
    assert!(info.held, "{info:?}");
    assert!(!info.foreign, "{info:?}");
    assert_eq!(info.owner_id, manager.owner_id());
    assert_eq!(info.fencing_token, item.lease().fencing_token());
    assert!(info.time_to_expiry() > Duration::ZERO);
    assert!(info.time_to_expiry() <= TTL);

    item.commit(doc! { "$set": { "state": "done" } })
        .await
        .unwrap();
    // Just released: no lock field, or one in the released state.
    if let Some(info) = handle.inspect("item").await.unwrap() {
        assert!(!info.held, "{info:?}");
    }

    let foreign = handle
        .inspect("theirs")
        .await
        .unwrap()
        .expect("a foreign holder's lock");
    assert!(foreign.foreign, "{foreign:?}");
    assert!(foreign.held, "{foreign:?}");
    manager.shutdown().await.unwrap();
}

/// `DocumentLease::into_parts`: the document by value, and the lease, still
/// held until released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn into_parts_gives_the_document_and_the_lease_which_stays_held_until_released() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dparts").await;
    let (manager, handle) = item_and_holder(&fx, doc! { "_id": "item", "state": "new" }, TTL).await;
    let item = handle.acquire("item").await.unwrap();
    let token = item.lease().fencing_token();

    let (lease, document) = item.into_parts();
    assert_eq!(document, doc! { "_id": "item", "state": "new" });
    assert_eq!(lease.fencing_token(), token);
    let info = handle.inspect("item").await.unwrap().expect("held");
    assert!(info.held && info.fencing_token == token, "{info:?}");
    assert!(handle.try_acquire("item").await.unwrap().is_none());

    assert_eq!(
        lease.release().await.unwrap(),
        mongo_lease::ReleaseOutcome::Released
    );
    let next = handle
        .try_acquire("item")
        .await
        .unwrap()
        .expect("free once released");
    assert!(next.lease().fencing_token() > token);
    drop(next);
    manager.shutdown().await.unwrap();
}
