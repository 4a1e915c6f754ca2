//! A prepared (two-phase) checkpoint across a failover between two worker *processes*,
//! through the real DynamoDB and Kinesis adapters on servers that speak the wire
//! protocols:
//!
//! 1. The first process prepares a checkpoint at its first batch's last record, with
//!    application state, and is killed with SIGKILL before it commits anything. The
//!    lease row then carries the pending checkpoint and the state (`pendingCheckpoint`,
//!    `pendingCheckpointState`) and no committed checkpoint.
//! 2. A second process takes the lease once it expires, and its processor's
//!    `initialize` is shown the pending checkpoint and the state, with reading starting
//!    from the committed position: every record the first process prepared past is
//!    delivered again (nothing is skipped on the strength of a prepare).
//! 3. The second process prepares and commits; the row then has its checkpoint and no
//!    pending attributes, and the process shuts down cleanly.
//!
//! The worker processes are this test binary started again, running `worker_process`
//! (ignored in normal runs) with its role and the servers in `FLOTILLA_TEST_PREPARED_*`
//! variables; they report on stdout as JSON lines. The servers are dynoxide and
//! ferrokinesis in the test process (the children reach them on loopback), and, with the
//! `external-servers` feature, DynamoDB Local and kinesis-mock as scripts/test.sh starts
//! them.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

mod support;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use flotilla_actors::backend::aws::{DynamoLeaseTable, KinesisStream};
use flotilla_actors::backend::{LeaseTable, StreamAdmin};
use flotilla_actors::model::{Checkpoint, ExtendedSequenceNumber, SequenceNumber};
use flotilla_actors::{
    Batch, CheckpointMode, Checkpointer, Processor, ProcessorError, ShardInfo, Worker,
};
use serde_json::{Value, json};
use support::probe::{Producer, fast_settings};
use support::rig::shutdown_clean;
use support::servers;
use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

/// The child's role: `first` (prepares, never commits) or `next` (prepares and commits).
const ROLE: &str = "FLOTILLA_TEST_PREPARED_ROLE";
const KINESIS: &str = "FLOTILLA_TEST_PREPARED_KINESIS";
const DYNAMODB: &str = "FLOTILLA_TEST_PREPARED_DYNAMODB";
const STREAM: &str = "FLOTILLA_TEST_PREPARED_STREAM";
const APPLICATION: &str = "FLOTILLA_TEST_PREPARED_APPLICATION";

/// The state the first process prepares with.
const STATE: &str = "txn-17";
/// How long the test waits for a child's next line (the second includes a failover
/// time of the lease the first left).
const PATIENCE: Duration = Duration::from_secs(120);

/// Records on the stream, in one shard.
const KEYS: u32 = 4;
const PER_KEY: u32 = 10;

// ---------------------------------------------------------------------------------
// The worker process.

/// One line on stdout, so the test reads it as the child goes.
fn say(line: Value) {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    writeln!(out, "{line}").unwrap();
    out.flush().unwrap();
}

fn position(at: &ExtendedSequenceNumber) -> Value {
    json!({"sequence": at.sequence.as_str(), "sub_sequence": at.sub_sequence})
}

/// The first owner prepares at its first batch's last record, with state, and commits
/// nothing (it is killed before it would); the next prepares and commits at its first
/// batch's last record and then says it is done.
struct TwoPhase {
    first: bool,
    done: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Processor for TwoPhase {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        say(json!({
            "event": "initialize",
            "starting_at": shard.starting_at.to_string(),
            "pending": shard.pending_checkpoint.as_ref().map(position),
            "state": shard
                .pending_checkpoint_state
                .as_deref()
                .map(|s| String::from_utf8_lossy(s).into_owned()),
        }));
        Ok(())
    }

    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        let sequences: Vec<&str> = batch
            .records()
            .iter()
            .map(|r| r.sequence_number.as_str())
            .collect();
        say(json!({"event": "batch", "sequences": sequences}));
        let Some(last) = batch.records().last() else {
            return Ok(());
        };
        let Some(done) = self.done.take() else {
            return Ok(());
        };
        let at = ExtendedSequenceNumber::new(last.sequence_number.clone(), 0);
        if self.first {
            cp.prepare_checkpoint(at.clone(), Some(STATE.as_bytes().to_vec()))
                .await?;
            say(json!({"event": "prepared", "at": position(&at)}));
        } else {
            let prepared = cp.prepare_checkpoint(at.clone(), None).await?;
            prepared.checkpoint().await?;
            say(json!({"event": "committed", "at": position(&at)}));
        }
        let _ = done.send(());
        Ok(())
    }
}

fn required(var: &str) -> String {
    std::env::var(var).unwrap_or_else(|_| {
        panic!(
            "{var} is not set: `worker_process` is a worker process that the tests in this \
             file start themselves; run them instead"
        )
    })
}

/// A worker of the stream and application the variables name, until its processor is
/// done (`next`: then a clean shutdown) or it is killed (`first`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a worker process the other tests of this file start"]
async fn worker_process() {
    let role = required(ROLE);
    let first = match role.as_str() {
        "first" => true,
        "next" => false,
        other => panic!("{ROLE}={other}: expected `first` or `next`"),
    };
    let (kinesis, dynamodb) = (required(KINESIS), required(DYNAMODB));
    let mut settings = fast_settings(&required(STREAM), &required(APPLICATION));
    settings.checkpoint.mode = CheckpointMode::Manual;
    let stream = KinesisStream::new(&servers::sdk_config(), Some(&kinesis));
    let backend = servers::dynamo_backend(&stream, &dynamodb);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let done = std::sync::Mutex::new(Some(tx));
    let worker = Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |_| TwoPhase {
            first,
            done: done.lock().unwrap().take(),
        })
        .start()
        .await
        .unwrap();
    rx.await.unwrap();
    if first {
        // Killed here by the test; a first owner that outlived it must not commit.
        std::future::pending::<()>().await;
    }
    shutdown_clean(worker).await;
}

// ---------------------------------------------------------------------------------
// The test.

/// A child process and its stdout's JSON lines.
struct WorkerProcess {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    seen: Vec<Value>,
}

impl WorkerProcess {
    fn start(role: &str, kinesis: &str, dynamodb: &str, stream: &str, application: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["worker_process", "--exact", "--ignored", "--nocapture"])
            .args(["--test-threads", "1"])
            .env(ROLE, role)
            .env(KINESIS, kinesis)
            .env(DYNAMODB, dynamodb)
            .env(STREAM, stream)
            .env(APPLICATION, application)
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self {
            child,
            lines,
            seen: Vec::new(),
        }
    }

    /// The next line with this `event` (the lines before it are kept in `seen`).
    async fn wait_for(&mut self, event: &str) -> Value {
        let read = async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                // The test harness's own lines are not JSON, and its `test worker_process
                // ... ` waits for its `ok` on the line the first report starts.
                let Some(json) = line.find('{').map(|i| &line[i..]) else {
                    continue;
                };
                let Ok(value) = serde_json::from_str::<Value>(json) else {
                    continue;
                };
                self.seen.push(value.clone());
                if value["event"] == event {
                    return value;
                }
            }
            panic!("the worker process ended before `{event}`: {:?}", self.seen)
        };
        tokio::time::timeout(PATIENCE, read)
            .await
            .unwrap_or_else(|_| panic!("no `{event}` within {PATIENCE:?}: {:?}", self.seen))
    }

    /// Every sequence number the processor was handed, in order.
    fn delivered(&self) -> Vec<String> {
        self.seen
            .iter()
            .filter(|v| v["event"] == "batch")
            .flat_map(|v| v["sequences"].as_array().unwrap().clone())
            .map(|s| s.as_str().unwrap().to_owned())
            .collect()
    }
}

fn at(value: &Value) -> ExtendedSequenceNumber {
    ExtendedSequenceNumber::new(
        SequenceNumber::parse(value["sequence"].as_str().unwrap()).unwrap(),
        value["sub_sequence"].as_u64().unwrap(),
    )
}

async fn a_prepared_checkpoint_crosses_a_process_failover(kinesis: String, dynamodb: String) {
    let sdk = servers::sdk_config();
    let admin = KinesisStream::new(&sdk, Some(&kinesis));
    let stream = servers::unique_name("prepared");
    let application = servers::unique_name("prepared-app");
    admin.create_stream(&stream, 1).await.unwrap();
    let mut producer = Producer::default();
    producer.put_round(&admin, &stream, KEYS, PER_KEY).await;
    let table = DynamoLeaseTable::new(&sdk, Some(&dynamodb), &application);

    // 1. The first process prepares, and is killed before it commits.
    let mut first = WorkerProcess::start("first", &kinesis, &dynamodb, &stream, &application);
    let init = first.wait_for("initialize").await;
    assert_eq!(
        init["pending"],
        Value::Null,
        "a fresh lease has nothing pending"
    );
    let prepared = at(&first.wait_for("prepared").await["at"]);
    first.child.kill().await.unwrap();
    let row = table.scan().await.unwrap().leases.pop().unwrap();
    assert_eq!(row.checkpoint, Checkpoint::TrimHorizon, "nothing committed");
    assert_eq!(row.pending_checkpoint, Some(prepared.clone()));
    assert_eq!(
        row.pending_checkpoint_state.as_deref(),
        Some(STATE.as_bytes())
    );
    let first_delivered = first.delivered();
    let upto = first_delivered
        .iter()
        .position(|s| s.as_str() == prepared.sequence.as_str())
        .unwrap();

    // 2. The next process is shown both positions and the state, and reads from the
    //    committed one. (More records, so that a reader wrongly starting past the
    //    prepare still has a batch to show it by.)
    producer.put_round(&admin, &stream, KEYS, PER_KEY).await;
    let mut next = WorkerProcess::start("next", &kinesis, &dynamodb, &stream, &application);
    let init = next.wait_for("initialize").await;
    assert_eq!(init["starting_at"], Checkpoint::TrimHorizon.to_string());
    assert!(
        init["pending"].is_object(),
        "the next owner's `initialize` shows no pending checkpoint: {init}"
    );
    assert_eq!(at(&init["pending"]), prepared);
    assert_eq!(init["state"], STATE);
    let committed = at(&next.wait_for("committed").await["at"]);
    let redelivered: BTreeSet<String> = next.delivered().into_iter().collect();
    let missing: Vec<&String> = first_delivered[..=upto]
        .iter()
        .filter(|s| !redelivered.contains(*s))
        .collect();
    assert!(
        missing.is_empty(),
        "records up to the uncommitted prepare not delivered again: {missing:?}"
    );

    // 3. Its commit removed the pending attributes, and it stops cleanly.
    let row = table.scan().await.unwrap().leases.pop().unwrap();
    assert_eq!(row.checkpoint, Checkpoint::At(committed));
    assert_eq!(row.pending_checkpoint, None);
    assert_eq!(row.pending_checkpoint_state, None);
    let status = tokio::time::timeout(PATIENCE, next.child.wait())
        .await
        .expect("the next worker process did not stop")
        .unwrap();
    assert!(status.success(), "the next worker process: {status}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ferrokinesis_dynoxide() {
    let kinesis = servers::start_ferrokinesis(300).await;
    let dynamodb = servers::start_dynoxide().await;
    a_prepared_checkpoint_crosses_a_process_failover(kinesis, dynamodb).await;
}

#[cfg(feature = "external-servers")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinesis_mock_dynamodb_local() {
    a_prepared_checkpoint_crosses_a_process_failover(
        servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT"),
        servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT"),
    )
    .await;
}
