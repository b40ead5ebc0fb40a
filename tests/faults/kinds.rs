//! The worker's critical sections on every kind of lease, for the seeded
//! fault runs (`seeded.rs`): each task of a worker picks a kind at random,
//! acquires, works as a correct holder would, and reports the section.
//!
//! The keys (one set per run's database):
//!
//! | key | kinds | work |
//! |---|---|---|
//! | `x0`, `x1` | exclusive (`x`) and shared (`s`): read/write keys | an exclusive holder claims and writes the key's counter under its fencing token (`worker.rs`); a shared holder holds |
//! | `p0` | permits (`p`) of a semaphore of [`PERMITS`] | holds |
//! | `h0` | exclusive with `hold_at_least` (`h`, `try_acquire(..).hold_at_least(..)`) and without (`x`) | the fenced counter |
//! | `e0` | an election's leadership (`e`, `Election::campaign`) | the fenced counter, under the term |
//! | `d0`, `d1` | in-document leases (`d`) on the `items` collection | `update` of the document under the lease then release, or `commit` (write and release in one) |
//!
//! A holder checks `is_lost()` before each step of its section (claim,
//! each slice of its hold, write) and ends the section when lost, as a
//! correct user does; a watcher task ([`Watch`]) notices the loss as soon
//! as the token fires or the local deadline passes unrenewed, so the
//! section ends there even while a fenced step is in flight. The `cs` line
//! then reports `t_end` = the earliest of the release call and the loss
//! noticed.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mongo_lease::testkit::monotonic_ns;
use mongo_lease::{
    DocumentLease, DocumentLeases, Election, Leadership, Lease, LeaseEvent, LeaseManager,
    ReleaseOutcome, Semaphore,
};
use mongodb::Collection;
use mongodb::bson::{Document, doc};
use rand::Rng;
use tokio_util::sync::CancellationToken;

use crate::worker::{Config, Step, claim, emit, one_line, write};

/// The read/write keys (exclusive and shared holders).
pub const RW_KEYS: [&str; 2] = ["x0", "x1"];
/// The semaphore key and its permits.
pub const PERMIT_KEY: &str = "p0";
pub const PERMITS: u32 = 2;
/// The key acquired with `hold_at_least` (and sometimes without).
pub const HOLD_KEY: &str = "h0";
/// The election.
pub const ELECTION: &str = "e0";
/// The documents of the in-document leases, in [`ITEMS`].
pub const DOCUMENT_KEYS: [&str; 2] = ["d0", "d1"];
pub const ITEMS: &str = "items";

/// The keys with a counter in the counters collection.
pub fn counter_keys() -> Vec<String> {
    RW_KEYS
        .iter()
        .chain(&[HOLD_KEY, ELECTION])
        .map(|k| k.to_string())
        .collect()
}

/// What a task holds.
enum Held {
    Lease(Lease),
    Leader(Leadership),
    Document(DocumentLease<Document>),
}

impl Held {
    fn lease(&self) -> &Lease {
        match self {
            Held::Lease(l) => l,
            Held::Leader(l) => l.lease(),
            Held::Document(d) => d.lease(),
        }
    }

    async fn release(self) -> String {
        let outcome = match self {
            Held::Lease(l) => l.release().await,
            Held::Leader(l) => l.resign().await,
            Held::Document(d) => d.release().await,
        };
        match outcome {
            Ok(ReleaseOutcome::Released) => "released".to_string(),
            Ok(ReleaseOutcome::AlreadyLost) => "lost".to_string(),
            Ok(ReleaseOutcome::StillHeld) => "still_held".to_string(),
            Err(e) => format!("err:{}", one_line(&e.to_string()).replace(' ', "_")),
        }
    }
}

/// One pick of a task: which kind, on which key, and the minimum hold.
struct Pick {
    kind: &'static str,
    key: &'static str,
    hold_at_least_ms: u64,
}

fn pick(cfg: &Config) -> Pick {
    let mut rng = rand::rng();
    let rw = RW_KEYS[rng.random_range(0..RW_KEYS.len())];
    let (kind, key) = match rng.random_range(0..100) {
        0..25 => ("x", rw),
        25..45 => ("s", rw),
        45..60 => ("p", PERMIT_KEY),
        60..70 => ("h", HOLD_KEY),
        70..75 => ("x", HOLD_KEY),
        75..85 => ("e", ELECTION),
        _ => ("d", DOCUMENT_KEYS[rng.random_range(0..DOCUMENT_KEYS.len())]),
    };
    let hold_at_least_ms = if kind == "h" {
        rng.random_range(cfg.hold_min_ms.max(1)..=cfg.ttl_ms / 2)
    } else {
        0
    };
    Pick {
        kind,
        key,
        hold_at_least_ms,
    }
}

/// The handles a task acquires through.
pub struct Kinds {
    pub manager: LeaseManager,
    pub counters: Collection<Document>,
    pub items: DocumentLeases<Document>,
    pub semaphore: Semaphore,
    pub election: Election,
}

impl Kinds {
    pub async fn new(manager: &LeaseManager, counters: Collection<Document>) -> Kinds {
        Kinds {
            manager: manager.clone(),
            counters,
            items: manager.documents::<Document>(ITEMS).await.expect("items"),
            semaphore: Semaphore::new(manager, PERMIT_KEY, PERMITS).expect("semaphore"),
            election: Election::new(manager, ELECTION).expect("election"),
        }
    }

    /// Acquires as `p` says; `None` when a `try_acquire` found the key held.
    async fn acquire(&self, p: &Pick) -> mongo_lease::Result<Option<Held>> {
        Ok(Some(match p.kind {
            "x" => Held::Lease(self.manager.acquire(p.key).await?),
            "s" => Held::Lease(self.manager.acquire(p.key).shared().await?),
            "p" => Held::Lease(self.semaphore.acquire().await?),
            "h" => {
                let at_least = Duration::from_millis(p.hold_at_least_ms);
                // Half of them wait (`acquire`: registered in the key's
                // queue of waiting owners, which a manager that shuts down
                // leaves), the others try once (`try_acquire`, the usual
                // way to run a job at most once per interval).
                if p.hold_at_least_ms % 2 == 0 {
                    Held::Lease(self.manager.acquire(p.key).hold_at_least(at_least).await?)
                } else {
                    match self
                        .manager
                        .try_acquire(p.key)
                        .hold_at_least(at_least)
                        .await?
                    {
                        Some(lease) => Held::Lease(lease),
                        None => return Ok(None),
                    }
                }
            }
            "e" => Held::Leader(self.election.campaign().await?),
            "d" => {
                let fields = doc! { "n": 0_i64, "last": 0_i64 };
                Held::Document(self.items.acquire(p.key).create(fields).await?)
            }
            other => unreachable!("kind {other}"),
        }))
    }
}

/// When the holder learned its lease was lost (0: not yet): the first of
/// its token firing, its local deadline passing with no renewal confirmed
/// (as `is_lost()` reads it), or an `is_lost()` check of the section.
struct Watch {
    noticed: Arc<AtomicU64>,
    signal: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    fn start(lease: &Lease, line: String) -> Watch {
        let noticed = Arc::new(AtomicU64::new(0));
        let signal = CancellationToken::new();
        let status = lease.status();
        let token = status.cancellation_token();
        let mut events = status.events();
        let first = status.deadline();
        let (n, s) = (noticed.clone(), signal.clone());
        let task = tokio::spawn(async move {
            if let Some(mut deadline) = first {
                loop {
                    tokio::select! {
                        biased;
                        event = events.recv() => match event {
                            Some(LeaseEvent::Renewed { deadline: d, .. }) => {
                                deadline = deadline.max(d);
                                continue;
                            }
                            Some(LeaseEvent::Lost(_)) | None => {}
                            Some(_) => continue,
                        },
                        _ = token.cancelled() => {}
                        _ = tokio::time::sleep_until(deadline) => {}
                    }
                    break;
                }
            }
            Watch::note(&n, &s, &line);
        });
        Watch {
            noticed,
            signal,
            task,
        }
    }

    /// Records the first notice (and prints it: a killed worker's section
    /// ends there).
    fn note(noticed: &AtomicU64, signal: &CancellationToken, line: &str) {
        let now = monotonic_ns();
        if noticed
            .compare_exchange(0, now, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            emit(format!("noticed {line} t={now}"));
        }
        signal.cancel();
    }

    /// `is_lost()` before a step: `true` if the section must end.
    fn lost(&self, lease: &Lease, line: &str) -> bool {
        if lease.status().is_lost() {
            Watch::note(&self.noticed, &self.signal, line);
        }
        self.noticed().is_some()
    }

    fn noticed(&self) -> Option<u64> {
        Some(self.noticed.load(Ordering::SeqCst)).filter(|t| *t != 0)
    }

    /// Holds for `d`, or until the loss is noticed.
    async fn hold(&self, d: Duration) {
        tokio::select! {
            _ = tokio::time::sleep(d) => {}
            _ = self.signal.cancelled() => {}
        }
    }

    /// Stops watching, as the holder calls release (or commit): a loss
    /// noticed from now on is the release's. Returns the notice, if any.
    fn stop(&self) -> Option<u64> {
        let _ = self
            .noticed
            .compare_exchange(0, u64::MAX, Ordering::SeqCst, Ordering::SeqCst);
        self.task.abort();
        self.noticed().filter(|t| *t != u64::MAX)
    }
}

/// The loop of one task of a worker in the seeded fault runs.
pub async fn task_loop(task: usize, cfg: &Config, kinds: &Kinds, stop: &CancellationToken) {
    while !stop.is_cancelled() {
        let p = pick(cfg);
        let t_call = monotonic_ns();
        let acquired = tokio::select! {
            r = kinds.acquire(&p) => r,
            _ = stop.cancelled() => break,
        };
        let held = match acquired {
            Ok(Some(held)) => held,
            Ok(None) => {
                // The key is held: a job that runs at most once per minimum
                // hold comes back later.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
            Err(e) => {
                emit(format!(
                    "err op=acquire kind={} key={} msg={}",
                    p.kind,
                    p.key,
                    one_line(&e.to_string())
                ));
                if e.is_shutdown() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        section(task, cfg, kinds, &p, t_call, held).await;
    }
}

/// One critical section, from the acquisition to the `cs` line.
async fn section(task: usize, cfg: &Config, kinds: &Kinds, p: &Pick, t_call: u64, held: Held) {
    let t_acq = monotonic_ns();
    let tok = held.lease().fencing_token() as i64;
    let key = p.key;
    let shape = format!(
        "kind={} permits={} hold_ms={}",
        p.kind,
        if p.kind == "p" { PERMITS } else { 0 },
        p.hold_at_least_ms
    );
    let id = format!("w={} task={task} key={key} tok={tok}", cfg.name);
    emit(format!("acq {id} {shape} t_call={t_call} t={t_acq}"));
    let watch = Watch::start(held.lease(), id.clone());

    // 1. Claim: the fenced counter, or the document read with the lease.
    let counter = matches!(p.kind, "x" | "h" | "e");
    let (claim_step, n_read, prev_last, claim_lost) = match &held {
        _ if counter && watch.lost(held.lease(), &id) => (Step::Skipped, 0, 0, false),
        _ if counter => claim(&kinds.counters, key, tok, held.lease()).await,
        Held::Document(d) => {
            let n = d.document().get_i64("n").unwrap_or_default();
            let last = d.document().get_i64("last").unwrap_or_default();
            (Step::Ok, n, last, false)
        }
        _ => (Step::Skipped, 0, 0, false),
    };
    if claim_step == Step::Ok {
        emit(format!(
            "claimed {id} n={n_read} last={prev_last} t={}",
            monotonic_ns()
        ));
    }

    // 2. Hold, in slices, each after an `is_lost()` check.
    let hold = if rand::rng().random_range(0..100) < cfg.long_hold_pct {
        cfg.ttl_ms / 2
    } else {
        rand::rng().random_range(cfg.hold_min_ms..=cfg.hold_max_ms)
    };
    let until = tokio::time::Instant::now() + Duration::from_millis(hold);
    while !watch.lost(held.lease(), &id) && tokio::time::Instant::now() < until {
        let slice = (until - tokio::time::Instant::now()).min(Duration::from_millis(50));
        watch.hold(slice).await;
    }

    // 3. Write (and, for a document, maybe release in the same write).
    let mut held = Some(held);
    let mut released = None;
    let mut noticed = None;
    let (write_step, write_lost) =
        if claim_step != Step::Ok || watch.lost(held.as_ref().unwrap().lease(), &id) {
            (Step::Skipped, false)
        } else if counter {
            let lease = held.as_ref().unwrap().lease();
            write(&kinds.counters, key, tok, n_read, lease).await
        } else {
            let Some(Held::Document(mut d)) = held.take() else {
                unreachable!("a claimed section without a counter is a document's")
            };
            let update = doc! { "$set": { "n": n_read + 1, "last": tok } };
            if rand::rng().random_bool(0.5) {
                // Commit: the write ends the section, as a release does.
                watch.lost(d.lease(), &id);
                noticed = watch.stop();
                released = Some(monotonic_ns());
                emit(format!("releasing {id} t={}", released.unwrap()));
                match d.commit(update).await {
                    Ok(_) => (Step::Ok, false),
                    Err(e) if e.is_lease_lost() => (Step::Refused, true),
                    Err(e) => {
                        emit(format!(
                            "err op=commit key={key} msg={}",
                            one_line(&e.to_string())
                        ));
                        (Step::Unknown, false)
                    }
                }
            } else {
                let outcome = match d.update(update).await {
                    Ok(_) => (Step::Ok, false),
                    Err(e) if e.is_lease_lost() => (Step::Refused, d.lease().status().is_lost()),
                    Err(e) => {
                        emit(format!(
                            "err op=update key={key} msg={}",
                            one_line(&e.to_string())
                        ));
                        (Step::Unknown, false)
                    }
                };
                held = Some(Held::Document(d));
                outcome
            }
        };

    // 4. Release (unless committed).
    if let Some(held) = &held {
        watch.lost(held.lease(), &id);
        noticed = watch.stop();
    }
    let t_rel = released.unwrap_or_else(monotonic_ns);
    let release = match held {
        Some(held) => {
            emit(format!("releasing {id} t={t_rel}"));
            held.release().await
        }
        None => "committed".to_string(),
    };
    let t_end = noticed.unwrap_or(t_rel);
    emit(format!(
        "cs {id} {shape} t_call={t_call} t_acq={t_acq} t_end={t_end} t_lost={} \
         claim={} claim_lost={} n={n_read} last={prev_last} write={} write_lost={} \
         lost={} release={release}",
        noticed.unwrap_or(0),
        claim_step.as_str(),
        claim_lost as u8,
        write_step.as_str(),
        write_lost as u8,
        noticed.is_some() as u8,
    ));
}
