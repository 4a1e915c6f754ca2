//! The fleet's recommended worker count end to end, on the memory backend in paused
//! time: a producer puts records at a steady rate, the readers deliver them, each
//! worker's heartbeat reports its records/s, and every worker's keeper judges the
//! fleet from those rows (`flotilla_actors::scale`). A fleet of 2 under a load that
//! needs 4 recommends 4; once 2 more workers join and the leases are shared out, all 4
//! recommend 4 and keep to it (the scale-down margin holds them there).

#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

mod support;

use std::time::Duration;

use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::settings::BalanceMode;
use flotilla_actors::{Settings, Worker};
use support::probe::{Misbehave, ProbeFactory, fast_settings};
use support::rig::{APP, Feed, Rig, STREAM, shutdown_clean, wait_held};

const SHARDS: u32 = 8;
/// The feed puts 32 records every 100 ms: 320 records/s. At 91 per worker that is 3.5
/// workers' worth, so 4, with room for a heartbeat's sampling noise either way (3.0 to
/// 4.0 is still 4); at 4 workers, scaling down to 3 would need the load to fit 3 at 80%
/// of the target (218/s), which it does not.
const TARGET: u64 = 91;
/// How long each wait may take (virtual time: it costs little).
const PATIENCE: Duration = Duration::from_secs(60);
/// Rounds (heartbeats) the figure is watched for once it is reached.
const STEADY_ROUNDS: u32 = 10;
const HEARTBEAT: Duration = Duration::from_secs(2);

fn settings(worker: &str) -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.worker.worker_id = Some(worker.to_owned());
    // A heartbeat's rate is over its interval: 20 of the feed's rounds, so one more or
    // one fewer in a window moves it by 5%.
    s.lease.heartbeat_interval = HEARTBEAT;
    s.lease.failover_time = Duration::from_secs(10);
    // Even lease counts, so the test knows when the fleet is balanced (throughput
    // balance may leave 3, 3, 1, 1 as even by rates).
    s.lease.balance = BalanceMode::Count;
    s.scaling.target_records_per_second = TARGET;
    s
}

/// What a worker publishes: (RecommendedWorkers, FleetWorkers, FleetRecordsPerSecond),
/// `None` until its keeper has judged a round.
async fn published(worker: &Worker) -> Option<(f64, f64, f64)> {
    let metrics = worker.status().await.ok()?.metrics?;
    let get = |name: &str| metrics.totals.get(name).copied();
    Some((
        get("RecommendedWorkers")?,
        get("FleetWorkers")?,
        get("FleetRecordsPerSecond")?,
    ))
}

/// Waits until every worker recommends `want` with `members` live workers, then checks
/// they keep to it for [`STEADY_ROUNDS`] rounds.
async fn settles_on(workers: &[&Worker], want: f64, members: f64) {
    let start = tokio::time::Instant::now();
    loop {
        let mut all = Vec::new();
        for w in workers {
            all.push(published(w).await);
        }
        if all
            .iter()
            .all(|p| p.is_some_and(|(n, m, _)| n == want && m == members))
        {
            break;
        }
        assert!(
            start.elapsed() < PATIENCE,
            "after {PATIENCE:?} the workers publish (recommended, workers, records/s) \
             {all:?}, not {want} of {members}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for round in 0..STEADY_ROUNDS {
        tokio::time::sleep(HEARTBEAT).await;
        for w in workers {
            let (n, m, rate) = published(w).await.unwrap();
            assert_eq!(
                (n, m),
                (want, members),
                "round {round}: the figure moved at {rate} records/s"
            );
            assert!(
                (300.0..=340.0).contains(&rate),
                "round {round}: the fleet's rate {rate} is not the feed's 320/s"
            );
        }
    }
}

#[tokio::test(start_paused = true)]
async fn two_workers_under_a_load_for_four_recommend_four_and_four_keep_to_it() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());
    let a = rig.start_with(&probes, settings("w-a")).await;
    let b = rig.start_with(&probes, settings("w-b")).await;
    wait_held(&[&a, &b], &[4, 4], PATIENCE).await;
    settles_on(&[&a, &b], 4.0, 2.0).await;

    // The autoscaler follows: two more workers.
    let c = rig.start_with(&probes, settings("w-c")).await;
    let d = rig.start_with(&probes, settings("w-d")).await;
    wait_held(&[&a, &b, &c, &d], &[2, 2, 2, 2], PATIENCE).await;
    settles_on(&[&a, &b, &c, &d], 4.0, 4.0).await;

    feed.stop().await;
    for w in [a, b, c, d] {
        shutdown_clean(w).await;
    }
}
