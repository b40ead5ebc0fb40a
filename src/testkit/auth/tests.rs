use super::*;

#[test]
fn userinfo_is_percent_encoded() {
    assert_eq!(encode_userinfo("root"), "root");
    assert_eq!(encode_userinfo("a-b.c_d~e"), "a-b.c_d~e");
    assert_eq!(encode_userinfo("p@ss:w/rd%"), "p%40ss%3Aw%2Frd%25");
    assert_eq!(encode_userinfo("é"), "%C3%A9");
}
