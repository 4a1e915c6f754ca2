//! `flotilla demo` as a user runs it: the built binary, its exit status and its summary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::process::{Command, Output};

/// The fields every summary line starts with, in this order; more may follow.
const LEADING: [&str; 8] = [
    "produced",
    "processed",
    "lost",
    "duplicates",
    "order_violations",
    "workers",
    "crashes",
    "lease_moves",
];

/// `demo: produced=N processed=N lost=0 duplicates=D order_violations=0 workers=W ...` as
/// numbers by name, in order.
fn summary_fields(line: &str) -> Vec<(String, u64)> {
    let rest = line
        .strip_prefix("demo: ")
        .unwrap_or_else(|| panic!("not a summary line: {line:?}"));
    rest.split(' ')
        .map(|field| {
            let (name, value) = field
                .split_once('=')
                .unwrap_or_else(|| panic!("not name=value: {field:?} in {line:?}"));
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("not a count: {field:?} in {line:?}"));
            (name.to_owned(), value)
        })
        .collect()
}

fn demo(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .arg("demo")
        // Tests run side by side: every worker on a free port.
        .args(["--status-bind", "127.0.0.1:0"])
        .args(args)
        .env_remove("FLOTILLA_LOG")
        .output()
        .unwrap()
}

/// Runs the demo, asserts it passed and every record arrived in order, and returns the
/// summary's counts and stderr.
fn passing_run(args: &[&str]) -> (HashMap<String, u64>, String) {
    let (counts, dead_letters, stderr) = passing_run_to(args);
    assert_eq!(dead_letters, None, "{counts:?}");
    (counts, stderr)
}

/// As [`passing_run`], also returning where the summary says the discarded records went
/// (`file:PATH` after `discarded=N to`, the end of the line with `--poison`).
fn passing_run_to(args: &[&str]) -> (HashMap<String, u64>, Option<String>, String) {
    let out = demo(args);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);

    let last = stdout.lines().last().unwrap_or_default();
    let (counted, dead_letters) = match last.split_once(" to ") {
        Some((counted, to)) => (counted, Some(to.to_owned())),
        None => (last, None),
    };
    let fields = summary_fields(counted);
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert!(names.starts_with(&LEADING), "{last}");
    let counts: HashMap<String, u64> = fields.into_iter().collect();
    assert!(counts["produced"] > 0, "{last}");
    assert_eq!(counts["processed"], counts["produced"], "{last}");
    assert_eq!(counts["lost"], 0, "{last}");
    assert_eq!(counts["order_violations"], 0, "{last}");

    // The run did reshard, and said what it was doing once a second.
    assert!(stderr.contains("demo: split shardId-"), "{stderr}");
    if !args.contains(&"dynamodb-streams") {
        assert!(stderr.contains("demo: merged shardId-"), "{stderr}");
    }
    assert!(stderr.contains("records/s="), "{stderr}");
    (counts, dead_letters, stderr)
}

#[test]
fn a_fleet_survives_a_crash_across_a_split_and_a_merge() {
    let (counts, stderr) = passing_run(&["--duration", "10", "--workers", "3"]);
    assert_eq!((counts["workers"], counts["crashes"]), (3, 1), "{counts:?}");
    assert!(stderr.contains("demo: crashed demo-"), "{stderr}");
    // demo-1 serves the fleet page URL printed at the start: never the victim.
    assert!(!stderr.contains("demo: crashed demo-1 "), "{stderr}");
    assert!(stderr.contains("=(crashed)"), "{stderr}");
    for id in ["demo-1=", "demo-2=", "demo-3="] {
        assert!(
            stderr.contains(id),
            "{id} missing from the progress: {stderr}"
        );
    }
    // Every worker serves its status endpoint and says where.
    assert!(stderr.contains("fleet page: http://127.0.0.1:"), "{stderr}");
    for id in ["demo-1", "demo-2", "demo-3"] {
        assert!(
            stderr.contains(&format!("status: {id} http://127.0.0.1:")),
            "{id}'s status URL missing: {stderr}"
        );
    }
}

#[test]
fn a_lone_worker_delivers_every_record_exactly_once() {
    let (counts, stderr) = passing_run(&["--duration", "10", "--workers", "1"]);
    assert_eq!(
        (counts["workers"], counts["crashes"], counts["duplicates"]),
        (1, 0, 0),
        "{counts:?}"
    );
    assert!(!stderr.contains("demo: crashed"), "{stderr}");
}

/// The same run with every worker reading by enhanced fan-out: the split, the merge and
/// the crash pass just the same.
#[test]
fn a_fanout_fleet_loses_and_reorders_nothing_across_a_crash_and_reshards() {
    let (counts, stderr) = passing_run(&["--duration", "8", "--read-mode", "fanout"]);
    assert_eq!((counts["workers"], counts["crashes"]), (3, 1), "{counts:?}");
    assert!(stderr.contains("demo: split shardId-"), "{stderr}");
    assert!(stderr.contains("demo: merged shardId-"), "{stderr}");
}

/// The fleet over an in-memory table's change stream: every shard rotates, one splits,
/// a worker crashes, and still no change of an item is lost or out of order.
#[test]
fn a_table_stream_fleet_loses_and_reorders_nothing_across_rotations_a_split_and_a_crash() {
    let (counts, stderr) = passing_run(&["--duration", "8", "--source", "dynamodb-streams"]);
    assert_eq!((counts["workers"], counts["crashes"]), (3, 1), "{counts:?}");
    assert!(
        stderr.contains("of dynamodb:flotilla-demo-orders"),
        "{stderr}"
    );
    assert!(stderr.contains("demo: rotated every shard"), "{stderr}");
    assert!(stderr.contains("demo: split shardId-"), "{stderr}");
}

/// `--poison N`: N records the demo's processor refuses, on both sources. Each is retried,
/// then written to the dead-letter file the demo names and skipped; every other record
/// is still delivered, in order.
#[test]
fn poison_records_go_to_the_dead_letter_file_and_the_rest_are_delivered() {
    for (args, poison) in [
        (&["--duration", "6", "--poison", "4"][..], 4),
        (
            &[
                "--duration",
                "6",
                "--poison",
                "2",
                "--source",
                "dynamodb-streams",
            ],
            2,
        ),
    ] {
        let (counts, dead_letters, stderr) = passing_run_to(args);
        assert_eq!(counts["discarded"], poison, "{args:?}: {counts:?}");
        let destination = dead_letters.unwrap_or_else(|| panic!("{args:?}: {counts:?}"));
        assert!(
            stderr.contains(&format!("demo: refused records go to {destination}\n")),
            "{stderr}"
        );
        let path = destination.strip_prefix("file:").unwrap();
        let text = std::fs::read_to_string(path).unwrap();
        let mut keys: Vec<String> = text
            .lines()
            .map(|line| {
                let envelope: serde_json::Value = serde_json::from_str(line).unwrap();
                assert_eq!(envelope["reason"], "retries", "{line}");
                // Three at least: handed over behind another poison record counts too.
                assert!(envelope["attempts"].as_u64().unwrap() >= 3, "{line}");
                let key = envelope["partition_key"].as_str().unwrap();
                // A table's stream: the item's key as JSON.
                serde_json::from_str::<serde_json::Value>(key).map_or_else(
                    |_| key.to_owned(),
                    |k| k["pk"]["S"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        keys.sort();
        keys.dedup();
        let expected: Vec<String> = (0..poison).map(|i| format!("poison-{i}")).collect();
        assert_eq!(keys, expected, "{args:?}: {text}");
        std::fs::remove_file(path).unwrap();
    }
}

#[test]
fn bad_demo_flags_are_refused() {
    for (args, named) in [
        (&["--shards", "0"][..], "--shards"),
        (&["--workers", "0"], "--workers"),
        (&["--workers", "2", "--crashes", "2"], "--crashes"),
        (&["--read-mode", "push"], "--read-mode"),
        (&["--source", "kafka"], "--source"),
        (&["--poison", "1001"], "--poison"),
        (
            &["--source", "dynamodb-streams", "--read-mode", "fanout"],
            "--read-mode fanout reads Kinesis streams only",
        ),
    ] {
        let out = demo(args);
        assert!(!out.status.success(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(named), "{args:?}: {stderr}");
    }
}

/// `FLOTILLA_LOG_FORMAT=json`: the log lines on stderr are JSON objects, each in the
/// command's span, a worker's lines in its worker's span under it, and a shard's reader
/// (the parent split at a third of the run reads to its end) in the shard's.
#[test]
fn json_logs_carry_the_command_worker_and_shard_spans() {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["demo", "--status-bind", "127.0.0.1:0"])
        .args(["--duration", "3", "--workers", "1", "--shards", "2"])
        .env("FLOTILLA_LOG", "info")
        .env("FLOTILLA_LOG_FORMAT", "json")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{}\n{stderr}", out.status);
    // The demo's own progress lines are printed, not logged.
    let logs: Vec<serde_json::Value> = stderr
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(!logs.is_empty(), "{stderr}");
    let span = |line: &serde_json::Value, name: &str| -> Option<serde_json::Value> {
        line["spans"]
            .as_array()?
            .iter()
            .find(|s| s["name"] == name)
            .cloned()
    };
    for line in &logs {
        assert!(line["message"].is_string(), "{line}");
        let command = span(line, "command").unwrap_or_else(|| panic!("{line}"));
        assert_eq!(command["command"], "demo", "{line}");
    }
    let read_to_end = logs
        .iter()
        .find(|l| l["message"] == "Shard read to its end.")
        .unwrap_or_else(|| panic!("no reader line:\n{stderr}"));
    let shard = span(read_to_end, "shard").unwrap();
    assert!(shard["shard_id"].as_str().unwrap().starts_with("shardId-"));
    assert!(shard["lease_counter"].is_u64(), "{read_to_end}");
    let worker = span(read_to_end, "worker").unwrap();
    assert_eq!(shard["worker_id"], worker["worker_id"], "{read_to_end}");
}
