//! What the misuse cases share: the bound that turns a hang into a
//! failure, and managers connected with a short operation timeout.

use std::time::Duration;

use mongo_lease::{Error, LeaseManager, LeaseManagerOptions};
use tokio::time::Instant;

use crate::common::Clients;

pub const TTL: Duration = Duration::from_secs(10);

/// How long a call that must end (with a result or a clear error) may take
/// before the test fails. It only turns a hang into a failure: the calls
/// bounded by it take at most about 3 s here (an operation timeout of 3 s, a
/// reconnection after a healed link), so it is at least 10x that.
pub const BOUND: Duration = Duration::from_secs(30);

/// Options for a manager on `uri` whose client `clients` shuts down at the
/// end of the test.
pub async fn options_for(
    clients: &Clients,
    uri: &str,
    db: &str,
    op_timeout: Duration,
) -> LeaseManagerOptions {
    let client = clients.connect(uri).await;
    LeaseManagerOptions::builder()
        .database(client.database(db))
        .collection("job.lock")
        .ttl(Duration::from_secs(2))
        .operation_timeout(op_timeout)
        .build()
}

/// Connects a manager to `uri` (database `d`, operation timeout
/// `op_timeout`), expecting an error within [`BOUND`]; returns it and the wait.
pub async fn connect_refused(
    clients: &Clients,
    what: &str,
    uri: &str,
    op_timeout: Duration,
) -> (Error, Duration) {
    let (r, took) = bounded(
        what,
        BOUND,
        LeaseManager::connect(options_for(clients, uri, "d", op_timeout).await),
    )
    .await;
    (r.expect_err(what), took)
}

/// Asserts `f` finishes within `limit` and returns its output.
pub async fn bounded<T>(
    what: &str,
    limit: Duration,
    f: impl std::future::Future<Output = T>,
) -> (T, Duration) {
    let started = Instant::now();
    let out = tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"));
    (out, started.elapsed())
}
