//! Retry delays and restart limits. Pure: the random draw and the current instant are
//! parameters, so the decisions replay exactly in tests.
//!
//! * [`Backoff`]: how long to wait before the next try of something that keeps failing
//!   (a throttled `GetRecords`, a lease table that does not answer).
//! * [`RestartIntensity`]: whether a supervisor should restart a child again, or give
//!   up because it keeps failing (Erlang's restart intensity).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// Exponential backoff with full jitter, the AWS way: the `n`th delay (from 0) is drawn
/// uniformly from `[min, min(max, min * 2^n)]`.
///
/// Jitter spreads the retries of workers that failed together (a throttled stream, a
/// DynamoDB blip) so they do not come back in lockstep; drawing from `min` rather than
/// zero keeps a floor, so no retry is immediate. A zero `min` means no delay at all,
/// which is what tests want.
///
/// ```
/// use flotilla_actors::backoff::Backoff;
/// use std::time::Duration;
///
/// let ms = Duration::from_millis;
/// let mut backoff = Backoff::new(ms(100), ms(1_000));
/// assert_eq!(backoff.next(0.5), ms(100)); // cap 100ms
/// assert_eq!(backoff.next(0.5), ms(150)); // cap 200ms
/// assert_eq!(backoff.next(0.0), ms(100)); // cap 400ms
/// assert_eq!(backoff.next(0.5), ms(450)); // cap 800ms
/// assert_eq!(backoff.cap(), ms(1_000)); // 1600ms, held to max
/// backoff.reset();
/// assert_eq!(backoff.cap(), ms(100));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    attempts: u32,
}

impl Backoff {
    /// A `max` below `min` is raised to `min`, so every delay is exactly `min`.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            attempts: 0,
        }
    }

    /// The floor of every delay, and the first delay's cap.
    pub fn min(&self) -> Duration {
        self.min
    }

    /// The most the cap grows to (never below [`Backoff::min`]).
    pub fn max(&self) -> Duration {
        self.max
    }

    /// Delays handed out since creation or the last [`Backoff::reset`].
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// The largest delay the next call to [`Backoff::next`] may return.
    pub fn cap(&self) -> Duration {
        if self.min.is_zero() {
            // Zero doubles to zero, however many times.
            return Duration::ZERO;
        }
        // In u128 nanoseconds, so a small `min` keeps doubling past 2^32 while `max`
        // allows; a shift or product that overflows is past any Duration, so `max`.
        let max = self.max.as_nanos();
        let doubled = 1u128
            .checked_shl(self.attempts)
            .and_then(|factor| self.min.as_nanos().checked_mul(factor));
        match doubled {
            // Below `max`, so it fits a Duration.
            Some(nanos) if nanos < max => Duration::new(
                (nanos / 1_000_000_000) as u64,
                (nanos % 1_000_000_000) as u32,
            ),
            _ => self.max,
        }
    }

    /// The next delay, placed in `[min, cap]` by `unit`, the caller's uniform draw from
    /// `[0, 1)`. A `unit` outside `[0, 1]` is clamped into it (NaN counts as 0), so a
    /// bad draw cannot panic or escape the bounds.
    pub fn next(&mut self, unit: f64) -> Duration {
        let cap = self.cap();
        self.attempts = self.attempts.saturating_add(1);
        let unit = if unit.is_nan() {
            0.0
        } else {
            unit.clamp(0.0, 1.0)
        };
        let span = cap - self.min;
        // Near Duration::MAX the f64 product can round past `span`; fall back to it.
        let jitter = Duration::try_from_secs_f64(span.as_secs_f64() * unit)
            .map_or(span, |jitter| jitter.min(span));
        self.min + jitter
    }

    /// [`Backoff::next`] with a draw from [`unit_draw`]. Not pure: actors call this;
    /// tests call `next`.
    pub fn next_random(&mut self) -> Duration {
        self.next(unit_draw())
    }

    /// Starts over from `min`, after a success.
    pub fn reset(&mut self) {
        self.attempts = 0;
    }
}

/// What a supervisor should do about a child that just failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Restart it. `attempt` counts the restarts within the window, this one included
    /// (from 1): a number to log, or to feed a [`Backoff`].
    Restart {
        /// Restarts within the window, this one included, from 1.
        attempt: u32,
    },
    /// It failed more than `max_restarts` times within the window: stop restarting it
    /// and escalate. `restarts_in_window` is always `max_restarts + 1`, for the log
    /// line: failures beyond that are not kept, as they cannot change a verdict.
    GiveUp {
        /// Failures counted in the window: `max_restarts + 1`.
        restarts_in_window: u32,
    },
}

/// Allows at most `max_restarts` restarts within any `window`; one more is a give-up.
///
/// A child that fails now and then is restarted forever; one that fails in a loop is
/// given up on, instead of burning the stream's read quota or the lease table's
/// capacity. Keeps at most `max_restarts + 1` instants: older ones cannot change a
/// verdict.
///
/// ```
/// use flotilla_actors::backoff::{RestartIntensity, Verdict};
/// use std::time::{Duration, Instant};
///
/// let mut intensity = RestartIntensity::new(2, Duration::from_secs(60));
/// let t0 = Instant::now();
/// assert_eq!(intensity.record(t0), Verdict::Restart { attempt: 1 });
/// assert_eq!(intensity.record(t0), Verdict::Restart { attempt: 2 });
/// assert_eq!(intensity.record(t0), Verdict::GiveUp { restarts_in_window: 3 });
/// // A minute on, the old failures have left the window.
/// let later = t0 + Duration::from_secs(60);
/// assert_eq!(intensity.record(later), Verdict::Restart { attempt: 1 });
/// ```
#[derive(Debug, Clone)]
pub struct RestartIntensity {
    max_restarts: u32,
    window: Duration,
    /// Recent restarts, oldest first, at most `max_restarts + 1`.
    recent: VecDeque<Instant>,
    total: u64,
}

impl RestartIntensity {
    /// `max_restarts == 0` gives up at the first failure; a zero `window` holds no past
    /// restart, so it never gives up unless `max_restarts` is 0.
    pub fn new(max_restarts: u32, window: Duration) -> Self {
        Self {
            max_restarts,
            window,
            recent: VecDeque::new(),
            total: 0,
        }
    }

    /// Restarts allowed within the window; one more gives up.
    pub fn max_restarts(&self) -> u32 {
        self.max_restarts
    }

    /// How long a restart counts against the limit.
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Records a failure at `now` and says whether to restart. A restart counts against
    /// the window while less than `window` has passed since it.
    ///
    /// `now` should not go backwards; if it does, it is taken as the latest instant
    /// recorded, which keeps the record ordered.
    pub fn record(&mut self, now: Instant) -> Verdict {
        let now = self.recent.back().map_or(now, |last| now.max(*last));
        while let Some(oldest) = self.recent.front() {
            if now.duration_since(*oldest) < self.window {
                break;
            }
            self.recent.pop_front();
        }
        self.recent.push_back(now);
        // The verdict only asks whether `max_restarts` earlier ones are still in the
        // window: the newest `max_restarts + 1` instants answer it.
        let keep = usize::try_from(self.max_restarts)
            .unwrap_or(usize::MAX)
            .saturating_add(1);
        while self.recent.len() > keep {
            self.recent.pop_front();
        }
        self.total = self.total.saturating_add(1);
        let in_window = u32::try_from(self.recent.len()).unwrap_or(u32::MAX);
        if in_window > self.max_restarts {
            Verdict::GiveUp {
                restarts_in_window: in_window,
            }
        } else {
            Verdict::Restart { attempt: in_window }
        }
    }

    /// Failures ever recorded, including those that gave up.
    pub fn count_total(&self) -> u64 {
        self.total
    }
}

thread_local! {
    /// This thread's seeded generator, when [`seed_jitter`] set one.
    static JITTER: std::cell::RefCell<Option<rand::rngs::StdRng>> =
        const { std::cell::RefCell::new(None) };
}

/// Seeds every jitter draw made on this thread from now on (`None`: back to the
/// OS-seeded generator). The fault simulator calls it before each run: a simulated fleet
/// runs on one current-thread runtime, so every retry delay and listing jitter of every
/// worker is drawn here, and the same seed replays the same delays.
pub fn seed_jitter(seed: Option<u64>) {
    use rand::SeedableRng;
    JITTER.with(|j| *j.borrow_mut() = seed.map(rand::rngs::StdRng::seed_from_u64));
}

/// A uniform draw in `[0, 1)` for jitter: from this thread's seeded generator if
/// [`seed_jitter`] set one, else from the thread-local OS-seeded one. The one source of
/// randomness on the actors' paths.
pub fn unit_draw() -> f64 {
    use rand::Rng;
    JITTER.with(|j| match j.borrow_mut().as_mut() {
        Some(rng) => rng.random::<f64>(),
        None => rand::random::<f64>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn backoff_table() {
        // (min, max, units drawn in turn, delays expected)
        let table: &[(u64, u64, &[f64], &[u64])] = &[
            // unit 0 gives min, whatever the cap.
            (100, 10_000, &[0.0, 0.0, 0.0], &[100, 100, 100]),
            // unit just under 1 gives nearly the cap: 100, 200, 400, 800, then max.
            (100, 1_000, &[0.999_999; 6], &[100, 199, 399, 799, 999, 999]),
            // unit 1 (out of range) is the cap exactly.
            (100, 1_000, &[1.0; 5], &[100, 200, 400, 800, 1_000]),
            // Out-of-range and NaN draws are clamped.
            (
                100,
                1_000,
                &[-3.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY],
                &[100, 100, 400, 100],
            ),
            // Half way between min and the cap.
            (10, 1_000, &[0.5; 4], &[10, 15, 25, 45]),
            // max below min is raised to min.
            (500, 100, &[0.9; 3], &[500, 500, 500]),
            // A zero min is no backoff at all.
            (0, 1_000, &[0.9; 3], &[0, 0, 0]),
        ];
        for (min, max, units, want) in table {
            let mut backoff = Backoff::new(ms(*min), ms(*max));
            let got: Vec<u64> = units
                .iter()
                .map(|u| backoff.next(*u).as_millis() as u64)
                .collect();
            assert_eq!(&got, want, "min {min}ms, max {max}ms, units {units:?}");
            assert_eq!(backoff.attempts(), units.len() as u32);
        }
    }

    /// Past 32 doublings: a zero `min` stays zero, and a small `min` under a huge `max`
    /// keeps doubling instead of jumping to `max` (both once found by proptest).
    #[test]
    fn caps_past_32_doublings() {
        let mut zero = Backoff::new(Duration::ZERO, ms(1));
        zero.attempts = 40;
        assert_eq!(zero.cap(), Duration::ZERO);
        zero.attempts = 200;
        assert_eq!(zero.next(0.9), Duration::ZERO);

        let huge = Duration::from_secs(u64::MAX);
        let mut small = Backoff::new(Duration::from_nanos(1), huge);
        for (attempts, want) in [(32, 1u64 << 32), (40, 1 << 40), (63, 1 << 63)] {
            small.attempts = attempts;
            assert_eq!(
                small.cap(),
                Duration::from_nanos(want),
                "attempt {attempts}"
            );
        }
        small.attempts = 127;
        assert_eq!(small.cap(), huge);
        small.attempts = 128;
        assert_eq!(small.cap(), huge);
    }

    #[test]
    fn reset_starts_over() {
        let mut backoff = Backoff::new(ms(10), ms(1_000));
        for _ in 0..5 {
            backoff.next(0.5);
        }
        assert_eq!(backoff.cap(), ms(320));
        backoff.reset();
        assert_eq!(backoff.attempts(), 0);
        assert_eq!(backoff.cap(), ms(10));
        assert_eq!(backoff.next(0.9), ms(10));
    }

    #[test]
    fn huge_durations_and_attempts_do_not_overflow() {
        let mut backoff = Backoff::new(Duration::from_secs(u64::MAX / 4), Duration::MAX);
        for _ in 0..10_000 {
            let delay = backoff.next(0.999_999_999);
            assert!(delay <= Duration::MAX);
        }
        assert_eq!(backoff.cap(), Duration::MAX);
        // Seconds this large lose their nanoseconds in an f64: near the cap, not at it.
        let delay = backoff.next(1.0);
        assert!(Duration::MAX - delay < Duration::from_secs(1), "{delay:?}");
        backoff.attempts = u32::MAX;
        assert_eq!(backoff.next(0.0), Duration::from_secs(u64::MAX / 4));
        assert_eq!(backoff.attempts(), u32::MAX);
    }

    #[test]
    fn next_random_stays_in_bounds() {
        let mut backoff = Backoff::new(ms(5), ms(80));
        for _ in 0..1_000 {
            let cap = backoff.cap();
            let delay = backoff.next_random();
            assert!(
                ms(5) <= delay && delay <= cap,
                "{delay:?} outside [5ms, {cap:?}]"
            );
        }
    }

    /// Steps: milliseconds since the start at which a failure is recorded, and the
    /// verdict expected.
    #[test]
    fn intensity_table() {
        use Verdict::{GiveUp, Restart};
        let r = |attempt| Restart { attempt };
        let g = |restarts_in_window| GiveUp { restarts_in_window };
        // (name, max_restarts, window in ms, steps)
        type Row<'a> = (&'a str, u32, u64, &'a [(u64, Verdict)]);
        let table: &[Row] = &[
            (
                "exactly max within the window, one more gives up",
                3,
                1_000,
                &[(0, r(1)), (100, r(2)), (200, r(3)), (300, g(4))],
            ),
            (
                "a restart leaves the window when `window` has passed",
                2,
                1_000,
                &[
                    (0, r(1)),
                    (500, r(2)),
                    (999, g(3)),
                    (1_500, r(2)),
                    (1_998, g(3)),
                    (2_998, r(1)),
                ],
            ),
            (
                "spaced failures restart forever",
                1,
                1_000,
                &[(0, r(1)), (1_000, r(1)), (2_000, r(1)), (3_500, r(1))],
            ),
            (
                "give-ups keep counting at max + 1",
                1,
                1_000,
                &[(0, r(1)), (1, g(2)), (2, g(2)), (3, g(2)), (1_003, r(1))],
            ),
            (
                "zero restarts allowed",
                0,
                1_000,
                &[(0, g(1)), (5_000, g(1))],
            ),
            (
                "zero window holds nothing",
                1,
                0,
                &[(0, r(1)), (0, r(1)), (0, r(1))],
            ),
            (
                "after a quiet window, the full allowance again",
                2,
                100,
                &[
                    (0, r(1)),
                    (1, r(2)),
                    (2, g(3)),
                    (102, r(1)),
                    (103, r(2)),
                    (104, g(3)),
                ],
            ),
        ];
        let start = Instant::now();
        for (name, max, window, steps) in table {
            let mut intensity = RestartIntensity::new(*max, ms(*window));
            for (at, want) in *steps {
                assert_eq!(
                    intensity.record(start + ms(*at)),
                    *want,
                    "{name}, at {at}ms"
                );
            }
            assert_eq!(intensity.count_total(), steps.len() as u64, "{name}");
        }
    }

    #[test]
    fn time_going_backwards_counts_as_now() {
        let start = Instant::now() + Duration::from_secs(10);
        let mut intensity = RestartIntensity::new(2, ms(100));
        assert_eq!(intensity.record(start), Verdict::Restart { attempt: 1 });
        let earlier = start - Duration::from_secs(5);
        assert_eq!(intensity.record(earlier), Verdict::Restart { attempt: 2 });
        assert_eq!(
            intensity.record(start + ms(99)),
            Verdict::GiveUp {
                restarts_in_window: 3
            }
        );
        assert_eq!(
            intensity.record(start + ms(100)),
            Verdict::Restart { attempt: 2 }
        );
    }

    fn duration() -> impl Strategy<Value = Duration> {
        prop_oneof![
            (0u64..10_000).prop_map(Duration::from_millis),
            any::<u64>().prop_map(Duration::from_nanos),
            (any::<u64>(), 0u32..1_000_000_000).prop_map(|(s, n)| Duration::new(s, n)),
            Just(Duration::MAX),
        ]
    }

    proptest! {
        #[test]
        fn delays_stay_in_bounds_and_caps_grow(
            min in duration(),
            max in duration(),
            units in prop::collection::vec(any::<f64>(), 1..100),
        ) {
            let mut backoff = Backoff::new(min, max);
            let max = max.max(min);
            let mut last_cap = Duration::ZERO;
            for (n, unit) in units.into_iter().enumerate() {
                let cap = backoff.cap();
                prop_assert!(cap >= last_cap, "cap fell from {:?} to {:?}", last_cap, cap);
                prop_assert!(min <= cap && cap <= max);
                // The cap is min * 2^n until it reaches max.
                let doubled = 2u128.checked_pow(n as u32).and_then(|f| min.as_nanos().checked_mul(f));
                let want = doubled.map_or(max.as_nanos(), |d| d.min(max.as_nanos()));
                prop_assert_eq!(cap.as_nanos(), want);
                let delay = backoff.next(unit);
                prop_assert!(min <= delay && delay <= cap, "{:?} outside [{:?}, {:?}]", delay, min, cap);
                last_cap = cap;
            }
        }

        #[test]
        fn delays_are_monotone_in_the_draw(min in duration(), max in duration(), attempts in 0u32..10_000, a in 0f64..1.0, b in 0f64..1.0) {
            let mut backoff = Backoff::new(min, max);
            backoff.attempts = attempts;
            let mut other = backoff.clone();
            let (low, high) = (a.min(b), a.max(b));
            prop_assert!(backoff.next(low) <= other.next(high));
        }

        #[test]
        fn intensity_matches_a_sliding_window(
            max_restarts in 0u32..8,
            window_ms in 0u64..1_000,
            gaps in prop::collection::vec(0u64..400, 1..200),
        ) {
            let start = Instant::now();
            let window = ms(window_ms);
            let mut intensity = RestartIntensity::new(max_restarts, window);
            let mut seen: Vec<Instant> = Vec::new();
            let mut now = start;
            for gap in gaps {
                now += ms(gap);
                seen.push(now);
                let in_window = seen.iter().filter(|t| now.duration_since(**t) < window).count() as u32;
                // The recorded failure itself is always in the window.
                let in_window = in_window.max(1);
                let want = if in_window > max_restarts {
                    Verdict::GiveUp { restarts_in_window: in_window.min(max_restarts + 1) }
                } else {
                    Verdict::Restart { attempt: in_window }
                };
                prop_assert_eq!(intensity.record(now), want);
                prop_assert!(intensity.recent.len() <= max_restarts as usize + 1);
            }
            prop_assert_eq!(intensity.count_total(), seen.len() as u64);
        }
    }
}
