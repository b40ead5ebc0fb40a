//! The deadlines of the twin's documents: the times at which a comparison
//! of a document with the server's now changes outcome. A step never runs
//! near one that it may read, so that the real clock, which runs between
//! the twin's operation and the mongod's, cannot make the two disagree.

use std::collections::BTreeMap;
use std::time::Duration;

use super::world::{self, World};

/// How far from a deadline a step must stay (ms), besides its own length
/// and the spread of the deadline between the two sides.
pub(super) const GUARD: i64 = 20;

/// Which operations a deadline matters to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Class {
    /// An expiry (`exp`, `hl`, `nb`, `yu`, `xw`, a holder's, a
    /// registration's, a foreign lock's, a TTL index's): every operation.
    Expiry,
    /// A token old enough for delete mode's deletes (`acq` + 1 s): the
    /// releases and deletes of a store in delete mode.
    TokenAge,
    /// `exp` less half a TTL on a key with holders: where a waiting
    /// exclusive acquisition's retry is capped (acquires).
    Retry,
    /// Half a registration window before its end, when a waiting attempt
    /// refreshes it (waiting acquires).
    Refresh,
}

/// The deadlines seen so far (twin ms), each with how far the mongod's may
/// be from it (ms: the length of the step that wrote it, at most).
#[derive(Default)]
pub(super) struct Deadlines {
    at: BTreeMap<(i64, Class), i64>,
}

impl Deadlines {
    /// Adds the deadlines of the twin's documents now; new ones spread by
    /// `spread`.
    pub fn update(&mut self, world: &World, spread: i64) {
        let now = world.twin_now();
        for at in deadlines(world) {
            self.at.entry(at).or_insert(spread);
        }
        self.at
            .retain(|(at, _), spread| *at + *spread + GUARD >= now - 10_000);
    }

    fn relevant(&self, cares: impl Fn(Class) -> bool) -> impl Iterator<Item = (i64, i64)> + '_ {
        let cares: Vec<Class> = [Class::Expiry, Class::TokenAge, Class::Retry, Class::Refresh]
            .into_iter()
            .filter(|c| cares(*c))
            .collect();
        self.at
            .iter()
            .filter(move |((_, class), _)| cares.contains(class))
            .map(|(&(at, _), &spread)| (at, spread))
    }

    /// How long from `now` until no deadline that matters is within
    /// `budget` ms of a step starting then (zero: start now).
    pub fn wait(&self, now: i64, budget: i64, cares: impl Fn(Class) -> bool) -> i64 {
        self.relevant(cares)
            .filter(|&(at, spread)| {
                at - spread - GUARD <= now + budget && at + spread + GUARD >= now
            })
            .map(|(at, spread)| at + spread + GUARD - now)
            .max()
            .unwrap_or(0)
    }

    /// Whether a deadline that matters fell within `from..=to` (twin ms)
    /// on either side.
    pub fn crossed(&self, from: i64, to: i64, cares: impl Fn(Class) -> bool) -> bool {
        self.relevant(cares)
            .any(|(at, spread)| at - spread <= to + 1 && at + spread >= from - 1)
    }

    /// How long until the earliest expiry ahead is surely past.
    pub fn next(&self, now: i64) -> Option<Duration> {
        self.relevant(|c| c == Class::Expiry)
            .map(|(at, spread)| at + spread + GUARD - now)
            .filter(|wait| *wait > 0)
            .min()
            .map(|ms| Duration::from_millis(ms as u64))
    }
}

/// The deadlines of the twin's documents now (twin ms): `exp` (also the
/// TTL index's, at the GC grace), `hl`, `nb`, `yu`, an exclusive waiter's
/// mark, each holder's `exp`, each registration's `re` and half its
/// window before (its refresh), `exp` less half of each TTL on a key with
/// holders (a waiting exclusive attempt's retry), the token's age of delete
/// mode, `ts` plus pattern 1's TTL index, and a foreign lock's expiry by its
/// rule and by the TTL indexes.
fn deadlines(world: &World) -> Vec<(i64, Class)> {
    use Class::*;
    let ms = |at| world.db.date(at).timestamp_millis();
    let rules = world.config.foreign_rules();
    let window = world::registration_window().as_millis() as i64;
    let ts_index = world::TS_EXPIRE_AFTER.as_millis() as i64;
    let grace = world::GC_GRACE.as_millis() as i64;
    let age = crate::config::DELETE_MIN_TOKEN_AGE.as_millis() as i64;
    let mut out = Vec::new();
    for key in &world.keys {
        if let Some(d) = world.db.doc(key.clone()) {
            let exp = ms(d.exp);
            out.extend([(exp, Expiry), (exp + grace, Expiry)]);
            out.push((ms(d.acquired) + age, TokenAge));
            if world.config.ts_index {
                out.push((ms(d.renewed) + ts_index, Expiry));
            }
            let dates = [d.hold_until, d.not_before, d.yield_until];
            out.extend(dates.into_iter().flatten().map(|at| (ms(at), Expiry)));
            out.extend(d.exclusive_waiter.as_ref().map(|(_, at)| (ms(*at), Expiry)));
            out.extend(d.holders.iter().map(|h| (ms(h.exp), Expiry)));
            if !d.holders.is_empty() {
                out.extend(
                    world::TTLS
                        .iter()
                        .map(|t| (exp - t.as_millis() as i64 / 2, Retry)),
                );
            }
            for w in &d.queue {
                out.extend([(ms(w.re), Expiry), (ms(w.re) - window / 2, Refresh)]);
            }
        }
        if let Some(f) = world.db.foreign(key.clone()) {
            let annotated = rules.annotate(
                &f,
                crate::store::is_our_layout(&f),
                mongodb::bson::DateTime::MIN,
            );
            out.extend(
                world::date_ms(annotated.get(crate::foreign::EXPIRY)).map(|at| (at, Expiry)),
            );
            if world.config.ts_index {
                out.extend(world::date_ms(f.get("ts")).map(|ts| (ts + ts_index, Expiry)));
            }
            out.extend(world::date_ms(f.get("ExpireAt")).map(|at| (at, Expiry)));
            out.extend(world::date_ms(f.get("exp")).map(|at| (at + grace, Expiry)));
        }
    }
    out
}
