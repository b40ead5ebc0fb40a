//! [`Standalone`]: one `mongod` without `--replSet` on loopback, for tests
//! of what a deployment without replication (no change streams, no
//! transactions, no replica set name) does.

use std::time::Instant;

use super::TestkitError;
use super::install::mongod_path;
use super::member::{Member, pick_ports};
use super::options::ReplicaSetOptions;
use super::process;

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
        let mut member = Member::new(0, pick_ports(1)?[0])?;
        member.spawn_mongod(&mongod, None, &opts, None).await?;
        member
            .wait_listening_on_a_free_port(&mongod, None, &opts, None, deadline)
            .await?;
        tracing::info!(
            port = member.port,
            listening_ms = began.elapsed().as_millis() as u64,
            "testkit standalone mongod ready"
        );
        Ok(Standalone { member })
    }
}

/// The server's address, port, URI, data directory, log and process id,
/// as a [`Member`]'s.
impl std::ops::Deref for Standalone {
    type Target = Member;

    fn deref(&self) -> &Member {
        &self.member
    }
}
