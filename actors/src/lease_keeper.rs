//! Keeps this worker alive in the lease table and decides which leases it holds.
//!
//! One heartbeat row per worker, bumped every `heartbeat_interval`, instead of renewing
//! every lease: lease-table writes grow with workers, not with shards. Each round it
//! scans the table, feeds what it saw to [`crate::balance`], and carries out the plan:
//! takes (conditional on owner and counter), handoff requests to live owners, handoffs
//! of its own leases that others asked for, and reports gains and losses to the
//! supervisor. Every movement is logged as a `lease_moved` event with its reason and
//! counted in metrics.
//!
//! A handoff in flight is polled every `handoff_poll_interval` (the requester reads
//! the row to start the moment it is its own; a draining worker scans for requests), so
//! a planned move costs a fraction of a second, not a heartbeat interval.
//!
//! The last confirmed heartbeat is published as [`Liveness`]: readers stop delivering
//! when it is older than `failover_time - fence_margin` (self-fencing), so no other worker
//! can take a lease while this one still processes it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::shard_reader::ShardShutdown;
use crate::status::{FleetLease, FleetLeaseState, FleetView, FleetWorker};

use crate::backend::{LeaseError, LeaseTable};
use crate::balance::{self, Decision, Gain, Limits, Observations, Peer, Round};
use crate::metrics_reporter::{Metric, MetricsMsg, Sample};
use crate::model::{Fence, Lease, LeaseKey, WorkerId, WorkerLoad};
use crate::settings::Settings;
use crate::supervisor::SupervisorMsg;

/// The time of this worker's last confirmed heartbeat, shared with its readers.
#[derive(Debug, Clone)]
pub(crate) struct Liveness(watch::Receiver<Option<Instant>>);

impl Liveness {
    pub fn channel() -> (watch::Sender<Option<Instant>>, Liveness) {
        let (tx, rx) = watch::channel(None);
        (tx, Liveness(rx))
    }

    pub fn confirmed_within(&self, limit: std::time::Duration) -> bool {
        match *self.0.borrow() {
            Some(at) => at.elapsed() < limit,
            None => false,
        }
    }
}

#[derive(Debug)]
pub(crate) enum KeeperMsg {
    Tick,
    /// Scan now (new lease rows were created).
    ScanNow,
    /// Follow the handoffs in flight (requests made, or a drain).
    PollHandoffs,
    /// The supervisor learned the lease is lost (a refused checkpoint) under this fence.
    Lost(LeaseKey, Fence),
    /// The shard reached SHARD_END under this fence; it no longer counts as held.
    Finished(LeaseKey, Fence),
    /// The shard failed too often here: release it and leave it alone for a while.
    GiveUp(LeaseKey),
    /// The shard's reader has stopped and its checkpoint is flushed: pass the lease on.
    Transfer {
        key: LeaseKey,
        fence: Fence,
        to: WorkerId,
        outcome: ShardShutdown,
    },
    /// The worker is shutting down: take nothing more, hand over whatever is asked for,
    /// and tell the supervisor (`DrainDone`) when nothing more will be asked.
    Drain,
    ReleaseAll(RpcReplyPort<ReleaseReport>),
    Status(RpcReplyPort<KeeperStatus>),
}

/// What leaving the fleet at shutdown achieved.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReleaseReport {
    /// Leases passed to a worker that asked for them, each at its final checkpoint.
    pub handed_off: Vec<String>,
    pub released: Vec<String>,
    pub failed: Vec<String>,
    /// How the processors of handed-off shards finished.
    #[serde(skip)]
    pub handed_off_shards: Vec<ShardShutdown>,
}

/// The lease keeper's view, for status pages.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KeeperStatus {
    pub held: Vec<String>,
    pub live_workers: Vec<String>,
    /// Every worker seen in the table, alive or not, with its last reported load.
    pub peers: Vec<Peer>,
    pub heartbeat_counter: u64,
    /// Milliseconds since the heartbeat was last written; `None` before the first.
    pub heartbeat_age_ms: Option<u64>,
    pub malformed_rows: Vec<String>,
    pub cooling: Vec<String>,
    /// Requests this worker made that are not answered yet.
    pub requested: Vec<String>,
    /// Held leases being handed over now.
    pub handing_off: Vec<String>,
    pub draining: bool,
    /// Leases this worker gained, counted by how: `new` (never owned before), `released`
    /// (let go by its last owner), `expired` (its owner died), `handed_off` (given to
    /// this worker on request), `resumed` (already this worker's by name).
    pub gained: BTreeMap<String, u64>,
    /// Leases this worker gave up, counted by why: `handed_off`, `released`,
    /// `shard_ended`, `lost` (taken by another worker or refused a write).
    pub given: BTreeMap<String, u64>,
}

pub(crate) struct LeaseKeeper;

pub(crate) struct KeeperArgs {
    pub table: Arc<dyn LeaseTable>,
    pub me: WorkerId,
    pub settings: Arc<Settings>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub metrics: ActorRef<MetricsMsg>,
    pub liveness: Arc<watch::Sender<Option<Instant>>>,
    /// Records delivered by this worker's readers, for the load in the heartbeat.
    pub delivered: Arc<AtomicU64>,
    pub lags: crate::status::LagBoard,
    /// Where each scan's view of the fleet is published, for the status endpoint.
    pub fleet: crate::status::FleetBoard,
    pub application: String,
    pub stream: String,
}

struct Drain {
    /// Past it, nobody is waited for: what is left is released.
    deadline: Instant,
    done: bool,
}

pub(crate) struct KeeperState {
    args: KeeperArgs,
    held: HashMap<LeaseKey, Fence>,
    observations: Observations,
    cooling: HashMap<LeaseKey, Instant>,
    heartbeat_counter: u64,
    malformed: Vec<String>,
    /// Requests made to other workers, with when they were first made.
    requested: HashMap<LeaseKey, Instant>,
    /// Held leases being handed over, to whom.
    handing_off: HashMap<LeaseKey, WorkerId>,
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
}

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
        Ok(KeeperState {
            args,
            held: HashMap::new(),
            observations: Observations::new(),
            cooling: HashMap::new(),
            heartbeat_counter: 0,
            malformed: Vec::new(),
            requested: HashMap::new(),
            handing_off: HashMap::new(),
            polling: false,
            deadline_scan: None,
            drain: None,
            stopped: false,
            report: ReleaseReport::default(),
            gained: BTreeMap::new(),
            given: BTreeMap::new(),
            last_rate: (delivered, Instant::now()),
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
                state.scan_and_act(&myself).await;
            }
            KeeperMsg::ScanNow => {
                if !state.stopped {
                    state.scan_and_act(&myself).await;
                }
            }
            KeeperMsg::PollHandoffs => {
                state.polling = false;
                if state.stopped {
                    return Ok(());
                }
                if state.drain.is_some() {
                    state.scan_and_act(&myself).await;
                } else {
                    state.poll_requests().await;
                }
                state.arm_poll(&myself);
            }
            // Both name the epoch they are about: news of an old epoch must not drop a
            // lease taken again since.
            KeeperMsg::Lost(key, fence) => {
                if state.held.get(&key) == Some(&fence) {
                    state.held.remove(&key);
                    state.moved_away(&key, "lost", None);
                }
            }
            KeeperMsg::Finished(key, fence) => {
                if state.held.get(&key) == Some(&fence) {
                    state.held.remove(&key);
                    state.moved_away(&key, "shard_ended", None);
                }
            }
            KeeperMsg::GiveUp(key) => {
                let until = Instant::now() + state.args.settings.supervision.shard_cooldown;
                state.cooling.insert(key.clone(), until);
                if let Some(fence) = state.held.remove(&key) {
                    match state.args.table.release(&key, &fence).await {
                        Ok(_) => {
                            info!(message = "Lease released after repeated failures; cooling down.", lease_key = %key);
                            state.moved_away(&key, "released", None);
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
                state.check_drained();
            }
            KeeperMsg::Drain => {
                state.start_drain(&myself).await;
            }
            KeeperMsg::ReleaseAll(reply) => {
                state.stopped = true;
                let mut held: Vec<(LeaseKey, Fence)> = state.held.drain().collect();
                held.sort_by(|a, b| a.0.cmp(&b.0));
                for (key, fence) in held {
                    match state.args.table.release(&key, &fence).await {
                        Ok(_) => {
                            state.moved_away(&key, "released", None);
                            state.report.released.push(key.to_string());
                        }
                        Err(error) => {
                            warn!(message = "Lease could not be released.", lease_key = %key, %error);
                            state.report.failed.push(format!("{key}: {error}"));
                        }
                    }
                }
                for key in std::mem::take(&mut state.requested).into_keys() {
                    let _ = state.args.table.clear_handoff(&key, &state.args.me).await;
                }
                // A lease handed to this worker as it stopped is in no held set: find
                // it by name, so nobody waits a failover time for it.
                if let Ok(scan) = state.args.table.scan().await {
                    let me = state.args.me.clone();
                    for lease in scan
                        .leases
                        .iter()
                        .filter(|l| l.owner.as_ref() == Some(&me) && !l.checkpoint.is_shard_end())
                    {
                        state.release_unheld(&lease.key, &lease.fence()).await;
                    }
                }
                if let Err(error) = state.args.table.remove_heartbeat(&state.args.me).await {
                    warn!(message = "Heartbeat row could not be removed.", %error);
                }
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
    fn report(&self, samples: Vec<Sample>) {
        let _ = self.args.metrics.cast(MetricsMsg::Record(samples));
    }

    fn settings(&self) -> &crate::settings::LeaseSettings {
        &self.args.settings.lease
    }

    fn status(&self) -> KeeperStatus {
        let now = Instant::now();
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
            heartbeat_age_ms: self
                .args
                .liveness
                .borrow()
                .map(|at| now.saturating_duration_since(at).as_millis() as u64),
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
    fn moved_here(&mut self, lease: &Lease, previous: &Fence, why: Gain) {
        info!(
            message = "Lease moved.",
            event = "lease_moved",
            reason = why.as_str(),
            lease_key = %lease.key,
            from = previous.owner.as_ref().map(|o| o.as_str()).unwrap_or("nobody"),
            to = %self.args.me,
            counter = lease.counter,
        );
        *self.gained.entry(why.as_str().to_owned()).or_default() += 1;
        let mut samples = vec![Sample::new(Metric::LeasesTaken, 1.0)];
        match why {
            Gain::Expired => samples.push(Sample::new(Metric::LeasesExpired, 1.0)),
            Gain::HandedOff => samples.push(Sample::new(Metric::LeasesStolen, 1.0)),
            _ => {}
        }
        self.report(samples);
    }

    /// A lease left this worker: one event, one count, one metric.
    fn moved_away(&mut self, key: &LeaseKey, why: &'static str, to: Option<&WorkerId>) {
        info!(
            message = "Lease moved.",
            event = "lease_moved",
            reason = why,
            lease_key = %key,
            from = %self.args.me,
            to = to.map(|w| w.as_str()).unwrap_or("nobody"),
        );
        *self.given.entry(why.to_owned()).or_default() += 1;
        let metric = match why {
            "handed_off" => Metric::LeasesHandedOff,
            "released" => Metric::LeasesReleased,
            "shard_ended" => Metric::LeasesEnded,
            _ => Metric::LeasesLost,
        };
        self.report(vec![Sample::new(metric, 1.0)]);
    }

    fn load(&mut self) -> WorkerLoad {
        let now = Instant::now();
        let delivered = self.args.delivered.load(Ordering::Relaxed);
        let (before, at) = self.last_rate;
        let secs = now.saturating_duration_since(at).as_secs_f64();
        let rate = if secs > 0.0 {
            (delivered.saturating_sub(before) as f64 / secs).round() as u64
        } else {
            0
        };
        self.last_rate = (delivered, now);
        let mut lag_ms = self.args.lags.snapshot();
        lag_ms.retain(|shard, _| self.held.contains_key(&LeaseKey::new(shard.as_str())));
        WorkerLoad {
            leases: self.held.len() as u64,
            records_per_second: rate,
            draining: self.drain.is_some(),
            lag_ms,
        }
    }

    async fn heartbeat(&mut self) {
        let started = Instant::now();
        let load = self.load();
        match self.args.table.heartbeat(&self.args.me, &load).await {
            Ok(counter) => {
                self.heartbeat_counter = counter;
                // Confirmed as of when the write was sent, not when it was answered: a
                // slow answer must not stretch the fencing window.
                let _ = self.args.liveness.send(Some(started));
            }
            Err(error) => {
                let metric = if matches!(error, LeaseError::Throttled { .. }) {
                    Metric::Throttles
                } else {
                    Metric::ApiErrors
                };
                self.report(vec![Sample::new(metric, 1.0)]);
                warn!(message = "Heartbeat not written.", worker_id = %self.args.me, %error);
            }
        }
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

    async fn scan_and_act(&mut self, myself: &ActorRef<KeeperMsg>) {
        let scan = match self.args.table.scan().await {
            Ok(scan) => scan,
            Err(error) => {
                warn!(message = "Lease table scan failed.", %error);
                return;
            }
        };
        for bad in &scan.malformed {
            let text = bad.to_string();
            if !self.malformed.contains(&text) {
                warn!(message = "Malformed lease row skipped.", row = %text);
                self.malformed.push(text);
            }
        }
        let now = Instant::now();
        self.cooling.retain(|_, until| *until > now);
        self.observations.observe(
            &scan.heartbeats,
            scan.leases.iter().filter_map(|l| l.owner.as_ref()),
            now,
        );
        self.observations
            .observe_leases(&scan.leases, now, self.settings().failover_time);
        let cooling: HashSet<LeaseKey> = self.cooling.keys().cloned().collect();
        let handing_off: HashSet<LeaseKey> = self.handing_off.keys().cloned().collect();
        let settings = self.settings();
        let limits = Limits {
            failover_time: settings.failover_time,
            max_leases: settings.max_leases as usize,
            max_moves_per_round: settings.max_moves_per_round as usize,
        };
        let decision = balance::decide(
            &Round {
                leases: &scan.leases,
                held: &self.held,
                observations: &self.observations,
                me: &self.args.me,
                now,
                cooling: &cooling,
                handing_off: &handing_off,
                draining: self.drain.is_some(),
            },
            &limits,
        );
        // Requests that are no longer ours to wait for: answered elsewhere, turned
        // down, or the row is gone.
        let by_key: HashMap<&LeaseKey, &Lease> = scan.leases.iter().map(|l| (&l.key, l)).collect();
        let me = self.args.me.clone();
        self.requested.retain(|key, _| {
            by_key.get(key).is_some_and(|l| {
                l.handoff_to.as_ref() == Some(&me) || l.owner.as_ref() == Some(&me)
            })
        });
        // Only the status endpoint reads it.
        if self.args.settings.status.enabled {
            let view = self.fleet_view(&scan.leases, &by_key, now);
            self.args.fleet.send_replace(Some(Arc::new((view, now))));
        }
        self.act(decision, &by_key).await;
        self.report(vec![Sample::new(
            Metric::LeasesHeld,
            self.held.len() as f64,
        )]);
        self.check_drained();
        self.arm_poll(myself);
        self.arm_deadline_scan(myself, &scan.leases, now);
    }

    /// Schedules a scan for the moment the first owner of leases would turn dead, so
    /// its leases move at the failover time rather than at the next heartbeat tick
    /// after it (which could add a whole interval to every failover).
    fn arm_deadline_scan(&mut self, myself: &ActorRef<KeeperMsg>, leases: &[Lease], now: Instant) {
        if self.deadline_scan.is_some_and(|at| at <= now) {
            self.deadline_scan = None;
        }
        let failover = self.settings().failover_time;
        let next = leases
            .iter()
            .filter(|l| !l.checkpoint.is_shard_end())
            .filter_map(|l| l.owner.as_ref())
            .filter(|o| **o != self.args.me)
            .filter_map(|o| self.observations.dead_at(o, failover))
            .filter(|at| *at > now)
            .min();
        let Some(next) = next else {
            return;
        };
        if self.deadline_scan.is_some_and(|pending| pending <= next) {
            return;
        }
        // Only worth it when it comes before the next regular scan.
        if next >= now + self.settings().heartbeat_interval {
            return;
        }
        self.deadline_scan = Some(next);
        myself.send_after(next - now + Duration::from_millis(1), || KeeperMsg::ScanNow);
    }

    async fn act(&mut self, decision: Decision, by_key: &HashMap<&LeaseKey, &Lease>) {
        for (key, fence) in decision.release {
            self.release_unheld(&key, &fence).await;
        }
        for key in decision.lost {
            if let Some(fence) = self.held.remove(&key) {
                let thief = by_key.get(&key).and_then(|l| l.owner.clone());
                warn!(message = "Lease lost to another worker.", lease_key = %key, owner = ?thief);
                self.moved_away(&key, "lost", thief.as_ref());
                self.handing_off.remove(&key);
                let _ = self
                    .args
                    .supervisor
                    .cast(SupervisorMsg::LeaseLost(key, fence));
            }
        }
        for (key, asker) in decision.turn_down {
            match self.args.table.clear_handoff(&key, &asker).await {
                Ok(()) => {
                    info!(message = "Handoff request turned down: the asker is dead or leaving.", lease_key = %key, asker = %asker)
                }
                Err(error) => {
                    debug!(message = "Stale handoff request not cleared.", lease_key = %key, %error)
                }
            }
        }
        for (key, fence, to) in decision.hand_off {
            info!(message = "Handing lease over on request.", lease_key = %key, to = %to);
            self.handing_off.insert(key.clone(), to.clone());
            let _ = self
                .args
                .supervisor
                .cast(SupervisorMsg::HandOff { key, fence, to });
        }
        for take in decision.take {
            let why = if take.why == Gain::Resumed && self.requested.contains_key(&take.key) {
                Gain::HandedOff
            } else {
                take.why
            };
            self.take(&take.key, &take.fence, why).await;
        }
        let now = Instant::now();
        for (key, fence) in decision.request {
            match self
                .args
                .table
                .request_handoff(&key, &fence, &self.args.me)
                .await
            {
                Ok(()) => {
                    info!(message = "Asked for a lease.", lease_key = %key, owner = ?fence.owner);
                    self.requested.entry(key).or_insert(now);
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

    /// The fleet as this scan shows it: workers with their liveness on this worker's
    /// clock, every lease with its state and its owner's last reported lag.
    fn fleet_view(
        &self,
        leases: &[Lease],
        by_key: &HashMap<&LeaseKey, &Lease>,
        now: Instant,
    ) -> FleetView {
        let failover = self.settings().failover_time;
        let obs = &self.observations;
        let mut view = FleetView {
            application: self.args.application.clone(),
            stream: self.args.stream.clone(),
            observer: self.args.me.to_string(),
            malformed_rows: self.malformed.clone(),
            ..FleetView::default()
        };
        let mut owned: HashMap<&WorkerId, u64> = HashMap::new();
        let mut sorted: Vec<&Lease> = leases.iter().collect();
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        for lease in sorted {
            let shard = lease.key.shard_id();
            let owner_alive = lease
                .owner
                .as_ref()
                .is_some_and(|o| obs.is_alive(o, now, failover));
            let state = if lease.checkpoint.is_shard_end() {
                FleetLeaseState::Finished
            } else if !balance::processable(lease, by_key) {
                FleetLeaseState::Blocked
            } else if !owner_alive {
                FleetLeaseState::Unassigned
            } else if lease.handoff_to.is_some() {
                FleetLeaseState::HandingOff
            } else {
                FleetLeaseState::Held
            };
            match state {
                FleetLeaseState::Unassigned => view.unassigned.push(lease.key.to_string()),
                FleetLeaseState::Blocked => view.blocked.push(lease.key.to_string()),
                _ => {}
            }
            if let Some(owner) = &lease.owner
                && !lease.checkpoint.is_shard_end()
            {
                *owned.entry(owner).or_default() += 1;
            }
            let lag = lease
                .owner
                .as_ref()
                .and_then(|o| obs.load_of(o))
                .and_then(|load| load.lag_ms.get(shard.as_str()).copied());
            view.leases.push(FleetLease {
                lease_key: lease.key.to_string(),
                shard_id: shard.to_string(),
                owner: lease.owner.as_ref().map(|o| o.to_string()),
                state,
                checkpoint: lease.checkpoint.to_string(),
                counter: lease.counter,
                handoff_to: lease.handoff_to.as_ref().map(|w| w.to_string()),
                parents: lease
                    .parent_shard_ids
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                children: lease
                    .child_shard_ids
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
                millis_behind_latest: lag.filter(|_| state != FleetLeaseState::Finished),
            });
        }
        view.workers = obs
            .peers(now, failover)
            .into_iter()
            .map(|peer| FleetWorker {
                leases: owned.get(&peer.worker).copied().unwrap_or(0),
                worker_id: peer.worker.to_string(),
                alive: peer.alive,
                draining: peer.load.draining,
                has_heartbeat: peer.has_heartbeat,
                records_per_second: peer.load.records_per_second,
                silent_ms: peer.silent_ms,
            })
            .collect();
        view
    }

    /// Lets go of a lease this worker owns by name but does not process.
    async fn release_unheld(&mut self, key: &LeaseKey, fence: &Fence) {
        match self.args.table.release(key, fence).await {
            Ok(_) => {
                self.moved_away(key, "released", None);
                self.report.released.push(key.to_string());
            }
            Err(error) => {
                debug!(message = "Lease owned by name not released.", lease_key = %key, %error)
            }
        }
    }

    async fn take(&mut self, key: &LeaseKey, fence: &Fence, why: Gain) {
        match self.args.table.take(key, fence, &self.args.me).await {
            Ok(lease) => {
                self.requested.remove(key);
                self.held.insert(key.clone(), lease.fence());
                self.moved_here(&lease, fence, why);
                let _ = self
                    .args
                    .supervisor
                    .cast(SupervisorMsg::LeaseGained(Box::new(lease)));
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
        let mut keys: Vec<(LeaseKey, Instant)> = self
            .requested
            .iter()
            .map(|(k, t)| (k.clone(), *t))
            .collect();
        keys.sort();
        for (key, since) in keys {
            match self.args.table.get(&key).await {
                Ok(Some(lease)) if lease.owner.as_ref() == Some(&self.args.me) => {
                    if !self.held.contains_key(&key) {
                        self.take(&key, &lease.fence(), Gain::HandedOff).await;
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
                        let _ = self.args.table.clear_handoff(&key, &self.args.me).await;
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
        self.held.remove(&key);
        match self.args.table.transfer(&key, &fence, &to).await {
            Ok(_) => {
                self.moved_away(&key, "handed_off", Some(&to));
                self.report.handed_off.push(key.to_string());
                self.report.handed_off_shards.push(outcome);
            }
            Err(error) => {
                // The asker withdrew, or the write failed: the shard's reader is
                // stopped, so let the lease go for whoever is next.
                warn!(message = "Lease not handed over; releasing it.", lease_key = %key, to = %to, %error);
                match self.args.table.release(&key, &fence).await {
                    Ok(_) => {
                        self.moved_away(&key, "released", None);
                        self.report.released.push(key.to_string());
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

    async fn start_drain(&mut self, myself: &ActorRef<KeeperMsg>) {
        let now = Instant::now();
        let settings = self.settings();
        // Peers notice the draining heartbeat at their next scan and ask at once; give
        // them two scans and a poll.
        let wait = settings.heartbeat_interval * 2 + settings.handoff_poll_interval;
        self.drain = Some(Drain {
            deadline: now + wait,
            done: false,
        });
        // The shutdown report covers leaving, not the handoffs of the worker's life.
        self.report = ReleaseReport::default();
        for key in std::mem::take(&mut self.requested).into_keys() {
            let _ = self.args.table.clear_handoff(&key, &self.args.me).await;
        }
        self.heartbeat().await;
        info!(
            message = "Draining: handing leases to whoever asks.",
            held = self.held.len()
        );
        self.check_drained();
        self.arm_poll(myself);
    }

    /// Tells the supervisor the drain is over once nothing is held but what nobody
    /// asked for in time, and no handoff is still in flight.
    fn check_drained(&mut self) {
        let Some(drain) = &mut self.drain else {
            return;
        };
        if drain.done || !self.handing_off.is_empty() {
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
        if self.held.is_empty() || nobody_left || now >= drain.deadline {
            drain.done = true;
            let _ = self.args.supervisor.cast(SupervisorMsg::DrainDone);
        }
    }
}
