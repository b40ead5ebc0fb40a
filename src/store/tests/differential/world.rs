//! One seed's world: the twin ([`MemoryDb`]) and a fresh collection of the
//! dedicated `mongod`, the same owners on both (a [`MemoryStore`] and a
//! [`MongoStore`] each, with the same settings), the other applications'
//! clients by their exact commands on each side, the TTL pass, and the
//! clocks of each step.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::TryStreamExt;
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::{Collection, Database, IndexModel};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::super::pattern2_client;
use crate::config::ReleaseMode;
use crate::foreign::ForeignRules;
use crate::key::LeaseKey;
use crate::sim::others;
use crate::store::MongoStore;
use crate::store::memory::{ForeignWrite, MemoryDb, MemoryStore};
use crate::testkit::{ReplicaSet, ReplicaSetOptions};

/// The stores' TTL (the manager's): far longer than a seed.
pub(super) const TTL: Duration = Duration::from_secs(60);
/// A short TTL: expires within a seed, after a sleep that makes it surely
/// expired on both sides.
pub(super) const SHORT: Duration = Duration::from_millis(250);
/// The TTLs an acquire, a renewal or a handoff draws from.
pub(super) const TTLS: [Duration; 4] = [
    TTL,
    Duration::from_secs(45),
    SHORT,
    Duration::from_millis(400),
];
/// Every store's yield window (its `retry_max`): short, so that yields end
/// within a seed.
pub(super) const YIELD: Duration = Duration::from_millis(300);
/// Every store's safety margin (part of the registration window).
pub(super) const MARGIN: Duration = Duration::from_millis(200);
/// The minimum holds an exclusive acquisition draws from.
pub(super) const HOLDS: [Duration; 2] = [Duration::from_millis(400), TTL];
/// The lock-delays an owner draws from (as an operator).
pub(super) const LOCK_DELAYS: [Duration; 2] = [Duration::ZERO, Duration::from_millis(200)];
/// Pattern 1's TTL index on `ts`, when the seed's collection has one.
pub(super) const TS_EXPIRE_AFTER: Duration = Duration::from_secs(60);
/// How old an aged pattern 1 lock's `ts` is: expired by its TTL index.
pub(super) const P1_AGE: Duration = Duration::from_secs(61);
/// Pattern 1's owner id (`aid`).
pub(super) const P1_AID: &str = "java-app-1";
/// Pattern 2's lock values.
pub(super) const P2_VALUES: [&str; 2] = ["npm-1", "npm-2"];
/// Pattern 2's TTLs, in seconds.
pub(super) const P2_TTLS: [i32; 2] = [1, 60];
/// Pattern 3's lock lifetimes (`ExpireAt = now + lifetime`).
pub(super) const P3_LIFETIMES: [Duration; 2] = [SHORT, TTL];
/// The GC grace of the TTL index on `exp`: the least `connect` creates
/// (`DELETE_MIN_TOKEN_AGE`, 1 s), so that a TTL pass soon deletes the
/// expired or released documents of ours.
pub(super) const GC_GRACE: Duration = crate::config::DELETE_MIN_TOKEN_AGE;
/// The owner ids.
pub(super) const OWNERS: [&str; 3] = ["a", "b", "c"];

/// The registration window of every store (`R`).
pub(super) fn registration_window() -> Duration {
    crate::store::registration_window(YIELD, MARGIN)
}

/// The dedicated `mongod` of a run: a one-member replica set whose TTL
/// monitor is off, so that only the TTL pass step deletes by TTL index.
pub(super) struct Server {
    _set: ReplicaSet,
    pub client: mongodb::Client,
}

impl Server {
    pub async fn start() -> Server {
        let options = ReplicaSetOptions::default()
            .set_name("differential")
            .extra_arg("--setParameter")
            .extra_arg("ttlMonitorEnabled=false");
        let set = ReplicaSet::start(options)
            .await
            .expect("a replica set for the differential test");
        let client = set.client().await.expect("a client of the replica set");
        Server { _set: set, client }
    }
}

/// One owner (manager) on both sides.
pub(super) struct Owner {
    pub twin: MemoryStore,
    pub mongo: MongoStore,
    pub delete_mode: bool,
}

/// What a seed draws once: the owners' settings and the collection's
/// indexes.
#[derive(Debug, Clone)]
pub(super) struct Config {
    /// Per owner: delete mode, lock-delay.
    pub owners: Vec<(bool, Duration)>,
    /// Pattern 1's TTL index on `ts`.
    pub ts_index: bool,
    /// Pattern 3's TTL index on `ExpireAt`.
    pub expire_at_index: bool,
}

impl Config {
    pub fn draw(rng: &mut StdRng) -> Config {
        let owners = OWNERS
            .iter()
            .map(|_| {
                let delay = LOCK_DELAYS[rng.random_range(0..LOCK_DELAYS.len())];
                (rng.random_bool(0.3), delay)
            })
            .collect();
        Config {
            owners,
            ts_index: rng.random_bool(0.5),
            expire_at_index: rng.random_bool(0.5),
        }
    }

    /// The foreign lock rules of the collection, as `connect` finds them.
    pub fn foreign_rules(&self) -> ForeignRules {
        let rule = crate::sim::others::Schema::Locked.rule();
        ForeignRules {
            custom: Some(rule),
            ts_expire_after: self.ts_index.then_some(TS_EXPIRE_AFTER),
        }
    }
}

/// The server time of each step on each side, in ms: the step's command
/// (or the twin's operation) ran at a `$$NOW` within it.
#[derive(Debug, Default, Clone)]
pub(super) struct Clocks {
    pub twin: Vec<(i64, i64)>,
    pub mongo: Vec<(i64, i64)>,
}

/// One seed's world.
pub(super) struct World {
    pub db: MemoryDb,
    pub database: Database,
    pub coll: Collection<Document>,
    pub owners: Vec<Owner>,
    pub keys: Vec<LeaseKey>,
    pub config: Config,
    pub clocks: Clocks,
}

impl World {
    /// A fresh twin and collection for `seed`, with the seed's owners and
    /// indexes (pattern 1's and 3's if drawn, then the manager's).
    pub async fn new(server: &Server, seed: u64) -> World {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_c0f1_9000_0000);
        let config = Config::draw(&mut rng);
        let database = server.client.database("mongo_lease_differential");
        let name = crate::testkit::unique_name(&format!("d{seed}"));
        let coll: Collection<Document> = database.collection(&name);
        let ttl_index = |field: &str, after: Duration| {
            let options = mongodb::options::IndexOptions::builder()
                .expire_after(after)
                .build();
            IndexModel::builder()
                .keys(doc! { field: 1 })
                .options(options)
                .build()
        };
        if config.ts_index {
            // Pattern 1's indexes, as its clients make them.
            let aid = IndexModel::builder().keys(doc! { "aid": 1 }).build();
            coll.create_indexes([ttl_index("ts", TS_EXPIRE_AFTER), aid])
                .await
                .expect("pattern 1's indexes");
        }
        if config.expire_at_index {
            coll.create_index(ttl_index("ExpireAt", Duration::ZERO))
                .await
                .expect("pattern 3's index");
        }
        let rules = config.foreign_rules();
        let db = MemoryDb::new().with_foreign_rules(rules.clone()).unwrap();
        // The twin's TTL monitor runs the collection's indexes: ours (the
        // GC index `prepare` creates) and the other applications'.
        let mut indexes = vec![crate::store::memory::TtlIndex::gc(GC_GRACE)];
        if config.ts_index {
            indexes.push(crate::store::memory::TtlIndex::on("ts", TS_EXPIRE_AFTER));
        }
        if config.expire_at_index {
            indexes.push(crate::store::memory::TtlIndex::on(
                "ExpireAt",
                Duration::ZERO,
            ));
        }
        db.set_ttl_indexes(indexes);
        let owners: Vec<Owner> = OWNERS
            .iter()
            .zip(&config.owners)
            .map(|(name, &(delete_mode, lock_delay))| {
                let mode = match delete_mode {
                    true => ReleaseMode::Delete,
                    false => ReleaseMode::Keep,
                };
                let twin = db
                    .store(*name, TTL)
                    .with_yield_window(YIELD)
                    .with_safety_margin(MARGIN)
                    .with_light_acquire()
                    .with_lock_delay(lock_delay)
                    .with_release_mode(mode);
                let mongo = MongoStore::new(
                    &database,
                    &name_of(&coll),
                    name.to_string(),
                    TTL,
                    YIELD,
                    Duration::from_secs(30),
                )
                .with_safety_margin(MARGIN)
                .with_lock_delay(lock_delay)
                .with_release_mode(mode)
                .with_foreign(rules.clone());
                Owner {
                    twin,
                    mongo,
                    delete_mode,
                }
            })
            .collect();
        let timing = crate::config::LeaseManagerOptions::builder()
            .database(database.clone())
            .collection(name_of(&coll))
            .build()
            .timing()
            .expect("default timing");
        owners[0]
            .mongo
            .prepare(GC_GRACE, &timing)
            .await
            .expect("prepare the lock collection");
        let keys = vec![
            LeaseKey::from("k0"),
            LeaseKey::from("k1"),
            LeaseKey::from("k2"),
            LeaseKey::from(7),
        ];
        World {
            db,
            database,
            coll,
            owners,
            keys,
            config,
            clocks: Clocks::default(),
        }
    }

    /// Drops the seed's collection.
    pub async fn cleanup(self) {
        self.coll.drop().await.expect("drop the seed's collection");
    }

    /// The twin's server time now, in ms.
    pub fn twin_now(&self) -> i64 {
        self.db.date(self.db.server_now()).timestamp_millis()
    }

    /// The server's time now (`hello`'s `localTime`, the clock of
    /// `$$NOW`), in ms.
    pub async fn mongo_now(&self) -> i64 {
        let hello = self
            .database
            .run_command(doc! { "hello": 1 })
            .await
            .expect("hello");
        hello
            .get_datetime("localTime")
            .expect("localTime")
            .timestamp_millis()
    }

    /// The mongod's documents, by key.
    pub async fn mongo_documents(&self) -> BTreeMap<LeaseKey, Document> {
        let docs: Vec<Document> = self
            .coll
            .find(doc! {})
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("find");
        docs.into_iter()
            .map(|d| (LeaseKey::from(d.get("_id").cloned().expect("_id")), d))
            .collect()
    }

    // ----- the TTL pass ----------------------------------------------------

    /// The twin's TTL pass: one pass of its TTL monitor over the
    /// collection's indexes ([`MemoryDb::ttl_monitor_pass`]). Returns how
    /// many it deleted.
    pub fn twin_ttl_pass(&self) -> u64 {
        self.db.ttl_monitor_pass().len() as u64
    }

    /// What MongoDB's TTL monitor would delete now: for each TTL index of
    /// the collection (as `listIndexes` reads it: its one key, its
    /// `expireAfterSeconds`, its `partialFilterExpression` if any), the
    /// documents whose indexed date (the earliest, for an array) is older
    /// than `$$NOW` less `expireAfterSeconds`. Returns how many it deleted.
    pub async fn mongo_ttl_pass(&self) -> u64 {
        let indexes: Vec<IndexModel> = self
            .coll
            .list_indexes()
            .await
            .expect("listIndexes")
            .try_collect()
            .await
            .expect("listIndexes");
        let mut deleted = 0;
        for index in indexes {
            let options = index.options.clone().unwrap_or_default();
            let Some(after) = options.expire_after else {
                continue;
            };
            let [field] = index.keys.keys().collect::<Vec<_>>()[..] else {
                continue; // The TTL monitor ignores compound indexes.
            };
            let path = format!("${field}");
            let date = doc! { "$cond": [{ "$isArray": &path }, { "$min": &path }, &path] };
            let cutoff = doc! { "$subtract": ["$$NOW", after.as_millis() as i64] };
            let due = doc! { "$expr": { "$let": {
                "vars": { "d": date },
                "in": { "$and": [
                    { "$eq": [{ "$type": "$$d" }, "date"] },
                    { "$lt": ["$$d", cutoff] },
                ]},
            }}};
            let filter = match options.partial_filter_expression {
                Some(partial) => doc! { "$and": [partial, due] },
                None => due,
            };
            deleted += self
                .coll
                .delete_many(filter)
                .await
                .expect("the TTL pass's delete")
                .deleted_count;
        }
        deleted
    }

    // ----- other applications' clients ---------------------------------------

    /// Pattern 1's lock: its insert of `{_id, ts, aid}`, `ts` its clock's
    /// now less `age`; `false` on E11000.
    pub async fn mongo_p1_lock(&self, key: &LeaseKey, age: Duration) -> bool {
        let ts = DateTime::from_millis(DateTime::now().timestamp_millis() - millis(age));
        let lock = doc! { "_id": key.to_bson(), "ts": ts, "aid": P1_AID };
        match self.coll.insert_one(lock).await {
            Ok(_) => true,
            Err(e) if e.to_string().contains("E11000") => false,
            Err(e) => panic!("pattern 1's insert of {key:?}: {e}"),
        }
    }

    /// The twin's pattern 1 lock: its document inserted only if the key has
    /// none.
    pub fn twin_p1_lock(&self, key: &LeaseKey, age: Duration) -> bool {
        let now = self.twin_now();
        let ts = DateTime::from_millis(now - millis(age));
        others::insert(&self.db, key.clone(), doc! { "ts": ts, "aid": P1_AID })
    }

    /// A release by `_id` (patterns 1 and 3, the bare `{_id}` client):
    /// `deleteOne({_id})`, whatever the document is.
    pub async fn mongo_delete_by_id(&self, key: &LeaseKey) -> bool {
        let deleted = self.coll.delete_one(doc! { "_id": key.to_bson() }).await;
        deleted.expect("deleteOne by _id").deleted_count == 1
    }

    /// The twin's `deleteOne({_id})`: [`MemoryDb::delete`] of whatever is
    /// there.
    pub fn twin_delete_by_id(&self, key: &LeaseKey) -> bool {
        let there = self.db.doc(key.clone()).is_some() || self.db.foreign(key.clone()).is_some();
        if there {
            self.db.delete(key.clone());
        }
        there
    }

    /// Pattern 1's release of every lock of its owner id:
    /// `deleteMany({aid})`.
    pub async fn mongo_p1_release_by_aid(&self) -> u64 {
        let deleted = self.coll.delete_many(doc! { "aid": P1_AID }).await;
        deleted.expect("deleteMany by aid").deleted_count
    }

    /// The twin's `deleteMany({aid})`: every document, ours or foreign,
    /// whose `aid` is pattern 1's.
    pub fn twin_p1_release_by_aid(&self) -> u64 {
        let mut deleted = 0;
        for key in &self.keys {
            let ours = self.db.doc(key.clone()).is_some_and(|d| d.owner == P1_AID);
            let theirs = self
                .db
                .foreign(key.clone())
                .is_some_and(|f| f.get_str("aid") == Ok(P1_AID));
            if ours || theirs {
                self.db.delete(key.clone());
                deleted += 1;
            }
        }
        deleted
    }

    /// Pattern 2's lock, by its exact commands.
    pub async fn mongo_p2_lock(&self, key: &LeaseKey, value: &str, ttl: i32) -> bool {
        pattern2_client::lock(&self.coll, key.to_bson(), value, ttl).await
    }

    /// The twin's pattern 2 lock: its read, then its write if nothing was
    /// there or the lock read has expired by its rule.
    pub fn twin_p2_lock(&self, key: &LeaseKey, value: &str, ttl: i32) -> bool {
        let found = others::pattern2_read(&self.db, key.clone());
        others::pattern2_lock(&self.db, key.clone(), found.as_ref(), value, i64::from(ttl))
    }

    /// Pattern 2's release, `deleteOne({_id, value})`.
    pub async fn mongo_p2_unlock(&self, key: &LeaseKey, value: &str) -> bool {
        pattern2_client::unlock(&self.coll, key.to_bson(), value).await
    }

    /// The twin's pattern 2 release.
    pub fn twin_p2_unlock(&self, key: &LeaseKey, value: &str) -> bool {
        self.db.foreign_write(key.clone(), |doc| match doc {
            Some(doc) if doc.get_str("value") == Ok(value) => ForeignWrite::Delete,
            _ => ForeignWrite::Keep,
        })
    }

    /// Pattern 3's lock: `findOneAndUpdate({_id}, {$setOnInsert: {_id,
    /// ExpireAt: now + lifetime}}, upsert, ReturnDocument.Before)`, `now` by
    /// its clock; locked if nothing was there before.
    pub async fn mongo_p3_lock(&self, key: &LeaseKey, lifetime: Duration) -> bool {
        let at = DateTime::from_millis(DateTime::now().timestamp_millis() + millis(lifetime));
        let update = doc! { "$setOnInsert": { "_id": key.to_bson(), "ExpireAt": at } };
        self.upsert_before(key, update).await
    }

    /// The twin's pattern 3 lock: its document inserted only if the key has
    /// none.
    pub fn twin_p3_lock(&self, key: &LeaseKey, lifetime: Duration) -> bool {
        let at = DateTime::from_millis(self.twin_now() + millis(lifetime));
        others::insert(&self.db, key.clone(), doc! { "ExpireAt": at })
    }

    /// The `{_id, locked, owner, created, expire}` client's lock: an insert,
    /// or on E11000 the replace of a lock free by its conditions.
    pub async fn mongo_schema_lock(&self, key: &LeaseKey, life: Option<Duration>) -> bool {
        let now = DateTime::now();
        let lock = schema_lock(key, now, life);
        match self.coll.insert_one(lock.clone()).await {
            Ok(_) => return true,
            Err(e) if e.to_string().contains("E11000") => {}
            Err(e) => panic!("the schema client's insert of {key:?}: {e}"),
        }
        let free = doc! { "$or": [
            { "_id": key.to_bson(), "locked": false },
            { "_id": key.to_bson(), "expire": { "$lt": now } },
        ]};
        let replaced = self.coll.replace_one(free, lock).await;
        replaced.expect("the schema client's replace").matched_count == 1
    }

    /// The twin's `{_id, locked, owner, created, expire}` lock.
    pub fn twin_schema_lock(&self, key: &LeaseKey, life: Option<Duration>) -> bool {
        let now = DateTime::from_millis(self.twin_now());
        let mut lock = schema_lock(key, now, life);
        lock.remove("_id");
        let free = |doc: &Document| {
            doc.get_bool("locked") == Ok(false)
                || doc.get_datetime("expire").is_ok_and(|e| *e < now)
        };
        self.db.foreign_write(key.clone(), |doc| match doc {
            Some(doc) if !free(doc) => ForeignWrite::Keep,
            _ => ForeignWrite::Replace(lock),
        })
    }

    /// The schema client's release: `findOneAndUpdate({_id, owner}, {$set:
    /// {locked: false, owner: null, created: null, expire: null}})`.
    pub async fn mongo_schema_unlock(&self, key: &LeaseKey) -> bool {
        let mine = doc! { "_id": key.to_bson(), "owner": SCHEMA_OWNER };
        let update = doc! { "$set": SCHEMA_RELEASED.clone() };
        let before = self.coll.find_one_and_update(mine, update).await;
        before.expect("the schema client's release").is_some()
    }

    /// The twin's schema client's release.
    pub fn twin_schema_unlock(&self, key: &LeaseKey) -> bool {
        self.db.foreign_write(key.clone(), |doc| match doc {
            Some(doc) if doc.get_str("owner") == Ok(SCHEMA_OWNER) => {
                ForeignWrite::Set(SCHEMA_RELEASED.clone())
            }
            _ => ForeignWrite::Keep,
        })
    }

    /// The bare `{_id}` client's lock: `findOneAndUpdate({_id},
    /// {$setOnInsert: {_id}}, upsert, ReturnDocument.Before)`.
    pub async fn mongo_bare_lock(&self, key: &LeaseKey) -> bool {
        let update = doc! { "$setOnInsert": { "_id": key.to_bson() } };
        self.upsert_before(key, update).await
    }

    /// The twin's bare `{_id}` lock.
    pub fn twin_bare_lock(&self, key: &LeaseKey) -> bool {
        others::insert(&self.db, key.clone(), Document::new())
    }

    async fn upsert_before(&self, key: &LeaseKey, update: Document) -> bool {
        let before = self
            .coll
            .find_one_and_update(doc! { "_id": key.to_bson() }, update)
            .upsert(true)
            .return_document(mongodb::options::ReturnDocument::Before)
            .await;
        match before {
            Ok(before) => before.is_none(),
            Err(e) if e.to_string().contains("E11000") => false,
            Err(e) => panic!("the upsert lock of {key:?}: {e}"),
        }
    }
}

/// The schema client's owner.
const SCHEMA_OWNER: &str = "schema-client";

/// The fields its release sets.
static SCHEMA_RELEASED: std::sync::LazyLock<Document> = std::sync::LazyLock::new(
    || doc! { "locked": false, "owner": null, "created": null, "expire": null },
);

/// Its lock document at its clock's `now`, expiring after `life` or never.
fn schema_lock(key: &LeaseKey, now: DateTime, life: Option<Duration>) -> Document {
    let expire = life.map_or(Bson::Null, |l| {
        Bson::DateTime(DateTime::from_millis(now.timestamp_millis() + millis(l)))
    });
    doc! { "_id": key.to_bson(), "locked": true, "owner": SCHEMA_OWNER, "created": now, "expire": expire }
}

/// The collection's name.
fn name_of(coll: &Collection<Document>) -> String {
    coll.name().to_string()
}

/// A duration in whole ms.
pub(super) fn millis(d: Duration) -> i64 {
    d.as_millis() as i64
}

/// A BSON value's date in ms, if it is one.
pub(super) fn date_ms(value: Option<&Bson>) -> Option<i64> {
    match value? {
        Bson::DateTime(d) => Some(d.timestamp_millis()),
        _ => None,
    }
}
