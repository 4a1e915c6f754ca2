//! Leases and checkpoints, as the KCL 2.x lease table holds them.

use std::fmt;

use super::{HashKeyRange, SequenceNumber, ShardId};

/// A lease row's hash key: the shard id for a single-stream application, or
/// `account:stream:creationEpoch:shardId` for a KCL multi-stream application.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct LeaseKey(String);

impl LeaseKey {
    /// A key as written in the table, either form.
    pub fn new(key: impl Into<String>) -> Self {
        Self(key.into())
    }

    /// The key as the table holds it.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The shard this lease is for: the key itself, or its last `:` field in the
    /// multi-stream form.
    pub fn shard_id(&self) -> ShardId {
        ShardId::new(self.0.rsplit(':').next().unwrap_or(&self.0))
    }

    /// The stream identifier of a multi-stream key (`account:stream:creationEpoch`, what
    /// the KCL writes as `streamName`); `None` for a single-stream key.
    pub fn stream_id(&self) -> Option<&str> {
        self.0.rsplit_once(':').map(|(stream, _)| stream)
    }

    /// The stream's name in a multi-stream key (the middle of its identifier); `None` for
    /// a single-stream key.
    pub fn stream_name(&self) -> Option<&str> {
        self.stream_id()?.split(':').nth(1)
    }

    /// The key of another shard of the same stream (a parent, a child): a shard id alone
    /// names a shard only within its stream.
    pub fn sibling(&self, shard: &ShardId) -> LeaseKey {
        match self.stream_id() {
            Some(stream) => LeaseKey(format!("{stream}:{shard}")),
            None => LeaseKey::from(shard),
        }
    }
}

impl From<&ShardId> for LeaseKey {
    fn from(shard: &ShardId) -> Self {
        Self(shard.as_str().to_owned())
    }
}

impl fmt::Display for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for LeaseKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// The id a worker writes as `leaseOwner`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct WorkerId(String);

impl WorkerId {
    /// A worker id, as written in `leaseOwner`.
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id as the table holds it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// A position inside a shard: a record, or a user record inside a KPL aggregate
/// (`sub_sequence` is its index; plain records have 0).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtendedSequenceNumber {
    /// The record's sequence number.
    pub sequence: SequenceNumber,
    /// The user record's index inside the record's KPL aggregate; 0 for a plain record.
    pub sub_sequence: u64,
}

impl ExtendedSequenceNumber {
    /// A position from a sequence number and a sub-sequence index.
    pub fn new(sequence: SequenceNumber, sub_sequence: u64) -> Self {
        Self {
            sequence,
            sub_sequence,
        }
    }
}

impl fmt::Display for ExtendedSequenceNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.sequence, self.sub_sequence)
    }
}

/// How far a shard has been processed. The sentinels are the KCL's literal strings in
/// the `checkpoint` attribute (`SentinelCheckpoint.java`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Checkpoint {
    /// Nothing processed yet; start at the oldest record.
    TrimHorizon,
    /// Nothing processed yet; start at the tip.
    Latest,
    /// Nothing processed yet; start at the configured timestamp (not stored in the lease).
    AtTimestamp,
    /// Every record up to and including this one is processed.
    At(ExtendedSequenceNumber),
    /// The shard is finished; its children may start.
    ShardEnd,
}

/// The `checkpoint` text of [`Checkpoint::TrimHorizon`].
pub const TRIM_HORIZON: &str = "TRIM_HORIZON";
/// The `checkpoint` text of [`Checkpoint::Latest`].
pub const LATEST: &str = "LATEST";
/// The `checkpoint` text of [`Checkpoint::AtTimestamp`].
pub const AT_TIMESTAMP: &str = "AT_TIMESTAMP";
/// The `checkpoint` text of [`Checkpoint::ShardEnd`].
pub const SHARD_END: &str = "SHARD_END";

impl Checkpoint {
    /// The `checkpoint` and `checkpointSubSequenceNumber` attribute values.
    pub fn encode(&self) -> (&str, u64) {
        match self {
            Checkpoint::TrimHorizon => (TRIM_HORIZON, 0),
            Checkpoint::Latest => (LATEST, 0),
            Checkpoint::AtTimestamp => (AT_TIMESTAMP, 0),
            Checkpoint::ShardEnd => (SHARD_END, 0),
            Checkpoint::At(at) => (at.sequence.as_str(), at.sub_sequence),
        }
    }

    /// Reads the two attributes back; `why` names what is wrong.
    pub fn decode(text: &str, sub_sequence: u64) -> Result<Self, String> {
        Ok(match text {
            TRIM_HORIZON => Checkpoint::TrimHorizon,
            LATEST => Checkpoint::Latest,
            AT_TIMESTAMP => Checkpoint::AtTimestamp,
            SHARD_END => Checkpoint::ShardEnd,
            other => Checkpoint::At(ExtendedSequenceNumber::new(
                SequenceNumber::parse(other).map_err(|e| {
                    format!("not a sequence number nor TRIM_HORIZON, LATEST, AT_TIMESTAMP or SHARD_END: {e}")
                })?,
                sub_sequence,
            )),
        })
    }

    /// Whether the shard is finished (SHARD_END), so its children may be read.
    pub fn is_shard_end(&self) -> bool {
        matches!(self, Checkpoint::ShardEnd)
    }
}

impl fmt::Display for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Checkpoint::At(at) => at.fmt(f),
            other => f.write_str(other.encode().0),
        }
    }
}

/// One lease row. `counter` (`leaseCounter`) is the fencing token: flotilla bumps it on
/// every change of owner, and every ownership or checkpoint write is conditional on it.
#[derive(Debug, Clone, PartialEq)]
pub struct Lease {
    /// The row's `leaseKey`: which shard (of which stream) this lease is for.
    pub key: LeaseKey,
    /// The worker holding the lease (`leaseOwner`); `None`: nobody does, free to take.
    pub owner: Option<WorkerId>,
    /// `leaseCounter`, the fencing token: raised on every change of owner (and by the
    /// renewals of `lease.java_compat`), never by a checkpoint.
    pub counter: u64,
    /// How far the shard has been processed (`checkpoint` and `checkpointSubSequenceNumber`).
    pub checkpoint: Checkpoint,
    /// `ownerSwitchesSinceCheckpoint`: changes of owner since the last checkpoint write.
    pub owner_switches_since_checkpoint: u64,
    /// The shard's parents (`parentShardId`); it is read once each is at SHARD_END or gone.
    pub parent_shard_ids: Vec<ShardId>,
    /// The shard's children (`childShardIds`), written with its SHARD_END checkpoint.
    pub child_shard_ids: Vec<ShardId>,
    /// The shard's hash keys (`startingHashKey`, `endingHashKey`); `None` on rows without them.
    pub hash_range: Option<HashKeyRange>,
    /// A prepared (two-phase) checkpoint: the position a processor said it is about to
    /// commit (`Checkpointer::prepare_checkpoint`, the Java KCL's `prepareCheckpoint`),
    /// shown to the next owner in `ShardInfo`. Every checkpoint write removes it.
    pub pending_checkpoint: Option<ExtendedSequenceNumber>,
    /// The application state prepared with it (`pendingCheckpointState`, binary; the
    /// KCL's `prepareCheckpoint(..., byte[] pendingCheckpointState)` writes it).
    pub pending_checkpoint_state: Option<Vec<u8>>,
    /// KCL 3.x graceful hand-off marker; read, never written.
    pub checkpoint_owner: Option<String>,
    /// A live worker's request that the owner hand this lease over to it (a steal).
    /// Written by the requester, honoured or cleared by the owner; never changes the
    /// counter, so the owner's checkpoints go on succeeding until it hands over.
    pub handoff_to: Option<WorkerId>,
    /// The stream the shard belongs to (`flotillaSource`: a Kinesis stream's name or a
    /// DynamoDB stream's ARN), written once when the row is created, so that position
    /// tokens can say which source they belong to. `None` on rows a KCL (or an older
    /// flotilla) created.
    pub source: Option<String>,
    /// When `source` was created, in seconds since the epoch
    /// (`flotillaSourceCreated`; Kinesis' `StreamCreationTimestamp`): a stream deleted and
    /// created again under its name is another stream, whose positions these are not.
    /// `None` on rows written before flotilla recorded it, by a KCL, or for a source
    /// whose name already changes when it is made again (a table stream's ARN).
    pub source_created: Option<u64>,
}

impl Lease {
    /// A new, unowned lease for a shard, as the StreamWatcher creates it.
    pub fn new(
        shard: &ShardId,
        checkpoint: Checkpoint,
        parents: Vec<ShardId>,
        hash_range: Option<HashKeyRange>,
    ) -> Self {
        Self {
            key: LeaseKey::from(shard),
            owner: None,
            counter: 0,
            checkpoint,
            owner_switches_since_checkpoint: 0,
            parent_shard_ids: parents,
            child_shard_ids: Vec::new(),
            hash_range,
            pending_checkpoint: None,
            pending_checkpoint_state: None,
            checkpoint_owner: None,
            handoff_to: None,
            source: None,
            source_created: None,
        }
    }

    /// The owner and counter a conditional write must match.
    pub fn fence(&self) -> Fence {
        Fence {
            owner: self.owner.clone(),
            counter: self.counter,
        }
    }
}

/// What a conditional lease write expects to find: the lease is unchanged since it was
/// read if both its owner and its counter still match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    /// The owner the writer read (`leaseOwner`); `None` for an unowned lease.
    pub owner: Option<WorkerId>,
    /// The `leaseCounter` the writer read.
    pub counter: u64,
}

/// A worker's liveness item. Workers do not renew each lease: a worker is alive while
/// its heartbeat counter keeps moving, as seen on the observer's own clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Heartbeat {
    /// The worker whose heartbeat this is.
    pub worker: WorkerId,
    /// Raised by one at every heartbeat write; peers judge the worker alive while it moves.
    pub counter: u64,
    /// What the worker reported with this heartbeat.
    pub load: WorkerLoad,
}

/// What a worker tells the fleet with each heartbeat, for balancing and status pages.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct WorkerLoad {
    /// Leases held when the heartbeat was written.
    pub leases: u64,
    /// Records delivered to processors per second since the previous heartbeat.
    pub records_per_second: u64,
    /// The worker is shutting down: it takes nothing and hands its leases to whoever
    /// asks. Others leave it out of fair shares.
    pub draining: bool,
    /// Ownership changes this worker has made (takes, handoff requests and answers,
    /// releases, rows created or deleted, SHARD_END), counted from its start. A peer
    /// that sees it move reads the lease rows again; while no counter moves (and no
    /// worker joins, leaves or dies), a round reads only the heartbeat rows.
    pub changes: u64,
    /// MillisBehindLatest per shard it reads (lease key → ms; a shard id names a shard
    /// only within its stream), so any worker can show the whole fleet's lag without
    /// reading the stream.
    pub lag_ms: std::collections::BTreeMap<String, u64>,
    /// In fan-out mode, per shard (by lease key) whose subscription is open: how long it
    /// has been (ms).
    /// A held shard missing here has none (a fan-out worker's stall, shown fleet-wide).
    pub subscribed_ms: std::collections::BTreeMap<String, u64>,
    /// Each held lease's smoothed throughput, by lease key (not shard id: shard ids of
    /// two streams collide), for throughput-aware balance and status pages. `None`: this
    /// worker does not balance on throughput (an older flotilla, or `lease.balance =
    /// "count"`), and peers keep to count-only balance while it is a member. A held lease
    /// missing from `Some` has no rate yet (just taken: its first interval is not a fair
    /// sample).
    pub lease_rates: Option<std::collections::BTreeMap<LeaseKey, LeaseRate>>,
    /// The worker's `lease.heartbeat_interval`, in ms, as it declares it: what an
    /// operator's command watches a heartbeat for (`flotilla rewind`, `destroy`...), so
    /// that no smaller number on a command line can call a live worker dead. `None` from
    /// an older flotilla.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub heartbeat_interval_ms: Option<u64>,
    /// The worker's `lease.failover_time`, in ms, as it declares it (see
    /// `heartbeat_interval_ms`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failover_time_ms: Option<u64>,
}

impl WorkerLoad {
    /// A load read through the heartbeat index (`item::HEARTBEAT_INDEX`) has no lags,
    /// subscription ages or rates: the index does not hold them. Those of `whole`, the
    /// worker's load as last read whole (a scan, a full read), stand in for them, so a
    /// read through the index does not blank the fleet's lag or turn a peer
    /// count-only for balance.
    pub fn fill_unread(&mut self, whole: &WorkerLoad) {
        if self.lag_ms.is_empty() {
            self.lag_ms.clone_from(&whole.lag_ms);
        }
        if self.subscribed_ms.is_empty() {
            self.subscribed_ms.clone_from(&whole.subscribed_ms);
        }
        if self.lease_rates.is_none() {
            self.lease_rates.clone_from(&whole.lease_rates);
        }
    }
}

/// One lease's throughput as its owner measured it, smoothed over heartbeats.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LeaseRate {
    /// Records delivered to the processor per second.
    pub records_per_second: u64,
    /// Bytes delivered per second (each record's data plus its partition key).
    pub bytes_per_second: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_load_read_through_the_index_keeps_the_lags_and_rates_last_read_whole() {
        let whole = WorkerLoad {
            leases: 3,
            changes: 4,
            lag_ms: [("s1".to_owned(), 70)].into(),
            subscribed_ms: [("s1".to_owned(), 900)].into(),
            lease_rates: Some([(LeaseKey::new("s1"), LeaseRate::default())].into()),
            ..WorkerLoad::default()
        };
        // What the index holds: counts and changes, now newer than the whole read.
        let mut summary = WorkerLoad {
            leases: 4,
            changes: 6,
            ..WorkerLoad::default()
        };
        summary.fill_unread(&whole);
        assert_eq!(
            summary,
            WorkerLoad {
                leases: 4,
                changes: 6,
                ..whole.clone()
            }
        );
        // What a read did return stands.
        let mut fresh = WorkerLoad {
            lag_ms: [("s2".to_owned(), 5)].into(),
            lease_rates: Some(BTreeMap::new()),
            ..WorkerLoad::default()
        };
        fresh.fill_unread(&whole);
        assert_eq!(fresh.lag_ms, [("s2".to_owned(), 5)].into());
        assert_eq!(fresh.lease_rates, Some(BTreeMap::new()));
        assert_eq!(fresh.subscribed_ms, whole.subscribed_ms);
    }

    #[test]
    fn checkpoint_round_trips_through_its_encoding() {
        let seq = SequenceNumber::parse("49680458031169431967754064162084943116060673600470908946")
            .unwrap();
        for cp in [
            Checkpoint::TrimHorizon,
            Checkpoint::Latest,
            Checkpoint::AtTimestamp,
            Checkpoint::ShardEnd,
            Checkpoint::At(ExtendedSequenceNumber::new(seq.clone(), 0)),
            Checkpoint::At(ExtendedSequenceNumber::new(seq, 17)),
        ] {
            let (text, sub) = cp.encode();
            assert_eq!(Checkpoint::decode(text, sub), Ok(cp.clone()));
        }
        let err = Checkpoint::decode("SHARD-END", 0).unwrap_err();
        assert!(
            err.contains("not a sequence number nor TRIM_HORIZON"),
            "{err}"
        );
    }

    #[test]
    fn extended_sequence_numbers_order_by_sequence_then_sub_sequence() {
        let at = |s: u128, sub| ExtendedSequenceNumber::new(SequenceNumber::from_u128(s), sub);
        assert!(at(9, 5) < at(10, 0));
        assert!(at(10, 0) < at(10, 1));
    }

    #[test]
    fn multi_stream_keys_name_their_shard() {
        let key = LeaseKey::new("123456789012:fixture-ms-a:1700000000:shardId-000000000001");
        assert_eq!(key.shard_id(), ShardId::from_index(1));
        assert_eq!(
            LeaseKey::new("shardId-000000000004").shard_id(),
            ShardId::from_index(4)
        );
        assert_eq!(
            key.sibling(&ShardId::from_index(7)).as_str(),
            "123456789012:fixture-ms-a:1700000000:shardId-000000000007"
        );
        assert_eq!(key.stream_name(), Some("fixture-ms-a"));
        let single = LeaseKey::new("shardId-000000000004");
        assert_eq!(single.stream_id(), None);
        assert_eq!(single.stream_name(), None);
        assert_eq!(
            single.sibling(&ShardId::from_index(7)),
            LeaseKey::from(&ShardId::from_index(7))
        );
    }
}
