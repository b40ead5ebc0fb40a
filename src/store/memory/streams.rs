//! The twin's streams: the writes that may change who holds a key (a change
//! stream's twin, [`Store::watch_releases`](crate::store::Store::watch_releases))
//! and the states of one key ([`Store::observe`](crate::store::Store::observe)).
//! A simulation's fault plan may delay, duplicate or drop each write
//! announced to a stream of writes, or fail the stream
//! ([`MemoryStore::set_event_faults`]).

use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{BoxStream, FuturesUnordered};
use futures::{FutureExt, StreamExt};

use super::control::EventFate;
use super::doc::Doc;
use super::store::MemoryStore;
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::store::{Announced, Announcement};

/// What `observe` last reported: the document without its fairness marks,
/// whether it was held and by how many live holders of a shared or
/// semaphore key, and the foreign holder's lock document.
type Observed = (Option<Doc>, (bool, usize), Option<mongodb::bson::Document>);

impl MemoryStore {
    /// [`Store::watch_releases`](crate::store::Store::watch_releases):
    /// of the lock collection's writes, those [`Announcement::is_announced`]
    /// selects for `announced` and this owner, as the server's `$match`
    /// does; an in-document place announces the same writes either way.
    pub(super) fn writes(&self, announced: Announced) -> BoxStream<'static, Result<Announcement>> {
        if !self.change_streams {
            let error = Error::UnusableCollection {
                reason: "no change streams on a standalone server".into(),
            };
            return futures::stream::iter([Err(error)]).boxed();
        }
        let control = self.control.clone();
        let announced = if self.place.is_some() {
            Announced::Writes
        } else {
            announced
        };
        let owner = self.owner.clone();
        let writes = move |released: tokio::sync::broadcast::Receiver<Announcement>| {
            let delayed = FuturesUnordered::<BoxFuture<'static, Announcement>>::new();
            let state = (Some(released), delayed, (control.clone(), owner.clone()));
            futures::stream::unfold(
                state,
                move |(mut released, mut delayed, reader)| async move {
                    let (control, owner) = &reader;
                    loop {
                        let receiver = released.as_mut()?;
                        let write = tokio::select! {
                            biased;
                            Some(write) = delayed.next(), if !delayed.is_empty() => write,
                            // A `getMore` with nothing to announce answers
                            // empty, and its reader, if it still reads,
                            // sends the next one (`MemoryDb::release_readers`).
                            () = tokio::time::sleep(crate::store::RELEASE_EVENTS_AWAIT) => continue,
                            received = receiver.recv() => match received {
                                Ok(write) if !write.is_announced(announced, owner) => continue,
                                Ok(write) => match control.event_fate() {
                                    EventFate::Drop => continue,
                                    EventFate::Restart => {
                                        let error = Error::Unreachable {
                                            waited: Duration::ZERO,
                                            reason: "injected change stream failure".into(),
                                            source: None,
                                        };
                                        return Some((Err(error), (None, delayed, reader)));
                                    }
                                    EventFate::Deliver { copies, delay } => {
                                        // Its timer starts when first polled.
                                        let later = |write: Announcement| {
                                            async move {
                                                tokio::time::sleep(delay).await;
                                                write
                                            }
                                            .boxed()
                                        };
                                        delayed.extend((1..copies).map(|_| later(write.clone())));
                                        if !delay.is_zero() {
                                            delayed.push(later(write));
                                            continue;
                                        }
                                        write
                                    }
                                },
                                // Writes fell out of its buffer while it
                                // was not read: it fails, as a change
                                // stream whose resume point fell off the
                                // oplog does (nothing is skipped silently).
                                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                                    let error = Error::Unreachable {
                                        waited: Duration::ZERO,
                                        reason: "writes missed while the stream was not read".into(),
                                        source: None,
                                    };
                                    return Some((Err(error), (None, delayed, reader)));
                                }
                                Err(tokio::sync::broadcast::error::RecvError::Closed) => return None,
                            },
                        };
                        let next = (released, delayed, reader);
                        return Some((Ok(write), next));
                    }
                },
            )
        };
        if !*self.opening_held.borrow() {
            let released = self.db.subscribe_releases();
            return self.read(
                futures::stream::iter([Ok(Announcement::Opened)])
                    .chain(writes(released))
                    .boxed(),
            );
        }
        // Subscribed only once let open: writes meanwhile are missed.
        let (db, mut held) = (self.db.clone(), self.opening_held.subscribe());
        let opened = futures::stream::once(async move {
            // The sender lives in this store; if it is gone, open anyway.
            let _ = held.wait_for(|held| !*held).await;
            db.subscribe_releases()
        })
        .flat_map(move |released| {
            futures::stream::iter([Ok(Announcement::Opened)]).chain(writes(released))
        });
        self.read(opened.boxed())
    }

    /// `stream`, noting in [`MemoryDb::release_readers`] when its reader
    /// last polled it and found nothing yet: a `getMore` waiting on the
    /// server.
    fn read(
        &self,
        mut stream: BoxStream<'static, Result<Announcement>>,
    ) -> BoxStream<'static, Result<Announcement>> {
        let reader = self.db.reader();
        futures::stream::poll_fn(move |cx| {
            let polled = stream.poll_next_unpin(cx);
            *super::db::lock(&reader) = polled.is_pending().then(tokio::time::Instant::now);
            polled
        })
        .boxed()
    }

    /// The latest state after each change, and at each expiry. Unlike
    /// `MongoStore`, changes applied between two wake-ups of the observer are
    /// merged (timing tests do not need every intermediate state).
    pub(super) fn states(&self, key: LeaseKey) -> BoxStream<'static, Result<Option<LeaseInfo>>> {
        let db = self.db.clone();
        let changed = db.subscribe_changes();
        let state = (db, changed, key, None::<Observed>, true);
        futures::stream::unfold(
            state,
            |(db, mut changed, key, mut last, first)| async move {
                let mut first = first;
                loop {
                    if !first {
                        // The lease's expiry, or a holder's (the first to
                        // expire changes the key's holders).
                        // A foreign holder's lock: its expiry by its own rule.
                        let expiry = last.as_ref().and_then(|(doc, (held, _), foreign)| {
                            if let Some(foreign) = foreign.as_ref().filter(|_| *held) {
                                let now = db.server_now();
                                let info = db.foreign_info(&key, foreign, now);
                                let left = info.expires_at.duration_since(info.server_time);
                                return left.ok().filter(|d| !d.is_zero()).map(|d| now + d);
                            }
                            let doc = doc.as_ref().filter(|_| *held)?;
                            let first = doc
                                .holders
                                .iter()
                                .map(|h| h.exp)
                                .filter(|e| *e > db.server_now());
                            Some(first.min().unwrap_or(doc.exp))
                        });
                        tokio::select! {
                            result = changed.changed() => {
                                if result.is_err() {
                                    return None;
                                }
                            }
                            _ = async {
                                match expiry {
                                    Some(at) => tokio::time::sleep_until(db.real_at(at)).await,
                                    None => std::future::pending().await,
                                }
                            } => {}
                        }
                    }
                    first = false;
                    changed.borrow_and_update();
                    let now = db.server_now();
                    let stored = db.doc(&key);
                    let doc = stored.as_ref().map(|d| d.observed());
                    let foreign = db.foreign(&key);
                    let held = match &foreign {
                        Some(foreign) => (db.foreign_info(&key, foreign, now).held, 0),
                        None => doc.as_ref().map_or((false, 0), |d| {
                            (d.live_kind(now).is_some(), d.live_holders(now).count())
                        }),
                    };
                    let state = (doc.clone(), held, foreign.clone());
                    if last.as_ref() == Some(&state) {
                        continue;
                    }
                    last = Some(state);
                    let info = match foreign {
                        Some(foreign) => Some(db.foreign_info(&key, &foreign, now)),
                        None => stored.map(|d| db.info(&key, &d, now)),
                    };
                    return Some((Ok(info), (db, changed, key, last, false)));
                }
            },
        )
        .boxed()
    }
}
