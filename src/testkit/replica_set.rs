//! Dedicated throwaway replica sets.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use mongodb::Client;
use mongodb::bson::{Bson, doc};
use tempfile::TempDir;

use super::TestkitError;
use super::install::{mongod_path, tail_lines};
use super::process::{self, DIR_PREFIX};
use super::proxy::FaultProxy;

/// Poll interval for log files and `hello`.
const POLL: Duration = Duration::from_millis(50);
/// How many fresh ports a member may try when its port gets stolen between
/// picking it and `mongod` binding it.
const PORT_ATTEMPTS: usize = 5;
/// Lines of each member's log included in error messages.
const LOG_TAIL_LINES: usize = 15;
/// MongoDB allows at most 7 voting members.
const MAX_VOTERS: usize = 7;
/// `mongod` exit code for "address already in use" (`EXIT_NET_ERROR`).
const EXIT_NET_ERROR: i32 = 48;

/// Options for [`ReplicaSet::start`].
///
/// Construct with [`Default::default`] and adjust with the chainable
/// setters (or assign the public fields):
///
/// ```no_run
/// # use mongo_lease::testkit::ReplicaSetOptions;
/// let opts = ReplicaSetOptions::default().members(3).set_name("failover");
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct ReplicaSetOptions {
    /// Number of members (default 1). Members beyond the seventh are added
    /// as non-voting, priority-0 members.
    pub members: usize,
    /// `ttlMonitorSleepSecs` server parameter: how often the TTL monitor
    /// deletes expired documents (default 1; MongoDB's default is 60).
    pub ttl_monitor_sleep_secs: u32,
    /// Use fast elections (default `true`): `electionTimeoutMillis: 1000`,
    /// `heartbeatIntervalMillis: 500` instead of MongoDB's 10 000 / 2 000.
    pub fast_elections: bool,
    /// Replica set name (default `"rs0"`).
    pub set_name: String,
    /// Upper bound for [`ReplicaSet::start`] (and for
    /// [`ReplicaSet::restart`]) to reach a healthy state (default 60 s).
    pub startup_timeout: Duration,
    /// Use a 10 MB, non-preallocated journal (default `true`). WiredTiger
    /// otherwise preallocates ~300 MB of journal files per member.
    pub small_journal: bool,
    /// Extra command-line arguments appended to every `mongod` invocation.
    pub extra_args: Vec<String>,
    /// Put a [`FaultProxy`] in front of every member (default `false`). The
    /// replica set configuration then names each member by its proxy's
    /// address, so *all* traffic to a member goes through its proxy: from
    /// clients (which discover the members from that configuration), and from
    /// the other members (replication, heartbeats, elections). Inject faults
    /// with [`ReplicaSet::proxy`]. The test kit's own polling bypasses the
    /// proxies.
    pub proxied: bool,
    /// Start with access control (default `None`): `Some((user, password))`
    /// starts every member with a generated `--keyFile` (which implies
    /// `--auth`) and creates `user` with the `root` role through the
    /// localhost exception. [`ReplicaSet::uri`] and [`ReplicaSet::client`]
    /// then carry these credentials.
    pub auth: Option<(String, String)>,
}

impl Default for ReplicaSetOptions {
    fn default() -> Self {
        ReplicaSetOptions {
            members: 1,
            ttl_monitor_sleep_secs: 1,
            fast_elections: true,
            set_name: "rs0".to_owned(),
            startup_timeout: Duration::from_secs(60),
            small_journal: true,
            extra_args: Vec::new(),
            proxied: false,
            auth: None,
        }
    }
}

impl ReplicaSetOptions {
    /// Sets [`members`](Self::members).
    pub fn members(mut self, members: usize) -> Self {
        self.members = members;
        self
    }

    /// Sets [`ttl_monitor_sleep_secs`](Self::ttl_monitor_sleep_secs).
    pub fn ttl_monitor_sleep_secs(mut self, secs: u32) -> Self {
        self.ttl_monitor_sleep_secs = secs;
        self
    }

    /// Sets [`fast_elections`](Self::fast_elections).
    pub fn fast_elections(mut self, fast: bool) -> Self {
        self.fast_elections = fast;
        self
    }

    /// Sets [`set_name`](Self::set_name).
    pub fn set_name(mut self, name: impl Into<String>) -> Self {
        self.set_name = name.into();
        self
    }

    /// Sets [`startup_timeout`](Self::startup_timeout).
    pub fn startup_timeout(mut self, timeout: Duration) -> Self {
        self.startup_timeout = timeout;
        self
    }

    /// Sets [`small_journal`](Self::small_journal).
    pub fn small_journal(mut self, small: bool) -> Self {
        self.small_journal = small;
        self
    }

    /// Appends one extra `mongod` argument (see
    /// [`extra_args`](Self::extra_args)).
    pub fn extra_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// Sets [`proxied`](Self::proxied).
    pub fn proxied(mut self, proxied: bool) -> Self {
        self.proxied = proxied;
        self
    }

    /// Sets [`auth`](Self::auth): access control with one `root` user.
    pub fn auth(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.auth = Some((user.into(), password.into()));
        self
    }

    fn validate(&self) -> Result<(), TestkitError> {
        if self.members == 0 {
            return Err(TestkitError::InvalidOptions(
                "members must be at least 1".into(),
            ));
        }
        if self.members > 50 {
            return Err(TestkitError::InvalidOptions(format!(
                "members is {}, MongoDB allows at most 50",
                self.members
            )));
        }
        if self.set_name.is_empty()
            || self
                .set_name
                .chars()
                .any(|c| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
        {
            return Err(TestkitError::InvalidOptions(format!(
                "set_name {:?} must be non-empty and contain only [A-Za-z0-9_-]",
                self.set_name
            )));
        }
        Ok(())
    }
}

/// One member of a [`ReplicaSet`]: its port, data directory and (while
/// running) its `mongod` child process.
#[derive(Debug)]
pub struct Member {
    index: usize,
    port: u16,
    dir: TempDir,
    proc: Mutex<MemberProc>,
    proxy: Option<FaultProxy>,
}

#[derive(Debug, Default)]
struct MemberProc {
    child: Option<Child>,
    /// Token in the process-exit cleanup registry.
    token: Option<u64>,
}

impl Member {
    /// Index of this member in the set (also its `_id` in the replica set
    /// configuration).
    pub fn index(&self) -> usize {
        self.index
    }

    /// The loopback port this member listens on (stable across
    /// [`ReplicaSet::restart`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The member's host as written in the replica set configuration:
    /// `127.0.0.1:<port>`, or the address of its [`proxy`](Self::proxy) in a
    /// [proxied](ReplicaSetOptions::proxied) set.
    pub fn host(&self) -> String {
        match &self.proxy {
            Some(proxy) => proxy.addr().to_string(),
            None => format!("127.0.0.1:{}", self.port),
        }
    }

    /// The fault proxy in front of this member, in a
    /// [proxied](ReplicaSetOptions::proxied) set.
    pub fn proxy(&self) -> Option<&FaultProxy> {
        self.proxy.as_ref()
    }

    /// A URI connecting directly to this member only, bypassing any proxy
    /// and without credentials:
    /// `mongodb://127.0.0.1:<port>/?directConnection=true`.
    pub fn uri(&self) -> String {
        format!("mongodb://127.0.0.1:{}/?directConnection=true", self.port)
    }

    /// The member's data directory (`--dbpath`); removed when the
    /// [`ReplicaSet`] is dropped.
    pub fn dbpath(&self) -> &Path {
        self.dir.path()
    }

    /// The member's `mongod` log file (`<dbpath>/mongod.log`). Logs of
    /// earlier runs of the member are kept next to it as
    /// `mongod.log.<n>`; anything the process wrote to stdout/stderr goes
    /// to `<dbpath>/mongod.stdio.log`.
    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("mongod.log")
    }

    /// The OS process id of the member's `mongod`, or `None` if it has been
    /// [killed](ReplicaSet::kill).
    pub fn pid(&self) -> Option<u32> {
        self.lock().child.as_ref().map(Child::id)
    }

    /// Whether the member's `mongod` process is running (it has not been
    /// killed and has not exited on its own).
    pub fn is_running(&self) -> bool {
        self.exit_status().is_none() && self.pid().is_some()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemberProc> {
        self.proc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Some(status)` if the child has exited on its own.
    fn exit_status(&self) -> Option<ExitStatus> {
        let mut p = self.lock();
        p.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    fn stdio_path(&self) -> PathBuf {
        self.dir.path().join("mongod.stdio.log")
    }

    /// Last lines of the log and of stdout/stderr, for error messages.
    fn log_tail(&self, lines: usize) -> String {
        let mut out = String::new();
        if let Ok(log) = std::fs::read_to_string(self.log_path()) {
            out.push_str(&tail_lines(&log, lines));
        }
        if let Ok(stdio) = std::fs::read_to_string(self.stdio_path()) {
            let stdio = stdio.trim();
            if !stdio.is_empty() {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str("[stdout/stderr] ");
                out.push_str(&tail_lines(stdio, lines));
            }
        }
        if out.is_empty() {
            out.push_str("(no log output)");
        }
        out
    }

    fn exited_error(&self, status: ExitStatus) -> TestkitError {
        TestkitError::MongodExited {
            member: self.index,
            port: self.port,
            status: status.to_string(),
            log_path: self.log_path(),
            log_tail: self.log_tail(LOG_TAIL_LINES * 2),
        }
    }

    /// Spawns `mongod` for this member on `self.port`.
    async fn spawn(
        &self,
        mongod: &Path,
        opts: &ReplicaSetOptions,
        key_file: Option<&Path>,
    ) -> Result<(), TestkitError> {
        let dir = self.dir.path();
        // Keep earlier logs, and make sure a stale "Waiting for connections"
        // line is never mistaken for the new process being ready.
        let log = self.log_path();
        if log.exists() {
            let mut n = 1;
            while dir.join(format!("mongod.log.{n}")).exists() {
                n += 1;
            }
            std::fs::rename(&log, dir.join(format!("mongod.log.{n}")))
                .map_err(|e| TestkitError::io(format!("renaming {}", log.display()), e))?;
        }
        let stdio = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.stdio_path())
            .map_err(|e| TestkitError::io("creating mongod.stdio.log", e))?;
        let stdio2 = stdio
            .try_clone()
            .map_err(|e| TestkitError::io("duplicating a file handle", e))?;

        let mut cmd = Command::new(mongod);
        cmd.arg("--replSet")
            .arg(&opts.set_name)
            .arg("--port")
            .arg(self.port.to_string())
            .arg("--bind_ip")
            .arg("127.0.0.1")
            .arg("--dbpath")
            .arg(dir)
            .arg("--logpath")
            .arg(&log)
            .arg("--wiredTigerCacheSizeGB")
            .arg("0.25")
            .arg("--setParameter")
            .arg(format!(
                "ttlMonitorSleepSecs={}",
                opts.ttl_monitor_sleep_secs
            ))
            // No /tmp/mongodb-<port>.sock files left behind by SIGKILL.
            .arg("--nounixsocket")
            // No diagnostic.data directory / FTDC thread.
            .arg("--setParameter")
            .arg("diagnosticDataCollectionEnabled=false")
            // SIGTERM (`ReplicaSet::stop`): quiesce for 1 s, not 15 s.
            .arg("--setParameter")
            .arg("shutdownTimeoutMillisForSignaledShutdown=1000");
        if opts.small_journal {
            cmd.arg("--wiredTigerEngineConfigString")
                .arg("log=(file_max=10MB,prealloc=false)");
        }
        if let Some(key_file) = key_file {
            cmd.arg("--keyFile").arg(key_file);
        }
        cmd.args(&opts.extra_args)
            .stdin(Stdio::null())
            .stdout(stdio)
            .stderr(stdio2);

        let child = process::spawn(cmd)
            .await
            .map_err(|e| TestkitError::io(format!("spawning `{}`", mongod.display()), e))?;
        let token = process::register(child.id(), dir);
        tracing::debug!(
            member = self.index,
            port = self.port,
            pid = child.id(),
            "spawned mongod"
        );
        let mut p = self.lock();
        p.child = Some(child);
        p.token = Some(token);
        Ok(())
    }

    /// Waits until the log says the member accepts connections.
    async fn wait_listening(
        &self,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<(), ListenError> {
        let log = self.log_path();
        loop {
            if let Some(status) = self.exit_status() {
                let text = std::fs::read_to_string(&log).unwrap_or_default();
                if status.code() == Some(EXIT_NET_ERROR) || text.contains("Address already in use")
                {
                    return Err(ListenError::AddrInUse);
                }
                return Err(ListenError::Other(self.exited_error(status)));
            }
            if let Ok(text) = std::fs::read_to_string(&log) {
                // 4.4+ JSON logs: "Waiting for connections"; older text logs:
                // "waiting for connections on port".
                if text.contains("aiting for connections") {
                    return Ok(());
                }
            }
            if Instant::now() >= deadline {
                return Err(ListenError::Other(TestkitError::Timeout {
                    what: format!(
                        "mongod member {} to listen on port {}",
                        self.index, self.port
                    ),
                    timeout,
                    log_tail: self.log_tail(LOG_TAIL_LINES),
                }));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Takes the child out (unregistering it) so it can be killed.
    fn take_child(&self) -> Option<Child> {
        let mut p = self.lock();
        if let Some(token) = p.token.take() {
            process::unregister(token);
        }
        p.child.take()
    }

    /// Sends SIGKILL without reaping (used to kill all members in parallel).
    fn signal_kill(&self) {
        if let Some(child) = self.lock().child.as_mut() {
            let _ = child.kill();
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut child) = self.take_child() {
            let _ = child.kill();
            let _ = child.wait();
        }
        // `self.dir` (TempDir) is dropped afterwards and removes the data.
    }
}

enum ListenError {
    AddrInUse,
    Other(TestkitError),
}

/// Role of a member as reported by `hello`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    Primary,
    Secondary,
    Other,
}

async fn hello_role(client: &Client) -> Option<Role> {
    let reply = client
        .database("admin")
        .run_command(doc! { "hello": 1 })
        .await
        .ok()?;
    Some(if reply.get_bool("isWritablePrimary").unwrap_or(false) {
        Role::Primary
    } else if reply.get_bool("secondary").unwrap_or(false) {
        Role::Secondary
    } else {
        Role::Other
    })
}

/// A throwaway replica set of real `mongod` processes on `127.0.0.1`.
///
/// Created by [`ReplicaSet::start`]. Dropping it kills every member
/// (`SIGKILL`, then reaps it) and removes the data directories; if the
/// process dies without dropping it, the members are killed by the kernel
/// (`PR_SET_PDEATHSIG`, Linux) or by an exit hook. See the
/// [module docs](super) for details.
///
/// The async methods need a tokio runtime with the time driver enabled
/// (any `#[tokio::test]` qualifies). Drop blocks briefly while the killed
/// processes are reaped.
#[derive(Debug)]
pub struct ReplicaSet {
    opts: ReplicaSetOptions,
    mongod: PathBuf,
    members: Vec<Member>,
    startup_time: Duration,
    /// Directory holding the key file of an access-controlled set.
    key_dir: Option<TempDir>,
    /// The `root` user exists: the test kit's own clients authenticate.
    users_ready: bool,
}

impl ReplicaSet {
    /// Starts a replica set and waits until it is healthy.
    ///
    /// Steps: locate `mongod` ([`mongod_path`]); pick a free loopback port
    /// and create a temporary data directory per member; spawn all members
    /// in parallel (if a port was taken meanwhile, the member is retried on
    /// a new port); run `replSetInitiate` through a direct connection to
    /// member 0, which gets priority 2 (others 1) so it is the preferred
    /// primary (and is nudged with `replSetStepUp` instead of waiting for an
    /// election timeout); then poll `hello` every 50 ms until one member is
    /// a writable primary **and** every other member is a secondary (so
    /// `w: "majority"` writes work immediately).
    ///
    /// Typical time on a 2-core machine: ~0.4 s for one member, ~2.1 s for
    /// three (most of it the secondaries' initial sync). All of this is
    /// bounded by [`startup_timeout`](ReplicaSetOptions::startup_timeout);
    /// errors include the tail of the relevant `mongod.log`. On error every
    /// member started so far is killed and its directory removed.
    ///
    /// If `mongod` must first be installed, this blocks the calling thread
    /// for the few seconds `pip` takes (once per checkout).
    pub async fn start(opts: ReplicaSetOptions) -> Result<ReplicaSet, TestkitError> {
        opts.validate()?;
        let mongod = mongod_path()?;
        process::sweep_stale_dirs();

        let began = Instant::now();
        let deadline = began + opts.startup_timeout;
        let ports = pick_ports(opts.members)?;
        let pid = std::process::id();
        let mut members = Vec::with_capacity(opts.members);
        for (index, port) in ports.into_iter().enumerate() {
            let dir = tempfile::Builder::new()
                .prefix(&format!("{DIR_PREFIX}{pid}-"))
                .tempdir()
                .map_err(|e| TestkitError::io("creating a temporary data directory", e))?;
            members.push(Member {
                index,
                port,
                dir,
                proc: Mutex::new(MemberProc::default()),
                proxy: None,
            });
        }
        let key_dir = match &opts.auth {
            Some(_) => Some(write_key_file()?),
            None => None,
        };
        let mut rs = ReplicaSet {
            opts,
            mongod,
            members,
            startup_time: Duration::ZERO,
            key_dir,
            users_ready: false,
        };

        // Spawn everything first so the members boot in parallel.
        for m in &rs.members {
            m.spawn(&rs.mongod, &rs.opts, rs.key_file().as_deref())
                .await?;
        }
        for i in 0..rs.members.len() {
            let mut attempts = 1;
            loop {
                match rs.members[i]
                    .wait_listening(deadline, rs.opts.startup_timeout)
                    .await
                {
                    Ok(()) => break,
                    Err(ListenError::Other(e)) => return Err(e),
                    Err(ListenError::AddrInUse) if attempts >= PORT_ATTEMPTS => {
                        return Err(TestkitError::PortConflict {
                            member: i,
                            attempts,
                        });
                    }
                    Err(ListenError::AddrInUse) => {
                        attempts += 1;
                        let member = &mut rs.members[i];
                        tracing::debug!(member = i, port = member.port, "port taken, retrying");
                        if let Some(mut child) = member.take_child() {
                            let _ = child.wait();
                        }
                        member.port = pick_ports(1)?[0];
                        let key_file = rs.key_file();
                        rs.members[i]
                            .spawn(&rs.mongod, &rs.opts, key_file.as_deref())
                            .await?;
                    }
                }
            }
        }
        let listening = began.elapsed();
        if rs.opts.proxied {
            for m in &mut rs.members {
                m.proxy = Some(FaultProxy::start(([127, 0, 0, 1], m.port).into()).await?);
            }
        }

        rs.initiate(deadline).await?;
        let primary_after = rs.wait_healthy(deadline, began).await?;
        if rs.opts.auth.is_some() {
            rs.create_root_user(deadline).await?;
            rs.users_ready = true;
        }
        rs.startup_time = began.elapsed();
        let hosts: Vec<String> = rs.members.iter().map(Member::host).collect();
        tracing::info!(
            members = rs.members.len(),
            hosts = %hosts.join(","),
            listening_ms = listening.as_millis() as u64,
            primary_ms = primary_after.as_millis() as u64,
            healthy_ms = rs.startup_time.as_millis() as u64,
            "testkit replica set ready"
        );
        Ok(rs)
    }

    /// Runs `replSetInitiate` on member 0 (retrying transient failures).
    async fn initiate(&self, deadline: Instant) -> Result<(), TestkitError> {
        let members: Vec<Bson> = self
            .members
            .iter()
            .map(|m| {
                let mut d = doc! { "_id": m.index as i32, "host": m.host() };
                if m.index >= MAX_VOTERS {
                    d.insert("priority", 0);
                    d.insert("votes", 0);
                } else {
                    d.insert("priority", if m.index == 0 { 2 } else { 1 });
                }
                Bson::Document(d)
            })
            .collect();
        let mut config = doc! { "_id": &self.opts.set_name, "members": members };
        if self.opts.fast_elections {
            config.insert(
                "settings",
                doc! { "electionTimeoutMillis": 1000, "heartbeatIntervalMillis": 500 },
            );
        }
        let client = self.direct_client(0).await?;
        let admin = client.database("admin");
        loop {
            match admin
                .run_command(doc! { "replSetInitiate": config.clone() })
                .await
            {
                Ok(_) => return Ok(()),
                // AlreadyInitialized: an earlier attempt went through.
                Err(e) if error_code(&e) == Some(23) => return Ok(()),
                Err(e) => {
                    if let Some(status) = self.members[0].exit_status() {
                        return Err(self.members[0].exited_error(status));
                    }
                    if Instant::now() >= deadline {
                        return Err(TestkitError::driver(
                            format!(
                                "running replSetInitiate on member 0; last lines of the logs:\n{}",
                                self.logs_tail()
                            ),
                            e,
                        ));
                    }
                    tracing::debug!(error = %e, "replSetInitiate failed, retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    /// Waits until there is a writable primary and all other members are
    /// secondaries. Returns when the primary was first seen (since `began`).
    async fn wait_healthy(
        &self,
        deadline: Instant,
        began: Instant,
    ) -> Result<Duration, TestkitError> {
        let clients = self.direct_clients().await?;
        let mut primary_seen: Option<Duration> = None;
        let mut last_step_up: Option<Instant> = None;
        loop {
            self.check_alive()?;
            let roles = futures::future::join_all(clients.iter().map(hello_role)).await;
            let primaries = roles.iter().filter(|r| **r == Some(Role::Primary)).count();
            if primaries > 0 && primary_seen.is_none() {
                primary_seen = Some(began.elapsed());
            }
            // Member 0 would only stand for election after an election
            // timeout; ask it to do so right away (saves ~1 s, or ~10 s
            // without fast elections). Failures (e.g. the others don't have
            // the config yet) are harmless: just try again.
            if primaries == 0
                && roles.len() > 1
                && roles[0] == Some(Role::Secondary)
                && last_step_up.is_none_or(|t| t.elapsed() >= Duration::from_millis(250))
            {
                last_step_up = Some(Instant::now());
                let _ = clients[0]
                    .database("admin")
                    .run_command(doc! { "replSetStepUp": 1 })
                    .await;
            }
            let secondaries = roles
                .iter()
                .filter(|r| **r == Some(Role::Secondary))
                .count();
            if primaries == 1 && primaries + secondaries == roles.len() {
                return Ok(primary_seen.unwrap_or_default());
            }
            if Instant::now() >= deadline {
                let what = match primary_seen {
                    None => "a writable primary".to_owned(),
                    Some(_) => format!("all members to be PRIMARY/SECONDARY (roles: {roles:?})"),
                };
                return Err(self.timeout(what));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Errors if a member that should be running has exited.
    fn check_alive(&self) -> Result<(), TestkitError> {
        for m in &self.members {
            if let Some(status) = m.exit_status() {
                return Err(m.exited_error(status));
            }
        }
        Ok(())
    }

    fn timeout(&self, what: String) -> TestkitError {
        TestkitError::Timeout {
            what,
            timeout: self.opts.startup_timeout,
            log_tail: self.logs_tail(),
        }
    }

    fn logs_tail(&self) -> String {
        self.members
            .iter()
            .map(|m| {
                format!(
                    "--- member {} (port {}, {}) ---\n{}",
                    m.index,
                    m.port,
                    m.log_path().display(),
                    m.log_tail(LOG_TAIL_LINES)
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn direct_clients(&self) -> Result<Vec<Client>, TestkitError> {
        let mut clients = Vec::with_capacity(self.members.len());
        for i in 0..self.members.len() {
            clients.push(self.direct_client(i).await?);
        }
        Ok(clients)
    }

    /// The replica-set connection string:
    /// `mongodb://127.0.0.1:P1,127.0.0.1:P2,.../?replicaSet=NAME` (the
    /// members' [hosts](Member::host), so the proxies' addresses in a
    /// [proxied](ReplicaSetOptions::proxied) set). With
    /// [`auth`](ReplicaSetOptions::auth) it carries the credentials:
    /// `mongodb://USER:PASSWORD@.../?replicaSet=NAME&authSource=admin`.
    pub fn uri(&self) -> String {
        let hosts: Vec<String> = self.members.iter().map(Member::host).collect();
        match &self.opts.auth {
            None => format!(
                "mongodb://{}/?replicaSet={}",
                hosts.join(","),
                self.opts.set_name
            ),
            Some((user, password)) => format!(
                "mongodb://{}:{}@{}/?replicaSet={}&authSource=admin",
                encode_userinfo(user),
                encode_userinfo(password),
                hosts.join(","),
                self.opts.set_name
            ),
        }
    }

    /// The fault proxy in front of member `i`, in a
    /// [proxied](ReplicaSetOptions::proxied) set.
    ///
    /// # Panics
    ///
    /// If `i >= self.members().len()`, or if the set is not proxied.
    pub fn proxy(&self, i: usize) -> &FaultProxy {
        self.members[i]
            .proxy()
            .expect("ReplicaSet::proxy needs ReplicaSetOptions::proxied(true)")
    }

    fn key_file(&self) -> Option<PathBuf> {
        self.key_dir.as_ref().map(|d| d.path().join("keyfile"))
    }

    /// A client for member `i` only, with short timeouts, for polling and
    /// administration; it bypasses the proxies and, once the `root` user
    /// exists, authenticates as it.
    async fn direct_client(&self, i: usize) -> Result<Client, TestkitError> {
        let member = &self.members[i];
        let mut uri = format!(
            "{}&serverSelectionTimeoutMS=2000&connectTimeoutMS=2000&appName=mongo-lease-testkit",
            member.uri()
        );
        let mut shown = uri.clone();
        if let (Some((user, password)), true) = (&self.opts.auth, self.users_ready) {
            let userinfo = format!("{}:{}@", encode_userinfo(user), encode_userinfo(password));
            uri = uri.replacen("mongodb://", &format!("mongodb://{userinfo}"), 1);
            uri.push_str("&authSource=admin");
            shown.push_str(" (authenticated)");
        }
        Client::with_uri_str(&uri)
            .await
            .map_err(|e| TestkitError::driver(format!("creating a client for {shown}"), e))
    }

    /// Creates the `root` user of an access-controlled set on its primary,
    /// through the localhost exception (no user exists yet).
    async fn create_root_user(&self, deadline: Instant) -> Result<(), TestkitError> {
        let Some((user, password)) = &self.opts.auth else {
            return Ok(());
        };
        loop {
            let primary = {
                let clients = self.direct_clients().await?;
                self.find_primary(&clients).await
            };
            if let Some(primary) = primary {
                let client = self.direct_client(primary).await?;
                let result = client
                    .database("admin")
                    .run_command(doc! {
                        "createUser": user,
                        "pwd": password,
                        "roles": [{ "role": "root", "db": "admin" }],
                        "writeConcern": { "w": "majority" },
                    })
                    .await;
                match result {
                    Ok(_) => return Ok(()),
                    Err(e) if Instant::now() >= deadline => {
                        return Err(TestkitError::driver("creating the root user", e));
                    }
                    Err(e) => tracing::debug!(error = %e, "createUser failed, retrying"),
                }
            } else if Instant::now() >= deadline {
                return Err(self.timeout("a primary to create the root user on".into()));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A URI connecting directly to member `i` only
    /// (`mongodb://127.0.0.1:P/?directConnection=true`).
    ///
    /// # Panics
    ///
    /// If `i >= self.members().len()`.
    pub fn member_uri(&self, i: usize) -> String {
        self.members[i].uri()
    }

    /// The members, indexed like the replica set configuration `_id`s.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// The replica set name.
    pub fn set_name(&self) -> &str {
        &self.opts.set_name
    }

    /// The options the set was started with.
    pub fn options(&self) -> &ReplicaSetOptions {
        &self.opts
    }

    /// How long [`start`](Self::start) took from spawning the first
    /// `mongod` until the set was healthy.
    pub fn startup_time(&self) -> Duration {
        self.startup_time
    }

    /// A new driver client for [`uri`](Self::uri) (default driver options).
    pub async fn client(&self) -> Result<Client, TestkitError> {
        Client::with_uri_str(self.uri())
            .await
            .map_err(|e| TestkitError::driver("creating a client", e))
    }

    fn member(&self, i: usize) -> Result<&Member, TestkitError> {
        self.members.get(i).ok_or(TestkitError::NoSuchMember {
            index: i,
            len: self.members.len(),
        })
    }

    /// Kills member `i` with `SIGKILL` (a crash: no clean shutdown) and
    /// waits until the process is gone. Its port and data directory are
    /// kept for [`restart`](Self::restart). Killing an already killed
    /// member is a no-op.
    pub async fn kill(&self, i: usize) -> Result<(), TestkitError> {
        let member = self.member(i)?;
        if let Some(mut child) = member.take_child() {
            let _ = child.kill();
            loop {
                match child.try_wait() {
                    Ok(Some(_)) => break,
                    Ok(None) => tokio::time::sleep(Duration::from_millis(5)).await,
                    Err(e) => return Err(TestkitError::io("waiting for a killed mongod", e)),
                }
            }
            tracing::debug!(member = i, "killed mongod");
        }
        Ok(())
    }

    /// Stops member `i` cleanly (`SIGTERM`: a primary steps down first, data
    /// is flushed) and waits until the process has exited, bounded by
    /// [`startup_timeout`](ReplicaSetOptions::startup_timeout) (then it is
    /// killed). Its port and data directory are kept for
    /// [`restart`](Self::restart). Stopping a member that is not running is a
    /// no-op.
    pub async fn stop(&self, i: usize) -> Result<(), TestkitError> {
        let member = self.member(i)?;
        let Some(mut child) = member.take_child() else {
            return Ok(());
        };
        #[cfg(unix)]
        // SAFETY: signalling our own, not yet reaped child.
        unsafe {
            libc::kill(child.id() as libc::pid_t, libc::SIGTERM);
        }
        let deadline = Instant::now() + self.opts.startup_timeout;
        loop {
            match child.try_wait() {
                Ok(Some(status)) => {
                    tracing::debug!(member = i, %status, "stopped mongod");
                    return Ok(());
                }
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    return Err(self.timeout(format!("member {i} to shut down after SIGTERM")));
                }
                Ok(None) => tokio::time::sleep(Duration::from_millis(10)).await,
                Err(e) => return Err(TestkitError::io("waiting for a stopped mongod", e)),
            }
        }
    }

    /// Restarts member `i` on the same port and data directory, killing it
    /// first (`SIGKILL`) if it is running, and waits (bounded by
    /// [`startup_timeout`](ReplicaSetOptions::startup_timeout)) until it
    /// reports itself as primary or secondary again.
    pub async fn restart(&self, i: usize) -> Result<(), TestkitError> {
        self.kill(i).await?;
        let member = self.member(i)?;
        let deadline = Instant::now() + self.opts.startup_timeout;
        member
            .spawn(&self.mongod, &self.opts, self.key_file().as_deref())
            .await?;
        match member
            .wait_listening(deadline, self.opts.startup_timeout)
            .await
        {
            Ok(()) => {}
            Err(ListenError::AddrInUse) => {
                let _ = self.kill(i).await;
                return Err(TestkitError::PortConflict {
                    member: i,
                    attempts: 1,
                });
            }
            Err(ListenError::Other(e)) => return Err(e),
        }
        let client = self.direct_client(i).await?;
        loop {
            if let Some(status) = member.exit_status() {
                return Err(member.exited_error(status));
            }
            if matches!(
                hello_role(&client).await,
                Some(Role::Primary | Role::Secondary)
            ) {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(self.timeout(format!(
                    "restarted member {i} to become PRIMARY or SECONDARY"
                )));
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Index of the current writable primary among the running members,
    /// if any (one round of `hello`).
    pub async fn primary(&self) -> Option<usize> {
        let clients = self.direct_clients().await.ok()?;
        self.find_primary(&clients).await
    }

    /// One concurrent round of `hello` on the running members.
    async fn find_primary(&self, clients: &[Client]) -> Option<usize> {
        let roles =
            futures::future::join_all(self.members.iter().zip(clients).map(|(m, c)| async move {
                if m.is_running() {
                    hello_role(c).await
                } else {
                    None
                }
            }))
            .await;
        roles.iter().position(|r| *r == Some(Role::Primary))
    }

    /// Polls `hello` on the running members every 50 ms until one of them
    /// is a writable primary, and returns its index.
    pub async fn wait_for_primary(&self, timeout: Duration) -> Result<usize, TestkitError> {
        let deadline = Instant::now() + timeout;
        let clients = self.direct_clients().await?;
        loop {
            if let Some(i) = self.find_primary(&clients).await {
                return Ok(i);
            }
            if Instant::now() >= deadline {
                return Err(TestkitError::Timeout {
                    what: "a writable primary".into(),
                    timeout,
                    log_tail: self.logs_tail(),
                });
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Asks the current primary to step down (`replSetStepDown` with
    /// `stepDownSecs: 60`, `secondaryCatchUpPeriodSecs: 10`; on a
    /// single-member set `secondaryCatchUpPeriodSecs: 0, force: true`) and
    /// returns the index of the old primary.
    /// Does not wait for a new primary: use
    /// [`wait_for_primary`](Self::wait_for_primary).
    ///
    /// The old primary cannot be re-elected for 60 s (so a single-member
    /// set has no primary for that long); afterwards member 0, having the
    /// highest priority, takes over again. See
    /// [`step_down_for`](Self::step_down_for) to choose the duration.
    pub async fn step_down(&self) -> Result<usize, TestkitError> {
        self.step_down_for(Duration::from_secs(60)).await
    }

    /// Like [`step_down`](Self::step_down), with `stepDownSecs` set to
    /// `ineligible` (rounded up to whole seconds, at least 1 s) and
    /// `secondaryCatchUpPeriodSecs` to half of that, at most 10 s (0 on a
    /// single-member set).
    pub async fn step_down_for(&self, ineligible: Duration) -> Result<usize, TestkitError> {
        let primary = self.primary().await.ok_or(TestkitError::NoPrimary)?;
        let secs = ineligible.as_secs_f64().ceil().max(1.0) as i64;
        let client = self.direct_client(primary).await?;
        let single = self.members.len() == 1;
        // Must be shorter than stepDownSecs; a single member has nobody to
        // wait for (and needs `force`).
        let catch_up = if single { 0 } else { (secs / 2).min(10) };
        let cmd = doc! {
            "replSetStepDown": secs,
            "secondaryCatchUpPeriodSecs": catch_up,
            "force": single,
        };
        match client.database("admin").run_command(cmd).await {
            Ok(_) => {}
            // Older servers close the connection / interrupt the command
            // while stepping down; that still means success.
            Err(e)
                if matches!(*e.kind, mongodb::error::ErrorKind::Io(_))
                    || error_code(&e) == Some(11602) => {}
            Err(e) => {
                return Err(TestkitError::driver(
                    format!("running replSetStepDown on member {primary}"),
                    e,
                ));
            }
        }
        tracing::debug!(member = primary, "primary stepped down");
        Ok(primary)
    }
}

impl Drop for ReplicaSet {
    fn drop(&mut self) {
        // SIGKILL everyone first so they die in parallel; each Member's
        // Drop then reaps its process and removes its directory.
        for m in &self.members {
            m.signal_kill();
        }
    }
}

/// Percent-encodes a user name or password for a connection string.
fn encode_userinfo(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Writes a random key file (mode 0400) into a fresh temporary directory.
fn write_key_file() -> Result<TempDir, TestkitError> {
    let dir = tempfile::Builder::new()
        .prefix(&format!("{DIR_PREFIX}{}-key-", std::process::id()))
        .tempdir()
        .map_err(|e| TestkitError::io("creating a key file directory", e))?;
    let key: String = (0..4)
        .map(|_| format!("{:016x}", super::random_u64()))
        .collect();
    let path = dir.path().join("keyfile");
    std::fs::write(&path, key).map_err(|e| TestkitError::io("writing the key file", e))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o400))
            .map_err(|e| TestkitError::io("restricting the key file's permissions", e))?;
    }
    Ok(dir)
}

fn error_code(e: &mongodb::error::Error) -> Option<i32> {
    match &*e.kind {
        mongodb::error::ErrorKind::Command(c) => Some(c.code),
        _ => None,
    }
}

/// Picks `n` distinct free loopback ports (all listeners are held until
/// every port is chosen, then released).
fn pick_ports(n: usize) -> Result<Vec<u16>, TestkitError> {
    let mut listeners = Vec::with_capacity(n);
    for _ in 0..n {
        let l = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| TestkitError::io("binding 127.0.0.1:0 to pick a free port", e))?;
        listeners.push(l);
    }
    listeners
        .iter()
        .map(|l| {
            l.local_addr()
                .map(|a| a.port())
                .map_err(|e| TestkitError::io("reading a listener's port", e))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_validation() {
        assert!(ReplicaSetOptions::default().validate().is_ok());
        assert!(ReplicaSetOptions::default().members(0).validate().is_err());
        assert!(ReplicaSetOptions::default().members(51).validate().is_err());
        assert!(
            ReplicaSetOptions::default()
                .set_name("")
                .validate()
                .is_err()
        );
        assert!(
            ReplicaSetOptions::default()
                .set_name("a/b")
                .validate()
                .is_err()
        );
    }

    #[test]
    fn ports_are_distinct() {
        let ports = pick_ports(5).unwrap();
        let mut dedup = ports.clone();
        dedup.sort_unstable();
        dedup.dedup();
        assert_eq!(dedup.len(), 5);
    }
}
