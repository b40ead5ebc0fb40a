//! The light forms ("Light forms" in `store`, whose "Grouped" says how
//! their writes are grouped): when the actor tries one, the group commit's
//! queues, and the memory of the keys where they do not apply.
//!
//! **When.** Where the place's store has the form
//! (`StoreProfile::light_forms`):
//! - a light acquire for a plain lease without a payload, and a light
//!   handoff, on a key not contended ([`Actor::contended`]: the general
//!   form was sent for it, or a light form did not apply to it, within
//!   `Timing::contended_for`, as the spec says);
//! - a light release for an exclusive lease not deleted at once (keep
//!   mode, or a lease too young for delete mode's delete), on a key the
//!   light release's form that hands over did not miss within
//!   `Timing::contended_for` ([`Actor::light_release_missed`]). On a
//!   contended key it goes in that form, which also hands the key to a
//!   registered owner of another manager as the general release would,
//!   and which `mongod` takes longer to parse; elsewhere in the form for
//!   keys nobody waits for, whose miss makes the key contended. A lease
//!   given back, which the manager does not know it holds
//!   (`release::Holding`), also needs a key not contended, as the other
//!   forms.
//!
//! **Answers.** One the light form did not settle goes on to the general
//! form under the same lease id, which decides; after an unknown outcome
//! too, so a lease the general release no longer finds is reported lost,
//! even if the light write ended it (property 7 of docs/safety.md). The light acquire is sent and
//! answered with the other acquires (`acquire.rs`), the light release
//! with the other releases (`release.rs`).

use std::mem;

use tokio::time::Instant;

use super::command::{Place, PlacedKey, Reply};
use super::{AcquireSent, Actor};
use crate::status::ReleaseOutcome;
use crate::store::LeaseRef;
use crate::store::light_release::MOST_PER_COMMAND;

/// The light writes of one form of one place: whether a grouped call is
/// in flight, and those queued behind it.
pub(super) struct Queue<T> {
    in_flight: bool,
    queued: Vec<T>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            in_flight: false,
            queued: Vec::new(),
        }
    }
}

impl<T> Queue<T> {
    /// The batch to send now for `request`, and whether it holds the slot
    /// (`grouped`): itself alone if `alone` (a key that is not a string);
    /// itself, grouped, if nothing of its form is in flight; else nothing,
    /// and it waits.
    pub(super) fn submit(&mut self, request: T, alone: bool) -> Option<(Vec<T>, bool)> {
        if alone {
            return Some((vec![request], false));
        }
        if self.in_flight {
            self.queued.push(request);
            return None;
        }
        self.in_flight = true;
        Some((vec![request], true))
    }

    /// The grouped call in flight returned: the next batch to send, if
    /// any queued (the slot stays taken), else the slot is freed.
    pub(super) fn next(&mut self) -> Option<Vec<T>> {
        if self.queued.is_empty() {
            self.in_flight = false;
            return None;
        }
        let n = self.queued.len().min(MOST_PER_COMMAND);
        let rest = self.queued.split_off(n);
        Some(mem::replace(&mut self.queued, rest))
    }
}

/// A place's group commits of the light acquire and release.
#[derive(Default)]
pub(super) struct GroupCommit {
    pub(super) acquires: Queue<(PlacedKey, AcquireSent)>,
    pub(super) releases: Queue<PendingRelease>,
}

/// A release of one lease waiting for its light form's answer.
pub(super) struct PendingRelease {
    pub(super) key: PlacedKey,
    pub(super) lease: LeaseRef,
    pub(super) respond_to: Option<Reply<ReleaseOutcome>>,
    /// As [`Actor::send_release`]'s `follow_up`.
    pub(super) follow_up: Option<Instant>,
}

impl Actor {
    /// Whether `key` went to the general form lately (see the module docs).
    pub(super) fn is_contended(&self, key: &PlacedKey) -> bool {
        self.contended
            .get(key)
            .is_some_and(|at| at.elapsed() < self.timing.contended_for)
    }

    /// Remembers that `key` went to the general form now.
    pub(super) fn note_contended(&mut self, key: &PlacedKey) {
        self.contended.insert(key.clone(), Instant::now());
    }

    /// Whether the light release's form that hands over did not apply to
    /// `key` lately (see the module docs).
    pub(super) fn light_release_missed(&self, key: &PlacedKey) -> bool {
        self.light_release_missed
            .get(key)
            .is_some_and(|at| at.elapsed() < self.timing.contended_for)
    }

    /// Remembers that the light release's form that hands over did not
    /// apply to `key` now: the key goes to the general form, for releases
    /// and the other forms alike.
    pub(super) fn note_light_release_missed(&mut self, key: &PlacedKey) {
        self.light_release_missed
            .insert(key.clone(), Instant::now());
        self.note_contended(key);
    }

    /// Forgets the keys contended, or missed by a light release, longer
    /// ago than `Timing::contended_for` (at each heartbeat).
    pub(super) fn prune_contended(&mut self) {
        let contended_for = self.timing.contended_for;
        self.contended.retain(|_, at| at.elapsed() < contended_for);
        self.light_release_missed
            .retain(|_, at| at.elapsed() < contended_for);
    }

    /// The group commits of `place`.
    pub(super) fn group(&mut self, place: Place) -> &mut GroupCommit {
        &mut self.places[usize::from(place.0)].group_commit
    }
}
