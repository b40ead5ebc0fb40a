//! The twin's lock-delay ("Lock-delay" in `store`): what `MongoStore`'s
//! force release and release by owner id write before their release, so
//! that the release keeps the key until `nb`.

use std::time::Duration;

use tokio::time::Instant;

use super::doc::Doc;
use super::rules::Collection;
use crate::store::OverrideEnd;

/// `nb` on `doc`, whose live lease an involuntary end is about to
/// release: `now + delay` (or later, if already), and with
/// [`OverrideEnd::AtExpiry`] at least its `exp` (`exp` is at least every
/// live holder's and the minimum hold's); nothing for a zero `delay` with
/// [`OverrideEnd::Immediately`].
pub(super) fn delay(doc: &mut Doc, delay: Duration, end: OverrideEnd, now: Instant) {
    let until = match end {
        OverrideEnd::AtExpiry => doc.exp.max(now + delay),
        OverrideEnd::Immediately if delay.is_zero() => return,
        OverrideEnd::Immediately => now + delay,
    };
    doc.not_before = Some(doc.not_before.map_or(until, |nb| nb.max(until)));
}

impl Collection {
    /// The lock-delay of a release by owner id of `owner`'s leases
    /// (`MongoStore`'s `delay_stage`): on each document its filter matches
    /// whose live exclusive lease is `owner`'s, or all of whose live
    /// holders (at least one) are `owner`'s.
    pub(super) fn delay_owner_ends(
        &mut self,
        owner: &str,
        delay: Duration,
        end: OverrideEnd,
        now: Instant,
    ) {
        for doc in self.docs.values_mut() {
            let ends = if doc.holders.is_empty() {
                doc.owner == owner && doc.lease_id.is_some() && doc.exp > now
            } else {
                // `MongoStore`'s filter: at expiry, only a document where
                // `owner` still holds a place with a lease id.
                // It ends a live lease of `owner` (not a place an earlier
                // release by owner id ended and kept), and every live entry
                // is `owner`'s or such a kept one: ending a key's owners one
                // at a time delays it too.
                let placed = (doc.holders.iter()).any(|h| h.owner == owner && h.lease_id.is_some());
                (placed || end == OverrideEnd::Immediately)
                    && doc
                        .live_holders(now)
                        .any(|h| h.owner == owner && h.lease_id.is_some())
                    && doc
                        .live_holders(now)
                        .all(|h| h.owner == owner || h.ended.is_some())
            };
            if ends {
                self::delay(doc, delay, end, now);
            }
        }
    }
}
