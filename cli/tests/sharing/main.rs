//! Sharing a lock collection with other applications, from the command
//! line: other applications' lock documents (`exec --no-wait`, `list`,
//! `release --force`), release by owner id, keys of any BSON type as
//! Extended JSON. Plain driver calls play the other application. The
//! library's side of each: `tests/sharing/`.

#[path = "../common/mod.rs"]
mod common;

mod compat_mode;
mod foreign_locks;
mod foreign_rule;
mod keys;
