//! The root actor of a worker: spawns the core actors and one shard reader per held
//! lease, restarts what fails, routes lease gains and losses, and runs the graceful
//! shutdown.
//!
//! This file is the shell: it receives messages and supervision events, finds which
//! child ended, asks the restart intensities for a verdict, and does what the pure
//! decisions say. Its parts, each importing only what is below it:
//!
//! * `context`: [`WorkerContext`], everything a worker is built from.
//! * `core`: the core actors, spawned (and restarted) together, and the status endpoint.
//! * `pure`: the decisions: what a child's end means, restart or give up, which requests
//!   each phase serves (the restart policy's detail is there).
//! * `shutdown`: the graceful stops, one shard's (a handoff) and the whole worker's.
//! * `status`: the status snapshot, from the supervisor's facts and its children's
//!   answers.

mod context;
mod core;
mod pure;
mod shutdown;
mod status;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorId, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::time::Instant;
use tracing::{error, info, warn};

use self::core::{Core, StatusMsg, spawn_core, spawn_status_server};
use self::pure::{
    Child, ChildEnd, CoreRecovery, HandOff, KeeperNote, Phase, ShardRecovery, Step, core_recovery,
    on_exit, shard_recovery,
};
use self::shutdown::Passing;
use crate::backoff::{Backoff, RestartIntensity};
use crate::failure::driver::Failures;
use crate::fencing::Fencing;
use crate::model::{Fence, Lease, LeaseKey, WorkerId};
use crate::protocol::{CheckpointMsg, KeeperMsg, ReaderMsg, StopReason, SupervisorMsg, WatcherMsg};
use crate::shard_reader::{ReaderArgs, ShardReader};
use crate::spans::Spanned;
use crate::status::{ShutdownReport, WorkerStatus};
use crate::telemetry::{CoreActorFailed, Recovery, ShardEnded, ShardFailed};

pub(crate) use self::context::WorkerContext;

pub(crate) struct Supervisor;

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
                if !state.phase().takes_leases() {
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
                if state.phase().supervises()
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
                if !state.phase().accepts_shutdown() {
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
        let (id, end) = match event {
            SupervisionEvent::ActorFailed(cell, error) => {
                (cell.get_id(), ChildEnd::Failed(error.to_string()))
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                (cell.get_id(), ChildEnd::stopped(reason.as_deref()))
            }
            _ => return Ok(()),
        };
        match on_exit(state.phase(), state.child(id), end) {
            Step::Ignore => {}
            Step::StaleReader => {
                state.by_actor.remove(&id);
            }
            Step::ShardDone(note) => {
                if let Some(key) = state.by_actor.remove(&id) {
                    state.shard_done(key, note);
                }
            }
            Step::ShardFailed(why) => {
                if let Some(key) = state.by_actor.remove(&id) {
                    state.shard_failed(&myself, key, why);
                }
            }
            Step::RestartStatusServer => {
                warn!(message = "Status endpoint stopped; starting it again.");
                state.status_server = None;
                match spawn_status_server(&myself, &state.ctx).await {
                    Ok(server) => state.status_server = server,
                    Err(error) => error!(message = "Status endpoint could not restart.", %error),
                }
            }
            Step::CoreFailed { name, why } => state.core_failed(&myself, name, why).await?,
        }
        Ok(())
    }
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
            lags: self.ctx.lags.clone(),
            budget: self.ctx.budget.join(),
            worker: self.ctx.handle.clone(),
            // Its own stream's consumer: a consumer subscribes only to its stream's shards.
            consumer: stream.consumer.clone(),
            failures: Failures::new(
                &self.ctx.settings,
                &stream.stream,
                self.ctx.me.as_str(),
                self.ctx.dead_letters.clone(),
            ),
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

    /// Where the worker is in its life.
    fn phase(&self) -> Phase {
        Phase::of(self.shutting_down, self.shutdown_reply.is_some())
    }

    /// Which child `id` is. Only a shard's current reader speaks for it: a reader of an
    /// earlier epoch ending late must not remove the entry of the lease as taken again
    /// since.
    fn child(&self, id: ActorId) -> Child {
        if let Some(key) = self.by_actor.get(&id) {
            let entry = self.shards.get(key);
            return Child::Reader {
                current: entry.is_some_and(|e| e.reader.as_ref().map(|r| r.get_id()) == Some(id)),
                handing_off: entry.is_some_and(|e| e.handing_off.is_some()),
            };
        }
        if self
            .status_server
            .as_ref()
            .is_some_and(|s| s.get_id() == id)
        {
            return Child::StatusServer;
        }
        self.core
            .cells()
            .into_iter()
            .find(|(_, c)| c.get_id() == id)
            .map_or(Child::Unknown, |(name, _)| Child::Core(name))
    }

    /// The shard is done on this worker: its entry goes, and the keeper hears of it.
    fn shard_done(&mut self, key: LeaseKey, note: Option<KeeperNote>) {
        let Some(entry) = self.shards.remove(&key) else {
            return;
        };
        let fence = entry.lease.fence();
        let _ = match note {
            Some(KeeperNote::Finished) => self.core.keeper.cast(KeeperMsg::Finished(key, fence)),
            Some(KeeperNote::Lost) => self.core.keeper.cast(KeeperMsg::Lost(key, fence)),
            None => Ok(()),
        };
    }

    /// The shard's reader failed: restart it after a backoff, or give the shard up past
    /// its restart intensity.
    fn shard_failed(&mut self, myself: &ActorRef<SupervisorMsg>, key: LeaseKey, failure: String) {
        let Some(entry) = self.shards.get_mut(&key) else {
            return;
        };
        entry.reader = None;
        entry.last_failure = Some((failure.clone(), Instant::now()));
        self.shard_restarts += 1;
        match shard_recovery(entry.intensity.record(Instant::now().into_std())) {
            ShardRecovery::Restart {
                attempt,
                fresh_backoff,
            } => {
                if fresh_backoff {
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
            ShardRecovery::GiveUp { restarts_in_window } => {
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

    /// Passes the shard on (to a peer, or back to nobody), if held under `fence` and
    /// not being passed already: see `shutdown::pass_on`.
    fn hand_off(&mut self, key: LeaseKey, fence: Fence, passing: Passing) {
        let held = self
            .shards
            .get(&key)
            .map(|e| (e.lease.fence() == fence, e.handing_off.is_some()));
        let reader = match (HandOff::of(held), self.shards.get_mut(&key)) {
            (HandOff::Claim, Some(entry)) => {
                entry.handing_off = Some(match &passing {
                    Passing::To(to) => to.clone(),
                    Passing::Release => self.ctx.me.clone(),
                });
                entry.reader.clone()
            }
            (HandOff::Skip, _) => return,
            (HandOff::Unheld, _) | (HandOff::Claim, None) => None,
        };
        if reader.is_none() {
            // Between restarts: nothing to stop.
            self.shards.remove(&key);
        }
        let timeout = self.ctx.settings.supervision.shutdown_timeout;
        shutdown::pass_on(&self.core, key, fence, passing, reader, timeout);
    }

    /// Restarts the core (and with it every shard), or stops the worker past the
    /// restart intensity.
    async fn core_failed(
        &mut self,
        myself: &ActorRef<SupervisorMsg>,
        name: &'static str,
        why: String,
    ) -> Result<(), ActorProcessingErr> {
        let recovery = core_recovery(
            self.core_intensity.record(Instant::now().into_std()),
            name,
            &why,
            self.ctx.settings.supervision.core_restart_window,
        );
        self.core.telemetry().emit(CoreActorFailed {
            actor: name,
            error: &why,
            giving_up: matches!(recovery, CoreRecovery::Stop { .. }),
        });
        if let CoreRecovery::Stop { reason } = recovery {
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

    /// The snapshot: the readers are asked first (all at once), then the core actors.
    async fn status(&self) -> WorkerStatus {
        let now = Instant::now();
        let asks = self
            .shards
            .iter()
            .map(|(key, entry)| status::ShardAsk {
                fallback: status::fallback(
                    key,
                    entry.lease.counter,
                    entry.restarts,
                    entry
                        .last_failure
                        .as_ref()
                        .map(|(error, at)| (error.as_str(), now.duration_since(*at))),
                ),
                reader: entry.reader.clone(),
                handing_off: entry.handing_off.is_some(),
            })
            .collect();
        let shards = status::ask_shards(asks).await;
        let budget = self.ctx.budget.usage();
        let answers = status::ask_core(&self.core, self.status_server.as_ref()).await;
        let facts = status::Facts {
            worker_id: self.ctx.me.to_string(),
            application: self.ctx.application.clone(),
            stream: self.ctx.stream.clone(),
            read_mode: self.ctx.settings.reader.mode.as_str(),
            phase: self.phase(),
            uptime: self.started.elapsed(),
            shard_restarts: self.shard_restarts,
            core_restarts: self.core_restarts,
            budget,
        };
        status::assemble(facts, shards, answers)
    }

    /// The graceful shutdown, past the drain: see `shutdown::stop_all`.
    async fn shutdown(&mut self) -> ShutdownReport {
        let readers: Vec<(LeaseKey, ActorRef<ReaderMsg>)> = self
            .shards
            .iter()
            .filter_map(|(k, e)| e.reader.clone().map(|r| (k.clone(), r)))
            .collect();
        info!(message = "Worker shutting down.", worker_id = %self.ctx.me, shards = readers.len());
        let timeout = self.ctx.settings.supervision.shutdown_timeout;
        shutdown::stop_all(&self.core, readers, self.status_server.take(), timeout).await
    }
}
