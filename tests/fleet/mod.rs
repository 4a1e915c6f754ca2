//! A harness for fleets of `flotilla run` processes against the external servers
//! started by `scripts/test.sh` (DynamoDB Local and kinesis-mock).
//!
//! * [`Env`]: a fresh stream and lease table on the servers, the SDK clients to reach
//!   them, and a raw DynamoDB scan of the lease table ([`Env::leases`]), independent of
//!   the library's own parsing.
//! * [`Fleet`]: worker processes, each `flotilla run --config FILE` with its own worker
//!   id. A thread per process reads its stdout line by line as it arrives, stamps each
//!   line with `Instant::now()` and files it as a [`Delivery`]. Stderr goes to a log file
//!   per worker under `CARGO_TARGET_TMPDIR`, kept when the test fails. Dropping the
//!   fleet kills every process still running (a failed test leaves no stray workers)
//!   and, when the test is panicking, prints the end of each worker's log.
//! * [`TableEnv`] and [`TableWriter`]: the same for a DynamoDB Local table's change
//!   stream: a fresh table with a stream and lease table, and a writer of item rounds
//!   keeping the changes owed per item ([`changes::Model`]); workers get the source by
//!   `FLOTILLA__…` variables ([`Fleet::spawn_on_table`]). A line of such a worker
//!   carries its change as a `change` object ([`Delivery::change`]).
//! * [`Producer`]: writes per-key sequences (`k7:123` is the 124th record of key `k7`)
//!   with PutRecords while the test runs. Each key has a fixed explicit hash key, spread
//!   evenly over the key space, so every shard (and every child of a split) gets keys.
//! * [`order_of`]: the deliveries through the library's per-key order oracle.
//! * [`report`]: measurement lines `fleet[TAG]: ...` written straight to the process's
//!   stderr, past libtest's capture, so they show in every run and in the summary of
//!   scripts/test.sh.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fs::File;
use std::io::{BufRead as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use flotilla_actors::backend::aws::{DynamoLeaseTable, DynamoStreams, KinesisStream};
use flotilla_actors::backend::{
    LeaseTable as _, StreamAdmin as _, StreamClient as _, TableStreamAdmin as _,
};
use flotilla_actors::model::Shard;
use flotilla_actors::oracle::{KeyedProducer, OrderCheck};

#[path = "../../actors/tests/support/servers.rs"]
#[allow(dead_code)] // the in-process servers there are not used here
mod servers;

/// Workers of the real Java KCL 2.5.8 in a [`Fleet`] (only tests/kcl.rs starts them).
#[allow(dead_code)]
pub mod kcl;

/// A small Java KCL 2.5.8 application using the KCL's API directly (prepared checkpoints,
/// which MultiLang cannot express); only tests/kcl_prepared.rs starts it.
#[allow(dead_code)]
pub mod java_app;

/// Items of a table with a stream, and the changes owed for them.
#[path = "../../actors/tests/support/changes.rs"]
#[allow(dead_code)]
pub mod changes;

/// Lease timings of every worker: short, so failover shows within seconds.
pub const FAILOVER_SECS: u64 = 4;
const HEARTBEAT_INTERVAL: &str = "1s";
const FENCE_MARGIN: &str = "1s";
/// `supervision.shutdown_timeout` of every worker.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(10);

/// Partition keys `k0` .. `k63`.
pub const KEYS: u32 = 64;
/// The producer puts one record of every key per tick.
const PRODUCE_EVERY: Duration = Duration::from_millis(200);
/// Attempts at one PutRecords batch before the producer gives up.
const PUT_ATTEMPTS: u32 = 5;

/// Writes `fleet[tag]: line` for each line of `text` to the process's stderr. Not
/// through `eprintln!`, which libtest captures: these are the measurements, wanted in
/// every run.
pub fn report(tag: &str, text: &str) {
    let mut err = std::io::stderr().lock();
    for line in text.lines() {
        let _ = writeln!(err, "fleet[{tag}]: {line}");
    }
}

/// Milliseconds, for reports.
pub fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

// ---------------------------------------------------------------------------------------
// Servers, stream, lease table
// ---------------------------------------------------------------------------------------

/// One stream and one application (lease table) on the external servers.
pub struct Env {
    pub kinesis: KinesisStream,
    dynamodb: aws_sdk_dynamodb::Client,
    pub stream: String,
    pub application: String,
    kinesis_endpoint: String,
    dynamodb_endpoint: String,
    /// Worker settings files and logs.
    pub dir: PathBuf,
}

/// The lease table as one scan saw it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Leases {
    /// Leases not finished (checkpoint other than SHARD_END): lease key to owner.
    pub open: BTreeMap<String, Option<String>>,
    /// Leases at SHARD_END.
    pub finished: BTreeSet<String>,
    /// Workers with a heartbeat row.
    pub heartbeats: BTreeSet<String>,
}

impl Leases {
    /// The open leases `worker` holds.
    pub fn held_by(&self, worker: &str) -> Vec<String> {
        self.open
            .iter()
            .filter(|(_, owner)| owner.as_deref() == Some(worker))
            .map(|(key, _)| key.clone())
            .collect()
    }

    /// Open leases per owner; unowned ones under `-`.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for owner in self.open.values() {
            *counts
                .entry(owner.clone().unwrap_or_else(|| "-".to_owned()))
                .or_insert(0) += 1;
        }
        counts
    }

    pub fn all_owned(&self) -> bool {
        !self.open.is_empty() && self.open.values().all(Option::is_some)
    }
}

impl Env {
    /// A new stream of `shards` shards (ACTIVE on return) and a new, empty lease table.
    /// Panics unless scripts/test.sh set the servers' endpoints.
    pub async fn new(prefix: &str, shards: u32) -> Self {
        let kinesis_endpoint = servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT");
        let dynamodb_endpoint = servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT");
        let sdk = servers::sdk_config();
        let kinesis = KinesisStream::new(&sdk, Some(&kinesis_endpoint));
        let stream = servers::unique_name(prefix);
        kinesis.create_stream(&stream, shards).await.unwrap();
        let (application, dynamodb, dir) =
            application_on(&sdk, &dynamodb_endpoint, prefix, &stream).await;
        Self {
            kinesis,
            dynamodb,
            stream,
            application,
            kinesis_endpoint,
            dynamodb_endpoint,
            dir,
        }
    }

    /// The open shards, in hash-key order.
    pub async fn open_shards(&self) -> Vec<Shard> {
        let mut open: Vec<Shard> = self
            .kinesis
            .list_shards(&self.stream)
            .await
            .unwrap()
            .into_iter()
            .filter(Shard::is_open)
            .collect();
        open.sort_by_key(|s| s.hash_range.start);
        open
    }

    /// A full scan of the lease table with the DynamoDB API (`scan_leases`).
    pub async fn leases(&self) -> Leases {
        scan_leases(&self.dynamodb, &self.application).await
    }

    /// The settings file of worker `id`.
    fn worker_config(&self, id: &str) -> PathBuf {
        // scripts/test.sh runs the fleet once in each read mode.
        let text = worker_settings(
            WorkerPlace {
                stream: &self.stream,
                application: &self.application,
                kinesis: &self.kinesis_endpoint,
                dynamodb: &self.dynamodb_endpoint,
            },
            id,
            &common_settings(&read_mode()),
        );
        let path = self.dir.join(format!("{id}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }
}

/// Where a `flotilla run` worker reads and keeps its leases.
pub struct WorkerPlace<'a> {
    pub stream: &'a str,
    pub application: &'a str,
    pub kinesis: &'a str,
    pub dynamodb: &'a str,
}

/// A `flotilla run` settings file for worker `id` at `place`, from TRIM_HORIZON:
/// flotilla's defaults but `settings` (whole TOML sections, `[lease]` to `[status]`).
/// One text for the fleet and the real-KCL harness.
pub fn worker_settings(place: WorkerPlace<'_>, id: &str, settings: &str) -> String {
    format!(
        "[worker]\n\
         stream = \"{stream}\"\n\
         application = \"{application}\"\n\
         worker_id = \"{id}\"\n\
         initial_position = \"TRIM_HORIZON\"\n\
         {settings}\
         [aws]\n\
         region = \"us-east-1\"\n\
         kinesis_endpoint = \"{kinesis}\"\n\
         dynamodb_endpoint = \"{dynamodb}\"\n",
        stream = place.stream,
        application = place.application,
        kinesis = place.kinesis,
        dynamodb = place.dynamodb,
    )
}

/// The read mode of this run: `polling`, or `fanout` in scripts/test.sh's fan-out pass
/// (`FLOTILLA_TEST_READ_MODE`).
pub fn read_mode() -> String {
    std::env::var("FLOTILLA_TEST_READ_MODE").unwrap_or_else(|_| "polling".into())
}

/// Every worker's settings from `[lease]` to `[status]`: the fleet's short timings,
/// reading in `mode`.
fn common_settings(mode: &str) -> String {
    format!(
        "[lease]\n\
         failover_time = \"{FAILOVER_SECS}s\"\n\
         heartbeat_interval = \"{HEARTBEAT_INTERVAL}\"\n\
         fence_margin = \"{FENCE_MARGIN}\"\n\
         [reader]\n\
         mode = \"{mode}\"\n\
         poll_interval = \"100ms\"\n\
         idle_max = \"200ms\"\n\
         parent_poll_interval = \"200ms\"\n\
         shard_sync_interval = \"2s\"\n\
         backoff_max = \"1s\"\n\
         [checkpoint]\n\
         interval = \"1s\"\n\
         [supervision]\n\
         shutdown_timeout = \"{shutdown}s\"\n\
         [metrics]\n\
         level = \"none\"\n\
         [status]\n\
         bind = \"127.0.0.1:0\"\n",
        shutdown = SHUTDOWN_TIMEOUT.as_secs(),
    )
}

/// A full scan of `application`'s lease table with the DynamoDB API: `leaseKey`,
/// `leaseOwner` and `checkpoint` of each row, and the heartbeat rows of its worker table
/// (`APPLICATION-FlotillaWorkers`). Panics on a row of flotilla's own in the lease table,
/// or on one without a numeric `leaseCounter`: the Java KCL reads every row there as a
/// lease. Rows of another `entityType` (another program's) are skipped.
pub async fn scan_leases(dynamodb: &aws_sdk_dynamodb::Client, application: &str) -> Leases {
    let mut leases = Leases::default();
    for item in scan_all(dynamodb, application).await {
        let text = |name: &str| match item.get(name) {
            Some(AttributeValue::S(s)) => Some(s.clone()),
            _ => None,
        };
        let Some(key) = text("leaseKey") else {
            continue;
        };
        assert!(
            !key.starts_with("flotilla-"),
            "flotilla's own row {key} in the lease table {application}: the Java KCL cannot read it"
        );
        if text("entityType").is_some_and(|t| t != "LEASE") {
            continue;
        }
        assert!(
            matches!(item.get("leaseCounter"), Some(AttributeValue::N(_))),
            "lease row {key} has no numeric leaseCounter: {item:?}"
        );
        if text("checkpoint").as_deref() == Some("SHARD_END") {
            leases.finished.insert(key);
        } else {
            leases.open.insert(key, text("leaseOwner"));
        }
    }
    let workers = format!("{application}-FlotillaWorkers");
    for item in scan_all(dynamodb, &workers).await {
        if let Some(AttributeValue::S(key)) = item.get("leaseKey")
            && let Some(worker) = key.strip_prefix("flotilla-worker#")
        {
            leases.heartbeats.insert(worker.to_owned());
        }
    }
    leases
}

/// Every item of `table` (none if it does not exist yet), every page.
async fn scan_all(
    dynamodb: &aws_sdk_dynamodb::Client,
    table: &str,
) -> Vec<std::collections::HashMap<String, AttributeValue>> {
    let mut items = Vec::new();
    let mut start = None;
    loop {
        let page = match dynamodb
            .scan()
            .table_name(table)
            .consistent_read(true)
            .set_exclusive_start_key(start)
            .send()
            .await
        {
            Ok(page) => page,
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_resource_not_found_exception()) =>
            {
                return items;
            }
            Err(err) => panic!("scan of {table}: {err:?}"),
        };
        items.extend(page.items().iter().cloned());
        match page.last_evaluated_key() {
            Some(last) if !last.is_empty() => start = Some(last.clone()),
            _ => return items,
        }
    }
}

/// Worker logs are kept for a failed test only.
impl Drop for Env {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A table with a stream on DynamoDB Local and one application (lease table), for
/// workers that read the table's changes. Their settings file holds all but the source:
/// `worker.stream` and `aws.dynamodb_endpoint` come from the environment
/// (`FLOTILLA__WORKER__STREAM`, `FLOTILLA__AWS__DYNAMODB_ENDPOINT`), see
/// [`Fleet::spawn_on_table`].
pub struct TableEnv {
    pub streams: DynamoStreams,
    dynamodb: aws_sdk_dynamodb::Client,
    pub table: String,
    /// The table's stream.
    pub arn: String,
    pub application: String,
    dynamodb_endpoint: String,
    /// Worker settings files and logs.
    pub dir: PathBuf,
}

impl TableEnv {
    /// A new table with a stream (ACTIVE on return) and a new, empty lease table. Panics
    /// unless scripts/test.sh set DynamoDB Local's endpoint.
    pub async fn new(prefix: &str) -> Self {
        let dynamodb_endpoint = servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT");
        let sdk = servers::sdk_config();
        let streams = DynamoStreams::new(&sdk, Some(&dynamodb_endpoint));
        let table = servers::unique_name(prefix);
        let arn = streams.create_table_with_stream(&table).await.unwrap();
        let (application, dynamodb, dir) =
            application_on(&sdk, &dynamodb_endpoint, prefix, &table).await;
        Self {
            streams,
            dynamodb,
            table,
            arn,
            application,
            dynamodb_endpoint,
            dir,
        }
    }

    pub async fn leases(&self) -> Leases {
        scan_leases(&self.dynamodb, &self.application).await
    }

    /// The settings file of worker `id`, reading in `mode`; no source in it.
    fn worker_config(&self, id: &str, mode: &str) -> PathBuf {
        let text = format!(
            "[worker]\n\
             application = \"{application}\"\n\
             worker_id = \"{id}\"\n\
             initial_position = \"TRIM_HORIZON\"\n\
             {common}\
             [aws]\n\
             region = \"us-east-1\"\n",
            application = self.application,
            common = common_settings(mode),
        );
        let path = self.dir.join(format!("{id}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Drop for TableEnv {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

// ---------------------------------------------------------------------------------------
// Worker processes
// ---------------------------------------------------------------------------------------

/// One record line of `flotilla run`, as read by the test.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// When the test read the line.
    pub at: Instant,
    pub worker: Arc<str>,
    pub shard: String,
    pub sequence: String,
    pub sub_sequence: u64,
    pub key: String,
    /// The record's data as text ("" on a line with a `change` instead).
    pub data: String,
    /// A table stream's change, as the line's `change` object.
    pub change: Option<serde_json::Value>,
}

impl Delivery {
    fn parse(at: Instant, worker: &Arc<str>, line: &str) -> Option<Self> {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        let text = |name: &str| value.get(name)?.as_str().map(str::to_owned);
        Some(Self {
            at,
            worker: Arc::clone(worker),
            shard: text("shard_id")?,
            sequence: text("sequence_number")?,
            sub_sequence: value.get("sub_sequence_number")?.as_u64()?,
            key: text("partition_key")?,
            data: match value.get("change") {
                Some(_) => text("data").unwrap_or_default(),
                None => text("data")?,
            },
            change: value.get("change").filter(|c| c.is_object()).cloned(),
        })
    }

    /// What makes a record unique in the stream.
    pub fn identity(&self) -> (&str, &str, u64) {
        (&self.shard, &self.sequence, self.sub_sequence)
    }
}

struct WorkerProcess {
    id: Arc<str>,
    child: Child,
    log: PathBuf,
    exit: Option<ExitStatus>,
}

/// Worker processes and everything they printed.
pub struct Fleet {
    tag: &'static str,
    workers: Vec<WorkerProcess>,
    deliveries: Arc<Mutex<Vec<Delivery>>>,
    /// Stdout lines that are not record lines.
    bad_lines: Arc<Mutex<Vec<String>>>,
    /// Lifecycle lines of Java KCL workers' processors ([`kcl::Event`]).
    events: Arc<Mutex<Vec<kcl::Event>>>,
    /// Set when the fleet is dropped: the Java workers' output readers stop.
    closed: Arc<AtomicBool>,
}

impl Fleet {
    pub fn new(tag: &'static str) -> Self {
        Self {
            tag,
            workers: Vec::new(),
            deliveries: Arc::default(),
            bad_lines: Arc::default(),
            events: Arc::default(),
            closed: Arc::default(),
        }
    }

    /// Starts `flotilla run` as worker `id` of `env`'s application, with `settings`
    /// (`FLOTILLA__…` variables) over its settings file.
    #[allow(dead_code)] // tests/kcl.rs's
    pub fn spawn_with(&mut self, env: &Env, id: &str, settings: &[(&str, &str)]) {
        let config = env.worker_config(id);
        self.spawn_process(id, &config, &env.dir, settings);
    }

    /// Starts `flotilla run` as worker `id` of `env`'s application.
    pub fn spawn(&mut self, env: &Env, id: &str) {
        let config = env.worker_config(id);
        self.spawn_process(id, &config, &env.dir, &[]);
    }

    /// Starts `flotilla run` as worker `id` of `env`'s application, reading the table's
    /// stream named `stream` (`dynamodb:TABLE` or the ARN), in `mode`: the source and
    /// the DynamoDB endpoint given as `FLOTILLA__…` variables over the settings file.
    pub fn spawn_on_table(&mut self, env: &TableEnv, id: &str, stream: &str, mode: &str) {
        let config = env.worker_config(id, mode);
        self.spawn_process(
            id,
            &config,
            &env.dir,
            &[
                ("FLOTILLA__WORKER__STREAM", stream),
                ("FLOTILLA__AWS__DYNAMODB_ENDPOINT", &env.dynamodb_endpoint),
            ],
        );
    }

    /// `flotilla run --config CONFIG` as worker `id`, its stderr in `dir/ID.log`, with
    /// only `settings` of the `FLOTILLA__…` variables.
    fn spawn_process(&mut self, id: &str, config: &Path, dir: &Path, settings: &[(&str, &str)]) {
        let log = dir.join(format!("{id}.log"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
        command
            .arg("run")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&log).unwrap());
        // Only the file and `settings` speak: no FLOTILLA__* override nor AWS profile
        // from the caller.
        for (name, _) in std::env::vars_os() {
            let upper = name.to_string_lossy().to_ascii_uppercase();
            if upper.starts_with("FLOTILLA__") || upper == "FLOTILLA_CONFIG" {
                command.env_remove(&name);
            }
        }
        command.envs(settings.iter().copied());
        command
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_DEFAULT_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("FLOTILLA_LOG", "info");
        let mut child = command.spawn().unwrap();
        let id: Arc<str> = Arc::from(id);
        let stdout = child.stdout.take().unwrap();
        let (worker, deliveries, bad_lines) = (
            Arc::clone(&id),
            Arc::clone(&self.deliveries),
            Arc::clone(&self.bad_lines),
        );
        std::thread::spawn(move || {
            for line in std::io::BufReader::new(stdout).lines() {
                let at = Instant::now();
                let Ok(line) = line else { break };
                match Delivery::parse(at, &worker, &line) {
                    Some(delivery) => deliveries.lock().unwrap().push(delivery),
                    None => bad_lines.lock().unwrap().push(format!("{worker}: {line}")),
                }
            }
        });
        self.workers.push(WorkerProcess {
            id,
            child,
            log,
            exit: None,
        });
    }

    fn worker(&mut self, id: &str) -> &mut WorkerProcess {
        self.workers
            .iter_mut()
            .find(|w| &*w.id == id)
            .unwrap_or_else(|| panic!("no worker {id}"))
    }

    /// The workers still running.
    pub fn alive(&mut self) -> Vec<String> {
        let mut alive = Vec::new();
        for worker in &mut self.workers {
            if worker.exit.is_none() {
                worker.exit = worker.child.try_wait().unwrap();
            }
            if worker.exit.is_none() {
                alive.push(worker.id.to_string());
            }
        }
        alive
    }

    /// SIGKILL (Child::kill) and reap. Returns the instant just before the signal.
    pub fn kill(&mut self, id: &str) -> Instant {
        let worker = self.worker(id);
        let at = Instant::now();
        worker.child.kill().unwrap();
        worker.exit = Some(worker.child.wait().unwrap());
        at
    }

    /// SIGTERM, sent with `kill -TERM PID`. Returns the instant just before it.
    pub fn terminate(&mut self, id: &str) -> Instant {
        let pid = self.worker(id).child.id().to_string();
        let at = Instant::now();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success(), "kill -TERM {pid}: {status}");
        at
    }

    /// SIGSTOP: the process stops where it is (a VM freeze, a long GC pause). Returns the
    /// instant just before the signal.
    pub fn pause(&mut self, id: &str) -> Instant {
        self.signal(id, "-STOP")
    }

    /// SIGCONT after [`Fleet::pause`]. Returns the instant just before the signal: any
    /// line read after it was written after it (lines written before the stop were in
    /// the pipe, and the reader thread took them then).
    pub fn resume(&mut self, id: &str) -> Instant {
        self.signal(id, "-CONT")
    }

    fn signal(&mut self, id: &str, signal: &str) -> Instant {
        let pid = self.worker(id).child.id().to_string();
        let at = Instant::now();
        let status = Command::new("kill").args([signal, &pid]).status().unwrap();
        assert!(status.success(), "kill {signal} {pid}: {status}");
        at
    }

    /// Waits up to `limit` for worker `id` to exit.
    pub async fn wait_exit(&mut self, id: &str, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        loop {
            let worker = self.worker(id);
            if worker.exit.is_none() {
                worker.exit = worker.child.try_wait().unwrap();
            }
            if worker.exit.is_some() || start.elapsed() > limit {
                return worker.exit;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Runs `f` on every delivery so far, in the order read per worker.
    pub fn with_deliveries<R>(&self, f: impl FnOnce(&[Delivery]) -> R) -> R {
        f(&self.deliveries.lock().unwrap())
    }

    /// Every delivery so far, sorted by when it was read.
    pub fn deliveries(&self) -> Vec<Delivery> {
        let mut all = self.deliveries.lock().unwrap().clone();
        all.sort_by_key(|d| d.at);
        all
    }

    pub fn bad_lines(&self) -> Vec<String> {
        self.bad_lines.lock().unwrap().clone()
    }

    /// The shards with at least one delivery.
    pub fn shards_delivered(&self) -> BTreeSet<String> {
        self.with_deliveries(|all| all.iter().map(|d| d.shard.clone()).collect())
    }

    /// The last `lines` lines of worker `id`'s stderr.
    pub fn log_tail(&self, id: &str, lines: usize) -> String {
        let Some(worker) = self.workers.iter().find(|w| &*w.id == id) else {
            return format!("no worker {id}");
        };
        log_tail(&worker.log, lines)
    }

    /// Each worker's state and the end of its log.
    pub fn diagnostics(&self) -> String {
        let mut text = String::new();
        for worker in &self.workers {
            text.push_str(&format!(
                "--- worker {} ({}), log {}:\n{}\n",
                worker.id,
                worker
                    .exit
                    .map_or("running".to_owned(), |s| format!("exited: {s}")),
                worker.log.display(),
                log_tail(&worker.log, 12),
            ));
        }
        text
    }
}

fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::SeqCst);
        for worker in &mut self.workers {
            if worker.exit.is_none() && matches!(worker.child.try_wait(), Ok(None)) {
                let _ = worker.child.kill();
            }
            if let Ok(status) = worker.child.wait() {
                worker.exit.get_or_insert(status);
            }
        }
        // Past libtest's capture, and not as `fleet[TAG]: ` lines, which are measurements.
        if std::thread::panicking() {
            let _ = writeln!(
                std::io::stderr().lock(),
                "fleet[{}] worker logs:\n{}",
                self.tag,
                self.diagnostics()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Producer
// ---------------------------------------------------------------------------------------

/// What the producer wrote: the number of records of each key (`k7:0` .. `k7:N-1`).
#[derive(Debug, Clone, Default)]
pub struct Produced {
    pub per_key: BTreeMap<String, u64>,
    /// PutRecords calls that failed and were tried again.
    pub retries: u64,
    /// Why the producer stopped early, if it did.
    pub error: Option<String>,
}

impl Produced {
    pub fn total(&self) -> u64 {
        self.per_key.values().sum()
    }

    /// Records per key, for [`OrderCheck::lost`] and [`OrderCheck::unproduced`].
    pub fn counts(&self) -> impl Iterator<Item = (&String, u64)> + Clone {
        self.per_key.iter().map(|(k, &n)| (k, n))
    }
}

/// The explicit hash key of key `i` of `keys`: the middle of its 1/`keys` slice of the
/// key space.
fn hash_key(i: u32, keys: u32) -> u128 {
    let slice = u128::MAX / u128::from(keys);
    slice * u128::from(i) + slice / 2
}

/// Puts one record of each key every [`PRODUCE_EVERY`] until stopped.
pub struct Producer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Produced>,
}

impl Producer {
    pub fn start(env: &Env) -> Self {
        Self::start_keys(env, KEYS, PRODUCE_EVERY)
    }

    /// Puts one record of each of `key_count` keys (`k0` ..) every `every`: a lighter
    /// feed for long runs (benches/soak.rs).
    pub fn start_keys(env: &Env, key_count: u32, every: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (kinesis, stream, stopping) = (env.kinesis.clone(), env.stream.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut produced = Produced::default();
            let mut keys = KeyedProducer::from_keys(
                (0..key_count).map(|i| (format!("k{i}"), Some(hash_key(i, key_count)))),
            );
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut n = 0u64;
            while !stopping.load(Ordering::SeqCst) {
                tick.tick().await;
                let batch = keys.rounds(key_count, 1);
                // A failed call is put again whole: a record written twice is a
                // duplicate in the stream, never a gap or a reordering of its key.
                let mut attempt = 1;
                loop {
                    match kinesis.put_records(&stream, &batch).await {
                        Ok(_) => break,
                        Err(e) if attempt < PUT_ATTEMPTS => {
                            produced.retries += 1;
                            attempt += 1;
                            eprintln!("producer: put {n} failed, again: {e}");
                            tokio::time::sleep(Duration::from_millis(100)).await;
                        }
                        Err(e) => {
                            produced.error = Some(format!("put {n}: {e}"));
                            return produced;
                        }
                    }
                }
                n += 1;
                keys.confirm(&batch);
                produced.per_key = keys.produced();
            }
            produced
        });
        Self { stop, task }
    }

    pub async fn stop(self) -> Produced {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// Writes rounds of a [`changes::Model`] to a [`TableEnv`]'s table, one every
/// [`PRODUCE_EVERY`], until stopped: the table-stream counterpart of [`Producer`].
pub struct TableWriter {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(changes::Model, Option<String>)>,
}

impl TableWriter {
    /// Items `item-0` .. `item-{keys - 1}`.
    pub fn start(env: &TableEnv, keys: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (streams, table, stopping) = (env.streams.clone(), env.table.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut model = changes::Model::default();
            let mut tick = tokio::time::interval(PRODUCE_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut round = 1;
            while !stopping.load(Ordering::SeqCst) {
                tick.tick().await;
                // Item by item, each written once: a failed write ends the run (the
                // model would not know whether it happened).
                for write in model.round(round, keys) {
                    if let Err(e) = streams
                        .write_items(&table, std::slice::from_ref(&write))
                        .await
                    {
                        return (model, Some(format!("round {round}: {e}")));
                    }
                }
                round += 1;
            }
            (model, None)
        });
        Self { stop, task }
    }

    /// Stops writing: the model of what was written, and why it stopped early, if it did.
    pub async fn stop(self) -> (changes::Model, Option<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

// ---------------------------------------------------------------------------------------
// Checks
// ---------------------------------------------------------------------------------------

/// Every delivery through the library's per-key order oracle
/// (`flotilla_actors::oracle`, the rule `flotilla demo` and the simulator use), in the
/// order given (sort by `at` first), each named by its worker and shard.
pub fn order_of(deliveries: &[Delivery]) -> OrderCheck {
    let mut check = OrderCheck::default();
    for d in deliveries {
        check.observe_from(
            &d.key,
            d.data.as_bytes(),
            &format!("{} on {}", d.worker, d.shard),
        );
    }
    check
}

/// Deliveries read at or after `since` of a record (shard, sequence, subsequence)
/// delivered before them, at any time: re-deliveries caused by what happened at `since`.
/// Takes deliveries sorted by `at`. Returns the count and a few examples.
pub fn record_duplicates_since(deliveries: &[Delivery], since: Instant) -> (u64, Vec<String>) {
    let mut seen: HashSet<(&str, &str, u64)> = HashSet::new();
    let mut count = 0;
    let mut examples = Vec::new();
    for d in deliveries {
        if !seen.insert(d.identity()) && d.at >= since {
            count += 1;
            if examples.len() < 5 {
                examples.push(format!(
                    "{} {} {} by {}",
                    d.shard, d.sequence, d.data, d.worker
                ));
            }
        }
    }
    (count, examples)
}

/// Partition keys with records delivered from one of `parents` and from `child`: keys
/// whose order the reshard put to the test.
pub fn keys_crossing(deliveries: &[Delivery], parents: &[String], child: &str) -> usize {
    let on = |shards: &[&str]| -> HashSet<&str> {
        deliveries
            .iter()
            .filter(|d| shards.contains(&d.shard.as_str()))
            .map(|d| d.key.as_str())
            .collect()
    };
    let parents: Vec<&str> = parents.iter().map(String::as_str).collect();
    on(&parents).intersection(&on(&[child])).count()
}

/// For each of `shards`: how long after `since` a worker other than `from` first
/// delivered a record of it, if one has.
pub fn resume_gaps(
    fleet: &Fleet,
    shards: &[String],
    since: Instant,
    from: &str,
) -> BTreeMap<String, Option<Duration>> {
    fleet.with_deliveries(|all| {
        let mut gaps: BTreeMap<String, Option<Duration>> =
            shards.iter().map(|s| (s.clone(), None)).collect();
        for d in all {
            if d.at < since || &*d.worker == from {
                continue;
            }
            if let Some(gap) = gaps.get_mut(&d.shard) {
                let after = d.at - since;
                if gap.is_none_or(|g| after < g) {
                    *gap = Some(after);
                }
            }
        }
        gaps
    })
}

/// Failed checks, collected so that one failure does not hide the next phase's numbers;
/// [`Checks::finish`] panics with all of them.
#[derive(Debug)]
pub struct Checks {
    tag: &'static str,
    failed: Vec<String>,
}

impl Checks {
    pub fn new(tag: &'static str) -> Self {
        Self {
            tag,
            failed: Vec::new(),
        }
    }

    /// Reports `what` as passed or FAILED, and remembers a failure.
    pub fn check(&mut self, ok: bool, what: impl Into<String>) {
        let what = what.into();
        // The first line only: a failure's details (log tails) go with the panic.
        report(
            self.tag,
            &format!(
                "check {}: {}",
                if ok { "ok" } else { "FAILED" },
                what.lines().next().unwrap_or_default()
            ),
        );
        if !ok {
            self.failed.push(what);
        }
    }

    pub fn finish(self, fleet: &Fleet) {
        if !self.failed.is_empty() {
            panic!(
                "{} check(s) failed:\n  {}\n{}",
                self.failed.len(),
                self.failed.join("\n  "),
                fleet.diagnostics()
            );
        }
    }
}

/// Polls `done` every `step` until it holds or `limit` passes. Returns how long it took.
pub async fn wait_for(
    limit: Duration,
    step: Duration,
    mut done: impl FnMut() -> bool,
) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if done() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(step).await;
    }
}

/// A new, empty lease table (the application, named after `prefix`), a DynamoDB client
/// on `endpoint` to read it, and a folder named after `source` for the workers'
/// settings files and logs.
async fn application_on(
    sdk: &aws_config::SdkConfig,
    endpoint: &str,
    prefix: &str,
    source: &str,
) -> (String, aws_sdk_dynamodb::Client, PathBuf) {
    let application = servers::unique_name(&format!("{prefix}-app"));
    DynamoLeaseTable::new(sdk, Some(endpoint), &application)
        .ensure_table()
        .await
        .unwrap();
    let dynamodb = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(sdk)
            .endpoint_url(endpoint)
            .build(),
    );
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(source);
    std::fs::create_dir_all(&dir).unwrap();
    (application, dynamodb, dir)
}
