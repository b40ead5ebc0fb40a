//! What the simulated processes do: tasks that acquire a key of some kind
//! (waiting, trying, or with a timeout), hold it for a while (a quarter of
//! the holds past the TTL, on renewals) checking `is_lost()`, then release
//! or drop it; a task that acquires several keys at once; an operator; another
//! application that locks a key with a document of its own; a client that
//! locks a user document by its `LockId` / `LockTime` fields; the TTL
//! monitor. Everything a holder sees, and what its releases answer, is
//! recorded in the [`History`].

use std::collections::BTreeMap;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mongodb::bson::Document;
use tokio::task::{AbortHandle, JoinHandle};
use tokio::time::{Instant, sleep};
use tokio_util::time::FutureExt as _;

use super::durations;
use super::expiry;
use super::faults::CLOCK_STEP_BACK;
use super::history::{At, Event, History, Kind, LeaseNo, OpNo, WaiterNo};
use crate::config::AcquireOptions;
use crate::document::{DEFAULT_LEASE_FIELD, DocumentLease};
use crate::election::{Election, Leadership};
use crate::error::Result;
use crate::lease::Lease;
use crate::manager::LeaseManager;
use crate::random::random_range;
use crate::request::Acquire;
use crate::semaphore::Semaphore;
use crate::status::{LeaseEvent, ReleaseOutcome};
use crate::store::memory::{MemoryDb, MemoryStore};

/// The user collection of in-document leases.
pub const DOCUMENTS: &str = "jobs";

/// The user collection of in-document leases that keep `LockId` /
/// `LockTime` for another client ([`lock_id_client`]).
pub const LOCK_ID_DOCUMENTS: &str = "lock_id_jobs";

/// That client's `maxDuration`: the TTL (3 s) plus more than its largest
/// clock skew ([`LOCK_ID_SKEW_MAX`]) and the server clock's step back.
pub const LOCK_ID_MAX: Duration = Duration::from_secs(4);

/// How far ahead of the server's clock that client's clock may run.
pub const LOCK_ID_SKEW_MAX: Duration = Duration::from_millis(500);

/// The longest TTL a lease of [`LOCK_ID_DOCUMENTS`] takes: what
/// `LockIdFields` asks of its `max_duration` (the TTL plus the largest clock
/// skew, and here the server clock's step back) holds for it. Up to
/// [`LOCK_ID_MAX`] (which `set_ttl` accepts), that client, its clock ahead,
/// may take a renewed lease over before its local deadline, as documented.
pub const LOCK_ID_TTL_MOST: Duration = LOCK_ID_MAX
    .saturating_sub(LOCK_ID_SKEW_MAX)
    .saturating_sub(CLOCK_STEP_BACK);

/// The fields of [`LOCK_ID_DOCUMENTS`].
pub fn lock_id_fields() -> crate::lock_id_fields::LockIdFields {
    crate::lock_id_fields::LockIdFields::builder()
        .max_duration(LOCK_ID_MAX)
        .build()
}

/// The history being recorded, shared by every task of the run.
#[derive(Clone)]
pub struct Recorder(Arc<Mutex<Recording>>);

struct Recording {
    t0: Instant,
    history: History,
    next: u64,
    /// The live exclusive leases of the lock collection that
    /// [`expiry::watch`] follows, until released or their process crashed.
    followed: BTreeMap<LeaseNo, expiry::Followed>,
}

impl Recorder {
    /// A recorder whose instants count from `t0`.
    pub fn new(t0: Instant) -> Self {
        Recorder(Arc::new(Mutex::new(Recording {
            t0,
            history: History::new(),
            next: 0,
            followed: BTreeMap::new(),
        })))
    }

    /// `at` as an instant of the history.
    pub fn at(&self, at: Instant) -> At {
        at.saturating_duration_since(self.0.lock().expect("recorder").t0)
    }

    /// Records `event` now.
    pub fn push(&self, event: Event) {
        let mut r = self.0.lock().expect("recorder");
        match &event {
            Event::Released { lease } => {
                r.followed.remove(lease);
            }
            Event::Crashed { manager } => r.followed.retain(|_, f| f.manager != *manager),
            _ => {}
        }
        let at = Instant::now().saturating_duration_since(r.t0);
        r.history.push(at, event);
    }

    /// Follows `lease` (a live exclusive lease of the lock collection) for
    /// [`expiry::watch`].
    pub(super) fn follow(&self, lease: LeaseNo, followed: expiry::Followed) {
        self.0
            .lock()
            .expect("recorder")
            .followed
            .insert(lease, followed);
    }

    /// What `gap` finds of each followed lease, by lease.
    pub(super) fn followed_gaps<T>(
        &self,
        mut gap: impl FnMut(&mut expiry::Followed) -> Option<T>,
    ) -> Vec<(LeaseNo, T)> {
        let mut r = self.0.lock().expect("recorder");
        r.followed
            .iter_mut()
            .filter_map(|(lease, followed)| gap(followed).map(|found| (*lease, found)))
            .collect()
    }

    /// A fresh number for a lease, waiter or operator call.
    pub fn number(&self) -> u64 {
        let mut r = self.0.lock().expect("recorder");
        r.next += 1;
        r.next
    }

    /// The history so far.
    pub fn history(&self) -> History {
        self.0.lock().expect("recorder").history.clone()
    }
}

/// One simulated process: a manager over its own store (a connection to
/// the shared twin).
pub struct Process {
    /// Its number in the history.
    pub index: usize,
    /// Its manager.
    pub manager: LeaseManager,
    /// Its store (knobs shared with the actor's).
    pub store: MemoryStore,
    /// Whether it releases in delete mode.
    pub delete_mode: bool,
    /// Its manager's `clock_skew`, which its local deadlines keep short of
    /// the server's expiry besides the safety margin.
    pub clock_skew: Duration,
    /// Its tasks, aborted when it crashes.
    pub tasks: Mutex<Vec<AbortHandle>>,
    /// Set when it crashed.
    pub crashed: AtomicBool,
}

impl Process {
    /// Spawns `task` as one of this process's tasks.
    pub fn spawn(&self, task: impl Future<Output = ()> + Send + 'static) -> JoinHandle<()> {
        let handle = tokio::spawn(task);
        let tasks = &mut self.tasks.lock().expect("tasks");
        tasks.push(handle.abort_handle());
        handle
    }

    /// The process crashes now: its tasks stop, nothing it sends from now
    /// on arrives, its leases are never released.
    pub fn crash(&self, recorder: &Recorder) {
        self.crashed.store(true, Ordering::SeqCst);
        recorder.push(Event::Crashed {
            manager: self.index,
        });
        for task in self.tasks.lock().expect("tasks").drain(..) {
            task.abort();
        }
        self.store.crash();
        self.store
            .document_store(DOCUMENTS, DEFAULT_LEASE_FIELD)
            .crash();
        self.store
            .document_store(LOCK_ID_DOCUMENTS, DEFAULT_LEASE_FIELD)
            .crash();
    }
}

/// What a task asks for.
#[derive(Debug, Clone)]
pub enum Role {
    /// Exclusive leases of a key, some with a minimum hold.
    Exclusive {
        /// The key.
        key: &'static str,
        /// Whether it may ask for `hold_at_least`.
        hold: bool,
    },
    /// Shared leases of a key.
    Shared(&'static str),
    /// Permits of a semaphore.
    Permit(&'static str, u32),
    /// Leadership of an election.
    Leader(&'static str),
    /// In-document leases of a document of [`DOCUMENTS`].
    Document(&'static str),
    /// In-document leases of a document of [`LOCK_ID_DOCUMENTS`].
    LockIdDocument(&'static str),
}

impl Role {
    /// The longest TTL its leases take ([`LOCK_ID_TTL_MOST`] for a
    /// [`LOCK_ID_DOCUMENTS`] document).
    fn ttl_most(&self) -> Duration {
        match self {
            Role::LockIdDocument(_) => LOCK_ID_TTL_MOST,
            _ => Duration::MAX,
        }
    }

    fn key(&self) -> String {
        match self {
            Role::Exclusive { key, .. }
            | Role::Shared(key)
            | Role::Permit(key, _)
            | Role::Leader(key) => format!("locks/{key}"),
            Role::Document(id) => format!("{DOCUMENTS}/{id}"),
            Role::LockIdDocument(id) => format!("{LOCK_ID_DOCUMENTS}/{id}"),
        }
    }

    /// The kind of its leases, taking `taken` permits of a semaphore.
    fn kind(&self, taken: u32) -> Kind {
        match self {
            Role::Shared(_) => Kind::Shared,
            Role::Permit(_, n) => Kind::Permit(*n, taken),
            _ => Kind::Exclusive,
        }
    }
}

/// How a task waits.
#[derive(Debug, Clone, Copy)]
enum Mode {
    Wait,
    Try,
    Timeout(Duration),
}

/// A held lease of any kind.
enum Held {
    Lease(Lease),
    Leader(Leadership),
    Document(DocumentLease<Document>),
}

impl Held {
    fn lease(&self) -> &Lease {
        match self {
            Held::Lease(lease) => lease,
            Held::Leader(leadership) => leadership.lease(),
            Held::Document(document) => document.lease(),
        }
    }

    /// Releases it; whether the release answered released (not lost, not
    /// an error).
    async fn release(self) -> bool {
        let outcome = match self {
            Held::Lease(lease) => lease.release().await,
            Held::Leader(leadership) => leadership.resign().await,
            Held::Document(document) => document.release().await,
        };
        matches!(outcome, Ok(ReleaseOutcome::Released))
    }
}

pub(super) fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `request` with `options` (as drawn for an exclusive lease).
fn with<'a, K, W>(mut request: Acquire<'a, K, W>, options: &AcquireOptions) -> Acquire<'a, K, W> {
    if let Some(ttl) = options.ttl {
        request = request.ttl(ttl);
    }
    if let Some(at_least) = options.hold_at_least {
        request = request.hold_at_least(at_least);
    }
    if let Some(at_most) = options.hold_at_most {
        request = request.hold_at_most(at_most);
    }
    if let Some(payload) = options.payload.clone() {
        request = request.payload(payload);
    }
    request
}

/// `acquire`'s result, or none if it takes longer than `t`.
pub(super) async fn timed<T>(
    acquire: impl IntoFuture<Output = Result<T>>,
    t: Duration,
) -> Result<Option<T>> {
    acquire.into_future().timeout(t).await.ok().transpose()
}

/// Acquires for `role`; an exclusive lease with `options` (its minimum or
/// maximum hold, its payload).
async fn acquire(
    process: &Process,
    role: &Role,
    mode: Mode,
    options: &AcquireOptions,
    taken: u32,
) -> Result<Option<Held>> {
    let manager = &process.manager;
    let lease = |r: Result<Lease>| r.map(|l| Some(Held::Lease(l)));
    let some = |r: Result<Option<Lease>>| r.map(|l| l.map(Held::Lease));
    match role {
        Role::Exclusive { key, .. } => match mode {
            Mode::Wait => lease(with(manager.acquire(*key), options).await),
            Mode::Try => some(with(manager.try_acquire(*key), options).await),
            Mode::Timeout(t) => some(timed(with(manager.acquire(*key), options), t).await),
        },
        Role::Shared(key) => match mode {
            Mode::Wait => lease(manager.acquire(*key).shared().await),
            Mode::Try => some(manager.try_acquire(*key).shared().await),
            Mode::Timeout(t) => some(timed(manager.acquire(*key).shared(), t).await),
        },
        Role::Permit(key, n) => {
            let semaphore = Semaphore::new(manager, *key, *n)?;
            match mode {
                Mode::Wait => lease(semaphore.acquire().permits(taken).await),
                Mode::Try => some(semaphore.try_acquire().permits(taken).await),
                Mode::Timeout(t) => some(timed(semaphore.acquire().permits(taken), t).await),
            }
        }
        Role::Leader(name) => {
            let election = Election::new(manager, *name)?;
            let won = match mode {
                Mode::Wait => election.campaign().await.map(Some),
                Mode::Try => election.try_campaign().await,
                Mode::Timeout(t) => timed(election.campaign(), t).await,
            };
            won.map(|l| l.map(Held::Leader))
        }
        Role::Document(id) => {
            let documents = manager.documents::<Document>(DOCUMENTS).await?;
            let held = match mode {
                Mode::Wait => documents.acquire(*id).await.map(Some),
                Mode::Try => documents.try_acquire(*id).await,
                Mode::Timeout(t) => timed(documents.acquire(*id), t).await,
            };
            held.map(|d| d.map(Held::Document))
        }
        Role::LockIdDocument(id) => {
            let documents = manager
                .documents::<Document>(LOCK_ID_DOCUMENTS)
                .lock_id(lock_id_fields())
                .await?;
            let held = match mode {
                Mode::Wait => documents.acquire(*id).await.map(Some),
                Mode::Try => documents.try_acquire(*id).await,
                Mode::Timeout(t) => timed(documents.acquire(*id), t).await,
            };
            held.map(|d| d.map(Held::Document))
        }
    }
}

/// Records a wait of a task of `process` for `key` around `acquire`;
/// returns what `acquire` returned and when the wait started.
pub(super) async fn wait<T>(
    recorder: &Recorder,
    process: &Process,
    key: String,
    acquire: impl Future<Output = Result<Option<T>>>,
) -> (Result<Option<T>>, Instant) {
    let waiter: WaiterNo = recorder.number();
    recorder.push(Event::WaitStarted {
        waiter,
        manager: process.index,
        key,
    });
    let waited_from = Instant::now();
    let result = acquire.await;
    recorder.push(Event::WaitEnded {
        waiter,
        outcome: match &result {
            Ok(Some(_)) => "granted".into(),
            Ok(None) => "none".into(),
            Err(error) => format!("error: {error}"),
        },
    });
    (result, waited_from)
}

/// Records `lease`, just granted, and follows its events (renewals, its
/// loss) in a task of `process`. Returns its number.
pub(super) fn granted(
    recorder: &Recorder,
    process: &Process,
    (key, kind): (String, Kind),
    lease: &Lease,
    (waited_from, hold): (Instant, Option<Duration>),
) -> LeaseNo {
    let mut events = lease.status().events();
    let number = recorder.number();
    let now = Instant::now();
    let deadline = lease.status().deadline().unwrap_or(now);
    // The server took the key under this lease id at one of the waiter's
    // attempts (a retry keeps that acquisition's minimum hold), all sent
    // after the wait started.
    let acquired_after = waited_from;
    // A local deadline is a confirmed write's send + validity (or less):
    // the TTL less the safety margin and the clock skew.
    let confirmed_after = deadline.checked_sub(lease.ttl()).map_or(now, |d| {
        (d + super::SAFETY_MARGIN + process.clock_skew).min(now)
    });
    // An exclusive lease of the lock collection: its document's expiry.
    let document = (kind == Kind::Exclusive)
        .then(|| key.strip_prefix("locks/"))
        .flatten()
        .map(|name| {
            (
                process.store.db().clone(),
                name.to_string(),
                lease.fencing_token(),
            )
        });
    recorder.push(Event::Granted {
        lease: number,
        manager: process.index,
        key,
        kind,
        token: lease.fencing_token(),
        deadline: recorder.at(deadline),
        acquired_after: recorder.at(acquired_after),
        confirmed_after: recorder.at(confirmed_after),
        hold_at_least: hold,
    });
    if let Some((db, name, token)) = &document {
        expiry::record(recorder, db, name, number, *token);
        let followed = expiry::Followed {
            manager: process.index,
            key: name.as_str().into(),
            token: *token,
            state: lease.status().state().clone(),
            recorded: false,
        };
        recorder.follow(number, followed);
    }
    let follower = recorder.clone();
    process.spawn(async move {
        while let Some(event) = events.recv().await {
            match event {
                LeaseEvent::Renewed { deadline, .. } => {
                    follower.push(Event::Renewed {
                        lease: number,
                        deadline: follower.at(deadline),
                    });
                    if let Some((db, name, token)) = &document {
                        expiry::record(&follower, db, name, number, *token);
                    }
                }
                LeaseEvent::RevocationRequested { .. } => {
                    follower.push(Event::RevocationTold { lease: number })
                }
                LeaseEvent::Lost(reason) => follower.push(Event::Told {
                    lease: number,
                    reason: reason.to_string(),
                }),
                _ => {}
            }
        }
    });
    number
}

/// The options of an exclusive acquisition of `role` with the minimum hold
/// `hold`: now and then held at most a while or with a payload (see
/// `durations`), after an inspection of the key by `process`.
async fn exclusive_options(
    recorder: &Recorder,
    process: &Process,
    role: &Role,
    hold: Option<Duration>,
) -> AcquireOptions {
    let Role::Exclusive { key, .. } = role else {
        return AcquireOptions::default();
    };
    durations::inspect(recorder, process, key, role.key()).await;
    let mut options = durations::draw(hold);
    options.hold_at_least = hold;
    options
}

/// A task of `process` that loops on `role` until `stop`.
pub async fn worker(recorder: Recorder, process: Arc<Process>, role: Role, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        let mode = match random_range(0..4) {
            0 | 1 => Mode::Wait,
            2 => Mode::Try,
            _ => Mode::Timeout(ms(random_range(1..3_000))),
        };
        let hold = match role {
            Role::Exclusive { hold: true, .. } if random_range(0..2) == 0 => {
                Some(ms(random_range(1..2_000)))
            }
            _ => None,
        };
        let options = exclusive_options(&recorder, &process, &role, hold).await;
        // A third of the permit acquisitions take several at once.
        let taken = match role {
            Role::Permit(_, n) if random_range(0..3) == 0 => random_range(1..=n),
            _ => 1,
        };
        let acquired = acquire(&process, &role, mode, &options, taken);
        let (result, waited_from) = wait(&recorder, &process, role.key(), acquired).await;
        match result {
            Ok(Some(held)) => {
                let number = granted(
                    &recorder,
                    &process,
                    (role.key(), role.kind(taken)),
                    held.lease(),
                    (waited_from, hold),
                );
                durations::granted(&recorder, number, held.lease(), &options);
                // A hold past the TTL lives on its renewals (and its
                // local deadline matters when they fail).
                let hold = match random_range(0..4) {
                    0 => random_range(1_500..8_000),
                    _ => random_range(0..1_500),
                };
                let until = Instant::now() + ms(hold);
                // Holds end when work stops, so that waiters are served.
                while Instant::now() < until
                    && !held.lease().status().is_lost()
                    && !stop.load(Ordering::SeqCst)
                {
                    sleep(ms(random_range(1..200))).await;
                    durations::maybe_set_ttl(held.lease(), &options, role.ttl_most()).await;
                }
                recorder.push(Event::Released { lease: number });
                if random_range(0..4) == 0 {
                    drop(held);
                } else {
                    let released = held.release().await;
                    recorder.push(Event::ReleaseAnswered {
                        lease: number,
                        released,
                    });
                }
            }
            Ok(None) => {}
            Err(_) => sleep(ms(random_range(1..100))).await,
        }
        sleep(ms(random_range(0..300))).await;
    }
}

/// A task of `process` that now and then acquires two to four keys of its
/// own (no other task uses them) at once, holds them a while and releases
/// them all at once, until `stop`: its actor groups those acquires and
/// releases (the grouped light forms). Half the time an operator (through
/// `operator`, another manager) force releases one of them just before: a
/// lease its holder may not know lost yet when it releases it, whose
/// release must answer "already lost".
pub async fn several(
    recorder: Recorder,
    process: Arc<Process>,
    operator: Arc<Process>,
    stop: Arc<AtomicBool>,
) {
    let keys = [0, 1, 2, 3].map(|i| format!("s{}-{i}", process.index));
    while !stop.load(Ordering::SeqCst) {
        // All at once: the manager groups the light acquires asked for
        // while one is in flight (the grouped light acquire).
        let acquires = keys[..random_range(2..=keys.len())].iter().map(|key| {
            let (recorder, process) = (recorder.clone(), process.clone());
            async move {
                let acquired = process.manager.try_acquire(key.as_str()).into_future();
                let key = format!("locks/{key}");
                let (result, waited_from) = wait(&recorder, &process, key.clone(), acquired).await;
                let lease = result.ok().flatten()?;
                let key = (key, Kind::Exclusive);
                let number = granted(&recorder, &process, key, &lease, (waited_from, None));
                Some((number, lease))
            }
        });
        let held: Vec<_> = futures::future::join_all(acquires)
            .await
            .into_iter()
            .flatten()
            .collect();
        idle(Instant::now() + ms(random_range(0..1_500)), &stop).await;
        if !held.is_empty() && random_range(0..2) == 0 && !operator.crashed.load(Ordering::SeqCst) {
            let key = &keys[random_range(0..held.len())];
            let immediately = random_range(0..2) == 0;
            force_release(&recorder, &operator, key, immediately).await;
        }
        for (number, _) in &held {
            recorder.push(Event::Released { lease: *number });
        }
        let releases = held.into_iter().map(|(number, lease)| {
            let recorder = recorder.clone();
            async move {
                let released = Held::Lease(lease).release().await;
                recorder.push(Event::ReleaseAnswered {
                    lease: number,
                    released,
                });
            }
        });
        futures::future::join_all(releases).await;
        // Now and then, so that the simulation's pace stays that of the
        // other tasks; no later than work stops.
        idle(Instant::now() + ms(random_range(2_000..8_000)), &stop).await;
    }
}

/// Sleeps in short steps until `until`, or until `stop`.
pub(super) async fn idle(until: Instant, stop: &AtomicBool) {
    while Instant::now() < until && !stop.load(Ordering::SeqCst) {
        sleep(ms(random_range(1..200))).await;
    }
}

/// A force release of `key` by `process`'s manager, by default (no new
/// holder before the old one was told or its deadline passed) or
/// `immediately` (after the lock-delay only): records its start, the lease
/// of ours it ended, its lock-delay and its end; whether it returned
/// without an error.
async fn force_release(
    recorder: &Recorder,
    process: &Process,
    key: &str,
    immediately: bool,
) -> bool {
    let op: OpNo = recorder.number();
    recorder.push(Event::ForceReleaseStarted {
        op,
        key: format!("locks/{key}"),
        immediately,
    });
    let forced = overrides::force_release(&process.manager, key, immediately).await;
    if let Ok(Some(info)) = &forced
        && !info.foreign
    {
        recorder.push(Event::Overridden {
            op,
            token: Some(info.fencing_token),
        });
    }
    lock_delay(recorder, op, process, ended_ours(&forced));
    recorder.push(Event::OpEnded {
        op,
        ok: forced.is_ok(),
    });
    forced.is_ok()
}

/// The operator's overrides, by default or `immediately`.
mod overrides {
    use crate::manager::LeaseManager;

    /// `manager.force_release(key)`, or `.immediately()`.
    pub(super) async fn force_release(
        manager: &LeaseManager,
        key: &str,
        immediately: bool,
    ) -> crate::error::Result<Option<crate::info::LeaseInfo>> {
        match immediately {
            true => manager.force_release(key).immediately().await,
            false => manager.force_release(key).await,
        }
    }

    /// `manager.release_owner(owner)`, or `.immediately()`.
    pub(super) async fn release_owner(
        manager: &LeaseManager,
        owner: &str,
        immediately: bool,
    ) -> crate::error::Result<u64> {
        match immediately {
            true => manager.release_owner(owner).immediately().await,
            false => manager.release_owner(owner).await,
        }
    }
}

/// An operator in `process`: force releases keys and releases other
/// managers' owner ids, now and then, until `stop`; three in four by
/// default, the others immediately.
pub async fn operator(
    recorder: Recorder,
    process: Arc<Process>,
    owners: Vec<String>,
    keys: Vec<&'static str>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        sleep(ms(random_range(1_000..8_000))).await;
        let op: OpNo = recorder.number();
        let immediately = random_range(0..4) == 0;
        let ok = if random_range(0..3) == 0 {
            let victim = random_range(0..owners.len());
            let ok = release_owner(&recorder, &process, op, (victim, &owners), immediately).await;
            // One call in four goes on to every other owner id, one at a
            // time (no draw of its own, so that the schedule's draws stay
            // as they were): a shared or semaphore key whose holders'
            // owners are released one at a time must be delayed by the
            // last call.
            if op % 4 == 0 {
                recorder.push(Event::OpEnded { op, ok });
                for next in (1..owners.len()).map(|i| (victim + i) % owners.len()) {
                    let op: OpNo = recorder.number();
                    let ok =
                        release_owner(&recorder, &process, op, (next, &owners), immediately).await;
                    recorder.push(Event::OpEnded { op, ok });
                }
                continue;
            }
            ok
        } else if op % 4 == 0 || (recorder.at(Instant::now()) >= super::FAULTS_STOP && op % 2 == 1)
        {
            // A request to release (without a draw of its own, so that
            // the schedule's draws stay as they were), more often once the
            // faults stopped (the revocation property's time).
            let key = keys[random_range(0..keys.len())];
            let key = if key == "leader" { "x0" } else { key };
            recorder.push(Event::ReleaseRequested {
                op,
                key: format!("locks/{key}"),
            });
            matches!(process.manager.request_release(key).await, Ok(true))
        } else {
            let key = keys[random_range(0..keys.len())];
            force_release(&recorder, &process, key, immediately).await;
            continue;
        };
        recorder.push(Event::OpEnded { op, ok });
    }
}

/// A task of `process` that reads one of `keys` now and then and records
/// the owners it shows waiting (`LeaseInfo::waiters`; owner ids `m<i>`),
/// its token, owner and leader transitions (another application's lock
/// too, when it shows a token), until `stop`.
pub async fn inspector(
    recorder: Recorder,
    process: Arc<Process>,
    keys: Vec<&'static str>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        sleep(ms(random_range(50..500))).await;
        let key = keys[random_range(0..keys.len())];
        let Ok(Some(info)) = process.manager.inspect(key).await else {
            continue;
        };
        let waiting = info
            .waiters
            .iter()
            .map(|w| w.owner_id.strip_prefix('m').and_then(|i| i.parse().ok()))
            .collect();
        // Every read that shows a fencing token, another application's lock
        // included: a document of ours it took over in place still carries
        // our `tok`, which must not read as its term.
        recorder.push(Event::WaitersRead {
            key: format!("locks/{key}"),
            waiting,
            term: (info.fencing_token != 0).then_some((
                info.fencing_token,
                info.owner_id,
                info.transitions,
            )),
        });
    }
}

/// A task of `process` that now and then changes the number of permits of
/// the semaphore key `key` to one of `numbers` (`Semaphore::set_permits`),
/// recording each change the server applied, until `stop`. Tasks asking
/// for another number get `KindMismatch` meanwhile.
pub async fn resizer(
    recorder: Recorder,
    process: Arc<Process>,
    key: &'static str,
    numbers: [u32; 2],
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        sleep(ms(random_range(200..3_000))).await;
        let permits = numbers[random_range(0..2)];
        let Ok(mut semaphore) = Semaphore::new(&process.manager, key, permits) else {
            return;
        };
        let started = recorder.at(Instant::now());
        let unknown = match semaphore.set_permits(permits).await {
            Ok(crate::kind::PermitsChange::Set) => false,
            Err(error) if error.is_transient() => true,
            _ => continue,
        };
        recorder.push(Event::PermitsSet {
            key: format!("locks/{key}"),
            permits,
            started,
            unknown,
        });
    }
}

/// Once the faults stopped, asks the holders of `keys` to release them
/// through `process` every 50 to 400 ms, every other time those of
/// `often` (the revocable holder's key), until `stop` (the revocation
/// property's requests).
pub async fn requester(
    recorder: Recorder,
    process: Arc<Process>,
    (keys, often): (Vec<&'static str>, &'static str),
    stop: Arc<AtomicBool>,
) {
    while recorder.at(Instant::now()) < super::FAULTS_STOP {
        sleep(ms(100)).await;
    }
    let mut turn = 0;
    while !stop.load(Ordering::SeqCst) {
        sleep(ms(random_range(50..400))).await;
        let op: OpNo = recorder.number();
        turn += 1;
        let key = if turn % 2 == 0 {
            often
        } else {
            keys[random_range(0..keys.len())]
        };
        recorder.push(Event::ReleaseRequested {
            op,
            key: format!("locks/{key}"),
        });
        let ok = matches!(process.manager.request_release(key).await, Ok(true));
        recorder.push(Event::OpEnded { op, ok });
    }
}

/// Whether a force release ended a lease of ours (not a foreign
/// holder's lock).
fn ended_ours(forced: &crate::error::Result<Option<crate::info::LeaseInfo>>) -> bool {
    matches!(forced, Ok(Some(info)) if !info.foreign)
}

/// The operator's call `op` through `process` that releases the leases of
/// owner id `owners[victim]` (its manager's), recording its start, whether
/// it ended some, and its lock-delay (not its end); whether it returned
/// without an error.
async fn release_owner(
    recorder: &Recorder,
    process: &Process,
    op: OpNo,
    (victim, owners): (usize, &[String]),
    immediately: bool,
) -> bool {
    recorder.push(Event::OwnerReleaseStarted {
        op,
        manager: victim,
        immediately,
    });
    let released = overrides::release_owner(&process.manager, &owners[victim], immediately).await;
    if matches!(released, Ok(n) if n > 0) {
        recorder.push(Event::Overridden { op, token: None });
    }
    lock_delay(recorder, op, process, released.is_ok());
    released.is_ok()
}

/// Records the lock-delay of the operator's call `op` through `process`,
/// if it `ended` leases (a force release that ended a lease of ours, a
/// release by owner id that returned without an error) and the delay is
/// not zero.
fn lock_delay(recorder: &Recorder, op: OpNo, process: &Process, ended: bool) {
    let delay = process.manager.lock_delay();
    if ended && !delay.is_zero() {
        recorder.push(Event::LockDelay { op, delay });
    }
}

/// A client that locks the document `id` of [`LOCK_ID_DOCUMENTS`] (`db`,
/// the twin's collection) by its own `LockId` / `LockTime` rule, exactly
/// as its `findOneAndUpdate` and `updateOne` do (`MemoryDb::lock_by_id`,
/// `MemoryDb::unlock_by_id`), with [`LOCK_ID_MAX`] as its `maxDuration`
/// and a clock ahead of the server's by up to [`LOCK_ID_SKEW_MAX`]: it
/// holds the document a while, perhaps past `maxDuration` (then a manager
/// may take it over), and unlocks it, until `stop`.
pub async fn lock_id_client(
    recorder: Recorder,
    db: MemoryDb,
    id: &'static str,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        sleep(ms(random_range(100..3_000))).await;
        let skew = random_range(0..=LOCK_ID_SKEW_MAX.as_millis() as i64);
        let now = db.date(db.server_now()).timestamp_millis() + skew;
        let now = mongodb::bson::DateTime::from_millis(now);
        let Some(lock_id) = db.lock_by_id(id, now, LOCK_ID_MAX) else {
            continue;
        };
        let key = format!("{LOCK_ID_DOCUMENTS}/{id}");
        // Free by our rule once the server's clock passes `LockTime +
        // maxDuration` (1 ms after, by its strict `<`).
        let expires_in = LOCK_ID_MAX + ms(skew as u64 + 1);
        recorder.push(Event::ForeignTaken {
            key: key.clone(),
            owner: lock_id.to_string(),
            expires_in: Some(expires_in),
        });
        sleep(ms(random_range(10..6_000))).await;
        recorder.push(Event::ForeignRemoved { key });
        db.unlock_by_id(id, lock_id);
    }
}
