//! Keys of any script and of the maximum length.

use mongo_lease::ReleaseOutcome;
use mongodb::bson::doc;

use crate::common::Fixture;
use crate::support::TTL;

/// Unicode keys (any script, emoji, combining marks, RTL, control
/// characters, `$` and `.`), and keys of exactly the maximum length, are
/// stored as given: distinct strings are distinct leases (no normalisation,
/// no case folding), and a key one byte too long is refused before anything
/// is sent.
#[tokio::test]
async fn unicode_and_very_long_keys() {
    let fx = Fixture::new("keys").await;
    let manager = fx.manager(TTL).await;
    let longest_ascii = "k".repeat(mongo_lease::MAX_KEY_LEN);
    let longest_multibyte =
        "鍵".repeat(mongo_lease::MAX_KEY_LEN / 3) + &"k".repeat(mongo_lease::MAX_KEY_LEN % 3);
    assert_eq!(longest_multibyte.len(), mongo_lease::MAX_KEY_LEN);
    let keys: Vec<String> = vec![
        "ключ".into(),
        "鍵".into(),
        "🔑🗝️".into(),
        "مفتاح".into(),
        "e\u{301}".into(), // e + combining acute
        "\u{e9}".into(),   // é precomposed: another key
        "Key".into(),
        "key".into(),
        "a\0b".into(),
        "tab\tnew\nline".into(),
        "$where".into(),
        "a.b.c".into(),
        " ".into(),
        longest_ascii.clone(),
        longest_multibyte.clone(),
    ];
    let mut leases = Vec::new();
    for key in &keys {
        let lease = manager
            .try_acquire(key.clone())
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{key:?} is free"));
        assert_eq!(lease.key(), key);
        leases.push(lease);
    }
    for key in &keys {
        let stored = fx
            .raw()
            .find_one(doc! { "_id": key })
            .await
            .unwrap()
            .expect("stored under the exact key");
        assert_eq!(stored.get_str("_id").unwrap(), key);
        // Held: a second manager cannot take it.
    }
    assert_eq!(
        fx.raw().count_documents(doc! {}).await.unwrap() as usize,
        keys.len()
    );
    let other = fx.manager(TTL).await;
    for key in &keys {
        assert!(
            other.try_acquire(key.clone()).await.unwrap().is_none(),
            "{key:?} is held"
        );
    }
    for lease in leases {
        assert_eq!(lease.release().await.unwrap(), ReleaseOutcome::Released);
    }
    for key in [
        longest_ascii + "k",
        longest_multibyte + "k",
        "鍵".repeat(mongo_lease::MAX_KEY_LEN / 3 + 1),
    ] {
        let e = manager.try_acquire(key).await.unwrap_err();
        assert!(e.is_invalid_input(), "{e}");
    }
    manager.shutdown().await.unwrap();
    other.shutdown().await.unwrap();
}
