//! [`FaultProxy`]: a fault-injecting TCP proxy on loopback (added latency,
//! blackhole, reset).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::TestkitError;

/// Size of one read from either side.
const CHUNK: usize = 64 * 1024;

struct Shared {
    upstream: SocketAddr,
    latency_us: AtomicU64,
    blackholed: watch::Sender<bool>,
    /// Connections currently open, by id, with a handle to abort them.
    conns: Mutex<HashMap<u64, Conn>>,
    next_id: AtomicU64,
    accepted: AtomicU64,
}

struct Conn {
    task: JoinHandle<()>,
    /// Raw descriptors of both sockets, to set `SO_LINGER` 0 before abort.
    fds: [i32; 2],
}

/// A TCP proxy from a loopback port to one upstream address, with faults
/// switched on and off at run time.
///
/// While it runs, a test can change what the link does to the bytes
/// crossing it:
///
/// * [`set_latency`](FaultProxy::set_latency): every chunk of bytes is
///   delivered `latency` after the proxy read it, in each direction (so a
///   request/response round trip gets twice the latency). Order is kept and
///   delays do not add up: chunks read 1 ms apart leave 1 ms apart.
/// * [`blackhole`](FaultProxy::blackhole): traffic in both directions stops
///   silently. Nothing is discarded: bytes sent meanwhile are held and
///   delivered after [`heal`](FaultProxy::heal), like TCP retransmitting
///   packets that a partitioned network dropped. A peer that gives up and
///   closes its end still gets its last bytes delivered after the heal, like
///   a kernel flushing a closed socket's send buffer. New connections are
///   accepted (the kernel completes the handshake) and then stall too.
/// * [`reset`](FaultProxy::reset): every open connection is aborted with a
///   TCP reset on both sides (`SO_LINGER` 0); data held back is dropped.
///
/// The proxy runs as tasks on the tokio runtime that called
/// [`FaultProxy::start`]; dropping the proxy stops accepting and aborts every
/// connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), mongo_lease::testkit::TestkitError> {
/// use std::time::Duration;
/// use mongo_lease::testkit::{FaultProxy, ReplicaSet, ReplicaSetOptions};
///
/// let rs = ReplicaSet::start(ReplicaSetOptions::default()).await?;
/// let proxy = FaultProxy::start(([127, 0, 0, 1], rs.members()[0].port()).into()).await?;
/// let uri = format!("mongodb://{}/?directConnection=true", proxy.addr());
/// proxy.set_latency(Duration::from_millis(200));
/// proxy.blackhole();   // silence
/// proxy.heal();        // held bytes flow again
/// proxy.reset();       // connection reset by peer
/// # let _ = uri; Ok(()) }
/// ```
pub struct FaultProxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    acceptor: JoinHandle<()>,
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("latency", &self.latency())
            .field("blackholed", &self.is_blackholed())
            .finish()
    }
}

impl FaultProxy {
    /// Starts a proxy on a free `127.0.0.1` port that forwards to `upstream`,
    /// with no fault. Must be called inside a tokio runtime.
    pub async fn start(upstream: SocketAddr) -> Result<FaultProxy, TestkitError> {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .map_err(|e| TestkitError::io("binding the fault proxy on 127.0.0.1", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| TestkitError::io("reading the fault proxy's address", e))?;
        let shared = Arc::new(Shared {
            upstream,
            latency_us: AtomicU64::new(0),
            blackholed: watch::channel(false).0,
            conns: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
        });
        let acceptor = tokio::spawn(accept_loop(listener, shared.clone()));
        Ok(FaultProxy {
            addr,
            shared,
            acceptor,
        })
    }

    /// The address clients connect to (`127.0.0.1:<port>`).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Delays every chunk of bytes by `latency` in each direction, from now
    /// on (bytes already read keep the delay they were read with).
    pub fn set_latency(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.shared.latency_us.store(us, Ordering::Relaxed);
    }

    /// The latency currently added in each direction.
    pub fn latency(&self) -> Duration {
        Duration::from_micros(self.shared.latency_us.load(Ordering::Relaxed))
    }

    /// Stops all traffic silently, in both directions, until [`heal`](Self::heal).
    pub fn blackhole(&self) {
        self.shared.blackholed.send_replace(true);
    }

    /// Ends a [`blackhole`](Self::blackhole): held bytes are delivered (with
    /// their latency, if any) and traffic flows again.
    pub fn heal(&self) {
        self.shared.blackholed.send_replace(false);
    }

    /// Whether the link is blackholed.
    pub fn is_blackholed(&self) -> bool {
        *self.shared.blackholed.borrow()
    }

    /// Aborts every open connection with a TCP reset (`SO_LINGER` 0) on both
    /// sides; bytes held back are dropped. Later connections work as usual
    /// (under the faults still set). Returns how many connections were reset.
    pub fn reset(&self) -> usize {
        let conns: Vec<Conn> = {
            let mut map = self.shared.conns.lock().unwrap_or_else(|e| e.into_inner());
            map.drain().map(|(_, c)| c).collect()
        };
        for conn in &conns {
            for fd in conn.fds {
                set_zero_linger(fd);
            }
            conn.task.abort();
        }
        conns.len()
    }

    /// Connections accepted since the proxy started.
    pub fn connections_accepted(&self) -> u64 {
        self.shared.accepted.load(Ordering::Relaxed)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.acceptor.abort();
        let map = std::mem::take(&mut *self.shared.conns.lock().unwrap_or_else(|e| e.into_inner()));
        for (_, conn) in map {
            conn.task.abort();
        }
    }
}

#[cfg(unix)]
fn raw_fd(stream: &TcpStream) -> i32 {
    use std::os::fd::AsRawFd;
    stream.as_raw_fd()
}

#[cfg(not(unix))]
fn raw_fd(_stream: &TcpStream) -> i32 {
    -1
}

/// `SO_LINGER {on, 0}`: closing the socket sends a reset instead of a FIN.
#[cfg(unix)]
fn set_zero_linger(fd: i32) {
    if fd < 0 {
        return;
    }
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a plain setsockopt on a descriptor owned by a live connection
    // task (aborted right after; the descriptor closes when it is dropped).
    unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

#[cfg(not(unix))]
fn set_zero_linger(_fd: i32) {}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let client = match listener.accept().await {
            Ok((client, _)) => client,
            Err(e) => {
                tracing::debug!(error = %e, "fault proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        shared.accepted.fetch_add(1, Ordering::Relaxed);
        let shared2 = shared.clone();
        tokio::spawn(async move {
            let server = match TcpStream::connect(shared2.upstream).await {
                Ok(s) => s,
                Err(e) => {
                    // Upstream down: the client sees its connection reset.
                    tracing::debug!(error = %e, "fault proxy: upstream refused");
                    set_zero_linger(raw_fd(&client));
                    return;
                }
            };
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let id = shared2.next_id.fetch_add(1, Ordering::Relaxed);
            let fds = [raw_fd(&client), raw_fd(&server)];
            let shared3 = shared2.clone();
            // Register before running so that `reset` always sees it; the task
            // waits for the registration (it may only remove itself after it).
            let (registered_tx, registered_rx) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(async move {
                let _ = registered_rx.await;
                // Borrowed halves: an aborted task drops the sockets without
                // the FIN that dropping an owned write half sends, so the
                // zero linger set by `reset` turns the close into a reset.
                let (mut client, mut server) = (client, server);
                let (cr, cw) = client.split();
                let (sr, sw) = server.split();
                tokio::join!(pipe(cr, sw, shared3.clone()), pipe(sr, cw, shared3.clone()));
                shared3
                    .conns
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&id);
            });
            shared2
                .conns
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(id, Conn { task, fds });
            let _ = registered_tx.send(());
        });
    }
}

/// One direction of a connection: a reader that timestamps chunks and a
/// writer that delivers each chunk at its time, unless blackholed.
async fn pipe(
    mut from: impl AsyncRead + Unpin,
    mut to: impl AsyncWrite + Unpin,
    shared: Arc<Shared>,
) {
    // `None` = end of stream (forward the FIN after the data).
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Option<Vec<u8>>)>();
    let reader = {
        let shared = shared.clone();
        async move {
            let mut buf = vec![0u8; CHUNK];
            loop {
                let n = from.read(&mut buf).await.unwrap_or(0);
                let latency = Duration::from_micros(shared.latency_us.load(Ordering::Relaxed));
                let due = Instant::now() + latency;
                if n == 0 {
                    let _ = tx.send((due, None));
                    return;
                }
                if tx.send((due, Some(buf[..n].to_vec()))).is_err() {
                    return;
                }
            }
        }
    };
    let writer = async move {
        let mut blackholed = shared.blackholed.subscribe();
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            // Hold everything while the link is blackholed.
            if blackholed.wait_for(|b| !*b).await.is_err() {
                return;
            }
            match chunk {
                Some(bytes) => {
                    if to.write_all(&bytes).await.is_err() {
                        return;
                    }
                }
                None => {
                    let _ = to.shutdown().await;
                    return;
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests;
