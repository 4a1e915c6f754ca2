//! How to test your processor: on the memory backend, in tokio's paused time, with no
//! AWS and no sleeps.
//!
//! The processor under test (`Ledger`) appends what it did to an output it is given
//! (`Entries`; in production a database client, in tests a `Vec` behind a lock). Each
//! test puts records into an in-memory stream, runs a real worker over it, waits until
//! the output holds what it should, and asserts on it: every record processed, each
//! key in order, across a shard split, and after a worker crash (a second worker takes
//! the shard over from its checkpoint; records after it come again, at-least-once).
//! `#[tokio::test(start_paused = true)]` makes the worker's timers (polls, heartbeats,
//! lease failover) advance instantly whenever everything waits on time.
//!
//! ```sh
//! cargo test -p flotilla-actors --example testing_your_processor   # the tests
//! cargo run -p flotilla-actors --example testing_your_processor    # one run, printed
//! ```

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{PutRecord, StreamAdmin};
use flotilla_actors::{Backend, Batch, Checkpointer, Processor, ProcessorError, Settings, Worker};

/// What the processor did: `(key, record data)` in the order it processed them.
type Entries = Arc<Mutex<Vec<(String, String)>>>;

/// The processor under test: your own, given its output by the factory.
struct Ledger {
    entries: Entries,
}

impl Processor for Ledger {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let mut entries = self
            .entries
            .lock()
            .map_err(|_| ProcessorError::msg("entries lock poisoned"))?;
        for record in batch.records() {
            let data = String::from_utf8(record.data.to_vec())?;
            entries.push((record.partition_key.clone(), data));
        }
        Ok(())
    }
}

const STREAM: &str = "orders";
const APPLICATION: &str = "ledger";

/// Starts a worker with your processor on the in-memory stream and lease table. Short
/// intervals so a failover happens in a few (paused) seconds.
async fn start_worker(
    streams: &MemoryStreams,
    dynamo: &MemoryDynamo,
    worker_id: &str,
    entries: &Entries,
) -> Result<Worker, Box<dyn std::error::Error>> {
    let mut settings = Settings::default();
    settings.lease.failover_time = Duration::from_secs(4);
    settings.lease.heartbeat_interval = Duration::from_millis(500);
    settings.lease.fence_margin = Duration::from_secs(2);
    settings.checkpoint.interval = Duration::from_millis(200);
    settings.reader.shard_sync_interval = Duration::from_secs(1);
    settings.status.bind = "127.0.0.1:0".to_owned(); // several workers in one process
    let entries = entries.clone();
    let worker = Worker::builder()
        .settings(settings)
        .stream(STREAM)
        .application(APPLICATION)
        .worker_id(worker_id)
        .backend(Backend::memory(
            streams.clone(),
            dynamo.clone(),
            MemoryMetrics::new(),
        ))
        .processor(move |_: &_| Ledger {
            entries: entries.clone(),
        })
        .start()
        .await?;
    Ok(worker)
}

/// Puts orders `from..to`, eight customers, as `("customer-N", "N:index")`.
async fn put_orders(streams: &MemoryStreams, from: u64, to: u64) -> Result<(), String> {
    let records: Vec<PutRecord> = (from..to)
        .map(|i| PutRecord {
            partition_key: format!("customer-{}", i % 8),
            explicit_hash_key: None,
            data: Bytes::from(format!("{}:{i}", i % 8)),
        })
        .collect();
    streams
        .put_records(STREAM, &records)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Waits (in paused time: instantly) until `entries` satisfies `done`, for at most a
/// simulated minute.
async fn wait_until(entries: &Entries, done: impl Fn(&[(String, String)]) -> bool) -> bool {
    let check = || entries.lock().map(|e| done(&e)).unwrap_or(false);
    tokio::time::timeout(Duration::from_secs(60), async {
        while !check() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .is_ok()
}

/// The indices each key got, in the order processed.
fn by_key(entries: &Entries) -> std::collections::BTreeMap<String, Vec<u64>> {
    let mut keys = std::collections::BTreeMap::<String, Vec<u64>>::new();
    for (key, data) in entries.lock().map(|e| e.clone()).unwrap_or_default() {
        let index = data.split_once(':').and_then(|(_, i)| i.parse().ok());
        keys.entry(key).or_default().push(index.unwrap_or(u64::MAX));
    }
    keys
}

/// Each customer's order indices below `to`, in order.
fn expected(from: u64, to: u64) -> std::collections::BTreeMap<String, Vec<u64>> {
    let mut keys = std::collections::BTreeMap::<String, Vec<u64>>::new();
    for i in from..to {
        keys.entry(format!("customer-{}", i % 8))
            .or_default()
            .push(i);
    }
    keys
}

#[tokio::main]
async fn main() -> ExitCode {
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    let dynamo = MemoryDynamo::new();
    let entries = Entries::default();
    let run = async {
        streams.create_stream(STREAM, 2).await?;
        put_orders(&streams, 0, 100).await?;
        let worker = start_worker(&streams, &dynamo, "worker-a", &entries).await?;
        let all = wait_until(&entries, |e| e.len() >= 100).await;
        let report = worker.shutdown().await?;
        Ok::<_, Box<dyn std::error::Error>>(
            all && report.clean() && by_key(&entries) == expected(0, 100),
        )
    };
    match run.await {
        Ok(true) => {
            println!("every order processed once, each customer's in order");
            ExitCode::SUCCESS
        }
        Ok(false) => {
            eprintln!(
                "testing_your_processor: not what was expected: {:?}",
                by_key(&entries)
            );
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("testing_your_processor: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use flotilla_actors::backend::StreamClient;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn every_order_is_processed_once_in_order_per_customer() {
        let streams = MemoryStreams::new(MemoryStreamsConfig::default());
        streams.create_stream(STREAM, 4).await.unwrap();
        put_orders(&streams, 0, 200).await.unwrap();
        let dynamo = MemoryDynamo::new();
        let entries = Entries::default();
        let worker = start_worker(&streams, &dynamo, "worker-a", &entries)
            .await
            .unwrap();

        assert!(wait_until(&entries, |e| e.len() >= 200).await);
        assert!(worker.shutdown().await.unwrap().clean());
        assert_eq!(by_key(&entries), expected(0, 200));
    }

    #[tokio::test(start_paused = true)]
    async fn each_customer_stays_in_order_across_a_split() {
        let streams = MemoryStreams::new(MemoryStreamsConfig::default());
        streams.create_stream(STREAM, 1).await.unwrap();
        put_orders(&streams, 0, 100).await.unwrap();
        let dynamo = MemoryDynamo::new();
        let entries = Entries::default();
        let worker = start_worker(&streams, &dynamo, "worker-a", &entries)
            .await
            .unwrap();
        assert!(wait_until(&entries, |e| e.len() >= 100).await);

        // Split the shard in two; later orders go to its children, which are read
        // only after the parent is finished.
        let parent = streams.list_shards(STREAM).await.unwrap().remove(0);
        let range = parent.hash_range;
        let middle = range.start + (range.end - range.start) / 2;
        streams
            .split_shard(STREAM, &parent.id, middle)
            .await
            .unwrap();
        put_orders(&streams, 100, 200).await.unwrap();

        assert!(wait_until(&entries, |e| e.len() >= 200).await);
        assert!(worker.shutdown().await.unwrap().clean());
        assert_eq!(by_key(&entries), expected(0, 200));
    }

    #[tokio::test(start_paused = true)]
    async fn a_second_worker_takes_over_from_the_checkpoint_after_a_crash() {
        let streams = MemoryStreams::new(MemoryStreamsConfig::default());
        streams.create_stream(STREAM, 2).await.unwrap();
        put_orders(&streams, 0, 100).await.unwrap();
        let dynamo = MemoryDynamo::new();
        let first = Entries::default();
        let crashed = start_worker(&streams, &dynamo, "worker-a", &first)
            .await
            .unwrap();
        assert!(wait_until(&first, |e| e.len() >= 100).await);
        // Let its checkpoints be written, then crash it: no shutdown, leases still held.
        tokio::time::sleep(Duration::from_secs(1)).await;
        crashed.abort();

        put_orders(&streams, 100, 200).await.unwrap();
        let second = Entries::default();
        let worker = start_worker(&streams, &dynamo, "worker-b", &second)
            .await
            .unwrap();
        // Once the crashed worker's leases expire, the second takes them over and reads
        // from their checkpoints: only the new orders (after a crash in the middle of
        // a batch, some before them would come again: at-least-once).
        assert!(wait_until(&second, |e| e.len() >= 100).await);
        assert!(worker.shutdown().await.unwrap().clean());
        assert_eq!(by_key(&first), expected(0, 100));
        assert_eq!(by_key(&second), expected(100, 200));
    }
}
