//! The twin's top-level `LockId` / `LockTime` fields
//! ([`LockIdFields`](crate::LockIdFields), `DocumentStore`'s `top_lock`):
//! another client's lock of a user document ([`TheirLock`]), that client's
//! own lock and unlock ([`MemoryDb::lock_by_id`], [`MemoryDb::unlock_by_id`]),
//! and how our acquisitions and reads see its lock.
//!
//! Without a [`TheirLock`], `LockId` and `LockTime` are those of the lease
//! in the twin's [`Doc`]: its lease id (null once released) and its last
//! renewal (`Doc::renewed`, server time). A client's takeover of a document
//! makes the lease there no longer current, as on MongoDB, where every
//! write of ours is conditional on `LockId`: the twin removes its lease id
//! (nothing of ours matches it any more), keeps its token (the token rule
//! continues from it) and its expiry at most the takeover's time.

use std::time::Duration;

use mongodb::bson::{DateTime, Document, doc};
use tokio::time::Instant;
use uuid::Uuid;

use super::db::{MemoryDb, lock};
use super::rules::Collection;
use crate::key::LeaseKey;
use crate::store::{AcquireOutcome, KeyWrite};

/// Another client's lock of a document: `LockId` and `LockTime` as it wrote
/// them (`LockTime` by its own clock).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TheirLock {
    pub id: Uuid,
    pub time: DateTime,
}

impl Collection {
    /// The lock another client holds on `key` at server time `now` by its
    /// rule with `max` (`LockTime >= now - max`), read as `MongoStore`
    /// reads it (`fo`, `ts`, `fx`, `now`); `None` once expired.
    pub(super) fn their_lock_at(
        &self,
        db: &MemoryDb,
        key: &LeaseKey,
        now: Instant,
    ) -> Option<Document> {
        let max = self.lock_id_max?;
        let lock = self.their_locks.get(key)?;
        let now = db.date(now);
        let expiry = lock.time.timestamp_millis().saturating_add(max_ms(max));
        if expiry < now.timestamp_millis() {
            return None;
        }
        Some(doc! {
            crate::foreign::OWNER: lock.id.to_string(),
            crate::store::field::RENEWED_AT: lock.time,
            crate::foreign::EXPIRY: DateTime::from_millis(expiry.saturating_add(1)),
            "now": now,
        })
    }

    /// Our acquisition of `key` at `now` (with `LockId` / `LockTime` kept):
    /// `Some` outcome while another client holds it by its rule; `None`
    /// once it is ours to judge by the protocol's rules (its expired lock
    /// dropped).
    pub(super) fn acquire_over_their_lock(
        &mut self,
        db: &MemoryDb,
        key: &LeaseKey,
        owner: &str,
        lease_id: Uuid,
        now: Instant,
    ) -> Option<AcquireOutcome> {
        if let Some(view) = self.their_lock_at(db, key, now) {
            return Some(crate::store::replies::in_document(
                key,
                owner,
                lease_id,
                Some(&view),
            ));
        }
        self.their_locks.remove(key);
        None
    }
}

/// `max` in ms, rounded up, as `LockIdFields::max_ms`.
fn max_ms(max: Duration) -> i64 {
    i64::try_from(max.as_nanos().div_ceil(1_000_000)).unwrap_or(i64::MAX)
}

impl MemoryDb {
    /// In a place of in-document leases with `LockId` / `LockTime`, another
    /// client's lock of `key` at its clock's `client_now`, with its
    /// `max_duration` `max`, exactly as its `findOneAndUpdate` does: taken
    /// (a new `LockId`, `LockTime = client_now`, the document created if
    /// missing) if `LockId` is null or `LockTime < client_now - max`;
    /// otherwise `None` (its upsert's duplicate key error: "already
    /// locked").
    pub fn lock_by_id(
        &self,
        key: impl Into<LeaseKey>,
        client_now: DateTime,
        max: Duration,
    ) -> Option<Uuid> {
        let key = key.into();
        let now = self.server_now();
        let mut coll = lock(&self.inner);
        let cutoff = client_now.timestamp_millis().saturating_sub(max_ms(max));
        let lock_time = match coll.their_locks.get(&key) {
            Some(theirs) => Some(theirs.time),
            None => coll
                .docs
                .get(&key)
                .filter(|d| d.lease_id.is_some())
                .map(|d| self.date(d.renewed)),
        };
        if lock_time.is_some_and(|time| time.timestamp_millis() >= cutoff) {
            return None;
        }
        let id = crate::random::uuid();
        coll.missing.remove(&key);
        coll.their_locks.insert(
            key.clone(),
            TheirLock {
                id,
                time: client_now,
            },
        );
        if let Some(doc) = coll.docs.get_mut(&key) {
            // Our lease there, if any, is no longer current.
            doc.lease_id = None;
            doc.exp = doc.exp.min(now);
            doc.waiting_since = None;
            doc.yield_until = None;
        }
        drop(coll);
        self.announce(KeyWrite {
            key,
            freed: false,
            lease_id: Some(id),
            owner: None,
            token: None,
        });
        self.touch();
        Some(id)
    }

    /// That client's unlock: `LockId: null, LockTime: null` on `key` if
    /// its `LockId` is still `id`. Returns whether it matched.
    pub fn unlock_by_id(&self, key: impl Into<LeaseKey>, id: Uuid) -> bool {
        let key = key.into();
        let mut coll = lock(&self.inner);
        if coll
            .their_locks
            .get(&key)
            .is_none_or(|theirs| theirs.id != id)
        {
            return false;
        }
        coll.their_locks.remove(&key);
        drop(coll);
        self.announce_release(&key);
        self.touch();
        true
    }

    /// `LockId` of `key` as stored: another client's, or our lease's.
    pub fn lock_id_of(&self, key: impl Into<LeaseKey>) -> Option<Uuid> {
        let key = key.into();
        let coll = lock(&self.inner);
        match coll.their_locks.get(&key) {
            Some(theirs) => Some(theirs.id),
            None => coll.docs.get(&key).and_then(|d| d.lease_id),
        }
    }
}
