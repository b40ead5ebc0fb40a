//! The deterministic simulation (`mongo_lease::sim`): a hundred and sixty
//! schedules of the real manager over the in-memory twin with seeded
//! faults, each history judged by the checker, in two halves that run side
//! by side. `cargo run --release --example simulate -- --seeds N` runs many
//! more (docs/safety.md).

use std::ops::Range;

/// Runs the schedules of `seeds`; fails with the seeds that broke a
/// property, each explained.
fn no_property_broken(seeds: Range<u64>) {
    let mut failing = Vec::new();
    for seed in seeds {
        let report = mongo_lease::sim::run(seed);
        assert!(report.grants() > 0, "seed {seed} granted nothing");
        if !report.violations.is_empty() {
            eprint!("{}", report.explain(40));
            failing.push(seed);
        }
    }
    assert!(failing.is_empty(), "failing seeds: {failing:?}");
}

#[test]
fn schedules_0_to_80_break_no_property() {
    no_property_broken(0..80);
}

#[test]
fn schedules_80_to_160_break_no_property() {
    no_property_broken(80..160);
}
