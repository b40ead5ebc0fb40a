//! The normal form both sides are compared in ([`V`]): the twin's
//! documents rendered as BSON in `MongoStore`'s field layout
//! ([`twin_documents`]), every document read into it by field
//! ([`document`]), and every answer of the `Store` trait likewise
//! ([`Reply`]). Server times stay in each side's own clock ([`V::Time`],
//! [`V::Left`]) and fencing tokens in each side's own values
//! ([`V::Token`]): the comparison reads them against the steps
//! (`compare`).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use mongodb::bson::{Bson, DateTime, Document, doc};
use uuid::Uuid;

use super::world::World;
use crate::error::{Error, Result};
use crate::info::LeaseInfo;
use crate::key::LeaseKey;
use crate::kind::PermitsChange;
use crate::store::memory::{Doc, MemoryDb, restated_until};
use crate::store::{AcquireOutcome, HandoffOutcome, LeaseRef, field};
use crate::store::{light_acquire::LightAcquired, light_release::LightRelease};

/// A value in the normal form.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum V {
    Null,
    Bool(bool),
    Int(i64),
    Double(f64),
    Str(String),
    /// A lease id (a BSON UUID).
    Id(Uuid),
    /// A fencing token of `key`, in this side's values.
    Token(LeaseKey, u64),
    /// A server time, in this side's clock (ms).
    Time(i64),
    /// The time from the step's `$$NOW` until a server time (ms): an
    /// answer's `remaining`.
    Left(i64),
    Map(BTreeMap<String, V>),
    List(Vec<V>),
    /// Anything else, as canonical extended JSON.
    Other(String),
}

impl V {
    fn map<const N: usize>(entries: [(&str, V); N]) -> V {
        V::Map(
            entries
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    }

    fn key(key: &LeaseKey) -> V {
        V::Str(key.to_extended_json())
    }

    fn opt(value: Option<V>) -> V {
        value.unwrap_or(V::Null)
    }

    /// A short rendering for reports: maps as `{k: v}`, times as `t<ms>`.
    pub fn show(&self) -> String {
        match self {
            V::Null => "null".into(),
            V::Bool(b) => b.to_string(),
            V::Int(n) => n.to_string(),
            V::Double(x) => format!("{x:?}"),
            V::Str(s) => format!("{s:?}"),
            V::Id(id) => format!("lid:{}", &id.to_string()[..8]),
            V::Token(_, t) => format!("tok:{t}"),
            V::Time(ms) => format!("t{ms}"),
            V::Left(ms) => format!("left:{ms}ms"),
            V::Map(m) => {
                let inner: Vec<String> = m
                    .iter()
                    .map(|(k, v)| format!("{k}: {}", v.show()))
                    .collect();
                format!("{{{}}}", inner.join(", "))
            }
            V::List(l) => {
                let inner: Vec<String> = l.iter().map(V::show).collect();
                format!("[{}]", inner.join(", "))
            }
            V::Other(s) => s.clone(),
        }
    }
}

// ----- documents --------------------------------------------------------------

/// A lease id as stored in `lid`: a BSON UUID.
fn lid(id: Uuid) -> Bson {
    Bson::from(mongodb::bson::Uuid::from_bytes(id.into_bytes()))
}

/// The twin's documents, ours rendered in `MongoStore`'s field layout (the
/// schema of `store`'s module docs) and foreign ones as stored, by key.
pub(super) fn twin_documents(world: &World) -> BTreeMap<LeaseKey, Document> {
    let mut docs = BTreeMap::new();
    for key in &world.keys {
        if let Some(doc) = world.db.doc(key.clone()) {
            docs.insert(key.clone(), render(&world.db, key, &doc));
        } else if let Some(foreign) = world.db.foreign(key.clone()) {
            docs.insert(key.clone(), foreign);
        }
    }
    docs
}

/// One twin document in `MongoStore`'s layout.
pub(super) fn render(db: &MemoryDb, key: &LeaseKey, d: &Doc) -> Document {
    let date = |at| Bson::DateTime(db.date(at));
    let mut out = doc! { field::ID: key.to_bson(), field::OWNER: &d.owner };
    if let Some(id) = d.lease_id {
        out.insert(field::LEASE_ID, lid(id));
    }
    out.insert(field::TOKEN, d.token as i64);
    out.insert(field::ACQUIRED_AT, date(d.acquired));
    out.insert(field::RENEWED_AT, date(d.renewed));
    out.insert(field::EXPIRES_AT, date(d.exp));
    if let Some(payload) = &d.payload {
        out.insert(field::PAYLOAD, payload.clone());
    }
    let dates = [
        (field::WAITING_SINCE, d.waiting_since),
        (field::YIELD_UNTIL, d.yield_until),
        (field::HOLD_UNTIL, d.hold_until),
        (field::RELEASED_AT, d.released_at),
        (field::NOT_BEFORE, d.not_before),
    ];
    for (name, at) in dates {
        if let Some(at) = at {
            out.insert(name, date(at));
        }
    }
    if !d.holders.is_empty() {
        let holders: Vec<Document> = d
            .holders
            .iter()
            .map(|h| {
                let mut entry = doc! { field::OWNER: &h.owner };
                if let Some(id) = h.lease_id {
                    entry.insert(field::LEASE_ID, lid(id));
                }
                if let Some(id) = h.ended {
                    entry.insert(field::ENDED_LEASE_ID, lid(id));
                }
                entry.insert(field::TOKEN, h.token as i64);
                entry.insert(field::ACQUIRED_AT, date(h.acquired));
                entry.insert(field::RENEWED_AT, date(h.renewed));
                entry.insert(field::EXPIRES_AT, date(h.exp));
                if let Some(payload) = &h.payload {
                    entry.insert(field::PAYLOAD, payload.clone());
                }
                if h.permits > 1 {
                    entry.insert(field::PERMITS_TAKEN, i64::from(h.permits));
                }
                entry
            })
            .collect();
        out.insert(field::HOLDERS, holders);
    }
    if let Some(permits) = d.permits {
        out.insert(field::PERMITS, i64::from(permits));
    }
    if let Some((owner, exp)) = &d.exclusive_waiter {
        out.insert(
            field::EXCLUSIVE_WAITER,
            doc! { field::OWNER: owner, field::EXPIRES_AT: date(*exp) },
        );
    }
    if !d.queue.is_empty() {
        let queue: Vec<Document> = d
            .queue
            .iter()
            .map(|w| {
                let mut entry = doc! {
                    field::OWNER: &w.owner,
                    field::LEASE_ID: lid(w.lease_id),
                    field::REGISTERED_AT: date(w.at),
                    field::REGISTRATION_EXPIRES: date(w.re),
                    field::HANDED_TTL: w.hx.as_millis() as i64,
                };
                if let Some(payload) = &w.payload {
                    entry.insert(field::PAYLOAD, payload.clone());
                }
                entry
            })
            .collect();
        out.insert(field::QUEUE, queue);
    }
    out.insert(field::TRANSITIONS, d.transitions as i64);
    if let Some((owner, at)) = &d.revocation {
        out.insert(
            field::REVOCATION,
            doc! { field::OWNER: owner, "at": date(*at) },
        );
    }
    // Restated for other clients ("Read by other clients" in `store`).
    let stored = d.stored(db, key);
    for name in [field::OBTAINED_AT, field::TTL_SECONDS] {
        out.insert(name, stored.get(name).cloned().unwrap_or(Bson::Null));
    }
    out
}

/// A stored document (either side's) in the normal form, for `key`: dates
/// are [`V::Time`], `tok` (at the top and in entries) [`V::Token`], BSON
/// UUIDs [`V::Id`]; a document of our layout has its `ttl` replaced by
/// whether it restates `max(exp, deletable_at) - obtained_at` ([`restated_until`];
/// each side's own arithmetic on its own clock: the values themselves are
/// times).
pub(super) fn document(key: &LeaseKey, doc: &Document) -> V {
    let mut out = match value(key, field::ID, &Bson::Document(doc.clone())) {
        V::Map(m) => m,
        _ => unreachable!("a document"),
    };
    if crate::store::is_our_layout(doc) {
        let restated = match (
            doc.get(field::TTL_SECONDS),
            super::world::date_ms(doc.get(field::EXPIRES_AT)),
            super::world::date_ms(doc.get(field::OBTAINED_AT)),
            doc.get_i64(field::TOKEN),
        ) {
            (Some(Bson::Double(ttl)), Some(exp), Some(at), Ok(tok)) => {
                ((ttl * 1000.0).round() as i64 == restated_until(exp, tok) - at).then_some(true)
            }
            _ => None,
        };
        out.remove(field::TTL_SECONDS);
        out.insert("ttl restated".into(), V::Bool(restated.unwrap_or(false)));
    }
    V::Map(out)
}

/// One BSON value named `name` of a document of `key`.
fn value(key: &LeaseKey, name: &str, bson: &Bson) -> V {
    match bson {
        Bson::Null => V::Null,
        Bson::Boolean(b) => V::Bool(*b),
        Bson::Int32(n) if name == field::TOKEN => V::Token(key.clone(), *n as u64),
        Bson::Int64(n) if name == field::TOKEN => V::Token(key.clone(), *n as u64),
        Bson::Int32(n) => V::Int(i64::from(*n)),
        Bson::Int64(n) => V::Int(*n),
        Bson::Double(x) => V::Double(*x),
        Bson::String(s) => V::Str(s.clone()),
        Bson::DateTime(d) => V::Time(d.timestamp_millis()),
        Bson::Binary(b) if b.subtype == mongodb::bson::spec::BinarySubtype::Uuid => {
            Uuid::from_slice(&b.bytes).map_or_else(|_| V::Other(format!("{b}")), V::Id)
        }
        Bson::Document(d) => V::Map(
            d.iter()
                .map(|(k, v)| (k.clone(), value(key, k, v)))
                .collect(),
        ),
        Bson::Array(items) => V::List(items.iter().map(|v| value(key, name, v)).collect()),
        other => V::Other(other.clone().into_canonical_extjson().to_string()),
    }
}

/// What kinds of fields a document has, for the coverage: each field of
/// ours but the ones every document has, `foreign (<fields>)` for another
/// application's lock.
pub(super) fn fields(doc: &Document) -> Vec<String> {
    if !crate::store::is_our_layout(doc) {
        let names: Vec<&str> = doc.keys().map(String::as_str).collect();
        return vec![format!("foreign lock {{{}}}", names.join(", "))];
    }
    let always = [
        "_id",
        "aid",
        "tok",
        "acq",
        "ts",
        "exp",
        "tr",
        "obtained_at",
        "ttl",
    ];
    doc.keys()
        .filter(|k| !always.contains(&k.as_str()))
        .map(|k| format!("`{k}`"))
        .collect()
}

/// A short class of an answer, for the coverage: its outcome without its
/// values.
pub(super) fn class(v: &V) -> String {
    match v {
        V::Map(m) if m.contains_key("error") => format!("error {}", m["error"].show()),
        V::Map(m) if m.contains_key("held") => format!(
            "read (held {}, foreign {})",
            m["held"].show(),
            m["foreign"].show()
        ),
        V::Map(m) if m.contains_key("held by") => "held".into(),
        V::Map(m) if m.contains_key("page") => match &m["page"] {
            V::List(page) => format!("page of {}", page.len()),
            _ => "page".into(),
        },
        V::Map(m) => m.keys().next().cloned().unwrap_or_default(),
        V::List(items) if items.len() <= 3 => {
            let items: Vec<String> = items.iter().map(class).collect();
            format!("[{}]", items.join(", "))
        }
        V::List(items) => format!("{} items", items.len()),
        V::Int(n) => n.to_string(),
        other => other.show(),
    }
}

// ----- answers ----------------------------------------------------------------

/// A `SystemTime` of a read, in ms (either side's clock).
fn time(t: SystemTime) -> V {
    V::Time(DateTime::from_system_time(t).timestamp_millis())
}

/// An error, by its variant only (its message names the collection).
fn error(e: &Error) -> V {
    let debug = format!("{e:?}");
    let variant = debug
        .split(|c: char| !c.is_alphanumeric())
        .next()
        .unwrap_or_default();
    V::map([("error", V::Str(variant.to_string()))])
}

fn result<T>(r: &Result<T>, ok: impl FnOnce(&T) -> V) -> V {
    match r {
        Ok(t) => ok(t),
        Err(e) => error(e),
    }
}

/// An answer of the `Store` trait in the normal form.
pub(super) struct Reply;

impl Reply {
    pub fn acquire(key: &LeaseKey, r: &Result<AcquireOutcome>) -> V {
        result(r, |outcome| Reply::outcome(key, outcome))
    }

    pub fn outcome(key: &LeaseKey, outcome: &AcquireOutcome) -> V {
        let token = |t: &u64| V::Token(key.clone(), *t);
        match outcome {
            AcquireOutcome::Acquired { token: t } => V::map([("acquired", token(t))]),
            AcquireOutcome::Unconfirmed { token: t } => V::map([("unconfirmed", token(t))]),
            AcquireOutcome::Mismatch { stored } => {
                V::map([("mismatch", V::Str(stored.to_string()))])
            }
            AcquireOutcome::OursAsAnotherKind { stored } => {
                V::map([("ours as another kind", V::Str(stored.to_string()))])
            }
            AcquireOutcome::Held {
                holder,
                remaining,
                token: t,
                ahead,
            } => V::map([
                ("held by", V::Str(holder.clone())),
                ("remaining", V::opt(remaining.map(left))),
                ("token", V::opt(t.as_ref().map(token))),
                ("ahead", V::Int(i64::from(*ahead))),
            ]),
        }
    }

    /// The light acquires' answers, each with its key. `AcquiredShort` is
    /// `Acquired`: which of them depends on local timings only.
    pub fn light_acquired(keys: &[LeaseKey], answers: &[LightAcquired]) -> V {
        let answer = |(key, a): (&LeaseKey, &LightAcquired)| match a {
            LightAcquired::Acquired(t) | LightAcquired::AcquiredShort { token: t, .. } => {
                V::map([("acquired", V::Token(key.clone(), *t))])
            }
            LightAcquired::NotApplied => V::Str("not applied".into()),
            LightAcquired::Failed(e) => error(e),
        };
        V::List(keys.iter().zip(answers).map(answer).collect())
    }

    /// A renewal's lost leases, as a set.
    pub fn lost(r: &Result<Vec<LeaseRef>>) -> V {
        result(r, |lost| {
            let mut lost: Vec<(String, Uuid)> = lost
                .iter()
                .map(|l| (l.key.to_extended_json(), l.lease_id))
                .collect();
            lost.sort();
            V::List(
                lost.into_iter()
                    .map(|(k, id)| V::map([("key", V::Str(k)), ("lid", V::Id(id))]))
                    .collect(),
            )
        })
    }

    pub fn count(r: &Result<u64>) -> V {
        result(r, |n| V::Int(*n as i64))
    }

    pub fn flag(r: &Result<bool>) -> V {
        result(r, |b| V::Bool(*b))
    }

    pub fn light_released(answers: &[LightRelease]) -> V {
        let answer = |a: &LightRelease| match a {
            LightRelease::Released => V::Str("released".into()),
            LightRelease::NotApplied => V::Str("not applied".into()),
            LightRelease::Failed(e) => error(e),
        };
        V::List(answers.iter().map(answer).collect())
    }

    pub fn handoff(key: &LeaseKey, r: &Result<HandoffOutcome>) -> V {
        result(r, |h| match h {
            HandoffOutcome::Acquired { token } => {
                V::map([("handed", V::Token(key.clone(), *token))])
            }
            HandoffOutcome::Released => V::Str("released".into()),
            HandoffOutcome::Lost => V::Str("lost".into()),
            HandoffOutcome::NotApplied => V::Str("not applied".into()),
        })
    }

    pub fn info(r: &Result<Option<LeaseInfo>>) -> V {
        result(r, |info| V::opt(info.as_ref().map(lease_info)))
    }

    pub fn page(r: &Result<(Vec<LeaseInfo>, Option<LeaseKey>)>) -> V {
        result(r, |(page, next)| {
            V::map([
                ("page", V::List(page.iter().map(lease_info).collect())),
                ("next", V::opt(next.as_ref().map(V::key))),
            ])
        })
    }

    pub fn permits(r: &Result<PermitsChange>) -> V {
        result(r, |change| V::Str(format!("{change:?}")))
    }

    pub fn revocations(r: &Result<Vec<(LeaseKey, String)>>) -> V {
        result(r, |found| {
            let mut found: Vec<(String, String)> = found
                .iter()
                .map(|(k, by)| (k.to_extended_json(), by.clone()))
                .collect();
            found.sort();
            V::List(
                found
                    .into_iter()
                    .map(|(k, by)| V::map([("key", V::Str(k)), ("by", V::Str(by))]))
                    .collect(),
            )
        })
    }

    pub fn plain(b: bool) -> V {
        V::Bool(b)
    }

    pub fn number(n: u64) -> V {
        V::Int(n as i64)
    }
}

fn left(d: Duration) -> V {
    V::Left(d.as_millis() as i64)
}

/// A read of a key, every field of [`LeaseInfo`].
fn lease_info(info: &LeaseInfo) -> V {
    let key = &info.key;
    let holders = info
        .holders
        .iter()
        .map(|h| {
            V::map([
                ("owner", V::Str(h.owner_id.clone())),
                ("token", V::Token(key.clone(), h.fencing_token)),
                ("acquired", time(h.acquired_at)),
                ("renewed", time(h.renewed_at)),
                ("expires", time(h.expires_at)),
                ("permits", V::Int(i64::from(h.permits))),
            ])
        })
        .collect();
    let waiters = info
        .waiters
        .iter()
        .map(|w| {
            V::map([
                ("owner", V::Str(w.owner_id.clone())),
                ("kind", V::Str(w.kind.to_string())),
                ("registered", V::opt(w.registered_at.map(time))),
                ("expires", time(w.expires_at)),
            ])
        })
        .collect();
    V::map([
        ("key", V::key(key)),
        ("owner", V::Str(info.owner_id.clone())),
        ("token", V::Token(key.clone(), info.fencing_token)),
        ("acquired", time(info.acquired_at)),
        ("renewed", time(info.renewed_at)),
        ("expires", time(info.expires_at)),
        ("server time", time(info.server_time)),
        (
            "payload",
            V::opt(
                info.payload
                    .clone()
                    .map(|p| value(key, "data", &Bson::Document(p))),
            ),
        ),
        ("held", V::Bool(info.held)),
        ("foreign", V::Bool(info.foreign)),
        ("kind", V::Str(info.kind.to_string())),
        ("holders", V::List(holders)),
        ("hold until", V::opt(info.hold_until.map(time))),
        ("lock-delay until", V::opt(info.lock_delay_until.map(time))),
        ("waiters", V::List(waiters)),
        ("transitions", V::Int(info.transitions as i64)),
        ("released", V::Bool(info.released)),
    ])
}
