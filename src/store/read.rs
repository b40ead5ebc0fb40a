//! Reading a lock document as a [`LeaseInfo`]: its kind, its live holders,
//! whether it has our layout or is a foreign holder's lock (see "Document
//! schema" and "Sharing a lock collection" in the parent module).

use std::time::SystemTime;

use mongodb::bson::{Bson, Document};

use super::field;
use crate::info::{HolderInfo, LeaseInfo, WaitingOwner};
use crate::key::LeaseKey;

/// The kind a lock document of our layout is held as: a semaphore's permits
/// (`pm`), shared (`hs` without `pm`), or exclusive.
pub(crate) fn stored_kind(doc: &Document) -> crate::kind::LeaseKind {
    match (doc.get(field::HOLDERS), doc.get(field::PERMITS)) {
        (Some(Bson::Array(_)), Some(pm)) => crate::kind::LeaseKind::Permit {
            permits: permits(pm),
        },
        (Some(Bson::Array(_)), None) => crate::kind::LeaseKind::Shared,
        _ => crate::kind::LeaseKind::Exclusive,
    }
}

/// An integer as stored (an int32 or an int64).
pub(crate) fn int(value: Option<&Bson>) -> Option<i64> {
    match value? {
        Bson::Int32(n) => Some(i64::from(*n)),
        Bson::Int64(n) => Some(*n),
        _ => None,
    }
}

/// A semaphore's number of permits as stored (`pm`); 0 if it is not an
/// integer that fits.
pub(crate) fn permits(pm: &Bson) -> u32 {
    int(Some(pm))
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(0)
}

/// A fencing token as stored (`tok`, an int64; an int32 is read too);
/// `None` for a missing value, a negative one, or one of another type.
pub(crate) fn token(tok: Option<&Bson>) -> Option<u64> {
    int(tok).and_then(|n| u64::try_from(n).ok())
}

/// The live holders (`exp > server_time`) of a shared or semaphore key's
/// `hs`, oldest first (as stored); entries of another layout are skipped.
pub(crate) fn live_holders(doc: &Document, server_time: SystemTime) -> Vec<HolderInfo> {
    let Ok(entries) = doc.get_array(field::HOLDERS) else {
        return Vec::new();
    };
    entries
        .iter()
        .filter_map(|entry| {
            let entry = entry.as_document()?;
            let expires_at = entry.get_datetime(field::EXPIRES_AT).ok()?.to_system_time();
            let time = |name: &str| {
                entry
                    .get_datetime(name)
                    .map(|d| d.to_system_time())
                    .unwrap_or(expires_at)
            };
            (expires_at > server_time).then(|| HolderInfo {
                owner_id: entry.get_str(field::OWNER).unwrap_or_default().to_string(),
                fencing_token: entry.get_i64(field::TOKEN).unwrap_or(0) as u64,
                acquired_at: time(field::ACQUIRED_AT),
                renewed_at: time(field::RENEWED_AT),
                expires_at,
                permits: int(entry.get(field::PERMITS_TAKEN))
                    .and_then(|n| u32::try_from(n).ok())
                    .unwrap_or(1),
            })
        })
        .collect()
}

/// The waiting owners of a lock document at `server_time`, first served
/// first: the live entries of `q` (`re > server_time`) in order, then a
/// live exclusive waiter's mark (`xw`); entries of another layout are
/// skipped ([`LeaseInfo::waiters`]).
pub(crate) fn live_waiters(doc: &Document, server_time: SystemTime) -> Vec<WaitingOwner> {
    let date = |d: &Document, name: &str| d.get_datetime(name).ok().map(|t| t.to_system_time());
    let queue = doc.get_array(field::QUEUE).into_iter().flatten();
    let mark = doc.get_document(field::EXCLUSIVE_WAITER).ok();
    let entries = queue
        .filter_map(|entry| {
            let entry = entry.as_document()?;
            let at = date(entry, field::REGISTERED_AT);
            Some((entry, at?, date(entry, field::REGISTRATION_EXPIRES)?))
        })
        .map(|(entry, at, re)| (entry, Some(at), re))
        .chain(mark.and_then(|m| Some((m, None, date(m, field::EXPIRES_AT)?))));
    entries
        .filter(|(_, _, expires_at)| *expires_at > server_time)
        .filter_map(|(entry, registered_at, expires_at)| {
            Some(WaitingOwner {
                owner_id: entry.get_str(field::OWNER).ok()?.to_string(),
                kind: crate::kind::LeaseKind::Exclusive,
                registered_at,
                expires_at,
            })
        })
        .collect()
}

/// Whether `doc` (as stored or projected) has this crate's layout: an int64
/// `tok` and a date `exp`. Any other document is a lock held by a foreign
/// holder (another application's lock document, e.g. `{_id, ts, aid}`, or a
/// bare `{_id}`, which this crate never leaves: "Document schema" in
/// `store`).
pub(crate) fn is_our_layout(doc: &Document) -> bool {
    doc.get_i64(field::TOKEN).is_ok()
        && doc.get_datetime(field::EXPIRES_AT).is_ok()
        && !doc.contains_key(field::OTHER_OWNER)
}

/// The owner id shown for a foreign holder: the owner field of its layout
/// (the projected [`OWNER`](crate::foreign::OWNER)), else its `aid`; a
/// string as it is, another type in canonical Extended JSON, empty if
/// absent.
pub(crate) fn foreign_owner(doc: &Document) -> String {
    match doc.get(crate::foreign::OWNER).or(doc.get(field::OWNER)) {
        None => String::new(),
        Some(Bson::String(s)) => s.clone(),
        Some(other) => other.clone().into_canonical_extjson().to_string(),
    }
}

/// Reads a lock document (as stored, or as projected with `now`) into the
/// public [`LeaseInfo`], judged at `server_time`. A document not of our layout
/// ([`is_our_layout`]) is a lock held by a foreign holder (see
/// [`LeaseInfo::foreign`]), a bare `{_id}` included.
pub(crate) fn lease_info(key: &LeaseKey, doc: &Document, server_time: SystemTime) -> LeaseInfo {
    let (true, Ok(token), Ok(expires_at)) = (
        is_our_layout(doc),
        doc.get_i64(field::TOKEN),
        doc.get_datetime(field::EXPIRES_AT),
    ) else {
        return foreign_info(key, doc, server_time);
    };
    let expires_at = expires_at.to_system_time();
    let renewed_at = doc
        .get_datetime(field::RENEWED_AT)
        .map(|d| d.to_system_time())
        .unwrap_or(expires_at);
    let acquired_at = doc
        .get_datetime(field::ACQUIRED_AT)
        .map(|d| d.to_system_time())
        .unwrap_or(renewed_at);
    let kind = stored_kind(doc);
    let holders = live_holders(doc, server_time);
    let hold_until = doc
        .get_datetime(field::HOLD_UNTIL)
        .map(|d| d.to_system_time())
        .ok()
        .filter(|until| *until > server_time);
    let lock_delay_until = doc
        .get_datetime(field::NOT_BEFORE)
        .map(|d| d.to_system_time())
        .ok()
        .filter(|until| *until > server_time);
    // A lease released before its minimum hold keeps the key until `hl`.
    let has_lease_id = matches!(doc.get(field::LEASE_ID), Some(Bson::Binary(_)));
    let held = if kind.is_multi_holder() {
        !holders.is_empty()
    } else {
        (has_lease_id || hold_until.is_some()) && expires_at > server_time
    };
    LeaseInfo {
        key: key.clone(),
        owner_id: doc.get_str(field::OWNER).unwrap_or_default().to_string(),
        fencing_token: token as u64,
        acquired_at,
        renewed_at,
        expires_at,
        server_time,
        payload: doc.get_document(field::PAYLOAD).ok().cloned(),
        held,
        foreign: false,
        kind,
        holders,
        hold_until,
        lock_delay_until,
        waiters: live_waiters(doc, server_time),
        transitions: int(doc.get(field::TRANSITIONS)).map_or(0, |n| n.max(0) as u64),
        released: !kind.is_multi_holder() && !has_lease_id,
    }
}

/// A foreign holder's lock document (as projected with the foreign fields,
/// `crate::foreign`) as a [`LeaseInfo`], as documented on
/// [`LeaseInfo::foreign`]. Its fencing token is 0 whatever `tok` it has (one
/// that took a lease document of ours over in place keeps our `tok`, which
/// fences nothing of its own).
fn foreign_info(key: &LeaseKey, doc: &Document, server_time: SystemTime) -> LeaseInfo {
    let date = |name: &str| doc.get_datetime(name).ok().map(|d| d.to_system_time());
    let taken = date(field::RENEWED_AT).unwrap_or(server_time);
    let expiry = date(crate::foreign::EXPIRY);
    LeaseInfo {
        key: key.clone(),
        owner_id: foreign_owner(doc),
        fencing_token: 0,
        acquired_at: taken,
        renewed_at: taken,
        expires_at: expiry.unwrap_or(server_time),
        server_time,
        payload: None,
        held: doc.get_bool(crate::foreign::HELD).unwrap_or(true),
        foreign: true,
        kind: crate::kind::LeaseKind::Exclusive,
        holders: Vec::new(),
        hold_until: None,
        lock_delay_until: None,
        waiters: Vec::new(),
        transitions: 0,
        released: false,
    }
}
