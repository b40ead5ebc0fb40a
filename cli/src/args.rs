//! The command line: subcommands, options and their parsers.

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use mongo_lease::{
    Acquire, DEFAULT_CLOCK_SKEW, DEFAULT_HEARTBEAT_DIVISOR, DEFAULT_SAFETY_MARGIN_DIVISOR,
    LeaseKey, MAX_PERMITS, ReleaseMode,
};
use mongodb::bson::Document;

use crate::Failure;

const EXIT_CODES: &str = "\
Exit codes:
  0       success (list, release, watch until SIGINT/SIGTERM); for exec and leader --once: the command's own exit code
  1-255   the command's exit code; 128+N if it was killed by signal N
  2       bad usage: unknown option, bad duration, URI, key or payload; a --foreign-lock
          rule that is not Extended JSON or that MongoDB cannot parse; an --http address
          that cannot be listened on
  69      MongoDB could not be reached, or refused an operation
  75      not acquired: the key is held (--no-wait) or --timeout elapsed
  76      the lease was lost while the command ran, or its --hold-at-most ended (it got
          SIGTERM, then SIGKILL after --grace)
  78      exec: the key is held as another kind (nothing was acquired): a semaphore key
          without its --permits N, or a key held exclusive or shared with --permits
  126     the command could not be executed
  127     the command was not found

Keys: --key takes a string; --key-json takes a key of any BSON type in MongoDB Extended
JSON v2, e.g. the ObjectId of the locked document: --key-json '{\"$oid\":\"5087b72181a445980ae47d13\"}'.
An election's name is a key too: --name takes a string, --name-json any BSON type.

Kinds of lease (exec): exclusive (the default: one holder; the exclusive side of a
read/write key), --shared (any number of shared holders, no exclusive one; a waiting
exclusive exec stops new shared holders, so it is not starved), --permits N (one of N
permits of a semaphore key; every exec of the key must pass the same N while it is held).
--hold-at-least D keeps an exclusive key held until its acquisition + D by the server's
clock, even if the command ends earlier: at most one run per D across machines.
--hold-at-most D ends the lease D after its acquisition (never renewed): the command gets
SIGTERM at the lease's local deadline, and mongo-lease exits 76.

Several keys (exec): repeat --key or --key-json; all are held while the command runs, or
none (exit 75), and the loss of any is the loss of all (exit 76).

Environment of mongo-lease: MONGODB_URI (--uri), MONGO_LEASE_DB, MONGO_LEASE_COLLECTION,
MONGO_LEASE_OWNER_ID, MONGO_LEASE_RELEASE_MODE, MONGO_LEASE_WATCH_HELD_LEASES,
MONGO_LEASE_CLOCK_SKEW, MONGO_LEASE_FOREIGN_LOCK (as the options), and MONGO_LEASE_LOG: what
is logged to stderr, as a tracing filter (default mongo_lease=warn; e.g.
MONGO_LEASE_LOG=mongo_lease=debug for each acquisition, renewal and release; -v sets
mongo_lease=info, -q mongo_lease=error).

Like flock(1): exec -n (--no-wait), -w SECONDS (--timeout; 0 = do not wait), -s (--shared),
-c \"shell command\" (run with /bin/sh -c). Like etcdctl: `lock KEY` and `elect NAME [VALUE]`
hold the lease, or leadership, until SIGINT or SIGTERM, print the key (name) and fencing token
(term) on stdout, and release on exit.

Environment of the command: MONGO_LEASE_KEY (key or election name; a non-string key as
canonical Extended JSON; with several keys, one per line, in the order they were taken),
MONGO_LEASE_TOKEN (fencing token = term; with several keys, one per line in the same order),
MONGO_LEASE_OWNER (owner id), MONGO_LEASE_KIND (exclusive, shared or permit),
MONGO_LEASE_PERMITS (N, for --permits N only).";

/// Distributed leases (renewable locks) and leader election on MongoDB.
///
/// Times are judged by the MongoDB server's clock.
#[derive(Parser, Debug)]
#[command(name = "mongo-lease", version, after_help = EXIT_CODES)]
pub struct Cli {
    #[command(flatten)]
    pub connection: Connection,

    #[command(subcommand)]
    pub command: Commands,
}

#[derive(Args, Debug)]
pub struct Connection {
    /// MongoDB connection string (a replica set; a single-node one is fine).
    /// Credentials in it are never printed.
    #[arg(long, env = "MONGODB_URI", global = true, hide_env_values = true)]
    pub uri: Option<String>,

    /// Database of the lock collection.
    #[arg(
        long,
        env = "MONGO_LEASE_DB",
        default_value = "mongo_lease",
        global = true
    )]
    pub db: String,

    /// Name of the lock collection.
    #[arg(
        long,
        env = "MONGO_LEASE_COLLECTION",
        default_value = "leases",
        global = true
    )]
    pub collection: String,

    /// Owner id stored in the leases this process takes [default: HOST:PID:RANDOM].
    #[arg(long, env = "MONGO_LEASE_OWNER_ID", global = true)]
    pub owner_id: Option<String>,

    /// What a release does with the lock document: `keep` it until MongoDB's
    /// TTL monitor deletes it, or `delete` it. Default: `delete` in a
    /// collection shared with other applications' lock clients (it holds
    /// their lock documents, or a TTL index on `ts` or `ExpireAt`), else
    /// `keep`.
    #[arg(long, value_enum, env = "MONGO_LEASE_RELEASE_MODE", global = true)]
    pub release_mode: Option<ReleaseModeArg>,

    /// Notice at once, through a change stream, when someone else deletes or
    /// rewrites a held lease, instead of at the next renewal; each such
    /// process then costs the server some work on every write of the
    /// deployment (docs/performance.md, "Fleet").
    #[arg(long, env = "MONGO_LEASE_WATCH_HELD_LEASES", global = true)]
    pub watch_held_leases: bool,

    /// Another application's lock documents in the lock collection, by a rule
    /// of MongoDB aggregation expressions in Extended JSON (`held` required;
    /// `owner`, `expires_at`, `describes`), e.g. '{"held": {"$eq": ["$locked",
    /// true]}, "owner": "$owner", "expires_at": "$expire"}'.
    #[arg(
        long,
        value_name = "JSON",
        env = "MONGO_LEASE_FOREIGN_LOCK",
        global = true
    )]
    pub foreign_lock: Option<String>,

    /// How long to wait for MongoDB to answer, e.g. `10s`.
    #[arg(long, default_value = "10s", value_parser = parse_duration, global = true)]
    pub connect_timeout: Duration,

    /// Machine-readable output (JSON) instead of text.
    #[arg(long, global = true)]
    pub json: bool,

    /// Say more on stderr: while exec, lock, leader or elect waits, who
    /// holds the key, until when, and how many wait ahead, every few seconds
    /// (without -v: once, and every few seconds on a terminal); log at info
    /// (MONGO_LEASE_LOG overrides).
    #[arg(short, long, global = true, conflicts_with = "quiet")]
    pub verbose: bool,

    /// Say less on stderr: errors only (no progress while waiting, no
    /// "leader of" lines, no standalone-server warning; the log at error).
    #[arg(short, long, global = true)]
    pub quiet: bool,
}

#[derive(Subcommand, Debug)]
pub enum Commands {
    /// Run a command while holding a lease on a key (like flock(1)).
    ///
    /// Acquires the key, runs the command with the key and fencing token in
    /// its environment, renews the lease while it runs, releases it when the
    /// command exits, and exits with the command's exit code. If the lease is
    /// lost, the command gets SIGTERM, then SIGKILL after --grace, and
    /// mongo-lease exits with 76. SIGTERM and SIGINT are forwarded to the
    /// command.
    ///
    /// The command runs in a process group of its own, and every signal
    /// goes to the whole group: what a wrapper (`sh -c`, a script, make)
    /// started ends with it. When the command exits, what it left running
    /// in its group gets SIGTERM (SIGKILL after --grace) before the lease is
    /// released; if mongo-lease dies, even by SIGKILL, the group is killed.
    /// A process that leaves the group (a daemon's setsid or double fork)
    /// escapes all of this. As its group is not the terminal's foreground
    /// group, a command that reads the terminal is stopped (SIGTTIN) until
    /// Ctrl-C (forwarded as SIGINT, then SIGCONT) ends it.
    ///
    /// The lease is exclusive unless --shared (the shared side of a
    /// read/write key, like flock --shared) or --permits N (one of N permits
    /// of a semaphore key).
    Exec(ExecArgs),
    /// Run a command only while leader of an election.
    ///
    /// Campaigns; once leader, runs the command with the election name and
    /// term in its environment. If leadership is lost, the command gets
    /// SIGTERM, then SIGKILL after --grace. When the command exits or
    /// leadership is lost, campaigns again (unless --once). SIGTERM and SIGINT
    /// are forwarded to the command, then mongo-lease resigns and exits.
    ///
    /// The command runs in a process group of its own, as with exec: the
    /// signals reach whatever it started, what it leaves running ends with
    /// it, and the group is killed if mongo-lease dies.
    Leader(LeaderArgs),
    /// Hold a lease on a key until interrupted (like `etcdctl lock`).
    ///
    /// Waits for the key (as exec: -n, -w SECONDS, -s, --permits N), then
    /// prints the key and its fencing token on stdout, one line per key
    /// (`KEY TOKEN`; --json: an object per key), keeps the lease renewed,
    /// and releases it on SIGINT or SIGTERM (exit 0), or when someone asks
    /// to release it (`release KEY --request`; `--on-revocation none` ignores
    /// requests). If the lease is lost meanwhile, it says so and exits 76.
    /// --http serves /healthz and /metrics, as for exec.
    Lock(LockArgs),
    /// Campaign in an election and hold leadership until interrupted (like
    /// `etcdctl elect`).
    ///
    /// Once leader, prints the election's name and term on stdout (`NAME
    /// TERM`; --json: `{"name", "term", "value", "owner_id"}`), stays
    /// leader, and resigns on SIGINT or SIGTERM (exit 0). VALUE, if given,
    /// is published as the leader's payload `{"value": VALUE}`, written by
    /// the write that wins the term. If leadership is lost meanwhile, it
    /// says so and exits 76.
    Elect(ElectArgs),
    /// List the leases in the lock collection, with server-time age and expiry.
    ///
    /// KIND is exclusive, shared, or the number of permits of a semaphore
    /// key; the holders of a shared or semaphore key follow its line, one
    /// per line. HELD UNTIL is the time left of a key's minimum hold
    /// (--hold-at-least), during which it stays held even once released.
    List(ListArgs),
    /// Release a key whoever holds it, or every lease of an owner id with
    /// --owner (operator override; needs --force).
    ///
    /// The holder learns it at its next renewal (within a third of its
    /// TTL), and its command is then terminated. Until then it may still be
    /// running, so the key is granted again only once the holder's lease
    /// could no longer be live (its expiry, at most one TTL away), never
    /// beside it; --immediately frees it after the lock-delay alone, for a
    /// holder known to be gone. The release is printed and logged.
    Release(ReleaseArgs),
    /// Print each change of a key's holders as it happens, until interrupted.
    ///
    /// One line per change, the first one the current state: `held` (one
    /// line per holder) or `free`; then `acquired` (a new holder after a
    /// release, or of a free key), `released` (by its holder, a force
    /// release, or a deletion of the lock document), `expired` (the server's
    /// expiry passed without a renewal) and `taken over` (a new holder while
    /// the previous one's lease had expired; it names both). A release that
    /// hands the key to a waiting owner in the same write prints `released`
    /// then `acquired`; a force release prints `released`. The holders of
    /// a shared or semaphore key come and go one line each. Renewals and
    /// payload writes change no holder and print nothing. SIGINT or SIGTERM
    /// ends it with exit code 0.
    ///
    /// Changes arrive through a change stream within milliseconds on a
    /// replica set, none missed; an expiry writes nothing and is seen by a
    /// read at the expiry time. On a standalone server the key is polled
    /// about every 0.5 s and shorter states can be missed.
    ///
    /// Text lines read `SERVER-TIME EVENT KEY [(KIND)] by OWNER (fencing
    /// token N, expires at T) [from OWNER (fencing token N)]`. With --json,
    /// one JSON object per line, always with the fields `event` (held, free,
    /// acquired, released, expired, taken over), `key` (Extended JSON),
    /// `kind` (exclusive, shared, permit), `permits`, `owner_id`,
    /// `fencing_token`, `foreign`, `acquired_at`, `expires_at` (the expiry,
    /// or the time the lease ended for released and expired),
    /// `previous_owner_id` and `previous_fencing_token` (taken over), and
    /// `server_time`, times in RFC 3339; `null` where one does not apply.
    Watch(WatchArgs),
}

#[derive(Args, Debug)]
pub struct LeaseTiming {
    /// Lease time-to-live, e.g. `30s`, `2m`: the lease expires on the server
    /// this long after its last renewal. Renewed three times per TTL minus
    /// TTL/10 minus --grace minus 1 s (the clock skew between the replica
    /// set's members the library assumes); at least 2 s.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    pub ttl: Duration,

    /// After SIGTERM, how long the command has to exit before SIGKILL, e.g.
    /// `5s`; at most TTL/2 [default: TTL/10].
    ///
    /// The command is gone before its lease expires on the server: when
    /// renewals go unconfirmed (MongoDB unreachable), the lease counts as
    /// lost, and the command gets SIGTERM, --grace + TTL/10 + 1 s (the clock
    /// skew) before the server's expiry, so SIGKILL comes TTL/10 + 1 s
    /// before it. A longer --grace gives the command longer to stop, and
    /// gives up the lease that much sooner after MongoDB becomes
    /// unreachable; for more than TTL/2, raise --ttl. An operator's
    /// `release --force` is noticed at the next renewal, and the key is
    /// granted again only once the lease could no longer be live, so the
    /// command is gone first; with `release --force --immediately`, or a
    /// deletion of the lock document by another application, the command
    /// may run beside the next holder until its next renewal + --grace.
    #[arg(long, value_parser = parse_duration)]
    pub grace: Option<Duration>,

    /// How far apart the replica set's members' clocks may be, e.g.
    /// `200ms`; at most 1s [default: 1s]. The lease is given up this much
    /// earlier too: a failover to a member whose clock is ahead ends every
    /// lease that much sooner. Lower it for a --ttl of a few seconds where
    /// the members' clocks are known to be that close.
    #[arg(long, env = "MONGO_LEASE_CLOCK_SKEW", value_parser = parse_lock_delay)]
    pub clock_skew: Option<Duration>,
}

impl LeaseTiming {
    /// `--grace`, or its default: TTL/10.
    pub fn grace(&self) -> Duration {
        self.grace
            .unwrap_or(self.ttl / DEFAULT_SAFETY_MARGIN_DIVISOR)
    }

    /// The manager's safety margin: the library's default (TTL/10, for the
    /// difference of clock rates and the delivery of SIGKILL) plus
    /// `--grace`. The lease is lost, and SIGTERM sent, at its local
    /// deadline (the start of its last confirmed renewal + TTL − this − the
    /// clock skew), so SIGKILL comes TTL/10 + the clock skew before the
    /// lease expires on the server.
    pub fn safety_margin(&self) -> Duration {
        self.ttl / DEFAULT_SAFETY_MARGIN_DIVISOR + self.grace()
    }

    /// `--clock-skew`, or the library's default (1 s).
    pub fn clock_skew(&self) -> Duration {
        self.clock_skew.unwrap_or(DEFAULT_CLOCK_SKEW)
    }

    /// The heartbeat: a third of the time a renewal keeps the lease (TTL −
    /// the safety margin − the clock skew), as the library's defaults have
    /// it, so that two renewals can fail before the lease is at risk.
    pub fn heartbeat_interval(&self) -> Duration {
        self.ttl
            .saturating_sub(self.safety_margin() + self.clock_skew())
            / DEFAULT_HEARTBEAT_DIVISOR
    }

    /// Refuses a `--grace` longer than half the TTL, and a TTL that leaves
    /// no time to renew in once the safety margin and the clock skew are
    /// taken off.
    ///
    /// # Errors
    ///
    /// A usage failure that names the options.
    pub fn check(&self) -> Result<(), Failure> {
        check_at_most_a_year("--ttl", self.ttl)?;
        if let Some(grace) = self.grace {
            check_at_most_a_year("--grace", grace)?;
        }
        let grace = self.grace();
        if grace > self.ttl / 2 {
            return Err(Failure::usage(format!(
                "--grace {} is longer than half of --ttl {}: the command must be stopped \
                 before its lease expires on the server, so it gets SIGTERM --grace + TTL/10 \
                 before that expiry, which would leave too little of the TTL to renew the \
                 lease in; raise --ttl to at least {} or shorten --grace",
                humantime::format_duration(grace),
                humantime::format_duration(self.ttl),
                humantime::format_duration(grace * 2),
            )));
        }
        let given_up = self.safety_margin() + self.clock_skew();
        if self.ttl <= given_up + Duration::from_millis(30) {
            return Err(Failure::usage(format!(
                "--ttl {} is too short: the lease is given up TTL/10 + --grace + --clock-skew \
                 ({} by default, how far apart the replica set's members' clocks may be), {} \
                 in all, before it expires on the server, which leaves no time to renew it; \
                 raise --ttl, or lower --grace or --clock-skew",
                humantime::format_duration(self.ttl),
                humantime::format_duration(DEFAULT_CLOCK_SKEW),
                humantime::format_duration(given_up),
            )));
        }
        Ok(())
    }
}

/// `exec`: the lease (`LockArgs`) and the command run under it.
#[derive(Args, Debug)]
pub struct ExecArgs {
    #[command(flatten)]
    pub lease: LockArgs,

    #[command(flatten)]
    pub run: CommandArg,
}

impl std::ops::Deref for ExecArgs {
    type Target = LockArgs;

    fn deref(&self) -> &LockArgs {
        &self.lease
    }
}

impl ExecArgs {
    /// `lock`'s arguments as `exec`'s: no command, the lease held until
    /// interrupted.
    pub fn hold(lease: LockArgs) -> ExecArgs {
        ExecArgs {
            lease,
            run: CommandArg::default(),
        }
    }

    /// Resolves `-c` into the command, and `-w 0` into `--no-wait`.
    pub fn resolve(mut self) -> ExecArgs {
        self.run = self.run.resolve();
        self.lease = self.lease.resolve();
        self
    }
}

/// The command of `exec` and `leader`: `-- CMD ARGS...`, or `-c
/// SHELL_COMMAND`.
#[derive(Args, Debug, Default)]
pub struct CommandArg {
    /// Run this shell command (with `/bin/sh -c`, as `flock -c`) instead
    /// of `-- CMD ARGS...`.
    #[arg(
        short = 'c',
        long = "command",
        value_name = "SHELL_COMMAND",
        conflicts_with = "command"
    )]
    pub shell: Option<String>,

    /// The command and its arguments.
    #[arg(last = true, required_unless_present = "shell", value_name = "CMD")]
    pub command: Vec<String>,
}

impl CommandArg {
    /// Resolves `-c SHELL_COMMAND` into `/bin/sh -c SHELL_COMMAND`.
    fn resolve(mut self) -> CommandArg {
        if let Some(shell) = self.shell.take() {
            self.command = vec!["/bin/sh".into(), "-c".into(), shell];
        }
        self
    }
}

/// The lease of `exec` and `lock`: its keys, kind, timing and waiting.
#[derive(Args, Debug)]
pub struct LockArgs {
    #[command(flatten)]
    pub key: KeyArg,

    #[command(flatten)]
    pub timing: LeaseTiming,

    /// Wait until the key is free (the default).
    #[arg(long, overrides_with = "no_wait")]
    pub wait: bool,

    /// Fail at once (exit 75) if the key is held (flock's -n).
    #[arg(short = 'n', long, conflicts_with = "timeout")]
    pub no_wait: bool,

    /// Wait at most this long for the key (then exit 75): SECONDS, as
    /// flock's -w (`-w 10`, `-w 0.5`), or a duration (`10s`, `2m`); 0 does
    /// not wait (as --no-wait).
    #[arg(short = 'w', long, value_name = "SECONDS", value_parser = parse_wait)]
    pub timeout: Option<Duration>,

    /// Take one of N permits of a semaphore key: at most N commands hold the
    /// key at a time, across processes (as Redisson's `RSemaphore`). N is
    /// stored with the key while any permit is held: meanwhile an exec of
    /// the key with another N, or without --permits, fails with exit code
    /// 78 (as does --permits on a key held exclusive or shared).
    #[arg(
        long,
        value_name = "N",
        value_parser = clap::value_parser!(u32).range(1..=i64::from(MAX_PERMITS)),
    )]
    pub permits: Option<u32>,

    /// Hold the key shared: any number of shared holders at a time, and no
    /// exclusive one (the shared side of a read/write key; an exec without
    /// --shared or --permits is the exclusive side). A waiting exclusive exec stops new shared holders
    /// until it has run (flock's -s).
    #[arg(short = 's', long, conflicts_with = "permits")]
    pub shared: bool,

    /// Keep the key held until its acquisition time plus this, e.g. `10m`, by
    /// the server's clock, even if the command ends earlier (or mongo-lease
    /// dies): a job run under it runs at most once per interval across
    /// machines (ShedLock's `lockAtLeastFor`). Exclusive leases only; needs
    /// --release-mode keep.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, conflicts_with_all = ["permits", "shared"])]
    pub hold_at_least: Option<Duration>,

    /// Hold the key at most this long, e.g. `30m`: the lease is never
    /// renewed and ends at its acquisition plus this by the server's clock
    /// (ShedLock's `lockAtMostFor`). So that the command is gone by then, it
    /// gets SIGTERM earlier, by the safety margin (--ttl / 10 + --grace, 6s
    /// with the defaults) and --clock-skew (1s by default): with the
    /// defaults, `--hold-at-most 30m` runs the command for 29m 53s, counted
    /// from the acquiring write's send; then SIGKILL after --grace, and
    /// mongo-lease exits 76 saying that --hold-at-most ended. It must be
    /// longer than that margin; at most a year. The lease's TTL in place of
    /// --ttl, which still sets the margin.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub hold_at_most: Option<Duration>,

    #[command(flatten)]
    pub http: HttpArg,

    /// The signal the command's process group gets when someone asks to
    /// release the lease, or any of them with several keys (`release KEY
    /// --request`, `request_release`):
    /// TERM (the default), INT, HUP, QUIT, USR1, USR2, or `none` to ignore
    /// requests. The lease stays held until the command exits.
    #[arg(long, value_name = "SIGNAL", default_value = "TERM", value_parser = parse_on_revocation)]
    pub on_revocation: OnRevocationArg,
}

impl LockArgs {
    /// `-w 0` (`--timeout 0`) is `--no-wait`, as flock's.
    pub fn resolve(mut self) -> LockArgs {
        if self.timeout.is_some_and(|t| t.is_zero()) {
            self.timeout = None;
            self.no_wait = true;
        }
        self
    }

    /// Checks the timing and the lease's options in the tool's terms,
    /// before connecting: the flag, the value, the limit, what to do.
    pub fn check(&self, release_mode: Option<ReleaseModeArg>) -> Result<(), Failure> {
        self.timing.check()?;
        for (flag, value) in [
            ("--hold-at-least", self.hold_at_least),
            ("--hold-at-most", self.hold_at_most),
        ] {
            if let Some(value) = value {
                check_at_most_a_year(flag, value)?;
            }
        }
        if let Some(at_most) = self.hold_at_most {
            let margin = self.timing.safety_margin() + self.timing.clock_skew();
            if at_most <= margin {
                return Err(Failure::usage(format!(
                    "--hold-at-most {} is too short: the command gets SIGTERM the safety margin \
                     (--ttl / 10 + --grace, {}) and --clock-skew ({}) before the lease ends, \
                     {} in all, which leaves it no time; pass a --hold-at-most longer than {}, \
                     or lower --ttl or --grace",
                    fmt(at_most),
                    fmt(self.timing.safety_margin()),
                    fmt(self.timing.clock_skew()),
                    fmt(margin),
                    fmt(margin),
                )));
            }
            if let Some(at_least) = self.hold_at_least.filter(|l| *l > at_most) {
                return Err(Failure::usage(format!(
                    "--hold-at-least {} is longer than --hold-at-most {}: the lease cannot \
                     be held at least longer than at most; shorten --hold-at-least",
                    fmt(at_least),
                    fmt(at_most)
                )));
            }
        }
        if matches!(release_mode, Some(ReleaseModeArg::Delete)) {
            let flag = if self.shared {
                Some("--shared")
            } else if self.permits.is_some() {
                Some("--permits")
            } else if self.hold_at_least.is_some() {
                Some("--hold-at-least")
            } else {
                None
            };
            if let Some(flag) = flag {
                return Err(Failure::usage(format!(
                    "{flag} needs the lock document kept on release, and --release-mode \
                     delete (or MONGO_LEASE_RELEASE_MODE=delete) deletes it: use \
                     --release-mode keep, or leave it out"
                )));
            }
        }
        Ok(())
    }

    /// `request` with the lease's options: shared, minimum and maximum hold
    /// (the TTL is the manager's, from --ttl, unless --hold-at-most; the
    /// permits are the semaphore's, which made the request).
    pub fn apply<'a, K, W>(&self, mut request: Acquire<'a, K, W>) -> Acquire<'a, K, W> {
        if self.shared {
            request = request.shared();
        }
        if let Some(at_least) = self.hold_at_least {
            request = request.hold_at_least(at_least);
        }
        if let Some(at_most) = self.hold_at_most {
            request = request.hold_at_most(at_most);
        }
        request
    }
}

/// The lease keys of `exec`: strings (`--key`) and any BSON values in
/// Extended JSON (`--key-json`); one or more, held together.
#[derive(Args, Debug)]
#[group(required = true, multiple = true)]
pub struct KeyArg {
    /// The key to hold, a string, as --key (`lock KEY`, `exec KEY -- CMD`).
    #[arg(value_name = "KEY")]
    pub positional: Vec<String>,

    /// The key to hold, a string. Repeat --key (or --key-json) to hold
    /// several keys at once: all of them or none, taken in one order
    /// whatever the order given (so two execs over overlapping keys never
    /// deadlock), and the loss of any is the loss of all.
    #[arg(long)]
    pub key: Vec<String>,

    /// The key as MongoDB Extended JSON v2, for a key of any BSON type (the
    /// `_id` of the document to lock), e.g.
    /// `--key-json '{"$oid":"5087b72181a445980ae47d13"}'`.
    #[arg(long, value_name = "JSON", value_parser = parse_key_json)]
    pub key_json: Vec<LeaseKey>,
}

impl KeyArg {
    /// The keys, at least one; with several, no string key may contain a
    /// newline (the separator of `MONGO_LEASE_KEY`).
    pub fn keys(&self) -> Result<Vec<LeaseKey>, Failure> {
        let strings = (self.positional.iter())
            .chain(&self.key)
            .map(|key| LeaseKey::from(key.as_str()));
        let keys: Vec<LeaseKey> = strings.chain(self.key_json.iter().cloned()).collect();
        if keys.is_empty() {
            return Err(Failure::usage(
                "a key is required: pass --key or --key-json",
            ));
        }
        if keys.len() > 1
            && let Some(key) =
                (self.positional.iter().chain(&self.key)).find(|key| key.contains('\n'))
        {
            return Err(Failure::usage(format!(
                "--key {key:?} contains a newline, which separates the keys in \
                 MONGO_LEASE_KEY when several are held: pass it alone, or with --key-json"
            )));
        }
        Ok(keys)
    }
}

/// An election's name (its lease key): a string (`--name`) or any BSON
/// value in Extended JSON (`--name-json`); exactly one.
#[derive(Args, Debug)]
#[group(required = true, multiple = false)]
pub struct NameArg {
    /// The election's name (its lease key), a string.
    #[arg(long)]
    pub name: Option<String>,

    /// The election's name as MongoDB Extended JSON v2, for a name of any
    /// BSON type, e.g. `--name-json '{"$oid":"5087b72181a445980ae47d13"}'`.
    #[arg(long, value_name = "JSON", value_parser = parse_key_json)]
    pub name_json: Option<LeaseKey>,
}

impl NameArg {
    pub fn key(&self) -> Result<LeaseKey, Failure> {
        one_key(
            self.name.as_deref(),
            self.name_json.as_ref(),
            "--name or --name-json",
        )
    }
}

/// The key given either as a string or as Extended JSON (clap lets through
/// at most one; `options` names them for the error when neither is given).
pub fn one_key(
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
pub struct LeaderArgs {
    #[command(flatten)]
    pub name: NameArg,

    #[command(flatten)]
    pub timing: LeaseTiming,

    /// Run the command once as leader, then resign and exit with its code
    /// (76 if leadership was lost meanwhile).
    #[arg(long)]
    pub once: bool,

    /// Pause after the command exits before campaigning again.
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub restart_delay: Duration,

    /// A JSON object published as the leader's payload, e.g. '{"addr":"10.0.0.7:8080"}',
    /// written by the write that wins each term: no observer sees the leader without it.
    #[arg(long, value_parser = parse_payload)]
    pub payload: Option<Document>,

    #[command(flatten)]
    pub http: HttpArg,

    #[command(flatten)]
    pub run: CommandArg,
}

impl LeaderArgs {
    /// Resolves `-c` into the command.
    pub fn resolve(mut self) -> LeaderArgs {
        self.run = self.run.resolve();
        self
    }
}

/// `elect NAME [VALUE]`.
#[derive(Args, Debug)]
pub struct ElectArgs {
    /// The election's name (its lease key).
    pub name: String,

    /// Published as the leader's payload, `{"value": VALUE}`.
    pub value: Option<String>,

    #[command(flatten)]
    pub timing: LeaseTiming,
}

impl ElectArgs {
    /// As `leader`'s arguments, without a command: leadership held until
    /// interrupted.
    pub fn into_leader(self) -> LeaderArgs {
        LeaderArgs {
            name: NameArg {
                name: Some(self.name),
                name_json: None,
            },
            timing: self.timing,
            once: true,
            restart_delay: Duration::from_secs(1),
            payload: self
                .value
                .map(|value| mongodb::bson::doc! { "value": value }),
            http: HttpArg { http: None },
            run: CommandArg::default(),
        }
    }
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only the keys held now (also a released key still in its minimum
    /// hold, --hold-at-least).
    #[arg(long)]
    pub held: bool,
}

/// `--http ADDR` of `exec` and `leader`.
#[derive(Args, Debug)]
pub struct HttpArg {
    /// Serve HTTP on ADDR (e.g. `127.0.0.1:9090`; port 0 picks a free one)
    /// while the command runs: `/healthz`, `/metrics` (Prometheus text
    /// format, series `mongo_lease_*`) and, for `leader`, `/leader` (the
    /// current leader as JSON, `null` if none). The bound address is
    /// printed to stderr as `mongo-lease: http listening on IP:PORT`.
    /// `/healthz` answers 200 while the lease is held and its renewals are
    /// on time, 503 once it is lost or its renewals are late; `exec` answers
    /// 503 while it still waits for the lease, `leader` 200 while it
    /// campaigns (a follower is healthy). A bad or busy address exits with 2.
    #[arg(long, value_name = "ADDR")]
    pub http: Option<String>,
}

#[derive(Args, Debug)]
pub struct WatchArgs {
    /// The key to watch, a string.
    #[arg(required_unless_present = "key_json")]
    pub key: Option<String>,

    /// The key to watch as MongoDB Extended JSON v2, for a key of any BSON
    /// type, e.g. `--key-json '{"$oid":"5087b72181a445980ae47d13"}'`.
    #[arg(long, value_name = "JSON", value_parser = parse_key_json, conflicts_with = "key")]
    pub key_json: Option<LeaseKey>,
}

/// `--release-mode`: [`ReleaseMode`] as a command-line value.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum ReleaseModeArg {
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
pub struct ReleaseArgs {
    /// The key to release, a string.
    #[arg(required_unless_present_any = ["key_json", "owner"], conflicts_with = "owner")]
    pub key: Option<String>,

    /// The key to release as MongoDB Extended JSON v2, for a key of any BSON
    /// type, e.g. `--key-json '{"$oid":"5087b72181a445980ae47d13"}'`.
    #[arg(long, value_name = "JSON", value_parser = parse_key_json, conflicts_with_all = ["key", "owner"])]
    pub key_json: Option<LeaseKey>,

    /// Release every lease held under this owner id instead (e.g. that of a
    /// dead process), and print how many.
    #[arg(long, value_name = "AID")]
    pub owner: Option<String>,

    /// Confirm the override: the current holder loses its lease.
    #[arg(long, conflicts_with = "request")]
    pub force: bool,

    /// The holder is known to be gone (its process killed, its machine
    /// off): grant the key again after the lock-delay alone, not at the
    /// holder's lease expiry. Also frees a key that an earlier --force left
    /// waiting. If the holder is in fact still running, it keeps running
    /// beside the next holder until its next renewal.
    #[arg(long, requires = "force")]
    pub immediately: bool,

    /// Ask the holders to release the key instead (a cooperative
    /// revocation): nothing is taken away; an `exec` holding it signals its
    /// command (`--on-revocation`). Prints whether the key was held.
    #[arg(long, conflicts_with = "owner")]
    pub request: bool,

    /// The lock-delay: after the override, nobody is granted the released
    /// keys for this long (by the server's clock), so that their holders
    /// have time to stop; 0s frees them at once. Default: the library's,
    /// the safety margin (a tenth of the default TTL, 3s).
    #[arg(long, value_name = "DURATION", value_parser = parse_lock_delay)]
    pub lock_delay: Option<Duration>,
}

/// `exec --on-revocation`: the signal a request to release sends, or none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnRevocationArg(Option<i32>);

impl OnRevocationArg {
    /// The signal, `None` for `none`.
    pub fn signal(self) -> Option<i32> {
        self.0
    }
}

fn parse_on_revocation(s: &str) -> Result<OnRevocationArg, String> {
    let name = s.to_ascii_uppercase();
    let signal = match name.strip_prefix("SIG").unwrap_or(&name) {
        "NONE" => return Ok(OnRevocationArg(None)),
        "TERM" => libc::SIGTERM,
        "INT" => libc::SIGINT,
        "HUP" => libc::SIGHUP,
        "QUIT" => libc::SIGQUIT,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        _ => return Err("expected TERM, INT, HUP, QUIT, USR1, USR2 or none".into()),
    };
    Ok(OnRevocationArg(Some(signal)))
}

/// The longest duration of a lease the tool takes (`--ttl`,
/// `--hold-at-least`, `--hold-at-most`, `--grace`): a year.
pub const MAX_LEASE_DURATION: Duration = Duration::from_secs(31_557_600);

/// `d` as the user would write it.
pub fn fmt(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(d)
}

fn check_at_most_a_year(flag: &str, value: Duration) -> Result<(), Failure> {
    if value > MAX_LEASE_DURATION {
        return Err(Failure::usage(format!(
            "{flag} {} is longer than a year, the longest this tool takes; pass a shorter one",
            fmt(value)
        )));
    }
    Ok(())
}

/// `-w` / `--timeout`: SECONDS as flock's (`10`, `0.5`, `0` = do not
/// wait), or a duration (`10s`, `2m`).
fn parse_wait(s: &str) -> Result<Duration, String> {
    if let Ok(seconds) = s.trim().parse::<f64>() {
        return Duration::try_from_secs_f64(seconds)
            .ok()
            .filter(|d| *d <= MAX_LEASE_DURATION)
            .ok_or_else(|| "seconds from 0 to a year, e.g. 10 or 0.5 (0: do not wait)".into());
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("{e} (examples: 10, 0.5, 10s, 2m; 0: do not wait)"))
}

/// `--lock-delay`: a duration, zero included.
fn parse_lock_delay(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e} (examples: 0s, 500ms, 15s)"))
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
