//! `mongo-lease release --owner AID --force` (the CLI's release by owner
//! id, `LeaseManager::release_owner`), in keep and delete mode, against a
//! real `mongod`. The library's side: `tests/sharing/compat_mode.rs`.

use std::process::Command;
use std::time::Duration;

use mongo_lease::LeaseManager;
use serde_json::Value;

use crate::common::Fixture;
use crate::common::others::foreign_insert;

const TTL: Duration = Duration::from_secs(30);
/// Bound on waits for a loss: >= 10x what they take here.
const BOUND: Duration = Duration::from_secs(10);
const BIN: &str = env!("CARGO_BIN_EXE_mongo-lease");

/// A keep-mode manager with this owner id and heartbeat.
async fn keep_mode_manager(f: &Fixture, owner: &str, heartbeat: Option<Duration>) -> LeaseManager {
    let mut options = f.options(TTL).await;
    options.owner_id = Some(owner.to_string());
    options.heartbeat_interval = heartbeat;
    LeaseManager::connect(options).await.expect("connect")
}

/// `mongo-lease ARGS` on the fixture's collection.
fn cli(f: &Fixture, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .env("MONGODB_URI", crate::common::uri())
        .env("MONGO_LEASE_DB", f.db.name())
        .env("MONGO_LEASE_COLLECTION", &f.collection)
        .env("MONGO_LEASE_CLOCK_SKEW", "100ms") // one member; short leases
        .env_remove("MONGO_LEASE_OWNER_ID")
        .env_remove("MONGO_LEASE_FOREIGN_LOCK")
        .env_remove("MONGO_LEASE_RELEASE_MODE")
        .args(args)
        .output()
        .expect("run mongo-lease")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_release_owner_force_releases_every_lease_of_that_owner_and_prints_the_count() {
    let f = Fixture::new("compat_cli").await;
    let heartbeat = Some(Duration::from_millis(200));
    let dead = keep_mode_manager(&f, "dead-worker", heartbeat).await;
    let other = keep_mode_manager(&f, "other-worker", heartbeat).await;
    let (d1, d2) = (
        dead.acquire("d1").await.unwrap(),
        dead.acquire("d2").await.unwrap(),
    );
    let o1 = other.acquire("o1").await.unwrap();

    // Without --force: refused, nothing released.
    let out = tokio::task::block_in_place(|| cli(&f, &["release", "--owner", "dead-worker"]));
    assert_eq!(out.status.code(), Some(2), "usage error");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--force") && stderr.contains("dead-worker"),
        "{stderr}"
    );
    assert!(!d1.status().is_lost());

    // A key and --owner together are refused.
    let out =
        tokio::task::block_in_place(|| cli(&f, &["release", "d1", "--owner", "x", "--force"]));
    assert_eq!(out.status.code(), Some(2));

    let out =
        tokio::task::block_in_place(|| cli(&f, &["release", "--owner", "dead-worker", "--force"]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("released 2 leases of owner id \"dead-worker\""),
        "{stdout}"
    );
    for lease in [&d1, &d2] {
        tokio::time::timeout(BOUND, lease.status().lost())
            .await
            .expect("lost");
    }
    assert!(!o1.status().is_lost());

    // JSON, and delete mode from the command line.
    let d3 = dead.acquire("d3").await.unwrap();
    let out = tokio::task::block_in_place(|| {
        cli(
            &f,
            &[
                "--json",
                "--release-mode",
                "delete",
                "release",
                "--owner",
                "dead-worker",
                "--force",
                // Deleted at once only when freed at once: the holder is
                // known to be gone, and no lock-delay (docs/lock-delay.md).
                "--immediately",
                "--lock-delay",
                "0s",
            ],
        )
    });
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(report["owner_id"], Value::from("dead-worker"));
    assert_eq!(report["released"], Value::from(1));
    assert!(foreign_insert(&f, "d3").await, "deleted in delete mode");
    tokio::time::timeout(BOUND, d3.status().lost())
        .await
        .expect("lost");

    dead.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}
