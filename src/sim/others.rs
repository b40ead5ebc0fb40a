//! The other applications on the simulated lock collection, each by its
//! exact protocol (the reference texts' patterns, `tests/common/others.rs`
//! on a real `mongod`), and the TTL monitor over every TTL index of the
//! collection. Pattern 1 and its TTL index on `ts` run in half the
//! schedules, pattern 2 in the others (the two in one collection are not
//! supported: docs/sharing.md). They meet documents of ours in every state: held, released
//! young and old, expired, left by a crashed holder, and (pattern 2) taken
//! over in place and then deleted by them.
//!
//! - Pattern 1 (`workitem.lock`): inserts `{_id, ts, aid}` when no document
//!   is there (E11000 otherwise: held), its TTL index on `ts`
//!   ([`TS_EXPIRE_AFTER`]) deleting it, ours too, once `ts` is that old;
//!   releases by `deleteOne({_id})` while its lock is there, or
//!   `deleteMany({aid})`, or never (a holder that crashed: the TTL index
//!   frees the key).
//! - Pattern 2 (npm `distributed-locks-mongodb`): a read; an upsert when
//!   nothing is there, a guarded takeover in place of a lock expired by its
//!   rule (a document of ours, released or expired, reads so), which
//!   leaves our fields beside its own; releases by `deleteOne({_id,
//!   value})`.
//! - Pattern 3 (the C# lock): `findOneAndUpdate({_id}, {$setOnInsert: {_id,
//!   ExpireAt}}, upsert, ReturnDocument.Before)`, a document back (or
//!   E11000) meaning held, spinning; its TTL index on `ExpireAt`
//!   (`expireAfterSeconds: 0`); releases by `deleteOne({_id})` while its
//!   lock is there, or never.
//! - A lock by an upsert of `_id` alone (a bare `{_id}`), released by a
//!   delete.
//! - A client of a schema drawn for the run ([`Schema`]), which the
//!   managers know by its rule ([`Schema::rule`]): `{_id, locked, owner,
//!   created, expire: date|null}`, kept on release, or `{_id, owner,
//!   expire: <epoch ms>}`, deleted on release.
//!
//! Each spins now and then (retries every 10 to 50 ms for a while, as the
//! C# client does), so that it lands on a document of ours just released,
//! and holds a few milliseconds or seconds, sometimes past its expiry by
//! its own rule (a manager may then take it over). A release by `_id` of a
//! lock that is no longer its own would delete whatever is there (a limit
//! documented in docs/sharing.md, left out): it releases only its own.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mongodb::bson::{Bson, DateTime, Document, doc};
use tokio::time::{Instant, sleep};

use super::history::Event;
use super::workload::{Recorder, ms};
use crate::foreign::ForeignLockRule;
use crate::key::LeaseKey;
use crate::random::random_range;
use crate::store::memory::{ForeignWrite, MemoryDb, TtlIndex};

/// The `expireAfterSeconds` of pattern 1's TTL index on `ts` in the
/// simulated lock collection: `{_id, ts, aid}` expires that long after
/// `ts`, and a document of ours whose last write is that old is deleted.
/// Longer than a lease's longest TTL in the simulation (so that `connect`'s
/// cap on local deadlines, `Timing::ttl_cap`, never shortens one), in whole
/// seconds as MongoDB's.
pub const TS_EXPIRE_AFTER: Duration = Duration::from_secs(10);

/// The owner id of pattern 1's client (`aid`) on `key` (one session per
/// key, so that its `deleteMany({aid})` releases its own locks).
fn pattern1_aid(key: &str) -> String {
    format!("another-app-{key}")
}

/// Pattern 2's client's `value`.
const PATTERN2_VALUE: &str = "node-1";

/// The TTL indexes of the simulated lock collection: the managers' garbage
/// collector on `exp` with `gc_grace`, pattern 1's on `ts` (if `ts`, its
/// `expireAfterSeconds`), pattern 3's on `ExpireAt`.
pub fn ttl_indexes(gc_grace: Duration, ts: Option<Duration>) -> Vec<TtlIndex> {
    let mut indexes = vec![
        TtlIndex::gc(gc_grace),
        TtlIndex::on("ExpireAt", Duration::ZERO),
    ];
    indexes.extend(ts.map(|after| TtlIndex::on("ts", after)));
    indexes
}

/// The TTL monitor: a pass over every TTL index of `db`'s collection every
/// 0.2 to 3 s (MongoDB's runs every 60 s by default), recording what it
/// deleted, until the run ends.
pub async fn ttl_monitor(recorder: Recorder, db: MemoryDb) {
    loop {
        sleep(ms(random_range(200..3_000))).await;
        for (key, field) in db.ttl_monitor_pass() {
            recorder.push(Event::TtlDeleted {
                key: format!("locks/{}", key.as_str().unwrap_or_default()),
                field,
            });
        }
    }
}

/// The schema of another application's lock client, drawn for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schema {
    /// `{_id, locked: true|false, owner, created, expire: date|null}`: it
    /// inserts its lock, or on E11000 replaces the whole document matching
    /// `{_id, locked: false}` or `{_id, expire: {$lt: now}}`; it releases by
    /// `findOneAndUpdate({_id, owner}, {$set: {locked: false, owner: null,
    /// created: null, expire: null}})`, keeping the document. A null
    /// `expire` is held until released.
    Locked,
    /// `{_id, owner, expire: <epoch ms>}`: it inserts, or replaces a lock
    /// matching `{_id, expire: {$lt: now}}`; it releases by
    /// `deleteOne({_id, owner, expire})`.
    EpochMs,
}

impl Schema {
    /// None, or one of the schemas, a third of the runs each.
    pub fn draw() -> Option<Schema> {
        [None, Some(Schema::Locked), Some(Schema::EpochMs)][random_range(0..3)]
    }

    /// The rule the managers are given for it.
    pub fn rule(self) -> ForeignLockRule {
        match self {
            Schema::Locked => ForeignLockRule::builder()
                .held(doc! { "$and": [
                    { "$eq": ["$locked", true] },
                    { "$or": [
                        { "$eq": [{ "$ifNull": ["$expire", null] }, null] },
                        { "$gt": ["$expire", "$$NOW"] },
                    ]},
                ]})
                .owner("$owner")
                .expires_at("$expire")
                .build(),
            Schema::EpochMs => ForeignLockRule::builder()
                .held(doc! { "$gt": ["$expire", { "$toLong": "$$NOW" }] })
                .owner("$owner")
                .expires_at(doc! { "$toDate": "$expire" })
                .build(),
        }
    }
}

/// A lock another application holds, and how it releases it.
struct Held {
    key: String,
    release: Release,
}

/// How a lock of another application is released.
enum Release {
    /// `deleteOne({_id})` (patterns 1 and 3, a bare `{_id}`), of the
    /// document it wrote: its fields besides `_id`.
    ById(Document),
    /// Pattern 1's `deleteMany({aid})`.
    ByOwner,
    /// Pattern 2's `deleteOne({_id, value})`.
    ByValue,
    /// [`Schema::Locked`]'s release of its `owner`'s lock, kept.
    Unlock(String),
    /// Never: its holder crashed, the TTL index frees the key.
    Never,
}

/// Another application locking `key` of `db` now and then, by a pattern
/// drawn each time, until `stop`: pattern 1 if the collection has its TTL
/// index on `ts` (`ts_index`), pattern 2 otherwise (the value pattern's
/// clients in a collection with a TTL index on `ts` are not supported:
/// that index would delete, by the `ts` of ours it keeps, a lock of theirs
/// that took a document of ours over in place; docs/sharing.md).
pub async fn foreign_holder(
    recorder: Recorder,
    db: MemoryDb,
    key: &'static str,
    ts_index: bool,
    schema: Option<Schema>,
    stop: Arc<AtomicBool>,
) {
    while !stop.load(Ordering::SeqCst) {
        sleep(ms(random_range(50..2_000))).await;
        // Pattern 2, the one that writes over documents of ours, three
        // times in five where it runs; pattern 1 as often where it runs.
        let pattern = match random_range(0..5) {
            _ if schema.is_some() && random_range(0..2) == 0 => 5,
            0 | 3 | 4 if ts_index => 0,
            0 => 3,
            other => other,
        };
        // Half the time it spins: tries every 10 to 50 ms for a while.
        let spin_until = match random_range(0..2) {
            0 => Instant::now() + ms(random_range(300..1_500)),
            _ => Instant::now(),
        };
        let held = loop {
            let held = match pattern {
                0 => pattern1(&recorder, &db, key),
                1 => bare(&recorder, &db, key),
                2 => pattern3(&recorder, &db, key),
                3 | 4 => pattern2(&recorder, &db, key).await,
                _ => schema_lock(&recorder, &db, key, schema.expect("drawn")),
            };
            if held.is_some() || Instant::now() >= spin_until || stop.load(Ordering::SeqCst) {
                break held;
            }
            sleep(ms(random_range(10..50))).await;
        };
        let Some(held) = held else {
            continue;
        };
        // Released at once, a moment later, or seconds later (perhaps past
        // its expiry by its own rule).
        let hold = match random_range(0..3) {
            0 => random_range(1..50),
            1 => random_range(10..300),
            _ => random_range(10..3_000),
        };
        sleep(ms(hold)).await;
        release(&recorder, &db, held);
    }
}

/// The server's time now as a date, `d` ms later.
fn date_after(db: &MemoryDb, d: u64) -> DateTime {
    let now = db.date(db.server_now()).timestamp_millis();
    DateTime::from_millis(now + d as i64)
}

/// Another application's insert of its lock `{_id: key, ..fields}`:
/// whether no document was there.
pub(crate) fn insert(db: &MemoryDb, key: impl Into<LeaseKey>, fields: Document) -> bool {
    db.foreign_write(key, |doc| match doc {
        None => ForeignWrite::Replace(fields),
        Some(_) => ForeignWrite::Keep,
    })
}

/// The `{_id, value, ttl, obtained_at}` pattern's client's read of `key`
/// (its `findOne`, with `current_date: $$NOW`), for [`pattern2_lock`].
pub(crate) fn pattern2_read(db: &MemoryDb, key: impl Into<LeaseKey>) -> Option<Document> {
    let mut found = db.stored(key)?;
    found.insert("current_date", db.date(db.server_now()));
    Some(found)
}

/// That client's lock of `key` as `value` for `ttl` seconds after its read
/// `found`, by the commands of `tests/common/pattern2_client.rs`: an upsert
/// matching `{_id, value}` if nothing was found; else, if what was found is
/// past `obtained_at + ttl` seconds, one matching its `value` (missing:
/// null) and `obtained_at`. Returns whether it locked `key`.
pub(crate) fn pattern2_lock(
    db: &MemoryDb,
    key: impl Into<LeaseKey>,
    found: Option<&Document>,
    value: &str,
    ttl: i64,
) -> bool {
    let filter = match found {
        None => doc! { "value": value },
        Some(lock) => {
            let ttl_ms = match lock.get("ttl") {
                Some(Bson::Int32(n)) => i64::from(*n) * 1000,
                Some(Bson::Int64(n)) => n * 1000,
                Some(Bson::Double(x)) => (x * 1000.0) as i64,
                _ => return false,
            };
            let (Ok(now), Ok(at)) = (
                lock.get_datetime("current_date"),
                lock.get_datetime("obtained_at"),
            ) else {
                return false;
            };
            if now.timestamp_millis() <= at.timestamp_millis() + ttl_ms {
                return false;
            }
            doc! { "value": lock.get("value").cloned().unwrap_or(Bson::Null), "obtained_at": at }
        }
    };
    let matches = |doc: &Document| {
        filter
            .iter()
            .all(|(k, v)| doc.get(k).unwrap_or(&Bson::Null) == v)
    };
    let set = doc! { "value": value, "ttl": ttl, "obtained_at": db.date(db.server_now()) };
    db.foreign_write(key, |doc| match doc {
        Some(doc) if !matches(doc) => ForeignWrite::Keep, // its upsert's E11000
        _ => ForeignWrite::Set(set),
    })
}

/// Records that another application locked `key` (its owner, its expiry
/// by its own rule from now).
fn taken(recorder: &Recorder, key: &str, owner: &str, expires_in: Option<Duration>) -> String {
    let key = format!("locks/{key}");
    recorder.push(Event::ForeignTaken {
        key: key.clone(),
        owner: owner.into(),
        expires_in,
    });
    key
}

/// Pattern 1's acquire: its insert of `{_id, ts: now, aid}`.
fn pattern1(recorder: &Recorder, db: &MemoryDb, key: &'static str) -> Option<Held> {
    let aid = pattern1_aid(key);
    let fields = doc! { "ts": date_after(db, 0), "aid": aid.as_str() };
    if !insert(db, key, fields.clone()) {
        return None;
    }
    let key = taken(recorder, key, &aid, Some(TS_EXPIRE_AFTER));
    let release = match random_range(0..8) {
        0 => Release::Never,
        1..4 => Release::ByOwner,
        _ => Release::ById(fields),
    };
    Some(Held { key, release })
}

/// The lock by an upsert of `_id` alone.
fn bare(recorder: &Recorder, db: &MemoryDb, key: &'static str) -> Option<Held> {
    if !insert(db, key, Document::new()) {
        return None;
    }
    let key = taken(recorder, key, "a bare {_id}", None);
    Some(Held {
        key,
        release: Release::ById(Document::new()),
    })
}

/// Pattern 3's acquire: `findOneAndUpdate` with `$setOnInsert: {_id,
/// ExpireAt: now + its lifetime}`, upsert: `null` back (it inserted) means
/// acquired.
fn pattern3(recorder: &Recorder, db: &MemoryDb, key: &'static str) -> Option<Held> {
    let life = match random_range(0..3) {
        0 => random_range(200..1_000),
        _ => random_range(1_000..5_000),
    };
    let fields = doc! { "ExpireAt": date_after(db, life) };
    if !insert(db, key, fields.clone()) {
        return None;
    }
    let key = taken(recorder, key, "", Some(ms(life)));
    let release = match random_range(0..6) {
        0 => Release::Never,
        _ => Release::ById(fields),
    };
    Some(Held { key, release })
}

/// Pattern 2's acquire, exactly as its client does: a read; if nothing is
/// there, an upsert matching `{_id, value}`; if what is there expired by its
/// rule (`$$NOW > obtained_at + ttl` seconds: a document of ours released
/// or expired reads so), a guarded takeover matching the `value` and
/// `obtained_at` read, a moment later, in place.
async fn pattern2(recorder: &Recorder, db: &MemoryDb, key: &'static str) -> Option<Held> {
    let ttl = [1, 1, 2, 5][random_range(0..4)];
    let found = pattern2_read(db, key);
    // Another write may land between its read and its write.
    sleep(ms(random_range(0..20))).await;
    if !pattern2_lock(db, key, found.as_ref(), PATTERN2_VALUE, ttl) {
        return None;
    }
    // Its clients' strict `>`: free 1 ms after `obtained_at + ttl`.
    let expires_in = ms(1_000 * ttl as u64 + 1);
    let key = taken(recorder, key, PATTERN2_VALUE, Some(expires_in));
    Some(Held {
        key,
        release: Release::ByValue,
    })
}

/// [`Schema`]'s lock, as its client takes it: an insert, or on E11000 the
/// guarded replace of a lock free by its own conditions.
fn schema_lock(
    recorder: &Recorder,
    db: &MemoryDb,
    key: &'static str,
    schema: Schema,
) -> Option<Held> {
    let owner = format!("schema-client-{key}");
    let now = date_after(db, 0);
    let life = match (schema, random_range(0..3)) {
        (Schema::Locked, 0) => None,
        (_, 1) => Some(random_range(200..1_000)),
        _ => Some(random_range(1_000..5_000)),
    };
    let (fields, release) = match schema {
        Schema::Locked => {
            let expire = life.map_or(Bson::Null, |l| date_after(db, l).into());
            let fields = doc! { "locked": true, "owner": &owner, "created": now, "expire": expire };
            (fields, Release::Unlock(owner.clone()))
        }
        Schema::EpochMs => {
            let expire = date_after(db, life.unwrap_or(0)).timestamp_millis();
            let fields = doc! { "owner": &owner, "expire": expire };
            (fields.clone(), Release::ById(fields))
        }
    };
    let free = |doc: &Document| match doc.get("expire") {
        _ if doc.get_bool("locked") == Ok(false) => true,
        Some(Bson::DateTime(at)) => *at < now,
        Some(Bson::Int64(at)) => *at < now.timestamp_millis(),
        _ => false,
    };
    let written = db.foreign_write(key, |doc| match doc {
        Some(doc) if !free(doc) => ForeignWrite::Keep,
        _ => ForeignWrite::Replace(fields),
    });
    if !written {
        return None;
    }
    let key = taken(recorder, key, &owner, life.map(ms));
    Some(Held { key, release })
}

/// Releases `held` by its pattern's command.
fn release(recorder: &Recorder, db: &MemoryDb, held: Held) {
    let id = held.key.trim_start_matches("locks/");
    let removed = Event::ForeignRemoved {
        key: held.key.clone(),
    };
    // A delete or a replace matching `filter`: its own lock only (see the
    // module docs).
    let write = |filter: &dyn Fn(&Document) -> bool, then: ForeignWrite| {
        db.foreign_write(id, |doc| match doc {
            Some(doc) if filter(doc) => then,
            _ => ForeignWrite::Keep,
        })
    };
    // Each command but a delete by `_id` is recorded as sent.
    let sent = !matches!(held.release, Release::Never | Release::ById(_));
    let released = match held.release {
        Release::Never => false,
        Release::ById(fields) => write(
            &|doc| doc.iter().filter(|(k, _)| *k != "_id").eq(&fields),
            ForeignWrite::Delete,
        ),
        Release::ByOwner => db.delete_where_owner(&pattern1_aid(id)) > 0,
        Release::Unlock(owner) => write(
            &|doc| doc.get_str("owner") == Ok(&owner),
            ForeignWrite::Replace(doc! {
                "locked": false, "owner": Bson::Null, "created": Bson::Null, "expire": Bson::Null,
            }),
        ),
        Release::ByValue => write(
            &|doc| doc.get_str("value") == Ok(PATTERN2_VALUE),
            ForeignWrite::Delete,
        ),
    };
    if sent || released {
        recorder.push(removed);
    }
}
