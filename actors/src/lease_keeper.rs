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
//! The keeper feeds [`Fencing`] (self-fencing): each confirmed or failed heartbeat, each
//! lease taken, each scan that shows a held lease still ours, and each lease found lost,
//! which is revoked there before the supervisor hears of it. Readers and processor hosts
//! consult it before every delivery, so no other worker can take a lease while this one
//! still processes it, whatever gap (a freeze, a partition) came in between.
//!
//! This file is the actor: its messages, the order of a round, and the wiring (its
//! arguments, telemetry, the fencing board). The state is in parts, each with its own
//! fields and tests, none importing this file:
//! * `held`: the leases held and the ledger of their moves (changes, counts, report).
//! * `beat`: this worker's heartbeat row and its load.
//! * `round`: the round's cadence and what the last scan saw.
//! * `rows`: the rows bookkeeping (unreadable, orphan, former, dead and legacy rows,
//!   the roster).
//! * `act`: carrying out balance's `Decision`, and the moves in flight.
//! * `drain`: the graceful drain at shutdown, and leaving the fleet.
//! * `ports`: what a part reaches outside itself (table, fencing, an outbox).
//! * `scaling`: the fleet's recommended worker count, published each round (and on
//!   the fleet board, for `/fleet`).
//!
//! Below them: `pure` (the decisions, with table tests), `legacy` (the older version's
//! rows), and `model` (a stateright model of the protocol, tests only).

use std::collections::BTreeMap;
use std::sync::Arc;

use ractor::{Actor, ActorProcessingErr, ActorRef};
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::backend::LeaseError;
use crate::balance::{Limits, Observations};
use crate::model::{Lease, LeaseKey};
use crate::protocol::KeeperMsg;
use crate::status::{FleetScan, KeeperStatus, fleet_view};
use crate::telemetry::{Metric, Sample};
use pure::ScanWhy;

mod act;
mod beat;
mod drain;
mod held;
mod legacy;
#[cfg(test)]
mod model;
mod ports;
mod pure;
mod round;
mod rows;
mod scaling;

use act::{Context, Moves};
use beat::{Beat, Load};
use drain::Leaving;
use held::Holdings;
pub(crate) use ports::KeeperArgs;
use round::{LastScan, Rounds, Seen};
use rows::{Judged, Rows};
use scaling::Scaling;

pub(crate) struct LeaseKeeper;

pub(crate) struct KeeperState {
    args: KeeperArgs,
    held: Holdings,
    /// Every worker's heartbeat and every lease's owner as seen on this worker's clock.
    observations: Observations,
    beat: Beat,
    rounds: Rounds,
    moves: Moves,
    rows: Rows,
    leaving: Leaving,
    /// The fleet's recommended worker count (`scaling`).
    scaling: Scaling,
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
        let delivered = args.lags.delivered_total();
        let observations = Observations::with_java_compat(args.settings.lease.java_compat);
        Ok(KeeperState {
            args,
            held: Holdings::default(),
            observations,
            beat: Beat::new(delivered, Instant::now()),
            rounds: Rounds::default(),
            moves: Moves::default(),
            rows: Rows::default(),
            leaving: Leaving::default(),
            scaling: Scaling::default(),
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<Self::Msg>,
        message: KeeperMsg,
        state: &mut KeeperState,
    ) -> Result<(), ActorProcessingErr> {
        let stopped = state.leaving.stopped;
        match message {
            KeeperMsg::Tick => {
                if stopped {
                    return Ok(());
                }
                state.heartbeat().await;
                state.round(&myself).await;
            }
            KeeperMsg::FormerDue => {
                state.rows.former_due_fired();
                if !stopped {
                    state.rounds.asked = true;
                    state.round(&myself).await;
                }
            }
            KeeperMsg::Retired {
                key,
                fence,
                outcome,
            } => {
                let ports = state.args.ports();
                state
                    .rows
                    .retired(&ports, &mut state.held, key, fence, outcome)
                    .await;
                state.publish_changes().await;
            }
            KeeperMsg::ScanNow => {
                if !stopped {
                    // The watcher made rows (or has the listing the keeper waits
                    // for): peers must hear of it too.
                    state.rounds.asked = true;
                    state.held.changed();
                    state.held.urgent = true;
                    state.round(&myself).await;
                }
            }
            KeeperMsg::Deadline => {
                if !stopped {
                    state.round(&myself).await;
                }
            }
            KeeperMsg::PollHandoffs => {
                state.rounds.polled();
                if stopped {
                    return Ok(());
                }
                if state.leaving.draining() {
                    state.round(&myself).await;
                } else {
                    let ports = state.args.ports();
                    state
                        .moves
                        .poll_requests(&ports, &mut state.held, &state.observations)
                        .await;
                    state.publish_changes().await;
                }
                state.arm_poll(&myself);
            }
            // Both name the epoch they are about: news of an old epoch must not drop a
            // lease taken again since.
            KeeperMsg::Lost(key, fence) => state.held.lost(&state.args.ports(), &key, &fence),
            KeeperMsg::Finished(key, fence) => {
                state.held.finished(&state.args.ports(), &key, &fence)
            }
            KeeperMsg::GiveUp(key) => {
                let ports = state.args.ports();
                state.moves.give_up(&ports, &mut state.held, key).await;
            }
            KeeperMsg::Transfer {
                key,
                fence,
                to,
                outcome,
            } => {
                let ports = state.args.ports();
                state
                    .moves
                    .transfer(&ports, &mut state.held, key, fence, to, outcome)
                    .await;
                state.publish_changes().await;
                state.check_drained();
            }
            KeeperMsg::Drain => {
                state.start_drain(&myself).await;
            }
            KeeperMsg::ReleaseAll(reply) => {
                let ports = state.args.ports();
                state
                    .leaving
                    .release_all(&ports, &mut state.held, &mut state.moves.requested)
                    .await;
                let _ = reply.send(std::mem::take(&mut state.held.report));
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
    fn settings(&self) -> &crate::settings::LeaseSettings {
        &self.args.settings.lease
    }

    /// What this worker observes now, for the round's decisions.
    fn seen(&self, now: Instant) -> Seen<'_> {
        Seen {
            observations: &self.observations,
            me: &self.args.me,
            now,
            failover: self.settings().failover_time,
        }
    }

    fn status(&self) -> KeeperStatus {
        let now = Instant::now();
        let fencing = self.args.fencing.lock();
        let failover = self.settings().failover_time;
        KeeperStatus {
            held: sorted(self.held.held.keys()),
            live_workers: self
                .observations
                .alive(now, failover)
                .into_iter()
                .map(|w| w.to_string())
                .collect(),
            peers: self.observations.peers(now, failover),
            heartbeat_counter: self.beat.counter,
            heartbeat_age_ms: fencing
                .last_confirmed()
                .map(|at| now.saturating_duration_since(at).as_millis() as u64),
            heartbeat_failures: fencing.failures().0,
            heartbeat_error: fencing.failures().1.map(str::to_owned),
            malformed_rows: self.rows.malformed.clone(),
            cooling: sorted(
                self.moves
                    .cooling
                    .iter()
                    .filter(|(_, until)| **until > now)
                    .map(|(k, _)| k),
            ),
            requested: sorted(self.moves.requested.keys()),
            handing_off: sorted(self.moves.handing_off.keys()),
            draining: self.leaving.draining(),
            gained: self.held.gained.clone(),
            given: self.held.given.clone(),
        }
    }

    /// Writes the heartbeat now if an urgent change is not in it yet (`Beat::publish_due`).
    async fn publish_changes(&mut self) {
        if self.beat.publish_due(&mut self.held, self.leaving.stopped) {
            self.heartbeat().await;
        }
    }

    async fn heartbeat(&mut self) {
        let ports = self.args.ports();
        let load = Load {
            lags: &self.args.lags,
            draining: self.leaving.draining(),
        };
        match self.beat.write(&ports, &self.held, &load).await {
            Ok(()) => {}
            Err(error @ LeaseError::NotFound { .. }) => self.table_gone(&error),
            Err(error) => {
                self.leaving.table_failed(&error);
            }
        }
    }

    /// The lease table is gone (`Leaving::table_gone`).
    fn table_gone(&mut self, error: &LeaseError) {
        let ports = self.args.ports();
        let in_flight = !self.moves.handing_off.is_empty();
        let holds_nothing = self.held.held.is_empty();
        (self.leaving).table_gone(&ports, error, &self.observations, in_flight, holds_nothing);
    }

    /// A scan or heartbeat failed: while draining, nobody's request can be read, so
    /// the drain ends now rather than at its deadline.
    fn drain_table_failed(&mut self, error: &LeaseError) {
        if self.leaving.table_failed(error) {
            self.check_drained();
        }
    }

    fn check_drained(&mut self) {
        let ports = self.args.ports();
        self.leaving.check_drained(
            &ports,
            &self.observations,
            !self.moves.handing_off.is_empty(),
            self.held.held.is_empty(),
        );
    }

    fn arm_poll(&mut self, myself: &ActorRef<KeeperMsg>) {
        let waiting = !self.moves.requested.is_empty() || self.leaving.waiting();
        if self.rounds.arm_poll(waiting, self.leaving.stopped) {
            myself.send_after(self.settings().handoff_poll_interval, || {
                KeeperMsg::PollHandoffs
            });
        }
    }

    /// One round: reads the heartbeat rows, and every row only when `pure::scan_due`
    /// says something changed (or may have); then acts, publishes the fleet view, and
    /// arms the deadline. Rows read by a scan serve the rounds after it until the next.
    async fn round(&mut self, myself: &ActorRef<KeeperMsg>) {
        let sent = Instant::now();
        let failover = self.settings().failover_time;
        let detail = self.rounds.detail(
            &Limits::from_settings(self.settings()).policy,
            sent,
            failover,
            self.args.fleet.take_wanted(),
        );
        let read = self.args.table.heartbeats(detail).await;
        let now = Instant::now();
        let heartbeats_read = match read {
            Ok(mut out) => {
                self.rounds.heard(&mut out, sent, &self.observations);
                let ports = self.args.ports();
                self.rows
                    .roster_read(&ports, out.roster, &out.legacy, now)
                    .await;
                self.rounds
                    .observe(&mut self.observations, &out.heartbeats, now, failover);
                true
            }
            Err(error) => {
                // An older policy without BatchGetItem, say: every round scans, as
                // before this read existed.
                warn!(message = "Heartbeat rows not read; scanning the table instead.", %error);
                false
            }
        };
        let why = if heartbeats_read {
            let awaiting_reread = self.args.fencing.lock().awaiting_reread();
            let dealt = self.rounds.last_dealt();
            let would_move = dealt.is_some_and(|d| self.moves.would_move(d, &self.context(), now));
            self.rounds.scan_why(
                &self.seen(now),
                self.held.changes,
                awaiting_reread,
                self.moves.cooled(now),
                would_move,
                self.settings(),
            )
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
        let ports = self.args.ports();
        let draining = self.leaving.draining();
        let dealt = self.rounds.last_dealt();
        let judged = (self.scaling).round(&ports, &self.observations, dealt, draining, now);
        self.args.fleet.judged(judged, now);
        self.rows
            .remove_dead_rows(&ports, &self.observations, draining, now)
            .await;
        if self
            .rows
            .retire_legacy_rows(&ports, &self.observations, draining, now)
            .await
        {
            // A scan confirms nothing was left behind.
            self.rounds.asked = true;
        }
        self.publish_changes().await;
    }

    /// What a decision is taken over, besides the rows.
    fn context(&self) -> Context<'_> {
        Context {
            held: &self.held.held,
            observations: &self.observations,
            me: &self.args.me,
            retiring: &self.rows.retiring,
            draining: self.leaving.draining(),
            limits: Limits::from_settings(self.settings()),
        }
    }

    /// A round with nothing changed: the last scan's rows stand; only the heartbeats
    /// are new, so the fleet view is published again with them, and the deadline of the
    /// next owner to turn dead re-armed.
    fn quiet_round(&mut self, myself: &ActorRef<KeeperMsg>, now: Instant) {
        let Some(last) = self.rounds.take_last() else {
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
        self.rounds.restore(last);
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
            malformed: &self.rows.malformed,
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

    async fn scan_and_act(&mut self, myself: &ActorRef<KeeperMsg>) {
        let sent = Instant::now();
        // What this scan covers: changes made before it, and the watcher's request.
        let changes_before = self.held.changes;
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
        self.rounds.scanned(sent, changes_before, &scan.heartbeats);
        let ports = self.args.ports();
        self.rows
            .scanned(&ports, &scan.heartbeats, &scan.legacy)
            .await;
        self.held.reconfirm(&scan.leases, ports.fencing, sent);
        let set = self.args.set.borrow().clone();
        let judged = Judged {
            listing: self.args.listing.borrow().clone(),
            set: &set,
            stream: &self.args.stream,
        };
        let triage = self
            .rows
            .triage(
                &ports,
                &mut self.held,
                &self.observations,
                (&scan.leases, &scan.malformed, sent),
                &judged,
                |after| {
                    myself.send_after(after, || KeeperMsg::FormerDue);
                },
            )
            .await;
        let (unreadable, orphans, leases) = (triage.unreadable, triage.orphans, triage.dealt);
        let now = Instant::now();
        self.moves.end_cooldowns(now);
        self.observations.observe(
            &scan.heartbeats,
            leases.iter().filter_map(|l| l.owner.as_ref()),
            now,
        );
        self.observations.observe_lease_counters(&leases, now);
        self.observations
            .observe_leases(&leases, now, self.settings().failover_time);
        let decision = self.moves.decide(&leases, &self.context(), now);
        let by_key: BTreeMap<&LeaseKey, &Lease> = leases.iter().map(|l| (&l.key, l)).collect();
        // Requests that are no longer ours to wait for.
        self.moves.forget_answered(&by_key, &self.args.me);
        // Only the status endpoint reads it.
        if self.args.settings.status.enabled {
            self.publish_view(&scan.leases, &by_key, &unreadable, &orphans, now);
        }
        let ports = self.args.ports();
        self.moves
            .act(
                &ports,
                &mut self.held,
                &self.observations,
                decision,
                &by_key,
                &unreadable,
            )
            .await;
        self.args.telemetry.record(vec![
            Sample::new(Metric::LeasesHeld, self.held.held.len() as f64),
            Sample::new(Metric::LeasesUnreadable, unreadable.len() as f64),
            Sample::new(Metric::LeasesOrphaned, orphans.len() as f64),
        ]);
        self.check_drained();
        self.arm_poll(myself);
        self.arm_deadline_scan(myself, &leases, now);
        let all = Arc::new(scan.leases);
        self.args.rows.send_replace(Some(all.clone()));
        let last = LastScan {
            sent,
            leases: all,
            dealt: leases,
            unreadable,
            orphans,
        };
        // What the rounds until the next scan compare against.
        let seen = Seen {
            observations: &self.observations,
            me: &self.args.me,
            now,
            failover: self.args.settings.lease.failover_time,
        };
        self.rounds.settle(&seen, last);
    }

    /// Schedules a scan for the moment the first owner of leases would turn dead
    /// (`Rounds::arm_deadline`).
    fn arm_deadline_scan(&mut self, myself: &ActorRef<KeeperMsg>, leases: &[Lease], now: Instant) {
        let interval = self.args.settings.lease.heartbeat_interval;
        let seen = Seen {
            observations: &self.observations,
            me: &self.args.me,
            now,
            failover: self.args.settings.lease.failover_time,
        };
        if let Some(after) = self.rounds.arm_deadline(leases, &seen, interval) {
            myself.send_after(after, || KeeperMsg::Deadline);
        }
    }

    async fn start_drain(&mut self, myself: &ActorRef<KeeperMsg>) {
        let settings = self.settings();
        // Peers notice the draining heartbeat at their next scan and ask at once; give
        // them two scans and a poll.
        let wait = settings.heartbeat_interval * 2 + settings.handoff_poll_interval;
        self.leaving.start(Instant::now(), wait);
        // The shutdown report covers leaving, not the handoffs of the worker's life.
        self.held.report = Default::default();
        let ports = self.args.ports();
        self.moves.withdraw_requests(&ports, &mut self.held).await;
        self.heartbeat().await;
        info!(
            message = "Draining: handing leases to whoever asks.",
            held = self.held.held.len()
        );
        self.check_drained();
        self.arm_poll(myself);
    }
}
