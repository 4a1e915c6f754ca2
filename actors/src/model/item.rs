//! Lease-table rows as DynamoDB attribute maps, and their translation to [`Lease`]s.
//!
//! The codec lives here, free of the SDK, so that the in-memory table, the DynamoDB
//! adapter and the fixture tests read and write rows through the same code. Attribute
//! names and encodings are the KCL 2.x ones (`DynamoDBLeaseSerializer.java`), so a
//! table written by the Java KCL is read as it is.

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;

use super::{
    Checkpoint, ExtendedSequenceNumber, Fence, HashKeyRange, Heartbeat, Lease, LeaseKey, LeaseRate,
    SequenceNumber, ShardId, WorkerId, WorkerLoad,
};

/// A DynamoDB attribute value, serialised the way DynamoDB JSON writes it (`{"S": ".."}`):
/// the lease table's rows and a table stream's item images alike
/// ([`super::change::AttributeValue`] is this type).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum AttrValue {
    /// A string (`{"S": ".."}`).
    S(String),
    /// Numbers travel as decimal text.
    N(String),
    /// Binary, base64-encoded as in DynamoDB JSON.
    B(String),
    /// A string set; DynamoDB refuses an empty one.
    SS(Vec<String>),
    /// A number set, each number as decimal text.
    NS(Vec<String>),
    /// A binary set, each element base64-encoded.
    BS(Vec<String>),
    /// A boolean (`{"BOOL": true}`).
    #[serde(rename = "BOOL")]
    Bool(bool),
    /// An explicit null (`{"NULL": true}`; the flag is always `true`).
    #[serde(rename = "NULL")]
    Null(bool),
    /// A list of values of any types.
    L(Vec<AttrValue>),
    /// A map from attribute names to values.
    M(BTreeMap<String, AttrValue>),
}

impl AttrValue {
    /// The text of a string value; `None` for any other type.
    pub fn as_s(&self) -> Option<&str> {
        match self {
            Self::S(text) => Some(text),
            _ => None,
        }
    }

    /// The text of a number value; `None` for any other type.
    pub fn as_n(&self) -> Option<&str> {
        match self {
            Self::N(text) => Some(text),
            _ => None,
        }
    }

    /// The DynamoDB type letter, for error messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            AttrValue::S(_) => "S",
            AttrValue::N(_) => "N",
            AttrValue::B(_) => "B",
            AttrValue::SS(_) => "SS",
            AttrValue::NS(_) => "NS",
            AttrValue::BS(_) => "BS",
            AttrValue::Bool(_) => "BOOL",
            AttrValue::Null(_) => "NULL",
            AttrValue::L(_) => "L",
            AttrValue::M(_) => "M",
        }
    }
}

/// One row of the table.
pub type Item = BTreeMap<String, AttrValue>;

pub mod attr {
    //! Attribute names of the KCL lease table.
    /// The table's partition key: a lease's [`crate::model::LeaseKey`], or a heartbeat or
    /// roster row's key.
    pub const LEASE_KEY: &str = "leaseKey";
    /// The worker holding the lease (absent: nobody); on a heartbeat row, its worker.
    pub const LEASE_OWNER: &str = "leaseOwner";
    /// The lease's fencing token, raised on every change of owner; a heartbeat's counter.
    pub const LEASE_COUNTER: &str = "leaseCounter";
    /// The committed checkpoint: a sequence number or a KCL sentinel
    /// ([`crate::model::Checkpoint`]).
    pub const CHECKPOINT: &str = "checkpoint";
    /// The user record's index within a KPL aggregate at the checkpoint (0 for plain records).
    pub const CHECKPOINT_SUB_SEQUENCE: &str = "checkpointSubSequenceNumber";
    /// Changes of owner since the last checkpoint: raised by a take or transfer, zeroed by a
    /// checkpoint write.
    pub const OWNER_SWITCHES: &str = "ownerSwitchesSinceCheckpoint";
    /// The shard's parents (a string set: one for a split, two for a merge).
    pub const PARENT_SHARD_IDS: &str = "parentShardId";
    /// The shard's children, written with its SHARD_END checkpoint.
    pub const CHILD_SHARD_IDS: &str = "childShardIds";
    /// The shard's first hash key (decimal text), with [`ENDING_HASH_KEY`].
    pub const STARTING_HASH_KEY: &str = "startingHashKey";
    /// The shard's last hash key (decimal text, inclusive), with [`STARTING_HASH_KEY`].
    pub const ENDING_HASH_KEY: &str = "endingHashKey";
    /// A prepared (two-phase) checkpoint's sequence number; every checkpoint write removes it.
    pub const PENDING_CHECKPOINT: &str = "pendingCheckpoint";
    /// The prepared checkpoint's sub-sequence number (its index in a KPL aggregate).
    pub const PENDING_CHECKPOINT_SUB_SEQUENCE: &str = "pendingCheckpointSubSequenceNumber";
    /// Application state (binary) prepared with the pending checkpoint.
    pub const PENDING_CHECKPOINT_STATE: &str = "pendingCheckpointState";
    /// KCL 3.x graceful hand-off marker: read, never written; a take removes it.
    pub const CHECKPOINT_OWNER: &str = "checkpointOwner";
    /// What the row is: [`super::ENTITY_LEASE`] (or absent), [`super::ENTITY_WORKER`],
    /// [`super::ENTITY_ROSTER`], or another program's type (left alone).
    pub const ENTITY_TYPE: &str = "entityType";
    // flotilla's own attributes; the Java KCL ignores attributes it does not know.
    /// A live worker's request that the owner hand this lease over to it (flotilla's
    /// steal): written by the requester, honoured or cleared by the owner.
    pub const HANDOFF_TO: &str = "flotillaHandoffTo";
    /// Heartbeat rows: leases the worker held when it wrote the heartbeat.
    pub const WORKER_LEASES: &str = "flotillaLeaseCount";
    /// Heartbeat rows: records the worker delivered per second since its previous heartbeat.
    pub const WORKER_RECORDS_PER_SECOND: &str = "flotillaRecordsPerSecond";
    /// Heartbeat rows: the worker is shutting down and hands its leases to whoever asks.
    pub const WORKER_DRAINING: &str = "flotillaDraining";
    /// Heartbeat rows: MillisBehindLatest of each shard read, a map of lease key to ms.
    pub const WORKER_LAG: &str = "flotillaLagMs";
    /// Heartbeat rows, fan-out mode: each open subscription's age, a map of lease key to ms.
    pub const WORKER_SUBSCRIBED: &str = "flotillaSubscribedMs";
    /// Per held lease, by lease key: `[records/s, bytes/s]` (an `L` of two `N`s); `NULL`
    /// from a worker that does not balance on throughput.
    pub const WORKER_LEASE_RATES: &str = "flotillaLeaseRates";
    /// The stream a lease's shard belongs to (a Kinesis stream's name or a DynamoDB stream's
    /// ARN), written once when the row is created.
    pub const SOURCE: &str = "flotillaSource";
    /// When the lease's source was created (seconds since the epoch): with
    /// [`SOURCE`], which stream of that name the lease's positions are in.
    pub const SOURCE_CREATED: &str = "flotillaSourceCreated";
    /// A multi-stream lease's stream identifier (`account:stream:creationEpoch`) and
    /// shard, which the Java KCL's multi-stream serializer requires in every row.
    pub const STREAM_NAME: &str = "streamName";
    /// A multi-stream lease's shard id, derived from the key as [`STREAM_NAME`] is.
    pub const SHARD_ID: &str = "shardId";
    /// Ownership changes a worker has made (heartbeat rows): a peer that sees it move
    /// reads the lease rows again.
    pub const WORKER_CHANGES: &str = "flotillaChanges";
    /// Heartbeat rows: the worker's `lease.heartbeat_interval`, in ms.
    pub const WORKER_HEARTBEAT_MS: &str = "flotillaHeartbeatMs";
    /// Heartbeat rows: the worker's `lease.failover_time`, in ms.
    pub const WORKER_FAILOVER_MS: &str = "flotillaFailoverMs";
    /// The roster row's set of worker ids.
    pub const ROSTER_WORKERS: &str = "flotillaWorkers";
    /// The partition key of [`super::HEARTBEAT_INDEX`]: only heartbeat rows carry it
    /// (always [`super::ENTITY_WORKER`]), so the index holds them and nothing else.
    pub const HEARTBEAT_INDEX_KEY: &str = "flotillaBeat";
}

/// The sparse global secondary index over the heartbeat rows, keyed by
/// [`attr::HEARTBEAT_INDEX_KEY`] and projecting only [`HEARTBEAT_INDEX_PROJECTION`]: a
/// round reads every heartbeat with one Query of it, billed by the bytes it returns
/// (a few dozen a worker) instead of a read unit or two per heartbeat row (a row
/// carries per-shard lags and rates, which a round does not need).
pub const HEARTBEAT_INDEX: &str = "flotilla-heartbeats";

/// The attributes [`HEARTBEAT_INDEX`] projects besides the keys (`leaseKey` and
/// [`attr::HEARTBEAT_INDEX_KEY`], always there): what a round needs to tell life,
/// death, a change and a share. Never the lag maps or the rates.
pub const HEARTBEAT_INDEX_PROJECTION: [&str; 7] = [
    attr::ENTITY_TYPE,
    attr::LEASE_OWNER,
    attr::LEASE_COUNTER,
    attr::WORKER_LEASES,
    attr::WORKER_RECORDS_PER_SECOND,
    attr::WORKER_DRAINING,
    attr::WORKER_CHANGES,
];

/// `item` as [`HEARTBEAT_INDEX`] holds it: `None` for a row without the index key (a
/// lease, the roster, a heartbeat of an older flotilla).
pub fn heartbeat_index_view(item: &Item) -> Option<Item> {
    item.get(attr::HEARTBEAT_INDEX_KEY)?;
    Some(
        item.iter()
            .filter(|(name, _)| {
                name.as_str() == attr::LEASE_KEY
                    || name.as_str() == attr::HEARTBEAT_INDEX_KEY
                    || HEARTBEAT_INDEX_PROJECTION.contains(&name.as_str())
            })
            .map(|(name, value)| (name.clone(), value.clone()))
            .collect(),
    )
}

/// An item's size as DynamoDB bills it: each attribute's name plus its value (a
/// number about one byte per two digits, plus one; a list or map 3 bytes plus one per
/// element). Used to bill reads the way DynamoDB does (the memory backend's
/// [`ReadUnits`] and the benches).
pub fn item_size(item: &Item) -> usize {
    fn value(v: &AttrValue) -> usize {
        match v {
            AttrValue::S(s) | AttrValue::B(s) => s.len(),
            AttrValue::N(n) => n.len().div_ceil(2) + 1,
            AttrValue::Bool(_) | AttrValue::Null(_) => 1,
            AttrValue::SS(v) | AttrValue::BS(v) => v.iter().map(String::len).sum(),
            AttrValue::NS(v) => v.iter().map(|n| n.len().div_ceil(2) + 1).sum(),
            AttrValue::L(l) => 3 + l.iter().map(|v| 1 + value(v)).sum::<usize>(),
            AttrValue::M(m) => 3 + m.iter().map(|(k, v)| 1 + k.len() + value(v)).sum::<usize>(),
        }
    }
    item.iter().map(|(k, v)| k.len() + value(v)).sum()
}

/// Read capacity units as DynamoDB bills them: a GetItem or a BatchGetItem key by
/// item (each item's size rounded up to 4 KB, at least one unit), a Scan or a Query by
/// the bytes of the whole page (rounded up to 4 KB once); an eventually consistent read
/// costs half. Kept in thousandths, so sums stay exact.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct ReadUnits(pub u64);

impl ReadUnits {
    const PER_UNIT: usize = 4096;

    /// Items read by key (GetItem, BatchGetItem), each billed on its own; a key
    /// without an item costs what an item of one byte does.
    pub fn by_item(sizes: impl IntoIterator<Item = usize>, consistent: bool) -> Self {
        let units: usize = sizes
            .into_iter()
            .map(|b| b.max(1).div_ceil(Self::PER_UNIT))
            .sum();
        Self::scaled(units as u64 * 1000, consistent)
    }

    /// One Scan or Query page of `bytes`, billed as a whole.
    pub fn by_page(bytes: usize, consistent: bool) -> Self {
        Self::scaled(
            bytes.max(1).div_ceil(Self::PER_UNIT) as u64 * 1000,
            consistent,
        )
    }

    fn scaled(milli: u64, consistent: bool) -> Self {
        Self(if consistent { milli } else { milli / 2 })
    }

    /// From a server's `ConsumedCapacity.CapacityUnits`.
    pub fn from_units(units: f64) -> Self {
        Self((units.max(0.0) * 1000.0).round() as u64)
    }

    /// The total in read capacity units (fractional), for reports and benches.
    pub fn as_units(self) -> f64 {
        self.0 as f64 / 1000.0
    }
}

impl std::ops::Add for ReadUnits {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        Self(self.0 + other.0)
    }
}

impl std::ops::AddAssign for ReadUnits {
    fn add_assign(&mut self, other: Self) {
        self.0 += other.0;
    }
}

/// `entityType` of lease rows (KCL 3.5+; rows without it are leases too).
pub const ENTITY_LEASE: &str = "LEASE";
/// `entityType` of flotilla's per-worker heartbeat rows, kept in the worker table
/// (`crate::backend::layout`): the Java KCL 2.x reads every row of the lease table as
/// a lease, whatever its entity type, and fails on one without a `leaseCounter`.
pub const ENTITY_WORKER: &str = "FLOTILLA_WORKER";
/// Prefix of heartbeat rows' `leaseKey`; cannot collide with a shard id.
pub const WORKER_KEY_PREFIX: &str = "flotilla-worker#";

/// `entityType` of the roster row, which names every worker with a heartbeat row.
pub const ENTITY_ROSTER: &str = "FLOTILLA_ROSTER";
/// `leaseKey` of the roster row; cannot collide with a shard id nor a heartbeat row.
pub const ROSTER_KEY: &str = "flotilla-roster";

/// The key of a worker's heartbeat row.
pub fn heartbeat_key(worker: &WorkerId) -> String {
    format!("{WORKER_KEY_PREFIX}{worker}")
}

/// A row that cannot be read as a lease: which row, which attribute, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("lease row {}: attribute {attribute}: {why}", key.as_deref().unwrap_or("(no leaseKey)"))]
pub struct MalformedRow {
    /// The row's `leaseKey`; `None` when that attribute is missing or not a string.
    pub key: Option<String>,
    /// The attribute that could not be read (its table name, e.g. `leaseCounter`).
    pub attribute: String,
    /// What is wrong with it: missing, the wrong type, an unparsable value.
    pub why: String,
}

/// What a row of the lease table is.
#[derive(Debug, Clone, PartialEq)]
pub enum Row {
    /// A lease row (`entityType` `LEASE`, or none, as the Java KCL writes them).
    Lease(Box<Lease>),
    /// A flotilla worker's heartbeat row ([`ENTITY_WORKER`]).
    Heartbeat(Heartbeat),
    /// flotilla's roster row ([`ENTITY_ROSTER`]): the workers it names, read leniently
    /// (anything but a string set names nobody).
    Roster(Vec<WorkerId>),
    /// A row another program keeps in the table (the KCL 3.x coordinator, worker
    /// metrics, migration state). Left alone.
    Other {
        /// The row's `leaseKey`.
        key: String,
        /// Its `entityType`, as written.
        entity_type: String,
    },
}

struct Reader<'a> {
    item: &'a Item,
    key: Option<String>,
}

impl Reader<'_> {
    fn fail(&self, attribute: &str, why: impl Into<String>) -> MalformedRow {
        MalformedRow {
            key: self.key.clone(),
            attribute: attribute.to_owned(),
            why: why.into(),
        }
    }

    fn wrong_type(&self, attribute: &str, want: &str, got: &AttrValue) -> MalformedRow {
        self.fail(
            attribute,
            format!("expected type {want}, found {}", got.type_name()),
        )
    }

    fn string(&self, attribute: &str) -> Result<Option<&str>, MalformedRow> {
        match self.item.get(attribute) {
            None => Ok(None),
            Some(AttrValue::S(s)) => Ok(Some(s)),
            Some(other) => Err(self.wrong_type(attribute, "S", other)),
        }
    }

    /// A binary attribute, or `None` when it is absent or not binary base64: the Java
    /// KCL's create path (`toDynamoRecord`) can write `pendingCheckpointState` as a
    /// number (an upstream quirk, see the lease-table fixtures' README), and a row must
    /// not become unreadable for it.
    fn binary_lenient(&self, attribute: &str) -> Option<Vec<u8>> {
        match self.item.get(attribute) {
            Some(AttrValue::B(text)) => BASE64.decode(text).ok(),
            _ => None,
        }
    }

    fn required_string(&self, attribute: &str) -> Result<&str, MalformedRow> {
        self.string(attribute)?
            .ok_or_else(|| self.fail(attribute, "missing"))
    }

    fn number(&self, attribute: &str) -> Result<Option<u64>, MalformedRow> {
        match self.item.get(attribute) {
            None => Ok(None),
            Some(AttrValue::N(n)) => n
                .parse::<u64>()
                .map(Some)
                .map_err(|_| self.fail(attribute, format!("{n:?} is not a non-negative integer"))),
            Some(other) => Err(self.wrong_type(attribute, "N", other)),
        }
    }

    fn number_map(&self, attribute: &str) -> Result<BTreeMap<String, u64>, MalformedRow> {
        match self.item.get(attribute) {
            None => Ok(BTreeMap::new()),
            Some(AttrValue::M(map)) => map
                .iter()
                .map(|(k, v)| match v {
                    AttrValue::N(n) => n.parse::<u64>().map(|n| (k.clone(), n)).map_err(|_| {
                        self.fail(
                            attribute,
                            format!("{k}: {n:?} is not a non-negative integer"),
                        )
                    }),
                    other => Err(self.wrong_type(attribute, "M of N", other)),
                })
                .collect(),
            Some(other) => Err(self.wrong_type(attribute, "M", other)),
        }
    }

    /// A number, leniently: absent, `NULL` or unreadable is `None` (a declaration a
    /// worker may not make must not make its heartbeat row unreadable).
    fn number_lenient(&self, attribute: &str) -> Option<u64> {
        self.item
            .get(attribute)
            .and_then(AttrValue::as_n)
            .and_then(|n| n.parse().ok())
    }

    fn boolean(&self, attribute: &str) -> Result<Option<bool>, MalformedRow> {
        match self.item.get(attribute) {
            None => Ok(None),
            Some(AttrValue::Bool(b)) => Ok(Some(*b)),
            Some(other) => Err(self.wrong_type(attribute, "BOOL", other)),
        }
    }

    /// Lenient, unlike the rest: rates are advice for balance, and a heartbeat row that
    /// failed to decode would make a live worker look dead (its leases taken after the
    /// failover time). Absent, `NULL` or not a map: `None` (an older flotilla, or a
    /// count-only worker); an entry that is not `[N, N]`: left out (no rate for that
    /// lease, as for one just taken).
    fn lease_rates(&self) -> Option<BTreeMap<LeaseKey, LeaseRate>> {
        let Some(AttrValue::M(map)) = self.item.get(attr::WORKER_LEASE_RATES) else {
            return None;
        };
        let number = |v: &AttrValue| v.as_n().and_then(|n| n.parse::<u64>().ok());
        Some(
            map.iter()
                .filter_map(|(key, value)| match value {
                    AttrValue::L(pair) => match pair.as_slice() {
                        [records, bytes] => Some((
                            LeaseKey::new(key.as_str()),
                            LeaseRate {
                                records_per_second: number(records)?,
                                bytes_per_second: number(bytes)?,
                            },
                        )),
                        _ => None,
                    },
                    _ => None,
                })
                .collect(),
        )
    }

    fn string_set(&self, attribute: &str) -> Result<Vec<ShardId>, MalformedRow> {
        match self.item.get(attribute) {
            None => Ok(Vec::new()),
            Some(AttrValue::SS(ids)) => Ok(ids.iter().map(|s| ShardId::new(s.as_str())).collect()),
            Some(other) => Err(self.wrong_type(attribute, "SS", other)),
        }
    }
}

/// Reads one row. Rows tagged with another `entityType` come back as [`Row::Other`].
pub fn decode_row(item: &Item) -> Result<Row, MalformedRow> {
    let mut r = Reader { item, key: None };
    let key = r.required_string(attr::LEASE_KEY)?.to_owned();
    r.key = Some(key.clone());
    match r.string(attr::ENTITY_TYPE)? {
        None | Some(ENTITY_LEASE) => decode_lease(&r, key).map(|l| Row::Lease(Box::new(l))),
        Some(ENTITY_WORKER) => {
            let worker = r.required_string(attr::LEASE_OWNER)?;
            let counter = r
                .number(attr::LEASE_COUNTER)?
                .ok_or_else(|| r.fail(attr::LEASE_COUNTER, "missing"))?;
            Ok(Row::Heartbeat(Heartbeat {
                worker: WorkerId::new(worker),
                counter,
                load: WorkerLoad {
                    leases: r.number(attr::WORKER_LEASES)?.unwrap_or(0),
                    records_per_second: r.number(attr::WORKER_RECORDS_PER_SECOND)?.unwrap_or(0),
                    draining: r.boolean(attr::WORKER_DRAINING)?.unwrap_or(false),
                    changes: r.number(attr::WORKER_CHANGES)?.unwrap_or(0),
                    lag_ms: r.number_map(attr::WORKER_LAG)?,
                    subscribed_ms: r.number_map(attr::WORKER_SUBSCRIBED)?,
                    lease_rates: r.lease_rates(),
                    heartbeat_interval_ms: r.number_lenient(attr::WORKER_HEARTBEAT_MS),
                    failover_time_ms: r.number_lenient(attr::WORKER_FAILOVER_MS),
                },
            }))
        }
        Some(ENTITY_ROSTER) => Ok(Row::Roster(match item.get(attr::ROSTER_WORKERS) {
            Some(AttrValue::SS(ids)) => ids.iter().map(|id| WorkerId::new(id.as_str())).collect(),
            _ => Vec::new(),
        })),
        Some(other) => Ok(Row::Other {
            key,
            entity_type: other.to_owned(),
        }),
    }
}

/// The owner and counter of the row `key`, and nothing else: what a refused conditional
/// write reports. Reading the whole row here would turn a row that fails the codec for an
/// unrelated attribute (or a server that returns part of it) into a failed call, when the
/// caller only needs to know who holds the lease now.
pub fn decode_fence(key: &str, item: &Item) -> Result<Fence, MalformedRow> {
    let r = Reader {
        item,
        key: Some(key.to_owned()),
    };
    Ok(Fence {
        owner: r.string(attr::LEASE_OWNER)?.map(WorkerId::new),
        counter: r
            .number(attr::LEASE_COUNTER)?
            .ok_or_else(|| r.fail(attr::LEASE_COUNTER, "missing"))?,
    })
}

/// The `leaseCounter` among the attributes an UpdateItem returned, if it is there (and a
/// counter). Only this one attribute is read: with `UPDATED_NEW`, DynamoDB returns the
/// attributes the update changed (some servers only those whose value changed), never
/// the key or the rest of the row.
pub fn decode_counter(key: &str, item: &Item) -> Result<Option<u64>, MalformedRow> {
    Reader {
        item,
        key: Some(key.to_owned()),
    }
    .number(attr::LEASE_COUNTER)
}

fn decode_lease(r: &Reader<'_>, key: String) -> Result<Lease, MalformedRow> {
    let counter = r
        .number(attr::LEASE_COUNTER)?
        .ok_or_else(|| r.fail(attr::LEASE_COUNTER, "missing"))?;
    let checkpoint_text = r.required_string(attr::CHECKPOINT)?;
    let sub = r.number(attr::CHECKPOINT_SUB_SEQUENCE)?.unwrap_or(0);
    let checkpoint =
        Checkpoint::decode(checkpoint_text, sub).map_err(|why| r.fail(attr::CHECKPOINT, why))?;
    let hash_range = match (
        r.string(attr::STARTING_HASH_KEY)?,
        r.string(attr::ENDING_HASH_KEY)?,
    ) {
        (None, None) => None,
        (Some(start), Some(end)) => Some(
            HashKeyRange::parse(start, end)
                .map_err(|e| r.fail(attr::STARTING_HASH_KEY, e.to_string()))?,
        ),
        (Some(_), None) => {
            return Err(r.fail(
                attr::ENDING_HASH_KEY,
                "missing while startingHashKey is set",
            ));
        }
        (None, Some(_)) => {
            return Err(r.fail(
                attr::STARTING_HASH_KEY,
                "missing while endingHashKey is set",
            ));
        }
    };
    let pending_checkpoint = match r.string(attr::PENDING_CHECKPOINT)? {
        None => None,
        Some(text) => Some(ExtendedSequenceNumber::new(
            SequenceNumber::parse(text)
                .map_err(|e| r.fail(attr::PENDING_CHECKPOINT, e.to_string()))?,
            r.number(attr::PENDING_CHECKPOINT_SUB_SEQUENCE)?
                .unwrap_or(0),
        )),
    };
    Ok(Lease {
        key: LeaseKey::new(key),
        owner: r.string(attr::LEASE_OWNER)?.map(WorkerId::new),
        counter,
        checkpoint,
        owner_switches_since_checkpoint: r.number(attr::OWNER_SWITCHES)?.unwrap_or(0),
        parent_shard_ids: r.string_set(attr::PARENT_SHARD_IDS)?,
        child_shard_ids: r.string_set(attr::CHILD_SHARD_IDS)?,
        hash_range,
        pending_checkpoint,
        pending_checkpoint_state: r.binary_lenient(attr::PENDING_CHECKPOINT_STATE),
        checkpoint_owner: r.string(attr::CHECKPOINT_OWNER)?.map(str::to_owned),
        handoff_to: r.string(attr::HANDOFF_TO)?.map(WorkerId::new),
        source: r.string(attr::SOURCE)?.map(str::to_owned),
        source_created: r.number(attr::SOURCE_CREATED)?,
    })
}

/// What a prepared (two-phase) checkpoint writes: the pending position (and the state,
/// when given) set, and the names to remove (the state, when not given, so an earlier
/// prepare's state does not outlive it), as the Java KCL's `prepareCheckpoint` leaves the
/// row. The committed checkpoint is not touched.
pub fn pending_checkpoint_attrs(
    pending: &ExtendedSequenceNumber,
    state: Option<&[u8]>,
) -> (Vec<(&'static str, AttrValue)>, Vec<&'static str>) {
    let mut set = vec![
        (
            attr::PENDING_CHECKPOINT,
            AttrValue::S(pending.sequence.as_str().into()),
        ),
        (
            attr::PENDING_CHECKPOINT_SUB_SEQUENCE,
            AttrValue::N(pending.sub_sequence.to_string()),
        ),
    ];
    let mut remove = Vec::new();
    match state {
        Some(state) => set.push((
            attr::PENDING_CHECKPOINT_STATE,
            AttrValue::B(BASE64.encode(state)),
        )),
        None => remove.push(attr::PENDING_CHECKPOINT_STATE),
    }
    (set, remove)
}

/// The pending-checkpoint attributes every checkpoint write removes (the KCL's
/// `setCheckpoint` clears `pendingCheckpoint` and `pendingCheckpointState` too).
pub const PENDING_ATTRS: [&str; 3] = [
    attr::PENDING_CHECKPOINT,
    attr::PENDING_CHECKPOINT_SUB_SEQUENCE,
    attr::PENDING_CHECKPOINT_STATE,
];

/// The checkpoint attributes, as a lease write sets them.
pub fn checkpoint_attrs(checkpoint: &Checkpoint) -> [(&'static str, AttrValue); 2] {
    let (text, sub) = checkpoint.encode();
    [
        (attr::CHECKPOINT, AttrValue::S(text.to_owned())),
        (attr::CHECKPOINT_SUB_SEQUENCE, AttrValue::N(sub.to_string())),
    ]
}

/// A string-set value; DynamoDB rejects empty sets, so callers skip empty lists.
pub fn shard_set(ids: &[ShardId]) -> AttrValue {
    AttrValue::SS(ids.iter().map(|s| s.as_str().to_owned()).collect())
}

/// The whole row of a lease, as the create-if-absent put writes it.
pub fn encode_lease(lease: &Lease) -> Item {
    let mut item = Item::new();
    item.insert(
        attr::LEASE_KEY.into(),
        AttrValue::S(lease.key.as_str().into()),
    );
    item.insert(attr::ENTITY_TYPE.into(), AttrValue::S(ENTITY_LEASE.into()));
    // What the KCL's multi-stream serializer reads back from a row (it does not parse
    // the key); derived from the key, so the two never disagree.
    if let Some(stream) = lease.key.stream_id() {
        item.insert(attr::STREAM_NAME.into(), AttrValue::S(stream.to_owned()));
        item.insert(
            attr::SHARD_ID.into(),
            AttrValue::S(lease.key.shard_id().as_str().to_owned()),
        );
    }
    if let Some(owner) = &lease.owner {
        item.insert(
            attr::LEASE_OWNER.into(),
            AttrValue::S(owner.as_str().into()),
        );
    }
    item.insert(
        attr::LEASE_COUNTER.into(),
        AttrValue::N(lease.counter.to_string()),
    );
    for (name, value) in checkpoint_attrs(&lease.checkpoint) {
        item.insert(name.into(), value);
    }
    item.insert(
        attr::OWNER_SWITCHES.into(),
        AttrValue::N(lease.owner_switches_since_checkpoint.to_string()),
    );
    if !lease.parent_shard_ids.is_empty() {
        item.insert(
            attr::PARENT_SHARD_IDS.into(),
            shard_set(&lease.parent_shard_ids),
        );
    }
    if !lease.child_shard_ids.is_empty() {
        item.insert(
            attr::CHILD_SHARD_IDS.into(),
            shard_set(&lease.child_shard_ids),
        );
    }
    if let Some(range) = lease.hash_range {
        item.insert(
            attr::STARTING_HASH_KEY.into(),
            AttrValue::S(range.start.to_string()),
        );
        item.insert(
            attr::ENDING_HASH_KEY.into(),
            AttrValue::S(range.end.to_string()),
        );
    }
    if let Some(pending) = &lease.pending_checkpoint {
        item.insert(
            attr::PENDING_CHECKPOINT.into(),
            AttrValue::S(pending.sequence.as_str().into()),
        );
        item.insert(
            attr::PENDING_CHECKPOINT_SUB_SEQUENCE.into(),
            AttrValue::N(pending.sub_sequence.to_string()),
        );
    }
    if let Some(state) = &lease.pending_checkpoint_state {
        item.insert(
            attr::PENDING_CHECKPOINT_STATE.into(),
            AttrValue::B(BASE64.encode(state)),
        );
    }
    if let Some(owner) = &lease.checkpoint_owner {
        item.insert(attr::CHECKPOINT_OWNER.into(), AttrValue::S(owner.clone()));
    }
    if let Some(to) = &lease.handoff_to {
        item.insert(attr::HANDOFF_TO.into(), AttrValue::S(to.as_str().into()));
    }
    if let Some(source) = &lease.source {
        item.insert(attr::SOURCE.into(), AttrValue::S(source.clone()));
    }
    if let Some(created) = lease.source_created {
        item.insert(
            attr::SOURCE_CREATED.into(),
            AttrValue::N(created.to_string()),
        );
    }
    item
}

/// A heartbeat row.
pub fn encode_heartbeat(heartbeat: &Heartbeat) -> Item {
    Item::from([
        (
            attr::LEASE_KEY.into(),
            AttrValue::S(heartbeat_key(&heartbeat.worker)),
        ),
        (attr::ENTITY_TYPE.into(), AttrValue::S(ENTITY_WORKER.into())),
        (
            attr::LEASE_OWNER.into(),
            AttrValue::S(heartbeat.worker.as_str().into()),
        ),
        (
            attr::LEASE_COUNTER.into(),
            AttrValue::N(heartbeat.counter.to_string()),
        ),
    ])
    .into_iter()
    .chain(load_attrs(&heartbeat.load))
    .collect()
}

/// The load attributes a heartbeat write sets.
pub fn load_attrs(load: &WorkerLoad) -> [(String, AttrValue); 9] {
    let number_map = |map: &std::collections::BTreeMap<String, u64>| {
        AttrValue::M(
            map.iter()
                .map(|(k, v)| (k.clone(), AttrValue::N(v.to_string())))
                .collect(),
        )
    };
    [
        (attr::WORKER_LAG.into(), number_map(&load.lag_ms)),
        (
            attr::WORKER_SUBSCRIBED.into(),
            number_map(&load.subscribed_ms),
        ),
        (
            attr::WORKER_LEASES.into(),
            AttrValue::N(load.leases.to_string()),
        ),
        (
            attr::WORKER_RECORDS_PER_SECOND.into(),
            AttrValue::N(load.records_per_second.to_string()),
        ),
        (attr::WORKER_DRAINING.into(), AttrValue::Bool(load.draining)),
        (
            attr::WORKER_CHANGES.into(),
            AttrValue::N(load.changes.to_string()),
        ),
        (
            attr::WORKER_HEARTBEAT_MS.into(),
            load.heartbeat_interval_ms
                .map_or(AttrValue::Null(true), |ms| AttrValue::N(ms.to_string())),
        ),
        (
            attr::WORKER_FAILOVER_MS.into(),
            load.failover_time_ms
                .map_or(AttrValue::Null(true), |ms| AttrValue::N(ms.to_string())),
        ),
        // NULL rather than absent for `None`: heartbeats are updates, and an absent
        // attribute would leave a previous life's rates in the row.
        (
            attr::WORKER_LEASE_RATES.into(),
            match &load.lease_rates {
                None => AttrValue::Null(true),
                Some(rates) => AttrValue::M(
                    rates
                        .iter()
                        .map(|(key, rate)| {
                            (
                                key.as_str().to_owned(),
                                AttrValue::L(vec![
                                    AttrValue::N(rate.records_per_second.to_string()),
                                    AttrValue::N(rate.bytes_per_second.to_string()),
                                ]),
                            )
                        })
                        .collect(),
                ),
            },
        ),
    ]
}

impl fmt::Display for Row {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Row::Lease(lease) => write!(f, "lease {}", lease.key),
            Row::Heartbeat(hb) => write!(f, "heartbeat of {}", hb.worker),
            Row::Roster(_) => write!(f, "roster row {ROSTER_KEY}"),
            Row::Other { key, entity_type } => write!(f, "{entity_type} row {key}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(json: &str) -> Item {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn a_lease_round_trips() {
        let mut lease = Lease::new(
            &ShardId::from_index(4),
            Checkpoint::At(ExtendedSequenceNumber::new(
                SequenceNumber::from_u128(123),
                2,
            )),
            vec![ShardId::from_index(0)],
            Some(HashKeyRange { start: 0, end: 99 }),
        );
        lease.owner = Some(WorkerId::new("w-1"));
        lease.counter = 7;
        lease.child_shard_ids = vec![ShardId::from_index(9)];
        lease.pending_checkpoint = Some(ExtendedSequenceNumber::new(
            SequenceNumber::from_u128(200),
            0,
        ));
        lease.pending_checkpoint_state = Some(vec![0, 1, 2, 255]);
        lease.handoff_to = Some(WorkerId::new("w-2"));
        lease.source = Some("arn:aws:dynamodb:us-east-1:1:table/t/stream/x".into());
        assert_eq!(
            decode_row(&encode_lease(&lease)),
            Ok(Row::Lease(Box::new(lease)))
        );
    }

    #[test]
    fn a_heartbeat_round_trips() {
        let hb = Heartbeat {
            worker: WorkerId::new("w-1"),
            counter: 41,
            load: WorkerLoad {
                leases: 3,
                records_per_second: 1200,
                draining: true,
                changes: 12,
                lag_ms: [("shardId-000000000001".to_owned(), 250)].into(),
                subscribed_ms: [("shardId-000000000001".to_owned(), 61_000)].into(),
                lease_rates: Some(
                    [(
                        LeaseKey::new("123456789012:a:1700000000:shardId-000000000001"),
                        LeaseRate {
                            records_per_second: 900,
                            bytes_per_second: 450_000,
                        },
                    )]
                    .into(),
                ),
                heartbeat_interval_ms: Some(2_000),
                failover_time_ms: Some(10_000),
            },
        };
        assert_eq!(
            decode_row(&encode_heartbeat(&hb)),
            Ok(Row::Heartbeat(hb.clone()))
        );
        let mut count_only = hb;
        count_only.load.lease_rates = None;
        assert_eq!(
            decode_row(&encode_heartbeat(&count_only)),
            Ok(Row::Heartbeat(count_only))
        );
    }

    #[test]
    fn lease_rates_are_read_leniently() {
        let rates = |json: &str| {
            let item = row(&format!(
                r#"{{"leaseKey":{{"S":"flotilla-worker#w"}},"entityType":{{"S":"FLOTILLA_WORKER"}},
                    "leaseOwner":{{"S":"w"}},"leaseCounter":{{"N":"3"}}{json}}}"#
            ));
            match decode_row(&item) {
                Ok(Row::Heartbeat(hb)) => hb.load.lease_rates,
                other => panic!("{other:?}"),
            }
        };
        // Written by an older flotilla: no attribute; or by a count-only worker: NULL.
        assert_eq!(rates(""), None);
        assert_eq!(rates(r#","flotillaLeaseRates":{"NULL":true}"#), None);
        assert_eq!(rates(r#","flotillaLeaseRates":{"S":"x"}"#), None);
        // A bad entry is left out; the good ones are kept.
        let got = rates(
            r#","flotillaLeaseRates":{"M":{"a":{"L":[{"N":"5"},{"N":"70"}]},"b":{"N":"5"},"c":{"L":[{"N":"-1"},{"N":"2"}]}}}"#,
        );
        assert_eq!(
            got,
            Some(
                [(
                    LeaseKey::new("a"),
                    LeaseRate {
                        records_per_second: 5,
                        bytes_per_second: 70
                    }
                )]
                .into()
            )
        );
    }

    #[test]
    fn malformed_rows_name_key_attribute_and_reason() {
        let table = [
            (
                r#"{"checkpoint":{"S":"LATEST"},"leaseCounter":{"N":"1"}}"#,
                "lease row (no leaseKey): attribute leaseKey: missing",
            ),
            (
                r#"{"leaseKey":{"N":"5"}}"#,
                "lease row (no leaseKey): attribute leaseKey: expected type S, found N",
            ),
            (
                r#"{"leaseKey":{"S":"s-1"},"checkpoint":{"S":"LATEST"}}"#,
                "lease row s-1: attribute leaseCounter: missing",
            ),
            (
                r#"{"leaseKey":{"S":"s-1"},"leaseCounter":{"S":"1"},"checkpoint":{"S":"LATEST"}}"#,
                "lease row s-1: attribute leaseCounter: expected type N, found S",
            ),
            (
                r#"{"leaseKey":{"S":"s-1"},"leaseCounter":{"N":"-3"},"checkpoint":{"S":"LATEST"}}"#,
                "lease row s-1: attribute leaseCounter: \"-3\" is not a non-negative integer",
            ),
            (
                r#"{"leaseKey":{"S":"s-1"},"leaseCounter":{"N":"1"}}"#,
                "lease row s-1: attribute checkpoint: missing",
            ),
            (
                r#"{"leaseKey":{"S":"s-1"},"leaseCounter":{"N":"1"},"checkpoint":{"S":"12x"}}"#,
                "lease row s-1: attribute checkpoint: not a sequence number",
            ),
            (
                r#"{"leaseKey":{"S":"s-1"},"leaseCounter":{"N":"1"},"checkpoint":{"S":"LATEST"},"parentShardId":{"S":"shardId-0"}}"#,
                "lease row s-1: attribute parentShardId: expected type SS, found S",
            ),
            (
                r#"{"leaseKey":{"S":"s-1"},"leaseCounter":{"N":"1"},"checkpoint":{"S":"LATEST"},"leaseOwner":{"N":"1"}}"#,
                "lease row s-1: attribute leaseOwner: expected type S, found N",
            ),
            (
                r#"{"leaseKey":{"S":"s-1"},"leaseCounter":{"N":"1"},"checkpoint":{"S":"LATEST"},"startingHashKey":{"S":"1"}}"#,
                "lease row s-1: attribute endingHashKey: missing while startingHashKey is set",
            ),
            (
                r#"{"leaseKey":{"S":"s-1"},"leaseCounter":{"N":"1"},"checkpoint":{"S":"LATEST"},"startingHashKey":{"S":"x"},"endingHashKey":{"S":"1"}}"#,
                "lease row s-1: attribute startingHashKey: hash key \"x\" is not a decimal integer",
            ),
            (
                r#"{"leaseKey":{"S":"flotilla-worker#w"},"entityType":{"S":"FLOTILLA_WORKER"}}"#,
                "lease row flotilla-worker#w: attribute leaseOwner: missing",
            ),
        ];
        for (json, want) in table {
            let err = decode_row(&row(json)).expect_err(json).to_string();
            assert!(err.starts_with(want), "{json}\n got: {err}\nwant: {want}");
        }
    }

    #[test]
    fn rows_of_other_entities_are_left_alone() {
        let other =
            row(r#"{"leaseKey":{"S":"TableMigration3.5"},"entityType":{"S":"TABLE_MIGRATION"}}"#);
        assert_eq!(
            decode_row(&other),
            Ok(Row::Other {
                key: "TableMigration3.5".into(),
                entity_type: "TABLE_MIGRATION".into()
            })
        );
    }

    #[test]
    fn a_fence_is_read_from_owner_and_counter_alone() {
        // The checkpoint is unreadable and the row says nothing else: the fence reads.
        let item =
            row(r#"{"leaseOwner":{"S":"w-2"},"leaseCounter":{"N":"5"},"checkpoint":{"S":"12ab"}}"#);
        assert_eq!(
            decode_fence("k", &item),
            Ok(Fence {
                owner: Some(WorkerId::new("w-2")),
                counter: 5
            })
        );
        let unowned = row(r#"{"leaseCounter":{"N":"0"}}"#);
        assert_eq!(decode_fence("k", &unowned).map(|f| f.owner), Ok(None));
        let err = decode_fence("k", &row(r#"{"leaseOwner":{"S":"w"}}"#)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "lease row k: attribute leaseCounter: missing"
        );
    }

    #[test]
    fn a_counter_is_read_from_whatever_an_update_returned() {
        // What moto returns to a heartbeat after the first: the counter, nothing else.
        assert_eq!(
            decode_counter("w", &row(r#"{"leaseCounter":{"N":"2"}}"#)),
            Ok(Some(2))
        );
        assert_eq!(decode_counter("w", &row("{}")), Ok(None));
        let err = decode_counter("w", &row(r#"{"leaseCounter":{"S":"2"}}"#)).unwrap_err();
        assert_eq!(err.attribute, attr::LEASE_COUNTER);
    }
}
