//! The `flotilla` binary against a DynamoDB server on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use flotilla_actors::backend::aws::DynamoLeaseTable;
use flotilla_actors::backend::{LeaseTable, WorkerRows};
use flotilla_actors::model::{Checkpoint, Lease, ShardId, WorkerId};

fn aws_sdk_dynamodb_credentials() -> aws_sdk_dynamodb::config::SharedCredentialsProvider {
    aws_sdk_dynamodb::config::SharedCredentialsProvider::new(
        aws_sdk_dynamodb::config::Credentials::new("test", "test", None, None, "cli-test"),
    )
}

async fn dynoxide() -> String {
    let db = dynoxide::Database::memory().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(dynoxide::server::serve_on(listener, db));
    url
}

fn flotilla(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_then_leases_on_a_local_dynamodb() {
    let endpoint = dynoxide().await;
    let run = |args: Vec<&str>| {
        let mut all = args;
        all.extend(["--table", "cli-app", "--dynamodb-endpoint", &endpoint]);
        let all: Vec<String> = all.into_iter().map(String::from).collect();
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        flotilla(&refs)
    };
    let first = tokio::task::block_in_place(|| run(vec!["init"]));
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert_eq!(
        text(&first.stdout),
        "lease table cli-app: created; on-demand, point-in-time recovery not supported by this server, deletion protection off; heartbeats in cli-app-FlotillaWorkers\n"
    );
    let again = tokio::task::block_in_place(|| run(vec!["init"]));
    assert_eq!(
        text(&again.stdout),
        "lease table cli-app: already exists; on-demand, point-in-time recovery not supported by this server, deletion protection off; heartbeats in cli-app-FlotillaWorkers\n"
    );

    // A lease, a heartbeat and the roster, written through the library.
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb_credentials())
        .load()
        .await;
    let table = DynamoLeaseTable::new(&sdk, Some(&endpoint), "cli-app");
    let lease = Lease::new(
        &ShardId::from_index(3),
        Checkpoint::TrimHorizon,
        vec![ShardId::from_index(1)],
        None,
    );
    table.create_if_absent(&lease).await.unwrap();
    table
        .take(&lease.key, &lease.fence(), &WorkerId::new("w-1"))
        .await
        .unwrap();
    table
        .heartbeat(&WorkerId::new("w-1"), &Default::default())
        .await
        .unwrap();
    table.join_roster(&[WorkerId::new("w-1")]).await.unwrap();

    let leases = tokio::task::block_in_place(|| run(vec!["leases"]));
    assert!(leases.status.success(), "{}", text(&leases.stderr));
    let line: serde_json::Value = serde_json::from_str(text(&leases.stdout).trim()).unwrap();
    assert_eq!(line["lease_key"], "shardId-000000000003");
    assert_eq!(line["owner"], "w-1");
    assert_eq!(line["counter"], 1);
    assert_eq!(line["checkpoint"], "TRIM_HORIZON");
    assert_eq!(line["parents"], serde_json::json!(["shardId-000000000001"]));
    assert!(
        text(&leases.stderr).contains("worker w-1: heartbeat 1"),
        "{}",
        text(&leases.stderr)
    );
    // flotilla's own rows (the roster, the heartbeats) are not another program's.
    assert!(
        !text(&leases.stderr).contains("rows of other programs"),
        "{}",
        text(&leases.stderr)
    );
}

#[test]
fn an_unreachable_endpoint_fails_naming_it() {
    let out = flotilla(&[
        "leases",
        "--table",
        "t",
        "--dynamodb-endpoint",
        "http://127.0.0.1:1",
    ]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("cannot read lease table t") && err.contains("http://127.0.0.1:1"),
        "{err}"
    );
}

/// A settings file in the temp directory, removed on drop.
struct ConfigFile(std::path::PathBuf);

impl ConfigFile {
    fn new(name: &str, text: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("flotilla-cli-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for ConfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn run_with_an_unknown_key_fails_naming_it_and_the_file() {
    let file = ConfigFile::new(
        "unknown-key",
        "[worker]\nstream = \"s\"\napplication = \"app\"\n[lease]\nfailover_tme = \"20s\"\n",
    );
    let out = flotilla(&["run", "--config", file.path()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("failover_tme"), "{err}");
    assert!(err.contains(file.path()), "{err}");
}

#[test]
fn run_with_an_invalid_value_fails_naming_the_key() {
    let file = ConfigFile::new(
        "invalid",
        "[worker]\nstream = \"s\"\napplication = \"app\"\n[lease]\nheartbeat_interval = \"12s\"\n",
    );
    let out = flotilla(&["run", "--config", file.path()]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("lease.heartbeat_interval = 12s"), "{err}");
}

#[test]
fn run_without_a_stream_asks_for_one() {
    let out = flotilla(&["run"]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("worker.stream"), "{err}");
}

async fn ferrokinesis() -> String {
    let options = ferrokinesis::store::StoreOptions {
        create_stream_ms: 10,
        delete_stream_ms: 10,
        update_stream_ms: 10,
        ..ferrokinesis::store::StoreOptions::default()
    };
    let (app, _store) = ferrokinesis::create_app(options);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

/// `flotilla run` end to end on loopback servers: records out as JSON lines, then
/// SIGTERM, a clean shutdown, and the leases released at their checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_prints_records_as_json_lines_and_stops_cleanly_on_sigterm() {
    use std::io::BufRead as _;

    use flotilla_actors::backend::aws::KinesisStream;
    use flotilla_actors::backend::{PutRecord, StreamAdmin as _};

    let dynamodb = dynoxide().await;
    let kinesis = ferrokinesis().await;
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb_credentials())
        .load()
        .await;
    let stream = KinesisStream::new(&sdk, Some(&kinesis));
    stream.create_stream("cli-run", 2).await.unwrap();
    let mut records: Vec<PutRecord> = (0..20)
        .map(|i| PutRecord {
            partition_key: format!("key-{i}"),
            explicit_hash_key: None,
            data: format!("record {i}").into_bytes().into(),
        })
        .collect();
    records.push(PutRecord {
        partition_key: "binary".into(),
        explicit_hash_key: None,
        data: vec![0xff, 0x00, 0x80].into(),
    });
    stream.put_records("cli-run", &records).await.unwrap();

    let config = ConfigFile::new(
        "run",
        &format!(
            "[worker]\nstream = \"cli-run\"\napplication = \"cli-run-app\"\n\
             [reader]\npoll_interval = \"50ms\"\nidle_max = \"200ms\"\n\
             [checkpoint]\ninterval = \"1s\"\n\
             [metrics]\nlevel = \"none\"\n\
             [status]\nbind = \"127.0.0.1:0\"\n\
             [aws]\nregion = \"us-east-1\"\nkinesis_endpoint = \"{kinesis}\"\n\
             dynamodb_endpoint = \"{dynamodb}\"\n"
        ),
    );
    let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["run", "--config", config.path()])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    // Lines until every record has been printed, on a thread: reading blocks.
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = std::collections::BTreeMap::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while seen.len() < records.len() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let line = match lines_rx.recv_timeout(left) {
            Ok(line) => line,
            Err(e) => {
                let _ = child.kill();
                let out = child.wait_with_output().unwrap();
                panic!("{e}: saw {seen:?}\nstderr: {}", text(&out.stderr));
            }
        };
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        let key = value["partition_key"].as_str().unwrap().to_owned();
        seen.insert(key, value);
    }

    let record = &seen["key-7"];
    assert_eq!(record["data"], "record 7");
    // Every line names its stream, and its ARN as the worker's description gave it.
    for line in seen.values() {
        assert_eq!(line["stream"], "cli-run", "{line}");
        assert!(
            line["stream_arn"].as_str().is_some_and(
                |arn| arn.starts_with("arn:aws:kinesis:") && arn.ends_with(":stream/cli-run")
            ),
            "{line}"
        );
    }
    assert!(record.get("data_encoding").is_none(), "{record}");
    assert!(record["shard_id"].as_str().unwrap().starts_with("shardId-"));
    assert!(record["sequence_number"].is_string(), "{record}");
    assert_eq!(record["sub_sequence_number"], 0);
    assert!(
        record["approximate_arrival"]
            .as_str()
            .is_some_and(humantime_like),
        "{record}"
    );
    let binary = &seen["binary"];
    assert_eq!(binary["data"], "/wCA");
    assert_eq!(binary["data_encoding"], "base64");

    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = tokio::task::block_in_place(|| child.wait_with_output()).unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert!(err.contains("shutdown clean: 2 shards stopped"), "{err}");

    // Released, each at a checkpoint past TRIM_HORIZON: the next worker starts there.
    let table = DynamoLeaseTable::new(&sdk, Some(&dynamodb), "cli-run-app");
    let scan = table.scan().await.unwrap();
    assert_eq!(scan.leases.len(), 2);
    for lease in &scan.leases {
        assert_eq!(lease.owner, None, "{lease:?}");
        assert!(matches!(lease.checkpoint, Checkpoint::At(_)), "{lease:?}");
    }
}

/// A misspelt stream stops `flotilla run` before the lease table is made: nothing
/// billable is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_on_a_missing_stream_fails_naming_it_and_creates_no_table() {
    let dynamodb = dynoxide().await;
    let kinesis = ferrokinesis().await;
    let config = ConfigFile::new(
        "missing-stream",
        &format!(
            "[worker]\nstream = \"no-such-stream\"\napplication = \"cli-missing-app\"\n\
             [metrics]\nlevel = \"none\"\n[status]\nbind = \"127.0.0.1:0\"\n\
             [aws]\nregion = \"us-east-1\"\nkinesis_endpoint = \"{kinesis}\"\n\
             dynamodb_endpoint = \"{dynamodb}\"\n"
        ),
    );
    let out = tokio::task::block_in_place(|| flotilla(&["run", "--config", config.path()]));
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("stream no-such-stream"), "{err}");
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb_credentials())
        .load()
        .await;
    let client = aws_sdk_dynamodb::Client::from_conf(
        aws_sdk_dynamodb::config::Builder::from(&sdk)
            .endpoint_url(&dynamodb)
            .build(),
    );
    let tables = client.list_tables().send().await.unwrap().table_names;
    assert_eq!(tables.unwrap_or_default(), Vec::<String>::new());
}

/// `2024-05-01T00:00:00.123Z`: RFC 3339 in UTC with milliseconds.
fn humantime_like(text: &str) -> bool {
    text.len() == 24 && text.ends_with('Z') && text.as_bytes()[10] == b'T'
}

/// `flotilla run` with `worker.streams`: SIGHUP reads the file again and a stream added
/// to the list is read at the next shard sync; a file with a bad list keeps the set and
/// says which key is wrong at ERROR; then SIGTERM stops it cleanly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_rereads_the_stream_list() {
    use std::io::BufRead as _;

    use flotilla_actors::backend::aws::KinesisStream;
    use flotilla_actors::backend::{PutRecord, StreamAdmin as _};

    let dynamodb = dynoxide().await;
    let kinesis = ferrokinesis().await;
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb_credentials())
        .load()
        .await;
    let stream = KinesisStream::new(&sdk, Some(&kinesis));
    for name in ["hup-a", "hup-b"] {
        stream.create_stream(name, 1).await.unwrap();
        let records: Vec<PutRecord> = (0..5)
            .map(|i| PutRecord {
                partition_key: format!("{name}-{i}"),
                explicit_hash_key: None,
                data: format!("record {i}").into_bytes().into(),
            })
            .collect();
        stream.put_records(name, &records).await.unwrap();
    }
    let file = |streams: &str| {
        format!(
            "[worker]\nstreams = {streams}\napplication = \"cli-hup-app\"\n\
             [reader]\npoll_interval = \"50ms\"\nidle_max = \"200ms\"\n\
             shard_sync_interval = \"1s\"\n\
             [checkpoint]\ninterval = \"1s\"\n\
             [metrics]\nlevel = \"none\"\n\
             [status]\nbind = \"127.0.0.1:0\"\n\
             [aws]\nregion = \"us-east-1\"\nkinesis_endpoint = \"{kinesis}\"\n\
             dynamodb_endpoint = \"{dynamodb}\"\n"
        )
    };
    let config = ConfigFile::new("hup", &file("[\"hup-a\"]"));
    let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["run", "--config", config.path()])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut seen = std::collections::BTreeSet::new();
    let mut wait_for = |prefix: &str, child: &mut std::process::Child| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while seen
            .iter()
            .filter(|k: &&String| k.starts_with(prefix))
            .count()
            < 5
        {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match lines_rx.recv_timeout(left) {
                Ok(line) => {
                    let value: serde_json::Value = serde_json::from_str(&line).unwrap();
                    let key = value["partition_key"].as_str().unwrap().to_owned();
                    // Both streams have shardId-000000000000: each line says which.
                    let stream = key.rsplit_once('-').unwrap().0;
                    assert_eq!(value["stream"], stream, "{line}");
                    assert!(
                        value["stream_arn"]
                            .as_str()
                            .is_some_and(|arn| arn.ends_with(&format!(":stream/{stream}"))),
                        "{line}"
                    );
                    seen.insert(key);
                }
                Err(e) => {
                    let _ = child.kill();
                    panic!("{e}: waiting for {prefix}, saw {seen:?}");
                }
            }
        }
        seen.clone()
    };
    let first = tokio::task::block_in_place(|| wait_for("hup-a", &mut child));
    assert!(!first.iter().any(|k| k.starts_with("hup-b")), "{first:?}");
    let signal = |name: &str, child: &std::process::Child| {
        let status = Command::new("kill")
            .args([name, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    // A bad list first: kept running on the old set.
    std::fs::write(&config.0, file("[\"hup-a\", \"hup-a\"]")).unwrap();
    signal("-HUP", &child);
    // Read before it is written again.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    std::fs::write(&config.0, file("[\"hup-a\", \"hup-b\"]")).unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    signal("-HUP", &child);
    tokio::task::block_in_place(|| wait_for("hup-b", &mut child));

    signal("-TERM", &child);
    let out = tokio::task::block_in_place(|| child.wait_with_output()).unwrap();
    let err = text(&out.stderr);
    assert!(out.status.success(), "{}: {err}", out.status);
    assert!(err.contains("shutdown clean: 2 shards stopped"), "{err}");
    assert!(err.contains("worker.streams[1]"), "{err}");
}

/// A MultiLang child that answers every action with its status and nothing else, as a
/// shell script (no interpreter to install).
const ANSWERING_CHILD: &str = r#"while IFS= read -r line; do
    case "$line" in
        *'"action":"initialize"'*) a=initialize ;;
        *'"action":"processRecords"'*) a=processRecords ;;
        *'"action":"shutdownRequested"'*) a=shutdownRequested ;;
        *'"action":"leaseLost"'*) a=leaseLost ;;
        *'"action":"shardEnded"'*) a=shardEnded ;;
        *) continue ;;
    esac
    printf '{"action":"status","responseFor":"%s"}\n' "$a"
done
"#;

/// A scratch directory of its own for one test.
fn scratch(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// `flotilla multilang` as `flotilla run` is: a SIGHUP is said and ignored (its default
/// would end the process with its leases held, no log, no shutdown), and SIGTERM then
/// stops it gracefully.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multilang_survives_sighup_and_stops_cleanly_on_sigterm() {
    use std::io::BufRead as _;

    use flotilla_actors::backend::StreamAdmin as _;
    use flotilla_actors::backend::aws::KinesisStream;

    let dynamodb = dynoxide().await;
    let kinesis = ferrokinesis().await;
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest())
        .region(aws_config::Region::new("us-east-1"))
        .credentials_provider(aws_sdk_dynamodb_credentials())
        .load()
        .await;
    KinesisStream::new(&sdk, Some(&kinesis))
        .create_stream("cli-ml-hup", 1)
        .await
        .unwrap();
    let dir = scratch("ml-hup");
    std::fs::write(dir.join("child.sh"), ANSWERING_CHILD).unwrap();
    let properties = dir.join("app.properties");
    std::fs::write(
        &properties,
        format!(
            "executableName = sh child.sh\nstreamName = cli-ml-hup\n\
             applicationName = cli-ml-hup-app\nregionName = us-east-1\n\
             initialPositionInStream = TRIM_HORIZON\nidleTimeBetweenReadsInMillis = 200\n\
             kinesisEndpoint = {kinesis}\ndynamoDBEndpoint = {dynamodb}\n"
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["multilang", "--properties", properties.to_str().unwrap()])
        .current_dir(&dir)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("FLOTILLA__STATUS__BIND", "127.0.0.1:0")
        .env("FLOTILLA__METRICS__LEVEL", "none")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut log = Vec::new();
    let mut wait_for = |what: &str, child: &mut std::process::Child| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !log.iter().any(|l: &String| l.contains(what)) {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match lines_rx.recv_timeout(left) {
                Ok(line) => log.push(line),
                Err(e) => {
                    let _ = child.kill();
                    panic!("{e}: waiting for {what:?}:\n{}", log.join("\n"));
                }
            }
        }
        log.join("\n")
    };
    tokio::task::block_in_place(|| wait_for("MultiLang child started", &mut child));
    let signal = |name: &str, child: &std::process::Child| {
        let status = Command::new("kill")
            .args([name, &child.id().to_string()])
            .status()
            .unwrap();
        assert!(status.success());
    };
    signal("-HUP", &child);
    let said = tokio::task::block_in_place(|| wait_for("SIGHUP", &mut child));
    assert!(said.contains("nothing is re-read"), "{said}");
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert!(
        child.try_wait().unwrap().is_none(),
        "SIGHUP ended flotilla multilang:\n{said}"
    );
    signal("-TERM", &child);
    let status = tokio::task::block_in_place(|| child.wait()).unwrap();
    let log = tokio::task::block_in_place(|| wait_for("shutdown clean", &mut child));
    assert!(status.success(), "{status}: {log}");
    assert!(log.contains("shutdown clean: 1 shards stopped"), "{log}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// A program `executableName` names that cannot be run stops `flotilla multilang` at
/// start, naming it and why, before any lease is taken (no server is needed to see it):
/// not on PATH, or a file without an executable bit (relative to the working directory).
#[test]
fn multilang_with_a_program_that_cannot_run_fails_at_start_naming_it() {
    let dir = scratch("ml-exec");
    std::fs::write(dir.join("processor.py"), "print('hello')\n").unwrap();
    let properties = dir.join("app.properties");
    let run = |executable: &str| {
        std::fs::write(
            &properties,
            format!(
                "executableName = {executable}\nstreamName = s\napplicationName = app\n\
                 regionName = us-east-1\n\
                 kinesisEndpoint = http://127.0.0.1:9\ndynamoDBEndpoint = http://127.0.0.1:9\n"
            ),
        )
        .unwrap();
        let started = std::time::Instant::now();
        let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["multilang", "--properties", properties.to_str().unwrap()])
            .current_dir(&dir)
            .env("AWS_ACCESS_KEY_ID", "test")
            .env("AWS_SECRET_ACCESS_KEY", "test")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("FLOTILLA__STATUS__BIND", "127.0.0.1:0")
            .output()
            .unwrap();
        assert!(!out.status.success(), "{executable}");
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "failed at once, not after calls to the servers"
        );
        text(&out.stderr)
    };
    let missing = run("no-such-program-of-flotilla processor.py");
    assert!(
        missing.contains(
            "executableName: cannot run \"no-such-program-of-flotilla\": not found on PATH"
        ),
        "{missing}"
    );
    let plain = run("./processor.py");
    assert!(
        plain.contains("executableName: cannot run \"./processor.py\"")
            && plain.contains("is not executable (mode 644)"),
        "{plain}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `FLOTILLA_LOG` that is not a filter (`warning`, a typo of `warn`, would silence
/// every line, ERROR included) stops the command naming the valid levels; a filter with
/// targets is taken as it is.
#[test]
fn an_invalid_log_filter_is_refused_naming_the_levels() {
    // A file with an unknown key: the command fails after the logs are set up.
    let file = ConfigFile::new(
        "log-filter",
        "[worker]\nstream = \"s\"\napplication = \"app\"\n[lease]\nfailover_tme = \"20s\"\n",
    );
    let run = |filter: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_flotilla"))
            .args(["run", "--config", file.path()])
            .env("FLOTILLA_LOG", filter)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{filter}");
        text(&out.stderr)
    };
    for bad in ["warning", "info,verbose", "flotilla=loud"] {
        let err = run(bad);
        assert!(
            err.contains(&format!("FLOTILLA_LOG={bad:?}"))
                && err.contains("the levels are off, error, warn, info, debug, trace"),
            "{bad}: {err}"
        );
        assert!(
            !err.contains("failover_tme"),
            "stopped before the command: {err}"
        );
    }
    for good in [
        "warn",
        "flotilla_actors=debug",
        "info,flotilla_actors=debug",
    ] {
        let err = run(good);
        assert!(err.contains("failover_tme"), "{good}: {err}");
    }
}
