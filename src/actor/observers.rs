//! Observer hubs: one task per observed key drives the store's stream of
//! states and forwards each state to every local subscriber.
//!
//! The actor (`Actor::on_observe`) spawns a hub on the first `Observe` of a
//! key and hands it later subscribers, each first given the last state the
//! hub forwarded. The hub ends when its last subscriber is gone (which also
//! closes the store's stream and its change stream), when the store's
//! stream ends, or when the manager stops.

use futures::future::BoxFuture;
use futures::stream::{BoxStream, FuturesUnordered};
use futures::{FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::Actor;
use super::command::{Changes, Reply};
use crate::error::Result;
use crate::info::LeaseInfo;
use crate::key::LeaseKey;

pub(crate) type Item = Result<Option<LeaseInfo>>;
pub(crate) type Subscriber = mpsc::UnboundedSender<Item>;

pub(crate) async fn run_hub(
    key: LeaseKey,
    mut source: BoxStream<'static, Item>,
    mut control: mpsc::UnboundedReceiver<Subscriber>,
    stop: CancellationToken,
) {
    let mut subscribers: Vec<Subscriber> = Vec::new();
    let mut gone = FuturesUnordered::new();
    let mut last: Option<Item> = None;
    let mut accepting = true;
    tracing::debug!(%key, "observing");
    loop {
        tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            subscriber = control.recv(), if accepting => match subscriber {
                Some(subscriber) => {
                    if let Some(item) = &last {
                        let _ = subscriber.send(item.clone());
                    }
                    gone.push(closed(subscriber.clone()));
                    subscribers.push(subscriber);
                }
                None => break,
            },
            item = source.next() => match item {
                Some(item) => {
                    subscribers.retain(|s| s.send(item.clone()).is_ok());
                    let failed = item.is_err();
                    last = Some(item);
                    if failed {
                        break;
                    }
                }
                None => break,
            },
            Some(()) = gone.next(), if !gone.is_empty() => {
                subscribers.retain(|s| !s.is_closed());
                if subscribers.is_empty() {
                    // Refuse new subscribers (the actor then starts a new hub),
                    // but serve those already queued.
                    control.close();
                    accepting = false;
                    while let Ok(subscriber) = control.try_recv() {
                        if let Some(item) = &last {
                            let _ = subscriber.send(item.clone());
                        }
                        gone.push(closed(subscriber.clone()));
                        subscribers.push(subscriber);
                    }
                    if subscribers.is_empty() {
                        break;
                    }
                }
            }
        }
    }
    tracing::debug!(%key, "observing stopped");
}

/// Completes when the subscriber's receiver is dropped.
fn closed(subscriber: Subscriber) -> BoxFuture<'static, ()> {
    async move { subscriber.closed().await }.boxed()
}

impl Actor {
    /// Subscribes the caller to the key's hub, starting one if needed.
    pub(super) fn on_observe(&mut self, key: LeaseKey, respond_to: Reply<Changes>) {
        self.observers.retain(|_, hub| !hub.is_closed());
        let (subscriber, observer) = mpsc::unbounded_channel();
        let _ = respond_to.send(Ok(observer));
        let subscriber = match self.observers.get(&key) {
            Some(hub) => match hub.send(subscriber) {
                Ok(()) => return,
                // The hub is ending: start a new one.
                Err(mpsc::error::SendError(subscriber)) => subscriber,
            },
            None => subscriber,
        };
        let (hub, control) = mpsc::unbounded_channel();
        let _ = hub.send(subscriber);
        let source = self
            .store(super::command::Place::LOCKS)
            .observe(key.clone());
        tokio::spawn(run_hub(
            key.clone(),
            source,
            control,
            self.stop_observers.clone(),
        ));
        self.observers.insert(key, hub);
    }
}
