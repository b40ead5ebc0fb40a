//! Credentials from the command line: a read-only user's `exec` prints the
//! server's refusal in one short sentence and exits 69. The library's side:
//! `tests/misuse/credentials.rs`.

use crate::common::Clients;
use crate::support::{assert_short_and_clear, user_with_role};

/// A user with only the `read` role: `mongo-lease exec` exits 69 and prints
/// the refusal of its acquire in the library's one sentence that names the
/// operation and the collection, without the command's BSON.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_users_exec_prints_the_refusal_in_one_short_sentence() {
    let clients = Clients::default();
    let (_rs, uri) = user_with_role(&clients, "reader", "read").await;

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_mongo-lease"))
        .env("MONGODB_URI", &uri)
        .env("MONGO_LEASE_DB", "app")
        .env("MONGO_LEASE_COLLECTION", "job.lock")
        .args(["exec", "--key", "k", "--", "true"])
        .output()
        .expect("run mongo-lease");
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("exec as a read-only user: {stderr}");
    assert_eq!(out.status.code(), Some(69), "{stderr}");
    let line = stderr
        .lines()
        .find(|line| line.contains("refused by the server"))
        .unwrap_or_else(|| panic!("no refusal printed: {stderr}"));
    assert!(
        line.contains("acquire on app.job.lock refused by the server: not authorized"),
        "{line}"
    );
    assert_short_and_clear(line);
}
