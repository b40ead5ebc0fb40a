//! The kinds of lease of `mongo-lease exec` against a real `mongod`, in
//! several processes: `--permits N` (a semaphore key), `--shared` (the
//! shared side of a read/write key), `--hold-at-least`, `list` showing each
//! kind, `release --force` of a semaphore key, kind mismatches and bad
//! flags. The commands rendezvous through files they append
//! to under flock(1) and poll; the verdicts read the order of the log, never
//! how long something took.

mod common;
#[path = "cli_kinds/support.rs"]
mod support;

#[path = "cli_kinds/hold.rs"]
mod hold;
#[path = "cli_kinds/input.rs"]
mod input;
#[path = "cli_kinds/list.rs"]
mod list;
#[path = "cli_kinds/semaphore.rs"]
mod semaphore;
#[path = "cli_kinds/shared.rs"]
mod shared;
