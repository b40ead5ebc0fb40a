//! The BSON of the writes under an in-document lease
//! (`DocumentStore::write_document`): the filter that requires the lease
//! held by the server's clock, and the user's update operators or update
//! pipeline with what leaves the lock field `F` kept, removed or released.
//! What the server does with them is tested against a real `mongod`
//! (`tests/document_lease/`).

use mongodb::bson::{Bson, DateTime, Document, doc};

use super::super::rules::LockPath;
use super::pipeline::remove_update;
use crate::store::{LeaseRef, field};

/// The temporary top-level field that keeps the lock field `lock_field`
/// while the user's update pipeline runs ([`write_pipeline`]).
fn stash(lock_field: &str) -> String {
    format!("{}{lock_field}", crate::document_update::RESERVED_PREFIX)
}

/// The document of `lease` of `owner` while the lease is held by the
/// server's clock: its lease id, its owner id, and `F.exp > $$NOW`. The
/// filter of every write under the lease: [`LockPath::payload_filter`]
/// and `F.exp > $$NOW`.
pub(super) fn held_filter(lock_field: &str, owner: &str, lease: &LeaseRef) -> Document {
    let at = LockPath::under(lock_field);
    let mut filter = at.payload_filter(owner, lease);
    filter.insert(
        "$expr",
        doc! { "$gt": [at.var(field::EXPIRES_AT), "$$NOW"] },
    );
    filter
}

/// [`held_filter`], only while the lock can be removed by the write that
/// releases it: not waited for (no `F.wt`) and its token at least
/// `min_age_ms` old by `$$NOW`.
pub(super) fn held_removable_filter(
    lock_field: &str,
    owner: &str,
    lease: &LeaseRef,
    min_age_ms: i64,
) -> Document {
    let at = LockPath::under(lock_field);
    let mut filter = at.payload_filter(owner, lease);
    filter.insert(at.at(field::WAITING_SINCE), doc! { "$exists": false });
    filter.insert(
        "$expr",
        doc! { "$and": [
            { "$gt": [at.var(field::EXPIRES_AT), "$$NOW"] },
            at.token_older_than(min_age_ms),
        ]},
    );
    filter
}

/// [`held_filter`] with a waiting mark (`F.wt`) or without one.
pub(super) fn held_waited_filter(
    lock_field: &str,
    owner: &str,
    lease: &LeaseRef,
    waited: bool,
) -> Document {
    let mut filter = held_filter(lock_field, owner, lease);
    let at = LockPath::under(lock_field);
    filter.insert(at.at(field::WAITING_SINCE), doc! { "$exists": waited });
    filter
}

/// How a write under an in-document lease leaves the lock field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LockAfter {
    /// Held as it was (`DocumentLease::update`).
    Kept,
    /// Removed (a release of a lease old enough and not waited for).
    Removed,
    /// The released state: no `F.lid` nor `F.wt`, `F.exp` and `F.ts` now.
    /// With `Some(until)`, yielded until then (another owner waited): the
    /// update operators have no server-time arithmetic, so `until` is the
    /// client's clock plus the yield window (`F.yu` only delays this
    /// owner's own next acquisition; it decides no lease).
    Released(Option<DateTime>),
}

/// The user's update operators `user` with ours merged in: an operator both
/// use gets the paths of both (they never overlap: the user's update never
/// names the lock field, `document_update::check_update`).
pub(super) fn merge_operators(user: &Document, ours: Document) -> Document {
    let mut merged = user.clone();
    for (operator, paths) in ours {
        match (merged.get_mut(&operator), paths) {
            (Some(Bson::Document(theirs)), Bson::Document(paths)) => theirs.extend(paths),
            (_, paths) => {
                merged.insert(operator, paths);
            }
        }
    }
    merged
}

/// The user's update operators plus what leaves the lock field `after`.
pub(super) fn write_operators(lock_field: &str, user: &Document, after: LockAfter) -> Document {
    let at = LockPath::under(lock_field);
    let ours = match after {
        LockAfter::Kept => return user.clone(),
        LockAfter::Removed => remove_update(lock_field),
        LockAfter::Released(yielded) => {
            let mut ours = doc! {
                "$unset": { at.at(field::LEASE_ID): "", at.at(field::WAITING_SINCE): "" },
                "$currentDate": {
                    at.at(field::EXPIRES_AT): true,
                    at.at(field::RENEWED_AT): true,
                },
            };
            if let Some(until) = yielded {
                ours.insert("$set", doc! { at.at(field::YIELD_UNTIL): until });
            }
            ours
        }
    };
    merge_operators(user, ours)
}

/// The user's update pipeline `user` run under the lease, `F` kept aside in
/// a temporary top-level field around it (docs/in-document.md, "What your
/// update must not do"). If the user's stages dropped
/// the temporary field (a `$replaceWith` that does not keep `$$ROOT`) or
/// changed it (it no longer holds this owner id and `token`), `F` is
/// restored in the released state with the lease's owner id and `token` (no
/// lease id): the lease is then lost, never a foreign holder's lock.
///
/// With `release`, `F` ends as [`release_update`](super::pipeline::release_update) and the removal of
/// [`held_removable_filter`] would leave it: removed if not waited for and
/// the token at least `min_age_ms` old by `$$NOW`; otherwise released
/// (yielded if waited for).
pub(super) fn write_pipeline(
    lock_field: &str,
    owner: &str,
    token: u64,
    user: &[Document],
    release: bool,
    yield_ms: i64,
    min_age_ms: i64,
) -> Vec<Document> {
    let at = LockPath::under(lock_field);
    let stash = stash(lock_field);
    let kept_at = LockPath::under(&stash);
    let kept = |name: &str| kept_at.var(name);
    let mut stages = Vec::with_capacity(user.len() + 4);
    stages.push(doc! { "$set": { &stash: format!("${lock_field}") } });
    stages.extend(user.iter().cloned());
    let fallback = doc! {
        field::OWNER: { "$literal": owner },
        field::TOKEN: { "$literal": token as i64 },
        field::RENEWED_AT: "$$NOW",
        field::EXPIRES_AT: "$$NOW",
    };
    // Restored only if it still holds this lease (its owner id and token):
    // a stage that dropped or overwrote it must not decide the lock field.
    let still_ours = doc! { "$and": [
        { "$eq": [kept(field::OWNER), { "$literal": owner }] },
        { "$eq": [kept(field::TOKEN), { "$literal": token as i64 }] },
    ]};
    stages.push(
        doc! { "$set": { &stash: { "$cond": [still_ours, format!("${stash}"), fallback] } } },
    );
    if !release {
        stages.push(doc! { "$set": { lock_field: format!("${stash}") } });
        stages.push(doc! { "$unset": [&stash] });
        return stages;
    }
    let waited = doc! { "$ne": [{ "$type": kept(field::WAITING_SINCE) }, "missing"] };
    let removable = doc! { "$and": [
        { "$not": [waited.clone()] },
        { "$eq": [{ "$type": kept(field::TOKEN) }, "long"] },
        kept_at.token_older_than(min_age_ms),
    ]};
    let released = doc! { "$mergeObjects": [format!("${stash}"), {
        field::EXPIRES_AT: { "$min": [kept(field::EXPIRES_AT), "$$NOW"] },
        field::RENEWED_AT: "$$NOW",
        field::YIELD_UNTIL: { "$cond": [
            waited,
            { "$add": ["$$NOW", yield_ms] },
            kept(field::YIELD_UNTIL),
        ]},
    }]};
    stages.push(doc! { "$set": { lock_field: { "$cond": [removable, "$$REMOVE", released] } } });
    stages.push(doc! { "$unset": [
        stash,
        at.at(field::LEASE_ID),
        at.at(field::WAITING_SINCE),
    ]});
    stages
}

#[cfg(test)]
mod tests;
