//! The delete-on-release compatibility mode (`ReleaseMode::Delete`) and
//! release by owner id (`LeaseManager::release_owner`; the CLI's `release
//! --owner AID --force` is tested in `cli/tests/sharing/`), against a real
//! `mongod`. Plain driver calls play the other application: acquire =
//! `insert_one({_id, ts, aid})` (E11000 = held), release = delete.
//!
//! Where a scenario needs a lease older than `DELETE_MIN_TOKEN_AGE` (so that
//! its release deletes at once), it sleeps that long plus a margin: the
//! rule is about server time, and the sleep is the scenario's condition,
//! not a synchronisation. Bounded waits (`eventually`) only turn a hang
//! into a failure; the bound (10 s) is far below the 60 s a document kept
//! in keep mode would stay, so they also tell the two modes apart.

use std::time::Duration;

use mongo_lease::{DELETE_MIN_TOKEN_AGE, Error, LeaseManager, ReleaseMode};
use mongodb::bson::{DateTime, doc};

use crate::common::others::foreign_insert;
use crate::common::{Fixture, eventually};

const TTL: Duration = Duration::from_secs(30);
/// Bound on waits for a delete or a loss: >= 10x what they take here.
const BOUND: Duration = Duration::from_secs(10);
/// Bound on 60 acquire-release cycles of a key between two managers: 20x
/// the 0.4 to 1 s they take here (on a loaded machine; the slowest
/// acquisition 0.2 s), and under the 66 s they would take if a released key
/// stayed held until its follow-up delete (1.1 s each).
const CYCLES_BOUND: Duration = Duration::from_secs(20);

/// A delete-mode manager on the fixture's collection.
async fn delete_mode_manager(
    f: &Fixture,
    owner: &str,
    heartbeat: Option<Duration>,
) -> LeaseManager {
    let mut options = f.options(TTL).await;
    options.release_mode = Some(ReleaseMode::Delete);
    options.owner_id = Some(owner.to_string());
    options.heartbeat_interval = heartbeat;
    LeaseManager::connect(options).await.expect("connect")
}

/// A keep-mode manager with this owner id and heartbeat.
async fn keep_mode_manager(f: &Fixture, owner: &str, heartbeat: Option<Duration>) -> LeaseManager {
    let mut options = f.options(TTL).await;
    options.owner_id = Some(owner.to_string());
    options.heartbeat_interval = heartbeat;
    LeaseManager::connect(options).await.expect("connect")
}

/// An operator's manager with owner id `owner`, releases in `mode`, and no
/// lock-delay.
async fn without_lock_delay(f: &Fixture, owner: &str, mode: ReleaseMode) -> LeaseManager {
    let mut options = f.options(TTL).await;
    options.release_mode = Some(mode);
    options.owner_id = Some(owner.to_string());
    options.lock_delay = Some(Duration::ZERO);
    LeaseManager::connect(options).await.expect("connect")
}

/// Lets every token issued so far become old enough for a release to delete it.
async fn age_tokens() {
    tokio::time::sleep(DELETE_MIN_TOKEN_AGE + Duration::from_millis(200)).await;
}

/// The other application's release: delete by `_id` (and its `aid`).
async fn foreign_delete(f: &Fixture, key: &str) {
    let deleted = f
        .raw()
        .delete_one(doc! { "_id": key, "aid": "other-app" })
        .await
        .expect("foreign delete");
    assert_eq!(
        deleted.deleted_count, 1,
        "the other application held {key:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_mode_an_insert_style_client_locks_a_key_at_once_after_release_drop_and_shutdown() {
    let f = Fixture::new("compat_release").await;
    let m = delete_mode_manager(&f, "m", None).await;

    // Explicit release of a lease held longer than DELETE_MIN_TOKEN_AGE.
    let lease = m.acquire("k-release").await.unwrap();
    assert!(!foreign_insert(&f, "k-release").await, "held: E11000");
    age_tokens().await;
    assert!(!foreign_insert(&f, "k-release").await, "still held: E11000");
    assert!(!lease.release().await.unwrap().was_lost());
    assert!(
        foreign_insert(&f, "k-release").await,
        "free at once after release"
    );
    foreign_delete(&f, "k-release").await;

    // Release on drop (fire and forget: the delete follows the drop).
    let lease = m.acquire("k-drop").await.unwrap();
    assert!(!foreign_insert(&f, "k-drop").await);
    age_tokens().await;
    drop(lease);
    eventually("the dropped lease's document is deleted", BOUND, || {
        foreign_insert(&f, "k-drop")
    })
    .await;

    // A young lease: its document is deleted shortly after the release
    // (once its token is DELETE_MIN_TOKEN_AGE old), not after the GC grace.
    let lease = m.acquire("k-young").await.unwrap();
    assert!(!lease.release().await.unwrap().was_lost());
    eventually("the young lease's document is deleted", BOUND, || {
        foreign_insert(&f, "k-young")
    })
    .await;

    // Shutdown: every document is deleted when it returns, young or old.
    let old = m.acquire("k-shutdown-old").await.unwrap();
    age_tokens().await;
    let young = m.acquire("k-shutdown-young").await.unwrap();
    assert!(!foreign_insert(&f, "k-shutdown-old").await);
    assert!(!foreign_insert(&f, "k-shutdown-young").await);
    m.shutdown().await.unwrap();
    assert!(old.status().is_lost() && young.status().is_lost());
    assert!(foreign_insert(&f, "k-shutdown-old").await);
    assert!(foreign_insert(&f, "k-shutdown-young").await);
}

/// `m.acquire(key)` of a key its last holder released: free at once (a
/// delete-mode release deletes the document or marks it released), so a
/// wait of [`BOUND`] means it stayed held, and fails rather than hangs.
async fn acquire_free(m: &LeaseManager, key: &str) -> mongo_lease::Lease {
    tokio::time::timeout(BOUND, m.acquire(key))
        .await
        .unwrap_or_else(|_| panic!("{key}: released, yet not acquired within {BOUND:?}"))
        .unwrap()
}

/// Rounds of tight cycles, each ending with deletes and a foreign lock.
const ROUNDS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_mode_tokens_strictly_increase_over_tight_cycles_two_managers_and_foreign_locks() {
    let f = Fixture::new("compat_tokens").await;
    let (m1, m2) = (
        delete_mode_manager(&f, "m1", None).await,
        delete_mode_manager(&f, "m2", None).await,
    );
    let mut last = 0;
    let mut deletes = 0;
    for round in 0..ROUNDS {
        // Tight cycles, one manager then the other: each acquisition finds
        // the key just released, so they take about 1 s together here.
        let cycles = async {
            for i in 0..60 {
                let m = if i % 2 == 0 { &m1 } else { &m2 };
                let lease = acquire_free(m, "k").await;
                let token = lease.fencing_token();
                assert!(
                    token > last,
                    "round {round} cycle {i}: {token} after {last}"
                );
                last = token;
                assert!(!lease.release().await.unwrap().was_lost());
            }
        };
        if tokio::time::timeout(CYCLES_BOUND, cycles).await.is_err() {
            panic!(
                "round {round}: 60 cycles took over {CYCLES_BOUND:?}: a released key stays held"
            );
        }
        // An old lease: its release deletes the document, and the other
        // manager takes the key right after (often the same millisecond).
        let lease = acquire_free(&m1, "k").await;
        assert!(lease.fencing_token() > last);
        last = lease.fencing_token();
        age_tokens().await;
        assert!(!lease.release().await.unwrap().was_lost());
        if f.raw()
            .find_one(doc! { "_id": "k" })
            .await
            .unwrap()
            .is_none()
        {
            deletes += 1;
        }
        let lease = acquire_free(&m2, "k").await;
        assert!(
            lease.fencing_token() > last,
            "round {round}: after a delete"
        );
        last = lease.fencing_token();
        age_tokens().await;
        assert!(!lease.release().await.unwrap().was_lost());

        // The other application locks and unlocks the key in between.
        assert!(
            foreign_insert(&f, "k").await,
            "round {round}: deleted on release"
        );
        foreign_delete(&f, "k").await;
        let lease = acquire_free(&m1, "k").await;
        assert!(
            lease.fencing_token() > last,
            "round {round}: after a foreign lock"
        );
        last = lease.fencing_token();
        assert!(!lease.release().await.unwrap().was_lost());
        eventually("the young lease's document is deleted", BOUND, || async {
            f.raw()
                .find_one(doc! { "_id": "k" })
                .await
                .unwrap()
                .is_none()
        })
        .await;
    }
    assert_eq!(
        deletes, ROUNDS,
        "every old lease's release deleted its document"
    );
    m1.shutdown().await.unwrap();
    m2.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_owner_from_another_manager_releases_every_lease_of_that_owner_only() {
    let f = Fixture::new("compat_release_owner").await;
    let heartbeat = Some(Duration::from_millis(200));
    let dead = keep_mode_manager(&f, "dead-worker", heartbeat).await;
    let other = keep_mode_manager(&f, "other-worker", heartbeat).await;
    // No lock-delay (docs/lock-delay.md): the released keys are free at once.
    let operator = without_lock_delay(&f, "operator", ReleaseMode::Keep).await;
    let (d1, d2) = (
        dead.acquire("d1").await.unwrap(),
        dead.acquire("d2").await.unwrap(),
    );
    let o1 = other.acquire("o1").await.unwrap();
    // Another application's lock document with the same `aid` is not ours.
    f.raw()
        .insert_one(doc! { "_id": "foreign", "ts": DateTime::now(), "aid": "dead-worker" })
        .await
        .unwrap();

    // Bad input is refused before any round trip.
    for bad in [String::new(), "x".repeat(mongo_lease::MAX_OWNER_ID_LEN + 1)] {
        assert!(matches!(
            operator.release_owner(&bad).await,
            Err(Error::InvalidConfig { .. })
        ));
    }

    assert_eq!(
        operator
            .release_owner("dead-worker")
            .immediately()
            .await
            .unwrap(),
        2
    );
    // The holder learns it at its next renewal.
    for lease in [&d1, &d2] {
        tokio::time::timeout(BOUND, lease.status().lost())
            .await
            .expect("the released lease's token fires by its next renewal");
    }
    assert!(!o1.status().is_lost());
    let info = operator.inspect("o1").await.unwrap().unwrap();
    assert!(info.held && info.owner_id == "other-worker");
    assert!(!operator.inspect("d1").await.unwrap().unwrap().held);
    assert_eq!(
        f.raw()
            .find_one(doc! { "_id": "foreign" })
            .await
            .unwrap()
            .unwrap()
            .get_str("aid")
            .unwrap(),
        "dead-worker",
        "another application's document is untouched"
    );
    assert_eq!(operator.release_owner("dead-worker").await.unwrap(), 0);

    // Released keys are free for others at once.
    let taken = operator
        .try_acquire("d1")
        .await
        .unwrap()
        .expect("d1 is free");
    assert!(taken.fencing_token() > d1.fencing_token());

    // In delete mode the documents are deleted (old and young alike).
    let d3 = dead.acquire("d3").await.unwrap();
    age_tokens().await;
    let d4 = dead.acquire("d4").await.unwrap();
    let deleter = without_lock_delay(&f, "operator-2", ReleaseMode::Delete).await;
    assert_eq!(
        deleter
            .release_owner("dead-worker")
            .immediately()
            .await
            .unwrap(),
        2
    );
    for key in ["d3", "d4"] {
        assert!(foreign_insert(&f, key).await, "{key} deleted");
    }
    for lease in [&d3, &d4] {
        tokio::time::timeout(BOUND, lease.status().lost())
            .await
            .expect("lost");
    }

    // Its own owner id: release_all, the local tokens fire at once.
    let mine = other.acquire("o2").await.unwrap();
    assert_eq!(other.release_owner("other-worker").await.unwrap(), 2);
    assert!(mine.status().is_lost() && o1.status().is_lost());

    for m in [dead, other, operator, deleter] {
        m.shutdown().await.unwrap();
    }
    drop(taken);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_mode_releases_a_lease_older_than_the_token_age_in_one_round_trip() {
    let f = Fixture::new("compat_round_trips").await;
    let (mut options, log) = f.monitored_options(TTL, "").await;
    options.release_mode = Some(ReleaseMode::Delete);
    let m = LeaseManager::connect(options).await.expect("connect");

    let lease = m.acquire("old").await.unwrap();
    age_tokens().await;
    log.clear();
    assert!(!lease.release().await.unwrap().was_lost());
    assert_eq!(log.count("delete"), 1, "{:?}", log.all());
    assert_eq!(log.count("update"), 0, "{:?}", log.all());
    assert!(foreign_insert(&f, "old").await);

    // A young lease (acquired less than DELETE_DELAY ago): no delete, whose
    // filter could not match its token; an update marks it released, and
    // one follow-up delete removes it.
    log.clear();
    let lease = m.acquire("young").await.unwrap();
    assert!(!lease.release().await.unwrap().was_lost());
    assert_eq!(
        (log.count("delete"), log.count("update")),
        (0, 1),
        "{:?}",
        log.all()
    );
    eventually("the follow-up delete", BOUND, || {
        foreign_insert(&f, "young")
    })
    .await;
    assert_eq!(log.count("delete"), 1, "{:?}", log.all());
    m.shutdown().await.unwrap();
}

/// A token whose time part is ahead of this server's clock (as left by a
/// member whose clock ran ahead before a failover, or by `$$NOW` stepping
/// back) is not deleted on release: the next token must still be greater.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_mode_keeps_a_document_whose_token_is_ahead_of_the_server_clock() {
    let f = Fixture::new("compat_clock_ahead").await;
    let m = delete_mode_manager(&f, "m", None).await;
    let lease = m.acquire("k").await.unwrap();
    let ahead = (DateTime::now().timestamp_millis() + 5_000) << 20;
    f.raw()
        .update_one(doc! { "_id": "k" }, doc! { "$set": { "tok": ahead } })
        .await
        .unwrap();
    age_tokens().await;
    assert!(!lease.release().await.unwrap().was_lost());
    let kept = f.doc("k").await;
    assert_eq!(kept.get_i64("tok").unwrap(), ahead, "kept, marked released");
    assert!(!kept.contains_key("lid"));
    assert!(!foreign_insert(&f, "k").await);
    let next = m.acquire("k").await.unwrap();
    assert_eq!(next.fencing_token(), ahead as u64 + 1);
    assert!(!next.release().await.unwrap().was_lost());
    m.shutdown().await.unwrap();
}
