//! Command-line parsing and the commands themselves.

use std::io::Write as _;
use std::sync::Arc;

use anyhow::Context as _;
use clap::{Args, Parser, Subcommand};
use flotilla_actors::backend::aws::{DynamoLeaseTable, load_sdk_config};
use flotilla_actors::backend::{LeaseTable, TableState};
use flotilla_actors::model::{Checkpoint, Lease};

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
    /// Create the lease table if it does not exist (PAY_PER_REQUEST, hash key leaseKey).
    Init(TableArgs),
    /// Print every lease as one JSON object per line; heartbeats and malformed rows go to stderr.
    Leases(TableArgs),
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

pub async fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
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
                eprintln!("worker {}: heartbeat {}", hb.worker, hb.counter);
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
    })
}
