//! The twin's evaluator of MongoDB aggregation expressions for the foreign
//! lock rules: literals, object and array literals, field paths (`"$a.b"`,
//! through embedded documents), `$$NOW`, `$$ROOT`, `$$CURRENT`, `$$REMOVE`
//! and the [`OPERATORS`], left to right (`$and`, `$or`, `$cond` and
//! `$switch` lazy). Where `mongod` (6.0) and the twin both give a value, the
//! values are equal; errors may differ. The semantics it copies, and what
//! it refuses, are docs/sharing.md's "What the simulation evaluates";
//! `tests.rs` checks them against `mongod`.

use std::cmp::Ordering;

use mongodb::bson::{Bson, DateTime, Document};

type Value = Option<Bson>;
pub(crate) type Res<T> = Result<T, String>;

/// The operators the twin evaluates.
#[rustfmt::skip]
pub(crate) const OPERATORS: &[&str] = &[
    "$literal", "$and", "$or", "$not", "$eq", "$ne", "$lt", "$lte", "$gt", "$gte", "$type",
    "$ifNull", "$cond", "$switch", "$add", "$multiply", "$toLong", "$toDate",
];
const VARIABLES: &[&str] = &["NOW", "ROOT", "CURRENT", "REMOVE"];

fn unsupported(what: &str) -> String {
    format!("{what} is unsupported in the twin")
}

/// MongoDB's truth of a value (missing, null, undefined, false, 0: false).
fn truth(value: &Value) -> Res<bool> {
    match value {
        Some(Bson::Decimal128(_)) => Err(unsupported("the truth of a decimal")),
        Some(v @ (Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))) => Ok(double(v) != 0.0),
        v => Ok(!nullish(v) && v != &Some(Bson::Boolean(false))),
    }
}

fn nullish(value: &Value) -> bool {
    matches!(value, None | Some(Bson::Null | Bson::Undefined))
}

/// `Err` naming the first operator or variable of `expr` outside
/// [`OPERATORS`] and the known variables, or the first `$add` or
/// `$multiply` that `mongod` may evaluate in another order than written.
pub(crate) fn check(expr: &Bson) -> Res<()> {
    match expr {
        Bson::String(s) => match s.strip_prefix("$$").and_then(|v| v.split('.').next()) {
            Some(v) if !VARIABLES.contains(&v) => Err(format!("variable $${v} is unknown")),
            _ => Ok(()),
        },
        Bson::Array(items) => items.iter().try_for_each(check),
        Bson::Document(d) => d.iter().try_for_each(|(k, v)| match k.as_str() {
            "$literal" => Ok(()),
            k if k.starts_with('$') && !OPERATORS.contains(&k) => Err(format!("{k} is unknown")),
            "$add" | "$multiply" if !written_order(k, v) => Err(format!(
                "{k} in another order than mongod's: a constant not last, or a {k}, $cond, \
                 $switch or $ifNull inside"
            )),
            _ => check(v),
        }),
        _ => Ok(()),
    }
}

/// Evaluates `expr` over `root` at `$$NOW` = `now`: `Ok(None)` for missing.
pub(crate) fn evaluate(expr: &Bson, root: &Document, now: DateTime) -> Res<Value> {
    match expr {
        Bson::String(s) if s.starts_with('$') => {
            let path = s.strip_prefix("$$").map(str::to_string);
            let path = path.unwrap_or_else(|| format!("CURRENT.{}", &s[1..]));
            let mut fields = path.split('.');
            let value = match fields.next() {
                Some("NOW") => Some(Bson::DateTime(now)),
                Some("REMOVE") => None,
                Some("ROOT" | "CURRENT") => Some(root.clone().into()),
                _ => return Err(format!("undefined variable in {s}")),
            };
            fields.try_fold(value, |value, field| match value {
                Some(Bson::Document(mut d)) => Ok(d.remove(field)),
                Some(Bson::Array(_)) => Err(unsupported(&format!("{s} through an array"))),
                _ => Ok(None),
            })
        }
        Bson::Array(items) => {
            let item = |e| Ok(evaluate(e, root, now)?.unwrap_or(Bson::Null));
            let items: Vec<Bson> = items.iter().map(item).collect::<Res<_>>()?;
            Ok(Some(items.into()))
        }
        Bson::Document(d) => match d.iter().next() {
            Some((op, spec)) if op.starts_with('$') && d.len() == 1 => apply(op, spec, root, now),
            Some((op, _)) if op.starts_with('$') => Err(format!("{op} is not alone in {d}")),
            _ => {
                let mut out = Document::new();
                for (k, v) in d {
                    if let Some(v) = evaluate(v, root, now)? {
                        out.insert(k, v);
                    }
                }
                Ok(Some(out.into()))
            }
        },
        _ => Ok(Some(expr.clone())),
    }
}

/// `op` over its arguments (an array of them, or a single one).
fn apply(op: &str, spec: &Bson, root: &Document, now: DateTime) -> Res<Value> {
    let kids: Vec<&Bson> = match (op, spec) {
        ("$literal", _) => return Ok(Some(spec.clone())),
        ("$cond", Bson::Document(d)) => (["if", "then", "else"].iter())
            .map(|k| d.get(k).ok_or(format!("$cond needs '{k}'")))
            .collect::<Res<_>>()?,
        _ => spec.as_array().map_or(vec![spec], |a| a.iter().collect()),
    };
    let arg = |i: usize| kids.get(i).map_or(Ok(None), |e| evaluate(e, root, now));
    let yes = |b: bool| -> Res<Value> { Ok(Some(b.into())) };
    let order = |ok: fn(Ordering) -> bool| yes(ok(compare(&arg(0)?, &arg(1)?)?));
    match op {
        "$and" | "$or" => {
            let mut truths = kids.iter().map(|e| truth(&evaluate(e, root, now)?));
            let decided = truths.find(|t| t != &Ok(op == "$and")).transpose()?;
            yes(decided.is_some() == (op == "$or"))
        }
        "$not" => yes(!truth(&arg(0)?)?),
        "$eq" => order(Ordering::is_eq),
        "$ne" => order(Ordering::is_ne),
        "$lt" => order(Ordering::is_lt),
        "$lte" => order(Ordering::is_le),
        "$gt" => order(Ordering::is_gt),
        "$gte" => order(Ordering::is_ge),
        "$type" => Ok(Some(kind(&arg(0)?).0.into())),
        "$ifNull" => {
            let mut values = (0..kids.len()).map(arg);
            let found = values.find(|v| !matches!(v, Ok(v) if nullish(v)));
            found.unwrap_or_else(|| arg(kids.len().max(1) - 1))
        }
        "$cond" => arg(if truth(&arg(0)?)? { 1 } else { 2 }),
        "$switch" => {
            let spec = spec.as_document().ok_or("$switch needs an object")?;
            for branch in spec.get_array("branches").map_err(|e| e.to_string())? {
                let part = |k| branch.as_document().and_then(|b| b.get(k));
                let (Some(case), Some(then)) = (part("case"), part("then")) else {
                    return Err("$switch needs each branch's case and then".into());
                };
                if truth(&evaluate(case, root, now)?)? {
                    return evaluate(then, root, now);
                }
            }
            evaluate(
                spec.get("default").ok_or("$switch: no case, no default")?,
                root,
                now,
            )
        }
        "$add" | "$multiply" => arith(op, (0..kids.len()).map(arg).collect::<Res<Vec<_>>>()?),
        "$toLong" | "$toDate" => convert(op, arg(0)?),
        _ => Err(format!("Unrecognized expression '{op}'")),
    }
}

/// Whether `mongod` takes `e` for a constant (folded before evaluating).
fn constant(e: &Bson) -> bool {
    match e {
        Bson::String(s) => !s.starts_with('$') || s.starts_with("$$NOW") || s == "$$REMOVE",
        Bson::Array(items) => items.iter().all(constant),
        Bson::Document(d) => d.contains_key("$literal") || d.values().all(constant),
        _ => true,
    }
}

/// Whether `mongod` evaluates `op`'s operands `spec` as written: it folds
/// the constants into one, moved last, and flattens an `op` inside (also
/// one that a `$cond`, `$switch` or `$ifNull` reduces to).
fn written_order(op: &str, spec: &Bson) -> bool {
    fn holds(e: &Bson, ops: &[&str]) -> bool {
        let found = |(k, v): (&String, &Bson)| ops.contains(&k.as_str()) || holds(v, ops);
        match e {
            Bson::Array(items) => items.iter().any(|e| holds(e, ops)),
            Bson::Document(d) => d.iter().any(found),
            _ => false,
        }
    }
    let reorders = |e: &Bson| !constant(e) && holds(e, &[op, "$cond", "$switch", "$ifNull"]);
    let one = std::slice::from_ref(spec);
    let kids = spec.as_array().map_or(one, Vec::as_slice);
    let constants = kids.iter().filter(|e| constant(e)).count();
    !kids.iter().any(reorders)
        && (constants == kids.len()
            || constants == 0
            || (constants == 1 && kids.last().is_some_and(constant)))
}

/// `$add` or `$multiply` in order (`written_order`): integers exactly (int32
/// overflow to int64, for `$multiply` int64 to double); doubles, for `$add`
/// only while each step is exact (`mongod` compensates its sum), else
/// "unsupported in the twin", as past int64; with a date, the exact sum
/// rounded to the millisecond, halves toward zero.
fn arith(op: &str, values: impl IntoIterator<Item = Value>) -> Res<Value> {
    let add = op == "$add";
    let (mut exact, mut float, mut w, mut date) = (i64::from(!add), f64::from(!add), 0, false);
    let (mut whole, mut fraction) = (0i128, 0f64); // the exact sum, for a date
    let (mut inexact, mut inexact_fraction) = (false, false);
    for v in values {
        let (v, wider) = match v {
            v if nullish(&v) => return Ok(Some(Bson::Null)),
            Some(Bson::DateTime(d)) if add && !date => {
                (date, whole) = (true, whole + i128::from(d.timestamp_millis()));
                continue;
            }
            Some(v @ Bson::Int32(_)) => (v, w),
            Some(v @ Bson::Int64(_)) => (v, w.max(1)),
            Some(v @ Bson::Double(_)) => (v, 2),
            Some(Bson::Decimal128(_)) => return Err(unsupported("decimal arithmetic")),
            v => return Err(format!("{op} of a {}", kind(&v).0)),
        };
        let (n, d) = (long(&v), double(&v));
        let (t, f) = v
            .as_f64()
            .map_or((n.into(), 0.0), |d| (d.trunc() as i128, d.fract()));
        inexact_fraction |= two_sum(fraction, f) != 0.0;
        (whole, fraction) = (whole.saturating_add(t), fraction + f);
        if !add {
            float *= d;
            let product = exact.checked_mul(n).filter(|_| wider < 2);
            (exact, w) = product.map_or((exact, 2), |p| (p, wider));
        } else if wider < 2 {
            (exact, w) = (exact.checked_add(n).ok_or("int64 overflow")?, wider);
        } else {
            // A double total from here, each step exact (integers too).
            let converts = |n: i64| n as f64 as i128 == i128::from(n);
            let from = if w == 2 { float } else { exact as f64 };
            let lost = (w < 2 && !converts(exact)) || (v.as_f64().is_none() && !converts(n));
            inexact |= lost || two_sum(from, d) != 0.0;
            (float, w) = (from + d, 2);
        }
    }
    if add && (if date { inexact_fraction } else { inexact }) {
        return Err(unsupported("an inexact $add"));
    }
    if date {
        let f = fraction.fract();
        whole += fraction.trunc() as i128;
        // Past 2^52 ms, mongod's rounding depends on how it splits its sum.
        if f != 0.0 && whole.unsigned_abs() >= 1 << 52 {
            return Err(unsupported("a fraction of a ms so far from 1970"));
        }
        if f.abs() > 0.5 || (f.abs() == 0.5 && (whole as f64) * f < 0.0) {
            whole += f.signum() as i128;
        }
        let ms = i64::try_from(whole).ok().filter(|_| !f.is_nan());
        return Ok(Some(
            DateTime::from_millis(ms.ok_or("date overflow")?).into(),
        ));
    }
    Ok(Some(match w {
        0 => i32::try_from(exact).map_or(Bson::Int64(exact), Bson::Int32),
        1 => Bson::Int64(exact),
        _ => Bson::Double(float),
    }))
}

/// The rounding error of `a + b` (Knuth's TwoSum; 0 for an exact sum or
/// a non-finite one).
fn two_sum(a: f64, b: f64) -> f64 {
    let s = a + b;
    let (b1, a1) = (s - a, s - (s - a));
    let error = (a - a1) + (b - b1);
    if s.is_finite() { error } else { 0.0 }
}

/// `$toDate` or `$toLong` (null for null or missing).
fn convert(op: &str, v: Value) -> Res<Value> {
    const LONG_END: f64 = 9_223_372_036_854_775_808.0; // 2^63
    let n = match (v, op == "$toDate") {
        (v, _) if nullish(&v) => return Ok(Some(Bson::Null)),
        (Some(Bson::Int32(n)), false) => i64::from(n),
        (Some(Bson::Int64(n)), _) => n,
        (Some(Bson::Double(d)), _) if (-LONG_END..LONG_END).contains(&d) => d as i64,
        (Some(Bson::DateTime(d)), _) => d.timestamp_millis(),
        (v, _) => return Err(unsupported(&format!("{op} of a {}", kind(&v).0))),
    };
    let date = Bson::DateTime(DateTime::from_millis(n));
    Ok(Some(if op == "$toDate" { date } else { n.into() }))
}

fn long(v: &Bson) -> i64 {
    v.as_i32().map_or(v.as_i64().unwrap_or(0), i64::from)
}

fn double(v: &Bson) -> f64 {
    v.as_f64().unwrap_or(long(v) as f64)
}

/// A value's `$type` name and its type's rank in BSON's order.
#[rustfmt::skip]
fn kind(v: &Value) -> (&'static str, i32) {
    use Bson::*;
    let Some(v) = v else { return ("missing", 0) };
    match v {
        MinKey => ("minKey", -1), Undefined => ("undefined", 0), Null => ("null", 5),
        Int32(_) => ("int", 10), Int64(_) => ("long", 10), Double(_) => ("double", 10),
        Decimal128(_) => ("decimal", 10), String(_) => ("string", 15), Symbol(_) => ("symbol", 15),
        Document(_) => ("object", 20), Array(_) => ("array", 25), Binary(_) => ("binData", 30),
        ObjectId(_) => ("objectId", 35), Boolean(_) => ("bool", 40), DateTime(_) => ("date", 45),
        Timestamp(_) => ("timestamp", 47), RegularExpression(_) => ("regex", 50),
        DbPointer(_) => ("dbPointer", 55), JavaScriptCode(_) => ("javascript", 60),
        JavaScriptCodeWithScope(_) => ("javascriptWithScope", 65), MaxKey => ("maxKey", 127),
    }
}

/// BSON's order of two values, as MongoDB compares them.
fn compare(a: &Value, b: &Value) -> Res<Ordering> {
    use Bson::*;
    let by_rank = kind(a).1.cmp(&kind(b).1);
    let (Some(x), Some(y), Ordering::Equal) = (a, b, by_rank) else {
        return Ok(by_rank);
    };
    // Equal scalars, a bare `{_id}`'s own (bson's `==` ignores field order).
    if x == y && !matches!(x, Document(_) | Array(_) | JavaScriptCodeWithScope(_)) {
        return Ok(Ordering::Equal);
    }
    // A number exactly: not NaN (the least number), its floor, the rest.
    let number = |v: &Bson| {
        let (d, n) = (double(v), i128::from(long(v)));
        let rest = if d.is_finite() { d - d.floor() } else { 0.0 };
        (
            !d.is_nan(),
            v.as_f64().map_or(n, |d| d.floor() as i128),
            rest,
            d,
        )
    };
    /// A document's fields, or an array's items (with equal names).
    fn fields(v: &Bson) -> Vec<(&str, Value)> {
        let items = v.as_array().into_iter().flatten().map(|v| ("", v));
        let named = v.as_document().into_iter().flatten();
        let all = items.chain(named.map(|(k, v)| (k.as_str(), v)));
        all.map(|(k, v)| (k, Some(v.clone()))).collect()
    }
    Ok(match (x, y) {
        (Decimal128(_), _) | (_, Decimal128(_)) => return Err(unsupported("comparing a decimal")),
        (Int32(_) | Int64(_) | Double(_), _) => {
            number(x).partial_cmp(&number(y)).unwrap_or(Ordering::Equal)
        }
        (String(p), String(q)) => p.cmp(q),
        (Document(_), Document(_)) | (Array(_), Array(_)) => {
            let (p, q) = (fields(x), fields(y));
            for ((pk, pv), (qk, qv)) in p.iter().zip(&q) {
                let by_rank = kind(pv).1.cmp(&kind(qv).1);
                let o = by_rank.then(pk.cmp(qk)).then(compare(pv, qv)?);
                if o.is_ne() {
                    return Ok(o);
                }
            }
            p.len().cmp(&q.len())
        }
        (ObjectId(p), ObjectId(q)) => p.bytes().cmp(&q.bytes()),
        (Boolean(p), Boolean(q)) => p.cmp(q),
        (DateTime(p), DateTime(q)) => p.cmp(q),
        (Null | Undefined | MinKey | MaxKey, _) => Ordering::Equal,
        _ => return Err(unsupported("comparing these types")),
    })
}

#[cfg(test)]
mod tests;
