//! The fault knobs and call counters of a [`MemoryStore`],
//! shared by its clones: what each operation suffers, and what the actor
//! called.

use crate::random::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::db::lock;
use super::store::MemoryStore;
use crate::key::LeaseKey;

/// One kind of store operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    Acquire,
    Renew,
    Release,
    ReleaseOwner,
    Inspect,
    List,
    ForceRelease,
    SetPayload,
    /// A write under an in-document lease (`Store::write_document`).
    WriteDocument,
    /// A handoff to a local waiter (`Store::handoff`).
    Handoff,
    /// Leaving the queues of waiting owners (`Store::leave_queues`).
    LeaveQueues,
    /// A change of a semaphore's number of permits (`Store::set_permits`).
    SetPermits,
    /// A cooperative revocation: its request (`Store::request_release`),
    /// the read of the requests (`Store::revocations`).
    RequestRelease,
}

pub(super) const OPS: usize = 13;

impl Op {
    pub(super) fn index(self) -> usize {
        self as usize
    }
}

/// An injected fault. The twin plays the server's side of every call: once
/// issued, a call is applied at the instant its latency and fault give
/// (in a task of its own on the runtime), whether or not its caller still
/// waits for the answer, as MongoDB applies a write it received whether
/// or not the client still waits; the answer reaches the caller if it
/// still waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Fault {
    /// The answer never comes (the caller waits for ever, or until an
    /// operation timeout, see [`MemoryStore::set_operation_timeout`]), and
    /// the call may still be applied: whether and when is drawn when it is
    /// issued (half the time never, else up to three of the store's TTLs
    /// after its latency), from `crate::random`.
    Hang,
    /// The call is never applied and never answered: lost on its way to
    /// the server (or refused there by a server-side bound, without a
    /// word).
    Lost,
    /// The call is applied this much later than its latency, and its answer
    /// never comes: a write the server holds up (a lock, a slow majority)
    /// while the client gives up on it.
    Unanswered(Duration),
    /// The operation completes (and is applied) this much later than its
    /// latency: applied then whether or not its caller still waits.
    Delay(Duration),
    /// The operation is applied after its latency, and its answer arrives
    /// this much later (held up on its way back): the caller learns of a
    /// write the server made long before.
    LateReply(Duration),
    /// Transient failure before applying: `Error::Unreachable`.
    Fail,
    /// Applied, then reported as a transient failure (outcome unknown to the caller).
    FailAfterApply,
    /// A read applied to the documents as they were this long ago (a
    /// majority snapshot behind writes already applied on the primary;
    /// [`MemoryDb::keep_snapshots`](super::MemoryDb::keep_snapshots) keeps
    /// them, the documents as they are without): for reads only, a write
    /// so faulted changes nothing.
    Stale(Duration),
}

/// One call the actor made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Call {
    pub op: Op,
    /// When the actor issued it.
    pub at: Instant,
    /// The keys it named (acquire: one; renew/release: the batch; release by owner: none).
    pub keys: Vec<LeaseKey>,
}

/// Draws what one call suffers (added latency, fault) when it is issued: a
/// simulation's fault plan (`crate::sim`), ahead of [`MemoryStore::set_fault`].
pub(crate) type CallFaults = Box<dyn FnMut(Op) -> (Duration, Option<Fault>) + Send>;

/// What becomes of one write announced to a stream of writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventFate {
    /// Delivered `copies` times (1: once), each after `delay` (later events
    /// may overtake it).
    Deliver { copies: usize, delay: Duration },
    /// Never delivered.
    Drop,
    /// The stream fails instead (the manager reopens it later).
    Restart,
}

/// Draws the fate of each write announced to this store's streams.
pub(crate) type EventFaults = Box<dyn FnMut() -> EventFate + Send>;

#[derive(Default)]
struct Control {
    latency: [Duration; OPS],
    fault: [Option<Fault>; OPS],
    fault_next: [Option<(Fault, u32)>; OPS],
    operation_timeout: Option<Duration>,
    /// The bound the server puts on each call (MongoDB's `maxTimeMS`),
    /// [`MemoryStore::set_server_bound`].
    server_bound: Option<Duration>,
    calls: Vec<Call>,
    in_flight: [usize; OPS],
    max_in_flight: [usize; OPS],
    acquires_in_flight: HashMap<LeaseKey, usize>,
    max_acquires_in_flight_per_key: usize,
    call_faults: Option<CallFaults>,
    event_faults: Option<EventFaults>,
    /// The manager's process is gone: nothing it sends from now on
    /// arrives, and its streams deliver nothing.
    crashed: bool,
}

/// The knobs and counters of one store, shared by its clones and by the
/// operations in flight.
#[derive(Clone, Default)]
pub(super) struct Controls(Arc<Mutex<Control>>);

/// What one call suffers, read from the knobs when the call is issued.
pub(super) struct Issued {
    /// How long it sleeps before being applied.
    pub latency: Duration,
    /// The fault injected into it, if any.
    pub fault: Option<Fault>,
    /// The bound on the whole operation, if any: the caller gives up
    /// then, the call may still be applied.
    pub timeout: Option<Duration>,
    /// The server-side bound the call carries, if any (MongoDB's
    /// `maxTimeMS`): a call not applied within it after it was issued is
    /// never applied (answered with an error if its caller still waits).
    pub server_bound: Option<Duration>,
    /// Counts the call in flight until dropped.
    pub in_flight: InFlight,
}

/// Counts an operation in flight until its future completes or is dropped.
pub(super) struct InFlight {
    control: Arc<Mutex<Control>>,
    op: Op,
    key: Option<LeaseKey>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut c = lock(&self.control);
        c.in_flight[self.op.index()] -= 1;
        if let Some(key) = &self.key {
            let n = c.acquires_in_flight.get_mut(key).expect("counted");
            *n -= 1;
            if *n == 0 {
                c.acquires_in_flight.remove(key);
            }
        }
    }
}

impl Controls {
    /// What becomes of the next write announced to a stream.
    pub fn event_fate(&self) -> EventFate {
        let mut c = lock(&self.0);
        if c.crashed {
            return EventFate::Drop;
        }
        match c.event_faults.as_mut() {
            Some(draw) => draw(),
            None => EventFate::Deliver {
                copies: 1,
                delay: Duration::ZERO,
            },
        }
    }

    /// Records a call of `op` naming `keys`, counts it in flight, and reads
    /// the knobs for it.
    pub fn issue(&self, op: Op, keys: &[LeaseKey]) -> Issued {
        let mut c = lock(&self.0);
        let i = op.index();
        let (extra, drawn) = match c.call_faults.as_mut() {
            Some(draw) => draw(op),
            None => (Duration::ZERO, None),
        };
        let fault = match c.fault_next[i] {
            Some((fault, n)) => {
                c.fault_next[i] = (n > 1).then_some((fault, n - 1));
                Some(fault)
            }
            None => drawn.or(c.fault[i]),
        };
        // Nothing a crashed process sends arrives.
        let fault = if c.crashed { Some(Fault::Lost) } else { fault };
        c.calls.push(Call {
            op,
            at: Instant::now(),
            keys: keys.to_vec(),
        });
        c.in_flight[i] += 1;
        c.max_in_flight[i] = c.max_in_flight[i].max(c.in_flight[i]);
        if op == Op::Acquire {
            let n = c.acquires_in_flight.entry(keys[0].clone()).or_insert(0);
            *n += 1;
            let n = *n;
            c.max_acquires_in_flight_per_key = c.max_acquires_in_flight_per_key.max(n);
        }
        Issued {
            latency: c.latency[i] + extra,
            fault,
            timeout: c.operation_timeout,
            server_bound: c.server_bound,
            in_flight: InFlight {
                control: self.0.clone(),
                op,
                key: (op == Op::Acquire).then(|| keys[0].clone()),
            },
        }
    }
}

/// The knobs and counters, set and read by the test through any clone of
/// the store.
impl MemoryStore {
    fn control(&self) -> MutexGuard<'_, Control> {
        lock(&self.control.0)
    }

    /// Every later call of `op` waits this long, then is applied.
    pub fn set_latency(&self, op: Op, latency: Duration) {
        self.control().latency[op.index()] = latency;
    }

    /// Every later call of `op` suffers `fault` (`None` heals it).
    pub fn set_fault(&self, op: Op, fault: Option<Fault>) {
        self.control().fault[op.index()] = fault;
    }

    /// The next `n` calls of `op` suffer `fault`, ahead of any fault set with
    /// [`MemoryStore::set_fault`]; later calls behave as before.
    pub fn fault_next(&self, op: Op, fault: Fault, n: u32) {
        self.control().fault_next[op.index()] = (n > 0).then_some((fault, n));
    }

    /// The next `n` calls of `op` fail transiently before applying.
    pub fn fail_next(&self, op: Op, n: u32) {
        self.fault_next(op, Fault::Fail, n);
    }

    /// Renewals never complete and are never applied ([`Fault::Lost`]).
    pub fn hang_renewals(&self) {
        self.set_fault(Op::Renew, Some(Fault::Lost));
    }

    /// Renewals fail with a transient error.
    pub fn fail_renewals(&self) {
        self.set_fault(Op::Renew, Some(Fault::Fail));
    }

    /// Bounds every later operation like `MongoStore` does (`None`: no
    /// bound, so a hang is a hang).
    pub fn set_operation_timeout(&self, timeout: Option<Duration>) {
        self.control().operation_timeout = timeout;
    }

    /// Every later call carries this server-side bound (MongoDB's
    /// `maxTimeMS`; `None`, the default: none, as the product sends none):
    /// a call not applied within it after it was issued is never applied.
    pub fn set_server_bound(&self, bound: Option<Duration>) {
        self.control().server_bound = bound;
    }

    /// Draws each later call's added latency and fault with `draw` (ahead of
    /// [`MemoryStore::set_fault`], after [`MemoryStore::fault_next`]).
    pub fn set_call_faults(&self, draw: CallFaults) {
        self.control().call_faults = Some(draw);
    }

    /// Draws the fate of each write later announced to this store's streams
    /// of writes: delayed, duplicated, dropped, or the stream fails.
    pub fn set_event_faults(&self, draw: EventFaults) {
        self.control().event_faults = Some(draw);
    }

    /// The manager's process crashed: its later calls never arrive, its
    /// streams deliver nothing more; calls already sent still apply when
    /// their faults say (perhaps long after).
    pub fn crash(&self) {
        self.control().crashed = true;
    }

    /// Every call made so far, in order.
    pub fn log(&self) -> Vec<Call> {
        self.control().calls.clone()
    }

    /// The calls of `op` made so far.
    pub fn calls_of(&self, op: Op) -> Vec<Call> {
        let calls = self.control().calls.clone();
        calls.into_iter().filter(|c| c.op == op).collect()
    }

    /// How many calls of `op` were made so far.
    pub fn calls(&self, op: Op) -> usize {
        self.control().calls.iter().filter(|c| c.op == op).count()
    }

    /// Acquire calls for `key` so far.
    pub fn acquire_calls(&self, key: impl Into<LeaseKey>) -> Vec<Instant> {
        let key = &key.into();
        let calls = self.calls_of(Op::Acquire);
        calls
            .iter()
            .filter(|c| &c.keys[0] == key)
            .map(|c| c.at)
            .collect()
    }

    /// The size of each renew call, in order.
    pub fn renew_batch_sizes(&self) -> Vec<usize> {
        self.calls_of(Op::Renew)
            .iter()
            .map(|c| c.keys.len())
            .collect()
    }

    /// Total leases named by all renew calls.
    pub fn leases_renewed(&self) -> usize {
        self.renew_batch_sizes().iter().sum()
    }

    /// Total leases named by all release calls.
    pub fn leases_released(&self) -> usize {
        self.calls_of(Op::Release)
            .iter()
            .map(|c| c.keys.len())
            .sum()
    }

    /// Calls of `op` in flight now.
    pub fn in_flight(&self, op: Op) -> usize {
        self.control().in_flight[op.index()]
    }

    /// The most calls of `op` ever in flight at once.
    pub fn max_in_flight(&self, op: Op) -> usize {
        self.control().max_in_flight[op.index()]
    }

    /// The most acquire calls ever in flight at once for one key.
    pub fn max_acquires_in_flight_per_key(&self) -> usize {
        self.control().max_acquires_in_flight_per_key
    }

    /// How many clones of this store exist (the test's, the actor's, and one
    /// per operation in flight): 1 once the actor has stopped and nothing runs.
    pub fn handles(&self) -> usize {
        Arc::strong_count(&self.control.0)
    }
}
