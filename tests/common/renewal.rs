//! Recognising the manager's batched renewal commands in a command log
//! (shared by `tests/misuse/`, `tests/sharing/` and `benches/scale.rs`,
//! each of which uses part of it).
#![allow(dead_code)]

use mongodb::bson::{Array, Document};

/// The keys a renewal command renews (the `$in` list of its filter on
/// `_id`), or `None` for any other command. A renewal is an `update` whose
/// pipeline sets `ts`; a release does not.
pub fn renewed_keys(command: &Document) -> Option<&Array> {
    let (update, _) = renewal_update(command)?;
    update
        .get_document("q")
        .ok()?
        .get_document("_id")
        .ok()?
        .get_array("$in")
        .ok()
}

/// The TTL a renewal command sets (milliseconds added to `$$NOW` for `exp`,
/// in `exp = max(exp, $$NOW + ttl)`), or `None` for any other command.
pub fn renewal_ttl_ms(command: &Document) -> Option<i64> {
    let (_, set) = renewal_update(command)?;
    match set
        .get_document("exp")
        .ok()?
        .get_array("$max")
        .ok()?
        .get(1)?
        .as_document()?
        .get_array("$add")
        .ok()?
        .get(1)?
    {
        mongodb::bson::Bson::Int64(ms) => Some(*ms),
        mongodb::bson::Bson::Int32(ms) => Some(i64::from(*ms)),
        _ => None,
    }
}

/// A renewal command's one update statement and its pipeline's `$set`
/// stage (which sets `ts`; a release does not), or `None` for any other
/// command.
fn renewal_update(command: &Document) -> Option<(&Document, &Document)> {
    let update = command.get_array("updates").ok()?.first()?.as_document()?;
    let set = update
        .get_array("u")
        .ok()?
        .first()?
        .as_document()?
        .get_document("$set")
        .ok()?;
    set.contains_key("ts").then_some((update, set))
}
