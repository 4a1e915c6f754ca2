//! The soak that chose the lease defaults (issue 34, part 1): false failovers on an
//! oversubscribed host, at three lease settings side by side in one run.
//!
//! ```text
//! FLOTILLA_TEST_CMD='cargo bench --features flotilla-actors/external-servers --bench soak' scripts/test.sh
//! ```
//!
//! Three fleets run at once on the same servers (kinesis-mock and DynamoDB Local, started
//! by scripts/test.sh), one per setting (`lease.failover_time` / `heartbeat_interval` /
//! `fence_margin`): 10 s / 2 s / 3 s (the KCL's figure, the defaults before), 5 s / 1 s /
//! 1 s and 4 s / 1 s / 1 s. Each fleet is 3 `flotilla run` workers on a stream of its own
//! (6 shards, a record of each of 12 keys every 200 ms) and a lease table of its own. Once
//! every fleet has settled (2 leases a worker), `SOAK_BUSY_PER_CORE` (4) busy processes per
//! core start beside them, and every 15 to 45 s the host of each fleet's third worker
//! stalls: SIGSTOP for 1 to 3 s (uniform), then SIGCONT, the same stall for the three
//! fleets at once. After `SOAK_MINUTES` (30) the load stops, the producers stop and the
//! fleets catch up.
//!
//! A false failover is a lease taken because its owner's heartbeat expired (a
//! `lease_moved` line with reason `expired` in a taker's log), when no worker died: every
//! one here is false. Beside it, per setting: the stalled worker's self-fencing pauses
//! (`Delivery paused (self-fencing).`, safe but a pause in delivery), owner changes the
//! lease-table scans saw, and what the records say (lost, delivered twice, out of order).
//! `SOAK_SEED` (1) seeds the stall schedule. Not part of CI: it takes `SOAK_MINUTES` plus
//! a few minutes. BENCHMARKS.md, "Failover defaults", has the results.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a broken setup stops it loudly

#[path = "../tests/fleet/mod.rs"]
#[allow(dead_code)] // the harness serves the test binaries too
mod fleet;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use fleet::{Env, Fleet, Leases, Produced, Producer, order_of};

/// A lease setting under test.
#[derive(Debug, Clone, Copy)]
struct Setting {
    failover: u64,
    heartbeat: u64,
    fence_margin: u64,
}

impl Setting {
    fn label(self) -> String {
        format!("{} s / {} s", self.failover, self.heartbeat)
    }

    fn tag(self) -> String {
        format!("f{}h{}", self.failover, self.heartbeat)
    }
}

const SETTINGS: [Setting; 3] = [
    Setting {
        failover: 10,
        heartbeat: 2,
        fence_margin: 3,
    },
    Setting {
        failover: 5,
        heartbeat: 1,
        fence_margin: 1,
    },
    Setting {
        failover: 4,
        heartbeat: 1,
        fence_margin: 1,
    },
];

const SHARDS: u32 = 6;
const WORKERS: usize = 3;
const KEYS: u32 = 12;
const PRODUCE_EVERY: Duration = Duration::from_millis(200);
/// Until every fleet holds its leases 2 a worker, steadily.
const SETTLE_LIMIT: Duration = Duration::from_secs(240);
const SETTLED_FOR: Duration = Duration::from_secs(10);
/// Once the producers stop, until every record is delivered.
const CATCH_UP_LIMIT: Duration = Duration::from_secs(180);

/// One fleet at one setting.
struct Run {
    setting: Setting,
    env: Env,
    fleet: Fleet,
    producer: Option<Producer>,
    /// The worker whose host stalls.
    stalled: String,
    workers: Vec<String>,
    /// Open leases' owners at the last scan, and owner changes seen since settling.
    owners: BTreeMap<String, Option<String>>,
    owner_changes: Vec<String>,
}

/// A small deterministic generator (xorshift64*) for the stall schedule.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `[low, high]` seconds, to the millisecond.
    fn between(&mut self, low: f64, high: f64) -> Duration {
        let unit = (self.next() % 1_000_001) as f64 / 1_000_000.0;
        Duration::from_secs_f64(low + (high - low) * unit)
    }
}

/// Busy processes: `sh` spinning, killed on drop.
struct Busy(Vec<Child>);

impl Busy {
    fn start(count: usize) -> Self {
        Self(
            (0..count)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .spawn()
                        .unwrap()
                })
                .collect(),
        )
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn load_average() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// Lines of a worker's log that contain every one of `needles`.
fn log_lines(path: &Path, needles: &[&str]) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|line| needles.iter().all(|n| line.contains(n)))
        .map(str::to_owned)
        .collect()
}

/// Every worker holds `SHARDS / WORKERS` open leases and every lease is owned.
fn even(leases: &Leases, workers: &[String]) -> bool {
    let per = SHARDS as usize / WORKERS;
    leases.all_owned() && workers.iter().all(|w| leases.held_by(w).len() == per)
}

async fn start(setting: Setting) -> Run {
    let tag = setting.tag();
    let env = Env::new(&format!("soak-{tag}"), SHARDS).await;
    let mut fleet = Fleet::new("soak");
    let (failover, heartbeat, margin) = (
        format!("{}s", setting.failover),
        format!("{}s", setting.heartbeat),
        format!("{}s", setting.fence_margin),
    );
    let workers: Vec<String> = (0..WORKERS).map(|i| format!("{tag}-w{i}")).collect();
    for id in &workers {
        fleet.spawn_with(
            &env,
            id,
            &[
                ("FLOTILLA__LEASE__FAILOVER_TIME", &failover),
                ("FLOTILLA__LEASE__HEARTBEAT_INTERVAL", &heartbeat),
                ("FLOTILLA__LEASE__FENCE_MARGIN", &margin),
            ],
        );
    }
    let producer = Some(Producer::start_keys(&env, KEYS, PRODUCE_EVERY));
    Run {
        setting,
        env,
        fleet,
        producer,
        stalled: workers[WORKERS - 1].clone(),
        workers,
        owners: BTreeMap::new(),
        owner_changes: Vec::new(),
    }
}

/// Waits until every fleet is even and stays even for `SETTLED_FOR`.
async fn settle(runs: &mut [Run]) {
    let started = Instant::now();
    let mut even_since: Option<Instant> = None;
    loop {
        let mut all_even = true;
        for run in runs.iter() {
            let leases = run.env.leases().await;
            all_even &= even(&leases, &run.workers);
        }
        match (all_even, even_since) {
            (true, Some(since)) if since.elapsed() >= SETTLED_FOR => break,
            (true, None) => even_since = Some(Instant::now()),
            (false, _) => even_since = None,
            _ => {}
        }
        assert!(
            started.elapsed() < SETTLE_LIMIT,
            "the fleets did not settle in {SETTLE_LIMIT:?}:\n{}",
            runs.iter()
                .map(|r| r.fleet.diagnostics())
                .collect::<String>()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for run in runs.iter_mut() {
        run.owners = run.env.leases().await.open;
    }
    eprintln!("soak: settled after {:?}", started.elapsed());
}

/// Scans each fleet's lease table and files owner changes since the last scan.
async fn scan(runs: &mut [Run], soak_start: Instant) {
    for run in runs.iter_mut() {
        let open = run.env.leases().await.open;
        for (key, owner) in &open {
            let before = run.owners.get(key).cloned().flatten();
            if before.as_ref() != owner.as_ref() {
                run.owner_changes.push(format!(
                    "+{:.1} s {key}: {} -> {}",
                    soak_start.elapsed().as_secs_f64(),
                    before.as_deref().unwrap_or("nobody"),
                    owner.as_deref().unwrap_or("nobody")
                ));
            }
        }
        run.owners = open;
    }
}

/// What the records of one fleet say at the end.
struct OrderSummary {
    produced: u64,
    lost: u64,
    duplicates: u64,
    violations: u64,
}

struct Stall {
    at: SystemTime,
    since_start: Duration,
    length: Duration,
}

async fn soak(runs: &mut [Run], minutes: u64, busy_per_core: usize, seed: u64) -> Vec<Stall> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let busy = Busy::start(cores * busy_per_core);
    eprintln!(
        "soak: {} busy processes on {cores} cores, {minutes} min",
        cores * busy_per_core
    );
    let mut rng = Rng(seed.max(1).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
    let start = Instant::now();
    let end = start + Duration::from_secs(minutes * 60);
    let mut stalls = Vec::new();
    let mut loads = Vec::new();
    let mut next_stall = start + rng.between(15.0, 45.0);
    let mut next_report = start + Duration::from_secs(60);
    while Instant::now() < end {
        if Instant::now() >= next_stall {
            let length = rng.between(1.0, 3.0);
            let (at, since_start) = (SystemTime::now(), start.elapsed());
            for run in runs.iter_mut() {
                let id = run.stalled.clone();
                run.fleet.pause(&id);
            }
            tokio::time::sleep(length).await;
            for run in runs.iter_mut() {
                let id = run.stalled.clone();
                run.fleet.resume(&id);
            }
            stalls.push(Stall {
                at,
                since_start,
                length,
            });
            next_stall = Instant::now() + rng.between(15.0, 45.0);
        }
        scan(runs, start).await;
        loads.push(load_average());
        if Instant::now() >= next_report {
            next_report += Duration::from_secs(60);
            let taken: Vec<usize> = runs.iter().map(|r| false_failovers(r).len()).collect();
            eprintln!(
                "soak: +{} min, {} stalls, load {:.1}, expired takes per setting {taken:?}",
                start.elapsed().as_secs() / 60,
                stalls.len(),
                load_average(),
            );
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    drop(busy);
    let mean = loads.iter().sum::<f64>() / loads.len().max(1) as f64;
    println!(
        "soak: {minutes} min, {} busy processes on {cores} cores, load average (1 min) mean {mean:.1}, {} stalls",
        cores * busy_per_core,
        stalls.len()
    );
    stalls
}

fn worker_log(run: &Run, id: &str) -> std::path::PathBuf {
    run.env.dir.join(format!("{id}.log"))
}

/// `lease_moved` lines with reason `expired`, in every worker's log of the run.
fn false_failovers(run: &Run) -> Vec<String> {
    run.workers
        .iter()
        .flat_map(|id| log_lines(&worker_log(run, id), &["lease_moved", "expired"]))
        .collect()
}

/// `lease_moved` lines of every worker's log of the run, by their `reason`.
fn moves_by_reason(run: &Run) -> BTreeMap<String, usize> {
    let mut reasons = BTreeMap::new();
    for id in &run.workers {
        for line in log_lines(&worker_log(run, id), &["lease_moved"]) {
            let reason = line
                .split_whitespace()
                .find_map(|field| field.strip_prefix("reason="))
                .unwrap_or("?")
                .trim_matches('"')
                .to_owned();
            *reasons.entry(reason).or_insert(0) += 1;
        }
    }
    reasons
}

/// `after` less `before`, reason by reason, leaving out zeros.
fn moves_since(before: &BTreeMap<String, usize>, after: &BTreeMap<String, usize>) -> String {
    let moved: Vec<String> = after
        .iter()
        .filter_map(|(reason, &n)| {
            let n = n - before.get(reason).copied().unwrap_or(0).min(n);
            (n > 0).then(|| format!("{reason} {n}"))
        })
        .collect();
    if moved.is_empty() {
        "none".into()
    } else {
        moved.join(", ")
    }
}

async fn finish(runs: &mut [Run]) -> Vec<(Produced, OrderSummary)> {
    let mut produced = Vec::new();
    for run in runs.iter_mut() {
        produced.push(run.producer.take().unwrap().stop().await);
    }
    let started = Instant::now();
    loop {
        let lost: Vec<u64> = runs
            .iter()
            .zip(&produced)
            .map(|(run, p)| {
                let deliveries = run.fleet.deliveries();
                order_of(&deliveries).lost(p.counts())
            })
            .collect();
        if lost.iter().all(|&n| n == 0) || started.elapsed() > CATCH_UP_LIMIT {
            break;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    runs.iter()
        .zip(produced)
        .map(|(run, p)| {
            let check = order_of(&run.fleet.deliveries());
            let summary = OrderSummary {
                produced: p.total(),
                lost: check.lost(p.counts()),
                duplicates: check.duplicates(),
                violations: check.violations(),
            };
            (p, summary)
        })
        .collect()
}

fn main() {
    let minutes = env_number("SOAK_MINUTES", 30);
    let busy_per_core = env_number("SOAK_BUSY_PER_CORE", 4) as usize;
    let seed = env_number("SOAK_SEED", 1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut runs = Vec::new();
        for setting in SETTINGS {
            runs.push(start(setting).await);
        }
        settle(&mut runs).await;
        let moves_before: Vec<_> = runs.iter().map(moves_by_reason).collect();
        let stalls = soak(&mut runs, minutes, busy_per_core, seed).await;
        let records = finish(&mut runs).await;

        let longest = stalls.iter().map(|s| s.length).max().unwrap_or_default();
        let over = |secs: f64| stalls.iter().filter(|s| s.length.as_secs_f64() >= secs).count();
        println!(
            "stalls: {} (≥ 2 s: {}, ≥ 2.5 s: {}), longest {:.2} s",
            stalls.len(),
            over(2.0),
            over(2.5),
            longest.as_secs_f64()
        );
        println!();
        println!(
            "| failover / heartbeat (fence margin) | false failovers (leases taken from a live worker) | stalls that caused one | self-fencing pauses of the stalled worker | owner changes seen | records produced | lost | delivered twice | out of order |"
        );
        println!("|---|---|---|---|---|---|---|---|---|");
        for (run, (_, summary)) in runs.iter().zip(&records) {
            let taken = false_failovers(run);
            let pauses = log_lines(
                &worker_log(run, &run.stalled),
                &["Delivery paused (self-fencing)."],
            )
            .len();
            let causing = stalls_causing(&stalls, &taken);
            println!(
                "| {} ({} s) | {} | {} | {} | {} | {} | {} | {} | {} |",
                run.setting.label(),
                run.setting.fence_margin,
                taken.len(),
                causing,
                pauses,
                run.owner_changes.len(),
                summary.produced,
                summary.lost,
                summary.duplicates,
                summary.violations,
            );
        }
        println!();
        for (run, before) in runs.iter().zip(&moves_before) {
            println!(
                "{}: lease moves logged during the soak (each logged by giver and taker): {}",
                run.setting.label(),
                moves_since(before, &moves_by_reason(run))
            );
        }
        println!();
        for run in &runs {
            for line in false_failovers(run) {
                println!("{} expired take: {line}", run.setting.label());
            }
            for change in &run.owner_changes {
                println!("{} owner change: {change}", run.setting.label());
            }
        }
        println!();
        for stall in &stalls {
            println!(
                "stall at +{:.1} s ({}): {:.2} s",
                stall.since_start.as_secs_f64(),
                humantime::format_rfc3339_millis(stall.at),
                stall.length.as_secs_f64()
            );
        }
    });
}

/// Stalls followed, within 15 s of their start, by an expired take in `taken` (the log
/// lines start with an RFC 3339 UTC timestamp).
fn stalls_causing(stalls: &[Stall], taken: &[String]) -> String {
    let times: Vec<SystemTime> = taken.iter().filter_map(|l| log_time(l)).collect();
    let lengths: Vec<String> = stalls
        .iter()
        .filter(|s| {
            times.iter().any(|t| {
                t.duration_since(s.at)
                    .is_ok_and(|d| d < Duration::from_secs(15))
            })
        })
        .map(|s| format!("{:.2} s", s.length.as_secs_f64()))
        .collect();
    if lengths.is_empty() {
        "-".into()
    } else {
        format!("{} ({})", lengths.len(), lengths.join(", "))
    }
}

/// The timestamp a log line starts with (`2026-11-29T02:41:07.123456Z`).
fn log_time(line: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339_weak(line.split_whitespace().next()?).ok()
}
