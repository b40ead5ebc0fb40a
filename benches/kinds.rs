//! Each kind of lease next to an exclusive lease, in the same run against
//! the same `mongod`: acquire + release throughput of a semaphore permit, a
//! shared lease and an exclusive lease with `hold_at_least`, and one
//! heartbeat tick's renewal of 1 000 held leases of each kind. Every figure
//! is printed with its ratio to the exclusive baseline of the same run.
//!
//! ```text
//! cargo bench --bench kinds                     # throwaway 1-member replica set
//! KINDS_OPS=500 cargo bench --bench kinds       # acquire + release pairs per measurement
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo bench --bench kinds
//! ```
//!
//! A plain timed loop rather than criterion: the point is the ratio of each
//! primitive to the exclusive lease measured in the same run, so the
//! primitives are measured in interleaved rounds ([`ROUNDS`]) and each
//! figure is the median of its rounds.
//!
//! * **sequential**: one task, `acquire_with` + `release` in a loop. The
//!   exclusive, permit (4 permits) and shared leases reuse one key; an
//!   exclusive lease with `hold_at_least` stays held after its release, so
//!   it takes a new key each time.
//! * **concurrent**: [`TASKS`] tasks of one manager at once. Exclusive
//!   leases: one key per task. Permits: two semaphore keys of 4 permits, 4
//!   tasks each, so every task's permit is free (the holders of a key
//!   overlap). Shared: one key for all tasks. `hold_at_least`: a new key
//!   per acquisition.
//! * **renewal**: [`HELD`] leases of one kind (one key each) held by one
//!   manager; the next heartbeat tick renews them all (one `updateMany`
//!   with the default batch size), timed by command monitoring from its
//!   start to its reply.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use mongo_lease::{AcquireOptions, LeaseKind, LockManager, LockManagerOptions};
use mongodb::Client;
use mongodb::bson::Document;
use mongodb::event::{EventHandler, command::CommandEvent};

#[path = "common/mongod.rs"]
mod mongod;

/// Interleaved rounds of every measurement; each figure is their median.
const ROUNDS: usize = 3;
/// Concurrent tasks of the concurrent measurement.
const TASKS: usize = 8;
/// Permits of the semaphore keys.
const PERMITS: u32 = 4;
/// Leases held at once in the renewal measurement.
const HELD: usize = 1_000;
/// Lease TTL of the throughput manager (its heartbeat is a third of it).
const TTL: Duration = Duration::from_secs(30);
/// Lease TTL of the renewal manager: short, so that its heartbeat (a third)
/// comes soon after the leases are acquired.
const RENEWAL_TTL: Duration = Duration::from_secs(3);
/// Minimum hold of the `hold_at_least` leases: longer than the run.
const HOLD: Duration = Duration::from_secs(3_600);

/// The primitives measured, the exclusive baseline first.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Primitive {
    Exclusive,
    Permit,
    Shared,
    HoldAtLeast,
}

const PRIMITIVES: [Primitive; 4] = [
    Primitive::Exclusive,
    Primitive::Permit,
    Primitive::Shared,
    Primitive::HoldAtLeast,
];

impl Primitive {
    fn name(self) -> &'static str {
        match self {
            Primitive::Exclusive => "exclusive",
            Primitive::Permit => "permit of 4",
            Primitive::Shared => "shared",
            Primitive::HoldAtLeast => "exclusive + hold_at_least",
        }
    }

    fn options(self) -> AcquireOptions {
        match self {
            Primitive::Exclusive => AcquireOptions::default(),
            Primitive::Permit => AcquireOptions::builder()
                .kind(LeaseKind::Permit { permits: PERMITS })
                .build(),
            Primitive::Shared => AcquireOptions::builder().kind(LeaseKind::Shared).build(),
            Primitive::HoldAtLeast => AcquireOptions::builder().hold_at_least(HOLD).build(),
        }
    }

    /// The key of acquisition `i` by task `task` in round `round`.
    fn key(self, round: usize, task: usize, i: usize) -> String {
        match self {
            Primitive::Exclusive => format!("x-{task}"),
            Primitive::Permit => format!("p-{}", task % 2),
            Primitive::Shared => "s".to_string(),
            Primitive::HoldAtLeast => format!("h-{round}-{task}-{i}"),
        }
    }
}

/// Start of each `update` command and, once it succeeded, its span.
#[derive(Clone, Default)]
struct Updates(Arc<Mutex<UpdateLog>>);

#[derive(Default)]
struct UpdateLog {
    started: HashMap<i32, (Instant, usize)>,
    /// `(started, finished, keys)` of each successful `update` command;
    /// `keys` is the length of its filter's `_id: {$in: [...]}` list (0 for
    /// a filter of another form).
    done: Vec<(Instant, Instant, usize)>,
}

/// How many keys an `update` command's first statement names in its
/// filter's `_id: {$in: [...]}`, or 0.
fn keys_named(command: &Document) -> usize {
    let keys = || {
        command
            .get_array("updates")
            .ok()?
            .first()?
            .as_document()?
            .get_document("q")
            .ok()?
            .get_document("_id")
            .ok()?
            .get_array("$in")
            .ok()
            .map(|keys| keys.len())
    };
    keys().unwrap_or(0)
}

fn main() {
    let ops: usize = std::env::var("KINDS_OPS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(run(ops));
}

async fn run(ops: usize) {
    let (_replica_set, uri) = mongod::mongod().await;
    let updates = Updates::default();
    let mut client_options = mongodb::options::ClientOptions::parse(&uri)
        .await
        .expect("uri");
    let sink = updates.clone();
    client_options.command_event_handler = Some(EventHandler::callback(move |event| {
        let now = Instant::now();
        let mut log = sink.0.lock().unwrap();
        match event {
            CommandEvent::Started(started) if started.command_name == "update" => {
                let keys = keys_named(&started.command);
                log.started.insert(started.request_id, (now, keys));
            }
            CommandEvent::Succeeded(done) => {
                if let Some((at, keys)) = log.started.remove(&done.request_id) {
                    log.done.push((at, now, keys));
                }
            }
            CommandEvent::Failed(failed) => {
                log.started.remove(&failed.request_id);
            }
            _ => {}
        }
    }));
    let client = Client::with_options(client_options).expect("client");
    let db = client.database(&format!(
        "bench_kinds_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    let manager = |collection: &str, ttl: Duration| {
        LockManager::connect(
            LockManagerOptions::builder()
                .database(db.clone())
                .collection(collection)
                .ttl(ttl)
                .build(),
        )
    };
    let throughput = manager("kinds.lock", TTL).await.expect("connect");

    // Warm-up: every primitive once, so that connections and documents exist.
    for primitive in PRIMITIVES {
        sequential(&throughput, primitive, usize::MAX, 10).await;
    }
    let mut seq: HashMap<Primitive, Vec<f64>> = HashMap::new();
    let mut conc: HashMap<Primitive, Vec<f64>> = HashMap::new();
    for round in 0..ROUNDS {
        for primitive in PRIMITIVES {
            let rate = sequential(&throughput, primitive, round, ops).await;
            seq.entry(primitive).or_default().push(rate);
            let rate = concurrent(&throughput, primitive, round, ops).await;
            conc.entry(primitive).or_default().push(rate);
        }
    }
    throughput.shutdown().await.expect("shutdown");

    let renewing = manager("kinds_renewal.lock", RENEWAL_TTL)
        .await
        .expect("connect");
    let mut renewal: HashMap<Primitive, Vec<f64>> = HashMap::new();
    let mut shape: HashMap<Primitive, (usize, usize)> = HashMap::new();
    for round in 0..ROUNDS {
        for primitive in PRIMITIVES {
            let tick = renewal_tick(&renewing, &updates, primitive, round).await;
            renewal.entry(primitive).or_default().push(tick.ms);
            shape.insert(primitive, (tick.commands, tick.keys));
        }
    }
    renewing.shutdown().await.expect("shutdown");

    db.drop().await.expect("drop the benchmark database");
    drop(db);
    if tokio::time::timeout(Duration::from_secs(10), client.shutdown())
        .await
        .is_err()
    {
        eprintln!("the client's shutdown took over 10 s");
    }

    println!(
        "kinds: medians of {ROUNDS} interleaved rounds, {ops} acquire + release pairs per \
         measurement; ratio = figure / exclusive figure of this run"
    );
    print_rates(
        "sequential (1 task), acquire + release pairs/s",
        &median_of(&seq),
    );
    print_rates(
        &format!("concurrent ({TASKS} tasks), acquire + release pairs/s"),
        &median_of(&conc),
    );
    let renewal = median_of(&renewal);
    println!("renewal of {HELD} held leases in one heartbeat tick (ms; ratio of time)");
    let base = renewal[&Primitive::Exclusive];
    for primitive in PRIMITIVES {
        let ms = renewal[&primitive];
        let (commands, keys) = shape[&primitive];
        println!(
            "  {:<26} {:>8.1} ms   x{:.2}   ({commands} update naming {keys} keys)",
            primitive.name(),
            ms,
            ms / base
        );
    }
}

/// Acquire + release pairs per second of one task.
async fn sequential(manager: &LockManager, primitive: Primitive, round: usize, ops: usize) -> f64 {
    let options = primitive.options();
    let started = Instant::now();
    for i in 0..ops {
        let lease = manager
            .acquire_with(primitive.key(round, 0, i), &options)
            .await
            .unwrap_or_else(|e| panic!("acquire a {} lease: {e}", primitive.name()));
        let outcome = lease.release().await.expect("release");
        assert!(!outcome.was_lost(), "a {} lease was lost", primitive.name());
    }
    ops as f64 / started.elapsed().as_secs_f64()
}

/// Acquire + release pairs per second of [`TASKS`] tasks sharing `ops`.
async fn concurrent(manager: &LockManager, primitive: Primitive, round: usize, ops: usize) -> f64 {
    let per_task = ops.div_ceil(TASKS);
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let manager = manager.clone();
            let options = primitive.options();
            tokio::spawn(async move {
                for i in 0..per_task {
                    let lease = manager
                        .acquire_with(primitive.key(round, task, i), &options)
                        .await
                        .unwrap_or_else(|e| panic!("acquire a {} lease: {e}", primitive.name()));
                    let outcome = lease.release().await.expect("release");
                    assert!(!outcome.was_lost(), "a {} lease was lost", primitive.name());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.expect("task");
    }
    (per_task * TASKS) as f64 / started.elapsed().as_secs_f64()
}

/// One heartbeat tick's renewal of [`HELD`] leases of `primitive` (one key
/// each): milliseconds from the start of its first `update` to the reply of
/// its last, its `update` commands, and the keys they named.
#[derive(Clone, Copy)]
struct Tick {
    ms: f64,
    commands: usize,
    keys: usize,
}

async fn renewal_tick(
    manager: &LockManager,
    updates: &Updates,
    primitive: Primitive,
    round: usize,
) -> Tick {
    let options = primitive.options();
    let leases = futures::stream::iter(0..HELD)
        .map(|i| {
            let manager = manager.clone();
            let options = options.clone();
            async move {
                manager
                    .acquire_with(format!("r-{round}-{}-{i:04}", primitive.name()), &options)
                    .await
            }
        })
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_or_else(|e| panic!("acquire {HELD} {} leases: {e}", primitive.name()));
    // Only renewals send `update` commands while the leases are held: the
    // first one started from now on opens the next tick, whose commands all
    // start within a few milliseconds of each other.
    let after = Instant::now();
    let tick = loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        let log = updates.0.lock().unwrap();
        let Some(first) = log
            .done
            .iter()
            .map(|(at, _, _)| *at)
            .filter(|at| *at >= after)
            .min()
        else {
            continue;
        };
        if log.started.values().any(|(at, _)| *at >= after) {
            continue;
        }
        let of_tick: Vec<_> = log
            .done
            .iter()
            .filter(|(at, _, _)| *at >= first && *at < first + RENEWAL_TTL / 6)
            .collect();
        let last = of_tick.iter().map(|(_, end, _)| *end).max().unwrap();
        break Tick {
            ms: (last - first).as_secs_f64() * 1e3,
            commands: of_tick.len(),
            keys: of_tick.iter().map(|(_, _, keys)| keys).sum(),
        };
    };
    assert!(leases.iter().all(|l| !l.is_lost()), "no lease lost");
    manager.release_all().await.expect("release_all");
    drop(leases);
    tick
}

fn median_of(samples: &HashMap<Primitive, Vec<f64>>) -> HashMap<Primitive, f64> {
    samples
        .iter()
        .map(|(primitive, values)| {
            let mut values = values.clone();
            values.sort_by(f64::total_cmp);
            (*primitive, values[values.len() / 2])
        })
        .collect()
}

fn print_rates(title: &str, rates: &HashMap<Primitive, f64>) {
    println!("{title}");
    let base = rates[&Primitive::Exclusive];
    for primitive in PRIMITIVES {
        let rate = rates[&primitive];
        println!(
            "  {:<26} {:>8.0} /s   x{:.2}",
            primitive.name(),
            rate,
            rate / base
        );
    }
}
