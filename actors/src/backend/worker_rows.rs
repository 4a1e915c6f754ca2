//! The DynamoDB port of the worker rows: each worker's heartbeat row and the roster
//! that names them, in the worker table (`crate::backend::layout`).
//!
//! A port of its own so that code that only beats or reads heartbeats (and a decorator
//! of those calls) need not know the lease rows; every [`crate::backend::LeaseTable`]
//! is one too, since a take of an expired lease is conditional on these rows.

use futures::future::BoxFuture;

use super::layout::{LegacyRows, Retirement};
use super::lease_table::LeaseError;
use crate::model::item::{MalformedRow, ReadUnits};
use crate::model::{Heartbeat, WorkerId, WorkerLoad};

/// What [`WorkerRows::heartbeats`] found: the heartbeat rows the roster names, read
/// without reading a single lease row.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HeartbeatsOutput {
    /// The workers the roster names (some may have no heartbeat row any more), with
    /// those the legacy roster names.
    pub roster: Vec<WorkerId>,
    /// The heartbeat rows found for the workers the roster names.
    pub heartbeats: Vec<Heartbeat>,
    /// Heartbeat rows that could not be read. Reported here, skipped, never fatal.
    pub malformed: Vec<MalformedRow>,
    /// Items asked for (the roster and one per worker it names, found or not), or, read
    /// through the index, the roster and the items the Query returned and any asked for
    /// by key.
    pub items_read: usize,
    /// Read through [`crate::model::item::HEARTBEAT_INDEX`]: every heartbeat's lag maps
    /// are empty and its rates `None` because the index does not hold them, not
    /// because the worker wrote them so (see [`HeartbeatDetail`]).
    pub summary: bool,
    /// What the read is billed (as [`crate::backend::ScanOutput::read_units`]).
    pub read_units: ReadUnits,
    /// flotilla's own rows found in the lease table: the legacy roster, and the legacy
    /// heartbeat rows of the workers it names that have no worker-table row (read and
    /// merged into `heartbeats`). See [`crate::backend::layout`].
    pub legacy: LegacyRows,
}

/// How much of each heartbeat row [`WorkerRows::heartbeats`] must return.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeartbeatDetail {
    /// What a round needs (counter, changes, draining, lease count, records per second):
    /// read through the heartbeat index when the table has it (one Query, eventually
    /// consistent, billed by bytes), else as `Full`.
    Summary,
    /// Every attribute, lags and rates included: the rows read by key (strongly
    /// consistent BatchGetItem, billed per item).
    Full,
}

/// The worker rows: heartbeats and the roster.
///
/// Contract (checked by `tests/contract_lease_table.rs` on every backend; the tables
/// and the heartbeat index are made by `LeaseTable::ensure_table`):
/// * `heartbeat(me, load)`: the worker's heartbeat counter + 1 (created at 1), returned;
///   the load attributes replaced. While the lease table has a legacy roster, the
///   worker's legacy row gets the same counter and load, and the worker is named in that
///   roster, and the call succeeds only once both writes have.
/// * `join_roster(workers)`: each named in the roster row (`flotilla-roster`); naming
///   one already there is fine.
/// * `heartbeats(detail)`: the roster, and the heartbeat row of every worker it names
///   that has one (a named worker without a row is skipped); a malformed heartbeat row
///   is reported in `malformed`. No lease row is read. `Summary` on a table with the
///   heartbeat index reads it (`summary` set; rows the index does not show yet, a
///   joiner's, are read by key); on a table without it, and for `Full`, the rows are
///   read whole.
/// * `remove_heartbeat(me)` and `remove_dead_heartbeat(w, counter)` also take the worker
///   out of the roster; the latter only while the row's counter is `counter` (`false`,
///   nothing removed, when it moved; `true` when the row is already gone). Both remove
///   the worker's legacy row and legacy roster entry too.
/// * `retire_legacy(plan)`: the legacy roster deleted only while it names exactly the
///   plan's workers (`false`, nothing deleted, otherwise), then the plan's legacy
///   heartbeat rows, each under its condition.
pub trait WorkerRows: Send + Sync + 'static {
    /// The worker table's name (`crate::backend::layout::worker_table_name`).
    fn worker_table_name(&self) -> &str;

    /// Writes `worker`'s heartbeat row with its `load`; returns the new heartbeat
    /// counter.
    fn heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        load: &'a WorkerLoad,
    ) -> BoxFuture<'a, Result<u64, LeaseError>>;

    /// Removes a worker's heartbeat row (a clean exit) and its roster entry; absent is
    /// fine.
    fn remove_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>>;

    /// Names workers in the roster, the one row that lists every heartbeat row, so that
    /// [`WorkerRows::heartbeats`] can read them without a scan. A worker joins at its
    /// first round, and again whenever it finds itself missing.
    fn join_roster<'a>(&'a self, workers: &'a [WorkerId]) -> BoxFuture<'a, Result<(), LeaseError>>;

    /// Every heartbeat row the roster names (a GetItem of the roster, then a Query of
    /// the heartbeat index for `Summary`, or a BatchGetItem of the rows): what a round
    /// reads when no lease row changed, so its cost grows with the workers, not with
    /// the leases, and through the index by the bytes a round needs, not by rows.
    ///
    /// The index is eventually consistent: a `Summary` may show a counter a moment
    /// old. That only delays a death (docs/lease-protocol.md, "Reads"); every ownership
    /// write stays conditional on the rows themselves.
    fn heartbeats(
        &self,
        detail: HeartbeatDetail,
    ) -> BoxFuture<'_, Result<HeartbeatsOutput, LeaseError>>;

    /// Removes the heartbeat row of a worker dead past the retention, only while its
    /// counter still stands at `counter` (a worker that came back keeps its row), and
    /// its roster entry. `Ok(false)`: the counter moved, nothing removed.
    fn remove_dead_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        counter: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>>;

    /// Deletes flotilla's own rows from the lease table once no worker of an older
    /// version is alive to read them (`crate::backend::layout`): the legacy roster,
    /// only while it names exactly `plan.roster`, then `plan.rows`. `Ok(false)`: the
    /// roster changed (an older worker joined), nothing deleted.
    fn retire_legacy<'a>(&'a self, plan: &'a Retirement)
    -> BoxFuture<'a, Result<bool, LeaseError>>;
}
