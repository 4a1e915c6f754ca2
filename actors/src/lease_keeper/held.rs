//! The leases this worker holds, and the ledger of their moves: the ownership changes it
//! has made (which its heartbeat publishes, so peers know to read the lease rows), each
//! move counted by reason for the status endpoint, and the shutdown report. Every part
//! that gains or lets go of a lease goes through here, so a move is never made without
//! its event, its count and its place on the fencing board.

use std::collections::BTreeMap;

use crate::backend::LeaseError;
use crate::balance::Gain;
use crate::fencing::Fencing;
use crate::model::{Fence, Lease, LeaseKey, WorkerId};
use crate::protocol::LeaseMove;
use crate::status::ReleaseReport;
use crate::telemetry::{LeaseGained, LeaseGiven};
use tracing::debug;

use super::ports::Ports;

#[derive(Default)]
pub(super) struct Holdings {
    /// Each held lease, with the fence it was taken under.
    pub held: BTreeMap<LeaseKey, Fence>,
    /// Ownership changes this worker has made (`WorkerLoad::changes`).
    pub changes: u64,
    /// A change peers must hear of before the next tick: a handoff request (the owner
    /// answers at its next round, as when every round scanned) or rows the watcher
    /// made. Other changes ride on the next regular heartbeat.
    pub urgent: bool,
    /// Moves counted by reason, for the status endpoint.
    pub gained: BTreeMap<String, u64>,
    pub given: BTreeMap<String, u64>,
    /// What leaving did (reset when a drain starts).
    pub report: ReleaseReport,
}

impl Holdings {
    /// The lease leaves this worker in an orderly way (handed over, released,
    /// finished): no longer held, no longer on the fencing board.
    pub fn let_go(&mut self, key: &LeaseKey, fencing: &Fencing) -> Option<Fence> {
        let fence = self.held.remove(key)?;
        fencing.lock().forget(key, &fence);
        Some(fence)
    }

    /// The lease is not this worker's any more: revoked on the fencing board at once,
    /// so no batch is delivered from now on, whoever has been told yet.
    pub fn revoke(&mut self, key: &LeaseKey, why: &str, fencing: &Fencing) -> Option<Fence> {
        let fence = self.held.remove(key)?;
        fencing.lock().revoke(key, &fence, why);
        Some(fence)
    }

    /// Held leases a scan (sent at `sent`) shows still ours: proof of ownership as of
    /// then, which lifts the fence after a gap in heartbeats.
    pub fn reconfirm(&self, leases: &[Lease], fencing: &Fencing, sent: tokio::time::Instant) {
        let mut fencing = fencing.lock();
        for lease in leases {
            if self.holds(&lease.key, &lease.fence()) {
                fencing.reconfirm(&lease.key, &lease.fence(), sent);
            }
        }
    }

    /// Whether `fence` is the epoch this worker holds `key` under.
    pub fn holds(&self, key: &LeaseKey, fence: &Fence) -> bool {
        self.held.get(key) == Some(fence)
    }

    /// This worker changed an ownership (or a write that may have done so went
    /// unanswered): its next heartbeat tells peers to read the lease rows.
    pub fn changed(&mut self) {
        self.changes += 1;
    }

    /// After a write that may change an ownership or a request: counted unless the
    /// table refused it (nothing changed then).
    pub fn wrote<T>(&mut self, result: &Result<T, LeaseError>) {
        if !matches!(result, Err(LeaseError::ConditionFailed { .. })) {
            self.changed();
        }
    }

    /// A lease came to this worker: one event, one count, one metric.
    pub fn moved_here(
        &mut self,
        ports: &Ports<'_>,
        lease: &Lease,
        from: Option<&WorkerId>,
        why: Gain,
    ) {
        *self.gained.entry(why.as_str().to_owned()).or_default() += 1;
        ports.out.emit(&LeaseGained {
            key: &lease.key,
            counter: lease.counter,
            from,
            to: ports.me,
            why,
        });
    }

    /// A lease left this worker: one event, one count, one metric.
    pub fn moved_away(
        &mut self,
        ports: &Ports<'_>,
        key: &LeaseKey,
        why: LeaseMove,
        to: Option<&WorkerId>,
    ) {
        *self.given.entry(why.as_str().to_owned()).or_default() += 1;
        ports.out.emit(&LeaseGiven {
            key,
            from: ports.me,
            to,
            why,
        });
    }

    /// Notes a release in the shutdown report. Released in the end, a lease is not also
    /// reported as failed by an earlier attempt (the sweep by name retries those).
    pub fn report_released(&mut self, key: &LeaseKey) {
        let failed = format!("{key}: ");
        self.report.failed.retain(|f| !f.starts_with(&failed));
        self.report.released.push(key.to_string());
    }

    /// Lets go of a lease this worker owns by name but does not process.
    pub async fn release_unheld(&mut self, ports: &Ports<'_>, key: &LeaseKey, fence: &Fence) {
        let released = ports.table.release(key, fence).await;
        self.wrote(&released);
        match released {
            Ok(_) => {
                self.moved_away(ports, key, LeaseMove::Released, None);
                self.report_released(key);
            }
            Err(error) => {
                debug!(message = "Lease owned by name not released.", lease_key = %key, %error)
            }
        }
    }
}
