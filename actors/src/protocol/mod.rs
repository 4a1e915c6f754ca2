//! The protocol below the actors: every message an actor receives, the reasons that
//! travel with them, and (in `shard`) the types a processor speaks to its reader with.
//!
//! Why a separate layer: when each message enum lived in the actor that receives it,
//! the actors imported each other in one cycle (the reader the writer's mailbox, the
//! writer its parent's, the status snapshots five actors). Here, an actor imports the
//! protocol, the status snapshots, the model, the ports and its own pure core; only a
//! parent knows its children's actor types (the supervisor its children, the reader
//! the processor host it starts). `scripts/module-graph.py` checks it: no cycle, no
//! import pointing up.

use std::collections::BTreeMap;
use std::time::Duration;

use ractor::RpcReplyPort;
use tokio::time::Instant;

use crate::backend::ChildShard;
use crate::model::{BatchId, ExtendedSequenceNumber, Fence, Lease, LeaseKey, ShardId, WorkerId};
use crate::status::{
    CheckpointView, KeeperStatus, ReleaseReport, ShardShutdown, ShardStatus, ShutdownReport,
    WatcherStatus, WorkerStatus,
};

mod error;
mod failure;
mod lane;
mod shard;

pub use error::ProcessorError;
pub(crate) use failure::{Discard, FailureNews, Reason};
pub(crate) use lane::LaneBook;
pub(crate) use shard::PartOutcome;
pub use shard::{
    AckToken, Batch, CheckpointError, Checkpointer, PreparedCheckpoint, ProcessorMsg, ShardInfo,
};

/// Why a shard reader stopped on purpose, carried in ractor's stop reason (a string)
/// and read back by the supervisor with [`StopReason::parse`]: anything else is a
/// failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    /// The shard was read to its end and SHARD_END is written.
    ShardEnd,
    /// Another worker owns the lease now (or a write under it was refused).
    LeaseLost,
    /// A graceful stop: shutdown or handoff.
    Shutdown,
}

impl StopReason {
    pub(crate) const ALL: [StopReason; 3] = [Self::ShardEnd, Self::LeaseLost, Self::Shutdown];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::ShardEnd => "shard_end",
            Self::LeaseLost => "lease_lost",
            Self::Shutdown => "shutdown",
        }
    }

    /// The reason to hand to `ActorRef::stop`.
    pub(crate) fn text(self) -> Option<String> {
        Some(self.as_str().to_owned())
    }

    /// The reason an actor stopped with, if it is one of these.
    pub(crate) fn parse(reason: Option<&str>) -> Option<Self> {
        Self::ALL.into_iter().find(|r| Some(r.as_str()) == reason)
    }
}

/// Why a lease left this worker: the reason in the `lease_moved` event, the key of the
/// `given` counts in the keeper's status, and which metric counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum LeaseMove {
    /// Passed to a worker that asked for it.
    HandedOff,
    /// Let go (shutdown, repeated failures, an orphan row, owned by name but not run).
    Released,
    /// The shard reached SHARD_END.
    ShardEnded,
    /// Taken by another worker, or a write under it was refused.
    Lost,
    /// Its row can no longer be read.
    Unreadable,
}

impl LeaseMove {
    #[cfg(test)]
    pub(crate) const ALL: [LeaseMove; 5] = [
        Self::HandedOff,
        Self::Released,
        Self::ShardEnded,
        Self::Lost,
        Self::Unreadable,
    ];

    pub(crate) const fn as_str(self) -> &'static str {
        match self {
            Self::HandedOff => "handed_off",
            Self::Released => "released",
            Self::ShardEnded => "shard_ended",
            Self::Lost => "lost",
            Self::Unreadable => "unreadable",
        }
    }
}

/// Why a processor's `shard_ended` or `shutdown_requested` did not succeed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ProcessorFailure {
    /// It answered with an error.
    #[error("{0}")]
    Returned(String),
    #[error("the processor has stopped")]
    Stopped,
    #[error("the processor stopped without answering")]
    NoAnswer,
    #[error("the processor did not answer within {}", humantime::format_duration(*.0))]
    TimedOut(Duration),
}

#[derive(Debug)]
pub(crate) enum SupervisorMsg {
    LeaseGained(Box<Lease>),
    /// The lease was lost under this fence (a newer epoch of it is left alone).
    LeaseLost(LeaseKey, Fence),
    ShardFinished {
        key: LeaseKey,
        children: Option<Vec<ChildShard>>,
    },
    RestartShard(LeaseKey),
    /// A live worker asked for this lease: stop its reader gracefully, flush, and let
    /// the keeper pass it on.
    HandOff {
        key: LeaseKey,
        fence: Fence,
        to: WorkerId,
    },
    /// The lease's stream left the set: stop its reader gracefully, flush, and let the
    /// keeper release it (`KeeperMsg::Retired`).
    Retire {
        key: LeaseKey,
        fence: Fence,
    },
    /// The keeper has handed over what peers asked for (or the drain timed out): finish
    /// the shutdown.
    DrainDone,
    /// The keeper saw a lease row the last listing does not explain: list now.
    ListShardsNow,
    /// Something a core actor found makes going on wrong (the lease table holds another
    /// stream's positions; the table is gone): the worker stops, with this reason.
    Fatal(String),
    Status(RpcReplyPort<WorkerStatus>),
    Shutdown(RpcReplyPort<ShutdownReport>),
}

#[derive(Debug)]
pub(crate) enum KeeperMsg {
    Tick,
    /// Scan now (the watcher made lease rows or has a listing the keeper waits for).
    ScanNow,
    /// An owner of leases turns dead about now: read the heartbeat rows (and the lease
    /// rows, if it did).
    Deadline,
    /// Follow the handoffs in flight (requests made, or a drain).
    PollHandoffs,
    /// A former stream's rows are due for deletion about now: scan.
    FormerDue,
    /// The supervisor learned the lease is lost (a refused checkpoint) under this fence.
    Lost(LeaseKey, Fence),
    /// The shard reached SHARD_END under this fence; it no longer counts as held.
    Finished(LeaseKey, Fence),
    /// The shard failed too often here: release it and leave it alone for a while.
    GiveUp(LeaseKey),
    /// The shard's reader has stopped and its checkpoint is flushed: pass the lease on.
    Transfer {
        key: LeaseKey,
        fence: Fence,
        to: WorkerId,
        outcome: ShardShutdown,
    },
    /// A former stream's lease: its reader has stopped and its checkpoint is flushed
    /// (`SupervisorMsg::Retire`): release it.
    Retired {
        key: LeaseKey,
        fence: Fence,
        outcome: ShardShutdown,
    },
    /// The worker is shutting down: take nothing more, hand over whatever is asked for,
    /// and tell the supervisor (`DrainDone`) when nothing more will be asked.
    Drain,
    ReleaseAll(RpcReplyPort<ReleaseReport>),
    Status(RpcReplyPort<KeeperStatus>),
}

#[derive(Debug)]
pub(crate) enum WatcherMsg {
    Sync,
    /// A reader reached SHARD_END of the lease `parent` (whose stream the children are
    /// of); `None` when the server did not name the children.
    ChildrenFound {
        parent: LeaseKey,
        children: Option<Vec<ChildShard>>,
    },
    /// List now, off the periodic schedule (the lease keeper saw a row the last
    /// listing does not explain).
    ListNow,
    Status(RpcReplyPort<WatcherStatus>),
    /// The streams that joined the set, described (and in fan-out mode given their
    /// consumer) by a task of the watcher's: `wanted` is the list they were resolved
    /// for.
    Resolved {
        wanted: Vec<crate::model::ConsumedStream>,
        resolved: BTreeMap<String, Result<crate::model::Resolved, String>>,
    },
}

pub(crate) enum CheckpointMsg {
    /// The contiguous processed prefix of a shard now ends at this position.
    Advance {
        key: LeaseKey,
        fence: Fence,
        at: ExtendedSequenceNumber,
    },
    /// Write this shard's pending position now.
    Flush {
        key: LeaseKey,
        reply: RpcReplyPort<Result<(), CheckpointError>>,
    },
    /// Record a prepared (two-phase) checkpoint: the shard's coalesced position is
    /// written first (a later write of it would remove the prepared one), then the
    /// prepared position and state, fenced. Answered once written.
    Prepare {
        key: LeaseKey,
        fence: Fence,
        at: ExtendedSequenceNumber,
        state: Option<Vec<u8>>,
        reply: RpcReplyPort<Result<(), CheckpointError>>,
    },
    /// Commit a prepared checkpoint: write `at` (or the shard's coalesced position, if
    /// later) as the checkpoint, which removes the prepared one in the same write.
    /// Answered once written; nothing is written when a checkpoint at or past `at` was
    /// written since the prepare (it removed the prepared one already).
    Commit {
        key: LeaseKey,
        fence: Fence,
        at: ExtendedSequenceNumber,
        reply: RpcReplyPort<Result<(), CheckpointError>>,
    },
    /// Write every pending position now; answers how many shards failed.
    FlushAll(RpcReplyPort<Vec<CheckpointError>>),
    /// Write the mandatory SHARD_END checkpoint (with the children, when known).
    ShardEnd {
        key: LeaseKey,
        fence: Fence,
        children: Vec<ShardId>,
        reply: RpcReplyPort<Result<(), CheckpointError>>,
    },
    /// The shard is no longer ours: drop its pending position.
    Forget(LeaseKey),
    /// The trailing write of a shard scheduled for `at` is due.
    Due {
        key: LeaseKey,
        at: Instant,
    },
    Status(RpcReplyPort<BTreeMap<LeaseKey, CheckpointView>>),
}

#[derive(Debug)]
pub(crate) enum Acks {
    Batch(BatchId),
    Records(Vec<AckToken>),
}

#[derive(Debug)]
pub(crate) enum ReaderMsg {
    Start,
    WaitParents,
    Acquire,
    Fetch,
    Ack(Acks),
    Checkpoint(
        ExtendedSequenceNumber,
        RpcReplyPort<Result<(), CheckpointError>>,
    ),
    Flush(RpcReplyPort<Result<(), CheckpointError>>),
    /// `Checkpointer::prepare_checkpoint`: the position and the application state.
    Prepare(
        ExtendedSequenceNumber,
        Option<Vec<u8>>,
        RpcReplyPort<Result<(), CheckpointError>>,
    ),
    /// `PreparedCheckpoint::checkpoint`: commit the prepared position.
    Commit(
        ExtendedSequenceNumber,
        RpcReplyPort<Result<(), CheckpointError>>,
    ),
    LeaseLost,
    Shutdown(RpcReplyPort<ShardShutdown>),
    /// The processor answered `shard_ended` or `shutdown_requested`.
    ProcessorDone(Result<(), ProcessorFailure>),
    /// The processor did not stop after a lease loss: stop regardless.
    StopNow,
    /// The processor failed. Sent to itself, so that it queues behind the acks the
    /// processor sent before failing (supervision events overtake messages).
    ProcessorFailed(String),
    /// What the failure policy did with a batch (`[failure]`, in the processor host).
    Failure(FailureNews),
    Status(RpcReplyPort<ShardStatus>),
    /// The processor waits on something outside (`processor::ProcessorWait`): check
    /// whether it is past its stall time, every second from the first of these on.
    WatchWaits,
    /// An event of the shard's fan-out subscription (`generation` tells a current
    /// subscription's events from a cancelled one's).
    Event {
        generation: u64,
        event: Result<Option<crate::backend::ShardEvent>, crate::backend::StreamError>,
    },
    /// `reader.batch_window`: the records gathered may be due to the processor (the
    /// window opened that long ago), even if no read comes.
    WindowDue,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stop_reason_reads_back_as_itself_and_nothing_else_does() {
        for reason in StopReason::ALL {
            assert_eq!(StopReason::parse(reason.text().as_deref()), Some(reason));
        }
        for other in [
            None,
            Some(""),
            Some("lease lost"),
            Some("Shutdown"),
            Some("panicked"),
        ] {
            assert_eq!(StopReason::parse(other), None, "{other:?}");
        }
    }

    #[test]
    fn lease_move_names_are_distinct() {
        let names: std::collections::BTreeSet<&str> =
            LeaseMove::ALL.iter().map(|m| m.as_str()).collect();
        assert_eq!(names.len(), LeaseMove::ALL.len());
    }
}
