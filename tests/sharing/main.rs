//! Sharing a lock collection with other applications: keys of any BSON type,
//! other applications' lock documents (`{_id, ts, aid}`), the
//! delete-on-release compatibility mode, release by owner, the checks
//! `connect` makes on the collection, per-lease TTLs, leases lost to
//! someone else's write, lease documents of ours another application
//! took over in place, and other applications' schemas read by a user's
//! rule. Plain driver calls play the other application.

#[path = "../common/mod.rs"]
mod common;

mod collection_checks;
mod compat_mode;
mod foreign_locks;
mod keys;
mod loss_detection;
mod patterns;
mod read_by_patterns;
mod schemas;
mod taken_over_in_place;
