//! `flotilla demo`: a fleet of workers against the in-memory services, fed by a built-in
//! producer, checked by a built-in processor. No AWS account and no server needed.
//!
//! * `--workers` workers run in this process but share nothing except what separate
//!   processes would: the stream and the lease table. Each has its own id, heartbeat and
//!   leases; they find each other only through the table.
//! * The producer puts `--rate` records a second round-robin over [`KEYS`] partition
//!   keys; a record's data is `key-17:42`, its key and its place in that key's sequence.
//! * At a third of the run a shard is split, at two thirds two adjacent shards are
//!   merged, so records of a key cross from parents to children mid-run. With
//!   `--source dynamodb-streams` the records are changes of an in-memory table's items
//!   (a put per record: an INSERT, then MODIFYs), read from the table's stream; at a
//!   third every shard rotates (as DynamoDB's do about every four hours), at two thirds
//!   one splits. Between the
//!   two, `--crashes` workers are killed without a shutdown (the one holding the most
//!   leases first), and the survivors must take over their leases once they expire.
//! * Every delivery of every worker goes through one [`OrderCheck`], which counts
//!   distinct records, duplicates (replays, which at-least-once allows after a crash)
//!   and order violations (a key's records out of order, which it never allows).
//! * Once the producer stops the fleet is given [`CATCH_UP`] to process what is left,
//!   then every survivor is shut down gracefully. The last line on stdout is the
//!   [`Summary`]; [`failures`] decides whether the run passed.
//!
//! Progress goes to stderr once a second; library logs are at `warn` unless
//! `FLOTILLA_LOG` says otherwise.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use anyhow::{Context as _, bail};
use clap::Args;
use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig, MemoryTableStreams,
    MemoryTableStreamsConfig,
};
use flotilla_actors::backend::{
    ItemWrite, PutRecord, StreamAdmin as _, StreamClient as _, StreamError, TABLE_KEY,
    TableStreamAdmin as _,
};
use flotilla_actors::model::Shard;
use flotilla_actors::model::change::{AttributeValue, Item};
use flotilla_actors::oracle::{KeyedProducer, OrderCheck};
use flotilla_actors::settings::{MetricsLevel, ReadMode};
use flotilla_actors::{
    Backend, Batch, Checkpointer, KeeperStatus, Processor, ProcessorError, Settings,
    ShutdownReport, Worker, WorkerStatus,
};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::{Instant, MissedTickBehavior};

const STREAM: &str = "flotilla-demo";
/// The table whose changes `--source dynamodb-streams` reads.
const TABLE: &str = "flotilla-demo-orders";
/// The item attribute holding what a Kinesis record's data would (`key-17:42`).
const DATA_ATTRIBUTE: &str = "data";
const APPLICATION: &str = "flotilla-demo";
/// Distinct partition keys: enough that every shard, and both halves of a split, get some.
const KEYS: u32 = 100;
/// How long the fleet may take to process what is left once the producer stops.
const CATCH_UP: Duration = Duration::from_secs(30);
/// When the split and the merge happen in a run without an end (`--duration 0`).
const OPEN_ENDED_SPLIT: Duration = Duration::from_secs(10);
const OPEN_ENDED_MERGE: Duration = Duration::from_secs(20);
/// The producer's pace: it tops up to the target rate this often.
const PRODUCER_TICK: Duration = Duration::from_millis(20);
/// The `gained` reasons of [`KeeperStatus`] that mean a lease changed owner, as opposed
/// to a worker taking a brand-new lease or resuming one already in its name.
const MOVED: [&str; 3] = ["expired", "handed_off", "released"];

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

/// Tuned for a run of seconds rather than days: frequent checkpoints and shard
/// listings, short polls, and lease timings short enough that a crashed worker's leases
/// fail over within the run. Metrics stay in the worker (they feed the progress line).
fn demo_settings(
    worker_id: String,
    status_bind: std::net::SocketAddr,
    read_mode: ReadMode,
    stream: &str,
) -> Settings {
    let mut settings = Settings::default();
    settings.reader.mode = read_mode;
    settings.status.bind = status_bind.to_string();
    settings.worker.stream = stream.to_owned();
    settings.worker.application = APPLICATION.to_owned();
    settings.worker.worker_id = Some(worker_id);
    settings.lease.failover_time = Duration::from_secs(3);
    settings.lease.heartbeat_interval = Duration::from_millis(500);
    settings.lease.fence_margin = Duration::from_secs(1);
    settings.checkpoint.interval = Duration::from_secs(1);
    settings.reader.poll_interval = Duration::from_millis(50);
    settings.reader.idle_max = Duration::from_millis(200);
    settings.reader.parent_poll_interval = Duration::from_millis(200);
    settings.reader.shard_sync_interval = Duration::from_secs(2);
    settings.metrics.level = MetricsLevel::None;
    settings
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
    let producer = Producer::new(args.rate);
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
    loop {
        if check.lock().processed() >= total {
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
    let summary = summarize(&check.lock(), &produced, figures);
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

/// One worker of the fleet and what was last seen of its leases.
struct Member {
    id: String,
    /// `None` once crashed or handed to the shutdown.
    worker: Option<Worker>,
    /// From the last status it answered; a crashed worker's stays as it was just before.
    leases: Option<KeeperStatus>,
}

/// The demo's workers, by id.
struct Fleet {
    members: Vec<Member>,
    crashes: u32,
}

/// What the summary reports about the fleet.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FleetFigures {
    pub workers: u32,
    pub crashes: u32,
    /// Leases that changed owner: taken after their owner died, handed off, or taken
    /// after a release, summed over every worker (the crashed ones as last seen).
    pub lease_moves: u64,
}

/// How one worker's graceful shutdown ended.
#[derive(Debug)]
enum Shutdown {
    Report(ShutdownReport),
    Failed(String),
    /// Ctrl-C came first; the worker was stopped abruptly.
    Interrupted,
}

impl Fleet {
    /// Starts the workers one after another, each with its own id and processors that
    /// all feed `check`.
    async fn start(
        workers: u32,
        backend: &Backend,
        check: &SharedCheck,
        status_bind: std::net::SocketAddr,
        read_mode: ReadMode,
        feed: &Feed,
    ) -> anyhow::Result<Self> {
        let mut members = Vec::new();
        let stream = feed.worker_stream();
        let changes = matches!(feed, Feed::Table { .. });
        for n in 1..=workers {
            let id = format!("demo-{n}");
            let for_processors = check.clone();
            let mut bind = status_bind;
            if bind.port() != 0 {
                let port = u16::try_from(u32::from(bind.port()) + n - 1).with_context(|| {
                    format!("--status-bind {status_bind}: no port left for worker {id}")
                })?;
                bind.set_port(port);
            }
            let worker = Worker::builder()
                .settings(demo_settings(id.clone(), bind, read_mode, &stream))
                .backend(backend.clone())
                .processor(move |_shard| CheckingProcessor {
                    check: for_processors.clone(),
                    changes,
                })
                .start()
                .await
                .with_context(|| format!("cannot start worker {id}"))?;
            #[cfg(feature = "otel")]
            crate::otel::watch(&worker);
            if let Some(addr) = worker.status_addr() {
                if n == 1 {
                    eprintln!("fleet page: http://{addr}/fleet.html");
                }
                eprintln!("status: {id} http://{addr}/status");
            }
            members.push(Member {
                id,
                worker: Some(worker),
                leases: None,
            });
        }
        Ok(Self {
            members,
            crashes: 0,
        })
    }

    /// The ids of the workers not crashed.
    fn alive(&self) -> Vec<&str> {
        self.members
            .iter()
            .filter(|m| m.worker.is_some())
            .map(|m| m.id.as_str())
            .collect()
    }

    /// Asks every live worker for its status and remembers its leases. A worker that
    /// does not answer has stopped on its own, which ends the demo.
    async fn statuses(&mut self) -> anyhow::Result<Vec<WorkerStatus>> {
        let mut statuses = Vec::new();
        for member in &mut self.members {
            let Some(worker) = &member.worker else {
                continue;
            };
            let status = worker
                .status()
                .await
                .with_context(|| format!("worker {} stopped", member.id))?;
            member.leases = status.leases.clone();
            statuses.push(status);
        }
        Ok(statuses)
    }

    /// Kills the live worker holding the most leases (the first such by id), so the
    /// crash strands as many shards as it can. Never demo-1: its endpoint serves the
    /// fleet page URL printed at the start, and it is always left alive.
    async fn crash_one(&mut self) -> anyhow::Result<()> {
        if self.alive().len() <= 1 {
            return Ok(());
        }
        // Fresh counts: the last progress line may be a second old.
        self.statuses().await?;
        let held = |m: &Member| m.leases.as_ref().map_or(0, |l| l.held.len());
        let mut victim: Option<&mut Member> = None;
        for member in self
            .members
            .iter_mut()
            .skip(1)
            .filter(|m| m.worker.is_some())
        {
            if victim.as_ref().is_none_or(|v| held(member) > held(v)) {
                victim = Some(member);
            }
        }
        if let Some(member) = victim
            && let Some(worker) = member.worker.take()
        {
            worker.abort();
            self.crashes += 1;
            eprintln!(
                "demo: crashed {} holding {} leases",
                member.id,
                member.leases.as_ref().map_or(0, |l| l.held.len())
            );
        }
        Ok(())
    }

    fn figures(&self) -> FleetFigures {
        let lease_moves = self
            .members
            .iter()
            .filter_map(|m| m.leases.as_ref())
            .flat_map(|l| MOVED.iter().filter_map(|reason| l.gained.get(*reason)))
            .sum();
        FleetFigures {
            workers: self.members.len() as u32,
            crashes: self.crashes,
            lease_moves,
        }
    }

    /// Shuts every live worker down at once, as a fleet being stopped would; Ctrl-C
    /// stops the ones not done yet abruptly. Returns each worker's outcome by id.
    async fn shutdown(&mut self) -> Vec<(String, Shutdown)> {
        let mut outcomes: Vec<(String, Shutdown)> = Vec::new();
        let mut running = JoinSet::new();
        let mut index_of = HashMap::new();
        for member in &mut self.members {
            if let Some(worker) = member.worker.take() {
                let task = running.spawn(worker.shutdown());
                index_of.insert(task.id(), outcomes.len());
                outcomes.push((member.id.clone(), Shutdown::Interrupted));
            }
        }
        let ctrl_c = tokio::signal::ctrl_c();
        tokio::pin!(ctrl_c);
        loop {
            tokio::select! {
                joined = running.join_next_with_id() => {
                    let (id, outcome) = match joined {
                        None => break,
                        Some(Ok((id, Ok(report)))) => (id, Shutdown::Report(report)),
                        Some(Ok((id, Err(e)))) => (id, Shutdown::Failed(e.to_string())),
                        Some(Err(e)) => (e.id(), Shutdown::Failed(format!("the shutdown task failed: {e}"))),
                    };
                    if let Some(&index) = index_of.get(&id) {
                        outcomes[index].1 = outcome;
                    }
                }
                _ = &mut ctrl_c => {
                    eprintln!("demo: interrupted; stopping the remaining workers at once");
                    // Dropping a shutdown midway drops its worker, which kills it.
                    running.abort_all();
                    break;
                }
            }
        }
        outcomes
    }
}

/// The one-line-a-second progress report.
struct Progress {
    last_at: Instant,
    last_deliveries: u64,
    started: Instant,
}

impl Progress {
    fn new(started: Instant) -> Self {
        Self {
            last_at: started,
            last_deliveries: 0,
            started,
        }
    }

    fn line(
        &mut self,
        fleet: &Fleet,
        statuses: &[WorkerStatus],
        produced: u64,
        check: &SharedCheck,
    ) -> String {
        let now = Instant::now();
        let (deliveries, processed) = {
            let check = check.lock();
            (check.deliveries(), check.processed())
        };
        let seconds = now.duration_since(self.last_at).as_secs_f64();
        let rate = if seconds > 0.0 {
            (deliveries - self.last_deliveries) as f64 / seconds
        } else {
            0.0
        };
        self.last_at = now;
        self.last_deliveries = deliveries;

        let lag = statuses
            .iter()
            .flat_map(|s| &s.shards)
            .filter_map(|s| s.millis_behind_latest)
            .max()
            .map_or_else(|| "-".to_owned(), |ms| format!("{ms}ms"));
        let checkpoints: u64 = statuses.iter().map(checkpoint_writes).sum();
        let workers: Vec<String> = fleet
            .members
            .iter()
            .map(|m| match (&m.worker, &m.leases) {
                (None, _) => format!("{}=(crashed)", m.id),
                (Some(_), Some(leases)) => format!("{}={}", m.id, leases.held.len()),
                (Some(_), None) => format!("{}=-", m.id),
            })
            .collect();
        format!(
            "demo: {:>3}s produced={produced} processed={processed} records/s={rate:.0} \
             lag={lag} checkpoints={checkpoints} workers: {}",
            now.duration_since(self.started).as_secs(),
            workers.join(" ")
        )
    }
}

fn checkpoint_writes(status: &WorkerStatus) -> u64 {
    match status
        .metrics
        .as_ref()
        .and_then(|m| m.totals.get("CheckpointWrites"))
    {
        Some(&writes) => writes as u64,
        None => status.checkpoints.values().map(|c| c.writes).sum(),
    }
}

/// The processor of the demo: every record through the shared [`OrderCheck`].
struct CheckingProcessor {
    check: SharedCheck,
    /// Records are changes of a table's items: the producer's key and data are the
    /// item's `pk` and `data`, read with the typed accessor a Rust user would use.
    changes: bool,
}

impl Processor for CheckingProcessor {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let mut check = self.check.lock();
        for record in batch.records() {
            match self.changes.then(|| produced_by_change(record)).flatten() {
                Some((key, data)) => check.observe(&key, data.as_bytes()),
                // Not a change the producer wrote: the check counts it as malformed.
                None => check.observe(&record.partition_key, &record.data),
            };
        }
        Ok(())
    }
}

/// The producer's key and data in a change: the item after it (before it, for a
/// REMOVE).
fn produced_by_change(record: &flotilla_actors::Record) -> Option<(String, String)> {
    let change = record.dynamodb_change().ok()?;
    let image = change
        .dynamodb
        .new_image
        .as_ref()
        .or(change.dynamodb.old_image.as_ref())?;
    let key = image.get(TABLE_KEY)?.as_s()?;
    let data = image.get(DATA_ATTRIBUTE)?.as_s()?;
    Some((key.to_owned(), data.to_owned()))
}

/// One check shared by the processors of every shard: a key moves between shards when
/// they are split or merged, so its order can only be judged across all of them.
#[derive(Debug, Clone, Default)]
struct SharedCheck(Arc<Mutex<OrderCheck>>);

impl SharedCheck {
    fn lock(&self) -> MutexGuard<'_, OrderCheck> {
        // A processor that panicked mid-batch leaves counts that are still counts.
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The verdict, given how many records of each key were produced and what the fleet
/// went through.
fn summarize(check: &OrderCheck, produced: &Produced, fleet: FleetFigures) -> Summary {
    let per_key = || produced.per_key.iter().map(|(k, &n)| (k, n));
    Summary {
        produced: produced.total(),
        processed: check.processed(),
        lost: check.lost(per_key()),
        duplicates: check.duplicates(),
        order_violations: check.violations(),
        fleet,
        // Distinct records beyond what was produced cannot come from the producer.
        malformed: check.malformed() + check.unproduced(per_key()),
    }
}

/// Why a run fails the check (nothing when it passes): a record lost, a key out of
/// order, a delivery the producer never wrote, a worker whose shutdown was not clean, or
/// a duplicate without a crash. A crash loses what was processed since the last
/// checkpoint, so its successor replays it: at-least-once. Without one, leases only
/// move with a flushed checkpoint, so a replay means a checkpoint went missing.
fn failures(summary: &Summary, shutdowns: &[(String, Shutdown)]) -> Vec<String> {
    let mut failures = Vec::new();
    if summary.lost > 0 {
        failures.push(format!("{} records lost", summary.lost));
    }
    if summary.order_violations > 0 {
        failures.push(format!("{} order violations", summary.order_violations));
    }
    if summary.malformed > 0 {
        failures.push(format!(
            "{} deliveries were not records the producer wrote",
            summary.malformed
        ));
    }
    if summary.duplicates > 0 && summary.fleet.crashes == 0 {
        failures.push(format!("{} duplicates without a crash", summary.duplicates));
    }
    for (worker, shutdown) in shutdowns {
        match shutdown {
            Shutdown::Report(report) if report.clean() => {}
            Shutdown::Report(report) => {
                let json = serde_json::to_string(report).unwrap_or_else(|e| e.to_string());
                failures.push(format!("{worker}: the shutdown was not clean: {json}"));
            }
            Shutdown::Failed(e) => failures.push(format!("{worker} did not shut down: {e}")),
            Shutdown::Interrupted => {
                failures.push(format!("{worker}: the shutdown was interrupted"));
            }
        }
    }
    failures
}

/// The demo's verdict. Its `Display` is the summary line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub produced: u64,
    pub processed: u64,
    pub lost: u64,
    pub duplicates: u64,
    pub order_violations: u64,
    pub fleet: FleetFigures,
    /// Deliveries that are not records the producer wrote; shown only when there are some.
    pub malformed: u64,
}

impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "demo: produced={} processed={} lost={} duplicates={} order_violations={} \
             workers={} crashes={} lease_moves={}",
            self.produced,
            self.processed,
            self.lost,
            self.duplicates,
            self.order_violations,
            self.fleet.workers,
            self.fleet.crashes,
            self.fleet.lease_moves,
        )?;
        if self.malformed > 0 {
            write!(f, " malformed={}", self.malformed)?;
        }
        Ok(())
    }
}

/// How many records of each key were put.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Produced {
    per_key: HashMap<String, u64>,
}

impl Produced {
    pub fn total(&self) -> u64 {
        self.per_key.values().sum()
    }
}

/// Puts records at a steady rate until told to stop: the library's per-key producer
/// (`oracle::KeyedProducer`), paced.
struct Producer {
    rate: u32,
    keys: KeyedProducer,
    total: Arc<AtomicU64>,
}

impl Producer {
    fn new(rate: u32) -> Self {
        Self {
            rate,
            keys: KeyedProducer::new("key-", KEYS),
            total: Arc::new(AtomicU64::new(0)),
        }
    }

    /// Records put so far, for the progress line.
    fn counter(&self) -> Arc<AtomicU64> {
        self.total.clone()
    }

    async fn run(
        mut self,
        feed: Feed,
        mut stop: watch::Receiver<bool>,
    ) -> anyhow::Result<Produced> {
        let started = Instant::now();
        let mut ticks = tokio::time::interval(PRODUCER_TICK);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut put: u64 = 0;
        loop {
            tokio::select! {
                _ = stop.changed() => break,
                _ = ticks.tick() => {}
            }
            if *stop.borrow() {
                break;
            }
            let due = (started.elapsed().as_secs_f64() * f64::from(self.rate)) as u64;
            let count = due.saturating_sub(put);
            if count == 0 {
                continue;
            }
            let records = self.keys.next_records(count);
            feed.put(&records)
                .await
                .with_context(|| format!("cannot put {} records", records.len()))?;
            // Counted only once the put succeeded: a refused record was never produced.
            self.keys.confirm(&records);
            put += count;
            self.total.store(put, Ordering::Relaxed);
        }
        Ok(Produced {
            per_key: self.keys.produced().into_iter().collect(),
        })
    }
}

/// Where the producer's records go, and what the fleet reads.
#[derive(Clone)]
enum Feed {
    Stream(MemoryStreams),
    Table {
        tables: MemoryTableStreams,
        arn: String,
    },
}

impl Feed {
    /// `worker.stream` for the fleet: the stream, or the table's current stream.
    fn worker_stream(&self) -> String {
        match self {
            Feed::Stream(_) => STREAM.to_owned(),
            Feed::Table { .. } => format!("dynamodb:{TABLE}"),
        }
    }

    /// Puts the records, or writes each as an item: `pk` its key, `data` its data.
    async fn put(&self, records: &[PutRecord]) -> Result<(), StreamError> {
        match self {
            Feed::Stream(streams) => streams.put_records(STREAM, records).await.map(drop),
            Feed::Table { tables, .. } => {
                let writes: Vec<ItemWrite> = records
                    .iter()
                    .map(|record| ItemWrite::Put {
                        attributes: Item::from([
                            (
                                TABLE_KEY.to_owned(),
                                AttributeValue::S(record.partition_key.clone()),
                            ),
                            (
                                DATA_ATTRIBUTE.to_owned(),
                                AttributeValue::S(
                                    String::from_utf8_lossy(&record.data).into_owned(),
                                ),
                            ),
                        ]),
                    })
                    .collect();
                tables.write_items(TABLE, &writes).await
            }
        }
    }
}

/// Changes the shape of what the fleet reads at `split_at` and `merge_at` (from now):
/// a stream's shard splits, then two merge; a table stream's shards all rotate, then
/// one splits.
async fn reshard(feed: Feed, split_at: Duration, merge_at: Duration) -> anyhow::Result<()> {
    match feed {
        Feed::Stream(streams) => reshard_stream(streams, split_at, merge_at).await,
        Feed::Table { tables, arn } => {
            let start = Instant::now();
            tokio::time::sleep_until(start + split_at).await;
            let rotated = tables
                .rotate_all(&arn)
                .context("cannot rotate the table stream's shards")?;
            eprintln!(
                "demo: rotated every shard of the table stream ({} new)",
                rotated.len()
            );
            tokio::time::sleep_until(start + merge_at).await;
            let Some(shard) = rotated.first() else {
                bail!("the table stream has no open shard to split");
            };
            let children = tables
                .split_shard(&arn, shard)
                .with_context(|| format!("cannot split {shard}"))?;
            eprintln!("demo: split {shard} into {} children", children.len());
            Ok(())
        }
    }
}

/// Splits a shard at `split_at` and merges two at `merge_at` (from now).
async fn reshard_stream(
    streams: MemoryStreams,
    split_at: Duration,
    merge_at: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    tokio::time::sleep_until(start + split_at).await;
    let shards = open_shards(&streams).await?;
    let Some((parent, at)) = split_point(&shards) else {
        bail!("no open shard is wide enough to split");
    };
    streams
        .split_shard(STREAM, &parent.id, at)
        .await
        .with_context(|| format!("cannot split {}", parent.id))?;
    eprintln!("demo: split {} at hash key {at}", parent.id);

    tokio::time::sleep_until(start + merge_at).await;
    let shards = open_shards(&streams).await?;
    let Some((a, b)) = adjacent_pair(&shards) else {
        bail!("no two open shards are adjacent");
    };
    streams
        .merge_shards(STREAM, &a.id, &b.id)
        .await
        .with_context(|| format!("cannot merge {} and {}", a.id, b.id))?;
    eprintln!("demo: merged {} and {}", a.id, b.id);
    Ok(())
}

/// Open shards, by hash-key range.
async fn open_shards(streams: &MemoryStreams) -> anyhow::Result<Vec<Shard>> {
    let mut shards: Vec<Shard> = streams
        .list_shards(STREAM)
        .await
        .context("cannot list shards")?
        .into_iter()
        .filter(Shard::is_open)
        .collect();
    shards.sort_by_key(|s| s.hash_range.start);
    Ok(shards)
}

/// The first shard (by hash key) with room to split, and the midpoint of its range: the
/// new starting hash key of the upper child.
fn split_point(open: &[Shard]) -> Option<(&Shard, u128)> {
    open.iter().find_map(|shard| {
        let range = shard.hash_range;
        (range.end > range.start).then(|| (shard, range.start + (range.end - range.start) / 2 + 1))
    })
}

/// The first two open shards (by hash key) whose ranges touch.
fn adjacent_pair(open: &[Shard]) -> Option<(&Shard, &Shard)> {
    open.windows(2).find_map(|pair| match pair {
        [a, b] if a.hash_range.end.checked_add(1) == Some(b.hash_range.start) => Some((a, b)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use flotilla_actors::model::{HashKeyRange, SequenceNumber, SequenceRange, ShardId};

    use super::*;

    fn observe_all(check: &mut OrderCheck, numbers: &[u64]) -> Vec<Seen> {
        numbers
            .iter()
            .map(|&n| check.observe_number("key-1", n))
            .collect()
    }

    fn produced(pairs: &[(&str, u64)]) -> Produced {
        Produced {
            per_key: pairs.iter().map(|&(k, n)| (k.to_owned(), n)).collect(),
        }
    }

    use flotilla_actors::oracle::Seen::{self, InOrder};

    /// A lone worker that never crashed.
    const ONE: FleetFigures = FleetFigures {
        workers: 1,
        crashes: 0,
        lease_moves: 0,
    };

    fn clean_report() -> ShutdownReport {
        ShutdownReport {
            shards: vec![],
            checkpoint_failures: vec![],
            leases: Default::default(),
            errors: vec![],
        }
    }

    fn clean(workers: &[&str]) -> Vec<(String, Shutdown)> {
        workers
            .iter()
            .map(|w| ((*w).to_owned(), Shutdown::Report(clean_report())))
            .collect()
    }

    fn passing() -> Summary {
        Summary {
            produced: 10,
            processed: 10,
            lost: 0,
            duplicates: 0,
            order_violations: 0,
            fleet: FleetFigures {
                workers: 3,
                crashes: 1,
                lease_moves: 4,
            },
            malformed: 0,
        }
    }

    #[test]
    fn the_run_fails_on_a_loss_a_violation_or_a_stray_delivery() {
        let survivors = clean(&["demo-1", "demo-2"]);
        assert!(failures(&passing(), &survivors).is_empty());
        let lost = Summary {
            lost: 1,
            processed: 9,
            ..passing()
        };
        assert_eq!(failures(&lost, &survivors), ["1 records lost"]);
        let unordered = Summary {
            order_violations: 2,
            ..passing()
        };
        assert_eq!(failures(&unordered, &survivors), ["2 order violations"]);
        let stray = Summary {
            malformed: 1,
            ..passing()
        };
        assert_eq!(failures(&stray, &survivors).len(), 1);
    }

    #[test]
    fn duplicates_pass_only_after_a_crash() {
        let replayed = Summary {
            duplicates: 3,
            ..passing()
        };
        assert!(failures(&replayed, &clean(&["demo-1", "demo-2"])).is_empty());
        let uncrashed = Summary {
            fleet: FleetFigures {
                crashes: 0,
                ..replayed.fleet
            },
            ..replayed
        };
        assert_eq!(
            failures(&uncrashed, &clean(&["demo-1", "demo-2", "demo-3"])),
            ["3 duplicates without a crash"]
        );
    }

    #[test]
    fn every_survivor_must_shut_down_cleanly() {
        let unclean = ShutdownReport {
            errors: vec!["lease keeper did not stop in time".to_owned()],
            ..clean_report()
        };
        let mut shutdowns = clean(&["demo-1", "demo-3"]);
        shutdowns[1].1 = Shutdown::Report(unclean);
        let found = failures(&passing(), &shutdowns);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(
            found[0].starts_with("demo-3: the shutdown was not clean"),
            "{found:?}"
        );

        shutdowns[1].1 = Shutdown::Failed("worker did not answer: timeout".to_owned());
        assert_eq!(
            failures(&passing(), &shutdowns),
            ["demo-3 did not shut down: worker did not answer: timeout"]
        );
        shutdowns[0].1 = Shutdown::Interrupted;
        assert_eq!(failures(&passing(), &shutdowns).len(), 2);
    }

    #[test]
    fn the_summary_line_ends_with_the_fleet() {
        let summary = Summary {
            duplicates: 7,
            ..passing()
        };
        assert_eq!(
            summary.to_string(),
            "demo: produced=10 processed=10 lost=0 duplicates=7 order_violations=0 \
             workers=3 crashes=1 lease_moves=4"
        );
    }

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
        };
        assert_eq!(args(1, None).crashes().unwrap(), 0);
        assert_eq!(args(3, None).crashes().unwrap(), 1);
        assert_eq!(args(3, Some(2)).crashes().unwrap(), 2);
        assert_eq!(args(3, Some(0)).crashes().unwrap(), 0);
        let refused = args(3, Some(3)).crashes().unwrap_err().to_string();
        assert!(refused.contains("--crashes 3"), "{refused}");
    }

    #[test]
    fn in_order_deliveries_pass() {
        let mut check = OrderCheck::default();
        assert_eq!(observe_all(&mut check, &[0, 1, 2]), [InOrder; 3]);
        assert_eq!(check.observe_number("key-2", 0), InOrder);
        let summary = summarize(&check, &produced(&[("key-1", 3), ("key-2", 1)]), ONE);
        assert_eq!(
            summary.to_string(),
            "demo: produced=4 processed=4 lost=0 duplicates=0 order_violations=0 \
             workers=1 crashes=0 lease_moves=0"
        );
    }

    #[test]
    fn records_never_delivered_are_lost() {
        let mut check = OrderCheck::default();
        observe_all(&mut check, &[0, 1]);
        let summary = summarize(&check, &produced(&[("key-1", 4), ("key-9", 2)]), ONE);
        assert_eq!(summary.lost, 4);
        assert_eq!(
            summary.to_string(),
            "demo: produced=6 processed=2 lost=4 duplicates=0 order_violations=0 \
             workers=1 crashes=0 lease_moves=0"
        );
    }

    #[test]
    fn data_must_name_the_partition_key_and_a_number() {
        let mut check = OrderCheck::default();
        assert_eq!(check.observe("key-1", b"key-1:0"), InOrder);
        assert_eq!(check.observe("key-1", b"key-2:1"), Seen::Malformed);
        assert_eq!(check.observe("key-1", b"key-1:x"), Seen::Malformed);
        assert_eq!(check.observe("key-1", &[0xff]), Seen::Malformed);
        assert_eq!(check.observe("key-1", b"key-1:1"), InOrder);
        let summary = summarize(&check, &produced(&[("key-1", 2)]), ONE);
        assert_eq!(summary.malformed, 3);
        assert!(summary.to_string().ends_with(" malformed=3"), "{summary}");
    }

    #[test]
    fn records_the_producer_did_not_write_are_malformed() {
        let mut check = OrderCheck::default();
        observe_all(&mut check, &[0, 1, 2]);
        let summary = summarize(&check, &produced(&[("key-1", 2)]), ONE);
        assert_eq!((summary.lost, summary.malformed), (0, 1));
    }

    #[test]
    fn the_producer_numbers_each_key_from_zero() {
        let records = |count| {
            let mut producer = KeyedProducer::new("key-", 2);
            // key-1 has five records put already.
            let key_1 = producer
                .rounds(2, 5)
                .into_iter()
                .filter(|r| r.partition_key == "key-1");
            producer.confirm(&key_1.collect::<Vec<_>>());
            producer
                .next_records(count)
                .into_iter()
                .map(|r| String::from_utf8(r.data.to_vec()).unwrap())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            records(5),
            ["key-0:0", "key-1:5", "key-0:1", "key-1:6", "key-0:2"]
        );
    }

    fn shard(index: u64, start: u128, end: u128, open: bool) -> Shard {
        Shard {
            id: ShardId::from_index(index),
            parent: None,
            adjacent_parent: None,
            hash_range: HashKeyRange::new(start, end).unwrap(),
            sequence_range: SequenceRange {
                start: SequenceNumber::from_u128(1),
                end: (!open).then(|| SequenceNumber::from_u128(9)),
            },
        }
    }

    #[test]
    fn the_split_takes_the_midpoint_of_the_first_wide_shard() {
        let shards = [shard(0, 5, 5, true), shard(1, 6, 9, true)];
        let (parent, at) = split_point(&shards).unwrap();
        assert_eq!((parent.id.as_str(), at), ("shardId-000000000001", 8));
        assert!(split_point(&shards[..1]).is_none());
        let full = [shard(0, 0, u128::MAX, true)];
        assert_eq!(split_point(&full).unwrap().1, u128::MAX / 2 + 1);
    }

    #[test]
    fn the_merge_takes_two_touching_shards() {
        let shards = [
            shard(0, 0, 9, true),
            shard(3, 20, 29, true),
            shard(4, 30, u128::MAX, true),
        ];
        let (a, b) = adjacent_pair(&shards).unwrap();
        assert_eq!(
            (a.id.as_str(), b.id.as_str()),
            ("shardId-000000000003", "shardId-000000000004")
        );
        assert!(adjacent_pair(&shards[..2]).is_none());
    }
}
