//! `--http ADDR` of `exec` and `leader`: `/healthz`, `/metrics`, `/leader`.

use std::time::Duration;

use mongo_lease::telemetry::{ACQUISITIONS, HELD_LEASES};

use crate::common::cli::{Env, USAGE, stderr, token_of};
use crate::common::http::get;

/// `exec --http`: 503 while it waits for the key, 200 while it holds it,
/// Prometheus text on `/metrics`, and 503 once the lease is lost (a force
/// release; the command ignores SIGTERM, so the server is still up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_http_answers_healthz_by_the_lease_and_serves_metrics() {
    let env = Env::new("cli_http_exec");
    let manager = env.manager(Duration::from_secs(10)).await;
    let blocker = manager.acquire("job").await.unwrap();
    let mut exec = env.spawn(&[
        "exec",
        "--key",
        "job",
        // The holder learns of the force release at its next renewal, a
        // heartbeat of about 5 s here; the grace keeps the command (which
        // ignores SIGTERM) and its server up for the last check.
        "--ttl",
        "30s",
        "--grace",
        "10s",
        "--http",
        "127.0.0.1:0",
        "--",
        "sh",
        "-c",
        "trap 'echo got TERM' TERM; echo \"holding $MONGO_LEASE_TOKEN\"; \
         while true; do sleep 0.05; done",
    ]);
    let addr = exec.http_addr();
    let waiting = get(&addr, "/healthz").await;
    assert_eq!(waiting.status, 503, "{waiting:?}");
    assert_eq!(waiting.json()["state"], "waiting for the lease");
    assert_eq!(waiting.json()["healthy"], false);

    assert!(!blocker.release().await.unwrap().was_lost());
    let token = token_of(&exec.expect_line("holding"));
    let healthy = get(&addr, "/healthz").await;
    assert_eq!(healthy.status, 200, "{healthy:?}");
    assert_eq!(healthy.json()["state"], "holding the lease");
    assert_eq!(healthy.json()["renewals_on_time"], true);

    let metrics = get(&addr, "/metrics").await;
    assert_eq!(metrics.status, 200, "{metrics:?}");
    assert!(
        metrics.headers.contains("content-type: text/plain"),
        "{metrics:?}"
    );
    let series: Vec<&str> = metrics
        .body
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .collect();
    for line in &series {
        assert!(line.starts_with("mongo_lease_"), "series {line:?}");
    }
    // This process holds one lease, acquired once.
    assert!(
        series.contains(&format!("{HELD_LEASES} 1").as_str()),
        "{}",
        metrics.body
    );
    assert!(
        series
            .iter()
            .any(|l| l.starts_with(ACQUISITIONS) && l.contains("outcome=\"acquired\"")),
        "{}",
        metrics.body
    );

    let out = env.run(&["release", "job", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    exec.expect_line("got TERM");
    let lost = get(&addr, "/healthz").await;
    assert_eq!(lost.status, 503, "{lost:?}");
    assert_eq!(lost.json()["state"], "the lease was lost");
    assert!(token > 0);
    exec.signal(libc::SIGKILL);
    exec.wait();
    manager.shutdown().await.unwrap();
}

/// `leader --http`: `/leader` names the leader for the leader and for a
/// follower, whose `/healthz` is 200 while it campaigns; the server stops
/// with the command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_http_names_the_leader_and_a_campaigning_follower_is_healthy() {
    let env = Env::new("cli_http_leader");
    let script = "echo \"leading $MONGO_LEASE_TOKEN\"; exec sleep 60";
    let args = |owner: &'static str| {
        vec![
            "--owner-id",
            owner,
            "leader",
            "--name",
            "svc",
            "--ttl",
            "2s",
            "--payload",
            r#"{"addr":"10.0.0.7:8080"}"#,
            "--http",
            "127.0.0.1:0",
            "--",
            "sh",
            "-c",
            script,
        ]
    };
    let mut alpha = env.spawn(&args("alpha"));
    let alpha_addr = alpha.http_addr();
    let term = token_of(&alpha.expect_line("leading"));
    let beta = env.spawn(&args("beta"));
    let beta_addr = beta.http_addr();
    // beta campaigns: its attempt marked alpha's lease.
    env.wait_for_waiting_mark("svc").await;

    for addr in [&alpha_addr, &beta_addr] {
        let leader = get(addr, "/leader").await;
        assert_eq!(leader.status, 200, "{leader:?}");
        let leader = leader.json();
        assert_eq!(leader["owner_id"], "alpha", "{leader}");
        assert_eq!(leader["term"], term, "{leader}");
        assert_eq!(leader["name"], "svc", "{leader}");
        assert!(leader["expires_at"].is_string(), "{leader}");
    }
    // Published before the command started.
    let leader = get(&alpha_addr, "/leader").await.json();
    assert_eq!(leader["payload"]["addr"], "10.0.0.7:8080", "{leader}");
    let leading = get(&alpha_addr, "/healthz").await;
    assert_eq!(leading.status, 200, "{leading:?}");
    assert_eq!(leading.json()["state"], "holding the lease");
    let follower = get(&beta_addr, "/healthz").await;
    assert_eq!(follower.status, 200, "{follower:?}");
    assert_eq!(follower.json()["state"], "campaigning (a follower)");

    alpha.signal(libc::SIGTERM);
    alpha.wait();
    assert!(
        tokio::net::TcpStream::connect(&alpha_addr).await.is_err(),
        "the server stopped with the command"
    );
}

/// An address that cannot be listened on is a usage error (exit 2) with a
/// clear message, before anything else is done.
#[test]
fn a_bad_or_busy_http_address_is_a_usage_error() {
    let env = Env::new("cli_http_bad");
    let out = env.run(&["exec", "--key", "k", "--http", "nowhere", "--", "true"]);
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--http nowhere: cannot listen"),
        "{}",
        stderr(&out)
    );
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = env.run(&["leader", "--name", "n", "--http", &addr, "--", "true"]);
    assert_eq!(out.status.code(), Some(USAGE), "{}", stderr(&out));
    assert!(stderr(&out).contains("cannot listen"), "{}", stderr(&out));
}

/// `/leader` is `null` (200) while nobody leads: the leader's command
/// exited, it resigned and waits `--restart-delay` before campaigning
/// again, healthy meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_http_answers_null_while_nobody_leads() {
    let env = Env::new("cli_http_none");
    let mut leader = env.spawn(&[
        "leader",
        "--name",
        "svc",
        "--restart-delay",
        "10m",
        "--http",
        "127.0.0.1:0",
        "--",
        "sh",
        "-c",
        "echo \"leading $MONGO_LEASE_TOKEN\"",
    ]);
    let addr = leader.http_addr();
    leader.expect_line("leading");
    // Printed once it has resigned.
    leader.expect_line("resigned, campaigning again in 10m");
    let none = get(&addr, "/leader").await;
    assert_eq!(none.status, 200, "{none:?}");
    assert_eq!(none.json(), serde_json::Value::Null);
    let healthy = get(&addr, "/healthz").await;
    assert_eq!(healthy.status, 200, "{healthy:?}");
    assert_eq!(healthy.json()["state"], "campaigning (a follower)");
    leader.signal(libc::SIGTERM);
    assert_eq!(leader.wait(), 128 + libc::SIGTERM);
}

/// `/leader` answers 503, with the error as JSON, when MongoDB cannot be
/// read: the leader's link to the server is cut (a fault proxy that drops
/// everything); the read gives up after `--connect-timeout`, long before
/// the lease (30 s) could be lost and the command stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_http_answers_503_when_mongodb_cannot_be_read() {
    /// Turns a hang into a failure: the read gives up after 1 s.
    const BOUND: Duration = Duration::from_secs(20);
    let (_rs, proxy, uri) = crate::common::server_behind_proxy().await;
    let mut env = Env::new("cli_http_503");
    env.uri = uri;
    let mut leader = env.spawn(&[
        "--connect-timeout",
        "1s",
        "leader",
        "--name",
        "svc",
        "--http",
        "127.0.0.1:0",
        "--",
        "sh",
        "-c",
        "echo \"leading $MONGO_LEASE_TOKEN\"; exec sleep 60",
    ]);
    let addr = leader.http_addr();
    leader.expect_line("leading");
    let read = get(&addr, "/leader").await;
    assert_eq!(read.status, 200, "{read:?}");

    proxy.blackhole();
    let cut =
        crate::common::within(BOUND, "/leader with the link cut", get(&addr, "/leader")).await;
    assert_eq!(cut.status, 503, "{cut:?}");
    let error = cut.json()["error"].as_str().map(str::to_owned);
    assert!(
        error
            .as_deref()
            .is_some_and(|e| e.contains("MongoDB did not answer")),
        "{cut:?}"
    );
    leader.signal(libc::SIGKILL);
    leader.wait();
}
