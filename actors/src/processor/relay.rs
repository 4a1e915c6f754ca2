//! A processor written as an actor of its own, under `[failure]`: the processor host
//! hands it each part of a batch the failure policy delivers and waits for how it went,
//! so the policy is the same one a [`Processor`] gets. The actor tells the outcome
//! through the checkpointer it is handed with the part ([`PartOutcome`]): it acks the
//! part (or, in watermark mode, each of its records), or calls
//! [`Checkpointer::fail_batch`]. An actor that stops or fails while it has a part fails
//! that delivery; the next one goes to a new actor from the factory, initialized at the
//! shard's start, as a restarted shard's would be.

use ractor::ActorRef;

use super::{Processor, ProcessorActorFactory, ProcessorError};
use crate::protocol::{Batch, Checkpointer, PartOutcome, ProcessorMsg, ShardInfo};
use crate::settings::CheckpointMode;

/// The user's processor actor as a [`Processor`] the host runs under the policy.
pub(crate) struct ActorRelay {
    factory: ProcessorActorFactory,
    mode: CheckpointMode,
    info: Option<ShardInfo>,
    actor: Option<ActorRef<ProcessorMsg>>,
}

impl ActorRelay {
    pub(crate) fn new(factory: ProcessorActorFactory, mode: CheckpointMode) -> Self {
        Self {
            factory,
            mode,
            info: None,
            actor: None,
        }
    }

    /// The actor, started from the factory (and initialized) if there is none.
    async fn actor(&mut self) -> Result<ActorRef<ProcessorMsg>, ProcessorError> {
        if let Some(actor) = &self.actor {
            return Ok(actor.clone());
        }
        let info = self
            .info
            .clone()
            .ok_or_else(|| ProcessorError::msg("the processor actor was not initialized"))?;
        let actor = (self.factory)(info.clone())
            .await
            .map_err(|e| ProcessorError::msg(format!("processor actor factory: {e}")))?;
        actor
            .cast(ProcessorMsg::Initialize(info))
            .map_err(|e| ProcessorError::msg(format!("the processor actor has stopped: {e}")))?;
        self.actor = Some(actor.clone());
        Ok(actor)
    }

    /// The actor failed a delivery by stopping: a new one takes the next.
    fn forget(&mut self) {
        if let Some(actor) = self.actor.take() {
            actor.stop(None);
        }
    }

    /// Asks the actor to end (`ShardEnded`, `ShutdownRequested`) and waits for its answer.
    async fn ask(
        &mut self,
        message: impl FnOnce(ractor::RpcReplyPort<Result<(), String>>) -> ProcessorMsg + Send,
    ) -> Result<(), ProcessorError> {
        let actor = self.actor().await?;
        match actor.call(message, None).await {
            Ok(ractor::rpc::CallResult::Success(answer)) => answer.map_err(ProcessorError::msg),
            Ok(_) | Err(_) => Err(ProcessorError::msg(
                "the processor actor stopped before it answered",
            )),
        }
    }
}

impl Drop for ActorRelay {
    fn drop(&mut self) {
        self.forget();
    }
}

impl Processor for ActorRelay {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        self.info = Some(shard.clone());
        self.actor().await.map(drop)
    }

    async fn process(
        &mut self,
        batch: &Batch,
        checkpointer: &Checkpointer,
    ) -> Result<(), ProcessorError> {
        let actor = self.actor().await?;
        if batch.is_empty() {
            // Nothing to fail or ack: an empty call is only news.
            let _ = actor.cast(ProcessorMsg::Process(batch.clone(), checkpointer.clone()));
            return Ok(());
        }
        let (outcome, done) = PartOutcome::new(batch.len(), !self.mode.host_acks_each_batch());
        let relayed = Checkpointer {
            relay: Some(outcome),
            ..checkpointer.clone()
        };
        if actor
            .cast(ProcessorMsg::Process(batch.clone(), relayed))
            .is_err()
        {
            self.forget();
            return Err(ProcessorError::msg("the processor actor has stopped"));
        }
        match done.await {
            Ok(outcome) => outcome,
            // The part was dropped unanswered: the actor stopped or failed with it.
            Err(_) => {
                self.forget();
                Err(ProcessorError::msg(
                    "the processor actor stopped while it had the batch",
                ))
            }
        }
    }

    async fn lease_lost(&mut self) {
        if let Some(actor) = &self.actor {
            let _ = actor.cast(ProcessorMsg::LeaseLost);
        }
    }

    async fn shard_ended(&mut self, checkpointer: &Checkpointer) -> Result<(), ProcessorError> {
        let checkpointer = checkpointer.clone();
        self.ask(move |reply| ProcessorMsg::ShardEnded(checkpointer, reply))
            .await
    }

    async fn shutdown_requested(
        &mut self,
        checkpointer: &Checkpointer,
    ) -> Result<(), ProcessorError> {
        let checkpointer = checkpointer.clone();
        self.ask(move |reply| ProcessorMsg::ShutdownRequested(checkpointer, reply))
            .await
    }
}
