//! `flotilla rewind`: every unfinished lease's checkpoint set to one place.
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

use std::time::{Duration, SystemTime};

use anyhow::bail;
use flotilla_actors::backend::LeaseTable;
use flotilla_actors::model::Checkpoint;

use super::liveness::{WRITE_ADVICE, forced, refuse_while_alive};
use super::scan;
use super::writes::Writes;

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

#[cfg(test)]
mod tests {
    use super::*;

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
}
