//! Coalesces checkpoint positions per shard and writes them to the lease table: at once
//! when the shard had no write in the last `checkpoint.interval`, then at most once per
//! interval while positions keep coming (one write covers thousands of records), plus
//! explicit flushes for SHARD_END, shutdown and handoff.
//!
//! * `pace`: the pure part — per shard, write now, write at an instant (now: the leading
//!   write; later: the trailing one), or wait.
//! * this file: the thin actor — the positions, a `Due` message to itself per write due
//!   (sent at once for the leading write, by `send_after` for the trailing one; at most
//!   one live per shard), and the conditional writes. No tick: an idle writer does
//!   nothing.
//!
//! Every write is conditional on the lease's owner and counter. A failed condition means
//! the lease was lost: the supervisor is told, and the shard's position is forgotten.
//!
//! Two-phase checkpoints (`Prepare`, `Commit`) are written at once, never paced: a
//! prepare writes the shard's coalesced position first (its later write would remove
//! the prepared one), then the pending position; a commit writes the prepared position
//! (or a later coalesced one) as the checkpoint, which removes the pending attributes in
//! the same write.

mod pace;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;
use tracing::{Instrument as _, debug, warn};

use crate::backend::{LeaseError, LeaseTable};
use crate::backoff::Backoff;
use crate::model::{Checkpoint, ExtendedSequenceNumber, Fence, LeaseKey, ShardId};
use crate::protocol::{CheckpointError, CheckpointMsg, SupervisorMsg};
use crate::status::CheckpointView;
use crate::telemetry::{Call, CallFailed, CheckpointRefused, CheckpointWritten, Telemetry};
use pace::{Decision, Pace};

/// Attempts for a flush the caller waits on (throttling and transient errors only).
const FLUSH_ATTEMPTS: u32 = 4;

pub(crate) struct CheckpointWriter;

pub(crate) struct WriterArgs {
    pub table: Arc<dyn LeaseTable>,
    pub interval: Duration,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub telemetry: Telemetry,
}

struct ShardPosition {
    fence: Fence,
    pending: Option<ExtendedSequenceNumber>,
    written: Option<Checkpoint>,
    /// A prepared checkpoint written to the row this epoch and not yet removed by a
    /// checkpoint write.
    prepared: Option<ExtendedSequenceNumber>,
    writes: u64,
    pace: Pace,
}

pub(crate) struct WriterState {
    args: WriterArgs,
    shards: BTreeMap<LeaseKey, ShardPosition>,
}

impl Actor for CheckpointWriter {
    type Msg = CheckpointMsg;
    type State = WriterState;
    type Arguments = WriterArgs;

    async fn pre_start(
        &self,
        _myself: ActorRef<Self::Msg>,
        args: WriterArgs,
    ) -> Result<WriterState, ActorProcessingErr> {
        Ok(WriterState {
            args,
            shards: BTreeMap::new(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: CheckpointMsg,
        state: &mut WriterState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            CheckpointMsg::Advance { key, fence, at } => {
                let entry = state.entry(&key, fence);
                let newer = match (&entry.pending, &entry.written) {
                    (Some(p), _) => at > *p,
                    (None, Some(Checkpoint::At(w))) => at > *w,
                    _ => true,
                };
                if newer {
                    entry.pending = Some(at);
                    let decision = entry.pace.advanced(Instant::now());
                    state.carry_out(&myself, &key, decision).await;
                }
            }
            CheckpointMsg::Prepare {
                key,
                fence,
                at,
                state: app_state,
                reply,
            } => {
                state.entry(&key, fence.clone());
                let mut result = state.write_pending(&myself, &key, FLUSH_ATTEMPTS).await;
                if result.is_ok() {
                    let write = Write::Prepare(&at, app_state.as_deref());
                    result = state.write(&key, &fence, write, FLUSH_ATTEMPTS).await;
                }
                let _ = reply.send(result);
            }
            CheckpointMsg::Commit {
                key,
                fence,
                at,
                reply,
            } => {
                let entry = state.entry(&key, fence);
                let target = match &entry.pending {
                    Some(p) if *p > at => p.clone(),
                    _ => at,
                };
                let already = entry.prepared.is_none()
                    && matches!(&entry.written, Some(Checkpoint::At(w)) if *w >= target);
                let result = if already {
                    Ok(())
                } else {
                    entry.pending = Some(target);
                    state.write_pending(&myself, &key, FLUSH_ATTEMPTS).await
                };
                let _ = reply.send(result);
            }
            CheckpointMsg::Flush { key, reply } => {
                let result = state.write_pending(&myself, &key, FLUSH_ATTEMPTS).await;
                let _ = reply.send(result);
            }
            CheckpointMsg::FlushAll(reply) => {
                let keys: Vec<LeaseKey> = state.shards.keys().cloned().collect();
                let mut failures = Vec::new();
                for key in keys {
                    if let Err(e) = state.write_pending(&myself, &key, FLUSH_ATTEMPTS).await {
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
                        Write::Checkpoint(&Checkpoint::ShardEnd, &children),
                        FLUSH_ATTEMPTS,
                    )
                    .await;
                if result.is_ok() {
                    state.shards.remove(&key);
                } else {
                    state.answered(&myself, &key);
                }
                let _ = reply.send(result);
            }
            CheckpointMsg::Forget(key) => {
                state.shards.remove(&key);
            }
            CheckpointMsg::Due { key, at } => {
                // A timer of a shard since forgotten (or ended) finds nothing.
                if let Some(shard) = state.shards.get_mut(&key) {
                    let pending = shard.pending.is_some();
                    let decision = shard.pace.due(at, Instant::now(), pending);
                    state.carry_out(&myself, &key, decision).await;
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

/// One conditional write of a shard's row.
#[derive(Clone, Copy)]
enum Write<'a> {
    /// The checkpoint (with the children, at SHARD_END); removes any prepared one.
    Checkpoint(&'a Checkpoint, &'a [ShardId]),
    /// A prepared checkpoint and its application state.
    Prepare(&'a ExtendedSequenceNumber, Option<&'a [u8]>),
}

impl WriterState {
    /// The shard's position, made on its first message; a new lease epoch (the shard was
    /// lost and taken again) starts over.
    fn entry(&mut self, key: &LeaseKey, fence: Fence) -> &mut ShardPosition {
        let interval = self.args.interval;
        let entry = self
            .shards
            .entry(key.clone())
            .or_insert_with(|| ShardPosition {
                fence: fence.clone(),
                pending: None,
                written: None,
                prepared: None,
                writes: 0,
                pace: Pace::new(interval),
            });
        if entry.fence != fence {
            entry.fence = fence;
            entry.written = None;
            entry.prepared = None;
        }
        entry
    }
    /// Does what the shard's pace decided: a paced write (one attempt: a throttled one
    /// is tried again an interval later, never in a loop), or a timer for the trailing
    /// write.
    async fn carry_out(
        &mut self,
        myself: &ActorRef<CheckpointMsg>,
        key: &LeaseKey,
        decision: Decision,
    ) {
        match decision {
            Decision::Wait => {}
            Decision::WriteAt(at) => schedule(myself, key, at),
            Decision::WriteNow => {
                if let Err(error) = self.write_pending(myself, key, 1).await {
                    debug!(message = "Checkpoint write deferred.", lease_key = %key, %error);
                }
            }
        }
    }

    /// Tells the shard's pace that a write was answered (any write: paced, flushed, a
    /// refused SHARD_END), and arms the retry it asks for. A shard whose lease was lost
    /// is gone by now, and needs nothing.
    fn answered(&mut self, myself: &ActorRef<CheckpointMsg>, key: &LeaseKey) {
        let Some(shard) = self.shards.get_mut(key) else {
            return;
        };
        let pending = shard.pending.is_some();
        if let Decision::WriteAt(at) = shard.pace.answered(Instant::now(), pending) {
            schedule(myself, key, at);
        }
    }

    /// Writes the shard's pending position, if it has one, and tells its pace.
    async fn write_pending(
        &mut self,
        myself: &ActorRef<CheckpointMsg>,
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
        let result = self
            .write(
                key,
                &fence,
                Write::Checkpoint(&Checkpoint::At(at), &[]),
                attempts,
            )
            .await;
        self.answered(myself, key);
        result
    }

    /// [`Self::attempt_writes`] in the shard's span (under the worker's, which this
    /// actor runs in), so a write's lines name the shard and the lease counter as its
    /// reader's do.
    async fn write(
        &mut self,
        key: &LeaseKey,
        fence: &Fence,
        write: Write<'_>,
        attempts: u32,
    ) -> Result<(), CheckpointError> {
        let span = tracing::info_span!(
            "checkpoint",
            shard_id = %key.shard_id(),
            lease_counter = fence.counter,
        );
        self.attempt_writes(key, fence, write, attempts)
            .instrument(span)
            .await
    }

    async fn attempt_writes(
        &mut self,
        key: &LeaseKey,
        fence: &Fence,
        write: Write<'_>,
        attempts: u32,
    ) -> Result<(), CheckpointError> {
        let shard_id = key.shard_id();
        let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
        let mut attempt = 0;
        loop {
            attempt += 1;
            let started = Instant::now();
            let answer = match write {
                Write::Checkpoint(checkpoint, children) => {
                    self.args
                        .table
                        .checkpoint(key, fence, checkpoint, children)
                        .await
                }
                Write::Prepare(at, state) => {
                    self.args
                        .table
                        .prepare_checkpoint(key, fence, at, state)
                        .await
                }
            };
            match answer {
                Ok(()) => {
                    let entry = self.shards.get_mut(key);
                    match write {
                        Write::Checkpoint(checkpoint, _) => {
                            self.args.telemetry.emit(CheckpointWritten {
                                key,
                                at: checkpoint,
                                took: started.elapsed(),
                            });
                            if let Some(entry) = entry {
                                // Written exactly what was pending: nothing newer has
                                // come since.
                                if matches!((&entry.pending, checkpoint), (Some(p), Checkpoint::At(c)) if p == c)
                                {
                                    entry.pending = None;
                                }
                                entry.written = Some(checkpoint.clone());
                                entry.prepared = None;
                                entry.writes += 1;
                            }
                        }
                        Write::Prepare(at, _) => {
                            if let Some(entry) = entry {
                                entry.prepared = Some(at.clone());
                                entry.writes += 1;
                            }
                        }
                    }
                    return Ok(());
                }
                Err(LeaseError::ConditionFailed { owner, .. }) => {
                    self.args.telemetry.emit(CheckpointRefused {
                        key,
                        owner: owner.as_ref(),
                    });
                    self.shards.remove(key);
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
                    self.args.telemetry.emit(CallFailed {
                        call: Call::Checkpoint,
                        shard: None,
                        error: &error,
                    });
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

/// Sends `Due` for `at`: at once when `at` has come (behind the messages already queued,
/// so positions that arrived with this one share its write), else by a timer.
fn schedule(myself: &ActorRef<CheckpointMsg>, key: &LeaseKey, at: Instant) {
    let key = key.clone();
    let wait = at.saturating_duration_since(Instant::now());
    if wait.is_zero() {
        let _ = myself.cast(CheckpointMsg::Due { key, at });
    } else {
        drop(myself.send_after(wait, move || CheckpointMsg::Due { key, at }));
    }
}
