//! [`MongoStore`]: the lock protocol on a real MongoDB deployment.
//!
//! - [`handle`]: the `MongoStore` value (the collection handle with majority
//!   concerns, the owner id, TTL and yield window, the operation timeout) and
//!   how server errors are read;
//! - [`rules`]: the protocol's rules as expressions over where a document
//!   keeps its lock fields (`LockPath`: at the top, or under a user's lock
//!   field): the shape test, the token rule, the win rule, the token-age
//!   test, the filters of a lease and of an owner's leases, and the reading
//!   of change events, pure and unit-tested without a server;
//! - [`pipeline`]: the BSON of every command (filters, update pipelines,
//!   projections) and the reading of what comes back, pure and unit-tested
//!   without a server;
//! - [`ops`]: the [`Store`](super::Store) implementation, which sends them
//!   and resolves ambiguous outcomes; [`release`]: its release family
//!   (by lease id, by owner id, delete mode's deletes);
//! - [`kinds`]: the BSON of shared and semaphore keys and of minimum holds
//!   (acquire, renewal and release of any kind), pure and unit-tested like
//!   `pipeline`; [`kinds_ops`]: the operations that send it;
//! - [`queue`]: the BSON of the queue of waiting owners (registration, the
//!   head's claim on a free key, the handoff stages of a release), pure and
//!   unit-tested like `pipeline`;
//! - [`handoff`]: the handoff to a local waiter in the releasing write
//!   (its BSON, pure and unit-tested, and the operation that sends it);
//! - [`plain`]: commands encoded by hand and sent as plain commands (no
//!   retryable write), and the reading of their replies;
//! - [`renewal`]: the heartbeat's renewal of plain exclusive leases,
//!   encoded directly (its filter names every key of the batch);
//! - [`light`]: the light forms of the acquire, the release and the
//!   handoff for a key nobody else waits for, and the memory of the keys
//!   they do not apply to;
//! - [`prepare`]: the collection checks and the indexes (TTL index for garbage
//!   collection, owner index);
//! - [`observe`]: observing one key (change stream, or polling);
//! - [`transaction`]: the transaction helper's side: the caller's closure and
//!   a check of the lease by a write to its lock, in one transaction on the
//!   caller's client;
//! - [`document`]: the same protocol inside the user's own documents
//!   (in-document leases): `DocumentStore`, its builders (`pipeline`:
//!   acquire, renewal and release; `write`: writes under a lease; `events`:
//!   the change-stream stages and their reading), each pure and unit-tested
//!   without a server.
//!
//! Dependencies go one way: `ops` uses `handle`, `pipeline`, `kinds`, `queue`,
//! `observe` and `release`; `release` uses `handle`, `pipeline`, `kinds` and
//! `ops` (its retried updates); `kinds_ops` uses `ops`, `handle` and `kinds`; `kinds` uses
//! `rules` and `queue`, and `pipeline` uses `rules`, `kinds` only for the
//! exclusive waiter's mark and `queue` for the queue of waiting owners;
//! `queue` uses `rules`' token rule;
//! `observe` and `prepare` use `handle` (and `observe` uses `pipeline`);
//! `transaction` and `handoff` use `handle` and `pipeline` (`handoff` also
//! `ops`' attempt count and `light`); `light` uses `handle`, `pipeline`,
//! `kinds`, `ops` (its retried updates) and `release`, and `ops` uses `light`; `document` uses `handle`,
//! `ops` (its retried updates and batch renewal), `pipeline` and `rules`;
//! every builder uses `rules`; `rules` and `handle` use none of their
//! siblings.

mod document;
mod handle;
mod handoff;
mod kinds;
mod kinds_ops;
mod light;
mod observe;
mod ops;
mod pipeline;
mod plain;
mod prepare;
mod queue;
mod release;
mod renewal;
mod rules;
mod transaction;

pub(crate) use handle::MongoStore;
pub(crate) use transaction::{LeaseCheck, run_fenced};
