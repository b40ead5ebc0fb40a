//! The decision on a grouped light acquire, for both stores: which of its
//! requests count as acquired, from the documents its read found
//! ([`Found`]) and the local time from each request's attempt's start to
//! the read's send ([`elapsed_before_find`]); and the light acquire's
//! request and answer ([`LightAcquire`], [`LightAcquired`]).
//!
//! **The decision** ([`acquired`]). A key counts as acquired only if its
//! document holds this owner and the request's lease id, and the server's
//! remaining validity (`exp - now` at the read) is at least the TTL less
//! `e`, the local time from the attempt's start ([`LightAcquire::started`])
//! to the read's send in whole milliseconds, plus one. The read's `now` is
//! taken after the read was sent (one clock rate, as every local deadline
//! assumes) and rounded down to the millisecond, so `now > read send - 1
//! ms`, and `exp >= now + TTL - e > start + TTL - 2 ms`: the expiry is at
//! least the attempt's start + the TTL, less 2 ms of rounding (far below
//! any safety margin), which is what the actor counts on (the holder's
//! local deadline counts from the attempt's start), whichever write under
//! that lease id set it (this one, or an earlier attempt whose outcome was
//! unknown, B7). Counting from the start, not from the write's send, gives
//! the requests that queued behind the group in flight its round trip as
//! slack: a read that the server runs a few milliseconds later than the
//! write, relative to their sends (both queue behind other commands on a
//! busy server), does not turn a fresh lease into a contended key. The
//! read's reply leg is not counted: measured at the reply, it would lower
//! the bound by that leg.
//!
//! A lease of this owner and lease id found with less left than that
//! bound, but at least half the TTL, is acquired too
//! ([`LightAcquired::AcquiredShort`]): its holder counts its local
//! deadline from an instant earlier than the attempt's start by the
//! shortfall `d = TTL - e - left` (ms), for which `e` is `e + d` and the
//! bound holds with equality, so the expiry is at least that instant + the
//! TTL, less 2 ms, by the same argument. A read that the server runs
//! later than the write by more than the local time up to its send (it
//! queued behind other commands) then shortens those leases by the
//! difference, instead of sending every request of the group to the
//! general acquire at once (one more command each, and a pipeline of
//! hundreds of kilobytes in memory while it is in flight).
//! Any other key, a key not found, and every key after an error of the
//! write or of the read, is left to the general acquire
//! ([`LightAcquired::NotApplied`]), which decides (and recognises a landed
//! earlier attempt as a retry).

use std::time::Duration;

use tokio::time::Instant;
use uuid::Uuid;

use crate::error::Error;
use crate::key::LeaseKey;

/// A key's document as the read after a grouped light acquire found it:
/// what the decision needs of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Found<'a> {
    /// `aid`, if it has one.
    pub owner: Option<&'a str>,
    /// `lid`, if it has one.
    pub lease_id: Option<Uuid>,
    /// `tok`.
    pub token: u64,
    /// `exp - now` at the read, by the server's clock, in milliseconds
    /// (negative once expired).
    pub left_ms: i64,
}

/// The `e` of the bound (see the module docs): the local time from an
/// attempt started at `started` to a read sent at `find_sent`, in whole
/// milliseconds, plus one.
pub(crate) fn elapsed_before_find(started: Instant, find_sent: Instant) -> i64 {
    find_sent.saturating_duration_since(started).as_millis() as i64 + 1
}

/// `ttl` in whole milliseconds, as the light acquire writes it.
fn ttl_ms(ttl: Duration) -> i64 {
    ttl.as_millis().min(i64::MAX as u128) as i64
}

/// The answer to `request` of `owner` whose key's document read `found`
/// (`None`: not found, or not readable as a lock document) by a read sent
/// at `find_sent`: acquired with its token if it holds the request's lease
/// for at least the TTL less [`elapsed_before_find`] (from the attempt's
/// start) more; acquired counting from an instant earlier than the start
/// by the shortfall if it holds it for less, but at least half the TTL;
/// else left to the general acquire.
pub(crate) fn acquired(
    found: Option<Found<'_>>,
    request: &LightAcquire,
    owner: &str,
    find_sent: Instant,
) -> LightAcquired {
    let Some(found) = found else {
        return LightAcquired::NotApplied;
    };
    let elapsed_ms = elapsed_before_find(request.started, find_sent);
    let ours = found.lease_id == Some(request.lease_id) && found.owner == Some(owner);
    let (ttl, left) = (ttl_ms(request.ttl), found.left_ms);
    if !ours || left < ttl / 2 {
        return LightAcquired::NotApplied;
    }
    let shortfall = ttl - elapsed_ms - left;
    if shortfall <= 0 {
        return LightAcquired::Acquired(found.token);
    }
    match request
        .started
        .checked_sub(Duration::from_millis(shortfall as u64))
    {
        Some(counts_from) => LightAcquired::AcquiredShort {
            token: found.token,
            counts_from,
        },
        None => LightAcquired::NotApplied,
    }
}

#[cfg(test)]
mod tests;

/// A light acquire asked for: a new exclusive lease without a minimum hold
/// of `key` by this owner under `lease_id`, expiring `ttl` after the
/// server's now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct LightAcquire {
    pub key: LeaseKey,
    pub lease_id: Uuid,
    pub ttl: Duration,
    /// When the attempt started (`Sent::sent_at`), before any write of it
    /// was sent: the holder counts its local deadline from it, and a
    /// grouped acquire's decision counts from it too
    /// (this module).
    pub started: Instant,
}

/// What a light acquire did.
#[derive(Debug, Default)]
pub(crate) enum LightAcquired {
    /// This owner holds the key under the request's lease id, with this
    /// fencing token, for at least the TTL from the request's send.
    Acquired(u64),
    /// This owner holds the key under the request's lease id, with this
    /// fencing token, found by a grouped acquire's read with less time
    /// left than the TTL from the request's start: the holder counts its
    /// local deadline from `counts_from`, earlier than that start by the
    /// shortfall, for which the lease lasts its TTL
    /// (this module).
    AcquiredShort { token: u64, counts_from: Instant },
    /// Not applied, or not known to have (a grouped command that failed,
    /// a transient error): the general form decides, under the same lease
    /// id (it recognises a landed attempt as a retry).
    #[default]
    NotApplied,
    /// The light form's own command failed (a batch of one) with an error
    /// the general form would meet too.
    Failed(Error),
}
