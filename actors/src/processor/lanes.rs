//! `processor.parallelism` above 1: the shard's processor is a dealer in front of N
//! lanes, each a processor of its own (a host around a [`crate::Processor`] from the
//! factory, the user's own actor, or a MultiLang child), started as the one processor
//! of a shard is. The reader does not know: it hands the dealer batches and asks it to
//! end, as it would one processor.
//!
//! - Each batch is dealt by partition key ([`crate::model::lanes`]): a lane gets its
//!   share of every batch (the records' own ack tokens, [`Batch::pick`]), in order,
//!   through its mailbox, so up to N batches are in flight and a key's records are
//!   processed in order. An empty batch (`reader.call_on_empty`) goes to every lane.
//! - The checkpoint is the reader's acked prefix (its watermark): a lane acks its share
//!   (the host on `Ok`, or the processor's own acks), and the prefix moves only over
//!   records every lane has finished. In manual mode a lane's checkpoint acks its own
//!   records up to it ([`LaneBook`]).
//! - Fencing, revocation and stopping are per lane, in each lane's host, exactly as for
//!   one processor; `lease_lost` goes to every lane, and `shard_ended` and
//!   `shutdown_requested` are asked of every lane at once (each after the batches
//!   queued before it) and answered once all have answered: the first error, if any.
//! - A lane that fails fails the dealer, and so the shard, as a failing processor does;
//!   the dealer stops every lane when it stops.
//!
//! One processor per lane rather than one processor called concurrently: the
//! [`crate::Processor`] trait keeps `&mut self` and needs no locks, each lane's state
//! (a MultiLang child, a connection) is its own, and state shared across lanes is the
//! user's to share, through what the factory closes over.

use std::sync::Arc;

use futures::future::join_all;
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort, SupervisionEvent};

use super::{HostArgs, ProcessorSource};
use crate::model::lanes;
use crate::protocol::{Batch, Checkpointer, LaneBook, ProcessorMsg, ShardInfo, StopReason};
use crate::settings::CheckpointMode;

/// The dealer of one shard.
pub(crate) struct Dealer;

pub(crate) struct DealerArgs {
    pub source: ProcessorSource,
    pub info: ShardInfo,
    pub host: HostArgs,
    pub lanes: u16,
}

pub(crate) struct DealerState {
    lanes: Vec<ActorRef<ProcessorMsg>>,
    /// What each lane was handed and has not checkpointed past (used in manual mode).
    books: Vec<Arc<LaneBook>>,
    /// Lanes still running after `lease_lost`: the dealer stops with the last.
    left: usize,
    lost: bool,
}

impl Actor for Dealer {
    type Msg = ProcessorMsg;
    type State = DealerState;
    type Arguments = DealerArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<ProcessorMsg>,
        args: DealerArgs,
    ) -> Result<DealerState, ActorProcessingErr> {
        let mut lanes = Vec::with_capacity(usize::from(args.lanes));
        for lane in 0..usize::from(args.lanes) {
            let host = HostArgs {
                wait: args.host.wait.lane(lane),
                ..args.host.clone()
            };
            let lane = args
                .source
                .start_one(&args.info, host, myself.get_cell())
                .await?;
            lanes.push(lane);
        }
        let left = lanes.len();
        Ok(DealerState {
            lanes,
            books: (0..left).map(|_| Arc::new(LaneBook::default())).collect(),
            left,
            lost: false,
        })
    }

    async fn post_stop(
        &self,
        _: ActorRef<ProcessorMsg>,
        state: &mut DealerState,
    ) -> Result<(), ActorProcessingErr> {
        for lane in &state.lanes {
            lane.stop(None);
        }
        Ok(())
    }

    async fn handle(
        &self,
        _myself: ActorRef<ProcessorMsg>,
        message: ProcessorMsg,
        state: &mut DealerState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            ProcessorMsg::Initialize(info) => {
                for lane in &state.lanes {
                    lane.cast(ProcessorMsg::Initialize(info.clone()))?;
                }
            }
            ProcessorMsg::Process(batch, checkpointer) => state.deal(&batch, &checkpointer)?,
            ProcessorMsg::LeaseLost => {
                state.lost = true;
                for lane in &state.lanes {
                    let _ = lane.cast(ProcessorMsg::LeaseLost);
                }
            }
            ProcessorMsg::ShardEnded(checkpointer, reply) => {
                state.ask_all(checkpointer, reply, ProcessorMsg::ShardEnded);
            }
            ProcessorMsg::ShutdownRequested(checkpointer, reply) => {
                state.ask_all(checkpointer, reply, ProcessorMsg::ShutdownRequested);
            }
        }
        Ok(())
    }

    async fn handle_supervisor_evt(
        &self,
        myself: ActorRef<ProcessorMsg>,
        event: SupervisionEvent,
        state: &mut DealerState,
    ) -> Result<(), ActorProcessingErr> {
        match event {
            SupervisionEvent::ActorFailed(cell, error) => {
                let lane = state.lane_index(cell.get_id());
                Err(format!("lane {lane}: {error}").into())
            }
            SupervisionEvent::ActorTerminated(cell, _, reason) => {
                state.left = state.left.saturating_sub(1);
                if state.lost {
                    // Every lane has had its `lease_lost`: the dealer goes with the last.
                    if state.left == 0 {
                        myself.stop(StopReason::LeaseLost.text());
                    }
                    return Ok(());
                }
                // A lane stopped on its own: the shard's processor did, as far as its
                // reader is concerned.
                let lane = state.lane_index(cell.get_id());
                let why = reason.unwrap_or_else(|| "no reason given".to_owned());
                myself.stop(Some(format!("lane {lane} stopped ({why})")));
                Ok(())
            }
            _ => Ok(()),
        }
    }
}

impl DealerState {
    /// Hands each lane its share of `batch`.
    fn deal(&self, batch: &Batch, checkpointer: &Checkpointer) -> Result<(), ActorProcessingErr> {
        let lanes = self.lanes.len() as u16;
        if batch.is_empty() {
            for (lane, actor) in self.lanes.iter().enumerate() {
                actor.cast(ProcessorMsg::Process(
                    batch.clone(),
                    self.checkpointer(lane, checkpointer),
                ))?;
            }
            return Ok(());
        }
        let dealt = lanes::deal(
            batch.records().iter().map(|r| r.partition_key.as_str()),
            lanes,
        );
        for (lane, indices) in dealt.iter().enumerate() {
            if indices.is_empty() {
                continue;
            }
            let share = batch.pick(indices);
            let checkpointer = self.checkpointer(lane, checkpointer);
            if let Some(book) = &checkpointer.lane {
                book.handed(&share);
            }
            self.lanes[lane].cast(ProcessorMsg::Process(share, checkpointer))?;
        }
        Ok(())
    }

    /// The checkpointer lane `lane` is handed: in manual mode, one whose checkpoints
    /// speak for the lane's records only.
    fn checkpointer(&self, lane: usize, checkpointer: &Checkpointer) -> Checkpointer {
        if checkpointer.mode != CheckpointMode::Manual {
            return checkpointer.clone();
        }
        Checkpointer {
            lane: self.books.get(lane).cloned(),
            ..checkpointer.clone()
        }
    }

    /// Asks every lane to end (`shard_ended`, `shutdown_requested`) at once and
    /// answers once all have: `Ok`, or the errors of the lanes that failed.
    fn ask_all(
        &self,
        checkpointer: Checkpointer,
        reply: RpcReplyPort<Result<(), String>>,
        message: fn(Checkpointer, RpcReplyPort<Result<(), String>>) -> ProcessorMsg,
    ) {
        let asks: Vec<_> = (0..self.lanes.len())
            .map(|lane| {
                let actor = self.lanes[lane].clone();
                let checkpointer = self.checkpointer(lane, &checkpointer);
                async move {
                    match actor.call(|port| message(checkpointer, port), None).await {
                        Ok(ractor::rpc::CallResult::Success(Ok(()))) => Ok(()),
                        Ok(ractor::rpc::CallResult::Success(Err(e))) => {
                            Err(format!("lane {lane}: {e}"))
                        }
                        Ok(_) | Err(_) => Err(format!("lane {lane} stopped before it answered")),
                    }
                }
            })
            .collect();
        tokio::spawn(async move {
            let errors: Vec<String> = join_all(asks)
                .await
                .into_iter()
                .filter_map(Result::err)
                .collect();
            let answer = if errors.is_empty() {
                Ok(())
            } else {
                Err(errors.join("; "))
            };
            let _ = reply.send(answer);
        });
    }

    fn lane_index(&self, id: ractor::ActorId) -> String {
        self.lanes
            .iter()
            .position(|lane| lane.get_id() == id)
            .map_or_else(|| "?".to_owned(), |lane| lane.to_string())
    }
}
