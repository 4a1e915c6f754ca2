//! `lease.java_compat`: renewing held leases the Java KCL's way, invisibly to the rest
//! of the worker.
//!
//! A Java KCL worker judges a lease by its `leaseCounter` alone: expired once the
//! counter has not changed for `failoverTimeMillis` as its own scans saw it
//! (`DynamoDBLeaseTaker.updateAllLeases` keeps `lastCounterIncrementNanos` from the old
//! lease while the counter is equal, else the scan's time), and its owner renews every
//! `failoverTimeMillis / 3` (`DynamoDBLeaseCoordinator`'s renewer interval) with a write
//! conditional on owner and counter that bumps the counter
//! (`DynamoDBLeaseRefresher.renewLease`). flotilla's counter moves only when the owner
//! changes, so beside a Java fleet flotilla must renew too.
//!
//! But the counter is flotilla's fence: every checkpoint, release, transfer and delete
//! is conditional on the owner and the counter the lease was taken with, and the
//! readers, the checkpoint writer and the fencing board all hold that counter. Rather
//! than carry a changing counter to all of them, [`Renewing`] wraps the lease table and
//! keeps, per lease this worker took, its *life* (the counter it was taken with, which
//! everyone above keeps using) and the row's *current* counter. Fenced writes of that
//! life are sent conditional on the current counter; what comes back (scans, reads,
//! a refusal's counter) shows the life's counter again while the row is at the current
//! one. Above the port, nothing sees a renewal. The Java KCL orders its checkpoints
//! after renewals the same way (both go through the renewer's `authoritativeLease`,
//! under `synchronized`): here a per-lease gate orders each renewal with that lease's
//! fenced writes, so a checkpoint never carries a counter a renewal just replaced.
//!
//! A renewal whose answer is lost may or may not have landed. The lease is then
//! *unsure*: before its next renewal or fenced write the row is read (strongly
//! consistent), and the counter decides: one more than current and still ours, it
//! landed; equal, it did not; anything else, the lease is lost. This is the KCL's own
//! check after a refused renewal ("a spurious retry during the Dynamo update": re-read,
//! owner and counter + 1). While unsure, a read of the row at either counter still shows
//! the life's. Until that read succeeds the fenced write fails as the read did
//! (retryable), never unfenced and never as "lease lost".
//!
//! Renewals stop while this worker's own heartbeat is unconfirmed past the fence time
//! (it delivers nothing then, and its flotilla peers may take its leases), so a worker
//! whose keeper stopped does not look alive to Java workers.
//!
//! A renewal refused (another owner, or the row gone) revokes the lease on the fencing
//! board at once, before the keeper's next scan notices. Each confirmed renewal is
//! recorded on the board ([`crate::fencing::Board::renewed`]), which under
//! `lease.java_compat` lets a lease deliver only while its counter moved within the
//! fence time: the Java rule 1 of self-fencing, per lease.
//!
//! * `lives`: [`Lives`], the pure bookkeeping of each life's counters (table-tested).
//! * this file: [`Renewing`], the thin wrapper: its renewal task, the per-lease gate,
//!   settling an unsure lease, and what it reports to the fencing board.
//! * `port`: [`Renewing`] as a [`LeaseTable`], by its call hook
//!   ([`crate::backend::hook::Hook`]): fenced writes gated, reads shown, the rest passed
//!   through.

mod lives;
mod port;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use tokio::time::Instant;

use crate::backend::{LeaseError, LeaseTable};
use crate::fencing::Fencing;
use crate::model::{Fence, LeaseKey, WorkerId};
use crate::telemetry::{LeaseRenewalFailed, LeaseRenewalRefused, LeaseRenewed, Telemetry};

pub(crate) use lives::{Lives, Resolution};

/// The lease table, renewing this worker's leases every `interval` (`lease.java_compat`).
/// See the module doc.
pub(crate) struct Renewing {
    inner: Arc<dyn LeaseTable>,
    lives: Mutex<Lives>,
    /// One gate per lease ever held: a renewal and the lease's fenced writes take it,
    /// so they never overlap.
    gates: Mutex<BTreeMap<LeaseKey, Arc<tokio::sync::Mutex<()>>>>,
    /// The fencing board and telemetry of the running core (`attach`).
    core: Mutex<Option<(Fencing, Telemetry)>>,
}

impl Renewing {
    /// Wraps `inner` and starts renewing every `interval` (the KCL's
    /// `failoverTimeMillis / 3`). The renewal task ends when the wrapper is dropped.
    pub fn start(inner: Arc<dyn LeaseTable>, me: WorkerId, interval: Duration) -> Arc<Self> {
        let this = Arc::new(Self {
            inner,
            lives: Mutex::new(Lives::new(me)),
            gates: Mutex::new(BTreeMap::new()),
            core: Mutex::new(None),
        });
        let weak: Weak<Self> = Arc::downgrade(&this);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(this) = weak.upgrade() else { break };
                this.renew_all().await;
            }
        });
        this
    }

    /// The fencing board the renewals report to and the telemetry they count in (each
    /// core spawn attaches its own).
    pub fn attach(&self, fencing: Fencing, telemetry: Telemetry) {
        *self.core.lock().unwrap_or_else(|e| e.into_inner()) = Some((fencing, telemetry));
    }

    fn lives(&self) -> MutexGuard<'_, Lives> {
        self.lives.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn core(&self) -> Option<(Fencing, Telemetry)> {
        self.core.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn gate(&self, key: &LeaseKey) -> Arc<tokio::sync::Mutex<()>> {
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.clone())
            .or_default()
            .clone()
    }

    /// Renews every lease held, at once; nothing while this worker's heartbeat is not
    /// confirmed within the fence time. Then it delivers nothing anyway, and its flotilla
    /// peers may be taking its leases: renewing would only keep a stopped worker's
    /// leases alive in Java workers' eyes (a keeper that stopped while this task runs on).
    pub async fn renew_all(&self) {
        if let Some((fencing, _)) = self.core()
            && fencing.lock().heartbeat_fresh(Instant::now()).is_err()
        {
            return;
        }
        let keys = self.lives().due();
        join_all(keys.iter().map(|key| self.renew(key))).await;
    }

    async fn renew(&self, key: &LeaseKey) {
        let gate = self.gate(key);
        let _gate = gate.lock().await;
        if self.settle(key).await.is_err() {
            return;
        }
        let (Some(fence), Some(taken)) = ({
            let lives = self.lives();
            (lives.renewal_fence(key), lives.taken_fence(key))
        }) else {
            return;
        };
        let sent = Instant::now();
        let core = self.core();
        match self.inner.renew(key, &fence).await {
            Ok(counter) => {
                self.lives().renewed(key, fence.counter, counter);
                if let Some(core) = &core {
                    report_renewed(core, key, &taken, sent, counter);
                }
            }
            Err(LeaseError::ConditionFailed { owner, .. }) => {
                self.lives().forget(key);
                if let Some(core) = &core {
                    report_lost(
                        core,
                        key,
                        &taken,
                        owner.as_ref(),
                        "renewal refused: owner is now",
                    );
                }
            }
            Err(error) => {
                // It may have landed (a lost answer): read the row before anything else.
                self.lives().unsure(key, sent);
                if let Some((_, telemetry)) = core {
                    telemetry.emit(LeaseRenewalFailed { key, error: &error });
                }
            }
        }
    }

    /// Settles an unsure lease by reading its row, with its gate held. `Err`: the read
    /// failed, and the lease stays unsure.
    async fn settle(&self, key: &LeaseKey) -> Result<(), LeaseError> {
        if !self.lives().is_unsure(key) {
            return Ok(());
        }
        let row = self.inner.get(key).await?;
        let taken = self.lives().taken_fence(key);
        let resolution = self.lives().resolve(key, row.as_ref());
        if let (Some(taken), Some(core)) = (taken, self.core()) {
            match resolution {
                // `Landed` comes only from a row read at the renewed counter.
                Resolution::Landed(sent) => {
                    if let Some(row) = &row {
                        report_renewed(&core, key, &taken, sent, row.counter);
                    }
                }
                Resolution::NotLanded => {}
                Resolution::Lost => report_lost(
                    &core,
                    key,
                    &taken,
                    row.as_ref().and_then(|r| r.owner.as_ref()),
                    "renewal unanswered, then the row showed owner",
                ),
            }
        }
        Ok(())
    }

    /// A fenced write: ordered with the lease's renewals, sent under the row's current
    /// counter when `fence` is the life's, its refusal shown with the life's counter.
    /// `gone` says whether a success ends the life (release, transfer, delete).
    async fn fenced<'a, T, F>(
        &self,
        key: &LeaseKey,
        fence: &Fence,
        gone: bool,
        write: F,
    ) -> Result<T, LeaseError>
    where
        F: FnOnce(Fence) -> BoxFuture<'a, Result<T, LeaseError>>,
    {
        let gate = self.gate(key);
        let _gate = gate.lock().await;
        self.settle(key).await?;
        let row_fence = self.lives().to_row(key, fence);
        let result = write(row_fence).await;
        let mut lives = self.lives();
        match result {
            Ok(value) => {
                if gone {
                    lives.forget(key);
                }
                Ok(value)
            }
            Err(error) => {
                let shown = lives.show_error(error);
                if let LeaseError::ConditionFailed { owner, .. } = &shown
                    && owner.as_ref() != Some(lives.me())
                {
                    lives.forget(key);
                }
                Err(shown)
            }
        }
    }
}

/// A renewal of the life `taken`, sent at `sent`, moved the row to `counter`: the board
/// lets the lease deliver on, and it is counted.
fn report_renewed(
    (fencing, telemetry): &(Fencing, Telemetry),
    key: &LeaseKey,
    taken: &Fence,
    sent: Instant,
    counter: u64,
) {
    fencing.lock().renewed(key, taken, sent);
    telemetry.emit(LeaseRenewed { key, counter });
}

/// The life `taken` is over (the row is `owner`'s now, or gone): revoked on the board at
/// once, `why` followed by the owner, and counted.
fn report_lost(
    (fencing, telemetry): &(Fencing, Telemetry),
    key: &LeaseKey,
    taken: &Fence,
    owner: Option<&WorkerId>,
    why: &str,
) {
    let now = owner.map(|o| o.as_str()).unwrap_or("nobody");
    fencing.lock().revoke(key, taken, format!("{why} {now}"));
    telemetry.emit(LeaseRenewalRefused { key, owner });
}

#[allow(clippy::unwrap_used, clippy::expect_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::faults::{Fault, FaultPlan, Faulty};
    use crate::backend::memory::MemoryDynamo;
    use crate::model::{Checkpoint, ExtendedSequenceNumber, Lease, SequenceNumber, ShardId};

    fn me() -> WorkerId {
        WorkerId::new("me")
    }

    fn row(owner: Option<&str>, counter: u64) -> Lease {
        let mut lease = Lease::new(
            &ShardId::from_index(0),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        lease.owner = owner.map(WorkerId::new);
        lease.counter = counter;
        lease
    }

    async fn held(
        faults: FaultPlan,
    ) -> (
        Arc<Faulty<crate::backend::memory::MemoryLeaseTable>>,
        Arc<Renewing>,
        Lease,
    ) {
        let db = MemoryDynamo::new();
        let inner = Arc::new(Faulty::new(db.lease_table("t"), faults));
        inner.ensure_table().await.unwrap();
        let lease = row(None, 0);
        assert!(inner.create_if_absent(&lease).await.unwrap());
        // Renewed by hand below; the task's first tick is an hour away.
        let table = Renewing::start(inner.clone(), me(), Duration::from_secs(3600));
        let taken = table.take(&lease.key, &lease.fence(), &me()).await.unwrap();
        (inner, table, taken)
    }

    fn at(n: u64) -> Checkpoint {
        Checkpoint::At(ExtendedSequenceNumber::new(
            SequenceNumber::from_u128(u128::from(n) + 1),
            0,
        ))
    }

    /// Checkpoints keep the fence they were given across renewals, the row's counter
    /// moves with each renewal, and reads show the taken counter throughout.
    #[tokio::test(start_paused = true)]
    async fn checkpoints_cross_renewals_with_the_fence_they_were_given() {
        let (inner, table, taken) = held(FaultPlan::seeded(1)).await;
        assert_eq!(taken.counter, 1);
        for n in 0..5 {
            table.renew_all().await;
            table
                .checkpoint(&taken.key, &taken.fence(), &at(n), &[])
                .await
                .expect("a checkpoint across a renewal is not a lost lease");
        }
        let raw = inner.get(&taken.key).await.unwrap().unwrap();
        assert_eq!(raw.counter, 6, "each renewal moved the row's counter");
        assert_eq!(raw.checkpoint, at(4));
        let seen = table.get(&taken.key).await.unwrap().unwrap();
        assert_eq!(
            seen.counter, 1,
            "above the port, the counter it was taken with"
        );
        let scanned = table.scan().await.unwrap();
        assert_eq!(scanned.leases[0].counter, 1);
        // Released under the taken fence: the row's counter + 1, and no renewal after.
        let released = table.release(&taken.key, &taken.fence()).await.unwrap();
        assert_eq!(released, 7);
        table.renew_all().await;
        assert_eq!(inner.calls("renew"), 5);
    }

    /// A prepared checkpoint (two-phase, with state) crosses renewals as a checkpoint
    /// does: sent under the row's current counter, never refused as a lost lease; the
    /// commit then removes it.
    #[tokio::test(start_paused = true)]
    async fn a_prepared_checkpoint_crosses_renewals_like_a_checkpoint() {
        let (inner, table, taken) = held(FaultPlan::seeded(1)).await;
        table.renew_all().await;
        let Checkpoint::At(pending) = at(3) else {
            unreachable!("at() makes positions")
        };
        table
            .prepare_checkpoint(&taken.key, &taken.fence(), &pending, Some(b"state"))
            .await
            .expect("a prepare across a renewal is not a lost lease");
        let raw = inner.get(&taken.key).await.unwrap().unwrap();
        assert_eq!(raw.counter, 2, "the renewal moved the row's counter");
        assert_eq!(raw.pending_checkpoint, Some(pending.clone()));
        assert_eq!(raw.pending_checkpoint_state.as_deref(), Some(&b"state"[..]));
        table.renew_all().await;
        table
            .checkpoint(&taken.key, &taken.fence(), &at(3), &[])
            .await
            .expect("the commit across a renewal");
        let raw = inner.get(&taken.key).await.unwrap().unwrap();
        assert_eq!((raw.counter, raw.checkpoint), (3, at(3)));
        assert_eq!(raw.pending_checkpoint, None);
        assert_eq!(raw.pending_checkpoint_state, None);
    }

    /// A renewal whose answer is lost (it landed) or that failed (it did not): the next
    /// checkpoint reads the row first and goes out under the right counter either way,
    /// never refused as a lost lease, never unfenced.
    #[tokio::test(start_paused = true)]
    async fn a_renewal_whose_answer_is_lost_is_settled_before_the_next_write() {
        for (fault, counter) in [(Fault::LostResponse, 2), (Fault::Transient, 1)] {
            let (inner, table, taken) =
                held(FaultPlan::seeded(1).then(Some("renew"), 0, fault)).await;
            table.renew_all().await;
            assert!(table.lives().is_unsure(&taken.key), "{fault:?}");
            assert_eq!(
                table.get(&taken.key).await.unwrap().unwrap().counter,
                1,
                "{fault:?}: shown at the taken counter while unsure"
            );
            table
                .checkpoint(&taken.key, &taken.fence(), &at(1), &[])
                .await
                .unwrap_or_else(|e| panic!("{fault:?}: {e}"));
            let raw = inner.get(&taken.key).await.unwrap().unwrap();
            assert_eq!((raw.counter, raw.checkpoint), (counter, at(1)), "{fault:?}");
            // And the next renewal goes out under the settled counter.
            table.renew_all().await;
            let raw = inner.get(&taken.key).await.unwrap().unwrap();
            assert_eq!(raw.counter, counter + 1, "{fault:?}");
        }
    }

    /// A Java worker takes the lease (conditional on the counter it saw, as
    /// `DynamoDBLeaseRefresher.takeLease` is): the next renewal is refused and the life
    /// ends; a late checkpoint of that life is refused, naming the new owner.
    #[tokio::test(start_paused = true)]
    async fn a_lease_a_java_worker_took_is_not_renewed_and_refuses_checkpoints() {
        let (inner, table, taken) = held(FaultPlan::seeded(1)).await;
        table.renew_all().await;
        let raw = inner.get(&taken.key).await.unwrap().unwrap();
        let java = WorkerId::new("java");
        inner.take(&taken.key, &raw.fence(), &java).await.unwrap();
        table.renew_all().await;
        assert!(
            table.lives().taken_fence(&taken.key).is_none(),
            "the life ended"
        );
        match table
            .checkpoint(&taken.key, &taken.fence(), &at(1), &[])
            .await
        {
            Err(LeaseError::ConditionFailed { owner, .. }) => assert_eq!(owner, Some(java)),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            inner.get(&taken.key).await.unwrap().unwrap().checkpoint,
            Checkpoint::TrimHorizon
        );
    }
}
