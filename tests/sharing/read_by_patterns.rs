//! Our leases as the patterns' own clients see them, with default options
//! in a collection `connect` finds shared with them (their lock document,
//! or their TTL index), where it chooses delete mode: held while we hold,
//! free at once once we release,
//! and free to them once a crashed holder's lease has expired by their
//! reading (pattern 2: at its `exp`; patterns 1 and 3: once a TTL index
//! deletes it). Each client is played by its exact commands
//! (`common::others`).

use std::time::Duration;

use mongo_lease::LeaseManager;
use mongodb::bson::Document;

use crate::common::Fixture;
use crate::common::others::{
    foreign_insert, pattern1_indexes, pattern2_lock, pattern3_index, pattern3_lock,
};

/// A liveness bound: only turns a hang into a failure.
const WAIT: Duration = Duration::from_secs(60);
/// The leases' TTL: short, so that a crashed holder's lease expires soon.
const TTL: Duration = Duration::from_secs(2);

/// `obtained_at + ttl` seconds is `exp`, and `obtained_at` is `ts`: the
/// restated fields of a lease document of ours.
fn assert_restated(doc: &Document) {
    let ms = |name: &str| doc.get_datetime(name).unwrap().timestamp_millis();
    let ttl = doc.get_f64("ttl").expect("a double ttl");
    assert_eq!(ms("obtained_at"), ms("ts"), "{doc}");
    assert_eq!(
        ms("obtained_at") + (ttl * 1000.0).round() as i64,
        ms("exp"),
        "{doc}"
    );
    assert!(doc.get("value").is_none(), "{doc}");
}

/// Waits for a renewal of the lease on `key` at least 1 s after its
/// acquisition by the server's clock: its token is then old enough for
/// delete mode to delete the document in the release itself (a younger
/// one's is deleted 1 s after its acquisition).
async fn token_a_second_old(fx: &Fixture, key: &str) {
    crate::common::eventually("a renewal 1 s after the acquisition", WAIT, || async {
        let doc = fx.doc(key).await;
        let ms = |name: &str| doc.get_datetime(name).unwrap().timestamp_millis();
        ms("ts") >= ms("acq") + 1_000
    })
    .await;
}

/// A crashed process's lease on `key`, acquired and never released.
fn crashed_holder(fx: &Fixture, key: &'static str) {
    fx.crashed_process(TTL, move |m: LeaseManager| async move {
        std::mem::forget(m.acquire(key).await.expect("acquire"));
    });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pattern_2s_client_finds_our_lease_held_until_released_or_expired() {
    let fx = Fixture::new("read_by_p2").await;
    // Its lock on another key: `connect` sees the collection shared.
    assert!(pattern2_lock(&fx, "theirs", "node-9", 600).await);
    let m = fx.manager(TTL).await;

    let lease = m.acquire("k").await.unwrap();
    let acquired = fx.doc("k").await;
    assert_restated(&acquired);
    assert!(!pattern2_lock(&fx, "k", "node-7", 10).await, "held");
    // A renewal restates them too.
    crate::common::eventually("a renewal", WAIT, || async {
        fx.doc("k").await.get("ts") != acquired.get("ts")
    })
    .await;
    assert_restated(&fx.doc("k").await);
    assert!(!pattern2_lock(&fx, "k", "node-7", 10).await, "held");

    assert!(!lease.release().await.unwrap().was_lost());
    crate::common::eventually("released: free to it", WAIT, || async {
        pattern2_lock(&fx, "k", "node-7", 10).await
    })
    .await;
    assert!(m.try_acquire("k").await.unwrap().is_none(), "its lock now");

    crashed_holder(&fx, "c");
    let exp = fx
        .doc("c")
        .await
        .get_datetime("exp")
        .unwrap()
        .timestamp_millis();
    assert!(
        !pattern2_lock(&fx, "c", "node-7", 10).await,
        "held until it expires"
    );
    crate::common::eventually("expired: free to it", WAIT, || async {
        pattern2_lock(&fx, "c", "node-7", 10).await
    })
    .await;
    let taken = fx.doc("c").await;
    let at = taken
        .get_datetime("obtained_at")
        .unwrap()
        .timestamp_millis();
    assert!(at > exp, "taken over at {at}, before our lease's exp {exp}");
    // Its lock, beside the fields of the lease it took over: held for us.
    let info = m.inspect("c").await.unwrap().expect("its lock");
    assert!(
        info.foreign && info.held && info.owner_id == "node-7",
        "{info:?}"
    );
    assert!(m.try_acquire("c").await.unwrap().is_none());
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pattern_1s_client_finds_our_lease_held_until_released_or_deleted_by_its_index() {
    let fx = Fixture::new("read_by_p1").await;
    pattern1_indexes(&fx, Duration::from_secs(3)).await;
    let m = fx.manager(TTL).await;

    let lease = m.acquire("k").await.unwrap();
    assert!(!foreign_insert(&fx, "k").await, "held: E11000");
    token_a_second_old(&fx, "k").await;
    assert!(!lease.release().await.unwrap().was_lost());
    // `connect` chose delete mode: the release deleted the document.
    assert!(
        foreign_insert(&fx, "k").await,
        "released: free to it at once"
    );

    crashed_holder(&fx, "c");
    assert!(!foreign_insert(&fx, "c").await, "held");
    // Its TTL index on `ts` deletes the crashed holder's document.
    crate::common::eventually("deleted by its index: free to it", WAIT, || async {
        foreign_insert(&fx, "c").await
    })
    .await;
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pattern_3s_client_finds_our_lease_held_until_released_or_deleted_by_the_gc_index() {
    let fx = Fixture::new("read_by_p3").await;
    pattern3_index(&fx).await;
    let mut options = fx.options(TTL).await;
    options.gc_grace = Duration::from_secs(1);
    let m = LeaseManager::connect(options).await.unwrap();
    let minute = Duration::from_secs(60);

    let lease = m.acquire("k").await.unwrap();
    assert!(
        !pattern3_lock(&fx, "k", minute).await,
        "held: the document exists"
    );
    token_a_second_old(&fx, "k").await;
    assert!(!lease.release().await.unwrap().was_lost());
    assert!(
        pattern3_lock(&fx, "k", minute).await,
        "released: free to it at once"
    );

    crashed_holder(&fx, "c");
    assert!(!pattern3_lock(&fx, "c", minute).await, "held");
    // The GC index on `exp` deletes it `gc_grace` after its expiry.
    crate::common::eventually("deleted by the GC index: free to it", WAIT, || async {
        pattern3_lock(&fx, "c", minute).await
    })
    .await;
    m.shutdown().await.unwrap();
}
