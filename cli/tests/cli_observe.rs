//! Observing leases from the command line against a real `mongod`, in
//! several processes: `mongo-lease watch` following a key that other
//! processes (and managers in the test) acquire, release, abandon and take
//! over, in text and JSON; `--http` of `exec` and `leader` (`/healthz`,
//! `/metrics`, `/leader`) and its bad addresses. Verdicts wait for printed
//! lines and answers, never for a time to pass.

mod common;

#[path = "cli_observe/http.rs"]
mod http;
#[path = "cli_observe/watch.rs"]
mod watch;
