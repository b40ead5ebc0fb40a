//! The lease manager against a real `mongod`, one module per behaviour.
//!
//! One test binary rather than one per file: the tests wait on the server
//! and on timers far more than on the CPU, so in one binary they overlap
//! (four at a time, `.cargo/config.toml`), share one throwaway replica
//! set, and link once. Larger topics keep binaries of their own
//! (`document_lease`, `election`, `faults`, `kinds`, `misuse`, `sharing`),
//! and so does `spans`: its subscriber is its thread's own, and tracing
//! caches a callsite's interest for the whole process, so other tests
//! reaching the same callsites without a subscriber can hide its spans.

#[path = "../common/mod.rs"]
mod common;

mod acquire;
mod acquire_payload;
mod clock_skew;
mod deadline;
mod duration;
mod events;
mod exclusion;
mod handed_registrations;
mod handoff;
mod health;
mod late_writes;
mod leader_transitions;
mod lock_delay;
mod metrics;
mod multi_key;
mod queue;
mod reentrancy;
mod renewal;
mod reread;
mod revocation;
mod shutdown;
mod takeover;
mod waiters;
