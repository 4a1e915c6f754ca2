//! The root actor of a worker: spawns the core actors and one shard reader per held
//! lease, restarts what fails, routes lease gains and losses, and runs the graceful
//! shutdown.
//!
//! * A failed shard reader (or its processor) restarts from the last checkpoint after a
//!   jittered exponential backoff. Past `shard_max_restarts` within
//!   `shard_restart_window` its lease is released and the shard cooled down locally.
//! * A failed core actor restarts the whole core (they hold references to each other)
//!   and every shard reader; past `core_max_restarts` within `core_restart_window` the
//!   worker stops with an error.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ractor::{
    Actor, ActorCell, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent,
};
use tokio::time::Instant;
use tracing::{error, info, warn};

use crate::backend::clock::Clock;
use crate::backend::{LeaseTable, MetricsSink, StreamClient};
use crate::backoff::{Backoff, RestartIntensity, Verdict};
use crate::checkpoint_writer::{CheckpointWriter, WriterArgs};
use crate::fencing::Fencing;
use crate::lease_keeper::{KeeperArgs, LeaseKeeper};
use crate::metrics_reporter::{MetricsArgs, MetricsMsg, MetricsReporter};
use crate::model::{Fence, Lease, LeaseKey, WorkerId};
use crate::processor::ProcessorSource;
use crate::protocol::{CheckpointMsg, KeeperMsg, ReaderMsg, StopReason, SupervisorMsg, WatcherMsg};
use crate::settings::Settings;
use crate::shard_reader::{ReaderArgs, ShardReader};
use crate::spans::Spanned;
use crate::status::{
    CoreActorStatus, ReleaseReport, ShardShutdown, ShardState, ShardStatus, ShutdownReport,
    WorkerStatus,
};
#[cfg(feature = "status-server")]
use crate::status_server::{StatusArgs, StatusMsg, StatusServer};
/// Built without the `status-server` feature there is no endpoint, so nothing to send
/// one: the supervisor's slot for it stays empty.
#[cfg(not(feature = "status-server"))]
type StatusMsg = std::convert::Infallible;
use crate::stream_watcher::{StreamWatcher, WatcherArgs};
use crate::telemetry::{CoreActorFailed, Recovery, ShardEnded, ShardFailed, Telemetry};

/// How long a status request waits on each actor.
const STATUS_TIMEOUT_MS: u64 = 2_000;

/// Everything a worker is built from; shared by its actors.
pub(crate) struct WorkerContext {
    pub me: WorkerId,
    pub application: String,
    pub stream: String,
    pub streams: Arc<dyn StreamClient>,
    /// The streams read, each with where its new shards start; which one a lease is
    /// of; and the former ones. The stream watcher changes it.
    pub set: crate::status::StreamSetBoard,
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
    pub clock: Clock,
    /// Why the worker stopped on its own, for `Worker::wait`.
    pub fatal: Arc<Mutex<Option<String>>>,
    /// Records delivered to processors, all shards; the keeper reports the rate.
    pub delivered: Arc<std::sync::atomic::AtomicU64>,
    /// Per-shard lag, from the readers to the keeper's heartbeat.
    pub lags: crate::status::LagBoard,
    /// The memory budget every reader of this worker takes its un-acked records from.
    pub budget: crate::model::WorkerBudget,
    /// The keeper's latest view of the fleet, for the status endpoint.
    pub fleet: crate::status::FleetBoard,
    /// The watcher's last shard listing, for the keeper.
    pub listing: crate::status::ListingBoard,
    /// Where the status endpoint listens, once it does.
    #[cfg_attr(not(feature = "status-server"), allow(dead_code))]
    pub status_addr: Arc<std::sync::OnceLock<std::net::SocketAddr>>,
    /// The status listener `Worker::start` bound (so a taken port fails the start with
    /// a plain error); the first status server takes it, a restarted one binds again.
    #[cfg_attr(not(feature = "status-server"), allow(dead_code))]
    pub status_listener: Mutex<Option<tokio::net::TcpListener>>,
    /// Given to every processor (in its checkpointer) to ask for a graceful shutdown.
    pub handle: crate::handle::WorkerHandle,
    /// The worker's tracing span: its actors run in it, its shards' spans are under it.
    pub span: tracing::Span,
}

pub(crate) struct Supervisor;

/// Where a gracefully stopped lease goes.
enum Passing {
    /// To the worker that asked for it.
    To(WorkerId),
    /// Back to nobody: its stream left the set.
    Release,
}

/// How a shard reader ended, from its stop reason.
enum ReaderEnd {
    ShardEnd,
    LeaseLost,
    Shutdown,
    Failed(String),
}

struct Core {
    metrics: ActorRef<MetricsMsg>,
    keeper: ActorRef<KeeperMsg>,
    writer: ActorRef<CheckpointMsg>,
    watcher: ActorRef<WatcherMsg>,
}

impl Core {
    /// The metrics reporter as the actors emit to it.
    fn telemetry(&self) -> Telemetry {
        Telemetry::new(self.metrics.clone())
    }

    fn cells(&self) -> [(&'static str, ActorCell); 4] {
        [
            ("stream_watcher", self.watcher.get_cell()),
            ("lease_keeper", self.keeper.get_cell()),
            ("checkpoint_writer", self.writer.get_cell()),
            ("metrics_reporter", self.metrics.get_cell()),
        ]
    }
}

struct ShardEntry {
    lease: Lease,
    reader: Option<ActorRef<ReaderMsg>>,
    intensity: RestartIntensity,
    backoff: Backoff,
    restarts: u32,
    /// Why the reader last failed: the status shows it while the shard waits to
    /// restart (a shard that fails at once, as on a trimmed checkpoint, is mostly there),
    /// and when.
    last_failure: Option<(String, Instant)>,
    /// Being handed over to this worker: its end is the handoff task's to report.
    handing_off: Option<WorkerId>,
}

pub(crate) struct SupervisorState {
    ctx: Arc<WorkerContext>,
    core: Core,
    /// Self-fencing, shared by the keeper, the readers and the processor hosts; it
    /// outlives core restarts.
    fencing: Fencing,
    core_intensity: RestartIntensity,
    core_restarts: u32,
    shards: BTreeMap<LeaseKey, ShardEntry>,
    by_actor: BTreeMap<ActorId, LeaseKey>,
    shard_restarts: u64,
    shutting_down: bool,
    /// Set while the keeper drains; answered when the drain is done.
    shutdown_reply: Option<RpcReplyPort<ShutdownReport>>,
    started: Instant,
    /// The HTTP status endpoint, when enabled. Outside the core: it restarts alone.
    status_server: Option<ActorRef<StatusMsg>>,
}

impl Actor for Supervisor {
    type Msg = SupervisorMsg;
    type State = SupervisorState;
    type Arguments = Arc<WorkerContext>;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        ctx: Arc<WorkerContext>,
    ) -> Result<SupervisorState, ActorProcessingErr> {
        let fencing = Fencing::new(ctx.settings.lease.fence_time());
        if ctx.settings.lease.java_compat {
            fencing.lock().require_renewals();
        }
        let core = spawn_core(&myself, &ctx, &fencing).await?;
        let status_server = spawn_status_server(&myself, &ctx).await?;
        let supervision = &ctx.settings.supervision;
        Ok(SupervisorState {
            core_intensity: RestartIntensity::new(
                supervision.core_max_restarts,
                supervision.core_restart_window,
            ),
            ctx,
            core,
            fencing,
            core_restarts: 0,
            shards: BTreeMap::new(),
            by_actor: BTreeMap::new(),
            shard_restarts: 0,
            shutting_down: false,
            shutdown_reply: None,
            started: Instant::now(),
            status_server,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: SupervisorMsg,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            SupervisorMsg::LeaseGained(lease) => {
                let lease = *lease;
                if state.shutting_down || state.shutdown_reply.is_some() {
                    return Ok(());
                }
                let key = lease.key.clone();
                if let Some(old) = state.shards.remove(&key)
                    && let Some(reader) = old.reader
                {
                    // Taken again under a new epoch while the old reader was stopping.
                    state.by_actor.remove(&reader.get_id());
                    reader.kill();
                }
                let supervision = &state.ctx.settings.supervision;
                state.shards.insert(
                    key.clone(),
                    ShardEntry {
                        lease,
                        reader: None,
                        intensity: RestartIntensity::new(
                            supervision.shard_max_restarts,
                            supervision.shard_restart_window,
                        ),
                        backoff: Backoff::new(
                            supervision.restart_backoff_min,
                            supervision.restart_backoff_max,
                        ),
                        restarts: 0,
                        last_failure: None,
                        handing_off: None,
                    },
                );
                state.spawn_reader(&myself, &key).await;
            }
            SupervisorMsg::LeaseLost(key, fence) => {
                if state.shards.get(&key).map(|e| e.lease.fence()) != Some(fence.clone()) {
                    return Ok(());
                }
                if let Some(entry) = state.shards.remove(&key)
                    && let Some(reader) = entry.reader
                {
                    state.by_actor.remove(&reader.get_id());
                    let _ = reader.cast(ReaderMsg::LeaseLost);
                }
                let _ = state.core.keeper.cast(KeeperMsg::Lost(key.clone(), fence));
                let _ = state.core.writer.cast(CheckpointMsg::Forget(key));
            }
            SupervisorMsg::ShardFinished { key, children } => {
                state.core.telemetry().emit(ShardEnded {
                    key: &key,
                    children: children.as_deref(),
                });
                let _ = state.core.watcher.cast(WatcherMsg::ChildrenFound {
                    parent: key,
                    children,
                });
            }
            SupervisorMsg::RestartShard(key) => {
                if !state.shutting_down
                    && state.shards.get(&key).is_some_and(|e| e.reader.is_none())
                {
                    state.spawn_reader(&myself, &key).await;
                }
            }
            SupervisorMsg::HandOff { key, fence, to } => {
                state.hand_off(key, fence, Passing::To(to))
            }
            SupervisorMsg::Retire { key, fence } => state.hand_off(key, fence, Passing::Release),
            SupervisorMsg::ListShardsNow => {
                let _ = state.core.watcher.cast(WatcherMsg::ListNow);
            }
            SupervisorMsg::Status(reply) => {
                let status = state.status().await;
                let _ = reply.send(status);
            }
            SupervisorMsg::Shutdown(reply) => {
                if state.shutting_down || state.shutdown_reply.is_some() {
                    // A second request: answered by the first one's report only.
                    return Ok(());
                }
                // Drain first: readers keep going while peers ask for their leases, so a
                // planned stop costs each shard one handoff, not a failover.
                state.shutdown_reply = Some(reply);
                let _ = state.core.keeper.cast(KeeperMsg::Drain);
                myself.send_after(state.ctx.settings.drain_limit(), || {
                    SupervisorMsg::DrainDone
                });
            }
            SupervisorMsg::Fatal(reason) => {
                // Going on would process what must not be (another stream's positions,
                // a table that is gone): stop without passing anything on.
                error!(message = "The worker stops.", %reason);
                if let Ok(mut fatal) = state.ctx.fatal.lock() {
                    fatal.get_or_insert(reason.clone());
                }
                myself.stop(Some(reason));
            }
            SupervisorMsg::DrainDone => {
                let Some(reply) = state.shutdown_reply.take() else {
                    return Ok(());
                };
                state.shutting_down = true;
                let report = state.shutdown().await;
                let _ = reply.send(report);
                myself.stop(StopReason::Shutdown.text());
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut SupervisorState,
    ) -> Result<(), ActorProcessingErr> {
        if state.shutting_down {
            return Ok(());
        }
        let (cell, ended) = match event {
            SupervisionEvent::ActorFailed(cell, error) => {
                (cell, ReaderEnd::Failed(error.to_string()))
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                match StopReason::parse(reason.as_deref()) {
                    Some(StopReason::ShardEnd) => (cell, ReaderEnd::ShardEnd),
                    Some(StopReason::LeaseLost) => (cell, ReaderEnd::LeaseLost),
                    Some(StopReason::Shutdown) => (cell, ReaderEnd::Shutdown),
                    None => (
                        cell,
                        ReaderEnd::Failed(format!(
                            "stopped unexpectedly ({})",
                            reason.as_deref().unwrap_or("no reason given")
                        )),
                    ),
                }
            }
            _ => return Ok(()),
        };
        if let Some(key) = state.by_actor.remove(&cell.get_id()) {
            state.reader_ended(&myself, key, cell.get_id(), ended);
            return Ok(());
        }
        if state
            .status_server
            .as_ref()
            .is_some_and(|s| s.get_id() == cell.get_id())
        {
            // Read-only and stateless: start it again; the worker goes on either way.
            warn!(message = "Status endpoint stopped; starting it again.");
            state.status_server = None;
            match spawn_status_server(&myself, &state.ctx).await {
                Ok(server) => state.status_server = server,
                Err(error) => error!(message = "Status endpoint could not restart.", %error),
            }
            return Ok(());
        }
        let failure = match ended {
            ReaderEnd::Failed(why) => Some(why),
            _ => None,
        };
        let core_name = state
            .core
            .cells()
            .into_iter()
            .find(|(_, c)| c.get_id() == cell.get_id())
            .map(|(name, _)| name);
        if let Some(name) = core_name {
            let why = failure.unwrap_or_else(|| "stopped".to_owned());
            state.core_failed(&myself, name, why).await?;
        }
        Ok(())
    }
}

/// An actor's lifecycle state as ractor reports it: `running`, `stopping`, ….
fn actor_state(cell: &ActorCell) -> String {
    format!("{:?}", cell.get_status()).to_lowercase()
}

/// Built without the `status-server` feature: no endpoint. Settings refuse
/// `status.enabled = true` in such a build (`Settings::check_built`), so none was
/// asked for.
#[cfg(not(feature = "status-server"))]
async fn spawn_status_server(
    _myself: &ActorRef<SupervisorMsg>,
    _ctx: &Arc<WorkerContext>,
) -> Result<Option<ActorRef<StatusMsg>>, ActorProcessingErr> {
    Ok(None)
}

#[cfg(feature = "status-server")]
async fn spawn_status_server(
    myself: &ActorRef<SupervisorMsg>,
    ctx: &Arc<WorkerContext>,
) -> Result<Option<ActorRef<StatusMsg>>, ActorProcessingErr> {
    let status = &ctx.settings.status;
    if !status.enabled {
        return Ok(None);
    }
    let bind: std::net::SocketAddr = status
        .bind
        .parse()
        .map_err(|e| format!("status.bind = {:?}: {e}", status.bind))?;
    // Bound again after a restart: the port the first one got, so the URL stays.
    let bind = ctx.status_addr.get().copied().unwrap_or(bind);
    let (server, _) = Actor::spawn_linked(
        None,
        Spanned(StatusServer, ctx.span.clone()),
        StatusArgs {
            bind,
            supervisor: myself.clone(),
            fleet: ctx.fleet.clone(),
            settings: ctx.settings.clone(),
            bound: ctx.status_addr.clone(),
            listener: ctx
                .status_listener
                .lock()
                .ok()
                .and_then(|mut listener| listener.take()),
        },
        myself.get_cell(),
    )
    .await?;
    Ok(Some(server))
}

async fn spawn_core(
    myself: &ActorRef<SupervisorMsg>,
    ctx: &Arc<WorkerContext>,
    fencing: &Fencing,
) -> Result<Core, ActorProcessingErr> {
    let settings = &ctx.settings;
    // A worker of several streams stays one (its keys name their streams) however its
    // set changes; its datums name each shard's stream from the shard's key, so they
    // follow the live set.
    let multi = ctx.set.borrow().active.is_multi();
    let (metrics, _) = Actor::spawn_linked(
        None,
        Spanned(MetricsReporter, ctx.span.clone()),
        MetricsArgs {
            sink: ctx.metrics_sink.clone(),
            settings: settings.metrics.clone(),
            application: ctx.application.clone(),
            stream: (!multi).then(|| ctx.stream.clone()),
            worker_id: ctx.me.to_string(),
            clock: ctx.clock,
        },
        myself.get_cell(),
    )
    .await?;
    let telemetry = Telemetry::new(metrics.clone());
    if let Some(renewing) = &ctx.renewing {
        renewing.attach(fencing.clone(), telemetry.clone());
    }
    let rows: crate::status::RowsBoard = Arc::new(tokio::sync::watch::channel(None).0);
    let (keeper, _) = Actor::spawn_linked(
        None,
        Spanned(LeaseKeeper, ctx.span.clone()),
        KeeperArgs {
            table: ctx.table.clone(),
            me: ctx.me.clone(),
            settings: settings.clone(),
            supervisor: myself.clone(),
            telemetry: telemetry.clone(),
            fencing: fencing.clone(),
            delivered: ctx.delivered.clone(),
            lags: ctx.lags.clone(),
            fleet: ctx.fleet.clone(),
            listing: ctx.listing.clone(),
            rows: rows.clone(),
            set: ctx.set.clone(),
            application: ctx.application.clone(),
            stream: ctx.stream.clone(),
        },
        myself.get_cell(),
    )
    .await?;
    let (writer, _) = Actor::spawn_linked(
        None,
        Spanned(CheckpointWriter, ctx.span.clone()),
        WriterArgs {
            table: ctx.table.clone(),
            interval: settings.checkpoint.interval,
            supervisor: myself.clone(),
            telemetry: telemetry.clone(),
        },
        myself.get_cell(),
    )
    .await?;
    let (watcher, _) = Actor::spawn_linked(
        None,
        Spanned(StreamWatcher, ctx.span.clone()),
        WatcherArgs {
            streams: ctx.streams.clone(),
            table: ctx.table.clone(),
            set: ctx.set.clone(),
            source: ctx.set_source.clone(),
            consumer: match settings.reader.mode {
                crate::settings::ReadMode::Polling => None,
                crate::settings::ReadMode::Fanout => Some(
                    settings
                        .reader
                        .consumer_name_for(&ctx.application)
                        .to_owned(),
                ),
            },
            grace: settings.worker.former_stream_grace,
            interval: settings.reader.shard_sync_interval,
            keeper: keeper.clone(),
            supervisor: myself.clone(),
            origin: ctx.origin.clone(),
            listing: ctx.listing.clone(),
            rows,
            telemetry: telemetry.clone(),
        },
        myself.get_cell(),
    )
    .await?;
    Ok(Core {
        metrics,
        keeper,
        writer,
        watcher,
    })
}

impl SupervisorState {
    async fn spawn_reader(&mut self, myself: &ActorRef<SupervisorMsg>, key: &LeaseKey) {
        let Some(entry) = self.shards.get_mut(key) else {
            return;
        };
        // A lease is read from its own stream. The keeper deals only leases of listed
        // shards, so one of no stream read here is a bug or a race with the table: it is
        // given up (released) rather than read from the wrong stream.
        let stream = self.ctx.set.borrow().active.of_key(key).cloned();
        let Some(stream) = stream else {
            error!(message = "Lease is of no stream this worker reads; giving it up.", lease_key = %key);
            self.shards.remove(key);
            let _ = self.core.keeper.cast(KeeperMsg::GiveUp(key.clone()));
            return;
        };
        let args = ReaderArgs {
            lease: entry.lease.clone(),
            stream: stream.stream.clone(),
            stream_arn: stream.arn.clone(),
            streams: self.ctx.streams.clone(),
            table: self.ctx.table.clone(),
            settings: self.ctx.settings.clone(),
            initial_timestamp: stream.initial_timestamp,
            processor: self.ctx.processor.clone(),
            writer: self.core.writer.clone(),
            supervisor: myself.clone(),
            telemetry: self.core.telemetry(),
            fencing: self.fencing.clone(),
            restarts: entry.restarts,
            delivered: self.ctx.delivered.clone(),
            lags: self.ctx.lags.clone(),
            budget: self.ctx.budget.join(),
            worker: self.ctx.handle.clone(),
            // Its own stream's consumer: a consumer subscribes only to its stream's shards.
            consumer: stream.consumer.clone(),
        };
        let span = crate::spans::shard(
            &self.ctx.span,
            key,
            entry.lease.counter,
            &self.ctx.me,
            &stream.stream,
        );
        let reader = Spanned(ShardReader, span);
        match Actor::spawn_linked(None, reader, args, myself.get_cell()).await {
            Ok((reader, _)) => {
                self.by_actor.insert(reader.get_id(), key.clone());
                entry.reader = Some(reader);
            }
            Err(error) => {
                warn!(message = "Shard reader did not start.", lease_key = %key, %error);
                let delay = entry.backoff.next_random();
                myself.send_after(delay, {
                    let key = key.clone();
                    move || SupervisorMsg::RestartShard(key)
                });
            }
        }
    }

    fn reader_ended(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        key: LeaseKey,
        actor: ActorId,
        ended: ReaderEnd,
    ) {
        // Only the shard's current reader speaks for it: a reader of an earlier epoch
        // ending late must not remove the entry of the lease as taken again since.
        let current = self
            .shards
            .get(&key)
            .is_some_and(|e| e.reader.as_ref().map(|r| r.get_id()) == Some(actor));
        if !current {
            return;
        }
        if self
            .shards
            .get(&key)
            .is_some_and(|e| e.handing_off.is_some())
        {
            if let Some(entry) = self.shards.remove(&key) {
                let fence = entry.lease.fence();
                match ended {
                    ReaderEnd::ShardEnd => {
                        let _ = self.core.keeper.cast(KeeperMsg::Finished(key, fence));
                    }
                    ReaderEnd::LeaseLost => {
                        let _ = self.core.keeper.cast(KeeperMsg::Lost(key, fence));
                    }
                    // The handoff task reports the rest to the keeper.
                    ReaderEnd::Shutdown | ReaderEnd::Failed(_) => {}
                }
            }
            return;
        }
        let failure = match ended {
            ReaderEnd::Failed(why) => why,
            ReaderEnd::ShardEnd | ReaderEnd::LeaseLost | ReaderEnd::Shutdown => {
                if let Some(entry) = self.shards.remove(&key) {
                    let fence = entry.lease.fence();
                    let _ = self.core.keeper.cast(match ended {
                        ReaderEnd::ShardEnd => KeeperMsg::Finished(key, fence),
                        _ => KeeperMsg::Lost(key, fence),
                    });
                }
                return;
            }
        };
        let Some(entry) = self.shards.get_mut(&key) else {
            return;
        };
        entry.reader = None;
        entry.last_failure = Some((failure.clone(), Instant::now()));
        self.shard_restarts += 1;
        match entry.intensity.record(Instant::now().into_std()) {
            Verdict::Restart { attempt } => {
                if attempt == 1 {
                    entry.backoff.reset();
                }
                entry.restarts += 1;
                let delay = entry.backoff.next_random();
                self.core.telemetry().emit(ShardFailed {
                    key: &key,
                    error: &failure,
                    recovery: Recovery::Restart { attempt, delay },
                });
                myself.send_after(delay, move || SupervisorMsg::RestartShard(key));
            }
            Verdict::GiveUp { restarts_in_window } => {
                self.core.telemetry().emit(ShardFailed {
                    key: &key,
                    error: &failure,
                    recovery: Recovery::GiveUp { restarts_in_window },
                });
                self.shards.remove(&key);
                let _ = self.core.writer.cast(CheckpointMsg::Forget(key.clone()));
                let _ = self.core.keeper.cast(KeeperMsg::GiveUp(key));
            }
        }
    }

    /// Stops the shard's reader the way a shutdown does (the processor finishes its
    /// batch and may checkpoint), flushes, and asks the keeper to pass the lease on (or
    /// release it, for a former stream's lease). The waiting happens in a task, so the
    /// supervisor goes on serving meanwhile.
    fn hand_off(&mut self, key: LeaseKey, fence: Fence, passing: Passing) {
        let reader = match self.shards.get_mut(&key) {
            Some(entry) if entry.lease.fence() == fence && entry.handing_off.is_none() => {
                entry.handing_off = Some(match &passing {
                    Passing::To(to) => to.clone(),
                    Passing::Release => self.ctx.me.clone(),
                });
                entry.reader.clone()
            }
            Some(_) => return,
            None => None,
        };
        if reader.is_none() {
            // Between restarts: nothing to stop.
            self.shards.remove(&key);
        }
        let timeout = self.ctx.settings.supervision.shutdown_timeout;
        let timeout_ms = timeout.as_millis() as u64;
        let writer = self.core.writer.clone();
        let keeper = self.core.keeper.clone();
        tokio::spawn(async move {
            let mut outcome = ShardShutdown {
                shard_id: key.shard_id(),
                processor_ok: true,
                checkpoint_flushed: true,
                error: None,
            };
            if let Some(reader) = reader {
                outcome = match ractor::call_t!(reader, ReaderMsg::Shutdown, timeout_ms) {
                    Ok(outcome) => outcome,
                    Err(error) => ShardShutdown {
                        shard_id: key.shard_id(),
                        processor_ok: false,
                        checkpoint_flushed: false,
                        error: Some(format!("no answer from the shard reader: {error}")),
                    },
                };
                if reader.wait(Some(timeout)).await.is_err() {
                    reader.kill();
                }
            }
            let flushed = ractor::call_t!(
                writer,
                |reply| CheckpointMsg::Flush {
                    key: key.clone(),
                    reply
                },
                timeout_ms
            );
            if !matches!(flushed, Ok(Ok(()))) {
                outcome.checkpoint_flushed = false;
            }
            let _ = writer.cast(CheckpointMsg::Forget(key.clone()));
            let _ = keeper.cast(match passing {
                Passing::To(to) => KeeperMsg::Transfer {
                    key,
                    fence,
                    to,
                    outcome,
                },
                Passing::Release => KeeperMsg::Retired {
                    key,
                    fence,
                    outcome,
                },
            });
        });
    }

    /// Restarts the core (and with it every shard), or stops the worker past the
    /// restart intensity.
    async fn core_failed(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        name: &'static str,
        why: String,
    ) -> Result<(), ActorProcessingErr> {
        let verdict = self.core_intensity.record(Instant::now().into_std());
        self.core.telemetry().emit(CoreActorFailed {
            actor: name,
            error: &why,
            giving_up: matches!(verdict, Verdict::GiveUp { .. }),
        });
        if let Verdict::GiveUp { restarts_in_window } = verdict {
            let reason = format!(
                "the {name} failed {restarts_in_window} times within {}: {why}",
                humantime::format_duration(self.ctx.settings.supervision.core_restart_window)
            );
            if let Ok(mut fatal) = self.ctx.fatal.lock() {
                *fatal = Some(reason.clone());
            }
            myself.stop(Some(reason));
            return Ok(());
        }
        self.core_restarts += 1;
        // Readers hold references to the old core: stop them all, then start afresh.
        // The new lease keeper finds this worker's leases and takes them again.
        let readers: Vec<ActorRef<ReaderMsg>> = std::mem::take(&mut self.shards)
            .into_values()
            .filter_map(|e| e.reader)
            .collect();
        self.by_actor.clear();
        for reader in readers {
            let _ = reader.kill_and_wait(Some(Duration::from_secs(5))).await;
        }
        for (_, cell) in self.core.cells() {
            let _ = cell.kill_and_wait(Some(Duration::from_secs(5))).await;
        }
        self.core = spawn_core(myself, &self.ctx, &self.fencing).await?;
        Ok(())
    }

    async fn status(&self) -> WorkerStatus {
        let keys: Vec<&LeaseKey> = self.shards.keys().collect();
        // Readers answer concurrently: one slow reader costs one timeout, not one each.
        let asks = keys.into_iter().filter_map(|key| {
            let entry = self.shards.get(key)?;
            let fallback = ShardStatus {
                shard_id: key.shard_id(),
                stream: key.stream_name().map(str::to_owned),
                state: ShardState::Restarting,
                lease_counter: entry.lease.counter,
                checkpoint: None,
                last_delivered: None,
                millis_behind_latest: None,
                records_delivered: 0,
                bytes_delivered: 0,
                records_per_second: 0.0,
                bytes_per_second: 0.0,
                last_error: entry.last_failure.as_ref().map(|(error, _)| error.clone()),
                last_error_ms_ago: entry
                    .last_failure
                    .as_ref()
                    .map(|(_, at)| at.elapsed().as_millis() as u64),
                in_flight_records: 0,
                in_flight_bytes: 0,
                memory_bytes: 0,
                restarts: entry.restarts,
                fenced: None,
                stall: None,
                subscription: None,
            };
            let reader = entry.reader.clone();
            let handing_off = entry.handing_off.is_some();
            Some(async move {
                let mut status = match reader {
                    Some(reader) => ractor::call_t!(reader, ReaderMsg::Status, STATUS_TIMEOUT_MS)
                        .unwrap_or(fallback),
                    None => fallback,
                };
                if handing_off {
                    status.state = ShardState::HandingOff;
                }
                status
            })
        });
        let shards = futures::future::join_all(asks).await;
        let usage = self.ctx.budget.usage();
        let budget = crate::status::BudgetView {
            total_bytes: usage.total,
            in_use_bytes: usage.in_use,
            share_bytes: usage.share,
            shards: usage.shards,
            peak_bytes: usage.peak,
            shards_waiting: shards
                .iter()
                .filter(|s| s.state == ShardState::WaitingOnBudget)
                .count(),
        };
        let checkpoints: BTreeMap<String, _> =
            ractor::call_t!(self.core.writer, CheckpointMsg::Status, STATUS_TIMEOUT_MS)
                .map(|m| m.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
                .unwrap_or_default();
        WorkerStatus {
            worker_id: self.ctx.me.to_string(),
            application: self.ctx.application.clone(),
            stream: self.ctx.stream.clone(),
            source: crate::model::SourceKind::of_stream(&self.ctx.stream).as_str(),
            read_mode: self.ctx.settings.reader.mode.as_str(),
            state: if self.shutting_down {
                "stopping"
            } else if self.shutdown_reply.is_some() {
                "draining"
            } else {
                "running"
            },
            uptime_ms: self.started.elapsed().as_millis() as u64,
            shutting_down: self.shutting_down,
            shards,
            shard_restarts: self.shard_restarts,
            core: self
                .core
                .cells()
                .iter()
                .map(|(name, cell)| CoreActorStatus {
                    name,
                    state: actor_state(cell),
                    restarts: self.core_restarts,
                })
                .chain(self.status_server.iter().map(|server| CoreActorStatus {
                    name: "status_server",
                    state: actor_state(&server.get_cell()),
                    restarts: 0,
                }))
                .collect(),
            leases: ractor::call_t!(self.core.keeper, KeeperMsg::Status, STATUS_TIMEOUT_MS).ok(),
            stream_watcher: ractor::call_t!(
                self.core.watcher,
                WatcherMsg::Status,
                STATUS_TIMEOUT_MS
            )
            .ok(),
            checkpoints,
            metrics: ractor::call_t!(self.core.metrics, MetricsMsg::Snapshot, STATUS_TIMEOUT_MS)
                .ok(),
            budget,
        }
    }

    /// Processors finish and checkpoint, checkpoints are flushed, leases released,
    /// metrics published; then every child is stopped explicitly.
    async fn shutdown(&mut self) -> ShutdownReport {
        let settings = &self.ctx.settings;
        let timeout = settings.supervision.shutdown_timeout;
        let timeout_ms = timeout.as_millis() as u64;
        let mut errors = Vec::new();
        let readers: Vec<(LeaseKey, ActorRef<ReaderMsg>)> = self
            .shards
            .iter()
            .filter_map(|(k, e)| e.reader.clone().map(|r| (k.clone(), r)))
            .collect();
        info!(message = "Worker shutting down.", worker_id = %self.ctx.me, shards = readers.len());
        let asks = readers.iter().map(|(key, reader)| async move {
            match ractor::call_t!(reader, ReaderMsg::Shutdown, timeout_ms) {
                Ok(outcome) => outcome,
                Err(error) => ShardShutdown {
                    shard_id: key.shard_id(),
                    processor_ok: false,
                    checkpoint_flushed: false,
                    error: Some(format!("no answer from the shard reader: {error}")),
                },
            }
        });
        let mut shards: Vec<ShardShutdown> = futures::future::join_all(asks).await;
        shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        for (_, reader) in &readers {
            if reader.wait(Some(timeout)).await.is_err() {
                reader.kill();
            }
        }
        let checkpoint_failures =
            match ractor::call_t!(self.core.writer, CheckpointMsg::FlushAll, timeout_ms) {
                Ok(failures) => failures.into_iter().map(|e| e.to_string()).collect(),
                Err(error) => vec![format!("checkpoint writer: {error}")],
            };
        let mut leases = match ractor::call_t!(self.core.keeper, KeeperMsg::ReleaseAll, timeout_ms)
        {
            Ok(report) => report,
            Err(error) => {
                errors.push(format!("lease keeper: {error}"));
                ReleaseReport::default()
            }
        };
        shards.append(&mut leases.handed_off_shards);
        shards.sort_by(|a, b| a.shard_id.cmp(&b.shard_id));
        match ractor::call_t!(self.core.metrics, MetricsMsg::Flush, timeout_ms) {
            Ok(Ok(_)) => {}
            // Metrics are not worth failing a shutdown over; they are reported.
            Ok(Err(error)) => warn!(message = "Final metrics not published.", %error),
            Err(error) => warn!(message = "Final metrics not published.", %error),
        }
        for (name, cell) in self.core.cells() {
            if cell.stop_and_wait(None, Some(timeout)).await.is_err() {
                errors.push(format!("{name} did not stop in time"));
                cell.kill();
            }
        }
        if let Some(server) = self.status_server.take()
            && server.stop_and_wait(None, Some(timeout)).await.is_err()
        {
            server.kill();
        }
        ShutdownReport {
            shards,
            checkpoint_failures,
            leases,
            errors,
        }
    }
}
