//! The `mongo-lease` binary run by the tests: a database of its own per
//! test, processes whose output is read line by line, exit codes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use mongo_lease::LeaseManager;

pub const BIN: &str = env!("CARGO_BIN_EXE_mongo-lease");
pub const WAIT: Duration = Duration::from_secs(20);

/// Exit codes documented in `mongo-lease --help`.
pub const USAGE: i32 = 2;
pub const UNAVAILABLE: i32 = 69;
pub const NOT_ACQUIRED: i32 = 75;
pub const LEASE_LOST: i32 = 76;
pub const KIND_MISMATCH: i32 = 78;

/// A database of its own on the shared test server, for the binary.
pub struct Env {
    pub uri: String,
    pub db: String,
    /// Clients made in this process, shut down on drop (`super::shut_down`).
    pub clients: std::sync::Mutex<Vec<mongodb::Client>>,
}

impl Drop for Env {
    fn drop(&mut self) {
        super::shut_down(std::mem::take(&mut *self.clients.lock().unwrap()));
    }
}

/// The `--clock-skew` of the commands the tests run: their deployment is one
/// member, whose clock steps only when set, and their leases last a second
/// or two.
pub const CLOCK_SKEW: &str = "100ms";

impl Env {
    pub fn new(prefix: &str) -> Env {
        Env {
            uri: super::uri(),
            db: mongo_lease::testkit::unique_name(prefix),
            clients: Default::default(),
        }
    }

    /// `mongo-lease ARGS` with this database (collection `leases`), and a
    /// clock skew of [`CLOCK_SKEW`] (one member: leases of a second or two).
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(BIN);
        cmd.env("MONGODB_URI", &self.uri)
            .env("MONGO_LEASE_DB", &self.db)
            .env("MONGO_LEASE_CLOCK_SKEW", CLOCK_SKEW)
            .env_remove("MONGO_LEASE_COLLECTION")
            .env_remove("MONGO_LEASE_OWNER_ID")
            .env_remove("MONGO_LEASE_FOREIGN_LOCK")
            .args(args);
        cmd
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.cmd(args).output().expect("run mongo-lease")
    }

    /// Spawns `mongo-lease ARGS` with its stdout read line by line.
    pub fn spawn(&self, args: &[&str]) -> Proc {
        let mut child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn mongo-lease");
        let stderr = child.stderr.take().unwrap();
        Proc::read(child, stderr)
    }

    /// Spawns `mongo-lease ARGS` with its stderr on a terminal (a
    /// pseudo-terminal this test reads), as at a user's shell.
    pub fn spawn_on_terminal(&self, args: &[&str]) -> Proc {
        use std::os::fd::FromRawFd;
        let (mut terminal, mut its_side) = (-1, -1);
        // SAFETY: openpty(3) writes two descriptors into the given ints; the
        // name, termios and window size may be null.
        let opened = unsafe {
            libc::openpty(
                &mut terminal,
                &mut its_side,
                std::ptr::null_mut(),
                std::ptr::null(),
                std::ptr::null(),
            )
        };
        assert_eq!(opened, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: both descriptors were just opened and are owned here alone.
        let (terminal, its_side) = unsafe {
            (
                std::fs::File::from_raw_fd(terminal),
                std::os::fd::OwnedFd::from_raw_fd(its_side),
            )
        };
        let child = self
            .cmd(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(its_side))
            .spawn()
            .expect("spawn mongo-lease");
        Proc::read(child, terminal)
    }

    /// The lock collection of this database, through a client of the
    /// current runtime. On a multi-threaded runtime the client is shut down
    /// with the others when this is dropped; a single-threaded runtime (as in
    /// [`Env::wait_for_waiting_mark_blocking`]) drops its driver tasks with
    /// itself and needs none of that (`super::shut_down`).
    pub async fn leases(&self) -> mongodb::Collection<mongodb::bson::Document> {
        let client = mongodb::Client::with_uri_str(&self.uri).await.unwrap();
        if tokio::runtime::Handle::current().runtime_flavor()
            == tokio::runtime::RuntimeFlavor::MultiThread
        {
            self.clients.lock().unwrap().push(client.clone());
        }
        client.database(&self.db).collection("leases")
    }

    /// Waits until the lease on `key` carries a waiting mark (`wt`): another
    /// owner's attempt found it held and now waits for it.
    pub async fn wait_for_waiting_mark(&self, key: &str) {
        let leases = self.leases().await;
        super::eventually(&format!("a waiting mark on {key:?}"), WAIT, || async {
            leases
                .find_one(mongodb::bson::doc! { "_id": key })
                .await
                .unwrap()
                .is_some_and(|doc| doc.contains_key("wt"))
        })
        .await;
    }

    /// [`Env::wait_for_waiting_mark`] from a synchronous test (on a runtime
    /// of its own, which owns the client it uses).
    pub fn wait_for_waiting_mark_blocking(&self, key: &str) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(self.wait_for_waiting_mark(key));
    }

    pub async fn manager(&self, ttl: Duration) -> LeaseManager {
        let client = mongodb::Client::with_uri_str(&self.uri).await.unwrap();
        self.clients.lock().unwrap().push(client.clone());
        super::manager_on(client.database(&self.db), "leases", ttl).await
    }
}

/// A running `mongo-lease`, with its stdout and stderr lines (stderr ones
/// prefixed with `stderr: `).
pub struct Proc {
    pub child: Child,
    lines: mpsc::Receiver<String>,
    /// Lines received but not matched yet (stdout and stderr arrive through
    /// two pipes, so their relative order is not kept).
    seen: std::cell::RefCell<Vec<String>>,
}

impl Proc {
    /// Reads `child`'s stdout and its stderr (from `stderr`) line by line.
    fn read(mut child: Child, stderr: impl std::io::Read + Send + 'static) -> Proc {
        let (tx, lines) = mpsc::channel();
        let stdout = child.stdout.take().unwrap();
        let out = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = out.send(line);
            }
        });
        std::thread::spawn(move || {
            // A terminal ends its lines with "\r\n"; reading it fails (EIO)
            // once the process and its children closed it.
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(format!("stderr: {}", line.trim_end_matches('\r')));
            }
        });
        Proc {
            child,
            lines,
            seen: Default::default(),
        }
    }

    /// Waits for a line containing `needle`; returns it.
    pub fn expect_line(&self, needle: &str) -> String {
        self.expect_line_within(needle, WAIT)
    }

    /// Waits for a line containing `needle`; `limit` only turns a hang into
    /// a failure.
    pub fn expect_line_within(&self, needle: &str, limit: Duration) -> String {
        let mut seen = self.seen.borrow_mut();
        if let Some(i) = seen.iter().position(|l| l.contains(needle)) {
            return seen.remove(i);
        }
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) if line.contains(needle) => return line,
                Ok(line) => seen.push(line),
                Err(_) => panic!("no line with {needle:?} within {limit:?}; got {seen:?}"),
            }
        }
    }

    /// Every line not matched yet, once the process has exited (bounded:
    /// its pipes close when it exits).
    pub fn rest(&self) -> Vec<String> {
        let mut rest = std::mem::take(&mut *self.seen.borrow_mut());
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => rest.push(line),
                Err(mpsc::RecvTimeoutError::Disconnected) => return rest,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("the output did not end within {WAIT:?}; got {rest:?}")
                }
            }
        }
    }

    /// The address printed by `--http` (`mongo-lease: http listening on IP:PORT`).
    pub fn http_addr(&self) -> String {
        let line = self.expect_line("http listening on ");
        line.rsplit(' ').next().unwrap().to_string()
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) has no memory-safety preconditions.
        unsafe { libc::kill(self.child.id() as i32, signal) };
    }

    /// Waits (bounded) for the exit code.
    pub fn wait(&mut self) -> i32 {
        self.wait_within(WAIT)
    }

    /// Waits for the exit code; `limit` only turns a hang into a failure.
    pub fn wait_within(&mut self, limit: Duration) -> i32 {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code().unwrap_or(-1);
            }
            assert!(
                Instant::now() < deadline,
                "mongo-lease did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn token_of(line: &str) -> u64 {
    line.split_whitespace().last().unwrap().parse().unwrap()
}

/// Waits until process `pid` (not necessarily a child of this one) has
/// exited, woken by the kernel through a pidfd; `false` if it still runs
/// after `limit`, which only turns a hang into a failure. An exited process
/// not yet reaped by its parent (a zombie) counts as exited.
pub fn exits_within(pid: i32, limit: Duration) -> bool {
    // SAFETY: pidfd_open(2) and poll(2) on a descriptor this function owns.
    unsafe {
        let fd = libc::syscall(libc::SYS_pidfd_open, pid, 0) as i32;
        if fd < 0 {
            let error = std::io::Error::last_os_error();
            assert_eq!(error.raw_os_error(), Some(libc::ESRCH), "pidfd_open({pid})");
            return true;
        }
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let deadline = Instant::now() + limit;
        let exited = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match libc::poll(&mut poll, 1, left.as_millis().min(i32::MAX as u128) as i32) {
                1 => break true,
                0 => break false,
                _ if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted => {}
                _ => panic!("poll: {}", std::io::Error::last_os_error()),
            }
        };
        libc::close(fd);
        exited
    }
}

/// The process id written in `path` (by a command, as `echo $! > path`).
pub fn pid_in(path: &std::path::Path) -> i32 {
    let text = std::fs::read_to_string(path).unwrap();
    text.trim()
        .parse()
        .unwrap_or_else(|_| panic!("no pid in {}: {text:?}", path.display()))
}
