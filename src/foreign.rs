//! Foreign holders' lock documents: the layouts other applications lock keys
//! with in a shared lock collection, each with its owner field and the
//! expiry rule its own clients apply. The table ([`ForeignRules`]), first
//! match wins, after a document of this crate's layout (never foreign), is
//! docs/sharing.md's "Foreign locks and their expiry", in its order. The
//! `{_id, value, ttl, obtained_at}` row comes before `{_id, ts, aid}`:
//! that pattern's clients take over an expired lease of ours in place,
//! writing `value`, `ttl` and `obtained_at` beside our `aid` and `ts`
//! (`store`, "Read by other clients"), and the document is then theirs. A
//! foreign lock is expired once `$$NOW` reaches its expiry (the same `<=`
//! as our `exp`; the npm layout's strict `>` is its expiry plus 1 ms).
//!
//! Each rule is written twice, as aggregation expressions for MongoDB
//! ([`ForeignRules::takeover_stage`], [`ForeignRules::projection`]) and in
//! Rust for the twin ([`ForeignRules::annotate`]): ARCHITECTURE.md, "A
//! document of foreign layout"; the server behaviour relied on:
//! docs/mongodb-behaviour.md, B29 and B30.

use std::time::Duration;

use mongodb::bson::{Bson, DateTime, Document, doc};

use crate::error::{Error, Result};

/// Projected field: a recognised foreign lock's expiry (a date), missing if
/// it never expires or is not recognised.
pub(crate) const EXPIRY: &str = "fx";
/// Projected field: a recognised foreign lock's owner (as stored), missing
/// if its layout has no owner field.
pub(crate) const OWNER: &str = "fo";
/// Projected field: when a recognised foreign lock was taken, where its
/// layout says (`ts`, `obtained_at`, the `since` of a user's rule).
pub(crate) const TAKEN_AT: &str = "fa";

/// The largest number of milliseconds a foreign lock's own TTL field may
/// add to its date (about 31 years): a larger or non-finite value, which
/// MongoDB could not add to a date, means no expiry.
const MAX_TTL_MS: i64 = 1_000_000_000_000;

/// How a foreign lock of a [`ForeignLockRule`] expires, by the server's
/// clock (`$$NOW`): it is free once `$$NOW` reaches the time computed here.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ForeignExpiry {
    /// Held until its holder deletes it.
    Never,
    /// At the date in `field` (e.g. `{ExpireAt: <date>}`).
    At {
        /// A top-level date field.
        field: String,
    },
    /// A fixed time after the date in `since` (e.g. a TTL index's
    /// `expireAfterSeconds` after `ts`).
    After {
        /// A top-level date field.
        since: String,
        /// How long after it (whole milliseconds count).
        ttl: Duration,
    },
    /// After the date in `since` plus the number of seconds in `seconds`
    /// (an int32, int64 or double field; e.g. `obtained_at` and `ttl`).
    AfterSeconds {
        /// A top-level date field.
        since: String,
        /// A top-level number field, in seconds.
        seconds: String,
    },
}

/// Another application's lock document schema, for a collection shared with
/// it ([`LeaseManagerOptions::foreign_lock`](crate::LeaseManagerOptions::foreign_lock)):
/// which fields make a document its lock, its owner field, and its expiry.
/// The layouts of docs/sharing.md are recognised without it.
///
/// A document of this crate's layout is never read by it. A lock recognised
/// by it is held until its expiry, then taken over by an acquisition in the
/// acquiring write itself; `connect` accepts a collection of such documents.
///
/// # Example
///
/// ```
/// use mongo_lease::{ForeignExpiry, ForeignLockRule};
///
/// // `{_id, holder, until}`: held by `holder` until the date `until`.
/// let rule = ForeignLockRule::new(
///     ["holder", "until"],
///     ForeignExpiry::At { field: "until".into() },
/// )
/// .owner("holder");
/// assert_eq!(rule.fields, ["holder", "until"]);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ForeignLockRule {
    /// The fields present in each of its lock documents (top-level names);
    /// the expiry's date field must moreover be a date, its seconds field a
    /// number.
    pub fields: Vec<String>,
    /// The field naming the lock's holder, shown as its owner id.
    pub owner: Option<String>,
    /// When its lock expires.
    pub expiry: ForeignExpiry,
}

impl ForeignLockRule {
    /// A rule recognising documents that have all of `fields`, expiring by
    /// `expiry`, without an owner field.
    pub fn new<S: Into<String>>(
        fields: impl IntoIterator<Item = S>,
        expiry: ForeignExpiry,
    ) -> Self {
        ForeignLockRule {
            fields: fields.into_iter().map(Into::into).collect(),
            owner: None,
            expiry,
        }
    }

    /// This rule with `field` as the owner field.
    pub fn owner(mut self, field: impl Into<String>) -> Self {
        self.owner = Some(field.into());
        self
    }

    /// Checks the rule.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for no fields, a field name that is empty,
    /// `_id`, starts with `$` or contains `.` or a NUL, or an owner or
    /// expiry field not among `fields`.
    pub(crate) fn validate(&self) -> Result<()> {
        let invalid = |reason: String| {
            Err(Error::InvalidConfig {
                reason: format!("foreign_lock: {reason}"),
            })
        };
        if self.fields.is_empty() {
            return invalid("a rule needs at least one field".into());
        }
        for name in &self.fields {
            if name.is_empty()
                || name == "_id"
                || name.starts_with('$')
                || name.contains('.')
                || name.contains('\0')
            {
                return invalid(format!(
                    "{name:?} is not a top-level field name (not empty nor `_id`, \
                     no leading `$`, no `.`)"
                ));
            }
        }
        let named = self.owner.iter().chain(match &self.expiry {
            ForeignExpiry::Never => vec![],
            ForeignExpiry::At { field } => vec![field],
            ForeignExpiry::After { since, .. } => vec![since],
            ForeignExpiry::AfterSeconds { since, seconds } => vec![since, seconds],
        });
        for name in named {
            if !self.fields.contains(name) {
                return invalid(format!("the field {name:?} must be among `fields`"));
            }
        }
        if let ForeignExpiry::After { ttl, .. } = &self.expiry
            && ttl.as_millis() > MAX_TTL_MS as u128
        {
            return invalid(format!("the expiry's ttl is too long: {ttl:?}"));
        }
        Ok(())
    }
}

/// What a field of a layout must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Type {
    Any,
    Date,
    Number,
}

/// One row of the table: a layout, its owner field, its expiry.
#[derive(Debug, Clone)]
struct Layout {
    /// Fields present, and of what type.
    fields: Vec<(String, Type)>,
    /// A bare `{_id}`: no field but `_id`.
    bare: bool,
    owner: Option<String>,
    /// The date field the lock counts from, shown as when it was taken.
    taken_at: Option<String>,
    expiry: ForeignExpiry,
    /// Added to the expiry: 1 for a rule judged with a strict `>`.
    plus_ms: i64,
}

/// The foreign lock layouts of one lock collection: the built-in ones, the
/// user's rule if any, and the `expireAfterSeconds` of its TTL index on
/// `ts` (found by `connect`). Fixed for a store's life.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ForeignRules {
    custom: Option<ForeignLockRule>,
    ts_expire_after: Option<Duration>,
}

impl ForeignRules {
    /// The built-in layouts and `custom`; `{_id, ts, aid}` never expires
    /// until [`with_ts_expiry`](Self::with_ts_expiry).
    pub(crate) fn new(custom: Option<ForeignLockRule>) -> Self {
        ForeignRules {
            custom,
            ts_expire_after: None,
        }
    }

    /// These rules with `{_id, ts, aid}` expiring `expire_after` after `ts`
    /// (the collection's TTL index on `ts`), or never with `None`.
    pub(crate) fn with_ts_expiry(mut self, expire_after: Option<Duration>) -> Self {
        self.ts_expire_after = expire_after;
        self
    }

    /// The table, in order (see the module docs).
    fn layouts(&self) -> Vec<Layout> {
        let s = String::from;
        let mut layouts = Vec::with_capacity(5);
        if let Some(rule) = &self.custom {
            let typed = |name: &String| match &rule.expiry {
                ForeignExpiry::At { field } if field == name => Type::Date,
                ForeignExpiry::After { since, .. } | ForeignExpiry::AfterSeconds { since, .. }
                    if since == name =>
                {
                    Type::Date
                }
                ForeignExpiry::AfterSeconds { seconds, .. } if seconds == name => Type::Number,
                _ => Type::Any,
            };
            layouts.push(Layout {
                fields: rule.fields.iter().map(|f| (f.clone(), typed(f))).collect(),
                bare: false,
                owner: rule.owner.clone(),
                taken_at: match &rule.expiry {
                    ForeignExpiry::After { since, .. }
                    | ForeignExpiry::AfterSeconds { since, .. } => Some(since.clone()),
                    _ => None,
                },
                expiry: rule.expiry.clone(),
                plus_ms: 0,
            });
        }
        layouts.push(Layout {
            fields: vec![
                (s("value"), Type::Any),
                (s("ttl"), Type::Number),
                (s("obtained_at"), Type::Date),
            ],
            bare: false,
            owner: Some(s("value")),
            taken_at: Some(s("obtained_at")),
            expiry: ForeignExpiry::AfterSeconds {
                since: s("obtained_at"),
                seconds: s("ttl"),
            },
            plus_ms: 1,
        });
        layouts.push(Layout {
            fields: vec![(s("aid"), Type::Any), (s("ts"), Type::Date)],
            bare: false,
            owner: Some(s("aid")),
            taken_at: Some(s("ts")),
            expiry: match self.ts_expire_after {
                Some(ttl) => ForeignExpiry::After {
                    since: s("ts"),
                    ttl,
                },
                None => ForeignExpiry::Never,
            },
            plus_ms: 0,
        });
        layouts.push(Layout {
            fields: vec![(s("ExpireAt"), Type::Date)],
            bare: false,
            owner: None,
            taken_at: None,
            expiry: ForeignExpiry::At {
                field: s("ExpireAt"),
            },
            plus_ms: 0,
        });
        layouts.push(Layout {
            fields: Vec::new(),
            bare: true,
            owner: None,
            taken_at: None,
            expiry: ForeignExpiry::Never,
            plus_ms: 0,
        });
        layouts
    }

    // ---- MongoDB: aggregation expressions ----

    /// Whether the document (`$$ROOT`) is a recognised foreign lock: of one
    /// of the layouts and not of `ours` (the layout test).
    pub(crate) fn recognised_expr(&self, ours: Document) -> Document {
        self.switch(ours, false.into(), |_| true.into(), false.into())
    }

    /// Whether the document is a recognised foreign lock expired by its rule
    /// at `$$NOW`.
    pub(crate) fn expired_expr(&self, ours: Document) -> Document {
        self.switch(
            ours,
            false.into(),
            |layout| match layout.expiry_expr() {
                None => false.into(),
                Some(expiry) => doc! { "$let": {
                    "vars": { "x": expiry },
                    "in": { "$and": [
                        { "$eq": [{ "$type": "$$x" }, "date"] },
                        { "$lte": ["$$x", "$$NOW"] },
                    ]},
                }}
                .into(),
            },
            false.into(),
        )
    }

    /// The first stage of an acquire pipeline: a recognised foreign lock
    /// expired by its rule becomes what an inserting upsert sees (`{_id,
    /// _ins: null}`, `rules::inserted`), which the acquisition then takes in
    /// this same write, with a token by the token rule from no `tok`; any
    /// other document is left as it is.
    pub(crate) fn takeover_stage(&self, ours: Document, inserted: &str) -> Document {
        doc! { "$replaceWith": { "$cond": [
            self.expired_expr(ours),
            { "_id": "$_id", inserted: Bson::Null },
            "$$ROOT",
        ]}}
    }

    /// The fields a read projects for a foreign lock: [`EXPIRY`], [`OWNER`]
    /// and [`TAKEN_AT`] by its layout (each removed where the layout has none,
    /// and for a document of `ours` or of no recognised layout).
    pub(crate) fn projection(&self, ours: Document) -> Document {
        let remove = || Bson::from("$$REMOVE");
        let field = |name: &Option<String>| {
            name.as_ref()
                .map_or_else(remove, |n| format!("${n}").into())
        };
        doc! {
            EXPIRY: self.switch(ours.clone(), remove(), |s| s.expiry_expr().map_or_else(remove, Bson::from), remove()),
            OWNER: self.switch(ours.clone(), remove(), |s| field(&s.owner), remove()),
            TAKEN_AT: self.switch(ours, remove(), |s| field(&s.taken_at), remove()),
        }
    }

    /// The fields the layouts read, for a projection that must keep what
    /// [`annotate`](Self::annotate) reads (`{name: 1}` each).
    pub(crate) fn fields(&self) -> Document {
        let mut fields = Document::new();
        for layout in self.layouts() {
            for (name, _) in &layout.fields {
                fields.insert(name.clone(), 1);
            }
        }
        fields
    }

    /// `$switch`: `ours` for a document of our layout, `then` of the first
    /// layout that recognises it, else `default`.
    fn switch(
        &self,
        ours: Document,
        if_ours: Bson,
        then: impl Fn(&Layout) -> Bson,
        default: Bson,
    ) -> Document {
        let mut branches = vec![Bson::from(doc! { "case": ours, "then": if_ours })];
        for layout in self.layouts() {
            branches.push(doc! { "case": layout.recognised_expr(), "then": then(&layout) }.into());
        }
        doc! { "$switch": { "branches": branches, "default": default } }
    }

    // ---- The twin: the same rules in Rust ----

    /// `doc` (a whole document, `_id` included) with the fields
    /// [`projection`](Self::projection) adds, computed by the same rules: a
    /// document of our layout (`ours`) or of no recognised layout is returned
    /// as it is.
    pub(crate) fn annotate(&self, doc: &Document, ours: bool) -> Document {
        let mut out = doc.clone();
        if ours {
            return out;
        }
        let Some(layout) = self.layouts().into_iter().find(|s| s.recognises(doc)) else {
            return out;
        };
        if let Some(expiry) = layout.expiry_of(doc) {
            out.insert(EXPIRY, expiry);
        }
        if let Some(owner) = layout.owner.as_ref().and_then(|o| doc.get(o)) {
            out.insert(OWNER, owner.clone());
        }
        if let Some(at) = layout.taken_at.as_ref().and_then(|f| doc.get(f).cloned()) {
            out.insert(TAKEN_AT, at);
        }
        out
    }

    /// Whether `doc` (whole) is a recognised foreign lock (not `ours`)
    /// expired by its rule at `now` (the twin's takeover).
    #[cfg(any(test, feature = "sim"))]
    pub(crate) fn expired(&self, doc: &Document, ours: bool, now: DateTime) -> bool {
        self.annotate(doc, ours)
            .get_datetime(EXPIRY)
            .is_ok_and(|x| *x <= now)
    }
}

impl Layout {
    fn recognised_expr(&self) -> Document {
        if self.bare {
            return doc! { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 1] };
        }
        let tests: Vec<Bson> = self
            .fields
            .iter()
            .map(|(name, ty)| {
                let ty_of = doc! { "$type": format!("${name}") };
                match ty {
                    Type::Any => doc! { "$ne": [ty_of, "missing"] },
                    Type::Date => doc! { "$eq": [ty_of, "date"] },
                    Type::Number => doc! { "$in": [ty_of, ["int", "long", "double"]] },
                }
                .into()
            })
            .collect();
        doc! { "$and": tests }
    }

    /// The expiry as a date expression (`null` where the stored values give
    /// none), or `None` for a layout that never expires.
    fn expiry_expr(&self) -> Option<Bson> {
        let plus = self.plus_ms;
        Some(match &self.expiry {
            ForeignExpiry::Never => return None,
            ForeignExpiry::At { field } => doc! { "$add": [format!("${field}"), plus] }.into(),
            ForeignExpiry::After { since, ttl } => {
                let ms = i64::try_from(ttl.as_millis())
                    .unwrap_or(MAX_TTL_MS)
                    .min(MAX_TTL_MS);
                doc! { "$add": [format!("${since}"), ms + plus] }.into()
            }
            ForeignExpiry::AfterSeconds { since, seconds } => doc! { "$let": {
                "vars": { "ms": { "$convert": {
                    "input": { "$multiply": [format!("${seconds}"), 1000] },
                    "to": "long", "onError": Bson::Null, "onNull": Bson::Null,
                }}},
                "in": { "$cond": [
                    { "$and": [
                        { "$eq": [{ "$type": "$$ms" }, "long"] },
                        { "$lte": [{ "$abs": "$$ms" }, MAX_TTL_MS] },
                    ]},
                    { "$add": [format!("${since}"), "$$ms", plus] },
                    Bson::Null,
                ]},
            }}
            .into(),
        })
    }

    fn recognises(&self, doc: &Document) -> bool {
        if self.bare {
            return doc.len() == 1 && doc.contains_key("_id");
        }
        self.fields
            .iter()
            .all(|(name, ty)| match (ty, doc.get(name)) {
                (_, None) => false,
                (Type::Any, Some(_)) => true,
                (Type::Date, Some(v)) => matches!(v, Bson::DateTime(_)),
                (Type::Number, Some(v)) => {
                    matches!(v, Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_))
                }
            })
    }

    /// The expiry of `doc` (recognised by this layout), as
    /// [`expiry_expr`](Self::expiry_expr) computes it.
    fn expiry_of(&self, doc: &Document) -> Option<DateTime> {
        let date = |name: &str| doc.get_datetime(name).ok().map(|d| d.timestamp_millis());
        let ms = match &self.expiry {
            ForeignExpiry::Never => return None,
            ForeignExpiry::At { field } => date(field)?,
            ForeignExpiry::After { since, ttl } => {
                let ttl = i64::try_from(ttl.as_millis())
                    .unwrap_or(MAX_TTL_MS)
                    .min(MAX_TTL_MS);
                date(since)?.checked_add(ttl)?
            }
            ForeignExpiry::AfterSeconds { since, seconds } => {
                // As `$convert` of `seconds * 1000` to a long: an integer
                // product, or a double truncated towards zero.
                let ms = match doc.get(seconds)? {
                    Bson::Int32(n) => i64::from(*n) * 1000,
                    Bson::Int64(n) => n.checked_mul(1000)?,
                    Bson::Double(x) => {
                        let ms = x * 1000.0;
                        if !ms.is_finite() || ms.abs() >= 9.2e18 {
                            return None;
                        }
                        ms.trunc() as i64
                    }
                    _ => return None,
                };
                if ms.abs() > MAX_TTL_MS {
                    return None;
                }
                date(since)?.checked_add(ms)?
            }
        };
        Some(DateTime::from_millis(ms.checked_add(self.plus_ms)?))
    }
}

#[cfg(test)]
mod tests;
