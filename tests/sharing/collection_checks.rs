//! What `connect` checks and reports, and per-lease TTLs: TTL indexes of
//! other applications that could delete a held lease, data collections named
//! by mistake (`src/store/mongo/prepare.rs`), `Unreachable` errors that name
//! the driver's cause, and leases stored and renewed with their own TTL.

use std::time::Duration;

use mongo_lease::testkit::Standalone;
use mongo_lease::{Error, LeaseManager, LeaseManagerOptions};
use mongodb::IndexModel;
use mongodb::bson::{DateTime, Document, doc};
use mongodb::options::IndexOptions;

use crate::common::Fixture;

const TTL: Duration = Duration::from_secs(90);

/// Creates a TTL index on `field` with `expire_after`, named `name`, as
/// another application would.
async fn ttl_index(fx: &Fixture, field: &str, expire_after: Duration, name: &str) {
    fx.raw()
        .create_index(
            IndexModel::builder()
                .keys(doc! { field: 1 })
                .options(
                    IndexOptions::builder()
                        .name(name.to_string())
                        .expire_after(expire_after)
                        .build(),
                )
                .build(),
        )
        .await
        .expect("create the other application's index");
}

async fn index_names(fx: &Fixture) -> Vec<String> {
    let mut names = fx.raw().list_index_names().await.expect("list the indexes");
    names.sort();
    names
}

async fn options(fx: &Fixture, heartbeat: Duration) -> LeaseManagerOptions {
    let mut options = fx.options(TTL).await;
    options.heartbeat_interval = Some(heartbeat);
    options
}

fn unusable_reason(result: mongo_lease::Result<LeaseManager>) -> String {
    match result {
        Err(Error::UnusableCollection { reason }) => reason,
        Err(other) => panic!("expected UnusableCollection, got {other:?}"),
        Ok(_) => panic!("expected UnusableCollection, connect succeeded"),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ts_ttl_index_shorter_than_heartbeat_plus_margin_is_refused_naming_it() {
    let fx = Fixture::new("ts_refused").await;
    ttl_index(&fx, "ts", Duration::from_secs(30), "ts_1").await;
    let before = index_names(&fx).await;

    let reason =
        unusable_reason(LeaseManager::connect(options(&fx, Duration::from_secs(40)).await).await);
    assert!(reason.contains("\"ts_1\""), "names the index: {reason}");
    assert!(reason.contains("{ \"ts\": 1 }"), "names the key: {reason}");
    assert!(
        reason.contains("expireAfterSeconds 30"),
        "names expireAfterSeconds: {reason}"
    );
    assert_eq!(index_names(&fx).await, before, "nothing was created");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ts_ttl_index_longer_than_heartbeat_plus_margin_is_accepted() {
    let fx = Fixture::new("ts_accepted").await;
    ttl_index(&fx, "ts", Duration::from_secs(30), "ts_1").await;

    let manager = LeaseManager::connect(options(&fx, Duration::from_secs(3)).await)
        .await
        .expect("a 30 s index outlives a 3 s heartbeat plus the 9 s margin");
    let lease = manager.acquire("k").await.expect("acquire");
    assert_eq!(
        fx.doc("k").await.get_i64("tok").ok(),
        Some(lease.fencing_token() as i64)
    );
    assert!(!lease.release().await.expect("release").was_lost());
    manager.shutdown().await.expect("shutdown");
}

/// An accepted TTL index on `ts` shorter than the TTL shortens the local
/// deadline to *last renewal + expireAfterSeconds − margin*: 30 s − 9 s =
/// 21 s after the acquire began, not the TTL's 90 s − 9 s = 81 s.
#[tokio::test(flavor = "multi_thread")]
async fn an_accepted_ts_ttl_index_shortens_the_local_deadline() {
    let fx = Fixture::new("ts_deadline").await;
    ttl_index(&fx, "ts", Duration::from_secs(30), "ts_1").await;
    let manager = LeaseManager::connect(options(&fx, Duration::from_secs(3)).await)
        .await
        .expect("accepted");
    let capped = Duration::from_secs(30) - TTL / 10 - crate::common::clock_skew(TTL);
    let before = tokio::time::Instant::now();
    let lease = manager.acquire("k").await.expect("acquire");
    let deadline = lease.status().deadline().expect("held");
    let after = tokio::time::Instant::now();
    assert!(
        deadline >= before + capped && deadline <= after + capped,
        "the deadline is {:?} after the acquire began, not {capped:?}",
        deadline - before
    );
    assert!(!lease.release().await.expect("release").was_lost());
    manager.shutdown().await.expect("shutdown");
}

/// `hold_at_least` longer than another application's TTL index on `ts`
/// (which would delete the key's document before then) is refused before
/// any round trip, naming both; as long as the index is accepted.
#[tokio::test(flavor = "multi_thread")]
async fn hold_at_least_longer_than_a_ts_ttl_index_is_refused() {
    let fx = Fixture::new("ts_hold").await;
    ttl_index(&fx, "ts", Duration::from_secs(30), "ts_1").await;
    // A minimum hold needs the released document kept, which `connect`
    // would not choose beside the insert pattern's TTL index.
    let mut keep = options(&fx, Duration::from_secs(3)).await;
    keep.release_mode = Some(mongo_lease::ReleaseMode::Keep);
    let manager = LeaseManager::connect(keep).await.expect("accepted");
    let error = manager
        .try_acquire("k")
        .hold_at_least(Duration::from_secs(31))
        .await
        .expect_err("longer than the index");
    assert!(error.is_invalid_input(), "{error:?}");
    assert!(
        error.to_string().contains(
            "hold_at_least (31s) is longer than the TTL index on `ts` (30s), which would \
             delete the key's document before then"
        ),
        "{error}"
    );
    assert!(
        fx.raw().find_one(doc! {}).await.unwrap().is_none(),
        "nothing was written"
    );
    let lease = manager
        .try_acquire("k")
        .hold_at_least(Duration::from_secs(30))
        .await
        .expect("as long as the index")
        .expect("the key is free");
    assert!(!lease.release().await.expect("release").was_lost());
    manager.shutdown().await.expect("shutdown");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ttl_index_on_acq_is_refused_whatever_its_expiry() {
    let fx = Fixture::new("acq_refused").await;
    ttl_index(&fx, "acq", Duration::from_secs(86_400), "acq_1").await;
    let before = index_names(&fx).await;

    let reason =
        unusable_reason(LeaseManager::connect(options(&fx, Duration::from_secs(3)).await).await);
    assert!(reason.contains("\"acq_1\""), "names the index: {reason}");
    assert!(reason.contains("no renewal moves"), "says why: {reason}");
    assert_eq!(index_names(&fx).await, before, "nothing was created");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_data_collection_is_refused_and_its_documents_survive() {
    let mut fx = Fixture::new("data_refused").await;
    fx.collection = "workitem".into();
    let user_doc = doc! {
        "_id": "order-1",
        "state": "open",
        "exp": DateTime::from_millis(0),
    };
    fx.raw()
        .insert_one(user_doc.clone())
        .await
        .expect("insert the user's document");

    let reason = unusable_reason(LeaseManager::connect(fx.options(TTL).await).await);
    assert!(
        reason.contains("lock collection"),
        "says what was expected: {reason}"
    );
    assert!(
        reason.contains("\"order-1\""),
        "names the document's _id: {reason}"
    );
    assert!(
        !reason.contains("open"),
        "does not show its contents: {reason}"
    );
    assert_eq!(
        index_names(&fx).await,
        vec!["_id_".to_string()],
        "no index created"
    );
    let stored: Vec<Document> = {
        use futures::TryStreamExt;
        fx.raw()
            .find(doc! {})
            .await
            .expect("find")
            .try_collect()
            .await
            .expect("read")
    };
    assert_eq!(
        stored,
        vec![user_doc],
        "the user's document survives untouched"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_collection_of_the_patterns_lock_documents_is_accepted() {
    let fx = Fixture::new("pattern_accepted").await;
    fx.raw()
        .insert_many(vec![
            doc! { "_id": "a", "ts": DateTime::now(), "aid": "other-app" },
            doc! { "_id": "b", "ts": DateTime::now(), "aid": "other-app", "extra": 1 },
            doc! { "_id": "c" },
        ])
        .await
        .expect("insert the other application's locks");

    let manager = LeaseManager::connect(fx.options(TTL).await)
        .await
        .expect("a collection of lock documents is accepted");
    assert!(
        index_names(&fx)
            .await
            .contains(&"mongo_lease_gc".to_string()),
        "the TTL index was created"
    );
    manager.shutdown().await.expect("shutdown");
}

// ----- errors that name the cause ---------------------------------------------

/// The manager's operation timeout in the unreachable cases; the clients'
/// server-selection timeout is shorter, so the driver's error comes first.
const OPERATION_TIMEOUT: Duration = Duration::from_secs(3);
const SELECTION_TIMEOUT: Duration = Duration::from_secs(2);

/// Connects a manager through a client built from `client_options` with a
/// short server-selection timeout, and returns the `Unreachable` error.
async fn unreachable(
    mut client_options: mongodb::options::ClientOptions,
    selection_timeout: Option<Duration>,
) -> Error {
    client_options.server_selection_timeout = selection_timeout;
    let client = mongodb::Client::with_options(client_options).expect("client");
    let options = LeaseManagerOptions::builder()
        .database(client.database("unreachable"))
        .collection("workitem.lock")
        .operation_timeout(OPERATION_TIMEOUT)
        .build();
    let error = match LeaseManager::connect(options).await {
        Err(e @ Error::Unreachable { .. }) => e,
        Err(other) => panic!("expected Unreachable, got {other:?}"),
        Ok(_) => panic!("expected Unreachable, connect succeeded"),
    };
    client.shutdown().await;
    error
}

/// A loopback port nothing listens on (bound, then closed), below the
/// ephemeral ranges (Linux 32768-60999, BSD/macOS 49152-65535): a port
/// from `127.0.0.1:0` could be handed out again at once, to a `mongod`
/// that a test running alongside starts (the test kit picks its ports
/// that way), and the connect would then succeed.
fn refused_port() -> u16 {
    const FIRST: u16 = 20_000;
    const COUNT: u16 = 10_000;
    // Another test process may probe the same ports: start somewhere else.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let start = (std::process::id() ^ nanos) % u32::from(COUNT);
    (0..u32::from(COUNT))
        .map(|i| FIRST + ((start + i) % u32::from(COUNT)) as u16)
        .find(|&port| std::net::TcpListener::bind(("127.0.0.1", port)).is_ok())
        .expect("a free loopback port below the ephemeral range")
}

fn has_driver_source(error: &Error) -> bool {
    std::error::Error::source(error)
        .and_then(|s| s.downcast_ref::<mongodb::error::Error>())
        .is_some()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_port_gives_unreachable_naming_the_refusal() {
    let uri = format!("mongodb://127.0.0.1:{}/", refused_port());
    let options = mongodb::options::ClientOptions::parse(&uri)
        .await
        .expect("uri");
    let error = unreachable(options, Some(SELECTION_TIMEOUT)).await;
    let text = error.to_string();
    assert!(
        text.starts_with("MongoDB did not answer within 3s: no server could be selected:"),
        "{text}"
    );
    assert!(
        text.contains("Connection refused"),
        "names the cause: {text}"
    );
    assert!(
        has_driver_source(&error),
        "keeps the driver's error: {error:?}"
    );
    assert!(
        format!("{error:?}").contains("Connection refused"),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_wrong_replica_set_name_gives_unreachable_naming_the_sets() {
    let mut options = mongodb::options::ClientOptions::parse(crate::common::uri())
        .await
        .expect("uri");
    let real = options
        .repl_set_name
        .clone()
        .expect("the test deployment is a replica set");
    options.repl_set_name = Some(format!("not-{real}"));
    let error = unreachable(options, Some(SELECTION_TIMEOUT)).await;
    let text = error.to_string();
    assert!(text.contains("no server could be selected"), "{text}");
    assert!(
        text.contains(&format!("not-{real}")),
        "names the expected set: {text}"
    );
    assert!(
        has_driver_source(&error),
        "keeps the driver's error: {error:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_replica_set_uri_to_a_standalone_gives_unreachable_naming_the_set() {
    // A `mongod` without `--replSet`, killed on drop.
    let standalone = Standalone::start().await.expect("a standalone mongod");
    let uri = format!("mongodb://{}/?replicaSet=rs0", standalone.host());
    let options = mongodb::options::ClientOptions::parse(&uri)
        .await
        .expect("uri");
    let error = unreachable(options, Some(SELECTION_TIMEOUT)).await;
    let text = error.to_string();
    assert!(text.contains("no server could be selected"), "{text}");
    assert!(text.contains("rs0"), "names the expected set: {text}");
    assert!(text.contains("standalone server"), "{text}");
    assert!(
        has_driver_source(&error),
        "keeps the driver's error: {error:?}"
    );
}

/// With the driver's default server-selection timeout (30 s, longer than the
/// operation timeout) the cause is not known yet: the error says how to see it.
#[tokio::test(flavor = "multi_thread")]
async fn without_a_short_selection_timeout_the_error_says_how_to_see_the_cause() {
    let uri = format!("mongodb://127.0.0.1:{}/", refused_port());
    let options = mongodb::options::ClientOptions::parse(&uri)
        .await
        .expect("uri");
    let error = unreachable(options, None).await;
    let text = error.to_string();
    assert!(text.contains("serverSelectionTimeoutMS"), "{text}");
    assert!(!has_driver_source(&error), "{error:?}");
}

// ----- per-lease TTL ------------------------------------------------------------

/// `exp − ts` of the stored lock document of `key`.
async fn stored_ttl(fx: &Fixture, key: &str) -> Duration {
    let doc = fx.doc(key).await;
    let ms = |name: &str| doc.get_datetime(name).expect(name).timestamp_millis();
    Duration::from_millis((ms("exp") - ms("ts")) as u64)
}

/// The TTL (ms added to `$$NOW` for `exp`) and the keys of a renewal
/// command, or `None` for any other command.
fn renewal(command: &Document) -> Option<(i64, Vec<String>)> {
    let keys = crate::common::renewal::renewed_keys(command)?;
    let ttl_ms = crate::common::renewal::renewal_ttl_ms(command)?;
    let mut keys: Vec<String> = keys
        .iter()
        .map(|k| k.as_str().expect("string keys").to_string())
        .collect();
    keys.sort();
    Some((ttl_ms, keys))
}

#[tokio::test(flavor = "multi_thread")]
async fn each_lease_stores_its_own_ttl_and_renews_in_one_update_many_per_ttl() {
    let fx = Fixture::new("lease_ttl").await;
    let manager_ttl = Duration::from_secs(3);
    let long_ttl = Duration::from_secs(6);
    let (options, log) = fx.monitored_options(manager_ttl, "").await;
    let manager = LeaseManager::connect(options).await.expect("connect");
    let mut leases = Vec::new();
    for i in 0..3 {
        leases.push(manager.acquire(format!("m{i}")).await.expect("acquire"));
        let lease = manager
            .acquire(format!("l{i}"))
            .ttl(long_ttl)
            .await
            .expect("acquire with a TTL");
        assert_eq!(lease.ttl(), long_ttl);
        leases.push(lease);
    }
    for i in 0..3 {
        assert_eq!(stored_ttl(&fx, &format!("m{i}")).await, manager_ttl);
        assert_eq!(stored_ttl(&fx, &format!("l{i}")).await, long_ttl);
    }
    // From here on every heartbeat finds all six leases held.
    log.clear();

    let renewals = || -> Vec<(i64, Vec<String>)> {
        log.all()
            .iter()
            .filter(|(name, _)| name == "update")
            .filter_map(|(_, command)| renewal(command))
            .collect()
    };
    // Three heartbeats (1 s each); the bound only turns a hang into a failure.
    crate::common::eventually("three heartbeats renewed", Duration::from_secs(60), || {
        let n = renewals().iter().filter(|(ms, _)| *ms == 3_000).count();
        async move { n >= 3 }
    })
    .await;
    let short_keys: Vec<String> = (0..3).map(|i| format!("m{i}")).collect();
    let long_keys: Vec<String> = (0..3).map(|i| format!("l{i}")).collect();
    let mut seen = renewals();
    // On a slow enough machine a heartbeat may fall among the acquisitions:
    // its commands (one per TTL) renew the leases held by then, and may be
    // logged after the clear. Nothing else may renew fewer leases.
    let partial = |(_, keys): &(i64, Vec<String>)| keys.len() < 3;
    let early: Vec<_> = seen.iter().filter(|r| partial(r)).cloned().collect();
    assert!(early.len() <= 2, "renewals of some leases only: {early:?}");
    for (ttl_ms, keys) in &early {
        let all = if *ttl_ms == 3_000 {
            &short_keys
        } else {
            &long_keys
        };
        assert!(keys.iter().all(|k| all.contains(k)), "{ttl_ms}: {keys:?}");
    }
    seen.retain(|r| !partial(r));
    for (ttl_ms, keys) in &seen {
        match ttl_ms {
            3_000 => assert_eq!(keys, &short_keys, "one command renews every 3 s lease"),
            6_000 => assert_eq!(keys, &long_keys, "one command renews every 6 s lease"),
            other => panic!("a renewal to {other} ms: {keys:?}"),
        }
    }
    let short = seen.iter().filter(|(ms, _)| *ms == 3_000).count();
    let long = seen.len() - short;
    assert!(short.abs_diff(long) <= 1, "{short} vs {long} renewals");
    for i in 0..3 {
        assert_eq!(stored_ttl(&fx, &format!("m{i}")).await, manager_ttl);
        assert_eq!(stored_ttl(&fx, &format!("l{i}")).await, long_ttl);
    }
    assert!(leases.iter().all(|l| !l.status().is_lost()));
    manager.shutdown().await.expect("shutdown");
}
