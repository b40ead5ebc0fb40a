use super::tail_lines;

#[test]
fn tail() {
    assert_eq!(tail_lines("a\nb\nc\n", 2), "b\nc");
    assert_eq!(tail_lines("a", 5), "a");
    assert_eq!(tail_lines("", 5), "");
}
