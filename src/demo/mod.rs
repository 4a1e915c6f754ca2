//! `flotilla demo`: a fleet of workers against the in-memory services, fed by a built-in
//! producer, checked by a built-in processor. No AWS account and no server needed.
//!
//! * `--workers` workers run in this process but share nothing except what separate
//!   processes would: the stream and the lease table. Each has its own id, heartbeat and
//!   leases; they find each other only through the table.
//! * The producer puts `--rate` records a second round-robin over [`producer::KEYS`] partition
//!   keys; a record's data is `key-17:42`, its key and its place in that key's sequence.
//! * At a third of the run a shard is split, at two thirds two adjacent shards are
//!   merged, so records of a key cross from parents to children mid-run. With
//!   `--source dynamodb-streams` the records are changes of an in-memory table's items
//!   (a put per record: an INSERT, then MODIFYs), read from the table's stream; at a
//!   third every shard rotates (as DynamoDB's do about every four hours), at two thirds
//!   one splits. Between the
//!   two, `--crashes` workers are killed without a shutdown (the one holding the most
//!   leases first), and the survivors must take over their leases once they expire.
//! * Every delivery of every worker goes through one
//!   [`OrderCheck`](flotilla_actors::oracle::OrderCheck), which counts
//!   distinct records, duplicates (replays, which at-least-once allows after a crash)
//!   and order violations (a key's records out of order, which it never allows).
//! * With `--poison N`, about a second in the producer also puts N records
//!   (`poison-0:0`, …, one key each) that the processor refuses. The workers run with
//!   `[failure]` on: each is retried twice, then written to a dead-letter file and
//!   skipped, and every other record is still delivered. The summary counts the poison
//!   records in the file.
//! * Once the producer stops the fleet is given [`CATCH_UP`] to process what is left,
//!   then every survivor is shut down gracefully. The last line on stdout is the
//!   [`summary::Summary`]; [`summary::failures`] decides whether the run passed.
//!
//! Progress goes to stderr once a second; library logs are at `warn` unless
//! `FLOTILLA_LOG` says otherwise.
//!
//! The parts, each below the one that uses it:
//!
//! * `fleet`: the workers, their settings, crashing one, shutting them all down.
//! * `progress`: the line printed once a second.
//! * `check`: the processor every worker runs, feeding one shared order check.
//! * `producer`: the producer and where its records go (a stream, or a table's items).
//! * `dead_letters`: `--poison`'s failure policy and what its dead-letter file holds.
//! * `reshard`: the split and the merge (or the rotation and the split) mid-run.
//! * `summary`: the summary line and whether the run passed.

mod check;
mod dead_letters;
mod fleet;
mod producer;
mod progress;
mod reshard;
mod summary;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use flotilla_actors::Backend;
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig, MemoryTableStreams,
    MemoryTableStreamsConfig,
};
use flotilla_actors::backend::{StreamAdmin as _, TableStreamAdmin as _};
use flotilla_actors::settings::{FailureSettings, ReadMode};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};

use check::SharedCheck;
use dead_letters::{DeadLetters, dead_letter_path, poison_failure};
use fleet::Fleet;
use producer::{Feed, Producer, STREAM, TABLE};
use progress::Progress;
use reshard::reshard;
use summary::{failures, summarize};

/// How long the fleet may take to process what is left once the producer stops.
const CATCH_UP: Duration = Duration::from_secs(30);

/// When the split and the merge happen in a run without an end (`--duration 0`).
const OPEN_ENDED_SPLIT: Duration = Duration::from_secs(10);
const OPEN_ENDED_MERGE: Duration = Duration::from_secs(20);

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// How long the producer runs, in seconds; 0 runs until Ctrl-C.
    #[arg(long, default_value_t = 20)]
    pub duration: u64,
    /// Shards of the in-memory stream at the start.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub shards: u32,
    /// Records put per second.
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub rate: u32,
    /// Workers in the fleet, all in this process, sharing the stream and the lease table.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub workers: u32,
    /// Workers killed mid-run without a shutdown; their leases must fail over to the
    /// survivors. Must be below --workers. Default: 1 with two or more workers, else 0.
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=99))]
    pub crashes: Option<u32>,
    /// Where the first worker's status endpoint listens; the others take the next
    /// ports. Port 0 gives every worker a free port. Each prints its URL at start.
    #[arg(long, default_value = "127.0.0.1:9797", value_name = "ADDR")]
    pub status_bind: std::net::SocketAddr,
    /// How the workers read: "polling" (GetRecords) or "fanout" (enhanced fan-out: each
    /// shard subscribed, its records pushed as they are put).
    #[arg(long, default_value = "polling", value_parser = ["polling", "fanout"])]
    pub read_mode: String,
    /// What the fleet reads: "kinesis" (a stream the producer puts records to, split and
    /// merged mid-run) or "dynamodb-streams" (a table's change stream: the producer
    /// writes items, every shard rotates and one splits mid-run).
    #[arg(long, default_value = "kinesis", value_parser = ["kinesis", "dynamodb-streams"])]
    pub source: String,
    /// Records the demo's processor refuses, put about a second into the run. Each is
    /// retried twice, then written to a dead-letter file (its path is printed at the
    /// start) and skipped; every other record must still be delivered.
    #[arg(long, default_value_t = 0, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub poison: u32,
}

impl DemoArgs {
    /// How many workers to crash. A fleet with no survivor could not finish the run, so
    /// at least one worker is always left.
    fn crashes(&self) -> anyhow::Result<u32> {
        match self.crashes {
            None => Ok(u32::from(self.workers > 1)),
            Some(crashes) if crashes < self.workers => Ok(crashes),
            Some(crashes) => bail!(
                "--crashes {crashes} needs more than {crashes} workers (--workers is {}): \
                 at least one worker must survive to finish the run",
                self.workers
            ),
        }
    }
}

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let crashes = args.crashes()?;
    let read_mode = if args.read_mode == "fanout" {
        ReadMode::Fanout
    } else {
        ReadMode::Polling
    };
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    let feed = if args.source == "dynamodb-streams" {
        if read_mode == ReadMode::Fanout {
            bail!(
                "--read-mode fanout reads Kinesis streams only: a DynamoDB table's stream is \
                 read by polling"
            );
        }
        let tables = MemoryTableStreams::new(MemoryTableStreamsConfig {
            shards_per_table: args.shards,
            ..MemoryTableStreamsConfig::default()
        });
        let arn = tables
            .create_table_with_stream(TABLE)
            .await
            .context("cannot create the in-memory table")?;
        Feed::Table { tables, arn }
    } else {
        streams
            .create_stream(STREAM, args.shards)
            .await
            .context("cannot create the in-memory stream")?;
        Feed::Stream(streams.clone())
    };

    // With poison records, refused records go to one file for the whole fleet; without,
    // the failure policy stays off.
    let dead_letter_file = (args.poison > 0).then(dead_letter_path);
    if let Some(path) = &dead_letter_file {
        dead_letters::clear(path)?;
    }
    let failure = dead_letter_file
        .as_deref()
        .map_or_else(FailureSettings::default, poison_failure);
    if let Some(destination) = &failure.destination {
        eprintln!("demo: refused records go to {destination}");
    }

    let check = SharedCheck::default();
    // One backend for all: the workers meet in its lease table, as processes would in
    // DynamoDB.
    let mut backend = Backend::memory(streams, MemoryDynamo::new(), MemoryMetrics::new());
    if let Feed::Table { tables, .. } = &feed {
        backend = backend.with_table_streams(Arc::new(tables.clone()));
    }
    let mut fleet = Fleet::start(
        args.workers,
        &backend,
        &check,
        args.status_bind,
        read_mode,
        &feed,
        &failure,
    )
    .await?;

    let duration = (args.duration > 0).then(|| Duration::from_secs(args.duration));
    eprintln!(
        "demo: {} shards of {}, {} records/s, {} workers, {crashes} to crash, {}",
        args.shards,
        feed.worker_stream(),
        args.rate,
        args.workers,
        match duration {
            Some(d) => format!("for {}", humantime::format_duration(d)),
            None => "until Ctrl-C".to_owned(),
        }
    );

    let (stop, stopped) = watch::channel(false);
    let producer = Producer::new(args.rate, args.poison);
    let produced_so_far = producer.counter();
    let producing = tokio::spawn(producer.run(feed.clone(), stopped));
    let (split_at, merge_at) = match duration {
        Some(d) => (d / 3, d * 2 / 3),
        None => (OPEN_ENDED_SPLIT, OPEN_ENDED_MERGE),
    };
    let resharding = tokio::spawn(reshard(feed, split_at, merge_at));

    let started = Instant::now();
    let mut crash_schedule = crash_times(split_at, merge_at, crashes).into_iter();
    let mut next_crash = crash_schedule.next();
    let crash_timer = tokio::time::sleep_until(started + next_crash.unwrap_or_default());
    tokio::pin!(crash_timer);
    let mut progress = Progress::new(started);
    let mut ticks =
        tokio::time::interval_at(started + Duration::from_secs(1), Duration::from_secs(1));
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    // Only polled when there is a duration (see the `if` below).
    let end = tokio::time::sleep(duration.unwrap_or(Duration::ZERO));
    tokio::pin!(end);
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    loop {
        tokio::select! {
            () = &mut end, if duration.is_some() => break,
            result = &mut ctrl_c => {
                result.context("cannot listen for Ctrl-C")?;
                eprintln!("demo: interrupted; stopping the producer (Ctrl-C again to stop waiting)");
                break;
            }
            () = &mut crash_timer, if next_crash.is_some() => {
                fleet.crash_one().await?;
                next_crash = crash_schedule.next();
                if let Some(at) = next_crash {
                    crash_timer.as_mut().reset(started + at);
                }
            }
            _ = ticks.tick() => {
                let statuses = fleet.statuses().await?;
                eprintln!("{}", progress.line(&fleet, &statuses, produced_so_far.load(Ordering::Relaxed), &check));
            }
        }
    }

    // Stop producing before resharding is looked at: a reshard still pending is dropped.
    let _ = stop.send(true);
    let produced = producing
        .await
        .context("the producer task failed")?
        .context("the producer failed")?;
    if !resharding.is_finished() {
        resharding.abort();
    }
    match resharding.await {
        Ok(result) => result.context("resharding failed")?,
        Err(e) if e.is_cancelled() => eprintln!("demo: stopped before the split or the merge"),
        Err(e) => return Err(e).context("the resharding task failed"),
    }

    let total = produced.total();
    eprintln!(
        "demo: producer stopped after {total} records; waiting up to {} for the fleet to catch up",
        humantime::format_duration(CATCH_UP)
    );
    let deadline = Instant::now() + CATCH_UP;
    // A fresh listener: the first may have fired already.
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    // With poison records, also until every one is in the dead-letter file.
    let discarded_all = || {
        dead_letter_file
            .as_deref()
            .is_none_or(|path| DeadLetters::read(path).poison.len() as u64 >= produced.poisoned)
    };
    loop {
        if check.lock().processed() >= total && discarded_all() {
            break;
        }
        if Instant::now() >= deadline {
            eprintln!(
                "demo: the fleet did not catch up within {}",
                humantime::format_duration(CATCH_UP)
            );
            break;
        }
        tokio::select! {
            result = &mut ctrl_c => {
                result.context("cannot listen for Ctrl-C")?;
                eprintln!("demo: interrupted; not waiting for the fleet (Ctrl-C again to stop at once)");
                break;
            }
            _ = ticks.tick() => {
                let statuses = fleet.statuses().await?;
                eprintln!("{}", progress.line(&fleet, &statuses, total, &check));
            }
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    }

    // The survivors' lease counts as they stand before shutting down: releasing at
    // shutdown is not a move, nobody takes those leases.
    let final_statuses = fleet.statuses().await?;
    eprintln!("{}", progress.line(&fleet, &final_statuses, total, &check));
    let figures = fleet.figures();
    eprintln!("demo: shutting down {}", fleet.alive().join(" "));
    // The summary is printed whatever the shutdowns did: what was delivered is known.
    let shutdowns = fleet.shutdown().await;
    let in_file = dead_letter_file.as_deref().map(DeadLetters::read);
    let summary = summarize(
        &check.lock(),
        &produced,
        figures,
        failure.destination.as_ref().zip(in_file.as_ref()),
    );
    println!("{summary}");

    let failures = failures(&summary, &shutdowns);
    if !failures.is_empty() {
        bail!("demo failed: {}", failures.join("; "));
    }
    Ok(())
}

/// When each crash happens, from the start: spread evenly between the split and the
/// merge, so a crash hits a stream that has just changed shape, and its leases (children
/// blocked on their parents among them) fail over while the merge adds more.
fn crash_times(split_at: Duration, merge_at: Duration, crashes: u32) -> Vec<Duration> {
    let gap = merge_at.saturating_sub(split_at);
    (1..=crashes)
        .map(|k| split_at + gap * k / (crashes + 1))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn crashes_fall_between_the_split_and_the_merge() {
        let secs = Duration::from_secs;
        assert_eq!(crash_times(secs(10), secs(20), 1), [secs(15)]);
        assert_eq!(crash_times(secs(3), secs(6), 2), [secs(4), secs(5)]);
        assert!(crash_times(secs(3), secs(6), 0).is_empty());
    }

    #[test]
    fn one_worker_is_never_crashed_and_one_always_survives() {
        let args = |workers, crashes| DemoArgs {
            duration: 10,
            shards: 8,
            rate: 2000,
            workers,
            crashes,
            status_bind: ([127, 0, 0, 1], 0).into(),
            read_mode: "polling".into(),
            source: "kinesis".into(),
            poison: 0,
        };
        assert_eq!(args(1, None).crashes().unwrap(), 0);
        assert_eq!(args(3, None).crashes().unwrap(), 1);
        assert_eq!(args(3, Some(2)).crashes().unwrap(), 2);
        assert_eq!(args(3, Some(0)).crashes().unwrap(), 0);
        let refused = args(3, Some(3)).crashes().unwrap_err().to_string();
        assert!(refused.contains("--crashes 3"), "{refused}");
    }
}
