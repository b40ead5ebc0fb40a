//! The actor's one change stream of writes to lock documents
//! (`PlaceState::write_stream`, [`Store::watch_releases`](crate::store::Store::watch_releases)):
//! when it is open, paused, read and closed, and what it selects, is
//! ARCHITECTURE.md's invariant "At most one change stream of writes per
//! place"; a paused stream's cost is docs/mongodb-behaviour.md, B33.
//!
//! A reopened stream also checks every lease held in the place (one
//! renewal batch); a first open does not (the leases it covers were
//! checked by their acquisition or their last renewal, and a write since
//! is left to the heartbeat: a check would be one more write on every
//! first open, which a user's transaction on an in-document lease would
//! conflict with).

use std::time::Duration;

use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use tokio::time::Instant;

use super::command::{Place, PlacedKey};
use super::renewal::{ByTtl, add_renewal};
use super::{Actor, Attempt, KeyState, PlaceState};
use crate::error::Result;
use crate::random::HashSet;
use crate::store::{Announced, Announcement, KeyWrite};

/// The state of the stream of writes of one place (the lock collection, or
/// a user collection of in-document leases).
pub(super) enum WriteStream {
    /// Not open: nothing needs it (see the module docs).
    Closed,
    /// Open (or opening): every waiting key is retried once the stream
    /// reports itself open, since writes before that were not announced.
    Open {
        stream: BoxStream<'static, Result<Announcement>>,
        /// Reopened after a failure: writes may have been missed meanwhile,
        /// so every held lease is checked once the stream is open again.
        recheck: bool,
        /// Since when the actor has not read the stream, if it is paused
        /// (`None`: it reads it). Paused while nothing here needs it: the
        /// server runs a change stream only while a `getMore` of it waits
        /// (B33), so a paused one costs it nothing per write once its last
        /// `getMore` has answered, and resumes where it stopped, announcing
        /// the writes made meanwhile (late, none missed), with no retry of
        /// the waiting keys. The heartbeat closes one paused for a
        /// heartbeat interval or more.
        paused_at: Option<Instant>,
    },
    /// It failed; reopen no earlier than this (polling still works meanwhile).
    Failed { retry_at: Instant },
    /// The deployment has no change streams (a standalone server): poll only.
    Unsupported,
}

/// Longest random delay before a waiter woken by a release tries again.
pub(super) const RELEASE_WAKE_JITTER: Duration = Duration::from_millis(5);

/// How long a failed release stream stays closed before it is reopened.
const WRITE_STREAM_RETRY: Duration = Duration::from_secs(5);

/// Most announcements handled in one go (those already delivered), so that
/// a burst of writes is checked in few renewal commands without starving
/// the actor's other event sources.
const ANNOUNCEMENTS_PER_TURN: usize = 1024;

impl Actor {
    /// Opens the stream of writes of `place` if it is not open (or failed
    /// long enough ago), or resumes reading it if it is paused; once open,
    /// `Actor::on_opened` catches up (see the module docs).
    pub(super) fn open_write_stream(&mut self, place: Place) {
        let state = &mut self.places[usize::from(place.0)];
        let recheck = match &mut state.write_stream {
            WriteStream::Open { paused_at, .. } => {
                *paused_at = None;
                return;
            }
            WriteStream::Closed => false,
            WriteStream::Failed { retry_at } if Instant::now() >= *retry_at => {
                crate::telemetry::change_stream_restarted(place != Place::LOCKS);
                true
            }
            WriteStream::Failed { .. } | WriteStream::Unsupported => return,
        };
        // A waiter needs only the writes that free its keys or hand them to
        // this owner; held leases need every write that may take them.
        let announced = if self.timing.watch_held_leases {
            Announced::Writes
        } else {
            Announced::Waits
        };
        state.write_stream = WriteStream::Open {
            stream: state.store.watch_releases(announced),
            recheck,
            paused_at: None,
        };
    }

    /// Heartbeat: closes each place's stream once nothing there needs it
    /// and it was not paused lately (see the module docs), resumes a
    /// paused one that is needed, and reopens a failed one that is still
    /// needed.
    /// A key whose attempt is in flight while callers wait keeps an open
    /// stream open (it may be contended) but opens none (most attempts are
    /// not). One pass over the keys, whatever the number of places.
    pub(super) fn close_write_stream_if_unneeded(&mut self) {
        let mut needed = vec![false; self.places.len()];
        let mut kept = vec![false; self.places.len()];
        for (key, state) in &self.keys {
            let index = usize::from(key.place.0);
            match self.watch_need(state) {
                WatchNeed::Open => needed[index] = true,
                WatchNeed::KeepOpen => kept[index] = true,
                WatchNeed::None => {}
            }
        }
        // A registration nobody waits for any more: a handoff to it is
        // given back on the event.
        for key in self.gave_up.keys() {
            needed[usize::from(key.place.0)] = true;
        }
        // A stream paused lately may be needed again soon (a key that
        // changes hands fast, its waiters far behind): it stays open,
        // costing the server nothing per write, until a heartbeat finds it
        // paused for an interval or more.
        let paused_lately = Instant::now().checked_sub(self.timing.heartbeat_interval);
        for (index, (needed, kept)) in needed.into_iter().zip(kept).enumerate() {
            if needed {
                self.open_write_stream(Place(index as u16));
            } else if !kept
                && let WriteStream::Open { paused_at, .. } = self.places[index].write_stream
                && paused_at.is_none_or(|at| paused_lately.is_some_and(|lately| at <= lately))
            {
                self.places[index].write_stream = WriteStream::Closed;
            }
        }
    }

    /// Pauses the stream of `place` if nothing there needs it now (see the
    /// module docs): called when an attempt finds its key quiet
    /// (`Attempt::Scheduled::far_behind`) and when an event hands a key to this
    /// owner, so that a manager waiting behind a full queue or a quiet one,
    /// or holding what it waited for, costs the server nothing per write
    /// from then on rather than from the next heartbeat. Scans the keys
    /// only while the stream is read, and stops at the first key that
    /// needs it.
    pub(super) fn pause_write_stream_if_unneeded(&mut self, place: Place) {
        let index = usize::from(place.0);
        if !matches!(
            self.places[index].write_stream,
            WriteStream::Open {
                paused_at: None,
                ..
            }
        ) || self.gave_up.keys().any(|key| key.place == place)
            || self
                .keys
                .iter()
                .any(|(key, state)| key.place == place && self.watch_need(state) != WatchNeed::None)
        {
            return;
        }
        tracing::trace!(?place, "nothing waits on the stream of writes: pausing it");
        if let WriteStream::Open { paused_at, .. } = &mut self.places[index].write_stream {
            *paused_at = Some(Instant::now());
        }
    }

    /// What `state` asks of its place's stream (see the module docs).
    fn watch_need(&self, state: &KeyState) -> WatchNeed {
        if self.timing.watch_held_leases && !state.holders.is_empty() {
            return WatchNeed::Open;
        }
        if state.waiters.is_empty() {
            return WatchNeed::None;
        }
        match state.attempt {
            // Behind others in a quiet queue, or a full one: its attempts
            // tell when it may be next (see the module docs).
            Attempt::Scheduled {
                far_behind: true, ..
            } => WatchNeed::None,
            Attempt::Scheduled { .. } => WatchNeed::Open,
            // It may be contended: an open stream stays open, but none
            // opens for it.
            Attempt::InFlight(_) => WatchNeed::KeepOpen,
            Attempt::Idle => WatchNeed::None,
        }
    }

    /// Announcements arrived: the first is `event`, the others those already
    /// delivered behind it. Wakes the waiters of released keys, and checks
    /// at once, in one renewal per batch, the held leases that a write may
    /// have taken away.
    pub(super) fn on_announcement(&mut self, place: Place, event: Option<Result<Announcement>>) {
        let index = usize::from(place.0);
        self.stream_turn = index + 1;
        let mut suspects = HashSet::default();
        let mut next = Some(event);
        let mut handled = 0;
        while let Some(event) = next.take() {
            match event {
                Some(Ok(Announcement::Opened)) => self.on_opened(place, &mut suspects),
                Some(Ok(Announcement::Write(write))) => {
                    if self.on_write(place, write, &mut suspects) {
                        // A key handed to this owner: perhaps the last
                        // thing that needed the stream.
                        self.pause_write_stream_if_unneeded(place);
                    }
                }
                Some(Ok(Announcement::RevocationRequested { key, by })) => {
                    self.on_revoked(place, key, &by)
                }
                Some(Err(error)) if !error.is_transient() => {
                    // Typically a standalone server (no change streams, code 40573).
                    tracing::debug!(%error, "no change stream of writes; waiters poll");
                    self.places[index].write_stream = WriteStream::Unsupported;
                }
                // It failed (transiently) or ended.
                failed => {
                    if let Some(Err(error)) = failed {
                        tracing::debug!(%error, "stream of writes failed; reopening later");
                    }
                    self.places[index].write_stream = WriteStream::Failed {
                        retry_at: Instant::now() + WRITE_STREAM_RETRY,
                    };
                }
            }
            handled += 1;
            if let WriteStream::Open {
                stream,
                paused_at: None,
                ..
            } = &mut self.places[index].write_stream
                && handled < ANNOUNCEMENTS_PER_TURN
            {
                next = stream.next().now_or_never();
            }
        }
        self.check_held(suspects);
    }

    /// The stream of `place` is open: writes before this instant were not
    /// announced, so every key there that waits for another owner retries
    /// now (with up to [`RELEASE_WAKE_JITTER`] of jitter, as on a release),
    /// and, if the stream was reopened after a failure, every lease held
    /// there becomes a suspect.
    fn on_opened(&mut self, place: Place, suspects: &mut HashSet<PlacedKey>) {
        let recheck = match &mut self.places[usize::from(place.0)].write_stream {
            WriteStream::Open { recheck, .. } => std::mem::take(recheck),
            _ => false,
        };
        tracing::debug!(recheck, "stream of writes open: retrying waiting keys");
        self.read_revocations(place);
        for (key, state) in &mut self.keys {
            if key.place != place {
                continue;
            }
            if recheck && !state.holders.is_empty() {
                suspects.insert(key.clone());
            }
            match &mut state.attempt {
                Attempt::Scheduled { timer, .. } if !state.waiters.is_empty() => {
                    self.timers
                        .reset(timer, wake_jitter(self.timing.retry_initial));
                }
                // It may have read the key before a write this stream missed.
                Attempt::InFlight(meanwhile) => meanwhile.freed = true,
                _ => {}
            }
        }
    }

    /// One write to `write.key`: a held lease that the write may have taken
    /// away becomes a suspect, and so does the lease of an acquisition in
    /// flight, once granted (`Meanwhile::may_take`); if the write freed the key and local callers
    /// wait for it, they try again now, with up to [`RELEASE_WAKE_JITTER`]
    /// of jitter so that waiters in several processes do not all arrive in
    /// the same instant. Writes to other keys are ignored. Returns whether
    /// the write handed a key to this owner ([`Actor::on_handoff`]).
    fn on_write(
        &mut self,
        place: Place,
        write: KeyWrite,
        suspects: &mut HashSet<PlacedKey>,
    ) -> bool {
        let key = PlacedKey {
            place,
            key: write.key.clone(),
        };
        if self.on_handoff(&key, &write) {
            return true;
        }
        let Some(state) = self.keys.get_mut(&key) else {
            return false;
        };
        if state
            .holders
            .iter()
            .any(|held| !write.keeps(held.lease_id, &self.owner_id))
        {
            suspects.insert(key.clone());
        }
        if let Attempt::InFlight(meanwhile) = &mut state.attempt
            && !write.keeps(state.next_lease_id, &self.owner_id)
        {
            meanwhile.may_take = true;
        }
        if !write.freed {
            return false;
        }
        match &mut state.attempt {
            Attempt::Scheduled { timer, .. } => {
                tracing::trace!(%key, "released elsewhere: retrying now");
                self.timers
                    .reset(timer, wake_jitter(self.timing.retry_initial));
            }
            // The attempt may have read the key before this write.
            Attempt::InFlight(meanwhile) => meanwhile.freed = true,
            Attempt::Idle => {}
        }
        false
    }

    /// [`Command::CheckHeld`](super::command::Command::CheckHeld): the
    /// lease `lease_id` of `key` is checked now, if still held.
    pub(super) fn on_check_held(&mut self, key: PlacedKey, lease_id: uuid::Uuid) {
        if self.held_lease(&key, lease_id).is_some() {
            self.check_held([key].into_iter().collect());
        }
    }

    /// Renews the held leases of `keys` now, in batches: a lease that is no
    /// longer held is lost exactly as when a heartbeat's renewal finds it
    /// gone (`Actor::on_renewed`).
    pub(super) fn check_held(&mut self, keys: HashSet<PlacedKey>) {
        let mut by_ttl = ByTtl::new();
        for key in keys {
            if let Some(state) = self.keys.get_mut(&key) {
                for held in &mut state.holders {
                    add_renewal(&mut by_ttl, &key, held);
                }
            }
        }
        let leases: usize = by_ttl.values().map(Vec::len).sum();
        if leases == 0 {
            return;
        }
        tracing::debug!(leases, "held leases written by someone: checking now");
        self.spawn_renewals(by_ttl);
    }
}

/// A random delay of at most [`RELEASE_WAKE_JITTER`] (and at most
/// `retry_initial`) before a woken waiter tries again, so that waiters in
/// several processes do not all arrive in the same instant.
pub(super) fn wake_jitter(retry_initial: Duration) -> Duration {
    crate::random::random_range(Duration::ZERO..=RELEASE_WAKE_JITTER.min(retry_initial))
}

/// The next item of any place's open stream of writes, with its place, or
/// never if none is open. The places are polled from `first` on, round
/// robin, so that a busy place cannot starve the ones after it.
pub(super) async fn next_announcement(
    places: &mut [PlaceState],
    first: usize,
) -> (Place, Option<Result<Announcement>>) {
    std::future::poll_fn(|cx| {
        let count = places.len();
        for index in (0..count).map(|i| (first + i) % count) {
            let place = &mut places[index];
            if let WriteStream::Open {
                stream,
                paused_at: None,
                ..
            } = &mut place.write_stream
                && let std::task::Poll::Ready(item) = stream.poll_next_unpin(cx)
            {
                return std::task::Poll::Ready((Place(index as u16), item));
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// What one key asks of its place's stream of writes
/// ([`Actor::close_write_stream_if_unneeded`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WatchNeed {
    /// Open it, or keep it open.
    Open,
    /// Keep an open one open, but open none.
    KeepOpen,
    None,
}
