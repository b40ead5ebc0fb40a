//! **Watch**: the change streams. Writes to lock documents by anyone
//! ([`release_events_pipeline`], [`key_write`]), and the states of one key
//! for observers: a change stream when the deployment has one, jittered
//! polling otherwise.
//!
//! With a change stream no change is lost ("Observers never skip a change"
//! in ARCHITECTURE.md): never a re-read, which after two quick takeovers
//! would skip a term, and the stream starts at the operation time of the
//! initial read. A lease that expires without a
//! takeover writes nothing, so no event announces it: a re-read is scheduled
//! for the expiry, by the server-relative time to expiry, and reports the
//! expiry only if the document is still the one last seen.
//!
//! Without a change stream (a standalone server: error 40573), the key is
//! read about every [`POLL_INTERVAL`] (jittered) and at each known expiry;
//! states that last less than a poll interval can then be missed.

use super::handle::{MongoStore, command_code};
use super::rules::{LockPath, announced, freed, key_filter};
use crate::backoff::retry_delay;
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::store::{Announced, Announcement, KeyWrite, field, is_our_layout, lease_info};
use futures::stream::BoxStream;
use futures::{FutureExt, StreamExt};
use mongodb::bson::{Bson, Document, Timestamp, doc};
use mongodb::change_stream::ChangeStream;
use mongodb::change_stream::event::{ChangeStreamEvent, OperationType, ResumeToken};
use std::time::{Duration, SystemTime};
use tokio::sync::mpsc;
use tokio::time::Instant;
/// The change-stream stages of `watch_releases`: the writes its contract
/// ([`Store::watch_releases`](crate::store::Store::watch_releases)) names,
/// filtered on the server (with [`Announced::Waits`], `owner` the stream's
/// owner id, as [`Announcement::is_announced`] selects them), each reduced
/// to what [`key_write`] reads (`lid`, `aid` and `tok` of the full
/// document or of `updatedFields`; docs/mongodb-behaviour.md, B12).
pub(super) fn release_events_pipeline(announced: Announced, owner: &str) -> [Document; 2] {
    let updated = |name: &str| format!("updateDescription.updatedFields.{name}");
    let full = |name: &str| format!("fullDocument.{name}");
    let removed =
        doc! { "updateDescription.removedFields": { "$in": [field::LEASE_ID, field::OWNER] } };
    let holders_released = doc! { updated(field::RELEASED_AT): { "$exists": true } };
    let revocation = doc! { updated(field::REVOCATION): { "$exists": true } };
    let matched = match announced {
        Announced::Writes => doc! { "$or": [
            { "operationType": { "$in": ["delete", "insert", "replace"] } },
            { "operationType": "update", "$or": [
                { updated(field::LEASE_ID): { "$exists": true } },
                { updated(field::OWNER): { "$exists": true } },
                removed, holders_released, revocation,
            ]},
        ]},
        Announced::Waits => doc! { "$or": [
            { "operationType": "delete" },
            { "operationType": { "$in": ["insert", "replace"] }, "$or": [
                { full(field::LEASE_ID): { "$exists": false } },
                { full(field::OWNER): owner },
            ]},
            { "operationType": "update", "$or": [
                { updated(field::OWNER): owner },
                removed, holders_released, revocation,
            ]},
        ]},
    };
    [
        doc! { "$match": matched },
        doc! { "$project": {
            "operationType": 1,
            "documentKey._id": 1,
            format!("fullDocument.{}", field::LEASE_ID): 1,
            format!("fullDocument.{}", field::OWNER): 1,
            format!("fullDocument.{}", field::TOKEN): 1,
            updated(field::LEASE_ID): 1,
            updated(field::OWNER): 1,
            updated(field::TOKEN): 1,
            updated(field::RELEASED_AT): 1,
            updated(field::REVOCATION): 1,
            "updateDescription.removedFields": 1,
            HOLDERS_CHANGED: { "$anyElementTrue": [{ "$map": {
                "input": { "$objectToArray": { "$ifNull": ["$updateDescription.updatedFields", {}] } },
                "in": { "$eq": [{ "$arrayElemAt": [{ "$split": ["$$this.k", "."] }, 0] }, field::HOLDERS] },
            }}]},
        }},
    ]
}

/// Field of the events of [`release_events_pipeline`]: whether the update
/// changed `hs` (its `updatedFields` name `hs` or `hs.<i>...`), computed on
/// the server since those names are not known in advance.
pub(super) const HOLDERS_CHANGED: &str = "holders";

/// Reads one event of [`release_events_pipeline`] (a raw change event
/// document) as [`LockPath::key_write`] does at the top of a lock document,
/// reading an update from its `updateDescription`. `None` for an event of
/// another kind, one missing the fields its kind carries
/// (`documentKey._id`, `fullDocument`, `updateDescription`), or the update
/// of a holder's acquisition on a shared or semaphore key (`hs` changed
/// without `rl`: the key's other holders keep their leases, and nothing was
/// freed).
pub(super) fn key_write(event: &Document) -> Option<KeyWrite> {
    LockPath::TOP.key_write(event, |key, event| {
        let update = event.get_document("updateDescription").ok()?;
        let empty = Document::new();
        let updated = update.get_document("updatedFields").unwrap_or(&empty);
        let removed = |name: &str| {
            update
                .get_array("removedFields")
                .is_ok_and(|r| r.iter().any(|f| f.as_str() == Some(name)))
        };
        // A holder added to `hs` (its entry, with the key's `aid`, `tok`,
        // ...) takes nothing from the other holders, and frees nothing.
        let holders = |name: &String| {
            name == field::HOLDERS || name.starts_with(&format!("{}.", field::HOLDERS))
        };
        if (updated.keys().any(holders) || event.get_bool(HOLDERS_CHANGED) == Ok(true))
            && !updated.contains_key(field::RELEASED_AT)
            && !updated.contains_key(field::LEASE_ID)
            && !removed(field::LEASE_ID)
        {
            return None;
        }
        // A holder removed from `hs` (`rl` set) frees a place on the key.
        if updated.contains_key(field::RELEASED_AT) {
            return Some(freed(key));
        }
        Some(announced(
            key,
            removed(field::LEASE_ID),
            updated.get(field::LEASE_ID),
            updated.get(field::OWNER),
            updated.get(field::TOKEN),
        ))
    })
}

/// Reads one event of [`release_events_pipeline`] as an announcement: a
/// revocation's request (an update that sets `rv` alone,
/// "Revocation" in `store`), or else as [`key_write`] reads it.
pub(super) fn announcement(event: &Document) -> Option<Announcement> {
    let updated = event
        .get_document("updateDescription")
        .and_then(|u| u.get_document("updatedFields"));
    if let Ok(updated) = updated
        && updated.len() == 1
        && let Ok(request) = updated.get_document(field::REVOCATION)
    {
        return Some(Announcement::RevocationRequested {
            key: super::rules::event_key(event)?,
            by: request
                .get_str(field::OWNER)
                .unwrap_or_default()
                .to_string(),
        });
    }
    key_write(event).map(Announcement::Write)
}

/// Mean delay between two reads when polling (jittered by ±20 %).
pub(crate) const POLL_INTERVAL: Duration = Duration::from_millis(500);

/// First and longest delay before retrying after a transient error.
const RETRY_INITIAL: Duration = Duration::from_millis(50);
const RETRY_MAX: Duration = Duration::from_secs(2);

/// ChangeStreamHistoryLost: the resume point fell off the oplog.
const HISTORY_LOST: i32 = 286;

type Item = Result<Option<LeaseInfo>>;

/// The states of `key` as a `'static` stream (see the module docs).
pub(super) fn observe(store: MongoStore, key: LeaseKey) -> BoxStream<'static, Item> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let producer = Observer {
        store,
        key,
        tx,
        doc: None,
        emitted: None,
        check_at: None,
    }
    .run();
    let items = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    let producer = producer.into_stream().filter_map(|()| async { None });
    futures::stream::select(items, producer).boxed()
}

/// How a change stream session ended.
enum WatchEnd {
    /// The deployment has no change streams: poll instead.
    Unsupported,
    /// Start over from a fresh read (invalidated, history lost, inconsistent).
    Restart,
    /// The consumer is gone, or a permanent error was reported.
    Stop,
}

struct Observer {
    store: MongoStore,
    key: LeaseKey,
    tx: mpsc::UnboundedSender<Item>,
    /// The last known lock document, as stored (no `now`).
    doc: Option<Document>,
    /// The last state sent: document and whether it was held.
    emitted: Option<(Option<Document>, bool)>,
    /// When to re-read to see the last known lease expire (local clock).
    check_at: Option<Instant>,
}

impl Observer {
    async fn run(mut self) {
        let mut failures = 0;
        loop {
            let start = match self.read(true).await {
                Ok((doc, now, operation_time)) => {
                    failures = 0;
                    self.doc = doc;
                    self.emit(now);
                    operation_time
                }
                Err(e) => {
                    if !self.retry_later(e, &mut failures).await {
                        return;
                    }
                    continue;
                }
            };
            match self.watch(start).await {
                WatchEnd::Unsupported => return self.poll().await,
                WatchEnd::Restart => {}
                WatchEnd::Stop => return,
            }
        }
    }

    /// After an error: `false` (and the error sent) if it is permanent, or
    /// once the consumer is gone; otherwise waits a jittered backoff.
    async fn retry_later(&mut self, e: Error, failures: &mut u32) -> bool {
        if !e.is_transient() {
            let _ = self.tx.send(Err(e));
            return false;
        }
        tracing::warn!(key = %self.key, error = %e, "observing a lease: transient error; retrying");
        let delay = retry_delay(*failures, RETRY_INITIAL, RETRY_MAX, None);
        *failures = failures.saturating_add(1);
        tokio::select! {
            _ = tokio::time::sleep(delay) => true,
            _ = self.tx.closed() => false,
        }
    }

    /// The projection of [`read`](Self::read): the lease's fields, and a
    /// foreign lock's as its rule reads them (a change event's full document
    /// of one is never judged here: [`reread`](Self::reread)).
    fn projection(&self) -> Document {
        self.store
            .with_foreign_fields(super::read::info_projection())
    }

    /// Reads the key with the server's now; with `session`, also returns the
    /// operation time of the read (a replica set's cluster time).
    async fn read(
        &self,
        session: bool,
    ) -> Result<(Option<Document>, SystemTime, Option<Timestamp>)> {
        let coll = self.store.coll();
        let filter = key_filter(&self.key);
        let projection = self.projection();
        let (found, operation_time) = if session {
            self.store
                .bounded(async {
                    let mut session = coll.client().start_session().await?;
                    let found = coll
                        .find_one(filter)
                        .projection(projection)
                        .session(&mut session)
                        .await?;
                    Ok((found, session.operation_time()))
                })
                .await?
        } else {
            let found = self
                .store
                .bounded(coll.find_one(filter).projection(projection))
                .await?;
            (found, None)
        };
        let (doc, now) = without_now(found);
        Ok((doc, now, operation_time))
    }

    /// [`read`](Self::read) as of cluster time `at` (`find` with read
    /// concern `snapshot` and `atClusterTime`, MongoDB 5.0+).
    async fn read_at(&self, at: Timestamp) -> Result<(Option<Document>, SystemTime)> {
        let coll = self.store.coll();
        let command = doc! {
            "find": coll.name(),
            "filter": key_filter(&self.key),
            "projection": self.projection(),
            "limit": 1,
            "singleBatch": true,
            "readConcern": { "level": "snapshot", "atClusterTime": at },
        };
        let database = coll.client().database(&coll.namespace().db);
        let reply = self.store.bounded(database.run_command(command)).await?;
        let found = reply
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .ok()
            .and_then(|batch| batch.first()?.as_document().cloned());
        Ok(without_now(found))
    }

    /// Sends the last known state, judged at `server_time`, unless it is the
    /// state sent last. Schedules the expiry check of a held lease.
    fn emit(&mut self, server_time: SystemTime) {
        let info = self
            .doc
            .as_ref()
            .map(|d| lease_info(&self.key, d, server_time));
        let held = info.as_ref().is_some_and(|i| i.held);
        // A foreign holder's lock without an expiry by its rule has none to
        // check: its deletion is an event.
        // A shared or semaphore key changes when its first holder expires.
        let expires = |i: &&LeaseInfo| !i.foreign || i.expires_at > i.server_time;
        self.check_at = info.as_ref().filter(|i| i.held && expires(i)).map(|i| {
            match i.holders.iter().map(|h| h.expires_at).min() {
                Some(first) => {
                    Instant::now() + first.duration_since(i.server_time).unwrap_or_default()
                }
                None => Instant::now() + i.time_to_expiry(),
            }
        });
        // The fields a read projects (a change event's full document has
        // others, e.g. those restated for other clients), less the marks of
        // the fairness scheme (`wt`, `yu`, `xw`) and the time of the last
        // release of a holder (`rl`), which are not a change of lease.
        let read = self.projection();
        let marks = [
            field::WAITING_SINCE,
            field::YIELD_UNTIL,
            field::EXCLUSIVE_WAITER,
            field::RELEASED_AT,
        ];
        let lease_fields = self.doc.as_ref().map(|d| {
            let kept =
                |k: &String| k == field::ID || read.contains_key(k) && !marks.contains(&k.as_str());
            d.iter()
                .filter(|(k, _)| kept(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Document>()
        });
        let state = (lease_fields, held);
        if self.emitted.as_ref() == Some(&state) {
            return;
        }
        self.emitted = Some(state);
        let _ = self.tx.send(Ok(info));
    }

    // ----- change stream ----------------------------------------------------

    async fn watch(&mut self, start: Option<Timestamp>) -> WatchEnd {
        let mut resume: Option<ResumeToken> = None;
        let mut opened_once = false;
        let mut failures = 0;
        loop {
            // Every event of the key's document.
            let key_events = [doc! { "$match": { "documentKey._id": &self.key } }];
            let mut watch = self.store.coll().watch().pipeline(key_events);
            watch = match (&resume, start) {
                (Some(token), _) => watch.resume_after(token.clone()),
                (None, Some(time)) => watch.start_at_operation_time(time),
                (None, None) => watch,
            };
            let mut stream = match self.store.bounded(watch).await {
                Ok(stream) => stream,
                Err(Error::Database(e)) if command_code(&e) == Some(HISTORY_LOST) => {
                    tracing::warn!(
                        key = %self.key,
                        "change stream history lost; re-reading the lease"
                    );
                    return WatchEnd::Restart;
                }
                Err(e) if e.is_transient() => {
                    if !self.retry_later(e, &mut failures).await {
                        return WatchEnd::Stop;
                    }
                    continue;
                }
                Err(e) if !opened_once => {
                    tracing::debug!(key = %self.key, error = %e, "no change stream; polling");
                    return WatchEnd::Unsupported;
                }
                Err(e) => {
                    let _ = self.tx.send(Err(e));
                    return WatchEnd::Stop;
                }
            };
            opened_once = true;
            failures = 0;
            loop {
                let check_at = self.check_at;
                tokio::select! {
                    event = stream.next() => {
                        resume = stream.resume_token().or(resume);
                        match event {
                            Some(Ok(event)) => {
                                let at = event.cluster_time;
                                if !self.apply(event) {
                                    return WatchEnd::Restart;
                                }
                                if self.doc.as_ref().is_some_and(|d| !is_our_layout(d)) {
                                    self.reread(at).await;
                                }
                            }
                            Some(Err(e)) => {
                                let e = Error::from(e);
                                if !self.retry_later(e, &mut failures).await {
                                    return WatchEnd::Stop;
                                }
                                break;
                            }
                            None => break,
                        }
                    }
                    _ = sleep_until(check_at), if check_at.is_some() => self.check_expiry().await,
                    _ = self.tx.closed() => return WatchEnd::Stop,
                }
            }
        }
    }

    /// Applies one change event to the last known state and sends the result.
    /// `false` if the observer must start over from a fresh read.
    fn apply(&mut self, event: ChangeStreamEvent<Document>) -> bool {
        let server_time = event
            .wall_time
            .map(|t| t.to_system_time())
            .or_else(|| {
                event
                    .cluster_time
                    .map(|t| SystemTime::UNIX_EPOCH + Duration::from_secs(t.time.into()))
            })
            .unwrap_or_else(SystemTime::now);
        match event.operation_type {
            OperationType::Insert | OperationType::Replace => match event.full_document {
                Some(doc) => self.doc = Some(doc),
                None => return false,
            },
            OperationType::Update => {
                let (Some(doc), Some(update)) = (self.doc.as_mut(), event.update_description)
                else {
                    return false;
                };
                for (path, value) in update.updated_fields {
                    set_path(doc, &path, value);
                }
                for path in &update.removed_fields {
                    remove_path(doc, path);
                }
                for truncated in update.truncated_arrays.unwrap_or_default() {
                    truncate_path(doc, &truncated.field, truncated.new_size.max(0) as usize);
                }
            }
            OperationType::Delete
            | OperationType::Drop
            | OperationType::Rename
            | OperationType::DropDatabase => self.doc = None,
            OperationType::Invalidate => {
                self.doc = None;
                self.emit(server_time);
                return false;
            }
            _ => return true,
        }
        // A foreign lock is judged by its rule on the server: `reread`.
        if self.doc.as_ref().is_some_and(|d| !is_our_layout(d)) {
            return true;
        }
        self.emit(server_time);
        true
    }

    /// Reads a foreign lock again after its change event, as of the event's
    /// cluster time `at` (a snapshot read, so that no later write of the key
    /// is seen ahead of its own event), to judge it by its rule on the
    /// server, and sends the result; on an error, the expiry check reads it
    /// later.
    async fn reread(&mut self, at: Option<Timestamp>) {
        let read = match at {
            Some(at) => self.read_at(at).await,
            None => self.read(false).await.map(|(doc, now, _)| (doc, now)),
        };
        match read {
            Ok((doc, now)) => {
                self.doc = doc;
                self.emit(now);
            }
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "re-reading a foreign lock failed; retrying");
                self.check_at = Some(Instant::now() + RETRY_MAX);
            }
        }
    }

    /// The last known lease should have expired by now: re-read, and report
    /// the expiry if the document is still the one last seen (otherwise the
    /// change stream has events on their way, which decide).
    async fn check_expiry(&mut self) {
        match self.read(false).await {
            Ok((doc, now, _)) if same_acquisition(doc.as_ref(), self.doc.as_ref()) => {
                // A foreign lock's `held`, judged by its rule at this read.
                if doc.as_ref().is_some_and(|d| !is_our_layout(d)) {
                    self.doc = doc;
                }
                self.emit(now);
            }
            Ok(_) => self.check_at = Some(Instant::now() + Duration::from_secs(1)),
            Err(e) => {
                tracing::debug!(key = %self.key, error = %e, "expiry check failed; retrying");
                self.check_at = Some(Instant::now() + RETRY_MAX);
            }
        }
    }

    // ----- polling ----------------------------------------------------------

    async fn poll(mut self) {
        let mut failures = 0;
        loop {
            let jitter = rand::random_range(0.8..1.2);
            let mut wake = Instant::now() + POLL_INTERVAL.mul_f64(jitter);
            if let Some(check_at) = self.check_at {
                wake = wake.min(check_at);
            }
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = self.tx.closed() => return,
            }
            match self.read(false).await {
                Ok((doc, now, _)) => {
                    failures = 0;
                    self.doc = doc;
                    self.emit(now);
                }
                Err(e) => {
                    if !self.retry_later(e, &mut failures).await {
                        return;
                    }
                }
            }
        }
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        // A few ms late, so that the server's clock has passed the expiry too.
        Some(at) => tokio::time::sleep_until(at + Duration::from_millis(5)).await,
        None => std::future::pending().await,
    }
}

/// Same lease id, token and expiry: the same acquisition, not renewed since.
/// A read's document without its `now`, and that `now` (the server's).
/// Without a document there is no `$$NOW`; the local clock only matters for
/// `LeaseInfo::server_time` of a state that has no lease anyway.
fn without_now(found: Option<Document>) -> (Option<Document>, SystemTime) {
    let now = found
        .as_ref()
        .and_then(|d| d.get_datetime("now").ok())
        .map(|d| d.to_system_time());
    let doc = found.map(|mut d| {
        d.remove("now");
        d
    });
    (doc, now.unwrap_or_else(SystemTime::now))
}

fn same_acquisition(a: Option<&Document>, b: Option<&Document>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => [field::LEASE_ID, field::TOKEN, field::EXPIRES_AT]
            .iter()
            .all(|f| a.get(f) == b.get(f)),
        _ => false,
    }
}

fn set_path(doc: &mut Document, path: &str, value: Bson) {
    match path.split_once('.') {
        None => {
            doc.insert(path, value);
        }
        Some((head, rest)) => {
            let child = doc
                .entry(head.to_string())
                .or_insert_with(|| Bson::Document(Document::new()));
            set_in(child, rest, value);
        }
    }
}

fn set_in(node: &mut Bson, path: &str, value: Bson) {
    match node {
        Bson::Document(doc) => set_path(doc, path, value),
        Bson::Array(items) => {
            let (head, rest) = match path.split_once('.') {
                Some((head, rest)) => (head, Some(rest)),
                None => (path, None),
            };
            let Ok(i) = head.parse::<usize>() else {
                return;
            };
            if items.len() <= i {
                items.resize(i + 1, Bson::Null);
            }
            match rest {
                None => items[i] = value,
                Some(rest) => {
                    if !matches!(items[i], Bson::Document(_) | Bson::Array(_)) {
                        items[i] = Bson::Document(Document::new());
                    }
                    set_in(&mut items[i], rest, value);
                }
            }
        }
        other => {
            let mut doc = Document::new();
            set_path(&mut doc, path, value);
            *other = Bson::Document(doc);
        }
    }
}

fn get_path_mut<'a>(doc: &'a mut Document, path: &str) -> Option<&'a mut Bson> {
    let mut parts = path.split('.');
    let mut node = doc.get_mut(parts.next()?)?;
    for part in parts {
        node = match node {
            Bson::Document(d) => d.get_mut(part)?,
            Bson::Array(items) => items.get_mut(part.parse::<usize>().ok()?)?,
            _ => return None,
        };
    }
    Some(node)
}

fn remove_path(doc: &mut Document, path: &str) {
    match path.rsplit_once('.') {
        None => {
            doc.remove(path);
        }
        Some((parent, last)) => match get_path_mut(doc, parent) {
            Some(Bson::Document(d)) => {
                d.remove(last);
            }
            Some(Bson::Array(items)) => {
                if let Some(item) = last.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
                    *item = Bson::Null;
                }
            }
            _ => {}
        },
    }
}

fn truncate_path(doc: &mut Document, path: &str, len: usize) {
    if let Some(Bson::Array(items)) = get_path_mut(doc, path) {
        items.truncate(len);
    }
}

/// The stream of `watch_releases`: [`Announcement::Opened`] once `open`
/// has opened the change stream, then each event that `read` reads as a
/// write. Opening it is part of the stream's first poll, so the caller never
/// waits for it.
pub(super) fn announcements(
    open: impl Future<Output = Result<ChangeStream<ChangeStreamEvent<Document>>>> + Send + 'static,
    read: impl Fn(&Document) -> Option<Announcement> + Clone + Send + 'static,
) -> BoxStream<'static, Result<Announcement>> {
    futures::stream::once(open)
        .map(move |opened| match opened {
            Ok(stream) => {
                let read = read.clone();
                let writes = stream.with_type::<Document>().filter_map(move |event| {
                    let write = event.map_err(Error::from).map(|e| read(&e)).transpose();
                    async move { write }
                });
                futures::stream::iter([Ok(Announcement::Opened)])
                    .chain(writes)
                    .boxed()
            }
            Err(e) => futures::stream::iter([Err(e)]).boxed(),
        })
        .flatten()
        .boxed()
}

impl MongoStore {
    /// The writes that may change who holds a key
    /// ([`release_events_pipeline`]), each read by [`key_write`].
    pub(super) fn release_events(
        &self,
        announced: Announced,
    ) -> BoxStream<'static, Result<Announcement>> {
        let store = self.clone();
        let open = async move {
            let pipeline = release_events_pipeline(announced, store.owner());
            let watch = store
                .coll()
                .watch()
                .pipeline(pipeline)
                .max_await_time(crate::store::RELEASE_EVENTS_AWAIT);
            store.bounded(watch).await
        };
        announcements(open, announcement)
    }
}

#[cfg(test)]
mod tests;
