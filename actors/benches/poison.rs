#![allow(clippy::unwrap_used, clippy::expect_used)] // a bench binary: any failure should abort the run loudly
//! Poison records (issue 32): what one record the processor cannot handle costs in a
//! batch of 10,000, with and without `failure.bisect`, and what the good records around
//! it get through.
//!
//! One shard on the memory backend, 10,000 records of 100 B put before the worker
//! starts, `reader.max_records = 10000`, so they come as one batch (checked: the first
//! call is handed all of them). One of them is poison, at the index each case names
//! (by default 6,123, then the first, 0, and the last, 9,999;
//! `FLOTILLA_BENCH_POISON_AT=6123` runs only one). Two processors:
//!
//! * all-or-nothing: refuses any part of a batch holding the poison record and
//!   processes none of it (a transactional write; the case `bisect` exists for);
//! * names it: processes the records before the poison one and fails with
//!   `ProcessorError::msg(..).at_record(&poison)` (Lambda's `batchItemFailures`).
//!
//! "Processing" a record is a checksum over its 100 bytes; `FLOTILLA_BENCH_CALL_MS`
//! (default 0) adds a sleep to every call, as a write's round trip would. Discarded
//! records go to a destination in memory (`Backend::with_dead_letters`).
//!
//! Cases, side by side in each round (every case once per round, in this order),
//! `FLOTILLA_BENCH_RUNS` rounds (default 5), real time on a multi-thread runtime:
//! the baseline (no poison, no `[failure]`); no poison with the policy on; then per
//! poison position, `bisect` with `max_retries` 0 and 2, no `bisect` with 2, and the
//! naming processor with 2, each with the retry backoff
//! (`supervision.restart_backoff_min`/`_max`) at the defaults (100 ms / 30 s) and at
//! 1 ms / 1 ms. For each: wall time from the worker's start to all 10,000 records
//! processed or discarded, the same from the first processor call, the waits (the gaps
//! between a failed call's end and the next call's start: the retry backoff, plus the
//! host's turnaround), processor calls, records handed over (the sum of the parts'
//! sizes), records discarded, and the good records processed per second of wall time.
//!
//!     cargo bench -p flotilla-actors --bench poison [-- CASE...]
//!
//! A filter keeps the cases whose id contains it (`-- bisect-r0`, `-- @6123`, `-- /1ms`).

#[path = "common/stats.rs"]
#[allow(dead_code)]
mod stats;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use base64::Engine as _;
use bytes::Bytes;
use futures::future::BoxFuture;

use flotilla_actors::backend::memory::{
    MemoryDynamo, MemoryMetrics, MemoryStreams, MemoryStreamsConfig,
};
use flotilla_actors::backend::{PutRecord, StreamAdmin};
use flotilla_actors::failure::{DeadLetters, DestinationError, Envelope};
use flotilla_actors::settings::Destination;
use flotilla_actors::{
    Backend, Batch, Checkpointer, MetricsLevel, Processor, ProcessorError, Settings, ShardInfo,
    Worker,
};
use stats::{env_usize, load, spread};

const STREAM: &str = "poison";
const APP: &str = "poison-app";
const RECORDS: usize = 10_000;
const RECORD_BYTES: usize = 100;
const POISON: &[u8] = b"poison";

fn runs() -> usize {
    stats::runs(5)
}

fn positions() -> Vec<usize> {
    std::env::var("FLOTILLA_BENCH_POISON_AT")
        .ok()
        .map(|v| {
            v.split(',')
                .filter_map(|x| x.trim().parse().ok())
                .filter(|&x| x < RECORDS)
                .collect()
        })
        .unwrap_or_else(|| vec![6_123, 0, RECORDS - 1])
}

// ---------------------------------------------------------------------------------------
// What a run counts

/// Everything one run counts, shared by its processor and its destination.
#[derive(Default)]
struct Tally {
    processed: usize,
    discarded: usize,
    /// Whether every discarded record was the poison one, written alone.
    only_poison_discarded: bool,
    calls: usize,
    /// Records handed over, summed over the calls.
    handed: usize,
    first_part: usize,
    first_call: Option<Instant>,
    /// The end of the last call, and whether it failed.
    last_end: Option<(Instant, bool)>,
    /// Gaps after failed calls: the retry waits and the host's turnaround.
    waits: Duration,
    /// When the last record was processed or discarded.
    done: Option<Instant>,
}

type Shared = Arc<Mutex<Tally>>;

impl Tally {
    fn new() -> Shared {
        Arc::new(Mutex::new(Tally {
            only_poison_discarded: true,
            ..Tally::default()
        }))
    }

    fn settle(&mut self) {
        if self.done.is_none() && self.processed + self.discarded >= RECORDS {
            self.done = Some(Instant::now());
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refuses {
    /// Nothing of a part holding the poison record is processed; the error names none.
    AllOrNothing,
    /// The records before the poison one are processed; the error names it.
    Names,
}

struct Refusing {
    tally: Shared,
    refuses: Refuses,
    call_cost: Duration,
}

impl Processor for Refusing {
    async fn process(&mut self, batch: &Batch, _: &Checkpointer) -> Result<(), ProcessorError> {
        let started = Instant::now();
        {
            let mut t = self.tally.lock().unwrap();
            if t.calls == 0 {
                t.first_part = batch.len();
                t.first_call = Some(started);
            }
            t.calls += 1;
            t.handed += batch.len();
            if let Some((end, true)) = t.last_end {
                t.waits += started.saturating_duration_since(end);
            }
        }
        if !self.call_cost.is_zero() {
            tokio::time::sleep(self.call_cost).await;
        }
        let records = batch.records();
        let bad = records.iter().position(|r| r.data.starts_with(POISON));
        let good = match (bad, self.refuses) {
            (None, _) => records,
            (Some(at), Refuses::Names) => &records[..at],
            (Some(_), Refuses::AllOrNothing) => &records[..0],
        };
        let sum: u64 = good
            .iter()
            .map(|r| r.data.iter().map(|&b| u64::from(b)).sum::<u64>())
            .sum();
        std::hint::black_box(sum);
        {
            let mut t = self.tally.lock().unwrap();
            t.processed += good.len();
            t.last_end = Some((Instant::now(), bad.is_some()));
            t.settle();
        }
        match (bad, self.refuses) {
            (None, _) => Ok(()),
            (Some(at), Refuses::Names) => {
                Err(ProcessorError::msg("cannot parse the record").at_record(&records[at]))
            }
            (Some(_), Refuses::AllOrNothing) => Err(ProcessorError::msg(
                "the batch holds a record the sink refuses",
            )),
        }
    }
}

/// The destination: counts what it is given.
#[derive(Clone)]
struct Counting(Shared);

impl DeadLetters for Counting {
    fn write<'a>(
        &'a self,
        envelopes: &'a [Envelope],
    ) -> BoxFuture<'a, Result<(), DestinationError>> {
        Box::pin(async move {
            // Only a lone record is looked at, so a whole discarded batch is not decoded
            // here (a bench's check should not cost what the library is measured on).
            let poison = match envelopes {
                [one] => base64::engine::general_purpose::STANDARD
                    .decode(&one.data)
                    .is_ok_and(|d| d.starts_with(POISON)),
                _ => false,
            };
            let mut t = self.0.lock().unwrap();
            t.discarded += envelopes.len();
            t.only_poison_discarded &= poison;
            t.settle();
            Ok(())
        })
    }

    fn name(&self) -> String {
        "bench:counting".into()
    }
}

// ---------------------------------------------------------------------------------------
// The cases

#[derive(Debug, Clone)]
struct Case {
    id: String,
    what: String,
    poison: Option<usize>,
    /// `(bisect, max_retries)`; `None`: no `[failure]` at all.
    policy: Option<(bool, u32)>,
    refuses: Refuses,
    /// `supervision.restart_backoff_min` / `_max`.
    backoff: (Duration, Duration),
}

fn cases() -> Vec<Case> {
    let defaults = {
        let s = Settings::default();
        (
            s.supervision.restart_backoff_min,
            s.supervision.restart_backoff_max,
        )
    };
    let tiny = (Duration::from_millis(1), Duration::from_millis(1));
    let mut cases = vec![
        Case {
            id: "base".into(),
            what: "no poison, no [failure] (baseline)".into(),
            poison: None,
            policy: None,
            refuses: Refuses::AllOrNothing,
            backoff: defaults,
        },
        Case {
            id: "clean".into(),
            what: "no poison, bisect, max_retries 2".into(),
            poison: None,
            policy: Some((true, 2)),
            refuses: Refuses::AllOrNothing,
            backoff: defaults,
        },
    ];
    for at in positions() {
        for (backoff, b) in [(defaults, "def"), (tiny, "1ms")] {
            let variants = [
                (
                    "bisect-r0",
                    "bisect, max_retries 0",
                    true,
                    0,
                    Refuses::AllOrNothing,
                ),
                (
                    "bisect-r2",
                    "bisect, max_retries 2",
                    true,
                    2,
                    Refuses::AllOrNothing,
                ),
                (
                    "nobisect-r2",
                    "no bisect, max_retries 2 (whole batch discarded)",
                    false,
                    2,
                    Refuses::AllOrNothing,
                ),
                (
                    "named-r2",
                    "names the record, no bisect, max_retries 2",
                    false,
                    2,
                    Refuses::Names,
                ),
            ];
            for (id, what, bisect, retries, refuses) in variants {
                cases.push(Case {
                    id: format!("{id}@{at}/{b}"),
                    what: format!("poison at {at}, {what}, backoff {}", backoff_text(backoff)),
                    poison: Some(at),
                    policy: Some((bisect, retries)),
                    refuses,
                    backoff,
                });
            }
        }
    }
    cases
}

fn backoff_text((min, max): (Duration, Duration)) -> String {
    format!(
        "{} / {}",
        humantime::format_duration(min),
        humantime::format_duration(max)
    )
}

fn settings(case: &Case) -> Settings {
    let mut s = Settings::default();
    s.worker.stream = STREAM.to_owned();
    s.worker.application = APP.to_owned();
    s.worker.worker_id = Some("w".into());
    s.status.enabled = false;
    s.metrics.level = MetricsLevel::None;
    s.reader.max_records = RECORDS as u32;
    s.reader.poll_interval = Duration::from_millis(1);
    s.reader.idle_max = Duration::from_millis(10);
    s.supervision.restart_backoff_min = case.backoff.0;
    s.supervision.restart_backoff_max = case.backoff.1;
    if let Some((bisect, retries)) = case.policy {
        s.failure.bisect = bisect;
        s.failure.max_retries = Some(retries);
        // The counting destination is given to the backend; this says one is set.
        s.failure.destination = Some(Destination::File("unused".into()));
    }
    s
}

/// 10,000 records of 100 B over 1,024 keys, the `poison` one refused.
async fn put(streams: &MemoryStreams, poison: Option<usize>) {
    let records: Vec<PutRecord> = (0..RECORDS)
        .map(|i| {
            let mut data = if poison == Some(i) {
                format!("poison-{i:05}-").into_bytes()
            } else {
                format!("good-{i:05}-").into_bytes()
            };
            data.resize(RECORD_BYTES, b'x');
            PutRecord {
                partition_key: format!("k{}", i % 1024),
                explicit_hash_key: None,
                data: Bytes::from(data),
            }
        })
        .collect();
    for chunk in records.chunks(500) {
        streams.put_records(STREAM, chunk).await.unwrap();
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
struct Measured {
    wall: Duration,
    from_first_call: Duration,
    waits: Duration,
    calls: usize,
    handed: usize,
    processed: usize,
    discarded: usize,
}

impl Measured {
    /// First call → done, less the waits after failed calls, in ms.
    fn work(&self) -> f64 {
        ms(self.from_first_call.saturating_sub(self.waits))
    }

    fn good_rate(&self) -> f64 {
        self.processed as f64 / self.wall.as_secs_f64()
    }
}

async fn run(case: &Case, call_cost: Duration) -> Measured {
    let streams = MemoryStreams::new(MemoryStreamsConfig::default());
    streams.create_stream(STREAM, 1).await.unwrap();
    put(&streams, case.poison).await;
    let tally = Tally::new();
    let backend = Backend::memory(streams, MemoryDynamo::new(), MemoryMetrics::new())
        .with_dead_letters(Arc::new(Counting(tally.clone())));
    let (t, refuses) = (tally.clone(), case.refuses);
    let started = Instant::now();
    let worker = Worker::builder()
        .settings(settings(case))
        .backend(backend)
        .processor(move |_: &ShardInfo| Refusing {
            tally: t.clone(),
            refuses,
            call_cost,
        })
        .start()
        .await
        .unwrap();
    let limit = Duration::from_secs(120);
    let done = loop {
        if let Some(done) = tally.lock().unwrap().done {
            break done;
        }
        assert!(
            started.elapsed() < limit,
            "{}: not every record accounted for in {limit:?}",
            case.id
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    };
    let _ = worker.shutdown().await;
    let t = tally.lock().unwrap();
    assert_eq!(t.first_part, RECORDS, "{}: not one batch", case.id);
    assert_eq!(t.processed + t.discarded, RECORDS, "{}", case.id);
    match (case.poison, case.policy, case.refuses) {
        (None, _, _) => assert_eq!(t.discarded, 0, "{}", case.id),
        (Some(_), Some((false, _)), Refuses::AllOrNothing) => {
            assert_eq!(t.discarded, RECORDS, "{}", case.id);
        }
        (Some(_), _, _) => {
            assert_eq!(t.discarded, 1, "{}", case.id);
            assert!(t.only_poison_discarded, "{}", case.id);
        }
    }
    Measured {
        wall: done - started,
        from_first_call: done - t.first_call.unwrap(),
        waits: t.waits,
        calls: t.calls,
        handed: t.handed,
        processed: t.processed,
        discarded: t.discarded,
    }
}

// ---------------------------------------------------------------------------------------
// The report

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let cases: Vec<Case> = cases()
        .into_iter()
        .filter(|c| filters.is_empty() || filters.iter().any(|f| c.id.contains(f.as_str())))
        .collect();
    let call_cost = Duration::from_millis(env_usize("FLOTILLA_BENCH_CALL_MS", 0) as u64);
    let runs = runs();
    eprintln!(
        "{RECORDS} records of {RECORD_BYTES} B on one shard, one batch; {} cases × {runs} rounds; \
         per-call cost {call_cost:?}",
        cases.len()
    );
    println!("load average at the start: {}", load());
    let mut results: Vec<Vec<Measured>> = vec![Vec::new(); cases.len()];
    runtime.block_on(async {
        // One untimed run, so the first timed case does not pay for cold memory.
        let _ = run(&cases[0], call_cost).await;
        for round in 0..runs {
            for (case, got) in cases.iter().zip(results.iter_mut()) {
                let m = run(case, call_cost).await;
                println!(
                    "round {round} {}: wall {:.1} ms, first call → done {:.2} ms, waits {:.2} ms, \
                     calls {}, handed {}, processed {}, discarded {}, good {:.0} rec/s",
                    case.id,
                    ms(m.wall),
                    ms(m.from_first_call),
                    ms(m.waits),
                    m.calls,
                    m.handed,
                    m.processed,
                    m.discarded,
                    m.good_rate(),
                );
                got.push(m);
            }
        }
    });
    println!("load average at the end: {}", load());
    // Ratios to the baseline of the same round, when it ran: of the wall time, and of
    // the work (first call → done, less the waits) to the baseline's first call → done.
    let base = cases.iter().position(|c| c.id == "base");
    println!();
    println!(
        "| id | case | wall ms | first call → done ms | waits ms | work ms | calls | handed | \
         discarded | good rec/s | wall ÷ base | work ÷ base |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    for (case, got) in cases.iter().zip(&results) {
        let f = |m: fn(&Measured) -> f64| got.iter().map(m).collect::<Vec<f64>>();
        let ratio = |m: fn(&Measured) -> f64, b: fn(&Measured) -> f64| match base {
            Some(i) => {
                let r: Vec<f64> = got
                    .iter()
                    .zip(&results[i])
                    .map(|(x, y)| m(x) / b(y))
                    .collect();
                spread(&r, 2)
            }
            None => "-".into(),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            case.id,
            case.what,
            spread(&f(|m| ms(m.wall)), 1),
            spread(&f(|m| ms(m.from_first_call)), 2),
            spread(&f(|m| ms(m.waits)), 2),
            spread(&f(Measured::work), 2),
            spread(&f(|m| m.calls as f64), 0),
            spread(&f(|m| m.handed as f64), 0),
            spread(&f(|m| m.discarded as f64), 0),
            spread(&f(Measured::good_rate), 0),
            ratio(|m| ms(m.wall), |m| ms(m.wall)),
            ratio(Measured::work, |m| ms(m.from_first_call)),
        );
    }
    eprintln!("rounds: {runs}");
}
