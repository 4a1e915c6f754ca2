//! Keeps this worker alive in the lease table and decides which leases it holds.
//!
//! One heartbeat row per worker, bumped every `heartbeat_interval`, instead of renewing
//! every lease: lease-table writes grow with workers, not with shards. Each round it
//! reads the heartbeat rows (the roster's, by key), and scans the table only when
//! `pure::scan_due` finds something changed since its last scan (so reads grow with
//! workers too, not with shards, while nothing moves); it feeds what it saw to
//! [`crate::balance`], and carries out the plan:
//! takes (conditional on owner and counter), handoff requests to live owners, handoffs
//! of its own leases that others asked for, and reports gains and losses to the
//! supervisor. Every movement is logged as a `lease_moved` event with its reason and
//! counted in metrics.
//!
//! A handoff in flight is polled every `handoff_poll_interval` (the requester reads
//! the row to start the moment it is its own; a draining worker scans for requests), so
//! a planned move costs a fraction of a second, not a heartbeat interval.
//!
//! The keeper feeds [`Fencing`] (self-fencing): each confirmed or failed heartbeat, each
//! lease taken, each scan that shows a held lease still ours, and each lease found lost,
//! which is revoked there before the supervisor hears of it. Readers and processor hosts
//! consult it before every delivery, so no other worker can take a lease while this one
//! still processes it, whatever gap (a freeze, a partition) came in between.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::backend::{LeaseError, LeaseTable};
use crate::balance::{self, Decision, Gain, Limits, Observations, Policy, Round};
use crate::fencing::Fencing;
use crate::model::item::{MalformedRow, WORKER_KEY_PREFIX, heartbeat_key};
use crate::model::{Fence, Heartbeat, Lease, LeaseKey, RateMeter, WorkerId, WorkerLoad};
use crate::protocol::LeaseMove;
use crate::protocol::{KeeperMsg, SupervisorMsg};
use crate::settings::{BalanceMode, Settings};
use crate::status::{FleetScan, KeeperStatus, ReleaseReport, ShardShutdown, fleet_view};
use crate::telemetry::{Call, CallFailed, LeaseGained, LeaseGiven, Metric, Sample, Telemetry};
use pure::{Action, DrainState, DrainVerdict, PeerMark, ReadState, ScanWhy};

mod legacy;
#[cfg(test)]
mod model;
mod pure;

pub(crate) struct LeaseKeeper;

pub(crate) struct KeeperArgs {
    pub table: Arc<dyn LeaseTable>,
    pub me: WorkerId,
    pub settings: Arc<Settings>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub telemetry: Telemetry,
    /// Self-fencing: fed by every heartbeat, take, scan and loss.
    pub fencing: Fencing,
    /// Records delivered by this worker's readers, for the load in the heartbeat.
    pub delivered: Arc<AtomicU64>,
    pub lags: crate::status::LagBoard,
    /// Where each scan's view of the fleet is published, for the status endpoint.
    pub fleet: crate::status::FleetBoard,
    /// The stream watcher's last listing, to tell orphan rows.
    pub listing: crate::status::ListingBoard,
    /// Where each scan's lease rows are published, for the stream watcher.
    pub rows: crate::status::RowsBoard,
    /// The stream set: a former stream's leases are finished, never taken, and its rows
    /// deleted after the grace.
    pub set: crate::status::StreamSetBoard,
    pub application: String,
    pub stream: String,
}

struct Drain {
    /// Past it, nobody is waited for: what is left is released.
    deadline: Instant,
    done: bool,
    /// The lease table failed during the drain: askers cannot be heard, nor handoffs
    /// written, so waiting for them is pointless.
    table_failed: Option<String>,
}

pub(crate) struct KeeperState {
    args: KeeperArgs,
    held: BTreeMap<LeaseKey, Fence>,
    observations: Observations,
    cooling: BTreeMap<LeaseKey, Instant>,
    heartbeat_counter: u64,
    malformed: Vec<String>,
    /// Requests made to other workers: when each was first made, and of whom.
    requested: BTreeMap<LeaseKey, Request>,
    /// Held leases being handed over, to whom.
    handing_off: BTreeMap<LeaseKey, WorkerId>,
    /// Held leases of former streams being stopped, to be released.
    retiring: BTreeSet<LeaseKey>,
    /// A scan is armed for when a former stream's rows turn due.
    former_due: Option<Instant>,
    polling: bool,
    /// A scan is due at this instant: the moment an owner of leases would turn dead.
    deadline_scan: Option<Instant>,
    drain: Option<Drain>,
    stopped: bool,
    report: ReleaseReport,
    gained: BTreeMap<String, u64>,
    given: BTreeMap<String, u64>,
    /// The delivered-records count and time at the last heartbeat.
    last_rate: (u64, Instant),
    /// Each held lease's smoothed rates, published with the heartbeat.
    rates: RateMeter,
    /// When the unconfirmed heartbeat was last reported at ERROR (repeated every
    /// [`STALL_REPORT_EVERY`], not at every beat).
    stall_reported: Option<Instant>,
    /// When each lease row was first seen (send time of that scan), for orphans.
    first_seen: BTreeMap<LeaseKey, Instant>,
    /// The orphan rows last reported.
    orphans: BTreeSet<LeaseKey>,
    /// When a fresh shard listing was last asked for.
    listing_asked: Option<Instant>,
    /// Ownership changes this worker has made (`WorkerLoad::changes`); as of its last
    /// scan; and as written in its last confirmed heartbeat.
    changes: u64,
    changes_at_scan: u64,
    changes_published: u64,
    /// A change peers must hear of before the next tick: a handoff request (the owner
    /// answers at its next round, as when every round scanned) or rows the watcher
    /// made. Other changes ride on the next regular heartbeat.
    urgent: bool,
    /// The watcher asked for a scan (new rows, a listing the keeper waits for).
    asked: bool,
    /// Peers' marks as of the last scan (see `pure::scan_due`).
    marks_at_scan: BTreeMap<WorkerId, PeerMark>,
    /// Leases long free as of the last scan: one turning so since asks for a scan.
    long_free_at_scan: BTreeSet<LeaseKey>,
    /// The roster as last read.
    roster: Option<BTreeSet<WorkerId>>,
    /// flotilla's own rows left in the lease table by workers of an older version.
    legacy: legacy::LegacyWatch,
    /// The last scan, which rounds without one act and report on.
    last_scan: Option<LastScan>,
    /// When the heartbeat rows were last read whole (lags and rates included: a scan
    /// or a `HeartbeatDetail::Full` read), as opposed to through the index.
    whole_read: Option<Instant>,
    /// Each worker's total records/s as of the last heartbeat read, and as of the last
    /// whole read: whether a round reads whole rows (`pure::heartbeat_detail`).
    totals: BTreeMap<WorkerId, u64>,
    totals_at_whole: BTreeMap<WorkerId, u64>,
    /// Each worker's lease count as of the last heartbeat read.
    lease_counts: BTreeMap<WorkerId, u64>,
}

/// What the last scan found, kept for the rounds that read only the heartbeat rows.
struct LastScan {
    sent: Instant,
    /// Every lease row, for the fleet view (and the watcher).
    leases: Arc<Vec<Lease>>,
    /// The rows the round dealt with (`pure::dealt`).
    dealt: Vec<Lease>,
    unreadable: BTreeMap<LeaseKey, String>,
    orphans: BTreeMap<LeaseKey, String>,
}

/// A handoff this worker asked for.
#[derive(Debug, Clone)]
struct Request {
    since: Instant,
    /// The owner asked, named as `from` when the lease arrives.
    of: Option<WorkerId>,
}

/// How often a heartbeat that stays unconfirmed past the fence time is reported again.
const STALL_REPORT_EVERY: Duration = Duration::from_secs(30);

impl Actor for LeaseKeeper {
    type Msg = KeeperMsg;
    type State = KeeperState;
    type Arguments = KeeperArgs;

    async fn pre_start(
        &self,
        myself: ActorRef<Self::Msg>,
        args: KeeperArgs,
    ) -> Result<KeeperState, ActorProcessingErr> {
        let _ = myself.cast(KeeperMsg::Tick);
        myself.send_interval(args.settings.lease.heartbeat_interval, || KeeperMsg::Tick);
        let delivered = args.delivered.load(Ordering::Relaxed);
        let observations = Observations::with_java_compat(args.settings.lease.java_compat);
        Ok(KeeperState {
            args,
            held: BTreeMap::new(),
            observations,
            cooling: BTreeMap::new(),
            heartbeat_counter: 0,
            malformed: Vec::new(),
            requested: BTreeMap::new(),
            handing_off: BTreeMap::new(),
            retiring: BTreeSet::new(),
            former_due: None,
            polling: false,
            deadline_scan: None,
            drain: None,
            stopped: false,
            report: ReleaseReport::default(),
            gained: BTreeMap::new(),
            given: BTreeMap::new(),
            last_rate: (delivered, Instant::now()),
            rates: RateMeter::new(),
            stall_reported: None,
            changes: 0,
            changes_at_scan: 0,
            changes_published: 0,
            urgent: false,
            asked: false,
            marks_at_scan: BTreeMap::new(),
            long_free_at_scan: BTreeSet::new(),
            roster: None,
            legacy: legacy::LegacyWatch::default(),
            last_scan: None,
            whole_read: None,
            totals: BTreeMap::new(),
            totals_at_whole: BTreeMap::new(),
            lease_counts: BTreeMap::new(),
            first_seen: BTreeMap::new(),
            orphans: BTreeSet::new(),
            listing_asked: None,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: KeeperMsg,
        state: &mut KeeperState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            KeeperMsg::Tick => {
                if state.stopped {
                    return Ok(());
                }
                state.heartbeat().await;
                state.round(&myself).await;
            }
            KeeperMsg::FormerDue => {
                state.former_due = None;
                if !state.stopped {
                    state.asked = true;
                    state.round(&myself).await;
                }
            }
            KeeperMsg::Retired {
                key,
                fence,
                outcome,
            } => {
                state.retired(key, fence, outcome).await;
                state.publish_changes().await;
            }
            KeeperMsg::ScanNow => {
                if !state.stopped {
                    // The watcher made rows (or has the listing the keeper waits
                    // for): peers must hear of it too.
                    state.asked = true;
                    state.changed();
                    state.urgent = true;
                    state.round(&myself).await;
                }
            }
            KeeperMsg::Deadline => {
                if !state.stopped {
                    state.round(&myself).await;
                }
            }
            KeeperMsg::PollHandoffs => {
                state.polling = false;
                if state.stopped {
                    return Ok(());
                }
                if state.drain.is_some() {
                    state.round(&myself).await;
                } else {
                    state.poll_requests().await;
                    state.publish_changes().await;
                }
                state.arm_poll(&myself);
            }
            // Both name the epoch they are about: news of an old epoch must not drop a
            // lease taken again since.
            KeeperMsg::Lost(key, fence) => {
                if state.held.get(&key) == Some(&fence) {
                    state.revoke(&key, "a write under this lease was refused");
                    state.moved_away(&key, LeaseMove::Lost, None);
                }
            }
            KeeperMsg::Finished(key, fence) => {
                if state.held.get(&key) == Some(&fence) {
                    // SHARD_END may make children processable.
                    state.changed();
                    state.let_go(&key);
                    state.moved_away(&key, LeaseMove::ShardEnded, None);
                }
            }
            KeeperMsg::GiveUp(key) => {
                let until = Instant::now() + state.args.settings.supervision.shard_cooldown;
                state.cooling.insert(key.clone(), until);
                if let Some(fence) = state.let_go(&key) {
                    state.changed();
                    match state.args.table.release(&key, &fence).await {
                        Ok(_) => {
                            info!(message = "Lease released after repeated failures; cooling down.", lease_key = %key);
                            state.moved_away(&key, LeaseMove::Released, None);
                        }
                        Err(error) => {
                            warn!(message = "Lease could not be released.", lease_key = %key, %error)
                        }
                    }
                }
            }
            KeeperMsg::Transfer {
                key,
                fence,
                to,
                outcome,
            } => {
                state.transfer(key, fence, to, outcome).await;
                state.publish_changes().await;
                state.check_drained();
            }
            KeeperMsg::Drain => {
                state.start_drain(&myself).await;
            }
            KeeperMsg::ReleaseAll(reply) => {
                state.release_all().await;
                let _ = reply.send(std::mem::take(&mut state.report));
            }
            KeeperMsg::Status(reply) => {
                let _ = reply.send(state.status());
            }
        }
        Ok(())
    }
}

fn sorted<'a>(keys: impl IntoIterator<Item = &'a LeaseKey>) -> Vec<String> {
    let mut out: Vec<String> = keys.into_iter().map(|k| k.to_string()).collect();
    out.sort();
    out
}

impl KeeperState {
    /// The lease leaves this worker in an orderly way (handed over, released,
    /// finished): no longer held, no longer on the fencing board.
    fn let_go(&mut self, key: &LeaseKey) -> Option<Fence> {
        let fence = self.held.remove(key)?;
        self.args.fencing.lock().forget(key, &fence);
        Some(fence)
    }

    /// This worker changed an ownership (or a write that may have done so went
    /// unanswered): its next heartbeat tells peers to read the lease rows.
    fn changed(&mut self) {
        self.changes += 1;
    }

    /// After a write that may change an ownership or a request: counted unless the
    /// table refused it (nothing changed then).
    fn wrote<T>(&mut self, result: &Result<T, LeaseError>) {
        if !matches!(result, Err(LeaseError::ConditionFailed { .. })) {
            self.changed();
        }
    }

    /// Writes the heartbeat now if an urgent change (`urgent`) is not in it yet, so
    /// peers read the lease rows at their next round, not the one after. Only then: an
    /// extra heartbeat also moves this worker's last sign of life, which a crash right
    /// after would turn into a later failover.
    async fn publish_changes(&mut self) {
        if self.urgent && self.changes != self.changes_published && !self.stopped {
            self.heartbeat().await;
        }
        self.urgent = false;
    }

    /// The lease is not this worker's any more: revoked on the fencing board at once,
    /// so no batch is delivered from now on, whoever has been told yet.
    fn revoke(&mut self, key: &LeaseKey, why: &str) -> Option<Fence> {
        let fence = self.held.remove(key)?;
        self.args.fencing.lock().revoke(key, &fence, why);
        Some(fence)
    }

    fn report(&self, samples: Vec<Sample>) {
        self.args.telemetry.record(samples);
    }

    fn settings(&self) -> &crate::settings::LeaseSettings {
        &self.args.settings.lease
    }

    fn status(&self) -> KeeperStatus {
        let now = Instant::now();
        let fencing = self.args.fencing.lock();
        let failover = self.settings().failover_time;
        KeeperStatus {
            held: sorted(self.held.keys()),
            live_workers: self
                .observations
                .alive(now, failover)
                .into_iter()
                .map(|w| w.to_string())
                .collect(),
            peers: self.observations.peers(now, failover),
            heartbeat_counter: self.heartbeat_counter,
            heartbeat_age_ms: fencing
                .last_confirmed()
                .map(|at| now.saturating_duration_since(at).as_millis() as u64),
            heartbeat_failures: fencing.failures().0,
            heartbeat_error: fencing.failures().1.map(str::to_owned),
            malformed_rows: self.malformed.clone(),
            cooling: sorted(
                self.cooling
                    .iter()
                    .filter(|(_, until)| **until > now)
                    .map(|(k, _)| k),
            ),
            requested: sorted(self.requested.keys()),
            handing_off: sorted(self.handing_off.keys()),
            draining: self.drain.is_some(),
            gained: self.gained.clone(),
            given: self.given.clone(),
        }
    }

    /// A lease came to this worker: one event, one count, one metric.
    fn moved_here(&mut self, lease: &Lease, from: Option<&WorkerId>, why: Gain) {
        *self.gained.entry(why.as_str().to_owned()).or_default() += 1;
        self.args.telemetry.emit(LeaseGained {
            key: &lease.key,
            counter: lease.counter,
            from,
            to: &self.args.me,
            why,
        });
    }

    /// A lease left this worker: one event, one count, one metric.
    fn moved_away(&mut self, key: &LeaseKey, why: LeaseMove, to: Option<&WorkerId>) {
        *self.given.entry(why.as_str().to_owned()).or_default() += 1;
        self.args.telemetry.emit(LeaseGiven {
            key,
            from: &self.args.me,
            to,
            why,
        });
    }

    fn load(&mut self) -> WorkerLoad {
        let now = Instant::now();
        let delivered = self.args.delivered.load(Ordering::Relaxed);
        let (before, at) = self.last_rate;
        let rate = pure::rate(delivered, before, now.saturating_duration_since(at));
        self.last_rate = (delivered, now);
        let held = |shard: &String| self.held.contains_key(&LeaseKey::new(shard.as_str()));
        let mut lag_ms = self.args.lags.snapshot();
        lag_ms.retain(|shard, _| held(shard));
        let mut subscribed_ms = self.args.lags.subscription_ages();
        subscribed_ms.retain(|shard, _| held(shard));
        let totals = self
            .args
            .lags
            .delivered_totals(|key| self.held.contains_key(key));
        let lease_rates = self.rates.sample(&totals, &lag_ms, self.held.keys(), now);
        WorkerLoad {
            leases: self.held.len() as u64,
            records_per_second: rate,
            draining: self.drain.is_some(),
            changes: self.changes,
            lag_ms,
            subscribed_ms,
            // Measured whatever the mode (cheap); published only by a worker that
            // balances on throughput, since publishing is what tells peers it does.
            lease_rates: match self.settings().balance {
                BalanceMode::Throughput => Some(lease_rates),
                BalanceMode::Count => None,
            },
            heartbeat_interval_ms: Some(self.settings().heartbeat_interval.as_millis() as u64),
            failover_time_ms: Some(self.settings().failover_time.as_millis() as u64),
        }
    }

    async fn heartbeat(&mut self) {
        let sent = Instant::now();
        let load = self.load();
        let result = self.args.table.heartbeat(&self.args.me, &load).await;
        if result.is_ok() {
            self.changes_published = self.changes_published.max(load.changes);
        }
        let fence_time = self.args.settings.lease.fence_time();
        let mut fencing = self.args.fencing.lock();
        let unconfirmed_for = fencing
            .last_confirmed()
            .map(|at| Instant::now().saturating_duration_since(at));
        let failures = match result {
            Ok(counter) => {
                self.heartbeat_counter = counter;
                // Confirmed as of when the write was sent, not when it was answered: a
                // slow answer (or a freeze in between) must not stretch the fencing
                // window. After a gap, the fence stays on until the scan rereads.
                fencing.heartbeat_confirmed(sent, Instant::now());
                if self.stall_reported.take().is_some() {
                    info!(
                        message = "Heartbeat confirmed again; each held lease delivers once its row is read again.",
                        worker_id = %self.args.me,
                        unconfirmed_ms = unconfirmed_for.map(|d| d.as_millis() as u64),
                    );
                }
                0
            }
            Err(error) => {
                if matches!(error, LeaseError::NotFound { .. }) {
                    drop(fencing);
                    self.table_gone(&error);
                    return;
                }
                let failures = fencing.heartbeat_failed(error.to_string());
                if let Some(drain) = &mut self.drain {
                    drain.table_failed.get_or_insert_with(|| error.to_string());
                }
                if pure::heartbeat_stall_due(
                    unconfirmed_for,
                    fence_time,
                    self.stall_reported.map(|at| at.elapsed()),
                    STALL_REPORT_EVERY,
                ) {
                    self.stall_reported = Some(Instant::now());
                    error!(
                        message = "Heartbeat not confirmed for longer than the fence time: every held shard has stopped delivering, and peers will take its leases after the failover time.",
                        worker_id = %self.args.me,
                        unconfirmed_ms = unconfirmed_for.map(|d| d.as_millis() as u64),
                        failures,
                        held = self.held.len(),
                        %error,
                    );
                } else {
                    warn!(message = "Heartbeat not written.", worker_id = %self.args.me, failures, %error);
                }
                self.args.telemetry.emit(CallFailed {
                    call: Call::Heartbeat,
                    shard: None,
                    error: &error,
                });
                failures
            }
        };
        let fenced = fencing.fenced_count(Instant::now());
        drop(fencing);
        self.report(vec![
            Sample::new(Metric::HeartbeatFailures, f64::from(failures)),
            Sample::new(Metric::ShardsFenced, fenced as f64),
        ]);
    }

    /// The lease table (or its worker table) does not exist: it was deleted under this
    /// worker (`flotilla destroy --force`, by hand). Nothing it does next can be right:
    /// made again, it would start every shard over. The worker stops with the reason
    /// (at ERROR, and `Worker::wait`'s error: `flotilla run` exits non-zero), unless it is
    /// already stopping, whose drain reports the failing table itself.
    fn table_gone(&mut self, error: &LeaseError) {
        if self.drain.is_some() {
            self.drain_table_failed(error);
            return;
        }
        self.args.fencing.lock().heartbeat_failed(error.to_string());
        let reason = format!(
            "the lease table {} (or its worker table {}) was deleted under this worker: {error}; \
             its checkpoints are gone. Make it again only to start the application afresh \
             (`flotilla init`), or point the worker at the right table and region",
            self.args.table.table_name(),
            self.args.table.worker_table_name(),
        );
        error!(message = "The lease table is gone; the worker stops.", %reason);
        let _ = self.args.supervisor.cast(SupervisorMsg::Fatal(reason));
    }

    fn arm_poll(&mut self, myself: &ActorRef<KeeperMsg>) {
        let draining = self.drain.as_ref().is_some_and(|d| !d.done);
        if self.polling || self.stopped || (self.requested.is_empty() && !draining) {
            return;
        }
        self.polling = true;
        myself.send_after(self.settings().handoff_poll_interval, || {
            KeeperMsg::PollHandoffs
        });
    }

    /// One round: reads the heartbeat rows, and every row only when `pure::scan_due`
    /// says something changed (or may have); then acts, publishes the fleet view, and
    /// arms the deadline. Rows read by a scan serve the rounds after it until the next.
    async fn round(&mut self, myself: &ActorRef<KeeperMsg>) {
        let sent = Instant::now();
        let detail = pure::heartbeat_detail(
            &self.limits().policy,
            self.whole_read.map(|at| sent.saturating_duration_since(at)),
            self.settings().failover_time,
            &pure::Totals {
                now: &self.totals,
                at_whole: &self.totals_at_whole,
                leases: &self.lease_counts,
            },
            self.args.fleet.take_wanted(),
        );
        let read = self.args.table.heartbeats(detail).await;
        let now = Instant::now();
        let heartbeats_read = match read {
            Ok(mut out) => {
                self.totals = totals(&out.heartbeats);
                self.lease_counts = out
                    .heartbeats
                    .iter()
                    .map(|h| (h.worker.clone(), h.load.leases))
                    .collect();
                if out.summary {
                    // Read through the index: lags and rates as last read whole.
                    for heartbeat in &mut out.heartbeats {
                        if let Some(whole) = self.observations.load_of(&heartbeat.worker) {
                            heartbeat.load.fill_unread(whole);
                        }
                    }
                } else {
                    self.whole_read = Some(sent);
                    self.totals_at_whole.clone_from(&self.totals);
                }
                let me = self.args.me.clone();
                if !out.roster.contains(&me) {
                    // First round, or the row was deleted while this worker was away.
                    // Peers see the new mark; no change of ours to count.
                    if let Err(error) = self.args.table.join_roster(std::slice::from_ref(&me)).await
                    {
                        warn!(message = "Could not join the roster.", %error);
                    }
                }
                self.roster = Some(out.roster.into_iter().collect());
                self.legacy.observe(&out.legacy, false, now);
                let owners: Vec<WorkerId> = self
                    .last_scan
                    .iter()
                    .flat_map(|l| l.dealt.iter().filter_map(|l| l.owner.clone()))
                    .collect();
                self.observations.observe(&out.heartbeats, &owners, now);
                if let Some(last) = &self.last_scan {
                    self.observations.observe_leases(
                        &last.dealt,
                        now,
                        self.settings().failover_time,
                    );
                }
                true
            }
            Err(error) => {
                // An older policy without BatchGetItem, say: every round scans, as
                // before this read existed.
                warn!(message = "Heartbeat rows not read; scanning the table instead.", %error);
                false
            }
        };
        let marks = self.marks(now);
        let long_free = self.long_free(now);
        let since_scan = self
            .last_scan
            .as_ref()
            .map(|l| now.saturating_duration_since(l.sent));
        let awaiting_reread = self.args.fencing.lock().awaiting_reread();
        let would_move = heartbeats_read && self.cached_rows_would_move(now);
        let why = if heartbeats_read {
            pure::scan_due(&ReadState {
                since_scan,
                asked: self.asked,
                own_changes: (self.changes, self.changes_at_scan),
                marks: &marks,
                marks_at_scan: &self.marks_at_scan,
                long_free: &long_free,
                long_free_at_scan: &self.long_free_at_scan,
                awaiting_reread,
                cooled: self.cooling.values().any(|until| *until <= now),
                would_move,
                rebalance_every: self.settings().failover_time,
                full_scan_interval: self.settings().full_scan_interval,
            })
        } else {
            Some(ScanWhy::Unread)
        };
        match why {
            Some(why) => {
                debug!(message = "Scanning the lease table.", why = why.as_str());
                self.scan_and_act(myself).await;
            }
            None => self.quiet_round(myself, now),
        }
        self.remove_dead_rows(now).await;
        self.retire_legacy_rows(now).await;
        self.publish_changes().await;
    }

    /// Deletes the lease table's legacy rows once no worker of an older version is
    /// alive (`legacy::LegacyWatch::retirement`), so that the Java KCL can read the table.
    async fn retire_legacy_rows(&mut self, now: Instant) {
        let failover = self.settings().failover_time;
        let members = self
            .observations
            .members(&self.args.me, self.drain.is_some(), now, failover);
        let Some(plan) = self
            .legacy
            .retirement(&self.args.me, &members, now, failover)
        else {
            return;
        };
        match self.args.table.retire_legacy(&plan).await {
            Ok(true) => {
                info!(
                    message = "No worker of an older flotilla is left: its rows in the lease table (roster and heartbeats) deleted; the table holds lease rows only.",
                    table = %self.args.table.table_name(),
                    rows = plan.rows.len(),
                );
                self.legacy.retired();
                // A scan confirms nothing was left behind.
                self.asked = true;
            }
            Ok(false) => {
                debug!(message = "The legacy roster changed; its rows are kept for now.")
            }
            Err(error) => warn!(message = "Legacy rows not deleted.", %error),
        }
    }

    /// Whether the last scan's rows, judged with the heartbeats just read, would make
    /// this worker take or ask for a lease. Nothing that changes ownership has happened
    /// since that scan (else `scan_due` scans anyway), so what can differ is the rates
    /// peers publish: throughput balance reacts to them without an ownership change.
    fn cached_rows_would_move(&self, now: Instant) -> bool {
        let Some(last) = &self.last_scan else {
            return false;
        };
        if !matches!(self.limits().policy, Policy::Throughput(_)) {
            return false;
        }
        let decision = self.decide(&last.dealt, now);
        !decision.take.is_empty() || !decision.request.is_empty()
    }

    /// `balance::decide` on `leases` with what this worker observes now.
    fn decide(&self, leases: &[Lease], now: Instant) -> balance::Decision {
        let cooling: BTreeSet<LeaseKey> = self.cooling.keys().cloned().collect();
        // A lease being retired is not handed to anyone who asks: it is released.
        let handing_off: BTreeSet<LeaseKey> = self
            .handing_off
            .keys()
            .chain(&self.retiring)
            .cloned()
            .collect();
        balance::decide(
            &Round {
                leases,
                held: &self.held,
                observations: &self.observations,
                me: &self.args.me,
                now,
                cooling: &cooling,
                handing_off: &handing_off,
                draining: self.drain.is_some(),
            },
            &self.limits(),
        )
    }

    /// The balance limits from the settings.
    fn limits(&self) -> Limits {
        Limits::from_settings(self.settings())
    }

    /// Each peer's mark as this worker sees it now (`pure::PeerMark`).
    fn marks(&self, now: Instant) -> BTreeMap<WorkerId, PeerMark> {
        self.observations
            .peers(now, self.settings().failover_time)
            .into_iter()
            .filter(|p| p.worker != self.args.me)
            .map(|p| {
                let mark = PeerMark {
                    alive: p.alive,
                    draining: p.load.draining,
                    changes: p.has_heartbeat.then_some(p.load.changes),
                };
                (p.worker, mark)
            })
            .collect()
    }

    /// The leases of the last scan that have had no live owner for the failover time.
    fn long_free(&self, now: Instant) -> BTreeSet<LeaseKey> {
        let dealt = self.last_scan.as_ref().map_or(&[][..], |l| &l.dealt[..]);
        self.long_free_from(dealt, now)
    }

    /// A round with nothing changed: the last scan's rows stand; only the heartbeats
    /// are new, so the fleet view is published again with them, and the deadline of the
    /// next owner to turn dead re-armed.
    fn quiet_round(&mut self, myself: &ActorRef<KeeperMsg>, now: Instant) {
        let Some(last) = self.last_scan.take() else {
            return;
        };
        if self.args.settings.status.enabled {
            let by_key: BTreeMap<&LeaseKey, &Lease> =
                last.dealt.iter().map(|l| (&l.key, l)).collect();
            self.publish_view(&last.leases, &by_key, &last.unreadable, &last.orphans, now);
        }
        self.check_drained();
        self.arm_poll(myself);
        self.arm_deadline_scan(myself, &last.dealt, now);
        self.last_scan = Some(last);
    }

    fn publish_view(
        &self,
        leases: &[Lease],
        by_key: &BTreeMap<&LeaseKey, &Lease>,
        unreadable: &BTreeMap<LeaseKey, String>,
        orphans: &BTreeMap<LeaseKey, String>,
        now: Instant,
    ) {
        let view = fleet_view(&FleetScan {
            application: &self.args.application,
            stream: &self.args.stream,
            read_mode: self.args.settings.reader.mode.as_str(),
            observer: &self.args.me,
            malformed: &self.malformed,
            leases,
            by_key,
            unreadable,
            orphans,
            observations: &self.observations,
            now,
            failover: self.settings().failover_time,
        });
        self.args.fleet.send_replace(Some(Arc::new((view, now))));
    }

    /// Deletes the heartbeat rows of workers dead past the retention
    /// (`pure::dead_rows`), each only while its counter has not moved.
    async fn remove_dead_rows(&mut self, now: Instant) {
        let settings = self.settings();
        let (failover, retention) = (settings.failover_time, settings.dead_worker_retention);
        let members = self
            .observations
            .members(&self.args.me, self.drain.is_some(), now, failover);
        let peers = self.observations.peers(now, failover);
        let dead = pure::dead_rows(
            peers.iter().map(|p| {
                (
                    &p.worker,
                    self.observations.heartbeat_of(&p.worker),
                    Duration::from_millis(p.silent_ms),
                )
            }),
            &self.args.me,
            &members,
            retention,
        );
        for (worker, counter) in dead {
            match self
                .args
                .table
                .remove_dead_heartbeat(&worker, counter)
                .await
            {
                Ok(true) => info!(
                    message = "Heartbeat row of a worker dead past the retention deleted.",
                    dead_worker = %worker,
                    counter,
                ),
                Ok(false) => {
                    debug!(message = "Dead worker's heartbeat moved again; row kept.", dead_worker = %worker)
                }
                Err(error) => {
                    warn!(message = "Dead worker's heartbeat row not deleted.", dead_worker = %worker, %error)
                }
            }
        }
    }

    async fn scan_and_act(&mut self, myself: &ActorRef<KeeperMsg>) {
        let sent = Instant::now();
        // What this scan covers: changes made before it, and the watcher's request.
        let changes_before = self.changes;
        let scan = match self.args.table.scan().await {
            Ok(scan) => scan,
            Err(error) => {
                if matches!(error, LeaseError::NotFound { .. }) {
                    self.table_gone(&error);
                    return;
                }
                warn!(message = "Lease table scan failed.", %error);
                self.drain_table_failed(&error);
                return;
            }
        };
        self.asked = false;
        self.changes_at_scan = changes_before;
        self.whole_read = Some(sent);
        self.totals = totals(&scan.heartbeats);
        self.totals_at_whole.clone_from(&self.totals);
        self.repair_roster(&scan.heartbeats).await;
        self.legacy.observe(&scan.legacy, true, Instant::now());
        // Held leases the scan shows still ours: proof of ownership as of when the scan
        // was sent, which lifts the fence after a gap in heartbeats.
        {
            let mut fencing = self.args.fencing.lock();
            for lease in &scan.leases {
                if self.held.get(&lease.key) == Some(&lease.fence()) {
                    fencing.reconfirm(&lease.key, &lease.fence(), sent);
                }
            }
        }
        let unreadable = self.note_malformed(&scan.malformed);
        // Rows of streams that left the set are not orphans: they are finished here.
        let set = self.args.set.borrow().clone();
        let former: BTreeMap<LeaseKey, String> = scan
            .leases
            .iter()
            .filter_map(|l| {
                let f = set.former_of(&l.key)?;
                Some((
                    l.key.clone(),
                    format!("former stream {}: left the stream set", f.stream.stream),
                ))
            })
            .collect();
        let (orphans, unlisted) = if former.is_empty() {
            self.find_orphans(&scan.leases, sent)
        } else {
            let current: Vec<Lease> = scan
                .leases
                .iter()
                .filter(|l| !former.contains_key(&l.key))
                .cloned()
                .collect();
            self.find_orphans(&current, sent)
        };
        self.finish_former(&scan.leases, &former, &set, myself)
            .await;
        // Held orphans: stop them here and let the row go; nobody takes them again.
        for lease in scan.leases.iter().filter(|l| orphans.contains_key(&l.key)) {
            if self.held.get(&lease.key) != Some(&lease.fence()) {
                continue;
            }
            let why = "its shard is not in the stream";
            if let Some(fence) = self.revoke(&lease.key, why) {
                error!(message = "Held lease is for a shard the stream does not have; stopping it and releasing the row.", lease_key = %lease.key, stream = %self.args.stream);
                let _ = self
                    .args
                    .supervisor
                    .cast(SupervisorMsg::LeaseLost(lease.key.clone(), fence.clone()));
                let released = self.args.table.release(&lease.key, &fence).await;
                self.wrote(&released);
                if released.is_ok() {
                    self.moved_away(&lease.key, LeaseMove::Released, None);
                }
            }
        }
        // The rest of the round sees neither orphans nor unreadable rows, nor rows the
        // last listing does not show yet (unless held): only a shard the stream is
        // known to have is dealt, taken or counted in anyone's share.
        // A former stream's lease is dealt only while held (until it is released): never
        // taken, never counted in anyone's share.
        let mut skipped = orphans.clone();
        skipped.extend(
            former
                .into_iter()
                .filter(|(key, _)| !self.held.contains_key(key)),
        );
        let leases: Vec<Lease> = pure::dealt(&scan.leases, &skipped, &unlisted, &self.held)
            .into_iter()
            .cloned()
            .collect();
        let now = Instant::now();
        self.cooling.retain(|_, until| *until > now);
        self.observations.observe(
            &scan.heartbeats,
            leases.iter().filter_map(|l| l.owner.as_ref()),
            now,
        );
        self.observations.observe_lease_counters(&leases, now);
        self.observations
            .observe_leases(&leases, now, self.settings().failover_time);
        let decision = self.decide(&leases, now);
        // Requests that are no longer ours to wait for: answered elsewhere, turned
        // down, or the row is gone.
        let by_key: BTreeMap<&LeaseKey, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
        let me = self.args.me.clone();
        self.requested
            .retain(|key, _| pure::request_open(by_key.get(key).copied(), &me));
        // Only the status endpoint reads it.
        if self.args.settings.status.enabled {
            self.publish_view(&scan.leases, &by_key, &unreadable, &orphans, now);
        }
        self.act(decision, &by_key, &unreadable).await;
        self.report(vec![
            Sample::new(Metric::LeasesHeld, self.held.len() as f64),
            Sample::new(Metric::LeasesUnreadable, unreadable.len() as f64),
            Sample::new(Metric::LeasesOrphaned, orphans.len() as f64),
        ]);
        self.check_drained();
        self.arm_poll(myself);
        self.arm_deadline_scan(myself, &leases, now);
        // What the rounds until the next scan compare against.
        self.marks_at_scan = self.marks(now);
        self.long_free_at_scan = self.long_free_from(&leases, now);
        let all = Arc::new(scan.leases);
        self.args.rows.send_replace(Some(all.clone()));
        self.last_scan = Some(LastScan {
            sent,
            leases: all,
            dealt: leases,
            unreadable,
            orphans,
        });
    }

    fn long_free_from(&self, leases: &[Lease], now: Instant) -> BTreeSet<LeaseKey> {
        let failover = self.settings().failover_time;
        leases
            .iter()
            .filter(|l| self.observations.long_free(&l.key, now, failover))
            .map(|l| l.key.clone())
            .collect()
    }

    /// Names in the roster the workers whose heartbeat rows a scan found but the roster
    /// does not (a worker of an older version, a roster lost), so the rounds between
    /// scans see them too.
    async fn repair_roster(&mut self, heartbeats: &[crate::model::Heartbeat]) {
        let Some(roster) = &self.roster else {
            return;
        };
        let missing: Vec<WorkerId> = heartbeats
            .iter()
            .map(|h| h.worker.clone())
            .filter(|w| !roster.contains(w))
            .collect();
        if missing.is_empty() {
            return;
        }
        match self.args.table.join_roster(&missing).await {
            Ok(()) => {
                info!(message = "Workers missing from the roster added to it.", workers = ?missing.iter().map(|w| w.as_str()).collect::<Vec<_>>());
                if let Some(roster) = &mut self.roster {
                    roster.extend(missing);
                }
            }
            Err(error) => warn!(message = "Roster not repaired.", %error),
        }
    }

    /// Keeps this scan's unreadable rows (logged at ERROR when first seen: each may be a
    /// shard nobody processes) and returns the lease rows among them by key.
    fn note_malformed(&mut self, malformed: &[MalformedRow]) -> BTreeMap<LeaseKey, String> {
        let texts: Vec<String> = malformed.iter().map(|m| m.to_string()).collect();
        for (bad, text) in malformed.iter().zip(&texts) {
            if !self.malformed.contains(text) {
                error!(
                    message = "Lease table row unreadable; skipped until it is repaired.",
                    row = %text,
                    lease_key = bad.key.as_deref().unwrap_or("(none)"),
                    attribute = %bad.attribute,
                );
            }
        }
        self.malformed = texts;
        malformed
            .iter()
            .filter_map(|m| {
                let key = m.key.as_deref()?;
                (!key.starts_with(WORKER_KEY_PREFIX)).then(|| (LeaseKey::new(key), m.to_string()))
            })
            .collect()
    }

    /// Rows for shards the stream does not have, each with why, judged against the
    /// watcher's last listing (`model::orphans`); and the rows that listing does not
    /// show but that were first seen after it (a child just created, a row a peer made
    /// from a newer listing): those ask for a fresh listing, and wait for it. Before the
    /// first listing, every unfinished row waits.
    fn find_orphans(
        &mut self,
        leases: &[Lease],
        sent: Instant,
    ) -> (BTreeMap<LeaseKey, String>, BTreeSet<LeaseKey>) {
        for lease in leases {
            self.first_seen.entry(lease.key.clone()).or_insert(sent);
        }
        let present: BTreeSet<&LeaseKey> = leases.iter().map(|l| &l.key).collect();
        self.first_seen.retain(|k, _| present.contains(k));
        let Some(listing) = self.args.listing.borrow().clone() else {
            let waiting = leases
                .iter()
                .filter(|l| !l.checkpoint.is_shard_end())
                .map(|l| l.key.clone())
                .collect();
            return (BTreeMap::new(), waiting);
        };
        let found = crate::model::orphans(leases, &listing.shards, listing.sent, |l| {
            self.first_seen.get(&l.key).copied()
        });
        if !found.unconfirmed.is_empty()
            && self.listing_asked.is_none_or(|asked| asked < listing.sent)
        {
            self.listing_asked = Some(Instant::now());
            let _ = self.args.supervisor.cast(SupervisorMsg::ListShardsNow);
        }
        let unlisted = found.unconfirmed.iter().map(|l| l.key.clone()).collect();
        let orphans: BTreeMap<LeaseKey, String> = found
            .confirmed
            .iter()
            .map(|l| {
                (
                    l.key.clone(),
                    format!(
                        "orphan: shard {} is not in stream {}",
                        l.key.shard_id(),
                        self.args.stream
                    ),
                )
            })
            .collect();
        let keys: BTreeSet<LeaseKey> = orphans.keys().cloned().collect();
        if keys != self.orphans {
            if !keys.is_empty() {
                // ERROR, not WARN: the listing may be what is wrong (a server paging it
                // badly), and then these are shards nobody processes.
                error!(
                    message = "Lease rows for shards the stream does not have: left alone, not taken, not deleted.",
                    stream = %self.args.stream,
                    leases = ?keys.iter().map(|k| k.to_string()).collect::<Vec<_>>(),
                );
            }
            self.orphans = keys;
        }
        (orphans, unlisted)
    }

    /// Schedules a scan for the moment the first owner of leases would turn dead, so
    /// its leases move at the failover time rather than at the next heartbeat tick
    /// after it (which could add a whole interval to every failover).
    fn arm_deadline_scan(&mut self, myself: &ActorRef<KeeperMsg>, leases: &[Lease], now: Instant) {
        let failover = self.settings().failover_time;
        let dead_at = leases
            .iter()
            .filter(|l| !l.checkpoint.is_shard_end())
            .filter(|l| l.owner.as_ref().is_some_and(|o| *o != self.args.me))
            .filter_map(|l| self.observations.lease_dead_at(l, failover));
        let pending = self.deadline_scan.filter(|at| *at > now);
        self.deadline_scan = pending;
        let interval = self.settings().heartbeat_interval;
        if let Some(next) = pure::deadline_scan(dead_at, now, pending, interval) {
            self.deadline_scan = Some(next);
            myself.send_after(next - now + Duration::from_millis(1), || {
                KeeperMsg::Deadline
            });
        }
    }

    /// Does what the round decided, in the order `pure::actions` gives.
    async fn act(
        &mut self,
        decision: Decision,
        by_key: &BTreeMap<&LeaseKey, &Lease>,
        unreadable: &BTreeMap<LeaseKey, String>,
    ) {
        let requested: BTreeSet<LeaseKey> = self.requested.keys().cloned().collect();
        let now = Instant::now();
        for action in pure::actions(decision, by_key, unreadable, &requested, &self.args.me) {
            match action {
                Action::Release { key, fence } => self.release_unheld(&key, &fence).await,
                Action::Revoke {
                    key,
                    why,
                    reason,
                    to,
                    unreadable,
                } => {
                    // Revoked before anyone is told: no batch reaches a processor from
                    // here on.
                    let Some(fence) = self.revoke(&key, &why) else {
                        continue;
                    };
                    match unreadable {
                        Some(bad) => error!(
                            message = "Lease row unreadable; the shard stops here until the row is repaired.",
                            lease_key = %key,
                            row = %bad,
                        ),
                        None => warn!(message = "Lease lost.", lease_key = %key, why = %why),
                    }
                    self.moved_away(&key, reason, to.as_ref());
                    self.handing_off.remove(&key);
                    let _ = self
                        .args
                        .supervisor
                        .cast(SupervisorMsg::LeaseLost(key, fence));
                }
                Action::TurnDown { key, asker } => {
                    let cleared = self.args.table.clear_handoff(&key, &asker).await;
                    self.wrote(&cleared);
                    match cleared {
                        Ok(()) => {
                            info!(message = "Handoff request turned down: the asker is dead or leaving.", lease_key = %key, asker = %asker)
                        }
                        Err(error) => {
                            debug!(message = "Stale handoff request not cleared.", lease_key = %key, %error)
                        }
                    }
                }
                Action::HandOff { key, fence, to } => {
                    info!(message = "Handing lease over on request.", lease_key = %key, to = %to);
                    self.handing_off.insert(key.clone(), to.clone());
                    let _ = self
                        .args
                        .supervisor
                        .cast(SupervisorMsg::HandOff { key, fence, to });
                }
                Action::Take {
                    key,
                    fence,
                    why,
                    expired_from,
                } => self.take(&key, &fence, why, expired_from).await,
                Action::Request { key, fence } => {
                    let asked = self
                        .args
                        .table
                        .request_handoff(&key, &fence, &self.args.me)
                        .await;
                    self.wrote(&asked);
                    match asked {
                        Ok(()) => {
                            self.urgent = true;
                            info!(message = "Asked for a lease.", lease_key = %key, owner = ?fence.owner);
                            self.requested.entry(key).or_insert(Request {
                                since: now,
                                of: fence.owner.clone(),
                            });
                        }
                        Err(LeaseError::ConditionFailed { .. }) => {
                            debug!(message = "Lease changed before it could be asked for.", lease_key = %key);
                        }
                        Err(error) => {
                            warn!(message = "Handoff request not written.", lease_key = %key, %error);
                        }
                    }
                }
            }
        }
    }

    /// Notes a release in the shutdown report. Released in the end, a lease is not also
    /// reported as failed by an earlier attempt (the sweep by name retries those).
    fn report_released(&mut self, key: &LeaseKey) {
        let failed = format!("{key}: ");
        self.report.failed.retain(|f| !f.starts_with(&failed));
        self.report.released.push(key.to_string());
    }

    /// Lets go of a lease this worker owns by name but does not process.
    async fn release_unheld(&mut self, key: &LeaseKey, fence: &Fence) {
        let released = self.args.table.release(key, fence).await;
        self.wrote(&released);
        match released {
            Ok(_) => {
                self.moved_away(key, LeaseMove::Released, None);
                self.report_released(key);
            }
            Err(error) => {
                debug!(message = "Lease owned by name not released.", lease_key = %key, %error)
            }
        }
    }

    /// Takes a lease. From a dead owner (`expired_from`, `pure::expired_from`), the take
    /// holds only while its heartbeat still stands where this worker saw it stand still.
    async fn take(
        &mut self,
        key: &LeaseKey,
        fence: &Fence,
        why: Gain,
        expired_from: Option<WorkerId>,
    ) {
        let sent = Instant::now();
        let taken = match &expired_from {
            Some(owner) => {
                let beat = self.observations.heartbeat_of(owner);
                self.args
                    .table
                    .take_expired(key, fence, &self.args.me, beat)
                    .await
            }
            None => self.args.table.take(key, fence, &self.args.me).await,
        };
        self.wrote(&taken);
        match taken {
            Ok(lease) => {
                // A lease handed over is taken from a row that already names this
                // worker: it came from the owner that was asked.
                let asked = self.requested.remove(key).and_then(|r| r.of);
                let from = pure::gained_from(fence, asked, &self.args.me);
                self.held.insert(key.clone(), lease.fence());
                self.args.fencing.lock().hold(key, &lease.fence(), sent);
                self.moved_here(&lease, from.as_ref(), why);
                let _ = self
                    .args
                    .supervisor
                    .cast(SupervisorMsg::LeaseGained(Box::new(lease)));
            }
            Err(LeaseError::ConditionFailed { owner, counter, .. })
                if expired_from.is_some()
                    && owner == fence.owner
                    && counter == Some(fence.counter) =>
            {
                info!(
                    message = "Lease not taken: its owner's heartbeat moved again.",
                    lease_key = %key,
                    owner = ?fence.owner,
                );
            }
            Err(LeaseError::ConditionFailed { .. }) => {
                debug!(message = "Lease taken by another worker first.", lease_key = %key);
            }
            Err(error) => {
                warn!(message = "Lease could not be taken.", lease_key = %key, %error);
            }
        }
    }

    /// Reads each requested lease: takes it the moment it is ours, withdraws a request
    /// a live owner has ignored past `handoff_timeout`.
    async fn poll_requests(&mut self) {
        let timeout = self.settings().handoff_timeout;
        // In key order (a BTreeMap).
        let keys: Vec<(LeaseKey, Instant)> = self
            .requested
            .iter()
            .map(|(k, r)| (k.clone(), r.since))
            .collect();
        for (key, since) in keys {
            match self.args.table.get(&key).await {
                Ok(Some(lease)) if lease.owner.as_ref() == Some(&self.args.me) => {
                    if !self.held.contains_key(&key) {
                        self.take(&key, &lease.fence(), Gain::HandedOff, None).await;
                    }
                    self.requested.remove(&key);
                }
                Ok(Some(lease)) if lease.handoff_to.as_ref() != Some(&self.args.me) => {
                    // Turned down, or gone to someone else: the next round decides again.
                    self.requested.remove(&key);
                }
                Ok(Some(lease)) => {
                    if since.elapsed() >= timeout {
                        warn!(
                            message = "Handoff request withdrawn: the owner did not answer in time.",
                            lease_key = %key,
                            owner = ?lease.owner,
                            waited_ms = since.elapsed().as_millis() as u64,
                        );
                        let cleared = self.args.table.clear_handoff(&key, &self.args.me).await;
                        self.wrote(&cleared);
                        self.requested.remove(&key);
                    }
                }
                Ok(None) => {
                    self.requested.remove(&key);
                }
                Err(error) => {
                    debug!(message = "Requested lease unreadable; retrying.", lease_key = %key, %error);
                }
            }
        }
    }

    /// Finishes the leases of former streams (`model::StreamSetView`): a held one is
    /// stopped gracefully and released (`SupervisorMsg::Retire`, then `Retired`); one
    /// this worker owns by name but does not run (a keeper restarted meanwhile) is
    /// released; past the grace, rows nobody alive owns are deleted, each conditional
    /// on the owner and counter read. Arms a scan for when the next rows turn due.
    async fn finish_former(
        &mut self,
        rows: &[Lease],
        former: &BTreeMap<LeaseKey, String>,
        set: &crate::model::StreamSetView<Instant>,
        myself: &ActorRef<KeeperMsg>,
    ) {
        // A lease that left otherwise meanwhile (handed over, lost) is not retiring.
        self.retiring.retain(|key| self.held.contains_key(key));
        if set.former.is_empty() {
            return;
        }
        for lease in rows.iter().filter(|l| former.contains_key(&l.key)) {
            let fence = lease.fence();
            if self.held.get(&lease.key) == Some(&fence) {
                if self.retiring.insert(lease.key.clone()) {
                    info!(message = "Lease of a stream that left the set: stopping its reader, then releasing it.", lease_key = %lease.key);
                    let _ = self.args.supervisor.cast(SupervisorMsg::Retire {
                        key: lease.key.clone(),
                        fence,
                    });
                }
            } else if lease.owner.as_ref() == Some(&self.args.me)
                && !self.held.contains_key(&lease.key)
            {
                self.release_unheld(&lease.key, &fence).await;
            }
        }
        let now = Instant::now();
        let grace = self.args.settings.worker.former_stream_grace;
        let alive: BTreeSet<WorkerId> = self
            .observations
            .alive(now, self.settings().failover_time)
            .into_iter()
            .collect();
        let due: Vec<Lease> = crate::model::former_rows_due(set, rows, now, grace, |w| {
            *w == self.args.me || alive.contains(w)
        })
        .into_iter()
        .filter(|l| !self.held.contains_key(&l.key))
        .cloned()
        .collect();
        for lease in due {
            match self.args.table.delete(&lease.key, &lease.fence()).await {
                Ok(()) => {
                    info!(message = "Lease row of a former stream deleted after the grace.", event = "lease_deleted", lease_key = %lease.key);
                }
                // Taken or changed since it was read (a worker whose set still has the
                // stream): the next scan decides again.
                Err(error) => {
                    debug!(message = "Former stream's lease row not deleted.", lease_key = %lease.key, %error)
                }
            }
        }
        // The next deletion: a scan then, rather than at the next full scan.
        let next = set
            .former
            .iter()
            .map(|f| f.deletion_due(grace))
            .filter(|due| *due > now)
            .min();
        if let Some(next) = next
            && self
                .former_due
                .is_none_or(|armed| armed > next || armed <= now)
        {
            self.former_due = Some(next);
            myself.send_after(next - now + Duration::from_millis(1), || {
                KeeperMsg::FormerDue
            });
        }
    }

    /// A former stream's lease has stopped and flushed: release it.
    async fn retired(&mut self, key: LeaseKey, fence: Fence, outcome: ShardShutdown) {
        self.retiring.remove(&key);
        if self.held.get(&key) != Some(&fence) {
            return;
        }
        self.let_go(&key);
        let released = self.args.table.release(&key, &fence).await;
        self.wrote(&released);
        match released {
            Ok(_) => {
                info!(message = "Lease of a stream that left the set released.", lease_key = %key, checkpoint_flushed = outcome.checkpoint_flushed);
                self.moved_away(&key, LeaseMove::Released, None);
            }
            Err(error) => {
                warn!(message = "Lease of a former stream could not be released.", lease_key = %key, %error)
            }
        }
    }

    async fn transfer(
        &mut self,
        key: LeaseKey,
        fence: Fence,
        to: WorkerId,
        outcome: ShardShutdown,
    ) {
        self.handing_off.remove(&key);
        if self.held.get(&key) != Some(&fence) {
            return;
        }
        self.let_go(&key);
        let transferred = self.args.table.transfer(&key, &fence, &to).await;
        self.wrote(&transferred);
        match transferred {
            Ok(_) => {
                self.moved_away(&key, LeaseMove::HandedOff, Some(&to));
                self.report.handed_off.push(key.to_string());
                self.report.handed_off_shards.push(outcome);
            }
            Err(error) => {
                // The asker withdrew, or the write failed: the shard's reader is
                // stopped, so let the lease go for whoever is next.
                warn!(message = "Lease not handed over; releasing it.", lease_key = %key, to = %to, %error);
                let released = self.args.table.release(&key, &fence).await;
                self.wrote(&released);
                match released {
                    Ok(_) => {
                        self.moved_away(&key, LeaseMove::Released, None);
                        self.report_released(&key);
                        self.report.handed_off_shards.push(outcome);
                    }
                    Err(error) => {
                        warn!(message = "Lease could not be released.", lease_key = %key, %error);
                        self.report.failed.push(format!("{key}: {error}"));
                    }
                }
            }
        }
    }

    /// Leaves the fleet: releases every held lease, withdraws requests, releases what
    /// is still this worker's by name, and removes the heartbeat row. Every lease that
    /// could not be let go (or checked) is named in the report's `failed`; once the
    /// table has failed twice in a row, the rest are not attempted (each attempt would
    /// cost a timeout) and are named as such.
    async fn release_all(&mut self) {
        self.stopped = true;
        // In key order (a BTreeMap).
        let held: Vec<(LeaseKey, Fence)> = std::mem::take(&mut self.held).into_iter().collect();
        for (key, fence) in &held {
            self.args.fencing.lock().forget(key, fence);
        }
        let mut failing: Option<(u32, String)> = None;
        let table_down = |failing: &Option<(u32, String)>| {
            failing
                .as_ref()
                .filter(|(n, _)| *n >= 2)
                .map(|(_, e)| e.clone())
        };
        for (key, fence) in held {
            if let Some(error) = table_down(&failing) {
                self.report.failed.push(format!(
                    "{key}: not released (not attempted: the lease table is failing: {error})"
                ));
                continue;
            }
            match self.args.table.release(&key, &fence).await {
                Ok(_) => {
                    failing = None;
                    self.moved_away(&key, LeaseMove::Released, None);
                    self.report_released(&key);
                }
                Err(error) => {
                    warn!(message = "Lease could not be released.", lease_key = %key, %error);
                    self.report
                        .failed
                        .push(format!("{key}: not released: {error}"));
                    if error.is_retryable() {
                        let n = failing.as_ref().map_or(0, |(n, _)| *n);
                        failing = Some((n + 1, error.to_string()));
                    }
                }
            }
        }
        if let Some(error) = table_down(&failing) {
            self.report.failed.push(format!(
                "leases owned by name and the heartbeat row {}: not checked (the lease table is failing: {error})",
                heartbeat_key(&self.args.me)
            ));
            return;
        }
        for key in std::mem::take(&mut self.requested).into_keys() {
            let _ = self.args.table.clear_handoff(&key, &self.args.me).await;
        }
        // A lease handed to this worker as it stopped is in no held set: find it by
        // name, so nobody waits a failover time for it.
        match self.args.table.scan().await {
            Ok(scan) => {
                let me = self.args.me.clone();
                for lease in scan
                    .leases
                    .iter()
                    .filter(|l| l.owner.as_ref() == Some(&me) && !l.checkpoint.is_shard_end())
                {
                    if let Err(error) = self.args.table.release(&lease.key, &lease.fence()).await {
                        self.report
                            .failed
                            .push(format!("{}: not released: {error}", lease.key));
                    } else {
                        self.moved_away(&lease.key, LeaseMove::Released, None);
                        self.report_released(&lease.key);
                    }
                }
            }
            Err(error) => self.report.failed.push(format!(
                "leases still owned by this worker by name: not checked: {error}"
            )),
        }
        if let Err(error) = self.args.table.remove_heartbeat(&self.args.me).await {
            warn!(message = "Heartbeat row could not be removed.", %error);
            self.report.failed.push(format!(
                "heartbeat row {}: not removed: {error}",
                heartbeat_key(&self.args.me)
            ));
        }
    }

    async fn start_drain(&mut self, myself: &ActorRef<KeeperMsg>) {
        let now = Instant::now();
        let settings = self.settings();
        // Peers notice the draining heartbeat at their next scan and ask at once; give
        // them two scans and a poll.
        let wait = settings.heartbeat_interval * 2 + settings.handoff_poll_interval;
        self.drain = Some(Drain {
            deadline: now + wait,
            done: false,
            table_failed: None,
        });
        // The shutdown report covers leaving, not the handoffs of the worker's life.
        self.report = ReleaseReport::default();
        for key in std::mem::take(&mut self.requested).into_keys() {
            let cleared = self.args.table.clear_handoff(&key, &self.args.me).await;
            self.wrote(&cleared);
        }
        self.heartbeat().await;
        info!(
            message = "Draining: handing leases to whoever asks.",
            held = self.held.len()
        );
        self.check_drained();
        self.arm_poll(myself);
    }

    /// A scan or heartbeat failed: while draining, nobody's request can be read, so
    /// the drain ends now rather than at its deadline.
    fn drain_table_failed(&mut self, error: &LeaseError) {
        if let Some(drain) = &mut self.drain {
            drain.table_failed.get_or_insert_with(|| error.to_string());
            self.check_drained();
        }
    }

    /// Tells the supervisor the drain is over once nothing is held but what nobody
    /// asked for in time, and no handoff is still in flight (or the table fails).
    fn check_drained(&mut self) {
        let Some(drain) = &mut self.drain else {
            return;
        };
        if drain.done {
            return;
        }
        let now = Instant::now();
        // Every peer is draining too (a whole fleet stopping): nobody will ask.
        let nobody_left = self
            .observations
            .members(
                &self.args.me,
                true,
                now,
                self.args.settings.lease.failover_time,
            )
            .is_empty();
        let verdict = pure::drain_verdict(DrainState {
            table_failed: drain.table_failed.is_some(),
            handoffs_in_flight: !self.handing_off.is_empty(),
            holds_nothing: self.held.is_empty(),
            nobody_left,
            past_deadline: now >= drain.deadline,
        });
        match verdict {
            DrainVerdict::Wait => return,
            DrainVerdict::TableFailed => {
                let error = drain.table_failed.as_deref().unwrap_or("unknown");
                warn!(message = "Drain ended early: the lease table is failing, so no peer can ask for leases.", %error);
            }
            DrainVerdict::Done => {}
        }
        drain.done = true;
        let _ = self.args.supervisor.cast(SupervisorMsg::DrainDone);
    }
}

/// Each worker's total records/s, as its heartbeat row says.
fn totals(heartbeats: &[Heartbeat]) -> BTreeMap<WorkerId, u64> {
    heartbeats
        .iter()
        .map(|h| (h.worker.clone(), h.load.records_per_second))
        .collect()
}
