//! Bad input and misuse: unreachable servers, wrong credentials, unusable
//! lock collections, documents of foreign layout, 10 000 keys in one manager,
//! unicode and very long keys, and credentials kept out of errors and logs.
//! Each case must end in a clear error or correct behaviour, within a bounded
//! wait, without a panic, and without losing or corrupting anything.

#[path = "../common/mod.rs"]
mod common;

mod credentials;
mod foreign_documents;
mod many_keys;
mod support;
mod unicode_and_long_keys;
mod unreachable_servers;
mod unusable_collections;
