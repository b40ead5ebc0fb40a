//! A hang guard for a whole test: a test that still holds its [`Fixture`]
//! (or [`Clients`]) [`TEST_HANG`] after making it fails the test run, with
//! its name, instead of hanging it.
//!
//! [`Fixture`]: super::Fixture
//! [`Clients`]: super::Clients

use std::io::Write;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::time::Duration;

/// How long one test may run: a hang guard only, over 10x what any test
/// that uses the fixture takes here (seconds, a minute for the slowest).
pub const TEST_HANG: Duration = Duration::from_secs(600);

/// Watches the test that made it; dropping it (the test ended, passed or
/// failed) ends the watch.
pub struct Watchdog(Sender<()>);

impl Default for Watchdog {
    /// Starts watching the current test (the thread's name is the test's).
    fn default() -> Self {
        let (done, watch) = mpsc::channel::<()>();
        let test = std::thread::current().name().unwrap_or("a test").to_owned();
        std::thread::spawn(move || {
            if let Err(RecvTimeoutError::Timeout) = watch.recv_timeout(TEST_HANG) {
                // Straight to stderr: the harness captures `eprintln!`
                // of a test's threads, and exiting would lose it.
                let _ = writeln!(
                    std::io::stderr(),
                    "{test}: still running after {TEST_HANG:?}, it hangs; failing the run"
                );
                std::process::exit(101);
            }
        });
        Watchdog(done)
    }
}
