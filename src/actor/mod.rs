//! The private actor: one task per manager that owns all lease state.
//!
//! It holds the store, the held leases with their local deadlines, a FIFO
//! queue of waiters per key, and its timers, and runs one `select!` loop over
//! its event sources: commands from the handles, results of store operations
//! in flight (acquires and releases; renewals apart, so shutdown can drop
//! them), expired timers (local deadlines and retries), the heartbeat, and,
//! while some key waits for another owner, a change stream of releases that
//! wakes that key's waiters at once instead of at their next poll.
//! Each event has one method. The actor never awaits a store operation inline:
//! operations run concurrently in a [`FuturesUnordered`] and their results
//! come back as [`Event`]s, so a slow round trip never delays another command.
//! It never awaits caller code either: replies go through `oneshot` channels.
//!
//! Shape after Alice Ryhl's "Actors with Tokio" and the mongodb driver's
//! connection-pool worker.

pub(crate) mod command;
pub(crate) mod mailbox;
mod observers;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::Arc;

use futures::future::BoxFuture;
use futures::stream::{BoxStream, FuturesUnordered};
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::time::{Instant, Interval, MissedTickBehavior};
use tokio_util::sync::CancellationToken;
use tokio_util::time::{DelayQueue, delay_queue};
use uuid::Uuid;

use crate::backoff::retry_delay;
use crate::config::Timing;
use crate::error::{Error, Result};
use crate::lease::{Lease, LeaseInfo, LeaseObserver, ReleaseOutcome};
use crate::store::{AcquireOutcome, LeaseRef, Store};
use command::{AcquireMode, Command, Reply, WaiterId};
use mailbox::Mailbox;
use mongodb::bson::Document;

/// A local caller waiting in an `acquire` or `try_acquire`.
struct Waiter {
    id: WaiterId,
    mode: AcquireMode,
    respond_to: Reply<Option<Lease>>,
}

/// A lease this manager holds.
struct Held {
    lease_id: Uuid,
    token: u64,
    cancel: CancellationToken,
    /// Start of the last confirmed renewal (or of the acquire) + ttl − safety margin.
    deadline: Instant,
    /// A renewal of this lease is in flight or scheduled for retry.
    renewing: bool,
}

/// The state of a key's one retry loop against MongoDB.
#[derive(Clone, Copy)]
enum Attempt {
    Idle,
    InFlight,
    Scheduled(delay_queue::Key),
}

/// Everything the actor knows about one key. Removed when idle.
struct KeyState {
    held: Option<Held>,
    waiters: VecDeque<Waiter>,
    attempt: Attempt,
    /// Releases of this key in flight; no acquire attempt starts meanwhile.
    releases_in_flight: u32,
    /// Lease id of the next acquisition, kept across retries so that an
    /// attempt whose outcome was unknown is recognised as ours on the next try.
    next_lease_id: Uuid,
    /// Attempts since the last acquisition (the backoff exponent).
    failures: u32,
}

impl KeyState {
    fn new() -> Self {
        KeyState {
            held: None,
            waiters: VecDeque::new(),
            attempt: Attempt::Idle,
            releases_in_flight: 0,
            next_lease_id: Uuid::new_v4(),
            failures: 0,
        }
    }

    fn is_idle(&self) -> bool {
        self.held.is_none()
            && self.waiters.is_empty()
            && matches!(self.attempt, Attempt::Idle)
            && self.releases_in_flight == 0
    }

    /// Drops waiters whose acquire future is gone.
    fn prune_waiters(&mut self) {
        self.waiters.retain(|w| !w.respond_to.is_closed());
    }
}

enum Timer {
    /// Time for the key's next acquire attempt.
    Retry(String),
    /// Retry a renewal batch that failed.
    RenewRetry { leases: Vec<LeaseRef>, attempt: u32 },
}

/// The result of a store operation, back in the actor's loop.
enum Event {
    Acquired {
        key: String,
        lease_id: Uuid,
        sent_at: Instant,
        result: Result<AcquireOutcome>,
    },
    Renewed {
        leases: Vec<LeaseRef>,
        sent_at: Instant,
        attempt: u32,
        result: Result<Vec<String>>,
    },
    Released {
        key: String,
        respond_to: Option<Reply<ReleaseOutcome>>,
        result: Result<u64>,
    },
    ReleasedMany {
        keys: Vec<String>,
        respond_to: Option<Reply<u64>>,
        result: Result<u64>,
    },
    ReleasedAll {
        keys: Vec<String>,
        respond_to: Reply<u64>,
        result: Result<u64>,
    },
    /// A read (inspect, list) was answered by its task; nothing to update.
    Answered,
    ForceReleased {
        key: String,
        respond_to: Reply<Option<LeaseInfo>>,
        result: Result<Option<LeaseInfo>>,
    },
    PayloadSet {
        key: String,
        lease_id: Uuid,
        respond_to: Reply<()>,
        result: Result<bool>,
    },
}

/// Set once shutdown has begun.
struct Closing {
    responders: Vec<Reply<()>>,
    error: Option<Error>,
}

pub(crate) struct Actor {
    store: Arc<dyn Store>,
    owner_id: Arc<str>,
    timing: Timing,
    commands: mpsc::UnboundedReceiver<Command>,
    /// Given to each `Lease` so that it can release itself; weak, so the
    /// actor stops once every handle and lease is gone.
    sender: mpsc::WeakUnboundedSender<Command>,
    keys: HashMap<String, KeyState>,
    /// Acquires and releases in flight; shutdown waits for them.
    tasks: FuturesUnordered<BoxFuture<'static, Event>>,
    /// Renewals in flight; shutdown drops them (a late renewal cannot revive a
    /// released lease: it matches on the lease id, which release removes).
    renewals: FuturesUnordered<BoxFuture<'static, Event>>,
    /// `release_all` calls in flight. While one runs no acquire attempt
    /// starts: it releases by owner id, so it would also free a lease
    /// acquired meanwhile, whose holder would not know.
    releasing_all: u32,
    /// Retries; few at a time (one per waiting key, one per failed renewal batch).
    timers: DelayQueue<Timer>,
    /// Local deadlines of held leases: a min-heap with one entry per lease,
    /// `(deadline, key, lease id)`, checked lazily against `Held::deadline`
    /// (renewals move that field only; resetting one timer per lease per
    /// heartbeat would cost O(n) timer operations per tick).
    deadlines: BinaryHeap<Reverse<(Instant, String, Uuid)>>,
    heartbeat: Interval,
    closing: Option<Closing>,
    /// The control channel of each observed key's hub (`observers::run_hub`).
    observers: HashMap<String, mpsc::UnboundedSender<observers::Subscriber>>,
    /// Stops every hub when the manager stops.
    stop_observers: CancellationToken,
    /// Releases by any owner (`Store::watch_releases`), open while some key
    /// waits for another owner's lease, so that a release wakes its waiters
    /// at once instead of at their next poll.
    release_watch: ReleaseWatch,
}

/// The state of the actor's one stream of releases.
enum ReleaseWatch {
    /// Not open: no key waits for another owner.
    Closed,
    Open(BoxStream<'static, Result<String>>),
    /// It failed; reopen no earlier than this (polling still works meanwhile).
    Failed {
        retry_at: Instant,
    },
    /// The deployment has no change streams (a standalone server): poll only.
    Unsupported,
}

/// Longest random delay before a waiter woken by a release tries again.
const RELEASE_WAKE_JITTER: std::time::Duration = std::time::Duration::from_millis(5);

/// How long a failed release stream stays closed before it is reopened.
const RELEASE_WATCH_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

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
            store,
            owner_id,
            timing,
            commands,
            sender,
            keys: HashMap::new(),
            tasks: FuturesUnordered::new(),
            renewals: FuturesUnordered::new(),
            releasing_all: 0,
            timers: DelayQueue::new(),
            deadlines: BinaryHeap::new(),
            heartbeat,
            closing: None,
            observers: HashMap::new(),
            stop_observers: CancellationToken::new(),
            release_watch: ReleaseWatch::Closed,
        }
    }

    pub(crate) async fn run(mut self) {
        while self.closing.is_none() || !self.tasks.is_empty() {
            let open = self.closing.is_none();
            tokio::select! {
                command = self.commands.recv(), if open => match command {
                    Some(command) => self.handle_command(command),
                    None => self.begin_shutdown(None),
                },
                Some(event) = self.tasks.next(), if !self.tasks.is_empty() => self.handle_event(event),
                Some(event) = self.renewals.next(), if open && !self.renewals.is_empty() => {
                    self.handle_event(event)
                }
                Some(expired) = self.timers.next(), if open && !self.timers.is_empty() => {
                    self.handle_timer(expired.into_inner())
                }
                _ = sleep_until_deadline(self.deadlines.peek()), if open => self.on_deadline_due(),
                _ = self.heartbeat.tick(), if open => {
                    self.renew_all();
                    self.close_release_watch_if_unneeded();
                }
                event = next_release(&mut self.release_watch), if open => self.on_release_event(event),
            }
        }
        self.stop_observers.cancel();
        if let Some(closing) = self.closing.take() {
            for respond_to in closing.responders {
                let _ = respond_to.send(match &closing.error {
                    None => Ok(()),
                    Some(e) => Err(e.clone()),
                });
            }
        }
        tracing::debug!(owner_id = %self.owner_id, "lease manager stopped");
    }

    fn handle_command(&mut self, command: Command) {
        match command {
            Command::Acquire {
                key,
                waiter,
                mode,
                respond_to,
            } => self.on_acquire(key, waiter, mode, respond_to),
            Command::CancelWaiter { key, waiter } => self.on_cancel_waiter(&key, waiter),
            Command::Release {
                key,
                lease_id,
                respond_to,
            } => self.on_release(key, lease_id, respond_to),
            Command::ReleaseAll { respond_to } => self.on_release_all(respond_to),
            Command::Shutdown { respond_to } => self.begin_shutdown(Some(respond_to)),
            Command::Inspect { key, respond_to } => {
                let read = self.store.inspect(key);
                self.answer(read, respond_to);
            }
            Command::List {
                after,
                limit,
                respond_to,
            } => {
                let read = self.store.list(after, limit);
                self.answer(read, respond_to);
            }
            Command::ForceRelease { key, respond_to } => self.on_force_release(key, respond_to),
            Command::SetPayload {
                key,
                lease_id,
                payload,
                respond_to,
            } => self.on_set_payload(key, lease_id, payload, respond_to),
            Command::Observe { key, respond_to } => self.on_observe(key, respond_to),
        }
    }

    fn handle_event(&mut self, event: Event) {
        match event {
            Event::Acquired {
                key,
                lease_id,
                sent_at,
                result,
            } => self.on_acquired(key, lease_id, sent_at, result),
            Event::Renewed {
                leases,
                sent_at,
                attempt,
                result,
            } => self.on_renewed(leases, sent_at, attempt, result),
            Event::Released {
                key,
                respond_to,
                result,
            } => self.on_released(key, respond_to, result),
            Event::ReleasedMany {
                keys,
                respond_to,
                result,
            } => self.on_released_many(keys, respond_to, result),
            Event::ReleasedAll {
                keys,
                respond_to,
                result,
            } => {
                self.releasing_all -= 1;
                self.on_released_many(keys, Some(respond_to), result);
                // Attempts held back while it ran.
                let waiting: Vec<String> = self
                    .keys
                    .iter()
                    .filter(|(_, s)| !s.waiters.is_empty())
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in waiting {
                    self.serve_next(&key);
                }
            }
            Event::Answered => {}
            Event::ForceReleased {
                key,
                respond_to,
                result,
            } => self.on_force_released(key, respond_to, result),
            Event::PayloadSet {
                key,
                lease_id,
                respond_to,
                result,
            } => self.on_payload_set(key, lease_id, respond_to, result),
        }
    }

    fn handle_timer(&mut self, timer: Timer) {
        match timer {
            Timer::Retry(key) => {
                if let Some(state) = self.keys.get_mut(&key) {
                    state.attempt = Attempt::Idle;
                }
                self.serve_next(&key);
            }
            Timer::RenewRetry { leases, attempt } => {
                let leases: Vec<LeaseRef> = leases
                    .into_iter()
                    .filter(|l| self.held_lease(&l.key, l.lease_id).is_some())
                    .collect();
                if !leases.is_empty() {
                    self.spawn_renewal(leases, attempt);
                }
            }
        }
    }

    // ----- commands -------------------------------------------------------

    fn on_acquire(
        &mut self,
        key: String,
        waiter: WaiterId,
        mode: AcquireMode,
        respond_to: Reply<Option<Lease>>,
    ) {
        let state = self.keys.entry(key.clone()).or_insert_with(KeyState::new);
        state.prune_waiters();
        let busy = state.held.is_some()
            || !state.waiters.is_empty()
            || state.releases_in_flight > 0
            || !matches!(state.attempt, Attempt::Idle)
            || self.releasing_all > 0;
        if mode == AcquireMode::Try && busy {
            let _ = respond_to.send(Ok(None));
            self.forget_if_idle(&key);
            return;
        }
        state.waiters.push_back(Waiter {
            id: waiter,
            mode,
            respond_to,
        });
        if !busy {
            self.start_attempt(&key);
        }
    }

    fn on_cancel_waiter(&mut self, key: &str, waiter: WaiterId) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        state.waiters.retain(|w| w.id != waiter);
        state.prune_waiters();
        if state.waiters.is_empty() {
            if let Attempt::Scheduled(timer) = state.attempt {
                self.timers.remove(&timer);
                state.attempt = Attempt::Idle;
            }
        }
        self.forget_if_idle(key);
    }

    fn on_release(
        &mut self,
        key: String,
        lease_id: Uuid,
        respond_to: Option<Reply<ReleaseOutcome>>,
    ) {
        if self.held_lease(&key, lease_id).is_none() {
            // Already lost (its token has fired) or already released by the manager.
            if let Some(respond_to) = respond_to {
                let _ = respond_to.send(Ok(ReleaseOutcome::AlreadyLost));
            }
            return;
        }
        let held = self.take_held(&key).expect("checked above");
        tracing::debug!(key, token = held.token, "releasing lease");
        self.spawn_release(key, held.lease_id, respond_to);
    }

    fn on_release_all(&mut self, respond_to: Reply<u64>) {
        self.releasing_all += 1;
        let keys = self.take_all_held();
        // Keys acquired while this runs must not be released by it: leave out
        // the lease ids of attempts in flight.
        let in_flight: Vec<Uuid> = self
            .keys
            .values()
            .filter(|s| !matches!(s.attempt, Attempt::Idle))
            .map(|s| s.next_lease_id)
            .collect();
        let release = self.store.release_owner(in_flight);
        self.spawn_store(release, |result| Event::ReleasedAll {
            keys,
            respond_to,
            result,
        });
    }

    fn begin_shutdown(&mut self, respond_to: Option<Reply<()>>) {
        tracing::debug!(owner_id = %self.owner_id, "lease manager shutting down");
        self.closing = Some(Closing {
            responders: respond_to.into_iter().collect(),
            error: None,
        });
        self.commands.close();
        self.renewals = FuturesUnordered::new();
        self.release_watch = ReleaseWatch::Closed;
        // Answer what was queued before the close; releases still happen.
        while let Ok(command) = self.commands.try_recv() {
            match command {
                Command::Release {
                    key,
                    lease_id,
                    respond_to,
                } => self.on_release(key, lease_id, respond_to),
                Command::CancelWaiter { key, waiter } => self.on_cancel_waiter(&key, waiter),
                Command::Shutdown { respond_to } => {
                    if let Some(closing) = &mut self.closing {
                        closing.responders.push(respond_to);
                    }
                }
                other => other.fail(Error::Shutdown),
            }
        }
        self.stop_observers.cancel();
        self.observers.clear();
        for state in self.keys.values_mut() {
            for waiter in state.waiters.drain(..) {
                let _ = waiter.respond_to.send(Err(Error::Shutdown));
            }
            if let Attempt::Scheduled(timer) = state.attempt {
                self.timers.remove(&timer);
                state.attempt = Attempt::Idle;
            }
        }
        let leases: Vec<LeaseRef> = self
            .keys
            .iter()
            .filter_map(|(key, s)| {
                s.held.as_ref().map(|h| LeaseRef {
                    key: key.clone(),
                    lease_id: h.lease_id,
                })
            })
            .collect();
        self.take_all_held();
        for batch in leases.chunks(self.timing.renewal_batch_size) {
            let keys = batch.iter().map(|l| l.key.clone()).collect();
            let release = self.store.release(batch.to_vec());
            self.spawn_store(release, |result| Event::ReleasedMany {
                keys,
                respond_to: None,
                result,
            });
        }
    }

    // ----- reading, operator commands, payload, observing ------------------

    /// Runs a read in `tasks`; its task answers the caller itself.
    fn answer<T: Send + 'static>(
        &mut self,
        read: BoxFuture<'static, Result<T>>,
        respond_to: Reply<T>,
    ) {
        self.spawn_store(read, |result| {
            let _ = respond_to.send(result);
            Event::Answered
        });
    }

    fn on_force_release(&mut self, key: String, respond_to: Reply<Option<LeaseInfo>>) {
        let release = self.store.force_release(key.clone());
        self.spawn_store(release, |result| Event::ForceReleased {
            result,
            key,
            respond_to,
        });
    }

    fn on_force_released(
        &mut self,
        key: String,
        respond_to: Reply<Option<LeaseInfo>>,
        result: Result<Option<LeaseInfo>>,
    ) {
        match &result {
            Ok(Some(info)) => {
                tracing::warn!(
                    key,
                    owner_id = info.owner_id,
                    token = info.fencing_token,
                    "lease force-released (operator override)"
                );
                // If it was one of ours, it is lost now.
                let ours = info.owner_id == *self.owner_id
                    && self
                        .keys
                        .get(&key)
                        .and_then(|s| s.held.as_ref())
                        .is_some_and(|h| h.token == info.fencing_token);
                if ours {
                    self.take_held(&key);
                    self.serve_next(&key);
                }
            }
            Ok(None) => tracing::info!(key, "force release: the key was not held"),
            Err(error) => tracing::warn!(key, %error, "force release failed"),
        }
        let _ = respond_to.send(result);
    }

    fn on_set_payload(
        &mut self,
        key: String,
        lease_id: Uuid,
        payload: Document,
        respond_to: Reply<()>,
    ) {
        if self.held_lease(&key, lease_id).is_none() {
            let _ = respond_to.send(Err(Error::LeaseLost { key }));
            return;
        }
        let write = self.store.set_payload(
            LeaseRef {
                key: key.clone(),
                lease_id,
            },
            payload,
        );
        self.spawn_store(write, move |result| Event::PayloadSet {
            result,
            key,
            lease_id,
            respond_to,
        });
    }

    fn on_payload_set(
        &mut self,
        key: String,
        lease_id: Uuid,
        respond_to: Reply<()>,
        result: Result<bool>,
    ) {
        let reply = match result {
            Ok(true) => Ok(()),
            Ok(false) => {
                if let Some(held) = self.held_lease(&key, lease_id) {
                    tracing::warn!(
                        key,
                        token = held.token,
                        "lease lost: setting its payload found it gone or taken"
                    );
                    self.take_held(&key);
                    self.serve_next(&key);
                }
                Err(Error::LeaseLost { key })
            }
            Err(error) => Err(error),
        };
        let _ = respond_to.send(reply);
    }

    /// Subscribes the caller to the key's hub, starting one if needed.
    fn on_observe(&mut self, key: String, respond_to: Reply<LeaseObserver>) {
        self.observers.retain(|_, hub| !hub.is_closed());
        let (subscriber, changes) = mpsc::unbounded_channel();
        let observer = LeaseObserver {
            key: key.clone(),
            changes,
        };
        let subscriber = match self.observers.get(&key) {
            Some(hub) => match hub.send(subscriber) {
                Ok(()) => {
                    let _ = respond_to.send(Ok(observer));
                    return;
                }
                // The hub is ending: start a new one.
                Err(mpsc::error::SendError(subscriber)) => subscriber,
            },
            None => subscriber,
        };
        let (hub, control) = mpsc::unbounded_channel();
        let _ = hub.send(subscriber);
        let source = self.store.observe(key.clone());
        tokio::spawn(observers::run_hub(
            key.clone(),
            source,
            control,
            self.stop_observers.clone(),
        ));
        self.observers.insert(key, hub);
        let _ = respond_to.send(Ok(observer));
    }

    // ----- acquiring ------------------------------------------------------

    fn start_attempt(&mut self, key: &str) {
        let state = self.keys.get_mut(key).expect("attempt for a known key");
        state.attempt = Attempt::InFlight;
        let lease_id = state.next_lease_id;
        let waiting = state.waiters.iter().any(|w| w.mode != AcquireMode::Try);
        let sent_at = Instant::now();
        let key = key.to_string();
        let acquire = self.store.acquire(key.clone(), lease_id, waiting);
        self.spawn_store(acquire, move |result| Event::Acquired {
            result,
            key,
            lease_id,
            sent_at,
        });
    }

    fn on_acquired(
        &mut self,
        key: String,
        lease_id: Uuid,
        sent_at: Instant,
        result: Result<AcquireOutcome>,
    ) {
        let Some(state) = self.keys.get_mut(&key) else {
            return;
        };
        state.attempt = Attempt::Idle;
        match result {
            Ok(AcquireOutcome::Acquired { token }) => {
                state.failures = 0;
                state.next_lease_id = Uuid::new_v4();
                self.grant(&key, lease_id, token, sent_at);
            }
            Ok(AcquireOutcome::Held { holder, remaining }) => {
                tracing::trace!(key, holder, ?remaining, "key is held");
                for waiter in std::mem::take(&mut state.waiters) {
                    if waiter.mode == AcquireMode::Try {
                        let _ = waiter.respond_to.send(Ok(None));
                    } else if !waiter.respond_to.is_closed() {
                        state.waiters.push_back(waiter);
                    }
                }
                if !state.waiters.is_empty() {
                    self.schedule_retry(&key, Some(remaining));
                }
            }
            Err(error) => {
                let transient = error.is_transient();
                for waiter in std::mem::take(&mut state.waiters) {
                    if waiter.mode == AcquireMode::Try || !transient {
                        let _ = waiter.respond_to.send(Err(error.clone()));
                    } else if !waiter.respond_to.is_closed() {
                        state.waiters.push_back(waiter);
                    }
                }
                if !state.waiters.is_empty() {
                    tracing::warn!(key, %error, "acquire attempt failed; retrying");
                    self.schedule_retry(&key, None);
                } else if transient {
                    // The write may have landed unseen: give it back rather than
                    // leave the key blocked until the lease expires.
                    state.next_lease_id = Uuid::new_v4();
                    self.spawn_release(key.clone(), lease_id, None);
                }
            }
        }
        self.forget_if_idle(&key);
    }

    /// Hands a fresh acquisition to the first waiter still waiting, or gives it
    /// back at once if nobody waits any more (a cancelled acquire never leaks).
    fn grant(&mut self, key: &str, lease_id: Uuid, token: u64, sent_at: Instant) {
        let deadline = sent_at + self.timing.local_validity();
        let state = self.keys.get_mut(key).expect("grant for a known key");
        while let Some(waiter) = state.waiters.pop_front() {
            if waiter.respond_to.is_closed() {
                continue;
            }
            let Some(mailbox) = self.sender.upgrade().map(Mailbox::new) else {
                break;
            };
            let cancel = CancellationToken::new();
            self.deadlines
                .push(Reverse((deadline, key.to_string(), lease_id)));
            state.held = Some(Held {
                lease_id,
                token,
                cancel: cancel.clone(),
                deadline,
                renewing: false,
            });
            tracing::debug!(key, token, "lease acquired");
            let lease = Lease::new(
                key.to_string(),
                self.owner_id.clone(),
                lease_id,
                token,
                cancel,
                mailbox,
            );
            // If the caller went away just now, the returned lease is dropped
            // here, and its drop queues its release.
            let _ = waiter.respond_to.send(Ok(Some(lease)));
            return;
        }
        self.spawn_release(key.to_string(), lease_id, None);
    }

    fn schedule_retry(&mut self, key: &str, remaining: Option<std::time::Duration>) {
        let state = self.keys.get_mut(key).expect("retry for a known key");
        let delay = retry_delay(
            state.failures,
            self.timing.retry_initial,
            self.timing.retry_max,
            remaining,
        );
        state.failures = state.failures.saturating_add(1);
        let timer = self.timers.insert(Timer::Retry(key.to_string()), delay);
        state.attempt = Attempt::Scheduled(timer);
        if remaining.is_some() {
            self.open_release_watch();
        }
    }

    // ----- prompt wake-up on releases by other owners ------------------------

    /// Opens the stream of releases if it is not open (or failed long enough ago).
    fn open_release_watch(&mut self) {
        let reopen = match &self.release_watch {
            ReleaseWatch::Closed => true,
            ReleaseWatch::Failed { retry_at } => Instant::now() >= *retry_at,
            ReleaseWatch::Open(_) | ReleaseWatch::Unsupported => false,
        };
        if reopen {
            self.release_watch = ReleaseWatch::Open(self.store.watch_releases());
        }
    }

    /// Heartbeat: closes the stream once no key waits for another owner.
    fn close_release_watch_if_unneeded(&mut self) {
        let waiting = self
            .keys
            .values()
            .any(|s| matches!(s.attempt, Attempt::Scheduled(_)) && !s.waiters.is_empty());
        if !waiting && matches!(self.release_watch, ReleaseWatch::Open(_)) {
            self.release_watch = ReleaseWatch::Closed;
        }
    }

    /// A lease was released or deleted somewhere: if local callers wait for
    /// that key, try again now, with up to [`RELEASE_WAKE_JITTER`] of jitter so that
    /// waiters in several processes do not all arrive in the same instant.
    fn on_release_event(&mut self, event: Option<Result<String>>) {
        match event {
            Some(Ok(key)) => {
                let Some(state) = self.keys.get_mut(&key) else {
                    return;
                };
                if let Attempt::Scheduled(timer) = state.attempt {
                    let jitter = rand::Rng::random_range(
                        &mut rand::rng(),
                        std::time::Duration::ZERO
                            ..=RELEASE_WAKE_JITTER.min(self.timing.retry_initial),
                    );
                    tracing::trace!(key, "released elsewhere: retrying now");
                    self.timers.reset(&timer, jitter);
                }
            }
            Some(Err(error)) if error.is_transient() => {
                tracing::debug!(%error, "release stream failed; reopening later");
                self.release_watch = ReleaseWatch::Failed {
                    retry_at: Instant::now() + RELEASE_WATCH_RETRY,
                };
            }
            Some(Err(error)) => {
                // Typically a standalone server (no change streams, code 40573).
                tracing::debug!(%error, "no change stream of releases; waiters poll");
                self.release_watch = ReleaseWatch::Unsupported;
            }
            None => {
                self.release_watch = ReleaseWatch::Failed {
                    retry_at: Instant::now() + RELEASE_WATCH_RETRY,
                };
            }
        }
    }

    /// Starts the key's next attempt if it is free locally and someone waits.
    fn serve_next(&mut self, key: &str) {
        let Some(state) = self.keys.get_mut(key) else {
            return;
        };
        state.prune_waiters();
        let ready = state.held.is_none()
            && state.releases_in_flight == 0
            && matches!(state.attempt, Attempt::Idle)
            && !state.waiters.is_empty()
            && self.releasing_all == 0;
        if ready {
            self.start_attempt(key);
        } else {
            self.forget_if_idle(key);
        }
    }

    // ----- renewing -------------------------------------------------------

    /// Heartbeat: renew every held lease not already being renewed, in batches.
    fn renew_all(&mut self) {
        let mut leases = Vec::new();
        for (key, state) in &mut self.keys {
            if let Some(held) = state.held.as_mut().filter(|h| !h.renewing) {
                held.renewing = true;
                leases.push(LeaseRef {
                    key: key.clone(),
                    lease_id: held.lease_id,
                });
            }
        }
        for batch in leases.chunks(self.timing.renewal_batch_size) {
            self.spawn_renewal(batch.to_vec(), 0);
        }
    }

    /// Renews `leases` in one store call, bounded by the heartbeat interval: a
    /// renewal that hangs longer is abandoned and retried, so it cannot hold
    /// back the next ones until the lease's deadline.
    fn spawn_renewal(&mut self, leases: Vec<LeaseRef>, attempt: u32) {
        let sent_at = Instant::now();
        let bound = self.timing.heartbeat_interval;
        let renew = tokio::time::timeout(bound, self.store.renew(leases.clone()));
        self.renewals.push(
            async move {
                let result = renew.await.unwrap_or_else(|_elapsed| {
                    Err(Error::Unreachable {
                        waited: bound,
                        reason: "renewal timed out".into(),
                    })
                });
                Event::Renewed {
                    result,
                    leases,
                    sent_at,
                    attempt,
                }
            }
            .boxed(),
        );
    }

    fn on_renewed(
        &mut self,
        leases: Vec<LeaseRef>,
        sent_at: Instant,
        attempt: u32,
        result: Result<Vec<String>>,
    ) {
        let lost = match result {
            Ok(lost) => lost.into_iter().collect::<HashSet<_>>(),
            Err(error) => {
                // Outcome unknown: renewing again is idempotent and its matched
                // count tells the truth. The local deadline stays where the last
                // confirmed renewal put it.
                let leases: Vec<LeaseRef> = leases
                    .into_iter()
                    .filter(|l| self.held_lease(&l.key, l.lease_id).is_some())
                    .collect();
                tracing::warn!(%error, leases = leases.len(), attempt, "renewal failed; retrying");
                if !leases.is_empty() {
                    let delay = retry_delay(
                        attempt,
                        self.timing.retry_initial,
                        self.timing.heartbeat_interval / 2,
                        None,
                    );
                    self.timers.insert(
                        Timer::RenewRetry {
                            leases,
                            attempt: attempt.saturating_add(1),
                        },
                        delay,
                    );
                }
                return;
            }
        };
        let deadline = sent_at + self.timing.local_validity();
        for lease in leases {
            let Some(state) = self.keys.get_mut(&lease.key) else {
                continue;
            };
            let Some(held) = state.held.as_mut().filter(|h| h.lease_id == lease.lease_id) else {
                continue;
            };
            held.renewing = false;
            if lost.contains(&lease.key) {
                tracing::warn!(
                    key = lease.key,
                    token = held.token,
                    "lease lost: renewal found it gone or taken"
                );
                self.take_held(&lease.key);
                self.serve_next(&lease.key);
            } else if deadline > held.deadline {
                // The heap entry is re-armed lazily when it comes due.
                held.deadline = deadline;
            }
        }
    }

    /// The earliest entry of the deadline heap came due: the lease it names is
    /// lost if its deadline really passed; if a renewal moved the deadline,
    /// the entry is pushed again at the new one; if the lease is gone, the
    /// entry is dropped. So the heap holds one entry per held lease, and a
    /// renewal costs no heap operation.
    fn on_deadline_due(&mut self) {
        let now = Instant::now();
        while let Some(Reverse((due, _, _))) = self.deadlines.peek() {
            if *due > now {
                break;
            }
            let Reverse((_, key, lease_id)) = self.deadlines.pop().expect("peeked");
            let Some(held) = self.keys.get(&key).and_then(|s| s.held.as_ref()) else {
                continue;
            };
            if held.lease_id != lease_id {
                continue;
            }
            if held.deadline > now {
                let deadline = held.deadline;
                self.deadlines.push(Reverse((deadline, key, lease_id)));
                continue;
            }
            self.on_deadline(key);
        }
    }

    fn on_deadline(&mut self, key: String) {
        let Some(held) = self.keys.get_mut(&key).and_then(|s| s.held.take()) else {
            return;
        };
        held.cancel.cancel();
        tracing::warn!(
            key,
            token = held.token,
            "lease lost: renewal not confirmed before the local deadline"
        );
        // It may still be ours on the server: free it now rather than at expiry.
        self.spawn_release(key, held.lease_id, None);
    }

    // ----- releasing ------------------------------------------------------

    fn spawn_release(
        &mut self,
        key: String,
        lease_id: Uuid,
        respond_to: Option<Reply<ReleaseOutcome>>,
    ) {
        self.keys
            .entry(key.clone())
            .or_insert_with(KeyState::new)
            .releases_in_flight += 1;
        let release = self.store.release(vec![LeaseRef {
            key: key.clone(),
            lease_id,
        }]);
        self.spawn_store(release, |result| Event::Released {
            result,
            key,
            respond_to,
        });
    }

    fn on_released(
        &mut self,
        key: String,
        respond_to: Option<Reply<ReleaseOutcome>>,
        result: Result<u64>,
    ) {
        if let Some(state) = self.keys.get_mut(&key) {
            state.releases_in_flight -= 1;
        }
        let outcome = match result {
            Ok(0) => Ok(ReleaseOutcome::AlreadyLost),
            Ok(_) => Ok(ReleaseOutcome::Released),
            Err(error) => {
                tracing::warn!(key, %error, "release failed; the lease will expire after its TTL");
                Err(error)
            }
        };
        if let Some(respond_to) = respond_to {
            let _ = respond_to.send(outcome);
        }
        self.serve_next(&key);
    }

    fn on_released_many(
        &mut self,
        keys: Vec<String>,
        respond_to: Option<Reply<u64>>,
        result: Result<u64>,
    ) {
        for key in &keys {
            if let Some(state) = self.keys.get_mut(key) {
                state.releases_in_flight -= 1;
            }
        }
        if let Err(error) = &result {
            tracing::warn!(%error, "releasing leases failed; they will expire after their TTL");
            if let Some(closing) = &mut self.closing {
                closing.error.get_or_insert_with(|| error.clone());
            }
        }
        if let Some(respond_to) = respond_to {
            let _ = respond_to.send(result);
        }
        for key in &keys {
            self.serve_next(key);
        }
    }

    // ----- state helpers --------------------------------------------------

    /// Runs a store operation in [`Actor::tasks`]; `event` turns its output
    /// into the [`Event`] handled when it completes.
    fn spawn_store<T: Send + 'static>(
        &mut self,
        operation: BoxFuture<'static, T>,
        event: impl FnOnce(T) -> Event + Send + 'static,
    ) {
        self.tasks
            .push(async move { event(operation.await) }.boxed());
    }

    fn held_lease(&self, key: &str, lease_id: Uuid) -> Option<&Held> {
        self.keys
            .get(key)?
            .held
            .as_ref()
            .filter(|h| h.lease_id == lease_id)
    }

    /// Removes the key's held lease and cancels its token (its deadline
    /// heap entry is dropped when it comes due).
    fn take_held(&mut self, key: &str) -> Option<Held> {
        let held = self.keys.get_mut(key)?.held.take()?;
        held.cancel.cancel();
        Some(held)
    }

    /// Takes every held lease (as `take_held`) and counts a release in flight
    /// for each; returns their keys.
    fn take_all_held(&mut self) -> Vec<String> {
        let keys: Vec<String> = self
            .keys
            .iter()
            .filter(|(_, s)| s.held.is_some())
            .map(|(k, _)| k.clone())
            .collect();
        for key in &keys {
            self.take_held(key);
            if let Some(state) = self.keys.get_mut(key) {
                state.releases_in_flight += 1;
            }
        }
        keys
    }

    fn forget_if_idle(&mut self, key: &str) {
        if self.keys.get(key).is_some_and(KeyState::is_idle) {
            self.keys.remove(key);
        }
    }
}

/// Sleeps until the earliest local deadline, or forever if no lease is held.
async fn sleep_until_deadline(next: Option<&Reverse<(Instant, String, Uuid)>>) {
    match next {
        Some(Reverse((deadline, _, _))) => tokio::time::sleep_until(*deadline).await,
        None => std::future::pending().await,
    }
}

/// The next item of the release stream, or never if it is not open.
async fn next_release(watch: &mut ReleaseWatch) -> Option<Result<String>> {
    match watch {
        ReleaseWatch::Open(stream) => stream.next().await,
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests;
