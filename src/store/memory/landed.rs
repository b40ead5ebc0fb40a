//! What each manager's write that lands on the lock collection changes of
//! its live leases, recorded under the `sim` feature for the simulation's
//! checks of what the server holds (`sim::landed`): facts only (the live
//! lease ids of each key before and after the write, the call that sent
//! it, and the server time it applied at), none of the twin's rules.
//! Without `sim` a write is applied as [`MemoryDb::apply`] applies it.

use std::time::Duration;

use tokio::time::Instant;

use super::control::Op;
use super::db::MemoryDb;
use super::rules::Collection;

#[cfg(all(test, feature = "sim"))]
pub(crate) use recorded::{Held, LiveLease};
#[cfg(feature = "sim")]
pub(crate) use recorded::{Landed, LandedWrite};

impl MemoryDb {
    /// Applies `operation`, a write of call `op` from a store whose
    /// lock-delay is `lock_delay`, as [`MemoryDb::apply`] does; under `sim`,
    /// in the lock collection, records what it changed of the live leases
    /// ([`LandedWrite`]).
    pub(super) fn apply_landing<T>(
        &self,
        op: Op,
        lock_delay: Duration,
        operation: impl FnOnce(&mut Collection, Instant) -> T,
    ) -> T {
        #[cfg(feature = "sim")]
        {
            self.apply(|coll, now| {
                recorded::apply(&self.landed, (op, lock_delay), coll, now, operation)
            })
        }
        #[cfg(not(feature = "sim"))]
        {
            let _ = (op, lock_delay);
            self.apply(operation)
        }
    }
}

#[cfg(feature = "sim")]
mod recorded {
    use std::sync::Mutex;
    use std::time::Duration;

    use tokio::time::Instant;
    use uuid::Uuid;

    use super::super::control::Op;
    use super::super::db::{MemoryDb, lock};
    use super::super::rules::Collection;
    use crate::key::LeaseKey;
    use crate::random::HashMap;

    /// One write that changed the live leases of the lock collection.
    #[derive(Debug, Clone)]
    pub(crate) struct LandedWrite {
        /// The call that sent it.
        pub op: Op,
        /// The lock-delay of the store that sent it.
        pub lock_delay: Duration,
        /// The server time it applied at.
        pub at: Instant,
        /// Each key whose holding it changed: what held it before and
        /// after it.
        pub changed: Vec<(LeaseKey, Held, Held)>,
        /// The documents a force release rewrote (whether or not it ended
        /// a lease: an immediate one also frees a key an earlier override
        /// left waiting).
        pub rewritten: Vec<LeaseKey>,
        /// The latest server time any change of the collection (a write,
        /// a TTL monitor's deletion) showed before this write: a time its
        /// clock has reached, whatever it shows after a step back.
        pub clock_reached: Option<Instant>,
    }

    /// What holds a key at an instant.
    #[derive(Debug, Clone, Default, PartialEq, Eq)]
    pub(crate) struct Held {
        /// Its live leases.
        pub leases: Vec<LiveLease>,
        /// A minimum hold alone (`hl` and `exp` ahead, no lease id: a
        /// holder released it early).
        pub by_hold: bool,
    }

    impl Held {
        /// Whether anything holds it.
        pub(crate) fn held(&self) -> bool {
            self.by_hold || !self.leases.is_empty()
        }
    }

    /// A live lease in a document: a lease id and an expiry ahead, of an
    /// exclusive lease, or of a shared holder or permit.
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub(crate) struct LiveLease {
        /// Its lease id (`lid`).
        pub id: Uuid,
        /// Its fencing token (`tok`).
        pub token: u64,
        /// An exclusive lease's (no `hs`).
        pub exclusive: bool,
    }

    /// What the twin records, once asked ([`MemoryDb::record_landed`]).
    #[derive(Debug, Default)]
    pub(crate) struct Landed {
        writes: Vec<LandedWrite>,
        /// The latest server time a change showed.
        clock_reached: Option<Instant>,
    }

    /// What holds each key of `coll` at `now`, for those held.
    fn live(coll: &Collection, now: Instant) -> HashMap<LeaseKey, Held> {
        let mut live = HashMap::default();
        for (key, doc) in &coll.docs {
            let ids: Vec<LiveLease> = if doc.holders.is_empty() {
                let lease = |id| LiveLease {
                    id,
                    token: doc.token,
                    exclusive: true,
                };
                doc.lease_id
                    .filter(|_| doc.exp > now)
                    .map(lease)
                    .into_iter()
                    .collect()
            } else {
                (doc.holders.iter())
                    .filter(|h| h.exp > now)
                    .filter_map(|h| {
                        let id = h.lease_id?;
                        Some(LiveLease {
                            id,
                            token: h.token,
                            exclusive: false,
                        })
                    })
                    .collect()
            };
            let by_hold = doc.holders.is_empty()
                && doc.lease_id.is_none()
                && doc.exp > now
                && doc.hold_until.is_some_and(|until| until > now);
            let held = Held {
                leases: ids,
                by_hold,
            };
            if held.held() {
                live.insert(key.clone(), held);
            }
        }
        live
    }

    /// `operation` applied to `coll` at `now`, and what it changed recorded
    /// in `log` (in the lock collection, once [`MemoryDb::record_landed`]
    /// was called).
    pub(super) fn apply<T>(
        log: &Mutex<Option<Landed>>,
        (op, lock_delay): (Op, Duration),
        coll: &mut Collection,
        now: Instant,
        operation: impl FnOnce(&mut Collection, Instant) -> T,
    ) -> T {
        if coll.in_documents || lock(log).is_none() {
            return operation(coll, now);
        }
        let before = live(coll, now);
        let docs_before = (op == Op::ForceRelease).then(|| coll.docs.clone());
        let result = operation(coll, now);
        let mut after = live(coll, now);
        let mut changed = Vec::new();
        for (key, held) in before {
            let now_held = after.remove(&key).unwrap_or_default();
            if now_held != held {
                changed.push((key, held, now_held));
            }
        }
        changed.extend(
            after
                .into_iter()
                .map(|(key, held)| (key, Held::default(), held)),
        );
        let mut rewritten: Vec<LeaseKey> = (docs_before.iter())
            .flat_map(|docs| docs.iter())
            .filter(|(key, doc)| coll.docs.get(*key) != Some(*doc))
            .map(|(key, _)| key.clone())
            .collect();
        if !changed.is_empty() || !rewritten.is_empty() {
            changed.sort_by(|a, b| a.0.cmp(&b.0));
            rewritten.sort();
            let mut log = lock(log);
            let landed = log.get_or_insert_default();
            let write = LandedWrite {
                op,
                lock_delay,
                at: now,
                changed,
                rewritten,
                clock_reached: landed.clock_reached,
            };
            landed.writes.push(write);
        }
        result
    }

    impl MemoryDb {
        /// Records from now on what each write changes of the live leases
        /// ([`LandedWrite`]), for [`MemoryDb::take_landed`].
        pub(crate) fn record_landed(&self) {
            lock(&self.landed).get_or_insert_default();
        }

        /// The writes recorded since the last call, in the order they
        /// applied.
        pub(crate) fn take_landed(&self) -> Vec<LandedWrite> {
            (lock(&self.landed).as_mut())
                .map(|landed| std::mem::take(&mut landed.writes))
                .unwrap_or_default()
        }

        /// After a change of the collection: the server time now is one
        /// its clock has reached (once recording).
        pub(in super::super) fn note_server_time(&self) {
            if let Some(landed) = lock(&self.landed).as_mut() {
                let now = self.server_now();
                landed.clock_reached = Some(landed.clock_reached.map_or(now, |at| at.max(now)));
            }
        }
    }
}
