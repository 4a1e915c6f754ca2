//! The fault simulator (`support::sim`) under `cargo test`: a few short seeds of whole
//! fleets under freezes, partitions that heal, lost and late answers, throttling, 5xx,
//! expired iterators, splits, merges and misbehaving processors (and, in half the
//! seeds, poison records and a failure destination that goes down), and the check that
//! a seed replays exactly. The long run (hundreds of seeds, and the mutation table) is a
//! release build, which `scripts/test.sh` runs:
//! `cargo run --release -p flotilla-actors --example simulate -- --seeds 300`, and
//! beside Java KCL workers with `--java`.

#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use support::sim::{JavaMode, SimOptions, draw_lanes, run_seed};

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

/// Seeds with the failure policy (`[failure]`): poison records among the others, which
/// the processors refuse, and a destination the schedule takes down. Seed 11 names the
/// poison record (a partial batch failure, no bisection); seed 19 never names it and
/// bisects. Every poison record ends in the destination, never processed, and every
/// other record is processed or discarded, in its key's order (checked as it happens).
#[test]
fn poison_records_go_to_the_destination_and_the_rest_are_delivered() {
    for seed in [11, 19] {
        let report = run_seed(&short(seed)).unwrap_or_else(|failure| panic!("{failure}"));
        println!(
            "seed {seed} ({}): {} poison put, {} records discarded, {} envelopes, {} writes \
             refused, faults {:?}",
            report.policy,
            report.poison_put,
            report.discarded,
            report.envelopes,
            report.destination_refused,
            report.faults
        );
        assert!(!report.policy.is_empty(), "seed {seed} has no policy");
        assert!(report.poison_put > 0, "{report:?}");
        assert_eq!(report.poison_discarded, report.poison_put, "{report:?}");
    }
}

/// Seeds with lanes within each shard (`processor.parallelism` 2 to 8, issue 33):
/// batches of one shard are in flight at once, and the oracles hold as they happen:
/// each key in order, and no worker inside `process()` for a shard, in any lane, while
/// another worker that is not fenced is.
#[test]
fn lanes_within_shards_keep_every_invariant() {
    let seeds: Vec<u64> = (0..64).filter(|&s| draw_lanes(s) > 1).take(2).collect();
    assert_eq!(seeds.len(), 2);
    for seed in seeds {
        let report = run_seed(&short(seed)).unwrap_or_else(|failure| panic!("{failure}"));
        println!(
            "seed {seed} with {} lanes: {:.2} fleet-hours, {} process() calls, faults {:?}",
            report.lanes,
            report.fleet_hours(),
            report.process_calls,
            report.faults
        );
        assert!(report.lanes > 1, "{report:?}");
        assert!(report.process_calls > 0 && report.checks > 0, "{report:?}");
    }
}

/// Beside Java KCL 2.x workers (`support::sim::java_worker`), flotilla with
/// `lease.java_compat`: the same faults, and the oracles between the two kinds.
#[test]
fn fleets_beside_java_workers_keep_every_invariant() {
    for seed in 0..2 {
        let options = SimOptions {
            java: Some(JavaMode::Compat),
            ..short(seed)
        };
        let report = run_seed(&options).unwrap_or_else(|failure| panic!("{failure}"));
        println!(
            "seed {seed} beside Java workers: {:.2} fleet-hours, {} process() calls, {:?}",
            report.fleet_hours(),
            report.process_calls,
            report.java
        );
        assert!(report.process_calls > 0 && report.checks > 0, "{report:?}");
        assert!(
            report
                .java
                .get("java_takes_unowned")
                .is_some_and(|n| *n > 0),
            "the Java workers took nothing: {report:?}"
        );
    }
}

/// The same fleet with the mode left off: flotilla takes leases the Java workers still
/// renew, and the oracles say so.
#[test]
fn beside_java_workers_without_the_mode_flotilla_takes_live_java_leases() {
    let options = SimOptions {
        java: Some(JavaMode::WithoutCompat),
        ..short(0)
    };
    let failure = run_seed(&options).expect_err("the misconfiguration went unnoticed");
    assert!(failure.what.contains("whose counter moved"), "{failure}");
}
