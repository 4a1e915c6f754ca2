//! What to inject: the fault plan (probabilities per call, faults at fixed points) and
//! how a call's fault is drawn from it with a seeded generator, so that the same seed
//! and the same calls give the same faults.

use std::time::Duration;

use rand::Rng;
use rand::rngs::StdRng;

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
    /// The call is sent and takes effect, then the process stops ([`Freezer::freeze`](super::Freezer::freeze)
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

impl FaultPlan {
    /// The fault for call `nth` of `op`, the `any_nth` call of all operations (both
    /// counting from 0): a scheduled one if any, else drawn from `rng` by the
    /// probabilities, in the order the struct's doc gives, for an operation the random
    /// faults apply to.
    pub(super) fn pick(
        &self,
        rng: &mut StdRng,
        op: &'static str,
        nth: u64,
        any_nth: u64,
    ) -> Option<Fault> {
        let scheduled = self.schedule.iter().find(|s| match s.op {
            Some(o) => o == op && s.nth == nth,
            None => s.nth == any_nth,
        });
        if let Some(s) = scheduled {
            Some(s.fault)
        } else if self.only_ops.is_empty() || self.only_ops.contains(&op) {
            let mut draw = |p: f64| p > 0.0 && rng.random_bool(p.min(1.0));
            if draw(self.throttle) {
                Some(Fault::Throttle)
            } else if draw(self.transient) {
                Some(Fault::Transient)
            } else if draw(self.lost_response) {
                Some(Fault::LostResponse)
            } else if draw(self.late_answer) {
                let (lo, hi) = self
                    .latency
                    .unwrap_or((self.timeout_after, self.timeout_after));
                Some(Fault::LateAnswer(if hi > lo {
                    rng.random_range(lo..=hi)
                } else {
                    lo
                }))
            } else if draw(self.timeout) {
                Some(Fault::Timeout)
            } else if draw(self.panic) {
                Some(Fault::Panic)
            } else {
                self.latency.map(|(lo, hi)| {
                    Fault::Latency(if hi > lo {
                        rng.random_range(lo..=hi)
                    } else {
                        lo
                    })
                })
            }
        } else {
            None
        }
    }
}

#[allow(clippy::unwrap_used, clippy::expect_used)]
#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    /// A call: its operation, its nth of that operation, its nth of all.
    type Call = (&'static str, u64, u64);

    /// The picks of `calls` under `plan`.
    fn picks(plan: &FaultPlan, calls: &[Call]) -> Vec<Option<Fault>> {
        let mut rng = StdRng::seed_from_u64(plan.seed);
        calls
            .iter()
            .map(|&(op, nth, any_nth)| plan.pick(&mut rng, op, nth, any_nth))
            .collect()
    }

    #[test]
    fn scheduled_faults_come_first_and_hit_only_their_call() {
        let mut plan = FaultPlan::seeded(3)
            .then(Some("get"), 1, Fault::Throttle)
            .then(None, 2, Fault::Panic);
        plan.only_ops = vec!["scan"];
        plan.throttle = 1.0;
        let cases: [(&str, Call, Option<Fault>); 5] = [
            ("another op's call: no fault", ("get", 0, 0), None),
            ("get's second call", ("get", 1, 1), Some(Fault::Throttle)),
            ("the third call of all", ("renew", 0, 2), Some(Fault::Panic)),
            (
                "random faults only where only_ops says",
                ("scan", 0, 3),
                Some(Fault::Throttle),
            ),
            ("nor anywhere else", ("renew", 1, 4), None),
        ];
        for (name, call, want) in cases {
            assert_eq!(picks(&plan, &[call]), vec![want], "{name}");
        }
    }

    #[test]
    fn the_same_seed_draws_the_same_faults_and_latency_stays_in_its_range() {
        let mut plan = FaultPlan::seeded(11);
        plan.transient = 0.3;
        plan.latency = Some((Duration::from_millis(10), Duration::from_millis(20)));
        let calls: Vec<_> = (0..100).map(|n| ("op", n, n)).collect();
        let first = picks(&plan, &calls);
        assert_eq!(first, picks(&plan, &calls));
        let transient = first
            .iter()
            .filter(|f| **f == Some(Fault::Transient))
            .count();
        assert!(
            (15..50).contains(&transient),
            "about 30 of 100: {transient}"
        );
        for fault in first {
            match fault {
                Some(Fault::Transient) => {}
                Some(Fault::Latency(d)) => assert!(
                    (Duration::from_millis(10)..=Duration::from_millis(20)).contains(&d),
                    "{d:?}"
                ),
                other => panic!("only transient faults and latency: {other:?}"),
            }
        }
    }
}
