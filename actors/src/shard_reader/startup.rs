//! How a reader starts: it flushes what a previous incarnation acked and reads its lease
//! (once), waits for the parents not yet seen finished (polling only those), then
//! starts its processor at the lease's checkpoint. Each step is a message of its own
//! (`Start`, `WaitParents`), so a shutdown or a lost lease can come between them.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use ractor::{ActorProcessingErr, ActorRef};
use tracing::{debug, info};

use super::context::{Ctx, WRITER_TIMEOUT_MS, Wires};
use super::pure;
use crate::backend::{IteratorPosition, LeaseTable};
use crate::backoff::Backoff;
use crate::model::{ExtendedSequenceNumber, Lease, LeaseKey, ShardId};
use crate::processor::{HostArgs, HostFence};
use crate::protocol::{
    CheckpointError, CheckpointMsg, ProcessorMsg, ShardInfo, StopReason, SupervisorMsg,
};

/// What reading the lease at start found.
pub(super) enum Started {
    /// The shard is not this reader's to read (any more), or is finished.
    Stop(StopReason),
    /// The table did not answer: try again after this long.
    Again(Duration),
    /// The lease, still this reader's, with a shard to read.
    Lease(Box<Lease>),
}

/// Flushes what a previous incarnation acked, then reads the lease (see [`Started`]).
pub(super) async fn read_lease(
    ctx: &Ctx,
    wires: &Wires,
    backoff: &mut Backoff,
) -> Result<Started, ActorProcessingErr> {
    let key = ctx.key.clone();
    match ractor::call_t!(
        wires.writer,
        |reply| CheckpointMsg::Flush { key, reply },
        WRITER_TIMEOUT_MS
    ) {
        Ok(Err(CheckpointError::LeaseLost { .. })) => {
            return Ok(Started::Stop(StopReason::LeaseLost));
        }
        Ok(_) => {}
        Err(e) => return Err(format!("shard {}: checkpoint writer: {e}", ctx.shard).into()),
    }
    let lease = match ctx.ports.table.get(&ctx.key).await {
        Ok(Some(lease)) => lease,
        Ok(None) => return Ok(Started::Stop(StopReason::LeaseLost)),
        Err(error) if error.is_retryable() => return Ok(Started::Again(backoff.next_random())),
        Err(error) => {
            return Err(format!("shard {}: reading its lease: {error}", ctx.shard).into());
        }
    };
    if lease.fence() != ctx.fence {
        info!(message = "Lease changed hands before reading started.", shard_id = %ctx.shard);
        return Ok(Started::Stop(StopReason::LeaseLost));
    }
    if lease.checkpoint.is_shard_end() {
        let _ = wires.supervisor.cast(SupervisorMsg::ShardFinished {
            key: ctx.key.clone(),
            children: None,
        });
        return Ok(Started::Stop(StopReason::ShardEnd));
    }
    Ok(Started::Lease(Box::new(lease)))
}

/// The parents of the shard not yet seen at SHARD_END.
#[derive(Default)]
pub(super) struct Parents {
    waiting_on: Vec<ShardId>,
}

/// What a look at the parents found.
#[derive(Debug, PartialEq)]
pub(super) enum ParentsStep {
    /// A parent is not finished: look again after this long.
    Blocked(Duration),
    /// A parent's row could not be read: look again after this long.
    Retry(Duration),
    /// Every parent is finished (or its row gone, cleaned up after it finished).
    Done,
}

impl Parents {
    pub fn new(parents: Vec<ShardId>) -> Self {
        Self {
            waiting_on: parents,
        }
    }

    /// Reads the parents not yet seen finished, first to last, stopping at the first
    /// that is not. `blocked`: the shard already waits (said once, not at every look).
    pub async fn wait(
        &mut self,
        table: &dyn LeaseTable,
        key: &LeaseKey,
        blocked: bool,
        poll: Duration,
        backoff: &mut Backoff,
    ) -> ParentsStep {
        let shard = key.shard_id();
        while let Some(parent) = self.waiting_on.first().cloned() {
            match table.get(&key.sibling(&parent)).await {
                Ok(Some(p)) if !p.checkpoint.is_shard_end() => {
                    if !blocked {
                        info!(message = "Shard waits for its parent to finish.", shard_id = %shard, parent = %parent);
                    }
                    return ParentsStep::Blocked(poll);
                }
                Ok(_) => {
                    self.waiting_on.remove(0);
                }
                Err(error) => {
                    debug!(message = "Parent lease unreadable; retrying.", shard_id = %shard, %error);
                    return ParentsStep::Retry(backoff.next_random());
                }
            }
        }
        ParentsStep::Done
    }
}

/// A started processor and where reading starts.
pub(super) struct Begun {
    pub processor: ActorRef<ProcessorMsg>,
    pub position: IteratorPosition,
    pub skip: Option<ExtendedSequenceNumber>,
}

/// Spawns the processor (a child of the reader) and initializes it with the shard's
/// facts; `None` if the checkpoint leaves nothing to read.
pub(super) async fn start_processor(
    ctx: &Ctx,
    wires: &Wires,
    revoked: &Arc<AtomicBool>,
    stopping: &Arc<AtomicBool>,
) -> Result<Option<Begun>, ActorProcessingErr> {
    let lease = &ctx.lease;
    let (position, skip) = match pure::start_position(&lease.checkpoint, ctx.initial_timestamp) {
        Ok(Some(start)) => start,
        Ok(None) => return Ok(None),
        Err(error) => return Err(format!("shard {}: {error}", ctx.shard).into()),
    };
    let info = ShardInfo {
        shard_id: ctx.shard.clone(),
        stream: ctx.stream.clone(),
        stream_arn: ctx.stream_arn.clone(),
        parents: lease.parent_shard_ids.clone(),
        hash_range: lease.hash_range,
        starting_at: lease.checkpoint.clone(),
        pending_checkpoint: lease.pending_checkpoint.clone(),
        pending_checkpoint_state: lease.pending_checkpoint_state.clone(),
    };
    let host = HostArgs {
        mode: ctx.mode,
        wait: ctx.ports.wait.clone(),
        revoked: revoked.clone(),
        stopping: stopping.clone(),
        fence: HostFence {
            fencing: ctx.ports.fencing.clone(),
            key: ctx.key.clone(),
            fence: ctx.fence.clone(),
            recheck: ctx.settings().reader.poll_interval,
        },
        failures: ctx.ports.failures.clone(),
    };
    let processor = wires
        .processors
        .start(
            &info,
            host,
            ctx.settings().processor.parallelism,
            wires.me.get_cell(),
        )
        .await?;
    processor.cast(ProcessorMsg::Initialize(info))?;
    Ok(Some(Begun {
        processor,
        position,
        skip,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryDynamo;
    use crate::model::Checkpoint;

    fn lease(id: &str, checkpoint: Checkpoint, parents: &[&str]) -> Lease {
        let parents = parents.iter().map(|p| ShardId::new(*p)).collect();
        Lease::new(&ShardId::new(id), checkpoint, parents, None)
    }

    #[tokio::test(start_paused = true)]
    async fn a_shard_waits_for_each_parent_until_it_is_finished_or_gone() {
        let table = MemoryDynamo::new().lease_table("t");
        table.ensure_table().await.unwrap();
        let poll = Duration::from_secs(10);
        let mut backoff = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
        for row in [
            lease("shardId-1", Checkpoint::ShardEnd, &[]),
            lease("shardId-2", Checkpoint::TrimHorizon, &[]),
            lease(
                "shardId-3",
                Checkpoint::TrimHorizon,
                &["shardId-1", "shardId-2", "shardId-0"],
            ),
        ] {
            assert!(table.create_if_absent(&row).await.unwrap());
        }
        let child = LeaseKey::from(&ShardId::new("shardId-3"));
        let mut parents = Parents::new(
            ["shardId-1", "shardId-2", "shardId-0"]
                .map(ShardId::new)
                .to_vec(),
        );
        let step = parents
            .wait(&table, &child, false, poll, &mut backoff)
            .await;
        assert_eq!(step, ParentsStep::Blocked(poll));
        assert_eq!(
            parents.waiting_on,
            ["shardId-2", "shardId-0"].map(ShardId::new),
            "a finished parent is not read again"
        );

        let gone = table
            .get(&LeaseKey::from(&ShardId::new("shardId-2")))
            .await
            .unwrap()
            .unwrap();
        table.delete(&gone.key, &gone.fence()).await.unwrap();
        // shardId-2's row is gone (cleaned up after it finished), shardId-0 never had one.
        let step = parents.wait(&table, &child, true, poll, &mut backoff).await;
        assert_eq!(step, ParentsStep::Done);
        assert!(parents.waiting_on.is_empty());
    }
}
