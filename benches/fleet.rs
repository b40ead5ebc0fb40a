//! A fleet of idle managers: what holding leases costs an unrelated
//! application's writes, and what one task's uncontended acquire + release
//! costs in commands, side by side in one run, on one `mongod`.
//!
//! ```text
//! cargo bench --bench fleet                     # throwaway 1-member replica set
//! FLEET_WINDOW_MS=10000 cargo bench --bench fleet
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo bench --bench fleet
//! FLEET_PARTS=waiters cargo bench --bench fleet   # some of: idle,uncontended,waiters
//! ```
//!
//! **Idle managers.** An unrelated writer (its own client) updates one
//! document of another database (`updateOne` `$inc`, one at a time, `w: 1`
//! so that the server's work per write, not the journal's commit, bounds
//! its rate) for `FLEET_WINDOW_MS` (default
//! 5 000 ms) with N managers in the process, each with its own client and
//! holding one key that nobody waits for: N = 0, 10, 100 (the default
//! options: no change stream while merely holding), then 100 managers with
//! `watch_held_leases` (a change stream each, open before the window
//! starts: the behaviour before it was an option), then 100 managers
//! campaigning for one key as an election's candidates do (one holds it,
//! 99 wait; each opens a change stream at first, and the window starts
//! once only the next one's is left open), then N = 0 again to show the
//! drift of the run. Printed: the writer's updates/s and the ratio
//! to the mean of the two N = 0 windows.
//!
//! **Uncontended acquire + release.** One task acquires and releases one
//! key `FLEET_CYCLES` times (default 2 000), against two raw forms with the
//! driver (`w: majority`, as mongo-lease writes): `insertOne` +
//! `deleteOne` of a lock document, and the least a lease that keeps its
//! document writes (a `findOneAndUpdate` upsert setting owner, next token
//! and expiry, then an `updateOne` ending the expiry, both on `_id` alone
//! and with no condition), in 20 rounds, the contenders alternating. Two
//! passes, each with its own client and manager, as in
//! `handoff_processes`. The **monitored pass** (a quarter of the cycles)
//! gives the commands per cycle (every command but the driver's handshakes
//! and heartbeats), the time in the driver's round trips and the rest (of
//! which the caller's time from each call to its command's send and from
//! its reply to the call's return: for mongo-lease the hops to the
//! manager's task and back and the manager's work), and its own ratio to
//! the raw kept document; it also captures the manager's light acquire and
//! light release. The **timed pass**, with no command monitoring, gives
//! cycles/s, the CPU time per cycle of this process (the caller, the actor
//! and the driver) and of `mongod`, and the throughput ratios over the pass
//! and round by round (median and range), with a fourth contender: those
//! two commands sent again by the caller with the driver, encoded once
//! ("its commands replayed"), so that mongo-lease / its commands replayed
//! is the manager's share of a cycle and its commands replayed / raw kept
//! document the server's cost of the lease's conditions. Monitoring is not
//! free, nor the same for every contender: the driver copies each command
//! and reply into a `Document` for its events, which delays the lease's
//! pipelines more than the raw forms' one-field updates.
//!
//! **Many waiters.** W = 2, 20, 50, 200 managers contend for one key, each
//! with its own client (managers in this process rather than W processes,
//! which 2 cores could not run side by side), each task holding the key
//! about 1 ms per critical section, so W - 1 wait at any time: beyond the
//! queue's bound (64 registered owners, "Queue of waiting owners" in the
//! lock protocol) the others wait unregistered. After W (at least 20)
//! critical sections of warm-up, `FLEET_HANDOFFS` (default 200) are
//! measured: p50, p90 and mean of release start -> the next holder's
//! acquisition when the next holder is another manager (a stall of the
//! queue shows in the last two, not in the median); commands per handoff (driver
//! command monitoring of every client, the driver's handshakes and
//! heartbeats left out), split into the lock's commands and the change
//! streams' (`aggregate`, `getMore`, `killCursors`); and the `mongod`
//! process's CPU time per handoff (`utime + stime` of `/proc/<pid>/stat`,
//! its pid from `serverStatus`; not shown for a server on another
//! machine). Printed with the ratios to W = 2.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use mongo_lease::{LeaseManager, LeaseManagerOptions, ReleaseOutcome};
use mongodb::bson::{Document, RawDocumentBuf, doc};
use mongodb::event::{EventHandler, command::CommandEvent};
use mongodb::options::{ClientOptions, CollectionOptions, WriteConcern};
use mongodb::{Client, Collection, Database};

#[path = "common/mongod.rs"]
mod mongod;

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .map_or(default, |v| v.parse().expect(name))
}

fn main() {
    let window = Duration::from_millis(env_or("FLEET_WINDOW_MS", 5_000));
    let cycles = env_or("FLEET_CYCLES", 2_000) as usize;
    let handoffs = env_or("FLEET_HANDOFFS", 200) as usize;
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let (_replica_set, uri) = mongod::mongod().await;
        let options = ClientOptions::parse(&uri).await.expect("uri");
        let database = format!("fleet_{}", std::process::id());
        let parts = std::env::var("FLEET_PARTS").unwrap_or_default();
        let part = |name: &str| parts.is_empty() || parts.split(',').any(|p| p.trim() == name);
        if part("idle") {
            idle_managers(&options, &database, window).await;
        }
        if part("uncontended") {
            uncontended(&options, &database, cycles).await;
        }
        if part("waiters") {
            many_waiters(&options, &database, handoffs).await;
        }
        let client = Client::with_options(options).expect("client");
        for name in [database.clone(), format!("{database}_other")] {
            client.database(&name).drop().await.expect("drop");
        }
        client.shutdown().await;
    });
}

/// The unrelated writer's rate alone, with idle managers, and with
/// watching ones.
async fn idle_managers(options: &ClientOptions, database: &str, window: Duration) {
    let writer = Client::with_options(options.clone()).expect("client");
    let items = writer
        .database(&format!("{database}_other"))
        .collection_with_options::<Document>(
            "items",
            CollectionOptions::builder()
                .write_concern(WriteConcern::nodes(1))
                .build(),
        );
    items
        .insert_one(doc! { "_id": 0, "n": 0 })
        .await
        .expect("insert");
    println!(
        "an unrelated writer's single-document updates to another database, {window:?} per \
         window, with N managers each holding one key nobody waits for"
    );
    let alone = rate(&items, window).await;
    println!("  N =   0:                        {alone:>7.0} updates/s");
    let mut rows = Vec::new();
    let mut fleet = Vec::new();
    for n in [10, 100] {
        let more = managers(
            options,
            database,
            fleet.len(),
            n - fleet.len(),
            Role::Holding,
        )
        .await;
        fleet.extend(more);
        rows.push((n, Role::Holding, rate(&items, window).await));
    }
    stop(std::mem::take(&mut fleet)).await;
    for role in [Role::Watching, Role::Campaigning] {
        let fleet = managers(options, database, 0, 100, role).await;
        rows.push((100, role, rate(&items, window).await));
        stop(fleet).await;
    }
    let again = rate(&items, window).await;
    println!("  N =   0 (again):                {again:>7.0} updates/s");
    let base = (alone + again) / 2.0;
    for (n, role, rate) in rows {
        let how = match role {
            Role::Holding => "default",
            Role::Watching => "watch_held_leases",
            Role::Campaigning => "1 holds, 99 wait",
        };
        println!(
            "  N = {n:>3} ({how:>17}):  {rate:>7.0} updates/s, {:.2}x of N = 0",
            rate / base
        );
    }
    writer.shutdown().await;
}

/// The writer's updates per second over `window`.
async fn rate(items: &Collection<Document>, window: Duration) -> f64 {
    // A short warm-up, outside the window.
    for _ in 0..50 {
        update(items).await;
    }
    let start = Instant::now();
    let mut updates = 0u64;
    while start.elapsed() < window {
        update(items).await;
        updates += 1;
    }
    updates as f64 / start.elapsed().as_secs_f64()
}

async fn update(items: &Collection<Document>) {
    items
        .update_one(doc! { "_id": 0 }, doc! { "$inc": { "n": 1 } })
        .await
        .expect("update");
}

/// What the managers of an idle fleet do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Each holds its own key, nobody waiting (default options: no
    /// change stream).
    Holding,
    /// The same with `watch_held_leases` (a change stream each).
    Watching,
    /// The first holds one key and the others wait for it, as the
    /// candidates of an election do: the next one keeps a change stream
    /// open to hear the release, the others poll.
    Campaigning,
}

/// A manager of an idle fleet, its client, its lease if it holds one, and
/// its waiting `acquire` if it waits.
type Member = (
    Client,
    LeaseManager,
    Option<mongo_lease::Lease>,
    Option<tokio::task::JoinHandle<()>>,
);

/// `n` managers, each with its own client, from `first` on, in `role`;
/// returns once the change streams the role opens are open.
async fn managers(
    options: &ClientOptions,
    database: &str,
    first: usize,
    n: usize,
    role: Role,
) -> Vec<Member> {
    let mut fleet = Vec::new();
    // Change streams opened (answered `aggregate`s of a `$changeStream`),
    // and closed (`killCursors`: the managers read no other cursor that
    // outlives its first batch).
    let streams = Arc::new(AtomicU64::new(0));
    let closed = Arc::new(AtomicU64::new(0));
    for i in first..first + n {
        let mut options = options.clone();
        let (opened, killed) = (streams.clone(), closed.clone());
        let opening = std::sync::Mutex::new(Vec::new());
        options.command_event_handler = Some(EventHandler::callback(move |event| match event {
            CommandEvent::Started(started) if started.command_name == "killCursors" => {
                killed.fetch_add(1, Ordering::Relaxed);
            }
            CommandEvent::Started(started)
                if started.command_name == "aggregate"
                    && started
                        .command
                        .get_array("pipeline")
                        .ok()
                        .and_then(|p| p.first())
                        .and_then(|s| s.as_document())
                        .is_some_and(|s| s.contains_key("$changeStream")) =>
            {
                opening.lock().unwrap().push(started.request_id);
            }
            CommandEvent::Succeeded(done) if opening.lock().unwrap().contains(&done.request_id) => {
                opened.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }));
        let client = Client::with_options(options).expect("client");
        let mut manager_options = LeaseManagerOptions::builder()
            .database(client.database(database))
            .collection("fleet.lock")
            .build();
        manager_options.watch_held_leases = role == Role::Watching;
        let manager = LeaseManager::connect(manager_options)
            .await
            .expect("connect");
        let member = match role {
            Role::Campaigning if i > first => {
                let candidate = manager.clone();
                let waiting = tokio::spawn(async move {
                    // Ends with an error when the bench shuts the manager down.
                    let _ = candidate.acquire("leader").await;
                });
                (client, manager, None, Some(waiting))
            }
            Role::Campaigning => {
                let lease = manager.acquire("leader").await.expect("acquire");
                (client, manager, Some(lease), None)
            }
            Role::Holding | Role::Watching => {
                let key = format!("shard-{i}");
                let lease = manager.acquire(key).await.expect("acquire");
                (client, manager, Some(lease), None)
            }
        };
        fleet.push(member);
    }
    // Streams open before the window starts: one per watching manager;
    // holding managers open none; waiting ones registered in the key's
    // queue (the first 64, its bound) each open one at first, and read it
    // only while next in the queue or while the key changes hands, so the
    // heartbeats after their next attempts close all but the head's; those
    // beyond the queue's bound open none.
    let expected = match role {
        Role::Holding => 0,
        Role::Watching => n as u64,
        Role::Campaigning => 1,
    };
    let open = || {
        streams.load(Ordering::Relaxed)
            - closed
                .load(Ordering::Relaxed)
                .min(streams.load(Ordering::Relaxed))
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    while open() != expected
        || (role == Role::Campaigning
            && streams.load(Ordering::Relaxed) < (n as u64 - 1).min(QUEUE_BOUND))
    {
        assert!(
            Instant::now() < deadline,
            "{} change streams open, {expected} expected",
            open()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(open(), expected, "change streams open");
    fleet
}

async fn stop(fleet: Vec<Member>) {
    for (client, manager, lease, waiting) in fleet {
        if let Some(lease) = lease {
            assert_eq!(
                lease.release().await.expect("release"),
                ReleaseOutcome::Released
            );
        }
        manager.shutdown().await.expect("shutdown");
        if let Some(waiting) = waiting {
            waiting.await.expect("the waiting acquire ends");
        }
        client.shutdown().await;
    }
}

/// One contender of the uncontended part: its name, and the commands,
/// time and time in round trips its cycles took, round by round.
struct Contender {
    name: &'static str,
    commands: u64,
    waited: u64,
    rounds: Vec<Duration>,
    /// The caller's time before its commands were sent and after their
    /// replies were read ([`Split`]).
    before_send: Duration,
    after_reply: Duration,
    /// CPU clock ticks of this process and of `mongod` during its rounds
    /// (`None` if `/proc` cannot tell).
    own_ticks: Option<u64>,
    mongod_ticks: Option<u64>,
}

impl Contender {
    fn new(name: &'static str) -> Self {
        Self {
            name,
            commands: 0,
            waited: 0,
            rounds: Vec::new(),
            before_send: Duration::ZERO,
            after_reply: Duration::ZERO,
            own_ticks: Some(0),
            mongod_ticks: Some(0),
        }
    }

    fn time(&self) -> Duration {
        self.rounds.iter().sum()
    }
}

/// Commands per cycle and cycles/s of one task's uncontended acquire +
/// release, against raw insert/delete and against the raw update of a
/// kept document, in two passes as in `handoff_processes`: the **monitored
/// pass** (a quarter of the cycles) gives the commands per cycle, the round
/// trips and the caller's time around them, and captures the manager's two
/// commands; the **timed pass**, with no command monitoring, gives the
/// throughput, its ratios and the CPU per cycle, with those commands
/// replayed as a fourth contender. With a command event handler set, the
/// driver copies every command into a `Document` for its started event and
/// every reply into one for its succeeded event (`mongodb` 3.x,
/// `client/executor.rs`): a cost in proportion to the command's size, which
/// slows the lease's pipelines (2 KB and 0.9 KB) more than the raw forms'
/// one-field updates, and which no application pays that does not monitor
/// its commands.
async fn uncontended(options: &ClientOptions, database: &str, cycles: usize) {
    let monitored_cycles = (cycles / 4).max(ROUNDS);
    let (monitored, monitored_cycles, captured) =
        cycle_pass(options, database, monitored_cycles, true, None).await;
    let replay = captured.expect("the manager's light acquire and light release were captured");
    let (timed, cycles, _) = cycle_pass(options, database, cycles, false, Some(&replay)).await;
    println!(
        "one task's uncontended acquire + release: timed pass {cycles} cycles, monitored pass \
         {monitored_cycles} cycles, each in {ROUNDS} rounds"
    );
    // CPU time per cycle, in microseconds, from clock ticks.
    let tick_us = 1e6 / clock_ticks();
    let per_cycle = |ticks: Option<u64>| {
        ticks.map_or("-".to_string(), |t| {
            format!("{:.0}", t as f64 * tick_us / cycles as f64)
        })
    };
    for (index, timed) in timed.iter().enumerate() {
        print!(
            "  {:<24} {:>6.0} cycles/s (CPU per cycle: this process {} us, mongod {} us)",
            timed.name,
            cycles as f64 / timed.time().as_secs_f64(),
            per_cycle(timed.own_ticks),
            per_cycle(timed.mongod_ticks),
        );
        let Some(monitored) = monitored.get(index) else {
            println!();
            continue;
        };
        let us = |d: Duration| d.as_secs_f64() * 1e6 / monitored_cycles as f64;
        // The driver's round trips (command sent -> reply read) per cycle, and
        // the rest of the cycle: the caller's and the actor's own work.
        let trips = monitored.waited as f64 / 1e3 / monitored_cycles as f64;
        println!(
            "; monitored pass: {:.2} commands per cycle, {:>6.0} cycles/s, {trips:.0} us in \
             round trips + {:.0} us else per cycle, of which {:.0} us before the commands were \
             sent and {:.0} us after their replies",
            monitored.commands as f64 / monitored_cycles as f64,
            monitored_cycles as f64 / monitored.time().as_secs_f64(),
            us(monitored.time()) - trips,
            us(monitored.before_send),
            us(monitored.after_reply),
        );
    }
    // Throughput ratio of `a` to `b`: over the whole pass, and the median
    // and range of the rounds' ratios.
    let ratio = |a: &Contender, b: &Contender| {
        let mut rounds: Vec<f64> = (a.rounds.iter().zip(&b.rounds))
            .map(|(a, b)| b.as_secs_f64() / a.as_secs_f64())
            .collect();
        rounds.sort_by(f64::total_cmp);
        format!(
            "{:.2}x (rounds: median {:.2}x, {:.2}x to {:.2}x)",
            b.time().as_secs_f64() / a.time().as_secs_f64(),
            rounds[rounds.len() / 2],
            rounds[0],
            rounds[rounds.len() - 1],
        )
    };
    let [ours, raw, kept, replayed] = &timed[..] else {
        unreachable!("the timed pass has four contenders")
    };
    println!(
        "  throughput mongo-lease / raw insert/delete: {}",
        ratio(ours, raw)
    );
    println!(
        "  throughput mongo-lease / raw kept document: {}",
        ratio(ours, kept)
    );
    println!(
        "  throughput raw kept document / raw insert/delete: {}",
        ratio(kept, raw)
    );
    println!(
        "  throughput its commands replayed / raw kept document: {}",
        ratio(replayed, kept)
    );
    println!(
        "  throughput mongo-lease / its commands replayed: {}",
        ratio(ours, replayed)
    );
    println!(
        "  monitored pass: throughput mongo-lease / raw kept document: {}",
        ratio(&monitored[0], &monitored[2])
    );
}

/// Rounds of the uncontended part, the contenders alternating round by
/// round so that the machine's drift reaches all alike.
const ROUNDS: usize = 20;

/// The uncontended part's lock collection.
const CYCLE_LOCK: &str = "cycle.lock";

/// One pass of the uncontended part: about `cycles` cycles of each
/// contender, with a client of its own, `monitored` or not, and a manager
/// on it. The contenders: mongo-lease, raw insert/delete, raw kept
/// document, and with `replay` (the manager's light acquire and light
/// release) mongo-lease's own commands sent again by the caller, encoded
/// once, so that the manager's share of a cycle shows. Returns the
/// contenders, the cycles each ran, and the light acquire and light release
/// a monitored pass captured.
async fn cycle_pass(
    options: &ClientOptions,
    database: &str,
    cycles: usize,
    monitored: bool,
    replay: Option<&[RawDocumentBuf; 2]>,
) -> (Vec<Contender>, usize, Option<[RawDocumentBuf; 2]>) {
    let (client, commands, waited, stamps) = counted(options, monitored);
    let manager = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(client.database(database))
            .collection(CYCLE_LOCK)
            .build(),
    )
    .await
    .expect("connect");
    let majority = |name: &str| {
        client
            .database(database)
            .collection_with_options::<Document>(
                name,
                CollectionOptions::builder()
                    .write_concern(WriteConcern::majority())
                    .build(),
            )
    };
    let (raw, kept) = (majority("raw.lock"), majority("kept.lock"));
    let db = client.database(database);
    let (own, mongod) = (std::process::id(), mongod_pid(options).await);
    let ticks = |pid: Option<u32>| pid.and_then(cpu_ticks);
    // Warm-up outside the count.
    let mut warm_up = Split::new(&stamps);
    for _ in 0..50 {
        our_cycle(&manager, &mut warm_up).await;
        raw_cycle(&raw, &mut warm_up).await;
        kept_cycle(&kept, &mut warm_up).await;
        if let Some(replay) = replay {
            replayed_cycle(&db, replay, &mut warm_up).await;
        }
    }
    // Many short rounds, the contenders alternating; ratios are taken round
    // by round.
    let per_round = (cycles / ROUNDS).max(1);
    let mut contenders = vec![
        Contender::new("mongo-lease"),
        Contender::new("raw insert/delete"),
        Contender::new("raw kept document"),
    ];
    if replay.is_some() {
        contenders.push(Contender::new("its commands replayed"));
    }
    for _ in 0..ROUNDS {
        for (index, contender) in contenders.iter_mut().enumerate() {
            let (before, waited_before) = (
                commands.load(Ordering::Relaxed),
                waited.load(Ordering::Relaxed),
            );
            let (own_before, mongod_before) = (ticks(Some(own)), ticks(mongod));
            let mut split = Split::new(&stamps);
            let start = Instant::now();
            for _ in 0..per_round {
                match (index, replay) {
                    (0, _) => our_cycle(&manager, &mut split).await,
                    (1, _) => raw_cycle(&raw, &mut split).await,
                    (2, _) => kept_cycle(&kept, &mut split).await,
                    (_, Some(replay)) => replayed_cycle(&db, replay, &mut split).await,
                    (_, None) => unreachable!("no fourth contender without `replay`"),
                }
            }
            contender.rounds.push(start.elapsed());
            contender.before_send += split.before_send;
            contender.after_reply += split.after_reply;
            let spent = |before: Option<u64>, after: Option<u64>, sum: Option<u64>| {
                Some(sum? + after?.checked_sub(before?)?)
            };
            contender.own_ticks = spent(own_before, ticks(Some(own)), contender.own_ticks);
            contender.mongod_ticks = spent(mongod_before, ticks(mongod), contender.mongod_ticks);
            contender.commands += commands.load(Ordering::Relaxed) - before;
            contender.waited += waited.load(Ordering::Relaxed) - waited_before;
        }
    }
    manager.shutdown().await.expect("shutdown");
    client.shutdown().await;
    (contenders, per_round * ROUNDS, stamps.lock_commands())
}

async fn our_cycle(manager: &LeaseManager, split: &mut Split) {
    let lease = split.time(manager.acquire("k")).await.expect("acquire");
    assert_eq!(
        split.time(lease.release()).await.expect("release"),
        ReleaseOutcome::Released
    );
}

async fn raw_cycle(raw: &Collection<Document>, split: &mut Split) {
    split
        .time(
            raw.insert_one(doc! { "_id": "k", "aid": "raw" })
                .into_future(),
        )
        .await
        .expect("insertOne");
    split
        .time(
            raw.delete_one(doc! { "_id": "k", "aid": "raw" })
                .into_future(),
        )
        .await
        .expect("deleteOne");
}

/// The least a lease that keeps its document (so that its fencing token
/// keeps growing) writes: a `findOneAndUpdate` upsert on `_id` alone that
/// sets the owner, the next token and the expiry by the server's clock,
/// then an `updateOne` on `_id` alone that ends the expiry; no condition
/// at all (not even "free"), so a floor for any such lease.
async fn kept_cycle(kept: &Collection<Document>, split: &mut Split) {
    let acquire = vec![doc! { "$set": {
        "aid": "raw",
        "tok": { "$add": [{ "$ifNull": ["$tok", 0_i64] }, 1_i64] },
        "exp": { "$add": ["$$NOW", 30_000] },
    }}];
    let acquire = kept
        .find_one_and_update(doc! { "_id": "k" }, acquire)
        .upsert(true)
        .return_document(mongodb::options::ReturnDocument::After);
    let acquired = split.time(acquire).await.expect("findOneAndUpdate");
    assert!(acquired.is_some());
    let release = kept.update_one(
        doc! { "_id": "k" },
        vec![doc! { "$set": { "exp": "$$NOW" } }],
    );
    split.time(release).await.expect("updateOne");
}

/// mongo-lease's light acquire and light release as its manager sent them
/// (`commands`), sent again by the caller with the driver: the same bytes,
/// lease id and owner id every cycle, which the light release's removal of
/// the lease id allows. Each must apply: the acquire's reply is this
/// write's acquisition (its `ts` is the write's `$$NOW`), the release
/// modifies the document.
async fn replayed_cycle(db: &Database, commands: &[RawDocumentBuf; 2], split: &mut Split) {
    let [acquire, release] = commands;
    let acquired = split
        .time(db.run_raw_command(acquire.clone()))
        .await
        .expect("the light acquire");
    let value = acquired.get_document("value").expect("a document");
    assert_eq!(
        value.get_datetime("ts"),
        value.get_datetime("now"),
        "the replayed light acquire acquired: {value:?}"
    );
    let released = split
        .time(db.run_raw_command(release.clone()))
        .await
        .expect("the light release");
    assert_eq!(
        released.get_i32("nModified"),
        Ok(1),
        "the replayed light release released"
    );
}

/// A client that, if `monitored`, counts the commands it sends (but the
/// driver's handshakes and heartbeats), the time they waited for their
/// replies, and when the last one was sent and answered ([`Stamps`]);
/// otherwise one with no command monitoring, whose counts stay 0.
fn counted(
    options: &ClientOptions,
    monitored: bool,
) -> (Client, Arc<AtomicU64>, Arc<AtomicU64>, Arc<Stamps>) {
    let (commands, waited) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let stamps = Arc::new(Stamps::default());
    let mut options = options.clone();
    if !monitored {
        let client = Client::with_options(options).expect("client");
        return (client, commands, waited, stamps);
    }
    let (sink, waits, stamped) = (commands.clone(), waited.clone(), stamps.clone());
    let counted = |name: &str| !matches!(name, "hello" | "isMaster" | "ping" | "endSessions");
    options.command_event_handler = Some(EventHandler::callback(move |event| match event {
        CommandEvent::Started(started) if counted(&started.command_name) => {
            sink.fetch_add(1, Ordering::Relaxed);
            stamped.stamp(&stamped.started);
            stamped.capture(&started.command_name, &started.command);
        }
        CommandEvent::Succeeded(done) if counted(&done.command_name) => {
            waits.fetch_add(done.duration.as_nanos() as u64, Ordering::Relaxed);
            stamped.stamp(&stamped.answered);
        }
        _ => {}
    }));
    (
        Client::with_options(options).expect("client"),
        commands,
        waited,
        stamps,
    )
}

/// When the last counted command was sent and when its reply was read
/// (the driver's command events), in nanoseconds after `base`.
/// Also the first `findAndModify` and the first `update` sent to the
/// uncontended part's lock collection: the manager's light acquire and
/// light release.
struct Stamps {
    base: Instant,
    started: AtomicU64,
    answered: AtomicU64,
    lock_commands: Mutex<BTreeMap<String, Document>>,
}

impl Default for Stamps {
    fn default() -> Self {
        Stamps {
            base: Instant::now(),
            started: AtomicU64::new(0),
            answered: AtomicU64::new(0),
            lock_commands: Mutex::default(),
        }
    }
}

impl Stamps {
    /// Keeps `command` if it is the first `name` (`findAndModify` or
    /// `update`) sent to [`CYCLE_LOCK`], without the fields the driver adds
    /// to every command.
    fn capture(&self, name: &str, command: &Document) {
        if !matches!(name, "findAndModify" | "update") || command.get_str(name) != Ok(CYCLE_LOCK) {
            return;
        }
        let mut captured = self.lock_commands.lock().unwrap();
        if !captured.contains_key(name) {
            let mut command = command.clone();
            for added in ["lsid", "$clusterTime", "$db", "txnNumber"] {
                command.remove(added);
            }
            captured.insert(name.to_string(), command);
        }
    }

    /// The manager's light acquire and light release, encoded, once both
    /// were captured.
    fn lock_commands(&self) -> Option<[RawDocumentBuf; 2]> {
        let captured = self.lock_commands.lock().unwrap();
        let encoded = |name: &str| RawDocumentBuf::from_document(captured.get(name)?).ok();
        Some([encoded("findAndModify")?, encoded("update")?])
    }

    fn stamp(&self, at: &AtomicU64) {
        at.store(self.base.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }

    fn at(&self, at: &AtomicU64) -> Instant {
        self.base + Duration::from_nanos(at.load(Ordering::Relaxed))
    }
}

/// The caller's time around its writes' commands, summed: from each call
/// to its command's send, and from its reply to the call's return (the
/// manager's hops and work, or the driver's alone for the raw writes).
struct Split {
    stamps: Arc<Stamps>,
    before_send: Duration,
    after_reply: Duration,
}

impl Split {
    fn new(stamps: &Arc<Stamps>) -> Self {
        Split {
            stamps: stamps.clone(),
            before_send: Duration::ZERO,
            after_reply: Duration::ZERO,
        }
    }

    /// Awaits `call`, which sends one command, and adds its split.
    async fn time<T>(&mut self, call: impl std::future::IntoFuture<Output = T>) -> T {
        let called = Instant::now();
        let output = call.await;
        let returned = Instant::now();
        let (sent, answered) = (
            self.stamps.at(&self.stamps.started),
            self.stamps.at(&self.stamps.answered),
        );
        self.before_send += sent.saturating_duration_since(called);
        self.after_reply += returned.saturating_duration_since(answered);
        output
    }
}

/// The bound on a key's queue of waiting owners ("Bound" in "Queue of
/// waiting owners", `docs/protocol.md`): beyond it a waiter opens no change
/// stream.
const QUEUE_BOUND: u64 = 64;

/// How long a task holds the key per critical section (many waiters).
const HOLD: Duration = Duration::from_millis(1);

/// What one waiter count measured.
struct Waiters {
    p50_ms: f64,
    /// The 90th percentile and the mean of the same gaps: a stall of the
    /// queue shows there, not in the median.
    p90_ms: f64,
    mean_ms: f64,
    lock_commands: f64,
    stream_commands: f64,
    /// `mongod`'s CPU ms per handoff, if its `/proc` entry is readable.
    cpu_ms: Option<f64>,
    handoffs: usize,
}

/// Handoff among 2, 20, 50 and 200 managers contending for one key.
async fn many_waiters(options: &ClientOptions, database: &str, handoffs: usize) {
    let pid = mongod_pid(options).await;
    println!(
        "W managers contending for one key (W - 1 waiting), each with its own client, \
         ~{HOLD:?} per critical section, {handoffs} critical sections measured"
    );
    let mut rows: Vec<(usize, Waiters)> = Vec::new();
    for w in [2, 20, 50, 200] {
        let figures = contend(options, database, w, handoffs, pid).await;
        let cpu = figures
            .cpu_ms
            .map_or("n/a".to_string(), |c| format!("{c:.2} ms"));
        println!(
            "  W = {w:>3}: handoff p50 {:.2} ms, p90 {:.2} ms, mean {:.2} ms ({} handoffs); \
             {:.2} lock + {:.2} stream commands per handoff; mongod CPU {cpu} per handoff",
            figures.p50_ms,
            figures.p90_ms,
            figures.mean_ms,
            figures.handoffs,
            figures.lock_commands,
            figures.stream_commands
        );
        rows.push((w, figures));
    }
    let base = &rows[0].1;
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "n/a".to_string(),
    };
    for (w, f) in &rows[1..] {
        println!(
            "  W = {w:>3} / W = 2: p50 {}, p90 {}, mean {}, commands {} (lock {}, stream {}), \
             mongod CPU {}",
            ratio(Some(f.p50_ms), Some(base.p50_ms)),
            ratio(Some(f.p90_ms), Some(base.p90_ms)),
            ratio(Some(f.mean_ms), Some(base.mean_ms)),
            ratio(
                Some(f.lock_commands + f.stream_commands),
                Some(base.lock_commands + base.stream_commands)
            ),
            ratio(Some(f.lock_commands), Some(base.lock_commands)),
            ratio(Some(f.stream_commands), Some(base.stream_commands)),
            ratio(f.cpu_ms, base.cpu_ms),
        );
    }
}

/// `w` managers, each with its own client and one task that acquires the
/// key, holds it ~[`HOLD`] and releases it, until `max(w, 20)` critical
/// sections of warm-up and `handoffs` measured ones are done.
async fn contend(
    options: &ClientOptions,
    database: &str,
    w: usize,
    handoffs: usize,
    pid: Option<u32>,
) -> Waiters {
    let lock_commands = Arc::new(AtomicU64::new(0));
    let stream_commands = Arc::new(AtomicU64::new(0));
    let mut fleet = Vec::with_capacity(w);
    for _ in 0..w {
        let mut options = options.clone();
        let (lock, stream) = (lock_commands.clone(), stream_commands.clone());
        options.command_event_handler = Some(EventHandler::callback(move |event| {
            if let CommandEvent::Started(started) = event {
                match started.command_name.as_str() {
                    "hello" | "isMaster" | "ping" | "endSessions" => {}
                    "aggregate" | "getMore" | "killCursors" => {
                        stream.fetch_add(1, Ordering::Relaxed);
                    }
                    _ => {
                        lock.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        }));
        let client = Client::with_options(options).expect("client");
        let manager = LeaseManager::connect(
            LeaseManagerOptions::builder()
                .database(client.database(database))
                .collection(format!("waiters_{w}.lock"))
                .build(),
        )
        .await
        .expect("connect");
        fleet.push((client, manager));
    }
    let warm = w.max(20);
    let total = warm + handoffs;
    // (acquired, release start, manager) per critical section, in order
    // (one holder at a time); the counters at the start and end of the
    // measured ones.
    type Mark = (u64, u64, Option<u64>);
    struct Run {
        sections: Vec<(Instant, Instant, usize)>,
        start: Option<Mark>,
        end: Option<Mark>,
    }
    let run = Arc::new(std::sync::Mutex::new(Run {
        sections: Vec::with_capacity(total),
        start: None,
        end: None,
    }));
    let mark = {
        let (lock, stream) = (lock_commands.clone(), stream_commands.clone());
        move || -> Mark {
            (
                lock.load(Ordering::Relaxed),
                stream.load(Ordering::Relaxed),
                pid.and_then(cpu_ticks),
            )
        }
    };
    let mut tasks = Vec::with_capacity(w);
    for (index, (_, manager)) in fleet.iter().enumerate() {
        let (manager, run, mark) = (manager.clone(), run.clone(), mark.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let lease = manager.acquire("hot").await.expect("acquire");
                let acquired = Instant::now();
                let done = run.lock().unwrap().end.is_some();
                if !done {
                    tokio::time::sleep(HOLD).await;
                    let mut run = run.lock().unwrap();
                    run.sections.push((acquired, Instant::now(), index));
                    if run.sections.len() == warm {
                        run.start = Some(mark());
                    } else if run.sections.len() == total {
                        run.end = Some(mark());
                    }
                }
                assert_eq!(
                    lease.release().await.expect("release"),
                    ReleaseOutcome::Released
                );
                if done {
                    return;
                }
            }
        }));
    }
    // Every task gets the key once more after the end (the queue, then the
    // unregistered ones' race), sees it and stops; a bound far beyond that
    // turns a hang into a failure.
    tokio::time::timeout(Duration::from_secs(600), futures::future::join_all(tasks))
        .await
        .expect("the contending tasks finish")
        .into_iter()
        .for_each(|t| t.expect("a contending task"));
    for (client, manager) in fleet {
        manager.shutdown().await.expect("shutdown");
        client.shutdown().await;
    }
    let run = Arc::try_unwrap(run)
        .ok()
        .expect("tasks done")
        .into_inner()
        .unwrap();
    let (start, end) = (run.start.expect("start"), run.end.expect("end"));
    let mut gaps: Vec<f64> = run.sections[warm - 1..total]
        .windows(2)
        .filter(|pair| pair[0].2 != pair[1].2)
        .map(|pair| pair[1].0.duration_since(pair[0].1).as_secs_f64() * 1e3)
        .collect();
    gaps.sort_by(f64::total_cmp);
    let measured = gaps.len();
    let per = |n: u64| n as f64 / handoffs as f64;
    let cpu_ms = match (start.2, end.2) {
        (Some(a), Some(b)) => Some((b - a) as f64 * 1e3 / clock_ticks() / handoffs as f64),
        _ => None,
    };
    Waiters {
        p50_ms: gaps[(measured - 1) / 2],
        p90_ms: gaps[(measured - 1) * 9 / 10],
        mean_ms: gaps.iter().sum::<f64>() / measured as f64,
        lock_commands: per(end.0 - start.0),
        stream_commands: per(end.1 - start.1),
        cpu_ms,
        handoffs: measured,
    }
}

/// The pid of `mongod`, if it runs on this machine (`serverStatus.pid`,
/// with its `/proc` entry readable).
async fn mongod_pid(options: &ClientOptions) -> Option<u32> {
    let client = Client::with_options(options.clone()).expect("client");
    let status = client
        .database("admin")
        .run_command(doc! { "serverStatus": 1 })
        .await
        .expect("serverStatus");
    client.shutdown().await;
    let pid = match status.get("pid") {
        Some(mongodb::bson::Bson::Int64(p)) => u32::try_from(*p).ok(),
        Some(mongodb::bson::Bson::Int32(p)) => u32::try_from(*p).ok(),
        _ => None,
    }?;
    cpu_ticks(pid).map(|_| pid)
}

/// `utime + stime` of process `pid`, in clock ticks (`/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The fields after the command name (which may hold spaces), from
    // field 3 (state) on: utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 if it cannot tell).
fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}
