//! A wrapper that makes any backend misbehave on purpose: throttling, transient errors,
//! lost responses, latency and timeouts, by seeded probability or by schedule.
//!
//! Randomness comes from a seeded generator and delays from tokio's clock, so a failing
//! run replays exactly from its seed under paused time.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::backend::{
    HeartbeatDetail, HeartbeatsOutput, IteratorPosition, LeaseError, LeaseTable, MetricDatum,
    MetricsError, MetricsSink, PutRecord, PutResult, RecordBatch, ScanOutput, ShardIterator,
    StreamAdmin, StreamClient, StreamError, StreamSummary, Subscription, TableState,
};
use crate::model::item::ReadUnits;
use crate::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, Shard, ShardId, WorkerId,
    WorkerLoad,
};

/// One injected misbehaviour.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The call is refused as throttled and never reaches the backend.
    Throttle,
    /// The call fails with a retryable error and never reaches the backend.
    Transient,
    /// The call reaches the backend and takes effect, but its answer is lost: the caller
    /// sees a transient error. This is what makes conditional writes ambiguous.
    LostResponse,
    /// The call is delayed, then runs.
    Latency(Duration),
    /// The call runs at once (its effect happens), and its answer is delayed.
    LateAnswer(Duration),
    /// The call hangs for the plan's `timeout`, then fails as transient, without effect.
    Timeout,
    /// The call panics, without effect: a bug on the caller's path, which its actor's
    /// supervisor must survive.
    Panic,
    /// The call is sent and takes effect, then the process stops ([`Freezer::freeze`]
    /// on the wrapper's freezer): the answer arrives when it is thawed. Without a
    /// freezer, the call just runs.
    Freeze,
}

/// A fault for the `nth` call (counting from 0) of `op` (`None`: any operation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scheduled {
    /// The operation, as the wrapper names it (the AWS call for the stream ports, e.g.
    /// `"GetRecords"`; the method for the lease table, e.g. `"heartbeat"`).
    pub op: Option<&'static str>,
    /// Which call of `op` (or of all operations, when `op` is `None`), counting from 0.
    pub nth: u64,
    /// What happens to that call.
    pub fault: Fault,
}

/// What to inject. Probabilities are per call, drawn in this order: throttle,
/// transient, lost response, late answer, timeout, panic; latency is added to calls that
/// are not refused.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    /// Seeds the random draws: the same seed and calls give the same faults.
    pub seed: u64,
    /// Probability (0 to 1) that a call is refused as throttled ([`Fault::Throttle`]).
    pub throttle: f64,
    /// Probability that a call fails as transient without effect ([`Fault::Transient`]).
    pub transient: f64,
    /// Probability that a call takes effect but its answer is lost
    /// ([`Fault::LostResponse`]).
    pub lost_response: f64,
    /// Calls that take effect at once and are answered after a delay drawn from
    /// `latency` (or `timeout_after` without it).
    pub late_answer: f64,
    /// Probability that a call hangs for `timeout_after`, then fails ([`Fault::Timeout`]).
    pub timeout: f64,
    /// Probability that a call panics ([`Fault::Panic`]).
    pub panic: f64,
    /// How long a timed-out call hangs before failing.
    pub timeout_after: Duration,
    /// A uniformly random delay in this range on every call that runs.
    pub latency: Option<(Duration, Duration)>,
    /// Operations the random faults apply to; empty means all.
    pub only_ops: Vec<&'static str>,
    /// Faults at fixed points, applied before (and instead of) the random ones.
    pub schedule: Vec<Scheduled>,
}

impl FaultPlan {
    /// No faults at all; add some with the fields or [`FaultPlan::then`].
    pub fn seeded(seed: u64) -> Self {
        Self {
            seed,
            throttle: 0.0,
            transient: 0.0,
            lost_response: 0.0,
            late_answer: 0.0,
            timeout: 0.0,
            panic: 0.0,
            timeout_after: Duration::from_secs(10),
            latency: None,
            only_ops: Vec::new(),
            schedule: Vec::new(),
        }
    }

    /// Adds a scheduled fault: `fault` on the `nth` call (from 0) of `op` (`None`: of
    /// any operation).
    pub fn then(mut self, op: Option<&'static str>, nth: u64, fault: Fault) -> Self {
        self.schedule.push(Scheduled { op, nth, fault });
        self
    }
}

#[derive(Debug)]
struct State {
    plan: FaultPlan,
    rng: StdRng,
    calls: HashMap<&'static str, u64>,
    /// Per read operation, the items its successful calls read (rows a scan returned,
    /// the roster and heartbeat rows a `heartbeats` asked for, one per `get`).
    items_read: HashMap<&'static str, u64>,
    /// Per read operation, the read units its successful calls were billed.
    read_units: HashMap<&'static str, ReadUnits>,
    injected: Vec<(&'static str, Fault)>,
    /// Per operation, the latest start time of a call that was answered with success.
    confirmed: HashMap<&'static str, tokio::time::Instant>,
}

/// Wraps a backend `B`; implements whichever ports `B` implements. Clones share state.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use flotilla_actors::backend::faults::{Fault, FaultPlan, Faulty};
/// use flotilla_actors::backend::memory::MemoryDynamo;
/// use flotilla_actors::backend::{LeaseError, LeaseTable};
/// use flotilla_actors::model::{WorkerId, WorkerLoad};
///
/// // The second heartbeat is written, but its answer is "lost": the caller sees a
/// // retryable error although the counter moved.
/// let plan = FaultPlan::seeded(42).then(Some("heartbeat"), 1, Fault::LostResponse);
/// let table = Faulty::new(MemoryDynamo::new().lease_table("my-app"), plan);
/// table.ensure_table().await?;
/// let me = WorkerId::new("w");
/// assert_eq!(table.heartbeat(&me, &WorkerLoad::default()).await?, 1);
/// assert!(matches!(table.heartbeat(&me, &WorkerLoad::default()).await, Err(LeaseError::Transient { .. })));
/// assert_eq!(table.heartbeat(&me, &WorkerLoad::default()).await?, 3);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Faulty<B> {
    inner: B,
    state: Arc<Mutex<State>>,
    freezer: Option<Freezer>,
}

/// Models a stopped process (SIGSTOP, a VM freeze, a long GC pause) in-process: while
/// frozen, every call of the backends that share this freezer waits before it starts,
/// and a call already under way waits before its answer is returned (the write took
/// effect; the caller learns of it on resume). User code can wait on it too (a frozen
/// processor). Timers keep running, so on thaw everything overdue fires at once, as it
/// does after SIGCONT. Clones share the state.
///
/// Waiters are woken on thaw in the order they began to wait (a `Notify`, not a `watch`
/// channel, whose waiters are spread over queues picked at random): the fault simulator
/// replays a seed exactly only if every wake-up order is fixed.
#[derive(Debug, Clone)]
pub struct Freezer(Arc<FreezerState>);

#[derive(Debug, Default)]
struct FreezerState {
    frozen: AtomicBool,
    thawed: tokio::sync::Notify,
}

impl Default for Freezer {
    fn default() -> Self {
        Self::new()
    }
}

impl Freezer {
    /// A freezer that is not frozen.
    pub fn new() -> Self {
        Self(Arc::default())
    }

    /// Stops every backend call that shares this freezer until [`Self::thaw`].
    pub fn freeze(&self) {
        self.0.frozen.store(true, Ordering::SeqCst);
    }

    /// Lets everything waiting go on, in the order it began to wait.
    pub fn thaw(&self) {
        self.0.frozen.store(false, Ordering::SeqCst);
        self.0.thawed.notify_waiters();
    }

    /// Whether the freezer is frozen now.
    pub fn is_frozen(&self) -> bool {
        self.0.frozen.load(Ordering::SeqCst)
    }

    /// Returns at once unless frozen; then when thawed.
    pub async fn wait_thawed(&self) {
        loop {
            // Registered before the check, so a thaw in between is not missed.
            let thawed = self.0.thawed.notified();
            tokio::pin!(thawed);
            thawed.as_mut().enable();
            if !self.is_frozen() {
                return;
            }
            thawed.await;
        }
    }
}

impl<B> Faulty<B> {
    /// Wraps `inner`, injecting faults by `plan`.
    pub fn new(inner: B, plan: FaultPlan) -> Self {
        let rng = StdRng::seed_from_u64(plan.seed);
        Self {
            inner,
            state: Arc::new(Mutex::new(State {
                plan,
                rng,
                calls: HashMap::new(),
                items_read: HashMap::new(),
                read_units: HashMap::new(),
                injected: Vec::new(),
                confirmed: HashMap::new(),
            })),
            freezer: None,
        }
    }

    /// Every call also stops while `freezer` is frozen (see [`Freezer`]).
    pub fn frozen_by(mut self, freezer: &Freezer) -> Self {
        self.freezer = Some(freezer.clone());
        self
    }

    /// The wrapped backend, to reach it without faults (e.g. to check its state).
    pub fn inner(&self) -> &B {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Every fault injected so far, in order, with the operation it hit.
    pub fn injected(&self) -> Vec<(&'static str, Fault)> {
        self.lock().injected.clone()
    }

    /// How many calls of `op` have been made so far: the `nth` of the next one, for a
    /// schedule set with [`Faulty::set_plan`].
    pub fn calls(&self, op: &'static str) -> u64 {
        self.lock().calls.get(op).copied().unwrap_or(0)
    }

    /// How many items the successful calls of the read `op` (`scan`, `heartbeats`,
    /// `get`) have read so far: what the lease-table read cost is counted in.
    pub fn items_read(&self, op: &'static str) -> u64 {
        self.lock().items_read.get(op).copied().unwrap_or(0)
    }

    /// Every operation called so far: its calls, and the items it read (see
    /// [`Faulty::items_read`]).
    pub fn counts(&self) -> std::collections::BTreeMap<&'static str, (u64, u64)> {
        let state = self.lock();
        state
            .calls
            .iter()
            .filter(|(op, _)| **op != "*")
            .map(|(op, n)| (*op, (*n, state.items_read.get(op).copied().unwrap_or(0))))
            .collect()
    }

    fn count_items(&self, op: &'static str, items: usize) {
        *self.lock().items_read.entry(op).or_insert(0) += items as u64;
    }

    /// The read units the successful calls of the read `op` (`scan`, `heartbeats`) were
    /// billed so far, as their outputs report them (`ScanOutput::read_units`,
    /// `HeartbeatsOutput::read_units`).
    pub fn read_units(&self, op: &'static str) -> ReadUnits {
        self.lock().read_units.get(op).copied().unwrap_or_default()
    }

    fn count_units(&self, op: &'static str, units: ReadUnits) {
        *self.lock().read_units.entry(op).or_default() += units;
    }

    /// The latest time a call of `op` that was answered with success was made (before
    /// any fault or freeze delayed it): for the lease keeper's heartbeat, the send time
    /// its fencing board counts from.
    pub fn last_confirmed(&self, op: &'static str) -> Option<tokio::time::Instant> {
        self.lock().confirmed.get(op).copied()
    }

    /// Replaces the plan (keeping the call counts), e.g. to stop injecting.
    pub fn set_plan(&self, plan: FaultPlan) {
        let mut state = self.lock();
        state.rng = StdRng::seed_from_u64(plan.seed);
        state.plan = plan;
    }

    fn decide(&self, op: &'static str) -> Option<Fault> {
        let mut guard = self.lock();
        let state = &mut *guard;
        let nth = {
            let count = state.calls.entry(op).or_insert(0);
            *count += 1;
            *count - 1
        };
        let any_nth = {
            let count = state.calls.entry("*").or_insert(0);
            *count += 1;
            *count - 1
        };
        let scheduled = state.plan.schedule.iter().find(|s| match s.op {
            Some(o) => o == op && s.nth == nth,
            None => s.nth == any_nth,
        });
        let fault = if let Some(s) = scheduled {
            Some(s.fault)
        } else if state.plan.only_ops.is_empty() || state.plan.only_ops.contains(&op) {
            let plan = &state.plan;
            let rng = &mut state.rng;
            let mut draw = |p: f64| p > 0.0 && rng.random_bool(p.min(1.0));
            if draw(plan.throttle) {
                Some(Fault::Throttle)
            } else if draw(plan.transient) {
                Some(Fault::Transient)
            } else if draw(plan.lost_response) {
                Some(Fault::LostResponse)
            } else if draw(plan.late_answer) {
                let (lo, hi) = plan
                    .latency
                    .unwrap_or((plan.timeout_after, plan.timeout_after));
                Some(Fault::LateAnswer(if hi > lo {
                    rng.random_range(lo..=hi)
                } else {
                    lo
                }))
            } else if draw(plan.timeout) {
                Some(Fault::Timeout)
            } else if draw(plan.panic) {
                Some(Fault::Panic)
            } else {
                plan.latency.map(|(lo, hi)| {
                    Fault::Latency(if hi > lo {
                        rng.random_range(lo..=hi)
                    } else {
                        lo
                    })
                })
            }
        } else {
            None
        };
        if let Some(f) = fault {
            state.injected.push((op, f));
        }
        fault
    }

    fn timeout_after(&self) -> Duration {
        self.lock().plan.timeout_after
    }

    /// Runs `call` under whatever fault the plan picks for `op`.
    async fn run<T, E: Injected>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        let sent = tokio::time::Instant::now();
        if let Some(freezer) = &self.freezer {
            freezer.wait_thawed().await;
        }
        let result = self.inject(op, call).await;
        if let Some(freezer) = &self.freezer {
            freezer.wait_thawed().await;
        }
        if result.is_ok() {
            let mut state = self.lock();
            let latest = state.confirmed.entry(op).or_insert(sent);
            *latest = (*latest).max(sent);
        }
        result
    }

    async fn inject<T, E: Injected>(
        &self,
        op: &'static str,
        call: impl Future<Output = Result<T, E>>,
    ) -> Result<T, E> {
        match self.decide(op) {
            None => call.await,
            Some(Fault::Throttle) => Err(E::throttled(op)),
            Some(Fault::Transient) => Err(E::transient(op, "injected transient failure")),
            Some(Fault::LostResponse) => {
                let _ = call.await;
                Err(E::transient(
                    op,
                    "injected: the call took effect but its response was lost",
                ))
            }
            Some(Fault::Latency(delay)) => {
                tokio::time::sleep(delay).await;
                call.await
            }
            Some(Fault::LateAnswer(delay)) => {
                let result = call.await;
                tokio::time::sleep(delay).await;
                result
            }
            Some(Fault::Panic) => panic!("injected panic in {op}"),
            Some(Fault::Freeze) => {
                let result = call.await;
                if let Some(freezer) = &self.freezer {
                    freezer.freeze();
                }
                result
            }
            Some(Fault::Timeout) => {
                let after = self.timeout_after();
                tokio::time::sleep(after).await;
                Err(E::transient(
                    op,
                    &format!("injected timeout after {after:?}"),
                ))
            }
        }
    }
}

/// How each port spells the injected errors.
pub trait Injected {
    /// The port's throttling error for `op`.
    fn throttled(op: &'static str) -> Self;
    /// The port's transient (retryable) error for `op`, saying `why`.
    fn transient(op: &'static str, why: &str) -> Self;
}

const ENDPOINT: &str = "fault injector";

impl Injected for StreamError {
    fn throttled(op: &'static str) -> Self {
        StreamError::Throttled {
            op,
            message: "injected throttle".into(),
        }
    }
    fn transient(op: &'static str, why: &str) -> Self {
        StreamError::Transient {
            op,
            endpoint: ENDPOINT.into(),
            message: why.into(),
        }
    }
}

impl Injected for LeaseError {
    fn throttled(op: &'static str) -> Self {
        LeaseError::Throttled {
            op,
            message: "injected throttle".into(),
        }
    }
    fn transient(op: &'static str, why: &str) -> Self {
        LeaseError::Transient {
            op,
            endpoint: ENDPOINT.into(),
            message: why.into(),
        }
    }
}

impl Injected for MetricsError {
    fn throttled(_op: &'static str) -> Self {
        MetricsError::Throttled {
            message: "injected throttle".into(),
        }
    }
    fn transient(_op: &'static str, why: &str) -> Self {
        MetricsError::Transient {
            endpoint: ENDPOINT.into(),
            message: why.into(),
        }
    }
}

impl<B: StreamClient> StreamClient for Faulty<B> {
    fn list_shards<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<Vec<Shard>, StreamError>> {
        Box::pin(self.run("ListShards", self.inner.list_shards(stream)))
    }

    fn get_shard_iterator<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<ShardIterator, StreamError>> {
        Box::pin(self.run(
            "GetShardIterator",
            self.inner.get_shard_iterator(stream, shard, position),
        ))
    }

    fn get_records<'a>(
        &'a self,
        iterator: &'a ShardIterator,
        limit: u32,
    ) -> BoxFuture<'a, Result<RecordBatch, StreamError>> {
        Box::pin(self.run("GetRecords", self.inner.get_records(iterator, limit)))
    }

    fn describe_stream_summary<'a>(
        &'a self,
        stream: &'a str,
    ) -> BoxFuture<'a, Result<StreamSummary, StreamError>> {
        Box::pin(self.run(
            "DescribeStreamSummary",
            self.inner.describe_stream_summary(stream),
        ))
    }

    fn register_stream_consumer<'a>(
        &'a self,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<crate::backend::Consumer, StreamError>> {
        Box::pin(self.run(
            "RegisterStreamConsumer",
            self.inner.register_stream_consumer(stream_arn, name),
        ))
    }

    fn describe_stream_consumer<'a>(
        &'a self,
        stream_arn: &'a str,
        name: &'a str,
    ) -> BoxFuture<'a, Result<crate::backend::Consumer, StreamError>> {
        Box::pin(self.run(
            "DescribeStreamConsumer",
            self.inner.describe_stream_consumer(stream_arn, name),
        ))
    }

    fn list_stream_consumers<'a>(
        &'a self,
        stream_arn: &'a str,
    ) -> BoxFuture<'a, Result<Vec<crate::backend::Consumer>, StreamError>> {
        Box::pin(self.run(
            "ListStreamConsumers",
            self.inner.list_stream_consumers(stream_arn),
        ))
    }

    fn deregister_stream_consumer<'a>(
        &'a self,
        consumer_arn: &'a str,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.run(
            "DeregisterStreamConsumer",
            self.inner.deregister_stream_consumer(consumer_arn),
        ))
    }

    /// The subscription's events go through the injector too, as op
    /// `SubscribeToShardEvent`: a transient fault there is a dropped connection.
    fn subscribe_to_shard<'a>(
        &'a self,
        consumer_arn: &'a str,
        shard: &'a ShardId,
        position: &'a IteratorPosition,
    ) -> BoxFuture<'a, Result<Box<dyn Subscription>, StreamError>> {
        Box::pin(async move {
            let inner = self
                .run(
                    "SubscribeToShard",
                    self.inner.subscribe_to_shard(consumer_arn, shard, position),
                )
                .await?;
            let faults = Faulty {
                inner: (),
                state: self.state.clone(),
                freezer: self.freezer.clone(),
            };
            Ok(Box::new(FaultySubscription { inner, faults }) as Box<dyn Subscription>)
        })
    }

    fn capabilities(&self) -> crate::backend::Capabilities {
        self.inner.capabilities()
    }
}

/// A subscription whose events pass the fault injector and the freezer.
struct FaultySubscription {
    inner: Box<dyn Subscription>,
    faults: Faulty<()>,
}

impl Subscription for FaultySubscription {
    fn next_event(
        &mut self,
    ) -> BoxFuture<'_, Result<Option<crate::backend::ShardEvent>, StreamError>> {
        Box::pin(
            self.faults
                .run("SubscribeToShardEvent", self.inner.next_event()),
        )
    }
}

impl<B: StreamAdmin> StreamAdmin for Faulty<B> {
    fn create_stream<'a>(
        &'a self,
        stream: &'a str,
        shards: u32,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.run("CreateStream", self.inner.create_stream(stream, shards)))
    }

    fn delete_stream<'a>(&'a self, stream: &'a str) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.run("DeleteStream", self.inner.delete_stream(stream)))
    }

    fn put_records<'a>(
        &'a self,
        stream: &'a str,
        records: &'a [PutRecord],
    ) -> BoxFuture<'a, Result<Vec<PutResult>, StreamError>> {
        Box::pin(self.run("PutRecords", self.inner.put_records(stream, records)))
    }

    fn split_shard<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        new_starting_hash_key: u128,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.run(
            "SplitShard",
            self.inner.split_shard(stream, shard, new_starting_hash_key),
        ))
    }

    fn merge_shards<'a>(
        &'a self,
        stream: &'a str,
        shard: &'a ShardId,
        adjacent: &'a ShardId,
    ) -> BoxFuture<'a, Result<(), StreamError>> {
        Box::pin(self.run(
            "MergeShards",
            self.inner.merge_shards(stream, shard, adjacent),
        ))
    }
}

impl<B: LeaseTable> LeaseTable for Faulty<B> {
    fn table_name(&self) -> &str {
        self.inner.table_name()
    }

    fn worker_table_name(&self) -> &str {
        self.inner.worker_table_name()
    }

    fn ensure_table(&self) -> BoxFuture<'_, Result<TableState, LeaseError>> {
        Box::pin(self.run("ensure_table", self.inner.ensure_table()))
    }

    fn scan(&self) -> BoxFuture<'_, Result<ScanOutput, LeaseError>> {
        Box::pin(async move {
            let scan = self.run("scan", self.inner.scan()).await?;
            let rows =
                scan.leases.len() + scan.heartbeats.len() + scan.malformed.len() + scan.other_rows;
            self.count_items("scan", rows);
            self.count_units("scan", scan.read_units);
            Ok(scan)
        })
    }

    fn get<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<Option<Lease>, LeaseError>> {
        Box::pin(async move {
            let got = self.run("get", self.inner.get(key)).await?;
            self.count_items("get", 1);
            Ok(got)
        })
    }

    fn create_if_absent<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.run("create_if_absent", self.inner.create_if_absent(lease)))
    }

    fn take<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(self.run("take", self.inner.take(key, expected, new_owner)))
    }

    fn take_expired<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
        owner_heartbeat: Option<u64>,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(
            self.run(
                "take",
                self.inner
                    .take_expired(key, expected, new_owner, owner_heartbeat),
            ),
        )
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.run("release", self.inner.release(key, expected)))
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.run("renew", self.inner.renew(key, expected)))
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        checkpoint: &'a Checkpoint,
        children: &'a [ShardId],
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run(
            "checkpoint",
            self.inner.checkpoint(key, expected, checkpoint, children),
        ))
    }

    fn prepare_checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        pending: &'a ExtendedSequenceNumber,
        state: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run(
            "prepare_checkpoint",
            self.inner.prepare_checkpoint(key, expected, pending, state),
        ))
    }

    fn delete<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run("delete", self.inner.delete(key, expected)))
    }

    fn request_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run(
            "request_handoff",
            self.inner.request_handoff(key, expected, requester),
        ))
    }

    fn transfer<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        to: &'a WorkerId,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.run("transfer", self.inner.transfer(key, expected, to)))
    }

    fn clear_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run("clear_handoff", self.inner.clear_handoff(key, requester)))
    }

    fn heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        load: &'a WorkerLoad,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.run("heartbeat", self.inner.heartbeat(worker, load)))
    }

    fn remove_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run("remove_heartbeat", self.inner.remove_heartbeat(worker)))
    }

    fn join_roster<'a>(&'a self, workers: &'a [WorkerId]) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.run("join_roster", self.inner.join_roster(workers)))
    }

    fn heartbeats(
        &self,
        detail: HeartbeatDetail,
    ) -> BoxFuture<'_, Result<HeartbeatsOutput, LeaseError>> {
        Box::pin(async move {
            let out = self
                .run("heartbeats", self.inner.heartbeats(detail))
                .await?;
            self.count_items("heartbeats", out.items_read);
            self.count_units("heartbeats", out.read_units);
            if out.summary {
                // Which of the reads went through the heartbeat index.
                *self.lock().calls.entry("heartbeats_summary").or_insert(0) += 1;
            }
            Ok(out)
        })
    }

    fn remove_dead_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        counter: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.run(
            "remove_dead_heartbeat",
            self.inner.remove_dead_heartbeat(worker, counter),
        ))
    }

    fn retire_legacy<'a>(
        &'a self,
        plan: &'a crate::backend::layout::Retirement,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.run("retire_legacy", self.inner.retire_legacy(plan)))
    }

    fn stamp_source<'a>(
        &'a self,
        key: &'a LeaseKey,
        source: &'a str,
        created: Option<u64>,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.run(
            "stamp_source",
            self.inner.stamp_source(key, source, created, overwrite),
        ))
    }
}

impl<B: MetricsSink> MetricsSink for Faulty<B> {
    fn put<'a>(
        &'a self,
        namespace: &'a str,
        data: Vec<MetricDatum>,
    ) -> BoxFuture<'a, Result<(), MetricsError>> {
        Box::pin(self.run("PutMetricData", self.inner.put(namespace, data)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryDynamo;

    fn plan() -> FaultPlan {
        let mut plan = FaultPlan::seeded(7);
        plan.throttle = 0.2;
        plan.transient = 0.2;
        plan
    }

    async fn outcomes(table: &Faulty<crate::backend::memory::MemoryLeaseTable>) -> Vec<bool> {
        let me = WorkerId::new("w");
        let mut out = Vec::new();
        for _ in 0..200 {
            out.push(table.heartbeat(&me, &WorkerLoad::default()).await.is_ok());
        }
        out
    }

    #[tokio::test(start_paused = true)]
    async fn the_same_seed_replays_the_same_faults() {
        let make = || {
            let db = MemoryDynamo::new();
            db.create_table("t", "leaseKey", "S");
            db.create_table(
                &crate::backend::layout::worker_table_name("t"),
                "leaseKey",
                "S",
            );
            Faulty::new(db.lease_table("t"), plan())
        };
        let (a, b) = (make(), make());
        let (ra, rb) = (outcomes(&a).await, outcomes(&b).await);
        assert_eq!(ra, rb);
        let failures = ra.iter().filter(|ok| !**ok).count();
        assert!(
            (40..120).contains(&failures),
            "about 36% of 200 calls should fail, got {failures}"
        );
        assert_eq!(a.injected(), b.injected());
    }

    #[tokio::test(start_paused = true)]
    async fn scheduled_faults_hit_the_named_call() {
        let db = MemoryDynamo::new();
        db.create_table("t", "leaseKey", "S");
        db.create_table(
            &crate::backend::layout::worker_table_name("t"),
            "leaseKey",
            "S",
        );
        let plan = FaultPlan::seeded(1)
            .then(Some("heartbeat"), 1, Fault::LostResponse)
            .then(Some("heartbeat"), 2, Fault::Throttle);
        let table = Faulty::new(db.lease_table("t"), plan);
        let me = WorkerId::new("w");
        assert_eq!(table.heartbeat(&me, &WorkerLoad::default()).await, Ok(1));
        // The lost response took effect: the counter moved to 2 though the caller saw an error.
        assert!(matches!(
            table.heartbeat(&me, &WorkerLoad::default()).await,
            Err(LeaseError::Transient { .. })
        ));
        assert!(matches!(
            table.heartbeat(&me, &WorkerLoad::default()).await,
            Err(LeaseError::Throttled { .. })
        ));
        assert_eq!(table.heartbeat(&me, &WorkerLoad::default()).await, Ok(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_scheduled_panic_panics_that_call_only_without_effect() {
        use futures::FutureExt;

        let db = MemoryDynamo::new();
        db.create_table("t", "leaseKey", "S");
        db.create_table(
            &crate::backend::layout::worker_table_name("t"),
            "leaseKey",
            "S",
        );
        let table = Faulty::new(db.lease_table("t"), FaultPlan::seeded(1));
        let me = WorkerId::new("w");
        assert_eq!(table.heartbeat(&me, &WorkerLoad::default()).await, Ok(1));
        let next = table.calls("heartbeat");
        table.set_plan(FaultPlan::seeded(2).then(Some("heartbeat"), next, Fault::Panic));
        let caught = std::panic::AssertUnwindSafe(table.heartbeat(&me, &WorkerLoad::default()))
            .catch_unwind()
            .await;
        assert!(caught.is_err(), "the call panicked");
        assert_eq!(
            table.heartbeat(&me, &WorkerLoad::default()).await,
            Ok(2),
            "the panicked call had no effect"
        );
        assert_eq!(table.injected(), vec![("heartbeat", Fault::Panic)]);
    }

    #[tokio::test(start_paused = true)]
    async fn timeouts_and_latency_use_tokio_time() {
        let db = MemoryDynamo::new();
        db.create_table("t", "leaseKey", "S");
        db.create_table(
            &crate::backend::layout::worker_table_name("t"),
            "leaseKey",
            "S",
        );
        let mut plan = FaultPlan::seeded(1).then(None, 0, Fault::Timeout).then(
            None,
            1,
            Fault::Latency(Duration::from_millis(250)),
        );
        plan.timeout_after = Duration::from_secs(30);
        let table = Faulty::new(db.lease_table("t"), plan);
        let me = WorkerId::new("w");
        let start = tokio::time::Instant::now();
        let err = table
            .heartbeat(&me, &WorkerLoad::default())
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("injected timeout after 30s"),
            "{err}"
        );
        assert_eq!(start.elapsed(), Duration::from_secs(30));
        assert_eq!(table.heartbeat(&me, &WorkerLoad::default()).await, Ok(1));
        assert_eq!(start.elapsed(), Duration::from_millis(30_250));
    }
}
