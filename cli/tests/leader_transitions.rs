//! `leader --http`'s `/leader` counts the leader transitions (`transitions`),
//! against a real `mongod`: a leader in this process, then `mongo-lease
//! leader` in another, handed leadership when the first resigns.

mod common;

use std::time::Duration;

use common::cli::Env;
use common::http::get;
use mongo_lease::{Election, ReleaseOutcome};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leader_http_counts_the_transitions_of_leadership() {
    let env = Env::new("cli_leader_transitions");
    let manager = env.manager(Duration::from_secs(30)).await;
    let election = Election::new(&manager, "svc").unwrap();
    let first = election.campaign().await.unwrap();
    let mut alpha = env.spawn(&[
        "--owner-id",
        "alpha",
        "leader",
        "--name",
        "svc",
        "--http",
        "127.0.0.1:0",
        "--",
        "sh",
        "-c",
        "echo leading; exec sleep 60",
    ]);
    let addr = alpha.http_addr();
    env.wait_for_waiting_mark("svc").await;
    let leader = get(&addr, "/leader").await.json();
    assert_eq!(leader["owner_id"], manager.owner_id(), "{leader}");
    assert_eq!(leader["transitions"], 0, "the first leader: {leader}");

    assert_eq!(first.resign().await.unwrap(), ReleaseOutcome::Released);
    alpha.expect_line("leading");
    let leader = get(&addr, "/leader").await.json();
    assert_eq!(leader["owner_id"], "alpha", "{leader}");
    assert_eq!(leader["transitions"], 1, "{leader}");
    assert_eq!(
        election.leader().await.unwrap().unwrap().transitions,
        1,
        "as the library reads it"
    );
    alpha.signal(libc::SIGTERM);
    assert_eq!(alpha.wait(), 128 + libc::SIGTERM);
    manager.shutdown().await.unwrap();
}
