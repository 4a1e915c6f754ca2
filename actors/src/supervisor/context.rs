//! What a worker is built from, shared by all its actors: made once by `WorkerBuilder::start`,
//! handed to the supervisor, which passes its parts to the children it spawns. It
//! outlives core restarts.

use std::sync::{Arc, Mutex};

use crate::backend::clock::Clock;
use crate::backend::{LeaseTable, MetricsSink, StreamClient};
use crate::model::WorkerId;
use crate::processor::ProcessorSource;
use crate::settings::Settings;

/// Everything a worker is built from; shared by its actors.
pub(crate) struct WorkerContext {
    pub me: WorkerId,
    pub application: String,
    pub stream: String,
    pub streams: Arc<dyn StreamClient>,
    /// The streams read, each with where its new shards start; which one a lease is
    /// of; and the former ones. The stream watcher changes it.
    pub set: crate::boards::StreamSetBoard,
    /// Where a changing stream set comes from (`None`: it is fixed).
    pub set_source: Option<crate::stream_set::StreamSet>,
    /// A single stream's name and creation time, which its rows must name
    /// (`model::origin`); `None` for several streams, whose keys name theirs.
    pub origin: Option<crate::model::origin::StreamOrigin>,
    pub table: Arc<dyn LeaseTable>,
    /// `lease.java_compat`: `table` is this wrapper, which renews held leases; each
    /// core attaches its fencing board and telemetry to it.
    pub renewing: Option<Arc<crate::renewal::Renewing>>,
    pub metrics_sink: Arc<dyn MetricsSink>,
    pub settings: Arc<Settings>,
    pub processor: ProcessorSource,
    /// Where `[failure]` writes discarded records (`failure.destination`, opened once).
    pub dead_letters: Option<Arc<dyn crate::failure::DeadLetters>>,
    pub clock: Clock,
    /// Why the worker stopped on its own, for `Worker::wait`.
    pub fatal: Arc<Mutex<Option<String>>>,
    /// Per-shard lag, from the readers to the keeper's heartbeat.
    pub lags: crate::boards::LagBoard,
    /// The memory budget every reader of this worker takes its un-acked records from.
    pub budget: crate::model::WorkerBudget,
    /// The keeper's latest view of the fleet, for the status endpoint.
    pub fleet: crate::boards::FleetBoard,
    /// The watcher's last shard listing, for the keeper.
    pub listing: crate::boards::ListingBoard,
    /// Where the status endpoint listens, once it does.
    #[cfg_attr(not(feature = "status-server"), allow(dead_code))]
    pub status_addr: Arc<std::sync::OnceLock<std::net::SocketAddr>>,
    /// The status listener `WorkerBuilder::start` bound (so a taken port fails the start with
    /// a plain error); the first status server takes it, a restarted one binds again.
    #[cfg_attr(not(feature = "status-server"), allow(dead_code))]
    pub status_listener: Mutex<Option<tokio::net::TcpListener>>,
    /// Given to every processor (in its checkpointer) to ask for a graceful shutdown.
    pub handle: crate::handle::WorkerHandle,
    /// The worker's tracing span: its actors run in it, its shards' spans are under it.
    pub span: tracing::Span,
}
