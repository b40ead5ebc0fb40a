//! `LeaseKey`'s identity, hash and order by value, its conversions and
//! its check against what MongoDB refuses as `_id`.

use std::collections::HashSet;

use mongodb::bson::{Decimal128, Regex, Timestamp, doc};

use super::*;

fn hash_of(key: &LeaseKey) -> u64 {
    use std::collections::hash_map::DefaultHasher;
    let mut h = DefaultHasher::new();
    key.hash(&mut h);
    h.finish()
}

#[test]
fn numbers_of_equal_value_are_one_key_with_one_hash() {
    let same = [
        LeaseKey::from(1_i32),
        LeaseKey::from(1_i64),
        LeaseKey::from(Bson::Double(1.0)),
    ];
    for a in &same {
        for b in &same {
            assert_eq!(a, b);
            assert_eq!(hash_of(a), hash_of(b));
        }
    }
    assert_ne!(LeaseKey::from(1_i32), LeaseKey::from(Bson::Double(1.5)));
    assert_ne!(LeaseKey::from(1_i32), LeaseKey::from("1"));
    let big = (1_i64 << 53) + 1;
    assert_ne!(
        LeaseKey::from(big),
        LeaseKey::from(Bson::Double((1_i64 << 53) as f64))
    );
    assert_eq!(
        LeaseKey::from(Bson::Double(f64::NAN)),
        LeaseKey::from(Bson::Double(f64::NAN))
    );
    assert_eq!(
        hash_of(&LeaseKey::from(Bson::Double(-0.0))),
        hash_of(&LeaseKey::from(0_i32))
    );
    let set: HashSet<LeaseKey> = same.into_iter().collect();
    assert_eq!(set.len(), 1);
}

#[test]
fn a_symbol_is_the_string_of_its_text_as_in_mongodb() {
    let symbol = LeaseKey::from(Bson::Symbol("s".into()));
    assert_eq!(symbol, LeaseKey::from("s"));
    assert_eq!(hash_of(&symbol), hash_of(&LeaseKey::from("s")));
    assert_eq!(symbol.as_str(), None, "but it is not a string key");
    assert_eq!(
        symbol.to_bson(),
        Bson::Symbol("s".into()),
        "and stays a symbol"
    );
    let mut keys = [
        LeaseKey::from("t"),
        LeaseKey::from(Bson::Symbol("b".into())),
        LeaseKey::from("a"),
        symbol.clone(),
    ];
    keys.sort();
    let texts: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    assert_eq!(
        texts,
        ["a", r#"{"$symbol":"b"}"#, r#"{"$symbol":"s"}"#, "t"]
    );
}

#[test]
fn a_string_given_as_bson_is_a_string_key() {
    let key = LeaseKey::from(Bson::String("job-1".into()));
    assert_eq!(key.as_str(), Some("job-1"));
    assert_eq!(key, LeaseKey::from("job-1"));
    assert_eq!(hash_of(&key), hash_of(&LeaseKey::from("job-1")));
    assert_eq!(key.to_bson(), Bson::String("job-1".into()));
    assert_eq!(key.clone().into_bson(), Bson::String("job-1".into()));
    assert_eq!(Bson::from(key), Bson::String("job-1".into()));
}

#[test]
fn documents_with_equal_numbers_are_one_key_but_field_order_matters() {
    let a = LeaseKey::from(doc! { "t": 1_i32, "i": "x" });
    let b = LeaseKey::from(doc! { "t": 1_i64, "i": "x" });
    assert_eq!(a, b);
    assert_eq!(hash_of(&a), hash_of(&b));
    assert_ne!(a, LeaseKey::from(doc! { "i": "x", "t": 1_i32 }));
}

#[test]
fn order_follows_mongodb_type_order_then_value() {
    let oid: ObjectId = "5087b72181a445980ae47d13".parse().unwrap();
    let sorted = vec![
        LeaseKey::from(Bson::MinKey),
        LeaseKey::from(Bson::Null),
        LeaseKey::from(Bson::Double(f64::NAN)),
        LeaseKey::from(-5_i64),
        LeaseKey::from(Bson::Double(1.5)),
        LeaseKey::from(2_i32),
        LeaseKey::from(Bson::Decimal128(Decimal128::from_bytes([0; 16]))),
        LeaseKey::from("a"),
        LeaseKey::from("b"),
        LeaseKey::from(doc! { "a": 1 }),
        LeaseKey::from(doc! { "a": 1, "b": 1 }),
        LeaseKey::from(doc! { "b": 0 }),
        LeaseKey::from(Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![9],
        }),
        LeaseKey::from(uuid::Uuid::nil()),
        LeaseKey::from(oid),
        LeaseKey::from(Bson::Boolean(false)),
        LeaseKey::from(Bson::Boolean(true)),
        LeaseKey::from(DateTime::from_millis(-1)),
        LeaseKey::from(DateTime::from_millis(0)),
        LeaseKey::from(Bson::Timestamp(Timestamp {
            time: 1,
            increment: 0,
        })),
        LeaseKey::from(Bson::MaxKey),
    ];
    let mut shuffled = sorted.clone();
    shuffled.reverse();
    shuffled.sort();
    assert_eq!(shuffled, sorted);
}

#[test]
fn display_shows_strings_as_is_and_other_keys_as_canonical_extended_json() {
    assert_eq!(LeaseKey::from("job-1").to_string(), "job-1");
    assert_eq!(LeaseKey::from(7_i32).to_string(), r#"{"$numberInt":"7"}"#);
    assert_eq!(LeaseKey::from(7_i64).to_string(), r#"{"$numberLong":"7"}"#);
    let oid: ObjectId = "5087b72181a445980ae47d13".parse().unwrap();
    assert_eq!(
        LeaseKey::from(oid).to_string(),
        r#"{"$oid":"5087b72181a445980ae47d13"}"#
    );
    assert_eq!(LeaseKey::from("job-1").to_extended_json(), r#""job-1""#);
    assert_eq!(
        LeaseKey::from(doc! { "t": 1_i64, "i": "x" }).to_string(),
        r#"{"t":{"$numberLong":"1"},"i":"x"}"#
    );
    assert_eq!(format!("{:?}", LeaseKey::from("a")), r#"LeaseKey("a")"#);
}

#[test]
fn extended_json_round_trips_keep_the_type() {
    let oid: ObjectId = "5087b72181a445980ae47d13".parse().unwrap();
    let keys = [
        LeaseKey::from("job-1"),
        LeaseKey::from(7_i32),
        LeaseKey::from(7_i64),
        LeaseKey::from(Bson::Double(2.5)),
        LeaseKey::from(oid),
        LeaseKey::from(uuid::Uuid::from_u128(0x1234)),
        LeaseKey::from(DateTime::from_millis(1_700_000_000_123)),
        LeaseKey::from(doc! { "t": 1_i64, "n": { "x": "y" } }),
        LeaseKey::from(Bson::Null),
        LeaseKey::from(Bson::MaxKey),
    ];
    for key in keys {
        let back = LeaseKey::from_extended_json(&key.to_extended_json()).unwrap();
        assert_eq!(back.to_bson(), key.to_bson(), "{key}");
    }
    assert_eq!(
        LeaseKey::from_extended_json(r#"{"$oid":"5087b72181a445980ae47d13"}"#)
            .unwrap()
            .to_bson(),
        Bson::ObjectId(oid)
    );
    // Relaxed Extended JSON: ISO dates, plain numbers.
    assert_eq!(
        LeaseKey::from_extended_json(r#"{"$date":"2024-01-01T00:00:00Z"}"#)
            .unwrap()
            .to_bson(),
        Bson::DateTime(DateTime::from_millis(1_704_067_200_000))
    );
    assert_eq!(
        LeaseKey::from_extended_json("7").unwrap().to_bson(),
        Bson::Int32(7)
    );
    assert!(crate::Error::from(LeaseKey::from_extended_json("{").unwrap_err()).is_invalid_input());
    assert!(
        LeaseKey::from_extended_json(r#"{"$oid":"xyz"}"#)
            .unwrap_err()
            .reason
            .contains("Extended JSON")
    );
}

#[test]
fn string_keys_compare_with_str() {
    let key = LeaseKey::from("job-1");
    assert!(key == "job-1");
    assert!("job-1" == key);
    assert_eq!(key.as_str(), Some("job-1"));
    assert!(LeaseKey::from(1_i32) != "1");
}

#[test]
fn validation_refuses_what_mongodb_refuses_as_id() {
    let refused = [
        (LeaseKey::from(Bson::Array(vec![Bson::Int32(1)])), "array"),
        (
            LeaseKey::from(Bson::RegularExpression(Regex {
                pattern: "a".into(),
                options: String::new(),
            })),
            "regular expression",
        ),
        (LeaseKey::from(Bson::Undefined), "undefined"),
        (LeaseKey::from(doc! { "a": { "$b": 1 } }), "'$'"),
        (LeaseKey::from(""), "empty"),
        (
            LeaseKey::from("x".repeat(crate::key::MAX_KEY_LEN + 1)),
            "limit",
        ),
        (
            LeaseKey::from(doc! { "a": "x".repeat(crate::key::MAX_KEY_LEN) }),
            "limit",
        ),
    ];
    for (key, why) in refused {
        match key.validate() {
            Err(InvalidKey { reason }) => assert!(reason.contains(why), "{reason}"),
            other => panic!("{key:?}: {other:?}"),
        }
    }
    for key in [
        LeaseKey::from("x".repeat(crate::key::MAX_KEY_LEN)),
        LeaseKey::from(7_i32),
        LeaseKey::from(doc! { "a": [1, 2] }),
        LeaseKey::from(Bson::Null),
    ] {
        key.validate().unwrap();
    }
}

#[test]
fn a_key_is_one_pointer_to_24_bytes_which_hold_a_short_string_keys_text() {
    // The `Arc`'s allocation holds two counts and a `Repr`: 40 bytes, one
    // malloc chunk of 48, where an `Arc<Bson>` took 128 (a `Bson` is 112);
    // a text of up to `SHORT` bytes is in it, a longer one in a chunk of
    // its own. `benches/memory.rs` shows the effect on RSS per held lease.
    assert_eq!(std::mem::size_of::<LeaseKey>(), 8);
    assert_eq!(std::mem::size_of::<Repr>(), 24);
    assert_eq!(SHORT, 22);
}

#[test]
fn a_string_key_is_the_same_key_whether_its_text_is_in_place_or_boxed() {
    for len in [1, SHORT - 1, SHORT, SHORT + 1, 2 * SHORT] {
        // Multi-byte characters too: the boundary falls between them.
        for text in ["k".repeat(len), "é".repeat(len.div_ceil(2))] {
            let key = LeaseKey::from(text.as_str());
            let short = text.len() <= SHORT;
            assert_eq!(
                matches!(&*key.0, Repr::Str(Text::Short { .. })),
                short,
                "{text}"
            );
            assert_eq!(key.as_str(), Some(text.as_str()));
            assert_eq!(key, text);
            assert_eq!(key.to_string(), text);
            assert_eq!(key.to_bson(), Bson::String(text.clone()));
            assert_eq!(key.clone().into_bson(), Bson::String(text.clone()));
            let as_bson = LeaseKey::from(Bson::String(text.clone()));
            assert_eq!(hash_of(&key), hash_of(&as_bson));
            let symbol = LeaseKey::from(Bson::Symbol(text.clone()));
            assert_eq!(key, symbol);
            assert_eq!(hash_of(&key), hash_of(&symbol));
            let longer = LeaseKey::from(format!("{text}k"));
            assert_eq!(key.cmp(&longer), Ordering::Less);
            assert_eq!(longer.cmp(&key), Ordering::Greater);
            assert!(key.validate().is_ok());
        }
    }
    assert!(LeaseKey::from("").validate().is_err());
    let too_long = LeaseKey::from("k".repeat(crate::key::MAX_KEY_LEN + 1));
    assert!(too_long.validate().is_err());
}
