//! How the integration tests reach their servers.
//!
//! * In-process servers on `127.0.0.1:0`, one per call, living as long as the calling
//!   test's tokio runtime: [`start_dynoxide`] (DynamoDB) and [`start_ferrokinesis`]
//!   (Kinesis).
//! * External servers started by `scripts/test.sh` (DynamoDB Local, kinesis-mock),
//!   found through environment variables by [`external_endpoint`]. A missing one fails
//!   the test loudly; it is never skipped.
//! * [`sdk_config`]: static test credentials and short timeouts, read from nothing in
//!   the environment, so a developer's AWS settings never leak into a test and an
//!   unreachable endpoint fails fast.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_sdk_dynamodb::config::{Credentials, SharedCredentialsProvider};
use tokio::net::TcpListener;

/// Binds a fresh loopback port and returns the listener and its `http://` URL.
pub async fn loopback_listener(what: &str) -> (TcpListener, String) {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap_or_else(|e| panic!("{what}: cannot bind a loopback port: {e}"));
    let addr = listener
        .local_addr()
        .unwrap_or_else(|e| panic!("{what}: bound socket has no address: {e}"));
    (listener, format!("http://{addr}"))
}

/// Starts dynoxide (an in-memory DynamoDB on SQLite) in this process and returns its
/// endpoint URL. It serves until the calling test's runtime shuts down.
pub async fn start_dynoxide() -> String {
    let db = dynoxide::Database::memory().expect("dynoxide: cannot open an in-memory database");
    let (listener, url) = loopback_listener("dynoxide").await;
    tokio::spawn(dynoxide::server::serve_on(listener, db));
    url
}

/// Starts ferrokinesis (an in-memory Kinesis) in this process and returns its endpoint
/// URL. Stream state changes take 10 ms instead of 500, up to 200 open shards are
/// allowed, and shard iterators expire after `iterator_ttl_seconds`.
pub async fn start_ferrokinesis(iterator_ttl_seconds: u64) -> String {
    let options = ferrokinesis::store::StoreOptions {
        create_stream_ms: 10,
        delete_stream_ms: 10,
        update_stream_ms: 10,
        shard_limit: 200,
        iterator_ttl_seconds,
        ..ferrokinesis::store::StoreOptions::default()
    };
    let (app, _store) = ferrokinesis::create_app(options);
    let (listener, url) = loopback_listener("ferrokinesis").await;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            panic!("ferrokinesis server stopped: {e}");
        }
    });
    url
}

/// The endpoint of a server started by `scripts/test.sh`, from the environment
/// variable `var` (e.g. `FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT`,
/// `FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT`). Panics if it is not set: a test that needs
/// a server must fail without it, never pass by skipping.
pub fn external_endpoint(var: &str) -> String {
    match std::env::var(var) {
        Ok(url) if !url.trim().is_empty() => url,
        _ => panic!(
            "\n\n*** {var} is not set. ***\n\
             This test needs an external server started by the test command.\n\
             Run the tests with scripts/test.sh (it installs and starts DynamoDB Local and \n\
             kinesis-mock and sets {var}), e.g.:  scripts/test.sh -p flotilla-actors\n\n"
        ),
    }
}

/// SDK configuration for tests: static credentials `test`/`test`, region us-east-1,
/// standard retries (3 attempts), a 2 s connect timeout and a 30 s operation timeout.
/// Reads no environment variable, profile file or instance metadata. A test that needs
/// one setting otherwise changes it through `into_builder()`.
pub fn sdk_config() -> SdkConfig {
    let credentials = Credentials::new("test", "test", None, None, "flotilla-tests");
    SdkConfig::builder()
        .behavior_version(BehaviorVersion::latest())
        .region(Region::new("us-east-1"))
        .credentials_provider(SharedCredentialsProvider::new(credentials))
        .retry_config(RetryConfig::standard())
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(Duration::from_secs(2))
                .operation_attempt_timeout(Duration::from_secs(10))
                .operation_timeout(Duration::from_secs(30))
                .build(),
        )
        .build()
}

/// A name no other test (in this process or a concurrent one) uses: `prefix`, the
/// process id, a per-process counter and the time in nanoseconds. Valid as a stream
/// name and as a table name (letters, digits and `-`).
pub fn unique_name(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{prefix}-{}-{n}-{nanos}", std::process::id())
}

/// The real adapters: the given Kinesis client, lease tables on `dynamodb_endpoint`,
/// metrics kept in memory.
pub fn dynamo_backend(
    kinesis: &flotilla_actors::backend::aws::KinesisStream,
    dynamodb_endpoint: &str,
) -> flotilla_actors::Backend {
    let endpoint = dynamodb_endpoint.to_owned();
    flotilla_actors::Backend::new(
        std::sync::Arc::new(kinesis.clone()),
        move |name| {
            std::sync::Arc::new(flotilla_actors::backend::aws::DynamoLeaseTable::new(
                &sdk_config(),
                Some(&endpoint),
                name,
            ))
        },
        std::sync::Arc::new(flotilla_actors::backend::memory::MemoryMetrics::new()),
    )
}
