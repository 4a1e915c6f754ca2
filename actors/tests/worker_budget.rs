//! One memory budget per worker (`reader.worker_budget_bytes`), end to end on the memory
//! backend in paused time: 1,000 leases, processors that stall, and what the budget
//! lets through.

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::backend::{PutRecord, StreamAdmin};
use flotilla_actors::model::ShardId;
use flotilla_actors::settings::ReadMode;
use flotilla_actors::{
    Batch, Checkpointer, Processor, ProcessorError, Settings, ShardInfo, ShardState, Worker,
    WorkerStatus,
};
use support::probe::{fast_settings, read_mode, wait_until};
use support::rig::{APP, Rig, STREAM, shutdown_clean};

const SHARDS: u32 = 1_000;
const PER_SHARD: usize = 200;
/// 16 KiB guaranteed per shard at 1,000 leases: about 50 records of 100 bytes in memory
/// (each ≈ 300 bytes with its struct and sequence number), so each shard needs several
/// reads and the budget, not the per-shard window, is what holds them back.
const BUDGET: u64 = 16 * 1024 * 1024;

/// What the processors have been given, per shard; shards in `stall` hang in their first
/// `process` (until the reader fails them), once each if `once`.
#[derive(Clone, Default)]
struct Gate {
    seen: Arc<Mutex<BTreeMap<ShardId, usize>>>,
    stall: Arc<Mutex<BTreeSet<ShardId>>>,
    once: bool,
}

struct GateProcessor {
    gate: Gate,
    shard: ShardId,
}

impl Processor for GateProcessor {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let stalls = {
            let mut stall = self.gate.stall.lock().unwrap();
            if self.gate.once {
                stall.remove(&self.shard)
            } else {
                stall.contains(&self.shard)
            }
        };
        if stalls {
            tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
        }
        *self
            .gate
            .seen
            .lock()
            .unwrap()
            .entry(self.shard.clone())
            .or_default() += batch.records().len();
        Ok(())
    }
}

impl Gate {
    fn delivered(&self, shard: &ShardId) -> usize {
        self.seen.lock().unwrap().get(shard).copied().unwrap_or(0)
    }

    fn total(&self) -> usize {
        self.seen.lock().unwrap().values().sum()
    }
}

async fn start(rig: &Rig, gate: &Gate, settings: Settings) -> Worker {
    let g = gate.clone();
    Worker::builder()
        .settings(settings)
        .backend(rig.backend())
        .processor(move |shard: &ShardInfo| GateProcessor {
            gate: g.clone(),
            shard: shard.shard_id.clone(),
        })
        .start()
        .await
        .unwrap()
}

/// `PER_SHARD` records of 100 bytes on every shard.
async fn fill(rig: &Rig) -> Vec<ShardId> {
    let shards = rig.shards().await;
    let data = Bytes::from(vec![b'x'; 100]);
    let all: Vec<PutRecord> = shards
        .iter()
        .flat_map(|s| {
            let data = data.clone();
            (0..PER_SHARD).map(move |_| PutRecord {
                partition_key: "k".to_owned(),
                explicit_hash_key: Some(s.hash_range.start),
                data: data.clone(),
            })
        })
        .collect();
    for chunk in all.chunks(500) {
        rig.streams.put_records(STREAM, chunk).await.unwrap();
    }
    shards.into_iter().map(|s| s.id).collect()
}

fn settings() -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.reader.worker_budget_bytes = BUDGET;
    // Quiet shards back off to 1 s: 1,000 readers polling every 200 ms make paused time
    // crawl, and nothing here is about latency.
    s.reader.idle_max = Duration::from_secs(1);
    s.reader.processor_timeout = Duration::from_secs(3600);
    s.metrics.level = flotilla_actors::settings::MetricsLevel::None;
    s
}

/// What a read may bring beyond the budget. Polling (`pure::fetch_limit`): records here
/// are all alike, so the estimate is exact after each shard's first read, and a shard
/// holding nothing reads at least one record; the first read's estimate (1,200 bytes)
/// is above these records' size, so it brings less than its grant. The bound: one
/// record (≈ 325 bytes) per shard. Fan-out (`pure::may_pull`): an event cannot be
/// limited, and a shard's first event (or one larger than any before) may overrun: here
/// one event can hold a shard's whole backlog.
fn bound() -> u64 {
    match read_mode() {
        ReadMode::Polling => BUDGET + u64::from(SHARDS) * 400,
        ReadMode::Fanout => BUDGET + u64::from(SHARDS) * PER_SHARD as u64 * 400,
    }
}

fn shard<'a>(status: &'a WorkerStatus, id: &ShardId) -> &'a flotilla_actors::ShardStatus {
    status.shards.iter().find(|s| &s.shard_id == id).unwrap()
}

/// The status once no read is on its way (a read's grant is reserved while it is):
/// every shard's memory adds up to what the budget counts in use.
async fn settled(worker: &Worker) -> WorkerStatus {
    for _ in 0..50 {
        let status = worker.status().await.unwrap();
        let held: u64 = status.shards.iter().map(|s| s.memory_bytes).sum();
        if held == status.budget.in_use_bytes {
            return status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the budget's use never matched what the shards hold");
}

/// How long a paused-time test waits (virtual time: it costs nothing).
const PATIENCE: Duration = Duration::from_secs(900);

#[tokio::test(start_paused = true)]
async fn a_stalled_processor_holds_only_its_share_and_the_other_shards_keep_flowing() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let shards = fill(&rig).await;
    // The last shard to start: the others have backlogs by then, so it has no idle
    // share to borrow and reads up to its own share.
    let stalled = shards[shards.len() - 1].clone();
    let gate = Gate {
        once: true,
        ..Gate::default()
    };
    gate.stall.lock().unwrap().insert(stalled.clone());
    let mut s = settings();
    // Long enough to see the stalled shard wait, short enough to see it fail and
    // come back with its bytes returned.
    s.reader.processor_timeout = Duration::from_secs(120);
    let worker = start(&rig, &gate, s).await;

    let others = (SHARDS as usize - 1) * PER_SHARD;
    wait_until(
        "every other shard drained",
        PATIENCE,
        Duration::from_secs(1),
        || gate.total() >= others,
    )
    .await;
    let status = settled(&worker).await;
    let held = shard(&status, &stalled);
    assert_eq!(
        gate.delivered(&stalled),
        0,
        "its processor is stuck in its first batch"
    );
    assert_eq!(
        held.state,
        ShardState::WaitingOnBudget,
        "the stalled shard says why it reads no more: {held:?}"
    );
    let share = status.budget.share_bytes;
    assert_eq!(share, BUDGET / u64::from(SHARDS));
    assert!(
        held.memory_bytes >= share,
        "it stopped at its share, not before: {} of {share}",
        held.memory_bytes
    );
    if read_mode() == ReadMode::Polling {
        assert!(
            held.in_flight_records < PER_SHARD as u64,
            "and did not read its whole backlog: {held:?}"
        );
    }
    assert_eq!(status.budget.shards_waiting, 1);
    assert_eq!(
        status.budget.in_use_bytes, held.memory_bytes,
        "the others hold nothing now"
    );
    assert!(
        status.budget.peak_bytes <= bound(),
        "the budget held: peak {} of {BUDGET} (bound {})",
        status.budget.peak_bytes,
        bound()
    );
    for id in shards.iter().filter(|s| **s != stalled) {
        assert_eq!(gate.delivered(id), PER_SHARD, "shard {id}");
    }

    // The processor timeout fails the stalled shard; its restarted reader reads it all,
    // and the failed reader's bytes came back (no slot left behind).
    wait_until(
        "the stalled shard drained after its restart",
        PATIENCE,
        Duration::from_secs(1),
        || gate.delivered(&stalled) >= PER_SHARD,
    )
    .await;
    let status = worker.status().await.unwrap();
    assert!(shard(&status, &stalled).restarts >= 1);
    assert_eq!(
        status.budget.shards, SHARDS as usize,
        "one place per reader"
    );
    let status = settled(&worker).await;
    assert_eq!(status.budget.in_use_bytes, 0, "{:?}", status.budget);
    assert!(status.budget.peak_bytes <= bound());
    shutdown_clean(worker).await;
}

#[tokio::test(start_paused = true)]
async fn with_every_processor_but_one_stalled_the_last_shard_still_drains() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let shards = fill(&rig).await;
    let flowing = shards[SHARDS as usize / 2].clone();
    let gate = Gate::default();
    gate.stall
        .lock()
        .unwrap()
        .extend(shards.iter().filter(|s| **s != flowing).cloned());
    let worker = start(&rig, &gate, settings()).await;

    wait_until(
        "the one free shard drained",
        PATIENCE,
        Duration::from_secs(1),
        || gate.delivered(&flowing) >= PER_SHARD,
    )
    .await;
    // Let every stalled shard fill its share.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let status = settled(&worker).await;
    assert_eq!(
        gate.total(),
        PER_SHARD,
        "only the free shard processed anything"
    );
    let waiting = status
        .shards
        .iter()
        .filter(|s| s.state == ShardState::WaitingOnBudget)
        .count();
    assert_eq!(
        waiting,
        SHARDS as usize - 1,
        "every stalled shard waits on the budget"
    );
    let flowing_status = shard(&status, &flowing);
    assert_eq!(flowing_status.memory_bytes, 0, "{flowing_status:?}");
    assert!(
        status.budget.peak_bytes <= bound(),
        "peak {} of {BUDGET} (bound {})",
        status.budget.peak_bytes,
        bound()
    );
    assert!(status.budget.in_use_bytes <= bound());
    drop(worker);
}
