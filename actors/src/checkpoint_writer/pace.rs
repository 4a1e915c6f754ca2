//! When to write one shard's checkpoint: the writer's pure core. No I/O, no clock
//! reads: the instant is a parameter.
//!
//! A worker killed before a shard's first write re-delivers everything that shard
//! processed since its lease began, and a periodic tick leaves up to a whole interval of
//! records unwritten even on a shard that was idle until just now. So a position is
//! written at once when the shard had no write in the last interval (the leading edge),
//! and while writes are recent the newest position waits for one write an interval
//! after the last (the trailing edge). Consecutive paced writes are therefore at least an
//! interval apart: a busy shard costs one write per interval, as with a tick, and an
//! idle one costs nothing.
//!
//! The leading write, too, goes through a message the writer sends itself (at once, no
//! timer) rather than inside the handler that got the position: positions already queued
//! behind it, as from a processor acking record by record, then go into the same write.
//!
//! Explicit flushes (shutdown, handoff, a processor's `flush`) and SHARD_END are not
//! paced: they are written when asked and only tell the pace that a write happened.

use std::time::Duration;

use tokio::time::Instant;

/// What the writer does for a shard now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Write the pending position now (one attempt; then report it with
    /// [`Pace::answered`]).
    WriteNow,
    /// Write at this instant: call [`Pace::due`] with it then (at once, behind the
    /// messages already queued, when it is now; the trailing write when it is later).
    WriteAt(Instant),
    /// Nothing to do: no position waits, or a write is already due for it.
    Wait,
}

/// One shard's write pacing.
#[derive(Debug, Clone)]
pub(crate) struct Pace {
    interval: Duration,
    /// When the last write of the shard (paced or not, successful or not) was answered.
    /// Counted from the answer, not the request: two writes an interval apart at the
    /// writer can then not land closer than that at the table.
    last_write: Option<Instant>,
    /// The instant of the one write due, if any; a `due` for any other instant is a
    /// stale timer and is ignored.
    scheduled: Option<Instant>,
}

impl Pace {
    pub(crate) fn new(interval: Duration) -> Self {
        Self {
            interval,
            last_write: None,
            scheduled: None,
        }
    }

    /// The shard's position moved forward at `now`.
    pub(crate) fn advanced(&mut self, now: Instant) -> Decision {
        if self.scheduled.is_some() {
            // The write already due will carry this position too.
            return Decision::Wait;
        }
        let at = match self.last_write {
            Some(last) if now < last + self.interval => last + self.interval,
            _ => now,
        };
        self.scheduled = Some(at);
        Decision::WriteAt(at)
    }

    /// The timer set for `at` fired at `now`; `pending` says whether a position waits.
    pub(crate) fn due(&mut self, at: Instant, now: Instant, pending: bool) -> Decision {
        if self.scheduled != Some(at) {
            return Decision::Wait;
        }
        self.scheduled = None;
        if !pending {
            return Decision::Wait;
        }
        match self.last_write {
            // Early (a flush since pushed the interval back, or a timer that fired
            // before its instant): not yet.
            Some(last) if now < last + self.interval => {
                let at = last + self.interval;
                self.scheduled = Some(at);
                Decision::WriteAt(at)
            }
            _ => Decision::WriteNow,
        }
    }

    /// A write of the shard was answered at `now`; `pending` says whether a position
    /// still waits (the write failed). A failed write is tried again an interval later,
    /// as a throttled one should be.
    pub(crate) fn answered(&mut self, now: Instant, pending: bool) -> Decision {
        self.last_write = Some(now);
        if !pending || self.scheduled.is_some() {
            return Decision::Wait;
        }
        let at = now + self.interval;
        self.scheduled = Some(at);
        Decision::WriteAt(at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Decision::{Wait, WriteAt, WriteNow};
    use proptest::prelude::*;

    const INTERVAL: Duration = Duration::from_millis(5_000);

    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// The position moved forward.
        Advance,
        /// The timer scheduled for this instant (ms) fired; the bool: a position waits.
        Due(u64, bool),
        /// A write was answered; the bool: a position still waits (it failed).
        Answered(bool),
    }
    use Step::{Advance, Answered, Due};

    /// Each row: (at ms, step, what the pace decides).
    type Row = (u64, Step, Decision);

    fn run(name: &str, t0: Instant, rows: &[Row]) {
        let mut pace = Pace::new(INTERVAL);
        for (n, (at, step, expected)) in rows.iter().enumerate() {
            let now = t0 + Duration::from_millis(*at);
            let got = match *step {
                Advance => pace.advanced(now),
                Due(when, pending) => pace.due(t0 + Duration::from_millis(when), now, pending),
                Answered(pending) => pace.answered(now, pending),
            };
            assert_eq!(got, *expected, "{name}, row {n} ({at} ms, {step:?})");
        }
    }

    #[test]
    fn scenarios() {
        let t0 = Instant::now();
        let at = |ms: u64| WriteAt(t0 + Duration::from_millis(ms));
        let table: &[(&str, &[Row])] = &[
            (
                "the first position is written at once",
                &[
                    (0, Advance, at(0)),
                    (0, Due(0, true), WriteNow),
                    (10, Answered(false), Wait),
                ],
            ),
            (
                "positions queued behind the first go into the leading write",
                &[
                    (0, Advance, at(0)),
                    (0, Advance, Wait),
                    (0, Advance, Wait),
                    (0, Due(0, true), WriteNow),
                    (10, Answered(false), Wait),
                ],
            ),
            (
                "a busy shard: leading write, then one trailing write per interval",
                &[
                    (0, Advance, at(0)),
                    (0, Due(0, true), WriteNow),
                    (10, Answered(false), Wait),
                    (200, Advance, at(5_010)),
                    (400, Advance, Wait),
                    (4_999, Advance, Wait),
                    (5_010, Due(5_010, true), WriteNow),
                    (5_020, Answered(false), Wait),
                    (5_100, Advance, at(10_020)),
                    (10_020, Due(10_020, true), WriteNow),
                    (10_025, Answered(false), Wait),
                ],
            ),
            (
                "after an interval with no write, the next position is written at once",
                &[
                    (0, Advance, at(0)),
                    (0, Due(0, true), WriteNow),
                    (10, Answered(false), Wait),
                    (5_010, Advance, at(5_010)),
                    (5_010, Due(5_010, true), WriteNow),
                    (5_015, Answered(false), Wait),
                    (60_000, Advance, at(60_000)),
                ],
            ),
            (
                "a timer with nothing left to write does nothing and is not re-armed",
                &[
                    (0, Advance, at(0)),
                    (0, Due(0, true), WriteNow),
                    (10, Answered(false), Wait),
                    (100, Advance, at(5_010)),
                    // A flush wrote the position before the trailing write was due.
                    (300, Answered(false), Wait),
                    (5_010, Due(5_010, false), Wait),
                    (5_400, Advance, at(5_400)),
                ],
            ),
            (
                "a flush after the timer was set pushes the trailing write back",
                &[
                    (0, Advance, at(0)),
                    (0, Due(0, true), WriteNow),
                    (10, Answered(false), Wait),
                    (100, Advance, at(5_010)),
                    (300, Answered(false), Wait),
                    (400, Advance, Wait),
                    (5_010, Due(5_010, true), at(5_300)),
                    (5_300, Due(5_300, true), WriteNow),
                ],
            ),
            (
                "a failed write is tried again an interval after its answer",
                &[
                    (0, Advance, at(0)),
                    (0, Due(0, true), WriteNow),
                    (30, Answered(true), at(5_030)),
                    (1_000, Advance, Wait),
                    (5_030, Due(5_030, true), WriteNow),
                    (5_040, Answered(true), at(10_040)),
                    (10_040, Due(10_040, true), WriteNow),
                    (10_045, Answered(false), Wait),
                ],
            ),
            (
                "a failed flush while a trailing write is due keeps that one",
                &[
                    (0, Advance, at(0)),
                    (0, Due(0, true), WriteNow),
                    (10, Answered(false), Wait),
                    (100, Advance, at(5_010)),
                    (200, Answered(true), Wait),
                    (5_010, Due(5_010, true), at(5_200)),
                    (5_200, Due(5_200, true), WriteNow),
                ],
            ),
            (
                "stale and early timers",
                &[
                    (0, Advance, at(0)),
                    (0, Due(0, true), WriteNow),
                    (10, Answered(false), Wait),
                    (100, Advance, at(5_010)),
                    // A timer of an earlier schedule: ignored, the real one still comes.
                    (2_000, Due(1_000, true), Wait),
                    // The real one, delivered early (never by tokio; by a bug, harmless).
                    (5_000, Due(5_010, true), at(5_010)),
                    (5_010, Due(5_010, true), WriteNow),
                    // Delivered twice: the second is stale.
                    (5_011, Due(5_010, true), Wait),
                ],
            ),
            (
                "a flush before any paced write starts the interval",
                &[
                    (0, Answered(false), Wait),
                    (1_000, Advance, at(5_000)),
                    (5_000, Due(5_000, true), WriteNow),
                ],
            ),
        ];
        for (name, rows) in table {
            run(name, t0, rows);
        }
    }

    /// The writer's loop over a pace, in virtual milliseconds: advances at the given
    /// instants, each write answered `latency` ms after it starts (failing when `fail`
    /// says so), timers fired when due. Returns when each write started and when each
    /// advance was covered by a successful write.
    fn simulate(advances: &[u64], latency: u64, fail: &[bool]) -> (Vec<u64>, Vec<u64>) {
        let t0 = Instant::now();
        let ms = |t: Instant| (t - t0).as_millis() as u64;
        let mut pace = Pace::new(INTERVAL);
        let mut timers: Vec<u64> = Vec::new();
        let mut writes = Vec::new();
        let mut covered = vec![u64::MAX; advances.len()];
        // Advances not yet covered by a successful write.
        let mut waiting: Vec<usize> = Vec::new();
        let mut next_advance = 0;
        let mut now = 0u64;
        let mut attempts = 0usize;
        loop {
            // The next event: an advance or a timer, whichever comes first (the writer
            // is a single actor: events wait while a write is in flight).
            let timer = timers.iter().copied().min();
            let advance = advances.get(next_advance).copied();
            let advance_first = match (advance, timer) {
                (None, None) => break,
                (Some(a), Some(t)) => a <= t,
                (Some(_), None) => true,
                (None, Some(_)) => false,
            };
            let mut decision = match (advance, timer) {
                (Some(a), _) if advance_first => {
                    now = now.max(a);
                    waiting.push(next_advance);
                    next_advance += 1;
                    pace.advanced(t0 + Duration::from_millis(now))
                }
                (_, Some(t)) => {
                    timers.retain(|x| *x != t);
                    now = now.max(t);
                    pace.due(
                        t0 + Duration::from_millis(t),
                        t0 + Duration::from_millis(now),
                        !waiting.is_empty(),
                    )
                }
                _ => break,
            };
            loop {
                match decision {
                    Decision::Wait => break,
                    Decision::WriteAt(at) => {
                        timers.push(ms(at));
                        break;
                    }
                    Decision::WriteNow => {
                        writes.push(now);
                        now += latency;
                        let failed = fail.get(attempts).copied().unwrap_or(false);
                        attempts += 1;
                        if !failed {
                            for i in waiting.drain(..) {
                                covered[i] = now;
                            }
                        }
                        decision =
                            pace.answered(t0 + Duration::from_millis(now), !waiting.is_empty());
                    }
                }
            }
        }
        (writes, covered)
    }

    proptest! {
        /// Paced writes are an interval apart at least (from one's answer to the next's
        /// start); every position is written, and within an interval of its advance
        /// (plus a write's latency) unless writes failed.
        #[test]
        fn writes_are_an_interval_apart_and_nothing_waits_longer(
            gaps in proptest::collection::vec(0u64..12_000, 1..60),
            latency in 0u64..200,
            fail in proptest::collection::vec(proptest::bool::weighted(0.2), 0..20),
        ) {
            let advances: Vec<u64> = gaps
                .iter()
                .scan(0u64, |t, g| {
                    *t += g;
                    Some(*t)
                })
                .collect();
            let (writes, covered) = simulate(&advances, latency, &fail);
            let interval = INTERVAL.as_millis() as u64;
            for pair in writes.windows(2) {
                prop_assert!(
                    pair[1] >= pair[0] + latency + interval,
                    "writes at {} and {} ms", pair[0], pair[1]
                );
            }
            let failures = fail.iter().take(writes.len()).filter(|f| **f).count() as u64;
            for (advance, done) in advances.iter().zip(&covered) {
                prop_assert!(*done != u64::MAX, "the advance at {advance} ms was never written");
                let bound = advance + (1 + failures) * (interval + latency) + latency;
                prop_assert!(*done <= bound, "advance at {advance} ms written at {done} ms");
            }
            // A write for every interval the shard was busy in, plus the leading one.
            let span = advances.last().unwrap() - advances[0];
            prop_assert!(writes.len() as u64 <= span / interval + 2 + failures);
        }
    }
}
