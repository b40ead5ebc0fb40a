//! Helpers of the kinds tests: reading a key's holders as stored, and the
//! bounds that only turn a hang into a failure.

use std::time::{Duration, SystemTime};

use mongo_lease::{Error, LeaseKind, LeaseManager};
use mongodb::bson::Document;

/// Turns a hang into a failure: every wait it bounds takes milliseconds to
/// a few seconds (a TTL of 2 s or a minimum hold of 4 s) here.
pub const LIVENESS: Duration = Duration::from_secs(60);

/// One entry of a shared or semaphore key's `hs` array, as stored (expired
/// entries included).
#[derive(Debug, Clone)]
pub struct StoredHolder {
    pub owner: String,
    pub token: u64,
    pub expires_at: SystemTime,
}

/// Every entry of `doc`'s `hs` array, oldest first.
pub fn stored_holders(doc: &Document) -> Vec<StoredHolder> {
    doc.get_array("hs")
        .expect("the document has holders (hs)")
        .iter()
        .map(|entry| {
            let entry = entry.as_document().expect("a holder entry");
            StoredHolder {
                owner: entry.get_str("aid").expect("aid").to_owned(),
                token: entry.get_i64("tok").expect("tok") as u64,
                expires_at: entry.get_datetime("exp").expect("exp").to_system_time(),
            }
        })
        .collect()
}

/// A stored date field of `doc` as a [`SystemTime`].
pub fn stored_time(doc: &Document, field: &str) -> SystemTime {
    doc.get_datetime(field)
        .unwrap_or_else(|_| panic!("no date {field} in {doc}"))
        .to_system_time()
}

/// `doc` without what a renewal changes (`ts` and `exp`, at the top and in
/// each holder entry): two reads of a held key compare equal unless
/// something other than the holders' heartbeat wrote to it.
pub fn without_renewals(doc: &Document) -> Document {
    let mut doc = doc.clone();
    doc.remove("ts");
    doc.remove("exp");
    if let Ok(entries) = doc.get_array_mut("hs") {
        for entry in entries.iter_mut() {
            if let Some(entry) = entry.as_document_mut() {
                entry.remove("ts");
                entry.remove("exp");
            }
        }
    }
    doc
}

/// The server's `$$NOW`, read with `inspect` of `key` (which must have a
/// lock document).
pub async fn server_now(manager: &LeaseManager, key: &str) -> SystemTime {
    manager
        .inspect(key)
        .await
        .expect("inspect")
        .unwrap_or_else(|| panic!("no lock document for {key:?}"))
        .server_time
}

/// Asserts that `result` is a [`Error::KindMismatch`] on `key` of the
/// stored and requested kinds.
#[track_caller]
pub fn assert_mismatch<T: std::fmt::Debug>(
    result: mongo_lease::Result<T>,
    stored: LeaseKind,
    requested: LeaseKind,
) {
    match result {
        Err(Error::KindMismatch {
            stored: s,
            requested: r,
        }) => {
            assert_eq!((s, r), (stored, requested), "stored and requested kinds");
        }
        other => panic!("expected a kind mismatch ({stored} asked as {requested}), got {other:?}"),
    }
}
