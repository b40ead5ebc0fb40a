//! The `mongod` a benchmark runs against: `MONGODB_URI` if set (a replica
//! set), else a throwaway single-node replica set started by the test kit.

use mongo_lease::testkit::{ReplicaSet, ReplicaSetOptions};

/// The URI to use, and the throwaway replica set behind it, if one was
/// started (keep it alive as long as the URI is used; dropping it stops it).
///
/// # Panics
///
/// If no `MONGODB_URI` is set and the throwaway `mongod` cannot start: a
/// benchmark has nothing to measure then.
pub async fn mongod() -> (Option<ReplicaSet>, String) {
    let (replica_set, uri) = match std::env::var("MONGODB_URI").ok().filter(|u| !u.is_empty()) {
        Some(uri) => (None, uri),
        None => {
            let rs = ReplicaSet::start(ReplicaSetOptions::default())
                .await
                .expect("start a throwaway mongod (set MONGODB_URI to use your own)");
            let uri = rs.uri();
            (Some(rs), uri)
        }
    };
    eprintln!("mongod: {uri}");
    (replica_set, uri)
}
