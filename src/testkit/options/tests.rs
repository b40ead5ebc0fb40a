use super::*;

#[test]
fn options_validation() {
    assert!(ReplicaSetOptions::default().validate().is_ok());
    assert!(ReplicaSetOptions::default().members(0).validate().is_err());
    assert!(ReplicaSetOptions::default().members(51).validate().is_err());
    assert!(
        ReplicaSetOptions::default()
            .set_name("")
            .validate()
            .is_err()
    );
    assert!(
        ReplicaSetOptions::default()
            .set_name("a/b")
            .validate()
            .is_err()
    );
    assert!(
        ReplicaSetOptions::default()
            .members(3)
            .env("TZ", "UTC")
            .member_env(2, "TZ", "UTC")
            .validate()
            .is_ok()
    );
    assert!(
        ReplicaSetOptions::default()
            .member_env(1, "TZ", "UTC")
            .validate()
            .is_err()
    );
}
