//! One per held lease: gets an iterator from the checkpoint, polls GetRecords, hands
//! batches to its processor actor (a child of the reader), tracks acks, and ends the
//! shard.
//!
//! In fan-out mode (`reader.mode = "fanout"`) the same reader subscribes instead
//! (SubscribeToShard) and pulls one event at a time from a small task that owns the
//! subscription ([`Feed`]): an event is asked for only when the window has room, so a
//! slow processor holds the server back through flow control instead of filling memory.
//! Everything after the answer (fencing, de-aggregation, the ledger, acks, the shard's
//! end) is the polling path's. Dropping the feed cancels the subscription: lease loss,
//! fencing and shutdown do so at once, and its late events are recognised and dropped.
//!
//! Driven by messages to itself (`Start`, `WaitParents`, `Acquire`, `Fetch`), never by a
//! loop, so acks, status requests, lease loss and shutdown are handled between any two
//! calls. The reader fetches the next batch while the processor works on the previous
//! one, up to the un-acked window (records and bytes) and within its part of the
//! worker's memory budget ([`crate::model::WorkerBudget`]): each read asks the budget
//! first, and asks for as many records as the grant holds at the shard's observed
//! in-memory size per record. Its slot is in `ReaderArgs`, so it is returned whenever
//! the reader's state is dropped, however the reader ends.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

mod pure;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::backend::{
    CallFailure, ChildShard, Classified, IteratorPosition, LeaseTable, Record, ShardEvent,
    ShardIterator, StreamClient, StreamError, Subscription,
};
use crate::backoff::Backoff;
use crate::fencing::{FenceReason, Fencing};
use crate::model::{
    BatchId, Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, SequenceNumber, ShardId,
};
use crate::processor::{HostArgs, HostFence, ProcessorSource, ProcessorWait};
use crate::protocol::{
    Acks, Batch, CheckpointError, CheckpointMsg, Checkpointer, ProcessorFailure, ProcessorMsg,
    ReaderMsg, ShardInfo, StopReason, SupervisorMsg,
};
use crate::settings::{CheckpointMode, Settings, TrimmedCheckpoint};
use crate::status::{ShardShutdown, ShardStatus, SubscriptionView};
use crate::telemetry::{
    Call, CallFailed, CheckpointTrimmed, DeliveryPaused, DeliveryResumed, Metric, RecordsProcessed,
    Sample, ShardStalled, ShardUnstalled, Telemetry,
};
use pure::{Ack, AfterAck, FetchGate, FetchStep, Ledger, Phase, ProcessorExit, Refusal, Signals};

/// How long the reader waits on the checkpoint writer.
const WRITER_TIMEOUT_MS: u64 = 30_000;
/// How often a reader whose processor waits on something outside checks the wait
/// against its stall time.
const WAIT_CHECK: Duration = Duration::from_secs(1);

pub(crate) struct ShardReader;

pub(crate) struct ReaderArgs {
    pub lease: Lease,
    pub stream: String,
    /// The stream's ARN where its description gave one, for the processor's `ShardInfo`.
    pub stream_arn: Option<String>,
    pub streams: Arc<dyn StreamClient>,
    pub table: Arc<dyn LeaseTable>,
    pub settings: Arc<Settings>,
    pub initial_timestamp: Option<SystemTime>,
    pub processor: ProcessorSource,
    pub writer: ActorRef<CheckpointMsg>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub telemetry: Telemetry,
    /// Self-fencing: checked before each fetch and each delivery.
    pub fencing: Fencing,
    pub restarts: u32,
    /// The worker's delivered-records count, shared with the lease keeper.
    pub delivered: Arc<std::sync::atomic::AtomicU64>,
    /// MillisBehindLatest per shard id, shared with the lease keeper's heartbeat.
    pub lags: crate::status::LagBoard,
    /// Handed to the processor in its checkpointer, to ask the worker to stop.
    pub worker: crate::handle::WorkerHandle,
    /// The fan-out consumer's ARN in fan-out mode; `None` polls.
    pub consumer: Option<Arc<str>>,
    /// This reader's place in the worker's memory budget; dropping it returns the bytes.
    pub budget: crate::model::BudgetSlot,
}

/// An open fan-out subscription: a task that owns it and sends one event to the reader
/// per pull. Dropping the feed aborts the task, which drops (closes) the subscription.
struct Feed {
    generation: u64,
    pull: tokio::sync::mpsc::Sender<()>,
    task: tokio::task::JoinHandle<()>,
    since: Instant,
    /// An event has been asked for and not yet received.
    pulling: bool,
    events: u64,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Feed {
    fn open(
        subscription: Box<dyn Subscription>,
        reader: ActorRef<ReaderMsg>,
        generation: u64,
    ) -> Feed {
        let (pull, mut pulls) = tokio::sync::mpsc::channel::<()>(1);
        let task = tokio::spawn(async move {
            let mut subscription = subscription;
            while pulls.recv().await.is_some() {
                let event = subscription.next_event().await;
                let last = !matches!(event, Ok(Some(_)));
                if reader.cast(ReaderMsg::Event { generation, event }).is_err() || last {
                    return;
                }
            }
        });
        Feed {
            generation,
            pull,
            task,
            since: Instant::now(),
            pulling: false,
            events: 0,
        }
    }
}

pub(crate) struct ReaderState {
    args: ReaderArgs,
    me: ActorRef<ReaderMsg>,
    key: LeaseKey,
    shard: ShardId,
    fence: Fence,
    mode: CheckpointMode,
    phase: Phase,
    processor: Option<ActorRef<ProcessorMsg>>,
    revoked: Arc<AtomicBool>,
    /// Set when the shard stops for a shutdown or a handoff: the host finishes the
    /// batch in hand and skips those queued behind it (they are not acked, so the next
    /// owner starts with them: nothing lost, nothing done twice).
    stopping: Arc<AtomicBool>,
    iterator: Option<ShardIterator>,
    /// Parents not yet seen at SHARD_END.
    waiting_on: Vec<ShardId>,
    start_position: Option<IteratorPosition>,
    /// After a restart inside an aggregate: records at or before this were processed.
    skip_through: Option<ExtendedSequenceNumber>,
    /// What has been delivered and not yet seen acked.
    ledger: Ledger,
    last_delivered: Option<ExtendedSequenceNumber>,
    checkpoint: Option<Checkpoint>,
    fetch_scheduled: bool,
    idle: Duration,
    backoff: Backoff,
    last_progress: Instant,
    children: Option<Vec<ChildShard>>,
    millis_behind: Option<u64>,
    records_delivered: u64,
    bytes_delivered: u64,
    rate: RateMeter,
    /// The last call that failed and when, for the status page.
    last_error: Option<(String, Instant)>,
    /// The last GetRecords was throttled; cleared by the next success.
    throttled: bool,
    /// The last GetRecords returned nothing and said the shard is at its tip.
    caught_up: bool,
    /// Why delivery is paused, while it is (self-fencing).
    fenced: Option<FenceReason>,
    /// Stream calls that failed since the last GetRecords answered.
    failures_in_row: u32,
    shutdown_reply: Option<RpcReplyPort<ShardShutdown>>,
    /// Fan-out: the open subscription, the last event's continuation, when the last
    /// subscription was made, and how many have been.
    feed: Option<Feed>,
    continuation: Option<SequenceNumber>,
    subscribed_at: Option<Instant>,
    subscriptions: u64,
    /// When GetRecords was last asked whether an idle fan-out shard has ended.
    last_end_probe: Instant,
    /// Records of the last event not yet delivered (the window was full), and what to
    /// do once they are.
    held: std::collections::VecDeque<Record>,
    held_after: Option<HeldAfter>,
    /// The in-memory size of `held` ([`pure::record_memory`]).
    held_memory: u64,
    /// The last read brought records: the shard has a backlog (for the budget).
    wants_more: bool,
    /// The last read was held back by the memory budget (for the state shown).
    budget_wait: bool,
    /// In-memory bytes per record of the last batch: a read's `Limit` is its grant over
    /// this.
    record_memory: u64,
    /// Held by the empty batch on its way to the processor (`reader.call_on_empty`);
    /// shared with nobody when none is.
    empty_slot: Arc<()>,
    /// The in-memory size of the largest fan-out event so far: a pull is made when the
    /// grant holds one as large.
    largest_event: u64,
    /// What the processor waits on outside, shared with its host (a MultiLang child's
    /// answer): past its stall time, the shard is stalled.
    wait: ProcessorWait,
    /// Checks `wait` every [`WAIT_CHECK`], from the processor's first wait on.
    wait_timer: Option<tokio::task::JoinHandle<()>>,
    /// Why the shard cannot be read, from the first refusal of the current run of
    /// failures: a subscription refused, or reads failing in a row. Cleared by the next
    /// read or subscription that succeeds.
    read_stall: Option<String>,
    /// Since when the stall shown now was reported (ERROR and gauge), and when its gauge
    /// was last sampled; `None` while the shard is not stalled.
    stalled: Option<(Instant, Instant)>,
}

/// The ids of the children a shard's end named (none if it named none), for its last
/// batch and its SHARD_END checkpoint.
fn child_ids<C: FromIterator<ShardId>>(end: Option<&[ChildShard]>) -> C {
    end.unwrap_or(&[]).iter().map(|c| c.id.clone()).collect()
}

/// What a fan-out event says beyond its records, acted on once they are delivered.
struct HeldAfter {
    continuation: Option<SequenceNumber>,
    /// The shard ended, with these children.
    end: Option<Vec<ChildShard>>,
    /// The event had no records.
    idle: bool,
    /// When the event arrived (each batch of it carries this as `fetched_at`).
    fetched_at: Instant,
}

/// What the read that brought a batch said beside its records.
struct ReadFacts<'a> {
    fetched_at: Instant,
    /// The shard ended with this read, and the children it named.
    end: Option<&'a [ChildShard]>,
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
        let key = args.lease.key.clone();
        let shard = key.shard_id();
        let fence = args.lease.fence();
        let settings = &args.settings;
        let backoff = Backoff::new(settings.reader.backoff_min, settings.reader.backoff_max);
        let idle = settings.reader.poll_interval;
        let mode = settings.checkpoint.mode;
        let _ = myself.cast(ReaderMsg::Start);
        Ok(ReaderState {
            wait: ProcessorWait::new(myself.clone()),
            wait_timer: None,
            read_stall: None,
            stalled: None,
            me: myself.clone(),
            key,
            shard,
            fence,
            mode,
            phase: Phase::Starting,
            processor: None,
            revoked: Arc::new(AtomicBool::new(false)),
            stopping: Arc::new(AtomicBool::new(false)),
            iterator: None,
            waiting_on: Vec::new(),
            start_position: None,
            skip_through: None,
            ledger: Ledger::new(),
            last_delivered: None,
            checkpoint: None,
            fetch_scheduled: false,
            idle,
            backoff,
            last_progress: Instant::now(),
            children: None,
            millis_behind: None,
            records_delivered: 0,
            bytes_delivered: 0,
            rate: RateMeter::new(),
            last_error: None,
            throttled: false,
            caught_up: false,
            fenced: None,
            failures_in_row: 0,
            shutdown_reply: None,
            feed: None,
            continuation: None,
            subscribed_at: None,
            subscriptions: 0,
            last_end_probe: Instant::now(),
            held: Default::default(),
            held_after: None,
            held_memory: 0,
            wants_more: false,
            budget_wait: false,
            record_memory: pure::FIRST_GUESS_RECORD_MEMORY,
            empty_slot: Arc::new(()),
            largest_event: 0,
            args,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: ReaderMsg,
        state: &mut ReaderState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ReaderMsg::Start => state.start(&myself).await?,
            ReaderMsg::WaitParents => state.wait_parents(&myself).await?,
            ReaderMsg::Acquire => state.acquire(&myself).await?,
            ReaderMsg::Fetch => {
                state.fetch_scheduled = false;
                state.fetch(&myself).await?;
            }
            ReaderMsg::Ack(acks) => state.on_acks(&myself, acks)?,
            ReaderMsg::Checkpoint(at, reply) => {
                let _ = reply.send(state.manual_checkpoint(at));
            }
            ReaderMsg::Flush(reply) => {
                let _ = reply.send(state.flush().await);
            }
            ReaderMsg::Prepare(at, app_state, reply) => {
                let _ = reply.send(state.prepare_checkpoint(at, app_state).await);
            }
            ReaderMsg::Commit(at, reply) => {
                let _ = reply.send(state.commit_prepared(at).await);
            }
            ReaderMsg::LeaseLost => state.lease_lost(&myself),
            ReaderMsg::Shutdown(reply) => state.shutdown(&myself, reply),
            ReaderMsg::ProcessorDone(result) => state.processor_done(&myself, result).await?,
            ReaderMsg::StopNow => myself.stop(StopReason::LeaseLost.text()),
            ReaderMsg::ProcessorFailed(error) => {
                return Err(format!("shard {}: {error}", state.shard).into());
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
                state.on_event(&myself, generation, event).await?;
            }
        }
        Ok(())
    }

    async fn post_stop(
        &self,
        _myself: ActorRef<Self::Msg>,
        state: &mut ReaderState,
    ) -> Result<(), ActorProcessingErr> {
        state.args.lags.remove(&state.args.lease.key);
        if let Some(timer) = state.wait_timer.take() {
            timer.abort();
        }
        // Its stall, if any, ends with the reader (a failed reader's is ended by the
        // supervisor's ShardFailed).
        if state.stalled.take().is_some() {
            state.report(vec![Sample::shard(
                Metric::ShardsStalled,
                &state.args.lease.key,
                0.0,
            )]);
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
                    state.shard
                )
                .into());
            }
        }
        Ok(())
    }
}

impl ReaderState {
    fn settings(&self) -> &Settings {
        &self.args.settings
    }

    fn report(&self, samples: Vec<Sample>) {
        self.args.telemetry.record(samples);
    }

    /// Reads the lease (after flushing what a previous incarnation acked), waits for the
    /// parents, starts the processor.
    async fn start(&mut self, myself: &ActorRef<ReaderMsg>) -> Result<(), ActorProcessingErr> {
        if !self.phase.starting() {
            return Ok(());
        }
        let key = self.key.clone();
        match ractor::call_t!(
            self.args.writer,
            |reply| CheckpointMsg::Flush { key, reply },
            WRITER_TIMEOUT_MS
        ) {
            Ok(Err(CheckpointError::LeaseLost { .. })) => {
                myself.stop(StopReason::LeaseLost.text());
                return Ok(());
            }
            Ok(_) => {}
            Err(e) => return Err(format!("shard {}: checkpoint writer: {e}", self.shard).into()),
        }
        let lease = match self.args.table.get(&self.key).await {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                myself.stop(StopReason::LeaseLost.text());
                return Ok(());
            }
            Err(error) if error.is_retryable() => {
                myself.send_after(self.backoff.next_random(), || ReaderMsg::Start);
                return Ok(());
            }
            Err(error) => {
                return Err(format!("shard {}: reading its lease: {error}", self.shard).into());
            }
        };
        if lease.fence() != self.fence {
            info!(message = "Lease changed hands before reading started.", shard_id = %self.shard);
            myself.stop(StopReason::LeaseLost.text());
            return Ok(());
        }
        if lease.checkpoint.is_shard_end() {
            let _ = self.args.supervisor.cast(SupervisorMsg::ShardFinished {
                key: self.key.clone(),
                children: None,
            });
            myself.stop(StopReason::ShardEnd.text());
            return Ok(());
        }
        self.waiting_on = lease.parent_shard_ids.clone();
        self.args.lease = lease;
        let _ = myself.cast(ReaderMsg::WaitParents);
        Ok(())
    }

    /// Polls the parents not yet seen finished (only those: the reader's own lease was
    /// read once, in `start`), then begins reading.
    async fn wait_parents(
        &mut self,
        myself: &ActorRef<ReaderMsg>,
    ) -> Result<(), ActorProcessingErr> {
        if !self.phase.starting() {
            return Ok(());
        }
        while let Some(parent) = self.waiting_on.first().cloned() {
            match self
                .args
                .table
                .get(&self.args.lease.key.sibling(&parent))
                .await
            {
                Ok(Some(p)) if !p.checkpoint.is_shard_end() => {
                    if self.phase != Phase::BlockedOnParent {
                        info!(message = "Shard waits for its parent to finish.", shard_id = %self.shard, parent = %parent);
                    }
                    self.phase = Phase::BlockedOnParent;
                    myself.send_after(self.settings().reader.parent_poll_interval, || {
                        ReaderMsg::WaitParents
                    });
                    return Ok(());
                }
                // Finished, or its row is gone (cleaned up after it finished).
                Ok(_) => {
                    self.waiting_on.remove(0);
                }
                Err(error) => {
                    debug!(message = "Parent lease unreadable; retrying.", shard_id = %self.shard, %error);
                    myself.send_after(self.backoff.next_random(), || ReaderMsg::WaitParents);
                    return Ok(());
                }
            }
        }
        self.begin(myself).await
    }

    /// Spawns the processor and starts reading from the lease's checkpoint.
    async fn begin(&mut self, myself: &ActorRef<ReaderMsg>) -> Result<(), ActorProcessingErr> {
        let lease = &self.args.lease;
        self.backoff.reset();
        self.checkpoint = Some(lease.checkpoint.clone());
        let (position, skip) =
            match pure::start_position(&lease.checkpoint, self.args.initial_timestamp) {
                Ok(Some(start)) => start,
                Ok(None) => return Ok(()),
                Err(error) => return Err(format!("shard {}: {error}", self.shard).into()),
            };
        let info = ShardInfo {
            shard_id: self.shard.clone(),
            stream: self.args.stream.clone(),
            stream_arn: self.args.stream_arn.clone(),
            parents: lease.parent_shard_ids.clone(),
            hash_range: lease.hash_range,
            starting_at: lease.checkpoint.clone(),
            pending_checkpoint: lease.pending_checkpoint.clone(),
            pending_checkpoint_state: lease.pending_checkpoint_state.clone(),
        };
        self.start_position = Some(position);
        self.skip_through = skip;
        let processor = self.spawn_processor(myself, &info).await?;
        processor.cast(ProcessorMsg::Initialize(info))?;
        self.processor = Some(processor);
        self.phase = Phase::Reading;
        self.last_progress = Instant::now();
        let _ = myself.cast(ReaderMsg::Acquire);
        Ok(())
    }

    async fn spawn_processor(
        &self,
        myself: &ActorRef<ReaderMsg>,
        info: &ShardInfo,
    ) -> Result<ActorRef<ProcessorMsg>, ActorProcessingErr> {
        let host = HostArgs {
            mode: self.mode,
            wait: self.wait.clone(),
            revoked: self.revoked.clone(),
            stopping: self.stopping.clone(),
            fence: HostFence {
                fencing: self.args.fencing.clone(),
                key: self.key.clone(),
                fence: self.fence.clone(),
                recheck: self.settings().reader.poll_interval,
            },
        };
        self.args
            .processor
            .start(info, host, myself.get_cell())
            .await
    }

    async fn acquire(&mut self, myself: &ActorRef<ReaderMsg>) -> Result<(), ActorProcessingErr> {
        if !matches!(self.phase, Phase::Reading) {
            return Ok(());
        }
        if let Some(consumer) = self.args.consumer.clone() {
            return self.subscribe(myself, &consumer).await;
        }
        let Some(position) =
            pure::iterator_position(self.last_delivered.as_ref(), self.start_position.as_ref())
        else {
            return Ok(());
        };
        match self
            .args
            .streams
            .get_shard_iterator(&self.args.stream, &self.shard, &position)
            .await
        {
            Ok(iterator) => {
                self.iterator = Some(iterator);
                self.backoff.reset();
                self.schedule_fetch(myself, Duration::ZERO);
            }
            Err(error) if error.is_retryable() => {
                self.count_failure(Call::GetShardIterator, &error);
                myself.send_after(self.backoff.next_random(), || ReaderMsg::Acquire);
            }
            // The lease names a shard the stream does not have (an orphan row); the
            // lease keeper lets the row go once a listing confirms it.
            Err(error @ StreamError::NotFound { .. }) => {
                return Err(format!(
                    "shard {} is not in stream {}: {error}",
                    self.shard, self.args.stream
                )
                .into());
            }
            Err(error @ StreamError::Trimmed { .. }) => {
                return self.trimmed(myself, Call::GetShardIterator, &error).await;
            }
            Err(error) => {
                return Err(format!("shard {}: GetShardIterator: {error}", self.shard).into());
            }
        }
        Ok(())
    }

    /// Fan-out: opens a subscription where reading continues, at most once a second.
    async fn subscribe(
        &mut self,
        myself: &ActorRef<ReaderMsg>,
        consumer: &str,
    ) -> Result<(), ActorProcessingErr> {
        if self.feed.is_some() {
            return Ok(());
        }
        let wait = pure::subscribe_delay(self.subscribed_at.map(|at| at.elapsed()));
        if !wait.is_zero() {
            myself.send_after(wait, || ReaderMsg::Acquire);
            return Ok(());
        }
        let Some((position, skip)) = pure::subscribe_position(
            self.continuation.as_ref(),
            self.last_delivered.as_ref(),
            self.start_position.as_ref(),
        ) else {
            return Ok(());
        };
        self.subscribed_at = Some(Instant::now());
        match self
            .args
            .streams
            .subscribe_to_shard(consumer, &self.shard, &position)
            .await
        {
            Ok(subscription) => {
                if skip.is_some() {
                    self.skip_through = skip;
                }
                self.subscriptions += 1;
                self.report(vec![Sample::shard(
                    Metric::Subscriptions,
                    &self.args.lease.key,
                    1.0,
                )]);
                self.feed = Some(Feed::open(subscription, myself.clone(), self.subscriptions));
                self.args
                    .lags
                    .subscribed(&self.args.lease.key, Some(Instant::now()));
                self.read_again();
                debug!(message = "Shard subscribed.", shard_id = %self.shard, ?position);
                self.schedule_fetch(myself, Duration::ZERO);
            }
            // The previous owner's subscription still open (a handoff, a failover), the
            // once-a-second limit, a network failure: back off and subscribe again. The
            // lease stays held.
            Err(error) if error.is_retryable() => {
                self.count_failure(Call::SubscribeToShard, &error);
                // A refusal stalls the shard at once, with its reason; the previous
                // owner's subscription still open (a handoff) and the once-a-second
                // limit are waited out (a stall only if they last, as any failure).
                if pure::subscription_refused(&error) {
                    self.read_stalled(format!("cannot subscribe: {error}"));
                }
                myself.send_after(self.backoff.next_random(), || ReaderMsg::Acquire);
            }
            Err(error @ StreamError::NotFound { .. }) => {
                return Err(format!(
                    "shard {} of stream {} cannot be subscribed to (is the consumer still \
                     registered?): {error}",
                    self.shard, self.args.stream
                )
                .into());
            }
            Err(error) => {
                return Err(format!("shard {}: SubscribeToShard: {error}", self.shard).into());
            }
        }
        Ok(())
    }

    /// Fan-out: one event of the subscription, handled as a GetRecords answer is.
    async fn on_event(
        &mut self,
        myself: &ActorRef<ReaderMsg>,
        generation: u64,
        event: Result<Option<ShardEvent>, StreamError>,
    ) -> Result<(), ActorProcessingErr> {
        match self.feed.as_mut() {
            Some(feed) if feed.generation == generation => {
                feed.pulling = false;
                feed.events += 1;
            }
            // A cancelled subscription's late event.
            _ => return Ok(()),
        }
        if !matches!(self.phase, Phase::Reading) {
            self.drop_feed();
            return Ok(());
        }
        if event.is_ok() {
            self.answered();
        }
        match event {
            // Fenced while the event was on its way: not handed over. The subscription
            // is cancelled; the next one starts after the last event delivered.
            Ok(Some(_)) if !self.may_deliver() => {
                self.drop_feed();
                self.schedule_fetch(myself, self.settings().reader.poll_interval);
            }
            Ok(Some(event)) => {
                self.read_ok(event.records.is_empty(), event.millis_behind_latest, None);
                let at_end = event.is_shard_end();
                self.held_after = Some(HeldAfter {
                    continuation: event.continuation.filter(|_| !at_end),
                    end: at_end.then_some(event.child_shards),
                    idle: event.records.is_empty(),
                    fetched_at: Instant::now(),
                });
                let memory: u64 = event.records.iter().map(pure::record_memory).sum();
                self.largest_event = self.largest_event.max(memory);
                self.held_memory += memory;
                self.wants_more = !event.records.is_empty();
                self.held.extend(event.records);
                self.settle_budget();
                self.advance_fanout(myself).await?;
            }
            // The server ended the subscription (its five minutes are up): the next
            // starts from the continuation.
            Ok(None) => {
                self.drop_feed();
                let _ = myself.cast(ReaderMsg::Acquire);
            }
            Err(error) if error.is_retryable() => {
                self.drop_feed();
                self.count_failure(Call::SubscribeToShard, &error);
                myself.send_after(self.backoff.next_random(), || ReaderMsg::Acquire);
            }
            Err(error) => {
                return Err(format!("shard {}: SubscribeToShard: {error}", self.shard).into());
            }
        }
        Ok(())
    }

    /// Fan-out: hands the held event's records over in batches of at most max_records
    /// while the window has room (an event holds up to 10,000 records, more than a
    /// small window: the rest waits here for acks, as polling's next call would wait).
    /// Once all are delivered, takes the event's continuation, ends the shard if the
    /// event (or, for an idle one, GetRecords) says so, and asks for the next event.
    async fn advance_fanout(
        &mut self,
        myself: &ActorRef<ReaderMsg>,
    ) -> Result<(), ActorProcessingErr> {
        let most = self.settings().reader.max_records.max(1) as usize;
        while !self.held.is_empty() && !self.window_full() {
            let take = most.min(self.held.len());
            let batch: Vec<Record> = self.held.drain(..take).collect();
            let memory: u64 = batch.iter().map(pure::record_memory).sum();
            self.held_memory = self.held_memory.saturating_sub(memory);
            let after = self.held_after.take();
            let facts = ReadFacts {
                fetched_at: after.as_ref().map_or_else(Instant::now, |a| a.fetched_at),
                // The event's last records are the shard's last.
                end: after
                    .as_ref()
                    .and_then(|a| a.end.as_deref())
                    .filter(|_| self.held.is_empty()),
            };
            let delivered = self.deliver(batch, facts);
            self.held_after = after;
            delivered?;
        }
        let poll = self.settings().reader.poll_interval;
        if !self.held.is_empty() {
            self.schedule_fetch(myself, poll);
            return Ok(());
        }
        let Some(after) = self.held_after.take() else {
            return Ok(());
        };
        if after.idle {
            self.deliver(
                Vec::new(),
                ReadFacts {
                    fetched_at: after.fetched_at,
                    end: after.end.as_deref(),
                },
            )?;
        }
        if let Some(continuation) = after.continuation {
            self.continuation = Some(continuation);
        }
        let mut ended = after.end.map(Some);
        if ended.is_none() && after.idle && self.end_probe_due() {
            ended = self.probe_end().await;
        }
        if let Some(children) = ended {
            self.children = children;
            self.drop_feed();
            info!(message = "Shard read to its end.", shard_id = %self.shard);
            self.phase = Phase::Draining;
            self.maybe_end_shard(myself);
            return Ok(());
        }
        if self.window_full() {
            self.schedule_fetch(myself, poll);
        } else {
            self.pull(myself);
        }
        Ok(())
    }

    /// Fan-out: forgets the subscription and any records of its last event not yet
    /// delivered (the continuation stays before them, so the next subscription brings
    /// them again).
    fn drop_feed(&mut self) {
        self.feed = None;
        self.args.lags.subscribed(&self.args.lease.key, None);
        self.held.clear();
        self.held_after = None;
        self.held_memory = 0;
        self.settle_budget();
    }

    /// Whether to ask GetRecords if this idle fan-out shard has ended: rarely where the
    /// server ends subscriptions at a shard's end (a safety net), often where it does not.
    fn end_probe_due(&self) -> bool {
        let reader = &self.settings().reader;
        let every = if self.args.streams.capabilities().shard_end_in_subscriptions {
            reader.shard_sync_interval
        } else {
            reader.parent_poll_interval
        };
        self.last_end_probe.elapsed() >= every
    }

    /// One GetRecords where the subscription would resume: `Some(children)` if the shard
    /// is at its end there (everything before it was delivered), `None` if not or if the
    /// calls failed (asked again later).
    async fn probe_end(&mut self) -> Option<Option<Vec<ChildShard>>> {
        self.last_end_probe = Instant::now();
        // Where polling would read next (a continuation is no GetShardIterator position
        // on every server).
        let position =
            pure::iterator_position(self.last_delivered.as_ref(), self.start_position.as_ref())?;
        let covered = std::cmp::max(self.last_delivered.clone(), self.skip_through.clone());
        let streams = &self.args.streams;
        let probe = async {
            let iterator = streams
                .get_shard_iterator(&self.args.stream, &self.shard, &position)
                .await?;
            streams.get_records(&iterator, 2).await
        };
        match probe.await {
            Ok(batch)
                if pure::idle_shard_ended(
                    batch.is_shard_end(),
                    &batch.records,
                    covered.as_ref(),
                ) =>
            {
                debug!(message = "The idle subscription's shard has ended (found by GetRecords).", shard_id = %self.shard);
                Some(batch.child_shards)
            }
            Ok(_) => None,
            Err(error) => {
                debug!(message = "Asking GetRecords whether the shard ended failed.", shard_id = %self.shard, %error);
                None
            }
        }
    }

    /// Fan-out: asks the subscription for its next event, unless one is on its way.
    /// The periodic fetch keeps running meanwhile, for the processor-stall check.
    ///
    /// Only when the shard's allowance in the memory budget holds an event as large as
    /// the largest so far (or the shard holds nothing). Nothing is reserved: a pull can
    /// wait minutes on a quiet shard. So fan-out's bound is looser than polling's: each
    /// shard may overrun by one event (its first, or one larger than any before).
    fn pull(&mut self, myself: &ActorRef<ReaderMsg>) {
        let holds_nothing = self.holds_nothing();
        if let Some(feed) = self.feed.as_mut()
            && !feed.pulling
        {
            if pure::may_pull(
                self.args.budget.allowance(),
                self.largest_event,
                holds_nothing,
            ) {
                self.budget_wait = false;
                feed.pulling = true;
                if feed.pull.try_send(()).is_err() {
                    // The task ended (its last event was an error or the end, still
                    // queued for us): that event says what to do next.
                    feed.pulling = false;
                }
            } else {
                self.budget_wait = true;
            }
        }
        self.schedule_fetch(myself, self.settings().reader.poll_interval);
    }

    /// Tells the worker's budget what this shard holds in memory now (its ledger and a
    /// fan-out event's records not yet delivered), ending any reservation.
    fn settle_budget(&self) {
        self.args
            .budget
            .settle(self.ledger.memory() + self.held_memory, self.wants_more);
    }

    /// Nothing of this shard is in memory: it may read even with no grant (else it
    /// could wait forever for room others hold).
    fn holds_nothing(&self) -> bool {
        self.ledger.memory() == 0 && self.held.is_empty()
    }

    /// A call on the stream answered: ends a run of failures.
    fn answered(&mut self) {
        self.read_again();
        if self.failures_in_row > 0 {
            if self.failures_in_row >= pure::STALL_REPORT_EVERY {
                info!(message = "Shard read again.", shard_id = %self.shard, after_failures = self.failures_in_row);
            }
            self.failures_in_row = 0;
        }
    }

    /// A read answered (a GetRecords batch or a subscription's event): no backoff, no
    /// throttle, caught up if it was empty at the tip, and its lag; for a GetRecords, how
    /// long the call took (in the lag's message: no message more per read).
    fn read_ok(&mut self, empty: bool, millis_behind_latest: Option<u64>, took: Option<Duration>) {
        self.backoff.reset();
        self.throttled = false;
        self.caught_up = empty && millis_behind_latest.unwrap_or(0) == 0;
        self.millis_behind = millis_behind_latest;
        let key = &self.args.lease.key;
        let mut samples = Vec::with_capacity(2);
        if let Some(millis) = millis_behind_latest {
            self.args.lags.set(key, millis);
            samples.push(Sample::shard(
                Metric::MillisBehindLatest,
                key,
                millis as f64,
            ));
        }
        if let Some(took) = took {
            let millis = took.as_secs_f64() * 1000.0;
            samples.push(Sample::shard(Metric::GetRecordsTime, key, millis));
        }
        self.report(samples);
    }

    fn schedule_fetch(&mut self, myself: &ActorRef<ReaderMsg>, delay: Duration) {
        if self.fetch_scheduled {
            return;
        }
        self.fetch_scheduled = true;
        if delay.is_zero() {
            let _ = myself.cast(ReaderMsg::Fetch);
        } else {
            myself.send_after(delay, || ReaderMsg::Fetch);
        }
    }

    fn window_full(&self) -> bool {
        let reader = &self.settings().reader;
        self.ledger
            .is_full(u64::from(reader.window_records), reader.window_bytes)
    }

    /// Whether this shard may hand records to its processor now (self-fencing); logs
    /// each change of verdict once.
    fn may_deliver(&mut self) -> bool {
        match self.args.fencing.check(&self.key, &self.fence) {
            Ok(()) => {
                if let Some(was) = self.fenced.take() {
                    self.args.telemetry.emit(DeliveryResumed {
                        shard: &self.shard,
                        was: &was,
                    });
                }
                true
            }
            Err(reason) => {
                let news = self.fenced.as_ref().is_none_or(|was| {
                    std::mem::discriminant(was) != std::mem::discriminant(&reason)
                });
                if news {
                    self.args.telemetry.emit(DeliveryPaused {
                        shard: &self.shard,
                        reason: &reason,
                    });
                }
                self.fenced = Some(reason);
                false
            }
        }
    }

    async fn fetch(&mut self, myself: &ActorRef<ReaderMsg>) -> Result<(), ActorProcessingErr> {
        let poll = self.settings().reader.poll_interval;
        let timeout = self.settings().reader.processor_timeout;
        let stalled = pure::processor_stalled(
            self.ledger.is_empty(),
            self.last_progress.elapsed(),
            timeout,
        );
        let window_full = self.window_full();
        let fanout = self.args.consumer.is_some();
        let has_iterator = if fanout {
            self.feed.is_some()
        } else {
            self.iterator.is_some()
        };
        let step = pure::fetch_step(FetchGate {
            phase: self.phase,
            stalled,
            may_deliver: || self.may_deliver(),
            window_full,
            has_iterator,
        });
        let iterator = match step {
            FetchStep::Skip => return Ok(()),
            FetchStep::ProcessorStalled => {
                return Err(format!(
                    "shard {}: the processor has acked nothing for {} with {} records pending",
                    self.shard,
                    humantime::format_duration(timeout),
                    self.ledger.in_flight_records()
                )
                .into());
            }
            // Re-checked on each ack, and periodically for the stall check above.
            FetchStep::Wait => {
                self.budget_wait = false;
                if self.fenced.is_some() {
                    // No event may be delivered: cancel the subscription at once.
                    self.drop_feed();
                }
                self.schedule_fetch(myself, poll);
                return Ok(());
            }
            FetchStep::Acquire => {
                let _ = myself.cast(ReaderMsg::Acquire);
                return Ok(());
            }
            FetchStep::Read if fanout => {
                if self.held_after.is_some() {
                    return self.advance_fanout(myself).await;
                }
                self.pull(myself);
                return Ok(());
            }
            FetchStep::Read => match self.iterator.clone() {
                Some(iterator) => iterator,
                None => return Ok(()),
            },
        };
        let capabilities = self.args.streams.capabilities();
        let most = self
            .settings()
            .reader
            .max_records
            .min(capabilities.max_records_per_call);
        let granted = self.args.budget.grant();
        let Some(limit) =
            pure::fetch_limit(most, granted, self.record_memory, self.holds_nothing())
        else {
            // At its share of the memory budget: its acks (or the next poll, once
            // others' acks free room) wake it.
            self.budget_wait = true;
            self.settle_budget();
            self.schedule_fetch(myself, poll);
            return Ok(());
        };
        self.budget_wait = false;
        let call_started = Instant::now();
        let answer = self.args.streams.get_records(&iterator, limit).await;
        let took = call_started.elapsed();
        let fetched_at = Instant::now();
        // The grant becomes what the answer brought (exactly, before any other reader
        // asks): `deliver` settles again with what is kept of it.
        self.wants_more = matches!(&answer, Ok(batch) if !batch.records.is_empty());
        let incoming: u64 = answer
            .as_ref()
            .map_or(0, |b| b.records.iter().map(pure::record_memory).sum());
        self.args.budget.settle(
            self.ledger.memory() + self.held_memory + incoming,
            self.wants_more,
        );
        if answer.is_ok() {
            self.answered();
        }
        match answer {
            // Fenced while the call was out (the worker froze, the keeper found the
            // lease lost): these records are not handed over. The iterator is dropped,
            // so reading resumes after the last record delivered.
            Ok(_) if !self.may_deliver() => {
                self.iterator = None;
                self.settle_budget();
                self.schedule_fetch(myself, poll);
            }
            Ok(batch) => {
                self.read_ok(
                    batch.records.is_empty(),
                    batch.millis_behind_latest,
                    Some(took),
                );
                let read = pure::Read {
                    got_records: !batch.records.is_empty(),
                    caught_up: batch.millis_behind_latest.unwrap_or(0) == 0,
                    full_unmetered: !capabilities.calls_metered
                        && batch.records.len() >= limit as usize,
                };
                let at_end = batch.next_iterator.is_none();
                self.iterator = batch.next_iterator;
                self.deliver(
                    batch.records,
                    ReadFacts {
                        fetched_at,
                        end: at_end.then_some(batch.child_shards.as_deref().unwrap_or(&[])),
                    },
                )?;
                if at_end {
                    self.children = batch.child_shards;
                }
                if at_end {
                    info!(message = "Shard read to its end.", shard_id = %self.shard);
                    self.phase = Phase::Draining;
                    self.maybe_end_shard(myself);
                    return Ok(());
                }
                let (delay, idle) = pure::next_read(
                    read,
                    poll,
                    self.idle,
                    self.settings().reader.idle_max,
                    call_started.elapsed(),
                );
                self.idle = idle;
                self.schedule_fetch(myself, delay);
            }
            Err(StreamError::IteratorExpired { .. }) => {
                debug!(message = "Shard iterator expired; acquiring a new one.", shard_id = %self.shard);
                self.iterator = None;
                let _ = myself.cast(ReaderMsg::Acquire);
            }
            Err(error) if error.is_retryable() => {
                self.count_failure(Call::GetRecords, &error);
                let delay = self.backoff.next_random();
                debug!(message = "GetRecords failed; backing off.", shard_id = %self.shard, %error, delay_ms = delay.as_millis() as u64);
                // A fresh iterator from the last record delivered, now and then.
                if pure::renew_iterator(
                    matches!(error, StreamError::Transient { .. }),
                    self.failures_in_row,
                ) {
                    self.iterator = None;
                }
                self.schedule_fetch(myself, delay);
            }
            Err(error @ StreamError::Trimmed { .. }) => {
                return self.trimmed(myself, Call::GetRecords, &error).await;
            }
            Err(error) => {
                return Err(format!("shard {}: GetRecords: {error}", self.shard).into());
            }
        }
        Ok(())
    }

    /// Where reading was to resume is past the stream's retention. The loss is said and
    /// counted either way; then the reader stops (the shard restarts and fails again
    /// until an operator decides) or, where the settings allow it, goes on from the
    /// oldest change kept.
    async fn trimmed(
        &mut self,
        myself: &ActorRef<ReaderMsg>,
        call: Call,
        error: &StreamError,
    ) -> Result<(), ActorProcessingErr> {
        let from = match &self.last_delivered {
            Some(position) => position.to_string(),
            None => self.args.lease.checkpoint.to_string(),
        };
        let oldest_kept = self.oldest_kept().await;
        let going_on = self.settings().reader.trimmed_checkpoint == TrimmedCheckpoint::TrimHorizon;
        self.args.telemetry.emit(CheckpointTrimmed {
            shard: &self.args.lease.key,
            from: &from,
            oldest_kept: &oldest_kept,
            going_on,
        });
        if !going_on {
            return Err(format!(
                "shard {}: {}: {error}; the changes after {from} up to {oldest_kept} are lost. \
                 To go on from the oldest change kept, set reader.trimmed_checkpoint = \
                 \"trim_horizon\" or run `flotilla rewind --to trim-horizon`",
                self.shard,
                call.as_str()
            )
            .into());
        }
        self.last_delivered = None;
        self.skip_through = None;
        self.start_position = Some(IteratorPosition::TrimHorizon);
        self.iterator = None;
        let _ = myself.cast(ReaderMsg::Acquire);
        Ok(())
    }

    /// The oldest change the shard keeps, for the message about a trimmed checkpoint:
    /// its sequence number and time, or why it is not known.
    async fn oldest_kept(&self) -> String {
        let streams = &self.args.streams;
        let first = async {
            let iterator = streams
                .get_shard_iterator(
                    &self.args.stream,
                    &self.shard,
                    &IteratorPosition::TrimHorizon,
                )
                .await?;
            streams.get_records(&iterator, 1).await
        };
        match first.await {
            Ok(batch) => match batch.records.first() {
                Some(record) => match record.approximate_arrival {
                    Some(at) => format!(
                        "{} (made {})",
                        record.sequence_number,
                        humantime::format_rfc3339_seconds(at)
                    ),
                    None => record.sequence_number.to_string(),
                },
                None => "TRIM_HORIZON (the shard keeps no change now)".to_owned(),
            },
            Err(error) => format!("TRIM_HORIZON (not read: {error})"),
        }
    }

    fn count_failure(&mut self, call: Call, error: &StreamError) {
        self.throttled = error.call_failure() == CallFailure::Throttled;
        self.last_error = Some((error.to_string(), Instant::now()));
        self.failures_in_row += 1;
        if self.failures_in_row >= pure::STALL_REPORT_EVERY {
            self.read_stalled(format!(
                "cannot be read: {} failed {} times in a row: {error}",
                call.as_str(),
                self.failures_in_row
            ));
        }
        // A shard that cannot be read is a stall: say so at ERROR, not at every retry.
        if pure::stall_report_due(self.failures_in_row) {
            error!(
                message = "Shard not read: its calls keep failing; retrying with backoff.",
                shard_id = %self.shard,
                failures_in_row = self.failures_in_row,
                %error,
            );
        }
        self.args.telemetry.emit(CallFailed {
            call,
            shard: Some(&self.args.lease.key),
            error,
        });
        // A stall that lasts is sampled again each metrics interval.
        self.note_stall();
    }

    /// De-aggregates, drops what a checkpoint inside an aggregate already covers, and
    /// sends one batch to the processor; an empty one only as `reader.call_on_empty`
    /// asks ([`pure::call_on_empty`]).
    fn deliver(
        &mut self,
        raw: Vec<Record>,
        facts: ReadFacts<'_>,
    ) -> Result<(), ActorProcessingErr> {
        let read_nothing = raw.is_empty();
        let range = self.args.lease.hash_range;
        let records = pure::fresh_records(raw, range.as_ref(), &mut self.skip_through);
        let Some(last) = records.last() else {
            if !read_nothing {
                // All skipped: what the read brought is not kept.
                self.settle_budget();
            }
            let waiting = Arc::strong_count(&self.empty_slot) > 1;
            if pure::call_on_empty(self.settings().reader.call_on_empty, waiting) {
                self.send_batch(Batch {
                    shard: self.shard.clone(),
                    // No real batch has this id: an ack of it (there should be none,
                    // `ack_batch` skips empty batches) acks nothing.
                    id: BatchId(u64::MAX),
                    records: Arc::from(Vec::new()),
                    millis_behind_latest: self.millis_behind,
                    fetched_at: facts.fetched_at.into_std(),
                    delivered_at: Instant::now().into_std(),
                    at_shard_end: facts.end.is_some(),
                    child_shards: child_ids(facts.end),
                    _empty_slot: Some(self.empty_slot.clone()),
                })?;
            }
            return Ok(());
        };
        self.last_delivered = Some(pure::position_of(last));
        // Put → delivery, from the first (oldest) record's arrival: wall clocks, ours and
        // the stream's, so a skewed clock reads as 0 rather than as a negative wait.
        let waited = records
            .first()
            .and_then(|r| r.approximate_arrival)
            .map(|arrival| {
                SystemTime::now()
                    .duration_since(arrival)
                    .unwrap_or_default()
            });
        let bytes = pure::record_bytes(&records);
        let len = records.len();
        let now = Instant::now();
        if self.ledger.is_empty() {
            self.last_progress = now;
        }
        let records: Arc<[Record]> = Arc::from(records);
        let before = self.ledger.memory();
        let id = self.ledger.deliver(records.clone(), bytes, now);
        self.record_memory = ((self.ledger.memory() - before) / len as u64).max(1);
        self.settle_budget();
        // In the budget's message: no message more per batch.
        let mut samples = vec![Sample::new(
            Metric::BudgetBytesInUse,
            self.args.budget.usage().in_use as f64,
        )];
        if let Some(waited) = waited {
            let millis = waited.as_secs_f64() * 1000.0;
            samples.push(Sample::shard(
                Metric::PutToDeliveryTime,
                &self.args.lease.key,
                millis,
            ));
        }
        self.report(samples);
        let batch = Batch {
            shard: self.shard.clone(),
            id,
            records,
            millis_behind_latest: self.millis_behind,
            fetched_at: facts.fetched_at.into_std(),
            delivered_at: now.into_std(),
            at_shard_end: facts.end.is_some(),
            child_shards: child_ids(facts.end),
            _empty_slot: None,
        };
        self.records_delivered += len as u64;
        self.bytes_delivered += bytes;
        self.rate.add(len as u64, bytes);
        self.args
            .delivered
            .fetch_add(len as u64, std::sync::atomic::Ordering::Relaxed);
        self.args
            .lags
            .delivered(&self.args.lease.key, len as u64, bytes);
        self.send_batch(batch)
    }

    fn send_batch(&self, batch: Batch) -> Result<(), ActorProcessingErr> {
        if let Some(processor) = &self.processor {
            processor.cast(ProcessorMsg::Process(batch, self.checkpointer()))?;
        }
        Ok(())
    }

    fn checkpointer(&self) -> Checkpointer {
        Checkpointer {
            shard: self.shard.clone(),
            reader: self.me.clone(),
            mode: self.mode,
            worker: self.args.worker.clone(),
        }
    }

    fn on_acks(
        &mut self,
        myself: &ActorRef<ReaderMsg>,
        acks: Acks,
    ) -> Result<(), ActorProcessingErr> {
        let now = Instant::now();
        let acked = match acks {
            Acks::Batch(id) => self.ledger.ack([Ack::Batch(id)], now),
            Acks::Records(tokens) => self
                .ledger
                .ack(tokens.iter().map(|t| Ack::Record(t.batch, t.index)), now),
        };
        for error in &acked.errors {
            warn!(message = "Ack ignored.", shard_id = %self.shard, %error);
        }
        self.settle_budget();
        self.args.telemetry.emit(RecordsProcessed {
            shard: &self.args.lease.key,
            records: acked.processed_records,
            bytes: acked.processed_bytes,
            processing_time: acked.processing_time,
        });
        if acked.records > 0 {
            self.last_progress = now;
        }
        if self.mode.reader_checkpoints_acked_prefix()
            && let Some(at) = acked.checkpointable
        {
            self.send_advance(at);
        }
        match pure::after_ack(self.phase, self.window_full()) {
            AfterAck::MaybeEnd => self.maybe_end_shard(myself),
            AfterAck::Fetch => self.schedule_fetch(myself, Duration::ZERO),
            AfterAck::Nothing => {}
        }
        Ok(())
    }

    fn send_advance(&mut self, at: ExtendedSequenceNumber) {
        self.checkpoint = Some(Checkpoint::At(at.clone()));
        let _ = self.args.writer.cast(CheckpointMsg::Advance {
            key: self.key.clone(),
            fence: self.fence.clone(),
            at,
        });
    }

    fn manual_checkpoint(&mut self, at: ExtendedSequenceNumber) -> Result<(), CheckpointError> {
        match pure::manual_checkpoint(self.phase, &at, self.last_delivered.as_ref()) {
            Ok(()) => {
                self.send_advance(at);
                Ok(())
            }
            Err(refusal) => Err(self.refused(refusal, at)),
        }
    }

    /// The error a processor is given for a refused checkpoint.
    fn refused(&self, refusal: Refusal, requested: ExtendedSequenceNumber) -> CheckpointError {
        let shard = self.shard.clone();
        match refusal {
            Refusal::LeaseLost => CheckpointError::LeaseLost { shard },
            Refusal::BeyondDelivered => CheckpointError::BeyondDelivered {
                shard,
                requested,
                last: self
                    .last_delivered
                    .as_ref()
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| "none".to_owned()),
            },
            Refusal::BeforeCheckpoint => CheckpointError::BeforeCheckpoint {
                shard,
                requested,
                checkpoint: self
                    .checkpoint
                    .as_ref()
                    .map(|c| c.to_string())
                    .unwrap_or_else(|| "none".to_owned()),
            },
            Refusal::NotManual => CheckpointError::PrepareNeedsManualMode {
                shard,
                mode: self.mode,
            },
        }
    }

    /// Writes a prepared checkpoint ([`CheckpointMsg::Prepare`]) once the rules allow it.
    async fn prepare_checkpoint(
        &mut self,
        at: ExtendedSequenceNumber,
        state: Option<Vec<u8>>,
    ) -> Result<(), CheckpointError> {
        if let Err(refusal) = pure::prepare_checkpoint(
            self.mode,
            self.phase,
            &at,
            self.last_delivered.as_ref(),
            self.checkpoint.as_ref(),
        ) {
            return Err(self.refused(refusal, at));
        }
        let (key, fence) = (self.key.clone(), self.fence.clone());
        self.ask_writer(|reply| CheckpointMsg::Prepare {
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
        if let Err(refusal) = pure::manual_checkpoint(self.phase, &at, self.last_delivered.as_ref())
        {
            return Err(self.refused(refusal, at));
        }
        if !matches!(&self.checkpoint, Some(Checkpoint::At(done)) if *done >= at) {
            self.checkpoint = Some(Checkpoint::At(at.clone()));
        }
        let (key, fence) = (self.key.clone(), self.fence.clone());
        self.ask_writer(|reply| CheckpointMsg::Commit {
            key,
            fence,
            at,
            reply,
        })
        .await
    }

    async fn flush(&self) -> Result<(), CheckpointError> {
        let key = self.key.clone();
        self.ask_writer(|reply| CheckpointMsg::Flush { key, reply })
            .await
    }

    /// Asks the checkpoint writer for a write and waits for its answer, for the
    /// processor's checkpointer: a writer that does not answer is a checkpoint not
    /// written (yet).
    async fn ask_writer(
        &self,
        message: impl FnOnce(RpcReplyPort<Result<(), CheckpointError>>) -> CheckpointMsg,
    ) -> Result<(), CheckpointError> {
        ractor::call_t!(self.args.writer, message, WRITER_TIMEOUT_MS).map_err(|e| {
            CheckpointError::NotWritten {
                shard: self.shard.clone(),
                why: e.to_string(),
            }
        })?
    }

    fn maybe_end_shard(&mut self, myself: &ActorRef<ReaderMsg>) {
        if !pure::ready_to_end(self.phase, self.ledger.is_empty()) {
            return;
        }
        self.phase = Phase::Ending;
        self.ask_processor(myself, ProcessorMsg::ShardEnded);
    }

    /// Sends `shard_ended` or `shutdown_requested` and forwards the answer as
    /// `ProcessorDone`, which queues behind any acks the processor sent before answering.
    fn ask_processor(
        &self,
        myself: &ActorRef<ReaderMsg>,
        message: fn(Checkpointer, RpcReplyPort<Result<(), String>>) -> ProcessorMsg,
    ) {
        let Some(processor) = &self.processor else {
            let _ = myself.cast(ReaderMsg::ProcessorDone(Ok(())));
            return;
        };
        let checkpointer = self.checkpointer();
        let (tx, rx) = ractor::concurrency::oneshot();
        if processor.cast(message(checkpointer, tx.into())).is_err() {
            let _ = myself.cast(ReaderMsg::ProcessorDone(Err(ProcessorFailure::Stopped)));
            return;
        }
        let timeout = self.settings().supervision.shutdown_timeout;
        let reader = myself.clone();
        tokio::spawn(async move {
            let result = match tokio::time::timeout(timeout, rx).await {
                Ok(Ok(result)) => result.map_err(ProcessorFailure::Returned),
                Ok(Err(_)) => Err(ProcessorFailure::NoAnswer),
                Err(_) => Err(ProcessorFailure::TimedOut(timeout)),
            };
            let _ = reader.cast(ReaderMsg::ProcessorDone(result));
        });
    }

    async fn processor_done(
        &mut self,
        myself: &ActorRef<ReaderMsg>,
        result: Result<(), ProcessorFailure>,
    ) -> Result<(), ActorProcessingErr> {
        match self.phase {
            Phase::Ending => {
                if let Err(error) = result {
                    return Err(format!("shard {}: shard_ended failed: {error}", self.shard).into());
                }
                let children: Vec<ShardId> = child_ids(self.children.as_deref());
                let key = self.key.clone();
                let fence = self.fence.clone();
                let written = ractor::call_t!(
                    self.args.writer,
                    |reply| CheckpointMsg::ShardEnd {
                        key,
                        fence,
                        children,
                        reply
                    },
                    WRITER_TIMEOUT_MS
                );
                match written {
                    Ok(Ok(())) => {
                        self.checkpoint = Some(Checkpoint::ShardEnd);
                        let _ = self.args.supervisor.cast(SupervisorMsg::ShardFinished {
                            key: self.key.clone(),
                            children: pure::reported_children(
                                self.children.take(),
                                self.args.lease.hash_range.as_ref(),
                            ),
                        });
                        self.stop_processor().await;
                        myself.stop(StopReason::ShardEnd.text());
                    }
                    Ok(Err(CheckpointError::LeaseLost { .. })) => {
                        self.stop_processor().await;
                        myself.stop(StopReason::LeaseLost.text());
                    }
                    Ok(Err(error)) => {
                        return Err(
                            format!("shard {}: SHARD_END checkpoint: {error}", self.shard).into(),
                        );
                    }
                    Err(error) => {
                        return Err(
                            format!("shard {}: SHARD_END checkpoint: {error}", self.shard).into(),
                        );
                    }
                }
            }
            Phase::ShuttingDown => {
                let flushed = self.flush().await;
                let outcome = ShardShutdown {
                    shard_id: self.shard.clone(),
                    processor_ok: result.is_ok(),
                    checkpoint_flushed: flushed.is_ok(),
                    error: match (&result, &flushed) {
                        (Err(e), _) => Some(format!("shutdown_requested: {e}")),
                        (_, Err(e)) => Some(e.to_string()),
                        _ => None,
                    },
                };
                if let Some(reply) = self.shutdown_reply.take() {
                    let _ = reply.send(outcome);
                }
                self.stop_processor().await;
                myself.stop(StopReason::Shutdown.text());
            }
            _ => {}
        }
        Ok(())
    }

    async fn stop_processor(&mut self) {
        if let Some(processor) = self.processor.take() {
            let _ = processor
                .stop_and_wait(None, Some(Duration::from_secs(5)))
                .await;
        }
    }

    fn lease_lost(&mut self, myself: &ActorRef<ReaderMsg>) {
        if matches!(self.phase, Phase::LeaseLost) {
            return;
        }
        info!(message = "Lease lost; stopping the shard.", shard_id = %self.shard);
        self.revoked.store(true, Ordering::Release);
        self.drop_feed();
        self.phase = Phase::LeaseLost;
        let _ = self
            .args
            .writer
            .cast(CheckpointMsg::Forget(self.key.clone()));
        match &self.processor {
            Some(processor) if processor.cast(ProcessorMsg::LeaseLost).is_ok() => {
                myself.send_after(self.settings().supervision.shutdown_timeout, || {
                    ReaderMsg::StopNow
                });
            }
            _ => myself.stop(StopReason::LeaseLost.text()),
        }
    }

    fn shutdown(&mut self, myself: &ActorRef<ReaderMsg>, reply: RpcReplyPort<ShardShutdown>) {
        if pure::already_stopping(self.phase) {
            let _ = reply.send(ShardShutdown {
                shard_id: self.shard.clone(),
                processor_ok: true,
                checkpoint_flushed: false,
                error: Some(format!("the shard was already stopping ({:?})", self.phase)),
            });
            return;
        }
        self.phase = Phase::ShuttingDown;
        self.stopping.store(true, Ordering::Release);
        self.drop_feed();
        self.shutdown_reply = Some(reply);
        self.ask_processor(myself, ProcessorMsg::ShutdownRequested);
    }

    /// Why the shard is stalled now, if it is: it cannot be read, or its processor has
    /// waited past its stall time (`pure::processor_stall_time`).
    fn stall(&self) -> Option<String> {
        if !pure::may_stall(self.phase) {
            return None;
        }
        if let Some(why) = &self.read_stall {
            return Some(why.clone());
        }
        let wait = self.wait.get()?;
        let waited = wait.since.elapsed();
        let after =
            pure::processor_stall_time(wait.limit, self.settings().reader.processor_timeout);
        (waited >= after).then(|| format!("{} for {} s", wait.what, waited.as_secs()))
    }

    /// Says a change of stall once (an ERROR when one starts, an INFO when it ends) and
    /// keeps the shard's gauge: 1 while stalled (sampled again every metrics interval),
    /// 0 once not.
    fn note_stall(&mut self) {
        let now = Instant::now();
        match (self.stalled, self.stall()) {
            (None, Some(reason)) => {
                self.args.telemetry.emit(ShardStalled {
                    key: &self.args.lease.key,
                    reason: &reason,
                });
                self.stalled = Some((now, now));
            }
            // Processed again; or stopping (a shutdown, a lost lease), which is no news
            // of the stall: the gauge alone is ended.
            (Some((since, _)), None) if pure::may_stall(self.phase) => {
                self.args.telemetry.emit(ShardUnstalled {
                    key: &self.args.lease.key,
                    stalled_for: now.saturating_duration_since(since),
                });
                self.stalled = None;
            }
            (Some(_), None) => {
                self.report(vec![Sample::shard(
                    Metric::ShardsStalled,
                    &self.args.lease.key,
                    0.0,
                )]);
                self.stalled = None;
            }
            (Some((since, sampled)), Some(_))
                if now.saturating_duration_since(sampled) >= self.settings().metrics.interval =>
            {
                self.report(vec![Sample::shard(
                    Metric::ShardsStalled,
                    &self.args.lease.key,
                    1.0,
                )]);
                self.stalled = Some((since, now));
            }
            _ => {}
        }
    }

    /// The shard cannot be read, for `why`: the first reason of a run is kept.
    fn read_stalled(&mut self, why: String) {
        if self.read_stall.is_none() {
            self.read_stall = Some(why);
            self.note_stall();
        }
    }

    /// A read or a subscription succeeded: the shard can be read again.
    fn read_again(&mut self) {
        if self.read_stall.take().is_some() {
            self.note_stall();
        }
    }

    fn status(&self) -> ShardStatus {
        let stall = self.stall();
        ShardStatus {
            shard_id: self.shard.clone(),
            stream: self.args.lease.key.stream_name().map(str::to_owned),
            state: pure::shard_state(
                self.phase,
                Signals {
                    fenced: self.fenced.is_some(),
                    throttled: self.throttled,
                    caught_up: self.caught_up,
                    budget_wait: self.budget_wait,
                    stalled: stall.is_some(),
                },
            ),
            lease_counter: self.fence.counter,
            checkpoint: self.checkpoint.as_ref().map(|c| c.to_string()),
            last_delivered: self.last_delivered.as_ref().map(|p| p.to_string()),
            millis_behind_latest: self.millis_behind,
            records_delivered: self.records_delivered,
            bytes_delivered: self.bytes_delivered,
            records_per_second: self.rate.per_second().0,
            bytes_per_second: self.rate.per_second().1,
            last_error: self.last_error.as_ref().map(|(error, _)| error.clone()),
            last_error_ms_ago: self
                .last_error
                .as_ref()
                .map(|(_, at)| at.elapsed().as_millis() as u64),
            in_flight_records: self.ledger.in_flight_records() as u64,
            in_flight_bytes: self.ledger.in_flight_bytes(),
            memory_bytes: self.ledger.memory() + self.held_memory,
            restarts: self.args.restarts,
            fenced: self.fenced.clone(),
            stall,
            subscription: self.args.consumer.as_ref().map(|_| SubscriptionView {
                state: if self.feed.is_some() { "open" } else { "none" },
                age_ms: self
                    .feed
                    .as_ref()
                    .map(|f| f.since.elapsed().as_millis() as u64),
                events: self.feed.as_ref().map_or(0, |f| f.events),
                subscriptions: self.subscriptions,
            }),
        }
    }
}

/// Records and bytes per second over the last full second (or, after a pause, since
/// the last delivery), for the status page.
struct RateMeter {
    since: Instant,
    records: u64,
    bytes: u64,
    last: (f64, f64),
}

impl RateMeter {
    fn new() -> Self {
        Self {
            since: Instant::now(),
            records: 0,
            bytes: 0,
            last: (0.0, 0.0),
        }
    }

    fn add(&mut self, records: u64, bytes: u64) {
        self.records += records;
        self.bytes += bytes;
        let secs = self.since.elapsed().as_secs_f64();
        if secs >= 1.0 {
            self.last = (self.records as f64 / secs, self.bytes as f64 / secs);
            *self = Self {
                last: self.last,
                ..Self::new()
            };
        }
    }

    fn per_second(&self) -> (f64, f64) {
        let secs = self.since.elapsed().as_secs_f64();
        if secs >= 2.0 {
            (self.records as f64 / secs, self.bytes as f64 / secs)
        } else {
            self.last
        }
    }
}
