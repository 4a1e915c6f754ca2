//! Coalesces checkpoint positions per shard and writes them to the lease table: at most
//! one write per shard per `checkpoint.interval` (one write covers thousands of
//! records), plus explicit flushes for SHARD_END, shutdown and handoff.
//!
//! Every write is conditional on the lease's owner and counter. A failed condition means
//! the lease was lost: the supervisor is told, and the shard's position is forgotten.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tracing::{debug, warn};

use crate::backend::{LeaseError, LeaseTable};
use crate::backoff::Backoff;
use crate::metrics_reporter::{Metric, MetricsMsg, Sample};
use crate::model::{Checkpoint, ExtendedSequenceNumber, Fence, LeaseKey, ShardId};
use crate::processor::CheckpointError;
use crate::supervisor::SupervisorMsg;

/// Attempts for a flush the caller waits on (throttling and transient errors only).
const FLUSH_ATTEMPTS: u32 = 4;

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
    Tick,
    Status(RpcReplyPort<HashMap<LeaseKey, CheckpointView>>),
}

/// What the writer knows of one shard, for status pages.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CheckpointView {
    /// The last position written to the lease table by this worker.
    pub written: Option<String>,
    /// A position waiting for the next write.
    pub pending: Option<String>,
    pub writes: u64,
}

pub(crate) struct CheckpointWriter;

pub(crate) struct WriterArgs {
    pub table: Arc<dyn LeaseTable>,
    pub interval: Duration,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub metrics: ActorRef<MetricsMsg>,
}

struct ShardPosition {
    fence: Fence,
    pending: Option<ExtendedSequenceNumber>,
    written: Option<Checkpoint>,
    writes: u64,
}

pub(crate) struct WriterState {
    args: WriterArgs,
    shards: HashMap<LeaseKey, ShardPosition>,
}

impl Actor for CheckpointWriter {
    type Msg = CheckpointMsg;
    type State = WriterState;
    type Arguments = WriterArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: WriterArgs,
    ) -> Result<WriterState, ActorProcessingErr> {
        myself.send_interval(args.interval, || CheckpointMsg::Tick);
        Ok(WriterState {
            args,
            shards: HashMap::new(),
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: CheckpointMsg,
        state: &mut WriterState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            CheckpointMsg::Advance { key, fence, at } => {
                let entry = state.shards.entry(key).or_insert_with(|| ShardPosition {
                    fence: fence.clone(),
                    pending: None,
                    written: None,
                    writes: 0,
                });
                if entry.fence != fence {
                    // A new lease epoch (the shard was lost and taken again): start over.
                    entry.fence = fence;
                    entry.written = None;
                }
                let newer = match (&entry.pending, &entry.written) {
                    (Some(p), _) => at > *p,
                    (None, Some(Checkpoint::At(w))) => at > *w,
                    _ => true,
                };
                if newer {
                    entry.pending = Some(at);
                }
            }
            CheckpointMsg::Flush { key, reply } => {
                let result = state.write_pending(&key, FLUSH_ATTEMPTS).await;
                let _ = reply.send(result);
            }
            CheckpointMsg::FlushAll(reply) => {
                let keys: Vec<LeaseKey> = state.shards.keys().cloned().collect();
                let mut failures = Vec::new();
                for key in keys {
                    if let Err(e) = state.write_pending(&key, FLUSH_ATTEMPTS).await {
                        failures.push(e);
                    }
                }
                let _ = reply.send(failures);
            }
            CheckpointMsg::ShardEnd {
                key,
                fence,
                children,
                reply,
            } => {
                let result = state
                    .write(
                        &key,
                        &fence,
                        &Checkpoint::ShardEnd,
                        &children,
                        FLUSH_ATTEMPTS,
                    )
                    .await;
                if result.is_ok() {
                    state.shards.remove(&key);
                }
                let _ = reply.send(result);
            }
            CheckpointMsg::Forget(key) => {
                state.shards.remove(&key);
            }
            CheckpointMsg::Tick => {
                let due: Vec<LeaseKey> = state
                    .shards
                    .iter()
                    .filter(|(_, s)| s.pending.is_some())
                    .map(|(k, _)| k.clone())
                    .collect();
                for key in due {
                    // One attempt per tick: a throttled write is retried at the next one.
                    if let Err(error) = state.write_pending(&key, 1).await {
                        debug!(message = "Checkpoint write deferred.", lease_key = %key, %error);
                    }
                }
            }
            CheckpointMsg::Status(reply) => {
                let view = state
                    .shards
                    .iter()
                    .map(|(k, s)| {
                        (
                            k.clone(),
                            CheckpointView {
                                written: s.written.as_ref().map(|c| c.to_string()),
                                pending: s.pending.as_ref().map(|p| p.to_string()),
                                writes: s.writes,
                            },
                        )
                    })
                    .collect();
                let _ = reply.send(view);
            }
        }
        Ok(())
    }
}

impl WriterState {
    async fn write_pending(
        &mut self,
        key: &LeaseKey,
        attempts: u32,
    ) -> Result<(), CheckpointError> {
        let Some(shard) = self.shards.get(key) else {
            return Ok(());
        };
        let Some(at) = shard.pending.clone() else {
            return Ok(());
        };
        let fence = shard.fence.clone();
        self.write(key, &fence, &Checkpoint::At(at), &[], attempts)
            .await
    }

    async fn write(
        &mut self,
        key: &LeaseKey,
        fence: &Fence,
        checkpoint: &Checkpoint,
        children: &[ShardId],
        attempts: u32,
    ) -> Result<(), CheckpointError> {
        let shard_id = key.shard_id();
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        let mut attempt = 0;
        loop {
            attempt += 1;
            match self
                .args
                .table
                .checkpoint(key, fence, checkpoint, children)
                .await
            {
                Ok(()) => {
                    let _ = self
                        .args
                        .metrics
                        .cast(MetricsMsg::Record(vec![Sample::shard(
                            Metric::CheckpointWrites,
                            &shard_id,
                            1.0,
                        )]));
                    if let Some(entry) = self.shards.get_mut(key) {
                        // Written exactly what was pending: nothing newer has come since.
                        if matches!((&entry.pending, checkpoint), (Some(p), Checkpoint::At(c)) if p == c)
                        {
                            entry.pending = None;
                        }
                        entry.written = Some(checkpoint.clone());
                        entry.writes += 1;
                    }
                    return Ok(());
                }
                Err(LeaseError::ConditionFailed { owner, .. }) => {
                    warn!(
                        message = "Checkpoint refused: the lease has another owner or epoch.",
                        lease_key = %key,
                        owner = ?owner,
                    );
                    self.shards.remove(key);
                    let _ = self
                        .args
                        .metrics
                        .cast(MetricsMsg::Record(vec![Sample::shard(
                            Metric::CheckpointFailures,
                            &shard_id,
                            1.0,
                        )]));
                    let _ = self
                        .args
                        .supervisor
                        .cast(SupervisorMsg::LeaseLost(key.clone(), fence.clone()));
                    return Err(CheckpointError::LeaseLost { shard: shard_id });
                }
                Err(LeaseError::NotFound { .. }) => {
                    self.shards.remove(key);
                    let _ = self
                        .args
                        .supervisor
                        .cast(SupervisorMsg::LeaseLost(key.clone(), fence.clone()));
                    return Err(CheckpointError::LeaseLost { shard: shard_id });
                }
                Err(error) => {
                    let throttled = matches!(error, LeaseError::Throttled { .. });
                    let _ = self.args.metrics.cast(MetricsMsg::Record(vec![Sample::new(
                        if throttled {
                            Metric::Throttles
                        } else {
                            Metric::ApiErrors
                        },
                        1.0,
                    )]));
                    if !error.is_retryable() || attempt >= attempts {
                        warn!(message = "Checkpoint write failed.", lease_key = %key, %error);
                        return Err(CheckpointError::NotWritten {
                            shard: shard_id,
                            why: error.to_string(),
                        });
                    }
                    tokio::time::sleep(backoff.next_random()).await;
                }
            }
        }
    }
}
