//! Recognising the manager's batched renewal commands in a command log
//! (shared by `tests/misuse.rs` and `benches/scale.rs`).

use mongodb::bson::{Array, Document};

/// The keys a renewal command renews (the `$in` list of its filter on
/// `_id`), or `None` for any other command. A renewal is an `update` whose
/// pipeline sets `ts`; a release does not.
pub fn renewed_keys(command: &Document) -> Option<&Array> {
    let update = command.get_array("updates").ok()?.first()?.as_document()?;
    let set = update
        .get_array("u")
        .ok()?
        .first()?
        .as_document()?
        .get_document("$set")
        .ok()?;
    if !set.contains_key("ts") {
        return None;
    }
    update
        .get_document("q")
        .ok()?
        .get_document("_id")
        .ok()?
        .get_array("$in")
        .ok()
}
