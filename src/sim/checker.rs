//! Checks a [`History`] at every step, in real time:
//!
//! - at most one live exclusive holder per key, where live means granted,
//!   neither told lost nor released, and before its local deadline;
//!   another application's lock counts as a holder;
//! - never more live permits than the semaphore's number, and shared and
//!   exclusive holders never at once;
//! - fencing tokens strictly increase per key in the order of acquisition
//!   (between two live-at-grant leases of which one is exclusive: shared
//!   holders or permits may be answered out of order);
//! - `hold_at_least`: nobody is granted the key before the holder's
//!   acquisition + its minimum hold, less the server clock's allowed step
//!   back;
//! - every lease that ends other than by its holder (or a crash of its
//!   process) is told, its token fired, no later than its local deadline
//!   (the same instant is on time);
//! - once faults stop, every waiter is answered within a bound;
//! - a holder's release answers "released" only for a lease no operator
//!   certainly ended before: not if a force release of its key, or a
//!   release of its manager's owner id (leases in the lock collection,
//!   keys `locks/...`), started after the lease was granted and returned
//!   without an error before the holder's release started (such a lease
//!   was ended on the server by someone else: its release must report it
//!   lost).
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
    /// How far the server's clock may step back (it may free a key this
    /// much before a minimum hold ends in real time).
    pub clock_step_back: Duration,
    /// How much faster the server's clock may run than real time, in parts
    /// per million (a minimum hold ends that much sooner in real time).
    pub server_faster_ppm: u32,
    /// How long after the faults stop (or after it starts, if later) a
    /// waiter may wait.
    pub liveness: Duration,
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
    deadline: At,
    /// Told, released, its process crashed, or its deadline passed.
    ended: bool,
    /// Its holder released it or its process crashed: nothing to tell.
    gone: bool,
    told: bool,
    /// Ended on the server by an operator: left out of overlap checks.
    forced: bool,
    /// Its holder started releasing it (no later operator's call counts
    /// against the release's answer).
    release_started: bool,
    /// The operator's calls concerning it that started after its grant
    /// and before its release started, in flight.
    ops_after_grant: BTreeSet<OpNo>,
    /// One of those that ended before its release started: the lease was
    /// certainly ended by someone else.
    ended_by: Option<OpNo>,
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
        faults_stopped: None,
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
    checker.found
}

/// The checker's state after the events seen so far.
struct Checker {
    bounds: Bounds,
    leases: BTreeMap<LeaseNo, Lease>,
    keys: BTreeMap<String, KeyState>,
    crashed: BTreeSet<usize>,
    /// Every operator's call: what it concerns (a key, or a manager's
    /// leases), and when it ended (`None`: in flight).
    ops: BTreeMap<OpNo, (Result<String, usize>, Option<At>)>,
    waiters: BTreeMap<WaiterNo, (usize, String, At)>,
    faults_stopped: Option<At>,
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
            } => self.granted(
                *lease,
                *manager,
                key,
                *kind,
                *token,
                *deadline,
                (*acquired_after, *confirmed_after),
                *hold_at_least,
            ),
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
                if let Some(l) = self.leases.get_mut(lease) {
                    l.gone = true;
                    l.ended = true;
                    l.release_started = true;
                    self.end(*lease);
                }
            }
            Event::ReleaseAnswered { lease, released } => {
                let Some(l) = self.leases.get(lease) else {
                    return;
                };
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
            }
            Event::ForeignTaken { key, owner } => {
                let live = self.unforced_live(key);
                if !live.is_empty() {
                    self.violation(
                        key,
                        format!("{owner} locked the key beside live leases {live:?}"),
                    );
                }
                // A force release in flight may delete it at once.
                let state = self.keys.entry(key.clone()).or_default();
                state.foreign = Some(state.forcing > 0);
            }
            Event::ForeignRemoved { key } => {
                self.keys.entry(key.clone()).or_default().foreign = None;
            }
            Event::ForceReleaseStarted { op, key } => {
                self.ops.insert(*op, (Ok(key.clone()), None));
                let state = self.keys.entry(key.clone()).or_default();
                state.forcing += 1;
                state.hold_until = None;
                if let Some(forced) = &mut state.foreign {
                    *forced = true;
                }
                let live: Vec<LeaseNo> = state.live.iter().copied().collect();
                for n in live {
                    self.leases.get_mut(&n).expect("live").forced = true;
                }
                for l in self.leases.values_mut() {
                    if l.key == *key && !l.release_started {
                        l.ops_after_grant.insert(*op);
                    }
                }
            }
            Event::OwnerReleaseStarted { op, manager } => {
                self.ops.insert(*op, (Err(*manager), None));
                for l in self.leases.values_mut() {
                    if l.manager == *manager && !l.ended {
                        l.forced = true;
                    }
                    if owner_release_ends(l, *manager) && !l.release_started {
                        l.ops_after_grant.insert(*op);
                    }
                }
                for state in self.keys.values_mut() {
                    state.hold_until = None;
                }
            }
            Event::OpEnded { op, ok } => {
                if let Some((target, end)) = self.ops.get_mut(op) {
                    *end = Some(self.now);
                    if let Ok(key) = target {
                        self.keys.get_mut(key).expect("started").forcing -= 1;
                    }
                }
                for l in self.leases.values_mut() {
                    if l.ops_after_grant.remove(op) && *ok && !l.release_started {
                        l.ended_by.get_or_insert(*op);
                    }
                }
            }
            Event::WaitStarted {
                waiter,
                manager,
                key,
            } => {
                self.waiters
                    .insert(*waiter, (*manager, key.clone(), self.now));
            }
            Event::WaitEnded { waiter, .. } => {
                self.waiters.remove(waiter);
            }
            Event::FaultsStopped => self.faults_stopped = Some(self.now),
        }
    }

    fn end(&mut self, lease: LeaseNo) {
        let key = self.leases[&lease].key.clone();
        if let Some(state) = self.keys.get_mut(&key) {
            state.live.remove(&lease);
        }
    }

    /// Moves to `now`: leases whose deadline passed stop being live (and
    /// must have been told by then), waiters past their bound are late.
    fn advance(&mut self, now: At) {
        self.now = now;
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
            let bound = self.bounds.liveness;
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
        let forced = self.ops.values().any(|(target, end)| {
            let concerns = match target {
                Ok(k) => k == key,
                Err(m) => *m == manager,
            };
            concerns && end.is_none_or(|end| end >= confirmed_after)
        });
        let state = self.keys.entry(key.to_string()).or_default();
        let live_at_grant = deadline > now;
        self.leases.insert(
            lease,
            Lease {
                manager,
                key: key.to_string(),
                kind,
                deadline,
                ended: !live_at_grant,
                gone: false,
                told: false,
                forced,
                release_started: false,
                ops_after_grant: BTreeSet::new(),
                ended_by: None,
            },
        );
        if !live_at_grant {
            // Never live: nobody may use it, and its token must fire now.
            return;
        }
        let mut problems = Vec::new();
        if let Some(until) = state.hold_until
            && !forced
            && now + self.bounds.clock_step_back < until
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
        if state.foreign == Some(false) && !forced {
            problems.push("granted while another application holds the key".into());
        }
        let others: Vec<(LeaseNo, Kind)> = if forced {
            Vec::new()
        } else {
            state
                .live
                .iter()
                .filter(|n| !self.leases[*n].forced)
                .map(|n| (*n, self.leases[n].kind))
                .collect()
        };
        state.live.insert(lease);
        for (other, other_kind) in &others {
            let clash = !matches!(
                (kind, *other_kind),
                (Kind::Shared, Kind::Shared) | (Kind::Permit(_), Kind::Permit(_))
            );
            if clash {
                problems.push(format!(
                    "{kind:?} granted beside live {other_kind:?} lease {other}"
                ));
            }
        }
        if let Kind::Permit(n) = kind {
            let permits = others
                .iter()
                .filter(|(_, k)| matches!(k, Kind::Permit(_)))
                .count()
                + 1;
            if permits > n as usize {
                problems.push(format!("{permits} live permits of {n}"));
            }
        }
        for problem in problems {
            self.violation(key, format!("lease {lease} (manager {manager}): {problem}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }
    const BOUNDS: Bounds = Bounds {
        clock_step_back: Duration::from_millis(10),
        server_faster_ppm: 0,
        liveness: Duration::from_secs(30),
    };

    fn grant(lease: LeaseNo, manager: usize, kind: Kind, token: u64, deadline: u64) -> Event {
        grant_on("k", lease, manager, kind, token, deadline)
    }

    fn grant_on(
        key: &str,
        lease: LeaseNo,
        manager: usize,
        kind: Kind,
        token: u64,
        deadline: u64,
    ) -> Event {
        Event::Granted {
            lease,
            manager,
            key: key.into(),
            kind,
            token,
            deadline: ms(deadline),
            acquired_after: Duration::ZERO,
            confirmed_after: Duration::ZERO,
            hold_at_least: None,
        }
    }

    fn check(events: Vec<(u64, Event)>, end: u64) -> Vec<Violation> {
        let mut history = History::new();
        for (at, event) in events {
            history.push(ms(at), event);
        }
        super::check(BOUNDS, &history, ms(end))
    }

    fn told(lease: LeaseNo) -> Event {
        Event::Told {
            lease,
            reason: "taken".into(),
        }
    }

    #[test]
    fn a_succession_within_deadlines_passes() {
        let found = check(
            vec![
                (0, grant(1, 0, Kind::Exclusive, 1, 100)),
                (
                    50,
                    Event::Renewed {
                        lease: 1,
                        deadline: ms(150),
                    },
                ),
                (120, Event::Released { lease: 1 }),
                (130, grant(2, 1, Kind::Exclusive, 2, 230)),
                (230, told(2)),
            ],
            1_000,
        );
        assert_eq!(found, vec![]);
    }

    #[test]
    fn two_live_exclusive_holders_are_a_violation() {
        let found = check(
            vec![
                (0, grant(1, 0, Kind::Exclusive, 1, 100)),
                (99, grant(2, 1, Kind::Exclusive, 2, 200)),
            ],
            99,
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].what.contains("beside live Exclusive lease 1"));
    }

    #[test]
    fn a_holder_past_its_deadline_is_not_live_but_must_have_been_told() {
        let found = check(
            vec![
                (0, grant(1, 0, Kind::Exclusive, 1, 100)),
                (100, told(1)),
                (100, grant(2, 1, Kind::Exclusive, 2, 200)),
            ],
            150,
        );
        assert_eq!(found, vec![]);
        let found = check(vec![(0, grant(1, 0, Kind::Exclusive, 1, 100))], 101);
        assert_eq!(found.len(), 1);
        assert!(found[0].what.contains("not told"), "{found:?}");
        let found = check(
            vec![(0, grant(1, 0, Kind::Exclusive, 1, 100)), (101, told(1))],
            200,
        );
        assert_eq!(found.len(), 1, "{found:?}");
    }

    #[test]
    fn tokens_must_increase_and_permits_stay_within_their_number() {
        let found = check(
            vec![
                (0, grant(1, 0, Kind::Exclusive, 5, 10)),
                (10, told(1)),
                (20, grant(2, 1, Kind::Exclusive, 5, 30)),
                (30, told(2)),
            ],
            40,
        );
        assert_eq!(found.len(), 1, "{found:?}");
        let found = check(
            vec![
                (0, grant(1, 0, Kind::Permit(2), 7, 100)),
                (1, grant(2, 1, Kind::Permit(2), 6, 100)),
                (2, grant(3, 1, Kind::Permit(2), 8, 100)),
                (3, grant(4, 1, Kind::Shared, 9, 100)),
            ],
            4,
        );
        let whats: Vec<&str> = found.iter().map(|v| v.what.as_str()).collect();
        assert_eq!(found.len(), 4, "{whats:?}");
        assert!(whats[0].contains("3 live permits of 2"));
    }

    #[test]
    fn force_release_exempts_its_leases_from_overlap_but_not_from_telling() {
        let found = check(
            vec![
                (0, grant(1, 0, Kind::Exclusive, 1, 100)),
                (
                    10,
                    Event::ForceReleaseStarted {
                        op: 1,
                        key: "k".into(),
                    },
                ),
                (11, Event::OpEnded { op: 1, ok: true }),
                (12, grant(2, 1, Kind::Exclusive, 2, 200)),
                (15, told(1)),
                (200, told(2)),
            ],
            300,
        );
        assert_eq!(found, vec![]);
    }

    #[test]
    fn a_release_answered_released_after_an_operator_ended_the_lease_is_a_violation() {
        let force = |op| Event::ForceReleaseStarted {
            op,
            key: "locks/k".into(),
        };
        let granted =
            |lease, manager| grant_on("locks/k", lease, manager, Kind::Exclusive, lease, 1_000);
        let answered = |lease, released| Event::ReleaseAnswered { lease, released };
        // Force released after the grant, ended before the release started.
        let found = check(
            vec![
                (0, granted(1, 0)),
                (10, force(7)),
                (11, Event::OpEnded { op: 7, ok: true }),
                (20, Event::Released { lease: 1 }),
                (21, answered(1, true)),
            ],
            30,
        );
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].what.contains("operator's call 7"), "{found:?}");
        // Reported lost: right.
        let found = check(
            vec![
                (0, granted(1, 0)),
                (10, force(7)),
                (11, Event::OpEnded { op: 7, ok: true }),
                (20, Event::Released { lease: 1 }),
                (21, answered(1, false)),
            ],
            30,
        );
        assert_eq!(found, vec![]);
        // The same by a release of the manager's owner id; one of another
        // manager's owner id concerns it not.
        let owner = |op, manager| Event::OwnerReleaseStarted { op, manager };
        let by_owner = |manager| {
            check(
                vec![
                    (0, granted(1, 0)),
                    (10, owner(7, manager)),
                    (11, Event::OpEnded { op: 7, ok: true }),
                    (20, Event::Released { lease: 1 }),
                    (21, answered(1, true)),
                ],
                30,
            )
        };
        assert_eq!(by_owner(0).len(), 1);
        assert_eq!(by_owner(1), vec![]);
        // Concurrent: the call ended after the release started, or started
        // before the lease was granted (it may have run before the
        // acquisition): either may have come first. Or it failed: it may
        // not have been applied.
        for events in [
            vec![
                (0, granted(1, 0)),
                (10, force(7)),
                (11, Event::OpEnded { op: 7, ok: false }),
                (20, Event::Released { lease: 1 }),
                (21, answered(1, true)),
            ],
            vec![
                (0, granted(1, 0)),
                (10, force(7)),
                (20, Event::Released { lease: 1 }),
                (21, Event::OpEnded { op: 7, ok: true }),
                (22, answered(1, true)),
            ],
            vec![
                (0, force(7)),
                (1, granted(1, 0)),
                (11, Event::OpEnded { op: 7, ok: true }),
                (20, Event::Released { lease: 1 }),
                (21, answered(1, true)),
            ],
        ] {
            assert_eq!(check(events, 30), vec![]);
        }
    }

    #[test]
    fn hold_at_least_and_foreign_holders() {
        let mut held = grant(1, 0, Kind::Exclusive, 1, 100);
        if let Event::Granted {
            hold_at_least,
            acquired_after,
            ..
        } = &mut held
        {
            *hold_at_least = Some(ms(500));
            *acquired_after = ms(2);
        }
        let found = check(
            vec![
                (5, held),
                (10, Event::Released { lease: 1 }),
                (300, grant(2, 1, Kind::Exclusive, 2, 600)),
                (
                    400,
                    Event::ForeignTaken {
                        key: "k".into(),
                        owner: "app".into(),
                    },
                ),
            ],
            450,
        );
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].what.contains("minimum hold"));
        assert!(found[1].what.contains("beside live leases [2]"));
    }

    #[test]
    fn waiters_are_answered_within_the_bound_once_faults_stop() {
        let wait = Event::WaitStarted {
            waiter: 1,
            manager: 0,
            key: "k".into(),
        };
        let found = check(
            vec![(0, wait.clone()), (1_000, Event::FaultsStopped)],
            20_000,
        );
        assert_eq!(found, vec![]);
        let found = check(vec![(0, wait), (1_000, Event::FaultsStopped)], 31_001);
        assert_eq!(found.len(), 1, "{found:?}");
    }
}
