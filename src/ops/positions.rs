//! `flotilla position export` and `position import`: every lease's checkpoint as a JSON
//! token, and back onto the rows it names, checked shard by shard.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context as _, anyhow, bail};
use flotilla_actors::backend::LeaseTable;
use flotilla_actors::model::{Checkpoint, Lease, LeaseKey, SourceKind};
use serde::{Deserialize, Serialize};

use super::liveness::{WRITE_ADVICE, forced, refuse_while_alive};
use super::scan;
use super::writes::Writes;

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
}
