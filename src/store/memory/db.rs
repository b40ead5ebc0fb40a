//! The in-memory document model: [`Doc`], the shared collection
//! ([`MemoryDb`]) with its change notifications, and the protocol's rules
//! applied to it (acquire, the lease filter, release).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use mongodb::bson::Document;
use tokio::time::Instant;
use uuid::Uuid;

use crate::config::{DELETE_MIN_TOKEN_AGE, ReleaseMode};
use crate::error::Result;
use crate::key::LeaseKey;
use crate::lease::LeaseInfo;
use crate::store::{AcquireOutcome, KeyWrite};

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
        Doc::fresh(owner, Some(Uuid::new_v4()), token, now, now + ttl)
    }

    /// A released document with token `token` (what an upsert starts from).
    fn vacant(now: Instant, token: u64) -> Doc {
        Doc::fresh("", None, token, now, now)
    }

    /// A new acquisition by `owner` under `lease_id` at `now`: token + 1,
    /// `exp = now + ttl`, no payload and no fairness marks. Returns the token.
    fn take(&mut self, owner: &str, lease_id: Uuid, ttl: Duration, now: Instant) -> u64 {
        *self = Doc::fresh(owner, Some(lease_id), self.token + 1, now, now + ttl);
        self.token
    }

    /// A document acquired (or released) at `now`, with no payload and no
    /// fairness marks.
    fn fresh(owner: &str, lease_id: Option<Uuid>, token: u64, now: Instant, exp: Instant) -> Doc {
        Doc {
            owner: owner.to_string(),
            lease_id,
            token,
            exp,
            acquired: now,
            renewed: now,
            payload: None,
            waiting_since: None,
            yield_until: None,
        }
    }

    /// The lease as observers see it: without the fairness fields.
    pub(super) fn observed(&self) -> Doc {
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

/// A foreign holder's lock document (another application's `{_id, ts, aid}`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Foreign {
    /// `aid`: the other application's owner id.
    pub owner: String,
    /// `ts`: when it was written.
    pub written: Instant,
}

/// The documents of a [`MemoryDb`], as its operations see them.
#[derive(Default)]
pub(crate) struct Collection {
    pub(super) docs: HashMap<LeaseKey, Doc>,
    /// Keys occupied by a foreign holder's lock document (not written by
    /// the protocol): never modified, except deleted by a force release.
    pub(super) foreign: HashMap<LeaseKey, Foreign>,
    /// The token of each deleted document: a new document of its key starts
    /// above it, as on MongoDB.
    deleted_tokens: HashMap<LeaseKey, u64>,
    /// In a place of in-document leases: user documents that do not exist
    /// ([`MemoryDb::remove_user_document`]); every other one does.
    pub(super) missing: std::collections::HashSet<LeaseKey>,
}

impl Collection {
    /// What a new document of `key` starts from at `now`.
    fn vacant(&self, key: &LeaseKey, now: Instant) -> Doc {
        Doc::vacant(now, self.deleted_tokens.get(key).copied().unwrap_or(0))
    }
}

/// The shared in-memory lock collection. Cheap to clone.
#[derive(Clone)]
pub(crate) struct MemoryDb {
    inner: Arc<Mutex<Collection>>,
    /// Bumped after every change, for `observe`.
    changed: Arc<tokio::sync::watch::Sender<()>>,
    /// Writes that may change who holds a key, for `watch_releases` (a
    /// change stream's twin): releases, deletes, acquisitions, rewrites.
    released: tokio::sync::broadcast::Sender<KeyWrite>,
    /// "Server time" as wall clock: `SystemTime` of `epoch.0` is `epoch.1`.
    epoch: (Instant, SystemTime),
    /// The lock fields of in-document leases in the same "database", one
    /// collection per user collection and lock field
    /// ([`MemoryDb::documents`]), shared by clones (empty in those
    /// collections themselves).
    documents: Arc<Mutex<HashMap<(String, String), MemoryDb>>>,
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
            documents: Arc::default(),
        }
    }
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panicking test must not poison the other assertions' view.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The acquire rule, applied at server time `now`.
pub(super) fn apply_acquire(
    coll: &mut Collection,
    key: &LeaseKey,
    owner: &str,
    lease_id: Uuid,
    ttl: Duration,
    waiting: bool,
    now: Instant,
) -> Result<AcquireOutcome> {
    if let Some(foreign) = coll.foreign.get(key) {
        return Ok(AcquireOutcome::Held {
            holder: foreign.owner.clone(),
            remaining: None,
        });
    }
    match coll.docs.get_mut(key) {
        None => {
            let mut doc = coll.vacant(key, now);
            let token = doc.take(owner, lease_id, ttl, now);
            coll.docs.insert(key.clone(), doc);
            Ok(AcquireOutcome::Acquired { token })
        }
        Some(doc) if doc.lease_id == Some(lease_id) && doc.owner == owner => {
            // A retry of an acquisition that landed: same token, fresh expiry.
            // (A document rewritten to another owner is not ours any more.)
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
                remaining: Some(until.saturating_duration_since(now)),
            })
        }
    }
}

/// The `_id $in keys, lid $in ids, aid = owner` filter of
/// `MongoStore::lease_filter`.
pub(super) fn lease_matches(
    key: &LeaseKey,
    doc: &Doc,
    owner: &str,
    keys: &HashSet<&LeaseKey>,
    ids: &HashSet<Uuid>,
) -> bool {
    keys.contains(key) && doc.lease_id.is_some_and(|id| ids.contains(&id)) && doc.owner == owner
}

/// The release rule on one matching document at `now`.
pub(super) fn release_doc(doc: &mut Doc, now: Instant, yield_window: Duration) {
    doc.exp = doc.exp.min(now);
    doc.lease_id = None;
    if doc.waiting_since.take().is_some() {
        doc.yield_until = Some(now + yield_window);
    }
}

impl Collection {
    /// The release rule on the documents of `keys` for which `matches` holds,
    /// at `now`, in `mode`: in delete mode a document nobody waited for
    /// (`wt` unset) and acquired at least
    /// [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) ago is deleted
    /// (the twin's stand-in for the token-age rule; its next token continues
    /// from the deleted one), every other one is marked released
    /// ([`release_doc`]). Announces each key; returns `(deleted, marked)`.
    pub(super) fn release_where(
        &mut self,
        db: &MemoryDb,
        matches: impl Fn(&LeaseKey, &Doc) -> bool,
        now: Instant,
        yield_window: Duration,
        mode: ReleaseMode,
    ) -> (u64, u64) {
        let keys: Vec<LeaseKey> = self
            .docs
            .iter()
            .filter(|(k, d)| matches(k, d))
            .map(|(k, _)| k.clone())
            .collect();
        let (mut deleted, mut marked) = (0, 0);
        for key in keys {
            let doc = self.docs.get_mut(&key).expect("listed above");
            let deletable = mode == ReleaseMode::Delete
                && doc.waiting_since.is_none()
                && now >= doc.acquired + DELETE_MIN_TOKEN_AGE;
            if deletable {
                let doc = self.docs.remove(&key).expect("listed above");
                self.deleted_tokens.insert(key.clone(), doc.token);
                deleted += 1;
            } else {
                release_doc(doc, now, yield_window);
                marked += 1;
            }
            db.announce_release(&key);
        }
        (deleted, marked)
    }

    /// Delete mode's follow-up: deletes the released documents (no lease
    /// id, not yielded at `now`) for which `matches` holds, acquired at least
    /// [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) ago. Returns how many.
    pub(super) fn delete_released_where(
        &mut self,
        db: &MemoryDb,
        matches: impl Fn(&LeaseKey, &Doc) -> bool,
        now: Instant,
    ) -> u64 {
        let keys: Vec<LeaseKey> = self
            .docs
            .iter()
            .filter(|(k, d)| {
                matches(k, d)
                    && d.lease_id.is_none()
                    && d.yield_until.is_none_or(|until| until <= now)
                    && now >= d.acquired + DELETE_MIN_TOKEN_AGE
            })
            .map(|(k, _)| k.clone())
            .collect();
        for key in &keys {
            let doc = self.docs.remove(key).expect("listed above");
            self.deleted_tokens.insert(key.clone(), doc.token);
            db.announce_release(key);
        }
        keys.len() as u64
    }
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
            .or_insert_with(|| MemoryDb {
                epoch: self.epoch,
                ..MemoryDb::default()
            })
            .clone()
    }

    /// Reports a release or delete of `key` to `watch_releases` streams.
    pub(super) fn announce_release(&self, key: &LeaseKey) {
        self.announce(KeyWrite {
            key: key.clone(),
            freed: true,
            lease_id: None,
            owner: None,
        });
    }

    /// Reports a write to `watch_releases` streams, as a change stream
    /// would (docs/mongodb-behaviour.md, B12).
    pub fn announce(&self, write: KeyWrite) {
        let _ = self.released.send(write);
    }

    /// Reports a new acquisition of `key` (an insert or replacement on
    /// MongoDB, carrying `lid` and `aid`).
    pub(super) fn announce_acquisition(&self, key: &LeaseKey, owner: &str, lease_id: Uuid) {
        self.announce(KeyWrite {
            key: key.clone(),
            freed: false,
            lease_id: Some(lease_id),
            owner: Some(owner.to_string()),
        });
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
    pub(super) fn touch(&self) {
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
    pub fn info(&self, key: &LeaseKey, doc: &Doc, now: Instant) -> LeaseInfo {
        LeaseInfo {
            key: key.clone(),
            owner_id: doc.owner.clone(),
            fencing_token: doc.token,
            acquired_at: self.system_time(doc.acquired),
            renewed_at: self.system_time(doc.renewed),
            expires_at: self.system_time(doc.exp),
            server_time: self.system_time(now),
            payload: doc.payload.clone(),
            held: doc.lease_id.is_some() && doc.exp > now,
            foreign: false,
            kind: crate::LeaseKind::Exclusive,
            holders: Vec::new(),
            hold_until: None,
        }
    }

    /// A foreign holder's lock as a [`LeaseInfo`] judged at `now`, as
    /// `MongoStore` reads `{_id, ts, aid}`.
    pub fn foreign_info(&self, key: &LeaseKey, foreign: &Foreign, now: Instant) -> LeaseInfo {
        let written = self.system_time(foreign.written);
        let now = self.system_time(now);
        LeaseInfo {
            key: key.clone(),
            owner_id: foreign.owner.clone(),
            fencing_token: 0,
            acquired_at: written,
            renewed_at: written,
            expires_at: now,
            server_time: now,
            payload: None,
            held: true,
            foreign: true,
            kind: crate::LeaseKind::Exclusive,
            holders: Vec::new(),
            hold_until: None,
        }
    }

    /// The foreign holder's lock document under `key`, if any.
    pub fn foreign(&self, key: impl Into<LeaseKey>) -> Option<Foreign> {
        lock(&self.inner).foreign.get(&key.into()).cloned()
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

    /// `true` if another owner could acquire `key` now.
    pub fn is_free(&self, key: impl Into<LeaseKey>) -> bool {
        let key = &key.into();
        match self.doc(key) {
            None => true,
            Some(doc) => doc.is_free_at(Instant::now()),
        }
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
        let key = &key.into();
        let lease_id = Uuid::new_v4();
        let outcome = apply_acquire(
            &mut lock(&self.inner),
            key,
            owner,
            lease_id,
            ttl,
            false,
            Instant::now(),
        )
        .expect("try_take on a foreign document");
        if matches!(outcome, AcquireOutcome::Acquired { .. }) {
            self.announce_acquisition(key, owner, lease_id);
        }
        self.touch();
        outcome
    }

    /// Another owner takes `key` now whatever its state (as if this process's
    /// lease had expired on the server unseen): new lease id, token + 1,
    /// `exp = now + ttl`. Returns the new token.
    pub fn force_take(&self, key: impl Into<LeaseKey>, owner: &str, ttl: Duration) -> u64 {
        let key = &key.into();
        let mut coll = lock(&self.inner);
        coll.foreign.remove(key);
        let now = Instant::now();
        let vacant = coll.vacant(key, now);
        let lease_id = Uuid::new_v4();
        let token = coll
            .docs
            .entry(key.clone())
            .or_insert(vacant)
            .take(owner, lease_id, ttl, now);
        drop(coll);
        self.announce_acquisition(key, owner, lease_id);
        self.touch();
        token
    }

    /// Makes `key` expire now (`exp = min(exp, now)`), keeping its lease id:
    /// the server's view of a holder whose renewals stopped reaching it.
    pub fn expire(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        if let Some(doc) = lock(&self.inner).docs.get_mut(key) {
            doc.exp = doc.exp.min(Instant::now());
        }
        self.touch();
    }

    /// Writes a raw document (e.g. a lease left by an earlier process).
    pub fn put(&self, key: impl Into<LeaseKey>, doc: Doc) {
        let key = &key.into();
        let write = KeyWrite {
            key: key.clone(),
            freed: doc.lease_id.is_none(),
            lease_id: doc.lease_id,
            owner: Some(doc.owner.clone()),
        };
        let mut coll = lock(&self.inner);
        coll.foreign.remove(key);
        coll.docs.insert(key.clone(), doc);
        drop(coll);
        self.announce(write);
        self.touch();
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
        });
        self.touch();
    }

    /// Occupies `key` with a foreign holder's lock document (`aid` =
    /// `owner`, `ts` = now): acquire reports it held with no known expiry,
    /// renew, release and release by owner never match it.
    pub fn put_foreign(&self, key: impl Into<LeaseKey>, owner: &str) {
        let key = key.into();
        let mut coll = lock(&self.inner);
        coll.docs.remove(&key);
        let foreign = Foreign {
            owner: owner.to_string(),
            written: Instant::now(),
        };
        coll.foreign.insert(key, foreign);
        drop(coll);
        self.touch();
    }

    /// Deletes the document (the TTL monitor). The next acquisition's token
    /// is still greater than the deleted document's, as on MongoDB.
    pub fn delete(&self, key: impl Into<LeaseKey>) {
        let key = &key.into();
        let mut coll = lock(&self.inner);
        if let Some(doc) = coll.docs.remove(key) {
            coll.deleted_tokens.insert(key.clone(), doc.token);
        }
        coll.foreign.remove(key);
        drop(coll);
        self.announce_release(key);
        self.touch();
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
    pub(super) fn subscribe_releases(&self) -> tokio::sync::broadcast::Receiver<KeyWrite> {
        self.released.subscribe()
    }

    /// A receiver woken after every change from now on.
    pub(super) fn subscribe_changes(&self) -> tokio::sync::watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// Applies `operation` to the collection at server time now, then wakes
    /// observers.
    pub(super) fn apply<T>(&self, operation: impl FnOnce(&mut Collection, Instant) -> T) -> T {
        let result = operation(&mut lock(&self.inner), Instant::now());
        self.touch();
        result
    }
}
