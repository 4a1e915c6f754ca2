//! How many workers the stream needs: a pure function of what every worker already
//! knows each round (the heartbeat rows' loads and lags, the processable leases) and the
//! `[scaling]` targets, for an autoscaler to follow. Every worker computes it alike from
//! the same rows, so any worker's figure will do (an autoscaler takes the maximum).
//!
//! The rule, in order (each step may only raise the figure, save the first and last):
//! 1. Load: enough workers that the fleet's records/s (and bytes/s) over them is at most
//!    the target per worker. Fewer than now only when the load fits them with the
//!    scale-down margin to spare (hysteresis: a figure just over a boundary does not
//!    go back and forth). No target set: as many as now.
//! 2. Lag: while the largest lag is above `lag_target`, never fewer than now; and while
//!    it is not falling either, one more than now.
//! 3. `lease.max_leases`: at least leases / max_leases (rounded up), or some lease
//!    would have no worker allowed to take it.
//! 4. At most the processable leases (a worker without a lease does nothing), and at
//!    least 1.
//!
//! The load judged is the highest of the last rounds ([`LoadWindow`], a failover time's
//! worth): a scale-up follows a rise at once, a scale-down waits until the load has
//! stayed low that long. While leases move, the mover's rate has left its old owner's
//! heartbeat before it reaches its new owner's, and for a round or two the fleet looks
//! idler than it is; the window keeps that from reaching the figure.
//!
//! Nothing here reads a clock or does I/O; the lag's trend needs the previous reading,
//! and the window the last loads, which the caller keeps in a [`LagTrend`] and a
//! [`LoadWindow`].

use std::collections::VecDeque;

use crate::model::WorkerLoad;
use crate::settings::ScalingSettings;

/// What a round knows of the fleet: the inputs of [`recommend`], published beside it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Fleet {
    /// Live workers sharing the leases (not draining), this one included.
    pub workers: u32,
    /// Leases that can be processed now (not finished, parents finished).
    pub leases: u32,
    /// `lease.max_leases` (0: no limit).
    pub max_leases: u32,
    /// Records per second over every live worker, as their heartbeats say.
    pub records_per_second: u64,
    /// Bytes per second over every live worker; `None` while some live worker does not
    /// publish its leases' rates (`lease.balance = "count"`, an older flotilla).
    pub bytes_per_second: Option<u64>,
    /// The largest MillisBehindLatest over every live worker's shards.
    pub largest_lag_ms: u64,
    /// Which way that lag goes.
    pub lag_trend: Trend,
}

impl Fleet {
    /// The fleet's totals from the live workers' heartbeat loads (draining ones
    /// included: their load is still there until someone takes it over).
    pub fn from_loads<'a>(
        loads: impl IntoIterator<Item = &'a WorkerLoad>,
        workers: u32,
        leases: u32,
        max_leases: u32,
    ) -> Fleet {
        let mut fleet = Fleet {
            workers,
            leases,
            max_leases,
            bytes_per_second: Some(0),
            ..Fleet::default()
        };
        for load in loads {
            fleet.records_per_second += load.records_per_second;
            fleet.bytes_per_second = match (&load.lease_rates, fleet.bytes_per_second) {
                (Some(rates), Some(sum)) => {
                    Some(sum + rates.values().map(|r| r.bytes_per_second).sum::<u64>())
                }
                _ => None,
            };
            let lag = load.lag_ms.values().copied().max().unwrap_or(0);
            fleet.largest_lag_ms = fleet.largest_lag_ms.max(lag);
        }
        fleet
    }
}

/// Which way the fleet's largest lag goes, between its last two different readings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Trend {
    /// Fewer than two readings yet.
    #[default]
    Unknown,
    /// Higher than the reading before it.
    Rising,
    /// Lower than the reading before it.
    Falling,
}

/// The caller's memory of the lag: its last two different readings. A reading equal to
/// the last one is no news (a round between two whole reads of the heartbeat rows sees
/// the same lags again), so it keeps the trend as it was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LagTrend {
    previous: Option<u64>,
    current: Option<u64>,
}

impl LagTrend {
    /// Notes this round's largest lag and says which way it goes.
    pub fn observe(&mut self, lag_ms: u64) -> Trend {
        if self.current != Some(lag_ms) {
            self.previous = self.current;
            self.current = Some(lag_ms);
        }
        match (self.previous, self.current) {
            (Some(before), Some(now)) if now < before => Trend::Falling,
            (Some(_), Some(_)) => Trend::Rising,
            _ => Trend::Unknown,
        }
    }
}

/// The fleet's load over its last rounds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadWindow {
    recent: VecDeque<(u64, Option<u64>)>,
}

impl LoadWindow {
    /// Notes this round's load and puts in `fleet` the highest of the last `rounds`
    /// (this one included; at least 1). Bytes are unknown if they were in any of them.
    pub fn peak(&mut self, fleet: &mut Fleet, rounds: usize) {
        self.recent
            .push_back((fleet.records_per_second, fleet.bytes_per_second));
        while self.recent.len() > rounds.max(1) {
            self.recent.pop_front();
        }
        fleet.records_per_second = self.recent.iter().map(|(r, _)| *r).max().unwrap_or(0);
        fleet.bytes_per_second = self
            .recent
            .iter()
            .map(|(_, b)| *b)
            .try_fold(0, |peak, b| b.map(|b| peak.max(b)));
    }
}

/// What the figure is judged against: `[scaling]`, in the units the rule counts in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Targets {
    /// Per worker; 0: not judged.
    pub records_per_second: u64,
    /// Per worker; 0: not judged.
    pub bytes_per_second: u64,
    /// `scaling.lag_target`, in ms.
    pub lag_ms: u64,
    /// Below 100.
    pub scale_down_margin_percent: u32,
}

impl Targets {
    /// The targets `[scaling]` sets.
    pub fn from_settings(settings: &ScalingSettings) -> Targets {
        Targets {
            records_per_second: settings.target_records_per_second,
            bytes_per_second: settings.target_bytes_per_second,
            lag_ms: settings.lag_target.as_millis() as u64,
            scale_down_margin_percent: settings.scale_down_margin_percent.min(99),
        }
    }
}

/// Which rule set the figure (the last one that changed it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The load needs this many (more than now, or fewer with the margin to spare).
    Load,
    /// Nothing calls for a change: as many as now.
    Hold,
    /// The largest lag is above the target and not falling: one more than now.
    LagNotFalling,
    /// The largest lag is above the target but falling: no fewer than now.
    Behind,
    /// `lease.max_leases` needs this many to hold every lease.
    MaxLeases,
    /// Capped at the processable leases (or raised to 1).
    Leases,
}

impl Reason {
    /// Its name in logs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Load => "load",
            Reason::Hold => "hold",
            Reason::LagNotFalling => "lag_not_falling",
            Reason::Behind => "behind",
            Reason::MaxLeases => "max_leases",
            Reason::Leases => "leases",
        }
    }
}

/// The recommended worker count, why, and what it was judged on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Recommendation {
    /// How many workers the stream needs: at least 1, at most the processable leases.
    pub workers: u32,
    /// The rule that set the figure.
    pub reason: Reason,
    /// What it was judged on, published beside it.
    pub inputs: Fleet,
    /// What it was judged against.
    pub targets: Targets,
}

/// Workers that carry `total` at `target × percent / 100` each, rounded up; `None` with
/// no target.
fn needed(total: u64, target: u64, percent: u64) -> Option<u64> {
    if target == 0 {
        return None;
    }
    let each = u128::from(target) * u128::from(percent);
    let need = (u128::from(total) * 100).div_ceil(each);
    Some(u64::try_from(need).unwrap_or(u64::MAX))
}

/// The rule of the module's docs.
pub fn recommend(fleet: &Fleet, targets: &Targets) -> Recommendation {
    let now = u64::from(fleet.workers);
    let keep = 100 - u64::from(targets.scale_down_margin_percent.min(99));
    let dims = [
        (fleet.records_per_second, targets.records_per_second),
        (
            fleet.bytes_per_second.unwrap_or(0),
            if fleet.bytes_per_second.is_some() {
                targets.bytes_per_second
            } else {
                0
            },
        ),
    ];
    let up = dims.iter().filter_map(|(t, g)| needed(*t, *g, 100)).max();
    let down = dims.iter().filter_map(|(t, g)| needed(*t, *g, keep)).max();
    // 1. Load.
    let (mut n, mut reason) = match (up, down) {
        (Some(up), _) if up > now => (up, Reason::Load),
        (_, Some(down)) if down.max(1) < now => (down.max(1), Reason::Load),
        _ => (now, Reason::Hold),
    };
    // 2. Lag.
    if fleet.largest_lag_ms > targets.lag_ms {
        let (floor, why) = match fleet.lag_trend {
            Trend::Rising => (now + 1, Reason::LagNotFalling),
            Trend::Falling | Trend::Unknown => (now, Reason::Behind),
        };
        if floor > n || (floor == n && reason == Reason::Hold) {
            (n, reason) = (floor, why);
        }
    }
    // 3. lease.max_leases.
    if fleet.max_leases > 0 {
        let floor = u64::from(fleet.leases).div_ceil(u64::from(fleet.max_leases));
        if floor > n {
            (n, reason) = (floor, Reason::MaxLeases);
        }
    }
    // 4. Between 1 and the leases.
    let cap = u64::from(fleet.leases.max(1));
    if n > cap || n == 0 {
        (n, reason) = (n.clamp(1, cap), Reason::Leases);
    }
    Recommendation {
        workers: u32::try_from(n).unwrap_or(u32::MAX),
        reason,
        inputs: *fleet,
        targets: *targets,
    }
}

impl Recommendation {
    /// Its reason in words, with the figures the rule judged (`/fleet`'s `why`): e.g.
    /// `load above the target for 2 workers: 4000 records/s (target 1000 per worker)`.
    pub fn why(&self) -> String {
        let Recommendation {
            workers,
            reason,
            inputs: fleet,
            targets,
        } = *self;
        let now = count(fleet.workers);
        let lag = || {
            format!(
                "largest lag {} above scaling.lag_target {}",
                duration(fleet.largest_lag_ms),
                duration(targets.lag_ms)
            )
        };
        match (reason, load(&fleet, &targets)) {
            (Reason::Load, Some(load)) if workers > fleet.workers => {
                format!("load above the target for {now}: {load}")
            }
            (Reason::Load, load) => format!(
                "load fits {} with the {}% scale-down margin: {}",
                count(workers),
                targets.scale_down_margin_percent,
                load.unwrap_or_default()
            ),
            (Reason::Hold, Some(load)) => {
                format!("load within the target for {now}: {load}; as many as now")
            }
            (Reason::Hold, None) if targets.bytes_per_second > 0 => "no load to judge (no \
                 records/s target, and bytes/s unknown: a worker publishes no per-lease \
                 rates); as many as now"
                .to_owned(),
            (Reason::Hold, None) => "no load target set; as many as now".to_owned(),
            (Reason::LagNotFalling, _) => format!("{} and rising: one more than now", lag()),
            (Reason::Behind, _) => match fleet.lag_trend {
                Trend::Falling => format!("{} but falling: no fewer than now", lag()),
                _ => format!("{}, trend not known yet: no fewer than now", lag()),
            },
            (Reason::MaxLeases, _) => format!(
                "{} leases at lease.max_leases {} per worker need {}",
                fleet.leases,
                fleet.max_leases,
                count(workers)
            ),
            (Reason::Leases, _) if fleet.leases > 0 && workers >= fleet.leases => format!(
                "at most one worker per processable lease ({})",
                fleet.leases
            ),
            (Reason::Leases, _) => "at least 1 worker".to_owned(),
        }
    }
}

/// The load the rule judged, each figure that has a target: `4000 records/s (target
/// 1000 per worker)`; `None` when none has.
fn load(fleet: &Fleet, targets: &Targets) -> Option<String> {
    let mut parts = Vec::new();
    if targets.records_per_second > 0 {
        parts.push(format!(
            "{} records/s (target {} per worker)",
            fleet.records_per_second, targets.records_per_second
        ));
    }
    if let (Some(bytes), 1..) = (fleet.bytes_per_second, targets.bytes_per_second) {
        parts.push(format!(
            "{bytes} bytes/s (target {} per worker)",
            targets.bytes_per_second
        ));
    }
    (!parts.is_empty()).then(|| parts.join(", "))
}

fn count(workers: u32) -> String {
    match workers {
        1 => "1 worker".to_owned(),
        n => format!("{n} workers"),
    }
}

fn duration(ms: u64) -> String {
    humantime::format_duration(std::time::Duration::from_millis(ms)).to_string()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::model::{LeaseKey, LeaseRate};

    const TARGETS: Targets = Targets {
        records_per_second: 1_000,
        bytes_per_second: 0,
        lag_ms: 60_000,
        scale_down_margin_percent: 20,
    };

    fn fleet(workers: u32, leases: u32, records_per_second: u64) -> Fleet {
        Fleet {
            workers,
            leases,
            records_per_second,
            ..Fleet::default()
        }
    }

    /// The rule's table: (what, fleet, targets, expected workers, expected reason).
    #[test]
    fn scenarios() {
        let lagging = |f: Fleet, lag, trend| Fleet {
            largest_lag_ms: lag,
            lag_trend: trend,
            ..f
        };
        let bytes = Targets {
            records_per_second: 0,
            bytes_per_second: 1_000_000,
            ..TARGETS
        };
        let cases: &[(&str, Fleet, Targets, u32, Reason)] = &[
            // Load.
            (
                "2 workers at twice the target need 4",
                fleet(2, 8, 4_000),
                TARGETS,
                4,
                Reason::Load,
            ),
            (
                "a boundary not reached holds",
                fleet(2, 8, 2_000),
                TARGETS,
                2,
                Reason::Hold,
            ),
            (
                "just over the boundary: one more",
                fleet(2, 8, 2_001),
                TARGETS,
                3,
                Reason::Load,
            ),
            (
                "hot shards: the load needs more than the shards, capped at the leases",
                fleet(2, 4, 9_000),
                TARGETS,
                4,
                Reason::Leases,
            ),
            // Hysteresis: 4 workers carry 3 600 at 90%: 3 would be at 120%, and at the
            // margin 3 600 needs ceil(3 600 / 800) = 5 > 4, so 4 it stays.
            (
                "after scaling up, the same load holds",
                fleet(4, 8, 3_600),
                TARGETS,
                4,
                Reason::Hold,
            ),
            (
                "fits one fewer, but not with the margin: hold",
                fleet(4, 8, 2_500),
                TARGETS,
                4,
                Reason::Hold,
            ),
            (
                "fits one fewer with the margin: scale down",
                fleet(4, 8, 2_400),
                TARGETS,
                3,
                Reason::Load,
            ),
            (
                "idle fleet: one worker",
                fleet(4, 8, 0),
                TARGETS,
                1,
                Reason::Load,
            ),
            (
                "idle fleet with no leases: still one",
                fleet(3, 0, 0),
                TARGETS,
                1,
                Reason::Load,
            ),
            (
                "no target: as many as now",
                fleet(3, 8, 50_000),
                Targets {
                    records_per_second: 0,
                    ..TARGETS
                },
                3,
                Reason::Hold,
            ),
            // Bytes, when every worker publishes them.
            (
                "bytes: 3.5 MB/s needs 4",
                Fleet {
                    bytes_per_second: Some(3_500_000),
                    ..fleet(2, 8, 0)
                },
                bytes,
                4,
                Reason::Load,
            ),
            (
                "bytes unknown: not judged",
                Fleet {
                    bytes_per_second: None,
                    ..fleet(2, 8, 0)
                },
                bytes,
                2,
                Reason::Hold,
            ),
            (
                "the larger need of records and bytes wins",
                Fleet {
                    bytes_per_second: Some(5_500_000),
                    ..fleet(2, 8, 3_000)
                },
                Targets {
                    records_per_second: 1_000,
                    ..bytes
                },
                6,
                Reason::Load,
            ),
            // Lag.
            (
                "lag rising: one more",
                lagging(fleet(2, 8, 1_000), 120_000, Trend::Rising),
                TARGETS,
                3,
                Reason::LagNotFalling,
            ),
            (
                "lag rising, load needs more still",
                lagging(fleet(2, 8, 4_000), 120_000, Trend::Rising),
                TARGETS,
                4,
                Reason::Load,
            ),
            (
                "lag falling: no change, no scale-down",
                lagging(fleet(4, 8, 0), 120_000, Trend::Falling),
                TARGETS,
                4,
                Reason::Behind,
            ),
            (
                "lag of unknown trend: no scale-down",
                lagging(fleet(4, 8, 0), 120_000, Trend::Unknown),
                TARGETS,
                4,
                Reason::Behind,
            ),
            (
                "lag under the target: the load decides",
                lagging(fleet(4, 8, 0), 59_000, Trend::Rising),
                TARGETS,
                1,
                Reason::Load,
            ),
            (
                "lag rising at every lease held: capped",
                lagging(fleet(8, 8, 0), 120_000, Trend::Rising),
                TARGETS,
                8,
                Reason::Leases,
            ),
            // lease.max_leases.
            (
                "max_leases: 10 leases of at most 2 need 5",
                Fleet {
                    max_leases: 2,
                    ..fleet(1, 10, 0)
                },
                TARGETS,
                5,
                Reason::MaxLeases,
            ),
            (
                "max_leases rounds up",
                Fleet {
                    max_leases: 3,
                    ..fleet(1, 10, 0)
                },
                TARGETS,
                4,
                Reason::MaxLeases,
            ),
            (
                "max_leases below the load's need: the load",
                Fleet {
                    max_leases: 4,
                    ..fleet(2, 8, 6_000)
                },
                TARGETS,
                6,
                Reason::Load,
            ),
            // Bounds.
            (
                "no workers yet: at least 1",
                fleet(0, 8, 0),
                Targets {
                    records_per_second: 0,
                    ..TARGETS
                },
                1,
                Reason::Leases,
            ),
            (
                "a huge load: at most the leases",
                fleet(2, 8, u64::MAX),
                TARGETS,
                8,
                Reason::Leases,
            ),
        ];
        for (what, fleet, targets, workers, reason) in cases {
            let got = recommend(fleet, targets);
            assert_eq!((got.workers, got.reason), (*workers, *reason), "{what}");
            assert_eq!(
                got.inputs, *fleet,
                "{what}: the inputs are published beside it"
            );
        }
    }

    /// Each reason in words, with the figures it rests on (what `/fleet` shows).
    #[test]
    fn each_reason_says_why_with_its_figures() {
        let lagging = |f: Fleet, trend| Fleet {
            largest_lag_ms: 90_000,
            lag_trend: trend,
            ..f
        };
        let none = Targets {
            records_per_second: 0,
            ..TARGETS
        };
        let both = Targets {
            bytes_per_second: 1_000_000,
            ..TARGETS
        };
        let cases: &[(Fleet, Targets, Reason, &str)] = &[
            (
                fleet(2, 8, 4_000),
                TARGETS,
                Reason::Load,
                "load above the target for 2 workers: 4000 records/s (target 1000 per worker)",
            ),
            (
                Fleet {
                    bytes_per_second: Some(3_500_000),
                    ..fleet(2, 8, 1_000)
                },
                both,
                Reason::Load,
                "load above the target for 2 workers: 1000 records/s (target 1000 per \
                 worker), 3500000 bytes/s (target 1000000 per worker)",
            ),
            (
                fleet(4, 8, 1_000),
                TARGETS,
                Reason::Load,
                "load fits 2 workers with the 20% scale-down margin: 1000 records/s (target \
                 1000 per worker)",
            ),
            (
                fleet(2, 8, 2_000),
                TARGETS,
                Reason::Hold,
                "load within the target for 2 workers: 2000 records/s (target 1000 per \
                 worker); as many as now",
            ),
            (
                fleet(2, 8, 2_000),
                none,
                Reason::Hold,
                "no load target set; as many as now",
            ),
            (
                fleet(2, 8, 2_000),
                Targets {
                    records_per_second: 0,
                    ..both
                },
                Reason::Hold,
                "no load to judge (no records/s target, and bytes/s unknown: a worker \
                 publishes no per-lease rates); as many as now",
            ),
            (
                lagging(fleet(2, 8, 0), Trend::Rising),
                TARGETS,
                Reason::LagNotFalling,
                "largest lag 1m 30s above scaling.lag_target 1m and rising: one more than now",
            ),
            (
                lagging(fleet(2, 8, 0), Trend::Falling),
                TARGETS,
                Reason::Behind,
                "largest lag 1m 30s above scaling.lag_target 1m but falling: no fewer than now",
            ),
            (
                lagging(fleet(2, 8, 0), Trend::Unknown),
                TARGETS,
                Reason::Behind,
                "largest lag 1m 30s above scaling.lag_target 1m, trend not known yet: no \
                 fewer than now",
            ),
            (
                Fleet {
                    max_leases: 3,
                    ..fleet(1, 10, 0)
                },
                none,
                Reason::MaxLeases,
                "10 leases at lease.max_leases 3 per worker need 4 workers",
            ),
            (
                fleet(2, 8, u64::MAX),
                TARGETS,
                Reason::Leases,
                "at most one worker per processable lease (8)",
            ),
            (fleet(0, 8, 0), none, Reason::Leases, "at least 1 worker"),
        ];
        for (fleet, targets, reason, why) in cases {
            let got = recommend(fleet, targets);
            assert_eq!(got.reason, *reason, "{why}");
            assert_eq!(got.why(), *why);
        }
    }

    /// Following its own advice settles: from any fleet size, scaling to the figure
    /// and asking again gives the same figure (for a steady load, no lag).
    #[test]
    fn the_figure_is_a_fixed_point() {
        for load in (0..20_000).step_by(137) {
            for workers in 1..=16 {
                let first = recommend(&fleet(workers, 16, load), &TARGETS).workers;
                let again = recommend(&fleet(first, 16, load), &TARGETS).workers;
                assert_eq!(first, again, "load {load}, from {workers}");
            }
        }
    }

    #[test]
    fn the_trend_is_between_the_last_two_different_readings() {
        let mut trend = LagTrend::default();
        let seen: Vec<Trend> = [100, 100, 200, 200, 150, 150, 150, 300]
            .into_iter()
            .map(|lag| trend.observe(lag))
            .collect();
        use Trend::*;
        assert_eq!(
            seen,
            [
                Unknown, Unknown, Rising, Rising, Falling, Falling, Falling, Rising
            ]
        );
    }

    /// A rise counts at once; a fall only once it has lasted the window.
    #[test]
    fn the_window_keeps_the_peak_of_the_last_rounds() {
        let mut window = LoadWindow::default();
        let peaks: Vec<(u64, Option<u64>)> = [
            (300, Some(5)),
            (100, Some(1)),
            (100, Some(1)),
            (100, None),
            (500, Some(2)),
        ]
        .into_iter()
        .map(|(records, bytes)| {
            let mut f = Fleet {
                records_per_second: records,
                bytes_per_second: bytes,
                ..Fleet::default()
            };
            window.peak(&mut f, 3);
            (f.records_per_second, f.bytes_per_second)
        })
        .collect();
        assert_eq!(
            peaks,
            [
                (300, Some(5)),
                (300, Some(5)),
                (300, Some(5)),
                (100, None),
                (500, None)
            ]
        );
    }

    #[test]
    fn a_fleet_is_summed_from_the_live_loads() {
        let rated = |bytes: u64| {
            Some(BTreeMap::from([(
                LeaseKey::new("s1"),
                LeaseRate {
                    records_per_second: 0,
                    bytes_per_second: bytes,
                },
            )]))
        };
        let a = WorkerLoad {
            records_per_second: 300,
            lag_ms: BTreeMap::from([("s1".to_owned(), 5), ("s2".to_owned(), 70)]),
            lease_rates: rated(1_000),
            ..WorkerLoad::default()
        };
        let b = WorkerLoad {
            records_per_second: 200,
            lag_ms: BTreeMap::from([("s3".to_owned(), 40)]),
            lease_rates: rated(500),
            ..WorkerLoad::default()
        };
        let fleet = Fleet::from_loads([&a, &b], 2, 3, 0);
        assert_eq!(fleet.records_per_second, 500);
        assert_eq!(fleet.bytes_per_second, Some(1_500));
        assert_eq!(fleet.largest_lag_ms, 70);
        let count_only = WorkerLoad {
            lease_rates: None,
            ..b
        };
        assert_eq!(
            Fleet::from_loads([&a, &count_only], 2, 3, 0).bytes_per_second,
            None,
            "one worker without rates: bytes unknown"
        );
    }
}
