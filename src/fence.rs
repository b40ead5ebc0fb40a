//! Fenced writes to user data under a lease, in the same MongoDB deployment
//! as its lock: [`Lease::with_transaction`] (any writes, in a MongoDB
//! transaction that commits only while the lease is held) and [`Fence`]
//! (the filter and update fragments of one single-document write that
//! applies only under a fencing token not smaller than the stored one).

use futures::future::BoxFuture;
use mongodb::bson::{Bson, Document, doc};
use mongodb::{Client, ClientSession};

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::store::{LeaseCheck, run_fenced};

impl Lease {
    /// Runs `callback` in a MongoDB transaction that commits only if this
    /// lease is still held, by the server's clock, when the transaction
    /// commits; returns the callback's value once committed.
    ///
    /// The callback does the caller's reads and writes with the session it
    /// is given (`.session(session)` on each operation), on collections of
    /// the deployment that holds the lease's lock (`client` must be a
    /// client of that deployment). `context` is handed to it by `&mut` on
    /// every attempt, as in the driver's
    /// [`StartTransaction::and_run`](mongodb::action::StartTransaction::and_run):
    /// it may carry references (a collection, the data to write) that a
    /// boxed future could not otherwise borrow.
    ///
    /// After the callback, in the same transaction, the lease's lock is
    /// checked by a write (`ts = $$NOW`) with a filter on its lease id, its
    /// owner id and `exp > $$NOW`. A write, not a read: under snapshot
    /// isolation a read would still see the lease after another owner took
    /// it over, while two writes to one document conflict (MongoDB manual,
    /// "Production Considerations": in-progress transactions and write
    /// conflicts; docs/mongodb-behaviour.md, B16): a takeover committed
    /// before the transaction's snapshot makes the check match nothing, one
    /// committed after it makes the check fail with a write conflict (the
    /// transaction is retried, and then sees the takeover), and one that
    /// comes after the check waits until the transaction has ended. `$$NOW`
    /// is the time of the check itself. This is the design of etcd's
    /// `concurrency` package (`IsOwner()` in a transaction). The check does
    /// not renew the lease (`exp` is left alone).
    ///
    /// The transaction uses read concern `snapshot` and write concern
    /// `majority`, whatever the client's defaults. It is retried as the
    /// driver's convenient transaction API does (docs/mongodb-behaviour.md,
    /// B17), with the driver's jittered backoff, bounded by **attempts**
    /// (not time, which the callback's duration would decide): at most 10
    /// runs of the transaction and 5 commits per run, and never once the
    /// lease's token has fired (then [`Error::LeaseLost`]).
    ///
    /// Keep the callback short: the heartbeat's renewal of this lease, if
    /// it lands while the callback runs, conflicts with the check, and the
    /// transaction is run again (with the default TTL, one heartbeat every
    /// 10 s). A callback that takes longer than the heartbeat interval may
    /// run out of attempts. The callback may run several times: it must not
    /// commit or abort the transaction, and must return (not swallow) the
    /// errors of its operations, so that transient ones are retried.
    ///
    /// # Errors
    ///
    /// - [`Error::LeaseLost`] if the lease was not held at the check (taken
    ///   over, released, or expired by the server's clock) or its token had
    ///   fired by then (the holder must stop writing): the transaction was
    ///   aborted, nothing was written. The manager then checks the lease at
    ///   once, by a renewal.
    /// - [`Error::Unsupported`] on a deployment without transactions (a
    ///   standalone server), with the server's reason. Nothing was written.
    /// - [`Error::Database`] with the callback's error (the transaction was
    ///   aborted), or with MongoDB's once the attempts are used up. A commit
    ///   error with the `UnknownTransactionCommitResult` label leaves the
    ///   outcome unknown: the transaction may have committed.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before the commit is sent aborts the transaction
    /// (the driver aborts a dropped session's transaction in the
    /// background): nothing is written. Dropping it while the commit is in
    /// flight leaves the outcome unknown.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use futures::FutureExt;
    /// use mongodb::bson::{Document, doc};
    ///
    /// # async fn demo(manager: mongo_lease::LeaseManager, client: mongodb::Client) -> mongo_lease::Result<()> {
    /// let invoices = client.database("app").collection::<Document>("invoices");
    /// let lease = manager.acquire("invoice-42").await?;
    /// let paid = lease
    ///     .with_transaction(&client, &invoices, |session, invoices| {
    ///         async move {
    ///             invoices
    ///                 .update_one(doc! { "_id": 42 }, doc! { "$set": { "state": "paid" } })
    ///                 .session(&mut *session)
    ///                 .await?;
    ///             let invoice = invoices.find_one(doc! { "_id": 42 }).session(session).await?;
    ///             Ok(invoice)
    ///         }
    ///         .boxed()
    ///     })
    ///     .await?;
    /// lease.release().await?;
    /// # let _ = paid;
    /// # Ok(()) }
    /// ```
    pub async fn with_transaction<R, C, F>(
        &self,
        client: &Client,
        context: C,
        callback: F,
    ) -> Result<R>
    where
        F: for<'s> FnMut(
            &'s mut ClientSession,
            &'s mut C,
        ) -> BoxFuture<'s, mongodb::error::Result<R>>,
    {
        let check = LeaseCheck {
            place: self.lock_place(),
            key: self.key(),
            lease_id: self.lease_id(),
            owner: self.owner_id(),
        };
        let result = run_fenced(client, check, || self.status().is_lost(), context, callback).await;
        if matches!(result, Err(Error::LeaseLost { .. })) && !self.status().is_lost() {
            self.check_now();
        }
        result
    }

    /// The fence of this lease's fencing token: the filter and update
    /// fragments of a single-document write that applies only if the
    /// document has not seen a greater token (see [`Fence`]).
    pub fn fence(&self) -> Fence {
        Fence {
            token: self.fencing_token(),
        }
    }
}

/// The fencing token of a lease as the filter and update fragments of one
/// single-document write (`updateOne`, `findOneAndUpdate`), for resources
/// that store the last token they accepted in a field of their own
/// document: the write applies only if that field is absent or holds a
/// token not greater than this one, and stores this one.
///
/// **The race it closes.** A holder pauses (GC, swapping, a slow network)
/// past its lease's TTL; another owner takes the lease over with a greater
/// token and writes the document, storing its token. When the first holder
/// wakes up, its lost-lease token may not have been looked at yet and it
/// sends its write, late: its token is smaller than the stored one, so the
/// write matches nothing and changes nothing (Martin Kleppmann, "How to do
/// distributed locking", 2016). A retry of a write with the same token
/// applies again (equal tokens pass), so a claim followed by writes under
/// one lease, or a write retried after a network error, keeps working.
///
/// **What it does not do.** It protects only documents that store the
/// token, and only writes that carry the fence: a write elsewhere (another
/// collection, a file, a remote service) or a document whose token field is
/// missing because nobody wrote it yet is not protected against a stale
/// holder that writes first (an absent field lets any token in, and a
/// stale token that writes before the new holder's first write is stored).
/// It does not check that the lease is still held: use
/// [`Lease::with_transaction`] for that, and for writes to several
/// documents. Tokens are compared as numbers: a non-numeric value in the
/// field refuses every write.
///
/// Both work for leases of the lock collection and for in-document leases
/// ([`DocumentLease::lease`](crate::DocumentLease::lease)); docs/fenced-writes.md
/// compares them.
///
/// # Examples
///
/// The claim and write of a worker, each fenced:
///
/// ```no_run
/// use mongodb::bson::{Document, doc};
///
/// # async fn demo(lease: mongo_lease::Lease, jobs: mongodb::Collection<Document>) -> mongo_lease::Result<()> {
/// let fence = lease.fence();
/// let mut filter = doc! { "_id": "job-17" };
/// filter.extend(fence.filter("fence"));
/// let update = fence.update_with("fence", doc! { "$set": { "state": "done" }, "$inc": { "runs": 1 } })?;
/// let result = jobs.update_one(filter, update).await?;
/// if result.matched_count == 0 {
///     eprintln!("refused: a newer holder (token > {}) wrote first", fence.token());
/// }
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Fence {
    token: u64,
}

impl Fence {
    /// The fence of `token` (e.g. a fencing token sent to another process
    /// with the work to do); `None` if `token` does not fit in a BSON int64
    /// (tokens issued by `mongo-lease` always do).
    pub fn new(token: u64) -> Option<Fence> {
        i64::try_from(token).ok().map(|_| Fence { token })
    }

    /// The fencing token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The token as stored: a BSON int64.
    fn stored(&self) -> Bson {
        // Tokens fit in an int64: they are read from one (`Lease`), or
        // checked (`Fence::new`).
        Bson::Int64(self.token as i64)
    }

    /// The filter fragment: the document's `field` (a dotted path for an
    /// embedded field) is absent, or a number not greater than this token.
    /// One key, `field` itself, so that it can be added to the caller's
    /// filter (`filter.extend(fence.filter(field))`) unless that filter
    /// already names `field`:
    /// `{ <field>: { $not: { $exists: true, $not: { $lte: <token> } } } }`.
    ///
    /// A value of another type (a string, `null`) refuses the write. (An
    /// array passes if one of its elements is not greater than the token,
    /// MongoDB's rule for queries on arrays: keep the field a number.)
    /// Nested `$not` as used here was checked against mongod 6.0.5: it
    /// selects exactly the documents of
    /// `{$or: [{<field>: {$exists: false}}, {<field>: {$lte: <token>}}]}`.
    pub fn filter(&self, field: &str) -> Document {
        doc! { field: { "$not": { "$exists": true, "$not": { "$lte": self.stored() } } } }
    }

    /// The update fragment that stores this token: `{ $set: { <field>:
    /// <token> } }` (an int64). Also a valid stage of an update pipeline.
    /// To combine it with an update that has its own `$set`, use
    /// [`Fence::update_with`].
    pub fn update(&self, field: &str) -> Document {
        doc! { "$set": { field: self.stored() } }
    }

    /// `update` (a document of update operators) with `field` set to this
    /// token in its `$set` (added if it has none).
    ///
    /// # Errors
    ///
    /// [`Error::InvalidUpdate`] if `field` is empty or starts with `$`, if
    /// `update` has a key that is not an update operator (a replacement
    /// document), a `$set` that is not a document, or already writes
    /// `field` in any operator.
    // The size is the crate's `Error`'s, as for every function returning it.
    pub fn update_with(&self, field: &str, mut update: Document) -> Result<Document> {
        if field.is_empty() || field.starts_with('$') {
            return Err(Error::InvalidUpdate {
                reason: format!("token field {field:?} is empty or starts with '$'"),
            });
        }
        for (operator, fields) in &update {
            if !operator.starts_with('$') {
                return Err(Error::InvalidUpdate {
                    reason: format!(
                        "{operator:?} is not an update operator: a fenced write needs an update \
                         document of operators, not a replacement"
                    ),
                });
            }
            if let Bson::Document(fields) = fields {
                if fields.contains_key(field) {
                    return Err(Error::InvalidUpdate {
                        reason: format!("the update already writes the token field {field:?}"),
                    });
                }
            }
        }
        match update
            .entry("$set".to_string())
            .or_insert_with(|| Bson::Document(Document::new()))
        {
            Bson::Document(set) => {
                set.insert(field, self.stored());
            }
            other => {
                return Err(Error::InvalidUpdate {
                    reason: format!("$set must be a document, found {other}"),
                });
            }
        }
        Ok(update)
    }
}

#[cfg(test)]
mod tests;
