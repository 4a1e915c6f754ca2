//! P11, enhanced fan-out against polling, side by side in one run:
//!
//! * drain: 100,000 records of 100 B over 4 shards of ferrokinesis (in this process),
//!   read by a raw aws-sdk SubscribeToShard loop (one task per shard, the SDK's event
//!   stream pulled as fast as it comes) and by a flotilla worker in fan-out mode with a
//!   no-op processor; alternating, `FLOTILLA_BENCH_RUNS` times (default 3).
//! * latency: put → process at a steady 1,000 records/s on 4 shards of ferrokinesis for
//!   20 s, default settings, in each mode (the payload carries the put instant).
//! * child start: a shard split under a steady 200 records/s; the gap from the parent's
//!   last record processed to the first record of each child processed, in each mode,
//!   on ferrokinesis and on the memory backend.
//! * calls: Kinesis API calls per shard per minute in each mode, idle and at 10 records/s
//!   per shard, counted by the fault injector (injecting nothing) on the memory backend
//!   over 10 virtual minutes.
//!
//! `cargo bench -p flotilla-actors --bench fanout [-- drain|latency|child|calls]`.
//! Nothing here asserts a wall-clock limit.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failure is a panic

#[path = "../tests/support/servers.rs"]
#[allow(dead_code)]
mod servers;
#[path = "common/stats.rs"]
#[allow(dead_code)]
mod stats;

#[path = "common/load.rs"]
mod load;

use stats::{median, percentile, sorted, wanted};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use aws_sdk_kinesis::types::{ShardIteratorType, StartingPosition, SubscribeToShardEventStream};
use bytes::Bytes;
use flotilla_actors::backend::aws::KinesisStream;
use flotilla_actors::backend::faults::{FaultPlan, Faulty};
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{PutRecord, StreamAdmin, StreamClient};
use flotilla_actors::settings::ReadMode;
use flotilla_actors::{
    Backend, Batch, Checkpointer, MetricsLevel, Processor, ProcessorError, Settings, Worker,
};

const SHARDS: u32 = 4;
const RECORDS: u64 = 100_000;

fn runs() -> usize {
    stats::runs(3)
}

fn settings(stream: &str, application: &str, mode: ReadMode) -> Settings {
    let mut s = Settings::default();
    s.worker.stream = stream.to_owned();
    s.worker.application = application.to_owned();
    s.status.enabled = false;
    s.metrics.level = MetricsLevel::None;
    s.reader.mode = mode;
    s
}

fn memory_tables()
-> impl Fn(&str) -> Arc<dyn flotilla_actors::backend::LeaseTable> + Send + Sync + 'static {
    let db = MemoryDynamo::new();
    move |name| Arc::new(db.lease_table(name))
}

/// What every processor of a bench sees: records, and per shard the last and first
/// process instants and the put → process latencies of stamped records.
#[derive(Default)]
struct Seen {
    count: AtomicU64,
    latencies_ms: Mutex<Vec<f64>>,
    /// Per shard: (first processed, last processed).
    times: Mutex<BTreeMap<String, (Instant, Instant)>>,
}

struct Probe {
    seen: Arc<Seen>,
    stamped: bool,
}

impl Processor for Probe {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let now = Instant::now();
        self.seen
            .count
            .fetch_add(batch.records().len() as u64, Ordering::Relaxed);
        if self.stamped {
            let wall = SystemTime::now().duration_since(UNIX_EPOCH).unwrap();
            let mut lat = self.seen.latencies_ms.lock().unwrap();
            for record in batch.records() {
                if let Some(put) = std::str::from_utf8(&record.data)
                    .ok()
                    .and_then(|t| t.split(':').next())
                    .and_then(|t| t.parse::<u128>().ok())
                {
                    lat.push((wall.as_micros().saturating_sub(put)) as f64 / 1000.0);
                }
            }
        }
        let mut times = self.seen.times.lock().unwrap();
        let entry = times
            .entry(batch.shard_id().to_string())
            .or_insert((now, now));
        entry.1 = now;
        Ok(())
    }
}

async fn start(settings: Settings, backend: Backend, seen: &Arc<Seen>, stamped: bool) -> Worker {
    let seen = seen.clone();
    Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |_| Probe {
            seen: seen.clone(),
            stamped,
        })
        .start()
        .await
        .unwrap()
}

// ---------------------------------------------------------------------------------------
// drain

/// The raw loop: the SDK's SubscribeToShard per shard from TRIM_HORIZON, events pulled
/// as they come, until every record is in.
async fn raw(client: &aws_sdk_kinesis::Client, consumer: &str, shards: &[String]) -> Duration {
    let started = Instant::now();
    let total = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for shard in shards {
        let (client, consumer, shard, total) = (
            client.clone(),
            consumer.to_owned(),
            shard.clone(),
            total.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut output = client
                .subscribe_to_shard()
                .consumer_arn(consumer)
                .shard_id(shard)
                .starting_position(
                    StartingPosition::builder()
                        .r#type(ShardIteratorType::TrimHorizon)
                        .build()
                        .unwrap(),
                )
                .send()
                .await
                .unwrap();
            while total.load(Ordering::Relaxed) < RECORDS {
                match output.event_stream.recv().await.unwrap() {
                    Some(SubscribeToShardEventStream::SubscribeToShardEvent(event)) => {
                        total.fetch_add(event.records().len() as u64, Ordering::Relaxed);
                    }
                    Some(_) => {}
                    None => break,
                }
            }
        }));
    }
    // Done when the last record is in, measured as flotilla's is (a task whose shard is
    // drained would otherwise wait for the server's next, empty, event).
    while total.load(Ordering::Relaxed) < RECORDS {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = started.elapsed();
    for task in tasks {
        task.abort();
    }
    took
}

async fn drain() {
    let endpoint = servers::start_ferrokinesis(300).await;
    let sdk = servers::sdk_config();
    let streams = KinesisStream::new(&sdk, Some(&endpoint));
    let stream = "drain";
    load::load(&streams, stream, SHARDS, RECORDS).await;
    let client = aws_sdk_kinesis::Client::from_conf(
        aws_sdk_kinesis::config::Builder::from(&sdk)
            .endpoint_url(&endpoint)
            .build(),
    );
    let arn = streams.describe_stream_summary(stream).await.unwrap().arn;
    let shards: Vec<String> = streams
        .list_shards(stream)
        .await
        .unwrap()
        .into_iter()
        .map(|s| s.id.to_string())
        .collect();
    let (mut raw_rates, mut fan_rates, mut poll_rates, mut ratios) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..runs() {
        let consumer = flotilla_actors::fanout::ensure_consumer(
            &streams,
            stream,
            &arn,
            &format!("raw-{run}"),
            Duration::from_secs(30),
        )
        .await
        .unwrap();
        let r = raw(&client, &consumer.arn, &shards).await;
        let mut rates = Vec::new();
        for mode in [ReadMode::Fanout, ReadMode::Polling] {
            let seen = Arc::new(Seen::default());
            let application = format!("drain-{}-{run}", mode.as_str());
            // Registered beforehand, as the raw loop's is: a consumer is registered
            // once per application, and this measures reading.
            flotilla_actors::fanout::ensure_consumer(
                &streams,
                stream,
                &arn,
                &application,
                Duration::from_secs(30),
            )
            .await
            .unwrap();
            let mut s = settings(stream, &application, mode);
            s.reader.poll_interval = Duration::from_millis(1);
            s.lease.heartbeat_interval = Duration::from_millis(200);
            let backend = Backend::new(
                Arc::new(KinesisStream::new(&sdk, Some(&endpoint))),
                memory_tables(),
                Arc::new(MemoryMetrics::new()),
            );
            let started = Instant::now();
            let worker = start(s, backend, &seen, false).await;
            while seen.count.load(Ordering::Relaxed) < RECORDS {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            rates.push(RECORDS as f64 / started.elapsed().as_secs_f64());
            worker.abort();
        }
        let raw_rate = RECORDS as f64 / r.as_secs_f64();
        println!(
            "drain run {run}: raw SubscribeToShard loop {raw_rate:.0} rec/s, flotilla fan-out {:.0} rec/s, flotilla polling {:.0} rec/s, fan-out / raw {:.2}",
            rates[0],
            rates[1],
            rates[0] / raw_rate
        );
        raw_rates.push(raw_rate);
        fan_rates.push(rates[0]);
        poll_rates.push(rates[1]);
        ratios.push(rates[0] / raw_rate);
    }
    let row = |what: &str, v: Vec<f64>, target: &str| {
        let (m, lo, hi) = median(&v);
        println!("| P11 | {what} | {m:.2} | {lo:.2} | {hi:.2} | {target} |");
    };
    println!("| id | what | median | min | max | target |");
    println!("|---|---|---|---|---|---|");
    row("raw aws-sdk SubscribeToShard loop, rec/s", raw_rates, "");
    row(
        "flotilla fan-out, rec/s (worker start included, consumer registered before)",
        fan_rates,
        "",
    );
    row(
        "flotilla polling, rec/s (worker start included)",
        poll_rates,
        "",
    );
    row("flotilla fan-out / raw loop", ratios, "≥ 0.9");
}

// ---------------------------------------------------------------------------------------
// latency

async fn latency() {
    let endpoint = servers::start_ferrokinesis(300).await;
    let sdk = servers::sdk_config();
    let ferro = KinesisStream::new(&sdk, Some(&endpoint));
    let memory = MemoryStreams::new(MemoryStreamsConfig::default());
    let mut rows = Vec::new();
    for (server, mode) in [
        ("ferrokinesis", ReadMode::Fanout),
        ("ferrokinesis", ReadMode::Polling),
        ("memory", ReadMode::Fanout),
        ("memory", ReadMode::Polling),
    ] {
        let mut p50s = Vec::new();
        let mut p99s = Vec::new();
        let streams: &dyn StreamAdmin = if server == "memory" { &memory } else { &ferro };
        for run in 0..runs() {
            let stream = format!("latency-{server}-{}-{run}", mode.as_str());
            streams.create_stream(&stream, SHARDS).await.unwrap();
            let seen = Arc::new(Seen::default());
            let backend = if server == "memory" {
                Backend::memory(memory.clone(), MemoryDynamo::new(), MemoryMetrics::new())
            } else {
                Backend::new(
                    Arc::new(KinesisStream::new(&sdk, Some(&endpoint))),
                    memory_tables(),
                    Arc::new(MemoryMetrics::new()),
                )
            };
            let worker = start(
                settings(&stream, &format!("{stream}-app"), mode),
                backend,
                &seen,
                true,
            )
            .await;
            tokio::time::sleep(Duration::from_secs(2)).await;
            // 1,000 records/s: 50 every 50 ms, each stamped with its put time.
            let started = Instant::now();
            let mut n = 0u64;
            while started.elapsed() < Duration::from_secs(20) {
                let stamp = SystemTime::now()
                    .duration_since(UNIX_EPOCH)
                    .unwrap()
                    .as_micros();
                let records: Vec<PutRecord> = (0..50)
                    .map(|i| {
                        n += 1;
                        PutRecord {
                            partition_key: format!("k{}", (n + i) % 256),
                            explicit_hash_key: None,
                            data: Bytes::from(format!("{stamp}:{n}")),
                        }
                    })
                    .collect();
                streams.put_records(&stream, &records).await.unwrap();
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            tokio::time::sleep(Duration::from_secs(3)).await;
            worker.abort();
            let lat = sorted(seen.latencies_ms.lock().unwrap().clone());
            let (p50, p99) = (percentile(&lat, 0.5), percentile(&lat, 0.99));
            println!(
                "latency {server} {} run {run}: {} records, p50 {p50:.1} ms, p99 {p99:.1} ms",
                mode.as_str(),
                lat.len()
            );
            p50s.push(p50);
            p99s.push(p99);
        }
        rows.push((server, mode, median(&p50s), median(&p99s)));
    }
    println!("| id | what | p50 median (min–max) | p99 median (min–max) | target |");
    println!("|---|---|---|---|---|");
    for (server, mode, p50, p99) in rows {
        println!(
            "| P11 | put → process, 1,000 rec/s on 4 shards, {server}, {} | {:.1} ms ({:.1}–{:.1}) | {:.1} ms ({:.1}–{:.1}) | {} |",
            mode.as_str(),
            p50.0,
            p50.1,
            p50.2,
            p99.0,
            p99.1,
            p99.2,
            if mode == ReadMode::Fanout {
                "p50 ≤ 100 ms"
            } else {
                ""
            }
        );
    }
}

// ---------------------------------------------------------------------------------------
// child start

/// Splits shard 0 of a 2-shard stream under a steady 200 records/s, and returns the
/// gaps from the parent's last record processed to each child's first.
async fn child_gap(
    admin: Arc<dyn StreamAdmin>,
    backend: Backend,
    mode: ReadMode,
    tag: &str,
) -> Vec<f64> {
    let stream = format!("child-{tag}-{}", mode.as_str());
    admin.create_stream(&stream, 2).await.unwrap();
    let seen = Arc::new(Seen::default());
    let mut s = settings(&stream, &format!("{stream}-app"), mode);
    s.reader.shard_sync_interval = Duration::from_secs(60);
    let worker = start(s, backend, &seen, false).await;
    let produce = {
        let (admin, stream) = (admin.clone(), stream.clone());
        tokio::spawn(async move {
            let mut n = 0u64;
            loop {
                let records: Vec<PutRecord> = (0..20)
                    .map(|_| {
                        n += 1;
                        PutRecord {
                            partition_key: format!("k{}", n % 64),
                            explicit_hash_key: None,
                            data: Bytes::from(n.to_string()),
                        }
                    })
                    .collect();
                if admin.put_records(&stream, &records).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(3)).await;
    let shards = admin.list_shards(&stream).await.unwrap();
    let parent = shards[0].clone();
    let mid = parent.hash_range.start + (parent.hash_range.end - parent.hash_range.start) / 2;
    admin.split_shard(&stream, &parent.id, mid).await.unwrap();
    tokio::time::sleep(Duration::from_secs(8)).await;
    produce.abort();
    worker.abort();
    let times = seen.times.lock().unwrap().clone();
    let children: Vec<String> = admin
        .list_shards(&stream)
        .await
        .unwrap()
        .into_iter()
        .filter(|s| s.parent.as_ref() == Some(&parent.id))
        .map(|s| s.id.to_string())
        .collect();
    let parent_last = times[&parent.id.to_string()].1;
    children
        .iter()
        .map(|c| {
            times.get(c).map_or(f64::NAN, |(first, _)| {
                first.duration_since(parent_last).as_secs_f64() * 1000.0
            })
        })
        .collect()
}

async fn child() {
    let endpoint = servers::start_ferrokinesis(300).await;
    let sdk = servers::sdk_config();
    println!("| id | what | gaps, ms (each child, each run) | target |");
    println!("|---|---|---|---|");
    for mode in [ReadMode::Fanout, ReadMode::Polling] {
        let mut ferro = Vec::new();
        let mut memory = Vec::new();
        for run in 0..runs() {
            let kinesis = KinesisStream::new(&sdk, Some(&endpoint));
            let backend = Backend::new(
                Arc::new(kinesis.clone()),
                memory_tables(),
                Arc::new(MemoryMetrics::new()),
            );
            ferro.extend(child_gap(Arc::new(kinesis), backend, mode, &format!("f{run}")).await);
            let mem = MemoryStreams::new(MemoryStreamsConfig::default());
            let backend = Backend::memory(mem.clone(), MemoryDynamo::new(), MemoryMetrics::new());
            memory.extend(child_gap(Arc::new(mem), backend, mode, &format!("m{run}")).await);
        }
        let show = |v: &[f64]| {
            v.iter()
                .map(|g| format!("{g:.0}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        println!(
            "| P11 | child start after the parent's last record, {}, ferrokinesis | {} | ≤ 1,000 |",
            mode.as_str(),
            show(&ferro)
        );
        println!(
            "| P11 | child start after the parent's last record, {}, memory | {} | ≤ 1,000 |",
            mode.as_str(),
            show(&memory)
        );
    }
}

// ---------------------------------------------------------------------------------------
// calls

async fn calls_run(mode: ReadMode, busy: bool) -> BTreeMap<&'static str, f64> {
    const MINUTES: u64 = 10;
    let mem = MemoryStreams::new(MemoryStreamsConfig::default());
    mem.create_stream("calls", SHARDS).await.unwrap();
    let faulty = Faulty::new(mem.clone(), FaultPlan::seeded(0));
    let backend = Backend::new(
        Arc::new(faulty.clone()),
        memory_tables(),
        Arc::new(MemoryMetrics::new()),
    );
    let seen = Arc::new(Seen::default());
    let worker = start(settings("calls", "calls-app", mode), backend, &seen, false).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    let ops = [
        "GetRecords",
        "GetShardIterator",
        "SubscribeToShard",
        "SubscribeToShardEvent",
        "ListShards",
        "DescribeStreamConsumer",
        "RegisterStreamConsumer",
    ];
    let before: Vec<u64> = ops.iter().map(|op| faulty.calls(op)).collect();
    let started = tokio::time::Instant::now();
    let mut n = 0u64;
    while started.elapsed() < Duration::from_secs(MINUTES * 60) {
        if busy {
            let records: Vec<PutRecord> = (0..SHARDS as u64 * 10)
                .map(|_| {
                    n += 1;
                    PutRecord {
                        partition_key: format!("k{n}"),
                        explicit_hash_key: None,
                        data: Bytes::from(n.to_string()),
                    }
                })
                .collect();
            mem.put_records("calls", &records).await.unwrap();
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let per = (MINUTES * u64::from(SHARDS)) as f64;
    let out = ops
        .iter()
        .zip(before)
        .map(|(op, b)| (*op, (faulty.calls(op) - b) as f64 / per))
        .collect();
    worker.abort();
    out
}

fn calls() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap();
    println!("| id | what | polling | fan-out |");
    println!("|---|---|---|---|");
    for busy in [false, true] {
        let polling = runtime.block_on(calls_run(ReadMode::Polling, busy));
        let fanout = runtime.block_on(calls_run(ReadMode::Fanout, busy));
        for (op, p) in &polling {
            let f = fanout[op];
            if *p > 0.0 || f > 0.0 {
                println!(
                    "| P11 | {op} per shard per minute, {} | {p:.1} | {f:.1} |",
                    if busy { "10 rec/s per shard" } else { "idle" }
                );
            }
        }
    }
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if wanted("drain") {
        runtime.block_on(drain());
    }
    if wanted("latency") {
        runtime.block_on(latency());
    }
    if wanted("child") {
        runtime.block_on(child());
    }
    if wanted("calls") {
        calls();
    }
}
