//! One replica set shared by every test of a process.

use std::sync::{OnceLock, mpsc};

use super::{ReplicaSet, ReplicaSetOptions};

/// Returns the URI of a MongoDB replica set shared by the whole process.
///
/// * If the `MONGODB_URI` environment variable is set (and non-empty), its
///   value is returned and nothing is started (e.g. to run the tests
///   against an existing server in CI).
/// * Otherwise, on the first call, a single-member replica set
///   ([`ReplicaSetOptions::default`]: TTL monitor every second, fast
///   elections) is started on a dedicated, never-ending background thread
///   with its own tokio runtime, so it outlives every test's runtime and
///   its `mongod` is only killed when the process exits (by an exit hook,
///   or by `PR_SET_PDEATHSIG` if the process dies abruptly). Later calls
///   return the same URI immediately. Concurrent first calls wait for the
///   single startup (about a second; longer if `mongod` must first be
///   installed, see [`mongod_path`](super::mongod_path)).
///
/// This is a synchronous function that blocks the calling thread until
/// the server is ready; it is safe to call from inside `#[tokio::test]` of
/// either flavor (it never calls `block_on` on the caller's thread).
///
/// Give each test its own database or collection name with
/// [`unique_name`](super::unique_name).
///
/// # Panics
///
/// This is a test helper: if the shared server cannot be started, it
/// panics with the underlying [`TestkitError`](super::TestkitError)
/// message (including the tail of the `mongod` log). The failure is
/// remembered, so every later call in the process panics with the same
/// message immediately instead of retrying.
pub fn shared_uri() -> String {
    if let Some(uri) = std::env::var("MONGODB_URI").ok().filter(|u| !u.is_empty()) {
        return uri;
    }
    static SHARED: OnceLock<Result<String, String>> = OnceLock::new();
    match SHARED.get_or_init(start_shared) {
        Ok(uri) => uri.clone(),
        Err(msg) => panic!("mongo_lease::testkit::shared_uri: {msg}"),
    }
}

fn start_shared() -> Result<String, String> {
    let (tx, rx) = mpsc::channel::<Result<String, String>>();
    std::thread::Builder::new()
        .name("mongo-lease-testkit-shared".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(format!("cannot build a tokio runtime: {e}")));
                    return;
                }
            };
            runtime.block_on(async move {
                match ReplicaSet::start(ReplicaSetOptions::default()).await {
                    Ok(rs) => {
                        let _ = tx.send(Ok(rs.uri()));
                        // Keep the set alive (and keep driving the runtime,
                        // so the driver's background tasks can finish) until
                        // the process exits; the exit hook then kills the
                        // mongod and removes its data directory.
                        let _rs = rs;
                        std::future::pending::<()>().await;
                    }
                    Err(e) => {
                        let _ = tx.send(Err(format!("failed to start the shared mongod: {e}")));
                    }
                }
            });
        })
        .map_err(|e| format!("cannot spawn the shared-server thread: {e}"))?;
    rx.recv()
        .map_err(|_| "the shared-server thread exited without reporting".to_owned())?
}
