//! The status endpoint of running workers, over real HTTP: every route, the fleet
//! view of two workers, Prometheus text, readiness, a taken port, and no credentials in
//! any output.
#![allow(clippy::unwrap_used)]

mod support;

use std::time::Duration;

use flotilla_actors::backend::memory::MemoryStreamsConfig;
use flotilla_actors::settings::ReadMode;
use flotilla_actors::{Backend, Settings, Worker, WorkerError};

use support::http::{get, json_until, url};
use support::probe::{Misbehave, ProbeFactory, Producer, fast_settings, read_mode};
use support::rig::{APP, Rig, STREAM, shutdown_clean};

fn settings(id: &str) -> Settings {
    let mut s = fast_settings(STREAM, APP);
    s.worker.worker_id = Some(id.to_owned());
    // The routes are read on an even split (two shards each). Under throughput balance
    // the producer's burst loads the shards unevenly, and the split stays as the rates
    // say until they have decayed (about ten seconds): these tests are about the routes,
    // not balance, and pin the split count balance gives at once.
    s.lease.balance = flotilla_actors::settings::BalanceMode::Count;
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_route_answers_with_live_data() {
    let rig = Rig::new(4, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let a = rig.start_with(&probes, settings("status-a")).await;
    let b = rig.start_with(&probes, settings("status-b")).await;
    assert!(a.status_addr().unwrap().ip().is_loopback());
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 8, 10).await;
    probes.wait_distinct(80, Duration::from_secs(20)).await;

    // /status: this worker, its shards and its actors.
    let status = json_until(&a, "/status", "shows two shards processing", |s| {
        s["shards"]
            .as_array()
            .is_some_and(|shards| shards.len() == 2)
    })
    .await;
    assert_eq!(status["worker_id"], "status-a");
    assert_eq!(status["application"], APP);
    assert_eq!(status["state"], "running");
    assert!(status["uptime_ms"].as_u64().unwrap() > 0);
    let shard = &status["shards"][0];
    for field in [
        "shard_id",
        "state",
        "checkpoint",
        "millis_behind_latest",
        "records_delivered",
        "bytes_delivered",
        "records_per_second",
        "in_flight_records",
        "restarts",
        "last_error",
    ] {
        assert!(
            shard.get(field).is_some(),
            "shard status lacks {field}: {shard}"
        );
    }
    let core: Vec<&str> = status["core"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert!(core.contains(&"lease_keeper"), "{core:?}");
    assert!(core.contains(&"status_server"), "{core:?}");
    assert!(
        status["core"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["state"] == "running"),
        "{}",
        status["core"]
    );

    // /fleet: both workers and all four leases, from either worker.
    let fleet = json_until(&b, "/fleet", "shows both workers holding two leases", |f| {
        f["workers"].as_array().is_some_and(|w| {
            w.len() == 2 && w.iter().all(|w| w["leases"] == 2 && w["alive"] == true)
        })
    })
    .await;
    assert_eq!(fleet["observer"], "status-b");
    let leases = fleet["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 4);
    assert!(leases.iter().all(|l| l["state"] == "held"), "{leases:?}");
    assert!(fleet["unassigned"].as_array().unwrap().is_empty());
    // The recommended worker count of the observer's last keeper round, judged on both
    // workers and the four leases, with why.
    let fleet = json_until(&b, "/fleet", "recommends a count for both workers", |f| {
        f["scaling"]["inputs"]["workers"] == 2
    })
    .await;
    let scaling = &fleet["scaling"];
    let recommended = scaling["recommended_workers"].as_u64().unwrap();
    assert!((1..=4).contains(&recommended), "{scaling}");
    assert_eq!(scaling["inputs"]["leases"], 4, "{scaling}");
    assert!(scaling["reason"].is_string(), "{scaling}");
    assert!(
        scaling["why"].as_str().is_some_and(|why| !why.is_empty()),
        "{scaling}"
    );
    assert!(scaling["judged_ms_ago"].is_u64(), "{scaling}");
    assert!(fleet["scaling_unknown"].is_null(), "{fleet}");
    // Lags reach the fleet view through the owners' heartbeats.
    json_until(&b, "/fleet", "shows every lease's lag", |f| {
        f["leases"]
            .as_array()
            .is_some_and(|l| l.iter().all(|l| l["millis_behind_latest"].is_u64()))
    })
    .await;

    // The page: by content negotiation and by name.
    let (code, content_type, page) = get(&url(&a, "/fleet"), "text/html").await;
    assert_eq!(code, 200);
    assert!(content_type.starts_with("text/html"), "{content_type}");
    assert!(page.contains("<script>") && page.contains("fleet"));
    let (code, _, same) = get(&url(&a, "/fleet.html"), "*/*").await;
    assert_eq!((code, same), (200, page));

    // Liveness and readiness.
    let (code, _, body) = get(&url(&a, "/healthz"), "*/*").await;
    assert_eq!((code, body.as_str()), (200, "ok\n"));
    let mut ready = String::new();
    for _ in 0..50 {
        let (code, _, body) = get(&url(&a, "/readyz"), "*/*").await;
        ready = body;
        if code == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(ready, "ready\n");

    // Prometheus text: the MetricsReporter's numbers, per worker and per shard. The
    // snapshot is collected once a second: it may predate the first records for a moment.
    // The fleet is balanced now; on a loaded machine status-b may have drained every
    // shard before status-a took its two, so give status-a's shards records of their own.
    producer.put_round(&rig.streams, STREAM, 64, 2).await;
    let processed_total = |text: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with("flotilla_records_processed_total{") && !l.contains("shard="))
            .and_then(|l| l.rsplit(' ').next())
            .unwrap()
            .parse()
            .unwrap()
    };
    let mut text = String::new();
    for _ in 0..50 {
        let (code, content_type, body) = get(&url(&a, "/metrics"), "text/plain").await;
        assert_eq!(code, 200);
        assert!(content_type.starts_with("application/openmetrics-text; version=1.0.0"));
        text = body;
        if processed_total(&text) > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(text.contains("# TYPE flotilla_records_processed counter"));
    assert!(text.contains("# TYPE flotilla_millis_behind_latest gauge"));
    assert!(text.contains("# TYPE flotilla_processing_time_milliseconds histogram"));
    assert!(text.ends_with("# EOF\n"), "{text}");
    assert!(processed_total(&text) > 0.0, "{text}");
    assert!(text.contains("worker=\"status-a\""));
    assert!(text.contains("shard=\"shardId-"));
    // The timings are taken where the work happens: the processor host's acks (batch
    // processing), the reader's GetRecords (polling only: fan-out is pushed) and its
    // delivery (put → delivery).
    let mut timings = vec![
        "flotilla_processing_time_milliseconds",
        "flotilla_put_to_delivery_time_milliseconds",
    ];
    if read_mode() == ReadMode::Polling {
        timings.push("flotilla_get_records_time_milliseconds");
    }
    for timing in timings {
        let count = text
            .lines()
            .find(|l| l.starts_with(&format!("{timing}_count{{")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok());
        assert!(count > Some(0), "{timing}: {count:?}\n{text}");
    }
    dashboard_names_are_served(&text);

    // An unknown path is a 404, not a page.
    let (code, _, _) = get(&url(&a, "/admin"), "*/*").await;
    assert_eq!(code, 404);

    for w in [a, b] {
        shutdown_clean(w).await;
    }
}

/// The worker page (`/status.html`, and `/status` asked for HTML): the supervision tree
/// with a reader and processor per shard, and, after the sampler's second step, each
/// shard's charts drawn with data; the tree's nodes and the charts' points as JSON;
/// `/status` stays JSON for everyone else.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_page_shows_its_tree_and_charts() {
    let rig = Rig::new(2, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let a = rig.start_with(&probes, settings("page-a")).await;
    let mut producer = Producer::default();
    producer.put_round(&rig.streams, STREAM, 8, 10).await;
    probes.wait_distinct(80, Duration::from_secs(20)).await;
    json_until(&a, "/status", "holds both shards", |s| {
        s["shards"].as_array().is_some_and(|s| s.len() == 2)
    })
    .await;

    // JSON stays the default: curl's */* and flotilla status get it.
    for accept in ["*/*", "application/json"] {
        let (code, content_type, body) = get(&url(&a, "/status"), accept).await;
        assert_eq!(code, 200);
        assert!(
            content_type.starts_with("application/json"),
            "{accept}: {content_type}"
        );
        assert!(body.starts_with('{'), "{accept}");
    }
    let browser = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8";
    let (code, content_type, page) = get(&url(&a, "/status"), browser).await;
    assert_eq!(code, 200);
    assert!(content_type.starts_with("text/html"), "{content_type}");
    let (code, _, by_name) = get(&url(&a, "/status.html"), "*/*").await;
    assert_eq!(code, 200);
    for p in [&page, &by_name] {
        assert!(p.contains("id=\"tree\""), "{p}");
        for node in [
            "supervisor",
            "lease_keeper",
            "stream_watcher",
            "reader shardId-000000000000",
            "reader shardId-000000000001",
            "processor",
        ] {
            assert!(
                p.contains(&format!("<span class=\"name\">{node}</span>")),
                "{node}: {p}"
            );
        }
        assert!(!p.contains("<script"), "the page needs no script");
    }

    let tree = json_until(&a, "/status/tree", "shows two readers", |t| {
        t["children"]
            .as_array()
            .is_some_and(|c| c.iter().filter(|n| n["kind"] == "reader").count() == 2)
    })
    .await;
    assert_eq!(tree["kind"], "supervisor");
    assert_eq!(tree["name"], "supervisor");

    // The sampler's first step ran at start (no shards yet); its next, 10 s later, has
    // both shards, and the fleet's view of this worker.
    let has_data = |h: &serde_json::Value, names: &[&str]| {
        names.iter().all(|name| {
            h["series"].as_array().is_some_and(|all| {
                all.iter().any(|s| {
                    s["name"] == *name
                        && s["points"].as_array().is_some_and(|p| {
                            p.len() == 60 && p.iter().any(|p| p["records_per_second"].is_number())
                        })
                })
            })
        })
    };
    let mut history = serde_json::Value::Null;
    for _ in 0..250 {
        let (_, _, body) = get(&url(&a, "/status/history"), "*/*").await;
        history = serde_json::from_str(&body).unwrap();
        if has_data(&history, &["shardId-000000000000", "shardId-000000000001"]) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        has_data(&history, &["shardId-000000000000", "shardId-000000000001"]),
        "{history}"
    );
    assert_eq!(history["step_ms"], 10_000);
    let (_, _, body) = get(&url(&a, "/fleet/history"), "*/*").await;
    let fleet: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(has_data(&fleet, &["page-a"]), "{fleet}");
    // Every chart draws a point once the sampler has one: a shard's lag may come a step
    // after its rate (in fan-out mode, from the subscription's next event).
    let mut page = String::new();
    for _ in 0..250 {
        page = get(&url(&a, "/status.html"), "*/*").await.2;
        if !page.contains("data-points=\"0\"") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(page.matches("<figure class=\"chart\"").count(), 4, "{page}");
    assert!(
        !page.contains("data-points=\"0\""),
        "every chart has a point: {page}"
    );

    shutdown_clean(a).await;
}

/// Every metric name the Grafana dashboard's queries (and its variables) use is a
/// series `/metrics` serves, it has the panels the operators asked for, and no two
/// panels overlap.
fn dashboard_names_are_served(text: &str) {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana/flotilla.json");
    let dashboard: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut queries: Vec<String> = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            queries.push(target["expr"].as_str().unwrap().to_owned());
        }
    }
    for variable in dashboard["templating"]["list"].as_array().unwrap() {
        if variable["type"] == "query" {
            queries.push(variable["query"].as_str().unwrap().to_owned());
        }
    }
    let series: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split(['{', ' ']).next())
        .collect();
    let mut used = 0;
    for query in &queries {
        for (at, _) in query.match_indices("flotilla_") {
            let name: String = query[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                series.contains(name.as_str()),
                "{name} (in {query}) is not served"
            );
            used += 1;
        }
    }
    assert!(used >= 10, "{queries:?}");
    let titles: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["title"].as_str())
        .collect();
    for wanted in [
        "Lag per shard",
        "Records/s",
        "Leases per worker",
        "Failovers",
        "Throttles and API errors",
        "Heartbeat failures",
        "Records discarded (failure policy)",
    ] {
        assert!(titles.contains(&wanted), "{wanted} not in {titles:?}");
    }
    // No panel hides part of another: their grid rectangles do not overlap.
    let grid: Vec<(&str, [u64; 4])> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            let at = |k: &str| p["gridPos"][k].as_u64().unwrap();
            (
                p["title"].as_str().unwrap(),
                [at("x"), at("y"), at("w"), at("h")],
            )
        })
        .collect();
    for (i, (a, [ax, ay, aw, ah])) in grid.iter().enumerate() {
        for (b, [bx, by, bw, bh]) in &grid[i + 1..] {
            let apart = ax + aw <= *bx || bx + bw <= *ax || ay + ah <= *by || by + bh <= *ay;
            assert!(apart, "panels {a:?} and {b:?} overlap");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_port_stops_the_start_with_a_clear_error() {
    let rig = Rig::new(1, MemoryStreamsConfig::default()).await;
    let probes = ProbeFactory::new(Misbehave::default());
    let first = rig.start_with(&probes, settings("port-a")).await;
    let mut clash = settings("port-b");
    clash.status.bind = first.status_addr().unwrap().to_string();
    let f = probes.clone();
    let err = Worker::builder()
        .settings(clash)
        .backend(rig.backend())
        .processor(move |shard| f.make(shard))
        .start()
        .await
        .err()
        .unwrap();
    // One sentence with the cause and the fix, not actor start-up failures nested in
    // each other.
    let taken = first.status_addr().unwrap();
    assert!(
        matches!(&err, WorkerError::StatusBind { addr, .. } if *addr == taken),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        format!(
            "status endpoint: cannot listen on {taken} (address in use); set status.bind to \
             a free address or port 0, or status.enabled = false"
        )
    );
    assert!(!format!("{err:?}").contains("panicked"), "{err:?}");
    // Refused before any actor started: the refused worker never wrote a heartbeat.
    use flotilla_actors::backend::LeaseTable;
    let heartbeats = rig.table().scan().await.unwrap().heartbeats;
    assert!(
        heartbeats.iter().all(|h| h.worker.as_str() != "port-b"),
        "{heartbeats:?}"
    );
    // Disabled: no endpoint, the worker runs.
    let mut off = settings("port-c");
    off.status.enabled = false;
    let worker = rig.start_with(&probes, off).await;
    assert_eq!(worker.status_addr(), None);
    shutdown_clean(worker).await;
    shutdown_clean(first).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_output_shows_credentials() {
    use support::servers;
    let kinesis = servers::start_ferrokinesis(300).await;
    let dynamo = servers::start_dynoxide().await;
    // Distinctive credentials, to look for in every output.
    let key_id = "AKIAFLOTILLASTATUSTEST";
    let secret = "s3cr3t/flotilla+status-endpoint-test";
    let sdk = servers::sdk_config()
        .to_builder()
        .credentials_provider(aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
            aws_sdk_dynamodb::config::Credentials::new(key_id, secret, None, None, "test"),
        ))
        .build();
    let streams = flotilla_actors::backend::aws::KinesisStream::new(&sdk, Some(&kinesis));
    use flotilla_actors::backend::StreamAdmin;
    streams.create_stream("secrets", 1).await.unwrap();
    let mut s = settings("secrets-a");
    s.aws.kinesis_endpoint = Some(kinesis.clone());
    s.aws.dynamodb_endpoint = Some(dynamo.clone());
    let backend = Backend::from_sdk(&sdk, &s.aws);
    s.worker.stream = "secrets".into();
    s.metrics.level = flotilla_actors::MetricsLevel::None;
    let probes = ProbeFactory::new(Misbehave::default());
    let f = probes.clone();
    let worker = Worker::builder()
        .settings(s)
        .backend(backend)
        .processor(move |shard| f.make(shard))
        .start()
        .await
        .unwrap();
    let fleet = json_until(&worker, "/fleet", "shows the lease", |f| {
        f["leases"].as_array().is_some_and(|l| !l.is_empty())
    })
    .await;
    assert_eq!(fleet["workers"][0]["worker_id"], "secrets-a");
    for path in [
        "/status",
        "/status.html",
        "/status/tree",
        "/fleet",
        "/metrics",
        "/readyz",
        "/healthz",
    ] {
        let (_, _, body) = get(&url(&worker, path), "application/json").await;
        for needle in [secret, key_id] {
            assert!(!body.contains(needle), "{path} shows {needle:?}:\n{body}");
        }
    }
    shutdown_clean(worker).await;
}
