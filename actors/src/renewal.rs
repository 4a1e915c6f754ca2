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
//! [`Lives`] is the pure bookkeeping (table-tested below); [`Renewing`] the thin
//! wrapper and its renewal task.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use futures::future::{BoxFuture, join_all};
use tokio::time::Instant;

use crate::backend::{
    HeartbeatDetail, HeartbeatsOutput, LeaseError, LeaseTable, ScanOutput, TableState,
};
use crate::fencing::Fencing;
use crate::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, ShardId, WorkerId, WorkerLoad,
};
use crate::telemetry::{LeaseRenewalFailed, LeaseRenewalRefused, LeaseRenewed, Telemetry};

/// One held lease's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Life {
    /// The counter the lease was taken with: the fence everyone above holds.
    taken: u64,
    /// The row's counter as of the last confirmed write.
    current: u64,
    /// A renewal sent at this time whose answer was lost: the row may be at
    /// `current + 1`.
    unsure: Option<Instant>,
}

/// What a read of an unsure lease's row says about the renewal whose answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// It landed (sent at this time): the row is at `current + 1`.
    Landed(Instant),
    /// It did not land: the row is at `current`.
    NotLanded,
    /// The row is another owner's, at another counter, or gone.
    Lost,
}

/// The lives of the leases this worker took, by lease key. Pure: no I/O, no clock.
#[derive(Debug, Clone)]
pub(crate) struct Lives {
    me: WorkerId,
    lives: BTreeMap<LeaseKey, Life>,
}

impl Lives {
    pub fn new(me: WorkerId) -> Self {
        Self {
            me,
            lives: BTreeMap::new(),
        }
    }

    /// The fence to send for a write the caller fenced with `fence`: the current
    /// counter when `fence` is this worker's fence of the lease's life, else `fence`
    /// itself (another owner's lease, or an older life, whose write must fail).
    pub fn to_row(&self, key: &LeaseKey, fence: &Fence) -> Fence {
        match self.lives.get(key) {
            Some(life) if fence.owner.as_ref() == Some(&self.me) && fence.counter == life.taken => {
                Fence {
                    owner: fence.owner.clone(),
                    counter: life.current,
                }
            }
            _ => fence.clone(),
        }
    }

    /// The counter to show for a row this worker read: the life's counter when the row
    /// is ours at the current counter (or at the next one while a renewal is unsure),
    /// else the row's own.
    pub fn shown(&self, key: &LeaseKey, owner: Option<&WorkerId>, counter: u64) -> u64 {
        match self.lives.get(key) {
            Some(life)
                if owner == Some(&self.me)
                    && (counter == life.current
                        || (life.unsure.is_some() && counter == life.current + 1)) =>
            {
                life.taken
            }
            _ => counter,
        }
    }

    /// This worker took the lease (any take): a new life at the counter written.
    pub fn took(&mut self, lease: &Lease) {
        if lease.owner.as_ref() == Some(&self.me) {
            self.lives.insert(
                lease.key.clone(),
                Life {
                    taken: lease.counter,
                    current: lease.counter,
                    unsure: None,
                },
            );
        }
    }

    /// The lease left this worker (released, handed over, deleted, lost).
    pub fn forget(&mut self, key: &LeaseKey) {
        self.lives.remove(key);
    }

    /// The leases to renew: every one held.
    pub fn due(&self) -> Vec<LeaseKey> {
        self.lives.keys().cloned().collect()
    }

    /// The life's fence as everyone above holds it.
    pub fn taken_fence(&self, key: &LeaseKey) -> Option<Fence> {
        self.lives.get(key).map(|life| Fence {
            owner: Some(self.me.clone()),
            counter: life.taken,
        })
    }

    /// The fence a renewal is sent under, unless the lease is unsure (read it first).
    pub fn renewal_fence(&self, key: &LeaseKey) -> Option<Fence> {
        self.lives
            .get(key)
            .filter(|life| life.unsure.is_none())
            .map(|life| Fence {
                owner: Some(self.me.clone()),
                counter: life.current,
            })
    }

    pub fn is_unsure(&self, key: &LeaseKey) -> bool {
        self.lives
            .get(key)
            .is_some_and(|life| life.unsure.is_some())
    }

    /// A renewal sent under `sent_at` (the row's counter) was confirmed at `counter`.
    pub fn renewed(&mut self, key: &LeaseKey, sent_at: u64, counter: u64) {
        if let Some(life) = self.lives.get_mut(key)
            && life.current == sent_at
        {
            life.current = counter;
            life.unsure = None;
        }
    }

    /// A renewal sent at `sent` got no answer: it may have landed.
    pub fn unsure(&mut self, key: &LeaseKey, sent: Instant) {
        if let Some(life) = self.lives.get_mut(key) {
            life.unsure = Some(sent);
        }
    }

    /// What a strongly consistent read of an unsure lease's row (`None`: no row) says;
    /// the life is updated (or forgotten, when lost) to match.
    pub fn resolve(&mut self, key: &LeaseKey, row: Option<&Lease>) -> Resolution {
        let Some(life) = self.lives.get_mut(key) else {
            return Resolution::Lost;
        };
        let ours = row.filter(|r| r.owner.as_ref() == Some(&self.me));
        match (ours.map(|r| r.counter), life.unsure) {
            (Some(c), Some(sent)) if c == life.current + 1 => {
                life.current = c;
                life.unsure = None;
                Resolution::Landed(sent)
            }
            (Some(c), _) if c == life.current => {
                life.unsure = None;
                Resolution::NotLanded
            }
            _ => {
                self.lives.remove(key);
                Resolution::Lost
            }
        }
    }

    /// A lease as this worker's callers must see it.
    pub fn show(&self, mut lease: Lease) -> Lease {
        lease.counter = self.shown(&lease.key, lease.owner.as_ref(), lease.counter);
        lease
    }

    /// An error as this worker's callers must see it (a refusal's counter shown as the
    /// life's while the row is still ours at the current counter).
    pub fn show_error(&self, error: LeaseError) -> LeaseError {
        match error {
            LeaseError::ConditionFailed {
                key,
                owner,
                counter: Some(counter),
            } => {
                let counter = Some(self.shown(&key, owner.as_ref(), counter));
                LeaseError::ConditionFailed {
                    key,
                    owner,
                    counter,
                }
            }
            other => other,
        }
    }
}

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
        &'a self,
        key: &'a LeaseKey,
        fence: &'a Fence,
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
                    && owner.as_ref() != Some(&lives.me)
                {
                    lives.forget(key);
                }
                Err(shown)
            }
        }
    }

    /// A take of any kind: a new life once written (an error is shown already by
    /// `fenced`).
    fn took(&self, result: Result<Lease, LeaseError>) -> Result<Lease, LeaseError> {
        result.map(|lease| {
            let mut lives = self.lives();
            lives.took(&lease);
            lives.show(lease)
        })
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

impl LeaseTable for Renewing {
    fn table_name(&self) -> &str {
        self.inner.table_name()
    }

    fn worker_table_name(&self) -> &str {
        self.inner.worker_table_name()
    }

    fn ensure_table(&self) -> BoxFuture<'_, Result<TableState, LeaseError>> {
        self.inner.ensure_table()
    }

    fn scan(&self) -> BoxFuture<'_, Result<ScanOutput, LeaseError>> {
        Box::pin(async move {
            let mut out = self.inner.scan().await?;
            let lives = self.lives();
            out.leases = out.leases.into_iter().map(|l| lives.show(l)).collect();
            Ok(out)
        })
    }

    fn get<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<Option<Lease>, LeaseError>> {
        Box::pin(async move {
            let row = self.inner.get(key).await?;
            Ok(row.map(|l| self.lives().show(l)))
        })
    }

    fn create_if_absent<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.create_if_absent(lease)
    }

    fn take<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(async move {
            let result = self
                .fenced(key, expected, true, |f| {
                    Box::pin(async move { self.inner.take(key, &f, new_owner).await })
                })
                .await;
            self.took(result)
        })
    }

    fn take_expired<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
        owner_heartbeat: Option<u64>,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(async move {
            let result = self
                .fenced(key, expected, true, |f| {
                    Box::pin(async move {
                        self.inner
                            .take_expired(key, &f, new_owner, owner_heartbeat)
                            .await
                    })
                })
                .await;
            self.took(result)
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.fenced(key, expected, true, move |f| {
            Box::pin(async move { self.inner.release(key, &f).await })
        }))
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        // Renewals are this wrapper's own; nobody above renews.
        self.inner.renew(key, expected)
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        checkpoint: &'a Checkpoint,
        children: &'a [ShardId],
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.fenced(key, expected, false, move |f| {
            Box::pin(async move { self.inner.checkpoint(key, &f, checkpoint, children).await })
        }))
    }

    /// A progress write like a checkpoint: sent under the row's current counter, ordered
    /// with this lease's renewals.
    fn prepare_checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        pending: &'a ExtendedSequenceNumber,
        state: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.fenced(key, expected, false, move |f| {
            Box::pin(async move { self.inner.prepare_checkpoint(key, &f, pending, state).await })
        }))
    }

    fn delete<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.fenced(key, expected, true, move |f| {
            Box::pin(async move { self.inner.delete(key, &f).await })
        }))
    }

    fn request_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.fenced(key, expected, false, move |f| {
            Box::pin(async move { self.inner.request_handoff(key, &f, requester).await })
        }))
    }

    fn transfer<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        to: &'a WorkerId,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.fenced(key, expected, true, move |f| {
            Box::pin(async move { self.inner.transfer(key, &f, to).await })
        }))
    }

    fn clear_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.clear_handoff(key, requester)
    }

    fn heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        load: &'a WorkerLoad,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        self.inner.heartbeat(worker, load)
    }

    fn remove_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.remove_heartbeat(worker)
    }

    fn join_roster<'a>(&'a self, workers: &'a [WorkerId]) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.inner.join_roster(workers)
    }

    fn heartbeats(
        &self,
        detail: HeartbeatDetail,
    ) -> BoxFuture<'_, Result<HeartbeatsOutput, LeaseError>> {
        self.inner.heartbeats(detail)
    }

    fn remove_dead_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        counter: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.remove_dead_heartbeat(worker, counter)
    }

    fn retire_legacy<'a>(
        &'a self,
        plan: &'a crate::backend::layout::Retirement,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.retire_legacy(plan)
    }

    fn stamp_source<'a>(
        &'a self,
        key: &'a LeaseKey,
        source: &'a str,
        created: Option<u64>,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.inner.stamp_source(key, source, created, overwrite)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::backend::faults::{Fault, FaultPlan, Faulty};
    use crate::backend::memory::MemoryDynamo;
    use crate::model::{ExtendedSequenceNumber, SequenceNumber};

    fn me() -> WorkerId {
        WorkerId::new("me")
    }

    fn fence(owner: &str, counter: u64) -> Fence {
        Fence {
            owner: Some(WorkerId::new(owner)),
            counter,
        }
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

    /// The bookkeeping, step by step: what is sent, what is shown.
    #[test]
    fn lives_show_the_taken_counter_and_send_the_current_one() {
        let key = row(None, 0).key;
        let t0 = Instant::now();
        let mut lives = Lives::new(me());
        // Nothing held: everything passes through.
        assert_eq!(lives.to_row(&key, &fence("me", 5)), fence("me", 5));
        assert_eq!(lives.shown(&key, Some(&me()), 7), 7);
        lives.took(&row(Some("me"), 5));
        lives.renewed(&key, 5, 6);
        lives.renewed(&key, 6, 7);
        // Another renewal's answer for an old counter changes nothing.
        lives.renewed(&key, 5, 6);
        let cases: [(&str, Fence, Fence); 3] = [
            (
                "the life's fence goes out at the current counter",
                fence("me", 5),
                fence("me", 7),
            ),
            (
                "an older life's fence goes out as it is, to fail",
                fence("me", 4),
                fence("me", 4),
            ),
            (
                "another owner's fence goes out as it is",
                fence("java", 5),
                fence("java", 5),
            ),
        ];
        for (name, given, sent) in cases {
            assert_eq!(lives.to_row(&key, &given), sent, "{name}");
        }
        let me = me();
        let java = WorkerId::new("java");
        let shown: [(&str, Option<&WorkerId>, u64, u64); 4] = [
            ("ours at the current counter: the life's", Some(&me), 7, 5),
            (
                "ours one past it, no renewal unsure: as it is",
                Some(&me),
                8,
                8,
            ),
            ("another owner's: as it is", Some(&java), 7, 7),
            ("nobody's: as it is", None, 7, 7),
        ];
        for (name, owner, counter, want) in shown {
            assert_eq!(lives.shown(&key, owner, counter), want, "{name}");
        }
        // A renewal whose answer was lost: the row may be at 7 or 8.
        lives.unsure(&key, t0);
        assert_eq!(
            lives.renewal_fence(&key),
            None,
            "unsure: read before renewing"
        );
        assert_eq!(lives.shown(&key, Some(&me), 8), 5);
        assert_eq!(lives.shown(&key, Some(&me), 7), 5);
        assert_eq!(
            lives.resolve(&key, Some(&row(Some("me"), 8))),
            Resolution::Landed(t0)
        );
        assert_eq!(lives.to_row(&key, &fence("me", 5)), fence("me", 8));
        lives.unsure(&key, t0);
        assert_eq!(
            lives.resolve(&key, Some(&row(Some("me"), 8))),
            Resolution::NotLanded
        );
        assert_eq!(lives.renewal_fence(&key), Some(fence("me", 8)));
        lives.unsure(&key, t0);
        assert_eq!(
            lives.resolve(&key, Some(&row(Some("java"), 9))),
            Resolution::Lost
        );
        assert_eq!(
            lives.to_row(&key, &fence("me", 5)),
            fence("me", 5),
            "forgotten"
        );
        lives.took(&row(Some("me"), 10));
        lives.unsure(&key, t0);
        assert_eq!(
            lives.resolve(&key, None),
            Resolution::Lost,
            "the row is gone"
        );
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
