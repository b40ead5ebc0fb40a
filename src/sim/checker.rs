//! Checks a [`History`] at every step, in real time:
//!
//! - at most one live exclusive holder per key, where live means granted,
//!   neither told lost nor released, and before its local deadline;
//!   another application's lock counts as a holder;
//! - never more live permits than the semaphore's number in force (a lease
//!   counting the permits it takes; at a grant, the number the grantee asked
//!   for, which the server held at its write, or a number set since: one
//!   whose change returned after the grantee's attempt was sent, or was
//!   under way at the grant; at a change of the number, the new one),
//!   and shared and exclusive holders never at once;
//! - fencing tokens strictly increase per key in the order of acquisition
//!   (between two live-at-grant leases of which one is exclusive: shared
//!   holders or permits may be answered out of order), also as the server
//!   holds them, for every lease a landed write gives (`landed.rs`);
//! - `hold_at_least`: nobody is granted the key before the holder's
//!   acquisition + its minimum hold, less the server clock's allowed step
//!   back;
//! - every lease that ends other than by its holder (or a crash of its
//!   process) is told, its token fired, no later than its local deadline
//!   (the same instant is on time);
//! - lock-delay: after an operator's call ends a lease on the server,
//!   nobody is granted its key before the delay has passed
//!   (`checker/lock_delay.rs`, from what the clients saw; `landed.rs`,
//!   from what the server holds);
//! - revocation: once faults stop, a request to release a held key
//!   reaches its live holders within a bound (`checker/revocation.rs`);
//! - once faults stop, every waiter is answered within a bound;
//! - a read shows as waiting only managers that wait for the key, or did
//!   within the waiter window (a registration's lifetime), each once, and
//!   at most the queue's bound of them;
//! - reads of one fencing token of a key show one owner and one count of
//!   leader transitions (only a new acquisition changes them);
//! - a holder's release answers "released" only for a lease no operator
//!   certainly ended before: not if a force release of its key, or a
//!   release of its manager's owner id (leases in the lock collection,
//!   keys `locks/...`), not marked immediate, started after the lease was
//!   granted and returned without an error before the holder's release
//!   started (such a lease was ended on the server by someone else: its
//!   release must report it lost).
//!
//! - a re-entered lease is one lease, held until its last entry is
//!   released, and a group is handed out whole and lost whole (properties
//!   8 and 9, `checker/entries.rs`);
//! - an exclusive lease's local deadline, at its grant and each renewal,
//!   is no later than its document's expiry on the server (property 16,
//!   `expiry.rs`).
//!
//! A force release, or a release of a manager's owner id, ends its leases
//! on the server while their holders still believe in them until told:
//! the leases live while one is in flight, or granted after their wait
//! started before one ended (the reply of an acquisition it ended may come
//! later), are left out of the overlap checks from then on, but must still
//! be told by their deadline, and a minimum hold ends there.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use super::history::{At, Entry, Event, History, Kind, LeaseNo, OpNo, WaiterNo};

/// What the checker allows.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// How far the server's clock may step back between two writes (a few
    /// milliseconds, B3); what a lease's expiry may be read short by.
    pub clock_step_back: Duration,
    /// How far the server's clock may step, either way, at a failover
    /// (the bound on the members' clocks' difference the managers assume,
    /// `clock_skew`, the steps back included): a server ahead frees a key
    /// this much before a minimum hold, a lock-delay or another
    /// application's lock ends in real time.
    pub clock_skew: Duration,
    /// How much faster the server's clock may run than real time, in parts
    /// per million (a minimum hold ends that much sooner in real time).
    pub server_faster_ppm: u32,
    /// How long after it was sent a call may land on the server: an
    /// operator's call that failed may still end leases until then.
    pub landing: Duration,
    /// How long after the faults stop (or after it starts, if later) a
    /// waiter may wait once nothing fails; a write sent before may still
    /// land up to `landing` after and hold its key for one `ttl` from then,
    /// which the bound adds.
    pub liveness: Duration,
    /// The longest TTL a write of an acquisition carries.
    pub ttl: Duration,
    /// How long after its last wait for a key ended a manager may still be
    /// shown waiting for it: its registration window (or a waiting mark's
    /// TTL), plus how late an attempt sent before the wait ended may land.
    pub waiter_window: Duration,
    /// The most owners a read may show waiting for a key: the bound on its
    /// queue of waiting owners ("Bound" in `store`'s "Queue of waiting
    /// owners").
    pub queue_bound: usize,
}

/// A property the history breaks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// When it was found.
    pub at: At,
    /// The entry that showed it (its index), or the end of the history.
    pub entry: usize,
    /// The key concerned.
    pub key: String,
    /// What is wrong.
    pub what: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "at {:.3} ms on {}: {}",
            self.at.as_secs_f64() * 1e3,
            self.key,
            self.what
        )
    }
}

struct Lease {
    manager: usize,
    key: String,
    kind: Kind,
    token: u64,
    deadline: At,
    /// Told, released, its process crashed, or its deadline passed.
    ended: bool,
    /// Its holder released it or its process crashed: nothing to tell.
    gone: bool,
    told: bool,
    /// An operator's call may have ended it on the server: left out of
    /// the checks of what its holder is told and when its document expires.
    forced: bool,
    /// An immediate override (the operator's word that its holder is
    /// gone) may have ended it: left out of mutual exclusion too.
    at_once: bool,
    /// Its holder started releasing it (no later operator's call counts
    /// against the release's answer).
    release_started: bool,
    /// The operator's calls concerning it that started after its grant
    /// and before its release started, in flight.
    ops_after_grant: BTreeSet<OpNo>,
    /// One of those that ended before its release started: the lease was
    /// certainly ended by someone else.
    ended_by: Option<OpNo>,
    /// When it was granted.
    granted_at: At,
    /// When its attempt was sent (the earliest of its writes).
    sent_at: At,
    /// When it ended, as `ended` says.
    ended_at: Option<At>,
    /// When its release answered "released": the server held it live no
    /// longer.
    released_at: Option<At>,
}

/// Whether an operator's release of manager `manager`'s owner id ends
/// `lease` (a lease of that manager in the lock collection).
fn owner_release_ends(lease: &Lease, manager: usize) -> bool {
    lease.manager == manager && lease.key.starts_with("locks/")
}

#[derive(Default)]
struct KeyState {
    live: BTreeSet<LeaseNo>,
    /// Another application's lock, and whether an operator removed it.
    foreign: Option<bool>,
    /// The earliest instant that lock may expire by its own rule (its
    /// lifetime shortened by the server clock's faster rate); `None` if it
    /// never expires.
    foreign_until: Option<At>,
    max_token: Option<u64>,
    max_exclusive_token: Option<u64>,
    hold_until: Option<At>,
    forcing: usize,
}

/// Checks the whole of `history`, then its end at `end`; returns every
/// violation.
pub fn check(bounds: Bounds, history: &History, end: At) -> Vec<Violation> {
    let mut checker = Checker {
        bounds,
        leases: BTreeMap::new(),
        keys: BTreeMap::new(),
        crashed: BTreeSet::new(),
        ops: BTreeMap::new(),
        waiters: BTreeMap::new(),
        entries: Default::default(),
        waits: BTreeMap::new(),
        terms: BTreeMap::new(),
        faults_stopped: None,
        permits_sets: permits_sets(history, bounds.landing),
        lock_delays: Default::default(),
        landing_forces: Vec::new(),
        override_waits: Default::default(),
        requests: Default::default(),
        now: At::ZERO,
        entry: 0,
        found: Vec::new(),
    };
    for entry in history.entries() {
        checker.advance(entry.at);
        checker.observe(entry);
        checker.entry += 1;
    }
    checker.advance(end);
    let mut found = checker.found;
    found.extend(super::durations::check(history));
    found.extend(super::expiry::check(history));
    found
}

/// The checker's state after the events seen so far.
/// An operator's call.
struct Op {
    /// What it concerns: a key, or a manager's leases.
    target: Result<String, usize>,
    /// When it ended (`None`: in flight; a failed call counts until it can
    /// no longer land).
    end: Option<At>,
    /// Whether the operator said the holders are gone (`immediately`).
    immediately: bool,
}

struct Checker {
    bounds: Bounds,
    leases: BTreeMap<LeaseNo, Lease>,
    keys: BTreeMap<String, KeyState>,
    crashed: BTreeSet<usize>,
    /// Every operator's call: what it concerns (a key, or a manager's
    /// leases), and when it ended (`None`: in flight).
    ops: BTreeMap<OpNo, Op>,
    waiters: BTreeMap<WaiterNo, (usize, String, At)>,
    /// Re-entered leases and groups (properties 8 and 9).
    entries: entries::Entries,
    /// Per manager and key: its waits in progress, and when the last one
    /// ended (or its process crashed).
    waits: BTreeMap<(usize, String), (usize, Option<At>)>,
    /// Per key and fencing token: the owner id and leader transitions a
    /// read showed with it.
    terms: BTreeMap<(String, u64), (String, u64)>,
    faults_stopped: Option<At>,
    /// Per semaphore key: each change of its number of permits that
    /// returned `Set`, as when it was asked for, when it returned, and the
    /// number (read ahead of time: a grant may come while one is under
    /// way).
    permits_sets: BTreeMap<String, Vec<(At, At, u32)>>,
    lock_delays: lock_delay::LockDelays,
    /// Force releases that returned, each with when it may have landed by
    /// and its key: in flight (`KeyState::forcing`) until then.
    landing_forces: Vec<(At, String)>,
    override_waits: override_wait::OverrideWaits,
    requests: revocation::Requests,
    now: At,
    entry: usize,
    found: Vec<Violation>,
}

impl Checker {
    fn violation(&mut self, key: &str, what: String) {
        self.found.push(Violation {
            at: self.now,
            entry: self.entry,
            key: key.to_string(),
            what,
        });
    }

    /// Checks the next entry, once the checker has moved to its instant.
    fn observe(&mut self, entry: &Entry) {
        match &entry.event {
            Event::Granted {
                lease,
                manager,
                key,
                kind,
                token,
                deadline,
                acquired_after,
                confirmed_after,
                hold_at_least,
            } => {
                self.granted(
                    *lease,
                    *manager,
                    key,
                    *kind,
                    *token,
                    *deadline,
                    (*acquired_after, *confirmed_after),
                    *hold_at_least,
                );
                self.entry_granted(*lease, *token);
            }
            Event::Renewed { lease, deadline } => {
                let now = self.now;
                let Some(l) = self.leases.get_mut(lease) else {
                    return;
                };
                if l.ended && !l.gone && !l.told {
                    let key = l.key.clone();
                    self.violation(
                        &key,
                        format!(
                            "lease {lease} renewed to {deadline:?} at {now:?}, after its deadline"
                        ),
                    );
                } else if !l.ended {
                    l.deadline = *deadline;
                }
            }
            Event::Told { lease, reason } => {
                self.entries_told(*lease, reason);
                let now = self.now;
                let Some(l) = self.leases.get_mut(lease) else {
                    return;
                };
                if l.gone || l.told {
                    return;
                }
                l.told = true;
                l.ended = true;
                let (key, deadline) = (l.key.clone(), l.deadline);
                self.end(*lease);
                if now > deadline {
                    self.violation(
                        &key,
                        format!(
                            "lease {lease} told lost ({reason}) {:?} after its local deadline",
                            now - deadline
                        ),
                    );
                }
            }
            Event::Released { lease } => {
                let lease = &self.root(*lease);
                if !self.entry_released(*lease) {
                    return;
                }
                if let Some(l) = self.leases.get_mut(lease) {
                    l.gone = true;
                    l.ended = true;
                    l.release_started = true;
                    self.end(*lease);
                }
            }
            Event::ReleaseAnswered { lease, released } => {
                let (lease, now) = (&self.root(*lease), self.now);
                let Some(l) = self.leases.get_mut(lease) else {
                    return;
                };
                if *released {
                    l.released_at.get_or_insert(now);
                }
                if let (true, Some(op)) = (*released, l.ended_by) {
                    let key = l.key.clone();
                    self.violation(
                        &key,
                        format!(
                            "lease {lease} released as held, though operator's call {op} ended it before its release started"
                        ),
                    );
                }
            }
            Event::Crashed { manager } => {
                self.crashed.insert(*manager);
                let mine: Vec<LeaseNo> = self
                    .leases
                    .iter()
                    .filter(|(_, l)| l.manager == *manager && !l.gone)
                    .map(|(n, _)| *n)
                    .collect();
                for n in mine {
                    let l = self.leases.get_mut(&n).expect("listed");
                    l.gone = true;
                    l.ended = true;
                    self.end(n);
                }
                self.waiters.retain(|_, (m, _, _)| m != manager);
                self.lock_delay_crashed(*manager);
                let now = self.now;
                for ((m, _), waits) in self.waits.iter_mut() {
                    if m == manager {
                        *waits = (0, Some(now));
                    }
                }
            }
            Event::ForeignTaken {
                key,
                owner,
                expires_in,
            } => {
                let live = self.unforced_live(key);
                if !live.is_empty() {
                    self.violation(
                        key,
                        format!("{owner} locked the key beside live leases {live:?}"),
                    );
                }
                // A force release in flight may delete it at once.
                let ppm = f64::from(self.bounds.server_faster_ppm);
                let until = expires_in.map(|d| self.now + d.mul_f64(1e6 / (1e6 + ppm)));
                let state = self.keys.entry(key.clone()).or_default();
                state.foreign = Some(state.forcing > 0);
                state.foreign_until = until;
            }
            Event::ForeignRemoved { key } => {
                self.keys.entry(key.clone()).or_default().foreign = None;
            }
            Event::ForceReleaseStarted {
                op,
                key,
                immediately,
            } => {
                self.override_started(*op, Ok(key), *immediately);
                self.lock_delay_call_started(*op, None);
                self.ops.insert(
                    *op,
                    Op {
                        target: Ok(key.clone()),
                        end: None,
                        immediately: *immediately,
                    },
                );
                let state = self.keys.entry(key.clone()).or_default();
                state.forcing += 1;
                state.hold_until = None;
                if let Some(forced) = &mut state.foreign {
                    *forced = true;
                }
                // Each live lease may be ended on the server; only an
                // immediate override (the operator's word that their holders
                // are gone) excuses another holder beside them: by default
                // they stay live to their holders until told or their
                // deadline (properties 1, 2 and 17).
                let live: Vec<LeaseNo> = state.live.iter().copied().collect();
                for n in live {
                    let l = self.leases.get_mut(&n).expect("live");
                    l.forced = true;
                    l.at_once |= *immediately;
                }
                // Only an override that waits for the holder certainly
                // ends its lease: after an immediate one, an acquisition
                // attempt of the holder still in flight may land and hold
                // the key under that lease id again (docs/lock-delay.md).
                // (Nor does one end a lease an immediate override ended
                // already: the key is free after that one's lock-delay.)
                for l in self.leases.values_mut() {
                    if l.key == *key && !l.release_started && !*immediately && !l.at_once {
                        l.ops_after_grant.insert(*op);
                    }
                }
            }
            Event::OwnerReleaseStarted {
                op,
                manager,
                immediately,
            } => {
                self.override_started(*op, Err(*manager), *immediately);
                self.lock_delay_call_started(*op, Some(*manager));
                self.ops.insert(
                    *op,
                    Op {
                        target: Err(*manager),
                        end: None,
                        immediately: *immediately,
                    },
                );
                for l in self.leases.values_mut() {
                    if l.manager == *manager && !l.ended {
                        l.forced = true;
                        l.at_once |= *immediately;
                    }
                    let waits = !*immediately && !l.at_once;
                    if owner_release_ends(l, *manager) && !l.release_started && waits {
                        l.ops_after_grant.insert(*op);
                    }
                }
                for state in self.keys.values_mut() {
                    state.hold_until = None;
                }
            }
            Event::LockDelay { op, delay } => self.lock_delay_recorded(*op, *delay),
            Event::ReleaseRequested { op, key } => self.release_requested(*op, key),
            Event::RevocationTold { lease } => self.revocation_told(*lease),
            Event::Overridden { op, token } => self.overridden(*op, *token),
            Event::OpEnded { op, ok } => {
                self.override_ended(*op, *ok);
                self.lock_delay_call_ended(*op, *ok);
                self.release_request_ended(*op, *ok);
                // A call that failed may still land on the server, up to
                // `landing` later: it counts as in flight until then.
                let until = match ok {
                    true => self.now,
                    false => self.now + self.bounds.landing,
                };
                if let Some(call) = self.ops.get_mut(op) {
                    call.end = Some(until);
                    if let Ok(key) = &call.target {
                        self.landing_forces.push((until, key.clone()));
                    }
                }
                self.forces_landed();
                for l in self.leases.values_mut() {
                    if l.ops_after_grant.remove(op) && *ok && !l.release_started {
                        l.ended_by.get_or_insert(*op);
                    }
                }
            }
            Event::PermitsSet {
                key,
                permits,
                unknown: false,
                ..
            } => self.permits_set(key, *permits),
            // Perhaps stored: its number counts for grants (`permits_sets`),
            // the live permits need not fit it.
            Event::PermitsSet { unknown: true, .. } => {}
            Event::WaitersRead { key, waiting, term } => {
                self.waiters_read(key, waiting);
                if let Some((token, owner, transitions)) = term {
                    self.transitions_read(key, *token, owner, *transitions);
                }
            }
            Event::WaitStarted {
                waiter,
                manager,
                key,
            } => {
                self.waiters
                    .insert(*waiter, (*manager, key.clone(), self.now));
                self.lock_delay_wait_started(*waiter, *manager, key);
                // A group's wait (`groups.rs`) names its keys joined by `+`:
                // it waits for each.
                for key in key.split('+') {
                    let waits = self.waits.entry((*manager, key.to_string())).or_default();
                    waits.0 += 1;
                }
            }
            Event::WaitEnded { waiter, outcome } => {
                self.lock_delay_wait_ended(*waiter, outcome == "granted");
                if let Some((manager, keys, _)) = self.waiters.remove(waiter) {
                    for key in keys.split('+') {
                        if let Some(waits) = self.waits.get_mut(&(manager, key.to_string())) {
                            waits.0 = waits.0.saturating_sub(1);
                            waits.1 = Some(self.now);
                        }
                    }
                }
            }
            Event::FaultsStopped => self.faults_stopped = Some(self.now),
            Event::Reentered { lease, of, token } => self.reentered(*lease, *of, *token),
            Event::GroupGranted { leases } => self.group_granted(leases),
            // Judged by `durations::check`.
            Event::HeldAtMost { .. }
            | Event::AcquiredWithPayload { .. }
            | Event::Inspected { .. } => {}
            // Judged by `expiry::check`.
            Event::ServerExpiry { .. } => {}
            // What the server did, for the trace.
            Event::TtlDeleted { .. } => {}
            Event::ExpiryNow {
                lease,
                deadline,
                expiry,
            } => self.expiry_now(*lease, *deadline, *expiry),
            Event::TokenNotAbove { key, token, above } => self.violation(
                key,
                format!(
                    "a lease was granted on the server with fencing token {token}, \
                     not above {above}, an earlier lease's of the key"
                ),
            ),
            Event::GrantedInLockDelay { key, early } => self.violation(
                key,
                format!(
                    "a lease was granted on the server {early:?} before the lock-delay \
                     of an operator's call that ended its last live lease there had passed"
                ),
            ),
        }
    }

    fn end(&mut self, lease: LeaseNo) {
        let now = self.now;
        let l = self.leases.get_mut(&lease).expect("a granted lease");
        l.ended_at.get_or_insert(now);
        let key = l.key.clone();
        if let Some(state) = self.keys.get_mut(&key) {
            state.live.remove(&lease);
        }
    }

    /// The force releases that may have landed by now stop being in flight.
    fn forces_landed(&mut self) {
        let now = self.now;
        let keys = &mut self.keys;
        self.landing_forces.retain(|(until, key)| {
            let landed = *until <= now;
            if landed {
                keys.get_mut(key).expect("started").forcing -= 1;
            }
            !landed
        });
    }

    /// Moves to `now`: leases whose deadline passed stop being live (and
    /// must have been told by then), waiters past their bound are late.
    fn advance(&mut self, now: At) {
        self.now = now;
        self.forces_landed();
        let (mut expired, mut untold) = (Vec::new(), Vec::new());
        for (n, l) in &mut self.leases {
            if !l.ended && l.deadline <= now {
                l.ended = true;
                expired.push(*n);
            }
            // Told at the deadline's instant at the latest.
            if l.ended && !l.told && !l.gone && now > l.deadline {
                l.gone = true;
                untold.push(*n);
            }
        }
        for n in expired {
            self.end(n);
        }
        self.check_requests();
        for n in untold {
            let l = &self.leases[&n];
            if !self.crashed.contains(&l.manager) {
                let (key, deadline) = (l.key.clone(), l.deadline);
                self.violation(
                    &key,
                    format!("lease {n} not told lost by its local deadline {deadline:?}"),
                );
            }
        }
        if let Some(stopped) = self.faults_stopped {
            let bound = self.bounds.liveness + self.bounds.landing + self.bounds.ttl;
            let late: Vec<(WaiterNo, String, At)> = self
                .waiters
                .iter()
                .filter(|(_, (_, _, since))| now > (*since).max(stopped) + bound)
                .map(|(w, (_, key, since))| (*w, key.clone(), *since))
                .collect();
            for (waiter, key, since) in late {
                self.waiters.remove(&waiter);
                self.violation(
                    &key,
                    format!(
                        "waiter {waiter} (since {since:?}) not answered {bound:?} after the faults stopped"
                    ),
                );
            }
        }
        self.check_groups_told();
    }

    fn unforced_live(&self, key: &str) -> Vec<LeaseNo> {
        self.keys.get(key).map_or_else(Vec::new, |state| {
            state
                .live
                .iter()
                .copied()
                .filter(|n| !self.leases[n].forced)
                .collect()
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn granted(
        &mut self,
        lease: LeaseNo,
        manager: usize,
        key: &str,
        kind: Kind,
        token: u64,
        deadline: At,
        (acquired_after, confirmed_after): (At, At),
        hold_at_least: Option<Duration>,
    ) {
        let now = self.now;
        // An operator's call that ended after this acquisition's attempt
        // was sent may have ended it on the server before its reply came.
        // An immediate one also counts for an attempt sent before it ended
        // and confirmed after (under a lease id it ended, whose earlier
        // write may have landed after it and taken the key again:
        // docs/lock-delay.md).
        let may_end = |at_once_only: bool| {
            self.ops.values().any(|call| {
                let concerns = match &call.target {
                    Ok(k) => k == key,
                    Err(m) => *m == manager,
                };
                let at_once = call.immediately || !at_once_only;
                let since = match call.immediately {
                    true => acquired_after.min(confirmed_after),
                    false => confirmed_after,
                };
                at_once && concerns && call.end.is_none_or(|end| end >= since)
            })
        };
        let forced = may_end(false);
        // Only an immediate override excuses a grant beside a live lease:
        // one that waits for the holders ends the new lease, if it lands
        // after the grant, only once its holder is told, and the key's
        // other leases stay live to their holders meanwhile.
        let forced_at_once = may_end(true);
        let sent = acquired_after.min(confirmed_after);
        self.check_lock_delay(lease, key, forced, (manager, sent));
        self.check_override_wait(lease, key, acquired_after.max(confirmed_after));
        let state = self.keys.entry(key.to_string()).or_default();
        let live_at_grant = deadline > now;
        self.leases.insert(
            lease,
            Lease {
                manager,
                key: key.to_string(),
                kind,
                token,
                deadline,
                ended: !live_at_grant,
                gone: false,
                told: false,
                forced,
                at_once: forced_at_once,
                release_started: false,
                ops_after_grant: BTreeSet::new(),
                ended_by: None,
                granted_at: now,
                sent_at: acquired_after.min(confirmed_after),
                ended_at: (!live_at_grant).then_some(now),
                released_at: None,
            },
        );
        if !live_at_grant {
            // Never live: nobody may use it, and its token must fire now.
            return;
        }
        let mut problems = Vec::new();
        let step = self.bounds.clock_step_back.max(self.bounds.clock_skew);
        if let Some(until) = state.hold_until
            && !forced
            && now + step < until
        {
            problems.push(format!(
                "granted {:?} before the minimum hold's end {until:?}",
                until - now
            ));
        }
        let tokens_before = match kind {
            Kind::Exclusive => state.max_token,
            _ => state.max_exclusive_token,
        };
        // An operator may have ended it before its reply came: its token
        // is then the server's older one (a fenced resource refuses it).
        if let Some(before) = tokens_before
            && !forced
            && token <= before
        {
            problems.push(format!("token {token} not above {before}"));
        }
        state.max_token = state.max_token.max(Some(token));
        if kind == Kind::Exclusive {
            state.max_exclusive_token = state.max_exclusive_token.max(Some(token));
        }
        // A force release in flight may end this minimum hold too.
        if let Some(hold) = hold_at_least
            && !forced
        {
            let ppm = u64::from(self.bounds.server_faster_ppm);
            let hold = hold.mul_f64(1e6 / (1e6 + ppm as f64));
            state.hold_until = Some(acquired_after + hold);
        }
        // Before that lock expired by its own rule, whatever `$$NOW` did
        // (a step back only delays its expiry; a step forward after it was
        // written, at most `clock_skew`, brings it closer).
        let foreign_live = state.foreign_until.is_none_or(|until| now + step < until);
        if state.foreign == Some(false) && !forced && foreign_live {
            problems.push("granted while another application holds the key".into());
        }
        let others: Vec<(LeaseNo, Kind)> = if forced_at_once {
            Vec::new()
        } else {
            state
                .live
                .iter()
                .filter(|n| !self.leases[*n].at_once)
                .map(|n| (*n, self.leases[n].kind))
                .collect()
        };
        state.live.insert(lease);
        for (other, other_kind) in &others {
            let clash = !matches!(
                (kind, *other_kind),
                (Kind::Shared, Kind::Shared) | (Kind::Permit(..), Kind::Permit(..))
            );
            if clash {
                problems.push(format!(
                    "{kind:?} granted beside live {other_kind:?} lease {other}"
                ));
            }
        }
        if let Kind::Permit(asked, taken) = kind {
            // Each lease counts the permits it takes.
            let others: u32 = others
                .iter()
                .map(|(_, k)| match k {
                    Kind::Permit(_, t) => *t,
                    _ => 0,
                })
                .sum();
            let permits = others + taken;
            // The number the server held at this acquisition's write is
            // the one asked for (another fails it); a change that returned
            // after the attempt was sent, or is under way, may have come
            // after that write, its number in force now. The attempt was
            // sent no earlier than the wait's start, or than its own
            // confirmation if it was an earlier wait's, answered late:
            // the earlier of `acquired_after` and `confirmed_after` (a
            // renewal, which checks no number, may set the latter later).
            let sent = acquired_after.min(confirmed_after);
            let n = self
                .permits_sets
                .get(key)
                .into_iter()
                .flatten()
                .filter(|(started, returned, _)| *started <= now && *returned >= sent)
                .map(|(_, _, number)| *number)
                .fold(asked, u32::max);
            if permits > n {
                problems.push(format!("{permits} live permits of {n}"));
            }
        }
        for problem in problems {
            self.violation(key, format!("lease {lease} (manager {manager}): {problem}"));
        }
    }
}

/// Each key's changes of its number of permits in `history` that returned
/// `Set`, or failed with an unknown outcome (then perhaps stored up to
/// `landing` after they returned) (`Checker::permits_sets`).
fn permits_sets(history: &History, landing: Duration) -> BTreeMap<String, Vec<(At, At, u32)>> {
    let mut sets: BTreeMap<String, Vec<(At, At, u32)>> = BTreeMap::new();
    for entry in history.entries() {
        if let Event::PermitsSet {
            key,
            permits,
            started,
            unknown,
        } = &entry.event
        {
            let returned = match unknown {
                true => entry.at + landing,
                false => entry.at,
            };
            sets.entry(key.clone())
                .or_default()
                .push((*started, returned, *permits));
        }
    }
    sets
}

mod entries;
impl Checker {
    /// A read showed `waiting` waiting for `key`: each a manager, at most
    /// once, that waits for the key now or did within the waiter window;
    /// at most the queue's bound of them.
    fn waiters_read(&mut self, key: &str, waiting: &[Option<usize>]) {
        if waiting.len() > self.bounds.queue_bound {
            self.violation(
                key,
                format!(
                    "a read shows {} owners waiting, beyond the queue's bound {}",
                    waiting.len(),
                    self.bounds.queue_bound
                ),
            );
        }
        let mut seen = BTreeSet::new();
        for shown in waiting {
            let Some(manager) = *shown else {
                self.violation(key, "a read shows a waiting owner of no manager".into());
                continue;
            };
            if !seen.insert(manager) {
                self.violation(key, format!("a read shows manager {manager} waiting twice"));
            }
            let recent = match self.waits.get(&(manager, key.to_string())) {
                Some((in_progress, _)) if *in_progress > 0 => true,
                Some((_, Some(ended))) => self.now <= *ended + self.bounds.waiter_window,
                _ => false,
            };
            if !recent {
                self.violation(
                    key,
                    format!("a read shows manager {manager} waiting, which has not waited for the key within {:?}", self.bounds.waiter_window),
                );
            }
        }
    }

    /// A read showed `key` last acquired with `token` by `owner`, after
    /// `transitions` leader transitions: only a new acquisition (a new
    /// token) changes them, so every read of one token shows the same.
    fn transitions_read(&mut self, key: &str, token: u64, owner: &str, transitions: u64) {
        let seen = (owner.to_string(), transitions);
        let first = self
            .terms
            .entry((key.to_string(), token))
            .or_insert_with(|| seen.clone())
            .clone();
        if first != seen {
            self.violation(
                key,
                format!(
                    "token {token} read with owner and transitions {seen:?}, earlier {first:?}"
                ),
            );
        }
    }

    /// The number of permits of `key` was set to `permits` (the change
    /// applies only while the live holders take no more): its live permits
    /// (a lease counting those it takes) must fit.
    fn permits_set(&mut self, key: &str, permits: u32) {
        let live: u32 = self
            .unforced_live(key)
            .iter()
            .map(|n| match self.leases[n].kind {
                Kind::Permit(_, taken) => taken,
                _ => 0,
            })
            .sum();
        if live > permits {
            self.violation(
                key,
                format!("the number of permits set to {permits} with {live} live permits"),
            );
        }
    }
}

mod lock_delay;
mod override_wait;
mod revocation;
pub(crate) use revocation::TOLD_WITHIN;
#[cfg(test)]
mod tests;

impl Checker {
    /// Property 16 at every instant: the document of the live lease
    /// `lease`, as the server holds it now, expires at `expiry` (in real
    /// time), which must not come before its local deadline `deadline`
    /// (less the server clock's allowed step back), unless an operator's
    /// call may have ended it.
    fn expiry_now(&mut self, lease: LeaseNo, deadline: At, expiry: At) {
        let Some(l) = self.leases.get(&lease) else {
            return;
        };
        if l.forced || l.ended || deadline <= self.now {
            return;
        }
        if deadline > expiry + self.bounds.clock_step_back {
            let key = l.key.clone();
            self.violation(
                &key,
                format!(
                    "lease {lease} (manager {}) has its local deadline {deadline:?} after its \
                     document on the server now expires, at {expiry:?}: a write landed or the \
                     server's clock stepped",
                    l.manager
                ),
            );
        }
    }
}
