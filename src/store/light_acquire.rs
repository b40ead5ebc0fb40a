//! The decision on a grouped light acquire, for both stores: which of its
//! requests count as acquired, from the documents its read found
//! ([`Found`]) and the local time from its write's send to its read's send
//! ([`elapsed_before_find`]). The requests and answers are in
//! [`light_release`](super::light_release) ([`LightAcquire`],
//! [`LightAcquired`]).
//!
//! A grouped light acquire is one write of every request (the light
//! acquire's update, one upsert per key, not ordered), then one read of
//! their documents: the write tells nothing per key, so the read decides.
//! [`MongoStore`](super::MongoStore) reads the counts and documents the
//! server returns (`mongo::light::batched`: an `update`, then a `find`
//! projecting `$$NOW`), the in-memory twin its own documents
//! (`memory::light`), and both decide here, so that the simulation judges
//! the decision the real store makes.
//!
//! **The decision** ([`acquired`]). A key counts as acquired only if its
//! document holds this owner and the request's lease id, and the server's
//! remaining validity (`exp - now` at the read) is at least the TTL less
//! `e`, the local time from the write's send to the read's send in whole
//! milliseconds, plus one. The read's `now` is taken after the read was
//! sent (one clock rate, as every local deadline assumes) and rounded down
//! to the millisecond, so `now > read send - 1 ms`, and `exp >= now + TTL -
//! e > write send + TTL - 2 ms`: the expiry is at least the write's send +
//! the TTL, less 2 ms of rounding (far below any safety margin), which the
//! actor counts on (it counts from its attempt's send, earlier still),
//! whichever write under that lease id set it (this one, or an earlier
//! attempt whose outcome was unknown, B7). The read's reply leg is not
//! counted: measured at the reply, it would lower the bound by that leg.
//! Any other key, a key not found, and every key after an error of the
//! write or of the read, is left to the general acquire
//! ([`LightAcquired::NotApplied`]), which decides (and recognises a landed
//! earlier attempt as a retry).

use std::time::{Duration, Instant};

use uuid::Uuid;

use super::light_release::{LightAcquire, LightAcquired};

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

/// The `e` of the bound (see the module docs): the local time from a write
/// sent at `sent` to a read sent at `find_sent`, in whole milliseconds,
/// plus one.
pub(crate) fn elapsed_before_find(sent: Instant, find_sent: Instant) -> i64 {
    find_sent.saturating_duration_since(sent).as_millis() as i64 + 1
}

/// `ttl` in whole milliseconds, as the light acquire writes it.
fn ttl_ms(ttl: Duration) -> i64 {
    ttl.as_millis().min(i64::MAX as u128) as i64
}

/// The answer to `request` of `owner` whose key's document read `found`
/// (`None`: not found, or not readable as a lock document) `elapsed_ms`
/// ([`elapsed_before_find`]) after the write was sent: acquired with its
/// token if it holds the request's lease for at least the TTL less
/// `elapsed_ms` more, else left to the general acquire.
pub(crate) fn acquired(
    found: Option<Found<'_>>,
    request: &LightAcquire,
    owner: &str,
    elapsed_ms: i64,
) -> LightAcquired {
    let Some(found) = found else {
        return LightAcquired::NotApplied;
    };
    let ours = found.lease_id == Some(request.lease_id) && found.owner == Some(owner);
    if ours && found.left_ms >= ttl_ms(request.ttl) - elapsed_ms {
        LightAcquired::Acquired(found.token)
    } else {
        LightAcquired::NotApplied
    }
}

#[cfg(test)]
mod tests;
