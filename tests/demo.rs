//! `flotilla demo` as a user runs it: the built binary, its exit status and its summary.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::process::Command;

/// `demo: produced=N processed=N lost=0 duplicates=D order_violations=0` as numbers by
/// name, in order.
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

#[test]
fn the_demo_processes_every_record_in_order_across_a_split_and_a_merge() {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["demo", "--duration", "10"])
        .env_remove("FLOTILLA_LOG")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{}\n{stdout}\n{stderr}", out.status);

    let last = stdout.lines().last().unwrap_or_default();
    let fields = summary_fields(last);
    let names: Vec<&str> = fields.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "produced",
            "processed",
            "lost",
            "duplicates",
            "order_violations"
        ],
        "{last}"
    );
    let counts: HashMap<String, u64> = fields.into_iter().collect();
    assert!(counts["produced"] > 0, "{last}");
    assert_eq!(counts["processed"], counts["produced"], "{last}");
    assert_eq!(counts["lost"], 0, "{last}");
    assert_eq!(counts["order_violations"], 0, "{last}");

    // The run did reshard, and said what it was doing once a second.
    assert!(stderr.contains("demo: split shardId-"), "{stderr}");
    assert!(stderr.contains("demo: merged shardId-"), "{stderr}");
    assert!(stderr.contains("records/s="), "{stderr}");
}

#[test]
fn bad_demo_flags_are_refused() {
    let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["demo", "--shards", "0"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--shards"), "{stderr}");
}
