//! Command-line parsing: the clap definitions of every command and its flags, their
//! help text, and the value parsers of the flags. What each command does is in
//! `commands`.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

use crate::demo::DemoArgs;
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
    #[arg(long, env = "FLOTILLA__LEASE__FAILOVER_TIME", default_value = "4s", value_parser = humantime::parse_duration)]
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
    pub fn is_on(self) -> bool {
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
    #[arg(long, env = "FLOTILLA__LEASE__FAILOVER_TIME", default_value = "4s", value_parser = humantime::parse_duration)]
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

impl Command {
    /// The command's name, for its span.
    pub fn name(&self) -> &'static str {
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
