//! Self-fencing: whether this worker may hand a shard's records to a processor now.
//!
//! One rule, written once, fed by the lease keeper and consulted by the shard readers
//! (before each fetch and before each delivery) and the processor hosts (before each
//! batch they pass to user code):
//!
//! 1. This worker's last heartbeat must have been confirmed within
//!    `failover_time - fence_margin`, counted from when that heartbeat was *sent*: while
//!    that holds, no peer can have seen the heartbeat stand still for the failover time,
//!    so none can have taken a lease of ours.
//! 2. After any longer gap in confirmed heartbeats, whatever caused it (the process was
//!    stopped, the VM froze, a partition healed, the table throttled), peers may have
//!    taken our leases meanwhile. The first heartbeat after the gap does *not* lift the
//!    fence: each held lease stays fenced until its row has been read again, by a read
//!    sent after that heartbeat, and shows the same owner and counter.
//! 3. A lease the keeper finds lost (another owner, the row gone or unreadable) is
//!    revoked here at once, before anyone is told: no batch is handed to a processor
//!    after the keeper knows.
//!
//! The gap is measured on this worker's own monotonic clock between the send times of
//! consecutive confirmed heartbeats, so it catches a stop of the whole process as well
//! as a stretch of failed writes: a heartbeat sent before a freeze and answered after it
//! confirms only its send time, and the next one then shows the gap.
//!
//! [`Board`] is the pure rule (time is a parameter, table-tested below); [`Fencing`] is
//! the board shared between the actors of one worker.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

use crate::model::{Fence, LeaseKey};

/// Why a shard may not deliver now. Shown in `/status` for each fenced shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "snake_case")]
pub enum FenceReason {
    /// No heartbeat confirmed within the fence time: peers may soon judge this worker
    /// dead. `silent_ms` is how long ago the last confirmed one was sent (`None`: never),
    /// `error` the last heartbeat failure.
    HeartbeatUnconfirmed {
        /// Milliseconds since the last confirmed heartbeat was sent; `None`: none yet.
        silent_ms: Option<u64>,
        /// The last heartbeat failure's error, if one failed since.
        error: Option<String>,
    },
    /// Heartbeats resumed after a gap of `gap_ms`, longer than the fence time; the
    /// lease's row has not been read again since, so it may belong to another worker.
    AwaitingReconfirmation {
        /// The gap between confirmed heartbeats, in milliseconds.
        gap_ms: u64,
    },
    /// The lease keeper found the lease is no longer this worker's.
    Revoked {
        /// Why, in words (another owner, a write under the lease refused, …).
        why: String,
    },
    /// `lease.java_compat`: the lease's counter has not been seen to move (taken or
    /// renewed) for `silent_ms`, from the send of the last confirmed renewal: a Java
    /// worker may soon judge it expired.
    RenewalUnconfirmed {
        /// Milliseconds since the send of the last write that moved the lease's counter.
        silent_ms: u64,
    },
    /// This worker does not hold the lease under this counter (any more).
    NotHeld,
}

impl fmt::Display for FenceReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FenceReason::HeartbeatUnconfirmed { silent_ms, error } => {
                match silent_ms {
                    Some(ms) => write!(f, "heartbeat not confirmed for {ms} ms")?,
                    None => f.write_str("no heartbeat confirmed yet")?,
                }
                if let Some(error) = error {
                    write!(f, " (last error: {error})")?;
                }
                Ok(())
            }
            FenceReason::AwaitingReconfirmation { gap_ms } => write!(
                f,
                "heartbeats resumed after a {gap_ms} ms gap; waiting to read the lease again"
            ),
            FenceReason::Revoked { why } => write!(f, "lease revoked: {why}"),
            FenceReason::RenewalUnconfirmed { silent_ms } => {
                write!(f, "lease renewal not confirmed for {silent_ms} ms")
            }
            FenceReason::NotHeld => f.write_str("the lease is not held under this counter"),
        }
    }
}

/// What this worker knows of one held lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Standing {
    counter: u64,
    /// When this worker last had proof the row was its own under `counter`: the send
    /// time of the take, or of a read that showed it.
    confirmed: Instant,
    /// The send time of the last write that moved the row's counter (the take, or a
    /// renewal under `lease.java_compat`): what a Java worker times the lease by.
    moved: Instant,
    revoked: Option<String>,
}

/// The fencing rule over plain observations. Every method takes the time it applies
/// to; nothing here reads a clock.
///
/// Comparable and hashable (leases in a `BTreeMap`), so the lease protocol model
/// (`lease_keeper/model.rs`) can keep a real board per worker in its states.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Board {
    fresh_for: Duration,
    /// Send time of the last confirmed heartbeat.
    heartbeat: Option<Instant>,
    /// Answer time of the first heartbeat confirmed after the last gap, and the gap.
    gap: Option<(Instant, Duration)>,
    /// Heartbeats failed since the last confirmed one, and the last error.
    failures: u32,
    last_error: Option<String>,
    leases: BTreeMap<LeaseKey, Standing>,
    /// `lease.java_compat`: a lease delivers only while its counter moved within
    /// `fresh_for` (rule 1 per lease, for Java workers that judge leases by their
    /// counters rather than by heartbeats).
    renewals: bool,
}

impl Board {
    /// `fresh_for`: `failover_time - fence_margin`.
    pub fn new(fresh_for: Duration) -> Self {
        Self {
            fresh_for,
            heartbeat: None,
            gap: None,
            failures: 0,
            last_error: None,
            leases: BTreeMap::new(),
            renewals: false,
        }
    }

    /// `lease.java_compat`: every lease must also have been renewed within `fresh_for`
    /// (from the send of its last confirmed renewal) to deliver, as the Java KCL's own
    /// holder stops using a lease it has not renewed within the failover time.
    pub fn require_renewals(&mut self) {
        self.renewals = true;
    }

    /// A heartbeat sent at `sent` was written, and the answer saying so came at
    /// `answered`. Peers saw it when it was applied, somewhere between the two; so they
    /// may have seen this worker's heartbeat stand still from the send of the one before
    /// it until `answered`. If that is the fence time or longer (or there was none
    /// before), every lease must be read again, by a read sent after `answered`, before
    /// it delivers: a peer may have taken it meanwhile.
    ///
    /// Measuring to the answer, not the send, matters when writes are slow: a heartbeat
    /// sent 6 s after the last one but applied 12 s after it left peers 12 s without a
    /// sign of life (found by the fault simulator, seed 18: a delayed heartbeat).
    pub fn heartbeat_confirmed(&mut self, sent: Instant, answered: Instant) {
        let gap = match self.heartbeat {
            Some(previous) if sent <= previous => return,
            Some(previous) => answered.saturating_duration_since(previous),
            None => Duration::MAX,
        };
        // Mutant LiftFenceAfterGap: the first heartbeat after a gap lifts the fence.
        if gap >= self.fresh_for
            && !crate::mutants::active(crate::mutants::Mutant::LiftFenceAfterGap)
        {
            self.gap = Some((answered.max(sent), gap));
        }
        self.heartbeat = Some(sent);
        self.failures = 0;
        self.last_error = None;
    }

    /// A heartbeat could not be confirmed (refused, unanswered, or its answer
    /// unreadable). Returns how many in a row.
    pub fn heartbeat_failed(&mut self, error: String) -> u32 {
        self.failures = self.failures.saturating_add(1);
        self.last_error = Some(error);
        self.failures
    }

    /// The rule before the gap was recorded (the first heartbeat after a gap lifted the
    /// fence): the lease protocol model calls it after each confirmed heartbeat to show
    /// that it finds the overlap this rule allowed.
    #[cfg(test)]
    pub(crate) fn forget_gap(&mut self) {
        self.gap = None;
    }

    /// This worker took the lease with a write sent at `sent`.
    pub fn hold(&mut self, key: &LeaseKey, fence: &Fence, sent: Instant) {
        self.leases.insert(
            key.clone(),
            Standing {
                counter: fence.counter,
                confirmed: sent,
                moved: sent,
                revoked: None,
            },
        );
    }

    /// A read sent at `sent` showed the lease still ours under this counter.
    pub fn reconfirm(&mut self, key: &LeaseKey, fence: &Fence, sent: Instant) {
        if let Some(standing) = self.leases.get_mut(key)
            && standing.counter == fence.counter
            && standing.revoked.is_none()
        {
            standing.confirmed = standing.confirmed.max(sent);
        }
    }

    /// A renewal sent at `sent` moved the lease's counter (`lease.java_compat`); `fence`
    /// is the counter the lease was taken with, as everyone but the renewer knows it.
    pub fn renewed(&mut self, key: &LeaseKey, fence: &Fence, sent: Instant) {
        if let Some(standing) = self.leases.get_mut(key)
            && standing.counter == fence.counter
            && standing.revoked.is_none()
        {
            standing.moved = standing.moved.max(sent);
        }
    }

    /// The lease is not ours (any more) under this counter: nothing more is delivered.
    pub fn revoke(&mut self, key: &LeaseKey, fence: &Fence, why: impl Into<String>) {
        if let Some(standing) = self.leases.get_mut(key)
            && standing.counter == fence.counter
            && standing.revoked.is_none()
        {
            standing.revoked = Some(why.into());
        }
    }

    /// The lease left this worker in an orderly way (handed over, released, finished).
    pub fn forget(&mut self, key: &LeaseKey, fence: &Fence) {
        if self
            .leases
            .get(key)
            .is_some_and(|s| s.counter == fence.counter)
        {
            self.leases.remove(key);
        }
    }

    /// Whether this worker's heartbeat is confirmed recently enough to deliver at all.
    pub fn heartbeat_fresh(&self, now: Instant) -> Result<(), FenceReason> {
        match self.heartbeat {
            Some(sent) if now.saturating_duration_since(sent) < self.fresh_for => Ok(()),
            sent => Err(FenceReason::HeartbeatUnconfirmed {
                silent_ms: sent.map(|s| millis(now.saturating_duration_since(s))),
                error: self.last_error.clone(),
            }),
        }
    }

    /// Whether the shard held under `fence` may hand records to its processor at `now`.
    pub fn check(&self, key: &LeaseKey, fence: &Fence, now: Instant) -> Result<(), FenceReason> {
        match self.leases.get(key) {
            Some(standing) if standing.counter == fence.counter => self.verdict(standing, now),
            _ => Err(FenceReason::NotHeld),
        }
    }

    fn verdict(&self, standing: &Standing, now: Instant) -> Result<(), FenceReason> {
        if let Some(why) = &standing.revoked {
            return Err(FenceReason::Revoked { why: why.clone() });
        }
        self.heartbeat_fresh(now)?;
        let unmoved = now.saturating_duration_since(standing.moved);
        if self.renewals && unmoved >= self.fresh_for {
            return Err(FenceReason::RenewalUnconfirmed {
                silent_ms: millis(unmoved),
            });
        }
        match self.gap {
            Some((ended, gap)) if standing.confirmed < ended => {
                Err(FenceReason::AwaitingReconfirmation {
                    gap_ms: millis(gap),
                })
            }
            _ => Ok(()),
        }
    }

    /// Whether a held lease (not revoked) still waits for a read sent after the last
    /// gap's end (condition 2): the keeper then reads its rows at once, rather than at
    /// its next scan, which may be minutes away when nothing changes.
    pub fn awaiting_reread(&self) -> bool {
        match self.gap {
            Some((ended, _)) => self
                .leases
                .values()
                .any(|s| s.revoked.is_none() && s.confirmed < ended),
            None => false,
        }
    }

    /// Heartbeats failed in a row, and the last error.
    pub fn failures(&self) -> (u32, Option<&str>) {
        (self.failures, self.last_error.as_deref())
    }

    /// Send time of the last confirmed heartbeat.
    pub fn last_confirmed(&self) -> Option<Instant> {
        self.heartbeat
    }

    /// How many held leases may not deliver at `now`.
    pub fn fenced_count(&self, now: Instant) -> usize {
        self.leases
            .values()
            .filter(|s| self.verdict(s, now).is_err())
            .count()
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The board of one worker, shared by its keeper, readers and processor hosts. Cheap
/// to clone; every access is a short, non-async critical section.
#[derive(Debug, Clone)]
pub(crate) struct Fencing(Arc<Mutex<Board>>);

impl Fencing {
    pub fn new(fresh_for: Duration) -> Self {
        Self(Arc::new(Mutex::new(Board::new(fresh_for))))
    }

    /// A poisoned lock means a panic while updating plain data: the data is still the
    /// last consistent write, so go on with it.
    pub fn lock(&self) -> MutexGuard<'_, Board> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the shard held under `fence` may hand records to its processor now.
    pub fn check(&self, key: &LeaseKey, fence: &Fence) -> Result<(), FenceReason> {
        self.lock().check(key, fence, Instant::now())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::WorkerId;

    const FRESH: Duration = Duration::from_secs(7);

    fn fence(counter: u64) -> Fence {
        Fence {
            owner: Some(WorkerId::new("me")),
            counter,
        }
    }

    /// One step of a scenario, at a time in seconds from its start.
    enum Step {
        Beat(f64),
        /// A heartbeat sent at the first time and answered at the second.
        SlowBeat(f64, f64),
        BeatFailed,
        Hold(u64, f64),
        Reconfirm(u64, f64),
        Revoke(u64),
        Forget(u64),
        /// The verdict for the lease held under this counter at this time.
        Expect(u64, f64, Verdict),
        /// Whether the keeper must read the rows again now (`awaiting_reread`).
        Rereads(bool),
        /// `lease.java_compat`: leases must be renewed too.
        RequireRenewals,
        /// A renewal of the lease held under this counter, sent at this time, confirmed.
        Renewed(u64, f64),
    }

    #[derive(Debug, PartialEq)]
    enum Verdict {
        Deliver,
        Unconfirmed,
        Reconfirming,
        Revoked,
        NotHeld,
        RenewalUnconfirmed,
    }

    fn run(name: &str, steps: &[Step]) {
        let start = Instant::now();
        let at = |s: f64| start + Duration::from_secs_f64(s);
        let key = LeaseKey::new("shardId-000000000000");
        let mut board = Board::new(FRESH);
        for (i, step) in steps.iter().enumerate() {
            match step {
                Step::Beat(t) => board.heartbeat_confirmed(at(*t), at(*t)),
                Step::SlowBeat(t, answered) => board.heartbeat_confirmed(at(*t), at(*answered)),
                Step::BeatFailed => {
                    board.heartbeat_failed("throttled".into());
                }
                Step::Hold(c, t) => board.hold(&key, &fence(*c), at(*t)),
                Step::Reconfirm(c, t) => board.reconfirm(&key, &fence(*c), at(*t)),
                Step::Revoke(c) => board.revoke(&key, &fence(*c), "taken by w2"),
                Step::Forget(c) => board.forget(&key, &fence(*c)),
                Step::RequireRenewals => board.require_renewals(),
                Step::Renewed(c, t) => board.renewed(&key, &fence(*c), at(*t)),
                Step::Rereads(want) => {
                    assert_eq!(board.awaiting_reread(), *want, "{name}: step {i}")
                }
                Step::Expect(c, t, want) => {
                    let got = match board.check(&key, &fence(*c), at(*t)) {
                        Ok(()) => Verdict::Deliver,
                        Err(FenceReason::HeartbeatUnconfirmed { .. }) => Verdict::Unconfirmed,
                        Err(FenceReason::AwaitingReconfirmation { .. }) => Verdict::Reconfirming,
                        Err(FenceReason::Revoked { .. }) => Verdict::Revoked,
                        Err(FenceReason::NotHeld) => Verdict::NotHeld,
                        Err(FenceReason::RenewalUnconfirmed { .. }) => Verdict::RenewalUnconfirmed,
                    };
                    assert_eq!(&got, want, "{name}: step {i}");
                }
            }
        }
    }

    /// `lease.java_compat`: a Java worker times a lease by its counter, so each lease
    /// delivers only while its last renewal (or the take) was sent within the fence
    /// time, whatever the heartbeats say; off, renewals do not matter.
    #[test]
    fn renewal_scenarios() {
        use Step::*;
        use Verdict::*;
        run(
            "renewed every 3 s with heartbeats: delivers throughout",
            &[
                RequireRenewals,
                Beat(0.0),
                Hold(1, 0.0),
                Beat(2.0),
                Renewed(1, 3.0),
                Beat(4.0),
                Beat(6.0),
                Renewed(1, 6.0),
                Expect(1, 6.9, Deliver),
                Beat(8.0),
                Renewed(1, 9.0),
                Expect(1, 9.5, Deliver),
            ],
        );
        run(
            "renewals stall while heartbeats go on: fenced at the fence time from the last one",
            &[
                RequireRenewals,
                Beat(0.0),
                Hold(1, 0.0),
                Renewed(1, 3.0),
                Beat(2.0),
                Beat(4.0),
                Beat(6.0),
                Beat(8.0),
                Expect(1, 9.9, Deliver),
                Expect(1, 10.0, RenewalUnconfirmed),
                // A renewal lands again: delivers again (nobody took it, or it would
                // have been refused).
                Renewed(1, 10.5),
                Expect(1, 10.6, Deliver),
            ],
        );
        run(
            "a renewal of another life changes nothing",
            &[
                RequireRenewals,
                Beat(0.0),
                Hold(2, 0.0),
                Beat(4.0),
                Renewed(1, 5.0),
                Beat(6.0),
                Expect(2, 7.0, RenewalUnconfirmed),
            ],
        );
        run(
            "off: no renewals needed",
            &[
                Beat(0.0),
                Hold(1, 0.0),
                Beat(4.0),
                Beat(8.0),
                Expect(1, 10.0, Deliver),
            ],
        );
    }

    #[test]
    fn scenarios() {
        use Step::*;
        use Verdict::*;
        run(
            "steady heartbeats keep a taken lease delivering",
            &[
                Beat(0.0),
                Hold(1, 0.1),
                Expect(1, 0.2, Deliver),
                Beat(2.0),
                Beat(4.0),
                Expect(1, 10.9, Deliver),
                Expect(1, 11.0, Unconfirmed),
            ],
        );
        run(
            "nothing delivers before the first heartbeat",
            &[Hold(1, 0.0), Expect(1, 0.1, Unconfirmed)],
        );
        run(
            "a frozen worker's first heartbeat after the gap does not lift the fence",
            &[
                Beat(0.0),
                Hold(1, 0.1),
                Beat(2.0),
                Rereads(false),
                // Frozen from 3 s to 30 s: stale while frozen...
                Expect(1, 30.0, Unconfirmed),
                // ...and after the first heartbeat it waits for the row to be read.
                Beat(30.0),
                Expect(1, 30.1, Reconfirming),
                Rereads(true),
                // A read sent before that heartbeat proves nothing.
                Reconfirm(1, 29.0),
                Expect(1, 30.1, Reconfirming),
                Rereads(true),
                Reconfirm(1, 30.05),
                Expect(1, 30.1, Deliver),
                Rereads(false),
            ],
        );
        run(
            "a heartbeat sent before a freeze and answered after confirms only its send time",
            &[
                Beat(0.0),
                Hold(1, 0.1),
                Beat(2.0),
                // Sent at 4 s, answered at 40 s: stale at once.
                Beat(4.0),
                Expect(1, 40.0, Unconfirmed),
                // The next one shows the 36 s gap.
                Beat(40.0),
                Reconfirm(1, 39.0),
                Expect(1, 40.1, Reconfirming),
            ],
        );
        run(
            "failed heartbeats longer than the fence time are a gap too",
            &[
                Beat(0.0),
                Hold(1, 0.1),
                BeatFailed,
                BeatFailed,
                BeatFailed,
                BeatFailed,
                Expect(1, 6.9, Deliver),
                Expect(1, 7.0, Unconfirmed),
                Beat(8.0),
                Expect(1, 8.1, Reconfirming),
                Reconfirm(1, 8.05),
                Expect(1, 8.1, Deliver),
            ],
        );
        run(
            "failed heartbeats shorter than the fence time are not",
            &[
                Beat(0.0),
                Hold(1, 0.1),
                BeatFailed,
                BeatFailed,
                Beat(6.0),
                Expect(1, 6.1, Deliver),
            ],
        );
        run(
            "a lease taken after the gap needs no second read",
            &[
                Beat(0.0),
                Beat(20.0),
                Hold(1, 20.1),
                Expect(1, 20.2, Deliver),
            ],
        );
        run(
            "revoked is final for that counter, and a new take starts afresh",
            &[
                Beat(0.0),
                Hold(1, 0.1),
                Revoke(1),
                Expect(1, 0.2, Revoked),
                Reconfirm(1, 0.3),
                Expect(1, 0.4, Revoked),
                Hold(3, 0.5),
                Expect(1, 0.6, NotHeld),
                Expect(3, 0.6, Deliver),
            ],
        );
        run(
            "news of another counter changes nothing",
            &[
                Beat(0.0),
                Hold(2, 0.1),
                Revoke(1),
                Forget(1),
                Expect(2, 0.2, Deliver),
                Forget(2),
                Expect(2, 0.3, NotHeld),
            ],
        );
        run(
            "a heartbeat sent soon after the last but answered late is a gap",
            &[
                Beat(0.0),
                Hold(1, 0.1),
                Reconfirm(1, 5.0),
                // Sent 6 s after the last, applied (and answered) 12 s after it: peers
                // saw no heartbeat for 12 s and may have taken the lease.
                SlowBeat(6.0, 12.0),
                Expect(1, 12.1, Reconfirming),
                // A read sent before the answer proves nothing: the take may come later.
                Reconfirm(1, 11.0),
                Expect(1, 12.2, Reconfirming),
                Reconfirm(1, 12.5),
                Expect(1, 12.6, Deliver),
            ],
        );
        run(
            "a slow answer within the fence time is no gap",
            &[
                Beat(0.0),
                Hold(1, 0.1),
                SlowBeat(2.0, 6.0),
                Expect(1, 6.1, Deliver),
            ],
        );
    }

    #[test]
    fn failures_count_until_a_heartbeat_is_confirmed() {
        let mut board = Board::new(FRESH);
        assert_eq!(board.heartbeat_failed("a".into()), 1);
        assert_eq!(board.heartbeat_failed("b".into()), 2);
        assert_eq!(board.failures(), (2, Some("b")));
        let now = Instant::now();
        assert_eq!(
            board.heartbeat_fresh(now),
            Err(FenceReason::HeartbeatUnconfirmed {
                silent_ms: None,
                error: Some("b".into())
            })
        );
        board.heartbeat_confirmed(now, now);
        assert_eq!(board.failures(), (0, None));
        assert_eq!(board.heartbeat_fresh(now), Ok(()));
    }
}
