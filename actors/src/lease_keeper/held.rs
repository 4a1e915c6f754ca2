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

    /// A write under the lease was refused (`KeeperMsg::Lost`): the lease is lost, if
    /// `fence` is still the epoch held (news of an old epoch must not drop a lease
    /// taken again since).
    pub fn lost(&mut self, ports: &Ports<'_>, key: &LeaseKey, fence: &Fence) {
        if self.holds(key, fence) {
            self.revoke(key, "a write under this lease was refused", ports.fencing);
            self.moved_away(ports, key, LeaseMove::Lost, None);
        }
    }

    /// The shard ended (`KeeperMsg::Finished`), if `fence` is still the epoch held: a
    /// change peers hear of (SHARD_END may make children processable).
    pub fn finished(&mut self, ports: &Ports<'_>, key: &LeaseKey, fence: &Fence) {
        if self.holds(key, fence) {
            self.changed();
            self.let_go(key, ports.fencing);
            self.moved_away(ports, key, LeaseMove::ShardEnded, None);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LeaseTable;
    use crate::lease_keeper::ports::testing::Rig;

    /// A refused write changed nothing; any other outcome (an unanswered write too)
    /// may have, and is counted.
    #[test]
    fn a_refused_write_is_not_a_change() {
        let mut held = Holdings::default();
        let refused: Result<(), LeaseError> = Err(LeaseError::ConditionFailed {
            key: LeaseKey::new("k"),
            owner: None,
            counter: None,
        });
        held.wrote(&refused);
        assert_eq!(held.changes, 0);
        held.wrote(&Ok::<(), LeaseError>(()));
        let throttled: Result<(), LeaseError> = Err(LeaseError::Throttled {
            op: "UpdateItem",
            message: "slow down".into(),
        });
        held.wrote(&throttled);
        assert_eq!(held.changes, 2);
    }

    /// News of an old epoch (a loss, an end) leaves a lease taken again since alone.
    #[tokio::test(start_paused = true)]
    async fn news_of_an_old_epoch_leaves_a_lease_taken_again_alone() {
        let rig = Rig::new("me").await;
        let ports = rig.ports();
        let key = LeaseKey::new("shardId-000000000000");
        let old = Fence {
            owner: Some(rig.me.clone()),
            counter: 1,
        };
        let now = Fence {
            owner: Some(rig.me.clone()),
            counter: 3,
        };
        let mut held = Holdings::default();
        held.held.insert(key.clone(), now.clone());
        held.lost(&ports, &key, &old);
        held.finished(&ports, &key, &old);
        assert!(
            held.holds(&key, &now),
            "an old epoch's news dropped the lease"
        );
        assert!(held.given.is_empty());
        held.lost(&ports, &key, &now);
        assert!(held.held.is_empty());
        assert_eq!(held.given.get("lost"), Some(&1));
        assert_eq!(held.changes, 0, "a loss is no change of ours");
    }

    /// A release reported failed, then made, is reported released only.
    #[tokio::test(start_paused = true)]
    async fn a_release_made_in_the_end_is_not_also_failed() {
        let rig = Rig::new("me").await;
        let ports = rig.ports();
        let row = rig.row(0).await;
        let taken = rig
            .table
            .take(&row.key, &row.fence(), &rig.me)
            .await
            .unwrap();
        let mut held = Holdings::default();
        held.report
            .failed
            .push(format!("{}: not released: throttled", row.key));
        held.release_unheld(&ports, &taken.key, &taken.fence())
            .await;
        assert!(held.report.failed.is_empty());
        assert_eq!(held.report.released, vec![row.key.to_string()]);
        assert_eq!(held.changes, 1);
        let after = rig.table.get(&row.key).await.unwrap().unwrap();
        assert_eq!(after.owner, None);
    }
}
