//! Command-line parsing and the commands themselves.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};
use flotilla_actors::backend::aws::{DynamoLeaseTable, Endpoints, load_sdk_config};
use flotilla_actors::backend::{LeaseTable, TableState};
use flotilla_actors::model::{Checkpoint, Lease};
use flotilla_actors::{Backend, ShutdownReport, Worker};
use tokio::signal::unix::{SignalKind, signal};
use tracing::info;

use crate::demo::{self, DemoArgs};
use crate::settings;
use crate::stdout_processor::StdoutProcessor;

#[derive(Debug, Parser)]
#[command(
    name = "flotilla",
    version,
    about = "Consume Amazon Kinesis Data Streams with a self-balancing fleet of workers."
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a fleet of workers on an in-memory stream and check its output (no AWS needed).
    ///
    /// A built-in producer writes records numbered per partition key; a shard is split
    /// at a third of the run and two are merged at two thirds; in between, a worker is
    /// killed without a shutdown and the others must take over its leases. A built-in
    /// processor checks that every record arrives, in order per key. Progress goes to
    /// stderr once a second; the last line on stdout is the summary. Exits non-zero if a
    /// record was lost or out of order, a survivor did not shut down cleanly, or a record
    /// was delivered twice without a crash.
    Demo(DemoArgs),
    /// Run a worker on a Kinesis stream, printing each record as a JSON line.
    ///
    /// One JSON object per record on stdout (shard_id, sequence_number,
    /// sub_sequence_number, partition_key, approximate_arrival, data; binary data is
    /// base64 with "data_encoding":"base64"). Runs until Ctrl-C or SIGTERM, then
    /// checkpoints, releases its leases and exits; non-zero if that was not clean.
    Run(RunArgs),
    /// Create the lease table if it does not exist (PAY_PER_REQUEST, hash key leaseKey).
    Init(TableArgs),
    /// Print every lease as one JSON object per line; heartbeats and malformed rows go to stderr.
    Leases(TableArgs),
}

/// Where a worker's settings come from.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// A TOML settings file (see config/default.toml for every setting); it overrides
    /// the built-in defaults, and FLOTILLA__SECTION__KEY variables override it.
    #[arg(long, env = "FLOTILLA_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Where the lease table is.
#[derive(Debug, Args)]
pub struct TableArgs {
    /// The lease table: the application name, as with the Java KCL.
    #[arg(long, env = "FLOTILLA_TABLE")]
    pub table: String,
    /// AWS region; default: the SDK's chain (AWS_REGION, profile, ...).
    #[arg(long)]
    pub region: Option<String>,
    /// A DynamoDB endpoint to use instead of AWS's (a local server).
    #[arg(long, env = "FLOTILLA_DYNAMODB_ENDPOINT")]
    pub dynamodb_endpoint: Option<String>,
}

impl TableArgs {
    async fn open(&self) -> Arc<dyn LeaseTable> {
        let sdk = load_sdk_config(self.region.clone()).await;
        Arc::new(DynamoLeaseTable::new(
            &sdk,
            self.dynamodb_endpoint.as_deref(),
            self.table.clone(),
        ))
    }
}

impl Cli {
    /// The log filter when `FLOTILLA_LOG` is not set. The demo writes its own progress
    /// to stderr, which the worker's routine logs would drown.
    pub fn default_log_filter(&self) -> &'static str {
        match self.command {
            Command::Demo(_) => "warn",
            _ => "info",
        }
    }
}

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(args) => demo::run(args).await,
        Command::Run(args) => run_worker(args).await,
        Command::Init(args) => {
            let table = args.open().await;
            let state = table
                .ensure_table()
                .await
                .with_context(|| format!("cannot make lease table {}", args.table))?;
            let what = match state {
                TableState::Created => "created",
                TableState::Existed => "already exists",
            };
            println!("lease table {}: {what}", args.table);
            Ok(())
        }
        Command::Leases(args) => {
            let table = args.open().await;
            let scan = table
                .scan()
                .await
                .with_context(|| format!("cannot read lease table {}", args.table))?;
            let mut out = std::io::stdout().lock();
            let mut leases = scan.leases;
            leases.sort_by(|a, b| a.key.cmp(&b.key));
            for lease in &leases {
                writeln!(out, "{}", lease_json(lease))?;
            }
            for hb in &scan.heartbeats {
                eprintln!(
                    "worker {}: heartbeat {}, {} leases, {} records/s{}",
                    hb.worker,
                    hb.counter,
                    hb.load.leases,
                    hb.load.records_per_second,
                    if hb.load.draining { ", draining" } else { "" }
                );
            }
            for bad in &scan.malformed {
                eprintln!("skipped: {bad}");
            }
            if scan.other_rows > 0 {
                eprintln!(
                    "ignored {} rows of other programs (KCL 3.x coordinator state)",
                    scan.other_rows
                );
            }
            Ok(())
        }
    }
}

/// `flotilla run`: the stdout processor on the stream the settings name.
async fn run_worker(args: RunArgs) -> anyhow::Result<()> {
    let settings = settings::load(args.config.as_deref())?;
    let endpoints = Endpoints {
        kinesis: settings.aws.kinesis_endpoint.clone(),
        dynamodb: settings.aws.dynamodb_endpoint.clone(),
        cloudwatch: settings.aws.cloudwatch_endpoint.clone(),
    };
    let stream = settings.worker.stream.clone();
    let backend = Backend::aws(settings.aws.region.clone(), &endpoints).await;
    // Listen before starting: a SIGTERM during start-up must not kill the process
    // with its leases held.
    let mut terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let mut worker = Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(|shard| StdoutProcessor::new(shard.shard_id.clone()))
        .start()
        .await
        .with_context(|| format!("cannot start a worker on stream {stream}"))?;

    let signal_name = tokio::select! {
        result = tokio::signal::ctrl_c() => {
            result.context("cannot listen for Ctrl-C")?;
            "Ctrl-C"
        }
        _ = terminate.recv() => "SIGTERM",
        result = worker.wait() => {
            result.context("the worker stopped")?;
            bail!("the worker stopped on its own");
        }
    };
    info!(message = "Shutting down.", signal = signal_name, worker_id = %worker.id());
    // A second signal gives up on the graceful path: the leases then stay owned until
    // they expire, and their next owners resume from the last written checkpoints.
    let report = tokio::select! {
        result = worker.shutdown() => result.context("the worker did not shut down")?,
        _ = tokio::signal::ctrl_c() => bail!("interrupted during shutdown; leases are left to expire"),
        _ = terminate.recv() => bail!("terminated during shutdown; leases are left to expire"),
    };
    eprintln!("flotilla: {}", shutdown_summary(&report));
    if !report.clean() {
        bail!("the shutdown was not clean");
    }
    Ok(())
}

/// One line on what a graceful shutdown achieved, naming whatever failed.
fn shutdown_summary(report: &ShutdownReport) -> String {
    let shards = report.shards.len();
    let flushed = report
        .shards
        .iter()
        .filter(|s| s.checkpoint_flushed)
        .count();
    let mut text = format!(
        "shutdown {}: {shards} shards stopped, {flushed} checkpoints flushed, {} leases handed off, {} released",
        if report.clean() { "clean" } else { "NOT clean" },
        report.leases.handed_off.len(),
        report.leases.released.len(),
    );
    for shard in &report.shards {
        let mut problems = Vec::new();
        if !shard.processor_ok {
            problems.push("processor failed".to_owned());
        }
        if !shard.checkpoint_flushed {
            problems.push("checkpoint not flushed".to_owned());
        }
        if let Some(error) = &shard.error {
            problems.push(error.clone());
        }
        if !problems.is_empty() {
            text.push_str(&format!("; {}: {}", shard.shard_id, problems.join(", ")));
        }
    }
    for lease in &report.leases.failed {
        text.push_str(&format!("; lease not released: {lease}"));
    }
    for failure in report.checkpoint_failures.iter().chain(&report.errors) {
        text.push_str(&format!("; {failure}"));
    }
    text
}

fn lease_json(lease: &Lease) -> serde_json::Value {
    let (checkpoint, sub) = lease.checkpoint.encode();
    serde_json::json!({
        "lease_key": lease.key.as_str(),
        "shard_id": lease.key.shard_id().as_str(),
        "owner": lease.owner.as_ref().map(|o| o.as_str()),
        "counter": lease.counter,
        "checkpoint": checkpoint,
        "checkpoint_sub_sequence": sub,
        "shard_end": matches!(lease.checkpoint, Checkpoint::ShardEnd),
        "owner_switches_since_checkpoint": lease.owner_switches_since_checkpoint,
        "parents": lease.parent_shard_ids.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "children": lease.child_shard_ids.iter().map(|s| s.as_str()).collect::<Vec<_>>(),
        "hash_range": lease.hash_range.map(|r| [r.start.to_string(), r.end.to_string()]),
        "handoff_to": lease.handoff_to.as_ref().map(|w| w.as_str()),
    })
}
