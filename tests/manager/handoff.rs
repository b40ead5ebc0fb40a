//! The handoff to a local waiter against a real mongod: the release of a
//! lease that a task of the same manager waits for makes that task the
//! holder in the releasing write itself.

use crate::common;

use std::future::IntoFuture;
use std::time::Duration;

use common::Fixture;
use mongo_lease::{LeaseManager, ReleaseOutcome};

const TTL: Duration = Duration::from_secs(10);
/// A hang guard only: a handoff takes milliseconds.
const BOUND: Duration = Duration::from_secs(30);

/// Whether a command the manager sent is a write that takes or gives back
/// a lease: a `findAndModify`, an `insert` or `delete`, or an `update` that
/// removes fields (a release; a renewal only sets `ts` and `exp`).
fn is_lease_write(name: &str, command: &mongodb::bson::Document) -> bool {
    match name {
        "findAndModify" | "insert" | "delete" => true,
        "update" => format!("{command}").contains("$unset"),
        _ => false,
    }
}

#[tokio::test]
async fn a_local_handoff_is_one_write_and_the_next_holder_gets_a_greater_token() {
    let fx = Fixture::new("handoff").await;
    let (options, log) = fx.monitored_options(TTL, "").await;
    let manager = LeaseManager::connect(options).await.unwrap();
    let first = manager.acquire("k").await.unwrap();
    let (queued_tx, queued_rx) = tokio::sync::oneshot::channel::<()>();
    let waiting = tokio::spawn({
        let manager = manager.clone();
        async move {
            let acquire = manager.acquire("k").into_future();
            tokio::pin!(acquire);
            // The first poll sends the request; then report that it is queued.
            assert!(futures::poll!(&mut acquire).is_pending());
            queued_tx.send(()).unwrap();
            acquire.await
        }
    });
    common::within(BOUND, "the waiter's first attempt", queued_rx)
        .await
        .unwrap();
    log.clear();
    let first_token = first.fencing_token();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    let second = tokio::time::timeout(BOUND, waiting)
        .await
        .expect("the waiter got the key")
        .unwrap()
        .unwrap();
    let writes: Vec<String> = log
        .all()
        .into_iter()
        .filter(|(name, command)| is_lease_write(name, command))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(writes, ["findAndModify"], "one write per handoff");
    assert!(second.fencing_token() > first_token);
    let doc = fx.doc("k").await;
    assert_eq!(doc.get_i64("tok").unwrap() as u64, second.fencing_token());
    assert_eq!(doc.get_str("aid").unwrap(), manager.owner_id());
    assert!(!doc.contains_key("wt") && !doc.contains_key("yu"));
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(!fx.doc("k").await.contains_key("lid"));
    manager.shutdown().await.unwrap();
}
