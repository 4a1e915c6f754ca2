//! Command-line parsing and the commands themselves.

use std::io::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::{Args, Parser, Subcommand};
use flotilla_actors::backend::aws::{
    Billing, DynamoLeaseTable, KinesisStream, Service, TableOptions, load_sdk_config, tuned_for,
};
use flotilla_actors::backend::{
    LeaseTable, StreamAdmin as _, StreamClient as _, StreamError, TableState,
};
use flotilla_actors::model::{Checkpoint, Lease, WorkerId};
use flotilla_actors::multilang::properties::Properties;
use flotilla_actors::multilang::{DaemonConfig, MultiLangProcessor};
use flotilla_actors::settings::AwsSettings;
use flotilla_actors::{Backend, CheckpointMode, Settings, ShutdownReport, StreamSet, Worker};
use tokio::signal::unix::{SignalKind, signal};
use tracing::{info, warn};

use crate::demo::{self, DemoArgs};
use crate::stdout_processor::StdoutProcessor;
use crate::{ops, status_client};

#[derive(Debug, Parser)]
#[command(
    name = "flotilla",
    version,
    about = "Consume Amazon Kinesis Data Streams with a self-balancing fleet of workers."
)]
pub struct Cli {
    /// How log lines are written to stderr: `text` for a person, `json` (one object a
    /// line, with the worker's and the shard's span fields) for a log pipeline.
    #[arg(long, global = true, value_enum, env = "FLOTILLA_LOG_FORMAT", default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    #[command(subcommand)]
    pub command: Command,
}

/// The format of the binary's log lines. The library leaves this to its embedder; the
/// settings file is read after logging starts, so it is a flag and a variable only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
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
    #[command(after_help = "Examples:\n  flotilla demo\n  flotilla demo --help")]
    Demo(DemoArgs),
    /// Run a worker on a Kinesis stream, printing each record as a JSON line.
    ///
    /// One JSON object per record on stdout (shard_id, sequence_number,
    /// sub_sequence_number, partition_key, approximate_arrival, data; binary data is
    /// base64 with "data_encoding":"base64"). Runs until Ctrl-C or SIGTERM, then
    /// checkpoints, releases its leases and exits; non-zero if that was not clean.
    #[command(after_help = "Examples:\n  \
        flotilla run --config worker.toml\n  \
        FLOTILLA__WORKER__STREAM=orders FLOTILLA__WORKER__APPLICATION=orders-audit flotilla run")]
    Run(RunArgs),
    /// Run a KCL MultiLang record processor (Python, Node.js, Ruby, .NET, ...) with no JVM.
    ///
    /// Reads the MultiLangDaemon properties file (executableName, streamName,
    /// applicationName, initialPositionInStream, regionName, maxRecords, ...), starts one
    /// `executableName` child per held lease and speaks the daemon's protocol to it over
    /// its stdin and stdout; its stderr goes to the log. The child's checkpoints are the
    /// checkpoints (KCL lease table, so a Java KCL's checkpoints carry over). A
    /// flotilla settings file (--config) and FLOTILLA__SECTION__KEY variables override
    /// the properties. Keys flotilla does not use are named in a warning; keys it cannot
    /// honour stop the start with what to do.
    #[command(after_help = "Examples:\n  \
        flotilla multilang --properties sample.properties\n  \
        FLOTILLA__AWS__KINESIS_ENDPOINT=http://127.0.0.1:4567 flotilla multilang --properties app.properties")]
    Multilang(MultiLangArgs),
    /// Create the lease table and its worker table if they do not exist (hash key leaseKey;
    /// the worker table holds heartbeats, with the heartbeat index).
    ///
    /// A new table is made as production needs it, as the CloudFormation stack makes it:
    /// on-demand (or --billing-mode provisioned with capacities), point-in-time recovery
    /// and deletion protection on (off on a local server), with any --tag. An existing
    /// lease table is fine: only the options given change it (billing excepted). With
    /// --stream, also create a Kinesis stream, on a local Kinesis only (--kinesis-endpoint
    /// on loopback): for development and tests.
    #[command(after_help = "Examples:\n  \
        flotilla init --table orders-audit --region eu-west-1\n  \
        flotilla init --table orders-audit --tag team=payments --tag env=prod\n  \
        flotilla init --table orders-audit --billing-mode provisioned --read-capacity 20 --write-capacity 10\n  \
        flotilla init --table orders-audit --deletion-protection off   # before flotilla destroy\n  \
        flotilla init --table dev-app --dynamodb-endpoint http://127.0.0.1:8000 \\\n      \
        --stream dev --shards 4 --kinesis-endpoint http://127.0.0.1:4567")]
    Init(InitArgs),
    /// Print every lease as one JSON object per line; heartbeats and malformed rows go to stderr.
    #[command(after_help = "Examples:\n  \
        flotilla leases --table orders-audit\n  \
        flotilla leases --table orders-audit | jq -r 'select(.owner == null) | .shard_id'")]
    Leases(TableArgs),
    /// Show a running worker's shards, or the whole fleet as it sees it.
    ///
    /// Reads the worker's status endpoint (GET /status, or GET /fleet with --fleet;
    /// served at the worker's status.bind, 127.0.0.1:9797 by default) and prints tables,
    /// and the worker's supervision tree as its /status.html page shows it.
    #[command(after_help = "Examples:\n  \
        flotilla status\n  \
        flotilla status --fleet\n  \
        flotilla status --url http://10.0.3.7:9797 --json | jq '.shards[] | select(.last_error)'")]
    Status(StatusArgs),
    /// Set the checkpoint of every unfinished lease to TRIM_HORIZON, LATEST or a time.
    ///
    /// For replaying a stream (or skipping a backlog): stop the workers, rewind, start
    /// them. Finished shards (SHARD_END) are left as they are, so their records are not
    /// replayed. Refuses while live workers hold leases (a live worker would write its own
    /// checkpoint over the new one), naming them; the check watches the owners' heartbeats
    /// for up to --failover-time.
    ///
    /// A lease cannot hold a time: --to TIME writes the KCL's AT_TIMESTAMP sentinel, and
    /// the workers must then run with worker.initial_position = "AT_TIMESTAMP" and
    /// worker.initial_timestamp = TIME (the command says so again when it is done).
    #[command(after_help = "Examples:\n  \
        flotilla rewind --table orders-audit --to trim-horizon\n  \
        flotilla rewind --table orders-audit --to latest\n  \
        flotilla rewind --table orders-audit --to 2024-05-01T00:00:00Z\n  \
        flotilla rewind --table orders-audit --to trim-horizon --force   # owners known dead")]
    Rewind(RewindArgs),
    /// Save every shard's checkpoint as JSON, or restore them from it.
    #[command(subcommand)]
    Position(PositionCommand),
    /// List or deregister a stream's enhanced fan-out consumers (reader.mode = "fanout").
    ///
    /// A fan-out worker registers its consumer (reader.consumer_name, by default the
    /// application's name) when it starts and leaves it registered: Kinesis bills it per
    /// consumer-shard-hour while it exists, and a stream holds at most 20.
    #[command(subcommand)]
    Consumer(ConsumerCommand),
    /// Delete the lease table (every checkpoint in it) and, with --stream, the
    /// application's fan-out consumer of each stream.
    ///
    /// For an application that is gone for good: its next workers would start from
    /// worker.initial_position. Refuses while live workers hold leases, naming them (the
    /// check watches the owners for up to --failover-time), unless --force. Asks for the
    /// table's name to confirm; --yes confirms for scripts (without a terminal and without
    /// --yes it refuses). A table with deletion protection is left alone: turn the
    /// protection off where it was turned on first.
    #[command(after_help = "Examples:\n  \
        flotilla destroy --table orders-audit\n  \
        flotilla destroy --table orders-audit --stream orders --yes\n  \
        flotilla destroy --table dev-app --dynamodb-endpoint http://127.0.0.1:8000 --yes --force")]
    Destroy(DestroyArgs),
}

/// `flotilla destroy`.
#[derive(Debug, Args)]
pub struct DestroyArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// A stream whose fan-out consumer of this application to deregister too (may be
    /// given more than once). Without it, consumers are left registered.
    #[arg(long = "stream", value_name = "STREAM")]
    pub streams: Vec<String>,
    /// The consumer's name (reader.consumer_name); default: the table's name, which is
    /// the application's, as workers name it (with a lease.table that names the table
    /// otherwise, give the application's name).
    #[arg(long, requires = "streams")]
    pub consumer_name: Option<String>,
    /// A Kinesis endpoint to use instead of AWS's (a local server).
    #[arg(long, env = "FLOTILLA__AWS__KINESIS_ENDPOINT", requires = "streams")]
    pub kinesis_endpoint: Option<String>,
    /// Delete even if workers look alive: they lose their checkpoints and fail.
    #[arg(long)]
    pub force: bool,
    /// How long an owner may show no sign of life before it counts as dead: the
    /// workers' lease.failover_time.
    #[arg(long, env = "FLOTILLA__LEASE__FAILOVER_TIME", default_value = "10s", value_parser = humantime::parse_duration)]
    pub failover_time: Duration,
    /// Confirm without asking (for scripts).
    #[arg(long)]
    pub yes: bool,
}

#[derive(Debug, Subcommand)]
pub enum ConsumerCommand {
    /// Print each consumer of the stream as one JSON object per line (name, status,
    /// created, arn).
    #[command(after_help = "Examples:\n  \
        flotilla consumer list --stream orders\n  \
        flotilla consumer list --stream orders | jq -r .name")]
    List(StreamArgs),
    /// Deregister a consumer of the stream: its subscriptions end, its billing stops.
    ///
    /// Workers still running in fan-out mode with that consumer lose their
    /// subscriptions and register it again when they restart; stop them first, or
    /// switch them to reader.mode = "polling".
    #[command(after_help = "Examples:\n  \
        flotilla consumer deregister --stream orders --name orders-audit")]
    Deregister(DeregisterArgs),
}

/// Where a Kinesis stream is.
#[derive(Debug, Args)]
pub struct StreamArgs {
    /// The stream's name.
    #[arg(long, env = "FLOTILLA__WORKER__STREAM")]
    pub stream: String,
    /// AWS region; default: the SDK's chain (AWS_REGION, profile, ...).
    #[arg(long)]
    pub region: Option<String>,
    /// A Kinesis endpoint to use instead of AWS's (a local server).
    #[arg(long, env = "FLOTILLA__AWS__KINESIS_ENDPOINT")]
    pub kinesis_endpoint: Option<String>,
}

/// `flotilla consumer deregister`.
#[derive(Debug, Args)]
pub struct DeregisterArgs {
    #[command(flatten)]
    pub stream: StreamArgs,
    /// The consumer's name (a worker's reader.consumer_name, by default its
    /// application's name).
    #[arg(long)]
    pub name: String,
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

#[derive(Debug, Subcommand)]
pub enum PositionCommand {
    /// Print every lease's checkpoint as a JSON token on stdout.
    ///
    /// {"version":1,"application":APP,"exported_at":TIME,"shards":{LEASE_KEY:
    /// {"checkpoint":SEQUENCE_OR_SENTINEL,"sub_sequence":N}}}. Lease keys are shard ids
    /// for a single-stream application, account:stream:epoch:shardId for one of several
    /// streams (worker.streams).
    #[command(after_help = "Examples:\n  \
        flotilla position export --table orders-audit > positions.json\n  \
        flotilla position export --table many-app --stream orders > orders.json")]
    Export(ExportArgs),
    /// Set each lease's checkpoint to the one a token saved.
    ///
    /// Leases the token does not name are left as they are. Shards the token names that
    /// have no lease row are not created: the command writes the others, then fails
    /// naming each shard it did not apply and why. Refuses a token of another
    /// application, and refuses while live workers hold leases, unless --force.
    #[command(after_help = "Examples:\n  \
        flotilla position import --table orders-audit positions.json\n  \
        flotilla position export --table old-app | flotilla position import --table new-app --force -")]
    Import(ImportArgs),
}

/// `flotilla init`.
#[derive(Debug, Args)]
pub struct InitArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// Also create this Kinesis stream (local Kinesis only); an existing one is fine.
    #[arg(long, requires = "kinesis_endpoint")]
    pub stream: Option<String>,
    /// The new stream's shard count.
    #[arg(long, default_value_t = 1, requires = "stream", value_parser = clap::value_parser!(u32).range(1..))]
    pub shards: u32,
    /// The local Kinesis to create --stream on (loopback only).
    #[arg(long, env = "FLOTILLA__AWS__KINESIS_ENDPOINT")]
    pub kinesis_endpoint: Option<String>,
    /// How a new table is billed: on-demand (PAY_PER_REQUEST, the default) or
    /// provisioned (with --read-capacity and --write-capacity, which the heartbeat index
    /// gets too). An existing table's billing is left as it is.
    #[arg(long, value_enum)]
    pub billing_mode: Option<BillingMode>,
    /// Read capacity units of a provisioned table.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub read_capacity: Option<i64>,
    /// Write capacity units of a provisioned table.
    #[arg(long, value_parser = clap::value_parser!(i64).range(1..))]
    pub write_capacity: Option<i64>,
    /// Point-in-time recovery. A new table: on by default, as the CloudFormation stack
    /// makes it, except on a local server (a loopback --dynamodb-endpoint), which lacks
    /// it. An existing table is changed only when this is given.
    #[arg(long, value_enum, value_name = "on|off")]
    pub point_in_time_recovery: Option<OnOff>,
    /// Deletion protection. A new table: on by default, as the CloudFormation stack
    /// makes it, except on a local server. An existing table is changed only when this
    /// is given.
    #[arg(long, value_enum, value_name = "on|off")]
    pub deletion_protection: Option<OnOff>,
    /// A tag on the table, KEY=VALUE (may be given more than once); an existing table
    /// gets it too.
    #[arg(long = "tag", value_name = "KEY=VALUE", value_parser = parse_tag)]
    pub tags: Vec<(String, String)>,
}

/// `--billing-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BillingMode {
    OnDemand,
    Provisioned,
}

/// A switch given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    fn is_on(self) -> bool {
        self == Self::On
    }
}

/// `KEY=VALUE`, as DynamoDB takes tags: a key of 1 to 128 characters, a value of up to 256.
fn parse_tag(text: &str) -> Result<(String, String), String> {
    let Some((key, value)) = text.split_once('=') else {
        return Err(format!("{text:?} is not KEY=VALUE"));
    };
    if key.is_empty() || key.chars().count() > 128 {
        return Err(format!("tag key {key:?} must be 1 to 128 characters"));
    }
    if value.chars().count() > 256 {
        return Err(format!(
            "the value of tag {key} is longer than 256 characters"
        ));
    }
    Ok((key.to_owned(), value.to_owned()))
}

/// `flotilla status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The worker's status endpoint: http://HOST:PORT of its status.bind.
    #[arg(long, env = "FLOTILLA_STATUS_URL", default_value = status_client::DEFAULT_URL)]
    pub url: String,
    /// The fleet as the worker sees it (GET /fleet) instead of its own shards.
    #[arg(long)]
    pub fleet: bool,
    /// Print the endpoint's JSON as it is.
    #[arg(long)]
    pub json: bool,
    /// How long to wait for the answer.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub timeout: Duration,
}

/// `flotilla rewind`.
#[derive(Debug, Args)]
pub struct RewindArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// trim-horizon, latest, or an RFC 3339 time in UTC (2024-05-01T00:00:00Z).
    #[arg(long, value_name = "POSITION", value_parser = ops::parse_target)]
    pub to: ops::Target,
    #[command(flatten)]
    pub liveness: Liveness,
}

/// `flotilla position export`.
#[derive(Debug, Args)]
pub struct ExportArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// Only the leases of this stream, in an application of several streams
    /// (worker.streams): the token names it as its source.
    #[arg(long)]
    pub stream: Option<String>,
}

/// `flotilla position import`.
#[derive(Debug, Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pub table: TableArgs,
    /// The token `position export` wrote; - reads stdin.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Only the token's positions in this stream, and only this stream's leases, in an
    /// application of several streams (worker.streams).
    #[arg(long)]
    pub stream: Option<String>,
    /// Stamps the rows the token is applied to as this stream's (a single-stream
    /// application's `worker.stream`), with --force: carries positions over to it on
    /// purpose, where a worker of it would refuse rows of another stream (the same
    /// records under another name). Its creation time is stamped by the next worker.
    #[arg(long, value_name = "STREAM", requires = "force")]
    pub source: Option<String>,
    #[command(flatten)]
    pub liveness: Liveness,
}

/// How rewrites of checkpoints make sure no worker is processing.
#[derive(Debug, Args)]
pub struct Liveness {
    /// Write even if workers look alive (and, for import, a token of another
    /// application): only for workers you know are dead.
    #[arg(long)]
    pub force: bool,
    /// How long an owner's heartbeat may stand still before it counts as dead: the
    /// workers' lease.failover_time.
    #[arg(long, env = "FLOTILLA__LEASE__FAILOVER_TIME", default_value = "10s", value_parser = humantime::parse_duration)]
    pub failover_time: Duration,
}

/// Where a worker's settings come from.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// A TOML settings file (see config/default.toml for every setting); it overrides
    /// the built-in defaults, and FLOTILLA__SECTION__KEY variables override it.
    #[arg(long, env = "FLOTILLA_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct MultiLangArgs {
    /// The MultiLangDaemon properties file.
    #[arg(long, value_name = "FILE")]
    pub properties: PathBuf,
    /// A TOML settings file over the properties; FLOTILLA__SECTION__KEY variables
    /// override both.
    #[arg(long, env = "FLOTILLA_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
}

/// Where the lease table is.
#[derive(Debug, Args)]
pub struct TableArgs {
    /// The lease table: the workers' lease.table, which is their worker.application
    /// unless set (as the Java KCL's tableName).
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

impl Command {
    /// The command's name, for its span.
    fn name(&self) -> &'static str {
        match self {
            Command::Demo(_) => "demo",
            Command::Run(_) => "run",
            Command::Multilang(_) => "multilang",
            Command::Init(_) => "init",
            Command::Leases(_) => "leases",
            Command::Status(_) => "status",
            Command::Rewind(_) => "rewind",
            Command::Position(_) => "position",
            Command::Consumer(_) => "consumer",
            Command::Destroy(_) => "destroy",
        }
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

/// Runs the command in a span naming it, so its log lines (and a worker's, under it in
/// the span list) say which command they are of.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let span = tracing::info_span!("command", command = cli.command.name());
    tracing::Instrument::instrument(run_command(cli.command), span).await
}

async fn run_command(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Demo(args) => demo::run(args).await,
        Command::Run(args) => run_worker(args).await,
        Command::Multilang(args) => multilang(args).await,
        Command::Init(args) => init(args).await,
        Command::Leases(args) => {
            let table = args.open().await;
            let scan = table
                .scan()
                .await
                .map_err(|e| ops::explain(e, &args.table))
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
            if !scan.legacy.is_empty() {
                let names = |ws: &mut dyn Iterator<Item = &WorkerId>| {
                    ws.map(|w| w.as_str()).collect::<Vec<_>>().join(", ")
                };
                eprintln!(
                    "the lease table also holds flotilla rows of a version before the worker \
                     table ({}): a roster naming [{}], heartbeat rows of [{}]; workers of this \
                     version delete them once no worker of that version is alive (until then \
                     the Java KCL cannot read the table)",
                    table.worker_table_name(),
                    names(&mut scan.legacy.roster.iter().flatten()),
                    names(
                        &mut scan
                            .legacy
                            .older
                            .iter()
                            .map(|(w, _)| w)
                            .chain(&scan.legacy.both)
                    ),
                );
            }
            Ok(())
        }
        Command::Status(args) => {
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
        Command::Rewind(args) => {
            let table = args.table.open().await;
            ops::rewind(
                table.as_ref(),
                &args.to,
                args.liveness.force,
                args.liveness.failover_time,
            )
            .await
        }
        Command::Position(PositionCommand::Export(args)) => {
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
        Command::Consumer(ConsumerCommand::List(args)) => {
            let (client, arn) = args.open().await?;
            let mut consumers = client
                .list_stream_consumers(&arn)
                .await
                .with_context(|| format!("cannot list the consumers of stream {}", args.stream))?;
            consumers.sort_by(|a, b| a.name.cmp(&b.name));
            let mut out = std::io::stdout().lock();
            for consumer in &consumers {
                let created = consumer
                    .created
                    .map(|at| humantime::format_rfc3339_seconds(at).to_string());
                let line = serde_json::json!({
                    "name": consumer.name,
                    "status": consumer.status.to_string(),
                    "created": created,
                    "arn": consumer.arn,
                });
                writeln!(out, "{line}")?;
            }
            eprintln!(
                "flotilla: stream {} has {} of at most {} enhanced fan-out consumers",
                args.stream,
                consumers.len(),
                flotilla_actors::fanout::MAX_CONSUMERS
            );
            Ok(())
        }
        Command::Consumer(ConsumerCommand::Deregister(args)) => {
            let (client, arn) = args.stream.open().await?;
            let stream = &args.stream.stream;
            let consumer = match client.describe_stream_consumer(&arn, &args.name).await {
                Ok(consumer) => consumer,
                Err(StreamError::NotFound { .. }) => bail!(
                    "stream {stream} has no consumer named {}; `flotilla consumer list --stream \
                     {stream}` shows those it has",
                    args.name
                ),
                Err(error) => {
                    return Err(anyhow::Error::new(error))
                        .with_context(|| format!("cannot look up consumer {}", args.name));
                }
            };
            // By its ARN: by name, moto deletes the stream's other consumers instead.
            client
                .deregister_stream_consumer(&consumer.arn)
                .await
                .with_context(|| format!("cannot deregister consumer {}", args.name))?;
            println!(
                "consumer {} of stream {stream}: deregistered (was {}; Kinesis deletes it \
                 within seconds, ending its subscriptions)",
                args.name, consumer.status
            );
            Ok(())
        }
        Command::Destroy(args) => destroy(args).await,
        Command::Position(PositionCommand::Import(args)) => {
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
    }
}

/// `flotilla destroy`: checks (the table, its protection, live owners, the operator's
/// confirmation) before anything is deleted; then the consumers, then the table.
async fn destroy(args: DestroyArgs) -> anyhow::Result<()> {
    let name = &args.table.table;
    let table = args.table.client(&args.table.sdk().await);
    let protected = table
        .deletion_protected()
        .await
        .map_err(|e| ops::explain(e, name))
        .with_context(|| format!("cannot look up lease table {name}"))?;
    match protected {
        None if args.streams.is_empty() => {
            println!("lease table {name}: does not exist; nothing to delete");
            return Ok(());
        }
        Some(true) => bail!(
            "lease table {name} has deletion protection on, so it is left alone. Turn the \
             protection off where it was turned on (the CloudFormation stack's \
             DeletionProtectionEnabled, or `aws dynamodb update-table --table-name {name} \
             --no-deletion-protection-enabled`) and run this again"
        ),
        _ => {}
    }
    if protected.is_some() && args.force {
        ops::forced(&ops::scan(&table).await?, "deleting the lease table");
    }
    if protected.is_some() && !args.force {
        let scan = ops::scan(&table).await?;
        ops::refuse_while_alive(
            &table,
            scan,
            args.failover_time,
            &format!("delete lease table {name}"),
            "Stop them first and run this again. --force deletes anyway: the live workers then \
             lose their checkpoints and fail",
        )
        .await?;
    }
    let consumer = args.consumer_name.clone().unwrap_or_else(|| name.clone());
    if !args.yes {
        ops::confirm(
            &format!(
                "This deletes lease table {name} and every checkpoint in it{}. Type the table's \
             name to go on: ",
                if args.streams.is_empty() {
                    String::new()
                } else {
                    format!(
                        ", and consumer {consumer} of stream(s) {}",
                        args.streams.join(", ")
                    )
                }
            ),
            name,
        )?;
    }
    for stream in &args.streams {
        let stream_args = StreamArgs {
            stream: stream.clone(),
            region: args.table.region.clone(),
            kinesis_endpoint: args.kinesis_endpoint.clone(),
        };
        let (client, arn) = stream_args.open().await?;
        match client.describe_stream_consumer(&arn, &consumer).await {
            Ok(found) => {
                client
                    .deregister_stream_consumer(&found.arn)
                    .await
                    .with_context(|| format!("cannot deregister consumer {consumer}"))?;
                println!("consumer {consumer} of stream {stream}: deregistered");
            }
            Err(StreamError::NotFound { .. }) => {
                println!("consumer {consumer} of stream {stream}: none registered");
            }
            Err(error) => {
                return Err(anyhow::Error::new(error))
                    .with_context(|| format!("cannot look up consumer {consumer}"));
            }
        }
    }
    if protected.is_none() {
        println!("lease table {name}: does not exist; nothing to delete");
        return Ok(());
    }
    let deleted = table
        .delete_table()
        .await
        .map_err(|e| ops::explain(e, name))
        .with_context(|| format!("cannot delete lease table {name}"))?;
    if deleted {
        println!(
            "lease table {name}: deleted, with its worker table {}",
            table.worker_table_name()
        );
    } else {
        println!("lease table {name}: already gone");
    }
    Ok(())
}

/// `flotilla init`: the lease table, and a local stream if asked.
async fn init(args: InitArgs) -> anyhow::Result<()> {
    // Checked before anything is created: a refusal must leave nothing half done.
    let kinesis = match (&args.stream, &args.kinesis_endpoint) {
        (Some(stream), Some(endpoint)) if !ops::is_local_endpoint(endpoint) => bail!(
            "--stream creates streams on a local Kinesis only, and {endpoint} is not on \
             loopback. On AWS, create stream {stream} with your infrastructure code or \
             `aws kinesis create-stream --stream-name {stream} --shard-count {}`",
            args.shards
        ),
        (Some(stream), Some(endpoint)) => Some((stream.clone(), endpoint.clone())),
        _ => None,
    };
    let billing = match (args.billing_mode, args.read_capacity, args.write_capacity) {
        (None | Some(BillingMode::OnDemand), None, None) => Billing::OnDemand,
        (None | Some(BillingMode::OnDemand), _, _) => bail!(
            "--read-capacity and --write-capacity are for a provisioned table: add \
             --billing-mode provisioned, or leave them out for on-demand"
        ),
        (Some(BillingMode::Provisioned), Some(read), Some(write)) => {
            Billing::Provisioned { read, write }
        }
        (Some(BillingMode::Provisioned), _, _) => {
            bail!("--billing-mode provisioned needs both --read-capacity and --write-capacity")
        }
    };
    // A local server lacks point-in-time recovery, and a development table is deleted
    // and made again: both are off there unless asked for.
    let on_aws = !args
        .table
        .dynamodb_endpoint
        .as_deref()
        .is_some_and(ops::is_local_endpoint);
    let sdk = args.table.sdk().await;
    let name = &args.table.table;
    let table = args.table.client(&sdk);
    let options = TableOptions {
        billing,
        deletion_protection: args.deletion_protection.map_or(on_aws, OnOff::is_on),
        tags: args.tags.clone(),
    };
    let explain = |e| ops::explain(e, name);
    let state = table
        .ensure_table_with(&options)
        .await
        .map_err(explain)
        .with_context(|| format!("cannot make lease table {name}"))?;
    match state {
        TableState::Created => {
            if args.point_in_time_recovery.map_or(on_aws, OnOff::is_on) {
                table
                    .set_point_in_time_recovery(true)
                    .await
                    .map_err(explain)
                    .with_context(|| {
                        format!(
                            "lease table {name} was created, but point-in-time recovery could \
                             not be turned on (run again with --point-in-time-recovery off to \
                             go without)"
                        )
                    })?;
            }
        }
        // An existing table changes only where the command line says so.
        TableState::Existed => {
            if let Some(pitr) = args.point_in_time_recovery {
                table
                    .set_point_in_time_recovery(pitr.is_on())
                    .await
                    .map_err(explain)
                    .context("cannot change point-in-time recovery")?;
            }
            if let Some(protection) = args.deletion_protection {
                table
                    .set_deletion_protection(protection.is_on())
                    .await
                    .map_err(explain)
                    .context("cannot change deletion protection")?;
            }
            if !args.tags.is_empty() {
                table
                    .tag(&args.tags)
                    .await
                    .map_err(explain)
                    .context("cannot tag the table")?;
            }
        }
    }
    let now = table
        .table_settings()
        .await
        .map_err(explain)
        .with_context(|| format!("cannot describe lease table {name}"))?
        .ok_or_else(|| anyhow::anyhow!("lease table {name} disappeared after it was made"))?;
    let what = match state {
        TableState::Created => "created",
        TableState::Existed => "already exists",
    };
    let billed = match now.billing {
        Billing::OnDemand => "on-demand".to_owned(),
        Billing::Provisioned { read, write } => {
            format!("provisioned {read} RCU / {write} WCU")
        }
    };
    let on = |b: bool| if b { "on" } else { "off" };
    let pitr = now
        .point_in_time_recovery
        .map_or("not supported by this server", on);
    let note =
        if state == TableState::Existed && args.billing_mode.is_some() && now.billing != billing {
            " (billing left as it is: change it with UpdateTable)"
        } else {
            ""
        };
    println!(
        "lease table {name}: {what}; {billed}{note}, point-in-time recovery {pitr}, deletion \
         protection {}; heartbeats in {}",
        on(now.deletion_protection),
        table.worker_table_name()
    );
    if let Some((stream, endpoint)) = kinesis {
        let sdk = command_limits(&sdk, Service::Stream);
        let client = KinesisStream::new(&sdk, Some(&endpoint));
        let existing = match client.describe_stream_summary(&stream).await {
            Ok(summary) => Some(summary),
            Err(StreamError::NotFound { .. }) => None,
            Err(error) => {
                return Err(anyhow::Error::new(error))
                    .with_context(|| format!("cannot look up stream {stream} at {endpoint}"));
            }
        };
        let summary = match existing {
            Some(summary) => summary,
            None => {
                match client.create_stream(&stream, args.shards).await {
                    Ok(()) => {}
                    // Created by someone else since the look-up: as good.
                    Err(StreamError::InUse { .. }) => {}
                    Err(error) if error.to_string().contains("ResourceInUse") => {}
                    Err(error) => {
                        return Err(anyhow::Error::new(error)).with_context(|| {
                            format!("cannot create stream {stream} at {endpoint}")
                        });
                    }
                }
                println!("stream {stream}: created with {} shards", args.shards);
                return Ok(());
            }
        };
        let note = if summary.open_shard_count == args.shards {
            String::new()
        } else {
            format!(" (not {} as --shards asked; left as it is)", args.shards)
        };
        println!(
            "stream {stream}: already exists, {} open shards{note}",
            summary.open_shard_count
        );
    }
    Ok(())
}

/// `flotilla run`: the stdout processor on the stream the settings name.
async fn run_worker(args: RunArgs) -> anyhow::Result<()> {
    let settings = Settings::load(args.config.as_deref())?;
    let stream = if settings.worker.streams.is_empty() {
        settings.worker.stream.clone()
    } else {
        "set of worker.streams".to_owned()
    };
    let changes = flotilla_actors::model::SourceKind::of_stream(&settings.worker.stream)
        == flotilla_actors::model::SourceKind::DynamoDbStreams;
    let backend = Backend::aws(&settings.aws).await;
    // Listen before starting: a SIGTERM during start-up must not kill the process
    // with its leases held, nor a SIGHUP (whose default is to end the process).
    let terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    let hangup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    let mut builder = Worker::builder().backend(backend);
    if !settings.worker.streams.is_empty() {
        // The list the worker asks at every shard sync; SIGHUP replaces it.
        let current = Arc::new(std::sync::Mutex::new(settings.worker.stream_specs()?));
        builder = builder.stream_set(StreamSet::polled({
            let current = current.clone();
            move || {
                let list = current
                    .lock()
                    .map(|l| l.clone())
                    .map_err(|_| "the stream list's lock is poisoned".to_owned());
                async move { list }
            }
        }));
        tokio::spawn(reload_on_hangup(
            hangup,
            args.config.clone(),
            settings.clone(),
            Some(current),
        ));
    } else {
        tokio::spawn(reload_on_hangup(
            hangup,
            args.config.clone(),
            settings.clone(),
            None,
        ));
    }
    let worker = builder
        .settings(settings)
        .processor(move |shard| StdoutProcessor::new(shard, changes))
        .start()
        .await
        .with_context(|| format!("cannot start a worker on {stream}"))?;
    serve(worker, terminate).await
}

/// The stream list to read after the settings file was read again, or why the old one
/// stays (the message names the key at fault). `Ok((list, others))`: `others` are the
/// other settings the file changed (dotted keys), which take a restart.
fn reloaded_streams(
    started: &Settings,
    reloaded: Result<Settings, flotilla_actors::LoadError>,
) -> Result<(Vec<flotilla_actors::settings::StreamSpec>, Vec<String>), String> {
    let reloaded = reloaded.map_err(|e| e.to_string())?;
    reloaded.validate().map_err(|e| e.to_string())?;
    if reloaded.worker.streams.is_empty() {
        return Err(
            "worker.streams: the file now has no list (worker.stream instead?); a worker \
             changes from a list to one stream only by a restart"
                .to_owned(),
        );
    }
    let list = reloaded.worker.stream_specs().map_err(|e| e.to_string())?;
    let mut others = reloaded.clone();
    others.worker.streams = started.worker.streams.clone();
    Ok((list, started.changed_keys(&others)))
}

/// On each SIGHUP, reads the settings file again and gives the worker its new
/// `worker.streams` (read at the next shard sync). A file that cannot be read or is not
/// valid keeps the old list, said at ERROR with the key at fault; other changed
/// settings are named as needing a restart.
async fn reload_on_hangup(
    mut hangup: tokio::signal::unix::Signal,
    config: Option<PathBuf>,
    started: Settings,
    current: Option<Arc<std::sync::Mutex<Vec<flotilla_actors::settings::StreamSpec>>>>,
) {
    while hangup.recv().await.is_some() {
        let Some(current) = &current else {
            warn!(
                message = "SIGHUP: nothing is re-read for a worker of one stream (worker.stream); restart it to change its settings."
            );
            continue;
        };
        match reloaded_streams(&started, Settings::load(config.as_deref())) {
            Ok((list, others)) => {
                let names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
                info!(message = "SIGHUP: settings file read again; the stream set changes at the next shard sync.", streams = ?names);
                if !others.is_empty() {
                    warn!(
                        message = "SIGHUP: settings other than worker.streams changed; only worker.streams is read again, so these take effect at the next restart.",
                        settings = %others.join(", ")
                    );
                }
                match current.lock() {
                    Ok(mut current) => *current = list,
                    Err(_) => tracing::error!(
                        message =
                            "SIGHUP: the stream list's lock is poisoned; the set is not changed."
                    ),
                }
            }
            Err(error) => {
                tracing::error!(message = "SIGHUP: settings file not taken; the worker keeps its stream set.", %error);
            }
        }
    }
}

/// `flotilla multilang`: the properties file as the lowest settings layer, one child
/// per lease.
async fn multilang(args: MultiLangArgs) -> anyhow::Result<()> {
    let path = args.properties.display().to_string();
    let text = std::fs::read_to_string(&args.properties)
        .with_context(|| format!("cannot read properties file {path}"))?;
    let properties = Properties::parse(&text).with_context(|| format!("properties file {path}"))?;
    let daemon = DaemonConfig::from_properties(&properties)
        .with_context(|| format!("properties file {path}"))?;
    for note in &daemon.warnings {
        warn!(message = "MultiLang property not used.", file = %path, note = %note);
    }
    // Before anything starts: a program that cannot be run would fail each shard.
    daemon
        .command
        .check()
        .with_context(|| format!("properties file {path}"))?;
    let mut base = daemon.settings.clone();
    // The child decides what is processed: its checkpoints are the only ones.
    base.push(("checkpoint.mode".to_owned(), "manual".to_owned()));
    let settings = Settings::load_over(
        &base,
        &format!("properties file {path}"),
        args.config.as_deref(),
        Settings::environment()?,
    )?;
    if settings.checkpoint.mode != CheckpointMode::Manual {
        bail!(
            "checkpoint.mode = {:?}: a MultiLang processor checkpoints itself, so the mode must be manual (remove the override)",
            settings.checkpoint.mode
        );
    }
    let stream = settings.worker.stream.clone();
    let backend = Backend::aws(&settings.aws).await;
    let terminate = signal(SignalKind::terminate()).context("cannot listen for SIGTERM")?;
    // As `run` on one stream: a SIGHUP (whose default ends the process with its leases
    // held) is said and ignored; nothing here can be re-read while running.
    let mut hangup = signal(SignalKind::hangup()).context("cannot listen for SIGHUP")?;
    tokio::spawn(async move {
        while hangup.recv().await.is_some() {
            warn!(
                message = "SIGHUP: flotilla multilang reads its properties file and settings only at start; nothing is re-read. Restart it to change them (SIGTERM stops it gracefully)."
            );
        }
    });
    let command = Arc::new(daemon.command);
    let worker = Worker::builder()
        .settings(settings)
        .backend(backend)
        .processor(move |_| MultiLangProcessor::new(command.clone()))
        .start()
        .await
        .with_context(|| format!("cannot start a worker on stream {stream}"))?;
    serve(worker, terminate).await
}

/// Runs a started worker until Ctrl-C, SIGTERM or its own stop, then shuts it down
/// gracefully and reports how.
async fn serve(
    mut worker: Worker,
    mut terminate: tokio::signal::unix::Signal,
) -> anyhow::Result<()> {
    #[cfg(feature = "otel")]
    crate::otel::watch(&worker);
    let signal_name = tokio::select! {
        result = tokio::signal::ctrl_c() => {
            result.context("cannot listen for Ctrl-C")?;
            "Ctrl-C"
        }
        _ = terminate.recv() => "SIGTERM",
        result = worker.wait() => {
            // Only a failure stops this worker on its own: nothing here holds a handle.
            let stopped = result.context("the worker stopped")?;
            eprintln!("flotilla: stopped ({}); {}", stopped.reason, shutdown_summary(&stopped.report));
            if !stopped.report.clean() {
                bail!("the shutdown was not clean");
            }
            return Ok(());
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
    let mut json = serde_json::json!({
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
    });
    // A multi-stream lease (worker.streams) names its stream; a single stream's do not.
    if let Some(stream) = lease.key.stream_name() {
        json["stream"] = serde_json::Value::from(stream);
    }
    json
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

    use super::*;
    use flotilla_actors::settings::StreamEntry;

    fn started() -> Settings {
        let mut s = Settings::default();
        s.worker.application = "app".into();
        s.worker.streams = vec![StreamEntry::Name("a".into())];
        s
    }

    /// A re-read file gives its list; a bad one keeps the old list and names the key;
    /// other changed settings are named as needing a restart.
    #[test]
    fn a_reloaded_file_gives_its_list_or_says_which_key_is_wrong() {
        let mut next = started();
        next.worker.streams.push(StreamEntry::Name("b".into()));
        let (list, others) = reloaded_streams(&started(), Ok(next.clone())).unwrap();
        assert_eq!(
            list.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["a", "b"]
        );
        assert!(others.is_empty(), "{others:?}");
        next.lease.max_leases = 7;
        next.reader.mode = flotilla_actors::settings::ReadMode::Fanout;
        assert_eq!(
            reloaded_streams(&started(), Ok(next.clone())).unwrap().1,
            ["lease.max_leases", "reader.mode"],
            "the settings that need a restart, by name"
        );
        let mut bad = started();
        bad.worker.streams.push(StreamEntry::Name("a".into()));
        let error = reloaded_streams(&started(), Ok(bad)).unwrap_err();
        assert!(error.contains("worker.streams[1]"), "{error}");
        let mut single = started();
        single.worker.streams.clear();
        single.worker.stream = "a".into();
        let error = reloaded_streams(&started(), Ok(single)).unwrap_err();
        assert!(error.contains("worker.streams"), "{error}");
        let unreadable = Settings::load(Some(std::path::Path::new("/nonexistent/flotilla.toml")));
        assert!(reloaded_streams(&started(), unreadable).is_err());
    }
}
