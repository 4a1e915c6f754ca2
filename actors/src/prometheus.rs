//! `GET /metrics`: the worker's numbers in the OpenMetrics text format, encoded by
//! `prometheus-client` (escaping, number formats, `# EOF`: the crate's, not ours).
//!
//! Everything served comes from one status snapshot, so a scrape costs one collection
//! and nothing is counted twice: the MetricsReporter's running figures (the same samples
//! CloudWatch gets) and its timings' distributions. The families are named from
//! [`Metric`] by one rule, which [`families`] states and the guide's table of
//! families (docs/status-and-metrics.md) is checked against:
//!
//! * a counter `RecordsProcessed` → `flotilla_records_processed_total`;
//! * a gauge `MillisBehindLatest` → `flotilla_millis_behind_latest`;
//! * a timing (a metric with [`Metric::buckets`]) also has a worker-wide histogram,
//!   `ProcessingTime` → `flotilla_processing_time_milliseconds` (`_bucket`, `_sum`,
//!   `_count`).
//!
//! Counters and gauges come once for the worker (no `shard` label) and once per shard
//! sampled (`shard` = its lease key); histograms only for the worker, since per shard
//! they would multiply the series by the shards and their buckets.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::metrics::{Kind, Metric, MetricsSnapshot};
use crate::status::WorkerStatus;

/// What `GET /metrics` answers with: the OpenMetrics text format, which Prometheus
/// asks for first and every scraper of the last years reads.
pub(crate) const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

const UP: &str = "flotilla_up";
const UP_HELP: &str = "1 while the worker runs.";
const UPTIME: &str = "flotilla_uptime_seconds";
const UPTIME_HELP: &str = "Seconds since the worker started.";
#[cfg(test)]
const BASE_LABELS: &str = "application, stream, worker";

/// One family as `/metrics` serves it: what a query names (a counter's `_total`
/// included; a histogram's family, whose series add `_bucket`, `_sum`, `_count`).
#[cfg(test)]
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Family {
    pub name: String,
    /// `counter`, `gauge` or `histogram`.
    pub kind: &'static str,
    pub labels: &'static str,
    pub help: &'static str,
}

/// Every family `/metrics` serves, in the order it serves them: the declaration the
/// encoder and the guide's table are both checked against.
#[cfg(test)]
pub(crate) fn families() -> Vec<Family> {
    let mut out = vec![
        Family {
            name: UP.to_owned(),
            kind: "gauge",
            labels: BASE_LABELS,
            help: UP_HELP,
        },
        Family {
            name: UPTIME.to_owned(),
            kind: "gauge",
            labels: BASE_LABELS,
            help: UPTIME_HELP,
        },
    ];
    for metric in Metric::ALL {
        let (name, kind) = counter_or_gauge(metric);
        let name = match kind {
            Kind::Counter => format!("{name}_total"),
            Kind::Gauge => name,
        };
        out.push(Family {
            name,
            kind: type_name(kind),
            labels: "application, stream, worker, shard",
            help: metric.help(),
        });
    }
    for metric in Metric::ALL {
        if metric.buckets().is_some() {
            out.push(Family {
                name: histogram_name(metric),
                kind: "histogram",
                labels: "application, stream, worker, le",
                help: metric.help(),
            });
        }
    }
    out
}

/// The family name (a counter's without `_total`, which the encoder adds) and kind.
fn counter_or_gauge(metric: Metric) -> (String, Kind) {
    (
        format!("flotilla_{}", snake_case(metric.name())),
        metric.kind(),
    )
}

fn histogram_name(metric: Metric) -> String {
    format!("flotilla_{}_milliseconds", snake_case(metric.name()))
}

#[cfg(test)]
fn type_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
    }
}

/// `RecordsProcessed` → `records_processed`.
fn snake_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len() + 4);
    for (i, c) in name.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

/// What one scrape encodes, taken from a status snapshot.
#[derive(Debug)]
pub(crate) struct Scrape {
    application: String,
    stream: String,
    worker: String,
    uptime_ms: u64,
    metrics: Option<MetricsSnapshot>,
}

impl Scrape {
    pub(crate) fn of(status: &WorkerStatus) -> Self {
        Self {
            application: status.application.clone(),
            stream: status.stream.clone(),
            worker: status.worker_id.clone(),
            uptime_ms: status.uptime_ms,
            metrics: status.metrics.clone(),
        }
    }

    /// The exposition text, ending in `# EOF`.
    pub(crate) fn text(self) -> Result<String, std::fmt::Error> {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(self));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry)?;
        Ok(out)
    }
}

/// One family of [`metric_families`]: what `/metrics` serves, as data. The text encoder
/// writes these, and the binary's OTLP push sends them, so that both name, describe and
/// bucket every family by the same rules.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricFamily {
    /// The family's name as `/metrics` serves it, a counter's without `_total` (which
    /// the Prometheus encoders add, OTel's to a monotonic sum too).
    pub name: String,
    /// The `# HELP` text: what the family measures, in a sentence.
    pub help: &'static str,
    /// The UCUM unit: `ms` for the timings' histograms, empty otherwise.
    pub unit: &'static str,
    /// The family's kind, with its series.
    pub points: FamilyPoints,
}

/// A family's series. Every point carries the worker's labels (`application`,
/// `stream`, `worker`); counters and gauges once without and once per shard with
/// `shard`, as `/metrics` serves them.
#[derive(Debug, Clone, PartialEq)]
pub enum FamilyPoints {
    /// A running total since the worker started: (labels, value).
    Counter(Vec<(Vec<(&'static str, String)>, f64)>),
    /// A current reading: (labels, value).
    Gauge(Vec<(Vec<(&'static str, String)>, f64)>),
    /// The worker-wide distribution since start.
    Histogram {
        /// The worker's labels (no `shard`: the distribution is worker-wide).
        labels: Vec<(&'static str, String)>,
        /// (upper bound, samples in that bucket alone), the last bound infinite.
        buckets: Vec<(f64, u64)>,
        /// The sum of every sample, in milliseconds.
        sum: f64,
        /// Samples observed, over every bucket.
        count: u64,
    },
}

/// The families `/metrics` would serve for this status, in its order, with their
/// unescaped label values.
pub fn metric_families(status: &WorkerStatus) -> Vec<MetricFamily> {
    Scrape::of(status).families()
}

impl Scrape {
    fn families(&self) -> Vec<MetricFamily> {
        let base = vec![
            ("application", self.application.clone()),
            ("stream", self.stream.clone()),
            ("worker", self.worker.clone()),
        ];
        let gauge = |name: &str, help, value| MetricFamily {
            name: name.to_owned(),
            help,
            unit: "",
            points: FamilyPoints::Gauge(vec![(base.clone(), value)]),
        };
        let mut out = vec![
            gauge(UP, UP_HELP, 1.0),
            gauge(UPTIME, UPTIME_HELP, self.uptime_ms as f64 / 1000.0),
        ];
        let Some(metrics) = &self.metrics else {
            return out;
        };
        for metric in Metric::ALL {
            let (name, kind) = counter_or_gauge(metric);
            let key = metric.name();
            let worker = metrics.totals.get(key).copied().unwrap_or(0.0);
            let shards = metrics
                .per_shard
                .iter()
                .filter_map(|(shard, values)| Some((Some(shard), *values.get(key)?)));
            let series = std::iter::once((None, worker))
                .chain(shards)
                .map(|(shard, value)| {
                    let mut labels = base.clone();
                    if let Some(shard) = shard {
                        labels.push(("shard", shard.clone()));
                    }
                    (labels, value)
                })
                .collect();
            out.push(MetricFamily {
                name,
                help: metric.help(),
                unit: "",
                points: match kind {
                    Kind::Counter => FamilyPoints::Counter(series),
                    Kind::Gauge => FamilyPoints::Gauge(series),
                },
            });
        }
        for timing in &metrics.histograms {
            out.push(MetricFamily {
                name: histogram_name(timing.metric),
                help: timing.metric.help(),
                unit: "ms",
                points: FamilyPoints::Histogram {
                    labels: base.clone(),
                    buckets: timing.histogram.buckets(),
                    sum: timing.histogram.sum(),
                    count: timing.histogram.count(),
                },
            });
        }
        out
    }
}

/// A label value as the text format wants it. The encoder (0.24) writes values as it
/// is given them, so a `"` in an application's name would end the value early.
fn escape(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Collector for Scrape {
    /// The text is [`Scrape::families`] encoded, so `/metrics` and the OTLP push cannot
    /// name, describe or bucket a family differently.
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let escaped = |labels: &[(&'static str, String)]| -> Vec<(&'static str, String)> {
            labels
                .iter()
                .map(|(name, value)| (*name, escape(value)))
                .collect()
        };
        for family in self.families() {
            let metric_type = match &family.points {
                FamilyPoints::Counter(_) => MetricType::Counter,
                FamilyPoints::Gauge(_) => MetricType::Gauge,
                FamilyPoints::Histogram { .. } => MetricType::Histogram,
            };
            let mut descriptor =
                encoder.encode_descriptor(&family.name, family.help, None, metric_type)?;
            match &family.points {
                FamilyPoints::Counter(series) => {
                    for (labels, value) in series {
                        ConstCounter::new(*value)
                            .encode(descriptor.encode_family(&escaped(labels))?)?;
                    }
                }
                FamilyPoints::Gauge(series) => {
                    for (labels, value) in series {
                        let labels = escaped(labels);
                        let series = descriptor.encode_family(&labels)?;
                        // `flotilla_up` is written as the integer `1`.
                        if family.name == UP {
                            ConstGauge::new(*value as i64).encode(series)?;
                        } else {
                            ConstGauge::new(*value).encode(series)?;
                        }
                    }
                }
                FamilyPoints::Histogram {
                    labels,
                    buckets,
                    sum,
                    count,
                } => {
                    // The encoder writes its last bucket as `+Inf` when its bound is
                    // `f64::MAX`.
                    let buckets: Vec<(f64, u64)> = buckets
                        .iter()
                        .map(|&(upper, n)| (if upper.is_finite() { upper } else { f64::MAX }, n))
                        .collect();
                    descriptor
                        .encode_family(&escaped(labels))?
                        .encode_histogram::<Vec<(&str, String)>>(*sum, *count, &buckets, None)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::metrics::{Aggregator, Sample};
    use crate::model::{LeaseKey, ShardId};

    fn scrape(metrics: Option<MetricsSnapshot>) -> Scrape {
        Scrape {
            application: "orders-app".to_owned(),
            stream: "orders".to_owned(),
            worker: "w\"1".to_owned(),
            uptime_ms: 2_500,
            metrics,
        }
    }

    /// Every metric sampled on one shard and for the worker, and each timing once.
    fn busy() -> MetricsSnapshot {
        let key = LeaseKey::from(&ShardId::from_index(0));
        let mut agg = Aggregator::new();
        for metric in Metric::ALL {
            agg.record(Sample::shard(metric, &key, 3.0));
        }
        MetricsSnapshot {
            totals: agg.totals(),
            per_shard: agg.per_shard(),
            histograms: agg.histograms(),
            ..MetricsSnapshot::default()
        }
    }

    /// (name a query uses, type) of each `# TYPE` line, and each family's `# HELP`.
    fn served(text: &str) -> (Vec<(String, String)>, BTreeMap<String, String>) {
        let mut types = Vec::new();
        let mut helps = BTreeMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').unwrap();
                let name = match kind {
                    "counter" => format!("{name}_total"),
                    _ => name.to_owned(),
                };
                types.push((name, kind.to_owned()));
            } else if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
                helps.insert(name.to_owned(), help.to_owned());
            }
        }
        (types, helps)
    }

    #[test]
    fn metric_names_become_prometheus_names() {
        assert_eq!(snake_case("RecordsProcessed"), "records_processed");
        assert_eq!(snake_case("MillisBehindLatest"), "millis_behind_latest");
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }

    /// What is served is what `families` says, in its order, each with its help; the
    /// names of the families that existed before the encoder are kept.
    #[test]
    fn served_families_are_the_declared_ones() {
        let text = scrape(Some(busy())).text().unwrap();
        let (types, helps) = served(&text);
        let declared: Vec<(String, String)> = families()
            .into_iter()
            .map(|f| (f.name, f.kind.to_owned()))
            .collect();
        assert_eq!(types, declared, "{text}");
        for family in families() {
            assert!(!family.help.is_empty(), "{} has no help", family.name);
        }
        assert_eq!(helps.len(), types.len(), "{text}");
        assert!(helps.values().all(|h| !h.is_empty()), "{text}");
        for kept in [
            "flotilla_up",
            "flotilla_uptime_seconds",
            "flotilla_records_processed_total",
            "flotilla_millis_behind_latest",
            "flotilla_processing_time_total",
            "flotilla_heartbeat_failures",
            "flotilla_leases_held",
        ] {
            assert!(types.iter().any(|(name, _)| name == kept), "{kept}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    /// Series: the worker's without `shard`, the shard's with it (labels escaped), and
    /// the histograms' cumulative buckets up to `+Inf`.
    #[test]
    fn series_carry_the_worker_and_shard_labels() {
        let text = scrape(Some(busy())).text().unwrap();
        let base = r#"application="orders-app",stream="orders",worker="w\"1""#;
        let lines: Vec<&str> = text.lines().collect();
        for expected in [
            format!("flotilla_up{{{base}}} 1"),
            format!("flotilla_uptime_seconds{{{base}}} 2.5"),
            format!("flotilla_records_processed_total{{{base}}} 3.0"),
            format!(
                "flotilla_records_processed_total{{{base},shard=\"shardId-000000000000\"}} 3.0"
            ),
            format!("flotilla_leases_held{{{base},shard=\"shardId-000000000000\"}} 3.0"),
            format!("flotilla_get_records_time_milliseconds_bucket{{le=\"2.5\",{base}}} 0"),
            format!("flotilla_get_records_time_milliseconds_bucket{{le=\"5.0\",{base}}} 1"),
            format!("flotilla_get_records_time_milliseconds_bucket{{le=\"+Inf\",{base}}} 1"),
            format!("flotilla_get_records_time_milliseconds_count{{{base}}} 1"),
            format!("flotilla_get_records_time_milliseconds_sum{{{base}}} 3.0"),
        ] {
            assert!(lines.contains(&expected.as_str()), "{expected}\n{text}");
        }
    }

    /// The families as data are the declared ones (a counter named without `_total`),
    /// with the same help, labels and buckets the text carries.
    #[test]
    fn families_as_data_are_the_served_ones() {
        let data = scrape(Some(busy())).families();
        let as_declared: Vec<(String, &str, &str)> = data
            .iter()
            .map(|f| match &f.points {
                FamilyPoints::Counter(_) => (format!("{}_total", f.name), "counter", f.help),
                FamilyPoints::Gauge(_) => (f.name.clone(), "gauge", f.help),
                FamilyPoints::Histogram { .. } => (f.name.clone(), "histogram", f.help),
            })
            .collect();
        let declared: Vec<(String, &str, &str)> = families()
            .into_iter()
            .map(|f| (f.name, f.kind, f.help))
            .collect();
        assert_eq!(as_declared, declared);
        let processed = data
            .iter()
            .find(|f| f.name == "flotilla_records_processed")
            .unwrap();
        let FamilyPoints::Counter(series) = &processed.points else {
            panic!("{processed:?}");
        };
        let base = vec![
            ("application", "orders-app".to_owned()),
            ("stream", "orders".to_owned()),
            ("worker", "w\"1".to_owned()),
        ];
        let mut on_shard = base.clone();
        on_shard.push(("shard", "shardId-000000000000".to_owned()));
        assert_eq!(series, &vec![(base.clone(), 3.0), (on_shard, 3.0)]);
        let timing = data
            .iter()
            .find(|f| f.name == "flotilla_get_records_time_milliseconds")
            .unwrap();
        assert_eq!(timing.unit, "ms");
        let FamilyPoints::Histogram {
            labels,
            buckets,
            sum,
            count,
        } = &timing.points
        else {
            panic!("{timing:?}");
        };
        assert_eq!((labels, *sum, *count), (&base, 3.0, 1));
        assert_eq!(
            buckets.iter().map(|(_, n)| n).sum::<u64>(),
            1,
            "{buckets:?}"
        );
        assert_eq!(buckets.last().map(|(upper, _)| *upper), Some(f64::INFINITY));
        let before = scrape(None).families();
        let names: Vec<&str> = before.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, [UP, UPTIME]);
    }

    /// Before the first metrics snapshot: only that the worker is up.
    #[test]
    fn without_metrics_only_up_and_uptime() {
        let text = scrape(None).text().unwrap();
        let (types, _) = served(&text);
        let names: Vec<&str> = types.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, [UP, UPTIME]);
    }

    /// The guide's table of families (docs/status-and-metrics.md, under "Prometheus
    /// metrics") lists exactly what is served, with the same type: one definition,
    /// checked.
    #[test]
    fn the_guide_lists_every_family() {
        const CHAPTER: &str = include_str!("../../docs/status-and-metrics.md");
        let section = CHAPTER
            .split("\n## Prometheus metrics\n")
            .nth(1)
            .expect("docs/status-and-metrics.md has a Prometheus metrics section");
        let documented: Vec<(String, String, String)> = section
            .lines()
            .skip_while(|l| !l.starts_with("| family"))
            .skip(2)
            .take_while(|l| l.starts_with('|'))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                let name = cells[1].trim_matches('`').to_owned();
                (name, cells[2].to_owned(), cells[3].to_owned())
            })
            .collect();
        let declared: Vec<(String, String, String)> = families()
            .into_iter()
            .map(|f| (f.name, f.kind.to_owned(), f.labels.to_owned()))
            .collect();
        assert_eq!(documented, declared);
    }
}
