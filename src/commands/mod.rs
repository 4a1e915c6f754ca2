//! What each command of [`crate::cli`] does.
//!
//! * `leases`: `flotilla leases`, every lease a JSON line, and the table's other rows
//!   described.
//! * `table`: `init` and `destroy`, the lease table's making and its deleting.
//! * `consumer`: `consumer list` and `consumer deregister`.
//! * `worker`: `run` and `multilang`, a worker served until a signal, and `run`'s stream
//!   list read again on SIGHUP.
//!
//! `demo` is [`crate::demo`]'s; `status` prints what [`crate::status_client`] fetches;
//! `rewind` and `position` are [`crate::ops`]'. The AWS clients of one-off commands are
//! made here, with the default limits of a worker's.

mod consumer;
mod leases;
mod table;
mod worker;

use std::sync::Arc;

use anyhow::Context as _;
use flotilla_actors::backend::aws::{
    DynamoLeaseTable, KinesisStream, Service, load_sdk_config, tuned_for,
};
use flotilla_actors::backend::{LeaseTable, StreamClient as _};
use flotilla_actors::settings::AwsSettings;

use crate::cli::{
    Cli, Command, ConsumerCommand, ExportArgs, ImportArgs, PositionCommand, RewindArgs, StatusArgs,
    StreamArgs, TableArgs,
};
use crate::{demo, ops, status_client};

/// Runs the command in a span naming it, so its log lines (and a worker's, under it in
/// the span list) say which command they are of.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let span = tracing::info_span!("command", command = cli.command.name());
    tracing::Instrument::instrument(run_command(cli.command), span).await
}

async fn run_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Demo(args) => demo::run(args).await,
        Command::Run(args) => worker::run_worker(args).await,
        Command::Multilang(args) => worker::multilang(args).await,
        Command::Init(args) => table::init(args).await,
        Command::Leases(args) => leases::leases(args).await,
        Command::Status(args) => status(args).await,
        Command::Rewind(args) => rewind(args).await,
        Command::Position(PositionCommand::Export(args)) => export(args).await,
        Command::Consumer(ConsumerCommand::List(args)) => consumer::list(args).await,
        Command::Consumer(ConsumerCommand::Deregister(args)) => consumer::deregister(args).await,
        Command::Destroy(args) => table::destroy(args).await,
        Command::Position(PositionCommand::Import(args)) => import(args).await,
    }
}

/// `flotilla status`: a worker's status endpoint, as tables (or its JSON).
async fn status(args: StatusArgs) -> anyhow::Result<()> {
    let path = if args.fleet { "/fleet" } else { "/status" };
    let value = status_client::fetch(&args.url, path, args.timeout).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else if args.fleet {
        print!("{}", status_client::render_fleet(&value));
    } else {
        print!("{}", status_client::render_status(&value));
        // The supervision tree, as /status.html draws it (a worker older than
        // the tree's route has none: the table above is all it serves).
        match status_client::fetch(&args.url, "/status/tree", args.timeout).await {
            Ok(tree) => print!("\n{}", status_client::render_tree(tree)?),
            Err(error) => eprintln!("(no supervision tree: {error:#})"),
        }
    }
    Ok(())
}

/// `flotilla rewind`.
async fn rewind(args: RewindArgs) -> anyhow::Result<()> {
    let table = args.table.open().await;
    ops::rewind(
        table.as_ref(),
        &args.to,
        args.liveness.force,
        args.liveness.failover_time,
    )
    .await
}

/// `flotilla position export`: the token on stdout.
async fn export(args: ExportArgs) -> anyhow::Result<()> {
    let table = args.table.open().await;
    let token = ops::export(table.as_ref(), args.stream.as_deref()).await?;
    println!("{}", serde_json::to_string_pretty(&token)?);
    eprintln!(
        "flotilla: {} shard positions of {} exported",
        token.shards.len(),
        token.application
    );
    Ok(())
}

/// `flotilla position import`.
async fn import(args: ImportArgs) -> anyhow::Result<()> {
    let table = args.table.open().await;
    ops::import(
        table.as_ref(),
        &args.file,
        args.liveness.force,
        args.liveness.failover_time,
        args.stream.as_deref(),
        args.source.as_deref(),
    )
    .await
}

/// The SDK configuration of a one-off command (no settings file): the default `[aws]`
/// timeouts and retries, as a worker's, for `service`.
async fn command_sdk(region: Option<String>, service: Service) -> aws_config::SdkConfig {
    command_limits(&load_sdk_config(region).await, service)
}

/// `sdk` with a one-off command's limits for `service` (see [`command_sdk`]).
fn command_limits(sdk: &aws_config::SdkConfig, service: Service) -> aws_config::SdkConfig {
    tuned_for(sdk, AwsSettings::default().call_limits(service))
}

impl StreamArgs {
    /// The client and the stream's ARN (consumers are addressed by it).
    async fn open(&self) -> anyhow::Result<(KinesisStream, String)> {
        let sdk = command_sdk(self.region.clone(), Service::Stream).await;
        let client = KinesisStream::new(&sdk, self.kinesis_endpoint.as_deref());
        let summary = client
            .describe_stream_summary(&self.stream)
            .await
            .with_context(|| format!("cannot look up stream {}", self.stream))?;
        Ok((client, summary.arn))
    }
}

impl TableArgs {
    async fn sdk(&self) -> aws_config::SdkConfig {
        command_sdk(self.region.clone(), Service::LeaseTable).await
    }

    async fn open(&self) -> Arc<dyn LeaseTable> {
        Arc::new(self.client(&self.sdk().await))
    }

    /// The table's DynamoDB client on `sdk`, for what only DynamoDB has (its options,
    /// deleting it).
    fn client(&self, sdk: &aws_config::SdkConfig) -> DynamoLeaseTable {
        DynamoLeaseTable::new(sdk, self.dynamodb_endpoint.as_deref(), self.table.clone())
    }
}
