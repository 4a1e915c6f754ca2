//! `flotilla leases`: every lease of the table as a JSON line on stdout; the heartbeats,
//! the rows skipped and the rows of other programs or older versions said on stderr.

use std::io::Write as _;

use anyhow::Context as _;
use flotilla_actors::model::{Checkpoint, Lease, WorkerId};

use crate::cli::TableArgs;
use crate::ops;

/// `flotilla leases`.
pub(super) async fn leases(args: TableArgs) -> anyhow::Result<()> {
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
