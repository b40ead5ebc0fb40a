//! [`MemoryStore`], one manager's view of a [`MemoryDb`]: its settings, the
//! knobs of [`control`](super::control), and [`MemoryStore::run`], through
//! which every operation of its [`Store`](crate::store::Store)
//! implementation (`ops`) is applied at server time.

use crate::random::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use mongodb::bson::Document;
use tokio::time::Instant;
use uuid::Uuid;

use super::control::{Call, Controls, Fault, Issued, Op};
use super::db::{MemoryDb, lock};
use super::rules::Collection;
use crate::config::{DEFAULT_RETRY_MAX, ReleaseMode};
use crate::error::{Error, Result};
use crate::key::LeaseKey;

/// One manager's view of a [`MemoryDb`]. Clones share knobs and counters: give
/// one clone to `LeaseManager::start` and keep one in the test.
#[derive(Clone)]
pub(crate) struct MemoryStore {
    pub(super) db: MemoryDb,
    pub(super) owner: String,
    pub(super) ttl: Duration,
    pub(super) yield_window: Duration,
    /// The manager's safety margin, part of the registration window
    /// ([`registration_window`](crate::store::registration_window)).
    pub(super) safety_margin: Duration,
    pub(super) release_mode: ReleaseMode,
    /// Whether it has the light acquire ([`MemoryStore::with_light_acquire`]).
    pub(super) light_acquire: bool,
    pub(super) control: Controls,
    /// `false`: `watch_releases` fails as on a standalone server.
    pub(super) change_streams: bool,
    /// `None`: the lock collection; `Some((collection, field))`: the place
    /// of in-document leases on a user collection (from
    /// [`Store::documents`]).
    pub(super) place: Option<(String, String)>,
    /// The stores of in-document leases this one opened, by collection and
    /// lock field (shared by clones), so that tests reach the actor's.
    pub(super) opened: Arc<Mutex<HashMap<(String, String), MemoryStore>>>,
    /// `true`: a stream of writes requested now does not open (it neither
    /// sees writes nor reports `Opened`) until this is `false` again, as a
    /// change stream the server has not yet confirmed (shared by clones).
    pub(super) opening_held: Arc<tokio::sync::watch::Sender<bool>>,
}

impl MemoryDb {
    /// A store (one manager's connection) with this owner id and lease TTL.
    pub fn store(&self, owner: impl Into<String>, ttl: Duration) -> MemoryStore {
        MemoryStore {
            db: self.clone(),
            owner: owner.into(),
            ttl,
            yield_window: DEFAULT_RETRY_MAX,
            safety_margin: Duration::ZERO,
            release_mode: ReleaseMode::Keep,
            light_acquire: false,
            control: Controls::default(),
            change_streams: true,
            place: None,
            opened: Arc::default(),
            opening_held: Arc::new(tokio::sync::watch::channel(false).0),
        }
    }
}

/// The twin's user document of an in-document lease: only `_id` and the
/// lock fields that name the lease.
pub(super) fn lock_fields_document(
    key: &LeaseKey,
    field: &str,
    owner: &str,
    lease_id: Uuid,
    token: u64,
) -> Document {
    let mut lease = Document::new();
    lease.insert("aid", owner);
    lease.insert("lid", lease_id.to_string());
    lease.insert("tok", token as i64);
    let mut document = Document::new();
    document.insert("_id", key.to_bson());
    document.insert(field, lease);
    document
}

fn unreachable(reason: &str, waited: Duration) -> Error {
    Error::Unreachable {
        waited,
        reason: reason.to_string(),
        source: None,
    }
}

impl MemoryStore {
    pub fn db(&self) -> &MemoryDb {
        &self.db
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The store of in-document leases on `collection` under lock field
    /// `field` that [`Store::documents`] gives the actor (same knobs and
    /// counters), opened now if it was not: a view of
    /// [`MemoryDb::documents`] with this store's owner id, TTL, yield
    /// window and change streams, whose releases follow the delete-mode
    /// rules (a release removes the lock field, i.e. the twin's document).
    pub fn document_store(&self, collection: &str, field: &str) -> MemoryStore {
        lock(&self.opened)
            .entry((collection.to_string(), field.to_string()))
            .or_insert_with(|| MemoryStore {
                db: self.db.documents(collection, field),
                owner: self.owner.clone(),
                ttl: self.ttl,
                yield_window: self.yield_window,
                safety_margin: self.safety_margin,
                release_mode: ReleaseMode::Delete,
                light_acquire: false,
                control: Controls::default(),
                change_streams: self.change_streams,
                place: Some((collection.to_string(), field.to_string())),
                opened: Arc::default(),
                opening_held: Arc::new(tokio::sync::watch::channel(false).0),
            })
            .clone()
    }

    /// A store whose `watch_releases` fails at once with a permanent error,
    /// as on a standalone server (no change streams).
    pub fn without_change_streams(mut self) -> Self {
        self.change_streams = false;
        self
    }

    /// This store with another yield window (how long a release that another
    /// owner waited for keeps this owner from taking the key back).
    pub fn with_yield_window(mut self, yield_window: Duration) -> Self {
        self.yield_window = yield_window;
        self
    }

    /// This store with the manager's safety margin (default zero), which
    /// its registration window includes, as `MongoStore`'s.
    pub fn with_safety_margin(mut self, margin: Duration) -> Self {
        self.safety_margin = margin;
        self
    }

    /// This store with releases in `mode` (default [`ReleaseMode::Keep`]).
    pub fn with_release_mode(mut self, mode: ReleaseMode) -> Self {
        self.release_mode = mode;
        self
    }

    /// This store with `MongoStore`'s light acquire, alone and grouped
    /// (`light`), in the lock collection: the actor then tries it first
    /// for a plain exclusive lease of a key not contended lately, as over
    /// MongoDB. Off by default: the actor's paused-clock tests count the
    /// general acquire's calls; the simulation and the store contract turn
    /// it on.
    pub fn with_light_acquire(mut self) -> Self {
        self.light_acquire = true;
        self
    }

    /// Streams of writes requested from now on stay unopened (writes
    /// meanwhile are not announced to them, nor is `Opened`) until
    /// [`MemoryStore::let_streams_open`]: the window before a change stream
    /// starts on the server.
    pub fn hold_stream_opening(&self) {
        self.opening_held.send_replace(true);
    }

    /// Lets the streams held by [`MemoryStore::hold_stream_opening`] open
    /// now (each reports `Opened`, then the writes from this instant on).
    pub fn let_streams_open(&self) {
        self.opening_held.send_replace(false);
    }

    /// Every later call of `op` waits this long, then is applied.
    pub fn set_latency(&self, op: Op, latency: Duration) {
        self.control.set_latency(op, latency);
    }

    /// Every later call of `op` suffers `fault` (`None` heals it).
    pub fn set_fault(&self, op: Op, fault: Option<Fault>) {
        self.control.set_fault(op, fault);
    }

    /// The next `n` calls of `op` suffer `fault`, ahead of any fault set with
    /// [`MemoryStore::set_fault`]; later calls behave as before.
    pub fn fault_next(&self, op: Op, fault: Fault, n: u32) {
        self.control.fault_next(op, fault, n);
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

    pub fn set_operation_timeout(&self, timeout: Option<Duration>) {
        self.control.set_operation_timeout(timeout);
    }

    /// Every call made so far, in order.
    pub fn log(&self) -> Vec<Call> {
        self.control.log()
    }

    /// The calls of `op` made so far.
    pub fn calls_of(&self, op: Op) -> Vec<Call> {
        self.control.calls_of(op)
    }

    /// How many calls of `op` were made so far.
    pub fn calls(&self, op: Op) -> usize {
        self.control.calls(op)
    }

    /// Acquire calls for `key` so far.
    pub fn acquire_calls(&self, key: impl Into<LeaseKey>) -> Vec<Instant> {
        let key = &key.into();
        self.control.acquire_calls(key)
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

    pub fn in_flight(&self, op: Op) -> usize {
        self.control.in_flight(op)
    }

    /// The most calls of `op` ever in flight at once.
    pub fn max_in_flight(&self, op: Op) -> usize {
        self.control.max_in_flight(op)
    }

    /// The most acquire calls ever in flight at once for one key.
    pub fn max_acquires_in_flight_per_key(&self) -> usize {
        self.control.max_acquires_in_flight_per_key()
    }

    /// How many clones of this store exist (the test's, the actor's, and one
    /// per operation in flight): 1 once the actor has stopped and nothing runs.
    pub fn handles(&self) -> usize {
        self.control.handles()
    }

    /// Records the call, reads the knobs, and wraps `apply` (run at server
    /// time, at the end of the latency) into the operation's future.
    pub(super) fn run<T: Send + 'static>(
        &self,
        op: Op,
        keys: Vec<LeaseKey>,
        apply: impl FnOnce(&mut Collection, Instant) -> Result<T> + Send + 'static,
    ) -> BoxFuture<'static, Result<T>> {
        let Issued {
            latency,
            fault,
            timeout,
            in_flight: guard,
        } = self.control.issue(op, &keys);
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
            let result = match fault {
                Some(Fault::Stale(lag)) => db.apply_to_snapshot(lag, apply),
                _ => db.apply(apply),
            };
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
