//! What the scenarios share: the files the commands rendezvous through, the
//! lock collection and the server's clock, and `exec` arguments.

use std::future::IntoFuture;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use mongodb::bson::{Document, doc};
use serde_json::Value;

use crate::common::cli::{Env, Proc};

/// Hang guard of the waits of these tests and of their commands' polling
/// loops: every wait here takes well under a few seconds.
pub const GUARD: Duration = Duration::from_secs(120);

/// A directory of files for the commands: the log they append to, and the
/// files the test creates to let them go on.
pub struct Files {
    dir: tempfile::TempDir,
}

impl Files {
    pub fn new() -> Files {
        Files {
            dir: tempfile::tempdir().unwrap(),
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The log's path, quoted for sh.
    pub fn log(&self) -> String {
        quoted(&self.path("log"))
    }

    /// Shell code appending `line` (expanded by sh) to the log under
    /// flock(1).
    pub fn append(&self, line: &str) -> String {
        format!(
            "flock {lock} sh -c \"echo {line} >> {log}\"",
            lock = quoted(&self.path("log.lock")),
            log = self.log()
        )
    }

    /// Appends `line` to the log from the test, as the commands do.
    pub fn append_now(&self, line: &str) {
        let status = Command::new("sh")
            .arg("-c")
            .arg(self.append(line))
            .status()
            .unwrap();
        assert!(status.success());
    }

    /// Shell code that polls until `condition` (a sh condition) holds, and
    /// exits 3 if it does not within [`GUARD`] (a hang, not a verdict).
    pub fn wait_until(&self, condition: &str) -> String {
        format!(
            "end=$(( $(date +%s) + {guard} )); \
             until {condition}; do \
               [ \"$(date +%s)\" -ge \"$end\" ] && exit 3; sleep 0.01; \
             done",
            guard = GUARD.as_secs()
        )
    }

    /// The log's lines so far.
    pub fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(self.path("log"))
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }

    /// Waits (bounded by [`GUARD`]) until the log has a line starting with
    /// `prefix`, failing at once if one of `execs` exits meanwhile.
    pub fn wait_for_line(&self, prefix: &str, execs: &mut [Proc]) {
        wait_for(&format!("a line {prefix:?} in the log"), execs, || {
            self.lines().iter().any(|l| l.starts_with(prefix))
        });
    }

    /// Creates the file `name` (which commands poll for).
    pub fn touch(&self, name: &str) {
        std::fs::write(self.path(name), "").unwrap();
    }
}

/// Polls `check` until it holds; fails at once if one of `execs` (which
/// are to keep running meanwhile) has exited, and after [`GUARD`] (a hang).
pub fn wait_for(what: &str, execs: &mut [Proc], mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + GUARD;
    while !check() {
        for exec in execs.iter_mut() {
            if let Some(status) = exec.child.try_wait().unwrap() {
                panic!("an exec exited ({status}) before {what}");
            }
        }
        assert!(Instant::now() < deadline, "no {what} within {GUARD:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

pub fn quoted(path: &Path) -> String {
    format!("'{}'", path.display())
}

/// The index of the line `line` in `lines` (panics if absent).
pub fn at(lines: &[String], line: &str) -> usize {
    lines
        .iter()
        .position(|l| l == line)
        .unwrap_or_else(|| panic!("no line {line:?} in {lines:?}"))
}

/// The lock collection and the server's clock, read through a client of
/// this test's own single-threaded runtime (which owns the client and drops
/// its tasks with itself).
pub struct Server {
    leases: mongodb::Collection<Document>,
    db: mongodb::Database,
    runtime: tokio::runtime::Runtime,
}

impl Server {
    pub fn new(env: &Env) -> Server {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = runtime
            .block_on(mongodb::Client::with_uri_str(&env.uri))
            .unwrap();
        let db = client.database(&env.db);
        Server {
            leases: db.collection("leases"),
            db,
            runtime,
        }
    }

    /// The lock document of `key`, if any.
    pub fn doc(&self, key: &str) -> Option<Document> {
        self.runtime
            .block_on(self.leases.find_one(doc! { "_id": key }).into_future())
            .unwrap()
    }

    /// Waits (bounded) until the document of `key` has the field `field`,
    /// failing at once if one of `execs` exits meanwhile.
    pub fn wait_for_field(&self, key: &str, field: &str, execs: &mut [Proc]) {
        wait_for(&format!("{field:?} on {key:?}"), execs, || {
            self.doc(key).is_some_and(|d| d.contains_key(field))
        });
    }

    /// The server's `$$NOW`.
    pub fn now(&self) -> SystemTime {
        let reply = self
            .runtime
            .block_on(
                self.db
                    .run_command(doc! {
                        "aggregate": 1,
                        "pipeline": [{ "$documents": [{ "now": "$$NOW" }] }],
                        "cursor": {},
                    })
                    .into_future(),
            )
            .unwrap();
        reply
            .get_document("cursor")
            .and_then(|c| c.get_array("firstBatch"))
            .ok()
            .and_then(|batch| batch.first()?.as_document()?.get_datetime("now").ok())
            .unwrap_or_else(|| panic!("no $$NOW in {reply}"))
            .to_system_time()
    }
}

/// A time in `list --json` (RFC 3339).
pub fn parse_time(value: &Value) -> SystemTime {
    let text = value
        .as_str()
        .unwrap_or_else(|| panic!("not a time: {value}"));
    text.parse::<humantime::Timestamp>().unwrap().into()
}

/// `exec` args: `--key KEY`, `flags`, then `sh -c SCRIPT`.
pub fn exec_args<'a>(key: &'a str, flags: &[&'a str], script: &'a str) -> Vec<&'a str> {
    let mut args = vec!["exec", "--key", key];
    args.extend_from_slice(flags);
    args.extend_from_slice(&["--", "sh", "-c", script]);
    args
}
