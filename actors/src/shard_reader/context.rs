//! What a reader is given and never changes while it runs, in two halves: [`Ctx`], the
//! shard it reads and the ports and boards it reads and reports with, and [`Wires`],
//! the actors it messages. Every part borrows them; none owns them, so the parts share
//! one copy of the wiring and keep their own state apart. The read steps reach the
//! actors only through the [`Out`] trait, so they are tested without actors (a
//! recording `Out` over the memory backends, in [`testing`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ractor::{ActorProcessingErr, ActorRef, RpcReplyPort};

use crate::backend::{LeaseTable, ShardEvent, StreamClient, StreamError};
use crate::boards::LagBoard;
use crate::failure::driver::Failures;
use crate::fencing::Fencing;
use crate::model::{Fence, Lease, LeaseKey, RecordFilter, ShardId};
use crate::processor::{ProcessorSource, ProcessorWait};
use crate::protocol::{
    AckToken, Acks, Batch, CheckpointError, CheckpointMsg, Checkpointer, ProcessorMsg, ReaderMsg,
    SupervisorMsg,
};
use crate::settings::{CheckpointMode, Settings};
use crate::telemetry::{Event, Sample, Telemetry};

/// What the supervisor gives a reader it starts.
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
    /// MillisBehindLatest per shard id, shared with the lease keeper's heartbeat.
    pub lags: LagBoard,
    /// Handed to the processor in its checkpointer, to ask the worker to stop.
    pub worker: crate::handle::WorkerHandle,
    /// The fan-out consumer's ARN in fan-out mode; `None` polls.
    pub consumer: Option<Arc<str>>,
    /// `[failure]`'s policy for this shard's processor host; `None` when it is off.
    pub failures: Option<Failures>,
    /// This reader's place in the worker's memory budget; dropping it returns the bytes.
    pub budget: crate::model::BudgetSlot,
}

/// How long the reader waits on the checkpoint writer.
pub(super) const WRITER_TIMEOUT_MS: u64 = 30_000;

/// What the reader reads with (see the module doc). `lease` is the one field that
/// changes: the start-up step replaces it with the row read from the table. No read
/// step messages an actor through it (the processor wait holds the reader's own ref, to
/// tell it once when the processor first waits), so a part's tests build one over the memory
/// backends.
pub(super) struct Ctx {
    pub key: LeaseKey,
    pub shard: ShardId,
    pub fence: Fence,
    pub mode: CheckpointMode,
    pub lease: Lease,
    pub stream: String,
    /// The stream's ARN where its description gave one, for the processor's `ShardInfo`.
    pub stream_arn: Option<String>,
    pub initial_timestamp: Option<SystemTime>,
    pub ports: Ports,
    pub restarts: u32,
}

/// The ports and boards a reader reads and reports with (all shared handles).
pub(super) struct Ports {
    pub streams: Arc<dyn StreamClient>,
    pub table: Arc<dyn LeaseTable>,
    pub settings: Arc<Settings>,
    /// Self-fencing: checked before each fetch and each delivery.
    pub fencing: Fencing,
    /// MillisBehindLatest per shard id, shared with the lease keeper's heartbeat.
    pub lags: LagBoard,
    /// What the processor waits on outside, shared with its host (a MultiLang child's
    /// answer): past its stall time, the shard is stalled.
    pub wait: ProcessorWait,
    /// `[failure]`'s policy, handed to the processor host; `None` when it is off.
    pub failures: Option<Failures>,
}

/// Where a read step sends what it does not keep: batches to the processor, a fan-out
/// subscription's events to the reader's own mailbox, events and samples to the
/// metrics reporter. The shell's [`Wires`] sends to the actors; a part's test records.
pub(super) trait Out: Send + Sync {
    /// An event: its log line and its samples, as `Telemetry::emit` does.
    fn emit(&self, event: &dyn Event);
    /// Gauges and counts that are not events.
    fn record(&self, samples: Vec<Sample>);
    /// Hands a batch to the processor, with the shard's checkpointer (nothing while no
    /// processor runs); an error when its mailbox is closed.
    fn process(&self, batch: Batch) -> Result<(), ActorProcessingErr>;
    /// Acks records no processor sees (`processor.filter`), through the reader's own
    /// mailbox, so they count and move the checkpoint as any ack does.
    fn skip(&self, tokens: Vec<AckToken>);
    /// Where a fan-out subscription's task sends each event, moved into the task.
    fn feed_sink(&self) -> FeedSink;
    /// Reminds the reader after `after` that a batching window may have passed
    /// ([`ReaderMsg::WindowDue`]).
    fn window_due_after(&self, after: Duration);
}

/// Sends one event of the subscription of this generation; `false` once nobody takes
/// them (the reader is gone): the task then ends.
pub(super) type FeedSink =
    Box<dyn Fn(u64, Result<Option<ShardEvent>, StreamError>) -> bool + Send + Sync>;

/// The reader's peers, all actors: itself, its processor once started, the checkpoint
/// writer, the supervisor and the metrics reporter. The shell and its steps that
/// message them (start-up, the end) hold it; the read steps see it as an [`Out`].
pub(super) struct Wires {
    pub me: ActorRef<ReaderMsg>,
    pub writer: ActorRef<CheckpointMsg>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub telemetry: Telemetry,
    /// How the processor is started (an actor of the reader's, or a host).
    pub processors: ProcessorSource,
    /// Handed to the processor with each batch (a clone).
    pub checkpointer: Checkpointer,
    /// The processor, once started.
    pub processor: Option<ActorRef<ProcessorMsg>>,
}

impl Ctx {
    /// The reader's context and peers from the supervisor's arguments, and what is
    /// neither: the fan-out consumer (the source's) and the budget slot (the outbox's).
    pub fn new(
        args: ReaderArgs,
        me: ActorRef<ReaderMsg>,
    ) -> (Self, Wires, Option<Arc<str>>, crate::model::BudgetSlot) {
        let ReaderArgs {
            lease,
            stream,
            stream_arn,
            streams,
            table,
            settings,
            initial_timestamp,
            processor,
            writer,
            supervisor,
            telemetry,
            fencing,
            restarts,
            lags,
            worker,
            consumer,
            budget,
            failures,
        } = args;
        let key = lease.key.clone();
        let ctx = Ctx {
            key: key.clone(),
            shard: key.shard_id(),
            fence: lease.fence(),
            mode: settings.reader_mode(),
            lease,
            stream,
            stream_arn,
            initial_timestamp,
            restarts,
            ports: Ports {
                streams,
                table,
                settings,
                fencing,
                lags,
                wait: ProcessorWait::new(me.clone()),
                failures,
            },
        };
        let wires = Wires {
            checkpointer: Checkpointer {
                shard: ctx.shard.clone(),
                reader: me.clone(),
                // The worker's mode, as the processor knows it (a lane's checkpointer
                // in manual mode acks, `processor/lanes.rs`).
                mode: ctx.settings().checkpoint.mode,
                worker,
                relay: None,
                lane: None,
            },
            me,
            writer,
            supervisor,
            telemetry,
            processors: processor,
            processor: None,
        };
        (ctx, wires, consumer, budget)
    }

    pub fn settings(&self) -> &Settings {
        &self.ports.settings
    }

    /// `processor.filter`, parsed (`None`: every record is handed over). Checked when
    /// the settings were, so an error here cannot be.
    pub fn filter(&self) -> Option<Arc<RecordFilter>> {
        RecordFilter::parse(&self.settings().processor.filter)
            .ok()
            .flatten()
            .map(Arc::new)
    }
}

impl Wires {
    /// Asks the checkpoint writer for a write and waits for its answer, for the
    /// processor's checkpointer: a writer that does not answer is a checkpoint not
    /// written (yet).
    pub async fn ask_writer(
        &self,
        message: impl FnOnce(RpcReplyPort<Result<(), CheckpointError>>) -> CheckpointMsg,
    ) -> Result<(), CheckpointError> {
        ractor::call_t!(self.writer, message, WRITER_TIMEOUT_MS).map_err(|e| {
            CheckpointError::NotWritten {
                shard: self.checkpointer.shard.clone(),
                why: e.to_string(),
            }
        })?
    }

    /// Waits for everything acked before to be written.
    pub async fn flush(&self, key: &LeaseKey) -> Result<(), CheckpointError> {
        let key = key.clone();
        self.ask_writer(|reply| CheckpointMsg::Flush { key, reply })
            .await
    }
}

impl Out for Wires {
    fn emit(&self, event: &dyn Event) {
        self.telemetry.emit_dyn(event);
    }

    fn record(&self, samples: Vec<Sample>) {
        self.telemetry.record(samples);
    }

    fn process(&self, batch: Batch) -> Result<(), ActorProcessingErr> {
        if let Some(processor) = &self.processor {
            processor.cast(ProcessorMsg::Process(batch, self.checkpointer.clone()))?;
        }
        Ok(())
    }

    fn skip(&self, tokens: Vec<AckToken>) {
        let _ = self.me.cast(ReaderMsg::Ack(Acks::Records(tokens)));
    }

    fn feed_sink(&self) -> FeedSink {
        let me = self.me.clone();
        Box::new(move |generation, event| me.cast(ReaderMsg::Event { generation, event }).is_ok())
    }

    fn window_due_after(&self, after: Duration) {
        self.me.send_after(after, || ReaderMsg::WindowDue);
    }
}

#[cfg(test)]
pub(super) mod testing {
    //! A reader's parts without actors: a [`Ctx`] over the memory stream and lease
    //! table, and a recording [`Out`], for the read steps' tests.

    use std::sync::Mutex;

    use tokio::sync::mpsc;
    use tokio::time::Instant;

    use super::*;
    use crate::backend::memory::{MemoryDynamo, MemoryStreams, MemoryStreamsConfig};
    use crate::backend::{IteratorPosition, PutRecord, StreamAdmin};
    use crate::backoff::Backoff;
    use crate::model::{Checkpoint, WorkerBudget, WorkerId};
    use crate::shard_reader::gather::Gather;
    use crate::shard_reader::health::ReadHealth;
    use crate::shard_reader::outbox::Outbox;
    use crate::shard_reader::pure::Phase;
    use crate::shard_reader::reading::Reading;
    use crate::shard_reader::stall::StallWatch;

    pub const STREAM: &str = "s";

    /// Records what the parts sent.
    pub struct Recorder {
        pub batches: Mutex<Vec<Batch>>,
        pub samples: Mutex<Vec<Sample>>,
        pub events: Mutex<u32>,
        /// The batching window's timers asked for.
        pub window_timers: Mutex<Vec<Duration>>,
        /// Records acked unseen (`processor.filter`).
        pub skipped: Mutex<Vec<AckToken>>,
        feed: mpsc::UnboundedSender<(u64, Result<Option<ShardEvent>, StreamError>)>,
    }

    impl Out for Recorder {
        fn emit(&self, event: &dyn Event) {
            *self.events.lock().unwrap() += 1;
            self.record(event.samples());
        }
        fn record(&self, samples: Vec<Sample>) {
            self.samples.lock().unwrap().extend(samples);
        }
        fn process(&self, batch: Batch) -> Result<(), ActorProcessingErr> {
            self.batches.lock().unwrap().push(batch);
            Ok(())
        }
        fn skip(&self, tokens: Vec<AckToken>) {
            self.skipped.lock().unwrap().extend(tokens);
        }
        fn feed_sink(&self) -> FeedSink {
            let feed = self.feed.clone();
            Box::new(move |generation, event| feed.send((generation, event)).is_ok())
        }
        fn window_due_after(&self, after: Duration) {
            self.window_timers.lock().unwrap().push(after);
        }
    }

    impl Recorder {
        /// The records handed over, by sequence number, batch by batch.
        pub fn delivered(&self) -> Vec<Vec<String>> {
            self.batches
                .lock()
                .unwrap()
                .iter()
                .map(|b| {
                    b.records
                        .iter()
                        .map(|r| r.sequence_number.to_string())
                        .collect()
                })
                .collect()
        }

        /// The last value sampled for `metric`, if any.
        pub fn last(&self, metric: crate::telemetry::Metric) -> Option<f64> {
            self.samples
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find(|s| s.metric == metric)
                .map(|s| s.value)
        }
    }

    /// One reader's parts, holding shard 0 of a one-shard memory stream from TRIM_HORIZON
    /// (the lease held, the heartbeat confirmed: it may deliver).
    pub struct Rig {
        pub ctx: Ctx,
        pub out: Recorder,
        pub feed: mpsc::UnboundedReceiver<(u64, Result<Option<ShardEvent>, StreamError>)>,
        pub streams: Arc<MemoryStreams>,
        pub outbox: Outbox,
        pub health: ReadHealth,
        pub stall: StallWatch,
        pub gather: Gather,
        /// The worker's budget the outbox's slot is in.
        pub budget: WorkerBudget,
    }

    impl Rig {
        /// Must run in a tokio runtime with paused time (the memory stream's clock).
        pub async fn new(settings: Settings) -> Self {
            let streams = Arc::new(MemoryStreams::new(MemoryStreamsConfig::default()));
            streams.create_stream(STREAM, 1).await.unwrap();
            let table = Arc::new(MemoryDynamo::new().lease_table("t"));
            let shard = ShardId::from_index(0);
            let mut lease = Lease::new(&shard, Checkpoint::TrimHorizon, vec![], None);
            lease.owner = Some(WorkerId::new("me"));
            lease.counter = 1;
            let key = lease.key.clone();
            let fencing = Fencing::new(settings.lease.fence_time());
            let now = Instant::now();
            fencing.lock().heartbeat_confirmed(now, now);
            fencing.lock().hold(&key, &lease.fence(), now);
            let budget = WorkerBudget::new(64 << 20);
            let mode = settings.checkpoint.mode;
            let mut outbox = Outbox::new(shard.clone(), mode, budget.join(), now);
            outbox.begin(
                Checkpoint::TrimHorizon,
                IteratorPosition::TrimHorizon,
                None,
                None,
                now,
            );
            let backoff = Backoff::new(settings.reader.backoff_min, settings.reader.backoff_max);
            let (feed_tx, feed) = mpsc::unbounded_channel();
            let gather = Gather::new(settings.reader.batch_window);
            Rig {
                ctx: Ctx {
                    key,
                    shard,
                    fence: lease.fence(),
                    mode,
                    lease,
                    stream: STREAM.into(),
                    stream_arn: None,
                    initial_timestamp: None,
                    restarts: 0,
                    ports: Ports {
                        streams: streams.clone(),
                        table,
                        settings: Arc::new(settings),
                        fencing,
                        lags: LagBoard::default(),
                        wait: ProcessorWait::default(),
                        failures: None,
                    },
                },
                out: Recorder {
                    batches: Mutex::default(),
                    samples: Mutex::default(),
                    events: Mutex::default(),
                    window_timers: Mutex::default(),
                    skipped: Mutex::default(),
                    feed: feed_tx,
                },
                feed,
                streams,
                outbox,
                health: ReadHealth::new(backoff),
                stall: StallWatch::default(),
                gather,
                budget,
            }
        }

        /// The parts a read step borrows.
        pub fn reading(&mut self) -> Reading<'_> {
            Reading {
                ctx: &self.ctx,
                out: &self.out,
                phase: Phase::Reading,
                outbox: &mut self.outbox,
                health: &mut self.health,
                stall: &mut self.stall,
                gather: &mut self.gather,
            }
        }

        /// A heartbeat confirmed now and the lease read again after it, as the keeper
        /// does after a gap: the shard may deliver again once time moved on.
        pub fn beat(&self) {
            let now = Instant::now();
            let mut fencing = self.ctx.ports.fencing.lock();
            fencing.heartbeat_confirmed(now, now);
            fencing.reconfirm(&self.ctx.key, &self.ctx.fence, now);
        }

        /// Puts `n` records on the stream.
        pub async fn put(&self, n: usize) {
            let records: Vec<PutRecord> = (0..n)
                .map(|i| PutRecord {
                    partition_key: format!("k{i}"),
                    explicit_hash_key: None,
                    data: bytes::Bytes::from(format!("r{i}")),
                })
                .collect();
            self.streams.put_records(STREAM, &records).await.unwrap();
        }

        /// Every record the processor was handed, in order.
        pub fn all_delivered(&self) -> Vec<String> {
            self.out.delivered().concat()
        }

        /// Acks everything handed over (the processor finished it).
        pub fn ack_all(&mut self) {
            let batches: Vec<Batch> = std::mem::take(&mut *self.out.batches.lock().unwrap());
            for batch in batches {
                let acks = crate::protocol::Acks::Batch(batch.id);
                self.outbox.ack(acks, 0, Instant::now());
            }
        }
    }
}
