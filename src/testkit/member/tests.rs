use super::*;

#[test]
fn ports_are_distinct() {
    let ports = pick_ports(5).unwrap();
    let mut dedup = ports.clone();
    dedup.sort_unstable();
    dedup.dedup();
    assert_eq!(dedup.len(), 5);
}
