//! Operator commands on the lease table: `init` (and a local stream), `rewind`,
//! `position export` and `position import`.
//!
//! # Liveness
//!
//! `rewind` and `position import` rewrite checkpoints, which only works while no worker
//! processes the shards: a live owner keeps its position in memory and writes it over
//! the new one at its next checkpoint (checkpoints do not change the lease counter, so
//! the fence does not stop it). Before writing, the owners of unfinished leases are
//! watched for as long as the workers themselves give a peer (`watch_window`: the
//! `lease.failover_time` each declares in its heartbeat row, never less for a smaller
//! `--failover-time`), as the workers themselves judge liveness: an
//! owner is alive if its heartbeat row's counter moves, or (a Java KCL worker, which
//! renews leases instead) a lease it owns has its counter raised; a worker that takes a
//! lease meanwhile is alive too. Owners that show no sign of life are dead (crashed
//! workers' names left on their leases). `--force` skips the check.
//!
//! # Rewinding to a time
//!
//! A KCL 2.x lease row cannot carry a timestamp: its `checkpoint` holds the sentinel
//! `AT_TIMESTAMP` and the worker takes the time from its own `worker.initial_timestamp`
//! (as the Java KCL takes it from its configuration). A checkpoint just before the first
//! record at or after the time cannot be written either: a checkpoint names the last
//! processed record, Kinesis cannot be read backwards to find the one before, and no
//! made-up sequence number is safe to start from. So `rewind --to TIME` writes
//! `AT_TIMESTAMP`, and the workers must then run with `worker.initial_position =
//! "AT_TIMESTAMP"` and `worker.initial_timestamp = TIME`; a worker without a timestamp
//! refuses to read such a shard (the shard restarts, failing, and says why) rather than
//! start anywhere else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, anyhow, bail};
use flotilla_actors::backend::{LeaseError, LeaseTable, ScanOutput};
use flotilla_actors::model::{Checkpoint, Lease, LeaseKey, SourceKind, WorkerId};
use serde::{Deserialize, Serialize};

/// What a liveness check found against one owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveOwner {
    pub worker: WorkerId,
    /// What showed it alive.
    pub sign: String,
    /// The unfinished leases it holds, as last scanned.
    pub leases: Vec<LeaseKey>,
}

impl fmt::Display for LiveOwner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let keys: Vec<&str> = self.leases.iter().map(LeaseKey::as_str).collect();
        write!(f, "{} ({}", self.worker, self.sign)?;
        if !keys.is_empty() {
            write!(f, "; holds {}", keys.join(", "))?;
        }
        f.write_str(")")
    }
}

/// The owners of unfinished leases in `first` that show a sign of life within
/// `failover_time` (see the module docs), and the last scan made. Returns at once when
/// no lease is owned, and as soon as every owner has shown itself alive.
pub async fn live_owners(
    table: &dyn LeaseTable,
    first: ScanOutput,
    failover_time: Duration,
) -> Result<(Vec<LiveOwner>, ScanOutput), LeaseError> {
    let holdings = |scan: &ScanOutput| -> BTreeMap<WorkerId, Vec<LeaseKey>> {
        let mut held: BTreeMap<WorkerId, Vec<LeaseKey>> = BTreeMap::new();
        for lease in &scan.leases {
            if let (Some(owner), false) = (&lease.owner, lease.checkpoint.is_shard_end()) {
                held.entry(owner.clone())
                    .or_default()
                    .push(lease.key.clone());
            }
        }
        held
    };
    let mut pending: BTreeSet<WorkerId> = holdings(&first).into_keys().collect();
    if pending.is_empty() {
        return Ok((Vec::new(), first));
    }
    let heartbeats = |scan: &ScanOutput| -> HashMap<WorkerId, u64> {
        scan.heartbeats
            .iter()
            .map(|h| (h.worker.clone(), h.counter))
            .collect()
    };
    let leases = |scan: &ScanOutput| -> HashMap<LeaseKey, (Option<WorkerId>, u64)> {
        scan.leases
            .iter()
            .map(|l| (l.key.clone(), (l.owner.clone(), l.counter)))
            .collect()
    };
    let first_heartbeats = heartbeats(&first);
    let first_leases = leases(&first);
    let given = failover_time;
    let failover_time = watch_window(given, &pending, &first.heartbeats);
    eprintln!(
        "flotilla: checking whether the owners of the leases are alive: {} (up to {}{}; \
         --force skips this)",
        pending
            .iter()
            .map(WorkerId::as_str)
            .collect::<Vec<_>>()
            .join(", "),
        humantime::format_duration(failover_time),
        if failover_time > given {
            format!(
                ", the lease.failover_time the workers declare, not the {} given",
                humantime::format_duration(given)
            )
        } else {
            ", lease.failover_time".to_owned()
        }
    );

    let poll = (failover_time / 5).clamp(Duration::from_millis(100), Duration::from_secs(1));
    let deadline = tokio::time::Instant::now() + failover_time;
    let mut signs: BTreeMap<WorkerId, String> = BTreeMap::new();
    let mut last = first;
    while !pending.is_empty() {
        let now = tokio::time::Instant::now();
        if now >= deadline {
            break;
        }
        tokio::time::sleep(poll.min(deadline - now)).await;
        last = table.scan().await?;
        let beats = heartbeats(&last);
        for (worker, counter) in &beats {
            if first_heartbeats.get(worker) != Some(counter) {
                signs
                    .entry(worker.clone())
                    .or_insert_with(|| format!("heartbeat moved to {counter}"));
            }
        }
        for lease in &last.leases {
            let Some(owner) = &lease.owner else { continue };
            match first_leases.get(&lease.key) {
                Some((Some(was), counter)) if was == owner => {
                    if lease.counter != *counter {
                        signs
                            .entry(owner.clone())
                            .or_insert_with(|| format!("renewed lease {}", lease.key));
                    }
                }
                _ => {
                    signs
                        .entry(owner.clone())
                        .or_insert_with(|| format!("took lease {}", lease.key));
                }
            }
        }
        pending.retain(|w| !signs.contains_key(w));
    }
    // Only the workers that hold something now matter; report what they hold now.
    let held = holdings(&last);
    let live = signs
        .into_iter()
        .filter_map(|(worker, sign)| {
            let leases = held.get(&worker)?.clone();
            Some(LiveOwner {
                worker,
                sign,
                leases,
            })
        })
        .collect();
    Ok((live, last))
}

/// Where `rewind` puts every unfinished lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    TrimHorizon,
    Latest,
    /// The time, and as the operator wrote it (for the settings to copy).
    AtTimestamp(SystemTime, String),
}

impl Target {
    pub fn checkpoint(&self) -> Checkpoint {
        match self {
            Target::TrimHorizon => Checkpoint::TrimHorizon,
            Target::Latest => Checkpoint::Latest,
            Target::AtTimestamp(..) => Checkpoint::AtTimestamp,
        }
    }
}

/// `--to`: `trim-horizon`, `latest` (either spelling, any case) or an RFC 3339 time in
/// UTC, as `worker.initial_timestamp` takes it.
pub fn parse_target(text: &str) -> Result<Target, String> {
    match text.to_ascii_lowercase().replace('_', "-").as_str() {
        "trim-horizon" => return Ok(Target::TrimHorizon),
        "latest" => return Ok(Target::Latest),
        _ => {}
    }
    let at = humantime::parse_rfc3339(text).map_err(|e| {
        format!(
            "{text:?} is neither trim-horizon, latest nor an RFC 3339 time in UTC ({e}); \
             write e.g. 2024-05-01T00:00:00Z"
        )
    })?;
    if at > SystemTime::now() {
        return Err(format!(
            "{text} is in the future; to skip everything up to now use --to latest"
        ));
    }
    Ok(Target::AtTimestamp(at, text.to_owned()))
}

/// What a batch of checkpoint writes did, printed one lease per line.
#[derive(Debug, Default)]
struct Writes {
    written: usize,
    unchanged: usize,
    skipped: usize,
    failed: Vec<String>,
}

impl Writes {
    /// ", N failed" when some writes failed, for the summary line.
    fn failed_suffix(&self) -> String {
        if self.failed.is_empty() {
            String::new()
        } else {
            format!(", {} failed", self.failed.len())
        }
    }

    async fn apply(&mut self, table: &dyn LeaseTable, lease: &Lease, to: &Checkpoint) {
        let key = lease.key.as_str();
        if &lease.checkpoint == to {
            self.unchanged += 1;
            println!("{key}: {to}, unchanged");
            return;
        }
        match table.checkpoint(&lease.key, &lease.fence(), to, &[]).await {
            Ok(()) => {
                self.written += 1;
                println!("{key}: {} -> {to}", lease.checkpoint);
            }
            Err(LeaseError::ConditionFailed { owner, counter, .. }) => {
                let now = match (owner, counter) {
                    (_, None) => "its row is gone".to_owned(),
                    (Some(owner), Some(c)) => format!("{owner} owns it now (counter {c})"),
                    (None, Some(c)) => format!("nobody owns it now (counter {c})"),
                };
                self.failed.push(format!(
                    "{key}: changed since it was read ({now}; owner was {}, counter {})",
                    lease.owner.as_ref().map_or("nobody", WorkerId::as_str),
                    lease.counter
                ));
            }
            Err(other) => self.failed.push(format!("{key}: {other}")),
        }
    }

    fn finish(self, what: &str) -> anyhow::Result<()> {
        if self.failed.is_empty() {
            return Ok(());
        }
        bail!(
            "{} of the leases were not {what} (the others were):\n  {}\nA worker may have \
             taken them meanwhile; stop the workers and run the command again",
            self.failed.len(),
            self.failed.join("\n  ")
        )
    }
}

/// Reads the whole table, naming it (and what to do) on failure.
pub async fn scan(table: &dyn LeaseTable) -> anyhow::Result<ScanOutput> {
    let scan = table
        .scan()
        .await
        .map_err(|e| explain(e, table.table_name()))
        .with_context(|| format!("cannot read lease table {}", table.table_name()))?;
    for bad in &scan.malformed {
        eprintln!("flotilla: skipped a malformed row, left as is: {bad}");
    }
    Ok(scan)
}

/// Asks on the terminal for `expected` to be typed back. Without a terminal (a script,
/// a pipe) it refuses rather than reading whatever stdin holds: scripts pass `--yes`.
pub fn confirm(prompt: &str, expected: &str) -> anyhow::Result<()> {
    use std::io::{BufRead as _, IsTerminal as _, Write as _};
    let stdin = std::io::stdin();
    if !stdin.is_terminal() {
        bail!("not confirmed: there is no terminal to ask on; pass --yes to confirm in a script");
    }
    let mut err = std::io::stderr().lock();
    err.write_all(prompt.as_bytes())?;
    err.flush()?;
    let mut answer = String::new();
    stdin.lock().read_line(&mut answer)?;
    if answer.trim() != expected {
        bail!("not confirmed: the answer was not {expected:?}; nothing was deleted");
    }
    Ok(())
}

/// How long a command watches for a sign of life an owner that declares no failover
/// time in its heartbeat row (a Java KCL worker, a flotilla before the declarations):
/// the KCL's and flotilla's default `failoverTimeMillis` / `lease.failover_time`.
pub const UNDECLARED_FAILOVER: Duration = Duration::from_secs(10);

/// How long the owners of leases are watched for a sign of life before they count as
/// dead: the longest failover time any of them declares in its heartbeat row (the time
/// its own peers give it before they take its leases), [`UNDECLARED_FAILOVER`] for one
/// that declares none, and `given` (`--failover-time`) only where it is longer. A
/// smaller number on the command line never calls a live worker dead: with `0s` the
/// check used to pass at once, and with `1s` against workers beating every 2 s, two
/// times in three.
pub fn watch_window(
    given: Duration,
    owners: &BTreeSet<WorkerId>,
    heartbeats: &[flotilla_actors::model::Heartbeat],
) -> Duration {
    owners
        .iter()
        .map(|owner| {
            heartbeats
                .iter()
                .find(|h| &h.worker == owner)
                .and_then(|h| h.load.failover_time_ms)
                .map_or(UNDECLARED_FAILOVER, Duration::from_millis)
        })
        .fold(given, Duration::max)
}

/// What `--force` overrides, said before it does: the leases whose owners are not
/// checked for a sign of life.
pub fn forced(scan: &ScanOutput, doing: &str) {
    let owners: BTreeSet<&str> = scan
        .leases
        .iter()
        .filter(|l| !l.checkpoint.is_shard_end())
        .filter_map(|l| l.owner.as_ref().map(WorkerId::as_str))
        .collect();
    if !owners.is_empty() {
        eprintln!(
            "flotilla: --force: {doing} without checking whether the owners of the leases are \
             alive ({}): a live one writes its own checkpoint over this, or fails",
            owners.into_iter().collect::<Vec<_>>().join(", ")
        );
    }
}

/// What a refused checkpoint write says to do (`refuse_while_alive`'s `advice`).
const WRITE_ADVICE: &str = "Stop them first (a clean stop releases their leases) and run this \
                            again. --force writes anyway: only for workers you know are dead, \
                            as a live one writes its own checkpoint over the new one";

/// The liveness check the commands skip with --force: an error naming the live workers
/// ("refusing to `doing` ..."), then `advice` (how to go on), and the last scan made
/// when there are none.
pub async fn refuse_while_alive(
    table: &dyn LeaseTable,
    scan: ScanOutput,
    failover_time: Duration,
    doing: &str,
    advice: &str,
) -> anyhow::Result<ScanOutput> {
    let (live, scan) = live_owners(table, scan, failover_time)
        .await
        .map_err(|e| explain(e, table.table_name()))
        .with_context(|| format!("cannot read lease table {}", table.table_name()))?;
    if !live.is_empty() {
        let names: Vec<String> = live.iter().map(ToString::to_string).collect();
        bail!(
            "refusing to {doing} while live workers hold leases: {}.\n{advice}",
            names.join(", ")
        );
    }
    Ok(scan)
}

/// `flotilla rewind`.
pub async fn rewind(
    table: &dyn LeaseTable,
    target: &Target,
    force: bool,
    failover_time: Duration,
) -> anyhow::Result<()> {
    let scan = scan(table).await?;
    if scan.leases.is_empty() {
        bail!(
            "lease table {} has no leases: nothing to rewind. Workers create the leases when \
             they first start; to start a new application elsewhere, set \
             worker.initial_position instead",
            table.table_name()
        );
    }
    let mut scan = if force {
        forced(&scan, "rewinding");
        scan
    } else {
        refuse_while_alive(table, scan, failover_time, "rewind", WRITE_ADVICE).await?
    };
    scan.leases.sort_by(|a, b| a.key.cmp(&b.key));
    let to = target.checkpoint();
    let mut writes = Writes::default();
    for lease in &scan.leases {
        if lease.checkpoint.is_shard_end() {
            writes.skipped += 1;
            println!("{}: SHARD_END, finished, left as is", lease.key);
            continue;
        }
        writes.apply(table, lease, &to).await;
    }
    eprintln!(
        "flotilla: {} leases set to {to}, {} already there, {} finished left as is{}",
        writes.written,
        writes.unchanged,
        writes.skipped,
        writes.failed_suffix()
    );
    if let Target::AtTimestamp(_, text) = target {
        eprintln!(
            "flotilla: a lease cannot hold the time itself: start every worker with\n  \
             [worker]\n  initial_position = \"AT_TIMESTAMP\"\n  initial_timestamp = \"{text}\"\n\
             (or FLOTILLA__WORKER__INITIAL_POSITION=AT_TIMESTAMP \
             FLOTILLA__WORKER__INITIAL_TIMESTAMP={text}); a worker without it stops on these \
             shards and says why"
        );
    }
    writes.finish("rewound")
}

/// The JSON `position export` writes and `position import` reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PositionToken {
    /// [`TOKEN_VERSION`]; a reader refuses others.
    pub version: u32,
    /// The application (lease table) the positions were read from.
    pub application: String,
    /// When, RFC 3339 in UTC; informational.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_at: Option<String>,
    /// The stream the positions belong to (a Kinesis stream's name or a DynamoDB
    /// stream's ARN), as the lease rows name it; absent when they do not (rows a KCL
    /// or an older flotilla created). A position means nothing in another stream, so
    /// `import` refuses a token of another source.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// By lease key (the shard id, for a single-stream application).
    pub shards: BTreeMap<String, ShardPosition>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardPosition {
    /// A sequence number, or TRIM_HORIZON, LATEST, AT_TIMESTAMP or SHARD_END.
    pub checkpoint: String,
    #[serde(default)]
    pub sub_sequence: u64,
}

pub const TOKEN_VERSION: u32 = 1;

/// `flotilla position export`: every lease's checkpoint, or (`stream`) those of one
/// stream of a multi-stream application.
pub async fn export(table: &dyn LeaseTable, stream: Option<&str>) -> anyhow::Result<PositionToken> {
    let mut scan = scan(table).await?;
    if let Some(stream) = stream {
        scan.leases.retain(|l| l.key.stream_name() == Some(stream));
        if scan.leases.is_empty() {
            bail!(
                "lease table {} has no lease of stream {stream} (a stream of worker.streams, \
                 whose lease keys are account:{stream}:epoch:shardId)",
                table.table_name()
            );
        }
    }
    let shards = scan
        .leases
        .iter()
        .map(|lease| {
            let (checkpoint, sub_sequence) = lease.checkpoint.encode();
            (
                lease.key.as_str().to_owned(),
                ShardPosition {
                    checkpoint: checkpoint.to_owned(),
                    sub_sequence,
                },
            )
        })
        .collect();
    Ok(PositionToken {
        version: TOKEN_VERSION,
        application: table.table_name().to_owned(),
        source: match stream {
            Some(stream) => Some(stream.to_owned()),
            None => source_of(&scan.leases, table.table_name())?,
        },
        exported_at: Some(humantime::format_rfc3339_millis(SystemTime::now()).to_string()),
        shards,
    })
}

/// The one source the single-stream leases name; `None` when none names one. Leases of
/// two sources in one table are an error: a token must say which stream its positions
/// are in. A multi-stream lease's key names its stream (account, name and creation), so
/// its position can only ever land on its own stream's row: it does not count here.
fn source_of(leases: &[Lease], table: &str) -> anyhow::Result<Option<String>> {
    let sources: BTreeSet<&str> = leases
        .iter()
        .filter(|l| l.key.stream_id().is_none())
        .filter_map(|l| l.source.as_deref())
        .collect();
    match sources.len() {
        0 | 1 => Ok(sources.first().map(|s| (*s).to_owned())),
        _ => bail!(
            "lease table {table} holds leases of several sources ({}); a position token is \
             of one",
            sources.into_iter().collect::<Vec<_>>().join(", ")
        ),
    }
}

/// Reads a token from a file, or stdin for `-`, checking its version and checkpoints.
pub fn read_token(path: &Path) -> anyhow::Result<(PositionToken, BTreeMap<String, Checkpoint>)> {
    let text = if path == Path::new("-") {
        std::io::read_to_string(std::io::stdin()).context("cannot read the token from stdin")?
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("cannot read position token {}", path.display()))?
    };
    let what = || format!("position token {}", path.display());
    let value: serde_json::Value = serde_json::from_str(&text).with_context(|| {
        format!(
            "{} is not JSON; `flotilla position export` writes one",
            what()
        )
    })?;
    match value.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(TOKEN_VERSION) => {}
        Some(v) => bail!(
            "{} is version {v}; this flotilla reads version {TOKEN_VERSION} only",
            what()
        ),
        None => bail!(
            "{} has no \"version\": not written by `flotilla position export`",
            what()
        ),
    }
    // Each shard on its own first, so a bad value names its shard and its field.
    if let Some(shards) = value.get("shards").and_then(serde_json::Value::as_object) {
        for (key, position) in shards {
            shard_position(position).map_err(|e| anyhow!("{}: shard {key}: {e}", what()))?;
        }
    }
    let token: PositionToken = serde_json::from_value(value).with_context(what)?;
    let mut checkpoints = BTreeMap::new();
    for (key, position) in &token.shards {
        let checkpoint = Checkpoint::decode(&position.checkpoint, position.sub_sequence)
            .map_err(|e| anyhow!("{}: shard {key}: {e}", what()))?;
        checkpoints.insert(key.clone(), checkpoint);
    }
    Ok((token, checkpoints))
}

/// One shard's entry of a token, checked field by field: serde's own message for a wrong
/// type names neither the field nor the shard.
fn shard_position(value: &serde_json::Value) -> Result<ShardPosition, String> {
    use serde_json::Value;
    let Some(fields) = value.as_object() else {
        return Err(format!(
            "{value} is not an object like {{\"checkpoint\": \"...\", \"sub_sequence\": 0}}"
        ));
    };
    let checkpoint = match fields.get("checkpoint") {
        Some(Value::String(text)) => text.clone(),
        Some(other) => {
            return Err(format!(
                "\"checkpoint\" is {other}; it must be a sequence number or TRIM_HORIZON, \
                 LATEST, AT_TIMESTAMP or SHARD_END, in quotes"
            ));
        }
        None => return Err("no \"checkpoint\"".to_owned()),
    };
    let sub_sequence = match fields.get("sub_sequence") {
        None => 0,
        Some(number) => number.as_u64().ok_or_else(|| {
            format!("\"sub_sequence\" is {number}; it must be a whole number from 0 up")
        })?,
    };
    Ok(ShardPosition {
        checkpoint,
        sub_sequence,
    })
}

/// `flotilla position import`. Fails (after writing what it could) when any shard of
/// the token was not applied, naming each and why: a partial restore must not look
/// like a complete one to a script.
pub async fn import(
    table: &dyn LeaseTable,
    path: &Path,
    force: bool,
    failover_time: Duration,
    stream: Option<&str>,
    adopt_as: Option<&str>,
) -> anyhow::Result<()> {
    let (token, mut checkpoints) = read_token(path)?;
    // One stream of a multi-stream application: its positions, onto its rows.
    let of_stream = |key: &str| stream.is_none_or(|s| LeaseKey::new(key).stream_name() == Some(s));
    checkpoints.retain(|key, _| of_stream(key));
    if let Some(stream) = stream
        && checkpoints.is_empty()
    {
        bail!(
            "position token {} has no position in stream {stream} (keys \
             account:{stream}:epoch:shardId)",
            path.display()
        );
    }
    let application = table.table_name();
    if token.application != application {
        if !force {
            bail!(
                "position token {} is for application {}, not {application}; pass --force to \
                 apply it anyway (e.g. to start a renamed application where the old one was)",
                path.display(),
                token.application
            );
        }
        eprintln!(
            "flotilla: applying a token of application {} to {application} (--force)",
            token.application
        );
    }
    let mut scan = scan(table).await?;
    scan.leases.retain(|l| of_stream(l.key.as_str()));
    let table_source = source_of(&scan.leases, application)?;
    if let (Some(from), Some(to)) = (&token.source, &table_source)
        && from != to
    {
        bail!(
            "position token {} holds positions in {} ({from}), and table {application}'s \
             leases read {} ({to}): a position in one stream means nothing in another, so \
             it is not applied (not even with --force)",
            path.display(),
            SourceKind::of_stream(from),
            SourceKind::of_stream(to),
        );
    }
    let mut scan = if force {
        forced(&scan, "importing positions");
        scan
    } else {
        refuse_while_alive(table, scan, failover_time, "import positions", WRITE_ADVICE).await?
    };
    scan.leases.sort_by(|a, b| a.key.cmp(&b.key));
    let mut writes = Writes::default();
    for lease in &scan.leases {
        match checkpoints.get(lease.key.as_str()) {
            Some(to) => writes.apply(table, lease, to).await,
            None => {
                writes.skipped += 1;
                println!(
                    "{}: not in the token, left at {}",
                    lease.key, lease.checkpoint
                );
            }
        }
    }
    let rows: BTreeSet<&str> = scan.leases.iter().map(|l| l.key.as_str()).collect();
    let mut missing: Vec<&str> = checkpoints
        .keys()
        .map(String::as_str)
        .filter(|key| !rows.contains(key))
        .collect();
    // A table stream's shards close every few hours and leave the stream 24 hours
    // later, their finished rows with them: a token's shards gone from a table that
    // reads the same stream are past retention. They are pruned, named; their children
    // start at TRIM_HORIZON, the oldest change kept.
    let past_retention = token
        .source
        .as_deref()
        .is_some_and(|s| SourceKind::of_stream(s) == SourceKind::DynamoDbStreams)
        && table_source.is_some();
    if past_retention && !missing.is_empty() {
        eprintln!(
            "flotilla: warning: pruned {} shards of the token that the table no longer has \
             (past the stream's retention, or finished and deleted): {}; their children \
             start at TRIM_HORIZON",
            missing.len(),
            missing.join(", ")
        );
        missing.clear();
    }
    // `--source`: the rows the token names are this stream's from now on (the next
    // worker of it stamps the stream's creation time).
    if let Some(to) = adopt_as {
        let mut stamped = 0;
        for lease in scan
            .leases
            .iter()
            .filter(|l| l.key.stream_id().is_none() && checkpoints.contains_key(l.key.as_str()))
        {
            match table.stamp_source(&lease.key, to, None, true).await {
                Ok(true) => stamped += 1,
                Ok(false) => writes.failed.push(format!(
                    "{}: the row is gone; not stamped as {to}'s",
                    lease.key
                )),
                Err(error) => writes
                    .failed
                    .push(format!("{}: not stamped as {to}'s: {error}", lease.key)),
            }
        }
        eprintln!("flotilla: {stamped} leases stamped as stream {to}'s (--source)");
    }
    eprintln!(
        "flotilla: {} leases set, {} already there, {} not in the token left as is{}",
        writes.written,
        writes.unchanged,
        writes.skipped,
        writes.failed_suffix()
    );
    let mut not_applied = writes.failed;
    let mut hints = Vec::new();
    if !not_applied.is_empty() {
        hints.push(
            "A worker may have taken a lease meanwhile: stop the workers and run the command \
             again.",
        );
    }
    if !missing.is_empty() {
        not_applied.extend(
            missing
                .iter()
                .map(|key| format!("{key}: no lease row in table {application}")),
        );
        hints.push(
            "Workers create a shard's lease row when they first see the shard (start one, stop \
             it, then import again), or the row was deleted after the shard finished.",
        );
    }
    if !not_applied.is_empty() {
        let what = if not_applied.len() == checkpoints.len() {
            format!(
                "none of the {} shards in the token was applied",
                checkpoints.len()
            )
        } else {
            format!(
                "{} of the {} shards in the token were not applied (the others were)",
                not_applied.len(),
                checkpoints.len()
            )
        };
        bail!(
            "{what}:\n  {}\n{}",
            not_applied.join("\n  "),
            hints.join(" ")
        );
    }
    Ok(())
}

/// Adds what to do to the lease-table errors an operator can fix.
pub fn explain(error: LeaseError, table: &str) -> anyhow::Error {
    let hint = match &error {
        LeaseError::WrongKeySchema { .. } => Some(format!(
            "table {table} is not a lease table. Pick another application name (--table), \
             or, if {table} is a lease table of an old program you no longer need, delete it \
             and run flotilla init again"
        )),
        LeaseError::NotFound { .. } => Some(format!(
            "there is no table {table} in this region: create it with `flotilla init --table \
             {table}`, or check --region / AWS_REGION and --dynamodb-endpoint"
        )),
        LeaseError::AccessDenied { .. } => Some(format!(
            "the AWS credentials in use may not do this. Grant them dynamodb:DescribeTable, \
             CreateTable, Scan, GetItem, PutItem, UpdateItem and DeleteItem on \
             arn:aws:dynamodb:REGION:ACCOUNT:table/{table}, or use other credentials \
             (AWS_PROFILE); `aws sts get-caller-identity` shows whose they are"
        )),
        _ => None,
    };
    match hint {
        Some(hint) => anyhow!(error).context(hint),
        None => anyhow!(error),
    }
}

/// Whether `url` names a server on this machine (loopback address or `localhost`).
pub fn is_local_endpoint(url: &str) -> bool {
    let Ok(uri) = url.parse::<hyper::Uri>() else {
        return false;
    };
    let Some(host) = uri.host() else {
        return false;
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `position import --force --source B`: the positions of rows stamped as stream A
    /// are carried to B on purpose: applied, and the rows stamped as B's (no creation
    /// time: B's first worker stamps it), so that a worker of B adopts them instead of
    /// refusing them (`model::origin`). Without it they stay A's.
    #[tokio::test]
    async fn import_with_source_carries_positions_over_to_another_stream() {
        use flotilla_actors::backend::memory::MemoryDynamo;
        use flotilla_actors::model::origin::{RowOrigin, StreamOrigin};
        use flotilla_actors::model::{ExtendedSequenceNumber, SequenceNumber, ShardId};

        let table = MemoryDynamo::new().lease_table("app");
        table.ensure_table().await.unwrap();
        let mut lease = Lease::new(
            &ShardId::from_index(0),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        lease.source = Some("orders".into());
        lease.source_created = Some(1_700_000_000);
        table.create_if_absent(&lease).await.unwrap();
        let at = Checkpoint::At(ExtendedSequenceNumber::new(
            SequenceNumber::parse("49590338271490256608559692538361571095921575989136588898")
                .unwrap(),
            0,
        ));
        let (text, sub) = at.encode();
        let token = serde_json::json!({
            "version": TOKEN_VERSION,
            "application": "app",
            "source": "orders",
            "shards": {lease.key.as_str(): {"checkpoint": text, "sub_sequence": sub}},
        });
        let dir = std::env::temp_dir().join(format!("flotilla-import-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token.json");
        std::fs::write(&path, token.to_string()).unwrap();
        let payments = StreamOrigin {
            name: "payments".into(),
            created: Some(1_800_000_000),
        };
        let row = || async { table.get(&lease.key).await.unwrap().unwrap() };
        import(&table, &path, true, Duration::from_secs(10), None, None)
            .await
            .unwrap();
        assert!(
            matches!(payments.of(&row().await), RowOrigin::Foreign(_)),
            "without --source the rows stay orders'"
        );
        import(
            &table,
            &path,
            true,
            Duration::from_secs(10),
            None,
            Some("payments"),
        )
        .await
        .unwrap();
        let carried = row().await;
        assert_eq!(carried.checkpoint, at);
        assert_eq!(carried.source.as_deref(), Some("payments"));
        assert_eq!(carried.source_created, None);
        assert_eq!(payments.of(&carried), RowOrigin::Adopt);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn owners_are_watched_as_long_as_they_declare_never_less() {
        use flotilla_actors::model::{Heartbeat, WorkerLoad};
        let s = Duration::from_secs;
        let beat = |id: &str, failover: Option<u64>| Heartbeat {
            worker: WorkerId::new(id),
            counter: 1,
            load: WorkerLoad {
                failover_time_ms: failover,
                ..WorkerLoad::default()
            },
        };
        let owners = |ids: &[&str]| ids.iter().map(|i| WorkerId::new(*i)).collect();
        let beats = [
            beat("a", Some(4_000)),
            beat("b", Some(30_000)),
            beat("old", None),
        ];
        // (given, owners, window)
        let table: [(Duration, &[&str], Duration); 6] = [
            (s(0), &["a"], s(4)),
            (s(1), &["a"], s(4)),
            (s(60), &["a"], s(60)),
            (s(0), &["a", "b"], s(30)),
            // No declaration (an older flotilla): the default.
            (s(0), &["old"], UNDECLARED_FAILOVER),
            // No heartbeat row at all (a Java KCL worker): the default.
            (Duration::from_millis(600), &["java"], UNDECLARED_FAILOVER),
        ];
        for (given, ids, want) in table {
            assert_eq!(
                watch_window(given, &owners(ids), &beats),
                want,
                "{given:?} {ids:?}"
            );
        }
    }

    #[test]
    fn targets_parse_in_either_spelling() {
        for text in ["trim-horizon", "TRIM_HORIZON", "Trim_Horizon"] {
            assert_eq!(parse_target(text), Ok(Target::TrimHorizon));
        }
        assert_eq!(parse_target("LATEST"), Ok(Target::Latest));
        let Ok(Target::AtTimestamp(_, text)) = parse_target("2024-05-01T00:00:00Z") else {
            panic!("not a time");
        };
        assert_eq!(text, "2024-05-01T00:00:00Z");
        let err = parse_target("yesterday").unwrap_err();
        assert!(err.contains("2024-05-01T00:00:00Z"), "{err}");
        let err = parse_target("2999-01-01T00:00:00Z").unwrap_err();
        assert!(err.contains("--to latest"), "{err}");
    }

    #[test]
    fn only_loopback_endpoints_are_local() {
        for url in [
            "http://127.0.0.1:4567",
            "http://localhost:4567",
            "http://[::1]:4567",
            "https://127.0.0.2",
        ] {
            assert!(is_local_endpoint(url), "{url}");
        }
        for url in [
            "https://kinesis.us-east-1.amazonaws.com",
            "http://10.0.0.1:4567",
            "not a url",
        ] {
            assert!(!is_local_endpoint(url), "{url}");
        }
    }

    #[test]
    fn access_denied_and_key_schema_errors_say_what_to_do() {
        let denied = LeaseError::AccessDenied {
            op: "DescribeTable",
            message:
                "table app: service error: AccessDeniedException: User: arn:aws:iam::1:user/x \
                      is not authorized to perform: dynamodb:DescribeTable (HTTP 400)"
                    .into(),
        };
        let text = format!("{:#}", explain(denied, "app"));
        assert!(
            text.contains("dynamodb:DescribeTable, CreateTable"),
            "{text}"
        );
        assert!(text.contains("table/app"), "{text}");
        let schema = LeaseError::WrongKeySchema {
            table: "app".into(),
            found: "id (HASH)".into(),
        };
        let text = format!("{:#}", explain(schema, "app"));
        assert!(
            text.contains("not a lease table") && text.contains("--table"),
            "{text}"
        );
        assert!(text.contains("id (HASH)"), "{text}");
    }
}
