//! Manual checkpoints: a processor that writes records to its own sink and checkpoints
//! only what the sink has confirmed.
//!
//! With `checkpoint.mode = "manual"` a batch returning Ok acks nothing: the processor
//! says how far it got with `Checkpointer::checkpoint_batch` (or `checkpoint_record`,
//! `checkpoint(seq)`). Here it writes each batch to a fallible in-memory "database" and
//! checkpoints after every `CHECKPOINT_EVERY` records the database confirmed, and on
//! shutdown. A failed write fails the batch: the shard restarts from its checkpoint and
//! the records after it come again (at-least-once: the sink must take a row twice). A
//! lost lease stops it without checkpointing (another worker owns the shard now).
//!
//! `main` (and the test below) crash a worker part-way through, start another on the
//! same lease table, and show it resumes right after the last checkpoint: nothing is
//! skipped, and what was written after the checkpoint is written again.
//!
//! ```sh
//! cargo run -p flotilla-actors --example manual_checkpoints    # finishes by itself
//! ```

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{LeaseTable, PutRecord, StreamAdmin};
use flotilla_actors::model::{Checkpoint, SequenceNumber};
use flotilla_actors::{
    Backend, Batch, CheckpointError, CheckpointMode, Checkpointer, Processor, ProcessorError,
    Record, Settings, Worker,
};

const STREAM: &str = "payments";
const APPLICATION: &str = "payments-to-db";
const RECORDS: u64 = 200;
/// Confirmed records between two checkpoints: fewer checkpoint writes, more records
/// read again after a crash.
const CHECKPOINT_EVERY: u64 = 50;

/// A stand-in for a database: rows appended in write order. Every `fail_every`-th write
/// is refused (as a real one times out now and then), and once it holds `hang_at` rows
/// it stops answering (so a demo can crash a worker at a known place).
#[derive(Clone, Default)]
struct Sink {
    rows: Arc<Mutex<Vec<Row>>>,
    writes: Arc<AtomicU64>,
    fail_every: u64,
    hang_at: Option<usize>,
}

/// One record as the sink stores it.
#[derive(Clone, Debug, PartialEq)]
struct Row {
    sequence: SequenceNumber,
    /// The record's place in the stream (its data), to check order and gaps.
    index: u64,
}

#[derive(Debug, thiserror::Error)]
enum SinkError {
    #[error("sink: write {0} timed out")]
    TimedOut(u64),
    #[error("sink: record {0} is not a number")]
    BadData(SequenceNumber),
    #[error("sink: lock poisoned")]
    Poisoned,
}

impl Sink {
    /// Writes all rows or none.
    async fn write(&self, records: &[Record]) -> Result<(), SinkError> {
        if self.hang_at.is_some_and(|at| self.rows().len() >= at) {
            std::future::pending::<()>().await;
        }
        let write = self.writes.fetch_add(1, Ordering::Relaxed) + 1;
        if self.fail_every > 0 && write.is_multiple_of(self.fail_every) {
            return Err(SinkError::TimedOut(write));
        }
        let rows = records
            .iter()
            .map(|r| {
                let index = std::str::from_utf8(&r.data)
                    .ok()
                    .and_then(|text| text.parse().ok())
                    .ok_or_else(|| SinkError::BadData(r.sequence_number.clone()))?;
                Ok(Row {
                    sequence: r.sequence_number.clone(),
                    index,
                })
            })
            .collect::<Result<Vec<_>, SinkError>>()?;
        self.rows
            .lock()
            .map_err(|_| SinkError::Poisoned)?
            .extend(rows);
        Ok(())
    }

    fn rows(&self) -> Vec<Row> {
        self.rows.lock().map(|r| r.clone()).unwrap_or_default()
    }
}

/// The user's processor: writes each batch, checkpoints what was written.
struct SinkWriter {
    sink: Sink,
    /// Records written since the last checkpoint.
    unchecked: u64,
    /// The last record the sink confirmed.
    last_written: Option<Record>,
}

impl SinkWriter {
    /// Checkpoints the last record the sink confirmed.
    async fn checkpoint(&mut self, cp: &Checkpointer) -> Result<(), ProcessorError> {
        let Some(last) = &self.last_written else {
            return Ok(());
        };
        match cp.checkpoint_record(last).await {
            Ok(()) => {
                self.unchecked = 0;
                Ok(())
            }
            // Another worker owns the shard now and reads from the last checkpoint
            // written. Stop here: retrying cannot succeed, and `lease_lost` follows.
            Err(CheckpointError::LeaseLost { shard }) => {
                println!("{shard}: lease lost, stopping");
                Ok(())
            }
            // Kept, and written when the lease table answers again.
            Err(CheckpointError::NotWritten { .. }) => Ok(()),
            // A bug in this processor (a record it was never given) or a stopping
            // shard: fail the batch, the shard restarts from its checkpoint.
            Err(error) => Err(error.into()),
        }
    }
}

impl Processor for SinkWriter {
    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        if batch.is_empty() {
            // Nothing to write, and nothing new to checkpoint.
            return Ok(());
        }
        // A failed write returns the error: the shard restarts from its checkpoint, so
        // nothing is lost (and nothing is checkpointed past what the sink holds).
        self.sink.write(batch.records()).await?;
        self.last_written = batch.records().last().cloned();
        self.unchecked += batch.len() as u64;
        if self.unchecked >= CHECKPOINT_EVERY {
            self.checkpoint(cp).await?;
        }
        Ok(())
    }

    async fn lease_lost(&mut self) {
        println!("lease lost: the next owner reads again from the last checkpoint");
    }

    async fn shutdown_requested(&mut self, cp: &Checkpointer) -> Result<(), ProcessorError> {
        self.checkpoint(cp).await?;
        // Wait for the checkpoint's write, so the next worker starts after it.
        cp.flush().await?;
        Ok(())
    }
}

/// Settings for a quick demo: manual mode, and a short failover so the second worker
/// takes over the crashed one's lease within seconds.
fn settings() -> Settings {
    let mut settings = Settings::default();
    settings.checkpoint.mode = CheckpointMode::Manual;
    settings.checkpoint.interval = Duration::from_millis(200);
    settings.lease.failover_time = Duration::from_secs(4);
    settings.lease.heartbeat_interval = Duration::from_millis(500);
    settings.lease.fence_margin = Duration::from_secs(2);
    settings.reader.max_records = 10;
    settings.reader.poll_interval = Duration::from_millis(20);
    settings.status.bind = "127.0.0.1:0".to_owned();
    settings
}

/// What happened: the sink's rows after each worker, and the checkpoint between them.
#[derive(Debug)]
struct Outcome {
    /// Rows the first worker wrote before it crashed.
    first: Vec<Row>,
    /// The index of the record the checkpoint was at when it crashed.
    checkpoint: u64,
    /// Rows the second worker wrote.
    second: Vec<Row>,
}

async fn start(
    streams: &MemoryStreams,
    dynamo: &MemoryDynamo,
    sink: &Sink,
) -> Result<Worker, Box<dyn std::error::Error>> {
    let sink = sink.clone();
    let worker = Worker::builder()
        .settings(settings())
        .stream(STREAM)
        .application(APPLICATION)
        .backend(Backend::memory(
            streams.clone(),
            dynamo.clone(),
            MemoryMetrics::new(),
        ))
        .processor(move |_: &_| SinkWriter {
            sink: sink.clone(),
            unchecked: 0,
            last_written: None,
        })
        .start()
        .await?;
    Ok(worker)
}

/// Waits until the sink holds `rows` rows, for at most a minute.
async fn wait_for_rows(sink: &Sink, rows: usize) -> Result<(), String> {
    wait_for(sink, |held| held.len() >= rows).await
}

/// Waits until the sink's rows are as `done` wants them, for at most a minute.
async fn wait_for(sink: &Sink, done: impl Fn(&[Row]) -> bool) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(60), async {
        while !done(&sink.rows()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .map_err(|_| format!("still waiting; the sink has {} rows", sink.rows().len()))
}

/// Writes part of the stream with one worker, crashes it, and finishes with another.
async fn crash_and_resume() -> Result<Outcome, Box<dyn std::error::Error>> {
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams.create_stream(STREAM, 1).await?;
    let records: Vec<PutRecord> = (0..RECORDS)
        .map(|i| PutRecord {
            partition_key: format!("account-{}", i % 7),
            explicit_hash_key: None,
            data: Bytes::from(i.to_string()),
        })
        .collect();
    streams.put_records(STREAM, &records).await?;
    let dynamo = MemoryDynamo::new();

    // The first worker's database stops answering after 120 rows; then it crashes.
    let first_sink = Sink {
        hang_at: Some(120),
        ..Sink::default()
    };
    let first = start(&streams, &dynamo, &first_sink).await?;
    wait_for_rows(&first_sink, 120).await?;
    // Let the last checkpoint's write land, then crash: no shutdown, no flush.
    tokio::time::sleep(Duration::from_secs(1)).await;
    first.abort();
    let first_rows = first_sink.rows();

    let table = dynamo.lease_table(APPLICATION);
    let lease = table
        .scan()
        .await?
        .leases
        .pop()
        .ok_or("no lease row after the first worker")?;
    let Checkpoint::At(at) = lease.checkpoint else {
        return Err(format!("no checkpoint at a record: {:?}", lease.checkpoint).into());
    };
    let checkpoint = first_rows
        .iter()
        .find(|row| row.sequence == at.sequence)
        .ok_or("the checkpoint is at a record the sink never confirmed")?
        .index;
    println!(
        "first worker: wrote {} rows, checkpoint at record {checkpoint}, crashed",
        first_rows.len()
    );

    let second_sink = Sink::default();
    let second = start(&streams, &dynamo, &second_sink).await?;
    wait_for_rows(&second_sink, (RECORDS - checkpoint - 1) as usize).await?;
    let report = second.shutdown().await?;
    if !report.clean() {
        return Err(format!("the second worker's shutdown was not clean: {report:?}").into());
    }
    let second_rows = second_sink.rows();
    println!(
        "second worker: wrote {} rows, from record {}",
        second_rows.len(),
        second_rows.first().map_or(RECORDS, |r| r.index)
    );
    Ok(Outcome {
        first: first_rows,
        checkpoint,
        second: second_rows,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    match crash_and_resume().await {
        Ok(outcome) => {
            let again = outcome
                .first
                .iter()
                .filter(|r| r.index > outcome.checkpoint)
                .count();
            println!(
                "{again} rows written after the checkpoint were written again; {} rows in all",
                outcome.first.len() + outcome.second.len()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("manual_checkpoints: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indices(rows: &[Row]) -> Vec<u64> {
        rows.iter().map(|r| r.index).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_restarted_worker_resumes_right_after_the_last_checkpoint() {
        let outcome = crash_and_resume().await.map_err(|e| e.to_string());
        let Ok(outcome) = outcome else {
            panic!("{outcome:?}");
        };
        // The first worker wrote 120 records in stream order, and checkpointed every
        // 50 it had written: the last checkpoint is at record 99.
        assert_eq!(indices(&outcome.first), (0..120).collect::<Vec<_>>());
        assert_eq!(outcome.checkpoint, 99, "{outcome:?}");
        // The second worker started right after the checkpoint and read to the end:
        // nothing skipped, and records 100..120 were written again.
        assert_eq!(indices(&outcome.second), (100..RECORDS).collect::<Vec<_>>());
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_write_is_read_again_and_the_shutdown_checkpoints_the_rest() {
        let sink = Sink {
            fail_every: 7,
            ..Sink::default()
        };
        let streams = MemoryStreams::new(MemoryStreamsConfig::default());
        let created = streams.create_stream(STREAM, 1).await;
        assert!(created.is_ok(), "{created:?}");
        let records: Vec<PutRecord> = (0..100u64)
            .map(|i| PutRecord {
                partition_key: "k".to_owned(),
                explicit_hash_key: None,
                data: Bytes::from(i.to_string()),
            })
            .collect();
        let put = streams.put_records(STREAM, &records).await;
        assert!(put.is_ok(), "{put:?}");
        let dynamo = MemoryDynamo::new();
        let worker = start(&streams, &dynamo, &sink)
            .await
            .map_err(|e| e.to_string());
        let Ok(worker) = worker else {
            panic!("{worker:?}")
        };
        // Written in stream order: once the last is in, every record is.
        let waited = wait_for(&sink, |rows| rows.iter().any(|r| r.index == 99)).await;
        let report = worker.shutdown().await.map_err(|e| e.to_string());
        assert!(waited.is_ok(), "{waited:?}");
        assert!(matches!(&report, Ok(r) if r.clean()), "{report:?}");

        // Every seventh write failed, yet every record reached the sink; those after
        // the checkpoint before a failure were written again.
        let mut rows = indices(&sink.rows());
        assert!(rows.len() > 100, "some written twice: {rows:?}");
        rows.sort_unstable();
        rows.dedup();
        assert_eq!(rows, (0..100).collect::<Vec<_>>());
        // The shutdown checkpointed the last record written.
        let lease = dynamo
            .lease_table(APPLICATION)
            .scan()
            .await
            .map(|s| s.leases);
        let last = sink.rows().last().map(|r| r.sequence.clone());
        assert!(
            matches!(&lease, Ok(leases) if leases.len() == 1
                && matches!(&leases[0].checkpoint, Checkpoint::At(at) if Some(&at.sequence) == last.as_ref())),
            "{lease:?}"
        );
    }
}
