//! [`LeaseKey`]: the key of a lease, any BSON value MongoDB accepts as `_id`.

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use mongodb::bson::{self, Binary, Bson, DateTime, Document, oid::ObjectId, spec::BinarySubtype};

/// Why a key was refused, as [`Error::InvalidKey`](crate::Error::InvalidKey)
/// gives it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid lease key: {reason}")]
pub struct InvalidKey {
    /// Why the key was refused.
    pub reason: String,
}

type Result<T> = std::result::Result<T, InvalidKey>;

/// Longest accepted lease key: 1 KiB, in bytes of UTF-8 for a string key,
/// in bytes of the encoded BSON value for any other [`LeaseKey`].
pub const MAX_KEY_LEN: usize = 1024;

/// The key of a lease: the `_id` of its lock document, exactly as given (never
/// converted: an `ObjectId` key is stored as that `ObjectId`, an `i64` key as
/// a 64-bit integer).
///
/// Every call that takes a key takes `impl Into<LeaseKey>` (`"job-1"` works),
/// and a key compares equal to a `&str`. To lock a document of another
/// collection, use its `_id` as the key, whatever its type:
///
/// ```
/// use mongo_lease::LeaseKey;
/// use mongodb::bson::{doc, oid::ObjectId};
///
/// let oid: ObjectId = "5087b72181a445980ae47d13".parse().unwrap();
/// let key = LeaseKey::from(oid);
/// assert_eq!(key.to_string(), r#"{"$oid":"5087b72181a445980ae47d13"}"#);
/// assert_eq!(LeaseKey::from_extended_json(&key.to_extended_json()).unwrap(), key);
/// assert_eq!(LeaseKey::from("job-1"), "job-1");
/// assert_eq!(LeaseKey::from(doc! { "tenant": 7, "item": "a" }).as_str(), None);
/// ```
///
/// # Accepted types
///
/// A key is checked when it is used, before any round trip; a refused key
/// gives [`Error::InvalidKey`](crate::Error::InvalidKey). Accepted: every
/// type MongoDB accepts as `_id` (UUIDs are binary subtype 4). Refused:
/// arrays, regular expressions, `undefined`, embedded documents with a field
/// name starting with `$` at any depth, the empty string, and keys longer
/// than [`MAX_KEY_LEN`].
///
/// # Identity and order
///
/// Two keys are equal (`Eq`, `Hash`) when MongoDB's `_id` index treats them as
/// the same key: numbers by value (`LeaseKey::from(1_i32) == LeaseKey::from(1_i64)`),
/// strings and symbols by their bytes, embedded documents field by field.
/// `Ord` follows MongoDB's BSON comparison order (type, then value), so
/// [`LeaseManager::list`](crate::LeaseManager::list) pages in MongoDB's
/// order; a Decimal128 equals only the same bits and sorts after the other
/// numbers.
///
/// `Display` shows a string key as is, any other as
/// [`LeaseKey::to_extended_json`]. Cloning a key counts a reference.
#[derive(Clone)]
pub struct LeaseKey(Arc<Repr>);

/// What a [`LeaseKey`] keeps: a string key's text, or any other key's value
/// (never a `Bson::String`: [`LeaseKey::new`] keeps those as `Str`).
#[derive(Clone)]
enum Repr {
    Str(Text),
    Other(Box<Bson>),
}

/// The most bytes of text a string key holds in place ([`Text::Short`]):
/// as many as leave [`Repr`] at 24 bytes, so a short key is one allocation
/// of 40 bytes.
const SHORT: usize = 22;

/// A string key's text: in place when it is short (most keys), else boxed.
#[derive(Clone)]
enum Text {
    /// The first `len` bytes of `bytes`, copied from a `str`.
    Short {
        len: u8,
        bytes: [u8; SHORT],
    },
    Long(Box<str>),
}

impl Text {
    fn new(text: String) -> Text {
        if text.len() > SHORT {
            return Text::Long(text.into_boxed_str());
        }
        let mut bytes = [0; SHORT];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Text::Short {
            len: text.len() as u8,
            bytes,
        }
    }

    fn as_str(&self) -> &str {
        match self {
            Text::Short { len, bytes } => std::str::from_utf8(&bytes[..usize::from(*len)])
                .expect("a short key's bytes are copied whole from a str"),
            Text::Long(text) => text,
        }
    }
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LeaseKey({})", self.to_extended_json())
    }
}

impl LeaseKey {
    /// A key holding `bson` (checked when it is used).
    fn new(bson: Bson) -> Self {
        match bson {
            Bson::String(s) => LeaseKey(Arc::new(Repr::Str(Text::new(s)))),
            other => LeaseKey(Arc::new(Repr::Other(Box::new(other)))),
        }
    }

    /// Parses a key from MongoDB Extended JSON v2, canonical or relaxed
    /// (`{"$oid":"5087b72181a445980ae47d13"}`, `7`, `"job-1"`, ...).
    ///
    /// # Errors
    ///
    /// [`InvalidKey`] if the text is not JSON or not valid Extended JSON.
    /// The key itself is checked when it is used, like any key.
    pub fn from_extended_json(json: &str) -> Result<LeaseKey> {
        let value: serde_json::Value = serde_json::from_str(json).map_err(|e| InvalidKey {
            reason: format!("not JSON: {e}"),
        })?;
        let bson = Bson::try_from(value).map_err(|e| InvalidKey {
            reason: format!("not MongoDB Extended JSON v2: {e}"),
        })?;
        Ok(LeaseKey::new(bson))
    }

    /// The key as canonical Extended JSON v2 (`"job-1"` with its quotes),
    /// which [`LeaseKey::from_extended_json`] reads back to the same key.
    pub fn to_extended_json(&self) -> String {
        self.to_bson().into_canonical_extjson().to_string()
    }

    /// A copy of the key's BSON value, as stored in the lock document's `_id`.
    ///
    /// ```
    /// use mongo_lease::LeaseKey;
    /// use mongodb::bson::Bson;
    ///
    /// assert_eq!(LeaseKey::from("job-1").to_bson(), Bson::String("job-1".into()));
    /// assert_eq!(LeaseKey::from(7_i64).to_bson(), Bson::Int64(7));
    /// ```
    pub fn to_bson(&self) -> Bson {
        match &*self.0 {
            Repr::Str(s) => Bson::String(s.as_str().to_owned()),
            Repr::Other(bson) => Bson::clone(bson),
        }
    }

    /// The key's BSON value, as stored in the lock document's `_id` (without
    /// a copy when this is the key's last handle).
    pub fn into_bson(self) -> Bson {
        match Arc::unwrap_or_clone(self.0) {
            Repr::Str(Text::Long(s)) => Bson::String(s.into_string()),
            Repr::Str(s) => Bson::String(s.as_str().to_owned()),
            Repr::Other(bson) => *bson,
        }
    }

    /// The key as a string slice if it is a string key, `None` otherwise.
    pub fn as_str(&self) -> Option<&str> {
        match &*self.0 {
            Repr::Str(s) => Some(s.as_str()),
            Repr::Other(_) => None,
        }
    }

    /// Checks that MongoDB accepts the key as `_id`, and its size.
    pub(crate) fn validate(&self) -> Result<()> {
        let refuse = |reason: String| Err(InvalidKey { reason });
        let value = match &*self.0 {
            Repr::Str(s) if s.as_str().is_empty() => return refuse("the key is empty".into()),
            Repr::Str(s) if s.as_str().len() > MAX_KEY_LEN => {
                let len = s.as_str().len();
                return refuse(format!(
                    "the key is {len} bytes long; the limit is {MAX_KEY_LEN}"
                ));
            }
            Repr::Str(_) => return Ok(()),
            Repr::Other(value) => value,
        };
        refused_type(value, "")?;
        let len = encoded_len(value);
        if len > MAX_KEY_LEN {
            return refuse(format!(
                "the {} key is {len} bytes long encoded as BSON; the limit is {MAX_KEY_LEN}",
                type_name(value)
            ));
        }
        Ok(())
    }
}

/// Refuses the types MongoDB refuses as `_id`, and `$`-prefixed field names in
/// embedded documents at any depth.
fn refused_type(value: &Bson, path: &str) -> Result<()> {
    let refuse = |what: &str| {
        Err(InvalidKey {
            reason: format!("MongoDB does not accept {what} as _id{path}"),
        })
    };
    match value {
        Bson::Array(_) if path.is_empty() => refuse("an array"),
        Bson::RegularExpression(_) if path.is_empty() => refuse("a regular expression"),
        Bson::Undefined if path.is_empty() => refuse("undefined"),
        Bson::Document(doc) => {
            for (name, field) in doc {
                if name.starts_with('$') {
                    return Err(InvalidKey {
                        reason: format!(
                            "MongoDB does not accept a document key with a field name \
                             starting with '$' ({name:?} in _id{path})"
                        ),
                    });
                }
                refused_type(field, &format!("{path}.{name}"))?;
            }
            Ok(())
        }
        Bson::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                refused_type(item, &format!("{path}.{i}"))?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// Bytes of a BSON value as encoded in a document (without type byte and name).
fn encoded_len(value: &Bson) -> usize {
    let doc = bson::doc! { "": value.clone() };
    // An empty name: 4 (length) + 1 (type) + 1 (name's NUL) + value + 1 (EOO).
    bson::to_vec(&doc).map_or(usize::MAX, |bytes| bytes.len().saturating_sub(7))
}

fn type_name(value: &Bson) -> &'static str {
    match value {
        Bson::Double(_) => "double",
        Bson::String(_) => "string",
        Bson::Array(_) => "array",
        Bson::Document(_) => "document",
        Bson::Boolean(_) => "boolean",
        Bson::Null => "null",
        Bson::RegularExpression(_) => "regular expression",
        Bson::JavaScriptCode(_) => "JavaScript code",
        Bson::JavaScriptCodeWithScope(_) => "JavaScript code with scope",
        Bson::Int32(_) => "int32",
        Bson::Int64(_) => "int64",
        Bson::Timestamp(_) => "timestamp",
        Bson::Binary(_) => "binary",
        Bson::ObjectId(_) => "ObjectId",
        Bson::DateTime(_) => "date",
        Bson::Symbol(_) => "symbol",
        Bson::Decimal128(_) => "Decimal128",
        Bson::Undefined => "undefined",
        Bson::MaxKey => "MaxKey",
        Bson::MinKey => "MinKey",
        Bson::DbPointer(_) => "DBPointer",
    }
}

/// MongoDB's canonical type rank (the order of types in comparisons).
fn rank(value: &Bson) -> u8 {
    match value {
        Bson::MinKey => 0,
        Bson::Null | Bson::Undefined => 5,
        Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_) | Bson::Decimal128(_) => 10,
        Bson::String(_) | Bson::Symbol(_) => STRING_RANK,
        Bson::Document(_) => 20,
        Bson::Array(_) => 25,
        Bson::Binary(_) => 30,
        Bson::ObjectId(_) => 35,
        Bson::Boolean(_) => 40,
        Bson::DateTime(_) => 45,
        Bson::Timestamp(_) => 47,
        Bson::RegularExpression(_) => 50,
        Bson::DbPointer(_) => 55,
        Bson::JavaScriptCode(_) => 60,
        Bson::JavaScriptCodeWithScope(_) => 65,
        Bson::MaxKey => 127,
    }
}

/// A number as MongoDB compares it: an integer, a double, or (apart) a Decimal128.
enum Num {
    Int(i64),
    Float(f64),
    Decimal([u8; 16]),
}

fn num(value: &Bson) -> Option<Num> {
    Some(match value {
        Bson::Int32(i) => Num::Int(i64::from(*i)),
        Bson::Int64(i) => Num::Int(*i),
        Bson::Double(f) => float_num(*f),
        Bson::Decimal128(d) => Num::Decimal(d.bytes()),
        _ => return None,
    })
}

/// A double that holds an integer of the `i64` range is that integer (so that
/// equal numbers hash alike); other doubles stay doubles.
fn float_num(f: f64) -> Num {
    // 2^63 is exactly representable; every integral double in [-2^63, 2^63) fits.
    if f.fract() == 0.0 && (-9_223_372_036_854_775_808.0..9_223_372_036_854_775_808.0).contains(&f)
    {
        Num::Int(f as i64)
    } else {
        Num::Float(f)
    }
}

fn cmp_float(a: f64, b: f64) -> Ordering {
    // MongoDB: NaN equals NaN and sorts before every other number.
    match (a.is_nan(), b.is_nan()) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => a.partial_cmp(&b).unwrap_or(Ordering::Equal),
    }
}

fn cmp_num(a: &Num, b: &Num) -> Ordering {
    match (a, b) {
        (Num::Int(x), Num::Int(y)) => x.cmp(y),
        // A `Float` is never integral within the i64 range, so it never equals
        // an `Int`; comparing as doubles orders them correctly then.
        (Num::Int(x), Num::Float(y)) => cmp_float(*x as f64, *y).then(Ordering::Less),
        (Num::Float(x), Num::Int(y)) => cmp_float(*x, *y as f64).then(Ordering::Greater),
        (Num::Float(x), Num::Float(y)) => cmp_float(*x, *y),
        (Num::Decimal(x), Num::Decimal(y)) => x.cmp(y),
        (Num::Decimal(_), _) => Ordering::Greater,
        (_, Num::Decimal(_)) => Ordering::Less,
    }
}

fn value_bytes(value: &Bson) -> Vec<u8> {
    bson::to_vec(&bson::doc! { "": value.clone() }).unwrap_or_default()
}

fn cmp_bson(a: &Bson, b: &Bson) -> Ordering {
    let order = rank(a).cmp(&rank(b));
    if order != Ordering::Equal {
        return order;
    }
    match (a, b) {
        (Bson::MinKey | Bson::MaxKey | Bson::Null | Bson::Undefined, _) => Ordering::Equal,
        (Bson::String(x) | Bson::Symbol(x), Bson::String(y) | Bson::Symbol(y)) => {
            x.as_bytes().cmp(y.as_bytes())
        }
        (Bson::Document(x), Bson::Document(y)) => {
            for ((ka, va), (kb, vb)) in x.iter().zip(y) {
                let order = rank(va)
                    .cmp(&rank(vb))
                    .then_with(|| ka.as_bytes().cmp(kb.as_bytes()))
                    .then_with(|| cmp_bson(va, vb));
                if order != Ordering::Equal {
                    return order;
                }
            }
            x.len().cmp(&y.len())
        }
        (Bson::Array(x), Bson::Array(y)) => {
            for (u, v) in x.iter().zip(y) {
                let order = cmp_bson(u, v);
                if order != Ordering::Equal {
                    return order;
                }
            }
            x.len().cmp(&y.len())
        }
        (Bson::Binary(x), Bson::Binary(y)) => x
            .bytes
            .len()
            .cmp(&y.bytes.len())
            .then_with(|| u8::from(x.subtype).cmp(&u8::from(y.subtype)))
            .then_with(|| x.bytes.cmp(&y.bytes)),
        (Bson::ObjectId(x), Bson::ObjectId(y)) => x.bytes().cmp(&y.bytes()),
        (Bson::Boolean(x), Bson::Boolean(y)) => x.cmp(y),
        (Bson::DateTime(x), Bson::DateTime(y)) => x.timestamp_millis().cmp(&y.timestamp_millis()),
        (Bson::Timestamp(x), Bson::Timestamp(y)) => x.cmp(y),
        _ => match (num(a), num(b)) {
            (Some(x), Some(y)) => cmp_num(&x, &y),
            _ => value_bytes(a).cmp(&value_bytes(b)),
        },
    }
}

fn hash_bson<H: Hasher>(value: &Bson, state: &mut H) {
    rank(value).hash(state);
    match value {
        Bson::MinKey | Bson::MaxKey | Bson::Null | Bson::Undefined => {}
        Bson::String(s) | Bson::Symbol(s) => s.hash(state),
        Bson::Document(doc) => {
            doc.len().hash(state);
            for (name, field) in doc {
                name.hash(state);
                hash_bson(field, state);
            }
        }
        Bson::Array(items) => {
            items.len().hash(state);
            for item in items {
                hash_bson(item, state);
            }
        }
        Bson::Binary(b) => {
            u8::from(b.subtype).hash(state);
            b.bytes.hash(state);
        }
        Bson::ObjectId(o) => o.bytes().hash(state),
        Bson::Boolean(b) => b.hash(state),
        Bson::DateTime(d) => d.timestamp_millis().hash(state),
        Bson::Timestamp(t) => (t.time, t.increment).hash(state),
        other => match num(other) {
            Some(Num::Int(i)) => (0u8, i).hash(state),
            // NaNs are all equal; every other non-integral double by its bits.
            Some(Num::Float(f)) if f.is_nan() => 1u8.hash(state),
            Some(Num::Float(f)) => (2u8, f.to_bits()).hash(state),
            Some(Num::Decimal(d)) => (3u8, d).hash(state),
            None => value_bytes(other).hash(state),
        },
    }
}

/// A string key against any key, in MongoDB's order ([`cmp_bson`] of
/// `Bson::String(key)` and `other`, without building the former).
fn cmp_str(key: &str, other: &Repr) -> Ordering {
    match other {
        Repr::Str(s) => key.as_bytes().cmp(s.as_str().as_bytes()),
        Repr::Other(other) => STRING_RANK.cmp(&rank(other)).then_with(|| match &**other {
            Bson::Symbol(s) => key.as_bytes().cmp(s.as_bytes()),
            _ => Ordering::Equal,
        }),
    }
}

/// [`rank`] of a string.
const STRING_RANK: u8 = 15;

impl PartialEq for LeaseKey {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for LeaseKey {}

impl PartialOrd for LeaseKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LeaseKey {
    fn cmp(&self, other: &Self) -> Ordering {
        match (&*self.0, &*other.0) {
            (Repr::Str(key), other) => cmp_str(key.as_str(), other),
            (this, Repr::Str(key)) => cmp_str(key.as_str(), this).reverse(),
            (Repr::Other(a), Repr::Other(b)) => cmp_bson(a, b),
        }
    }
}

impl Hash for LeaseKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        match &*self.0 {
            // As `hash_bson` hashes a `Bson::String` (and a symbol).
            Repr::Str(s) => {
                STRING_RANK.hash(state);
                s.as_str().hash(state);
            }
            Repr::Other(value) => hash_bson(value, state),
        }
    }
}

impl PartialEq<str> for LeaseKey {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == Some(other)
    }
}

impl PartialEq<&str> for LeaseKey {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == Some(*other)
    }
}

impl PartialEq<String> for LeaseKey {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == Some(other.as_str())
    }
}

impl PartialEq<LeaseKey> for str {
    fn eq(&self, other: &LeaseKey) -> bool {
        other == self
    }
}

impl PartialEq<LeaseKey> for &str {
    fn eq(&self, other: &LeaseKey) -> bool {
        other == *self
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0 {
            Repr::Str(s) => f.write_str(s.as_str()),
            Repr::Other(_) => f.write_str(&self.to_extended_json()),
        }
    }
}

impl From<&LeaseKey> for LeaseKey {
    fn from(key: &LeaseKey) -> Self {
        key.clone()
    }
}

/// Keys of these BSON types: any type, through `From<Bson>`.
macro_rules! from_bson {
    ($($type:ty),*) => {$(
        impl From<$type> for LeaseKey {
            fn from(key: $type) -> Self {
                LeaseKey::new(Bson::from(key))
            }
        }
    )*};
}

from_bson!(&str, String, &String);
from_bson!(ObjectId, i32, i64, bson::Uuid, DateTime, Binary, Document);

/// A UUID is stored as BSON binary subtype 4, like the driver's `bson::Uuid`.
impl From<uuid::Uuid> for LeaseKey {
    fn from(key: uuid::Uuid) -> Self {
        LeaseKey::new(Bson::Binary(Binary {
            subtype: BinarySubtype::Uuid,
            bytes: key.as_bytes().to_vec(),
        }))
    }
}

/// Any BSON value; it is checked when used, like every key.
impl From<Bson> for LeaseKey {
    fn from(key: Bson) -> Self {
        LeaseKey::new(key)
    }
}

impl From<LeaseKey> for Bson {
    fn from(key: LeaseKey) -> Self {
        key.into_bson()
    }
}

#[cfg(test)]
mod tests;
