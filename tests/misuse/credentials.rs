//! Wrong, missing and insufficient credentials: clear errors, and the
//! password in no error and no log line.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};
use mongo_lease::{Error, LeaseManager, Operation, ReleaseOutcome};
use mongodb::bson::{Document, doc};

use crate::common::Clients;
use crate::support::{
    BOUND, SECRET, USER, assert_short_and_clear, bounded, connect_refused, options_for,
    user_with_role,
};

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
        LeaseManager::connect(options_for(&clients, &uri, "d", Duration::from_secs(3)).await)
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
    let manager = LeaseManager::connect(options).await.unwrap();
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

/// A user with only the `read` role connects to a prepared collection (it
/// only reads) and reads it, and its acquire is refused in one sentence that names the
/// operation, the collection, the cause and what to do, without the
/// command's BSON; the driver's error stays its `source()`. (`mongo-lease
/// exec` printing the same sentence: `cli/tests/misuse/credentials.rs`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_users_acquire_is_refused_in_one_short_sentence() {
    let clients = Clients::default();
    let (_rs, uri) = user_with_role(&clients, "reader", "read").await;
    let reader =
        LeaseManager::connect(options_for(&clients, &uri, "app", Duration::from_secs(3)).await)
            .await
            .expect("reading is enough to connect to a prepared collection");
    assert_eq!(reader.inspect("k").await.expect("reading is allowed"), None);
    assert!(reader.list().await.expect("reading is allowed").is_empty());
    let (result, _) = bounded("the read-only acquire", BOUND, reader.try_acquire("k")).await;
    let error = result.expect_err("a read-only user cannot acquire");
    eprintln!("read-only acquire: {error}");
    assert!(
        matches!(
            error,
            Error::Refused {
                operation: Operation::Acquire,
                ..
            }
        ),
        "{error:?}"
    );
    assert!(!error.is_transient(), "{error}");
    let text = error.to_string();
    assert_eq!(
        text,
        "acquire on app.job.lock refused by the server: not authorized (Unauthorized, \
         code 13); grant the readWrite role on database app (enough for every \
         operation, change streams included)"
    );
    assert_short_and_clear(&text);
    let source = std::error::Error::source(&error).expect("the driver's error is the source");
    let driver = source
        .downcast_ref::<mongodb::error::Error>()
        .expect("a driver error");
    assert!(
        driver.to_string().contains("findAndModify"),
        "the source has the server's whole answer: {driver}"
    );
    reader.shutdown().await.unwrap();
}

/// `readWrite` on the lock collection's database is enough: the user
/// acquires, and its waiter is woken by another manager's release through
/// its change stream. Its backoff alone (at least 60 s here) would retry
/// long after the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_write_user_acquires_and_is_woken_through_its_change_stream() {
    const LONG: Duration = Duration::from_secs(120);
    let clients = Clients::default();
    let (rs, uri) = user_with_role(&clients, "writer", "readWrite").await;
    let mut options = options_for(&clients, &uri, "app", Duration::from_secs(3)).await;
    options.ttl = LONG;
    options.retry_initial = LONG;
    options.retry_max = LONG;
    let writer = LeaseManager::connect(options).await.unwrap();
    let lease = writer.acquire("own").await.expect("readWrite may acquire");
    assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);

    let mut holder_options = options_for(&clients, &rs.uri(), "app", Duration::from_secs(3)).await;
    holder_options.ttl = LONG;
    let holder = LeaseManager::connect(holder_options).await.unwrap();
    let held = holder.acquire("k").await.unwrap();
    let waiter = writer.clone();
    let waiting = tokio::spawn(async move { waiter.acquire("k").await });
    let probe = clients.connect(&rs.uri()).await;
    let locks = probe.database("app").collection::<Document>("job.lock");
    crate::common::eventually("the waiter's mark on the key", BOUND, || async {
        locks
            .find_one(doc! { "_id": "k" })
            .await
            .unwrap()
            .is_some_and(|d| d.contains_key("wt"))
    })
    .await;
    let held_token = held.fencing_token();
    assert_eq!(held.release().await.unwrap(), ReleaseOutcome::Released);
    let (acquired, _) = bounded("the waiter's wake by the release", BOUND, waiting).await;
    let acquired = acquired.unwrap().expect("the waiter acquires");
    assert!(acquired.fencing_token() > held_token);
    assert_eq!(acquired.release().await.unwrap(), ReleaseOutcome::Released);
    writer.shutdown().await.unwrap();
    holder.shutdown().await.unwrap();
}

/// A lease whose holder loses its write privilege (the `readWrite` role
/// revoked, `read` kept): its payload write, its in-document write and its
/// release are refused each in one sentence naming the operation and the
/// collection, not the command's BSON, as an acquire is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holders_writes_after_its_write_role_is_revoked_are_refused_in_one_sentence() {
    const LONG: Duration = Duration::from_secs(120);
    let clients = Clients::default();
    let (rs, uri) = user_with_role(&clients, "writer", "readWrite").await;
    let admin = clients.connect(&rs.uri()).await;
    admin
        .database("app")
        .collection::<Document>("items")
        .insert_one(doc! { "_id": "i1", "n": 1 })
        .await
        .unwrap();
    let mut options = options_for(&clients, &uri, "app", Duration::from_secs(3)).await;
    options.ttl = LONG;
    let writer = LeaseManager::connect(options).await.unwrap();
    let lease = writer.acquire("k").await.expect("readWrite may acquire");
    let items = writer.documents::<Document>("items").await.unwrap();
    let mut item = items.acquire("i1").await.expect("readWrite may acquire");
    admin
        .database("admin")
        .run_command(doc! { "revokeRolesFromUser": "writer", "roles": [{ "role": "readWrite", "db": "app" }] })
        .await
        .unwrap();
    admin
        .database("admin")
        .run_command(
            doc! { "grantRolesToUser": "writer", "roles": [{ "role": "read", "db": "app" }] },
        )
        .await
        .unwrap();

    let refused = |error: &Error, operation: Operation, namespace: &str| {
        eprintln!("{operation}: {error}");
        assert!(
            matches!(error, Error::Refused { operation: o, .. } if *o == operation),
            "{error:?}"
        );
        let text = error.to_string();
        assert!(
            text.starts_with(&format!(
                "{operation} on {namespace} refused by the server: not authorized"
            )),
            "{text}"
        );
        assert_short_and_clear(&text);
    };
    let (payload, _) = bounded(
        "the payload write",
        BOUND,
        lease.set_payload(doc! { "a": 1 }),
    )
    .await;
    refused(
        &payload.expect_err("a read-only user cannot write"),
        Operation::SetPayload,
        "app.job.lock",
    );
    let (write, _) = bounded(
        "the write under the lease",
        BOUND,
        item.update(doc! { "$set": { "n": 2 } }),
    )
    .await;
    refused(
        &write.expect_err("a read-only user cannot write"),
        Operation::Write,
        "app.items",
    );
    let (release, _) = bounded("the release", BOUND, lease.release()).await;
    refused(
        &release.expect_err("a read-only user cannot release"),
        Operation::Release,
        "app.job.lock",
    );
    drop(item);
    writer.shutdown().await.ok();
}
