//! A worker of this version beside one of the version before the worker table (which
//! kept heartbeats and the roster in the lease table: `MemoryDynamo::
//! older_version_lease_table`, the older layout's code path), on the memory backend in
//! paused time: they share the shards by handoff both ways, each sees the other alive and
//! takes its leases only once it is dead, and once no older worker is left the lease
//! table holds lease rows only (the Java KCL can read it again), without losing a
//! record or a checkpoint. The adapter-level rules are the contract suite's
//! `beside_an_older_version_neither_breaks_and_the_legacy_rows_retire`, on every backend.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::model::item::AttrValue;
use flotilla_actors::settings::BalanceMode;
use flotilla_actors::{Settings, Worker};

use support::probe::{Misbehave, ProbeFactory, fast_settings};
use support::rig::{APP, Feed, Rig, STREAM, keeper, shutdown_clean, wait_held};

const SHARDS: u32 = 6;

/// Count balance: the shares are exact (throughput balance may leave counts a lease
/// apart when the rates say so), so a lease moving between live workers shows.
fn settings(id: &str) -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.worker.worker_id = Some(id.to_owned());
    s.lease.balance = BalanceMode::Count;
    s
}

/// A worker of the older version: every row in the lease table.
async fn start_older(rig: &Rig, probes: &ProbeFactory, id: &str) -> Worker {
    let table = rig.dynamo.older_version_lease_table(APP);
    rig.start_on(rig.backend_with_table(table), probes, settings(id))
        .await
}

/// The keys of flotilla's own rows in the lease table.
fn own_rows(rig: &Rig) -> Vec<String> {
    rig.dynamo
        .scan_raw(APP)
        .into_iter()
        .filter_map(|row| match row.get("leaseKey") {
            Some(AttrValue::S(key)) if key.starts_with("flotilla-") => Some(key.clone()),
            _ => None,
        })
        .collect()
}

/// Waits until the lease table holds none of flotilla's own rows.
async fn wait_lease_rows_only(rig: &Rig, limit: Duration) -> Duration {
    let start = tokio::time::Instant::now();
    loop {
        if own_rows(rig).is_empty() {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < limit,
            "after {limit:?} the lease table still holds {:?}",
            own_rows(rig)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_new_worker_joins_an_older_one_and_the_older_rows_go_once_it_is_dead() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());
    let old = start_older(&rig, &probes, "old").await;
    wait_held(&[&old], &[6], Duration::from_secs(10)).await;
    assert!(
        own_rows(&rig).contains(&"flotilla-roster".to_owned()),
        "the older version keeps its roster in the lease table"
    );

    // The new worker gets its share from the older one by handoff: each reads the
    // other's heartbeat (the new one writes a copy where the older one reads it).
    let new = rig.start_with(&probes, settings("new")).await;
    wait_held(&[&old, &new], &[3, 3], Duration::from_secs(10)).await;
    assert_eq!(keeper(&new).await.gained.get("handed_off"), Some(&3));
    let mut rows = own_rows(&rig);
    rows.sort();
    assert_eq!(
        rows,
        [
            "flotilla-roster",
            "flotilla-worker#new",
            "flotilla-worker#old"
        ],
        "beside an older worker, the new one writes its heartbeat where it is read"
    );
    // Three failover times side by side: nobody takes a live worker's lease.
    tokio::time::sleep(settings("new").lease.failover_time * 3).await;
    wait_held(&[&old, &new], &[3, 3], Duration::from_secs(1)).await;
    assert_eq!(keeper(&new).await.gained.get("expired"), None);

    // The older worker crashes: its shards move after the failover time, and once it is
    // dead its rows, and the new worker's copies, leave the lease table.
    probes.wait_distinct(300, Duration::from_secs(30)).await;
    old.abort();
    let failover = settings("new").lease.failover_time;
    tokio::time::sleep(failover - Duration::from_secs(1)).await;
    assert_eq!(
        keeper(&new).await.held.len(),
        3,
        "not before the failover time"
    );
    wait_held(&[&new], &[6], Duration::from_secs(3)).await;
    let took = wait_lease_rows_only(&rig, failover + Duration::from_secs(5)).await;
    eprintln!("legacy rows retired {took:?} after the takeover");
    // And they stay gone while the new worker runs on.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(own_rows(&rig).is_empty(), "{:?}", own_rows(&rig));

    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    probes.assert_nothing_lost(&producer);
    shutdown_clean(new).await;
}

#[tokio::test(start_paused = true)]
async fn an_older_worker_joining_a_new_fleet_shares_it_and_leaves_nothing_behind() {
    let rig = Rig::new(SHARDS, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());
    let new = rig.start_with(&probes, settings("new")).await;
    wait_held(&[&new], &[6], Duration::from_secs(10)).await;
    assert!(own_rows(&rig).is_empty(), "the new layout: lease rows only");

    // An older worker starts (a rollback of one host, say): it writes its roster, the
    // new worker finds it at its next round and writes its heartbeat there too before
    // the older one could judge it dead, and the two share the shards by handoff.
    let old = start_older(&rig, &probes, "old").await;
    wait_held(&[&new, &old], &[3, 3], Duration::from_secs(10)).await;
    assert_eq!(keeper(&old).await.gained.get("expired"), None);
    assert_eq!(keeper(&new).await.gained.get("expired"), None);
    tokio::time::sleep(settings("new").lease.failover_time * 3).await;
    wait_held(&[&new, &old], &[3, 3], Duration::from_secs(1)).await;

    // It leaves cleanly: its leases are handed back, its rows removed, and the new
    // worker's copies retired; nothing was delivered twice.
    shutdown_clean(old).await;
    wait_held(&[&new], &[6], Duration::from_secs(5)).await;
    wait_lease_rows_only(&rig, Duration::from_secs(10)).await;

    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(30))
        .await;
    let verdict = probes.assert_nothing_lost(&producer);
    assert_eq!(
        verdict.duplicates, 0,
        "handoffs between versions redeliver nothing"
    );
    shutdown_clean(new).await;
}
