//! The store's tests: the store contract, one suite of scenarios run
//! against both stores, and the differential test of the twin against a
//! real `mongod`.

mod contract;
mod differential;

/// The `{_id, value, ttl, obtained_at}` pattern's client, shared with the
/// integration tests.
#[path = "../../../tests/common/pattern2_client.rs"]
mod pattern2_client;
