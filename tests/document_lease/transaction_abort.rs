//! The transaction helper when the caller's callback fails: the transaction
//! is aborted, nothing of it is written, the callback's error comes back
//! (run once: it is not transient), and the lease stays held.

use std::sync::atomic::{AtomicU32, Ordering};

use futures::FutureExt;
use mongo_lease::{Error, ReleaseOutcome};
use mongodb::bson::doc;

use crate::common::Fixture;
use crate::support::{LONG_TTL as TTL, items_count, seed_txn_items};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_callback_aborts_the_transaction_and_writes_nothing() {
    let fx = Fixture::new("txn_abort").await;
    let manager = fx.manager(TTL).await;
    let items = seed_txn_items(&fx, doc! { "_id": 1, "n": 0 }).await;
    let lease = manager.acquire("job").await.unwrap();
    let lock_before = fx.doc("job").await;
    let runs = AtomicU32::new(0);

    let result = lease
        .with_transaction(&fx.client, (&items, &runs), |session, (items, runs)| {
            async move {
                runs.fetch_add(1, Ordering::SeqCst);
                items
                    .update_one(doc! { "_id": 1 }, doc! { "$inc": { "n": 1 } })
                    .session(&mut *session)
                    .await?;
                items
                    .insert_one(doc! { "_id": 2 })
                    .session(&mut *session)
                    .await?;
                // A duplicate `_id`: a plain error, not a transient one.
                items
                    .insert_one(doc! { "_id": 2 })
                    .session(&mut *session)
                    .await?;
                Ok(())
            }
            .boxed()
        })
        .await;

    assert!(matches!(result, Err(Error::Database(_))), "{result:?}");
    assert_eq!(runs.load(Ordering::SeqCst), 1, "not retried");
    assert_eq!(items_count(&fx).await, 1);
    assert_eq!(
        items.find_one(doc! { "_id": 1 }).await.unwrap().unwrap(),
        doc! { "_id": 1, "n": 0 },
        "the callback's first write was aborted with the rest"
    );
    assert!(!lease.status().is_lost());
    assert_eq!(fx.doc("job").await, lock_before, "the lock was not written");
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    manager.shutdown().await.unwrap();
}
