//! The private actor: one task per manager that owns all lease state,
//! shaped after Alice Ryhl's "Actors with Tokio" and the mongodb driver's
//! connection-pool worker. One state struct, [`Actor`], spread over one
//! `impl Actor` block per concept (ARCHITECTURE.md, `src/actor/`, lists
//! them and states the invariant that it never awaits a round trip or
//! caller code inline); this file holds the state, the `select!` loop, the
//! dispatch of commands, events and timers, and [`Actor::spawn_store`].

mod acquire;
mod binding;
pub(crate) mod command;
mod documents;
mod duration;
mod group_commit;
mod handoff;
mod key_state;
mod lease_group;
mod loss;
pub(crate) mod mailbox;
mod observers;
mod payload;
mod permits;
mod queue;
mod reentry;
mod release;
mod renewal;
mod revocation;
mod shutdown;
mod telemetry;
mod write_stream;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};

use crate::random::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::time::DelayQueue;
use uuid::Uuid;

use mongodb::bson::Document;

use crate::config::Timing;
use crate::error::Result;
use crate::health::HealthBoard;
use crate::key::LeaseKey;
use crate::kind::LeaseShape;
use crate::status::LossReason;
use crate::store::{LeaseRef, Store, StoreProfile};
use command::{Command, Place, PlacedKey, Reply, Waiter};
use key_state::{Attempt, Held, KeyState};
use renewal::sleep_until_deadline;
use shutdown::Closing;
use write_stream::{WriteStream, next_announcement};

enum Timer {
    /// Time for the key's next acquire attempt.
    Retry(PlacedKey),
    /// Retry a renewal batch that failed.
    RenewRetry(renewal::Batch),
}

/// What an acquire attempt asked the store for.
struct AcquireSent {
    lease_id: Uuid,
    /// When it was sent (local clock).
    sent_at: Instant,
    /// The TTL it wrote.
    ttl: Duration,
    /// The kind and minimum hold it asked for.
    shape: LeaseShape,
    /// It was a waiting attempt (someone other than a try waits).
    waiting: bool,
    /// The payload it wrote (`Acquire::payload`).
    payload: Option<Document>,
    /// For a lease held at most its TTL (`Waiter::at_most`).
    at_most: bool,
}

/// The result of a store operation, back in the actor's loop: the call of
/// its handler ([`Actor::spawn_store`]).
type Event = Box<dyn FnOnce(&mut Actor) + Send>;

/// One store of the actor: the lock collection ([`Place::LOCKS`]) or a user
/// collection of in-document leases.
struct PlaceState {
    store: Arc<dyn Store>,
    /// The store's fixed facts, read once.
    profile: StoreProfile,
    /// Writes by any owner to this place's documents
    /// (`Store::watch_releases`), open only while something here needs
    /// prompt news of another owner's write (`write_stream.rs`): a release
    /// wakes waiters at once instead of at their next poll, and a held lease
    /// written by someone else is checked at once.
    write_stream: WriteStream,
    /// Its light acquires and releases in flight and queued (`group_commit`).
    group_commit: group_commit::GroupCommit,
}

impl PlaceState {
    fn new(store: Arc<dyn Store>) -> Self {
        PlaceState {
            profile: store.profile(),
            store,
            write_stream: WriteStream::Closed,
            group_commit: Default::default(),
        }
    }
}

pub(crate) struct Actor {
    /// The stores, indexed by [`Place`]: the lock collection first, then
    /// each user collection of in-document leases, as opened.
    places: Vec<PlaceState>,
    /// The place whose stream of writes is polled first next time (the
    /// one after the last that delivered), so that each gets its turn.
    stream_turn: usize,
    owner_id: Arc<str>,
    timing: Timing,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Given to each `Lease` so that it can release itself; weak, so the
    /// actor stops once every handle and lease is gone.
    sender: mpsc::WeakUnboundedSender<Command>,
    keys: HashMap<PlacedKey, Box<KeyState>>,
    /// Acquires, releases, payload writes and reads in flight
    /// ([`Actor::spawn_store`]); shutdown waits for them.
    tasks: FuturesUnordered<BoxFuture<'static, Event>>,
    /// Renewals in flight; shutdown drops them (a late renewal cannot revive a
    /// released lease: it matches on the lease id, which release removes).
    renewals: FuturesUnordered<BoxFuture<'static, Event>>,
    /// Renewal batches waiting for one of `renewals` to be answered (at
    /// most `renewal::RENEWALS_IN_FLIGHT` in flight).
    renewals_waiting: VecDeque<renewal::Batch>,
    /// Retries; few at a time (one per waiting key, one per failed renewal batch).
    timers: DelayQueue<Timer>,
    /// Local deadlines of held leases: a min-heap with one entry per lease,
    /// `(deadline, key, lease id)`, checked lazily against `Held::deadline`
    /// (renewals move that field only; resetting one timer per lease per
    /// heartbeat would cost O(n) timer operations per tick).
    deadlines: BinaryHeap<Reverse<(Instant, PlacedKey, Uuid)>>,
    heartbeat: Interval,
    closing: Option<Closing>,
    /// The control channel of each observed key's hub (`observers::run_hub`).
    observers: HashMap<LeaseKey, mpsc::UnboundedSender<observers::Subscriber>>,
    /// Stops every hub when the manager stops.
    stop_observers: CancellationToken,
    /// What [`LeaseManager::health`](crate::LeaseManager::health) reads.
    health: Arc<HealthBoard>,
    /// A heartbeat's renewals are in flight: the health board is published
    /// again once they are all answered.
    health_due: bool,
    /// Keys forgotten while registered in their queue of waiting owners:
    /// the registered lease id, and when the registration lapses (see
    /// `queue`).
    gave_up: HashMap<PlacedKey, (Uuid, Instant)>,
    /// Keys the general form was sent for lately, or a light form did not
    /// apply to, with when (see `group_commit`); pruned at each heartbeat.
    contended: HashMap<PlacedKey, Instant>,
    /// Keys the light release's form that hands over did not apply to
    /// lately, with when (see `group_commit`); pruned at each heartbeat.
    light_release_missed: HashMap<PlacedKey, Instant>,
    /// The held leases bound to more than themselves (a named holder,
    /// re-entries, a group), by lease id; none for a lease bound to nothing
    /// else.
    bindings: HashMap<Uuid, binding::Binding>,
}

/// The actor loop's `tokio::select!`. tokio starts at a random branch, from
/// a generator no caller can seed; a seeded simulation (`sim` feature) needs
/// the same order on every run, so while one runs the branches are tried in
/// the order written (`biased`). Time stands still while tasks are runnable
/// under the simulation's paused clock, so the order changes no instant.
#[cfg(feature = "sim")]
macro_rules! actor_select {
    ($($branches:tt)*) => {
        if crate::random::is_seeded() {
            tokio::select! { biased; $($branches)* }
        } else {
            tokio::select! { $($branches)* }
        }
    };
}

/// The actor loop's `tokio::select!` (see the `sim` build's).
#[cfg(not(feature = "sim"))]
macro_rules! actor_select {
    ($($branches:tt)*) => {
        tokio::select! { $($branches)* }
    };
}

impl Actor {
    pub(crate) fn new(
        store: Arc<dyn Store>,
        owner_id: Arc<str>,
        timing: Timing,
        commands: mpsc::UnboundedReceiver<Command>,
        sender: mpsc::WeakUnboundedSender<Command>,
    ) -> Self {
        let mut heartbeat = tokio::time::interval_at(
            Instant::now() + timing.heartbeat_interval,
            timing.heartbeat_interval,
        );
        heartbeat.set_missed_tick_behavior(MissedTickBehavior::Delay);
        Actor {
            places: vec![PlaceState::new(store)],
            stream_turn: 0,
            owner_id,
            timing,
            commands,
            sender,
            keys: HashMap::default(),
            tasks: FuturesUnordered::new(),
            renewals: FuturesUnordered::new(),
            renewals_waiting: VecDeque::new(),
            timers: DelayQueue::new(),
            deadlines: BinaryHeap::new(),
            heartbeat,
            closing: None,
            observers: HashMap::default(),
            stop_observers: CancellationToken::new(),
            health: Arc::default(),
            health_due: false,
            gave_up: HashMap::default(),
            contended: HashMap::default(),
            light_release_missed: HashMap::default(),
            bindings: HashMap::default(),
        }
    }

    /// What the manager's handles read for [`LeaseManager::health`](crate::LeaseManager::health).
    pub(crate) fn health_board(&self) -> Arc<HealthBoard> {
        self.health.clone()
    }

    pub(crate) async fn run(mut self) {
        while self.closing.is_none() || !self.tasks.is_empty() {
            let open = self.closing.is_none();
            actor_select! {
                command = self.commands.recv(), if open => match command {
                    Some(command) => self.handle_command(command),
                    None => self.begin_shutdown(None),
                },
                Some(event) = self.tasks.next(), if !self.tasks.is_empty() => event(&mut self),
                Some(event) = self.renewals.next(), if open && !self.renewals.is_empty() => {
                    event(&mut self)
                }
                Some(expired) = self.timers.next(), if open && !self.timers.is_empty() => {
                    self.handle_timer(expired.into_inner())
                }
                _ = sleep_until_deadline(self.deadlines.peek()), if open => self.on_deadline_due(),
                _ = self.heartbeat.tick(), if open => {
                    self.publish_health(true);
                    self.renew_all();
                    self.health_due = true;
                    self.prune_gave_up();
                    self.close_write_stream_if_unneeded();
                    self.poll_revocations();
                    self.prune_contended();
                }
                (place, event) = next_announcement(&mut self.places, self.stream_turn), if open => {
                    self.on_announcement(place, event)
                }
            }
        }
        self.stop_observers.cancel();
        self.publish_health(true);
        self.answer_shutdown();
        tracing::debug!(owner_id = %self.owner_id, "lease manager stopped");
    }

    fn handle_command(&mut self, command: Command) {
        match command {
            Command::Acquire { key, waiter } => self.on_acquire(key, waiter),
            Command::CancelWaiter { key, waiter } => self.on_cancel_waiter(&key, waiter),
            Command::Release {
                key,
                lease_id,
                respond_to,
            } => self.on_release(key, lease_id, respond_to),
            Command::ReleaseAll { respond_to } => self.on_release_all(respond_to),
            Command::Shutdown { respond_to } => self.begin_shutdown(Some(respond_to)),
            Command::Inspect { key, respond_to } => {
                self.answer(self.store(key.place).inspect(key.key), respond_to)
            }
            Command::ForceReleased {
                key,
                was,
                respond_to,
            } => self.on_force_released(key, was, respond_to),
            Command::SetPermits {
                key,
                permits,
                respond_to,
            } => self.on_set_permits(key, permits, respond_to),
            Command::SetPayload {
                key,
                lease_id,
                payload,
                respond_to,
            } => self.on_set_payload(key, lease_id, payload, respond_to),
            Command::Observe { key, respond_to } => self.on_observe(key, respond_to),
            Command::SetTtl {
                key,
                lease_id,
                ttl,
                respond_to,
            } => self.on_set_ttl(key, lease_id, ttl, respond_to),
            Command::CheckHeld { key, lease_id } => self.on_check_held(key, lease_id),
            Command::OpenDocuments {
                collection,
                field,
                lock_id,
                respond_to,
            } => self.on_open_documents(&collection, &field, lock_id, respond_to),
            Command::WriteDocument {
                key,
                lease_id,
                write,
                respond_to,
            } => self.on_write_document(key, lease_id, write, respond_to),
            Command::Reenter { key, lease_id } => self.on_reenter(&key, lease_id),
            Command::BindGroup {
                members,
                respond_to,
            } => self.on_bind_group(members, respond_to),
        }
    }

    fn handle_timer(&mut self, timer: Timer) {
        match timer {
            Timer::Retry(key) => self.on_retry_due(&key),
            Timer::RenewRetry(batch) => self.on_renewal_retry_due(batch),
        }
    }

    /// Runs a read in `tasks`; its task answers the caller itself.
    fn answer<T: Send + 'static>(
        &mut self,
        read: BoxFuture<'static, Result<T>>,
        respond_to: Reply<T>,
    ) {
        self.spawn_store(read, |_, result| {
            let _ = respond_to.send(result);
        });
    }

    /// Runs a store operation in [`Actor::tasks`]; `handler` is called with
    /// its output when it completes. Renewal batches do not come here but
    /// go into [`Actor::renewals`], which shutdown drops.
    fn spawn_store<T: Send + 'static>(
        &mut self,
        operation: BoxFuture<'static, T>,
        handler: impl FnOnce(&mut Actor, T) + Send + 'static,
    ) {
        self.tasks.push(
            async move {
                let output = operation.await;
                Box::new(move |actor: &mut Actor| handler(actor, output)) as Event
            }
            .boxed(),
        );
    }

    /// The store of `place`.
    fn store(&self, place: Place) -> &Arc<dyn Store> {
        &self.places[usize::from(place.0)].store
    }

    /// The fixed facts of the store of `place`.
    fn profile(&self, place: Place) -> &StoreProfile {
        &self.places[usize::from(place.0)].profile
    }

    fn held_lease(&self, key: &PlacedKey, lease_id: Uuid) -> Option<&Held> {
        self.keys.get(key)?.holder(lease_id)
    }

    /// Removes the key's held lease `lease_id`, records why it ends and
    /// fires its token (its deadline heap entry is dropped when it comes due).
    fn take_held(&mut self, key: &PlacedKey, lease_id: Uuid, reason: LossReason) -> Option<Held> {
        let state = self.keys.get_mut(key)?;
        let index = state.holders.iter().position(|h| h.lease_id == lease_id)?;
        let held = state.holders.remove(index);
        telemetry::lease_ended(&self.health, key, &held, &reason);
        held.state.lose(reason.clone());
        let group = self.bindings.remove(&lease_id).and_then(|b| b.group);
        if let Some(group) = group {
            self.end_group(&group, key, &reason);
        }
        Some(held)
    }

    /// Takes every held lease (as `take_held`, for `reason`) and counts a
    /// release in flight for each; returns their keys, once per lease.
    fn take_all_held(&mut self, reason: LossReason) -> Vec<PlacedKey> {
        // Every lease ends on its own: no group ends another.
        self.bindings.clear();
        let mut keys = Vec::new();
        for (key, state) in &mut self.keys {
            for held in state.holders.drain(..) {
                telemetry::lease_ended(&self.health, key, &held, &reason);
                held.state.lose(reason.clone());
                state.releases_in_flight += 1;
                keys.push(key.clone());
            }
        }
        keys
    }

    /// Every held lease, by place.
    fn held_by_place(&self) -> BTreeMap<Place, Vec<LeaseRef>> {
        let mut by_place: BTreeMap<Place, Vec<LeaseRef>> = BTreeMap::new();
        for (key, state) in &self.keys {
            let leases = state.holders.iter().map(|held| held.lease_ref(&key.key));
            by_place.entry(key.place).or_default().extend(leases);
        }
        by_place
    }

    fn forget_if_idle(&mut self, key: &PlacedKey) {
        if self.keys.get(key).is_some_and(|state| state.is_idle()) {
            let handed = self.remember_registration(key);
            self.keys.remove(key);
            if let Some(lease_id) = handed {
                // Handed to a registration nobody waits on any more.
                self.give_back(key, lease_id, crate::kind::LeaseKind::Exclusive);
            }
        }
    }
}

#[cfg(test)]
mod tests;
