//! [`Member`]: one `mongod` of a replica set, its port, data directory,
//! logs and child process (spawn, wait until it listens, kill, reap).

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tempfile::TempDir;

#[cfg(doc)]
use super::ReplicaSet;
use super::TestkitError;
use super::install::tail_lines;
use super::options::ReplicaSetOptions;
use super::process;
use super::proxy::FaultProxy;

/// Poll interval for log files and `hello`.
pub(super) const POLL: Duration = Duration::from_millis(50);
/// Lines of each member's log included in error messages.
pub(super) const LOG_TAIL_LINES: usize = 15;
/// How many ports a member may try when its port gets taken between picking
/// it and `mongod` binding it (at start: a fresh port each time; at restart:
/// the same port again, after a pause).
pub(super) const PORT_ATTEMPTS: usize = 5;
/// `mongod` exit code for "address already in use" (`EXIT_NET_ERROR`).
const EXIT_NET_ERROR: i32 = 48;

/// One member of a [`ReplicaSet`]: its port, data directory and (while
/// running) its `mongod` child process.
#[derive(Debug)]
pub struct Member {
    pub(super) index: usize,
    pub(super) port: u16,
    pub(super) dir: TempDir,
    pub(super) proc: Mutex<MemberProc>,
    pub(super) proxy: Option<FaultProxy>,
}

#[derive(Debug, Default)]
pub(super) struct MemberProc {
    child: Option<Child>,
    /// Token in the process-exit cleanup registry.
    token: Option<u64>,
    /// Stopped with `SIGSTOP` ([`ReplicaSet::freeze`]) and not resumed since.
    frozen: bool,
}

impl Member {
    /// A member not started yet, with a fresh temporary data directory.
    pub(super) fn new(index: usize, port: u16) -> Result<Member, TestkitError> {
        let dir = tempfile::Builder::new()
            .prefix(&format!("{}{}-", process::DIR_PREFIX, std::process::id()))
            .tempdir()
            .map_err(|e| TestkitError::io("creating a temporary data directory", e))?;
        Ok(Member {
            index,
            port,
            dir,
            proc: Mutex::new(MemberProc::default()),
            proxy: None,
        })
    }

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

    /// Whether the member's `mongod` is frozen ([`ReplicaSet::freeze`]):
    /// stopped with `SIGSTOP` and not yet [thawed](ReplicaSet::thaw).
    pub fn is_frozen(&self) -> bool {
        self.lock().frozen
    }

    /// Sends `SIGSTOP` (`freeze`) or `SIGCONT` to the running process and
    /// records the state. `false` if the member is not running.
    pub(super) fn set_frozen(&self, freeze: bool) -> bool {
        let mut p = self.lock();
        let Some(child) = p.child.as_ref() else {
            return false;
        };
        let signal = if freeze { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: signalling our own, not yet reaped child.
        unsafe {
            libc::kill(child.id() as libc::pid_t, signal);
        }
        p.frozen = freeze;
        true
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, MemberProc> {
        self.proc.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `Some(status)` if the child has exited on its own.
    pub(super) fn exit_status(&self) -> Option<ExitStatus> {
        let mut p = self.lock();
        p.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    fn stdio_path(&self) -> PathBuf {
        self.dir.path().join("mongod.stdio.log")
    }

    /// Last lines of the log and of stdout/stderr, for error messages.
    pub(super) fn log_tail(&self, lines: usize) -> String {
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

    pub(super) fn exited_error(&self, status: ExitStatus) -> TestkitError {
        TestkitError::MongodExited {
            member: self.index,
            port: self.port,
            status: status.to_string(),
            log_path: self.log_path(),
            log_tail: self.log_tail(LOG_TAIL_LINES * 2),
        }
    }

    /// Spawns `mongod` for this member on `self.port`, as a member of the
    /// replica set `opts.set_name`.
    pub(super) async fn spawn(
        &self,
        mongod: &Path,
        opts: &ReplicaSetOptions,
        key_file: Option<&Path>,
    ) -> Result<(), TestkitError> {
        self.spawn_mongod(mongod, Some(&opts.set_name), opts, key_file)
            .await
    }

    /// Spawns `mongod` on `self.port`: with `--replSet <set_name>`, or a
    /// standalone server (no `--replSet`) when `set_name` is `None`.
    pub(super) async fn spawn_mongod(
        &self,
        mongod: &Path,
        set_name: Option<&str>,
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
        if let Some(set_name) = set_name {
            cmd.arg("--replSet").arg(set_name);
        }
        cmd.arg("--port")
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
        cmd.envs(opts.env.iter().map(|(name, value)| (name, value)));
        cmd.envs(
            (opts.member_env.iter())
                .filter(|(index, ..)| *index == self.index)
                .map(|(_, name, value)| (name, value)),
        );
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
        p.frozen = false;
        p.token = Some(token);
        Ok(())
    }

    /// Waits until the log says the member accepts connections.
    pub(super) async fn wait_listening(
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

    /// Waits until the spawned `mongod` listens; if its port was taken
    /// before `mongod` bound it, starts it again on a fresh port, up to
    /// [`PORT_ATTEMPTS`] ports.
    pub(super) async fn wait_listening_on_a_free_port(
        &mut self,
        mongod: &Path,
        set_name: Option<&str>,
        opts: &ReplicaSetOptions,
        key_file: Option<&Path>,
        deadline: Instant,
    ) -> Result<(), TestkitError> {
        let mut attempts = 1;
        loop {
            match self.wait_listening(deadline, opts.startup_timeout).await {
                Ok(()) => return Ok(()),
                Err(ListenError::Other(e)) => return Err(e),
                Err(ListenError::AddrInUse) if attempts >= PORT_ATTEMPTS => {
                    return Err(TestkitError::PortConflict {
                        member: self.index,
                        attempts,
                    });
                }
                Err(ListenError::AddrInUse) => {
                    attempts += 1;
                    tracing::debug!(
                        member = self.index,
                        port = self.port,
                        "port taken, retrying"
                    );
                    if let Some(mut child) = self.take_child() {
                        let _ = child.wait();
                    }
                    self.port = pick_ports(1)?[0];
                    self.spawn_mongod(mongod, set_name, opts, key_file).await?;
                }
            }
        }
    }

    /// Takes the child out (unregistering it) so it can be killed.
    pub(super) fn take_child(&self) -> Option<Child> {
        let mut p = self.lock();
        p.frozen = false;
        if let Some(token) = p.token.take() {
            process::unregister(token);
        }
        p.child.take()
    }

    /// Sends SIGKILL without reaping (used to kill all members in parallel).
    pub(super) fn signal_kill(&self) {
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

pub(super) enum ListenError {
    AddrInUse,
    Other(TestkitError),
}

/// Picks `n` distinct free loopback ports (all listeners are held until
/// every port is chosen, then released).
pub(super) fn pick_ports(n: usize) -> Result<Vec<u16>, TestkitError> {
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
mod tests;
