//! How a held lease stands ([`LeaseStatus`]): the `LeaseState` each held
//! lease shares between the actor and the caller's handles.

use std::fmt;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};
use std::time::SystemTime;

use futures::stream::{BoxStream, Stream, StreamExt};
use tokio::sync::broadcast;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// What [`Lease::release`](crate::Lease::release) found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[must_use]
pub enum ReleaseOutcome {
    /// The lease was still held and is now released: the key is free at once.
    Released,
    /// The lease had already been lost (its cancellation token had fired, or
    /// the server no longer had it under this lease id): work done since then
    /// was not protected by it. Also the answer when the release's write
    /// had an unknown outcome (a network error, a failover) and the lease
    /// is gone: this release may have ended it, or an operator before it,
    /// and a doubt is reported as a loss, never the reverse
    /// (`docs/safety.md`, property 7).
    AlreadyLost,
    /// One entry of a re-entered lease ended
    /// ([`Lease::reenter`](crate::Lease::reenter)); its other entries still
    /// hold the lease. Nothing was sent.
    StillHeld,
}

impl ReleaseOutcome {
    /// `true` if the lease had been lost before the release.
    pub fn was_lost(self) -> bool {
        self == ReleaseOutcome::AlreadyLost
    }
}

/// Why a lease is no longer held ([`LeaseStatus::lost_reason`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LossReason {
    /// Not renewed in time: no renewal was confirmed before the local
    /// deadline (the server unreachable, the process or the manager task
    /// stalled), or the server found the lease expired.
    Expired,
    /// Another acquisition has the key now (or had it since this lease was
    /// lost): another manager took it after this lease expired, or another
    /// application rewrote or replaced its document (then `fencing_token` is
    /// that document's integer `tok`, or 0).
    Taken {
        /// The owner id of the manager (or application) that holds it now.
        owner_id: String,
        /// The new holder's fencing token (greater than this lease's).
        fencing_token: u64,
    },
    /// The lease's document (or in-document lock field) was deleted by
    /// someone else (another application, an operator, a TTL index on
    /// another field, a release by owner id in delete mode).
    Deleted,
    /// The lease was force-released
    /// ([`LeaseManager::force_release`](crate::LeaseManager::force_release),
    /// [`LeaseManager::release_owner`](crate::LeaseManager::release_owner)),
    /// by this manager or another. (A holder of a shared or semaphore key
    /// reads [`Expired`](LossReason::Expired) then: it cannot tell.)
    ForceReleased,
    /// The holder released it ([`Lease::release`](crate::Lease::release),
    /// a drop, a commit, [`LeaseManager::release_all`](crate::LeaseManager::release_all)).
    Released,
    /// The manager shut down ([`LeaseManager::shutdown`](crate::LeaseManager::shutdown),
    /// or every handle dropped).
    Shutdown,
    /// Another lease of its group ([`LeaseGroup`](crate::LeaseGroup)) was
    /// lost, for `reason`, and the manager released this one at once.
    GroupLost {
        /// The key whose lease was lost first.
        key: crate::key::LeaseKey,
        /// Why that lease was lost.
        reason: Box<LossReason>,
    },
}

impl LossReason {
    /// A short label, for metrics and logs: `expired`, `taken`, `deleted`,
    /// `force_released`, `released`, `shutdown` or `group_lost`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LossReason::Expired => "expired",
            LossReason::Taken { .. } => "taken",
            LossReason::Deleted => "deleted",
            LossReason::ForceReleased => "force_released",
            LossReason::Released => "released",
            LossReason::Shutdown => "shutdown",
            LossReason::GroupLost { .. } => "group_lost",
        }
    }

    /// `true` for the reasons that end a lease its holder did not give up:
    /// expired, taken, deleted, force-released.
    pub fn is_involuntary(&self) -> bool {
        !matches!(self, LossReason::Released | LossReason::Shutdown)
    }
}

impl fmt::Display for LossReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LossReason::Taken {
                owner_id,
                fencing_token,
            } => write!(f, "taken by {owner_id:?} (fencing token {fencing_token})"),
            LossReason::GroupLost { key, reason } => {
                write!(f, "the lease on {key} of its group was lost: {reason}")
            }
            other => f.write_str(other.as_str()),
        }
    }
}

/// Something that happened to one held lease ([`LeaseStatus::events`]).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LeaseEvent {
    /// A renewal was confirmed by the server.
    Renewed {
        /// The lease's new expiry on the server (`exp`), estimated from the
        /// local time since the acquisition (a renewal returns no
        /// document): earlier by at most both round trips plus 1 ms.
        expires_at: SystemTime,
        /// The new local deadline ([`LeaseStatus::deadline`]).
        deadline: Instant,
    },
    /// A renewal failed or could not be confirmed (the server unreachable,
    /// a timeout, an error); the manager retries. The lease is still held
    /// until `deadline` unless a renewal is confirmed before then.
    AtRisk {
        /// The local deadline (tokio's clock), unchanged by the failure.
        deadline: Instant,
        /// The renewal's error, as text.
        error: String,
    },
    /// Someone asked the holder to release the lease
    /// ([`LeaseManager::request_release`](crate::LeaseManager::request_release)).
    /// The lease is still held; the holder decides whether, and when, to
    /// release it.
    RevocationRequested {
        /// The owner id of the manager that asked.
        by: String,
    },
    /// The lease is no longer held; the last event of the stream.
    Lost(LossReason),
}

/// How many events a reader of [`LeaseEvents`] may fall behind before it
/// misses the oldest ones (the final [`LeaseEvent::Lost`] is never missed).
pub const LEASE_EVENTS_CAPACITY: usize = 16;

/// The events of one lease, from [`LeaseStatus::events`] (a [`Stream`]; or
/// call [`LeaseEvents::recv`]).
///
/// The manager never waits for a reader: one more than
/// [`LEASE_EVENTS_CAPACITY`] events behind skips the oldest ones. The final
/// [`LeaseEvent::Lost`] is always delivered, even to a stream made after
/// the loss, and ends the stream (unless the manager task was dropped with
/// its runtime); it comes when the manager task runs, while
/// [`LeaseStatus::is_lost`] reads lost at the local deadline already.
pub struct LeaseEvents {
    inner: BoxStream<'static, LeaseEvent>,
}

impl LeaseEvents {
    /// The next event; `None` after [`LeaseEvent::Lost`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an event is never lost by dropping the future.
    pub async fn recv(&mut self) -> Option<LeaseEvent> {
        self.inner.next().await
    }
}

impl Stream for LeaseEvents {
    type Item = LeaseEvent;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<LeaseEvent>> {
        self.inner.poll_next_unpin(cx)
    }
}

impl fmt::Debug for LeaseEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseEvents").finish_non_exhaustive()
    }
}

/// How a held lease stands, readable without the manager task: whether it is
/// lost and why, its local deadline, its cancellation token and its events.
/// Every holder hands one out ([`Lease::status`](crate::Lease::status), ...).
/// Cheap to clone into the tasks that work under the lease; it does not
/// keep the lease held. A group's status reads lost once any of its leases
/// is.
///
/// # Examples
///
/// ```no_run
/// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
/// let lease = manager.acquire("invoice-42").await?;
/// let status = lease.status();
/// tokio::select! {
///     _ = status.lost() => eprintln!("lost: {:?}", status.lost_reason()),
///     _ = do_work(lease.fencing_token()) => {}
/// }
/// lease.release().await?;
/// # Ok(()) }
/// # async fn do_work(_token: u64) {}
/// ```
#[derive(Clone, Debug)]
pub struct LeaseStatus {
    /// The lease's state; for a group, its first lease's (in key order).
    first: Arc<LeaseState>,
    /// A group's other leases; `None` for one lease.
    others: Option<Arc<[Arc<LeaseState>]>>,
}

impl LeaseStatus {
    /// The status of one lease.
    pub(crate) fn of(state: Arc<LeaseState>) -> Self {
        LeaseStatus {
            first: state,
            others: None,
        }
    }

    /// The status of a group of leases (`states` never empty).
    pub(crate) fn of_group(mut states: Vec<Arc<LeaseState>>) -> Self {
        let first = states.remove(0);
        LeaseStatus {
            first,
            others: Some(Arc::from(states)),
        }
    }

    fn all(&self) -> impl Iterator<Item = &Arc<LeaseState>> {
        std::iter::once(&self.first).chain(self.others.iter().flat_map(|others| others.iter()))
    }

    /// A token cancelled when the lease is no longer held: when a renewal
    /// finds it gone or taken (at the next heartbeat, or within
    /// milliseconds with [`watch_held_leases`](crate::LeaseManagerOptions::watch_held_leases)),
    /// when renewal could not be confirmed before the local deadline
    /// ([`LeaseStatus::deadline`]), or when the manager releases it. The
    /// reason ([`LeaseStatus::lost_reason`]) is recorded before it fires.
    pub fn cancellation_token(&self) -> CancellationToken {
        self.first.token().clone()
    }

    /// Completes when the lease is lost (see
    /// [`LeaseStatus::cancellation_token`]). The future borrows nothing.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future has no effect on the lease.
    pub fn lost(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.first.token().clone().cancelled_owned()
    }

    /// `true` once the lease has been lost: its cancellation token fired,
    /// or its local deadline has passed, even if the manager task has not
    /// run since (the token fires when it runs).
    pub fn is_lost(&self) -> bool {
        self.all().any(|state| state.is_lost())
    }

    /// Why the lease was lost; `None` while it is held. For a group, the
    /// reason of the lease lost first. [`LossReason::Expired`] once the
    /// local deadline has passed, even before the manager task has noticed;
    /// once [`LeaseStatus::lost`] has completed, the manager's verdict.
    pub fn lost_reason(&self) -> Option<LossReason> {
        if self.others.is_none() {
            return self.first.lost_reason();
        }
        self.all()
            .filter_map(|state| state.lost_reason())
            .map(|reason| match reason {
                LossReason::GroupLost { reason, .. } => *reason,
                reason => reason,
            })
            .next()
    }

    /// The local deadline (tokio's clock) after which the lease reads lost
    /// unless a renewal is confirmed before then: *start of the last
    /// confirmed renewal (or of the acquire) + ttl − safety margin − clock
    /// skew*; for a group, the earliest of its leases'. `None` once lost.
    pub fn deadline(&self) -> Option<Instant> {
        // `None`, a lost lease's, sorts first.
        self.all().map(|state| state.deadline()).min().flatten()
    }

    /// The events of the lease from now on ([`LeaseEvent`], delivered as
    /// [`LeaseEvents`] says), ending with the loss; for a group, those of
    /// its first lease in key order. The token fires before the `Lost` event
    /// is sent.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use mongo_lease::{LeaseEvent, LossReason};
    /// # async fn demo(manager: mongo_lease::LeaseManager) -> mongo_lease::Result<()> {
    /// let lease = manager.acquire("report").await?;
    /// let mut events = lease.status().events();
    /// while let Some(event) = events.recv().await {
    ///     match event {
    ///         LeaseEvent::AtRisk { error, .. } => eprintln!("renewal failed: {error}"),
    ///         LeaseEvent::Lost(LossReason::Taken { owner_id, .. }) => eprintln!("taken by {owner_id}"),
    ///         LeaseEvent::Lost(reason) => eprintln!("lost: {reason}"),
    ///         _ => {}
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn events(&self) -> LeaseEvents {
        self.first.events()
    }

    /// The state shared with the manager (for a group, the first lease's).
    pub(crate) fn state(&self) -> &Arc<LeaseState> {
        &self.first
    }
}

/// The state one held lease shares between the actor and its handles.
pub(crate) struct LeaseState {
    /// The token that fires when the lease is lost, made by the first call
    /// to [`LeaseState::token`] (a token is over 100 bytes; most leases need none).
    cancel: OnceLock<CancellationToken>,
    /// The local deadline, as [`to_nanos`] encodes it; [`LOST`] once lost.
    deadline: AtomicI64,
    /// Why it was lost: set once, before the token fires.
    reason: OnceLock<LossReason>,
    /// The events' channel, made by the first `events()` call (most leases
    /// are never followed: one pointer until then).
    events: OnceLock<broadcast::Sender<LeaseEvent>>,
}

/// The instant local deadlines are counted from: the first one asked for
/// (tokio's clock, so that paused-clock tests move it). Deadlines before it
/// count back from it (each paused-clock test runtime has a clock of its
/// own, and one may start before another's first deadline).
fn base() -> Instant {
    static BASE: OnceLock<std::time::Instant> = OnceLock::new();
    Instant::from_std(*BASE.get_or_init(|| Instant::now().into_std()))
}

/// The stored deadline of a lost lease.
const LOST: i64 = i64::MIN;

/// `at` as signed nanoseconds from [`base`] (292 years either way), never
/// `i64::MIN` or `i64::MAX`: free for sentinels such as [`LOST`].
pub(crate) fn to_nanos(at: Instant) -> i64 {
    let base = base();
    let nanos = |d: std::time::Duration| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX);
    let signed = if at >= base {
        nanos(at.duration_since(base))
    } else {
        -nanos(base.duration_since(at))
    };
    signed.clamp(i64::MIN + 1, i64::MAX - 1)
}

/// The instant [`to_nanos`] encoded.
pub(crate) fn from_nanos(signed: i64) -> Instant {
    let magnitude = std::time::Duration::from_nanos(signed.unsigned_abs());
    if signed >= 0 {
        base() + magnitude
    } else {
        base() - magnitude
    }
}

impl LeaseState {
    /// A held lease whose local deadline is `deadline`.
    pub(crate) fn new(deadline: Instant) -> Self {
        LeaseState {
            cancel: OnceLock::new(),
            deadline: AtomicI64::new(to_nanos(deadline)),
            reason: OnceLock::new(),
            events: OnceLock::new(),
        }
    }

    /// The token that fires when the lease is lost (already fired if it
    /// is made after the loss).
    pub(crate) fn token(&self) -> &CancellationToken {
        self.cancel.get_or_init(|| {
            let token = CancellationToken::new();
            if self.reason.get().is_some() {
                token.cancel();
            }
            token
        })
    }

    /// Moves the local deadline (a confirmed renewal), unless the lease is
    /// lost: its token fired or its deadline has passed (a lease that read
    /// lost never reads held again). Returns whether it moved.
    pub(crate) fn set_deadline(&self, deadline: Instant) -> bool {
        if self.is_lost() {
            return false;
        }
        self.deadline.store(to_nanos(deadline), Ordering::Release);
        true
    }

    /// A confirmed renewal: [`LeaseState::set_deadline`], and
    /// [`LeaseEvent::Renewed`] to the followers, if any.
    pub(crate) fn renewed(&self, deadline: Instant, expires_at: impl FnOnce() -> SystemTime) {
        if self.set_deadline(deadline) {
            self.send(|| LeaseEvent::Renewed {
                expires_at: expires_at(),
                deadline,
            });
        }
    }

    /// A renewal failed or was not confirmed: sends [`LeaseEvent::AtRisk`]
    /// with the unchanged deadline, if someone follows the lease.
    pub(crate) fn at_risk(&self, error: &dyn fmt::Display) {
        if let Some(deadline) = self.deadline() {
            self.send(|| LeaseEvent::AtRisk {
                deadline,
                error: error.to_string(),
            });
        }
    }

    /// A release of the lease was requested by owner id `by`:
    /// [`LeaseEvent::RevocationRequested`] to the followers of a held lease.
    pub(crate) fn revocation_requested(&self, by: &str) {
        if !self.is_lost() {
            self.send(|| LeaseEvent::RevocationRequested { by: by.to_string() });
        }
    }

    /// Whether someone follows the lease's events (`LeaseStatus::events`).
    pub(crate) fn is_followed(&self) -> bool {
        self.events
            .get()
            .is_some_and(|events| events.receiver_count() > 0)
    }

    /// Sends an event to the lease's followers, if any (made only then).
    fn send(&self, event: impl FnOnce() -> LeaseEvent) {
        if let Some(events) = self.events.get()
            && events.receiver_count() > 0
        {
            let _ = events.send(event());
        }
    }

    /// The lease's events (see [`LeaseEvents`]): those sent from now on,
    /// ending with [`LeaseEvent::Lost`]; only that one if already lost.
    pub(crate) fn events(&self) -> LeaseEvents {
        let receiver = self
            .events
            .get_or_init(|| broadcast::channel(LEASE_EVENTS_CAPACITY).0)
            .subscribe();
        // Subscribed before reading the reason: a loss recorded after this
        // read sends its `Lost` to this receiver.
        let inner = match self.reason.get() {
            Some(reason) => {
                futures::stream::once(std::future::ready(LeaseEvent::Lost(reason.clone()))).boxed()
            }
            None => futures::stream::unfold(Some(receiver), |receiver| async move {
                let mut receiver = receiver?;
                loop {
                    match receiver.recv().await {
                        Ok(event @ LeaseEvent::Lost(_)) => return Some((event, None)),
                        Ok(event) => return Some((event, Some(receiver))),
                        Err(broadcast::error::RecvError::Lagged(_)) => continue,
                        Err(broadcast::error::RecvError::Closed) => return None,
                    }
                }
            })
            .boxed(),
        };
        LeaseEvents { inner }
    }

    /// The local deadline; `None` once the lease is lost.
    pub(crate) fn deadline(&self) -> Option<Instant> {
        match self.deadline.load(Ordering::Acquire) {
            LOST => None,
            stored => Some(from_nanos(stored)),
        }
    }

    /// `true` once the lease is lost: its token fired, or its local deadline
    /// has passed (even if the actor has not run since).
    pub(crate) fn is_lost(&self) -> bool {
        self.cancel
            .get()
            .is_some_and(CancellationToken::is_cancelled)
            || self
                .deadline()
                .is_none_or(|deadline| Instant::now() >= deadline)
    }

    /// Why the lease was lost: the recorded reason, or [`LossReason::Expired`]
    /// once the local deadline has passed without one; `None` while held.
    pub(crate) fn lost_reason(&self) -> Option<LossReason> {
        if let Some(reason) = self.reason.get() {
            return Some(reason.clone());
        }
        self.is_lost().then_some(LossReason::Expired)
    }

    /// Records why the lease was lost (the first reason wins) and fires its
    /// token, then sends [`LeaseEvent::Lost`]. Returns `false` if it was
    /// already recorded lost.
    pub(crate) fn lose(&self, reason: LossReason) -> bool {
        let first = self.reason.set(reason).is_ok();
        self.deadline.store(LOST, Ordering::Release);
        // Through `token()`: a token being made by another thread meanwhile
        // is waited for and fired too.
        self.token().cancel();
        if first && let Some(reason) = self.reason.get() {
            self.send(|| LeaseEvent::Lost(reason.clone()));
        }
        first
    }
}

/// The server's expiry of a lease renewed by a renewal sent at `sent_at`
/// ([`LeaseEvent::Renewed::expires_at`]): the token's time part + the local
/// time from the acquire's reply (`acquired_at`) to `sent_at` + `ttl`.
pub(crate) fn server_expiry(
    token: u64,
    acquired_at: Instant,
    sent_at: Instant,
    ttl: std::time::Duration,
) -> SystemTime {
    let acquired_ms = token >> crate::token::TOKEN_TIME_SHIFT;
    SystemTime::UNIX_EPOCH
        + std::time::Duration::from_millis(acquired_ms)
        + sent_at.saturating_duration_since(acquired_at)
        + ttl
}

impl fmt::Debug for LeaseState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseState")
            .field("deadline", &self.deadline())
            .field("reason", &self.reason.get())
            .finish()
    }
}

#[cfg(test)]
mod tests;
