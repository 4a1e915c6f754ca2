//! Keeps this worker alive in the lease table and decides which leases it holds.
//!
//! One heartbeat row per worker, bumped every `heartbeat_interval`, instead of renewing
//! every lease: lease-table writes grow with workers, not with shards. Each round it
//! scans the table, feeds what it saw to [`crate::balance`], takes what that says to take
//! (conditional on owner and counter) and reports gains and losses to the supervisor.
//!
//! The last confirmed heartbeat is published as [`Liveness`]: readers stop delivering
//! when it is older than `failover_time - fence_margin` (self-fencing), so no other worker
//! can take a lease while this one still processes it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::backend::{LeaseError, LeaseTable};
use crate::balance::{self, Limits, Observations};
use crate::metrics_reporter::{Metric, MetricsMsg, Sample};
use crate::model::{Fence, LeaseKey, WorkerId};
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
    /// The supervisor learned the lease is lost (a refused checkpoint) under this fence.
    Lost(LeaseKey, Fence),
    /// The shard reached SHARD_END under this fence; it no longer counts as held.
    Finished(LeaseKey, Fence),
    /// The shard failed too often here: release it and leave it alone for a while.
    GiveUp(LeaseKey),
    ReleaseAll(RpcReplyPort<ReleaseReport>),
    Status(RpcReplyPort<KeeperStatus>),
}

/// What releasing every lease at shutdown achieved.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReleaseReport {
    pub released: Vec<String>,
    pub failed: Vec<String>,
}

/// The lease keeper's view, for status pages.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KeeperStatus {
    pub held: Vec<String>,
    pub live_workers: Vec<String>,
    pub heartbeat_counter: u64,
    /// Milliseconds since the heartbeat was last written; `None` before the first.
    pub heartbeat_age_ms: Option<u64>,
    pub malformed_rows: Vec<String>,
    pub cooling: Vec<String>,
    /// Leases this worker gained, counted by how: `new` (never owned before), `released`
    /// (let go by its last owner), `expired` (its owner died), `handed_off` (given to
    /// this worker on request), `resumed` (already this worker's by name).
    pub gained: std::collections::BTreeMap<String, u64>,
    /// Leases this worker gave up, counted by why: `handed_off`, `released`,
    /// `shard_ended`, `lost` (taken by another worker or refused a write).
    pub given: std::collections::BTreeMap<String, u64>,
}

pub(crate) struct LeaseKeeper;

pub(crate) struct KeeperArgs {
    pub table: Arc<dyn LeaseTable>,
    pub me: WorkerId,
    pub settings: Arc<Settings>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub metrics: ActorRef<MetricsMsg>,
    pub liveness: Arc<watch::Sender<Option<Instant>>>,
}

pub(crate) struct KeeperState {
    args: KeeperArgs,
    held: HashMap<LeaseKey, Fence>,
    observations: Observations,
    cooling: HashMap<LeaseKey, Instant>,
    heartbeat_counter: u64,
    malformed: Vec<String>,
    stopping: bool,
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
        Ok(KeeperState {
            args,
            held: HashMap::new(),
            observations: Observations::new(),
            cooling: HashMap::new(),
            heartbeat_counter: 0,
            malformed: Vec::new(),
            stopping: false,
        })
    }

    async fn handle(
        &self,
        _myself: ActorRef<Self::Msg>,
        message: KeeperMsg,
        state: &mut KeeperState,
    ) -> Result<(), ActorProcessingErr> {
        match message {
            KeeperMsg::Tick => {
                if state.stopping {
                    return Ok(());
                }
                state.heartbeat().await;
                state.scan_and_take().await;
            }
            KeeperMsg::ScanNow => {
                if !state.stopping {
                    state.scan_and_take().await;
                }
            }
            // Both name the epoch they are about: news of an old epoch must not drop a
            // lease taken again since.
            KeeperMsg::Lost(key, fence) => {
                if state.held.get(&key) == Some(&fence) {
                    state.held.remove(&key);
                    state.report(vec![Sample::new(Metric::LeasesLost, 1.0)]);
                }
            }
            KeeperMsg::Finished(key, fence) => {
                if state.held.get(&key) == Some(&fence) {
                    state.held.remove(&key);
                }
            }
            KeeperMsg::GiveUp(key) => {
                let until = Instant::now() + state.args.settings.supervision.shard_cooldown;
                state.cooling.insert(key.clone(), until);
                if let Some(fence) = state.held.remove(&key) {
                    match state.args.table.release(&key, &fence).await {
                        Ok(_) => {
                            info!(message = "Lease released after repeated failures; cooling down.", lease_key = %key)
                        }
                        Err(error) => {
                            warn!(message = "Lease could not be released.", lease_key = %key, %error)
                        }
                    }
                }
            }
            KeeperMsg::ReleaseAll(reply) => {
                state.stopping = true;
                let mut report = ReleaseReport::default();
                let mut held: Vec<(LeaseKey, Fence)> = state.held.drain().collect();
                held.sort_by(|a, b| a.0.cmp(&b.0));
                for (key, fence) in held {
                    match state.args.table.release(&key, &fence).await {
                        Ok(_) => report.released.push(key.to_string()),
                        Err(error) => {
                            warn!(message = "Lease could not be released.", lease_key = %key, %error);
                            report.failed.push(format!("{key}: {error}"));
                        }
                    }
                }
                if let Err(error) = state.args.table.remove_heartbeat(&state.args.me).await {
                    warn!(message = "Heartbeat row could not be removed.", %error);
                }
                let _ = reply.send(report);
            }
            KeeperMsg::Status(reply) => {
                let now = Instant::now();
                let failover = state.args.settings.lease.failover_time;
                let mut held: Vec<String> = state.held.keys().map(|k| k.to_string()).collect();
                held.sort();
                let mut cooling: Vec<String> = state
                    .cooling
                    .iter()
                    .filter(|(_, until)| **until > now)
                    .map(|(k, _)| k.to_string())
                    .collect();
                cooling.sort();
                let _ = reply.send(KeeperStatus {
                    held,
                    live_workers: state
                        .observations
                        .alive(now, failover)
                        .into_iter()
                        .map(|w| w.to_string())
                        .collect(),
                    heartbeat_counter: state.heartbeat_counter,
                    heartbeat_age_ms: state
                        .args
                        .liveness
                        .borrow()
                        .map(|at| now.saturating_duration_since(at).as_millis() as u64),
                    malformed_rows: state.malformed.clone(),
                    cooling,
                    gained: Default::default(),
                    given: Default::default(),
                });
            }
        }
        Ok(())
    }
}

impl KeeperState {
    fn report(&self, samples: Vec<Sample>) {
        let _ = self.args.metrics.cast(MetricsMsg::Record(samples));
    }

    async fn heartbeat(&mut self) {
        let started = Instant::now();
        match self.args.table.heartbeat(&self.args.me).await {
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

    async fn scan_and_take(&mut self) {
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
        let cooling: HashSet<LeaseKey> = self.cooling.keys().cloned().collect();
        let limits = Limits {
            failover_time: self.args.settings.lease.failover_time,
            max_leases: self.args.settings.lease.max_leases as usize,
        };
        let decision = balance::decide(
            &scan.leases,
            &self.held,
            &self.observations,
            &self.args.me,
            now,
            &limits,
            &cooling,
        );
        for key in decision.lost {
            if let Some(fence) = self.held.remove(&key) {
                info!(message = "Lease lost to another worker.", lease_key = %key);
                self.report(vec![Sample::new(Metric::LeasesLost, 1.0)]);
                let _ = self
                    .args
                    .supervisor
                    .cast(SupervisorMsg::LeaseLost(key, fence));
            }
        }
        for (key, fence) in decision.take {
            match self.args.table.take(&key, &fence, &self.args.me).await {
                Ok(lease) => {
                    info!(message = "Lease taken.", lease_key = %key, previous_owner = ?fence.owner, counter = lease.counter);
                    self.held.insert(key, lease.fence());
                    self.report(vec![Sample::new(Metric::LeasesTaken, 1.0)]);
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
        self.report(vec![Sample::new(
            Metric::LeasesHeld,
            self.held.len() as f64,
        )]);
    }
}
