//! Uncontended acquire + release: `mongo-lease` against the same round trips
//! issued with the raw `mongodb` driver, on the same throwaway `mongod`.
//!
//! ```text
//! cargo bench --bench acquire_release                      # starts a throwaway 1-member replica set
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo bench --bench acquire_release
//! ```
//!
//! Two groups:
//!
//! * `acquire_release/sequential`: one caller, one `try_acquire` + `release`
//!   per iteration (two round trips, both `w: majority`), against one
//!   `findOneAndUpdate` upsert with the lock pipeline + one `updateOne`
//!   release through a collection handle with the same concerns.
//! * `acquire_release/concurrent16`: 16 tasks, each doing one acquire +
//!   release on its own key, per iteration. Shows whether the manager's single
//!   actor task serialises round trips that the raw driver runs in parallel.
//!
//! Both sides use their own `Client` with the same URI, a collection of the
//! same layout (the manager's `connect` creates the indexes on both), and the
//! same key pattern (a pool of keys cycled through, so documents are reused
//! exactly as in a long-running process).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use mongo_lease::testkit::ReplicaSet;
use mongo_lease::{LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::bson::{Bson, Document, doc};
use mongodb::options::{
    CollectionOptions, ReadConcern, ReadPreference, ReturnDocument, SelectionCriteria, WriteConcern,
};
use mongodb::{Client, Collection};
use tokio::runtime::Runtime;
use uuid::Uuid;

#[path = "common/mongod.rs"]
mod mongod;

/// Distinct keys cycled through by each caller.
const KEY_POOL: u64 = 256;
/// Tasks of the concurrent group.
const CONCURRENCY: usize = 16;
/// Lease TTL (also the raw variant's `exp` offset).
const TTL: Duration = Duration::from_secs(30);

/// The raw-driver twin of the lock protocol: one `findOneAndUpdate` upsert to
/// acquire, one `updateOne` to release, on a majority-concern handle.
#[derive(Clone)]
struct Raw {
    coll: Collection<Document>,
    owner: String,
}

impl Raw {
    fn new(client: &Client, db: &str, collection: &str) -> Raw {
        // The same concerns as the manager's own handle.
        let options = CollectionOptions::builder()
            .write_concern(WriteConcern::majority())
            .read_concern(ReadConcern::majority())
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .build();
        Raw {
            coll: client
                .database(db)
                .collection_with_options(collection, options),
            owner: Uuid::new_v4().to_string(),
        }
    }

    /// The lock pipeline of `src/store/mongo.rs` (`acquire_pipeline`): take
    /// the key if the document is new, ours, or expired by the server's clock;
    /// else return it unchanged.
    fn acquire_pipeline(&self, lid: &Bson) -> Vec<Document> {
        let fresh = doc! { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 1] };
        let mine = doc! { "$eq": ["$lid", lid.clone()] };
        let our_layout = doc! { "$and": [
            { "$eq": [{ "$type": "$exp" }, "date"] },
            { "$eq": [{ "$type": "$tok" }, "long"] },
        ]};
        let expired = doc! { "$lte": ["$exp", "$$NOW"] };
        let wins = doc! { "$or": [fresh, mine.clone(), { "$and": [our_layout, expired] }] };
        let next_token = doc! { "$cond": [
            mine,
            "$tok",
            { "$max": [
                { "$add": [{ "$ifNull": ["$tok", 0_i64] }, 1_i64] },
                { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << 20] },
            ]},
        ]};
        let acquired = doc! {
            "_id": "$_id",
            "aid": { "$literal": &self.owner },
            "lid": lid.clone(),
            "tok": next_token,
            "ts": "$$NOW",
            "exp": { "$add": ["$$NOW", TTL.as_millis() as i64] },
        };
        vec![doc! { "$replaceWith": { "$cond": [wins, acquired, "$$ROOT"] } }]
    }

    /// Acquire + release of `key`; panics if the key was not free.
    async fn acquire_release(&self, key: String) {
        let lid = Bson::from(mongodb::bson::Uuid::from_bytes(Uuid::new_v4().into_bytes()));
        let got = self
            .coll
            .find_one_and_update(doc! { "_id": &key }, self.acquire_pipeline(&lid))
            .upsert(true)
            .return_document(ReturnDocument::After)
            .projection(doc! { "aid": 1, "lid": 1, "tok": 1, "exp": 1, "now": "$$NOW" })
            .await
            .expect("findOneAndUpdate")
            .expect("upsert returns the document");
        assert_eq!(got.get("lid"), Some(&lid), "{key} was not free");
        assert!(got.get_i64("tok").is_ok());
        let released = self
            .coll
            .update_one(
                doc! { "_id": &key, "lid": lid },
                vec![
                    doc! { "$set": { "exp": { "$min": ["$exp", "$$NOW"] } } },
                    doc! { "$unset": ["lid"] },
                ],
            )
            .await
            .expect("updateOne");
        assert_eq!(released.matched_count, 1);
    }
}

/// One acquire + release through the manager; panics if the key was not free.
async fn lease_acquire_release(manager: &LeaseManager, key: String) {
    let lease = manager
        .try_acquire(key)
        .await
        .expect("try_acquire")
        .expect("the key is free");
    let outcome = lease.release().await.expect("release");
    assert_eq!(outcome, ReleaseOutcome::Released);
}

/// The deployment, the runtime and both contenders, shared by every benchmark.
struct Env {
    runtime: Runtime,
    manager: LeaseManager,
    raw: Raw,
    /// Kept alive for the whole run; dropping it stops `mongod`.
    replica_set: Option<ReplicaSet>,
    db: mongodb::Database,
}

impl Env {
    fn start() -> Env {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("tokio runtime");
        let (replica_set, uri) = runtime.block_on(mongod::mongod());
        let (manager, raw, db) = runtime.block_on(async {
            let db_name = format!("bench_{}", &Uuid::new_v4().simple().to_string()[..8]);
            // Same collection setup on both sides: `connect` creates the TTL
            // index on `exp` and the index on `aid`.
            let lease_client = Client::with_uri_str(&uri).await.expect("client");
            let manager = LeaseManager::connect(
                LeaseManagerOptions::builder()
                    .database(lease_client.database(&db_name))
                    .collection("lease.lock")
                    .ttl(TTL)
                    .build(),
            )
            .await
            .expect("connect");
            let raw_client = Client::with_uri_str(&uri).await.expect("client");
            let setup = LeaseManager::connect(
                LeaseManagerOptions::builder()
                    .database(raw_client.database(&db_name))
                    .collection("raw.lock")
                    .ttl(TTL)
                    .build(),
            )
            .await
            .expect("connect");
            setup.shutdown().await.expect("shutdown");
            let raw = Raw::new(&raw_client, &db_name, "raw.lock");
            // Warm up both connection pools.
            for i in 0..CONCURRENCY as u64 * 2 {
                lease_acquire_release(&manager, format!("warm-{i}")).await;
                raw.acquire_release(format!("warm-{i}")).await;
            }
            (manager, raw, lease_client.database(&db_name))
        });
        Env {
            runtime,
            manager,
            raw,
            replica_set,
            db,
        }
    }

    fn stop(self) {
        let Env {
            runtime,
            manager,
            replica_set,
            db,
            ..
        } = self;
        runtime.block_on(async {
            manager.shutdown().await.expect("shutdown");
            db.drop().await.expect("drop the bench database");
        });
        drop(runtime);
        drop(replica_set);
    }
}

/// `prefix-<n mod KEY_POOL>`, the same pattern for both contenders.
fn next_key(prefix: &str, counter: &AtomicU64) -> String {
    format!(
        "{prefix}-{}",
        counter.fetch_add(1, Ordering::Relaxed) % KEY_POOL
    )
}

fn sequential(c: &mut Criterion, env: &Env) {
    let mut group = c.benchmark_group("acquire_release/sequential");
    group.throughput(Throughput::Elements(1));
    // Each iteration runs in a spawned task, on a worker thread, as in an
    // application. (Polled directly by criterion's `block_on` on the main
    // thread, the raw driver's round trips cost extra cross-thread wake-ups:
    // 25 context switches per iteration instead of 15, measured with getrusage.)
    let counter = AtomicU64::new(0);
    group.bench_function("mongo-lease", |b| {
        b.to_async(&env.runtime).iter(|| {
            let manager = env.manager.clone();
            let key = next_key("seq", &counter);
            async move {
                tokio::spawn(async move { lease_acquire_release(&manager, key).await })
                    .await
                    .expect("task")
            }
        })
    });
    let counter = AtomicU64::new(0);
    group.bench_function("raw-driver", |b| {
        b.to_async(&env.runtime).iter(|| {
            let raw = env.raw.clone();
            let key = next_key("seq", &counter);
            async move {
                tokio::spawn(async move { raw.acquire_release(key).await })
                    .await
                    .expect("task")
            }
        })
    });
    group.finish();
}

fn concurrent(c: &mut Criterion, env: &Env) {
    let mut group = c.benchmark_group(format!("acquire_release/concurrent{CONCURRENCY}"));
    group.throughput(Throughput::Elements(CONCURRENCY as u64));
    // About 12 ms per iteration: fewer, longer samples.
    group
        .sample_size(30)
        .measurement_time(Duration::from_secs(10));
    let counters: Arc<Vec<AtomicU64>> =
        Arc::new((0..CONCURRENCY).map(|_| AtomicU64::new(0)).collect());

    let manager = env.manager.clone();
    let keys = counters.clone();
    group.bench_function(BenchmarkId::new("mongo-lease", CONCURRENCY), |b| {
        b.to_async(&env.runtime).iter(|| {
            let tasks: Vec<_> = (0..CONCURRENCY)
                .map(|task| {
                    let manager = manager.clone();
                    let key = next_key(&format!("par{task}"), &keys[task]);
                    tokio::spawn(async move { lease_acquire_release(&manager, key).await })
                })
                .collect();
            async move {
                for task in tasks {
                    task.await.expect("task");
                }
            }
        })
    });

    for counter in counters.iter() {
        counter.store(0, Ordering::Relaxed);
    }
    let raw = env.raw.clone();
    let keys = counters.clone();
    group.bench_function(BenchmarkId::new("raw-driver", CONCURRENCY), |b| {
        b.to_async(&env.runtime).iter(|| {
            let tasks: Vec<_> = (0..CONCURRENCY)
                .map(|task| {
                    let raw = raw.clone();
                    let key = next_key(&format!("par{task}"), &keys[task]);
                    tokio::spawn(async move { raw.acquire_release(key).await })
                })
                .collect();
            async move {
                for task in tasks {
                    task.await.expect("task");
                }
            }
        })
    });
    group.finish();
}

fn main() {
    let env = Env::start();
    let mut c = Criterion::default()
        .sample_size(40)
        .warm_up_time(Duration::from_secs(2))
        .measurement_time(Duration::from_secs(8))
        .configure_from_args();
    sequential(&mut c, &env);
    concurrent(&mut c, &env);
    c.final_summary();
    env.stop();
}
