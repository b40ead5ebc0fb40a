//! The TTL monitor of the twin's collection: MongoDB's background task that
//! deletes, at each pass, every document a TTL index of the collection
//! finds expired, whoever wrote it. The indexes are the collection's
//! ([`MemoryDb::set_ttl_indexes`]): the managers' garbage collector on
//! `exp` (a GC grace after it), and those of other applications (pattern
//! 1's on `ts`, pattern 3's on `ExpireAt`). Every index sees the documents
//! as MongoDB stores them ([`Doc::stored`] for ours, another application's
//! as written): a document of ours that another application took over in
//! place keeps our `exp` beside its own fields, and our index covers it as
//! long as [`gc_index_covers`] says so.

use std::time::Duration;

use mongodb::bson::{Bson, DateTime, Document, doc};

use super::db::{MemoryDb, lock};
use super::doc::Doc;
use crate::key::LeaseKey;
use crate::store::field;

/// A TTL index of the collection: a document whose `field` is a date (or
/// an array of dates: the earliest) at least `expire_after` old by the
/// server's clock is deleted at the monitor's next pass, if the index
/// covers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TtlIndex {
    /// The indexed field.
    pub field: String,
    /// Its `expireAfterSeconds`.
    pub expire_after: Duration,
    /// The managers' own index on `exp` (their garbage collector), which
    /// covers the documents [`gc_index_covers`] says; another
    /// application's covers every document.
    pub ours: bool,
}

impl TtlIndex {
    /// The managers' index on `exp`, deleting a document `grace` after its
    /// expiry.
    pub fn gc(grace: Duration) -> TtlIndex {
        TtlIndex {
            field: field::EXPIRES_AT.into(),
            expire_after: grace,
            ours: true,
        }
    }

    /// Another application's index on `field`.
    pub fn on(field: &str, expire_after: Duration) -> TtlIndex {
        TtlIndex {
            field: field.into(),
            expire_after,
            ours: false,
        }
    }

    /// Whether this index deletes `doc` (as stored) at server time `now`.
    fn expires(&self, doc: &Document, now: DateTime) -> bool {
        if self.ours && !gc_index_covers(doc) {
            return false;
        }
        let dates: Vec<i64> = match doc.get(&self.field) {
            Some(Bson::DateTime(at)) => vec![at.timestamp_millis()],
            Some(Bson::Array(values)) => values
                .iter()
                .filter_map(|v| v.as_datetime().map(|at| at.timestamp_millis()))
                .collect(),
            _ => Vec::new(),
        };
        let after = self.expire_after.as_millis() as i64;
        dates
            .into_iter()
            .min()
            .is_some_and(|at| at + after <= now.timestamp_millis())
    }
}

/// Whether the managers' garbage-collecting index on `exp` covers `doc`
/// (as MongoDB stores it): a document with a date `exp` that its partial
/// filter (`store::gc_filter`, `{value: null}`) matches, i.e. without
/// `value` (or with a null one). Another application's lock that took a
/// document of ours over in place keeps our `exp` beside its `value`: not
/// covered.
pub(crate) fn gc_index_covers(doc: &Document) -> bool {
    let value = doc.get(field::OTHER_OWNER);
    matches!(doc.get(field::EXPIRES_AT), Some(Bson::DateTime(_)))
        && value.is_none_or(|value| *value == Bson::Null)
}

impl Doc {
    /// This lock document's top-level fields as MongoDB stores them under
    /// `key` (dates by `db`'s server clock): what the collection's indexes
    /// see.
    pub(crate) fn stored(&self, db: &MemoryDb, key: &LeaseKey) -> Document {
        let date = |at| db.date(at);
        let mut stored = doc! {
            field::ID: key.to_bson(),
            field::OWNER: self.owner.as_str(),
            field::TOKEN: self.token as i64,
            field::EXPIRES_AT: date(self.exp),
            field::ACQUIRED_AT: date(self.acquired),
            field::RENEWED_AT: date(self.renewed),
        };
        if let Some(lease_id) = self.lease_id {
            stored.insert(field::LEASE_ID, lease_id.to_string());
        }
        let dates = [
            (field::HOLD_UNTIL, self.hold_until),
            (field::WAITING_SINCE, self.waiting_since),
            (field::YIELD_UNTIL, self.yield_until),
        ];
        for (name, at) in dates {
            if let Some(at) = at {
                stored.insert(name, date(at));
            }
        }
        if !self.holders.is_empty() {
            let holders: Vec<Bson> = self
                .holders
                .iter()
                .map(|h| {
                    Bson::Document(doc! {
                        field::OWNER: h.owner.as_str(),
                        field::TOKEN: h.token as i64,
                        field::EXPIRES_AT: date(h.exp),
                    })
                })
                .collect();
            stored.insert(field::HOLDERS, holders);
        }
        if let Some(permits) = self.permits {
            stored.insert(field::PERMITS, i64::from(permits));
        }
        // Restated for other clients ("Read by other clients" in `store`).
        let (ts, exp) = (date(self.renewed), date(self.exp));
        let until = restated_until(exp.timestamp_millis(), self.token as i64);
        stored.insert(field::OBTAINED_AT, ts);
        let ttl = (until - ts.timestamp_millis()) as f64 / 1000.0;
        stored.insert(field::TTL_SECONDS, ttl);
        stored
    }
}

/// Until when a document of ours with expiry `exp` and token `tok` (ms and
/// the stored value) reads held to the `{_id, value, ttl, obtained_at}`
/// pattern's clients: its `exp`, or for a token younger than
/// `DELETE_MIN_TOKEN_AGE` its millisecond + that age + 1 ms
/// (`rules::restated_seconds`).
pub(crate) fn restated_until(exp: i64, tok: i64) -> i64 {
    let deletable_at = (tok >> crate::token::TOKEN_TIME_SHIFT)
        + crate::config::DELETE_MIN_TOKEN_AGE.as_millis() as i64
        + 1;
    exp.max(deletable_at)
}

impl MemoryDb {
    /// The collection's TTL indexes from now on (none by default), which
    /// [`MemoryDb::ttl_monitor_pass`] applies.
    pub fn set_ttl_indexes(&self, indexes: Vec<TtlIndex>) {
        *lock(&self.ttl_indexes) = indexes;
    }

    /// One pass of the TTL monitor at server time now: deletes every
    /// document (ours and other applications') that one of the
    /// collection's TTL indexes finds expired, announcing each delete.
    /// Nothing of a deleted document is remembered. Returns the keys
    /// deleted, in the order of the keys, each with the field of the
    /// index that deleted it.
    pub fn ttl_monitor_pass(&self) -> Vec<(LeaseKey, String)> {
        let indexes = lock(&self.ttl_indexes).clone();
        if indexes.is_empty() {
            return Vec::new();
        }
        let now = self.date(self.server_now());
        let mut coll = lock(&self.inner);
        let expired = |doc: &Document| {
            indexes
                .iter()
                .find(|index| index.expires(doc, now))
                .map(|index| index.field.clone())
        };
        let mut doomed: Vec<(LeaseKey, String)> = coll
            .docs
            .iter()
            .filter_map(|(key, doc)| Some((key.clone(), expired(&doc.stored(self, key))?)))
            .chain(
                coll.foreign
                    .iter()
                    .filter_map(|(key, foreign)| Some((key.clone(), expired(foreign)?))),
            )
            .collect();
        doomed.sort();
        for (key, _) in &doomed {
            coll.docs.remove(key);
            coll.foreign.remove(key);
        }
        drop(coll);
        if !doomed.is_empty() {
            for (key, _) in &doomed {
                self.announce_release(key);
            }
            self.touch();
        }
        doomed
    }
}
