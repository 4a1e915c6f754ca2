//! The read-only HTTP status endpoint, an actor in the worker's tree.
//!
//! One mechanism per snapshot, none of them a poll: the worker's status is collected
//! on demand, when a request needs it (`/status`, `/healthz`, `/readyz`, `/metrics`):
//! one collection at a time, answers within [`FRESH_FOR`] of each other share one, and
//! a request waits at most [`COLLECT_TIMEOUT_MS`] before it is served the last snapshot
//! (with its age deciding liveness). Nobody reading means nothing is asked. The fleet
//! view is pushed by the lease keeper after every round; asking for it makes the
//! keeper's next round read the peers' whole heartbeat rows (their lags), so a watched
//! view is at most a round old. The charts' history is the one exception: a sampler
//! takes one snapshot every `status_history::STEP` (and reads the fleet view the keeper
//! last pushed) into bounded rings, so the last 10 minutes are there when someone
//! looks.
//!
//! * `GET /status` — this worker (JSON, or the page when the client asks for HTML);
//!   `GET /status.html` — the page: its supervision tree and each shard's last 10
//!   minutes (`status_page`); `GET /status/tree` — the tree's nodes (JSON, what
//!   `flotilla status` prints); `GET /status/history`, `GET /fleet/history` — the
//!   charts' points per shard and per worker (JSON).
//! * `GET /fleet` — every worker and lease, from the last lease-table scan, and the
//!   recommended worker count of the keeper's last round (JSON, or the page when the
//!   client asks for HTML); `GET /fleet.html` — the page.
//! * `GET /healthz` — liveness: the supervisor runs and answers.
//! * `GET /readyz` — readiness: the lease table and the stream answer, leases are
//!   served, no held shard is stalled.
//! * `GET /metrics` — the numbers the MetricsReporter sends to CloudWatch and their
//!   timings' histograms, in the OpenMetrics text format (`prometheus`).
//!
//! Nothing here shows credentials or endpoints: the snapshots hold none.
//!
//! Optional: this module (with `prometheus` and axum) is the `status-server` cargo
//! feature. Without it the supervisor starts no endpoint (its slot's message type is
//! `Infallible`), and `Settings::check_built` refuses `status.enabled = true`, naming
//! the key and the fix; the snapshots and `Worker::status` are in every build. The
//! worker's start binds `status.bind` before the stream or the table is touched and
//! hands the listener to the first server, so a taken port stops the start
//! (`WorkerError::StatusBind`). Once running, the server restarts alone (binding the same
//! address again, beside the core actors, not with them), and the worker runs on
//! without it if that fails.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef, ActorStatus};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tracing::{debug, info};

use crate::boards::FleetBoard;
use crate::protocol::SupervisorMsg;
use crate::settings::Settings;
use crate::status::WorkerStatus;
use crate::status_history::{History, STEP, Series, shard_samples, worker_samples};

/// A snapshot this recent is served as it is: requests arriving together share one
/// collection.
const FRESH_FOR: Duration = Duration::from_secs(1);
/// How long collecting may take before the last snapshot is served instead.
const COLLECT_TIMEOUT_MS: u64 = 5_000;
/// A snapshot older than this means the supervisor has stopped answering: not alive.
const STALE_AFTER: Duration = Duration::from_secs(15);

const FLEET_PAGE: &str = include_str!("fleet.html");

/// The server takes no messages: its requests are served by the HTTP task, and it
/// stops with its parent.
pub(crate) enum StatusMsg {}

pub(crate) struct StatusServer;

pub(crate) struct StatusArgs {
    pub bind: SocketAddr,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub fleet: FleetBoard,
    pub settings: Arc<Settings>,
    /// Where the server really listens (port 0 picks one), for `Worker::status_addr`.
    pub bound: Arc<OnceLock<SocketAddr>>,
    /// Already bound (by `WorkerBuilder::start`, the first time); otherwise `bind` is bound here.
    pub listener: Option<tokio::net::TcpListener>,
}

pub(crate) struct StatusState {
    server: JoinHandle<()>,
    sampler: JoinHandle<()>,
}

/// The charts' rings: per shard of this worker, per worker of the fleet.
#[derive(Default)]
struct Histories {
    shards: History,
    workers: History,
}

/// A worker status and when it was collected.
type Snapshot = Arc<(WorkerStatus, Instant)>;

/// Collects the worker's status from the supervisor when a request needs it.
#[derive(Clone)]
struct Collector {
    supervisor: ActorRef<SupervisorMsg>,
    last: Arc<std::sync::Mutex<Option<Snapshot>>>,
    /// Held while a collection is out: requests behind it reuse its answer.
    collecting: Arc<tokio::sync::Mutex<()>>,
}

impl Collector {
    fn last(&self) -> Option<Snapshot> {
        self.last.lock().ok().and_then(|last| last.clone())
    }

    fn fresh(&self) -> Option<Snapshot> {
        self.last().filter(|s| s.1.elapsed() < FRESH_FOR)
    }

    /// A snapshot at most [`FRESH_FOR`] old, or, if the supervisor does not answer in
    /// time, the last one there is.
    async fn snapshot(&self) -> Option<Snapshot> {
        if let Some(fresh) = self.fresh() {
            return Some(fresh);
        }
        let _one_at_a_time = self.collecting.lock().await;
        if let Some(fresh) = self.fresh() {
            return Some(fresh);
        }
        match ractor::call_t!(self.supervisor, SupervisorMsg::Status, COLLECT_TIMEOUT_MS) {
            Ok(status) => {
                let snapshot = Arc::new((status, Instant::now()));
                if let Ok(mut last) = self.last.lock() {
                    *last = Some(snapshot.clone());
                }
                Some(snapshot)
            }
            Err(error) => {
                debug!(message = "Status not collected.", %error);
                self.last()
            }
        }
    }
}

/// What the handlers read.
#[derive(Clone)]
struct Shared {
    worker: Collector,
    fleet: watch::Receiver<Option<Arc<(crate::status::FleetView, Instant)>>>,
    /// Told when `/fleet` is asked, so the keeper's next round reads peers' whole rows.
    fleet_board: FleetBoard,
    supervisor: ActorCell,
    settings: Arc<Settings>,
    history: Arc<std::sync::Mutex<Histories>>,
}

impl Actor for StatusServer {
    type Msg = StatusMsg;
    type State = StatusState;
    type Arguments = StatusArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: StatusArgs,
    ) -> Result<StatusState, ActorProcessingErr> {
        let listener = match args.listener {
            Some(listener) => listener,
            // A restart: the worker runs on if this fails (the supervisor logs it).
            None => tokio::net::TcpListener::bind(args.bind)
                .await
                .map_err(|e| {
                    format!(
                        "status.bind = {}: cannot listen: {e}; set status.bind to a free \
                         address (port 0 picks one) or status.enabled = false",
                        args.bind
                    )
                })?,
        };
        let local = listener
            .local_addr()
            .map_err(|e| format!("status endpoint: no local address: {e}"))?;
        let _ = args.bound.set(local);
        let shared = Shared {
            worker: Collector {
                supervisor: args.supervisor.clone(),
                last: Arc::new(std::sync::Mutex::new(None)),
                collecting: Arc::new(tokio::sync::Mutex::new(())),
            },
            fleet: args.fleet.subscribe(),
            fleet_board: args.fleet.clone(),
            supervisor: args.supervisor.get_cell(),
            settings: args.settings.clone(),
            history: Arc::default(),
        };
        let sampler = tokio::spawn(sample(shared.clone()));
        let app = router(shared);
        let server = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::error!(message = "Status endpoint stopped.", %error);
            }
        });
        info!(message = "Status endpoint listening.", url = %format!("http://{local}/status"));
        Ok(StatusState { server, sampler })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: StatusMsg,
        _state: &mut StatusState,
    ) -> Result<(), ActorProcessingErr> {
        match message {}
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut StatusState,
    ) -> Result<(), ActorProcessingErr> {
        state.server.abort();
        state.sampler.abort();
        Ok(())
    }
}

fn router(shared: Shared) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/status.html", get(status_page))
        .route("/status/tree", get(status_tree))
        .route("/status/history", get(status_history))
        .route("/fleet", get(fleet))
        .route("/fleet/history", get(fleet_history))
        .route("/fleet.html", get(fleet_page))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .with_state(shared)
}

fn unavailable(why: &str) -> Response {
    (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response()
}

/// The client asked for a page (a browser's `Accept`), not the JSON that curl and
/// `flotilla status` get by default.
fn wants_html(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"))
}

async fn status(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    if wants_html(&headers) {
        return status_page(State(shared)).await;
    }
    let snapshot = shared.worker.snapshot().await;
    match snapshot {
        Some(snapshot) => axum::Json(&snapshot.0).into_response(),
        None => unavailable("no status collected yet"),
    }
}

async fn status_page(State(shared): State<Shared>) -> Response {
    let Some(snapshot) = shared.worker.snapshot().await else {
        return unavailable("no status collected yet");
    };
    let charts = shared.charts(|h| &h.shards);
    Html(crate::status_page::render(&snapshot.0, &charts)).into_response()
}

async fn status_tree(State(shared): State<Shared>) -> Response {
    match shared.worker.snapshot().await {
        Some(snapshot) => axum::Json(crate::status_tree::tree(&snapshot.0)).into_response(),
        None => unavailable("no status collected yet"),
    }
}

impl Shared {
    /// One of the charts' histories, each series' window.
    fn charts(&self, which: fn(&Histories) -> &History) -> Vec<Series> {
        self.history
            .lock()
            .map(|h| which(&h).series())
            .unwrap_or_default()
    }
}

/// The charts' points as JSON: the step, and each series oldest first (`null` a gap).
fn history_json(series: Vec<Series>) -> Response {
    axum::Json(serde_json::json!({
        "step_ms": STEP.as_millis() as u64,
        "series": series,
    }))
    .into_response()
}

async fn status_history(State(shared): State<Shared>) -> Response {
    history_json(shared.charts(|h| &h.shards))
}

async fn fleet_history(State(shared): State<Shared>) -> Response {
    history_json(shared.charts(|h| &h.workers))
}

/// One sample per [`STEP`] into the charts' rings: this worker's shards from a status
/// snapshot (a request's, when one was collected within the last second), the fleet's
/// workers from the view the keeper last pushed. A snapshot older than a step or a view
/// older than three (the supervisor did not answer, no scan lately) is not recorded: the
/// step is a gap on the charts, as it is while the process is paused. It ends with the
/// supervisor, also when the server is stopped without its `post_stop`.
async fn sample(shared: Shared) {
    let started = Instant::now();
    let mut tick = tokio::time::interval(STEP);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tick.tick().await;
        if matches!(
            shared.supervisor.get_status(),
            ActorStatus::Stopping | ActorStatus::Stopped
        ) {
            return;
        }
        let snapshot = shared
            .worker
            .snapshot()
            .await
            .filter(|s| s.1.elapsed() < STEP);
        let fleet = shared
            .fleet
            .borrow()
            .clone()
            .filter(|v| v.1.elapsed() < STEP * 3);
        let at = started.elapsed();
        if let Ok(mut history) = shared.history.lock() {
            if let Some(snapshot) = snapshot {
                history.shards.record(at, shard_samples(&snapshot.0));
            }
            if let Some(view) = fleet {
                history.workers.record(at, worker_samples(&view.0));
            }
        }
    }
}

async fn fleet(State(shared): State<Shared>, headers: HeaderMap) -> Response {
    if wants_html(&headers) {
        return Html(FLEET_PAGE).into_response();
    }
    let beat = shared.settings.lease.heartbeat_interval;
    if !shared.fleet_board.want(beat * 2) {
        // Nobody watched lately: the peers' lags are as old as the last scan. Wait for
        // the round this ask makes read them whole (bounded: a stuck keeper's view is
        // served as it is, with its age).
        let mut next = shared.fleet.clone();
        next.borrow_and_update();
        let _ = tokio::time::timeout(beat + Duration::from_secs(1), next.changed()).await;
    }
    let view = shared.fleet.borrow().clone();
    match view {
        Some(view) => {
            let mut fleet = view.0.clone();
            fleet.scanned_ms_ago = view.1.elapsed().as_millis() as u64;
            // What only this worker's readers know of its shards: their stalls, and
            // what the failure policy discarded.
            if let Some(snapshot) = shared.worker.snapshot().await {
                crate::status::overlay_own_shards(&mut fleet, &snapshot.0);
            }
            // The keeper's last recommended worker count, as its round judged it.
            let scaling = shared.fleet_board.scaling();
            crate::status::overlay_scaling(&mut fleet, scaling, Instant::now());
            axum::Json(fleet).into_response()
        }
        None => unavailable("no lease-table scan yet"),
    }
}

async fn fleet_page() -> Html<&'static str> {
    Html(FLEET_PAGE)
}

/// Alive while the supervisor runs and has answered lately.
async fn healthz(State(shared): State<Shared>) -> Response {
    if shared.supervisor.get_status() != ActorStatus::Running {
        return unavailable("the supervisor is not running");
    }
    let fresh = shared
        .worker
        .snapshot()
        .await
        .is_some_and(|s| s.1.elapsed() < STALE_AFTER);
    if !fresh {
        return unavailable("the supervisor has not answered a status request lately");
    }
    (StatusCode::OK, "ok\n").into_response()
}

/// Ready while the heartbeat is being written and the table has been scanned (the lease
/// table answers, leases are dealt), the last shard listing succeeded (the stream
/// answers), no held shard is stalled, and the worker is not stopping.
async fn readyz(State(shared): State<Shared>) -> Response {
    let snapshot = shared.worker.snapshot().await;
    let Some(snapshot) = snapshot else {
        return unavailable("not ready: no status collected yet");
    };
    let status = &snapshot.0;
    let lease = &shared.settings.lease;
    let mut problems = Vec::new();
    if status.state != "running" {
        problems.push(format!("the worker is {}", status.state));
    }
    let why = |keeper: Option<&crate::KeeperStatus>| match keeper
        .and_then(|k| k.heartbeat_error.as_ref())
    {
        Some(error) => format!(
            "{} failed in a row, last error: {error}",
            keeper.map_or(0, |k| k.heartbeat_failures)
        ),
        None => "no answer yet".to_owned(),
    };
    let keeper = status.leases.as_ref();
    match keeper.and_then(|k| k.heartbeat_age_ms) {
        Some(age) if u128::from(age) < lease.fence_time().as_millis() => {}
        Some(age) => problems.push(format!(
            "the heartbeat was last confirmed {age} ms ago ({}): every shard is fenced",
            why(keeper)
        )),
        None => problems.push(format!("no heartbeat confirmed yet ({})", why(keeper))),
    }
    if shared.fleet.borrow().is_none() {
        problems.push("the lease table has not been scanned yet".to_owned());
    }
    match &status.stream_watcher {
        Some(w) if w.last_error.is_none() && w.shards > 0 => {}
        Some(w) => problems.push(match &w.last_error {
            Some(error) => format!("listing the stream failed: {error}"),
            None => "the stream has not been listed yet".to_owned(),
        }),
        None => problems.push("the stream watcher did not answer".to_owned()),
    }
    for shard in &status.shards {
        if shard.state == crate::status::ShardState::Stalled {
            problems.push(format!(
                "shard {} is stalled: {}",
                crate::status_tree::shard_label(shard),
                shard.stall.as_deref().unwrap_or("no reason given")
            ));
        }
    }
    if problems.is_empty() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        unavailable(&format!("not ready: {}", problems.join("; ")))
    }
}

/// The OpenMetrics text of the worker's snapshot (`prometheus`).
async fn metrics(State(shared): State<Shared>) -> Response {
    let snapshot = shared.worker.snapshot().await;
    let Some(snapshot) = snapshot else {
        return unavailable("no status collected yet");
    };
    match crate::prometheus::Scrape::of(&snapshot.0).text() {
        Ok(text) => (
            [(header::CONTENT_TYPE, crate::prometheus::CONTENT_TYPE)],
            text,
        )
            .into_response(),
        Err(error) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("metrics not encoded: {error}\n"),
        )
            .into_response(),
    }
}
