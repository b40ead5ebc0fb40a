//! The lock protocol: how leases are stored and changed in MongoDB.
//!
//! [`MongoStore`] is the only code in the crate that issues MongoDB commands,
//! and only the actor calls it. The actor sees it through the narrow [`Store`]
//! trait, so its timing logic can also be tested under tokio's paused clock
//! against `memory::MemoryStore` (a test-only module, hence not linked), an
//! in-memory twin that follows the same rules (used only by those unit tests,
//! never as a stand-in for MongoDB). The store contract (`contract`, a test
//! module) runs one suite of scenarios against both, and the MongoDB
//! behaviour the protocol relies on is described in
//! `docs/mongodb-behaviour.md` (cited below by section).
//!
//! # Document schema
//!
//! One document per key in the lock collection:
//!
//! | field | type | meaning |
//! |---|---|---|
//! | `_id` | string | the lease key |
//! | `aid` | string | owner id of the manager that holds (or last held) the lease |
//! | `lid` | UUID (binary subtype 4) | lease id of the current acquisition; absent once released |
//! | `tok` | int64 | fencing token of the current acquisition |
//! | `acq` | date | server time (`$$NOW`) of the current acquisition; kept by renewals and by a retry under the same lease id |
//! | `ts` | date | server time (`$$NOW`) of the last acquire or renewal |
//! | `exp` | date | server time at which the lease expires (`ts + ttl`, or the release time) |
//! | `data` | document, optional | payload set by the holder (`Lease::set_payload`); absent after a new acquisition |
//! | `wt` | date, optional | server time at which another owner first waited for the current lease; removed by release and by a new acquisition |
//! | `yu` | date, optional | set by a release that another owner waited for: until then the releasing owner (`aid`) cannot take the key back |
//!
//! A lease is free when `exp <= $$NOW` on the server. A TTL index on `exp`
//! (`expireAfterSeconds` = the manager's GC grace) deletes released and
//! abandoned documents; takeover never waits for it.
//!
//! # Fairness between owners
//!
//! Within one manager, waiters are served first in, first out. Between
//! managers, a manager whose tasks keep re-acquiring a key would otherwise
//! keep it forever: its next local waiter starts at once on release, while a
//! waiter elsewhere learns of the release a change-stream event (or a poll)
//! later. So an acquire attempt that will wait marks the lease it found held
//! by another owner (`wt`, written once per holding period; a `try_acquire`
//! leaves no mark), and a release of a marked lease *yields* the key: it is
//! free for every other owner at once, and for the releasing owner only
//! after the yield window (`yu`; the releasing manager's `retry_max`, which
//! bounds how long a polling waiter takes to retry). A waiter that gave up
//! meanwhile costs the releasing manager's next waiter at most one yield
//! window. The scheme is the "handoff" of a fair lock reduced to one
//! document: no queue of remote waiters is stored, so with several remote
//! owners waiting, which of them gets the key is a race among them.
//!
//! # Fencing tokens
//!
//! `tok = max(previous tok + 1, ms($$NOW) * 2^20)`. The first term makes tokens
//! strictly increase while the document exists (also across expiry
//! takeovers); the second makes a token issued after the document was deleted
//! by the TTL monitor larger than every token issued before: the deletion
//! happens after `exp`, which is later than the server time of every earlier
//! acquisition. `$$NOW` alone is not a fence: concurrent writes to one document
//! can observe it going backwards by a few milliseconds (docs/mongodb-behaviour.md, B3).

mod mongo;

#[cfg(test)]
pub(crate) mod memory;

#[cfg(all(test, feature = "testkit"))]
mod contract;

use std::time::Duration;

use std::time::SystemTime;

use futures::future::BoxFuture;
use futures::stream::BoxStream;
use mongodb::bson::{Bson, Document};
use uuid::Uuid;

use crate::error::Result;
use crate::lease::LeaseInfo;

pub(crate) use mongo::MongoStore;

/// Field names of the lock document.
pub(crate) mod field {
    pub const ID: &str = "_id";
    pub const OWNER: &str = "aid";
    pub const LEASE_ID: &str = "lid";
    pub const TOKEN: &str = "tok";
    pub const RENEWED_AT: &str = "ts";
    pub const EXPIRES_AT: &str = "exp";
    pub const ACQUIRED_AT: &str = "acq";
    pub const PAYLOAD: &str = "data";
    pub const WAITING_SINCE: &str = "wt";
    pub const YIELD_UNTIL: &str = "yu";
}

/// Reads a lock document (as stored, or as projected with `now`) into the
/// public [`LeaseInfo`], judged at `server_time`. `None` for a document of
/// foreign shape (no int64 `tok` or no date `exp`).
pub(crate) fn lease_info(key: &str, doc: &Document, server_time: SystemTime) -> Option<LeaseInfo> {
    let token = doc.get_i64(field::TOKEN).ok()?;
    let expires_at = doc.get_datetime(field::EXPIRES_AT).ok()?.to_system_time();
    let renewed_at = doc
        .get_datetime(field::RENEWED_AT)
        .map(|d| d.to_system_time())
        .unwrap_or(expires_at);
    let acquired_at = doc
        .get_datetime(field::ACQUIRED_AT)
        .map(|d| d.to_system_time())
        .unwrap_or(renewed_at);
    let held =
        matches!(doc.get(field::LEASE_ID), Some(Bson::Binary(_))) && expires_at > server_time;
    Some(LeaseInfo {
        key: key.to_string(),
        owner_id: doc.get_str(field::OWNER).unwrap_or_default().to_string(),
        fencing_token: token as u64,
        acquired_at,
        renewed_at,
        expires_at,
        server_time,
        payload: doc.get_document(field::PAYLOAD).ok().cloned(),
        held,
    })
}

/// Multiplier of the server time (ms) in a fencing token: tokens issued within
/// one millisecond of server time may grow by up to 2^20 before the time part
/// catches up, far more than one key can be acquired in a millisecond.
pub(crate) const TOKEN_TIME_SHIFT: u32 = 20;

/// The owner id and lease id that identify one acquisition of a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LeaseRef {
    pub key: String,
    pub lease_id: Uuid,
}

/// What an acquire attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    /// The lease is ours, with this fencing token.
    Acquired { token: u64 },
    /// Another acquisition holds the key for at most `remaining` more (server time).
    Held { holder: String, remaining: Duration },
}

/// The lock protocol, as seen by the actor. Every method returns a `'static`
/// future so the actor can run many of them at once without borrowing itself.
///
/// Each operation is idempotent for a given lease id, so the actor may retry
/// it after an ambiguous failure.
pub(crate) trait Store: Send + Sync + 'static {
    /// Takes `key` for `lease_id` if it is free (or already ours under this
    /// lease id), and not yielded by this owner to a waiting one. `waiting`:
    /// the caller will retry until it gets the key, so a lease held by
    /// another owner is marked as waited for (see "Fairness between owners").
    /// A key yielded by this owner is reported `Held` by this owner until the
    /// end of the yield window.
    ///
    /// The acquisition expires `ttl` after the server's now (`exp = $$NOW + ttl`).
    fn acquire_with_ttl(
        &self,
        key: String,
        lease_id: Uuid,
        waiting: bool,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<AcquireOutcome>>;

    /// [`Store::acquire_with_ttl`] with the store's default TTL (the
    /// manager's); for the store contract's scenarios.
    #[cfg(test)]
    fn acquire(
        &self,
        key: String,
        lease_id: Uuid,
        waiting: bool,
    ) -> BoxFuture<'static, Result<AcquireOutcome>> {
        self.acquire_with_ttl(key, lease_id, waiting, self.default_ttl())
    }

    /// Extends every lease in `leases` to `ttl` from the server's now
    /// (`exp = $$NOW + ttl`), in as few commands as the batch allows (one
    /// `updateMany` on MongoDB): the caller groups leases by TTL. Returns the
    /// keys that are no longer held.
    fn renew_with_ttl(
        &self,
        leases: Vec<LeaseRef>,
        ttl: Duration,
    ) -> BoxFuture<'static, Result<Vec<String>>>;

    /// [`Store::renew_with_ttl`] with the store's default TTL (the
    /// manager's); for the store contract's scenarios.
    #[cfg(test)]
    fn renew(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<Vec<String>>> {
        self.renew_with_ttl(leases, self.default_ttl())
    }

    /// The TTL of [`Store::acquire`] and [`Store::renew`]: the manager's.
    #[cfg(test)]
    fn default_ttl(&self) -> Duration;

    /// Releases the given leases (only those still held under their lease id).
    /// Returns how many were still held.
    fn release(&self, leases: Vec<LeaseRef>) -> BoxFuture<'static, Result<u64>>;

    /// Releases every lease held under this manager's owner id, except those
    /// with a lease id in `except` (acquisitions in flight). Returns how many.
    fn release_owner(&self, except: Vec<Uuid>) -> BoxFuture<'static, Result<u64>>;

    /// Reads `key` with the server's now. `Ok(None)` if it has no document;
    /// [`Error::ForeignDocument`](crate::Error::ForeignDocument) for a
    /// document of foreign shape.
    fn inspect(&self, key: String) -> BoxFuture<'static, Result<Option<LeaseInfo>>>;

    /// The leases among the next `limit` lock documents with keys greater
    /// than `after`, in key order (documents of foreign shape are skipped),
    /// and the last key scanned if there may be more.
    fn list(
        &self,
        after: Option<String>,
        limit: usize,
    ) -> BoxFuture<'static, Result<(Vec<LeaseInfo>, Option<String>)>>;

    /// Releases `key` whoever holds it (an operator's override): as a
    /// release, `exp` moves to now and `lid` is removed. Returns the lease as
    /// it was, if it was held.
    fn force_release(&self, key: String) -> BoxFuture<'static, Result<Option<LeaseInfo>>>;

    /// Sets the payload of `lease` if it is still held under its lease id.
    /// `Ok(false)` if it is not.
    fn set_payload(&self, lease: LeaseRef, payload: Document) -> BoxFuture<'static, Result<bool>>;

    /// The states of `key`, starting with the current one, then every change
    /// in order; `None` while the key has no document. Transient errors are
    /// retried inside; a permanent error is the last item.
    fn observe(&self, key: String) -> BoxStream<'static, Result<Option<LeaseInfo>>>;

    /// Keys of leases just released or deleted, from any owner, for waking
    /// local waiters at once instead of at their next poll. Expiries are not
    /// reported (no write happens). Best effort: the stream ends, or yields an
    /// error, when the deployment has no change streams or the stream broke;
    /// the actor then keeps polling.
    fn watch_releases(&self) -> BoxStream<'static, Result<String>>;
}
