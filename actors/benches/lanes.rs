#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench binary: any failure should abort the run loudly
//! P15, slow processors and lanes within a shard (issue 33, `processor.parallelism`):
//! what a shard delivers when its processor waits on something else for every record,
//! at 1, 4, 16 and 64 lanes.
//!
//! One shard on the memory backend; a producer task puts 1,000 records/s into it for
//! the run (100 records every 100 ms, keys `key-0`..`key-99` round robin, so each tick
//! holds every key once; data `key-K:SEQ`, SEQ the record's number in the run). The
//! worker's processor waits 10 ms per record, one record after another: an async wait
//! (`tokio::time::sleep_until`), not CPU, as a call to another service would be. Record
//! `i` of a batch is done at the batch's start + (i + 1) × 10 ms, a deadline rather than
//! a fresh `sleep(10ms)` per record, so tokio's 1 ms timer grain is paid once per batch
//! and not per record (the bench measures and prints what a fresh sleep costs;
//! `FLOTILLA_BENCH_FRESH_SLEEP=1` makes the built-in processor sleep afresh instead). One
//! batch at a time, a shard so served manages about 100 records/s; 16 lanes should keep
//! up with the 1,000.
//!
//! Two processors, each at every parallelism:
//!
//! * `proc/pN`: the built-in [`Processor`] above, counting each record as its wait ends;
//! * `ml/pN`: a MultiLang child per lane (node and the npm aws-kcl client,
//!   `benches/multilang_slow.js`), which waits the same way with `setTimeout` and
//!   checkpoints the last record of each batch (`checkpoint.mode = "manual"`); its
//!   records are counted when the child has answered for the batch. The package comes
//!   from `$FLOTILLA_BENCH_AWS_KCL` (as P10's), else `$FLOTILLA_TEST_AWS_KCL`, else
//!   `.test-servers/aws-kcl-2.3.2` (what scripts/test.sh unpacks); without node or the
//!   package these cases are skipped, saying so.
//!
//! Settings are the defaults (`reader.poll_interval` 200 ms, `reader.max_records`
//! 10,000, `reader.window_records` 50,000, checkpoint every 5 s) but for
//! `processor.parallelism`, the MultiLang cases' manual checkpoints, and no status
//! server or metrics. Each case runs `FLOTILLA_BENCH_SECS` seconds (default 60) from
//! the producer's first put, which follows the worker's start at once (the worker's
//! and its children's start are inside the run). Per case: records put; records
//! processed and records/s over the run and over its second half; the lag at the end
//! (records put and not yet processed, and the age of the oldest of them, from its
//! put), at the half, and the most seen in the second half (sampled every second);
//! when the first record was processed; and whether every key's records came in order:
//! a record of a key at or below one already processed (out of order, or again) and a
//! record past the next one expected (one skipped) are counted, and both must be 0.
//! After the measurement the processors stop waiting (the MultiLang children are not
//! called again), so the shutdown does not wait out the backlog.
//!
//! `FLOTILLA_BENCH_RUNS` rounds (default 1: each case takes a minute), every case once
//! per round; the table at the end gives median (min–max) over the rounds.
//! `FLOTILLA_BENCH_LANES` (default `1,4,16,64`) and `FLOTILLA_BENCH_ML_LANES` (the
//! MultiLang cases', default the same) choose the parallelisms.
//!
//!     cargo bench -p flotilla-actors --bench lanes [-- FILTER...]
//!
//! A filter keeps the cases whose id is it or whose id's part before or after the `/`
//! is it: `-- p16` runs `proc/p16` and `ml/p16`, `-- ml` every MultiLang case,
//! `-- proc/p1` that one.

#[path = "common/stats.rs"]
#[allow(dead_code)]
mod stats;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::time::Instant;

use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{PutRecord, StreamAdmin};
use flotilla_actors::multilang::{ChildCommand, MultiLangProcessor};
use flotilla_actors::{
    Backend, Batch, CheckpointMode, Checkpointer, MetricsLevel, Processor, ProcessorError, Record,
    Settings, ShardInfo, Worker,
};
use stats::{env_usize, load, spread};

const STREAM: &str = "lanes";
const APP: &str = "lanes-app";
/// Keys, round robin: every tick puts each once.
const KEYS: usize = 100;
/// A tick of the producer, and the records it puts.
const TICK: Duration = Duration::from_millis(100);
const PER_TICK: usize = 100;
/// Records per second put.
const RATE: f64 = PER_TICK as f64 / 0.1;
/// The processor's wait per record.
const WAIT: Duration = Duration::from_millis(10);

fn runs() -> usize {
    stats::runs(1)
}

fn lanes(var: &str) -> Vec<u16> {
    std::env::var(var)
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|x| x.trim().parse().ok())
                .filter(|&x| (1..=100).contains(&x))
                .collect()
        })
        .unwrap_or_else(|| vec![1, 4, 16, 64])
}

// ---------------------------------------------------------------------------------------
// What a run counts

/// What the processors of one run have done, shared by every lane.
struct Tally {
    processed: u64,
    /// Per key, the next record expected: its number among the key's records, which is
    /// also the producer's tick that put it.
    next: Vec<u64>,
    /// Records of a key at or below one already processed: out of order, or again.
    out_of_order: u64,
    /// Records past the next one of their key: one was skipped.
    skipped: u64,
    first: Option<Instant>,
}

impl Tally {
    fn new() -> Self {
        Tally {
            processed: 0,
            next: vec![0; KEYS],
            out_of_order: 0,
            skipped: 0,
            first: None,
        }
    }

    /// Record `record` processed.
    fn done(&mut self, record: &Record) {
        let (key, seq) = parse(record);
        let index = seq / KEYS as u64;
        let next = &mut self.next[key];
        if index < *next {
            self.out_of_order += 1;
        } else if index > *next {
            self.skipped += 1;
        }
        *next = (*next).max(index + 1);
        self.processed += 1;
        self.first.get_or_insert_with(Instant::now);
    }

    /// The tick that put the oldest record not processed yet (it may not be put yet).
    fn oldest(&self) -> u64 {
        self.next.iter().copied().min().unwrap_or(0)
    }
}

/// `(key, seq)` of a record put by [`produce`].
fn parse(record: &Record) -> (usize, u64) {
    let text = std::str::from_utf8(&record.data).unwrap();
    let (key, seq) = text.split_once(':').unwrap();
    assert_eq!(key, record.partition_key);
    let key: usize = key.strip_prefix("key-").unwrap().parse().unwrap();
    let seq: u64 = seq.parse().unwrap();
    assert_eq!(seq % KEYS as u64, key as u64);
    (key, seq)
}

/// A run's shared state: the tally, and the measurement's end, after which the
/// processors stop waiting (so that the shutdown does not wait out the backlog).
#[derive(Clone)]
struct Shared {
    tally: Arc<Mutex<Tally>>,
    over: Arc<AtomicBool>,
    /// `FLOTILLA_BENCH_FRESH_SLEEP=1`: the built-in processor sleeps [`WAIT`] afresh per
    /// record, the timer's grain on top of each.
    fresh: bool,
}

impl Shared {
    fn over(&self) -> bool {
        self.over.load(Ordering::Relaxed)
    }
}

/// The built-in processor: waits [`WAIT`] per record, one after another.
struct Slow(Shared);

impl Processor for Slow {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let start = Instant::now();
        for (i, record) in batch.records().iter().enumerate() {
            if self.0.over() {
                return Ok(());
            }
            if self.0.fresh {
                tokio::time::sleep(WAIT).await;
            } else {
                tokio::time::sleep_until(start + WAIT * (i as u32 + 1)).await;
            }
            self.0.tally.lock().unwrap().done(record);
        }
        Ok(())
    }
}

/// A MultiLang child, its batches counted when it has answered for them.
struct Child {
    inner: MultiLangProcessor,
    shared: Shared,
}

impl Processor for Child {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        self.inner.initialize(shard).await
    }

    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        if self.shared.over() {
            return Ok(());
        }
        self.inner.process(batch, cp).await?;
        let mut tally = self.shared.tally.lock().unwrap();
        for record in batch.records() {
            tally.done(record);
        }
        Ok(())
    }

    async fn lease_lost(&mut self) {
        self.inner.lease_lost().await
    }

    async fn shard_ended(&mut self, cp: &Checkpointer) -> Result<(), ProcessorError> {
        self.inner.shard_ended(cp).await
    }

    async fn shutdown_requested(&mut self, cp: &Checkpointer) -> Result<(), ProcessorError> {
        self.inner.shutdown_requested(cp).await
    }
}

// ---------------------------------------------------------------------------------------
// The cases

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Builtin,
    MultiLang,
}

#[derive(Debug, Clone)]
struct Case {
    id: String,
    kind: Kind,
    lanes: u16,
}

fn cases(multilang: bool) -> Vec<Case> {
    let mut cases: Vec<Case> = lanes("FLOTILLA_BENCH_LANES")
        .into_iter()
        .map(|lanes| Case {
            id: format!("proc/p{lanes}"),
            kind: Kind::Builtin,
            lanes,
        })
        .collect();
    if multilang {
        cases.extend(
            lanes("FLOTILLA_BENCH_ML_LANES")
                .into_iter()
                .map(|lanes| Case {
                    id: format!("ml/p{lanes}"),
                    kind: Kind::MultiLang,
                    lanes,
                }),
        );
    }
    cases
}

fn wanted(case: &Case, filters: &[String]) -> bool {
    filters.is_empty()
        || filters
            .iter()
            .any(|f| case.id == *f || case.id.split('/').any(|part| part == f.as_str()))
}

fn settings(case: &Case) -> Settings {
    let mut s = Settings::default();
    s.worker.stream = STREAM.to_owned();
    s.worker.application = APP.to_owned();
    s.worker.worker_id = Some("w".into());
    s.status.enabled = false;
    s.metrics.level = MetricsLevel::None;
    s.processor.parallelism = case.lanes;
    if case.kind == Kind::MultiLang {
        s.checkpoint.mode = CheckpointMode::Manual;
    }
    s
}

/// The aws-kcl package for the MultiLang cases, if node and it are there.
fn aws_kcl() -> Result<String, String> {
    let node = std::process::Command::new("node")
        .arg("--version")
        .output()
        .map_err(|e| format!("no node: {e}"))?;
    if !node.status.success() {
        return Err("`node --version` failed".into());
    }
    let default = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.test-servers/aws-kcl-2.3.2");
    let path = std::env::var("FLOTILLA_BENCH_AWS_KCL")
        .or_else(|_| std::env::var("FLOTILLA_TEST_AWS_KCL"))
        .map(PathBuf::from)
        .unwrap_or(default);
    if !path.join("package.json").exists() {
        return Err(format!(
            "no aws-kcl package at {} (set FLOTILLA_BENCH_AWS_KCL)",
            path.display()
        ));
    }
    Ok(path.display().to_string())
}

/// Puts [`PER_TICK`] records every [`TICK`], `ticks` times, noting when each tick's
/// records were put.
async fn produce(streams: MemoryStreams, ticks: u64, puts: Arc<Mutex<Vec<Instant>>>) {
    let mut interval = tokio::time::interval(TICK);
    for tick in 0..ticks {
        interval.tick().await;
        let records: Vec<PutRecord> = (0..PER_TICK)
            .map(|k| {
                let seq = tick * PER_TICK as u64 + k as u64;
                PutRecord {
                    partition_key: format!("key-{k}"),
                    explicit_hash_key: None,
                    data: Bytes::from(format!("key-{k}:{seq}")),
                }
            })
            .collect();
        streams.put_records(STREAM, &records).await.unwrap();
        puts.lock().unwrap().push(Instant::now());
    }
}

/// What was put and processed at one moment.
#[derive(Debug, Clone, Copy)]
struct Sample {
    put: u64,
    processed: u64,
    /// The age of the oldest record put and not processed; zero when there is none.
    oldest: Duration,
}

impl Sample {
    fn lag(&self) -> u64 {
        self.put.saturating_sub(self.processed)
    }
}

fn sample(shared: &Shared, puts: &Mutex<Vec<Instant>>) -> Sample {
    let now = Instant::now();
    let (processed, oldest) = {
        let t = shared.tally.lock().unwrap();
        (t.processed, t.oldest())
    };
    let puts = puts.lock().unwrap();
    Sample {
        put: puts.len() as u64 * PER_TICK as u64,
        processed,
        oldest: puts
            .get(oldest as usize)
            .map_or(Duration::ZERO, |&at| now - at),
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
struct Measured {
    secs: f64,
    /// When `half` was taken, in seconds from the start.
    half_at: f64,
    end: Sample,
    half: Sample,
    /// The most records behind, and the oldest record's greatest age, sampled every
    /// second in the second half.
    most_lag: u64,
    most_oldest: Duration,
    first: Option<Duration>,
    out_of_order: u64,
    skipped: u64,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.end.processed as f64 / self.secs
    }

    fn second_half_rate(&self) -> f64 {
        (self.end.processed - self.half.processed) as f64 / (self.secs - self.half_at)
    }
}

async fn run(case: &Case, secs: u64, aws_kcl: Option<&str>) -> Measured {
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams.create_stream(STREAM, 1).await.unwrap();
    let backend = Backend::memory(streams.clone(), MemoryDynamo::new(), MemoryMetrics::new());
    let shared = Shared {
        tally: Arc::new(Mutex::new(Tally::new())),
        over: Arc::new(AtomicBool::new(false)),
        fresh: env_usize("FLOTILLA_BENCH_FRESH_SLEEP", 0) == 1,
    };
    let builder = Worker::builder().settings(settings(case)).backend(backend);
    let s = shared.clone();
    let worker = match case.kind {
        Kind::Builtin => builder.processor(move |_: &ShardInfo| Slow(s.clone())),
        Kind::MultiLang => {
            let script =
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("benches/multilang_slow.js");
            let command = Arc::new(ChildCommand {
                argv: vec![
                    "node".into(),
                    script.display().to_string(),
                    aws_kcl.unwrap().to_owned(),
                    WAIT.as_millis().to_string(),
                ],
                watchdog: None,
            });
            builder.processor(move |_: &ShardInfo| Child {
                inner: MultiLangProcessor::new(command.clone()),
                shared: s.clone(),
            })
        }
    }
    .start()
    .await
    .unwrap();
    let puts = Arc::new(Mutex::new(Vec::new()));
    let start = Instant::now();
    let producer = tokio::spawn(produce(streams, secs * 10, puts.clone()));
    let half_at = secs / 2;
    let mut half = None;
    let (mut most_lag, mut most_oldest) = (0, Duration::ZERO);
    for second in 1..=secs {
        tokio::time::sleep_until(start + Duration::from_secs(second)).await;
        let now = sample(&shared, &puts);
        if second == half_at {
            half = Some(now);
        }
        if second >= half_at {
            most_lag = most_lag.max(now.lag());
            most_oldest = most_oldest.max(now.oldest);
        }
    }
    let end = sample(&shared, &puts);
    let measured_secs = start.elapsed().as_secs_f64();
    shared.over.store(true, Ordering::Relaxed);
    producer.await.unwrap();
    let _ = worker.shutdown().await;
    let t = shared.tally.lock().unwrap();
    Measured {
        secs: measured_secs,
        half_at: half_at as f64,
        end,
        half: half.unwrap_or(end),
        most_lag,
        most_oldest,
        first: t.first.map(|f| f.saturating_duration_since(start)),
        out_of_order: t.out_of_order,
        skipped: t.skipped,
    }
}

// ---------------------------------------------------------------------------------------
// The report

/// What 100 fresh `sleep(WAIT)` in a row take, each (the timer's grain on top).
async fn fresh_sleep() -> Duration {
    let n = 100;
    let t = Instant::now();
    for _ in 0..n {
        tokio::time::sleep(WAIT).await;
    }
    t.elapsed() / n
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.to_lowercase())
        .collect();
    let aws_kcl = aws_kcl();
    let cases: Vec<Case> = cases(true)
        .into_iter()
        .filter(|c| wanted(c, &filters))
        .collect();
    let cases: Vec<Case> = match &aws_kcl {
        Ok(_) => cases,
        Err(why) => {
            if cases.iter().any(|c| c.kind == Kind::MultiLang) {
                eprintln!("the MultiLang cases are skipped: {why}");
            }
            cases
                .into_iter()
                .filter(|c| c.kind == Kind::Builtin)
                .collect()
        }
    };
    let secs = env_usize("FLOTILLA_BENCH_SECS", 60).max(2) as u64;
    let runs = runs();
    eprintln!(
        "one shard, {RATE:.0} records/s over {KEYS} keys for {secs} s; {} ms per record ({}); \
         {} cases × {runs} rounds",
        WAIT.as_millis(),
        if env_usize("FLOTILLA_BENCH_FRESH_SLEEP", 0) == 1 {
            "the built-in processor sleeps afresh per record"
        } else {
            "to a deadline 10 ms further per record"
        },
        cases.len()
    );
    println!("load average at the start: {}", load());
    let aws_kcl = aws_kcl.ok();
    let mut results: Vec<Vec<Measured>> = vec![Vec::new(); cases.len()];
    runtime.block_on(async {
        println!(
            "a fresh sleep({} ms), 100 in a row: {:.2} ms each",
            WAIT.as_millis(),
            fresh_sleep().await.as_secs_f64() * 1e3
        );
        for round in 0..runs {
            for (case, got) in cases.iter().zip(results.iter_mut()) {
                let m = run(case, secs, aws_kcl.as_deref()).await;
                println!(
                    "round {round} {}: {:.1} s, put {}, processed {}, {:.0} rec/s \
                     (second half {:.0}); lag at the end {} records, oldest {:.2} s; \
                     at the half {} records, oldest {:.2} s; second half's most {} records, \
                     oldest {:.2} s; first record processed at {}; out of order {}, \
                     skipped {}; load {}",
                    case.id,
                    m.secs,
                    m.end.put,
                    m.end.processed,
                    m.rate(),
                    m.second_half_rate(),
                    m.end.lag(),
                    m.end.oldest.as_secs_f64(),
                    m.half.lag(),
                    m.half.oldest.as_secs_f64(),
                    m.most_lag,
                    m.most_oldest.as_secs_f64(),
                    m.first
                        .map_or_else(|| "never".into(), |f| format!("{:.3} s", f.as_secs_f64())),
                    m.out_of_order,
                    m.skipped,
                    load(),
                );
                got.push(m);
            }
        }
    });
    println!("load average at the end: {}", load());
    println!();
    println!(
        "| id | lanes | rec/s over the run | rec/s, second half | ÷ {RATE:.0} | lag at the end, \
         records | oldest at the end, s | lag at the half, records | most lag in the second \
         half, records | most oldest in the second half, s | first record, s | out of order | \
         skipped |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (case, got) in cases.iter().zip(&results) {
        let f = |m: fn(&Measured) -> f64| got.iter().map(m).collect::<Vec<f64>>();
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            case.id,
            case.lanes,
            spread(&f(Measured::rate), 0),
            spread(&f(Measured::second_half_rate), 0),
            spread(&f(|m| m.rate() / RATE), 2),
            spread(&f(|m| m.end.lag() as f64), 0),
            spread(&f(|m| m.end.oldest.as_secs_f64()), 2),
            spread(&f(|m| m.half.lag() as f64), 0),
            spread(&f(|m| m.most_lag as f64), 0),
            spread(&f(|m| m.most_oldest.as_secs_f64()), 2),
            spread(&f(|m| m.first.map_or(f64::NAN, |d| d.as_secs_f64())), 3),
            spread(&f(|m| m.out_of_order as f64), 0),
            spread(&f(|m| m.skipped as f64), 0),
        );
    }
    eprintln!("rounds: {runs}");
}
