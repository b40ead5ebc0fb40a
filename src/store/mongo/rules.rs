//! The protocol's rules as MongoDB expressions, written once over where a
//! document keeps its lock fields ([`LockPath`]): at the top of a lock
//! document (the lock collection) or under the lock field `F` of a user's
//! document (in-document leases), as `LockPlace::path` states; what lives
//! here: "`src/store/mongo/`" in ARCHITECTURE.md.

use super::handle::min_token_age_ms;
use crate::key::LeaseKey;
use crate::store::{KeyWrite, LeaseRef, field};
use crate::token::TOKEN_TIME_SHIFT;
use mongodb::bson::spec::BinarySubtype;
use mongodb::bson::{Bson, Document, doc};
use uuid::Uuid;
/// `$name`: the value of field `name`.
pub(super) fn f(name: &str) -> String {
    format!("${name}")
}

/// `$$this.name`: field `name` of the array element at hand.
pub(super) fn this(name: &str) -> String {
    format!("$$this.{name}")
}

/// Whether the document has holders (`hs` is an array).
pub(super) fn has_holders() -> Document {
    doc! { "$isArray": f(field::HOLDERS) }
}

/// The entries of `hs` (empty if it is not an array).
pub(super) fn entries() -> Document {
    doc! { "$cond": [has_holders(), f(field::HOLDERS), []] }
}

/// Whether the entry at hand is live by the server's clock.
pub(super) fn entry_live() -> Document {
    doc! { "$gt": [this(field::EXPIRES_AT), "$$NOW"] }
}

/// Whether the entry at hand is the acquisition `lease_id` of `owner`.
pub(super) fn entry_is(owner: &str, lease_id: Uuid) -> Document {
    doc! { "$and": [
        { "$eq": [this(field::LEASE_ID), bson_lease_id(lease_id)] },
        { "$eq": [this(field::OWNER), { "$literal": owner }] },
    ]}
}

/// Whether the entry at hand is one of `ids` of `owner`.
pub(super) fn entry_among(owner: &str, ids: &[Uuid]) -> Document {
    let ids: Vec<Bson> = ids.iter().copied().map(bson_lease_id).collect();
    doc! { "$and": [
        { "$in": [this(field::LEASE_ID), ids] },
        { "$eq": [this(field::OWNER), { "$literal": owner }] },
    ]}
}

/// Whether the entry at hand is `owner`'s.
pub(super) fn entry_of_owner(owner: &str) -> Document {
    doc! { "$eq": [this(field::OWNER), { "$literal": owner }] }
}

/// Whether `owner` yielded the key to another owner's waiter and the yield
/// window is not over (`aid` is `owner`, `yu > $$NOW`).
pub(super) fn yielded_by(owner: &str) -> Document {
    doc! { "$and": [
        { "$eq": [f(field::OWNER), { "$literal": owner }] },
        { "$gt": [f(field::YIELD_UNTIL), "$$NOW"] },
    ]}
}

/// The lease ids of `leases`.
pub(super) fn lease_ids(leases: &[LeaseRef]) -> Vec<Uuid> {
    leases.iter().map(|l| l.lease_id).collect()
}

/// `name` is missing (an expression).
pub(super) fn missing(name: &str) -> Document {
    doc! { "$eq": [{ "$type": f(name) }, "missing"] }
}

/// The fields whose presence says that someone else waits for a key
/// (its queue, a waiting mark), or that its lease is not a plain
/// one (a minimum hold, holders, permits): the light release and handoff
/// apply only without them.
pub(super) const OTHERS_WAIT: [&str; 5] = [
    field::QUEUE,
    field::WAITING_SINCE,
    field::HOLD_UNTIL,
    field::HOLDERS,
    field::PERMITS,
];

/// `$and` of the lease `lease_id` (an expression) of `owner` being the
/// document's, of none of [`OTHERS_WAIT`] present, and of `more`.
pub(super) fn ours_and_nobody_else_waits(
    owner: &str,
    lease_id: &str,
    more: Vec<Document>,
) -> Document {
    let mut all: Vec<Bson> = vec![
        Bson::Document(doc! { "$eq": [f(field::OWNER), { "$literal": owner }] }),
        Bson::Document(doc! { "$eq": [f(field::LEASE_ID), lease_id] }),
        Bson::Document(missing(field::OTHER_OWNER)),
    ];
    all.extend(more.into_iter().map(Bson::Document));
    all.extend(OTHERS_WAIT.map(|name| Bson::Document(missing(name))));
    doc! { "$and": all }
}

/// `$$ROOT` with the fields of `set` set and those of `unset` removed.
pub(super) fn root_with(set: Document, unset: &[&str]) -> Document {
    let mut out = doc! { "$mergeObjects": ["$$ROOT", set] };
    for name in unset {
        out = doc! { "$unsetField": { "field": name, "input": out } };
    }
    out
}

/// The filter of one key's document.
pub(super) fn key_filter(key: &LeaseKey) -> Document {
    doc! { field::ID: key }
}

/// The documents of `keys`.
pub(super) fn keys_filter(keys: &[LeaseKey]) -> Document {
    let keys: Vec<Bson> = keys.iter().map(|k| k.to_bson()).collect();
    doc! { field::ID: { "$in": keys } }
}

/// Where a document keeps its lock fields (`aid`, `lid`, `tok`, `exp`, ...,
/// the names of [`field`]): at the top of a lock document, or under the
/// lock field `F` of a user's document.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(in crate::store::mongo) struct LockPath {
    /// `F`, or `None` at the top.
    field: Option<String>,
}

impl LockPath {
    /// The lock collection's: the lock fields at the top of the document.
    pub(in crate::store::mongo) const TOP: LockPath = LockPath { field: None };

    /// The lock fields under `field` (checked by `document::check_field`: a
    /// top-level name without `.` or `$`), or under a temporary field that
    /// holds them while a user's update pipeline runs.
    pub(in crate::store::mongo) fn under(field: &str) -> Self {
        LockPath {
            field: Some(field.to_string()),
        }
    }

    /// The path of lock field `name`: `name` at the top, `F.<name>` under `F`.
    pub(in crate::store::mongo) fn at(&self, name: &str) -> String {
        match &self.field {
            None => name.to_string(),
            Some(f) => format!("{f}.{name}"),
        }
    }

    /// The field path expression of lock field `name`: `$<name>` or `$F.<name>`.
    pub(in crate::store::mongo) fn var(&self, name: &str) -> String {
        format!("${}", self.at(name))
    }

    /// Whether the document has no lock yet: at the top, the document that
    /// the acquiring upsert is inserting ([`inserted`]); under `F`, a
    /// document without `F`.
    pub(in crate::store::mongo) fn absent(&self) -> Document {
        match &self.field {
            None => inserted(),
            Some(f) => doc! { "$eq": [{ "$type": format!("${f}") }, "missing"] },
        }
    }

    /// The layout test: a date `exp`, an int64 `tok` and no `value`
    /// (`store::is_our_layout`, as an expression). Anything else is a
    /// foreign holder's lock: a lease of ours that another lock pattern's
    /// client took over once expired has its `value` ("Read by other
    /// clients" in `store`).
    pub(in crate::store::mongo) fn our_layout(&self) -> Document {
        let mut all = vec![
            Bson::from(doc! { "$eq": [{ "$type": self.var(field::EXPIRES_AT) }, "date"] }),
            Bson::from(doc! { "$eq": [{ "$type": self.var(field::TOKEN) }, "long"] }),
        ];
        all.extend(self.untaken_expr().map(Bson::from));
        doc! { "$and": all }
    }

    /// The query form of "not taken over by another lock pattern's client"
    /// (no `value`), part of every filter of a write conditional on a
    /// lease id ("Read by other clients" in `store`). Only at the top: that
    /// pattern locks whole documents of a lock collection.
    pub(in crate::store::mongo) fn untaken(&self) -> Option<(String, Document)> {
        self.field
            .is_none()
            .then(|| (field::OTHER_OWNER.to_string(), doc! { "$exists": false }))
    }

    /// [`untaken`](Self::untaken) as an expression.
    fn untaken_expr(&self) -> Option<Document> {
        self.field.is_none().then(|| missing(field::OTHER_OWNER))
    }

    /// `filter` with [`untaken`](Self::untaken).
    fn with_untaken(&self, mut filter: Document) -> Document {
        if let Some((name, absent)) = self.untaken() {
            filter.insert(name, absent);
        }
        filter
    }

    /// The expiry a write of a lease that holds the document sets (a
    /// renewal, a retry of its acquisition): `max(exp, $$NOW + ttl_ms)`,
    /// never back under one lease id ("Late writes" in `store`).
    pub(in crate::store::mongo) fn renewed_expiry(&self, ttl_ms: i64) -> Document {
        doc! { "$max": [self.var(field::EXPIRES_AT), { "$add": ["$$NOW", ttl_ms] }] }
    }

    /// The lease has expired by the server's clock: `exp <= $$NOW`.
    pub(in crate::store::mongo) fn expired(&self) -> Document {
        doc! { "$lte": [self.var(field::EXPIRES_AT), "$$NOW"] }
    }

    /// The token rule, the token of a new acquisition:
    /// `max(tok + 1, ms($$NOW) * 2^20)` (see "Fencing tokens" in `store`).
    pub(in crate::store::mongo) fn next_token(&self) -> Document {
        doc! { "$max": [
            { "$add": [{ "$ifNull": [self.var(field::TOKEN), 0_i64] }, 1_i64] },
            { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << TOKEN_TIME_SHIFT] },
        ]}
    }

    /// The leader-transition counter after a new acquisition by `owner` (an
    /// expression): 0 for a lock without `aid` (a new one), `tr + 1` if the
    /// key's last acquisition (`aid`) was another owner's, else `tr` (a
    /// missing `tr` counts as 0; "Leader transitions" in `store`).
    pub(in crate::store::mongo) fn transitions_after(&self, owner: impl Into<Bson>) -> Document {
        let tr = doc! { "$ifNull": [self.var(field::TRANSITIONS), 0_i64] };
        let same_owner = doc! { "$eq": [self.var(field::OWNER), owner.into()] };
        doc! { "$cond": [
            { "$eq": [{ "$type": self.var(field::OWNER) }, "missing"] },
            0_i64,
            { "$cond": [same_owner, tr.clone(), { "$add": [tr, 1_i64] }] },
        ]}
    }

    /// The token-age test of delete mode ("Delete-on-release mode" in
    /// `store`): `ms($$NOW) * 2^20 >= tok + min_age_ms * 2^20` in int64
    /// arithmetic.
    pub(in crate::store::mongo) fn token_older_than(&self, min_age_ms: i64) -> Document {
        doc! { "$gte": [
            { "$multiply": [{ "$toLong": "$$NOW" }, 1_i64 << TOKEN_TIME_SHIFT] },
            { "$add": [self.var(field::TOKEN), min_age_ms << TOKEN_TIME_SHIFT] },
        ]}
    }

    /// The lock's owner id is `owner` (compared literally, never as an
    /// expression).
    pub(in crate::store::mongo) fn same_owner(&self, owner: &str) -> Document {
        doc! { "$eq": [self.var(field::OWNER), { "$literal": owner }] }
    }

    /// A retry of the acquisition `lease_id` (stored form, [`bson_lease_id`])
    /// of `owner`: this lease id and owner id. A lock another application
    /// rewrote to another owner (keeping `lid`) is not ours any more.
    pub(in crate::store::mongo) fn retry(&self, owner: &str, lease_id: &Bson) -> Document {
        let mut all = vec![
            Bson::from(doc! { "$eq": [self.var(field::LEASE_ID), lease_id.clone()] }),
            Bson::from(self.same_owner(owner)),
        ];
        all.extend(self.untaken_expr().map(Bson::from));
        doc! { "$and": all }
    }

    /// The win rule of an acquisition `lease_id` of `owner`: the lock is
    /// [`absent`](Self::absent), a [`retry`](Self::retry), or of
    /// [our layout](Self::our_layout), [expired](Self::expired), not yielded
    /// by this owner to a waiting one (`yu > $$NOW`) and, if given, `more`
    /// (in the lock collection, the queue of waiting owners allows it).
    pub(in crate::store::mongo) fn wins(
        &self,
        owner: &str,
        lease_id: &Bson,
        more: Option<Document>,
    ) -> Document {
        let yielded_by_us = doc! { "$and": [
            self.same_owner(owner),
            { "$gt": [self.var(field::YIELD_UNTIL), "$$NOW"] },
        ]};
        let mut free: Vec<Bson> = vec![
            self.our_layout().into(),
            self.expired().into(),
            doc! { "$not": [yielded_by_us] }.into(),
        ];
        free.extend(more.map(Bson::from));
        doc! { "$or": [
            self.absent(),
            self.retry(owner, lease_id),
            { "$and": free },
        ]}
    }

    /// The lock fields an acquisition that [`wins`](Self::wins) writes, in
    /// this order: `aid`, `lid`, `tok` (kept by a retry, else the
    /// [token rule](Self::next_token)), `acq` (kept by a retry), `ts =
    /// $$NOW`, `exp` ([`expiry_after`](Self::expiry_after)), `data` and
    /// `wt`, which only a retry keeps, and the
    /// [leader transitions](Self::transitions_after) (which a retry, of the
    /// same owner, keeps).
    pub(in crate::store::mongo) fn acquired(
        &self,
        owner: &str,
        lease_id: &Bson,
        ttl_ms: i64,
    ) -> Document {
        let mine = self.retry(owner, lease_id);
        let keep = |name: &str| doc! { "$cond": [mine.clone(), self.var(name), "$$REMOVE"] };
        doc! {
            field::OWNER: { "$literal": owner },
            field::LEASE_ID: lease_id.clone(),
            field::TOKEN: { "$cond": [mine.clone(), self.var(field::TOKEN), self.next_token()] },
            field::ACQUIRED_AT: { "$cond": [
                mine.clone(),
                { "$ifNull": [self.var(field::ACQUIRED_AT), "$$NOW"] },
                "$$NOW",
            ]},
            field::RENEWED_AT: "$$NOW",
            field::EXPIRES_AT: self.expiry_after(owner, lease_id, ttl_ms),
            field::PAYLOAD: keep(field::PAYLOAD),
            field::WAITING_SINCE: keep(field::WAITING_SINCE),
            field::TRANSITIONS: self.transitions_after(doc! { "$literal": owner }),
        }
    }

    /// The expiry an acquisition that [`wins`](Self::wins) writes: `$$NOW
    /// + ttl_ms`, and for a retry (this lease id's document) never less
    /// than it was ([`renewed_expiry`](Self::renewed_expiry)).
    pub(in crate::store::mongo) fn expiry_after(
        &self,
        owner: &str,
        lease_id: &Bson,
        ttl_ms: i64,
    ) -> Document {
        doc! { "$cond": [
            self.retry(owner, lease_id),
            self.renewed_expiry(ttl_ms),
            { "$add": ["$$NOW", ttl_ms] },
        ]}
    }

    /// A live lease of another owner than `owner`, of our layout with a lease
    /// id: what a waiting attempt marks (`wt`, [`waiting_since`](Self::waiting_since)).
    pub(in crate::store::mongo) fn held_by_other(&self, owner: &str) -> Document {
        doc! { "$and": [
            self.our_layout(),
            { "$eq": [{ "$type": self.var(field::LEASE_ID) }, "binData"] },
            { "$not": [self.expired()] },
            { "$not": [self.same_owner(owner)] },
        ]}
    }

    /// The yield of a release: `yu = $$NOW + yield_ms` if another owner
    /// waited (`wt`), else `yu` as it is ("Fairness between owners" in `store`).
    pub(in crate::store::mongo) fn yield_if_waited(&self, yield_ms: i64) -> Document {
        let waited = doc! { "$ne": [{ "$type": self.var(field::WAITING_SINCE) }, "missing"] };
        doc! { "$cond": [
            waited,
            { "$add": ["$$NOW", yield_ms] },
            self.var(field::YIELD_UNTIL),
        ]}
    }

    /// The waiting mark's value: `wt` as it is, or `$$NOW` (one write per
    /// holding period).
    pub(in crate::store::mongo) fn waiting_since(&self) -> Document {
        doc! { "$ifNull": [self.var(field::WAITING_SINCE), "$$NOW"] }
    }

    /// The document of `lease` of `owner`, only while it holds its lease id
    /// and owner id.
    pub(in crate::store::mongo) fn payload_filter(
        &self,
        owner: &str,
        lease: &LeaseRef,
    ) -> Document {
        self.with_untaken(doc! {
            field::ID: &lease.key,
            self.at(field::LEASE_ID): bson_lease_id(lease.lease_id),
            self.at(field::OWNER): { "$eq": owner },
        })
    }

    /// The documents among `filter`'s whose lock a release in delete mode
    /// deletes at once (in a user's document: removes `F`): of our layout
    /// (int64 `tok`), not waited for by another owner (no `wt`), none of
    /// `absent` present (the lock collection's `hs` and `q`), no minimum
    /// hold (`hl`) nor lock-delay (`nb`) ahead, their token
    /// [old enough](Self::token_older_than).
    pub(in crate::store::mongo) fn deletable_filter(
        &self,
        filter: Document,
        min_age_ms: i64,
        absent: &[&str],
    ) -> Document {
        let mut deletable = self.with_untaken(doc! {
            self.at(field::TOKEN): { "$type": "long" },
            self.at(field::WAITING_SINCE): { "$exists": false },
        });
        for name in absent {
            deletable.insert(self.at(name), doc! { "$exists": false });
        }
        let mut old_enough: Vec<Bson> = vec![self.token_older_than(min_age_ms).into()];
        for name in [field::HOLD_UNTIL, field::NOT_BEFORE] {
            old_enough.push(doc! { "$not": [{ "$gt": [self.var(name), "$$NOW"] }] }.into());
        }
        deletable.insert("$expr", doc! { "$and": old_enough });
        doc! { "$and": [filter, deletable] }
    }

    /// Released locks of our layout among `filter`'s (no `lid`, int64 `tok`,
    /// date `exp`), none of `absent` present, not yielded (`yu` not in the
    /// future) nor any of `until` in the future (the lock collection's
    /// minimum hold `hl`), whose token is at least `min_age_ms` old: what the
    /// follow-up delete of delete mode removes. A new acquisition (which sets
    /// `lid`) never matches.
    pub(in crate::store::mongo) fn released_filter(
        &self,
        filter: Document,
        min_age_ms: i64,
        absent: &[&str],
        until: &[&str],
    ) -> Document {
        let mut released = self.with_untaken(doc! {
            self.at(field::LEASE_ID): { "$exists": false },
            self.at(field::TOKEN): { "$type": "long" },
            self.at(field::EXPIRES_AT): { "$type": "date" },
        });
        for name in absent {
            released.insert(self.at(name), doc! { "$exists": false });
        }
        let mut old_enough: Vec<Bson> = vec![self.token_older_than(min_age_ms).into()];
        for name in std::iter::once(&field::YIELD_UNTIL).chain(until) {
            old_enough.push(doc! { "$not": [{ "$gt": [self.var(name), "$$NOW"] }] }.into());
        }
        released.insert("$expr", doc! { "$and": old_enough });
        doc! { "$and": [filter, released] }
    }

    /// The lock fields of a whole `document`: the document itself at the
    /// top, `F` under `F` (`None` if `F` is missing or not a document).
    pub(in crate::store::mongo) fn lock_of<'a>(
        &self,
        document: &'a Document,
    ) -> Option<&'a Document> {
        match &self.field {
            None => Some(document),
            Some(f) => document.get_document(f).ok(),
        }
    }

    /// Reads a change event of a place's stream of writes that may change
    /// who holds a key: a delete frees it; an insert or a replacement
    /// announces the lock fields of its `fullDocument` ([`lock_of`](Self::lock_of)),
    /// freeing the key if they hold no lease id; an update is read by
    /// `update`, since each place's stream names the updated lock fields its
    /// own way. `None` for an event of another kind, or one missing the
    /// fields its kind carries (`documentKey._id`, `fullDocument`).
    pub(in crate::store::mongo) fn key_write(
        &self,
        event: &Document,
        update: impl FnOnce(LeaseKey, &Document) -> Option<KeyWrite>,
    ) -> Option<KeyWrite> {
        let key = event_key(event)?;
        match event.get_str("operationType").ok()? {
            "delete" => Some(freed(key)),
            "insert" | "replace" => {
                let lock = self.lock_of(event.get_document("fullDocument").ok()?);
                let get = |name: &str| lock.and_then(|l| l.get(name));
                Some(announced(
                    key,
                    get(field::LEASE_ID).is_none(),
                    get(field::LEASE_ID),
                    get(field::OWNER),
                    get(field::TOKEN),
                ))
            }
            "update" => update(key, event),
            _ => None,
        }
    }
}

/// The restated `ttl` of a document of ours, in seconds from `renewed`
/// (its `ts`, restated as `obtained_at`), as "Read by other clients" in
/// `store` says: held until `expires`, and at least until its fencing
/// `token` is `DELETE_MIN_TOKEN_AGE` old (+ 1 ms, for the division's
/// rounding).
pub(in crate::store::mongo) fn restated_seconds(
    expires: impl Into<Bson>,
    renewed: impl Into<Bson>,
    token: impl Into<Bson>,
) -> Document {
    let old_enough = doc! { "$toDate": { "$add": [
        { "$toLong": { "$divide": [token.into(), (1_i64 << TOKEN_TIME_SHIFT) as f64] } },
        min_token_age_ms() + 1,
    ]}};
    doc! { "$divide": [
        { "$subtract": [{ "$max": [expires.into(), old_enough] }, renewed.into()] },
        1000.0,
    ]}
}

/// The last stage of every write of a lock document that may change `ts`
/// or `exp`: on a document of [our layout](our_layout) after the write,
/// `obtained_at = ts` and `ttl` ([`restated_seconds`]); any other document
/// keeps them as they are ("Read by other clients" in `store`).
pub(in crate::store::mongo) fn restated() -> Document {
    let seconds = restated_seconds(f(field::EXPIRES_AT), f(field::RENEWED_AT), f(field::TOKEN));
    let restated = doc! { "$mergeObjects": ["$$ROOT", {
        field::OBTAINED_AT: f(field::RENEWED_AT),
        field::TTL_SECONDS: seconds,
    }]};
    let ours =
        doc! { "$and": [our_layout(), { "$eq": [{ "$type": f(field::RENEWED_AT) }, "date"] }] };
    doc! { "$replaceWith": { "$cond": [ours, restated, "$$ROOT"] } }
}

/// `stages` then [`restated`]: a write of a lock document that may change
/// its `ts` or `exp`.
pub(in crate::store::mongo) fn restated_after(mut stages: Vec<Document>) -> Vec<Document> {
    stages.push(restated());
    stages
}

/// Whether the acquiring upsert of a lock document (on `{_id: key, _ins:
/// null}`, `pipeline::upsert_filter`) is inserting it: it holds only `_id`
/// and `_ins: null` (an existing document has no `_ins`; an existing bare
/// `{_id}` is a foreign holder's lock; docs/mongodb-behaviour.md, B29).
pub(in crate::store::mongo) fn inserted() -> Document {
    doc! { "$and": [
        { "$eq": [{ "$type": format!("${}", field::INSERTED) }, "null"] },
        { "$eq": [{ "$size": { "$objectToArray": "$$ROOT" } }, 2] },
    ]}
}

/// The leader-transition counter at the top of a lock document
/// ([`LockPath::transitions_after`]).
pub(in crate::store::mongo) fn transitions_after(owner: impl Into<Bson>) -> Document {
    LockPath::TOP.transitions_after(owner)
}

/// The layout test at the top of a lock document ([`LockPath::our_layout`]).
pub(in crate::store::mongo) fn our_layout() -> Document {
    LockPath::TOP.our_layout()
}

/// The token rule at the top of a lock document ([`LockPath::next_token`]).
pub(in crate::store::mongo) fn next_token() -> Document {
    LockPath::TOP.next_token()
}

/// [`LockPath::payload_filter`] in the lock collection.
pub(in crate::store::mongo) fn payload_filter(owner: &str, lease: &LeaseRef) -> Document {
    LockPath::TOP.payload_filter(owner, lease)
}

/// A lease id as stored in `lid`: a BSON UUID (binary subtype 4).
pub(in crate::store::mongo) fn bson_lease_id(id: Uuid) -> Bson {
    Bson::from(mongodb::bson::Uuid::from_bytes(id.into_bytes()))
}

/// A lease id as stored ([`bson_lease_id`]); `None` for a missing value or
/// one of another type.
pub(in crate::store::mongo) fn read_lease_id(value: Option<&Bson>) -> Option<Uuid> {
    match value {
        Some(Bson::Binary(b)) if b.subtype == BinarySubtype::Uuid => {
            Uuid::from_slice(&b.bytes).ok()
        }
        _ => None,
    }
}

/// A fencing token as stored (`tok`, an int64; an int32 is read too);
/// `None` for a missing value, a negative one, or one of another type.
pub(in crate::store::mongo) fn read_token(value: Option<&Bson>) -> Option<u64> {
    match value {
        Some(Bson::Int64(n)) => u64::try_from(*n).ok(),
        Some(Bson::Int32(n)) => u64::try_from(*n).ok(),
        _ => None,
    }
}

/// The key of a change event's document (`documentKey._id`).
pub(in crate::store::mongo) fn event_key(event: &Document) -> Option<LeaseKey> {
    let id = event.get_document("documentKey").ok()?.get(field::ID)?;
    Some(LeaseKey::from(id.clone()))
}

/// The write of a change event that may have freed `key` and shows no
/// lease: a delete, a release of a holder of a shared or semaphore key.
pub(in crate::store::mongo) fn freed(key: LeaseKey) -> KeyWrite {
    announced(key, true, None, None, None)
}

/// The write of a change event on `key` that `freed` it or not and shows
/// the stored `lid`, `aid` and `tok` it set (each `None` if not shown).
pub(in crate::store::mongo) fn announced(
    key: LeaseKey,
    freed: bool,
    lid: Option<&Bson>,
    aid: Option<&Bson>,
    tok: Option<&Bson>,
) -> KeyWrite {
    KeyWrite {
        key,
        freed,
        lease_id: read_lease_id(lid),
        owner: aid.and_then(Bson::as_str).map(str::to_string),
        token: read_token(tok),
    }
}

/// The variable of the light acquire's and release's commands (`let`)
/// holding the lease id, so that their updates are the same for every
/// command of one owner, encoded once per store
/// ([`LightForms`](super::light_forms::LightForms)).
pub(super) const LID: &str = "$$lid";

/// The variable of the light acquire's and handoff's commands (`let`)
/// holding the TTL, in milliseconds (int64), for the same reason as
/// [`LID`].
pub(super) const TTL: &str = "$$ttl";

/// The token of the light acquire's reply if this very write made `owner`
/// the holder under `lease_id` (its `ts` is the write's `$$NOW`); `None`
/// if the light form did not apply. A document an earlier attempt under
/// the same lease id left (its outcome unknown, B7) is not this write's:
/// the general form renews it as a retry.
pub(super) fn acquired_token(doc: &Document, owner: &str, lease_id: Uuid) -> Option<u64> {
    let ours = doc.get(field::LEASE_ID) == Some(&bson_lease_id(lease_id))
        && doc.get_str(field::OWNER) == Ok(owner)
        && doc.get_datetime(field::RENEWED_AT).is_ok()
        && doc.get_datetime(field::RENEWED_AT).ok() == doc.get_datetime("now").ok();
    ours.then(|| doc.get_i64(field::TOKEN).ok())
        .flatten()
        .map(|token| token as u64)
}

/// The `let` variables of the light handoff: the lease handed over, and
/// the next one.
pub(super) const FROM: &str = "$$from";

pub(super) const TO: &str = "$$to";

#[cfg(test)]
mod tests;
