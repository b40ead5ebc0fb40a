//! Smoke tests for `mongo_lease::testkit` (real mongod processes).

use std::path::PathBuf;
use std::time::{Duration, Instant};

use mongo_lease::testkit::{self, ReplicaSet, ReplicaSetOptions};
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

    let p = rs.wait_for_primary(Duration::from_secs(30)).await.unwrap();
    let t = Instant::now();
    let stepped = rs.step_down_for(Duration::from_secs(5)).await.unwrap();
    assert_eq!(stepped, p);
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
