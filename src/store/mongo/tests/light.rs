//! The light forms on a real `mongod`: where one applies, it writes what
//! the general form writes; where it does not, it changes nothing and the
//! general form decides; grouped, one command (and one read) answers each
//! request. The requests go as the actor's group commit sends them: the
//! first alone, those asked for meanwhile together.

use super::*;
use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::MongoStore;
use crate::store::{AcquireOutcome, Handoff, HandoffOutcome, LeaseRef, Store, StoreExt, field};
use crate::store::{
    light_acquire::{LightAcquire, LightAcquired},
    light_release::LightRelease,
};
use mongodb::bson::{DateTime, Document, doc};
use mongodb::event::{EventHandler, command::CommandEvent};
use mongodb::{Collection, Database};
use uuid::Uuid;

/// The TTL of the scenario's leases.
const TTL_MS: i64 = 60_000;

/// The store's own TTL (the manager's), other than the leases' own: each
/// form writes the TTL its request carries.
const STORE_TTL_MS: u64 = 90_000;

/// The names of the commands a client started, in order.
#[derive(Clone, Default)]
struct Commands(Arc<Mutex<Vec<String>>>);

impl Commands {
    /// How many `name` commands were started since the last call.
    fn take(&self, name: &str) -> usize {
        let mut log = self.0.lock().unwrap();
        let n = log.iter().filter(|c| *c == name).count();
        log.clear();
        n
    }

    /// How many of each command were started since the last call, those
    /// of the server's own monitoring aside.
    fn counts(&self) -> std::collections::BTreeMap<String, usize> {
        let mut log = self.0.lock().unwrap();
        let mut counts = std::collections::BTreeMap::new();
        for name in log.drain(..) {
            *counts.entry(name).or_insert(0) += 1;
        }
        counts
    }
}

/// A store of owner `a` on a new collection, through a client whose
/// commands are counted.
struct Env {
    db: Database,
    collection: String,
    commands: Commands,
    store: MongoStore,
}

impl Env {
    async fn new() -> Env {
        Env::on(crate::testkit::shared_uri()).await
    }

    /// An `Env` on the deployment at `uri`.
    async fn on(uri: impl AsRef<str>) -> Env {
        let commands = Commands::default();
        let mut options = mongodb::options::ClientOptions::parse(uri.as_ref())
            .await
            .unwrap();
        let log = commands.clone();
        options.command_event_handler = Some(EventHandler::callback(move |event| {
            if let CommandEvent::Started(started) = event {
                log.0.lock().unwrap().push(started.command_name.clone());
            }
        }));
        let client = mongodb::Client::with_options(options).unwrap();
        let db = client.database("mongo_lease_contract");
        let (collection, store) =
            super::test_store(&db, "light", Duration::from_millis(STORE_TTL_MS));
        Env {
            db,
            collection,
            commands,
            store,
        }
    }

    fn raw(&self) -> Collection<Document> {
        self.db.collection(&self.collection)
    }

    async fn put(&self, doc: Document) {
        self.raw().insert_one(doc).await.unwrap();
    }

    async fn get(&self, key: &str) -> Option<Document> {
        self.raw().find_one(doc! { "_id": key }).await.unwrap()
    }

    /// `key` acquired by the store through the general form.
    async fn acquire_general(&self, key: &str, lease_id: Uuid) -> AcquireOutcome {
        self.store
            .acquire_once(key.into(), lease_id, true, TTL_MS, None, None)
            .await
            .unwrap()
    }

    /// `key` acquired by the store, for the scenario's setup.
    async fn take(&self, key: &str) -> LeaseRef {
        let lease = LeaseRef {
            key: key.into(),
            lease_id: Uuid::new_v4(),
            kind: crate::kind::LeaseKind::Exclusive,
        };
        let token = light_acquire(&self.store, key, lease.lease_id).await;
        assert!(token.is_some(), "{key} taken");
        lease
    }

    /// The releases of `leases` as the actor sends them: the light form,
    /// the first alone and the others grouped, then the general release
    /// for each lease the light form did not release. How many each
    /// released.
    async fn release(&self, leases: &[LeaseRef]) -> Vec<u64> {
        let mut answers = self.store.light_releases(leases[..1].to_vec(), false).await;
        if leases.len() > 1 {
            answers.extend(self.store.light_releases(leases[1..].to_vec(), false).await);
        }
        let mut counts = Vec::new();
        for (lease, answer) in leases.iter().zip(answers) {
            match answer {
                LightRelease::Released => {
                    counts.push(1);
                    continue;
                }
                LightRelease::Failed(e) => panic!("{e}"),
                LightRelease::NotApplied => {}
            }
            let count = self.store.release_by_id(vec![lease.clone()]).await.unwrap();
            counts.push(count);
        }
        counts
    }

    /// The general release of `lease` alone (its pipeline, not the light
    /// form first): how many leases it released.
    async fn release_general(&self, lease: &LeaseRef) -> u64 {
        let selection = Selection::Leases {
            owner: "a",
            ids: vec![lease.lease_id],
        };
        let filter = holder_filter("a", std::slice::from_ref(lease));
        self.store
            .release_matching(filter, &selection, true, false)
            .await
            .unwrap()
    }

    async fn drop(self) {
        self.raw().drop().await.unwrap();
    }
}

/// The light acquire of `key` under `lease_id` (alone): its token if it
/// acquired it.
async fn light_acquire(store: &MongoStore, key: &str, lease_id: Uuid) -> Option<u64> {
    light_acquire_for(store, key, lease_id, Duration::from_millis(TTL_MS as u64)).await
}

/// [`light_acquire`] with the lease's `ttl`.
async fn light_acquire_for(
    store: &MongoStore,
    key: &str,
    lease_id: Uuid,
    ttl: Duration,
) -> Option<u64> {
    let request = LightAcquire {
        key: key.into(),
        lease_id,
        ttl,
        started: tokio::time::Instant::now(),
    };
    match store.light_acquires(vec![request]).await.pop().unwrap() {
        LightAcquired::Acquired(token) | LightAcquired::AcquiredShort { token, .. } => Some(token),
        LightAcquired::NotApplied => None,
        LightAcquired::Failed(e) => panic!("{e}"),
    }
}

/// A date `secs` from now (negative: in the past).
fn at(secs: i64) -> DateTime {
    DateTime::from_millis(DateTime::now().timestamp_millis() + secs * 1000)
}

/// A lock document of `owner` with token 7, expiring at `exp`.
fn lock(key: &str, owner: &str, exp: DateTime) -> Document {
    doc! {
        "_id": key, field::OWNER: owner, field::TOKEN: 7_i64,
        field::ACQUIRED_AT: at(-20), field::RENEWED_AT: at(-20), field::EXPIRES_AT: exp,
    }
}

/// `doc` with `fields` added.
fn with(mut doc: Document, fields: Document) -> Document {
    doc.extend(fields);
    doc
}

/// `doc`, of our layout, as any write of it leaves it (`rules::restated`):
/// with `obtained_at = ts` and `ttl = (exp − ts)` in seconds, as another
/// lock pattern's clients read it.
fn restated(mut doc: Document) -> Document {
    let ts = *doc.get_datetime(field::RENEWED_AT).unwrap();
    let exp = doc.get_datetime(field::EXPIRES_AT).unwrap();
    // Held to the other pattern's clients until `exp`, and until the
    // token is `DELETE_MIN_TOKEN_AGE` old (+ 1 ms).
    let token = doc.get_i64(field::TOKEN).unwrap() >> crate::token::TOKEN_TIME_SHIFT;
    let deletable_at = token + crate::config::DELETE_MIN_TOKEN_AGE.as_millis() as i64 + 1;
    let until = exp.timestamp_millis().max(deletable_at);
    let ttl = (until - ts.timestamp_millis()) as f64 / 1000.0;
    doc.insert(field::OBTAINED_AT, ts);
    doc.insert(field::TTL_SECONDS, ttl);
    doc
}

/// The field names of `doc`, sorted.
fn names(doc: &Document) -> Vec<String> {
    let mut names: Vec<String> = doc.keys().cloned().collect();
    names.sort();
    names
}

/// What a new acquisition by `a` under `lease_id` must have written.
fn assert_acquired(doc: &Document, lease_id: Uuid) {
    assert_eq!(doc.get_str(field::OWNER).unwrap(), "a", "{doc}");
    assert_eq!(doc.get(field::LEASE_ID), Some(&bson_lease_id(lease_id)));
    assert!(doc.get_i64(field::TOKEN).unwrap() > 7, "{doc}");
    let ts = doc.get_datetime(field::RENEWED_AT).unwrap();
    let exp = doc.get_datetime(field::EXPIRES_AT).unwrap();
    assert_eq!(exp.timestamp_millis() - ts.timestamp_millis(), TTL_MS);
    assert_eq!(doc.get_datetime(field::OBTAINED_AT), Ok(ts), "{doc}");
    assert_eq!(
        doc.get_f64(field::TTL_SECONDS),
        Ok(TTL_MS as f64 / 1000.0),
        "{doc}"
    );
}

#[tokio::test]
async fn where_the_light_acquire_applies_it_writes_the_general_acquires_document() {
    let env = Env::new().await;
    let states = [
        // Released (keep mode) by another owner.
        lock("released", "b", at(-5)),
        // Expired, with a payload and another owner's waiting mark.
        with(
            lock("expired", "b", at(-5)),
            doc! { field::LEASE_ID: bson_lease_id(Uuid::new_v4()), field::PAYLOAD: { "x": 1 }, field::WAITING_SINCE: at(-6) },
        ),
        // Yielded by another owner: free for us.
        with(
            lock("yielded", "b", at(-1)),
            doc! { field::YIELD_UNTIL: at(60) },
        ),
    ];
    for state in states {
        let key = state.get_str("_id").unwrap().to_string();
        let general_key = format!("{key}-general");
        env.put(state.clone()).await;
        env.put(with(state.clone(), doc! { "_id": &general_key }))
            .await;
        let lease_id = Uuid::new_v4();
        let light = light_acquire(&env.store, &key, lease_id).await;
        let general = env.acquire_general(&general_key, lease_id).await;
        assert!(light.is_some(), "{key}: the light form applies");
        assert!(
            matches!(general, AcquireOutcome::Acquired { .. }),
            "{key}: {general:?}"
        );
        let (light, general) = (
            env.get(&key).await.unwrap(),
            env.get(&general_key).await.unwrap(),
        );
        assert_acquired(&light, lease_id);
        assert_acquired(&general, lease_id);
        assert_eq!(names(&light), names(&general), "{key}");
    }
    // A missing document: created as the general form creates it.
    let lease_id = Uuid::new_v4();
    let light = light_acquire(&env.store, "new", lease_id).await;
    assert!(light.is_some());
    env.acquire_general("new-general", lease_id).await;
    let (light, general) = (
        env.get("new").await.unwrap(),
        env.get("new-general").await.unwrap(),
    );
    assert_eq!(names(&light), names(&general));
    env.drop().await;
}

/// A light acquisition whose TTL is shorter than `DELETE_MIN_TOKEN_AGE`
/// reads held to another lock pattern's clients until the token it gives is
/// that old (+ 1 ms), not only until its expiry: the restated `ttl` counts
/// from this write's token, not from the one it follows ("Read by other
/// clients" in `store`).
#[tokio::test]
async fn a_short_light_acquisition_reads_held_to_other_clients_until_its_token_is_old_enough() {
    let env = Env::new().await;
    env.put(lock("short", "b", at(-5))).await;
    let ttl = Duration::from_millis(100);
    let acquired = light_acquire_for(&env.store, "short", Uuid::new_v4(), ttl).await;
    assert!(acquired.is_some(), "the light form applies");
    let doc = env.get("short").await.unwrap();
    assert_eq!(doc, restated(doc.clone()));
    assert!(doc.get_f64(field::TTL_SECONDS).unwrap() > 1.0, "{doc}");
    env.drop().await;
}

#[tokio::test]
async fn where_the_light_acquire_does_not_apply_it_changes_nothing() {
    let env = Env::new().await;
    let ours = Uuid::new_v4();
    let released = |key: &str| lock(key, "b", at(-5));
    let states = [
        // Live.
        with(
            lock("live", "b", at(60)),
            doc! { field::LEASE_ID: bson_lease_id(Uuid::new_v4()) },
        ),
        // A live registration in the queue of waiting owners.
        with(
            released("queued"),
            doc! { field::QUEUE: [{ field::OWNER: "c", field::REGISTRATION_EXPIRES: at(60) }] },
        ),
        // A shared key's holders, a semaphore's permits, an exclusive
        // waiter's mark on a shared key.
        with(released("holders"), doc! { field::HOLDERS: [] }),
        with(released("permits"), doc! { field::PERMITS: 2 }),
        with(
            released("marked"),
            doc! { field::EXCLUSIVE_WAITER: { field::OWNER: "c" } },
        ),
        // Yielded by this owner.
        with(
            lock("yielded", "a", at(-1)),
            doc! { field::YIELD_UNTIL: at(60) },
        ),
        // An earlier attempt under the same lease id (a retry keeps its token).
        with(
            lock("retry", "a", at(-1)),
            doc! { field::LEASE_ID: bson_lease_id(ours) },
        ),
    ];
    // Another application's documents, never written.
    let foreign = [
        // Another application's document.
        doc! { "_id": "foreign", "owner": "x", "until": at(-5) },
        // Another application's lock by an upsert of `_id` alone.
        doc! { "_id": "bare" },
        // A released lease of ours that another lock pattern's client
        // took over (free without its `value`).
        with(lock("taken", "b", at(-5)), doc! { field::OTHER_OWNER: "x" }),
    ];
    // Byte for byte: the light acquire restates only what it acquires.
    for state in states.into_iter().chain(foreign) {
        let key = state.get_str("_id").unwrap().to_string();
        env.put(state.clone()).await;
        let light = light_acquire(&env.store, &key, ours).await;
        assert_eq!(light, None, "{key}");
        assert_eq!(
            env.get(&key).await.as_ref(),
            Some(&state),
            "{key} unchanged"
        );
    }
    env.drop().await;
}

#[tokio::test]
async fn the_light_release_writes_the_general_releases_document_and_defers_to_it_when_someone_waits()
 {
    let env = Env::new().await;
    let light = env.take("light").await;
    let general = env.take("general").await;
    assert_eq!(env.release(std::slice::from_ref(&light)).await, [1]);
    assert_eq!(env.release_general(&general).await, 1);
    let (light_doc, general_doc) = (
        env.get("light").await.unwrap(),
        env.get("general").await.unwrap(),
    );
    assert_eq!(names(&light_doc), names(&general_doc));
    assert!(!light_doc.contains_key(field::LEASE_ID));
    assert!(light_doc.get_datetime(field::EXPIRES_AT).unwrap() <= &DateTime::now());

    // Another owner's waiting mark: the general release serves it (the yield).
    let waited = env.take("waited").await;
    env.raw()
        .update_one(
            doc! { "_id": "waited" },
            doc! { "$set": { field::WAITING_SINCE: DateTime::now() } },
        )
        .await
        .unwrap();
    env.commands.take("update");
    assert_eq!(env.release(std::slice::from_ref(&waited)).await, [1]);
    assert_eq!(env.commands.take("update"), 2, "light, then general");
    let doc = env.get("waited").await.unwrap();
    assert!(!doc.contains_key(field::WAITING_SINCE), "{doc}");
    assert!(doc.contains_key(field::YIELD_UNTIL), "{doc}");
    // Released already: counted once, whichever form.
    assert_eq!(env.release(std::slice::from_ref(&light)).await, [0]);
    env.drop().await;
}

/// Another manager's owner registered in the queue of waiting owners (by
/// its general acquire, with a payload): the light release's form that
/// hands over hands it the key in its one write (the other form changes
/// nothing), leaving the document the general release leaves
/// (the next token, the entry's lease id and payload, no queue, mark nor
/// yield), restated; with a lease id no longer held, it changes nothing.
#[tokio::test]
async fn the_light_release_hands_the_key_to_a_registered_owner_as_the_general_release_does() {
    let env = Env::new().await;
    let b = MongoStore::new(
        &env.db,
        &env.collection,
        "b".into(),
        Duration::from_millis(TTL_MS as u64),
        Duration::from_secs(1),
        Duration::from_secs(30),
    );
    let payload = doc! { "job": 7 };
    let mut handed = Vec::new();
    for key in ["light", "general"] {
        let lease = env.take(key).await;
        let registered = Uuid::new_v4();
        let outcome = b
            .acquire_once(
                key.into(),
                registered,
                true,
                TTL_MS,
                None,
                Some(payload.clone()),
            )
            .await
            .unwrap();
        assert!(
            matches!(outcome, AcquireOutcome::Held { .. }),
            "{outcome:?}"
        );
        let before = env.get(key).await.unwrap();
        assert!(before.contains_key(field::QUEUE) && before.contains_key(field::WAITING_SINCE));
        handed.push((lease, registered, before.get_i64(field::TOKEN).unwrap()));
    }
    // The form for keys nobody waits for leaves it to the general release.
    let before = env.get("light").await.unwrap();
    let sent = env.store.release_light_command(&handed[0].0, false);
    assert_eq!(sent.await.unwrap(), 0);
    assert_eq!(env.get("light").await.unwrap(), before, "unchanged");
    env.commands.take("update");
    assert_eq!(
        env.store
            .release_light_command(&handed[0].0, true)
            .await
            .unwrap(),
        1
    );
    assert_eq!(env.commands.take("update"), 1);
    let general = &handed[1].0;
    assert_eq!(env.release_general(general).await, 1);
    let (light_doc, general_doc) = (
        env.get("light").await.unwrap(),
        env.get("general").await.unwrap(),
    );
    assert_eq!(names(&light_doc), names(&general_doc));
    for (doc, (_, registered, token)) in [&light_doc, &general_doc].into_iter().zip(&handed) {
        assert_eq!(doc.get_str(field::OWNER), Ok("b"), "{doc}");
        assert_eq!(doc.get(field::LEASE_ID), Some(&bson_lease_id(*registered)));
        assert!(doc.get_i64(field::TOKEN).unwrap() > *token, "{doc}");
        assert_eq!(doc.get_document(field::PAYLOAD), Ok(&payload), "{doc}");
        assert_eq!(doc.get_i64(field::TRANSITIONS), Ok(1), "{doc}");
        for gone in [field::QUEUE, field::WAITING_SINCE, field::YIELD_UNTIL] {
            assert!(!doc.contains_key(gone), "{gone}: {doc}");
        }
        assert_eq!(*doc, restated(doc.clone()));
    }
    // Sent again (its first send landed): nothing left to write.
    assert_eq!(
        env.store
            .release_light_command(&handed[0].0, true)
            .await
            .unwrap(),
        0
    );
    assert_eq!(env.get("light").await.unwrap(), light_doc, "unchanged");
    // Landing late, after this owner took the key again and another
    // registered: the newer lease keeps the key.
    let old = env.take("late").await;
    assert_eq!(env.release(std::slice::from_ref(&old)).await, [1]);
    env.take("late").await;
    let outcome = b
        .acquire_once("late".into(), Uuid::new_v4(), true, TTL_MS, None, None)
        .await
        .unwrap();
    assert!(
        matches!(outcome, AcquireOutcome::Held { .. }),
        "{outcome:?}"
    );
    let before = env.get("late").await.unwrap();
    assert_eq!(
        env.store.release_light_command(&old, true).await.unwrap(),
        0
    );
    assert_eq!(env.get("late").await.unwrap(), before, "unchanged");
    env.drop().await;
}

/// The light release's answer is `nModified`: a lease it no longer finds
/// (another owner's lease now, in a document whose restated fields lag,
/// e.g. written before they existed) is 0 and the document unchanged, and a
/// release of ours restates them in its own write.
#[tokio::test]
async fn a_light_release_that_does_not_apply_changes_nothing_even_a_document_not_restated() {
    let env = Env::new().await;
    let ours = env.take("k").await;
    let theirs = with(
        lock("k", "b", at(30)),
        doc! { field::LEASE_ID: bson_lease_id(Uuid::new_v4()) },
    );
    env.raw()
        .replace_one(doc! { "_id": "k" }, theirs.clone())
        .await
        .unwrap();
    assert_eq!(
        env.store.release_light_command(&ours, false).await.unwrap(),
        0
    );
    assert_eq!(env.get("k").await.unwrap(), theirs, "unchanged");

    let ours = env.take("m").await;
    assert_eq!(
        env.store.release_light_command(&ours, false).await.unwrap(),
        1
    );
    let released = env.get("m").await.unwrap();
    assert_eq!(
        released,
        restated(released.clone()),
        "restated by the release"
    );
    env.drop().await;
}

#[tokio::test]
async fn the_light_handoff_writes_the_general_handoffs_document() {
    let env = Env::new().await;
    let light = env.take("light").await;
    let general = env.take("general").await;
    let to = Uuid::new_v4();
    let handoff = |from: &LeaseRef, light| Handoff {
        key: from.key.clone(),
        from: from.lease_id,
        to,
        ttl: Duration::from_millis(TTL_MS as u64),
        light,
    };
    let handed = env.store.handoff(handoff(&light, true)).await.unwrap();
    assert!(
        matches!(handed, HandoffOutcome::Acquired { .. }),
        "{handed:?}"
    );
    let handed = env.store.handoff(handoff(&general, false)).await.unwrap();
    assert!(
        matches!(handed, HandoffOutcome::Acquired { .. }),
        "{handed:?}"
    );
    let (light_doc, general_doc) = (
        env.get("light").await.unwrap(),
        env.get("general").await.unwrap(),
    );
    assert_eq!(names(&light_doc), names(&general_doc));
    for doc in [&light_doc, &general_doc] {
        assert_eq!(doc.get(field::LEASE_ID), Some(&bson_lease_id(to)));
        let ts = doc.get_datetime(field::RENEWED_AT).unwrap();
        let exp = doc.get_datetime(field::EXPIRES_AT).unwrap();
        assert_eq!(
            exp.timestamp_millis() - ts.timestamp_millis(),
            TTL_MS,
            "the handoff's TTL: {doc}"
        );
    }
    env.drop().await;
}

/// `n` leases of keys `{prefix}0..`, under new lease ids.
fn leases(prefix: &str, n: usize) -> Vec<LeaseRef> {
    (0..n)
        .map(|i| LeaseRef {
            key: format!("{prefix}{i}").as_str().into(),
            lease_id: Uuid::new_v4(),
            kind: crate::kind::LeaseKind::Exclusive,
        })
        .collect()
}

/// `leases` acquired for a scenario's setup: the light acquires asked for
/// at once, and the general form for any the batch left to it (its
/// freshness bound is strict, and a slow machine can make it refuse).
async fn take_all(env: &Env, leases: &[LeaseRef]) {
    let tokens = acquire_all(env, leases).await;
    for (lease, token) in leases.iter().zip(tokens) {
        if token.is_none() {
            let key = lease.key.as_str().unwrap();
            let outcome = env.acquire_general(key, lease.lease_id).await;
            assert!(
                matches!(outcome, AcquireOutcome::Acquired { .. }),
                "{outcome:?}"
            );
        }
    }
}

/// The light acquires of `leases`, as the actor sends them when they are
/// asked for at once: the first alone, the others grouped.
async fn acquire_all(env: &Env, leases: &[LeaseRef]) -> Vec<Option<u64>> {
    // Started a second before, as the contract's requests (slack for the
    // bound on a busy server).
    let request = |l: &LeaseRef| LightAcquire {
        key: l.key.clone(),
        lease_id: l.lease_id,
        ttl: Duration::from_millis(TTL_MS as u64),
        started: tokio::time::Instant::now() - Duration::from_secs(1),
    };
    let mut answers = env.store.light_acquires(vec![request(&leases[0])]).await;
    let rest = leases[1..].iter().map(request).collect();
    answers.extend(env.store.light_acquires(rest).await);
    answers
        .into_iter()
        .map(|answer| match answer {
            LightAcquired::Acquired(token) | LightAcquired::AcquiredShort { token, .. } => {
                Some(token)
            }
            LightAcquired::NotApplied => None,
            LightAcquired::Failed(e) => panic!("{e}"),
        })
        .collect()
}

#[tokio::test]
async fn light_acquires_asked_for_while_one_is_in_flight_go_in_one_update_and_one_find() {
    let env = Env::new().await;
    let leases = leases("k", 20);
    env.commands.counts();
    let tokens = acquire_all(&env, &leases).await;
    // The first alone, at once; the 19 that queued behind it together.
    let counts = env.commands.counts();
    assert_eq!(counts.get("findAndModify"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("update"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("find"), Some(&1), "{counts:?}");
    for (lease, token) in leases.iter().zip(&tokens) {
        let doc = env.get(lease.key.as_str().unwrap()).await.unwrap();
        assert_acquired(&doc, lease.lease_id);
        // `None`: the `find` ran too late for its freshness bound to tell
        // this write from an earlier one (a slow machine), so the key is
        // left to the general form; never a token that is not the write's.
        assert!(
            token.is_none_or(|t| t == doc.get_i64(field::TOKEN).unwrap() as u64),
            "{token:?} {doc}"
        );
    }
    env.drop().await;
}

#[tokio::test]
async fn a_batched_acquire_leaves_a_held_key_unchanged_and_a_stale_write_under_its_lease_id_to_the_general_form()
 {
    let env = Env::new().await;
    let held = lock("held", "b", at(30));
    env.put(held.clone()).await;
    // An earlier attempt under the same lease id that landed (its outcome
    // unknown to the caller), expiring sooner than a new acquisition would.
    let stale_id = Uuid::new_v4();
    env.put(with(
        lock("stale", "a", at(5)),
        doc! { field::LEASE_ID: bson_lease_id(stale_id) },
    ))
    .await;
    let mut all = leases("free", 3);
    all.push(LeaseRef {
        key: "held".into(),
        lease_id: Uuid::new_v4(),
        kind: crate::kind::LeaseKind::Exclusive,
    });
    all.push(LeaseRef {
        key: "stale".into(),
        lease_id: stale_id,
        kind: crate::kind::LeaseKind::Exclusive,
    });
    // Another application's lock by an upsert of `_id` alone.
    let bare = doc! { "_id": "bare" };
    env.put(bare.clone()).await;
    all.push(LeaseRef {
        key: "bare".into(),
        lease_id: Uuid::new_v4(),
        kind: crate::kind::LeaseKind::Exclusive,
    });
    let tokens = acquire_all(&env, &all).await;
    // A free key is acquired by the batch, unless the `find` ran late enough
    // that its freshness bound cannot tell this write from an earlier one
    // (a slow machine): then it is left to the general form, which wins it
    // as a retry under the same lease id. Either way it is ours.
    for (i, (lease, token)) in all[..3].iter().zip(&tokens).enumerate() {
        let general = match token {
            Some(_) => None,
            None => Some(
                env.acquire_general(&format!("free{i}"), lease.lease_id)
                    .await,
            ),
        };
        assert!(
            token.is_some() || matches!(general, Some(AcquireOutcome::Acquired { .. })),
            "{tokens:?} {general:?}"
        );
    }
    assert_eq!(tokens[3], None, "held by b");
    assert_eq!(tokens[4], None, "not taken as this write's");
    assert_eq!(tokens[5], None, "held by a foreign holder");
    assert_eq!(env.get("held").await.unwrap(), held, "unchanged");
    assert_eq!(env.get("bare").await.unwrap(), bare, "unchanged");
    // The general form then renews it as a retry, for a whole TTL.
    let outcome = env.acquire_general("stale", stale_id).await;
    assert!(
        matches!(outcome, AcquireOutcome::Acquired { .. }),
        "{outcome:?}"
    );
    let doc = env.get("stale").await.unwrap();
    let left = doc
        .get_datetime(field::EXPIRES_AT)
        .unwrap()
        .timestamp_millis()
        - DateTime::now().timestamp_millis();
    assert!(left > TTL_MS - 10_000, "{doc}");
    env.drop().await;
}

#[tokio::test]
async fn light_releases_asked_for_together_release_each_lease_and_report_a_lost_one_lost() {
    let env = Env::new().await;
    let leases = leases("r", 6);
    take_all(&env, &leases).await;
    // r1: taken over by another owner; r2: another owner waits for it.
    env.raw()
        .update_one(
            doc! { "_id": "r1" },
            doc! { "$set": { field::OWNER: "b", field::LEASE_ID: bson_lease_id(Uuid::new_v4()) } },
        )
        .await
        .unwrap();
    env.raw()
        .update_one(
            doc! { "_id": "r2" },
            doc! { "$set": { field::WAITING_SINCE: DateTime::now() } },
        )
        .await
        .unwrap();
    env.commands.counts();
    let counts = env.release(&leases).await;
    // r1 is lost, and the batch's modified count (3) does not tell which
    // of r1, r3, r4, r5 it released: all four are reported lost (a release
    // reported as a loss, never the reverse).
    assert_eq!(counts, [1, 0, 1, 0, 0, 0]);
    let commands = env.commands.counts();
    // r0 alone; r1..r5 in one update and one find; then the general
    // release of r1..r5.
    assert_eq!(commands.get("find"), Some(&1), "{commands:?}");
    for lease in &leases {
        let key = lease.key.as_str().unwrap();
        let doc = env.get(key).await.unwrap();
        if key == "r1" {
            assert_eq!(doc.get_str(field::OWNER).unwrap(), "b", "untouched");
            assert!(doc.contains_key(field::LEASE_ID), "{doc}");
        } else {
            assert!(!doc.contains_key(field::LEASE_ID), "{doc}");
        }
    }
    let waited = env.get("r2").await.unwrap();
    assert!(
        waited.contains_key(field::YIELD_UNTIL),
        "the general release: {waited}"
    );
    env.drop().await;
}

#[tokio::test]
async fn a_force_released_lease_in_a_grouped_release_is_reported_lost() {
    let env = Env::new().await;
    let leases = leases("f", 4);
    take_all(&env, &leases).await;
    // f2: force released by an operator (`lid` removed, `aid` kept), as
    // by `release --force`.
    force_release(&env, "f2").await;
    env.commands.counts();
    let counts = env.release(&leases).await;
    let commands = env.commands.counts();
    assert_eq!(
        commands.get("find"),
        Some(&1),
        "f1..f3 grouped: {commands:?}"
    );
    assert_eq!(counts[0], 1, "f0, alone, released");
    assert_eq!(counts[2], 0, "the force-released lease is lost: {counts:?}");
    env.drop().await;
}

/// A replica set of its own whose members run test commands (`failCommand`).
async fn with_test_commands() -> crate::testkit::ReplicaSet {
    use crate::testkit::{ReplicaSet, ReplicaSetOptions};
    ReplicaSet::start(
        ReplicaSetOptions::default()
            .extra_arg("--setParameter")
            .extra_arg("enableTestCommands=1"),
    )
    .await
    .expect("a replica set with test commands")
}

/// `key`'s lease ended as an operator's immediate force release ends it.
async fn force_release(env: &Env, key: &str) {
    let update =
        super::super::release::force_release_update(0, 0, crate::store::OverrideEnd::Immediately);
    let forced = env
        .raw()
        .update_one(doc! { "_id": key }, update)
        .await
        .unwrap();
    assert_eq!(forced.modified_count, 1, "{key} force released");
}

/// The next `command` of the store's client fails on a closed connection,
/// without landing.
async fn close_next(env: &Env, command: &str) {
    env.db
        .client()
        .database("admin")
        .run_command(doc! {
            "configureFailPoint": "failCommand",
            "mode": { "times": 1 },
            "data": { "failCommands": [command], "closeConnection": true },
        })
        .await
        .expect("the fail point");
}

/// A grouped release whose `update` fails leaves every lease to the
/// general release as not applied, not as unknown: a lease an operator
/// force released before the batch is then reported lost, never released
/// (found by the simulation's release property). On a replica set of its
/// own, started with test commands (`failCommand`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_released_lease_in_a_failed_grouped_release_is_reported_lost() {
    let rs = with_test_commands().await;
    let env = Env::on(rs.uri()).await;
    let leases = leases("u", 2);
    take_all(&env, &leases).await;
    force_release(&env, "u1").await;
    close_next(&env, "update").await;
    let outcomes = env.store.release_light_batch(&leases, false).await;
    assert!(
        outcomes
            .iter()
            .all(|o| matches!(o, LightRelease::NotApplied)),
        "{outcomes:?}"
    );
    // As the actor goes on: the general release finds the forced
    // lease gone (lost), and releases the other.
    let selection = Selection::Leases {
        owner: env.store.owner(),
        ids: vec![leases[0].lease_id, leases[1].lease_id],
    };
    for (lease, count) in leases.iter().zip([1, 0]) {
        let filter = holder_filter(env.store.owner(), std::slice::from_ref(lease));
        let found = env
            .store
            .release_matching(filter, &selection, true, false)
            .await
            .unwrap();
        assert_eq!(found, count, "{:?}", lease.key);
    }
    env.drop().await;
}

/// A handoff (light or general) of a lease an operator force released
/// before it, whose write fails (a closed connection: it did not land):
/// its re-read finds neither lease, and the handoff answers lost, not
/// released (property 7 of docs/safety.md: a doubt reports a loss, never
/// the reverse). On a replica set of its own, started with test commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handoff_in_doubt_of_a_force_released_lease_is_lost() {
    let rs = with_test_commands().await;
    let env = Env::on(rs.uri()).await;
    for light in [true, false] {
        let key = format!("forced-{light}");
        let lease = env.take(&key).await;
        force_release(&env, &key).await;
        close_next(&env, "findAndModify").await;
        let handoff = Handoff {
            key: lease.key.clone(),
            from: lease.lease_id,
            to: Uuid::new_v4(),
            ttl: Duration::from_millis(TTL_MS as u64),
            light,
        };
        let outcome = env.store.handoff(handoff).await.unwrap();
        assert_eq!(outcome, HandoffOutcome::Lost, "light: {light}");
    }
    env.drop().await;
}

/// Through a manager: acquires and releases of distinct keys asked for at
/// once go as the actor's group commit sends them: the first alone, the
/// others together, one command (and one read) for each group.
#[tokio::test]
async fn a_managers_acquires_and_releases_asked_for_at_once_are_grouped() {
    let env = Env::new().await;
    let manager = crate::manager::LeaseManager::connect(
        crate::config::LeaseManagerOptions::builder()
            .database(env.db.clone())
            .collection(env.collection.as_str())
            .build(),
    )
    .await
    .unwrap();
    env.commands.counts();
    let keys: Vec<String> = (0..20).map(|i| format!("m{i}")).collect();
    let acquires = keys
        .iter()
        .map(|k| manager.acquire(k.as_str()).into_future());
    let leases: Vec<crate::lease::Lease> = futures::future::join_all(acquires)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let counts = env.commands.counts();
    // The first alone; the 19 that queued behind it in one `update` and
    // one `find` (a key the `find` judged too late goes on to the general
    // `findAndModify`: a slow machine).
    assert_eq!(counts.get("update"), Some(&1), "{counts:?}");
    assert_eq!(counts.get("find"), Some(&1), "{counts:?}");
    assert!(counts.get("findAndModify") >= Some(&1), "{counts:?}");
    let releases = leases.into_iter().map(|l| l.release());
    for outcome in futures::future::join_all(releases).await {
        assert_eq!(outcome.unwrap(), crate::status::ReleaseOutcome::Released);
    }
    let counts = env.commands.counts();
    // The first alone, the 19 in one `update`: all applied, no `find`.
    assert_eq!(counts.get("update"), Some(&2), "{counts:?}");
    assert_eq!(counts.get("find"), None, "{counts:?}");
    for key in &keys {
        assert!(!env.get(key).await.unwrap().contains_key(field::LEASE_ID));
    }
    manager.shutdown().await.unwrap();
    env.drop().await;
}
