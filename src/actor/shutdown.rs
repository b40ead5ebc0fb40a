//! Shutdown: closing the command channel, answering what was queued, failing
//! every waiter, releasing every held lease in batches, and answering the
//! `shutdown` calls once the releases are confirmed.

use futures::stream::FuturesUnordered;

use super::Actor;
use super::command::{Command, PlacedKey, Reply};
use super::write_stream::WriteStream;
use crate::error::Error;
use crate::status::LossReason;
use crate::store::Release;

/// Set once shutdown has begun.
pub(super) struct Closing {
    pub(super) responders: Vec<Reply<()>>,
    pub(super) error: Option<Error>,
}

impl Actor {
    pub(super) fn begin_shutdown(&mut self, respond_to: Option<Reply<()>>) {
        tracing::debug!(owner_id = %self.owner_id, "lease manager shutting down");
        self.closing = Some(Closing {
            responders: respond_to.into_iter().collect(),
            error: None,
        });
        self.commands.close();
        self.renewals = FuturesUnordered::new();
        self.renewals_waiting.clear();
        for place in &mut self.places {
            place.write_stream = WriteStream::Closed;
        }
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
            state.answer_waiters(|_| Some(Err(Error::Shutdown)));
            if let Some(timer) = state.unschedule() {
                self.timers.remove(&timer);
            }
        }
        self.leave_queues_at_shutdown();
        let by_place = self.held_by_place();
        self.delete_young_held_when_old_enough();
        self.take_all_held(LossReason::Shutdown);
        for (place, leases) in by_place {
            for batch in leases.chunks(self.timing.renewal_batch_size) {
                let keys = batch
                    .iter()
                    .map(|l| PlacedKey {
                        place,
                        key: l.key.clone(),
                    })
                    .collect();
                let release = self.store(place).release(Release::Leases(batch.to_vec()));
                self.spawn_store(release, |actor, result| {
                    actor.on_released_many(keys, None, result.map(|released| released.count))
                });
            }
        }
    }

    /// The actor has stopped: answers every `shutdown` call, with the first
    /// release error if the final release could not be confirmed.
    pub(super) fn answer_shutdown(&mut self) {
        if let Some(closing) = self.closing.take() {
            for respond_to in closing.responders {
                let _ = respond_to.send(closing.error.clone().map_or(Ok(()), Err));
            }
        }
    }
}
