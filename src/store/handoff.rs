//! The handoff to a local waiter, as the [`Store`] trait reports it (the
//! rule is "Handoff to a local waiter" in the `store` module docs).

use futures::future::BoxFuture;
use uuid::Uuid;

use super::{LeaseRef, Release, Store};
use crate::error::Result;
use crate::key::LeaseKey;

/// What a handoff to a local waiter did ([`Store::hand_over`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandOver {
    /// The waiter's lease (`to`) holds the key, with this fencing token.
    Acquired { token: u64 },
    /// Released as a release would: another owner waits (the key is
    /// yielded to it), a minimum hold is live, or the shape cannot be
    /// handed over.
    Released,
    /// The lease `from` was no longer held (taken over, or expired by the
    /// server's clock): nothing was written.
    Lost,
}

/// [`Store::hand_over`] that only releases `from` ([`Release::Leases`]; the
/// actor hands over exclusive leases only): `Released`, or `Lost` if
/// nothing was released.
pub(crate) fn release_instead<S: Store + ?Sized>(
    store: &S,
    key: LeaseKey,
    from: Uuid,
) -> BoxFuture<'static, Result<HandOver>> {
    let release = store.release(Release::Leases(vec![LeaseRef {
        key,
        lease_id: from,
        kind: crate::kind::LeaseKind::Exclusive,
    }]));
    Box::pin(async move {
        Ok(match release.await?.count {
            0 => HandOver::Lost,
            _ => HandOver::Released,
        })
    })
}
