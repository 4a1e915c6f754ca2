//! The user's side of a shard: the [`Processor`] trait, the [`Batch`] it is handed, the
//! [`Checkpointer`] it acks and checkpoints through, and the actor that hosts it.
//!
//! One processor per held lease, created by the user's factory. The host actor runs the
//! processor's calls one at a time, in order, so a processor never sees two batches at
//! once and needs no locks. Its reader keeps fetching meanwhile (up to the ack window).

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;

mod lanes;
mod relay;
use ractor::{Actor, ActorCell, ActorProcessingErr, ActorRef};

use crate::failure::driver::{Failures, Host, Ran};
use crate::fencing::{FenceReason, Fencing};
use crate::model::{Fence, LeaseKey, ShardId};
pub use crate::protocol::ProcessorError;
use crate::protocol::{
    AckToken, Batch, Checkpointer, FailureNews, ProcessorMsg, ReaderMsg, ShardInfo, StopReason,
};
use crate::settings::CheckpointMode;
use crate::spans::Spanned;

/// What a user implements: one instance per shard, called one method at a time.
///
/// Returning `Err` from `process` (or panicking) fails the shard: it restarts from its
/// last checkpoint after a backoff, so the batch is delivered again. Exactly one of
/// `lease_lost`, `shard_ended` or `shutdown_requested` ends a processor's life.
///
/// ```
/// use flotilla_actors::{Batch, Checkpointer, Processor, ProcessorError};
///
/// struct CountBytes(u64);
///
/// impl Processor for CountBytes {
///     async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
///         self.0 += batch.records().iter().map(|r| r.data.len() as u64).sum::<u64>();
///         Ok(())
///     }
/// }
/// ```
pub trait Processor: Send + 'static {
    /// Called once before the first batch. `shard.pending_checkpoint` (and its state)
    /// is what the last owner prepared and did not commit: reconcile it here.
    fn initialize(
        &mut self,
        shard: &ShardInfo,
    ) -> impl Future<Output = Result<(), ProcessorError>> + Send {
        let _ = shard;
        async { Ok(()) }
    }

    /// Called with each batch in order; with `reader.call_on_empty` also with an empty
    /// one when a read brought nothing (for work done on time, on an idle shard).
    fn process(
        &mut self,
        batch: &Batch,
        checkpointer: &Checkpointer,
    ) -> impl Future<Output = Result<(), ProcessorError>> + Send;

    /// Another worker owns the shard now. Checkpointing is no longer possible.
    fn lease_lost(&mut self) -> impl Future<Output = ()> + Send {
        async {}
    }

    /// Every record of the shard has been delivered and acked. flotilla writes the
    /// SHARD_END checkpoint after this returns Ok.
    fn shard_ended(
        &mut self,
        checkpointer: &Checkpointer,
    ) -> impl Future<Output = Result<(), ProcessorError>> + Send {
        let _ = checkpointer;
        async { Ok(()) }
    }

    /// The worker is stopping: finish up and checkpoint (auto and watermark modes
    /// flush what has been acked after this returns).
    fn shutdown_requested(
        &mut self,
        checkpointer: &Checkpointer,
    ) -> impl Future<Output = Result<(), ProcessorError>> + Send {
        let _ = checkpointer;
        async { Ok(()) }
    }
}

/// The object-safe form of [`Processor`], so one host type serves every user type.
trait DynProcessor: Send + 'static {
    fn initialize<'a>(
        &'a mut self,
        shard: &'a ShardInfo,
    ) -> BoxFuture<'a, Result<(), ProcessorError>>;
    fn process<'a>(
        &'a mut self,
        batch: &'a Batch,
        checkpointer: &'a Checkpointer,
    ) -> BoxFuture<'a, Result<(), ProcessorError>>;
    fn lease_lost(&mut self) -> BoxFuture<'_, ()>;
    fn shard_ended<'a>(
        &'a mut self,
        checkpointer: &'a Checkpointer,
    ) -> BoxFuture<'a, Result<(), ProcessorError>>;
    fn shutdown_requested<'a>(
        &'a mut self,
        checkpointer: &'a Checkpointer,
    ) -> BoxFuture<'a, Result<(), ProcessorError>>;
}

impl<P: Processor> DynProcessor for P {
    fn initialize<'a>(
        &'a mut self,
        shard: &'a ShardInfo,
    ) -> BoxFuture<'a, Result<(), ProcessorError>> {
        Box::pin(Processor::initialize(self, shard))
    }
    fn process<'a>(
        &'a mut self,
        batch: &'a Batch,
        checkpointer: &'a Checkpointer,
    ) -> BoxFuture<'a, Result<(), ProcessorError>> {
        Box::pin(Processor::process(self, batch, checkpointer))
    }
    fn lease_lost(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(Processor::lease_lost(self))
    }
    fn shard_ended<'a>(
        &'a mut self,
        checkpointer: &'a Checkpointer,
    ) -> BoxFuture<'a, Result<(), ProcessorError>> {
        Box::pin(Processor::shard_ended(self, checkpointer))
    }
    fn shutdown_requested<'a>(
        &'a mut self,
        checkpointer: &'a Checkpointer,
    ) -> BoxFuture<'a, Result<(), ProcessorError>> {
        Box::pin(Processor::shutdown_requested(self, checkpointer))
    }
}

/// What a shard's processor is waiting on outside the worker, and since when: written by
/// a processor that waits on something it can name (the MultiLang child's answer), read
/// by the shard's reader, which reports a wait past its stall time as a stalled
/// processor. Reached by the processor through the task-local its host runs each call
/// in ([`ProcessorWait::current`]), so the [`Processor`] trait stays as it is.
///
/// With lanes (`processor.parallelism`), each lane's processor writes its own slot of
/// the one board ([`ProcessorWait::lane`]), and the reader sees the oldest wait of any
/// lane: one lane's call ending never hides another's wait.
#[derive(Debug, Clone, Default)]
pub(crate) struct ProcessorWait {
    inner: Arc<WaitInner>,
    /// This processor's slot: its lane (0 with one lane).
    slot: usize,
}

#[derive(Debug, Default)]
struct WaitInner {
    /// Each lane's wait, by slot.
    wait: std::sync::Mutex<Vec<Option<Waiting>>>,
    /// The reader, told once, at the first wait, to start watching (a processor that
    /// never waits costs its reader nothing).
    reader: Option<ActorRef<crate::protocol::ReaderMsg>>,
    told: AtomicBool,
}

/// One wait: what has not happened yet, since when, and the processor's own limit on it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Waiting {
    /// What has not happened, as the stall's reason reads before "for N s": `the
    /// MultiLang child has not answered processRecords`.
    pub what: String,
    pub since: tokio::time::Instant,
    /// The processor's own limit on the wait (the MultiLang watchdog), if it has one.
    pub limit: Option<Duration>,
}

tokio::task_local! {
    static CURRENT_WAIT: ProcessorWait;
}

impl ProcessorWait {
    /// The board of `reader`'s shard.
    pub(crate) fn new(reader: ActorRef<crate::protocol::ReaderMsg>) -> Self {
        Self {
            inner: Arc::new(WaitInner {
                reader: Some(reader),
                ..WaitInner::default()
            }),
            slot: 0,
        }
    }

    /// The same board, as lane `lane`'s processor writes it.
    pub(crate) fn lane(&self, lane: usize) -> Self {
        Self {
            inner: self.inner.clone(),
            slot: lane,
        }
    }

    /// The board of the shard whose processor call runs in this task; `None` outside a
    /// processor host (a processor driven directly, in a test).
    pub(crate) fn current() -> Option<Self> {
        CURRENT_WAIT.try_with(Clone::clone).ok()
    }

    /// Runs one processor call with this board as the task's [`Self::current`]; whatever
    /// wait the call leaves behind ends with it.
    async fn scope<F: Future>(&self, call: F) -> F::Output {
        let output = CURRENT_WAIT.scope(self.clone(), call).await;
        self.end();
        output
    }

    /// The processor waits for `what` from now, up to its own `limit`.
    pub(crate) fn begin(&self, what: String, limit: Option<Duration>) {
        self.set(Some(Waiting {
            what,
            since: tokio::time::Instant::now(),
            limit,
        }));
        if !self.inner.told.swap(true, Ordering::AcqRel)
            && let Some(reader) = &self.inner.reader
        {
            let _ = reader.cast(crate::protocol::ReaderMsg::WatchWaits);
        }
    }

    /// The wait is over.
    pub(crate) fn end(&self) {
        self.set(None);
    }

    fn set(&self, waiting: Option<Waiting>) {
        if let Ok(mut waits) = self.inner.wait.lock() {
            if waits.len() <= self.slot {
                waits.resize(self.slot + 1, None);
            }
            waits[self.slot] = waiting;
        }
    }

    /// The wait going on now, if any: of several lanes', the oldest.
    pub(crate) fn get(&self) -> Option<Waiting> {
        let waits = self.inner.wait.lock().ok()?;
        waits.iter().flatten().min_by_key(|w| w.since).cloned()
    }
}

/// Creates the processor for a shard. Called again after each restart.
pub(crate) type ProcessorFactory = Arc<dyn Fn(&ShardInfo) -> BoxedProcessor + Send + Sync>;

/// A user processor behind the object-safe interface.
pub(crate) struct BoxedProcessor(Box<dyn DynProcessor>);

impl BoxedProcessor {
    pub(crate) fn new<P: Processor>(processor: P) -> Self {
        Self(Box::new(processor))
    }
}

impl fmt::Debug for BoxedProcessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("BoxedProcessor")
    }
}

/// Creates a user's own processor actor for a shard (the advanced route).
pub type ProcessorActorFactory = Arc<
    dyn Fn(ShardInfo) -> BoxFuture<'static, Result<ActorRef<ProcessorMsg>, String>> + Send + Sync,
>;

/// Where a shard's batches go.
#[derive(Clone)]
pub(crate) enum ProcessorSource {
    Factory(ProcessorFactory),
    Actor(ProcessorActorFactory),
}

impl ProcessorSource {
    /// Starts the processor of one shard, linked to `parent` (its reader): with
    /// `lanes` above 1, a dealer in front of that many processors (`lanes`), else the
    /// one processor.
    pub(crate) async fn start(
        &self,
        info: &ShardInfo,
        host: HostArgs,
        lanes: u16,
        parent: ActorCell,
    ) -> Result<ActorRef<ProcessorMsg>, ActorProcessingErr> {
        if lanes <= 1 {
            return self.start_one(info, host, parent).await;
        }
        let args = lanes::DealerArgs {
            source: self.clone(),
            info: info.clone(),
            host,
            lanes,
        };
        let dealer = Spanned(lanes::Dealer, tracing::Span::current());
        let (actor, _) = Actor::spawn_linked(None, dealer, args, parent).await?;
        Ok(actor)
    }

    /// Starts one processor, linked to `parent`: a host actor around the user's
    /// [`Processor`], or the user's own actor.
    async fn start_one(
        &self,
        info: &ShardInfo,
        host: HostArgs,
        parent: ActorCell,
    ) -> Result<ActorRef<ProcessorMsg>, ActorProcessingErr> {
        match self {
            ProcessorSource::Factory(factory) => {
                let processor = factory(info);
                // In the span of whoever starts it: its reader's, the shard's.
                let host_actor = Spanned(ProcessorHost, tracing::Span::current());
                let (actor, _) =
                    Actor::spawn_linked(None, host_actor, (processor, host), parent).await?;
                Ok(actor)
            }
            // Under `[failure]`, the actor runs behind a host like a `Processor` does,
            // so the policy is the same (`relay`).
            ProcessorSource::Actor(factory) if host.failures.is_some() => {
                let relay = BoxedProcessor::new(relay::ActorRelay::new(factory.clone(), host.mode));
                let host_actor = Spanned(ProcessorHost, tracing::Span::current());
                let (actor, _) =
                    Actor::spawn_linked(None, host_actor, (relay, host), parent).await?;
                Ok(actor)
            }
            ProcessorSource::Actor(factory) => {
                let actor = factory(info.clone()).await.map_err(|e| {
                    format!("shard {}: processor actor factory: {e}", info.shard_id)
                })?;
                actor.link(parent);
                Ok(actor)
            }
        }
    }
}

/// Hosts one user processor. It stops delivering batches the moment its lease is
/// revoked or its shard starts stopping, even those already queued in its mailbox.
pub(crate) struct ProcessorHost;

#[derive(Clone)]
pub(crate) struct HostArgs {
    pub mode: CheckpointMode,
    /// What the processor waits on, shared with the reader (see [`ProcessorWait`]).
    pub wait: ProcessorWait,
    pub revoked: Arc<AtomicBool>,
    /// The shard is stopping (shutdown, handoff): queued batches are skipped.
    pub stopping: Arc<AtomicBool>,
    pub fence: HostFence,
    /// `[failure]`'s policy, when it is on: a failed batch is retried, bisected and
    /// discarded here rather than failing the shard.
    pub failures: Option<Failures>,
}

/// When the host may hand a batch to its processor: while [`Fencing`] allows the lease
/// it was started under.
#[derive(Clone)]
pub(crate) struct HostFence {
    pub fencing: Fencing,
    pub key: LeaseKey,
    pub fence: Fence,
    pub recheck: Duration,
}

pub(crate) struct HostState {
    processor: BoxedProcessor,
    mode: CheckpointMode,
    wait: ProcessorWait,
    revoked: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
    fence: HostFence,
    failures: Option<Failures>,
    finished: bool,
}

impl Actor for ProcessorHost {
    type Msg = ProcessorMsg;
    type State = HostState;
    type Arguments = (BoxedProcessor, HostArgs);

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        (processor, args): (BoxedProcessor, HostArgs),
    ) -> Result<HostState, ActorProcessingErr> {
        Ok(HostState {
            processor,
            mode: args.mode,
            wait: args.wait,
            revoked: args.revoked,
            stopping: args.stopping,
            fence: args.fence,
            failures: args.failures,
            finished: false,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: ProcessorMsg,
        state: &mut HostState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ProcessorMsg::Initialize(info) => {
                state
                    .wait
                    .scope(state.processor.0.initialize(&info))
                    .await
                    .map_err(|e| failure("initialize", &info.shard_id, e))?;
            }
            ProcessorMsg::Process(mut batch, checkpointer) => {
                if !may_deliver(
                    &state.fence,
                    &state.revoked,
                    &state.stopping,
                    state.finished,
                )
                .await
                {
                    return Ok(());
                }
                // Mutant CheckpointBeforeProcessed: the batch counts as done before the
                // processor has it.
                if crate::mutants::active(crate::mutants::Mutant::CheckpointBeforeProcessed) {
                    checkpointer.ack_batch(&batch);
                }
                batch.delivered_at = tokio::time::Instant::now().into_std();
                let done = match &state.failures {
                    None => {
                        state
                            .wait
                            .scope(state.processor.0.process(&batch, &checkpointer))
                            .await
                            .map_err(|e| failure("process", &batch.shard, e))?;
                        true
                    }
                    Some(failures) => {
                        let mut host = PolicyHost {
                            processor: &mut state.processor,
                            wait: &state.wait,
                            checkpointer: &checkpointer,
                            fence: &state.fence,
                            revoked: &state.revoked,
                            stopping: &state.stopping,
                            host_acks: state.mode.host_acks_each_batch(),
                        };
                        failures.run(&batch, &mut host).await == Ran::Done
                    }
                };
                if done && state.mode.host_acks_each_batch() {
                    checkpointer.ack_batch(&batch);
                }
            }
            ProcessorMsg::LeaseLost => {
                if !state.finished {
                    state.finished = true;
                    state.wait.scope(state.processor.0.lease_lost()).await;
                }
                myself.stop(StopReason::LeaseLost.text());
            }
            ProcessorMsg::ShardEnded(checkpointer, reply) => {
                let result = state
                    .wait
                    .scope(state.processor.0.shard_ended(&checkpointer))
                    .await;
                state.finished = true;
                let _ = reply.send(result.map_err(|e| e.to_string()));
            }
            ProcessorMsg::ShutdownRequested(checkpointer, reply) => {
                let result = state
                    .wait
                    .scope(state.processor.0.shutdown_requested(&checkpointer))
                    .await;
                state.finished = true;
                let _ = reply.send(result.map_err(|e| e.to_string()));
            }
        }
        Ok(())
    }
}

/// The host as the failure policy's driver sees it, for one batch.
struct PolicyHost<'s> {
    processor: &'s mut BoxedProcessor,
    wait: &'s ProcessorWait,
    checkpointer: &'s Checkpointer,
    fence: &'s HostFence,
    revoked: &'s AtomicBool,
    stopping: &'s AtomicBool,
    host_acks: bool,
}

impl Host for PolicyHost<'_> {
    fn process<'a>(&'a mut self, part: &'a Batch) -> BoxFuture<'a, Result<(), ProcessorError>> {
        Box::pin(
            self.wait
                .scope(self.processor.0.process(part, self.checkpointer)),
        )
    }

    fn may_deliver(&self) -> BoxFuture<'_, bool> {
        Box::pin(may_deliver(self.fence, self.revoked, self.stopping, false))
    }

    fn tell(&self, news: FailureNews) {
        let _ = self.checkpointer.reader.cast(ReaderMsg::Failure(news));
    }

    fn ack_records(&self, tokens: Vec<AckToken>) {
        if !self.host_acks {
            self.checkpointer.ack_all(tokens);
        }
    }

    fn pause(&self, delay: Duration) -> BoxFuture<'_, ()> {
        /// How often a pause looks whether the shard stops.
        const LOOK: Duration = Duration::from_millis(100);
        let (revoked, stopping) = (self.revoked, self.stopping);
        Box::pin(async move {
            let end = tokio::time::Instant::now() + delay;
            loop {
                let now = tokio::time::Instant::now();
                if now >= end || revoked.load(Ordering::Acquire) || stopping.load(Ordering::Acquire)
                {
                    return;
                }
                tokio::time::sleep((end - now).min(LOOK)).await;
            }
        })
    }
}

/// Whether the host may hand a batch to its processor now: waits while the worker is
/// fenced (another worker may take the lease once the failover time passes, so blocking
/// the mailbox is the point); `false` once the lease is revoked or lost, or the shard
/// stops or has finished (a shutdown or handoff skips the batches queued behind the one
/// in hand: they are not acked, so the next owner starts with them).
async fn may_deliver(
    fence: &HostFence,
    revoked: &AtomicBool,
    stopping: &AtomicBool,
    finished: bool,
) -> bool {
    loop {
        match fence.fencing.check(&fence.key, &fence.fence) {
            Ok(()) => break,
            Err(FenceReason::Revoked { .. } | FenceReason::NotHeld) => return false,
            // Revoked by the reader, or stopping: do not wait out the fence.
            Err(_) if revoked.load(Ordering::Acquire) || stopping.load(Ordering::Acquire) => {
                return false;
            }
            Err(_) => tokio::time::sleep(fence.recheck).await,
        }
    }
    !(finished || revoked.load(Ordering::Acquire) || stopping.load(Ordering::Acquire))
}

fn failure(call: &str, shard: &ShardId, error: ProcessorError) -> ActorProcessingErr {
    format!("shard {shard}: processor {call} failed: {error}").into()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::backend::Record;
    use crate::handle::WorkerHandle;
    use crate::model::{BatchId, SequenceNumber, WorkerId};
    use crate::settings::CheckpointMode;
    use tokio::sync::Notify;

    /// Stands in for the shard reader: takes the acks and drops them.
    struct NoReader;

    impl Actor for NoReader {
        type Msg = ReaderMsg;
        type State = ();
        type Arguments = ();
        async fn pre_start(&self, _: ActorRef<ReaderMsg>, _: ()) -> Result<(), ActorProcessingErr> {
            Ok(())
        }
    }

    /// Records the first record's sequence number of each batch; the first batch waits
    /// for `release`.
    struct Recorder {
        seen: Arc<std::sync::Mutex<Vec<String>>>,
        release: Arc<Notify>,
    }

    impl Processor for Recorder {
        async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
            let first = batch.records()[0].sequence_number.to_string();
            let wait = self.seen.lock().unwrap().is_empty();
            self.seen.lock().unwrap().push(first);
            if wait {
                self.release.notified().await;
            }
            Ok(())
        }
    }

    fn batch(shard: &ShardId, id: u64, seq: u64) -> Batch {
        let record = Record {
            sequence_number: SequenceNumber::parse(&seq.to_string()).unwrap(),
            sub_sequence_number: 0,
            partition_key: "k".into(),
            explicit_hash_key: None,
            data: bytes::Bytes::from_static(b"x"),
            approximate_arrival: None,
        };
        let now = tokio::time::Instant::now().into_std();
        Batch {
            shard: shard.clone(),
            id: BatchId(id),
            records: Arc::from(vec![record]),
            millis_behind_latest: None,
            fetched_at: now,
            delivered_at: now,
            at_shard_end: false,
            child_shards: Arc::from(Vec::new()),
            positions: None,
            _empty_slot: None,
        }
    }

    /// With lanes, each lane writes its own slot of the shard's wait board and the
    /// reader sees the oldest wait: a lane's call that ends does not hide another's.
    #[tokio::test(start_paused = true)]
    async fn the_oldest_lane_wait_is_the_shards() {
        let board = ProcessorWait::default();
        let (first, second) = (board.lane(0), board.lane(3));
        first.begin("lane 0 waits".into(), None);
        tokio::time::sleep(Duration::from_secs(1)).await;
        second.begin("lane 3 waits".into(), None);
        assert_eq!(board.get().unwrap().what, "lane 0 waits");
        second.end();
        assert_eq!(board.get().unwrap().what, "lane 0 waits");
        second.begin("lane 3 again".into(), None);
        first.end();
        assert_eq!(board.get().unwrap().what, "lane 3 again");
        second.end();
        assert_eq!(board.get(), None);
    }

    /// The keeper revokes a lease while the host is busy with a batch and two more are
    /// queued: the one in hand finishes, the queued ones never reach the processor,
    /// although the reader has not been told yet.
    #[tokio::test(start_paused = true)]
    async fn batches_queued_behind_a_revocation_are_not_handed_over() {
        let shard = ShardId::from_index(0);
        let key = LeaseKey::from(&shard);
        let fence = Fence {
            owner: Some(WorkerId::new("me")),
            counter: 4,
        };
        let fencing = Fencing::new(Duration::from_secs(7));
        {
            let mut board = fencing.lock();
            let now = tokio::time::Instant::now();
            board.heartbeat_confirmed(now, now);
            board.hold(&key, &fence, now);
        }
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let release = Arc::new(Notify::new());
        let (reader, _) = Actor::spawn(None, NoReader, ()).await.unwrap();
        let (host, _) = Actor::spawn(
            None,
            ProcessorHost,
            (
                BoxedProcessor::new(Recorder {
                    seen: seen.clone(),
                    release: release.clone(),
                }),
                HostArgs {
                    mode: CheckpointMode::Auto,
                    wait: ProcessorWait::default(),
                    revoked: Arc::new(AtomicBool::new(false)),
                    stopping: Arc::new(AtomicBool::new(false)),
                    fence: HostFence {
                        fencing: fencing.clone(),
                        key: key.clone(),
                        fence: fence.clone(),
                        recheck: Duration::from_millis(100),
                    },
                    failures: None,
                },
            ),
        )
        .await
        .unwrap();
        let checkpointer = Checkpointer {
            shard: shard.clone(),
            reader: reader.clone(),
            mode: CheckpointMode::Auto,
            worker: WorkerHandle::new(),
            relay: None,
            lane: None,
        };
        for (id, seq) in [(1, 10), (2, 20), (3, 30)] {
            host.cast(ProcessorMsg::Process(
                batch(&shard, id, seq),
                checkpointer.clone(),
            ))
            .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(*seen.lock().unwrap(), vec!["10".to_owned()]);
        fencing
            .lock()
            .revoke(&key, &fence, "taken by another worker");
        release.notify_one();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(*seen.lock().unwrap(), vec!["10".to_owned()]);
        host.stop(None);
        reader.stop(None);
    }
}
