//! Prompt wake-up on releases by other owners: the actor's one change stream
//! of releases (`Actor::release_watch`), open only while some key waits for
//! another owner's lease; a release of that key moves its retry to now.

use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::time::Instant;

use super::{Actor, Attempt};
use crate::error::Result;
use crate::key::LeaseKey;

/// The state of the actor's one stream of releases.
pub(super) enum ReleaseWatch {
    /// Not open: no key waits for another owner.
    Closed,
    Open(BoxStream<'static, Result<LeaseKey>>),
    /// It failed; reopen no earlier than this (polling still works meanwhile).
    Failed {
        retry_at: Instant,
    },
    /// The deployment has no change streams (a standalone server): poll only.
    Unsupported,
}

/// Longest random delay before a waiter woken by a release tries again.
pub(super) const RELEASE_WAKE_JITTER: std::time::Duration = std::time::Duration::from_millis(5);

/// How long a failed release stream stays closed before it is reopened.
const RELEASE_WATCH_RETRY: std::time::Duration = std::time::Duration::from_secs(5);

impl Actor {
    /// Opens the stream of releases if it is not open (or failed long enough ago).
    pub(super) fn open_release_watch(&mut self) {
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
    pub(super) fn close_release_watch_if_unneeded(&mut self) {
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
    pub(super) fn on_release_event(&mut self, event: Option<Result<LeaseKey>>) {
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
                    tracing::trace!(%key, "released elsewhere: retrying now");
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
}

/// The next item of the release stream, or never if it is not open.
pub(super) async fn next_release(watch: &mut ReleaseWatch) -> Option<Result<LeaseKey>> {
    match watch {
        ReleaseWatch::Open(stream) => stream.next().await,
        _ => std::future::pending().await,
    }
}
