//! The lock protocol's translator: how leases are stored and changed in MongoDB.
//!
//! [`MongoStore`] is the only code in the crate that issues MongoDB commands,
//! and only the actor calls it, but for the reads and the operator's
//! overrides that need no lease state, which the manager sends it directly
//! (`inspect`, `list`, `force_release`, `request_release`, `release_owner`).
//! The actor sees it through the narrow [`Store`] trait, as it sees
//! `memory::MemoryStore`, the twin (ARCHITECTURE.md, "`src/store/memory/`").
//!
//! The protocol itself (the lock document's fields, every write's
//! conditions, the queue of waiting owners, the token rule, late writes,
//! garbage collection, what other clients read) is specified in
//! "Specification" in `docs/protocol.md`; the sections cited in the code as
//! "X" in docs/protocol.md are there. The MongoDB behaviour it relies on is
//! `docs/mongodb-behaviour.md`, cited by section (B1, B2, ...).

mod mongo;

#[cfg(any(test, feature = "sim"))]
pub(crate) mod memory;

mod handoff;
pub(crate) mod light_acquire;
pub(crate) mod light_release;
mod profile;
mod protocol;
mod read;
mod release;
pub(crate) mod replies;
pub(crate) mod retried;
#[cfg(all(test, feature = "testkit"))]
mod tests;

use std::time::Duration;

use uuid::Uuid;

use crate::key::LeaseKey;

pub(crate) use handoff::{Handoff, HandoffOutcome};
pub(crate) use mongo::MongoStore;
pub(crate) use mongo::{LeaseCheck, run_fenced};
pub(crate) use profile::StoreProfile;
pub(crate) use protocol::Store;
#[cfg(test)]
pub(crate) use protocol::tests::StoreExt;
pub(crate) use read::{foreign_owner, is_our_layout, lease_info};
pub(crate) use release::{Release, Released};

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
    pub const HOLD_UNTIL: &str = "hl";
    pub const HOLDERS: &str = "hs";
    pub const PERMITS: &str = "pm";
    pub const RELEASED_AT: &str = "rl";
    pub const EXCLUSIVE_WAITER: &str = "xw";
    pub const QUEUE: &str = "q";
    /// How many times the key went to another owner (see "Leader
    /// transitions").
    pub const TRANSITIONS: &str = "tr";
    /// A cooperative revocation's request, `{aid, at}` (see "Revocation").
    pub const REVOCATION: &str = "rv";
    /// *Not before*: the end of a lock-delay (see "Lock-delay").
    pub const NOT_BEFORE: &str = "nb";
    /// Only in an acquiring upsert's filter (`{_id, _ins: null}`), hence in
    /// the document it inserts, which its pipeline rewrites without it: what
    /// tells a new document from an existing bare `{_id}` (see "Document
    /// schema").
    pub const INSERTED: &str = "_ins";
    /// `ts` restated for another lock pattern's clients ("Read by other
    /// clients").
    pub const OBTAINED_AT: &str = "obtained_at";
    /// `exp − ts` in seconds, restated likewise.
    pub const TTL_SECONDS: &str = "ttl";
    /// Another lock pattern's owner field: never in a document of ours, so
    /// a document that has it is another application's lock (that
    /// pattern's takeover of an expired lease of ours writes it).
    pub const OTHER_OWNER: &str = "value";
    /// An entry of `hs` of a semaphore key: how many permits it takes (1
    /// when absent).
    pub const PERMITS_TAKEN: &str = "n";
    /// An entry of `hs` that an operator's release by owner id ended and
    /// keeps until its expiry: its lease id, moved out of `lid` (no write of
    /// the lease matches it, and an acquisition under it, landing late, does
    /// not take a place again; see "Lock-delay").
    pub const ENDED_LEASE_ID: &str = "xl";
    /// An entry of `q`: when its owner first registered.
    pub const REGISTERED_AT: &str = "at";
    /// An entry of `q`: when its registration expires.
    pub const REGISTRATION_EXPIRES: &str = "re";
    /// An entry of `q`: how long (ms) a lease handed to it lasts unconfirmed.
    pub const HANDED_TTL: &str = "hx";
}

/// Added to twice a manager's `retry_max` in [`registration_window`]: the
/// round trip of the registering attempt itself, with room for a loaded
/// server (B6-style latencies of tens of milliseconds, far below it).
pub(crate) const REGISTRATION_SLACK: Duration = Duration::from_secs(1);

/// How long a waiting owner's registration in the queue of a key lasts
/// (`R` of "Queue of waiting owners", which says why each term):
/// `2 * retry_max +` [`REGISTRATION_SLACK`] `+ safety_margin`
/// (saturating), the registering manager's. The margin is in `R` because
/// a handed lease's local deadline, counted from the last registering
/// attempt, is less the margin: without it the default settings would
/// leave no time at all.
pub(crate) fn registration_window(retry_max: Duration, safety_margin: Duration) -> Duration {
    retry_max
        .saturating_mul(2)
        .saturating_add(REGISTRATION_SLACK)
        .saturating_add(safety_margin)
}

/// The most live entries the queue of waiting owners of a key (`q`) holds
/// ("Bound" in "Queue of waiting owners"). An entry without a payload is
/// about 117 bytes of BSON (`aid` a 36-byte UUID string 46, `lid` 26,
/// `at`, `re` and `hx` 12 each, overhead 9): about 7.5 KB that every write
/// of the key rewrites (docs/performance.md, "The queue in the document",
/// says why 64 and not 16).
pub(crate) const MAX_QUEUE: usize = 64;

/// How long the server holds a `getMore` of the stream of writes that has
/// nothing to announce before it answers with an empty batch (the
/// server's default is 1 s): an idle stream costs one command per 10 s
/// (docs/mongodb-behaviour.md, B33). The twin's streams wake as often
/// (`MemoryDb::release_readers`).
pub(crate) const RELEASE_EVENTS_AWAIT: Duration = Duration::from_secs(10);

/// In delete mode, how long after a young lease's acquisition (local time
/// at which its acquire's reply arrived, no earlier than the token's
/// millisecond) its released document is deleted:
/// [`DELETE_MIN_TOKEN_AGE`](crate::DELETE_MIN_TOKEN_AGE) plus 100 ms for the
/// server's `$$NOW` stepping back (docs/mongodb-behaviour.md, B3) and the
/// round trip of the release.
pub(crate) const DELETE_DELAY: Duration =
    Duration::from_millis(crate::config::DELETE_MIN_TOKEN_AGE.as_millis() as u64 + 100);

/// The partial filter of the garbage-collection TTL index on `exp`:
/// documents without `value` (`{value: null}` matches a missing field),
/// so that another application's lock that took a lease document of ours
/// over in place, keeping our `exp` beside its `value`, is never deleted
/// by our index ("Garbage collection").
pub(crate) fn gc_filter() -> mongodb::bson::Document {
    mongodb::bson::doc! { field::OTHER_OWNER: mongodb::bson::Bson::Null }
}

/// When an operator's override (a force release, a release by owner id)
/// lets the key of a live lease it ends be granted again ("Lock-delay").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum OverrideEnd {
    /// Not before the lease's expiry (`exp`), nor before the lock-delay:
    /// its holder has stopped by then, whether it was told or not.
    #[default]
    AtExpiry,
    /// After the lock-delay alone: the operator knows the holder is gone.
    Immediately,
}

/// The key and lease id that identify one acquisition, and its kind: the
/// store picks the form of a renewal or a release by it (the plain
/// exclusive renewal, the light release), holding no memory of its own of
/// which leases are holders of shared or semaphore keys.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct LeaseRef {
    pub key: LeaseKey,
    pub lease_id: Uuid,
    pub kind: crate::kind::LeaseKind,
}

/// A write to a lock document, as the announcement stream
/// ([`Store::watch_releases`]) reports it: what the write left in the
/// document, as far as the event shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyWrite {
    /// The key (`_id`) of the document written.
    pub key: LeaseKey,
    /// The write may have freed the key: a delete, a release (`lid` removed),
    /// a replacement without a lease id, or the release of a holder of a
    /// shared or semaphore key (`rl` set). Wakes the key's local waiters.
    pub freed: bool,
    /// The `lid` the write set, if the event shows one (`None` also for a
    /// `lid` that is not a UUID).
    pub lease_id: Option<Uuid>,
    /// The `aid` the write set, if the event shows one.
    pub owner: Option<String>,
    /// The `tok` the write set, if the event shows one (an int64, or an
    /// int32; `None` for a negative value or another type, a delete, and
    /// the release of a holder of a shared or semaphore key). With
    /// [`KeyWrite::keeps`], the token of the lease the write made.
    pub token: Option<u64>,
}

impl KeyWrite {
    /// Whether the event shows the document still carrying lease `lease_id`
    /// of `owner`: the write set that lease id (only an acquisition under it
    /// writes it) and, if it set an owner id, set `owner`. Any other write
    /// to a held key (a delete, a release, another `lid` or `aid`) may have
    /// taken the lease away, which only the store can tell: the event may be
    /// stale (docs/mongodb-behaviour.md, B12).
    pub fn keeps(&self, lease_id: Uuid, owner: &str) -> bool {
        !self.freed
            && self.lease_id == Some(lease_id)
            && self.owner.as_deref().is_none_or(|o| o == owner)
    }
}

/// Which writes a stream of writes ([`Store::watch_releases`]) announces:
/// with [`Announced::Waits`] a queue's handoff is announced to its new
/// owner alone, not to every owner waiting for the key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Announced {
    /// Every write that may change who holds a key: also another owner's
    /// acquisition or handoff, which may take a held lease away
    /// (`LeaseManagerOptions::watch_held_leases`).
    Writes,
    /// What a waiter needs: writes that may free a key, writes that make
    /// this owner the holder (`aid` set to it: a handoff to it), and
    /// requests for revocation.
    Waits,
}

impl Announcement {
    /// Whether a stream of `announced` opened by `owner` carries this
    /// announcement. The twin filters its announcements with this; a
    /// change stream's `$match` selects the same writes on the server
    /// (`store::mongo::watch`), as the store contract checks.
    #[cfg(any(test, feature = "sim"))]
    pub fn is_announced(&self, announced: Announced, owner: &str) -> bool {
        match (self, announced) {
            (Announcement::Write(write), Announced::Waits) => {
                write.freed || write.owner.as_deref() == Some(owner)
            }
            _ => true,
        }
    }
}

/// An item of the announcement stream ([`Store::watch_releases`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Announcement {
    /// The stream is open: every write from now on is announced, none
    /// before. Comes first, once.
    Opened,
    /// A write that may change who holds a key.
    Write(KeyWrite),
    /// A request that the holders of `key` release it, by owner id `by`
    /// ("Revocation").
    RevocationRequested { key: LeaseKey, by: String },
}

/// Where the locks of one store live (a place, ARCHITECTURE.md's
/// glossary). Leases carry it, so that the transaction helper can name the
/// lock in the caller's session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LockPlace {
    /// The database of the collection.
    pub database: String,
    /// The collection.
    pub collection: String,
    /// The field of the user's document that holds the lock fields (`aid`,
    /// `lid`, `tok`, `acq`, `ts`, `exp`, `wt`, `yu`) for in-document leases;
    /// `None` for the lock collection, whose documents hold them at the top.
    pub field: Option<String>,
    /// The top-level field that also holds the lease id of in-document
    /// leases kept for other clients (`LockIdFields::lock_id`): a check of
    /// the lease requires it to hold the lease id too.
    pub lock_id: Option<String>,
}

impl LockPlace {
    /// The path of lock field `name` (one of [`field`]) in a document of
    /// this place: `name` itself in the lock collection, `<field>.<name>` in
    /// a user's document.
    pub fn path(&self, name: &str) -> String {
        match &self.field {
            None => name.to_string(),
            Some(prefix) => format!("{prefix}.{name}"),
        }
    }

    /// `database.collection`, as errors name it.
    pub fn namespace(&self) -> String {
        format!("{}.{}", self.database, self.collection)
    }
}

/// A write under an in-document lease ([`Store::write_document`]).
#[derive(Debug, Clone)]
pub(crate) struct DocumentWrite {
    /// The user's update (checked: it never names the lock field).
    pub update: crate::document_update::DocumentUpdate,
    /// Release the lease in the same write (`commit`), as the release in
    /// two writes of in-document leases does (the lock field removed when
    /// old enough and not waited for, else left released for the
    /// follow-up, [`Release::ReleasedDocuments`]).
    pub release: bool,
    /// The lease was acquired less than [`DELETE_DELAY`] ago by the local
    /// clock (set by the actor): its token is too young for the lock field
    /// to be removed, so a release by update operators skips that attempt
    /// (one round trip less). Only a hint: the server's clock decides.
    pub too_young_to_delete: bool,
}

/// One acquire attempt of the general form ([`Store::acquire`]), as the
/// actor sends it.
#[derive(Debug, Clone)]
pub(crate) struct AcquireRequest {
    pub key: LeaseKey,
    /// Kept across the attempt's retries, so that a retry is recognised.
    pub lease_id: Uuid,
    /// The caller will retry until it gets the key, so a lease held by
    /// another owner is marked as waited for (see "Fairness between owners").
    pub waiting: bool,
    /// The acquisition expires this long after the server's now.
    pub ttl: Duration,
    /// The kind and minimum hold asked for.
    pub shape: crate::kind::LeaseShape,
    /// In-document leases: the fields to create a missing document with
    /// (`None`: a missing document is
    /// [`Error::DocumentNotFound`](crate::Error::DocumentNotFound)).
    pub create: Option<mongodb::bson::Document>,
    /// Exclusive leases of the lock collection: the payload (`data`) the
    /// acquiring write sets, a retry under the same lease id included
    /// (`None`: a new acquisition drops `data`, a retry keeps it).
    pub payload: Option<mongodb::bson::Document>,
}

/// A payload with the acquisition is written by the general acquire of an
/// exclusive lease of the lock collection only: refused elsewhere, before
/// anything is sent, by both stores.
pub(crate) fn payload_applies(
    in_documents: bool,
    shape: crate::kind::LeaseShape,
    payload: Option<&mongodb::bson::Document>,
) -> crate::error::Result<()> {
    if payload.is_none() || (!in_documents && shape.kind == crate::kind::LeaseKind::Exclusive) {
        return Ok(());
    }
    Err(crate::error::Error::Unsupported {
        reason: "a payload with the acquisition applies to exclusive leases of the lock \
                 collection only"
            .into(),
    })
}

/// In-document leases are plain leases: any other shape (a
/// shared lease, a permit, a minimum hold) is refused before anything is
/// sent, by both stores.
pub(crate) fn document_shape(shape: crate::kind::LeaseShape) -> crate::error::Result<()> {
    if shape.is_plain() {
        return Ok(());
    }
    Err(crate::error::Error::Unsupported {
        reason: format!(
            "in-document leases are exclusive, without hold_at_least (asked: {shape:?})"
        ),
    })
}

/// What an acquire attempt found, derived by the functions of [`replies`]
/// from the attempt's own write or from a read afterwards (what each
/// proves: [`replies`]' module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AcquireOutcome {
    /// The lease is ours, with this fencing token: the attempt's own write
    /// returned it, so it lasts the attempt's TTL from a server time after
    /// the attempt was sent.
    Acquired { token: u64 },
    /// This attempt's lease (its owner id and lease id) is on the key, but
    /// only a read says so, or it has expired: its expiry is unknown, so it
    /// is not granted, and the actor retries at once under the same lease
    /// id ([`replies`]' module docs). `token` is the one found. Registers
    /// nothing for grant on the event.
    Unconfirmed { token: u64 },
    /// The key is held as another kind than the one asked for (see
    /// "Shared and semaphore keys"); the attempt's own write says so, and
    /// wrote nothing.
    Mismatch { stored: crate::kind::LeaseKind },
    /// This attempt's lease id has an entry on the key (an earlier attempt
    /// under it landed unseen), but the key is now held as `stored` by
    /// other live holders: its number of permits changed since
    /// (`Store::set_permits`). The write renewed nothing. The actor gives
    /// the entry back and answers as for a [`Mismatch`](Self::Mismatch);
    /// renewed, the entry would count as a permit of the old number on a
    /// key of the new one.
    OursAsAnotherKind { stored: crate::kind::LeaseKind },
    /// Another acquisition holds the key for at most `remaining` more
    /// (server time). For a foreign holder (a document not of our layout,
    /// never modified by an acquire while live), the time left until its
    /// expiry by its own rule (`crate::foreign`), or `None` if it has none:
    /// it is free once its owner (or a TTL index) deletes it.
    Held {
        holder: String,
        remaining: Option<Duration>,
        /// The fencing token (`tok`) stored on the key when the attempt
        /// read it (for a shared or semaphore key, the top `tok`), which a
        /// lease handed later exceeds ("Queue of waiting owners"). `None`
        /// when the document has none (a foreign holder's lock, a lock
        /// field removed meanwhile), and for an answer from a read
        /// ([`replies::from_reread`]).
        token: Option<u64>,
        /// How many other owners' live registrations are ahead of this
        /// owner's in the key's queue of waiting owners (all of them if it
        /// has none; "Queue of waiting owners"): 0 also when the key has no
        /// queue and when the answer does not tell (a read, a foreign
        /// holder's lock, a shared or semaphore key, an in-document lease).
        ahead: u32,
    },
}
