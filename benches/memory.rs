//! Memory: process RSS per held lease, while the heartbeat renews them all.
//!
//! ```text
//! cargo bench --bench memory                          # 10 000 and 100 000 leases, throwaway 1-member replica set
//! MEMORY_LEASES=20000 cargo bench --bench memory      # other sizes (comma-separated)
//! MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' cargo bench --bench memory
//! ```
//!
//! Each size runs in a fresh process (this binary again, with
//! `MEMORY_CHILD=lease:N` or `raw:N`), so that the allocator's state of one
//! size does not leak into the next. In that process:
//!
//! * **mongo-lease**: connect a manager (a short heartbeat, so renewal
//!   batches run during the measurement), acquire and release 64 keys once
//!   (the connection pool and the actor's first allocations), read RSS,
//!   acquire N leases on distinct keys (64 acquires in flight, through the
//!   public API), keep the `Lease`s in a `Vec`, read RSS (*acquired*), wait
//!   until the heartbeat has renewed every lease twice (read on the server:
//!   every lock document's `ts` later than a moment, twice), read RSS
//!   (*renewed*), and again every 40th of a heartbeat over the next two
//!   heartbeats (*most*: the highest of these; a reading taken while a
//!   renewal is in flight holds its batches and their encodings, which the
//!   allocator may then keep), then shut down (which releases everything).
//! * **raw driver** (the baseline): the same client and warm-up, then N
//!   `insert_one` of a lock-shaped document (64 in flight), keeping each
//!   `_id` in a `Vec`, as a raw-driver lock user keeps the keys to delete.
//!
//! For each reading it prints `(RSS then − RSS before) / N` in bytes and, in
//! parentheses, the heap bytes allocated per lease (a counting global
//! allocator); then the worst reading's ratio to 1 KiB (the target: at most
//! 1 KiB per held lease at every reading, the manager's state and the
//! caller's `Lease` together). The difference between RSS and heap is the
//! allocator's overhead and the freed memory it keeps (glibc keeps freed
//! memory, e.g. of the transient renewal batches).

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use mongo_lease::{LeaseManager, LeaseManagerOptions};
use mongodb::Client;
use mongodb::bson::{Document, doc};
use mongodb::options::{CollectionOptions, WriteConcern};

#[path = "common/mongod.rs"]
mod mongod;

/// Acquires (or raw inserts) in flight at once.
const CONCURRENCY: usize = 64;
/// Readings per heartbeat over the two heartbeats after the second renewal.
const SAMPLES_PER_HEARTBEAT: u32 = 40;
/// The environment variable that makes this binary a measuring child.
const CHILD: &str = "MEMORY_CHILD";
/// The prefix of a child's result line on stdout.
const RESULT: &str = "MEMORY_RESULT";

/// Counts the bytes the process has allocated and not freed.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded to the system allocator unchanged.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// The process's resident set size, in bytes (`VmRSS` of `/proc/self/status`).
fn rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let kib: usize = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// Both readings of one moment: RSS and the heap bytes allocated.
#[derive(Clone, Copy)]
struct Reading {
    rss: usize,
    live: usize,
}

impl Reading {
    fn now() -> Reading {
        Reading {
            rss: rss(),
            live: LIVE.load(Ordering::Relaxed),
        }
    }
}

/// What one child measured: three readings, each as RSS and heap bytes per
/// lease (or document) over the reading before the acquisitions (or
/// inserts), and how long the child ran.
struct Measured {
    /// Right after the last acquisition.
    acquired: PerLease,
    /// After the heartbeat renewed every lease twice.
    renewed: PerLease,
    /// The highest of the readings over the next two heartbeats (RSS and
    /// heap each at its own highest reading).
    most: PerLease,
    seconds: f64,
}

/// One reading, per lease.
#[derive(Clone, Copy)]
struct PerLease {
    rss: f64,
    heap: f64,
}

impl PerLease {
    fn of(reading: &Reading, before: &Reading, n: usize) -> PerLease {
        let per = |a: usize, b: usize| (a as f64 - b as f64) / n as f64;
        PerLease {
            rss: per(reading.rss, before.rss),
            heap: per(reading.live, before.live),
        }
    }
}

/// Every reading of one child, as taken.
struct Readings {
    before: Reading,
    acquired: Reading,
    renewed: Reading,
    /// The readings over the next two heartbeats (for the raw driver, the
    /// one reading after its inserts).
    later: Vec<Reading>,
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    match std::env::var(CHILD) {
        Ok(spec) => runtime.block_on(child(&spec)),
        Err(_) => runtime.block_on(parent()),
    }
}

/// Runs each size's two measurements in fresh processes and prints them.
async fn parent() {
    let sizes: Vec<usize> = std::env::var("MEMORY_LEASES")
        .unwrap_or_else(|_| "10000,100000".into())
        .split(',')
        .map(|n| {
            n.trim()
                .parse()
                .expect("MEMORY_LEASES: comma-separated numbers")
        })
        .collect();
    let (_replica_set, uri) = mongod::mongod().await;
    println!(
        "memory: bytes of process RSS (heap) per held lease, one manager, {CONCURRENCY} acquires in flight, \
         each size in a fresh process: right after acquiring, after the heartbeat renewed every lease \
         twice, and the most over the next two heartbeats (read every {SAMPLES_PER_HEARTBEAT}th of one)"
    );
    for n in sizes {
        let raw = run_child(&uri, "raw", n).await;
        let lease = run_child(&uri, "lease", n).await;
        let worst = [lease.acquired, lease.renewed, lease.most]
            .iter()
            .map(|r| r.rss)
            .fold(f64::MIN, f64::max);
        println!(
            "  {n:>7} leases: mongo-lease acquired {:>5.0} B ({:>4.0}), renewed {:>5.0} B ({:>4.0}), \
             most {:>5.0} B ({:>4.0}): worst {:.2}x of 1 KiB ({:.0} s) | raw driver {:>4.0} B RSS/doc ({:>3.0})",
            lease.acquired.rss,
            lease.acquired.heap,
            lease.renewed.rss,
            lease.renewed.heap,
            lease.most.rss,
            lease.most.heap,
            worst / 1024.0,
            lease.seconds,
            raw.renewed.rss,
            raw.renewed.heap,
        );
    }
}

/// Runs this binary as a child measuring `mode` with `n` leases or documents.
async fn run_child(uri: &str, mode: &str, n: usize) -> Measured {
    let exe = std::env::current_exe().expect("current_exe");
    let output = tokio::process::Command::new(exe)
        .env(CHILD, format!("{mode}:{n}"))
        .env("MONGODB_URI", uri)
        .output()
        .await
        .expect("run the measuring child");
    eprint!("{}", String::from_utf8_lossy(&output.stderr));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{mode}:{n} failed: {stdout}");
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix(RESULT))
        .unwrap_or_else(|| panic!("{mode}:{n} printed no result: {stdout}"));
    let fields: Vec<f64> = line
        .split_whitespace()
        .map(|f| f.parse().expect("a number"))
        .collect();
    let per = |i: usize| PerLease {
        rss: fields[i],
        heap: fields[i + 1],
    };
    Measured {
        acquired: per(0),
        renewed: per(2),
        most: per(4),
        seconds: fields[6],
    }
}

/// One measurement in this (fresh) process; prints its result line.
async fn child(spec: &str) {
    let (mode, n) = spec.split_once(':').expect("MEMORY_CHILD=mode:n");
    let n: usize = n.parse().expect("MEMORY_CHILD=mode:n");
    let uri = std::env::var("MONGODB_URI").expect("MONGODB_URI for the child");
    let client = Client::with_uri_str(&uri).await.expect("client");
    let db = client.database(&format!(
        "bench_memory_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    ));
    let started = Instant::now();
    let readings = match mode {
        "lease" => leases(&db, n).await,
        "raw" => raw(&db, n).await,
        other => panic!("unknown mode {other}"),
    };
    let seconds = started.elapsed().as_secs_f64();
    db.drop().await.expect("drop the benchmark database");
    drop(db);
    if tokio::time::timeout(Duration::from_secs(10), client.shutdown())
        .await
        .is_err()
    {
        eprintln!("the client's shutdown took over 10 s");
    }
    let Readings {
        before,
        acquired,
        renewed,
        later,
    } = readings;
    let most = Reading {
        rss: later.iter().map(|r| r.rss).max().unwrap_or(renewed.rss),
        live: later.iter().map(|r| r.live).max().unwrap_or(renewed.live),
    };
    let mut line = String::from(RESULT);
    for reading in [acquired, renewed, most] {
        let per = PerLease::of(&reading, &before, n);
        line += &format!(" {} {}", per.rss, per.heap);
    }
    println!("{line} {seconds}");
}

/// The heartbeat for `n` leases: 2 s, longer when one tick's renewals take
/// longer (about 100 µs per lease on a loaded 2-core machine), so that they
/// are not abandoned by the renewal's bound (the heartbeat interval).
fn heartbeat(n: usize) -> Duration {
    let ms = std::env::var("MEMORY_HEARTBEAT_MS")
        .ok()
        .and_then(|ms| ms.parse().ok())
        .unwrap_or_else(|| (n as u64 / 7).max(2_000));
    Duration::from_millis(ms)
}

/// mongo-lease: the readings before and after acquiring `n` leases, after
/// the heartbeat renewed them twice, and over the next two heartbeats.
async fn leases(db: &mongodb::Database, n: usize) -> Readings {
    let heartbeat = heartbeat(n);
    let manager = LeaseManager::connect(
        LeaseManagerOptions::builder()
            .database(db.clone())
            .collection("memory.lock")
            .ttl(heartbeat * 6)
            .heartbeat_interval(heartbeat)
            .build(),
    )
    .await
    .expect("connect");
    let acquire_all = |prefix: &'static str, n: usize| {
        let manager = manager.clone();
        async move {
            let mut held = Vec::with_capacity(n);
            futures::stream::iter(0..n)
                .map(|i| {
                    let manager = manager.clone();
                    async move { manager.acquire(format!("{prefix}-{i:06}")).await }
                })
                .buffer_unordered(CONCURRENCY)
                .try_for_each(|lease| {
                    held.push(lease);
                    async { Ok(()) }
                })
                .await
                .expect("acquire");
            held
        }
    };
    for lease in acquire_all("warm", CONCURRENCY).await {
        let _ = lease.release().await.expect("release");
    }
    let before = Reading::now();
    let leases = acquire_all("key", n).await;
    let acquired = Reading::now();
    eprintln!(
        "lease:{n}: right after the acquisitions: {:.0} B RSS/lease, heap {:.0} B/lease",
        (acquired.rss as f64 - before.rss as f64) / n as f64,
        (acquired.live as f64 - before.live as f64) / n as f64,
    );
    let locks = db.collection::<Document>("memory.lock");
    for _ in 0..2 {
        renewed_since_now(&locks, heartbeat).await;
    }
    let renewed = Reading::now();
    // The same over the next two heartbeats, which renew every lease
    // again: the readings that fall on a renewal in flight hold its
    // batches and their encodings. Often enough that several readings
    // fall on each heartbeat's renewals (a batch takes tens of
    // milliseconds).
    let mut samples = Vec::new();
    for _ in 0..2 * SAMPLES_PER_HEARTBEAT {
        tokio::time::sleep(heartbeat / SAMPLES_PER_HEARTBEAT).await;
        samples.push(Reading::now());
    }
    let spread = |of: fn(&Reading) -> usize| {
        let mut per: Vec<f64> = std::iter::once(&renewed)
            .chain(&samples)
            .map(|r| (of(r) as f64 - of(&before) as f64) / n as f64)
            .collect();
        per.sort_by(f64::total_cmp);
        (per[0], per[per.len() / 2], per[per.len() - 1])
    };
    let ((rss_min, rss_median, rss_max), (heap_min, heap_median, heap_max)) =
        (spread(|r| r.rss), spread(|r| r.live));
    eprintln!(
        "lease:{n}: read every {SAMPLES_PER_HEARTBEAT}th of a heartbeat over the next two: \
         RSS/lease min {rss_min:.0} B, median {rss_median:.0} B, max {rss_max:.0} B; \
         heap/lease min {heap_min:.0} B, median {heap_median:.0} B, max {heap_max:.0} B"
    );
    assert!(
        leases.iter().all(|l| !l.status().is_lost()),
        "no lease lost"
    );
    manager.shutdown().await.expect("shutdown");
    assert!(leases.iter().all(|l| l.status().is_lost()));
    Readings {
        before,
        acquired,
        renewed,
        later: samples,
    }
}

/// Waits until every lock document of `locks` was renewed after now: its
/// `ts` (the server's `$$NOW` at the last renewal; the server runs on this
/// machine's clock) is later than the local clock's now. Read on the server
/// rather than from the driver's command events, whose copies of every
/// renewal command would add to the memory measured.
async fn renewed_since_now(locks: &mongodb::Collection<Document>, heartbeat: Duration) {
    let since = mongodb::bson::DateTime::now();
    let bound = Instant::now() + heartbeat * 20;
    loop {
        let stale = locks
            .count_documents(doc! { "lid": { "$exists": true }, "ts": { "$lte": since } })
            .await
            .expect("count");
        if stale == 0 {
            return;
        }
        assert!(
            Instant::now() < bound,
            "{stale} leases not renewed in 20 heartbeats"
        );
        tokio::time::sleep(heartbeat / 4).await;
    }
}

/// The raw driver: the readings before and after inserting `n` lock-shaped
/// documents (the one after stands for every reading).
async fn raw(db: &mongodb::Database, n: usize) -> Readings {
    let coll = db.collection_with_options::<Document>(
        "raw.lock",
        CollectionOptions::builder()
            .write_concern(WriteConcern::majority())
            .build(),
    );
    let insert_all = |prefix: &'static str, n: usize| {
        let coll = coll.clone();
        async move {
            let mut ids = Vec::with_capacity(n);
            futures::stream::iter(0..n)
                .map(|i| {
                    let coll = coll.clone();
                    async move {
                        let id = format!("{prefix}-{i:06}");
                        let now = mongodb::bson::DateTime::now();
                        coll.insert_one(doc! {
                            "_id": &id, "aid": "raw", "lid": uuid::Uuid::new_v4().to_string(),
                            "tok": 1_i64, "ts": now, "exp": now,
                        })
                        .await
                        .map(|_| id)
                    }
                })
                .buffer_unordered(CONCURRENCY)
                .try_for_each(|id| {
                    ids.push(id);
                    async { Ok(()) }
                })
                .await
                .expect("insert");
            ids
        }
    };
    let warm = insert_all("warm", CONCURRENCY).await;
    coll.delete_many(doc! { "_id": { "$in": &warm } })
        .await
        .expect("delete");
    let before = Reading::now();
    let ids = insert_all("key", n).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = Reading::now();
    coll.delete_many(doc! { "_id": { "$in": &ids } })
        .await
        .expect("delete");
    Readings {
        before,
        acquired: after,
        renewed: after,
        later: Vec::new(),
    }
}
