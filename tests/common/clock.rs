//! A wall clock of a `mongod` (or any process) that runs off by
//! milliseconds and steps while it runs: the `LD_PRELOAD` shim
//! `tests/faults/clockshift.c`, built here with the system C compiler, and
//! the file it reads the offset from.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, SystemTime};

use mongodb::bson::{Document, doc};

/// The shim's source (one copy, `tests/faults/clockshift.c`, for both
/// packages' tests).
const SOURCE: &str = include_str!("../faults/clockshift.c");

/// The shim, built with `$CC` (else `cc`) into the package's target
/// temporary directory once per version of its source (under a name
/// carrying the source's hash; built under a name of its own first, then
/// renamed, so that test processes building it at once do not clash).
pub fn shim() -> &'static Path {
    static SHIM: OnceLock<PathBuf> = OnceLock::new();
    SHIM.get_or_init(|| {
        use std::hash::{Hash, Hasher};
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        SOURCE.hash(&mut hasher);
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let out = dir.join(format!("clockshift-{:016x}.so", hasher.finish()));
        if out.exists() {
            return out;
        }
        let stem = dir.join(format!("clockshift-{}", uuid::Uuid::new_v4().simple()));
        let (src, built) = (stem.with_extension("c"), stem.with_extension("so"));
        std::fs::write(&src, SOURCE).expect("write the shim's source");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let status = std::process::Command::new(&cc)
            .args(["-shared", "-fPIC", "-O2", "-o"])
            .arg(&built)
            .arg(&src)
            .arg("-ldl")
            .status()
            .unwrap_or_else(|e| {
                panic!(
                    "this test builds an LD_PRELOAD shim with a C compiler (`{cc}`, or $CC), \
                     which cannot run: {e}"
                )
            });
        let _ = std::fs::remove_file(&src);
        assert!(
            status.success(),
            "building tests/faults/clockshift.c with `{cc}` failed: {status}"
        );
        std::fs::rename(&built, &out).expect("move the shim in place");
        out
    })
}

/// The offset of one process's wall clock, in milliseconds, in a file the
/// shim reads (at most a millisecond old); removed on drop.
pub struct ClockOffset {
    dir: tempfile::TempDir,
}

impl ClockOffset {
    /// A clock offset of `ms` milliseconds.
    pub fn new(ms: i64) -> ClockOffset {
        let offset = ClockOffset {
            dir: tempfile::Builder::new()
                .prefix("mongo-lease-clock-")
                .tempdir()
                .expect("a temporary directory"),
        };
        offset.set(ms);
        offset
    }

    fn path(&self) -> PathBuf {
        self.dir.path().join("offset_ms")
    }

    /// The environment that shifts a process's wall clock by this offset:
    /// `LD_PRELOAD` and the file's path.
    pub fn env(&self) -> [(String, String); 2] {
        [
            ("LD_PRELOAD".into(), shim().display().to_string()),
            (
                "MONGO_LEASE_CLOCK_OFFSET_FILE".into(),
                self.path().display().to_string(),
            ),
        ]
    }

    /// Sets the offset to `ms` (replacing the file atomically): the
    /// process's wall clock steps at its next reading a millisecond later.
    pub fn set(&self, ms: i64) {
        let next = self.dir.path().join("offset_ms.next");
        std::fs::write(&next, ms.to_string()).expect("write the clock offset");
        std::fs::rename(&next, self.path()).expect("replace the clock offset");
    }
}

/// How far the server's `$$NOW` is from this machine's wall clock, in
/// milliseconds, read through `client` (a direct connection to one member):
/// `$$NOW` minus the middle of the round trip. Within the round trip's half
/// of the shim's offset.
pub async fn server_offset_ms(client: &mongodb::Client) -> (i64, Duration) {
    let sent = SystemTime::now();
    let mut cursor = client
        .database("admin")
        .aggregate([doc! { "$documents": [{ "now": "$$NOW" }] }])
        .await
        .expect("read $$NOW");
    let now: Document = {
        use futures::StreamExt;
        cursor.next().await.expect("a document").expect("$$NOW")
    };
    let answered = SystemTime::now();
    let round_trip = answered.duration_since(sent).unwrap_or_default();
    let middle = sent + round_trip / 2;
    let server = now.get_datetime("now").unwrap().to_system_time();
    let offset = match server.duration_since(middle) {
        Ok(ahead) => ahead.as_millis() as i64,
        Err(behind) => -(behind.duration().as_millis() as i64),
    };
    (offset, round_trip)
}

/// Waits (bounded by `limit`, a hang guard) until the server behind
/// `client` reads its clock `ms` off this machine's, within `tolerance`
/// (and the round trip's half): the shim's offset has reached it.
pub async fn until_server_offset(
    client: &mongodb::Client,
    ms: i64,
    tolerance: Duration,
    limit: Duration,
) -> i64 {
    let began = std::time::Instant::now();
    loop {
        let (offset, round_trip) = server_offset_ms(client).await;
        let slack = (tolerance + round_trip / 2).as_millis() as i64;
        if (offset - ms).abs() <= slack {
            return offset;
        }
        assert!(
            began.elapsed() < limit,
            "the server's clock reads {offset} ms off, not {ms} ms, after {limit:?}"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}
