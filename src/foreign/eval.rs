//! STUB: the twin's evaluator of aggregation expressions (to be written).

use mongodb::bson::{Bson, DateTime, Document};

/// The operators the twin evaluates.
pub(crate) const OPERATORS: &[&str] = &[];

/// Evaluates `expr` over `root` at `$$NOW` = `now`: `Ok(None)` for missing.
pub(crate) fn evaluate(
    expr: &Bson,
    root: &Document,
    now: DateTime,
) -> Result<Option<Bson>, String> {
    let _ = (expr, root, now);
    Err("unsupported".into())
}

/// MongoDB's truthiness of a value (missing, null, false and 0 are false).
pub(crate) fn truthy(value: &Option<Bson>) -> bool {
    !matches!(value, None | Some(Bson::Null) | Some(Bson::Boolean(false)))
}

/// `Err` naming the first operator of `expr` outside [`OPERATORS`].
pub(crate) fn check(expr: &Bson) -> Result<(), String> {
    let _ = expr;
    Ok(())
}
