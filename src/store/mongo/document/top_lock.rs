//! The top-level `LockId` / `LockTime` fields of [`LockIdFields`]: the BSON
//! that keeps them true beside the lock field `F`, for clients that lock a
//! document by them (docs/in-document.md, "Documents locked by LockId and
//! LockTime").
//!
//! The lease in `F` is *current* only while `LockId` is a UUID equal to
//! `F.lid` ([`TopLock::only_current`]); a document whose `LockId` is not
//! current is theirs until `LockTime + max_duration`
//! ([`TopLock::free_to_them`]), then taken over; `F`, if left by an earlier
//! lease, then only carries the fencing token on.

use mongodb::bson::{Bson, DateTime, Document, doc};

use super::super::rules::{LockPath, read_lease_id};
use crate::document_update::RESERVED_PREFIX;
use crate::lock_id_fields::LockIdFields;
use crate::store::field;

/// The top-level lock fields of one collection's in-document leases.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct TopLock {
    /// `LockId`.
    id: String,
    /// `LockTime`.
    time: String,
    /// `max_duration` in ms (rounded up).
    max_ms: i64,
}

impl TopLock {
    pub(super) fn new(fields: &LockIdFields) -> Self {
        TopLock {
            id: fields.lock_id.clone(),
            time: fields.lock_time.clone(),
            max_ms: fields.max_ms(),
        }
    }

    /// The name of `LockId`.
    pub(super) fn id(&self) -> &str {
        &self.id
    }

    fn id_var(&self) -> String {
        format!("${}", self.id)
    }

    fn time_var(&self) -> String {
        format!("${}", self.time)
    }

    /// The lease in `F` is current: `LockId` is a UUID (binary) equal to
    /// `F.lid`.
    pub(super) fn current(&self, lock_field: &str) -> Document {
        let at = LockPath::under(lock_field);
        doc! { "$and": [
            { "$eq": [{ "$type": self.id_var() }, "binData"] },
            { "$eq": [self.id_var(), at.var(field::LEASE_ID)] },
        ]}
    }

    /// Free by the other clients' rule, judged by `$$NOW`: `LockId` null or
    /// missing, or `LockTime` a date before `$$NOW - max_duration`.
    pub(super) fn free_to_them(&self) -> Document {
        doc! { "$or": [
            { "$in": [{ "$type": self.id_var() }, ["missing", "null"]] },
            { "$and": [
                { "$eq": [{ "$type": self.time_var() }, "date"] },
                { "$lt": [self.time_var(), { "$subtract": ["$$NOW", self.max_ms] }] },
            ]},
        ]}
    }

    /// The win rule of an acquisition: `ours` (the lock field's own rule)
    /// while the lease in `F` is current; otherwise the document must be
    /// free by the other clients' rule, and `F` absent or of our layout (an
    /// `F` of another layout is a foreign holder's, never taken).
    pub(super) fn wins(&self, lock_field: &str, ours: Document) -> Document {
        let at = LockPath::under(lock_field);
        doc! { "$cond": [
            self.current(lock_field),
            ours,
            { "$and": [self.free_to_them(), { "$or": [at.absent(), at.our_layout()] }] },
        ]}
    }

    /// A waiting attempt marks `F.wt` only on a current lease.
    pub(super) fn marks(&self, lock_field: &str, held_by_other: Document) -> Document {
        doc! { "$and": [self.current(lock_field), held_by_other] }
    }

    /// What an acquisition writes at the top: `LockId` = its lease id,
    /// `LockTime = $$NOW`.
    pub(super) fn acquired(&self, lease_id: &Bson) -> Document {
        doc! { &self.id: lease_id.clone(), &self.time: "$$NOW" }
    }

    /// `filter`, only while the lease in `F` is current.
    pub(super) fn only_current(&self, lock_field: &str, filter: Document) -> Document {
        doc! { "$and": [filter, { "$expr": self.current(lock_field) }] }
    }

    /// What a release writes at the top: `LockId: null, LockTime: null`.
    pub(super) fn cleared(&self) -> Document {
        doc! { &self.id: Bson::Null, &self.time: Bson::Null }
    }

    /// A renewal's update pipeline with `LockTime = $$NOW` too.
    pub(super) fn renewing(&self, mut update: Vec<Document>) -> Vec<Document> {
        set_first(&mut update, doc! { &self.time: "$$NOW" });
        update
    }

    /// A release's update pipeline with [`cleared`](Self::cleared) too.
    pub(super) fn releasing(&self, mut update: Vec<Document>) -> Vec<Document> {
        set_first(&mut update, self.cleared());
        update
    }

    /// Update operators with [`cleared`](Self::cleared) too.
    pub(super) fn releasing_operators(&self, update: &Document) -> Document {
        super::write::merge_operators(update, doc! { "$set": self.cleared() })
    }

    /// The temporary fields that keep `LockId` and `LockTime` while a user's
    /// update pipeline runs.
    fn stashes(&self) -> [String; 2] {
        [
            format!("{RESERVED_PREFIX}{}", self.id),
            format!("{RESERVED_PREFIX}{}", self.time),
        ]
    }

    /// `stages` (of `write::write_pipeline`, whose user stages are the
    /// `user_len` after the first) with `LockId` and `LockTime` kept aside
    /// in the first stage and restored right after the user's stages (null
    /// with `release`, or if the user's stages dropped or changed the kept
    /// lock field: it no longer holds `owner` and `token`), whatever those
    /// stages did to them.
    pub(super) fn around_pipeline(
        &self,
        mut stages: Vec<Document>,
        user_len: usize,
        lock_field: &str,
        owner: &str,
        token: u64,
        release: bool,
    ) -> Vec<Document> {
        let [id_stash, time_stash] = self.stashes();
        set_first(
            &mut stages,
            doc! { &id_stash: self.id_var(), &time_stash: self.time_var() },
        );
        let kept = LockPath::under(&format!("{RESERVED_PREFIX}{lock_field}"));
        let still_ours = doc! { "$and": [
            { "$eq": [kept.var(field::OWNER), { "$literal": owner }] },
            { "$eq": [kept.var(field::TOKEN), { "$literal": token as i64 }] },
        ]};
        let restore = |stash: &str| -> Bson {
            if release {
                Bson::Null
            } else {
                doc! { "$cond": [still_ours.clone(), format!("${stash}"), Bson::Null] }.into()
            }
        };
        let restored = doc! { "$set": {
            &self.id: restore(&id_stash),
            &self.time: restore(&time_stash),
        }};
        stages.insert(1 + user_len, restored);
        if let Some(Ok(unset)) = stages.last_mut().map(|last| last.get_array_mut("$unset")) {
            unset.push(id_stash.into());
            unset.push(time_stash.into());
        }
        stages
    }

    /// The projection of `inspect` with `LockId` and `LockTime` too.
    pub(super) fn projecting(&self, mut projection: Document) -> Document {
        projection.insert(&self.id, 1);
        projection.insert(&self.time, 1);
        projection
    }

    /// The lock of `document` as the lock collection's readers read one
    /// (`lock_view`'s view, with `now`, the server's time):
    ///
    /// - while the lease in `F` is current, `F`'s fields ([`lock_view`](super::pipeline::lock_view));
    /// - while `LockId` is set and held by the other clients' rule, a
    ///   foreign holder's lock: owner `LockId` (a UUID as text), taken at
    ///   `LockTime`, expiring at `LockTime + max_duration` (never if
    ///   `LockTime` is not a date);
    /// - otherwise `F` without its lease id, expired at `now` at the
    ///   latest (a lease no longer current), a foreign layout as it is, or
    ///   `None` without `F`.
    pub(super) fn view(
        &self,
        lock_field: &str,
        document: &Document,
        now: Bson,
    ) -> Option<Document> {
        let lock_id = document.get(&self.id).filter(|v| !matches!(v, Bson::Null));
        let lock = document.get_document(lock_field).ok();
        let current = lock_id.is_some_and(|id| {
            read_lease_id(Some(id)).is_some()
                && lock.and_then(|l| l.get(field::LEASE_ID)) == Some(id)
        });
        if current {
            return super::pipeline::lock_view(lock_field, document, now);
        }
        let now_date = now.as_datetime().copied();
        let time = document.get_datetime(&self.time).ok().copied();
        let expiry =
            time.map(|t| DateTime::from_millis(t.timestamp_millis().saturating_add(self.max_ms)));
        if let Some(id) = lock_id {
            // Their rule: free once `LockTime < now - max_duration`.
            let held = match (expiry, now_date) {
                (Some(expiry), Some(now)) => expiry >= now,
                _ => true,
            };
            if held {
                let owner = match read_lease_id(Some(id)) {
                    Some(uuid) => Bson::String(uuid.to_string()),
                    None => id.clone(),
                };
                let mut view = doc! { crate::foreign::OWNER: owner };
                if let Some(time) = time {
                    view.insert(field::RENEWED_AT, time);
                }
                if let Some(expiry) = expiry {
                    // Free at `LockTime + max_duration + 1 ms` by their `<`.
                    let free_at =
                        DateTime::from_millis(expiry.timestamp_millis().saturating_add(1));
                    view.insert(crate::foreign::EXPIRY, free_at);
                }
                view.insert("now", now);
                return Some(view);
            }
        }
        let mut view = super::pipeline::lock_view(lock_field, document, now)?;
        if lock.is_some() {
            view.remove(field::LEASE_ID);
            if let (Ok(exp), Some(now)) = (view.get_datetime(field::EXPIRES_AT), now_date)
                && *exp > now
            {
                view.insert(field::EXPIRES_AT, now);
            }
        }
        Some(view)
    }
}

/// Adds `fields` to the first stage of `pipeline`, a `$set`.
fn set_first(pipeline: &mut [Document], fields: Document) {
    if let Some(Ok(set)) = pipeline.first_mut().map(|s| s.get_document_mut("$set")) {
        set.extend(fields);
    }
}

#[cfg(test)]
mod tests;
