//! The user's side of a shard: the [`Processor`] trait, the [`Batch`] it is handed, the
//! [`Checkpointer`] it acks and checkpoints through, and the actor that hosts it.
//!
//! One processor per held lease, created by the user's factory. The host actor runs the
//! processor's calls one at a time, in order, so a processor never sees two batches at
//! once and needs no locks. Its reader keeps fetching meanwhile (up to the ack window).

use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::backend::Record;
use crate::fencing::{FenceReason, Fencing};
use crate::handle::WorkerHandle;
use crate::model::{
    BatchId, Checkpoint, ExtendedSequenceNumber, Fence, HashKeyRange, LeaseKey, ShardId,
};
use crate::settings::CheckpointMode;
use crate::shard_reader::{Acks, ReaderMsg};

/// What a processor learns about its shard when it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardInfo {
    pub shard_id: ShardId,
    /// The shards this one was split or merged from; all of them are finished.
    pub parents: Vec<ShardId>,
    pub hash_range: Option<HashKeyRange>,
    /// Where reading starts: the last checkpoint, or the initial position.
    pub starting_at: Checkpoint,
}

/// Records fetched by one GetRecords call (de-aggregated), in sequence order. Cheap to
/// clone: the records are shared, not copied.
#[derive(Debug, Clone)]
pub struct Batch {
    pub(crate) shard: ShardId,
    pub(crate) id: BatchId,
    pub(crate) records: Arc<[Record]>,
    pub(crate) millis_behind_latest: Option<u64>,
}

impl Batch {
    pub fn shard_id(&self) -> &ShardId {
        &self.shard
    }

    pub fn records(&self) -> &[Record] {
        &self.records
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// How far behind the tip of the shard this batch was when fetched.
    pub fn millis_behind_latest(&self) -> Option<u64> {
        self.millis_behind_latest
    }

    /// The token that acks record `index` of this batch (watermark mode).
    pub fn ack_token(&self, index: usize) -> AckToken {
        AckToken {
            batch: self.id,
            index,
        }
    }

    /// Each record with the token that acks it.
    pub fn iter_with_tokens(&self) -> impl Iterator<Item = (AckToken, &Record)> {
        self.records
            .iter()
            .enumerate()
            .map(|(index, record)| (self.ack_token(index), record))
    }
}

/// Names one delivered record, so it can be acked after the batch is gone (watermark
/// mode: a processor that hands records to tasks finishing in any order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AckToken {
    pub(crate) batch: BatchId,
    pub(crate) index: usize,
}

/// Why a checkpoint request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// Another worker owns the shard now; stop processing it.
    #[error("shard {shard}: lease lost, the checkpoint was not written")]
    LeaseLost { shard: ShardId },
    /// A checkpoint past the last record delivered would skip records on a restart.
    #[error("shard {shard}: cannot checkpoint {requested}, the last record delivered is {last}")]
    BeyondDelivered {
        shard: ShardId,
        requested: ExtendedSequenceNumber,
        last: String,
    },
    /// The lease table could not be written (throttled, unreachable); the position is
    /// kept and written later.
    #[error("shard {shard}: checkpoint not written yet: {why}")]
    NotWritten { shard: ShardId, why: String },
    /// The shard's reader is gone (the shard ended, the worker is stopping).
    #[error("shard {shard}: the reader has stopped")]
    ReaderGone { shard: ShardId },
}

/// Acks and checkpoints for one shard. Cheap to clone and `Send`: hand it to tasks.
///
/// * Auto mode (the default): nothing to do, a batch is acked when `process` returns Ok.
/// * Manual mode: call [`Checkpointer::checkpoint`] with the last record you have
///   finished; everything up to it is then considered processed.
/// * Watermark mode: [`Checkpointer::ack`] each record (in any order); the checkpoint
///   advances over the contiguous acked prefix only.
///
/// Writes are coalesced (at most one per shard per `checkpoint.interval`); use
/// [`Checkpointer::flush`] to wait for one.
///
/// [`Checkpointer::worker`] reaches the worker itself, to ask it to stop.
#[derive(Clone)]
pub struct Checkpointer {
    pub(crate) shard: ShardId,
    pub(crate) reader: ActorRef<ReaderMsg>,
    pub(crate) mode: CheckpointMode,
    pub(crate) worker: WorkerHandle,
}

impl fmt::Debug for Checkpointer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpointer")
            .field("shard", &self.shard)
            .field("mode", &self.mode)
            .finish()
    }
}

/// How long a checkpointer waits for its reader to answer.
const CALL_TIMEOUT_MS: u64 = 30_000;

impl Checkpointer {
    pub fn shard_id(&self) -> &ShardId {
        &self.shard
    }

    pub fn mode(&self) -> CheckpointMode {
        self.mode
    }

    /// The worker this shard runs in, for what one shard cannot get past on its own (a
    /// poison record, a quota reached): `checkpointer.worker().request_shutdown(why)`
    /// stops the whole worker gracefully and makes `Worker::wait` return the reason.
    /// Checkpoint first (manual mode) what should not be read again.
    pub fn worker(&self) -> &WorkerHandle {
        &self.worker
    }

    /// Acks one record (watermark mode; in the other modes it only frees window space).
    pub fn ack(&self, token: AckToken) {
        let _ = self.reader.cast(ReaderMsg::Ack(Acks::Records(vec![token])));
    }

    /// Acks several records in one message.
    pub fn ack_all(&self, tokens: impl IntoIterator<Item = AckToken>) {
        let tokens: Vec<AckToken> = tokens.into_iter().collect();
        if !tokens.is_empty() {
            let _ = self.reader.cast(ReaderMsg::Ack(Acks::Records(tokens)));
        }
    }

    /// Acks every record of a batch.
    pub fn ack_batch(&self, batch: &Batch) {
        let _ = self.reader.cast(ReaderMsg::Ack(Acks::Batch(batch.id)));
    }

    /// Marks everything up to and including `at` as processed (manual mode). The write
    /// follows within `checkpoint.interval`.
    pub async fn checkpoint(&self, at: ExtendedSequenceNumber) -> Result<(), CheckpointError> {
        let shard = self.shard.clone();
        ractor::call_t!(self.reader, ReaderMsg::Checkpoint, CALL_TIMEOUT_MS, at)
            .map_err(|_| CheckpointError::ReaderGone { shard })?
    }

    /// Manual checkpoint at a record.
    pub async fn checkpoint_record(&self, record: &Record) -> Result<(), CheckpointError> {
        self.checkpoint(ExtendedSequenceNumber::new(
            record.sequence_number.clone(),
            record.sub_sequence_number,
        ))
        .await
    }

    /// Manual checkpoint at the last record of a batch.
    pub async fn checkpoint_batch(&self, batch: &Batch) -> Result<(), CheckpointError> {
        match batch.records.last() {
            Some(last) => self.checkpoint_record(last).await,
            None => Ok(()),
        }
    }

    /// Writes the shard's checkpoint now and waits for the write.
    pub async fn flush(&self) -> Result<(), CheckpointError> {
        let shard = self.shard.clone();
        ractor::call_t!(self.reader, ReaderMsg::Flush, CALL_TIMEOUT_MS)
            .map_err(|_| CheckpointError::ReaderGone { shard })?
    }
}

/// An error from user code. Any error converts into it with `?`; it deliberately does
/// not implement `std::error::Error` itself, so that conversion stays unambiguous.
pub struct ProcessorError(Box<dyn StdError + Send + Sync + 'static>);

impl ProcessorError {
    pub fn msg(text: impl fmt::Display) -> Self {
        Self(text.to_string().into())
    }
}

impl<E: StdError + Send + Sync + 'static> From<E> for ProcessorError {
    fn from(error: E) -> Self {
        Self(Box::new(error))
    }
}

impl fmt::Display for ProcessorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl fmt::Debug for ProcessorError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

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
    /// Called once before the first batch.
    fn initialize(
        &mut self,
        shard: &ShardInfo,
    ) -> impl Future<Output = Result<(), ProcessorError>> + Send {
        let _ = shard;
        async { Ok(()) }
    }

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

/// What a shard reader sends to its processor actor. Advanced users may implement an
/// actor of their own that handles these instead of a [`Processor`]: it must ack every
/// batch through the checkpointer (as in watermark mode) and answer the reply ports.
/// Such an actor is fenced only at the reader (no new batches while the heartbeat is
/// unconfirmed); batches already in its mailbox are its own to hold back.
#[derive(Debug)]
pub enum ProcessorMsg {
    Initialize(ShardInfo),
    Process(Batch, Checkpointer),
    /// The lease is gone: stop, and do not checkpoint.
    LeaseLost,
    ShardEnded(Checkpointer, RpcReplyPort<Result<(), String>>),
    ShutdownRequested(Checkpointer, RpcReplyPort<Result<(), String>>),
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

/// Hosts one user processor. It stops delivering batches the moment its lease is
/// revoked or its shard starts stopping, even those already queued in its mailbox.
pub(crate) struct ProcessorHost;

pub(crate) struct HostArgs {
    pub processor: BoxedProcessor,
    pub mode: CheckpointMode,
    pub revoked: Arc<AtomicBool>,
    /// The shard is stopping (shutdown, handoff): queued batches are skipped.
    pub stopping: Arc<AtomicBool>,
    pub fence: HostFence,
}

/// When the host may hand a batch to its processor: while [`Fencing`] allows the lease
/// it was started under.
pub(crate) struct HostFence {
    pub fencing: Fencing,
    pub key: LeaseKey,
    pub fence: Fence,
    pub recheck: Duration,
}

pub(crate) struct HostState {
    processor: BoxedProcessor,
    mode: CheckpointMode,
    revoked: Arc<AtomicBool>,
    stopping: Arc<AtomicBool>,
    fence: HostFence,
    finished: bool,
}

impl Actor for ProcessorHost {
    type Msg = ProcessorMsg;
    type State = HostState;
    type Arguments = HostArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: HostArgs,
    ) -> Result<HostState, ActorProcessingErr> {
        Ok(HostState {
            processor: args.processor,
            mode: args.mode,
            revoked: args.revoked,
            stopping: args.stopping,
            fence: args.fence,
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
                    .processor
                    .0
                    .initialize(&info)
                    .await
                    .map_err(|e| failure("initialize", &info.shard_id, e))?;
            }
            ProcessorMsg::Process(batch, checkpointer) => {
                // Batches already queued here when the worker fenced itself wait too:
                // another worker may take the lease once the failover time passes.
                // Blocking the mailbox is the point. A revoked lease (the keeper found
                // it lost) skips them at once, checked right before the call.
                loop {
                    let fence = &state.fence;
                    match fence.fencing.check(&fence.key, &fence.fence) {
                        Ok(()) => break,
                        Err(FenceReason::Revoked { .. } | FenceReason::NotHeld) => return Ok(()),
                        // Revoked by the reader, or stopping (a shutdown or handoff
                        // skips queued batches anyway): do not wait out the fence.
                        Err(_)
                            if state.revoked.load(Ordering::Acquire)
                                || state.stopping.load(Ordering::Acquire) =>
                        {
                            return Ok(());
                        }
                        Err(_) => tokio::time::sleep(fence.recheck).await,
                    }
                }
                // Stopping: the batch in hand was finished; the ones queued behind it
                // are left unacked for the next owner, so a handoff waits for one
                // batch, not a mailbox full.
                if state.finished
                    || state.revoked.load(Ordering::Acquire)
                    || state.stopping.load(Ordering::Acquire)
                {
                    return Ok(());
                }
                // Mutant CheckpointBeforeProcessed: the batch counts as done before the
                // processor has it.
                if crate::mutants::active(crate::mutants::Mutant::CheckpointBeforeProcessed) {
                    checkpointer.ack_batch(&batch);
                }
                state
                    .processor
                    .0
                    .process(&batch, &checkpointer)
                    .await
                    .map_err(|e| failure("process", &batch.shard, e))?;
                if state.mode.host_acks_each_batch() {
                    checkpointer.ack_batch(&batch);
                }
            }
            ProcessorMsg::LeaseLost => {
                if !state.finished {
                    state.finished = true;
                    state.processor.0.lease_lost().await;
                }
                myself.stop(Some("lease_lost".to_owned()));
            }
            ProcessorMsg::ShardEnded(checkpointer, reply) => {
                let result = state.processor.0.shard_ended(&checkpointer).await;
                state.finished = true;
                let _ = reply.send(result.map_err(|e| e.to_string()));
            }
            ProcessorMsg::ShutdownRequested(checkpointer, reply) => {
                let result = state.processor.0.shutdown_requested(&checkpointer).await;
                state.finished = true;
                let _ = reply.send(result.map_err(|e| e.to_string()));
            }
        }
        Ok(())
    }
}

fn failure(call: &str, shard: &ShardId, error: ProcessorError) -> ActorProcessingErr {
    format!("shard {shard}: processor {call} failed: {error}").into()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::model::{SequenceNumber, WorkerId};
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
        Batch {
            shard: shard.clone(),
            id: BatchId(id),
            records: Arc::from(vec![record]),
            millis_behind_latest: None,
        }
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
            HostArgs {
                processor: BoxedProcessor::new(Recorder {
                    seen: seen.clone(),
                    release: release.clone(),
                }),
                mode: CheckpointMode::Auto,
                revoked: Arc::new(AtomicBool::new(false)),
                stopping: Arc::new(AtomicBool::new(false)),
                fence: HostFence {
                    fencing: fencing.clone(),
                    key: key.clone(),
                    fence: fence.clone(),
                    recheck: Duration::from_millis(100),
                },
            },
        )
        .await
        .unwrap();
        let checkpointer = Checkpointer {
            shard: shard.clone(),
            reader: reader.clone(),
            mode: CheckpointMode::Auto,
            worker: WorkerHandle::new(),
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
