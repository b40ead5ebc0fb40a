//! Throughput on distinct keys, and the cost of a renewal per lease.
//!
//! ```text
//! cargo bench --bench throughput                          # throwaway 1-member replica set
//! THROUGHPUT_PAIRS=4096 cargo bench --bench throughput    # pairs per contender and round
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo bench --bench throughput
//! ```
//!
//! **Throughput.** 64 tasks, each acquiring and releasing its own keys (a
//! pool of 8 keys per task, cycled, so documents are reused as in a
//! long-running process), for a fixed number of acquire + release pairs,
//! all `w: majority`, on one `mongod`. Five contenders, each on its own
//! collection with the same indexes (made by `LeaseManager::connect`),
//! interleaved over 3 rounds, each round starting with the next contender;
//! a contender's round starts only once the previous one's collection has
//! seen no command for [`QUIET`] (delete mode's follow-up deletes come
//! [`DELETE_MIN_TOKEN_AGE`] after each release, and would otherwise run
//! during the next round). The medians and their ratios to (a) are
//! printed:
//!
//! * (a) `raw insert/delete`: the raw driver's `insertOne` of a lock
//!   document and `deleteOne` of it, the floor of any lock on MongoDB;
//! * (b) `raw lease commands`: the raw driver sending the very commands
//!   `mongo-lease` sends for an acquire and a release (captured from the
//!   manager's command log of a lone acquire and release, with the key and
//!   lease id substituted);
//! * (b') the same commands from a client without retryable writes (no
//!   `txnNumber`: a `findAndModify` then stores no image of the document
//!   for a retry to return);
//! * (c) `mongo-lease keep`: `LeaseManager::acquire` + `Lease::release`,
//!   release mode `Keep` (the default);
//! * (d) `mongo-lease delete`: the same with `ReleaseMode::Delete`.
//!
//! (b) and (b') send one command per write, as a lone caller's acquire
//! and release are sent; (c) and (d) group the writes that 64 tasks ask
//! for at once (a group commit, docs/mongodb-behaviour.md, B27), so they
//! can beat both (a) and (b). The commands each contender sent per pair
//! are printed too.
//!
//! **Renewal cost.** A manager holds N leases (1 000, then 5 000, one batch
//! each); the duration of its heartbeat's renewal `updateMany` is read
//! from the command log (start to success) and printed per lease. Then the
//! same command, replayed by hand on the same documents, is timed against
//! variants (the update as one `$set` stage; a plain `$set` of client-side
//! dates, which no lease may use, as the floor of writing N documents), and
//! the filter's query plan is printed (`explain`).
//!
//! The machine may be shared: read the ratios measured side by side in one
//! run, not the absolute figures.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use mongo_lease::{
    DELETE_MIN_TOKEN_AGE, LeaseManager, LeaseManagerOptions, ReleaseMode, ReleaseOutcome,
};
use mongodb::bson::{Bson, DateTime, Document, doc};
use mongodb::event::{EventHandler, command::CommandEvent};
use mongodb::options::{
    ClientOptions, CollectionOptions, ReadConcern, ReadPreference, ReturnDocument,
    SelectionCriteria, WriteConcern,
};
use mongodb::{Client, Collection, Database};
use uuid::Uuid;

#[path = "common/mongod.rs"]
mod mongod;
#[path = "../tests/common/renewal.rs"]
mod renewal;

/// Tasks running at once, each on its own keys.
const TASKS: usize = 64;
/// Keys of each task, cycled through.
const KEYS_PER_TASK: usize = 8;
/// Interleaved rounds; the median is reported.
const ROUNDS: usize = 3;

/// How long a contender's collection must see no command before the next
/// contender's round starts: more than delete mode's delay before its
/// follow-up delete.
const QUIET: Duration = Duration::from_millis(DELETE_MIN_TOKEN_AGE.as_millis() as u64 + 500);
/// Lease TTL of every contender (also the raw documents' `exp` offset).
const TTL: Duration = Duration::from_secs(30);
/// Leases held for the renewal-cost section.
const RENEWAL_SIZES: [usize; 2] = [1_000, 5_000];
/// Times each renewal command is replayed by hand; the median is reported.
const REPLAYS: usize = 5;

fn main() {
    let pairs: usize = std::env::var("THROUGHPUT_PAIRS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_048);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(pairs.max(TASKS)));
}

/// Commands started by the manager's client, per collection and command
/// name; the first `findAndModify` and `update` of each collection, and
/// the durations of renewal commands.
#[derive(Clone, Default)]
struct CommandLog(Arc<Mutex<Log>>);

#[derive(Default)]
struct Log {
    counts: HashMap<(String, String), u64>,
    first: HashMap<(String, String), Document>,
    started: HashMap<i32, (Instant, usize, Document)>,
    /// When a command was last started on each collection.
    last: HashMap<String, Instant>,
    /// `(started, finished, leases, command)` of each completed renewal.
    renewals: Vec<(Instant, Instant, usize, Document)>,
}

impl CommandLog {
    fn handler(&self) -> EventHandler<CommandEvent> {
        let log = self.clone();
        EventHandler::callback(move |event| {
            let now = Instant::now();
            let mut log = log.0.lock().unwrap();
            match event {
                CommandEvent::Started(started) => {
                    let name = started.command_name.clone();
                    let coll = started
                        .command
                        .get_str(&name)
                        .unwrap_or_default()
                        .to_string();
                    log.last.insert(coll.clone(), now);
                    *log.counts.entry((coll.clone(), name.clone())).or_default() += 1;
                    log.first
                        .entry((coll, name))
                        .or_insert_with(|| started.command.clone());
                    if let Some(n) = renewal::renewed_keys(&started.command).map(|k| k.len()) {
                        log.started
                            .insert(started.request_id, (now, n, started.command.clone()));
                    }
                }
                CommandEvent::Succeeded(done) => {
                    if let Some((at, n, command)) = log.started.remove(&done.request_id) {
                        log.renewals.push((at, now, n, command));
                    }
                }
                CommandEvent::Failed(failed) => {
                    log.started.remove(&failed.request_id);
                }
                _ => {}
            }
        })
    }

    /// Commands started on `coll`, by name.
    fn counts(&self, coll: &str) -> BTreeMap<String, u64> {
        let log = self.0.lock().unwrap();
        log.counts
            .iter()
            .filter(|((c, _), _)| c == coll)
            .map(|((_, name), n)| (name.clone(), *n))
            .collect()
    }

    /// Waits until no command has been started on `coll` for [`QUIET`]:
    /// a manager's work left over from a round (delete mode's follow-up
    /// deletes, [`DELETE_MIN_TOKEN_AGE`] after each release) must not run
    /// during the next contender's round.
    async fn settle(&self, coll: &str) {
        loop {
            let last = self.0.lock().unwrap().last.get(coll).copied();
            match last {
                Some(at) if at.elapsed() < QUIET => tokio::time::sleep(QUIET - at.elapsed()).await,
                _ => return,
            }
        }
    }

    /// The first `name` command started on `coll`.
    fn first(&self, coll: &str, name: &str) -> Document {
        let log = self.0.lock().unwrap();
        log.first
            .get(&(coll.to_string(), name.to_string()))
            .cloned()
            .unwrap_or_else(|| panic!("no {name} on {coll} in the command log"))
    }
}

/// A collection handle with the manager's concerns (majority, primary).
fn majority(db: &Database, name: &str) -> Collection<Document> {
    let options = CollectionOptions::builder()
        .write_concern(WriteConcern::majority())
        .read_concern(ReadConcern::majority())
        .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
        .build();
    db.collection_with_options(name, options)
}

/// A lease id as `mongo-lease` stores it (a BSON UUID).
fn lease_id() -> Bson {
    Bson::from(mongodb::bson::Uuid::from_bytes(Uuid::new_v4().into_bytes()))
}

/// `value` with every occurrence of each `(from, to)` pair's `from` replaced.
fn substitute(value: &Bson, pairs: &[(&Bson, &Bson)]) -> Bson {
    if let Some((_, to)) = pairs.iter().find(|(from, _)| *from == value) {
        return (*to).clone();
    }
    match value {
        Bson::Document(d) => Bson::Document(substitute_doc(d, pairs)),
        Bson::Array(a) => Bson::Array(a.iter().map(|v| substitute(v, pairs)).collect()),
        other => other.clone(),
    }
}

fn substitute_doc(d: &Document, pairs: &[(&Bson, &Bson)]) -> Document {
    d.iter()
        .map(|(k, v)| (k.clone(), substitute(v, pairs)))
        .collect()
}

fn pipeline(value: Option<&Bson>) -> Vec<Document> {
    match value {
        Some(Bson::Array(stages)) => stages
            .iter()
            .filter_map(|s| s.as_document().cloned())
            .collect(),
        other => panic!("not a pipeline: {other:?}"),
    }
}

/// The commands of one acquire and one release as `mongo-lease` sent
/// them for `key` under `lid`, replayed with another key and lease id.
struct Replay {
    coll: Collection<Document>,
    key: Bson,
    lid: Bson,
    query: Document,
    update: Vec<Document>,
    fields: Document,
    /// The variables of the acquire (`let`), if it sent any.
    let_vars: Option<Document>,
    release_filter: Document,
    release_update: Vec<Document>,
    /// The release's `let` variables (its lease id).
    release_let: Option<Document>,
}

impl Replay {
    fn new(coll: Collection<Document>, key: &str, acquire: &Document, release: &Document) -> Self {
        let statement = release
            .get_array("updates")
            .ok()
            .and_then(|u| u.first()?.as_document().cloned())
            .expect("an update statement");
        let query = acquire.get_document("query").expect("query").clone();
        let lid = release
            .get_document("let")
            .ok()
            .and_then(find_binary)
            .expect("the release names the lease id");
        Replay {
            coll,
            key: Bson::from(key),
            lid,
            query,
            update: pipeline(acquire.get("update")),
            fields: acquire.get_document("fields").cloned().unwrap_or_default(),
            let_vars: acquire.get_document("let").ok().cloned(),
            release_filter: statement.get_document("q").expect("q").clone(),
            release_update: pipeline(statement.get("u")),
            release_let: release.get_document("let").ok().cloned(),
        }
    }

    async fn pair(&self, key: String) {
        let key = Bson::from(key);
        let lid = lease_id();
        let pairs = [(&self.key, &key), (&self.lid, &lid)];
        let update: Vec<Document> = self
            .update
            .iter()
            .map(|s| substitute_doc(s, &pairs))
            .collect();
        let mut acquire = self
            .coll
            .find_one_and_update(substitute_doc(&self.query, &pairs), update);
        if let Some(vars) = &self.let_vars {
            acquire = acquire.let_vars(substitute_doc(vars, &pairs));
        }
        let got = acquire
            .upsert(true)
            .return_document(ReturnDocument::After)
            .projection(self.fields.clone())
            .await
            .expect("findAndModify")
            .expect("upsert returns the document");
        assert_eq!(got.get("lid"), Some(&lid), "{key} was not free");
        let release: Vec<Document> = self
            .release_update
            .iter()
            .map(|s| substitute_doc(s, &pairs))
            .collect();
        let mut released = self
            .coll
            .update_one(substitute_doc(&self.release_filter, &pairs), release);
        if let Some(vars) = &self.release_let {
            released = released.let_vars(substitute_doc(vars, &pairs));
        }
        let released = released.await.expect("update");
        assert_eq!(released.modified_count, 1);
    }
}

/// The first binary (the lease id) in `d`, depth first.
fn find_binary(d: &Document) -> Option<Bson> {
    d.values().find_map(|v| match v {
        Bson::Binary(_) => Some(v.clone()),
        Bson::Document(d) => find_binary(d),
        Bson::Array(a) => a.iter().find_map(|v| match v {
            Bson::Binary(_) => Some(v.clone()),
            Bson::Document(d) => find_binary(d),
            _ => None,
        }),
        _ => None,
    })
}

/// One contender of the throughput section.
enum Contender {
    InsertDelete(Collection<Document>),
    Replay(Box<Replay>),
    Manager(LeaseManager),
}

impl Contender {
    async fn pair(&self, key: String) {
        match self {
            Contender::InsertDelete(coll) => {
                let now = DateTime::now();
                let exp = DateTime::from_millis(now.timestamp_millis() + TTL.as_millis() as i64);
                coll.insert_one(doc! {
                    "_id": &key, "aid": "raw", "lid": lease_id(),
                    "tok": now.timestamp_millis() << 20, "ts": now, "exp": exp,
                })
                .await
                .expect("insertOne");
                let deleted = coll.delete_one(doc! { "_id": &key }).await.expect("delete");
                assert_eq!(deleted.deleted_count, 1);
            }
            Contender::Replay(replay) => replay.pair(key).await,
            Contender::Manager(manager) => {
                let lease = manager.acquire(key).await.expect("acquire");
                let outcome = lease.release().await.expect("release");
                assert_eq!(outcome, ReleaseOutcome::Released);
            }
        }
    }
}

/// Runs `pairs` acquire + release pairs over [`TASKS`] tasks; pairs/s.
async fn round(contender: &Arc<Contender>, prefix: &str, pairs: usize) -> f64 {
    let per_task = pairs / TASKS;
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let contender = contender.clone();
            let prefix = prefix.to_string();
            tokio::spawn(async move {
                for i in 0..per_task {
                    let key = format!("{prefix}-{task}-{}", i % KEYS_PER_TASK);
                    contender.pair(key).await;
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    (per_task * TASKS) as f64 / started.elapsed().as_secs_f64()
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

async fn connect(db: &Database, collection: &str, mode: ReleaseMode) -> LeaseManager {
    LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(db.clone())
            .collection(collection)
            .ttl(TTL)
            .release_mode(mode)
            .build(),
    )
    .await
    .expect("connect")
}

async fn run(pairs: usize) {
    let (_replica_set, uri) = mongod::mongod().await;
    let log = CommandLog::default();
    let mut options = ClientOptions::parse(&uri).await.expect("uri");
    options.max_pool_size = Some(TASKS as u32 * 2);
    let raw_client = Client::with_options(options.clone()).expect("client");
    let mut once = options.clone();
    once.retry_writes = Some(false);
    let once_client = Client::with_options(once).expect("client");
    options.command_event_handler = Some(log.handler());
    let lease_client = Client::with_options(options).expect("client");
    let name = format!("bench_thru_{}", &Uuid::new_v4().simple().to_string()[..8]);
    let db = lease_client.database(&name);
    let raw_db = raw_client.database(&name);

    // Same indexes on every collection: `connect` makes them.
    connect(&db, "insert.lock", ReleaseMode::Keep)
        .await
        .shutdown()
        .await
        .expect("shutdown");
    // The commands to replay: one acquire and release on the replay
    // collection, the first commands of each name sent on it.
    let capture = connect(&db, "replay.lock", ReleaseMode::Keep).await;
    let lease = capture.acquire("capture").await.expect("acquire");
    assert_eq!(
        lease.release().await.expect("release"),
        ReleaseOutcome::Released
    );
    capture.shutdown().await.expect("shutdown");
    let replay = |db: &Database| {
        Replay::new(
            majority(db, "replay.lock"),
            "capture",
            &log.first("replay.lock", "findAndModify"),
            &log.first("replay.lock", "update"),
        )
    };
    let contenders: Vec<(&str, &str, Arc<Contender>)> = vec![
        (
            "(a) raw insert/delete",
            "insert.lock",
            Arc::new(Contender::InsertDelete(majority(&raw_db, "insert.lock"))),
        ),
        (
            "(b) raw lease commands",
            "replay.lock",
            Arc::new(Contender::Replay(Box::new(replay(&raw_db)))),
        ),
        (
            "(b') same, not retryable",
            "replay.lock",
            Arc::new(Contender::Replay(Box::new(replay(
                &once_client.database(&name),
            )))),
        ),
        (
            "(c) mongo-lease keep",
            "keep.lock",
            Arc::new(Contender::Manager(
                connect(&db, "keep.lock", ReleaseMode::Keep).await,
            )),
        ),
        (
            "(d) mongo-lease delete",
            "delete.lock",
            Arc::new(Contender::Manager(
                connect(&db, "delete.lock", ReleaseMode::Delete).await,
            )),
        ),
    ];
    // Warm up: connection pools, documents of every key.
    for (_, _, contender) in &contenders {
        round(contender, "k", TASKS * KEYS_PER_TASK).await;
    }
    let before: Vec<_> = contenders.iter().map(|(_, c, _)| log.counts(c)).collect();
    let mut rates = vec![Vec::new(); contenders.len()];
    for r in 0..ROUNDS {
        // Each round starts with the next contender, so that none always
        // runs first (right after the warm-up) or after the same one.
        for j in 0..contenders.len() {
            let i = (r + j) % contenders.len();
            let (_, coll, contender) = &contenders[i];
            rates[i].push(round(contender, "k", pairs).await);
            log.settle(coll).await;
        }
    }
    println!(
        "throughput: {TASKS} tasks on distinct keys, {pairs} acquire+release pairs per contender \
         and round, {ROUNDS} interleaved rounds, w:majority"
    );
    let base = median(&mut rates[0].clone());
    for (i, (label, coll, _)) in contenders.iter().enumerate() {
        let m = median(&mut rates[i].clone());
        let rounds: Vec<String> = rates[i].iter().map(|r| format!("{r:.0}")).collect();
        let sent: Vec<String> = log
            .counts(coll)
            .iter()
            .map(|(name, n)| {
                let was = before[i].get(name).copied().unwrap_or(0);
                let per_pair = (n - was) as f64 / (pairs / TASKS * TASKS * ROUNDS) as f64;
                format!("{name} {per_pair:.2}")
            })
            .filter(|s| !s.ends_with(" 0.00"))
            .collect();
        println!(
            "  {label:<24} {m:>7.0} pairs/s  {:.2}x (a)  rounds [{}]{}",
            m / base,
            rounds.join(", "),
            if sent.is_empty() {
                String::new()
            } else {
                format!("  commands/pair: {}", sent.join(", "))
            }
        );
    }
    for (_, _, contender) in contenders {
        if let Contender::Manager(manager) = &*contender {
            manager.shutdown().await.expect("shutdown");
        }
    }

    for n in RENEWAL_SIZES {
        renewal_cost(&db, &raw_db, &log, n).await;
    }

    db.drop().await.expect("drop the benchmark database");
    drop((db, raw_db));
    for client in [lease_client, raw_client, once_client] {
        if tokio::time::timeout(Duration::from_secs(10), client.shutdown())
            .await
            .is_err()
        {
            eprintln!("a client's shutdown took over 10 s");
        }
    }
}

/// The median duration of `REPLAYS` runs of `op`.
async fn timed<F, Fut>(op: F) -> Duration
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut times = Vec::new();
    for _ in 0..REPLAYS {
        let started = Instant::now();
        op().await;
        times.push(started.elapsed().as_secs_f64());
    }
    Duration::from_secs_f64(median(&mut times))
}

fn per_lease(d: Duration, n: usize) -> String {
    format!("{:>6.1} µs/lease", d.as_secs_f64() * 1e6 / n as f64)
}

/// Renewal cost with `n` leases held by one manager.
async fn renewal_cost(db: &Database, raw_db: &Database, log: &CommandLog, n: usize) {
    let coll = format!("renew{n}.lock");
    let manager = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(db.clone())
            .collection(coll.as_str())
            .ttl(Duration::from_secs(60))
            .heartbeat_interval(Duration::from_secs(2))
            .build(),
    )
    .await
    .expect("connect");
    let leases = futures::stream::iter(0..n)
        .map(|i| {
            let manager = manager.clone();
            async move { manager.acquire(format!("r-{i:06}")).await }
        })
        .buffer_unordered(TASKS)
        .try_collect::<Vec<_>>()
        .await
        .expect("acquire");
    let after = Instant::now();
    let (tick, command) = loop {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let log = log.0.lock().unwrap();
        let tick: Vec<_> = log
            .renewals
            .iter()
            .filter(|(at, ..)| *at >= after)
            .cloned()
            .collect();
        if tick.iter().map(|(_, _, n, _)| n).sum::<usize>() >= n {
            let command = tick[0].3.clone();
            break (tick, command);
        }
    };
    let through_manager: Duration = tick.iter().map(|(at, end, ..)| *end - *at).sum();
    println!(
        "renewal: {n} leases held, one heartbeat: {} updateMany, {:.1} ms, {}",
        tick.len(),
        through_manager.as_secs_f64() * 1e3,
        per_lease(through_manager, n)
    );

    // The same command by hand, on the same documents (it renews them again).
    let target = majority(raw_db, &coll);
    let statement = command
        .get_array("updates")
        .ok()
        .and_then(|u| u.first()?.as_document().cloned())
        .expect("an update statement");
    let filter = statement.get_document("q").expect("q").clone();
    let update = pipeline(statement.get("u"));
    let renewed = tick[0].2;
    let as_sent = timed(|| async {
        let r = target
            .update_many(filter.clone(), update.clone())
            .await
            .expect("updateMany");
        assert_eq!(r.matched_count as usize, renewed);
    })
    .await;
    let one_stage = vec![doc! { "$set": {
        "ts": "$$NOW",
        "exp": { "$max": [{ "$add": ["$$NOW", 60_000_i64] }, "$hl"] },
    }}];
    let single = timed(|| async {
        target
            .update_many(filter.clone(), one_stage.clone())
            .await
            .expect("updateMany");
    })
    .await;
    let floor = timed(|| async {
        let now = DateTime::now();
        let exp = DateTime::from_millis(now.timestamp_millis() + 60_000);
        target
            .update_many(filter.clone(), doc! { "$set": { "ts": now, "exp": exp } })
            .await
            .expect("updateMany");
    })
    .await;
    println!(
        "  by hand, {renewed} leases, median of {REPLAYS}: as sent {} | one $set stage {} ({:.2}x) | \
         $set of client dates (floor) {} ({:.2}x)",
        per_lease(as_sent, renewed),
        per_lease(single, renewed),
        single.as_secs_f64() / as_sent.as_secs_f64(),
        per_lease(floor, renewed),
        floor.as_secs_f64() / as_sent.as_secs_f64(),
    );
    let explained = raw_db
        .run_command(doc! {
            "explain": { "update": &coll, "updates": [{ "q": filter, "u": update, "multi": true }] },
            "verbosity": "executionStats",
        })
        .await
        .expect("explain");
    let stats = explained
        .get_document("executionStats")
        .cloned()
        .unwrap_or_default();
    let winning = explained
        .get_document("queryPlanner")
        .and_then(|p| p.get_document("winningPlan"))
        .cloned()
        .unwrap_or_default();
    println!(
        "  plan: {} | keys examined {} | documents examined {} | would modify {}",
        plan_stages(&winning),
        stats
            .get("totalKeysExamined")
            .cloned()
            .unwrap_or(Bson::Null),
        stats
            .get("totalDocsExamined")
            .cloned()
            .unwrap_or(Bson::Null),
        stats
            .get_document("executionStages")
            .ok()
            .and_then(|s| s.get("nWouldModify").cloned())
            .unwrap_or(Bson::Null),
    );
    assert!(
        leases.iter().all(|l| !l.status().is_lost()),
        "no lease lost"
    );
    manager.shutdown().await.expect("shutdown");
}

/// The stages of a query plan, outermost first (`UPDATE <- FETCH <- IXSCAN _id_`).
fn plan_stages(plan: &Document) -> String {
    let mut stages = Vec::new();
    let mut stage = Some(plan);
    while let Some(s) = stage {
        let mut name = s.get_str("stage").unwrap_or("?").to_string();
        if let Ok(index) = s.get_str("indexName") {
            name.push_str(&format!(" {index}"));
        }
        stages.push(name);
        stage = s.get_document("inputStage").ok();
    }
    stages.join(" <- ")
}
