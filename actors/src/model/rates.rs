//! Each held lease's throughput, as its owner publishes it with every heartbeat: an
//! exponentially weighted moving average of records/s and bytes/s over heartbeat
//! intervals, so one bursty interval does not move a shard (balance acts on these
//! rates, and a rate that jumps with every beat would move leases back and forth).
//!
//! Pure: the cumulative counts and the time are parameters.

use std::collections::BTreeMap;

use tokio::time::Instant;

use super::{LeaseKey, LeaseRate};

/// Weight of the newest interval in the average. With the default 2 s heartbeat, an
/// interval's weight halves in about two beats: a lasting change shows within ~10 s,
/// a one-interval burst moves the rate by a third of itself.
pub const SMOOTHING: f64 = 0.3;

#[derive(Debug, Clone)]
struct Meter {
    /// Cumulative (records, bytes) at `at`.
    last: (u64, u64),
    at: Instant,
    /// Intervals measured since the lease was first seen held.
    intervals: u32,
    /// Smoothed (records/s, bytes/s); `None` until a fair interval was measured.
    average: Option<(f64, f64)>,
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
    /// absent there delivered nothing yet) and returns the rate of each held lease that
    /// has one. A lease gets a rate from its second interval held: the first one holds
    /// the reader's start (getting an iterator, catching up), not the lease's throughput.
    /// Leases no longer held are forgotten, so a lease that comes back starts afresh.
    pub fn sample<'a>(
        &mut self,
        totals: &BTreeMap<LeaseKey, (u64, u64)>,
        held: impl IntoIterator<Item = &'a LeaseKey>,
        now: Instant,
    ) -> BTreeMap<LeaseKey, LeaseRate> {
        let mut next: BTreeMap<LeaseKey, Meter> = BTreeMap::new();
        for key in held {
            let total = totals.get(key).copied().unwrap_or((0, 0));
            let meter = match self.meters.remove(key) {
                None => Meter {
                    last: total,
                    at: now,
                    intervals: 0,
                    average: None,
                },
                Some(meter) => measure(meter, total, now),
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

fn measure(meter: Meter, total: (u64, u64), now: Instant) -> Meter {
    let secs = now.saturating_duration_since(meter.at).as_secs_f64();
    if secs <= 0.0 {
        return meter;
    }
    if total.0 < meter.last.0 || total.1 < meter.last.1 {
        // The counts restarted (the board forgot the lease): a new baseline.
        return Meter {
            last: total,
            at: now,
            ..meter
        };
    }
    let interval = (
        (total.0 - meter.last.0) as f64 / secs,
        (total.1 - meter.last.1) as f64 / secs,
    );
    let intervals = meter.intervals.saturating_add(1);
    let average = match (intervals, meter.average) {
        (1, _) => None,
        (_, None) => Some(interval),
        (_, Some((r, b))) => Some((
            SMOOTHING * interval.0 + (1.0 - SMOOTHING) * r,
            SMOOTHING * interval.1 + (1.0 - SMOOTHING) * b,
        )),
    };
    Meter {
        last: total,
        at: now,
        intervals,
        average,
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

    #[test]
    fn a_rate_appears_from_the_second_interval_and_is_smoothed_after() {
        let t0 = Instant::now();
        let s = Duration::from_secs(2);
        let held = [key(1)];
        let mut meter = RateMeter::new();
        // Baseline, then the first interval (the reader's start): no rate yet.
        assert!(meter.sample(&totals(&[(1, 0, 0)]), &held, t0).is_empty());
        assert!(
            meter
                .sample(&totals(&[(1, 50, 500)]), &held, t0 + s)
                .is_empty()
        );
        // Second interval: 100 records/s, 1000 bytes/s, taken as it is.
        let rates = meter.sample(&totals(&[(1, 250, 2500)]), &held, t0 + 2 * s);
        assert_eq!(
            rates[&key(1)],
            LeaseRate {
                records_per_second: 100,
                bytes_per_second: 1000
            }
        );
        // A burst of 400/s moves the average by SMOOTHING of the difference only.
        let rates = meter.sample(&totals(&[(1, 1050, 10500)]), &held, t0 + 3 * s);
        assert_eq!(rates[&key(1)].records_per_second, 190);
        assert_eq!(rates[&key(1)].bytes_per_second, 1900);
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
                &both,
                t0 + s * i as u32,
            );
        }
        let rates = meter.sample(&totals(&[(1, 30, 30), (2, 60, 60)]), &both, t0 + 3 * s);
        assert_eq!(rates.len(), 2);
        assert_eq!(rates[&key(2)].records_per_second, 20);
        // Key 2 let go, then back: it starts afresh (no rate for two intervals).
        meter.sample(&totals(&[(1, 40, 40)]), &[key(1)], t0 + 4 * s);
        let rates = meter.sample(&totals(&[(1, 50, 50), (2, 80, 80)]), &both, t0 + 5 * s);
        assert_eq!(rates.keys().collect::<Vec<_>>(), vec![&key(1)]);
    }

    #[test]
    fn counts_that_go_back_make_a_new_baseline_not_a_huge_rate() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let held = [key(1)];
        let mut meter = RateMeter::new();
        for (i, n) in [0u64, 10, 20, 30].iter().enumerate() {
            meter.sample(&totals(&[(1, *n, *n)]), &held, t0 + s * i as u32);
        }
        let before = meter.sample(&totals(&[(1, 40, 40)]), &held, t0 + 4 * s)[&key(1)];
        let after = meter.sample(&totals(&[(1, 5, 5)]), &held, t0 + 5 * s)[&key(1)];
        assert_eq!(before, after);
        assert_eq!(after.records_per_second, 10);
    }
}
