//! Other applications' lock schemas read by a user's rule
//! (`LeaseManagerOptions::foreign_lock`), both directions, each other
//! client played by its exact commands with the driver:
//!
//! - `{_id, locked: true|false, owner, created, expire: date|null}`: its
//!   client locks by `insertOne` of the whole document, and on a duplicate
//!   key by a replacement guarded by `{$or: [{_id, locked: false}, {_id,
//!   expire: {$lt: now}}]}` (acquired iff it matched); it releases by
//!   `findOneAndUpdate({_id, owner}, {$set: {locked: false, owner: null,
//!   created: null, expire: null}})`, keeping the document. `now` is the
//!   client's clock. Our rule: held while `locked` and `expire` is null or
//!   ahead of `$$NOW`, owner `$owner`, expiry `$expire`.
//! - `{_id, owner, expire: <int64 epoch ms>}`: held while `expire` is ahead
//!   of `$$NOW` in milliseconds, expiry `{$toDate: "$expire"}`.
//!
//! A lock its rule says is held is never modified by us; once it is not,
//! our acquisition takes the key over in its own write and leaves none of
//! its fields, so that its clients' conditions find our lease held. With a
//! rule set the collection is shared: our release deletes the document
//! (once its token is `DELETE_MIN_TOKEN_AGE` old), and their insert
//! succeeds then.

use std::future::IntoFuture;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongo_lease::{ForeignLockRule, LeaseManager};
use mongodb::Collection;
use mongodb::bson::{Bson, DateTime, Document, doc};
use tokio_util::time::FutureExt as _;

use crate::common::others::{bytes, stored_bytes};
use crate::common::{Fixture, eventually, within};

const TTL: Duration = Duration::from_secs(3);
/// A liveness bound: only turns a hang into a failure.
const WAIT: Duration = Duration::from_secs(30);
/// Their fields, none of which our lease document may keep.
const THEIR_FIELDS: [&str; 4] = ["locked", "owner", "created", "expire"];

/// Milliseconds since the epoch of a server time.
fn ms(t: std::time::SystemTime) -> i64 {
    t.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64
}

// ----- the `{_id, locked, owner, created, expire}` client -----------------

/// Our rule for their schema.
fn locked_rule() -> ForeignLockRule {
    ForeignLockRule::builder()
        .held(doc! { "$and": [
            { "$eq": ["$locked", true] },
            { "$or": [
                { "$eq": [{ "$ifNull": ["$expire", null] }, null] },
                { "$gt": ["$expire", "$$NOW"] },
            ]},
        ]})
        .owner("$owner")
        .expires_at("$expire")
        .build()
}

/// A manager of ours on `fx`'s collection with `rule`, its waiters
/// retrying at least every 50 ms.
async fn manager_with(fx: &Fixture, rule: ForeignLockRule) -> LeaseManager {
    let mut options = fx.options(TTL).await;
    options.foreign_lock = Some(rule);
    options.retry_initial = Duration::from_millis(10);
    options.retry_max = Duration::from_millis(50);
    LeaseManager::connect(options)
        .await
        .expect("connect with the rule")
}

/// The document their client writes to lock `key` as `owner` at its clock
/// reading `now`, expiring `lifetime` later (never with `None`).
fn their_document(key: &str, owner: &str, now: DateTime, lifetime: Option<Duration>) -> Document {
    let expire = lifetime.map_or(Bson::Null, |d| {
        DateTime::from_millis(now.timestamp_millis() + d.as_millis() as i64).into()
    });
    doc! { "_id": key, "locked": true, "owner": owner, "created": now, "expire": expire }
}

/// Their client's lock of `key` as `owner`, its clock reading `now`:
/// `insertOne` of the whole document; on E11000 the same document as a
/// replacement of `{$or: [{_id, locked: false}, {_id, expire: {$lt:
/// now}}]}`. Acquired iff the insert succeeded or the replacement matched
/// (an E11000 of the replacement: not acquired).
async fn their_lock_at(
    raw: &Collection<Document>,
    key: &str,
    owner: &str,
    now: DateTime,
    lifetime: Option<Duration>,
) -> bool {
    let lock = their_document(key, owner, now, lifetime);
    match raw.insert_one(lock.clone()).await {
        Ok(_) => return true,
        Err(e) if e.to_string().contains("E11000") => {}
        Err(e) => panic!("their insert of {key:?}: {e}"),
    }
    let guard = doc! { "$or": [
        { "_id": key, "locked": false },
        { "_id": key, "expire": { "$lt": now } },
    ]};
    match raw.replace_one(guard, lock).await {
        Ok(replaced) => replaced.matched_count == 1,
        Err(e) if e.to_string().contains("E11000") => false,
        Err(e) => panic!("their guarded replacement of {key:?}: {e}"),
    }
}

/// Their client's lock of `key` as `owner` now, by its clock.
async fn their_lock(
    raw: &Collection<Document>,
    key: &str,
    owner: &str,
    lifetime: Option<Duration>,
) -> bool {
    their_lock_at(raw, key, owner, DateTime::now(), lifetime).await
}

/// Their client's release: `findOneAndUpdate({_id, owner}, {$set: {locked:
/// false, owner: null, created: null, expire: null}})`. The document
/// before, if it matched.
async fn their_unlock(raw: &Collection<Document>, key: &str, owner: &str) -> Option<Document> {
    raw.find_one_and_update(
        doc! { "_id": key, "owner": owner },
        doc! { "$set": { "locked": false, "owner": Bson::Null, "created": Bson::Null, "expire": Bson::Null } },
    )
    .await
    .expect("their findOneAndUpdate")
}

/// Asserts that the stored document of `key` is a lease of ours that keeps
/// none of their fields.
async fn assert_ours_without_their_fields(fx: &Fixture, m: &LeaseManager, key: &str) {
    let stored = fx.doc(key).await;
    for field in THEIR_FIELDS {
        assert!(stored.get(field).is_none(), "{field} left in {stored:?}");
    }
    let info = m.inspect(key).await.unwrap().expect("our lease");
    assert!(
        !info.foreign && info.held && info.owner_id == m.owner_id(),
        "{info:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn their_lock_held_without_an_expiry_is_held_for_us_and_never_modified() {
    let fx = Fixture::new("schemas_held").await;
    assert!(their_lock(&fx.raw(), "job", "batch-7", None).await);
    let written = fx.doc("job").await;
    let m = manager_with(&fx, locked_rule()).await;

    assert!(m.try_acquire("job").await.unwrap().is_none());
    // A waiting acquire that gives up: it polled, and wrote nothing.
    let waited = m
        .acquire("job")
        .into_future()
        .timeout(Duration::from_millis(300))
        .await;
    assert!(waited.is_err(), "{waited:?}");
    let info = m.inspect("job").await.unwrap().expect("their lock");
    assert!(info.foreign && info.held, "{info:?}");
    assert_eq!(info.owner_id, "batch-7");
    assert_eq!(info.fencing_token, 0);
    assert_eq!(stored_bytes(&fx, "job").await, bytes(&written));
    // Their other client still finds it held.
    assert!(!their_lock(&fx.raw(), "job", "batch-8", None).await);
    m.shutdown().await.unwrap();
    assert_eq!(stored_bytes(&fx, "job").await, bytes(&written));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn their_released_lock_is_free_to_us_leaves_none_of_their_fields_and_their_lock_then_fails() {
    let fx = Fixture::new("schemas_released").await;
    let m = manager_with(&fx, locked_rule()).await;
    let lifetime = Some(Duration::from_secs(600));
    assert!(their_lock(&fx.raw(), "job", "batch-7", lifetime).await);
    assert!(their_unlock(&fx.raw(), "job", "batch-7").await.is_some());
    let released = fx.doc("job").await;
    assert_eq!(released.get_bool("locked"), Ok(false), "{released:?}");

    let lease = m.try_acquire("job").await.unwrap().expect("released: free");
    assert_ours_without_their_fields(&fx, &m, "job").await;
    // Their lock, insert then the guarded replacement, fails on our lease.
    assert!(!their_lock(&fx.raw(), "job", "batch-8", lifetime).await);
    assert!(!their_lock(&fx.raw(), "job", "batch-8", None).await);
    assert_ours_without_their_fields(&fx, &m, "job").await;
    assert!(!lease.status().is_lost());
    assert!(!lease.release().await.unwrap().was_lost());
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn their_lock_past_its_expiry_is_taken_over() {
    let fx = Fixture::new("schemas_expired").await;
    let m = manager_with(&fx, locked_rule()).await;
    // A client that locked for 5 s, 10 s ago by its clock, and crashed.
    let then = DateTime::from_millis(DateTime::now().timestamp_millis() - 10_000);
    let lifetime = Some(Duration::from_secs(5));
    assert!(their_lock_at(&fx.raw(), "job", "batch-7", then, lifetime).await);
    let info = m.inspect("job").await.unwrap().expect("their lock");
    assert!(info.foreign && !info.held, "{info:?}");
    assert_eq!(ms(info.expires_at), then.timestamp_millis() + 5_000);

    let lease = m.try_acquire("job").await.unwrap().expect("expired: free");
    assert_ours_without_their_fields(&fx, &m, "job").await;
    assert!(!their_lock(&fx.raw(), "job", "batch-8", lifetime).await);
    assert!(!lease.release().await.unwrap().was_lost());
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_held_lease_fails_their_lock() {
    let fx = Fixture::new("schemas_ours_held").await;
    let m = manager_with(&fx, locked_rule()).await;
    let lease = m.try_acquire("job").await.unwrap().expect("free");
    let ours = fx.doc("job").await;

    assert!(!their_lock(&fx.raw(), "job", "batch-7", Some(Duration::from_secs(60))).await);
    assert!(!their_lock(&fx.raw(), "job", "batch-7", None).await);
    // Their release of a lock they do not hold matches nothing either.
    assert!(their_unlock(&fx.raw(), "job", "batch-7").await.is_none());
    assert_eq!(fx.doc("job").await.get("tok"), ours.get("tok"));
    assert_ours_without_their_fields(&fx, &m, "job").await;
    assert!(!lease.status().is_lost());
    assert!(!lease.release().await.unwrap().was_lost());
    m.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn once_we_release_with_default_options_their_lock_succeeds() {
    let fx = Fixture::new("schemas_ours_released").await;
    let mut options = fx.options(TTL).await;
    options.foreign_lock = Some(locked_rule());
    let m = LeaseManager::connect(options).await.expect("connect");
    let lease = m.try_acquire("job").await.unwrap().expect("free");
    assert!(!lease.release().await.unwrap().was_lost());

    // Deleted once its token is `DELETE_MIN_TOKEN_AGE` old, at once or by
    // the release's follow-up: their lock succeeds then.
    let raw = fx.raw();
    eventually("their lock succeeds", WAIT, || {
        let raw = raw.clone();
        async move { their_lock(&raw, "job", "batch-7", None).await }
    })
    .await;
    let theirs = fx.doc("job").await;
    assert_eq!(
        (theirs.get_bool("locked"), theirs.get_str("owner")),
        (Ok(true), Ok("batch-7")),
        "{theirs:?}"
    );
    assert!(m.try_acquire("job").await.unwrap().is_none());
    let info = m.inspect("job").await.unwrap().expect("their lock");
    assert!(
        info.foreign && info.held && info.owner_id == "batch-7",
        "{info:?}"
    );
    m.shutdown().await.unwrap();
}

/// Who holds the key in [`two_of_theirs_and_two_of_ours_interleave_on_one_key_without_overlap`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Side {
    Ours,
    Theirs,
}

/// The holders' shared record: how many are inside now, the most ever
/// inside at once, and who entered, in order.
#[derive(Default)]
struct Record {
    inside: usize,
    most: usize,
    entries: Vec<(Side, usize)>,
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<Record>>);

impl Log {
    fn enter(&self, side: Side, holder: usize) {
        let mut r = self.0.lock().unwrap();
        r.inside += 1;
        r.most = r.most.max(r.inside);
        r.entries.push((side, holder));
    }
    fn exit(&self) {
        self.0.lock().unwrap().inside -= 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_of_theirs_and_two_of_ours_interleave_on_one_key_without_overlap() {
    const KEY: &str = "job";
    const OUR_ROUNDS: usize = 5;
    const THEIR_ROUNDS: usize = 8;
    /// How long each holder keeps the key.
    const HOLD: Duration = Duration::from_millis(15);
    /// Ours, after a release: longer than the follow-up delete of a young
    /// lease (`DELETE_MIN_TOKEN_AGE` + 100 ms after its acquisition), so
    /// that their inserts find the key free between our rounds.
    const OUR_PAUSE: Duration = Duration::from_millis(1_400);
    /// Theirs, after a release: each gets a round or two in each of those
    /// windows, which leaves some for ours.
    const THEIR_PAUSE: Duration = Duration::from_millis(200);
    /// Theirs, between lock attempts.
    const THEIR_SPIN: Duration = Duration::from_millis(10);
    /// Our acquire's deadline.
    const DEADLINE: Duration = Duration::from_secs(8);

    let fx = Fixture::new("schemas_interleave").await;
    let log = Log::default();
    let mut tasks = tokio::task::JoinSet::new();
    let mut managers = Vec::new();
    for holder in 0..2 {
        let m = manager_with(&fx, locked_rule()).await;
        managers.push(m.clone());
        let log = log.clone();
        tasks.spawn(async move {
            for round in 0..OUR_ROUNDS {
                let lease = m
                    .acquire(KEY)
                    .into_future()
                    .timeout(DEADLINE)
                    .await
                    .unwrap_or_else(|_| panic!("ours {holder}, round {round}: deadline"))
                    .unwrap();
                log.enter(Side::Ours, holder);
                tokio::time::sleep(HOLD).await;
                assert!(!lease.status().is_lost(), "ours {holder}, round {round}");
                log.exit();
                assert!(!lease.release().await.unwrap().was_lost());
                tokio::time::sleep(OUR_PAUSE).await;
            }
        });
    }
    for holder in 0..2 {
        let raw = fx.raw();
        let log = log.clone();
        let owner = format!("batch-{holder}");
        tasks.spawn(async move {
            for round in 0..THEIR_ROUNDS {
                while !their_lock(&raw, KEY, &owner, Some(Duration::from_secs(30))).await {
                    tokio::time::sleep(THEIR_SPIN).await;
                }
                log.enter(Side::Theirs, holder);
                tokio::time::sleep(HOLD).await;
                log.exit();
                let before = their_unlock(&raw, KEY, &owner).await;
                assert!(
                    before.is_some_and(|d| d.get_bool("locked") == Ok(true)),
                    "theirs {holder}, round {round}: their lock was kept"
                );
                tokio::time::sleep(THEIR_PAUSE).await;
            }
        });
    }
    within(WAIT, "every round", async {
        while let Some(done) = tasks.join_next().await {
            done.expect("a holder");
        }
    })
    .await;

    {
        let record = log.0.lock().unwrap();
        assert_eq!(record.most, 1, "two holders at once: {:?}", record.entries);
        let count = |side| record.entries.iter().filter(|(s, _)| *s == side).count();
        assert_eq!(
            (count(Side::Ours), count(Side::Theirs)),
            (2 * OUR_ROUNDS, 2 * THEIR_ROUNDS)
        );
        // The key changed sides both ways (each run here saw 8 changes).
        let switches = record
            .entries
            .windows(2)
            .filter(|w| w[0].0 != w[1].0)
            .count();
        assert!(switches >= 2, "{switches} switches: {:?}", record.entries);
    }
    for m in managers {
        m.shutdown().await.unwrap();
    }
}

// ----- the `{_id, owner, expire: <epoch ms>}` schema ------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_epoch_milliseconds_expiry_is_held_until_it_passes_and_shown_by_inspect() {
    let fx = Fixture::new("schemas_epoch_ms").await;
    let now = DateTime::now().timestamp_millis();
    let live = doc! { "_id": "live", "owner": "cron-1", "expire": now + 600_000 };
    let old = doc! { "_id": "old", "owner": "cron-0", "expire": now - 1_000 };
    fx.raw().insert_many([live.clone(), old]).await.unwrap();
    let rule = ForeignLockRule::builder()
        .held(doc! { "$gt": ["$expire", { "$toLong": "$$NOW" }] })
        .owner("$owner")
        .expires_at(doc! { "$toDate": "$expire" })
        .build();
    let m = manager_with(&fx, rule).await;

    assert!(m.try_acquire("live").await.unwrap().is_none());
    assert_eq!(stored_bytes(&fx, "live").await, bytes(&live));
    let info = m.inspect("live").await.unwrap().expect("the live lock");
    assert!(info.foreign && info.held, "{info:?}");
    assert_eq!(
        (info.owner_id.as_str(), ms(info.expires_at)),
        ("cron-1", now + 600_000)
    );

    let lease = m
        .try_acquire("old")
        .await
        .unwrap()
        .expect("expired by the rule");
    let stored = fx.doc("old").await;
    assert!(
        stored.get("owner").is_none() && stored.get("expire").is_none(),
        "{stored:?}"
    );
    let info = m.inspect("old").await.unwrap().expect("our lease");
    assert!(!info.foreign && info.owner_id == m.owner_id(), "{info:?}");
    assert!(!lease.release().await.unwrap().was_lost());
    assert_eq!(stored_bytes(&fx, "live").await, bytes(&live));
    m.shutdown().await.unwrap();
}

// ----- what an outside attack found -------------------------------------------

/// A built-in shape whose fields are not of the types its clients write
/// (an npm lock with an infinite or far `ttl`) is still described by its
/// own rule, held with no expiry: a user's rule, which by default reads
/// every other document, never reads it as free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_built_in_shape_with_fields_of_other_types_stays_held_beside_a_users_rule() {
    let fx = Fixture::new("schemas_npm_unbounded").await;
    let m = manager_with(&fx, locked_rule()).await;
    let keys = [
        ("inf", Bson::Double(f64::INFINITY)),
        ("far", Bson::Double(1e10)),
        ("long", Bson::Int64(2_000_000_000)),
    ];
    for (key, ttl) in keys {
        let npm =
            doc! { "_id": key, "value": "npm-holder", "ttl": ttl, "obtained_at": DateTime::now() };
        fx.raw().insert_one(npm).await.unwrap();
        assert!(m.try_acquire(key).await.unwrap().is_none(), "{key}");
        let info = m.inspect(key).await.unwrap().expect("the npm lock");
        assert!(info.foreign && info.held, "{key}: {info:?}");
        assert_eq!(info.owner_id, "npm-holder", "{key}");
        assert_eq!(info.time_to_expiry(), Duration::MAX, "{key}: no expiry");
    }
    m.shutdown().await.unwrap();
}

/// A force release deletes a declared schema's lock only while its rule
/// reads it as held, and only as read: a released one (`locked: false`) is
/// left to its clients, and nothing is reported released.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_force_release_leaves_a_declared_lock_its_rule_reads_as_free() {
    let fx = Fixture::new("schemas_force_free").await;
    let m = manager_with(&fx, locked_rule()).await;
    assert!(their_lock(&fx.raw(), "k", "batch-1", None).await);
    assert!(their_unlock(&fx.raw(), "k", "batch-1").await.is_some());
    let released = fx.doc("k").await;
    assert_eq!(m.force_release("k").await.unwrap(), None);
    assert_eq!(fx.doc("k").await, released, "left as their client wrote it");
    assert!(their_lock(&fx.raw(), "k", "batch-2", None).await);
    let forced = m
        .force_release("k")
        .await
        .unwrap()
        .expect("their live lock");
    assert_eq!(
        (forced.owner_id.as_str(), forced.foreign),
        ("batch-2", true)
    );
    assert_eq!(fx.raw().count_documents(doc! {}).await.unwrap(), 0);
    m.shutdown().await.unwrap();
}

/// An observer of a key that a foreign lock comes to hold reads it again
/// once per change, over the change stream it opened: it neither reopens
/// the stream nor reads in a loop (the stream's reopening at a read's
/// operation time would see the same event again).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_keeps_its_change_stream_across_a_foreign_locks_changes() {
    use mongodb::event::EventHandler;
    use mongodb::event::command::CommandEvent;
    use std::sync::atomic::{AtomicU64, Ordering};

    let fx = Fixture::new("schemas_observer").await;
    let streams = Arc::new(AtomicU64::new(0));
    let mut client_options = mongodb::options::ClientOptions::parse(crate::common::uri())
        .await
        .unwrap();
    let opened = streams.clone();
    client_options.command_event_handler = Some(EventHandler::callback(move |e: CommandEvent| {
        if let CommandEvent::Started(s) = e
            && s.command_name == "aggregate"
            && s.command.to_string().contains("$changeStream")
        {
            opened.fetch_add(1, Ordering::SeqCst);
        }
    }));
    let client = mongodb::Client::with_options(client_options).unwrap();
    let mut options = fx.options(TTL).await;
    options.database = client.database(fx.db.name());
    options.foreign_lock = Some(locked_rule());
    let m = LeaseManager::connect(options).await.unwrap();
    let mut observer = m.observe("k").await.unwrap();
    let mut next = async || {
        within(WAIT, "an observed state", observer.recv())
            .await
            .expect("open")
            .unwrap()
    };
    assert!(next().await.is_none(), "no lock yet");
    assert!(their_lock(&fx.raw(), "k", "batch-1", None).await);
    let held = next().await.expect("their lock");
    assert!(
        held.foreign && held.held && held.owner_id == "batch-1",
        "{held:?}"
    );
    assert!(their_unlock(&fx.raw(), "k", "batch-1").await.is_some());
    let free = next().await.expect("their released lock");
    assert!(free.foreign && !free.held, "{free:?}");
    assert_eq!(
        streams.load(Ordering::SeqCst),
        1,
        "one change stream throughout"
    );
    m.shutdown().await.unwrap();
    client.shutdown().await;
}

/// A user's rule that says which documents it `describes` is read before
/// the built-in rules: a schema with a field of a built-in shape
/// (`ExpireAt`, here a clean-up time, not the lock's end) stays its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_rule_with_describes_is_read_before_a_built_in_shape() {
    let fx = Fixture::new("schemas_describes_first").await;
    let rule = ForeignLockRule::builder()
        .held(doc! { "$eq": ["$locked", true] })
        .owner("$owner")
        .describes(doc! { "$eq": [{ "$type": "$locked" }, "bool"] })
        .build();
    let m = manager_with(&fx, rule).await;
    let past = DateTime::from_millis(DateTime::now().timestamp_millis() - 3_600_000);
    let theirs = doc! { "_id": "k", "locked": true, "owner": "them", "ExpireAt": past };
    fx.raw().insert_one(theirs.clone()).await.unwrap();
    assert!(m.try_acquire("k").await.unwrap().is_none());
    let info = m.inspect("k").await.unwrap().expect("their lock");
    assert!(
        info.foreign && info.held && info.owner_id == "them",
        "{info:?}"
    );
    assert_eq!(fx.doc("k").await, theirs);
    m.shutdown().await.unwrap();
}

/// An observer sends a foreign lock's state as of its change event, even
/// when the lock is gone by the time it reads it: their lock inserted and
/// deleted at once, then a lease of ours, reads as those three states in
/// order, on each of 20 keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sends_a_foreign_lock_that_came_and_went_in_order() {
    let fx = Fixture::new("schemas_observer_order").await;
    let m = manager_with(&fx, locked_rule()).await;
    for round in 0..20 {
        let key = format!("k{round}");
        let mut observer = m.observe(key.as_str()).await.unwrap();
        let mut next = async || {
            within(WAIT, "an observed state", observer.recv())
                .await
                .expect("open")
                .unwrap()
        };
        assert!(next().await.is_none(), "{key}: free at first");
        assert!(their_lock(&fx.raw(), &key, "them", None).await);
        fx.raw().delete_one(doc! { "_id": &key }).await.unwrap();
        let lease = m.try_acquire(key.as_str()).await.unwrap().expect("ours");
        let theirs = next().await.expect("their lock first");
        assert!(theirs.foreign && theirs.held, "{key}: {theirs:?}");
        assert!(next().await.is_none(), "{key}: then free");
        let ours = next().await.expect("then ours");
        assert_eq!(ours.fencing_token, lease.fencing_token(), "{key}");
        assert!(!lease.release().await.unwrap().was_lost(), "{key}");
    }
    m.shutdown().await.unwrap();
}
