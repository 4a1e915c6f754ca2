//! One per held lease: gets an iterator from the checkpoint, reads, hands batches to its
//! processor actor (a child of the reader), tracks acks, and ends the shard.
//!
//! Driven by messages to itself (`Start`, `WaitParents`, `Acquire`, `Fetch`), never by a
//! loop, so acks, status requests, lease loss and shutdown are handled between any two
//! calls. The reader fetches the next batch while the processor works on the previous
//! one, up to the un-acked window (records and bytes) and within its part of the
//! worker's memory budget ([`crate::model::WorkerBudget`]): each read asks the budget
//! first. Its slot is in the outbox, so it is returned whenever the reader's state is
//! dropped, however the reader ends.
//!
//! This file is the actor's shell: it gathers inputs, calls its parts and does the
//! messaging. The parts, each with its own state, lowest first:
//! - `pure`: the phase machine and every rule, with tables of scenarios.
//! - `context`: the wiring every part borrows: `Ctx` (the shard and its ports),
//!   `Wires` (the actors it messages), and `Out`, the actors as a read step sees them.
//! - `outbox`: the ledger of what is delivered and not acked, the budget slot, the
//!   positions, and the checkpoint rules.
//! - `health`: how the reads are going (backoff, failures, throttle, fencing verdict).
//! - `stall`: whether the shard is stalled, and the news of it.
//! - `reading`: what both kinds of read do with an answer, and `Next`; `gather`: what
//!   `reader.batch_window` holds back; `polling`, `fanout`: the two kinds of read;
//!   `source`: the one the reader has; `ending`: the shard's end and its shutdown.
//! - `failures`: what the failure policy (`[failure]`, in the processor host) did here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

mod context;
mod ending;
mod failures;
mod fanout;
mod gather;
mod health;
mod ledger;
mod outbox;
mod polling;
mod pure;
mod reading;
mod source;
mod stall;
mod startup;
mod view;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::time::Instant;
use tracing::{info, warn};

use crate::backoff::Backoff;
use crate::model::ExtendedSequenceNumber;
use crate::protocol::{
    Acks, CheckpointError, CheckpointMsg, ProcessorFailure, ProcessorMsg, ReaderMsg, StopReason,
};
use crate::status::{ShardShutdown, ShardStatus};
use crate::telemetry::{Metric, RecordsProcessed, Sample};
pub(crate) use context::ReaderArgs;
use context::{Ctx, Out, Wires};
use ending::Ending;
use failures::FailureBook;
use health::ReadHealth;
use outbox::Outbox;
use pure::{AfterAck, FetchGate, FetchStep, Phase, ProcessorExit};
use reading::{Next, Reading};
use source::Source;
use stall::StallWatch;
use startup::{Parents, ParentsStep, Started};

/// How often a reader whose processor waits on something outside checks the wait
/// against its stall time.
const WAIT_CHECK: Duration = Duration::from_secs(1);

pub(crate) struct ShardReader;

pub(crate) struct ReaderState {
    ctx: Ctx,
    /// The reader's peers, its processor among them once started.
    wires: Wires,
    phase: Phase,
    revoked: Arc<AtomicBool>,
    /// Set when the shard stops for a shutdown or a handoff: the host finishes the
    /// batch in hand and skips those queued behind it (they are not acked, so the next
    /// owner starts with them: nothing lost, nothing done twice).
    stopping: Arc<AtomicBool>,
    fetch_scheduled: bool,
    parents: Parents,
    outbox: Outbox,
    health: ReadHealth,
    stall: StallWatch,
    source: Source,
    gather: gather::Gather,
    ending: Ending,
    failures: FailureBook,
    /// Checks the processor's wait every [`WAIT_CHECK`], from its first wait on.
    wait_timer: Option<tokio::task::JoinHandle<()>>,
}

impl Actor for ShardReader {
    type Msg = ReaderMsg;
    type State = ReaderState;
    type Arguments = ReaderArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: ReaderArgs,
    ) -> Result<ReaderState, ActorProcessingErr> {
        let settings = args.settings.clone();
        let now = Instant::now();
        let backoff = Backoff::new(settings.reader.backoff_min, settings.reader.backoff_max);
        let (ctx, wires, consumer, budget) = Ctx::new(args, myself.clone());
        let source = Source::new(consumer, settings.reader.poll_interval, now);
        let _ = myself.cast(ReaderMsg::Start);
        Ok(ReaderState {
            outbox: Outbox::new(ctx.shard.clone(), ctx.mode, budget, now).filter(ctx.filter()),
            health: ReadHealth::new(backoff),
            stall: StallWatch::default(),
            source,
            gather: gather::Gather::new(settings.reader.batch_window),
            ending: Ending::default(),
            failures: FailureBook::default(),
            ctx,
            wires,
            phase: Phase::Starting,
            revoked: Arc::new(AtomicBool::new(false)),
            stopping: Arc::new(AtomicBool::new(false)),
            fetch_scheduled: false,
            parents: Parents::default(),
            wait_timer: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: ReaderMsg,
        state: &mut ReaderState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ReaderMsg::Start => state.start().await?,
            ReaderMsg::WaitParents => state.wait_parents().await?,
            ReaderMsg::Acquire => {
                if matches!(state.phase, Phase::Reading) {
                    let (source, mut reading) = state.reading();
                    let next = source.acquire(&mut reading).await?;
                    state.follow(next);
                }
            }
            ReaderMsg::Fetch => state.fetch().await?,
            ReaderMsg::Ack(acks) => state.on_acks(acks),
            ReaderMsg::Checkpoint(at, reply) => {
                let result = state.outbox.manual(state.phase, &at);
                if result.is_ok() {
                    state.send_advance(at);
                }
                let _ = reply.send(result);
            }
            ReaderMsg::Flush(reply) => {
                let _ = reply.send(state.wires.flush(&state.ctx.key).await);
            }
            ReaderMsg::Prepare(at, app_state, reply) => {
                let _ = reply.send(state.prepare_checkpoint(at, app_state).await);
            }
            ReaderMsg::Commit(at, reply) => {
                let _ = reply.send(state.commit_prepared(at).await);
            }
            ReaderMsg::LeaseLost => state.lease_lost(),
            ReaderMsg::Shutdown(reply) => state.shutdown(reply),
            ReaderMsg::ProcessorDone(result) => state.processor_done(result).await?,
            ReaderMsg::StopNow => myself.stop(StopReason::LeaseLost.text()),
            ReaderMsg::ProcessorFailed(error) => {
                return Err(format!("shard {}: {error}", state.ctx.shard).into());
            }
            ReaderMsg::Failure(news) => {
                let parts = failures::Parts {
                    ctx: &state.ctx,
                    out: &state.wires,
                    phase: state.phase,
                    book: &mut state.failures,
                    stall: &mut state.stall,
                    outbox: &mut state.outbox,
                };
                failures::note(parts, news);
            }
            ReaderMsg::Status(reply) => {
                state.note_stall();
                let _ = reply.send(state.status());
            }
            ReaderMsg::WatchWaits => {
                if state.wait_timer.is_none() {
                    state.wait_timer =
                        Some(myself.send_interval(WAIT_CHECK, || ReaderMsg::WatchWaits));
                }
                state.note_stall();
            }
            ReaderMsg::Event { generation, event } => {
                let (source, mut reading) = state.reading();
                let next = source.on_event(&mut reading, generation, event).await?;
                state.follow(next);
            }
            ReaderMsg::WindowDue => {
                let (source, mut reading) = state.reading();
                reading.window_due(source.held_memory())?;
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut ReaderState,
    ) -> Result<(), ActorProcessingErr> {
        let ctx = &state.ctx;
        ctx.ports.lags.remove(&ctx.key);
        if let Some(timer) = state.wait_timer.take() {
            timer.abort();
        }
        // Its stall, if any, ends with the reader (a failed reader's is ended by the
        // supervisor's ShardFailed).
        if state.stall.end() {
            state
                .wires
                .record(vec![Sample::shard(Metric::ShardsStalled, &ctx.key, 0.0)]);
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut ReaderState,
    ) -> Result<(), ActorProcessingErr> {
        let (failed, why) = match event {
            SupervisionEvent::ActorFailed(_, error) => (true, error.to_string()),
            SupervisionEvent::ActorTerminated(_, _, reason) => (
                false,
                reason.unwrap_or_else(|| "no reason given".to_owned()),
            ),
            _ => return Ok(()),
        };
        match pure::processor_exit(state.phase, failed) {
            ProcessorExit::StopLeaseLost => myself.stop(StopReason::LeaseLost.text()),
            ProcessorExit::FailAfterAcks => {
                // Stop fetching now; fail once the acks already sent are counted.
                state.revoked.store(true, Ordering::Release);
                state.phase = Phase::Failing;
                let _ = myself.cast(ReaderMsg::ProcessorFailed(why));
            }
            ProcessorExit::Expected => {}
            ProcessorExit::Fail => {
                return Err(format!(
                    "shard {}: the processor stopped on its own ({why})",
                    state.ctx.shard
                )
                .into());
            }
        }
        Ok(())
    }
}

impl ReaderState {
    /// The parts a read step works on, borrowed apart from the source that reads.
    fn reading(&mut self) -> (&mut Source, Reading<'_>) {
        (
            &mut self.source,
            Reading {
                ctx: &self.ctx,
                out: &self.wires,
                phase: self.phase,
                outbox: &mut self.outbox,
                health: &mut self.health,
                stall: &mut self.stall,
                gather: &mut self.gather,
            },
        )
    }

    /// Does what a read step said comes next.
    fn follow(&mut self, next: Next) {
        let me = &self.wires.me;
        match next {
            Next::Nothing => {}
            Next::Fetch(delay) => self.schedule_fetch(delay),
            Next::Acquire => {
                let _ = me.cast(ReaderMsg::Acquire);
            }
            Next::AcquireAfter(delay) => {
                me.send_after(delay, || ReaderMsg::Acquire);
            }
            Next::Ended(children) => {
                self.ending.read_to_end(children);
                info!(message = "Shard read to its end.", shard_id = %self.ctx.shard);
                self.phase = Phase::Draining;
                self.maybe_end_shard();
            }
        }
    }

    fn stop(&self, reason: StopReason) {
        self.wires.me.stop(reason.text());
    }

    /// Reads the lease (after flushing what a previous incarnation acked), then waits
    /// for the parents ([`startup`]).
    async fn start(&mut self) -> Result<(), ActorProcessingErr> {
        if !self.phase.starting() {
            return Ok(());
        }
        match startup::read_lease(&self.ctx, &self.wires, &mut self.health.backoff).await? {
            Started::Stop(reason) => self.stop(reason),
            Started::Again(delay) => {
                self.wires.me.send_after(delay, || ReaderMsg::Start);
            }
            Started::Lease(lease) => {
                self.parents = Parents::new(lease.parent_shard_ids.clone());
                self.ctx.lease = *lease;
                let _ = self.wires.me.cast(ReaderMsg::WaitParents);
            }
        }
        Ok(())
    }

    /// Polls the parents not yet seen finished, then begins reading.
    async fn wait_parents(&mut self) -> Result<(), ActorProcessingErr> {
        if !self.phase.starting() {
            return Ok(());
        }
        let ctx = &self.ctx;
        let blocked = self.phase == Phase::BlockedOnParent;
        let poll = ctx.settings().reader.parent_poll_interval;
        let table = ctx.ports.table.as_ref();
        let step = self
            .parents
            .wait(table, &ctx.key, blocked, poll, &mut self.health.backoff);
        match step.await {
            ParentsStep::Blocked(delay) => {
                self.phase = Phase::BlockedOnParent;
                self.wires.me.send_after(delay, || ReaderMsg::WaitParents);
            }
            ParentsStep::Retry(delay) => {
                self.wires.me.send_after(delay, || ReaderMsg::WaitParents);
            }
            ParentsStep::Done => self.begin().await?,
        }
        Ok(())
    }

    /// Spawns the processor and starts reading from the lease's checkpoint.
    async fn begin(&mut self) -> Result<(), ActorProcessingErr> {
        self.health.backoff.reset();
        let Some(begun) =
            startup::start_processor(&self.ctx, &self.wires, &self.revoked, &self.stopping).await?
        else {
            return Ok(());
        };
        let checkpoint = self.ctx.lease.checkpoint.clone();
        self.outbox.begin(
            checkpoint,
            begun.position,
            begun.skip,
            self.ctx.lease.hash_range,
            Instant::now(),
        );
        self.wires.processor = Some(begun.processor);
        self.phase = Phase::Reading;
        let _ = self.wires.me.cast(ReaderMsg::Acquire);
        Ok(())
    }

    fn schedule_fetch(&mut self, delay: Duration) {
        if self.fetch_scheduled {
            return;
        }
        self.fetch_scheduled = true;
        if delay.is_zero() {
            let _ = self.wires.me.cast(ReaderMsg::Fetch);
        } else {
            self.wires.me.send_after(delay, || ReaderMsg::Fetch);
        }
    }

    /// The gate before every read ([`pure::fetch_step`]), then the read.
    async fn fetch(&mut self) -> Result<(), ActorProcessingErr> {
        self.fetch_scheduled = false;
        let reader = &self.ctx.settings().reader;
        let (poll, mut timeout) = (reader.poll_interval, reader.processor_timeout);
        // Under `[failure]` the host times each call out itself, after processor_timeout,
        // and counts it as a failed delivery (news that is progress here): this watch
        // is left for a host that is stuck beyond that.
        if self.ctx.ports.failures.is_some() {
            timeout = timeout.saturating_mul(2);
        }
        let stalled = pure::processor_stalled(
            self.outbox.ledger().is_empty(),
            self.outbox.since_progress(Instant::now()),
            timeout,
        );
        let step = pure::fetch_step(FetchGate {
            phase: self.phase,
            stalled,
            may_deliver: || reading::may_deliver(&self.ctx, &self.wires, &mut self.health),
            window_full: self.outbox.window_full(reader),
            has_iterator: self.source.ready(),
        });
        match step {
            FetchStep::Skip => {}
            FetchStep::ProcessorStalled => {
                return Err(format!(
                    "shard {}: the processor has acked nothing for {} with {} records pending",
                    self.ctx.shard,
                    humantime::format_duration(timeout),
                    self.outbox.ledger().in_flight_records()
                )
                .into());
            }
            // Re-checked on each ack, and periodically for the stall check above.
            FetchStep::Wait => {
                self.health.budget_wait = false;
                if self.health.fenced().is_some() {
                    // No event may be delivered: cancel the subscription at once.
                    self.drop_feed();
                }
                self.schedule_fetch(poll);
            }
            FetchStep::Acquire => {
                let _ = self.wires.me.cast(ReaderMsg::Acquire);
            }
            FetchStep::Read => {
                let (source, mut reading) = self.reading();
                let next = source.read(&mut reading).await?;
                self.follow(next);
            }
        }
        Ok(())
    }

    /// Cancels a subscription and forgets what it held (see [`Source::forget`]).
    fn drop_feed(&mut self) {
        let (source, mut reading) = self.reading();
        source.drop_feed(&mut reading);
    }

    fn on_acks(&mut self, acks: Acks) {
        let held = self.source.held_memory() + self.gather.memory();
        let acked = self.outbox.ack(acks, held, Instant::now());
        for error in &acked.errors {
            warn!(message = "Ack ignored.", shard_id = %self.ctx.shard, %error);
        }
        self.wires.telemetry.emit(RecordsProcessed {
            shard: &self.ctx.key,
            records: acked.processed_records,
            bytes: acked.processed_bytes,
            processing_time: acked.processing_time,
        });
        if let Some(at) = acked.checkpointable {
            self.send_advance(at);
        }
        let window_full = self.outbox.window_full(&self.ctx.settings().reader);
        match pure::after_ack(self.phase, window_full) {
            AfterAck::MaybeEnd => self.maybe_end_shard(),
            AfterAck::Fetch => self.schedule_fetch(Duration::ZERO),
            AfterAck::Nothing => {}
        }
    }

    /// Asks the writer to checkpoint `at` (the outbox has taken it as the checkpoint).
    fn send_advance(&self, at: ExtendedSequenceNumber) {
        let _ = self.wires.writer.cast(CheckpointMsg::Advance {
            key: self.ctx.key.clone(),
            fence: self.ctx.fence.clone(),
            at,
        });
    }

    /// Writes a prepared checkpoint ([`CheckpointMsg::Prepare`]) once the rules allow it.
    async fn prepare_checkpoint(
        &mut self,
        at: ExtendedSequenceNumber,
        state: Option<Vec<u8>>,
    ) -> Result<(), CheckpointError> {
        self.outbox.prepare(self.phase, &at)?;
        let (key, fence) = (self.ctx.key.clone(), self.ctx.fence.clone());
        self.wires
            .ask_writer(|reply| CheckpointMsg::Prepare {
                key,
                fence,
                at,
                state,
                reply,
            })
            .await
    }

    /// Commits a prepared checkpoint ([`CheckpointMsg::Commit`]).
    async fn commit_prepared(&mut self, at: ExtendedSequenceNumber) -> Result<(), CheckpointError> {
        self.outbox.commit(self.phase, &at)?;
        let (key, fence) = (self.ctx.key.clone(), self.ctx.fence.clone());
        self.wires
            .ask_writer(|reply| CheckpointMsg::Commit {
                key,
                fence,
                at,
                reply,
            })
            .await
    }

    fn maybe_end_shard(&mut self) {
        let acked = self.outbox.ledger().is_empty() || self.ctx.settings().ends_before_acked();
        if !pure::ready_to_end(self.phase, acked) {
            return;
        }
        self.phase = Phase::Ending;
        ending::ask_processor(&self.ctx, &self.wires, ProcessorMsg::ShardEnded);
    }

    /// The processor answered `shard_ended` or `shutdown_requested`: the end is
    /// finished ([`Ending`]), the processor stopped, and the reader stops.
    async fn processor_done(
        &mut self,
        answer: Result<(), ProcessorFailure>,
    ) -> Result<(), ActorProcessingErr> {
        let stop = match self.phase {
            Phase::Ending => {
                let stop = self
                    .ending
                    .shard_ended(&self.ctx, &self.wires, answer)
                    .await?;
                if matches!(stop, StopReason::ShardEnd) {
                    self.outbox.shard_end_written();
                }
                stop
            }
            Phase::ShuttingDown => {
                self.ending.shut_down(&self.ctx, &self.wires, answer).await;
                StopReason::Shutdown
            }
            _ => return Ok(()),
        };
        if let Some(processor) = self.wires.processor.take() {
            let _ = processor
                .stop_and_wait(None, Some(Duration::from_secs(5)))
                .await;
        }
        self.stop(stop);
        Ok(())
    }

    fn lease_lost(&mut self) {
        if matches!(self.phase, Phase::LeaseLost) {
            return;
        }
        info!(message = "Lease lost; stopping the shard.", shard_id = %self.ctx.shard);
        self.revoked.store(true, Ordering::Release);
        self.drop_feed();
        self.phase = Phase::LeaseLost;
        let (ctx, wires) = (&self.ctx, &self.wires);
        let _ = wires.writer.cast(CheckpointMsg::Forget(ctx.key.clone()));
        match &wires.processor {
            Some(processor) if processor.cast(ProcessorMsg::LeaseLost).is_ok() => {
                wires
                    .me
                    .send_after(ctx.settings().supervision.shutdown_timeout, || {
                        ReaderMsg::StopNow
                    });
            }
            _ => self.stop(StopReason::LeaseLost),
        }
    }

    fn shutdown(&mut self, reply: RpcReplyPort<ShardShutdown>) {
        if !self.ending.shutdown(self.phase, &self.ctx.shard, reply) {
            return;
        }
        self.phase = Phase::ShuttingDown;
        self.stopping.store(true, Ordering::Release);
        self.drop_feed();
        ending::ask_processor(&self.ctx, &self.wires, ProcessorMsg::ShutdownRequested);
    }

    fn note_stall(&mut self) {
        reading::note_stall(&self.ctx, &self.wires, &mut self.stall, self.phase);
    }

    fn status(&self) -> ShardStatus {
        view::shard_status(view::Parts {
            ctx: &self.ctx,
            phase: self.phase,
            outbox: &self.outbox,
            health: &self.health,
            stall: &self.stall,
            source: &self.source,
            gather: &self.gather,
            failures: &self.failures,
        })
    }
}
