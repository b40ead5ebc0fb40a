#[test]
fn a_seed_replays_the_same_history() {
    for seed in [1, 2] {
        let (a, b) = (super::run(seed), super::run(seed));
        assert!(a.grants() > 0, "{}", a.plan);
        let (a, b) = (a.history.entries(), b.history.entries());
        if let Some(i) = (0..a.len().min(b.len())).find(|i| a[*i] != b[*i]) {
            panic!(
                "seed {seed} ran two ways from entry {i}:\n{}\n{}",
                a[i], b[i]
            );
        }
        assert_eq!(a.len(), b.len(), "seed {seed}");
    }
}
