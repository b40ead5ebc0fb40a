//! [`Standalone`]: one `mongod` without `--replSet` on loopback, for tests
//! of what a deployment without replication (no change streams, no
//! transactions, no replica set name) does.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;

use super::TestkitError;
use super::install::mongod_path;
use super::member::{ListenError, Member, MemberProc, PORT_ATTEMPTS, pick_ports};
use super::options::ReplicaSetOptions;
use super::process::{self, DIR_PREFIX};

/// A throwaway standalone `mongod` (started without `--replSet`) on
/// `127.0.0.1`.
///
/// Created by [`Standalone::start`]. It is started like a member of a
/// [`ReplicaSet`](super::ReplicaSet) (same spawner thread with
/// `PR_SET_PDEATHSIG`, same exit hook and sweep of stale data directories,
/// same flags apart from `--replSet`), and dropping it kills the `mongod`
/// (`SIGKILL`), reaps it and removes its data directory. Shut down the
/// driver clients made through it first (a client whose server is gone only
/// fails its operations, but a multi-threaded test runtime may then see the
/// driver's background tasks outlive it).
///
/// [`start`](Self::start) needs a tokio runtime with the time driver
/// enabled (any `#[tokio::test]` qualifies). Drop blocks briefly while the
/// killed process is reaped.
///
/// A standalone server has no oplog, so it has no change streams and no
/// transactions; a client that names a replica set (`replicaSet=...`)
/// selects no server there.
///
/// # Example
///
/// ```no_run
/// use mongo_lease::testkit::Standalone;
/// use mongodb::bson::doc;
///
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// let server = Standalone::start().await?;
/// // mongodb://127.0.0.1:<port>/?directConnection=true
/// let client = mongodb::Client::with_uri_str(server.uri()).await?;
/// client.database("admin").run_command(doc! { "ping": 1 }).await?;
/// // A URI of your own, e.g. one that expects a replica set there:
/// let _wrong = format!("mongodb://127.0.0.1:{}/?replicaSet=rs0", server.port());
/// client.shutdown().await;
/// drop(server); // kills the mongod, removes the data directory
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Standalone {
    member: Member,
}

impl Standalone {
    /// Starts a standalone `mongod` and waits until it accepts connections
    /// (its log says "Waiting for connections").
    ///
    /// Locates `mongod` ([`mongod_path`]), picks a free loopback port
    /// (retrying on a new one, up to 5 ports, if it was taken before
    /// `mongod` bound it) and creates a temporary data directory. Takes
    /// ~0.3 s on a 2-core machine; bounded by the default
    /// [`ReplicaSetOptions::startup_timeout`] (60 s), which only turns a
    /// hang into an error. On error the `mongod` is killed and its
    /// directory removed.
    ///
    /// # Errors
    ///
    /// [`TestkitError::MongodEnvNotFound`] / [`TestkitError::Install`] if no
    /// `mongod` can be found or installed, [`TestkitError::Io`] if the data
    /// directory cannot be created or the process spawned,
    /// [`TestkitError::PortConflict`] if every port tried was taken,
    /// [`TestkitError::MongodExited`] if `mongod` exited while starting and
    /// [`TestkitError::Timeout`] if it did not listen in time (both with the
    /// tail of its log).
    pub async fn start() -> Result<Standalone, TestkitError> {
        let opts = ReplicaSetOptions::default();
        let mongod = mongod_path()?;
        process::sweep_stale_dirs();

        let began = Instant::now();
        let deadline = began + opts.startup_timeout;
        let dir = tempfile::Builder::new()
            .prefix(&format!("{DIR_PREFIX}{}-", std::process::id()))
            .tempdir()
            .map_err(|e| TestkitError::io("creating a temporary data directory", e))?;
        let mut member = Member {
            index: 0,
            port: pick_ports(1)?[0],
            dir,
            proc: Mutex::new(MemberProc::default()),
            proxy: None,
        };
        let mut attempts = 1;
        loop {
            member.spawn_mongod(&mongod, None, &opts, None).await?;
            match member.wait_listening(deadline, opts.startup_timeout).await {
                Ok(()) => break,
                Err(ListenError::Other(e)) => return Err(e),
                Err(ListenError::AddrInUse) if attempts >= PORT_ATTEMPTS => {
                    return Err(TestkitError::PortConflict {
                        member: 0,
                        attempts,
                    });
                }
                Err(ListenError::AddrInUse) => {
                    attempts += 1;
                    tracing::debug!(port = member.port, "port taken, retrying");
                    if let Some(mut child) = member.take_child() {
                        let _ = child.wait();
                    }
                    member.port = pick_ports(1)?[0];
                }
            }
        }
        tracing::info!(
            port = member.port,
            listening_ms = began.elapsed().as_millis() as u64,
            "testkit standalone mongod ready"
        );
        Ok(Standalone { member })
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.member.port()
    }

    /// The server's address: `127.0.0.1:<port>`.
    pub fn host(&self) -> String {
        self.member.host()
    }

    /// A URI for this server:
    /// `mongodb://127.0.0.1:<port>/?directConnection=true`.
    pub fn uri(&self) -> String {
        self.member.uri()
    }

    /// The server's data directory (`--dbpath`); removed on drop.
    pub fn dbpath(&self) -> &Path {
        self.member.dbpath()
    }

    /// The server's log file (`<dbpath>/mongod.log`); anything it wrote to
    /// stdout/stderr goes to `<dbpath>/mongod.stdio.log`.
    pub fn log_path(&self) -> PathBuf {
        self.member.log_path()
    }

    /// The OS process id of the server's `mongod`.
    pub fn pid(&self) -> Option<u32> {
        self.member.pid()
    }
}
