//! The supervisor's core: the four long-lived actors (metrics reporter, lease keeper,
//! checkpoint writer, stream watcher) that hold references to each other, so restart
//! together; and the status endpoint beside them, which restarts alone.

use std::sync::Arc;

use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};

use super::context::WorkerContext;
use crate::checkpoint_writer::{CheckpointWriter, WriterArgs};
use crate::fencing::Fencing;
use crate::lease_keeper::{KeeperArgs, LeaseKeeper};
use crate::metrics_reporter::{MetricsArgs, MetricsMsg, MetricsReporter};
use crate::protocol::{CheckpointMsg, KeeperMsg, SupervisorMsg, WatcherMsg};
use crate::spans::Spanned;
#[cfg(feature = "status-server")]
pub(crate) use crate::status_server::StatusMsg;
#[cfg(feature = "status-server")]
use crate::status_server::{StatusArgs, StatusServer};
/// Built without the `status-server` feature there is no endpoint, so nothing to send
/// one: the supervisor's slot for it stays empty.
#[cfg(not(feature = "status-server"))]
pub(crate) type StatusMsg = std::convert::Infallible;
use crate::stream_watcher::{StreamWatcher, WatcherArgs};
use crate::telemetry::Telemetry;

/// The core actors, as the supervisor and the shard readers reach them.
pub(crate) struct Core {
    pub metrics: ActorRef<MetricsMsg>,
    pub keeper: ActorRef<KeeperMsg>,
    pub writer: ActorRef<CheckpointMsg>,
    pub watcher: ActorRef<WatcherMsg>,
}

impl Core {
    /// The metrics reporter as the actors emit to it.
    pub(crate) fn telemetry(&self) -> Telemetry {
        Telemetry::new(self.metrics.clone())
    }

    /// Each core actor with its name, in the order the status lists them.
    pub(crate) fn cells(&self) -> [(&'static str, ActorCell); 4] {
        [
            ("stream_watcher", self.watcher.get_cell()),
            ("lease_keeper", self.keeper.get_cell()),
            ("checkpoint_writer", self.writer.get_cell()),
            ("metrics_reporter", self.metrics.get_cell()),
        ]
    }
}

/// An actor's lifecycle state as ractor reports it: `running`, `stopping`, ….
pub(crate) fn actor_state(cell: &ActorCell) -> String {
    format!("{:?}", cell.get_status()).to_lowercase()
}

/// Built without the `status-server` feature: no endpoint. Settings refuse
/// `status.enabled = true` in such a build (`Settings::check_built`), so none was
/// asked for.
#[cfg(not(feature = "status-server"))]
pub(crate) async fn spawn_status_server(
    _myself: &ActorRef<SupervisorMsg>,
    _ctx: &Arc<WorkerContext>,
) -> Result<Option<ActorRef<StatusMsg>>, ActorProcessingErr> {
    Ok(None)
}

#[cfg(feature = "status-server")]
pub(crate) async fn spawn_status_server(
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

pub(crate) async fn spawn_core(
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
    let rows: crate::boards::RowsBoard = Arc::new(tokio::sync::watch::channel(None).0);
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
