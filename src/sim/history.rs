//! The history of one run: what the holders, waiters and operators saw, in
//! real time, as data, judged by the [`checker`](super::checker).

use std::fmt;
use std::time::Duration;

/// An instant of a run: the time since its start.
pub type At = Duration;

/// A lease's number in its history (one per acquisition granted).
pub type LeaseNo = u64;

/// A waiter's number in its history (one per acquire call).
pub type WaiterNo = u64;

/// An operator's call's number in its history (force release, release by
/// owner id).
pub type OpNo = u64;

/// How a key is held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// One holder at a time.
    Exclusive,
    /// Any number of shared holders, never beside an exclusive one.
    Shared,
    /// `.1` permits (one lease taking several at once, or one) of a
    /// semaphore of `.0`.
    Permit(u32, u32),
}

/// One thing that happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// An acquisition returned a lease to its caller.
    Granted {
        /// The lease's number in this history.
        lease: LeaseNo,
        /// The manager (process) that holds it.
        manager: usize,
        /// Its key (with its place, e.g. `locks/k1`).
        key: String,
        /// How it holds the key.
        kind: Kind,
        /// Its fencing token.
        token: u64,
        /// Its local deadline when the caller got it.
        deadline: At,
        /// No later than the server's acquisition (e.g. when the caller
        /// started waiting), for `hold_at_least`.
        acquired_after: At,
        /// No later than the send of its last write the server confirmed
        /// (its acquisition's attempt, or a renewal): an operator's call
        /// that ended before this did not end it.
        confirmed_after: At,
        /// Its minimum hold, if any.
        hold_at_least: Option<Duration>,
    },
    /// A confirmed renewal moved the lease's local deadline.
    Renewed {
        /// The lease.
        lease: LeaseNo,
        /// Its new local deadline.
        deadline: At,
    },
    /// When the server's document of an exclusive lease in the lock
    /// collection expires (its `exp`, in real time at the server clock's
    /// rate and step back then), read as its holder got or renewed it
    /// (`sim::expiry`).
    ServerExpiry {
        /// The lease.
        lease: LeaseNo,
        /// When its document expires.
        expiry: At,
    },
    /// The document of a live exclusive lease in the lock collection, as
    /// the server holds it now (a write of it landed, perhaps long after
    /// it was sent, or the server's clock stepped), expires before the
    /// holder's local deadline, or sooner than it did (`sim::expiry`'s
    /// watcher).
    ExpiryNow {
        /// The lease.
        lease: LeaseNo,
        /// Its local deadline now.
        deadline: At,
        /// When its document expires on the server, in real time at the
        /// server clock's rate and steps now; now if the server no longer
        /// holds the key for it (deleted, another acquisition).
        expiry: At,
    },
    /// A write landed that gave `key` a lease `early` before the end, by
    /// the server's clock, of the lock-delay of an operator's call that had
    /// ended its last live lease on the server (`sim::landed`).
    GrantedInLockDelay {
        /// The key.
        key: String,
        /// How long before the delay's end it landed.
        early: Duration,
    },
    /// A write landed that gave `key` a lease whose fencing token is not
    /// above `above`, the highest token of the earlier leases of the key
    /// it must follow (`sim::landed`).
    TokenNotAbove {
        /// The key.
        key: String,
        /// The new lease's token.
        token: u64,
        /// The token it had to be above.
        above: u64,
    },
    /// The lease's token fired (its holder was told it is lost).
    Told {
        /// The lease.
        lease: LeaseNo,
        /// Why, as the manager says.
        reason: String,
    },
    /// The holder released or dropped the lease (it stops using it now).
    Released {
        /// The lease.
        lease: LeaseNo,
    },
    /// The holder's release of the lease (its [`Event::Released`]) returned.
    ReleaseAnswered {
        /// The lease.
        lease: LeaseNo,
        /// Whether it answered that the lease was still held and is now
        /// released (`ReleaseOutcome::Released`); `false` for "already
        /// lost" and for an error.
        released: bool,
    },
    /// A manager (process) crashed: it does nothing from now on, and
    /// releases nothing.
    Crashed {
        /// The manager.
        manager: usize,
    },
    /// Another application locked the key with a document of its own.
    ForeignTaken {
        /// The key.
        key: String,
        /// That application's owner id (`a bare {_id}` for a bare one).
        owner: String,
        /// How long after now, by the server's clock, that lock expires by
        /// its own rule (`crate::foreign`); `None` if never.
        expires_in: Option<Duration>,
    },
    /// The TTL monitor deleted the key's document (ours, or another
    /// application's), by the TTL index on `field`.
    TtlDeleted {
        /// The key.
        key: String,
        /// The indexed field (`exp`: the managers' garbage collector).
        field: String,
    },
    /// Another application removed its lock.
    ForeignRemoved {
        /// The key.
        key: String,
    },
    /// An operator asked to force release the key.
    ForceReleaseStarted {
        /// The call.
        op: OpNo,
        /// The key.
        key: String,
        /// Whether it asked for the key freed at once (after the lock-delay
        /// only), not once the holder was told or its deadline passed (the
        /// default).
        immediately: bool,
    },
    /// An operator asked to release every lease of a manager's owner id
    /// in the lock collection (keys `locks/...`; in-document leases are
    /// released by lease id only).
    OwnerReleaseStarted {
        /// The call.
        op: OpNo,
        /// The manager whose owner id it names.
        manager: usize,
        /// As [`Event::ForceReleaseStarted`]'s.
        immediately: bool,
    },
    /// An operator's call ended leases of ours (pushed before its
    /// [`Event::OpEnded`]): a force release that returned the lease it
    /// ended (its fencing token), or a release by owner id that released
    /// some (`None`).
    Overridden {
        /// The call.
        op: OpNo,
        /// The fencing token of the lease a force release ended.
        token: Option<u64>,
    },
    /// An operator asked the holders of the key to release it
    /// (`request_release`); its [`Event::OpEnded`]'s `ok` says whether it
    /// returned `true` (a lease held the key).
    ReleaseRequested {
        /// The call.
        op: OpNo,
        /// The key.
        key: String,
    },
    /// The lease's follower got `LeaseEvent::RevocationRequested`.
    RevocationTold {
        /// The lease.
        lease: LeaseNo,
    },
    /// An operator's call ended leases with a lock-delay (pushed before
    /// its [`Event::OpEnded`]): a force release that ended a lease of ours,
    /// or a release by owner id.
    LockDelay {
        /// The call.
        op: OpNo,
        /// The operator's manager's lock-delay, by the server's clock.
        delay: Duration,
    },
    /// An operator's call returned (whatever its outcome).
    OpEnded {
        /// The call.
        op: OpNo,
        /// Whether it returned without an error: it was applied on the
        /// server (an error leaves that unknown).
        ok: bool,
    },
    /// A caller started waiting for a key.
    WaitStarted {
        /// The waiter.
        waiter: WaiterNo,
        /// Its manager.
        manager: usize,
        /// The key.
        key: String,
    },
    /// The waiter's call returned (a lease, none, or an error).
    WaitEnded {
        /// The waiter.
        waiter: WaiterNo,
        /// What it returned.
        outcome: String,
    },
    /// A change of a semaphore key's number of permits returned `Set`: the
    /// server stored it, its live holders taking no more.
    PermitsSet {
        /// The key.
        key: String,
        /// The number now in force.
        permits: u32,
        /// When the change was asked for: the server stored it at some
        /// instant between then and now.
        started: At,
        /// The call failed with an unknown outcome: the server may have
        /// stored it, up to the landing bound after now, or not at all.
        unknown: bool,
    },
    /// A read of the key (`inspect`) showed these owners waiting for it
    /// (`LeaseInfo::waiters`), in order: each a manager, or `None` for an
    /// owner id of no manager; and its last acquisition's fencing token,
    /// owner id and leader transitions.
    WaitersRead {
        /// The key.
        key: String,
        /// The managers shown waiting.
        waiting: Vec<Option<usize>>,
        /// The key's fencing token, owner id and leader transitions
        /// (`LeaseInfo::transitions`), another application's lock's too;
        /// `None` when it shows no token (0).
        term: Option<(u64, String, u64)>,
    },
    /// No fault is injected from now on.
    FaultsStopped,
    /// A holder re-entered a lease it holds (`Acquire::reentrant`,
    /// `Lease::reenter`): `lease` is the new entry, which its holder
    /// releases with [`Event::Released`] like any lease.
    Reentered {
        /// The new entry's number.
        lease: LeaseNo,
        /// The lease (or entry of it) re-entered.
        of: LeaseNo,
        /// The new entry's fencing token.
        token: u64,
    },
    /// `acquire_all` or `try_acquire_all` returned a group: its leases,
    /// each recorded [`Event::Granted`] just before.
    GroupGranted {
        /// The group's leases.
        leases: Vec<LeaseNo>,
    },
    /// The lease (just granted) was acquired with `hold_at_most`: never
    /// renewed, its deadline at most `at_most` after its grant.
    HeldAtMost {
        /// The lease.
        lease: LeaseNo,
        /// Its `hold_at_most`.
        at_most: Duration,
    },
    /// The lease (just granted) was acquired with a payload in its
    /// acquiring write.
    AcquiredWithPayload {
        /// The lease.
        lease: LeaseNo,
    },
    /// A read of the key (`inspect`) showed a holder.
    Inspected {
        /// The manager that read it.
        manager: usize,
        /// The key.
        key: String,
        /// The holder's fencing token.
        token: u64,
        /// Whether it showed a payload.
        payload: bool,
    },
}

impl Event {
    /// The key the event concerns, if it names one.
    pub fn key(&self) -> Option<&str> {
        match self {
            Event::Granted { key, .. }
            | Event::ForeignTaken { key, .. }
            | Event::ForeignRemoved { key }
            | Event::GrantedInLockDelay { key, .. }
            | Event::TokenNotAbove { key, .. }
            | Event::TtlDeleted { key, .. }
            | Event::ForceReleaseStarted { key, .. }
            | Event::Inspected { key, .. }
            | Event::PermitsSet { key, .. }
            | Event::WaitersRead { key, .. }
            | Event::ReleaseRequested { key, .. }
            | Event::WaitStarted { key, .. } => Some(key),
            _ => None,
        }
    }

    /// The lease the event concerns, if any.
    pub fn lease(&self) -> Option<LeaseNo> {
        match self {
            Event::Granted { lease, .. }
            | Event::Renewed { lease, .. }
            | Event::ServerExpiry { lease, .. }
            | Event::ExpiryNow { lease, .. }
            | Event::Told { lease, .. }
            | Event::Released { lease }
            | Event::ReleaseAnswered { lease, .. }
            | Event::Reentered { lease, .. }
            | Event::HeldAtMost { lease, .. }
            | Event::RevocationTold { lease }
            | Event::AcquiredWithPayload { lease } => Some(*lease),
            _ => None,
        }
    }
}

/// One event with its instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// When it happened.
    pub at: At,
    /// What happened.
    pub event: Event,
}

impl fmt::Display for Entry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:>10.3} ms  {:?}",
            self.at.as_secs_f64() * 1e3,
            self.event
        )
    }
}

/// A run's events in the order they happened (instants never decrease).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct History {
    entries: Vec<Entry>,
}

impl History {
    /// An empty history.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `event` at `at`.
    ///
    /// # Panics
    ///
    /// If `at` is earlier than the last entry's instant.
    pub fn push(&mut self, at: At, event: Event) {
        if let Some(last) = self.entries.last() {
            assert!(at >= last.at, "history out of order: {at:?} after {last}");
        }
        self.entries.push(Entry { at, event });
    }

    /// The events so far.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The last `n` events up to entry `upto` (included) that concern `key`
    /// (its leases, waiters, foreign holders and operators) or every key
    /// (crashes, the end of faults), oldest first.
    pub fn trace_of(&self, key: &str, upto: usize, n: usize) -> Vec<&Entry> {
        let mut leases = std::collections::BTreeSet::new();
        let mut waiters = std::collections::BTreeSet::new();
        let mut ops = std::collections::BTreeSet::new();
        let end = (upto + 1).min(self.entries.len());
        for entry in &self.entries[..end] {
            match &entry.event {
                Event::Granted { lease, key: k, .. } if k == key => {
                    leases.insert(*lease);
                }
                Event::WaitStarted { waiter, key: k, .. } if k == key => {
                    waiters.insert(*waiter);
                }
                Event::ForceReleaseStarted { op, key: k, .. }
                | Event::ReleaseRequested { op, key: k }
                    if k == key =>
                {
                    ops.insert(*op);
                }
                Event::OwnerReleaseStarted { op, .. } => {
                    ops.insert(*op);
                }
                Event::Reentered { lease, of, .. } if leases.contains(of) => {
                    leases.insert(*lease);
                }
                _ => {}
            }
        }
        let concerns = |event: &Event| match event {
            Event::Crashed { .. } | Event::FaultsStopped | Event::OwnerReleaseStarted { .. } => {
                true
            }
            Event::OpEnded { op, .. }
            | Event::LockDelay { op, .. }
            | Event::Overridden { op, .. } => ops.contains(op),
            Event::Reentered { of, .. } => leases.contains(of),
            Event::GroupGranted { leases: group } => group.iter().any(|l| leases.contains(l)),
            Event::WaitEnded { waiter, .. } => waiters.contains(waiter),
            event => event.key() == Some(key) || event.lease().is_some_and(|l| leases.contains(&l)),
        };
        let mine: Vec<&Entry> = self.entries[..end]
            .iter()
            .filter(|e| concerns(&e.event))
            .collect();
        mine[mine.len().saturating_sub(n)..].to_vec()
    }
}

impl fmt::Display for History {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for entry in &self.entries {
            writeln!(f, "{entry}")?;
        }
        Ok(())
    }
}
