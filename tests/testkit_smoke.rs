//! Smoke tests for `mongo_lease::testkit` (real mongod processes).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mongo_lease::testkit::{self, MemberState, ReplicaSet, ReplicaSetOptions, TestkitError};
use mongodb::bson::{Document, doc};

fn proc_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

#[tokio::test]
async fn single_member_roundtrip_and_cleanup() {
    let rs = ReplicaSet::start(ReplicaSetOptions::default())
        .await
        .unwrap();
    eprintln!(
        "1 member: healthy after {:?} ({})",
        rs.startup_time(),
        rs.uri()
    );
    assert_eq!(rs.members().len(), 1);
    assert!(rs.uri().ends_with("/?replicaSet=rs0"), "{}", rs.uri());
    assert!(rs.member_uri(0).ends_with("directConnection=true"));

    let client = rs.client().await.unwrap();
    let coll = client
        .database(&testkit::unique_name("smoke"))
        .collection::<Document>("docs");
    coll.insert_one(doc! { "_id": 1, "x": "hello" })
        .await
        .unwrap();
    let got = coll.find_one(doc! { "_id": 1 }).await.unwrap().unwrap();
    assert_eq!(got.get_str("x").unwrap(), "hello");

    let pids: Vec<u32> = rs.members().iter().map(|m| m.pid().unwrap()).collect();
    let dirs: Vec<PathBuf> = rs.members().iter().map(|m| m.dbpath().to_owned()).collect();
    assert!(pids.iter().all(|&p| proc_exists(p)));
    assert!(dirs.iter().all(|d| d.join("mongod.log").exists()));
    drop(client);
    drop(rs);
    for pid in pids {
        assert!(
            !proc_exists(pid),
            "mongod pid {pid} still exists after drop"
        );
    }
    for dir in dirs {
        assert!(!dir.exists(), "{} still exists after drop", dir.display());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_members_reach_writable_primary() {
    let rs = ReplicaSet::start(ReplicaSetOptions::default().members(3))
        .await
        .unwrap();
    eprintln!(
        "3 members: healthy after {:?} ({})",
        rs.startup_time(),
        rs.uri()
    );
    assert_eq!(rs.members().len(), 3);
    let primary = rs.wait_for_primary(Duration::from_secs(5)).await.unwrap();
    eprintln!("3 members: primary is member {primary}");

    let client = rs.client().await.unwrap();
    let coll = client
        .database(&testkit::unique_name("smoke"))
        .collection::<Document>("docs");
    coll.insert_one(doc! { "x": 1 })
        .with_options(
            mongodb::options::InsertOneOptions::builder()
                .write_concern(mongodb::options::WriteConcern::majority())
                .build(),
        )
        .await
        .unwrap();
    // While the runtime still runs (`tests/common`'s `shut_down`).
    client.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_kill_restart_step_down() {
    let rs = ReplicaSet::start(ReplicaSetOptions::default().members(3))
        .await
        .unwrap();
    let old = rs.wait_for_primary(Duration::from_secs(10)).await.unwrap();
    let old_pid = rs.members()[old].pid().unwrap();

    let t = Instant::now();
    rs.kill(old).await.unwrap();
    assert!(!proc_exists(old_pid));
    assert!(rs.members()[old].pid().is_none());
    assert!(!rs.members()[old].is_running());
    rs.kill(old).await.unwrap(); // idempotent
    let new = rs.wait_for_primary(Duration::from_secs(30)).await.unwrap();
    assert_ne!(old, new);
    eprintln!("failover: new primary {new} after {:?}", t.elapsed());

    let t = Instant::now();
    rs.restart(old).await.unwrap();
    assert!(rs.members()[old].is_running());
    eprintln!("restart of member {old} took {:?}", t.elapsed());

    // Which member is primary here is not fixed: after the restart, member
    // 0's priority can take the primary role back at any moment, even between
    // this wait and the step-down. What holds is that the member that stepped
    // down is not the primary elected after it.
    rs.wait_for_primary(Duration::from_secs(30)).await.unwrap();
    let t = Instant::now();
    let stepped = rs.step_down_for(Duration::from_secs(5)).await.unwrap();
    let after = rs.wait_for_primary(Duration::from_secs(30)).await.unwrap();
    assert_ne!(after, stepped);
    eprintln!("step down: new primary {after} after {:?}", t.elapsed());

    assert!(matches!(
        rs.kill(7).await,
        Err(testkit::TestkitError::NoSuchMember { index: 7, len: 3 })
    ));
}

#[tokio::test]
async fn shared_uri_current_thread() {
    let t = Instant::now();
    let uri = testkit::shared_uri();
    eprintln!(
        "shared_uri (current_thread) returned after {:?}: {uri}",
        t.elapsed()
    );
    assert_eq!(uri, testkit::shared_uri());
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    let coll = client
        .database(&testkit::unique_name("shared"))
        .collection::<Document>("docs");
    coll.insert_one(doc! { "a": 1 }).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_uri_multi_thread() {
    let t = Instant::now();
    let uri = testkit::shared_uri();
    eprintln!(
        "shared_uri (multi_thread) returned after {:?}: {uri}",
        t.elapsed()
    );
    let client = mongodb::Client::with_uri_str(&uri).await.unwrap();
    client
        .database("admin")
        .run_command(doc! { "ping": 1 })
        .await
        .unwrap();
    // While the runtime still runs (`tests/common`'s `shut_down`).
    client.shutdown().await;
}

#[test]
fn unique_names_differ() {
    let a = testkit::unique_name("t");
    let b = testkit::unique_name("t");
    assert_ne!(a, b);
    assert!(a.starts_with("t_"));
    assert!(a.len() < 40, "{a}");
}

#[test]
fn mongod_path_is_found() {
    let p = testkit::mongod_path().unwrap();
    assert!(p.is_file(), "{}", p.display());
}

/// Compile-time check: the handles and futures can cross threads.
#[allow(dead_code)]
fn futures_and_handles_are_send() {
    fn send_sync<T: Send + Sync>(_: &T) {}
    fn send<T: Send>(_: T) {}
    send(ReplicaSet::start(ReplicaSetOptions::default()));
    let rs: Option<ReplicaSet> = None;
    if let Some(rs) = &rs {
        send_sync(rs);
        send(rs.kill(0));
        send(rs.restart(0));
        send(rs.step_down());
        send(rs.wait_for_primary(Duration::from_secs(1)));
        send(rs.client());
    }
}

/// `step_down_for` right after a step-down: the next call finds no primary
/// (an election is in progress), or a primary whose secondaries are not
/// caught up yet, or member 0 taking over again; it must wait and retry
/// rather than give up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn step_down_right_after_a_step_down() {
    let rs = ReplicaSet::start(ReplicaSetOptions::default().members(3))
        .await
        .unwrap();
    let t = Instant::now();
    for round in 0..5 {
        let r = Instant::now();
        let stepped = rs
            .step_down_for(Duration::from_secs(2))
            .await
            .unwrap_or_else(|e| panic!("step-down {round}: {e}"));
        eprintln!(
            "step-down {round}: member {stepped} after {:?}",
            r.elapsed()
        );
    }
    let primary = rs.wait_for_primary(Duration::from_secs(30)).await.unwrap();
    eprintln!(
        "5 back-to-back step-downs took {:?}; primary now member {primary}",
        t.elapsed()
    );
}

/// Giving up says what was seen: a single member stepped down for 60 s
/// has no primary, and a short bound expires naming its state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_primary_error_says_what_was_seen() {
    let rs = ReplicaSet::start(
        ReplicaSetOptions::default().primary_timeout(Duration::from_millis(1500)),
    )
    .await
    .unwrap();
    assert_eq!(rs.step_down().await.unwrap(), 0);

    let states = rs.member_states().await.unwrap();
    assert_eq!(states.len(), 1);
    assert!(
        matches!(states[0].state, MemberState::Secondary { .. }),
        "{states:?}"
    );

    let t = Instant::now();
    let err = rs.step_down().await.unwrap_err();
    let text = err.to_string();
    eprintln!(
        "step-down without a primary, after {:?}: {text}",
        t.elapsed()
    );
    match &err {
        TestkitError::NoPrimary {
            what,
            waited,
            members,
            ..
        } => {
            assert_eq!(what, "replSetStepDown");
            assert!(*waited >= Duration::from_millis(1500), "{waited:?}");
            assert_eq!(members.len(), 1);
            assert_eq!(members[0].index, 0);
            assert_eq!(members[0].port, rs.members()[0].port());
            assert!(
                matches!(members[0].state, MemberState::Secondary { primary: None }),
                "{members:?}"
            );
        }
        other => panic!("expected NoPrimary, got {other:?}"),
    }
    let port = rs.members()[0].port();
    assert!(
        text.contains(&format!(
            "member 0 (port {port}): SECONDARY (sees no primary)"
        )),
        "{text}"
    );

    let err = rs
        .wait_for_primary(Duration::from_millis(500))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, TestkitError::NoPrimary { what, .. } if what == "wait_for_primary"),
        "{err}"
    );

    // A killed member is reported as such.
    rs.kill(0).await.unwrap();
    let states = rs.member_states().await.unwrap();
    assert_eq!(states[0].state, MemberState::NotRunning);
    assert!(rs.primary().await.is_none());
}

/// A member whose port is taken while it is down: `restart` tries again
/// a few times, then reports the conflict; once the port is free it works.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_on_a_taken_port() {
    let rs = ReplicaSet::start(ReplicaSetOptions::default())
        .await
        .unwrap();
    rs.kill(0).await.unwrap();
    let port = rs.members()[0].port();
    let squatter = std::net::TcpListener::bind(("127.0.0.1", port)).unwrap();
    let t = Instant::now();
    let err = rs.restart(0).await.unwrap_err();
    eprintln!(
        "restart on a taken port gave up after {:?}: {err}",
        t.elapsed()
    );
    assert!(
        matches!(
            err,
            TestkitError::PortConflict {
                member: 0,
                attempts: 5
            }
        ),
        "{err}"
    );
    assert!(!rs.members()[0].is_running());
    drop(squatter);
    rs.restart(0).await.unwrap();
    assert_eq!(
        rs.wait_for_primary(Duration::from_secs(30)).await.unwrap(),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standalone_answers_without_a_replica_set_and_is_removed_on_drop() {
    let server = testkit::Standalone::start().await.unwrap();
    assert_eq!(
        server.uri(),
        format!(
            "mongodb://127.0.0.1:{}/?directConnection=true",
            server.port()
        )
    );
    assert_eq!(server.host(), format!("127.0.0.1:{}", server.port()));
    let client = mongodb::Client::with_uri_str(server.uri()).await.unwrap();
    let hello = client
        .database("admin")
        .run_command(doc! { "hello": 1 })
        .await
        .unwrap();
    assert!(hello.get_bool("isWritablePrimary").unwrap(), "{hello}");
    assert!(
        hello.get("setName").is_none(),
        "not a replica set member: {hello}"
    );
    let coll = client
        .database(&testkit::unique_name("smoke"))
        .collection::<Document>("docs");
    coll.insert_one(doc! { "_id": 1 }).await.unwrap();
    assert_eq!(coll.count_documents(doc! {}).await.unwrap(), 1);
    client.shutdown().await;

    let pid = server.pid().unwrap();
    let dir = server.dbpath().to_owned();
    assert!(proc_exists(pid));
    assert!(server.log_path().exists());
    drop(server);
    assert!(
        !proc_exists(pid),
        "mongod pid {pid} still exists after drop"
    );
    assert!(!dir.exists(), "{} still exists after drop", dir.display());
}
