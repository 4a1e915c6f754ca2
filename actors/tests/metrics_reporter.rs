#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The MetricsReporter actor.
//!
//! * `memory`: paused time and [`MemoryMetrics`], which records each PutMetricData call as
//!   CloudWatch would receive it: one call per interval, a split only past the API
//!   limits, nothing at level none, retries after a failing sink (bounded), flush, and a
//!   slow sink that holds up neither the mailbox nor the one-publish-at-a-time rule.
//! * `cloudwatch`: the real [`CloudWatchMetrics`] adapter over loopback to a capture
//!   endpoint that decodes the RPC-v2 CBOR body, in real time (real sockets).

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use flotilla_actors::backend::clock::Clock;
use flotilla_actors::backend::memory::MemoryMetrics;
use flotilla_actors::backend::{MetricDatum, MetricValue, MetricsError, MetricsSink};
use flotilla_actors::metrics_reporter::{
    Metric, MetricsArgs, MetricsMsg, MetricsReporter, MetricsSnapshot, Sample,
};
use flotilla_actors::model::{LeaseKey, ShardId};
use flotilla_actors::settings::{MetricsLevel, MetricsSettings};
use futures::future::{BoxFuture, FutureExt};
use ractor::{Actor, ActorRef};
use tokio::task::JoinHandle;
use tokio::time::Instant;

const INTERVAL: Duration = Duration::from_secs(60);
const NAMESPACE: &str = "Flotilla/Test";
const APP: &str = "orders-app";
const STREAM: &str = "orders";

struct Reporter {
    actor: ActorRef<MetricsMsg>,
    handle: JoinHandle<()>,
    /// When the reporter started: its ticks fall on whole intervals after this.
    started: Instant,
    /// The reporter's clock, to tell what time it stamps.
    clock: Clock,
}

impl Reporter {
    async fn start(level: MetricsLevel, sink: Arc<dyn MetricsSink>) -> Self {
        let clock = Clock::new();
        let started = clock.base();
        let args = MetricsArgs {
            sink,
            settings: MetricsSettings {
                level,
                namespace: NAMESPACE.to_owned(),
                interval: INTERVAL,
            },
            application: APP.to_owned(),
            stream: Some(STREAM.to_owned()),
            worker_id: "worker-a".to_owned(),
            clock,
        };
        let (actor, handle) = Actor::spawn(None, MetricsReporter, args).await.unwrap();
        Self {
            actor,
            handle,
            started,
            clock,
        }
    }

    fn record(&self, samples: Vec<Sample>) {
        self.actor.cast(MetricsMsg::Record(samples)).unwrap();
    }

    async fn snapshot(&self) -> MetricsSnapshot {
        ractor::call_t!(self.actor, MetricsMsg::Snapshot, 5_000).unwrap()
    }

    async fn flush(&self) -> Result<usize, String> {
        ractor::call_t!(self.actor, MetricsMsg::Flush, 60_000).unwrap()
    }

    /// Sleeps to half-way through interval `n` (counting from 0), so the tick that ends
    /// interval `n - 1` has been handled and nothing races the next one.
    async fn midway(&self, n: u32) {
        tokio::time::sleep_until(self.started + INTERVAL * n + INTERVAL / 2).await;
        // A round trip: every message sent before it has been handled.
        self.snapshot().await;
    }

    async fn stop(self) {
        self.actor.stop(None);
        self.handle.await.unwrap();
    }
}

/// A single-stream worker's lease key: the shard id itself.
fn shard(i: u64) -> LeaseKey {
    LeaseKey::from(&ShardId::from_index(i))
}

/// One reader's report of one batch of records.
fn batch(shard_index: u64, records: f64) -> Vec<Sample> {
    let id = shard(shard_index);
    vec![
        Sample::shard(Metric::RecordsProcessed, &id, records),
        Sample::shard(Metric::BytesProcessed, &id, records * 100.0),
        Sample::shard(Metric::MillisBehindLatest, &id, 1_000.0 / records),
        Sample::shard(Metric::ProcessingTime, &id, 3.0),
    ]
}

fn sum_of(data: &[MetricDatum], name: &str) -> f64 {
    data.iter()
        .filter(|d| d.name == name)
        .map(|d| match d.value {
            MetricValue::Statistics { sum, .. } => sum,
            MetricValue::Value(v) => v,
        })
        .sum()
}

/// The datums that carry no shard dimension.
fn summary(data: &[MetricDatum]) -> Vec<MetricDatum> {
    data.iter()
        .filter(|d| d.dimensions.len() == 2)
        .cloned()
        .collect()
}

mod memory {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn many_records_make_exactly_one_put_per_interval() {
        let sink = MemoryMetrics::new();
        let reporter = Reporter::start(MetricsLevel::Summary, Arc::new(sink.clone())).await;
        reporter.midway(0).await;

        for interval in 1..=3u32 {
            for round in 0..250u32 {
                reporter.record(batch(u64::from(round % 8), 10.0));
                if round % 50 == 0 {
                    reporter.record(vec![Sample::new(Metric::LeasesHeld, 8.0)]);
                }
            }
            reporter.midway(interval).await;

            let calls = sink.calls();
            assert_eq!(calls.len(), interval as usize, "one call per interval");
            let (namespace, data) = calls.last().unwrap();
            assert_eq!(namespace, NAMESPACE);
            let names: Vec<_> = data.iter().map(|d| d.name.as_str()).collect();
            assert_eq!(
                names,
                [
                    "RecordsProcessed",
                    "BytesProcessed",
                    "MillisBehindLatest",
                    "ProcessingTime",
                    "LeasesHeld"
                ],
                "summary: one datum per sampled metric, whatever the shards"
            );
            for datum in data {
                assert_eq!(
                    datum.dimensions,
                    [
                        ("Application".to_owned(), APP.to_owned()),
                        ("StreamName".to_owned(), STREAM.to_owned())
                    ]
                );
            }
            assert_eq!(
                data[0].value,
                MetricValue::Statistics {
                    count: 250.0,
                    sum: 2_500.0,
                    min: 10.0,
                    max: 10.0
                }
            );
            let tick = reporter.clock.wall() - INTERVAL / 2;
            assert!(
                data.iter().all(|d| d.timestamp == tick),
                "stamped when the tick ended the interval"
            );
        }

        let snapshot = reporter.snapshot().await;
        assert_eq!(snapshot.totals["RecordsProcessed"], 7_500.0);
        assert_eq!(snapshot.totals["BytesProcessed"], 750_000.0);
        assert_eq!(
            snapshot.totals["LeasesHeld"], 8.0,
            "a gauge: its last value"
        );
        assert_eq!(snapshot.per_shard.len(), 8);
        assert_eq!(
            snapshot.per_shard[shard(0).as_str()]["RecordsProcessed"],
            960.0,
            "rounds 0, 8, .. 248: 32 batches of 10 records in each interval"
        );
        assert_eq!(snapshot.published_batches, 3);
        assert_eq!(snapshot.published_datums, 15);
        assert_eq!(snapshot.publish_failures, 0);
        assert_eq!(snapshot.pending_datums, 0);
        reporter.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn detailed_past_the_datum_limit_splits_into_two_calls_in_the_same_tick() {
        let sink = MemoryMetrics::new();
        let reporter = Reporter::start(MetricsLevel::Detailed, Arc::new(sink.clone())).await;
        // 600 shards x 2 metrics, plus 2 summary datums: 1202 > 1000.
        for i in 0..600 {
            let id = shard(i);
            reporter.record(vec![
                Sample::shard(Metric::RecordsProcessed, &id, 5.0),
                Sample::shard(Metric::MillisBehindLatest, &id, 250.0),
            ]);
        }
        reporter.midway(1).await;

        let calls = sink.calls();
        let sizes: Vec<_> = calls.iter().map(|(_, data)| data.len()).collect();
        assert_eq!(sizes, [1000, 202]);
        let all = sink.datums();
        assert!(
            all.iter().all(|d| d.timestamp == all[0].timestamp),
            "both calls carry the same tick"
        );
        assert_eq!(summary(&all).len(), 2);
        assert_eq!(sum_of(&summary(&all), "RecordsProcessed"), 3_000.0);
        let per_shard: Vec<_> = all.iter().filter(|d| d.dimensions.len() == 3).collect();
        assert_eq!(per_shard.len(), 1200);
        assert_eq!(
            per_shard[0].dimensions[2],
            ("ShardId".to_owned(), shard(0).to_string())
        );

        reporter.midway(2).await;
        assert_eq!(
            sink.calls().len(),
            2,
            "an interval with no samples sends nothing"
        );
        assert_eq!(reporter.snapshot().await.published_batches, 2);
        reporter.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn level_none_never_calls_the_sink_but_keeps_totals() {
        let sink = CountingSink::failing(0);
        let reporter = Reporter::start(MetricsLevel::None, sink.clone()).await;
        for interval in 1..=3 {
            reporter.record(batch(1, 7.0));
            reporter.midway(interval).await;
        }
        assert_eq!(reporter.flush().await, Ok(0));
        assert_eq!(sink.attempts(), 0);
        let snapshot = reporter.snapshot().await;
        assert_eq!(snapshot.totals["RecordsProcessed"], 21.0);
        assert_eq!(snapshot.published_batches, 0);
        reporter.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_sink_is_retried_next_tick_and_nothing_is_lost() {
        let sink = CountingSink::failing(2);
        let reporter = Reporter::start(MetricsLevel::Summary, sink.clone()).await;
        for interval in 1..=3 {
            reporter.record(batch(1, 10.0 * f64::from(interval)));
            reporter.midway(interval).await;
            let snapshot = reporter.snapshot().await;
            assert_eq!(sink.attempts(), interval as usize, "one attempt per tick");
            if interval < 3 {
                assert_eq!(snapshot.publish_failures, u64::from(interval));
                assert_eq!(snapshot.pending_datums, 4 * u64::from(interval));
                assert!(
                    snapshot.last_error.as_deref().unwrap().contains("injected"),
                    "{:?}",
                    snapshot.last_error
                );
            }
        }

        let calls = sink.memory.calls();
        assert_eq!(
            calls.len(),
            1,
            "the backlog and the new interval in one call"
        );
        let data = &calls[0].1;
        assert_eq!(data.len(), 12, "4 metrics x 3 intervals");
        assert_eq!(sum_of(data, "RecordsProcessed"), 60.0);
        let mut stamps: Vec<_> = data.iter().map(|d| d.timestamp).collect();
        assert!(stamps.is_sorted(), "oldest first");
        stamps.dedup();
        assert_eq!(stamps.len(), 3, "each interval keeps its own timestamp");

        let snapshot = reporter.snapshot().await;
        assert_eq!(snapshot.publish_failures, 2);
        assert_eq!(snapshot.published_datums, 12);
        assert_eq!((snapshot.pending_datums, snapshot.dropped_datums), (0, 0));
        reporter.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn an_unreachable_cloudwatch_keeps_only_the_last_ten_intervals() {
        let sink = CountingSink::failing(usize::MAX);
        let reporter = Reporter::start(MetricsLevel::Summary, sink.clone()).await;
        for interval in 1..=15 {
            reporter.record(vec![Sample::new(Metric::ActorRestarts, 1.0)]);
            reporter.midway(interval).await;
        }
        let snapshot = reporter.snapshot().await;
        assert_eq!(snapshot.pending_datums, 10);
        assert_eq!(snapshot.dropped_datums, 5);
        assert_eq!(snapshot.publish_failures, 15);
        assert_eq!(snapshot.totals["ActorRestarts"], 15.0);
        reporter.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn flush_publishes_at_once_and_reports_a_failure() {
        let sink = CountingSink::failing(1);
        let reporter = Reporter::start(MetricsLevel::Detailed, sink.clone()).await;
        reporter.record(batch(4, 25.0));
        let before = Instant::now();
        assert!(
            reporter.flush().await.unwrap_err().contains("injected"),
            "the failure is the caller's to see"
        );
        assert_eq!(
            reporter.flush().await,
            Ok(8),
            "the failed datums, retried: 4 summary + 4 for the shard"
        );
        assert_eq!(before.elapsed(), Duration::ZERO, "no waiting for a tick");
        assert_eq!(sink.memory.calls().len(), 1);
        assert_eq!(sum_of(&sink.memory.datums(), "RecordsProcessed"), 50.0);
        assert_eq!(reporter.flush().await, Ok(0), "nothing left: no call");
        assert_eq!(sink.attempts(), 2);

        reporter.midway(1).await;
        assert_eq!(sink.attempts(), 2, "the tick found nothing to send");
        reporter.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_slow_publish_holds_up_neither_snapshots_nor_a_flush() {
        let sink = CountingSink::failing(0).with_delay(Duration::from_secs(20));
        let reporter = Reporter::start(MetricsLevel::Summary, sink.clone()).await;
        reporter.record(batch(0, 1.0));
        // The tick at 60 s starts a publish that takes until 80 s.
        tokio::time::sleep_until(reporter.started + INTERVAL + Duration::from_secs(5)).await;
        let asked = Instant::now();
        let snapshot = reporter.snapshot().await;
        assert_eq!(asked.elapsed(), Duration::ZERO);
        assert_eq!(snapshot.pending_datums, 4, "in flight");

        reporter.record(batch(0, 2.0));
        let flushed = reporter.flush().await;
        assert_eq!(flushed, Ok(4), "the samples recorded before the flush");
        assert_eq!(
            Instant::now() - reporter.started,
            INTERVAL + Duration::from_secs(40),
            "after the publish in flight, then its own"
        );
        assert_eq!(sink.memory.calls().len(), 2);
        assert_eq!(sum_of(&sink.memory.datums(), "RecordsProcessed"), 3.0);
        reporter.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_publish_slower_than_the_interval_is_never_doubled() {
        let sink = CountingSink::failing(0).with_delay(INTERVAL + INTERVAL / 2);
        let reporter = Reporter::start(MetricsLevel::Summary, sink.clone()).await;
        // Ticks at 60 s (a publish until 150 s), 120 s (one in flight: it keeps its
        // datums), 180 s (publishes what 120 s kept and its own, until 270 s).
        for interval in 1..=3 {
            reporter.record(vec![Sample::new(Metric::LeasesTaken, 1.0)]);
            reporter.midway(interval).await;
        }
        assert_eq!(sink.attempts(), 2, "no publish at the 120 s tick");
        assert_eq!(sink.most_at_once(), 1);
        assert_eq!(
            sink.memory.calls().len(),
            1,
            "the second is still in flight"
        );

        reporter.midway(5).await;
        let calls = sink.memory.calls();
        assert_eq!(
            calls.iter().map(|(_, data)| data.len()).collect::<Vec<_>>(),
            [1, 2]
        );
        assert_eq!(sum_of(&calls[1].1, "LeasesTaken"), 2.0);
        assert_eq!(
            sink.attempts(),
            2,
            "ticks with nothing to send send nothing"
        );
        assert_eq!(reporter.snapshot().await.pending_datums, 0);
        reporter.stop().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_zero_interval_is_refused_at_start() {
        let args = MetricsArgs {
            sink: Arc::new(MemoryMetrics::new()),
            settings: MetricsSettings {
                interval: Duration::ZERO,
                ..MetricsSettings::default()
            },
            application: APP.to_owned(),
            stream: Some(STREAM.to_owned()),
            worker_id: "worker-a".to_owned(),
            clock: Clock::new(),
        };
        let err = Actor::spawn(None, MetricsReporter, args).await.unwrap_err();
        assert!(err.to_string().contains("metrics.interval"), "{err}");
    }

    /// A sink that fails its first `failures` calls, can take its time, and counts
    /// every call; what it accepts goes to a [`MemoryMetrics`].
    struct CountingSink {
        memory: MemoryMetrics,
        failures_left: AtomicUsize,
        attempts: AtomicUsize,
        running: AtomicUsize,
        most_running: AtomicUsize,
        delay: Duration,
    }

    impl CountingSink {
        fn failing(failures: usize) -> Arc<Self> {
            Arc::new(Self {
                memory: MemoryMetrics::new(),
                failures_left: AtomicUsize::new(failures),
                attempts: AtomicUsize::new(0),
                running: AtomicUsize::new(0),
                most_running: AtomicUsize::new(0),
                delay: Duration::ZERO,
            })
        }

        fn with_delay(self: Arc<Self>, delay: Duration) -> Arc<Self> {
            let mut sink = Arc::into_inner(self).unwrap();
            sink.delay = delay;
            Arc::new(sink)
        }

        fn attempts(&self) -> usize {
            self.attempts.load(Ordering::SeqCst)
        }

        /// The most calls that were running at one time.
        fn most_at_once(&self) -> usize {
            self.most_running.load(Ordering::SeqCst)
        }
    }

    impl MetricsSink for CountingSink {
        fn put<'a>(
            &'a self,
            namespace: &'a str,
            data: Vec<MetricDatum>,
        ) -> BoxFuture<'a, Result<(), MetricsError>> {
            async move {
                self.attempts.fetch_add(1, Ordering::SeqCst);
                let running = self.running.fetch_add(1, Ordering::SeqCst) + 1;
                self.most_running.fetch_max(running, Ordering::SeqCst);
                tokio::time::sleep(self.delay).await;
                self.running.fetch_sub(1, Ordering::SeqCst);
                let fail = self
                    .failures_left
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
                if fail {
                    return Err(MetricsError::Transient {
                        endpoint: "test".to_owned(),
                        message: "injected failure".to_owned(),
                    });
                }
                self.memory.put(namespace, data).await
            }
            .boxed()
        }
    }
}

mod cloudwatch {
    use std::io::Read;

    use aws_config::retry::RetryConfig;
    use axum::Router;
    use axum::body::Bytes;
    use axum::http::{HeaderMap, StatusCode};
    use ciborium::Value;
    use flate2::bufread::GzDecoder;
    use flotilla_actors::backend::aws::CloudWatchMetrics;
    use std::sync::Mutex;

    use super::support::servers;
    use super::*;

    /// One datum as it arrived on the wire.
    #[derive(Debug, Clone, PartialEq)]
    struct Wire {
        name: String,
        dimensions: Vec<(String, String)>,
        /// SampleCount, Sum, Minimum, Maximum.
        statistics: [f64; 4],
        unit: String,
    }

    /// A loopback PutMetricData endpoint: keeps each body's namespace and datums and
    /// answers as CloudWatch does. `contract_metrics.rs` checks the protocol itself in
    /// detail; this one only reads what the reporter's calls carried.
    async fn capture() -> (String, Arc<Mutex<Vec<(String, Vec<Wire>)>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let kept = calls.clone();
        let app = Router::new().fallback(move |headers: HeaderMap, body: Bytes| {
            let kept = kept.clone();
            async move {
                let call = decode(&headers, &body);
                kept.lock().unwrap().push(call);
                (
                    StatusCode::OK,
                    [
                        ("smithy-protocol", "rpc-v2-cbor"),
                        ("content-type", "application/cbor"),
                    ],
                    cbor(&Value::Map(Vec::new())),
                )
            }
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (url, calls)
    }

    fn decode(headers: &HeaderMap, body: &[u8]) -> (String, Vec<Wire>) {
        let mut content = body.to_vec();
        if headers.get("content-encoding").map(|v| v.as_bytes()) == Some(b"gzip") {
            content.clear();
            GzDecoder::new(body).read_to_end(&mut content).unwrap();
        }
        let value: Value = ciborium::from_reader(&content[..]).unwrap();
        let top = value.as_map().unwrap();
        let namespace = text(get(top, "Namespace"));
        let datums = get(top, "MetricData")
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                let d = d.as_map().unwrap();
                let stats = get(d, "StatisticValues").as_map().unwrap();
                Wire {
                    name: text(get(d, "MetricName")),
                    dimensions: get(d, "Dimensions")
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|dim| {
                            let dim = dim.as_map().unwrap();
                            (text(get(dim, "Name")), text(get(dim, "Value")))
                        })
                        .collect(),
                    statistics: ["SampleCount", "Sum", "Minimum", "Maximum"]
                        .map(|k| get(stats, k).as_float().unwrap()),
                    unit: text(get(d, "Unit")),
                }
            })
            .collect();
        (namespace, datums)
    }

    fn get<'a>(map: &'a [(Value, Value)], key: &str) -> &'a Value {
        map.iter()
            .find(|(k, _)| k.as_text() == Some(key))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("missing {key}"))
    }

    fn text(value: &Value) -> String {
        value.as_text().unwrap().to_owned()
    }

    fn cbor(value: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        ciborium::into_writer(value, &mut out).unwrap();
        out
    }

    fn dims(shard: Option<&LeaseKey>) -> Vec<(String, String)> {
        let mut d = vec![
            ("Application".to_owned(), APP.to_owned()),
            ("StreamName".to_owned(), STREAM.to_owned()),
        ];
        d.extend(shard.map(|s| ("ShardId".to_owned(), s.to_string())));
        d
    }

    #[tokio::test]
    async fn metrics_reach_the_capture_endpoint_through_the_real_adapter() {
        let (url, calls) = capture().await;
        let config = servers::sdk_config()
            .into_builder()
            .retry_config(RetryConfig::disabled())
            .build();
        let sink = CloudWatchMetrics::new(&config, Some(&url));
        let reporter = Reporter::start(MetricsLevel::Detailed, Arc::new(sink)).await;
        reporter.record(vec![
            Sample::shard(Metric::RecordsProcessed, &shard(0), 100.0),
            Sample::shard(Metric::BytesProcessed, &shard(0), 51_200.0),
            Sample::shard(Metric::MillisBehindLatest, &shard(0), 1_500.0),
        ]);
        reporter.record(vec![
            Sample::shard(Metric::RecordsProcessed, &shard(1), 20.0),
            Sample::new(Metric::LeasesHeld, 2.0),
        ]);

        assert_eq!(reporter.flush().await, Ok(8));

        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 1);
        let (namespace, datums) = &calls[0];
        assert_eq!(namespace, NAMESPACE);
        let wire = |name: &str, shard: Option<&LeaseKey>, statistics: [f64; 4], unit: &str| Wire {
            name: name.to_owned(),
            dimensions: dims(shard),
            statistics,
            unit: unit.to_owned(),
        };
        assert_eq!(
            datums,
            &[
                wire("RecordsProcessed", None, [2.0, 120.0, 20.0, 100.0], "Count"),
                wire(
                    "BytesProcessed",
                    None,
                    [1.0, 51_200.0, 51_200.0, 51_200.0],
                    "Bytes"
                ),
                wire(
                    "MillisBehindLatest",
                    None,
                    [1.0, 1_500.0, 1_500.0, 1_500.0],
                    "Milliseconds"
                ),
                wire("LeasesHeld", None, [1.0, 2.0, 2.0, 2.0], "Count"),
                wire(
                    "RecordsProcessed",
                    Some(&shard(0)),
                    [1.0, 100.0, 100.0, 100.0],
                    "Count"
                ),
                wire(
                    "BytesProcessed",
                    Some(&shard(0)),
                    [1.0, 51_200.0, 51_200.0, 51_200.0],
                    "Bytes"
                ),
                wire(
                    "MillisBehindLatest",
                    Some(&shard(0)),
                    [1.0, 1_500.0, 1_500.0, 1_500.0],
                    "Milliseconds"
                ),
                wire(
                    "RecordsProcessed",
                    Some(&shard(1)),
                    [1.0, 20.0, 20.0, 20.0],
                    "Count"
                ),
            ]
        );
        let snapshot = reporter.snapshot().await;
        assert_eq!(
            (snapshot.published_batches, snapshot.published_datums),
            (1, 8)
        );
        reporter.stop().await;
    }
}
