//! OpenTelemetry export (cargo feature `otel`, off by default): traces and metrics over
//! OTLP/HTTP (protobuf), turned on by OTel's own environment variables.
//!
//! * Traces: a `tracing-opentelemetry` layer beside the log formatter, so the spans the
//!   library and this binary already open (`command`, `worker`, `shard`, `checkpoint`)
//!   are exported by the SDK's batch processor. The layer has its own filter (INFO and
//!   above), so a quiet log (`flotilla demo` logs at WARN) still exports its spans.
//! * Metrics: a periodic push of the families `GET /metrics` serves, built from the
//!   same status snapshot through [`flotilla_actors::metric_families`] (one definition
//!   of names, help and buckets; nothing counted twice). Not SDK instruments: OTel has
//!   no observable histogram, and a recording one would need every raw sample, a second
//!   set of counters. The snapshot's histograms go out as they are, cumulative.
//!
//! Both go through one HTTP client: hyper (already built for the AWS SDK) whose
//! requests run on the process's tokio runtime, because the batch processor exports
//! from a thread of its own where hyper has no reactor.
//!
//! Variables (OTel's conventions): `OTEL_EXPORTER_OTLP_ENDPOINT` (base URL; `/v1/traces`
//! and `/v1/metrics` are appended) or the per-signal `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//! / `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` (used as they are) turn export on;
//! `OTEL_SERVICE_NAME` (default `flotilla`), `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_EXPORTER_OTLP_HEADERS` (and per signal), `OTEL_METRIC_EXPORT_INTERVAL`
//! (milliseconds, default 60000), `OTEL_TRACES_EXPORTER=none` / `OTEL_METRICS_EXPORTER=none`
//! (one signal off), `OTEL_SDK_DISABLED=true` (both off).

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::Bytes;
use flotilla_actors::{FamilyPoints, MetricFamily, StatusProbe, Worker, WorkerStatus};
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use opentelemetry::trace::TracerProvider;
use opentelemetry_http::{HttpClient, HttpError};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1 as pb;
use opentelemetry_proto::tonic::resource::v1::Resource as PbResource;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use prost::Message;
use tracing::warn;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::{Layer, Registry};

/// How long one export request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// OTel's default for `OTEL_METRIC_EXPORT_INTERVAL`.
const DEFAULT_INTERVAL: Duration = Duration::from_secs(60);
const SCOPE: &str = "flotilla";

/// The workers whose metrics are pushed, registered by the commands that start them.
static METRICS: OnceLock<Arc<MetricsPush>> = OnceLock::new();

/// What `OTEL_*` turned on, kept by `main` until the command ends.
#[derive(Debug, Default)]
pub struct Export {
    traces: Option<SdkTracerProvider>,
    metrics: Option<(Arc<MetricsPush>, tokio::task::JoinHandle<()>)>,
}

/// What the variables ask for, read from `var` (the process's environment in
/// [`from_env`]; a table in the tests). Pure, so that OTel's variable rules are one
/// function with a table test.
#[derive(Debug, Clone, PartialEq)]
struct Plan {
    /// Spans are exported (the exporter reads its endpoint and headers itself).
    traces: bool,
    /// Metrics are pushed: where, with which headers, how often.
    metrics: Option<MetricsPlan>,
}

#[derive(Debug, Clone, PartialEq)]
struct MetricsPlan {
    endpoint: String,
    headers: Vec<(String, String)>,
    interval: Duration,
}

impl Plan {
    fn read(var: impl Fn(&str) -> Option<String>) -> anyhow::Result<Self> {
        let env = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        let nothing = Plan {
            traces: false,
            metrics: None,
        };
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(nothing);
        }
        let base = env("OTEL_EXPORTER_OTLP_ENDPOINT");
        let off = |name: &str| env(name).is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
        let traces = !off("OTEL_TRACES_EXPORTER")
            && (base.is_some() || env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some());
        let endpoint = env("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT").or_else(|| {
            base.as_ref()
                .map(|b| format!("{}/v1/metrics", b.trim_end_matches('/')))
        });
        let metrics = match (off("OTEL_METRICS_EXPORTER"), endpoint) {
            (false, Some(endpoint)) => Some(MetricsPlan {
                endpoint,
                headers: env("OTEL_EXPORTER_OTLP_METRICS_HEADERS")
                    .or_else(|| env("OTEL_EXPORTER_OTLP_HEADERS"))
                    .map(|h| parse_headers(&h))
                    .unwrap_or_default(),
                interval: match env("OTEL_METRIC_EXPORT_INTERVAL") {
                    None => DEFAULT_INTERVAL,
                    Some(ms) => match ms.trim().parse::<u64>() {
                        Ok(ms) if ms > 0 => Duration::from_millis(ms),
                        _ => anyhow::bail!(
                            "OTEL_METRIC_EXPORT_INTERVAL: {ms:?} is not a positive number of milliseconds"
                        ),
                    },
                },
            }),
            _ => None,
        };
        Ok(Plan { traces, metrics })
    }
}

/// Reads the variables and starts what they ask for. `Ok(Export::default())` (nothing)
/// when no endpoint is set or the SDK is disabled.
pub fn from_env() -> anyhow::Result<Export> {
    let plan = Plan::read(|name| std::env::var(name).ok())?;
    let mut export = Export::default();
    if !plan.traces && plan.metrics.is_none() {
        return Ok(export);
    }
    let client = TokioHttp::new()?;
    let resource = resource();
    if plan.traces {
        // The exporter resolves the endpoint, headers and timeout from the same variables.
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
            .with_http_client(client.clone())
            .build()
            .context("OpenTelemetry: cannot build the OTLP span exporter")?;
        export.traces = Some(
            SdkTracerProvider::builder()
                .with_resource(resource.clone())
                .with_batch_exporter(exporter)
                .build(),
        );
    }
    if let Some(MetricsPlan {
        endpoint,
        headers,
        interval,
    }) = plan.metrics
    {
        let endpoint: hyper::Uri = endpoint
            .parse()
            .with_context(|| format!("OpenTelemetry: metrics endpoint {endpoint:?}"))?;
        let push = Arc::new(MetricsPush {
            client,
            endpoint,
            headers,
            resource: pb_resource(&resource),
            workers: Mutex::new(Vec::new()),
        });
        let task = tokio::spawn(push.clone().run(interval));
        // Only `main` sets it, once.
        let _ = METRICS.set(push.clone());
        export.metrics = Some((push, task));
    }
    Ok(export)
}

impl Export {
    /// The tracing layer exporting spans, when traces are on.
    pub fn layer(&self) -> Option<Box<dyn Layer<Registry> + Send + Sync>> {
        let provider = self.traces.as_ref()?;
        Some(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer(SCOPE))
                .with_filter(LevelFilter::INFO)
                .boxed(),
        )
    }

    /// Sends what is left: the spans in the batch, and the workers' metrics as last read.
    pub async fn shutdown(self) {
        if let Some((push, task)) = self.metrics {
            task.abort();
            push.push_once(false).await;
        }
        if let Some(provider) = self.traces {
            // Blocks until the batch thread has exported, which needs this runtime's
            // other threads for the requests: off the async thread.
            let flushed = tokio::task::spawn_blocking(move || provider.shutdown()).await;
            match flushed {
                Ok(Ok(())) => {}
                Ok(Err(error)) => eprintln!("flotilla: OpenTelemetry: spans not exported: {error}"),
                Err(error) => eprintln!("flotilla: OpenTelemetry: spans not exported: {error}"),
            }
        }
    }
}

/// Adds a started worker to the metrics push, when metrics export is on.
pub fn watch(worker: &Worker) {
    if let Some(push) = METRICS.get()
        && let Ok(mut workers) = push.workers.lock()
    {
        workers.push((worker.status_probe(), None));
    }
}

/// `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` (read by the SDK's detectors),
/// with `flotilla` as the service's name when neither gives one.
fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| {
            v.split(',')
                .any(|kv| kv.trim().starts_with("service.name="))
        });
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name("flotilla").build()
    }
}

/// `k1=v1,k2=v2`, as OTel's header variables are written.
fn parse_headers(text: &str) -> Vec<(String, String)> {
    text.split(',')
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

/// Pushes the watched workers' families on a timer.
#[derive(Debug)]
struct MetricsPush {
    client: TokioHttp,
    endpoint: hyper::Uri,
    headers: Vec<(String, String)>,
    resource: PbResource,
    /// Each worker with its last status read: what the last push at exit sends, when
    /// the worker has already stopped.
    workers: Mutex<Vec<(StatusProbe, Option<WorkerStatus>)>>,
}

impl MetricsPush {
    async fn run(self: Arc<Self>, interval: Duration) {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            self.push_once(true).await;
        }
    }

    /// One export: fresh statuses when `read`, else the last ones read.
    async fn push_once(&self, read: bool) {
        let mut fresh = Vec::new();
        if read {
            // Asked without the lock held: a status is an await.
            let probes: Vec<StatusProbe> = match self.workers.lock() {
                Ok(workers) => workers.iter().map(|(p, _)| p.clone()).collect(),
                Err(_) => return,
            };
            for probe in &probes {
                // A stopped worker answers nothing: its last status stays.
                fresh.push(probe.status().await.ok());
            }
        }
        let statuses: Vec<WorkerStatus> = match self.workers.lock() {
            Ok(mut workers) => {
                for ((_, last), status) in workers.iter_mut().zip(fresh) {
                    if status.is_some() {
                        *last = status;
                    }
                }
                workers.iter().filter_map(|(_, s)| s.clone()).collect()
            }
            Err(_) => return,
        };
        if statuses.is_empty() {
            return;
        }
        let request = export_request(self.resource.clone(), &statuses, SystemTime::now());
        let mut builder =
            Request::post(self.endpoint.clone()).header("content-type", "application/x-protobuf");
        for (name, value) in &self.headers {
            builder = builder.header(name.as_str(), value.as_str());
        }
        let sent = match builder.body(Bytes::from(request.encode_to_vec())) {
            Ok(request) => self.client.send_bytes(request).await,
            Err(error) => Err(error.into()),
        };
        match sent {
            Ok(response) if response.status().is_success() => {}
            Ok(response) => warn!(
                message = "OTLP metrics export refused.",
                endpoint = %self.endpoint,
                status = %response.status()
            ),
            Err(error) => warn!(
                message = "OTLP metrics export failed.",
                endpoint = %self.endpoint,
                %error
            ),
        }
    }
}

fn unix_nanos(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn string_value(value: String) -> Option<AnyValue> {
    Some(AnyValue {
        value: Some(any_value::Value::StringValue(value)),
    })
}

fn pb_resource(resource: &Resource) -> PbResource {
    let attributes = resource
        .iter()
        .map(|(key, value)| KeyValue {
            key: key.to_string(),
            value: Some(AnyValue {
                value: Some(match value {
                    opentelemetry::Value::Bool(b) => any_value::Value::BoolValue(*b),
                    opentelemetry::Value::I64(i) => any_value::Value::IntValue(*i),
                    opentelemetry::Value::F64(f) => any_value::Value::DoubleValue(*f),
                    other => any_value::Value::StringValue(other.to_string()),
                }),
            }),
            ..Default::default()
        })
        .collect();
    PbResource {
        attributes,
        ..Default::default()
    }
}

/// One request with every worker's families, a family's points from all workers under
/// one metric (OTLP wants one metric per name in a scope). Cumulative since each
/// worker's start.
fn export_request(
    resource: PbResource,
    statuses: &[WorkerStatus],
    now: SystemTime,
) -> ExportMetricsServiceRequest {
    let time = unix_nanos(now);
    let mut metrics: Vec<pb::Metric> = Vec::new();
    for status in statuses {
        let start = unix_nanos(now - Duration::from_millis(status.uptime_ms));
        for family in flotilla_actors::metric_families(status) {
            let metric = match metrics.iter_mut().find(|m| m.name == family.name) {
                Some(metric) => metric,
                None => {
                    metrics.push(empty_metric(&family));
                    let last = metrics.len() - 1;
                    &mut metrics[last]
                }
            };
            add_points(metric, family.points, start, time);
        }
    }
    ExportMetricsServiceRequest {
        resource_metrics: vec![pb::ResourceMetrics {
            resource: Some(resource),
            scope_metrics: vec![pb::ScopeMetrics {
                scope: Some(InstrumentationScope {
                    name: SCOPE.to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..Default::default()
                }),
                metrics,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

fn empty_metric(family: &MetricFamily) -> pb::Metric {
    let cumulative = pb::AggregationTemporality::Cumulative as i32;
    let data = match family.points {
        FamilyPoints::Counter(_) => pb::metric::Data::Sum(pb::Sum {
            data_points: Vec::new(),
            aggregation_temporality: cumulative,
            is_monotonic: true,
        }),
        FamilyPoints::Gauge(_) => pb::metric::Data::Gauge(pb::Gauge {
            data_points: Vec::new(),
        }),
        FamilyPoints::Histogram { .. } => pb::metric::Data::Histogram(pb::Histogram {
            data_points: Vec::new(),
            aggregation_temporality: cumulative,
        }),
    };
    pb::Metric {
        name: family.name.clone(),
        description: family.help.to_owned(),
        unit: family.unit.to_owned(),
        data: Some(data),
        ..Default::default()
    }
}

fn attributes(labels: Vec<(&'static str, String)>) -> Vec<KeyValue> {
    labels
        .into_iter()
        .map(|(key, value)| KeyValue {
            key: key.to_owned(),
            value: string_value(value),
            ..Default::default()
        })
        .collect()
}

fn number_points(
    series: Vec<(Vec<(&'static str, String)>, f64)>,
    start: u64,
    time: u64,
) -> impl Iterator<Item = pb::NumberDataPoint> {
    series
        .into_iter()
        .map(move |(labels, value)| pb::NumberDataPoint {
            attributes: attributes(labels),
            start_time_unix_nano: start,
            time_unix_nano: time,
            value: Some(pb::number_data_point::Value::AsDouble(value)),
            ..Default::default()
        })
}

fn add_points(metric: &mut pb::Metric, points: FamilyPoints, start: u64, time: u64) {
    match (metric.data.as_mut(), points) {
        (Some(pb::metric::Data::Sum(sum)), FamilyPoints::Counter(series)) => {
            sum.data_points.extend(number_points(series, start, time));
        }
        (Some(pb::metric::Data::Gauge(gauge)), FamilyPoints::Gauge(series)) => {
            gauge.data_points.extend(number_points(series, start, time));
        }
        (
            Some(pb::metric::Data::Histogram(histogram)),
            FamilyPoints::Histogram {
                labels,
                buckets,
                sum,
                count,
            },
        ) => histogram.data_points.push(pb::HistogramDataPoint {
            attributes: attributes(labels),
            start_time_unix_nano: start,
            time_unix_nano: time,
            count,
            sum: Some(sum),
            // OTLP's last bucket is implied past the last explicit bound.
            explicit_bounds: buckets
                .iter()
                .map(|(upper, _)| *upper)
                .filter(|upper| upper.is_finite())
                .collect(),
            bucket_counts: buckets.into_iter().map(|(_, n)| n).collect(),
            ..Default::default()
        }),
        // A family's kind is fixed by its metric: never two kinds under one name.
        _ => {}
    }
}

/// hyper on the tokio runtime `main` runs: every request is spawned there and awaited,
/// so callers on threads without a reactor (the span batch processor's) can send.
#[derive(Debug, Clone)]
struct TokioHttp {
    runtime: tokio::runtime::Handle,
    client: Client<HttpConnector, Full<Bytes>>,
}

impl TokioHttp {
    fn new() -> anyhow::Result<Self> {
        let runtime = tokio::runtime::Handle::try_current()
            .context("OpenTelemetry export needs the tokio runtime")?;
        let client = Client::builder(TokioExecutor::new()).build_http();
        Ok(Self { runtime, client })
    }

    async fn send(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let client = self.client.clone();
        let task = self.runtime.spawn(async move {
            let sent = async {
                let response = client.request(request.map(Full::new)).await?;
                let (parts, body) = response.into_parts();
                let body = body.collect().await?.to_bytes();
                Ok::<_, HttpError>(Response::from_parts(parts, body))
            };
            match tokio::time::timeout(REQUEST_TIMEOUT, sent).await {
                Ok(result) => result,
                Err(_) => Err(format!("no answer in {REQUEST_TIMEOUT:?}").into()),
            }
        });
        task.await?
    }
}

// `HttpClient` is declared through `async_trait`; this is what that macro expands to.
impl HttpClient for TokioHttp {
    fn send_bytes<'life0, 'async_trait>(
        &'life0 self,
        request: Request<Bytes>,
    ) -> Pin<Box<dyn Future<Output = Result<Response<Bytes>, HttpError>> + Send + 'async_trait>>
    where
        'life0: 'async_trait,
        Self: 'async_trait,
    {
        Box::pin(self.send(request))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(vars: &[(&str, &str)]) -> anyhow::Result<Plan> {
        Plan::read(|name| {
            vars.iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    fn metrics(endpoint: &str, headers: &[(&str, &str)], interval_ms: u64) -> Option<MetricsPlan> {
        Some(MetricsPlan {
            endpoint: endpoint.to_owned(),
            headers: headers
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            interval: Duration::from_millis(interval_ms),
        })
    }

    #[test]
    fn the_variables_turn_each_signal_on_and_off_as_otel_says() {
        const BASE: (&str, &str) = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/");
        let on = metrics("http://collector:4318/v1/metrics", &[], 60_000);
        // (case, variables, traces on, the metrics push)
        type Case<'a> = (&'a str, Vec<(&'a str, &'a str)>, bool, Option<MetricsPlan>);
        let table: Vec<Case> = vec![
            ("nothing set", vec![], false, None),
            (
                "a blank base",
                vec![("OTEL_EXPORTER_OTLP_ENDPOINT", " ")],
                false,
                None,
            ),
            (
                "the base: both, /v1/metrics appended",
                vec![BASE],
                true,
                on.clone(),
            ),
            (
                "disabled",
                vec![BASE, ("OTEL_SDK_DISABLED", "TRUE")],
                false,
                None,
            ),
            (
                "traces off",
                vec![BASE, ("OTEL_TRACES_EXPORTER", "none")],
                false,
                on.clone(),
            ),
            (
                "metrics off",
                vec![BASE, ("OTEL_METRICS_EXPORTER", "None")],
                true,
                None,
            ),
            (
                "traces alone, by their own endpoint",
                vec![(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                    "http://t:4318/v1/traces",
                )],
                true,
                None,
            ),
            (
                "metrics alone, by their own endpoint, used as it is",
                vec![("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:9000/push")],
                false,
                metrics("http://m:9000/push", &[], 60_000),
            ),
            (
                "the metrics endpoint wins over the base",
                vec![
                    BASE,
                    ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://m:9000/push"),
                ],
                true,
                metrics("http://m:9000/push", &[], 60_000),
            ),
            (
                "headers, the metrics' own first; interval",
                vec![
                    BASE,
                    ("OTEL_EXPORTER_OTLP_HEADERS", "a=1"),
                    (
                        "OTEL_EXPORTER_OTLP_METRICS_HEADERS",
                        "api-key = k, x-tenant=t,junk",
                    ),
                    ("OTEL_METRIC_EXPORT_INTERVAL", "5000"),
                ],
                true,
                metrics(
                    "http://collector:4318/v1/metrics",
                    &[("api-key", "k"), ("x-tenant", "t")],
                    5_000,
                ),
            ),
            (
                "the shared headers otherwise",
                vec![BASE, ("OTEL_EXPORTER_OTLP_HEADERS", "a=1")],
                true,
                metrics("http://collector:4318/v1/metrics", &[("a", "1")], 60_000),
            ),
        ];
        for (case, vars, traces, metrics) in table {
            let got = plan(&vars).unwrap_or_else(|e| panic!("{case}: {e:#}"));
            assert_eq!(got, Plan { traces, metrics }, "{case}");
        }
    }

    #[test]
    fn a_bad_interval_is_refused_with_its_name() {
        for bad in ["0", "-5", "10s"] {
            let err = plan(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_METRIC_EXPORT_INTERVAL", bad),
            ])
            .expect_err(bad)
            .to_string();
            assert!(err.starts_with("OTEL_METRIC_EXPORT_INTERVAL: "), "{err}");
        }
        // With metrics off, the interval is not read.
        assert!(
            plan(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
                ("OTEL_METRICS_EXPORTER", "none"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "0"),
            ])
            .is_ok()
        );
    }
}
