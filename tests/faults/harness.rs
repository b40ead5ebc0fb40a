//! The controller side: worker processes and their event history (judged
//! by `checker.rs`).

use std::collections::{BTreeMap, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongo_lease::testkit::monotonic_ns;
use mongo_lease::{LeaseManager, LeaseManagerOptions};
use mongodb::bson::{Document, doc};
use mongodb::{Client, Collection};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::Notify;

use crate::checker::{Report, check};
use crate::worker::{self, Config};

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

    /// The acquisition time (`CLOCK_MONOTONIC` ns) of the oldest lease a
    /// worker holds now: an `acq` event with no `releasing` event of the
    /// same worker, task and token after it.
    pub fn oldest_held(&self) -> Option<u64> {
        let events = self.events.lock().unwrap();
        let mut held: HashMap<(&str, &str, &str), u64> = HashMap::new();
        for e in events.iter() {
            // The exclusive workers' events (`worker::task_loop`); the kinds
            // scenario's name no task.
            if !e.fields.contains_key("task") {
                continue;
            }
            let at = (e.w.as_str(), e.get("task"), e.get("tok"));
            match e.kind.as_str() {
                "acq" => {
                    held.insert(at, e.get("t").parse().unwrap());
                }
                "releasing" => {
                    held.remove(&at);
                }
                _ => {}
            }
        }
        held.into_values().min()
    }

    /// Waits (bounded) until a worker has held a lease for `age` or more
    /// and still holds it ([`History::oldest_held`]).
    pub async fn wait_held_for(&self, age: Duration, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            // Until the next event, or until the oldest lease held is old
            // enough, if it is still held then.
            let until = match self.oldest_held() {
                Some(t) => {
                    let held = Duration::from_nanos(monotonic_ns().saturating_sub(t));
                    if held >= age {
                        return;
                    }
                    deadline.min(tokio::time::Instant::now() + (age - held))
                }
                None => deadline,
            };
            let woken = tokio::time::timeout_at(until, notified).await.is_ok();
            if !woken && tokio::time::Instant::now() >= deadline {
                panic!(
                    "timed out after {limit:?} waiting for a lease held {age:?}; meanwhile {}",
                    self.summary(0)
                );
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
    /// Every kind of lease (`kinds.rs`) instead of exclusive leases only.
    pub mixed: bool,
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
    /// The keys with a counter in [`COUNTERS`].
    counter_keys: Vec<String>,
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
        let setup = LeaseManager::connect(
            LeaseManagerOptions::builder()
                .database(client.database(&db))
                .collection(LOCKS)
                .gc_grace(Duration::ZERO)
                .build(),
        )
        .await
        .unwrap();
        setup.shutdown().await.unwrap();
        let counters = worker::counters_collection(&client, &db, COUNTERS);
        let counter_keys = if params.mixed {
            crate::kinds::counter_keys()
        } else {
            (0..params.keys).map(|k| format!("k{k}")).collect()
        };
        for key in &counter_keys {
            counters
                .insert_one(doc! { "_id": key, "n": 0_i64, "fence": 0_i64, "last": 0_i64 })
                .await
                .unwrap();
        }
        Fleet {
            params,
            counter_keys,
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
            mixed: self.params.mixed,
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
    pub fn kills(&self) -> HashMap<String, (u64, u64)> {
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
        let live = self.leases_left().await;
        assert!(
            live.is_empty(),
            "lock documents still holding a lease after shutdown: {live:?}"
        );
        self.wait_collected().await
    }

    /// The lock documents that still hold a lease of a worker that was not
    /// killed (see [`assert_no_lock_left`](Self::assert_no_lock_left)).
    pub async fn leases_left(&self) -> Vec<Document> {
        let kills = self.kills();
        let crashed: Vec<String> = self
            .history
            .all()
            .iter()
            .filter(|e| e.kind == "ready" && kills.contains_key(&e.w))
            .map(|e| e.get("owner").to_string())
            .collect();
        self.locks()
            .find(doc! {
                "lid": { "$exists": true },
                "aid": { "$nin": crashed },
                "$expr": { "$gt": ["$exp", "$$NOW"] },
            })
            .await
            .unwrap()
            .try_collect_vec()
            .await
    }

    /// Waits (bounded) until the TTL index deleted every lock document;
    /// returns how long that took.
    pub async fn wait_collected(&self) -> Duration {
        let locks = self.locks();
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
        check(&self.history.all(), &self.kills(), &self.finals().await)
    }

    /// The final `(n, last)` of every counter, and of every document of the
    /// in-document leases (`(0, 0)` if never created).
    pub async fn finals(&self) -> HashMap<String, (i64, i64)> {
        let mut finals = HashMap::new();
        for key in &self.counter_keys {
            let d = self
                .counters()
                .find_one(doc! { "_id": key })
                .await
                .unwrap()
                .unwrap();
            finals.insert(
                key.clone(),
                (d.get_i64("n").unwrap(), d.get_i64("last").unwrap()),
            );
        }
        if self.params.mixed {
            let items = worker::counters_collection(&self.client, &self.db, crate::kinds::ITEMS);
            for key in crate::kinds::DOCUMENT_KEYS {
                let d = items.find_one(doc! { "_id": key }).await.unwrap();
                let field = |f: &str| d.as_ref().and_then(|d| d.get_i64(f).ok()).unwrap_or(0);
                finals.insert(key.to_string(), (field("n"), field("last")));
            }
        }
        finals
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
