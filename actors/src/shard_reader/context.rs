//! What a reader is given and never changes while it runs: the shard it reads, the ports
//! it reads with, and the actors and boards it reports to. Every part of the reader
//! borrows it; none owns it, so the parts share one copy of the wiring and keep their
//! own state apart.

use std::sync::Arc;
use std::time::SystemTime;

use ractor::{ActorRef, RpcReplyPort};

use crate::backend::{LeaseTable, StreamClient};
use crate::boards::LagBoard;
use crate::fencing::Fencing;
use crate::model::{Fence, Lease, LeaseKey, ShardId};
use crate::processor::{ProcessorSource, ProcessorWait};
use crate::protocol::{CheckpointError, CheckpointMsg, Checkpointer, ReaderMsg, SupervisorMsg};
use crate::settings::{CheckpointMode, Settings};
use crate::telemetry::{Sample, Telemetry};

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
    /// This reader's place in the worker's memory budget; dropping it returns the bytes.
    pub budget: crate::model::BudgetSlot,
}

/// How long the reader waits on the checkpoint writer.
pub(super) const WRITER_TIMEOUT_MS: u64 = 30_000;

/// The reader's wiring (see the module doc). `lease` is the one field that changes: the
/// start-up step replaces it with the row read from the table.
pub(super) struct Ctx {
    pub me: ActorRef<ReaderMsg>,
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

/// The ports and peers a reader talks to (all shared handles).
pub(super) struct Ports {
    pub streams: Arc<dyn StreamClient>,
    pub table: Arc<dyn LeaseTable>,
    pub settings: Arc<Settings>,
    pub processor: ProcessorSource,
    pub writer: ActorRef<CheckpointMsg>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub telemetry: Telemetry,
    /// Self-fencing: checked before each fetch and each delivery.
    pub fencing: Fencing,
    /// MillisBehindLatest per shard id, shared with the lease keeper's heartbeat.
    pub lags: LagBoard,
    /// Handed to the processor in its checkpointer, to ask the worker to stop.
    pub worker: crate::handle::WorkerHandle,
    /// What the processor waits on outside, shared with its host (a MultiLang child's
    /// answer): past its stall time, the shard is stalled.
    pub wait: ProcessorWait,
}

impl Ctx {
    /// The wiring from the supervisor's arguments, and what is not wiring: the fan-out
    /// consumer (the source's) and the budget slot (the outbox's).
    pub fn new(
        args: ReaderArgs,
        me: ActorRef<ReaderMsg>,
    ) -> (Self, Option<Arc<str>>, crate::model::BudgetSlot) {
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
        } = args;
        let key = lease.key.clone();
        let ctx = Ctx {
            key: key.clone(),
            shard: key.shard_id(),
            fence: lease.fence(),
            mode: settings.checkpoint.mode,
            lease,
            stream,
            stream_arn,
            initial_timestamp,
            restarts,
            ports: Ports {
                streams,
                table,
                settings,
                processor,
                writer,
                supervisor,
                telemetry,
                fencing,
                lags,
                worker,
                wait: ProcessorWait::new(me.clone()),
            },
            me,
        };
        (ctx, consumer, budget)
    }

    pub fn settings(&self) -> &Settings {
        &self.ports.settings
    }

    pub fn report(&self, samples: Vec<Sample>) {
        self.ports.telemetry.record(samples);
    }

    pub fn checkpointer(&self) -> Checkpointer {
        Checkpointer {
            shard: self.shard.clone(),
            reader: self.me.clone(),
            mode: self.mode,
            worker: self.ports.worker.clone(),
        }
    }

    /// Asks the checkpoint writer for a write and waits for its answer, for the
    /// processor's checkpointer: a writer that does not answer is a checkpoint not
    /// written (yet).
    pub async fn ask_writer(
        &self,
        message: impl FnOnce(RpcReplyPort<Result<(), CheckpointError>>) -> CheckpointMsg,
    ) -> Result<(), CheckpointError> {
        ractor::call_t!(self.ports.writer, message, WRITER_TIMEOUT_MS).map_err(|e| {
            CheckpointError::NotWritten {
                shard: self.shard.clone(),
                why: e.to_string(),
            }
        })?
    }

    /// Waits for everything acked before to be written.
    pub async fn flush(&self) -> Result<(), CheckpointError> {
        let key = self.key.clone();
        self.ask_writer(|reply| CheckpointMsg::Flush { key, reply })
            .await
    }
}
