//! The DynamoDB port: the lease table's lease rows, and the errors of both lease-table
//! ports (this one and [`WorkerRows`]).

use futures::future::BoxFuture;

use super::layout::LegacyRows;
use super::worker_rows::WorkerRows;
use crate::model::item::{MalformedRow, ReadUnits, Row};
use crate::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Heartbeat, Lease, LeaseKey, ShardId, WorkerId,
};

/// Everything a scan found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ScanOutput {
    /// Every lease row that could be read.
    pub leases: Vec<Lease>,
    /// Every heartbeat row that could be read: the worker table's, and the legacy rows
    /// of workers of an older version ([`crate::backend::layout::merge`]).
    pub heartbeats: Vec<Heartbeat>,
    /// Rows that could not be read. Reported here, skipped, never fatal.
    pub malformed: Vec<MalformedRow>,
    /// Rows other programs keep in the lease table (KCL 3.x coordinator state and the
    /// like); flotilla's own rows are not among them.
    pub other_rows: usize,
    /// What the scan is billed (the server's ConsumedCapacity; the memory backend
    /// computes it by DynamoDB's rules). Zero from a server that does not say.
    pub read_units: ReadUnits,
    /// flotilla's own rows found in the lease table (the layout before the worker
    /// table): see [`crate::backend::layout`].
    pub legacy: LegacyRows,
}

impl ScanOutput {
    /// Files one row read by a scan of a table holding only leases and other programs'
    /// rows (flotilla's own rows are the caller's: [`Row::Heartbeat`] and
    /// [`Row::Roster`] are returned to it).
    pub fn push(&mut self, row: Result<Row, MalformedRow>) -> Option<Row> {
        match row {
            Ok(Row::Lease(lease)) => self.leases.push(*lease),
            Ok(Row::Other { .. }) => self.other_rows += 1,
            Ok(own @ (Row::Heartbeat(_) | Row::Roster(_))) => return Some(own),
            Err(malformed) => self.malformed.push(malformed),
        }
        None
    }
}

/// Whether `ensure_table` found the table or made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableState {
    /// The table was already there (and left as it was).
    Existed,
    /// The table was missing and this call made it.
    Created,
}

/// Lease table errors, by what the caller should do about them.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum LeaseError {
    /// The row changed since it was read: another worker owns it now, or it is gone.
    /// The caller must stop acting on the lease.
    #[error("lease {key}: condition failed, owner is now {}, counter {}",
        owner.as_ref().map(|o| o.as_str()).unwrap_or("nobody"),
        counter.map(|c| c.to_string()).unwrap_or_else(|| "unknown (row missing)".into()))]
    ConditionFailed {
        /// The lease whose write was refused.
        key: LeaseKey,
        /// The row's `leaseOwner` now; `None` when unowned or the row is gone.
        owner: Option<WorkerId>,
        /// The row's `leaseCounter` now; `None` when the row is gone.
        counter: Option<u64>,
    },
    /// DynamoDB asked us to slow down: back off with jitter and retry.
    #[error("{op}: throttled by DynamoDB: {message}")]
    Throttled {
        /// The API call that failed (e.g. `"UpdateItem"`).
        op: &'static str,
        /// The error text (the server's, naming the table), for logs.
        message: String,
    },
    /// The table does not exist (ResourceNotFoundException). Repeating fails the same
    /// way until it is created.
    #[error("{op}: not found: {message}")]
    NotFound {
        /// The API call that failed (e.g. `"UpdateItem"`).
        op: &'static str,
        /// The error text (the server's, naming the table), for logs.
        message: String,
    },
    /// A row the call needed could not be read as a lease (see [`MalformedRow`]); it
    /// stays so until someone fixes the row.
    #[error(transparent)]
    Malformed(#[from] MalformedRow),
    /// The table exists but is not keyed by `leaseKey` (S) alone: not a lease table, or
    /// the wrong name. Repeating fails the same way; the table cannot be used.
    #[error(
        "table {table} exists with key schema {found}; a lease table needs leaseKey (S) as its only hash key"
    )]
    WrongKeySchema {
        /// The table's name.
        table: String,
        /// Its key schema as found, for the message.
        found: String,
    },
    /// A network failure, a timeout or a 5xx: retry.
    #[error("{op}: transient failure talking to {endpoint}: {message}")]
    Transient {
        /// The API call that failed (e.g. `"UpdateItem"`).
        op: &'static str,
        /// The URL the call went to, so an operator can tell which one is unreachable.
        endpoint: String,
        /// The error text (the server's, naming the table), for logs.
        message: String,
    },
    /// The server's answer lacks what the call needs from it. Adapters read only what
    /// a call uses, so this names the one thing that was missing; it means the server
    /// returned less than DynamoDB promises for that call.
    #[error("{op}: table {table}: the answer about {key} has no {missing}")]
    IncompleteAnswer {
        /// The API call that failed (e.g. `"UpdateItem"`).
        op: &'static str,
        /// The table's name.
        table: String,
        /// The `leaseKey` (or table) the answer was about.
        key: String,
        /// What the answer lacked, as DynamoDB names it (e.g. `"leaseCounter"`).
        missing: String,
    },
    /// The credentials may not make this call, or are not valid (expired, unknown, a
    /// bad signature): it fails the same way until IAM or the credentials change.
    #[error("{op}: access denied: {message}")]
    AccessDenied {
        /// The API call that failed (e.g. `"UpdateItem"`).
        op: &'static str,
        /// The error text (the server's, naming the table), for logs.
        message: String,
    },
    /// Any other failure (a refused request, an operation the server lacks). Not
    /// retryable.
    #[error("{op}: {message}")]
    Other {
        /// The API call that failed (e.g. `"UpdateItem"`).
        op: &'static str,
        /// The error text (the server's, naming the table), for logs.
        message: String,
    },
}

impl LeaseError {
    /// Whether the same call may succeed if repeated after a pause (a throttle or a
    /// transient failure).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            LeaseError::Throttled { .. } | LeaseError::Transient { .. }
        )
    }
}

/// The lease table: the lease rows. The worker rows (heartbeats, the roster) are the
/// [`WorkerRows`] port, which every lease table is too: a take of an expired lease is
/// conditional on its owner's heartbeat row, so both ports are one store.
///
/// Every write that changes ownership or progress is conditional on a [`Fence`] (the
/// owner and counter the caller last read); a mismatch is `ConditionFailed`, carrying
/// the row's current owner and counter when the row still exists. The counter is the
/// fencing token: it rises by one on every change of owner (take, release) and never
/// otherwise, so a worker that holds `(me, n)` knows nobody else held the lease since.
///
/// Contract (checked by `tests/contract_lease_table.rs` on every backend):
/// * `ensure_table` creates a PAY_PER_REQUEST table keyed by `leaseKey` (S), and the
///   worker table beside it (same key, with the heartbeat index), and returns once both
///   are ACTIVE; an existing table with another key schema is `WrongKeySchema`. The
///   lease table holds lease rows only: heartbeats and the roster are in the worker
///   table (`crate::backend::layout`).
/// * `scan` returns every row of both tables, paginated; a malformed row is reported
///   in `ScanOutput::malformed` and the scan goes on; legacy rows (flotilla's own rows
///   in the lease table) are reported in `ScanOutput::legacy`, and those of workers of
///   an older version merged into the heartbeats.
/// * `create_if_absent` never overwrites: it returns `false` if the key exists.
/// * `take(key, fence, me)`: owner := me, counter + 1, ownerSwitchesSinceCheckpoint + 1,
///   any handoff request removed.
/// * `take_expired(key, fence, me, beat)`: as `take`, and only while the fence's
///   owner's heartbeat row is as the taker last saw it (`beat`: its counter; `None`: no
///   row), checked in the same atomic write. Otherwise `ConditionFailed` naming the row
///   (unchanged) and nothing is written.
/// * `release(key, fence)`: owner removed, counter + 1, any handoff request removed.
/// * `renew(key, fence)`: counter + 1, nothing else (a handoff request stays); used only
///   with `lease.java_compat`, through `crate::renewal::Renewing`.
/// * `request_handoff(key, fence, me)`: handoff request := me, unless another worker's
///   request is there (`ConditionFailed`); counter unchanged. Asking again is fine.
/// * `transfer(key, fence, to)`: only while the request names `to`: owner := to,
///   counter + 1, ownerSwitchesSinceCheckpoint + 1, the request removed.
/// * `clear_handoff(key, requester)`: the request removed if it names `requester`
///   (`ConditionFailed` otherwise); owner and counter unchanged.
/// * `checkpoint(key, fence, cp, children)`: checkpoint set, ownerSwitchesSinceCheckpoint
///   := 0, any pending (two-phase) checkpoint removed, `childShardIds` set when given;
///   the counter does not change.
/// * `prepare_checkpoint(key, fence, pending, state)`: `pendingCheckpoint` and its
///   sub-sequence number set, `pendingCheckpointState` set to `state` (removed when
///   `None`); the checkpoint, ownerSwitchesSinceCheckpoint and the counter do not change.
/// * `delete(key, fence)`: the row is removed.
/// * `ensure_table` makes the heartbeat index with a new table, and adds it to a
///   table that lacks it where it may (UpdateTable); where it may not, heartbeats are
///   read by key, said once at WARN.
/// * `take_expired` checks the owner's heartbeat by `crate::backend::layout::beat_checks`.
/// * `stamp_source(key, source, created, overwrite)`: source and creation time set (the
///   creation time removed when `None`), nothing else; without `overwrite` only on a row
///   that names no creation time and no source or this one.
/// * Attributes a write does not name are left as they are (a Java KCL's extras survive).
pub trait LeaseTable: WorkerRows {
    /// The table's name, for logs and errors.
    fn table_name(&self) -> &str;

    /// Makes the table (and its heartbeat index) if it is missing, and waits until it is
    /// ACTIVE; says whether it was there.
    fn ensure_table(&self) -> BoxFuture<'_, Result<TableState, LeaseError>>;

    /// Reads every row of the table, every page.
    fn scan(&self) -> BoxFuture<'_, Result<ScanOutput, LeaseError>>;

    /// A strongly consistent read of one lease; `Ok(None)` if there is no such row.
    fn get<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<Option<Lease>, LeaseError>>;

    /// Writes a new lease row unless its key exists; `Ok(false)` if it did (nothing
    /// written).
    fn create_if_absent<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, LeaseError>>;

    /// Takes the lease for `new_owner` while the row is still `expected`.
    /// Returns the lease as written.
    fn take<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>>;

    /// Takes a lease from an owner judged dead because its heartbeat counter stood still
    /// for the failover time: `take`, conditional also on that owner's heartbeat row
    /// still being as the taker saw it (`owner_heartbeat`: its counter; `None`: no
    /// row). Without it a take sent just before the owner's heartbeats resumed could
    /// land after the owner re-read its rows and lifted its fence, and both would
    /// deliver until the owner's next scan (the race `lease_keeper/model.rs` finds).
    /// Returns the lease as written. Without an owner in the fence it is `take`.
    fn take_expired<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
        owner_heartbeat: Option<u64>,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>>;

    /// Gives the lease up (owner removed) while the row is still `expected`.
    /// Returns the new counter.
    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>>;

    /// Renews a held lease the Java KCL's way (`lease.java_compat`): the counter + 1,
    /// only while the row is `expected`, so that Java workers, which judge a lease by its
    /// counter moving, see it alive. Returns the new counter. Only
    /// `crate::renewal::Renewing` calls it, and it keeps the rest of the worker on the
    /// counter the lease was taken with (docs/lease-protocol.md, "Java KCL workers").
    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>>;

    /// Writes `checkpoint` (and `children`, the closed shard's child shards, when not
    /// empty) while the row is still `expected`.
    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        checkpoint: &'a Checkpoint,
        children: &'a [ShardId],
    ) -> BoxFuture<'a, Result<(), LeaseError>>;

    /// Records a prepared (two-phase) checkpoint beside the committed one, in the Java
    /// KCL's attributes (`DynamoDBCheckpointer.prepareCheckpoint`), so that the next
    /// owner sees both. Fenced like `checkpoint`; the next `checkpoint` removes it.
    fn prepare_checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        pending: &'a ExtendedSequenceNumber,
        state: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), LeaseError>>;

    /// Deletes the lease row while it is still `expected`: the lease of a finished shard
    /// whose children have started, or of a stream no longer consumed.
    fn delete<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<(), LeaseError>>;

    /// Asks the owner (alive, not answering to a fence of ours) to hand the lease over.
    fn request_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>>;

    /// The owner's answer to a request: the lease passes to `to`. Returns the new counter.
    fn transfer<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        to: &'a WorkerId,
    ) -> BoxFuture<'a, Result<u64, LeaseError>>;

    /// Withdraws a request (by the requester) or turns down a stale one (by the owner).
    fn clear_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>>;

    /// Stamps the lease row `key` with the stream its positions are in (`flotillaSource`
    /// := `source`, and `flotillaSourceCreated` := `created`, removed when `None`),
    /// owner, counter and checkpoint untouched: only while the row names no source or
    /// `source` itself, and no creation time (`model::origin`: adopting a row the Java
    /// KCL, or a flotilla before creation times, wrote); with `overwrite`, whatever it
    /// names (`flotilla position import --force --source`). `Ok(false)`: the row names
    /// another, or is gone; nothing written.
    fn stamp_source<'a>(
        &'a self,
        key: &'a LeaseKey,
        source: &'a str,
        created: Option<u64>,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<bool, LeaseError>>;
}
