//! `flotilla multilang` end to end on loopback servers (ferrokinesis, dynoxide): a
//! MultiLangDaemon properties file, the npm `aws-kcl` client with a processor written
//! as its sample consumer is (`actors/tests/multilang/consumer.js`), no JVM. Needs node
//! and the unpacked package named in `FLOTILLA_TEST_AWS_KCL` (scripts/test.sh sets it).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../actors/tests/support/servers.rs"]
#[allow(dead_code)]
mod servers;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use flotilla_actors::backend::LeaseTable as _;
use flotilla_actors::backend::aws::{DynamoLeaseTable, KinesisStream};
use flotilla_actors::backend::{PutRecord, StreamAdmin as _};
use flotilla_actors::model::Checkpoint;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("flotilla-ml-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The properties file as the npm sample ships it, pointed at the loopback servers,
/// and the flotilla binary on it: every record reaches the child, SIGTERM stops it
/// cleanly, and the table holds the child's checkpoints.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_npm_sample_runs_under_flotilla_multilang() {
    let aws_kcl = std::env::var("FLOTILLA_TEST_AWS_KCL").expect(
        "FLOTILLA_TEST_AWS_KCL must name the unpacked npm aws-kcl package (scripts/test.sh sets it)",
    );
    let dynamodb = servers::start_dynoxide().await;
    let kinesis = servers::start_ferrokinesis(300).await;
    let sdk = servers::sdk_config();
    let stream = KinesisStream::new(&sdk, Some(&kinesis));
    stream.create_stream("kclnodejssample", 2).await.unwrap();
    let records: Vec<PutRecord> = (0..40)
        .map(|i| PutRecord {
            partition_key: format!("key-{}", i % 4),
            explicit_hash_key: None,
            data: format!("key-{}:{}", i % 4, i / 4).into_bytes().into(),
        })
        .collect();
    stream
        .put_records("kclnodejssample", &records)
        .await
        .unwrap();

    let dir = scratch("sample");
    let out = dir.join("out.txt");
    let consumer =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("actors/tests/multilang/consumer.js");
    let properties = dir.join("sample.properties");
    std::fs::write(
        &properties,
        format!(
            "# The npm sample's file, with the loopback servers and a faster poll.\n\
             executableName = node {} {}\n\
             streamName = kclnodejssample\n\
             applicationName = kclnodejssample\n\
             AWSCredentialsProvider = DefaultCredentialsProvider\n\
             processingLanguage = nodejs/0.10\n\
             initialPositionInStream = TRIM_HORIZON\n\
             regionName = us-east-1\n\
             idleTimeBetweenReadsInMillis = 50\n\
             kinesisEndpoint = {kinesis}\n\
             dynamoDBEndpoint = {dynamodb}\n",
            consumer.display(),
            out.display(),
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(["multilang", "--properties", properties.to_str().unwrap()])
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("FLOTILLA_TEST_AWS_KCL", &aws_kcl)
        // flotilla's own layer over the properties.
        .env("FLOTILLA__STATUS__BIND", "127.0.0.1:0")
        .env("FLOTILLA__METRICS__LEVEL", "none")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let lines = std::fs::read_to_string(&out)
            .map(|t| t.lines().count())
            .unwrap_or(0);
        if lines >= records.len() {
            break;
        }
        if Instant::now() > deadline || child.try_wait().unwrap().is_some() {
            let _ = child.kill();
            let output = child.wait_with_output().unwrap();
            panic!(
                "{lines} of {} records reached the child\nstderr: {}",
                records.len(),
                String::from_utf8_lossy(&output.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let output = tokio::task::block_in_place(|| child.wait_with_output()).unwrap();
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{}: {err}", output.status);
    assert!(err.contains("shutdown clean: 2 shards stopped"), "{err}");
    assert!(
        err.contains("processingLanguage is not used"),
        "the unused key is named: {err}"
    );

    let text = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        text.lines().count(),
        records.len(),
        "no record twice:\n{text}"
    );
    let table = DynamoLeaseTable::new(&sdk, Some(&dynamodb), "kclnodejssample");
    let scan = table.scan().await.unwrap();
    assert_eq!(scan.leases.len(), 2);
    for lease in &scan.leases {
        assert_eq!(lease.owner, None, "released: {lease:?}");
        assert!(matches!(lease.checkpoint, Checkpoint::At(_)), "{lease:?}");
    }
}
