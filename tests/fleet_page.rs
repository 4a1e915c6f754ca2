//! The fleet page (actors/src/fleet.html, served as `GET /fleet.html`) in headless
//! Chromium: it must fetch `GET /fleet` and render the fleet with its own script.
//!
//! * `the_page_renders_a_fleet_view`: a fixture server answers `/fleet` with a
//!   hand-written view (only when asked with `Accept: application/json`); the dumped
//!   DOM must hold a row per worker and per lease, the states, the lists and the
//!   lineage, and text that looks like markup must stay text.
//! * `a_failed_fetch_shows_an_error_and_keeps_the_last_data`: the fixture answers once,
//!   then 503: the page shows the error and keeps the rows of the first answer.
//! * `the_page_shows_the_live_demo_fleet_and_its_crash`: `flotilla demo --status-bind
//!   127.0.0.1:0`; the page at the `fleet page:` URL it prints must show its three
//!   workers and every lease before the crash, and a survivor's page the crashed worker
//!   as dead after it. The demo must still pass.
//!
//! * `the_worker_page_renders_its_tree_and_charts`: `/status.html` as the library
//!   draws it (`status_page::render`) for a fixture worker, with a stalled shard and 10
//!   minutes of history with a gap: the DOM must hold every node of the tree in order,
//!   the stall first and marked, each reader's two charts with lines; no console
//!   output; a screenshot saved in the test's output folder.
//!
//! Both pages' screenshots go to `$CARGO_TARGET_TMPDIR/pages/` (fleet.png, status.png),
//! and the fleet page's charts are checked in `the_page_renders_a_fleet_view`.
//!
//! Chromium is `$FLOTILLA_TEST_CHROMIUM` (scripts/test.sh installs Debian's `chromium`
//! and sets it). Built only with the `flotilla-actors/external-servers` feature, as
//! scripts/test.sh runs it; with the feature on and the variable unset the tests fail.

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests: a failed unwrap is a failed test

use std::fs::File;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{Html, IntoResponse};
use axum::routing::get;

const CHROMIUM_VAR: &str = "FLOTILLA_TEST_CHROMIUM";
/// The page as the status endpoint embeds it.
const PAGE: &str = include_str!("../actors/src/fleet.html");
/// Virtual time Chromium gives the page before dumping its DOM: the first fetch and
/// about 3 more polls (one every 2 s).
const VIRTUAL_TIME_MS: u32 = 8000;
/// Wall time for one Chromium run.
const CHROMIUM_LIMIT: Duration = Duration::from_secs(90);

fn chromium() -> PathBuf {
    match std::env::var_os(CHROMIUM_VAR) {
        Some(path) if !path.is_empty() => PathBuf::from(path),
        _ => panic!(
            "{CHROMIUM_VAR} is not set: it must name a Chromium binary (scripts/test.sh \
             installs Debian's `chromium` and sets it to /usr/bin/chromium)"
        ),
    }
}

/// A fresh folder, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(tag: &str) -> Self {
        static NEXT: AtomicUsize = AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("flotilla-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs headless Chromium on `url` with a fresh profile in `dir`, [`VIRTUAL_TIME_MS`] of
/// virtual time and `args` after the common ones, its stderr to `dir/stderr.log`; waits
/// [`CHROMIUM_LIMIT`] at most, then kills it and returns `None`.
fn run_chromium(dir: &TempDir, args: &[&str], url: &str, stdout: Stdio) -> Option<ExitStatus> {
    let chromium = chromium();
    let mut child = Command::new(&chromium)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
        ])
        .arg(format!(
            "--user-data-dir={}",
            dir.0.join("profile").display()
        ))
        .arg(format!("--virtual-time-budget={VIRTUAL_TIME_MS}"))
        .args(args)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(stdout)
        .stderr(File::create(dir.0.join("stderr.log")).unwrap())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "{CHROMIUM_VAR}={}: cannot start it: {e}",
                chromium.display()
            )
        });
    let started = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return Some(status);
        }
        if started.elapsed() > CHROMIUM_LIMIT {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Loads `url` in headless Chromium with a fresh profile and returns the DOM after
/// [`VIRTUAL_TIME_MS`] of virtual time, i.e. after the page's script has run.
fn dump_dom(url: &str) -> String {
    let dir = TempDir::new("chromium");
    let out_path = dir.0.join("dom.html");
    let status = run_chromium(
        &dir,
        &["--dump-dom"],
        url,
        File::create(&out_path).unwrap().into(),
    );
    let dom = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(dir.0.join("stderr.log")).unwrap_or_default();
    let tail: Vec<&str> = stderr
        .lines()
        .rev()
        .take(20)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    match status {
        Some(s) if s.success() && dom.contains("</html>") => dom,
        Some(s) => panic!(
            "chromium exited with {s} on {url}; DOM: {dom}\nstderr:\n{}",
            tail.join("\n")
        ),
        None => panic!(
            "chromium did not finish within {CHROMIUM_LIMIT:?} on {url}\nstderr:\n{}",
            tail.join("\n")
        ),
    }
}

/// Loads `url` in headless Chromium, saves a screenshot as `pages/<name>.png` in the
/// test's output folder, and returns what the page wrote to the console (errors,
/// uncaught exceptions, failed loads): the pages write nothing when all is well.
fn screenshot(url: &str, name: &str) -> (PathBuf, Vec<String>) {
    let dir = TempDir::new("chromium-shot");
    let folder = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("pages");
    std::fs::create_dir_all(&folder).unwrap();
    let png = folder.join(format!("{name}.png"));
    let _ = std::fs::remove_file(&png);
    let screenshot = format!("--screenshot={}", png.display());
    let args = [
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1280,1000",
        screenshot.as_str(),
    ];
    if run_chromium(&dir, &args, url, Stdio::null()).is_none() {
        panic!("chromium did not finish its screenshot of {url} within {CHROMIUM_LIMIT:?}");
    }
    let stderr = std::fs::read_to_string(dir.0.join("stderr.log")).unwrap_or_default();
    let console = stderr
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_owned)
        .collect();
    let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 1000,
        "no screenshot of {url} at {}: {stderr}",
        png.display()
    );
    (png, console)
}

/// The `<tr ...>` start tags of class `class` in a dumped DOM, e.g. all lease rows.
fn rows<'a>(dom: &'a str, class: &str) -> Vec<&'a str> {
    let prefix = format!("<tr class=\"{class}");
    dom.match_indices(&prefix)
        .map(|(at, _)| &dom[at..at + dom[at..].find('>').unwrap()])
        .collect()
}

/// The value of `data-refreshes` on the page's `<main>`: successful fetches so far.
fn refreshes(dom: &str) -> u64 {
    let at = dom
        .find("data-refreshes=\"")
        .expect("no data-refreshes in the DOM")
        + 16;
    dom[at..at + dom[at..].find('"').unwrap()].parse().unwrap()
}

// ---------------------------------------------------------------------------
// The fixture server
// ---------------------------------------------------------------------------

const WORKERS: [&str; 3] = ["demo-1", "demo-2", "demo-3"];
/// A lease whose row cannot be read: stalled, with the reason.
const STALLED: &str = "shardId-000000000009";
const STALLED_REASON: &str =
    "unreadable row: lease row shardId-000000000009: attribute checkpoint: not a sequence number";

const SHARDS: [&str; 4] = [
    "shardId-000000000000",
    "shardId-000000000001",
    "shardId-000000000002",
    "shardId-000000000003",
];
/// The processor's last failure on the held lease, whose reader discarded 2 records.
const LAST_FAILURE: &str =
    "record 49650000000000000000000000000000000000000000000000000124/0: cannot parse";
/// Why the dead worker's load is unknown.
const DEAD_LOAD: &str = "no heartbeat for 15 s";
/// Would add an `<img>` element if the page ever inserted data as markup.
const INJECTED: &str = "<img id=\"injected\" src=\"x\">";

fn fixture_view() -> serde_json::Value {
    // A dead worker's load is unknown: no figures, and why.
    let worker = |id: &str, alive: bool, draining: bool, leases: u64, rps: u64| {
        serde_json::json!({
            "worker_id": id, "alive": alive, "draining": draining, "has_heartbeat": true,
            "leases": leases, "records_per_second": if alive { Some(rps) } else { None },
            "load_unknown": if alive { None } else { Some(DEAD_LOAD) },
            "silent_ms": if alive { 300 } else { 15_000 },
        })
    };
    let lease = |shard: &str,
                 owner: Option<&str>,
                 state: &str,
                 parents: &[&str],
                 children: &[&str]| {
        serde_json::json!({
            "lease_key": shard, "shard_id": shard, "owner": owner, "state": state,
            "checkpoint": "49650000000000000000000000000000000000000000000000000123",
            "counter": 7, "handoff_to": if state == "handing_off" { Some("demo-3") } else { None },
            "parents": parents, "children": children,
            // The dead owner's last lag is not the lag now: unknown.
            "millis_behind_latest": if state == "unassigned" { None } else { Some(1500) },
            // A fan-out fleet: the held lease's owner has a subscription open, the one
            // being handed over has none.
            "subscribed_ms": if state == "held" { Some(62_000) } else { None },
            // The observer's own leases say what `[failure]` did on them: the held one
            // discarded records; others' leases do not say.
            "records_discarded": match (owner, state) {
                (Some("demo-1"), "held") => Some(2),
                (Some("demo-1"), _) => Some(0),
                _ => None,
            },
            "last_failure": if state == "held" { Some(LAST_FAILURE) } else { None },
        })
    };
    serde_json::json!({
        "application": "demo-app",
        "stream": "demo-stream",
        "read_mode": "fanout",
        "observer": "demo-1",
        "scanned_ms_ago": 420,
        "scaling": fixture_scaling(),
        "scaling_unknown": null,
        "workers": [
            worker(WORKERS[0], true, false, 2, 250),
            worker(WORKERS[1], false, false, 1, 0),
            worker(WORKERS[2], true, true, 0, 40),
        ],
        "leases": [
            lease(SHARDS[0], Some(WORKERS[0]), "held", &[], &[SHARDS[2], SHARDS[3]]),
            lease(SHARDS[1], Some(WORKERS[0]), "handing_off", &[], &[]),
            lease(SHARDS[2], Some(WORKERS[1]), "unassigned", &[SHARDS[0]], &[]),
            lease(SHARDS[3], None, "blocked", &[SHARDS[0]], &[]),
            serde_json::json!({
                "lease_key": STALLED, "shard_id": STALLED, "owner": null, "state": "stalled",
                "reason": STALLED_REASON, "checkpoint": null, "counter": null,
                "handoff_to": null, "parents": [], "children": [], "millis_behind_latest": null,
            }),
        ],
        "unassigned": [SHARDS[2]],
        "blocked": [SHARDS[3]],
        "stalled": [format!("{STALLED}: {STALLED_REASON}")],
        "malformed_rows": [INJECTED],
    })
}

/// The observer's last keeper round, as the worker serializes it: 2 workers carrying
/// 4000 records/s at a target of 1000 each need 4.
fn fixture_scaling() -> serde_json::Value {
    use flotilla_actors::scale::{Fleet, Targets, recommend};
    let fleet = Fleet {
        workers: 2,
        leases: 5,
        records_per_second: 4_000,
        ..Fleet::default()
    };
    let targets = Targets {
        records_per_second: 1_000,
        bytes_per_second: 0,
        lag_ms: 60_000,
        scale_down_margin_percent: 20,
    };
    let scaling = flotilla_actors::status::FleetScaling::new(&recommend(&fleet, &targets), 900);
    serde_json::to_value(scaling).unwrap()
}

/// Ten minutes of samples per name: a ramp, with a gap of three steps (the worker was
/// paused) in the first series, and only the last half in the others.
fn fixture_history(names: &[&str]) -> Vec<flotilla_actors::status_history::Series> {
    use flotilla_actors::status_history::{POINTS, Point, Series};
    names
        .iter()
        .enumerate()
        .map(|(n, name)| Series {
            name: (*name).to_owned(),
            points: (0..POINTS)
                .map(|i| {
                    let gap = n == 0 && (30..33).contains(&i);
                    let before = n > 0 && i < POINTS / 2;
                    (!gap && !before).then(|| Point {
                        records_per_second: (i % 20) as f32 * 10.0,
                        lag_ms: Some((POINTS - i) as u32 * 100),
                    })
                })
                .collect(),
        })
        .collect()
}

/// Serves the page and the fixture view on a free loopback port; `/fleet` answers 503
/// after `ok_answers` answers, and 406 to a request that does not accept JSON.
/// Returns the page's URL; the server lives as long as the test's runtime.
async fn fixture_server(ok_answers: usize) -> String {
    let answered = Arc::new(AtomicUsize::new(0));
    let fleet = move |headers: HeaderMap| {
        let answered = Arc::clone(&answered);
        async move {
            let accept = headers
                .get(header::ACCEPT)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            if !accept.contains("application/json") {
                return (StatusCode::NOT_ACCEPTABLE, "ask for application/json").into_response();
            }
            if answered.fetch_add(1, Ordering::SeqCst) >= ok_answers {
                return (StatusCode::SERVICE_UNAVAILABLE, "fixture: gone").into_response();
            }
            axum::Json(fixture_view()).into_response()
        }
    };
    let app = Router::new()
        .route("/fleet.html", get(|| async { Html(PAGE) }))
        .route("/fleet", get(fleet))
        .route(
            "/fleet/history",
            get(|| async {
                axum::Json(
                    serde_json::json!({"step_ms": 10_000, "series": fixture_history(&WORKERS)}),
                )
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/fleet.html")
}

async fn dump_dom_async(url: String) -> String {
    tokio::task::spawn_blocking(move || dump_dom(&url))
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_renders_a_fleet_view() {
    // The page as served holds no data: whatever rows the DOM has, its script made.
    assert!(!PAGE.contains("data-worker=\"") && !PAGE.contains("data-shard=\""));

    let url = fixture_server(usize::MAX).await;
    let dom = dump_dom_async(url).await;

    assert!(refreshes(&dom) >= 2, "the page did not poll again: {dom}");
    let workers = rows(&dom, "worker");
    assert_eq!(workers.len(), WORKERS.len(), "{workers:?}");
    for w in WORKERS {
        assert!(
            workers
                .iter()
                .any(|r| r.contains(&format!("data-worker=\"{w}\""))),
            "no row for {w}: {workers:?}"
        );
    }
    assert!(
        workers[1].starts_with("<tr class=\"worker dead"),
        "{workers:?}"
    );
    assert!(workers[2].contains("draining"), "{workers:?}");

    let leases = rows(&dom, "lease");
    assert_eq!(leases.len(), SHARDS.len() + 1, "{leases:?}");
    for (shard, state) in SHARDS
        .iter()
        .zip(["held", "handing_off", "unassigned", "blocked"])
    {
        let row = format!("<tr class=\"lease\" data-shard=\"{shard}\" data-state=\"{state}\"");
        assert!(leases.contains(&row.as_str()), "no {row}: {leases:?}");
        assert!(
            dom.contains(&format!("class=\"state state-{state}\"")),
            "no state badge {state}"
        );
    }
    for expected in [
        "id=\"application\">demo-app<",
        "id=\"stream\">demo-stream<",
        "id=\"observer\">demo-1<",
        "id=\"scan-age\">420 ms ago<",
        // The recommended worker count, the workers now, and why.
        "<div id=\"scaling\" data-recommended=\"4\">recommended workers: <b>4</b> (now 2): \
         <span class=\"why\">load above the target for 2 workers: 4000 records/s (target \
         1000 per worker)</span></div>",
        "2/3 workers alive; 5 leases: 1 held, 1 handing off, 1 unassigned, 1 blocked, 1 stalled, 0 finished.",
        "class=\"rps\">250 records/s<",
        // The dead worker: its lease count from the table, its load unknown.
        &format!(
            "<span class=\"leases\">1 lease</span>, <span class=\"rps unknown\">load unknown \
             ({DEAD_LOAD})</span>"
        ),
        "496500…000123<", // the checkpoint, shortened
        "1.5 s<",         // the lag
        // The handoff target, and no subscription open for it.
        ">demo-3</td><td class=\"reason\">not subscribed</td></tr>",
        // The held lease's subscription, then what `[failure]` did on it.
        &format!(
            "<td class=\"reason\">subscribed 1.0 min; <span class=\"failures\">discarded 2, \
             last failure: {LAST_FAILURE}</span></td></tr>"
        ),
        "id=\"read-mode\">enhanced fan-out<",
        // The stalled lease: no owner, checkpoint or counter, and why.
        &format!("<tr class=\"lease\" data-shard=\"{STALLED}\" data-state=\"stalled\">"),
        &format!("<td class=\"reason\">{STALLED_REASON}</td></tr>"),
        &format!("<ul id=\"stalled\"><li class=\"stalled mono\">{STALLED}: {STALLED_REASON}</li>"),
        &format!(
            "<ul id=\"unassigned\"><li class=\"shard mono\" data-shard=\"{}\"",
            SHARDS[2]
        ),
        &format!(
            "<ul id=\"blocked\"><li class=\"shard mono\" data-shard=\"{}\"",
            SHARDS[3]
        ),
        &format!("<li class=\"lineage mono\" data-shard=\"{}\">", SHARDS[0]),
    ] {
        assert!(
            dom.contains(expected),
            "{expected:?} is not in the DOM: {dom}"
        );
    }
    // The malformed row is shown as text, not parsed into an element.
    assert!(!dom.contains("<img"), "data was inserted as markup: {dom}");
    assert!(
        dom.contains("&lt;img id=\"injected\""),
        "the malformed row is missing: {dom}"
    );
    assert!(!dom.contains("class=\"shown\""), "an error is shown: {dom}");

    // The charts: a row per worker of /fleet/history, each with two drawn lines; the
    // first worker's gap breaks its lines in two.
    let charts = rows(&dom, "chart-row");
    assert_eq!(charts.len(), WORKERS.len(), "{dom}");
    assert_eq!(dom.matches("<svg class=\"chart rps\"").count(), 3, "{dom}");
    assert_eq!(dom.matches("<svg class=\"chart lag\"").count(), 3, "{dom}");
    assert!(
        dom.contains("data-points=\"57\""),
        "the first worker's samples: {dom}"
    );
    assert_eq!(dom.matches("<polyline").count(), 2 * 2 + 2 * 2, "{dom}");

    let url = fixture_server(usize::MAX).await;
    let (png, console) = tokio::task::spawn_blocking(move || screenshot(&url, "fleet"))
        .await
        .unwrap();
    assert!(console.is_empty(), "console output: {console:?}");
    report(&format!("fleet page screenshot: {}", png.display()));
}

/// A worker with a processing shard, a fenced one and a restarting one, for the worker
/// page.
fn fixture_worker() -> flotilla_actors::status::WorkerStatus {
    use flotilla_actors::FenceReason;
    use flotilla_actors::model::ShardId;
    use flotilla_actors::status::{
        BudgetView, CoreActorStatus, ShardState, ShardStatus, WorkerStatus,
    };
    let shard = |index: u64, state: ShardState| ShardStatus {
        shard_id: ShardId::from_index(index),
        stream: None,
        state,
        lease_counter: 3,
        checkpoint: Some("49650000000000000000000000000000000000000000000000000123".into()),
        last_delivered: None,
        millis_behind_latest: Some(1500),
        records_delivered: 4521,
        bytes_delivered: 1_000_000,
        records_per_second: 120.0,
        bytes_per_second: 24_000.0,
        last_error: None,
        last_error_ms_ago: None,
        in_flight_records: 7,
        in_flight_bytes: 700,
        memory_bytes: 2_100,
        restarts: 0,
        fenced: None,
        stall: None,
        subscription: None,
        records_discarded: 0,
        last_failure: None,
        lanes: Vec::new(),
    };
    WorkerStatus {
        worker_id: "demo-1".into(),
        application: "demo-app".into(),
        stream: "demo-stream".into(),
        source: "kinesis",
        read_mode: "polling",
        state: "running",
        uptime_ms: 3_723_000,
        shutting_down: false,
        shards: vec![
            shard(0, ShardState::Processing),
            ShardStatus {
                fenced: Some(FenceReason::Revoked {
                    why: INJECTED.to_owned(),
                }),
                ..shard(1, ShardState::Fenced)
            },
            ShardStatus {
                restarts: 2,
                last_error: Some("processor failed: boom".into()),
                last_error_ms_ago: Some(12_000),
                ..shard(2, ShardState::Restarting)
            },
        ],
        shard_restarts: 2,
        core: [
            "stream_watcher",
            "lease_keeper",
            "checkpoint_writer",
            "metrics_reporter",
        ]
        .into_iter()
        .map(|name| CoreActorStatus {
            name,
            state: "running".into(),
            restarts: 0,
        })
        .collect(),
        leases: None,
        stream_watcher: None,
        checkpoints: Default::default(),
        metrics: None,
        budget: BudgetView {
            total_bytes: 268_435_456,
            in_use_bytes: 6_300,
            share_bytes: 89_478_485,
            shards: 3,
            shards_waiting: 0,
            peak_bytes: 6_300,
        },
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_page_renders_its_tree_and_charts() {
    let status = fixture_worker();
    let charts = fixture_history(&[SHARDS[0], SHARDS[1], SHARDS[2]]);
    let page = flotilla_actors::status_page::render(&status, &charts);
    let app = Router::new().route("/status.html", get(move || async move { Html(page) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let url = format!("http://{addr}/status.html");

    let dom = dump_dom_async(url.clone()).await;
    // Every node of the tree, in the tree's order.
    let mut at = 0;
    for (_, node) in flotilla_actors::status_tree::tree(&status).walk() {
        let needle = format!("<span class=\"name\">{}</span>", node.name);
        let found = dom[at..].find(&needle);
        assert!(
            found.is_some(),
            "{} missing or out of order: {dom}",
            node.name
        );
        at += found.unwrap();
    }
    // The stalls come first and are marked; markup in a reason stays text.
    let stalls = dom.find("id=\"stalls\"").expect("no stalls banner");
    assert!(stalls < dom.find("id=\"tree\"").unwrap(), "{dom}");
    assert!(dom.contains("<b>2 not processed:</b>"), "{dom}");
    assert_eq!(
        dom.matches("<li class=\"node reader stalled\">").count(),
        2,
        "{dom}"
    );
    assert!(!dom.contains("<img"), "data was inserted as markup: {dom}");
    assert!(
        dom.contains("restarting after a failure: processor failed: boom"),
        "{dom}"
    );
    assert!(
        dom.contains("last error: processor failed: boom (12s ago)"),
        "{dom}"
    );
    // Two charts per reader, drawn with data; the first shard's gap breaks its lines.
    assert_eq!(dom.matches("<figure class=\"chart\"").count(), 6, "{dom}");
    assert!(!dom.contains("data-points=\"0\""), "{dom}");
    assert_eq!(dom.matches("<polyline").count(), 2 * 2 + 2 * 2, "{dom}");

    let (png, console) = tokio::task::spawn_blocking(move || screenshot(&url, "status"))
        .await
        .unwrap();
    assert!(console.is_empty(), "console output: {console:?}");
    report(&format!("worker page screenshot: {}", png.display()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_fetch_shows_an_error_and_keeps_the_last_data() {
    let url = fixture_server(1).await;
    let dom = dump_dom_async(url).await;

    assert_eq!(refreshes(&dom), 1, "{dom}");
    assert!(
        dom.contains("<div id=\"error\" role=\"alert\" class=\"shown\">"),
        "no error shown: {dom}"
    );
    assert!(
        dom.contains("Could not load the fleet view (HTTP 503)"),
        "{dom}"
    );
    assert!(
        dom.contains("<main id=\"fleet\" data-refreshes=\"1\" class=\"stale\">"),
        "{dom}"
    );
    assert_eq!(
        rows(&dom, "worker").len(),
        WORKERS.len(),
        "the last data is gone: {dom}"
    );
    assert_eq!(
        rows(&dom, "lease").len(),
        SHARDS.len() + 1,
        "the last data is gone: {dom}"
    );
}

// ---------------------------------------------------------------------------
// `flotilla demo`
// ---------------------------------------------------------------------------

/// A running `flotilla demo`, its stderr lines as they arrive. Dropping it kills the
/// process; when the test is panicking it also prints the last lines of its stderr.
struct Demo {
    child: Child,
    lines: mpsc::Receiver<String>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Demo {
    fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .arg("demo")
            .args(args)
            .env_remove("FLOTILLA_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let (send, lines) = mpsc::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let seen_by_reader = Arc::clone(&seen);
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                seen_by_reader.lock().unwrap().push(line.clone());
                let _ = send.send(line);
            }
        });
        Self { child, lines, seen }
    }

    /// The next stderr line starting with `prefix`, without it; panics after `limit`.
    fn line_after(&self, prefix: &str, limit: Duration) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return rest.to_owned();
                    }
                }
                Err(e) => panic!("no stderr line {prefix:?} within {limit:?} ({e})"),
            }
        }
    }

    fn wait(&mut self, limit: Duration) -> ExitStatus {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(
                Instant::now() < deadline,
                "the demo did not exit within {limit:?}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Demo {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let seen = self.seen.lock().unwrap();
            let tail = &seen[seen.len().saturating_sub(30)..];
            eprintln!(
                "--- last lines of the demo's stderr ---\n{}",
                tail.join("\n")
            );
        }
    }
}

/// `GET {base}/fleet` as JSON, or `None` when it does not answer 200 with JSON.
fn fleet_json(base: &str) -> Option<serde_json::Value> {
    let host = base.strip_prefix("http://")?;
    let mut stream = TcpStream::connect(host).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(
        stream,
        "GET /fleet HTTP/1.1\r\nHost: {host}\r\nAccept: application/json\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200").then_some(())?;
    serde_json::from_str(body).ok()
}

/// Polls `GET {base}/fleet` until `done` holds for the view; panics after `limit`.
fn fleet_until(
    base: &str,
    what: &str,
    limit: Duration,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    let mut last = None;
    while Instant::now() < deadline {
        if let Some(view) = fleet_json(base) {
            if done(&view) {
                return view;
            }
            last = Some(view);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    panic!("{base}/fleet never {what} within {limit:?}; last view: {last:?}")
}

/// The worker ids of a view, with whether each is alive.
fn view_workers(view: &serde_json::Value) -> Vec<(String, bool)> {
    view["workers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| {
            (
                w["worker_id"].as_str().unwrap().to_owned(),
                w["alive"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// The `data-shard` values of a dumped DOM's lease rows.
fn lease_shards(dom: &str) -> Vec<String> {
    rows(dom, "lease")
        .iter()
        .map(|row| {
            let at = row.find("data-shard=\"").unwrap() + 12;
            row[at..at + row[at..].find('"').unwrap()].to_owned()
        })
        .collect()
}

#[test]
fn the_page_shows_the_live_demo_fleet_and_its_crash() {
    let _ = chromium(); // fail before starting anything when it is not set
    let mut demo = Demo::start(&["--duration", "20", "--status-bind", "127.0.0.1:0"]);
    let page = demo.line_after("fleet page: ", Duration::from_secs(30));
    let base = page
        .strip_suffix("/fleet.html")
        .expect("a URL ending in /fleet.html")
        .to_owned();
    let mut status_urls = Vec::new();
    for _ in 0..3 {
        let rest = demo.line_after("status: ", Duration::from_secs(10));
        let (id, url) = rest.split_once(' ').unwrap();
        status_urls.push((
            id.to_owned(),
            url.strip_suffix("/status").unwrap().to_owned(),
        ));
    }

    // Before the crash (a third of the way in): all three workers, every shard leased.
    let before = fleet_until(
        &base,
        "showed 3 live workers and every lease held",
        Duration::from_secs(6),
        |v| {
            view_workers(v).iter().filter(|(_, alive)| *alive).count() == 3
                && v["leases"].as_array().is_some_and(|l| !l.is_empty())
                && v["unassigned"].as_array().is_some_and(Vec::is_empty)
        },
    );
    let dom = dump_dom(&page);
    assert!(refreshes(&dom) >= 1, "{dom}");
    assert!(
        !dom.contains("class=\"shown\""),
        "the page shows an error: {dom}"
    );
    // Every lease dealt: the keeper has judged a round, and the page shows its figure.
    assert!(
        before["scaling"]["recommended_workers"].is_u64(),
        "{}",
        before["scaling"]
    );
    let recommended = dom
        .split_once("<div id=\"scaling\" data-recommended=\"")
        .and_then(|(_, rest)| rest.split('"').next())
        .unwrap_or_default();
    assert!(
        recommended.parse::<u32>().is_ok_and(|n| n >= 1),
        "no recommended worker count on the page: {dom}"
    );
    for (id, _) in view_workers(&before) {
        let row = format!("<tr class=\"worker alive\" data-worker=\"{id}\"");
        assert!(dom.contains(&row), "no {row} in the DOM: {dom}");
    }
    let shown = lease_shards(&dom);
    for lease in before["leases"].as_array().unwrap() {
        let shard = lease["shard_id"].as_str().unwrap();
        assert!(
            shown.iter().any(|s| s == shard),
            "no lease row for {shard}: {shown:?}"
        );
    }
    report(&format!(
        "before the crash: {} workers, lease rows {shown:?}",
        view_workers(&before).len()
    ));

    // The crash: a survivor's page shows the victim dead.
    let victim = demo.line_after("demo: crashed ", Duration::from_secs(20));
    let victim = victim.split(' ').next().unwrap().to_owned();
    let (_, survivor) = status_urls.iter().find(|(id, _)| *id != victim).unwrap();
    let after = fleet_until(
        survivor,
        &format!("showed {victim} dead"),
        Duration::from_secs(15),
        |v| {
            view_workers(v)
                .iter()
                .any(|(id, alive)| *id == victim && !alive)
        },
    );
    let dead_worker = after["workers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["worker_id"] == victim.as_str())
        .unwrap();
    assert!(
        dead_worker["records_per_second"].is_null()
            && dead_worker["load_unknown"]
                .as_str()
                .is_some_and(|why| why.starts_with("no heartbeat for ")),
        "{dead_worker}"
    );
    let dom = dump_dom(&format!("{survivor}/fleet.html"));
    let dead = format!("<tr class=\"worker dead\" data-worker=\"{victim}\"");
    assert!(dom.contains(&dead), "no {dead} in the DOM: {dom}");
    // Its load is unknown, not the records/s of its last heartbeat.
    let at = dom.find(&dead).unwrap();
    let row = &dom[at..at + dom[at..].find("</tr>").unwrap()];
    assert!(
        row.contains("class=\"rps unknown\">load unknown (no heartbeat for "),
        "the dead worker's row: {row}"
    );
    let alive = rows(&dom, "worker alive").len();
    assert_eq!(
        alive,
        2,
        "live worker rows after the crash: {:?}",
        rows(&dom, "worker")
    );
    report(&format!(
        "after the crash of {victim}: {:?}",
        rows(&dom, "worker")
    ));

    let status = demo.wait(Duration::from_secs(90));
    assert!(status.success(), "the demo failed: {status}");
}

/// A line past libtest's capture, to show what the page rendered in every run.
fn report(line: &str) {
    let _ = writeln!(std::io::stderr(), "fleet_page: {line}");
}
