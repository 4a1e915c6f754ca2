//! No stall is silent: a held lease whose row becomes unreadable, a lease row for a
//! shard the stream does not have, a heartbeat that cannot be confirmed, a fan-out shard
//! that cannot subscribe and a MultiLang child that does not answer each show, with the
//! reason, in `/fleet`, `/status`, `/readyz`, `/metrics` and the log of a running
//! worker (real HTTP, the memory backend, real time).
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use flotilla_actors::backend::LeaseTable;
use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::model::item::AttrValue;
use flotilla_actors::model::{Checkpoint, Lease, LeaseKey, ShardId, WorkerId};
use flotilla_actors::{FenceReason, Settings};
use serde_json::Value;

use flotilla_actors::Worker;
use support::http::{get, json_until, url};
use support::probe::{Misbehave, ProbeFactory, fast_settings};
use support::rig::{APP, Feed, Rig, STREAM, heartbeat_outage, keeper, shutdown_clean, wait_held};

fn settings(id: &str) -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.worker.worker_id = Some(id.to_owned());
    s
}

/// The lease of `shard` in a `/fleet` answer.
fn lease<'a>(fleet: &'a Value, shard: &str) -> Option<&'a Value> {
    fleet["leases"]
        .as_array()?
        .iter()
        .find(|l| l["shard_id"] == shard)
}

/// Polls `/metrics` (snapshots are up to a second old) until the worker-wide sample of
/// `name` satisfies `ok`; returns the last text.
async fn metric_until(
    worker: &flotilla_actors::Worker,
    name: &str,
    ok: impl Fn(f64) -> bool,
) -> String {
    let mut text = String::new();
    for _ in 0..50 {
        text = get(&url(worker, "/metrics"), "*/*").await.2;
        if metric(&text, name).is_some_and(&ok) {
            return text;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{name} never as expected:\n{text}");
}

/// The value of an unlabelled-by-shard sample of `name` in Prometheus text.
fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.starts_with(&format!("{name}{{")) && !l.contains("shard="))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_lease_whose_row_turns_unreadable_is_stalled_with_the_attribute_not_lost() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let feed = Feed::start(rig.streams.clone());
    // A row edited by hand changes no heartbeat: the keeper sees it at its next full
    // scan, `full_scan_interval` (minutes by default); here every round.
    let mut fast = settings("a");
    fast.lease.full_scan_interval = fast.lease.heartbeat_interval;
    let a = rig.start_with(&probes, fast).await;
    wait_held(&[&a], &[2], Duration::from_secs(10)).await;
    probes.wait_distinct(100, Duration::from_secs(10)).await;

    let shard = ShardId::from_index(0);
    let key = LeaseKey::from(&shard);
    let good = rig.dynamo.get_raw(APP, key.as_str()).unwrap();
    // An attribute the owner's own checkpoint writes leave alone (a garbage checkpoint
    // would be overwritten by the next one, mending the row).
    let mut bad = good.clone();
    bad.insert("startingHashKey".into(), AttrValue::S("garbage".into()));
    rig.dynamo.put_raw(APP, bad).unwrap();

    let fleet = json_until(&a, "/fleet", "shows the shard stalled", |f| {
        lease(f, shard.as_str()).is_some_and(|l| l["state"] == "stalled")
    })
    .await;
    let row = lease(&fleet, shard.as_str()).unwrap();
    let reason = row["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("unreadable row") && reason.contains("startingHashKey"),
        "{row}"
    );
    assert!(
        fleet["stalled"][0]
            .as_str()
            .unwrap()
            .contains("attribute startingHashKey"),
        "{fleet}"
    );
    // Not "lost to another worker": stopped here, as unreadable.
    let k = keeper(&a).await;
    assert_eq!(k.held, vec![ShardId::from_index(1).to_string()], "{k:?}");
    assert_eq!(k.given.get("unreadable"), Some(&1), "{k:?}");
    assert_eq!(k.given.get("lost"), None, "{k:?}");
    metric_until(&a, "flotilla_leases_unreadable", |v| v == 1.0).await;

    // Repaired: this worker (still the owner by name) picks the shard up again.
    rig.dynamo.put_raw(APP, good).unwrap();
    wait_held(&[&a], &[2], Duration::from_secs(10)).await;
    json_until(&a, "/fleet", "shows the shard held again", |f| {
        lease(f, shard.as_str()).is_some_and(|l| l["state"] == "held")
            && f["stalled"].as_array().is_some_and(Vec::is_empty)
    })
    .await;
    let producer = feed.stop().await;
    probes
        .wait_distinct(producer.total(), Duration::from_secs(20))
        .await;
    shutdown_clean(a).await;
    probes.assert_nothing_lost(&producer);
}

// Current-thread: the log capture sees the events of the test's thread.
#[tokio::test]
async fn a_lease_row_for_a_shard_the_stream_lacks_is_an_orphan_nobody_takes() {
    let (events, _guard) = support::events::Events::capture();
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let table = rig.table();
    table.ensure_table().await.unwrap();
    // One orphan nobody owns, one this worker's own id owns from a past life (which it
    // would otherwise resume at once, before any listing).
    let free = ShardId::new("shardId-000000000098");
    let owned = ShardId::new("shardId-000000000099");
    table
        .create_if_absent(&Lease::new(&free, Checkpoint::TrimHorizon, vec![], None))
        .await
        .unwrap();
    let mut mine = Lease::new(&owned, Checkpoint::TrimHorizon, vec![], None);
    mine.owner = Some(WorkerId::new("a"));
    mine.counter = 3;
    table.create_if_absent(&mine).await.unwrap();

    let probes = ProbeFactory::new(Misbehave::default());
    let a = rig.start_with(&probes, settings("a")).await;
    let fleet = json_until(&a, "/fleet", "shows both orphans stalled", |f| {
        [&free, &owned].iter().all(|s| {
            lease(f, s.as_str()).is_some_and(|l| {
                l["state"] == "stalled"
                    && l["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("not in stream orders"))
            })
        })
    })
    .await;
    assert_eq!(fleet["stalled"].as_array().unwrap().len(), 2, "{fleet}");
    // The real shards are held; the orphans are not.
    wait_held(&[&a], &[2], Duration::from_secs(10)).await;
    let rows = rig.lease_rows().await;
    let row = |s: &ShardId| {
        rows.iter()
            .find(|l| l.key.shard_id() == *s)
            .unwrap()
            .clone()
    };
    assert_eq!(row(&free).owner, None);
    assert_eq!(row(&free).counter, 0, "never taken");
    // Owned by this worker's id from a past life: left as it is, not taken again.
    assert_eq!(row(&owned).owner, Some(WorkerId::new("a")));
    assert_eq!(row(&owned).counter, 3);
    // Still there: a row this worker cannot explain is not deleted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(rig.lease_rows().await.len(), 4);
    assert_eq!(row(&free).counter, 0, "still never taken");
    metric_until(&a, "flotilla_leases_orphaned", |v| v == 2.0).await;
    // One ERROR line for the set, not one per scan.
    let logged = events.with(
        "message",
        "Lease rows for shards the stream does not have: left alone, not taken, not deleted.",
    );
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0]["level"], "ERROR");
    assert!(
        logged[0]["leases"].contains("shardId-000000000098"),
        "{logged:?}"
    );
    assert!(
        logged[0]["leases"].contains("shardId-000000000099"),
        "{logged:?}"
    );
    shutdown_clean(a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_heartbeat_fences_every_shard_and_readyz_says_why() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let (a, table) = rig.start_faulty(&probes, settings("a")).await;
    wait_held(&[&a], &[2], Duration::from_secs(10)).await;
    table.set_plan(heartbeat_outage());

    // Past the fence time (4 s): every shard fenced, with the heartbeat's error.
    let status = json_until(&a, "/status", "shows every shard fenced", |s| {
        s["shards"].as_array().is_some_and(|shards| {
            shards.len() == 2
                && shards
                    .iter()
                    .all(|sh| sh["fenced"]["reason"] == "heartbeat_unconfirmed")
        })
    })
    .await;
    let error = status["shards"][0]["fenced"]["error"].as_str().unwrap();
    assert!(error.contains("throttled"), "{status}");
    assert!(status["leases"]["heartbeat_failures"].as_u64().unwrap() >= 4);
    let (code, _, body) = get(&url(&a, "/readyz"), "*/*").await;
    assert_eq!(code, 503);
    assert!(
        body.contains("failed in a row") && body.contains("throttled"),
        "{body}"
    );
    metric_until(&a, "flotilla_heartbeat_failures", |v| v >= 4.0).await;
    metric_until(&a, "flotilla_shards_fenced", |v| v == 2.0).await;
    let s = a.status().await.unwrap();
    assert!(
        s.shards
            .iter()
            .all(|sh| matches!(sh.fenced, Some(FenceReason::HeartbeatUnconfirmed { .. }))),
        "{s:?}"
    );

    // Confirmed again: ready, nothing fenced.
    table.set_plan(flotilla_actors::backend::faults::FaultPlan::seeded(7));
    json_until(&a, "/status", "shows nothing fenced", |s| {
        s["shards"]
            .as_array()
            .is_some_and(|shards| shards.iter().all(|sh| sh["fenced"].is_null()))
    })
    .await;
    let (code, _, body) = get(&url(&a, "/readyz"), "*/*").await;
    assert_eq!(code, 200, "{body}");
    shutdown_clean(a).await;
}

/// A fan-out shard whose subscriptions keep failing (here every SubscribeToShard call
/// fails, as on a server without it): the worker keeps the lease, and the shard is
/// stalled from the first refusal, everywhere: `/fleet` (the owner's heartbeat reports no
/// open subscription for it, and the owner's view shows it stalled with the refusal),
/// `/status` (state `stalled` with the refusal, its subscription `none`), `/readyz` (503
/// naming it) and `/metrics` (`ShardsStalled`, API errors for the shard). Once
/// subscribing works, the fleet shows it subscribed and the worker is ready.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fanout_shard_that_cannot_subscribe_is_stalled_fleet_wide() {
    use flotilla_actors::backend::faults::{FaultPlan, Faulty};
    use flotilla_actors::settings::ReadMode;

    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut refuse = FaultPlan::seeded(5);
    refuse.only_ops = vec!["SubscribeToShard"];
    refuse.transient = 1.0;
    let streams = Faulty::new(rig.streams.clone(), refuse);
    let backend = rig.backend_with_streams(streams.clone());
    let probes = ProbeFactory::new(Misbehave::default());
    let mut s = settings("a");
    s.reader.mode = ReadMode::Fanout;
    let a = rig.start_on(backend, &probes, s).await;
    wait_held(&[&a], &[1], Duration::from_secs(10)).await;
    let shard = ShardId::from_index(0);

    let fleet = json_until(&a, "/fleet", "shows the held shard unsubscribed", |f| {
        f["read_mode"] == "fanout"
            && lease(f, shard.as_str())
                .is_some_and(|l| l["state"] == "stalled" && l["subscribed_ms"].is_null())
    })
    .await;
    let row = lease(&fleet, shard.as_str()).unwrap();
    assert_eq!(row["owner"], "a");
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("cannot subscribe: SubscribeToShard")),
        "{row}"
    );
    let status = json_until(&a, "/status", "shows the shard stalled", |s| {
        s["shards"][0]["state"] == "stalled"
    })
    .await;
    let stalled = &status["shards"][0];
    assert_eq!(stalled["subscription"]["state"], "none", "{stalled}");
    assert!(
        stalled["stall"]
            .as_str()
            .is_some_and(|e| e.starts_with("cannot subscribe: SubscribeToShard: transient")),
        "{stalled}"
    );
    assert_eq!(status["read_mode"], "fanout");
    let (code, _, body) = get(&url(&a, "/readyz"), "*/*").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("shard shardId-000000000000 is stalled: cannot subscribe: SubscribeToShard"),
        "{body}"
    );
    let text = metric_until(&a, "flotilla_shards_stalled", |v| v == 1.0).await;
    assert!(
        text.lines()
            .any(|l| l.contains("shard=\"shardId-000000000000\"")
                && l.starts_with("flotilla_api_errors")),
        "{text}"
    );

    streams.set_plan(FaultPlan::seeded(6));
    json_until(&a, "/fleet", "shows the shard subscribed", |f| {
        lease(f, shard.as_str())
            .is_some_and(|l| l["subscribed_ms"].is_u64() && l["state"] == "held")
    })
    .await;
    json_until(&a, "/status", "shows the shard read again", |s| {
        s["shards"][0]["state"] != "stalled" && s["shards"][0]["stall"].is_null()
    })
    .await;
    let (code, _, body) = get(&url(&a, "/readyz"), "*/*").await;
    assert_eq!(code, 200, "{body}");
    metric_until(&a, "flotilla_shards_stalled", |v| v == 0.0).await;
    shutdown_clean(a).await;
}

/// A MultiLang child that answers `initialize` and then never answers
/// `processRecords`: past its stall time (half its watchdog, `timeoutInSeconds`) the
/// shard is stalled, naming the action and for how long, in `/status`, the owner's
/// `/fleet`, `/readyz`, `ShardsStalled` and an ERROR, while the child is still waited
/// for; at the watchdog the child is replaced. (It showed `caught_up` until then.)
// Current-thread: the log capture sees the events of the test's thread.
#[tokio::test]
async fn a_multilang_child_that_does_not_answer_is_a_stalled_processor() {
    use flotilla_actors::CheckpointMode;
    use flotilla_actors::multilang::{ChildCommand, MultiLangProcessor};
    use std::sync::Arc;

    let (events, _guard) = support::events::Events::capture();
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let mut producer = support::probe::Producer::default();
    producer.put_round(&rig.streams, STREAM, 2, 5).await;
    // Answers initialize, then reads on and answers nothing.
    let child = r#"while IFS= read -r line; do
        case "$line" in
            *'"action":"initialize"'*) printf '{"action":"status","responseFor":"initialize"}\n' ;;
        esac
    done"#;
    let command = Arc::new(ChildCommand {
        argv: vec!["sh".to_owned(), "-c".to_owned(), child.to_owned()],
        watchdog: Some(Duration::from_secs(8)),
    });
    let mut s = settings("a");
    s.checkpoint.mode = CheckpointMode::Manual;
    let a = Worker::builder()
        .settings(s)
        .backend(rig.backend())
        .processor(move |_| MultiLangProcessor::new(command.clone()))
        .start()
        .await
        .unwrap();
    wait_held(&[&a], &[1], Duration::from_secs(10)).await;
    let shard = ShardId::from_index(0);

    let status = json_until(&a, "/status", "shows the shard stalled", |s| {
        s["shards"][0]["state"] == "stalled"
    })
    .await;
    let stall = status["shards"][0]["stall"].as_str().unwrap().to_owned();
    assert!(
        stall.starts_with("the MultiLang child has not answered processRecords for ")
            && stall.ends_with(" s"),
        "{status}"
    );
    let waited: u64 = stall
        .trim_start_matches("the MultiLang child has not answered processRecords for ")
        .trim_end_matches(" s")
        .parse()
        .unwrap();
    assert!((4..8).contains(&waited), "half the 8 s watchdog: {stall}");
    let fleet = json_until(&a, "/fleet", "shows the shard stalled", |f| {
        lease(f, shard.as_str()).is_some_and(|l| l["state"] == "stalled")
    })
    .await;
    let row = lease(&fleet, shard.as_str()).unwrap();
    assert!(
        row["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("the MultiLang child has not answered processRecords")),
        "{row}"
    );
    let (code, _, body) = get(&url(&a, "/readyz"), "*/*").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains(
            "shard shardId-000000000000 is stalled: the MultiLang child has not answered processRecords"
        ),
        "{body}"
    );
    metric_until(&a, "flotilla_shards_stalled", |v| v == 1.0).await;
    let logged = events.with("message", "Shard stalled: held and not processed.");
    assert_eq!(logged.len(), 1, "{logged:?}");
    assert_eq!(logged[0]["level"], "ERROR");
    assert_eq!(logged[0]["lease_key"], shard.as_str());
    assert!(
        logged[0]["reason"].starts_with("the MultiLang child has not answered processRecords"),
        "{logged:?}"
    );
    a.abort();
}
