#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `MetricsSink` contract, run against every implementation.
//!
//! * `memory::*`: [`MemoryMetrics`], the test double the rest of the crate trusts.
//! * `cloudwatch_capture::*`: the real [`CloudWatchMetrics`] adapter and the real SDK,
//!   talking over loopback to a capture server in this file. The SDK speaks Smithy
//!   RPC-v2 CBOR to CloudWatch and no emulator accepts that, so the capture decodes what
//!   arrived on the wire and the suite asserts on that, not on what the adapter meant to
//!   send.
//!   The SDK runs with its defaults, request compression included: bodies of 10 KiB or
//!   more arrive gzip-compressed and the capture inflates them before decoding.
//! * `cloudwatch_wire::*`: what only the real adapter has: the wire format itself, the
//!   SDK's request compression, and error mapping.
//!
//! Both tiers report calls as [`RecordedCall`]s, so one assertion covers both.

mod support;

use std::borrow::Cow;
use std::io::Read;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::SdkConfig;
use aws_config::retry::RetryConfig;
use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use ciborium::Value;
use flate2::bufread::GzDecoder;
use flotilla_actors::backend::aws::CloudWatchMetrics;
use flotilla_actors::backend::memory::MemoryMetrics;
use flotilla_actors::backend::{
    MAX_DATUMS_PER_CALL, MAX_DIMENSIONS, MetricDatum, MetricValue, MetricsError, MetricsSink, Unit,
    batches,
};
use support::servers;

/// The PutMetricData path of the RPC-v2 protocol; CloudWatch's Smithy service shape is
/// still named after its internal code name, Granite.
const PUT_METRIC_DATA_PATH: &str = "/service/GraniteServiceVersion20100801/operation/PutMetricData";

/// CloudWatch's documented request size limit for PutMetricData.
const SERVICE_MAX_REQUEST_BYTES: usize = 1_000_000;

const NAMESPACE: &str = "Flotilla/Contract";

/// One datum as the service (or the double) received it. Units are CloudWatch's names
/// and timestamps whole seconds since the epoch: what both tiers can state exactly.
#[derive(Debug, Clone, PartialEq)]
struct RecordedDatum {
    name: String,
    dimensions: Vec<(String, String)>,
    value: MetricValue,
    unit: String,
    timestamp_secs: u64,
}

#[derive(Debug, Clone, PartialEq)]
struct RecordedCall {
    namespace: String,
    datums: Vec<RecordedDatum>,
    /// The size of the request body, where there was one (the capture tier): its
    /// content, before any compression, so the stricter of the two sizes.
    body_bytes: Option<usize>,
}

impl RecordedDatum {
    /// What a datum should look like once received.
    fn expected(datum: &MetricDatum) -> Self {
        Self {
            name: datum.name.clone(),
            dimensions: datum.dimensions.clone(),
            value: datum.value,
            unit: datum.unit.as_str().to_owned(),
            timestamp_secs: datum
                .timestamp
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_secs(),
        }
    }
}

/// An implementation under test, with a way to read back what it sent.
trait Tier: Sized {
    async fn start() -> Self;
    fn sink(&self) -> Arc<dyn MetricsSink>;
    async fn recorded_calls(&self) -> Vec<RecordedCall>;
}

// ---------------------------------------------------------------------------------------
// Tiers

struct MemoryTier {
    sink: MemoryMetrics,
}

impl Tier for MemoryTier {
    async fn start() -> Self {
        Self {
            sink: MemoryMetrics::default(),
        }
    }

    fn sink(&self) -> Arc<dyn MetricsSink> {
        Arc::new(self.sink.clone())
    }

    async fn recorded_calls(&self) -> Vec<RecordedCall> {
        self.sink
            .calls()
            .into_iter()
            .map(|(namespace, datums)| RecordedCall {
                namespace,
                datums: datums.iter().map(RecordedDatum::expected).collect(),
                body_bytes: None,
            })
            .collect()
    }
}

struct CaptureTier {
    capture: Capture,
    sink: CloudWatchMetrics,
}

impl Tier for CaptureTier {
    async fn start() -> Self {
        let capture = Capture::start().await;
        let sink = CloudWatchMetrics::new(&sdk_config(), Some(&capture.url()));
        Self { capture, sink }
    }

    fn sink(&self) -> Arc<dyn MetricsSink> {
        Arc::new(self.sink.clone())
    }

    async fn recorded_calls(&self) -> Vec<RecordedCall> {
        self.capture.calls()
    }
}

/// The tests' shared configuration (nothing from the environment; request compression
/// on, as in production), with retries off so each `put` call is exactly one request
/// and a failure shows at once.
fn sdk_config() -> SdkConfig {
    servers::sdk_config()
        .into_builder()
        .retry_config(RetryConfig::disabled())
        .build()
}

// ---------------------------------------------------------------------------------------
// The capture server

/// A loopback stand-in for CloudWatch's PutMetricData endpoint. It keeps every request,
/// checks it is the RPC-v2 CBOR call the SDK documents, inflates a gzip body, decodes
/// it, and answers like the service does (or with the failure it was told to give).
#[derive(Clone)]
struct Capture {
    addr: SocketAddr,
    state: Arc<Mutex<CaptureState>>,
}

#[derive(Default)]
struct CaptureState {
    requests: Vec<CapturedRequest>,
    answer: Option<Failure>,
}

#[derive(Debug, Clone)]
struct CapturedRequest {
    method: Method,
    path: String,
    headers: HeaderMap,
    /// The body as it came over the wire, compressed if it was.
    body: Bytes,
    /// The call, or why the capture could not read it (wrong path or headers, an
    /// encoding other than gzip, a body it cannot inflate or decode).
    decoded: Result<RecordedCall, String>,
}

/// An error answer, shaped like an RPC-v2 CBOR error from a query-compatible service:
/// the query error code in `x-amzn-query-error`, `__type` and `message` in the body.
#[derive(Debug, Clone)]
struct Failure {
    status: StatusCode,
    query_error: Option<&'static str>,
    body: Option<(&'static str, &'static str)>,
}

impl Capture {
    async fn start() -> Self {
        let state = Arc::new(Mutex::new(CaptureState::default()));
        let handler_state = state.clone();
        let app = Router::new().fallback(
            move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
                let state = handler_state.clone();
                async move { handle(&state, method, uri, headers, body) }
            },
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Self { addr, state }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn requests(&self) -> Vec<CapturedRequest> {
        self.state.lock().unwrap().requests.clone()
    }

    /// Every call received, in order; panics if the capture could not read one.
    fn calls(&self) -> Vec<RecordedCall> {
        self.requests()
            .into_iter()
            .map(|request| match request.decoded {
                Ok(call) => call,
                Err(problem) => panic!(
                    "the capture could not read request {} {}: {problem}",
                    request.method, request.path
                ),
            })
            .collect()
    }

    fn answer_with(&self, failure: Failure) {
        self.state.lock().unwrap().answer = Some(failure);
    }
}

fn handle(
    state: &Mutex<CaptureState>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let decoded = check_request(&method, &uri, &headers)
        .and_then(|()| content(&headers, &body))
        .and_then(|content| decode_call(&content));
    let problem = decoded.as_ref().err().cloned();
    let mut state = state.lock().unwrap();
    state.requests.push(CapturedRequest {
        method,
        path: uri.path().to_owned(),
        headers,
        body,
        decoded,
    });
    if let Some(problem) = problem {
        // A protocol mismatch: fail loudly.
        return (StatusCode::BAD_REQUEST, problem).into_response();
    }
    match &state.answer {
        Some(failure) => failure.response(),
        None => success(),
    }
}

/// The answer the SDK takes as success: what CloudWatch sends for an operation with no
/// output (200, the protocol header, an empty CBOR map).
fn success() -> Response {
    let mut headers = HeaderMap::new();
    headers.insert("smithy-protocol", HeaderValue::from_static("rpc-v2-cbor"));
    headers.insert("content-type", HeaderValue::from_static("application/cbor"));
    (StatusCode::OK, headers, cbor(&Value::Map(Vec::new()))).into_response()
}

impl Failure {
    fn response(&self) -> Response {
        let mut headers = HeaderMap::new();
        headers.insert("smithy-protocol", HeaderValue::from_static("rpc-v2-cbor"));
        if let Some(code) = self.query_error {
            headers.insert("x-amzn-query-error", HeaderValue::from_static(code));
        }
        let body = match self.body {
            Some((kind, message)) => {
                headers.insert("content-type", HeaderValue::from_static("application/cbor"));
                cbor(&Value::Map(vec![
                    (text("__type"), text(kind)),
                    (text("message"), text(message)),
                ]))
            }
            None => Vec::new(),
        };
        (self.status, headers, body).into_response()
    }
}

fn check_request(method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<(), String> {
    if method != Method::POST || uri.path() != PUT_METRIC_DATA_PATH {
        return Err(format!("expected POST {PUT_METRIC_DATA_PATH}"));
    }
    for (name, want) in [
        ("smithy-protocol", "rpc-v2-cbor"),
        ("content-type", "application/cbor"),
        ("accept", "application/cbor"),
    ] {
        let got = headers.get(name).and_then(|v| v.to_str().ok());
        if got != Some(want) {
            return Err(format!("header {name}: expected {want:?}, got {got:?}"));
        }
    }
    Ok(())
}

/// The body with its `content-encoding` undone: as is without one, inflated if gzip
/// (one gzip member, nothing after it). Any other encoding is an error.
fn content<'a>(headers: &HeaderMap, body: &'a [u8]) -> Result<Cow<'a, [u8]>, String> {
    match headers.get("content-encoding").map(HeaderValue::as_bytes) {
        None => Ok(Cow::Borrowed(body)),
        Some(b"gzip") => {
            let mut decoder = GzDecoder::new(body);
            let mut inflated = Vec::new();
            decoder
                .read_to_end(&mut inflated)
                .map_err(|e| format!("not gzip: {e}"))?;
            match decoder.into_inner().len() {
                0 => Ok(Cow::Owned(inflated)),
                extra => Err(format!("{extra} bytes after the gzip stream")),
            }
        }
        Some(other) => Err(format!(
            "unexpected content-encoding {:?}",
            String::from_utf8_lossy(other)
        )),
    }
}

/// Reads a PutMetricData body: `{Namespace, MetricData: [{MetricName, Dimensions:
/// [{Name, Value}], Timestamp: tag 1 (epoch seconds as a float), Value | StatisticValues:
/// {SampleCount, Sum, Minimum, Maximum}, Unit}]}`. Unknown or missing fields are errors,
/// so a change in what the SDK sends shows up here.
fn decode_call(body: &[u8]) -> Result<RecordedCall, String> {
    let value: Value = ciborium::from_reader(body).map_err(|e| format!("not CBOR: {e}"))?;
    let top = as_map(&value, "request")?;
    only_keys(top, &["Namespace", "MetricData"], "request")?;
    let namespace = as_text(field(top, "Namespace")?, "Namespace")?;
    let datums = as_array(field(top, "MetricData")?, "MetricData")?
        .iter()
        .map(decode_datum)
        .collect::<Result<_, _>>()?;
    Ok(RecordedCall {
        namespace,
        datums,
        body_bytes: Some(body.len()),
    })
}

fn decode_datum(value: &Value) -> Result<RecordedDatum, String> {
    let map = as_map(value, "datum")?;
    only_keys(
        map,
        &[
            "MetricName",
            "Dimensions",
            "Timestamp",
            "Value",
            "StatisticValues",
            "Unit",
        ],
        "datum",
    )?;
    let name = as_text(field(map, "MetricName")?, "MetricName")?;
    let dimensions = as_array(field(map, "Dimensions")?, "Dimensions")?
        .iter()
        .map(|d| {
            let d = as_map(d, "dimension")?;
            only_keys(d, &["Name", "Value"], "dimension")?;
            Ok((
                as_text(field(d, "Name")?, "Name")?,
                as_text(field(d, "Value")?, "Value")?,
            ))
        })
        .collect::<Result<_, String>>()?;
    let value = match (get(map, "Value"), get(map, "StatisticValues")) {
        (Some(v), None) => MetricValue::Value(as_float(v, "Value")?),
        (None, Some(s)) => {
            let s = as_map(s, "StatisticValues")?;
            only_keys(
                s,
                &["SampleCount", "Sum", "Minimum", "Maximum"],
                "StatisticValues",
            )?;
            MetricValue::Statistics {
                count: as_float(field(s, "SampleCount")?, "SampleCount")?,
                sum: as_float(field(s, "Sum")?, "Sum")?,
                min: as_float(field(s, "Minimum")?, "Minimum")?,
                max: as_float(field(s, "Maximum")?, "Maximum")?,
            }
        }
        _ => {
            return Err(format!(
                "datum {name}: expected exactly one of Value and StatisticValues"
            ));
        }
    };
    let timestamp_secs = match field(map, "Timestamp")? {
        Value::Tag(1, inner) => match **inner {
            Value::Float(secs) if secs >= 0.0 => secs.floor() as u64,
            Value::Integer(secs) => u64::try_from(secs).map_err(|e| format!("Timestamp: {e}"))?,
            ref other => return Err(format!("Timestamp: expected epoch seconds, got {other:?}")),
        },
        other => return Err(format!("Timestamp: expected CBOR tag 1, got {other:?}")),
    };
    Ok(RecordedDatum {
        name,
        dimensions,
        value,
        unit: as_text(field(map, "Unit")?, "Unit")?,
        timestamp_secs,
    })
}

fn cbor(value: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    ciborium::into_writer(value, &mut out).unwrap();
    out
}

fn text(s: &str) -> Value {
    Value::Text(s.to_owned())
}

fn get<'a>(map: &'a [(Value, Value)], key: &str) -> Option<&'a Value> {
    map.iter()
        .find(|(k, _)| k.as_text() == Some(key))
        .map(|(_, v)| v)
}

fn field<'a>(map: &'a [(Value, Value)], key: &str) -> Result<&'a Value, String> {
    get(map, key).ok_or_else(|| format!("missing {key}"))
}

fn only_keys(map: &[(Value, Value)], allowed: &[&str], what: &str) -> Result<(), String> {
    match map
        .iter()
        .find(|(k, _)| !k.as_text().is_some_and(|k| allowed.contains(&k)))
    {
        Some((k, _)) => Err(format!("{what}: unexpected key {k:?}")),
        None => Ok(()),
    }
}

fn as_map<'a>(value: &'a Value, what: &str) -> Result<&'a [(Value, Value)], String> {
    value
        .as_map()
        .map(Vec::as_slice)
        .ok_or_else(|| format!("{what}: expected a map, got {value:?}"))
}

fn as_array<'a>(value: &'a Value, what: &str) -> Result<&'a [Value], String> {
    value
        .as_array()
        .map(Vec::as_slice)
        .ok_or_else(|| format!("{what}: expected an array, got {value:?}"))
}

fn as_text(value: &Value, what: &str) -> Result<String, String> {
    value
        .as_text()
        .map(str::to_owned)
        .ok_or_else(|| format!("{what}: expected text, got {value:?}"))
}

fn as_float(value: &Value, what: &str) -> Result<f64, String> {
    value
        .as_float()
        .ok_or_else(|| format!("{what}: expected a float, got {value:?}"))
}

// ---------------------------------------------------------------------------------------
// Data

/// 2023-11-14T22:13:20Z: a fixed, recent instant.
fn base_time() -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(1_700_000_000)
}

fn datum(name: &str, value: MetricValue, unit: Unit) -> MetricDatum {
    MetricDatum {
        name: name.to_owned(),
        dimensions: vec![("WorkerId".into(), "worker-a".into())],
        value,
        unit,
        timestamp: base_time(),
    }
}

fn counts(n: usize) -> Vec<MetricDatum> {
    (0..n)
        .map(|i| MetricDatum {
            name: format!("Records{i}"),
            dimensions: vec![("ShardId".into(), format!("shardId-{i:012}"))],
            value: MetricValue::Value(i as f64),
            unit: Unit::Count,
            timestamp: base_time() + Duration::from_secs(i as u64),
        })
        .collect()
}

fn flatten(calls: &[RecordedCall]) -> Vec<RecordedDatum> {
    calls
        .iter()
        .flat_map(|c| c.datums.iter().cloned())
        .collect()
}

fn expected(data: &[MetricDatum]) -> Vec<RecordedDatum> {
    data.iter().map(RecordedDatum::expected).collect()
}

// ---------------------------------------------------------------------------------------
// The contract

mod contract {
    use super::*;

    pub async fn carries_every_field_of_every_datum<T: Tier>(tier: T) {
        let data = vec![
            MetricDatum {
                name: "RecordsProcessed".into(),
                dimensions: vec![
                    ("StreamName".into(), "orders".into()),
                    ("ShardId".into(), "shardId-000000000007".into()),
                ],
                value: MetricValue::Value(1234.5),
                unit: Unit::Count,
                // Sub-second parts travel too; the contract promises the second.
                timestamp: base_time() + Duration::from_millis(250),
            },
            MetricDatum {
                name: "ProcessingTime".into(),
                dimensions: vec![("ShardId".into(), "shardId-000000000007".into())],
                value: MetricValue::Statistics {
                    count: 60.0,
                    sum: 1520.25,
                    min: 0.5,
                    max: 180.0,
                },
                unit: Unit::Milliseconds,
                timestamp: base_time() + Duration::from_secs(60),
            },
            datum(
                "BytesProcessed",
                MetricValue::Value(1_048_576.0),
                Unit::Bytes,
            ),
            datum(
                "RecordsPerSecond",
                MetricValue::Value(0.125),
                Unit::CountPerSecond,
            ),
            datum("MillisBehindLatest", MetricValue::Value(0.0), Unit::Seconds),
            datum("CpuShare", MetricValue::Value(-3.5), Unit::Percent),
            MetricDatum {
                dimensions: Vec::new(),
                ..datum("LeasesHeld", MetricValue::Value(4.0), Unit::None)
            },
        ];
        tier.sink().put(NAMESPACE, data.clone()).await.unwrap();

        let calls = tier.recorded_calls().await;
        assert_eq!(calls.len(), 1, "seven datums fit one call");
        assert_eq!(calls[0].namespace, NAMESPACE);
        let got = &calls[0].datums;
        assert_eq!(got, &expected(&data));
        // Spelled out, so the expectation does not rest only on `Unit::as_str`.
        let units: Vec<_> = got.iter().map(|d| d.unit.as_str()).collect();
        assert_eq!(
            units,
            [
                "Count",
                "Milliseconds",
                "Bytes",
                "Count/Second",
                "Seconds",
                "Percent",
                "None"
            ]
        );
        assert_eq!(got[0].timestamp_secs, 1_700_000_000);
        assert_eq!(got[1].timestamp_secs, 1_700_000_060);
        assert_eq!(
            got[1].value,
            MetricValue::Statistics {
                count: 60.0,
                sum: 1520.25,
                min: 0.5,
                max: 180.0
            }
        );
    }

    pub async fn keeps_the_order_of_datums_and_of_puts<T: Tier>(tier: T) {
        let sink = tier.sink();
        let first = counts(5);
        let second: Vec<_> = counts(3).into_iter().rev().collect();
        sink.put(NAMESPACE, first.clone()).await.unwrap();
        sink.put("Flotilla/Other", second.clone()).await.unwrap();

        let calls = tier.recorded_calls().await;
        let namespaces: Vec<_> = calls.iter().map(|c| c.namespace.as_str()).collect();
        assert_eq!(namespaces, [NAMESPACE, "Flotilla/Other"]);
        assert_eq!(calls[0].datums, expected(&first));
        assert_eq!(calls[1].datums, expected(&second));
    }

    pub async fn an_empty_put_sends_nothing<T: Tier>(tier: T) {
        tier.sink().put(NAMESPACE, Vec::new()).await.unwrap();
        assert_eq!(tier.recorded_calls().await, []);
    }

    pub async fn splits_2500_datums_into_calls_of_1000_1000_500<T: Tier>(tier: T) {
        let data = counts(2500);
        tier.sink().put(NAMESPACE, data.clone()).await.unwrap();

        let calls = tier.recorded_calls().await;
        let sizes: Vec<_> = calls.iter().map(|c| c.datums.len()).collect();
        assert_eq!(sizes, [1000, 1000, 500]);
        assert!(calls.iter().all(|c| c.namespace == NAMESPACE));
        assert_eq!(
            flatten(&calls),
            expected(&data),
            "every datum once, in order"
        );
        assert_eq!(calls[1].datums[0].name, "Records1000");
    }

    pub async fn splits_wide_datums_by_size_within_the_limits<T: Tier>(tier: T) {
        // 30 dimensions with 250-byte values: about 8 KB a datum, so 400 of them are
        // well over 1 MB while far under 1000 datums: only the size limit splits them.
        let data: Vec<_> = (0..400)
            .map(|i| MetricDatum {
                name: format!("Wide{i}"),
                dimensions: (0..MAX_DIMENSIONS)
                    .map(|d| {
                        (
                            format!("Dimension{d:02}"),
                            format!("{i:04}-{d:02}-{}", "v".repeat(242)),
                        )
                    })
                    .collect(),
                value: MetricValue::Value(i as f64),
                unit: Unit::Bytes,
                timestamp: base_time(),
            })
            .collect();
        tier.sink().put(NAMESPACE, data.clone()).await.unwrap();

        let calls = tier.recorded_calls().await;
        assert!(
            calls.len() > 1,
            "about 3 MB of datums must not go in one call"
        );
        let sizes: Vec<_> = calls.iter().map(|c| c.datums.len()).collect();
        let planned: Vec<_> = batches(data.clone()).iter().map(Vec::len).collect();
        assert_eq!(sizes, planned, "calls are split as `batches` plans");
        for call in &calls {
            assert!(call.datums.len() <= MAX_DATUMS_PER_CALL);
            assert!(
                call.datums
                    .iter()
                    .all(|d| d.dimensions.len() <= MAX_DIMENSIONS)
            );
            if let Some(bytes) = call.body_bytes {
                assert!(
                    bytes <= SERVICE_MAX_REQUEST_BYTES,
                    "a {bytes}-byte request is over CloudWatch's limit"
                );
            }
        }
        assert_eq!(
            flatten(&calls),
            expected(&data),
            "every datum once, in order"
        );
    }

    pub async fn refuses_31_dimensions_and_sends_nothing<T: Tier>(tier: T) {
        let mut wide = datum("TooWide", MetricValue::Value(1.0), Unit::Count);
        wide.dimensions = (0..=MAX_DIMENSIONS)
            .map(|d| (format!("D{d}"), "x".into()))
            .collect();
        // The valid datums around it must not be sent either.
        let data = [counts(1500), vec![wide], counts(2)].concat();

        let err = tier.sink().put(NAMESPACE, data).await.unwrap_err();
        assert!(
            matches!(&err, MetricsError::Invalid { name, why } if name == "TooWide" && why.contains("31 dimensions")),
            "got {err:?}"
        );
        assert_eq!(tier.recorded_calls().await, []);
    }

    pub async fn refuses_non_finite_values_and_sends_nothing<T: Tier>(tier: T) {
        let sink = tier.sink();
        // In the second call's worth of datums, so checking call by call would not do.
        let nan = datum("NotANumber", MetricValue::Value(f64::NAN), Unit::Count);
        let err = sink
            .put(NAMESPACE, [counts(1200), vec![nan]].concat())
            .await
            .unwrap_err();
        assert!(
            matches!(&err, MetricsError::Invalid { name, .. } if name == "NotANumber"),
            "got {err:?}"
        );

        let infinite = datum(
            "InfiniteMax",
            MetricValue::Statistics {
                count: 1.0,
                sum: 1.0,
                min: 1.0,
                max: f64::INFINITY,
            },
            Unit::Milliseconds,
        );
        let err = sink.put(NAMESPACE, vec![infinite]).await.unwrap_err();
        assert!(
            matches!(&err, MetricsError::Invalid { name, .. } if name == "InfiniteMax"),
            "got {err:?}"
        );

        assert_eq!(tier.recorded_calls().await, []);
    }
}

/// Instantiates every contract test once per tier, as `<tier>::<test>`.
macro_rules! contract_suite {
    (tiers: [$($tier:ident => $ty:ty),* $(,)?], tests: $tests:tt) => {
        $(contract_suite!(@tier $tier, $ty, $tests);)*
    };
    (@tier $tier:ident, $ty:ty, [$($test:ident),* $(,)?]) => {
        mod $tier {
            use super::*;
            $(
                #[tokio::test]
                async fn $test() {
                    contract::$test(<$ty as Tier>::start().await).await;
                }
            )*
        }
    };
}

contract_suite! {
    tiers: [
        memory => MemoryTier,
        cloudwatch_capture => CaptureTier,
    ],
    tests: [
        carries_every_field_of_every_datum,
        keeps_the_order_of_datums_and_of_puts,
        an_empty_put_sends_nothing,
        splits_2500_datums_into_calls_of_1000_1000_500,
        splits_wide_datums_by_size_within_the_limits,
        refuses_31_dimensions_and_sends_nothing,
        refuses_non_finite_values_and_sends_nothing,
    ]
}

// ---------------------------------------------------------------------------------------
// Only the real adapter: the wire, and errors

mod cloudwatch_wire {
    use super::*;

    fn capture_sink(capture: &Capture) -> CloudWatchMetrics {
        CloudWatchMetrics::new(&sdk_config(), Some(&capture.url()))
    }

    #[tokio::test]
    async fn speaks_rpc_v2_cbor_to_put_metric_data() {
        let capture = Capture::start().await;
        let sink = capture_sink(&capture);
        let data = vec![MetricDatum {
            timestamp: base_time() + Duration::from_millis(250),
            ..datum(
                "RecordsProcessed",
                MetricValue::Value(42.5),
                Unit::CountPerSecond,
            )
        }];
        sink.put(NAMESPACE, data).await.unwrap();

        let requests = capture.requests();
        assert_eq!(requests.len(), 1);
        let request = &requests[0];
        assert_eq!(request.method, Method::POST);
        assert_eq!(request.path, PUT_METRIC_DATA_PATH);
        let header = |name: &str| request.headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(header("smithy-protocol"), Some("rpc-v2-cbor"));
        assert_eq!(header("content-type"), Some("application/cbor"));
        assert_eq!(header("accept"), Some("application/cbor"));
        // CloudWatch moved from the query protocol; this tells it to answer errors in
        // query-compatible form (`x-amzn-query-error`).
        assert_eq!(header("x-amzn-query-mode"), Some("true"));
        assert_eq!(header("content-encoding"), None, "a small body goes as is");
        assert!(
            header("authorization")
                .is_some_and(|a| a.contains("/us-east-1/monitoring/aws4_request"))
        );

        // The body, literally: the timestamp is CBOR tag 1 around a float of epoch
        // seconds, which keeps the fraction.
        let body: Value = ciborium::from_reader(&request.body[..]).unwrap();
        let want = Value::Map(vec![
            (text("Namespace"), text(NAMESPACE)),
            (
                text("MetricData"),
                Value::Array(vec![Value::Map(vec![
                    (text("MetricName"), text("RecordsProcessed")),
                    (
                        text("Dimensions"),
                        Value::Array(vec![Value::Map(vec![
                            (text("Name"), text("WorkerId")),
                            (text("Value"), text("worker-a")),
                        ])]),
                    ),
                    (
                        text("Timestamp"),
                        Value::Tag(1, Box::new(Value::Float(1_700_000_000.25))),
                    ),
                    (text("Value"), Value::Float(42.5)),
                    (text("Unit"), text("Count/Second")),
                ])]),
            ),
        ]);
        assert_eq!(body, want);
    }

    /// With the SDK defaults, which every tier here uses, a call of 10 KiB or more goes
    /// gzip-compressed and a smaller one plain; either way the service gets what was put.
    #[tokio::test]
    async fn large_calls_are_gzip_compressed_and_small_ones_plain() {
        let capture = Capture::start().await;
        let sink = capture_sink(&capture);
        let (small, large) = (counts(3), counts(1000));
        sink.put(NAMESPACE, small.clone()).await.unwrap();
        sink.put(NAMESPACE, large.clone()).await.unwrap();

        let requests = capture.requests();
        assert_eq!(requests.len(), 2);
        let encoding = |i: usize| {
            requests[i]
                .headers
                .get("content-encoding")
                .map(HeaderValue::as_bytes)
        };
        assert_eq!(encoding(0), None, "a small body goes as is");
        assert_ne!(requests[0].body[..2], [0x1f, 0x8b]);
        assert_eq!(encoding(1), Some(&b"gzip"[..]));
        assert_eq!(requests[1].body[..2], [0x1f, 0x8b], "gzip magic");

        let calls = capture.calls();
        assert_eq!(calls[0].datums, expected(&small));
        assert_eq!(calls[1].namespace, NAMESPACE);
        assert_eq!(
            calls[1].datums,
            expected(&large),
            "inflated, exactly as put"
        );
        let inflated = calls[1].body_bytes.unwrap();
        assert!(inflated >= 10 * 1024, "{inflated} bytes");
        assert!(
            requests[1].body.len() < inflated,
            "{} bytes on the wire for {inflated} of content",
            requests[1].body.len()
        );
    }

    #[tokio::test]
    async fn an_unreachable_endpoint_is_transient_and_named() {
        let sink = CloudWatchMetrics::new(&sdk_config(), Some("http://127.0.0.1:1"));
        let err = sink.put(NAMESPACE, counts(1)).await.unwrap_err();
        assert!(matches!(err, MetricsError::Transient { .. }), "got {err:?}");
        assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
    }

    async fn put_against(failure: Failure) -> (MetricsError, Capture) {
        let capture = Capture::start().await;
        capture.answer_with(failure);
        let sink = capture_sink(&capture);
        let err = sink.put(NAMESPACE, counts(2500)).await.unwrap_err();
        // The failure is the one asked for, not the capture refusing the request.
        capture.calls();
        (err, capture)
    }

    #[tokio::test]
    async fn throttling_is_throttled_and_stops_the_put() {
        let (err, capture) = put_against(Failure {
            status: StatusCode::BAD_REQUEST,
            query_error: Some("Throttling;Sender"),
            body: Some((
                "com.amazonaws.cloudwatch#ThrottlingException",
                "Rate exceeded",
            )),
        })
        .await;
        assert_eq!(
            err,
            MetricsError::Throttled {
                message: "Rate exceeded".into()
            }
        );
        assert_eq!(
            capture.requests().len(),
            1,
            "no further calls after a failed one"
        );
    }

    #[tokio::test]
    async fn a_server_fault_is_transient_and_names_the_endpoint() {
        let (err, capture) = put_against(Failure {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            query_error: Some("InternalServiceError;Receiver"),
            body: Some(("com.amazonaws.cloudwatch#InternalServiceFault", "boom")),
        })
        .await;
        match &err {
            MetricsError::Transient { endpoint, message } => {
                assert_eq!(endpoint, &capture.url());
                assert!(message.contains("boom"), "the cause is kept: {message}");
            }
            other => panic!("expected Transient, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn an_unreadable_5xx_is_transient() {
        let (err, _capture) = put_against(Failure {
            status: StatusCode::SERVICE_UNAVAILABLE,
            query_error: None,
            body: None,
        })
        .await;
        assert!(matches!(err, MetricsError::Transient { .. }), "got {err:?}");
    }

    #[tokio::test]
    async fn a_refused_request_is_other() {
        let (err, _capture) = put_against(Failure {
            status: StatusCode::BAD_REQUEST,
            query_error: Some("InvalidParameterValue;Sender"),
            body: Some((
                "com.amazonaws.cloudwatch#InvalidParameterValueException",
                "The value for parameter MetricData.member.1.Value is invalid",
            )),
        })
        .await;
        match &err {
            MetricsError::Other { message } => {
                assert!(message.contains("MetricData.member.1.Value"), "{message}")
            }
            other => panic!("expected Other, got {other:?}"),
        }
    }
}
