//! The controller side: worker processes, their event history, and the
//! safety checker.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongo_lease::testkit::monotonic_ns;
use mongo_lease::{LockManager, LockManagerOptions};
use mongodb::bson::{Document, doc};
use mongodb::{Client, Collection};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;

use crate::worker::{self, Config, Step};

/// One `EVT` line of a worker, as received by the controller.
#[derive(Debug, Clone)]
pub struct Event {
    pub w: String,
    pub kind: String,
    pub fields: HashMap<String, String>,
}

impl Event {
    pub fn get(&self, k: &str) -> &str {
        self.fields
            .get(k)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("event {self:?} lacks {k}"))
    }
    pub fn num(&self, k: &str) -> i64 {
        self.get(k)
            .parse()
            .unwrap_or_else(|e| panic!("event field {k} of {self:?}: {e}"))
    }
    pub fn t(&self) -> u64 {
        self.num("t") as u64
    }

    pub fn parse(w: &str, line: &str) -> Option<Event> {
        // The test harness prints `test worker_process ... ` without a newline.
        let rest = &line[line.find("EVT ")? + 4..];
        let mut parts = rest.splitn(2, ' ');
        let kind = parts.next()?.to_string();
        let mut fields = HashMap::new();
        let body = parts.next().unwrap_or("");
        // `msg=` is last and may contain spaces.
        let (body, msg) = match body.find(" msg=") {
            Some(i) => (&body[..i], Some(&body[i + 5..])),
            None => (body, None),
        };
        for kv in body.split(' ') {
            if let Some((k, v)) = kv.split_once('=') {
                fields.insert(k.to_string(), v.to_string());
            }
        }
        if let Some(msg) = msg {
            fields.insert("msg".into(), msg.to_string());
        }
        Some(Event {
            w: w.to_string(),
            kind,
            fields,
        })
    }
}

/// Every event of every worker, in arrival order.
#[derive(Default)]
pub struct History {
    events: Mutex<Vec<Event>>,
    notify: Notify,
}

impl History {
    fn push(&self, e: Event) {
        self.events.lock().unwrap().push(e);
        self.notify.notify_waiters();
    }

    pub fn len(&self) -> usize {
        self.events.lock().unwrap().len()
    }

    pub fn all(&self) -> Vec<Event> {
        self.events.lock().unwrap().clone()
    }

    /// Waits (bounded) until `n` events of `kind` arrived at index >= `from`.
    pub async fn wait_count(&self, what: &str, kind: &str, from: usize, n: usize, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let count = self.events.lock().unwrap()[from..]
                .iter()
                .filter(|e| e.kind == kind)
                .count();
            if count >= n {
                return;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("timed out after {limit:?} waiting for {what} (got {count})");
            }
        }
    }

    /// Acquisitions per worker and errors since index `from`, for a failure message.
    fn summary(&self, from: usize) -> String {
        let events = self.events.lock().unwrap();
        let mut acquisitions: BTreeMap<&str, usize> = BTreeMap::new();
        let mut errors = Vec::new();
        for e in &events[from..] {
            match e.kind.as_str() {
                "acq" => *acquisitions.entry(e.w.as_str()).or_default() += 1,
                "err" => errors.push(format!("{}: {:?}", e.w, e.fields)),
                _ => {}
            }
        }
        errors.truncate(5);
        format!("acquisitions by worker {acquisitions:?}; first errors {errors:?}")
    }

    /// Waits (bounded) for the first event at index >= `from` matching `pred`.
    pub async fn wait_for(
        &self,
        what: &str,
        from: usize,
        limit: Duration,
        pred: impl Fn(&Event) -> bool,
    ) -> Event {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(e) = self.events.lock().unwrap()[from..].iter().find(|e| pred(e)) {
                return e.clone();
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!(
                    "timed out after {limit:?} waiting for {what}; meanwhile {}",
                    self.summary(from)
                );
            }
        }
    }
}

struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    /// When it was killed: before the signal, and once it was reaped.
    killed: Option<(u64, u64)>,
}

/// Parameters shared by the workers of one scenario.
#[derive(Debug, Clone)]
pub struct Params {
    pub workers: usize,
    pub tasks: usize,
    pub keys: usize,
    pub ttl: Duration,
    pub retry_max: Duration,
    pub hold_ms: (u64, u64),
    pub long_hold_pct: u32,
}

/// The worker processes of one scenario, the history of their events, and
/// the database they work in.
pub struct Fleet {
    pub params: Params,
    pub uri: String,
    pub db: String,
    pub client: Client,
    procs: HashMap<String, Proc>,
    pub history: Arc<History>,
    next: usize,
}

/// Shuts the fleet's client down while the scenario's (multi-threaded)
/// runtime still runs (`common::shut_down`).
impl Drop for Fleet {
    fn drop(&mut self) {
        crate::common::shut_down(vec![self.client.clone()]);
    }
}

pub const LOCKS: &str = "job.lock";
pub const COUNTERS: &str = "job";

impl Fleet {
    /// Creates the lock collection (TTL index with zero grace) and the
    /// counters, without starting any worker.
    pub async fn new(uri: &str, params: Params) -> Fleet {
        let client = Client::with_uri_str(uri).await.unwrap();
        let db = format!("faults_{}", &uuid::Uuid::new_v4().simple().to_string()[..8]);
        let setup = LockManager::connect(
            LockManagerOptions::builder()
                .database(client.database(&db))
                .collection(LOCKS)
                .gc_grace(Duration::ZERO)
                .build(),
        )
        .await
        .unwrap();
        setup.shutdown().await.unwrap();
        let counters = worker::counters_collection(&client, &db, COUNTERS);
        for k in 0..params.keys {
            counters
                .insert_one(
                    doc! { "_id": format!("k{k}"), "n": 0_i64, "fence": 0_i64, "last": 0_i64 },
                )
                .await
                .unwrap();
        }
        Fleet {
            params,
            uri: uri.to_string(),
            db,
            client,
            procs: HashMap::new(),
            history: Arc::default(),
            next: 0,
        }
    }

    pub fn counters(&self) -> Collection<Document> {
        worker::counters_collection(&self.client, &self.db, COUNTERS)
    }

    pub fn locks(&self) -> Collection<Document> {
        self.client.database(&self.db).collection(LOCKS)
    }

    /// The configuration of the next worker, connecting to `uri`.
    pub fn config(&mut self, uri: &str) -> Config {
        self.next += 1;
        Config {
            name: format!("w{}", self.next),
            uri: uri.to_string(),
            db: self.db.clone(),
            locks: LOCKS.into(),
            counters: COUNTERS.into(),
            keys: self.params.keys,
            tasks: self.params.tasks,
            ttl_ms: self.params.ttl.as_millis() as u64,
            retry_max_ms: self.params.retry_max.as_millis() as u64,
            hold_min_ms: self.params.hold_ms.0,
            hold_max_ms: self.params.hold_ms.1,
            long_hold_pct: self.params.long_hold_pct,
            pause_first: false,
        }
    }

    /// Starts `n` ordinary workers on the fleet's URI; waits until they are ready.
    pub async fn spawn_n(&mut self, n: usize) -> Vec<String> {
        let mut names = Vec::new();
        for _ in 0..n {
            let cfg = self.config(&self.uri.clone());
            names.push(self.spawn(cfg, &[]).await);
        }
        names
    }

    /// Starts one worker process (this test binary, running the ignored
    /// `worker_process` test) and waits for its `ready` event.
    pub async fn spawn(&mut self, cfg: Config, env: &[(&str, String)]) -> String {
        let from = self.history.len();
        let name = cfg.name.clone();
        let exe = std::env::current_exe().unwrap();
        let mut cmd = Command::new(exe);
        cmd.args([
            "worker_process",
            "--exact",
            "--nocapture",
            "--include-ignored",
            "--test-threads=1",
        ])
        .env(worker::ENV, cfg.encode())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("spawning a worker process");
        let stdout = child.stdout.take().unwrap();
        let stdin = child.stdin.take();
        let history = self.history.clone();
        let w = name.clone();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(e) = Event::parse(&w, &line) {
                    history.push(e);
                }
            }
            history.push(Event {
                w: w.clone(),
                kind: "exit".into(),
                fields: HashMap::from([("t".to_string(), monotonic_ns().to_string())]),
            });
        });
        self.procs.insert(
            name.clone(),
            Proc {
                child,
                stdin,
                killed: None,
            },
        );
        let w = name.clone();
        self.history
            .wait_for(
                &format!("worker {name} to be ready"),
                from,
                Duration::from_secs(60),
                |e| e.w == w && (e.kind == "ready" || e.kind == "exit"),
            )
            .await;
        assert!(
            self.history.all()[from..]
                .iter()
                .any(|e| e.w == name && e.kind == "ready"),
            "worker {name} exited before it was ready"
        );
        name
    }

    /// Sends a line to a worker's stdin.
    pub async fn tell(&mut self, w: &str, line: &str) {
        let stdin = self.procs.get_mut(w).unwrap().stdin.as_mut().unwrap();
        stdin
            .write_all(format!("{line}\n").as_bytes())
            .await
            .unwrap();
        stdin.flush().await.unwrap();
    }

    /// Kills a worker with SIGKILL and reaps it. Returns (time just before
    /// the signal, time once reaped) on the shared monotonic clock.
    pub async fn kill(&mut self, w: &str) -> (u64, u64) {
        let p = self.procs.get_mut(w).unwrap();
        let before = monotonic_ns();
        p.child.start_kill().unwrap();
        p.child.wait().await.unwrap();
        let after = monotonic_ns();
        p.killed = Some((before, after));
        p.stdin = None;
        self.output_read(w, Duration::from_secs(10)).await;
        (before, after)
    }

    /// Waits until every line worker `w` printed before it exited is in the
    /// history: its reader records `exit` at the end of the output.
    async fn output_read(&self, w: &str, limit: Duration) {
        self.history
            .wait_for(&format!("the end of {w}'s output"), 0, limit, |e| {
                e.w == w && e.kind == "exit"
            })
            .await;
    }

    pub fn live_workers(&self) -> Vec<String> {
        let mut v: Vec<String> = self
            .procs
            .iter()
            .filter(|(_, p)| p.killed.is_none())
            .map(|(n, _)| n.clone())
            .collect();
        v.sort();
        v
    }

    /// Asks every live worker to stop, waits for each to shut its manager
    /// down and exit, and asserts that each shutdown succeeded.
    pub async fn stop_all(&mut self, limit: Duration) {
        let live = self.live_workers();
        for w in &live {
            self.tell(w, "stop").await;
        }
        for w in &live {
            let p = self.procs.get_mut(w).unwrap();
            let status = tokio::time::timeout(limit, p.child.wait())
                .await
                .unwrap_or_else(|_| panic!("worker {w} did not stop within {limit:?}"))
                .unwrap();
            assert!(status.success(), "worker {w} exited with {status}");
            self.output_read(w, limit).await;
        }
        let events = self.history.all();
        for w in &live {
            let done = events
                .iter()
                .find(|e| &e.w == w && e.kind == "done")
                .unwrap_or_else(|| panic!("worker {w} printed no `done`"));
            assert_eq!(done.get("shutdown"), "ok", "worker {w}'s manager shutdown");
        }
    }

    /// Kill times of killed workers.
    fn kills(&self) -> HashMap<String, (u64, u64)> {
        self.procs
            .iter()
            .filter_map(|(n, p)| p.killed.map(|k| (n.clone(), k)))
            .collect()
    }

    /// After every manager has shut down: no lock document still holds a
    /// lease of a manager that shut down (each has no `lid`, or `exp <=
    /// $$NOW`, or the owner id of a killed worker: a crashed holder's lease,
    /// or a key the last releases handed to a crashed waiter's registration
    /// in the queue of waiting owners, lives until its `exp`), and, the
    /// collection's TTL index having zero grace, every document is deleted
    /// within a bounded wait. Returns how long the deletion took.
    pub async fn assert_no_lock_left(&self) -> Duration {
        let locks = self.locks();
        let kills = self.kills();
        let crashed: Vec<String> = self
            .history
            .all()
            .iter()
            .filter(|e| e.kind == "ready" && kills.contains_key(&e.w))
            .map(|e| e.get("owner").to_string())
            .collect();
        let live: Vec<Document> = locks
            .find(doc! {
                "lid": { "$exists": true },
                "aid": { "$nin": crashed },
                "$expr": { "$gt": ["$exp", "$$NOW"] },
            })
            .await
            .unwrap()
            .try_collect_vec()
            .await;
        assert!(
            live.is_empty(),
            "lock documents still holding a lease after shutdown: {live:?}"
        );
        let started = tokio::time::Instant::now();
        loop {
            let left = locks.count_documents(doc! {}).await.unwrap();
            if left == 0 {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "{left} lock documents not garbage-collected 20 s after shutdown"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Runs the safety checker over the history and the final counters.
    pub async fn check(&self) -> Report {
        let mut finals = HashMap::new();
        for k in 0..self.params.keys {
            let key = format!("k{k}");
            let d = self
                .counters()
                .find_one(doc! { "_id": &key })
                .await
                .unwrap()
                .unwrap();
            finals.insert(key, (d.get_i64("n").unwrap(), d.get_i64("last").unwrap()));
        }
        check(&self.history.all(), &self.kills(), &finals)
    }
}

trait CollectVec {
    async fn try_collect_vec(self) -> Vec<Document>;
}

impl CollectVec for mongodb::Cursor<Document> {
    async fn try_collect_vec(self) -> Vec<Document> {
        use futures::TryStreamExt;
        self.try_collect().await.unwrap()
    }
}

/// One critical section (one acquisition), as reported or reconstructed.
/// (Every field shows in the checker's failure messages.)
#[derive(Debug, Clone)]
#[allow(dead_code)]
pub struct Cs {
    pub w: String,
    pub key: String,
    pub tok: i64,
    pub t_acq: u64,
    pub t_end: u64,
    /// When the lease's token fired before its release (0 if it did not).
    pub t_lost: u64,
    pub claim: Step,
    pub claim_lost: bool,
    pub n_read: i64,
    pub prev_last: i64,
    pub write: Step,
    pub write_lost: bool,
    pub lost: bool,
    /// The worker was killed while holding it.
    pub crashed: bool,
}

/// What the checker found; the assertions are made inside [`check`].
#[derive(Debug, Default)]
pub struct Report {
    pub sections: usize,
    pub valid: usize,
    pub lost: usize,
    pub crashed: usize,
    pub refused: usize,
    pub unknown: usize,
    pub settled_by_chain: usize,
    pub acquire_errors: usize,
    pub step_errors: usize,
    pub per_key: BTreeMap<String, Vec<Cs>>,
}

impl Report {
    pub fn kept(&self) -> usize {
        self.sections - self.lost - self.crashed
    }

    /// Leases held at some point during one of the fault windows
    /// (`[start, end]` on the monotonic clock): (kept, lost).
    pub fn across(&self, windows: &[(u64, u64)]) -> (usize, usize) {
        let held: Vec<&Cs> = self
            .per_key
            .values()
            .flatten()
            .filter(|c| !c.crashed)
            .filter(|c| windows.iter().any(|(s, e)| c.t_acq <= *e && c.t_end >= *s))
            .collect();
        let lost = held.iter().filter(|c| c.lost).count();
        (held.len() - lost, lost)
    }
    pub fn summary(&self) -> String {
        format!(
            "{} critical sections ({} with both fenced steps applied), leases kept {} / lost {} / \
             crashed {}, refused steps {}, unknown steps {} (settled by the chain: {}), \
             acquire errors {}, retried step errors {}",
            self.sections,
            self.valid,
            self.kept(),
            self.lost,
            self.crashed,
            self.refused,
            self.unknown,
            self.settled_by_chain,
            self.acquire_errors,
            self.step_errors
        )
    }
}

fn collect_sections(events: &[Event], kills: &HashMap<String, (u64, u64)>) -> Vec<Cs> {
    let mut sections = Vec::new();
    let mut done: BTreeSet<(String, i64)> = BTreeSet::new();
    for e in events.iter().filter(|e| e.kind == "cs") {
        done.insert((e.w.clone(), e.num("tok")));
        sections.push(Cs {
            w: e.w.clone(),
            key: e.get("key").to_string(),
            tok: e.num("tok"),
            t_acq: e.num("t_acq") as u64,
            t_end: e.num("t_end") as u64,
            t_lost: e.num("t_lost") as u64,
            claim: Step::parse(e.get("claim")),
            claim_lost: e.get("claim_lost") == "1",
            n_read: e.num("n"),
            prev_last: e.num("last"),
            write: Step::parse(e.get("write")),
            write_lost: e.get("write_lost") == "1",
            lost: e.get("lost") == "1",
            crashed: false,
        });
    }
    // Acquisitions of killed workers that never reported an end.
    for e in events.iter().filter(|e| e.kind == "acq") {
        if done.contains(&(e.w.clone(), e.num("tok"))) {
            continue;
        }
        let (_, dead) = *kills
            .get(&e.w)
            .unwrap_or_else(|| panic!("worker {} acquired {e:?} and never reported the end", e.w));
        let claimed = events
            .iter()
            .find(|c| c.kind == "claimed" && c.w == e.w && c.num("tok") == e.num("tok"));
        sections.push(Cs {
            w: e.w.clone(),
            key: e.get("key").to_string(),
            tok: e.num("tok"),
            t_acq: e.t(),
            t_end: dead,
            t_lost: 0,
            claim: if claimed.is_some() {
                Step::Ok
            } else {
                Step::Unknown
            },
            claim_lost: false,
            n_read: claimed.map(|c| c.num("n")).unwrap_or(0),
            prev_last: claimed.map(|c| c.num("last")).unwrap_or(0),
            write: Step::Unknown,
            write_lost: false,
            lost: false,
            crashed: true,
        });
    }
    sections
}

/// The safety checker. Per key:
///
/// 1. **Mutual exclusion**: the intervals [acquire returned, release called
///    or token fired] of all acquisitions (crashed holders: until they were
///    reaped) do not overlap, and fencing tokens increase in that order.
/// 2. **Lost-lease signal**: every refused fenced step (a higher token was
///    written first) came back to a holder whose token had already fired.
/// 3. **No lost update**: the set of applied writes is known exactly (writes
///    reported applied, plus the `last` token every claim saw and the final
///    `last`, which settles unknown outcomes and crashed holders); every
///    claim saw exactly the applied writes with lower tokens (`n` and
///    `last`), and the final counter equals the number of applied writes.
pub fn check(
    events: &[Event],
    kills: &HashMap<String, (u64, u64)>,
    finals: &HashMap<String, (i64, i64)>,
) -> Report {
    try_check(events, kills, finals).unwrap_or_else(|violation| panic!("{violation}"))
}

/// [`check`], returning the first violation found instead of panicking.
pub fn try_check(
    events: &[Event],
    kills: &HashMap<String, (u64, u64)>,
    finals: &HashMap<String, (i64, i64)>,
) -> Result<Report, String> {
    /// Returns the formatted violation unless `cond` holds.
    macro_rules! ensure {
        ($cond:expr, $($message:tt)+) => {
            if !$cond {
                return Err(format!($($message)+));
            }
        };
    }
    let sections = collect_sections(events, kills);
    let mut report = Report {
        sections: sections.len(),
        acquire_errors: events
            .iter()
            .filter(|e| e.kind == "err" && e.get("op") == "acquire")
            .count(),
        step_errors: events
            .iter()
            .filter(|e| e.kind == "err" && e.get("op") != "acquire")
            .count(),
        ..Report::default()
    };
    for cs in &sections {
        report
            .per_key
            .entry(cs.key.clone())
            .or_default()
            .push(cs.clone());
        report.valid += (cs.claim == Step::Ok && cs.write == Step::Ok) as usize;
        report.lost += cs.lost as usize;
        report.crashed += cs.crashed as usize;
        report.refused +=
            (cs.claim == Step::Refused) as usize + (cs.write == Step::Refused) as usize;
        report.unknown += (cs.claim == Step::Unknown && !cs.crashed) as usize
            + (cs.write == Step::Unknown && !cs.crashed) as usize;
    }
    for (key, list) in &mut report.per_key {
        list.sort_by_key(|c| c.t_acq);
        // 1. Intervals and token order.
        for pair in list.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            ensure!(
                a.t_end <= b.t_acq,
                "MUTUAL EXCLUSION VIOLATED on {key}: {a:?} still held it {} ms after {b:?} acquired it",
                (a.t_end - b.t_acq) as f64 / 1e6
            );
            ensure!(
                a.tok < b.tok,
                "fencing tokens out of order on {key}: {a:?} then {b:?}"
            );
        }
        // 2. Refusals only reach holders that were told.
        for c in list.iter() {
            if c.claim == Step::Refused {
                ensure!(
                    c.claim_lost,
                    "claim refused while the lease was not signalled lost: {c:?}"
                );
            }
            if c.write == Step::Refused {
                ensure!(
                    c.write_lost,
                    "write refused while the lease was not signalled lost: {c:?}"
                );
            }
        }
        // 3. Applied writes, exactly.
        let (final_n, final_last) = finals[key];
        let tokens: BTreeSet<i64> = list.iter().map(|c| c.tok).collect();
        let mut applied: BTreeSet<i64> = list
            .iter()
            .filter(|c| c.write == Step::Ok)
            .map(|c| c.tok)
            .collect();
        let seen: BTreeSet<i64> = list
            .iter()
            .filter(|c| c.claim == Step::Ok)
            .map(|c| c.prev_last)
            .chain([final_last])
            .filter(|t| *t != 0)
            .collect();
        for t in &seen {
            ensure!(
                tokens.contains(t),
                "a write with token {t} applied on {key}, but no worker held that token"
            );
            if applied.insert(*t) {
                report.settled_by_chain += 1;
            }
        }
        for c in list.iter().filter(|c| c.write == Step::Ok) {
            ensure!(c.claim == Step::Ok, "write applied without a claim: {c:?}");
        }
        for c in list.iter().filter(|c| c.claim == Step::Ok) {
            let before: Vec<i64> = applied.range(..c.tok).copied().collect();
            ensure!(
                c.n_read == before.len() as i64,
                "LOST UPDATE on {key}: the claim of {c:?} read n = {} but {} writes had applied before it",
                c.n_read,
                before.len()
            );
            ensure!(
                c.prev_last == before.last().copied().unwrap_or(0),
                "the claim of {c:?} did not see the last applied write on {key} (it saw {}, the last was {:?})",
                c.prev_last,
                before.last()
            );
        }
        ensure!(
            final_n == applied.len() as i64,
            "LOST UPDATE on {key}: counter {final_n}, applied writes {}",
            applied.len()
        );
    }
    Ok(report)
}

pub fn ms(ns: i128) -> f64 {
    ns as f64 / 1e6
}
