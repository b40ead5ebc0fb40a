//! The twin's lock document ([`Doc`]) and a foreign holder's lock
//! document ([`Foreign`]).

use std::time::Duration;

use mongodb::bson::Document;
use tokio::time::Instant;
use uuid::Uuid;

/// One lock document.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Doc {
    /// `aid`: owner id of the holder (or last holder).
    pub owner: String,
    /// `lid`: lease id of the current acquisition; `None` once released.
    pub lease_id: Option<Uuid>,
    /// `tok`: fencing token of the current (or last) acquisition.
    pub token: u64,
    /// `exp`: server time at which the lease expires.
    pub exp: Instant,
    /// `acq`: server time of the acquisition.
    pub acquired: Instant,
    /// `ts`: server time of the last acquire or renewal.
    pub renewed: Instant,
    /// `data`: the holder's payload.
    pub payload: Option<Document>,
    /// `wt`: when another owner first waited for the current lease.
    pub waiting_since: Option<Instant>,
    /// `yu`: until when the last holder yielded the key to waiting owners.
    pub yield_until: Option<Instant>,
}

impl Doc {
    /// A document held by `owner` from now for `ttl`, with token `token`.
    pub fn held(owner: &str, token: u64, ttl: Duration) -> Doc {
        let now = Instant::now();
        Doc::fresh(owner, Some(Uuid::new_v4()), token, now, now + ttl)
    }

    /// A released document with token `token` (what an upsert starts from).
    pub(super) fn vacant(now: Instant, token: u64) -> Doc {
        Doc::fresh("", None, token, now, now)
    }

    /// A new acquisition by `owner` under `lease_id` at `now`: token + 1,
    /// `exp = now + ttl`, no payload and no fairness marks. Returns the token.
    pub(super) fn take(&mut self, owner: &str, lease_id: Uuid, ttl: Duration, now: Instant) -> u64 {
        *self = Doc::fresh(owner, Some(lease_id), self.token + 1, now, now + ttl);
        self.token
    }

    /// A document acquired (or released) at `now`, with no payload and no
    /// fairness marks.
    pub(super) fn fresh(
        owner: &str,
        lease_id: Option<Uuid>,
        token: u64,
        now: Instant,
        exp: Instant,
    ) -> Doc {
        Doc {
            owner: owner.to_string(),
            lease_id,
            token,
            exp,
            acquired: now,
            renewed: now,
            payload: None,
            waiting_since: None,
            yield_until: None,
        }
    }

    /// The lease as observers see it: without the fairness fields.
    pub(super) fn observed(&self) -> Doc {
        Doc {
            waiting_since: None,
            yield_until: None,
            ..self.clone()
        }
    }
}

impl Doc {
    /// Free by the protocol's rule: `exp <= now`.
    pub fn is_free_at(&self, now: Instant) -> bool {
        self.exp <= now
    }

    /// Yielded by `owner` to waiting owners: `owner` cannot take it back yet.
    pub fn yielded_by(&self, owner: &str, now: Instant) -> bool {
        self.owner == owner && self.yield_until.is_some_and(|until| until > now)
    }
}

/// A foreign holder's lock document (another application's `{_id, ts, aid}`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Foreign {
    /// `aid`: the other application's owner id.
    pub owner: String,
    /// `ts`: when it was written.
    pub written: Instant,
}
