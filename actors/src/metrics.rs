//! What a worker measures, and the pure half of the metrics reporter: samples in,
//! CloudWatch datums and the status snapshot out. No I/O and no clock; the actor passes
//! the time in, so every rule here is tested without a runtime. Below the actors: the
//! status snapshots and the status endpoint read it without importing the reporter.
//!
//! What each metric is (its name, help, unit, kind and buckets) is declared once, a row
//! per metric, in `catalog`; everything here asks [`Metric`] and never matches on one.

use std::collections::{BTreeMap, VecDeque};
use std::time::SystemTime;

mod catalog;

use crate::backend::{MetricDatum, MetricValue};
use crate::model::LeaseKey;
use crate::settings::MetricsLevel;
use catalog::METRIC_COUNT;
pub use catalog::{Kind, Metric};

/// Dimension names, as the dashboards and alarms built on them expect.
pub const APPLICATION_DIMENSION: &str = "Application";
/// The stream's name: on a single-stream worker's datums, and on each stream's own datums
/// when the worker reads several.
pub const STREAM_DIMENSION: &str = "StreamName";
/// The shard's id, on the per-shard datums of the `detailed` level.
pub const SHARD_DIMENSION: &str = "ShardId";
/// A multi-stream application's stream identifier (`account:stream:creationEpoch`), as
/// the Java KCL's `MetricsUtil.addStreamId` names it: with it, two streams of one name
/// (two accounts, or a stream deleted and created again) never share a datum.
pub const STREAM_ID_DIMENSION: &str = "StreamId";

/// How many intervals of datums are kept for retry while publishing fails; older ones
/// are dropped (and counted), so an unreachable CloudWatch costs bounded memory.
pub const RETRY_INTERVALS: u32 = 10;

/// What the status endpoint shows about metrics.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct MetricsSnapshot {
    /// Per metric name since start: a counter's sum; a gauge's highest current reading
    /// across shards (the worst lag), or its latest reading when worker-wide.
    pub totals: BTreeMap<String, f64>,
    /// Per shard (its lease key: the shard id for a single stream, the KCL multi-stream
    /// key for several), per metric name: a counter's sum since start, a gauge's latest
    /// reading.
    pub per_shard: BTreeMap<String, BTreeMap<String, f64>>,
    /// Successful PutMetricData calls.
    pub published_batches: u64,
    /// Datums those calls delivered.
    pub published_datums: u64,
    /// Publishes that failed (each is retried at the next tick).
    pub publish_failures: u64,
    /// The last failed publish's error (kept after later successes).
    pub last_error: Option<String>,
    /// Datums waiting for a retry or in flight.
    pub pending_datums: u64,
    /// Datums given up on: older than `RETRY_INTERVALS` intervals, or refused as
    /// invalid by the sink.
    pub dropped_datums: u64,
    /// Samples ignored because their value was not a finite number.
    pub rejected_samples: u64,
    /// The timings' distributions since start, worker-wide (for `GET /metrics`: a
    /// histogram per shard would multiply the series by the shards).
    #[serde(skip)]
    pub histograms: Vec<HistogramSnapshot>,
}

/// One measurement. Senders batch them (one message per batch of records, never one per
/// record), so a sample usually stands for many events: `RecordsProcessed` with the
/// batch's record count, `ProcessingTime` with the time the batch took.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// What was measured.
    pub metric: Metric,
    /// The shard's lease key, which names its stream too when the worker reads several;
    /// `None` for what belongs to the worker as a whole (leases held, restarts).
    pub shard: Option<LeaseKey>,
    /// The amount or reading, in the metric's [`unit`](Metric::unit); a value that is not
    /// finite is counted and ignored.
    pub value: f64,
}

impl Sample {
    /// A sample of the worker as a whole.
    pub fn new(metric: Metric, value: f64) -> Self {
        Self {
            metric,
            shard: None,
            value,
        }
    }

    /// A sample of one shard, named by its lease key: a shard id alone names a shard only
    /// within its stream, and two streams' `shardId-000000000000` must not merge.
    pub fn shard(metric: Metric, shard: &LeaseKey, value: f64) -> Self {
        Self {
            metric,
            shard: Some(shard.clone()),
            value,
        }
    }
}

/// Samples of one interval, as CloudWatch's StatisticSet wants them: one datum then
/// carries a whole interval, whatever the number of samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Stats {
    count: u64,
    sum: f64,
    min: f64,
    max: f64,
}

impl Stats {
    fn add(&mut self, value: f64) {
        if self.count == 0 {
            self.min = value;
            self.max = value;
        } else {
            self.min = self.min.min(value);
            self.max = self.max.max(value);
        }
        self.count += 1;
        self.sum += value;
    }

    fn merge(&mut self, other: &Stats) {
        if other.count == 0 {
            return;
        }
        if self.count == 0 {
            *self = *other;
            return;
        }
        self.count += other.count;
        self.sum += other.sum;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
    }

    fn value(&self) -> MetricValue {
        MetricValue::Statistics {
            count: self.count as f64,
            sum: self.sum,
            min: self.min,
            max: self.max,
        }
    }
}

/// One metric of one shard (or of the worker): this interval, and since start.
#[derive(Debug, Clone, Copy, Default)]
struct Series {
    interval: Stats,
    total: f64,
    last: Option<f64>,
}

impl Series {
    fn add(&mut self, value: f64) {
        self.interval.add(value);
        self.total += value;
        self.last = Some(value);
    }

    /// The snapshot's figure: the sum for a counter, the latest reading for a gauge.
    fn figure(&self, kind: Kind) -> Option<f64> {
        let last = self.last?;
        Some(match kind {
            Kind::Counter => self.total,
            Kind::Gauge => last,
        })
    }
}

type Slots = [Series; METRIC_COUNT];

/// A datum's dimensions, (name, value), in the order they are published.
type Dimensions = Vec<(String, String)>;

/// Accumulates samples per (metric, shard) for the current interval and since start.
///
/// Recording is an array index plus, for a shard sample, one ordered-map lookup by the
/// lease key the sample already owns: no allocation per sample.
#[derive(Debug, Clone)]
pub struct Aggregator {
    worker: Slots,
    shards: BTreeMap<LeaseKey, Slots>,
    rejected: u64,
    /// The timings' distributions since start (metrics with [`Metric::buckets`]).
    histograms: BTreeMap<Metric, Histogram>,
}

impl Default for Aggregator {
    fn default() -> Self {
        Self {
            worker: empty_slots(),
            shards: BTreeMap::new(),
            rejected: 0,
            histograms: BTreeMap::new(),
        }
    }
}

/// A slot per metric, none recorded (by hand: `Default` stops at arrays of 32).
fn empty_slots() -> Slots {
    std::array::from_fn(|_| Series::default())
}

impl Aggregator {
    /// An aggregator with nothing recorded.
    pub fn new() -> Self {
        Self::default()
    }

    /// A non-finite value is counted and ignored: CloudWatch refuses a whole call that
    /// carries one, so it would hold every other datum hostage.
    pub fn record(&mut self, sample: Sample) {
        if !sample.value.is_finite() {
            self.rejected += 1;
            return;
        }
        let slots = match sample.shard {
            None => &mut self.worker,
            Some(shard) => self.shards.entry(shard).or_insert_with(empty_slots),
        };
        slots[sample.metric.index()].add(sample.value);
        if let Some(bounds) = sample.metric.buckets() {
            self.histograms
                .entry(sample.metric)
                .or_insert_with(|| Histogram::new(bounds))
                .observe(sample.value);
        }
    }

    /// Records each sample, as [`Self::record`] does.
    pub fn record_all(&mut self, samples: impl IntoIterator<Item = Sample>) {
        for sample in samples {
            self.record(sample);
        }
    }

    /// Ends the interval: returns its datums for `level` and starts the next one empty.
    ///
    /// `stream` is the stream of a single-stream worker, `None` for a worker of several
    /// (`worker.streams`, whose lease keys name their streams).
    ///
    /// Summary: one datum per metric that had samples, statistics over every shard and
    /// the worker, dimensions \[Application, StreamName\] for a single stream and
    /// \[Application\] for several; then, for several, one datum per stream and metric over
    /// that stream's shards, [Application, StreamName, StreamId]. Detailed: those, then
    /// one datum per shard and metric with samples, its stream's dimensions and ShardId.
    /// None: nothing (the interval is still cleared; running totals are kept at every
    /// level).
    ///
    /// Several streams' worker datum has no StreamName, as the KCL's worker-level metrics
    /// have no stream dimension: a joined list is no stream, and it would change (and
    /// orphan every alarm on it) whenever the list does.
    pub fn drain(
        &mut self,
        level: MetricsLevel,
        application: &str,
        stream: Option<&str>,
        timestamp: SystemTime,
    ) -> Vec<MetricDatum> {
        let mut out = Vec::new();
        if level != MetricsLevel::None {
            let app = vec![(APPLICATION_DIMENSION.to_owned(), application.to_owned())];
            let mut base = app.clone();
            if let Some(stream) = stream {
                base.push((STREAM_DIMENSION.to_owned(), stream.to_owned()));
            }
            for metric in Metric::ALL {
                let mut all = self.worker[metric.index()].interval;
                for slots in self.shards.values() {
                    all.merge(&slots[metric.index()].interval);
                }
                if all.count > 0 {
                    out.push(datum(metric, base.clone(), &all, timestamp));
                }
            }
            // Per stream of several: the keys of one stream are adjacent in key order
            // (they share its identifier as a prefix), but grouping by identifier does
            // not rely on it.
            let mut per_stream: BTreeMap<&str, (Dimensions, [Stats; METRIC_COUNT])> =
                BTreeMap::new();
            for (key, slots) in &self.shards {
                if let (Some(id), Some(dimensions)) =
                    (key.stream_id(), stream_dimensions(&app, key))
                {
                    let (_, stats) = per_stream
                        .entry(id)
                        .or_insert_with(|| (dimensions, std::array::from_fn(|_| Stats::default())));
                    for metric in Metric::ALL {
                        stats[metric.index()].merge(&slots[metric.index()].interval);
                    }
                }
            }
            for (dimensions, stats) in per_stream.values() {
                for metric in Metric::ALL {
                    let stats = &stats[metric.index()];
                    if stats.count > 0 {
                        out.push(datum(metric, dimensions.clone(), stats, timestamp));
                    }
                }
            }
            if level == MetricsLevel::Detailed {
                for (key, slots) in &self.shards {
                    let mut dimensions =
                        stream_dimensions(&app, key).unwrap_or_else(|| base.clone());
                    dimensions.push((SHARD_DIMENSION.to_owned(), key.shard_id().to_string()));
                    for metric in Metric::ALL {
                        let stats = &slots[metric.index()].interval;
                        if stats.count > 0 {
                            out.push(datum(metric, dimensions.clone(), stats, timestamp));
                        }
                    }
                }
            }
        }
        for series in self
            .shards
            .values_mut()
            .flat_map(|slots| slots.iter_mut())
            .chain(self.worker.iter_mut())
        {
            series.interval = Stats::default();
        }
        out
    }

    /// Per metric since start, every shard and the worker together: a counter's sum; a
    /// gauge's highest current reading across shards (for MillisBehindLatest, the
    /// worst lag), which for a worker-wide gauge is simply its latest reading.
    pub fn totals(&self) -> BTreeMap<String, f64> {
        let mut totals = BTreeMap::new();
        for metric in Metric::ALL {
            let kind = metric.kind();
            let figures = std::iter::once(&self.worker)
                .chain(self.shards.values())
                .filter_map(|slots| slots[metric.index()].figure(kind));
            let combined = match kind {
                Kind::Counter => figures.reduce(|a, b| a + b),
                Kind::Gauge => figures.reduce(f64::max),
            };
            if let Some(value) = combined {
                totals.insert(metric.name().to_owned(), value);
            }
        }
        totals
    }

    /// Per shard, per metric sampled on it: a counter's sum since start, a gauge's latest
    /// reading.
    pub fn per_shard(&self) -> BTreeMap<String, BTreeMap<String, f64>> {
        self.shards
            .iter()
            .map(|(shard, slots)| {
                let figures = Metric::ALL
                    .iter()
                    .filter_map(|m| {
                        slots[m.index()]
                            .figure(m.kind())
                            .map(|v| (m.name().to_owned(), v))
                    })
                    .collect();
                (shard.to_string(), figures)
            })
            .collect()
    }

    /// Samples ignored because their value was not a finite number.
    pub fn rejected_samples(&self) -> u64 {
        self.rejected
    }

    /// Every timing's distribution since start, in [`Metric::ALL`] order: one for each
    /// metric with buckets, empty while it has had no sample (so `/metrics` always
    /// serves the same families).
    pub fn histograms(&self) -> Vec<HistogramSnapshot> {
        Metric::ALL
            .iter()
            .filter_map(|&metric| {
                let bounds = metric.buckets()?;
                let histogram = self
                    .histograms
                    .get(&metric)
                    .cloned()
                    .unwrap_or_else(|| Histogram::new(bounds));
                Some(HistogramSnapshot { metric, histogram })
            })
            .collect()
    }
}

/// The distribution of a timing's samples: a count per bucket (not cumulative), the
/// last one past every bound, and their sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// `bounds.len() + 1` counts: `counts[i]` holds the samples at most `bounds[i]`
    /// and above `bounds[i - 1]`; the last, those above every bound.
    counts: Vec<u64>,
    sum: f64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
        }
    }

    fn observe(&mut self, value: f64) {
        let bucket = self.bounds.partition_point(|&upper| upper < value);
        self.counts[bucket] += 1;
        self.sum += value;
    }

    /// (upper bound, samples in that bucket alone), the last bound infinite.
    pub fn buckets(&self) -> Vec<(f64, u64)> {
        self.bounds
            .iter()
            .copied()
            .chain(std::iter::once(f64::INFINITY))
            .zip(self.counts.iter().copied())
            .collect()
    }

    /// Samples observed, over every bucket.
    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// The sum of the samples observed, in the metric's unit.
    pub fn sum(&self) -> f64 {
        self.sum
    }
}

/// One timing's distribution, as the status snapshot carries it.
#[derive(Debug, Clone, PartialEq)]
pub struct HistogramSnapshot {
    /// The timing measured.
    pub metric: Metric,
    /// Its samples since the worker started, worker-wide.
    pub histogram: Histogram,
}

/// The dimensions of a multi-stream key's stream: the application, the stream's name and
/// its identifier (`account:stream:creationEpoch`, the KCL's `StreamId`); `None` for a
/// single-stream key, whose stream is the worker's.
fn stream_dimensions(app: &[(String, String)], key: &LeaseKey) -> Option<Dimensions> {
    let (id, name) = (key.stream_id()?, key.stream_name()?);
    let mut dimensions = app.to_vec();
    dimensions.push((STREAM_DIMENSION.to_owned(), name.to_owned()));
    dimensions.push((STREAM_ID_DIMENSION.to_owned(), id.to_owned()));
    Some(dimensions)
}

fn datum(
    metric: Metric,
    dimensions: Vec<(String, String)>,
    stats: &Stats,
    timestamp: SystemTime,
) -> MetricDatum {
    MetricDatum {
        name: metric.name().to_owned(),
        dimensions,
        value: stats.value(),
        unit: metric.unit(),
        timestamp,
    }
}

/// Datums drained but not yet accepted by CloudWatch, oldest first, so a failed publish
/// loses nothing that a later one can still deliver.
#[derive(Debug, Clone, Default)]
pub struct Backlog {
    datums: VecDeque<MetricDatum>,
}

impl Backlog {
    /// A newly drained interval.
    pub fn push_new(&mut self, data: Vec<MetricDatum>) {
        self.datums.extend(data);
    }

    /// Datums a publish could not deliver: they are older than anything drained since,
    /// so they go first and stay first to be dropped.
    pub fn requeue(&mut self, data: Vec<MetricDatum>) {
        for datum in data.into_iter().rev() {
            self.datums.push_front(datum);
        }
    }

    pub fn take(&mut self) -> Vec<MetricDatum> {
        self.datums.drain(..).collect()
    }

    /// Drops datums stamped at or before `cutoff` and says how many went: keeps memory
    /// bounded while CloudWatch is unreachable, at the cost of the oldest minutes.
    pub fn expire(&mut self, cutoff: SystemTime) -> usize {
        let before = self.datums.len();
        self.datums.retain(|d| d.timestamp > cutoff);
        before - self.datums.len()
    }

    pub fn len(&self) -> usize {
        self.datums.len()
    }

    pub fn is_empty(&self) -> bool {
        self.datums.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::backend::Unit;
    use crate::model::ShardId;

    const APP: &str = "orders-app";
    const STREAM: &str = "orders";

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000 + secs)
    }

    /// A single-stream lease key: the shard id itself.
    fn shard(i: u64) -> LeaseKey {
        LeaseKey::from(&ShardId::from_index(i))
    }

    fn stats(count: f64, sum: f64, min: f64, max: f64) -> MetricValue {
        MetricValue::Statistics {
            count,
            sum,
            min,
            max,
        }
    }

    fn dims(extra: Option<&LeaseKey>) -> Vec<(String, String)> {
        let mut d = vec![
            ("Application".to_owned(), APP.to_owned()),
            ("StreamName".to_owned(), STREAM.to_owned()),
        ];
        if let Some(shard) = extra {
            d.push(("ShardId".to_owned(), shard.to_string()));
        }
        d
    }

    /// Two shards reading, plus worker-wide lease figures.
    fn busy() -> Aggregator {
        let mut agg = Aggregator::new();
        agg.record_all([
            Sample::shard(Metric::RecordsProcessed, &shard(0), 100.0),
            Sample::shard(Metric::RecordsProcessed, &shard(0), 50.0),
            Sample::shard(Metric::RecordsProcessed, &shard(1), 10.0),
            Sample::shard(Metric::MillisBehindLatest, &shard(0), 900.0),
            Sample::shard(Metric::MillisBehindLatest, &shard(0), 300.0),
            Sample::shard(Metric::MillisBehindLatest, &shard(1), 5000.0),
            Sample::new(Metric::LeasesHeld, 1.0),
            Sample::new(Metric::LeasesHeld, 2.0),
            Sample::new(Metric::LeasesTaken, 2.0),
        ]);
        agg
    }

    #[test]
    fn summary_is_one_datum_per_sampled_metric_across_all_shards() {
        let mut agg = busy();
        let data = agg.drain(MetricsLevel::Summary, APP, Some(STREAM), at(60));
        let got: Vec<_> = data
            .iter()
            .map(|d| (d.name.as_str(), d.dimensions.clone(), d.value, d.unit))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "RecordsProcessed",
                    dims(None),
                    stats(3.0, 160.0, 10.0, 100.0),
                    Unit::Count
                ),
                (
                    "MillisBehindLatest",
                    dims(None),
                    stats(3.0, 6200.0, 300.0, 5000.0),
                    Unit::Milliseconds
                ),
                (
                    "LeasesHeld",
                    dims(None),
                    stats(2.0, 3.0, 1.0, 2.0),
                    Unit::Count
                ),
                (
                    "LeasesTaken",
                    dims(None),
                    stats(1.0, 2.0, 2.0, 2.0),
                    Unit::Count
                ),
            ]
        );
        assert!(data.iter().all(|d| d.timestamp == at(60)));
    }

    #[test]
    fn detailed_adds_a_datum_per_shard_and_metric_and_none_for_worker_metrics() {
        let mut agg = busy();
        let data = agg.drain(MetricsLevel::Detailed, APP, Some(STREAM), at(60));
        assert_eq!(data.len(), 4 + 4, "4 summary datums, 2 metrics x 2 shards");
        let per_shard: Vec<_> = data[4..]
            .iter()
            .map(|d| (d.name.as_str(), d.dimensions.clone(), d.value))
            .collect();
        assert_eq!(
            per_shard,
            vec![
                (
                    "RecordsProcessed",
                    dims(Some(&shard(0))),
                    stats(2.0, 150.0, 50.0, 100.0)
                ),
                (
                    "MillisBehindLatest",
                    dims(Some(&shard(0))),
                    stats(2.0, 1200.0, 300.0, 900.0)
                ),
                (
                    "RecordsProcessed",
                    dims(Some(&shard(1))),
                    stats(1.0, 10.0, 10.0, 10.0)
                ),
                (
                    "MillisBehindLatest",
                    dims(Some(&shard(1))),
                    stats(1.0, 5000.0, 5000.0, 5000.0)
                ),
            ]
        );
        assert_eq!(
            data[..4],
            busy().drain(MetricsLevel::Summary, APP, Some(STREAM), at(60))[..],
            "detailed starts with exactly the summary"
        );
    }

    /// Dimensions as (name, value) pairs, for the tables below.
    fn pairs(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// Shard 0 of two streams, shard 1 of one of them, and a worker-wide lease count.
    fn two_streams() -> Aggregator {
        let orders = crate::model::StreamIdentifier::parse("111:orders:10").unwrap();
        let audit = crate::model::StreamIdentifier::parse("222:audit:20").unwrap();
        let mut agg = Aggregator::new();
        agg.record_all([
            Sample::shard(
                Metric::RecordsProcessed,
                &orders.lease_key(&ShardId::from_index(0)),
                5.0,
            ),
            Sample::shard(
                Metric::RecordsProcessed,
                &orders.lease_key(&ShardId::from_index(1)),
                7.0,
            ),
            Sample::shard(
                Metric::RecordsProcessed,
                &audit.lease_key(&ShardId::from_index(0)),
                100.0,
            ),
            Sample::shard(
                Metric::MillisBehindLatest,
                &audit.lease_key(&ShardId::from_index(0)),
                900.0,
            ),
            Sample::new(Metric::LeasesHeld, 3.0),
        ]);
        agg
    }

    /// Several streams: the worker's datum has no stream; each stream gets its own, with
    /// the KCL's StreamId; each shard's carries its own stream, so the two streams'
    /// `shardId-000000000000` never merge. One stream keeps its output as it always was.
    #[test]
    fn each_stream_has_its_own_datums_and_the_worker_none_of_a_stream() {
        let app = [("Application", APP)];
        let orders = [
            ("Application", APP),
            ("StreamName", "orders"),
            ("StreamId", "111:orders:10"),
        ];
        let audit = [
            ("Application", APP),
            ("StreamName", "audit"),
            ("StreamId", "222:audit:20"),
        ];
        let with_shard = |dims: &[(&'static str, &'static str)], shard: &'static str| {
            let mut dims = dims.to_vec();
            dims.push(("ShardId", shard));
            dims
        };
        let (s0, s1) = ("shardId-000000000000", "shardId-000000000001");
        let summary = vec![
            (
                "RecordsProcessed",
                app.to_vec(),
                stats(3.0, 112.0, 5.0, 100.0),
            ),
            (
                "MillisBehindLatest",
                app.to_vec(),
                stats(1.0, 900.0, 900.0, 900.0),
            ),
            ("LeasesHeld", app.to_vec(), stats(1.0, 3.0, 3.0, 3.0)),
            // Per stream, in identifier order: 111:orders:10, then 222:audit:20.
            (
                "RecordsProcessed",
                orders.to_vec(),
                stats(2.0, 12.0, 5.0, 7.0),
            ),
            (
                "RecordsProcessed",
                audit.to_vec(),
                stats(1.0, 100.0, 100.0, 100.0),
            ),
            (
                "MillisBehindLatest",
                audit.to_vec(),
                stats(1.0, 900.0, 900.0, 900.0),
            ),
        ];
        let mut detailed = summary.clone();
        detailed.extend([
            (
                "RecordsProcessed",
                with_shard(&orders, s0),
                stats(1.0, 5.0, 5.0, 5.0),
            ),
            (
                "RecordsProcessed",
                with_shard(&orders, s1),
                stats(1.0, 7.0, 7.0, 7.0),
            ),
            (
                "RecordsProcessed",
                with_shard(&audit, s0),
                stats(1.0, 100.0, 100.0, 100.0),
            ),
            (
                "MillisBehindLatest",
                with_shard(&audit, s0),
                stats(1.0, 900.0, 900.0, 900.0),
            ),
        ]);
        for (level, want) in [
            (MetricsLevel::None, vec![]),
            (MetricsLevel::Summary, summary),
            (MetricsLevel::Detailed, detailed),
        ] {
            let data = two_streams().drain(level, APP, None, at(60));
            let got: Vec<_> = data
                .iter()
                .map(|d| (d.name.as_str(), d.dimensions.clone(), d.value))
                .collect();
            let want: Vec<_> = want
                .into_iter()
                .map(|(name, dims, value)| (name, pairs(&dims), value))
                .collect();
            assert_eq!(got, want, "{level:?}");
            assert_eq!(crate::backend::validate(&data), Ok(()), "{level:?}");
        }
        // The snapshot keeps the shards apart by their lease keys.
        let per_shard = two_streams().per_shard();
        assert_eq!(
            per_shard["111:orders:10:shardId-000000000000"]["RecordsProcessed"],
            5.0
        );
        assert_eq!(
            per_shard["222:audit:20:shardId-000000000000"]["RecordsProcessed"],
            100.0
        );
        assert_eq!(per_shard.len(), 3);
    }

    #[test]
    fn none_publishes_nothing_but_keeps_totals() {
        let mut agg = busy();
        assert!(
            agg.drain(MetricsLevel::None, APP, Some(STREAM), at(60))
                .is_empty()
        );
        assert_eq!(agg.totals()["RecordsProcessed"], 160.0);
        assert!(
            agg.drain(MetricsLevel::Summary, APP, Some(STREAM), at(120))
                .is_empty(),
            "the None drain still ended the interval"
        );
    }

    #[test]
    fn an_interval_without_samples_gives_no_datums_and_each_interval_starts_empty() {
        let mut agg = Aggregator::new();
        assert!(
            agg.drain(MetricsLevel::Detailed, APP, Some(STREAM), at(0))
                .is_empty()
        );
        agg.record(Sample::shard(Metric::BytesProcessed, &shard(3), 4096.0));
        assert_eq!(
            agg.drain(MetricsLevel::Detailed, APP, Some(STREAM), at(60))
                .len(),
            2
        );
        agg.record(Sample::new(Metric::Throttles, 1.0));
        let next = agg.drain(MetricsLevel::Detailed, APP, Some(STREAM), at(120));
        assert_eq!(
            next.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
            ["Throttles"],
            "shard 3 had no samples this interval: no datum for it"
        );
        assert_eq!(next[0].value, stats(1.0, 1.0, 1.0, 1.0));
    }

    #[test]
    fn totals_sum_counters_and_keep_the_latest_reading_of_gauges() {
        let mut agg = busy();
        agg.drain(MetricsLevel::Summary, APP, Some(STREAM), at(60));
        agg.record_all([
            Sample::shard(Metric::RecordsProcessed, &shard(1), 40.0),
            Sample::shard(Metric::MillisBehindLatest, &shard(1), 0.0),
            Sample::new(Metric::LeasesHeld, 2.0),
        ]);
        let totals = agg.totals();
        assert_eq!(
            totals,
            BTreeMap::from([
                ("RecordsProcessed".to_owned(), 200.0),
                // Shard 1 caught up; shard 0 still reads 300.
                ("MillisBehindLatest".to_owned(), 300.0),
                ("LeasesHeld".to_owned(), 2.0),
                ("LeasesTaken".to_owned(), 2.0),
            ])
        );
        let per_shard = agg.per_shard();
        assert_eq!(
            per_shard[shard(0).as_str()],
            BTreeMap::from([
                ("RecordsProcessed".to_owned(), 150.0),
                ("MillisBehindLatest".to_owned(), 300.0),
            ])
        );
        assert_eq!(per_shard[shard(1).as_str()]["RecordsProcessed"], 50.0);
        assert_eq!(per_shard[shard(1).as_str()]["MillisBehindLatest"], 0.0);
        assert_eq!(per_shard.len(), 2, "worker-wide samples are no shard's");
    }

    #[test]
    fn non_finite_samples_are_counted_and_kept_out() {
        let mut agg = Aggregator::new();
        agg.record_all([
            Sample::new(Metric::ProcessingTime, f64::NAN),
            Sample::new(Metric::ProcessingTime, f64::INFINITY),
            Sample::new(Metric::ProcessingTime, 12.0),
        ]);
        assert_eq!(agg.rejected_samples(), 2);
        let data = agg.drain(MetricsLevel::Summary, APP, Some(STREAM), at(60));
        assert_eq!(data[0].value, stats(1.0, 12.0, 12.0, 12.0));
        assert_eq!(crate::backend::validate(&data), Ok(()));
    }

    fn named(name: &str, secs: u64) -> MetricDatum {
        MetricDatum {
            name: name.to_owned(),
            dimensions: Vec::new(),
            value: MetricValue::Value(1.0),
            unit: Unit::Count,
            timestamp: at(secs),
        }
    }

    #[test]
    fn the_backlog_puts_requeued_datums_first_and_expires_the_oldest() {
        let mut backlog = Backlog::default();
        backlog.push_new(vec![named("a", 60), named("b", 60)]);
        let taken = backlog.take();
        assert!(backlog.is_empty());
        backlog.push_new(vec![named("c", 120)]);
        backlog.requeue(taken);
        let names = |b: &Backlog| b.datums.iter().map(|d| d.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&backlog), ["a", "b", "c"]);
        assert_eq!(backlog.expire(at(59)), 0);
        assert_eq!(backlog.expire(at(60)), 2, "the cutoff itself is dropped");
        assert_eq!(names(&backlog), ["c"]);
        assert_eq!(backlog.len(), 1);
    }

    /// A sample falls in the first bucket whose bound it does not exceed (Prometheus's
    /// `le`, inclusive); past the last bound, in the infinite one. Every timing has
    /// its histogram from the start, empty until sampled; a non-finite sample is in
    /// none.
    #[test]
    fn timings_fill_their_buckets() {
        let key = LeaseKey::from(&ShardId::from_index(0));
        let mut agg = Aggregator::new();
        // (value, the bucket it lands in, by its upper bound)
        let cases = [
            (0.0, 1.0),
            (1.0, 1.0),
            (1.5, 2.5),
            (10_000.0, 10_000.0),
            (10_000.5, f64::INFINITY),
        ];
        for (value, _) in cases {
            agg.record(Sample::shard(Metric::GetRecordsTime, &key, value));
        }
        agg.record(Sample::new(Metric::GetRecordsTime, f64::NAN));
        let histograms = agg.histograms();
        let timings: Vec<Metric> = histograms.iter().map(|h| h.metric).collect();
        assert_eq!(
            timings,
            [
                Metric::ProcessingTime,
                Metric::GetRecordsTime,
                Metric::CheckpointWriteTime,
                Metric::PutToDeliveryTime
            ]
        );
        let get_records = &histograms[1].histogram;
        for (value, upper) in cases {
            let in_bucket = get_records
                .buckets()
                .iter()
                .find(|(bound, _)| *bound == upper)
                .map(|(_, n)| *n);
            assert!(
                in_bucket >= Some(1),
                "{value} not in the bucket up to {upper}"
            );
        }
        assert_eq!(get_records.count(), 5);
        assert_eq!(get_records.sum(), 20_003.0);
        assert_eq!(histograms[0].histogram.count(), 0);
        assert_eq!(histograms[0].histogram.buckets().len(), 14);
    }
}
