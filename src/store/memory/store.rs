//! [`MemoryStore`], one manager's view of a [`MemoryDb`]: the [`Store`]
//! implementation, applying the rules of [`db`](super::db) at server time,
//! with the knobs of [`control`](super::control).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use mongodb::bson::Document;
use tokio::time::Instant;
use uuid::Uuid;

use super::control::{Call, Controls, Fault, Issued, Op};
use super::db::{
    Collection, Doc, Foreign, MemoryDb, apply_acquire, lease_matches, lock, release_doc,
};
use crate::config::{DEFAULT_RETRY_MAX, ReleaseMode};
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::lease::LeaseInfo;
use crate::store::{AcquireOutcome, Announcement, DocumentWrite, LeaseRef, LockPlace, Store};

/// What `observe` last reported: the document without its fairness marks,
/// whether it was held, and the foreign holder's lock document.
type Observed = (Option<Doc>, bool, Option<Foreign>);

/// One manager's view of a [`MemoryDb`]. Clones share knobs and counters: give
/// one clone to `LockManager::start` and keep one in the test.
#[derive(Clone)]
pub(crate) struct MemoryStore {
    db: MemoryDb,
    owner: String,
    ttl: Duration,
    yield_window: Duration,
    release_mode: ReleaseMode,
    control: Controls,
    /// `false`: `watch_releases` fails as on a standalone server.
    change_streams: bool,
    /// `None`: the lock collection; `Some((collection, field))`: the place
    /// of in-document leases on a user collection (from
    /// [`Store::documents`]).
    place: Option<(String, String)>,
    /// The stores of in-document leases this one opened, by collection and
    /// lock field (shared by clones), so that tests reach the actor's.
    opened: Arc<Mutex<HashMap<(String, String), MemoryStore>>>,
    /// `true`: a stream of writes requested now does not open (it neither
    /// sees writes nor reports `Opened`) until this is `false` again, as a
    /// change stream the server has not yet confirmed (shared by clones).
    opening_held: Arc<tokio::sync::watch::Sender<bool>>,
}

impl MemoryDb {
    /// A store (one manager's connection) with this owner id and lease TTL.
    pub fn store(&self, owner: impl Into<String>, ttl: Duration) -> MemoryStore {
        MemoryStore {
            db: self.clone(),
            owner: owner.into(),
            ttl,
            yield_window: DEFAULT_RETRY_MAX,
            release_mode: ReleaseMode::Keep,
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
fn lock_fields_document(
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
    document.insert("_id", key.as_bson().clone());
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
                release_mode: ReleaseMode::Delete,
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

    /// This store with releases in `mode` (default [`ReleaseMode::Keep`]).
    pub fn with_release_mode(mut self, mode: ReleaseMode) -> Self {
        self.release_mode = mode;
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
    fn run<T: Send + 'static>(
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
            let result = db.apply(apply);
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
    fn place(&self) -> LockPlace {
        match &self.place {
            None => LockPlace {
                database: "memory".into(),
                collection: "locks".into(),
                field: None,
            },
            Some((collection, field)) => LockPlace {
                database: "memory".into(),
                collection: collection.clone(),
                field: Some(field.clone()),
            },
        }
    }

    fn removes_on_release(&self) -> bool {
        self.release_mode == ReleaseMode::Delete
    }

    fn documents(&self, collection: &str, field: &str) -> Result<Arc<dyn Store>> {
        if self.place.is_some() {
            return Err(Error::InvalidConfig {
                reason: "in-document leases are opened from the lock collection's store".into(),
            });
        }
        Ok(Arc::new(self.document_store(collection, field)))
    }

    /// In-document leases: every user document exists unless the test
    /// removed it ([`MemoryDb::remove_user_document`]): then an acquisition
    /// with `create` creates it (its fields are not modelled), one without
    /// fails with `DocumentNotFound`. An acquisition returns `{_id, <field>:
    /// {aid, lid, tok}}`.
    fn acquire_document(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl: Duration,
        create: Option<Document>,
    ) -> BoxFuture<'static, Result<(AcquireOutcome, Option<Document>)>> {
        let field = self.place.as_ref().map(|(_, field)| field.clone());
        let owner = self.owner.clone();
        let (db, creates) = (self.db.clone(), create.is_some());
        let acquire = self.run(Op::Acquire, vec![key.clone()], {
            let (key, owner) = (key.clone(), owner.clone());
            move |coll, now| {
                if coll.missing.contains(&key) {
                    if !creates {
                        return Err(Error::DocumentNotFound { id: key });
                    }
                    coll.missing.remove(&key);
                }
                // As `acquire_with_ttl`.
                let retry = coll.docs.get(&key).and_then(|d| d.lease_id) == Some(lease_id);
                let outcome = apply_acquire(coll, &key, &owner, lease_id, ttl, waiting, now);
                if !retry && matches!(outcome, Ok(AcquireOutcome::Acquired { .. })) {
                    db.announce_acquisition(&key, &owner, lease_id);
                }
                outcome
            }
        });
        async move {
            let outcome = acquire.await?;
            let document = match (&outcome, field) {
                (AcquireOutcome::Acquired { token }, Some(field)) => {
                    Some(lock_fields_document(&key, &field, &owner, lease_id, *token))
                }
                _ => None,
            };
            Ok((outcome, document))
        }
        .boxed()
    }

    /// Conditional on the lease id and owner id, as on MongoDB; the user's
    /// update is not applied (its semantics are MongoDB's), the release
    /// (`write.release`) is, by the delete-mode rule. Returns
    /// `{_id, <field>: {aid, lid, tok}}` as before the write.
    // As every `run` closure here: `Error` is large (the lint is about it).
    fn write_document(
        &self,
        lease: LeaseRef,
        token: u64,
        write: DocumentWrite,
    ) -> BoxFuture<'static, Result<Option<Document>>> {
        let Some((_, field)) = self.place.clone() else {
            return futures::future::ready(Err(Error::InvalidConfig {
                reason: "not an in-document lease".into(),
            }))
            .boxed();
        };
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let yield_window = self.yield_window;
        self.run(
            Op::WriteDocument,
            vec![lease.key.clone()],
            move |coll, now| {
                let held = coll
                    .docs
                    .get(&lease.key)
                    .is_some_and(|doc| doc.lease_id == Some(lease.lease_id) && doc.owner == owner);
                if !held {
                    return Ok(None);
                }
                if write.release {
                    let matches = |key: &LeaseKey, _: &Doc| *key == lease.key;
                    coll.release_where(&db, matches, now, yield_window, ReleaseMode::Delete);
                }
                Ok(Some(lock_fields_document(
                    &lease.key,
                    &field,
                    &owner,
                    lease.lease_id,
                    token,
                )))
            },
        )
    }

    fn watch_releases(&self) -> BoxStream<'static, Result<Announcement>> {
        if !self.change_streams {
            let error = Error::UnusableCollection {
                reason: "no change streams on a standalone server".into(),
            };
            return futures::stream::iter([Err(error)]).boxed();
        }
        let writes = |released: tokio::sync::broadcast::Receiver<crate::store::KeyWrite>| {
            futures::stream::unfold(released, |mut released| async move {
                loop {
                    match released.recv().await {
                        Ok(write) => return Some((Ok(Announcement::Write(write)), released)),
                        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                    }
                }
            })
        };
        if !*self.opening_held.borrow() {
            let released = self.db.subscribe_releases();
            return futures::stream::iter([Ok(Announcement::Opened)])
                .chain(writes(released))
                .boxed();
        }
        // Subscribed only once let open: writes meanwhile are missed.
        let (db, mut held) = (self.db.clone(), self.opening_held.subscribe());
        futures::stream::once(async move {
            // The sender lives in this store; if it is gone, open anyway.
            let _ = held.wait_for(|held| !*held).await;
            db.subscribe_releases()
        })
        .flat_map(move |released| {
            futures::stream::iter([Ok(Announcement::Opened)]).chain(writes(released))
        })
        .boxed()
    }

    fn acquire_with_ttl(
        &self,
        key: LeaseKey,
        lease_id: Uuid,
        waiting: bool,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        let (db, owner) = (self.db.clone(), self.owner.clone());
        self.run(Op::Acquire, vec![key.clone()], move |coll, now| {
            let retry = coll.docs.get(&key).and_then(|d| d.lease_id) == Some(lease_id);
            let outcome = apply_acquire(coll, &key, &owner, lease_id, ttl, waiting, now);
            // A retry under the same lease id sets neither `lid` nor `aid`:
            // no event on MongoDB either.
            if !retry && matches!(outcome, Ok(AcquireOutcome::Acquired { .. })) {
                db.announce_acquisition(&key, &owner, lease_id);
            }
            outcome
        })
    }

    fn default_ttl(&self) -> Duration {
        self.ttl
    }

    fn renew_with_ttl(
        &self,
        leases: Vec<LeaseRef>,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<Vec<LeaseRef>>> {
        let owner = self.owner.clone();
        let keys = leases.iter().map(|l| l.key.clone()).collect();
        self.run(Op::Renew, keys, move |coll, now| {
            let keys: HashSet<&LeaseKey> = leases.iter().map(|l| &l.key).collect();
            let ids: HashSet<Uuid> = leases.iter().map(|l| l.lease_id).collect();
            let mut kept = HashSet::new();
            for (key, doc) in coll.docs.iter_mut() {
                if lease_matches(key, doc, &owner, &keys, &ids) {
                    doc.exp = now + ttl;
                    doc.renewed = now;
                    kept.extend(doc.lease_id.map(|id| (key.clone(), id)));
                }
            }
            Ok(leases
                .into_iter()
                .filter(|l| !kept.contains(&(l.key.clone(), l.lease_id)))
                .collect())
        })
    }

    fn release(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<u64>> {
        if leases.is_empty() {
            // As MongoStore: no command at all.
            return futures::future::ready(Ok(0)).boxed();
        }
        let keys = leases.iter().map(|l| l.key.clone()).collect();
        let (db, owner) = (self.db.clone(), self.owner.clone());
        let yield_window = self.yield_window;
        let mode = self.release_mode;
        self.run(Op::Release, keys, move |coll, now| {
            let keys: HashSet<&LeaseKey> = leases.iter().map(|l| &l.key).collect();
            let ids: HashSet<Uuid> = leases.iter().map(|l| l.lease_id).collect();
            let matches = |key: &LeaseKey, doc: &Doc| lease_matches(key, doc, &owner, &keys, &ids);
            let (deleted, marked) = coll.release_where(&db, matches, now, yield_window, mode);
            Ok(deleted + marked)
        })
    }

    fn release_owner(&self, except: Vec<Uuid>) -> BoxFuture<'static, Result<u64>> {
        let owner = self.owner.clone();
        let db = self.db.clone();
        let yield_window = self.yield_window;
        let mode = self.release_mode;
        self.run(Op::ReleaseOwner, Vec::new(), move |coll, now| {
            let except: HashSet<Uuid> = except.into_iter().collect();
            let matches = |_: &LeaseKey, doc: &Doc| {
                doc.owner == owner && doc.lease_id.is_some_and(|id| !except.contains(&id))
            };
            let (deleted, marked) = coll.release_where(&db, matches, now, yield_window, mode);
            Ok(deleted + marked)
        })
    }

    fn release_by_owner(&self, owner: String) -> BoxFuture<'static, Result<u64>> {
        let db = self.db.clone();
        let yield_window = self.yield_window;
        let mode = self.release_mode;
        let release = {
            let owner = owner.clone();
            let db = db.clone();
            self.run(Op::ReleaseOwner, Vec::new(), move |coll, now| {
                let matches =
                    |_: &LeaseKey, doc: &Doc| doc.owner == owner && doc.lease_id.is_some();
                Ok(coll.release_where(&db, matches, now, yield_window, mode))
            })
        };
        async move {
            let (deleted, marked) = release.await?;
            if mode == ReleaseMode::Delete && marked > 0 {
                tokio::time::sleep(crate::store::DELETE_DELAY).await;
                db.apply(|coll, now| {
                    coll.delete_released_where(&db, |_, doc| doc.owner == owner, now)
                });
            }
            Ok(deleted + marked)
        }
        .boxed()
    }

    fn delete_released(&self, keys: Vec<LeaseKey>) -> BoxFuture<'static, Result<u64>> {
        if keys.is_empty() || self.release_mode != ReleaseMode::Delete {
            return futures::future::ready(Ok(0)).boxed();
        }
        let db = self.db.clone();
        self.run(Op::Release, keys.clone(), move |coll, now| {
            let keys: HashSet<&LeaseKey> = keys.iter().collect();
            Ok(coll.delete_released_where(&db, |key, _| keys.contains(key), now))
        })
    }

    fn inspect(&self, key: LeaseKey) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let db = self.db.clone();
        self.run(Op::Inspect, vec![key.clone()], move |coll, now| {
            if let Some(foreign) = coll.foreign.get(&key) {
                return Ok(Some(db.foreign_info(&key, foreign, now)));
            }
            Ok(coll.docs.get(&key).map(|doc| db.info(&key, doc, now)))
        })
    }

    fn list(
        &self,
        after: Option<LeaseKey>,
        limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<LeaseKey>)>> {
        let db = self.db.clone();
        self.run(Op::List, Vec::new(), move |coll, now| {
            let mut keys: Vec<&LeaseKey> = coll
                .docs
                .keys()
                .chain(coll.foreign.keys())
                .filter(|k| after.as_ref().is_none_or(|a| *k > a))
                .collect();
            keys.sort();
            keys.truncate(limit);
            let next = (keys.len() == limit)
                .then(|| keys.last().map(|k| (*k).clone()))
                .flatten();
            let page = keys
                .into_iter()
                .map(|k| match coll.foreign.get(k) {
                    Some(foreign) => db.foreign_info(k, foreign, now),
                    None => db.info(k, &coll.docs[k], now),
                })
                .collect();
            Ok((page, next))
        })
    }

    fn force_release(&self, key: LeaseKey) -> BoxFuture<'static, Result<Option<LeaseInfo>>> {
        let db = self.db.clone();
        let yield_window = self.yield_window;
        self.run(Op::ForceRelease, vec![key.clone()], move |coll, now| {
            // A foreign holder's lock is deleted (as MongoStore's `deleteOne`).
            if let Some(foreign) = coll.foreign.remove(&key) {
                db.announce_release(&key);
                return Ok(Some(db.foreign_info(&key, &foreign, now)));
            }
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
        let owner = self.owner.clone();
        self.run(
            Op::SetPayload,
            vec![lease.key.clone()],
            move |coll, _now| match coll.docs.get_mut(&lease.key) {
                Some(doc) if doc.lease_id == Some(lease.lease_id) && doc.owner == owner => {
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
    fn observe(&self, key: LeaseKey) -> BoxStream<'static, Result<Option<LeaseInfo>>> {
        let db = self.db.clone();
        let changed = db.subscribe_changes();
        let state = (db, changed, key, None::<Observed>, true);
        futures::stream::unfold(
            state,
            |(db, mut changed, key, mut last, first)| async move {
                let mut first = first;
                loop {
                    if !first {
                        let expiry = last.as_ref().and_then(|(doc, held, _)| {
                            doc.as_ref().filter(|_| *held).map(|d| d.exp)
                        });
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
                    let foreign = db.foreign(&key);
                    let held = doc
                        .as_ref()
                        .is_some_and(|d| d.lease_id.is_some() && d.exp > now);
                    let state = (doc.clone(), held, foreign.clone());
                    if last.as_ref() == Some(&state) {
                        continue;
                    }
                    last = Some(state);
                    let info = match foreign {
                        Some(foreign) => Some(db.foreign_info(&key, &foreign, now)),
                        None => doc.map(|d| db.info(&key, &d, now)),
                    };
                    return Some((Ok(info), (db, changed, key, last, false)));
                }
            },
        )
        .boxed()
    }
}
