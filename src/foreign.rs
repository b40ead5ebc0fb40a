//! Foreign holders' locks, read by rules of aggregation expressions
//! ([`ForeignLockRule`]): a document not of this crate's layout is read by
//! the first rule that describes it (a user's rule with `describes`, the
//! built-in rules of docs/sharing.md, a user's rule without), else held
//! with no expiry. MongoDB evaluates the rules inside our writes and reads
//! ([`ForeignRules::takeover_stage`], [`ForeignRules::projection`]), the
//! twin with [`eval`]. ARCHITECTURE.md, "A document of foreign layout";
//! docs/mongodb-behaviour.md, B29 and B30.

use std::time::Duration;

use mongodb::bson::{Bson, DateTime, Document, doc};
use typed_builder::TypedBuilder;

pub(crate) mod eval;

// The fields a read projects for a foreign lock by its rule: held at
// `$$NOW` (a boolean), expiry, owner; each missing for a document of ours
// or of no rule, and the last two where the rule has none.
pub(crate) const HELD: &str = "fh";
pub(crate) const EXPIRY: &str = "fx";
pub(crate) const OWNER: &str = "fo";

/// Another application's lock schema, for a lock collection shared with it
/// ([`LeaseManagerOptions::foreign_lock`](crate::LeaseManagerOptions::foreign_lock)),
/// as MongoDB [aggregation expressions] over its lock document (`"$field"`,
/// `$$ROOT`) and the server's clock (`$$NOW`). The shapes of docs/sharing.md
/// are built-in rules of the same form, read before this one.
///
/// A lock it describes is held while `held` is true; once false, the next
/// acquisition takes the key over in its own write and leaves none of the
/// document's fields, so that their clients' conditions on their own fields
/// (`{locked: false}`, not `{locked: {$ne: true}}`) find our lease held.
/// `connect` accepts a collection of such documents, and checks that every
/// expression parses on the server first; one that fails on a stored
/// document fails the commands that read it, as MongoDB does.
///
/// Any expression MongoDB accepts works against MongoDB. The simulation's
/// in-memory twin evaluates the operators docs/sharing.md lists only, and
/// refuses a rule with another.
///
/// [aggregation expressions]: https://www.mongodb.com/docs/manual/meta/aggregation-quick-reference/#expressions
///
/// # Example
///
/// `{_id, locked: true|false, owner, created, expire: date|null}`: held
/// while `locked` and `expire` is null or still ahead.
///
/// ```
/// use mongo_lease::ForeignLockRule;
/// use mongodb::bson::doc;
///
/// let rule = ForeignLockRule::builder().held(doc! { "$and": [
///     { "$eq": ["$locked", true] },
///     { "$or": [
///         { "$eq": [{ "$ifNull": ["$expire", null] }, null] },
///         { "$gt": ["$expire", "$$NOW"] },
///     ]},
/// ]})
/// .owner("$owner")
/// .expires_at("$expire")
/// .build();
/// ```
#[derive(Debug, Clone, PartialEq, TypedBuilder, serde::Deserialize)]
#[serde(deny_unknown_fields)]
#[non_exhaustive]
pub struct ForeignLockRule {
    /// True while a lock is held by its own clients' rule.
    #[builder(setter(into))]
    pub held: Bson,
    /// The lock's holder, shown as its owner id (a string as it is, any
    /// other value as Extended JSON), e.g. `"$owner"`.
    #[builder(default, setter(strip_option, into))]
    pub owner: Option<Bson>,
    /// When the lock expires (a date), for display and for when a waiter
    /// tries again; without it, a waiter is woken by the lock's change.
    /// E.g. `"$expire"`, or `{"$toDate": "$expire"}` for epoch milliseconds.
    #[builder(default, setter(strip_option, into))]
    pub expires_at: Option<Bson>,
    /// Which documents the rule describes, read before the built-in rules;
    /// by default every document of neither this crate's layout nor a
    /// built-in rule's.
    #[builder(default, setter(strip_option, into))]
    pub describes: Option<Bson>,
}

impl ForeignLockRule {
    /// The rule's expressions, by name.
    pub(crate) fn expressions(&self) -> impl Iterator<Item = (&'static str, &Bson)> {
        [
            ("held", Some(&self.held)),
            ("owner", self.owner.as_ref()),
            ("expires_at", self.expires_at.as_ref()),
            ("describes", self.describes.as_ref()),
        ]
        .into_iter()
        .filter_map(|(name, e)| Some((name, e?)))
    }
}

/// The foreign lock rules of one lock collection: the built-in ones, the
/// user's (`custom`) if any, and the `expireAfterSeconds` of its TTL index
/// on `ts` (found by `connect`; without, `{_id, ts, aid}` never expires).
/// Fixed for a store's life.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ForeignRules {
    pub custom: Option<ForeignLockRule>,
    pub ts_expire_after: Option<Duration>,
}

impl ForeignRules {
    /// The table, in order (see the module docs); `describes` always set.
    /// A built-in rule describes its shape by the fields present, so that
    /// no other rule reads it; one whose fields are not of the types its
    /// clients write is held, with no expiry.
    fn rules(&self) -> Vec<ForeignLockRule> {
        let type_of = |name: &str| doc! { "$type": format!("${name}") };
        let present = |names: &[&str]| -> Bson {
            let tests = names
                .iter()
                .map(|n| doc! { "$ne": [type_of(n), "missing"] });
            doc! { "$and": tests.map(Bson::from).collect::<Vec<_>>() }.into()
        };
        // Held until `expiry` where `valid`, else held with no expiry.
        let until = |valid: Bson, expiry: Bson| ForeignLockRule {
            held: doc! { "$cond": [valid.clone(), { "$lt": ["$$NOW", expiry.clone()] }, true] }
                .into(),
            owner: None,
            expires_at: Some(doc! { "$cond": [valid, expiry, Bson::Null] }.into()),
            describes: None,
        };
        let is = |name: &str, t: &str| Bson::from(doc! { "$eq": [type_of(name), t] });
        let date = |name: &str| is(name, "date");
        // npm `distributed-locks-mongodb`: free once `$$NOW > obtained_at +
        // ttl` seconds, so 1 ms after; `ttl` a number within about 31 years
        // (NaN, the least number, is not).
        let npm = until(
            doc! { "$and": [
                date("obtained_at"),
                { "$or": [is("ttl", "int"), is("ttl", "long"), is("ttl", "double")] },
                { "$gte": ["$ttl", -1e9] },
                { "$lte": ["$ttl", 1e9] },
            ]}
            .into(),
            doc! { "$add": ["$obtained_at", { "$multiply": ["$ttl", 1000] }, 1] }.into(),
        );
        let ts = match self.ts_expire_after {
            Some(ttl) => {
                let ms = i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX);
                until(date("ts"), doc! { "$add": ["$ts", ms] }.into())
            }
            None => ForeignLockRule::builder().held(true).build(),
        };
        let mut rules = vec![
            ForeignLockRule {
                describes: Some(present(&["value", "ttl", "obtained_at"])),
                owner: Some("$value".into()),
                ..npm
            },
            ForeignLockRule {
                describes: Some(present(&["aid", "ts"])),
                owner: Some("$aid".into()),
                ..ts
            },
            ForeignLockRule {
                describes: Some(present(&["ExpireAt"])),
                ..until(date("ExpireAt"), "$ExpireAt".into())
            },
            // A bare `{_id}`.
            ForeignLockRule::builder()
                .held(true)
                .describes(doc! { "$eq": ["$$ROOT", { "_id": "$_id" }] })
                .build(),
        ];
        // A user's rule with `describes` first; without, after the others.
        match &self.custom {
            Some(rule) if rule.describes.is_some() => rules.insert(0, rule.clone()),
            Some(rule) => rules.push(ForeignLockRule {
                describes: Some(true.into()),
                ..rule.clone()
            }),
            None => {}
        }
        rules
    }

    // ---- MongoDB: aggregation expressions ----

    /// Whether the document (`$$ROOT`) is described by a rule and not of
    /// `ours` (the layout test).
    pub(crate) fn described_expr(&self, ours: Document) -> Document {
        self.switch(ours, false, |_| true.into())
    }

    /// The first stage of an acquire pipeline (sent when the same write
    /// without it found such a lock): a foreign lock its rule says
    /// is not held becomes what an inserting upsert sees (`{_id, _ins:
    /// null}`, `rules::inserted`), none of its fields left, which the
    /// acquisition then takes in this same write, with a token by the token
    /// rule from no `tok`; any other document is left as it is.
    pub(crate) fn takeover_stage(&self, ours: Document, inserted: &str) -> Document {
        let free = self.switch(ours, false, |r| doc! { "$not": [r.held.clone()] }.into());
        doc! { "$replaceWith": { "$cond": [free, { "_id": "$_id", inserted: Bson::Null }, "$$ROOT"] } }
    }

    /// The fields a read projects for a foreign lock: [`HELD`], [`OWNER`]
    /// and [`EXPIRY`] by its rule (each removed where the rule has none,
    /// and for a document of `ours` or of no rule).
    pub(crate) fn projection(&self, ours: Document) -> Document {
        const REMOVE: &str = "$$REMOVE";
        let or_remove = |e: &Option<Bson>| e.clone().unwrap_or(REMOVE.into());
        let held = |rule: &ForeignLockRule| doc! { "$and": [rule.held.clone()] }.into();
        doc! {
            HELD: self.switch(ours.clone(), REMOVE, held),
            OWNER: self.switch(ours.clone(), REMOVE, |r| or_remove(&r.owner)),
            EXPIRY: self.switch(ours, REMOVE, |r| or_remove(&r.expires_at)),
        }
    }

    /// `$switch`: `then` of the first rule that describes the document,
    /// `otherwise` for a document of `ours` or of no rule.
    fn switch(
        &self,
        ours: Document,
        otherwise: impl Into<Bson>,
        then: impl Fn(&ForeignLockRule) -> Bson,
    ) -> Document {
        let otherwise = otherwise.into();
        let mut branches = vec![Bson::from(doc! { "case": ours, "then": otherwise.clone() })];
        for rule in self.rules() {
            let case = rule.describes.clone().unwrap_or(true.into());
            branches.push(doc! { "case": case, "then": then(&rule) }.into());
        }
        doc! { "$switch": { "branches": branches, "default": otherwise } }
    }

    // ---- The twin: the same expressions, evaluated by `eval` ----

    /// `doc` (a whole document, `_id` included) with the fields
    /// [`projection`](Self::projection) adds, evaluated by [`eval`] at
    /// server time `now` (`ours`: the layout test's value). An expression
    /// MongoDB would fail the command on reads as held, with no owner or
    /// expiry.
    pub(crate) fn annotate(&self, doc: &Document, ours: bool, now: DateTime) -> Document {
        let projection = self.projection(doc! { "$literal": ours });
        let value = |(field, e): (String, Bson)| Ok((field, eval::evaluate(&e, doc, now)?));
        let fields: eval::Res<Vec<_>> = projection.into_iter().map(value).collect();
        let fields = fields.unwrap_or_else(|_| vec![(HELD.into(), Some(true.into()))]);
        let found = fields.into_iter().filter_map(|(f, v)| Some((f, v?)));
        doc.clone().into_iter().chain(found).collect()
    }

    /// Whether `doc` (whole) is a foreign lock (not `ours`) that its rule
    /// says is not held at `now` (the twin's takeover).
    pub(crate) fn free(&self, doc: &Document, ours: bool, now: DateTime) -> bool {
        self.annotate(doc, ours, now).get_bool(HELD) == Ok(false)
    }
}

#[cfg(test)]
mod tests;
