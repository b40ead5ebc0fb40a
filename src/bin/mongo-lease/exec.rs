//! `mongo-lease exec`: run a command while holding a lease on a key.

use mongo_lease::{Error, LockManager};

use crate::args::ExecArgs;
use crate::child::{self, ChildOutcome, LeaseEnv, Signals};
use crate::{Failure, exit, output};

/// Acquires the key (of the kind and minimum hold the flags ask for), runs
/// the command under the lease, releases it; the exit code.
pub async fn exec(manager: &LockManager, args: ExecArgs, json: bool) -> Result<u8, Failure> {
    let signals = Signals::listen()?;
    let key = args.key.key()?;
    let options = args.acquire_options();
    let acquire = async {
        if args.no_wait {
            manager.try_acquire_with(key.clone(), &options).await
        } else if let Some(timeout) = args.timeout {
            manager
                .acquire_timeout_with(key.clone(), timeout, &options)
                .await
        } else {
            manager.acquire_with(key.clone(), &options).await.map(Some)
        }
    };
    let lease = tokio::select! {
        lease = acquire => lease.map_err(mismatch_hint)?,
        signal = signals.next() => return Ok(128 + signal as u8),
    };
    let Some(lease) = lease else {
        let holder = manager.inspect(key.clone()).await.ok().flatten();
        output::print_not_acquired(&key, holder.as_ref(), json);
        return Ok(exit::NOT_ACQUIRED);
    };
    tracing::debug!(%key, token = lease.fencing_token(), kind = %lease.kind(), "acquired");
    let env = LeaseEnv {
        key: &key.to_string(),
        token: lease.fencing_token(),
        owner_id: manager.owner_id(),
        kind: lease.kind(),
    };
    let outcome = child::run(
        &args.command,
        &env,
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

/// The failure of an acquisition; a kind mismatch says what to change.
fn mismatch_hint(e: Error) -> Failure {
    let mismatch = matches!(e, Error::KindMismatch { .. });
    let mut failure = Failure::from(e);
    if mismatch {
        failure.message.push_str(
            " (while a key has holders, every --permits exec of it must pass the number \
             of permits it is held with; a key held --shared has no permits)",
        );
    }
    failure
}
