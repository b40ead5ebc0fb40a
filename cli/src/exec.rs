//! `mongo-lease exec`: run a command while holding a lease on a key.

use std::sync::Arc;

use mongo_lease::{Error, LeaseKey, LeaseKind, LeaseManager};
use tokio_util::time::FutureExt as _;

use crate::args::ExecArgs;
use crate::child::{self, ChildOutcome, LeaseEnv, Signals};
use crate::http::{Phase, Status};
use crate::{Failure, exit, output};

/// Acquires the key (of the kind and minimum hold the flags ask for), runs
/// the command under the lease, releases it; the exit code. `status` tells
/// `--http`'s `/healthz` where it is.
pub async fn exec(
    manager: &LeaseManager,
    args: ExecArgs,
    json: bool,
    status: &Status,
) -> Result<u8, Failure> {
    let signals = Signals::listen()?;
    let key = args.key.key()?;
    let options = args.acquire_options();
    let acquire = async {
        if args.no_wait {
            manager.try_acquire_with(key.clone(), &options).await
        } else if let Some(timeout) = args.timeout {
            manager
                .acquire_with(key.clone(), &options)
                .timeout(timeout)
                .await
                .ok()
                .transpose()
        } else {
            manager.acquire_with(key.clone(), &options).await.map(Some)
        }
    };
    let lease = tokio::select! {
        lease = acquire => lease.map_err(|e| mismatch_hint(&key, e))?,
        signal = signals.next() => return Ok(128 + signal as u8),
    };
    let Some(lease) = lease else {
        let holder = manager.inspect(key.clone()).await.ok().flatten();
        output::print_not_acquired(&key, holder.as_ref(), json);
        return Ok(exit::NOT_ACQUIRED);
    };
    tracing::debug!(%key, token = lease.fencing_token(), kind = %lease.kind(), "acquired");
    let lease = Arc::new(lease);
    status.set(Phase::Holding(lease.clone()));
    let env = LeaseEnv {
        key: &key.to_string(),
        token: lease.fencing_token(),
        owner_id: manager.owner_id(),
        kind: lease.kind(),
    };
    let revoke = args
        .on_revoke
        .signal()
        .map(|signal| (lease.events(), signal));
    let outcome = child::run(
        &args.command,
        &env,
        lease.lost(),
        args.timing.grace(),
        &signals,
        revoke,
    )
    .await;
    let lost = lease.is_lost();
    // The status held the only other reference.
    status.set(Phase::Ended);
    if let Ok(lease) = Arc::try_unwrap(lease) {
        let _ = lease.release().await;
    }
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

/// The failure of an acquisition; a kind mismatch names the key and says
/// what to change.
fn mismatch_hint(key: &LeaseKey, e: Error) -> Failure {
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
            .replacen("the key", &key.to_extended_json(), 1);
    }
    failure.message.push_str(&hint);
    failure
}
