//! The `flotilla` binary against a DynamoDB server on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

use flotilla_actors::backend::LeaseTable;
use flotilla_actors::backend::aws::DynamoLeaseTable;
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
    assert_eq!(text(&first.stdout), "lease table cli-app: created\n");
    let again = tokio::task::block_in_place(|| run(vec!["init"]));
    assert_eq!(text(&again.stdout), "lease table cli-app: already exists\n");

    // A lease, a heartbeat and a malformed row, written through the library.
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
    table.heartbeat(&WorkerId::new("w-1")).await.unwrap();

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
