//! Watermark acks: records processed concurrently, finishing in any order, each acked
//! when it is done; the checkpoint advances over the acked prefix only.
//!
//! With `checkpoint.mode = "watermark"` the processor returns from `process` at once,
//! having handed each record to a tokio task with its `AckToken`
//! (`Batch::iter_with_tokens`); the task acks it (`Checkpointer::ack`) when it is
//! finished. The shard's reader checkpoints the highest record below which everything
//! is acked, so one slow record holds the checkpoint back however many after it are
//! done, and a restart reads again from the first record not acked: never past one.
//!
//! `main` (and the tests below) process a stream in which one record never finishes,
//! crash the worker, and show that the next worker starts again at that record.
//!
//! ```sh
//! cargo run -p flotilla-actors --example watermark_acks    # finishes by itself
//! ```

use std::collections::BTreeSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{LeaseTable, PutRecord, StreamAdmin};
use flotilla_actors::model::{Checkpoint, SequenceNumber};
use flotilla_actors::{
    Backend, Batch, CheckpointMode, Checkpointer, Processor, ProcessorError, Settings, Worker,
};

const STREAM: &str = "images";
const APPLICATION: &str = "thumbnailer";
const RECORDS: u64 = 100;
/// The record whose task never finishes in the first worker (a hung download, say).
const STUCK: u64 = 30;

/// What the tasks finished: each record's index (its data) and sequence number.
#[derive(Clone, Default)]
struct Done(Arc<Mutex<Vec<(u64, SequenceNumber)>>>);

impl Done {
    fn push(&self, index: u64, sequence: SequenceNumber) {
        if let Ok(mut done) = self.0.lock() {
            done.push((index, sequence));
        }
    }

    fn all(&self) -> Vec<(u64, SequenceNumber)> {
        self.0.lock().map(|d| d.clone()).unwrap_or_default()
    }

    fn indices(&self) -> BTreeSet<u64> {
        self.all().into_iter().map(|(i, _)| i).collect()
    }
}

/// The user's processor: one task per record, acked when the task is done.
struct Concurrent {
    done: Done,
    /// A record whose task never finishes.
    stuck: Option<u64>,
}

impl Processor for Concurrent {
    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        for (token, record) in batch.iter_with_tokens() {
            let index: u64 = std::str::from_utf8(&record.data)?.parse()?;
            let sequence = record.sequence_number.clone();
            let cp = cp.clone();
            let done = self.done.clone();
            let stuck = self.stuck == Some(index);
            tokio::spawn(async move {
                // Work that takes 1 to 40 ms, so tasks finish out of order.
                tokio::time::sleep(Duration::from_millis(1 + index * 17 % 40)).await;
                if stuck {
                    std::future::pending::<()>().await;
                }
                done.push(index, sequence);
                // Done: the checkpoint may pass this record once all before it are.
                cp.ack(token);
            });
        }
        // Returning acks nothing in watermark mode; the reader goes on fetching (up
        // to `reader.window_records` unacked records).
        Ok(())
    }
}

fn settings() -> Settings {
    let mut settings = Settings::default();
    settings.checkpoint.mode = CheckpointMode::Watermark;
    settings.checkpoint.interval = Duration::from_millis(200);
    settings.lease.failover_time = Duration::from_secs(4);
    settings.lease.heartbeat_interval = Duration::from_millis(500);
    settings.lease.fence_margin = Duration::from_secs(2);
    settings.reader.max_records = 10;
    settings.reader.poll_interval = Duration::from_millis(20);
    settings.status.bind = "127.0.0.1:0".to_owned();
    settings
}

async fn start(
    streams: &MemoryStreams,
    dynamo: &MemoryDynamo,
    done: &Done,
    stuck: Option<u64>,
) -> Result<Worker, Box<dyn std::error::Error>> {
    let done = done.clone();
    let worker = Worker::builder()
        .settings(settings())
        .stream(STREAM)
        .application(APPLICATION)
        .backend(Backend::memory(
            streams.clone(),
            dynamo.clone(),
            MemoryMetrics::new(),
        ))
        .processor(move |_: &_| Concurrent {
            done: done.clone(),
            stuck,
        })
        .start()
        .await?;
    Ok(worker)
}

/// Waits until `done` holds `count` distinct records, for at most a minute.
async fn wait_for(done: &Done, count: usize) -> Result<(), String> {
    tokio::time::timeout(Duration::from_secs(60), async {
        while done.indices().len() < count {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .map_err(|_| format!("{} records done, not {count}", done.indices().len()))
}

/// What happened around the stuck record.
#[derive(Debug)]
struct Outcome {
    /// Records the first worker finished (all but the stuck one).
    first: Vec<(u64, SequenceNumber)>,
    /// The record the checkpoint was at when the first worker crashed.
    checkpoint: u64,
    /// Records the second worker finished, in the order they finished.
    second: Vec<(u64, SequenceNumber)>,
}

/// One worker finishes every record but one, crashes; the next finishes the stream.
async fn stuck_then_restart() -> Result<Outcome, Box<dyn std::error::Error>> {
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams.create_stream(STREAM, 1).await?;
    let records: Vec<PutRecord> = (0..RECORDS)
        .map(|i| PutRecord {
            partition_key: format!("image-{i}"),
            explicit_hash_key: None,
            data: Bytes::from(i.to_string()),
        })
        .collect();
    streams.put_records(STREAM, &records).await?;
    let dynamo = MemoryDynamo::new();

    let first_done = Done::default();
    let first = start(&streams, &dynamo, &first_done, Some(STUCK)).await?;
    wait_for(&first_done, RECORDS as usize - 1).await?;
    // Several checkpoint intervals: the checkpoint has gone as far as it can.
    tokio::time::sleep(Duration::from_secs(2)).await;
    first.abort();
    let first = first_done.all();

    let lease = dynamo
        .lease_table(APPLICATION)
        .scan()
        .await?
        .leases
        .pop()
        .ok_or("no lease row after the first worker")?;
    let checkpoint = match &lease.checkpoint {
        Checkpoint::At(at) => first
            .iter()
            .find(|(_, sequence)| *sequence == at.sequence)
            .map(|(index, _)| *index)
            .ok_or("the checkpoint is at a record no task finished")?,
        other => return Err(format!("no checkpoint at a record: {other:?}").into()),
    };
    println!(
        "first worker: {} of {RECORDS} records done, record {STUCK} stuck, checkpoint at record {checkpoint}",
        first.len()
    );

    let second_done = Done::default();
    let second = start(&streams, &dynamo, &second_done, None).await?;
    wait_for(&second_done, (RECORDS - checkpoint - 1) as usize).await?;
    let report = second.shutdown().await?;
    if !report.clean() {
        return Err(format!("the second worker's shutdown was not clean: {report:?}").into());
    }
    let second = second_done.all();
    println!(
        "second worker: {} records done, from record {}",
        second.len(),
        second_done.indices().first().copied().unwrap_or(RECORDS)
    );
    Ok(Outcome {
        first,
        checkpoint,
        second,
    })
}

#[tokio::main]
async fn main() -> ExitCode {
    match stuck_then_restart().await {
        Ok(outcome) => {
            let again = outcome
                .first
                .iter()
                .filter(|(index, _)| *index > outcome.checkpoint)
                .count();
            println!(
                "{again} records done after the checkpoint were processed again; {} in all",
                outcome.first.len() + outcome.second.len()
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("watermark_acks: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn indices(done: &[(u64, SequenceNumber)]) -> Vec<u64> {
        done.iter().map(|(index, _)| *index).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_record_never_acked_holds_the_checkpoint_and_is_read_again() {
        let outcome = stuck_then_restart().await.map_err(|e| e.to_string());
        let Ok(outcome) = outcome else {
            panic!("{outcome:?}");
        };
        let first = indices(&outcome.first);
        // The tasks finished out of order, and every record but the stuck one did.
        assert!(first.windows(2).any(|w| w[0] > w[1]), "{first:?}");
        let mut sorted = first.clone();
        sorted.sort_unstable();
        let expected: Vec<u64> = (0..RECORDS).filter(|i| *i != STUCK).collect();
        assert_eq!(sorted, expected);
        // The later records were acked, yet the checkpoint stayed just before the stuck
        // record.
        assert_eq!(outcome.checkpoint, STUCK - 1);
        // The next worker started again at the stuck record: nothing unacked skipped.
        let mut second = indices(&outcome.second);
        second.sort_unstable();
        assert_eq!(second, (STUCK..RECORDS).collect::<Vec<_>>());
    }
}
