use super::*;
use mongodb::error::{CommandError, Error};

fn command_error(code: i32, name: &str) -> Error {
    let e: CommandError = mongodb::bson::from_document(doc! {
        "code": code, "codeName": name, "errmsg": "test",
    })
    .unwrap();
    Error::from(ErrorKind::Command(e))
}

#[test]
fn step_down_errors_are_classified() {
    use StepDownFailure::*;
    for (code, name) in [
        (10107, "NotWritablePrimary"),
        (13435, "NotPrimaryNoSecondaryOk"),
        (13436, "NotPrimaryOrSecondary"),
        (189, "PrimarySteppedDown"),
        (262, "ExceededTimeLimit"),
        (117, "ConflictingOperationInProgress"),
        (91, "ShutdownInProgress"),
        (24, "LockTimeout"),
    ] {
        assert_eq!(
            classify_step_down(&command_error(code, name)),
            Retry,
            "{name}"
        );
    }
    assert_eq!(
        classify_step_down(&command_error(11602, "InterruptedDueToReplStateChange")),
        Ambiguous
    );
    let io = Error::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    assert_eq!(classify_step_down(&io), Ambiguous);
    for (code, name) in [
        (13, "Unauthorized"),
        (59, "CommandNotFound"),
        (2, "BadValue"),
        (76, "NoReplicationEnabled"),
    ] {
        assert_eq!(
            classify_step_down(&command_error(code, name)),
            Fatal,
            "{name}"
        );
    }
}
