//! Cooperative revocation (docs/revocation.md): another manager asks the
//! holder of a key to release it; the holder's lease events carry the
//! request, the holder releases, and the asking manager gets the key.

use crate::common;

use std::time::Duration;

use common::{Fixture, within};
use futures::StreamExt;
use mongo_lease::{LeaseEvent, ReleaseOutcome};

const TTL: Duration = Duration::from_secs(10);
/// Hang guard (the request arrives within a heartbeat, 1/3 of the TTL, here:
/// the holder merely holds, so it reads requests at its heartbeat).
const GUARD: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_request_reaches_the_holder_which_releases_to_the_asker() {
    let fx = Fixture::new("revocation").await;
    let [holder, asker] = [fx.manager(TTL).await, fx.manager(TTL).await];
    assert!(
        !asker.request_release("job").await.unwrap(),
        "nothing holds it"
    );

    let lease = holder.acquire("job").await.unwrap();
    let mut events = lease.status().events();
    let wait = tokio::spawn({
        let asker = asker.clone();
        async move { asker.acquire("job").await }
    });
    assert!(asker.request_release("job").await.unwrap());
    let doc = fx.doc("job").await;
    assert_eq!(
        doc.get_document("rv").unwrap().get_str("aid").unwrap(),
        asker.owner_id()
    );
    // Renewals go on meanwhile: only the request is awaited.
    let by = within(GUARD, "the request", async {
        loop {
            match events.next().await {
                Some(LeaseEvent::RevocationRequested { by }) => break by,
                Some(LeaseEvent::Renewed { .. } | LeaseEvent::AtRisk { .. }) => {}
                other => panic!("{other:?}"),
            }
        }
    })
    .await;
    assert_eq!(by, asker.owner_id());
    assert!(!lease.status().is_lost(), "a request takes nothing away");
    let token = lease.fencing_token();
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    let next = within(GUARD, "the asker's grant", wait)
        .await
        .unwrap()
        .unwrap();
    assert!(next.fencing_token() > token);
    assert!(
        !fx.doc("job").await.contains_key("rv"),
        "a new acquisition clears it"
    );
    for m in [holder, asker] {
        m.shutdown().await.unwrap();
    }
}
