//! A service that embeds a flotilla worker with its own processor, as a user would.
//!
//! It counts orders per customer from an in-memory stream (swap `Backend::memory` for
//! `Backend::aws(&settings.aws).await`, with `Settings::load`, to read a real one),
//! checkpoints as it goes, and stops the way a service must: on Ctrl-C or SIGTERM (what
//! Kubernetes and systemd send) it shuts the worker down gracefully, so its leases pass
//! to the other workers at their checkpoints, and exits non-zero if that was not clean.
//! Its processor can stop it too, through the worker's handle: here, at a quota.
//!
//! ```sh
//! cargo run -p flotilla-actors --example embedded_worker                    # until Ctrl-C
//! cargo run -p flotilla-actors --example embedded_worker -- --run-for 3s    # a bounded run
//! cargo run -p flotilla-actors --example embedded_worker -- --max-orders 500
//! ```
//!
//! `cargo test` runs it too (its tests below): bounded, and stopped by its quota.

use std::collections::HashMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{PutRecord, StreamAdmin};
use flotilla_actors::{
    Backend, Batch, Checkpointer, Processor, ProcessorError, Settings, ShardInfo, ShutdownReport,
    Worker,
};
use tokio::signal::unix::{SignalKind, signal};

/// The user's processor: one per shard, called one batch at a time.
struct OrderCounter {
    shard: String,
    totals: Arc<Mutex<HashMap<String, u64>>>,
    /// Stop the whole service once this many orders are counted (all shards).
    max_orders: Option<u64>,
}

impl Processor for OrderCounter {
    async fn initialize(&mut self, shard: &ShardInfo) -> Result<(), ProcessorError> {
        println!("{}: starting at {}", shard.shard_id, shard.starting_at);
        Ok(())
    }

    async fn process(&mut self, batch: &Batch, cp: &Checkpointer) -> Result<(), ProcessorError> {
        let counted: u64 = {
            let mut totals = self
                .totals
                .lock()
                .map_err(|_| ProcessorError::msg("totals lock poisoned"))?;
            for record in batch.records() {
                *totals.entry(record.partition_key.clone()).or_default() += 1;
            }
            totals.values().sum()
        };
        if let Some(max) = self.max_orders
            && counted >= max
        {
            // What one shard cannot get past on its own (a quota, a poison record) stops
            // the whole worker gracefully; `Worker::wait` returns this reason.
            cp.worker()
                .request_shutdown(format!("quota of {max} orders reached"));
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

/// How long to run and when to stop, from the command line.
#[derive(Debug, Default)]
struct Options {
    /// Stop as if signalled after this long (for CI and demos); `None` runs until a signal.
    run_for: Option<Duration>,
    max_orders: Option<u64>,
}

impl Options {
    fn from_args() -> Result<Self, String> {
        let mut options = Options::default();
        let mut args = std::env::args().skip(1);
        while let Some(arg) = args.next() {
            let mut value = || args.next().ok_or(format!("{arg} needs a value"));
            match arg.as_str() {
                "--run-for" => {
                    let text = value()?;
                    let run_for = humantime::parse_duration(&text)
                        .map_err(|e| format!("--run-for {text}: {e}"))?;
                    options.run_for = Some(run_for);
                }
                "--max-orders" => {
                    let text = value()?;
                    let max = text
                        .parse()
                        .map_err(|e| format!("--max-orders {text}: {e}"))?;
                    options.max_orders = Some(max);
                }
                other => {
                    return Err(format!(
                        "unknown argument {other}; use --run-for DURATION, --max-orders N"
                    ));
                }
            }
        }
        Ok(options)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = match Options::from_args() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("embedded_worker: {error}");
            return ExitCode::from(2);
        }
    };
    match run(options).await {
        Ok((report, _)) if report.clean() => ExitCode::SUCCESS,
        Ok((report, _)) => {
            eprintln!("embedded_worker: the shutdown was not clean: {report:#?}");
            ExitCode::FAILURE
        }
        Err(error) => {
            eprintln!("embedded_worker: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The service: start a worker, run until told to stop, shut it down gracefully. Returns
/// the shutdown's report and the orders counted.
async fn run(options: Options) -> Result<(ShutdownReport, u64), Box<dyn std::error::Error>> {
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

    // A real service: `let settings = Settings::load(config_path)?;` (defaults, the file,
    // FLOTILLA__SECTION__KEY variables) and `Backend::aws(&settings.aws).await`.
    let mut settings = Settings::default();
    settings.checkpoint.interval = Duration::from_secs(1);
    settings.status.bind = "127.0.0.1:0".to_owned();
    let totals = Arc::new(Mutex::new(HashMap::new()));
    let shared = totals.clone();
    let max_orders = options.max_orders;

    // Listen before starting: a SIGTERM during start-up must not kill the process with
    // its leases held (the other workers would wait out lease.failover_time for them).
    let mut terminate = signal(SignalKind::terminate())?;
    let mut worker = Worker::builder()
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
            max_orders,
        })
        .start()
        .await?;
    if let Some(addr) = worker.status_addr() {
        println!("status: http://{addr}/status");
    }

    let deadline = async {
        match options.run_for {
            Some(run_for) => tokio::time::sleep(run_for).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        result = tokio::signal::ctrl_c() => {
            result?;
            println!("Ctrl-C: shutting down");
        }
        _ = terminate.recv() => println!("SIGTERM: shutting down"),
        _ = deadline => println!("--run-for is up: shutting down"),
        // The worker stopped without us: a processor asked it to (Ok, the shutdown is
        // done), or it failed (Err: nothing left to shut down).
        stopped = worker.wait() => println!("worker stopped: {}", stopped?.reason),
    }
    if let Ok(status) = worker.status().await {
        for shard in &status.shards {
            println!(
                "{}: {:?}, {} records, checkpoint {}",
                shard.shard_id,
                shard.state,
                shard.records_delivered,
                shard.checkpoint.as_deref().unwrap_or("-")
            );
        }
    }
    // Processors finish their batch, checkpoints are flushed, leases handed off or
    // released. After a requested stop this returns that shutdown's report.
    let report = worker.shutdown().await?;
    let counted: u64 = totals.lock().map(|t| t.values().sum()).unwrap_or(0);
    println!(
        "counted {counted} orders; clean shutdown: {}",
        report.clean()
    );
    Ok((report, counted))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_bounded_run_counts_every_order_and_shuts_down_cleanly() {
        let options = Options {
            run_for: Some(Duration::from_secs(5)),
            max_orders: None,
        };
        let finished = run(options).await.map_err(|e| e.to_string());
        assert!(
            matches!(&finished, Ok((report, 1_000)) if report.clean()),
            "{finished:?}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_processor_stops_the_service_at_its_quota() {
        let options = Options {
            run_for: None,
            max_orders: Some(100),
        };
        let finished = tokio::time::timeout(Duration::from_secs(600), run(options))
            .await
            .map_err(|_| "still running after 600 s".to_owned())
            .and_then(|finished| finished.map_err(|e| e.to_string()));
        assert!(
            matches!(&finished, Ok((report, counted)) if report.clean() && *counted >= 100),
            "{finished:?}"
        );
    }
}
