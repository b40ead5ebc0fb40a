//! The library's and the driver's errors as one sentence in the tool's own
//! terms: the flag, the value, the limit, what to do. Never the driver's
//! debug output (its labels, its topology description).

use std::sync::OnceLock;
use std::time::Duration;

use mongo_lease::Error;
use mongodb::error::ErrorKind;

/// How long the driver waits to select a server (0.8 × --connect-timeout),
/// set once by `connect_with`: what an unreachable server's message says it
/// waited.
pub static SELECTION_TIMEOUT: OnceLock<(Duration, Duration)> = OnceLock::new();

/// `e` as one sentence, for a user of the command line.
pub fn error(e: &Error) -> String {
    match e {
        Error::Unreachable {
            source,
            reason,
            waited,
            ..
        } => unreachable(source.as_ref(), reason, *waited),
        Error::Database(e) => format!("MongoDB operation failed: {}", driver(e)),
        Error::InvalidConfig { .. } => config(&e.to_string()),
        Error::UnusableCollection { .. } => scrub(&e.to_string().replace(
            "a document the foreign_lock rule describes",
            "a document a --foreign-lock rule describes",
        )),
        _ => scrub(&e.to_string()),
    }
}

/// An unreachable deployment: where, why, how long, what to do.
/// The time quoted is the driver's server selection's when it gave up (it
/// waits 0.8 × --connect-timeout), else the operation's.
fn unreachable(source: Option<&mongodb::error::Error>, reason: &str, waited: Duration) -> String {
    let cause = match source {
        Some(e) => driver(e),
        None => scrub(reason),
    };
    let selection = source.is_some_and(|e| matches!(&*e.kind, ErrorKind::ServerSelection { .. }));
    let waited = match SELECTION_TIMEOUT.get() {
        Some((selection_timeout, connect)) if selection => format!(
            " within {} (0.8 × --connect-timeout {})",
            crate::args::fmt(*selection_timeout),
            crate::args::fmt(*connect)
        ),
        _ => format!(" within {}", crate::args::fmt(waited)),
    };
    let advice = if cause.contains("replicaSet") {
        ""
    } else {
        "; check --uri (or MONGODB_URI) and that the server runs and is reachable from here"
    };
    format!("cannot reach MongoDB{waited}: {cause}{advice}")
}

/// The driver's error without its debug output: the server's message and
/// code, or the cause of a failed connection, per host.
pub fn driver(e: &mongodb::error::Error) -> String {
    match &*e.kind {
        ErrorKind::InvalidArgument { message, .. } => scrub(message),
        ErrorKind::ServerSelection { message, .. } => server_selection(message),
        ErrorKind::DnsResolve { message, .. } => {
            format!("cannot resolve the host: {}", scrub(message))
        }
        ErrorKind::Authentication { message, .. } => {
            format!("authentication failed: {}", scrub(message))
        }
        ErrorKind::Io(io) => os_error(&io.to_string()),
        ErrorKind::Command(c) => format!("{} ({}, code {})", c.message, c.code_name, c.code),
        ErrorKind::Write(mongodb::error::WriteFailure::WriteError(w)) => {
            format!("{} (code {})", w.message, w.code)
        }
        ErrorKind::Write(mongodb::error::WriteFailure::WriteConcernError(w)) => {
            format!("{} ({}, code {})", w.message, w.code_name, w.code)
        }
        kind => scrub(&kind.to_string()),
    }
}

/// The causes in a server-selection error's topology description, one per
/// host (`127.0.0.1:1: connection refused`), or why no host is left.
fn server_selection(message: &str) -> String {
    let mut causes = Vec::new();
    let mut rest = message;
    while let Some(at) = rest.find("Address: ") {
        rest = &rest[at + "Address: ".len()..];
        let address = rest.split([',', ' ']).next().unwrap_or("");
        let Some(error) = rest.find("Error: ") else {
            continue;
        };
        let next = rest.find("Address: ").unwrap_or(rest.len());
        if error > next {
            continue;
        }
        let text = &rest[error + "Error: ".len()..];
        let text = text.strip_prefix("Kind: ").unwrap_or(text);
        let end = text.find(", labels:").unwrap_or(text.len().min(200));
        causes.push(format!("{address}: {}", os_error(&text[..end])));
    }
    if !causes.is_empty() {
        return causes.join("; ");
    }
    if let Some(at) = message.find("Set Name: ") {
        let name = message[at + "Set Name: ".len()..]
            .split([',', ' ', '}'])
            .next()
            .unwrap_or("");
        return format!(
            "no member of replica set {name:?} answered: the driver drops a host that is a \
             standalone server or a member of another replica set; check the replicaSet of --uri (or MONGODB_URI)"
        );
    }
    "no server could be selected".into()
}

/// An I/O error's text without the driver's prefix and the errno:
/// `connection refused`.
fn os_error(text: &str) -> String {
    let text = text.strip_prefix("I/O error: ").unwrap_or(text);
    let text = match text.find(" (os error") {
        Some(at) => &text[..at],
        None => text,
    };
    scrub(text)
}

/// The first sentence of `text`, cut before any debug output the driver may
/// have appended (its labels, its topology description).
fn scrub(text: &str) -> String {
    let mut end = text.len();
    for marker in [", labels:", " Topology:"] {
        if let Some(at) = text.find(marker) {
            end = end.min(at);
        }
    }
    text[..end]
        .trim_end_matches([' ', ',', '.', ':'])
        .replace("Server selection timeout: ", "")
}

/// The library's configuration errors that the flags can still reach after
/// the tool's own checks, in the tool's terms.
fn config(message: &str) -> String {
    let message = message
        .strip_prefix("invalid configuration: ")
        .unwrap_or(message);
    // `--foreign-lock`: an expression MongoDB cannot parse
    // (`foreign_lock.held: ...`), named by its field, on one line.
    if message.starts_with("foreign_lock") {
        return one_line(&format!(
            "invalid --foreign-lock (or MONGO_LEASE_FOREIGN_LOCK): {message}"
        ));
    }
    if message.contains("need ReleaseMode::Keep") {
        return "--shared, --permits and --hold-at-least need the lock document kept on \
                release, and this collection holds other applications' lock documents, \
                where releases delete it by default: pass --release-mode keep (their clients \
                then see a released key as held until its document expires), or use another \
                --collection"
            .into();
    }
    if message.contains("lock_delay") {
        return "--lock-delay is longer than an hour, the longest the library allows: pass a \
                shorter one"
            .into();
    }
    scrub(message)
}

/// `text` on one line: its line breaks (a server's message may quote an
/// expression's string with one) as spaces.
pub fn one_line(text: &str) -> String {
    text.split(['\n', '\r'])
        .filter(|part| !part.is_empty())
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::{os_error, server_selection};

    #[test]
    fn a_topology_description_becomes_one_cause_per_host() {
        let message = "Server selection timeout: No available servers. Topology: { Type: \
            Unknown, Servers: [ { Address: 127.0.0.1:1, Type: Unknown, Error: Kind: I/O \
            error: Connection refused (os error 111), labels: {\"SystemOverloadedError\", \
            \"RetryableError\"}, source: None, server response: None } ] }";
        assert_eq!(server_selection(message), "127.0.0.1:1: Connection refused");
        let message = "Server selection timeout: No available servers. Topology: { Type: \
            ReplicaSetNoPrimary, Set Name: rs9 }";
        assert!(server_selection(message).contains("\"rs9\""));
        assert_eq!(
            os_error("I/O error: Connection refused (os error 111)"),
            "Connection refused"
        );
    }
}
