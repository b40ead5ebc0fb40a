use mongodb::bson::doc;

use super::*;
use std::time::Duration;

#[test]
fn an_update_reply_gives_its_counts_unless_it_has_write_errors() {
    assert_eq!(
        update_counts(&doc! { "n": 3, "nModified": 2 }),
        Some((3, 2))
    );
    assert_eq!(update_counts(&doc! { "n": 3_i64 }), Some((3, 0)));
    assert_eq!(
        update_counts(&doc! { "n": 1, "writeErrors": [{ "code": 121 }] }),
        None
    );
    assert_eq!(
        update_counts(&doc! { "n": 1, "writeErrors": [] }),
        Some((1, 0))
    );
}

#[test]
fn a_write_concern_error_is_an_unknown_outcome() {
    let waited = Duration::from_secs(1);
    let reply = doc! { "n": 3, "writeConcernError": { "code": 64 } };
    assert!(acknowledged(reply, waited).unwrap_err().is_transient());
    assert!(acknowledged(doc! { "n": 3 }, waited).is_ok());
}
