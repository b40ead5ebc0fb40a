use super::*;

fn outcomes(read: Vec<Read>, modified: u64) -> Vec<&'static str> {
    release_outcomes(read, modified)
        .iter()
        .map(|o| match o {
            LightRelease::Released => "released",
            LightRelease::NotApplied => "general",
            LightRelease::Failed(_) => "other",
        })
        .collect()
}

#[test]
fn a_lease_still_held_is_left_to_the_general_release() {
    use Read::*;
    assert_eq!(
        outcomes(vec![Gone, Kept, Gone], 2),
        ["released", "general", "released"]
    );
}

#[test]
fn a_lease_gone_counts_as_released_only_if_the_modified_count_covers_every_one() {
    use Read::*;
    // Released by the batch (one of them taken since): it modified 3.
    assert_eq!(
        outcomes(vec![Gone, Gone, Gone], 3),
        ["released", "released", "released"]
    );
    // One lost before the batch (force released, released by owner id
    // or taken): it modified 2, and which one is unknown: all reported
    // lost, never a loss reported as a release.
    assert_eq!(
        outcomes(vec![Gone, Gone, Gone], 2),
        ["general", "general", "general"]
    );
    assert_eq!(outcomes(vec![Gone, Kept], 0), ["general", "general"]);
    assert_eq!(outcomes(vec![Gone, Kept], 1), ["released", "general"]);
}
