//! [`Mailbox`]: the handles' typed end of the actor's command channel.
//!
//! Every handle ([`LeaseManager`](crate::LeaseManager), [`Lease`](crate::Lease),
//! the election's leader context) talks to the actor through one of these
//! ([`Mailbox::call`]; the lease commands are typed methods here), the one
//! place where a closed channel or a dropped reply sender becomes
//! [`Error::Shutdown`]. Shape after the mongodb driver's
//! `ConnectionRequester` (a small typed handle per channel endpoint).

use std::time::Duration;

use mongodb::bson::Document;
use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use super::command::{Command, PlacedKey, Reply, WaiterId};
use crate::error::{Error, Result};
use crate::status::ReleaseOutcome;
use crate::store::DocumentWrite;

/// A sender of commands to the actor. Cheap to clone; the actor stops once
/// every mailbox is gone (it keeps only a weak one itself).
#[derive(Clone)]
pub(crate) struct Mailbox {
    commands: mpsc::UnboundedSender<Command>,
}

impl Mailbox {
    pub(crate) fn new(commands: mpsc::UnboundedSender<Command>) -> Self {
        Mailbox { commands }
    }

    /// Sends the command built by `command` around a fresh reply channel and
    /// awaits the reply.
    ///
    /// # Errors
    ///
    /// The actor's answer, or [`Error::Shutdown`] if the actor has stopped
    /// (the channel is closed, or the reply sender was dropped unanswered).
    ///
    /// # Cancel safety
    ///
    /// The command is sent at the first poll; dropping the future afterwards
    /// drops the reply, not the command.
    pub(crate) async fn call<T>(&self, command: impl FnOnce(Reply<T>) -> Command) -> Result<T> {
        let (respond_to, response) = oneshot::channel();
        self.send(command(respond_to))?;
        response.await.map_err(|_| Error::Shutdown)?
    }

    /// Whether the actor has begun to shut down (it closes its end first)
    /// or has stopped: no command is taken any more.
    pub(crate) fn is_closed(&self) -> bool {
        self.commands.is_closed()
    }

    /// Sends `command` without waiting for anything ([`Error::Shutdown`] if
    /// the actor has stopped).
    fn send(&self, command: Command) -> Result<()> {
        self.commands.send(command).map_err(|_| Error::Shutdown)
    }

    /// Releases one acquisition and awaits the outcome.
    pub(crate) async fn release(&self, key: PlacedKey, lease_id: Uuid) -> Result<ReleaseOutcome> {
        self.call(|respond_to| Command::Release {
            key,
            lease_id,
            respond_to: Some(respond_to),
        })
        .await
    }

    /// Releases one acquisition in the background (a dropped lease); the
    /// actor logs a failure. Nothing happens if the actor has stopped (it
    /// released its leases then).
    pub(crate) fn release_in_background(&self, key: PlacedKey, lease_id: Uuid) {
        let _ = self.send(Command::Release {
            key,
            lease_id,
            respond_to: None,
        });
    }

    /// Sets the payload of one acquisition and awaits the outcome.
    pub(crate) async fn set_payload(
        &self,
        key: PlacedKey,
        lease_id: Uuid,
        payload: Document,
    ) -> Result<()> {
        self.call(|respond_to| Command::SetPayload {
            key,
            lease_id,
            payload,
            respond_to,
        })
        .await
    }

    /// Renews one acquisition at once to `ttl`, which its renewals use from
    /// then on, and awaits the server's confirmation.
    pub(crate) async fn set_ttl(
        &self,
        key: PlacedKey,
        lease_id: Uuid,
        ttl: Duration,
    ) -> Result<()> {
        self.call(|respond_to| Command::SetTtl {
            key,
            lease_id,
            ttl,
            respond_to,
        })
        .await
    }

    /// Writes the document of an in-document lease (releasing it too if
    /// `write.release`) and awaits the document as written.
    pub(crate) async fn write_document(
        &self,
        key: PlacedKey,
        lease_id: Uuid,
        write: DocumentWrite,
    ) -> Result<Document> {
        self.call(|respond_to| Command::WriteDocument {
            key,
            lease_id,
            write,
            respond_to,
        })
        .await
    }

    /// Makes the actor check one acquisition now by a renewal, which marks
    /// it lost if it is gone (fire and forget; nothing if the actor has
    /// stopped).
    pub(crate) fn check_held(&self, key: PlacedKey, lease_id: Uuid) {
        let _ = self.send(Command::CheckHeld { key, lease_id });
    }

    /// Counts one more entry of a held lease (fire and forget: sent before
    /// any release of the entry it copies, so counted before it).
    pub(crate) fn reenter(&self, key: PlacedKey, lease_id: Uuid) {
        let _ = self.send(Command::Reenter { key, lease_id });
    }

    /// Binds held leases into one group; whether all were still held.
    pub(crate) async fn bind_group(&self, members: Vec<(PlacedKey, Uuid)>) -> Result<bool> {
        self.call(|respond_to| Command::BindGroup {
            members,
            respond_to,
        })
        .await
    }

    /// Removes a waiter whose acquire future was dropped (fire and forget).
    pub(crate) fn cancel_waiter(&self, key: PlacedKey, waiter: WaiterId) {
        let _ = self.send(Command::CancelWaiter { key, waiter });
    }
}
