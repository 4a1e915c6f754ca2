//! The last 10 minutes of a worker's shards (and of the fleet's workers), for the
//! status pages' charts: a bounded ring of points at a fixed step per series, kept in
//! memory by the status server.
//!
//! Fed from the snapshots the status endpoint already collects, one sample per
//! [`STEP`] (the status server's sampler); nothing is done per record. Pure: the time
//! of a sample is a parameter (milliseconds since the server started), so the rings
//! are tested without a clock. A step with no sample (the worker was paused, the
//! supervisor did not answer) is a gap, drawn as a break in the line, never as a
//! value.
//!
//! Cost: a point is 16 bytes (its step, records/s as f32, lag in ms), a ring is
//! [`POINTS`] of them, 960 bytes, allocated once; with its key and map entry about
//! 1.1 KB a series, so 1,000 shards hold about 1.1 MB (`a_ring_costs_what_the_docs_say`
//! checks the figure). A series no longer sampled (a shard given away, a worker gone)
//! is dropped once its last point leaves the window.

// Without the `status-server` feature only the page's types (`Point`, `Series`) are
// used; the rings the server keeps (`History`) are not.
#![cfg_attr(not(feature = "status-server"), allow(dead_code))]

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use crate::status::{FleetLeaseState, FleetView, WorkerStatus};

/// The charts' step: one point per 10 s.
pub const STEP: Duration = Duration::from_secs(10);
/// Points per series: 10 minutes at [`STEP`].
pub const POINTS: usize = 60;

/// One sample of a series.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Point {
    /// Records delivered per second when sampled (a fleet worker's: from its heartbeat).
    pub records_per_second: f32,
    /// MillisBehindLatest; `None` when not known (not read yet, or no owner reported it).
    pub lag_ms: Option<u32>,
}

/// A series' last [`POINTS`] steps: slot `step % POINTS` holds the sample of `step`,
/// so a sample overwrites the one a whole window older, and the ring never grows.
#[derive(Debug, Clone)]
pub(crate) struct Ring {
    slots: Box<[Option<(u32, Point)>; POINTS]>,
    last: u32,
}

impl Ring {
    fn new() -> Self {
        Self {
            slots: Box::new([None; POINTS]),
            last: 0,
        }
    }

    /// The sample of `step`; a later sample of the same step replaces it, and a
    /// sample older than what its slot holds is dropped.
    pub(crate) fn record(&mut self, step: u32, point: Point) {
        let slot = &mut self.slots[step as usize % POINTS];
        if slot.is_none_or(|(held, _)| held <= step) {
            *slot = Some((step, point));
        }
        self.last = self.last.max(step);
    }

    /// The [`POINTS`] steps ending at `now`, oldest first: `None` where no sample was
    /// taken in that step (or the step is before the server started).
    pub(crate) fn window(&self, now: u32) -> Vec<Option<Point>> {
        (0..POINTS as u32)
            .map(|k| {
                let step = now.checked_sub(POINTS as u32 - 1 - k)?;
                match self.slots[step as usize % POINTS] {
                    Some((at, point)) if at == step => Some(point),
                    _ => None,
                }
            })
            .collect()
    }

    /// Its last sample has left the window ending at `now`.
    fn expired(&self, now: u32) -> bool {
        now.saturating_sub(self.last) >= POINTS as u32
    }
}

/// One series as the pages draw it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Series {
    /// A shard (`shardId-…`, or `stream/shardId-…`) or a worker id.
    pub name: String,
    /// Oldest first, one per step, `None` for a gap.
    pub points: Vec<Option<Point>>,
}

/// Named rings (per shard on the worker page, per worker on the fleet page).
#[derive(Debug, Clone, Default)]
pub(crate) struct History {
    rings: BTreeMap<String, Ring>,
    /// The step of the latest sample.
    now: u32,
}

impl History {
    /// Records one sample per series at `at` (since the server started), and drops the
    /// series whose last sample has left the window.
    pub(crate) fn record(
        &mut self,
        at: Duration,
        samples: impl IntoIterator<Item = (String, Point)>,
    ) {
        let step = step_of(at);
        self.now = self.now.max(step);
        for (name, point) in samples {
            self.rings
                .entry(name)
                .or_insert_with(Ring::new)
                .record(step, point);
        }
        let now = self.now;
        self.rings.retain(|_, ring| !ring.expired(now));
    }

    /// Every series' window ending at the latest sample, by name.
    pub(crate) fn series(&self) -> Vec<Series> {
        self.rings
            .iter()
            .map(|(name, ring)| Series {
                name: name.clone(),
                points: ring.window(self.now),
            })
            .collect()
    }
}

fn step_of(at: Duration) -> u32 {
    u32::try_from(at.as_millis() / STEP.as_millis()).unwrap_or(u32::MAX)
}

fn lag(ms: Option<u64>) -> Option<u32> {
    ms.map(|ms| u32::try_from(ms).unwrap_or(u32::MAX))
}

/// A worker's sample: each shard's records/s and lag.
pub(crate) fn shard_samples(status: &WorkerStatus) -> Vec<(String, Point)> {
    status
        .shards
        .iter()
        .map(|shard| {
            (
                crate::status_tree::shard_label(shard),
                Point {
                    records_per_second: shard.records_per_second as f32,
                    lag_ms: lag(shard.millis_behind_latest),
                },
            )
        })
        .collect()
}

/// The fleet's sample: each worker's records/s (from its heartbeat) and the largest lag
/// of the leases it holds. A worker whose load is unknown (dead, or without a heartbeat
/// row: `FleetWorker::load_unknown`) gives no sample, a gap, never its last figure.
pub(crate) fn worker_samples(fleet: &FleetView) -> Vec<(String, Point)> {
    fleet
        .workers
        .iter()
        .filter_map(|worker| {
            let records_per_second = worker.records_per_second?;
            let lag_ms = fleet
                .leases
                .iter()
                .filter(|l| l.owner.as_deref() == Some(worker.worker_id.as_str()))
                .filter(|l| l.state != FleetLeaseState::Finished)
                .filter_map(|l| l.millis_behind_latest)
                .max();
            Some((
                worker.worker_id.clone(),
                Point {
                    records_per_second: records_per_second as f32,
                    lag_ms: lag(lag_ms),
                },
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(rps: f32) -> Point {
        Point {
            records_per_second: rps,
            lag_ms: Some(0),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    fn values(points: &[Option<Point>]) -> Vec<Option<f32>> {
        points
            .iter()
            .map(|p| p.map(|p| p.records_per_second))
            .collect()
    }

    /// Scenarios of samples and the window the page draws: one point per step, gaps
    /// where no sample was taken, the newest sample of a step kept, and never more than
    /// a window.
    #[test]
    fn the_ring_keeps_the_last_window_with_gaps() {
        type Case = (&'static str, Vec<(u64, f32)>, Vec<(usize, Option<f32>)>);
        let cases: Vec<Case> = vec![
            (
                "one sample: the window ends with it",
                vec![(0, 1.0)],
                vec![(POINTS - 1, Some(1.0)), (0, None)],
            ),
            (
                "a step's later sample replaces its first",
                vec![(20, 1.0), (25, 2.0)],
                vec![(POINTS - 1, Some(2.0)), (POINTS - 2, None)],
            ),
            (
                "paused for a minute: six gaps between",
                vec![(0, 1.0), (10, 2.0), (80, 3.0)],
                vec![
                    (POINTS - 1, Some(3.0)),
                    (POINTS - 2, None),
                    (POINTS - 7, None),
                    (POINTS - 8, Some(2.0)),
                    (POINTS - 9, Some(1.0)),
                ],
            ),
            (
                "wraps: 11 minutes of samples keep the last 10",
                (0..66).map(|i| (i * 10, i as f32)).collect(),
                vec![(0, Some(6.0)), (POINTS - 1, Some(65.0))],
            ),
            (
                "a late sample of an older step does not move the window",
                vec![(100, 1.0), (50, 9.0)],
                vec![(POINTS - 1, Some(1.0)), (POINTS - 6, Some(9.0))],
            ),
        ];
        for (name, samples, want) in cases {
            let mut history = History::default();
            for (at, v) in samples {
                history.record(secs(at), [("s".to_owned(), p(v))]);
            }
            let series = history.series();
            assert_eq!(series.len(), 1, "{name}");
            let got = values(&series[0].points);
            assert_eq!(got.len(), POINTS, "{name}: bounded to a window");
            for (i, v) in want {
                assert_eq!(got[i], v, "{name}: point {i} of {got:?}");
            }
        }
    }

    /// A series nobody samples any more (a shard given away) leaves once its last point
    /// is out of the window; one still sampled stays.
    #[test]
    fn a_series_no_longer_sampled_is_dropped_after_a_window() {
        let mut history = History::default();
        history.record(
            secs(0),
            [("gone".to_owned(), p(1.0)), ("kept".to_owned(), p(1.0))],
        );
        for i in 1..POINTS as u64 {
            history.record(secs(i * 10), [("kept".to_owned(), p(2.0))]);
        }
        let names: Vec<String> = history.series().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["gone", "kept"], "still in the window");
        history.record(secs(POINTS as u64 * 10), [("kept".to_owned(), p(2.0))]);
        let names: Vec<String> = history.series().into_iter().map(|s| s.name).collect();
        assert_eq!(names, ["kept"]);
    }

    /// A worker whose load is unknown (dead) gives no sample, so its chart breaks
    /// rather than going on with its last records/s; a live one gives its figures.
    #[test]
    fn a_worker_whose_load_is_unknown_gives_no_sample() {
        use crate::status::FleetWorker;
        let worker = |id: &str, rps: Option<u64>| FleetWorker {
            worker_id: id.to_owned(),
            alive: rps.is_some(),
            draining: false,
            has_heartbeat: true,
            leases: 0,
            records_per_second: rps,
            bytes_per_second: None,
            load_unknown: rps.is_none().then(|| "no heartbeat for 12 s".to_owned()),
            silent_ms: 0,
        };
        let fleet = FleetView {
            workers: vec![worker("dead", None), worker("live", Some(700))],
            ..FleetView::default()
        };
        let samples = worker_samples(&fleet);
        assert_eq!(
            samples,
            [(
                "live".to_owned(),
                Point {
                    records_per_second: 700.0,
                    lag_ms: None
                }
            )]
        );
    }

    /// The memory figure the module's docs (and docs/status-and-metrics.md) give: 16
    /// bytes a point, 960 a ring's points.
    #[test]
    fn a_ring_costs_what_the_docs_say() {
        assert_eq!(std::mem::size_of::<Option<(u32, Point)>>(), 16);
        assert_eq!(std::mem::size_of::<[Option<(u32, Point)>; POINTS]>(), 960);
    }
}
