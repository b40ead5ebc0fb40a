//! The memory a held lease costs: the sizes of the per-lease structures,
//! held to a budget (the process-wide figure, RSS per held lease, is
//! measured by `benches/memory.rs`).

use std::mem::size_of;

use super::super::command::PlacedKey;
use super::super::{Held, KeyState};
use crate::key::LeaseKey;
use crate::lease::Lease;
use crate::status::LeaseState;

/// Each structure a held lease keeps, its size today and its budget in
/// bytes: the actor's per-key state (boxed in `keys`, whose empty buckets
/// hold a pointer, with the key's first held lease inline), the held lease,
/// the caller's `Lease` and the state both share. A key is one pointer, so
/// every copy of it (the map, the deadline heap, the `Lease`, the renewal
/// batches) costs 8 bytes.
#[test]
fn per_lease_structures_stay_within_their_byte_budget() {
    let budgets = [
        ("LeaseKey", size_of::<LeaseKey>(), 8),
        ("PlacedKey", size_of::<PlacedKey>(), 16),
        // Its box is one 240-byte malloc chunk (glibc's chunks are the
        // size + 8, rounded up to 16); at 240 it took one of 256. The
        // held lease inline costs its size + 8 (smallvec's `union`).
        ("KeyState", size_of::<KeyState>(), 232),
        (
            "a key's entry in the actor's table",
            size_of::<(PlacedKey, Box<KeyState>)>(),
            24,
        ),
        ("Held", size_of::<Held>(), 112),
        ("Lease", size_of::<Lease>(), 120),
        ("LeaseState", size_of::<LeaseState>(), 80),
    ];
    for (name, size, budget) in budgets {
        println!("{name}: {size} bytes (budget {budget})");
    }
    let over: Vec<_> = budgets
        .iter()
        .filter(|(_, size, budget)| size > budget)
        .collect();
    assert!(over.is_empty(), "over budget: {over:?}");
}
