//! The failure policy of one batch, as a pure decision: which records to hand the
//! processor next, which to discard and why, and when to wait. The processor host
//! ([`super::driver`]) does what it says.
//!
//! The batch's records are worked through left to right, so the records of a key keep
//! their order whatever fails: a record is delivered only after every record before it
//! was processed or discarded. Pending work is a queue of ranges (indices into the
//! batch); the front one is what is handed over next.
//!
//! - A failure that names its record (a partial batch failure): the records before it
//!   are done, and the retries count against that record. Once they are spent, that one
//!   record is discarded and the rest are delivered.
//! - A failure that names none, with `bisect`: the range is split in two and the halves
//!   are delivered in order (a split is not a retry, as in Lambda); a single record is
//!   retried. Without `bisect`: the range is retried, and once its retries are spent,
//!   the whole range is discarded (the failing record is not known).
//! - Before each delivery, the records at the front older than `max_record_age` are
//!   discarded (arrival times rise along a shard, so the old ones are the front ones).
//! - With no destination nothing is discarded: a range past its retries is delivered
//!   again, and the step says it was refused, so the shard can report why it waits.

use std::collections::VecDeque;
use std::ops::Range;
use std::time::Duration;

pub(crate) use crate::protocol::Reason;

/// What the policy needs of `[failure]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Policy {
    /// `None`: retried without end.
    pub max_retries: Option<u32>,
    pub bisect: bool,
    pub max_record_age: Option<Duration>,
    /// Whether a destination is set: without one nothing is discarded.
    pub can_discard: bool,
}

/// What to do next with the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Step {
    /// Hand the processor these records. `retry` is how many times this range (or the
    /// record it starts with) failed before: wait before a retry. `refused` is set when
    /// the retries are spent and there is no destination to discard to.
    Deliver {
        range: Range<usize>,
        retry: u32,
        refused: bool,
    },
    /// Write these records to the destination, then call [`Plan::discarded`].
    Discard {
        range: Range<usize>,
        reason: Reason,
        /// How many times they were delivered (0 for records too old to deliver).
        attempts: u32,
    },
    /// Every record is processed or discarded.
    Done,
}

/// How one delivery went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Processed,
    /// The processor failed; `at` is the batch index of the record it named, if it named
    /// one inside the range.
    Failed {
        at: Option<usize>,
    },
}

/// The failure policy's progress through one batch.
#[derive(Debug, Clone)]
pub(crate) struct Plan {
    policy: Policy,
    /// Pending ranges, in order; they cover every record not yet done.
    pending: VecDeque<Range<usize>>,
    /// Failed deliveries of the front range (of its first record, after a named failure).
    failures: u32,
}

impl Plan {
    /// A batch of `len` records, none delivered yet.
    pub(crate) fn new(len: usize, policy: Policy) -> Self {
        let mut pending = VecDeque::new();
        if len > 0 {
            pending.push_back(0..len);
        }
        Self {
            policy,
            pending,
            failures: 0,
        }
    }

    /// The next step. `too_old(i)`: whether record `i` is older than `max_record_age` now.
    pub(crate) fn next(&self, too_old: impl Fn(usize) -> bool) -> Step {
        let Some(front) = self.pending.front().cloned() else {
            return Step::Done;
        };
        if self.policy.max_record_age.is_some() && self.policy.can_discard {
            let old = front.clone().take_while(|&i| too_old(i)).count();
            if old > 0 {
                return Step::Discard {
                    range: front.start..front.start + old,
                    reason: Reason::Age,
                    attempts: self.failures,
                };
            }
        }
        let spent = self
            .policy
            .max_retries
            .is_some_and(|max| self.failures > max);
        if spent && self.policy.can_discard {
            return Step::Discard {
                range: front,
                reason: Reason::Retries,
                attempts: self.failures,
            };
        }
        Step::Deliver {
            range: front,
            retry: self.failures,
            refused: spent,
        }
    }

    /// The front range was delivered, with this outcome.
    pub(crate) fn delivered(&mut self, outcome: Outcome) {
        let Some(front) = self.pending.pop_front() else {
            return;
        };
        match outcome {
            Outcome::Processed => self.failures = 0,
            Outcome::Failed { at: Some(at) } if front.contains(&at) => {
                if at > front.start {
                    // Progress: the records before it are done, and the count starts
                    // over for the record that failed.
                    self.failures = 0;
                }
                self.failures += 1;
                // Retried (and, once spent, discarded) alone, then the rest.
                if at + 1 < front.end {
                    self.pending.push_front(at + 1..front.end);
                }
                self.pending.push_front(at..at + 1);
                // A retry delivers the record with the rest again: join them back
                // until it is to be discarded, so a passing retry costs one call.
                if !self.spent() && self.pending.len() > 1 {
                    self.join_front();
                }
            }
            Outcome::Failed { .. } if self.policy.bisect && front.len() > 1 => {
                let middle = front.start + front.len() / 2;
                self.pending.push_front(middle..front.end);
                self.pending.push_front(front.start..middle);
                self.failures = 0;
            }
            Outcome::Failed { .. } => {
                self.failures += 1;
                self.pending.push_front(front);
            }
        }
    }

    /// The front `range` of a [`Step::Discard`] is written to the destination.
    pub(crate) fn discarded(&mut self, range: Range<usize>) {
        let Some(front) = self.pending.front_mut() else {
            return;
        };
        if range.start != front.start {
            return;
        }
        front.start = range.end.min(front.end);
        if front.start >= front.end {
            self.pending.pop_front();
        }
        self.failures = 0;
    }

    /// Records not yet processed or discarded.
    #[cfg(test)]
    pub(crate) fn remaining(&self) -> usize {
        self.pending.iter().map(ExactSizeIterator::len).sum()
    }

    fn spent(&self) -> bool {
        self.policy
            .max_retries
            .is_some_and(|max| self.failures > max)
    }

    /// Merges the two front ranges (adjacent, the first a single named record).
    fn join_front(&mut self) {
        if let (Some(first), Some(second)) = (self.pending.pop_front(), self.pending.pop_front()) {
            if first.end == second.start {
                self.pending.push_front(first.start..second.end);
            } else {
                self.pending.push_front(second);
                self.pending.push_front(first);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NEVER: fn(usize) -> bool = |_| false;

    fn policy(max_retries: Option<u32>, bisect: bool) -> Policy {
        Policy {
            max_retries,
            bisect,
            max_record_age: None,
            can_discard: true,
        }
    }

    /// Drives a plan against a processor that fails every range holding a bad record,
    /// naming it when `names` is set. Returns the deliveries and discards, in order.
    fn run(len: usize, bad: &[usize], policy: Policy, names: bool) -> (Vec<String>, Vec<usize>) {
        let mut plan = Plan::new(len, policy);
        let (mut log, mut processed) = (Vec::new(), Vec::new());
        for _ in 0..10_000 {
            match plan.next(NEVER) {
                Step::Done => return (log, processed),
                Step::Deliver { range, retry, .. } => {
                    log.push(format!("deliver {range:?} retry {retry}"));
                    let failed = range.clone().find(|i| bad.contains(i));
                    match failed {
                        None => {
                            processed.extend(range);
                            plan.delivered(Outcome::Processed);
                        }
                        Some(at) => {
                            // Naming the record, it did the ones before; otherwise it
                            // did nothing of the range (an all-or-nothing write).
                            if names {
                                processed.extend(range.start..at);
                            }
                            let at = names.then_some(at);
                            plan.delivered(Outcome::Failed { at });
                        }
                    }
                }
                Step::Discard {
                    range,
                    reason,
                    attempts,
                } => {
                    log.push(format!(
                        "discard {range:?} {} after {attempts}",
                        reason.as_str()
                    ));
                    plan.discarded(range);
                }
            }
        }
        panic!("the plan never finished: {log:?}");
    }

    #[test]
    fn each_policy_finds_and_routes_the_bad_records_and_delivers_the_rest_in_order() {
        struct Case {
            name: &'static str,
            len: usize,
            bad: &'static [usize],
            policy: Policy,
            names: bool,
            log: &'static [&'static str],
        }
        let cases = [
            Case {
                name: "a good batch: one call",
                len: 4,
                bad: &[],
                policy: policy(Some(2), true),
                names: false,
                log: &["deliver 0..4 retry 0"],
            },
            Case {
                name: "no bisect: the whole batch retried, then discarded",
                len: 4,
                bad: &[2],
                policy: policy(Some(1), false),
                names: false,
                log: &[
                    "deliver 0..4 retry 0",
                    "deliver 0..4 retry 1",
                    "discard 0..4 retries after 2",
                ],
            },
            Case {
                name: "bisect: halves down to the bad record, retried, then discarded alone",
                len: 4,
                bad: &[2],
                policy: policy(Some(1), true),
                names: false,
                log: &[
                    "deliver 0..4 retry 0",
                    "deliver 0..2 retry 0",
                    "deliver 2..4 retry 0",
                    "deliver 2..3 retry 0",
                    "deliver 2..3 retry 1",
                    "discard 2..3 retries after 2",
                    "deliver 3..4 retry 0",
                ],
            },
            Case {
                name: "bisect with no retries: the bad record discarded at its first failure",
                len: 8,
                bad: &[5],
                policy: policy(Some(0), true),
                names: false,
                log: &[
                    "deliver 0..8 retry 0",
                    "deliver 0..4 retry 0",
                    "deliver 4..8 retry 0",
                    "deliver 4..6 retry 0",
                    "deliver 4..5 retry 0",
                    "deliver 5..6 retry 0",
                    "discard 5..6 retries after 1",
                    "deliver 6..8 retry 0",
                ],
            },
            Case {
                name: "a named failure: the prefix is done, the record retried with the rest",
                len: 5,
                bad: &[2],
                policy: policy(Some(1), false),
                names: true,
                log: &[
                    "deliver 0..5 retry 0",
                    "deliver 2..5 retry 1",
                    "discard 2..3 retries after 2",
                    "deliver 3..5 retry 0",
                ],
            },
            Case {
                name: "two named failures: each counted on its own",
                len: 5,
                bad: &[1, 3],
                policy: policy(Some(0), true),
                names: true,
                log: &[
                    "deliver 0..5 retry 0",
                    "discard 1..2 retries after 1",
                    "deliver 2..5 retry 0",
                    "discard 3..4 retries after 1",
                    "deliver 4..5 retry 0",
                ],
            },
            Case {
                name: "the last record bad",
                len: 2,
                bad: &[1],
                policy: policy(Some(0), true),
                names: false,
                log: &[
                    "deliver 0..2 retry 0",
                    "deliver 0..1 retry 0",
                    "deliver 1..2 retry 0",
                    "discard 1..2 retries after 1",
                ],
            },
        ];
        for case in cases {
            let (log, processed) = run(case.len, case.bad, case.policy, case.names);
            assert_eq!(log, case.log, "{}", case.name);
            let good: Vec<usize> = (0..case.len).filter(|i| !case.bad.contains(i)).collect();
            if case.policy.bisect || case.names {
                assert_eq!(
                    processed, good,
                    "{}: the good records, once, in order",
                    case.name
                );
            }
        }
    }

    /// One bad record in 10,000 costs about log2(10,000) deliveries with bisect.
    #[test]
    fn bisection_costs_about_log2_of_the_batch() {
        let (log, processed) = run(10_000, &[6_123], policy(Some(0), true), false);
        let deliveries = log.iter().filter(|l| l.starts_with("deliver")).count();
        assert!(deliveries <= 2 * 14 + 1, "{deliveries}: {log:?}");
        assert_eq!(processed.len(), 9_999);
        assert!(processed.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn without_a_destination_nothing_is_discarded_and_the_step_says_refused() {
        let mut plan = Plan::new(
            3,
            Policy {
                can_discard: false,
                ..policy(Some(1), false)
            },
        );
        for retry in 0..4 {
            let step = plan.next(NEVER);
            assert_eq!(
                step,
                Step::Deliver {
                    range: 0..3,
                    retry,
                    refused: retry > 1,
                }
            );
            plan.delivered(Outcome::Failed { at: None });
        }
        assert_eq!(plan.remaining(), 3);
    }

    #[test]
    fn records_too_old_at_the_front_are_discarded_before_delivery() {
        let mut plan = Plan::new(
            5,
            Policy {
                max_record_age: Some(Duration::from_secs(60)),
                ..policy(None, false)
            },
        );
        let old = |i: usize| i < 2;
        assert_eq!(
            plan.next(old),
            Step::Discard {
                range: 0..2,
                reason: Reason::Age,
                attempts: 0,
            }
        );
        plan.discarded(0..2);
        assert_eq!(
            plan.next(old),
            Step::Deliver {
                range: 2..5,
                retry: 0,
                refused: false,
            }
        );
        // A record ages out between retries: discarded for its age, not its retries.
        plan.delivered(Outcome::Failed { at: None });
        assert_eq!(
            plan.next(|i| i < 3),
            Step::Discard {
                range: 2..3,
                reason: Reason::Age,
                attempts: 1,
            }
        );
        plan.discarded(2..3);
        assert_eq!(plan.remaining(), 2);
        plan.delivered(Outcome::Processed);
        assert_eq!(plan.next(NEVER), Step::Done);
    }

    /// Unlimited retries (the default): a failing range is retried without end.
    #[test]
    fn unlimited_retries_never_discard() {
        let mut plan = Plan::new(2, policy(None, false));
        for retry in 0..50 {
            assert_eq!(
                plan.next(NEVER),
                Step::Deliver {
                    range: 0..2,
                    retry,
                    refused: false,
                }
            );
            plan.delivered(Outcome::Failed { at: None });
        }
    }
}
