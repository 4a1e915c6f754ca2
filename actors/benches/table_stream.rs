//! P12, DynamoDB Streams (issue 15), against DynamoDB Local, side by side in one run:
//!
//! * drain: `FLOTILLA_BENCH_RECORDS` changes (default 20,000: puts of 100 B items over
//!   5,000 keys, each put changing its item, written beforehand with BatchWriteItem)
//!   on a table with a stream, drained end to end by a plain aws-sdk-dynamodbstreams
//!   loop (DescribeStream, GetShardIterator TRIM_HORIZON per shard, GetRecords with
//!   Limit 1000 until every change is in) and by flotilla workers with a no-op
//!   processor that counts (polling; worker start included; a fresh lease table in
//!   DynamoDB Local each run), one with the default settings and one with
//!   `reader.poll_interval` lowered as a user draining a backlog would set it (P2's
//!   1 ms); and, to tell the adapter's time from the worker's, the plain loop through
//!   flotilla's `DynamoStreams` adapter. Taking turns, `FLOTILLA_BENCH_RUNS` rounds
//!   (default 7), after one plain drain not counted (DynamoDB Local's JIT warm-up).
//! * latency: with a flotilla worker (default settings) and the plain loop caught up on
//!   the same stream at the same time, one put every 100 ms for 30 s
//!   (`FLOTILLA_BENCH_LATENCY_SECS`); put → process latency from the put instant the
//!   item carries. The plain loop polls as the worker's defaults do: calls 200 ms apart
//!   while changes come, doubling up to 1 s while none do. `FLOTILLA_BENCH_LATENCY_RUNS`
//!   rounds (default 3).
//!
//! DynamoDB Local is found as the tests find it: `FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT`
//! (scripts/test.sh starts it; or start DynamoDBLocal.jar yourself and set the URL).
//!
//! `cargo bench -p flotilla-actors --bench table_stream [-- drain|latency]`.
//! Nothing here asserts a wall-clock limit.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failure is a panic

#[path = "../tests/support/servers.rs"]
#[allow(dead_code)]
mod servers;
#[path = "common/stats.rs"]
#[allow(dead_code)]
mod stats;

use stats::{median, percentile, sorted, wanted};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_dynamodb::types::{AttributeValue as DdbValue, PutRequest, WriteRequest};
use aws_sdk_dynamodbstreams::types::ShardIteratorType;
use flotilla_actors::backend::aws::DynamoStreams;
use flotilla_actors::backend::{IteratorPosition, StreamClient, TableStreamAdmin};
use flotilla_actors::{
    Backend, Batch, Checkpointer, MetricsLevel, Processor, ProcessorError, Settings, Worker,
};

const KEYS: u64 = 5_000;
/// BatchWriteItem's most items per call, and the calls in flight while loading.
const BATCH: usize = 25;
const WRITERS: usize = 16;
/// DynamoDB Streams' largest GetRecords Limit.
const LIMIT: i32 = 1000;
/// The lowered poll interval of the second worker (drain only).
const FAST_POLL: Duration = Duration::from_millis(1);
/// The worker's defaults (config/default.toml), copied by the plain loop in latency.
const POLL: Duration = Duration::from_millis(200);
const IDLE_MAX: Duration = Duration::from_secs(1);
const PUT_EVERY: Duration = Duration::from_millis(100);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The 1, 5 and 15 minute load averages (what else the machine was doing).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".to_owned())
}

fn now_micros() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros()
}

struct Env {
    endpoint: String,
    sdk: aws_config::SdkConfig,
    admin: DynamoStreams,
    tables: aws_sdk_dynamodb::Client,
    streams: aws_sdk_dynamodbstreams::Client,
}

impl Env {
    fn new() -> Self {
        let endpoint = servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT");
        let sdk = servers::sdk_config();
        let tables = aws_sdk_dynamodb::Client::from_conf(
            aws_sdk_dynamodb::config::Builder::from(&sdk)
                .endpoint_url(&endpoint)
                .build(),
        );
        let streams = aws_sdk_dynamodbstreams::Client::from_conf(
            aws_sdk_dynamodbstreams::config::Builder::from(&sdk)
                .endpoint_url(&endpoint)
                .build(),
        );
        Self {
            admin: DynamoStreams::new(&sdk, Some(&endpoint)),
            endpoint,
            sdk,
            tables,
            streams,
        }
    }

    /// The worker's settings: the defaults, this stream, a fresh application (its lease
    /// table in DynamoDB Local), no status server, no CloudWatch.
    fn settings(&self, stream_arn: &str, application: &str) -> Settings {
        let mut s = Settings::default();
        s.worker.stream = stream_arn.to_owned();
        s.worker.application = application.to_owned();
        s.status.enabled = false;
        s.metrics.level = MetricsLevel::None;
        s.aws.region = Some("us-east-1".to_owned());
        s.aws.dynamodb_endpoint = Some(self.endpoint.clone());
        s
    }

    async fn start<P, F>(&self, settings: Settings, make: F) -> Worker
    where
        P: Processor,
        F: Fn() -> P + Send + Sync + 'static,
    {
        let backend = Backend::from_sdk(&self.sdk, &settings.aws);
        Worker::builder()
            .settings(settings)
            .backend(backend)
            .processor(move |_| make())
            .start()
            .await
            .unwrap()
    }
}

// ---------------------------------------------------------------------------------------
// drain

/// A new table with a stream holding `records` changes: puts over [`KEYS`] keys, each
/// with a new `n` (a put that changes nothing makes no record), `WRITERS`
/// BatchWriteItem calls in flight. Returns the stream's ARN.
async fn load(env: &Env, table: &str, records: u64) -> String {
    let arn = env.admin.create_table_with_stream(table).await.unwrap();
    let payload = "x".repeat(100);
    let items: Vec<u64> = (0..records).collect();
    let chunks: Vec<Vec<u64>> = items.chunks(BATCH).map(<[u64]>::to_vec).collect();
    let next = Arc::new(AtomicU64::new(0));
    let chunks = Arc::new(chunks);
    let mut tasks = Vec::new();
    for _ in 0..WRITERS {
        let (tables, table, payload, next, chunks) = (
            env.tables.clone(),
            table.to_owned(),
            payload.clone(),
            next.clone(),
            chunks.clone(),
        );
        tasks.push(tokio::spawn(async move {
            loop {
                let at = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(chunk) = chunks.get(at) else { break };
                let mut requests: Vec<WriteRequest> = chunk
                    .iter()
                    .map(|i| {
                        let put = PutRequest::builder()
                            .item("pk", DdbValue::S(format!("k{}", i % KEYS)))
                            .item("n", DdbValue::N(i.to_string()))
                            .item("payload", DdbValue::S(payload.clone()))
                            .build()
                            .unwrap();
                        WriteRequest::builder().put_request(put).build()
                    })
                    .collect();
                while !requests.is_empty() {
                    let out = tables
                        .batch_write_item()
                        .request_items(&table, requests)
                        .send()
                        .await
                        .unwrap();
                    requests = out
                        .unprocessed_items()
                        .and_then(|u| u.get(&table))
                        .cloned()
                        .unwrap_or_default();
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    arn
}

/// The plain loop: DescribeStream, then per shard GetShardIterator TRIM_HORIZON and
/// GetRecords (Limit 1000) back to back until every change is in.
async fn plain_drain(env: &Env, arn: &str, records: u64) -> Duration {
    let started = Instant::now();
    let described = env
        .streams
        .describe_stream()
        .stream_arn(arn)
        .send()
        .await
        .unwrap();
    let shards: Vec<String> = described
        .stream_description()
        .unwrap()
        .shards()
        .iter()
        .filter_map(|s| s.shard_id().map(str::to_owned))
        .collect();
    let total = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for shard in shards {
        let (client, arn, total) = (env.streams.clone(), arn.to_owned(), total.clone());
        tasks.push(tokio::spawn(async move {
            let mut it = client
                .get_shard_iterator()
                .stream_arn(arn)
                .shard_id(shard)
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await
                .unwrap()
                .shard_iterator
                .unwrap();
            while total.load(Ordering::Relaxed) < records {
                let out = client
                    .get_records()
                    .shard_iterator(&it)
                    .limit(LIMIT)
                    .send()
                    .await
                    .unwrap();
                total.fetch_add(out.records().len() as u64, Ordering::Relaxed);
                match out.next_shard_iterator {
                    Some(next) => it = next,
                    None => break,
                }
            }
        }));
    }
    finish(&total, records, started, tasks).await
}

/// The plain loop's schedule through flotilla's own adapter (`DynamoStreams` as a
/// [`StreamClient`]: the SDK call plus each record turned into the change JSON the
/// processor gets), without the worker: where the adapter's time ends and the
/// worker's begins.
async fn adapter_drain(env: &Env, arn: &str, records: u64) -> Duration {
    let started = Instant::now();
    let shards = env.admin.list_shards(arn).await.unwrap();
    let total = Arc::new(AtomicU64::new(0));
    let adapter = Arc::new(env.admin.clone());
    let mut tasks = Vec::new();
    for shard in shards {
        let (adapter, arn, total) = (adapter.clone(), arn.to_owned(), total.clone());
        tasks.push(tokio::spawn(async move {
            let mut it = adapter
                .get_shard_iterator(&arn, &shard.id, &IteratorPosition::TrimHorizon)
                .await
                .unwrap();
            while total.load(Ordering::Relaxed) < records {
                let batch = adapter.get_records(&it, LIMIT as u32).await.unwrap();
                total.fetch_add(batch.records.len() as u64, Ordering::Relaxed);
                match batch.next_iterator {
                    Some(next) => it = next,
                    None => break,
                }
            }
        }));
    }
    finish(&total, records, started, tasks).await
}

/// Waits until the loops' `total` reaches `records`, stops them, and says how long it
/// took from `started`.
async fn finish(
    total: &AtomicU64,
    records: u64,
    started: Instant,
    tasks: Vec<tokio::task::JoinHandle<()>>,
) -> Duration {
    while total.load(Ordering::Relaxed) < records {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = started.elapsed();
    for t in tasks {
        t.abort();
    }
    took
}

struct Count(Arc<AtomicU64>);

impl Processor for Count {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        self.0
            .fetch_add(batch.records().len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// A flotilla worker from start until it has processed every change; also the time to
/// its first change.
async fn flotilla_drain(
    env: &Env,
    arn: &str,
    records: u64,
    application: &str,
    poll: Option<Duration>,
) -> (Duration, Duration) {
    let mut s = env.settings(arn, application);
    if let Some(poll) = poll {
        s.reader.poll_interval = poll;
    }
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let c = count.clone();
    let worker = env.start(s, move || Count(c.clone())).await;
    let mut first = None;
    while count.load(Ordering::Relaxed) < records {
        if first.is_none() && count.load(Ordering::Relaxed) > 0 {
            first = Some(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = started.elapsed();
    worker.abort();
    let _ = env
        .tables
        .delete_table()
        .table_name(application)
        .send()
        .await;
    (took, first.unwrap_or(took))
}

async fn drain() {
    let env = Env::new();
    let records: u64 = env_or("FLOTILLA_BENCH_RECORDS", 20_000);
    let runs = stats::runs(7);
    let table = servers::unique_name("p12-drain");
    let loading = Instant::now();
    let arn = load(&env, &table, records).await;
    println!(
        "drain: {records} changes written to {table} in {:.1?} ({:.0} writes/s)",
        loading.elapsed(),
        records as f64 / loading.elapsed().as_secs_f64()
    );
    let (mut plain, mut adapter, mut default, mut fast) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut default_steady, mut fast_steady) = (Vec::new(), Vec::new());
    let (mut ratio_default, mut ratio_fast, mut ratio_adapter) =
        (Vec::new(), Vec::new(), Vec::new());
    let rate = |d: Duration| records as f64 / d.as_secs_f64();
    // DynamoDB Local is a JVM: one drain, not counted, so no reader meets it cold.
    let warm = plain_drain(&env, &arn, records).await;
    println!("drain warm-up (plain loop, not counted): {warm:.2?}");
    for run in 0..runs {
        println!("  load average: {}", load_average());
        let (mut p, mut a, mut d, mut f) = (
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO,
            Duration::ZERO,
        );
        let (mut d_first, mut f_first) = (Duration::ZERO, Duration::ZERO);
        // The readers take turns going first, round by round. Each worker gets a lease
        // table of its own: a table another (aborted, still "alive") worker used would
        // have it wait out that worker's failover_time before taking the shard.
        for turn in 0..4 {
            match (turn + run) % 4 {
                0 => p = plain_drain(&env, &arn, records).await,
                1 => a = adapter_drain(&env, &arn, records).await,
                2 => {
                    let app = servers::unique_name("p12-default");
                    (d, d_first) = flotilla_drain(&env, &arn, records, &app, None).await;
                }
                _ => {
                    let app = servers::unique_name("p12-fast");
                    (f, f_first) = flotilla_drain(&env, &arn, records, &app, Some(FAST_POLL)).await;
                }
            }
        }
        let (pr, ar, dr, fr) = (rate(p), rate(a), rate(d), rate(f));
        // From the first change processed to the last: the worker's start left out.
        let (ds, fs) = (rate(d - d_first), rate(f - f_first));
        println!(
            "drain run {run}: plain loop {pr:.0} rec/s ({p:.2?}); adapter loop {ar:.0} rec/s \
             ({a:.2?}); flotilla defaults {dr:.0} rec/s ({d:.2?}, first change at \
             {d_first:.2?}, {ds:.0} rec/s after it); flotilla poll_interval {FAST_POLL:?} \
             {fr:.0} rec/s ({f:.2?}, first change at {f_first:.2?}, {fs:.0} rec/s after it); \
             flotilla / plain {:.2} (defaults), {:.2} (poll {FAST_POLL:?}); adapter / plain {:.2}",
            dr / pr,
            fr / pr,
            ar / pr
        );
        plain.push(pr);
        adapter.push(ar);
        default.push(dr);
        fast.push(fr);
        default_steady.push(ds);
        fast_steady.push(fs);
        ratio_default.push(dr / pr);
        ratio_fast.push(fr / pr);
        ratio_adapter.push(ar / pr);
    }
    let row = |what: &str, v: Vec<f64>, target: &str| {
        let (m, lo, hi) = median(&v);
        if target.is_empty() {
            println!("| P12 | {what} | {m:.0} | {lo:.0} | {hi:.0} | |");
        } else {
            println!("| P12 | {what} | {m:.2} | {lo:.2} | {hi:.2} | {target} |");
        }
    };
    println!();
    println!("| id | what | median | min | max | target |");
    println!("|---|---|---|---|---|---|");
    row("plain aws-sdk-dynamodbstreams loop, rec/s", plain, "");
    row(
        "the same loop through flotilla's DynamoStreams adapter, rec/s",
        adapter,
        "",
    );
    row("flotilla, default settings, rec/s", default, "");
    row(
        "flotilla, default settings, after its first change, rec/s",
        default_steady,
        "",
    );
    row(
        &format!("flotilla, reader.poll_interval = {FAST_POLL:?}, rec/s"),
        fast,
        "",
    );
    row(
        &format!("flotilla, reader.poll_interval = {FAST_POLL:?}, after its first change, rec/s"),
        fast_steady,
        "",
    );
    row("flotilla defaults / plain", ratio_default, "≥ 0.9");
    row(
        &format!("flotilla poll_interval {FAST_POLL:?} / plain"),
        ratio_fast,
        "≥ 0.9",
    );
    row("adapter loop / plain", ratio_adapter, "(diagnostic)");
    let _ = env.admin.delete_table(&table).await;
}

// ---------------------------------------------------------------------------------------
// latency

/// Put → process latencies in ms.
#[derive(Default)]
struct Seen {
    count: AtomicU64,
    latencies_ms: Mutex<Vec<f64>>,
}

impl Seen {
    fn saw(&self, put_micros: Option<u128>) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if let Some(put) = put_micros {
            let ms = now_micros().saturating_sub(put) as f64 / 1000.0;
            self.latencies_ms.lock().unwrap().push(ms);
        }
    }
}

struct Probe(Arc<Seen>);

impl Processor for Probe {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        for record in batch.records() {
            let change = record.dynamodb_change().unwrap();
            let put = change
                .dynamodb
                .new_image
                .as_ref()
                .and_then(|image| image.get("put_us"))
                .and_then(|v| v.as_n())
                .and_then(|n| n.parse().ok());
            self.0.saw(put);
        }
        Ok(())
    }
}

/// The plain loop polling as the worker's defaults do: after an answer with changes
/// the next call starts `POLL` after this one started; after an empty one it waits the
/// idle delay, which doubles from `POLL` up to `IDLE_MAX`.
async fn plain_follow(client: aws_sdk_dynamodbstreams::Client, arn: String, seen: Arc<Seen>) {
    let described = client
        .describe_stream()
        .stream_arn(&arn)
        .send()
        .await
        .unwrap();
    let shards = described.stream_description().unwrap().shards().to_vec();
    let mut tasks = Vec::new();
    for shard in shards {
        let (client, arn, seen) = (client.clone(), arn.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            let mut it = client
                .get_shard_iterator()
                .stream_arn(arn)
                .shard_id(shard.shard_id().unwrap())
                .shard_iterator_type(ShardIteratorType::TrimHorizon)
                .send()
                .await
                .unwrap()
                .shard_iterator
                .unwrap();
            let mut idle = POLL;
            loop {
                let called = Instant::now();
                let out = client
                    .get_records()
                    .shard_iterator(&it)
                    .limit(LIMIT)
                    .send()
                    .await
                    .unwrap();
                for record in out.records() {
                    let put = record
                        .dynamodb()
                        .and_then(|d| d.new_image())
                        .and_then(|image: &HashMap<_, _>| image.get("put_us"))
                        .and_then(|v| v.as_n().ok())
                        .and_then(|n| n.parse().ok());
                    seen.saw(put);
                }
                let delay = if out.records().is_empty() {
                    let d = idle;
                    idle = (idle * 2).min(IDLE_MAX);
                    d
                } else {
                    idle = POLL;
                    POLL.saturating_sub(called.elapsed())
                };
                match out.next_shard_iterator {
                    Some(next) => it = next,
                    None => break,
                }
                tokio::time::sleep(delay).await;
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

async fn put_stamped(env: &Env, table: &str, i: u64) {
    env.tables
        .put_item()
        .table_name(table)
        .item("pk", DdbValue::S(format!("k{}", i % 50)))
        .item("n", DdbValue::N(i.to_string()))
        .item("put_us", DdbValue::N(now_micros().to_string()))
        .send()
        .await
        .unwrap();
}

fn latency_line(what: &str, seen: &Seen) -> (f64, f64, usize) {
    let v = sorted(seen.latencies_ms.lock().unwrap().clone());
    let (p50, p99) = (percentile(&v, 0.5), percentile(&v, 0.99));
    println!(
        "  {what}: {} changes, p50 {p50:.1} ms, p99 {p99:.1} ms, max {:.1} ms",
        v.len(),
        v[v.len() - 1]
    );
    (p50, p99, v.len())
}

async fn latency() {
    let env = Env::new();
    let runs: usize = env_or("FLOTILLA_BENCH_LATENCY_RUNS", 3usize).max(1);
    let secs: u64 = env_or("FLOTILLA_BENCH_LATENCY_SECS", 30);
    let (mut f50, mut f99, mut p50, mut p99) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs {
        println!("  load average: {}", load_average());
        let table = servers::unique_name("p12-latency");
        let arn = env.admin.create_table_with_stream(&table).await.unwrap();
        // A first change, so both readers are at the stream's tip when timing starts.
        put_stamped(&env, &table, 0).await;
        let (flotilla_seen, plain_seen) = (Arc::new(Seen::default()), Arc::new(Seen::default()));
        let application = servers::unique_name("p12-latency");
        let s = flotilla_seen.clone();
        let worker = env
            .start(
                env.settings(&arn, &format!("p12-latency-{run}")),
                move || Probe(s.clone()),
            )
            .await;
        let plain = tokio::spawn(plain_follow(
            env.streams.clone(),
            arn.clone(),
            plain_seen.clone(),
        ));
        while flotilla_seen.count.load(Ordering::Relaxed) < 1
            || plain_seen.count.load(Ordering::Relaxed) < 1
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        flotilla_seen.latencies_ms.lock().unwrap().clear();
        plain_seen.latencies_ms.lock().unwrap().clear();
        let puts = secs * 1000 / PUT_EVERY.as_millis() as u64;
        let mut tick = tokio::time::interval(PUT_EVERY);
        for i in 1..=puts {
            tick.tick().await;
            put_stamped(&env, &table, i).await;
        }
        // Until both have every change (or 5 s: a loss shows as a short count).
        let deadline = Instant::now() + Duration::from_secs(5);
        while (flotilla_seen.count.load(Ordering::Relaxed) < puts + 1
            || plain_seen.count.load(Ordering::Relaxed) < puts + 1)
            && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        println!("latency run {run}: {puts} puts, one every {PUT_EVERY:?}");
        let (a, b, _) = latency_line("flotilla, default settings", &flotilla_seen);
        let (c, d, _) = latency_line(
            "plain loop, polling as flotilla's defaults (200 ms, idle up to 1 s)",
            &plain_seen,
        );
        f50.push(a);
        f99.push(b);
        p50.push(c);
        p99.push(d);
        worker.abort();
        plain.abort();
        let _ = env.admin.delete_table(&table).await;
        let _ = env
            .tables
            .delete_table()
            .table_name(&application)
            .send()
            .await;
    }
    let cell = |v: Vec<f64>| {
        let (m, lo, hi) = median(&v);
        format!("{m:.1} ms ({lo:.1}–{hi:.1})")
    };
    println!();
    println!("| id | reader | p50 median (min–max) | p99 median (min–max) |");
    println!("|---|---|---|---|");
    println!(
        "| P12 | flotilla, default settings | {} | {} |",
        cell(f50),
        cell(f99)
    );
    println!(
        "| P12 | plain loop, 200 ms / idle up to 1 s | {} | {} |",
        cell(p50),
        cell(p99)
    );
}

fn main() {
    // FLOTILLA_LOG=debug (a tracing filter) shows what the workers do, on stderr.
    if let Ok(filter) = std::env::var("FLOTILLA_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        if wanted("drain") {
            drain().await;
        }
        if wanted("latency") {
            latency().await;
        }
    });
}
