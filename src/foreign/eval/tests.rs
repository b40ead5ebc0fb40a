//! The evaluator against a real `mongod`: random expressions over the
//! operators of [`OPERATORS`] and random documents, plus the built-in
//! rules' expressions, the documented user rules and fixed probes, each
//! evaluated by the server (`$replaceWith: {now: "$$NOW", r: <expr>}`, one
//! round trip per expression over every document) and by the twin at the
//! server's `now`. Where both give a value (missing included), the values
//! must be equal (same BSON type, doubles bitwise or both NaN); errors may
//! differ. At least a third of the pairs must compare values, and the
//! rules' expressions on the rule-shaped documents must all give values.

use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use mongodb::Collection;
use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{
    Binary, Bson, DateTime, Decimal128, Document, Regex, Timestamp, doc, oid::ObjectId,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;
use crate::foreign::ForeignRules;
use crate::testkit::{ReplicaSet, ReplicaSetOptions};

const SEED: u64 = 20_240_601;
const EXPRESSIONS: usize = 300;
const DOCUMENTS: i32 = 12;

#[test]
fn check_names_the_first_operator_or_variable_outside_the_list() {
    let regex = doc! { "$and": [true, { "$regexMatch": { "input": "$a", "regex": "x" } }] };
    let err = check(&regex.into()).unwrap_err();
    assert!(err.contains("$regexMatch"), "{err}");
    let err = check(&doc! { "$eq": ["$$CLUSTER_TIME", 1] }.into()).unwrap_err();
    assert!(err.contains("$$CLUSTER_TIME"), "{err}");
    assert!(check(&doc! { "$literal": { "$regexMatch": 1 } }.into()).is_ok());
    // An `$add` or `$multiply` that mongod may evaluate in another order:
    // it folds the constants (`$$NOW`, `$$REMOVE`, literals) into one,
    // moved last, and flattens the same operator inside, also one that a
    // `$cond`, `$switch` or `$ifNull` reduces to.
    for refused in [
        doc! { "$add": [1e20, "$ttl"] },
        doc! { "$add": ["$ttl", 1e20, -1e20] },
        doc! { "$add": ["$ttl", { "$add": [1e20, "$ttl"] }] },
        doc! { "$add": [1e16, "$a", { "$ifNull": ["$$REMOVE", 1.0] }, "$b"] },
        doc! { "$add": ["$a", { "$cond": [true, { "$add": ["$b", "$c"] }, 0] }] },
        doc! { "$multiply": ["$a", "$$REMOVE", "$b"] },
        doc! { "$multiply": ["$a", { "$ifNull": ["$$REMOVE", 1e-300] }, "$b"] },
        doc! { "$multiply": ["$a", { "$cond": [true, { "$multiply": ["$b", "$c"] }, 0] }] },
        doc! { "$cond": [true, { "$multiply": [1e300, "$ttl", 1e-300] }, 0] },
    ] {
        let err = check(&refused.clone().into()).unwrap_err();
        assert!(err.contains("another order"), "{refused}: {err}");
    }
    for written in [
        doc! { "$add": ["$ttl", "$ttl", 1e20] },
        doc! { "$add": [1, { "$add": [2, "$$NOW"] }] },
        doc! { "$add": ["$ttl", { "$multiply": ["$ttl", 2] }, { "$add": [1, 2] }] },
        doc! { "$multiply": [{ "$add": ["$ttl", 1] }, "$ttl", 1e20] },
    ] {
        assert_eq!(check(&written.clone().into()), Ok(()), "{written}");
    }
    let rules = ForeignRules {
        custom: None,
        ts_expire_after: Some(Duration::from_secs(30)),
    };
    for expr in expressions(&rules)
        .iter()
        .chain(&user_rules())
        .chain(&probes())
    {
        assert_eq!(check(expr), Ok(()), "{expr}");
    }
    assert!(
        evaluate(
            &doc! { "$regexMatch": {} }.into(),
            &doc! {},
            DateTime::now()
        )
        .is_err()
    );
}

/// The documented user rules' expressions.
fn user_rules() -> Vec<Bson> {
    let held = doc! { "$and": [{ "$eq": ["$locked", true] }, { "$or": [
        { "$eq": [{ "$ifNull": ["$expire", null] }, null] }, { "$gt": ["$expire", "$$NOW"] },
    ]}]};
    let epoch = doc! { "$gt": ["$expire", { "$toLong": "$$NOW" }] };
    let holder = doc! { "$and": [{ "$eq": [{ "$type": "$holder" }, "string"] }, { "$ne": ["$holder", ""] }] };
    vec![
        held.into(),
        epoch.into(),
        doc! { "$toDate": "$expire" }.into(),
        holder.into(),
    ]
}

/// Probes of the behaviour docs/sharing.md states: missing against null,
/// a date plus a double, integer overflow, `$add`'s and `$multiply`'s
/// operand order (on [`edges`] among the documents).
fn probes() -> Vec<Bson> {
    let mut probes = vec![
        doc! { "$eq": ["$nope", null] },
        doc! { "$eq": [{ "$ifNull": ["$nope", null] }, null] },
        doc! { "$add": ["$ttl", i64::MAX] },
        doc! { "$multiply": ["$ttl", "$ttl", 1e300] },
        doc! { "$add": ["$a", "$b", "$c"] },
        doc! { "$add": ["$c", "$b", "$a"] },
        doc! { "$type": { "$add": ["$a", "$b", "$c"] } },
        doc! { "$multiply": ["$a", "$b", "$c"] },
        doc! { "$eq": ["$a", "$b"] },
        doc! { "$lt": ["$a", "$b"] },
        doc! { "$eq": [{ "a": 1, "b": 2 }, { "$literal": { "b": 2, "a": 1 } }] },
        doc! { "$lt": [[{ "a": 1, "b": 2 }], { "$literal": [{ "b": 2, "a": 1 }] }] },
        doc! { "$add": ["$a", 0.5] },
        doc! { "$add": ["$a", -0.5] },
    ];
    for d in [0.5, -0.5, 1.5, 2.5, -2.5, 0.4999999999999999] {
        probes.push(doc! { "$add": ["$$NOW", d] });
        probes.push(doc! { "$add": ["$ExpireAt", d] });
    }
    let at = |ms: i64| Bson::DateTime(DateTime::from_millis(ms));
    for (x, y, z) in [
        (at(-1), 0.5.into(), 0.into()),
        (at(-3), 2.5.into(), 0.into()),
        (at(-3), (-2.5).into(), 0.into()),
        (at((1 << 53) + 1), 0.5.into(), 0.into()),
        (0.5.into(), at(10), 0.into()),
        (0.25.into(), at(10), 0.25.into()),
        (at(10), 0.75.into(), 0.75.into()),
        (at(10), 0.75.into(), Bson::Int64(1)),
    ] {
        // Each operand a `$literal`, which `mongod` folds in this order.
        let (x, y, z) = (
            doc! { "$literal": x },
            doc! { "$literal": y },
            doc! { "$literal": z },
        );
        probes.push(doc! { "$add": [x, y, z] });
    }
    probes.into_iter().map(Bson::from).collect()
}

/// Values of many BSON types, edge cases included (no string starting
/// with `$`: these are literals in expressions too).
fn scalars(now: i64) -> Vec<Bson> {
    // A coefficient and a biased exponent (6176 is 10^0).
    let decimal = |coefficient: u128, exponent: u128| {
        Bson::Decimal128(Decimal128::from_bytes(
            (exponent << 113 | coefficient).to_le_bytes(),
        ))
    };
    vec![
        Bson::Int32(0),
        Bson::Int32(1),
        Bson::Int32(-1),
        Bson::Int32(7),
        Bson::Int32(i32::MAX),
        Bson::Int32(i32::MIN),
        Bson::Int32(1000),
        Bson::Int64(0),
        Bson::Int64(3),
        Bson::Int64(i64::MAX),
        Bson::Int64(i64::MIN),
        Bson::Int64(i64::MAX - 1),
        Bson::Int64((1 << 53) + 1),
        Bson::Int64(now),
        Bson::Int64(now + 3_600_000),
        Bson::Int64(-5_000_000_000),
        Bson::Double(0.0),
        Bson::Double(-0.0),
        Bson::Double(0.5),
        Bson::Double(-0.5),
        Bson::Double(1.5),
        Bson::Double(2.5),
        Bson::Double(-2.5),
        Bson::Double(0.1),
        Bson::Double(f64::NAN),
        Bson::Double(f64::INFINITY),
        Bson::Double(f64::NEG_INFINITY),
        Bson::Double(1e300),
        Bson::Double(i64::MAX as f64),
        Bson::Double(i64::MIN as f64),
        Bson::Double(9_007_199_254_740_993.0),
        Bson::Double(1e9),
        Bson::Double(now as f64 + 0.5),
        Bson::String(String::new()),
        "a".into(),
        "abc".into(),
        "12".into(),
        "-5".into(),
        "+3".into(),
        " 4".into(),
        "1e3".into(),
        "é😀".into(),
        "string".into(),
        "missing".into(),
        "null".into(),
        "int".into(),
        "2024-01-01".into(),
        Bson::Null,
        Bson::Boolean(true),
        Bson::Boolean(false),
        Bson::DateTime(DateTime::from_millis(0)),
        Bson::DateTime(DateTime::from_millis(-1)),
        Bson::DateTime(DateTime::from_millis(now - 60_000)),
        Bson::DateTime(DateTime::from_millis(now + 60_000)),
        Bson::DateTime(DateTime::from_millis(8_640_000_000_000_000)),
        Bson::DateTime(DateTime::from_millis(i64::MAX)),
        Bson::DateTime(DateTime::from_millis(i64::MIN)),
        Bson::ObjectId(ObjectId::from_bytes([
            0x65, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
        ])),
        Bson::ObjectId(ObjectId::from_bytes([
            0xf0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9,
        ])),
        Bson::Timestamp(Timestamp {
            time: 1_700_000_000,
            increment: 3,
        }),
        Bson::Timestamp(Timestamp {
            time: 4_000_000_000,
            increment: 1,
        }),
        Bson::Binary(Binary {
            subtype: mongodb::bson::spec::BinarySubtype::Generic,
            bytes: vec![1, 2],
        }),
        Bson::RegularExpression(Regex {
            pattern: "^a".into(),
            options: "i".into(),
        }),
        Bson::MinKey,
        Bson::MaxKey,
        Bson::Undefined,
        decimal(15, 6175),
        decimal(0, 6176),
    ]
}

fn value(rng: &mut StdRng, now: i64, depth: u32) -> Bson {
    let pool = scalars(now);
    match rng.random_range(0..10) {
        0 if depth > 0 => {
            let n = rng.random_range(0..3);
            Bson::Array((0..n).map(|_| value(rng, now, depth - 1)).collect())
        }
        1 if depth > 0 => {
            let mut d = Document::new();
            for k in ["a", "b"] {
                if rng.random_bool(0.7) {
                    d.insert(k, value(rng, now, depth - 1));
                }
            }
            d.into()
        }
        _ => pool[rng.random_range(0..pool.len())].clone(),
    }
}

fn document(rng: &mut StdRng, id: i32, now: i64) -> Document {
    let mut d = doc! { "_id": id };
    for k in ["a", "b", "c", "d", "e", "n", "l"] {
        if rng.random_bool(0.85) {
            d.insert(k, value(rng, now, if "nl".contains(k) { 2 } else { 1 }));
        }
    }
    if rng.random_bool(0.3) {
        d.insert(
            "l",
            vec![
                Bson::from(doc! { "a": value(rng, now, 0) }),
                value(rng, now, 1),
                doc! {}.into(),
            ],
        );
    }
    d
}

/// Documents where the order of `$add`'s and `$multiply`'s operands shows
/// (`_id` below 0, ascending: no rule's shape), fields in another order,
/// dates far from 1970 plus fractions.
fn edges() -> Vec<Document> {
    let at = |ms: i64| Bson::DateTime(DateTime::from_millis(ms));
    vec![
        doc! { "_id": -12, "a": { "a": 1, "b": 2 }, "b": { "b": 2, "a": 1 } },
        doc! { "_id": -11, "a": [{ "a": 1, "b": 2 }], "b": [{ "b": 2, "a": 1 }] },
        doc! { "_id": -10, "a": at((1 << 60) + 1), "b": 0.25, "c": 0.25 },
        doc! { "_id": -9, "a": at(-(1 << 60) - 1), "b": 0.5, "c": 1_i64 },
        doc! { "_id": -8, "a": at(7), "b": 4_503_599_627_370_495.5, "c": 0 },
        doc! { "_id": -7, "a": 0.1, "b": 0.2, "c": 0.3 },
        doc! { "_id": -6, "a": i64::MAX, "b": 1_i64, "c": -1_i64 },
        doc! { "_id": -5, "a": 9_007_199_254_740_993_i64, "b": 0.5, "c": 0 },
        doc! { "_id": -4, "a": 1e300, "b": 1e300, "c": 1e-300 },
        doc! { "_id": -3, "a": 1e16, "b": -1e16, "c": 1.0 },
        doc! { "_id": -2, "a": 1.0, "b": 9_007_199_254_740_993_i64, "c": 2_i64 },
        doc! { "_id": -1, "a": 1.5, "b": 2.25, "c": -0.75 },
    ]
}

/// Documents of the rules' shapes.
fn shaped(now: i64) -> Vec<Document> {
    let at = |ms: i64| DateTime::from_millis(now + ms);
    vec![
        doc! { "value": "v", "ttl": 10, "obtained_at": at(-5_000) },
        doc! { "value": "v", "ttl": 2.5, "obtained_at": at(-60_000) },
        doc! { "ts": at(-10_000), "aid": "java" },
        doc! { "ExpireAt": at(30_000) },
        doc! {},
        doc! { "locked": true, "expire": at(60_000), "holder": "h", "owner": "o" },
        doc! { "locked": true, "expire": Bson::Null, "holder": "" },
        doc! { "locked": true, "expire": now - 1_000, "holder": 5 },
        doc! { "locked": false, "expire": now + 100_000 },
    ]
}

const PATHS: &[&str] = &[
    "$a",
    "$b",
    "$c",
    "$d",
    "$e",
    "$n",
    "$n.a",
    "$n.b",
    "$l",
    "$l.a",
    "$l.a.b",
    "$nope",
    "$a.b",
    "$$ROOT",
    "$$CURRENT",
    "$$NOW",
    "$$ROOT.a",
    "$$CURRENT.n.a",
    "$expire",
    "$ttl",
];

fn expression(rng: &mut StdRng, now: i64, depth: u32) -> Bson {
    if depth == 0 || rng.random_bool(0.25) {
        return match rng.random_range(0..10) {
            0..6 => PATHS[rng.random_range(0..PATHS.len())].into(),
            6 => doc! { "$literal": value(rng, now, 1) }.into(),
            _ => value(rng, now, 0),
        };
    }
    let op = OPERATORS[rng.random_range(0..OPERATORS.len())];
    let mut n = match op {
        "$literal" => return doc! { op: value(rng, now, 1) }.into(),
        "$and" | "$or" | "$add" | "$multiply" => rng.random_range(0..4),
        "$ifNull" => rng.random_range(2..4),
        "$cond" if rng.random_bool(0.3) => {
            let mut e = || expression(rng, now, depth - 1);
            return doc! { op: { "if": e(), "then": e(), "else": e() } }.into();
        }
        "$cond" => 3,
        "$switch" => {
            let (n, default) = (rng.random_range(1..3), rng.random_bool(0.7));
            let mut e = || expression(rng, now, depth - 1);
            let branches: Vec<Bson> = (0..n)
                .map(|_| doc! { "case": e(), "then": e() }.into())
                .collect();
            let mut spec = doc! { "branches": branches };
            if default {
                spec.insert("default", e());
            }
            return doc! { op: spec }.into();
        }
        "$eq" | "$ne" | "$lt" | "$lte" | "$gt" | "$gte" => 2,
        _ => 1,
    };
    if rng.random_bool(0.02) {
        n += 1;
    }
    let mut args: Vec<Bson> = (0..n).map(|_| expression(rng, now, depth - 1)).collect();
    if n == 1 && rng.random_bool(0.5) {
        return doc! { op: args.remove(0) }.into();
    }
    if rng.random_bool(0.05) {
        return doc! { "x": doc! { op: args }, "y": expression(rng, now, 0) }.into();
    }
    doc! { op: args }.into()
}

/// Same value and type; doubles bitwise or both NaN.
fn same(a: &Bson, b: &Bson) -> bool {
    match (a, b) {
        (Bson::Double(x), Bson::Double(y)) => {
            x.to_bits() == y.to_bits() || (x.is_nan() && y.is_nan())
        }
        (Bson::Array(x), Bson::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| same(p, q))
        }
        (Bson::Document(x), Bson::Document(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((pk, pv), (qk, qv))| pk == qk && same(pv, qv))
        }
        _ => a == b,
    }
}

/// The server's `(now, result)` of `expr` over the documents `filter`
/// selects, in `_id` order.
async fn server(
    coll: &Collection<Document>,
    expr: &Bson,
    filter: Document,
) -> Result<Vec<(DateTime, Option<Bson>)>, String> {
    let pipeline = [
        doc! { "$match": filter },
        doc! { "$sort": { "_id": 1 } },
        doc! { "$replaceWith": { "now": "$$NOW", "r": expr.clone() } },
    ];
    let cursor = coll.aggregate(pipeline).await.map_err(|e| e.to_string())?;
    let docs: Vec<Document> = cursor.try_collect().await.map_err(|e| e.to_string())?;
    Ok(docs
        .into_iter()
        .map(|d| (*d.get_datetime("now").unwrap(), d.get("r").cloned()))
        .collect())
}

/// The server's `(now, result)` of `expr` for each of `docs`: in one round
/// trip, or if it fails, one by one (an error at parse time fails them all).
async fn outcomes(
    coll: &Collection<Document>,
    expr: &Bson,
    docs: &[Document],
) -> Vec<(DateTime, Result<Option<Bson>, String>)> {
    match server(coll, expr, doc! {}).await {
        Ok(results) => {
            assert_eq!(results.len(), docs.len(), "one result per document");
            results.into_iter().map(|(now, r)| (now, Ok(r))).collect()
        }
        Err(e) if server(coll, expr, doc! { "_id": "none" }).await.is_err() => docs
            .iter()
            .map(|_| (DateTime::now(), Err(e.clone())))
            .collect(),
        Err(_) => {
            let each = docs
                .iter()
                .map(|d| server(coll, expr, doc! { "_id": d.get("_id").unwrap() }));
            let each = futures::future::join_all(each).await.into_iter();
            each.map(|one| match one {
                Ok(mut r) => {
                    let (now, r) = r.pop().expect("the document");
                    (now, Ok(r))
                }
                Err(e) => (DateTime::now(), Err(e)),
            })
            .collect()
        }
    }
}

#[derive(Default)]
struct Tally {
    pairs: usize,
    values: usize,
    server_errors: usize,
    twin_errors: usize,
    failures: Vec<String>,
}

impl Tally {
    /// Compares one pair; `strict`: both must give a value.
    fn compare(
        &mut self,
        expr: &Bson,
        doc: &Document,
        server: Result<Value, String>,
        now: DateTime,
        strict: bool,
    ) {
        let twin = evaluate(expr, doc, now);
        self.pairs += 1;
        let failure = match (&server, &twin) {
            (Ok(s), Ok(t)) => {
                self.values += 1;
                let equal = match (s, t) {
                    (Some(s), Some(t)) => same(s, t),
                    (s, t) => s.is_none() && t.is_none(),
                };
                (!equal).then_some("MISMATCH")
            }
            (Err(_), _) => {
                self.server_errors += 1;
                strict.then_some("AN ERROR on a rule")
            }
            (_, Err(_)) => {
                self.twin_errors += 1;
                strict.then_some("AN ERROR on a rule")
            }
        };
        if let Some(what) = failure {
            self.failures.push(format!(
                "{what}\n  expression: {expr}\n  document:   {doc}\n  now:        {now}\n  mongod:     {server:?}\n  twin:       {twin:?}"
            ));
        }
    }
}

#[tokio::test]
async fn the_twin_evaluates_as_mongod_does() {
    let set = ReplicaSet::start(ReplicaSetOptions::default().set_name("eval"))
        .await
        .expect("a replica set");
    let client = set.client().await.expect("a client");
    let coll = client.database("eval").collection::<Document>("docs");
    let started = Instant::now();
    let now = DateTime::now().timestamp_millis();
    let mut rng = StdRng::seed_from_u64(SEED);
    let mut docs: Vec<Document> = (0..DOCUMENTS).map(|i| document(&mut rng, i, now)).collect();
    for (i, d) in shaped(now).into_iter().enumerate() {
        let mut with_id = doc! { "_id": DOCUMENTS + i as i32 };
        with_id.extend(d);
        docs.push(with_id);
    }
    // In `_id` order, as the server answers.
    docs.splice(0..0, edges());
    coll.insert_many(&docs).await.expect("the documents");

    let rules = ForeignRules {
        custom: None,
        ts_expire_after: Some(Duration::from_secs(30)),
    };
    let mut exprs = expressions(&rules);
    exprs.extend(user_rules());
    let strict = exprs.len();
    exprs.extend(probes());
    // Random ones the twin takes (`check`: in mongod's order).
    let random = std::iter::repeat_with(|| expression(&mut rng, now, 4));
    exprs.extend(random.filter(|e| check(e).is_ok()).take(EXPRESSIONS));

    let each = exprs.iter().map(|expr| outcomes(&coll, expr, &docs));
    let all: Vec<_> = futures::stream::iter(each).buffered(4).collect().await;
    let mut tally = Tally::default();
    for (i, (expr, outcomes)) in exprs.iter().zip(all).enumerate() {
        for (doc, (now, server)) in docs.iter().zip(outcomes) {
            let shaped = doc.get_i32("_id").unwrap() >= DOCUMENTS;
            tally.compare(expr, doc, server, now, i < strict && shaped);
        }
    }
    // A bare `{_id}` of every key type: the table's expressions give a
    // value on both sides, the same.
    let bare = client.database("eval").collection::<Document>("bare");
    let bare_docs: Vec<Document> = key_types()
        .into_iter()
        .map(|id| doc! { "_id": id })
        .collect();
    bare.insert_many(&bare_docs)
        .await
        .expect("the bare documents");
    let mut bare_tally = Tally::default();
    for expr in &exprs[..strict] {
        let outcomes = outcomes(&bare, expr, &bare_docs).await;
        for (doc, (now, server)) in bare_docs.iter().zip(outcomes) {
            bare_tally.compare(expr, doc, server, now, true);
        }
    }
    assert!(
        bare_tally.failures.is_empty(),
        "{}",
        bare_tally.failures.join("\n")
    );
    let elapsed = started.elapsed();
    for failure in tally.failures.iter().take(5) {
        eprintln!("{failure}");
    }
    eprintln!(
        "{} expressions x {} documents in {elapsed:?}: {} pairs, {} compared values, {} mongod errors, {} twin-only errors, {} failures",
        exprs.len(),
        docs.len(),
        tally.pairs,
        tally.values,
        tally.server_errors,
        tally.twin_errors,
        tally.failures.len()
    );
    assert!(
        tally.failures.is_empty(),
        "{} failures, the first:\n{}",
        tally.failures.len(),
        tally.failures[0]
    );
    assert_eq!(tally.pairs, exprs.len() * docs.len());
    assert!(tally.values * 3 >= tally.pairs, "too few values compared");
}

/// Every expression of the rules' table, and the projection the twin
/// evaluates (`annotate`).
fn expressions(rules: &ForeignRules) -> Vec<Bson> {
    let table = rules.rules().into_iter();
    let table = table.flat_map(|r| [r.describes, Some(r.held), r.owner, r.expires_at]);
    let projection = rules.projection(doc! { "$literal": false });
    table
        .flatten()
        .chain(projection.into_iter().map(|(_, e)| e))
        .collect()
}

/// An `_id` of each type a `LeaseKey` may hold.
fn key_types() -> Vec<Bson> {
    let binary = |subtype, bytes: &[u8]| {
        let bytes = bytes.to_vec();
        Bson::Binary(Binary { subtype, bytes })
    };
    let uuid = binary(BinarySubtype::Uuid, &[7; 16]);
    vec![
        "k".into(),
        Bson::Int32(1),
        Bson::Int64(2),
        Bson::Double(3.0),
        Bson::ObjectId(ObjectId::from_bytes([1; 12])),
        uuid.clone(),
        binary(BinarySubtype::Generic, &[1, 2, 3]),
        Bson::Decimal128("4".parse().unwrap()),
        doc! { "tenant": 7, "item": "a" }.into(),
        doc! { "u": uuid }.into(),
        Bson::Symbol("sym".into()),
        Bson::Timestamp(Timestamp {
            time: 5,
            increment: 1,
        }),
        Bson::DateTime(DateTime::from_millis(6)),
        true.into(),
        Bson::Null,
        Bson::MinKey,
        Bson::MaxKey,
        Bson::JavaScriptCode("x".into()),
    ]
}
