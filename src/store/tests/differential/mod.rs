//! A differential test of the in-memory twin (`MemoryStore`) against a real
//! `mongod` (`MongoStore`): for a seed, a random sequence of the store's
//! operations is applied step by step to both, and after each step **the
//! answers**, **what the streams of writes announced** and **the
//! documents** are compared.
//!
//! - **Operations** (`ops`, one drawing function per kind): every verb of
//!   the `Store` trait with its wire forms (the general acquire of each
//!   kind, with a minimum hold, a payload, waiting or not, and retried
//!   under the same lease id; the light acquire alone and grouped;
//!   renewals of batches with various TTLs; the general, light and grouped
//!   light releases, the release of a lease too young to delete, release by owner,
//!   force release, delete mode's follow-up; the handoff to a local
//!   waiter and the queue's grant; payloads; the number of permits;
//!   requests to release and their reads; leaving the queues; `inspect` and
//!   `list`; `watch_releases`, read after every step), by three owners on
//!   four keys, some in delete mode, some with a lock-delay; other
//!   applications' commands by their exact protocols (patterns 1, 2, 3 and
//!   a bare `{_id}`: `tests/common/others.rs`, the seeds), on the twin by
//!   `MemoryDb`'s equivalents; a TTL pass (on the mongod, what each TTL
//!   index of the collection, as `listIndexes` defines it, would delete
//!   now: the server's own monitor is off; on the twin,
//!   `MemoryDb::delete_expired`); and time passing past the short TTLs'
//!   expiries. Not covered: `observe`, in-document leases, and the
//!   outcomes only faults give (`Unconfirmed`, re-reads).
//! - **Documents** (`norm`, `compare::documents`): the twin's rendered in
//!   `MongoStore`'s field layout against a `find` of the collection, field
//!   by field; **answers** (`compare::replies`): outcomes, leases lost,
//!   reads, announcements, in one normal form. Server times are compared as
//!   readings of the step that wrote them ("step j's `$$NOW` + a known
//!   duration", each side by its own clock), fencing tokens by equality
//!   and order across the seed, lease ids and owner ids exactly
//!   (`compare`).
//! - **Time** (`deadlines`). TTLs are either long (45 s or more: never
//!   reached in a seed) or short (250 ms to 400 ms, and the yield window,
//!   the lock-delay, a minimum hold, the registration window): before each
//!   step the runner waits until no deadline of the twin's documents (an
//!   `exp`, `yu`, `hl`, `nb`, `re`, a foreign lock's expiry, a token's age
//!   for delete mode, ...) that the step may read is near, so that the
//!   real clock cannot make the two sides disagree; a step that crossed
//!   one anyway (a stalled machine) makes its unknown divergences
//!   inconclusive, not failures.
//! - **The server** (`world::Server`): a one-member replica set of the test
//!   kit's `mongod` started for the run, whatever `MONGODB_URI` says, with
//!   its TTL monitor off, so that only the TTL pass steps delete by TTL.
//! - **Divergences** found today are listed once, in `known::KNOWN`, each
//!   with its reason; anything else fails the test, with a report of the
//!   seed, the step, the operation, both answers and both documents.
//!
//! The short run is part of the suite (`short_run`: two seeds of 30
//! steps). The long run is by command, with a summary (seeds, steps,
//! divergences by kind, what the steps met):
//!
//! ```text
//! DIFFERENTIAL_SEEDS=500 cargo test --features sim,testkit --lib \
//!     store::tests::differential::long_run -- --ignored --nocapture
//! ```
//!
//! (`DIFFERENTIAL_FIRST_SEED`, default 1000, and `DIFFERENTIAL_STEPS`,
//! default 60, too). One seed, step by step, with the report of every
//! divergence met: `DIFFERENTIAL_SEED=<seed>` with either test (and
//! `--nocapture`). A seed draws the same operations again as long as the
//! twin's states it reads (which leases are held, who is registered) come
//! out the same, which the real clock may change now and then.

mod compare;
mod deadlines;
mod known;
mod norm;
mod ops;
mod streams;
mod world;

use std::collections::BTreeMap;
use std::time::Duration;

use compare::{Ctx, Divergence, Tokens};
use deadlines::Deadlines;
use ops::{Gen, Op};
use world::{Server, World};

/// Seeds of the short run.
const SHORT_SEEDS: std::ops::Range<u64> = 1..3;
/// Steps per seed of the short run.
const SHORT_STEPS: usize = 30;

#[tokio::test]
async fn short_run() {
    let summary = match single_seed() {
        Some(seed) => run(seed..seed + 1, steps(), true).await,
        None => run(SHORT_SEEDS, SHORT_STEPS, false).await,
    };
    summary.check();
}

#[tokio::test]
#[ignore = "the long run: DIFFERENTIAL_SEEDS=500 ... -- --ignored"]
async fn long_run() {
    let summary = match single_seed() {
        Some(seed) => run(seed..seed + 1, steps(), true).await,
        None => {
            let first = env("DIFFERENTIAL_FIRST_SEED").unwrap_or(1000);
            let seeds = env("DIFFERENTIAL_SEEDS").unwrap_or(200);
            run(first..first + seeds, steps(), false).await
        }
    };
    summary.print_coverage();
    summary.check();
}

fn env(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn single_seed() -> Option<u64> {
    env("DIFFERENTIAL_SEED")
}

fn steps() -> usize {
    env("DIFFERENTIAL_STEPS").map_or(60, |n| n as usize)
}

// ----- the run ----------------------------------------------------------------

/// A divergence as reported: where, and both sides of the step.
struct Report {
    seed: u64,
    step: usize,
    op: String,
    divergences: Vec<Divergence>,
    answers: (String, String),
    documents: (String, String),
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "seed {} step {}: {}", self.seed, self.step, self.op)?;
        for d in &self.divergences {
            let key = d
                .key
                .as_ref()
                .map(|k| format!("{k:?} "))
                .unwrap_or_default();
            writeln!(f, "  {key}{}: twin {} / mongod {}", d.path, d.twin, d.mongo)?;
            if !d.note.is_empty() {
                writeln!(f, "    ({})", d.note)?;
            }
        }
        writeln!(f, "  answers: twin {}", self.answers.0)?;
        writeln!(f, "           mongod {}", self.answers.1)?;
        writeln!(f, "  documents: twin {}", self.documents.0)?;
        write!(f, "             mongod {}", self.documents.1)
    }
}

/// What a run found.
#[derive(Default)]
struct Summary {
    seeds: u64,
    steps: u64,
    /// Known divergences met, by name: in how many seeds, and the first
    /// seed and step.
    known: BTreeMap<&'static str, (u64, (u64, usize))>,
    /// Divergences in steps that crossed a deadline.
    inconclusive: Vec<Report>,
    /// Divergences not in the table.
    unknown: Vec<Report>,
    elapsed: Duration,
    /// Time spent waiting for deadlines to pass, and in sleep steps.
    waited: Duration,
    slept: Duration,
    /// The steps' lengths (ms; neither sleeps nor releases by owner): the
    /// sum and the longest.
    lengths: (i64, i64),
    /// What the steps met: each kind of operation with each kind of twin
    /// answer, and each field of the twin's documents after a step.
    coverage: BTreeMap<String, u64>,
}

impl Summary {
    /// Prints what the steps met.
    fn print_coverage(&self) {
        eprintln!("coverage (steps):");
        for (what, n) in &self.coverage {
            eprintln!("  {n:>6}  {what}");
        }
    }

    fn check(self) {
        eprintln!(
            "differential: {} seeds, {} steps in {:.1?} ({:.1?} waiting for deadlines, {:.1?} in \
             sleep steps); divergences: {} known (seeds x kinds), {} unknown, {} inconclusive",
            self.seeds,
            self.steps,
            self.elapsed,
            self.waited,
            self.slept,
            self.known.values().map(|(n, _)| n).sum::<u64>(),
            self.unknown.len(),
            self.inconclusive.len(),
        );
        let (total, longest) = self.lengths;
        eprintln!(
            "  steps took {:.1} ms on average, {longest} ms at most",
            total as f64 / self.steps.max(1) as f64
        );
        for (name, (n, (seed, step))) in &self.known {
            eprintln!("  known, met in {n} seeds (first: seed {seed} step {step}): {name}");
        }
        for report in &self.inconclusive {
            eprintln!("inconclusive (a deadline fell in the step): {report}");
        }
        for report in &self.unknown {
            eprintln!("UNKNOWN DIVERGENCE: {report}");
        }
        assert!(
            self.unknown.is_empty(),
            "{} unknown divergences between the twin and mongod (see above)",
            self.unknown.len()
        );
    }
}

/// Runs `seeds`, `steps` each, on one dedicated `mongod`.
async fn run(seeds: std::ops::Range<u64>, steps: usize, verbose: bool) -> Summary {
    let started = std::time::Instant::now();
    let server = Server::start().await;
    let mut summary = Summary::default();
    for seed in seeds {
        run_seed(&server, seed, steps, verbose, &mut summary).await;
        summary.seeds += 1;
    }
    summary.elapsed = started.elapsed();
    summary
}

/// The durations (ms) a server time of a seed may be a step's `$$NOW`
/// plus: every one the seed writes.
fn offsets() -> Vec<i64> {
    let ms = |d: Duration| d.as_millis() as i64;
    let mut out = vec![0, ms(world::YIELD), ms(world::registration_window())];
    for ttl in world::TTLS {
        out.extend([ms(ttl), ms(ttl) / 2]);
    }
    out.extend(world::HOLDS.map(ms));
    out.extend(world::LOCK_DELAYS.map(ms));
    out.extend(world::P2_TTLS.map(|s| i64::from(s) * 1000 + 1));
    out.extend(world::P3_LIFETIMES.map(ms));
    let (age, after) = (ms(world::P1_AGE), ms(world::TS_EXPIRE_AFTER));
    out.extend([-age, after - age, after]);
    out.sort();
    out.dedup();
    out
}

/// One seed: its steps, until the last or the first divergence that is
/// not known to leave both states alike.
async fn run_seed(server: &Server, seed: u64, steps: usize, verbose: bool, summary: &mut Summary) {
    let mut world = World::new(server, seed).await;
    if verbose {
        eprintln!("seed {seed}: {:?}", world.config);
    }
    let mut streams = streams::Streams::open(&world).await;
    let mut draws = Gen::new(seed);
    let mut tokens = Tokens::default();
    let mut deadlines = Deadlines::default();
    let offsets = offsets();
    let mut failed = false;
    let mut met = std::collections::BTreeSet::new();
    for step in 0..steps {
        let op = draws.draw(&world, deadlines.next(world.twin_now()));
        let cares = |class| op.cares(class, |i| world.owners[i].delete_mode);
        if !matches!(op, Op::Sleep(_)) {
            let wait = deadlines.wait(world.twin_now(), op.budget(), cares);
            if wait > 0 {
                let wait = Duration::from_millis(wait as u64);
                tokio::time::sleep(wait).await;
                summary.waited += wait;
            }
        }
        if let Op::Sleep(d) = op {
            summary.slept += d;
        }
        let (twin_from, mongo_from) = (world.twin_now(), world.mongo_now().await);
        let answers = ops::apply(&world, &op).await;
        let (twin_to, mongo_to) = (world.twin_now(), world.mongo_now().await);
        world.clocks.twin.push((twin_from, twin_to));
        world.clocks.mongo.push((mongo_from, mongo_to));
        summary.steps += 1;
        if !matches!(op, Op::Sleep(_) | Op::ReleaseOwner { .. }) {
            let length = twin_to - twin_from;
            summary.lengths = (summary.lengths.0 + length, summary.lengths.1.max(length));
        }
        draws.learn(&op, &answers.twin);
        let answered = format!("{}: {}", op.kind(), norm::class(&answers.twin));
        *summary.coverage.entry(answered).or_default() += 1;
        let crossed = !matches!(op, Op::Sleep(_)) && deadlines.crossed(twin_from, twin_to, cares);
        let (twin_announced, mongo_announced) = streams.step(&world, op.writes()).await;
        let (twin_docs, mongo_docs) = (norm::twin_documents(&world), world.mongo_documents().await);
        for field in twin_docs.values().flat_map(norm::fields) {
            *summary
                .coverage
                .entry(format!("document with {field}"))
                .or_default() += 1;
        }
        let mut ctx = Ctx {
            clocks: &world.clocks,
            offsets: &offsets,
            step,
            tokens: &mut tokens,
        };
        let mut found = compare::replies(&mut ctx, "reply", &answers.twin, &answers.mongo);
        found.extend(compare::replies(
            &mut ctx,
            "announced",
            &twin_announced,
            &mongo_announced,
        ));
        found.extend(compare::documents(&mut ctx, &twin_docs, &mongo_docs));
        if verbose {
            eprintln!(
                "step {step}: {op:?}\n  twin {}\n  mongod {}",
                answers.twin_raw, answers.mongo_raw
            );
        }
        deadlines.update(&world, (twin_to - twin_from).min(150) + 5);
        if found.is_empty() {
            continue;
        }
        let show = |docs: &BTreeMap<crate::key::LeaseKey, mongodb::bson::Document>| {
            let keys: Vec<_> = found.iter().filter_map(|d| d.key.clone()).collect();
            let shown: Vec<String> = docs
                .iter()
                .filter(|(k, _)| keys.contains(k))
                .map(|(k, d)| norm::document(k, d).show())
                .collect();
            shown.join("; ")
        };
        let documents = (show(&twin_docs), show(&mongo_docs));
        let report = |divergences: Vec<Divergence>| Report {
            seed,
            step,
            op: format!("{} {op:?}", op.kind()),
            answers: (
                format!("{} announced {}", answers.twin_raw, twin_announced.show()),
                format!("{} announced {}", answers.mongo_raw, mongo_announced.show()),
            ),
            documents: documents.clone(),
            divergences,
        };
        let (mut stop, mut unknown) = (false, Vec::new());
        for divergence in &found {
            let seen = known::Seen {
                op: &op,
                divergence,
                twin_docs: &twin_docs,
                mongo_docs: &mongo_docs,
            };
            match known::known(&seen) {
                Some(k) => {
                    if met.insert(k.name) {
                        summary.known.entry(k.name).or_insert((0, (seed, step))).0 += 1;
                    }
                    stop |= k.stops;
                    if verbose {
                        let shown = report(vec![divergence.clone()]);
                        eprintln!("known: {} ({})\n{shown}", k.name, k.reason);
                    }
                }
                None => unknown.push(divergence.clone()),
            }
        }
        if !unknown.is_empty() && crossed {
            summary.inconclusive.push(report(unknown));
            break;
        }
        if !unknown.is_empty() {
            summary.unknown.push(report(unknown));
            failed = true;
            break;
        }
        if stop {
            break;
        }
    }
    if !failed {
        world.cleanup().await;
    }
}
