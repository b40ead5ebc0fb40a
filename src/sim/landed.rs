//! Two properties as the server holds them, judged on every write that
//! lands, whether or not its caller still waits for it:
//!
//! - 14 (lock-delay): once an operator's call (a force release, a release
//!   by owner id) lands and ends what held a key (its last live lease, or
//!   the minimum hold that alone held it), no write lands that gives the
//!   key a lease before that call's lock-delay has passed, by the server's
//!   clock;
//! - 3 (fencing): each lease a write gives a key has a token above every
//!   earlier lease's of the key that it may run beside or after: an
//!   exclusive lease's above every earlier lease's, a shared holder's or
//!   permit's above every earlier exclusive lease's (shared holders and
//!   permits among themselves are in no order).
//!
//! The twin records what each manager's write changed of what holds the
//! keys of the lock collection (`store::memory::landed`: the live leases
//! before and after, with their tokens, and a minimum hold alone; the
//! documents a force release rewrote; the call; the server time; the
//! latest time the server's clock had shown); this module judges those facts
//! alone, not the twin's rules, and records each breach
//! ([`Event::GrantedInLockDelay`], [`Event::TokenNotAbove`]: violations
//! for the checker). The client-side check of property 14
//! (`checker/lock_delay.rs`) needs the history to show that no other
//! owner's place could be live when the call applied; here the server's
//! own state shows it, so every landing is judged, whatever the waits
//! around it.
//!
//! The delay judged is the lock-delay alone, counted from the call's
//! landing: at least that much every call promises, immediate or not (one
//! that is not also waits for the ended leases' expiry, which the client
//! side checks). It ends at the key's next grant, or once the server's
//! clock has shown its end: a failover may step the clock back, and what
//! the server did in between by its clock (a grant, a follow-up delete of
//! the document) was on time. An immediate force release that rewrites
//! the waiting key frees it after its own lock-delay (docs/lock-delay.md),
//! which after a step back may end first.

use tokio::time::Instant;

use super::history::Event;
use super::workload::Recorder;
use crate::key::LeaseKey;
use crate::random::{HashMap, HashSet};
use crate::store::memory::{LandedWrite, MemoryDb, Op};

/// Judges, on every change of `db`, the writes that landed since (see the
/// module docs), from now until the run ends.
pub(super) fn watch(recorder: Recorder, db: MemoryDb) -> impl Future<Output = ()> {
    db.record_landed();
    let changes = db.changes();
    judge_landings(recorder, db, changes)
}

async fn judge_landings(
    recorder: Recorder,
    db: MemoryDb,
    mut changes: tokio::sync::watch::Receiver<()>,
) {
    // Per key, the server time until which a lock-delay holds it.
    let mut delayed: HashMap<LeaseKey, Instant> = HashMap::default();
    let mut fencing: HashMap<LeaseKey, Fencing> = HashMap::default();
    while changes.changed().await.is_ok() {
        for write in db.take_landed() {
            for (key, token, above) in judge_tokens(&mut fencing, &write) {
                recorder.push(Event::TokenNotAbove {
                    key: format!("locks/{key}"),
                    token,
                    above,
                });
            }
            for (key, early) in judge(&mut delayed, write) {
                recorder.push(Event::GrantedInLockDelay {
                    key: format!("locks/{key}"),
                    early,
                });
            }
        }
    }
}

/// The leases one key had so far (property 3 in the module docs).
#[derive(Default)]
struct Fencing {
    /// Every lease it had: its lease id and token.
    seen: HashSet<(uuid::Uuid, u64)>,
    /// The highest token of its exclusive leases.
    exclusive: u64,
    /// The highest token of all its leases.
    any: u64,
}

/// The leases `write` made live on a key whose token is not above what it
/// must be, each with its token and that bound; updates `fencing`. A lease
/// live again under its own lease id and token (a retry reviving it once
/// expired) may equal the bound, its own token, but no later lease may
/// have gone above it.
fn judge_tokens(
    fencing: &mut HashMap<LeaseKey, Fencing>,
    write: &LandedWrite,
) -> Vec<(LeaseKey, u64, u64)> {
    let mut breaches = Vec::new();
    for (key, before, after) in &write.changed {
        let key_fencing = fencing.entry(key.clone()).or_default();
        for lease in &after.leases {
            if before.leases.contains(lease) {
                continue;
            }
            let above = match lease.exclusive {
                true => key_fencing.any,
                false => key_fencing.exclusive,
            };
            let again = !key_fencing.seen.insert((lease.id, lease.token));
            if lease.token < above || (lease.token == above && !again) {
                breaches.push((key.clone(), lease.token, above));
            }
            key_fencing.any = key_fencing.any.max(lease.token);
            if lease.exclusive {
                key_fencing.exclusive = key_fencing.exclusive.max(lease.token);
            }
        }
    }
    breaches
}

/// The keys to which `write` gave a lease while a lock-delay held them,
/// each with how long before the delay's end it landed; updates `delayed`
/// with the delays `write` starts and ends (a delay ends at the key's
/// first grant after it, or once the server's clock has shown its end).
fn judge(
    delayed: &mut HashMap<LeaseKey, Instant>,
    write: LandedWrite,
) -> Vec<(LeaseKey, std::time::Duration)> {
    let overrides = matches!(write.op, Op::ForceRelease | Op::ReleaseOwner);
    // A force release that rewrote a key waiting for an earlier override
    // (an immediate one: docs/lock-delay.md) frees it after its own
    // lock-delay, which a step back of the server's clock may make the
    // earlier end.
    for key in &write.rewritten {
        if let Some(until) = delayed.get_mut(key) {
            *until = (*until).min(write.at + write.lock_delay);
        }
    }
    let mut breaches = Vec::new();
    for (key, before, after) in write.changed {
        // A lease of a key none held ends its delay, on time or not: a
        // handoff or a join to a live holder is no new grant (that holder's
        // was judged), and so is a grant after one. A grant is on time once
        // the server's clock has reached the delay's end, even if it lands
        // at a server time before it, after a step back of the clock (a
        // failover): what it did meanwhile (a grant, the follow-up delete
        // of a document it deemed no longer delayed) was on time.
        if before.leases.is_empty()
            && !after.leases.is_empty()
            && let Some(until) = delayed.remove(&key)
            && write.at < until
            && write.clock_reached.is_none_or(|reached| reached < until)
        {
            breaches.push((key.clone(), until - write.at));
        }
        // Its last live lease, or the minimum hold that alone held it.
        let ends_the_last = before.held() && !after.held();
        if overrides && ends_the_last && !write.lock_delay.is_zero() {
            let until = write.at + write.lock_delay;
            let held = delayed.entry(key).or_insert(until);
            *held = (*held).max(until);
        }
    }
    breaches
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use uuid::Uuid;

    use super::*;
    use crate::store::memory::{Held, LiveLease};

    /// Exclusive leases of these ids (token 1 each: the lock-delay's
    /// judge reads the ids alone).
    fn leases(ids: Vec<Uuid>) -> Held {
        let lease = |id| LiveLease {
            id,
            token: 1,
            exclusive: true,
        };
        Held {
            leases: ids.into_iter().map(lease).collect(),
            by_hold: false,
        }
    }

    /// An acquisition at `at` that made `leases` live on `key`, none before.
    fn made_live(at: Instant, key: &str, leases: Vec<LiveLease>) -> LandedWrite {
        let after = Held {
            leases,
            by_hold: false,
        };
        let mut made = write(Op::Acquire, at, vec![]);
        made.changed = vec![(LeaseKey::from(key), Held::default(), after)];
        made
    }

    fn write(op: Op, at: Instant, changed: Vec<(&str, Vec<Uuid>, Vec<Uuid>)>) -> LandedWrite {
        LandedWrite {
            op,
            lock_delay: Duration::from_secs(1),
            at,
            changed: (changed.into_iter())
                .map(|(key, before, after)| (LeaseKey::from(key), leases(before), leases(after)))
                .collect(),
            rewritten: Vec::new(),
            clock_reached: None,
        }
    }

    #[test]
    fn a_grant_within_the_delay_of_a_call_that_ended_the_last_live_lease_is_a_breach() {
        let t0 = Instant::now();
        let (a, b, c) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let mut delayed = HashMap::default();
        // Owner of `a` released by owner id while `b` is live: no delay.
        let first = write(Op::ReleaseOwner, t0, vec![("rw", vec![a, b], vec![b])]);
        assert!(judge(&mut delayed, first).is_empty());
        let joined = write(Op::Acquire, t0, vec![("rw", vec![b], vec![b, c])]);
        assert!(judge(&mut delayed, joined).is_empty(), "no delay yet");
        // The owners of `b` and `c`, one at a time: the last one delays it.
        let t1 = t0 + Duration::from_millis(10);
        let second = write(Op::ReleaseOwner, t1, vec![("rw", vec![b, c], vec![c])]);
        assert!(judge(&mut delayed, second).is_empty());
        let third = write(Op::ReleaseOwner, t1, vec![("rw", vec![c], vec![])]);
        assert!(judge(&mut delayed, third).is_empty());
        let early = t1 + Duration::from_millis(400);
        let grant = write(Op::Acquire, early, vec![("rw", vec![], vec![a])]);
        let found = judge(&mut delayed, grant);
        assert_eq!(
            found,
            vec![(LeaseKey::from("rw"), Duration::from_millis(600))]
        );
    }

    #[test]
    fn a_grant_at_the_delays_end_ends_it_whatever_the_clock_does_next() {
        let t0 = Instant::now();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut delayed = HashMap::default();
        let forced = write(Op::ForceRelease, t0, vec![("x0", vec![a], vec![])]);
        assert!(judge(&mut delayed, forced).is_empty());
        let on_time = t0 + Duration::from_secs(1);
        let grants = vec![("x0", vec![], vec![b]), ("x1", vec![], vec![a])];
        assert!(judge(&mut delayed, write(Op::Acquire, on_time, grants)).is_empty());
        // The server's clock steps back at a failover: a release and a new
        // grant land at server times before the delay's end.
        let back = t0 + Duration::from_millis(500);
        let released = write(Op::Release, back, vec![("x0", vec![b], vec![])]);
        assert!(judge(&mut delayed, released).is_empty());
        let again = write(Op::Acquire, back, vec![("x0", vec![], vec![a])]);
        assert!(judge(&mut delayed, again).is_empty());
    }

    #[test]
    fn a_grant_after_the_servers_clock_reached_the_delays_end_is_on_time() {
        let t0 = Instant::now();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut delayed = HashMap::default();
        let forced = write(Op::ReleaseOwner, t0, vec![("x1", vec![a], vec![])]);
        assert!(judge(&mut delayed, forced).is_empty());
        // The clock went past the delay's end (a failover to a member
        // ahead; the follow-up delete took the document then), and stepped
        // back before the grant landed.
        let mut grant = write(
            Op::Acquire,
            t0 + Duration::from_millis(500),
            vec![("x1", vec![], vec![b])],
        );
        grant.clock_reached = Some(t0 + Duration::from_secs(1));
        assert!(judge(&mut delayed, grant.clone()).is_empty());
        // Had it not reached it, the grant is early.
        let forced = write(Op::ReleaseOwner, t0, vec![("x1", vec![b], vec![])]);
        assert!(judge(&mut delayed, forced).is_empty());
        grant.clock_reached = Some(t0 + Duration::from_millis(999));
        let found = judge(&mut delayed, grant);
        assert_eq!(
            found,
            vec![(LeaseKey::from("x1"), Duration::from_millis(500))]
        );
    }

    #[test]
    fn a_holders_own_release_and_a_zero_lock_delay_delay_nothing() {
        let t0 = Instant::now();
        let a = Uuid::new_v4();
        let mut delayed = HashMap::default();
        let released = write(Op::Release, t0, vec![("x0", vec![a], vec![])]);
        assert!(judge(&mut delayed, released).is_empty());
        let mut forced = write(Op::ForceRelease, t0, vec![("x1", vec![a], vec![])]);
        forced.lock_delay = Duration::ZERO;
        assert!(judge(&mut delayed, forced).is_empty());
        let grant = write(
            Op::Acquire,
            t0,
            vec![("x0", vec![], vec![a]), ("x1", vec![], vec![a])],
        );
        assert!(judge(&mut delayed, grant).is_empty());
    }

    #[test]
    fn a_lease_whose_token_is_not_above_the_ones_it_follows_is_a_breach() {
        let t0 = Instant::now();
        let lease = |token, exclusive| LiveLease {
            id: Uuid::new_v4(),
            token,
            exclusive,
        };
        let (x5, s6, s7) = (lease(5, true), lease(6, false), lease(7, false));
        let mut fencing = HashMap::default();
        let mut grant = |after| judge_tokens(&mut fencing, &made_live(t0, "rw", after));
        assert!(grant(vec![x5]).is_empty());
        // Shared holders after it, in no order among themselves; one live
        // again under its own lease id and token (a retry reviving it).
        assert!(grant(vec![s7]).is_empty());
        assert!(grant(vec![s7, s6]).is_empty());
        // The exclusive lease live again after them: they went above it.
        assert_eq!(grant(vec![x5]), vec![(LeaseKey::from("rw"), 5, 7)]);
        // An exclusive lease follows every earlier one; a shared holder
        // every earlier exclusive one.
        let found = grant(vec![lease(7, true)]);
        assert_eq!(found, vec![(LeaseKey::from("rw"), 7, 7)]);
        let found = grant(vec![lease(6, false)]);
        assert_eq!(found, vec![(LeaseKey::from("rw"), 6, 7)]);
    }

    #[test]
    fn a_lease_id_given_again_with_another_token_is_judged_again() {
        let t0 = Instant::now();
        let id = Uuid::new_v4();
        let lease = |token| LiveLease {
            id,
            token,
            exclusive: true,
        };
        let mut fencing = HashMap::default();
        let mut grant = |lease| judge_tokens(&mut fencing, &made_live(t0, "x0", vec![lease]));
        assert!(grant(lease(5)).is_empty());
        // Live again with its own token, nothing above it: a retry.
        assert!(grant(lease(5)).is_empty());
        assert!(grant(lease(8)).is_empty());
        // The same lease id handed over again with its old token.
        assert_eq!(grant(lease(5)), vec![(LeaseKey::from("x0"), 5, 8)]);
    }

    #[test]
    fn a_force_release_of_a_key_held_by_its_minimum_hold_alone_delays_it() {
        let t0 = Instant::now();
        let b = Uuid::new_v4();
        let mut delayed = HashMap::default();
        let mut forced = write(Op::ForceRelease, t0, vec![]);
        let by_hold = Held {
            leases: Vec::new(),
            by_hold: true,
        };
        forced.changed = vec![(LeaseKey::from("x0"), by_hold, Held::default())];
        assert!(judge(&mut delayed, forced).is_empty());
        let early = write(
            Op::Acquire,
            t0 + Duration::from_millis(100),
            vec![("x0", vec![], vec![b])],
        );
        assert_eq!(
            judge(&mut delayed, early),
            vec![(LeaseKey::from("x0"), Duration::from_millis(900))]
        );
    }

    #[test]
    fn an_immediate_force_release_of_a_waiting_key_after_a_step_back_shortens_its_wait() {
        let t0 = Instant::now();
        let (a, b) = (Uuid::new_v4(), Uuid::new_v4());
        let mut delayed = HashMap::default();
        let ahead = t0 + Duration::from_millis(900);
        let forced = write(Op::ForceRelease, ahead, vec![("k", vec![a], vec![])]);
        assert!(judge(&mut delayed, forced).is_empty());
        // The clock steps back 900 ms; 100 ms later an immediate force
        // release rewrites the waiting key: its wait ends at 1.1 s.
        let mut again = write(Op::ForceRelease, t0 + Duration::from_millis(100), vec![]);
        again.rewritten = vec![LeaseKey::from("k")];
        assert!(judge(&mut delayed, again).is_empty());
        let mut grant = write(
            Op::Acquire,
            t0 + Duration::from_millis(1_100),
            vec![("k", vec![], vec![b])],
        );
        grant.clock_reached = Some(ahead);
        assert!(judge(&mut delayed, grant).is_empty());
    }
}
