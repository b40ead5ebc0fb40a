//! Messages from the handles ([`LeaseManager`](crate::LeaseManager),
//! [`Lease`](crate::Lease)) to the actor, and the data it answers with.

use std::sync::Arc;
use std::time::Duration;

use mongodb::bson::Document;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::mailbox::Mailbox;
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::kind::{LeaseKind, LeaseShape};
use crate::status::{LeaseState, ReleaseOutcome};
use crate::store::{DocumentWrite, LockPlace};

/// The reply channel of a command.
pub(crate) type Reply<T> = oneshot::Sender<Result<T>>;

/// The changes of one observed key, in order, as the actor answers
/// `Observe`: the handle wraps them in a [`LeaseObserver`](crate::LeaseObserver).
pub(crate) type Changes = mpsc::UnboundedReceiver<Result<Option<LeaseInfo>>>;

/// Identifies one waiting `acquire` call, so that dropping its future can
/// remove it from the queue.
pub(crate) type WaiterId = u64;

/// Which store of the actor a lease lives in: [`Place::LOCKS`] (the lock
/// collection) or a user collection of in-document leases, in the order
/// [`LeaseManager::documents`](crate::LeaseManager::documents) opened them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Place(pub(crate) u16);

impl Place {
    /// The lock collection.
    pub(crate) const LOCKS: Place = Place(0);
}

/// What the actor's per-key state is keyed by: a key in one place.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct PlacedKey {
    pub place: Place,
    pub key: LeaseKey,
}

impl PlacedKey {
    /// `key` in the lock collection.
    pub(crate) fn lock(key: LeaseKey) -> Self {
        PlacedKey {
            place: Place::LOCKS,
            key,
        }
    }
}

impl std::fmt::Display for PlacedKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.place == Place::LOCKS {
            write!(f, "{}", self.key)
        } else {
            write!(f, "{} (documents #{})", self.key, self.place.0)
        }
    }
}

/// A fresh acquisition, as the actor hands it to the waiter: data, from
/// which the handle builds the caller's [`Lease`](crate::Lease). A grant
/// dropped unread (its caller went away while the reply was on its way)
/// releases its lease in the background, as a dropped `Lease` does: a
/// grant is never leaked.
pub(crate) struct Granted {
    /// `None` once [`Granted::take`] handed it to the handle.
    pub(super) lease: Option<GrantedLease>,
    /// In-document leases: the document as the acquire left it.
    pub(super) document: Option<Document>,
}

/// What a granted lease is made of. A clone is another entry of the same
/// lease: only [`Lease::reenter`](crate::Lease::reenter) makes one, after
/// telling the actor (`Command::Reenter`).
#[derive(Clone)]
pub(crate) struct GrantedLease {
    pub key: PlacedKey,
    /// Where the lock lives (for the transaction helper).
    pub place: Arc<LockPlace>,
    pub owner_id: Arc<str>,
    pub lease_id: Uuid,
    pub fencing_token: u64,
    pub ttl: Duration,
    pub kind: LeaseKind,
    /// Shared with the actor: local deadline, loss reason.
    pub state: Arc<LeaseState>,
    pub mailbox: Mailbox,
}

impl Granted {
    /// The lease and the document, for the handle; the grant no longer
    /// releases the lease when dropped (the caller's `Lease` does).
    pub(crate) fn take(mut self) -> (GrantedLease, Option<Document>) {
        let lease = self.lease.take().expect("a grant is taken once, by value");
        (lease, self.document.take())
    }
}

impl Drop for Granted {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            lease
                .mailbox
                .release_in_background(lease.key, lease.lease_id);
        }
    }
}

/// A local caller waiting in an `acquire` or `try_acquire`.
pub(crate) struct Waiter {
    pub(crate) id: WaiterId,
    pub(crate) mode: AcquireMode,
    /// The TTL its lease is to have (validated by the handle).
    pub(crate) ttl: Duration,
    /// In-document leases: the fields to create a missing document with.
    pub(crate) create: Option<Document>,
    /// Its lease's kind and minimum hold (validated by the handle).
    pub(crate) shape: LeaseShape,
    /// Its holder, if named (`Acquire::caller`), and whether it
    /// re-enters a lease that holder holds on the key (`reentry.rs`).
    pub(crate) holder: Option<crate::caller::CallerId>,
    pub(crate) reentrant: bool,
    /// The payload its acquiring write is to write (validated by the handle).
    pub(crate) payload: Option<Document>,
    /// Its lease is held at most its TTL, never renewed
    /// (`Acquire::hold_at_most`).
    pub(crate) at_most: bool,
    pub(crate) respond_to: Reply<Option<Granted>>,
}

impl Waiter {
    /// Whether a lease can be handed to it, by a handoff to a local waiter
    /// (`handoff`) or granted on the event of a handoff to its
    /// registration (`queue`): it asks for a plain lease
    /// ([`LeaseShape::is_plain`]), renewed (not held at most a duration: a
    /// lease granted on the event is renewed at once), without a payload to
    /// write with the acquisition (which only the general acquire writes).
    pub(crate) fn can_be_handed(&self) -> bool {
        self.shape.is_plain() && !self.at_most && self.payload.is_none()
    }
}

/// How an acquire waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AcquireMode {
    /// Queue behind local holders and waiters; retry against MongoDB until acquired.
    Wait,
    /// One attempt; `None` if the key is held, locally or by another owner.
    Try,
}

/// A request to the actor. Every command that carries a `respond_to` is
/// answered, or its sender is dropped, which the handle reports as
/// [`Error::Shutdown`].
pub(crate) enum Command {
    Acquire {
        key: PlacedKey,
        waiter: Waiter,
    },
    /// The acquire future of `waiter` was dropped before it completed.
    CancelWaiter {
        key: PlacedKey,
        waiter: WaiterId,
    },
    /// Release one lease; `respond_to` is `None` when the lease was dropped.
    Release {
        key: PlacedKey,
        lease_id: Uuid,
        respond_to: Option<Reply<ReleaseOutcome>>,
    },
    ReleaseAll {
        respond_to: Reply<u64>,
    },
    Shutdown {
        respond_to: Reply<()>,
    },
    /// Read one key (of the lock collection, or one document's lease) with
    /// the server's now.
    Inspect {
        key: PlacedKey,
        respond_to: Reply<Option<LeaseInfo>>,
    },
    /// An operator's force release of `key` (sent to the store by the
    /// manager) ended `was`: a lease of this manager it ended is lost,
    /// before the answer.
    ForceReleased {
        key: LeaseKey,
        was: LeaseInfo,
        respond_to: Reply<()>,
    },
    /// Change a semaphore key's number of permits (`Store::set_permits`).
    SetPermits {
        key: LeaseKey,
        permits: u32,
        respond_to: Reply<crate::kind::PermitsChange>,
    },
    /// Set the payload of a lease this manager holds.
    SetPayload {
        key: PlacedKey,
        lease_id: Uuid,
        payload: Document,
        respond_to: Reply<()>,
    },
    /// Renew a lease this manager holds at once to a new TTL, which its
    /// renewals use from then on.
    SetTtl {
        key: PlacedKey,
        lease_id: Uuid,
        ttl: Duration,
        respond_to: Reply<()>,
    },
    /// Open (or find) the place of in-document leases on a user collection.
    OpenDocuments {
        collection: String,
        field: String,
        lock_id: Option<std::sync::Arc<crate::lock_id_fields::LockIdFields>>,
        respond_to: Reply<Place>,
    },
    /// Write the document of an in-document lease this manager holds (and
    /// release the lease too if `write.release`).
    WriteDocument {
        key: PlacedKey,
        lease_id: Uuid,
        write: DocumentWrite,
        respond_to: Reply<Document>,
    },
    /// Check a held lease now, by a renewal (fire and forget): the
    /// transaction helper found it not held.
    CheckHeld {
        key: PlacedKey,
        lease_id: Uuid,
    },
    /// Subscribe to the changes of a key.
    Observe {
        key: LeaseKey,
        respond_to: Reply<Changes>,
    },
    /// One more entry of a held lease ([`Lease::reenter`](crate::Lease::reenter)).
    Reenter {
        key: PlacedKey,
        lease_id: Uuid,
    },
    /// Bind held leases into a group whose members end together
    /// (`lease_group.rs`); answers whether all of them were still held.
    BindGroup {
        members: Vec<(PlacedKey, Uuid)>,
        respond_to: Reply<bool>,
    },
}

impl Command {
    /// Answers the command with `error`, whatever it asked; a command without
    /// a reply channel (a cancelled waiter, the release of a dropped lease) is
    /// just dropped.
    pub(crate) fn fail(self, error: Error) {
        fn send<T>(respond_to: Reply<T>, error: Error) {
            let _ = respond_to.send(Err(error));
        }
        match self {
            Command::CancelWaiter { .. } | Command::CheckHeld { .. } | Command::Reenter { .. } => {}
            Command::Release { respond_to, .. } => {
                if let Some(respond_to) = respond_to {
                    send(respond_to, error);
                }
            }
            Command::Acquire { waiter, .. } => send(waiter.respond_to, error),
            Command::ReleaseAll { respond_to } => send(respond_to, error),
            Command::Shutdown { respond_to } | Command::SetPayload { respond_to, .. } => {
                send(respond_to, error)
            }
            Command::Inspect { respond_to, .. } => send(respond_to, error),
            Command::ForceReleased { respond_to, .. } => send(respond_to, error),
            Command::SetTtl { respond_to, .. } => send(respond_to, error),
            Command::SetPermits { respond_to, .. } => send(respond_to, error),
            Command::Observe { respond_to, .. } => send(respond_to, error),
            Command::OpenDocuments { respond_to, .. } => send(respond_to, error),
            Command::WriteDocument { respond_to, .. } => send(respond_to, error),
            Command::BindGroup { respond_to, .. } => send(respond_to, error),
        }
    }
}
