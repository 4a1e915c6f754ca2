//! A service that embeds a flotilla worker with its own processor, as a user would.
//!
//! It counts orders per customer from an in-memory stream (swap `Backend::memory` for
//! `Backend::aws(region, &endpoints).await` to read a real one), checkpoints as it goes,
//! prints its status, and shuts down gracefully:
//!
//! ```sh
//! cargo run -p flotilla-actors --example embedded_worker
//! ```

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{PutRecord, StreamAdmin};
use flotilla_actors::{
    Backend, Batch, Checkpointer, Processor, ProcessorError, Settings, ShardInfo, Worker,
};

/// The user's processor: one per shard, called one batch at a time.
struct OrderCounter {
    shard: String,
    totals: Arc<Mutex<HashMap<String, u64>>>,
}

impl Processor for OrderCounter {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        println!("{}: starting at {}", shard.shard_id, shard.starting_at);
        Ok(())
    }

    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let mut totals = self
            .totals
            .lock()
            .map_err(|_| ProcessorError::msg("totals lock poisoned"))?;
        for record in batch.records() {
            *totals.entry(record.partition_key.clone()).or_default() += 1;
        }
        // Returning Ok acks the batch; its checkpoint is written within
        // `checkpoint.interval`.
        Ok(())
    }

    async fn shutdown_requested(&mut self, _: &Checkpointer) -> Result<(), ProcessorError> {
        println!("{}: shutting down", self.shard);
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams.create_stream("orders", 4).await?;
    let orders: Vec<PutRecord> = (0..1_000)
        .map(|i| PutRecord {
            partition_key: format!("customer-{}", i % 25),
            explicit_hash_key: None,
            data: Bytes::from(format!("{{\"order\":{i}}}")),
        })
        .collect();
    streams.put_records("orders", &orders).await?;

    let mut settings = Settings::default();
    settings.checkpoint.interval = Duration::from_secs(1);
    let totals = Arc::new(Mutex::new(HashMap::new()));
    let shared = totals.clone();
    let worker = Worker::builder()
        .settings(settings)
        .stream("orders")
        .application("order-counter")
        .backend(Backend::memory(
            streams,
            MemoryDynamo::new(),
            MemoryMetrics::new(),
        ))
        .processor(move |shard: &ShardInfo| OrderCounter {
            shard: shard.shard_id.to_string(),
            totals: shared.clone(),
        })
        .start()
        .await?;

    tokio::time::sleep(Duration::from_secs(3)).await;
    let status = worker.status().await?;
    for shard in &status.shards {
        println!(
            "{}: {:?}, {} records, checkpoint {}",
            shard.shard_id,
            shard.state,
            shard.records_delivered,
            shard.checkpoint.as_deref().unwrap_or("-")
        );
    }
    let report = worker.shutdown().await?;
    let counted: u64 = totals.lock().map(|t| t.values().sum()).unwrap_or(0);
    println!(
        "counted {counted} orders; clean shutdown: {}",
        report.clean()
    );
    Ok(())
}
