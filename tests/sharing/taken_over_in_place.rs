//! A lease document of ours that the `{_id, value, ttl, obtained_at}`
//! pattern's client (npm `distributed-locks-mongodb`, played by its exact
//! commands) took over in place, keeping our fields beside its own: our
//! garbage-collection index spares its lock, and it may delete the document
//! only once the next acquisition's fencing token is sure to be greater
//! ("Garbage collection" and "Read by other clients" in `docs/protocol.md`).

use std::time::Duration;

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::bson::{Document, doc};
use mongodb::{Client, Collection};

use crate::common::clock::{ClockOffset, until_server_offset};
use crate::common::others::pattern2_lock;
use crate::common::{Clients, Fixture, eventually, pattern2_client, within};

/// A hang guard only: each wait below takes at most a few seconds.
const LIMIT: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(2);
/// Pattern 2's own lock duration, in seconds: far longer than the test.
const PATTERN_2_TTL: i32 = 600;

/// `metrics.ttl.passes` of the server behind `client`: how many passes its
/// TTL monitor has completed.
async fn ttl_passes(client: &Client) -> i64 {
    let status = client
        .database("admin")
        .run_command(doc! { "serverStatus": 1 })
        .await
        .expect("serverStatus");
    let passes = status
        .get_document("metrics")
        .and_then(|m| m.get_document("ttl"))
        .map(|ttl| ttl.get("passes").cloned());
    match passes {
        Ok(Some(mongodb::bson::Bson::Int64(n))) => n,
        Ok(Some(mongodb::bson::Bson::Int32(n))) => n.into(),
        other => panic!("serverStatus has no metrics.ttl.passes: {other:?}"),
    }
}

/// Pattern 2's client locks `key` as `value` in `locks`, trying again
/// (every 10 ms, within [`LIMIT`]) while it finds the key held.
async fn pattern2_locks(locks: &Collection<Document>, key: &str, value: &str) {
    within(LIMIT, "pattern 2's lock", async {
        while !pattern2_client::lock(locks, key.into(), value, PATTERN_2_TTL).await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// With default options (keep mode: a released document stays in place),
/// pattern 2's client takes a released lease document of ours over in
/// place; our `exp` stays in it, past, beside its `value`. The TTL monitor
/// deletes a later released document of ours, and runs a full pass more:
/// pattern 2's lock is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_gc_index_never_deletes_pattern_2s_lock_taken_over_in_place() {
    let fx = Fixture::new("gc_spares").await;
    let mut options = fx.options(TTL).await;
    // The shortest grace, so that the monitor's passes soon cover it.
    options.gc_grace = Duration::from_secs(1);
    let ours = LeaseManager::connect(options).await.expect("connect");
    let lease = ours.acquire("k").await.unwrap();
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    within(LIMIT, "pattern 2's lock", async {
        while !pattern2_lock(&fx, "k", "npm-1", PATTERN_2_TTL).await {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let taken = fx.doc("k").await;
    assert_eq!(taken.get_str("value"), Ok("npm-1"), "{taken}");
    let our_exp = taken.get_datetime("exp").expect("our exp, kept");
    // A released document of ours whose expiry is later than `k`'s.
    let control = ours.acquire("c").await.unwrap();
    assert_eq!(control.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(fx.doc("c").await.get_datetime("exp").unwrap() > our_exp);

    eventually("the TTL monitor deletes c", LIMIT, || async {
        fx.raw()
            .find_one(doc! { "_id": "c" })
            .await
            .unwrap()
            .is_none()
    })
    .await;
    // A whole pass more, begun after c's deletion.
    let passes = ttl_passes(&fx.client).await;
    eventually("two more TTL monitor passes", LIMIT, || async {
        ttl_passes(&fx.client).await >= passes + 2
    })
    .await;
    let left = fx.raw().find_one(doc! { "_id": "k" }).await.unwrap();
    assert_eq!(
        left.as_ref(),
        Some(&taken),
        "pattern 2's lock (its value and its 600 s still ahead) was deleted by the TTL index \
         on exp, or changed"
    );
    ours.shutdown().await.unwrap();
}

/// How far the server's clock steps back: under the 1 s the protocol
/// allows (`DELETE_MIN_TOKEN_AGE`), and far longer than the steps from the
/// first acquisition to the second take here, so that a token of the
/// second from a clock that had not moved ahead of the first's by then
/// would be below the first's.
const STEP_BACK_MS: i64 = 800;

/// In a collection `connect` finds shared with pattern 2 (delete mode), A
/// acquires a key and releases it at once: the young document is only
/// marked released. Pattern 2's client takes it over in place as soon as it
/// reads it free, and unlocks it with a `deleteOne`. The server's clock then
/// steps back, and B acquires the key: its token is greater than A's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_pattern_2_deletes_a_young_document_it_took_over_the_next_token_is_still_greater() {
    let clock = ClockOffset::new(0);
    let mut options = ReplicaSetOptions::default();
    for (name, value) in clock.env() {
        options = options.env(name, value);
    }
    let rs = ReplicaSet::start(options).await.expect("a replica set");
    let clients = Clients::default();
    let client = clients.connect(&rs.uri()).await;
    let direct = clients.connect(&rs.member_uri(0)).await;
    until_server_offset(&direct, 0, Duration::from_millis(20), LIMIT).await;
    let db = client.database("app");
    let locks: Collection<Document> = db.collection("locks");
    // Pattern 2's lock of another key: the collection is shared.
    pattern2_locks(&locks, "other", "npm-0").await;
    let manager = |owner: &str| {
        LeaseManager::connect(
            LeaseManagerOptions::builder()
                .database(db.clone())
                .collection("locks")
                .owner_id(owner.to_string())
                .ttl(TTL)
                .build(),
        )
    };
    let (a, b) = (manager("a").await.unwrap(), manager("b").await.unwrap());

    let first = a.acquire("k").await.unwrap();
    let first_token = first.fencing_token();
    assert_eq!(first.release().await.unwrap(), ReleaseOutcome::Released);
    pattern2_locks(&locks, "k", "npm-1").await;
    assert!(
        pattern2_client::unlock(&locks, "k".into(), "npm-1").await,
        "pattern 2 held k"
    );
    clock.set(-STEP_BACK_MS);
    until_server_offset(&direct, -STEP_BACK_MS, Duration::from_millis(20), LIMIT).await;
    let second = b.acquire("k").await.unwrap();
    let ms = |token: u64| (token >> 20) as i64;
    assert!(
        second.fencing_token() > first_token,
        "B's token {} (at {} ms) is not above A's {first_token} (at {} ms)",
        second.fencing_token(),
        ms(second.fencing_token()),
        ms(first_token)
    );
    assert_eq!(second.release().await.unwrap(), ReleaseOutcome::Released);
    for m in [a, b] {
        m.shutdown().await.unwrap();
    }
}
