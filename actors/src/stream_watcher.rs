//! Lists the shards of every stream read (paginated ListShards, at a jittered interval),
//! checks each stream's shard graph, and creates lease rows for shards that have none —
//! with conditional puts, so two workers never clobber each other's rows. Rows are keyed
//! as the stream's `ConsumedStream::lease_key` says (shard ids for a single stream).
//!
//! Children reported by a reader at SHARD_END get their rows at once, not at the next
//! listing; a server that does not report children makes the watcher list now instead.
//!
//! Rows of finished shards gone past retention are deleted (conditionally) once all
//! their children have started; until then the parent's SHARD_END is what lets a child
//! begin.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

use crate::backend::{ChildShard, LeaseTable, StreamClient};
use crate::backoff::Backoff;
use crate::model::{
    Checkpoint, ConsumedStreams, Lease, LeaseKey, Shard, ShardGraph, ShardId, plan_cleanup,
    plan_new_leases,
};
use crate::protocol::{KeeperMsg, WatcherMsg};
use crate::status::WatcherStatus;
use crate::telemetry::{Call, CallFailed, Telemetry};

pub(crate) struct StreamWatcher;

pub(crate) struct WatcherArgs {
    pub streams: Arc<dyn StreamClient>,
    pub table: Arc<dyn LeaseTable>,
    /// The streams listed, each with where a shard with no leased parent starts.
    pub consumed: Arc<ConsumedStreams>,
    pub interval: Duration,
    pub keeper: ActorRef<KeeperMsg>,
    pub telemetry: Telemetry,
    /// Where each complete listing is published, for the lease keeper.
    pub listing: crate::status::ListingBoard,
    /// The rows of the keeper's last scan: what is leased, without a scan here.
    pub rows: crate::status::RowsBoard,
}

pub(crate) struct WatcherState {
    args: WatcherArgs,
    status: WatcherStatus,
    backoff: Backoff,
}

impl Actor for StreamWatcher {
    type Msg = WatcherMsg;
    type State = WatcherState;
    type Arguments = WatcherArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: WatcherArgs,
    ) -> Result<WatcherState, ActorProcessingErr> {
        let _ = myself.cast(WatcherMsg::Sync);
        Ok(WatcherState {
            args,
            status: WatcherStatus::default(),
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(10)),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: WatcherMsg,
        state: &mut WatcherState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            WatcherMsg::Sync => {
                let first = state.args.listing.borrow().is_none();
                let next = match state.sync().await {
                    Ok(()) => {
                        // Leases are taken only for listed shards: the first listing
                        // lets the keeper start at once.
                        if first {
                            let _ = state.args.keeper.cast(KeeperMsg::ScanNow);
                        }
                        state.backoff.reset();
                        jittered(state.args.interval)
                    }
                    Err(error) => {
                        warn!(message = "Shard sync failed.", streams = %state.args.consumed.names(), %error);
                        state.status.last_error = Some(error);
                        state.backoff.next_random()
                    }
                };
                myself.send_after(next, || WatcherMsg::Sync);
            }
            WatcherMsg::ChildrenFound { parent, children } => {
                let created = match children {
                    Some(children) => state.create_children(&parent, children).await,
                    None => false,
                };
                // Listing is the fallback (and it does not re-arm the periodic timer):
                // it creates whatever rows are still missing.
                if !created && let Err(error) = state.sync().await {
                    warn!(message = "Shard sync failed.", streams = %state.args.consumed.names(), %error);
                    state.status.last_error = Some(error);
                }
                // The children may start now: whether their rows are new, were made by an
                // earlier listing, or by this one, the keeper takes them at once instead
                // of at its next round.
                let _ = state.args.keeper.cast(KeeperMsg::ScanNow);
            }
            WatcherMsg::ListNow => match state.sync().await {
                // The keeper is waiting on this listing: let it act at once.
                Ok(()) => {
                    let _ = state.args.keeper.cast(KeeperMsg::ScanNow);
                }
                Err(error) => {
                    warn!(message = "Shard sync failed.", streams = %state.args.consumed.names(), %error);
                    state.status.last_error = Some(error);
                }
            },
            WatcherMsg::Status(reply) => {
                let _ = reply.send(state.status.clone());
            }
        }
        Ok(())
    }
}

impl WatcherState {
    /// Rows for the children a reader reported at SHARD_END of `parent`, in the
    /// parent's stream. False when one could not be written, so that the caller lists
    /// instead.
    async fn create_children(&mut self, parent: &LeaseKey, children: Vec<ChildShard>) -> bool {
        let mut created = 0;
        let mut complete = true;
        for child in children {
            let mut lease = Lease::new(
                &child.id,
                Checkpoint::TrimHorizon,
                child.parents,
                Some(child.hash_range),
            );
            lease.key = parent.sibling(&child.id);
            match self.args.table.create_if_absent(&lease).await {
                Ok(true) => created += 1,
                Ok(false) => {}
                Err(error) => {
                    warn!(message = "Child lease not created; listing instead.", lease_key = %lease.key, %error);
                    complete = false;
                    break;
                }
            }
        }
        self.status.leases_created += created;
        if created > 0 {
            let _ = self.args.keeper.cast(KeeperMsg::ScanNow);
        }
        complete
    }

    /// Lists every stream, publishes the listing (all streams' shards, as lease keys)
    /// only once every stream was listed whole, then creates and deletes rows stream by
    /// stream: a shard id names a shard only within its stream.
    async fn sync(&mut self) -> Result<(), String> {
        let sent = tokio::time::Instant::now();
        let mut listings = Vec::new();
        let mut listed = BTreeSet::new();
        for consumed in self.args.consumed.iter() {
            let shards = self.list(&consumed.stream).await?;
            listed.extend(shards.iter().map(|s| consumed.lease_key(&s.id)));
            listings.push((consumed, shards));
        }
        self.args
            .listing
            .send_replace(Some(Arc::new(crate::status::ShardListing {
                shards: listed,
                sent,
            })));
        // The keeper's rows; a scan only before its first.
        let known = self.args.rows.borrow().clone();
        let leases = match known {
            Some(rows) => rows,
            None => Arc::new(
                self.args
                    .table
                    .scan()
                    .await
                    .map_err(|e| e.to_string())?
                    .leases,
            ),
        };
        let (mut shard_count, mut open_count) = (0, 0);
        for (consumed, shards) in listings {
            // This stream's rows only (all of them for a single stream's bare keys).
            let own: Vec<Lease> = leases
                .iter()
                .filter(|l| consumed.owns(&l.key))
                .cloned()
                .collect();
            let leased: BTreeSet<ShardId> = own.iter().map(|l| l.key.shard_id()).collect();
            let mut planned = plan_new_leases(&shards, &leased, &consumed.initial);
            for lease in &mut planned {
                lease.key = consumed.lease_key(&lease.key.shard_id());
                lease.source = Some(consumed.stream.clone());
            }
            let mut created = 0;
            for lease in &planned {
                match self.args.table.create_if_absent(lease).await {
                    Ok(true) => {
                        created += 1;
                        debug!(message = "Lease row created.", lease_key = %lease.key, checkpoint = %lease.checkpoint);
                    }
                    Ok(false) => {}
                    Err(error) => {
                        return Err(format!("creating the lease of {}: {error}", lease.key));
                    }
                }
            }
            if created > 0 {
                info!(message = "Lease rows created for new shards.", count = created, stream = %consumed.stream);
                self.status.leases_created += created;
                let _ = self.args.keeper.cast(KeeperMsg::ScanNow);
            }
            for lease in plan_cleanup(&shards, &own) {
                match self.args.table.delete(&lease.key, &lease.fence()).await {
                    Ok(()) => {
                        info!(message = "Lease of a finished shard deleted; its children have started.", event = "lease_deleted", lease_key = %lease.key);
                        self.status.leases_deleted += 1;
                    }
                    // Another worker deleted it first, or it changed: next listing decides.
                    Err(error) => {
                        debug!(message = "Finished lease not deleted.", lease_key = %lease.key, %error)
                    }
                }
            }
            shard_count += shards.len();
            open_count += shards.iter().filter(|s| s.is_open()).count();
        }
        self.status.shards = shard_count;
        self.status.open_shards = open_count;
        self.status.last_error = None;
        Ok(())
    }

    /// One stream's shards, if the listing is whole and consistent.
    async fn list(&self, stream: &str) -> Result<Vec<Shard>, String> {
        let shards = self.args.streams.list_shards(stream).await.map_err(|e| {
            self.args.telemetry.emit(CallFailed {
                call: Call::ListShards,
                shard: None,
                error: &e,
            });
            e.to_string()
        })?;
        let graph = ShardGraph::new(shards.iter().cloned());
        // A table stream's shards have no ranges: several open ones is no reshard.
        if self.args.streams.capabilities().hash_ranges
            && let Err(problem) = graph.check_coverage()
        {
            // A listing taken in the middle of a reshard; list again before acting on it.
            return Err(format!(
                "the shard listing of {stream} is not consistent yet: {problem}"
            ));
        }
        Ok(shards)
    }
}

/// The interval ±10%, so a fleet started together does not list in lockstep.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.9 + crate::backoff::unit_draw() * 0.2)
}
