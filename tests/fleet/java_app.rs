//! A small Java KCL 2.5.8 application (`tests/kcl/PreparingApp.java`), written against
//! the KCL's API directly for what the MultiLang protocol cannot express: prepared
//! (two-phase) checkpoints with application state.
//!
//! [`compiled`] compiles it once with `javac -cp 'JARS/*'` against the jars of the wheel
//! scripts/test.sh installs ([`super::kcl::kcl_jars`]) into a folder under
//! `CARGO_TARGET_TMPDIR`, kept while the source is unchanged. [`JavaApp::start`] runs it
//! on an [`Env`]'s stream and application: its JSON lines go to `ID.out`, the KCL's log to
//! `ID.kcl.log` (through `tests/kcl/logback.xml`) and the JVM's own output to
//! `ID.jvm.log`, all in the env's folder. Dropping it kills the JVM; when the test is
//! panicking it prints the end of the output and of the log (past libtest's capture), so
//! a failed assertion need not carry them.
//!
//! [`lease_item`] reads a lease row raw, every attribute, for what [`super::kcl::Row`]
//! does not carry (`pendingCheckpointState`, `pendingCheckpointSubSequenceNumber`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use serde_json::Value;

use flotilla_actors::{Backend, InitialPosition, MetricsLevel, Settings};

use super::kcl::kcl_jars;
use super::{Env, FAILOVER_SECS, SHUTDOWN_TIMEOUT};

/// The application's source.
fn source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/kcl/PreparingApp.java")
}

/// The folder of the compiled classes: compiled on the first call of the process, unless
/// a copy of the same source compiled there before (`PreparingApp.java.compiled`).
pub fn compiled() -> &'static Path {
    static CLASSES: OnceLock<PathBuf> = OnceLock::new();
    CLASSES.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("kcl-preparing-app");
        let text = std::fs::read(source()).unwrap();
        let stamp = dir.join("PreparingApp.java.compiled");
        if std::fs::read(&stamp).is_ok_and(|old| old == text)
            && dir.join("PreparingApp.class").exists()
        {
            return dir;
        }
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("javac")
            .arg("-cp")
            .arg(format!("{}/*", kcl_jars().display()))
            .arg("-d")
            .arg(&dir)
            .arg(source())
            .output()
            .unwrap_or_else(|e| {
                panic!("javac: {e} (scripts/test.sh installs it: default-jdk-headless)")
            });
        assert!(
            out.status.success(),
            "javac {} failed:\n{}{}",
            source().display(),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::write(&stamp, text).unwrap();
        dir
    })
}

/// What the application does (its `MODE` arguments).
#[derive(Debug, Clone)]
pub enum Mode {
    /// Checkpoints at the record with data `commit` (if any), prepares at the record with
    /// data `prepare` with `state`, and halts the JVM.
    Prepare {
        commit: Option<String>,
        prepare: String,
        state: String,
    },
    /// Reports each `initialize` and keeps processing without checkpointing.
    Report,
}

/// One running application.
pub struct JavaApp {
    pub id: String,
    child: Child,
    exit: Option<ExitStatus>,
    out: PathBuf,
    log: PathBuf,
    jvm: PathBuf,
}

impl JavaApp {
    /// Starts worker `id` on `env`'s stream and application, with the KCL's
    /// `failoverTimeMillis` at `failover`.
    pub fn start(env: &Env, id: &str, failover: Duration, mode: &Mode) -> Self {
        let classes = compiled();
        let out = env.dir.join(format!("{id}.out"));
        let log = env.dir.join(format!("{id}.kcl.log"));
        let jvm = env.dir.join(format!("{id}.jvm.log"));
        for file in [&out, &log, &jvm] {
            let _ = std::fs::remove_file(file);
        }
        std::fs::File::create(&out).unwrap();
        let mut command = Command::new("java");
        command
            .args([
                "-Xss512k",
                "-Xmx384m",
                "-XX:+UseSerialGC",
                "-XX:TieredStopAtLevel=1",
            ])
            .arg(format!("-DFLOTILLA_KCL_LOG={}", log.display()))
            .arg(format!(
                "-Dlogback.configurationFile={}",
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/kcl/logback.xml")
                    .display()
            ))
            .arg("-cp")
            .arg(format!("{}:{}/*", classes.display(), kcl_jars().display()))
            .arg("PreparingApp")
            .arg(&env.kinesis_endpoint)
            .arg(&env.dynamodb_endpoint)
            .arg(&env.stream)
            .arg(&env.application)
            .arg(id)
            .arg(&out)
            .arg(failover.as_millis().to_string());
        match mode {
            Mode::Prepare {
                commit,
                prepare,
                state,
            } => command
                .arg("prepare")
                .arg(commit.as_deref().unwrap_or("-"))
                .arg(prepare)
                .arg(state),
            Mode::Report => command.arg("report"),
        };
        let jvm_file = std::fs::File::create(&jvm).unwrap();
        command
            .current_dir(&env.dir)
            .stdin(Stdio::null())
            .stdout(jvm_file.try_clone().unwrap())
            .stderr(jvm_file)
            .env_remove("AWS_PROFILE")
            .env_remove("AWS_DEFAULT_PROFILE")
            .env_remove("AWS_SESSION_TOKEN")
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true");
        let child = command.spawn().unwrap();
        Self {
            id: id.to_owned(),
            child,
            exit: None,
            out,
            log,
            jvm,
        }
    }

    /// Every line of its output so far, parsed (a line that is not JSON as a string).
    pub fn lines(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.out)
            .unwrap_or_default()
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|_| Value::from(line)))
            .collect()
    }

    /// The lines of `event` so far.
    pub fn events(&self, event: &str) -> Vec<Value> {
        self.lines()
            .into_iter()
            .filter(|line| line["event"] == event)
            .collect()
    }

    /// Every record the application was handed, in order: (sequence number, data).
    pub fn records(&self) -> Vec<(String, String)> {
        self.events("records")
            .iter()
            .flat_map(|line| line["records"].as_array().cloned().unwrap_or_default())
            .map(|r| {
                (
                    r["sequenceNumber"].as_str().unwrap_or_default().to_owned(),
                    r["data"].as_str().unwrap_or_default().to_owned(),
                )
            })
            .collect()
    }

    /// Waits up to `limit` for the first line of `event`; panics when none comes (or on
    /// an `error` line, or when the JVM exits first without writing it). The output and
    /// the log's end are printed when the app is dropped in the panic.
    pub async fn wait_for(&mut self, event: &str, limit: Duration) -> Value {
        let start = Instant::now();
        loop {
            let lines = self.lines();
            if let Some(line) = lines.iter().find(|line| line["event"] == event) {
                return line.clone();
            }
            if let Some(error) = lines.iter().find(|line| line["event"] == "error") {
                panic!("{} wrote an error before `{event}`: {error}", self.id,);
            }
            if let Some(status) = self.exited() {
                // It may have written the line just before exiting.
                if let Some(line) = self.events(event).into_iter().next() {
                    return line;
                }
                panic!("{} exited ({status}) before `{event}`", self.id,);
            }
            if start.elapsed() > limit {
                panic!("no `{event}` from {} within {limit:?}", self.id,);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Its exit status, if it has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().unwrap();
        }
        self.exit
    }

    /// Waits up to `limit` for it to exit.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let start = Instant::now();
        while self.exited().is_none() && start.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.exited()
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            self.exit = self.child.wait().ok();
        }
    }

    /// The last `lines` lines of the KCL's log (and of the JVM's output, when it wrote
    /// any: an exception before logback was set up).
    pub fn log_tail(&self, lines: usize) -> String {
        let tail = |path: &Path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        };
        let mut text = tail(&self.log);
        let jvm = tail(&self.jvm);
        if !jvm.trim().is_empty() {
            text.push_str(&format!("\n--- JVM output {}:\n{jvm}", self.jvm.display()));
        }
        text
    }

    /// Its state, its output lines (the last 20) and the end of its log.
    pub fn diagnostics(&self) -> String {
        let lines: Vec<String> = self.lines().iter().map(Value::to_string).collect();
        format!(
            "--- Java app {} ({}), output {}:\n{}\n--- its KCL log {}:\n{}\n",
            self.id,
            self.exit
                .map_or("running".to_owned(), |s| format!("exited: {s}")),
            self.out.display(),
            lines[lines.len().saturating_sub(20)..].join("\n"),
            self.log.display(),
            self.log_tail(30),
        )
    }
}

impl Drop for JavaApp {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr().lock(), "{}", self.diagnostics());
        }
    }
}

/// The lease row of `key` in `env`'s lease table, every attribute, raw (a strongly
/// consistent scan through the SDK); `None` when there is none.
pub async fn lease_item(env: &Env, key: &str) -> Option<HashMap<String, AttributeValue>> {
    super::scan_all(&env.dynamodb, &env.application)
        .await
        .into_iter()
        .find(|item| matches!(item.get("leaseKey"), Some(AttributeValue::S(k)) if k == key))
}

/// Settings of an in-process flotilla worker `id` on `env`'s stream and application, with
/// the fleet's short timings (`lease.failover_time` of [`FAILOVER_SECS`]), polling, from
/// TRIM_HORIZON, metrics off.
pub fn worker_settings(env: &Env, id: &str) -> Settings {
    let mut s = Settings::default();
    s.worker.stream = env.stream.clone();
    s.worker.application = env.application.clone();
    s.worker.worker_id = Some(id.to_owned());
    s.worker.initial_position = InitialPosition::TrimHorizon;
    s.lease.failover_time = Duration::from_secs(FAILOVER_SECS);
    s.lease.heartbeat_interval = Duration::from_secs(1);
    s.lease.fence_margin = Duration::from_secs(1);
    s.reader.poll_interval = Duration::from_millis(100);
    s.reader.idle_max = Duration::from_millis(200);
    s.reader.parent_poll_interval = Duration::from_millis(200);
    s.reader.shard_sync_interval = Duration::from_secs(2);
    s.reader.backoff_max = Duration::from_secs(1);
    s.checkpoint.interval = Duration::from_secs(1);
    s.supervision.shutdown_timeout = SHUTDOWN_TIMEOUT;
    s.metrics.level = MetricsLevel::None;
    s.status.bind = "127.0.0.1:0".to_owned();
    s.aws.region = Some("us-east-1".to_owned());
    s.aws.kinesis_endpoint = Some(env.kinesis_endpoint.clone());
    s.aws.dynamodb_endpoint = Some(env.dynamodb_endpoint.clone());
    s
}

/// The AWS backend of `settings` (the servers they name), with the tests' static
/// credentials.
pub fn backend(settings: &Settings) -> Backend {
    Backend::from_sdk(&super::servers::sdk_config(), &settings.aws)
}

/// A string attribute of a raw row.
pub fn text(item: &HashMap<String, AttributeValue>, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::S(s)) => Some(s.clone()),
        _ => None,
    }
}

/// A number attribute of a raw row, as written.
pub fn number(item: &HashMap<String, AttributeValue>, name: &str) -> Option<String> {
    match item.get(name) {
        Some(AttributeValue::N(n)) => Some(n.clone()),
        _ => None,
    }
}

/// A binary attribute of a raw row, as bytes.
pub fn binary(item: &HashMap<String, AttributeValue>, name: &str) -> Option<Vec<u8>> {
    match item.get(name) {
        Some(AttributeValue::B(b)) => Some(b.clone().into_inner()),
        _ => None,
    }
}
