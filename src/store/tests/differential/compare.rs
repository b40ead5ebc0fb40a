//! The comparisons: [`documents`] (the twin's documents against the
//! mongod's, after a step) and [`replies`] (the two answers of a step),
//! over the normal form of `norm`, with one rule per kind of value:
//!
//! - **server times** are never compared as values (two clocks, two
//!   moments within the step): each is read as "the `$$NOW` of step `j`
//!   plus `o`", `o` one of the durations the seed writes (a TTL, the yield
//!   window, a minimum hold, a lock-delay, ...), by the time each side's
//!   step `j` took on its own clock ([`Clocks`]); the two sides must agree
//!   on at least one such reading. So `exp` written as `ts + ttl` by one
//!   side and as the release's `$$NOW` by the other, a `yu` that one side
//!   did not move, a `wt` of another step, all differ; and a time in the
//!   past or future of the step is so on both sides. A `remaining` of an
//!   answer is read likewise from the step's `$$NOW`.
//! - **fencing tokens** are compared by equality and order across the whole
//!   seed, per key ([`Tokens`]): one twin token is one mongod token, and
//!   the twin's order is the mongod's (the mongod's carry the server's
//!   millisecond, the twin's need not);
//! - lease ids, owner ids, kinds, counts and payloads exactly (numbers by
//!   value, whatever their BSON type).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use mongodb::bson::Document;

use super::norm::{self, V};
use super::world::Clocks;
use crate::key::LeaseKey;

/// One difference between the twin and the mongod.
#[derive(Debug, Clone)]
pub(super) struct Divergence {
    /// The key of the document (`None`: an answer).
    pub key: Option<LeaseKey>,
    /// Where: a field path (`exp`, `hs[1].tok`), or `reply...`.
    pub path: String,
    pub twin: String,
    pub mongo: String,
    /// Why the values differ, when it is not plain inequality.
    pub note: String,
}

/// One key's tokens: the twin's to the mongod's, and back.
type Pairs = (BTreeMap<u64, u64>, BTreeMap<u64, u64>);

/// The fencing tokens seen so far, per key.
#[derive(Default)]
pub(super) struct Tokens {
    keys: HashMap<LeaseKey, Pairs>,
}

impl Tokens {
    /// Records that twin token `t` of `key` is mongod token `m`; an error
    /// if either was another's, or the orders differ.
    fn pair(&mut self, key: &LeaseKey, t: u64, m: u64) -> Result<(), String> {
        let (to_mongo, to_twin) = self.keys.entry(key.clone()).or_default();
        match (to_mongo.get(&t), to_twin.get(&m)) {
            (Some(&m0), _) if m0 == m => return Ok(()),
            (Some(&m0), _) => return Err(format!("twin token {t} was mongod's {m0} before")),
            (None, Some(&t0)) => return Err(format!("mongod token {m} was twin's {t0} before")),
            (None, None) => {}
        }
        if let Some((&tp, &mp)) = to_mongo.range(..t).next_back()
            && mp >= m
        {
            return Err(format!(
                "order: twin {tp} < {t} but mongod {mp} >= {m} (tokens seen: {to_mongo:?})"
            ));
        }
        if let Some((&tn, &mn)) = to_mongo.range(t + 1..).next()
            && mn <= m
        {
            return Err(format!(
                "order: twin {t} < {tn} but mongod {m} >= {mn} (tokens seen: {to_mongo:?})"
            ));
        }
        to_mongo.insert(t, m);
        to_twin.insert(m, t);
        Ok(())
    }
}

/// What a comparison reads times and tokens by.
pub(super) struct Ctx<'a> {
    pub clocks: &'a Clocks,
    /// The durations (ms) a time may be `$$NOW` plus.
    pub offsets: &'a [i64],
    /// The step being compared (its clocks are the last ones).
    pub step: usize,
    pub tokens: &'a mut Tokens,
}

/// Slack around a step's clock readings (ms): rounding of the readings
/// and of the twin's instants to ms.
const SLACK: i64 = 2;

/// The readings of a time between `lo` and `hi` (ms, one side's clock) as
/// "step `j`'s `$$NOW` plus `o`".
fn readings(steps: &[(i64, i64)], offsets: &[i64], lo: i64, hi: i64) -> BTreeSet<(usize, i64)> {
    let mut found = BTreeSet::new();
    for (j, &(a, b)) in steps.iter().enumerate() {
        for &o in offsets {
            if lo - o <= b + SLACK && hi - o >= a - SLACK {
                found.insert((j, o));
            }
        }
    }
    found
}

fn show_readings(r: &BTreeSet<(usize, i64)>) -> String {
    let items: Vec<String> = r
        .iter()
        .map(|(j, o)| format!("step {j} + {o} ms"))
        .collect();
    match items.is_empty() {
        true => "no step".into(),
        false => items.join(" | "),
    }
}

impl Ctx<'_> {
    /// Compares `t` (the twin's) and `m` (the mongod's) at `path`.
    fn same(
        &mut self,
        key: Option<&LeaseKey>,
        path: &str,
        t: &V,
        m: &V,
        out: &mut Vec<Divergence>,
    ) {
        let mut differ = |note: String| {
            out.push(Divergence {
                key: key.cloned(),
                path: path.to_string(),
                twin: t.show(),
                mongo: m.show(),
                note,
            })
        };
        match (t, m) {
            (V::Map(a), V::Map(b)) => {
                let names: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
                for name in names {
                    let sub = match path.is_empty() {
                        true => name.clone(),
                        false => format!("{path}.{name}"),
                    };
                    match (a.get(name), b.get(name)) {
                        (Some(x), Some(y)) => self.same(key, &sub, x, y, out),
                        (x, y) => out.push(Divergence {
                            key: key.cloned(),
                            path: sub,
                            twin: x.map_or("(missing)".into(), V::show),
                            mongo: y.map_or("(missing)".into(), V::show),
                            note: "a field on one side only".into(),
                        }),
                    }
                }
            }
            (V::List(a), V::List(b)) if a.len() == b.len() => {
                for (i, (x, y)) in a.iter().zip(b).enumerate() {
                    self.same(key, &format!("{path}[{i}]"), x, y, out);
                }
            }
            (V::List(a), V::List(b)) => differ(format!("{} against {} items", a.len(), b.len())),
            (V::Time(a), V::Time(b)) => {
                let ta = readings(&self.clocks.twin, self.offsets, *a, *a);
                let mb = readings(&self.clocks.mongo, self.offsets, *b, *b);
                if ta.is_disjoint(&mb) {
                    differ(format!(
                        "twin: {}; mongod: {}",
                        show_readings(&ta),
                        show_readings(&mb)
                    ));
                }
            }
            (V::Left(a), V::Left(b)) if *a == 0 && *b == 0 => {}
            (V::Left(a), V::Left(b)) => {
                let (ta, tb) = self.clocks.twin[self.step];
                let (ma, mb) = self.clocks.mongo[self.step];
                let twin = readings(&self.clocks.twin, self.offsets, ta + a, tb + a);
                let mongo = readings(&self.clocks.mongo, self.offsets, ma + b, mb + b);
                if twin.is_disjoint(&mongo) {
                    differ(format!(
                        "until twin: {}; mongod: {}",
                        show_readings(&twin),
                        show_readings(&mongo)
                    ));
                }
            }
            (V::Token(k, a), V::Token(_, b)) => {
                if let Err(e) = self.tokens.pair(k, *a, *b) {
                    differ(e);
                }
            }
            (V::Int(a), V::Double(b)) | (V::Double(b), V::Int(a)) => {
                if (*a as f64) != *b {
                    differ(String::new());
                }
            }
            (a, b) if a == b => {}
            _ => differ(String::new()),
        }
    }
}

/// The differences between the twin's documents and the mongod's after a
/// step, key by key (a document on one side only is one difference).
pub(super) fn documents(
    ctx: &mut Ctx<'_>,
    twin: &BTreeMap<LeaseKey, Document>,
    mongo: &BTreeMap<LeaseKey, Document>,
) -> Vec<Divergence> {
    let mut out = Vec::new();
    let keys: BTreeSet<&LeaseKey> = twin.keys().chain(mongo.keys()).collect();
    for key in keys {
        match (twin.get(key), mongo.get(key)) {
            (Some(t), Some(m)) => {
                let (t, m) = (norm::document(key, t), norm::document(key, m));
                ctx.same(Some(key), "", &t, &m, &mut out);
            }
            (t, m) => out.push(Divergence {
                key: Some(key.clone()),
                path: "(document)".into(),
                twin: t.map_or("(none)".into(), |d| norm::document(key, d).show()),
                mongo: m.map_or("(none)".into(), |d| norm::document(key, d).show()),
                note: "a document on one side only".into(),
            }),
        }
    }
    out
}

/// The differences between the two answers of a step (`what`: the call's
/// answer, `reply`, or what the streams of writes `announced`).
pub(super) fn replies(ctx: &mut Ctx<'_>, what: &str, twin: &V, mongo: &V) -> Vec<Divergence> {
    let mut out = Vec::new();
    ctx.same(None, what, twin, mongo, &mut out);
    out
}
