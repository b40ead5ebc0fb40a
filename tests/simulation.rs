//! The deterministic simulation (`mongo_lease::sim`): a few hundred
//! schedules of the real manager over the in-memory twin with seeded
//! faults, each history judged by the checker. `cargo run --release
//! --example simulate -- --seeds N` runs many more.

#[test]
fn two_hundred_and_fifty_schedules_break_no_property() {
    let mut failing = Vec::new();
    for seed in 0..250 {
        let report = mongo_lease::sim::run(seed);
        assert!(report.grants() > 0, "seed {seed} granted nothing");
        if !report.violations.is_empty() {
            eprint!("{}", report.explain(40));
            failing.push(seed);
        }
    }
    assert!(failing.is_empty(), "failing seeds: {failing:?}");
}
