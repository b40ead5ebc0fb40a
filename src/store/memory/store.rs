//! [`MemoryStore`], one manager's view of a [`MemoryDb`]: its settings, and
//! [`MemoryStore::run`], through which every operation of its
//! [`Store`](crate::store::Store) implementation (`ops`) is applied at
//! server time, under the knobs of [`control`](super::control).

use crate::random::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use mongodb::bson::{Document, doc};
use tokio::time::Instant;
use uuid::Uuid;

use super::control::{Controls, Fault, Issued, Op};
use super::db::{MemoryDb, lock};
use super::rules::Collection;
use crate::config::{DEFAULT_RETRY_MAX, ReleaseMode};
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::random::random_range;

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
    /// The lock-delay of its involuntary ends (force release, release by
    /// owner id), as `MongoStore`'s ([`MemoryStore::with_lock_delay`]).
    pub(super) lock_delay: Duration,
    pub(super) release_mode: ReleaseMode,
    /// The most live entries its waiting attempts let a queue of waiting
    /// owners hold ([`MemoryStore::with_queue_bound`]).
    pub(super) queue_bound: usize,
    /// Whether it has the light acquire ([`MemoryStore::with_light_acquire`]).
    pub(super) light_acquire: bool,
    pub(super) control: Controls,
    /// `false`: `watch_releases` fails as on a standalone server.
    pub(super) change_streams: bool,
    /// `None`: the lock collection; `Some((collection, field))`: the place
    /// of in-document leases on a user collection (from
    /// [`Store::documents`](crate::store::Store::documents)).
    pub(super) place: Option<(String, String)>,
    /// In a place of in-document leases: the top-level `LockId` /
    /// `LockTime` fields kept for other clients, if opened with them.
    pub(super) lock_id: Option<Arc<crate::lock_id_fields::LockIdFields>>,
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
            lock_delay: Duration::ZERO,
            release_mode: ReleaseMode::Keep,
            queue_bound: crate::store::MAX_QUEUE,
            light_acquire: false,
            control: Controls::default(),
            change_streams: true,
            place: None,
            lock_id: None,
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
    let lease = doc! { "aid": owner, "lid": lease_id.to_string(), "tok": token as i64 };
    doc! { "_id": key.to_bson(), field: lease }
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
    /// `field` that [`Store::documents`](crate::store::Store::documents) gives the actor (same knobs and
    /// counters), opened now if it was not: a view of
    /// [`MemoryDb::documents`] with this store's owner id, TTL, yield
    /// window and change streams, whose releases follow the delete-mode
    /// rules (a release removes the lock field, i.e. the twin's document).
    pub fn document_store(&self, collection: &str, field: &str) -> MemoryStore {
        self.document_store_with(collection, field, None)
    }

    /// [`MemoryStore::document_store`] with `LockId` / `LockTime` kept at
    /// the top (`lock_id`, set by the first opening of the place).
    pub fn document_store_with(
        &self,
        collection: &str,
        field: &str,
        lock_id: Option<Arc<crate::lock_id_fields::LockIdFields>>,
    ) -> MemoryStore {
        lock(&self.opened)
            .entry((collection.to_string(), field.to_string()))
            .or_insert_with(|| {
                let db = self.db.documents(collection, field);
                lock(&db.inner).lock_id_max = lock_id.as_ref().map(|f| f.max_duration);
                MemoryStore {
                    yield_window: self.yield_window,
                    safety_margin: self.safety_margin,
                    release_mode: ReleaseMode::Delete,
                    change_streams: self.change_streams,
                    place: Some((collection.to_string(), field.to_string())),
                    lock_id,
                    ..db.store(&self.owner, self.ttl)
                }
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

    /// This store with a lock-delay (default zero) after the involuntary
    /// ends it writes, as `MongoStore`'s ("Lock-delay" in `store`).
    pub fn with_lock_delay(mut self, delay: Duration) -> Self {
        self.lock_delay = delay;
        self
    }

    /// This store with another bound on the queues of waiting owners its
    /// attempts register in (default `store::MAX_QUEUE`, `MongoStore`'s
    /// constant): the simulation uses a small one, so that its 2 to 4
    /// managers go beyond it ("Bound" in "Queue of waiting owners" in
    /// `store`).
    pub fn with_queue_bound(mut self, bound: usize) -> Self {
        self.queue_bound = bound;
        self
    }

    /// This store with releases in `mode` (default [`ReleaseMode::Keep`]).
    pub fn with_release_mode(mut self, mode: ReleaseMode) -> Self {
        self.release_mode = mode;
        self
    }

    /// This store with `MongoStore`'s light acquire, alone and grouped
    /// (`light`), in the lock collection: the actor then tries it first
    /// for a plain lease of a key not contended lately, as over
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

    /// Records the call, reads the knobs, and plays the server's side of
    /// it: `apply` runs at server time in a task of its own, at the end of
    /// the call's latency and delay, whatever becomes of the returned
    /// future (dropped, timed out, its manager crashed), unless the call
    /// is lost, fails before it applies, or carries a server-side bound
    /// (`Issued::server_bound`) that passed first. The returned future is
    /// the caller's side: the answer, if one comes while it waits, bounded
    /// by the operation timeout.
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
            server_bound,
            in_flight: guard,
        } = self.control.issue(op, &keys);
        // A hung call's fate on the server, drawn now: never applied, or
        // applied up to three TTLs later.
        let fault = match fault {
            Some(Fault::Hang) => Some(match random_range(0..2) {
                0 => Fault::Lost,
                _ => {
                    let most = 3 * self.ttl.as_millis() as u64;
                    Fault::Unanswered(Duration::from_millis(random_range(0..=most)))
                }
            }),
            fault => fault,
        };
        let (answer, answered) = tokio::sync::oneshot::channel::<Result<T>>();
        let (db, lock_delay) = (self.db.clone(), self.lock_delay);
        let server = async move {
            let held = match fault {
                Some(Fault::Delay(d) | Fault::Unanswered(d)) => d,
                _ => Duration::ZERO,
            };
            let lands_after = latency + held;
            if !lands_after.is_zero() {
                tokio::time::sleep(lands_after).await;
            }
            match fault {
                Some(Fault::Lost) => return,
                Some(Fault::Fail) => {
                    let _ = answer.send(Err(unreachable("injected failure", latency)));
                    return;
                }
                _ => {}
            }
            if server_bound.is_some_and(|bound| lands_after > bound) {
                let error = unreachable("operation exceeded its server-side time limit", held);
                let _ = answer.send(Err(error));
                return;
            }
            let result = match fault {
                Some(Fault::Stale(lag)) => db.apply_to_snapshot(lag, apply),
                _ => db.apply_landing(op, lock_delay, apply),
            };
            match fault {
                Some(Fault::FailAfterApply) => {
                    let error = unreachable("injected failure after apply", latency);
                    let _ = answer.send(Err(error));
                }
                Some(Fault::LateReply(d)) => {
                    tokio::time::sleep(d).await;
                    let _ = answer.send(result);
                }
                Some(Fault::Unanswered(_)) => {}
                _ => {
                    let _ = answer.send(result);
                }
            }
        };
        tokio::spawn(server);
        async move {
            let _guard = guard;
            // No answer ever comes once the server's side is gone unanswered.
            let answer = async {
                match answered.await {
                    Ok(result) => result,
                    Err(_) => std::future::pending().await,
                }
            };
            match timeout {
                None => answer.await,
                Some(t) => match tokio::time::timeout(t, answer).await {
                    Ok(result) => result,
                    Err(_) => Err(unreachable("operation timed out", t)),
                },
            }
        }
        .boxed()
    }
}
