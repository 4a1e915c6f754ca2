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
//! The keeper feeds [`Fencing`] (self-fencing): each confirmed or failed heartbeat, each
//! lease taken, each scan that shows a held lease still ours, and each lease found lost,
//! which is revoked there before the supervisor hears of it. Readers and processor hosts
//! consult it before every delivery, so no other worker can take a lease while this one
//! still processes it, whatever gap (a freeze, a partition) came in between.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::shard_reader::ShardShutdown;
use crate::status::{FleetLease, FleetLeaseState, FleetView, FleetWorker};

use crate::backend::{LeaseError, LeaseTable};
use crate::balance::{self, Decision, Gain, Limits, Observations, Peer, Round};
use crate::fencing::Fencing;
use crate::metrics_reporter::{Metric, MetricsMsg, Sample};
use crate::model::item::{MalformedRow, WORKER_KEY_PREFIX, heartbeat_key};
use crate::model::{Fence, Lease, LeaseKey, WorkerId, WorkerLoad};
use crate::settings::Settings;
use crate::supervisor::SupervisorMsg;

#[cfg(test)]
mod model;

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
    /// Milliseconds since the last confirmed heartbeat was sent; `None` before the first.
    pub heartbeat_age_ms: Option<u64>,
    /// Heartbeats that failed in a row since the last confirmed one, and the last error.
    pub heartbeat_failures: u32,
    pub heartbeat_error: Option<String>,
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
    /// `shard_ended`, `lost` (taken by another worker or refused a write),
    /// `unreadable` (its row can no longer be read).
    pub given: BTreeMap<String, u64>,
}

pub(crate) struct LeaseKeeper;

pub(crate) struct KeeperArgs {
    pub table: Arc<dyn LeaseTable>,
    pub me: WorkerId,
    pub settings: Arc<Settings>,
    pub supervisor: ActorRef<SupervisorMsg>,
    pub metrics: ActorRef<MetricsMsg>,
    /// Self-fencing: fed by every heartbeat, take, scan and loss.
    pub fencing: Fencing,
    /// Records delivered by this worker's readers, for the load in the heartbeat.
    pub delivered: Arc<AtomicU64>,
    pub lags: crate::status::LagBoard,
    /// Where each scan's view of the fleet is published, for the status endpoint.
    pub fleet: crate::status::FleetBoard,
    /// The stream watcher's last listing, to tell orphan rows.
    pub listing: crate::status::ListingBoard,
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
    /// When the unconfirmed heartbeat was last reported at ERROR (repeated every
    /// [`STALL_REPORT_EVERY`], not at every beat).
    stall_reported: Option<Instant>,
    /// When each lease row was first seen (send time of that scan), for orphans.
    first_seen: BTreeMap<LeaseKey, Instant>,
    /// The orphan rows last reported.
    orphans: BTreeSet<LeaseKey>,
    /// When a fresh shard listing was last asked for.
    listing_asked: Option<Instant>,
}

/// A handoff this worker asked for.
#[derive(Debug, Clone)]
struct Request {
    since: Instant,
    /// The owner asked, named as `from` when the lease arrives.
    of: Option<WorkerId>,
}

/// Lease rows nobody processes, by key, with why: for the fleet view.
struct Stalled<'a> {
    unreadable: &'a BTreeMap<LeaseKey, String>,
    orphans: &'a BTreeMap<LeaseKey, String>,
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
        Ok(KeeperState {
            args,
            held: BTreeMap::new(),
            observations: Observations::new(),
            cooling: BTreeMap::new(),
            heartbeat_counter: 0,
            malformed: Vec::new(),
            requested: BTreeMap::new(),
            handing_off: BTreeMap::new(),
            polling: false,
            deadline_scan: None,
            drain: None,
            stopped: false,
            report: ReleaseReport::default(),
            gained: BTreeMap::new(),
            given: BTreeMap::new(),
            last_rate: (delivered, Instant::now()),
            stall_reported: None,
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
                    state.revoke(&key, "a write under this lease was refused");
                    state.moved_away(&key, "lost", None);
                }
            }
            KeeperMsg::Finished(key, fence) => {
                if state.held.get(&key) == Some(&fence) {
                    state.let_go(&key);
                    state.moved_away(&key, "shard_ended", None);
                }
            }
            KeeperMsg::GiveUp(key) => {
                let until = Instant::now() + state.args.settings.supervision.shard_cooldown;
                state.cooling.insert(key.clone(), until);
                if let Some(fence) = state.let_go(&key) {
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

    /// The lease is not this worker's any more: revoked on the fencing board at once,
    /// so no batch is delivered from now on, whoever has been told yet.
    fn revoke(&mut self, key: &LeaseKey, why: &str) -> Option<Fence> {
        let fence = self.held.remove(key)?;
        self.args.fencing.lock().revoke(key, &fence, why);
        Some(fence)
    }

    fn report(&self, samples: Vec<Sample>) {
        let _ = self.args.metrics.cast(MetricsMsg::Record(samples));
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
        info!(
            message = "Lease moved.",
            event = "lease_moved",
            reason = why.as_str(),
            lease_key = %lease.key,
            from = from.map(|o| o.as_str()).unwrap_or("nobody"),
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
        let sent = Instant::now();
        let load = self.load();
        let result = self.args.table.heartbeat(&self.args.me, &load).await;
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
                let metric = Metric::failed_call(&error);
                let failures = fencing.heartbeat_failed(error.to_string());
                if let Some(drain) = &mut self.drain {
                    drain.table_failed.get_or_insert_with(|| error.to_string());
                }
                let stalled = unconfirmed_for.is_none_or(|d| d >= fence_time);
                let due = self
                    .stall_reported
                    .is_none_or(|at| at.elapsed() >= STALL_REPORT_EVERY);
                if stalled && due {
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
                self.report(vec![Sample::new(metric, 1.0)]);
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
        let sent = Instant::now();
        let scan = match self.args.table.scan().await {
            Ok(scan) => scan,
            Err(error) => {
                warn!(message = "Lease table scan failed.", %error);
                self.drain_table_failed(&error);
                return;
            }
        };
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
        let (orphans, unlisted) = self.find_orphans(&scan.leases, sent);
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
                if self.args.table.release(&lease.key, &fence).await.is_ok() {
                    self.moved_away(&lease.key, "released", None);
                }
            }
        }
        // The rest of the round sees neither orphans nor unreadable rows, nor rows the
        // last listing does not show yet (unless held): only a shard the stream is
        // known to have is dealt, taken or counted in anyone's share.
        let leases: Vec<Lease> = scan
            .leases
            .iter()
            .filter(|l| !orphans.contains_key(&l.key))
            .filter(|l| !unlisted.contains(&l.key) || self.held.contains_key(&l.key))
            .cloned()
            .collect();
        let now = Instant::now();
        self.cooling.retain(|_, until| *until > now);
        self.observations.observe(
            &scan.heartbeats,
            leases.iter().filter_map(|l| l.owner.as_ref()),
            now,
        );
        self.observations
            .observe_leases(&leases, now, self.settings().failover_time);
        let cooling: BTreeSet<LeaseKey> = self.cooling.keys().cloned().collect();
        let handing_off: BTreeSet<LeaseKey> = self.handing_off.keys().cloned().collect();
        let settings = self.settings();
        let limits = Limits {
            failover_time: settings.failover_time,
            max_leases: settings.max_leases as usize,
            max_moves_per_round: settings.max_moves_per_round as usize,
        };
        let decision = balance::decide(
            &Round {
                leases: &leases,
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
        let by_key: BTreeMap<&LeaseKey, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
        let me = self.args.me.clone();
        self.requested.retain(|key, _| {
            by_key.get(key).is_some_and(|l| {
                l.handoff_to.as_ref() == Some(&me) || l.owner.as_ref() == Some(&me)
            })
        });
        // Only the status endpoint reads it.
        if self.args.settings.status.enabled {
            let stalled = Stalled {
                unreadable: &unreadable,
                orphans: &orphans,
            };
            let view = self.fleet_view(&scan.leases, &by_key, &stalled, now);
            self.args.fleet.send_replace(Some(Arc::new((view, now))));
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

    async fn act(
        &mut self,
        decision: Decision,
        by_key: &BTreeMap<&LeaseKey, &Lease>,
        unreadable: &BTreeMap<LeaseKey, String>,
    ) {
        for (key, fence) in decision.release {
            self.release_unheld(&key, &fence).await;
        }
        for key in decision.lost {
            let row = by_key.get(&key);
            let unreadable = unreadable.get(&key);
            let why = match (row, unreadable) {
                (_, Some(bad)) => format!("its row is unreadable: {bad}"),
                (Some(l), None) => format!(
                    "the row names owner {} with counter {}",
                    l.owner.as_ref().map(|o| o.as_str()).unwrap_or("nobody"),
                    l.counter
                ),
                (None, None) => "its row was deleted".to_owned(),
            };
            // Revoked before anyone is told: no batch reaches a processor from here on.
            if let Some(fence) = self.revoke(&key, &why) {
                let thief = row.and_then(|l| l.owner.clone());
                match unreadable {
                    Some(bad) => error!(
                        message = "Lease row unreadable; the shard stops here until the row is repaired.",
                        lease_key = %key,
                        row = %bad,
                    ),
                    None => warn!(message = "Lease lost.", lease_key = %key, why = %why),
                }
                let reason = if unreadable.is_some() {
                    "unreadable"
                } else {
                    "lost"
                };
                self.moved_away(&key, reason, thief.as_ref());
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

    /// The fleet as this scan shows it: workers with their liveness on this worker's
    /// clock, every lease with its state and its owner's last reported lag.
    fn fleet_view(
        &self,
        leases: &[Lease],
        by_key: &BTreeMap<&LeaseKey, &Lease>,
        stalled: &Stalled<'_>,
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
        let mut owned: BTreeMap<&WorkerId, u64> = BTreeMap::new();
        let mut sorted: Vec<&Lease> = leases.iter().collect();
        sorted.sort_by(|a, b| a.key.cmp(&b.key));
        for lease in sorted {
            let shard = lease.key.shard_id();
            let owner_alive = lease
                .owner
                .as_ref()
                .is_some_and(|o| obs.is_alive(o, now, failover));
            let reason = stalled.orphans.get(&lease.key).cloned();
            let state = if lease.checkpoint.is_shard_end() {
                FleetLeaseState::Finished
            } else if reason.is_some() {
                FleetLeaseState::Stalled
            } else if !balance::processable(lease, by_key) {
                FleetLeaseState::Blocked
            } else if !owner_alive {
                FleetLeaseState::Unassigned
            } else if lease.handoff_to.is_some() {
                FleetLeaseState::HandingOff
            } else {
                FleetLeaseState::Held
            };
            match (state, &reason) {
                (FleetLeaseState::Unassigned, _) => view.unassigned.push(lease.key.to_string()),
                (FleetLeaseState::Blocked, _) => view.blocked.push(lease.key.to_string()),
                (FleetLeaseState::Stalled, Some(why)) => {
                    view.stalled.push(format!("{}: {why}", lease.key))
                }
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
                reason,
                checkpoint: Some(lease.checkpoint.to_string()),
                counter: Some(lease.counter),
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
        // Unreadable lease rows: in the listing of leases too, so every shard of the
        // table shows in exactly one state.
        for (key, why) in stalled.unreadable {
            let reason = format!("unreadable row: {why}");
            view.stalled.push(format!("{key}: {reason}"));
            view.leases.push(FleetLease {
                lease_key: key.to_string(),
                shard_id: key.shard_id().to_string(),
                owner: None,
                state: FleetLeaseState::Stalled,
                reason: Some(reason),
                checkpoint: None,
                counter: None,
                handoff_to: None,
                parents: Vec::new(),
                children: Vec::new(),
                millis_behind_latest: None,
            });
        }
        view.leases.sort_by(|a, b| a.lease_key.cmp(&b.lease_key));
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
        let sent = Instant::now();
        // From a dead owner, the take holds only while its heartbeat still stands where
        // this worker saw it stand still: a take sent just before the owner resumed must
        // not land after the owner re-read its rows (`lease_keeper/model.rs`).
        let expired_from = match (why, &fence.owner) {
            (Gain::Expired, Some(owner)) if *owner != self.args.me => Some(owner),
            _ => None,
        };
        let taken = match expired_from {
            Some(owner) => {
                let beat = self.observations.heartbeat_of(owner);
                self.args
                    .table
                    .take_expired(key, fence, &self.args.me, beat)
                    .await
            }
            None => self.args.table.take(key, fence, &self.args.me).await,
        };
        match taken {
            Ok(lease) => {
                // A lease handed over is taken from a row that already names this
                // worker: it came from the owner that was asked.
                let asked = self.requested.remove(key).and_then(|r| r.of);
                let from = match (&fence.owner, asked) {
                    (Some(owner), Some(asked)) if *owner == self.args.me => Some(asked),
                    (owner, _) => owner.clone(),
                };
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
        self.let_go(&key);
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
                    self.moved_away(&key, "released", None);
                    self.report.released.push(key.to_string());
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
                        self.moved_away(&lease.key, "released", None);
                        self.report.released.push(lease.key.to_string());
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
        if let Some(error) = &drain.table_failed {
            warn!(message = "Drain ended early: the lease table is failing, so no peer can ask for leases.", %error);
            drain.done = true;
            let _ = self.args.supervisor.cast(SupervisorMsg::DrainDone);
            return;
        }
        if !self.handing_off.is_empty() {
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
