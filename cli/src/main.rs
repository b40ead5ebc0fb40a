//! `mongo-lease`: distributed leases and leader election on MongoDB, from a
//! shell. A thin layer over the `mongo_lease` library: parsing, connecting,
//! printing, and supervising a child command (see `child.rs`).

mod args;
mod child;
mod exec;
mod explain;
mod group;
mod http;
mod leader;
mod output;
mod progress;
mod watch;

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use mongo_lease::{Error, LeaseManager, LeaseManagerOptions, ReleaseMode};

use args::{Cli, Commands, Connection, ExecArgs, LeaseTiming, ReleaseArgs, one_key};
use exec::exec;
use http::{Http, Phase};
use leader::leader;
use output::{Freed, Redactor, print_list, print_owner_release, print_release, print_request};

/// Exit codes, documented in `--help` and docs/cli.md.
mod exit {
    /// Bad usage: unknown option, bad duration, URI, key or payload.
    pub const USAGE: u8 = 2;
    /// MongoDB could not be reached, or refused an operation.
    pub const UNAVAILABLE: u8 = 69;
    /// The lease was not acquired (`--no-wait`, or `--timeout` elapsed).
    pub const NOT_ACQUIRED: u8 = 75;
    /// The lease was lost while the command ran; it was terminated.
    pub const LEASE_LOST: u8 = 76;
    /// The key is held as another kind of lease than the one asked for
    /// (`EX_CONFIG`: a semaphore of another number of permits, or shared
    /// holders where a permit was asked for).
    pub const KIND_MISMATCH: u8 = 78;
    /// The command could not be executed.
    pub const CANNOT_EXECUTE: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
}

/// A failure of the tool itself (not of the command it runs).
struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    fn usage(message: impl Into<String>) -> Failure {
        Failure {
            code: exit::USAGE,
            message: message.into(),
        }
    }
}

impl From<Error> for Failure {
    fn from(e: Error) -> Failure {
        let code = if e.is_invalid_input() {
            exit::USAGE
        } else if matches!(e, Error::KindMismatch { .. }) {
            exit::KIND_MISMATCH
        } else {
            exit::UNAVAILABLE
        };
        Failure {
            code,
            message: explain::error(&e),
        }
    }
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version exit 0; usage errors exit 2.
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { exit::USAGE } else { 0 });
        }
    };
    init_logging(&cli.connection);
    let redactor = Redactor::new(cli.connection.uri.as_deref().unwrap_or(""));
    // One thread: the child is spawned by the main thread, so the kernel's
    // parent-death signal (Linux) reaches it only when the process dies;
    // and the only thread that forks (`group.rs`).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("mongo-lease: cannot start: {e}");
            return ExitCode::from(exit::UNAVAILABLE);
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(failure) => {
            eprintln!("mongo-lease: {}", redactor.redact(&failure.message));
            ExitCode::from(failure.code)
        }
    }
}

fn init_logging(c: &Connection) {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let level = match (c.verbose, c.quiet) {
        (true, _) => "info",
        (_, true) => "error",
        _ => "warn",
    };
    let filter = EnvFilter::try_from_env("MONGO_LEASE_LOG")
        .unwrap_or_else(|_| EnvFilter::new(format!("mongo_lease={level}")));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    let json = cli.connection.json;
    let say = output::Say::new(&cli.connection);
    match cli.command {
        Commands::Elect(args) => {
            let args = args.into_leader();
            args.timing.check()?;
            let manager = connect(&cli.connection, Some(&args.timing)).await?;
            let status = http::Status::default();
            let code = leader(&manager, args, &status, json, say).await;
            finish(&manager, code).await
        }
        command @ (Commands::Exec(_) | Commands::Lock(_)) => {
            let args = match command {
                Commands::Exec(args) => args.resolve(),
                Commands::Lock(lease) => ExecArgs::hold(lease.resolve()),
                _ => unreachable!("matched above"),
            };
            args.check(cli.connection.release_mode)?;
            let http = Http::bind(args.http.http.as_deref()).await?;
            let manager = connect(&cli.connection, Some(&args.timing)).await?;
            let server = http.serve(&manager, None, Phase::Waiting);
            let code = exec(&manager, args, json, server.status(), say).await;
            server.stop().await;
            finish(&manager, code).await
        }
        Commands::Leader(args) => {
            let args = args.resolve();
            let name = args.name.key()?;
            args.timing.check()?;
            let http = Http::bind(args.http.http.as_deref()).await?;
            let manager = connect(&cli.connection, Some(&args.timing)).await?;
            let server = http.serve(&manager, Some(name), Phase::Campaigning);
            let code = leader(&manager, args, server.status(), json, say).await;
            server.stop().await;
            finish(&manager, code).await
        }
        Commands::Watch(args) => {
            let key = one_key(
                args.key.as_deref(),
                args.key_json.as_ref(),
                "KEY or --key-json",
            )?;
            let manager = connect(&cli.connection, None).await?;
            let code = watch::watch(&manager, key, json).await;
            finish(&manager, code).await
        }
        Commands::List(args) => {
            let manager = connect(&cli.connection, None).await?;
            let code = print_list(&manager, args.held, json).await;
            finish(&manager, code).await
        }
        Commands::Release(ReleaseArgs {
            owner: Some(owner),
            force,
            immediately,
            lock_delay,
            ..
        }) => {
            if !force {
                return Err(Failure::usage(format!(
                    "releasing the leases of owner id {owner:?} takes them away from \
                     their holder; add --force to confirm"
                )));
            }
            let manager = connect_with(&cli.connection, None, lock_delay).await?;
            let code = async {
                let release = manager.release_owner(&owner);
                let released = match immediately {
                    true => release.immediately().await?,
                    false => release.await?,
                };
                let freed = Freed::new(release_lock_delay(lock_delay), immediately);
                print_owner_release(&owner, released, freed, json);
                Ok(0)
            }
            .await;
            finish(&manager, code).await
        }
        Commands::Release(args) => {
            let key = one_key(
                args.key.as_deref(),
                args.key_json.as_ref(),
                "KEY or --key-json",
            )?;
            if args.request {
                let manager = connect(&cli.connection, None).await?;
                let code = async {
                    let held = manager.request_release(&key).await?;
                    print_request(&key, held, json);
                    Ok(0)
                }
                .await;
                return finish(&manager, code).await;
            }
            if !args.force {
                return Err(Failure::usage(format!(
                    "releasing {} takes the lease away from its holder; \
                     add --force to confirm",
                    key.to_extended_json()
                )));
            }
            let manager = connect_with(&cli.connection, None, args.lock_delay).await?;
            let code = async {
                let release = manager.force_release(&key);
                let released = match args.immediately {
                    true => release.immediately().await?,
                    false => release.await?,
                };
                let freed = Freed::new(release_lock_delay(args.lock_delay), args.immediately);
                print_release(&key, released.as_ref(), freed, json);
                Ok(0)
            }
            .await;
            finish(&manager, code).await
        }
    }
}

/// Shuts the manager down (releasing whatever it still holds).
async fn finish(manager: &LeaseManager, code: Result<u8, Failure>) -> Result<u8, Failure> {
    let shutdown = manager.shutdown().await;
    let code = code?;
    if let Err(e) = shutdown {
        let error = explain::error(&e);
        tracing::warn!(%error, "shutdown failed; leases expire after their TTL");
    }
    Ok(code)
}

/// Connects a manager; `timing` for one that runs a command under its
/// lease (`exec`, `leader`): its TTL, and a safety margin and heartbeat that
/// leave the command `--grace` to stop before the lease expires on the
/// server (`LeaseTiming::safety_margin`). Without it, the library's default
/// TTL and timing.
async fn connect(c: &Connection, timing: Option<&LeaseTiming>) -> Result<LeaseManager, Failure> {
    connect_with(c, timing, None).await
}

/// The lock-delay of `release --force` given `--lock-delay` (`None`: the
/// library's default, the safety margin of a manager with the default TTL,
/// which is how `release` connects).
fn release_lock_delay(given: Option<Duration>) -> Duration {
    given.unwrap_or(mongo_lease::DEFAULT_TTL / mongo_lease::DEFAULT_SAFETY_MARGIN_DIVISOR)
}

/// A rule of `--foreign-lock`: MongoDB Extended JSON v2 of its fields (a
/// field given as `null` is absent), read by the rule's serde.
fn foreign_lock(json: &str) -> Result<mongo_lease::ForeignLockRule, String> {
    let value: serde_json::Value =
        serde_json::from_str(json).map_err(|e| format!("not JSON: {e}"))?;
    let value = mongodb::bson::Bson::try_from(value);
    match value.map_err(|e| format!("not Extended JSON v2: {e}"))? {
        mongodb::bson::Bson::Document(rule) => {
            mongodb::bson::from_document(rule).map_err(|e| e.to_string())
        }
        _ => Err("not an Extended JSON v2 object".into()),
    }
}

/// [`connect`], with the lock-delay of `release --force` (`None`: the
/// library's default).
async fn connect_with(
    c: &Connection,
    timing: Option<&LeaseTiming>,
    lock_delay: Option<Duration>,
) -> Result<LeaseManager, Failure> {
    // Read before anything connects: a rule that is not one is bad usage.
    let foreign_lock = match c.foreign_lock.as_deref() {
        Some(json) => Some(foreign_lock(json).map_err(|e| {
            Failure::usage(explain::one_line(&format!(
                "invalid --foreign-lock (or MONGO_LEASE_FOREIGN_LOCK): {e}"
            )))
        })?),
        None => None,
    };
    let Some(uri) = c.uri.as_deref().filter(|u| !u.is_empty()) else {
        return Err(Failure::usage(
            "no MongoDB URI: pass --uri or set MONGODB_URI",
        ));
    };
    let invalid = |e: mongodb::error::Error| {
        Failure::usage(format!(
            "invalid --uri (or MONGODB_URI): {}; it reads like \
             mongodb://HOST:PORT/?replicaSet=NAME",
            explain::driver(&e)
        ))
    };
    let mut options = mongodb::options::ClientOptions::parse(uri)
        .await
        .map_err(invalid)?;
    // Shorter than the manager's operation timeout, so that when no server
    // can be selected the driver's error (which says why) arrives first.
    let selection = c.connect_timeout.mul_f64(0.8);
    let _ = explain::SELECTION_TIMEOUT.set((selection, c.connect_timeout));
    options.server_selection_timeout = Some(selection);
    options.connect_timeout = Some(c.connect_timeout);
    options.app_name.get_or_insert_with(|| "mongo-lease".into());
    // Whether the driver's monitoring found a standalone server: read from
    // its own events, the tool sends no command of its own.
    let standalone = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    options.sdam_event_handler = Some(mongodb::event::EventHandler::callback({
        let standalone = standalone.clone();
        move |event| {
            if let mongodb::event::sdam::SdamEvent::ServerDescriptionChanged(changed) = event
                && changed.new_description.server_type() == mongodb::ServerType::Standalone
            {
                standalone.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }));
    let client = mongodb::Client::with_options(options).map_err(invalid)?;
    let owner_id = c.owner_id.clone().unwrap_or_else(default_owner_id);
    let mut options = LeaseManagerOptions::builder()
        .database(client.database(&c.db))
        .collection(c.collection.clone())
        .owner_id(owner_id)
        .watch_held_leases(c.watch_held_leases)
        .operation_timeout(c.connect_timeout)
        .build();
    options.release_mode = c.release_mode.map(ReleaseMode::from);
    options.foreign_lock = foreign_lock;
    if let Some(timing) = timing {
        options.ttl = timing.ttl;
        options.safety_margin = Some(timing.safety_margin());
        options.clock_skew = Some(timing.clock_skew());
        options.heartbeat_interval = Some(timing.heartbeat_interval());
    }
    // A lock-delay of its own only for `release` (`--lock-delay`); else the
    // library's default, the safety margin, which a long --ttl would take
    // past the longest lock-delay: this manager releases nobody else's
    // lease, so the longest is as good.
    options.lock_delay =
        lock_delay.or_else(|| timing.map(|t| t.safety_margin().min(mongo_lease::MAX_LOCK_DELAY)));
    let manager = LeaseManager::connect(options).await.map_err(|e| {
        let mut failure = Failure::from(e);
        if failure.code == exit::UNAVAILABLE && !failure.message.starts_with("cannot reach") {
            failure.message = format!("cannot use MongoDB: {}", failure.message);
        }
        failure
    })?;
    // `connect` has used the server: its description is in.
    if !c.quiet && standalone.load(std::sync::atomic::Ordering::Relaxed) {
        warn_standalone();
    }
    Ok(manager)
}

/// A line on stderr for a standalone server, saying what it gives up.
fn warn_standalone() {
    eprintln!(
        "mongo-lease: warning: MongoDB is a standalone server, not a replica set: no failover, \
         and no change streams, so waiters and watch poll (about every 0.5 s) instead of being \
         woken at once, and watch can miss short holds; use a replica set (a single-node one \
         is fine)"
    );
}

fn default_owner_id() -> String {
    let mut host = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates
    // within it on success.
    let ok = unsafe { libc::gethostname(host.as_mut_ptr().cast(), host.len()) } == 0;
    let host = if ok {
        let end = host.iter().position(|&b| b == 0).unwrap_or(host.len());
        String::from_utf8_lossy(&host[..end]).into_owned()
    } else {
        "unknown-host".into()
    };
    let random = &uuid::Uuid::new_v4().simple().to_string()[..8];
    format!("{host}:{}:{random}", std::process::id())
}
