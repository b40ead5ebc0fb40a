//! The library's test fixture (`tests/common/` at the repository's root,
//! one copy for both packages: a real MongoDB, fresh databases, bounded
//! waits) and what the CLI's tests add to it: the `mongo-lease` binary run
//! by the tests (`cli`) and a tiny HTTP client for `--http` (`http`).
#![allow(dead_code)]

#[path = "../../../tests/common/mod.rs"]
mod fixture;

pub use fixture::*;

pub mod cli;
pub mod http;
