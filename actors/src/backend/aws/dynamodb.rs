//! [`LeaseTable`] on aws-sdk-dynamodb.
//!
//! Rows are read and written through the shared codec in `model::item`; this file only
//! converts its [`AttrValue`]s to the SDK's `AttributeValue`s and back, and writes the
//! conditions. Every write that changes ownership or progress is a conditional
//! UpdateItem/DeleteItem on the caller's [`Fence`]; a failed condition comes back as
//! `ConditionFailed` with the row's current owner and counter, taken from the item the
//! server returns (`ReturnValuesOnConditionCheckFailure = ALL_OLD`) or, when a server
//! does not return it, from one strongly consistent GetItem.
//!
//! Each call asks for, and reads, only what it uses ([`Answer`]): a write whose caller
//! needs nothing back asks for nothing, one that needs the new counter asks for
//! `UPDATED_NEW` and reads `leaseCounter` alone, and only `take`, which returns the
//! lease as written, asks for the whole row (`ALL_NEW`). `UPDATED_NEW` is never read as
//! a row: DynamoDB returns the updated attributes without the key, and some servers
//! (moto) return only those whose value changed, so a heartbeat's answer may hold its
//! counter and nothing else. A refused condition reads only owner and counter.
//!
//! Retries are the SDK's (its retry config in the `SdkConfig`); this adapter adds none.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use aws_sdk_dynamodb::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::delete_item::DeleteItemError;
use aws_sdk_dynamodb::operation::put_item::PutItemError;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::operation::update_item::UpdateItemError;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, AttributeValue, BillingMode, ConditionCheck, ConsumedCapacity,
    CreateGlobalSecondaryIndexAction, GlobalSecondaryIndex, GlobalSecondaryIndexUpdate,
    IndexStatus, KeySchemaElement, KeyType, KeysAndAttributes, PointInTimeRecoverySpecification,
    PointInTimeRecoveryStatus, Projection, ProjectionType, ProvisionedThroughput,
    ReturnConsumedCapacity, ReturnValue, ReturnValuesOnConditionCheckFailure, ScalarAttributeType,
    TableDescription, TableStatus, Tag, TransactWriteItem, Update,
};
use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use futures::future::BoxFuture;
use tokio::time::Instant;
use tracing::{info, warn};

use super::Failure;

use crate::backend::layout::{self, BeatCheck, Dual, LegacyWrite, Place, Retirement};
use crate::backend::{
    HeartbeatDetail, HeartbeatsOutput, LeaseError, LeaseTable, ScanOutput, TableState, WorkerRows,
};
use crate::model::item::{
    AttrValue, ENTITY_ROSTER, ENTITY_WORKER, HEARTBEAT_INDEX, HEARTBEAT_INDEX_PROJECTION, Item,
    MalformedRow, PENDING_ATTRS, ROSTER_KEY, ReadUnits, Row, attr, checkpoint_attrs,
    decode_counter, decode_fence, decode_row, encode_lease, heartbeat_key, load_attrs,
    pending_checkpoint_attrs, shard_set,
};
use crate::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, ShardId, WorkerId, WorkerLoad,
};

/// The most keys one BatchGetItem may ask for.
const BATCH_GET_MAX: usize = 100;
/// How many times keys a BatchGetItem left unprocessed (throttled) are asked for again,
/// with a doubling pause from [`POLL_INTERVAL`], before the read fails as throttled.
const UNPROCESSED_RETRIES: u32 = 6;

/// How often and how long `ensure_table` polls for a new table to be ACTIVE.
const POLL_INTERVAL: Duration = Duration::from_millis(100);
const WAIT_LIMIT: Duration = Duration::from_secs(60);
/// While the heartbeat index is missing or still being built, how often DescribeTable
/// looks again whether it is ACTIVE (until then heartbeats are read by key).
const INDEX_RECHECK: Duration = Duration::from_secs(60);

type SdkItem = HashMap<String, AttributeValue>;

/// The IAM actions this adapter calls, one per SDK operation in this file; a test
/// (`tests/deploy.rs`) reads the file and keeps the two equal. They act on two tables
/// (`layout`), and this list is their union; a policy scopes each action to the
/// tables it acts on (`tests/deploy.rs`'s `LEASE_ADAPTER_TABLES` says the same split,
/// and checks deploy/'s policies against it):
///
/// * the lease table (the application's name; lease rows only, as the KCL reads every
///   row of it as a lease): `DescribeTable`, `CreateTable`, `Scan`, `GetItem`,
///   `BatchGetItem`, `PutItem`, `UpdateItem`, `DeleteItem` and `ConditionCheckItem`.
///   Besides the leases, `Scan`, `BatchGetItem`, `UpdateItem`, `DeleteItem` and the
///   condition check (in the take's `TransactWriteItems`) reach the legacy rows an
///   older flotilla left there. No `UpdateTable` and no `Query`: the lease table has no
///   index of ours;
/// * the worker table (`layout::worker_table_name`: heartbeats and the roster):
///   `DescribeTable`, `CreateTable`, `UpdateTable`, `Scan`, `BatchGetItem`,
///   `UpdateItem`, `DeleteItem` and `ConditionCheckItem` (in the take's
///   `TransactWriteItems`), never `GetItem` or `PutItem`; and `Query`, on its heartbeat
///   index (`<worker table ARN>/index/flotilla-heartbeats`).
///
/// `CreateTable` is called only by `ensure_table` when a table is missing (`flotilla
/// init`, or a worker's start); where the tables are made beforehand (deploy/'s
/// CloudFormation stack) a worker does not need it. `UpdateTable` likewise, only to add
/// the heartbeat index to a worker table that lacks it; without it heartbeats are read
/// by key. The operator's calls of `flotilla init` and `flotilla destroy`, which no
/// worker makes, are not listed (`DeleteTable` of both tables; on the lease table
/// `DescribeContinuousBackups`, `UpdateContinuousBackups`, `TagResource`, and
/// `UpdateTable` for deletion protection, listed only as the worker table's). A handle
/// of [`DynamoLeaseTable::older_version`], for tests, keeps everything in the lease
/// table.
pub const IAM_ACTIONS: &[&str] = &[
    "dynamodb:DescribeTable",
    "dynamodb:CreateTable",
    "dynamodb:UpdateTable",
    "dynamodb:Scan",
    "dynamodb:Query",
    "dynamodb:GetItem",
    "dynamodb:BatchGetItem",
    "dynamodb:PutItem",
    "dynamodb:UpdateItem",
    "dynamodb:DeleteItem",
    "dynamodb:ConditionCheckItem",
];

/// A KCL-compatible lease table in DynamoDB.
#[derive(Debug, Clone)]
pub struct DynamoLeaseTable {
    client: aws_sdk_dynamodb::Client,
    table: String,
    /// The worker table (`layout::worker_table_name`): heartbeats and the roster. The
    /// lease table's own name for a handle of the older layout.
    workers: String,
    /// This handle's state towards the lease table's legacy rows (`layout::Dual`).
    dual: Arc<Mutex<Dual>>,
    /// Named in transient errors so an operator can tell which endpoint is unreachable.
    endpoint: String,
    /// Cleared when the server turns TransactWriteItems down as an unknown operation
    /// (some emulators have no transactions): expired leases are then taken with a
    /// plain conditional write, said once at WARN.
    transactions: Arc<AtomicBool>,
    /// Whether heartbeats can be read through the worker table's [`HEARTBEAT_INDEX`],
    /// as last learnt.
    index: Arc<Mutex<IndexState>>,
}

/// What this adapter knows of the table's heartbeat index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IndexState {
    /// Not looked yet (no `ensure_table` on this handle).
    Unknown,
    Active,
    /// Missing, or being built, as DescribeTable said at `checked`: heartbeats are
    /// read by key until a look after [`INDEX_RECHECK`] finds it ACTIVE.
    Absent {
        checked: Instant,
    },
}

/// The index's key, projection and attribute definition, as CreateTable and UpdateTable
/// declare them.
fn index_parts() -> Result<(KeySchemaElement, Projection, AttributeDefinition), LeaseError> {
    const OP: &str = "CreateTable";
    let key = KeySchemaElement::builder()
        .attribute_name(attr::HEARTBEAT_INDEX_KEY)
        .key_type(KeyType::Hash)
        .build()
        .map_err(|e| build_error(OP, e))?;
    let projection = Projection::builder()
        .projection_type(ProjectionType::Include)
        .set_non_key_attributes(Some(
            HEARTBEAT_INDEX_PROJECTION
                .iter()
                .map(|a| (*a).to_owned())
                .collect(),
        ))
        .build();
    let definition = AttributeDefinition::builder()
        .attribute_name(attr::HEARTBEAT_INDEX_KEY)
        .attribute_type(ScalarAttributeType::S)
        .build()
        .map_err(|e| build_error(OP, e))?;
    Ok((key, projection, definition))
}

/// The heartbeat index's status in a table's description; `None` if it has none.
fn index_status(table: &TableDescription) -> Option<IndexStatus> {
    table
        .global_secondary_indexes()
        .iter()
        .find(|i| i.index_name() == Some(HEARTBEAT_INDEX))
        .map(|i| i.index_status().cloned().unwrap_or(IndexStatus::Active))
}

/// Sum of what a call's ConsumedCapacity says it was billed.
fn units<'a>(consumed: impl IntoIterator<Item = &'a ConsumedCapacity>) -> ReadUnits {
    consumed
        .into_iter()
        .map(|c| ReadUnits::from_units(c.capacity_units().unwrap_or(0.0)))
        .fold(ReadUnits::default(), |a, b| a + b)
}

/// What a conditional UpdateItem asks the server to return, and so all that is read
/// from its answer.
#[derive(Debug, Clone, Copy)]
enum Answer {
    /// Nothing (`ReturnValues` NONE): the caller needs only to know the write happened.
    Nothing,
    /// The new `leaseCounter` (`UPDATED_NEW`). Every write that asks for it changes the
    /// counter, so every server returns it.
    Counter,
    /// The whole row as written (`ALL_NEW`).
    Row,
}

impl Answer {
    fn return_value(self) -> ReturnValue {
        match self {
            Answer::Nothing => ReturnValue::None,
            Answer::Counter => ReturnValue::UpdatedNew,
            Answer::Row => ReturnValue::AllNew,
        }
    }
}

/// Why a conditional write did not happen.
enum WriteFailure {
    /// The condition did not hold; the row as the server returned it, if it did.
    Condition(Option<SdkItem>),
    Error(LeaseError),
}

/// Expression attribute names and values of one request. DynamoDB rejects names or
/// values an expression does not use, so each request collects only its own.
#[derive(Default)]
struct Placeholders {
    names: HashMap<String, String>,
    values: SdkItem,
}

impl Placeholders {
    /// `#name` for an attribute (the KCL's names are plain alphanumerics).
    fn name(&mut self, attribute: &str) -> String {
        let placeholder = format!("#{attribute}");
        self.names.insert(placeholder.clone(), attribute.to_owned());
        placeholder
    }

    fn value(&mut self, tag: &str, value: AttributeValue) -> String {
        let placeholder = format!(":{tag}");
        self.values.insert(placeholder.clone(), value);
        placeholder
    }

    /// `#name = :{tag}{i}` for each attribute, for an update's SET clause.
    fn assignments(
        &mut self,
        op: &'static str,
        tag: &str,
        attrs: &[(impl AsRef<str>, AttrValue)],
    ) -> Result<Vec<String>, LeaseError> {
        let mut set = Vec::with_capacity(attrs.len());
        for (i, (name, value)) in attrs.iter().enumerate() {
            let value = self.value(&format!("{tag}{i}"), attr_to_sdk(op, value)?);
            set.push(format!("{} = {value}", self.name(name.as_ref())));
        }
        Ok(set)
    }

    fn names(&self) -> Option<HashMap<String, String>> {
        (!self.names.is_empty()).then(|| self.names.clone())
    }

    fn values(&self) -> Option<SdkItem> {
        (!self.values.is_empty()).then(|| self.values.clone())
    }

    /// The row exists and its owner and counter are the fence's. An owner of `None`
    /// means the row must have no owner.
    fn fence(&mut self, fence: &Fence) -> String {
        let key = self.name(attr::LEASE_KEY);
        let counter = self.name(attr::LEASE_COUNTER);
        let expected = self.value("expected_counter", number(fence.counter));
        let owner = self.name(attr::LEASE_OWNER);
        match &fence.owner {
            Some(o) => {
                let expected_owner =
                    self.value("expected_owner", AttributeValue::S(o.as_str().to_owned()));
                format!(
                    "attribute_exists({key}) AND {counter} = {expected} AND {owner} = {expected_owner}"
                )
            }
            None => format!(
                "attribute_exists({key}) AND {counter} = {expected} AND attribute_not_exists({owner})"
            ),
        }
    }
}

/// The update and condition of a take: owner := `new_owner`, counter + 1, a switch
/// counted, any pending checkpoint owner and handoff request removed, on `fence`.
fn take_expression(fence: &Fence, new_owner: &WorkerId) -> (Placeholders, String, String) {
    let mut p = Placeholders::default();
    let condition = p.fence(fence);
    let (owner, counter) = (p.name(attr::LEASE_OWNER), p.name(attr::LEASE_COUNTER));
    let (switches, checkpoint_owner) =
        (p.name(attr::OWNER_SWITCHES), p.name(attr::CHECKPOINT_OWNER));
    let me = p.value(
        "new_owner",
        AttributeValue::S(new_owner.as_str().to_owned()),
    );
    let one = p.value("one", number(1));
    let handoff = p.name(attr::HANDOFF_TO);
    let update = format!(
        "SET {owner} = {me}, {counter} = {counter} + {one} ADD {switches} {one} REMOVE {checkpoint_owner}, {handoff}"
    );
    (p, update, condition)
}

/// Why a transaction was cancelled, from its reasons' codes (DynamoDB names one per
/// item, `None` for the items that were fine; some servers name none at all).
#[derive(Debug, PartialEq, Eq)]
enum Cancelled {
    /// A condition failed, or no reason given: the take did not happen, and the caller
    /// decides again from its next scan.
    Condition,
    Throttled,
    /// Another write to the same items was in progress.
    Conflict,
}

/// Whether an error code says the server does not implement the operation at all (an
/// emulator without transactions), as opposed to refusing this request.
fn unknown_operation(code: Option<&str>) -> bool {
    code.is_some_and(|c| {
        [
            "UnknownOperation",
            "NotImplemented",
            "Unsupported",
            "InvalidAction",
        ]
        .iter()
        .any(|known| c.contains(known))
    })
}

fn cancelled_because(codes: &[&str]) -> Cancelled {
    if codes.is_empty() || codes.contains(&"ConditionalCheckFailed") {
        Cancelled::Condition
    } else if codes.iter().any(|c| {
        matches!(
            *c,
            "ThrottlingError" | "ProvisionedThroughputExceeded" | "RequestLimitExceeded"
        )
    }) {
        Cancelled::Throttled
    } else {
        Cancelled::Conflict
    }
}

fn number(n: u64) -> AttributeValue {
    AttributeValue::N(n.to_string())
}

/// How a lease table is billed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Billing {
    /// PAY_PER_REQUEST: what a worker makes, and the CloudFormation stack.
    #[default]
    OnDemand,
    /// PROVISIONED with these capacity units, for the table and its heartbeat index.
    Provisioned {
        /// Read capacity units (`ReadCapacityUnits`).
        read: i64,
        /// Write capacity units (`WriteCapacityUnits`).
        write: i64,
    },
}

/// How `flotilla init` makes a lease table for production. The default is what a worker
/// makes when it finds none: on demand, no deletion protection, no tags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableOptions {
    /// On demand or provisioned capacity.
    pub billing: Billing,
    /// Whether DeleteTable is refused until protection is turned off
    /// (`DeletionProtectionEnabled`).
    pub deletion_protection: bool,
    /// Tags (key, value) put on the new table.
    pub tags: Vec<(String, String)>,
}

/// A lease table's production settings as the service reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableSettings {
    /// On demand or provisioned, with the table's capacity units.
    pub billing: Billing,
    /// Whether deletion protection is on (`false` where the server does not say).
    pub deletion_protection: bool,
    /// `None`: the server does not report point-in-time recovery (a local server).
    pub point_in_time_recovery: Option<bool>,
}

impl DynamoLeaseTable {
    /// The table's billing, deletion protection and point-in-time recovery; `None` if
    /// there is no such table.
    pub async fn table_settings(&self) -> Result<Option<TableSettings>, LeaseError> {
        let Some(table) = self.describe().await? else {
            return Ok(None);
        };
        let provisioned = table.billing_mode_summary().and_then(|b| b.billing_mode())
            != Some(&BillingMode::PayPerRequest);
        let billing = match table
            .provisioned_throughput()
            .and_then(|p| Some((p.read_capacity_units()?, p.write_capacity_units()?)))
        {
            Some((read, write)) if provisioned && read > 0 && write > 0 => {
                Billing::Provisioned { read, write }
            }
            _ => Billing::OnDemand,
        };
        let point_in_time_recovery = match self
            .client
            .describe_continuous_backups()
            .table_name(&self.table)
            .send()
            .await
        {
            Ok(output) => output
                .continuous_backups_description()
                .and_then(|d| d.point_in_time_recovery_description())
                .and_then(|p| p.point_in_time_recovery_status())
                .map(|status| *status == PointInTimeRecoveryStatus::Enabled),
            Err(err) if unsupported(&err) => None,
            Err(err) => return Err(self.classify("DescribeContinuousBackups", err)),
        };
        Ok(Some(TableSettings {
            billing,
            deletion_protection: table.deletion_protection_enabled().unwrap_or(false),
            point_in_time_recovery,
        }))
    }

    /// Turns point-in-time recovery on or off (UpdateContinuousBackups). A server that
    /// does not know the operation (DynamoDB Local, dynoxide) is `Unsupported`.
    pub async fn set_point_in_time_recovery(&self, on: bool) -> Result<(), LeaseError> {
        const OP: &str = "UpdateContinuousBackups";
        let spec = PointInTimeRecoverySpecification::builder()
            .point_in_time_recovery_enabled(on)
            .build()
            .map_err(|e| build_error(OP, e))?;
        match self
            .client
            .update_continuous_backups()
            .table_name(&self.table)
            .point_in_time_recovery_specification(spec)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(err) if unsupported(&err) => Err(LeaseError::Other {
                op: OP,
                message: format!(
                    "table {}: this server does not support point-in-time recovery ({})",
                    self.table,
                    super::error_text(&err)
                ),
            }),
            Err(err) => Err(self.classify(OP, err)),
        }
    }

    /// Turns deletion protection on or off (UpdateTable) on the lease table and its
    /// worker table, which `flotilla destroy` deletes together.
    pub async fn set_deletion_protection(&self, on: bool) -> Result<(), LeaseError> {
        for name in self.tables() {
            self.client
                .update_table()
                .table_name(name)
                .deletion_protection_enabled(on)
                .send()
                .await
                .map_err(|e| self.classify_in(name, "UpdateTable", e))?;
        }
        Ok(())
    }

    /// The lease table and, where it has one of its own, the worker table.
    fn tables(&self) -> Vec<&str> {
        let mut names = vec![self.table.as_str()];
        if self.split() {
            names.push(&self.workers);
        }
        names
    }

    /// Adds (or overwrites) tags on the lease table and its worker table (TagResource,
    /// by each table's ARN; a worker table not made yet is skipped: it gets them when
    /// made with the same options).
    pub async fn tag(&self, tags: &[(String, String)]) -> Result<(), LeaseError> {
        const OP: &str = "TagResource";
        for (i, name) in self.tables().into_iter().enumerate() {
            let Some(table) = self.describe_named(name).await? else {
                if i > 0 {
                    continue;
                }
                return Err(LeaseError::NotFound {
                    op: OP,
                    message: format!("table {name}"),
                });
            };
            let arn = table
                .table_arn()
                .ok_or_else(|| self.incomplete("DescribeTable", name, "TableArn"))?;
            let tags = sdk_tags(OP, tags)?;
            self.client
                .tag_resource()
                .resource_arn(arn)
                .set_tags((!tags.is_empty()).then_some(tags))
                .send()
                .await
                .map_err(|e| self.classify_in(name, OP, e))?;
        }
        Ok(())
    }

    /// `endpoint` replaces the AWS endpoint (a local server in tests and demos).
    pub fn new(
        sdk: &aws_config::SdkConfig,
        endpoint: Option<&str>,
        table: impl Into<String>,
    ) -> Self {
        let mut config = aws_sdk_dynamodb::config::Builder::from(sdk);
        if let Some(url) = endpoint {
            config = config.endpoint_url(url);
        }
        let table = table.into();
        Self {
            client: aws_sdk_dynamodb::Client::from_conf(config.build()),
            workers: layout::worker_table_name(&table),
            table,
            dual: Arc::default(),
            endpoint: super::endpoint_name(sdk, "dynamodb", endpoint),
            transactions: Arc::new(AtomicBool::new(true)),
            index: Arc::new(Mutex::new(IndexState::Unknown)),
        }
    }

    /// A handle that keeps heartbeats and the roster in the lease table itself, as
    /// flotilla did before the worker table: a worker of the older version, for tests
    /// of the two side by side (`crate::backend::layout`).
    pub fn older_version(
        sdk: &aws_config::SdkConfig,
        endpoint: Option<&str>,
        table: impl Into<String>,
    ) -> Self {
        let mut handle = Self::new(sdk, endpoint, table);
        handle.workers = handle.table.clone();
        handle
    }

    fn dual(&self) -> std::sync::MutexGuard<'_, Dual> {
        self.dual.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether heartbeats live in a worker table of their own.
    fn split(&self) -> bool {
        self.workers != self.table
    }

    /// Whether the lease table may hold legacy rows that count (`layout::Dual::legacy`).
    fn legacy_in_use(&self) -> bool {
        self.split() && self.dual().legacy()
    }

    /// Whether the lease table exists (`None`: it does not) and it or its worker table
    /// has deletion protection on. For `flotilla destroy`, which leaves a protected
    /// table to whoever protected it.
    pub async fn deletion_protected(&self) -> Result<Option<bool>, LeaseError> {
        let Some(table) = self.describe().await? else {
            return Ok(None);
        };
        let mut protected = table.deletion_protection_enabled().unwrap_or(false);
        if self.split()
            && let Some(workers) = self.describe_named(&self.workers).await?
        {
            protected |= workers.deletion_protection_enabled().unwrap_or(false);
        }
        Ok(Some(protected))
    }

    /// DeleteTable, then waits (up to a minute) until the table is gone, so a command
    /// that reports it deleted is not followed by a `ResourceInUse` on re-creation.
    /// `Ok(false)`: there was no such table. An operator's call (`flotilla destroy`): a
    /// worker never deletes its table, and no policy in `deploy/` grants it.
    pub async fn delete_table(&self) -> Result<bool, LeaseError> {
        let existed = self.delete_named(&self.table).await?;
        if self.split() {
            self.delete_named(&self.workers).await?;
        }
        Ok(existed)
    }

    /// DeleteTable of one table, waiting until it is gone; `Ok(false)`: there was none.
    async fn delete_named(&self, name: &str) -> Result<bool, LeaseError> {
        match self.client.delete_table().table_name(name).send().await {
            Ok(_) => {}
            Err(err) => {
                return match self.classify_in(name, "DeleteTable", err) {
                    LeaseError::NotFound { .. } => Ok(false),
                    other => Err(other),
                };
            }
        }
        let deadline = Instant::now() + WAIT_LIMIT;
        while self.describe_named(name).await?.is_some() {
            if Instant::now() >= deadline {
                return Err(LeaseError::Other {
                    op: "DeleteTable",
                    message: format!(
                        "table {name} is still there {}s after DeleteTable",
                        WAIT_LIMIT.as_secs()
                    ),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        Ok(true)
    }

    fn classify<E>(&self, op: &'static str, err: SdkError<E, HttpResponse>) -> LeaseError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        self.classify_in(&self.table, op, err)
    }

    /// `classify` for a call on the table `table` (the worker table's calls name it).
    fn classify_in<E>(
        &self,
        table: &str,
        op: &'static str,
        err: SdkError<E, HttpResponse>,
    ) -> LeaseError
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    {
        let message = format!("table {table}: {}", super::error_text(&err));
        match (err.code(), super::classify(&err)) {
            (Some("ResourceNotFoundException"), _) => LeaseError::NotFound { op, message },
            (_, Failure::Throttled) => LeaseError::Throttled { op, message },
            (_, Failure::Transient) => LeaseError::Transient {
                op,
                endpoint: self.endpoint.clone(),
                message,
            },
            (_, Failure::Denied) => LeaseError::AccessDenied { op, message },
            (_, Failure::Other) => LeaseError::Other { op, message },
        }
    }

    fn key(key: &str) -> SdkItem {
        HashMap::from([(
            attr::LEASE_KEY.to_owned(),
            AttributeValue::S(key.to_owned()),
        )])
    }

    /// The `ConditionFailed` for `key`, with the owner and counter of `current` (the
    /// row the server returned with the failure), or else of the row as it is now.
    async fn condition_failed(&self, key: &LeaseKey, current: Option<SdkItem>) -> LeaseError {
        let current = match current {
            Some(item) => Some(item),
            None => match self.get_item("GetItem", key.as_str()).await {
                Ok(item) => item,
                Err(err) => return err,
            },
        };
        let Some(item) = current else {
            return LeaseError::ConditionFailed {
                key: key.clone(),
                owner: None,
                counter: None,
            };
        };
        let fence = item_from_sdk(&item).and_then(|item| decode_fence(key.as_str(), &item));
        match fence {
            Ok(fence) => LeaseError::ConditionFailed {
                key: key.clone(),
                owner: fence.owner,
                counter: Some(fence.counter),
            },
            Err(malformed) => LeaseError::Malformed(malformed),
        }
    }

    /// A strongly consistent GetItem, raw.
    async fn get_item(&self, op: &'static str, key: &str) -> Result<Option<SdkItem>, LeaseError> {
        let output = self
            .client
            .get_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key)))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.classify(op, e))?;
        Ok(output.item)
    }

    /// A conditional UpdateItem asking for `answer`; the attributes returned (none for
    /// [`Answer::Nothing`]).
    async fn update(
        &self,
        key: &LeaseKey,
        placeholders: &Placeholders,
        update: String,
        condition: String,
        answer: Answer,
    ) -> Result<SdkItem, LeaseError> {
        const OP: &str = "UpdateItem";
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key.as_str())))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(placeholders.names())
            .set_expression_attribute_values(placeholders.values())
            .return_values(answer.return_value())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await
            .map_err(|err| match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(e)) => {
                    WriteFailure::Condition(e.item().cloned())
                }
                _ => WriteFailure::Error(self.classify(OP, err)),
            });
        match result {
            Ok(output) => Ok(output.attributes.unwrap_or_default()),
            Err(WriteFailure::Condition(current)) => Err(self.condition_failed(key, current).await),
            Err(WriteFailure::Error(err)) => Err(err),
        }
    }

    /// A conditional UpdateItem whose caller needs nothing back.
    async fn update_only(
        &self,
        key: &LeaseKey,
        placeholders: &Placeholders,
        update: String,
        condition: String,
    ) -> Result<(), LeaseError> {
        self.update(key, placeholders, update, condition, Answer::Nothing)
            .await
            .map(drop)
    }

    /// A conditional UpdateItem that changes the counter, returning the new counter.
    async fn update_counter(
        &self,
        key: &LeaseKey,
        placeholders: &Placeholders,
        update: String,
        condition: String,
    ) -> Result<u64, LeaseError> {
        let attributes = self
            .update(key, placeholders, update, condition, Answer::Counter)
            .await?;
        self.counter_in("UpdateItem", key.as_str(), &attributes)
    }

    /// A conditional UpdateItem returning the whole row as written.
    async fn update_row(
        &self,
        key: &LeaseKey,
        placeholders: &Placeholders,
        update: String,
        condition: String,
    ) -> Result<Lease, LeaseError> {
        const OP: &str = "UpdateItem";
        let item = self
            .update(key, placeholders, update, condition, Answer::Row)
            .await?;
        if item.is_empty() {
            return Err(self.incomplete(OP, key.as_str(), "attributes (ReturnValues ALL_NEW)"));
        }
        match decode_item(&item)? {
            Row::Lease(lease) => Ok(*lease),
            other => Err(not_a_lease(OP, &self.table, &other)),
        }
    }

    /// The new `leaseCounter` among the attributes an `UPDATED_NEW` answer holds, read
    /// alone: another attribute's value is none of this call's business.
    fn counter_in(
        &self,
        op: &'static str,
        key: &str,
        attributes: &SdkItem,
    ) -> Result<u64, LeaseError> {
        let missing = || self.incomplete(op, key, "leaseCounter (ReturnValues UPDATED_NEW)");
        let value = attributes.get(attr::LEASE_COUNTER).ok_or_else(missing)?;
        let only = HashMap::from([(attr::LEASE_COUNTER.to_owned(), value.clone())]);
        let counter = item_from_sdk(&only).and_then(|item| decode_counter(key, &item))?;
        counter.ok_or_else(missing)
    }

    fn incomplete(&self, op: &'static str, key: &str, missing: &str) -> LeaseError {
        LeaseError::IncompleteAnswer {
            op,
            table: self.table.clone(),
            key: key.to_owned(),
            missing: missing.to_owned(),
        }
    }

    /// Creates the table with `options` when it is missing (an existing one is left as it
    /// is, as with [`LeaseTable::ensure_table`]), and waits until it is ACTIVE.
    pub async fn ensure_table_with(
        &self,
        options: &TableOptions,
    ) -> Result<TableState, LeaseError> {
        if !self.split() {
            // The older layout: one table, with the heartbeat index.
            return self.ensure_named(&self.table, options, true).await;
        }
        let (leases, workers) = futures::join!(
            self.ensure_named(&self.table, options, false),
            self.ensure_named(&self.workers, options, true)
        );
        let state = leases?;
        workers?;
        let legacy = self.rosters().await?.legacy;
        self.dual().saw_roster(legacy.is_some());
        if legacy.is_some() {
            info!(
                message = "The lease table holds a roster of an older flotilla: heartbeats are written there too until no worker of that version is left.",
                table = %self.table,
                worker_table = %self.workers,
            );
        }
        Ok(state)
    }

    /// Creates the table `name` (with the heartbeat index when `index`) if it is
    /// missing, and waits until it is ACTIVE; with `index`, adds the index to a table
    /// that lacks it where it may.
    async fn ensure_named(
        &self,
        name: &str,
        options: &TableOptions,
        index: bool,
    ) -> Result<TableState, LeaseError> {
        let (state, mut table) = match self.describe_named(name).await? {
            Some(table) => (TableState::Existed, Some(table)),
            None => {
                let throughput = match options.billing {
                    Billing::OnDemand => None,
                    Billing::Provisioned { read, write } => Some(
                        ProvisionedThroughput::builder()
                            .read_capacity_units(read)
                            .write_capacity_units(write)
                            .build()
                            .map_err(|e| build_error("CreateTable", e))?,
                    ),
                };
                let tags = sdk_tags("CreateTable", &options.tags)?;
                let mut create = self
                    .client
                    .create_table()
                    .table_name(name)
                    .key_schema(
                        KeySchemaElement::builder()
                            .attribute_name(attr::LEASE_KEY)
                            .key_type(KeyType::Hash)
                            .build()
                            .map_err(|e| build_error("CreateTable", e))?,
                    )
                    .attribute_definitions(
                        AttributeDefinition::builder()
                            .attribute_name(attr::LEASE_KEY)
                            .attribute_type(ScalarAttributeType::S)
                            .build()
                            .map_err(|e| build_error("CreateTable", e))?,
                    )
                    .billing_mode(match options.billing {
                        Billing::OnDemand => BillingMode::PayPerRequest,
                        Billing::Provisioned { .. } => BillingMode::Provisioned,
                    })
                    .set_provisioned_throughput(throughput.clone())
                    // Sent only when asked for, so servers that do not know the
                    // parameter (and every worker's own make) see the request as before.
                    .set_deletion_protection_enabled(options.deletion_protection.then_some(true))
                    .set_tags((!tags.is_empty()).then_some(tags));
                if index {
                    let (key, projection, definition) = index_parts()?;
                    // A provisioned table's index gets the table's throughput.
                    create = create
                        .attribute_definitions(definition)
                        .global_secondary_indexes(
                            GlobalSecondaryIndex::builder()
                                .index_name(HEARTBEAT_INDEX)
                                .key_schema(key)
                                .projection(projection)
                                .set_provisioned_throughput(throughput.clone())
                                .build()
                                .map_err(|e| build_error("CreateTable", e))?,
                        );
                }
                let created = create.send().await;
                match created {
                    Ok(output) => (TableState::Created, output.table_description),
                    // Another worker created it between our describe and create.
                    Err(err) if err.code() == Some("ResourceInUseException") => {
                        (TableState::Existed, None)
                    }
                    Err(err) => return Err(self.classify_in(name, "CreateTable", err)),
                }
            }
        };
        let deadline = Instant::now() + WAIT_LIMIT;
        loop {
            if let Some(table) = &table {
                self.check_key_schema(name, table)?;
                match table.table_status() {
                    Some(TableStatus::Creating) => {}
                    Some(TableStatus::Deleting) => {
                        return Err(LeaseError::Other {
                            op: "DescribeTable",
                            message: format!("table {name} is being deleted"),
                        });
                    }
                    _ => {
                        if index {
                            self.ensure_index(table).await;
                        }
                        return Ok(state);
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(LeaseError::Other {
                    op: "DescribeTable",
                    message: format!(
                        "table {name} not ACTIVE after {WAIT_LIMIT:?} (status {:?})",
                        table.as_ref().and_then(|t| t.table_status())
                    ),
                });
            }
            tokio::time::sleep(POLL_INTERVAL).await;
            table = self.describe_named(name).await?;
        }
    }

    /// DescribeTable of the lease table; `None` if there is no such table.
    async fn describe(&self) -> Result<Option<TableDescription>, LeaseError> {
        self.describe_named(&self.table).await
    }

    /// DescribeTable of `name`; `None` if there is no such table.
    async fn describe_named(&self, name: &str) -> Result<Option<TableDescription>, LeaseError> {
        match self.client.describe_table().table_name(name).send().await {
            Ok(output) => Ok(output.table),
            Err(err) => match self.classify_in(name, "DescribeTable", err) {
                LeaseError::NotFound { .. } => Ok(None),
                other => Err(other),
            },
        }
    }

    fn check_key_schema(&self, name: &str, table: &TableDescription) -> Result<(), LeaseError> {
        let type_of = |name: &str| {
            table
                .attribute_definitions()
                .iter()
                .find(|d| d.attribute_name() == name)
                .map_or("?", |d| d.attribute_type().as_str())
        };
        let schema = table.key_schema();
        // Every table has a key schema and a type for each key attribute: an answer
        // without them is incomplete, not a table with another key.
        let incomplete = |missing: &str| self.incomplete("DescribeTable", "the table", missing);
        if schema.is_empty() {
            return Err(incomplete("KeySchema"));
        }
        if let Some(untyped) = schema.iter().find(|k| type_of(k.attribute_name()) == "?") {
            return Err(incomplete(&format!(
                "AttributeDefinitions entry for {}",
                untyped.attribute_name()
            )));
        }
        let right = matches!(schema, [only] if only.attribute_name() == attr::LEASE_KEY
            && only.key_type() == &KeyType::Hash
            && type_of(attr::LEASE_KEY) == ScalarAttributeType::S.as_str());
        if right {
            return Ok(());
        }
        Err(LeaseError::WrongKeySchema {
            table: name.to_owned(),
            found: schema
                .iter()
                .map(|k| {
                    format!(
                        "{} ({}, {})",
                        k.attribute_name(),
                        k.key_type().as_str(),
                        type_of(k.attribute_name())
                    )
                })
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    fn index_state(&self) -> IndexState {
        *self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Learns the index's state from `table`'s description; says so when it changes.
    fn learn_index(&self, table: &TableDescription) -> IndexState {
        let now = match index_status(table) {
            Some(IndexStatus::Active) => IndexState::Active,
            _ => IndexState::Absent {
                checked: Instant::now(),
            },
        };
        let before = std::mem::replace(
            &mut *self.index.lock().unwrap_or_else(|e| e.into_inner()),
            now,
        );
        let was_active = before == IndexState::Active;
        if now == IndexState::Active && !was_active {
            info!(message = "Heartbeats are read through the heartbeat index.", table = %self.workers, index = HEARTBEAT_INDEX);
        } else if was_active && now != IndexState::Active {
            warn!(message = "The heartbeat index is gone; heartbeats are read by key (a read unit or more a row).", table = %self.workers, index = HEARTBEAT_INDEX);
        }
        now
    }

    /// After `ensure_table` found the table ACTIVE: the heartbeat index is there, or
    /// asked for with UpdateTable (built in the background; read by key until then),
    /// or, where that is refused, missing for good: said once at WARN, never fatal.
    async fn ensure_index(&self, table: &TableDescription) {
        if index_status(table).is_some() {
            self.learn_index(table);
            return;
        }
        match self.add_index(table).await {
            Ok(()) => info!(
                message = "Heartbeat index requested (UpdateTable); heartbeats are read by key until it is ACTIVE.",
                table = %self.workers,
                index = HEARTBEAT_INDEX,
            ),
            Err(error) => warn!(
                message = "The lease table has no heartbeat index and it could not be added; heartbeats are read by key (a read unit or more a row each round). Add the index (docs/running-a-fleet.md) or allow dynamodb:UpdateTable.",
                table = %self.workers,
                index = HEARTBEAT_INDEX,
                %error,
            ),
        }
        *self.index.lock().unwrap_or_else(|e| e.into_inner()) = IndexState::Absent {
            checked: Instant::now(),
        };
    }

    /// UpdateTable adding the heartbeat index; on a provisioned table it gets the
    /// table's own throughput.
    async fn add_index(&self, table: &TableDescription) -> Result<(), LeaseError> {
        const OP: &str = "UpdateTable";
        let (key, projection, definition) = index_parts()?;
        let mut create = CreateGlobalSecondaryIndexAction::builder()
            .index_name(HEARTBEAT_INDEX)
            .key_schema(key)
            .projection(projection);
        // An on-demand table describes its throughput as zero units (or not at all).
        let on_demand = table.billing_mode_summary().and_then(|b| b.billing_mode())
            == Some(&BillingMode::PayPerRequest);
        let provisioned = table
            .provisioned_throughput()
            .and_then(|p| Some((p.read_capacity_units()?, p.write_capacity_units()?)))
            .filter(|(read, write)| !on_demand && *read > 0 && *write > 0);
        if let Some((read, write)) = provisioned {
            create = create.provisioned_throughput(
                ProvisionedThroughput::builder()
                    .read_capacity_units(read)
                    .write_capacity_units(write)
                    .build()
                    .map_err(|e| build_error(OP, e))?,
            );
        }
        let create = create.build().map_err(|e| build_error(OP, e))?;
        self.client
            .update_table()
            .table_name(&self.workers)
            .attribute_definitions(definition)
            .global_secondary_index_updates(
                GlobalSecondaryIndexUpdate::builder().create(create).build(),
            )
            .send()
            .await
            .map_err(|e| self.classify_in(&self.workers, OP, e))?;
        Ok(())
    }

    /// Whether heartbeats can be read through the index now; looks (DescribeTable)
    /// when this handle has not yet, or the index was missing a while ago. A failed
    /// look answers no: the rows are read by key this round.
    async fn index_usable(&self) -> bool {
        match self.index_state() {
            IndexState::Active => return true,
            IndexState::Absent { checked } if checked.elapsed() < INDEX_RECHECK => return false,
            IndexState::Absent { .. } | IndexState::Unknown => {}
        }
        let first = self.index_state() == IndexState::Unknown;
        match self.describe_named(&self.workers).await {
            Ok(Some(table)) => {
                let state = self.learn_index(&table);
                if first && state != IndexState::Active {
                    warn!(
                        message = "The lease table has no ACTIVE heartbeat index; heartbeats are read by key (a read unit or more a row each round) until it has.",
                        table = %self.workers,
                        index = HEARTBEAT_INDEX,
                    );
                }
                state == IndexState::Active
            }
            Ok(None) | Err(_) => {
                *self.index.lock().unwrap_or_else(|e| e.into_inner()) = IndexState::Absent {
                    checked: Instant::now(),
                };
                false
            }
        }
    }

    async fn scan_all(&self) -> Result<ScanOutput, LeaseError> {
        let mut out = ScanOutput::default();
        let (mut legacy, mut roster) = (Vec::new(), None);
        let billed = self
            .scan_named(&self.table, |item| match out.push(decode_item(item)) {
                Some(Row::Heartbeat(beat)) => legacy.push(beat),
                Some(Row::Roster(names)) => roster = Some(names),
                _ => {}
            })
            .await?;
        out.read_units += billed;
        if !self.split() {
            out.heartbeats = legacy;
            return Ok(out);
        }
        let mut own = Vec::new();
        let mut malformed = Vec::new();
        out.read_units += self
            .scan_named(&self.workers, |item| match decode_item(item) {
                Ok(Row::Heartbeat(beat)) => own.push(beat),
                Ok(_) => {}
                Err(bad) => malformed.push(bad),
            })
            .await?;
        out.malformed.extend(malformed);
        self.dual().saw_roster(roster.is_some());
        (out.heartbeats, out.legacy) = layout::merge(own, roster, legacy);
        Ok(out)
    }

    /// Every item of the table `name`, every page (strongly consistent), handed to
    /// `each`; what the scan was billed.
    async fn scan_named(
        &self,
        name: &str,
        mut each: impl FnMut(&SdkItem),
    ) -> Result<ReadUnits, LeaseError> {
        let mut billed = ReadUnits::default();
        let mut start: Option<SdkItem> = None;
        loop {
            let page = self
                .client
                .scan()
                .table_name(name)
                .consistent_read(true)
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| self.classify_in(name, "Scan", e))?;
            billed += units(page.consumed_capacity());
            for item in page.items() {
                each(item);
            }
            match page.last_evaluated_key {
                Some(last) if !last.is_empty() => start = Some(last),
                _ => return Ok(billed),
            }
        }
    }

    async fn get_lease(&self, key: &LeaseKey) -> Result<Option<Lease>, LeaseError> {
        const OP: &str = "GetItem";
        let Some(item) = self.get_item(OP, key.as_str()).await? else {
            return Ok(None);
        };
        match decode_item(&item)? {
            Row::Lease(lease) => Ok(Some(*lease)),
            other => Err(not_a_lease(OP, &self.table, &other)),
        }
    }

    async fn create(&self, lease: &Lease) -> Result<bool, LeaseError> {
        const OP: &str = "PutItem";
        let mut p = Placeholders::default();
        let condition = format!("attribute_not_exists({})", p.name(attr::LEASE_KEY));
        let result = self
            .client
            .put_item()
            .table_name(&self.table)
            .set_item(Some(item_to_sdk(OP, &encode_lease(lease))?))
            .condition_expression(condition)
            .set_expression_attribute_names(p.names())
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(err) => match err.as_service_error() {
                Some(PutItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.classify(OP, err)),
            },
        }
    }

    async fn take_lease(
        &self,
        key: &LeaseKey,
        fence: &Fence,
        new_owner: &WorkerId,
    ) -> Result<Lease, LeaseError> {
        let (p, update, condition) = take_expression(fence, new_owner);
        self.update_row(key, &p, update, condition).await
    }

    /// `take_lease` and, in one TransactWriteItems, a condition check that the owner's
    /// heartbeat row is as the taker saw it. A transaction returns no attributes, so the
    /// row as written is read back (strongly consistent); a row found changed again by
    /// then is reported as lost (`ConditionFailed`), as a take that lost a race is.
    async fn take_expired_lease(
        &self,
        key: &LeaseKey,
        fence: &Fence,
        new_owner: &WorkerId,
        owner_heartbeat: Option<u64>,
    ) -> Result<Lease, LeaseError> {
        const OP: &str = "TransactWriteItems";
        let Some(owner) = &fence.owner else {
            return self.take_lease(key, fence, new_owner).await;
        };
        if !self.transactions.load(Ordering::Relaxed) {
            return self.take_lease(key, fence, new_owner).await;
        }
        let (p, update, condition) = take_expression(fence, new_owner);
        let built = |e| build_error(OP, e);
        let update = Update::builder()
            .table_name(&self.table)
            .set_key(Some(Self::key(key.as_str())))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(p.names())
            .set_expression_attribute_values(p.values())
            .build()
            .map_err(built)?;
        let mut request = self
            .client
            .transact_write_items()
            .transact_items(TransactWriteItem::builder().update(update).build());
        for (place, check) in layout::beat_checks(owner_heartbeat, self.legacy_in_use()) {
            let mut beat = Placeholders::default();
            let condition = beat_condition(&mut beat, check);
            let check = ConditionCheck::builder()
                .table_name(match place {
                    Place::Workers => &self.workers,
                    Place::Legacy => &self.table,
                })
                .set_key(Some(Self::key(&heartbeat_key(owner))))
                .condition_expression(condition)
                .set_expression_attribute_names(beat.names())
                .set_expression_attribute_values(beat.values())
                .build()
                .map_err(built)?;
            request =
                request.transact_items(TransactWriteItem::builder().condition_check(check).build());
        }
        let result = request.send().await;
        if let Err(err) = result {
            return Err(match err.as_service_error() {
                Some(TransactWriteItemsError::TransactionCanceledException(e)) => {
                    let codes: Vec<&str> = e
                        .cancellation_reasons()
                        .iter()
                        .filter_map(|r| r.code())
                        .filter(|c| *c != "None")
                        .collect();
                    let message = format!("table {}: cancelled: {}", self.table, codes.join(", "));
                    match cancelled_because(&codes) {
                        Cancelled::Condition => self.condition_failed(key, None).await,
                        Cancelled::Throttled => LeaseError::Throttled { op: OP, message },
                        Cancelled::Conflict => LeaseError::Transient {
                            op: OP,
                            endpoint: self.endpoint.clone(),
                            message,
                        },
                    }
                }
                _ if unknown_operation(err.code()) => {
                    if self.transactions.swap(false, Ordering::Relaxed) {
                        warn!(
                            message = "This DynamoDB does not know TransactWriteItems: a dead owner's lease is taken without the check on its heartbeat, so a take sent just before the owner resumes can land after it re-read its rows.",
                            table = %self.table,
                            endpoint = %self.endpoint,
                            code = err.code().unwrap_or_default(),
                        );
                    }
                    return self.take_lease(key, fence, new_owner).await;
                }
                _ => self.classify(OP, err),
            });
        }
        match self.get_lease(key).await? {
            Some(lease)
                if lease.owner.as_ref() == Some(new_owner)
                    && lease.counter == fence.counter + 1 =>
            {
                Ok(lease)
            }
            other => Err(LeaseError::ConditionFailed {
                key: key.clone(),
                owner: other.as_ref().and_then(|l| l.owner.clone()),
                counter: other.map(|l| l.counter),
            }),
        }
    }

    async fn request(
        &self,
        key: &LeaseKey,
        fence: &Fence,
        requester: &WorkerId,
    ) -> Result<(), LeaseError> {
        let mut p = Placeholders::default();
        let fenced = p.fence(fence);
        let handoff = p.name(attr::HANDOFF_TO);
        let me = p.value(
            "requester",
            AttributeValue::S(requester.as_str().to_owned()),
        );
        let condition =
            format!("{fenced} AND (attribute_not_exists({handoff}) OR {handoff} = {me})");
        let update = format!("SET {handoff} = {me}");
        self.update_only(key, &p, update, condition).await
    }

    async fn transfer_lease(
        &self,
        key: &LeaseKey,
        fence: &Fence,
        to: &WorkerId,
    ) -> Result<u64, LeaseError> {
        let mut p = Placeholders::default();
        let fenced = p.fence(fence);
        let (owner, counter) = (p.name(attr::LEASE_OWNER), p.name(attr::LEASE_COUNTER));
        let (switches, handoff) = (p.name(attr::OWNER_SWITCHES), p.name(attr::HANDOFF_TO));
        let to = p.value("to", AttributeValue::S(to.as_str().to_owned()));
        let one = p.value("one", number(1));
        let condition = format!("{fenced} AND {handoff} = {to}");
        let update = format!(
            "SET {owner} = {to}, {counter} = {counter} + {one} ADD {switches} {one} REMOVE {handoff}"
        );
        self.update_counter(key, &p, update, condition).await
    }

    async fn clear_request(&self, key: &LeaseKey, requester: &WorkerId) -> Result<(), LeaseError> {
        let mut p = Placeholders::default();
        let handoff = p.name(attr::HANDOFF_TO);
        let requester = p.value(
            "requester",
            AttributeValue::S(requester.as_str().to_owned()),
        );
        let condition = format!("{handoff} = {requester}");
        let update = format!("REMOVE {handoff}");
        self.update_only(key, &p, update, condition).await
    }

    async fn release_lease(&self, key: &LeaseKey, fence: &Fence) -> Result<u64, LeaseError> {
        let mut p = Placeholders::default();
        let condition = p.fence(fence);
        let (owner, counter) = (p.name(attr::LEASE_OWNER), p.name(attr::LEASE_COUNTER));
        let one = p.value("one", number(1));
        let handoff = p.name(attr::HANDOFF_TO);
        let update = format!("SET {counter} = {counter} + {one} REMOVE {owner}, {handoff}");
        self.update_counter(key, &p, update, condition).await
    }

    /// The Java KCL's renewal (`DynamoDBLeaseRefresher.renewLease`): the counter + 1,
    /// conditional on owner and counter.
    async fn renew_lease(&self, key: &LeaseKey, fence: &Fence) -> Result<u64, LeaseError> {
        let mut p = Placeholders::default();
        let condition = p.fence(fence);
        let counter = p.name(attr::LEASE_COUNTER);
        let one = p.value("one", number(1));
        let update = format!("SET {counter} = {counter} + {one}");
        self.update_counter(key, &p, update, condition).await
    }

    async fn write_checkpoint(
        &self,
        key: &LeaseKey,
        fence: &Fence,
        checkpoint: &Checkpoint,
        children: &[ShardId],
    ) -> Result<(), LeaseError> {
        const OP: &str = "UpdateItem";
        let mut p = Placeholders::default();
        let condition = p.fence(fence);
        let mut set = p.assignments(OP, "checkpoint", &checkpoint_attrs(checkpoint))?;
        let zero = p.value("zero", number(0));
        set.push(format!("{} = {zero}", p.name(attr::OWNER_SWITCHES)));
        if !children.is_empty() {
            let children = p.value("children", attr_to_sdk(OP, &shard_set(children))?);
            set.push(format!("{} = {children}", p.name(attr::CHILD_SHARD_IDS)));
        }
        let remove = PENDING_ATTRS.map(|name| p.name(name));
        let update = format!("SET {} REMOVE {}", set.join(", "), remove.join(", "));
        self.update_only(key, &p, update, condition).await
    }

    async fn write_pending_checkpoint(
        &self,
        key: &LeaseKey,
        fence: &Fence,
        pending: &ExtendedSequenceNumber,
        state: Option<&[u8]>,
    ) -> Result<(), LeaseError> {
        const OP: &str = "UpdateItem";
        let mut p = Placeholders::default();
        let condition = p.fence(fence);
        let (set_attrs, remove_attrs) = pending_checkpoint_attrs(pending, state);
        let set = p.assignments(OP, "pending", &set_attrs)?;
        let mut update = format!("SET {}", set.join(", "));
        if !remove_attrs.is_empty() {
            let remove: Vec<String> = remove_attrs.into_iter().map(|n| p.name(n)).collect();
            update.push_str(&format!(" REMOVE {}", remove.join(", ")));
        }
        self.update_only(key, &p, update, condition).await
    }

    async fn delete_lease(&self, key: &LeaseKey, fence: &Fence) -> Result<(), LeaseError> {
        const OP: &str = "DeleteItem";
        let mut p = Placeholders::default();
        let condition = p.fence(fence);
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key.as_str())))
            .condition_expression(condition)
            .set_expression_attribute_names(p.names())
            .set_expression_attribute_values(p.values())
            .return_values_on_condition_check_failure(ReturnValuesOnConditionCheckFailure::AllOld)
            .send()
            .await;
        match result {
            Ok(_) => Ok(()),
            Err(err) => match err.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(e)) => {
                    let current = e.item().cloned();
                    Err(self.condition_failed(key, current).await)
                }
                _ => Err(self.classify(OP, err)),
            },
        }
    }

    async fn beat(&self, worker: &WorkerId, load: &WorkerLoad) -> Result<u64, LeaseError> {
        let counter = self
            .beat_in(&self.workers, worker, load, None, false)
            .await?
            .ok_or_else(|| self.incomplete("UpdateItem", &heartbeat_key(worker), "the write"))?;
        if !self.split() {
            return Ok(counter);
        }
        let write = self.dual().next();
        let existed = match write {
            LegacyWrite::Nothing => true,
            LegacyWrite::Join => {
                self.beat_in(&self.table, worker, load, Some(counter), false)
                    .await?;
                self.edit_roster_in(&self.table, "ADD", std::slice::from_ref(worker))
                    .await?;
                true
            }
            LegacyWrite::Update => self
                .beat_in(&self.table, worker, load, Some(counter), true)
                .await?
                .is_some(),
            LegacyWrite::Leave => {
                self.delete_beat_in(&self.table, worker, BeatCheck::AbsentOrAtMost(u64::MAX))
                    .await?;
                true
            }
        };
        self.dual().done(write, existed);
        Ok(counter)
    }

    /// Writes `worker`'s heartbeat row in the table `name` with `load`: the counter + 1
    /// (`set`: `None`), or set to `set` (a legacy row, which takes the worker-table
    /// row's counter). With `only_if_there`, only while the row exists: `Ok(None)` when
    /// it does not. Returns the counter written.
    async fn beat_in(
        &self,
        name: &str,
        worker: &WorkerId,
        load: &WorkerLoad,
        set: Option<u64>,
        only_if_there: bool,
    ) -> Result<Option<u64>, LeaseError> {
        const OP: &str = "UpdateItem";
        let key = heartbeat_key(worker);
        let mut p = Placeholders::default();
        let (entity, owner, counter) = (
            p.name(attr::ENTITY_TYPE),
            p.name(attr::LEASE_OWNER),
            p.name(attr::LEASE_COUNTER),
        );
        let worker_type = p.value("worker_type", AttributeValue::S(ENTITY_WORKER.to_owned()));
        let me = p.value("worker", AttributeValue::S(worker.as_str().to_owned()));
        let indexed = p.name(attr::HEARTBEAT_INDEX_KEY);
        let mut assignments = vec![
            format!("{entity} = {worker_type}"),
            format!("{owner} = {me}"),
            format!("{indexed} = {worker_type}"),
        ];
        assignments.extend(p.assignments(OP, "load", &load_attrs(load))?);
        let update = match set {
            None => {
                let one = p.value("one", number(1));
                format!("SET {} ADD {counter} {one}", assignments.join(", "))
            }
            Some(value) => {
                let value = p.value("counter", number(value));
                assignments.push(format!("{counter} = {value}"));
                format!("SET {}", assignments.join(", "))
            }
        };
        let condition =
            only_if_there.then(|| format!("attribute_exists({})", p.name(attr::LEASE_KEY)));
        let result = self
            .client
            .update_item()
            .table_name(name)
            .set_key(Some(Self::key(&key)))
            .update_expression(update)
            .set_condition_expression(condition)
            .set_expression_attribute_names(p.names())
            .set_expression_attribute_values(p.values())
            .return_values(ReturnValue::UpdatedNew)
            .send()
            .await;
        let output = match result {
            Ok(output) => output,
            Err(err)
                if matches!(
                    err.as_service_error(),
                    Some(UpdateItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                return Ok(None);
            }
            Err(err) => return Err(self.classify_in(name, OP, err)),
        };
        if let Some(value) = set {
            return Ok(Some(value));
        }
        // The write happened: the counter is all that is read from the answer (never
        // the row, which UPDATED_NEW does not return whole).
        self.counter_in(OP, &key, &output.attributes.unwrap_or_default())
            .map(Some)
    }

    /// Deletes `worker`'s heartbeat row in the table `name` while `check` holds for it;
    /// `Ok(false)` when it did not (nothing deleted).
    async fn delete_beat_in(
        &self,
        name: &str,
        worker: &WorkerId,
        check: BeatCheck,
    ) -> Result<bool, LeaseError> {
        const OP: &str = "DeleteItem";
        let mut p = Placeholders::default();
        let condition = match check {
            BeatCheck::AbsentOrAtMost(u64::MAX) => None,
            check => Some(beat_condition(&mut p, check)),
        };
        let result = self
            .client
            .delete_item()
            .table_name(name)
            .set_key(Some(Self::key(&heartbeat_key(worker))))
            .set_condition_expression(condition)
            .set_expression_attribute_names(p.names())
            .set_expression_attribute_values(p.values())
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(err) => match err.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.classify_in(name, OP, err)),
            },
        }
    }

    async fn remove_beat(&self, worker: &WorkerId) -> Result<(), LeaseError> {
        let any = BeatCheck::AbsentOrAtMost(u64::MAX);
        self.delete_beat_in(&self.workers, worker, any).await?;
        self.edit_roster_in(&self.workers, "DELETE", std::slice::from_ref(worker))
            .await?;
        if self.split() {
            self.delete_beat_in(&self.table, worker, any).await?;
            self.edit_roster_in(&self.table, "DELETE", std::slice::from_ref(worker))
                .await?;
            self.dual().removed();
        }
        Ok(())
    }

    /// `ADD` or `DELETE` worker ids on the roster's string set in the table `name` (one
    /// UpdateItem; the row is created by the first ADD).
    async fn edit_roster_in(
        &self,
        name: &str,
        verb: &str,
        workers: &[WorkerId],
    ) -> Result<(), LeaseError> {
        const OP: &str = "UpdateItem";
        if workers.is_empty() {
            return Ok(());
        }
        let mut p = Placeholders::default();
        let set = p.name(attr::ROSTER_WORKERS);
        let ids = p.value(
            "ids",
            AttributeValue::Ss(workers.iter().map(|w| w.as_str().to_owned()).collect()),
        );
        let (update, condition) = match verb {
            "ADD" => {
                let entity = p.name(attr::ENTITY_TYPE);
                let roster = p.value("roster", AttributeValue::S(ENTITY_ROSTER.to_owned()));
                (format!("SET {entity} = {roster} ADD {set} {ids}"), None)
            }
            // A DELETE must not create an empty roster row.
            _ => (
                format!("DELETE {set} {ids}"),
                Some(format!("attribute_exists({})", p.name(attr::LEASE_KEY))),
            ),
        };
        let request = self
            .client
            .update_item()
            .table_name(name)
            .set_key(Some(Self::key(ROSTER_KEY)))
            .update_expression(update)
            .set_condition_expression(condition)
            .set_expression_attribute_names(p.names())
            .set_expression_attribute_values(p.values());
        match request.send().await {
            Ok(_) => Ok(()),
            Err(err)
                if matches!(
                    err.as_service_error(),
                    Some(UpdateItemError::ConditionalCheckFailedException(_))
                ) =>
            {
                Ok(())
            }
            Err(err) => Err(self.classify_in(name, OP, err)),
        }
    }

    /// The worker table's roster, read leniently (only its string set is looked at),
    /// and, with a worker table of its own, the lease table's legacy roster, in one
    /// BatchGetItem (the legacy one eventually consistent: it only says whether workers
    /// of an older version may be there); and what the read was billed.
    async fn rosters(&self) -> Result<Rosters, LeaseError> {
        const OP: &str = "BatchGetItem";
        if !self.split() {
            let output = self
                .client
                .get_item()
                .table_name(&self.table)
                .set_key(Some(Self::key(ROSTER_KEY)))
                .consistent_read(true)
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| self.classify("GetItem", e))?;
            let (workers, malformed) = roster_in(output.item.as_ref());
            return Ok(Rosters {
                workers,
                malformed,
                legacy: None,
                billed: units(output.consumed_capacity()),
            });
        }
        let wanted = |consistent: bool| {
            KeysAndAttributes::builder()
                .keys(Self::key(ROSTER_KEY))
                .consistent_read(consistent)
                .build()
                .map_err(|e| build_error(OP, e))
        };
        let mut request = Some(
            self.client
                .batch_get_item()
                .request_items(&self.workers, wanted(true)?)
                .request_items(&self.table, wanted(false)?),
        );
        let (mut found, mut billed) = (HashMap::new(), ReadUnits::default());
        let mut pause = POLL_INTERVAL;
        for retry in 0..=UNPROCESSED_RETRIES {
            let Some(sent) = request.take() else { break };
            let answer = sent
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await
                .map_err(|e| self.classify_in(&self.workers, OP, e))?;
            billed += units(answer.consumed_capacity());
            for (table, items) in answer.responses.unwrap_or_default() {
                if let Some(item) = items.into_iter().next() {
                    found.insert(table, item);
                }
            }
            let unprocessed = answer.unprocessed_keys.unwrap_or_default();
            if unprocessed.values().all(|k| k.keys.is_empty()) {
                break;
            }
            if retry == UNPROCESSED_RETRIES {
                return Err(LeaseError::Throttled {
                    op: OP,
                    message: format!(
                        "roster rows still unprocessed after {UNPROCESSED_RETRIES} retries"
                    ),
                });
            }
            tokio::time::sleep(pause).await;
            pause *= 2;
            request = Some(
                self.client
                    .batch_get_item()
                    .set_request_items(Some(unprocessed)),
            );
        }
        let (workers, malformed) = roster_in(found.get(&self.workers));
        let legacy = found.get(&self.table).map(|item| roster_in(Some(item)).0);
        Ok(Rosters {
            workers,
            malformed,
            legacy,
            billed,
        })
    }

    async fn read_heartbeats(
        &self,
        detail: HeartbeatDetail,
    ) -> Result<HeartbeatsOutput, LeaseError> {
        let Rosters {
            workers: roster,
            malformed: bad_roster,
            legacy: legacy_roster,
            billed,
        } = self.rosters().await?;
        let mut out = HeartbeatsOutput {
            items_read: if self.split() { 2 } else { 1 },
            malformed: bad_roster.into_iter().collect(),
            read_units: billed,
            ..HeartbeatsOutput::default()
        };
        let indexed = match detail {
            HeartbeatDetail::Summary if self.index_usable().await => {
                self.query_index(&mut out).await?
            }
            _ => None,
        };
        let by_key: Vec<&WorkerId> = match &indexed {
            Some(seen) => {
                out.summary = true;
                // Named in the roster but not in the index (yet): a joiner whose row
                // the index has not caught up with, or a worker of an older flotilla.
                roster.iter().filter(|w| !seen.contains(w)).collect()
            }
            None => roster.iter().collect(),
        };
        if indexed.is_some() {
            // Rows the roster does not name are not this read's, as by key.
            out.heartbeats.retain(|h| roster.contains(&h.worker));
        }
        self.batch_get_heartbeats(&self.workers, &by_key, &mut out)
            .await?;
        out.roster = roster;
        if !self.split() {
            return Ok(out);
        }
        self.dual().saw_roster(legacy_roster.is_some());
        // The legacy rows of the workers the legacy roster names that the worker table
        // does not show: workers of an older version.
        let mut legacy = HeartbeatsOutput::default();
        if let Some(names) = &legacy_roster {
            let unseen: Vec<&WorkerId> = names
                .iter()
                .filter(|w| !out.heartbeats.iter().any(|h| &h.worker == *w))
                .collect();
            self.batch_get_heartbeats(&self.table, &unseen, &mut legacy)
                .await?;
            let more: Vec<WorkerId> = names
                .iter()
                .filter(|w| !out.roster.contains(w))
                .cloned()
                .collect();
            out.roster.extend(more);
        }
        out.items_read += legacy.items_read;
        out.read_units += legacy.read_units;
        out.malformed.extend(legacy.malformed);
        let own = std::mem::take(&mut out.heartbeats);
        (out.heartbeats, out.legacy) = layout::merge(own, legacy_roster, legacy.heartbeats);
        Ok(out)
    }

    /// Every heartbeat in the index (one Query, paginated, eventually consistent as
    /// every index read is), into `out`; the workers it showed. `None` when the index
    /// turns out missing (dropped since it was seen): the rows are read by key.
    async fn query_index(
        &self,
        out: &mut HeartbeatsOutput,
    ) -> Result<Option<Vec<WorkerId>>, LeaseError> {
        const OP: &str = "Query";
        let mut seen = Vec::new();
        let mut start: Option<SdkItem> = None;
        loop {
            let page = self
                .client
                .query()
                .table_name(&self.workers)
                .index_name(HEARTBEAT_INDEX)
                .key_condition_expression("#k = :v")
                .expression_attribute_names("#k", attr::HEARTBEAT_INDEX_KEY)
                .expression_attribute_values(":v", AttributeValue::S(ENTITY_WORKER.to_owned()))
                .set_exclusive_start_key(start.take())
                .return_consumed_capacity(ReturnConsumedCapacity::Total)
                .send()
                .await;
            let page = match page {
                Ok(page) => page,
                // "The table does not have the specified index".
                Err(err) if err.code() == Some("ValidationException") => {
                    warn!(message = "Heartbeat index query refused; heartbeats are read by key.", table = %self.workers, index = HEARTBEAT_INDEX, error = %super::error_text(&err));
                    *self.index.lock().unwrap_or_else(|e| e.into_inner()) = IndexState::Absent {
                        checked: Instant::now(),
                    };
                    out.heartbeats.clear();
                    out.malformed
                        .retain(|m| m.key.as_deref() == Some(ROSTER_KEY));
                    return Ok(None);
                }
                Err(err) => return Err(self.classify_in(&self.workers, OP, err)),
            };
            out.read_units += units(page.consumed_capacity());
            out.items_read += page.items().len();
            for item in page.items() {
                match decode_item(item) {
                    Ok(Row::Heartbeat(heartbeat)) => {
                        seen.push(heartbeat.worker.clone());
                        out.heartbeats.push(heartbeat);
                    }
                    Ok(_) => {}
                    Err(malformed) => {
                        // Seen, though unreadable: not asked for again by key.
                        if let Some(worker) = malformed
                            .key
                            .as_deref()
                            .and_then(|k| k.strip_prefix(crate::model::item::WORKER_KEY_PREFIX))
                        {
                            seen.push(WorkerId::new(worker));
                        }
                        out.malformed.push(malformed);
                    }
                }
            }
            match page.last_evaluated_key {
                Some(last) if !last.is_empty() => start = Some(last),
                _ => return Ok(Some(seen)),
            }
        }
    }

    /// The heartbeat rows of `workers`, by key (strongly consistent BatchGetItem, 100
    /// keys a call, unprocessed keys asked again), into `out`.
    async fn batch_get_heartbeats(
        &self,
        name: &str,
        workers: &[&WorkerId],
        out: &mut HeartbeatsOutput,
    ) -> Result<(), LeaseError> {
        const OP: &str = "BatchGetItem";
        out.items_read += workers.len();
        for chunk in workers.chunks(BATCH_GET_MAX) {
            let mut keys: Vec<SdkItem> =
                chunk.iter().map(|w| Self::key(&heartbeat_key(w))).collect();
            let mut pause = POLL_INTERVAL;
            let mut retries = 0;
            while !keys.is_empty() {
                let wanted = KeysAndAttributes::builder()
                    .set_keys(Some(std::mem::take(&mut keys)))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| build_error(OP, e))?;
                let answer = self
                    .client
                    .batch_get_item()
                    .request_items(name, wanted)
                    .return_consumed_capacity(ReturnConsumedCapacity::Total)
                    .send()
                    .await
                    .map_err(|e| self.classify_in(name, OP, e))?;
                out.read_units += units(answer.consumed_capacity());
                for item in answer
                    .responses
                    .as_ref()
                    .and_then(|r| r.get(name))
                    .into_iter()
                    .flatten()
                {
                    match decode_item(item) {
                        Ok(Row::Heartbeat(heartbeat)) => out.heartbeats.push(heartbeat),
                        Ok(_) => {}
                        Err(malformed) => out.malformed.push(malformed),
                    }
                }
                keys = answer
                    .unprocessed_keys
                    .and_then(|mut u| u.remove(name))
                    .map(|k| k.keys)
                    .unwrap_or_default();
                if !keys.is_empty() {
                    retries += 1;
                    if retries > UNPROCESSED_RETRIES {
                        return Err(LeaseError::Throttled {
                            op: OP,
                            message: format!(
                                "{} heartbeat rows still unprocessed after {UNPROCESSED_RETRIES} retries",
                                keys.len()
                            ),
                        });
                    }
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
        Ok(())
    }

    async fn remove_dead_beat(&self, worker: &WorkerId, counter: u64) -> Result<bool, LeaseError> {
        let one = std::slice::from_ref(worker);
        if !self
            .delete_beat_in(&self.workers, worker, BeatCheck::AbsentOrEquals(counter))
            .await?
        {
            return Ok(false);
        }
        self.edit_roster_in(&self.workers, "DELETE", one).await?;
        if self.split() {
            if !self
                .delete_beat_in(&self.table, worker, BeatCheck::AbsentOrAtMost(counter))
                .await?
            {
                return Ok(false);
            }
            self.edit_roster_in(&self.table, "DELETE", one).await?;
        }
        Ok(true)
    }

    /// `LeaseTable::stamp_source`: one UpdateItem, conditional on the row (and, unless
    /// `overwrite`, on its naming no creation time and no other source).
    async fn stamp(
        &self,
        key: &LeaseKey,
        source: &str,
        created: Option<u64>,
        overwrite: bool,
    ) -> Result<bool, LeaseError> {
        const OP: &str = "UpdateItem";
        let mut p = Placeholders::default();
        let (row, named, when) = (
            p.name(attr::LEASE_KEY),
            p.name(attr::SOURCE),
            p.name(attr::SOURCE_CREATED),
        );
        let value = p.value("source", AttributeValue::S(source.to_owned()));
        let mut condition = format!("attribute_exists({row})");
        if !overwrite {
            condition.push_str(&format!(
                " AND (attribute_not_exists({named}) OR {named} = {value}) AND attribute_not_exists({when})"
            ));
        }
        let update = match created {
            Some(c) => {
                let c = p.value("created", number(c));
                format!("SET {named} = {value}, {when} = {c}")
            }
            None => format!("SET {named} = {value} REMOVE {when}"),
        };
        let result = self
            .client
            .update_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(key.as_str())))
            .update_expression(update)
            .condition_expression(condition)
            .set_expression_attribute_names(p.names())
            .set_expression_attribute_values(p.values())
            .send()
            .await;
        match result {
            Ok(_) => Ok(true),
            Err(err) => match err.as_service_error() {
                Some(UpdateItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.classify(OP, err)),
            },
        }
    }

    /// `WorkerRows::retire_legacy`: the legacy roster (conditional on naming exactly
    /// the plan's workers: its size, and each of them), then the rows.
    async fn retire(&self, plan: &Retirement) -> Result<bool, LeaseError> {
        const OP: &str = "DeleteItem";
        if !self.split() {
            return Ok(false);
        }
        let mut p = Placeholders::default();
        let key = p.name(attr::LEASE_KEY);
        let condition = match &plan.roster {
            None => format!("attribute_not_exists({key})"),
            Some(names) if names.is_empty() => {
                let set = p.name(attr::ROSTER_WORKERS);
                format!("attribute_exists({key}) AND attribute_not_exists({set})")
            }
            Some(names) => {
                let set = p.name(attr::ROSTER_WORKERS);
                let size = p.value("size", number(names.len() as u64));
                let mut terms = vec![
                    format!("attribute_exists({key})"),
                    format!("size({set}) = {size}"),
                ];
                for (i, name) in names.iter().enumerate() {
                    let value = p.value(
                        &format!("w{i}"),
                        AttributeValue::S(name.as_str().to_owned()),
                    );
                    terms.push(format!("contains({set}, {value})"));
                }
                terms.join(" AND ")
            }
        };
        let result = self
            .client
            .delete_item()
            .table_name(&self.table)
            .set_key(Some(Self::key(ROSTER_KEY)))
            .condition_expression(condition)
            .set_expression_attribute_names(p.names())
            .set_expression_attribute_values(p.values())
            .send()
            .await;
        if let Err(err) = result {
            return match err.as_service_error() {
                Some(DeleteItemError::ConditionalCheckFailedException(_)) => Ok(false),
                _ => Err(self.classify(OP, err)),
            };
        }
        for (worker, counter) in &plan.rows {
            let check = match counter {
                Some(c) => BeatCheck::AbsentOrEquals(*c),
                None => BeatCheck::AbsentOrAtMost(u64::MAX),
            };
            self.delete_beat_in(&self.table, worker, check).await?;
        }
        self.dual().saw_roster(false);
        Ok(true)
    }
}

/// The workers a roster row names, read leniently (only its string set), and the
/// malformed-row report when that attribute is not a string set.
fn roster_in(item: Option<&SdkItem>) -> (Vec<WorkerId>, Option<MalformedRow>) {
    match item.and_then(|i| i.get(attr::ROSTER_WORKERS)) {
        None => (Vec::new(), None),
        Some(AttributeValue::Ss(ids)) => (
            ids.iter().map(|id| WorkerId::new(id.as_str())).collect(),
            None,
        ),
        Some(_) => (
            Vec::new(),
            Some(MalformedRow {
                key: Some(ROSTER_KEY.to_owned()),
                attribute: attr::ROSTER_WORKERS.to_owned(),
                why: "not a string set".to_owned(),
            }),
        ),
    }
}

/// The two roster rows one round reads.
struct Rosters {
    /// The worker table's roster.
    workers: Vec<WorkerId>,
    /// Its report when it is not a string set.
    malformed: Option<MalformedRow>,
    /// The lease table's legacy roster, if there is one.
    legacy: Option<Vec<WorkerId>>,
    billed: ReadUnits,
}

/// A heartbeat row's condition as a DynamoDB condition expression (naming only the
/// attributes it uses: DynamoDB refuses unused placeholders).
fn beat_condition(p: &mut Placeholders, check: BeatCheck) -> String {
    let absent =
        |p: &mut Placeholders| format!("attribute_not_exists({})", p.name(attr::LEASE_KEY));
    let compare = |p: &mut Placeholders, op: &str, c: u64| {
        let counter = p.name(attr::LEASE_COUNTER);
        format!("{counter} {op} {}", p.value("beat", number(c)))
    };
    match check {
        BeatCheck::Absent => absent(p),
        BeatCheck::Equals(c) => compare(p, "=", c),
        BeatCheck::AbsentOrEquals(c) => format!("{} OR {}", absent(p), compare(p, "=", c)),
        BeatCheck::AbsentOrAtMost(c) => format!("{} OR {}", absent(p), compare(p, "<=", c)),
    }
}

fn not_a_lease(op: &'static str, table: &str, row: &Row) -> LeaseError {
    LeaseError::Other {
        op,
        message: format!("table {table}: expected a lease row, found {row}"),
    }
}

/// The server does not know the operation (a local server lacking it): DynamoDB Local
/// and dynoxide answer `UnknownOperationException`, some a 400 with no code.
fn unsupported<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> bool {
    matches!(
        err.code(),
        Some("UnknownOperationException" | "UnrecognizedClientException")
    ) || err
        .message()
        .is_some_and(|m| m.contains("not supported") || m.contains("Unknown operation"))
}

/// `tags` as the SDK takes them (CreateTable, TagResource).
fn sdk_tags(op: &'static str, tags: &[(String, String)]) -> Result<Vec<Tag>, LeaseError> {
    tags.iter()
        .map(|(key, value)| {
            Tag::builder()
                .key(key)
                .value(value)
                .build()
                .map_err(|e| build_error(op, e))
        })
        .collect()
}

fn build_error(op: &'static str, err: aws_sdk_dynamodb::error::BuildError) -> LeaseError {
    LeaseError::Other {
        op,
        message: err.to_string(),
    }
}

/// Reads a row from the server through the codec. An attribute the codec has no type
/// for makes the row malformed, like any other unreadable attribute.
fn decode_item(item: &SdkItem) -> Result<Row, MalformedRow> {
    decode_row(&item_from_sdk(item)?)
}

/// A row as the SDK gives it, in the codec's terms. Public so that tools and tests
/// that write raw rows use the same translation as the adapter.
pub fn item_from_sdk(item: &SdkItem) -> Result<Item, MalformedRow> {
    item.iter()
        .map(|(name, value)| {
            attr_from_sdk(value)
                .map(|v| (name.clone(), v))
                .map_err(|why| MalformedRow {
                    key: match item.get(attr::LEASE_KEY) {
                        Some(AttributeValue::S(key)) => Some(key.clone()),
                        _ => None,
                    },
                    attribute: name.clone(),
                    why,
                })
        })
        .collect()
}

fn attr_from_sdk(value: &AttributeValue) -> Result<AttrValue, String> {
    Ok(match value {
        AttributeValue::S(s) => AttrValue::S(s.clone()),
        AttributeValue::N(n) => AttrValue::N(n.clone()),
        AttributeValue::B(b) => AttrValue::B(BASE64.encode(b.as_ref())),
        AttributeValue::Ss(ss) => AttrValue::SS(ss.clone()),
        AttributeValue::Ns(ns) => AttrValue::NS(ns.clone()),
        AttributeValue::Bs(bs) => {
            AttrValue::BS(bs.iter().map(|b| BASE64.encode(b.as_ref())).collect())
        }
        AttributeValue::Bool(b) => AttrValue::Bool(*b),
        AttributeValue::Null(n) => AttrValue::Null(*n),
        AttributeValue::L(list) => {
            AttrValue::L(list.iter().map(attr_from_sdk).collect::<Result<_, _>>()?)
        }
        AttributeValue::M(map) => AttrValue::M(
            map.iter()
                .map(|(k, v)| attr_from_sdk(v).map(|v| (k.clone(), v)))
                .collect::<Result<_, _>>()?,
        ),
        _ => return Err("an attribute type this SDK does not know".to_owned()),
    })
}

/// A row in the codec's terms, as the SDK takes it (`op` names the call in errors).
pub fn item_to_sdk(op: &'static str, item: &Item) -> Result<SdkItem, LeaseError> {
    item.iter()
        .map(|(name, value)| attr_to_sdk(op, value).map(|v| (name.clone(), v)))
        .collect()
}

fn attr_to_sdk(op: &'static str, value: &AttrValue) -> Result<AttributeValue, LeaseError> {
    let blob = |text: &str| {
        BASE64
            .decode(text)
            .map(Blob::new)
            .map_err(|e| LeaseError::Other {
                op,
                message: format!("binary attribute value is not base64: {e}"),
            })
    };
    Ok(match value {
        AttrValue::S(s) => AttributeValue::S(s.clone()),
        AttrValue::N(n) => AttributeValue::N(n.clone()),
        AttrValue::B(b) => AttributeValue::B(blob(b)?),
        AttrValue::SS(ss) => AttributeValue::Ss(ss.clone()),
        AttrValue::NS(ns) => AttributeValue::Ns(ns.clone()),
        AttrValue::BS(bs) => {
            AttributeValue::Bs(bs.iter().map(|b| blob(b)).collect::<Result<_, _>>()?)
        }
        AttrValue::Bool(b) => AttributeValue::Bool(*b),
        AttrValue::Null(n) => AttributeValue::Null(*n),
        AttrValue::L(list) => AttributeValue::L(
            list.iter()
                .map(|v| attr_to_sdk(op, v))
                .collect::<Result<_, _>>()?,
        ),
        AttrValue::M(map) => AttributeValue::M(
            map.iter()
                .map(|(k, v)| attr_to_sdk(op, v).map(|v| (k.clone(), v)))
                .collect::<Result<_, _>>()?,
        ),
    })
}

impl LeaseTable for DynamoLeaseTable {
    fn table_name(&self) -> &str {
        &self.table
    }

    fn ensure_table(&self) -> BoxFuture<'_, Result<TableState, LeaseError>> {
        Box::pin(async move { self.ensure_table_with(&TableOptions::default()).await })
    }

    fn scan(&self) -> BoxFuture<'_, Result<ScanOutput, LeaseError>> {
        Box::pin(self.scan_all())
    }

    fn get<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<Option<Lease>, LeaseError>> {
        Box::pin(self.get_lease(key))
    }

    fn create_if_absent<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.create(lease))
    }

    fn take<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(self.take_lease(key, expected, new_owner))
    }

    fn take_expired<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
        owner_heartbeat: Option<u64>,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(self.take_expired_lease(key, expected, new_owner, owner_heartbeat))
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.release_lease(key, expected))
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.renew_lease(key, expected))
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        checkpoint: &'a Checkpoint,
        children: &'a [ShardId],
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.write_checkpoint(key, expected, checkpoint, children))
    }

    fn prepare_checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        pending: &'a ExtendedSequenceNumber,
        state: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.write_pending_checkpoint(key, expected, pending, state))
    }

    fn delete<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.delete_lease(key, expected))
    }

    fn request_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.request(key, expected, requester))
    }

    fn transfer<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        to: &'a WorkerId,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.transfer_lease(key, expected, to))
    }

    fn clear_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.clear_request(key, requester))
    }

    fn stamp_source<'a>(
        &'a self,
        key: &'a LeaseKey,
        source: &'a str,
        created: Option<u64>,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.stamp(key, source, created, overwrite))
    }
}

impl WorkerRows for DynamoLeaseTable {
    fn worker_table_name(&self) -> &str {
        &self.workers
    }

    fn heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        load: &'a WorkerLoad,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(self.beat(worker, load))
    }

    fn remove_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.remove_beat(worker))
    }

    fn join_roster<'a>(&'a self, workers: &'a [WorkerId]) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(self.edit_roster_in(&self.workers, "ADD", workers))
    }

    fn heartbeats(
        &self,
        detail: HeartbeatDetail,
    ) -> BoxFuture<'_, Result<HeartbeatsOutput, LeaseError>> {
        Box::pin(self.read_heartbeats(detail))
    }

    fn remove_dead_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        counter: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.remove_dead_beat(worker, counter))
    }

    fn retire_legacy<'a>(
        &'a self,
        plan: &'a Retirement,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(self.retire(plan))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attribute_values_round_trip_through_the_sdk_types() {
        let value = AttrValue::M(
            [
                ("s".to_owned(), AttrValue::S("x".into())),
                ("n".to_owned(), AttrValue::N("12".into())),
                ("b".to_owned(), AttrValue::B(BASE64.encode([0u8, 1, 255]))),
                ("ss".to_owned(), AttrValue::SS(vec!["a".into(), "b".into()])),
                ("bs".to_owned(), AttrValue::BS(vec![BASE64.encode([7u8])])),
                (
                    "l".to_owned(),
                    AttrValue::L(vec![AttrValue::Bool(true), AttrValue::Null(true)]),
                ),
                ("ns".to_owned(), AttrValue::NS(vec!["1".into()])),
            ]
            .into(),
        );
        let sdk = attr_to_sdk("test", &value).unwrap();
        assert_eq!(attr_from_sdk(&sdk).unwrap(), value);
    }

    #[test]
    fn binary_values_that_are_not_base64_are_an_error_not_a_panic() {
        let err = attr_to_sdk("PutItem", &AttrValue::B("not base64!".into())).unwrap_err();
        assert!(err.to_string().contains("not base64"), "{err}");
    }

    #[test]
    fn fence_conditions_require_the_row_and_name_owner_or_its_absence() {
        let mut p = Placeholders::default();
        let owned = p.fence(&Fence {
            owner: Some(WorkerId::new("w")),
            counter: 3,
        });
        assert_eq!(
            owned,
            "attribute_exists(#leaseKey) AND #leaseCounter = :expected_counter AND #leaseOwner = :expected_owner"
        );
        assert_eq!(
            p.values.get(":expected_counter"),
            Some(&AttributeValue::N("3".into()))
        );
        let mut p = Placeholders::default();
        let unowned = p.fence(&Fence {
            owner: None,
            counter: 0,
        });
        assert_eq!(
            unowned,
            "attribute_exists(#leaseKey) AND #leaseCounter = :expected_counter AND attribute_not_exists(#leaseOwner)"
        );
        assert!(!p.values.contains_key(":expected_owner"));
    }
}
