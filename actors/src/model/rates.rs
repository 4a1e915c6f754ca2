//! Each held lease's throughput, as its owner publishes it with every heartbeat: an
//! exponentially weighted moving average of records/s and bytes/s over heartbeat
//! intervals, so one bursty interval does not move a shard (balance acts on these
//! rates, and a rate that jumps with every beat would move leases back and forth).
//!
//! A lease just taken is first read from its checkpoint: the backlog behind it is not
//! the shard's traffic. Its average starts from an interval that began with the reader
//! caught up, since the first interval measured weighs fully: seeded with a catch-up
//! burst (in fan-out mode the backlog arrives an interval late, after the
//! subscription's start), a lease taken by a joiner looked hot for several beats, and
//! the other workers asked for it back (each lease of a join moved up to 3 times in a
//! fleet test).
//!
//! Pure: the cumulative counts and the time are parameters.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::{LeaseKey, LeaseRate};

/// Weight of the newest interval in the average, for an interval of
/// [`SMOOTHING_INTERVAL`]: an interval's weight halves in about 4 s, a lasting change
/// shows within ~10 s, a 2 s burst moves the rate by a third of itself.
pub const SMOOTHING: f64 = 0.3;

/// The interval [`SMOOTHING`] is the weight of (the heartbeat interval it was tuned
/// at). Other intervals weigh by the same decay per second ([`weight`]), so that the
/// average's memory is a time, not a count of beats: at a 1 s heartbeat (the default
/// since issue 34) two beats weigh what one 2 s beat did. Weighed per beat, the
/// shorter beat followed noise twice as fast, and a soak on a starved host moved leases
/// 2.5 times as often (BENCHMARKS.md, "Failover defaults").
pub const SMOOTHING_INTERVAL: std::time::Duration = std::time::Duration::from_secs(2);

/// The weight of the newest interval, `secs` long, in the average.
fn weight(secs: f64) -> f64 {
    1.0 - (1.0 - SMOOTHING).powf(secs / SMOOTHING_INTERVAL.as_secs_f64())
}

/// A lease's reader is caught up while its last MillisBehindLatest is at most this: what
/// it delivers is then the shard's own traffic, not a backlog.
pub const CAUGHT_UP_MS: u64 = 1_000;

/// Intervals a lease may stay behind before its rate is measured all the same: a shard
/// read from far back (a replay) is measured at the pace it is processed, rather than
/// holding throughput balance off (which waits for every lease's rate) for as long as
/// the replay lasts. A source whose reads carry no MillisBehindLatest (DynamoDB
/// Streams) is measured from here too.
pub const MAX_WARM_UP_INTERVALS: u32 = 10;

#[derive(Debug, Clone)]
struct Meter {
    /// Cumulative (records, bytes) at `at`.
    last: (u64, u64),
    at: Instant,
    /// Intervals measured since the lease was first seen held.
    intervals: u32,
    /// Smoothed (records/s, bytes/s); `None` until a fair interval was measured.
    average: Option<(f64, f64)>,
    /// Whether the reader was caught up at `at`, so that the interval from `at` on is
    /// the shard's traffic. Never at first sight: that interval holds the reader's start.
    caught_up: bool,
}

/// The per-lease rates of one worker, fed at each heartbeat.
#[derive(Debug, Clone, Default)]
pub struct RateMeter {
    meters: BTreeMap<LeaseKey, Meter>,
}

impl RateMeter {
    /// A meter that knows no lease yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes this heartbeat's cumulative delivered `(records, bytes)` per lease (a lease
    /// absent there delivered nothing yet) and each reader's last MillisBehindLatest by
    /// lease key (absent: not read yet), and returns the rate of each held lease that
    /// has one. A lease gets a rate from the first interval that began with its reader
    /// caught up (at the earliest its second interval held: the first holds the
    /// reader's start), or once it has been behind for `MAX_WARM_UP_INTERVALS` (10).
    /// Leases no longer held are forgotten, so a lease that comes back starts afresh.
    pub fn sample<'a>(
        &mut self,
        totals: &BTreeMap<LeaseKey, (u64, u64)>,
        lag_ms: &BTreeMap<String, u64>,
        held: impl IntoIterator<Item = &'a LeaseKey>,
        now: Instant,
    ) -> BTreeMap<LeaseKey, LeaseRate> {
        let mut next: BTreeMap<LeaseKey, Meter> = BTreeMap::new();
        for key in held {
            let total = totals.get(key).copied().unwrap_or((0, 0));
            let caught_up = lag_ms
                .get(key.as_str())
                .is_some_and(|&ms| ms <= CAUGHT_UP_MS);
            let meter = match self.meters.remove(key) {
                None => Meter {
                    last: total,
                    at: now,
                    intervals: 0,
                    average: None,
                    caught_up: false,
                },
                Some(meter) => measure(meter, total, caught_up, now),
            };
            next.insert(key.clone(), meter);
        }
        self.meters = next;
        self.meters
            .iter()
            .filter_map(|(key, m)| {
                m.average.map(|(records, bytes)| {
                    (
                        key.clone(),
                        LeaseRate {
                            records_per_second: records.round() as u64,
                            bytes_per_second: bytes.round() as u64,
                        },
                    )
                })
            })
            .collect()
    }
}

fn measure(meter: Meter, total: (u64, u64), caught_up: bool, now: Instant) -> Meter {
    let secs = now.saturating_duration_since(meter.at).as_secs_f64();
    if secs <= 0.0 {
        return meter;
    }
    if total.0 < meter.last.0 || total.1 < meter.last.1 {
        // The counts restarted (the board forgot the lease): a new baseline.
        return Meter {
            last: total,
            at: now,
            caught_up,
            ..meter
        };
    }
    let interval = (
        (total.0 - meter.last.0) as f64 / secs,
        (total.1 - meter.last.1) as f64 / secs,
    );
    let intervals = meter.intervals.saturating_add(1);
    let average = match meter.average {
        Some((r, b)) => {
            let w = weight(secs);
            Some((
                w * interval.0 + (1.0 - w) * r,
                w * interval.1 + (1.0 - w) * b,
            ))
        }
        None if meter.caught_up || intervals > MAX_WARM_UP_INTERVALS => Some(interval),
        None => None,
    };
    Meter {
        last: total,
        at: now,
        intervals,
        average,
        caught_up,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(i: u8) -> LeaseKey {
        LeaseKey::new(format!("s-{i}"))
    }

    fn totals(rows: &[(u8, u64, u64)]) -> BTreeMap<LeaseKey, (u64, u64)> {
        rows.iter().map(|&(i, r, b)| (key(i), (r, b))).collect()
    }

    /// Every lease's reader `ms` behind the tip.
    fn lag(ms: u64) -> BTreeMap<String, u64> {
        (0..8u8).map(|i| (key(i).as_str().to_owned(), ms)).collect()
    }

    #[test]
    fn a_rate_appears_from_the_second_interval_and_is_smoothed_after() {
        let t0 = Instant::now();
        let s = Duration::from_secs(2);
        let held = [key(1)];
        let mut meter = RateMeter::new();
        // Baseline, then the first interval (the reader's start): no rate yet.
        assert!(
            meter
                .sample(&totals(&[(1, 0, 0)]), &lag(0), &held, t0)
                .is_empty()
        );
        assert!(
            meter
                .sample(&totals(&[(1, 50, 500)]), &lag(0), &held, t0 + s)
                .is_empty()
        );
        // Second interval: 100 records/s, 1000 bytes/s, taken as it is.
        let rates = meter.sample(&totals(&[(1, 250, 2500)]), &lag(0), &held, t0 + 2 * s);
        assert_eq!(
            rates[&key(1)],
            LeaseRate {
                records_per_second: 100,
                bytes_per_second: 1000
            }
        );
        // A burst of 400/s moves the average by SMOOTHING of the difference only.
        let rates = meter.sample(&totals(&[(1, 1050, 10500)]), &lag(0), &held, t0 + 3 * s);
        assert_eq!(rates[&key(1)].records_per_second, 190);
        assert_eq!(rates[&key(1)].bytes_per_second, 1900);
    }

    /// An interval weighs by its length: SMOOTHING at 2 s, and at any other length
    /// what the same decay per second gives.
    #[test]
    fn an_interval_weighs_by_its_length() {
        let cases = [
            (2.0, 0.3),
            (1.0, 1.0 - 0.7f64.sqrt()),
            (4.0, 0.51),
            (0.5, 1.0 - 0.7f64.powf(0.25)),
            (20.0, 1.0 - 0.7f64.powi(10)),
        ];
        for (secs, expected) in cases {
            assert!(
                (weight(secs) - expected).abs() < 1e-12,
                "{secs} s: {} against {expected}",
                weight(secs)
            );
        }
    }

    /// The same traffic gives the same average at a 1 s and a 2 s heartbeat: the
    /// average forgets at a pace in seconds, not in beats.
    #[test]
    fn the_average_forgets_at_the_same_pace_at_any_heartbeat() {
        let t0 = Instant::now();
        let held = [key(1)];
        // 100 records/s for 4 s, then 400/s for 4 s; (elapsed s, cumulative records).
        let at = |t: u64| if t <= 4 { 100 * t } else { 400 + 400 * (t - 4) };
        let mut averages = Vec::new();
        for beat in [1u64, 2] {
            let mut meter = RateMeter::new();
            let mut last = BTreeMap::new();
            for t in (0..=8).step_by(beat as usize) {
                last = meter.sample(
                    &totals(&[(1, at(t), at(t))]),
                    &lag(0),
                    &held,
                    t0 + Duration::from_secs(t),
                );
            }
            averages.push(last[&key(1)].records_per_second);
        }
        // 100 at 4 s, then 4 s of 400/s: 400 - 300 * 0.7^2 = 253.
        assert_eq!(averages, [253, 253], "1 s beats, 2 s beats");
    }

    #[test]
    fn a_lease_read_from_behind_is_measured_from_the_interval_after_it_caught_up() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let held = [key(1)];
        let mut meter = RateMeter::new();
        // (cumulative records, the reader's lag at the beat): the reader starts, then
        // a backlog of 900 arrives an interval late (a fan-out subscription's start),
        // and the shard's own 100/s follows.
        let beats: [(u64, u64, bool); 6] = [
            (0, 30_000, false),
            (0, 30_000, false),
            (900, 0, false),
            (1_000, 0, true),
            (1_100, 0, true),
            (1_200, 0, true),
        ];
        for (i, (records, behind, rated)) in beats.into_iter().enumerate() {
            let rates = meter.sample(
                &totals(&[(1, records, records)]),
                &lag(behind),
                &held,
                t0 + s * i as u32,
            );
            assert_eq!(rates.contains_key(&key(1)), rated, "beat {i}: {rates:?}");
            if rated {
                // The burst never entered the average.
                assert_eq!(rates[&key(1)].records_per_second, 100, "beat {i}");
            }
        }
    }

    #[test]
    fn a_lease_that_stays_behind_is_measured_after_the_warm_up_limit() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let held = [key(1)];
        let mut meter = RateMeter::new();
        let unread = BTreeMap::new();
        for i in 0..=MAX_WARM_UP_INTERVALS {
            let n = u64::from(i) * 50;
            // Not read yet counts as behind, like a lag past the bound.
            let lags = if i % 2 == 0 {
                lag(CAUGHT_UP_MS + 1)
            } else {
                unread.clone()
            };
            let rates = meter.sample(&totals(&[(1, n, n)]), &lags, &held, t0 + s * i);
            assert!(rates.is_empty(), "interval {i}: {rates:?}");
        }
        let n = u64::from(MAX_WARM_UP_INTERVALS + 1) * 50;
        let rates = meter.sample(
            &totals(&[(1, n, n)]),
            &lag(60_000),
            &held,
            t0 + s * (MAX_WARM_UP_INTERVALS + 1),
        );
        assert_eq!(rates[&key(1)].records_per_second, 50);
    }

    #[test]
    fn leases_let_go_are_forgotten_and_keyed_by_lease_key() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let mut meter = RateMeter::new();
        let both = [key(1), key(2)];
        for i in 0..3u64 {
            meter.sample(
                &totals(&[(1, 10 * i, 10 * i), (2, 20 * i, 20 * i)]),
                &lag(0),
                &both,
                t0 + s * i as u32,
            );
        }
        let rates = meter.sample(
            &totals(&[(1, 30, 30), (2, 60, 60)]),
            &lag(0),
            &both,
            t0 + 3 * s,
        );
        assert_eq!(rates.len(), 2);
        assert_eq!(rates[&key(2)].records_per_second, 20);
        // Key 2 let go, then back: it starts afresh (no rate for two intervals).
        meter.sample(&totals(&[(1, 40, 40)]), &lag(0), &[key(1)], t0 + 4 * s);
        let rates = meter.sample(
            &totals(&[(1, 50, 50), (2, 80, 80)]),
            &lag(0),
            &both,
            t0 + 5 * s,
        );
        assert_eq!(rates.keys().collect::<Vec<_>>(), vec![&key(1)]);
    }

    #[test]
    fn counts_that_go_back_make_a_new_baseline_not_a_huge_rate() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let held = [key(1)];
        let mut meter = RateMeter::new();
        for (i, n) in [0u64, 10, 20, 30].iter().enumerate() {
            meter.sample(&totals(&[(1, *n, *n)]), &lag(0), &held, t0 + s * i as u32);
        }
        let before = meter.sample(&totals(&[(1, 40, 40)]), &lag(0), &held, t0 + 4 * s)[&key(1)];
        let after = meter.sample(&totals(&[(1, 5, 5)]), &lag(0), &held, t0 + 5 * s)[&key(1)];
        assert_eq!(before, after);
        assert_eq!(after.records_per_second, 10);
    }
}
