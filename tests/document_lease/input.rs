//! Unusual user input to in-document leases: update pipelines that name the
//! lease's reserved temporary field, values that read like lock-field paths,
//! a document to create that a unique index refuses.

use std::time::Duration;

use mongo_lease::{DocumentUpdate, Error, ReleaseOutcome};
use mongodb::bson::doc;

use crate::common::Fixture;
use crate::support::{connect_as, item_and_holder, items, stored, work_items};

/// A pipeline that writes the field where the lease keeps its lock field
/// while the user's stages run would decide what the lock field becomes (a
/// value of foreign layout: the document locked for good). It is refused
/// before anything is sent; the lease and the document stay as they were,
/// and the next owner takes the document after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_naming_the_reserved_field_is_refused_and_the_lock_field_stays_ours() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dreserved").await;
    let (manager, handle) = item_and_holder(&fx, doc! { "_id": "item", "state": "new" }, TTL).await;
    let mut item = handle.acquire("item").await.unwrap();
    let before = stored(&fx, "item").await;

    let update: DocumentUpdate = vec![doc! { "$set": {
        "__mongo_lease__lease": "mine, hands off",
        "state": "forged",
    }}]
    .into();
    let result = item.update(update).await.cloned();
    assert!(
        matches!(&result, Err(Error::InvalidUpdate { reason }) if reason.contains("reserved")),
        "{result:?}"
    );
    let after = stored(&fx, "item").await;
    assert_eq!(after, before, "nothing written");
    assert!(!item.lease().status().is_lost());

    item.commit(vec![doc! { "$set": { "state": "done" } }])
        .await
        .unwrap();
    let next = handle
        .try_acquire("item")
        .await
        .unwrap()
        .expect("free after the commit");
    assert_eq!(next.document(), &doc! { "_id": "item", "state": "done" });
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// `$set`, `$push` and other operators take the user's values, which may be
/// any string, also the lock field's name or a path inside it; only
/// `$rename`'s values are paths.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_value_that_reads_like_the_lock_field_is_written_as_the_users_data() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dvalue").await;
    let (manager, handle) = item_and_holder(&fx, doc! { "_id": "item", "log": [] }, TTL).await;
    let item = handle.acquire("item").await.unwrap();
    let done = item
        .commit(doc! {
            "$set": { "field": "_lease", "path": "_lease.lid" },
            "$push": { "log": "_lease" },
        })
        .await
        .unwrap();
    let expected =
        doc! { "_id": "item", "log": ["_lease"], "field": "_lease", "path": "_lease.lid" };
    assert_eq!(done, expected);
    let mut now = stored(&fx, "item").await;
    now.remove("_lease");
    assert_eq!(now, expected);
    manager.shutdown().await.unwrap();
}

/// A pipeline that writes the reserved temporary field under a name it
/// computes (which no check of its text can see) still cannot leave a lock
/// field of foreign layout: the lock field is restored from the temporary
/// field only if that still holds this lease's owner id and token; else the
/// lease ends released (the write applies, the lease is lost), and the next
/// owner takes the document with a greater token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_that_overwrites_the_reserved_field_by_a_computed_name_loses_only_the_lease() {
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dcomputed").await;
    let (manager, handle) = item_and_holder(&fx, doc! { "_id": "item", "n": 0 }, TTL).await;
    let mut item = handle.acquire("item").await.unwrap();
    let token = item.lease().fencing_token();

    let computed = doc! { "$arrayToObject": [[{
        "k": { "$concat": ["__mongo_", "lease__lease"] },
        "v": "mine, hands off",
    }]]};
    let written = item
        .update(vec![
            doc! { "$set": { "n": 1 } },
            doc! { "$replaceWith": { "$mergeObjects": ["$$ROOT", computed] } },
        ])
        .await
        .unwrap()
        .clone();
    assert_eq!(written, doc! { "_id": "item", "n": 1 });
    let now = stored(&fx, "item").await;
    let lock = now
        .get_document("_lease")
        .unwrap_or_else(|_| panic!("a lock field of foreign layout: {now}"));
    assert_eq!(
        lock.get_i64("tok").ok(),
        i64::try_from(token).ok(),
        "{lock}"
    );
    assert!(!lock.contains_key("lid"), "{lock}");
    assert_eq!(now.len(), 3, "no temporary field left: {now}");

    let other = connect_as(&fx, "other", TTL).await;
    let next = work_items(&other)
        .await
        .try_acquire("item")
        .await
        .unwrap()
        .expect("free for the next owner");
    assert!(next.lease().fencing_token() > token);
    assert_eq!(next.release().await.unwrap(), ReleaseOutcome::Released);
    drop(item);
    manager.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}

/// A document to create that a unique index of the user's collection
/// (other than `_id`'s) refuses: `InvalidUpdate`, nothing written, and the
/// manager keeps serving the document (an acquire with other fields
/// creates it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_document_to_create_that_a_unique_index_refuses_is_invalid_and_nothing_is_written() {
    use mongodb::IndexModel;
    use mongodb::options::IndexOptions;
    const TTL: Duration = Duration::from_secs(30);
    let fx = Fixture::new("dunique").await;
    items(&fx)
        .create_index(
            IndexModel::builder()
                .keys(doc! { "code": 1 })
                .options(IndexOptions::builder().unique(true).build())
                .build(),
        )
        .await
        .unwrap();
    let (manager, handle) = item_and_holder(&fx, doc! { "_id": "a", "code": 1 }, TTL).await;

    let result = handle.try_acquire("b").create(doc! { "code": 1 }).await;
    assert!(
        matches!(&result, Err(Error::InvalidUpdate { reason }) if reason.contains("unique index")),
        "{result:?}"
    );
    assert_eq!(items(&fx).count_documents(doc! {}).await.unwrap(), 1);

    let item = handle
        .try_acquire("b")
        .create(doc! { "code": 2 })
        .await
        .unwrap()
        .expect("created");
    assert_eq!(item.document(), &doc! { "_id": "b", "code": 2 });
    assert_eq!(item.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}
