//! Tracing spans for a worker's actors, so every log line says whose it is without
//! each call site naming it: the worker's actors run in the worker's span (worker id,
//! application, stream), a shard's reader and processor host in the shard's span (shard
//! id, lease counter, worker id, stream) under it.
//!
//! ractor runs every actor on a task of its own, and a spawned task does not inherit the
//! spawner's span; [`Spanned`] wraps an actor so that each of its callbacks runs inside
//! the span it was started with. The actors themselves know nothing of it. The
//! subscriber (and so the format: text, JSON, OpenTelemetry) is the embedder's.

use ractor::{Actor, ActorProcessingErr, ActorRef, SupervisionEvent};
use tracing::{Instrument, Span, info_span};

use crate::model::{LeaseKey, WorkerId};

/// The span of a worker and of its worker-wide actors.
pub(crate) fn worker(me: &WorkerId, application: &str, stream: &str) -> Span {
    info_span!("worker", worker_id = %me, application = %application, stream = %stream)
}

/// The span of one shard's reader and processor host, under the worker's. The counter
/// is the lease's when this reader started with it (its fence).
pub(crate) fn shard(
    worker: &Span,
    key: &LeaseKey,
    counter: u64,
    me: &WorkerId,
    stream: &str,
) -> Span {
    info_span!(
        parent: worker,
        "shard",
        shard_id = %key.shard_id(),
        lease_counter = counter,
        worker_id = %me,
        stream = %stream,
    )
}

/// An actor whose every callback runs in the span it was spawned with: spawn
/// `Spanned(ShardReader, span)` where `ShardReader` was. Its arguments, state, messages
/// and references are the inner actor's; the supervision events go to the inner actor's
/// own handler (ractor's default stops a parent when a child exits, so it must not be
/// replaced here).
#[derive(Debug)]
pub(crate) struct Spanned<A>(pub A, pub Span);

impl<A: Actor> Actor for Spanned<A> {
    type Msg = A::Msg;
    type State = A::State;
    type Arguments = A::Arguments;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: Self::Arguments,
    ) -> Result<Self::State, ActorProcessingErr> {
        self.0
            .pre_start(myself, args)
            .instrument(self.1.clone())
            .await
    }

    async fn post_start(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        self.0
            .post_start(myself, state)
            .instrument(self.1.clone())
            .await
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: Self::Msg,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        self.0
            .handle(myself, message, state)
            .instrument(self.1.clone())
            .await
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<Self::Msg>,
        event: SupervisionEvent,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        self.0
            .handle_supervisor_evt(myself, event, state)
            .instrument(self.1.clone())
            .await
    }

    async fn post_stop(
        &self,
        myself: ActorRef<Self::Msg>,
        state: &mut Self::State,
    ) -> Result<(), ActorProcessingErr> {
        self.0
            .post_stop(myself, state)
            .instrument(self.1.clone())
            .await
    }
}
