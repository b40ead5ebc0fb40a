//! The shared in-memory lock collection ([`MemoryDb`]) with its change
//! notifications, its reads as [`LeaseInfo`], and the test's operations on
//! it (another owner's acquisition, expiry, deletes, rewrites).

use crate::random::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use mongodb::bson::{DateTime, Document, doc};
use tokio::time::Instant;
use uuid::Uuid;

use super::doc::{Doc, Registration};
use super::rules::{Collection, apply_acquire};
use crate::error::Error;
use crate::foreign::{ForeignLockRule, ForeignRules};
use crate::info::{HolderInfo, LeaseInfo, WaitingOwner};
use crate::key::LeaseKey;
use crate::kind::LeaseKind;
use crate::kind::LeaseShape;
use crate::store::{AcquireOutcome, Announcement, KeyWrite, field};

/// The shared in-memory lock collection. Cheap to clone.
#[derive(Clone)]
pub(crate) struct MemoryDb {
    pub(super) inner: Arc<Mutex<Collection>>,
    /// Bumped after every change, for `observe`.
    changed: Arc<tokio::sync::watch::Sender<()>>,
    /// Writes that may change who holds a key, for `watch_releases` (a
    /// change stream's twin): releases, deletes, acquisitions, rewrites.
    released: tokio::sync::broadcast::Sender<Announcement>,
    /// "Server time" as wall clock: `SystemTime` of `epoch.0` is `epoch.1`.
    epoch: (Instant, SystemTime),
    /// The lock fields of in-document leases in the same "database", one
    /// collection per user collection and lock field
    /// ([`MemoryDb::documents`]), shared by clones (empty in those
    /// collections themselves).
    documents: Arc<Mutex<HashMap<(String, String), MemoryDb>>>,
    /// How far "server time" is behind tokio's clock now (a `$$NOW` that
    /// stepped back), in nanoseconds; shared with the places of
    /// in-document leases.
    behind: Arc<AtomicU64>,
    /// How far "server time" is ahead of tokio's clock now (the clock of a
    /// member that became primary at a failover), in nanoseconds; shared
    /// with the places of in-document leases.
    ahead: Arc<AtomicU64>,
    /// How much faster than tokio's clock "server time" runs from `epoch.0`,
    /// in parts per million; shared with the places of in-document leases.
    faster_ppm: Arc<AtomicU64>,
    /// The documents after each change of the last while, for stale reads
    /// ([`MemoryDb::keep_snapshots`]).
    snapshots: Arc<Mutex<Snapshots>>,
    /// The foreign lock layouts and their expiry rules, as `MongoStore`'s
    /// ([`MemoryDb::with_foreign_rules`]).
    foreign_rules: Arc<ForeignRules>,
    /// Per open stream of writes, when it was last polled and found
    /// nothing yet, if it was (`None`: it has delivered since, and was not
    /// polled again): [`MemoryDb::release_readers`]; closed ones are
    /// dropped as new ones open.
    readers: Arc<Mutex<Vec<std::sync::Weak<Reader>>>>,
    /// How many streams of writes were opened so far.
    streams_opened: Arc<AtomicU64>,
    /// The collection's TTL indexes ([`MemoryDb::set_ttl_indexes`]), which
    /// the TTL monitor's passes apply (`ttl`).
    pub(super) ttl_indexes: Arc<Mutex<Vec<super::ttl::TtlIndex>>>,
    /// What the managers' writes changed of the live leases, once recorded
    /// (`landed`).
    #[cfg(feature = "sim")]
    pub(super) landed: Arc<Mutex<Option<super::landed::Landed>>>,
}

/// When one stream of writes was last polled and found nothing yet
/// ([`MemoryDb::release_readers`]).
pub(super) type Reader = Mutex<Option<Instant>>;

/// What another application's command leaves of a key's document
/// ([`MemoryDb::foreign_write`]), `_id` aside.
pub enum ForeignWrite {
    /// Nothing changed: its filter matched nothing, or its insert hit the
    /// `_id` (E11000).
    Keep,
    /// A new document: an insert, or a replacement.
    Replace(Document),
    /// These fields set on the document there, or inserted with `_id`
    /// (an update with `$set`, upserting).
    Set(Document),
    /// No document: a delete.
    Delete,
}

/// The documents after each change, each with the (tokio) instant it was
/// made, kept for [`Snapshots::keep`] (nothing when zero).
#[derive(Default)]
struct Snapshots {
    keep: Duration,
    log: std::collections::VecDeque<(Instant, Arc<Collection>)>,
}

impl Default for MemoryDb {
    fn default() -> Self {
        let epoch = (
            Instant::now(),
            SystemTime::UNIX_EPOCH + Duration::from_secs(1 << 30),
        );
        MemoryDb {
            inner: Arc::new(Mutex::new(Collection {
                epoch: Some(epoch),
                ..Collection::default()
            })),
            changed: Arc::new(tokio::sync::watch::Sender::new(())),
            released: tokio::sync::broadcast::channel(1024).0,
            epoch,
            documents: Arc::default(),
            behind: Arc::default(),
            ahead: Arc::default(),
            faster_ppm: Arc::default(),
            snapshots: Arc::default(),
            foreign_rules: Arc::default(),
            readers: Arc::default(),
            streams_opened: Arc::default(),
            ttl_indexes: Arc::default(),
            #[cfg(feature = "sim")]
            landed: Arc::default(),
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test must not poison the other assertions' view.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl MemoryDb {
    pub fn new() -> Self {
        Self::default()
    }

    /// The lock fields of in-document leases on user collection
    /// `collection` under lock field `field`, in the same "database" as this
    /// lock collection: one [`Doc`] per document `_id` holding a lock (or
    /// the released state a young lease leaves); no document means "no lock
    /// field". The same names give the same collection, to every manager
    /// and to the test (to expire, delete or force-take documents' leases).
    pub fn documents(&self, collection: &str, field: &str) -> MemoryDb {
        lock(&self.documents)
            .entry((collection.to_string(), field.to_string()))
            .or_insert_with(|| {
                let db = MemoryDb {
                    epoch: self.epoch,
                    behind: self.behind.clone(),
                    ahead: self.ahead.clone(),
                    faster_ppm: self.faster_ppm.clone(),
                    ..MemoryDb::default()
                };
                let mut coll = lock(&db.inner);
                coll.in_documents = true;
                coll.epoch = Some(self.epoch);
                drop(coll);
                db
            })
            .clone()
    }

    /// This collection with the foreign lock rules `rules` (default: the
    /// built-in rules, `{_id, ts, aid}` never expiring), as `MongoStore`
    /// gets them at `connect`. Set it before cloning.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for a rule the
    /// twin does not evaluate ([`eval::check`](crate::foreign::eval::check)).
    pub fn with_foreign_rules(mut self, rules: ForeignRules) -> crate::error::Result<Self> {
        for (name, e) in rules.custom.iter().flat_map(ForeignLockRule::expressions) {
            let reason = |e| format!("foreign_lock.{name}: {e} (the in-memory twin)");
            crate::foreign::eval::check(e)
                .map_err(|e| Error::InvalidConfig { reason: reason(e) })?;
        }
        self.foreign_rules = Arc::new(rules);
        Ok(self)
    }

    /// The foreign lock layouts of this collection.
    pub fn foreign_rules(&self) -> &ForeignRules {
        &self.foreign_rules
    }

    /// Server time `at` as a BSON date (as `$$NOW` reads).
    pub fn date(&self, at: Instant) -> DateTime {
        DateTime::from_system_time(self.system_time(at))
    }

    /// Reports a release or delete of `key` to `watch_releases` streams.
    pub(super) fn announce_release(&self, key: &LeaseKey) {
        self.announce(KeyWrite {
            key: key.clone(),
            freed: true,
            lease_id: None,
            owner: None,
            token: None,
        });
    }

    /// Reports a write to `watch_releases` streams, as a change stream
    /// would (docs/mongodb-behaviour.md, B12).
    pub fn announce(&self, write: KeyWrite) {
        let _ = self.released.send(Announcement::Write(write));
    }

    /// Reports a revocation's request on `key` by owner id `by` to
    /// `watch_releases` streams ("Revocation" in `store`).
    pub(super) fn announce_revocation(&self, key: &LeaseKey, by: &str) {
        let _ = self.released.send(Announcement::RevocationRequested {
            key: key.clone(),
            by: by.to_string(),
        });
    }

    /// Reports a new acquisition of `key` with fencing token `token` (an
    /// insert or replacement on MongoDB, carrying `lid`, `aid` and `tok`; a
    /// handoff also as an update that sets them).
    pub(super) fn announce_acquisition(
        &self,
        key: &LeaseKey,
        owner: &str,
        lease_id: Uuid,
        token: u64,
    ) {
        self.announce(KeyWrite {
            key: key.clone(),
            freed: false,
            lease_id: Some(lease_id),
            owner: Some(owner.to_string()),
            token: Some(token),
        });
    }

    /// Reports a new acquisition of `key` as `kind`, with fencing token
    /// `token`, as MongoDB's change stream shows it: an exclusive one with
    /// its `lid`, `aid` and `tok`; a holder's, only when it inserts the
    /// document (`had_lease_id` is `None`) or removes an exclusive lease's
    /// `lid` (`Some(true)`), as a write without a lease id (with the `aid`
    /// and `tok` it sets at the top); a holder's entry added to a document
    /// without `lid` (`hs` changed without `rl`) is not announced.
    pub(super) fn announce_taken(
        &self,
        key: &LeaseKey,
        owner: &str,
        (lease_id, token): (Uuid, u64),
        kind: LeaseKind,
        had_lease_id: Option<bool>,
    ) {
        if !kind.is_multi_holder() {
            self.announce_acquisition(key, owner, lease_id, token);
        } else if had_lease_id != Some(false) {
            self.announce(KeyWrite {
                key: key.clone(),
                freed: true,
                lease_id: None,
                owner: Some(owner.to_string()),
                token: Some(token),
            });
        }
    }

    /// How many `watch_releases` streams are open.
    pub fn release_watchers(&self) -> usize {
        self.released.receiver_count()
    }

    /// How many `watch_releases` streams the server would run now: those
    /// whose reader waits for their next write, as a `getMore` waits on
    /// the server for at most [`RELEASE_EVENTS_AWAIT`](crate::store::RELEASE_EVENTS_AWAIT)
    /// (the twin's streams wake that often, as a `getMore` answers). A
    /// stream that delivered and was not polled again, or was last polled
    /// longer ago than that, costs the server nothing (B33).
    pub fn release_readers(&self) -> usize {
        let now = Instant::now();
        lock(&self.readers)
            .iter()
            .filter_map(std::sync::Weak::upgrade)
            .filter(|reader| {
                lock(reader)
                    .is_some_and(|at| now.duration_since(at) < crate::store::RELEASE_EVENTS_AWAIT)
            })
            .count()
    }

    /// How many `watch_releases` streams were opened so far.
    pub fn release_streams_opened(&self) -> u64 {
        self.streams_opened.load(Relaxed)
    }

    /// A new stream's entry in [`MemoryDb::release_readers`].
    pub(super) fn reader(&self) -> Arc<Reader> {
        let reader = Arc::new(Mutex::new(None));
        let mut readers = lock(&self.readers);
        readers.retain(|open| open.strong_count() > 0);
        readers.push(Arc::downgrade(&reader));
        self.streams_opened.fetch_add(1, Relaxed);
        reader
    }

    /// How many `observe` streams are open.
    pub fn observers(&self) -> usize {
        self.changed.receiver_count()
    }

    /// Wakes observers after a change.
    pub(super) fn touch(&self) {
        #[cfg(feature = "sim")]
        self.note_server_time();
        self.snapshot_now();
        self.changed.send_replace(());
    }

    /// Keeps the documents after each change for `keep` from now on, so
    /// that a read faulted with [`Fault::Stale`](super::Fault) sees them as
    /// they were up to `keep` ago (zero: keeps none).
    pub fn keep_snapshots(&self, keep: Duration) {
        let mut snapshots = lock(&self.snapshots);
        snapshots.keep = keep;
        snapshots.log.clear();
        drop(snapshots);
        self.snapshot_now();
    }

    /// Logs the documents as they are now, if snapshots are kept.
    fn snapshot_now(&self) {
        let mut snapshots = lock(&self.snapshots);
        if snapshots.keep.is_zero() {
            return;
        }
        let now = Instant::now();
        let docs = Arc::new(lock(&self.inner).clone());
        snapshots.log.push_back((now, docs));
        // Keep the last one older than `keep`: the state `keep` ago.
        while snapshots.log.len() > 1 && snapshots.log[1].0 + snapshots.keep <= now {
            snapshots.log.pop_front();
        }
    }

    /// Applies the read `operation` at server time now to a copy of the
    /// documents as they were `lag` ago (as they are, if no snapshot is
    /// that old): a majority snapshot behind the primary. Nothing it
    /// changes is kept.
    pub(super) fn apply_to_snapshot<T>(
        &self,
        lag: Duration,
        operation: impl FnOnce(&mut Collection, Instant) -> T,
    ) -> T {
        let now = self.server_now();
        let at = Instant::now().checked_sub(lag);
        let snapshot = at.and_then(|at| {
            let snapshots = lock(&self.snapshots);
            snapshots
                .log
                .iter()
                .rev()
                .find(|(made, _)| *made <= at)
                .map(|(_, docs)| docs.clone())
        });
        let mut docs = match snapshot {
            Some(docs) => (*docs).clone(),
            None => lock(&self.inner).clone(),
        };
        operation(&mut docs, now)
    }

    /// The "server's" wall-clock time of `at`.
    pub fn system_time(&self, at: Instant) -> SystemTime {
        match at.checked_duration_since(self.epoch.0) {
            Some(after) => self.epoch.1 + after,
            None => self.epoch.1 - self.epoch.0.duration_since(at),
        }
    }

    /// `doc` as a [`LeaseInfo`] judged at `now`, as `store::lease_info`
    /// reads a lock document: its stored kind, its live holders in `hs`,
    /// and `hl` while it is ahead.
    pub fn info(&self, key: &LeaseKey, doc: &Doc, now: Instant) -> LeaseInfo {
        let kind = doc.stored_kind();
        let holders: Vec<HolderInfo> = doc
            .live_holders(now)
            .map(|h| HolderInfo {
                owner_id: h.owner.clone(),
                fencing_token: h.token,
                acquired_at: self.system_time(h.acquired),
                renewed_at: self.system_time(h.renewed),
                expires_at: self.system_time(h.exp),
                permits: h.permits,
            })
            .collect();
        let hold_until = doc.hold_until.filter(|until| *until > now);
        // A lease released before its minimum hold keeps the key until `hl`.
        let held = if kind.is_multi_holder() {
            !holders.is_empty()
        } else {
            (doc.lease_id.is_some() || hold_until.is_some()) && doc.exp > now
        };
        LeaseInfo {
            key: key.clone(),
            owner_id: doc.owner.clone(),
            fencing_token: doc.token,
            acquired_at: self.system_time(doc.acquired),
            renewed_at: self.system_time(doc.renewed),
            expires_at: self.system_time(doc.exp),
            server_time: self.system_time(now),
            payload: doc.payload.clone(),
            held,
            foreign: false,
            kind,
            holders,
            hold_until: hold_until.map(|until| self.system_time(until)),
            lock_delay_until: (doc.not_before)
                .filter(|until| *until > now)
                .map(|until| self.system_time(until)),
            waiters: self.waiters(doc, now),
            transitions: doc.transitions,
            released: !kind.is_multi_holder() && doc.lease_id.is_none(),
        }
    }

    /// The waiting owners of `doc` at `now`, as `store::live_waiters` reads
    /// them: the live entries of `q` in order, then a live `xw` mark.
    fn waiters(&self, doc: &Doc, now: Instant) -> Vec<WaitingOwner> {
        let queued = doc
            .live_queue(now)
            .map(|w| (w.owner.clone(), Some(self.system_time(w.at)), w.re));
        let mark = doc.exclusive_waiter.clone().map(|(o, exp)| (o, None, exp));
        queued
            .chain(mark.filter(|(_, _, exp)| *exp > now))
            .map(|(owner_id, registered_at, exp)| WaitingOwner {
                owner_id,
                kind: crate::kind::LeaseKind::Exclusive,
                registered_at,
                expires_at: self.system_time(exp),
            })
            .collect()
    }

    /// A foreign holder's lock document (`_id` included) as the reads of
    /// `MongoStore` project it at server time `now`: with the fields of the
    /// rules ([`ForeignRules::annotate`]) and `now`.
    pub(super) fn project_foreign(&self, doc: &Document, now: DateTime) -> Document {
        let ours = crate::store::is_our_layout(doc);
        let mut doc = self.foreign_rules.annotate(doc, ours, now);
        doc.insert("now", now);
        doc
    }

    /// A foreign holder's lock as a [`LeaseInfo`] judged at `now`, as
    /// `MongoStore` reads it (`store::lease_info`).
    pub fn foreign_info(&self, key: &LeaseKey, foreign: &Document, now: Instant) -> LeaseInfo {
        let projected = self.project_foreign(foreign, self.date(now));
        crate::store::lease_info(key, &projected, self.system_time(now))
    }

    /// The foreign holder's lock document under `key`, if any.
    pub fn foreign(&self, key: impl Into<LeaseKey>) -> Option<Document> {
        lock(&self.inner).foreign.get(&key.into()).cloned()
    }

    /// The expiry (`exp`, server time) of the document under `key` while it
    /// holds the exclusive lease of fencing token `token` (with a lease id),
    /// without copying it.
    pub fn lease_expiry(&self, key: &LeaseKey, token: u64) -> Option<Instant> {
        let coll = lock(&self.inner);
        let doc = coll.docs.get(key)?;
        (doc.token == token && doc.lease_id.is_some()).then_some(doc.exp)
    }

    /// A snapshot of the document under `key`.
    pub fn doc(&self, key: impl Into<LeaseKey>) -> Option<Doc> {
        let key = &key.into();
        lock(&self.inner).docs.get(key).cloned()
    }

    /// Waits until the document under `key` exists and satisfies `pred`,
    /// woken by each change (no polling).
    pub async fn changed_until(&self, key: impl Into<LeaseKey>, pred: impl Fn(&Doc) -> bool) {
        let key = &key.into();
        let mut changed = self.changed.subscribe();
        while !self.doc(key).is_some_and(|d| pred(&d)) {
            changed
                .changed()
                .await
                .expect("the database outlives its tests");
        }
    }

    /// A snapshot of every document.
    pub fn docs(&self) -> HashMap<LeaseKey, Doc> {
        lock(&self.inner).docs.clone()
    }

    /// The owner holding `key` now (with a lease id and `exp > now`), if any.
    pub fn holder(&self, key: impl Into<LeaseKey>) -> Option<String> {
        let key = &key.into();
        self.doc(key)
            .filter(|d| d.lease_id.is_some() && !d.is_free_at(Instant::now()))
            .map(|d| d.owner)
    }

    /// Another owner acquires `key` by the protocol's rule, now.
    pub fn try_take(&self, key: impl Into<LeaseKey>, owner: &str, ttl: Duration) -> AcquireOutcome {
        self.try_take_as(key, owner, ttl, LeaseKind::Exclusive)
    }

    /// Another owner acquires `key` as `kind` by the protocol's rule, now
    /// (without waiting: no mark).
    pub fn try_take_as(
        &self,
        key: impl Into<LeaseKey>,
        owner: &str,
        ttl: Duration,
        kind: LeaseKind,
    ) -> AcquireOutcome {
        let key = &key.into();
        let lease_id = Uuid::new_v4();
        let shape = LeaseShape {
            kind,
            hold_at_least: None,
            permits_taken: None,
        };
        self.change(|coll| {
            let had_lease_id = coll.docs.get(key).map(|d| d.lease_id.is_some());
            let now = Instant::now();
            let outcome = apply_acquire(
                self,
                coll,
                key,
                owner,
                lease_id,
                ttl,
                false,
                shape,
                now,
                Registration {
                    window: Duration::ZERO,
                    bound: crate::store::MAX_QUEUE,
                },
                None,
            );
            let outcome = outcome.expect("try_take on a foreign document");
            if let AcquireOutcome::Acquired { token } = outcome {
                self.announce_taken(key, owner, (lease_id, token), kind, had_lease_id);
            }
            outcome
        })
    }

    /// Another owner takes `key` now whatever its state (as if this process's
    /// lease had expired on the server unseen): new lease id, token + 1,
    /// `exp = now + ttl`. Returns the new token.
    pub fn force_take(&self, key: impl Into<LeaseKey>, owner: &str, ttl: Duration) -> u64 {
        let key = &key.into();
        let (now, lease_id) = (Instant::now(), Uuid::new_v4());
        self.change(|coll| {
            coll.foreign.remove(key);
            let vacant = coll.vacant(now);
            let floor = coll.token_floor(now);
            let doc = coll.docs.entry(key.clone()).or_insert(vacant);
            let token = doc.take(owner, lease_id, ttl, None, (now, floor));
            self.announce_acquisition(key, owner, lease_id, token);
            token
        })
    }

    /// Makes `key` expire now (`exp = min(exp, now)`), keeping its lease id:
    /// the server's view of a holder whose renewals stopped reaching it.
    pub fn expire(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        self.change(|coll| {
            if let Some(doc) = coll.docs.get_mut(key) {
                doc.exp = doc.floor(doc.exp.min(Instant::now()));
            }
        });
    }

    /// Makes the holder `lease_id` of `key` (an entry of `hs`) expire now,
    /// keeping it in `hs`: the server's view of a holder whose renewals
    /// stopped reaching it. The key's `exp` becomes its holders' latest.
    pub fn expire_holder(&self, key: impl Into<LeaseKey>, lease_id: Uuid) {
        let key = &key.into();
        let now = Instant::now();
        self.change(|coll| {
            let doc = coll.docs.get_mut(key).expect("a document");
            let holder = doc
                .holders
                .iter_mut()
                .find(|h| h.lease_id == Some(lease_id));
            let holder = holder.expect("a holder with this lease id");
            holder.exp = holder.exp.min(now);
            doc.exp = doc.holders.iter().map(|h| h.exp).max().unwrap_or(now);
        });
    }

    /// Makes the exclusive waiter's mark on `key` (`xw`) expire now: a
    /// waiter that stopped retrying.
    pub fn expire_mark(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        let now = Instant::now();
        self.change(|coll| {
            let doc = coll.docs.get_mut(key);
            let mark = doc.and_then(|doc| doc.exclusive_waiter.as_mut());
            let mark = mark.expect("a waiting mark");
            mark.1 = mark.1.min(now);
        });
    }

    /// Makes every registration in the queue of `key` (`q`) expire now
    /// (waiters that stopped retrying).
    pub fn lapse_registrations(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        let now = Instant::now();
        self.change(|coll| {
            let doc = coll.docs.get_mut(key).expect("a document with a queue");
            assert!(!doc.queue.is_empty(), "no queue on {key:?}");
            for entry in &mut doc.queue {
                entry.re = entry.re.min(now);
            }
        });
    }

    /// Makes the minimum hold of `key` (`hl`) pass now, and its `exp` not
    /// later than now.
    pub fn expire_hold(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        let now = Instant::now();
        self.change(|coll| {
            let doc = coll.docs.get_mut(key).expect("a document");
            let until = doc.hold_until.as_mut().expect("a minimum hold");
            *until = (*until).min(now);
            doc.exp = doc.exp.min(now);
        });
    }

    /// Moves the `exp` of the released key `key` (no lease id) `ahead` past
    /// now, as a release on a server clock that ran ahead leaves it.
    pub fn run_ahead(&self, key: impl Into<LeaseKey>, ahead: Duration) {
        let key = &key.into();
        self.change(|coll| {
            let doc = coll.docs.get_mut(key).expect("a document");
            assert!(doc.lease_id.is_none(), "{key:?} is not released");
            doc.exp = Instant::now() + ahead;
        });
    }

    /// Writes a raw document (e.g. a lease left by an earlier process).
    pub fn put(&self, key: impl Into<LeaseKey>, doc: Doc) {
        let key = &key.into();
        let write = KeyWrite {
            key: key.clone(),
            freed: doc.lease_id.is_none(),
            lease_id: doc.lease_id,
            owner: Some(doc.owner.clone()),
            token: Some(doc.token),
        };
        self.change(|coll| {
            coll.foreign.remove(key);
            coll.docs.insert(key.clone(), doc);
            self.announce(write);
        });
    }

    /// Another application rewrites the owner id of `key` (`$set: {aid}`),
    /// keeping everything else.
    pub fn set_owner(&self, key: impl Into<LeaseKey>, owner: &str) {
        let key = key.into();
        let mut coll = lock(&self.inner);
        let Some(doc) = coll.docs.get_mut(&key) else {
            return;
        };
        doc.owner = owner.to_string();
        drop(coll);
        self.announce(KeyWrite {
            key,
            freed: false,
            lease_id: None,
            owner: Some(owner.to_string()),
            token: None,
        });
        self.touch();
    }

    /// Deletes the document (the TTL monitor, another application). Nothing
    /// of it is remembered, as on MongoDB: the next acquisition's token is
    /// the token rule's time part.
    pub fn delete(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        self.change(|coll| {
            coll.docs.remove(key);
            coll.foreign.remove(key);
            self.announce_release(key);
        });
    }

    /// In a place of in-document leases ([`MemoryDb::documents`]): the user's
    /// document `key` does not exist (and holds no lock field) until an
    /// acquisition with fields to create creates it; one without them fails
    /// with `Error::DocumentNotFound`, as on MongoDB.
    pub fn remove_user_document(&self, key: impl Into<LeaseKey>) {
        let key = key.into();
        lock(&self.inner).missing.insert(key.clone());
        self.delete(key);
    }

    /// A receiver of the writes announced from now on.
    pub(super) fn subscribe_releases(&self) -> tokio::sync::broadcast::Receiver<Announcement> {
        self.released.subscribe()
    }

    /// A receiver woken after every change from now on.
    pub(super) fn subscribe_changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// A receiver woken after every change of the documents (and every
    /// step of the server's clock ahead, [`MemoryDb::set_ahead`]) from now
    /// on.
    pub fn changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Sets server time `behind` tokio's clock from now on (zero: the
    /// same), as a server whose `$$NOW` stepped back (docs/mongodb-behaviour.md,
    /// B3); it steps forward again when set smaller.
    pub fn set_behind(&self, behind: Duration) {
        let nanos = u64::try_from(behind.as_nanos()).unwrap_or(u64::MAX);
        self.behind.store(nanos, Relaxed);
    }

    /// Sets server time `ahead` of tokio's clock (before any step back of
    /// [`MemoryDb::set_behind`]) from now on: the clock of the member that
    /// became primary at a failover, ahead of the last one's (set smaller:
    /// behind it). Members' clocks are within a bound of each other, which
    /// the managers assume (`Timing::clock_skew`); the simulation's failovers
    /// step within it, both ways.
    pub fn set_ahead(&self, ahead: Duration) {
        let nanos = u64::try_from(ahead.as_nanos()).unwrap_or(u64::MAX);
        self.ahead.store(nanos, Relaxed);
        // A step is a change of every expiry's instant in real time.
        self.changed.send_replace(());
    }

    /// How far server time is ahead of tokio's clock now
    /// ([`MemoryDb::set_ahead`]).
    pub fn ahead(&self) -> Duration {
        Duration::from_nanos(self.ahead.load(Relaxed))
    }

    /// Makes server time run `ppm` parts per million faster than tokio's
    /// clock, counted from this collection's creation: a server clock whose
    /// rate differs from the managers' monotonic clocks (the safety margin
    /// covers that difference over one TTL, docs/safety.md). Set it before
    /// the first operation: a change later moves server time at once.
    pub fn set_faster_ppm(&self, ppm: u32) {
        self.faster_ppm.store(u64::from(ppm), Relaxed);
    }

    /// The server's time now: tokio's clock, run
    /// [faster](MemoryDb::set_faster_ppm) from the collection's creation, plus
    /// how far it is [ahead](MemoryDb::set_ahead), less how far it is
    /// [behind](MemoryDb::set_behind).
    pub fn server_now(&self) -> Instant {
        let at = Instant::now();
        let behind = self.behind.load(Relaxed);
        let forward = self.ahead.load(Relaxed);
        let ppm = self.faster_ppm.load(Relaxed);
        let elapsed = at.saturating_duration_since(self.epoch.0);
        let ahead = Duration::from_nanos(
            u64::try_from(elapsed.as_nanos() * u128::from(ppm) / 1_000_000).unwrap_or(u64::MAX),
        );
        at + ahead + Duration::from_nanos(forward) - Duration::from_nanos(behind)
    }

    /// Tokio's instant at which server time reaches `at` (the inverse of
    /// [`MemoryDb::server_now`] at the current steps; `at` itself if
    /// that is before the collection's creation).
    pub fn real_at(&self, at: Instant) -> Instant {
        let behind = self.behind.load(Relaxed);
        let forward = self.ahead.load(Relaxed);
        let ppm = self.faster_ppm.load(Relaxed);
        let Some(elapsed) = (at + Duration::from_nanos(behind))
            .checked_sub(Duration::from_nanos(forward))
            .and_then(|at| at.checked_duration_since(self.epoch.0))
        else {
            return at;
        };
        let real = elapsed.as_nanos() * 1_000_000 / (1_000_000 + u128::from(ppm));
        self.epoch.0 + Duration::from_nanos(u64::try_from(real).unwrap_or(u64::MAX))
    }

    /// Another application's `deleteMany({aid: owner})`: deletes every
    /// document whose `aid` is `owner` (its own locks; ours carry the
    /// managers' owner ids). Returns how many.
    pub fn delete_where_owner(&self, owner: &str) -> usize {
        let mut coll = lock(&self.inner);
        let mut keys: Vec<LeaseKey> = coll
            .docs
            .iter()
            .filter(|(_, doc)| doc.owner == owner)
            .map(|(key, _)| key.clone())
            .chain(
                coll.foreign
                    .iter()
                    .filter(|(_, f)| f.get_str(field::OWNER) == Ok(owner))
                    .map(|(key, _)| key.clone()),
            )
            .collect();
        keys.sort();
        for key in &keys {
            coll.docs.remove(key);
            coll.foreign.remove(key);
        }
        drop(coll);
        for key in &keys {
            self.announce_release(key);
        }
        self.touch();
        keys.len()
    }

    /// Another application's command on `key`, as MongoDB applies it:
    /// `write` sees the document there as stored (one of ours as
    /// `Doc::stored` renders it; `None` for none) and says what the command
    /// leaves, which is then a foreign holder's lock. An insert, a
    /// replacement or a delete is announced as `MongoStore` reads its
    /// change event, a `$set` of another application's fields not (the
    /// stream's `$match` drops it; docs/mongodb-behaviour.md, B12).
    /// Returns whether it wrote.
    pub fn foreign_write(
        &self,
        key: impl Into<LeaseKey>,
        write: impl FnOnce(Option<&Document>) -> ForeignWrite,
    ) -> bool {
        let key = key.into();
        let mut coll = lock(&self.inner);
        let stored = self.stored_in(&coll, &key);
        let id = doc! { field::ID: key.to_bson() };
        let (new, announced) = match (write(stored.as_ref()), stored) {
            (ForeignWrite::Keep, _) | (ForeignWrite::Delete, None) => return false,
            (ForeignWrite::Delete, Some(_)) => (None, true),
            (ForeignWrite::Set(fields), Some(mut doc)) => {
                doc.extend(fields);
                (Some(doc), false)
            }
            (ForeignWrite::Set(fields) | ForeignWrite::Replace(fields), _) => {
                (Some(id.into_iter().chain(fields).collect()), true)
            }
        };
        // As MongoStore reads its change event: freed, with the `aid` left.
        let aid = new.as_ref().and_then(|d| d.get_str(field::OWNER).ok());
        let owner = aid.filter(|_| announced).map(str::to_string);
        coll.docs.remove(&key);
        match new {
            Some(doc) => coll.foreign.insert(key.clone(), doc),
            None => coll.foreign.remove(&key),
        };
        drop(coll);
        if announced {
            let (freed, lease_id, token) = (true, None, None);
            self.announce(KeyWrite {
                key,
                freed,
                lease_id,
                owner,
                token,
            });
        }
        self.touch();
        true
    }

    /// The document under `key` as MongoDB stores it, as a `findOne` reads
    /// it: one of ours as `Doc::stored` renders it, or a foreign holder's.
    pub fn stored(&self, key: impl Into<LeaseKey>) -> Option<Document> {
        self.stored_in(&lock(&self.inner), &key.into())
    }

    fn stored_in(&self, coll: &Collection, key: &LeaseKey) -> Option<Document> {
        match coll.docs.get(key) {
            Some(doc) => Some(doc.stored(self, key)),
            None => coll.foreign.get(key).cloned(),
        }
    }

    /// A test's `change` to the collection, then observers woken.
    fn change<T>(&self, change: impl FnOnce(&mut Collection) -> T) -> T {
        let result = change(&mut lock(&self.inner));
        self.touch();
        result
    }

    /// Applies `operation` to the collection at server time now, then wakes
    /// observers.
    pub(super) fn apply<T>(&self, operation: impl FnOnce(&mut Collection, Instant) -> T) -> T {
        let now = self.server_now();
        let result = operation(&mut lock(&self.inner), now);
        self.touch();
        result
    }
}
