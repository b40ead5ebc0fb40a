//! Fenced writes to user data under a lease: [`Lease::with_transaction`]
//! and [`Fence`] (docs/fenced-writes.md compares them).

use futures::future::BoxFuture;
use mongodb::bson::{Bson, Document, doc};
use mongodb::{Client, ClientSession};

use crate::error::{Error, Result};
use crate::lease::Lease;
use crate::store::{LeaseCheck, run_fenced};

impl Lease {
    /// Runs `callback` in a MongoDB transaction that commits only if this
    /// lease is still held, by the server's clock, when the transaction
    /// commits (read concern `snapshot`, write concern `majority`); returns
    /// the callback's value once committed (docs/fenced-writes.md says how).
    ///
    /// The callback does its reads and writes with the session it is given
    /// (`.session(session)` on each operation), on collections of the
    /// deployment that holds the lease's lock (`client` is a client of it).
    /// `context` is handed to it by `&mut` on every attempt, as in the
    /// driver's [`StartTransaction::and_run`](mongodb::action::StartTransaction::and_run).
    /// The callback may run several times: it must not commit or abort the
    /// transaction, and must return the errors of its operations. Keep it
    /// shorter than the heartbeat interval: a renewal landing meanwhile
    /// makes the transaction run again, at most 10 times.
    ///
    /// # Errors
    ///
    /// - [`Error::LeaseLost`] if the lease was not held at the check or its
    ///   token had fired by then: nothing was written.
    /// - [`Error::Unsupported`] on a deployment without transactions (a
    ///   standalone server). Nothing was written.
    /// - [`Error::Database`] with the callback's error (the transaction was
    ///   aborted), or with MongoDB's once the attempts are used up. A commit
    ///   error with the `UnknownTransactionCommitResult` label leaves the
    ///   outcome unknown.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future before the commit is sent aborts the transaction;
    /// while the commit is in flight, the outcome is unknown.
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
/// single-document write (`updateOne`, `findOneAndUpdate`) to a document
/// that stores the last token it accepted: the write applies only if that
/// field is absent or not greater than this token, and stores this one.
///
/// A holder paused past its lease's TTL writes late, with a token smaller
/// than its successor's, and changes nothing; a retry with the same token
/// applies again. Only documents that store the token, and writes that
/// carry the fence, are protected, and the lease is not checked: see
/// docs/fenced-writes.md, which compares it with [`Lease::with_transaction`].
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
        // Fits: read from an int64 (`Lease`), or checked (`Fence::new`).
        Bson::Int64(self.token as i64)
    }

    /// The filter fragment: the document's `field` (a dotted path for an
    /// embedded field) is absent, or a number not greater than this token
    /// (another type refuses the write). One key, `field` itself, to add to
    /// the caller's filter (`filter.extend(fence.filter(field))`):
    /// `{ <field>: { $not: { $exists: true, $not: { $lte: <token> } } } }`.
    pub fn filter(&self, field: &str) -> Document {
        doc! { field: { "$not": { "$exists": true, "$not": { "$lte": self.stored() } } } }
    }

    /// The update fragment that stores this token: `{ $set: { <field>:
    /// <token> } }` (an int64), also a valid pipeline stage; see
    /// [`Fence::update_with`] for an update with its own `$set`.
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
            if let Bson::Document(fields) = fields
                && fields.contains_key(field)
            {
                return Err(Error::InvalidUpdate {
                    reason: format!("the update already writes the token field {field:?}"),
                });
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
