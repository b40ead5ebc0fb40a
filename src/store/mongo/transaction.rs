//! The transaction helper's MongoDB side: the caller's closure and a check
//! of the lease, by a write to its lock, in one MongoDB transaction on the
//! caller's client ([`Lease::with_transaction`](crate::Lease::with_transaction)).
//!
//! The check sets the lock's `ts = max($$NOW, ts + 1 ms)` (always a
//! change, so always a write), conditional on its lease id, owner id and
//! `exp > $$NOW`, sent in the transaction after the closure, just before
//! the commit. Why a write and not a read, why it leaves `exp` alone, and
//! when its `$$NOW` is judged: docs/mongodb-behaviour.md, B16.

use std::time::Duration;

use futures::future::BoxFuture;
use mongodb::bson::{Document, doc};
use mongodb::error::{ErrorKind, TRANSIENT_TRANSACTION_ERROR, UNKNOWN_TRANSACTION_COMMIT_RESULT};
use mongodb::options::{ReadConcern, WriteConcern};
use mongodb::{Client, ClientSession};
use uuid::Uuid;

use super::handle::command_code;
use super::rules::bson_lease_id;
use crate::error::{Error, Result};
use crate::key::LeaseKey;
use crate::store::{LockPlace, field};

/// How many times the whole transaction (closure, check, commit) runs at
/// most when it fails with the `TransientTransactionError` label.
const TRANSACTION_ATTEMPTS: u32 = 10;

/// How many times one commit is sent at most when it fails with the
/// `UnknownTransactionCommitResult` label (each is itself retried once by
/// the driver, as a retryable write).
const COMMIT_ATTEMPTS: u32 = 5;

/// The lease a transaction is fenced by.
pub(crate) struct LeaseCheck<'a> {
    /// Where its lock lives.
    pub place: &'a LockPlace,
    /// Its key (the lock document's, or the user document's, `_id`).
    pub key: &'a LeaseKey,
    /// Its lease id (`lid`).
    pub lease_id: Uuid,
    /// Its owner id (`aid`).
    pub owner: &'a str,
}

/// The check's filter: the lock of `check`'s key still under its lease id
/// and owner id (and in `LockId` if kept for other clients), and not
/// expired by the server's clock (in the lock
/// collection, as an exclusive lease or a holder of a shared or semaphore
/// key: [`holder_check_filter`](super::renew::holder_check_filter)).
pub(super) fn check_filter(check: &LeaseCheck<'_>) -> Document {
    let place = check.place;
    if place.field.is_none() {
        return super::renew::holder_check_filter(check.key, check.owner, check.lease_id);
    }
    let mut filter = doc! {
        field::ID: check.key,
        place.path(field::LEASE_ID): bson_lease_id(check.lease_id),
        place.path(field::OWNER): { "$eq": check.owner },
        "$expr": { "$gt": [format!("${}", place.path(field::EXPIRES_AT)), "$$NOW"] },
    };
    // Kept for other clients: their takeover rewrote it, and ended the lease.
    if let Some(lock_id) = &place.lock_id {
        filter.insert(lock_id, bson_lease_id(check.lease_id));
    }
    filter
}

/// The check's update: `ts = max($$NOW, ts + 1 ms)` (the lock's, or the
/// lock field's); nothing else changes, `exp` least of all (see the module
/// docs). Always a change: a check in the same server millisecond as the
/// lease's last write would otherwise change nothing and write nothing
/// (docs/mongodb-behaviour.md, B2), and a write that is not made detects no
/// write conflict.
pub(super) fn check_update(check: &LeaseCheck<'_>) -> Vec<Document> {
    let ts = check.place.path(field::RENEWED_AT);
    let set_ts =
        doc! { "$set": { &ts: { "$max": ["$$NOW", { "$add": [format!("${ts}"), 1_i64] }] } } };
    match check.place.field {
        // In the lock collection, `obtained_at` follows `ts` ("Read by
        // other clients" in `store`).
        None => super::rules::restated_after(vec![set_ts]),
        Some(_) => vec![set_ts],
    }
}

/// Runs `callback` and the check of `check`'s lease in one transaction on a
/// session of `client`, and commits (majority write concern, snapshot read
/// concern), retrying as the driver's convenient transaction API does
/// (`TransientTransactionError`: the whole transaction;
/// `UnknownTransactionCommitResult`: the commit), bounded by
/// [`TRANSACTION_ATTEMPTS`] and [`COMMIT_ATTEMPTS`], and never after
/// `is_lost()` says the lease's token fired.
///
/// # Errors
///
/// [`Error::LeaseLost`] if the check matched nothing or `is_lost()`; the
/// transaction was aborted. [`Error::Unsupported`] on a deployment without
/// transactions. [`Error::Database`] with the callback's error, or with
/// MongoDB's once the attempts are used up.
pub(crate) async fn run_fenced<R, C, F>(
    client: &Client,
    check: LeaseCheck<'_>,
    is_lost: impl Fn() -> bool,
    mut context: C,
    mut callback: F,
) -> Result<R>
where
    F: for<'s> FnMut(&'s mut ClientSession, &'s mut C) -> BoxFuture<'s, mongodb::error::Result<R>>,
{
    let lost = || Error::LeaseLost {
        key: check.key.clone(),
    };
    if is_lost() {
        return Err(lost());
    }
    let locks = client
        .database(&check.place.database)
        .collection::<Document>(&check.place.collection);
    let (filter, update) = (check_filter(&check), check_update(&check));
    let mut session = client.start_session().await.map_err(map_error)?;
    let mut attempt = 0;
    'transaction: loop {
        attempt += 1;
        if attempt > 1 {
            tokio::time::sleep(backoff(attempt - 1)).await;
            if is_lost() {
                return Err(lost());
            }
        }
        session
            .start_transaction()
            .read_concern(ReadConcern::snapshot())
            .write_concern(WriteConcern::majority())
            .await
            .map_err(map_error)?;
        // The callback, then the check of the lease.
        let ran = match callback(&mut session, &mut context).await {
            Ok(out) => locks
                .update_one(filter.clone(), update.clone())
                .session(&mut session)
                .await
                .map(|checked| (out, checked.matched_count == 1)),
            Err(error) => Err(error),
        };
        let out = match ran {
            // The token fired while the callback ran (the manager saw the
            // lease taken, or could not renew it in time): its holder must
            // stop writing, so nothing is committed.
            Ok((out, true)) if !is_lost() => out,
            Ok(_) => {
                abort(&mut session).await;
                return Err(lost());
            }
            Err(error) => {
                abort(&mut session).await;
                if error.contains_label(TRANSIENT_TRANSACTION_ERROR)
                    && attempt < TRANSACTION_ATTEMPTS
                {
                    tracing::debug!(%error, attempt, "transaction: transient error, retrying");
                    continue 'transaction;
                }
                return Err(map_error(error));
            }
        };
        let mut commits = 0;
        loop {
            commits += 1;
            let error = match session.commit_transaction().await {
                Ok(()) => return Ok(out),
                Err(error) => error,
            };
            // A commit that ran out of its `maxTimeMS` (MaxTimeMSExpired, 50)
            // is not retried (the driver's rule for its convenient transactions).
            if error.contains_label(UNKNOWN_TRANSACTION_COMMIT_RESULT)
                && command_code(&error) != Some(50)
                && commits < COMMIT_ATTEMPTS
            {
                tracing::debug!(%error, commits, "transaction: commit outcome unknown, retrying");
                continue;
            }
            if error.contains_label(TRANSIENT_TRANSACTION_ERROR) && attempt < TRANSACTION_ATTEMPTS {
                tracing::debug!(%error, attempt, "transaction: commit failed, retrying");
                continue 'transaction;
            }
            return Err(map_error(error));
        }
    }
}

/// Aborts the session's transaction, if one is in progress. An abort that
/// fails leaves the transaction to the server, which aborts it after
/// `transactionLifetimeLimitSeconds`; a transaction the callback already
/// ended is not ours to abort (the driver refuses).
async fn abort(session: &mut ClientSession) {
    if let Err(error) = session.abort_transaction().await {
        tracing::debug!(%error, "transaction: abort failed");
    }
}

/// The driver's backoff between attempts of a convenient transaction:
/// jittered `5 ms * 1.5^attempt`, at most 500 ms.
fn backoff(attempt: u32) -> Duration {
    let step = (5.0 * 1.5_f64.powi(attempt.min(30) as i32)).min(500.0);
    Duration::from_secs_f64(rand::random_range(0.0..=step) / 1000.0)
}

/// The driver's error as this crate's: [`Error::Unsupported`] for a
/// deployment without transactions, with the server's reason (a standalone
/// server answers the first command of a transaction with code 20,
/// IllegalOperation, "Transaction numbers are only allowed on a replica set
/// member or mongos", docs/mongodb-behaviour.md, B17; the driver rewrites that
/// message into advice about retryable writes, so the server's own is read
/// from its response; the driver itself refuses to start a transaction on a
/// deployment it already knows to lack them); [`Error::Database`] otherwise.
fn map_error(error: mongodb::error::Error) -> Error {
    let unsupported = match &*error.kind {
        ErrorKind::Transaction { message, .. } if message.contains("not supported") => {
            Some(message.clone())
        }
        ErrorKind::Command(c) if c.code == 20 => {
            let server = error
                .server_response()
                .and_then(|r| r.get_str("errmsg").ok())
                .unwrap_or(&c.message);
            server
                .starts_with("Transaction numbers")
                .then(|| format!("transactions need a replica set or a sharded cluster: {server}"))
        }
        _ => None,
    };
    match unsupported {
        Some(reason) => Error::Unsupported { reason },
        None => Error::from(error),
    }
}

#[cfg(test)]
mod tests;
