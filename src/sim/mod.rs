//! Deterministic simulation of the real manager (feature `sim`): the actor
//! and its handles run on one thread under tokio's paused clock, over the
//! in-memory twin of the store with faults drawn from a seed, and every
//! random choice of the library comes from that seed, so a schedule
//! replays from its number. What the holders see is recorded as a
//! [`History`](history::History) and judged by the [`checker`].

pub mod checker;
pub mod history;
