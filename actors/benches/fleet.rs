//! Fleet benchmarks (issue "Benchmarks"): P3 crash failover, P4 planned handoff, P5
//! rebalance, P6 lease-table cost, P9 cold start, P13 skewed shards (P13r on real workers), P14 scale
//! (`FLEET_P14=leases,workers`, default 10,000 x 100; P14i its idle CPU in real time). Workers run on the memory backend;
//! P3, P4 and P9 in real time, P5 and P6 in paused tokio time.
//!
//! `cargo bench -p flotilla-actors --bench fleet` runs all; `-- p6` runs one (a prefix:
//! `-- p3` runs P3 at 4 s / 1 s, P3d at the defaults, P3k at the KCL's 10 s / 2 s, and P3e). `FLEET_RUNS=n` overrides the run counts;
//! `FLOTILLA_BENCH_READ_MODE=fanout` reads by enhanced fan-out instead of polling;
//! `FLOTILLA_BENCH_BALANCE=count|throughput` sets `lease.balance` for every worker.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a broken setup should stop it loudly

#[path = "common/stats.rs"]
#[allow(dead_code)]
mod stats;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::faults::{FaultPlan, Faulty};
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{LeaseTable, PutRecord, StreamAdmin, StreamClient};
use flotilla_actors::balance::{Policy, Spread};
use flotilla_actors::fleet_sim::Sim;
use flotilla_actors::model::{Lease, LeaseKey, WorkerId};
use flotilla_actors::{
    Backend, Batch, Checkpointer, Processor, ProcessorError, Settings, ShardInfo, Worker,
};
use tokio::time::Instant;

use stats::{median, percentile, sorted};

const STREAM: &str = "bench";
const APP: &str = "bench-app";

// ---------------------------------------------------------------- shared pieces

/// What every processor of a run delivered.
#[derive(Default)]
struct LogInner {
    /// Per shard, each non-empty batch: when, and by which worker.
    batches: HashMap<String, Vec<(Instant, String)>>,
    /// (shard, sequence number) of every record delivered.
    seen: HashSet<(String, String)>,
    duplicates: u64,
    delivered: u64,
    /// Per worker, the bytes of every record its processors received.
    bytes: HashMap<String, u64>,
}

#[derive(Clone, Default)]
struct Log(Arc<Mutex<LogInner>>);

impl Log {
    fn with<R>(&self, f: impl FnOnce(&LogInner) -> R) -> R {
        f(&self.0.lock().unwrap())
    }
}

struct Probe {
    log: Log,
    worker: String,
    shard: String,
    /// Remember sequence numbers (duplicate count); off for the big P6 fleet.
    track: bool,
}

impl Processor for Probe {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let records = batch.records();
        if records.is_empty() {
            return Ok(());
        }
        let now = Instant::now();
        let mut log = self.log.0.lock().unwrap();
        log.delivered += records.len() as u64;
        *log.bytes.entry(self.worker.clone()).or_default() +=
            records.iter().map(|r| r.data.len() as u64).sum::<u64>();
        log.batches
            .entry(self.shard.clone())
            .or_default()
            .push((now, self.worker.clone()));
        if self.track {
            for r in records {
                if !log
                    .seen
                    .insert((self.shard.clone(), r.sequence_number.to_string()))
                {
                    log.duplicates += 1;
                }
            }
        }
        Ok(())
    }
}

/// Lease timings: `short` = failover 4 s, heartbeat 1 s, fence margin 1 s; otherwise
/// the defaults (4 s, 1 s, 1 s since issue 34, which made the short timings the
/// defaults; P3k keeps the old 10 s / 2 s / 3 s beside them). Everything else is the default; the status server off.
fn settings(id: &str, short: bool) -> Settings {
    let mut s = Settings::default();
    s.worker.stream = STREAM.to_owned();
    s.worker.application = APP.to_owned();
    s.worker.worker_id = Some(id.to_owned());
    s.status.enabled = false;
    // `FLOTILLA_BENCH_READ_MODE=fanout`: the same cases with every worker subscribing.
    if std::env::var("FLOTILLA_BENCH_READ_MODE").as_deref() == Ok("fanout") {
        s.reader.mode = flotilla_actors::settings::ReadMode::Fanout;
    }
    // `FLOTILLA_BENCH_BALANCE=count|throughput`: the same cases under either policy,
    // whichever is the default.
    match std::env::var("FLOTILLA_BENCH_BALANCE").as_deref() {
        Ok("count") => s.lease.balance = flotilla_actors::settings::BalanceMode::Count,
        Ok("throughput") => s.lease.balance = flotilla_actors::settings::BalanceMode::Throughput,
        _ => {}
    }
    if short {
        s.lease.failover_time = Duration::from_secs(4);
        s.lease.heartbeat_interval = Duration::from_secs(1);
        s.lease.fence_margin = Duration::from_secs(1);
    }
    s
}

struct Rig {
    streams: MemoryStreams,
    dynamo: MemoryDynamo,
    metrics: MemoryMetrics,
    log: Log,
}

impl Rig {
    async fn new(shards: u32) -> Rig {
        let streams = MemoryStreams::new(MemoryStreamsConfig::default());
        streams.create_stream(STREAM, shards).await.unwrap();
        Rig {
            streams,
            dynamo: MemoryDynamo::new(),
            metrics: MemoryMetrics::new(),
            log: Log::default(),
        }
    }

    fn backend(&self) -> Backend {
        Backend::memory(
            self.streams.clone(),
            self.dynamo.clone(),
            self.metrics.clone(),
        )
    }

    async fn start(&self, backend: Backend, s: Settings, track: bool) -> Worker {
        let log = self.log.clone();
        let id = s.worker.worker_id.clone().unwrap();
        Worker::builder()
            .settings(s)
            .backend(backend)
            .processor(move |shard: &ShardInfo| Probe {
                log: log.clone(),
                worker: id.clone(),
                shard: shard.shard_id.to_string(),
                track,
            })
            .start()
            .await
            .unwrap()
    }

    /// One record per open shard (by explicit hash key).
    async fn put_one_each(&self) {
        self.put_each(|_| 1).await;
    }

    /// One record per open shard (by explicit hash key) of `size(shard id)` bytes.
    async fn put_each(&self, size: impl Fn(&str) -> usize) {
        let shards = self.streams.list_shards(STREAM).await.unwrap();
        let records: Vec<PutRecord> = shards
            .iter()
            .filter(|s| s.is_open())
            .map(|s| PutRecord {
                partition_key: "k".to_owned(),
                explicit_hash_key: Some(s.hash_range.start),
                data: Bytes::from(vec![b'x'; size(s.id.as_str())]),
            })
            .collect();
        for chunk in records.chunks(500) {
            self.streams.put_records(STREAM, chunk).await.unwrap();
        }
    }

    /// Lease owners from the table (heartbeat rows left out).
    async fn owners(&self) -> Vec<Lease> {
        self.dynamo.lease_table(APP).scan().await.unwrap().leases
    }
}

/// Puts one record on every shard every 100 ms until aborted.
fn feed(rig: &Rig) -> tokio::task::JoinHandle<()> {
    feed_every(rig, Duration::from_millis(100))
}

/// Puts one record on every shard every `period` until aborted.
fn feed_every(rig: &Rig, period: Duration) -> tokio::task::JoinHandle<()> {
    feed_sized(rig, period, |_| 1)
}

/// Puts one record of `size(shard id)` bytes on every shard every `period` until aborted.
fn feed_sized(
    rig: &Rig,
    period: Duration,
    size: impl Fn(&str) -> usize + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let r = Rig {
        streams: rig.streams.clone(),
        dynamo: rig.dynamo.clone(),
        metrics: rig.metrics.clone(),
        log: rig.log.clone(),
    };
    tokio::spawn(async move {
        loop {
            r.put_each(&size).await;
            tokio::time::sleep(period).await;
        }
    })
}

async fn held(w: &Worker) -> Vec<String> {
    w.status().await.unwrap().leases.unwrap().held
}

async fn wait_for(what: &str, limit: Duration, mut done: impl AsyncFnMut() -> bool) {
    let start = Instant::now();
    while !done().await {
        assert!(start.elapsed() < limit, "timed out after {limit:?}: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the workers hold `want` leases each (in order).
async fn wait_held(ws: &[&Worker], want: &[usize], limit: Duration) {
    wait_for("balanced fleet", limit, async || {
        let mut got = Vec::new();
        for w in ws {
            got.push(held(w).await.len());
        }
        got == want
    })
    .await;
}

fn secs(d: Duration) -> f64 {
    d.as_secs_f64()
}

/// One line of the final table.
struct Row {
    id: String,
    what: String,
    values: Vec<f64>,
    unit: &'static str,
    /// The target, and the value compared with it (e.g. the p99 over all runs).
    target: Option<(f64, f64, &'static str)>,
}

fn runs(default: usize) -> usize {
    std::env::var("FLEET_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn real_time() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

fn paused_time() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .start_paused(true)
        .build()
        .unwrap()
}

// ---------------------------------------------------------------- P3 crash failover

/// One P3 run: per-shard gaps (s) from abort() to the first delivery on a survivor, and
/// the records delivered again after the abort (the victim had delivered them, its
/// checkpoints did not cover them).
async fn p3_run(case: P3Case) -> (Vec<f64>, u64) {
    let rig = Rig::new(12).await;
    let f = feed(&rig);
    let mut ws = Vec::new();
    for id in ["a", "b", "c"] {
        ws.push(rig.start(rig.backend(), case.settings(id), true).await);
    }
    wait_held(
        &ws.iter().collect::<Vec<_>>(),
        &[4, 4, 4],
        Duration::from_secs(120),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let victim = ws.remove(0);
    let shards = held(&victim).await;
    let t0 = Instant::now();
    victim.abort();
    let duplicates_before = rig.log.with(|l| l.duplicates);
    let log = rig.log.clone();
    let first_after = |shard: &str| {
        log.with(|l| {
            l.batches.get(shard).and_then(|b| {
                b.iter()
                    .find(|(at, w)| *at > t0 && w != "a")
                    .map(|(at, _)| *at - t0)
            })
        })
    };
    wait_for("survivors deliver", Duration::from_secs(60), async || {
        shards.iter().all(|s| first_after(s).is_some())
    })
    .await;
    let gaps = shards
        .iter()
        .map(|s| secs(first_after(s).unwrap()))
        .collect();
    // A survivor reads from the checkpoint to the tip in its first call, so what comes
    // again has come by now; a second more for the slowest processor.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let duplicates = rig.log.with(|l| l.duplicates) - duplicates_before;
    f.abort();
    for w in ws {
        w.shutdown().await.unwrap();
    }
    (gaps, duplicates)
}

/// A P3 case: the lease timings (failover, heartbeat, fence margin in seconds) or the
/// defaults.
#[derive(Clone, Copy)]
struct P3Case {
    id: &'static str,
    lease: Option<(u64, u64, u64)>,
}

/// P3 (4 s / 1 s), P3d (the defaults), P3k (10 s / 2 s / 3 s: the KCL's failover time,
/// the defaults before issue 34), so that old and new defaults run side by side.
const P3_CASES: [P3Case; 3] = [
    P3Case {
        id: "P3",
        lease: Some((4, 1, 1)),
    },
    P3Case {
        id: "P3d",
        lease: None,
    },
    P3Case {
        id: "P3k",
        lease: Some((10, 2, 3)),
    },
];

impl P3Case {
    fn settings(self, id: &str) -> Settings {
        let mut s = settings(id, false);
        if let Some((failover, heartbeat, margin)) = self.lease {
            s.lease.failover_time = Duration::from_secs(failover);
            s.lease.heartbeat_interval = Duration::from_secs(heartbeat);
            s.lease.fence_margin = Duration::from_secs(margin);
        }
        s
    }

    fn label(self) -> String {
        let s = self.settings("x");
        format!(
            "{}failover {} s, heartbeat {} s, fence {} s",
            if self.lease.is_none() {
                "defaults: "
            } else {
                ""
            },
            secs(s.lease.failover_time),
            secs(s.lease.heartbeat_interval),
            secs(s.lease.fence_margin)
        )
    }
}

fn p3(case: P3Case, n: usize, rows: &mut Vec<Row>) {
    let s = case.settings("x");
    let failover = secs(s.lease.failover_time);
    let label = case.label();
    println!("P3 crash failover ({label}), {n} runs");
    let rt = real_time();
    let mut all = Vec::new();
    let mut p50s = Vec::new();
    let mut dups = Vec::new();
    for i in 0..n {
        let (gaps, duplicates) = rt.block_on(p3_run(case));
        let gaps = sorted(gaps);
        println!(
            "  run {i}: per-shard gap p50 {:.2} s, max {:.2} s ({} shards); delivered again after the kill: {duplicates}",
            percentile(&gaps, 0.5),
            percentile(&gaps, 1.0),
            gaps.len()
        );
        p50s.push(percentile(&gaps, 0.5));
        all.extend(gaps);
        dups.push(duplicates as f64);
    }
    let all = sorted(all);
    let (p50, p99, max) = (
        percentile(&all, 0.5),
        percentile(&all, 0.99),
        percentile(&all, 1.0),
    );
    println!(
        "  all {} gaps: p50 {p50:.2} s, p99 {p99:.2} s, max {max:.2} s (target p99 <= {:.0} s)",
        all.len(),
        failover + 2.0
    );
    let (dup_med, dup_min, dup_max) = median(&dups);
    println!(
        "  delivered again after the kill, per run: median {dup_med:.0}, min {dup_min:.0}, max {dup_max:.0} (records of the victim's 4 shards, 10 records/s each)"
    );
    let id = case.id;
    rows.push(Row {
        id: id.into(),
        what: format!("crash failover gap per shard, {label} (values: every shard of every run)"),
        values: all.clone(),
        unit: "s",
        target: Some((failover + 2.0, p99, "p99")),
    });
    rows.push(Row {
        id: format!("{id} dup"),
        what: format!("records delivered again after the kill, per run, {label}"),
        values: dups,
        unit: "rec",
        target: None,
    });
}

/// The outside tester's failover: a stream with a backlog (500 records per shard) and the
/// 100 ms feed, a fleet of 3 started at once, and worker `a` aborted 1 s after its first
/// delivery: records delivered again after the abort (short settings).
async fn p3e_run() -> u64 {
    let rig = Rig::new(12).await;
    for _ in 0..500 {
        rig.put_one_each().await;
    }
    let f = feed(&rig);
    let mut ws = Vec::new();
    for id in ["a", "b", "c"] {
        ws.push(rig.start(rig.backend(), settings(id, true), true).await);
    }
    let log = rig.log.clone();
    let first_by_a = || {
        log.with(|l| {
            l.batches
                .values()
                .flat_map(|b| b.iter().filter(|(_, w)| w == "a").map(|(at, _)| *at))
                .min()
        })
    };
    wait_for("a delivers", Duration::from_secs(60), async || {
        first_by_a().is_some()
    })
    .await;
    tokio::time::sleep_until(first_by_a().unwrap() + Duration::from_secs(1)).await;
    let victim = ws.remove(0);
    let t0 = Instant::now();
    victim.abort();
    let duplicates_before = rig.log.with(|l| l.duplicates);
    wait_for("survivors deliver", Duration::from_secs(60), async || {
        log.with(|l| {
            l.batches.len() == 12
                && l.batches
                    .values()
                    .all(|b| b.iter().any(|(at, w)| *at > t0 && w != "a"))
        })
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let duplicates = rig.log.with(|l| l.duplicates) - duplicates_before;
    f.abort();
    for w in ws {
        w.shutdown().await.unwrap();
    }
    duplicates
}

fn p3e(n: usize, rows: &mut Vec<Row>) {
    println!(
        "P3e crash 1 s after the first batches (500 records/shard backlog, failover 4 s, heartbeat 1 s), {n} runs"
    );
    let rt = real_time();
    let mut dups = Vec::new();
    for i in 0..n {
        let d = rt.block_on(p3e_run());
        println!("  run {i}: delivered again after the kill: {d}");
        dups.push(d as f64);
    }
    let (med, min, max) = median(&dups);
    println!(
        "  delivered again after the kill, per run: median {med:.0}, min {min:.0}, max {max:.0}"
    );
    rows.push(Row {
        id: "P3e dup".into(),
        what: "records delivered again after a kill 1 s after the victim's first batches (12 shards x 500 backlog), per run".into(),
        values: dups,
        unit: "rec",
        target: None,
    });
}

// ---------------------------------------------------------------- P4 planned handoff

struct Handoff {
    /// last delivery by the old owner -> first by the new owner, per moved shard
    gaps: Vec<f64>,
    /// shutdown start -> first delivery elsewhere (shutdown only)
    from_start: Vec<f64>,
    duplicates: u64,
    moved: usize,
}

async fn p4_run(steal: bool) -> Handoff {
    let rig = Rig::new(12).await;
    let f = feed(&rig);
    let mut ws = Vec::new();
    for id in ["a", "b", "c"] {
        ws.push(rig.start(rig.backend(), settings(id, false), true).await);
    }
    wait_held(
        &ws.iter().collect::<Vec<_>>(),
        &[4, 4, 4],
        Duration::from_secs(120),
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let t0 = Instant::now();
    let log = rig.log.clone();
    // The shards that move, and the worker they move to is anyone but `old`.
    let (shards, old, new): (Vec<String>, String, Option<String>) = if steal {
        let d = rig.start(rig.backend(), settings("d", false), true).await;
        ws.push(d);
        wait_held(
            &ws.iter().collect::<Vec<_>>(),
            &[3, 3, 3, 3],
            Duration::from_secs(60),
        )
        .await;
        (held(&ws[3]).await, String::new(), Some("d".to_owned()))
    } else {
        let a = ws.remove(0);
        let shards = held(&a).await;
        let report = a.shutdown().await.unwrap();
        assert!(report.clean(), "{report:#?}");
        (shards, "a".to_owned(), None)
    };
    let first_new = |shard: &str| {
        log.with(|l| {
            l.batches.get(shard).and_then(|b| {
                let i = b.iter().position(|(at, w)| {
                    *at > t0
                        && match &new {
                            Some(n) => w == n,
                            None => *w != old,
                        }
                })?;
                let last_old = b[..i].last().map(|(at, _)| *at).unwrap_or(t0);
                Some((b[i].0 - last_old, b[i].0 - t0))
            })
        })
    };
    wait_for("new owners deliver", Duration::from_secs(60), async || {
        shards.iter().all(|s| first_new(s).is_some())
    })
    .await;
    let got: Vec<(Duration, Duration)> = shards.iter().map(|s| first_new(s).unwrap()).collect();
    // Let the pipeline drain before counting duplicates.
    f.abort();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let duplicates = log.with(|l| l.duplicates);
    for w in ws {
        w.shutdown().await.unwrap();
    }
    Handoff {
        gaps: got.iter().map(|g| secs(g.0)).collect(),
        from_start: got.iter().map(|g| secs(g.1)).collect(),
        duplicates,
        moved: shards.len(),
    }
}

fn p4(steal: bool, n: usize, rows: &mut Vec<Row>) {
    let what = if steal {
        "steal: a 4th worker joins 3 on 12 shards"
    } else {
        "shutdown() of 1 of 3 workers on 12 shards"
    };
    println!("P4 planned handoff ({what}), defaults, {n} runs");
    let rt = real_time();
    let (mut gaps, mut from_start, mut dups) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let h = rt.block_on(p4_run(steal));
        let g = sorted(h.gaps.clone());
        println!(
            "  run {i}: {} moved; gap old->new p50 {:.2} s max {:.2} s; from start max {:.2} s; duplicates {}",
            h.moved,
            percentile(&g, 0.5),
            percentile(&g, 1.0),
            percentile(&sorted(h.from_start.clone()), 1.0),
            h.duplicates
        );
        gaps.extend(h.gaps);
        from_start.extend(h.from_start);
        dups.push(h.duplicates as f64);
    }
    let g = sorted(gaps.clone());
    let id = if steal { "P4b" } else { "P4a" };
    println!(
        "  all: gap p50 {:.2} s p99 {:.2} s max {:.2} s; duplicates total {}",
        percentile(&g, 0.5),
        percentile(&g, 0.99),
        percentile(&g, 1.0),
        dups.iter().sum::<f64>()
    );
    rows.push(Row {
        id: id.into(),
        what: format!("{what}: gap last old delivery -> first new, per moved shard"),
        values: gaps,
        unit: "s",
        target: Some((2.0, percentile(&g, 0.99), "p99")),
    });
    if !steal {
        let fs = sorted(from_start.clone());
        rows.push(Row {
            id: "P4a'".into(),
            what: "shutdown start -> first delivery elsewhere, per shard".into(),
            values: from_start,
            unit: "s",
            target: Some((2.0, percentile(&fs, 0.99), "p99")),
        });
    }
    rows.push(Row {
        id: format!("{id} dup"),
        what: format!("{what}: duplicates per run"),
        values: dups.clone(),
        unit: "rec",
        target: Some((0.0, dups.iter().copied().fold(0.0, f64::max), "max")),
    });
}

// ---------------------------------------------------------------- P5 rebalance

/// Rounds to settle after a join (`workers` -> +1) and after a graceful leave of one of
/// `workers + 1`; and the most moves of any lease in each.
fn p5_sim(leases: usize, workers: usize) -> (usize, u32, usize, u32) {
    let mut sim = Sim::new(leases, workers, &[]);
    sim.settle(1000).expect("initial settle");
    sim.moves.iter_mut().for_each(|m| *m = 0);
    sim.workers.insert(WorkerId::new("joiner"));
    let join = sim.settle(1000).expect("join settles");
    let join_moves = sim.moves.iter().copied().max().unwrap_or(0);
    sim.moves.iter_mut().for_each(|m| *m = 0);
    sim.draining.insert(WorkerId::new("w00"));
    let leave = sim.settle(1000).expect("leave settles");
    let leave_moves = sim.moves.iter().copied().max().unwrap_or(0);
    (join, join_moves, leave, leave_moves)
}

/// Spread over `members` (max - min of leases held), 1000 per lease not held by one of
/// them, and whether a request is pending.
fn spread_of(leases: &[Lease], members: &[&str]) -> usize {
    let mut counts: BTreeMap<&str, usize> = members.iter().map(|m| (*m, 0)).collect();
    let mut stray = 0;
    for l in leases {
        match l.owner.as_ref().and_then(|o| counts.get_mut(o.as_str())) {
            Some(c) => *c += 1,
            None => stray += 1,
        }
        if l.handoff_to.is_some() {
            stray += 1;
        }
    }
    counts.values().max().unwrap_or(&0) - counts.values().min().unwrap_or(&0) + stray * 1000
}

struct Rebalance {
    join_s: f64,
    join_max_moves: u32,
    join_moved: usize,
    leave_s: f64,
    leave_max_moves: u32,
    leave_moved: usize,
}

/// Owner changes per lease until the members settle to a spread <= 1 (polled every
/// 100 ms of paused time); returns (seconds, most moves of a lease, leases moved).
async fn settle_real(rig: &Rig, members: &[&str]) -> (f64, u32, usize) {
    let s = settle(rig, members, None).await;
    (s.secs, s.max_moves, s.moved)
}

/// How a fleet settled: when, the most moves of one lease, leases moved, and the
/// spread of lease counts it settled to.
struct Settled {
    secs: f64,
    max_moves: u32,
    moved: usize,
    spread: usize,
}

/// Polls the table every 100 ms of paused time, counting owner changes per lease.
/// `quiet: None`: until the members' spread is <= 1. `Some(q)`: until every lease is
/// held by a member, none has a request pending, and no owner changed for `q` (what
/// throughput balance settles to: counts may stray by its count slack); the time is
/// that of the last change.
async fn settle(rig: &Rig, members: &[&str], quiet: Option<Duration>) -> Settled {
    let t0 = Instant::now();
    let mut last: HashMap<LeaseKey, Option<WorkerId>> = rig
        .owners()
        .await
        .into_iter()
        .map(|l| (l.key, l.owner))
        .collect();
    let mut moves: HashMap<LeaseKey, u32> = HashMap::new();
    let mut changed = t0;
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let leases = rig.owners().await;
        for l in &leases {
            let prev = last.insert(l.key.clone(), l.owner.clone()).flatten();
            if prev != l.owner {
                changed = Instant::now();
            }
            if l.owner.is_some() && prev.is_some() && prev != l.owner {
                *moves.entry(l.key.clone()).or_default() += 1;
            }
        }
        let spread = spread_of(&leases, members);
        let done = match quiet {
            None => spread <= 1,
            Some(q) => spread < 1000 && changed.elapsed() >= q,
        };
        if done {
            let at = if quiet.is_some() {
                changed
            } else {
                Instant::now()
            };
            return Settled {
                secs: secs(at - t0),
                max_moves: moves.values().copied().max().unwrap_or(0),
                moved: moves.len(),
                spread,
            };
        }
        assert!(t0.elapsed() < Duration::from_secs(600), "no settle");
    }
}

async fn p5_real_run(leases: u32) -> Rebalance {
    let rig = Rig::new(leases).await;
    let names = ["a", "b", "c", "d", "e"];
    let mut ws = Vec::new();
    for id in &names[..4] {
        ws.push(rig.start(rig.backend(), settings(id, false), false).await);
    }
    settle_real(&rig, &names[..4]).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    ws.push(rig.start(rig.backend(), settings("e", false), false).await);
    let (join_s, join_max_moves, join_moved) = settle_real(&rig, &names).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // The graceful leave: the fleet settles while the shutdown runs.
    let leaver = ws.remove(0);
    let shutdown = tokio::spawn(leaver.shutdown());
    let (leave_s, leave_max_moves, leave_moved) = settle_real(&rig, &names[1..]).await;
    shutdown.await.unwrap().unwrap();
    for w in ws {
        w.shutdown().await.unwrap();
    }
    Rebalance {
        join_s,
        join_max_moves,
        join_moved,
        leave_s,
        leave_max_moves,
        leave_moved,
    }
}

fn p5(n: usize, rows: &mut Vec<Row>) {
    println!("P5 rebalance, pure simulator (rounds of one heartbeat interval)");
    for (leases, workers) in [(120, 4), (1000, 50)] {
        let (j, jm, l, lm) = p5_sim(leases, workers);
        println!(
            "  {leases} leases, {workers}->{} join: {j} rounds, max moves/lease {jm}; {}->{workers} leave: {l} rounds, max moves/lease {lm}",
            workers + 1,
            workers + 1
        );
        if leases == 120 {
            rows.push(Row {
                id: "P5 sim".into(),
                what: "simulator 4->5 join then 5->4 leave on 120 leases: rounds (join, leave)"
                    .into(),
                values: vec![j as f64, l as f64],
                unit: "rnd",
                target: Some((3.0, j.max(l) as f64, "max")),
            });
            rows.push(Row {
                id: "P5 sim mv".into(),
                what: "simulator: most moves of one lease (join, leave)".into(),
                values: vec![f64::from(jm), f64::from(lm)],
                unit: "mv",
                target: Some((1.0, f64::from(jm.max(lm)), "max")),
            });
        }
    }
    println!("P5 rebalance, real workers on 120 leases, paused time, defaults, {n} runs");
    let (mut js, mut ls, mut mv) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let r = paused_time().block_on(p5_real_run(120));
        println!(
            "  run {i}: join {:.1} s ({} leases moved, max {} moves); leave {:.1} s ({} moved, max {})",
            r.join_s, r.join_moved, r.join_max_moves, r.leave_s, r.leave_moved, r.leave_max_moves
        );
        js.push(r.join_s);
        ls.push(r.leave_s);
        mv.push(f64::from(r.join_max_moves.max(r.leave_max_moves)));
    }
    let hb = 2.0;
    for (id, what, v) in [
        (
            "P5 join",
            "4->5 join on 120 leases: seconds to spread <= 1",
            js,
        ),
        (
            "P5 leave",
            "5->4 graceful leave on 120 leases: seconds to spread <= 1",
            ls,
        ),
    ] {
        let (_, _, max) = median(&v);
        rows.push(Row {
            id: id.into(),
            what: what.into(),
            values: v,
            unit: "s",
            target: Some((3.0 * hb, max, "max")),
        });
    }
    let worst = mv.iter().copied().fold(0.0, f64::max);
    rows.push(Row {
        id: "P5 mv".into(),
        what: "real workers: most moves of one lease (join or leave)".into(),
        values: mv,
        unit: "mv",
        target: Some((1.0, worst, "max")),
    });
}

// ---------------------------------------------------------------- P13 skewed shards

/// What a fleet with skewed shards settles to under one balance policy.
struct Skew {
    rounds: usize,
    moves: u32,
    /// Per-worker bytes/s over the mean, lowest and highest, after settling.
    low: f64,
    high: f64,
    counts: (usize, usize),
}

/// 100 leases, 10 hot (10x the bytes/s of a cold one) on 5 workers, dealt round-robin
/// so that every hot lease starts on `w00` (the worst start a count balance keeps).
/// Rates published by each lease's owner are off by up to ±`jitter` each round
/// (seeded); the fleet runs until a round with nothing to do, at most 200 rounds.
fn p13_sim(policy: Policy, jitter: f64, seed: u64) -> Skew {
    use rand::{Rng, SeedableRng};
    let (leases, workers, cold, hot) = (100usize, 5usize, 100u64, 1000u64);
    let owners: Vec<usize> = (0..leases).map(|i| i % workers).collect();
    let rates: Vec<u64> = (0..leases)
        .map(|i| {
            if i % workers == 0 && i < 50 {
                hot
            } else {
                cold
            }
        })
        .collect();
    let mut sim = Sim::new(leases, workers, &owners).with_rates(rates.clone());
    sim.limits.policy = policy;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut rounds = 0;
    for r in 1..=200 {
        sim.rates = Some(
            rates
                .iter()
                .map(|&x| (x as f64 * (1.0 + rng.random_range(-jitter..=jitter))).round() as u64)
                .collect(),
        );
        let decisions = sim.round();
        rounds = r;
        let idle = decisions
            .iter()
            .all(|(_, d)| d.take.is_empty() && d.request.is_empty() && d.hand_off.is_empty());
        if idle && sim.leases.iter().all(|l| l.handoff_to.is_none()) {
            break;
        }
    }
    let t = sim.throughputs(&rates);
    let mean = t.values().sum::<u64>() as f64 / t.len() as f64;
    let ratios: Vec<f64> = t.values().map(|&x| x as f64 / mean).collect();
    let counts: Vec<usize> = sim.workers.iter().map(|w| sim.held_by(w).len()).collect();
    Skew {
        rounds,
        moves: sim.moves.iter().sum(),
        low: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        high: ratios.iter().copied().fold(0.0, f64::max),
        counts: (
            counts.iter().copied().min().unwrap_or(0),
            counts.iter().copied().max().unwrap_or(0),
        ),
    }
}

fn p13(n: usize, rows: &mut Vec<Row>) {
    println!(
        "P13 skewed shards, pure simulator: 100 leases (10 hot at 10x), 5 workers, every hot \
         lease on w00 at the start; rates jittered ±3 % per round; {n} seeds"
    );
    for (name, policy) in [
        ("throughput", Policy::Throughput(Spread::DEFAULT)),
        ("count", Policy::Count),
    ] {
        let (mut rounds, mut moves, mut worst) = (Vec::new(), Vec::new(), Vec::new());
        for seed in 0..n as u64 {
            let s = p13_sim(policy, 0.03, seed);
            println!(
                "  {name}, seed {seed}: quiet after {} rounds, {} moves, worker bytes/s {:.2}..{:.2} of the mean, leases {}..{}",
                s.rounds, s.moves, s.low, s.high, s.counts.0, s.counts.1
            );
            rounds.push(s.rounds as f64);
            moves.push(f64::from(s.moves));
            worst.push((1.0 - s.low).max(s.high - 1.0) * 100.0);
        }
        let max_dev = worst.iter().copied().fold(0.0, f64::max);
        rows.push(Row {
            id: format!("P13 {name}"),
            what: format!("{name} balance, 10 hot + 90 cold on 5 workers: worst worker's distance from the mean bytes/s"),
            values: worst,
            unit: "%",
            target: Some((15.0, max_dev, "max")),
        });
        rows.push(Row {
            id: format!("P13 {name} rnd"),
            what: format!("{name} balance: rounds until quiet"),
            values: rounds,
            unit: "rnd",
            target: None,
        });
        rows.push(Row {
            id: format!("P13 {name} mv"),
            what: format!("{name} balance: leases moved in all"),
            values: moves,
            unit: "mv",
            target: None,
        });
    }
}

// ---------------------------------------------------------------- P13r skewed shards, real workers

/// P13r's producer: one record per shard every `P13R_PERIOD`, `P13R_COLD_BYTES` on a
/// cold shard and ten times that on a hot one (2.5 kB/s against 25 kB/s).
const P13R_PERIOD: Duration = Duration::from_millis(200);
const P13R_COLD_BYTES: usize = 500;
/// P13r's "settled": no owner change for ten heartbeat intervals (the rates are
/// smoothed over beats: a move may follow a few beats after the last one).
const P13R_QUIET: Duration = Duration::from_secs(20);
/// After settling, what each worker's processors received is counted over this long.
const P13R_WINDOW: Duration = Duration::from_secs(60);

/// What a real fleet with skewed shards settled to under one balance policy.
struct SkewReal {
    /// Heartbeat intervals from the hot shards' start to the last owner change.
    rounds: f64,
    moved: usize,
    max_moves: u32,
    /// Per-worker bytes/s received over the window, over the mean: lowest, highest.
    low: f64,
    high: f64,
    /// Leases per worker at the end.
    counts: Vec<usize>,
    /// Owner changes during the window (0 when the fleet stayed settled).
    window_moves: usize,
}

/// Each lease's owner.
async fn owner_map(rig: &Rig) -> BTreeMap<LeaseKey, Option<WorkerId>> {
    rig.owners()
        .await
        .into_iter()
        .map(|l| (l.key, l.owner))
        .collect()
}

/// 100 shards on 5 workers (defaults but `balance`, paused time), every shard cold
/// until the fleet settles; then 10 of `w00`'s shards turn hot (the worst start a count
/// balance keeps) and the fleet settles again; then the window is counted.
async fn p13r_run(balance: flotilla_actors::settings::BalanceMode) -> SkewReal {
    let rig = Rig::new(100).await;
    let hot: Arc<Mutex<HashSet<String>>> = Arc::default();
    let producer = {
        let hot = hot.clone();
        feed_sized(&rig, P13R_PERIOD, move |shard| {
            if hot.lock().unwrap().contains(shard) {
                10 * P13R_COLD_BYTES
            } else {
                P13R_COLD_BYTES
            }
        })
    };
    let (_, backend) = counted_backend(&rig);
    let (names, ws) = start_fleet_with(&rig, &backend, 5, |s| s.lease.balance = balance).await;
    let members: Vec<&str> = names.iter().map(String::as_str).collect();
    settle(&rig, &members, Some(P13R_QUIET)).await;
    let w00_first: Vec<String> = owner_map(&rig)
        .await
        .into_iter()
        .filter(|(_, o)| o.as_ref().map(WorkerId::as_str) == Some(names[0].as_str()))
        .take(10)
        .map(|(k, _)| k.as_str().to_owned())
        .collect();
    hot.lock().unwrap().extend(w00_first);
    let settled = settle(&rig, &members, Some(P13R_QUIET)).await;
    let before = owner_map(&rig).await;
    let bytes0 = rig.log.with(|l| l.bytes.clone());
    tokio::time::sleep(P13R_WINDOW).await;
    let bytes1 = rig.log.with(|l| l.bytes.clone());
    let after = owner_map(&rig).await;
    producer.abort();
    for w in ws {
        w.abort();
    }
    let rates: Vec<f64> = names
        .iter()
        .map(|n| {
            let got = bytes1.get(n).copied().unwrap_or(0) - bytes0.get(n).copied().unwrap_or(0);
            got as f64 / secs(P13R_WINDOW)
        })
        .collect();
    let mean = rates.iter().sum::<f64>() / rates.len() as f64;
    let ratios: Vec<f64> = rates.iter().map(|r| r / mean).collect();
    let counts = names
        .iter()
        .map(|n| {
            after
                .values()
                .filter(|o| o.as_ref().map(WorkerId::as_str) == Some(n.as_str()))
                .count()
        })
        .collect();
    let heartbeat = Settings::default().lease.heartbeat_interval;
    SkewReal {
        rounds: settled.secs / secs(heartbeat),
        moved: settled.moved,
        max_moves: settled.max_moves,
        low: ratios.iter().copied().fold(f64::INFINITY, f64::min),
        high: ratios.iter().copied().fold(0.0, f64::max),
        counts,
        window_moves: before
            .iter()
            .filter(|(k, o)| after.get(*k) != Some(*o))
            .count(),
    }
}

fn p13r(n: usize, rows: &mut Vec<Row>) {
    use flotilla_actors::settings::BalanceMode;
    println!(
        "P13r skewed shards, real workers: 100 shards (10 hot at 10x the bytes/s), 5 workers, \
         memory backend, paused time, defaults but lease.balance; the 10 hot ones all on w00 \
         once the fleet settled on cold shards; settled = no owner change for {} s; \
         bytes/s received per worker over {} s after; {n} runs",
        secs(P13R_QUIET),
        secs(P13R_WINDOW)
    );
    for (name, balance) in [
        ("throughput", BalanceMode::Throughput),
        ("count", BalanceMode::Count),
    ] {
        let (mut rounds, mut moved, mut most, mut worst, mut late) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for i in 0..n {
            let s = paused_time().block_on(p13r_run(balance));
            println!(
                "  {name}, run {i}: settled after {:.1} rounds, {} leases moved (most moves of one {}), \
                 worker bytes/s {:.2}..{:.2} of the mean, leases {:?}, owner changes in the window {}",
                s.rounds, s.moved, s.max_moves, s.low, s.high, s.counts, s.window_moves
            );
            rounds.push(s.rounds);
            moved.push(s.moved as f64);
            most.push(f64::from(s.max_moves));
            worst.push((1.0 - s.low).max(s.high - 1.0) * 100.0);
            late.push(s.window_moves as f64);
        }
        let max_dev = worst.iter().copied().fold(0.0, f64::max);
        let max_late = late.iter().copied().fold(0.0, f64::max);
        rows.push(Row {
            id: format!("P13r {name}"),
            what: format!(
                "real workers, {name} balance, 10 hot + 90 cold on 5 workers: worst worker's \
                 received bytes/s from the mean"
            ),
            values: worst,
            unit: "%",
            target: Some((15.0, max_dev, "max")),
        });
        rows.push(Row {
            id: format!("P13r {name} rnd"),
            what: format!("{name} balance: heartbeat rounds to the last owner change"),
            values: rounds,
            unit: "rnd",
            target: None,
        });
        rows.push(Row {
            id: format!("P13r {name} mv"),
            what: format!("{name} balance: leases moved"),
            values: moved,
            unit: "mv",
            target: None,
        });
        rows.push(Row {
            id: format!("P13r {name} mv1"),
            what: format!("{name} balance: most moves of one lease"),
            values: most,
            unit: "mv",
            target: None,
        });
        // Not 0: the fleet was not settled when the window began (the quiet rule was
        // too short), and the worst worker's figure mixes two placements.
        rows.push(Row {
            id: format!("P13r {name} win"),
            what: format!("{name} balance: owner changes during the measuring window"),
            values: late,
            unit: "mv",
            target: Some((0.0, max_late, "max")),
        });
    }
}

// ---------------------------------------------------------------- P6 lease-table cost

const OPS: [&str; 16] = [
    "ensure_table",
    "scan",
    "heartbeats",
    "get",
    "create_if_absent",
    "take",
    "release",
    "checkpoint",
    "delete",
    "request_handoff",
    "transfer",
    "clear_handoff",
    "heartbeat",
    "remove_heartbeat",
    "join_roster",
    "remove_dead_heartbeat",
];
const READ_OPS: [&str; 3] = ["scan", "heartbeats", "get"];

struct Cost {
    per_min: BTreeMap<&'static str, f64>,
    /// Items read per minute by each read op.
    items_per_min: BTreeMap<&'static str, f64>,
    /// Read units billed per minute by each read op (see [`rcu_per_min`]).
    rcu_per_min: BTreeMap<&'static str, f64>,
    /// Heartbeat reads per minute that went through the heartbeat index.
    summaries_per_min: f64,
    settle_s: f64,
    /// Bytes of a lease row and of a heartbeat row as DynamoDB sizes them, at the end.
    lease_bytes: usize,
    heartbeat_bytes: usize,
}

/// Read capacity units per minute over `minutes`, as DynamoDB bills them: a scan and a
/// heartbeat read as their outputs report (the memory table bills by DynamoDB's rules,
/// `model::item::ReadUnits`: scans and index Queries by the bytes of a page, the
/// roster and rows read by key per item, index reads eventually consistent), a `get`
/// one unit (a strongly consistent GetItem of a lease row, under 4 KB).
fn rcu_per_min(
    table: &Counted,
    before: &BTreeMap<&'static str, f64>,
    gets_per_min: f64,
    minutes: u64,
) -> BTreeMap<&'static str, f64> {
    let mut out: BTreeMap<&'static str, f64> = ["scan", "heartbeats"]
        .into_iter()
        .map(|op| {
            let units = table.read_units(op).as_units() - before.get(op).copied().unwrap_or(0.0);
            (op, units / minutes as f64)
        })
        .collect();
    out.insert("get", gets_per_min);
    out
}

fn units_now(table: &Counted) -> BTreeMap<&'static str, f64> {
    ["scan", "heartbeats"]
        .into_iter()
        .map(|op| (op, table.read_units(op).as_units()))
        .collect()
}

/// A lease table that counts every call by kind (and never injects a fault: the plan is
/// only the seed), and a backend whose workers all use it.
type Counted = Faulty<flotilla_actors::backend::memory::MemoryLeaseTable>;

fn counted_backend(rig: &Rig) -> (Counted, Backend) {
    counted_backend_on(rig, true)
}

/// `index`: false makes the lease table as a KCL would, without the heartbeat index,
/// and refuses to add it, so heartbeats are read by key (the reads before the index).
fn counted_backend_on(rig: &Rig, index: bool) -> (Counted, Backend) {
    if !index {
        rig.dynamo.create_table(APP, "leaseKey", "S");
        rig.dynamo.refuse_table_updates();
    }
    let table = Faulty::new(rig.dynamo.lease_table(APP), FaultPlan::seeded(1));
    let backend = {
        let table = table.clone();
        Backend::new(
            Arc::new(rig.streams.clone()),
            move |_| -> Arc<dyn LeaseTable> { Arc::new(table.clone()) },
            Arc::new(rig.metrics.clone()),
        )
    };
    (table, backend)
}

/// Workers `w00`, `w01`, … started one after another on `backend` (in paused time no
/// virtual time passes between them: they start together).
async fn start_fleet(rig: &Rig, backend: &Backend, workers: usize) -> (Vec<String>, Vec<Worker>) {
    start_fleet_with(rig, backend, workers, |_| {}).await
}

/// [`start_fleet`] with `tweak` applied to every worker's settings.
async fn start_fleet_with(
    rig: &Rig,
    backend: &Backend,
    workers: usize,
    tweak: impl Fn(&mut Settings),
) -> (Vec<String>, Vec<Worker>) {
    let names: Vec<String> = (0..workers).map(|i| format!("w{i:02}")).collect();
    let mut ws = Vec::new();
    for id in &names {
        let mut s = settings(id, false);
        tweak(&mut s);
        ws.push(rig.start(backend.clone(), s, false).await);
    }
    (names, ws)
}

/// Table calls and items read per minute by kind over the next `minutes` (sleeps).
async fn count_ops(
    table: &Counted,
    minutes: u64,
) -> (BTreeMap<&'static str, f64>, BTreeMap<&'static str, f64>) {
    let before: Vec<u64> = OPS.iter().map(|op| table.calls(op)).collect();
    let items_before: Vec<u64> = READ_OPS.iter().map(|op| table.items_read(op)).collect();
    tokio::time::sleep(Duration::from_secs(60 * minutes)).await;
    let per_min = OPS
        .iter()
        .zip(before)
        .map(|(op, b)| (*op, (table.calls(op) - b) as f64 / minutes as f64))
        .collect();
    let items_per_min = READ_OPS
        .iter()
        .zip(items_before)
        .map(|(op, b)| (*op, (table.items_read(op) - b) as f64 / minutes as f64))
        .collect();
    (per_min, items_per_min)
}

/// `busy`: a record on every shard every second once the fleet has settled, so every
/// shard has a position to write all the time (the checkpoint writes' worst case).
async fn p6_run(leases: u32, workers: usize, minutes: u64, busy: bool, index: bool) -> Cost {
    let rig = Rig::new(leases).await;
    let (table, backend) = counted_backend_on(&rig, index);
    let t0 = Instant::now();
    let (names, ws) = start_fleet(&rig, &backend, workers).await;
    let members: Vec<&str> = names.iter().map(String::as_str).collect();
    settle_real(&rig, &members).await;
    let settle_s = secs(t0.elapsed());
    let feeding = busy.then(|| feed_every(&rig, Duration::from_secs(1)));
    tokio::time::sleep(Duration::from_secs(20)).await;
    let units_before = units_now(&table);
    let summaries_before = table.calls("heartbeats_summary");
    let (per_min, items_per_min) = count_ops(&table, minutes).await;
    let rcu_per_min = rcu_per_min(&table, &units_before, items_per_min["get"], minutes);
    let summaries_per_min =
        (table.calls("heartbeats_summary") - summaries_before) as f64 / minutes as f64;
    if let Some(f) = feeding {
        f.abort();
    }
    for w in ws {
        w.abort();
    }
    let size = |table: &str, key: &str| {
        rig.dynamo
            .get_raw(table, key)
            .map(|item| flotilla_actors::model::item::item_size(&item))
            .unwrap_or(0)
    };
    let lease_bytes = size(
        APP,
        LeaseKey::from(&flotilla_actors::model::ShardId::from_index(0)).as_str(),
    );
    let heartbeat_bytes = size(
        &flotilla_actors::backend::layout::worker_table_name(APP),
        &flotilla_actors::model::item::heartbeat_key(&WorkerId::new(names[0].as_str())),
    );
    Cost {
        per_min,
        items_per_min,
        rcu_per_min,
        summaries_per_min,
        settle_s,
        lease_bytes,
        heartbeat_bytes,
    }
}

fn p6(n: usize, rows: &mut Vec<Row>) {
    // `FLEET_P6=leases,workers,minutes` runs another scale (e.g. 10000,100,1).
    let (leases, workers, minutes) = std::env::var("FLEET_P6")
        .ok()
        .and_then(|v| {
            let mut it = v.split(',').map(|x| x.trim().parse::<u64>().ok());
            Some((it.next()?? as u32, it.next()?? as usize, it.next()??))
        })
        .unwrap_or((1000u32, 50usize, 10u64));
    let interval = Settings::default().checkpoint.interval;
    // The writer's bound: at most one paced checkpoint write per shard per interval.
    let bound = f64::from(leases) * 60.0 / interval.as_secs_f64();
    // KCL 2.x/3.x: every lease renewed every failover/3 = 3.3 s; each worker scans the
    // whole table once per failover time (10 s) to take expired leases.
    let kcl_writes = f64::from(leases) / 3.3 * 60.0;
    let kcl_scans = workers as f64 * 6.0;
    let kcl_rows = kcl_scans * f64::from(leases);
    // Idle with the heartbeats read by key (no index: the reads before it), idle
    // through the index, and busy (through the index; `FLEET_P6_BUSY=0` leaves it out,
    // as at 10,000 x 100, where it is too slow to run).
    let busy_too = std::env::var("FLEET_P6_BUSY").as_deref() != Ok("0");
    let variants = [(false, false), (false, true), (true, true)];
    for (busy, index) in variants.into_iter().filter(|(busy, _)| busy_too || !busy) {
        let records = if busy {
            "a record on every shard every second"
        } else {
            "no records"
        };
        let how = if index {
            "heartbeats through the index"
        } else {
            "no index: heartbeats by key"
        };
        println!(
            "P6 lease-table cost: {leases} leases x {workers} workers, defaults, paused time, {records}, {how}, {n} runs of {minutes} min after settling"
        );
        let mut lease_writes = Vec::new();
        let mut checkpoints = Vec::new();
        let mut reads_rows = Vec::new();
        let mut rcus = Vec::new();
        let mut lease_bytes = 0;
        for i in 0..n {
            let c = paused_time().block_on(p6_run(leases, workers, minutes, busy, index));
            let w: f64 = c
                .per_min
                .iter()
                .filter(|(op, _)| !READ_OPS.contains(op) && **op != "checkpoint")
                .map(|(_, v)| v)
                .sum();
            let cw = c.per_min["checkpoint"];
            let scans = c.per_min["scan"];
            let rows_read: f64 = c.items_per_min.values().sum();
            let rcu = &c.rcu_per_min;
            let rcu_total: f64 = rcu.values().sum();
            lease_bytes = c.lease_bytes;
            let by_kind: Vec<String> = READ_OPS
                .iter()
                .map(|op| {
                    format!(
                        "{op} {:.0} calls / {:.0} items / {:.1} RCU",
                        c.per_min[op], c.items_per_min[op], rcu[op]
                    )
                })
                .collect();
            println!(
                "  run {i}: reads per minute by kind: {} ({:.0} of the heartbeat reads through the index); rows {} B (lease), {} B (heartbeat)",
                by_kind.join("; "),
                c.summaries_per_min,
                c.lease_bytes,
                c.heartbeat_bytes
            );
            rcus.push(rcu_total);
            let nonzero: Vec<String> = c
                .per_min
                .iter()
                .filter(|(_, v)| **v > 0.0)
                .map(|(op, v)| format!("{op} {v:.0}"))
                .collect();
            println!(
                "  run {i}: settled in {:.0} s; per minute: {}; lease writes {w:.0}, checkpoint writes {cw:.0}, scans {scans:.0}, rows read {rows_read:.0}, RCU {rcu_total:.1}",
                c.settle_s,
                nonzero.join(", ")
            );
            lease_writes.push(w);
            checkpoints.push(cw);
            reads_rows.push(rows_read);
        }
        // The KCL's scans, strongly consistent, billed by the bytes of the lease rows.
        let kcl_rcu = kcl_rows * lease_bytes as f64 / 4096.0;
        if !busy && !index {
            let (rows_med, _, _) = median(&reads_rows);
            let (rcu_med, _, _) = median(&rcus);
            println!(
                "  by key: {rows_med:.0} rows/min, {rcu_med:.0} RCU/min (KCL model {kcl_rcu:.0} RCU/min)"
            );
            rows.push(Row {
                id: "P6 r keys".into(),
                what: format!(
                    "rows read/min, heartbeats by key (no index) (KCL model {kcl_rows:.0})"
                ),
                values: reads_rows,
                unit: "rows/min",
                target: None,
            });
            rows.push(Row {
                id: "P6 rcu keys".into(),
                what: format!(
                    "read capacity units/min, heartbeats by key (no index) (KCL model {kcl_rcu:.0})"
                ),
                values: rcus,
                unit: "RCU/min",
                target: None,
            });
            continue;
        }
        let (med, _, _) = median(&lease_writes);
        let (cw_med, _, cw_max) = median(&checkpoints);
        if !busy {
            println!(
                "  KCL model: renewals {kcl_writes:.0}/min; {kcl_scans:.0} scans/min = {kcl_rows:.0} rows read/min"
            );
            println!(
                "  writes ratio KCL/flotilla: {:.1}x (target >= 10x)",
                kcl_writes / med
            );
            rows.push(Row {
                id: "P6 w".into(),
                what: format!("lease-table writes/min, {leases} leases x {workers} workers, no records (KCL model {kcl_writes:.0})"),
                values: lease_writes,
                unit: "w/min",
                target: Some((kcl_writes / 10.0, med, "median")),
            });
            let (rows_med, _, _) = median(&reads_rows);
            println!(
                "  reads ratio KCL/flotilla: {:.1}x in rows (target >= 10x)",
                kcl_rows / rows_med
            );
            rows.push(Row {
                id: "P6 r".into(),
                what: format!("rows read/min (scan rows + heartbeat-read items + gets) (KCL model {kcl_rows:.0})"),
                values: reads_rows,
                unit: "rows/min",
                target: Some((kcl_rows / 10.0, rows_med, "median")),
            });
            let (rcu_med, _, _) = median(&rcus);
            println!(
                "  reads ratio KCL/flotilla: {:.1}x in RCU (KCL model {kcl_rcu:.0}; target >= 10x)",
                kcl_rcu / rcu_med
            );
            rows.push(Row {
                id: "P6 rcu".into(),
                what: format!("read capacity units/min as DynamoDB bills them, heartbeats through the index (KCL model {kcl_rcu:.0})"),
                values: rcus,
                unit: "RCU/min",
                target: Some((kcl_rcu / 10.0, rcu_med, "median")),
            });
        } else {
            println!(
                "  checkpoint writes/min: median {cw_med:.0}, max {cw_max:.0}; bound {leases} x 60 / {} s = {bound:.0}/min (either scheme: the KCL checkpoints too)",
                interval.as_secs()
            );
            rows.push(Row {
                id: "P6 cw".into(),
                what: format!("checkpoint writes/min, {leases} busy shards (a record each per second), bound one per shard per {} s", interval.as_secs()),
                values: checkpoints,
                unit: "w/min",
                target: Some((bound, cw_max, "max")),
            });
            rows.push(Row {
                id: "P6 w busy".into(),
                what: format!("lease-table writes/min other than checkpoints, busy shards (KCL model {kcl_writes:.0})"),
                values: lease_writes,
                unit: "w/min",
                target: Some((kcl_writes / 10.0, med, "median")),
            });
        }
    }
}

// ---------------------------------------------------------------- P14 scale

/// This process's CPU time (user + system, every thread), seconds: /proc/self/stat
/// counts it in clock ticks of 1/100 s (`getconf CLK_TCK` is 100 on Linux here).
fn process_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The fields after the command name (which may hold spaces) start at the state.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the line, 12 and 13 after the name.
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

/// This process's resident set (VmRSS), MB.
fn process_rss_mb() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1000.0
}

/// What one P14 run measured.
struct Scale {
    /// Start of the workers to every shard's first record delivered, seconds.
    cold_s: f64,
    /// Start to the last owner change of the cold start (see [`P14_QUIET`]), seconds.
    settle_s: f64,
    per_min: BTreeMap<&'static str, f64>,
    items_per_min: BTreeMap<&'static str, f64>,
    /// CPU seconds the process spent on one minute of the settled, idle fleet's life,
    /// and the real seconds that minute took.
    cpu_per_min_s: f64,
    wall_per_min_s: f64,
    /// RSS before the workers started (the stream and its records) and once settled, MB.
    rss_base_mb: f64,
    rss_mb: f64,
    /// How the fleet settled after a join and after a leave.
    join: Settled,
    leave: Settled,
    /// The spread of lease counts the cold start settled to.
    cold_spread: usize,
}

/// P14's "settled": no owner change for five heartbeat intervals (the time counts to
/// the last change), every lease held, none pending.
const P14_QUIET: Duration = Duration::from_secs(10);

/// `leases` shards with a record each, `workers` workers started together (defaults,
/// paused time), then a minute counted, a join, and a graceful leave.
async fn p14_run(leases: u32, workers: usize) -> Scale {
    let rig = Rig::new(leases).await;
    rig.put_one_each().await;
    let (table, backend) = counted_backend(&rig);
    let rss_base_mb = process_rss_mb();
    let t0 = Instant::now();
    let (names, mut ws) = start_fleet(&rig, &backend, workers).await;
    wait_for("every shard read", Duration::from_secs(600), async || {
        rig.log.with(|l| l.batches.len()) == leases as usize
    })
    .await;
    let cold_s = secs(t0.elapsed());
    let members: Vec<&str> = names.iter().map(String::as_str).collect();
    let cold = settle(&rig, &members, Some(P14_QUIET)).await;
    let settle_s = cold_s + cold.secs;
    tokio::time::sleep(Duration::from_secs(20)).await;
    let (cpu0, wall0) = (process_cpu_s(), std::time::Instant::now());
    let (per_min, items_per_min) = count_ops(&table, 1).await;
    let cpu_per_min_s = process_cpu_s() - cpu0;
    let wall_per_min_s = wall0.elapsed().as_secs_f64();
    let rss_mb = process_rss_mb();
    let joiner = format!("w{workers:02}");
    ws.push(
        rig.start(backend.clone(), settings(&joiner, false), false)
            .await,
    );
    let mut all = members.clone();
    all.push(&joiner);
    let join = settle(&rig, &all, Some(P14_QUIET)).await;
    tokio::time::sleep(Duration::from_secs(10)).await;
    // The graceful leave: the fleet settles while the shutdown runs.
    let leaver = ws.remove(0);
    let shutdown = tokio::spawn(leaver.shutdown());
    let leave = settle(&rig, &all[1..], Some(P14_QUIET)).await;
    shutdown.await.unwrap().unwrap();
    for w in ws {
        w.abort();
    }
    Scale {
        cold_s,
        settle_s,
        per_min,
        items_per_min,
        cpu_per_min_s,
        wall_per_min_s,
        rss_base_mb,
        rss_mb,
        join,
        leave,
        cold_spread: cold.spread,
    }
}

fn p14(n: usize, rows: &mut Vec<Row>) {
    // `FLEET_P14=leases,workers` runs another scale (e.g. 1000,10).
    let (leases, workers) = std::env::var("FLEET_P14")
        .ok()
        .and_then(|v| {
            let mut it = v.split(',').map(|x| x.trim().parse::<u64>().ok());
            Some((it.next()?? as u32, it.next()?? as usize))
        })
        .unwrap_or((10_000u32, 100usize));
    let hb = Settings::default().lease.heartbeat_interval.as_secs_f64();
    let w = workers as f64;
    let kcl_writes = f64::from(leases) / 3.3 * 60.0;
    let kcl_rows = w * 6.0 * f64::from(leases);
    let scale = format!("{leases} leases x {workers} workers");
    println!(
        "P14 scale, pure simulator: {scale}, join {} -> {}, leave back",
        workers,
        workers + 1
    );
    let t = std::time::Instant::now();
    let (j, jm, l, lm) = p5_sim(leases as usize, workers);
    println!(
        "  join: {j} rounds, max moves/lease {jm}; leave: {l} rounds, max moves/lease {lm} ({:.1} s of wall time)",
        t.elapsed().as_secs_f64()
    );
    rows.push(Row {
        id: "P14 sim".into(),
        what: format!("simulator {scale}: rounds (join +1, leave -1)"),
        values: vec![j as f64, l as f64],
        unit: "rnd",
        target: Some((3.0, j.max(l) as f64, "max")),
    });
    rows.push(Row {
        id: "P14 sim mv".into(),
        what: "simulator: most moves of one lease (join, leave)".into(),
        values: vec![f64::from(jm), f64::from(lm)],
        unit: "mv",
        target: Some((1.0, f64::from(jm.max(lm)), "max")),
    });
    println!(
        "P14 scale: {scale} in one process, defaults, paused time, memory backend, a record on every shard, {n} runs"
    );
    let mut v: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for i in 0..n {
        let wall = std::time::Instant::now();
        let s = paused_time().block_on(p14_run(leases, workers));
        let by_kind: Vec<String> = s
            .per_min
            .iter()
            .filter(|(_, x)| **x > 0.0)
            .map(|(op, x)| match s.items_per_min.get(op) {
                Some(items) => format!("{op} {x:.0} ({items:.0} items)"),
                None => format!("{op} {x:.0}"),
            })
            .collect();
        println!(
            "  run {i}: every shard read {:.1} s after the start ({:.1} rounds), last move at {:.1} s (spread {}); {:.0} s of wall time in all",
            s.cold_s,
            s.cold_s / hb,
            s.settle_s,
            s.cold_spread,
            wall.elapsed().as_secs_f64()
        );
        println!(
            "  run {i}: settled, table calls per minute by kind: {}",
            by_kind.join(", ")
        );
        println!(
            "  run {i}: one settled idle minute cost {:.2} s of CPU ({:.1} s of wall time); RSS {:.0} MB ({:.0} MB before the workers started)",
            s.cpu_per_min_s, s.wall_per_min_s, s.rss_mb, s.rss_base_mb
        );
        println!(
            "  run {i}: join {:.1} s ({:.1} rounds, {} leases moved, max {} moves, spread {}); leave {:.1} s ({:.1} rounds, {} moved, max {}, spread {})",
            s.join.secs,
            s.join.secs / hb,
            s.join.moved,
            s.join.max_moves,
            s.join.spread,
            s.leave.secs,
            s.leave.secs / hb,
            s.leave.moved,
            s.leave.max_moves,
            s.leave.spread
        );
        let writes: f64 = s
            .per_min
            .iter()
            .filter(|(op, _)| !READ_OPS.contains(op) && **op != "checkpoint")
            .map(|(_, x)| x)
            .sum();
        for (k, x) in [
            ("cold", s.cold_s),
            ("settle", s.settle_s),
            ("w", writes),
            ("cw", s.per_min["checkpoint"]),
            ("r", s.items_per_min.values().sum()),
            ("scans", s.per_min["scan"]),
            ("join", s.join.secs / hb),
            ("leave", s.leave.secs / hb),
            ("mv", f64::from(s.join.max_moves.max(s.leave.max_moves))),
            ("rss", s.rss_mb / w),
            ("rss_w", (s.rss_mb - s.rss_base_mb) / w),
            ("cpu", s.cpu_per_min_s / w),
        ] {
            v.entry(k).or_default().push(x);
        }
    }
    let mut row = |key: &str, id: &str, what: String, unit, target: Option<(f64, &'static str)>| {
        let values = v.remove(key).unwrap_or_default();
        let target = target.map(|(t, which)| {
            let (med, _, max) = median(&values);
            (t, if which == "max" { max } else { med }, which)
        });
        rows.push(Row {
            id: id.into(),
            what,
            values,
            unit,
            target,
        });
    };
    row(
        "cold",
        "P14 cold",
        format!(
            "{scale} started together: every shard's first record processed (P9: all shards read)"
        ),
        "s",
        Some((10.0, "median")),
    );
    row(
        "settle",
        "P14 settle",
        "start to the cold start's last owner change (then 10 s quiet, all held, none pending)"
            .into(),
        "s",
        None,
    );
    row(
        "w",
        "P14 w",
        format!(
            "settled: lease-table writes/min other than checkpoints (KCL model {kcl_writes:.0})"
        ),
        "w/min",
        Some((kcl_writes / 10.0, "median")),
    );
    row(
        "cw",
        "P14 cw",
        "settled: checkpoint writes/min (every record already checkpointed)".into(),
        "w/min",
        None,
    );
    row(
        "r",
        "P14 r",
        format!(
            "settled: rows read/min, scan rows + heartbeat items + gets (KCL model {kcl_rows:.0})"
        ),
        "rows/min",
        Some((kcl_rows / 10.0, "median")),
    );
    row(
        "scans",
        "P14 scans",
        "settled: scans/min".into(),
        "/min",
        None,
    );
    row(
        "join",
        "P14 join",
        format!(
            "join {workers} -> {}: rounds (heartbeat intervals) to the last owner change (10 s quiet after, none pending)",
            workers + 1
        ),
        "rnd",
        Some((3.0, "max")),
    );
    row(
        "leave",
        "P14 leave",
        format!(
            "graceful leave {} -> {workers}: rounds to the last owner change",
            workers + 1
        ),
        "rnd",
        Some((3.0, "max")),
    );
    row(
        "mv",
        "P14 mv",
        "most moves of one lease (join or leave)".into(),
        "mv",
        Some((1.0, "max")),
    );
    row(
        "rss",
        "P14 rss",
        "process RSS / workers (all workers, the memory stream and table in one process)".into(),
        "MB",
        Some((150.0, "max")),
    );
    row(
        "rss_w",
        "P14 rss w",
        "(RSS settled - RSS before the workers) / workers".into(),
        "MB",
        Some((150.0, "max")),
    );
    row("cpu", "P14 cpu", "process CPU seconds per worker per minute of settled idle virtual time (all the rounds a minute costs)".into(), "s", None);
}

/// P14i: a smaller fleet idling in real time, its CPU share per worker. `leases`
/// shards with a record each, `workers` workers; once quiet, the process's CPU time over
/// `seconds` of real time.
async fn p14i_run(leases: u32, workers: usize, seconds: u64) -> f64 {
    let rig = Rig::new(leases).await;
    rig.put_one_each().await;
    let (_, backend) = counted_backend(&rig);
    let (names, ws) = start_fleet(&rig, &backend, workers).await;
    let members: Vec<&str> = names.iter().map(String::as_str).collect();
    settle(&rig, &members, Some(P14_QUIET)).await;
    let (cpu0, wall0) = (process_cpu_s(), std::time::Instant::now());
    tokio::time::sleep(Duration::from_secs(seconds)).await;
    let cpu = process_cpu_s() - cpu0;
    let wall = wall0.elapsed().as_secs_f64();
    for w in ws {
        w.abort();
    }
    cpu / wall * 100.0 / workers as f64
}

fn p14i(n: usize, rows: &mut Vec<Row>) {
    // `FLEET_P14I=leases,workers,seconds`; default 1,000 x 10 for 60 s.
    let (leases, workers, seconds) = std::env::var("FLEET_P14I")
        .ok()
        .and_then(|v| {
            let mut it = v.split(',').map(|x| x.trim().parse::<u64>().ok());
            Some((it.next()?? as u32, it.next()?? as usize, it.next()??))
        })
        .unwrap_or((1000u32, 10usize, 60u64));
    println!(
        "P14i idle CPU in real time: {leases} leases x {workers} workers in one process, defaults, memory backend, {seconds} s after settling, {n} runs"
    );
    let mut v = Vec::new();
    for i in 0..n {
        let pct = real_time().block_on(p14i_run(leases, workers, seconds));
        println!("  run {i}: {pct:.3} % of one core per worker");
        v.push(pct);
    }
    rows.push(Row {
        id: "P14i cpu".into(),
        what: format!(
            "idle CPU per worker, real time, {leases} leases x {workers} workers (process CPU / wall / workers)"
        ),
        values: v,
        unit: "%",
        target: None,
    });
}

// ---------------------------------------------------------------- P9 cold start

/// The child: a fresh process with a pre-loaded memory stream and an existing table;
/// prints "first" at the first delivery and "all" once every shard has delivered.
fn p9_child(shards: u32) {
    let rt = real_time();
    rt.block_on(async {
        let rig = Rig::new(shards).await;
        rig.put_one_each().await;
        rig.dynamo.lease_table(APP).ensure_table().await.unwrap();
        println!("ready");
        let w = rig
            .start(rig.backend(), settings("cold", false), false)
            .await;
        let mut first = false;
        loop {
            let (any, n) = rig.log.with(|l| (l.delivered > 0, l.batches.len()));
            if any && !first {
                println!("first");
                first = true;
            }
            if n == shards as usize {
                println!("all");
                break;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        w.abort();
    });
    std::process::exit(0);
}

/// spawn -> "ready", "first", "all" (seconds).
fn p9_run(shards: u32) -> (f64, f64, f64) {
    let exe = std::env::current_exe().unwrap();
    let t0 = std::time::Instant::now();
    let mut child = Command::new(exe)
        .args(["--p9-child", &shards.to_string()])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let mut at = HashMap::new();
    for line in out.lines() {
        at.insert(line.unwrap(), t0.elapsed().as_secs_f64());
    }
    child.wait().unwrap();
    (at["ready"], at["first"], at["all"])
}

fn p9(n: usize, rows: &mut Vec<Row>) {
    println!("P9 cold start (child process, memory backend, records pre-loaded), {n} runs");
    for (shards, target) in [(4u32, 1.0), (1000, 10.0)] {
        let mut v = Vec::new();
        for i in 0..n {
            let (ready, first, all) = p9_run(shards);
            println!(
                "  {shards} shards run {i}: spawn->ready {ready:.3} s, ->first record {first:.3} s, ->all shards {all:.3} s"
            );
            v.push(if shards == 4 { first } else { all });
        }
        let (med, _, _) = median(&v);
        rows.push(Row {
            id: if shards == 4 {
                "P9".into()
            } else {
                "P9 all".into()
            },
            what: if shards == 4 {
                "cold start: spawn -> first record (4 shards)".into()
            } else {
                "cold start: spawn -> every one of 1,000 shards delivered".into()
            },
            values: v,
            unit: "s",
            target: Some((target, med, "median")),
        });
    }
}

// ---------------------------------------------------------------- main

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if let Some(i) = args.iter().position(|a| a == "--p9-child") {
        p9_child(args[i + 1].parse().unwrap());
    }
    let filter = args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .map(|a| a.to_lowercase());
    let want = |id: &str| filter.as_deref().is_none_or(|f| id.starts_with(f));
    let mut rows = Vec::new();
    for case in P3_CASES {
        if want(&case.id.to_lowercase()) {
            p3(case, runs(10), &mut rows);
        }
    }
    if want("p3e") {
        p3e(runs(10), &mut rows);
    }
    if want("p4") {
        p4(false, runs(5), &mut rows);
        p4(true, runs(5), &mut rows);
    }
    if want("p5") {
        p5(runs(5), &mut rows);
    }
    if want("p6") {
        p6(runs(3), &mut rows);
    }
    if want("p9") {
        p9(runs(5), &mut rows);
    }
    if want("p13") {
        p13(runs(5), &mut rows);
    }
    if want("p13r") {
        p13r(runs(3), &mut rows);
    }
    if want("p14") {
        p14(runs(1), &mut rows);
    }
    if want("p14i") {
        p14i(runs(3), &mut rows);
    }
    println!();
    println!("| id | what | n | median | min | max | target | ratio to target |");
    println!("|---|---|---|---|---|---|---|---|");
    for r in rows {
        let (med, min, max) = median(&r.values);
        let (target, ratio) = match r.target {
            Some((t, v, which)) if t > 0.0 => (
                format!("≤ {t:.1} {} ({which})", r.unit),
                format!("{:.2} ({which} {v:.2})", v / t),
            ),
            Some((t, v, which)) => (format!("{t} ({which})"), format!("{which} = {v}")),
            None => ("—".into(), "—".into()),
        };
        println!(
            "| {} | {} | {} | {:.3} {u} | {:.3} {u} | {:.3} {u} | {target} | {ratio} |",
            r.id,
            r.what,
            r.values.len(),
            med,
            min,
            max,
            u = r.unit
        );
    }
}
