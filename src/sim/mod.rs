//! Deterministic simulation of the real manager (feature `sim`): the actor
//! and its handles (exclusive, shared and semaphore leases, minimum holds,
//! in-document leases, elections) run on one thread under tokio's paused
//! clock, over the in-memory twin of the store with faults drawn from a
//! seed, and every random choice of the library comes from that seed, so a
//! schedule replays from its number. What the holders see is recorded as a
//! [`History`] and judged by the [`checker`].
//!
//! One schedule: 2 to 4 managers (processes), some releasing in delete
//! mode, each with 2 to 4 tasks on a handful of keys; one more task of one
//! manager acquiring several keys of its own at once and releasing them at
//! once; in some schedules a holder that re-enters its lease and tasks
//! that take several keys at once in random orders; an operator (force
//! release, release by owner id, with a lock-delay of none, the safety
//! margin or 1 s; by default, or immediately; one release by owner id in
//! four goes on to every other manager's owner id, one at a time), other
//! applications locking keys by their own protocols (`others`), a client
//! locking a user document by its `LockId` / `LockTime` fields beside
//! in-document leases opened with `LockIdFields`, once faults stopped a
//! holder of a key of its own that releases it when told of a request to
//! and a requester asking the holders of keys to, the TTL monitor over
//! every TTL index of the collection, and the server's clock running up
//! to 5 % faster than the managers', stepping back by up to 10 ms, and
//! stepping forward or back at failovers by up to the bound the managers
//! assume (`clock_skew`). The twin plays the server's side of every call:
//! a call applies when the fault plan says, perhaps long after its caller
//! gave up on it.
//! Faults stop at [`FAULTS_STOP`], the tasks at [`WORK_STOP`]; the run
//! ends once every task is done, or [`LIVENESS`] later.
//!
//! `cargo run --release --example simulate -- --seeds N` runs many.

pub mod checker;
mod durations;
mod expiry;
mod faults;
mod groups;
pub mod history;
mod landed;
pub(crate) mod others;
mod reentrant;
mod revocable;
mod workload;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use self::checker::{Bounds, Violation};
use self::faults::{CLOCK_STEP_BACK, LANDING_MOST, Plan, SERVER_FASTER_PPM};
use self::history::{At, Event, History};
use self::workload::{DOCUMENTS, LOCK_ID_DOCUMENTS, Process, Recorder, Role};
use crate::config::CONTENDED_FOR;
use crate::config::{ReleaseMode, Timing};
use crate::document::DEFAULT_LEASE_FIELD;
use crate::foreign::ForeignRules;
use crate::manager::LeaseManager;
use crate::random::random_range;
use crate::store::memory::MemoryDb;

/// When faults stop, from the schedule's start.
pub const FAULTS_STOP: Duration = Duration::from_secs(16);
/// When tasks stop starting new acquisitions.
pub const WORK_STOP: Duration = Duration::from_secs(20);
/// How long a waiter may wait once faults stopped.
pub const LIVENESS: Duration = Duration::from_secs(30);

const TTL: Duration = Duration::from_secs(3);
pub(crate) const SAFETY_MARGIN: Duration = Duration::from_millis(300);
const RETRY_MAX: Duration = Duration::from_secs(1);
/// The longer `retry_max` of some managers ([`retry_max`]).
const SLOW_RETRY_MAX: Duration = Duration::from_secs(4);
/// The shorter `retry_max` of the managers of some schedules
/// ([`retry_max`]): their registration window (`2 * retry_max + 1 s +
/// safety margin`, `store::registration_window`) is 2.1 s, shorter than
/// the TTL.
const FAST_RETRY_MAX: Duration = Duration::from_millis(400);

/// The managers' lock-delay in schedule `seed`: none, the default (the
/// safety margin), or longer; from the seed's number, so that the draws of
/// the schedule stay as they were.
fn lock_delay(seed: u64) -> Duration {
    [Duration::ZERO, SAFETY_MARGIN, Duration::from_secs(1)][(seed % 3) as usize]
}

/// The bound on the queues of waiting owners in schedule `seed`: 2 in two
/// schedules of five, so that 3 or 4 managers waiting for one key (or
/// registrations that outlive a wait) go beyond it, else the store's
/// (`store::MAX_QUEUE`, out of reach of 2 to 4 managers); from the seed's
/// number, so that the draws of the schedule stay as they were.
fn queue_bound(seed: u64) -> usize {
    match seed % 5 {
        1 | 3 => 2,
        _ => crate::store::MAX_QUEUE,
    }
}

/// Whether manager `index` of schedule `seed` keeps its stream of writes
/// open while it holds leases (`LeaseManagerOptions::watch_held_leases`):
/// in half of the schedules no manager does (loss found by the heartbeat,
/// requests to release read there), in a quarter every manager does, in
/// the last quarter every other manager; from the seed's number, so that
/// the draws of the schedule stay as they were.
fn watch_held_leases(seed: u64, index: usize) -> bool {
    match seed % 4 {
        0 | 1 => false,
        2 => true,
        _ => index % 2 == 1,
    }
}

/// The `retry_max` of manager `index` of schedule `seed`, which also sets
/// its registration window: in two schedules of seven, every other manager
/// refreshes its registrations only every 2 to 4 s ([`SLOW_RETRY_MAX`]),
/// so that a handoff announced late still finds it waiting, and grants
/// the lease on the event, rather than confirmed by a refresh in between
/// (`Actor::grant_handed`, which counts the lease from the registering
/// attempt's send); in two others every manager retries within 400 ms
/// ([`FAST_RETRY_MAX`]), so that its registration window is shorter than
/// the TTL and a lease handed to it lasts the window unconfirmed, as with
/// the product's defaults (6 s of 30 s; with 1 s it is 3.3 s, longer than
/// the simulation's TTL of 3 s, and a handed lease lasts the TTL); from
/// the seed's number, so that the draws of the schedule stay as they were.
fn retry_max(seed: u64, index: usize) -> Duration {
    match seed % 7 {
        0 | 3 if index % 2 == 1 => SLOW_RETRY_MAX,
        1 | 5 => FAST_RETRY_MAX,
        _ => RETRY_MAX,
    }
}

/// How long manager `index` of schedule `seed` keeps a key on the general
/// forms after one was sent for it (`Timing::contended_for`): in one
/// schedule of four the product's [`CONTENDED_FOR`] (10 s, longer than
/// the TTL), else 300 ms or 1 s, every other manager. With 10 s a light
/// acquire retried under the lease id of an attempt whose outcome was
/// unknown never comes in time to find that attempt's write (a retry goes
/// to the general forms until the write has less than half the TTL left),
/// as it does with the product's TTL (30 s, a third of which is 10 s); so
/// the simulation, with a TTL of 3 s, also keeps a key contended for less.
/// From the seed's number, so that the draws of the schedule stay as they
/// were.
fn contended_for(seed: u64, index: usize) -> Duration {
    match (seed % 4, index % 2) {
        (0, _) => CONTENDED_FOR,
        (_, 0) => Duration::from_millis(300),
        _ => Duration::from_secs(1),
    }
}

/// The managers' timing: `clock_skew` is the schedule's bound on the
/// members' clocks' difference, and the cap on local deadlines is what
/// `connect` finds in the collection (pattern 1's TTL index on `ts`).
fn timing(
    release_mode: ReleaseMode,
    watch_held_leases: bool,
    (retry_max, contended_for): (Duration, Duration),
    clock_skew: Duration,
) -> Timing {
    Timing {
        ttl: TTL,
        heartbeat_interval: Duration::from_secs(1),
        safety_margin: SAFETY_MARGIN,
        clock_skew,
        operation_timeout: Duration::from_secs(10),
        retry_initial: Duration::from_millis(10),
        retry_max,
        renewal_batch_size: 100,
        release_mode,
        ttl_cap: None,
        watch_held_leases,
        contended_for,
    }
}

/// What one schedule did.
pub struct Report {
    /// Its seed.
    pub seed: u64,
    /// Its fault plan and workload, readable.
    pub plan: String,
    /// What happened.
    pub history: History,
    /// When it ended.
    pub end: At,
    /// What the checker found.
    pub violations: Vec<Violation>,
}

impl Report {
    /// Leases granted.
    pub fn grants(&self) -> usize {
        self.history
            .entries()
            .iter()
            .filter(|e| matches!(e.event, Event::Granted { .. }))
            .count()
    }

    /// The first violation with the last `n` events of its key, and the
    /// seed that replays it.
    pub fn explain(&self, n: usize) -> String {
        let mut out = String::new();
        for v in self.violations.iter().take(1) {
            out += &format!("seed {}: violation {v}\n", self.seed);
            out += &format!("last {n} events of {}:\n", v.key);
            for entry in self.history.trace_of(&v.key, v.entry, n) {
                out += &format!("{entry}\n");
            }
            out += &format!("replay: --seed {} --trace\n", self.seed);
        }
        out
    }
}

/// Runs schedule `seed` on a fresh single-threaded runtime with a paused
/// clock, the library's randomness seeded with it.
///
/// # Panics
///
/// If the runtime cannot be built.
pub fn run(seed: u64) -> Report {
    crate::random::seed(Some(seed));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    let report = runtime.block_on(schedule(seed));
    drop(runtime);
    crate::random::seed(None);
    report
}

/// Keys of exclusive leases; other applications lock the last one, and
/// now and then the first one.
const EXCLUSIVE_KEYS: [&str; 2] = ["x0", "x1"];

async fn schedule(seed: u64) -> Report {
    let t0 = Instant::now();
    let recorder = Recorder::new(t0);
    // Pattern 1's TTL index on `ts` (and pattern 1) in half the schedules,
    // pattern 2 in the others: the value pattern's clients in a collection
    // with a TTL index on `ts` are not supported (docs/sharing.md).
    let ts_index = (random_range(0..2) == 0).then_some(others::TS_EXPIRE_AFTER);
    let schema = others::Schema::draw();
    let rules = ForeignRules {
        custom: schema.map(others::Schema::rule),
        ts_expire_after: ts_index,
    };
    let db = MemoryDb::new()
        .with_foreign_rules(rules)
        .expect("the twin evaluates the drawn rules");
    let managers = random_range(2..=4usize);
    let plan = Plan::draw(managers, FAULTS_STOP);
    db.set_faster_ppm(plan.server_faster_ppm);
    db.set_ttl_indexes(others::ttl_indexes(plan.gc_grace, ts_index));
    // What stale reads (`Fault::Stale`, up to 1.5 s behind) may see.
    db.keep_snapshots(Duration::from_secs(2));
    db.documents(DOCUMENTS, DEFAULT_LEASE_FIELD)
        .keep_snapshots(Duration::from_secs(2));
    db.documents(LOCK_ID_DOCUMENTS, DEFAULT_LEASE_FIELD)
        .keep_snapshots(Duration::from_secs(2));
    let stop = Arc::new(AtomicBool::new(false));
    let mut described = format!(
        "seed {seed}: {managers} managers, lock-delay {:?}, queue bound {}\n{plan}",
        lock_delay(seed),
        queue_bound(seed)
    );
    let mut processes = Vec::new();
    for index in 0..managers {
        let delete_mode = random_range(0..3) == 0;
        let mode = if delete_mode {
            ReleaseMode::Delete
        } else {
            ReleaseMode::Keep
        };
        let owner = format!("m{index}");
        let store = db
            .store(owner.clone(), TTL)
            .with_safety_margin(SAFETY_MARGIN)
            .with_yield_window(retry_max(seed, index))
            .with_release_mode(mode)
            .with_lock_delay(lock_delay(seed))
            .with_queue_bound(queue_bound(seed))
            .with_light_acquire();
        let timing = Timing {
            ttl_cap: ts_index,
            ..timing(
                mode,
                watch_held_leases(seed, index),
                (retry_max(seed, index), contended_for(seed, index)),
                plan.clock_skew,
            )
        };
        let operation_timeout = Some(plan.operation_timeout);
        store.set_operation_timeout(operation_timeout);
        plan.install(index, &store, t0);
        let documents = store.document_store(DOCUMENTS, DEFAULT_LEASE_FIELD);
        documents.set_operation_timeout(operation_timeout);
        plan.install(index, &documents, t0);
        let lock_id = Some(Arc::new(workload::lock_id_fields()));
        let documents = store.document_store_with(LOCK_ID_DOCUMENTS, DEFAULT_LEASE_FIELD, lock_id);
        documents.set_operation_timeout(operation_timeout);
        plan.install(index, &documents, t0);
        let manager = LeaseManager::start(Arc::new(store.clone()), owner.into(), timing);
        processes.push(Arc::new(Process {
            index,
            manager,
            store,
            delete_mode,
            clock_skew: plan.clock_skew,
            tasks: Default::default(),
            crashed: AtomicBool::new(false),
        }));
    }
    let mut workers = Vec::new();
    for process in &processes {
        let tasks = random_range(2..=4usize);
        let mut roles = Vec::new();
        for _ in 0..tasks {
            let role = match random_range(0..10) {
                0..3 => Role::Exclusive {
                    key: EXCLUSIVE_KEYS[random_range(0..EXCLUSIVE_KEYS.len())],
                    hold: !process.delete_mode,
                },
                3 if !process.delete_mode => Role::Shared("rw"),
                4 => Role::Exclusive {
                    key: "rw",
                    hold: false,
                },
                5 if !process.delete_mode => Role::Permit("p2", 2 + random_range(0..2)),
                3 | 5 => Role::Exclusive {
                    key: "x0",
                    hold: false,
                },
                6 => Role::Leader("leader"),
                9 => Role::LockIdDocument("d1"),
                _ => Role::Document("d0"),
            };
            roles.push(format!("{role:?}"));
            let task = workload::worker(recorder.clone(), process.clone(), role, stop.clone());
            workers.push((process.index, process.spawn(task)));
        }
        described += &format!(
            "manager {} ({}{}): {}\n",
            process.index,
            if process.delete_mode {
                "delete"
            } else {
                "keep"
            },
            if watch_held_leases(seed, process.index) {
                ", watching held leases"
            } else {
                ""
            },
            roles.join(", ")
        );
    }
    // Several leases released at once, by one manager.
    {
        let process = &processes[random_range(0..managers)];
        let operator = processes[(process.index + 1) % managers].clone();
        described += &format!(
            "manager {}: several leases at once (operator: manager {})\n",
            process.index, operator.index
        );
        let task = workload::several(recorder.clone(), process.clone(), operator, stop.clone());
        workers.push((process.index, process.spawn(task)));
    }
    // In two schedules of three, a re-entrant holder, and tasks taking
    // several keys at once (two or three, in random orders).
    if random_range(0..3) != 0 {
        let process = &processes[random_range(0..managers)];
        let key = EXCLUSIVE_KEYS[random_range(0..EXCLUSIVE_KEYS.len())];
        described += &format!("manager {}: re-entrant holder of {key}\n", process.index);
        let task = reentrant::reentrant(recorder.clone(), process.clone(), key, stop.clone());
        workers.push((process.index, process.spawn(task)));
    }
    if random_range(0..3) != 0 {
        for _ in 0..random_range(1..=3usize) {
            let process = &processes[random_range(0..managers)];
            described += &format!("manager {}: several keys at once\n", process.index);
            let task = groups::groups(recorder.clone(), process.clone(), stop.clone());
            workers.push((process.index, process.spawn(task)));
        }
    }
    // Once faults stopped, a holder of a key of its own that releases it
    // when told of a request to, and a requester asking the holders of
    // keys to release them, in managers that do not crash (another one
    // than the holder's if there is one; no draw, so that the schedule's
    // draws stay as they were).
    let survives = |m: usize| plan.crash.is_none_or(|(victim, _)| victim != m);
    let revocable_holder = plan.crash.map_or(0, |(victim, _)| (victim + 1) % managers);
    let requester = Some((revocable_holder + 1) % managers)
        .filter(|m| survives(*m))
        .unwrap_or(revocable_holder);
    described += &format!("manager {requester}: requests to release\n");
    {
        let process = &processes[revocable_holder];
        described += &format!(
            "manager {}: revocable holder of {}\n",
            process.index,
            revocable::KEY
        );
        let task = revocable::revocable(recorder.clone(), process.clone(), stop.clone());
        workers.push((process.index, process.spawn(task)));
    }
    let work_stop = Arc::new(AtomicBool::new(false));
    let operator = random_range(0..managers);
    let owners: Vec<String> = (0..managers).map(|m| format!("m{m}")).collect();
    processes[operator].spawn(workload::operator(
        recorder.clone(),
        processes[operator].clone(),
        owners,
        vec!["x0", "x1", "rw", "p2", "leader", "g0"],
        work_stop.clone(),
    ));
    // Reads of the waiting owners of the contended keys.
    processes[operator].spawn(workload::inspector(
        recorder.clone(),
        processes[operator].clone(),
        vec!["x0", "x1", "rw", "leader"],
        work_stop.clone(),
    ));
    // The number of permits of `p2` changes now and then (2 or 3).
    if let Some(resizer) = processes.iter().find(|p| !p.delete_mode) {
        resizer.spawn(workload::resizer(
            recorder.clone(),
            resizer.clone(),
            "p2",
            [2, 3],
            work_stop.clone(),
        ));
    }
    processes[requester].spawn(workload::requester(
        recorder.clone(),
        processes[requester].clone(),
        (vec!["x0", "x1", "rw", "p2"], revocable::KEY),
        work_stop.clone(),
    ));
    // Other applications: on the last exclusive key always, on the others
    // and the election's and shared key now and then.
    let mut foreign_keys = vec![EXCLUSIVE_KEYS[1]];
    foreign_keys.extend(
        [EXCLUSIVE_KEYS[0], "leader", "rw"]
            .into_iter()
            .filter(|_| random_range(0..2) == 0),
    );
    described += &format!(
        "other applications on {foreign_keys:?}, {}, a client of {schema:?} by its rule\n",
        match ts_index {
            Some(_) => "patterns 1 and 3 and a bare {_id}, a TTL index on ts",
            None => "patterns 2 and 3 and a bare {_id}, no TTL index on ts",
        }
    );
    for key in foreign_keys {
        tokio::spawn(others::foreign_holder(
            recorder.clone(),
            db.clone(),
            key,
            ts_index.is_some(),
            schema,
            work_stop.clone(),
        ));
    }
    tokio::spawn(workload::lock_id_client(
        recorder.clone(),
        db.documents(LOCK_ID_DOCUMENTS, DEFAULT_LEASE_FIELD),
        "d1",
        work_stop.clone(),
    ));
    tokio::spawn(others::ttl_monitor(recorder.clone(), db.clone()));
    tokio::spawn(expiry::watch(recorder.clone(), db.clone()));
    tokio::spawn(landed::watch(recorder.clone(), db.clone()));
    // Failovers: the new primary's clock ahead of the managers' by up to
    // the bound they assume (a step forward or back).
    let failover = db.clone();
    let failovers = plan.failovers.clone();
    tokio::spawn(async move {
        for (at, ahead) in failovers {
            tokio::time::sleep_until(t0 + at).await;
            failover.set_ahead(ahead);
        }
    });
    let clock = db.clone();
    tokio::spawn(async move {
        while Instant::now() - t0 < FAULTS_STOP {
            let behind =
                Duration::from_millis(random_range(0..=CLOCK_STEP_BACK.as_millis() as u64));
            clock.set_behind(behind);
            tokio::time::sleep(Duration::from_millis(random_range(100..2_000))).await;
        }
        clock.set_behind(Duration::ZERO);
    });
    if let Some((victim, at)) = plan.crash {
        let (process, recorder) = (processes[victim].clone(), recorder.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(t0 + at).await;
            process.crash(&recorder);
        });
    }
    tokio::time::sleep_until(t0 + FAULTS_STOP).await;
    recorder.push(Event::FaultsStopped);
    tokio::time::sleep_until(t0 + WORK_STOP).await;
    stop.store(true, Ordering::SeqCst);
    work_stop.store(true, Ordering::SeqCst);
    // A write sent before the faults stopped may land up to `LANDING_MOST`
    // later and hold its key a TTL more (property 6's bound).
    let liveness = LIVENESS + LANDING_MOST + TTL;
    let deadline = t0 + WORK_STOP + liveness + Duration::from_secs(1);
    for (index, handle) in workers {
        if processes[index].crashed.load(Ordering::SeqCst) {
            continue;
        }
        let _ = tokio::time::timeout_at(deadline, handle).await;
    }
    // Let the last losses and renewals be told.
    tokio::time::sleep(TTL).await;
    let end = recorder.at(Instant::now());
    let history = recorder.history();
    let bounds = Bounds {
        clock_step_back: CLOCK_STEP_BACK,
        clock_skew: plan.clock_skew,
        server_faster_ppm: SERVER_FASTER_PPM,
        landing: LANDING_MOST,
        liveness: LIVENESS,
        ttl: TTL,
        // The longest registration window (2 × retry_max + 1 s + safety
        // margin, longer than a waiting mark's TTL); how late an attempt
        // started before its wait ended may register: queued in the group
        // commit behind a light acquire that a freeze holds (up to 6 s)
        // and that comes late (1.5 s), then sent and delayed itself (1.5
        // s); a stale read showing it (1.5 s old); an attempt landing up
        // to `LANDING_MOST` after it was sent; and the server clock's
        // steps.
        waiter_window: 2
            * (0..managers)
                .map(|index| retry_max(seed, index))
                .max()
                .unwrap_or(RETRY_MAX)
            + Duration::from_secs(1)
            + SAFETY_MARGIN
            + Duration::from_secs(6)
            + Duration::from_millis(2 * 1_500)
            + LANDING_MOST
            + plan.clock_skew,
        queue_bound: queue_bound(seed),
    };
    let violations = checker::check(bounds, &history, end);
    Report {
        seed,
        plan: described,
        history,
        end,
        violations,
    }
}

#[cfg(test)]
mod tests;
