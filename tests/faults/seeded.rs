//! Seeded fault runs: from a seed, `failCommand` fail points set at random
//! on the members of a 3-member replica set (error codes with and without
//! the `RetryableWriteError` label, write concern errors, closed
//! connections, blocked connections, among them writes held back longer
//! than their callers wait, which land after the callers gave up, on chosen
//! commands and workers' `appName`s, with `times`, `skip`, probability and always-on modes), plus
//! step-downs, frozen members (`SIGSTOP` / `SIGCONT`) and killed workers,
//! while worker processes contend with every kind of lease (`kinds.rs`).
//! The history is then judged by `checker.rs`. See docs/fault-runs.md.
//!
//! The faults come in rounds; each round's faults are drawn from the seed
//! alone (never from what the run observed), so a seed sets the same fail
//! points in the same order again. The run's timing, and so what the faults
//! hit, varies from run to run.

use std::collections::HashMap;
use std::time::Duration;

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions, monotonic_ns};
use mongo_lease::{DEFAULT_HEARTBEAT_DIVISOR, DEFAULT_OPERATION_TIMEOUT};
use mongodb::bson::{Bson, Document, doc};
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use tokio::time::Instant;

use crate::checker::{Violation, Violations, try_check};
use crate::harness::{Event, Fleet, Params};
use crate::scenario::{progress, scenario_slot};

/// The commands a fail point may fail.
const COMMANDS: [&str; 7] = [
    "findAndModify",
    "update",
    "delete",
    "find",
    "aggregate",
    "getMore",
    "insert",
];
/// Error codes: HostUnreachable, NetworkTimeout, ShutdownInProgress,
/// PrimarySteppedDown, NotWritablePrimary, InterruptedAtShutdown,
/// InterruptedDueToReplStateChange, ExceededTimeLimit.
const CODES: [i32; 8] = [6, 89, 91, 189, 10107, 11600, 11602, 262];
/// Write concern error codes: ShutdownInProgress (retryable),
/// WriteConcernFailed (not).
const WRITE_CONCERN_CODES: [i32; 2] = [91, 64];

/// A member fault of one round.
#[derive(Debug, Clone)]
enum MemberFault {
    StepDown { secs: u64 },
    Freeze { member: usize, ms: u64 },
}

/// The faults of one round, drawn from the seed.
#[derive(Debug, Clone)]
struct Round {
    n: usize,
    fail_point: Option<(Bson, Document)>,
    member: Option<MemberFault>,
    /// Which live worker (index in name order) to kill with SIGKILL.
    crash: Option<usize>,
    length_ms: u64,
    pause_ms: u64,
}

impl Round {
    /// Draws round `n`; `workers` are the live workers' names, in order.
    fn draw(rng: &mut StdRng, n: usize, workers: &[String]) -> Round {
        let fail_point = rng.random_bool(0.85).then(|| fail_point(rng, workers));
        let member = rng.random_bool(0.3).then(|| {
            if rng.random_bool(0.5) {
                MemberFault::StepDown {
                    secs: rng.random_range(1..=3),
                }
            } else {
                MemberFault::Freeze {
                    member: rng.random_range(0..3),
                    ms: rng.random_range(300..=3000),
                }
            }
        });
        let crash = rng
            .random_bool(0.06)
            .then(|| rng.random_range(0..workers.len()));
        Round {
            n,
            fail_point,
            member,
            crash,
            length_ms: rng.random_range(300..=2500),
            pause_ms: rng.random_range(0..=500),
        }
    }

    fn describe(&self, workers: &[String]) -> String {
        let mut parts = Vec::new();
        if let Some((mode, data)) = &self.fail_point {
            let late = if is_late_write(data) {
                " (a late write: held back longer than its caller waits)"
            } else {
                ""
            };
            parts.push(format!("failCommand mode={mode} data={data}{late}"));
        }
        match &self.member {
            Some(MemberFault::StepDown { secs }) => parts.push(format!("step-down for {secs} s")),
            Some(MemberFault::Freeze { member, ms }) => {
                parts.push(format!("freeze member {member} for {ms} ms"))
            }
            None => {}
        }
        if let Some(i) = self.crash {
            parts.push(format!("kill -9 worker {}", workers[i]));
        }
        if parts.is_empty() {
            parts.push("no fault".into());
        }
        format!(
            "round {} ({} ms, then {} ms without): {}",
            self.n,
            self.length_ms,
            self.pause_ms,
            parts.join("; ")
        )
    }
}

/// A `failCommand` fail point: its mode and data.
fn fail_point(rng: &mut StdRng, workers: &[String]) -> (Bson, Document) {
    let mut data = Document::new();
    let action = rng.random_range(0..100);
    let commands: Vec<&str> = if action >= 80 {
        // A write concern error: the write applies, the reply says it may not have.
        let writes = ["findAndModify", "update", "delete", "insert"];
        writes
            .iter()
            .copied()
            .filter(|_| rng.random_bool(0.5))
            .collect()
    } else {
        COMMANDS
            .iter()
            .copied()
            .filter(|_| rng.random_bool(0.35))
            .collect()
    };
    let commands = if commands.is_empty() {
        vec![COMMANDS[rng.random_range(0..4)]]
    } else {
        commands
    };
    data.insert("failCommands", commands);
    if rng.random_bool(0.7) {
        data.insert("appName", workers.choose(rng).unwrap().clone());
    }
    match action {
        0..45 => {
            data.insert("errorCode", *CODES.choose(rng).unwrap());
            let labels: Vec<&str> = if rng.random_bool(0.5) {
                vec!["RetryableWriteError"]
            } else {
                vec![]
            };
            data.insert("errorLabels", labels);
        }
        45..60 => {
            data.insert("closeConnection", true);
        }
        60..80 => {
            let ms: i64 = match rng.random_range(0..100) {
                0..70 => rng.random_range(20..=1500),
                70..85 => rng.random_range(1500..=4000),
                _ => return late_write(rng, data),
            };
            data.insert("blockConnection", true);
            data.insert("blockTimeMS", ms);
        }
        _ => {
            let code = *WRITE_CONCERN_CODES.choose(rng).unwrap();
            data.insert(
                "writeConcernError",
                doc! { "code": code, "errmsg": "injected by the fault run" },
            );
        }
    }
    let mode: Bson = match rng.random_range(0..100) {
        0..45 => doc! { "times": rng.random_range(1..=4_i32) }.into(),
        45..70 => doc! { "skip": rng.random_range(0..=10_i32) }.into(),
        70..90 => doc! { "activationProbability": rng.random_range(0.1..0.5_f64) }.into(),
        _ => "alwaysOn".into(),
    };
    (mode, data)
}

/// A late write: the next command (`times: 1`) of one kind of write is
/// held back on the server longer than its caller waits, and applied after
/// the caller gave up on it (docs/safety.md, "Late writes and client-side
/// timeouts"): an `update` (a heartbeat's renewal, which the manager bounds
/// by the heartbeat interval; also a light release) for the heartbeat and
/// 0.1-2 s more, or a `findAndModify` (an acquisition, a release, a
/// handoff: bounded by `operation_timeout`) for that timeout and 0.5-3 s
/// more. `data` names the commands' client (or none) already.
fn late_write(rng: &mut StdRng, mut data: Document) -> (Bson, Document) {
    let renewal_bound = params().ttl / DEFAULT_HEARTBEAT_DIVISOR;
    let (command, bound, more) = if rng.random_bool(0.6) {
        ("update", renewal_bound, rng.random_range(100..=2000))
    } else {
        (
            "findAndModify",
            DEFAULT_OPERATION_TIMEOUT,
            rng.random_range(500..=3000),
        )
    };
    data.insert("failCommands", vec![command]);
    data.insert("blockConnection", true);
    data.insert("blockTimeMS", bound.as_millis() as i64 + more);
    (doc! { "times": 1 }.into(), data)
}

/// Whether `data` holds a write back longer than its caller waits: an
/// `update` longer than a renewal's bound, or a `findAndModify` longer than
/// `operation_timeout` ([`late_write`]; the longest other blocks on
/// `update` are late writes too).
fn is_late_write(data: &Document) -> bool {
    let Ok(ms) = data.get_i64("blockTimeMS") else {
        return false;
    };
    let names = |name: &str| {
        data.get_array("failCommands")
            .is_ok_and(|c| c.iter().any(|c| c.as_str() == Some(name)))
    };
    let longer = |bound: Duration| ms > bound.as_millis() as i64;
    (names("update") && longer(params().ttl / DEFAULT_HEARTBEAT_DIVISOR))
        || (names("findAndModify") && longer(DEFAULT_OPERATION_TIMEOUT))
}

/// The replica set of the fault runs: 3 members, fast elections, test
/// commands enabled (for `failCommand`).
async fn replica_set() -> ReplicaSet {
    ReplicaSet::start(
        ReplicaSetOptions::default()
            .members(3)
            .extra_arg("--setParameter")
            .extra_arg("enableTestCommands=1"),
    )
    .await
    .expect("3-member replica set with test commands")
}

/// The workers' parameters: TTL 3 s, 3 tasks each, holds of 5-60 ms (10 %
/// of TTL / 2, across a renewal).
fn params() -> Params {
    Params {
        workers: 4,
        tasks: 3,
        keys: 0,
        ttl: Duration::from_secs(3),
        retry_max: Duration::from_secs(1),
        hold_ms: (5, 60),
        long_hold_pct: 10,
        mixed: true,
    }
}

/// What one seed did.
struct SeedOutcome {
    operations: usize,
    violations: usize,
}

/// One seed: a fresh fleet on `rs`, `secs` of rounds of faults, every
/// worker stopped, the history judged. Prints the rounds as they are set
/// and, on a violation, the seed, the rounds and a history excerpt.
async fn run_seed(rs: &ReplicaSet, seed: u64, secs: f64) -> SeedOutcome {
    let p = params();
    let mut fleet = Fleet::new(&rs.uri(), p.clone()).await;
    fleet.spawn_n(p.workers).await;
    progress(&fleet, 0, 5, Duration::from_secs(60)).await;

    let mut rng = StdRng::seed_from_u64(seed);
    let began = Instant::now();
    let t0 = monotonic_ns();
    let mut rounds: Vec<(u64, u64, String)> = Vec::new();
    let mut n = 0;
    while began.elapsed().as_secs_f64() < secs {
        n += 1;
        let live = fleet.live_workers();
        let round = Round::draw(&mut rng, n, &live);
        let text = round.describe(&live);
        eprintln!(
            "FAULT seed={seed} +{:.2}s {text}",
            began.elapsed().as_secs_f64()
        );
        let start = monotonic_ns();
        if let Some((mode, data)) = &round.fail_point {
            rs.fail_command(mode.clone(), data.clone())
                .await
                .expect("setting failCommand");
        }
        match round.member {
            Some(MemberFault::StepDown { secs }) => {
                if let Err(e) = rs.step_down_for(Duration::from_secs(secs)).await {
                    eprintln!("FAULT seed={seed} round {n}: step-down not done: {e}");
                }
            }
            Some(MemberFault::Freeze { member, .. }) => rs.freeze(member).unwrap(),
            None => {}
        }
        let freeze_ms = match round.member {
            Some(MemberFault::Freeze { ms, .. }) => ms,
            _ => 0,
        };
        let crashed = match round.crash {
            Some(i) => {
                fleet.kill(&live[i]).await;
                true
            }
            None => false,
        };
        tokio::time::sleep(Duration::from_millis(round.length_ms.max(freeze_ms))).await;
        for i in 0..3 {
            rs.thaw(i).unwrap();
        }
        rs.clear_fail_command().await.expect("clearing failCommand");
        rounds.push((start, monotonic_ns(), text));
        if crashed {
            fleet.spawn_n(1).await;
        }
        tokio::time::sleep(Duration::from_millis(round.pause_ms)).await;
    }
    let fault_secs = began.elapsed().as_secs_f64();

    // Faults over: every worker still makes progress, then stops cleanly.
    let from = fleet.history.len();
    progress(&fleet, from, 10, Duration::from_secs(120)).await;
    fleet.stop_all(Duration::from_secs(60)).await;
    let events = fleet.history.all();
    let left = fleet.leases_left().await;
    if !left.is_empty() {
        eprintln!("{}", leftovers(&left, &events, &rounds));
    }
    fleet.wait_collected().await;
    let finals = fleet.finals().await;
    let verdict = try_check(&events, &fleet.kills(), &finals);
    let operations = events.iter().filter(|e| e.kind == "acq").count();
    let verdict = match verdict {
        Ok(_) if !left.is_empty() => Err(Violations(vec![Violation {
            key: left[0]
                .get("_id")
                .map(ToString::to_string)
                .unwrap_or_default(),
            t: monotonic_ns(),
            message: format!(
                "LEASE LEFT after every manager shut down cleanly: {} lock document(s)",
                left.len()
            ),
        }])),
        other => other,
    };
    match verdict {
        Ok(report) => {
            eprintln!(
                "FIGURE fault run seed {seed}: {fault_secs:.1} s, {} rounds; {operations} acquisitions ({}); {}",
                rounds.len(),
                report.kinds(),
                report.summary()
            );
            SeedOutcome {
                operations,
                violations: 0,
            }
        }
        Err(violations) => {
            eprintln!("VIOLATION seed {seed}: {} violation(s)", violations.0.len());
            eprintln!("the rounds of faults of seed {seed}:");
            for (s, e, text) in &rounds {
                eprintln!("  +{:.3}s..+{:.3}s {text}", rel(*s, t0), rel(*e, t0));
            }
            for v in violations.0.iter().take(5) {
                eprintln!("{}", excerpt(v, &events, &rounds, t0));
            }
            SeedOutcome {
                operations,
                violations: violations.0.len(),
            }
        }
    }
}

/// The lock documents left holding a lease after a clean shutdown, with
/// their holder's worker, when it stopped, and the rounds, all by the wall
/// clock (the documents' dates).
fn leftovers(left: &[Document], events: &[Event], rounds: &[(u64, u64, String)]) -> String {
    // Wall clock = monotonic + offset, from the workers' `ready` lines.
    let offset_ms = events
        .iter()
        .find(|e| e.kind == "ready")
        .map_or(0, |e| e.num("wall_ms") - e.t() as i64 / 1_000_000);
    let wall =
        |t: u64| mongodb::bson::DateTime::from_millis(t as i64 / 1_000_000 + offset_ms).to_string();
    let mut out = String::from("LEASE LEFT after every manager shut down cleanly:");
    for d in left {
        let owner = d.get_str("aid").unwrap_or("?");
        let worker = events
            .iter()
            .find(|e| e.kind == "ready" && e.get("owner") == owner)
            .map_or("?".to_string(), |e| e.w.clone());
        let done = events
            .iter()
            .find(|e| e.kind == "done" && e.w == worker)
            .map_or("?".to_string(), |e| wall(e.t()));
        let tok = d.get_i64("tok").unwrap_or(0);
        let acquired = events
            .iter()
            .any(|e| e.kind == "acq" && e.num("tok") == tok && e.w == worker);
        out.push_str(&format!(
            "\n  {d}\n  held by {worker} (stopped at {done}); token {tok} {} by it",
            if acquired {
                "acquired"
            } else {
                "never reported acquired"
            }
        ));
    }
    for e in events.iter().filter(|e| e.kind == "done") {
        out.push_str(&format!("\n  {} stopped at {}", e.w, wall(e.t())));
    }
    for (s, e, text) in rounds.iter().rev().take(3).rev() {
        out.push_str(&format!("\n  {}..{} {text}", wall(*s), wall(*e)));
    }
    out
}

fn rel(t: u64, t0: u64) -> f64 {
    (t as f64 - t0 as f64) / 1e9
}

/// An event's time: `t`, or a section's end.
fn event_time(e: &Event) -> u64 {
    ["t", "t_end", "t_acq"]
        .iter()
        .find_map(|k| e.fields.get(*k))
        .and_then(|t| t.parse().ok())
        .unwrap_or(0)
}

/// The violation, the rounds around it and the events of its key from 3 s
/// before to 1 s after it, one per line, times relative to the faults'
/// start.
fn excerpt(v: &Violation, events: &[Event], rounds: &[(u64, u64, String)], t0: u64) -> String {
    let (from, to) = (v.t.saturating_sub(3_000_000_000), v.t + 1_000_000_000);
    let mut lines: Vec<(u64, String)> = events
        .iter()
        .filter(|e| e.fields.get("key").is_some_and(|k| *k == v.key) || e.kind == "exit")
        .filter(|e| (from..=to).contains(&event_time(e)))
        .map(|e| {
            let mut fields: Vec<String> = e
                .fields
                .iter()
                .filter(|(k, _)| *k != "t" && *k != "w")
                .map(|(k, val)| format!("{k}={val}"))
                .collect();
            fields.sort();
            (
                event_time(e),
                format!("{} {} {}", e.w, e.kind, fields.join(" ")),
            )
        })
        .collect();
    for (s, e, text) in rounds {
        if *s <= to && *e >= from {
            lines.push((*s, format!("controller: {text}")));
            lines.push((*e, "controller: end of round, faults cleared".to_string()));
        }
    }
    lines.sort();
    let mut out = format!(
        "VIOLATION at +{:.3}s: {}\nhistory of {} around it:",
        rel(v.t, t0),
        v.message,
        v.key
    );
    for (t, line) in lines {
        out.push_str(&format!("\n  +{:.3}s {line}", rel(t, t0)));
    }
    out
}

/// Seeds `first..` of `secs` of faults each, until `seeds` seeds or
/// `total` seconds; prints `N operations, V violations` last.
async fn run(first: u64, seeds: Option<u64>, secs: f64, total: Option<f64>) -> (usize, usize) {
    let rs = replica_set().await;
    let began = Instant::now();
    let (mut operations, mut violations) = (0, 0);
    let mut seed = first;
    let mut failing = Vec::new();
    loop {
        let outcome = run_seed(&rs, seed, secs).await;
        operations += outcome.operations;
        violations += outcome.violations;
        if outcome.violations > 0 {
            failing.push(seed);
        }
        seed += 1;
        let done = seeds.is_some_and(|n| seed - first >= n)
            || total.is_some_and(|t| began.elapsed().as_secs_f64() >= t)
            || (seeds.is_none() && total.is_none());
        if done {
            break;
        }
    }
    eprintln!(
        "FIGURE fault runs: seeds {first}..{} in {:.0} s; failing seeds: {failing:?}",
        seed - 1,
        began.elapsed().as_secs_f64()
    );
    println!("{operations} operations, {violations} violations");
    (operations, violations)
}

fn env<T: std::str::FromStr>(name: &str) -> Option<T> {
    std::env::var(name).ok().map(|v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v:?} is not a valid value"))
    })
}

/// The seed of the default test run: its first 8 s of rounds set every
/// kind of fail point and member fault (a late renewal among them: an
/// `update` held back longer than the heartbeat), and kill a worker.
const SHORT_SEED: u64 = 2421;

/// One short seed ([`SHORT_SEED`], or `FAULT_SEED`; 8 s of faults) in the
/// default test run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seeded_fault_run_short() {
    let _slot = scenario_slot().await;
    let seed = env("FAULT_SEED").unwrap_or(SHORT_SEED);
    let (operations, violations) = run(seed, Some(1), 8.0, None).await;
    assert_eq!(violations, 0, "violations found: see the excerpts above");
    assert!(
        operations >= 20,
        "too little work to judge: {operations} acquisitions"
    );
}

/// The long run: seeds from `FAULT_SEED` (default 1), `FAULT_SEED_SECS`
/// of faults each (default 120), for `FAULT_RUN_SECS` in all (default one
/// seed) or `FAULT_SEEDS` seeds.
///
/// `FAULT_RUN_SECS=1800 FAULT_SEED=7 cargo test --release --test faults -- --ignored fault_run --nocapture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "long: run by hand (docs/fault-runs.md)"]
async fn fault_run() {
    let _slot = scenario_slot().await;
    let secs: f64 = env("FAULT_SEED_SECS").unwrap_or(120.0);
    let total: Option<f64> = env("FAULT_RUN_SECS");
    let (_, violations) = run(
        env("FAULT_SEED").unwrap_or(1),
        env("FAULT_SEEDS"),
        total.map_or(secs, |t: f64| t.min(secs)),
        total,
    )
    .await;
    assert_eq!(violations, 0, "violations found: see the excerpts above");
}

/// The same seed draws the same rounds.
#[test]
fn a_seed_draws_the_same_rounds() {
    let workers: Vec<String> = (1..=4).map(|i| format!("w{i}")).collect();
    let draw = |seed| {
        let mut rng = StdRng::seed_from_u64(seed);
        (1..=50)
            .map(|n| Round::draw(&mut rng, n, &workers).describe(&workers))
            .collect::<Vec<_>>()
    };
    assert_eq!(draw(7), draw(7));
    assert_ne!(draw(7), draw(8));
    let rounds = draw(7).join("\n");
    for needle in [
        "errorCode",
        "closeConnection",
        "blockConnection",
        "writeConcernError",
        "times",
        "skip",
        "step-down",
        "freeze",
        "appName",
        "a late write",
    ] {
        assert!(
            rounds.contains(needle),
            "50 rounds of seed 7 set no {needle}:\n{rounds}"
        );
    }
    let _: HashMap<(), ()> = HashMap::new();
}
