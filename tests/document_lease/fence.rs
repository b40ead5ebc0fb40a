//! The fence helper: single-document writes that apply only under a token
//! not smaller than the stored one.

use mongo_lease::{Fence, ReleaseOutcome};
use mongodb::Collection;
use mongodb::bson::{Document, doc};

use crate::common::Fixture;
use crate::support::LONG_TTL as TTL;

/// The user's write to `results` document `id`, fenced by `fence` on the
/// field `fence`: sets `by`, counts `writes`. The number of documents it
/// matched.
async fn fenced_write(results: &Collection<Document>, id: &str, fence: Fence, by: &str) -> u64 {
    let mut filter = doc! { "_id": id };
    filter.extend(fence.filter("fence"));
    let update = fence
        .update_with(
            "fence",
            doc! { "$set": { "by": by }, "$inc": { "writes": 1 } },
        )
        .unwrap();
    results
        .update_one(filter, update)
        .await
        .expect("the fenced write")
        .matched_count
}

async fn read(results: &Collection<Document>, id: &str) -> Document {
    results
        .find_one(doc! { "_id": id })
        .await
        .unwrap()
        .expect("the result document")
}

/// A holder whose lease was taken over writes late: its token is smaller
/// than the one the new holder stored, so its write matches nothing and the
/// data stays as the new holder left it. The new holder's write, over the
/// old holder's stored token, applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_token_write_is_refused_and_the_newer_holders_write_applies() {
    let fx = Fixture::new("fence_stale").await;
    let old = fx.manager(TTL).await;
    let new = fx.manager(TTL).await;
    let results = fx.db.collection::<Document>("results");
    results
        .insert_one(doc! { "_id": "job", "writes": 0 })
        .await
        .unwrap();

    let stale = old.acquire("job").await.unwrap();
    assert_eq!(fenced_write(&results, "job", stale.fence(), "old").await, 1);
    // The old holder pauses past its TTL; another manager takes over.
    let fresh = fx.take_over("job", &new).await;
    assert!(fresh.fencing_token() > stale.fencing_token());
    assert_eq!(
        fenced_write(&results, "job", fresh.fence(), "new").await,
        1,
        "a greater token than the stored one applies"
    );
    let before = read(&results, "job").await;

    assert_eq!(
        fenced_write(&results, "job", stale.fence(), "old, late").await,
        0,
        "a smaller token than the stored one is refused"
    );
    assert_eq!(read(&results, "job").await, before, "nothing changed");
    assert_eq!(
        before,
        doc! { "_id": "job", "writes": 2, "by": "new", "fence": fresh.fencing_token() as i64 }
    );
    assert_eq!(fresh.release().await.unwrap(), ReleaseOutcome::Released);
    drop(stale);
    new.shutdown().await.unwrap();
    old.shutdown().await.unwrap();
}

/// The same token again (a retry, or the write after a claim under one
/// lease) applies again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn equal_token_write_applies_again() {
    let fx = Fixture::new("fence_equal").await;
    let manager = fx.manager(TTL).await;
    let results = fx.db.collection::<Document>("results");
    results
        .insert_one(doc! { "_id": "job", "writes": 0 })
        .await
        .unwrap();
    let lease = manager.acquire("job").await.unwrap();

    assert_eq!(
        fenced_write(&results, "job", lease.fence(), "claim").await,
        1
    );
    assert_eq!(
        fenced_write(&results, "job", lease.fence(), "write").await,
        1
    );
    assert_eq!(
        read(&results, "job").await,
        doc! { "_id": "job", "writes": 2, "by": "write", "fence": lease.fencing_token() as i64 }
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// A document that stores no token yet accepts the write, which stores the
/// token (an int64); a document whose token field is not a number refuses
/// every write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absent_token_field_applies_and_a_non_numeric_one_refuses() {
    let fx = Fixture::new("fence_absent").await;
    let manager = fx.manager(TTL).await;
    let results = fx.db.collection::<Document>("results");
    results
        .insert_many([
            doc! { "_id": "fresh", "writes": 0 },
            doc! { "_id": "odd", "writes": 0, "fence": "not a token" },
        ])
        .await
        .unwrap();
    let lease = manager.acquire("job").await.unwrap();

    assert_eq!(fenced_write(&results, "fresh", lease.fence(), "a").await, 1);
    let fresh = read(&results, "fresh").await;
    assert_eq!(
        fresh.get_i64("fence").unwrap() as u64,
        lease.fencing_token(),
        "the token is stored as an int64: {fresh}"
    );
    assert_eq!(fenced_write(&results, "odd", lease.fence(), "a").await, 0);
    assert_eq!(
        read(&results, "odd").await,
        doc! { "_id": "odd", "writes": 0, "fence": "not a token" }
    );
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}

/// The fragments alone, on an embedded field and in an update pipeline: a
/// token of another process (`Fence::new`) below the stored one is refused,
/// one above applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fence_of_a_token_from_elsewhere_guards_an_embedded_field_and_a_pipeline() {
    let fx = Fixture::new("fence_frag").await;
    let results = fx.db.collection::<Document>("results");
    results
        .insert_one(doc! { "_id": "r", "meta": { "fence": 10_i64 }, "v": 0 })
        .await
        .unwrap();
    let write = |fence: Fence, v: i32| {
        let results = results.clone();
        async move {
            let mut filter = doc! { "_id": "r" };
            filter.extend(fence.filter("meta.fence"));
            results
                .update_one(
                    filter,
                    vec![doc! { "$set": { "v": v } }, fence.update("meta.fence")],
                )
                .await
                .unwrap()
                .matched_count
        }
    };
    assert_eq!(write(Fence::new(9).unwrap(), 1).await, 0);
    assert_eq!(write(Fence::new(10).unwrap(), 2).await, 1);
    assert_eq!(write(Fence::new(11).unwrap(), 3).await, 1);
    assert_eq!(write(Fence::new(10).unwrap(), 4).await, 0);
    assert_eq!(
        read(&results, "r").await,
        doc! { "_id": "r", "meta": { "fence": 11_i64 }, "v": 3 }
    );
}
