//! Cross-process handoff: 2 and 4 worker processes contend for one key,
//! each holding it for about 1 ms per critical section; mongo-lease (the
//! queue of waiting owners, "Queue of waiting owners" in the lock protocol)
//! against raw 1-ms polling with the `mongodb` driver, in the same run, on
//! the same `mongod`.
//!
//! ```text
//! cargo bench --bench handoff_processes                  # throwaway 1-member replica set
//! HANDOFF_ROUNDS=400 cargo bench --bench handoff_processes
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo bench --bench handoff_processes
//! ```
//!
//! The bench re-executes itself as the workers (`HANDOFF_WORKER` set), one
//! client and one manager per process. Each worker records, per critical
//! section, when it got the key and when it started releasing it, with
//! `testkit::monotonic_ns` (`CLOCK_MONOTONIC`, one clock for every process
//! of the machine).
//!
//! Each contender runs twice. The **timed pass**, with no command
//! monitoring, gives the handoff's p50 / p99 and the ratios. The
//! **monitored pass** gives what needs the driver's command monitoring:
//! the commands sent for the lock, and the parts of a handoff. Monitoring
//! is not free, nor the same for every contender: with a command event
//! handler set, the driver copies every command into a `Document` for the
//! started event before it sends it, and every reply into one before it
//! returns it (`mongodb` 3.x, `client/executor.rs`), so it delays a large
//! command (the lease's pipelines) more than a one-field update.
//!
//! Printed per mode and process count: p50 / p99 of release start → the
//! next holder's acquisition when the next holder is another process, the
//! share of critical sections that went to the process that had just
//! released, and the ratios mongo-lease / raw (timed pass); commands per
//! critical section (every command but the change stream's
//! `aggregate`/`getMore`/`killCursors` and the driver's own handshakes and
//! heartbeats), the monitored pass's own p50, and the parts of a handoff's
//! median (p50 of each, from the release's start): the release's write sent and answered
//! (the first `update` or `findAndModify` the releasing process's driver
//! sent after the release's start), and the release answered to its
//! caller; for mongo-lease also the first change event the next holder's
//! driver received after it (a `getMore` with a non-empty batch), and the
//! grant.
//!
//! Raw polling: `findOneAndUpdate({_id, owner: null}, {$set: {owner}},
//! upsert)` (E11000 while held: another holder), retried every 1 ms;
//! release `updateOne({_id, owner}, {$set: {owner: null}})`; both with
//! `w: majority`, as mongo-lease writes.
//!
//! The floor of a handoff by change events, also in the same run: the
//! workers hand the key round a ring with the driver alone, each release
//! one `updateOne({_id, owner}, {$set: {owner: next}})` (`w: majority`)
//! that makes the next process the holder, which counts as acquired when
//! its change stream (open before the start, matching that update) brings
//! the event. One majority write and the event's delivery, no queue, no
//! checks: what no lease manager handing a key over by a write and a
//! change stream can beat on this server. Printed with the ratios
//! mongo-lease / floor and floor / raw.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use mongo_lease::testkit::monotonic_ns;
use mongo_lease::{LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::Client;
use mongodb::bson::{Document, doc};
use mongodb::event::{EventHandler, command::CommandEvent};
use mongodb::options::{ClientOptions, WriteConcern};

#[path = "common/mongod.rs"]
mod mongod;

/// The contended key.
const KEY: &str = "hot";
/// How long a worker holds the key per critical section.
const HOLD: Duration = Duration::from_millis(1);
/// Lease TTL of the managers.
const TTL: Duration = Duration::from_secs(30);

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

fn main() {
    // `cargo bench` passes `--bench`; a filter argument is ignored.
    if let Some(mode) = env("HANDOFF_WORKER") {
        worker(&mode);
        return;
    }
    let rounds: usize = env("HANDOFF_ROUNDS").map_or(200, |r| r.parse().expect("HANDOFF_ROUNDS"));
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    let (_replica_set, uri) = runtime.block_on(mongod::mongod());
    println!(
        "cross-process handoff, {rounds} critical sections of ~{HOLD:?} per process \
         (p50 / p99 of release start -> next holder's acquisition, other process only)"
    );
    for processes in [2, 4] {
        let [ours, raw, floor] =
            ["lease", "raw", "floor"].map(|m| run(&uri, m, processes, rounds, false));
        let [ours_parts, raw_parts, floor_parts] =
            ["lease", "raw", "floor"].map(|m| run(&uri, m, processes, rounds, true));
        ours.print("mongo-lease", processes, &ours_parts);
        raw.print("raw 1-ms polling", processes, &raw_parts);
        floor.print("floor (ring)", processes, &floor_parts);
        println!(
            "  ratio mongo-lease / raw: p50 {:.2}x, p99 {:.2}x, commands {:.2}x",
            ours.p50 / raw.p50,
            ours.p99 / raw.p99,
            ours_parts.commands / raw_parts.commands
        );
        println!(
            "  ratio mongo-lease / floor: p50 {:.2}x, p99 {:.2}x; floor / raw: p50 {:.2}x, p99 {:.2}x",
            ours.p50 / floor.p50,
            ours.p99 / floor.p99,
            floor.p50 / raw.p50,
            floor.p99 / raw.p99,
        );
    }
}

/// What one run measured.
struct Figures {
    p50: f64,
    p99: f64,
    commands: f64,
    same_process: f64,
    handoffs: usize,
    /// p50 (ms from the release's start) of the release's write sent and
    /// answered (in the driver), the release answered (to the caller),
    /// and with change events, the next holder's first one and its grant.
    write: [f64; 2],
    answered: f64,
    parts: Option<[f64; 2]>,
    /// Per command name: how many, and the driver's p50 round trip in ms.
    durations: Vec<(String, usize, f64)>,
}

impl Figures {
    /// Prints this timed pass, with what the monitored pass `parts` of
    /// the same contender measured.
    fn print(&self, name: &str, processes: usize, parts: &Figures) {
        println!(
            "{processes} processes, {name:>16}: handoff p50 {:.2} ms, p99 {:.2} ms ({} handoffs), \
             release answered at {:.2} ms; {:.2} commands per critical section; {:.0}% \
             re-acquired by the releaser",
            self.p50,
            self.p99,
            self.handoffs,
            self.answered,
            parts.commands,
            self.same_process * 100.0
        );
        let ([sent, written], answered) = (parts.write, parts.answered);
        let next = match parts.parts {
            Some([event, granted]) => {
                format!(", next holder's change event {event:.2}, granted {granted:.2}")
            }
            None => String::new(),
        };
        println!(
            "  monitored pass: handoff p50 {:.2} ms; parts of a handoff (p50, ms after the \
             release's start): release's write sent {sent:.2}, answered {written:.2}, release \
             answered {answered:.2}{next}",
            parts.p50
        );
        let each: Vec<String> = (parts.durations.iter())
            .map(|(name, n, p50)| format!("{name} {n}x p50 {p50:.2} ms"))
            .collect();
        println!("  commands (driver round trips): {}", each.join(", "));
    }
}

/// Runs `processes` workers of `mode` on a fresh collection, started
/// together, their clients `monitored` or not; collects their critical
/// sections.
fn run(uri: &str, mode: &str, processes: usize, rounds: usize, monitored: bool) -> Figures {
    let pass = if monitored { "monitored" } else { "timed" };
    let collection = format!("handoff_{mode}_{processes}_{pass}_{}", std::process::id());
    let exe = std::env::current_exe().expect("current_exe");
    let mut children: Vec<Child> = (0..processes)
        .map(|index| {
            Command::new(&exe)
                .env("HANDOFF_WORKER", mode)
                .env("HANDOFF_URI", uri)
                .env("HANDOFF_COLLECTION", &collection)
                .env("HANDOFF_ROUNDS", rounds.to_string())
                .env("HANDOFF_INDEX", index.to_string())
                .env("HANDOFF_PROCESSES", processes.to_string())
                .env("HANDOFF_MONITOR", if monitored { "on" } else { "off" })
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a worker")
        })
        .collect();
    let mut outputs: Vec<_> = children
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().expect("stdout")).lines())
        .collect();
    for out in &mut outputs {
        let line = out.next().expect("a worker line").expect("read");
        assert_eq!(line, "READY", "worker said {line:?}");
    }
    for child in &mut children {
        writeln!(child.stdin.as_mut().expect("stdin"), "GO").expect("start a worker");
    }
    // (acquired ns, release start ns, process index, release answered ns)
    let mut sections: Vec<(u64, u64, usize, u64)> = Vec::new();
    let mut events: Vec<Vec<u64>> = vec![Vec::new(); processes];
    // Per process: (sent, answered) of each write, in the order sent.
    let mut writes: Vec<Vec<(u64, u64)>> = vec![Vec::new(); processes];
    let mut durations: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    let mut commands = 0u64;
    for (index, out) in outputs.into_iter().enumerate() {
        for line in out {
            let line = line.expect("read");
            let parts: Vec<&str> = line.split_whitespace().collect();
            match parts.as_slice() {
                ["CS", acquired, released, answered] => sections.push((
                    acquired.parse().unwrap(),
                    released.parse().unwrap(),
                    index,
                    answered.parse().unwrap(),
                )),
                ["EVENT", at] => events[index].push(at.parse().unwrap()),
                ["WRITE", sent, answered] => {
                    writes[index].push((sent.parse().unwrap(), answered.parse().unwrap()));
                }
                ["DURATION", d] => {
                    let (name, us) = d.split_once(':').unwrap();
                    let us: f64 = us.parse().unwrap();
                    durations
                        .entry(name.to_string())
                        .or_default()
                        .push(us / 1e3);
                }
                ["COMMANDS", n] => commands += n.parse::<u64>().unwrap(),
                _ => panic!("worker {index}: {line:?}"),
            }
        }
    }
    for mut child in children {
        assert!(child.wait().expect("wait").success(), "a worker failed");
    }
    for each in &mut writes {
        each.sort_unstable();
    }
    sections.sort_unstable();
    let mut handoffs: Vec<f64> = Vec::new();
    let mut parts: [Vec<f64>; 5] = Default::default();
    let mut same = 0;
    let ms = |ns: u64| ns as f64 / 1e6;
    for pair in sections.windows(2) {
        let ((_, released, from, answered), (acquired, _, to, _)) = (pair[0], pair[1]);
        assert!(acquired >= released, "two holders at once");
        if from == to {
            same += 1;
            continue;
        }
        handoffs.push(ms(acquired - released));
        parts[0].push(ms(answered.saturating_sub(released)));
        // The releasing process's first write sent after the release's start.
        if let Some((sent, written)) = writes[from].iter().find(|(sent, _)| *sent >= released) {
            parts[3].push(ms(sent - released));
            parts[4].push(ms(written.saturating_sub(released)));
        }
        let event = events[to]
            .iter()
            .find(|&&at| at >= released && at <= acquired);
        if let Some(event) = event {
            parts[1].push(ms(event - released));
            parts[2].push(ms(acquired - released));
        }
    }
    let median = |mut values: Vec<f64>| {
        values.sort_by(f64::total_cmp);
        values.get(values.len() / 2).copied().unwrap_or(f64::NAN)
    };
    let [answered, event, granted, sent, written] = parts;
    let durations = durations
        .into_iter()
        .map(|(name, values)| (name, values.len(), median(values)))
        .collect();
    let parts = (!event.is_empty()).then(|| [median(event), median(granted)]);
    handoffs.sort_by(f64::total_cmp);
    let at = |q: f64| handoffs[((handoffs.len() - 1) as f64 * q).round() as usize];
    Figures {
        durations,
        write: [median(sent), median(written)],
        answered: median(answered),
        parts,
        p50: at(0.5),
        p99: at(0.99),
        commands: commands as f64 / sections.len() as f64,
        same_process: same as f64 / (sections.len() - 1) as f64,
        handoffs: handoffs.len(),
    }
}

/// A worker process: connects, says READY, waits for GO, runs its critical
/// sections, prints them and its command count.
fn worker(mode: &str) {
    let var = |name: &str| env(name).unwrap_or_else(|| panic!("{name}"));
    let (uri, collection) = (var("HANDOFF_URI"), var("HANDOFF_COLLECTION"));
    let rounds: usize = var("HANDOFF_ROUNDS").parse().unwrap();
    let index = var("HANDOFF_INDEX");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async move {
        let commands = Arc::new(AtomicU64::new(0));
        let events = Arc::new(Mutex::new(Vec::new()));
        let durations = Arc::new(Mutex::new(Vec::new()));
        let writes = Arc::new(Mutex::new(Vec::new()));
        let monitored = var("HANDOFF_MONITOR") == "on";
        let client = monitored_client(
            &uri,
            monitored,
            commands.clone(),
            events.clone(),
            durations.clone(),
            writes.clone(),
        )
        .await;
        let db = client.database("handoff_bench");
        let mut sections = Vec::with_capacity(rounds);
        let go = || {
            println!("READY");
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).expect("GO");
        };
        if mode == "lease" {
            let manager = LeaseManager::connect(
                LeaseManagerOptions::builder()
                    .database(db)
                    .collection(collection)
                    .ttl(TTL)
                    .build(),
            )
            .await
            .expect("connect");
            go();
            commands.store(0, Ordering::SeqCst);
            for _ in 0..rounds {
                let lease = manager.acquire(KEY).await.expect("acquire");
                let acquired = monotonic_ns();
                tokio::time::sleep(HOLD).await;
                let released = monotonic_ns();
                assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
                sections.push((acquired, released, monotonic_ns()));
            }
            let sent = commands.load(Ordering::SeqCst);
            manager.shutdown().await.expect("shutdown");
            report(
                &sections,
                sent,
                &events.lock().unwrap(),
                &durations.lock().unwrap(),
                &writes.lock().unwrap(),
            );
        } else if mode == "floor" {
            let coll = db.collection::<Document>(&collection);
            let processes: usize = var("HANDOFF_PROCESSES").parse().unwrap();
            let me: usize = index.parse().unwrap();
            let (owner, next) = (
                format!("floor-{me}"),
                format!("floor-{}", (me + 1) % processes),
            );
            let mut stream = coll
                .watch()
                .pipeline([doc! { "$match": {
                    "documentKey._id": KEY,
                    "updateDescription.updatedFields.owner": &owner,
                }}])
                .await
                .expect("watch");
            go();
            commands.store(0, Ordering::SeqCst);
            for round in 0..rounds {
                if me == 0 && round == 0 {
                    coll.insert_one(doc! { "_id": KEY, "owner": &owner })
                        .await
                        .expect("insert");
                } else {
                    stream.next().await.expect("an event").expect("watch");
                }
                let acquired = monotonic_ns();
                tokio::time::sleep(HOLD).await;
                let released = monotonic_ns();
                let handed = coll
                    .update_one(
                        doc! { "_id": KEY, "owner": &owner },
                        doc! { "$set": { "owner": &next } },
                    )
                    .await
                    .expect("hand over");
                assert_eq!(handed.modified_count, 1, "the ring lost the key");
                sections.push((acquired, released, monotonic_ns()));
            }
            let sent = commands.load(Ordering::SeqCst);
            let (durations, writes) = (durations.lock().unwrap(), writes.lock().unwrap());
            report(
                &sections,
                sent,
                &events.lock().unwrap(),
                &durations,
                &writes,
            );
        } else {
            let coll = db.collection::<Document>(&collection);
            let owner = format!("raw-{index}");
            go();
            commands.store(0, Ordering::SeqCst);
            for _ in 0..rounds {
                loop {
                    let taken = coll
                        .find_one_and_update(
                            doc! { "_id": KEY, "owner": null },
                            doc! { "$set": { "owner": &owner } },
                        )
                        .upsert(true)
                        .await;
                    match taken {
                        Ok(Some(_)) | Ok(None) => break,
                        // E11000: the upsert found the key held.
                        Err(_) => tokio::time::sleep(Duration::from_millis(1)).await,
                    }
                }
                let acquired = monotonic_ns();
                tokio::time::sleep(HOLD).await;
                let released = monotonic_ns();
                coll.update_one(
                    doc! { "_id": KEY, "owner": &owner },
                    doc! { "$set": { "owner": null } },
                )
                .await
                .expect("release");
                sections.push((acquired, released, monotonic_ns()));
            }
            let sent = commands.load(Ordering::SeqCst);
            let (durations, writes) = (durations.lock().unwrap(), writes.lock().unwrap());
            report(&sections, sent, &[], &durations, &writes);
        }
        client.shutdown().await;
    });
}

fn report(
    sections: &[(u64, u64, u64)],
    commands: u64,
    events: &[u64],
    durations: &[String],
    writes: &[(u64, u64)],
) {
    let mut out = std::io::stdout().lock();
    for (sent, answered) in writes {
        writeln!(out, "WRITE {sent} {answered}").unwrap();
    }
    for (acquired, released, answered) in sections {
        writeln!(out, "CS {acquired} {released} {answered}").unwrap();
    }
    for at in events {
        writeln!(out, "EVENT {at}").unwrap();
    }
    for d in durations {
        writeln!(out, "DURATION {d}").unwrap();
    }
    writeln!(out, "COMMANDS {commands}").unwrap();
}

/// A client with `w: majority` whose command monitor counts the lock's
/// commands (not the change stream's, nor the driver's handshakes), notes
/// when a `getMore` brought change events, each command's round trip, and
/// when each write (`update`, `findAndModify`) was sent and answered.
async fn monitored_client(
    uri: &str,
    monitored: bool,
    commands: Arc<AtomicU64>,
    events: Arc<Mutex<Vec<u64>>>,
    durations: Arc<Mutex<Vec<String>>>,
    writes: Arc<Mutex<Vec<(u64, u64)>>>,
) -> Client {
    let sent: Mutex<std::collections::HashMap<i32, u64>> = Mutex::default();
    let mut options = ClientOptions::parse(uri).await.expect("uri");
    options.write_concern = Some(WriteConcern::majority());
    if !monitored {
        return Client::with_options(options).expect("client");
    }
    options.command_event_handler = Some(EventHandler::callback(move |event| {
        let now = monotonic_ns();
        match &event {
            CommandEvent::Started(s)
                if matches!(s.command_name.as_str(), "update" | "findAndModify") =>
            {
                sent.lock().unwrap().insert(s.request_id, now);
            }
            CommandEvent::Succeeded(mongodb::event::command::CommandSucceededEvent {
                request_id,
                ..
            })
            | CommandEvent::Failed(mongodb::event::command::CommandFailedEvent {
                request_id,
                ..
            }) => {
                if let Some(at) = sent.lock().unwrap().remove(request_id) {
                    writes.lock().unwrap().push((at, now));
                }
            }
            _ => {}
        }
        if let CommandEvent::Succeeded(done) = &event {
            let cursor = done.reply.get_document("cursor");
            let batch = cursor.and_then(|c| c.get_array("nextBatch"));
            if done.command_name == "getMore" && batch.is_ok_and(|b| !b.is_empty()) {
                events.lock().unwrap().push(monotonic_ns());
            }
            let name = format!("{}:{}", done.command_name, done.duration.as_micros());
            durations.lock().unwrap().push(name);
        }
        if let CommandEvent::Started(started) = event {
            let lock_command = !matches!(
                started.command_name.as_str(),
                "aggregate"
                    | "getMore"
                    | "killCursors"
                    | "hello"
                    | "isMaster"
                    | "ping"
                    | "endSessions"
                    | "listIndexes"
                    | "createIndexes"
                    | "listCollections"
                    | "create"
            );
            if lock_command {
                commands.fetch_add(1, Ordering::SeqCst);
            }
        }
    }));
    Client::with_options(options).expect("client")
}
