//! The fault simulator from the command line: runs any number of seeds of whole fleets
//! under faults (`tests/support/sim.rs` says what is injected and checked) and prints a
//! summary; a failing seed prints its trace and the command that replays it.
//!
//! ```text
//! cargo run --release -p flotilla-actors --example simulate -- --seeds 1000
//! cargo run --release -p flotilla-actors --example simulate -- --seed 17 --verbose
//! cargo run --release -p flotilla-actors --example simulate --features mutants -- \
//!     --mutant lift-fence-after-gap --seeds 200
//! # beside Java KCL workers, flotilla with `lease.java_compat` (or FLOTILLA_SIM_JAVA=1)
//! cargo run --release -p flotilla-actors --example simulate -- --java --seeds 100
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/support/mod.rs"]
#[allow(unused)]
mod support;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use support::sim::{JavaMode, SimFailure, SimOptions, SimReport, run_seed};

#[derive(Clone, Copy)]
struct Args {
    from: u64,
    seeds: u64,
    steps: usize,
    quiet: Duration,
    threads: usize,
    verbose: bool,
    mutant: Option<&'static str>,
    keep_going: bool,
    /// Run the mutation table instead.
    mutants: bool,
    /// Run the one seed `from` here and print its outcome as JSON (the parent's child).
    child: bool,
    /// Beside Java KCL workers (`--java`, `--java-without-compat`, or `FLOTILLA_SIM_JAVA`).
    java: Option<JavaMode>,
}

const USAGE: &str = "usage: simulate [--seeds N] [--from S] [--seed S] [--steps N] \
    [--quiet-secs S] [--threads N] [--mutant NAME | --mutants] [--java | --java-without-compat] \
    [--keep-going] [--verbose]";

fn parse() -> Result<Args, String> {
    let mut args = Args {
        from: 0,
        seeds: 100,
        steps: SimOptions::new(0).steps,
        quiet: SimOptions::new(0).quiet,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        verbose: false,
        mutant: None,
        keep_going: false,
        mutants: false,
        child: false,
        java: JavaMode::from_env(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        let number = |name: &str, v: String| {
            v.parse::<u64>()
                .map_err(|_| format!("{name}: {v:?} is not a whole number"))
        };
        match arg.as_str() {
            "--seeds" => args.seeds = number("--seeds", value("--seeds")?)?,
            "--from" => args.from = number("--from", value("--from")?)?,
            "--seed" => {
                args.from = number("--seed", value("--seed")?)?;
                args.seeds = 1;
            }
            "--steps" => args.steps = number("--steps", value("--steps")?)? as usize,
            "--quiet-secs" => {
                args.quiet = Duration::from_secs(number("--quiet-secs", value("--quiet-secs")?)?)
            }
            "--threads" => args.threads = number("--threads", value("--threads")?)?.max(1) as usize,
            "--verbose" => args.verbose = true,
            "--keep-going" => args.keep_going = true,
            "--mutants" => args.mutants = true,
            "--child" => args.child = true,
            "--java" => args.java = Some(JavaMode::Compat),
            "--java-without-compat" => args.java = Some(JavaMode::WithoutCompat),
            "--mutant" => {
                let name = value("--mutant")?;
                args.mutant = Some(set_mutant(&name)?);
            }
            "--help" | "-h" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other:?}\n{USAGE}")),
        }
    }
    Ok(args)
}

#[cfg(feature = "mutants")]
fn set_mutant(name: &str) -> Result<&'static str, String> {
    use flotilla_actors::mutants::{self, Mutant};
    let mutant = Mutant::parse(name).ok_or_else(|| {
        let names: Vec<&str> = Mutant::ALL.iter().map(|m| m.name()).collect();
        format!("no mutant {name:?}; there are: {}", names.join(", "))
    })?;
    mutants::set(Some(mutant));
    Ok(mutant.name())
}

#[cfg(not(feature = "mutants"))]
fn set_mutant(_: &str) -> Result<&'static str, String> {
    Err(
        "--mutant needs the mutants feature: cargo run --release -p flotilla-actors \
         --example simulate --features mutants -- --mutant NAME"
            .into(),
    )
}

/// Runs one seed in a child process of this program (`--child`), which prints its
/// outcome as one JSON line. Simulations running at once on two threads of one process
/// do not always replay (SIMULATION.md, "The fault simulator"); one per process do.
fn run_isolated(options: &SimOptions) -> Result<SimReport, SimFailure> {
    let failed = |what: String| SimFailure {
        seed: options.seed,
        step: "child process".into(),
        what,
        tail: Vec::new(),
        replay: options.replay(),
        at: Duration::ZERO,
    };
    let exe = std::env::current_exe().map_err(|e| failed(format!("no program path: {e}")))?;
    let mut command = std::process::Command::new(exe);
    command.args([
        "--child",
        "--seed",
        &options.seed.to_string(),
        "--steps",
        &options.steps.to_string(),
        "--quiet-secs",
        &options.quiet.as_secs().to_string(),
    ]);
    if let Some(mutant) = options.mutant {
        command.args(["--mutant", mutant]);
    }
    if let Some(java) = options.java {
        command.arg(java.flag());
    }
    if options.verbose {
        command.arg("--verbose");
    }
    let output = command
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| failed(format!("the child process did not start: {e}")))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let mut last = None;
    for line in stdout.lines() {
        match line.strip_prefix(CHILD_LINE) {
            Some(json) => last = Some(json.to_owned()),
            None => println!("{line}"),
        }
    }
    let Some(json) = last else {
        return Err(failed(format!(
            "the child process ended ({}) without an outcome",
            output.status
        )));
    };
    serde_json::from_str::<Result<SimReport, SimFailure>>(&json)
        .map_err(|e| failed(format!("the child's outcome is unreadable: {e}: {json}")))?
}

/// The prefix of the outcome line a child prints.
const CHILD_LINE: &str = "simulate-outcome: ";

/// What a batch of seeds came to.
struct Outcome {
    reports: Vec<SimReport>,
    failures: Vec<SimFailure>,
}

/// Runs seeds `from..from + count` on `threads` threads. Unless `keep_going`, stops at
/// the first failure, but still finishes every lower seed, so the failure reported is
/// the lowest failing seed.
fn run_many(args: &Args, from: u64, count: u64, quiet_output: bool) -> Outcome {
    let next = AtomicU64::new(from);
    let end = from + count;
    let lowest_failure = AtomicU64::new(u64::MAX);
    let reports: Mutex<Vec<SimReport>> = Mutex::new(Vec::new());
    let failures: Mutex<Vec<SimFailure>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..args.threads.min(count.max(1) as usize) {
            scope.spawn(|| {
                loop {
                    let seed = next.fetch_add(1, Ordering::SeqCst);
                    if seed >= end
                        || (!args.keep_going && seed > lowest_failure.load(Ordering::SeqCst))
                    {
                        return;
                    }
                    let options = SimOptions {
                        steps: args.steps,
                        quiet: args.quiet,
                        verbose: args.verbose,
                        mutant: args.mutant,
                        java: args.java,
                        ..SimOptions::new(seed)
                    };
                    let started = Instant::now();
                    match run_isolated(&options) {
                        Ok(report) => {
                            if !quiet_output && (args.verbose || count <= 20) {
                                let poison = if report.policy.is_empty() {
                                    String::new()
                                } else {
                                    format!(
                                        ", {} poison put, {} discarded ({})",
                                        report.poison_put, report.discarded, report.policy
                                    )
                                };
                                println!(
                                    "seed {seed}: ok, {:.2} fleet-hours, {} records, {} process() \
                                     calls, {} duplicates{poison}, trace {:016x} ({} lines), \
                                     {:.1?} wall",
                                    report.fleet_hours(),
                                    report.produced,
                                    report.process_calls,
                                    report.duplicates,
                                    report.trace_hash,
                                    report.trace_lines,
                                    started.elapsed()
                                );
                            }
                            reports.lock().unwrap().push(report);
                        }
                        Err(failure) => {
                            if !quiet_output {
                                println!("{failure}\n");
                            }
                            lowest_failure.fetch_min(seed, Ordering::SeqCst);
                            failures.lock().unwrap().push(failure);
                        }
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap();
    failures.sort_by_key(|f| f.seed);
    Outcome {
        reports: reports.into_inner().unwrap(),
        failures,
    }
}

fn summary(outcome: &Outcome, args: &Args, wall: Duration) {
    let reports = &outcome.reports;
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for report in reports {
        for (kind, n) in &report.faults {
            *faults.entry(kind.clone()).or_default() += n;
        }
    }
    let hours: f64 = reports.iter().map(SimReport::fleet_hours).sum();
    let worker_hours: f64 = reports.iter().map(SimReport::worker_hours).sum();
    let checks: u64 = reports.iter().map(|r| r.checks).sum();
    let minutes = wall.as_secs_f64() / 60.0;
    println!(
        "simulated {} seeds ({} passed, {} failed){}: {hours:.1} fleet-hours, {worker_hours:.1} \
         worker-hours in {:.1} wall minutes on {} threads ({:.0} fleet-hours per wall minute), \
         {checks} invariant checks",
        reports.len() + outcome.failures.len(),
        reports.len(),
        outcome.failures.len(),
        args.mutant
            .map(|m| format!(" with mutant {m}"))
            .unwrap_or_default(),
        minutes,
        args.threads,
        hours / minutes.max(1e-9),
    );
    println!("faults injected by kind:");
    for (kind, n) in &faults {
        println!("  {kind:>20} {n}");
    }
    poison_summary(reports);
    if let Some(java) = args.java {
        java_summary(reports, java);
    }
    // Lease-table cost per worker-minute, by operation (writes and reads; for reads,
    // the items read too), under the faults above.
    let (mut calls, mut items): (BTreeMap<String, u64>, BTreeMap<String, u64>) =
        (BTreeMap::new(), BTreeMap::new());
    let mut units: BTreeMap<String, f64> = BTreeMap::new();
    for report in reports {
        for (op, n) in &report.table_calls {
            *calls.entry(op.clone()).or_default() += n;
        }
        for (op, n) in &report.table_items {
            *items.entry(op.clone()).or_default() += n;
        }
        for (op, n) in &report.table_units {
            *units.entry(op.clone()).or_default() += n;
        }
    }
    let worker_minutes = (worker_hours * 60.0).max(1e-9);
    println!(
        "lease-table calls per worker-minute by operation (items read and read units billed, for reads; heartbeats_summary: the heartbeat reads through the index):"
    );
    for (op, n) in &calls {
        let read = items
            .get(op)
            .map(|i| {
                let billed = units.get(op).copied().unwrap_or(0.0);
                format!(
                    " ({:.1} items, {:.2} RCU)",
                    *i as f64 / worker_minutes,
                    billed / worker_minutes
                )
            })
            .unwrap_or_default();
        println!("  {op:>22} {:.2}{read}", *n as f64 / worker_minutes);
    }
}

/// The seeds with the failure policy: poison records put and what became of them.
fn poison_summary(reports: &[SimReport]) {
    let with: Vec<&SimReport> = reports.iter().filter(|r| !r.policy.is_empty()).collect();
    let sum = |f: fn(&SimReport) -> u64| with.iter().map(|r| f(r)).sum::<u64>();
    let discarded = sum(|r| r.discarded);
    let poison = sum(|r| r.poison_discarded);
    println!(
        "failure policy: {} seeds of {}; {} poison records put, {} batches refused for one; \
         {discarded} records discarded ({poison} poison, {} good ones the processor failed or \
         refused beside a poison record){}, {} envelopes stored, {} destination writes refused",
        with.len(),
        reports.len(),
        sum(|r| r.poison_put),
        sum(|r| r.poison_refusals),
        discarded - poison,
        match sum(|r| r.poison_java) {
            0 => String::new(),
            n => format!("; {n} poison records taken by Java workers instead"),
        },
        sum(|r| r.envelopes),
        sum(|r| r.destination_refused),
    );
}

/// Runs beside Java workers: their time, and what happened between the two kinds.
fn java_summary(reports: &[SimReport], java: JavaMode) {
    let hours: f64 = reports
        .iter()
        .map(|r| r.java_worker_time.as_secs_f64() / 3600.0)
        .sum();
    let mut stats: BTreeMap<String, u64> = BTreeMap::new();
    for report in reports {
        for (what, n) in &report.java {
            *stats.entry(what.clone()).or_default() += n;
        }
    }
    let overlap = reports
        .iter()
        .map(|r| r.java_steal_overlap)
        .max()
        .unwrap_or_default();
    let seeds_with_overlap = reports
        .iter()
        .filter(|r| {
            r.java
                .get("flotilla_batches_after_a_steal")
                .is_some_and(|n| *n > 0)
        })
        .count();
    println!(
        "beside Java KCL workers ({}): {hours:.1} Java worker-hours; longest a flotilla worker \
         handed batches over after a Java steal: {:.3} s ({seeds_with_overlap} seeds with any)",
        java.flag(),
        overlap.as_secs_f64()
    );
    for (what, n) in &stats {
        println!("  {what:>44} {n}");
    }
}

fn main() {
    let args = match parse() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    // The workers' own log lines, interleaved with the trace (`RUST_LOG=info`).
    if std::env::var_os("RUST_LOG").is_some() {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .without_time()
            .init();
    }
    if args.child {
        let options = SimOptions {
            steps: args.steps,
            quiet: args.quiet,
            verbose: args.verbose,
            mutant: args.mutant,
            java: args.java,
            ..SimOptions::new(args.from)
        };
        let outcome = run_seed(&options);
        match serde_json::to_string(&outcome) {
            Ok(json) => println!("{CHILD_LINE}{json}"),
            Err(e) => eprintln!(
                "simulate: the outcome of seed {} is unwritable: {e}",
                args.from
            ),
        }
        return;
    }
    if args.mutants {
        std::process::exit(mutation_table(&args));
    }
    let wall = Instant::now();
    let outcome = run_many(&args, args.from, args.seeds, false);
    summary(&outcome, &args, wall.elapsed());
    if let Some(first) = outcome.failures.first() {
        println!(
            "first failing seed: {} (replay: {})",
            first.seed, first.replay
        );
        std::process::exit(1);
    }
}

/// Each deliberate protocol bug in turn: the seeds it takes to be caught. Exits 1 if
/// any survives `--seeds` seeds.
#[cfg(feature = "mutants")]
fn mutation_table(args: &Args) -> i32 {
    use flotilla_actors::mutants::{self, Mutant};
    let mut survivors = Vec::new();
    let mut false_alarms = Vec::new();
    println!("| mutant | first failing seed | seeds run | wall | what the simulator saw |");
    println!("|---|---|---|---|---|");
    for mutant in Mutant::ALL {
        mutants::set(Some(mutant));
        // An equivalent mutant cannot be caught: a few dozen seeds show no false alarm.
        let seeds = if mutant.equivalent().is_some() {
            args.seeds.min(40)
        } else {
            args.seeds
        };
        let args = Args {
            mutant: Some(mutant.name()),
            keep_going: false,
            verbose: false,
            seeds,
            ..*args
        };
        let wall = Instant::now();
        let outcome = run_many(&args, args.from, args.seeds, true);
        let elapsed = wall.elapsed();
        mutants::set(None);
        match (outcome.failures.first(), mutant.equivalent()) {
            (Some(first), Some(_)) => {
                println!(
                    "| {mutant} | {} | {} | {:.1} s | CAUGHT, yet equivalent: {} |",
                    first.seed,
                    first.seed - args.from + 1,
                    elapsed.as_secs_f64(),
                    first.what.replace('|', "/")
                );
                println!("{first}");
                false_alarms.push(mutant);
            }
            (Some(first), None) => println!(
                "| {mutant} | {} | {} | {:.1} s | {} |",
                first.seed,
                first.seed - args.from + 1,
                elapsed.as_secs_f64(),
                first.what.replace('|', "/")
            ),
            (None, Some(why)) => println!(
                "| {mutant} | none (equivalent) | {} | {:.1} s | nothing, as expected: {why} |",
                outcome.reports.len(),
                elapsed.as_secs_f64()
            ),
            (None, None) => {
                println!(
                    "| {mutant} | none | {} | {:.1} s | NOT CAUGHT |",
                    outcome.reports.len(),
                    elapsed.as_secs_f64()
                );
                survivors.push(mutant);
            }
        }
    }
    if !false_alarms.is_empty() {
        println!(
            "equivalent mutants caught (a false alarm, or the argument is wrong): {false_alarms:?}"
        );
    }
    if !survivors.is_empty() {
        println!("mutants not caught in {} seeds: {survivors:?}", args.seeds);
    }
    if survivors.is_empty() && false_alarms.is_empty() {
        println!("every mutant was caught (and no equivalent one)");
        0
    } else {
        1
    }
}

#[cfg(not(feature = "mutants"))]
fn mutation_table(_: &Args) -> i32 {
    eprintln!("--mutants needs the mutants feature (--features mutants)");
    2
}
