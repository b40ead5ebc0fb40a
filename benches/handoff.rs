//! Handoff: how fast a contended key goes from one holder to the next.
//!
//! ```text
//! cargo bench --bench handoff                        # throwaway 1-member replica set
//! HANDOFF_SECTIONS=4000 cargo bench --bench handoff
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo bench --bench handoff
//! ```
//!
//! **In one process** (issue 11, point 6): `HANDOFF_TASKS` (8) tasks of one
//! manager contend on one key, each looping acquire → a ~1 ms critical
//! section → release, for `HANDOFF_SECTIONS` (2000) critical sections (after a
//! warm-up). Printed: the handoff time (from the holder's release call to
//! the next holder's `acquire` returning; p50 / p99), critical sections per
//! second, the manager's commands per critical section (all commands its
//! client started in the window, counted by the driver's command monitoring,
//! and the writes among them: `findAndModify`, `update`, `delete`,
//! `insert`), and how often the releasing task got the key back at once
//! (re-acquisition by the releaser; FIFO says never while others wait).
//!
//! In the same run, on the same server, the baselines: one plain
//! `updateOne` with `w: majority` (a round trip of one majority write, on
//! another client; p50 of `HANDOFF_BASELINE` (800) samples), and one
//! majority `findOneAndUpdate` returning the document (the command a
//! handoff sends, without its pipeline), each sent one after another and,
//! apart, each after a pause of one critical section (`SECTION`), as the
//! handoff's write comes after one: a write after the client and the
//! server idled for a millisecond takes longer than one right after
//! another (measured here side by side). The run alternates
//! `HANDOFF_ROUNDS` (10) rounds of baselines, contention and baselines, so
//! that a change in the machine's load weighs on both sides alike, and
//! both clients have the same command monitoring (which costs each command
//! time in the driver). Printed: the ratio handoff p50 / each p50; also
//! the handoff's own write and the raw `findOneAndUpdate`s timed alike, by
//! the driver's command events (start to reply: the write alone, without
//! the driver's work around it nor the manager's), and the time around
//! the handoff's write (the release call to the write's start, the write's
//! reply to the next holder's `acquire` returning), next to a call to
//! another task and back on the same runtime (the two task hops an actor
//! adds, holder → manager → next holder). With
//! `HANDOFF_DURING=1`, also the p50 of updates sent one after another
//! during the contention (a load of their own on the server and the
//! cores, which slows the handoffs measured beside them: off by default).
//! The machine may be loaded: judge by the ratio, not the absolute figures.
//!
//! **Across processes**: the cross-process handoff (the next holder in
//! another process) is measured with processes in its own section below.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongo_lease::{LeaseManager, LeaseManagerOptions};
use mongodb::bson::{Document, doc};
use mongodb::event::{EventHandler, command::CommandEvent};
use mongodb::options::{CollectionOptions, WriteConcern};
use mongodb::{Client, Collection};

#[path = "common/mongod.rs"]
mod mongod;

/// Lease TTL: long enough that no renewal falls in the window.
const TTL: Duration = Duration::from_secs(60);
/// The critical section.
const SECTION: Duration = Duration::from_millis(1);
/// Liveness bound of the whole contention run.
const BOUND: Duration = Duration::from_secs(600);

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// Commands started by one client, by name; the durations of its
/// `findAndModify`s, and when each started and succeeded (request id to
/// start; start and success).
#[derive(Clone, Default)]
struct Commands(
    Arc<Mutex<Vec<String>>>,
    Arc<Mutex<Vec<Duration>>>,
    Arc<Mutex<WriteTimes>>,
);

/// `findAndModify`s started (request id to start), and each one's start
/// and success.
type WriteTimes = (HashMap<i32, Instant>, Vec<(Instant, Instant)>);

impl Commands {
    async fn client(&self, uri: &str) -> Client {
        let mut options = mongodb::options::ClientOptions::parse(uri)
            .await
            .expect("uri");
        let sink = self.clone();
        options.command_event_handler = Some(EventHandler::callback(move |event| match event {
            CommandEvent::Started(started) => {
                if started.command_name == "findAndModify" {
                    let mut writes = sink.2.lock().unwrap();
                    writes.0.insert(started.request_id, Instant::now());
                }
                sink.0.lock().unwrap().push(started.command_name.clone());
            }
            CommandEvent::Succeeded(done) if done.command_name == "findAndModify" => {
                let mut writes = sink.2.lock().unwrap();
                if let Some(at) = writes.0.remove(&done.request_id) {
                    writes.1.push((at, Instant::now()));
                }
                sink.1.lock().unwrap().push(done.duration);
            }
            _ => {}
        }));
        Client::with_options(options).expect("client")
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// How many `findAndModify` durations were recorded so far.
    fn fam_events(&self) -> usize {
        self.1.lock().unwrap().len()
    }

    /// The `findAndModify` durations recorded since the `from`th.
    fn fam_events_since(&self, from: usize) -> Vec<Duration> {
        self.1.lock().unwrap()[from..].to_vec()
    }

    /// The commands from the `from`th to the `to`th: (all, writes).
    fn between(&self, from: usize, to: usize) -> (usize, usize) {
        let log = self.0.lock().unwrap();
        let window = &log[from.min(log.len())..to.min(log.len())];
        let writes = window
            .iter()
            .filter(|n| matches!(n.as_str(), "findAndModify" | "update" | "delete" | "insert"))
            .count();
        (window.len(), writes)
    }
}

impl Commands {
    /// For each `(release called, next holder's acquire returned)` of
    /// `handoffs` (or a raw call and its return), the handoff's write (the
    /// one `findAndModify` that started and succeeded within): (release
    /// call to the write's start, the write's success to the acquire's
    /// return), sorted each.
    fn around_writes(&self, handoffs: &[(Instant, Instant)]) -> (Vec<Duration>, Vec<Duration>) {
        let writes = self.2.lock().unwrap();
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for (released, got) in handoffs {
            let within: Vec<_> = writes
                .1
                .iter()
                .filter(|(start, done)| start >= released && done <= got)
                .collect();
            if let [(start, done)] = within[..] {
                before.push(*start - *released);
                after.push(*got - *done);
            }
        }
        before.sort();
        after.sort();
        (before, after)
    }
}

/// `n` round trips to a task (an unbounded channel there, a oneshot back,
/// as a call to the manager's task makes): what two task hops cost on
/// this runtime and machine.
async fn task_round_trips(n: usize) -> Vec<Duration> {
    type Ping = tokio::sync::oneshot::Sender<()>;
    let (send, mut receive) = tokio::sync::mpsc::unbounded_channel::<Ping>();
    let echo = tokio::spawn(async move {
        while let Some(reply) = receive.recv().await {
            let _ = reply.send(());
        }
    });
    let mut samples = Vec::with_capacity(n);
    for _ in 0..n {
        let started = Instant::now();
        let (reply, back) = tokio::sync::oneshot::channel();
        send.send(reply).expect("echo task");
        back.await.expect("echo");
        samples.push(started.elapsed());
        // Idle between samples, as the manager is between handoffs.
        tokio::time::sleep(Duration::from_micros(500)).await;
    }
    drop(send);
    echo.await.expect("echo task");
    samples.sort();
    samples
}

/// The `q`-quantile of sorted `samples`, in ms.
fn quantile_ms(samples: &[Duration], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let i = ((samples.len() - 1) as f64 * q).round() as usize;
    samples[i].as_secs_f64() * 1e3
}

/// `n` round trips of one plain majority `updateOne` on `coll`, each after
/// `pause` if given (as a handoff's write comes after a critical section).
async fn majority_updates(
    coll: &Collection<Document>,
    n: usize,
    pause: Option<Duration>,
) -> Vec<Duration> {
    let id = if pause.is_some() { "paced" } else { "baseline" };
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let started = Instant::now();
        coll.update_one(doc! { "_id": id }, doc! { "$set": { "n": i as i64 } })
            .upsert(true)
            .await
            .expect("baseline update");
        samples.push(started.elapsed());
    }
    samples
}

/// `n` round trips of one majority `findOneAndUpdate` returning the
/// document (the command a handoff sends, without its pipeline) on `coll`,
/// each after `pause` if given: each one's call and return.
async fn majority_find_and_modify(
    coll: &Collection<Document>,
    n: usize,
    pause: Option<Duration>,
) -> Vec<(Instant, Instant)> {
    let id = if pause.is_some() { "paced-fam" } else { "fam" };
    let mut samples = Vec::with_capacity(n);
    for i in 0..n {
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let started = Instant::now();
        coll.find_one_and_update(doc! { "_id": id }, doc! { "$set": { "n": i as i64 } })
            .upsert(true)
            .return_document(mongodb::options::ReturnDocument::After)
            .await
            .expect("baseline findAndModify");
        samples.push((started, Instant::now()));
    }
    samples
}

/// The raw baselines of one run, each timed by the caller (call to return)
/// and, for the `findAndModify`s, by the driver's command events (start to
/// reply, as the handoff's own write is timed).
#[derive(Default)]
struct Baselines {
    updates: Vec<Duration>,
    paced_updates: Vec<Duration>,
    fams: Vec<Duration>,
    paced_fams: Vec<Duration>,
    fam_events: Vec<Duration>,
    paced_fam_events: Vec<Duration>,
    /// Each `findAndModify`'s call and return.
    fam_calls: Vec<(Instant, Instant)>,
}

impl Baselines {
    /// `n` samples of each, in turn, on `coll` of the client monitored by
    /// `commands`.
    async fn sample(&mut self, coll: &Collection<Document>, commands: &Commands, n: usize) {
        self.updates.extend(majority_updates(coll, n, None).await);
        let mark = commands.fam_events();
        let calls = majority_find_and_modify(coll, n, None).await;
        self.fams.extend(calls.iter().map(|(at, done)| *done - *at));
        self.fam_calls.extend(calls);
        self.fam_events.extend(commands.fam_events_since(mark));
        self.paced_updates
            .extend(majority_updates(coll, n, Some(SECTION)).await);
        let mark = commands.fam_events();
        let calls = majority_find_and_modify(coll, n, Some(SECTION)).await;
        self.paced_fams
            .extend(calls.iter().map(|(at, done)| *done - *at));
        self.fam_calls.extend(calls);
        self.paced_fam_events
            .extend(commands.fam_events_since(mark));
    }

    fn sort(&mut self) {
        for samples in [
            &mut self.updates,
            &mut self.paced_updates,
            &mut self.fams,
            &mut self.paced_fams,
            &mut self.fam_events,
            &mut self.paced_fam_events,
        ] {
            samples.sort();
        }
    }
}

/// What the in-process contention measured (over all its rounds).
#[derive(Default)]
struct Contention {
    handoffs: Vec<Duration>,
    /// Each handoff's release call and the next holder's acquire return.
    spans: Vec<(Instant, Instant)>,
    sections: usize,
    elapsed: Duration,
    commands: usize,
    writes: usize,
    reacquired: usize,
}

impl Contention {
    /// Adds the figures of another round.
    fn absorb(&mut self, round: Contention) {
        self.handoffs.extend(round.handoffs);
        self.handoffs.sort();
        self.spans.extend(round.spans);
        self.sections += round.sections;
        self.elapsed += round.elapsed;
        self.commands += round.commands;
        self.writes += round.writes;
        self.reacquired += round.reacquired;
    }
}

/// `tasks` tasks of `manager` on one key until `warmup + sections` critical
/// sections ran; the figures are of the last `sections`.
async fn contend(
    manager: &LeaseManager,
    commands: &Commands,
    key: &str,
    tasks: usize,
    warmup: usize,
    sections: usize,
) -> Contention {
    let total = warmup + sections;
    let done = Arc::new(AtomicUsize::new(0));
    // When the last holder called release, and which task it was.
    let released: Arc<Mutex<Option<(Instant, usize)>>> = Arc::default();
    let handoffs: Arc<Mutex<Vec<(Instant, Instant)>>> = Arc::default();
    let reacquired = Arc::new(AtomicUsize::new(0));
    let window: Arc<Mutex<Option<(Instant, usize)>>> = Arc::default();
    let finished_at = Arc::new(AtomicU64::new(0));
    let finished_commands = Arc::new(AtomicUsize::new(usize::MAX));
    let origin = Instant::now();
    let mut joins = Vec::new();
    for task in 0..tasks {
        let (manager, key) = (manager.clone(), key.to_string());
        let (done, released, handoffs) = (done.clone(), released.clone(), handoffs.clone());
        let (reacquired, window, commands) = (reacquired.clone(), window.clone(), commands.clone());
        let (finished_at, finished_commands) = (finished_at.clone(), finished_commands.clone());
        joins.push(tokio::spawn(async move {
            loop {
                let lease = manager.acquire(key.as_str()).await.expect("acquire");
                let got = Instant::now();
                let n = done.fetch_add(1, Ordering::SeqCst);
                if n >= total {
                    if n == total {
                        // The last measured section's release is done.
                        finished_commands.store(commands.len(), Ordering::SeqCst);
                    }
                    let _ = lease.release().await.expect("release");
                    return;
                }
                if n == warmup {
                    *window.lock().unwrap() = Some((got, commands.len()));
                }
                if let Some((at, by)) = released.lock().unwrap().take()
                    && n > warmup
                {
                    handoffs.lock().unwrap().push((at, got));
                    if by == task {
                        reacquired.fetch_add(1, Ordering::SeqCst);
                    }
                }
                tokio::time::sleep(SECTION).await;
                if n + 1 == total {
                    finished_at.store(origin.elapsed().as_nanos() as u64, Ordering::SeqCst);
                }
                *released.lock().unwrap() = Some((Instant::now(), task));
                let _ = lease.release().await.expect("release");
            }
        }));
    }
    tokio::time::timeout(BOUND, futures::future::join_all(joins))
        .await
        .expect("the contention run finished within its bound")
        .into_iter()
        .for_each(|r| r.expect("task"));
    let (start, from) = window.lock().unwrap().expect("a measured window");
    let end = origin + Duration::from_nanos(finished_at.load(Ordering::SeqCst));
    let (commands, writes) = commands.between(from, finished_commands.load(Ordering::SeqCst));
    let spans = std::mem::take(&mut *handoffs.lock().unwrap());
    let mut handoffs: Vec<Duration> = spans.iter().map(|(at, got)| *got - *at).collect();
    handoffs.sort();
    Contention {
        handoffs,
        spans,
        sections,
        elapsed: end - start,
        commands,
        writes,
        reacquired: reacquired.load(Ordering::SeqCst),
    }
}

/// The in-process case: one manager, `HANDOFF_TASKS` tasks, one key; the
/// majority-write baseline before and after.
async fn in_process(uri: &str, db_name: &str) {
    let tasks = env_usize("HANDOFF_TASKS", 8);
    let sections = env_usize("HANDOFF_SECTIONS", 2000);
    let baseline_n = env_usize("HANDOFF_BASELINE", 800);
    let rounds = env_usize("HANDOFF_ROUNDS", 10).max(1);
    let commands = Commands::default();
    let client = commands.client(uri).await;
    let manager = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(client.database(db_name))
            .collection("handoff.lock")
            .ttl(TTL)
            .build(),
    )
    .await
    .expect("connect");
    // Monitored as the manager's client is: command monitoring costs each
    // command some time in the driver, on both sides alike.
    let raw_commands = Commands::default();
    let raw_client = raw_commands.client(uri).await;
    let raw: Collection<Document> = raw_client.database(db_name).collection_with_options(
        "baseline",
        CollectionOptions::builder()
            .write_concern(WriteConcern::majority())
            .build(),
    );
    majority_updates(&raw, 20, None).await; // warm-up
    // Rounds of (baselines, contention, baselines), so that a change in
    // the machine's load weighs on both sides alike.
    let per_round = (baseline_n / (2 * rounds)).max(1);
    let mut baselines = Baselines::default();
    let mut run = Contention::default();
    // Also during the contention, if asked: a load of its own on the
    // server and the 2 cores, which slows the handoffs it is compared with.
    let sample_during = std::env::var("HANDOFF_DURING").is_ok_and(|v| v == "1");
    let mut during = Vec::new();
    for _ in 0..rounds {
        baselines.sample(&raw, &raw_commands, per_round).await;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sampler = tokio::spawn({
            let (raw, stop) = (raw.clone(), stop.clone());
            async move {
                let mut samples = Vec::new();
                while sample_during && !stop.load(Ordering::SeqCst) {
                    samples.extend(majority_updates(&raw, 1, None).await);
                }
                samples
            }
        });
        let part = contend(
            &manager,
            &commands,
            "handoff",
            tasks,
            100,
            sections / rounds,
        )
        .await;
        run.absorb(part);
        stop.store(true, Ordering::SeqCst);
        during.extend(sampler.await.expect("baseline task"));
        baselines.sample(&raw, &raw_commands, per_round).await;
    }
    during.sort();
    let during_p50 = quantile_ms(&during, 0.5);
    baselines.sort();
    let Baselines {
        updates: baseline,
        paced_updates: paced,
        fams: fam,
        paced_fams: paced_fam,
        fam_events,
        paced_fam_events,
        fam_calls,
    } = baselines;
    manager.shutdown().await.expect("shutdown");

    let p50 = quantile_ms(&run.handoffs, 0.5);
    let handoff_writes = {
        let mut durations = commands.1.lock().unwrap().clone();
        durations.sort();
        durations
    };
    let base = quantile_ms(&baseline, 0.5);
    println!(
        "in-process handoff: {tasks} tasks, one key, one manager, ~{} ms critical sections, \
         {} measured ({} handoffs)",
        SECTION.as_millis(),
        run.sections,
        run.handoffs.len()
    );
    println!(
        "  handoff (release call -> next holder's acquire returns): p50 {:.2} ms, p99 {:.2} ms",
        p50,
        quantile_ms(&run.handoffs, 0.99)
    );
    println!(
        "  majority updateOne round trip (same run, {} samples): p50 {:.2} ms, p99 {:.2} ms",
        baseline.len(),
        base,
        quantile_ms(&baseline, 0.99)
    );
    let spread = |samples: &[Duration]| {
        [0.1, 0.25, 0.5, 0.75, 0.9]
            .map(|q| format!("{:.2}", quantile_ms(samples, q)))
            .join(" / ")
    };
    println!(
        "    its p10 / p25 / p50 / p75 / p90: {} ms",
        spread(&baseline)
    );
    let paced_base = quantile_ms(&paced, 0.5);
    println!(
        "  the same updateOne, each after a pause of one critical section (same run, {} \
         samples): p50 {:.2} ms",
        paced.len(),
        paced_base
    );
    println!("    its p10 / p25 / p50 / p75 / p90: {} ms", spread(&paced));
    let paced_fam_base = quantile_ms(&paced_fam, 0.5);
    println!(
        "  majority findOneAndUpdate round trip (same run, {} samples each): p50 {:.2} ms one \
         after another, {:.2} ms each after a pause",
        fam.len(),
        quantile_ms(&fam, 0.5),
        paced_fam_base
    );
    println!(
        "  of which the handoff's write (findAndModify, start to reply in the driver's command \
         events, {} samples): p50 {:.2} ms; a findOneAndUpdate timed so: p50 {:.2} ms one after \
         another, {:.2} ms each after a pause",
        handoff_writes.len(),
        quantile_ms(&handoff_writes, 0.5),
        quantile_ms(&fam_events, 0.5),
        quantile_ms(&paced_fam_events, 0.5)
    );
    let (before, after) = commands.around_writes(&run.spans);
    let hops = task_round_trips(baseline_n).await;
    println!(
        "  around it ({} handoffs with one write within): release call -> write's start p50 {:.3} ms, \
         write's reply -> next holder's acquire returns p50 {:.3} ms",
        before.len(),
        quantile_ms(&before, 0.5),
        quantile_ms(&after, 0.5)
    );
    let (raw_before, raw_after) = raw_commands.around_writes(&fam_calls);
    println!(
        "  the driver's work around a raw findOneAndUpdate ({} samples): call -> its start p50 \
         {:.3} ms, its reply -> the call returns p50 {:.3} ms",
        raw_before.len(),
        quantile_ms(&raw_before, 0.5),
        quantile_ms(&raw_after, 0.5)
    );
    println!(
        "  a call to another task and back (channel there, oneshot back, same runtime, {} samples): \
         p50 {:.3} ms",
        hops.len(),
        quantile_ms(&hops, 0.5)
    );
    println!(
        "  ratio handoff p50 / majority write p50: {:.2}x (writes one after another), \
         {:.2}x (each after a pause, as the handoff's write comes); / findOneAndUpdate p50 \
         each after a pause: {:.2}x",
        p50 / base,
        p50 / paced_base,
        p50 / paced_fam_base
    );
    if sample_during {
        println!(
            "  the same updateOne during the contention ({} samples, another client): p50 {:.2} ms, \
             ratio {:.2}x",
            during.len(),
            during_p50,
            p50 / during_p50
        );
    }
    println!(
        "  critical sections/s: {:.0}",
        run.sections as f64 / run.elapsed.as_secs_f64()
    );
    println!(
        "  commands per critical section: {:.2} (writes {:.2})",
        run.commands as f64 / run.sections as f64,
        run.writes as f64 / run.sections as f64
    );
    println!(
        "  re-acquisition by the releaser: {:.1}%",
        100.0 * run.reacquired as f64 / run.handoffs.len().max(1) as f64
    );
    drop(raw);
    for client in [client, raw_client] {
        let _ = tokio::time::timeout(Duration::from_secs(10), client.shutdown()).await;
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let (_replica_set, uri) = mongod::mongod().await;
        let db_name = format!(
            "bench_handoff_{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        );
        in_process(&uri, &db_name).await;
        // Cross-process handoff: processes contending on one key (the
        // next holder in another process) go here.
        let client = Client::with_uri_str(&uri).await.expect("client");
        client
            .database(&db_name)
            .drop()
            .await
            .expect("drop the benchmark database");
        let _ = tokio::time::timeout(Duration::from_secs(10), client.shutdown()).await;
    });
}
