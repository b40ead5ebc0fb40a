//! [`MemoryStore`]: an in-memory twin of the lock protocol, for the actor's
//! timing tests under tokio's paused clock. Never a stand-in for MongoDB.
//!
//! A [`MemoryDb`] is the shared "lock collection": one [`Doc`] per key. Each
//! [`MemoryStore`] (from [`MemoryDb::store`]) is one manager's view of it, with
//! its own owner id and TTL, so several managers can compete on one database.
//! "Server time" is [`tokio::time::Instant::now`] at the moment an operation
//! is applied, so everything is deterministic under `start_paused`.
//!
//! The rules are those of [`MongoStore`](super::MongoStore):
//!
//! - **acquire** wins if there is no document, or the document carries this
//!   lease id (a retry: token unchanged, expiry refreshed), or `exp <= now`
//!   and the key is not yielded by this owner (`yu > now`); the winner gets
//!   `token = previous + 1` and `exp = now + ttl`, without `wt` / `yu`. A key
//!   whose document was deleted continues from the deleted document's token:
//!   on MongoDB the time part of the token rule guarantees the same (see
//!   "Fencing tokens" in `store`), which a twin whose server time starts at
//!   the test's start cannot reproduce with the same token values.
//!   Otherwise the outcome is `Held { holder, remaining: exp - now }` (`yu -
//!   now` if yielded by this owner), and a `waiting` attempt on a lease held
//!   by another owner sets `wt` if unset.
//! - **renew** sets `exp = now + ttl` on documents whose key is among the
//!   leases' keys and whose lease id is among their lease ids (the same `$in`
//!   / `$in` filter as `MongoStore`; expiry is not checked, as on the server),
//!   and returns the keys that did not match.
//! - **release** sets `exp = min(exp, now)` and clears the lease id of the
//!   matching documents, and if `wt` is set clears it and sets `yu = now +
//!   yield window` (the store's, [`DEFAULT_RETRY_MAX`] unless set with
//!   [`MemoryStore::with_yield_window`]); returns how many matched.
//! - **release_owner(except)** does the same to every document of this owner
//!   that still has a lease id, not in `except`.
//!
//! What `MongoStore` does internally (re-reading after an ambiguous acquire,
//! retrying a release up to three times) is not modelled: a fault injected
//! here is what the actor would see after those internal steps failed too.
//!
//! Knobs, settable at any time from the test through a clone of the store
//! (clones share knobs and counters):
//!
//! - [`MemoryStore::set_latency`]: an operation sleeps this long on tokio time
//!   and is applied at the *end* of the sleep (a server that receives late).
//! - [`MemoryStore::set_fault`] / [`MemoryStore::fault_next`]: make operations
//!   hang forever, complete late, or fail with a transient
//!   [`Error::Unreachable`] (before or after applying).
//! - [`MemoryStore::set_operation_timeout`]: bound every operation like
//!   `MongoStore` does (off by default, so a hang is a hang).
//!
//! Knobs are read when the actor *calls* the method (when it issues the
//! command), not when the future is first polled.

// A test utility: not every helper is used by every test.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use mongodb::bson::Document;
use tokio::time::Instant;
use uuid::Uuid;

use super::{AcquireOutcome, LeaseRef, Store};
use crate::config::DEFAULT_RETRY_MAX;
use crate::error::{Error, Result};
use crate::lease::LeaseInfo;

/// One lock document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Doc {
    /// `aid`: owner id of the holder (or last holder).
    pub owner: String,
    /// `lid`: lease id of the current acquisition; `None` once released.
    pub lease_id: Option<Uuid>,
    /// `tok`: fencing token of the current (or last) acquisition.
    pub token: u64,
    /// `exp`: server time at which the lease expires.
    pub exp: Instant,
    /// `acq`: server time of the acquisition.
    pub acquired: Instant,
    /// `ts`: server time of the last acquire or renewal.
    pub renewed: Instant,
    /// `data`: the holder's payload.
    pub payload: Option<Document>,
    /// `wt`: when another owner first waited for the current lease.
    pub waiting_since: Option<Instant>,
    /// `yu`: until when the last holder yielded the key to waiting owners.
    pub yield_until: Option<Instant>,
}

impl Doc {
    /// A document held by `owner` from now for `ttl`, with token `token`.
    pub fn held(owner: &str, token: u64, ttl: Duration) -> Doc {
        let now = Instant::now();
        Doc {
            owner: owner.to_string(),
            lease_id: Some(Uuid::new_v4()),
            token,
            exp: now + ttl,
            acquired: now,
            renewed: now,
            payload: None,
            waiting_since: None,
            yield_until: None,
        }
    }

    /// A released document with token `token` (what an upsert starts from).
    fn vacant(now: Instant, token: u64) -> Doc {
        Doc {
            owner: String::new(),
            lease_id: None,
            token,
            exp: now,
            acquired: now,
            renewed: now,
            payload: None,
            waiting_since: None,
            yield_until: None,
        }
    }

    /// A new acquisition by `owner` under `lease_id` at `now`: token + 1,
    /// `exp = now + ttl`, no payload and no fairness marks. Returns the token.
    fn take(&mut self, owner: &str, lease_id: Uuid, ttl: Duration, now: Instant) -> u64 {
        *self = Doc {
            owner: owner.to_string(),
            lease_id: Some(lease_id),
            token: self.token + 1,
            exp: now + ttl,
            acquired: now,
            renewed: now,
            payload: None,
            waiting_since: None,
            yield_until: None,
        };
        self.token
    }

    /// The lease as observers see it: without the fairness fields.
    fn observed(&self) -> Doc {
        Doc {
            waiting_since: None,
            yield_until: None,
            ..self.clone()
        }
    }
}

impl Doc {
    /// Free by the protocol's rule: `exp <= now`.
    pub fn is_free_at(&self, now: Instant) -> bool {
        self.exp <= now
    }

    /// Yielded by `owner` to waiting owners: `owner` cannot take it back yet.
    pub fn yielded_by(&self, owner: &str, now: Instant) -> bool {
        self.owner == owner && self.yield_until.is_some_and(|until| until > now)
    }
}

#[derive(Default)]
struct Collection {
    docs: HashMap<String, Doc>,
    /// Keys occupied by a document not written by the protocol.
    foreign: HashSet<String>,
    /// The token of each deleted document: a new document of its key starts
    /// above it, as on MongoDB.
    deleted_tokens: HashMap<String, u64>,
}

impl Collection {
    /// What a new document of `key` starts from at `now`.
    fn vacant(&self, key: &str, now: Instant) -> Doc {
        Doc::vacant(now, self.deleted_tokens.get(key).copied().unwrap_or(0))
    }
}

/// The shared in-memory lock collection. Cheap to clone.
#[derive(Clone)]
pub(crate) struct MemoryDb {
    inner: Arc<Mutex<Collection>>,
    /// Bumped after every change, for `observe`.
    changed: Arc<tokio::sync::watch::Sender<()>>,
    /// Keys released or deleted, for `watch_releases` (a change stream's twin).
    released: tokio::sync::broadcast::Sender<String>,
    /// "Server time" as wall clock: `SystemTime` of `epoch.0` is `epoch.1`.
    epoch: (Instant, SystemTime),
}

impl Default for MemoryDb {
    fn default() -> Self {
        MemoryDb {
            inner: Arc::default(),
            changed: Arc::new(tokio::sync::watch::Sender::new(())),
            released: tokio::sync::broadcast::channel(1024).0,
            epoch: (
                Instant::now(),
                SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 30),
            ),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test must not poison the other assertions' view.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The acquire rule, applied at server time `now`.
fn apply_acquire(
    coll: &mut Collection,
    key: &str,
    owner: &str,
    lease_id: Uuid,
    ttl: Duration,
    waiting: bool,
    now: Instant,
) -> Result<AcquireOutcome> {
    if coll.foreign.contains(key) {
        return Err(Error::ForeignDocument {
            key: key.to_string(),
        });
    }
    match coll.docs.get_mut(key) {
        None => {
            let mut doc = coll.vacant(key, now);
            let token = doc.take(owner, lease_id, ttl, now);
            coll.docs.insert(key.to_string(), doc);
            Ok(AcquireOutcome::Acquired { token })
        }
        Some(doc) if doc.lease_id == Some(lease_id) => {
            // A retry of an acquisition that landed: same token, fresh expiry.
            doc.owner = owner.to_string();
            doc.exp = now + ttl;
            doc.renewed = now;
            Ok(AcquireOutcome::Acquired { token: doc.token })
        }
        Some(doc) if doc.exp <= now && !doc.yielded_by(owner, now) => {
            Ok(AcquireOutcome::Acquired {
                token: doc.take(owner, lease_id, ttl, now),
            })
        }
        Some(doc) => {
            let held_by_other = doc.lease_id.is_some() && doc.exp > now && doc.owner != owner;
            if waiting && held_by_other && doc.waiting_since.is_none() {
                doc.waiting_since = Some(now);
            }
            let until = match doc.yield_until {
                Some(until) if doc.owner == owner => doc.exp.max(until),
                _ => doc.exp,
            };
            Ok(AcquireOutcome::Held {
                holder: doc.owner.clone(),
                remaining: until.saturating_duration_since(now),
            })
        }
    }
}

/// The `_id $in keys, lid $in ids` filter of `MongoStore::lease_filter`.
fn lease_matches(key: &str, doc: &Doc, keys: &HashSet<&str>, ids: &HashSet<Uuid>) -> bool {
    keys.contains(key) && doc.lease_id.is_some_and(|id| ids.contains(&id))
}

fn release_doc(doc: &mut Doc, now: Instant, yield_window: Duration) {
    doc.exp = doc.exp.min(now);
    doc.lease_id = None;
    if doc.waiting_since.take().is_some() {
        doc.yield_until = Some(now + yield_window);
    }
}

impl MemoryDb {
    pub fn new() -> Self {
        Self::default()
    }

    /// Reports a release or delete of `key` to `watch_releases` streams.
    fn announce_release(&self, key: &str) {
        let _ = self.released.send(key.to_string());
    }

    /// How many `watch_releases` streams are open.
    pub fn release_watchers(&self) -> usize {
        self.released.receiver_count()
    }

    /// How many `observe` streams are open.
    pub fn observers(&self) -> usize {
        self.changed.receiver_count()
    }

    /// Wakes observers after a change.
    fn touch(&self) {
        self.changed.send_replace(());
    }

    /// The "server's" wall-clock time of `at`.
    pub fn system_time(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.epoch.0) {
            Some(after) => self.epoch.1 + after,
            None => self.epoch.1 - self.epoch.0.duration_since(at),
        }
    }

    /// `doc` as a [`LeaseInfo`] judged at `now`.
    pub fn info(&self, key: &str, doc: &Doc, now: Instant) -> LeaseInfo {
        LeaseInfo {
            key: key.to_string(),
            owner_id: doc.owner.clone(),
            fencing_token: doc.token,
            acquired_at: self.system_time(doc.acquired),
            renewed_at: self.system_time(doc.renewed),
            expires_at: self.system_time(doc.exp),
            server_time: self.system_time(now),
            payload: doc.payload.clone(),
            held: doc.lease_id.is_some() && doc.exp > now,
        }
    }

    /// A store (one manager's connection) with this owner id and lease TTL.
    pub fn store(&self, owner: impl Into<String>, ttl: Duration) -> MemoryStore {
        MemoryStore {
            db: self.clone(),
            owner: owner.into(),
            ttl,
            yield_window: DEFAULT_RETRY_MAX,
            control: Arc::new(Mutex::new(Control::default())),
        }
    }

    /// A snapshot of the document under `key`.
    pub fn doc(&self, key: &str) -> Option<Doc> {
        lock(&self.inner).docs.get(key).cloned()
    }

    /// Waits until the document under `key` exists and satisfies `pred`,
    /// woken by each change (no polling).
    pub async fn changed_until(&self, key: &str, pred: impl Fn(&Doc) -> bool) {
        let mut changed = self.changed.subscribe();
        while !self.doc(key).is_some_and(|d| pred(&d)) {
            changed
                .changed()
                .await
                .expect("the database outlives its tests");
        }
    }

    /// A snapshot of every document.
    pub fn docs(&self) -> HashMap<String, Doc> {
        lock(&self.inner).docs.clone()
    }

    /// `true` if another owner could acquire `key` now.
    pub fn is_free(&self, key: &str) -> bool {
        match self.doc(key) {
            None => true,
            Some(doc) => doc.is_free_at(Instant::now()),
        }
    }

    /// The owner holding `key` now (with a lease id and `exp > now`), if any.
    pub fn holder(&self, key: &str) -> Option<String> {
        self.doc(key)
            .filter(|d| d.lease_id.is_some() && !d.is_free_at(Instant::now()))
            .map(|d| d.owner)
    }

    /// Another owner acquires `key` by the protocol's rule, now.
    pub fn try_take(&self, key: &str, owner: &str, ttl: Duration) -> AcquireOutcome {
        let outcome = apply_acquire(
            &mut lock(&self.inner),
            key,
            owner,
            Uuid::new_v4(),
            ttl,
            false,
            Instant::now(),
        )
        .expect("try_take on a foreign document");
        self.touch();
        outcome
    }

    /// Another owner takes `key` now whatever its state (as if this process's
    /// lease had expired on the server unseen): new lease id, token + 1,
    /// `exp = now + ttl`. Returns the new token.
    pub fn force_take(&self, key: &str, owner: &str, ttl: Duration) -> u64 {
        let mut coll = lock(&self.inner);
        coll.foreign.remove(key);
        let now = Instant::now();
        let vacant = coll.vacant(key, now);
        let token = coll.docs.entry(key.to_string()).or_insert(vacant).take(
            owner,
            Uuid::new_v4(),
            ttl,
            now,
        );
        drop(coll);
        self.touch();
        token
    }

    /// Makes `key` expire now (`exp = min(exp, now)`), keeping its lease id:
    /// the server's view of a holder whose renewals stopped reaching it.
    pub fn expire(&self, key: &str) {
        if let Some(doc) = lock(&self.inner).docs.get_mut(key) {
            doc.exp = doc.exp.min(Instant::now());
        }
        self.touch();
    }

    /// Writes a raw document (e.g. a lease left by an earlier process).
    pub fn put(&self, key: &str, doc: Doc) {
        let mut coll = lock(&self.inner);
        coll.foreign.remove(key);
        coll.docs.insert(key.to_string(), doc);
        drop(coll);
        self.touch();
    }

    /// Occupies `key` with a document of foreign shape: acquire fails with
    /// [`Error::ForeignDocument`], renew and release never match it.
    pub fn put_foreign(&self, key: &str) {
        let mut coll = lock(&self.inner);
        coll.docs.remove(key);
        coll.foreign.insert(key.to_string());
        drop(coll);
        self.touch();
    }

    /// Deletes the document (the TTL monitor). The next acquisition's token
    /// is still greater than the deleted document's, as on MongoDB.
    pub fn delete(&self, key: &str) {
        let mut coll = lock(&self.inner);
        if let Some(doc) = coll.docs.remove(key) {
            coll.deleted_tokens.insert(key.to_string(), doc.token);
        }
        coll.foreign.remove(key);
        drop(coll);
        self.announce_release(key);
        self.touch();
    }
}

/// One kind of store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    Acquire,
    Renew,
    Release,
    ReleaseOwner,
    Inspect,
    List,
    ForceRelease,
    SetPayload,
}

const OPS: usize = 8;

impl Op {
    fn index(self) -> usize {
        self as usize
    }
}

/// An injected fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The future never completes and the operation is never applied (unless
    /// an operation timeout is set, see [`MemoryStore::set_operation_timeout`]).
    Hang,
    /// The operation completes (and is applied) this much later than its latency.
    Delay(Duration),
    /// Transient failure before applying: `Error::Unreachable`.
    Fail,
    /// Applied, then reported as a transient failure (outcome unknown to the caller).
    FailAfterApply,
}

/// One call the actor made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub op: Op,
    /// When the actor issued it.
    pub at: Instant,
    /// The keys it named (acquire: one; renew/release: the batch; release_owner: none).
    pub keys: Vec<String>,
}

#[derive(Default)]
struct Control {
    latency: [Duration; OPS],
    fault: [Option<Fault>; OPS],
    fault_next: [Option<(Fault, u32)>; OPS],
    operation_timeout: Option<Duration>,
    calls: Vec<Call>,
    in_flight: [usize; OPS],
    max_in_flight: [usize; OPS],
    acquires_in_flight: HashMap<String, usize>,
    max_acquires_in_flight_per_key: usize,
}

/// One manager's view of a [`MemoryDb`]. Clones share knobs and counters: give
/// one clone to `LockManager::start` and keep one in the test.
#[derive(Clone)]
pub(crate) struct MemoryStore {
    db: MemoryDb,
    owner: String,
    ttl: Duration,
    yield_window: Duration,
    control: Arc<Mutex<Control>>,
}

/// Counts an operation in flight until its future completes or is dropped.
struct InFlight {
    control: Arc<Mutex<Control>>,
    op: Op,
    key: Option<String>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut c = lock(&self.control);
        c.in_flight[self.op.index()] -= 1;
        if let Some(key) = &self.key {
            let n = c.acquires_in_flight.get_mut(key).expect("counted");
            *n -= 1;
            if *n == 0 {
                c.acquires_in_flight.remove(key);
            }
        }
    }
}

fn unreachable(reason: &str, waited: Duration) -> Error {
    Error::Unreachable {
        waited,
        reason: reason.to_string(),
    }
}

impl MemoryStore {
    pub fn db(&self) -> &MemoryDb {
        &self.db
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// This store with another yield window (how long a release that another
    /// owner waited for keeps this owner from taking the key back).
    pub fn with_yield_window(mut self, yield_window: Duration) -> Self {
        self.yield_window = yield_window;
        self
    }

    /// Every later call of `op` waits this long, then is applied.
    pub fn set_latency(&self, op: Op, latency: Duration) {
        lock(&self.control).latency[op.index()] = latency;
    }

    /// Every later call of `op` suffers `fault` (`None` heals it).
    pub fn set_fault(&self, op: Op, fault: Option<Fault>) {
        lock(&self.control).fault[op.index()] = fault;
    }

    /// The next `n` calls of `op` suffer `fault`, ahead of any fault set with
    /// [`MemoryStore::set_fault`]; later calls behave as before.
    pub fn fault_next(&self, op: Op, fault: Fault, n: u32) {
        lock(&self.control).fault_next[op.index()] = (n > 0).then_some((fault, n));
    }

    /// The next `n` calls of `op` fail transiently before applying.
    pub fn fail_next(&self, op: Op, n: u32) {
        self.fault_next(op, Fault::Fail, n);
    }

    /// Renewals never complete.
    pub fn hang_renewals(&self) {
        self.set_fault(Op::Renew, Some(Fault::Hang));
    }

    /// Renewals fail with a transient error.
    pub fn fail_renewals(&self) {
        self.set_fault(Op::Renew, Some(Fault::Fail));
    }

    /// Bounds every later operation like `MongoStore::bounded`: after this long
    /// it fails with `Error::Unreachable` (not applied, if not applied yet).
    pub fn set_operation_timeout(&self, timeout: Option<Duration>) {
        lock(&self.control).operation_timeout = timeout;
    }

    /// Every call made so far, in order.
    pub fn log(&self) -> Vec<Call> {
        lock(&self.control).calls.clone()
    }

    /// The calls of `op` made so far.
    pub fn calls_of(&self, op: Op) -> Vec<Call> {
        lock(&self.control)
            .calls
            .iter()
            .filter(|c| c.op == op)
            .cloned()
            .collect()
    }

    /// How many calls of `op` were made so far.
    pub fn calls(&self, op: Op) -> usize {
        lock(&self.control)
            .calls
            .iter()
            .filter(|c| c.op == op)
            .count()
    }

    /// Acquire calls for `key` so far.
    pub fn acquire_calls(&self, key: &str) -> Vec<Instant> {
        lock(&self.control)
            .calls
            .iter()
            .filter(|c| c.op == Op::Acquire && c.keys[0] == key)
            .map(|c| c.at)
            .collect()
    }

    /// The size of each renew call, in order.
    pub fn renew_batch_sizes(&self) -> Vec<usize> {
        self.calls_of(Op::Renew)
            .iter()
            .map(|c| c.keys.len())
            .collect()
    }

    /// Total leases named by all renew calls.
    pub fn leases_renewed(&self) -> usize {
        self.renew_batch_sizes().iter().sum()
    }

    /// Total leases named by all release calls.
    pub fn leases_released(&self) -> usize {
        self.calls_of(Op::Release)
            .iter()
            .map(|c| c.keys.len())
            .sum()
    }

    /// Calls of `op` in flight now.
    pub fn in_flight(&self, op: Op) -> usize {
        lock(&self.control).in_flight[op.index()]
    }

    /// The most calls of `op` ever in flight at once.
    pub fn max_in_flight(&self, op: Op) -> usize {
        lock(&self.control).max_in_flight[op.index()]
    }

    /// The most acquire calls ever in flight at once for one key.
    pub fn max_acquires_in_flight_per_key(&self) -> usize {
        lock(&self.control).max_acquires_in_flight_per_key
    }

    /// How many clones of this store exist (the test's, the actor's, and one
    /// per operation in flight): 1 once the actor has stopped and nothing runs.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.control)
    }

    /// Records the call, reads the knobs, and wraps `apply` (run at server
    /// time, at the end of the latency) into the operation's future.
    fn run<T: Send + 'static>(
        &self,
        op: Op,
        keys: Vec<String>,
        apply: impl FnOnce(&mut Collection, Instant) -> Result<T> + Send + 'static,
    ) -> BoxFuture<'static, Result<T>> {
        let (latency, fault, timeout) = {
            let mut c = lock(&self.control);
            let i = op.index();
            let fault = match c.fault_next[i] {
                Some((fault, n)) => {
                    c.fault_next[i] = (n > 1).then_some((fault, n - 1));
                    Some(fault)
                }
                None => c.fault[i],
            };
            c.calls.push(Call {
                op,
                at: Instant::now(),
                keys: keys.clone(),
            });
            c.in_flight[i] += 1;
            c.max_in_flight[i] = c.max_in_flight[i].max(c.in_flight[i]);
            if op == Op::Acquire {
                let n = c.acquires_in_flight.entry(keys[0].clone()).or_insert(0);
                *n += 1;
                let n = *n;
                c.max_acquires_in_flight_per_key = c.max_acquires_in_flight_per_key.max(n);
            }
            (c.latency[i], fault, c.operation_timeout)
        };
        let guard = InFlight {
            control: self.control.clone(),
            op,
            key: (op == Op::Acquire).then(|| keys[0].clone()),
        };
        let db = self.db.clone();
        let work = async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            match fault {
                Some(Fault::Hang) => std::future::pending::<()>().await,
                Some(Fault::Delay(d)) if !d.is_zero() => tokio::time::sleep(d).await,
                Some(Fault::Fail) => return Err(unreachable("injected failure", latency)),
                _ => {}
            }
            let result = apply(&mut lock(&db.inner), Instant::now());
            db.touch();
            if fault == Some(Fault::FailAfterApply) {
                return Err(unreachable("injected failure after apply", latency));
            }
            result
        };
        async move {
            let _guard = guard;
            match timeout {
                None => work.await,
                Some(t) => match tokio::time::timeout(t, work).await {
                    Ok(result) => result,
                    Err(_) => Err(unreachable("operation timed out", t)),
                },
            }
        }
        .boxed()
    }
}

impl Store for MemoryStore {
    fn watch_releases(&self) -> BoxStream<'static, Result<String>> {
        let released = self.db.released.subscribe();
        futures::stream::unfold(released, |mut released| async move {
            loop {
                match released.recv().await {
                    Ok(key) => return Some((Ok(key), released)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                }
            }
        })
        .boxed()
    }

    fn acquire(
        &self,
        key: String,
        lease_id: Uuid,
        waiting: bool,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        let (owner, ttl) = (self.owner.clone(), self.ttl);
        self.run(Op::Acquire, vec![key.clone()], move |coll, now| {
            apply_acquire(coll, &key, &owner, lease_id, ttl, waiting, now)
        })
    }

    fn renew(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<Vec<String>>> {
        let ttl = self.ttl;
        let keys = leases.iter().map(|l| l.key.clone()).collect();
        self.run(Op::Renew, keys, move |coll, now| {
            let keys: HashSet<&str> = leases.iter().map(|l| l.key.as_str()).collect();
            let ids: HashSet<Uuid> = leases.iter().map(|l| l.lease_id).collect();
            let mut kept = HashSet::new();
            for (key, doc) in coll.docs.iter_mut() {
                if lease_matches(key, doc, &keys, &ids) {
                    doc.exp = now + ttl;
                    doc.renewed = now;
                    kept.insert(key.clone());
                }
            }
            Ok(leases
                .iter()
                .filter(|l| !kept.contains(&l.key))
                .map(|l| l.key.clone())
                .collect())
        })
    }

    fn release(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<u64>> {
        if leases.is_empty() {
            // As MongoStore: no command at all.
            return futures::future::ready(Ok(0)).boxed();
        }
        let keys = leases.iter().map(|l| l.key.clone()).collect();
        let db = self.db.clone();
        let yield_window = self.yield_window;
        self.run(Op::Release, keys, move |coll, now| {
            let keys: HashSet<&str> = leases.iter().map(|l| l.key.as_str()).collect();
            let ids: HashSet<Uuid> = leases.iter().map(|l| l.lease_id).collect();
            let mut n = 0;
            for (key, doc) in coll.docs.iter_mut() {
                if lease_matches(key, doc, &keys, &ids) {
                    release_doc(doc, now, yield_window);
                    db.announce_release(key);
                    n += 1;
                }
            }
            Ok(n)
        })
    }

    fn release_owner(&self, except: Vec<Uuid>) -> BoxFuture<'static, Result<u64>> {
        let owner = self.owner.clone();
        let db = self.db.clone();
        let yield_window = self.yield_window;
        self.run(Op::ReleaseOwner, Vec::new(), move |coll, now| {
            let except: HashSet<Uuid> = except.into_iter().collect();
            let mut n = 0;
            for (key, doc) in coll.docs.iter_mut() {
                if doc.owner == owner && doc.lease_id.is_some_and(|id| !except.contains(&id)) {
                    release_doc(doc, now, yield_window);
                    db.announce_release(key);
                    n += 1;
                }
            }
            Ok(n)
        })
    }

    fn inspect(&self, key: String) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let db = self.db.clone();
        self.run(Op::Inspect, vec![key.clone()], move |coll, now| {
            if coll.foreign.contains(&key) {
                return Err(Error::ForeignDocument { key });
            }
            Ok(coll.docs.get(&key).map(|doc| db.info(&key, doc, now)))
        })
    }

    fn list(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<String>)>> {
        let db = self.db.clone();
        self.run(Op::List, Vec::new(), move |coll, now| {
            let mut keys: Vec<&String> = coll
                .docs
                .keys()
                .filter(|k| after.as_ref().is_none_or(|a| *k > a))
                .collect();
            keys.sort();
            keys.truncate(limit);
            let next = (keys.len() == limit)
                .then(|| keys.last().map(|k| k.to_string()))
                .flatten();
            let page = keys
                .into_iter()
                .map(|k| db.info(k, &coll.docs[k], now))
                .collect();
            Ok((page, next))
        })
    }

    fn force_release(&self, key: String) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let db = self.db.clone();
        let yield_window = self.yield_window;
        self.run(Op::ForceRelease, vec![key.clone()], move |coll, now| {
            let Some(doc) = coll.docs.get_mut(&key) else {
                return Ok(None);
            };
            if doc.lease_id.is_none() || doc.exp <= now {
                return Ok(None);
            }
            let before = db.info(&key, doc, now);
            release_doc(doc, now, yield_window);
            db.announce_release(&key);
            Ok(Some(before))
        })
    }

    fn set_payload(&self, lease: LeaseRef, payload: Document) -> BoxFuture<'static, Result<bool>> {
        self.run(
            Op::SetPayload,
            vec![lease.key.clone()],
            move |coll, _now| match coll.docs.get_mut(&lease.key) {
                Some(doc) if doc.lease_id == Some(lease.lease_id) => {
                    doc.payload = Some(payload);
                    Ok(true)
                }
                _ => Ok(false),
            },
        )
    }

    /// The latest state after each change, and at each expiry. Unlike
    /// `MongoStore`, changes applied between two wake-ups of the observer are
    /// merged (timing tests do not need every intermediate state).
    fn observe(&self, key: String) -> BoxStream<'static, Result<Option<LeaseInfo>>> {
        let db = self.db.clone();
        let changed = db.changed.subscribe();
        let state = (db, changed, key, None::<(Option<Doc>, bool)>, true);
        futures::stream::unfold(
            state,
            |(db, mut changed, key, mut last, first)| async move {
                let mut first = first;
                loop {
                    if !first {
                        let expiry = last
                            .as_ref()
                            .and_then(|(doc, held)| doc.as_ref().filter(|_| *held).map(|d| d.exp));
                        tokio::select! {
                            result = changed.changed() => {
                                if result.is_err() {
                                    return None;
                                }
                            }
                            _ = async {
                                match expiry {
                                    Some(at) => tokio::time::sleep_until(at).await,
                                    None => std::future::pending().await,
                                }
                            } => {}
                        }
                    }
                    first = false;
                    changed.borrow_and_update();
                    let now = Instant::now();
                    let doc = db.doc(&key).map(|d| d.observed());
                    let held = doc
                        .as_ref()
                        .is_some_and(|d| d.lease_id.is_some() && d.exp > now);
                    let state = (doc.clone(), held);
                    if last.as_ref() == Some(&state) {
                        continue;
                    }
                    last = Some(state);
                    let info = doc.map(|d| db.info(&key, &d, now));
                    return Some((Ok(info), (db, changed, key, last, false)));
                }
            },
        )
        .boxed()
    }
}
