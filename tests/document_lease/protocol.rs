//! The in-document protocol as stored: lock fields under one field, user
//! fields never touched by acquire, renewal or release, change events.

use std::future::IntoFuture;
use std::time::Duration;

use mongo_lease::{DocumentLease, Error, LeaseManager};
use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Bson, DateTime, Document, doc};
use tokio_util::time::FutureExt as _;

use crate::common::{self, CommandLog, Fixture};
use crate::support::{ITEMS, insert_item, items, stored, wait_until_watching};

/// The lease TTL: a heartbeat every second.
const TTL: Duration = Duration::from_secs(3);
/// Turns a hang into a failure; every wait below takes milliseconds (a
/// heartbeat interval at most).
const WAIT: Duration = Duration::from_secs(30);
/// The bytes of `doc` without its lock field `_lease`: the user's fields,
/// in their order.
fn user_bytes(doc: &Document) -> Vec<u8> {
    let mut user = doc.clone();
    user.remove("_lease");
    mongodb::bson::to_vec(&user).unwrap()
}

/// A document with fields of many types, nested ones included.
fn user_document(id: &str) -> Document {
    doc! {
        "_id": id,
        "state": "new",
        "n": 7,
        "big": 1_i64 << 40,
        "ratio": 0.25,
        "when": DateTime::from_millis(1_000),
        "nested": { "b": [1, 2, { "c": null }], "a": "x" },
        "tags": ["t1", "t2"],
    }
}

async fn shutdown(m: LeaseManager) {
    tokio::time::timeout(WAIT, m.shutdown())
        .await
        .expect("shutdown in time")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_field_holds_the_lock_collections_schema_and_user_fields_survive_acquire_renewal_and_release()
 {
    let fx = Fixture::new("doc_schema").await;
    let m = fx.manager(TTL).await;
    let original = user_document("w1");
    insert_item(&fx, original.clone()).await;
    let docs = m.documents::<Document>(ITEMS).await.unwrap();

    let lease = docs.acquire("w1").await.unwrap();
    assert_eq!(user_bytes(lease.raw_document()), user_bytes(&original));
    let acquired = stored(&fx, "w1").await;
    assert_eq!(user_bytes(&acquired), user_bytes(&original));
    let lock = acquired.get_document("_lease").unwrap();
    assert_eq!(
        lock.keys().map(String::as_str).collect::<Vec<_>>(),
        ["aid", "lid", "tok", "acq", "ts", "exp", "tr"]
    );
    assert_eq!(lock.get_str("aid").unwrap(), m.owner_id());
    assert!(
        matches!(lock.get("lid"), Some(Bson::Binary(b)) if b.subtype == BinarySubtype::Uuid),
        "{lock}"
    );
    assert_eq!(
        lock.get_i64("tok").unwrap() as u64,
        lease.lease().fencing_token()
    );
    let (acq, ts, exp) = (
        *lock.get_datetime("acq").unwrap(),
        *lock.get_datetime("ts").unwrap(),
        *lock.get_datetime("exp").unwrap(),
    );
    assert_eq!(acq, ts);
    assert_eq!(
        exp.timestamp_millis() - ts.timestamp_millis(),
        TTL.as_millis() as i64
    );

    // The heartbeat renews the lease: only `ts` and `exp` move.
    common::eventually("the heartbeat renewed the lease", WAIT, || async {
        stored(&fx, "w1")
            .await
            .get_document("_lease")
            .unwrap()
            .get_datetime("ts")
            .unwrap()
            > &ts
    })
    .await;
    let renewed = stored(&fx, "w1").await;
    assert_eq!(user_bytes(&renewed), user_bytes(&original));
    let renewed_lock = renewed.get_document("_lease").unwrap();
    for name in ["aid", "lid", "tok", "acq"] {
        assert_eq!(renewed_lock.get(name), lock.get(name), "{name}");
    }

    // The payload lives under the lock field too.
    lease
        .lease()
        .set_payload(doc! { "progress": 0.5 })
        .await
        .unwrap();
    let with_payload = stored(&fx, "w1").await;
    assert_eq!(user_bytes(&with_payload), user_bytes(&original));
    assert_eq!(
        with_payload
            .get_document("_lease")
            .unwrap()
            .get_document("data")
            .unwrap(),
        &doc! { "progress": 0.5 }
    );

    // Release: the lock field goes (once its token is old enough: the
    // manager's follow-up), the user's fields stay as they were.
    assert!(!lease.release().await.unwrap().was_lost());
    shutdown(m).await;
    let released = stored(&fx, "w1").await;
    assert!(!released.contains_key("_lease"), "{released}");
    assert_eq!(
        mongodb::bson::to_vec(&released).unwrap(),
        mongodb::bson::to_vec(&original).unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn release_on_drop_and_on_shutdown_removes_only_the_lock_field() {
    let fx = Fixture::new("doc_drop").await;
    let m = fx.manager(TTL).await;
    let (first, second) = (user_document("a"), user_document("b"));
    items(&fx)
        .insert_many([first.clone(), second.clone()])
        .await
        .unwrap();
    let docs = m.documents::<Document>(ITEMS).await.unwrap();
    let dropped = docs.acquire("a").await.unwrap();
    let _kept = docs.acquire("b").await.unwrap();
    assert!(stored(&fx, "a").await.contains_key("_lease"));
    assert!(stored(&fx, "b").await.contains_key("_lease"));
    drop(dropped);
    // Shutdown releases the held lease and waits for both lock fields'
    // removal (the leases are younger than DELETE_MIN_TOKEN_AGE).
    shutdown(m).await;
    for original in [first, second] {
        let id = original.get_str("_id").unwrap();
        let now = stored(&fx, id).await;
        assert_eq!(
            mongodb::bson::to_vec(&now).unwrap(),
            mongodb::bson::to_vec(&original).unwrap(),
            "{id}: {now}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_document_without_create_is_not_found_and_nothing_is_inserted() {
    let fx = Fixture::new("doc_missing").await;
    let m = fx.manager(TTL).await;
    let docs = m.documents::<Document>(ITEMS).await.unwrap();
    match docs.try_acquire("ghost").await {
        Err(Error::DocumentNotFound { id, .. }) => {
            assert_eq!(id, mongo_lease::LeaseKey::from("ghost"));
        }
        other => panic!("expected DocumentNotFound, got {other:?}"),
    }
    match docs
        .acquire("ghost")
        .into_future()
        .timeout(WAIT)
        .await
        .ok()
        .transpose()
    {
        Err(Error::DocumentNotFound { .. }) => {}
        other => panic!("expected DocumentNotFound, got {other:?}"),
    }
    assert_eq!(items(&fx).count_documents(doc! {}).await.unwrap(), 0);

    // With `create`, the document is inserted with those fields, once.
    let fields = || doc! { "state": "created", "n": 0 };
    let lease = docs.acquire("ghost").create(fields()).await.unwrap();
    assert_eq!(
        lease.raw_document(),
        &doc! { "_id": "ghost", "state": "created", "n": 0 }
    );
    let committed = lease.commit(doc! { "$inc": { "n": 1 } }).await.unwrap();
    assert_eq!(committed.get_i32("n").unwrap(), 1);
    let again = docs.acquire("ghost").create(fields()).await.unwrap();
    assert_eq!(
        again.raw_document(),
        &doc! { "_id": "ghost", "state": "created", "n": 1 },
        "an existing document is never given the fields to create"
    );
    drop(again);
    shutdown(m).await;
    assert_eq!(items(&fx).count_documents(doc! {}).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_own_lease_field_of_foreign_shape_is_held_and_never_modified() {
    let fx = Fixture::new("doc_foreign").await;
    let m = fx.manager(TTL).await;
    let foreign = [
        doc! { "_id": "string", "_lease": "taken by the night batch" },
        doc! { "_id": "their-lock", "_lease": { "aid": "java-app", "ts": DateTime::now() } },
        doc! { "_id": "int32-token", "_lease": {
            "tok": 5, "exp": DateTime::from_millis(0), "aid": "x",
        }},
        doc! { "_id": "null", "_lease": null, "state": "new" },
        doc! { "_id": "empty", "_lease": {} },
        doc! { "_id": "array", "_lease": [{ "tok": 1_i64, "exp": DateTime::from_millis(0) }] },
    ];
    items(&fx).insert_many(foreign.clone()).await.unwrap();
    let docs = m.documents::<Document>(ITEMS).await.unwrap();
    for original in &foreign {
        let id = original.get_str("_id").unwrap();
        assert!(
            docs.try_acquire(id).await.unwrap().is_none(),
            "{id}: a foreign holder's lock is held"
        );
        assert!(
            docs.acquire(id)
                .into_future()
                .timeout(Duration::from_millis(300))
                .await
                .ok()
                .transpose()
                .unwrap()
                .is_none(),
            "{id}: a waiting acquire does not mark it either"
        );
        assert_eq!(
            mongodb::bson::to_vec(&stored(&fx, id).await).unwrap(),
            mongodb::bson::to_vec(original).unwrap(),
            "{id}: never modified"
        );
    }
    shutdown(m).await;
    for original in &foreign {
        let id = original.get_str("_id").unwrap();
        assert_eq!(&stored(&fx, id).await, original, "{id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_strictly_increase_over_tight_acquire_commit_cycles_and_lock_field_removals()
{
    let fx = Fixture::new("doc_tokens").await;
    let m = fx.manager(TTL).await;
    let docs = m.documents::<Document>(ITEMS).await.unwrap();
    let mut last = 0_u64;
    let mut removals = 0;
    for cycle in 0..40 {
        let lease = docs.acquire("w").create(doc! { "n": 0 }).await.unwrap();
        let token = lease.lease().fencing_token();
        assert!(token > last, "cycle {cycle}: token {token} after {last}");
        last = token;
        let written = lease.commit(doc! { "$inc": { "n": 1 } }).await.unwrap();
        assert_eq!(written.get_i32("n").unwrap(), cycle + 1);
        if cycle % 10 == 9 {
            // Let the manager's follow-up remove the released lock field:
            // the next acquisition starts from a document without one.
            common::eventually("the released lock field is removed", WAIT, || async {
                !stored(&fx, "w").await.contains_key("_lease")
            })
            .await;
            removals += 1;
        }
    }
    assert_eq!(removals, 4);
    shutdown(m).await;
    assert_eq!(stored(&fx, "w").await, doc! { "_id": "w", "n": 40 });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_held_longer_than_the_minimum_token_age_leaves_no_lock_field_after_commit_or_release()
 {
    let fx = Fixture::new("doc_old").await;
    let m = fx.manager(TTL).await;
    items(&fx)
        .insert_many([user_document("c"), user_document("r"), user_document("p")])
        .await
        .unwrap();
    let docs = m.documents::<Document>(ITEMS).await.unwrap();
    let committed = docs.acquire("c").await.unwrap();
    let released = docs.acquire("r").await.unwrap();
    let piped = docs.acquire("p").await.unwrap();
    // Until each token is over a second old by the server's clock (a
    // renewal later than that shows it; 100 ms more for `$$NOW` stepping
    // back a few milliseconds, docs/mongodb-behaviour.md, B3).
    let old_enough = |id: &'static str| {
        let fx = &fx;
        async move {
            let lock = stored(fx, id).await.get_document("_lease").unwrap().clone();
            let token_ms = lock.get_i64("tok").unwrap() >> 20;
            lock.get_datetime("ts").unwrap().timestamp_millis() >= token_ms + 1_100
        }
    };
    for id in ["c", "r", "p"] {
        common::eventually("the token is a second old", WAIT, || old_enough(id)).await;
    }
    let written = committed
        .commit(doc! { "$set": { "state": "done" } })
        .await
        .unwrap();
    assert_eq!(written.get_str("state").unwrap(), "done");
    assert!(!stored(&fx, "c").await.contains_key("_lease"));
    assert!(!released.release().await.unwrap().was_lost());
    assert!(!stored(&fx, "r").await.contains_key("_lease"));
    piped
        .commit(vec![doc! { "$set": { "state": "piped" } }])
        .await
        .unwrap();
    let after = stored(&fx, "p").await;
    assert!(!after.contains_key("_lease"), "{after}");
    assert!(
        !after.keys().any(|k| k.starts_with("__")),
        "no temporary field: {after}"
    );
    shutdown(m).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_update_pipeline_under_the_lease_keeps_the_lock_field_whatever_its_stages_do() {
    let fx = Fixture::new("doc_pipeline").await;
    let m = fx.manager(TTL).await;
    insert_item(&fx, doc! { "_id": "w", "n": 1 }).await;
    let docs = m.documents::<Document>(ITEMS).await.unwrap();
    let mut lease = docs.acquire("w").await.unwrap();
    let before = stored(&fx, "w")
        .await
        .get_document("_lease")
        .unwrap()
        .clone();
    let written = lease
        .update(vec![
            doc! { "$set": { "n": { "$add": ["$n", 1] }, "_lease": "clobbered" } },
            doc! { "$unset": ["_lease"] },
        ])
        .await
        .unwrap()
        .clone();
    assert_eq!(written, doc! { "_id": "w", "n": 2 });
    let after = stored(&fx, "w").await;
    assert_eq!(after.get_document("_lease").unwrap(), &before);
    assert_eq!(after.len(), 3, "{after}");
    // A stage that drops every other field loses the lease, never leaves a
    // foreign-layout lock.
    let dropped = lease
        .update(vec![doc! { "$replaceWith": { "_id": "$_id", "n": 10 } }])
        .await
        .unwrap()
        .clone();
    assert_eq!(dropped, doc! { "_id": "w", "n": 10 });
    let lock = stored(&fx, "w")
        .await
        .get_document("_lease")
        .unwrap()
        .clone();
    assert!(!lock.contains_key("lid"), "released state: {lock}");
    assert_eq!(lock.get_str("aid").unwrap(), m.owner_id());
    assert!(matches!(
        lease.update(doc! { "$set": { "n": 11 } }).await,
        Err(Error::LeaseLost { .. })
    ));
    assert_eq!(stored(&fx, "w").await.get_i32("n").unwrap(), 10);
    let again = docs.acquire("w").await.unwrap();
    assert!(again.lease().fencing_token() > lease.lease().fencing_token());
    drop(again);
    drop(lease);
    shutdown(m).await;
}

/// How many change events the replies to `getMore` in `log` carried (the
/// manager's own change stream of lock writes is its only cursor).
fn streamed_events(log: &common::CommandLog) -> usize {
    log.all()
        .iter()
        .filter(|(name, _)| name == "ok:getMore")
        .filter_map(|(_, reply)| reply.get_document("cursor").ok())
        .filter_map(|cursor| cursor.get_array("nextBatch").ok())
        .map(Vec::len)
        .sum()
}

/// A manager holding the work item `w`, and another (as another process)
/// whose client logs its commands and that polls an hour apart: within a
/// test, only its change stream can wake its waiter. Returns the holder,
/// the waiting manager, its command log and the held lease.
async fn held_and_a_slow_waiter(
    fx: &Fixture,
) -> (
    LeaseManager,
    LeaseManager,
    CommandLog,
    DocumentLease<Document>,
) {
    let holder = fx.manager(TTL).await;
    let (mut options, log) = fx.monitored_options(TTL, "").await;
    options.retry_initial = Duration::from_secs(3600);
    options.retry_max = Duration::from_secs(3600);
    let waiter = LeaseManager::connect(options).await.unwrap();
    let held = holder
        .documents::<Document>(ITEMS)
        .await
        .unwrap()
        .acquire("w")
        .await
        .unwrap();
    (holder, waiter, log, held)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_emit_no_change_event_and_a_commit_wakes_another_managers_waiter_at_once() {
    let fx = Fixture::new("doc_wake").await;
    insert_item(&fx, doc! { "_id": "w", "state": "new" }).await;
    let (holder, waiter, log, held) = held_and_a_slow_waiter(&fx).await;
    let waiting = tokio::spawn({
        let docs = waiter.documents::<Document>(ITEMS).await.unwrap();
        async move { docs.acquire("w").await }
    });
    // The waiter's attempt marked the lease (`_lease.wt`), and its stream
    // is open (its `aggregate` was answered with a cursor).
    common::eventually("the waiter waits with its stream open", WAIT, || async {
        let marked = stored(&fx, "w")
            .await
            .get_document("_lease")
            .unwrap()
            .contains_key("wt");
        let watching = log.all().iter().any(|(name, reply)| {
            name == "ok:aggregate"
                && reply
                    .get_document("cursor")
                    .is_ok_and(|c| c.contains_key("id"))
        });
        marked && watching
    })
    .await;
    // Two renewals by the holder's heartbeat after the stream opened...
    let ts = |doc: Document| {
        *doc.get_document("_lease")
            .unwrap()
            .get_datetime("ts")
            .unwrap()
    };
    let first = ts(stored(&fx, "w").await);
    common::eventually("a renewal", WAIT, || async {
        ts(stored(&fx, "w").await) > first
    })
    .await;
    let second = ts(stored(&fx, "w").await);
    common::eventually("another renewal", WAIT, || async {
        ts(stored(&fx, "w").await) > second
    })
    .await;
    // ...and the waiter's stream has answered a `getMore` since, with no
    // event: renewals and the waiting mark are filtered out on the server.
    let answered = log.count("ok:getMore");
    common::eventually("the stream answers a getMore", WAIT, || async {
        log.count("ok:getMore") > answered
    })
    .await;
    assert_eq!(streamed_events(&log), 0);
    assert!(!waiting.is_finished());

    let committed = held
        .commit(doc! { "$set": { "state": "done" } })
        .await
        .unwrap();
    assert_eq!(committed.get_str("state").unwrap(), "done");
    let lease = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("woken by the commit's change event")
        .unwrap()
        .unwrap();
    assert_eq!(lease.raw_document().get_str("state").unwrap(), "done");
    assert!(streamed_events(&log) >= 1);
    let lock = stored(&fx, "w")
        .await
        .get_document("_lease")
        .unwrap()
        .clone();
    assert_eq!(lock.get_str("aid").unwrap(), waiter.owner_id());
    drop(lease);
    shutdown(waiter).await;
    shutdown(holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_delete_of_the_document_wakes_another_managers_waiter_at_once() {
    let fx = Fixture::new("doc_delete_wake").await;
    insert_item(&fx, doc! { "_id": "w" }).await;
    let (holder, waiter, log, held) = held_and_a_slow_waiter(&fx).await;
    let waiting = tokio::spawn({
        let docs = waiter.documents::<Document>(ITEMS).await.unwrap();
        async move {
            docs.acquire("w")
                .create(doc! { "state": "recreated" })
                .await
        }
    });
    common::eventually("the waiter waits with its stream open", WAIT, || async {
        log.all().iter().any(|(name, reply)| {
            name == "ok:aggregate"
                && reply
                    .get_document("cursor")
                    .is_ok_and(|c| c.contains_key("id"))
        }) && stored(&fx, "w")
            .await
            .get_document("_lease")
            .unwrap()
            .contains_key("wt")
    })
    .await;
    let deleted = items(&fx).delete_one(doc! { "_id": "w" }).await.unwrap();
    assert_eq!(deleted.deleted_count, 1);
    let lease = tokio::time::timeout(WAIT, waiting)
        .await
        .expect("woken by the delete")
        .unwrap()
        .unwrap();
    assert_eq!(
        lease.raw_document(),
        &doc! { "_id": "w", "state": "recreated" }
    );
    // The holder learns of the loss from the same stream.
    tokio::time::timeout(WAIT, held.lease().status().lost())
        .await
        .expect("the holder's token fires");
    drop(held);
    drop(lease);
    shutdown(waiter).await;
    shutdown(holder).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_creating_acquires_of_managers_create_the_document_once_with_one_winner() {
    let fx = Fixture::new("doc_create_race").await;
    let managers = fx.managers(4, TTL).await;
    for round in 0..5 {
        let id = format!("new-{round}");
        let start = std::sync::Arc::new(tokio::sync::Barrier::new(managers.len()));
        let attempts: Vec<_> = managers
            .iter()
            .map(|m| {
                let (m, id, start) = (m.clone(), id.clone(), start.clone());
                tokio::spawn(async move {
                    let docs = m.documents::<Document>(ITEMS).await.unwrap();
                    let fields = doc! { "state": "created", "by": m.owner_id() };
                    start.wait().await;
                    docs.try_acquire(id.as_str()).create(fields).await
                })
            })
            .collect();
        let mut winners = Vec::new();
        // A hang guard only (WAIT): the four attempts take milliseconds here.
        for attempt in attempts {
            let attempt = common::within(WAIT, "a creating try_acquire", attempt).await;
            if let Some(lease) = attempt.unwrap().unwrap() {
                winners.push(lease);
            }
        }
        assert_eq!(winners.len(), 1, "round {round}: one winner");
        let stored = stored(&fx, &id).await;
        assert_eq!(
            stored
                .get_document("_lease")
                .unwrap()
                .get_str("aid")
                .unwrap(),
            stored.get_str("by").unwrap(),
            "round {round}: the winner's fields and lock: {stored}"
        );
        assert_eq!(
            items(&fx)
                .count_documents(doc! { "_id": &id })
                .await
                .unwrap(),
            1
        );
    }
    for m in managers {
        shutdown(m).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_takeover_by_another_manager_makes_the_holders_token_fire_before_its_next_heartbeat() {
    // The holder renews every 20 s: within the bound below, only its change
    // stream (`watch_held_leases`) can tell it.
    const LONG_TTL: Duration = Duration::from_secs(60);
    const AT_ONCE: Duration = Duration::from_secs(10);
    let fx = Fixture::new("doc_takeover").await;
    let filler = "x".repeat(2_000);
    // A small document (the takeover may be logged as a replacement) and a
    // large one (logged as an update of `_lease.aid`, `_lease.lid`, ...).
    items(&fx)
        .insert_many([
            doc! { "_id": "small" },
            doc! { "_id": "large", "filler": filler },
        ])
        .await
        .unwrap();
    let (mut options, log) = fx.monitored_options(LONG_TTL, "").await;
    options.watch_held_leases = true;
    let holder = LeaseManager::connect(options).await.unwrap();
    let other = fx.manager(TTL).await;
    let held = holder.documents::<Document>(ITEMS).await.unwrap();
    let taking = other.documents::<Document>(ITEMS).await.unwrap();
    let ids = ["small", "large"];
    let mut leases = Vec::new();
    for id in ids {
        leases.push(held.acquire(id).await.unwrap());
    }
    // The holder's stream opens after its first acquire (a write before that
    // is left to the heartbeat): the takeovers come once it is open, and it
    // stays open while the second lease is held.
    wait_until_watching(&fx, &log).await;
    for (id, lease) in ids.into_iter().zip(leases) {
        let before = stored(&fx, id).await;
        // The lease expires on the server (as if its holder had frozen):
        // a write of `_lease.exp` only, which announces nothing.
        items(&fx)
            .update_one(
                doc! { "_id": id },
                doc! { "$set": { "_lease.exp": DateTime::from_millis(0) } },
            )
            .await
            .unwrap();
        let taken = taking.try_acquire(id).await.unwrap().expect("expired");
        assert!(taken.lease().fencing_token() > lease.lease().fencing_token());
        assert_eq!(user_bytes(&stored(&fx, id).await), user_bytes(&before));
        tokio::time::timeout(AT_ONCE, lease.lease().status().lost())
            .await
            .unwrap_or_else(|_| panic!("{id}: the holder's token fires at once"));
        assert!(matches!(
            lease.commit(doc! { "$set": { "late": true } }).await,
            Err(Error::LeaseLost { .. })
        ));
        assert!(!stored(&fx, id).await.contains_key("late"));
        drop(taken);
    }
    shutdown(other).await;
    shutdown(holder).await;
}
