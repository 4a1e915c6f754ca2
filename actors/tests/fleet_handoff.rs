//! Two workers on the memory backend, paused time: a join balances by graceful handoff,
//! a graceful shutdown hands every lease to the live peer, a crash is taken over after
//! the failover time. Handoffs cost no duplicates; nothing is ever lost.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use flotilla_actors::backend::LeaseTable;
use flotilla_actors::backend::faults::FaultPlan;
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::{Settings, Worker};

use support::probe::{Misbehave, ProbeFactory, Producer, fast_settings};
use support::rig::{APP, Feed, Rig, STREAM, keeper, shutdown_clean, wait_held};

const SHARDS: u32 = 8;

fn settings(id: &str) -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.worker.worker_id = Some(id.to_owned());
    s
}

/// Worker `a` takes all 8 leases, then `b` joins and gets half by handoff.
async fn balanced_pair(rig: &Rig, probes: &ProbeFactory) -> (Worker, Worker) {
    let a = rig.start_with(probes, settings("a")).await;
    wait_held(&[&a], &[8], Duration::from_secs(10)).await;
    let b = rig.start_with(probes, settings("b")).await;
    wait_held(&[&a, &b], &[4, 4], Duration::from_secs(5)).await;
    (a, b)
}

fn count(map: &std::collections::BTreeMap<String, u64>, key: &str) -> u64 {
    map.get(key).copied().unwrap_or(0)
}

#[tokio::test(start_paused = true)]
async fn a_joining_worker_gets_its_share_by_handoff_without_duplicates() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());
    let a = rig.start_with(&probes, settings("a")).await;
    wait_held(&[&a], &[8], Duration::from_secs(10)).await;
    probes.wait_distinct(500, Duration::from_secs(30)).await;

    let b = rig.start_with(&probes, settings("b")).await;
    // Two scans to see each other, one to ask, a poll to answer: a few seconds.
    wait_held(&[&a, &b], &[4, 4], Duration::from_secs(5)).await;
    let (ka, kb) = (keeper(&a).await, keeper(&b).await);
    assert_eq!(count(&ka.given, "handed_off"), 4, "{ka:#?}");
    assert_eq!(count(&kb.gained, "handed_off"), 4, "{kb:#?}");
    assert!(ka.held.iter().all(|k| !kb.held.contains(k)));

    // The moves are in the metrics too, by reason.
    let metric = |status: &flotilla_actors::WorkerStatus, name: &str| {
        status
            .metrics
            .as_ref()
            .and_then(|m| m.totals.get(name).copied())
            .unwrap_or(0.0)
    };
    let (sa, sb) = (a.status().await.unwrap(), b.status().await.unwrap());
    assert_eq!(metric(&sa, "LeasesHandedOff"), 4.0);
    assert_eq!(metric(&sb, "LeasesStolen"), 4.0);
    assert_eq!(metric(&sb, "LeasesTaken"), 4.0);
    // Balanced: nothing more moves.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(count(&keeper(&a).await.given, "handed_off"), 4);
    assert_eq!(keeper(&b).await.gained.values().sum::<u64>(), 4);

    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    let verdict = probes.assert_nothing_lost(&producer);
    assert_eq!(verdict.duplicates, 0, "a handoff redelivers nothing");
    for w in [a, b] {
        shutdown_clean(w).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_graceful_shutdown_hands_every_lease_to_the_live_peer() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());
    let (a, b) = balanced_pair(&rig, &probes).await;
    probes.wait_distinct(500, Duration::from_secs(30)).await;

    let started = tokio::time::Instant::now();
    let report = a.shutdown().await.unwrap();
    let took = started.elapsed();
    assert!(report.clean(), "{report:#?}");
    assert_eq!(report.leases.handed_off.len(), 4, "{report:#?}");
    assert!(report.leases.released.is_empty(), "{report:#?}");
    assert_eq!(
        report.shards.len(),
        4,
        "every processor finished: {report:#?}"
    );
    // The peer sees the draining heartbeat within one scan and asks at once; the drain
    // never waits for its time limit when everything is asked for.
    let limit = settings("a").drain_limit();
    assert!(took < limit, "drain took {took:?}, limit {limit:?}");
    wait_held(&[&b], &[8], Duration::from_secs(2)).await;
    assert_eq!(count(&keeper(&b).await.gained, "handed_off"), 8);

    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    let verdict = probes.assert_nothing_lost(&producer);
    assert_eq!(verdict.duplicates, 0, "a handoff redelivers nothing");
    let report = shutdown_clean(b).await;
    assert_eq!(report.leases.released.len(), 8, "no peer left to ask");
}

#[tokio::test(start_paused = true)]
async fn a_crashed_workers_leases_are_taken_after_the_failover_time() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());
    let (a, b) = balanced_pair(&rig, &probes).await;
    probes.wait_distinct(500, Duration::from_secs(30)).await;

    a.abort();
    let failover = settings("b").lease.failover_time;
    // Not before the failover time...
    tokio::time::sleep(failover - Duration::from_secs(1)).await;
    assert_eq!(keeper(&b).await.held.len(), 4);
    // ...and within a heartbeat interval or two after it.
    wait_held(&[&b], &[8], Duration::from_secs(3)).await;
    assert_eq!(count(&keeper(&b).await.gained, "expired"), 4);

    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    probes.assert_nothing_lost(&producer);
    shutdown_clean(b).await;
}

/// The heartbeat index trails the rows by 2 s (an eventually consistent read seen at
/// its worst): a joiner is read by key until the index shows it, so balance is not
/// held up; a crashed worker is judged dead as late as its last counter reaches the
/// index, never earlier than the failover time; nothing is lost.
#[tokio::test(start_paused = true)]
async fn with_a_lagging_heartbeat_index_a_crash_is_taken_over_late_never_early() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let lag = Duration::from_secs(2);
    rig.dynamo.lag_heartbeat_index(lag);
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());
    let (a, b) = balanced_pair(&rig, &probes).await;
    probes.wait_distinct(500, Duration::from_secs(30)).await;

    a.abort();
    let failover = settings("b").lease.failover_time;
    // Not before the failover time (the lag only adds to it)...
    tokio::time::sleep(failover - Duration::from_secs(1)).await;
    assert_eq!(keeper(&b).await.held.len(), 4);
    // ...and within the lag and a heartbeat interval or two after it.
    wait_held(&[&b], &[8], lag + Duration::from_secs(3)).await;
    assert_eq!(count(&keeper(&b).await.gained, "expired"), 4);

    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    probes.assert_nothing_lost(&producer);
    shutdown_clean(b).await;
}

#[tokio::test(start_paused = true)]
async fn a_finished_parents_row_is_deleted_past_retention_once_its_children_started() {
    let config = MemoryStreamsConfig {
        retention: Duration::from_secs(60),
        ..MemoryStreamsConfig::default()
    };
    let rig = Rig::new(2, config).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let mut s = settings("a");
    s.reader.shard_sync_interval = Duration::from_millis(500);
    let a = rig.start_with(&probes, s).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 16, 20).await;
    let parent = rig.shards().await[0].clone();
    rig.split_in_half(&parent).await;
    producer.put_round(&rig.streams, STREAM, 16, 20).await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    let table = rig.table();
    let key = flotilla_actors::model::LeaseKey::from(&parent.id);
    let row = table.get(&key).await.unwrap().unwrap();
    assert!(row.checkpoint.is_shard_end(), "{row:?}");

    // Past retention the parent leaves the listing; its children have started, so its
    // row goes. The children keep theirs, and nothing is read again.
    tokio::time::sleep(Duration::from_secs(70)).await;
    assert!(rig.shards().await.iter().all(|s| s.id != parent.id));
    assert_eq!(table.get(&key).await.unwrap(), None, "parent row deleted");
    let status = a.status().await.unwrap();
    assert_eq!(status.stream_watcher.unwrap().leases_deleted, 1);
    assert_eq!(
        table.scan().await.unwrap().leases.len(),
        3,
        "two children and shard 1"
    );
    producer.put_round(&rig.streams, STREAM, 16, 5).await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    let verdict = probes.assert_nothing_lost(&producer);
    assert_eq!(verdict.duplicates, 0, "the parent was not leased again");
    shutdown_clean(a).await;
}

#[tokio::test(start_paused = true)]
async fn a_whole_fleet_stopping_at_once_releases_without_waiting_for_askers() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let (a, b) = balanced_pair(&rig, &probes).await;

    let started = tokio::time::Instant::now();
    let (ra, rb) = tokio::join!(a.shutdown(), b.shutdown());
    let took = started.elapsed();
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    assert!(ra.clean() && rb.clean(), "{ra:#?} {rb:#?}");
    assert_eq!(ra.leases.released.len() + rb.leases.released.len(), 8);
    // Each sees the other draining at its next scan and stops waiting: well before the
    // drain's own limit of two heartbeat intervals and a poll.
    let s = settings("a");
    let patience = s.lease.heartbeat_interval * 2 + s.lease.handoff_poll_interval;
    assert!(took < patience, "took {took:?}");
}

#[tokio::test(start_paused = true)]
async fn a_shard_being_handed_over_shows_as_handing_off_until_its_batch_is_done() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    // Every batch takes 3 s: the owner is mid-batch when the request comes.
    let probes = ProbeFactory::new(Misbehave {
        slow: Some(Duration::from_secs(3)),
        ..Misbehave::default()
    });
    let feed = Feed::start(rig.streams.clone());
    let a = rig.start_with(&probes, settings("a")).await;
    wait_held(&[&a], &[2], Duration::from_secs(10)).await;
    probes.wait_distinct(1, Duration::from_secs(30)).await;
    let b = rig.start_with(&probes, settings("b")).await;
    let mut seen_handing_off = false;
    for _ in 0..100 {
        let status = a.status().await.unwrap();
        if status
            .shards
            .iter()
            .any(|s| s.state == flotilla_actors::ShardState::HandingOff)
        {
            seen_handing_off = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(seen_handing_off, "no shard of a was ever handing off");
    // The handoff waits for the batch in hand only; the queued ones go to the next owner
    // unprocessed. A handoff that waited for the whole queue (3 s a batch) would take
    // far longer than the shutdown timeout and the report would say so.
    wait_held(&[&a, &b], &[1, 1], Duration::from_secs(30)).await;
    assert_eq!(count(&keeper(&a).await.given, "handed_off"), 1);
    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(3600))
        .await;
    let verdict = probes.assert_nothing_lost(&producer);
    assert_eq!(
        verdict.duplicates, 0,
        "skipped batches were not processed twice"
    );
    for w in [a, b] {
        shutdown_clean(w).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_dead_workers_leases_move_at_the_failover_time_not_a_tick_later() {
    // A failover time that is not a multiple of the heartbeat interval: without a scan
    // at the deadline, the takeover would wait for the next tick, a second later.
    let long = |id: &str| {
        let mut s = settings(id);
        s.lease.heartbeat_interval = Duration::from_secs(2);
        s.lease.failover_time = Duration::from_secs(7);
        s
    };
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let a = rig.start_with(&probes, long("a")).await;
    wait_held(&[&a], &[8], Duration::from_secs(10)).await;
    let b = rig.start_with(&probes, long("b")).await;
    wait_held(&[&a, &b], &[4, 4], Duration::from_secs(20)).await;

    a.abort();
    // Once b has scanned a's last counter, its clock for a runs from that sighting.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let peer = keeper(&b)
        .await
        .peers
        .into_iter()
        .find(|p| p.worker.as_str() == "a")
        .unwrap();
    let since = tokio::time::Instant::now() - Duration::from_millis(peer.silent_ms);
    let failover = long("b").lease.failover_time;
    loop {
        if keeper(&b).await.held.len() == 8 {
            break;
        }
        assert!(
            since.elapsed() < failover + Duration::from_secs(5),
            "never taken"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = since.elapsed();
    assert!(
        took >= failover && took < failover + Duration::from_millis(300),
        "taken {took:?} after a's counter stopped, failover time {failover:?}"
    );
    shutdown_clean(b).await;
}

/// The lease table goes away (every call fails) just before a graceful shutdown, with
/// a live peer that would otherwise be waited for: the drain ends at once instead of
/// at its limit, the shutdown takes a fraction of it, and the report is not clean:
/// it names every shard whose checkpoint was not flushed and every lease not released.
#[tokio::test(start_paused = true)]
async fn a_shutdown_with_the_lease_table_gone_ends_early_and_names_what_it_left() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());
    let (a, table) = rig.start_faulty(&probes, settings("a")).await;
    wait_held(&[&a], &[8], Duration::from_secs(10)).await;
    let b = rig.start_with(&probes, settings("b")).await;
    wait_held(&[&a, &b], &[4, 4], Duration::from_secs(10)).await;
    probes.wait_distinct(500, Duration::from_secs(30)).await;

    let mut gone = FaultPlan::seeded(5);
    gone.transient = 1.0;
    table.set_plan(gone);
    let started = tokio::time::Instant::now();
    let report = a.shutdown().await.unwrap();
    let took = started.elapsed();
    let limit = settings("a").drain_limit();
    assert!(
        took < limit / 3,
        "shutdown took {took:?}; the drain limit is {limit:?}"
    );
    assert!(!report.clean(), "{report:#?}");
    let held: Vec<String> = rig
        .lease_rows()
        .await
        .into_iter()
        .filter(|l| l.owner.as_ref().is_some_and(|o| o.as_str() == "a"))
        .map(|l| l.key.to_string())
        .collect();
    assert_eq!(held.len(), 4, "nothing could be released");
    for key in &held {
        assert!(
            report
                .leases
                .failed
                .iter()
                .any(|f| f.starts_with(key.as_str())),
            "{key} not named: {report:#?}"
        );
        assert!(
            report
                .shards
                .iter()
                .any(|s| s.shard_id.as_str() == key && !s.checkpoint_flushed),
            "{key}'s checkpoint not reported unflushed: {report:#?}"
        );
    }
    assert!(report.leases.released.is_empty(), "{report:#?}");
    assert!(
        report
            .leases
            .failed
            .iter()
            .any(|f| f.contains("heartbeat row")),
        "{report:#?}"
    );

    // The peer takes the leases after the failover time: nothing lost.
    wait_held(&[&b], &[8], Duration::from_secs(20)).await;
    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    probes.assert_nothing_lost(&producer);
    shutdown_clean(b).await;
}

/// Both sides of a handoff log it as one `lease_moved` event each, naming the same giver
/// and taker (the gaining side once named itself as `from`).
#[tokio::test(start_paused = true)]
async fn a_handoff_is_logged_with_the_giver_as_from_on_both_sides() {
    let (events, _guard) = support::events::Events::capture();
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let (a, b) = balanced_pair(&rig, &probes).await;
    let moves = events.with("event", "lease_moved");
    let handed: Vec<_> = moves
        .iter()
        .filter(|e| e.get("reason").map(String::as_str) == Some("handed_off"))
        .collect();
    // Four leases, each logged by the giver and by the taker.
    assert_eq!(handed.len(), 8, "{handed:#?}");
    for e in handed {
        assert_eq!((e["from"].as_str(), e["to"].as_str()), ("a", "b"), "{e:#?}");
    }
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

/// A settled pair reads only the heartbeat rows: no scan for as long as nothing changes,
/// and a change (a third worker joining) makes both scan at their next round, so the
/// join balances as fast as when every round scanned.
#[tokio::test(start_paused = true)]
async fn a_quiet_fleet_reads_heartbeat_rows_and_scans_only_on_change() {
    use flotilla_actors::backend::faults::Faulty;
    let rig = Rig::new(SHARDS + 1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let table = Faulty::new(rig.dynamo.lease_table(APP), FaultPlan::seeded(3));
    let start =
        |id: &str| rig.start_on(rig.backend_with_table(table.clone()), &probes, settings(id));
    let a = start("a").await;
    let b = start("b").await;
    wait_held(&[&a, &b], &[5, 4], Duration::from_secs(10)).await;
    // Let the last moves and the rounds after them settle.
    tokio::time::sleep(Duration::from_secs(5)).await;

    let (scans, reads, items) = (
        table.calls("scan"),
        table.calls("heartbeats"),
        table.items_read("heartbeats"),
    );
    // 20 s: 40 rounds of 500 ms per worker.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(table.calls("scan"), scans, "a quiet fleet scans nothing");
    let rounds = table.calls("heartbeats") - reads;
    assert!((76..=84).contains(&rounds), "{rounds} heartbeat-row reads");
    // Each read is the roster and the lease table's legacy roster (one BatchGetItem),
    // and the two rows it names.
    assert_eq!(table.items_read("heartbeats") - items, 4 * rounds);

    // A join is a change: both scan, and it gets its share in a few rounds as before.
    let c = start("c").await;
    wait_held(&[&a, &b, &c], &[3, 3, 3], Duration::from_secs(5)).await;
    assert!(table.calls("scan") > scans + 2);
    for w in [a, b, c] {
        shutdown_clean(w).await;
    }
}

/// Throughput balance with rare scans: two workers settled on counts, then both of one
/// worker's shards turn hot. No ownership changes, so no change counter moves; the
/// rates in the heartbeats alone must make a round scan (`ScanWhy::Rebalance`) and
/// swap a hot shard for a cold one, long before the 10-minute full scan.
#[tokio::test(start_paused = true)]
async fn shards_turning_hot_on_one_worker_are_spread_without_waiting_for_the_full_scan() {
    use flotilla_actors::backend::{PutRecord, StreamAdmin};
    let rig = Rig::new(4, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let throughput = |id: &str| {
        let mut s = settings(id);
        s.lease.balance = flotilla_actors::settings::BalanceMode::Throughput;
        s
    };
    let a = rig.start_with(&probes, throughput("a")).await;
    let b = rig.start_with(&probes, throughput("b")).await;
    wait_held(&[&a, &b], &[2, 2], Duration::from_secs(10)).await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let hot: Vec<String> = keeper(&a).await.held.to_vec();
    let shards = rig.shards().await;
    let targets: Vec<u128> = shards
        .iter()
        .filter(|s| hot.contains(&s.id.to_string()))
        .map(|s| s.hash_range.start)
        .collect();
    assert_eq!(targets.len(), 2, "{hot:?}");
    let streams = rig.streams.clone();
    let feed = tokio::spawn(async move {
        for i in 0u64.. {
            let records: Vec<PutRecord> = targets
                .iter()
                .map(|hash| PutRecord {
                    partition_key: format!("hot-{i}"),
                    explicit_hash_key: Some(*hash),
                    data: bytes::Bytes::from(vec![b'x'; 4_000]),
                })
                .collect();
            streams.put_records(STREAM, &records).await.unwrap();
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    });
    // Rates take a few heartbeats to be measured; then a swap (two requests).
    let start = tokio::time::Instant::now();
    loop {
        let (ka, kb) = (keeper(&a).await, keeper(&b).await);
        let on = |held: &Vec<String>| hot.iter().filter(|k| held.contains(*k)).count();
        if on(&ka.held) == 1 && on(&kb.held) == 1 {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "hot shards still {} on a, {} on b: {ka:#?} {kb:#?}",
            on(&ka.held),
            on(&kb.held)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    feed.abort();
    for w in [a, b] {
        shutdown_clean(w).await;
    }
}
