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
//!
//! A multi-stream worker's set may change: at every sync the watcher asks the
//! stream-set source (when it is one that changes), describes the streams that joined,
//! and publishes the set (`StreamSetBoard`) before it lists, as
//! `model::StreamSetView` decides. A stream whose listing says it does not exist is
//! former from then on.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tracing::{debug, info, warn};

use crate::backend::{ChildShard, LeaseTable, StreamClient, StreamError};
use crate::backoff::Backoff;
use crate::model::origin::{RowOrigin, StreamOrigin, foreign_rows};
use crate::model::{
    Checkpoint, ConsumedStream, Lease, LeaseKey, Shard, ShardGraph, ShardId, StreamSetView,
    check_list, plan_cleanup, plan_new_leases,
};
use crate::protocol::{KeeperMsg, SupervisorMsg, WatcherMsg};
use crate::status::{StreamView, WatcherStatus};
use crate::stream_set::StreamSet;
use crate::telemetry::{
    Call, CallFailed, Metric, Sample, StreamSetChanged, StreamSetRefused, StreamUnresolved,
    Telemetry,
};

pub(crate) struct StreamWatcher;

pub(crate) struct WatcherArgs {
    pub streams: Arc<dyn StreamClient>,
    pub table: Arc<dyn LeaseTable>,
    /// The streams listed, each with where a shard with no leased parent starts, and
    /// the former ones; this watcher is the one that changes it.
    pub set: crate::boards::StreamSetBoard,
    /// Asked at every sync when the set may change (`None`: a fixed set).
    pub source: Option<StreamSet>,
    /// In fan-out mode, the name of the consumer each stream that joins the set gets
    /// (found or registered before its readers start); `None` polls.
    pub consumer: Option<String>,
    /// `worker.former_stream_grace`.
    pub grace: Duration,
    pub interval: Duration,
    pub keeper: ActorRef<KeeperMsg>,
    /// Told when the rows turn out to be another stream's (`SupervisorMsg::Fatal`).
    pub supervisor: ActorRef<SupervisorMsg>,
    /// A single stream's name and creation time, which its rows must name; `None` for
    /// several streams (their keys name theirs).
    pub origin: Option<StreamOrigin>,
    pub telemetry: Telemetry,
    /// Where each complete listing is published, for the lease keeper.
    pub listing: crate::boards::ListingBoard,
    /// The rows of the keeper's last scan: what is leased, without a scan here.
    pub rows: crate::boards::RowsBoard,
}

pub(crate) struct WatcherState {
    args: WatcherArgs,
    status: WatcherStatus,
    backoff: Backoff,
    /// Each unresolved stream's error as last logged, so a stream that stays missing
    /// is logged again only when its error changes.
    unresolved_logged: BTreeMap<String, String>,
    /// A task resolves streams that joined the set (`WatcherMsg::Resolved` ends it).
    resolving: bool,
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
            unresolved_logged: BTreeMap::new(),
            resolving: false,
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
                state.refresh_set(&myself).await;
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
                        warn!(message = "Shard sync failed.", streams = %state.names(), %error);
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
                    warn!(message = "Shard sync failed.", streams = %state.names(), %error);
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
                    warn!(message = "Shard sync failed.", streams = %state.names(), %error);
                    state.status.last_error = Some(error);
                }
            },
            WatcherMsg::Resolved { wanted, resolved } => {
                state.resolving = false;
                let view = state.args.set.borrow().clone();
                state.publish_set(view.next(wanted, &resolved, tokio::time::Instant::now()));
                // The streams that joined are listed now, not at the next sync.
                if let Err(error) = state.sync().await {
                    warn!(message = "Shard sync failed.", streams = %state.names(), %error);
                    state.status.last_error = Some(error);
                }
            }
            WatcherMsg::Status(reply) => {
                let mut status = state.status.clone();
                let view = state.args.set.borrow().clone();
                status.streams = if view.active.is_multi() || !view.former.is_empty() {
                    StreamView::all(&view, tokio::time::Instant::now(), state.args.grace)
                } else {
                    Vec::new()
                };
                status.stream_set_error = view.source_error.clone();
                let _ = reply.send(status);
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
            lease.source = self
                .args
                .set
                .borrow()
                .active
                .of_key(parent)
                .map(|c| c.stream.clone());
            lease.source_created = self.args.origin.as_ref().and_then(|o| o.created);
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
        let active = self.args.set.borrow().active.clone();
        for consumed in active.iter() {
            let shards = match self.list(&consumed.stream).await {
                Ok(shards) => shards,
                // A stream of the set deleted in Kinesis: former from now (its leases
                // finished, its rows deleted after the grace); described again at
                // every sync while the list names it.
                Err(Listing::NotFound(error)) if consumed.id.is_some() => {
                    let now = tokio::time::Instant::now();
                    let next = self.args.set.borrow().gone(&consumed.stream, error, now);
                    self.publish_set(next);
                    continue;
                }
                Err(Listing::NotFound(error) | Listing::Failed(error)) => return Err(error),
            };
            listed.extend(shards.iter().map(|s| consumed.lease_key(&s.id)));
            listings.push((consumed, shards));
        }
        self.args
            .listing
            .send_replace(Some(Arc::new(crate::boards::ShardListing {
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
        if let Some(origin) = self.args.origin.clone() {
            self.check_origin(&origin, &leases).await?;
        }
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
                lease.source_created = self.args.origin.as_ref().and_then(|o| o.created);
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
        // Former streams whose rows the keeper has deleted are forgotten.
        let view = self.args.set.borrow().clone();
        if !view.former.is_empty() {
            let next = view.forget_deleted(&leases, tokio::time::Instant::now(), self.args.grace);
            if next.former.len() != view.former.len() {
                self.publish_set(next);
            }
        }
        Ok(())
    }

    /// At every listing of a single stream: the stream is still the one this worker
    /// started on (a stream deleted and created again under its name is another one),
    /// and every row is its own (`model::origin`). Otherwise the worker stops
    /// (`SupervisorMsg::Fatal`): whatever it would do next would apply another stream's
    /// positions. Rows written without their stream (a Java KCL beside it made them) are
    /// stamped as this stream's.
    async fn check_origin(
        &mut self,
        origin: &StreamOrigin,
        leases: &[Lease],
    ) -> Result<(), String> {
        if let Some(was) = origin.created {
            let summary = self
                .args
                .streams
                .describe_stream_summary(&origin.name)
                .await
                .map_err(|e| format!("describing stream {}: {e}", origin.name))?;
            let now = summary
                .created
                .and_then(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs())
                .filter(|s| *s > 0);
            if let Some(now) = now
                && now != was
            {
                let reason = format!(
                    "stream {} was deleted and created again (now created at {}; this worker \
                     started on the one created at {}): its lease rows hold the old stream's \
                     positions; {}",
                    origin.name,
                    humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH + Duration::from_secs(now)
                    ),
                    humantime::format_rfc3339_seconds(
                        std::time::UNIX_EPOCH + Duration::from_secs(was)
                    ),
                    crate::model::origin::FOREIGN_ROWS_ADVICE
                );
                let _ = self
                    .args
                    .supervisor
                    .cast(SupervisorMsg::Fatal(reason.clone()));
                return Err(reason);
            }
        }
        let foreign = foreign_rows(origin, leases);
        if !foreign.is_empty() {
            let reason = format!(
                "lease table rows of another stream under stream {}'s keys: {}; {}",
                origin.name,
                foreign
                    .iter()
                    .take(5)
                    .map(|(l, why)| format!("{} ({why})", l.key))
                    .collect::<Vec<_>>()
                    .join(", "),
                crate::model::origin::FOREIGN_ROWS_ADVICE
            );
            let _ = self
                .args
                .supervisor
                .cast(SupervisorMsg::Fatal(reason.clone()));
            return Err(reason);
        }
        for lease in leases.iter().filter(|l| l.key.stream_id().is_none()) {
            if origin.of(lease) == RowOrigin::Adopt {
                match self
                    .args
                    .table
                    .stamp_source(&lease.key, &origin.name, origin.created, false)
                    .await
                {
                    Ok(true) => {
                        info!(message = "Lease row written without its stream adopted as this stream's.", lease_key = %lease.key, stream = %origin.name)
                    }
                    Ok(false) => {}
                    Err(error) => {
                        debug!(message = "Lease row not stamped; the next listing tries again.", lease_key = %lease.key, %error)
                    }
                }
            }
        }
        Ok(())
    }

    /// Asks the stream-set source for the list (when the set may change; a fixed set's
    /// own list while one of its streams is unresolved), and publishes the set
    /// `StreamSetView::next` makes. A failed or refused answer keeps the last good set.
    ///
    /// Streams not read yet are described by a task that reports back
    /// (`WatcherMsg::Resolved`): in fan-out mode it waits for a new consumer to be
    /// ACTIVE (up to `fanout::CONSUMER_WAIT`), and the watcher's mailbox (status, the
    /// children a reader found) is not held up meanwhile. One such task at a time.
    async fn refresh_set(&mut self, myself: &ActorRef<WatcherMsg>) {
        if self.resolving {
            return;
        }
        let view = self.args.set.borrow().clone();
        let wanted: Result<Vec<ConsumedStream>, String> = match self.args.source.clone() {
            Some(source) => source
                .current()
                .await
                .map(|list| list.iter().map(|s| s.wanted()).collect())
                .and_then(|list: Vec<ConsumedStream>| check_list(&list).map(|()| list)),
            // A fixed set changes only when a stream of it was found deleted: it is
            // described again, and read again once created again.
            None if !view.unresolved.is_empty() => Ok(view.wanted.clone()),
            None => return,
        };
        let wanted = match wanted {
            Ok(wanted) => wanted,
            Err(error) => {
                self.args.telemetry.emit(StreamSetRefused { error: &error });
                self.status.stream_set_errors += 1;
                self.publish_set(view.source_failed(error));
                return;
            }
        };
        let joining: Vec<String> = view
            .to_resolve(&wanted)
            .into_iter()
            .map(|s| s.stream.clone())
            .collect();
        if joining.is_empty() {
            let next = view.next(wanted, &BTreeMap::new(), tokio::time::Instant::now());
            self.publish_set(next);
            return;
        }
        self.resolving = true;
        let (streams, consumer) = (self.args.streams.clone(), self.args.consumer.clone());
        let watcher = myself.clone();
        tokio::spawn(async move {
            let mut resolved = BTreeMap::new();
            for stream in joining {
                let answer = crate::stream_set::resolve(
                    streams.as_ref(),
                    &stream,
                    consumer.as_deref(),
                    crate::fanout::CONSUMER_WAIT,
                )
                .await
                .map_err(|e| e.to_string());
                resolved.insert(stream, answer);
            }
            let _ = watcher.cast(WatcherMsg::Resolved { wanted, resolved });
        });
    }

    /// Publishes the set, saying what changed.
    fn publish_set(&mut self, next: StreamSetView<tokio::time::Instant>) {
        let before = self.args.set.borrow().clone();
        let ids = |v: &StreamSetView<tokio::time::Instant>| -> BTreeSet<String> {
            v.active
                .iter()
                .filter_map(|s| s.id.as_ref().map(|id| id.to_string()))
                .collect()
        };
        let (was, now) = (ids(&before), ids(&next));
        let added: Vec<String> = now.difference(&was).cloned().collect();
        let former: Vec<String> = was.difference(&now).cloned().collect();
        if !added.is_empty() || !former.is_empty() {
            self.args.telemetry.emit(StreamSetChanged {
                added: &added,
                former: &former,
            });
        }
        for u in &next.unresolved {
            if self.unresolved_logged.get(&u.stream) != Some(&u.error) {
                self.args.telemetry.emit(StreamUnresolved {
                    stream: &u.stream,
                    error: &u.error,
                });
            }
        }
        self.unresolved_logged = next
            .unresolved
            .iter()
            .map(|u| (u.stream.clone(), u.error.clone()))
            .collect();
        self.args.telemetry.record(vec![
            Sample::new(Metric::StreamsFormer, next.former.len() as f64),
            Sample::new(Metric::StreamsUnresolved, next.unresolved.len() as f64),
        ]);
        self.args.set.send_replace(Arc::new(next));
        if !added.is_empty() || !former.is_empty() {
            // The keeper finishes a former stream's leases at its next scan.
            let _ = self.args.keeper.cast(KeeperMsg::ScanNow);
        }
    }

    /// The streams read, for logs.
    fn names(&self) -> String {
        self.args.set.borrow().active.names()
    }

    /// One stream's shards, if the listing is whole and consistent.
    async fn list(&self, stream: &str) -> Result<Vec<Shard>, Listing> {
        let shards = self.args.streams.list_shards(stream).await.map_err(|e| {
            self.args.telemetry.emit(CallFailed {
                call: Call::ListShards,
                shard: None,
                error: &e,
            });
            match e {
                StreamError::NotFound { .. } => Listing::NotFound(e.to_string()),
                _ => Listing::Failed(e.to_string()),
            }
        })?;
        let graph = ShardGraph::new(shards.iter().cloned());
        // A table stream's shards have no ranges: several open ones is no reshard.
        if self.args.streams.capabilities().hash_ranges
            && let Err(problem) = graph.check_coverage()
        {
            // A listing taken in the middle of a reshard; list again before acting on it.
            return Err(Listing::Failed(format!(
                "the shard listing of {stream} is not consistent yet: {problem}"
            )));
        }
        Ok(shards)
    }
}

/// Why a stream's shards could not be listed.
enum Listing {
    /// The stream does not exist.
    NotFound(String),
    Failed(String),
}

/// The interval ±10%, so a fleet started together does not list in lockstep.
fn jittered(interval: Duration) -> Duration {
    interval.mul_f64(0.9 + crate::backoff::unit_draw() * 0.2)
}
