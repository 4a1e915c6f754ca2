//! A Java KCL 2.x worker for the fault simulator's `lease.java_compat` runs (`sim.rs`,
//! `SimOptions::java`): it shares the memory backend's lease table and stream with the
//! flotilla workers, behind its own `Faulty` wrappers and `Freezer`, and follows the
//! rules of the KCL 2.5.8 as its source and the real tier show them:
//!
//! * renewer (`DynamoDBLeaseRenewer.renewLeases`, every `failoverTimeMillis / 3 - 25
//!   ms`): every held lease at once gets `renewLease`, the counter + 1 conditional on
//!   the counter (here on owner and counter: the same while every change of owner moves
//!   the counter, as both sides' writes do). A lease already expired on this worker's
//!   own clock is not renewed but dropped (lost). A refusal is re-read first (the
//!   KCL's "spurious retry" check: ours at counter + 1 counts as renewed), then the
//!   lease is lost. A throttle is retried once (`RENEWAL_RETRIES`, 2 tries); any other
//!   error leaves the lease as it is (renewed or not, unknown). A lease counts as held
//!   while its last confirmed renewal, take or checkpoint was answered within the
//!   failover time (`getCurrentlyHeldLeases`, `Lease.isExpired`, on this worker's
//!   clock).
//! * taker (`DynamoDBLeaseTaker.takeLeases`, every `2 × (failoverTimeMillis + 25 ms)`):
//!   scans every lease row, keeps per lease the counter and the local time it last saw
//!   it change (a row first seen with an owner: as of this scan; first seen without
//!   one: never renewed). Expired (`isExpired`): never renewed, or unchanged for more
//!   than the failover time; an unowned row is not expired as such (one released since
//!   the last scan waits out the failover time). First, every lease unchanged for more
//!   than 3 failover times (`veryOldLeaseDurationNanosMultiplier`), never-renewed rows
//!   among them, is taken whatever the target, and nothing else that round. Otherwise
//!   target: ceil(leases / owners of unexpired leases, itself included; unexpired
//!   unowned rows count under a null owner). Below it, it takes expired leases
//!   (shuffled) up to the target; with none expired it steals at most
//!   `maxLeasesToStealAtOneTime` (1) from the most loaded owner (`chooseLeasesToSteal`;
//!   the null owner as most loaded ends the round, as its `NullPointerException` does).
//!   A take is conditional on what the scan showed: owner := it, counter + 1. A
//!   throttled take is retried (`TAKE_RETRIES`, 3), any other error ends the round.
//! * scheduler and shard consumers (`Scheduler.runProcessLoop` every second): each held
//!   lease gets a consumer that waits for its parents' SHARD_END (every 10 s, as
//!   `BlockOnParentShardTask`), reads from the row's checkpoint, hands each batch to
//!   its processor (the simulator's oracles), and checkpoints every 2 s and at
//!   SHARD_END, conditional on owner and counter; as the KCL's `updateLease` the
//!   checkpoint also moves the counter (here a renewal right after it, under the same
//!   per-lease lock as the renewer's, as the KCL's `synchronized (authoritativeLease)`).
//!   A refused checkpoint loses the lease. A consumer stops when its lease is no longer
//!   held (lost, or expired on this worker's clock). Stricter than the KCL: it checks
//!   that before every batch (the KCL notices at its next dispatch, within a second).
//! * stop (graceful, `Scheduler.startGracefulShutdown`): no more takes, every consumer
//!   checkpoints what it processed and ends, then the renewer stops; the leases are not
//!   released (2.5.8 leaves them to expire). Crash: every task ends at once.
//!
//! Not modelled: the KCL's lease-table shard sync beyond the first (flotilla's watcher
//! makes the rows of new shards), lease cleanup (`LeaseCleanupManager` deleting the rows
//! of finished shards), the re-read of steal candidates after a slow scan
//! (`updateStaleLeasesWithLatestState`: the memory table's scans are quick), and the
//! rows a take leaves behind (the memory table's take also clears flotilla's handoff
//! request, which the KCL's UpdateItem would leave).
//!
//! [`Watched`] is the memory lease table with a hook that hears every write that moves a
//! lease's counter as it lands (under the `Faulty` wrapper, so a lost answer still
//! counts): the simulator's Java oracles time takes against it.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use flotilla_actors::Record;
use flotilla_actors::backend::faults::{Faulty, Freezer};
use flotilla_actors::backend::hook::{self, Call, Landed};
use flotilla_actors::backend::memory::{MemoryLeaseTable, MemoryStreams};
use flotilla_actors::backend::{IteratorPosition, LeaseError, LeaseTable, StreamClient};
use flotilla_actors::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, SequenceNumber, ShardId, WorkerId,
};

use super::super::rig::STREAM;
use super::{DWELL, Shared, SplitMix};

/// What a landed write did to a lease row: the row's owner and counter after it
/// (`None`: the row was deleted).
pub type Hook =
    Arc<dyn Fn(&'static str, &LeaseKey, &Fence, Option<(Option<&WorkerId>, u64)>) + Send + Sync>;

/// The memory lease table, telling `hook` of every write that moves a counter (or
/// deletes a row) as it lands. Without a hook it is the memory table exactly.
#[derive(Clone)]
pub struct Watched {
    inner: MemoryLeaseTable,
    hook: Option<Hook>,
}

impl Watched {
    pub fn new(inner: MemoryLeaseTable, hook: Option<Hook>) -> Self {
        Self { inner, hook }
    }

    fn heard(
        &self,
        op: &'static str,
        key: &LeaseKey,
        expected: &Fence,
        after: Option<(Option<&WorkerId>, u64)>,
    ) {
        if let Some(hook) = &self.hook {
            hook(op, key, expected, after);
        }
    }
}

/// Each call passed to the memory table; a write that moved a counter or deleted a row
/// heard as it lands.
impl hook::Hook for Watched {
    type Inner = MemoryLeaseTable;

    fn inner(&self) -> &MemoryLeaseTable {
        &self.inner
    }

    fn around<'a, C: Call<'a>>(&'a self, call: C) -> BoxFuture<'a, Result<C::Out, LeaseError>> {
        Box::pin(async move {
            let result = call.send(&self.inner).await;
            if let (Ok(out), Some(fenced)) = (&result, call.fenced()) {
                let after = match call.landed(out) {
                    Some(Landed::Row { owner, counter }) => Some(Some((owner, counter))),
                    Some(Landed::Deleted) => Some(None),
                    None => None,
                };
                if let Some(after) = after {
                    self.heard(C::OP.name(), fenced.key, fenced.fence, after);
                }
            }
            result
        })
    }
}

/// A Java worker's name: `j00`, `j01`, … (flotilla's are `w00`, …).
pub fn is_java(worker: &str) -> bool {
    worker.starts_with('j')
}

/// How a Java take got its lease, for the oracles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TakeKind {
    /// The row had no owner.
    Unowned,
    /// Its counter stood still for the failover time on the taker's clock.
    Expired,
    /// From a live owner above the target (`chooseLeasesToSteal`).
    Steal,
    /// Its counter stood still for three failover times (`veryOldLeases`: taken first,
    /// whatever the target).
    VeryOld,
}

/// One lease the renewer holds (the KCL's `authoritativeLease`).
#[derive(Debug, Clone)]
pub struct Held {
    /// The row's counter as of the last confirmed take, renewal or checkpoint.
    pub counter: u64,
    /// When that was answered, on this worker's clock (`lastCounterIncrementNanos`).
    pub last_ok: Instant,
    /// Which acquisition this is (the KCL's concurrency token): a consumer works for
    /// one.
    pub token: u64,
}

/// A lease row as the taker last saw it.
#[derive(Debug, Clone)]
struct Seen {
    counter: u64,
    /// When this worker saw the counter change; `None`: never renewed (a row first seen
    /// without an owner).
    since: Option<Instant>,
}

/// What one Java worker knows; the oracles read it through [`JavaHandle`].
pub struct JavaState {
    pub held: BTreeMap<LeaseKey, Held>,
    seen: BTreeMap<LeaseKey, Seen>,
    consumers: BTreeMap<LeaseKey, (u64, JoinHandle<()>)>,
    /// Per lease, the lock its renewals and checkpoints take.
    locks: BTreeMap<LeaseKey, Arc<tokio::sync::Mutex<()>>>,
    stopping: bool,
    /// Crashed or stopped: holds nothing any more.
    pub gone: bool,
    next_token: u64,
    rng: SplitMix,
}

impl JavaState {
    /// Whether the lease counts as held now (`getCurrentlyHeldLease`): ours, and
    /// renewed within the failover time on this worker's clock. Strict at the edge (the
    /// KCL's `isExpired` is `age > duration`): the oracles give the worker the instant.
    pub fn holds(&self, key: &LeaseKey, now: Instant, failover: Duration) -> Option<&Held> {
        self.held
            .get(key)
            .filter(|h| !self.gone && now.saturating_duration_since(h.last_ok) < failover)
    }
}

/// What the oracles need of a Java worker.
#[derive(Clone)]
pub struct JavaHandle {
    pub freezer: Freezer,
    pub state: Arc<Mutex<JavaState>>,
}

impl JavaHandle {
    pub fn lock(&self) -> MutexGuard<'_, JavaState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The KCL's defaults and the simulator's choices for one Java worker.
#[derive(Debug, Clone, Copy)]
pub struct JavaTiming {
    /// `failoverTimeMillis`.
    pub failover: Duration,
    /// `maxLeasesToStealAtOneTime`.
    pub max_steal: usize,
}

impl JavaTiming {
    fn renew_every(&self) -> Duration {
        self.failover / 3 - Duration::from_millis(25)
    }

    fn take_every(&self) -> Duration {
        (self.failover + Duration::from_millis(25)) * 2
    }
}

/// `shardConsumerDispatchPollIntervalMillis`.
const DISPATCH_EVERY: Duration = Duration::from_secs(1);
/// `idleTimeBetweenReadsInMillis`, and the wait after a failed read.
const IDLE: Duration = Duration::from_secs(1);
/// `parentShardPollIntervalMillis`.
const PARENT_POLL: Duration = Duration::from_secs(10);
/// How often the processor checkpoints.
const CHECKPOINT_EVERY: Duration = Duration::from_secs(2);
const MAX_RECORDS: u32 = 50;
/// `veryOldLeaseDurationNanosMultiplier`.
const VERY_OLD_MULTIPLIER: u32 = 3;

/// Everything a Java worker's tasks share.
#[derive(Clone)]
struct Ctx {
    id: String,
    me: WorkerId,
    table: Faulty<Watched>,
    stream: Faulty<MemoryStreams>,
    freezer: Freezer,
    state: Arc<Mutex<JavaState>>,
    shared: Shared,
    timing: JavaTiming,
}

/// A running Java worker.
pub struct JavaWorker {
    pub id: String,
    pub table: Faulty<Watched>,
    pub stream: Faulty<MemoryStreams>,
    pub freezer: Freezer,
    pub handle: JavaHandle,
    /// The fault now on this worker, and when it heals.
    pub fault: Option<(String, Instant)>,
    ctx: Ctx,
    renewer: JoinHandle<()>,
    taker: JoinHandle<()>,
    dispatcher: JoinHandle<()>,
}

impl JavaWorker {
    /// Starts the renewer, the taker and the scheduler; on an empty lease table, first
    /// makes a row per shard as the KCL's first shard sync does.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn start(
        id: String,
        table: Faulty<Watched>,
        stream: Faulty<MemoryStreams>,
        freezer: Freezer,
        shared: Shared,
        timing: JavaTiming,
        seed: u64,
    ) -> Self {
        let state = Arc::new(Mutex::new(JavaState {
            held: BTreeMap::new(),
            seen: BTreeMap::new(),
            consumers: BTreeMap::new(),
            locks: BTreeMap::new(),
            stopping: false,
            gone: false,
            next_token: 0,
            rng: SplitMix::new(seed),
        }));
        let ctx = Ctx {
            me: WorkerId::new(id.as_str()),
            id: id.clone(),
            table: table.clone(),
            stream: stream.clone(),
            freezer: freezer.clone(),
            state: state.clone(),
            shared,
            timing,
        };
        ctx.first_sync().await;
        let renewer = tokio::spawn(ctx.clone().renewer());
        let taker = tokio::spawn(ctx.clone().taker());
        let dispatcher = tokio::spawn(ctx.clone().dispatcher());
        Self {
            id,
            table,
            stream,
            handle: JavaHandle {
                freezer: freezer.clone(),
                state,
            },
            freezer,
            fault: None,
            ctx,
            renewer,
            taker,
            dispatcher,
        }
    }

    /// Every task ends at once; nothing is written (a `kill -9`).
    pub fn crash(self) {
        self.renewer.abort();
        self.taker.abort();
        self.dispatcher.abort();
        let mut state = self.ctx.lock();
        state.gone = true;
        state.held.clear();
        for (_, (_, consumer)) in std::mem::take(&mut state.consumers) {
            consumer.abort();
        }
    }

    /// The KCL's graceful shutdown: no more takes, each consumer checkpoints what it
    /// processed and ends (for 30 s at most), then the renewer stops. The leases are
    /// left to expire. Returns how many consumers had to be cut off.
    pub async fn stop(self) -> usize {
        self.taker.abort();
        self.dispatcher.abort();
        self.ctx.lock().stopping = true;
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline
            && self
                .ctx
                .lock()
                .consumers
                .values()
                .any(|(_, c)| !c.is_finished())
        {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        self.renewer.abort();
        let mut state = self.ctx.lock();
        state.gone = true;
        state.held.clear();
        let mut cut = 0;
        for (_, (_, consumer)) in std::mem::take(&mut state.consumers) {
            if !consumer.is_finished() {
                cut += 1;
            }
            consumer.abort();
        }
        cut
    }
}

impl Ctx {
    fn lock(&self) -> MutexGuard<'_, JavaState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn trace(&self, line: String) {
        self.shared.lock().trace(format!("{} {line}", self.id));
    }

    fn fence(&self, counter: u64) -> Fence {
        Fence {
            owner: Some(self.me.clone()),
            counter,
        }
    }

    fn lease_lock(&self, key: &LeaseKey) -> Arc<tokio::sync::Mutex<()>> {
        self.lock().locks.entry(key.clone()).or_default().clone()
    }

    /// The lease as held under `token`, if it still is (`getCurrentlyHeldLease` with
    /// the consumer's concurrency token).
    fn holding(&self, key: &LeaseKey, token: u64) -> Option<Held> {
        let state = self.lock();
        state
            .holds(key, Instant::now(), self.timing.failover)
            .filter(|h| h.token == token)
            .cloned()
    }

    /// Sets the held lease's counter (a confirmed renewal or checkpoint of `token`).
    fn renewed(&self, key: &LeaseKey, token: u64, counter: u64) {
        let mut state = self.lock();
        if let Some(held) = state.held.get_mut(key)
            && held.token == token
        {
            held.counter = counter;
            held.last_ok = Instant::now();
        }
    }

    /// The lease under `token` is lost.
    fn lost(&self, key: &LeaseKey, token: u64, why: &str) {
        let mut state = self.lock();
        if state.held.get(key).is_some_and(|h| h.token == token) {
            state.held.remove(key);
            drop(state);
            self.trace(format!("loses {key}: {why}"));
        }
    }

    /// The KCL's first shard sync: a row per shard when the table has none.
    async fn first_sync(&self) {
        let _ = self.table.ensure_table().await;
        let Ok(scan) = self.table.scan().await else {
            return;
        };
        if !scan.leases.is_empty() {
            return;
        }
        let Ok(shards) = self.stream.list_shards(STREAM).await else {
            return;
        };
        for shard in shards {
            let parents = shard
                .parent
                .iter()
                .chain(&shard.adjacent_parent)
                .cloned()
                .collect();
            let lease = Lease::new(
                &shard.id,
                Checkpoint::TrimHorizon,
                parents,
                Some(shard.hash_range),
            );
            let _ = self.table.create_if_absent(&lease).await;
        }
    }

    async fn renewer(self) {
        let mut tick = tokio::time::interval(self.timing.renew_every());
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let due: Vec<(LeaseKey, u64)> = {
                let state = self.lock();
                state
                    .held
                    .iter()
                    .map(|(k, h)| (k.clone(), h.token))
                    .collect()
            };
            // `renewLeases`: every lease at once (one task each), and the next run
            // waits for them all.
            futures::future::join_all(due.iter().map(|(key, token)| self.renew(key, *token))).await;
        }
    }

    /// `DynamoDBLeaseRenewer.renewLease` with `DynamoDBLeaseRefresher.renewLease`.
    async fn renew(&self, key: &LeaseKey, token: u64) {
        let lock = self.lease_lock(key);
        let _lock = lock.lock().await;
        for _ in 0..2 {
            // Not renewed once expired on this worker's own clock: lost
            // (`ownedLeases.remove`), so a checkpoint can no longer revive it.
            let Some(held) = self.holding(key, token) else {
                return self.lost(key, token, "expired on its own clock");
            };
            match self.table.renew(key, &self.fence(held.counter)).await {
                Ok(counter) => return self.renewed(key, token, counter),
                Err(LeaseError::ConditionFailed { .. }) => {
                    // "a spurious retry during the Dynamo update": ours at counter + 1
                    // means the renewal did land.
                    match self.table.get(key).await {
                        Ok(Some(row))
                            if row.owner.as_ref() == Some(&self.me)
                                && row.counter == held.counter + 1 =>
                        {
                            return self.renewed(key, token, row.counter);
                        }
                        Ok(row) => {
                            let owner = row
                                .and_then(|r| r.owner)
                                .map_or("nobody".to_owned(), |o| o.to_string());
                            return self.lost(
                                key,
                                token,
                                &format!("renewal refused, owner {owner}"),
                            );
                        }
                        Err(_) => return,
                    }
                }
                // ProvisionedThroughputException: retried.
                Err(LeaseError::Throttled { .. }) => continue,
                // DependencyException: the lease's state is unknown; it stays.
                Err(_) => return,
            }
        }
    }

    async fn taker(self) {
        loop {
            self.take_round().await;
            tokio::time::sleep(self.timing.take_every()).await;
        }
    }

    /// `DynamoDBLeaseTaker.takeLeases` (2.5.8).
    async fn take_round(&self) {
        let Ok(scan) = self.table.scan().await else {
            return;
        };
        let now = Instant::now();
        let failover = self.timing.failover;
        let leases = scan.leases;
        let (chosen, target) = 'choose: {
            let mut state = self.lock();
            // `updateAllLeases`: a counter that changed is renewed as of this scan; a
            // row first seen owned likewise; a row first seen unowned never was.
            let present: HashSet<&LeaseKey> = leases.iter().map(|l| &l.key).collect();
            state.seen.retain(|k, _| present.contains(k));
            for lease in &leases {
                let since = match state.seen.get(&lease.key) {
                    Some(seen) if seen.counter == lease.counter => seen.since,
                    Some(_) => Some(now),
                    None if lease.owner.is_none() => None,
                    None => Some(now),
                };
                state.seen.insert(
                    lease.key.clone(),
                    Seen {
                        counter: lease.counter,
                        since,
                    },
                );
            }
            let since =
                |l: &Lease, seen: &BTreeMap<LeaseKey, Seen>| seen.get(&l.key).and_then(|s| s.since);
            // `Lease.isExpired`: never renewed, or `age > failover`. An unowned row is
            // not expired as such: one seen with another counter before (a release)
            // waits out the failover time like any other.
            let expired_now = |l: &Lease, seen: &BTreeMap<LeaseKey, Seen>| {
                since(l, seen).is_none_or(|at| now.saturating_duration_since(at) > failover)
            };
            let mut expired: Vec<&Lease> = leases
                .iter()
                .filter(|l| expired_now(l, &state.seen))
                .collect();
            // `computeLeaseCounts`: the owners of unexpired leases, this worker
            // included; an unexpired unowned row counts under the null owner (a Java
            // `HashMap` key like any other, iterated first).
            let mut counts: BTreeMap<Option<&str>, usize> = BTreeMap::new();
            for lease in &leases {
                if !expired_now(lease, &state.seen) {
                    *counts
                        .entry(lease.owner.as_ref().map(WorkerId::as_str))
                        .or_default() += 1;
                }
            }
            counts.entry(Some(self.id.as_str())).or_default();
            let (leases_n, workers) = (leases.len(), counts.len());
            if leases_n == 0 {
                return;
            }
            let target = if workers >= leases_n {
                1
            } else {
                leases_n.div_ceil(workers)
            };
            let mine = counts[&Some(self.id.as_str())];
            let mut chosen: Vec<(Lease, TakeKind)> = Vec::new();
            let kind_of = |lease: &Lease, otherwise: TakeKind| {
                if lease.owner.is_none() {
                    TakeKind::Unowned
                } else {
                    otherwise
                }
            };
            // Priority: leases whose counter stood still for more than
            // `veryOldLeaseDurationNanosMultiplier` (3) failover times, a row never
            // renewed among them, are all taken whatever the target
            // (`maxLeasesForWorker` is unbounded by default), and nothing else this
            // round.
            let very_old = failover * VERY_OLD_MULTIPLIER;
            let mut old: Vec<&Lease> = leases
                .iter()
                .filter(|l| {
                    since(l, &state.seen)
                        .is_none_or(|at| now.saturating_duration_since(at) > very_old)
                })
                .collect();
            if !old.is_empty() {
                shuffle(&mut state.rng, &mut old);
                for lease in old {
                    chosen.push((lease.clone(), kind_of(lease, TakeKind::VeryOld)));
                }
                break 'choose (chosen, target);
            }
            let mut need = target.saturating_sub(mine);
            if need == 0 {
                return;
            }
            if !expired.is_empty() {
                shuffle(&mut state.rng, &mut expired);
                for lease in expired {
                    if need == 0 {
                        break;
                    }
                    chosen.push((lease.clone(), kind_of(lease, TakeKind::Expired)));
                    need -= 1;
                }
            } else {
                // `chooseLeasesToSteal`: the first most loaded owner.
                let mut most: Option<(Option<&str>, usize)> = None;
                for (owner, n) in &counts {
                    if most.is_none_or(|(_, m)| m < *n) {
                        most = Some((*owner, *n));
                    }
                }
                if let Some((victim, load)) = most
                    && load >= target
                {
                    let Some(victim) = victim else {
                        // `mostLoadedWorkerIdentifier.equals(..)` on the null owner: a
                        // NullPointerException ends the round (the taker's runnable
                        // logs it).
                        self.trace(
                            "taker: the most loaded owner is null (released rows): round ends"
                                .into(),
                        );
                        return;
                    };
                    let mut steal = (load - target).min(need);
                    if need > 1 && steal == 0 {
                        steal = 1;
                    }
                    steal = steal.min(self.timing.max_steal);
                    let mut candidates: Vec<&Lease> = leases
                        .iter()
                        .filter(|l| l.owner.as_ref().is_some_and(|o| o.as_str() == victim))
                        .collect();
                    shuffle(&mut state.rng, &mut candidates);
                    for lease in candidates.into_iter().take(steal) {
                        chosen.push((lease.clone(), TakeKind::Steal));
                    }
                }
            }
            (chosen, target)
        };
        self.take_chosen(chosen, target).await;
    }

    /// The takes of one round (`DynamoDBLeaseRefresher.takeLease`: conditional on the
    /// counter the scan showed; owner := this worker, counter + 1). A refusal leaves the
    /// lease untaken; a throttle is retried (`TAKE_RETRIES`, 3); any other error ends
    /// the round (a `DependencyException` out of `takeLeases`).
    async fn take_chosen(&self, chosen: Vec<(Lease, TakeKind)>, target: usize) {
        for (lease, kind) in chosen {
            let mut taken = None;
            for _ in 0..3 {
                match self.table.take(&lease.key, &lease.fence(), &self.me).await {
                    Ok(l) => {
                        taken = Some(l);
                        break;
                    }
                    Err(LeaseError::Throttled { .. }) => continue,
                    Err(LeaseError::ConditionFailed { .. }) => break,
                    Err(_) => return,
                }
            }
            let Some(taken) = taken else {
                continue;
            };
            let token = {
                let mut state = self.lock();
                state.next_token += 1;
                let token = state.next_token;
                state.held.insert(
                    lease.key.clone(),
                    Held {
                        counter: taken.counter,
                        last_ok: Instant::now(),
                        token,
                    },
                );
                token
            };
            let from = lease.owner.as_ref().map(|o| o.as_str());
            self.shared
                .lock()
                .java_took(&self.id, &lease.key, from, kind, taken.counter);
            self.trace(format!(
                "takes {} ({kind:?}{}, target {target}, token {token})",
                lease.key,
                from.map(|f| format!(" from {f}")).unwrap_or_default()
            ));
        }
    }

    /// `Scheduler.runProcessLoop`: a consumer for each lease held.
    async fn dispatcher(self) {
        loop {
            let now = Instant::now();
            let start: Vec<(LeaseKey, u64)> = {
                let state = self.lock();
                state
                    .held
                    .iter()
                    .filter(|(k, h)| {
                        state.holds(k, now, self.timing.failover).is_some()
                            && state.consumers.get(*k).is_none_or(|(t, _)| *t != h.token)
                    })
                    .map(|(k, h)| (k.clone(), h.token))
                    .collect()
            };
            for (key, token) in start {
                let consumer = tokio::spawn(self.clone().consume(key.clone(), token));
                if let Some((_, old)) = self.lock().consumers.insert(key, (token, consumer)) {
                    // The consumer of an earlier acquisition ends by itself (its token
                    // is stale); it is no longer tracked.
                    drop(old);
                }
            }
            tokio::time::sleep(DISPATCH_EVERY).await;
        }
    }

    /// One shard consumer (`ShardConsumer`): block on parents, initialize from the
    /// row's checkpoint, then read, process and checkpoint while the lease is held.
    async fn consume(self, key: LeaseKey, token: u64) {
        let shard = key.shard_id();
        // `BlockOnParentShardTask`.
        let row = loop {
            if self.holding(&key, token).is_none() || self.lock().stopping {
                return;
            }
            let row = match self.table.get(&key).await {
                Ok(Some(row)) => row,
                Ok(None) => return,
                Err(_) => {
                    tokio::time::sleep(IDLE).await;
                    continue;
                }
            };
            let mut blocked = false;
            for parent in &row.parent_shard_ids {
                match self.table.get(&LeaseKey::from(parent)).await {
                    Ok(None) => {}
                    Ok(Some(p)) if p.checkpoint.is_shard_end() => {}
                    _ => blocked = true,
                }
            }
            if !blocked {
                break row;
            }
            tokio::time::sleep(PARENT_POLL).await;
        };
        let mut last: Option<SequenceNumber> = match &row.checkpoint {
            Checkpoint::ShardEnd => return,
            Checkpoint::At(at) => Some(at.sequence.clone()),
            _ => None,
        };
        self.trace(format!(
            "starts {shard} at {} (token {token})",
            row.checkpoint
        ));
        let mut iterator = None;
        let mut unsaved = false;
        let mut saved_at = Instant::now();
        loop {
            if self.lock().stopping {
                // `shutdownRequested`: the processor checkpoints what it processed.
                if unsaved && let Some(at) = &last {
                    let checkpoint = Checkpoint::At(ExtendedSequenceNumber::new(at.clone(), 0));
                    self.checkpoint(&key, token, &checkpoint, &[]).await;
                }
                return;
            }
            if self.holding(&key, token).is_none() {
                self.trace(format!("stops {shard}: lease lost (token {token})"));
                return;
            }
            let it = match iterator.take() {
                Some(it) => it,
                None => {
                    let position = match &last {
                        Some(at) => IteratorPosition::AfterSequence(at.clone()),
                        None => IteratorPosition::TrimHorizon,
                    };
                    match self
                        .stream
                        .get_shard_iterator(STREAM, &shard, &position)
                        .await
                    {
                        Ok(it) => it,
                        Err(_) => {
                            tokio::time::sleep(IDLE).await;
                            continue;
                        }
                    }
                }
            };
            let batch = match self.stream.get_records(&it, MAX_RECORDS).await {
                Ok(batch) => batch,
                Err(_) => {
                    tokio::time::sleep(IDLE).await;
                    continue;
                }
            };
            iterator = batch.next_iterator.clone();
            if !batch.records.is_empty() {
                // A frozen worker's processor does not start; a lease lost meanwhile is
                // not delivered from.
                self.freezer.wait_thawed().await;
                if self.holding(&key, token).is_none() {
                    self.trace(format!("stops {shard}: lease lost (token {token})"));
                    return;
                }
                self.process(&shard, &batch.records).await;
                last = batch.records.last().map(|r| r.sequence_number.clone());
                unsaved = true;
            }
            if batch.is_shard_end() {
                let children: Vec<ShardId> = batch
                    .child_shards
                    .iter()
                    .flatten()
                    .map(|c| c.id.clone())
                    .collect();
                if self
                    .checkpoint(&key, token, &Checkpoint::ShardEnd, &children)
                    .await
                {
                    self.trace(format!("finishes {shard} (SHARD_END)"));
                    return;
                }
                // Not written (an error): read the end again.
                iterator = None;
                tokio::time::sleep(IDLE).await;
                continue;
            }
            if unsaved
                && saved_at.elapsed() >= CHECKPOINT_EVERY
                && let Some(at) = &last
            {
                let checkpoint = Checkpoint::At(ExtendedSequenceNumber::new(at.clone(), 0));
                if self.checkpoint(&key, token, &checkpoint, &[]).await {
                    unsaved = false;
                    saved_at = Instant::now();
                }
            }
            if batch.records.is_empty() {
                tokio::time::sleep(IDLE).await;
            }
        }
    }

    /// `processRecords`: the delivery oracles, the dwell, the finish.
    async fn process(&self, shard: &ShardId, records: &[Record]) {
        let _inside = self.shared.java_enter(&self.id, shard, records);
        tokio::time::sleep(DWELL).await;
        self.freezer.wait_thawed().await;
        self.shared.lock().finish(&self.id, shard, records);
    }

    /// `RecordProcessorCheckpointer.checkpoint` through `DynamoDBLeaseRenewer.updateLease`:
    /// conditional on owner and counter, then the counter moved. `false` when not
    /// written (the lease lost, or an error).
    async fn checkpoint(
        &self,
        key: &LeaseKey,
        token: u64,
        checkpoint: &Checkpoint,
        children: &[ShardId],
    ) -> bool {
        let lock = self.lease_lock(key);
        let _lock = lock.lock().await;
        // `updateLease` needs the lease in `ownedLeases` under the consumer's token.
        let held = {
            let state = self.lock();
            match state.held.get(key) {
                Some(h) if h.token == token && !state.gone => h.clone(),
                _ => return false,
            }
        };
        let fence = self.fence(held.counter);
        match self
            .table
            .checkpoint(key, &fence, checkpoint, children)
            .await
        {
            Ok(()) => {
                match self.table.renew(key, &fence).await {
                    Ok(counter) => self.renewed(key, token, counter),
                    Err(LeaseError::ConditionFailed { .. }) => {
                        self.lost(key, token, "the checkpoint's counter update refused")
                    }
                    Err(_) => {}
                }
                true
            }
            Err(LeaseError::ConditionFailed { owner, .. }) => {
                let owner = owner.map_or("nobody".to_owned(), |o| o.to_string());
                self.lost(key, token, &format!("checkpoint refused, owner {owner}"));
                false
            }
            Err(_) => false,
        }
    }
}

/// `Collections.shuffle`, from the worker's seeded generator.
fn shuffle<T>(rng: &mut SplitMix, items: &mut [T]) {
    for i in (1..items.len()).rev() {
        let j = rng.index(i + 1);
        items.swap(i, j);
    }
}
