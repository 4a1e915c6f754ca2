//! `flotilla demo` built with the `otel` feature, exporting to an OTLP/HTTP receiver on
//! loopback: the spans (command, worker, shard, checkpoint) and the `/metrics`
//! families arrive as OTLP protobuf, with their attributes.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::metrics::v1::{Metric, metric};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

#[derive(Clone, Default)]
struct Received {
    traces: Arc<Mutex<Vec<ExportTraceServiceRequest>>>,
    metrics: Arc<Mutex<Vec<ExportMetricsServiceRequest>>>,
}

fn protobuf(headers: &HeaderMap) -> bool {
    headers
        .get("content-type")
        .is_some_and(|v| v == "application/x-protobuf")
}

async fn traces(State(got): State<Received>, headers: HeaderMap, body: Bytes) -> StatusCode {
    match ExportTraceServiceRequest::decode(body) {
        Ok(request) if protobuf(&headers) => {
            got.traces.lock().unwrap().push(request);
            StatusCode::OK
        }
        _ => StatusCode::BAD_REQUEST,
    }
}

async fn metrics(State(got): State<Received>, headers: HeaderMap, body: Bytes) -> StatusCode {
    match ExportMetricsServiceRequest::decode(body) {
        Ok(request) if protobuf(&headers) => {
            got.metrics.lock().unwrap().push(request);
            StatusCode::OK
        }
        _ => StatusCode::BAD_REQUEST,
    }
}

fn attr<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a any_value::Value> {
    attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()
}

fn text<'a>(attributes: &'a [KeyValue], key: &str) -> Option<&'a str> {
    match attr(attributes, key)? {
        any_value::Value::StringValue(s) => Some(s),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_exports_its_spans_and_metrics_over_otlp_http() {
    let got = Received::default();
    let app = Router::new()
        .route("/v1/traces", post(traces))
        .route("/v1/metrics", post(metrics))
        .with_state(got.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["demo", "--status-bind", "127.0.0.1:0"])
        .args(["--duration", "3", "--workers", "2", "--shards", "2"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}"))
        .env("OTEL_METRIC_EXPORT_INTERVAL", "500")
        .env("OTEL_SERVICE_NAME", "otel-test")
        .env_remove("OTEL_SDK_DISABLED")
        .env_remove("OTEL_TRACES_EXPORTER")
        .env_remove("OTEL_METRICS_EXPORTER")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{}\n{stderr}", out.status);

    // Spans: every batch from the service named by OTEL_SERVICE_NAME.
    let traces = got.traces.lock().unwrap().clone();
    assert!(!traces.is_empty(), "no trace export\n{stderr}");
    let mut spans: Vec<Span> = Vec::new();
    for request in &traces {
        for resource_spans in &request.resource_spans {
            let resource = resource_spans.resource.as_ref().unwrap();
            assert_eq!(
                text(&resource.attributes, "service.name"),
                Some("otel-test")
            );
            for scope in &resource_spans.scope_spans {
                spans.extend(scope.spans.iter().cloned());
            }
        }
    }
    let named = |name: &'static str| spans.iter().filter(move |s| s.name == name);
    let command = named("command").next().expect("a command span");
    assert_eq!(text(&command.attributes, "command"), Some("demo"));
    let workers: Vec<&Span> = named("worker").collect();
    let mut worker_ids: Vec<&str> = workers
        .iter()
        .map(|w| text(&w.attributes, "worker_id").expect("worker_id"))
        .collect();
    worker_ids.sort_unstable();
    assert_eq!(worker_ids, ["demo-1", "demo-2"], "{workers:?}");
    for worker in &workers {
        assert_eq!(
            text(&worker.attributes, "application"),
            Some("flotilla-demo")
        );
    }
    let shards: Vec<&Span> = named("shard").collect();
    assert!(!shards.is_empty(), "no shard span");
    for shard in &shards {
        let shard_id = text(&shard.attributes, "shard_id").expect("shard_id");
        assert!(shard_id.starts_with("shardId-"), "{shard_id}");
        let owner = text(&shard.attributes, "worker_id").expect("worker_id");
        let worker = workers
            .iter()
            .find(|w| text(&w.attributes, "worker_id") == Some(owner))
            .unwrap_or_else(|| panic!("no worker span for {shard:?}"));
        // The lease's counter when the reader started (its fence).
        let counter = match attr(&shard.attributes, "lease_counter") {
            Some(any_value::Value::IntValue(n)) => Some(*n),
            Some(any_value::Value::StringValue(n)) => n.parse().ok(),
            _ => None,
        };
        assert!(counter.is_some_and(|n| n >= 1), "{shard:?}");
        // Under its worker's span, in the command's trace.
        assert_eq!(shard.parent_span_id, worker.span_id, "{shard:?}");
        assert_eq!(shard.trace_id, command.trace_id);
    }
    assert!(named("checkpoint").next().is_some(), "no checkpoint span");

    // Metrics: the families /metrics serves, from the same snapshot.
    let pushes = got.metrics.lock().unwrap().clone();
    assert!(!pushes.is_empty(), "no metrics export\n{stderr}");
    let last: Vec<Metric> = pushes
        .last()
        .unwrap()
        .resource_metrics
        .iter()
        .flat_map(|r| r.scope_metrics.iter())
        .flat_map(|s| s.metrics.iter().cloned())
        .collect();
    let family = |name: &str| {
        last.iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("no {name} in {:?}", last.iter().map(|m| &m.name)))
    };
    // One metric per name (OTLP's rule), every worker's points under it.
    let mut names: Vec<&str> = last.iter().map(|m| m.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), last.len(), "a family twice");
    let up = family("flotilla_up");
    let Some(metric::Data::Gauge(gauge)) = &up.data else {
        panic!("{up:?}");
    };
    let mut up_workers: Vec<&str> = gauge
        .data_points
        .iter()
        .map(|p| text(&p.attributes, "worker").expect("worker"))
        .collect();
    up_workers.sort_unstable();
    assert_eq!(up_workers, worker_ids);
    let processed = family("flotilla_records_processed");
    assert!(!processed.description.is_empty());
    let Some(metric::Data::Sum(sum)) = &processed.data else {
        panic!("{processed:?}");
    };
    assert!(sum.is_monotonic);
    let mut total = 0.0;
    for point in sum
        .data_points
        .iter()
        .filter(|p| text(&p.attributes, "shard").is_none())
    {
        assert!(worker_ids.contains(&text(&point.attributes, "worker").expect("worker")));
        match point.value {
            Some(opentelemetry_proto::tonic::metrics::v1::number_data_point::Value::AsDouble(
                v,
            )) => total += v,
            ref other => panic!("{other:?}"),
        }
    }
    assert!(total > 0.0, "no records processed: {processed:?}");
    assert!(
        sum.data_points
            .iter()
            .any(|p| text(&p.attributes, "shard").is_some_and(|s| s.starts_with("shardId-"))),
        "no per-shard point"
    );
    let timing = family("flotilla_processing_time_milliseconds");
    assert_eq!(timing.unit, "ms");
    let Some(metric::Data::Histogram(histogram)) = &timing.data else {
        panic!("{timing:?}");
    };
    assert_eq!(histogram.data_points.len(), worker_ids.len());
    assert!(
        histogram.data_points.iter().any(|p| p.count > 0),
        "{histogram:?}"
    );
    for point in &histogram.data_points {
        assert_eq!(point.bucket_counts.len(), point.explicit_bounds.len() + 1);
        assert_eq!(point.bucket_counts.iter().sum::<u64>(), point.count);
        assert!(point.explicit_bounds.windows(2).all(|w| w[0] < w[1]));
    }
}
