//! How a shard's processing ends: read to its end (`shard_ended`, then the SHARD_END
//! checkpoint and the children reported), or asked to shut down (`shutdown_requested`,
//! then a flush and the answer to whoever asked). The processor is asked once and its
//! answer comes back as `ProcessorDone`, queued behind any acks it sent before
//! answering; this part holds what the end needs until then.

use ractor::{ActorProcessingErr, RpcReplyPort};

use super::context::{Ctx, WRITER_TIMEOUT_MS, Wires};
use super::outbox::child_ids;
use super::pure::{self, Phase};
use crate::backend::ChildShard;
use crate::model::ShardId;
use crate::protocol::{
    CheckpointError, CheckpointMsg, Checkpointer, ProcessorFailure, ProcessorMsg, ReaderMsg,
    StopReason, SupervisorMsg,
};
use crate::status::ShardShutdown;

#[derive(Default)]
pub(super) struct Ending {
    /// The children the shard's end named, for its SHARD_END checkpoint.
    children: Option<Vec<ChildShard>>,
    /// Who asked for the shutdown under way, answered once it is done.
    reply: Option<RpcReplyPort<ShardShutdown>>,
}

impl Ending {
    /// The shard is read to its end; the read named these children.
    pub fn read_to_end(&mut self, children: Option<Vec<ChildShard>>) {
        self.children = children;
    }

    /// A shutdown is asked for in `phase`: `true` if it goes on (the reply is kept),
    /// `false` if the shard was already stopping (the reply is answered so).
    pub fn shutdown(
        &mut self,
        phase: Phase,
        shard: &ShardId,
        reply: RpcReplyPort<ShardShutdown>,
    ) -> bool {
        if pure::already_stopping(phase) {
            let _ = reply.send(ShardShutdown {
                shard_id: shard.clone(),
                processor_ok: true,
                checkpoint_flushed: false,
                error: Some(format!("the shard was already stopping ({phase:?})")),
            });
            return false;
        }
        self.reply = Some(reply);
        true
    }

    /// The processor answered `shard_ended`: writes SHARD_END (with the children) and
    /// reports the shard finished. `Ok(ShardEnd)` once written, `Ok(LeaseLost)` if the
    /// lease was lost first.
    pub async fn shard_ended(
        &mut self,
        ctx: &Ctx,
        wires: &Wires,
        answer: Result<(), ProcessorFailure>,
    ) -> Result<StopReason, ActorProcessingErr> {
        if let Err(error) = answer {
            return Err(format!("shard {}: shard_ended failed: {error}", ctx.shard).into());
        }
        let children: Vec<ShardId> = child_ids(self.children.as_deref());
        let key = ctx.key.clone();
        let fence = ctx.fence.clone();
        let written = ractor::call_t!(
            wires.writer,
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
                let _ = wires.supervisor.cast(SupervisorMsg::ShardFinished {
                    key: ctx.key.clone(),
                    children: pure::reported_children(
                        self.children.take(),
                        ctx.lease.hash_range.as_ref(),
                    ),
                });
                Ok(StopReason::ShardEnd)
            }
            Ok(Err(CheckpointError::LeaseLost { .. })) => Ok(StopReason::LeaseLost),
            Ok(Err(error)) => {
                Err(format!("shard {}: SHARD_END checkpoint: {error}", ctx.shard).into())
            }
            Err(error) => Err(format!("shard {}: SHARD_END checkpoint: {error}", ctx.shard).into()),
        }
    }

    /// The processor answered `shutdown_requested`: flushes what it acked and answers
    /// whoever asked for the shutdown.
    pub async fn shut_down(
        &mut self,
        ctx: &Ctx,
        wires: &Wires,
        answer: Result<(), ProcessorFailure>,
    ) {
        let flushed = wires.flush(&ctx.key).await;
        let outcome = shutdown_outcome(&ctx.shard, &answer, &flushed);
        if let Some(reply) = self.reply.take() {
            let _ = reply.send(outcome);
        }
    }
}

/// What a shutdown answers: whether the processor and the flush went well, and the
/// first error.
fn shutdown_outcome(
    shard: &ShardId,
    answer: &Result<(), ProcessorFailure>,
    flushed: &Result<(), CheckpointError>,
) -> ShardShutdown {
    ShardShutdown {
        shard_id: shard.clone(),
        processor_ok: answer.is_ok(),
        checkpoint_flushed: flushed.is_ok(),
        error: match (answer, flushed) {
            (Err(e), _) => Some(format!("shutdown_requested: {e}")),
            (_, Err(e)) => Some(e.to_string()),
            _ => None,
        },
    }
}

/// Sends `shard_ended` or `shutdown_requested` and forwards the answer as
/// `ProcessorDone`, which queues behind any acks the processor sent before answering.
pub(super) fn ask_processor(
    ctx: &Ctx,
    wires: &Wires,
    message: fn(Checkpointer, RpcReplyPort<Result<(), String>>) -> ProcessorMsg,
) {
    let me = &wires.me;
    let Some(processor) = &wires.processor else {
        let _ = me.cast(ReaderMsg::ProcessorDone(Ok(())));
        return;
    };
    let (tx, rx) = ractor::concurrency::oneshot();
    if processor
        .cast(message(wires.checkpointer.clone(), tx.into()))
        .is_err()
    {
        let _ = me.cast(ReaderMsg::ProcessorDone(Err(ProcessorFailure::Stopped)));
        return;
    }
    let timeout = ctx.settings().supervision.shutdown_timeout;
    let reader = me.clone();
    tokio::spawn(async move {
        let result = match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(result)) => result.map_err(ProcessorFailure::Returned),
            Ok(Err(_)) => Err(ProcessorFailure::NoAnswer),
            Err(_) => Err(ProcessorFailure::TimedOut(timeout)),
        };
        let _ = reader.cast(ReaderMsg::ProcessorDone(result));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shard() -> ShardId {
        ShardId::new("shardId-000000000001")
    }

    #[test]
    fn a_shutdown_of_a_shard_already_stopping_is_answered_at_once() {
        for (phase, goes_on) in [
            (Phase::Starting, true),
            (Phase::BlockedOnParent, true),
            (Phase::Reading, true),
            (Phase::Draining, true),
            (Phase::Ending, false),
            (Phase::ShuttingDown, false),
            (Phase::LeaseLost, false),
            (Phase::Failing, true),
        ] {
            let mut ending = Ending::default();
            let (tx, mut rx) = ractor::concurrency::oneshot();
            assert_eq!(
                ending.shutdown(phase, &shard(), tx.into()),
                goes_on,
                "{phase:?}"
            );
            match rx.try_recv() {
                Ok(answer) => {
                    assert!(!goes_on, "{phase:?} answered early");
                    assert!(!answer.checkpoint_flushed);
                    assert!(answer.error.unwrap().contains("already stopping"));
                }
                Err(_) => assert!(goes_on && ending.reply.is_some(), "{phase:?} kept"),
            }
        }
    }

    #[test]
    fn a_shutdown_answers_the_first_thing_that_went_wrong() {
        let lost = || Err(CheckpointError::LeaseLost { shard: shard() });
        let table = [
            (Ok(()), Ok(()), true, true, None),
            (
                Err(ProcessorFailure::Stopped),
                Ok(()),
                false,
                true,
                Some("shutdown_requested"),
            ),
            (Ok(()), lost(), true, false, Some("lease")),
            (
                Err(ProcessorFailure::NoAnswer),
                lost(),
                false,
                false,
                Some("shutdown_requested"),
            ),
        ];
        for (answer, flushed, processor_ok, checkpoint_flushed, error) in table {
            let outcome = shutdown_outcome(&shard(), &answer, &flushed);
            assert_eq!(outcome.processor_ok, processor_ok);
            assert_eq!(outcome.checkpoint_flushed, checkpoint_flushed);
            match (error, outcome.error) {
                (None, None) => {}
                (Some(part), Some(error)) => assert!(error.contains(part), "{error}"),
                (want, got) => panic!("{want:?} / {got:?}"),
            }
        }
    }

    #[test]
    fn the_children_a_shard_end_named_are_kept_for_its_checkpoint() {
        let mut ending = Ending::default();
        assert!(child_ids::<Vec<ShardId>>(ending.children.as_deref()).is_empty());
        ending.read_to_end(Some(vec![ChildShard {
            id: ShardId::new("shardId-000000000002"),
            parents: vec![shard()],
            hash_range: crate::model::HashKeyRange::new(0, u128::MAX).unwrap(),
        }]));
        let ids: Vec<ShardId> = child_ids(ending.children.as_deref());
        assert_eq!(ids, [ShardId::new("shardId-000000000002")]);
    }
}
