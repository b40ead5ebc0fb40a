//! The crate's error type.

use std::time::Duration;

use crate::key::LeaseKey;

/// Everything that can go wrong in `mongo-lease`.
///
/// A key held by another owner is **not** an error: a try returns
/// `Ok(None)` for it. The enum is `#[non_exhaustive]`: match the predicates
/// ([`Error::is_invalid_input`], ...) rather than every variant.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A lease key [`LeaseKey`] refuses, or a key's Extended JSON that could
    /// not be parsed.
    #[error("invalid lease key: {reason}")]
    InvalidKey {
        /// Why the key was refused.
        reason: String,
    },

    /// The manager's options are inconsistent (for example a heartbeat interval
    /// that is not shorter than the TTL).
    #[error("invalid configuration: {reason}")]
    InvalidConfig {
        /// Which option is wrong and why.
        reason: String,
    },

    /// Not returned by this version: a document not written by `mongo-lease`
    /// is a lock held by a foreign holder
    /// ([`LeaseInfo::foreign`](crate::LeaseInfo::foreign)).
    #[error(
        "the lock collection holds a document of foreign layout under key {}; \
         it was left untouched (remove it or use another collection)",
        .key.to_extended_json()
    )]
    ForeignDocument {
        /// The key whose document has a foreign layout.
        key: LeaseKey,
    },

    /// The lock collection cannot be used as is (capped, an index on `exp`
    /// that is not a TTL index, a TTL index that could delete a held lease,
    /// ...). Nothing was changed.
    #[error("the lock collection cannot be used: {reason}")]
    UnusableCollection {
        /// What is wrong with the collection.
        reason: String,
    },

    /// No MongoDB server answered within the given time; `reason` has the
    /// cause if the driver's `serverSelectionTimeoutMS` ran out first. Match
    /// it with `Error::Unreachable { waited, reason, .. }`.
    #[error("MongoDB did not answer within {waited:?}: {reason}")]
    #[non_exhaustive]
    Unreachable {
        /// How long the manager waited.
        waited: Duration,
        /// The cause, or what was being waited for when none is known.
        reason: String,
        /// The driver's error, when one was seen (for example its
        /// server-selection error); also the error's `source()`.
        source: Option<mongodb::error::Error>,
    },

    /// A MongoDB operation failed; the driver's error is the error's
    /// `source()`. (A refusal met by a call of the manager or a lease is
    /// [`Error::Refused`] instead.)
    #[error("MongoDB operation failed: {}", short_kind(.0))]
    Database(#[from] mongodb::error::Error),

    /// The server refused an operation on the lock collection or a
    /// collection of in-document leases (a missing privilege, a document it
    /// cannot store, ...): retrying fails the same way until the cause is
    /// fixed. `Display` names the operation, the collection, the cause and
    /// what to do; the server's whole answer is the `source`.
    ///
    /// ```
    /// use mongo_lease::{Error, Operation};
    ///
    /// fn advice(error: &Error) -> &'static str {
    ///     match error {
    ///         Error::Refused { operation: Operation::Acquire, .. } => "check the user's roles",
    ///         _ => "see the error",
    ///     }
    /// }
    /// # let _ = advice;
    /// ```
    #[error(
        "{operation} on {namespace} refused by the server: {}",
        refusal_reason(.source, .namespace)
    )]
    #[non_exhaustive]
    Refused {
        /// What was refused.
        operation: Operation,
        /// The collection, as `database.collection`: the lock collection, or
        /// the collection of in-document leases.
        namespace: String,
        /// The driver's error: the server's code, code name and whole
        /// message.
        source: mongodb::error::Error,
    },

    /// A payload is too large or cannot be encoded as BSON (see
    /// [`MAX_PAYLOAD_LEN`](crate::MAX_PAYLOAD_LEN)). Nothing was sent.
    #[error("invalid payload: {reason}")]
    InvalidPayload {
        /// Why the payload was refused.
        reason: String,
    },

    /// The operation needed a lease that is no longer held (it was lost,
    /// released, or taken over). Its cancellation token has fired.
    #[error("the lease on {} is no longer held", .key.to_extended_json())]
    LeaseLost {
        /// The key of the lost lease.
        key: LeaseKey,
    },

    /// An in-document lease was asked for a document that does not exist,
    /// without fields to create it with
    /// ([`AcquireDocument::create`](crate::AcquireDocument::create)).
    /// Nothing was written.
    #[error(
        "no document has _id {} in the collection of in-document leases",
        .id.to_extended_json()
    )]
    DocumentNotFound {
        /// The `_id` asked for.
        id: LeaseKey,
    },

    /// An update given to an in-document lease
    /// ([`DocumentUpdate`](crate::DocumentUpdate)) or a document to create
    /// that the rules refuse: nothing was sent. Also a document to create
    /// that a unique index of the user's collection refuses.
    #[error("invalid update: {reason}")]
    InvalidUpdate {
        /// Why the update was refused.
        reason: String,
    },

    /// The deployment cannot do what was asked: e.g. a transaction
    /// ([`Lease::with_transaction`](crate::Lease::with_transaction)) on a
    /// standalone server, which has no transactions. Nothing was written.
    #[error("not supported by this deployment: {reason}")]
    Unsupported {
        /// What is missing, as the server reported it.
        reason: String,
    },

    /// The key is held as another kind than the acquisition asked for
    /// ([`LeaseKind`](crate::LeaseKind) has the rules). Nothing was written.
    #[error("the key is held as {stored}, not as {requested}")]
    KindMismatch {
        /// How it is held now.
        stored: crate::kind::LeaseKind,
        /// What the acquisition asked for.
        requested: crate::kind::LeaseKind,
    },

    /// The acquisition's caller ([`CallerId`](crate::CallerId)) already
    /// holds the key, and the acquisition did not ask to re-enter it with
    /// the same kind. Nothing was sent.
    #[error(
        "the key {} is already held by this caller; acquiring it again would wait on itself \
         (Acquire::reentrant re-enters a lease of the same kind)",
        .key.to_extended_json()
    )]
    AlreadyHeld {
        /// The key.
        key: LeaseKey,
    },

    /// The manager has shut down (by
    /// [`LeaseManager::shutdown`](crate::LeaseManager::shutdown) or because
    /// its task stopped); no further commands are accepted.
    #[error("the lease manager has shut down")]
    Shutdown,
}

impl Error {
    /// `true` for errors caused by the caller's input or options: nothing was
    /// sent to MongoDB and retrying the same call will fail the same way.
    pub fn is_invalid_input(&self) -> bool {
        matches!(
            self,
            Error::InvalidKey { .. }
                | Error::InvalidConfig { .. }
                | Error::InvalidPayload { .. }
                | Error::InvalidUpdate { .. }
        )
    }

    /// `true` if the lease the operation needed is no longer held.
    pub fn is_lease_lost(&self) -> bool {
        matches!(self, Error::LeaseLost { .. })
    }

    /// `true` if the manager has shut down.
    pub fn is_shutdown(&self) -> bool {
        matches!(self, Error::Shutdown)
    }

    /// `true` for [`Error::ForeignDocument`], which this version never
    /// returns.
    pub fn is_foreign_document(&self) -> bool {
        matches!(self, Error::ForeignDocument { .. })
    }

    /// `true` if the server could not be reached in time, or a database
    /// operation timed out or failed on the network. Such errors are usually
    /// transient: retrying later may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            Error::Unreachable { .. } => true,
            Error::Database(e) => is_transient_db_error(e),
            _ => false,
        }
    }
}

/// Network errors, server selection failures, write-concern failures and
/// "not primary" style errors: the outcome of a write that failed this way is
/// unknown, so the store re-reads before deciding (docs/mongodb-behaviour.md, B7, B8).
pub(crate) fn is_transient_db_error(e: &mongodb::error::Error) -> bool {
    use mongodb::error::ErrorKind;
    if e.contains_label(mongodb::error::RETRYABLE_WRITE_ERROR) {
        return true;
    }
    match &*e.kind {
        ErrorKind::ServerSelection { .. }
        | ErrorKind::ConnectionPoolCleared { .. }
        | ErrorKind::Io(_) => true,
        ErrorKind::Write(mongodb::error::WriteFailure::WriteConcernError(_)) => true,
        ErrorKind::Command(c) => is_transient_code(c.code),
        // A stepdown mid-command, without a label (docs/mongodb-behaviour.md, B7).
        ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => is_transient_code(w.code),
        _ => false,
    }
}

/// A server error code of a change of primary, a shutdown or an unreachable
/// member: NotWritablePrimary, InterruptedDueToReplStateChange,
/// PrimarySteppedDown, NotPrimaryNoSecondaryOk, NotPrimaryOrSecondary,
/// ShutdownInProgress, InterruptedAtShutdown, HostUnreachable,
/// HostNotFound, NetworkTimeout, SocketException, ExceededTimeLimit,
/// WriteConcernFailed: the retryable-writes specification's retryable
/// codes, and the last.
fn is_transient_code(code: i32) -> bool {
    matches!(
        code,
        10107 | 11602 | 189 | 13435 | 13436 | 91 | 11600 | 6 | 7 | 89 | 9001 | 262 | 64
    )
}

/// [`Error::Unreachable`] for a transient driver error
/// ([`is_transient_db_error`]), with the driver's error as the source.
pub(crate) fn unreachable_from(waited: Duration, error: mongodb::error::Error) -> Error {
    let reason = match &*error.kind {
        mongodb::error::ErrorKind::ServerSelection { message, .. } => {
            // docs/mongodb-behaviour.md, B13.
            let hint = if message.contains("Set Name:") && !message.contains("Servers:") {
                " (no host is left in the topology: the driver drops a host that is a \
                 standalone server or a member of a replica set of another name than the \
                 URI's replicaSet)"
            } else {
                ""
            };
            format!("no server could be selected: {message}{hint}")
        }
        kind => kind.to_string(),
    };
    Error::Unreachable {
        waited,
        reason,
        source: Some(error),
    }
}

/// Longest server message kept in an error's `Display`; the whole message
/// stays in its `source()`.
const MESSAGE_SHOWN: usize = 200;

/// The server's message without the command it echoes, at most
/// [`MESSAGE_SHOWN`] bytes.
fn short_message(message: &str) -> String {
    let cut = message
        .find(" to execute command")
        .or_else(|| message.find("command {"))
        .unwrap_or(message.len());
    let mut short = message[..cut].trim_end().to_string();
    if short.len() > MESSAGE_SHOWN {
        let mut end = MESSAGE_SHOWN;
        while !short.is_char_boundary(end) {
            end -= 1;
        }
        short.truncate(end);
        short.push('…');
    }
    short
}

/// The code, code name and short message of a server's refusal (a command
/// or write error), if `error` is one.
fn server_refusal(error: &mongodb::error::Error) -> Option<(i32, &str, String)> {
    use mongodb::error::{ErrorKind, WriteFailure};
    match &*error.kind {
        ErrorKind::Command(c) => Some((c.code, c.code_name.as_str(), short_message(&c.message))),
        ErrorKind::Write(WriteFailure::WriteError(w)) => Some((
            w.code,
            w.code_name.as_deref().unwrap_or(""),
            short_message(&w.message),
        )),
        _ => None,
    }
}

/// [`Error::Database`]'s `Display`: a server's refusal as its short message,
/// code name and code; any other driver error as the driver says it.
fn short_kind(error: &mongodb::error::Error) -> String {
    match server_refusal(error) {
        Some((code, name, message)) => format!("{message} ({name}, code {code})"),
        None => error.kind.to_string(),
    }
}

/// The server's code for a command the user may not run (Unauthorized).
const UNAUTHORIZED: i32 = 13;

impl Error {
    /// This error as met by `operation` on the collection `namespace`
    /// (`database.collection`): a server's refusal that retrying will not
    /// cure becomes [`Error::Refused`]; any other error is returned as is.
    pub(crate) fn refused_in(self, operation: Operation, namespace: &str) -> Error {
        let Error::Database(error) = self else {
            return self;
        };
        if is_transient_db_error(&error) || server_refusal(&error).is_none() {
            return Error::Database(error);
        }
        Error::Refused {
            operation,
            namespace: namespace.to_string(),
            source: error,
        }
    }
}

/// [`Error::Refused`]'s cause and what to do about it, from the driver's
/// `error` met on the lock collection `namespace`.
fn refusal_reason(error: &mongodb::error::Error, namespace: &str) -> String {
    let Some((code, name, message)) = server_refusal(error) else {
        return error.kind.to_string();
    };
    let database = namespace.split('.').next().unwrap_or(namespace);
    let remedy = if message.contains("requires authentication") {
        format!(
            "connect as a user (credentials in the URI) with the readWrite role on \
             database {database}"
        )
    } else if code == UNAUTHORIZED {
        return format!(
            "not authorized ({name}, code {code}); grant the readWrite role on database \
             {database} (enough for every operation, change streams included)"
        );
    } else {
        "the error's source() has the server's whole answer".to_string()
    };
    format!("{message} ({name}, code {code}); {remedy}")
}

/// The call that the server refused ([`Error::Refused`]): a
/// [`LeaseManager`](crate::LeaseManager) call, or a lease's own write;
/// `Display` gives its name (`acquire`, ...).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Operation {
    /// `connect`: reading and preparing the lock collection.
    Connect,
    /// An acquisition (`acquire`, `try_acquire`, ... and their `_with` forms).
    Acquire,
    /// `inspect`.
    Inspect,
    /// `list`, or a page of it.
    List,
    /// `force_release`.
    ForceRelease,
    /// `release_owner`.
    ReleaseOwner,
    /// `request_release` (a revocation).
    RequestRelease,
    /// A lease's release (`Lease::release`, `DocumentLease::release`).
    Release,
    /// `set_payload` of a lease.
    SetPayload,
    /// `set_ttl` of a lease.
    SetTtl,
    /// A write under an in-document lease (`DocumentLease::update`,
    /// `DocumentLease::commit`).
    Write,
}

impl std::fmt::Display for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Operation::Connect => "connect",
            Operation::Acquire => "acquire",
            Operation::Inspect => "inspect",
            Operation::List => "list",
            Operation::ForceRelease => "force_release",
            Operation::ReleaseOwner => "release_owner",
            Operation::RequestRelease => "request_release",
            Operation::Release => "release",
            Operation::SetPayload => "set_payload",
            Operation::SetTtl => "set_ttl",
            Operation::Write => "write under the lease",
        })
    }
}

/// `Result` with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<crate::key::InvalidKey> for Error {
    fn from(refused: crate::key::InvalidKey) -> Self {
        Error::InvalidKey {
            reason: refused.reason,
        }
    }
}

impl From<crate::kind::InvalidKind> for Error {
    fn from(refused: crate::kind::InvalidKind) -> Self {
        Error::InvalidConfig { reason: refused.0 }
    }
}

#[cfg(test)]
mod tests {
    use mongodb::bson::doc;
    use mongodb::error::{CommandError, ErrorKind, WriteError, WriteFailure};

    use super::is_transient_db_error;

    /// A driver error with the server's `code`, as a command error or as a
    /// write error of the reply.
    fn errors(code: i32) -> [mongodb::error::Error; 2] {
        let reply =
            doc! { "code": code, "codeName": "", "errmsg": "Not primary while writing to d.c" };
        let command: CommandError = mongodb::bson::from_document(reply.clone()).unwrap();
        let write: WriteError = mongodb::bson::from_document(reply).unwrap();
        [
            ErrorKind::Command(command).into(),
            ErrorKind::Write(WriteFailure::WriteError(write)).into(),
        ]
    }

    #[test]
    fn a_change_of_primary_is_transient_as_a_command_error_or_a_write_error() {
        for code in [10107, 189, 11602, 91] {
            for error in errors(code) {
                assert!(is_transient_db_error(&error), "{error:?}");
            }
        }
        // A duplicate key, a bad value: the server refused; retrying will not cure it.
        for code in [11000, 2] {
            for error in errors(code) {
                assert!(!is_transient_db_error(&error), "{error:?}");
            }
        }
    }
}
