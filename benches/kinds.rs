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
//! * **sequential**: one task, `acquire` + `release` in a loop. The
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
//!   start to its reply. Then [`HELD`] permits of one semaphore key of
//!   [`HELD`] permits: one document holding them all, renewed by one
//!   `updateMany`, followed by one read that tells which of them it renewed
//!   (`matchedCount` counts documents, not holders).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use mongo_lease::{Lease, LeaseKind, LeaseManager, LeaseManagerOptions, Semaphore};
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

    fn take(self) -> Take {
        let (kind, hold_at_least) = match self {
            Primitive::Exclusive => (LeaseKind::Exclusive, None),
            Primitive::Permit => (LeaseKind::Permit { permits: PERMITS }, None),
            Primitive::Shared => (LeaseKind::Shared, None),
            Primitive::HoldAtLeast => (LeaseKind::Exclusive, Some(HOLD)),
        };
        Take {
            kind,
            hold_at_least,
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

/// Start of each `update` and `find` command (a renewal, and the read
/// that follows one when a batch holds several leases of one key) and,
/// once it succeeded, its span.
#[derive(Clone, Default)]
struct Updates(Arc<Mutex<UpdateLog>>);

#[derive(Default)]
struct UpdateLog {
    started: HashMap<i32, (Instant, usize)>,
    /// `(started, finished, keys)` of each successful `update` or `find`
    /// command; `keys` is the length of an `update`'s filter's `_id: {$in:
    /// [...]}` list (0 for a `find`, or a filter of another form).
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
            CommandEvent::Started(started)
                if started.command_name == "update" || started.command_name == "find" =>
            {
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
        LeaseManager::connect(
            LeaseManagerOptions::builder()
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
    // Each primitive on HELD keys, then HELD permits of one semaphore key.
    let one_key = Take {
        kind: LeaseKind::Permit {
            permits: HELD as u32,
        },
        hold_at_least: None,
    };
    let mut renewal: HashMap<Primitive, Vec<f64>> = HashMap::new();
    let mut shape: HashMap<Primitive, (usize, usize)> = HashMap::new();
    let mut one_key_ms = Vec::new();
    let mut one_key_shape = (0, 0);
    for round in 0..ROUNDS {
        for primitive in PRIMITIVES {
            let name = primitive.name();
            let key = |i: usize| format!("r-{round}-{name}-{i:04}");
            let tick = renewal_tick(&renewing, &updates, primitive.take(), key).await;
            renewal.entry(primitive).or_default().push(tick.ms);
            shape.insert(primitive, (tick.commands, tick.keys));
        }
        let tick = renewal_tick(&renewing, &updates, one_key, |_| format!("r1-{round}")).await;
        one_key_ms.push(tick.ms);
        one_key_shape = (tick.commands, tick.keys);
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
    one_key_ms.sort_by(f64::total_cmp);
    println!("renewal of {HELD} held leases in one heartbeat tick (ms; ratio of time)");
    let base = renewal[&Primitive::Exclusive];
    for primitive in PRIMITIVES {
        let ms = renewal[&primitive];
        let (commands, keys) = shape[&primitive];
        println!(
            "  {:<26} {:>8.1} ms   x{:.2}   ({commands} commands naming {keys} keys)",
            primitive.name(),
            ms,
            ms / base
        );
    }
    let ms = one_key_ms[one_key_ms.len() / 2];
    let (commands, keys) = one_key_shape;
    println!(
        "  {:<26} {:>8.1} ms   x{:.2}   ({commands} commands naming {keys} keys)",
        format!("{HELD} permits of one key"),
        ms,
        ms / base
    );
}

/// How long one acquisition may wait before the benchmark gives up (every
/// acquisition here finds its key free or soon free: a hang is a bug).
const STUCK: Duration = Duration::from_secs(60);

/// How a measurement takes its leases: their kind (a permit of a semaphore
/// of that many permits, on the lease's key), and a minimum hold.
#[derive(Clone, Copy, Debug)]
struct Take {
    kind: LeaseKind,
    hold_at_least: Option<Duration>,
}

impl Take {
    /// A lease on `key`, or none within [`STUCK`].
    async fn lease(
        self,
        manager: &LeaseManager,
        key: String,
    ) -> mongo_lease::Result<Option<Lease>> {
        let acquired = match self.kind {
            LeaseKind::Permit { permits } => {
                let semaphore = Semaphore::new(manager, key, permits)?;
                tokio::time::timeout(STUCK, semaphore.acquire()).await
            }
            LeaseKind::Shared => tokio::time::timeout(STUCK, manager.acquire(key).shared()).await,
            _ => {
                let mut request = manager.acquire(key);
                if let Some(at_least) = self.hold_at_least {
                    request = request.hold_at_least(at_least);
                }
                tokio::time::timeout(STUCK, request).await
            }
        };
        acquired.ok().transpose()
    }
}

/// A lease of `primitive` on `key`.
async fn acquire(manager: &LeaseManager, key: String, primitive: Primitive) -> Lease {
    primitive
        .take()
        .lease(manager, key.clone())
        .await
        .unwrap_or_else(|e| panic!("acquire a {} lease: {e}", primitive.name()))
        .unwrap_or_else(|| panic!("no {} lease on {key} within {STUCK:?}", primitive.name()))
}

/// Acquire + release pairs per second of one task.
async fn sequential(manager: &LeaseManager, primitive: Primitive, round: usize, ops: usize) -> f64 {
    let started = Instant::now();
    for i in 0..ops {
        // Task number TASKS: keys of their own, apart from the concurrent tasks'.
        let lease = acquire(manager, primitive.key(round, TASKS, i), primitive).await;
        let outcome = lease.release().await.expect("release");
        assert!(!outcome.was_lost(), "a {} lease was lost", primitive.name());
    }
    ops as f64 / started.elapsed().as_secs_f64()
}

/// Acquire + release pairs per second of [`TASKS`] tasks sharing `ops`.
async fn concurrent(manager: &LeaseManager, primitive: Primitive, round: usize, ops: usize) -> f64 {
    let per_task = ops.div_ceil(TASKS);
    let started = Instant::now();
    let tasks: Vec<_> = (0..TASKS)
        .map(|task| {
            let manager = manager.clone();
            tokio::spawn(async move {
                for i in 0..per_task {
                    let key = primitive.key(round, task, i);
                    let lease = acquire(&manager, key, primitive).await;
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

/// One heartbeat tick's renewal of [`HELD`] leases: milliseconds from the
/// start of its first command to the reply of its last, its commands
/// (`update`, and the `find` after one that renewed several leases of one
/// key), and the keys its `update`s named.
#[derive(Clone, Copy)]
struct Tick {
    ms: f64,
    commands: usize,
    keys: usize,
}

/// Acquires [`HELD`] leases as `take` says (lease `i` on `key(i)`), times
/// the next heartbeat tick's renewal of them all, and releases them.
async fn renewal_tick(
    manager: &LeaseManager,
    updates: &Updates,
    take: Take,
    key: impl Fn(usize) -> String,
) -> Tick {
    let leases: Vec<_> = futures::stream::iter(0..HELD)
        .map(|i| take.lease(manager, key(i)))
        .buffer_unordered(64)
        .try_collect::<Vec<_>>()
        .await
        .unwrap_or_else(|e| panic!("acquire {HELD} leases ({:?}): {e}", take.kind))
        .into_iter()
        .map(|lease| {
            lease.unwrap_or_else(|| panic!("a {:?} lease not acquired within {STUCK:?}", take.kind))
        })
        .collect();
    // Only renewals send `update` and `find` commands while the leases are
    // held. The tick measured is the first `update` started from now on
    // that names every lease (a tick in flight now renews only some: the
    // leases acquired before it started), with the `find` that may follow
    // its reply.
    let after = Instant::now();
    let tick = loop {
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A lost lease is never renewed again, so no `update` would ever
        // name every lease: fail, naming the loss, instead of waiting.
        let lost = leases.iter().filter(|l| l.status().is_lost()).count();
        assert!(
            lost == 0,
            "{lost} of {HELD} {:?} leases lost before a renewal named them all",
            take.kind
        );
        let log = updates.0.lock().unwrap();
        let Some(&(first, end, keys)) = log
            .done
            .iter()
            .filter(|(at, _, keys)| *at >= after && *keys >= HELD)
            .min_by_key(|(at, _, _)| *at)
        else {
            continue;
        };
        // Wait for a follow-up read, which starts after the update's reply.
        let follow_up = Duration::from_millis(200);
        if end.elapsed() < follow_up {
            continue;
        }
        let reads: Vec<_> = log
            .done
            .iter()
            .filter(|(at, _, _)| *at >= end && *at < end + follow_up)
            .collect();
        let last = reads.iter().map(|(_, end, _)| *end).max().unwrap_or(end);
        break Tick {
            ms: (last - first).as_secs_f64() * 1e3,
            commands: 1 + reads.len(),
            keys,
        };
    };
    assert!(
        leases.iter().all(|l| !l.status().is_lost()),
        "no lease lost"
    );
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
