//! The fault simulator (`support::sim`) under `cargo test`: a few short seeds of whole
//! fleets under freezes, partitions that heal, lost and late answers, throttling, 5xx,
//! expired iterators, splits, merges and misbehaving processors, and the check that a
//! seed replays exactly. The long run (hundreds of seeds, and the mutation table) is a
//! release build, which `scripts/test.sh` runs:
//! `cargo run --release -p flotilla-actors --example simulate -- --seeds 300`.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use support::sim::{SimOptions, run_seed};

/// Short runs: a debug build simulates about 25 times slower than a release one.
fn short(seed: u64) -> SimOptions {
    SimOptions {
        steps: 10,
        quiet: Duration::from_secs(120),
        ..SimOptions::new(seed)
    }
}

#[test]
fn fleets_under_faults_keep_every_invariant() {
    for seed in 0..4 {
        let report = run_seed(&short(seed)).unwrap_or_else(|failure| panic!("{failure}"));
        println!(
            "seed {seed}: {:.2} fleet-hours, {} records, {} process() calls, faults {:?}",
            report.fleet_hours(),
            report.produced,
            report.process_calls,
            report.faults
        );
        assert!(report.process_calls > 0 && report.checks > 0, "{report:?}");
    }
}

#[test]
fn a_seed_replays_exactly() {
    let options = short(7);
    let first = run_seed(&options).unwrap_or_else(|f| panic!("{f}"));
    let second = run_seed(&options).unwrap_or_else(|f| panic!("{f}"));
    assert!(first.trace_lines > 100, "{first:?}");
    assert_eq!(
        (first.trace_hash, first.trace_lines),
        (second.trace_hash, second.trace_lines),
        "seed 7 ran twice with different traces"
    );
}
