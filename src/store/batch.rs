//! Group commit of the light forms: writes of distinct keys that callers
//! ask for while an earlier one is in flight go to the server together, in
//! one command, once it returns.
//!
//! A write asked for while nothing is in flight is sent at once, alone,
//! as before: a lone caller waits for no one. Under load (many keys
//! acquired and released at once) each command then carries every write
//! that queued behind the one in flight, so the server's cost per command
//! (parsing, the majority wait, the reply: most of a small write's cost,
//! docs/mongodb-behaviour.md, B27) is shared. This is a database's group
//! commit applied to the client's side: the latency of one write is at most
//! the one in flight plus its own, and the throughput grows with the load.
//!
//! Store-agnostic: `MongoStore` groups its light acquires and releases
//! with it (`mongo::light`), and the in-memory twin its light releases
//! (`memory::light`), so that the simulation forms the same batches. The
//! queue and its one command in flight belong to the store (shared by
//! its clones). The caller that finds nothing in flight sends its own write
//! in its own future; the writes that queued meanwhile are sent by a task of
//! their own once it ends (or is dropped), which answers each caller
//! through a oneshot channel and sends again while more queued.

use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

/// Commands in flight per queue: one, so that the writes asked for
/// meanwhile wait for it and go together.
const IN_FLIGHT: usize = 1;

/// Most writes in one command; more queued are sent in further commands.
pub(crate) const MOST_PER_COMMAND: usize = 256;

/// A queue of writes of one form (see the module docs): requests `R`, one
/// answer `O` each. `O::default()` is the answer of a request whose
/// command was never sent or whose sender is gone: the callers read it as
/// "not applied, or unknown" and fall back on the general form.
pub(crate) struct Batcher<R, O>(Arc<Mutex<Queue<R, O>>>);

struct Queue<R, O> {
    in_flight: usize,
    pending: Vec<(R, oneshot::Sender<O>)>,
}

impl<R, O> Default for Batcher<R, O> {
    fn default() -> Self {
        Batcher(Arc::new(Mutex::new(Queue {
            in_flight: 0,
            pending: Vec::new(),
        })))
    }
}

impl<R, O> Clone for Batcher<R, O> {
    fn clone(&self) -> Self {
        Batcher(self.0.clone())
    }
}

impl<R: Send + 'static, O: Default + Send + 'static> Batcher<R, O> {
    fn queue(&self) -> MutexGuard<'_, Queue<R, O>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer to `request`: sent at once by `send` (given a batch of
    /// one) if nothing is in flight, else queued and sent with the others
    /// that queued, in batches of at most [`MOST_PER_COMMAND`]. `send`
    /// answers a batch in its order.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future of a request sent at once hands the queue on
    /// as if its command had returned; a queued request dropped before its
    /// batch is sent is left out of it.
    pub(crate) async fn submit<F, Fut>(&self, request: R, send: F) -> O
    where
        F: Fn(Vec<R>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Vec<O>> + Send + 'static,
    {
        let receiver = {
            let mut queue = self.queue();
            if queue.in_flight < IN_FLIGHT {
                queue.in_flight += 1;
                Err(request)
            } else {
                let (sender, receiver) = oneshot::channel();
                queue.pending.push((request, sender));
                Ok(receiver)
            }
        };
        match receiver {
            Ok(receiver) => receiver.await.unwrap_or_default(),
            Err(request) => {
                let slot = Slot {
                    batcher: self.clone(),
                    send: Some(send.clone()),
                };
                let answer = send(vec![request]).await.pop().unwrap_or_default();
                drop(slot);
                answer
            }
        }
    }

    /// The command in flight ended: sends what queued meanwhile (in a task
    /// of its own, which keeps the slot while more queue), or frees the slot.
    fn hand_on<F, Fut>(&self, send: F)
    where
        F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<O>> + Send + 'static,
    {
        {
            let mut queue = self.queue();
            if queue.pending.is_empty() || tokio::runtime::Handle::try_current().is_err() {
                queue.in_flight -= 1;
                queue.pending.clear();
                return;
            }
        }
        let batcher = self.clone();
        tokio::spawn(async move {
            // Frees the slot however the task ends; if it ends early (a
            // panic, the runtime's shutdown), what still queues is answered
            // `O::default()`.
            let mut slot = Freed(batcher.clone(), false);
            loop {
                let batch = {
                    let mut queue = batcher.queue();
                    queue.pending.retain(|(_, sender)| !sender.is_closed());
                    if queue.pending.is_empty() {
                        queue.in_flight -= 1;
                        slot.1 = true;
                        return;
                    }
                    let n = queue.pending.len().min(MOST_PER_COMMAND);
                    queue.pending.drain(..n).collect::<Vec<_>>()
                };
                let (requests, senders): (Vec<R>, Vec<_>) = batch.into_iter().unzip();
                let answers = send(requests).await;
                let mut answers = answers.into_iter();
                for sender in senders {
                    let _ = sender.send(answers.next().unwrap_or_default());
                }
            }
        });
    }
}

/// Frees the slot of the task that sends the queued requests when it ends.
/// (`true` once freed in the same lock that found the queue empty).
struct Freed<R, O>(Batcher<R, O>, bool);

impl<R, O> Drop for Freed<R, O> {
    fn drop(&mut self) {
        if self.1 {
            return;
        }
        let mut queue = self.0.0.lock().unwrap_or_else(|p| p.into_inner());
        queue.in_flight -= 1;
        queue.pending.clear();
    }
}

/// The slot of the command in flight, held by the caller that sent its
/// request at once: handed on when that command ends, or when the caller's
/// future is dropped before.
struct Slot<R: Send + 'static, O: Default + Send + 'static, F, Fut>
where
    F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<O>> + Send + 'static,
{
    batcher: Batcher<R, O>,
    send: Option<F>,
}

impl<R: Send + 'static, O: Default + Send + 'static, F, Fut> Drop for Slot<R, O, F, Fut>
where
    F: Fn(Vec<R>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<O>> + Send + 'static,
{
    fn drop(&mut self) {
        if let Some(send) = self.send.take() {
            self.batcher.hand_on(send);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::FutureExt;
    use tokio::sync::Notify;

    use super::*;

    /// A send that records each batch, waits for `go` and answers each
    /// request with itself times ten.
    fn recording(
        batches: Arc<Mutex<Vec<Vec<u32>>>>,
        go: Arc<Notify>,
    ) -> impl Fn(Vec<u32>) -> futures::future::BoxFuture<'static, Vec<u32>> + Clone + Send + Sync
    {
        move |requests: Vec<u32>| {
            let (batches, go) = (batches.clone(), go.clone());
            async move {
                batches.lock().unwrap().push(requests.clone());
                go.notified().await;
                requests.iter().map(|r| r * 10).collect()
            }
            .boxed()
        }
    }

    /// `requests` submitted at once, from one task: their answers, in order.
    fn submit_all<F, Fut>(
        batcher: &Batcher<u32, u32>,
        requests: std::ops::RangeInclusive<u32>,
        send: F,
    ) -> tokio::task::JoinHandle<Vec<u32>>
    where
        F: Fn(Vec<u32>) -> Fut + Clone + Send + Sync + 'static,
        Fut: Future<Output = Vec<u32>> + Send + 'static,
    {
        let submits = requests.map(|r| {
            let (batcher, send) = (batcher.clone(), send.clone());
            async move { batcher.submit(r, send).await }
        });
        tokio::spawn(futures::future::join_all(submits))
    }

    /// Yields to the other tasks until `done` holds.
    async fn until(mut done: impl FnMut() -> bool) {
        while !done() {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn the_first_request_goes_alone_and_those_asked_for_meanwhile_go_together() {
        let batcher: Batcher<u32, u32> = Batcher::default();
        let batches = Arc::default();
        let go = Arc::new(Notify::new());
        let send = recording(Arc::clone(&batches), go.clone());
        let answers = submit_all(&batcher, 1..=5, send);
        // Each batch waits for one `go`: the first, once the other four
        // queued behind it, then theirs.
        until(|| batcher.queue().pending.len() == 4).await;
        go.notify_one();
        until(|| batches.lock().unwrap().len() == 2).await;
        go.notify_one();
        assert_eq!(answers.await.unwrap(), [10, 20, 30, 40, 50]);
        assert_eq!(*batches.lock().unwrap(), [vec![1], vec![2, 3, 4, 5]]);
        assert_eq!(batcher.queue().in_flight, 0, "the slot is free again");
    }

    #[tokio::test]
    async fn a_dropped_first_request_hands_the_queue_on() {
        let batcher: Batcher<u32, u32> = Batcher::default();
        let batches = Arc::default();
        let go = Arc::new(Notify::new());
        let send = recording(Arc::clone(&batches), go.clone());
        let mut first = batcher.submit(1, send.clone()).boxed();
        assert!((&mut first).now_or_never().is_none(), "in flight");
        let second = tokio::spawn({
            let (batcher, send) = (batcher.clone(), send.clone());
            async move { batcher.submit(2, send).await }
        });
        until(|| !batcher.queue().pending.is_empty()).await;
        drop(first);
        until(|| batches.lock().unwrap().len() == 2).await;
        go.notify_one();
        assert_eq!(second.await.unwrap(), 20);
        assert_eq!(*batches.lock().unwrap(), [vec![1], vec![2]]);
    }

    #[tokio::test]
    async fn requests_a_batch_does_not_answer_get_the_default_and_the_slot_is_freed() {
        let batcher: Batcher<u32, u32> = Batcher::default();
        let go = Arc::new(Notify::new());
        let send = {
            let go = go.clone();
            move |requests: Vec<u32>| {
                let go = go.clone();
                async move {
                    go.notified().await;
                    // A batch of more answers none (a command that failed).
                    if requests.len() > 1 {
                        return Vec::new();
                    }
                    requests.iter().map(|r| r * 10).collect::<Vec<_>>()
                }
                .boxed()
            }
        };
        let answers = submit_all(&batcher, 1..=3, send.clone());
        until(|| batcher.queue().pending.len() == 2).await;
        // The first alone, then the batch of two, which answers none.
        go.notify_one();
        while !answers.is_finished() {
            go.notify_one();
            tokio::task::yield_now().await;
        }
        assert_eq!(answers.await.unwrap(), [10, 0, 0]);
        assert_eq!(batcher.queue().in_flight, 0);
        go.notify_one();
        assert_eq!(batcher.submit(4, send).await, 40, "later requests still go");
    }
}
