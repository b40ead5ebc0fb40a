//! `--http ADDR` of `exec` and `leader`: `/healthz` (a liveness probe, as
//! Kubernetes' leader election's healthz adaptor: it fails once renewals
//! are overdue), `/metrics` (Prometheus text format, from
//! `metrics-exporter-prometheus`, of the series the library records) and,
//! for `leader`, `/leader`. The server lives as long as the command.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use mongo_lease::{LeaderContext, LeaderInfo, Lease, LeaseKey, LeaseManager};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::Failure;
use crate::output::{key_json, time};

/// How often the exporter's histograms are trimmed (its upkeep, which
/// `install_recorder` leaves to the caller).
const UPKEEP_INTERVAL: Duration = Duration::from_secs(5);

/// How long a stop waits for open requests before dropping them.
const STOP_WAIT: Duration = Duration::from_secs(1);

/// A held lease or leadership, as `/healthz` reads it.
pub trait Held: Send + Sync {
    /// Lost (its token fired, or its local deadline passed).
    fn is_lost(&self) -> bool;
}

impl Held for Lease {
    fn is_lost(&self) -> bool {
        self.status().is_lost()
    }
}

impl Held for LeaderContext {
    fn is_lost(&self) -> bool {
        self.status().is_lost()
    }
}

/// Where the command is, for `/healthz`.
pub enum Phase {
    /// `exec` waits for its lease: 503.
    Waiting,
    /// `leader` campaigns (a follower): 200.
    Campaigning,
    /// The lease or leadership is held: 200 until it is lost.
    Holding(Arc<dyn Held>),
    /// The command has ended: 503.
    Ended,
}

/// What the command tells the HTTP server; does nothing without `--http`.
#[derive(Clone, Default)]
pub struct Status(Option<Arc<Mutex<Phase>>>);

impl Status {
    pub fn set(&self, phase: Phase) {
        if let Some(shared) = &self.0 {
            *shared.lock().unwrap_or_else(|e| e.into_inner()) = phase;
        }
    }
}

/// The listening socket and the installed metrics recorder, before the
/// manager exists (bound first, so that a bad address fails at once).
pub struct Http(Option<(TcpListener, PrometheusHandle)>);

impl Http {
    /// Listens on `addr` and installs the Prometheus recorder (before the
    /// manager records anything); nothing without `--http`.
    pub async fn bind(addr: Option<&str>) -> Result<Http, Failure> {
        let Some(addr) = addr else {
            return Ok(Http(None));
        };
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Failure::usage(format!("--http {addr}: cannot listen: {e}")))?;
        let metrics = PrometheusBuilder::new()
            .install_recorder()
            .map_err(|e| Failure::usage(format!("--http: cannot record metrics: {e}")))?;
        Ok(Http(Some((listener, metrics))))
    }

    /// Starts serving; `election` adds `/leader`. Prints the bound address.
    pub fn serve(self, manager: &LeaseManager, election: Option<LeaseKey>, phase: Phase) -> Server {
        let Some((listener, metrics)) = self.0 else {
            return Server {
                status: Status::default(),
                stop: CancellationToken::new(),
                task: None,
            };
        };
        let status = Status(Some(Arc::new(Mutex::new(phase))));
        let state = AppState {
            manager: manager.clone(),
            metrics: metrics.clone(),
            status: status.clone(),
            election: election.clone(),
        };
        let mut router = Router::new()
            .route("/healthz", get(healthz))
            .route("/metrics", get(render_metrics));
        if election.is_some() {
            router = router.route("/leader", get(leader));
        }
        let router = router.with_state(state);
        match listener.local_addr() {
            Ok(addr) => eprintln!("mongo-lease: http listening on {addr}"),
            Err(e) => tracing::warn!(error = %e, "the http address is unknown"),
        }
        let stop = CancellationToken::new();
        let serve =
            axum::serve(listener, router).with_graceful_shutdown(stop.clone().cancelled_owned());
        let task = tokio::spawn(async move {
            let upkeep = async {
                loop {
                    tokio::time::sleep(UPKEEP_INTERVAL).await;
                    metrics.run_upkeep();
                }
            };
            tokio::select! {
                served = serve => if let Err(e) = served {
                    tracing::warn!(error = %e, "the http server stopped");
                },
                () = upkeep => {}
            }
        });
        Server {
            status,
            stop,
            task: Some(task),
        }
    }
}

/// The running server (or nothing without `--http`); stopped by
/// [`Server::stop`] or when dropped.
pub struct Server {
    status: Status,
    stop: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl Server {
    /// The handle the command updates.
    pub fn status(&self) -> &Status {
        &self.status
    }

    /// Stops accepting, lets open requests finish (briefly), and stops.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            let abort = task.abort_handle();
            if tokio::time::timeout(STOP_WAIT, task).await.is_err() {
                abort.abort();
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[derive(Clone)]
struct AppState {
    manager: LeaseManager,
    metrics: PrometheusHandle,
    status: Status,
    election: Option<LeaseKey>,
}

/// 200 while the lease is held (or `leader` campaigns) and the manager's
/// renewals are on time; 503 otherwise. The body says why, as JSON.
async fn healthz(State(state): State<AppState>) -> Response {
    let health = state.manager.health();
    let (phase, phase_ok) = match &state.status.0 {
        None => ("ended", false),
        Some(shared) => match &*shared.lock().unwrap_or_else(|e| e.into_inner()) {
            Phase::Waiting => ("waiting for the lease", false),
            Phase::Campaigning => ("campaigning (a follower)", true),
            Phase::Holding(held) if held.is_lost() => ("the lease was lost", false),
            Phase::Holding(_) => ("holding the lease", true),
            Phase::Ended => ("the command has ended", false),
        },
    };
    let healthy = phase_ok && health.is_healthy();
    let state = if phase_ok && !health.is_healthy() {
        "renewals are late"
    } else {
        phase
    };
    let body = json!({
        "healthy": healthy,
        "state": state,
        "held_leases": health.held_leases,
        "renewals_on_time": health.renewals_on_time,
        "oldest_renewal_age_ms": health.oldest_renewal_age.map(|d| d.as_millis() as u64),
    });
    let code = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, axum::Json(body)).into_response()
}

async fn render_metrics(State(state): State<AppState>) -> Response {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        state.metrics.render(),
    )
        .into_response()
}

/// The current leader as JSON (`null` if none), read from MongoDB; 503 if
/// the read fails.
async fn leader(State(state): State<AppState>) -> Response {
    let Some(name) = state.election else {
        return StatusCode::NOT_FOUND.into_response();
    };
    match state.manager.inspect(name.clone()).await {
        Ok(info) => {
            let leader = info.as_ref().and_then(|info| {
                LeaderInfo::from_info(info).map(|leader| {
                    json!({
                        "name": key_json(&name),
                        "owner_id": leader.owner_id,
                        "term": leader.term,
                        "since": time(leader.since),
                        "transitions": leader.transitions,
                        "expires_at": (!crate::output::expiry_unknown(info))
                            .then(|| time(info.expires_at)),
                        "payload": leader.payload.map(|p| {
                            mongodb::bson::Bson::Document(p).into_relaxed_extjson()
                        }),
                        "server_time": time(info.server_time),
                    })
                })
            });
            axum::Json(leader.unwrap_or(Value::Null)).into_response()
        }
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({ "error": e.to_string() })),
        )
            .into_response(),
    }
}
