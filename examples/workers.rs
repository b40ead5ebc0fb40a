//! Four workers compete for three job keys through `mongo-lease`.
//!
//! Each worker stands for a separate process: it has its own
//! `mongodb::Client` and its own [`LeaseManager`]. A worker acquires a key
//! (waiting when another worker holds it), works for longer than the 2 s
//! lease TTL (so the manager's heartbeat has to renew the lease, which you can
//! see in the lock document's `exp`), writes its result to a protected
//! resource fenced by its fencing token, and releases.
//!
//! The worker `delta` runs on its own thread and tokio runtime and freezes
//! that thread (`std::thread::sleep`, like a long GC pause or a `SIGSTOP`)
//! while it holds `job-c`. Its lease is not renewed and expires; `charlie`
//! takes the key over with a higher fencing token. When `delta` thaws, it
//! reads `is_lost() == true` at once (the lease's local deadline is read
//! without the manager task, which has not run yet), with `lost_reason()`
//! `expired`. It writes anyway, as code that does not check would: the
//! resource refuses the write because its token is older than the one it
//! has seen. As soon as delta's manager runs again, the lease's lost-lease
//! signal (its cancellation token) fires.
//!
//! The protected resource is one document per key in the `jobs` collection,
//! updated only under the lease's [`Fence`](mongo_lease::Fence): the write
//! matches only if the stored `fence` is not greater than its token, and
//! stores its token.
//!
//! Run it (about 15 s):
//!
//! ```text
//! cargo run --example workers            # starts a throwaway mongod (installed into ~/.cache/mongo-lease/ on first use)
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo run --example workers
//! RUST_LOG=mongo_lease=debug cargo run --example workers    # also show the manager's own logs
//! ```
//!
//! With `MONGODB_URI` the demo uses a fresh database (`workers_demo_<random>`)
//! on that deployment, a replica set, and drops it at the end.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Display;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{Fence, Lease, LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::bson::{Document, doc};
use mongodb::{Client, Collection};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const KEYS: [&str; 3] = ["job-a", "job-b", "job-c"];
/// Lease time-to-live: short, so that the demo is quick.
const TTL: Duration = Duration::from_secs(2);
/// How often each manager renews its leases (must be below TTL - safety
/// margin - clock skew).
const HEARTBEAT: Duration = Duration::from_millis(600);
/// How far apart the replica set's members' clocks may be: the demo's set
/// has one member, whose clock steps only when it is set (the default, 1 s,
/// suits a set whose members may fail over).
const CLOCK_SKEW: Duration = Duration::from_millis(200);
/// How long one job holds its lease: longer than the TTL.
const JOB: Duration = Duration::from_millis(2500);
/// How long delta's thread is frozen while it holds `job-c`.
const FREEZE: Duration = Duration::from_secs(6);
/// Lock collection (one document per key) and protected resource.
const LOCKS: &str = "jobs.lock";
const RESOURCE: &str = "jobs";

fn main() -> Result<(), BoxError> {
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .init();
    }
    let runtime = tokio::runtime::Runtime::new()?;
    // A throwaway replica set unless MONGODB_URI is set; dropping it stops mongod.
    let (replica_set, uri) = match std::env::var("MONGODB_URI").ok().filter(|u| !u.is_empty()) {
        Some(uri) => {
            println!("using MONGODB_URI={uri}");
            (None, uri)
        }
        None => {
            let started = Instant::now();
            let rs = runtime.block_on(ReplicaSet::start(ReplicaSetOptions::default()))?;
            println!(
                "started a throwaway 1-member replica set at {} in {:.1} s",
                rs.uri(),
                started.elapsed().as_secs_f64()
            );
            let uri = rs.uri();
            (Some(rs), uri)
        }
    };
    let result = runtime.block_on(run(uri));
    drop(runtime);
    drop(replica_set);
    result
}

async fn run(uri: String) -> Result<(), BoxError> {
    let db_name = format!(
        "workers_demo_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let admin = Client::with_uri_str(&uri).await?;
    let db = admin.database(&db_name);
    let resource: Collection<Document> = db.collection(RESOURCE);
    for key in KEYS {
        resource
            .insert_one(doc! { "_id": key, "fence": 0_i64, "writes": 0, "by": "nobody" })
            .await?;
    }
    println!(
        "4 workers (own Client + LeaseManager each) x keys {KEYS:?}; TTL {} s, heartbeat {} ms, jobs {} ms",
        TTL.as_secs(),
        HEARTBEAT.as_millis(),
        JOB.as_millis()
    );
    println!(
        "delta runs on its own thread and freezes it for {} s while holding job-c",
        FREEZE.as_secs()
    );
    println!("-----------------------------------------------------------------------------");

    let demo = Arc::new(Demo {
        start: Instant::now(),
        uri,
        db: db_name,
        story: Mutex::default(),
    });

    // delta: its own OS thread and current-thread runtime, so that blocking the
    // thread freezes its manager (no heartbeat) and its worker together.
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let delta = {
        let demo = demo.clone();
        std::thread::Builder::new()
            .name("delta".into())
            .spawn(move || -> Result<(), String> {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .map_err(|e| e.to_string())?;
                runtime
                    .block_on(async move {
                        let worker = Worker::connect("delta", demo).await?;
                        worker.frozen_job("job-c", ready_tx).await?;
                        worker.job("job-b").await?;
                        worker.manager.shutdown().await?;
                        Ok::<_, BoxError>(())
                    })
                    .map_err(|e| e.to_string())
            })?
    };
    // The others start once delta holds job-c.
    ready_rx.await?;

    let plans: [(&'static str, [&str; 3]); 3] = [
        ("alpha", ["job-a", "job-b", "job-c"]),
        ("bravo", ["job-b", "job-c", "job-a"]),
        ("charlie", ["job-c", "job-a", "job-b"]),
    ];
    let mut workers = Vec::new();
    for (name, plan) in plans {
        let demo = demo.clone();
        workers.push(tokio::spawn(async move {
            let worker = Worker::connect(name, demo).await?;
            for key in plan {
                worker.job(key).await?;
            }
            worker.manager.shutdown().await?;
            Ok::<_, BoxError>(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    tokio::task::spawn_blocking(move || delta.join())
        .await?
        .map_err(|_| "delta's thread panicked")??;

    // Every manager has shut down: no lease may be left live on the server.
    let locks: Collection<Document> = db.collection(LOCKS);
    let live = locks
        .count_documents(doc! { "$expr": { "$gt": ["$exp", "$$NOW"] } })
        .await?;
    let documents = locks.count_documents(doc! {}).await?;

    println!("-----------------------------------------------------------------------------");
    {
        let story = demo.story.lock().unwrap();
        let counts: Vec<String> = story
            .acquisitions
            .iter()
            .map(|(name, n)| format!("{name} {n}"))
            .collect();
        println!("acquisitions: {}", counts.join(", "));
        for line in story.takeovers.iter().chain(&story.refused) {
            println!("{line}");
        }
    }
    let mut writes = Vec::new();
    let mut cursor = resource.find(doc! {}).sort(doc! { "_id": 1 }).await?;
    while cursor.advance().await? {
        let d = cursor.deserialize_current()?;
        writes.push(format!(
            "{} {} (last by {})",
            d.get_str("_id")?,
            d.get_i32("writes")?,
            d.get_str("by")?
        ));
    }
    println!("fenced writes accepted: {}", writes.join(", "));
    println!(
        "all 4 managers shut down; live leases left: {live} (of {documents} lock documents, kept for their tokens)"
    );
    db.drop().await?;
    if live != 0 {
        return Err(format!("{live} leases are still live after shutdown").into());
    }
    Ok(())
}

/// The narration: shared bookkeeping for the printed story only. The workers
/// never coordinate through it (they only share MongoDB).
struct Demo {
    start: Instant,
    uri: String,
    db: String,
    story: Mutex<Story>,
}

#[derive(Default)]
struct Story {
    /// Who the narrator last saw acquire each key, and with which token.
    holders: HashMap<String, (&'static str, u64)>,
    acquisitions: BTreeMap<&'static str, u32>,
    takeovers: Vec<String>,
    refused: Vec<String>,
}

impl Demo {
    fn secs(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }
}

struct Worker {
    name: &'static str,
    demo: Arc<Demo>,
    manager: LeaseManager,
    locks: Collection<Document>,
    resource: Collection<Document>,
}

impl Worker {
    /// A worker with its own client and manager, as if in its own process.
    async fn connect(name: &'static str, demo: Arc<Demo>) -> Result<Worker, BoxError> {
        let client = Client::with_uri_str(&demo.uri).await?;
        let db = client.database(&demo.db);
        let manager = LeaseManager::connect(
            LeaseManagerOptions::builder()
                .database(db.clone())
                .collection(LOCKS)
                .owner_id(name)
                .ttl(TTL)
                .heartbeat_interval(HEARTBEAT)
                .clock_skew(CLOCK_SKEW)
                .build(),
        )
        .await?;
        Ok(Worker {
            name,
            demo,
            manager,
            locks: db.collection(LOCKS),
            resource: db.collection(RESOURCE),
        })
    }

    fn say(&self, key: &str, what: impl Display) {
        println!(
            "[{:>5.2}s] {:<7} {key}  {what}",
            self.demo.secs(),
            self.name
        );
    }

    /// Acquires `key`, saying so when it has to wait for another holder.
    async fn acquire(&self, key: &str) -> Result<Lease, BoxError> {
        let asked = Instant::now();
        let lease = match self.manager.try_acquire(key).await? {
            Some(lease) => lease,
            None => {
                let holder = self
                    .locks
                    .find_one(doc! { "_id": key })
                    .await?
                    .and_then(|d| d.get_str("aid").ok().map(str::to_string))
                    .unwrap_or_else(|| "?".into());
                self.say(key, format!("busy (held by {holder}), waiting"));
                self.manager.acquire(key).await?
            }
        };
        let token = lease.fencing_token();
        let waited = asked.elapsed().as_secs_f64();
        self.say(
            key,
            format!("acquired  token {token}  (waited {waited:.1} s)"),
        );
        let mut story = self.demo.story.lock().unwrap();
        *story.acquisitions.entry(self.name).or_default() += 1;
        if let Some((previous, old)) = story.holders.insert(key.to_string(), (self.name, token)) {
            // The previous holder never released: its lease expired unrenewed.
            self.say(
                key,
                format!(
                    "TAKEOVER: {previous}'s lease expired unrenewed; {token} > {previous}'s {old}"
                ),
            );
            story.takeovers.push(format!(
                "takeover: {} took {key} at {:.1} s from {previous} (frozen), token {old} -> {token}",
                self.name,
                self.demo.secs()
            ));
        }
        Ok(lease)
    }

    /// Marks the key released in the narration (if this lease is still its holder).
    fn forget(&self, key: &str, token: u64) {
        let mut story = self.demo.story.lock().unwrap();
        if story.holders.get(key).is_some_and(|&(_, t)| t == token) {
            story.holders.remove(key);
        }
    }

    /// `ts` and `exp` of the lock document, in server milliseconds.
    async fn lock_times(&self, key: &str) -> Result<(i64, i64), BoxError> {
        let d = self
            .locks
            .find_one(doc! { "_id": key })
            .await?
            .ok_or("lock document missing")?;
        Ok((
            d.get_datetime("ts")?.timestamp_millis(),
            d.get_datetime("exp")?.timestamp_millis(),
        ))
    }

    /// Works under the lease for `duration`, watching the lock document: each
    /// change of `ts` is a renewal by the manager's heartbeat. Says once that
    /// the lease has outlived its TTL. `false` if the lease was lost.
    async fn work(&self, lease: &Lease, duration: Duration) -> Result<bool, BoxError> {
        let key = &lease.key().to_string();
        let began = Instant::now();
        let (ts0, exp0) = self.lock_times(key).await?;
        let (mut last_ts, mut renewals, mut shown) = (ts0, 0, false);
        while began.elapsed() < duration {
            tokio::select! {
                _ = lease.status().lost() => {
                    self.say(key, "LOST: cancellation token fired, stopping work");
                    return Ok(false);
                }
                _ = tokio::time::sleep(Duration::from_millis(100)) => {}
            }
            let (ts, exp) = self.lock_times(key).await?;
            if ts != last_ts {
                renewals += 1;
                last_ts = ts;
            }
            if !shown && began.elapsed() > TTL {
                shown = true;
                self.say(
                    key,
                    format!(
                        "renewed  {renewals}x by heartbeat: exp = acquire+{:.1} s (was +{:.1} s), held {:.1} s > TTL",
                        (exp - ts0) as f64 / 1e3,
                        (exp0 - ts0) as f64 / 1e3,
                        began.elapsed().as_secs_f64()
                    ),
                );
            }
        }
        Ok(true)
    }

    /// Writes this job's result to the protected resource, fenced by the
    /// lease's `fence`: refused if the resource has already seen a higher
    /// token. `Err((fence, by))` with the resource's current fence when
    /// refused.
    async fn fenced_write(
        &self,
        key: &str,
        fence: Fence,
    ) -> Result<Result<(), (i64, String)>, BoxError> {
        let mut filter = doc! { "_id": key };
        filter.extend(fence.filter("fence"));
        let update = fence.update_with(
            "fence",
            doc! { "$set": { "by": self.name }, "$inc": { "writes": 1 } },
        )?;
        let result = self.resource.update_one(filter, update).await?;
        if result.matched_count == 1 {
            return Ok(Ok(()));
        }
        let current = self
            .resource
            .find_one(doc! { "_id": key })
            .await?
            .ok_or("resource document missing")?;
        Ok(Err((
            current.get_i64("fence")?,
            current.get_str("by")?.to_string(),
        )))
    }

    /// One job: acquire, work past the TTL, write the result fenced, release.
    async fn job(&self, key: &str) -> Result<(), BoxError> {
        let lease = self.acquire(key).await?;
        let token = lease.fencing_token();
        let held = Instant::now();
        let completed = self.work(&lease, JOB).await?;
        let write = if completed && !lease.status().is_lost() {
            match self.fenced_write(key, lease.fence()).await? {
                Ok(()) => "result written (fenced)".to_string(),
                Err((fence, by)) => format!("result REFUSED (fence {fence} by {by})"),
            }
        } else {
            "no result written".to_string()
        };
        self.forget(key, token); // before the key can be seen free
        let outcome = lease.release().await?;
        self.say(
            key,
            format!(
                "released  after {:.1} s: {outcome:?}, {write}",
                held.elapsed().as_secs_f64()
            ),
        );
        Ok(())
    }

    /// delta's job: acquires `key`, then its whole thread freezes for longer
    /// than the TTL; on thawing it writes its result with its old token.
    async fn frozen_job(
        &self,
        key: &str,
        ready: tokio::sync::oneshot::Sender<()>,
    ) -> Result<(), BoxError> {
        let lease = self.acquire(key).await?;
        let token = lease.fencing_token();
        // Runs on this (delta's) runtime: prints when the manager signals the loss.
        let lost = lease.status().lost();
        let demo = self.demo.clone();
        let watcher = tokio::spawn(async move {
            lost.await;
            println!(
                "[{:>5.2}s] delta   job-c  lost-lease signal: cancellation token fired",
                demo.secs()
            );
        });
        let _ = ready.send(());
        tokio::time::sleep(Duration::from_millis(300)).await;

        self.say(
            key,
            format!(
                "FREEZES its thread for {} s (no heartbeat can run)",
                FREEZE.as_secs()
            ),
        );
        std::thread::sleep(FREEZE);
        // Nothing on this thread ran while it was frozen, so the manager has
        // not noticed yet; the lease reads lost all the same (its local
        // deadline is read without the manager). It writes anyway, to show
        // the fence.
        let reason = lease
            .status()
            .lost_reason()
            .map_or_else(|| "none".to_string(), |r| r.to_string());
        self.say(
            key,
            format!(
                "thaws: is_lost() = {} (reason: {reason}), yet writes its result with token {token}",
                lease.status().is_lost()
            ),
        );
        match self.fenced_write(key, lease.fence()).await? {
            Ok(()) => self.say(
                key,
                "late write ACCEPTED (the successor had not written yet)",
            ),
            Err((fence, by)) => {
                self.say(
                    key,
                    format!("late write REFUSED: resource fence is {fence} (by {by})"),
                );
                self.demo.story.lock().unwrap().refused.push(format!(
                    "stale write: delta's write with token {token} refused (fence {fence} by {by})"
                ));
            }
        }
        tokio::time::timeout(TTL, lease.status().lost()).await?;
        watcher.await?;
        let outcome = lease.release().await?;
        debug_assert_eq!(outcome, ReleaseOutcome::AlreadyLost);
        self.forget(key, token);
        self.say(key, format!("release() -> {outcome:?}"));
        Ok(())
    }
}
