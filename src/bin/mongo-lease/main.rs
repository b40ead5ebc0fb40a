//! `mongo-lease`: distributed leases and leader election on MongoDB, from a
//! shell. A thin layer over the `mongo_lease` library: parsing, connecting,
//! printing, and supervising a child command (see `child.rs`).

mod child;
mod output;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use mongo_lease::{Election, Error, LeaseKey, LockManager, LockManagerOptions, ReleaseMode};
use mongodb::bson::Document;

use child::{ChildOutcome, Signals};
use output::{Redactor, print_list, print_owner_release, print_release};

/// Exit codes, documented in `--help` and the README.
mod exit {
    /// Bad usage: unknown option, bad duration, URI, key or payload.
    pub const USAGE: u8 = 2;
    /// MongoDB could not be reached, or refused an operation.
    pub const UNAVAILABLE: u8 = 69;
    /// The lease was not acquired (`--no-wait`, or `--timeout` elapsed).
    pub const NOT_ACQUIRED: u8 = 75;
    /// The lease was lost while the command ran; it was terminated.
    pub const LEASE_LOST: u8 = 76;
    /// The command could not be executed.
    pub const CANNOT_EXECUTE: u8 = 126;
    /// The command was not found.
    pub const NOT_FOUND: u8 = 127;
}

const EXIT_CODES: &str = "\
Exit codes:
  0       success (list, release); for exec and leader --once: the command's own exit code
  1-255   the command's exit code; 128+N if it was killed by signal N
  2       bad usage: unknown option, bad duration, URI, key or payload
  69      MongoDB could not be reached, or refused an operation
  75      not acquired: the key is held (--no-wait) or --timeout elapsed
  76      the lease was lost while the command ran (it got SIGTERM, then SIGKILL after --grace)
  126     the command could not be executed
  127     the command was not found

Keys: --key takes a string; --key-json takes a key of any BSON type in MongoDB Extended
JSON v2, e.g. the ObjectId of the locked document: --key-json '{\"$oid\":\"5087b72181a445980ae47d13\"}'.
An election's name is a key too: --name takes a string, --name-json any BSON type.

Environment of the command: MONGO_LEASE_KEY (key or election name; a non-string key as
canonical Extended JSON), MONGO_LEASE_TOKEN (fencing token = term), MONGO_LEASE_OWNER (owner id).";

/// Distributed leases (renewable locks) and leader election on MongoDB.
///
/// Times are judged by the MongoDB server's clock.
#[derive(Parser, Debug)]
#[command(name = "mongo-lease", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    connection: Connection,

    #[command(subcommand)]
    command: Commands,
}

#[derive(Args, Debug)]
struct Connection {
    /// MongoDB connection string (a replica set; a single-node one is fine).
    /// Credentials in it are never printed.
    #[arg(long, env = "MONGODB_URI", global = true, hide_env_values = true)]
    uri: Option<String>,

    /// Database of the lock collection.
    #[arg(
        long,
        env = "MONGO_LEASE_DB",
        default_value = "mongo_lease",
        global = true
    )]
    db: String,

    /// Name of the lock collection.
    #[arg(
        long,
        env = "MONGO_LEASE_COLLECTION",
        default_value = "leases",
        global = true
    )]
    collection: String,

    /// Owner id stored in the leases this process takes [default: HOST:PID:RANDOM].
    #[arg(long, env = "MONGO_LEASE_OWNER_ID", global = true)]
    owner_id: Option<String>,

    /// What a release does with the lock document: `keep` it until MongoDB's
    /// TTL monitor deletes it, or `delete` it (for collections shared with
    /// applications that lock by inserting and unlock by deleting).
    #[arg(
        long,
        value_enum,
        default_value = "keep",
        env = "MONGO_LEASE_RELEASE_MODE",
        global = true
    )]
    release_mode: ReleaseModeArg,

    /// How long to wait for MongoDB to answer, e.g. `10s`.
    #[arg(long, default_value = "10s", value_parser = parse_duration, global = true)]
    connect_timeout: Duration,

    /// Machine-readable output (JSON) instead of text.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Subcommand, Debug)]
enum Commands {
    /// Run a command while holding a lease on a key (like flock(1)).
    ///
    /// Acquires the key, runs the command with the key and fencing token in
    /// its environment, renews the lease while it runs, releases it when the
    /// command exits, and exits with the command's exit code. If the lease is
    /// lost, the command gets SIGTERM, then SIGKILL after --grace, and
    /// mongo-lease exits with 76. SIGTERM and SIGINT are forwarded to the
    /// command.
    Exec(ExecArgs),
    /// Run a command only while leader of an election.
    ///
    /// Campaigns; once leader, runs the command with the election name and
    /// term in its environment. If leadership is lost, the command gets
    /// SIGTERM, then SIGKILL after --grace. When the command exits or
    /// leadership is lost, campaigns again (unless --once). SIGTERM and SIGINT
    /// are forwarded to the command, then mongo-lease resigns and exits.
    Leader(LeaderArgs),
    /// List the leases in the lock collection, with server-time age and expiry.
    List(ListArgs),
    /// Release a key whoever holds it, or every lease of an owner id with
    /// --owner (operator override; needs --force).
    ///
    /// The holder learns it within milliseconds on a replica set (its
    /// manager follows writes to its leases), at its next renewal otherwise;
    /// its command is then terminated. The release is printed and logged.
    Release(ReleaseArgs),
}

#[derive(Args, Debug)]
struct LeaseTiming {
    /// Lease time-to-live, e.g. `30s`, `2m`. Renewed every TTL/3.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    ttl: Duration,

    /// After SIGTERM, how long the command has to exit before SIGKILL.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    grace: Duration,
}

#[derive(Args, Debug)]
struct ExecArgs {
    #[command(flatten)]
    key: KeyArg,

    #[command(flatten)]
    timing: LeaseTiming,

    /// Wait until the key is free (the default).
    #[arg(long, overrides_with = "no_wait")]
    wait: bool,

    /// Fail at once (exit 75) if the key is held.
    #[arg(long, conflicts_with = "timeout")]
    no_wait: bool,

    /// Wait at most this long for the key, e.g. `10s` (then exit 75).
    #[arg(long, value_parser = parse_duration)]
    timeout: Option<Duration>,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

/// A lease key: a string (`--key`) or any BSON value in Extended JSON
/// (`--key-json`); exactly one.
#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
struct KeyArg {
    /// The key to lock, a string.
    #[arg(long)]
    key: Option<String>,

    /// The key as MongoDB Extended JSON v2, for a key of any BSON type (the
    /// `_id` of the document to lock), e.g.
    /// `--key-json '{"$oid":"5087b72181a445980ae47d13"}'`.
    #[arg(long, value_name = "JSON", value_parser = parse_key_json)]
    key_json: Option<LeaseKey>,
}

impl KeyArg {
    fn key(&self) -> Result<LeaseKey, Failure> {
        one_key(
            self.key.as_deref(),
            self.key_json.as_ref(),
            "--key or --key-json",
        )
    }
}

/// An election's name (its lease key): a string (`--name`) or any BSON
/// value in Extended JSON (`--name-json`); exactly one.
#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
struct NameArg {
    /// The election's name (its lease key), a string.
    #[arg(long)]
    name: Option<String>,

    /// The election's name as MongoDB Extended JSON v2, for a name of any
    /// BSON type, e.g. `--name-json '{"$oid":"5087b72181a445980ae47d13"}'`.
    #[arg(long, value_name = "JSON", value_parser = parse_key_json)]
    name_json: Option<LeaseKey>,
}

impl NameArg {
    fn key(&self) -> Result<LeaseKey, Failure> {
        one_key(
            self.name.as_deref(),
            self.name_json.as_ref(),
            "--name or --name-json",
        )
    }
}

/// The key given either as a string or as Extended JSON (clap lets through
/// at most one; `options` names them for the error when neither is given).
fn one_key(
    string: Option<&str>,
    json: Option<&LeaseKey>,
    options: &str,
) -> Result<LeaseKey, Failure> {
    match (string, json) {
        (_, Some(key)) => Ok(key.clone()),
        (Some(key), None) => Ok(LeaseKey::from(key)),
        (None, None) => Err(Failure::usage(format!("a key is required: pass {options}"))),
    }
}

#[derive(Args, Debug)]
struct LeaderArgs {
    #[command(flatten)]
    name: NameArg,

    #[command(flatten)]
    timing: LeaseTiming,

    /// Run the command once as leader, then resign and exit with its code
    /// (76 if leadership was lost meanwhile).
    #[arg(long)]
    once: bool,

    /// Pause after the command exits before campaigning again.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    restart_delay: Duration,

    /// A JSON object published as the leader's payload, e.g. '{"addr":"10.0.0.7:8080"}'.
    #[arg(long, value_parser = parse_payload)]
    payload: Option<Document>,

    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
struct ListArgs {
    /// Only the leases held now.
    #[arg(long)]
    held: bool,
}

/// `--release-mode`: [`ReleaseMode`] as a command-line value.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
enum ReleaseModeArg {
    /// Keep the released document until the TTL monitor deletes it.
    Keep,
    /// Delete the document on release.
    Delete,
}

impl From<ReleaseModeArg> for ReleaseMode {
    fn from(mode: ReleaseModeArg) -> ReleaseMode {
        match mode {
            ReleaseModeArg::Keep => ReleaseMode::Keep,
            ReleaseModeArg::Delete => ReleaseMode::Delete,
        }
    }
}

#[derive(Args, Debug)]
struct ReleaseArgs {
    /// The key to release, a string.
    #[arg(required_unless_present_any = ["key_json", "owner"], conflicts_with = "owner")]
    key: Option<String>,

    /// The key to release as MongoDB Extended JSON v2, for a key of any BSON
    /// type, e.g. `--key-json '{"$oid":"5087b72181a445980ae47d13"}'`.
    #[arg(long, value_name = "JSON", value_parser = parse_key_json, conflicts_with_all = ["key", "owner"])]
    key_json: Option<LeaseKey>,

    /// Release every lease held under this owner id instead (e.g. that of a
    /// dead process), and print how many.
    #[arg(long, value_name = "AID")]
    owner: Option<String>,

    /// Confirm the override: the current holder loses its lease.
    #[arg(long)]
    force: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 500ms, 30s, 2m)"))?;
    if d.is_zero() {
        return Err("must be greater than zero".into());
    }
    Ok(d)
}

fn parse_key_json(s: &str) -> Result<LeaseKey, String> {
    LeaseKey::from_extended_json(s).map_err(|e| e.to_string())
}

fn parse_payload(s: &str) -> Result<Document, String> {
    let value: serde_json::Value = serde_json::from_str(s).map_err(|e| format!("not JSON: {e}"))?;
    if !value.is_object() {
        return Err("must be a JSON object".into());
    }
    mongodb::bson::to_document(&value).map_err(|e| e.to_string())
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
        } else {
            exit::UNAVAILABLE
        };
        Failure {
            code,
            message: e.to_string(),
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
    init_logging();
    let redactor = Redactor::new(cli.connection.uri.as_deref().unwrap_or(""));
    // One thread: the child is spawned by the main thread, so the kernel's
    // parent-death signal (Linux) reaches it only when the process dies.
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

fn init_logging() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("MONGO_LEASE_LOG")
        .unwrap_or_else(|_| EnvFilter::new("mongo_lease=warn"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}

async fn run(cli: Cli) -> Result<u8, Failure> {
    let json = cli.connection.json;
    match cli.command {
        Commands::Exec(args) => {
            let manager = connect(&cli.connection, args.timing.ttl).await?;
            let code = exec(&manager, args, json).await;
            finish(&manager, code).await
        }
        Commands::Leader(args) => {
            let manager = connect(&cli.connection, args.timing.ttl).await?;
            let code = leader(&manager, args).await;
            finish(&manager, code).await
        }
        Commands::List(args) => {
            let manager = connect(&cli.connection, mongo_lease::DEFAULT_TTL).await?;
            let code = print_list(&manager, args.held, json).await;
            finish(&manager, code).await
        }
        Commands::Release(ReleaseArgs {
            owner: Some(owner),
            force,
            ..
        }) => {
            if !force {
                return Err(Failure::usage(format!(
                    "releasing the leases of owner id {owner:?} takes them away from \
                     their holder; add --force to confirm"
                )));
            }
            let manager = connect(&cli.connection, mongo_lease::DEFAULT_TTL).await?;
            let code = async {
                let released = manager.release_owner(&owner).await?;
                print_owner_release(&owner, released, json);
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
            if !args.force {
                return Err(Failure::usage(format!(
                    "releasing {} takes the lease away from its holder; \
                     add --force to confirm",
                    key.to_extended_json()
                )));
            }
            let manager = connect(&cli.connection, mongo_lease::DEFAULT_TTL).await?;
            let code = async {
                let released = manager.force_release(&key).await?;
                print_release(&key, released.as_ref(), json);
                Ok(0)
            }
            .await;
            finish(&manager, code).await
        }
    }
}

/// Shuts the manager down (releasing whatever it still holds).
async fn finish(manager: &LockManager, code: Result<u8, Failure>) -> Result<u8, Failure> {
    let shutdown = manager.shutdown().await;
    let code = code?;
    if let Err(e) = shutdown {
        tracing::warn!(error = %e, "shutdown failed; leases expire after their TTL");
    }
    Ok(code)
}

async fn connect(c: &Connection, ttl: Duration) -> Result<LockManager, Failure> {
    let Some(uri) = c.uri.as_deref().filter(|u| !u.is_empty()) else {
        return Err(Failure::usage(
            "no MongoDB URI: pass --uri or set MONGODB_URI",
        ));
    };
    let mut options = mongodb::options::ClientOptions::parse(uri)
        .await
        .map_err(|e| Failure::usage(format!("invalid MongoDB URI: {e}")))?;
    // Shorter than the manager's operation timeout, so that when no server
    // can be selected the driver's error (which says why) arrives first.
    options.server_selection_timeout = Some(c.connect_timeout.mul_f64(0.8));
    options.connect_timeout = Some(c.connect_timeout);
    options.app_name.get_or_insert_with(|| "mongo-lease".into());
    let client = mongodb::Client::with_options(options)
        .map_err(|e| Failure::usage(format!("invalid MongoDB URI: {e}")))?;
    let owner_id = c.owner_id.clone().unwrap_or_else(default_owner_id);
    let options = LockManagerOptions::builder()
        .database(client.database(&c.db))
        .collection(c.collection.clone())
        .owner_id(owner_id)
        .ttl(ttl)
        .release_mode(c.release_mode.into())
        .operation_timeout(c.connect_timeout)
        .build();
    LockManager::connect(options).await.map_err(|e| {
        let mut failure = Failure::from(e);
        if failure.code == exit::UNAVAILABLE {
            failure.message = format!("cannot use MongoDB: {}", failure.message);
        }
        failure
    })
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

async fn exec(manager: &LockManager, args: ExecArgs, json: bool) -> Result<u8, Failure> {
    let signals = Signals::listen()?;
    let key = args.key.key()?;
    let acquire = async {
        if args.no_wait {
            manager.try_acquire(key.clone()).await
        } else if let Some(timeout) = args.timeout {
            manager.acquire_timeout(key.clone(), timeout).await
        } else {
            manager.acquire(key.clone()).await.map(Some)
        }
    };
    let lease = tokio::select! {
        lease = acquire => lease?,
        signal = signals.next() => return Ok(128 + signal as u8),
    };
    let Some(lease) = lease else {
        let holder = manager.inspect(key.clone()).await.ok().flatten();
        output::print_not_acquired(&key, holder.as_ref(), json);
        return Ok(exit::NOT_ACQUIRED);
    };
    tracing::debug!(%key, token = lease.fencing_token(), "acquired");
    let outcome = child::run(
        &args.command,
        &key.to_string(),
        lease.fencing_token(),
        manager.owner_id(),
        lease.lost(),
        args.timing.grace,
        &signals,
    )
    .await;
    let lost = lease.is_lost();
    let _ = lease.release().await;
    match outcome {
        ChildOutcome::Exited(code) if !lost => Ok(code),
        ChildOutcome::Exited(_) | ChildOutcome::Lost => {
            eprintln!(
                "mongo-lease: the lease on {} was lost; the command was terminated",
                key.to_extended_json()
            );
            Ok(exit::LEASE_LOST)
        }
        ChildOutcome::SpawnFailed(code, message) => {
            eprintln!("mongo-lease: {message}");
            Ok(code)
        }
    }
}

async fn leader(manager: &LockManager, args: LeaderArgs) -> Result<u8, Failure> {
    let signals = Signals::listen()?;
    let name = args.name.key()?;
    let election = Election::new(manager, name.clone())?;
    // What the messages call the election, and what the command gets as
    // MONGO_LEASE_KEY (a string as is, another type as Extended JSON).
    let shown = name.to_extended_json();
    let env_name = name.to_string();
    if args.once {
        let leadership = tokio::select! {
            leadership = election.campaign() => leadership?,
            signal = signals.next() => return Ok(128 + signal as u8),
        };
        eprintln!(
            "mongo-lease: leader of {} (term {})",
            shown,
            leadership.term()
        );
        if let Some(payload) = &args.payload {
            leadership.set_payload(payload.clone()).await?;
        }
        let outcome = child::run(
            &args.command,
            &env_name,
            leadership.term(),
            manager.owner_id(),
            leadership.lost(),
            args.timing.grace,
            &signals,
        )
        .await;
        let lost = leadership.is_lost();
        let _ = leadership.resign().await;
        return Ok(match outcome {
            ChildOutcome::Exited(code) if !lost => code,
            ChildOutcome::SpawnFailed(code, message) => {
                eprintln!("mongo-lease: {message}");
                code
            }
            _ => {
                eprintln!(
                    "mongo-lease: leadership of {} lost; the command was terminated",
                    shown
                );
                exit::LEASE_LOST
            }
        });
    }
    loop {
        let running = std::sync::atomic::AtomicBool::new(false);
        let run = election.run_as_leader(|leader| {
            let (args, signals, running) = (&args, &signals, &running);
            let (shown, env_name) = (&shown, &env_name);
            let owner_id = manager.owner_id();
            async move {
                if signals.received().is_some() {
                    return ChildOutcome::Exited(0);
                }
                eprintln!("mongo-lease: leader of {} (term {})", shown, leader.term());
                if let Some(payload) = &args.payload {
                    if let Err(e) = leader.set_payload(payload.clone()).await {
                        tracing::warn!(error = %e, "could not publish the payload");
                    }
                }
                running.store(true, std::sync::atomic::Ordering::SeqCst);
                let outcome = child::run(
                    &args.command,
                    env_name,
                    leader.term(),
                    owner_id,
                    leader.lost(),
                    args.timing.grace,
                    signals,
                )
                .await;
                running.store(false, std::sync::atomic::Ordering::SeqCst);
                if leader.is_lost() {
                    eprintln!(
                        "mongo-lease: leadership of {} lost (term {}); campaigning again",
                        shown,
                        leader.term()
                    );
                }
                outcome
            }
        });
        let idle_signal = async {
            loop {
                let signal = signals.next().await;
                if !running.load(std::sync::atomic::Ordering::SeqCst) {
                    return signal;
                }
            }
        };
        let outcome = tokio::select! {
            outcome = run => outcome?,
            signal = idle_signal => return Ok(128 + signal as u8),
        };
        let code = match outcome {
            ChildOutcome::Exited(code) => code,
            ChildOutcome::SpawnFailed(code, message) => {
                eprintln!("mongo-lease: {message}");
                return Ok(code);
            }
            ChildOutcome::Lost => exit::LEASE_LOST,
        };
        if let Some(signal) = signals.received() {
            let _ = signal;
            return Ok(code);
        }
        eprintln!(
            "mongo-lease: the command exited with code {code}; resigned, campaigning again in {}",
            humantime::format_duration(args.restart_delay)
        );
        tokio::select! {
            _ = tokio::time::sleep(args.restart_delay) => {}
            signal = signals.next() => return Ok(128 + signal as u8),
        }
    }
}
