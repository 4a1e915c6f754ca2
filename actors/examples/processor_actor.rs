//! A processor written as the user's own `ractor` actor (`WorkerBuilder::processor_actor`)
//! instead of a `Processor`: one actor per shard, handling `ProcessorMsg`.
//!
//! The route for code that already lives in actors, or wants its own mailbox. The
//! contract (`ProcessorMsg`'s docs) is what the `Processor` host does for you: ack every
//! batch through its `Checkpointer` (the checkpoint advances over the acked prefix, as
//! in watermark mode), answer the `ShardEnded` and `ShutdownRequested` reply ports (the
//! shard's end checkpoint and the worker's shutdown wait for them), and stop on
//! `LeaseLost` without acking. This one batches writes: it buffers batches, writes them
//! to an in-memory sink every `FLUSH_EVERY` records or when its reader has caught up,
//! and acks them only after the write.
//!
//! `main` (and the test below) run it across a shard split: the parent's last records
//! are flushed when it ends, the children start after, and every key stays in order.
//!
//! ```sh
//! cargo run -p flotilla-actors --example processor_actor    # finishes by itself
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{LeaseTable, PutRecord, StreamAdmin, StreamClient};
use flotilla_actors::model::{Checkpoint, ShardId};
use flotilla_actors::{Backend, Batch, Checkpointer, ProcessorMsg, Settings, ShardInfo, Worker};
use ractor::{Actor, ActorProcessingErr, ActorRef};

const STREAM: &str = "clicks";
const APPLICATION: &str = "click-batcher";
const KEYS: u64 = 8;
/// Records buffered before one write to the sink.
const FLUSH_EVERY: usize = 25;

/// One write to the sink: the shard it came from and its rows (`key:index`).
type Write = (ShardId, Vec<String>);

/// A stand-in for a database that takes rows in bulk.
#[derive(Clone, Default)]
struct Sink {
    writes: Arc<Mutex<Vec<Write>>>,
}

impl Sink {
    fn write(&self, shard: &ShardId, rows: Vec<String>) -> Result<(), String> {
        self.writes
            .lock()
            .map_err(|_| "sink lock poisoned".to_owned())?
            .push((shard.clone(), rows));
        Ok(())
    }

    fn writes(&self) -> Vec<Write> {
        self.writes.lock().map(|w| w.clone()).unwrap_or_default()
    }

    fn rows(&self) -> Vec<String> {
        self.writes()
            .into_iter()
            .flat_map(|(_, rows)| rows)
            .collect()
    }
}

/// The user's actor: one per shard, started by the worker's factory.
struct Batcher;

struct BatcherState {
    sink: Sink,
    shard: Option<ShardId>,
    /// Batches written to nothing yet, with the checkpointer that acks them.
    buffered: Vec<(Batch, Checkpointer)>,
    buffered_records: usize,
}

impl BatcherState {
    /// Writes what is buffered, then acks it: the checkpoint never passes a record the
    /// sink does not hold.
    fn flush(&mut self) -> Result<(), String> {
        if self.buffered.is_empty() {
            return Ok(());
        }
        let shard = self.shard.clone().ok_or("a batch before Initialize")?;
        let rows = self
            .buffered
            .iter()
            .flat_map(|(batch, _)| batch.records())
            .map(|r| String::from_utf8_lossy(&r.data).into_owned())
            .collect();
        self.sink.write(&shard, rows)?;
        for (batch, checkpointer) in self.buffered.drain(..) {
            checkpointer.ack_batch(&batch);
        }
        self.buffered_records = 0;
        Ok(())
    }
}

impl Actor for Batcher {
    type Msg = ProcessorMsg;
    type State = BatcherState;
    type Arguments = Sink;

    async fn pre_start(
        &self,
        _: ActorRef<ProcessorMsg>,
        sink: Sink,
    ) -> Result<BatcherState, ActorProcessingErr> {
        Ok(BatcherState {
            sink,
            shard: None,
            buffered: Vec::new(),
            buffered_records: 0,
        })
    }

    async fn handle(
        &self,
        myself: ActorRef<ProcessorMsg>,
        message: ProcessorMsg,
        state: &mut BatcherState,
    ) -> Result<(), ActorProcessingErr> {
        // No `_ =>` arm: a message added to the protocol must fail to compile here, not
        // go unanswered.
        match message {
            ProcessorMsg::Initialize(info) => state.shard = Some(info.shard_id),
            ProcessorMsg::Process(batch, checkpointer) => {
                // Caught up: no more batches may come for a while, so write now rather
                // than hold the checkpoint back.
                let caught_up = batch.millis_behind_latest() == Some(0);
                state.buffered_records += batch.len();
                state.buffered.push((batch, checkpointer));
                if state.buffered_records >= FLUSH_EVERY || caught_up {
                    state.flush()?;
                }
            }
            ProcessorMsg::LeaseLost => {
                // Another worker reads these from the last checkpoint: write nothing,
                // ack nothing.
                state.buffered.clear();
                myself.stop(Some("lease lost".to_owned()));
            }
            // The reply lets the shard's end (and its children) or the worker's
            // shutdown go on: flush first, and say whether that worked.
            ProcessorMsg::ShardEnded(_, reply) | ProcessorMsg::ShutdownRequested(_, reply) => {
                let flushed = state.flush();
                if reply.send(flushed).is_err() {
                    // The reader gave up waiting; it will not count on this answer.
                    println!("{:?}: nobody waited for the answer", state.shard);
                }
            }
        }
        Ok(())
    }
}

fn settings() -> Settings {
    let mut settings = Settings::default();
    settings.checkpoint.interval = Duration::from_millis(200);
    settings.reader.max_records = 10;
    settings.reader.poll_interval = Duration::from_millis(20);
    settings.reader.parent_poll_interval = Duration::from_millis(200);
    settings.reader.shard_sync_interval = Duration::from_secs(1);
    settings.status.bind = "127.0.0.1:0".to_owned();
    settings
}

fn clicks(from: u64, to: u64) -> Vec<PutRecord> {
    (from..to)
        .map(|i| PutRecord {
            partition_key: format!("user-{}", i % KEYS),
            explicit_hash_key: None,
            data: Bytes::from(format!("user-{}:{i}", i % KEYS)),
        })
        .collect()
}

/// Waits until the sink holds `rows` rows, for at most a minute.
async fn wait_for_rows(sink: &Sink, rows: usize) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(60), async {
        while sink.rows().len() < rows {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .map_err(|_| format!("the sink has {} rows, not {rows}", sink.rows().len()))
}

/// What a run across a split left behind.
#[derive(Debug)]
struct Outcome {
    sink: Vec<Write>,
    parent: ShardId,
    /// Every lease's checkpoint at the end.
    checkpoints: BTreeMap<ShardId, Checkpoint>,
}

/// Runs a worker with the `Batcher` over 100 records, a split, and 100 more.
async fn across_a_split() -> Result<Outcome, Box<dyn std::error::Error>> {
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams.create_stream(STREAM, 1).await?;
    streams.put_records(STREAM, &clicks(0, 100)).await?;
    let dynamo = MemoryDynamo::new();
    let sink = Sink::default();

    let for_factory = sink.clone();
    let worker = Worker::builder()
        .settings(settings())
        .stream(STREAM)
        .application(APPLICATION)
        .backend(Backend::memory(
            streams.clone(),
            dynamo.clone(),
            MemoryMetrics::new(),
        ))
        .processor_actor(move |_: ShardInfo| {
            let sink = for_factory.clone();
            async move {
                let (actor, _) = Actor::spawn(None, Batcher, sink)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(actor)
            }
        })
        .start()
        .await?;

    wait_for_rows(&sink, 100).await?;
    let parent = streams
        .list_shards(STREAM)
        .await?
        .pop()
        .ok_or("the stream has no shard")?;
    let middle = parent.hash_range.start + (parent.hash_range.end - parent.hash_range.start) / 2;
    streams.split_shard(STREAM, &parent.id, middle).await?;
    streams.put_records(STREAM, &clicks(100, 200)).await?;
    wait_for_rows(&sink, 200).await?;

    let report = worker.shutdown().await?;
    if !report.clean() {
        return Err(format!("the shutdown was not clean: {report:?}").into());
    }
    let checkpoints = dynamo
        .lease_table(APPLICATION)
        .scan()
        .await?
        .leases
        .into_iter()
        .map(|lease| (lease.key.shard_id(), lease.checkpoint))
        .collect();
    Ok(Outcome {
        sink: sink.writes(),
        parent: parent.id,
        checkpoints,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    match across_a_split().await {
        Ok(outcome) => {
            for (shard, rows) in &outcome.sink {
                println!("wrote {} rows from {shard}", rows.len());
            }
            for (shard, checkpoint) in &outcome.checkpoints {
                let role = if *shard == outcome.parent {
                    "split"
                } else {
                    "child"
                };
                println!("{shard} ({role}): checkpoint {checkpoint:?}");
            }
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("processor_actor: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each key's indices, in the order the sink got them.
    fn by_key(rows: &[String]) -> BTreeMap<String, Vec<u64>> {
        let mut keys: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for row in rows {
            let (key, index) = row.split_once(':').unwrap_or((row, ""));
            keys.entry(key.to_owned())
                .or_default()
                .push(index.parse().unwrap_or(u64::MAX));
        }
        keys
    }

    #[tokio::test(start_paused = true)]
    async fn the_actor_writes_in_bulk_acks_after_writing_and_keeps_each_key_in_order() {
        let outcome = across_a_split().await.map_err(|e| e.to_string());
        let Ok(outcome) = outcome else {
            panic!("{outcome:?}");
        };
        let rows: Vec<String> = outcome
            .sink
            .iter()
            .flat_map(|(_, rows)| rows.clone())
            .collect();
        // Every record once, each key in order, across the split.
        let keys = by_key(&rows);
        assert_eq!(keys.len(), KEYS as usize);
        for (key, indices) in &keys {
            let expected: Vec<u64> = (0..200)
                .filter(|i| format!("user-{}", i % KEYS) == *key)
                .collect();
            assert_eq!(indices, &expected, "{key}");
        }
        // Buffered: fewer writes than the 20 batches of ten records.
        assert!(outcome.sink.len() < 20, "{} writes", outcome.sink.len());
        // The parent's end was answered (its SHARD_END written, its children read),
        // and the shutdown's flush acked the rest: every child checkpointed at a record.
        assert_eq!(
            outcome.checkpoints.get(&outcome.parent),
            Some(&Checkpoint::ShardEnd),
            "{outcome:?}"
        );
        assert_eq!(outcome.checkpoints.len(), 3, "{outcome:?}");
        for (shard, checkpoint) in &outcome.checkpoints {
            if *shard != outcome.parent {
                assert!(matches!(checkpoint, Checkpoint::At(_)), "{outcome:?}");
            }
        }
    }
}
