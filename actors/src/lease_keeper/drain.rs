//! The graceful drain at shutdown, and leaving the fleet. A draining worker's heartbeat
//! says so; peers notice at their next scan and ask for its leases, which it hands over
//! (`act`) until nothing is held but what nobody asked for in time, no handoff is in
//! flight, and then tells the supervisor (`pure::drain_verdict`). Past the deadline, or
//! once the lease table fails (nobody's request can be read then), it stops waiting.
//! `release_all` then lets go of whatever is left and removes the heartbeat row.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;
use tracing::{error, warn};

use crate::backend::LeaseError;
use crate::balance::Observations;
use crate::model::item::heartbeat_key;
use crate::model::{Fence, LeaseKey};
use crate::protocol::{LeaseMove, SupervisorMsg};

use super::act::Request;
use super::held::Holdings;
use super::ports::Ports;
use super::pure::{self, DrainState, DrainVerdict};

struct Drain {
    /// Past it, nobody is waited for: what is left is released.
    deadline: Instant,
    done: bool,
    /// The lease table failed during the drain: askers cannot be heard, nor handoffs
    /// written, so waiting for them is pointless.
    table_failed: Option<String>,
}

/// Whether this worker is draining, and whether it has left.
#[derive(Default)]
pub(super) struct Leaving {
    drain: Option<Drain>,
    /// Every lease let go and the heartbeat row removed: the keeper does nothing more.
    pub stopped: bool,
}

impl Leaving {
    /// The drain starts: peers notice the draining heartbeat at their next scan and ask
    /// at once, so they get two scans and a poll (`wait`).
    pub fn start(&mut self, now: Instant, wait: Duration) {
        self.drain = Some(Drain {
            deadline: now + wait,
            done: false,
            table_failed: None,
        });
    }

    pub fn draining(&self) -> bool {
        self.drain.is_some()
    }

    /// Draining and not told the supervisor yet: handoffs are polled for.
    pub fn waiting(&self) -> bool {
        self.drain.as_ref().is_some_and(|d| !d.done)
    }

    /// A table call failed while draining (the first error is kept). Returns whether a
    /// drain is on, so the caller checks whether it is over.
    pub fn table_failed(&mut self, error: &LeaseError) -> bool {
        match &mut self.drain {
            Some(drain) => {
                drain.table_failed.get_or_insert_with(|| error.to_string());
                true
            }
            None => false,
        }
    }

    /// The lease table (or its worker table) does not exist: it was deleted under this
    /// worker (`flotilla destroy --force`, by hand). Nothing it does next can be right:
    /// made again, it would start every shard over. The worker stops with the reason
    /// (at ERROR, and `Worker::wait`'s error: `flotilla run` exits non-zero), unless it
    /// is already draining, whose end reports the failing table itself.
    pub fn table_gone(
        &mut self,
        ports: &Ports<'_>,
        error: &LeaseError,
        observations: &Observations,
        handoffs_in_flight: bool,
        holds_nothing: bool,
    ) {
        if self.table_failed(error) {
            self.check_drained(ports, observations, handoffs_in_flight, holds_nothing);
            return;
        }
        ports.fencing.lock().heartbeat_failed(error.to_string());
        let reason = format!(
            "the lease table {} (or its worker table {}) was deleted under this worker: {error}; \
             its checkpoints are gone. Make it again only to start the application afresh \
             (`flotilla init`), or point the worker at the right table and region",
            ports.table.table_name(),
            ports.table.worker_table_name(),
        );
        error!(message = "The lease table is gone; the worker stops.", %reason);
        ports.out.tell(SupervisorMsg::Fatal(reason));
    }

    /// Tells the supervisor the drain is over once nothing is held but what nobody
    /// asked for in time, and no handoff is still in flight (or the table fails).
    pub fn check_drained(
        &mut self,
        ports: &Ports<'_>,
        observations: &Observations,
        handoffs_in_flight: bool,
        holds_nothing: bool,
    ) {
        let Some(drain) = &mut self.drain else {
            return;
        };
        if drain.done {
            return;
        }
        let now = Instant::now();
        // Every peer is draining too (a whole fleet stopping): nobody will ask.
        let nobody_left = observations
            .members(ports.me, true, now, ports.lease().failover_time)
            .is_empty();
        let verdict = pure::drain_verdict(DrainState {
            table_failed: drain.table_failed.is_some(),
            handoffs_in_flight,
            holds_nothing,
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
        ports.out.tell(SupervisorMsg::DrainDone);
    }

    /// Leaves the fleet: releases every held lease, withdraws `requested`, releases
    /// what is still this worker's by name, and removes the heartbeat row. Every lease
    /// that could not be let go (or checked) is named in the report's `failed`; once the
    /// table has failed twice in a row, the rest are not attempted (each attempt would
    /// cost a timeout) and are named as such.
    pub async fn release_all(
        &mut self,
        ports: &Ports<'_>,
        held: &mut Holdings,
        requested: &mut BTreeMap<LeaseKey, Request>,
    ) {
        self.stopped = true;
        // In key order (a BTreeMap).
        let leases: Vec<(LeaseKey, Fence)> = std::mem::take(&mut held.held).into_iter().collect();
        for (key, fence) in &leases {
            ports.fencing.lock().forget(key, fence);
        }
        let mut failing: Option<(u32, String)> = None;
        let table_down = |failing: &Option<(u32, String)>| {
            failing
                .as_ref()
                .filter(|(n, _)| *n >= 2)
                .map(|(_, e)| e.clone())
        };
        for (key, fence) in leases {
            if let Some(error) = table_down(&failing) {
                held.report.failed.push(format!(
                    "{key}: not released (not attempted: the lease table is failing: {error})"
                ));
                continue;
            }
            match ports.table.release(&key, &fence).await {
                Ok(_) => {
                    failing = None;
                    held.moved_away(ports, &key, LeaseMove::Released, None);
                    held.report_released(&key);
                }
                Err(error) => {
                    warn!(message = "Lease could not be released.", lease_key = %key, %error);
                    held.report
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
            held.report.failed.push(format!(
                "leases owned by name and the heartbeat row {}: not checked (the lease table is failing: {error})",
                heartbeat_key(ports.me)
            ));
            return;
        }
        for key in std::mem::take(requested).into_keys() {
            let _ = ports.table.clear_handoff(&key, ports.me).await;
        }
        // A lease handed to this worker as it stopped is in no held set: find it by
        // name, so nobody waits a failover time for it.
        match ports.table.scan().await {
            Ok(scan) => {
                for lease in scan
                    .leases
                    .iter()
                    .filter(|l| l.owner.as_ref() == Some(ports.me) && !l.checkpoint.is_shard_end())
                {
                    if let Err(error) = ports.table.release(&lease.key, &lease.fence()).await {
                        held.report
                            .failed
                            .push(format!("{}: not released: {error}", lease.key));
                    } else {
                        held.moved_away(ports, &lease.key, LeaseMove::Released, None);
                        held.report_released(&lease.key);
                    }
                }
            }
            Err(error) => held.report.failed.push(format!(
                "leases still owned by this worker by name: not checked: {error}"
            )),
        }
        if let Err(error) = ports.table.remove_heartbeat(ports.me).await {
            warn!(message = "Heartbeat row could not be removed.", %error);
            held.report.failed.push(format!(
                "heartbeat row {}: not removed: {error}",
                heartbeat_key(ports.me)
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{LeaseTable, WorkerRows};
    use crate::lease_keeper::ports::testing::{Rig, SECOND};

    /// The drain waits while a handoff is in flight, and ends once nothing is held (or
    /// at once when the table fails); the supervisor is told once.
    #[tokio::test(start_paused = true)]
    async fn the_drain_ends_once_and_only_when_nothing_waits() {
        let rig = Rig::new("me").await;
        let observations = Observations::with_java_compat(false);
        let mut leaving = Leaving::default();
        leaving.check_drained(&rig.ports(), &observations, false, true);
        assert!(rig.out.told().is_empty(), "no drain yet");
        leaving.start(Instant::now(), 10 * SECOND);
        assert!(leaving.waiting());
        leaving.check_drained(&rig.ports(), &observations, true, true);
        assert!(rig.out.told().is_empty(), "a handoff is in flight");
        leaving.check_drained(&rig.ports(), &observations, false, true);
        leaving.check_drained(&rig.ports(), &observations, false, true);
        assert_eq!(rig.out.told(), vec!["DrainDone"]);
        assert!(!leaving.waiting());
    }

    /// Leaving releases every held lease and removes the heartbeat row.
    #[tokio::test(start_paused = true)]
    async fn leaving_lets_every_lease_go_and_removes_the_heartbeat() {
        let rig = Rig::new("me").await;
        let mut held = Holdings::default();
        for n in 0..2 {
            let row = rig.row(n).await;
            let taken = rig
                .table
                .take(&row.key, &row.fence(), &rig.me)
                .await
                .unwrap();
            held.held.insert(row.key.clone(), taken.fence());
        }
        rig.table
            .heartbeat(&rig.me, &Default::default())
            .await
            .unwrap();
        let mut leaving = Leaving::default();
        let mut requested = BTreeMap::new();
        leaving
            .release_all(&rig.ports(), &mut held, &mut requested)
            .await;
        assert!(leaving.stopped);
        assert!(held.held.is_empty());
        assert_eq!(held.report.released.len(), 2, "{:?}", held.report);
        assert!(held.report.failed.is_empty(), "{:?}", held.report);
        let scan = rig.table.scan().await.unwrap();
        assert!(scan.leases.iter().all(|l| l.owner.is_none()));
        assert!(scan.heartbeats.is_empty(), "the heartbeat row is gone");
    }
}
