//! `mongo-lease watch KEY [--json]`.

use std::time::{Duration, SystemTime};

use serde_json::Value;

use crate::common::cli::{Env, LEASE_LOST, Proc, token_of};

/// The fencing token printed in a text line: `(fencing token N, ...`.
fn printed_token(line: &str) -> u64 {
    let (_, rest) = line.split_once("(fencing token ").expect("a fencing token");
    rest.split([',', ')']).next().unwrap().parse().unwrap()
}

/// Holders come and go through other processes: a release, a holder that
/// dies (its lease expires: `expired`), and the next holder (`taken over`
/// from the dead one); renewals print nothing; SIGINT ends it with 0.
#[test]
fn watch_prints_acquired_released_expired_and_taken_over_as_other_processes_hold_the_key() {
    let env = Env::new("cli_watch");
    let mut watch = env.spawn(&["watch", "job"]);
    assert!(watch.expect_line(" free ").ends_with("free \"job\""));

    // A holder that releases: acquired, then released.
    let script = "echo \"holding $MONGO_LEASE_TOKEN\"; read line";
    let short = ["--ttl", "1s"];
    let mut first = env.spawn(
        &[
            &["--owner-id", "first", "exec", "--key", "job"][..],
            &short,
            &["--", "sh", "-c", "echo \"holding $MONGO_LEASE_TOKEN\""],
        ]
        .concat(),
    );
    let token = token_of(&first.expect_line("holding"));
    assert_eq!(first.wait(), 0);
    let acquired = watch.expect_line(" acquired ");
    assert!(acquired.contains("acquired \"job\" by first"), "{acquired}");
    assert_eq!(printed_token(&acquired), token);
    let released = watch.expect_line(" released ");
    assert!(released.contains("released \"job\" by first"), "{released}");

    // A holder killed while holding (TTL 1 s, renewed 3 times per TTL
    // meanwhile: no line): its lease expires.
    let second = env.spawn(
        &[
            &["--owner-id", "second", "exec", "--key", "job"][..],
            &short,
            &["--", "sh", "-c", &format!("{script}; sleep 60")],
        ]
        .concat(),
    );
    let second_token = token_of(&second.expect_line("holding"));
    let acquired = watch.expect_line(" acquired ");
    assert_eq!(printed_token(&acquired), second_token);
    second.signal(libc::SIGKILL);
    let expired = watch.expect_line(" expired ");
    assert!(expired.contains("expired \"job\" by second"), "{expired}");

    // The next holder takes over from the dead one.
    let third = env.spawn(
        &[
            &["--owner-id", "third", "exec", "--key", "job"][..],
            &short,
            &["--", "sh", "-c", &format!("{script}; sleep 60")],
        ]
        .concat(),
    );
    let third_token = token_of(&third.expect_line("holding"));
    let taken = watch.expect_line(" taken over ");
    assert!(
        taken.contains(&format!(
            "taken over \"job\" by third (fencing token {third_token}, expires at "
        )) && taken.ends_with(&format!("from second (fencing token {second_token})")),
        "{taken}"
    );
    drop(third);
    watch.signal(libc::SIGINT);
    assert_eq!(watch.wait(), 0);
    // The killed third holder's lease may expire before the SIGINT.
    assert_no_line_but(&watch, &["expired", "stderr:"]);
}

/// A force release by another process ends the holder's lease (it exits
/// with 76): `released`, then the waiting process's `acquired`. A holder
/// whose release hands the key to a process registered in the key's queue
/// of waiting owners, in the release's own write: `released`, then
/// `acquired` too, never `taken over` (which says the previous lease had
/// expired). Each holder runs until the test creates a file named after
/// its owner id.
#[test]
fn watch_prints_a_force_release_and_a_handoff_as_released_then_acquired() {
    let env = Env::new("cli_watch_release");
    let dir = std::env::temp_dir().join(&env.db);
    std::fs::create_dir(&dir).unwrap();
    let script = format!(
        "echo \"holding $MONGO_LEASE_TOKEN\"; \
         while [ ! -e '{}'/\"$MONGO_LEASE_OWNER\" ]; do sleep 0.05; done",
        dir.display()
    );
    let hold = |owner: &str| {
        // Told of the force release at once, not at the next heartbeat.
        let args = [
            "--watch-held-leases",
            "--owner-id",
            owner,
            "exec",
            "--key",
            "job",
            "--ttl",
            "30s",
        ];
        env.spawn(&[&args[..], &["--", "sh", "-c", &script]].concat())
    };
    let finish = |owner: &str| std::fs::write(dir.join(owner), "").unwrap();
    let watch = env.spawn(&["watch", "job"]);
    watch.expect_line(" free ");

    let mut first = hold("first");
    let first_token = token_of(&first.expect_line("holding"));
    watch.expect_line(" acquired \"job\" by first ");
    let second = hold("second");
    env.wait_for_waiting_mark_blocking("job");
    // Free at once: the next holder starts while this one is told.
    let forced = env.run(&["release", "--force", "--immediately", "job"]);
    assert!(forced.status.success(), "{forced:?}");
    let second_token = token_of(&second.expect_line("holding"));
    assert_eq!(first.wait_within(Duration::from_secs(60)), LEASE_LOST);
    let released = watch.expect_line(" released ");
    assert!(
        released.ends_with(&format!(
            "released \"job\" by first (fencing token {first_token})"
        )),
        "{released}"
    );
    let acquired = watch.expect_line(" acquired ");
    assert!(
        acquired.contains("acquired \"job\" by second"),
        "{acquired}"
    );
    assert_eq!(printed_token(&acquired), second_token);

    // `third` waits (registered) while `second` holds; `second` ends.
    let mut third = hold("third");
    env.wait_for_waiting_mark_blocking("job");
    finish("second");
    let third_token = token_of(&third.expect_line("holding"));
    let released = watch.expect_line(" released ");
    assert!(
        released.contains("released \"job\" by second"),
        "{released}"
    );
    let acquired = watch.expect_line(" acquired ");
    assert!(acquired.contains("acquired \"job\" by third"), "{acquired}");
    assert_eq!(printed_token(&acquired), third_token);

    finish("third");
    assert_eq!(third.wait(), 0);
    watch.expect_line(" released \"job\" by third ");
    watch.signal(libc::SIGINT);
    let mut watch = watch;
    assert_eq!(watch.wait(), 0);
    assert_no_line_but(&watch, &["stderr:"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Lines left unmatched by the test are only of the kinds `allowed`:
/// renewals printed nothing.
fn assert_no_line_but(proc: &Proc, allowed: &[&str]) {
    for line in proc.rest() {
        assert!(
            allowed.iter().any(|a| line.contains(a)),
            "unexpected line {line:?}"
        );
    }
}

fn rfc3339(value: &Value) -> SystemTime {
    let text = value.as_str().unwrap_or_else(|| panic!("a time: {value}"));
    let time: humantime::Timestamp = text.parse().unwrap();
    time.into()
}

/// `--json`: one object per line with the documented fields, for an
/// exclusive key and the holders of a shared key, driven by a manager in
/// the test; SIGTERM ends it with 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_json_lines_parse_and_carry_the_fields() {
    let env = Env::new("cli_watch_json");
    let manager = env.manager(Duration::from_secs(10)).await;
    let lease = manager.acquire("report").await.unwrap();
    let watch = env.spawn(&["watch", "--json", "report"]);
    let next = |event: &str| -> Value {
        let line = watch.expect_line(&format!("\"event\":\"{event}\""));
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    let fields = [
        "event",
        "key",
        "kind",
        "permits",
        "owner_id",
        "fencing_token",
        "foreign",
        "acquired_at",
        "expires_at",
        "previous_owner_id",
        "previous_fencing_token",
        "server_time",
    ];
    let held = next("held");
    for field in fields {
        assert!(held.get(field).is_some(), "{field} in {held}");
    }
    assert_eq!(held["key"], "report");
    assert_eq!(held["kind"], "exclusive");
    assert_eq!(held["owner_id"], manager.owner_id());
    assert_eq!(held["fencing_token"], lease.fencing_token());
    assert_eq!(held["previous_owner_id"], Value::Null);
    let ttl = rfc3339(&held["expires_at"])
        .duration_since(rfc3339(&held["server_time"]))
        .unwrap();
    assert!(ttl <= Duration::from_secs(10), "{held}");

    assert!(!lease.release().await.unwrap().was_lost());
    let released = next("released");
    assert_eq!(released["fencing_token"], held["fencing_token"]);

    // Two shared holders: one `acquired` line each, then one `released` each.
    let a = manager.acquire("report").shared().await.unwrap();
    let b = manager.acquire("report").shared().await.unwrap();
    let mut tokens = vec![next("acquired"), next("acquired")];
    for line in &tokens {
        assert_eq!(line["kind"], "shared");
        assert_eq!(line["owner_id"], manager.owner_id());
    }
    tokens.sort_by_key(|l| l["fencing_token"].as_u64());
    assert_eq!(tokens[0]["fencing_token"], a.fencing_token());
    assert_eq!(tokens[1]["fencing_token"], b.fencing_token());
    assert!(!a.release().await.unwrap().was_lost());
    assert_eq!(
        next("released")["fencing_token"],
        tokens[0]["fencing_token"]
    );
    assert!(!b.release().await.unwrap().was_lost());
    assert_eq!(
        next("released")["fencing_token"],
        tokens[1]["fencing_token"]
    );

    watch.signal(libc::SIGTERM);
    let mut watch = watch;
    assert_eq!(watch.wait(), 0);
    manager.shutdown().await.unwrap();
}

/// Another application's lock with an expiry of its own (npm
/// `distributed-locks-mongodb`'s `{_id, value, ttl, obtained_at}`, by its
/// upsert for a free key): watched as held by its owner, marked foreign,
/// with its expiry by its rule, then `expired` when that passes (nothing
/// writes then: the observer reads the key at that time).
#[test]
fn watch_prints_a_foreign_lock_with_its_owner_then_expired_by_its_own_rule() {
    let env = Env::new("cli_watch_foreign");
    let mut watch = env.spawn(&["watch", "job"]);
    assert!(watch.expect_line(" free ").ends_with("free \"job\""));
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let lock = mongodb::bson::doc! {
                "$set": { "_id": "job", "value": "node-7", "ttl": 2 },
                "$currentDate": { "obtained_at": { "$type": "date" } },
            };
            env.leases()
                .await
                .update_one(
                    mongodb::bson::doc! { "_id": "job", "value": "node-7" },
                    lock,
                )
                .upsert(true)
                .await
                .unwrap();
        });
    let held = watch.expect_line(" acquired ");
    assert!(
        held.contains("by node-7 (foreign)") && held.contains("expires at"),
        "{held}"
    );
    let expired = watch.expect_line(" expired ");
    assert!(expired.contains("expired \"job\" by node-7"), "{expired}");
    watch.signal(libc::SIGINT);
    assert_eq!(watch.wait(), 0);
}

/// Another application's lock of a layout of its own, read by
/// `--foreign-lock`: watched as held by its owner, marked foreign, with no
/// expiry (its `expire` is null), then `released` when its application
/// unlocks it; `--json` gives its owner and a null expiry.
#[test]
fn watch_with_a_foreign_lock_rule_prints_its_owner_and_no_expiry_then_released() {
    const RULE: &str =
        r#"{"held": {"$eq": ["$locked", true]}, "owner": "$owner", "expires_at": "$expire"}"#;
    let env = Env::new("cli_watch_rule");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let leases = runtime.block_on(env.leases());
    runtime.block_on(async {
        let lock = mongodb::bson::doc! {
            "_id": "k", "locked": true, "owner": "w1",
            "created": mongodb::bson::DateTime::now(), "expire": null,
        };
        leases.insert_one(lock).await.unwrap();
    });
    let mut json = env.spawn(&["--foreign-lock", RULE, "watch", "--json", "k"]);
    let held: Value = serde_json::from_str(&json.expect_line("\"event\":\"held\"")).unwrap();
    assert_eq!(
        (&held["owner_id"], &held["foreign"], &held["expires_at"]),
        (&Value::from("w1"), &Value::from(true), &Value::Null),
        "{held}"
    );
    json.signal(libc::SIGTERM);
    assert_eq!(json.wait(), 0);

    let mut watch = env.spawn(&["--foreign-lock", RULE, "watch", "k"]);
    let held = watch.expect_line(" held ");
    assert!(
        held.contains("held \"k\" by w1 (foreign)") && held.contains("no expiry"),
        "{held}"
    );
    runtime.block_on(async {
        leases
            .update_one(
                mongodb::bson::doc! { "_id": "k" },
                mongodb::bson::doc! { "$set": { "locked": false } },
            )
            .await
            .unwrap();
    });
    let released = watch.expect_line(" released ");
    assert!(
        released.contains("released \"k\" by w1 (foreign)"),
        "{released}"
    );
    watch.signal(libc::SIGINT);
    assert_eq!(watch.wait(), 0);
}
