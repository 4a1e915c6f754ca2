#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench binary: any failure should abort the run loudly
//! Pipeline benchmarks on the memory backend (issue "Benchmarks"):
//!
//! * P1 throughput: a no-op processor vs a raw GetRecords loop, 1 / 16 / 64 / 256 shards.
//! * P7 memory: RSS holding 1,000 idle leases, and while draining 1,000 shards; each
//!   measurement in a fresh child process (this binary re-executed with `--child`).
//! * P8 latency: put → process at a steady 1,000 records/s on 4 shards, real time.
//! * P10 the MultiLang pipe: a no-op child process per shard (the npm aws-kcl client,
//!   `multilang_noop.js`, from `$FLOTILLA_BENCH_AWS_KCL`) against the built-in no-op
//!   processor, side by side. Only when asked for (`-- p10`): it needs node and the
//!   package.
//!
//! `cargo bench -p flotilla-actors --bench pipeline [-- p1|p7|p8]`. Each measurement is
//! repeated `FLOTILLA_BENCH_RUNS` times (default 5); the table at the end shows
//! median / min / max. Nothing here asserts a wall-clock limit.

#[path = "../tests/support/counted.rs"]
mod counted;
#[path = "common/stats.rs"]
#[allow(dead_code)]
mod stats;

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use counted::Counted;
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{IteratorPosition, PutRecord, StreamAdmin, StreamClient};
use flotilla_actors::multilang::{ChildCommand, MultiLangProcessor};
use flotilla_actors::{
    Backend, Batch, Checkpointer, MetricsLevel, Processor, ProcessorError, Settings, ShardInfo,
    Worker,
};
use stats::{env_usize, median, percentile, sorted};

const STREAM: &str = "bench";
const APP: &str = "bench-app";
const RECORD_BYTES: usize = 100;

fn runs() -> usize {
    stats::runs(5)
}

// ---------------------------------------------------------------------------------------
// Shared pieces

/// The base instant and (put stamp, latency) in nanos, per record processed.
type LatencySink = (Instant, Arc<Mutex<Vec<(u64, u64)>>>);

/// Counts delivered records; optionally records put → process latency for records whose
/// data starts with the nanos since `base` (P8).
struct Counter {
    count: Arc<AtomicU64>,
    latency: Option<LatencySink>,
}

impl Processor for Counter {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        if let Some((base, sink)) = &self.latency {
            let now = base.elapsed().as_nanos() as u64;
            let mut sink = sink.lock().unwrap();
            for r in batch.records() {
                let mut stamp = [0u8; 8];
                stamp.copy_from_slice(&r.data[..8]);
                let stamp = u64::from_le_bytes(stamp);
                sink.push((stamp, now.saturating_sub(stamp)));
            }
        }
        self.count.fetch_add(batch.len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// A hash key in the middle of shard `i`'s range, of `n` evenly split shards.
fn hash_key_of(i: usize, n: usize) -> u128 {
    let width = u128::MAX / n as u128;
    width * i as u128 + width / 2
}

/// Puts `total` records of `RECORD_BYTES`, round robin over `shards` shards.
async fn preload(streams: &MemoryStreams, shards: usize, total: usize) {
    let data = Bytes::from(vec![b'x'; RECORD_BYTES]);
    let mut i = 0;
    while i < total {
        let chunk: Vec<PutRecord> = (i..(i + 10_000).min(total))
            .map(|j| PutRecord {
                partition_key: "k".to_owned(),
                explicit_hash_key: Some(hash_key_of(j % shards, shards)),
                data: data.clone(),
            })
            .collect();
        i += chunk.len();
        streams.put_records(STREAM, &chunk).await.unwrap();
    }
}

/// Settings for the throughput runs: nothing but the pipeline.
fn throughput_settings() -> Settings {
    let mut s = Settings::default();
    s.worker.stream = STREAM.to_owned();
    s.worker.application = APP.to_owned();
    s.status.enabled = false;
    s.metrics.level = MetricsLevel::None;
    s.reader.max_records = 10_000;
    // FLOTILLA_BENCH_POLL_US overrides, for experiments (tokio timers are 1 ms grained).
    s.reader.poll_interval =
        Duration::from_micros(env_usize("FLOTILLA_BENCH_POLL_US", 1_000).max(1) as u64);
    s.reader.idle_max = Duration::from_millis(10);
    s
}

async fn start_worker(
    streams: &MemoryStreams,
    settings: Settings,
    count: &Arc<AtomicU64>,
    latency: Option<LatencySink>,
) -> Worker {
    let backend = Backend::memory(streams.clone(), MemoryDynamo::new(), MemoryMetrics::new());
    let count = count.clone();
    Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |_: &ShardInfo| Counter {
            count: count.clone(),
            latency: latency.clone(),
        })
        .start()
        .await
        .unwrap()
}

async fn wait_for(count: &AtomicU64, target: u64, limit: Duration) -> bool {
    let start = Instant::now();
    while count.load(Ordering::Relaxed) < target {
        if start.elapsed() > limit {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    true
}

/// One row of the final table.
struct Row {
    id: String,
    what: String,
    unit: &'static str,
    samples: Vec<f64>,
    target: Option<f64>,
    /// Whether more is better (throughput) or less (latency, memory).
    higher_is_better: bool,
}

impl Row {
    fn stats(&self) -> (f64, f64, f64) {
        median(&self.samples)
    }
}

fn fmt_num(x: f64, unit: &str) -> String {
    if x.is_nan() {
        return "-".to_owned();
    }
    match unit {
        "rec/s" => format!("{:.0}", x),
        "x" => format!("{x:.2}"),
        "MB" | "ms" => format!("{x:.1}"),
        _ => format!("{x:.3}"),
    }
}

fn print_table(rows: &[Row]) {
    println!();
    println!("| id | what | median | min | max | target | ratio to target | n |");
    println!("|---|---|---|---|---|---|---|---|");
    for row in rows {
        let (median, min, max) = row.stats();
        let (target, ratio) = match row.target {
            Some(t) => {
                let cmp = if row.higher_is_better { "≥" } else { "≤" };
                let ratio = median / t;
                let ok = if row.higher_is_better {
                    ratio >= 1.0
                } else {
                    ratio <= 1.0
                };
                (
                    format!("{cmp} {} {}", fmt_num(t, row.unit), row.unit),
                    format!("{ratio:.2} {}", if ok { "met" } else { "MISSED" }),
                )
            }
            None => ("-".to_owned(), "-".to_owned()),
        };
        println!(
            "| {} | {} | {} {u} | {} {u} | {} {u} | {target} | {ratio} | {} |",
            row.id,
            row.what,
            fmt_num(median, row.unit),
            fmt_num(min, row.unit),
            fmt_num(max, row.unit),
            row.samples.len(),
            u = row.unit,
        );
    }
}

// ---------------------------------------------------------------------------------------
// P1: throughput

/// Reads every record of every shard with GetShardIterator + GetRecords, no actors.
async fn raw_read(streams: &MemoryStreams, limit: u32) -> u64 {
    let shards = streams.list_shards(STREAM).await.unwrap();
    let mut total = 0u64;
    for shard in &shards {
        let mut it = streams
            .get_shard_iterator(STREAM, &shard.id, &IteratorPosition::TrimHorizon)
            .await
            .unwrap();
        loop {
            let batch = streams.get_records(&it, limit).await.unwrap();
            let n = batch.records.len();
            total += n as u64;
            // Touch what a processor would see.
            std::hint::black_box(batch.records.last().map(|r| r.data.len()));
            match batch.next_iterator {
                Some(next) if n > 0 || batch.millis_behind_latest.unwrap_or(0) > 0 => it = next,
                _ => break,
            }
        }
    }
    total
}

/// The same loop with one task per shard, on the same runtime as the worker (its
/// readers run in parallel too).
async fn raw_read_parallel(streams: &MemoryStreams, limit: u32) -> u64 {
    let shards = streams.list_shards(STREAM).await.unwrap();
    let tasks: Vec<_> = shards
        .into_iter()
        .map(|shard| {
            let streams = streams.clone();
            tokio::spawn(async move {
                let mut total = 0u64;
                let mut it = streams
                    .get_shard_iterator(STREAM, &shard.id, &IteratorPosition::TrimHorizon)
                    .await
                    .unwrap();
                loop {
                    let batch = streams.get_records(&it, limit).await.unwrap();
                    let n = batch.records.len();
                    total += n as u64;
                    std::hint::black_box(batch.records.last().map(|r| r.data.len()));
                    match batch.next_iterator {
                        Some(next) if n > 0 || batch.millis_behind_latest.unwrap_or(0) > 0 => {
                            it = next;
                        }
                        _ => break,
                    }
                }
                total
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    total
}

async fn p1(rows: &mut Vec<Row>) {
    let total = env_usize("FLOTILLA_BENCH_P1_RECORDS", 5_000_000);
    let counts: Vec<usize> = std::env::var("FLOTILLA_BENCH_P1_SHARDS")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 16, 64, 256]);
    for shards in counts {
        let streams = MemoryStreams::new(MemoryStreamsConfig::default());
        streams.create_stream(STREAM, shards as u32).await.unwrap();
        let t = Instant::now();
        preload(&streams, shards, total).await;
        eprintln!(
            "p1: {shards} shards, {total} records of {RECORD_BYTES} B loaded in {:.1?}",
            t.elapsed()
        );
        // One untimed pass, so the first timed loop does not pay for cold memory.
        assert_eq!(raw_read(&streams, 10_000).await, total as u64);
        let mut raw = Vec::new();
        let mut flot = Vec::new();
        let mut ratio = Vec::new();
        let mut par = Vec::new();
        let mut par_ratio = Vec::new();
        for run in 0..runs() {
            // Raw loop, then flotilla, side by side in each run.
            let t = Instant::now();
            // On a runtime worker thread, like everything else measured here.
            let s2 = streams.clone();
            let got = tokio::spawn(async move { raw_read(&s2, 10_000).await })
                .await
                .unwrap();
            let raw_secs = t.elapsed().as_secs_f64();
            assert_eq!(got, total as u64);
            let t = Instant::now();
            let got = raw_read_parallel(&streams, 10_000).await;
            let par_secs = t.elapsed().as_secs_f64();
            assert_eq!(got, total as u64);

            let count = Arc::new(AtomicU64::new(0));
            let t = Instant::now();
            let worker = start_worker(&streams, throughput_settings(), &count, None).await;
            let done = wait_for(&count, total as u64, Duration::from_secs(300)).await;
            let flot_secs = t.elapsed().as_secs_f64();
            assert!(
                done,
                "flotilla delivered {} of {total}",
                count.load(Ordering::Relaxed)
            );
            let _ = worker.shutdown().await;

            let r = total as f64 / raw_secs;
            let f = total as f64 / flot_secs;
            let p = total as f64 / par_secs;
            eprintln!(
                "p1: {shards:>3} shards run {run}: raw {r:>10.0} rec/s ({raw_secs:.3} s), raw-par {p:>10.0} rec/s ({par_secs:.3} s), flotilla {f:>10.0} rec/s ({flot_secs:.3} s), ratio {:.2} / {:.2}",
                f / r,
                f / p
            );
            par.push(p);
            par_ratio.push(f / p);
            raw.push(r);
            flot.push(f);
            ratio.push(f / r);
        }
        rows.push(Row {
            id: format!("P1-raw-{shards}"),
            what: format!("raw GetRecords loop, {shards} shards, {total} × {RECORD_BYTES} B"),
            unit: "rec/s",
            samples: raw,
            target: None,
            higher_is_better: true,
        });
        rows.push(Row {
            id: format!("P1-rawpar-{shards}"),
            what: format!("raw loop, one tokio task per shard, {shards} shards"),
            unit: "rec/s",
            samples: par,
            target: None,
            higher_is_better: true,
        });
        rows.push(Row {
            id: format!("P1-flotilla-{shards}"),
            what: format!("worker start → all delivered, no-op processor, {shards} shards"),
            unit: "rec/s",
            samples: flot,
            target: (shards == 64).then_some(1_000_000.0),
            higher_is_better: true,
        });
        rows.push(Row {
            id: format!("P1-ratio-{shards}"),
            what: format!("flotilla / raw (per run), {shards} shards"),
            unit: "x",
            samples: ratio,
            target: Some(0.8),
            higher_is_better: true,
        });
        rows.push(Row {
            id: format!("P1-ratiopar-{shards}"),
            what: format!("flotilla / raw-par (per run), {shards} shards"),
            unit: "x",
            samples: par_ratio,
            target: Some(0.8),
            higher_is_better: true,
        });
    }
}

// ---------------------------------------------------------------------------------------
// P7: memory, one child process per measurement

fn rss_kb(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn mb(kb: u64) -> f64 {
    kb as f64 / 1024.0
}

/// Default settings but for the status port (any free one) — P7 measures the defaults.
fn default_settings() -> Settings {
    let mut s = Settings::default();
    s.worker.stream = STREAM.to_owned();
    s.worker.application = APP.to_owned();
    s.status.bind = "127.0.0.1:0".to_owned();
    s
}

const P7_SHARDS: usize = 1_000;

/// Child: 1,000 shards, no records; RSS once every shard is being read and idle.
async fn child_idle() {
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams
        .create_stream(STREAM, P7_SHARDS as u32)
        .await
        .unwrap();
    let base = rss_kb("VmRSS:");
    let count = Arc::new(AtomicU64::new(0));
    let worker = start_worker(&streams, default_settings(), &count, None).await;
    let t = Instant::now();
    loop {
        let status = worker.status().await.unwrap();
        let caught_up = status
            .shards
            .iter()
            .filter(|s| s.state == flotilla_actors::ShardState::CaughtUp)
            .count();
        if caught_up >= P7_SHARDS {
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(120),
            "only {caught_up} shards caught up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let all_reading = t.elapsed();
    // Let every reader back off to idle_max and settle.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss = rss_kb("VmRSS:");
    println!(
        "RESULT base_kb={base} rss_kb={rss} hwm_kb={} all_reading_ms={}",
        rss_kb("VmHWM:"),
        all_reading.as_millis()
    );
    let _ = worker.shutdown().await;
}

/// Child: 1,000 shards with `per_shard` records each; peak RSS while draining them.
async fn child_drain(per_shard: usize) {
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams
        .create_stream(STREAM, P7_SHARDS as u32)
        .await
        .unwrap();
    preload(&streams, P7_SHARDS, P7_SHARDS * per_shard).await;
    let base = rss_kb("VmRSS:");
    let count = Arc::new(AtomicU64::new(0));
    let worker = start_worker(&streams, default_settings(), &count, None).await;
    let total = (P7_SHARDS * per_shard) as u64;
    let t = Instant::now();
    let mut peak = 0;
    while count.load(Ordering::Relaxed) < total {
        peak = peak.max(rss_kb("VmRSS:"));
        assert!(t.elapsed() < Duration::from_secs(300), "drain stalled");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    peak = peak.max(rss_kb("VmRSS:"));
    println!(
        "RESULT base_kb={base} rss_kb={peak} hwm_kb={} drain_ms={}",
        rss_kb("VmHWM:"),
        t.elapsed().as_millis()
    );
    let _ = worker.shutdown().await;
}

/// A processor that never finishes its first batch: every shard's reader fills its
/// share of the memory budget and waits (`processor_timeout` is raised past the run).
struct Stalled;

impl Processor for Stalled {
    async fn process(&mut self, _: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
        Ok(())
    }
}

/// Child: 1,000 shards with `per_shard` records each (more than a shard's share of the
/// default budget holds), read with the default budget by fast processors (peak RSS
/// while draining) or stalled ones (RSS once the budget stops growing).
async fn child_budget(per_shard: usize, stalled: bool) {
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams
        .create_stream(STREAM, P7_SHARDS as u32)
        .await
        .unwrap();
    preload(&streams, P7_SHARDS, P7_SHARDS * per_shard).await;
    let base = rss_kb("VmRSS:");
    let mut settings = default_settings();
    settings.reader.processor_timeout = Duration::from_secs(3600);
    let count = Arc::new(AtomicU64::new(0));
    let worker = if stalled {
        let backend = Backend::memory(streams.clone(), MemoryDynamo::new(), MemoryMetrics::new());
        Worker::builder()
            .settings(settings)
            .backend(backend)
            .processor(|_: &ShardInfo| Stalled)
            .start()
            .await
            .unwrap()
    } else {
        start_worker(&streams, settings, &count, None).await
    };
    let t = Instant::now();
    let mut peak = 0;
    let mut budget_peak = 0;
    if stalled {
        // Until the budget in use has not grown for 3 s.
        let (mut last, mut since) = (0, Instant::now());
        while since.elapsed() < Duration::from_secs(3) {
            assert!(
                t.elapsed() < Duration::from_secs(300),
                "budget never settled"
            );
            let status = worker.status().await.unwrap();
            peak = peak.max(rss_kb("VmRSS:"));
            budget_peak = status.budget.peak_bytes;
            if status.budget.in_use_bytes > last {
                (last, since) = (status.budget.in_use_bytes, Instant::now());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    } else {
        let total = (P7_SHARDS * per_shard) as u64;
        while count.load(Ordering::Relaxed) < total {
            peak = peak.max(rss_kb("VmRSS:"));
            assert!(t.elapsed() < Duration::from_secs(300), "drain stalled");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        budget_peak = worker.status().await.unwrap().budget.peak_bytes;
    }
    peak = peak.max(rss_kb("VmRSS:"));
    println!(
        "RESULT base_kb={base} rss_kb={peak} hwm_kb={} budget_peak_kb={} ms={}",
        rss_kb("VmHWM:"),
        budget_peak / 1024,
        t.elapsed().as_millis()
    );
    drop(worker);
}

fn run_child(kind: &str) -> Vec<(String, u64)> {
    let exe = std::env::current_exe().unwrap();
    let out = std::process::Command::new(exe)
        .args(["--child", kind])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "child {kind} failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let line = text
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .expect("child printed no RESULT");
    line.split_whitespace()
        .skip(1)
        .filter_map(|kv| {
            let (k, v) = kv.split_once('=')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

fn get(kv: &[(String, u64)], key: &str) -> u64 {
    kv.iter()
        .find(|(k, _)| k == key)
        .map(|(_, v)| *v)
        .unwrap_or(0)
}

fn p7(rows: &mut Vec<Row>) {
    let defaults = Settings::default().reader;
    let per_shard = env_usize("FLOTILLA_BENCH_P7_RECORDS", 1_000);
    // The budget with the defaults: each reader stops fetching once its un-acked window
    // reaches window_records or window_bytes (data + key), so it can hold one more batch
    // (max_records) on top. Per shard: min(window_bytes, (window_records + max_records)
    // × record size); for 1,000 shards, the sum.
    let rec = (RECORD_BYTES + 1) as f64; // data + the 1-byte key, as the window counts it
    let per_shard_budget = (defaults.window_bytes as f64)
        .min((defaults.window_records + defaults.max_records) as f64 * rec);
    let budget_mb = P7_SHARDS as f64 * per_shard_budget / 1_048_576.0;
    eprintln!(
        "p7: default budget per shard {:.1} MB (window_records {} + max_records {} of {} B, window_bytes {} MiB); × {P7_SHARDS} = {budget_mb:.0} MB",
        per_shard_budget / 1_048_576.0,
        defaults.window_records,
        defaults.max_records,
        RECORD_BYTES + 1,
        defaults.window_bytes / 1_048_576
    );
    let mut idle = Vec::new();
    let mut idle_delta = Vec::new();
    let mut drain = Vec::new();
    let mut drain_delta = Vec::new();
    for run in 0..runs() {
        let kv = run_child("p7-idle");
        eprintln!("p7 idle run {run}: {kv:?}");
        idle.push(mb(get(&kv, "rss_kb")));
        idle_delta.push(mb(get(&kv, "rss_kb").saturating_sub(get(&kv, "base_kb"))));
    }
    for run in 0..runs() {
        let kv = run_child("p7-drain");
        eprintln!("p7 drain run {run}: {kv:?}");
        drain.push(mb(get(&kv, "rss_kb")));
        drain_delta.push(mb(get(&kv, "rss_kb").saturating_sub(get(&kv, "base_kb"))));
    }
    let loaded_mb = (P7_SHARDS * per_shard * (RECORD_BYTES + 1)) as f64 / 1_048_576.0;
    rows.push(Row {
        id: "P7-idle".into(),
        what: format!("RSS, {P7_SHARDS} leases held idle, default settings"),
        unit: "MB",
        samples: idle,
        target: Some(150.0),
        higher_is_better: false,
    });
    rows.push(Row {
        id: "P7-idle-delta".into(),
        what: "  of which since the worker started".into(),
        unit: "MB",
        samples: idle_delta,
        target: None,
        higher_is_better: false,
    });
    rows.push(Row {
        id: "P7-drain".into(),
        what: format!(
            "peak RSS draining {P7_SHARDS} shards × {per_shard} records (stream store included)"
        ),
        unit: "MB",
        samples: drain,
        target: Some(150.0 + budget_mb),
        higher_is_better: false,
    });
    rows.push(Row {
        id: "P7-drain-delta".into(),
        what: format!(
            "  peak − RSS after preload (worker's share; {loaded_mb:.0} MB of payload+keys in flight at most)"
        ),
        unit: "MB",
        samples: drain_delta,
        target: Some(150.0 + loaded_mb.min(budget_mb)),
        higher_is_better: false,
    });
}

/// P7 under the worker's memory budget: RSS at 1,000 leases with fast and with stalled
/// processors, against 150 MB + `reader.worker_budget_bytes` (run alone: `-- p7-budget`).
fn p7_budget(rows: &mut Vec<Row>) {
    let defaults = Settings::default().reader;
    // Under the worker's budget (reader.worker_budget_bytes, default 256 MiB): shards
    // with more records than their share holds, fast and stalled processors.
    let budget_mb = defaults.worker_budget_bytes as f64 / 1_048_576.0;
    let budget_per_shard = env_usize("FLOTILLA_BENCH_P7_BUDGET_RECORDS", 1_500);
    // Per kind: RSS, RSS growth, the budget's peak in use (MB, one per run).
    type Samples = (Vec<f64>, Vec<f64>, Vec<f64>);
    let mut budget_runs: Vec<(&str, Samples)> = Vec::new();
    for kind in ["p7-budget-fast", "p7-budget-stalled"] {
        let (mut total, mut delta, mut used) = (Vec::new(), Vec::new(), Vec::new());
        for run in 0..runs() {
            let kv = run_child(kind);
            eprintln!("{kind} run {run}: {kv:?}");
            total.push(mb(get(&kv, "rss_kb")));
            delta.push(mb(get(&kv, "rss_kb").saturating_sub(get(&kv, "base_kb"))));
            used.push(mb(get(&kv, "budget_peak_kb")));
        }
        budget_runs.push((kind, (total, delta, used)));
    }
    for (kind, (total, delta, used)) in budget_runs {
        let what = if kind.ends_with("fast") {
            "fast processors, peak while draining"
        } else {
            "stalled processors, once the budget is full"
        };
        rows.push(Row {
            id: format!("{kind}-delta"),
            what: format!("RSS growth, {P7_SHARDS} shards × {budget_per_shard} records, {what}"),
            unit: "MB",
            samples: delta,
            target: Some(150.0 + budget_mb),
            higher_is_better: false,
        });
        rows.push(Row {
            id: format!("{kind}-total"),
            what: "  RSS, the stream store included".into(),
            unit: "MB",
            samples: total,
            target: None,
            higher_is_better: false,
        });
        rows.push(Row {
            id: format!("{kind}-used"),
            what: "  budget's peak in use (status)".into(),
            unit: "MB",
            samples: used,
            // The budget, and what a read may bring over it: here (records all alike,
            // the estimate exact after a shard's first read) one record per shard.
            target: Some(budget_mb + P7_SHARDS as f64 * 400.0 / 1_048_576.0),
            higher_is_better: false,
        });
    }
}

// ---------------------------------------------------------------------------------------
// P8: latency

fn latency_settings(tuned: bool) -> Settings {
    let mut s = default_settings();
    s.status.enabled = false;
    if tuned {
        s.reader.poll_interval = Duration::from_millis(10);
        s.reader.idle_max = Duration::from_millis(20);
    }
    s
}

/// One run: put 1 record per ms (round robin over 4 shards) for `secs`, stamped with the
/// nanos since `base`; returns (p50, p99) in ms.
async fn p8_run(tuned: bool, secs: u64) -> (f64, f64) {
    const SHARDS: usize = 4;
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams.create_stream(STREAM, SHARDS as u32).await.unwrap();
    let base = Instant::now();
    let sink = Arc::new(Mutex::new(Vec::new()));
    let count = Arc::new(AtomicU64::new(0));
    let worker = start_worker(
        &streams,
        latency_settings(tuned),
        &count,
        Some((base, sink.clone())),
    )
    .await;
    // Let the worker take its leases and start reading.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let total = secs * 1_000;
    let produce_from = base.elapsed().as_nanos() as u64;
    let mut tick = tokio::time::interval(Duration::from_millis(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    for i in 0..total as usize {
        tick.tick().await;
        let mut data = vec![b'x'; RECORD_BYTES];
        data[..8].copy_from_slice(&(base.elapsed().as_nanos() as u64).to_le_bytes());
        streams
            .put_records(
                STREAM,
                &[PutRecord {
                    partition_key: "k".to_owned(),
                    explicit_hash_key: Some(hash_key_of(i % SHARDS, SHARDS)),
                    data: Bytes::from(data),
                }],
            )
            .await
            .unwrap();
    }
    let done = wait_for(&count, total, Duration::from_secs(30)).await;
    assert!(
        done,
        "delivered {} of {total}",
        count.load(Ordering::Relaxed)
    );
    let _ = worker.shutdown().await;
    let pairs = std::mem::take(&mut *sink.lock().unwrap());
    // Nanoseconds to milliseconds, sorted; percentiles by the benches' one rule.
    let pct = |lat: Vec<u64>, p: f64| {
        percentile(&sorted(lat.iter().map(|n| *n as f64 / 1e6).collect()), p)
    };
    // For the notes: the same without the first second of production (the readers
    // start from an idle backoff).
    let steady: Vec<u64> = pairs
        .iter()
        .filter(|(stamp, _)| *stamp >= produce_from + 1_000_000_000)
        .map(|(_, l)| *l)
        .collect();
    eprintln!(
        "p8 run: after the first second: p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        pct(steady.clone(), 0.5),
        pct(steady.clone(), 0.99),
        pct(steady, 1.0)
    );
    let lat: Vec<u64> = pairs.iter().map(|(_, l)| *l).collect();
    (pct(lat.clone(), 0.50), pct(lat, 0.99))
}

async fn p8(rows: &mut Vec<Row>) {
    let secs = env_usize("FLOTILLA_BENCH_P8_SECS", 10) as u64;
    for tuned in [false, true] {
        let label = if tuned {
            "tuned: poll_interval 10ms, idle_max 20ms"
        } else {
            "defaults: poll_interval 200ms, idle_max 1s"
        };
        let (mut p50s, mut p99s) = (Vec::new(), Vec::new());
        for run in 0..runs() {
            let (p50, p99) = p8_run(tuned, secs).await;
            eprintln!("p8 {label} run {run}: p50 {p50:.1} ms, p99 {p99:.1} ms");
            p50s.push(p50);
            p99s.push(p99);
        }
        let tag = if tuned { "tuned" } else { "default" };
        rows.push(Row {
            id: format!("P8-p50-{tag}"),
            what: format!("put → process p50, 1,000 rec/s on 4 shards, {secs} s; {label}"),
            unit: "ms",
            samples: p50s,
            target: Some(250.0),
            higher_is_better: false,
        });
        rows.push(Row {
            id: format!("P8-p99-{tag}"),
            what: format!("put → process p99, same runs; {label}"),
            unit: "ms",
            samples: p99s,
            target: Some(1_000.0),
            higher_is_better: false,
        });
    }
}

// ---------------------------------------------------------------------------------------
// P10: the MultiLang pipe

async fn p10(rows: &mut Vec<Row>) {
    let aws_kcl = std::env::var("FLOTILLA_BENCH_AWS_KCL")
        .expect("P10 needs FLOTILLA_BENCH_AWS_KCL: the unpacked npm aws-kcl package (scripts/test.sh leaves one in .test-servers/)");
    let shards = 4;
    let total = env_usize("FLOTILLA_BENCH_P10_RECORDS", 400_000);
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams.create_stream(STREAM, shards as u32).await.unwrap();
    preload(&streams, shards, total).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/multilang_noop.js");
    let command = Arc::new(ChildCommand {
        argv: vec!["node".into(), script.display().to_string(), aws_kcl],
        watchdog: None,
    });
    let mut builtin = Vec::new();
    let mut piped = Vec::new();
    let mut ratio = Vec::new();
    for run in 0..runs() {
        let count = Arc::new(AtomicU64::new(0));
        let t = Instant::now();
        let worker = start_worker(&streams, throughput_settings(), &count, None).await;
        assert!(wait_for(&count, total as u64, Duration::from_secs(300)).await);
        let b = total as f64 / t.elapsed().as_secs_f64();
        let _ = worker.shutdown().await;

        let count = Arc::new(AtomicU64::new(0));
        let backend = Backend::memory(streams.clone(), MemoryDynamo::new(), MemoryMetrics::new());
        let mut settings = throughput_settings();
        settings.checkpoint.mode = flotilla_actors::CheckpointMode::Manual;
        let (c, command) = (count.clone(), command.clone());
        let t = Instant::now();
        let worker = Worker::builder()
            .settings(settings)
            .backend(backend)
            .processor(move |_: &ShardInfo| Counted {
                inner: MultiLangProcessor::new(command.clone()),
                count: c.clone(),
            })
            .start()
            .await
            .unwrap();
        assert!(
            wait_for(&count, total as u64, Duration::from_secs(300)).await,
            "the MultiLang children processed {} of {total}",
            count.load(Ordering::Relaxed)
        );
        let m = total as f64 / t.elapsed().as_secs_f64();
        let _ = worker.shutdown().await;
        eprintln!(
            "p10: run {run}: built-in {b:>10.0} rec/s, MultiLang child {m:>10.0} rec/s, ratio {:.2}",
            m / b
        );
        builtin.push(b);
        piped.push(m);
        ratio.push(m / b);
    }
    rows.push(Row {
        id: "P10-builtin".into(),
        what: format!("no-op built-in processor, {shards} shards, {total} × {RECORD_BYTES} B"),
        unit: "rec/s",
        samples: builtin,
        target: None,
        higher_is_better: true,
    });
    rows.push(Row {
        id: "P10-multilang".into(),
        what: format!("no-op MultiLang child (node, aws-kcl), {shards} shards"),
        unit: "rec/s",
        samples: piped,
        target: None,
        higher_is_better: true,
    });
    rows.push(Row {
        id: "P10-ratio".into(),
        what: "MultiLang child / built-in (per run)".into(),
        unit: "x",
        samples: ratio,
        target: None,
        higher_is_better: true,
    });
}

// ---------------------------------------------------------------------------------------

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // `FLOTILLA_BENCH_LOG=info`: a subscriber as a service would have (formatting every
    // enabled line, into nothing), so spans and log lines cost what they cost there.
    if let Ok(filter) = std::env::var("FLOTILLA_BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_writer(std::io::sink)
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .init();
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    if let Some(pos) = args.iter().position(|a| a == "--child") {
        match args.get(pos + 1).map(String::as_str) {
            Some("p7-idle") => runtime.block_on(child_idle()),
            Some("p7-drain") => {
                runtime.block_on(child_drain(env_usize("FLOTILLA_BENCH_P7_RECORDS", 1_000)))
            }
            Some(kind @ ("p7-budget-fast" | "p7-budget-stalled")) => {
                runtime.block_on(child_budget(
                    env_usize("FLOTILLA_BENCH_P7_BUDGET_RECORDS", 1_500),
                    kind.ends_with("stalled"),
                ))
            }
            other => panic!("unknown child {other:?}"),
        }
        return;
    }
    // cargo bench passes `--bench`; anything else not starting with `-` is a filter.
    let filters: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.to_lowercase())
        .collect();
    let wanted = |id: &str| filters.is_empty() || filters.iter().any(|f| f == id);
    let mut rows = Vec::new();
    if wanted("p1") {
        runtime.block_on(p1(&mut rows));
    }
    if wanted("p7") {
        p7(&mut rows);
    }
    if wanted("p7") || filters.iter().any(|f| f == "p7-budget") {
        p7_budget(&mut rows);
    }
    if wanted("p8") {
        runtime.block_on(p8(&mut rows));
    }
    if filters.iter().any(|f| f == "p10") {
        runtime.block_on(p10(&mut rows));
    }
    eprintln!("runs per measurement: {}", runs());
    print_table(&rows);
}
