//! The `LeaseTable` contract, run against every implementation:
//! `memory` (in-process), `dynoxide` (a DynamoDB server started in this test process),
//! `stripped_dynoxide` (dynoxide behind a proxy that cuts every answer down to what
//! DynamoDB promises: `support/stripping_proxy.rs`) and, with the `external-servers`
//! feature, `dynamodb_local` (AWS's DynamoDB Local) and `moto` (the Python emulator),
//! both started by scripts/test.sh.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, KeySchemaElement, KeyType,
    ScalarAttributeType,
};
use flotilla_actors::backend::aws::{DynamoLeaseTable, item_from_sdk, item_to_sdk};
use flotilla_actors::backend::layout::{LegacyRows, Retirement, worker_table_name};
use flotilla_actors::backend::memory::MemoryDynamo;
use flotilla_actors::backend::{HeartbeatDetail, LeaseError, LeaseTable, TableState, WorkerRows};
use flotilla_actors::model::item::{AttrValue, Item, Row, decode_row, encode_lease};
use flotilla_actors::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, HashKeyRange, Lease, LeaseKey, LeaseRate,
    SequenceNumber, ShardId, WorkerId, WorkerLoad,
};
use support::servers;
use support::stripping_proxy::{Fault, Options, StrippingProxy};

/// A server holding lease tables, with a back door for raw rows and foreign tables.
#[allow(clippy::large_enum_variant)] // a handful per test run
enum Raw {
    Memory(MemoryDynamo),
    Dynamo {
        client: aws_sdk_dynamodb::Client,
        sdk: aws_config::SdkConfig,
        endpoint: String,
    },
}

struct Env {
    raw: Raw,
    tier: &'static str,
}

impl Env {
    async fn memory() -> Env {
        Env {
            raw: Raw::Memory(MemoryDynamo::new()),
            tier: "memory",
        }
    }

    async fn aws(endpoint: String, tier: &'static str) -> Env {
        let sdk = servers::sdk_config();
        let conf = aws_sdk_dynamodb::config::Builder::from(&sdk)
            .endpoint_url(&endpoint)
            .build();
        Env {
            raw: Raw::Dynamo {
                client: aws_sdk_dynamodb::Client::from_conf(conf),
                sdk,
                endpoint,
            },
            tier,
        }
    }

    async fn dynoxide() -> Env {
        Env::aws(servers::start_dynoxide().await, "dynoxide").await
    }

    /// dynoxide, answering only what DynamoDB promises for each call.
    async fn stripped_dynoxide() -> Env {
        let proxy =
            StrippingProxy::start(&servers::start_dynoxide().await, Options::default()).await;
        Env::aws(proxy.url().to_owned(), "stripped_dynoxide").await
    }

    #[cfg_attr(not(feature = "external-servers"), allow(dead_code))]
    async fn moto() -> Env {
        Env::aws(
            servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT"),
            "moto",
        )
        .await
    }

    #[cfg_attr(not(feature = "external-servers"), allow(dead_code))]
    async fn dynamodb_local() -> Env {
        Env::aws(
            servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT"),
            "dynamodb_local",
        )
        .await
    }

    fn table(&self, name: &str) -> Arc<dyn LeaseTable> {
        match &self.raw {
            Raw::Memory(db) => Arc::new(db.lease_table(name)),
            Raw::Dynamo { sdk, endpoint, .. } => {
                Arc::new(DynamoLeaseTable::new(sdk, Some(endpoint), name))
            }
        }
    }

    /// A handle of flotilla before the worker table (heartbeats in the lease table).
    fn older(&self, name: &str) -> Arc<dyn LeaseTable> {
        match &self.raw {
            Raw::Memory(db) => Arc::new(db.older_version_lease_table(name)),
            Raw::Dynamo { sdk, endpoint, .. } => {
                Arc::new(DynamoLeaseTable::older_version(sdk, Some(endpoint), name))
            }
        }
    }

    /// Waits until `table` and each of its indexes is ACTIVE. After UpdateTable adds an
    /// index, DynamoDB Local describes it before its storage has the index's column:
    /// a write carrying the index key in that window fails with a 500 InternalFailure
    /// (its log: `table … has no column named indexKey_0`), which a worker retries at
    /// its next beat but a contract step must not meet.
    async fn settled(&self, table: &str) {
        let Raw::Dynamo { client, .. } = &self.raw else {
            return;
        };
        let active = |s: Option<&str>| s.is_none_or(|s| s == "ACTIVE");
        for _ in 0..300 {
            let described = client.describe_table().table_name(table).send().await;
            let table = described.unwrap().table.unwrap();
            if active(table.table_status().map(|s| s.as_str()))
                && table
                    .global_secondary_indexes()
                    .iter()
                    .all(|i| active(i.index_status().map(|s| s.as_str())))
            {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!(
            "{}: {table} or an index of it is not ACTIVE after 30 s",
            self.tier
        );
    }

    /// Every row of the table, raw, by `leaseKey` (a strongly consistent scan).
    async fn raw_rows(&self, table: &str) -> BTreeMap<String, Item> {
        let items: Vec<Item> = match &self.raw {
            Raw::Memory(db) => db.scan_raw(table),
            Raw::Dynamo { client, .. } => {
                let mut out = Vec::new();
                let mut start = None;
                loop {
                    let page = client
                        .scan()
                        .table_name(table)
                        .consistent_read(true)
                        .set_exclusive_start_key(start.take())
                        .send()
                        .await
                        .unwrap();
                    out.extend(page.items().iter().map(|i| item_from_sdk(i).unwrap()));
                    match page.last_evaluated_key {
                        Some(last) if !last.is_empty() => start = Some(last),
                        _ => break out,
                    }
                }
            }
        };
        items
            .into_iter()
            .map(|i| (i["leaseKey"].as_s().unwrap().to_owned(), i))
            .collect()
    }

    /// A fresh, ensured lease table.
    async fn fresh(&self) -> Arc<dyn LeaseTable> {
        let table = self.table(&servers::unique_name("leases"));
        assert_eq!(table.ensure_table().await.unwrap(), TableState::Created);
        table
    }

    async fn put_raw(&self, table: &str, item: Item) {
        match &self.raw {
            Raw::Memory(db) => db.put_raw(table, item).unwrap(),
            Raw::Dynamo { client, .. } => {
                client
                    .put_item()
                    .table_name(table)
                    .set_item(Some(item_to_sdk("PutItem", &item).unwrap()))
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    /// The row as stored, every attribute included.
    async fn get_raw(&self, table: &str, key: &str) -> Item {
        let row = match &self.raw {
            Raw::Memory(db) => db.get_raw(table, key),
            Raw::Dynamo { client, .. } => client
                .get_item()
                .table_name(table)
                .key("leaseKey", AttributeValue::S(key.into()))
                .consistent_read(true)
                .send()
                .await
                .unwrap()
                .item
                .map(|i| item_from_sdk(&i).unwrap()),
        };
        row.unwrap_or_else(|| panic!("{}: no row {key}", self.tier))
    }

    /// A lease table as the Java KCL makes it: keyed by `leaseKey`, no secondary index.
    async fn create_kcl_table(&self, name: &str) {
        match &self.raw {
            Raw::Memory(db) => db.create_table(name, "leaseKey", "S"),
            Raw::Dynamo { client, .. } => {
                client
                    .create_table()
                    .table_name(name)
                    .billing_mode(BillingMode::PayPerRequest)
                    .attribute_definitions(
                        AttributeDefinition::builder()
                            .attribute_name("leaseKey")
                            .attribute_type(ScalarAttributeType::S)
                            .build()
                            .unwrap(),
                    )
                    .key_schema(
                        KeySchemaElement::builder()
                            .attribute_name("leaseKey")
                            .key_type(KeyType::Hash)
                            .build()
                            .unwrap(),
                    )
                    .send()
                    .await
                    .unwrap();
            }
        }
    }

    async fn create_foreign_table(&self, name: &str) {
        match &self.raw {
            Raw::Memory(db) => db.create_table(name, "id", "N"),
            Raw::Dynamo { client, .. } => {
                client
                    .create_table()
                    .table_name(name)
                    .billing_mode(BillingMode::PayPerRequest)
                    .attribute_definitions(
                        AttributeDefinition::builder()
                            .attribute_name("id")
                            .attribute_type(ScalarAttributeType::N)
                            .build()
                            .unwrap(),
                    )
                    .key_schema(
                        KeySchemaElement::builder()
                            .attribute_name("id")
                            .key_type(KeyType::Hash)
                            .build()
                            .unwrap(),
                    )
                    .send()
                    .await
                    .unwrap();
            }
        }
    }
}

fn me() -> WorkerId {
    WorkerId::new("worker-a")
}

fn other() -> WorkerId {
    WorkerId::new("worker-b")
}

fn seq(n: u128) -> Checkpoint {
    Checkpoint::At(ExtendedSequenceNumber::new(
        SequenceNumber::parse(&format!(
            "4968045803116943196775406416208494311606067360047{n:07}"
        ))
        .unwrap(),
        0,
    ))
}

fn new_lease(i: u64) -> Lease {
    Lease::new(
        &ShardId::from_index(i),
        Checkpoint::TrimHorizon,
        vec![],
        Some(HashKeyRange {
            start: 0,
            end: u128::MAX,
        }),
    )
}

fn unowned(counter: u64) -> Fence {
    Fence {
        owner: None,
        counter,
    }
}

fn owned(by: &WorkerId, counter: u64) -> Fence {
    Fence {
        owner: Some(by.clone()),
        counter,
    }
}

fn fixtures_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lease-table")
}

fn fixture_items(file: &str) -> Vec<Item> {
    let path = fixtures_dir().join(file);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    serde_json::from_value(doc["items"].clone()).unwrap()
}

mod cases {
    use super::*;

    pub async fn ensure_table_creates_then_finds(env: Env) {
        let table = env.table(&servers::unique_name("leases"));
        assert_eq!(
            table.ensure_table().await.unwrap(),
            TableState::Created,
            "{}",
            env.tier
        );
        assert_eq!(table.ensure_table().await.unwrap(), TableState::Existed);
        let scan = table.scan().await.unwrap();
        assert!(scan.leases.is_empty() && scan.malformed.is_empty());
    }

    pub async fn ensure_table_refuses_a_wrong_key_schema(env: Env) {
        let name = servers::unique_name("foreign");
        env.create_foreign_table(&name).await;
        let err = env.table(&name).ensure_table().await.unwrap_err();
        assert!(matches!(err, LeaseError::WrongKeySchema { .. }), "{err:?}");
        let text = err.to_string();
        assert!(
            text.contains(&name) && text.contains("id (HASH, N)") && text.contains("leaseKey"),
            "{text}"
        );
    }

    pub async fn a_missing_table_is_not_found(env: Env) {
        let table = env.table(&servers::unique_name("missing"));
        let err = table.scan().await.unwrap_err();
        assert!(matches!(err, LeaseError::NotFound { .. }), "{err:?}");
    }

    pub async fn create_if_absent_never_overwrites(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(0);
        assert!(table.create_if_absent(&lease).await.unwrap());
        let taken = table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        assert!(!table.create_if_absent(&lease).await.unwrap());
        assert_eq!(table.get(&lease.key).await.unwrap(), Some(taken));
    }

    pub async fn take_sets_owner_and_bumps_the_counter(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(1);
        table.create_if_absent(&lease).await.unwrap();
        let taken = table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        assert_eq!(taken.owner, Some(me()));
        assert_eq!(taken.counter, 1);
        assert_eq!(taken.owner_switches_since_checkpoint, 1);
        assert_eq!(taken.checkpoint, Checkpoint::TrimHorizon);
        assert_eq!(table.get(&lease.key).await.unwrap(), Some(taken.clone()));

        // A hand-off: the owner's fence lets another worker take it.
        let moved = table
            .take(&lease.key, &owned(&me(), 1), &other())
            .await
            .unwrap();
        assert_eq!(
            (
                moved.owner,
                moved.counter,
                moved.owner_switches_since_checkpoint
            ),
            (Some(other()), 2, 2)
        );
    }

    pub async fn take_with_a_stale_fence_fails_and_names_the_owner(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(2);
        table.create_if_absent(&lease).await.unwrap();
        table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        let cases = [
            unowned(0),         // stale counter and owner
            unowned(1),         // right counter, wrong owner
            owned(&me(), 0),    // right owner, stale counter
            owned(&other(), 1), // wrong owner
        ];
        for fence in cases {
            let err = table.take(&lease.key, &fence, &other()).await.unwrap_err();
            assert_eq!(
                err,
                LeaseError::ConditionFailed {
                    key: lease.key.clone(),
                    owner: Some(me()),
                    counter: Some(1)
                },
                "{} fence {fence:?}",
                env.tier
            );
            assert!(err.to_string().contains("owner is now worker-a"), "{err}");
        }
        let missing = LeaseKey::new("shardId-999999999999");
        let err = table.take(&missing, &unowned(0), &me()).await.unwrap_err();
        assert_eq!(
            err,
            LeaseError::ConditionFailed {
                key: missing,
                owner: None,
                counter: None
            }
        );
    }

    pub async fn take_expired_holds_only_while_the_owners_heartbeat_stands_still(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(1);
        table.create_if_absent(&lease).await.unwrap();
        let held = table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        let idle = WorkerLoad::default();
        assert_eq!(table.heartbeat(&me(), &idle).await.unwrap(), 1);
        assert_eq!(table.heartbeat(&me(), &idle).await.unwrap(), 2);
        let refused = LeaseError::ConditionFailed {
            key: lease.key.clone(),
            owner: Some(me()),
            counter: Some(1),
        };
        // The owner's heartbeat is not where the taker saw it: it moved on from 1, it
        // was never absent, it never reached 3.
        for seen in [Some(1), None, Some(3)] {
            let err = table
                .take_expired(&lease.key, &held.fence(), &other(), seen)
                .await
                .unwrap_err();
            assert_eq!(err, refused, "{} seen {seen:?}", env.tier);
        }
        assert_eq!(
            table.get(&lease.key).await.unwrap(),
            Some(held.clone()),
            "{}: a refused take wrote something",
            env.tier
        );
        // A stale fence is refused whatever the heartbeat.
        let err = table
            .take_expired(&lease.key, &owned(&me(), 0), &other(), Some(2))
            .await
            .unwrap_err();
        assert_eq!(err, refused, "{}", env.tier);
        // Where the taker saw it stand: the take lands, as `take` does.
        let taken = table
            .take_expired(&lease.key, &held.fence(), &other(), Some(2))
            .await
            .unwrap();
        assert_eq!(
            (
                taken.owner.clone(),
                taken.counter,
                taken.owner_switches_since_checkpoint
            ),
            (Some(other()), 2, 2),
            "{}",
            env.tier
        );
        assert_eq!(table.get(&lease.key).await.unwrap(), Some(taken.clone()));
        // An owner that never wrote a heartbeat row (a Java KCL worker): taken while it
        // still has none.
        let kcl = WorkerId::new("kcl-worker");
        let kept = table.take(&lease.key, &taken.fence(), &kcl).await.unwrap();
        let err = table
            .take_expired(&lease.key, &kept.fence(), &me(), Some(1))
            .await
            .unwrap_err();
        assert_eq!(
            err,
            LeaseError::ConditionFailed {
                key: lease.key.clone(),
                owner: Some(kcl),
                counter: Some(3)
            },
            "{}",
            env.tier
        );
        let back = table
            .take_expired(&lease.key, &kept.fence(), &me(), None)
            .await
            .unwrap();
        assert_eq!((back.owner, back.counter), (Some(me()), 4), "{}", env.tier);
        // Without an owner in the fence there is no heartbeat to check: a plain take.
        let released = table.release(&lease.key, &owned(&me(), 4)).await.unwrap();
        let free = table
            .take_expired(&lease.key, &unowned(released), &other(), Some(7))
            .await
            .unwrap();
        assert_eq!(free.owner, Some(other()), "{}", env.tier);
    }

    pub async fn concurrent_takes_have_exactly_one_winner(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(3);
        table.create_if_absent(&lease).await.unwrap();
        let workers: Vec<WorkerId> = (0..6).map(|i| WorkerId::new(format!("w{i}"))).collect();
        let fence = unowned(0);
        let attempts =
            futures::future::join_all(workers.iter().map(|w| table.take(&lease.key, &fence, w)))
                .await;
        let winners: Vec<_> = attempts.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert_eq!(winners.len(), 1, "{attempts:?}");
        for r in &attempts {
            if let Err(e) = r {
                assert!(
                    matches!(
                        e,
                        LeaseError::ConditionFailed {
                            counter: Some(1),
                            ..
                        }
                    ),
                    "{e:?}"
                );
            }
        }
        assert_eq!(
            table.get(&lease.key).await.unwrap().unwrap().owner,
            winners[0].owner
        );
    }

    /// `lease.java_compat`'s renewal, as the Java KCL's `renewLease`: the counter + 1,
    /// conditional on owner and counter, nothing else touched.
    pub async fn renew_bumps_only_the_counter_and_is_fenced(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(5);
        table.create_if_absent(&lease).await.unwrap();
        table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        table
            .checkpoint(&lease.key, &owned(&me(), 1), &seq(7), &[])
            .await
            .unwrap();
        table
            .request_handoff(&lease.key, &owned(&me(), 1), &other())
            .await
            .unwrap();
        assert_eq!(table.renew(&lease.key, &owned(&me(), 1)).await.unwrap(), 2);
        assert_eq!(table.renew(&lease.key, &owned(&me(), 2)).await.unwrap(), 3);
        let got = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!(
            (got.owner, got.counter, got.checkpoint, got.handoff_to),
            (Some(me()), 3, seq(7), Some(other()))
        );
        match table.renew(&lease.key, &owned(&me(), 2)).await {
            Err(LeaseError::ConditionFailed { owner, counter, .. }) => {
                assert_eq!((owner, counter), (Some(me()), Some(3)))
            }
            other => panic!("a stale renewal: {other:?}"),
        }
        assert!(matches!(
            table.renew(&lease.key, &owned(&other(), 3)).await,
            Err(LeaseError::ConditionFailed { .. })
        ));
        let ghost = new_lease(6).key;
        assert!(table.renew(&ghost, &owned(&me(), 1)).await.is_err());
    }

    pub async fn release_clears_the_owner_and_bumps_the_counter(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(4);
        table.create_if_absent(&lease).await.unwrap();
        table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        assert!(matches!(
            table.release(&lease.key, &owned(&other(), 1)).await,
            Err(LeaseError::ConditionFailed { .. })
        ));
        assert_eq!(
            table.release(&lease.key, &owned(&me(), 1)).await.unwrap(),
            2
        );
        let got = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!((got.owner, got.counter), (None, 2));
        // The old owner's fence is dead.
        assert!(table.release(&lease.key, &owned(&me(), 1)).await.is_err());
        table.take(&lease.key, &unowned(2), &other()).await.unwrap();
    }

    pub async fn checkpoint_is_fenced_and_keeps_the_counter(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(5);
        table.create_if_absent(&lease).await.unwrap();
        table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        let fence = owned(&me(), 1);
        let cp = Checkpoint::At(ExtendedSequenceNumber::new(
            SequenceNumber::parse("49680458031169431967754064162084943116060673600470908946")
                .unwrap(),
            3,
        ));
        table
            .checkpoint(&lease.key, &fence, &cp, &[])
            .await
            .unwrap();
        let got = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!(
            (
                got.checkpoint,
                got.counter,
                got.owner_switches_since_checkpoint
            ),
            (cp.clone(), 1, 0)
        );
        assert!(got.child_shard_ids.is_empty());

        // A worker that lost the lease cannot move the checkpoint.
        table.take(&lease.key, &fence, &other()).await.unwrap();
        let err = table
            .checkpoint(&lease.key, &fence, &seq(9), &[])
            .await
            .unwrap_err();
        assert_eq!(
            err,
            LeaseError::ConditionFailed {
                key: lease.key.clone(),
                owner: Some(other()),
                counter: Some(2)
            }
        );
        assert_eq!(table.get(&lease.key).await.unwrap().unwrap().checkpoint, cp);

        let children = [ShardId::from_index(7), ShardId::from_index(8)];
        table
            .checkpoint(
                &lease.key,
                &owned(&other(), 2),
                &Checkpoint::ShardEnd,
                &children,
            )
            .await
            .unwrap();
        let got = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!(got.checkpoint, Checkpoint::ShardEnd);
        let mut ids = got.child_shard_ids.clone();
        ids.sort();
        assert_eq!(ids, children.to_vec());
    }

    pub async fn checkpoint_leaves_foreign_attributes_and_clears_pending(env: Env) {
        let table = env.fresh().await;
        // A row as the Java KCL leaves it: a prepared checkpoint, a throughput figure and
        // an application state blob.
        let mut row = encode_lease(&new_lease(6));
        row.insert("leaseOwner".into(), AttrValue::S("worker-a".into()));
        row.insert("leaseCounter".into(), AttrValue::N("4".into()));
        row.insert("throughputKBps".into(), AttrValue::N("0.45817".into()));
        row.insert(
            "pendingCheckpoint".into(),
            AttrValue::S("4968045803121403345815112540831603074236".into()),
        );
        row.insert(
            "pendingCheckpointSubSequenceNumber".into(),
            AttrValue::N("0".into()),
        );
        row.insert("pendingCheckpointState".into(), AttrValue::B("AAEC".into()));
        env.put_raw(table.table_name(), row).await;
        let key = ShardId::from_index(6);
        let key = LeaseKey::from(&key);
        let before = table.get(&key).await.unwrap().unwrap();
        assert!(before.pending_checkpoint.is_some());
        assert_eq!(before.pending_checkpoint_state, Some(vec![0, 1, 2]));
        table
            .checkpoint(&key, &owned(&me(), 4), &seq(1), &[])
            .await
            .unwrap();
        let after = table.get(&key).await.unwrap().unwrap();
        assert_eq!(after.pending_checkpoint, None);
        assert_eq!(after.checkpoint, seq(1));
        let raw = env.get_raw(table.table_name(), key.as_str()).await;
        assert_eq!(
            raw.get("throughputKBps"),
            Some(&AttrValue::N("0.45817".into()))
        );
        assert!(!raw.contains_key("pendingCheckpointState"));
    }

    /// A prepared checkpoint is written beside the committed one in the KCL's
    /// attributes, fenced, leaving the counter and the checkpoint; a prepare without
    /// state removes an earlier one's; the next checkpoint removes all three.
    pub async fn prepare_checkpoint_is_fenced_and_a_checkpoint_completes_it(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(8);
        table.create_if_absent(&lease).await.unwrap();
        table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        let fence = owned(&me(), 1);
        table
            .checkpoint(&lease.key, &fence, &seq(1), &[])
            .await
            .unwrap();
        let at = |n: u128| match seq(n) {
            Checkpoint::At(at) => at,
            other => panic!("{other:?}"),
        };
        table
            .prepare_checkpoint(&lease.key, &fence, &at(5), Some(&[0, 1, 2, 255]))
            .await
            .unwrap();
        let got = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!(
            (
                &got.checkpoint,
                &got.pending_checkpoint,
                &got.pending_checkpoint_state,
                got.counter,
                got.owner_switches_since_checkpoint,
            ),
            (&seq(1), &Some(at(5)), &Some(vec![0, 1, 2, 255]), 1, 0)
        );
        let raw = env.get_raw(table.table_name(), lease.key.as_str()).await;
        assert_eq!(
            raw.get("pendingCheckpointState"),
            Some(&AttrValue::B("AAEC/w==".into()))
        );
        assert_eq!(
            raw.get("pendingCheckpointSubSequenceNumber"),
            Some(&AttrValue::N("0".into()))
        );

        table
            .prepare_checkpoint(&lease.key, &fence, &at(6), None)
            .await
            .unwrap();
        let got = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!(
            (&got.pending_checkpoint, &got.pending_checkpoint_state),
            (&Some(at(6)), &None)
        );

        // Another owner's fence is refused and changes nothing.
        let err = table
            .prepare_checkpoint(&lease.key, &owned(&other(), 1), &at(9), Some(b"x"))
            .await
            .unwrap_err();
        assert!(matches!(err, LeaseError::ConditionFailed { .. }), "{err:?}");
        let got = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!(got.pending_checkpoint, Some(at(6)));

        table
            .checkpoint(&lease.key, &fence, &seq(6), &[])
            .await
            .unwrap();
        let got = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!(
            (
                &got.checkpoint,
                &got.pending_checkpoint,
                &got.pending_checkpoint_state
            ),
            (&seq(6), &None, &None)
        );
        let raw = env.get_raw(table.table_name(), lease.key.as_str()).await;
        for name in [
            "pendingCheckpoint",
            "pendingCheckpointSubSequenceNumber",
            "pendingCheckpointState",
        ] {
            assert!(!raw.contains_key(name), "{name} left in {raw:?}");
        }
    }

    pub async fn delete_is_fenced(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(7);
        table.create_if_absent(&lease).await.unwrap();
        assert!(matches!(
            table.delete(&lease.key, &unowned(5)).await,
            Err(LeaseError::ConditionFailed { .. })
        ));
        table.delete(&lease.key, &unowned(0)).await.unwrap();
        assert_eq!(table.get(&lease.key).await.unwrap(), None);
    }

    /// A round's read through the heartbeat index: what it needs of every worker the
    /// roster names, nothing of the lags and rates, nothing of workers not named.
    pub async fn a_summary_reads_the_heartbeat_index(env: Env) {
        let table = env.fresh().await;
        let busy = WorkerLoad {
            leases: 2,
            records_per_second: 40,
            draining: true,
            changes: 9,
            lag_ms: BTreeMap::from([("shardId-000000000001".to_owned(), 1500)]),
            subscribed_ms: BTreeMap::new(),
            lease_rates: Some(BTreeMap::from([(
                LeaseKey::new("shardId-000000000001"),
                LeaseRate {
                    records_per_second: 40,
                    bytes_per_second: 4000,
                },
            )])),
            // Not in the index either: read whole rows (scans) for them.
            heartbeat_interval_ms: None,
            failover_time_ms: None,
        };
        let idle = WorkerLoad::default();
        let third = WorkerId::new("worker-c");
        table.heartbeat(&me(), &busy).await.unwrap();
        table.heartbeat(&me(), &busy).await.unwrap();
        table.heartbeat(&other(), &idle).await.unwrap();
        table.heartbeat(&third, &idle).await.unwrap();
        table.join_roster(&[me(), other()]).await.unwrap();
        let read = table.heartbeats(HeartbeatDetail::Summary).await.unwrap();
        assert!(read.summary, "{}: not read through the index", env.tier);
        assert!(read.malformed.is_empty(), "{:?}", read.malformed);
        let mut beats: Vec<(WorkerId, u64, WorkerLoad)> = read
            .heartbeats
            .into_iter()
            .map(|h| (h.worker, h.counter, h.load))
            .collect();
        beats.sort_by(|a, b| a.0.cmp(&b.0));
        let summary = WorkerLoad {
            lag_ms: BTreeMap::new(),
            lease_rates: None,
            ..busy.clone()
        };
        assert_eq!(
            beats,
            [(me(), 2, summary), (other(), 1, idle.clone())],
            "{}",
            env.tier
        );
        // The whole rows, when asked for.
        let full = table.heartbeats(HeartbeatDetail::Full).await.unwrap();
        assert!(!full.summary);
        let mine = full.heartbeats.iter().find(|h| h.worker == me()).unwrap();
        assert_eq!(mine.load, busy, "{}", env.tier);
        // A clean exit leaves the index as it leaves the roster.
        table.remove_heartbeat(&me()).await.unwrap();
        let read = table.heartbeats(HeartbeatDetail::Summary).await.unwrap();
        let workers: Vec<&WorkerId> = read.heartbeats.iter().map(|h| &h.worker).collect();
        assert_eq!(workers, [&other()], "{}", env.tier);
    }

    /// A worker table made without the heartbeat index (by hand, say, beside a lease
    /// table the Java KCL made): heartbeats are read by key until `ensure_table` adds
    /// it; then through it.
    pub async fn without_the_index_heartbeats_are_read_by_key_until_ensure_adds_it(env: Env) {
        let name = servers::unique_name("kcl-leases");
        env.create_kcl_table(&name).await;
        env.create_kcl_table(&worker_table_name(&name)).await;
        let table = env.table(&name);
        let busy = WorkerLoad {
            leases: 3,
            changes: 4,
            lag_ms: BTreeMap::from([("shardId-000000000002".to_owned(), 70)]),
            ..WorkerLoad::default()
        };
        table.heartbeat(&me(), &busy).await.unwrap();
        table.join_roster(&[me()]).await.unwrap();
        let read = table.heartbeats(HeartbeatDetail::Summary).await.unwrap();
        assert!(
            !read.summary,
            "{}: no index, yet read through one",
            env.tier
        );
        assert_eq!(read.heartbeats.len(), 1);
        assert_eq!(read.heartbeats[0].load, busy, "the whole row, by key");
        assert_eq!(table.ensure_table().await.unwrap(), TableState::Existed);
        // The index is built in the background: a handle that looks afresh reads
        // through it once it is ACTIVE.
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            let read = env
                .table(&name)
                .heartbeats(HeartbeatDetail::Summary)
                .await
                .unwrap();
            if read.summary {
                assert_eq!(read.heartbeats.len(), 1, "{}", env.tier);
                assert_eq!(read.heartbeats[0].counter, 1);
                assert_eq!(read.heartbeats[0].load.changes, 4);
                assert!(read.heartbeats[0].load.lag_ms.is_empty());
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{}: the heartbeat index never became ACTIVE",
                env.tier
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    pub async fn heartbeats_count_up_and_show_in_the_scan(env: Env) {
        let table = env.fresh().await;
        let idle = WorkerLoad::default();
        let busy = WorkerLoad {
            leases: 7,
            records_per_second: 1500,
            draining: true,
            changes: 3,
            lag_ms: [
                ("shardId-000000000001".to_owned(), 0),
                ("shardId-000000000002".to_owned(), 86_400_000),
            ]
            .into(),
            subscribed_ms: [("shardId-000000000002".to_owned(), 299_000)].into(),
            lease_rates: Some(
                [(
                    LeaseKey::new("123456789012:a:1700000000:shardId-000000000002"),
                    LeaseRate {
                        records_per_second: 1500,
                        bytes_per_second: 1_200_000,
                    },
                )]
                .into(),
            ),
            // What an operator's command watches the heartbeat for.
            heartbeat_interval_ms: Some(2_000),
            failover_time_ms: Some(10_000),
        };
        assert_eq!(table.heartbeat(&me(), &idle).await.unwrap(), 1);
        assert_eq!(table.heartbeat(&me(), &busy).await.unwrap(), 2);
        // A heartbeat without rates (a count-only worker) clears the earlier ones.
        assert_eq!(table.heartbeat(&other(), &busy).await.unwrap(), 1);
        assert_eq!(table.heartbeat(&other(), &idle).await.unwrap(), 2);
        let mut beats = table.scan().await.unwrap().heartbeats;
        beats.sort_by(|a, b| a.worker.cmp(&b.worker));
        assert_eq!(
            beats
                .iter()
                .map(|h| (h.worker.as_str(), h.counter, h.load.clone()))
                .collect::<Vec<_>>(),
            [("worker-a", 2, busy), ("worker-b", 2, idle)]
        );
        table.remove_heartbeat(&me()).await.unwrap();
        table.remove_heartbeat(&me()).await.unwrap();
        let beats = table.scan().await.unwrap().heartbeats;
        assert_eq!(beats.len(), 1);
        assert!(
            table.scan().await.unwrap().leases.is_empty(),
            "heartbeats are not leases"
        );
        assert!(
            env.raw_rows(table.table_name()).await.is_empty(),
            "{}: heartbeats written into the lease table",
            env.tier
        );
    }

    /// The Java KCL reads every row of the lease table as a lease
    /// (`DynamoDBLeaseSerializer.fromDynamoRecord`, which needs `leaseKey` and a
    /// numeric `leaseCounter`): whatever a worker does, the lease table holds nothing
    /// else, and flotilla's own rows are in the worker table.
    pub async fn the_lease_table_holds_lease_rows_only(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(1);
        table.create_if_absent(&lease).await.unwrap();
        let idle = WorkerLoad::default();
        table.heartbeat(&me(), &idle).await.unwrap();
        table.heartbeat(&other(), &idle).await.unwrap();
        table.join_roster(&[me(), other()]).await.unwrap();
        let held = table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        table
            .checkpoint(&lease.key, &held.fence(), &seq(5), &[])
            .await
            .unwrap();
        table
            .request_handoff(&lease.key, &held.fence(), &other())
            .await
            .unwrap();
        table.heartbeats(HeartbeatDetail::Summary).await.unwrap();
        table.remove_heartbeat(&other()).await.unwrap();
        table.scan().await.unwrap();
        let rows = env.raw_rows(table.table_name()).await;
        assert_eq!(
            rows.keys().collect::<Vec<_>>(),
            [lease.key.as_str()],
            "{}",
            env.tier
        );
        for (key, row) in &rows {
            assert!(
                matches!(row.get("leaseCounter"), Some(AttrValue::N(_))),
                "{}: row {key} has no numeric leaseCounter: {row:?}",
                env.tier
            );
        }
        let workers = env.raw_rows(table.worker_table_name()).await;
        let mut keys: Vec<&str> = workers.keys().map(|k| k.as_str()).collect();
        keys.sort();
        assert_eq!(
            keys,
            ["flotilla-roster", "flotilla-worker#worker-a"],
            "{}",
            env.tier
        );
        assert_eq!(
            table.worker_table_name(),
            format!("{}-FlotillaWorkers", table.table_name())
        );
    }

    /// A worker of this version beside one of the version before the worker table
    /// (heartbeats and roster in the lease table): each sees the other alive, a take
    /// from either stays conditional on the row the taker judged, and once the older
    /// worker is gone its rows and this version's copies are retired, leaving lease rows
    /// only. An older worker that starts later brings the copies back.
    pub async fn beside_an_older_version_neither_breaks_and_the_legacy_rows_retire(env: Env) {
        let name = servers::unique_name("mixed");
        let new = env.table(&name);
        assert_eq!(new.ensure_table().await.unwrap(), TableState::Created);
        let older = env.older(&name);
        older.ensure_table().await.unwrap();
        env.settled(&name).await;
        let (old_w, new_w) = (WorkerId::new("old"), WorkerId::new("new"));
        let idle = WorkerLoad::default();
        assert_eq!(older.heartbeat(&old_w, &idle).await.unwrap(), 1);
        assert_eq!(older.heartbeat(&old_w, &idle).await.unwrap(), 2);
        older
            .join_roster(std::slice::from_ref(&old_w))
            .await
            .unwrap();

        // The new worker reads the older one's heartbeat through the legacy roster.
        let read = new.heartbeats(HeartbeatDetail::Full).await.unwrap();
        let counters: Vec<(&str, u64)> = read
            .heartbeats
            .iter()
            .map(|h| (h.worker.as_str(), h.counter))
            .collect();
        assert_eq!(counters, [("old", 2)], "{}", env.tier);
        assert_eq!(read.legacy.roster, Some(vec![old_w.clone()]));
        assert_eq!(read.legacy.older, vec![(old_w.clone(), 2)]);
        assert!(read.roster.contains(&old_w));

        // Its heartbeats go to both places, with one counter; the older one sees it.
        assert_eq!(new.heartbeat(&new_w, &idle).await.unwrap(), 1);
        new.join_roster(std::slice::from_ref(&new_w)).await.unwrap();
        assert_eq!(new.heartbeat(&new_w, &idle).await.unwrap(), 2);
        let seen_by_old = older.heartbeats(HeartbeatDetail::Full).await.unwrap();
        let mut counters: Vec<(String, u64)> = seen_by_old
            .heartbeats
            .iter()
            .map(|h| (h.worker.as_str().to_owned(), h.counter))
            .collect();
        counters.sort();
        assert_eq!(
            counters,
            [("new".into(), 2), ("old".into(), 2)],
            "{}",
            env.tier
        );
        let read = new.heartbeats(HeartbeatDetail::Full).await.unwrap();
        assert_eq!(read.legacy.both, vec![new_w.clone()], "{}", env.tier);

        // A take from the older worker, judged by its legacy row: refused once it moved.
        let lease = new_lease(1);
        new.create_if_absent(&lease).await.unwrap();
        let held_old = older.take(&lease.key, &unowned(0), &old_w).await.unwrap();
        assert_eq!(older.heartbeat(&old_w, &idle).await.unwrap(), 3);
        let err = new
            .take_expired(&lease.key, &held_old.fence(), &new_w, Some(2))
            .await
            .unwrap_err();
        assert!(
            matches!(err, LeaseError::ConditionFailed { .. }),
            "{}: {err:?}",
            env.tier
        );
        let held_new = new
            .take_expired(&lease.key, &held_old.fence(), &new_w, Some(3))
            .await
            .unwrap();
        assert_eq!(held_new.owner, Some(new_w.clone()));
        // And the older worker's take from the new one, judged by the copy it reads.
        assert_eq!(new.heartbeat(&new_w, &idle).await.unwrap(), 3);
        let err = older
            .take_expired(&lease.key, &held_new.fence(), &old_w, Some(2))
            .await
            .unwrap_err();
        assert!(
            matches!(err, LeaseError::ConditionFailed { .. }),
            "{}: {err:?}",
            env.tier
        );
        // A take from a peer of this version, writing both places: refused once it moved.
        let peer = WorkerId::new("new-peer");
        let peer_table = env.table(&name);
        peer_table
            .heartbeats(HeartbeatDetail::Summary)
            .await
            .unwrap();
        assert_eq!(peer_table.heartbeat(&peer, &idle).await.unwrap(), 1);
        let lease2 = new_lease(2);
        new.create_if_absent(&lease2).await.unwrap();
        let held_peer = new.take(&lease2.key, &unowned(0), &peer).await.unwrap();
        assert_eq!(peer_table.heartbeat(&peer, &idle).await.unwrap(), 2);
        assert!(
            new.take_expired(&lease2.key, &held_peer.fence(), &new_w, Some(1))
                .await
                .is_err(),
            "{}: a take from a peer whose heartbeat moved",
            env.tier
        );
        new.take_expired(&lease2.key, &held_peer.fence(), &new_w, Some(2))
            .await
            .unwrap();
        peer_table.remove_heartbeat(&peer).await.unwrap();

        // A retirement planned on a stale roster is refused and deletes nothing.
        let stale = Retirement {
            roster: Some(vec![new_w.clone()]),
            rows: vec![(new_w.clone(), None)],
        };
        assert!(!new.retire_legacy(&stale).await.unwrap(), "{}", env.tier);
        assert!(env.raw_rows(&name).await.contains_key("flotilla-roster"));

        // The older worker leaves cleanly: only this version's copies are left, and
        // they go.
        older.remove_heartbeat(&old_w).await.unwrap();
        let read = new.heartbeats(HeartbeatDetail::Full).await.unwrap();
        assert_eq!(
            read.legacy,
            LegacyRows {
                roster: Some(vec![new_w.clone()]),
                older: vec![],
                both: vec![new_w.clone()],
            },
            "{}",
            env.tier
        );
        let plan = Retirement {
            roster: Some(vec![new_w.clone()]),
            rows: vec![(new_w.clone(), None)],
        };
        assert!(new.retire_legacy(&plan).await.unwrap(), "{}", env.tier);
        let only_leases =
            |rows: &BTreeMap<String, Item>| rows.keys().all(|k| k.starts_with("shardId-"));
        assert!(only_leases(&env.raw_rows(&name).await), "{}", env.tier);
        // Heartbeats go on in the worker table alone.
        assert_eq!(new.heartbeat(&new_w, &idle).await.unwrap(), 4);
        assert_eq!(new.heartbeat(&new_w, &idle).await.unwrap(), 5);
        assert!(only_leases(&env.raw_rows(&name).await), "{}", env.tier);
        assert!(new.scan().await.unwrap().legacy.is_empty());

        // An older worker starts again: the copies come back while it is there.
        older.heartbeat(&old_w, &idle).await.unwrap();
        older
            .join_roster(std::slice::from_ref(&old_w))
            .await
            .unwrap();
        new.heartbeats(HeartbeatDetail::Summary).await.unwrap();
        assert_eq!(new.heartbeat(&new_w, &idle).await.unwrap(), 6);
        let seen_by_old = older.heartbeats(HeartbeatDetail::Full).await.unwrap();
        assert!(
            seen_by_old
                .heartbeats
                .iter()
                .any(|h| h.worker == new_w && h.counter == 6),
            "{}: {:?}",
            env.tier,
            seen_by_old.heartbeats
        );
    }

    pub async fn the_roster_names_the_heartbeat_rows_a_round_reads(env: Env) {
        let table = env.fresh().await;
        let none = table.heartbeats(HeartbeatDetail::Full).await.unwrap();
        // The roster, and the legacy roster in the lease table (one BatchGetItem).
        assert_eq!((none.roster.len(), none.items_read), (0, 2), "{}", env.tier);
        let idle = WorkerLoad::default();
        let busy = WorkerLoad {
            leases: 2,
            changes: 9,
            ..WorkerLoad::default()
        };
        table.heartbeat(&me(), &busy).await.unwrap();
        table.heartbeat(&other(), &idle).await.unwrap();
        // Rows exist, but only the roster says which to read.
        assert!(
            table
                .heartbeats(HeartbeatDetail::Full)
                .await
                .unwrap()
                .heartbeats
                .is_empty()
        );
        table.join_roster(&[me()]).await.unwrap();
        let third = WorkerId::new("worker-c");
        // Joining twice is fine; a named worker without a row is skipped.
        table
            .join_roster(&[me(), other(), third.clone()])
            .await
            .unwrap();
        let read = table.heartbeats(HeartbeatDetail::Full).await.unwrap();
        let mut roster = read.roster.clone();
        roster.sort();
        assert_eq!(roster, [me(), other(), third.clone()]);
        assert_eq!(read.items_read, 5);
        let mut beats: Vec<(WorkerId, u64, WorkerLoad)> = read
            .heartbeats
            .into_iter()
            .map(|h| (h.worker, h.counter, h.load))
            .collect();
        beats.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(beats, [(me(), 1, busy), (other(), 1, idle.clone())]);
        // The roster is not a lease, nor a heartbeat, nor another program's row.
        let scan = table.scan().await.unwrap();
        assert!(scan.leases.is_empty() && scan.malformed.is_empty());
        assert_eq!((scan.heartbeats.len(), scan.other_rows), (2, 0));
        assert!(scan.legacy.is_empty(), "{:?}", scan.legacy);
        // A clean exit leaves the roster.
        table.remove_heartbeat(&me()).await.unwrap();
        let read = table.heartbeats(HeartbeatDetail::Full).await.unwrap();
        assert!(!read.roster.contains(&me()), "{:?}", read.roster);
        assert_eq!(read.heartbeats.len(), 1);
        // More workers than one BatchGetItem takes (100).
        let many: Vec<WorkerId> = (0..130)
            .map(|i| WorkerId::new(format!("w{i:03}")))
            .collect();
        for w in &many {
            table.heartbeat(w, &idle).await.unwrap();
        }
        table.join_roster(&many).await.unwrap();
        let read = table.heartbeats(HeartbeatDetail::Full).await.unwrap();
        assert_eq!(read.heartbeats.len(), 131, "{}", env.tier);
        assert_eq!(read.items_read, 2 + 132);
    }

    pub async fn a_dead_workers_row_is_removed_only_while_its_counter_stands(env: Env) {
        let table = env.fresh().await;
        let idle = WorkerLoad::default();
        table.heartbeat(&other(), &idle).await.unwrap();
        table.heartbeat(&other(), &idle).await.unwrap();
        table.join_roster(&[me(), other()]).await.unwrap();
        // It moved since it was seen at 1: kept.
        assert!(!table.remove_dead_heartbeat(&other(), 1).await.unwrap());
        assert_eq!(
            table
                .heartbeats(HeartbeatDetail::Full)
                .await
                .unwrap()
                .heartbeats
                .len(),
            1
        );
        assert!(table.remove_dead_heartbeat(&other(), 2).await.unwrap());
        let read = table.heartbeats(HeartbeatDetail::Full).await.unwrap();
        assert_eq!(read.roster, [me()]);
        assert!(read.heartbeats.is_empty());
        assert!(table.scan().await.unwrap().heartbeats.is_empty());
        // Already gone: nothing to do.
        assert!(table.remove_dead_heartbeat(&other(), 2).await.unwrap());
        // It comes back: its row starts again, and it joins again.
        assert_eq!(table.heartbeat(&other(), &idle).await.unwrap(), 1);
    }

    pub async fn heartbeats_reports_a_malformed_heartbeat_row_and_goes_on(env: Env) {
        let table = env.fresh().await;
        table
            .heartbeat(&me(), &WorkerLoad::default())
            .await
            .unwrap();
        env.put_raw(
            table.worker_table_name(),
            serde_json::from_str(r#"{"leaseKey":{"S":"flotilla-worker#worker-b"},"entityType":{"S":"FLOTILLA_WORKER"},"leaseOwner":{"S":"worker-b"},"leaseCounter":{"S":"x"}}"#).unwrap(),
        )
        .await;
        table.join_roster(&[me(), other()]).await.unwrap();
        let read = table.heartbeats(HeartbeatDetail::Full).await.unwrap();
        assert_eq!(read.heartbeats.len(), 1, "{}", env.tier);
        assert_eq!(read.malformed.len(), 1);
        assert_eq!(
            read.malformed[0].key.as_deref(),
            Some("flotilla-worker#worker-b")
        );
    }

    pub async fn a_handoff_request_leaves_the_counter_and_only_its_asker_gets_the_lease(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(8);
        table.create_if_absent(&lease).await.unwrap();
        let held = table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        let third = WorkerId::new("worker-c");
        // A request against a stale fence is refused.
        assert!(matches!(
            table
                .request_handoff(&lease.key, &unowned(0), &other())
                .await,
            Err(LeaseError::ConditionFailed { .. })
        ));
        table
            .request_handoff(&lease.key, &held.fence(), &other())
            .await
            .unwrap();
        // Asking again is fine; a second asker is refused.
        table
            .request_handoff(&lease.key, &held.fence(), &other())
            .await
            .unwrap();
        assert!(matches!(
            table
                .request_handoff(&lease.key, &held.fence(), &third)
                .await,
            Err(LeaseError::ConditionFailed { .. })
        ));
        let asked = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!(asked.handoff_to, Some(other()));
        assert_eq!(asked.fence(), held.fence(), "a request moves no counter");
        // The owner's checkpoints go on while the request waits.
        table
            .checkpoint(&lease.key, &held.fence(), &seq(5), &[])
            .await
            .unwrap();
        // Only the asker can be the target of the transfer.
        assert!(matches!(
            table.transfer(&lease.key, &held.fence(), &third).await,
            Err(LeaseError::ConditionFailed { .. })
        ));
        let counter = table
            .transfer(&lease.key, &held.fence(), &other())
            .await
            .unwrap();
        assert_eq!(counter, held.counter + 1);
        let moved = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!(moved.owner, Some(other()));
        assert_eq!(moved.handoff_to, None);
        assert_eq!(
            moved.checkpoint,
            seq(5),
            "the new owner starts at the checkpoint"
        );
        assert_eq!(moved.owner_switches_since_checkpoint, 1);
        // The old fence is dead: no more checkpoints or transfers from the old owner.
        assert!(matches!(
            table
                .checkpoint(&lease.key, &held.fence(), &seq(6), &[])
                .await,
            Err(LeaseError::ConditionFailed { .. })
        ));
    }

    pub async fn a_request_is_cleared_by_its_asker_or_by_a_take_or_release(env: Env) {
        let table = env.fresh().await;
        let lease = new_lease(9);
        table.create_if_absent(&lease).await.unwrap();
        let held = table.take(&lease.key, &unowned(0), &me()).await.unwrap();
        table
            .request_handoff(&lease.key, &held.fence(), &other())
            .await
            .unwrap();
        // Only the request's own asker is cleared.
        assert!(matches!(
            table.clear_handoff(&lease.key, &me()).await,
            Err(LeaseError::ConditionFailed { .. })
        ));
        table.clear_handoff(&lease.key, &other()).await.unwrap();
        let cleared = table.get(&lease.key).await.unwrap().unwrap();
        assert_eq!(cleared.handoff_to, None);
        assert_eq!(cleared.fence(), held.fence());
        // A transfer without a request is refused.
        assert!(matches!(
            table.transfer(&lease.key, &held.fence(), &other()).await,
            Err(LeaseError::ConditionFailed { .. })
        ));
        // Release and take drop a pending request.
        table
            .request_handoff(&lease.key, &held.fence(), &other())
            .await
            .unwrap();
        let counter = table.release(&lease.key, &held.fence()).await.unwrap();
        assert_eq!(
            table.get(&lease.key).await.unwrap().unwrap().handoff_to,
            None
        );
        let retaken = table
            .take(&lease.key, &unowned(counter), &me())
            .await
            .unwrap();
        table
            .request_handoff(&lease.key, &retaken.fence(), &other())
            .await
            .unwrap();
        let taken = table
            .take(&lease.key, &retaken.fence(), &WorkerId::new("worker-c"))
            .await
            .unwrap();
        assert_eq!(taken.handoff_to, None);
        // Clearing a missing row is a condition failure, not a new row.
        let ghost = LeaseKey::new("shardId-000000000999");
        assert!(matches!(
            table.clear_handoff(&ghost, &other()).await,
            Err(LeaseError::ConditionFailed { .. })
        ));
        assert_eq!(table.get(&ghost).await.unwrap(), None);
    }

    /// A refused write reports who holds the lease now, read from the row's owner and
    /// counter alone: an attribute the codec cannot read (here a checkpoint) does not
    /// turn "someone else holds it" into an unreadable-row error.
    pub async fn a_refused_condition_reads_only_owner_and_counter(env: Env) {
        let table = env.fresh().await;
        env.put_raw(
            table.table_name(),
            serde_json::from_str(
                r#"{"leaseKey":{"S":"odd-1"},"leaseOwner":{"S":"worker-b"},"leaseCounter":{"N":"3"},"checkpoint":{"S":"12ab"}}"#,
            )
            .unwrap(),
        )
        .await;
        let key = LeaseKey::new("odd-1");
        let want = LeaseError::ConditionFailed {
            key: key.clone(),
            owner: Some(other()),
            counter: Some(3),
        };
        let stale = owned(&me(), 2);
        assert_eq!(
            table.take(&key, &stale, &me()).await.unwrap_err(),
            want,
            "{}",
            env.tier
        );
        assert_eq!(table.release(&key, &stale).await.unwrap_err(), want);
        assert_eq!(
            table
                .checkpoint(&key, &stale, &seq(1), &[])
                .await
                .unwrap_err(),
            want
        );
        assert_eq!(table.delete(&key, &stale).await.unwrap_err(), want);
        assert_eq!(table.clear_handoff(&key, &me()).await.unwrap_err(), want);
    }

    pub async fn scan_reports_malformed_rows_and_goes_on(env: Env) {
        let table = env.fresh().await;
        for i in 0..3 {
            table.create_if_absent(&new_lease(i)).await.unwrap();
        }
        let bad: [(&str, &str); 3] = [
            (
                r#"{"leaseKey":{"S":"bad-1"},"checkpoint":{"S":"LATEST"}}"#,
                "lease row bad-1: attribute leaseCounter: missing",
            ),
            (
                r#"{"leaseKey":{"S":"bad-2"},"leaseCounter":{"S":"x"},"checkpoint":{"S":"LATEST"}}"#,
                "lease row bad-2: attribute leaseCounter: expected type N, found S",
            ),
            (
                r#"{"leaseKey":{"S":"bad-3"},"leaseCounter":{"N":"1"},"checkpoint":{"S":"12ab"}}"#,
                "lease row bad-3: attribute checkpoint: not a sequence number",
            ),
        ];
        for (json, _) in bad {
            env.put_raw(table.table_name(), serde_json::from_str(json).unwrap())
                .await;
        }
        env.put_raw(
            table.table_name(),
            serde_json::from_str(r#"{"leaseKey":{"S":"TableMigration3.5"},"entityType":{"S":"TABLE_MIGRATION"},"tm":{"N":"1"}}"#).unwrap(),
        )
        .await;
        let scan = table.scan().await.unwrap();
        assert_eq!(scan.leases.len(), 3, "{}", env.tier);
        assert_eq!(scan.other_rows, 1);
        let mut found: Vec<String> = scan.malformed.iter().map(|m| m.to_string()).collect();
        found.sort();
        for ((_, want), got) in bad.iter().zip(&found) {
            assert!(got.starts_with(want), "got {got}, want {want}");
        }
    }

    pub async fn scan_paginates_past_one_megabyte(env: Env) {
        let table = env.fresh().await;
        let pad = "x".repeat(8 * 1024);
        let rows = 160; // ~1.3 MB: more than one Scan page
        let puts = (0..rows).map(|i| {
            let mut row = encode_lease(&new_lease(i));
            row.insert("padding".into(), AttrValue::S(pad.clone()));
            env.put_raw(table.table_name(), row)
        });
        futures::future::join_all(puts).await;
        assert_eq!(table.scan().await.unwrap().leases.len(), rows as usize);
    }

    pub async fn reads_rows_written_by_another_kcl(env: Env) {
        for file in [
            "fixture-app.before-split.json",
            "fixture-app.after-split.json",
            "fixture-multi-app.json",
        ] {
            let table = env.fresh().await;
            let items = fixture_items(file);
            for item in &items {
                env.put_raw(table.table_name(), item.clone()).await;
            }
            let scan = table.scan().await.unwrap();
            assert!(scan.malformed.is_empty(), "{file}: {:?}", scan.malformed);
            let mut want: Vec<Lease> = items
                .iter()
                .map(|i| match decode_row(i).unwrap() {
                    Row::Lease(l) => *l,
                    other => panic!("{other:?}"),
                })
                .collect();
            let mut got = scan.leases;
            want.sort_by(|a, b| a.key.cmp(&b.key));
            got.sort_by(|a, b| a.key.cmp(&b.key));
            for lease in got.iter_mut().chain(want.iter_mut()) {
                lease.parent_shard_ids.sort();
                lease.child_shard_ids.sort();
            }
            assert_eq!(got, want, "{file} on {}", env.tier);
        }
    }
}

macro_rules! suite {
    ($tier:ident, $env:expr) => {
        mod $tier {
            use super::*;
            suite!(@cases $env;
                ensure_table_creates_then_finds,
                ensure_table_refuses_a_wrong_key_schema,
                a_missing_table_is_not_found,
                create_if_absent_never_overwrites,
                take_sets_owner_and_bumps_the_counter,
                take_with_a_stale_fence_fails_and_names_the_owner,
                take_expired_holds_only_while_the_owners_heartbeat_stands_still,
                concurrent_takes_have_exactly_one_winner,
                release_clears_the_owner_and_bumps_the_counter,
                renew_bumps_only_the_counter_and_is_fenced,
                checkpoint_is_fenced_and_keeps_the_counter,
                checkpoint_leaves_foreign_attributes_and_clears_pending,
                prepare_checkpoint_is_fenced_and_a_checkpoint_completes_it,
                delete_is_fenced,
                heartbeats_count_up_and_show_in_the_scan,
                the_roster_names_the_heartbeat_rows_a_round_reads,
                a_summary_reads_the_heartbeat_index,
                without_the_index_heartbeats_are_read_by_key_until_ensure_adds_it,
                a_dead_workers_row_is_removed_only_while_its_counter_stands,
                heartbeats_reports_a_malformed_heartbeat_row_and_goes_on,
                a_handoff_request_leaves_the_counter_and_only_its_asker_gets_the_lease,
                a_request_is_cleared_by_its_asker_or_by_a_take_or_release,
                a_refused_condition_reads_only_owner_and_counter,
                scan_reports_malformed_rows_and_goes_on,
                scan_paginates_past_one_megabyte,
                reads_rows_written_by_another_kcl,
                the_lease_table_holds_lease_rows_only,
                beside_an_older_version_neither_breaks_and_the_legacy_rows_retire,
            );
        }
    };
    (@cases $env:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test]
            async fn $case() {
                cases::$case($env).await
            }
        )*
    };
}

suite!(memory, Env::memory().await);
suite!(dynoxide, Env::dynoxide().await);
suite!(stripped_dynoxide, Env::stripped_dynoxide().await);
#[cfg(feature = "external-servers")]
suite!(dynamodb_local, Env::dynamodb_local().await);
#[cfg(feature = "external-servers")]
suite!(moto, Env::moto().await);

/// A server that ignores `ReturnValuesOnConditionCheckFailure` (no old item with the
/// refusal): the adapter reads the row to say who holds it, or that it is gone.
#[tokio::test]
async fn a_refused_condition_without_the_old_item_reads_the_row() {
    let upstream = servers::start_dynoxide().await;
    let proxy = StrippingProxy::start(
        &upstream,
        Options {
            drop_old_item: true,
        },
    )
    .await;
    let env = Env::aws(proxy.url().to_owned(), "stripped_dynoxide").await;
    let table = env.fresh().await;
    let lease = new_lease(1);
    table.create_if_absent(&lease).await.unwrap();
    table.take(&lease.key, &unowned(0), &me()).await.unwrap();
    let gets = proxy.calls("GetItem");
    assert_eq!(
        table
            .take(&lease.key, &unowned(0), &other())
            .await
            .unwrap_err(),
        LeaseError::ConditionFailed {
            key: lease.key.clone(),
            owner: Some(me()),
            counter: Some(1)
        }
    );
    assert_eq!(proxy.calls("GetItem"), gets + 1, "the row was read once");
    let ghost = LeaseKey::new("shardId-000000000999");
    assert_eq!(
        table.release(&ghost, &unowned(0)).await.unwrap_err(),
        LeaseError::ConditionFailed {
            key: ghost,
            owner: None,
            counter: None
        }
    );
}

/// An HTTP 500 without an error code (a load balancer's, an emulator's error page) is
/// transient: the caller backs off and retries, and the next call goes through.
#[tokio::test]
async fn a_bare_500_is_transient() {
    let upstream = servers::start_dynoxide().await;
    let proxy = StrippingProxy::start(&upstream, Options::default()).await;
    let env = Env::aws(proxy.url().to_owned(), "stripped_dynoxide").await;
    let table = env.fresh().await;
    // More than the SDK's own attempts (3), so the adapter sees the failure.
    proxy.fault_next("UpdateItem", 3, Fault::Bare500);
    let err = table
        .heartbeat(&me(), &WorkerLoad::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, LeaseError::Transient { .. }) && err.is_retryable(),
        "{err:?}"
    );
    assert_eq!(proxy.calls("UpdateItem"), 3, "the SDK tried three times");
    assert_eq!(
        table
            .heartbeat(&me(), &WorkerLoad::default())
            .await
            .unwrap(),
        1
    );
}

/// An unreachable DynamoDB is an error that names the endpoint, not a hang or a panic.
#[tokio::test]
async fn an_unreachable_endpoint_is_named_in_the_error() {
    let sdk = servers::sdk_config();
    let table = DynamoLeaseTable::new(&sdk, Some("http://127.0.0.1:1"), "leases");
    let err = table.scan().await.unwrap_err();
    assert!(err.to_string().contains("http://127.0.0.1:1"), "{err}");
    assert!(err.is_retryable(), "{err:?}");
}

/// Credentials that may not make a call (or are not valid) are a typed error, neither
/// retried nor taken for a fault of the server, whatever the code's spelling or a bare
/// 403: the binary's hint (what to grant) matches the type, not the text.
#[tokio::test]
async fn a_refusal_of_the_credentials_is_access_denied() {
    let upstream = servers::start_dynoxide().await;
    let proxy = StrippingProxy::start(&upstream, Options::default()).await;
    let env = Env::aws(proxy.url().to_owned(), "stripped_dynoxide").await;
    let table = env.fresh().await;
    let refusals = [
        (
            400,
            serde_json::json!({
                "__type": "com.amazon.coral.service#AccessDeniedException",
                "message": "User: arn:aws:iam::1:user/x is not authorized to perform: dynamodb:Scan"
            }),
        ),
        (
            400,
            serde_json::json!({
                "__type": "com.amazon.coral.service#UnrecognizedClientException",
                "message": "The security token included in the request is invalid."
            }),
        ),
        (403, serde_json::json!({})),
    ];
    for (status, body) in refusals {
        proxy.fault_next("Scan", 1, Fault::Refuse(status, body.clone()));
        let err = table.scan().await.unwrap_err();
        assert!(
            matches!(err, LeaseError::AccessDenied { op: "Scan", .. }),
            "{status} {body}: {err:?}"
        );
        assert!(!err.is_retryable(), "{err:?}");
    }
    // The next call, not refused, goes through.
    table.scan().await.unwrap();
}

/// A server without transactions (TransactWriteItems an unknown operation, as in some
/// emulators): the take of a dead owner's lease falls back to the plain conditional take
/// (said once at WARN) rather than never taking it, and stops asking.
#[tokio::test]
async fn without_transactions_an_expired_lease_is_taken_by_a_plain_conditional_write() {
    let upstream = servers::start_dynoxide().await;
    let proxy = StrippingProxy::start(&upstream, Options::default()).await;
    let env = Env::aws(proxy.url().to_owned(), "stripped_dynoxide").await;
    let table = env.fresh().await;
    let lease = new_lease(1);
    table.create_if_absent(&lease).await.unwrap();
    let held = table.take(&lease.key, &unowned(0), &me()).await.unwrap();
    let unknown = serde_json::json!({
        "__type": "com.amazon.coral.service#UnknownOperationException",
        "message": "An unknown operation was requested."
    });
    proxy.fault_next("TransactWriteItems", 1, Fault::Refuse(400, unknown));
    let taken = table
        .take_expired(&lease.key, &held.fence(), &other(), Some(5))
        .await
        .unwrap();
    assert_eq!((taken.owner.clone(), taken.counter), (Some(other()), 2));
    let back = table
        .take_expired(&lease.key, &taken.fence(), &me(), None)
        .await
        .unwrap();
    assert_eq!((back.owner, back.counter), (Some(me()), 3));
    assert_eq!(
        proxy.calls("TransactWriteItems"),
        1,
        "a server without transactions is asked once"
    );
}

/// Where the index may not be added (no `dynamodb:UpdateTable`), `ensure_table` still
/// succeeds and heartbeats are read by key, whole.
#[tokio::test]
async fn where_the_index_may_not_be_added_heartbeats_are_read_by_key() {
    let db = MemoryDynamo::new();
    db.create_table("kcl", "leaseKey", "S");
    db.create_table(&worker_table_name("kcl"), "leaseKey", "S");
    db.refuse_table_updates();
    let table = db.lease_table("kcl");
    assert_eq!(table.ensure_table().await.unwrap(), TableState::Existed);
    assert!(!db.has_heartbeat_index(&worker_table_name("kcl")));
    table
        .heartbeat(&me(), &WorkerLoad::default())
        .await
        .unwrap();
    table.join_roster(&[me()]).await.unwrap();
    let read = table.heartbeats(HeartbeatDetail::Summary).await.unwrap();
    assert!(!read.summary);
    assert_eq!(read.heartbeats.len(), 1);
}

/// A lagging index: a joiner's row not in it yet is read by key; a counter seen
/// through it may be old, never newer than the row.
#[tokio::test(start_paused = true)]
async fn a_lagging_index_shows_old_counters_and_joiners_are_read_by_key() {
    let db = MemoryDynamo::new();
    let table = db.lease_table("lagging");
    table.ensure_table().await.unwrap();
    db.lag_heartbeat_index(Duration::from_secs(5));
    let idle = WorkerLoad::default();
    table.heartbeat(&me(), &idle).await.unwrap();
    table.join_roster(&[me()]).await.unwrap();
    // Not in the index yet: read by key, at its counter.
    let read = table.heartbeats(HeartbeatDetail::Summary).await.unwrap();
    assert_eq!(read.heartbeats.len(), 1);
    assert_eq!(read.heartbeats[0].counter, 1);
    assert_eq!(
        read.items_read, 3,
        "the roster, the legacy roster and one row by key"
    );
    tokio::time::advance(Duration::from_secs(6)).await;
    table.heartbeat(&me(), &idle).await.unwrap();
    // In the index now, at its counter of 5 s ago.
    let read = table.heartbeats(HeartbeatDetail::Summary).await.unwrap();
    assert_eq!(read.heartbeats[0].counter, 1);
    tokio::time::advance(Duration::from_secs(5)).await;
    let read = table.heartbeats(HeartbeatDetail::Summary).await.unwrap();
    assert_eq!(read.heartbeats[0].counter, 2);
    assert_eq!(
        table
            .heartbeats(HeartbeatDetail::Full)
            .await
            .unwrap()
            .heartbeats[0]
            .counter,
        2
    );
}
