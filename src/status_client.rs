//! `flotilla status`: reads a worker's status endpoint (`GET /status`, `GET /fleet`) and
//! renders it as tables, and the worker's supervision tree (`GET /status/tree`) as the
//! library's `status_tree` prints it.
//!
//! The JSON is read as a `serde_json::Value`, field by field, so a field added to the
//! endpoint's output does not break an older CLI, and a missing one shows as `-`.

use std::fmt::Write as _;
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Where a worker serves its status by default (`status.bind` in config/default.toml).
pub const DEFAULT_URL: &str = "http://127.0.0.1:9797";

/// `GET {base}{path}`, parsed as JSON. Errors name the URL and say what to try.
pub async fn fetch(base: &str, path: &str, timeout: Duration) -> anyhow::Result<Value> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let uri: hyper::Uri = url
        .parse()
        .with_context(|| format!("--url {base:?} is not a URL; write e.g. {DEFAULT_URL}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => bail!(
            "--url {base}: only http:// is supported (the status endpoint serves plain HTTP), not {other}://"
        ),
        None => bail!("--url {base}: give the scheme too, e.g. http://{base}"),
    }
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let response = match tokio::time::timeout(timeout, client.get(uri)).await {
        Err(_) => bail!(
            "no answer from {url} within {}; is that a flotilla worker's status endpoint?",
            humantime::format_duration(timeout)
        ),
        Ok(Err(error)) if error.is_connect() => {
            return Err(anyhow!(error).context(format!(
                "cannot connect to {url}: is a worker running there? Pass --url with the \
                 address the worker serves its status on: its status.bind setting \
                 (FLOTILLA__STATUS__BIND) may differ from {DEFAULT_URL}, and status.enabled \
                 may be false"
            )));
        }
        Ok(Err(error)) => return Err(anyhow!(error).context(format!("GET {url} failed"))),
        Ok(Ok(response)) => response,
    };
    let status = response.status();
    let body = tokio::time::timeout(timeout, response.into_body().collect())
        .await
        .map_err(|_| anyhow!("GET {url}: the body did not arrive within {timeout:?}"))?
        .with_context(|| format!("GET {url}: cannot read the body"))?
        .to_bytes();
    if !status.is_success() {
        let text = String::from_utf8_lossy(&body);
        let shown: String = text.chars().take(200).collect();
        bail!("GET {url}: HTTP {status}: {shown}");
    }
    serde_json::from_slice(&body).with_context(|| {
        format!("GET {url}: the answer is not JSON; is that a flotilla worker's status endpoint?")
    })
}

/// The worker's own status (`GET /status`): a header line, then one row per shard.
pub fn render_status(status: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "worker {}  application {}  stream {}  source {}  reading {}  state {}  up {}  shards {}  \
         shard restarts {}",
        text(&status["worker_id"]),
        text(&status["application"]),
        text(&status["stream"]),
        text(&status["source"]),
        text(&status["read_mode"]),
        text(&status["state"]),
        millis_as_duration(&status["uptime_ms"]),
        status["shards"].as_array().map_or(0, Vec::len),
        text(&status["shard_restarts"]),
    );
    // A heartbeat that is not being confirmed stops every shard: say so first.
    let failures = status["leases"]["heartbeat_failures"].as_u64().unwrap_or(0);
    if failures > 0 {
        let _ = writeln!(
            out,
            "heartbeat: {failures} failed in a row, last confirmed {} ago: {}",
            millis_as_duration(&status["leases"]["heartbeat_age_ms"]),
            text(&status["leases"]["heartbeat_error"]),
        );
    }
    out.push_str(&stream_set_lines(&status["stream_watcher"]));
    let mut shards: Vec<&Value> = status["shards"]
        .as_array()
        .map(|s| s.iter().collect())
        .unwrap_or_default();
    shards.sort_by(|a, b| {
        (text(&a["stream"]), text(&a["shard_id"])).cmp(&(text(&b["stream"]), text(&b["shard_id"])))
    });
    if shards.is_empty() {
        out.push_str("(no shards held)\n");
        return out;
    }
    // A worker of several streams names each shard's stream (a shard id alone repeats).
    let many = shards.iter().any(|s| !s["stream"].is_null());
    let rows = shards
        .iter()
        .map(|shard| {
            let mut row = Vec::with_capacity(10);
            if many {
                row.push(text(&shard["stream"]));
            }
            row.extend([
                text(&shard["shard_id"]),
                text(&shard["state"]),
                checkpoint(&shard["checkpoint"]),
                text(&shard["millis_behind_latest"]),
                text(&shard["records_delivered"]),
                rate(&shard["records_per_second"]),
                text(&shard["in_flight_records"]),
                text(&shard["restarts"]),
                with_lanes(
                    with_failures(
                        match (fence_text(&shard["fenced"]), shard["stall"].as_str()) {
                            (Some(why), _) => format!("fenced: {why}"),
                            (None, Some(why)) => format!("stalled: {why}"),
                            (None, None) => {
                                subscription_note(&shard["subscription"], &shard["last_error"])
                            }
                        },
                        shard,
                    ),
                    shard,
                ),
            ]);
            row
        })
        .collect();
    let header = [
        "STREAM",
        "SHARD",
        "STATE",
        "CHECKPOINT",
        "LAG MS",
        "RECORDS",
        "REC/S",
        "IN FLIGHT",
        "RESTARTS",
        "NOTE",
    ];
    out.push_str(&table(&header[usize::from(!many)..], rows));
    out
}

/// A shard's note, with what `[failure]` did on it when it did anything: the records
/// discarded to the destination and the processor's last failure.
fn with_failures(note: String, shard: &Value) -> String {
    let discarded = shard["records_discarded"].as_u64().unwrap_or(0);
    let last = shard["last_failure"].as_str();
    if discarded == 0 && last.is_none() {
        return note;
    }
    let mut failures = format!("discarded {discarded}");
    if let Some(last) = last {
        failures.push_str(&format!(", last failure: {last}"));
    }
    if note.is_empty() {
        failures
    } else {
        format!("{note}; {failures}")
    }
}

/// A shard's note, with its slowest lane (`processor.parallelism`) when one has records
/// pending: the lane that holds the checkpoint back, its pending records and how long
/// the oldest has waited.
fn with_lanes(note: String, shard: &Value) -> String {
    let Some(lanes) = shard["lanes"].as_array() else {
        return note;
    };
    let slowest = lanes
        .iter()
        .filter(|lane| lane["pending_records"].as_u64().unwrap_or(0) > 0)
        .max_by_key(|lane| lane["oldest_pending_ms"].as_u64().unwrap_or(0));
    let Some(lane) = slowest else {
        return note;
    };
    let lanes_note = format!(
        "{} lanes, slowest {}: {} pending, oldest {}",
        lanes.len(),
        text(&lane["lane"]),
        text(&lane["pending_records"]),
        millis_as_duration(&lane["oldest_pending_ms"]),
    );
    if note.is_empty() {
        lanes_note
    } else {
        format!("{note}; {lanes_note}")
    }
}

/// The worker's supervision tree (`GET /status/tree`) as text: the nodes its
/// `/status.html` page draws, in the same order (`status_tree` defines both).
pub fn render_tree(tree: Value) -> anyhow::Result<String> {
    let root: flotilla_actors::status_tree::TreeNode = serde_json::from_value(tree)
        .context("GET /status/tree: the answer is not a supervision tree")?;
    Ok(flotilla_actors::status_tree::render_text(&root))
}

/// A multi-stream worker's set: each stream's state (a former one with how long since
/// it left and until its rows are deleted, an unresolved one with why), and the
/// stream-set source's failure while the last good set is kept. Nothing for one stream.
fn stream_set_lines(watcher: &Value) -> String {
    let mut out = String::new();
    let streams: Vec<&Value> = watcher["streams"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    if !streams.is_empty() {
        let each: Vec<String> = streams
            .iter()
            .map(|s| match s["state"].as_str() {
                Some("former") => format!(
                    "{} former for {} (rows deleted in {}{})",
                    text(&s["stream"]),
                    millis_as_duration(&s["former_for_ms"]),
                    millis_as_duration(&s["deletion_in_ms"]),
                    match &s["error"] {
                        Value::Null => String::new(),
                        error => format!("; {}", text(error)),
                    }
                ),
                Some("unresolved") => {
                    format!("{} unresolved: {}", text(&s["stream"]), text(&s["error"]))
                }
                _ => format!("{} {}", text(&s["stream"]), text(&s["state"])),
            })
            .collect();
        let _ = writeln!(out, "streams: {}", each.join(", "));
    }
    if !watcher["stream_set_error"].is_null() {
        let _ = writeln!(
            out,
            "stream set: last good set kept ({} failed answers): {}",
            text(&watcher["stream_set_errors"]),
            text(&watcher["stream_set_error"]),
        );
    }
    out
}

/// A fan-out shard's note: its subscription (how old, or why there is none), then the
/// last error; a polling shard's: the last error.
fn subscription_note(subscription: &Value, last_error: &Value) -> String {
    let error = text(last_error);
    match subscription["state"].as_str() {
        Some("open") => {
            let open = format!(
                "subscribed {} ago",
                millis_as_duration(&subscription["age_ms"])
            );
            if error == "-" {
                open
            } else {
                format!("{open}; last error: {error}")
            }
        }
        Some(_) => format!("not subscribed; last error: {error}"),
        None => error,
    }
}

/// In a fan-out fleet, a lease being read says whether its owner's subscription is
/// open (from the owner's last heartbeat).
fn fleet_subscription_note(lease: &Value, fanout: bool) -> String {
    let read = matches!(lease["state"].as_str(), Some("held" | "handing_off"));
    match &lease["subscribed_ms"] {
        _ if !fanout || !read => String::new(),
        Value::Null => "not subscribed".to_owned(),
        age => format!("subscribed {}", millis_as_duration(age)),
    }
}

/// How many workers the stream needs, as the worker's last lease-keeper round judged it
/// (`/fleet`'s `scaling`): the figure, the workers now, and why; without one, why not
/// (`scaling_unknown`; an older worker says nothing).
fn scaling_line(scaling: &Value, unknown: &Value) -> String {
    if !scaling.is_object() {
        let why = match unknown {
            Value::Null => "not reported".to_owned(),
            why => text(why),
        };
        return format!("recommended workers: - ({why})\n");
    }
    format!(
        "recommended workers: {} (now {}): {}\n",
        text(&scaling["recommended_workers"]),
        text(&scaling["inputs"]["workers"]),
        text(&scaling["why"]),
    )
}

/// The fleet as the worker sees it (`GET /fleet`): its workers, then its leases.
pub fn render_fleet(fleet: &Value) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "application {}  stream {}  source {}  reading {}  seen by {} {} ago",
        text(&fleet["application"]),
        text(&fleet["stream"]),
        text(&fleet["source"]),
        text(&fleet["read_mode"]),
        text(&fleet["observer"]),
        millis_as_duration(&fleet["scanned_ms_ago"]),
    );
    out.push_str(&scaling_line(&fleet["scaling"], &fleet["scaling_unknown"]));
    let workers: Vec<Vec<String>> = items(&fleet["workers"], "worker_id")
        .iter()
        .map(|worker| {
            vec![
                text(&worker["worker_id"]),
                match worker["alive"].as_bool() {
                    Some(true) => "alive".to_owned(),
                    Some(false) => "dead".to_owned(),
                    None => "-".to_owned(),
                },
                yes_no(&worker["draining"]),
                text(&worker["leases"]),
                text(&worker["records_per_second"]),
                text(&worker["bytes_per_second"]),
                millis_as_duration(&worker["silent_ms"]),
                // A dead worker's load is unknown (REC/S and BYTES/S `-`), and why.
                match (
                    worker["load_unknown"].as_str(),
                    worker["has_heartbeat"].as_bool(),
                ) {
                    (Some(why), _) => format!("load unknown: {why}"),
                    (None, Some(false)) => "no heartbeat row".to_owned(),
                    _ => String::new(),
                },
            ]
        })
        .collect();
    out.push('\n');
    if workers.is_empty() {
        out.push_str("(no workers)\n");
    } else {
        out.push_str(&table(
            &[
                "WORKER", "ALIVE", "DRAINING", "LEASES", "REC/S", "BYTES/S", "SILENT", "NOTE",
            ],
            workers,
        ));
    }
    let fanout = fleet["read_mode"].as_str() == Some("fanout");
    let listed = items(&fleet["leases"], "lease_key");
    // Several streams: a STREAM column and the shard id, rather than the long
    // multi-stream key.
    let many = listed.iter().any(|l| !l["stream"].is_null());
    let leases: Vec<Vec<String>> = listed
        .iter()
        .map(|lease| {
            let mut state = text(&lease["state"]);
            if let Some(to) = lease["handoff_to"].as_str() {
                state.push_str(&format!(" -> {to}"));
            }
            let mut row = Vec::with_capacity(7);
            if many {
                row.extend([text(&lease["stream"]), text(&lease["shard_id"])]);
            } else {
                row.push(text(&lease["lease_key"]));
            }
            row.extend([
                text(&lease["owner"]),
                state,
                checkpoint(&lease["checkpoint"]),
                text(&lease["millis_behind_latest"]),
                // On the observer's own leases, what `[failure]` did on them
                // (`with_failures` reads the same two fields a shard has).
                with_failures(
                    match &lease["reason"] {
                        Value::Null => fleet_subscription_note(lease, fanout),
                        reason => text(reason),
                    },
                    lease,
                ),
            ]);
            row
        })
        .collect();
    out.push('\n');
    if leases.is_empty() {
        out.push_str("(no leases)\n");
    } else {
        let header = [
            "STREAM",
            "SHARD",
            "OWNER",
            "STATE",
            "CHECKPOINT",
            "LAG MS",
            "REASON",
        ];
        out.push_str(&table(&header[usize::from(!many)..], leases));
    }
    for (name, what) in [
        ("unassigned", "unassigned (no live owner)"),
        ("blocked", "blocked on a parent"),
        ("stalled", "stalled"),
        ("malformed_rows", "malformed rows"),
    ] {
        let list: Vec<String> = fleet[name]
            .as_array()
            .map(|l| l.iter().map(text).collect())
            .unwrap_or_default();
        if !list.is_empty() {
            let _ = writeln!(out, "{what}: {}", list.join(", "));
        }
    }
    out
}

/// Why a shard is fenced, from its `fenced` object (`FenceReason`): `None` when not.
fn fence_text(fenced: &Value) -> Option<String> {
    let reason = fenced["reason"].as_str()?;
    Some(match reason {
        "heartbeat_unconfirmed" => format!(
            "heartbeat not confirmed for {} (last error: {})",
            millis_as_duration(&fenced["silent_ms"]),
            text(&fenced["error"]),
        ),
        "awaiting_reconfirmation" => format!(
            "heartbeats resumed after a {} gap; re-reading the lease",
            millis_as_duration(&fenced["gap_ms"]),
        ),
        "revoked" => format!("lease revoked: {}", text(&fenced["why"])),
        other => other.replace('_', " "),
    })
}

/// The array at `value`, sorted by the text of `key`.
fn items<'a>(value: &'a Value, key: &str) -> Vec<&'a Value> {
    let mut items: Vec<&Value> = value
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    items.sort_by_key(|item| text(&item[key]));
    items
}

/// A cell: strings bare, null or missing as `-`, anything else as JSON. Control
/// characters (an error message's newline) become spaces, so a row stays one line.
fn text(value: &Value) -> String {
    let raw = match value {
        Value::Null => return "-".to_owned(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    raw.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

fn yes_no(value: &Value) -> String {
    match value.as_bool() {
        Some(true) => "yes".to_owned(),
        Some(false) => "no".to_owned(),
        None => "-".to_owned(),
    }
}

fn rate(value: &Value) -> String {
    value
        .as_f64()
        .map_or_else(|| text(value), flotilla_actors::status_tree::rate)
}

fn millis_as_duration(value: &Value) -> String {
    value
        .as_u64()
        .map_or_else(|| text(value), flotilla_actors::status_tree::duration)
}

/// A checkpoint cell: sentinels as they are, a 56-digit sequence number shortened to
/// its ends (`--json` shows it whole).
fn checkpoint(value: &Value) -> String {
    let full = text(value);
    let chars: Vec<char> = full.chars().collect();
    if chars.len() <= 24 {
        return full;
    }
    let head: String = chars[..8].iter().collect();
    let tail: String = chars[chars.len() - 12..].iter().collect();
    format!("{head}…{tail}")
}

/// Columns padded to their widest cell (by display width: a wide character takes two),
/// two spaces apart, without borders; lines end at their last character.
fn table(header: &[&str], rows: Vec<Vec<String>>) -> String {
    use comfy_table::{CellAlignment, ContentArrangement, Table, presets};
    let mut table = Table::new();
    table
        .load_style(presets::NOTHING)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    for row in rows {
        table.add_row(row);
    }
    let columns = table.column_count();
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_cell_alignment(CellAlignment::Left);
        column.set_padding((0, if i + 1 < columns { 2 } else { 0 }));
    }
    let mut out = String::new();
    for line in table.lines() {
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lane holding the checkpoint back is named in the shard's note; lanes with
    /// nothing pending, or one lane, add nothing.
    #[test]
    fn the_slowest_lane_is_named_in_the_note() {
        let shard = serde_json::json!({"lanes": [
            {"lane": 0, "pending_records": 0, "oldest_pending_ms": null},
            {"lane": 1, "pending_records": 40, "oldest_pending_ms": 900},
            {"lane": 2, "pending_records": 3, "oldest_pending_ms": 12000},
        ]});
        assert_eq!(
            with_lanes("stalled: x".into(), &shard),
            format!(
                "stalled: x; 3 lanes, slowest 2: 3 pending, oldest {}",
                flotilla_actors::status_tree::duration(12_000)
            )
        );
        let idle = serde_json::json!({"lanes": [
            {"lane": 0, "pending_records": 0, "oldest_pending_ms": null},
        ]});
        assert_eq!(with_lanes(String::new(), &idle), "");
        assert_eq!(with_lanes("n".into(), &serde_json::json!({})), "n");
    }

    #[test]
    fn a_table_pads_columns_to_the_widest_cell() {
        let got = table(
            &["A", "BB"],
            vec![
                vec!["long".into(), "x".into()],
                vec!["s".into(), "y".into()],
            ],
        );
        assert_eq!(got, "A     BB\nlong  x\ns     y\n");
        // A wide character takes two columns, so the next column still lines up.
        let got = table(
            &["NAME", "N"],
            vec![
                vec!["注文".into(), "1".into()],
                vec!["ab".into(), "2".into()],
            ],
        );
        assert_eq!(got, "NAME  N\n注文  1\nab    2\n");
    }

    #[test]
    fn long_sequence_numbers_are_shortened_and_sentinels_kept() {
        let seq = Value::from("49680458031169431967754064162084943116060673600470908946");
        assert_eq!(checkpoint(&seq), "49680458…600470908946");
        assert_eq!(checkpoint(&Value::from("TRIM_HORIZON")), "TRIM_HORIZON");
        assert_eq!(checkpoint(&Value::Null), "-");
    }

    /// A multi-stream worker's set: each stream's state, and the source's failure.
    #[test]
    fn the_stream_set_is_shown_with_each_streams_state() {
        let watcher = serde_json::json!({
            "streams": [
                {"stream": "orders", "state": "active"},
                {"stream": "audit", "state": "former", "former_for_ms": 60000, "deletion_in_ms": 3540000, "error": null},
                {"stream": "later", "state": "unresolved", "error": "not found"},
            ],
            "stream_set_error": "config service down",
            "stream_set_errors": 3,
        });
        let text = stream_set_lines(&watcher);
        assert!(text.contains("streams: orders active, audit former for 1m (rows deleted in 59m), later unresolved: not found"), "{text}");
        assert!(
            text.contains("last good set kept (3 failed answers): config service down"),
            "{text}"
        );
        assert_eq!(stream_set_lines(&serde_json::json!({"streams": []})), "");
    }

    /// A worker of several streams names each shard's stream; one of a single stream
    /// shows no STREAM column.
    #[test]
    fn several_streams_get_a_stream_column() {
        let status = serde_json::json!({"shards": [
            {"shard_id": "shardId-000000000000", "stream": "orders"},
            {"shard_id": "shardId-000000000000", "stream": "audit"},
        ]});
        let got = render_status(&status);
        let lines: Vec<&str> = got.lines().skip(1).collect();
        assert!(lines[0].starts_with("STREAM  SHARD "), "{got}");
        assert!(
            lines[1].starts_with("audit   shardId-000000000000"),
            "{got}"
        );
        assert!(
            lines[2].starts_with("orders  shardId-000000000000"),
            "{got}"
        );
        let single = render_status(&serde_json::json!({"shards": [{"shard_id": "s-1"}]}));
        assert!(!single.contains("STREAM"), "{single}");

        let fleet = serde_json::json!({"leases": [
            {"lease_key": "1:orders:9:shardId-000000000000", "shard_id": "shardId-000000000000",
             "stream": "orders", "owner": "w-1", "state": "held"},
        ]});
        let got = render_fleet(&fleet);
        let header = got.lines().find(|l| l.contains("OWNER")).unwrap();
        assert!(header.starts_with("STREAM  SHARD "), "{got}");
        assert!(
            got.lines()
                .any(|l| l.starts_with("orders  shardId-000000000000  w-1")),
            "{got}"
        );
    }

    #[test]
    fn missing_fields_show_as_dashes() {
        let got = render_status(&serde_json::json!({"shards": [{"shard_id": "s-1"}]}));
        assert!(got.contains("worker -"), "{got}");
        assert!(
            got.lines()
                .nth(2)
                .is_some_and(|l| l.starts_with("s-1    -")),
            "{got}"
        );
    }

    /// Before the worker's first keeper round there is no recommended worker count, and
    /// the line says why; an older worker's `/fleet` has no such field.
    #[test]
    fn no_recommendation_says_why() {
        let why = "the lease keeper has not judged a round yet";
        let got = render_fleet(&serde_json::json!({"scaling": null, "scaling_unknown": why}));
        assert_eq!(
            got.lines().nth(1),
            Some(format!("recommended workers: - ({why})").as_str()),
            "{got}"
        );
        let got = render_fleet(&serde_json::json!({}));
        assert_eq!(
            got.lines().nth(1),
            Some("recommended workers: - (not reported)"),
            "{got}"
        );
    }
}
