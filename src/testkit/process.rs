//! Process plumbing: a long-lived spawner thread (so `PR_SET_PDEATHSIG`
//! only fires when the whole process dies), a registry of live members
//! cleaned up at process exit, and a sweep of data directories left behind
//! by processes that died abruptly.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, Once, OnceLock};

/// Prefix of every member data directory in the temp dir; followed by
/// `<pid>-`.
pub(crate) const DIR_PREFIX: &str = "mongo-lease-testkit-";

// ---------------------------------------------------------------------------
// Spawner thread
// ---------------------------------------------------------------------------

struct SpawnRequest {
    cmd: Command,
    reply: tokio::sync::oneshot::Sender<io::Result<Child>>,
}

/// Spawns `cmd` from a dedicated thread that lives as long as the process.
///
/// On Linux the child gets `PR_SET_PDEATHSIG = SIGKILL`. The kernel sends
/// that signal when the *thread* that forked the child exits, not the
/// process, so forking from a short-lived thread (a tokio worker of a
/// test's runtime, a `spawn_blocking` thread, ...) would kill the child
/// early. The spawner thread is never joined; it ends only with the process.
pub(crate) async fn spawn(mut cmd: Command) -> io::Result<Child> {
    set_parent_death_signal(&mut cmd);
    static SPAWNER: OnceLock<io::Result<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    let sender = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("mongo-lease-testkit-spawner".into())
            .spawn(move || {
                // `tx` lives in a static, so this loop never ends.
                for mut req in rx {
                    let _ = req.reply.send(req.cmd.spawn());
                }
            })
            .map(|_| tx)
    });
    let sender = match sender {
        Ok(s) => s,
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot start the testkit spawner thread: {e}"),
            ));
        }
    };
    let (reply, rx) = tokio::sync::oneshot::channel();
    sender
        .send(SpawnRequest { cmd, reply })
        .map_err(|_| io::Error::other("the testkit spawner thread is gone"))?;
    rx.await
        .map_err(|_| io::Error::other("the testkit spawner thread dropped a request"))?
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: only async-signal-safe libc calls (prctl, getppid) run between
    // fork and exec; nothing allocates.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(
                libc::PR_SET_PDEATHSIG,
                libc::SIGKILL as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
                0 as libc::c_ulong,
            ) == -1
            {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

// ---------------------------------------------------------------------------
// Registry of live members, cleaned up by an atexit hook
// ---------------------------------------------------------------------------

struct Registered {
    pid: u32,
    dir: PathBuf,
}

fn registry() -> &'static Mutex<HashMap<u64, Registered>> {
    static REGISTRY: OnceLock<Mutex<HashMap<u64, Registered>>> = OnceLock::new();
    REGISTRY.get_or_init(Default::default)
}

/// Records a running member so the exit hook can kill it and remove `dir`.
/// Returns a token for [`unregister`].
pub(crate) fn register(pid: u32, dir: &Path) -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    install_exit_hook();
    let token = NEXT.fetch_add(1, Ordering::Relaxed);
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    reg.insert(
        token,
        Registered {
            pid,
            dir: dir.to_path_buf(),
        },
    );
    token
}

/// Forgets a member registered with [`register`] (call before reaping it).
pub(crate) fn unregister(token: u64) {
    let mut reg = registry().lock().unwrap_or_else(|e| e.into_inner());
    reg.remove(&token);
}

fn install_exit_hook() {
    static ONCE: Once = Once::new();
    #[cfg(unix)]
    ONCE.call_once(|| {
        // SAFETY: registering a plain `extern "C"` function.
        unsafe {
            libc::atexit(exit_hook);
        }
    });
    #[cfg(not(unix))]
    ONCE.call_once(|| {});
}

/// Runs at normal process exit (including the test harness's
/// `process::exit`): kills every still-registered member (notably the
/// shared server, which is never dropped) and removes its data directory.
#[cfg(unix)]
extern "C" fn exit_hook() {
    let entries: Vec<Registered> = match registry().try_lock() {
        Ok(mut reg) => reg.drain().map(|(_, r)| r).collect(),
        Err(std::sync::TryLockError::Poisoned(e)) => {
            e.into_inner().drain().map(|(_, r)| r).collect()
        }
        // Another thread holds the lock while the process exits; give up
        // (PDEATHSIG still kills the children, the sweep removes the dirs).
        Err(std::sync::TryLockError::WouldBlock) => return,
    };
    for r in &entries {
        // SAFETY: plain syscalls on a pid we spawned and have not reaped.
        unsafe {
            libc::kill(r.pid as libc::pid_t, libc::SIGKILL);
        }
    }
    for r in &entries {
        // SAFETY: as above; reaping our own child.
        unsafe {
            let mut status = 0;
            libc::waitpid(r.pid as libc::pid_t, &mut status, 0);
        }
        let _ = std::fs::remove_dir_all(&r.dir);
    }
}

// ---------------------------------------------------------------------------
// Sweep of directories left behind by dead processes
// ---------------------------------------------------------------------------

/// Once per process: removes `$TMPDIR/mongo-lease-testkit-<pid>-*` data
/// directories whose owning process is gone and whose `mongod` (per
/// `mongod.lock`) is not running. Errors are ignored.
pub(crate) fn sweep_stale_dirs() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        let me = std::process::id();
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(rest) = name.to_str().and_then(|n| n.strip_prefix(DIR_PREFIX)) else {
                continue;
            };
            let Some(owner) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            if owner == me || pid_alive(owner) {
                continue;
            }
            let path = entry.path();
            let lock_pid = std::fs::read_to_string(path.join("mongod.lock"))
                .ok()
                .and_then(|s| s.trim().parse::<u32>().ok());
            if lock_pid.is_some_and(pid_alive) {
                continue;
            }
            tracing::debug!(dir = %path.display(), "removing stale testkit data directory");
            let _ = std::fs::remove_dir_all(&path);
        }
    });
}

/// Whether a process with this pid exists (zombies count as existing).
#[cfg(unix)]
pub(crate) fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks for existence/permission.
    if unsafe { libc::kill(pid, 0) } == 0 {
        return true;
    }
    io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}

#[cfg(not(unix))]
pub(crate) fn pid_alive(_pid: u32) -> bool {
    true
}
