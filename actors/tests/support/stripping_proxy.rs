//! A loopback proxy in front of a DynamoDB or Kinesis server (dynoxide, ferrokinesis)
//! that cuts every JSON answer down to what AWS promises for that call, and can answer
//! a call with a fault instead of forwarding it.
//!
//! The in-process servers answer generously: whole rows where DynamoDB returns only the
//! updated attributes, optional fields on every answer. An adapter that relies on such
//! extras works on them and fails on AWS, or on an emulator that returns the minimum
//! (moto). Behind this proxy the contract suites run on the minimum:
//!
//! * DynamoDB `UpdateItem`: `ReturnValues` NONE (or none given) → `{}`; `UPDATED_NEW` →
//!   only the attributes whose value the update changed, never the key (the strictest
//!   reading of "the updated attributes", and what moto does); `ALL_NEW`/`ALL_OLD` →
//!   `Attributes` alone. `PutItem`/`DeleteItem` without `ReturnValues` → `{}`.
//!   `GetItem` → `Item` alone; `Scan` and `Query` → `Items` and `LastEvaluatedKey`;
//!   `DescribeTable`/`CreateTable` → name, key schema, attribute definitions, status,
//!   and each global secondary index's name, key schema, projection and status.
//!   A refused condition keeps the old `Item` it was asked for (AWS returns it), unless
//!   [`Options::drop_old_item`] says otherwise.
//! * Kinesis `GetRecords` → `Records` (sequence number, data, partition key) and
//!   `NextShardIterator`; no `MillisBehindLatest`, no arrival timestamps, and children
//!   (`ChildShards`) without hash ranges. `GetShardIterator` → `ShardIterator`;
//!   `ListShards` → shards and `NextToken`; `DescribeStreamSummary` → its required
//!   fields; `PutRecords` → `Records`. `SubscribeToShard` streams through untouched (its
//!   events are event-stream frames, not JSON).
//!
//! The proxy reads nothing but the `X-Amz-Target` header and the JSON bodies; it does
//! not sign, so it fronts only servers that do not check signatures.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Map, Value, json};

use super::servers::loopback_listener;

/// What the proxy leaves out beyond AWS's minimum.
#[derive(Debug, Clone, Copy, Default)]
pub struct Options {
    /// Drop the old item from a refused condition (as a server that ignores
    /// `ReturnValuesOnConditionCheckFailure` does), so the adapter must read the row.
    pub drop_old_item: bool,
}

/// An answer the proxy gives instead of forwarding a call.
#[derive(Debug, Clone)]
pub enum Fault {
    /// HTTP 500 with an empty body: no error code, no message.
    Bare500,
    /// HTTP 200 with this JSON body.
    Answer(Value),
    /// This HTTP status with this JSON body (an error answer, e.g. a server that does
    /// not know the operation).
    Refuse(u16, Value),
}

/// A running proxy. It serves until the test's runtime shuts down.
#[derive(Clone)]
pub struct StrippingProxy {
    url: String,
    shared: Arc<Shared>,
}

struct Shared {
    upstream: String,
    options: Options,
    client: Client<HttpConnector, Full<Bytes>>,
    /// Faults queued per operation name (`GetRecords`), used one per call.
    faults: Mutex<HashMap<String, VecDeque<Fault>>>,
    /// Calls seen per operation name, faults included.
    calls: Mutex<HashMap<String, usize>>,
}

impl StrippingProxy {
    /// Starts a proxy on a fresh loopback port in front of `upstream` (an `http://` URL).
    pub async fn start(upstream: &str, options: Options) -> StrippingProxy {
        let (listener, url) = loopback_listener("stripping proxy").await;
        let shared = Arc::new(Shared {
            upstream: upstream.trim_end_matches('/').to_owned(),
            options,
            client: Client::builder(TokioExecutor::new()).build_http(),
            faults: Mutex::default(),
            calls: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                panic!("stripping proxy stopped: {e}");
            }
        });
        StrippingProxy { url, shared }
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// The next `n` calls of `operation` (e.g. `GetRecords`) get `fault` instead of
    /// reaching the server.
    pub fn fault_next(&self, operation: &str, n: usize, fault: Fault) {
        let mut faults = self.shared.faults.lock().unwrap();
        let queue = faults.entry(operation.to_owned()).or_default();
        queue.extend(std::iter::repeat_n(fault, n));
    }

    /// How many calls of `operation` the proxy has seen (faulted ones included).
    pub fn calls(&self, operation: &str) -> usize {
        self.shared
            .calls
            .lock()
            .unwrap()
            .get(operation)
            .copied()
            .unwrap_or(0)
    }
}

/// `DynamoDB_20120810.UpdateItem` → `UpdateItem`.
fn operation_of(request: &Request) -> String {
    request
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.rsplit('.').next())
        .unwrap_or_default()
        .to_owned()
}

async fn handle(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let operation = operation_of(&request);
    *shared
        .calls
        .lock()
        .unwrap()
        .entry(operation.clone())
        .or_default() += 1;
    let fault = shared
        .faults
        .lock()
        .unwrap()
        .get_mut(&operation)
        .and_then(VecDeque::pop_front);
    match fault {
        Some(Fault::Bare500) => return respond(500, None, Bytes::new()),
        Some(Fault::Answer(body)) => {
            return respond(200, content_type(&request), Bytes::from(body.to_string()));
        }
        Some(Fault::Refuse(status, body)) => {
            return respond(
                status,
                content_type(&request),
                Bytes::from(body.to_string()),
            );
        }
        None => {}
    }
    let (parts, body) = request.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    if operation == "SubscribeToShard" {
        return shared.forward_streaming(&parts, body).await;
    }
    let Ok(mut input) = serde_json::from_slice::<Value>(&body) else {
        return shared.forward(&parts, body).await;
    };
    let updated_new = operation == "UpdateItem" && input["ReturnValues"] == "UPDATED_NEW";
    let before = if updated_new {
        // Ask for the whole new row and compare it with the row before.
        input["ReturnValues"] = json!("ALL_NEW");
        Some(shared.get_item(&parts, &input).await)
    } else {
        None
    };
    let request_body = Bytes::from(input.to_string());
    let response = shared.forward(&parts, request_body).await;
    let status = response.status().as_u16();
    let (head, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let Ok(mut answer) = serde_json::from_slice::<Value>(&body) else {
        return Response::from_parts(head, Body::from(body));
    };
    if status == 200 {
        if let Some(before) = before {
            answer = changed_attributes(&input, &before, &answer);
        } else {
            answer = promised(&operation, &input, answer);
        }
    } else if shared.options.drop_old_item
        && let Some(error) = answer.as_object_mut()
    {
        error.remove("Item");
    }
    let ct = head
        .headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    respond(status, ct, Bytes::from(answer.to_string()))
}

fn content_type(request: &Request) -> Option<String> {
    request
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

fn respond(status: u16, content_type: Option<String>, body: Bytes) -> Response {
    let mut builder = Response::builder().status(status);
    if let Some(ct) = content_type {
        builder = builder.header("content-type", ct);
    }
    builder
        .header("x-amzn-requestid", "stripping-proxy")
        .body(Body::from(body))
        .unwrap()
}

impl Shared {
    async fn forward(&self, parts: &axum::http::request::Parts, body: Bytes) -> Response {
        let (head, body) = self.forward_streaming(parts, body).await.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Response::from_parts(head, Body::from(body))
    }

    /// Forwards, passing the answer's body on as it comes (a subscription's events).
    async fn forward_streaming(&self, parts: &axum::http::request::Parts, body: Bytes) -> Response {
        let mut builder = hyper::Request::builder()
            .method(parts.method.clone())
            .uri(format!(
                "{}{}",
                self.upstream,
                parts.uri.path_and_query().map_or("/", |p| p.as_str())
            ));
        for (name, value) in &parts.headers {
            if name != "host" && name != "content-length" {
                builder = builder.header(name, value);
            }
        }
        let request = builder.body(Full::new(body)).unwrap();
        let response =
            self.client.request(request).await.unwrap_or_else(|e| {
                panic!("stripping proxy: {} did not answer: {e}", self.upstream)
            });
        let (head, body) = response.into_parts();
        Response::from_parts(head, Body::new(body))
    }

    /// The row an UpdateItem is about, as it is before the update (`Null` if absent).
    async fn get_item(&self, parts: &axum::http::request::Parts, update: &Value) -> Value {
        let mut parts = parts.clone();
        parts
            .headers
            .insert("x-amz-target", "DynamoDB_20120810.GetItem".parse().unwrap());
        let body = json!({
            "TableName": update["TableName"],
            "Key": update["Key"],
            "ConsistentRead": true,
        });
        let response = self.forward(&parts, Bytes::from(body.to_string())).await;
        let body = response.into_body().collect().await.unwrap().to_bytes();
        let answer: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        answer.get("Item").cloned().unwrap_or(Value::Null)
    }
}

/// An `UPDATED_NEW` answer: the attributes of the new row (`after`, an `ALL_NEW`
/// answer) whose value differs from the row `before`, without the key.
fn changed_attributes(update: &Value, before: &Value, after: &Value) -> Value {
    let key = update["Key"].as_object().cloned().unwrap_or_default();
    let changed: Map<String, Value> = after["Attributes"]
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(name, value)| !key.contains_key(*name) && before.get(*name) != Some(*value))
        .map(|(name, value)| (name.clone(), value.clone()))
        .collect();
    if changed.is_empty() {
        json!({})
    } else {
        json!({ "Attributes": changed })
    }
}

/// Keeps `fields` of `value` (an object), drops the rest.
fn keep(value: &Value, fields: &[&str]) -> Value {
    let Some(object) = value.as_object() else {
        return value.clone();
    };
    Value::Object(
        object
            .iter()
            .filter(|(name, _)| fields.contains(&name.as_str()))
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
    )
}

/// Each element of the array at `field` cut down to `fields`.
fn keep_each(value: &mut Value, field: &str, fields: &[&str]) {
    if let Some(items) = value.get_mut(field).and_then(Value::as_array_mut) {
        for item in items {
            *item = keep(item, fields);
        }
    }
}

/// A successful answer to `operation` cut down to what AWS promises for it.
fn promised(operation: &str, input: &Value, answer: Value) -> Value {
    let asked_nothing = matches!(input.get("ReturnValues"), None | Some(Value::Null))
        || input["ReturnValues"] == "NONE";
    const TABLE: &[&str] = &[
        "TableName",
        "KeySchema",
        "AttributeDefinitions",
        "TableStatus",
        "GlobalSecondaryIndexes",
    ];
    const INDEX: &[&str] = &["IndexName", "KeySchema", "Projection", "IndexStatus"];
    let table = |answer: &Value| {
        let mut table = keep(answer, TABLE);
        keep_each(&mut table, "GlobalSecondaryIndexes", INDEX);
        table
    };
    match operation {
        // DynamoDB
        "UpdateItem" | "PutItem" | "DeleteItem" if asked_nothing => json!({}),
        "UpdateItem" | "PutItem" | "DeleteItem" => keep(&answer, &["Attributes"]),
        "GetItem" => keep(&answer, &["Item"]),
        // Nothing is asked for (no ReturnConsumedCapacity or item collection metrics).
        "TransactWriteItems" => json!({}),
        "Scan" | "Query" => keep(&answer, &["Items", "LastEvaluatedKey"]),
        "DescribeTable" => json!({ "Table": table(&answer["Table"]) }),
        "CreateTable" => json!({ "TableDescription": table(&answer["TableDescription"]) }),
        // Kinesis
        "GetRecords" => {
            let mut out = keep(&answer, &["Records", "NextShardIterator", "ChildShards"]);
            keep_each(
                &mut out,
                "Records",
                &["SequenceNumber", "Data", "PartitionKey"],
            );
            keep_each(&mut out, "ChildShards", &["ShardId", "ParentShards"]);
            out
        }
        "GetShardIterator" => keep(&answer, &["ShardIterator"]),
        "ListShards" => {
            let mut out = keep(&answer, &["Shards", "NextToken"]);
            keep_each(
                &mut out,
                "Shards",
                &[
                    "ShardId",
                    "ParentShardId",
                    "AdjacentParentShardId",
                    "HashKeyRange",
                    "SequenceNumberRange",
                ],
            );
            out
        }
        "DescribeStreamSummary" => json!({
            "StreamDescriptionSummary": keep(
                &answer["StreamDescriptionSummary"],
                &[
                    "StreamName",
                    "StreamARN",
                    "StreamStatus",
                    "RetentionPeriodHours",
                    "StreamCreationTimestamp",
                    "EnhancedMonitoring",
                    "OpenShardCount",
                ],
            )
        }),
        "PutRecords" => {
            let mut out = keep(&answer, &["Records"]);
            keep_each(
                &mut out,
                "Records",
                &["SequenceNumber", "ShardId", "ErrorCode", "ErrorMessage"],
            );
            out
        }
        _ => answer,
    }
}
