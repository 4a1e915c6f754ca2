//! Prepared (two-phase) checkpoints with application state, across the real Java KCL
//! 2.5.8 both ways, on kinesis-mock and DynamoDB Local: what docs/embedding.md,
//! "Two-phase checkpoints with application state", claims ("a table written by the Java
//! KCL carries them over both ways"), checked against the KCL itself.
//!
//! The KCL's MultiLang protocol has no `prepareCheckpoint`, so the Java side is a small
//! application written against the KCL 2.5.8 API (`tests/kcl/PreparingApp.java`, compiled
//! by the test with `javac` against the wheel's jars: `fleet::java_app`). The flotilla
//! side is a `Worker` in this process (the library), on the AWS adapters.
//!
//! * `a_java_prepared_checkpoint_is_seen_by_flotilla`: the Java application checkpoints
//!   at `r4`, prepares at `r11` with the state `txn-java-17`
//!   (`RecordProcessorCheckpointer.prepareCheckpoint`) and halts the JVM before it could
//!   commit. The row holds the KCL's `checkpoint`, `pendingCheckpoint` and
//!   `pendingCheckpointState` (binary). A flotilla worker takes the lease after its
//!   failover time (the Java owner has no heartbeat row; `lease.java_compat` off) and its
//!   processor's `initialize` shows `pending_checkpoint` = the prepared position,
//!   `pending_checkpoint_state` = the bytes and `starting_at` = the committed checkpoint;
//!   reading starts right after the committed checkpoint (`r5`, nothing skipped on the
//!   strength of the prepare). flotilla's own checkpoints then remove the KCL's pending
//!   attributes.
//! * `a_flotilla_prepared_checkpoint_is_seen_by_the_kcl`: a flotilla worker in manual
//!   mode checkpoints at `r4`, prepares at `r11` with the state `txn-flotilla-42`
//!   (`Checkpointer::prepare_checkpoint`) and is aborted (`Worker::abort`: a crash, the
//!   case two-phase checkpoints exist for; nothing released, nothing committed). The
//!   Java application starts on the same table, takes the lease once the KCL judges it
//!   expired, and its processor's `initialize` reports `pendingCheckpointSequenceNumber`
//!   = the prepared position, `pendingCheckpointState` = the bytes and
//!   `extendedSequenceNumber` = the committed checkpoint; the KCL reads from `r5`.
//!
//! One test at a time (a JVM each, on a 2-core machine). Figures are printed as
//! `fleet[TAG]: ...` lines. Built only with the `flotilla-actors/external-servers`
//! feature; needs scripts/test.sh's servers, the KCL wheel (`FLOTILLA_TEST_KCL_PYTHON`),
//! `java` and `javac`.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

#[allow(dead_code)] // the harness serves several test binaries
mod fleet;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_dynamodb::types::AttributeValue;
use base64::Engine as _;
use bytes::Bytes;
use fleet::java_app::{self, JavaApp, Mode, binary, lease_item, number, text};
use fleet::{Env, FAILOVER_SECS, ms, report};
use flotilla_actors::backend::{PutRecord, StreamAdmin as _};
use flotilla_actors::model::{Checkpoint, ExtendedSequenceNumber, SequenceNumber};
use flotilla_actors::{
    Batch, CheckpointMode, Checkpointer, Processor, ProcessorError, ShardInfo, Worker,
};
use serde_json::{Value, json};

/// One test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The failover time of both sides: the KCL's `failoverTimeMillis` and flotilla's
/// `lease.failover_time`.
const FAILOVER: Duration = Duration::from_secs(FAILOVER_SECS);
/// The Java application's start to its prepare on an empty lease table: the KCL waits a
/// random 1-30 s before it makes leases there.
const JAVA_FRESH_LIMIT: Duration = Duration::from_secs(120);
/// The Java application's start to its `initialize` of a lease another worker left:
/// its JVM, a first scan, and a take one failover time later (its taker runs every
/// 2 × (failover + 25 ms)).
const JAVA_TAKE_LIMIT: Duration = Duration::from_secs(90);
/// A flotilla worker's start to having read the whole shard (a failover time included).
const FLOTILLA_LIMIT: Duration = Duration::from_secs(60);

const JAVA_STATE: &str = "txn-java-17";
const FLOTILLA_STATE: &str = "txn-flotilla-42";
/// The record checkpointed (committed) before the prepare, and the one prepared at.
const COMMIT_AT: &str = "r4";
const PREPARE_AT: &str = "r11";
/// The first record after the committed checkpoint: where every next owner resumes.
const RESUME_AT: &str = "r5";

/// Puts `r{i}` for each `i` of `range`, in order, on one partition key (the stream has
/// one shard).
async fn put(env: &Env, range: std::ops::Range<u32>) {
    let records: Vec<PutRecord> = range
        .map(|i| PutRecord {
            partition_key: "k".to_owned(),
            explicit_hash_key: None,
            data: Bytes::from(format!("r{i}")),
        })
        .collect();
    env.kinesis
        .put_records(&env.stream, &records)
        .await
        .unwrap();
}

/// The data `r{from}` .. `r{to - 1}`.
fn data(range: std::ops::Range<u32>) -> Vec<String> {
    range.map(|i| format!("r{i}")).collect()
}

fn position(sequence: &str, sub: u64) -> ExtendedSequenceNumber {
    ExtendedSequenceNumber::new(SequenceNumber::parse(sequence).unwrap(), sub)
}

/// A position as the Java application writes it.
fn java_position(sequence: &str, sub: u64) -> Value {
    json!({"sequenceNumber": sequence, "subSequenceNumber": sub})
}

/// A raw row, readably (binary attributes as text).
fn show(item: &HashMap<String, AttributeValue>) -> String {
    let mut names: Vec<&String> = item.keys().collect();
    names.sort();
    names
        .into_iter()
        .map(|name| {
            let value = match &item[name] {
                AttributeValue::S(s) => format!("S {s:?}"),
                AttributeValue::N(n) => format!("N {n}"),
                AttributeValue::B(b) => {
                    format!("B {:?}", String::from_utf8_lossy(b.as_ref()))
                }
                other => format!("{other:?}"),
            };
            format!("{name}={value}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

// ---------------------------------------------------------------------------------------
// The flotilla side's processor
// ---------------------------------------------------------------------------------------

/// What the flotilla worker's processors saw and did.
#[derive(Debug, Default)]
struct Seen {
    initialized: Vec<ShardInfo>,
    /// (sequence number, data) of every record handed to `process`, in order.
    delivered: Vec<(String, String)>,
    committed: Option<ExtendedSequenceNumber>,
    prepared: Option<ExtendedSequenceNumber>,
    errors: Vec<String>,
}

impl Seen {
    fn delivered_data(&self) -> Vec<String> {
        self.delivered.iter().map(|(_, d)| d.clone()).collect()
    }

    fn sequence_of(&self, data: &str) -> Option<String> {
        self.delivered
            .iter()
            .find(|(_, d)| d == data)
            .map(|(s, _)| s.clone())
    }
}

/// Checkpoints at the record with data `commit`, then prepares at the one with data
/// `prepare`, with `state`; nothing after (manual mode).
#[derive(Clone)]
struct Plan {
    commit: String,
    prepare: String,
    state: Vec<u8>,
}

struct Recorder {
    seen: Arc<Mutex<Seen>>,
    plan: Option<Plan>,
}

impl Processor for Recorder {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        self.seen.lock().unwrap().initialized.push(shard.clone());
        Ok(())
    }

    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        self.seen
            .lock()
            .unwrap()
            .delivered
            .extend(batch.records().iter().map(|r| {
                (
                    r.sequence_number.as_str().to_owned(),
                    String::from_utf8_lossy(&r.data).into_owned(),
                )
            }));
        let Some(plan) = self.plan.clone() else {
            return Ok(());
        };
        for record in batch.records() {
            let at = ExtendedSequenceNumber::new(
                record.sequence_number.clone(),
                record.sub_sequence_number,
            );
            if record.data == plan.commit.as_bytes() {
                if let Err(e) = cp.checkpoint_record(record).await {
                    self.seen
                        .lock()
                        .unwrap()
                        .errors
                        .push(format!("checkpoint: {e}"));
                    return Err(e.into());
                }
                self.seen.lock().unwrap().committed = Some(at.clone());
            }
            if record.data == plan.prepare.as_bytes() {
                if let Err(e) = cp.prepare_checkpoint(at.clone(), Some(plan.state)).await {
                    self.seen
                        .lock()
                        .unwrap()
                        .errors
                        .push(format!("prepare: {e}"));
                    return Err(e.into());
                }
                self.seen.lock().unwrap().prepared = Some(at);
                // Never committed: the test aborts the worker now.
                self.plan = None;
                return Ok(());
            }
        }
        Ok(())
    }
}

/// Starts an in-process flotilla worker `id` on `env`, in `mode`, with `plan`.
async fn start_worker(
    env: &Env,
    id: &str,
    mode: CheckpointMode,
    plan: Option<Plan>,
) -> (Worker, Arc<Mutex<Seen>>) {
    let mut settings = java_app::worker_settings(env, id);
    settings.checkpoint.mode = mode;
    let backend = java_app::backend(&settings);
    let seen = Arc::new(Mutex::new(Seen::default()));
    let recorder = Arc::clone(&seen);
    let worker = Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |_| Recorder {
            seen: Arc::clone(&recorder),
            plan: plan.clone(),
        })
        .start()
        .await
        .unwrap();
    (worker, seen)
}

/// Waits up to `limit` for `done` on what the worker saw; panics with it otherwise.
async fn wait_seen(
    what: &str,
    seen: &Mutex<Seen>,
    limit: Duration,
    done: impl Fn(&Seen) -> bool,
) -> Duration {
    let start = Instant::now();
    loop {
        if done(&seen.lock().unwrap()) {
            return start.elapsed();
        }
        if start.elapsed() > limit {
            panic!(
                "flotilla: {what}: not within {limit:?}; it saw {:#?}",
                seen.lock().unwrap()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// ---------------------------------------------------------------------------------------
// Java -> flotilla
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_java_prepared_checkpoint_is_seen_by_flotilla() {
    const TAG: &str = "kcl-prepared-j2f";
    let _serial = SERIAL.lock().await;
    let env = Env::new("kclprep-j2f", 1).await;
    let shard = env.open_shards().await[0].id.as_str().to_owned();
    put(&env, 0..20).await;

    // 1. The KCL commits at r4, prepares at r11 with state, and dies.
    let started = Instant::now();
    let mut java = JavaApp::start(
        &env,
        "java-prep",
        FAILOVER,
        &Mode::Prepare {
            commit: Some(COMMIT_AT.to_owned()),
            prepare: PREPARE_AT.to_owned(),
            state: JAVA_STATE.to_owned(),
        },
    );
    let prepared_line = java.wait_for("prepared", JAVA_FRESH_LIMIT).await;
    let took = started.elapsed();
    let exit = java.wait_exit(Duration::from_secs(10)).await;
    let halted = Instant::now();
    assert!(
        exit.is_some_and(|s| s.success()),
        "the Java app halts with 0 after its prepare: {exit:?}",
    );
    let checkpointed = java.events("checkpointed");
    assert_eq!(checkpointed.len(), 1, "one checkpoint before the prepare",);
    let committed = checkpointed[0]["at"]["sequenceNumber"]
        .as_str()
        .unwrap()
        .to_owned();
    let prepared = prepared_line["at"]["sequenceNumber"]
        .as_str()
        .unwrap()
        .to_owned();
    let java_records = java.records();
    assert_eq!(
        java_records
            .iter()
            .find(|(_, d)| d == PREPARE_AT)
            .map(|(s, _)| s.as_str()),
        Some(prepared.as_str())
    );
    report(
        TAG,
        &format!(
            "Java app start -> prepare at {PREPARE_AT}: {} (an empty lease table: the KCL \
             waits 1-30 s before it makes leases)",
            ms(took)
        ),
    );

    // 2. The row as the KCL left it.
    let item = lease_item(&env, &shard).await.expect("a lease row");
    report(
        TAG,
        &format!("row after the KCL's prepare: {}", show(&item)),
    );
    assert_eq!(text(&item, "leaseOwner").as_deref(), Some("java-prep"));
    assert_eq!(
        text(&item, "checkpoint").as_deref(),
        Some(committed.as_str())
    );
    assert_eq!(
        text(&item, "pendingCheckpoint").as_deref(),
        Some(prepared.as_str()),
        "the KCL's prepare in the row: {}",
        show(&item)
    );
    assert_eq!(
        number(&item, "pendingCheckpointSubSequenceNumber").as_deref(),
        Some("0")
    );
    assert_eq!(
        binary(&item, "pendingCheckpointState").as_deref(),
        Some(JAVA_STATE.as_bytes()),
        "the KCL's state in the row, binary: {}",
        show(&item)
    );

    // 3. More records, so a reader wrongly starting past the prepare still has some to
    //    show it by; flotilla takes the lease after its failover time.
    put(&env, 20..30).await;
    let (worker, seen) = start_worker(&env, "flotilla-next", CheckpointMode::Auto, None).await;
    let waited = wait_seen("initialized", &seen, FLOTILLA_LIMIT, |s| {
        !s.initialized.is_empty()
    })
    .await;
    report(
        TAG,
        &format!(
            "Java halt -> flotilla initialize: {} (failover time {FAILOVER:?}; worker start \
             -> initialize {})",
            ms(halted.elapsed()),
            ms(waited)
        ),
    );
    wait_seen("every record up to r29", &seen, FLOTILLA_LIMIT, |s| {
        s.delivered.iter().any(|(_, d)| d == "r29")
    })
    .await;
    {
        let seen = seen.lock().unwrap();
        let info = &seen.initialized[0];
        report(
            TAG,
            &format!(
                "flotilla initialize: starting_at {}, pending_checkpoint {:?}, state {:?}",
                info.starting_at,
                info.pending_checkpoint.as_ref().map(ToString::to_string),
                info.pending_checkpoint_state
                    .as_deref()
                    .map(String::from_utf8_lossy)
            ),
        );
        assert_eq!(
            info.pending_checkpoint,
            Some(position(&prepared, 0)),
            "flotilla's initialize shows the KCL's prepared checkpoint: {info:?}"
        );
        assert_eq!(
            info.pending_checkpoint_state.as_deref(),
            Some(JAVA_STATE.as_bytes()),
            "flotilla's initialize shows the KCL's state: {info:?}"
        );
        assert_eq!(
            info.starting_at,
            Checkpoint::At(position(&committed, 0)),
            "flotilla starts at the KCL's committed checkpoint: {info:?}"
        );
        assert_eq!(
            seen.delivered_data(),
            data(5..30),
            "flotilla reads from the record after the committed checkpoint ({RESUME_AT}), \
             the prepared ones again, nothing skipped nor repeated"
        );
        assert_eq!(seen.sequence_of(PREPARE_AT), Some(prepared.clone()));
    }

    // 4. flotilla's own checkpoint (auto mode, flushed at shutdown) removes the KCL's
    //    pending attributes, as the KCL's does.
    let shutdown = tokio::time::timeout(Duration::from_secs(30), worker.shutdown())
        .await
        .expect("flotilla shuts down")
        .unwrap();
    assert!(shutdown.clean(), "{shutdown:#?}");
    let item = lease_item(&env, &shard).await.expect("a lease row");
    report(
        TAG,
        &format!("row after flotilla's shutdown: {}", show(&item)),
    );
    let last = seen.lock().unwrap().sequence_of("r29").unwrap();
    assert_eq!(text(&item, "checkpoint").as_deref(), Some(last.as_str()));
    for name in [
        "pendingCheckpoint",
        "pendingCheckpointSubSequenceNumber",
        "pendingCheckpointState",
    ] {
        assert!(
            !item.contains_key(name),
            "{name} left after flotilla's checkpoint: {}",
            show(&item)
        );
    }
    report(TAG, &format!("total {}", ms(started.elapsed())));
}

// ---------------------------------------------------------------------------------------
// flotilla -> Java
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flotilla_prepared_checkpoint_is_seen_by_the_kcl() {
    const TAG: &str = "kcl-prepared-f2j";
    let _serial = SERIAL.lock().await;
    let env = Env::new("kclprep-f2j", 1).await;
    let shard = env.open_shards().await[0].id.as_str().to_owned();
    put(&env, 0..20).await;

    // 1. flotilla commits at r4, prepares at r11 with state, and crashes.
    let started = Instant::now();
    let plan = Plan {
        commit: COMMIT_AT.to_owned(),
        prepare: PREPARE_AT.to_owned(),
        state: FLOTILLA_STATE.as_bytes().to_vec(),
    };
    let (worker, seen) =
        start_worker(&env, "flotilla-prep", CheckpointMode::Manual, Some(plan)).await;
    let took = wait_seen("prepared", &seen, FLOTILLA_LIMIT, |s| s.prepared.is_some()).await;
    // Aborted, not shut down: a crash between prepare and commit is what the pending
    // checkpoint is for. (A shutdown would release the lease, keeping the pending
    // attributes, and the KCL would take it at once instead of after its failover time.)
    worker.abort();
    let crashed = Instant::now();
    let (committed, prepared, info) = {
        let seen = seen.lock().unwrap();
        assert!(seen.errors.is_empty(), "{seen:#?}");
        (
            seen.committed.clone().unwrap(),
            seen.prepared.clone().unwrap(),
            seen.initialized[0].clone(),
        )
    };
    assert_eq!(info.pending_checkpoint, None, "a fresh lease: {info:?}");
    report(
        TAG,
        &format!("flotilla start -> prepare at {PREPARE_AT}: {}", ms(took)),
    );

    // 2. The row as flotilla left it.
    let item = lease_item(&env, &shard).await.expect("a lease row");
    report(
        TAG,
        &format!("row after flotilla's prepare: {}", show(&item)),
    );
    assert_eq!(text(&item, "leaseOwner").as_deref(), Some("flotilla-prep"));
    assert_eq!(
        text(&item, "checkpoint").as_deref(),
        Some(committed.sequence.as_str())
    );
    assert_eq!(
        text(&item, "pendingCheckpoint").as_deref(),
        Some(prepared.sequence.as_str()),
        "flotilla's prepare in the row: {}",
        show(&item)
    );
    assert_eq!(
        number(&item, "pendingCheckpointSubSequenceNumber").as_deref(),
        Some("0")
    );
    assert_eq!(
        binary(&item, "pendingCheckpointState").as_deref(),
        Some(FLOTILLA_STATE.as_bytes()),
        "flotilla's state in the row, binary: {}",
        show(&item)
    );

    // 3. The KCL takes the lease once it judges it expired, and is shown both positions
    //    and the state.
    put(&env, 20..30).await;
    let java_started = Instant::now();
    let mut java = JavaApp::start(&env, "java-report", FAILOVER, &Mode::Report);
    let init = java.wait_for("initialize", JAVA_TAKE_LIMIT).await;
    report(
        TAG,
        &format!(
            "flotilla crash -> KCL initialize: {} (Java app start -> initialize {}; \
             failover time {FAILOVER:?})",
            ms(crashed.elapsed()),
            ms(java_started.elapsed())
        ),
    );
    report(TAG, &format!("KCL initialize: {init}"));
    assert_eq!(init["shard_id"], shard.as_str());
    assert_eq!(
        init["pendingCheckpointSequenceNumber"],
        java_position(prepared.sequence.as_str(), 0),
        "the KCL's initialize shows flotilla's prepared checkpoint",
    );
    let state = init["pendingCheckpointState"]
        .as_str()
        .map(|b| base64::engine::general_purpose::STANDARD.decode(b).unwrap());
    assert_eq!(
        state.as_deref(),
        Some(FLOTILLA_STATE.as_bytes()),
        "the KCL's initialize shows flotilla's state: {init}",
    );
    assert_eq!(
        init["extendedSequenceNumber"],
        java_position(committed.sequence.as_str(), 0),
        "the KCL's initialize is at flotilla's committed checkpoint",
    );

    // 4. The KCL reads from the record after the committed checkpoint.
    let start = Instant::now();
    while !java.records().iter().any(|(_, d)| d == "r29") {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the KCL did not read up to r29",
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let read: Vec<String> = java.records().into_iter().map(|(_, d)| d).collect();
    assert_eq!(
        read,
        data(5..30),
        "the KCL reads from the record after the committed checkpoint ({RESUME_AT})"
    );
    let item = lease_item(&env, &shard).await.expect("a lease row");
    report(TAG, &format!("row after the KCL's take: {}", show(&item)));
    java.kill();
    report(TAG, &format!("total {}", ms(started.elapsed())));
}
