//! The operator commands of the `flotilla` binary (status, init --stream, rewind,
//! position export/import) against in-process servers on loopback.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
#[path = "../actors/tests/support/servers.rs"]
mod servers;

use std::collections::BTreeMap;
use std::process::Output;
use std::time::Duration;

use flotilla_actors::backend::aws::DynamoLeaseTable;
use flotilla_actors::backend::{LeaseTable, WorkerRows};
use flotilla_actors::model::{
    Checkpoint, ExtendedSequenceNumber, Lease, LeaseKey, SequenceNumber, ShardId, WorkerId,
};

const SEQ: &str = "49680458031169431967754064162084943116060673600470908946";

async fn flotilla(args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_flotilla"))
        .args(args)
        .env("AWS_ACCESS_KEY_ID", "test")
        .env("AWS_SECRET_ACCESS_KEY", "test")
        .env("AWS_REGION", "us-east-1")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env_remove("FLOTILLA__LEASE__FAILOVER_TIME")
        .env_remove("FLOTILLA__AWS__KINESIS_ENDPOINT")
        .env_remove("FLOTILLA_STATUS_URL")
        .output()
        .await
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[track_caller]
fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// A lease table on a fresh dynoxide, with the binary's flags to reach it.
struct Fixture {
    endpoint: String,
    app: String,
    table: DynamoLeaseTable,
}

impl Fixture {
    async fn new(app: &str) -> Self {
        let endpoint = servers::start_dynoxide().await;
        Self::on(endpoint, app).await
    }

    async fn on(endpoint: String, app: &str) -> Self {
        let table = DynamoLeaseTable::new(&servers::sdk_config(), Some(&endpoint), app);
        table.ensure_table().await.unwrap();
        Self {
            endpoint,
            app: app.to_owned(),
            table,
        }
    }

    /// `flotilla <command...> --table APP --dynamodb-endpoint URL <extra...>`.
    async fn run(&self, command: &[&str], extra: &[&str]) -> Output {
        let mut args = command.to_vec();
        args.extend(["--table", &self.app, "--dynamodb-endpoint", &self.endpoint]);
        args.extend(extra);
        flotilla(&args).await
    }

    async fn lease(&self, index: u64, checkpoint: Checkpoint) -> Lease {
        self.lease_of(None, index, checkpoint).await
    }

    /// A lease row as a worker reading `source` creates it (`flotillaSource`).
    async fn lease_of(&self, source: Option<&str>, index: u64, checkpoint: Checkpoint) -> Lease {
        let mut lease = Lease::new(
            &ShardId::from_index(index),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        lease.source = source.map(str::to_owned);
        assert!(self.table.create_if_absent(&lease).await.unwrap());
        if checkpoint != Checkpoint::TrimHorizon {
            self.table
                .checkpoint(&lease.key, &lease.fence(), &checkpoint, &[])
                .await
                .unwrap();
        }
        self.get(index).await
    }

    async fn get(&self, index: u64) -> Lease {
        let key = LeaseKey::from(&ShardId::from_index(index));
        self.table.get(&key).await.unwrap().unwrap()
    }

    async fn checkpoints(&self) -> BTreeMap<String, Checkpoint> {
        let scan = self.table.scan().await.unwrap();
        scan.leases
            .into_iter()
            .map(|l| (l.key.as_str().to_owned(), l.checkpoint))
            .collect()
    }
}

fn at(sub: u64) -> Checkpoint {
    Checkpoint::At(ExtendedSequenceNumber::new(
        SequenceNumber::parse(SEQ).unwrap(),
        sub,
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewind_sets_every_unfinished_lease_and_leaves_shard_end_ones() {
    let fx = Fixture::new("rewind-app").await;
    fx.lease(0, at(0)).await;
    fx.lease(1, Checkpoint::ShardEnd).await;
    fx.lease(2, Checkpoint::Latest).await;
    fx.lease(3, at(7)).await;

    let out = fx.run(&["rewind"], &["--to", "trim-horizon"]).await;
    assert_ok(&out);
    let cps = fx.checkpoints().await;
    assert_eq!(cps["shardId-000000000000"], Checkpoint::TrimHorizon);
    assert_eq!(cps["shardId-000000000001"], Checkpoint::ShardEnd);
    assert_eq!(cps["shardId-000000000002"], Checkpoint::TrimHorizon);
    assert_eq!(cps["shardId-000000000003"], Checkpoint::TrimHorizon);
    let stdout = text(&out.stdout);
    assert!(
        stdout.contains("shardId-000000000001: SHARD_END, finished, left as is"),
        "{stdout}"
    );
    assert!(
        text(&out.stderr).contains("3 leases set to TRIM_HORIZON"),
        "{}",
        text(&out.stderr)
    );

    let out = fx.run(&["rewind"], &["--to", "LATEST"]).await;
    assert_ok(&out);
    let cps = fx.checkpoints().await;
    assert_eq!(cps["shardId-000000000001"], Checkpoint::ShardEnd);
    for shard in [0, 2, 3] {
        assert_eq!(
            cps[&format!("shardId-00000000000{shard}")],
            Checkpoint::Latest
        );
    }

    // A time writes the KCL sentinel and says what the workers need to know it.
    let out = fx.run(&["rewind"], &["--to", "2024-05-01T00:00:00Z"]).await;
    assert_ok(&out);
    assert_eq!(fx.get(0).await.checkpoint, Checkpoint::AtTimestamp);
    assert_eq!(fx.get(1).await.checkpoint, Checkpoint::ShardEnd);
    let err = text(&out.stderr);
    assert!(
        err.contains("initial_timestamp = \"2024-05-01T00:00:00Z\""),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewind_refuses_while_a_live_worker_holds_leases_and_force_overrides() {
    let fx = Fixture::new("rewind-live").await;
    let lease = fx.lease(0, at(0)).await;
    let live = WorkerId::new("w-live");
    fx.table
        .take(&lease.key, &lease.fence(), &live)
        .await
        .unwrap();
    fx.lease(1, at(1)).await;

    // The worker's heartbeat moves every 100 ms while the command runs.
    let table = DynamoLeaseTable::new(&servers::sdk_config(), Some(&fx.endpoint), &fx.app);
    let beating = tokio::spawn(async move {
        loop {
            table.heartbeat(&live, &Default::default()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });

    let started = std::time::Instant::now();
    let out = fx
        .run(
            &["rewind"],
            &["--to", "trim-horizon", "--failover-time", "5s"],
        )
        .await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("refusing to rewind while live workers hold leases: w-live"),
        "{err}"
    );
    assert!(err.contains("shardId-000000000000"), "{err}");
    assert!(err.contains("--force"), "{err}");
    // Refused as soon as the heartbeat moved, not after the whole failover time.
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(fx.get(0).await.checkpoint, at(0));
    assert_eq!(fx.get(1).await.checkpoint, at(1));

    let out = fx
        .run(&["rewind"], &["--to", "trim-horizon", "--force"])
        .await;
    assert_ok(&out);
    beating.abort();
    assert_eq!(fx.get(0).await.checkpoint, Checkpoint::TrimHorizon);
    // The owner and its fence are as they were: only the checkpoint moved.
    let after = fx.get(0).await;
    assert_eq!(after.owner, Some(WorkerId::new("w-live")));
    assert_eq!(after.counter, 1);
}

/// A smaller `--failover-time` never calls a live worker dead: the owners are watched
/// as long as they declare in their heartbeat rows (2 s beats, 6 s failover here), so a
/// worker beating every 2 s is seen alive however small the number given (`0s` used to
/// pass at once, `1s` two times in three). `--force` is the one way past, and says what
/// it overrides.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_failover_time_on_the_command_line_never_calls_a_live_worker_dead() {
    let fx = Fixture::new("rewind-declared").await;
    let lease = fx.lease(0, at(0)).await;
    let live = WorkerId::new("w-slow-beats");
    fx.table
        .take(&lease.key, &lease.fence(), &live)
        .await
        .unwrap();
    let declared = flotilla_actors::model::WorkerLoad {
        heartbeat_interval_ms: Some(2_000),
        failover_time_ms: Some(6_000),
        ..Default::default()
    };
    let table = DynamoLeaseTable::new(&servers::sdk_config(), Some(&fx.endpoint), &fx.app);
    let beating = tokio::spawn(async move {
        loop {
            table.heartbeat(&live, &declared).await.unwrap();
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    for given in ["0s", "1s"] {
        let out = fx
            .run(&["rewind"], &["--to", "latest", "--failover-time", given])
            .await;
        assert!(
            !out.status.success(),
            "--failover-time {given}: rewound under a live worker"
        );
        let err = text(&out.stderr);
        assert!(
            err.contains("refusing to rewind while live workers hold leases: w-slow-beats"),
            "{err}"
        );
        assert!(
            err.contains("the lease.failover_time the workers declare"),
            "{err}"
        );
    }
    assert_eq!(fx.get(0).await.checkpoint, at(0));
    let out = fx.run(&["rewind"], &["--to", "latest", "--force"]).await;
    assert_ok(&out);
    let err = text(&out.stderr);
    assert!(
        err.contains("--force: rewinding without checking") && err.contains("w-slow-beats"),
        "{err}"
    );
    beating.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rewind_goes_ahead_when_the_owners_heartbeat_stands_still() {
    let fx = Fixture::new("rewind-dead").await;
    let lease = fx.lease(0, at(0)).await;
    let dead = WorkerId::new("w-crashed");
    fx.table
        .take(&lease.key, &lease.fence(), &dead)
        .await
        .unwrap();
    // It declared a short failover time: watched that long, then judged dead.
    let declared = flotilla_actors::model::WorkerLoad {
        heartbeat_interval_ms: Some(100),
        failover_time_ms: Some(600),
        ..Default::default()
    };
    fx.table.heartbeat(&dead, &declared).await.unwrap();

    let out = fx
        .run(&["rewind"], &["--to", "latest", "--failover-time", "600ms"])
        .await;
    assert_ok(&out);
    assert!(
        text(&out.stderr).contains("w-crashed"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(fx.get(0).await.checkpoint, Checkpoint::Latest);
}

/// A file in the temp directory, removed on drop.
struct TempFile(std::path::PathBuf);

impl TempFile {
    fn new(name: &str, contents: &[u8]) -> Self {
        let path = std::env::temp_dir().join(format!(
            "flotilla-cli-ops-{}-{name}.json",
            std::process::id()
        ));
        std::fs::write(&path, contents).unwrap();
        Self(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_then_import_restores_every_checkpoint() {
    let fx = Fixture::new("positions-app").await;
    fx.lease(0, at(0)).await;
    fx.lease(1, at(5)).await;
    fx.lease(2, Checkpoint::ShardEnd).await;
    fx.lease(3, Checkpoint::Latest).await;
    let before = fx.checkpoints().await;

    let out = fx.run(&["position", "export"], &[]).await;
    assert_ok(&out);
    let token: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(token["version"], 1);
    assert_eq!(token["application"], "positions-app");
    assert_eq!(
        token["shards"]["shardId-000000000001"],
        serde_json::json!({"checkpoint": SEQ, "sub_sequence": 5})
    );
    assert_eq!(
        token["shards"]["shardId-000000000002"]["checkpoint"],
        "SHARD_END"
    );

    // Something moves them all; the import brings them back.
    let out = fx.run(&["rewind"], &["--to", "trim-horizon"]).await;
    assert_ok(&out);
    assert_ne!(fx.checkpoints().await, before);

    let file = TempFile::new("round-trip", token.to_string().as_bytes());
    let out = fx.run(&["position", "import"], &[file.path()]).await;
    assert_ok(&out);
    assert_eq!(fx.checkpoints().await, before);
    let err = text(&out.stderr);
    assert!(err.contains("3 leases set, 1 already there"), "{err}");
}

/// A shard the token names that has no lease row is not created: the others are
/// written, and the command fails naming it, so a script sees the restore incomplete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_fails_naming_each_shard_it_did_not_apply() {
    let fx = Fixture::new("positions-partial").await;
    fx.lease(0, Checkpoint::TrimHorizon).await;
    fx.lease(1, Checkpoint::TrimHorizon).await;
    let token = |shards: serde_json::Value| serde_json::json!({"version": 1, "application": "positions-partial", "shards": shards});

    // One of two applied.
    let file = TempFile::new(
        "partial",
        token(serde_json::json!({
            "shardId-000000000000": {"checkpoint": SEQ, "sub_sequence": 2},
            "shardId-000000000009": {"checkpoint": "LATEST"},
        }))
        .to_string()
        .as_bytes(),
    );
    let out = fx.run(&["position", "import"], &[file.path()]).await;
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(
            "1 of the 2 shards in the token were not applied (the others were):\n  \
             shardId-000000000009: no lease row in table positions-partial\n"
        ),
        "{err}"
    );
    assert!(err.contains("Workers create a shard's lease row"), "{err}");
    assert_eq!(fx.get(0).await.checkpoint, at(2));
    assert_eq!(fx.get(1).await.checkpoint, Checkpoint::TrimHorizon);

    // None applied: the case that used to exit 0.
    let file = TempFile::new(
        "none",
        token(serde_json::json!({"shardId-000000000007": {"checkpoint": "LATEST"}}))
            .to_string()
            .as_bytes(),
    );
    let out = fx.run(&["position", "import"], &[file.path()]).await;
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(
            "none of the 1 shards in the token was applied:\n  \
             shardId-000000000007: no lease row in table positions-partial"
        ),
        "{err}"
    );
    assert_eq!(fx.get(0).await.checkpoint, at(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_value_in_a_token_names_its_shard() {
    let fx = Fixture::new("positions-bad").await;
    fx.lease(0, Checkpoint::TrimHorizon).await;
    for (name, position, says) in [
        (
            "sub-sequence",
            serde_json::json!({"checkpoint": SEQ, "sub_sequence": "x"}),
            "\"sub_sequence\" is \"x\"; it must be a whole number from 0 up",
        ),
        (
            "checkpoint",
            serde_json::json!({"checkpoint": 5}),
            "\"checkpoint\" is 5; it must be a sequence number",
        ),
    ] {
        let token = serde_json::json!({
            "version": 1,
            "application": "positions-bad",
            "shards": {"shardId-000000000000": position},
        });
        let file = TempFile::new(name, token.to_string().as_bytes());
        let out = fx.run(&["position", "import"], &[file.path()]).await;
        let err = text(&out.stderr);
        assert!(!out.status.success(), "{err}");
        assert!(
            err.contains(&format!(
                "position token {}: shard shardId-000000000000: {says}",
                file.path()
            )),
            "{err}"
        );
        assert_eq!(fx.get(0).await.checkpoint, Checkpoint::TrimHorizon);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_refuses_another_applications_token_unless_forced() {
    let source = Fixture::new("app-a").await;
    source.lease(0, at(3)).await;
    let target = Fixture::on(source.endpoint.clone(), "app-b").await;
    target.lease(0, Checkpoint::TrimHorizon).await;

    let out = source.run(&["position", "export"], &[]).await;
    assert_ok(&out);
    let file = TempFile::new("other-app", &out.stdout);

    let out = target.run(&["position", "import"], &[file.path()]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("is for application app-a, not app-b") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(target.get(0).await.checkpoint, Checkpoint::TrimHorizon);

    let out = target
        .run(&["position", "import"], &[file.path(), "--force"])
        .await;
    assert_ok(&out);
    assert_eq!(target.get(0).await.checkpoint, at(3));
}

const TABLE_STREAM_A: &str =
    "arn:aws:dynamodb:us-east-1:1:table/orders/stream/2024-05-01T00:00:00.000";
const TABLE_STREAM_B: &str =
    "arn:aws:dynamodb:us-east-1:1:table/orders/stream/2024-06-01T00:00:00.000";

/// A token says which stream its positions are in, and a table reading another stream
/// refuses it, even with --force: a position of one stream means nothing in another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_names_its_source_and_another_source_refuses_it() {
    let source = Fixture::new("source-a").await;
    source.lease_of(Some(TABLE_STREAM_A), 0, at(3)).await;
    let out = source.run(&["position", "export"], &[]).await;
    assert_ok(&out);
    let token: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(token["source"], TABLE_STREAM_A);
    let file = TempFile::new("source-a", &out.stdout);

    for (app, other) in [("source-b", TABLE_STREAM_B), ("source-k", "orders")] {
        let target = Fixture::on(source.endpoint.clone(), app).await;
        target
            .lease_of(Some(other), 0, Checkpoint::TrimHorizon)
            .await;
        let out = target
            .run(&["position", "import"], &[file.path(), "--force"])
            .await;
        assert!(!out.status.success(), "{app}");
        let err = text(&out.stderr);
        assert!(
            err.contains(&format!("({TABLE_STREAM_A})")) && err.contains(&format!("({other})")),
            "{err}"
        );
        assert_eq!(target.get(0).await.checkpoint, Checkpoint::TrimHorizon);
    }
    // The same stream: applied.
    let same = Fixture::on(source.endpoint.clone(), "source-a2").await;
    same.lease_of(Some(TABLE_STREAM_A), 0, Checkpoint::TrimHorizon)
        .await;
    let out = same
        .run(&["position", "import"], &[file.path(), "--force"])
        .await;
    assert_ok(&out);
    assert_eq!(same.get(0).await.checkpoint, at(3));
}

/// A table stream's shards leave the stream 24 hours after they close, their rows with
/// them: the token's shards the table no longer has are pruned, named, not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_table_stream_tokens_shards_past_retention_are_pruned_with_a_warning() {
    let fx = Fixture::new("pruned-app").await;
    fx.lease_of(Some(TABLE_STREAM_A), 1, Checkpoint::TrimHorizon)
        .await;
    let token = serde_json::json!({
        "version": 1,
        "application": "pruned-app",
        "source": TABLE_STREAM_A,
        "shards": {
            "shardId-000000000000": {"checkpoint": SEQ},
            "shardId-000000000001": {"checkpoint": SEQ, "sub_sequence": 2},
        },
    });
    let file = TempFile::new("pruned", token.to_string().as_bytes());
    let out = fx.run(&["position", "import"], &[file.path()]).await;
    assert_ok(&out);
    let err = text(&out.stderr);
    assert!(
        err.contains("pruned 1 shards") && err.contains("shardId-000000000000"),
        "{err}"
    );
    assert_eq!(fx.get(1).await.checkpoint, at(2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn import_refuses_while_a_live_worker_holds_leases() {
    let fx = Fixture::new("import-live").await;
    let lease = fx.lease(0, at(0)).await;
    let out = fx.run(&["position", "export"], &[]).await;
    assert_ok(&out);
    let file = TempFile::new("live", &out.stdout);
    let live = WorkerId::new("w-busy");
    fx.table
        .take(&lease.key, &lease.fence(), &live)
        .await
        .unwrap();
    let table = DynamoLeaseTable::new(&servers::sdk_config(), Some(&fx.endpoint), &fx.app);
    let beating = tokio::spawn(async move {
        loop {
            table.heartbeat(&live, &Default::default()).await.unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let out = fx
        .run(
            &["position", "import"],
            &[file.path(), "--failover-time", "5s"],
        )
        .await;
    beating.abort();
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("refusing to import positions"), "{err}");
    assert!(err.contains("w-busy"), "{err}");
}

/// A status endpoint serving `GET /status` and `GET /fleet` built from the real types.
async fn status_server() -> String {
    use flotilla_actors::FenceReason;
    use flotilla_actors::status::{
        BudgetView, FleetLease, FleetLeaseState, FleetScaling, FleetView, FleetWorker, ShardState,
        ShardStatus, SubscriptionView, WorkerStatus,
    };

    let shard = |index: u64, state: ShardState, error: Option<&str>| ShardStatus {
        shard_id: ShardId::from_index(index),
        stream: None,
        state,
        lease_counter: 3,
        checkpoint: Some(SEQ.to_owned()),
        last_delivered: Some(SEQ.to_owned()),
        millis_behind_latest: Some(1200),
        records_delivered: 4521,
        bytes_delivered: 1_000_000,
        records_per_second: 12.5,
        bytes_per_second: 2000.0,
        last_error: error.map(str::to_owned),
        last_error_ms_ago: error.map(|_| 4_000),
        in_flight_records: 7,
        in_flight_bytes: 700,
        memory_bytes: 2_100,
        restarts: 1,
        fenced: None,
        stall: None,
        records_discarded: 0,
        last_failure: None,
        lanes: Vec::new(),
        subscription: Some(SubscriptionView {
            state: if error.is_some() { "none" } else { "open" },
            age_ms: if error.is_some() { None } else { Some(62_000) },
            events: 31,
            subscriptions: 2,
        }),
    };
    let status = WorkerStatus {
        worker_id: "w-1".into(),
        application: "orders-audit".into(),
        stream: "orders".into(),
        source: "kinesis",
        read_mode: "fanout",
        state: "running",
        uptime_ms: 3_723_000,
        shutting_down: false,
        shards: vec![
            shard(
                1,
                ShardState::Throttled,
                Some("SubscribeToShard: throttled by Kinesis"),
            ),
            shard(0, ShardState::CaughtUp, None),
            ShardStatus {
                fenced: Some(FenceReason::AwaitingReconfirmation { gap_ms: 31_000 }),
                ..shard(2, ShardState::Fenced, None)
            },
            ShardStatus {
                records_discarded: 2,
                last_failure: Some("record 49590338271490256608559692538361571095921575989136588898/0: cannot parse".into()),
                ..shard(3, ShardState::CaughtUp, None)
            },
        ],
        shard_restarts: 1,
        core: ["lease_keeper", "checkpoint_writer"]
            .into_iter()
            .map(|name| flotilla_actors::status::CoreActorStatus {
                name,
                state: "running".into(),
                restarts: 0,
            })
            .collect(),
        leases: None,
        stream_watcher: None,
        checkpoints: BTreeMap::new(),
        metrics: None,
        budget: BudgetView {
            total_bytes: 268_435_456,
            in_use_bytes: 6_300,
            share_bytes: 89_478_485,
            shards: 3,
            shards_waiting: 0,
            peak_bytes: 6_300,
        },
    };
    let held = FleetLease {
        lease_key: "shardId-000000000000".into(),
        shard_id: "shardId-000000000000".into(),
        stream: None,
        owner: Some("w-1".into()),
        state: FleetLeaseState::Held,
        reason: None,
        checkpoint: Some(SEQ.into()),
        counter: Some(3),
        handoff_to: None,
        parents: vec![],
        children: vec![],
        millis_behind_latest: Some(1200),
        subscribed_ms: None,
        rate: None,
        records_discarded: None,
        last_failure: None,
    };
    let fleet = FleetView {
        application: "orders-audit".into(),
        stream: "orders".into(),
        source: "kinesis",
        read_mode: "fanout",
        observer: "w-1".into(),
        scanned_ms_ago: 800,
        // The keeper's last round: 2 workers carrying 4000 records/s at 1000 each.
        scaling: Some(FleetScaling::new(
            &flotilla_actors::scale::recommend(
                &flotilla_actors::scale::Fleet {
                    workers: 2,
                    leases: 4,
                    records_per_second: 4_000,
                    ..Default::default()
                },
                &flotilla_actors::scale::Targets {
                    records_per_second: 1_000,
                    bytes_per_second: 0,
                    lag_ms: 60_000,
                    scale_down_margin_percent: 20,
                },
            ),
            1_200,
        )),
        scaling_unknown: None,
        workers: vec![
            FleetWorker {
                worker_id: "w-1".into(),
                alive: true,
                draining: false,
                has_heartbeat: true,
                leases: 2,
                records_per_second: Some(25),
                bytes_per_second: Some(51_200),
                load_unknown: None,
                silent_ms: 100,
            },
            FleetWorker {
                worker_id: "w-2".into(),
                alive: false,
                draining: false,
                has_heartbeat: true,
                leases: 1,
                // Dead: its load is unknown, not its last figures.
                records_per_second: None,
                bytes_per_second: None,
                load_unknown: Some("no heartbeat for 42 s".into()),
                silent_ms: 42_000,
            },
        ],
        leases: vec![
            held.clone(),
            // The observer's own lease whose reader discarded records (`/fleet` lays
            // its shards' `records_discarded` and `last_failure` over the table's).
            FleetLease {
                lease_key: "shardId-000000000003".into(),
                shard_id: "shardId-000000000003".into(),
                subscribed_ms: Some(62_000),
                records_discarded: Some(2),
                last_failure: Some(
                    "record 49590338271490256608559692538361571095921575989136588898/0: cannot parse"
                        .into(),
                ),
                ..held.clone()
            },
            FleetLease {
                lease_key: "shardId-000000000002".into(),
                shard_id: "shardId-000000000002".into(),
                stream: None,
                owner: Some("w-2".into()),
                state: FleetLeaseState::Unassigned,
                reason: None,
                checkpoint: Some("TRIM_HORIZON".into()),
                counter: Some(1),
                handoff_to: None,
                parents: vec![],
                children: vec![],
                millis_behind_latest: None,
                subscribed_ms: None,
                rate: None,
                records_discarded: None,
                last_failure: None,
            },
            FleetLease {
                lease_key: "shardId-000000000009".into(),
                shard_id: "shardId-000000000009".into(),
                stream: None,
                owner: None,
                state: FleetLeaseState::Stalled,
                reason: Some("unreadable row: attribute checkpoint: not a number".into()),
                checkpoint: None,
                counter: None,
                handoff_to: None,
                parents: vec![],
                children: vec![],
                millis_behind_latest: None,
                subscribed_ms: None,
                rate: None,
                records_discarded: None,
                last_failure: None,
            },
        ],
        unassigned: vec!["shardId-000000000002".into()],
        blocked: vec![],
        stalled: vec![
            "shardId-000000000009: unreadable row: attribute checkpoint: not a number".into(),
        ],
        malformed_rows: vec![],
    };
    let tree = serde_json::to_value(flotilla_actors::status_tree::tree(&status)).unwrap();
    let status = serde_json::to_value(&status).unwrap();
    let fleet = serde_json::to_value(&fleet).unwrap();
    let app = axum::Router::new()
        .route(
            "/status/tree",
            axum::routing::get(move || async move { axum::Json(tree) }),
        )
        .route(
            "/status",
            axum::routing::get(move || async move { axum::Json(status) }),
        )
        .route(
            "/fleet",
            axum::routing::get(move || async move { axum::Json(fleet) }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_the_workers_shards_and_the_fleet_as_tables() {
    let url = status_server().await;

    let out = flotilla(&["status", "--url", &url]).await;
    assert_ok(&out);
    let table = text(&out.stdout);
    let lines: Vec<&str> = table.lines().collect();
    assert!(
        lines[0].starts_with(
            "worker w-1  application orders-audit  stream orders  source kinesis  reading fanout  \
             state running  \
             up 1h 2m 3s"
        ),
        "{table}"
    );
    assert!(lines[1].starts_with("SHARD "), "{table}");
    assert!(
        lines[2].starts_with("shardId-000000000000  caught_up  49680458…600470908946  1200")
            && lines[2].ends_with("subscribed 1m 2s ago"),
        "{table}"
    );
    assert!(
        lines[3].starts_with("shardId-000000000001  throttled"),
        "{table}"
    );
    assert!(
        lines[3].ends_with("not subscribed; last error: SubscribeToShard: throttled by Kinesis"),
        "{table}"
    );
    assert!(
        lines[4].starts_with("shardId-000000000002  fenced")
            && lines[4]
                .ends_with("fenced: heartbeats resumed after a 31s gap; re-reading the lease"),
        "{table}"
    );
    // What `[failure]` did: the records discarded and the last failure, after the note.
    assert!(
        lines[5].starts_with("shardId-000000000003  caught_up")
            && lines[5].ends_with(
                "subscribed 1m 2s ago; discarded 2, last failure: record \
                 49590338271490256608559692538361571095921575989136588898/0: cannot parse"
            ),
        "{table}"
    );

    // Below the table, the supervision tree as the worker's page draws it: every node
    // a line, in the page's order, a stalled shard saying why.
    let tree: Vec<&str> = lines
        .iter()
        .skip_while(|l| !l.starts_with("supervisor  running"))
        .copied()
        .collect();
    assert_eq!(tree.len(), 11, "{table}");
    for (line, start) in tree.iter().zip([
        "supervisor  running  worker w-1  up 1h 2m 3s  shards 4",
        "├─ lease_keeper  running  restarts 0",
        "├─ checkpoint_writer  running  restarts 0",
        "├─ reader shardId-000000000000  caught_up  restarts 1  lag 1200 ms  records/s 12.5",
        "│  └─ processor  running  in flight 7 records",
        "├─ reader shardId-000000000001  throttled",
        "│  └─ processor  running",
        "├─ reader shardId-000000000002  fenced",
        "│  └─ processor  running",
        "└─ reader shardId-000000000003  caught_up",
        "   └─ processor  running",
    ]) {
        assert!(
            line.starts_with(start),
            "{line:?} should start {start:?}:\n{table}"
        );
    }
    assert!(
        tree[7].contains("STALLED: fenced: heartbeats resumed after a 31000 ms gap"),
        "{table}"
    );
    assert!(
        tree[5].ends_with("error: SubscribeToShard: throttled by Kinesis (4s ago)"),
        "{table}"
    );

    let out = flotilla(&["status", "--url", &format!("{url}/"), "--fleet"]).await;
    assert_ok(&out);
    let table = text(&out.stdout);
    assert!(
        table.contains("reading fanout  seen by w-1 800ms ago"),
        "{table}"
    );
    // The recommended worker count of the observer's last keeper round, and why.
    assert_eq!(
        table.lines().nth(1),
        Some(
            "recommended workers: 4 (now 2): load above the target for 2 workers: 4000 \
             records/s (target 1000 per worker)"
        ),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("w-1") && l.split_whitespace().nth(4) == Some("25")),
        "{table}"
    );
    // The dead worker: its load unknown (REC/S and BYTES/S `-`), and why.
    assert!(
        table.lines().any(|l| l.starts_with("w-2")
            && l.contains(" dead ")
            && l.split_whitespace().skip(4).take(3).eq(["-", "-", "42s"])
            && l.ends_with("load unknown: no heartbeat for 42 s")),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("shardId-000000000002  w-2    unassigned  TRIM_HORIZON")),
        "{table}"
    );
    // A fan-out fleet's held lease whose owner reported no open subscription.
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("shardId-000000000000  w-1") && l.ends_with("not subscribed")),
        "{table}"
    );
    // The observer's own lease whose reader discarded records: after its note, what
    // `[failure]` did on it.
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("shardId-000000000003  w-1    held")
                && l.ends_with(
                    "subscribed 1m 2s; discarded 2, last failure: record \
                     49590338271490256608559692538361571095921575989136588898/0: cannot parse"
                )),
        "{table}"
    );
    assert!(
        table.contains("unassigned (no live owner): shardId-000000000002"),
        "{table}"
    );
    assert!(
        table
            .lines()
            .any(|l| l.starts_with("shardId-000000000009  -      stalled")
                && l.ends_with("unreadable row: attribute checkpoint: not a number")),
        "{table}"
    );
    assert!(
        table.contains("stalled: shardId-000000000009: unreadable row"),
        "{table}"
    );

    let out = flotilla(&["status", "--url", &url, "--json"]).await;
    assert_ok(&out);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["shards"][0]["shard_id"], "shardId-000000000001");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_on_a_closed_port_names_the_url_and_what_to_try() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    drop(listener);
    let out = flotilla(&["status", "--url", &url]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains(&format!("{url}/status")), "{err}");
    assert!(
        err.contains("--url") && err.contains("status.bind"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_creates_a_local_stream_once_and_refuses_a_remote_one() {
    let dynamodb = servers::start_dynoxide().await;
    let kinesis = servers::start_ferrokinesis(300).await;
    let init = |extra: Vec<String>| {
        let dynamodb = dynamodb.clone();
        async move {
            let mut args = vec![
                "init".to_owned(),
                "--table".into(),
                "init-app".into(),
                "--dynamodb-endpoint".into(),
                dynamodb,
                "--stream".into(),
                "dev".into(),
                "--shards".into(),
                "3".into(),
            ];
            args.extend(extra);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            flotilla(&args).await
        }
    };
    let out = init(vec!["--kinesis-endpoint".into(), kinesis.clone()]).await;
    assert_ok(&out);
    assert_eq!(
        text(&out.stdout),
        "lease table init-app: created; on-demand, point-in-time recovery not supported by this server, deletion protection off; heartbeats in init-app-FlotillaWorkers\nstream dev: created with 3 shards\n"
    );
    let out = init(vec!["--kinesis-endpoint".into(), kinesis.clone()]).await;
    assert_ok(&out);
    assert_eq!(
        text(&out.stdout),
        "lease table init-app: already exists; on-demand, point-in-time recovery not supported by this server, deletion protection off; heartbeats in init-app-FlotillaWorkers\nstream dev: already exists, 3 open shards\n"
    );

    let out = init(vec![
        "--kinesis-endpoint".into(),
        "https://kinesis.us-east-1.amazonaws.com".into(),
    ])
    .await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("local Kinesis only") && err.contains("aws kinesis create-stream"),
        "{err}"
    );

    let out = init(vec![]).await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--kinesis-endpoint"),
        "{}",
        text(&out.stderr)
    );
}

/// `flotilla consumer list` shows the stream's fan-out consumers as JSON lines and the
/// count against the limit; `deregister` removes the one named (and only it), and a name
/// the stream does not have is an error saying how to see the names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consumer_list_and_deregister() {
    use flotilla_actors::backend::aws::KinesisStream;
    use flotilla_actors::backend::{StreamAdmin as _, StreamClient as _};

    let kinesis = servers::start_ferrokinesis(300).await;
    let client = KinesisStream::new(&servers::sdk_config(), Some(&kinesis));
    client.create_stream("fan", 1).await.unwrap();
    let arn = client.describe_stream_summary("fan").await.unwrap().arn;
    for name in ["app-a", "app-b"] {
        client.register_stream_consumer(&arn, name).await.unwrap();
    }
    let names = |out: &Output| -> Vec<String> {
        text(&out.stdout)
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                assert!(v["arn"].as_str().unwrap().contains("/consumer/"), "{l}");
                v["name"].as_str().unwrap().to_owned()
            })
            .collect()
    };
    let list = || {
        let kinesis = kinesis.clone();
        async move {
            flotilla(&[
                "consumer",
                "list",
                "--stream",
                "fan",
                "--kinesis-endpoint",
                &kinesis,
            ])
            .await
        }
    };
    let out = list().await;
    assert_ok(&out);
    assert_eq!(names(&out), ["app-a", "app-b"]);
    assert!(
        text(&out.stderr).contains("2 of at most 20"),
        "{}",
        text(&out.stderr)
    );

    let deregister = |name: &'static str| {
        let kinesis = kinesis.clone();
        async move {
            flotilla(&[
                "consumer",
                "deregister",
                "--stream",
                "fan",
                "--name",
                name,
                "--kinesis-endpoint",
                &kinesis,
            ])
            .await
        }
    };
    let out = deregister("app-a").await;
    assert_ok(&out);
    assert!(text(&out.stdout).contains("consumer app-a of stream fan: deregistered"));
    // Gone, or DELETING for a moment.
    let mut left = Vec::new();
    for _ in 0..50 {
        left = names(&list().await);
        if left == ["app-b"] {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(left, ["app-b"]);

    let out = deregister("nope").await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("no consumer named nope") && err.contains("flotilla consumer list"),
        "{err}"
    );
}

#[tokio::test]
async fn every_subcommand_has_help_with_an_example() {
    for command in [
        vec!["demo"],
        vec!["run"],
        vec!["init"],
        vec!["leases"],
        vec!["status"],
        vec!["rewind"],
        vec!["position", "export"],
        vec!["position", "import"],
        vec!["consumer", "list"],
        vec!["consumer", "deregister"],
    ] {
        let mut args = command.clone();
        args.push("--help");
        let out = flotilla(&args).await;
        assert_ok(&out);
        let help = text(&out.stdout);
        assert!(
            help.contains("Examples:") && help.contains(&format!("flotilla {}", command.join(" "))),
            "{command:?}: {help}"
        );
    }
    let out = flotilla(&["position", "--help"]).await;
    assert_ok(&out);
    assert!(text(&out.stdout).contains("export"));
}

/// A table of several streams (worker.streams): `leases` names each lease's stream, an
/// export of the whole table works although its rows read several sources (each key
/// names its stream), and `--stream` exports and imports one stream alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn positions_of_several_streams_export_and_import_per_stream() {
    let fx = Fixture::new("many-streams-app").await;
    let mut keys = Vec::new();
    for (stream, sub) in [("orders", 1), ("audit", 2)] {
        let mut lease = Lease::new(
            &ShardId::from_index(0),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        lease.key = LeaseKey::new(format!(
            "123456789012:{stream}:1700000000:shardId-000000000000"
        ));
        lease.source = Some(stream.to_owned());
        assert!(fx.table.create_if_absent(&lease).await.unwrap());
        fx.table
            .checkpoint(&lease.key, &lease.fence(), &at(sub), &[])
            .await
            .unwrap();
        keys.push(lease.key.as_str().to_owned());
    }

    let out = fx.run(&["leases"], &[]).await;
    assert_ok(&out);
    let streams: Vec<String> = text(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["stream"].to_string())
        .collect();
    assert_eq!(streams, ["\"audit\"", "\"orders\""]);

    let out = fx.run(&["position", "export"], &[]).await;
    assert_ok(&out);
    let all: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(all["shards"].as_object().unwrap().len(), 2, "{all}");

    let out = fx
        .run(&["position", "export"], &["--stream", "orders"])
        .await;
    assert_ok(&out);
    let orders: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(orders["source"], "orders");
    assert_eq!(
        orders["shards"],
        serde_json::json!({ &keys[0]: {"checkpoint": SEQ, "sub_sequence": 1} })
    );

    // Both streams rewound; importing the whole token with --stream audit restores
    // audit alone.
    let out = fx.run(&["rewind"], &["--to", "trim-horizon"]).await;
    assert_ok(&out);
    let file = TempFile::new("many-streams", all.to_string().as_bytes());
    let out = fx
        .run(&["position", "import"], &[file.path(), "--stream", "audit"])
        .await;
    assert_ok(&out);
    let cps = fx.checkpoints().await;
    assert_eq!(cps[&keys[0]], Checkpoint::TrimHorizon);
    assert_eq!(cps[&keys[1]], at(2));

    let out = fx
        .run(&["position", "export"], &["--stream", "clicks"])
        .await;
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no lease of stream clicks"),
        "{}",
        text(&out.stderr)
    );
}

/// Whether `app`'s lease table is on the server.
async fn table_exists(endpoint: &str, app: &str) -> bool {
    DynamoLeaseTable::new(&servers::sdk_config(), Some(endpoint), app)
        .deletion_protected()
        .await
        .unwrap()
        .is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_asks_for_confirmation_and_scripts_pass_yes() {
    let fx = Fixture::new("destroy-confirm").await;
    fx.lease(0, at(0)).await;
    // No terminal (the test's stdin is closed), no --yes: refused, nothing deleted.
    let out = fx.run(&["destroy"], &[]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("pass --yes"), "{err}");
    assert!(table_exists(&fx.endpoint, &fx.app).await);

    let out = fx.run(&["destroy"], &["--yes"]).await;
    assert_ok(&out);
    assert!(
        text(&out.stdout).contains(
            "lease table destroy-confirm: deleted, with its worker table \
             destroy-confirm-FlotillaWorkers"
        ),
        "{}",
        text(&out.stdout)
    );
    assert!(!table_exists(&fx.endpoint, &fx.app).await);

    // Again: nothing there, and it says so.
    let out = fx.run(&["destroy"], &["--yes"]).await;
    assert_ok(&out);
    assert!(
        text(&out.stdout).contains("does not exist; nothing to delete"),
        "{}",
        text(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_refuses_while_a_live_worker_holds_leases_and_force_overrides() {
    let fx = Fixture::new("destroy-live").await;
    let lease = fx.lease(0, at(0)).await;
    let live = WorkerId::new("w-live");
    fx.table
        .take(&lease.key, &lease.fence(), &live)
        .await
        .unwrap();
    let table = DynamoLeaseTable::new(&servers::sdk_config(), Some(&fx.endpoint), &fx.app);
    let beating = tokio::spawn(async move {
        loop {
            let _ = table.heartbeat(&live, &Default::default()).await;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let out = fx
        .run(&["destroy"], &["--yes", "--failover-time", "5s"])
        .await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains(
            "refusing to delete lease table destroy-live while live workers hold leases: w-live"
        ),
        "{err}"
    );
    assert!(err.contains("--force"), "{err}");
    assert!(table_exists(&fx.endpoint, &fx.app).await);

    let out = fx.run(&["destroy"], &["--yes", "--force"]).await;
    assert_ok(&out);
    beating.abort();
    assert!(!table_exists(&fx.endpoint, &fx.app).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_leaves_a_table_with_deletion_protection_alone() {
    let fx = Fixture::new("destroy-protected").await;
    let config = aws_sdk_dynamodb::config::Builder::from(&servers::sdk_config())
        .endpoint_url(&fx.endpoint)
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
        .update_table()
        .table_name(&fx.app)
        .deletion_protection_enabled(true)
        .send()
        .await
        .unwrap();
    let out = fx.run(&["destroy"], &["--yes", "--force"]).await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("has deletion protection on")
            && err.contains("--no-deletion-protection-enabled"),
        "{err}"
    );
    assert!(table_exists(&fx.endpoint, &fx.app).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn destroy_deregisters_the_applications_consumers_of_the_streams_named() {
    use flotilla_actors::backend::aws::KinesisStream;
    use flotilla_actors::backend::{StreamAdmin as _, StreamClient as _};

    let fx = Fixture::new("destroy-fan").await;
    let kinesis = servers::start_ferrokinesis(300).await;
    let client = KinesisStream::new(&servers::sdk_config(), Some(&kinesis));
    client.create_stream("fan-a", 1).await.unwrap();
    client.create_stream("fan-b", 1).await.unwrap();
    let arn_a = client.describe_stream_summary("fan-a").await.unwrap().arn;
    let arn_b = client.describe_stream_summary("fan-b").await.unwrap().arn;
    // The application's consumer on fan-a, another application's on both.
    client
        .register_stream_consumer(&arn_a, &fx.app)
        .await
        .unwrap();
    client
        .register_stream_consumer(&arn_a, "other-app")
        .await
        .unwrap();
    client
        .register_stream_consumer(&arn_b, "other-app")
        .await
        .unwrap();

    let out = fx
        .run(
            &["destroy"],
            &[
                "--yes",
                "--stream",
                "fan-a",
                "--stream",
                "fan-b",
                "--kinesis-endpoint",
                &kinesis,
            ],
        )
        .await;
    assert_ok(&out);
    let said = text(&out.stdout);
    assert!(
        said.contains("consumer destroy-fan of stream fan-a: deregistered"),
        "{said}"
    );
    assert!(
        said.contains("consumer destroy-fan of stream fan-b: none registered"),
        "{said}"
    );
    assert!(said.contains("lease table destroy-fan: deleted"), "{said}");
    let mut left = Vec::new();
    for _ in 0..50 {
        left = client
            .list_stream_consumers(&arn_a)
            .await
            .unwrap()
            .into_iter()
            .map(|c| c.name)
            .collect::<Vec<_>>();
        if left == ["other-app"] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(left, ["other-app"]);
    let on_b: Vec<String> = client
        .list_stream_consumers(&arn_b)
        .await
        .unwrap()
        .into_iter()
        .map(|c| c.name)
        .collect();
    assert_eq!(on_b, ["other-app"]);
}

/// The table as DynamoDB describes it: (billing mode, table RCU/WCU, index RCU/WCU,
/// deletion protection, tags).
async fn described(
    endpoint: &str,
    app: &str,
) -> (String, (i64, i64), (i64, i64), bool, Vec<String>) {
    let config = aws_sdk_dynamodb::config::Builder::from(&servers::sdk_config())
        .endpoint_url(endpoint)
        .build();
    let client = aws_sdk_dynamodb::Client::from_conf(config);
    let table = client
        .describe_table()
        .table_name(app)
        .send()
        .await
        .unwrap()
        .table
        .unwrap();
    let units = |p: Option<&aws_sdk_dynamodb::types::ProvisionedThroughputDescription>| {
        p.map_or((0, 0), |p| {
            (
                p.read_capacity_units().unwrap_or(0),
                p.write_capacity_units().unwrap_or(0),
            )
        })
    };
    let billing = table
        .billing_mode_summary()
        .and_then(|b| b.billing_mode())
        .map_or("PROVISIONED".to_owned(), |b| b.as_str().to_owned());
    // The heartbeat index is on the worker table, made with the same options.
    let workers = client
        .describe_table()
        .table_name(format!("{app}-FlotillaWorkers"))
        .send()
        .await
        .unwrap()
        .table
        .unwrap();
    assert!(
        table.global_secondary_indexes().is_empty(),
        "the lease table has no index (the KCL's is made so)"
    );
    let index = workers.global_secondary_indexes()[0].provisioned_throughput();
    let tags = client
        .list_tags_of_resource()
        .resource_arn(table.table_arn().unwrap())
        .send()
        .await
        .unwrap()
        .tags()
        .iter()
        .map(|t| format!("{}={}", t.key(), t.value()))
        .collect();
    (
        billing,
        units(table.provisioned_throughput()),
        units(index),
        table.deletion_protection_enabled().unwrap_or(false),
        tags,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_makes_a_provisioned_protected_tagged_table_and_changes_only_what_is_asked() {
    let endpoint = servers::start_dynoxide().await;
    let init = |extra: &[&str]| {
        let mut args = vec![
            "init",
            "--table",
            "prod-app",
            "--dynamodb-endpoint",
            &endpoint,
        ];
        args.extend(extra);
        let args: Vec<String> = args.into_iter().map(str::to_owned).collect();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            flotilla(&args).await
        }
    };
    let out = init(&[
        "--billing-mode",
        "provisioned",
        "--read-capacity",
        "5",
        "--write-capacity",
        "3",
        "--deletion-protection",
        "on",
        "--tag",
        "team=data",
        "--tag",
        "env=dev",
    ])
    .await;
    assert_ok(&out);
    assert_eq!(
        text(&out.stdout),
        "lease table prod-app: created; provisioned 5 RCU / 3 WCU, point-in-time recovery not \
         supported by this server, deletion protection on; heartbeats in \
         prod-app-FlotillaWorkers\n"
    );
    let (billing, table, index, protected, mut tags) = described(&endpoint, "prod-app").await;
    tags.sort();
    assert_eq!(billing, "PROVISIONED");
    assert_eq!(table, (5, 3));
    assert_eq!(
        index,
        (5, 3),
        "the heartbeat index gets the table's throughput"
    );
    assert!(protected);
    assert_eq!(tags, ["env=dev", "team=data"]);

    // Run again with nothing asked: nothing changes (protection stays on).
    let out = init(&[]).await;
    assert_ok(&out);
    assert!(text(&out.stdout).contains("already exists; provisioned 5 RCU / 3 WCU"));
    assert!(described(&endpoint, "prod-app").await.3);

    // Asked: protection off, one more tag; billing is left as it is, and it says so.
    let out = init(&[
        "--deletion-protection",
        "off",
        "--tag",
        "owner=ops",
        "--billing-mode",
        "on-demand",
    ])
    .await;
    assert_ok(&out);
    assert!(
        text(&out.stdout).contains("(billing left as it is: change it with UpdateTable)"),
        "{}",
        text(&out.stdout)
    );
    let (billing, _, _, protected, mut tags) = described(&endpoint, "prod-app").await;
    tags.sort();
    assert_eq!(billing, "PROVISIONED");
    assert!(!protected);
    assert_eq!(tags, ["env=dev", "owner=ops", "team=data"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_names_what_is_wrong_with_its_table_options() {
    let endpoint = servers::start_dynoxide().await;
    let cases: &[(&[&str], &str)] = &[
        (&["--read-capacity", "5"], "add --billing-mode provisioned"),
        (
            &["--billing-mode", "provisioned", "--read-capacity", "5"],
            "needs both --read-capacity and --write-capacity",
        ),
        (&["--tag", "team"], "\"team\" is not KEY=VALUE"),
        (&["--tag", "=x"], "must be 1 to 128 characters"),
        (
            &["--point-in-time-recovery", "maybe"],
            "possible values: on, off",
        ),
    ];
    for (extra, expected) in cases {
        let mut args = vec![
            "init",
            "--table",
            "bad-app",
            "--dynamodb-endpoint",
            &endpoint,
        ];
        args.extend(*extra);
        let out = flotilla(&args).await;
        assert!(!out.status.success(), "{extra:?}");
        let err = text(&out.stderr);
        assert!(err.contains(expected), "{extra:?}: {err}");
    }
    // None of them made the table.
    assert!(!table_exists(&endpoint, "bad-app").await);

    // Point-in-time recovery asked of a server without it: the table is made, and the
    // error says so and how to go without.
    let out = flotilla(&[
        "init",
        "--table",
        "pitr-app",
        "--dynamodb-endpoint",
        &endpoint,
        "--point-in-time-recovery",
        "on",
    ])
    .await;
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("was created, but point-in-time recovery could not be turned on")
            && err.contains("does not support point-in-time recovery"),
        "{err}"
    );
    assert!(table_exists(&endpoint, "pitr-app").await);
}
