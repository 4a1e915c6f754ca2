//! P2: draining a real-protocol Kinesis server. 100,000 records of 100 bytes over 4
//! shards in ferrokinesis (in this process), read by a flotilla worker with a no-op
//! processor and, side by side in the same run, by a plain aws-sdk loop
//! (GetShardIterator TRIM_HORIZON, then GetRecords until the shard's records are read),
//! alternating, 5 runs each. The lease table is the in-memory one, so the figure is
//! about Kinesis reading, not DynamoDB.
//!
//!     cargo bench -p flotilla-actors --bench drain
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark: a failure is a panic

#[path = "../tests/support/servers.rs"]
#[allow(dead_code)]
mod servers;

#[path = "common/load.rs"]
mod load;
#[path = "common/stats.rs"]
#[allow(dead_code)]
mod stats;

use stats::median;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flotilla_actors::backend::aws::KinesisStream;
use flotilla_actors::backend::memory::{MemoryDynamo, MemoryMetrics};
use flotilla_actors::backend::{IteratorPosition, StreamClient};
use flotilla_actors::{
    Backend, Batch, Checkpointer, MetricsLevel, Processor, ProcessorError, Settings, Worker,
};

const RECORDS: u64 = 100_000;
const SHARDS: u32 = 4;
const RUNS: usize = 5;

struct Count(Arc<AtomicU64>);

impl Processor for Count {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        self.0
            .fetch_add(batch.records().len() as u64, Ordering::Relaxed);
        Ok(())
    }
}

/// The plain loop: one task per shard, as fast as the server answers.
async fn plain(streams: &Arc<KinesisStream>, stream: &str) -> Duration {
    let started = Instant::now();
    let shards = streams.list_shards(stream).await.unwrap();
    let total = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for shard in shards {
        let (streams, stream, total) = (streams.clone(), stream.to_owned(), total.clone());
        tasks.push(tokio::spawn(async move {
            let mut it = streams
                .get_shard_iterator(&stream, &shard.id, &IteratorPosition::TrimHorizon)
                .await
                .unwrap();
            loop {
                let batch = streams.get_records(&it, 10_000).await.unwrap();
                let got = batch.records.len() as u64;
                total.fetch_add(got, Ordering::Relaxed);
                match batch.next_iterator {
                    Some(next) if got > 0 || batch.millis_behind_latest.unwrap_or(0) > 0 => {
                        it = next
                    }
                    _ => break,
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(total.load(Ordering::Relaxed), RECORDS);
    started.elapsed()
}

async fn flotilla(
    sdk: &aws_config::SdkConfig,
    endpoint: &str,
    stream: &str,
    run: usize,
) -> Duration {
    let mut s = Settings::default();
    s.worker.stream = stream.to_owned();
    s.worker.application = format!("drain-{run}");
    s.status.enabled = false;
    s.metrics.level = MetricsLevel::None;
    s.reader.max_records = 10_000;
    s.reader.poll_interval = Duration::from_millis(1);
    s.lease.heartbeat_interval = Duration::from_millis(200);
    let backend = Backend::new(
        Arc::new(KinesisStream::new(sdk, Some(endpoint))),
        {
            let db = MemoryDynamo::new();
            move |name| Arc::new(db.lease_table(name))
        },
        Arc::new(MemoryMetrics::new()),
    );
    let count = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let c = count.clone();
    let worker = Worker::builder()
        .settings(s)
        .backend(backend)
        .processor(move |_| Count(c.clone()))
        .start()
        .await
        .unwrap();
    while count.load(Ordering::Relaxed) < RECORDS {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let took = started.elapsed();
    worker.abort();
    took
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let endpoint = servers::start_ferrokinesis(300).await;
        let sdk = servers::sdk_config();
        let streams = Arc::new(KinesisStream::new(&sdk, Some(&endpoint)));
        let stream = "drain";
        load::load(streams.as_ref(), stream, SHARDS, RECORDS).await;
        let (mut plain_rates, mut flotilla_rates, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for run in 0..RUNS {
            let p = plain(&streams, stream).await;
            let f = flotilla(&sdk, &endpoint, stream, run).await;
            let (pr, fr) = (
                RECORDS as f64 / p.as_secs_f64(),
                RECORDS as f64 / f.as_secs_f64(),
            );
            println!(
                "run {run}: plain loop {pr:.0} records/s ({p:?}), flotilla {fr:.0} records/s ({f:?}), ratio {:.2}",
                fr / pr
            );
            plain_rates.push(pr);
            flotilla_rates.push(fr);
            ratios.push(fr / pr);
        }
        let (pm, pmin, pmax) = median(&plain_rates);
        let (fm, fmin, fmax) = median(&flotilla_rates);
        let (rm, rmin, rmax) = median(&ratios);
        println!();
        println!("| id | what | median | min | max | target | ratio to target |");
        println!("|---|---|---|---|---|---|---|");
        println!("| P2 | plain aws-sdk loop, records/s | {pm:.0} | {pmin:.0} | {pmax:.0} | | |");
        println!("| P2 | flotilla, records/s | {fm:.0} | {fmin:.0} | {fmax:.0} | | |");
        println!(
            "| P2 | flotilla / plain | {rm:.2} | {rmin:.2} | {rmax:.2} | ≥ 0.9 | {:.2} |",
            rm / 0.9
        );
    });
}
