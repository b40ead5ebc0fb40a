//! Keys of any BSON type: identity by value and listing in MongoDB's order.

use mongodb::bson::{Binary, Bson, DateTime, doc, oid::ObjectId, spec::BinarySubtype};

use super::{Fixture, held, take};
use crate::key::LeaseKey;
use crate::store::Store;

/// Keys of many types in one collection are each listed once, in MongoDB's
/// BSON order (type first, then value), also with pages smaller than a
/// type's run of keys: the `min` bound of a page crosses types, where a
/// `$gt` would stay within the type of `after`.
pub(super) async fn keys_of_any_type_are_listed_once_in_mongodbs_order<F: Fixture>(f: &F) {
    let a = f.store("a").await;
    let oid: ObjectId = "5087b72181a445980ae47d13".parse().unwrap();
    let uuid = uuid::Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);
    // MongoDB's order, written out by hand (not computed by `LeaseKey`'s
    // `Ord`), so that the twin is checked against the server's rule.
    let expected: Vec<LeaseKey> = vec![
        Bson::MinKey.into(),
        Bson::Null.into(),
        LeaseKey::from(-3_i64),
        Bson::Double(2.5).into(),
        LeaseKey::from(7_i32),
        LeaseKey::from("a"),
        LeaseKey::from("b"),
        LeaseKey::from(doc! { "a": 2 }),
        LeaseKey::from(doc! { "t": 1, "i": "x" }),
        LeaseKey::from(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![1],
        }),
        LeaseKey::from(uuid),
        LeaseKey::from(oid),
        Bson::Boolean(true).into(),
        LeaseKey::from(DateTime::from_millis(1_700_000_000_000)),
        Bson::MaxKey.into(),
    ];
    // Acquired out of order.
    for key in expected.iter().rev() {
        take(&a, key).await;
    }
    for page_size in [1, 2, 3, 100] {
        let mut seen = Vec::new();
        let mut after = None;
        loop {
            let (page, next) = a.list(after, page_size).await.unwrap();
            assert!(page.len() <= page_size);
            seen.extend(page.into_iter().map(|i| i.key.into_bson()));
            match next {
                Some(next) => after = Some(next),
                None => break,
            }
        }
        let want: Vec<Bson> = expected.iter().map(|k| k.to_bson()).collect();
        assert_eq!(
            seen, want,
            "pages of {page_size}: each key once, in order, type kept"
        );
    }
}

/// Numbers of equal value are one key, whatever their BSON type, as in
/// MongoDB's `_id` index: a 64-bit integer or a double finds the lease taken
/// under a 32-bit integer held.
pub(super) async fn numbers_of_equal_value_are_one_key<F: Fixture>(f: &F) {
    let (a, b) = (f.store("a").await, f.store("b").await);
    take(&a, 7_i32).await;
    held(&b, 7_i64, false, "a").await;
    held(&b, Bson::Double(7.0), false, "a").await;
    take(&b, 8_i64).await;
    held(&a, 8_i32, false, "b").await;
    let (page, _) = a.list(None, 10).await.unwrap();
    let keys: Vec<Bson> = page.into_iter().map(|i| i.key.into_bson()).collect();
    assert_eq!(keys, [Bson::Int32(7), Bson::Int64(8)], "one document each");
}
