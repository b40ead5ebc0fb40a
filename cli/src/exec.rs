//! `mongo-lease exec`: run a command while holding a lease on a key, or
//! on several keys at once (`--key` repeated: `LeaseManager::acquire_all`).

use std::sync::Arc;

use mongo_lease::{
    Error, Lease, LeaseGroup, LeaseInfo, LeaseKey, LeaseKind, LeaseManager, LossReason,
    ReleaseOutcome, Semaphore,
};
use std::future::IntoFuture;
use tokio_util::sync::WaitForCancellationFutureOwned;
use tokio_util::time::FutureExt as _;

use crate::args::ExecArgs;
use crate::child::{self, ChildOutcome, LeaseEnv, Signals};
use crate::http::{self, Held as _, Phase, Status};
use crate::output::Say;
use crate::{Failure, exit, output, progress};

/// `acquired`, or `None` if it takes longer than `timeout` (if any).
async fn within<T>(
    acquired: impl std::future::Future<Output = Result<T, Error>>,
    timeout: Option<std::time::Duration>,
) -> Result<Option<T>, Error> {
    match timeout {
        None => acquired.await.map(Some),
        Some(timeout) => acquired.timeout(timeout).await.ok().transpose(),
    }
}

/// Acquires the key (of the kind and minimum hold the flags ask for), runs
/// the command under the lease, releases it; the exit code. `status` tells
/// `--http`'s `/healthz` where it is. Without a command (`lock`), the lease
/// is held until SIGINT or SIGTERM.
pub async fn exec(
    manager: &LeaseManager,
    args: ExecArgs,
    json: bool,
    status: &Status,
    say: Say,
) -> Result<u8, Failure> {
    let signals = Signals::listen()?;
    let keys = args.key.keys()?;
    let semaphore = match (keys.as_slice(), args.permits) {
        (_, None) => None,
        ([key], Some(permits)) => Some(Semaphore::new(manager, key.clone(), permits)?),
        (_, Some(_)) => {
            return Err(Failure::usage(
                "--permits takes one key: a semaphore is one key with N permits",
            ));
        }
    };
    let acquire = async {
        match (keys.as_slice(), &semaphore, args.no_wait) {
            ([_], Some(semaphore), true) => {
                let acquired = args.apply(semaphore.try_acquire()).await;
                acquired.map(|lease| lease.map(Held::One))
            }
            ([_], Some(semaphore), false) => {
                let acquired = args.apply(semaphore.acquire()).into_future();
                within(acquired, args.timeout)
                    .await
                    .map(|lease| lease.map(Held::One))
            }
            ([key], None, true) => {
                let acquired = args.apply(manager.try_acquire(key.clone())).await;
                acquired.map(|lease| lease.map(Held::One))
            }
            ([key], None, false) => {
                let acquired = args.apply(manager.acquire(key.clone())).into_future();
                within(acquired, args.timeout)
                    .await
                    .map(|lease| lease.map(Held::One))
            }
            (_, _, true) => {
                let acquired = args.apply(manager.try_acquire_all(keys.clone())).await;
                acquired.map(|group| group.map(Held::All))
            }
            (_, _, false) => {
                let acquired = args.apply(manager.acquire_all(keys.clone())).into_future();
                within(acquired, args.timeout)
                    .await
                    .map(|group| group.map(Held::All))
            }
        }
    };
    let held = tokio::select! {
        held = acquire => held.map_err(|e| mismatch_hint(&keys, e))?,
        signal = signals.next() => return Ok(128 + signal as u8),
        () = progress::report(manager, &keys, say, progress::LEASE), if !args.no_wait => {
            unreachable!("the progress report never ends")
        }
    };
    let Some(held) = held else {
        let (key, holder) = first_held(manager, &keys).await;
        output::print_not_acquired(key, holder.as_ref(), json);
        return Ok(exit::NOT_ACQUIRED);
    };
    let leases = held.leases();
    let (names, tokens): (Vec<String>, Vec<u64>) = leases
        .iter()
        .map(|lease| (lease.key().to_string(), lease.fencing_token()))
        .unzip();
    let (names, kind) = (names.join("\n"), leases[0].kind());
    // A request to release any of the keys signals the command.
    let events = futures::stream::select_all(leases.iter().map(|lease| lease.status().events()));
    tracing::debug!(keys = %names.replace('\n', ", "), ?tokens, %kind, "acquired");
    let held = Arc::new(held);
    status.set(Phase::Holding(held.clone()));
    let env = LeaseEnv {
        key: &names,
        tokens: &tokens,
        owner_id: manager.owner_id(),
        kind,
    };
    let revocation = args.on_revocation.signal().map(|signal| (events, signal));
    let outcome = if args.run.command.is_empty() {
        print_held(held.leases(), json, say);
        child::hold(held.lost(), &signals, revocation).await
    } else {
        child::run(
            &args.run.command,
            &env,
            held.lost(),
            args.timing.grace(),
            &signals,
            revocation,
        )
        .await
    };
    let lost = held.is_lost();
    let reason = held
        .leases()
        .iter()
        .find_map(|lease| lease.status().lost_reason());
    // The status held the only other reference.
    status.set(Phase::Ended);
    if let Ok(held) = Arc::try_unwrap(held) {
        let _ = held.release().await;
    }
    match outcome {
        ChildOutcome::Exited(code) if !lost => Ok(code),
        ChildOutcome::Exited(_) | ChildOutcome::Lost => {
            let keys: Vec<String> = keys.iter().map(LeaseKey::to_extended_json).collect();
            let keys = keys.join(", ");
            let ended = if args.run.command.is_empty() {
                ""
            } else {
                "; the command was terminated"
            };
            match (args.hold_at_most, reason) {
                (Some(at_most), Some(LossReason::Expired)) => eprintln!(
                    "mongo-lease: --hold-at-most {} ended the lease on {keys}{ended}: the \
                     lease ends {} after its acquisition by the server's clock, and the \
                     command gets SIGTERM the safety margin (--ttl / 10 + --grace, {}) and \
                     --clock-skew ({}) before that",
                    crate::args::fmt(at_most),
                    crate::args::fmt(at_most),
                    crate::args::fmt(args.timing.safety_margin()),
                    crate::args::fmt(args.timing.clock_skew()),
                ),
                (_, reason) => eprintln!(
                    "mongo-lease: the lease on {keys} was lost{}{ended}",
                    reason.map(|r| loss(&r)).unwrap_or_default()
                ),
            }
            Ok(exit::LEASE_LOST)
        }
        ChildOutcome::SpawnFailed(code, message) => {
            eprintln!("mongo-lease: {message}");
            Ok(code)
        }
    }
}

/// Why a lease was lost, in a few words (` (taken by OWNER)`).
fn loss(reason: &LossReason) -> String {
    match reason {
        LossReason::Expired => {
            " (not renewed in time: MongoDB did not confirm a renewal before the lease's \
             local deadline)"
                .into()
        }
        LossReason::Taken { owner_id, .. } => format!(" (taken by {owner_id})"),
        LossReason::Deleted => " (its lock document was deleted by someone else)".into(),
        LossReason::ForceReleased => " (released by an operator: release --force)".into(),
        LossReason::GroupLost { key, reason } => format!(
            " (with the lease on {}{})",
            key.to_extended_json(),
            loss(reason)
        ),
        _ => String::new(),
    }
}

/// `lock`: the keys and fencing tokens held, on stdout, one line (or JSON
/// object) per key; and a line on stderr saying how it ends.
fn print_held(leases: &[Lease], json: bool, say: Say) {
    for lease in leases {
        if json {
            let line = serde_json::json!({
                "key": output::key_json(lease.key()),
                "fencing_token": lease.fencing_token(),
                "owner_id": lease.owner_id(),
                "kind": output::kind_name(lease.kind()),
            });
            println!("{line}");
        } else {
            println!("{} {}", lease.key(), lease.fencing_token());
        }
    }
    say.info(format_args!(
        "holding the lease until SIGINT or SIGTERM (Ctrl-C), which release it"
    ));
}

/// What the command runs under: the lease on its one key, or the group of
/// leases on its several keys (`--key` repeated), which is lost as a whole.
enum Held {
    One(Lease),
    All(LeaseGroup),
}

impl Held {
    /// The leases, in the order they were taken.
    fn leases(&self) -> &[Lease] {
        match self {
            Held::One(lease) => std::slice::from_ref(lease),
            Held::All(group) => group.leases(),
        }
    }

    fn lost(&self) -> WaitForCancellationFutureOwned {
        match self {
            Held::One(lease) => lease.status().lost(),
            Held::All(group) => group.status().lost(),
        }
    }

    async fn release(self) -> mongo_lease::Result<ReleaseOutcome> {
        match self {
            Held::One(lease) => lease.release().await,
            Held::All(group) => group.release().await,
        }
    }
}

impl http::Held for Held {
    fn is_lost(&self) -> bool {
        match self {
            Held::One(lease) => lease.status().is_lost(),
            Held::All(group) => group.status().is_lost(),
        }
    }
}

/// The first of `keys` held by someone, with what a read shows of it (the
/// first key if none reads held now).
async fn first_held<'k>(
    manager: &LeaseManager,
    keys: &'k [LeaseKey],
) -> (&'k LeaseKey, Option<LeaseInfo>) {
    for key in keys {
        let holder = manager.inspect(key.clone()).await.ok().flatten();
        if holder.as_ref().is_some_and(|h| h.held) {
            return (key, holder);
        }
    }
    (&keys[0], None)
}

/// The failure of an acquisition; a kind mismatch names the key and says
/// what to change.
fn mismatch_hint(keys: &[LeaseKey], e: Error) -> Failure {
    let named = matches!(e, Error::KindMismatch { .. });
    let hint = match &e {
        Error::KindMismatch {
            stored: LeaseKind::Permit { permits },
            ..
        } => format!(
            " (a semaphore key while any of its permits is held: every exec of it must \
             pass --permits {permits})"
        ),
        Error::KindMismatch {
            requested: LeaseKind::Permit { .. },
            ..
        } => " (a key held exclusive or shared has no permits: --permits can take it once \
              its holders are gone)"
            .to_string(),
        _ => String::new(),
    };
    let mut failure = Failure::from(e);
    if named {
        failure.message = failure
            .message
            .replacen("the key", &keys[0].to_extended_json(), 1);
    }
    failure.message.push_str(&hint);
    failure
}
