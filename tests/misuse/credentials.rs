//! Wrong, missing and insufficient credentials: clear errors, and the
//! password in no error and no log line.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{LockManager, ReleaseOutcome};
use mongodb::bson::{Document, doc};

use crate::common::Clients;
use crate::support::{connect_refused, options_for};

/// Everything the process logs through `tracing`, at every level and from
/// every target (the driver's own events included), kept for inspection.
fn captured_logs() -> Arc<Mutex<Vec<u8>>> {
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Arc::new(Mutex::new(Vec::new()));
        let sink = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_ansi(false)
            .with_writer(move || Writer(sink.clone()))
            .finish();
        tracing::subscriber::set_global_default(subscriber).expect("one global subscriber");
        logs
    })
    .clone()
}

struct Writer(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const USER: &str = "lease-admin";
const SECRET: &str = "s3cr3t-Pa55w0rd";

/// Wrong credentials: a clear, immediate error. With right credentials
/// everything works. The password appears in no error (Display or Debug)
/// and in no log line.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_a_clear_error_and_credentials_never_leak() {
    let logs = captured_logs();
    let rs = ReplicaSet::start(ReplicaSetOptions::default().auth(USER, SECRET))
        .await
        .unwrap();
    let clients = Clients::default();
    let uri = rs.uri();
    assert!(uri.contains(&format!("{USER}:{SECRET}@")), "{uri}");
    let mut errors = Vec::new();

    let wrong = uri.replace(SECRET, "not-the-password");
    let (e, took) = connect_refused(
        &clients,
        "connect with a wrong password",
        &wrong,
        Duration::from_secs(3),
    )
    .await;
    eprintln!("wrong password: {e} (after {took:?})");
    assert!(!e.is_transient(), "not worth retrying: {e}");
    assert!(e.to_string().contains("Authentication failed"), "{e}");
    errors.push(e);

    // No credentials at all.
    let anonymous = uri.replace(&format!("{USER}:{SECRET}@"), "");
    let (e, _) = connect_refused(
        &clients,
        "connect without credentials",
        &anonymous,
        Duration::from_secs(3),
    )
    .await;
    eprintln!("no credentials: {e}");
    assert!(e.to_string().contains("requires authentication"), "{e}");
    errors.push(e);

    // The right password: acquire, release, and a few errors of other kinds.
    let manager =
        LockManager::connect(options_for(&clients, &uri, "d", Duration::from_secs(3)).await)
            .await
            .unwrap();
    let lease = manager.acquire("k").await.unwrap();
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    errors.push(manager.try_acquire("").await.unwrap_err());
    let admin = clients.connect(&rs.uri()).await;
    admin
        .database("d")
        .collection::<Document>("job.lock")
        .insert_one(doc! { "_id": "foreign", "payload": 1 })
        .await
        .unwrap();
    // Another application's document is held, not an error.
    assert!(manager.try_acquire("foreign").await.unwrap().is_none());
    manager.shutdown().await.unwrap();
    errors.push(manager.try_acquire("k").await.unwrap_err());

    // Unreachable, with credentials in the URI.
    let dead = format!("mongodb://{USER}:{SECRET}@127.0.0.1:1/?serverSelectionTimeoutMS=500");
    let (e, _) = connect_refused(
        &clients,
        "connect to a closed port",
        &dead,
        Duration::from_millis(800),
    )
    .await;
    errors.push(e);

    for e in &errors {
        for text in [e.to_string(), format!("{e:?}")] {
            assert!(
                !text.contains(SECRET),
                "the password leaked into an error: {text}"
            );
            assert!(
                !text.contains("not-the-password"),
                "the wrong password leaked into an error: {text}"
            );
        }
    }
    let options = options_for(&clients, &uri, "d", Duration::from_secs(3)).await;
    assert!(!format!("{options:?}").contains(SECRET));
    let manager = LockManager::connect(options).await.unwrap();
    assert!(!format!("{manager:?}").contains(SECRET));
    manager.shutdown().await.unwrap();

    let logs = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    assert!(
        logs.contains("lease acquired"),
        "the log capture works: it holds this test's acquisition"
    );
    for line in logs.lines() {
        assert!(
            !line.contains(SECRET) && !line.contains("not-the-password"),
            "the password leaked into a log line: {line}"
        );
    }
}

/// A user that may only read: connect fails with a clear error, nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_without_write_privileges_is_a_clear_error() {
    let rs = ReplicaSet::start(ReplicaSetOptions::default().auth(USER, SECRET))
        .await
        .unwrap();
    let clients = Clients::default();
    let admin = clients.connect(&rs.uri()).await;
    admin
        .database("admin")
        .run_command(doc! { "createUser": "reader", "pwd": "reader-pw", "roles": [{ "role": "read", "db": "d" }] })
        .await
        .unwrap();
    let uri = rs
        .uri()
        .replace(&format!("{USER}:{SECRET}@"), "reader:reader-pw@");
    let (e, took) = connect_refused(
        &clients,
        "connect as a read-only user",
        &uri,
        Duration::from_secs(3),
    )
    .await;
    eprintln!("read-only user: {e} (after {took:?})");
    assert!(!e.is_transient(), "{e}");
    assert!(e.to_string().contains("not authorized"), "{e}");
    let names = admin.database("d").list_collection_names().await.unwrap();
    assert!(names.is_empty(), "nothing created: {names:?}");
}
