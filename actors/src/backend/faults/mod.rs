//! A wrapper that makes any backend misbehave on purpose: throttling, transient errors,
//! lost responses, latency and timeouts, by seeded probability or by schedule.
//!
//! Randomness comes from a seeded generator and delays from tokio's clock, so a failing
//! run replays exactly from its seed under paused time.
//!
//! * `plan`: what to inject ([`FaultPlan`], [`Fault`], [`Scheduled`]) and how each call's
//!   fault is drawn from it.
//! * `freezer`: [`Freezer`], a stopped process modelled in-process.
//! * this file: [`Faulty`], the wrapper: it counts calls, picks each call's fault and
//!   applies it (`Faulty::run`), and how each port spells an injected error
//!   ([`Injected`]).
//! * `lease_table`, `stream`, `metrics`: [`Faulty`] as each port, every call passed
//!   through `run` under its operation's name (the lease-table ports by their call
//!   hook, `crate::backend::hook`).

mod freezer;
mod lease_table;
mod metrics;
mod plan;
mod stream;

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::model::item::ReadUnits;

pub use freezer::Freezer;
pub use plan::{Fault, FaultPlan, Scheduled};

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
/// use flotilla_actors::backend::{LeaseError, LeaseTable, WorkerRows};
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
        let fault = state.plan.pick(&mut state.rng, op, nth, any_nth);
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

/// The endpoint injected transient errors name.
const ENDPOINT: &str = "fault injector";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::memory::MemoryDynamo;
    use crate::backend::{LeaseError, WorkerRows};
    use crate::model::{WorkerId, WorkerLoad};

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
