//! What a processor speaks to its shard reader with: the [`Batch`] it is handed, the
//! [`Checkpointer`] it acks and checkpoints through, and, for a processor written as an
//! actor of its own, the [`ProcessorMsg`] it receives. Below both the reader and the
//! processor host, so neither imports the other's module for them.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use ractor::{ActorRef, RpcReplyPort};

use super::{Acks, LaneBook, ProcessorError, ReaderMsg};
use crate::backend::Record;
use crate::handle::WorkerHandle;
use crate::model::{BatchId, Checkpoint, ExtendedSequenceNumber, HashKeyRange, ShardId};
use crate::settings::CheckpointMode;

/// What a processor learns about its shard when it starts.
#[derive(Debug, Clone, PartialEq)]
pub struct ShardInfo {
    /// The shard's id within its stream.
    pub shard_id: ShardId,
    /// The stream the shard is of (as `worker.stream` or `worker.streams` names it: a
    /// name, or an ARN; a table's stream by its ARN): a worker of several streams has
    /// shards of the same id in each.
    pub stream: String,
    /// The stream's ARN, as the worker's description of the stream gave it; `None`
    /// where no description gave one.
    pub stream_arn: Option<String>,
    /// The shards this one was split or merged from; all of them are finished.
    pub parents: Vec<ShardId>,
    /// The hash keys the shard covers (the lease row's `startingHashKey` and
    /// `endingHashKey`); `None` when the row has none.
    pub hash_range: Option<HashKeyRange>,
    /// Where reading starts: the last checkpoint, or the initial position.
    pub starting_at: Checkpoint,
    /// A prepared (two-phase) checkpoint left in the lease row and not committed: the
    /// last owner (flotilla's `prepare_checkpoint`, or the Java KCL's
    /// `prepareCheckpoint`) may have applied side effects up to it. Reading starts at
    /// `starting_at` all the same; reconciling is the processor's (the KCL's
    /// `InitializationInput.pendingCheckpointSequenceNumber`). Cleared by the next
    /// checkpoint written.
    pub pending_checkpoint: Option<ExtendedSequenceNumber>,
    /// The application state prepared with it (`pendingCheckpointState`; the KCL's
    /// `InitializationInput.pendingCheckpointState`).
    pub pending_checkpoint_state: Option<Vec<u8>>,
}

/// Records fetched by one GetRecords call (de-aggregated), in sequence order. Cheap to
/// clone: the records are shared, not copied.
///
/// Empty only with `reader.call_on_empty`: a read that brought nothing (the Java KCL's
/// `callProcessRecordsEvenForEmptyRecordList`). An empty batch has nothing to ack and
/// never moves a checkpoint; acking it is a no-op. The next empty call waits until this
/// one is dropped: keep a clone of an empty batch past `process` and there is none.
#[derive(Debug, Clone)]
pub struct Batch {
    pub(crate) shard: ShardId,
    pub(crate) id: BatchId,
    pub(crate) records: Arc<[Record]>,
    pub(crate) millis_behind_latest: Option<u64>,
    /// When the read that brought the records answered (the KCL's `cacheEntryTime`).
    pub(crate) fetched_at: Instant,
    /// When the processor was handed the batch (the KCL's `cacheExitTime`): set by the
    /// reader when it sends the batch, and again by the processor host right before
    /// `process`, so the time between includes the wait behind earlier batches.
    pub(crate) delivered_at: Instant,
    /// The read that brought these records said the shard has ended; `child_shards` are
    /// the children it named (empty if it named none).
    pub(crate) at_shard_end: bool,
    pub(crate) child_shards: Arc<[ShardId]>,
    /// An empty batch holds this (for its drop) while it is on its way to the processor: the reader
    /// sends no other empty one until it is dropped, so a busy processor's mailbox holds
    /// at most one. `None` for batches with records.
    pub(crate) _empty_slot: Option<Arc<()>>,
    /// Where each record sits in the batch the reader delivered, when this is not all
    /// of it: a part handed over again by the failure policy (a retry after a partial
    /// failure, a half after a bisection), a lane's share (`processor.parallelism`), or
    /// what a filter let through. Each keeps its records' ack tokens. `None`: the whole
    /// batch, as delivered.
    pub(crate) positions: Option<Arc<[usize]>>,
}

impl Batch {
    /// The shard the records are from.
    pub fn shard_id(&self) -> &ShardId {
        &self.shard
    }

    /// The records, de-aggregated, in sequence order.
    pub fn records(&self) -> &[Record] {
        &self.records
    }

    /// How many records the batch holds (user records, after de-aggregation).
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// Whether the read brought no record (only with `reader.call_on_empty`).
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// How far behind the tip of the shard this batch was when fetched (also on an
    /// empty batch: 0 there means the shard is caught up).
    pub fn millis_behind_latest(&self) -> Option<u64> {
        self.millis_behind_latest
    }

    /// When the read that brought this batch answered (the Java KCL's
    /// `ProcessRecordsInput.cacheEntryTime`). From tokio's clock, so it follows paused
    /// time in tests.
    pub fn fetched_at(&self) -> Instant {
        self.fetched_at
    }

    /// When the batch was handed to `process` (the KCL's `cacheExitTime`);
    /// `delivered_at - fetched_at` is how long it waited behind earlier batches.
    pub fn delivered_at(&self) -> Instant {
        self.delivered_at
    }

    /// The read that brought this batch also said the shard has ended (the KCL's
    /// `isAtShardEnd`): no batch follows, `shard_ended` comes next. A shard whose end
    /// comes with a read of no records only says so here with `reader.call_on_empty`;
    /// `shard_ended` is called either way.
    pub fn is_at_shard_end(&self) -> bool {
        self.at_shard_end
    }

    /// At shard end, the children the ending read named (the `ChildShards` Kinesis returns
    /// with a shard's end).
    pub fn child_shards(&self) -> &[ShardId] {
        &self.child_shards
    }

    /// The token that acks record `index` of this batch (watermark mode).
    pub fn ack_token(&self, index: usize) -> AckToken {
        let index = match &self.positions {
            Some(positions) => positions.get(index).copied().unwrap_or(usize::MAX),
            None => index,
        };
        AckToken {
            batch: self.id,
            index,
        }
    }

    /// The records at `indices` of this batch (in order), as a batch of their own with
    /// the same id and ack tokens: a lane's share, or what a filter let through. The
    /// end of the shard stays news for every share (no batch follows any of them).
    pub(crate) fn pick(&self, indices: &[usize]) -> Batch {
        let (records, positions): (Vec<Record>, Vec<usize>) = indices
            .iter()
            .filter_map(|&i| Some((self.records.get(i)?.clone(), self.ack_token(i).index)))
            .unzip();
        Batch {
            records: Arc::from(records),
            positions: Some(Arc::from(positions)),
            ..self.clone()
        }
    }

    /// Whether every record of the batch the reader delivered is here, consecutive: the
    /// batch can be acked by its id alone.
    fn is_whole(&self) -> bool {
        self.positions.is_none()
    }

    /// The records `range` of this batch, as a batch of their own with the same id and
    /// ack tokens (the failure policy hands parts of a batch over again).
    pub(crate) fn part(&self, range: std::ops::Range<usize>) -> Batch {
        if range.start == 0 && range.end == self.records.len() {
            return self.clone();
        }
        let end = range.end.min(self.records.len());
        let start = range.start.min(end);
        Batch {
            records: Arc::from(&self.records[start..end]),
            // Named one by one, so that acking the part by `ack_batch` acks its records
            // only, never the batch's id.
            positions: Some(match &self.positions {
                Some(positions) => {
                    Arc::from(&positions[start.min(positions.len())..end.min(positions.len())])
                }
                None => (start..end).collect(),
            }),
            // The end of the shard is news for the batch's last record only.
            at_shard_end: self.at_shard_end && end == self.records.len(),
            ..self.clone()
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
    LeaseLost {
        /// The shard whose checkpoint was refused.
        shard: ShardId,
    },
    /// A checkpoint past the last record delivered would skip records on a restart.
    #[error("shard {shard}: cannot checkpoint {requested}, the last record delivered is {last}")]
    BeyondDelivered {
        /// The shard whose checkpoint was refused.
        shard: ShardId,
        /// The position asked for.
        requested: ExtendedSequenceNumber,
        /// The last record delivered, as text (`none` if nothing was delivered yet).
        last: String,
    },
    /// The lease table could not be written (throttled, unreachable); the position is
    /// kept and written later.
    #[error("shard {shard}: checkpoint not written yet: {why}")]
    NotWritten {
        /// The shard whose checkpoint is not written yet.
        shard: ShardId,
        /// The lease table's error, or why the writer did not answer.
        why: String,
    },
    /// The shard's reader is gone (the shard ended, the worker is stopping).
    #[error("shard {shard}: the reader has stopped")]
    ReaderGone {
        /// The shard whose reader is gone.
        shard: ShardId,
    },
    /// A prepared checkpoint before the last checkpoint would move the shard back (the
    /// KCL refuses one outside "the last checkpoint .. the last record delivered" too).
    #[error("shard {shard}: cannot prepare {requested}, the checkpoint is already at {checkpoint}")]
    BeforeCheckpoint {
        /// The shard whose prepared checkpoint was refused.
        shard: ShardId,
        /// The position asked for.
        requested: ExtendedSequenceNumber,
        /// The shard's checkpoint now, as text.
        checkpoint: String,
    },
    /// Prepared checkpoints need `checkpoint.mode = "manual"`: in the other modes the
    /// reader checkpoints by itself, and each of its writes would remove the prepared one.
    #[error(
        "shard {shard}: prepare_checkpoint needs checkpoint.mode = \"manual\" (it is {mode:?})"
    )]
    PrepareNeedsManualMode {
        /// The shard whose prepared checkpoint was refused.
        shard: ShardId,
        /// The worker's `checkpoint.mode`.
        mode: CheckpointMode,
    },
    /// Prepared checkpoints need one lane per shard (`processor.parallelism = 1`): a
    /// lane's checkpoint speaks for its own records only, and the shard's follows the
    /// lanes' acked prefix, so a prepared position could not be committed as the
    /// shard's.
    #[error("shard {shard}: prepare_checkpoint needs processor.parallelism = 1")]
    PrepareNeedsOneLane {
        /// The shard whose prepared checkpoint was refused.
        shard: ShardId,
    },
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
    /// Set on the checkpointer handed with a part of a batch to a processor actor under
    /// `[failure]`: its acks (or [`Checkpointer::fail_batch`]) tell the host that handed
    /// the part over how it went.
    pub(crate) relay: Option<Arc<PartOutcome>>,
    /// Set on the checkpointer of a lane's processor in manual mode with lanes: its
    /// checkpoints ack the lane's records up to the position ([`LaneBook`]), and the
    /// shard's checkpoint is the acked prefix across the lanes.
    pub(crate) lane: Option<Arc<LaneBook>>,
}

/// How a part of a batch handed to a processor actor under `[failure]` ended, told back
/// to the processor host waiting on it (`processor/relay.rs`): the failure policy needs
/// each delivery's outcome, which an actor gives only through its checkpointer.
#[derive(Debug)]
pub(crate) struct PartOutcome {
    done: std::sync::Mutex<Option<tokio::sync::oneshot::Sender<Result<(), ProcessorError>>>>,
    /// Records of the part not acked yet (a watermark-mode actor acks them one by one).
    left: std::sync::atomic::AtomicUsize,
    /// Whether acks go on to the reader: in watermark mode, where the host acks nothing;
    /// not in the others, where the host acks the whole batch once every part is done.
    forward: bool,
}

impl PartOutcome {
    /// The outcome of a part of `len` records, and where the host waits for it.
    pub(crate) fn new(
        len: usize,
        forward: bool,
    ) -> (
        Arc<Self>,
        tokio::sync::oneshot::Receiver<Result<(), ProcessorError>>,
    ) {
        let (done, wait) = tokio::sync::oneshot::channel();
        let outcome = Self {
            done: std::sync::Mutex::new(Some(done)),
            left: std::sync::atomic::AtomicUsize::new(len),
            forward,
        };
        (Arc::new(outcome), wait)
    }

    /// The first outcome counts; later ones (a batch acked after it was failed) change
    /// nothing.
    fn finish(&self, outcome: Result<(), ProcessorError>) {
        let sender = self.done.lock().ok().and_then(|mut done| done.take());
        if let Some(sender) = sender {
            let _ = sender.send(outcome);
        }
    }

    /// `n` records were acked one by one: the part is done once all are.
    fn acked(&self, n: usize) {
        use std::sync::atomic::Ordering;
        let before = self
            .left
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |left| {
                Some(left.saturating_sub(n))
            })
            .unwrap_or(0);
        if before > 0 && before <= n {
            self.finish(Ok(()));
        }
    }
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
    /// The shard this checkpointer acks and checkpoints.
    pub fn shard_id(&self) -> &ShardId {
        &self.shard
    }

    /// The worker's `checkpoint.mode`: how this shard's checkpoint moves (see [`Checkpointer`]).
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
        self.ack_all([token]);
    }

    /// Acks several records in one message.
    pub fn ack_all(&self, tokens: impl IntoIterator<Item = AckToken>) {
        let tokens: Vec<AckToken> = tokens.into_iter().collect();
        if tokens.is_empty() {
            return;
        }
        let count = tokens.len();
        if self.relay.as_ref().is_none_or(|relay| relay.forward) {
            let _ = self.reader.cast(ReaderMsg::Ack(Acks::Records(tokens)));
        }
        if let Some(relay) = &self.relay {
            relay.acked(count);
        }
    }

    /// Acks every record of a batch (nothing for an empty one).
    pub fn ack_batch(&self, batch: &Batch) {
        match &self.relay {
            // A part handed over by the failure policy: its records' tokens, so the
            // other parts of the batch stay un-acked (watermark mode), or nothing (the
            // host acks the batch once all its parts are done).
            Some(relay) => {
                if relay.forward {
                    let tokens: Vec<AckToken> =
                        (0..batch.len()).map(|i| batch.ack_token(i)).collect();
                    if !tokens.is_empty() {
                        let _ = self.reader.cast(ReaderMsg::Ack(Acks::Records(tokens)));
                    }
                }
                relay.finish(Ok(()));
            }
            None if batch.is_whole() && !batch.is_empty() => {
                let _ = self.reader.cast(ReaderMsg::Ack(Acks::Batch(batch.id)));
            }
            // A lane's share, or a filtered batch: its records' tokens, so the records
            // of the other lanes stay un-acked.
            None => self.ack_all((0..batch.len()).map(|i| batch.ack_token(i))),
        }
    }

    /// A processor actor could not process `batch` (a processor that implements
    /// [`crate::Processor`] returns `Err` instead). Under `[failure]` the batch is
    /// retried, bisected or discarded as the settings say, and `error` may name the
    /// failing record ([`ProcessorError::at_record`]); without it the shard fails and
    /// restarts from its checkpoint, as when the actor fails.
    pub fn fail_batch(&self, batch: &Batch, error: ProcessorError) {
        match &self.relay {
            Some(relay) => relay.finish(Err(error)),
            None => {
                let why = format!("the processor actor failed batch {}: {error}", batch.id.0);
                let _ = self.reader.cast(ReaderMsg::ProcessorFailed(why));
            }
        }
    }

    /// Marks everything up to and including `at` as processed (manual mode). The write
    /// follows within `checkpoint.interval`.
    pub async fn checkpoint(&self, at: ExtendedSequenceNumber) -> Result<(), CheckpointError> {
        if let Some(lane) = &self.lane {
            // A lane speaks for its own records only: they are acked, and the shard's
            // checkpoint follows the acked prefix across the lanes.
            self.ack_all(lane.through(&at));
            return Ok(());
        }
        self.ask_reader(|reply| ReaderMsg::Checkpoint(at, reply))
            .await
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
        self.ask_reader(ReaderMsg::Flush).await
    }

    /// The first phase of a two-phase checkpoint (manual mode; the Java KCL's
    /// `prepareCheckpoint`): records `at`, with the application's `state`, as the shard's
    /// pending checkpoint in its lease row, beside the committed one, and returns once it
    /// is written. Then apply the side effects up to `at` and call
    /// [`PreparedCheckpoint::checkpoint`]. If the worker fails in between, the next owner
    /// sees both positions and the state in [`ShardInfo`] and can reconcile.
    ///
    /// The write is fenced like every checkpoint. Refused: a position past the last
    /// record delivered or before the last checkpoint, and in the modes that checkpoint
    /// by themselves. The shard's coalesced checkpoint is written first; any later
    /// checkpoint (a plain one too) removes the prepared one, as in the KCL.
    pub async fn prepare_checkpoint(
        &self,
        at: ExtendedSequenceNumber,
        state: Option<Vec<u8>>,
    ) -> Result<PreparedCheckpoint, CheckpointError> {
        if self.lane.is_some() {
            return Err(CheckpointError::PrepareNeedsOneLane {
                shard: self.shard.clone(),
            });
        }
        let prepare = at.clone();
        self.ask_reader(|reply| ReaderMsg::Prepare(prepare, state, reply))
            .await?;
        Ok(PreparedCheckpoint {
            checkpointer: self.clone(),
            at,
        })
    }

    /// Asks the shard's reader and waits for its answer; a reader that does not answer
    /// has stopped.
    async fn ask_reader(
        &self,
        message: impl FnOnce(RpcReplyPort<Result<(), CheckpointError>>) -> ReaderMsg,
    ) -> Result<(), CheckpointError> {
        ractor::call_t!(self.reader, message, CALL_TIMEOUT_MS).map_err(|_| {
            CheckpointError::ReaderGone {
                shard: self.shard.clone(),
            }
        })?
    }
}

/// A pending checkpoint written by [`Checkpointer::prepare_checkpoint`] (the KCL's
/// `PreparedCheckpointer`).
#[derive(Debug, Clone)]
pub struct PreparedCheckpoint {
    checkpointer: Checkpointer,
    at: ExtendedSequenceNumber,
}

impl PreparedCheckpoint {
    /// The prepared position.
    pub fn position(&self) -> &ExtendedSequenceNumber {
        &self.at
    }

    /// The second phase: writes the prepared position as the shard's checkpoint and
    /// removes the pending one and its state, in one fenced write, and returns once it
    /// is written. A checkpoint already written at or past it has done both.
    pub async fn checkpoint(self) -> Result<(), CheckpointError> {
        let Self { checkpointer, at } = self;
        checkpointer
            .ask_reader(|reply| ReaderMsg::Commit(at, reply))
            .await
    }
}

/// What a shard reader sends to its processor actor. Advanced users may implement an
/// actor of their own that handles these instead of a [`Processor`](crate::Processor): it must ack every
/// batch through the checkpointer (as in watermark mode) and answer the reply ports.
/// Such an actor is fenced only at the reader (no new batches while the heartbeat is
/// unconfirmed); batches already in its mailbox are its own to hold back.
#[derive(Debug)]
pub enum ProcessorMsg {
    /// The first message: the shard, and where reading starts (as
    /// [`Processor::initialize`](crate::Processor::initialize) gets it).
    Initialize(ShardInfo),
    /// A batch to process, in order; ack its records through the checkpointer.
    Process(Batch, Checkpointer),
    /// The lease is gone: stop, and do not checkpoint.
    LeaseLost,
    /// Every record is delivered and acked: answer `Ok` and the SHARD_END checkpoint is
    /// written; an `Err` (or no answer within `supervision.shutdown_timeout`) fails the
    /// shard, which restarts.
    ShardEnded(Checkpointer, RpcReplyPort<Result<(), String>>),
    /// The shard is stopping (a shutdown, a handoff): finish and checkpoint, then answer
    /// within `supervision.shutdown_timeout`; the reader then flushes the checkpoint. An
    /// `Err`, or no answer, is reported in the shard's
    /// [`ShardShutdown`](crate::ShardShutdown).
    ShutdownRequested(Checkpointer, RpcReplyPort<Result<(), String>>),
}
