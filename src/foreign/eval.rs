//! The twin's evaluator of MongoDB aggregation expressions, for the foreign
//! lock rules: literals, field paths (`"$a.b"`, through arrays as MongoDB
//! does), `$$NOW`, `$$ROOT`, `$$CURRENT`, `$$REMOVE`, object and array
//! literals, and the operators of [`OPERATORS`]: `$literal`, `$and`, `$or`,
//! `$not`, `$eq`, `$ne`, `$lt`, `$lte`, `$gt`, `$gte`, `$cmp`, `$in`,
//! `$type`, `$ifNull`, `$cond`, `$add`, `$subtract`, `$multiply`, `$abs`,
//! `$toLong`, `$toDate`, `$toBool`, `$size`, `$objectToArray`, `$strLenCP`,
//! `$isNumber`.
//!
//! As `mongod` (6.0) does, an expression is first optimized, then evaluated:
//! a subtree of constants (`$$NOW` is one) is evaluated up front, so an
//! error in it fails the command even in a branch never taken; the
//! constants of `$and`, `$or`, `$add` and `$multiply` are hoisted past the
//! other operands and folded into one, nested same operators flattened; a
//! false constant makes `$and` false (a true one `$or` true) unevaluated.
//! Then BSON's order across types, numbers compared by value (NaN least),
//! missing below null (`$eq` of missing and null is false), int32 overflow
//! to int64 and int64 overflow to double, a date plus doubles the exact sum
//! rounded to the millisecond with halves toward zero, a date minus a double
//! truncated. Decimal128 is typed, compared with other types and
//! coerced to bool; arithmetic or comparison with one is an `Err`
//! "unsupported in the twin", as are strings to dates. The differential
//! test (`tests.rs`) checks all of this against a real `mongod`.

use std::cmp::Ordering;
use std::collections::VecDeque;

use mongodb::bson::{Bson, DateTime, Decimal128, Document, doc};

type Value = Option<Bson>;
type Res<T> = Result<T, String>;

/// The operators the twin evaluates.
#[rustfmt::skip]
pub(crate) const OPERATORS: &[&str] = &[
    "$literal", "$and", "$or", "$not", "$eq", "$ne", "$lt", "$lte", "$gt", "$gte", "$cmp", "$in",
    "$type", "$ifNull", "$cond", "$add", "$subtract", "$multiply", "$abs", "$toLong", "$toDate",
    "$toBool", "$size", "$objectToArray", "$strLenCP", "$isNumber",
];
/// The variables (`$$NAME`) the twin knows.
const VARIABLES: &[&str] = &["NOW", "ROOT", "CURRENT", "REMOVE"];
const FOLDED: &[&str] = &["$and", "$or", "$add", "$multiply"];
#[rustfmt::skip]
const TWO: &[&str] = &["$eq", "$ne", "$lt", "$lte", "$gt", "$gte", "$cmp", "$in", "$subtract"];
const LONG_END: f64 = 9_223_372_036_854_775_808.0; // 2^63

fn unsupported(what: &str) -> String {
    format!("{what} is unsupported in the twin")
}

/// Evaluates `expr` over `root` at `$$NOW` = `now`: `Ok(None)` for missing.
pub(crate) fn evaluate(expr: &Bson, root: &Document, now: DateTime) -> Res<Value> {
    eval(&fold(expr, now)?, root, now)
}

/// MongoDB's truthiness of a value (missing, null, undefined, false and 0
/// are false).
pub(crate) fn truthy(value: &Value) -> bool {
    match value {
        None | Some(Bson::Null | Bson::Undefined) => false,
        Some(Bson::Boolean(b)) => *b,
        Some(Bson::Int32(n)) => *n != 0,
        Some(Bson::Int64(n)) => *n != 0,
        Some(Bson::Double(d)) => *d != 0.0,
        Some(Bson::Decimal128(d)) => !decimal_zero(d),
        Some(_) => true,
    }
}

/// `Err` naming the first operator or variable of `expr` outside
/// [`OPERATORS`] and the known variables.
pub(crate) fn check(expr: &Bson) -> Res<()> {
    match expr {
        Bson::String(s) => match s.strip_prefix("$$").map(|v| v.split('.').next()) {
            Some(Some(v)) if !VARIABLES.contains(&v) => Err(format!(
                "variable $${v} is not one the twin knows ({VARIABLES:?})"
            )),
            _ => Ok(()),
        },
        Bson::Array(items) => items.iter().try_for_each(check),
        Bson::Document(d) => d.iter().try_for_each(|(k, v)| match k.as_str() {
            "$literal" => Ok(()),
            k if k.starts_with('$') && !OPERATORS.contains(&k) => Err(format!(
                "operator {k} is not one the twin evaluates ({OPERATORS:?})"
            )),
            _ => check(v),
        }),
        _ => Ok(()),
    }
}

/// A constant in a folded expression.
fn lit(value: Value) -> Bson {
    value.map_or("$$REMOVE".into(), |v| doc! { "$literal": v }.into())
}

fn constant(e: &Bson) -> Option<Value> {
    match e {
        Bson::String(s) if s == "$$REMOVE" => Some(None),
        Bson::Document(d) if d.len() == 1 => d.get("$literal").map(|v| Some(v.clone())),
        _ => None,
    }
}

/// The operator of an expression object, if it is one.
fn operator(d: &Document) -> Res<Option<(&str, &Bson)>> {
    match d.iter().next() {
        Some((k, v)) if k.starts_with('$') && d.len() == 1 => Ok(Some((k, v))),
        Some((k, _)) if k.starts_with('$') => Err(format!(
            "an expression specification must contain exactly one field, the name of the expression. Found {} fields in {d}",
            d.len()
        )),
        _ => match d.keys().find(|k| k.starts_with('$') || k.contains('.')) {
            Some(k) => Err(format!(
                "FieldPath field names may not start with '$' or contain '.': {k}"
            )),
            None => Ok(None),
        },
    }
}

/// The arguments of `op` (a single one or an array of them), counted.
fn args(op: &str, arg: &Bson) -> Res<Vec<Bson>> {
    let list = match (op, arg) {
        ("$cond", Bson::Document(d)) => {
            if let Some(k) = d
                .keys()
                .find(|k| !["if", "then", "else"].contains(&k.as_str()))
            {
                return Err(format!("Unrecognized parameter to $cond: {k}"));
            }
            let get = |k| {
                d.get(k)
                    .cloned()
                    .ok_or(format!("Missing '{k}' parameter to $cond"))
            };
            vec![get("if")?, get("then")?, get("else")?]
        }
        (_, Bson::Array(items)) => items.clone(),
        _ => vec![arg.clone()],
    };
    let n = list.len();
    match op {
        "$ifNull" if n < 2 => Err(format!("$ifNull needs at least two arguments, had: {n}")),
        _ if FOLDED.contains(&op) || op == "$ifNull" => Ok(list),
        _ => match if op == "$cond" {
            3
        } else if TWO.contains(&op) {
            2
        } else {
            1
        } {
            k if k == n => Ok(list),
            k => Err(format!(
                "Expression {op} takes exactly {k} arguments. {n} were passed in."
            )),
        },
    }
}

/// `expr` optimized as `mongod` does (see the module docs), its constants
/// `{$literal}` (or `$$REMOVE` for missing), each operator's arguments an
/// array: what [`eval`] reads.
fn fold(expr: &Bson, now: DateTime) -> Res<Bson> {
    let empty = Document::new();
    let all_const = |items: &[Bson]| items.iter().all(|e| constant(e).is_some());
    match expr {
        Bson::String(s) if s.starts_with('$') => {
            let (var, fields) = match s.strip_prefix("$$") {
                Some(v) => v.split_once('.').unwrap_or((v, "x")),
                None => ("CURRENT", &s[1..]),
            };
            if !VARIABLES.contains(&var) {
                return Err(format!("Use of undefined variable: {var}"));
            }
            if let Some(f) = fields
                .split('.')
                .find(|f| f.is_empty() || f.starts_with('$'))
            {
                return Err(format!("Invalid field path {s:?}: field name {f:?}"));
            }
            let folds = var == "NOW" || var == "REMOVE";
            Ok(if folds {
                lit(path(s, &empty, now))
            } else {
                expr.clone()
            })
        }
        Bson::Array(items) => {
            let items: Vec<Bson> = items.iter().map(|e| fold(e, now)).collect::<Res<_>>()?;
            let folds = all_const(&items);
            let array = Bson::Array(items);
            Ok(if folds {
                lit(eval(&array, &empty, now)?)
            } else {
                array
            })
        }
        Bson::Document(d) => match operator(d)? {
            Some(("$literal", v)) => Ok(lit(Some(v.clone()))),
            Some((op, _)) if !OPERATORS.contains(&op) => {
                Err(format!("Unrecognized expression '{op}'"))
            }
            Some((op, arg)) => {
                let kids: Vec<Bson> = args(op, arg)?
                    .iter()
                    .map(|e| fold(e, now))
                    .collect::<Res<_>>()?;
                if all_const(&kids) {
                    return Ok(lit(apply(op, &kids, &empty, now)?));
                }
                if !FOLDED.contains(&op) {
                    return Ok(doc! { op: kids }.into());
                }
                let (mut queue, mut rest, mut consts) = (VecDeque::from(kids), vec![], vec![]);
                while let Some(e) = queue.pop_front() {
                    match e.as_document().and_then(|d| d.get_array(op).ok()) {
                        _ if constant(&e).is_some() => consts.push(e),
                        Some(inner) => inner.iter().rev().for_each(|i| queue.push_front(i.clone())),
                        None => rest.push(e),
                    }
                }
                if consts.len() > 1 {
                    consts = vec![lit(apply(op, &consts, &empty, now)?)];
                }
                if let (Some(Some(last)), "$and" | "$or") = (consts.first().map(constant), op) {
                    if truthy(&last) == (op == "$or") {
                        return Ok(lit(Some(Bson::Boolean(op == "$or"))));
                    }
                    consts.clear();
                }
                rest.extend(consts);
                Ok(doc! { op: rest }.into())
            }
            None => {
                let mut out = Document::new();
                for (k, v) in d {
                    out.insert(k, fold(v, now)?);
                }
                let folds = out.values().all(|e| constant(e).is_some());
                let out = Bson::Document(out);
                Ok(if folds {
                    lit(eval(&out, &empty, now)?)
                } else {
                    out
                })
            }
        },
        _ => Ok(lit(Some(expr.clone()))),
    }
}

/// Evaluates a folded expression.
fn eval(e: &Bson, root: &Document, now: DateTime) -> Res<Value> {
    match e {
        Bson::String(s) if s.starts_with('$') => Ok(path(s, root, now)),
        Bson::Array(items) => {
            let value = |e| Ok(eval(e, root, now)?.unwrap_or(Bson::Null));
            Ok(Some(Bson::Array(
                items.iter().map(value).collect::<Res<_>>()?,
            )))
        }
        Bson::Document(d) => match d.iter().next() {
            Some((op, v)) if op == "$literal" => Ok(Some(v.clone())),
            Some((op, Bson::Array(kids))) if op.starts_with('$') => apply(op, kids, root, now),
            _ => {
                let mut out = Document::new();
                for (k, v) in d {
                    if let Some(v) = eval(v, root, now)? {
                        out.insert(k, v);
                    }
                }
                Ok(Some(out.into()))
            }
        },
        _ => Ok(Some(e.clone())),
    }
}

/// A field path or variable: through embedded documents, and through an
/// array to the values of its documents' fields.
fn path(s: &str, root: &Document, now: DateTime) -> Value {
    fn walk(value: Option<&Bson>, fields: &[&str]) -> Value {
        match (value?, fields) {
            (v, []) => Some(v.clone()),
            (Bson::Document(d), [f, rest @ ..]) => walk(d.get(*f), rest),
            (Bson::Array(items), _) => Some(Bson::Array(
                items
                    .iter()
                    .filter(|i| matches!(i, Bson::Document(_)))
                    .filter_map(|i| walk(Some(i), fields))
                    .collect(),
            )),
            _ => None,
        }
    }
    let fields: Vec<&str> = s.trim_start_matches('$').split('.').collect();
    match (s.starts_with("$$"), fields[0]) {
        (true, "NOW") => walk(Some(&Bson::DateTime(now)), &fields[1..]),
        (true, "REMOVE") => None,
        (true, _) => walk(Some(&Bson::Document(root.clone())), &fields[1..]),
        (false, _) => walk(Some(&Bson::Document(root.clone())), &fields),
    }
}

/// `op` over its (folded) arguments.
fn apply(op: &str, kids: &[Bson], root: &Document, now: DateTime) -> Res<Value> {
    let arg = |i: usize| eval(&kids[i], root, now);
    let values = || kids.iter().map(|e| eval(e, root, now));
    let order = |ok: fn(Ordering) -> bool| Ok(Some(ok(compare(&arg(0)?, &arg(1)?)?).into()));
    match op {
        "$and" | "$or" => {
            for v in values() {
                if truthy(&v?) == (op == "$or") {
                    return Ok(Some((op == "$or").into()));
                }
            }
            Ok(Some((op == "$and").into()))
        }
        "$not" => Ok(Some((!truthy(&arg(0)?)).into())),
        "$eq" => order(Ordering::is_eq),
        "$ne" => order(Ordering::is_ne),
        "$lt" => order(Ordering::is_lt),
        "$lte" => order(Ordering::is_le),
        "$gt" => order(Ordering::is_gt),
        "$gte" => order(Ordering::is_ge),
        "$cmp" => Ok(Some(Bson::Int32(compare(&arg(0)?, &arg(1)?)? as i32))),
        "$in" => {
            let x = arg(0)?;
            match arg(1)? {
                Some(Bson::Array(items)) => {
                    for item in items {
                        if compare(&x, &Some(item))?.is_eq() {
                            return Ok(Some(true.into()));
                        }
                    }
                    Ok(Some(false.into()))
                }
                v => Err(format!(
                    "$in requires an array as a second argument, found: {}",
                    type_name(&v)
                )),
            }
        }
        "$type" => Ok(Some(type_name(&arg(0)?).into())),
        "$isNumber" => Ok(Some(
            matches!(
                arg(0)?,
                Some(Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_))
            )
            .into(),
        )),
        "$ifNull" => {
            for (i, v) in values().enumerate() {
                let v = v?;
                if !matches!(v, None | Some(Bson::Null | Bson::Undefined)) || i == kids.len() - 1 {
                    return Ok(v);
                }
            }
            Ok(None)
        }
        "$cond" => arg(if truthy(&arg(0)?) { 1 } else { 2 }),
        "$add" => add(values()),
        "$multiply" => multiply(values()),
        "$subtract" => subtract(arg(0)?, arg(1)?),
        "$size" => match arg(0)? {
            Some(Bson::Array(a)) => Ok(Some(Bson::Int32(a.len() as i32))),
            v => Err(format!(
                "The argument to $size must be an array, but was of type: {}",
                type_name(&v)
            )),
        },
        "$strLenCP" => match arg(0)? {
            Some(Bson::String(s)) => Ok(Some(Bson::Int32(s.chars().count() as i32))),
            v => Err(format!(
                "$strLenCP requires a string argument, found: {}",
                type_name(&v)
            )),
        },
        _ => unary(op, arg(0)?),
    }
}

/// The one-argument operators that return null for a nullish argument.
fn unary(op: &str, v: Value) -> Res<Value> {
    let Some(v) = v.filter(|v| !matches!(v, Bson::Null | Bson::Undefined)) else {
        return Ok(Some(Bson::Null));
    };
    let (name, to) = (type_name(&Some(v.clone())), op[3..].to_lowercase());
    let fail = || {
        Err(format!(
            "Unsupported conversion from {name} to {to} in $convert with no onError value"
        ))
    };
    Ok(Some(match (op, &v) {
        ("$abs", Bson::Double(d)) => Bson::Double(d.abs()),
        ("$abs", Bson::Int32(n)) => int_or_long(i64::from(*n).abs()),
        ("$abs", Bson::Int64(n)) => {
            Bson::Int64(n.checked_abs().ok_or("can't take $abs of long long min")?)
        }
        ("$abs", _) => return widen(0, &v, op).and(Err(unsupported("$abs of a decimal"))),
        ("$objectToArray", Bson::Document(d)) => Bson::Array(
            d.iter()
                .map(|(k, v)| doc! { "k": k, "v": v.clone() }.into())
                .collect(),
        ),
        ("$objectToArray", _) => {
            return Err(format!(
                "$objectToArray requires a document input, found: {name}"
            ));
        }
        ("$toBool", _) => Bson::Boolean(truthy(&Some(v.clone()))),
        (_, Bson::Decimal128(_)) => return Err(unsupported("converting a decimal")),
        ("$toLong", Bson::Int32(n)) => Bson::Int64(i64::from(*n)),
        ("$toLong", Bson::Int64(n)) => Bson::Int64(*n),
        ("$toLong", Bson::Double(d)) => Bson::Int64(double_to_long(*d)?),
        ("$toLong", Bson::Boolean(b)) => Bson::Int64(i64::from(*b)),
        ("$toLong", Bson::DateTime(d)) => Bson::Int64(d.timestamp_millis()),
        ("$toLong", Bson::String(s)) => Bson::Int64(s.parse().map_err(|e| {
            format!("Failed to parse number '{s}' in $convert with no onError value: {e}")
        })?),
        ("$toDate", Bson::Int64(n)) => Bson::DateTime(DateTime::from_millis(*n)),
        ("$toDate", Bson::Double(d)) => Bson::DateTime(DateTime::from_millis(double_to_long(*d)?)),
        ("$toDate", Bson::DateTime(_)) => v.clone(),
        ("$toDate", Bson::ObjectId(o)) => {
            let [a, b, c, d, ..] = o.bytes();
            Bson::DateTime(DateTime::from_millis(
                i64::from(i32::from_be_bytes([a, b, c, d])) * 1000,
            ))
        }
        ("$toDate", Bson::Timestamp(t)) => {
            Bson::DateTime(DateTime::from_millis(i64::from(t.time) * 1000))
        }
        ("$toDate", Bson::String(_)) => return Err(unsupported("$toDate of a string")),
        _ => return fail(),
    }))
}

fn double_to_long(d: f64) -> Res<i64> {
    match d {
        d if d.is_nan() => Err("Attempt to convert NaN value to integer".into()),
        d if d.is_infinite() => Err("Attempt to convert infinity value to integer".into()),
        d if (-LONG_END..LONG_END).contains(&d) => Ok(d as i64),
        d => Err(format!(
            "Conversion would overflow target type in $convert with no onError value: {d}"
        )),
    }
}

fn int_or_long(n: i64) -> Bson {
    i32::try_from(n).map_or(Bson::Int64(n), Bson::Int32)
}

/// The widest numeric type of `w` (0 int, 1 long, 2 double) and `v`.
fn widen(w: u8, v: &Bson, op: &str) -> Res<u8> {
    match v {
        Bson::Int32(_) => Ok(w),
        Bson::Int64(_) => Ok(w.max(1)),
        Bson::Double(_) => Ok(2),
        Bson::Decimal128(_) => Err(unsupported("decimal arithmetic")),
        _ => Err(format!(
            "{op} only supports numeric types, not {}",
            type_name(&Some(v.clone()))
        )),
    }
}

fn long(v: &Bson) -> i64 {
    match v {
        Bson::Int32(n) => i64::from(*n),
        Bson::Int64(n) => *n,
        Bson::Double(d) if d.is_nan() || !(-LONG_END..LONG_END).contains(d) => i64::MIN,
        Bson::Double(d) => *d as i64,
        _ => 0,
    }
}

fn double(v: &Bson) -> f64 {
    match v {
        Bson::Double(d) => *d,
        v => long(v) as f64,
    }
}

/// `$add`: integers exactly (int32 overflow to int64, int64 overflow to
/// double), doubles in order; with a date, the exact sum rounded to the
/// nearest millisecond, halves toward zero (the server's compensated sum).
fn add(values: impl Iterator<Item = Res<Value>>) -> Res<Value> {
    let mut operands = vec![];
    for v in values {
        match v? {
            None | Some(Bson::Null | Bson::Undefined) => return Ok(Some(Bson::Null)),
            Some(Bson::DateTime(_)) if operands.iter().any(|o| matches!(o, Bson::DateTime(_))) => {
                return Err("only one date allowed in an $add expression".into());
            }
            Some(v @ Bson::DateTime(_)) => operands.push(v),
            Some(v) => {
                widen(0, &v, "$add").map_err(|e| e.replace("numeric", "numeric or date"))?;
                operands.push(v);
            }
        }
    }
    if operands.iter().any(|o| matches!(o, Bson::DateTime(_))) {
        let overflow = || "date overflow in $add".to_string();
        let (mut whole, mut fraction) = (0i128, 0f64);
        for v in &operands {
            match v {
                Bson::DateTime(d) => whole += i128::from(d.timestamp_millis()),
                Bson::Double(d) if d.is_nan() || d.abs() >= 1e30 => return Err(overflow()),
                Bson::Double(d) => {
                    (whole, fraction) = (whole + d.trunc() as i128, fraction + d.fract())
                }
                v => whole += i128::from(long(v)),
            }
        }
        whole += fraction.trunc() as i128;
        let mut f = fraction.fract();
        if whole > 0 && f < 0.0 || whole < 0 && f > 0.0 {
            (whole, f) = (whole + f.signum() as i128, f - f.signum());
        }
        if f.abs() > 0.5 {
            whole += f.signum() as i128;
        }
        return Ok(Some(Bson::DateTime(DateTime::from_millis(
            i64::try_from(whole).map_err(|_| overflow())?,
        ))));
    }
    let (mut total, mut sum, mut w) = (0i64, 0f64, 0u8);
    for v in &operands {
        let wider = widen(w, v, "$add")?;
        if wider == 2 {
            sum = if w == 2 { sum } else { total as f64 } + double(v);
        } else if let Some(t) = total.checked_add(long(v)) {
            total = t;
        } else {
            (sum, w) = (total as f64 + double(v), 2);
            continue;
        }
        w = wider;
    }
    Ok(Some(
        [int_or_long(total), Bson::Int64(total), Bson::Double(sum)][usize::from(w)].clone(),
    ))
}

fn multiply(values: impl Iterator<Item = Res<Value>>) -> Res<Value> {
    let (mut product, mut exact, mut w) = (1f64, 1i64, 0u8);
    for v in values {
        let v = match v? {
            None | Some(Bson::Null | Bson::Undefined) => return Ok(Some(Bson::Null)),
            Some(v) => v,
        };
        w = widen(w, &v, "$multiply")?;
        product *= double(&v);
        if w < 2 {
            exact = exact.checked_mul(long(&v)).unwrap_or_else(|| {
                w = 2;
                0
            });
        }
    }
    Ok(Some(
        [
            int_or_long(exact),
            Bson::Int64(exact),
            Bson::Double(product),
        ][usize::from(w)]
        .clone(),
    ))
}

fn subtract(l: Value, r: Value) -> Res<Value> {
    let (lt, rt) = (type_name(&l), type_name(&r));
    let (Some(a), Some(b)) = (l, r) else {
        return Ok(Some(Bson::Null));
    };
    match (widen(0, &a, "").and_then(|w| widen(w, &b, "")), &a, &b) {
        (Ok(2), ..) => Ok(Some(Bson::Double(double(&a) - double(&b)))),
        (Ok(w), ..) => Ok(Some(match long(&a).checked_sub(long(&b)) {
            Some(d) if w == 0 => int_or_long(d),
            Some(d) => Bson::Int64(d),
            None => Bson::Double(double(&a) - double(&b)),
        })),
        (_, Bson::Null | Bson::Undefined, _) | (_, _, Bson::Null | Bson::Undefined) => {
            Ok(Some(Bson::Null))
        }
        (_, Bson::Decimal128(_), _) | (_, _, Bson::Decimal128(_)) => {
            Err(unsupported("decimal arithmetic"))
        }
        (_, Bson::DateTime(x), Bson::DateTime(y)) => {
            let d = x.timestamp_millis().checked_sub(y.timestamp_millis());
            Ok(Some(Bson::Int64(d.ok_or("date overflow in $subtract")?)))
        }
        (_, Bson::DateTime(x), Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)) => {
            Ok(Some(Bson::DateTime(DateTime::from_millis(
                x.timestamp_millis().wrapping_sub(long(&b)),
            ))))
        }
        _ => Err(format!("can't $subtract {rt} from {lt}")),
    }
}

/// Whether a Decimal128 is zero (its coefficient is 0, or out of range).
fn decimal_zero(d: &Decimal128) -> bool {
    let bits = u128::from_le_bytes(d.bytes());
    if (bits >> 125) & 3 == 3 {
        return (bits >> 123) & 15 != 15;
    }
    let coefficient = bits & ((1 << 113) - 1);
    coefficient == 0 || coefficient >= 10u128.pow(34)
}

/// A value's `$type` name and its type's rank in BSON's order.
fn kind(v: &Value) -> (&'static str, i32) {
    let Some(v) = v else { return ("missing", 0) };
    match v {
        Bson::MinKey => ("minKey", -1),
        Bson::Undefined => ("undefined", 0),
        Bson::Null => ("null", 5),
        Bson::Int32(_) => ("int", 10),
        Bson::Int64(_) => ("long", 10),
        Bson::Double(_) => ("double", 10),
        Bson::Decimal128(_) => ("decimal", 10),
        Bson::String(_) => ("string", 15),
        Bson::Symbol(_) => ("symbol", 15),
        Bson::Document(_) => ("object", 20),
        Bson::Array(_) => ("array", 25),
        Bson::Binary(_) => ("binData", 30),
        Bson::ObjectId(_) => ("objectId", 35),
        Bson::Boolean(_) => ("bool", 40),
        Bson::DateTime(_) => ("date", 45),
        Bson::Timestamp(_) => ("timestamp", 47),
        Bson::RegularExpression(_) => ("regex", 50),
        Bson::DbPointer(_) => ("dbPointer", 55),
        Bson::JavaScriptCode(_) => ("javascript", 60),
        Bson::JavaScriptCodeWithScope(_) => ("javascriptWithScope", 65),
        Bson::MaxKey => ("maxKey", 127),
    }
}

fn type_name(v: &Value) -> &'static str {
    kind(v).0
}

fn rank(v: &Value) -> i32 {
    kind(v).1
}

/// BSON's order of two values, as MongoDB compares them.
fn compare(a: &Value, b: &Value) -> Res<Ordering> {
    use Bson::*;
    let (Some(x), Some(y)) = (a, b) else {
        return Ok(rank(a).cmp(&rank(b)));
    };
    let by_rank = rank(a).cmp(&rank(b));
    // i64 against f64, exactly; NaN is the least number.
    let long_double = |l: i64, d: f64| match d {
        d if d.is_nan() || d < -LONG_END => Ordering::Greater,
        d if d >= LONG_END => Ordering::Less,
        d if l as f64 == d => l.cmp(&(d as i64)),
        d => (l as f64).total_cmp(&d),
    };
    Ok(match (x, y) {
        _ if by_rank.is_ne() => by_rank,
        (Decimal128(_), _) | (_, Decimal128(_)) => return Err(unsupported("comparing a decimal")),
        (Double(p), Double(q)) => p
            .partial_cmp(q)
            .unwrap_or_else(|| q.is_nan().cmp(&p.is_nan())),
        (Double(d), n) => long_double(long(n), *d).reverse(),
        (n, Double(d)) => long_double(long(n), *d),
        (Int32(_) | Int64(_), n) => long(x).cmp(&long(n)),
        (String(p), String(q)) => p.cmp(q),
        (Document(_), Document(_)) | (Array(_), Array(_)) => {
            // Field by field: the type's rank, the name, the value; then the length.
            let fields = |v: &Bson| match v {
                Document(d) => d
                    .iter()
                    .map(|(k, v)| (k.clone(), Some(v.clone())))
                    .collect(),
                Array(a) => a
                    .iter()
                    .map(|v| (std::string::String::new(), Some(v.clone())))
                    .collect::<Vec<_>>(),
                _ => vec![],
            };
            let (p, q) = (fields(x), fields(y));
            for ((pk, pv), (qk, qv)) in p.iter().zip(&q) {
                let o = rank(pv)
                    .cmp(&rank(qv))
                    .then(pk.cmp(qk))
                    .then(compare(pv, qv)?);
                if o.is_ne() {
                    return Ok(o);
                }
            }
            p.len().cmp(&q.len())
        }
        (Binary(p), Binary(q)) => (p.bytes.len(), u8::from(p.subtype), &p.bytes).cmp(&(
            q.bytes.len(),
            u8::from(q.subtype),
            &q.bytes,
        )),
        (ObjectId(p), ObjectId(q)) => p.bytes().cmp(&q.bytes()),
        (Boolean(p), Boolean(q)) => p.cmp(q),
        (DateTime(p), DateTime(q)) => p.cmp(q),
        (Timestamp(p), Timestamp(q)) => (p.time, p.increment).cmp(&(q.time, q.increment)),
        (RegularExpression(p), RegularExpression(q)) => {
            (&p.pattern, &p.options).cmp(&(&q.pattern, &q.options))
        }
        (JavaScriptCode(p), JavaScriptCode(q)) => p.cmp(q),
        (Null, _) | (Undefined, _) | (MinKey, _) | (MaxKey, _) => Ordering::Equal,
        _ => return Err(unsupported("comparing these types")),
    })
}

#[cfg(test)]
mod tests;
