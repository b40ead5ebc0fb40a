//! The store's tests: the store contract, one suite of scenarios run
//! against both stores.

mod contract;
mod differential;
