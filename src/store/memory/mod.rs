//! [`MemoryStore`]: an in-memory twin of the lock protocol, for the actor's
//! timing tests under tokio's paused clock and the deterministic simulation
//! (`sim` feature, `crate::sim`). Never a stand-in for MongoDB.
//!
//! A [`MemoryDb`] is the shared "lock collection": one [`Doc`] per key. Each
//! [`MemoryStore`] (from [`MemoryDb::store`]) is one manager's view of it, with
//! its own owner id and TTL, so several managers can compete on one database.
//! "Server time" is [`tokio::time::Instant::now`] at the moment an operation
//! is applied, so everything is deterministic under `start_paused`.
//!
//! The rules are those of [`MongoStore`](crate::store::MongoStore):
//!
//! - **acquire** wins if there is no document, or the document carries this
//!   lease id (a retry: token unchanged, `exp = max(exp, now + ttl)`), or `exp <= now`
//!   and the key is not yielded by this owner (`yu > now`); the winner gets
//!   the token of MongoDB's rule, `max(previous + 1, ms($$NOW) * 2^20)` at
//!   server time (see "Fencing tokens" in `store`), and `exp = now + ttl`,
//!   without `wt` / `yu`. Nothing of a deleted document is remembered: a
//!   new document's token is the rule's time part, so a server clock that
//!   steps back may make it smaller, as on MongoDB.
//!   Otherwise the outcome is `Held { holder, remaining: exp - now, token:
//!   Some(tok) }` (`yu - now` if yielded by this owner), and a `waiting`
//!   attempt on a lease held by another owner sets `wt` if unset.
//! - **renew** sets `exp = max(exp, now + ttl)` on documents whose key is among the
//!   leases' keys and whose lease id is among their lease ids (the same `$in`
//!   / `$in` filter as `MongoStore`; expiry is not checked, as on the server),
//!   and returns the keys that did not match.
//! - **release** sets `exp = min(exp, now)` and clears the lease id of the
//!   matching documents, and if `wt` is set clears it and sets `yu = now +
//!   yield window` (the store's,
//!   [`DEFAULT_RETRY_MAX`](crate::config::DEFAULT_RETRY_MAX) unless set
//!   with [`MemoryStore::with_yield_window`]); returns how many matched.
//! - **release by owner id** (`Release::OwnerLeases`) does the same to every document of `owner`
//!   that still has a lease id.
//! - In **delete mode** ([`MemoryStore::with_release_mode`]) each of these
//!   releases deletes, instead, a matching document nobody waited for (`wt`
//!   unset) whose token is at least `DELETE_MIN_TOKEN_AGE` old by server
//!   time (MongoDB's token-age test on `tok >> 20`), and
//!   the follow-up delete (`Release::ReleasedDocuments`) deletes released documents of `keys` (no lease
//!   id, not yielded) whose token is that old.
//! - A **foreign holder's lock** (any document another application's
//!   command leaves, [`MemoryDb::foreign_write`]) is stored as written and
//!   read by the rules of `crate::foreign`
//!   ([`MemoryDb::with_foreign_rules`]), rendered as `MongoStore`'s reads
//!   project it and judged by `replies` and `store::lease_info`: while live
//!   by its own rule it is never modified, acquire reports it `Held` by its
//!   owner with the time left by that rule (`None` without one), renew,
//!   release and release by owner never match it, and only force release (or
//!   [`MemoryDb::delete`]) deletes it, announcing the delete like a
//!   release; once expired by its rule, an acquisition takes it over as a
//!   new document.
//!
//! - **Shared and semaphore keys** (`Store::acquire` of a shape, rules in
//!   [`kinds`]): holders in [`Doc::holders`] (`hs`, each with owner id,
//!   lease id, token, times and payload), `pm` in [`Doc::permits`]; a
//!   shared acquisition waits for a live exclusive holder or minimum hold
//!   (writing nothing) and for a live exclusive waiter's mark (`xw`,
//!   [`Doc::exclusive_waiter`]), a permit for a free one among `pm`; mixing
//!   a semaphore with another kind or number while it has live holders is
//!   `Mismatch`; an exclusive waiter on live shared holders writes `xw =
//!   (owner, now + ttl)` and is told to retry within `ttl / 2`. Renewal
//!   matches entries of `hs` too (lost leases are told apart by lease id);
//!   release removes a holder's entry and announces the key as freed
//!   (MongoDB's stream shows `rl`); release by owner id matches entries;
//!   force release frees the key whole (holders, `xw` and `hl`; `rl` set).
//! - **Lock-delay** ([`MemoryStore::with_lock_delay`], [`lock_delay`]):
//!   a force release, and a release by owner id of a live lease (or of
//!   all the live holders of a shared or semaphore key), set `nb = now +
//!   delay` and keep `exp >= nb`; no kind is granted, no key handed over
//!   and no document deleted before `nb`; a new acquisition clears it.
//! - **Holding at least**: an exclusive acquisition with `hold_at_least`
//!   sets `hl = now + hold_at_least` ([`Doc::hold_until`]); acquisition,
//!   renewal and release keep `exp >= hl`, delete mode never deletes
//!   before `hl`.
//! - **In-document leases** ([`Store::documents`](crate::store::Store::documents),
//!   [`MemoryStore::document_store`]): a second place, whose lock fields
//!   live in another [`MemoryDb`] ([`MemoryDb::documents`], one per user
//!   collection and lock field, shared by every manager of the lock
//!   collection's db). The rules above apply to the lock fields, with
//!   delete-mode releases (a release removes the lock field, i.e. the twin's
//!   document, or leaves a young lease's released state for the follow-up
//!   delete). The user's documents are not modelled: every one
//!   is taken to exist (`create` is ignored), an acquisition returns `{_id,
//!   <field>: {aid, lid, tok}}`, and `write_document` is conditional on the
//!   lease id and owner id and applies the release but not the user's
//!   update (its semantics are MongoDB's). Opened with `LockIdFields`
//!   ([`lock_id`]), the lease id and last renewal are read as `LockId` /
//!   `LockTime` by another client's lock ([`MemoryDb::lock_by_id`]), whose
//!   lock holds the document until `LockTime + max_duration` at server
//!   time and whose takeover ends the lease there.
//!
//! - **Light forms** ([`light`]): `MongoStore`'s light acquire and light
//!   release, with the same conditions and the same decisions on a grouped
//!   acquire's and a grouped release's replies (`store::light_acquire`,
//!   `store::light_release`), one call per group the actor sends (its
//!   group commit, as over MongoDB; a grouped acquire's `update` and
//!   `find` are two calls). Where one does not apply, the actor sends the
//!   general form. The light acquire only with
//!   [`MemoryStore::with_light_acquire`] (the simulation, the contract).
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
//!   hang (never answered, applied later or never), be lost (never applied
//!   nor answered), apply late, answer late, or fail with a transient
//!   [`Error::Unreachable`](crate::Error::Unreachable) (before or after
//!   applying).
//! - [`MemoryStore::set_operation_timeout`]: bound every operation like
//!   `MongoStore` does (off by default, so a hang is a hang): the caller
//!   gives up then, the call may still be applied.
//! - [`MemoryStore::set_server_bound`]: a server-side bound on every call
//!   (MongoDB's `maxTimeMS`; none by default, as the product sends none):
//!   a call not applied within it is never applied.
//!
//! Knobs are read when the actor *calls* the method (when it issues the
//! command), not when the future is first polled. The twin plays the
//! server's side of each call: from that moment it is applied on the
//! server's schedule, in a task of its own on the runtime, whether or not
//! its caller still polls its future (`store::MemoryStore::run`); only the
//! answer depends on the caller.
//!
//! - [`doc`]: the document model ([`Doc`], a holder of a shared or
//!   semaphore key, a foreign holder's [`Foreign`](doc::Foreign));
//! - [`rules`]: the rules above, applied to the documents ([`Collection`](rules::Collection));
//! - [`kinds`]: the rules of shared and semaphore keys' holders;
//! - [`db`]: the shared collection ([`MemoryDb`]) with its change
//!   notifications, its reads, and the test's own operations on it;
//! - [`control`]: the fault knobs and call counters ([`Op`], [`Fault`],
//!   [`Call`](control::Call)), shared by a store's clones, and the
//!   store's methods that set and read them;
//! - [`store`]: [`MemoryStore`], its settings, and `run`, which applies an
//!   operation at server time;
//! - [`ops`]: its [`Store`](crate::store::Store) implementation;
//! - [`reply`]: its re-read after an acquire whose outcome is unknown;
//! - [`light`]: its light acquire and release, alone or grouped;
//! - [`lock_id`]: `LockId` / `LockTime` and another client's lock by them;
//! - [`streams`]: its stream of writes and its observed states;
//! - [`ttl`]: the TTL monitor over the collection's TTL indexes (the
//!   managers' on `exp`, other applications' on their own fields), and
//!   [`gc_index_covers`], which documents the managers' index covers.
//!
//! `ops`, `light`, `reply` and `streams` use `store`, which uses `db`,
//! `rules` and `control`; `rules` and `kinds` apply to `doc` and announce
//! their writes through `db`.

// A test utility: not every helper is used by every test.
#![allow(dead_code)]

mod control;
mod db;
mod doc;
mod kinds;
mod landed;
mod light;
mod lock_delay;
mod lock_id;
mod ops;
mod reply;
mod rules;
mod store;
mod streams;
mod ttl;

// Some are used by the actor's tests only, some by the simulation only.
#[allow(unused_imports)]
pub(crate) use control::{EventFate, Fault, Op};
pub(crate) use db::{ForeignWrite, MemoryDb};
#[allow(unused_imports)]
pub(crate) use doc::Doc;
#[cfg(feature = "sim")]
pub(crate) use landed::LandedWrite;
#[cfg(all(test, feature = "sim"))]
pub(crate) use landed::{Held, LiveLease};
pub(crate) use store::MemoryStore;
#[allow(unused_imports)]
pub(crate) use ttl::{TtlIndex, gc_index_covers, restated_until};
