//! The actor's places (`src/actor/documents.rs`, and the per-place logic of
//! `acquire.rs`, `renewal.rs`, `release.rs`, `write_stream.rs` and
//! `shutdown.rs`): the lock collection and the places of in-document leases,
//! against the twin's second place ([`MemoryStore::document_store`], whose
//! releases follow the delete-mode rules, as a release removes the lock
//! field).

use mongodb::bson::{Document, doc};

use super::*;
use crate::document::{DEFAULT_LEASE_FIELD, DocumentLeases};
use crate::store::DELETE_DELAY;

/// The user collection of the tests.
const JOBS: &str = "jobs";

/// Half-way between the manager's start and its first heartbeat.
const BETWEEN_TICKS: Duration = Duration::from_millis(500);

/// In-document leases on [`JOBS`] of `manager` (whose lock-collection store
/// is `store`), with the twin's collection of their lock fields and the
/// store the actor uses for them (its knobs and counters).
async fn jobs(
    manager: &LeaseManager,
    store: &MemoryStore,
) -> (DocumentLeases<Document>, MemoryDb, MemoryStore) {
    let leases = manager.documents::<Document>(JOBS).await.unwrap();
    let place = store.document_store(JOBS, DEFAULT_LEASE_FIELD);
    (leases, place.db().clone(), place)
}

/// The keys of each call of `op`, sorted, with its instant.
fn calls(store: &MemoryStore, op: Op) -> Vec<(Instant, Vec<LeaseKey>)> {
    store
        .calls_of(op)
        .into_iter()
        .map(|c| {
            let mut keys = c.keys;
            keys.sort();
            (c.at, keys)
        })
        .collect()
}

fn keys<const N: usize>(names: [&str; N]) -> Vec<LeaseKey> {
    names.into_iter().map(LeaseKey::from).collect()
}

#[tokio::test(start_paused = true)]
async fn the_same_key_in_the_lock_collection_and_in_a_document_are_two_independent_leases() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;

    let lock = a.acquire("k").await.unwrap();
    let item = jobs
        .try_acquire("k")
        .await
        .unwrap()
        .expect("free in its own place");
    assert_eq!(item.key(), &LeaseKey::from("k"));
    assert_eq!(db.holder("k").as_deref(), Some("a"));
    assert_eq!(docs.holder("k").as_deref(), Some("a"));
    assert_ne!(
        db.doc("k").unwrap().lease_id,
        docs.doc("k").unwrap().lease_id,
        "two acquisitions"
    );
    assert!(a.try_acquire("k").await.unwrap().is_none());
    assert!(jobs.try_acquire("k").await.unwrap().is_none());

    // Fencing tokens count per place.
    let (first, item_token) = (lock.fencing_token(), item.lease().fencing_token());
    assert_eq!(lock.release().await.unwrap(), ReleaseOutcome::Released);
    let lock = a.acquire("k").await.unwrap();
    assert!(lock.fencing_token() > first);
    assert_eq!(docs.doc("k").unwrap().token, item_token);
    assert!(!item.lease().status().is_lost(), "a lease of its own");

    // Each has its own lost-lease token.
    let item_lost = item.lease().status().cancellation_token();
    assert_eq!(item.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(item_lost.is_cancelled());
    settle().await;
    assert!(!lock.status().is_lost());
    assert_eq!(db.holder("k").as_deref(), Some("a"));
    assert_eq!(docs.holder("k"), None);
    assert_eq!(
        store.acquire_calls("k").len(),
        2,
        "the try was answered locally"
    );
    assert_eq!(doc_store.acquire_calls("k").len(), 1);
    assert_eq!(store.calls(Op::Release), 1);
    assert_eq!(doc_store.calls(Op::Release), 1);
}

#[tokio::test(start_paused = true)]
async fn one_heartbeat_renews_every_place_in_one_store_call_per_place() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    let _locks = [
        a.acquire("k1").await.unwrap(),
        a.acquire("k2").await.unwrap(),
    ];
    let _items = [
        jobs.acquire("d1").await.unwrap(),
        jobs.acquire("d2").await.unwrap(),
    ];

    sleep_until(t0 + HEARTBEAT).await;
    settle().await;
    assert_eq!(
        calls(&store, Op::Renew),
        [(t0 + HEARTBEAT, keys(["k1", "k2"]))]
    );
    assert_eq!(
        calls(&doc_store, Op::Renew),
        [(t0 + HEARTBEAT, keys(["d1", "d2"]))]
    );
    for key in ["d1", "d2"] {
        assert_eq!(docs.doc(key).unwrap().exp, t0 + HEARTBEAT + TTL, "{key}");
    }
    for key in ["k1", "k2"] {
        assert_eq!(db.doc(key).unwrap().exp, t0 + HEARTBEAT + TTL, "{key}");
    }

    sleep_until(t0 + 2 * HEARTBEAT).await;
    settle().await;
    assert_eq!(store.renew_batch_sizes(), [2, 2]);
    assert_eq!(doc_store.renew_batch_sizes(), [2, 2]);
}

#[tokio::test(start_paused = true)]
async fn a_write_by_someone_else_fires_only_the_token_of_the_lease_in_its_place() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_watching_held(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    let lock = a.acquire("k").await.unwrap();
    let other_lock = a.acquire("other").await.unwrap();
    let item = jobs.acquire("k").await.unwrap();
    let other_item = jobs.acquire("other").await.unwrap();
    sleep_until(t0 + BETWEEN_TICKS).await;

    // In the lock collection: checked there, at once.
    db.force_take("k", "b", TTL);
    soon(lock.status().lost()).await;
    assert_eq!(Instant::now(), t0 + BETWEEN_TICKS);
    assert_eq!(
        calls(&store, Op::Renew),
        [(t0 + BETWEEN_TICKS, keys(["k"]))]
    );
    settle().await;
    assert!(
        doc_store.calls_of(Op::Renew).is_empty(),
        "no check of the documents"
    );
    assert!(!item.lease().status().is_lost(), "same key, other place");

    // In the document: checked in its place, at once.
    sleep(BETWEEN_TICKS / 5).await;
    let at = Instant::now();
    docs.force_take("k", "b", TTL);
    soon(item.lease().status().lost()).await;
    assert_eq!(Instant::now(), at);
    assert_eq!(calls(&doc_store, Op::Renew), [(at, keys(["k"]))]);
    settle().await;
    assert_eq!(store.calls(Op::Renew), 1, "no check of the lock collection");
    assert!(!other_lock.status().is_lost() && !other_item.lease().status().is_lost());
    assert_eq!(db.holder("k").as_deref(), Some("b"));
    assert_eq!(docs.holder("k").as_deref(), Some("b"), "theirs untouched");

    // The heartbeat renews what is left, one call per place.
    sleep_until(t0 + HEARTBEAT).await;
    settle().await;
    assert_eq!(
        calls(&store, Op::Renew)[1],
        (t0 + HEARTBEAT, keys(["other"]))
    );
    assert_eq!(
        calls(&doc_store, Op::Renew)[1],
        (t0 + HEARTBEAT, keys(["other"]))
    );
    assert_eq!(
        item.release().await.unwrap(),
        ReleaseOutcome::AlreadyLost,
        "nothing sent for a lost lease"
    );
    assert_eq!(doc_store.calls(Op::Release), 0);
}

#[tokio::test(start_paused = true)]
async fn without_change_streams_a_lost_document_lease_fires_at_the_next_heartbeat_alone() {
    let db = MemoryDb::new();
    let (a, store, t0) = start_without_change_streams(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    let lock = a.acquire("k").await.unwrap();
    let item = jobs.acquire("k").await.unwrap();
    sleep_until(t0 + BETWEEN_TICKS).await;

    docs.force_take("k", "b", TTL);
    soon(item.lease().status().lost()).await;
    assert_eq!(Instant::now(), t0 + HEARTBEAT);
    assert_eq!(
        calls(&doc_store, Op::Renew),
        [(t0 + HEARTBEAT, keys(["k"]))]
    );
    settle().await;
    assert!(!lock.status().is_lost());
    assert_eq!(db.holder("k").as_deref(), Some("a"));
    assert_eq!(docs.holder("k").as_deref(), Some("b"));
}

#[tokio::test(start_paused = true)]
async fn renewals_that_hang_in_one_place_lose_only_its_leases_at_their_deadline() {
    let db = MemoryDb::new();
    let (a, store, t0) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    let lock = a.acquire("k").await.unwrap();
    let item = jobs.acquire("k").await.unwrap();
    doc_store.hang_renewals();

    soon(item.lease().status().lost()).await;
    assert_eq!(Instant::now(), t0 + VALIDITY);
    settle().await;
    assert_eq!(
        calls(&doc_store, Op::Release),
        [(t0 + VALIDITY, keys(["k"]))],
        "given back in its place at once"
    );
    assert_eq!(docs.doc("k"), None, "old enough: the lock field is removed");
    assert_eq!(store.calls(Op::Release), 0);
    sleep(3 * HEARTBEAT).await;
    assert!(
        !lock.status().is_lost(),
        "the lock collection's renewals went through"
    );
    assert_eq!(db.holder("k").as_deref(), Some("a"));
    assert_eq!(store.renew_batch_sizes(), [1; 5]);
}

#[tokio::test(start_paused = true)]
async fn a_release_in_a_document_place_wakes_its_waiter_at_once() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (jobs, docs, _) = jobs(&a, &store).await;
    // The lock collection's stream is open too.
    let _lock = a.acquire("k").await.unwrap();
    docs.force_take("d", "b", TTL);
    let waiter = {
        let jobs = jobs.clone();
        started(async move {
            let item = jobs.acquire("d").await?;
            Ok::<_, Error>((Instant::now(), item))
        })
        .await
    };
    sleep(TTL / 3).await;
    assert!(!waiter.is_finished());

    let released_at = Instant::now();
    docs.delete("d");
    let (granted_at, item) = soon(waiter).await.unwrap().unwrap();
    assert!(
        granted_at - released_at <= RELEASE_WAKE_JITTER.min(RETRY_INITIAL),
        "woken {:?} after the release",
        granted_at - released_at
    );
    assert_eq!(docs.holder("d").as_deref(), Some("a"));
    assert!(!item.lease().status().is_lost());
}

#[tokio::test(start_paused = true)]
async fn release_all_releases_the_leases_of_every_place() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    let lock = a.acquire("k").await.unwrap();
    let items = [
        jobs.acquire("d1").await.unwrap(),
        jobs.acquire("d2").await.unwrap(),
    ];

    assert_eq!(a.release_all().await.unwrap(), 3);
    assert!(lock.status().is_lost());
    assert_released(&db, "k");
    for item in &items {
        assert!(item.lease().status().is_lost());
        assert_eq!(docs.holder(item.key().clone()), None);
    }
    assert_eq!(store.calls(Op::Release), 1, "by lease id, one call");
    assert_eq!(store.calls(Op::ReleaseOwner), 0);
    assert_eq!(
        calls(&doc_store, Op::Release)
            .into_iter()
            .map(|(_, keys)| keys)
            .collect::<Vec<_>>(),
        [keys(["d1", "d2"])],
        "by lease id, one call"
    );
    // Free again for this manager in both places.
    assert!(a.try_acquire("k").await.unwrap().is_some());
    assert!(jobs.try_acquire("d1").await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn release_all_releases_many_document_leases_in_batches() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    let mut items = Vec::new();
    for i in 0..BATCH + BATCH / 2 {
        items.push(jobs.acquire(format!("d{i}")).await.unwrap());
    }

    assert_eq!(a.release_all().await.unwrap(), items.len() as u64);
    let mut sizes: Vec<usize> = doc_store
        .calls_of(Op::Release)
        .iter()
        .map(|c| c.keys.len())
        .collect();
    sizes.sort();
    assert_eq!(sizes, [BATCH / 2, BATCH], "one call per renewal batch");
    for item in &items {
        assert!(item.lease().status().is_lost());
        assert_eq!(docs.holder(item.key().clone()), None);
    }
}

#[tokio::test(start_paused = true)]
async fn release_all_releases_the_documents_even_if_the_lock_collections_release_fails() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    let lock = a.acquire("k").await.unwrap();
    let item = jobs.acquire("d").await.unwrap();
    // Every send of it: a release is sent again after a transient failure.
    store.fail_next(Op::Release, crate::store::retried::WRITE_ATTEMPTS);

    let result = a.release_all().await;
    assert!(
        matches!(result, Err(Error::Unreachable { .. })),
        "the lock collection's error: {result:?}"
    );
    assert!(lock.status().is_lost() && item.lease().status().is_lost());
    assert_eq!(doc_store.calls(Op::Release), 1);
    assert_eq!(docs.holder("d"), None, "released all the same");
    assert_eq!(
        db.holder("k").as_deref(),
        Some("a"),
        "left to expire after its TTL"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_the_leases_of_every_place_in_one_batch_per_place() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    let locks = [
        a.acquire("k1").await.unwrap(),
        a.acquire("k2").await.unwrap(),
    ];
    let items = [
        jobs.acquire("d1").await.unwrap(),
        jobs.acquire("d2").await.unwrap(),
    ];
    // Old enough for the release to remove the lock fields at once.
    sleep(DELETE_DELAY).await;
    let stopping = Instant::now();

    a.shutdown().await.unwrap();
    assert_eq!(Instant::now(), stopping, "no follow-up to wait for");
    for lock in &locks {
        assert!(lock.status().is_lost());
        assert_released(&db, lock.key());
    }
    for item in &items {
        assert!(item.lease().status().is_lost());
        assert_eq!(docs.doc(item.key().clone()), None, "lock field removed");
    }
    let released = |store: &MemoryStore| -> Vec<Vec<LeaseKey>> {
        calls(store, Op::Release)
            .into_iter()
            .map(|(_, keys)| keys)
            .collect()
    };
    assert_eq!(released(&store), [keys(["k1", "k2"])]);
    assert_eq!(released(&doc_store), [keys(["d1", "d2"])]);
    settle().await;
    assert_eq!(store.handles(), 1, "the actor has stopped");
}

#[tokio::test(start_paused = true)]
async fn the_follow_up_of_a_young_document_lease_runs_at_acquisition_plus_delete_delay() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;

    // Held longer than DELETE_MIN_TOKEN_AGE: one release removes the field.
    let old = jobs.acquire("old").await.unwrap();
    sleep(DELETE_DELAY).await;
    assert_eq!(old.release().await.unwrap(), ReleaseOutcome::Released);
    assert_eq!(docs.doc("old"), None);
    settle().await;
    assert_eq!(
        doc_store.calls(Op::Release),
        1,
        "no follow-up for an old lease"
    );

    // Young: the released state stays until acquisition + DELETE_DELAY.
    let acquired_at = Instant::now();
    let young = jobs.acquire("young").await.unwrap();
    sleep(BETWEEN_TICKS).await;
    assert_eq!(young.release().await.unwrap(), ReleaseOutcome::Released);
    assert!(docs.doc("young").is_some_and(|d| d.lease_id.is_none()));
    sleep_until(acquired_at + DELETE_DELAY - MS).await;
    assert!(docs.doc("young").is_some(), "kept until its token is old");
    sleep_until(acquired_at + DELETE_DELAY).await;
    settle().await;
    assert_eq!(docs.doc("young"), None);
    assert_eq!(
        calls(&doc_store, Op::Release).last(),
        Some(&(acquired_at + DELETE_DELAY, keys(["young"]))),
        "one follow-up, at acquisition + DELETE_DELAY"
    );
    assert_eq!(doc_store.calls(Op::Release), 3);
    assert_eq!(store.calls(Op::Release), 0, "the lock collection keeps");

    // Shutdown waits for the follow-up of a young held lease.
    let acquired_at = Instant::now();
    let held = jobs.acquire("held").await.unwrap();
    let lock = a.acquire("k").await.unwrap();
    sleep(BETWEEN_TICKS).await;
    a.shutdown().await.unwrap();
    assert_eq!(Instant::now(), acquired_at + DELETE_DELAY);
    assert!(held.lease().status().is_lost() && lock.status().is_lost());
    assert_eq!(docs.doc("held"), None);
    assert_released(&db, "k");
}

#[tokio::test(start_paused = true)]
async fn a_commit_of_unknown_outcome_releases_by_lease_id_and_keeps_the_one_follow_up() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    let acquired_at = Instant::now();
    let item = jobs.acquire("d").await.unwrap();
    sleep(BETWEEN_TICKS).await;

    doc_store.fault_next(Op::WriteDocument, Fault::FailAfterApply, 1);
    let result = item.commit(doc! {"$inc": {"runs": 1}}).await;
    assert!(
        matches!(result, Err(Error::Unreachable { .. })),
        "outcome unknown: {result:?}"
    );
    settle().await;
    assert_eq!(
        calls(&doc_store, Op::Release),
        [(acquired_at + BETWEEN_TICKS, keys(["d"]))],
        "released under its lease id at once"
    );
    assert_eq!(docs.holder("d"), None);

    a.shutdown().await.unwrap();
    assert_eq!(
        Instant::now(),
        acquired_at + DELETE_DELAY,
        "the follow-up is due at acquisition + DELETE_DELAY, not later"
    );
    assert_eq!(
        doc_store.calls(Op::Release),
        2,
        "the release, one follow-up"
    );
    assert_eq!(docs.doc("d"), None);
}

#[tokio::test(start_paused = true)]
async fn local_waiters_of_a_document_are_served_in_order() {
    const HOLD: Duration = Duration::from_millis(100);
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    let holder = jobs.acquire("d").await.unwrap();

    let grants = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (jobs, grants) = (jobs.clone(), grants.clone());
        tasks.push(
            started(async move {
                let item = jobs.acquire("d").await.unwrap();
                grants
                    .lock()
                    .unwrap()
                    .push((i, Instant::now(), item.lease().fencing_token()));
                sleep(HOLD).await;
                assert_eq!(item.release().await.unwrap(), ReleaseOutcome::Released);
            })
            .await,
        );
    }
    settle().await;
    // The same key in the lock collection is not theirs to wait for.
    assert!(a.try_acquire("d").await.unwrap().is_some());
    let released_at = Instant::now();
    assert_eq!(holder.release().await.unwrap(), ReleaseOutcome::Released);
    for task in tasks {
        soon(task).await.unwrap();
    }

    let grants = grants.lock().unwrap().clone();
    let order: Vec<usize> = grants.iter().map(|g| g.0).collect();
    assert_eq!(order, [0, 1, 2, 3], "first come, first served");
    assert_eq!(grants[0].1, released_at);
    for pair in grants.windows(2) {
        assert_eq!(pair[1].1 - pair[0].1, HOLD, "handed over at each release");
        assert!(pair[1].2 > pair[0].2, "fencing tokens increase");
    }
    assert_eq!(doc_store.max_acquires_in_flight_per_key(), 1);
    assert_eq!(
        doc_store.acquire_calls("d").len(),
        5,
        "one attempt per handoff, no polling of a key held here"
    );
    assert_eq!(docs.holder("d"), None);
}

#[tokio::test(start_paused = true)]
async fn the_same_collection_and_field_is_one_place_another_field_or_collection_another() {
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let first = a.documents::<Document>(JOBS).await.unwrap();
    let again = a
        .documents::<Document>(JOBS)
        .field(DEFAULT_LEASE_FIELD)
        .await
        .unwrap();
    let other_field = a.documents::<Document>(JOBS).field("_claim").await.unwrap();
    let other_collection = a.documents::<Document>("tasks").await.unwrap();

    let _item = first.acquire("d").await.unwrap();
    assert!(
        again.try_acquire("d").await.unwrap().is_none(),
        "one place: held here"
    );
    let _claim = other_field
        .try_acquire("d")
        .await
        .unwrap()
        .expect("another lock field is another place");
    let _task = other_collection
        .try_acquire("d")
        .await
        .unwrap()
        .expect("another collection is another place");
    let acquires = |collection: &str, field: &str| {
        store
            .document_store(collection, field)
            .acquire_calls("d")
            .len()
    };
    assert_eq!(
        acquires(JOBS, DEFAULT_LEASE_FIELD),
        1,
        "the second try was answered here"
    );
    assert_eq!(acquires(JOBS, "_claim"), 1);
    assert_eq!(acquires("tasks", DEFAULT_LEASE_FIELD), 1);

    // Another manager on the same collections meets the same locks.
    let (b, store_b, _) = start(&db, "b");
    let theirs = b.documents::<Document>(JOBS).await.unwrap();
    assert!(theirs.try_acquire("d").await.unwrap().is_none());
    assert_eq!(
        store_b
            .document_store(JOBS, DEFAULT_LEASE_FIELD)
            .acquire_calls("d")
            .len(),
        1,
        "asked its store, found it held"
    );

    // The lock collection is not a place of in-document leases.
    let refused = a.documents::<Document>("locks").await;
    assert!(
        matches!(refused, Err(Error::InvalidConfig { .. })),
        "{refused:?}"
    );
    b.shutdown().await.unwrap();
    a.shutdown().await.unwrap();
}

/// A missing document and two local callers: the first gives no fields to
/// create it, the second (queued while the first one's attempt is in
/// flight) gives some. The first gets `DocumentNotFound`, as it would alone;
/// the second's attempt follows at once and creates the document for it.
#[tokio::test(start_paused = true)]
async fn a_missing_document_is_created_only_for_a_caller_that_gave_fields_to_create_it() {
    const LATENCY: Duration = Duration::from_millis(50);
    let db = MemoryDb::new();
    let (a, store, _) = start(&db, "a");
    let (jobs, docs, doc_store) = jobs(&a, &store).await;
    docs.remove_user_document("d");
    doc_store.set_latency(Op::Acquire, LATENCY);

    let plain = started({
        let jobs = jobs.clone();
        async move { jobs.acquire("d").await.map(|_| ()) }
    })
    .await;
    settle().await;
    let creating = started({
        let jobs = jobs.clone();
        async move { jobs.acquire("d").create(doc! { "n": 0 }).await }
    })
    .await;

    let plain = soon(plain).await.unwrap();
    assert!(
        matches!(plain, Err(Error::DocumentNotFound { .. })),
        "{plain:?}"
    );
    let item = soon(creating)
        .await
        .unwrap()
        .expect("created for the caller that asked");
    assert_eq!(docs.holder("d").as_deref(), Some("a"));
    let calls = doc_store.acquire_calls("d");
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(
        calls[1] - calls[0],
        LATENCY,
        "the second attempt follows at once"
    );
    assert_eq!(item.release().await.unwrap(), ReleaseOutcome::Released);
}
