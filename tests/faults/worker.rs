//! The worker process: one lease manager, a few tasks that each loop over
//! acquire → fenced claim → hold → fenced write → release, and one line on
//! stdout per event for the controller (`EVT <kind> k=v ...`).
//!
//! The protected resource is one counter document per key,
//! `{_id: key, n, fence, last}`, in a collection with majority reads and
//! writes. A critical section is a read-modify-write guarded by the fencing
//! token at every step:
//!
//! 1. **claim**: `findOneAndUpdate({_id: key, fence: {$lt: tok}}, {$set: {fence: tok}})`
//!    returning the document before: `n` and `last` (the token of the last
//!    applied write). Refused if a token >= ours was already written.
//! 2. **write**: `updateOne({_id: key, fence: tok}, {$set: {n: n + 1, last: tok}})`.
//!    Refused if a higher token was written since our claim.
//!
//! Both steps are idempotent, so an error (failover) is retried; an outcome
//! that stays unknown is settled by the controller from the `last` chain.
//! A refusal is recorded together with whether the lease's token had
//! already fired when the refusal came back: the lock promises it had.

use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

use mongo_lease::testkit::monotonic_ns;
use mongo_lease::{Lease, LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::bson::{Document, doc};
use mongodb::options::{
    CollectionOptions, ReadConcern, ReadPreference, ReturnDocument, SelectionCriteria, WriteConcern,
};
use mongodb::{Client, Collection};
use rand::Rng;
use tokio::io::AsyncBufReadExt;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// Environment variable carrying the worker's [`Config`].
pub const ENV: &str = "MONGO_LEASE_FAULTS_WORKER";

/// How long a fenced step keeps retrying errors before its outcome counts as unknown.
const STEP_RETRY_FOR: Duration = Duration::from_secs(40);

/// What one worker process does.
#[derive(Debug, Clone)]
pub struct Config {
    pub name: String,
    pub uri: String,
    pub db: String,
    pub locks: String,
    pub counters: String,
    pub keys: usize,
    pub tasks: usize,
    pub ttl_ms: u64,
    pub retry_max_ms: u64,
    pub hold_min_ms: u64,
    pub hold_max_ms: u64,
    /// Percentage of critical sections held for TTL / 2 (a renewal falls inside).
    pub long_hold_pct: u32,
    /// The first critical section of task 0 waits for a `write` line on
    /// stdin between its claim and its write.
    pub pause_first: bool,
    /// Critical sections on every kind of lease (`kinds.rs`) instead of
    /// exclusive leases on `k0..keys`.
    pub mixed: bool,
}

impl Config {
    pub fn encode(&self) -> String {
        [
            ("name", self.name.clone()),
            ("uri", self.uri.clone()),
            ("db", self.db.clone()),
            ("locks", self.locks.clone()),
            ("counters", self.counters.clone()),
            ("keys", self.keys.to_string()),
            ("tasks", self.tasks.to_string()),
            ("ttl_ms", self.ttl_ms.to_string()),
            ("retry_max_ms", self.retry_max_ms.to_string()),
            ("hold_min_ms", self.hold_min_ms.to_string()),
            ("hold_max_ms", self.hold_max_ms.to_string()),
            ("long_hold_pct", self.long_hold_pct.to_string()),
            ("pause_first", self.pause_first.to_string()),
            ("mixed", self.mixed.to_string()),
        ]
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join("\n")
    }

    pub fn decode(text: &str) -> Config {
        let map: std::collections::HashMap<&str, &str> =
            text.lines().filter_map(|l| l.split_once('=')).collect();
        fn get<T: FromStr>(map: &std::collections::HashMap<&str, &str>, k: &str) -> T
        where
            T::Err: std::fmt::Debug,
        {
            map.get(k)
                .unwrap_or_else(|| panic!("worker config lacks {k}"))
                .parse()
                .unwrap_or_else(|e| panic!("worker config {k}: {e:?}"))
        }
        Config {
            name: get(&map, "name"),
            uri: get(&map, "uri"),
            db: get(&map, "db"),
            locks: get(&map, "locks"),
            counters: get(&map, "counters"),
            keys: get(&map, "keys"),
            tasks: get(&map, "tasks"),
            ttl_ms: get(&map, "ttl_ms"),
            retry_max_ms: get(&map, "retry_max_ms"),
            hold_min_ms: get(&map, "hold_min_ms"),
            hold_max_ms: get(&map, "hold_max_ms"),
            long_hold_pct: get(&map, "long_hold_pct"),
            pause_first: get(&map, "pause_first"),
            mixed: get(&map, "mixed"),
        }
    }
}

/// The counters collection: majority writes and reads on the primary, like
/// the lock collection (a `w:1` write can be rolled back by a failover).
pub fn counters_collection(client: &Client, db: &str, name: &str) -> Collection<Document> {
    client.database(db).collection_with_options(
        name,
        CollectionOptions::builder()
            .write_concern(WriteConcern::majority())
            .read_concern(ReadConcern::majority())
            .selection_criteria(SelectionCriteria::ReadPreference(ReadPreference::Primary))
            .build(),
    )
}

pub fn emit(line: String) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "EVT {line}");
    let _ = out.flush();
}

/// The outcome of one fenced step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Ok,
    /// A token at least as high was written first.
    Refused,
    /// No definite answer (errors until the retry bound, or our write may or
    /// may not have landed before a higher token's claim).
    Unknown,
    /// Not attempted (the claim was not ours).
    Skipped,
}

impl Step {
    pub fn as_str(self) -> &'static str {
        match self {
            Step::Ok => "ok",
            Step::Refused => "refused",
            Step::Unknown => "unknown",
            Step::Skipped => "skipped",
        }
    }
    pub fn parse(s: &str) -> Step {
        match s {
            "ok" => Step::Ok,
            "refused" => Step::Refused,
            "unknown" => Step::Unknown,
            "skipped" => Step::Skipped,
            other => panic!("unknown step outcome {other:?}"),
        }
    }
}

fn counter(doc: &Document, field: &str) -> i64 {
    doc.get_i64(field).unwrap_or_default()
}

/// Step 1. Returns the outcome, `(n, last)` before the claim, and whether
/// the lease had been signalled lost when a refusal came back.
pub async fn claim(
    coll: &Collection<Document>,
    key: &str,
    tok: i64,
    lease: &Lease,
) -> (Step, i64, i64, bool) {
    let started = tokio::time::Instant::now();
    let mut retried = false;
    loop {
        let result = coll
            .find_one_and_update(
                doc! { "_id": key, "fence": { "$lt": tok } },
                doc! { "$set": { "fence": tok } },
            )
            .return_document(ReturnDocument::Before)
            .await;
        match result {
            Ok(Some(before)) => {
                return (
                    Step::Ok,
                    counter(&before, "n"),
                    counter(&before, "last"),
                    false,
                );
            }
            Ok(None) => {
                let lost = lease.status().is_lost();
                if retried {
                    // An earlier attempt may have applied: then the fence is ours
                    // and nothing changed `n` or `last` since (only we write under it).
                    if let Ok(Some(now)) = coll.find_one(doc! { "_id": key }).await {
                        if counter(&now, "fence") == tok {
                            return (Step::Ok, counter(&now, "n"), counter(&now, "last"), false);
                        }
                    }
                }
                return (Step::Refused, 0, 0, lost);
            }
            Err(e) if started.elapsed() < STEP_RETRY_FOR => {
                emit(format!(
                    "err op=claim key={key} msg={}",
                    one_line(&e.to_string())
                ));
                retried = true;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(_) => return (Step::Unknown, 0, 0, lease.status().is_lost()),
        }
    }
}

/// Step 2. Returns the outcome and whether the lease had been signalled lost
/// when a refusal (or a superseded unknown) came back.
pub async fn write(
    coll: &Collection<Document>,
    key: &str,
    tok: i64,
    n_read: i64,
    lease: &Lease,
) -> (Step, bool) {
    let started = tokio::time::Instant::now();
    let mut retried = false;
    loop {
        let result = coll
            .update_one(
                doc! { "_id": key, "fence": tok },
                doc! { "$set": { "n": n_read + 1, "last": tok } },
            )
            .await;
        match result {
            Ok(r) if r.matched_count == 1 => return (Step::Ok, false),
            Ok(_) if !retried => return (Step::Refused, lease.status().is_lost()),
            Ok(_) => {
                let lost = lease.status().is_lost();
                // An earlier attempt may have applied before a higher claim.
                if let Ok(Some(now)) = coll.find_one(doc! { "_id": key }).await {
                    if counter(&now, "fence") == tok && counter(&now, "last") == tok {
                        return (Step::Ok, false);
                    }
                }
                return (Step::Unknown, lost);
            }
            Err(e) if started.elapsed() < STEP_RETRY_FOR => {
                emit(format!(
                    "err op=write key={key} msg={}",
                    one_line(&e.to_string())
                ));
                retried = true;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(_) => return (Step::Unknown, lease.status().is_lost()),
        }
    }
}

pub fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_whitespace() { ' ' } else { c })
        .take(300)
        .collect()
}

/// Runs the worker until `stop` (or EOF) arrives on stdin; prints events.
pub async fn run(cfg: Config) {
    // The worker's name as the client's appName: a `failCommand` fail
    // point can target one manager.
    let mut options = mongodb::options::ClientOptions::parse(&cfg.uri)
        .await
        .expect("worker URI");
    options.app_name = Some(cfg.name.clone());
    let client = Client::with_options(options).expect("worker client");
    let manager = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(client.database(&cfg.db))
            .collection(cfg.locks.clone())
            .ttl(Duration::from_millis(cfg.ttl_ms))
            .retry_max(Duration::from_millis(cfg.retry_max_ms))
            // The members run on this machine and read its one clock. The
            // default skew (1 s, for members on several machines) would
            // leave a 2 s lease 0.8 s of validity against a 0.67 s
            // heartbeat: any 130 ms stall of a loaded machine would lose a
            // lease in a scenario that asserts none is lost without a fault.
            .clock_skew(Duration::from_millis(100))
            .gc_grace(Duration::ZERO)
            .build(),
    )
    .await
    .expect("worker manager");
    let counters = counters_collection(&client, &cfg.db, &cfg.counters);
    let wall_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i128)
        .unwrap_or_else(|e| -(e.duration().as_millis() as i128));
    emit(format!(
        "ready w={} owner={} pid={} wall_ms={wall_ms} t={}",
        cfg.name,
        manager.owner_id(),
        std::process::id(),
        monotonic_ns()
    ));

    let stop = CancellationToken::new();
    let gate = Arc::new(Notify::new());
    {
        let (stop, gate) = (stop.clone(), gate.clone());
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match line.trim() {
                    "stop" => stop.cancel(),
                    "write" => gate.notify_one(),
                    _ => {}
                }
            }
            stop.cancel(); // EOF: the controller is gone
        });
    }

    let cfg = Arc::new(cfg);
    let mut tasks = Vec::new();
    if cfg.mixed {
        let kinds = Arc::new(crate::kinds::Kinds::new(&manager, counters.clone()).await);
        for task in 0..cfg.tasks {
            let (cfg, kinds, stop) = (cfg.clone(), kinds.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                crate::kinds::task_loop(task, &cfg, &kinds, &stop).await
            }));
        }
    }
    for task in (0..cfg.tasks).filter(|_| !cfg.mixed) {
        let (cfg, manager, counters, stop, gate) = (
            cfg.clone(),
            manager.clone(),
            counters.clone(),
            stop.clone(),
            gate.clone(),
        );
        tasks.push(tokio::spawn(async move {
            task_loop(task, &cfg, &manager, &counters, &stop, &gate).await
        }));
    }
    for t in tasks {
        t.await.expect("worker task panicked");
    }
    let shutdown = match manager.shutdown().await {
        Ok(()) => "ok".to_string(),
        Err(e) => format!("err:{}", one_line(&e.to_string()).replace(' ', "_")),
    };
    emit(format!(
        "done w={} shutdown={shutdown} t={}",
        cfg.name,
        monotonic_ns()
    ));
    // Exit now: the runtime would otherwise wait forever for the blocking
    // read of stdin.
    std::process::exit(0);
}

async fn task_loop(
    task: usize,
    cfg: &Config,
    manager: &LeaseManager,
    counters: &Collection<Document>,
    stop: &CancellationToken,
    gate: &Notify,
) {
    let mut pause = cfg.pause_first && task == 0;
    while !stop.is_cancelled() {
        let key = format!("k{}", rand::rng().random_range(0..cfg.keys));
        let acquired = tokio::select! {
            r = manager.acquire(key.clone()) => r,
            _ = stop.cancelled() => break,
        };
        let lease = match acquired {
            Ok(lease) => lease,
            Err(e) => {
                emit(format!(
                    "err op=acquire key={key} msg={}",
                    one_line(&e.to_string())
                ));
                if e.is_shutdown() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let t_acq = monotonic_ns();
        let tok = lease.fencing_token() as i64;
        emit(format!(
            "acq w={} task={task} key={key} tok={tok} t={t_acq}",
            cfg.name
        ));
        let fired = {
            let token = lease.status().cancellation_token();
            tokio::spawn(async move {
                token.cancelled().await;
                monotonic_ns()
            })
        };

        let (claim, n_read, prev_last, claim_lost) = claim(counters, &key, tok, &lease).await;
        if claim == Step::Ok {
            emit(format!(
                "claimed w={} task={task} key={key} tok={tok} n={n_read} last={prev_last} t={}",
                cfg.name,
                monotonic_ns()
            ));
        }
        if pause {
            pause = false;
            tokio::select! {
                _ = gate.notified() => {}
                _ = stop.cancelled() => {}
            }
        }
        let hold = if rand::rng().random_range(0..100) < cfg.long_hold_pct {
            cfg.ttl_ms / 2
        } else {
            rand::rng().random_range(cfg.hold_min_ms..=cfg.hold_max_ms)
        };
        tokio::time::sleep(Duration::from_millis(hold)).await;
        let (write, write_lost) = if claim == Step::Ok {
            write(counters, &key, tok, n_read, &lease).await
        } else {
            (Step::Skipped, false)
        };

        let lost = lease.status().is_lost();
        let t_rel = monotonic_ns();
        // The end of the critical section, written before the release: the
        // release may hand the key to another task of this worker, which
        // can report its acquisition (and be killed) before this task
        // reports its `cs` line.
        emit(format!(
            "releasing w={} task={task} key={key} tok={tok} t={t_rel}",
            cfg.name
        ));
        let release = match lease.release().await {
            Ok(ReleaseOutcome::Released) => "released".to_string(),
            Ok(ReleaseOutcome::AlreadyLost) => "lost".to_string(),
            Ok(ReleaseOutcome::StillHeld) => "still_held".to_string(),
            Err(e) => format!("err:{}", one_line(&e.to_string()).replace(' ', "_")),
        };
        let t_fired = tokio::time::timeout(Duration::from_secs(10), fired)
            .await
            .ok()
            .and_then(Result::ok);
        let (t_end, t_lost) = match (lost, t_fired) {
            (true, Some(f)) => (f.min(t_rel), f),
            (true, None) => (t_rel, t_rel),
            (false, _) => (t_rel, 0),
        };
        emit(format!(
            "cs w={} task={task} key={key} tok={tok} t_acq={t_acq} t_end={t_end} t_lost={t_lost} \
             claim={} claim_lost={} n={n_read} last={prev_last} write={} write_lost={} \
             lost={} release={release}",
            cfg.name,
            claim.as_str(),
            claim_lost as u8,
            write.as_str(),
            write_lost as u8,
            lost as u8,
        ));
    }
}
