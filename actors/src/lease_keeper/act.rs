//! Carrying out [`crate::balance`]'s `Decision`: takes (conditional on owner and
//! counter; from a dead owner, also on its heartbeat standing still), handoff requests
//! to live owners, handoffs of this worker's leases that others asked for, turn-downs,
//! releases and losses, in the order `pure::actions` gives. A handoff in flight is
//! polled every `handoff_poll_interval` (the requester reads the row to start the
//! moment it is its own), so a planned move costs a fraction of a second, not a
//! heartbeat interval. This part owns what those moves leave in flight: the requests
//! made, the leases being handed over, and the leases cooling down after a give-up.

use std::collections::{BTreeMap, BTreeSet};

use tokio::time::Instant;
use tracing::{debug, error, info, warn};

use crate::backend::LeaseError;
use crate::balance::{self, Decision, Gain, Limits, Observations, Policy, Round};
use crate::model::{Fence, Lease, LeaseKey, WorkerId};
use crate::protocol::{LeaseMove, SupervisorMsg};
use crate::status::ShardShutdown;

use super::held::Holdings;
use super::ports::Ports;
use super::pure::{self, Action};

/// A handoff this worker asked for.
#[derive(Debug, Clone)]
pub(super) struct Request {
    pub since: Instant,
    /// The owner asked, named as `from` when the lease arrives.
    pub of: Option<WorkerId>,
}

/// The moves in flight.
#[derive(Default)]
pub(super) struct Moves {
    /// Requests made to other workers: when each was first made, and of whom.
    pub requested: BTreeMap<LeaseKey, Request>,
    /// Held leases being handed over, to whom.
    pub handing_off: BTreeMap<LeaseKey, WorkerId>,
    /// Leases given up on after repeated failures, left to others until then.
    pub cooling: BTreeMap<LeaseKey, Instant>,
}

/// What a decision is taken over, besides the rows.
pub(super) struct Context<'a> {
    pub held: &'a BTreeMap<LeaseKey, Fence>,
    pub observations: &'a Observations,
    pub me: &'a WorkerId,
    /// Held leases of former streams being retired: released, never handed to anyone.
    pub retiring: &'a BTreeSet<LeaseKey>,
    pub draining: bool,
    pub limits: Limits,
}

impl Moves {
    /// `balance::decide` on `leases` with what this worker observes now.
    pub fn decide(&self, leases: &[Lease], cx: &Context<'_>, now: Instant) -> Decision {
        let cooling: BTreeSet<LeaseKey> = self.cooling.keys().cloned().collect();
        // A lease being retired is not handed to anyone who asks: it is released.
        let handing_off: BTreeSet<LeaseKey> = self
            .handing_off
            .keys()
            .chain(cx.retiring)
            .cloned()
            .collect();
        balance::decide(
            &Round {
                leases,
                held: cx.held,
                observations: cx.observations,
                me: cx.me,
                now,
                cooling: &cooling,
                handing_off: &handing_off,
                draining: cx.draining,
            },
            &cx.limits,
        )
    }

    /// Whether the last scan's rows (`dealt`), judged with the heartbeats just read,
    /// would make this worker take or ask for a lease. Nothing that changes ownership
    /// has happened since that scan (else `scan_due` scans anyway), so what can differ
    /// is the rates peers publish: throughput balance reacts to them without an
    /// ownership change.
    pub fn would_move(&self, dealt: &[Lease], cx: &Context<'_>, now: Instant) -> bool {
        if !matches!(cx.limits.policy, Policy::Throughput(_)) {
            return false;
        }
        let decision = self.decide(dealt, cx, now);
        !decision.take.is_empty() || !decision.request.is_empty()
    }

    /// Whether a cooldown has ended: the lease may be taken again.
    pub fn cooled(&self, now: Instant) -> bool {
        self.cooling.values().any(|until| *until <= now)
    }

    /// Drops the cooldowns that have ended by `now` (before a decision: those leases
    /// may be taken again).
    pub fn end_cooldowns(&mut self, now: Instant) {
        self.cooling.retain(|_, until| *until > now);
    }

    /// Drops the requests a scan's rows (`by_key`) show are no longer ours to wait for:
    /// answered elsewhere, turned down, or the row is gone.
    pub fn forget_answered(&mut self, by_key: &BTreeMap<&LeaseKey, &Lease>, me: &WorkerId) {
        self.requested
            .retain(|key, _| pure::request_open(by_key.get(key).copied(), me));
    }

    /// Does what the round decided, in the order `pure::actions` gives.
    pub async fn act(
        &mut self,
        ports: &Ports<'_>,
        held: &mut Holdings,
        observations: &Observations,
        decision: Decision,
        by_key: &BTreeMap<&LeaseKey, &Lease>,
        unreadable: &BTreeMap<LeaseKey, String>,
    ) {
        let requested: BTreeSet<LeaseKey> = self.requested.keys().cloned().collect();
        let now = Instant::now();
        for action in pure::actions(decision, by_key, unreadable, &requested, ports.me) {
            match action {
                Action::Release { key, fence } => held.release_unheld(ports, &key, &fence).await,
                Action::Revoke {
                    key,
                    why,
                    reason,
                    to,
                    unreadable,
                } => {
                    // Revoked before anyone is told: no batch reaches a processor from
                    // here on.
                    let Some(fence) = held.revoke(&key, &why, ports.fencing) else {
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
                    held.moved_away(ports, &key, reason, to.as_ref());
                    self.handing_off.remove(&key);
                    ports.out.tell(SupervisorMsg::LeaseLost(key, fence));
                }
                Action::TurnDown { key, asker } => {
                    let cleared = ports.table.clear_handoff(&key, &asker).await;
                    held.wrote(&cleared);
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
                    ports.out.tell(SupervisorMsg::HandOff { key, fence, to });
                }
                Action::Take {
                    key,
                    fence,
                    why,
                    expired_from,
                } => {
                    self.take(ports, held, observations, &key, &fence, why, expired_from)
                        .await
                }
                Action::Request { key, fence } => {
                    let asked = ports.table.request_handoff(&key, &fence, ports.me).await;
                    held.wrote(&asked);
                    match asked {
                        Ok(()) => {
                            held.urgent = true;
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

    /// Takes a lease. From a dead owner (`expired_from`, `pure::expired_from`), the take
    /// holds only while its heartbeat still stands where this worker saw it stand still.
    #[allow(clippy::too_many_arguments)]
    async fn take(
        &mut self,
        ports: &Ports<'_>,
        held: &mut Holdings,
        observations: &Observations,
        key: &LeaseKey,
        fence: &Fence,
        why: Gain,
        expired_from: Option<WorkerId>,
    ) {
        let sent = Instant::now();
        let taken = match &expired_from {
            Some(owner) => {
                let beat = observations.heartbeat_of(owner);
                ports.table.take_expired(key, fence, ports.me, beat).await
            }
            None => ports.table.take(key, fence, ports.me).await,
        };
        held.wrote(&taken);
        match taken {
            Ok(lease) => {
                // A lease handed over is taken from a row that already names this
                // worker: it came from the owner that was asked.
                let asked = self.requested.remove(key).and_then(|r| r.of);
                let from = pure::gained_from(fence, asked, ports.me);
                held.held.insert(key.clone(), lease.fence());
                ports.fencing.lock().hold(key, &lease.fence(), sent);
                held.moved_here(ports, &lease, from.as_ref(), why);
                ports.out.tell(SupervisorMsg::LeaseGained(Box::new(lease)));
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
    pub async fn poll_requests(
        &mut self,
        ports: &Ports<'_>,
        held: &mut Holdings,
        observations: &Observations,
    ) {
        let timeout = ports.lease().handoff_timeout;
        // In key order (a BTreeMap).
        let keys: Vec<(LeaseKey, Instant)> = self
            .requested
            .iter()
            .map(|(k, r)| (k.clone(), r.since))
            .collect();
        for (key, since) in keys {
            match ports.table.get(&key).await {
                Ok(Some(lease)) if lease.owner.as_ref() == Some(ports.me) => {
                    if !held.held.contains_key(&key) {
                        self.take(
                            ports,
                            held,
                            observations,
                            &key,
                            &lease.fence(),
                            Gain::HandedOff,
                            None,
                        )
                        .await;
                    }
                    self.requested.remove(&key);
                }
                Ok(Some(lease)) if lease.handoff_to.as_ref() != Some(ports.me) => {
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
                        let cleared = ports.table.clear_handoff(&key, ports.me).await;
                        held.wrote(&cleared);
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

    /// Withdraws every request (a drain starts: this worker takes nothing more).
    pub async fn withdraw_requests(&mut self, ports: &Ports<'_>, held: &mut Holdings) {
        for key in std::mem::take(&mut self.requested).into_keys() {
            let cleared = ports.table.clear_handoff(&key, ports.me).await;
            held.wrote(&cleared);
        }
    }

    /// The supervisor gave up on a lease after repeated failures: it cools down here
    /// (left to others) and is released.
    pub async fn give_up(&mut self, ports: &Ports<'_>, held: &mut Holdings, key: LeaseKey) {
        let until = Instant::now() + ports.settings.supervision.shard_cooldown;
        self.cooling.insert(key.clone(), until);
        if let Some(fence) = held.let_go(&key, ports.fencing) {
            held.changed();
            match ports.table.release(&key, &fence).await {
                Ok(_) => {
                    info!(message = "Lease released after repeated failures; cooling down.", lease_key = %key);
                    held.moved_away(ports, &key, LeaseMove::Released, None);
                }
                Err(error) => {
                    warn!(message = "Lease could not be released.", lease_key = %key, %error)
                }
            }
        }
    }

    /// A lease being handed over has stopped: its row is passed to `to` (or, refused,
    /// released for whoever is next).
    pub async fn transfer(
        &mut self,
        ports: &Ports<'_>,
        held: &mut Holdings,
        key: LeaseKey,
        fence: Fence,
        to: WorkerId,
        outcome: ShardShutdown,
    ) {
        self.handing_off.remove(&key);
        if !held.holds(&key, &fence) {
            return;
        }
        held.let_go(&key, ports.fencing);
        let transferred = ports.table.transfer(&key, &fence, &to).await;
        held.wrote(&transferred);
        match transferred {
            Ok(_) => {
                held.moved_away(ports, &key, LeaseMove::HandedOff, Some(&to));
                held.report.handed_off.push(key.to_string());
                held.report.handed_off_shards.push(outcome);
            }
            Err(error) => {
                // The asker withdrew, or the write failed: the shard's reader is
                // stopped, so let the lease go for whoever is next.
                warn!(message = "Lease not handed over; releasing it.", lease_key = %key, to = %to, %error);
                let released = ports.table.release(&key, &fence).await;
                held.wrote(&released);
                match released {
                    Ok(_) => {
                        held.moved_away(ports, &key, LeaseMove::Released, None);
                        held.report_released(&key);
                        held.report.handed_off_shards.push(outcome);
                    }
                    Err(error) => {
                        warn!(message = "Lease could not be released.", lease_key = %key, %error);
                        held.report.failed.push(format!("{key}: {error}"));
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LeaseTable;
    use crate::lease_keeper::ports::testing::Rig;

    /// A requested lease is taken the moment its owner hands it over, named as from
    /// the owner asked, and the request is closed.
    #[tokio::test(start_paused = true)]
    async fn a_lease_handed_over_is_taken_at_the_next_poll() {
        let a = Rig::new("a").await;
        let b = Rig::on(a.table.clone(), "b");
        let row = a.row(0).await;
        let owned = b.table.take(&row.key, &row.fence(), &b.me).await.unwrap();
        a.table
            .request_handoff(&row.key, &owned.fence(), &a.me)
            .await
            .unwrap();
        let mut moves = Moves::default();
        moves.requested.insert(
            row.key.clone(),
            Request {
                since: Instant::now(),
                of: Some(b.me.clone()),
            },
        );
        let (mut held, observations) = (Holdings::default(), Observations::with_java_compat(false));
        moves
            .poll_requests(&a.ports(), &mut held, &observations)
            .await;
        assert!(held.held.is_empty(), "not handed over yet");
        assert_eq!(moves.requested.len(), 1, "still waiting");
        let asked = b.table.get(&row.key).await.unwrap().unwrap();
        b.table
            .transfer(&row.key, &asked.fence(), &a.me)
            .await
            .unwrap();
        moves
            .poll_requests(&a.ports(), &mut held, &observations)
            .await;
        assert_eq!(held.held.keys().collect::<Vec<_>>(), vec![&row.key]);
        assert!(moves.requested.is_empty(), "the request is closed");
        assert_eq!(held.gained.get("handed_off"), Some(&1));
        assert_eq!(a.out.told(), vec!["LeaseGained"]);
    }

    /// A lease given up on cools down here and is released for others.
    #[tokio::test(start_paused = true)]
    async fn a_lease_given_up_cools_down_and_is_released() {
        let rig = Rig::new("me").await;
        let row = rig.row(0).await;
        let taken = rig
            .table
            .take(&row.key, &row.fence(), &rig.me)
            .await
            .unwrap();
        let mut held = Holdings::default();
        held.held.insert(row.key.clone(), taken.fence());
        let mut moves = Moves::default();
        moves
            .give_up(&rig.ports(), &mut held, row.key.clone())
            .await;
        assert!(held.held.is_empty());
        assert!(!moves.cooled(Instant::now()));
        let after = rig.table.get(&row.key).await.unwrap().unwrap();
        assert_eq!(after.owner, None);
        assert_eq!(held.given.get("released"), Some(&1));
        tokio::time::advance(rig.settings.supervision.shard_cooldown).await;
        assert!(moves.cooled(Instant::now()));
        moves.end_cooldowns(Instant::now());
        assert!(moves.cooling.is_empty());
    }
}
