//! What the misuse cases share (here and in `cli/tests/misuse/`): the
//! bound that turns a hang into a failure, managers connected with a short
//! operation timeout, replica sets with access control and users of one
//! role, and the check that a refusal's message is short and clear.

use std::time::Duration;

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{Error, LeaseManager, LeaseManagerOptions};
use mongodb::bson::doc;
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
        .clock_skew(crate::common::clock_skew(Duration::from_secs(2)))
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
    f: impl std::future::IntoFuture<Output = T>,
) -> (T, Duration) {
    let started = Instant::now();
    let out = tokio::time::timeout(limit, f)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {limit:?}"));
    (out, started.elapsed())
}

/// The admin user of the replica sets started with access control.
pub const USER: &str = "lease-admin";
pub const SECRET: &str = "s3cr3t-Pa55w0rd";

/// Starts a replica set with auth, prepares the lock collection `app.job.lock`
/// (its indexes) as the admin user, and creates the user `name` with `role`
/// on database `app`; returns the set and that user's URI.
pub async fn user_with_role(clients: &Clients, name: &str, role: &str) -> (ReplicaSet, String) {
    let rs = ReplicaSet::start(ReplicaSetOptions::default().auth(USER, SECRET))
        .await
        .unwrap();
    let preparer =
        LeaseManager::connect(options_for(clients, &rs.uri(), "app", Duration::from_secs(3)).await)
            .await
            .unwrap();
    preparer.shutdown().await.unwrap();
    let admin = clients.connect(&rs.uri()).await;
    admin
        .database("admin")
        .run_command(
            doc! { "createUser": name, "pwd": "user-pw", "roles": [{ "role": role, "db": "app" }] },
        )
        .await
        .unwrap();
    let uri = rs
        .uri()
        .replace(&format!("{USER}:{SECRET}@"), &format!("{name}:user-pw@"));
    (rs, uri)
}

/// What a refusal's message must not carry: the command's BSON (its
/// pipeline's `$$NOW`, the command's name) and the cluster time's signature.
pub fn assert_short_and_clear(text: &str) {
    assert!(text.len() < 300, "{} bytes: {text}", text.len());
    for echoed in ["$$NOW", "signature", "$clusterTime", "findAndModify", "{"] {
        assert!(!text.contains(echoed), "{echoed:?} in {text}");
    }
}
