//! An in-memory DynamoDB holding lease tables, with DynamoDB's conditional semantics.
//!
//! Rows are kept as attribute maps and read through the same codec as the DynamoDB
//! adapter, and each write touches only the attributes the DynamoDB adapter's update
//! expression names, so attributes a Java KCL wrote survive here as they do there.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::time::Instant;

use crate::backend::layout::{self, Dual, LegacyWrite, Place, Retirement};
use crate::backend::{
    HeartbeatDetail, HeartbeatsOutput, LeaseError, LeaseTable, ScanOutput, TableState, WorkerRows,
};
use crate::model::item::{
    self, AttrValue, ENTITY_ROSTER, ENTITY_WORKER, Item, PENDING_ATTRS, ROSTER_KEY, ReadUnits, Row,
    attr, checkpoint_attrs, decode_row, encode_lease, heartbeat_index_view, heartbeat_key,
    item_size, load_attrs, pending_checkpoint_attrs, shard_set,
};
use crate::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, ShardId, WorkerId, WorkerLoad,
};
use crate::mutants::{self, Mutant};

#[derive(Debug)]
struct Table {
    /// The hash key attribute and its type, as CreateTable declared them.
    key: (String, String),
    items: BTreeMap<String, Item>,
    /// The heartbeat index (`item::HEARTBEAT_INDEX`), once made.
    index: Option<BeatIndex>,
}

/// A global secondary index as DynamoDB keeps one: updated after the write, so a Query
/// may see a row as it was up to `lag` ago (zero unless a test asks for more), or not
/// yet see it at all.
#[derive(Debug, Default)]
struct BeatIndex {
    lag: Duration,
    /// Per row key, its projection as written (`None`: gone from the index), oldest
    /// first; only what may still be seen is kept.
    history: BTreeMap<String, VecDeque<(Instant, Option<Item>)>>,
}

impl BeatIndex {
    /// Made for a table that has rows already: they are in it once `lag` passed (a
    /// backfill).
    fn over(items: &BTreeMap<String, Item>, lag: Duration) -> Self {
        let mut index = Self {
            lag,
            ..Self::default()
        };
        for (key, item) in items {
            index.record(key, Some(item));
        }
        index
    }

    /// The row `key` was written (`None`: deleted).
    fn record(&mut self, key: &str, row: Option<&Item>) {
        let view = row.and_then(heartbeat_index_view);
        let versions = self.history.entry(key.to_owned()).or_default();
        if view.is_none() && versions.is_empty() {
            self.history.remove(key);
            return;
        }
        versions.push_back((Instant::now(), view));
    }

    /// What a Query sees now: each row's newest version at least `lag` old.
    fn view(&mut self) -> BTreeMap<String, Item> {
        let Some(cutoff) = Instant::now().checked_sub(self.lag) else {
            return BTreeMap::new();
        };
        let mut out = BTreeMap::new();
        self.history.retain(|key, versions| {
            // Versions older than the newest visible one can never be seen again.
            while versions.len() > 1 && versions[1].0 <= cutoff {
                versions.pop_front();
            }
            if let Some((at, Some(item))) = versions.front()
                && *at <= cutoff
            {
                out.insert(key.clone(), item.clone());
            }
            !matches!(versions.front(), Some((at, None)) if versions.len() == 1 && *at <= cutoff)
        });
        out
    }
}

impl Table {
    /// Tells the index (if any) that the row `key` changed.
    fn touched(&mut self, key: &str) {
        if let Some(index) = &mut self.index {
            index.record(key, self.items.get(key));
        }
    }
}

/// The tables of one in-memory DynamoDB. Clones share state.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use flotilla_actors::backend::memory::MemoryDynamo;
/// use flotilla_actors::backend::{LeaseError, LeaseTable};
/// use flotilla_actors::model::{Checkpoint, Lease, ShardId, WorkerId};
///
/// let table = MemoryDynamo::new().lease_table("my-app");
/// table.ensure_table().await?;
/// let lease = Lease::new(&ShardId::from_index(0), Checkpoint::TrimHorizon, vec![], None);
/// table.create_if_absent(&lease).await?;
///
/// // Two workers race for the same unowned lease: the counter fences them.
/// let (a, b) = (WorkerId::new("a"), WorkerId::new("b"));
/// let won = table.take(&lease.key, &lease.fence(), &a).await?;
/// let lost = table.take(&lease.key, &lease.fence(), &b).await;
/// assert!(matches!(lost, Err(LeaseError::ConditionFailed { .. })));
/// assert_eq!((won.owner, won.counter), (Some(a), 1));
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct MemoryDynamo {
    tables: Arc<Mutex<BTreeMap<String, Table>>>,
    /// UpdateTable is refused (a role without the permission): an existing table
    /// without the heartbeat index keeps lacking it.
    updates_refused: Arc<AtomicBool>,
    /// How far every heartbeat index trails its table, in milliseconds (zero unless a
    /// test asks for more: [`MemoryDynamo::lag_heartbeat_index`]).
    index_lag_ms: Arc<AtomicU64>,
}

impl MemoryDynamo {
    /// An empty DynamoDB: no tables, UpdateTable allowed, heartbeat indexes not lagging.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, Table>> {
        // Every mutation below is one step under the lock; a poisoned lock holds no
        // half-applied change.
        self.tables.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A lease table handle; the table itself, and its worker table
    /// ([`layout::worker_table_name`]), exist once `ensure_table` made them.
    pub fn lease_table(&self, name: impl Into<String>) -> MemoryLeaseTable {
        let name = name.into();
        MemoryLeaseTable {
            db: self.clone(),
            workers: layout::worker_table_name(&name),
            name,
            dual: Arc::default(),
        }
    }

    /// A lease table handle that keeps heartbeats and the roster in the lease table
    /// itself, as flotilla did before the worker table: a worker of the older version,
    /// for tests of the two side by side (`crate::backend::layout`).
    pub fn older_version_lease_table(&self, name: impl Into<String>) -> MemoryLeaseTable {
        let name = name.into();
        MemoryLeaseTable {
            db: self.clone(),
            workers: name.clone(),
            name,
            dual: Arc::default(),
        }
    }

    /// Makes a table with any hash key and no secondary index, as another program
    /// might (tests of `ensure_table`'s schema check; a KCL-made lease table).
    pub fn create_table(&self, name: &str, hash_key: &str, key_type: &str) {
        self.lock().entry(name.to_owned()).or_insert_with(|| Table {
            key: (hash_key.to_owned(), key_type.to_owned()),
            items: BTreeMap::new(),
            index: None,
        });
    }

    /// From now on, `ensure_table` may not add the heartbeat index to a table that
    /// lacks it (as a role without `dynamodb:UpdateTable`).
    pub fn refuse_table_updates(&self) {
        self.updates_refused.store(true, Ordering::SeqCst);
    }

    /// Makes every heartbeat index, of the tables there are and of those made later,
    /// trail its rows by `lag` from now on, as a real index may (tests of what an
    /// eventually consistent read can do).
    pub fn lag_heartbeat_index(&self, lag: Duration) {
        self.index_lag_ms
            .store(lag.as_millis() as u64, Ordering::SeqCst);
        for table in self.lock().values_mut() {
            if let Some(index) = &mut table.index {
                index.lag = lag;
            }
        }
    }

    fn index_lag(&self) -> Duration {
        Duration::from_millis(self.index_lag_ms.load(Ordering::SeqCst))
    }

    /// Whether `table` has the heartbeat index.
    pub fn has_heartbeat_index(&self, table: &str) -> bool {
        self.lock().get(table).is_some_and(|t| t.index.is_some())
    }

    /// Reads a row as it is stored, every attribute included.
    pub fn get_raw(&self, table: &str, key: &str) -> Option<Item> {
        self.lock().get(table)?.items.get(key).cloned()
    }

    /// Deletes `table` whole, as DeleteTable does (an operator's `flotilla destroy`, or a
    /// hand): whoever uses it next is told it does not exist. `false`: there was none.
    pub fn delete_table(&self, table: &str) -> bool {
        self.lock().remove(table).is_some()
    }

    /// Every row of `table` as stored (none if there is no such table).
    pub fn scan_raw(&self, table: &str) -> Vec<Item> {
        self.lock()
            .get(table)
            .map(|t| t.items.values().cloned().collect())
            .unwrap_or_default()
    }

    /// Writes a raw row, as another program (or a corrupting hand) might.
    pub fn put_raw(&self, table: &str, item: Item) -> Result<(), LeaseError> {
        let mut tables = self.lock();
        let t = tables
            .get_mut(table)
            .ok_or_else(|| not_found("PutItem", table))?;
        let key = match item.get(&t.key.0) {
            Some(AttrValue::S(k)) => k.clone(),
            Some(AttrValue::N(k)) => k.clone(),
            _ => {
                return Err(LeaseError::Other {
                    op: "PutItem",
                    message: format!("item has no {} key", t.key.0),
                });
            }
        };
        t.items.insert(key.clone(), item);
        t.touched(&key);
        Ok(())
    }
}

fn not_found(op: &'static str, table: &str) -> LeaseError {
    LeaseError::NotFound {
        op,
        message: format!("table {table}"),
    }
}

/// One lease table of a [`MemoryDynamo`], with its worker table.
#[derive(Debug, Clone)]
pub struct MemoryLeaseTable {
    db: MemoryDynamo,
    name: String,
    /// Where heartbeats and the roster live; the lease table's own name for a handle of
    /// the older layout.
    workers: String,
    /// This handle's state towards the lease table's legacy rows (one per worker, as
    /// each worker has its own handle).
    dual: Arc<Mutex<Dual>>,
}

fn number(item: &Item, name: &str) -> Option<u64> {
    match item.get(name) {
        Some(AttrValue::N(n)) => n.parse().ok(),
        _ => None,
    }
}

fn owner_of(item: &Item) -> Option<WorkerId> {
    match item.get(attr::LEASE_OWNER) {
        Some(AttrValue::S(o)) => Some(WorkerId::new(o.as_str())),
        _ => None,
    }
}

/// The operation name under which `conditional` skips the fence (the
/// `TakeWithoutCounterCheck` mutant only).
const TAKE_UNCHECKED: &str = "UpdateItem (mutant: unconditional take)";

impl MemoryLeaseTable {
    fn dual(&self) -> MutexGuard<'_, Dual> {
        self.dual.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether heartbeats live in a worker table of their own (a handle of the older
    /// layout keeps them in the lease table).
    fn split(&self) -> bool {
        self.workers != self.name
    }

    /// Whether the lease table may hold legacy rows that count (`layout::Dual::legacy`).
    fn legacy_in_use(&self) -> bool {
        self.split() && self.dual().legacy()
    }

    /// Runs `write` on the row if it matches the fence, as a conditional update would.
    fn conditional<T>(
        &self,
        op: &'static str,
        key: &LeaseKey,
        fence: &Fence,
        write: impl FnOnce(&mut Item) -> Result<T, LeaseError>,
    ) -> Result<T, LeaseError> {
        self.conditional_on_heartbeat(op, key, fence, None, write)
    }

    /// `conditional`, and (with `heartbeat`) only while that worker's heartbeat row has
    /// that counter (`None`: no row), checked under the same lock: a transaction.
    fn conditional_on_heartbeat<T>(
        &self,
        op: &'static str,
        key: &LeaseKey,
        fence: &Fence,
        heartbeat: Option<(&WorkerId, Option<u64>)>,
        write: impl FnOnce(&mut Item) -> Result<T, LeaseError>,
    ) -> Result<T, LeaseError> {
        let legacy = self.legacy_in_use();
        let mut tables = self.db.lock();
        if let Some((worker, expected)) = heartbeat
            && op != TAKE_UNCHECKED
        {
            let key_of = heartbeat_key(worker);
            let counter_in = |name: &str| {
                tables
                    .get(name)
                    .and_then(|t| t.items.get(&key_of))
                    .map(|row| number(row, attr::LEASE_COUNTER))
            };
            let matches =
                layout::beat_checks(expected, legacy)
                    .into_iter()
                    .all(|(place, check)| {
                        let row = match place {
                            Place::Workers => counter_in(&self.workers),
                            Place::Legacy => counter_in(&self.name),
                        };
                        // A row without a readable counter stands for no counter at all.
                        check.holds(row.map(|c| c.unwrap_or(u64::MAX)))
                    });
            if !matches {
                let table = tables
                    .get_mut(&self.name)
                    .ok_or_else(|| not_found(op, &self.name))?;
                // The lease row is refused as it is (after its own fence is checked).
                let row = fenced(key, fence, table.items.get_mut(key.as_str()))?;
                return Err(refused(key, row));
            }
        }
        let table = tables
            .get_mut(&self.name)
            .ok_or_else(|| not_found(op, &self.name))?;
        let row = if op == TAKE_UNCHECKED {
            // Mutant TakeWithoutCounterCheck: only the row's existence is checked.
            table
                .items
                .get_mut(key.as_str())
                .ok_or_else(|| LeaseError::ConditionFailed {
                    key: key.clone(),
                    owner: None,
                    counter: None,
                })?
        } else {
            fenced(key, fence, table.items.get_mut(key.as_str()))?
        };
        // Work on a copy so a failed write leaves the row as it was.
        let mut updated = row.clone();
        let out = write(&mut updated)?;
        *row = updated;
        Ok(out)
    }

    /// `take` and `take_expired`: owner := me, counter + 1, a switch counted, any
    /// pending checkpoint owner and handoff request removed.
    fn take_row(
        &self,
        key: &LeaseKey,
        expected: &Fence,
        new_owner: &WorkerId,
        heartbeat: Option<(&WorkerId, Option<u64>)>,
    ) -> Result<Lease, LeaseError> {
        let op = if mutants::active(Mutant::TakeWithoutCounterCheck) {
            TAKE_UNCHECKED
        } else {
            "UpdateItem"
        };
        self.conditional_on_heartbeat(op, key, expected, heartbeat, |row| {
            row.insert(
                attr::LEASE_OWNER.into(),
                AttrValue::S(new_owner.as_str().into()),
            );
            set_counter(row, expected.counter + 1);
            let switches = number(row, attr::OWNER_SWITCHES).unwrap_or(0) + 1;
            row.insert(
                attr::OWNER_SWITCHES.into(),
                AttrValue::N(switches.to_string()),
            );
            row.remove(attr::CHECKPOINT_OWNER);
            row.remove(attr::HANDOFF_TO);
            Self::decode(row)
        })
    }

    fn decode(item: &Item) -> Result<Lease, LeaseError> {
        match decode_row(item)? {
            Row::Lease(lease) => Ok(*lease),
            other => Err(LeaseError::Other {
                op: "decode",
                message: format!("expected a lease, found {other}"),
            }),
        }
    }
}

/// The row, if it exists and matches the fence; else `ConditionFailed` with what is there.
fn fenced<'a>(
    key: &LeaseKey,
    fence: &Fence,
    row: Option<&'a mut Item>,
) -> Result<&'a mut Item, LeaseError> {
    let Some(row) = row else {
        return Err(LeaseError::ConditionFailed {
            key: key.clone(),
            owner: None,
            counter: None,
        });
    };
    let owner = owner_of(row);
    let counter = number(row, attr::LEASE_COUNTER);
    if owner != fence.owner || counter != Some(fence.counter) {
        return Err(LeaseError::ConditionFailed {
            key: key.clone(),
            owner,
            counter,
        });
    }
    Ok(row)
}

fn handoff_of(item: &Item) -> Option<WorkerId> {
    match item.get(attr::HANDOFF_TO) {
        Some(AttrValue::S(o)) => Some(WorkerId::new(o.as_str())),
        _ => None,
    }
}

/// The condition failure a write refused for its handoff request, or for its heartbeat
/// condition, reports: the row's owner and counter as they are.
fn refused(key: &LeaseKey, row: &Item) -> LeaseError {
    LeaseError::ConditionFailed {
        key: key.clone(),
        owner: owner_of(row),
        counter: number(row, attr::LEASE_COUNTER),
    }
}

/// The worker ids in the roster row, as DynamoDB keeps a string set (sorted, no
/// duplicates; the attribute is gone once the set is empty).
fn roster_of(table: &Table) -> Vec<String> {
    match table
        .items
        .get(ROSTER_KEY)
        .and_then(|r| r.get(attr::ROSTER_WORKERS))
    {
        Some(AttrValue::SS(ids)) => ids.clone(),
        _ => Vec::new(),
    }
}

/// `ADD`/`DELETE` on the roster's string set, as an UpdateItem does it: the row is
/// created by the first ADD; an emptied set loses its attribute.
fn edit_roster(table: &mut Table, add: &[WorkerId], remove: &[WorkerId]) {
    let mut ids: std::collections::BTreeSet<String> = roster_of(table).into_iter().collect();
    ids.extend(add.iter().map(|w| w.as_str().to_owned()));
    for w in remove {
        ids.remove(w.as_str());
    }
    if add.is_empty() && !table.items.contains_key(ROSTER_KEY) {
        return;
    }
    let row = table.items.entry(ROSTER_KEY.to_owned()).or_default();
    row.insert(attr::LEASE_KEY.into(), AttrValue::S(ROSTER_KEY.into()));
    row.insert(attr::ENTITY_TYPE.into(), AttrValue::S(ENTITY_ROSTER.into()));
    if ids.is_empty() {
        row.remove(attr::ROSTER_WORKERS);
    } else {
        row.insert(
            attr::ROSTER_WORKERS.into(),
            AttrValue::SS(ids.into_iter().collect()),
        );
    }
}

/// Files a heartbeat row read by `heartbeats`: a lease or other row under a
/// heartbeat key is skipped, a malformed one reported.
fn push_heartbeat(out: &mut HeartbeatsOutput, row: Result<Row, item::MalformedRow>) {
    match row {
        Ok(Row::Heartbeat(heartbeat)) => out.heartbeats.push(heartbeat),
        Ok(_) => {}
        Err(malformed) => out.malformed.push(malformed),
    }
}

/// The heartbeat rows of `workers`, read by key as a strongly consistent BatchGetItem
/// (billed per item asked for), into `out`.
fn read_by_key(table: &Table, workers: &[&WorkerId], out: &mut HeartbeatsOutput) {
    if workers.is_empty() {
        return;
    }
    let rows: Vec<Option<&Item>> = workers
        .iter()
        .map(|w| table.items.get(&heartbeat_key(w)))
        .collect();
    out.items_read += rows.len();
    out.read_units += ReadUnits::by_item(rows.iter().map(|r| r.map_or(0, item_size)), true);
    for row in rows.into_iter().flatten() {
        push_heartbeat(out, decode_row(row));
    }
}

fn roster_has(roster: &[WorkerId], worker: &WorkerId) -> bool {
    roster.contains(worker)
}

fn set_counter(item: &mut Item, value: u64) {
    item.insert(attr::LEASE_COUNTER.into(), AttrValue::N(value.to_string()));
}

fn table_mut<'t>(
    tables: &'t mut BTreeMap<String, Table>,
    name: &str,
    op: &'static str,
) -> Result<&'t mut Table, LeaseError> {
    tables.get_mut(name).ok_or_else(|| not_found(op, name))
}

/// A heartbeat row written as the UpdateItem does it: the counter + 1 (`set`: `None`),
/// or set to a given value (a legacy row, which takes its worker-table row's counter);
/// returns the counter written.
fn write_beat(table: &mut Table, worker: &WorkerId, load: &WorkerLoad, set: Option<u64>) -> u64 {
    let key = heartbeat_key(worker);
    let row = table.items.entry(key.clone()).or_default();
    let counter = set.unwrap_or_else(|| number(row, attr::LEASE_COUNTER).unwrap_or(0) + 1);
    row.insert(attr::LEASE_KEY.into(), AttrValue::S(key.clone()));
    row.insert(attr::ENTITY_TYPE.into(), AttrValue::S(ENTITY_WORKER.into()));
    row.insert(
        attr::LEASE_OWNER.into(),
        AttrValue::S(worker.as_str().into()),
    );
    set_counter(row, counter);
    row.extend(load_attrs(load));
    row.insert(
        attr::HEARTBEAT_INDEX_KEY.into(),
        AttrValue::S(ENTITY_WORKER.into()),
    );
    table.touched(&key);
    counter
}

/// Deletes `worker`'s heartbeat row if `check` holds for it (absent counts as passing
/// when the check allows it); `false` when it did not hold.
fn remove_beat_if(table: &mut Table, worker: &WorkerId, check: layout::BeatCheck) -> bool {
    let key = heartbeat_key(worker);
    let counter = table
        .items
        .get(&key)
        .map(|row| number(row, attr::LEASE_COUNTER).unwrap_or(u64::MAX));
    if !check.holds(counter) {
        return false;
    }
    if table.items.remove(&key).is_some() {
        table.touched(&key);
    }
    true
}

/// The legacy roster of a lease table, if it has one.
fn legacy_roster(table: &Table) -> Option<Vec<WorkerId>> {
    table.items.contains_key(ROSTER_KEY).then(|| {
        roster_of(table)
            .iter()
            .map(|id| WorkerId::new(id.as_str()))
            .collect()
    })
}

impl LeaseTable for MemoryLeaseTable {
    fn table_name(&self) -> &str {
        &self.name
    }

    fn ensure_table(&self) -> BoxFuture<'_, Result<TableState, LeaseError>> {
        Box::pin(async move {
            let refused = self.db.updates_refused.load(Ordering::SeqCst);
            let lag = self.db.index_lag();
            let mut tables = self.db.lock();
            let mut ensure = |name: &str, index: bool| match tables.get_mut(name) {
                Some(table) if table.key == (attr::LEASE_KEY.to_owned(), "S".to_owned()) => {
                    // UpdateTable adds the index (backfilled at once here) where allowed.
                    if index && table.index.is_none() && !refused {
                        table.index = Some(BeatIndex::over(&table.items, lag));
                    }
                    Ok(TableState::Existed)
                }
                Some(table) => Err(LeaseError::WrongKeySchema {
                    table: name.to_owned(),
                    found: format!("{} (HASH, {})", table.key.0, table.key.1),
                }),
                None => {
                    tables.insert(
                        name.to_owned(),
                        Table {
                            key: (attr::LEASE_KEY.to_owned(), "S".to_owned()),
                            items: BTreeMap::new(),
                            index: index.then(|| BeatIndex::over(&BTreeMap::new(), lag)),
                        },
                    );
                    Ok(TableState::Created)
                }
            };
            if !self.split() {
                // The older layout: one table, with the heartbeat index.
                return ensure(&self.name, true);
            }
            let state = ensure(&self.name, false)?;
            ensure(&self.workers, true)?;
            let roster = tables.get(&self.name).and_then(legacy_roster).is_some();
            self.dual().saw_roster(roster);
            Ok(state)
        })
    }

    fn scan(&self) -> BoxFuture<'_, Result<ScanOutput, LeaseError>> {
        Box::pin(async move {
            let (items, worker_items): (Vec<Item>, Vec<Item>) = {
                let tables = self.db.lock();
                let table = tables
                    .get(&self.name)
                    .ok_or_else(|| not_found("Scan", &self.name))?;
                let workers = match self.split() {
                    true => tables
                        .get(&self.workers)
                        .ok_or_else(|| not_found("Scan", &self.workers))?
                        .items
                        .values()
                        .cloned()
                        .collect(),
                    false => Vec::new(),
                };
                (table.items.values().cloned().collect(), workers)
            };
            let mut out = ScanOutput {
                read_units: ReadUnits::by_page(items.iter().map(item_size).sum(), true)
                    + ReadUnits::by_page(worker_items.iter().map(item_size).sum(), true),
                ..ScanOutput::default()
            };
            let (mut own, mut legacy, mut roster) = (Vec::new(), Vec::new(), None);
            for item in &items {
                match out.push(decode_row(item)) {
                    Some(Row::Heartbeat(beat)) => legacy.push(beat),
                    Some(Row::Roster(names)) => roster = Some(names),
                    _ => {}
                }
            }
            for item in &worker_items {
                match decode_row(item) {
                    Ok(Row::Heartbeat(beat)) => own.push(beat),
                    Ok(_) => {}
                    Err(malformed) => out.malformed.push(malformed),
                }
            }
            if self.split() {
                self.dual().saw_roster(roster.is_some());
                (out.heartbeats, out.legacy) = layout::merge(own, roster, legacy);
            } else {
                out.heartbeats = legacy;
            }
            Ok(out)
        })
    }

    fn get<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<Option<Lease>, LeaseError>> {
        Box::pin(async move {
            let tables = self.db.lock();
            let table = tables
                .get(&self.name)
                .ok_or_else(|| not_found("GetItem", &self.name))?;
            table.items.get(key.as_str()).map(Self::decode).transpose()
        })
    }

    fn create_if_absent<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let mut tables = self.db.lock();
            let table = tables
                .get_mut(&self.name)
                .ok_or_else(|| not_found("PutItem", &self.name))?;
            if table.items.contains_key(lease.key.as_str()) {
                return Ok(false);
            }
            table
                .items
                .insert(lease.key.as_str().to_owned(), encode_lease(lease));
            Ok(true)
        })
    }

    fn take<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(async move { self.take_row(key, expected, new_owner, None) })
    }

    fn take_expired<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
        owner_heartbeat: Option<u64>,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        Box::pin(async move {
            let heartbeat = expected
                .owner
                .as_ref()
                .map(|owner| (owner, owner_heartbeat));
            self.take_row(key, expected, new_owner, heartbeat)
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(async move {
            self.conditional("UpdateItem", key, expected, |row| {
                row.remove(attr::LEASE_OWNER);
                row.remove(attr::HANDOFF_TO);
                // Mutant ReleaseWithoutCounterBump: the counter stays as it was.
                if mutants::active(Mutant::ReleaseWithoutCounterBump) {
                    return Ok(expected.counter);
                }
                set_counter(row, expected.counter + 1);
                Ok(expected.counter + 1)
            })
        })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(async move {
            self.conditional("UpdateItem", key, expected, |row| {
                set_counter(row, expected.counter + 1);
                Ok(expected.counter + 1)
            })
        })
    }

    fn request_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            self.conditional("UpdateItem", key, expected, |row| {
                match handoff_of(row) {
                    Some(other) if &other != requester => return Err(refused(key, row)),
                    _ => {}
                }
                row.insert(
                    attr::HANDOFF_TO.into(),
                    AttrValue::S(requester.as_str().into()),
                );
                Ok(())
            })
        })
    }

    fn transfer<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        to: &'a WorkerId,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(async move {
            self.conditional("UpdateItem", key, expected, |row| {
                if handoff_of(row).as_ref() != Some(to) {
                    return Err(refused(key, row));
                }
                row.insert(attr::LEASE_OWNER.into(), AttrValue::S(to.as_str().into()));
                set_counter(row, expected.counter + 1);
                let switches = number(row, attr::OWNER_SWITCHES).unwrap_or(0) + 1;
                row.insert(
                    attr::OWNER_SWITCHES.into(),
                    AttrValue::N(switches.to_string()),
                );
                row.remove(attr::HANDOFF_TO);
                Ok(expected.counter + 1)
            })
        })
    }

    fn clear_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            let mut tables = self.db.lock();
            let table = tables
                .get_mut(&self.name)
                .ok_or_else(|| not_found("UpdateItem", &self.name))?;
            let Some(row) = table.items.get_mut(key.as_str()) else {
                return Err(LeaseError::ConditionFailed {
                    key: key.clone(),
                    owner: None,
                    counter: None,
                });
            };
            if handoff_of(row).as_ref() != Some(requester) {
                return Err(refused(key, row));
            }
            row.remove(attr::HANDOFF_TO);
            Ok(())
        })
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        checkpoint: &'a Checkpoint,
        children: &'a [ShardId],
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            self.conditional("UpdateItem", key, expected, |row| {
                for (name, value) in checkpoint_attrs(checkpoint) {
                    row.insert(name.into(), value);
                }
                row.insert(attr::OWNER_SWITCHES.into(), AttrValue::N("0".into()));
                if !children.is_empty() {
                    row.insert(attr::CHILD_SHARD_IDS.into(), shard_set(children));
                }
                for pending in PENDING_ATTRS {
                    row.remove(pending);
                }
                Ok(())
            })
        })
    }

    fn prepare_checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        pending: &'a ExtendedSequenceNumber,
        state: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            self.conditional("UpdateItem", key, expected, |row| {
                let (set, remove) = pending_checkpoint_attrs(pending, state);
                for (name, value) in set {
                    row.insert(name.into(), value);
                }
                for name in remove {
                    row.remove(name);
                }
                Ok(())
            })
        })
    }

    fn delete<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            let mut tables = self.db.lock();
            let table = tables
                .get_mut(&self.name)
                .ok_or_else(|| not_found("DeleteItem", &self.name))?;
            fenced(key, expected, table.items.get_mut(key.as_str()))?;
            table.items.remove(key.as_str());
            Ok(())
        })
    }

    fn stamp_source<'a>(
        &'a self,
        key: &'a LeaseKey,
        source: &'a str,
        created: Option<u64>,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let mut tables = self.db.lock();
            let table = table_mut(&mut tables, &self.name, "UpdateItem")?;
            let Some(row) = table.items.get_mut(key.as_str()) else {
                return Ok(false);
            };
            let named = match row.get(attr::SOURCE) {
                None => true,
                Some(AttrValue::S(s)) => s == source,
                Some(_) => false,
            };
            // Adopting stamps only a row that names this stream (or nothing) and has no
            // creation time yet; overwriting (import --force) stamps any row.
            let adoptable = named && !row.contains_key(attr::SOURCE_CREATED);
            if !(overwrite || adoptable) {
                return Ok(false);
            }
            row.insert(attr::SOURCE.into(), AttrValue::S(source.to_owned()));
            match created {
                Some(c) => {
                    row.insert(attr::SOURCE_CREATED.into(), AttrValue::N(c.to_string()));
                }
                None => {
                    row.remove(attr::SOURCE_CREATED);
                }
            }
            Ok(true)
        })
    }
}

impl WorkerRows for MemoryLeaseTable {
    fn worker_table_name(&self) -> &str {
        &self.workers
    }

    fn heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        load: &'a WorkerLoad,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        Box::pin(async move {
            let mut tables = self.db.lock();
            let counter = write_beat(
                table_mut(&mut tables, &self.workers, "UpdateItem")?,
                worker,
                load,
                None,
            );
            if !self.split() {
                return Ok(counter);
            }
            let write = self.dual().next();
            let leases = table_mut(&mut tables, &self.name, "UpdateItem")?;
            let existed = match write {
                LegacyWrite::Nothing => true,
                LegacyWrite::Join => {
                    write_beat(leases, worker, load, Some(counter));
                    edit_roster(leases, std::slice::from_ref(worker), &[]);
                    true
                }
                LegacyWrite::Update => {
                    let there = leases.items.contains_key(&heartbeat_key(worker));
                    if there {
                        write_beat(leases, worker, load, Some(counter));
                    }
                    there
                }
                LegacyWrite::Leave => {
                    remove_beat_if(leases, worker, layout::BeatCheck::AbsentOrAtMost(u64::MAX));
                    true
                }
            };
            self.dual().done(write, existed);
            Ok(counter)
        })
    }

    fn remove_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            let mut tables = self.db.lock();
            let any = layout::BeatCheck::AbsentOrAtMost(u64::MAX);
            let table = table_mut(&mut tables, &self.workers, "DeleteItem")?;
            remove_beat_if(table, worker, any);
            edit_roster(table, &[], std::slice::from_ref(worker));
            if self.split() {
                let leases = table_mut(&mut tables, &self.name, "DeleteItem")?;
                remove_beat_if(leases, worker, any);
                edit_roster(leases, &[], std::slice::from_ref(worker));
                self.dual().removed();
            }
            Ok(())
        })
    }

    fn join_roster<'a>(&'a self, workers: &'a [WorkerId]) -> BoxFuture<'a, Result<(), LeaseError>> {
        Box::pin(async move {
            let mut tables = self.db.lock();
            edit_roster(
                table_mut(&mut tables, &self.workers, "UpdateItem")?,
                workers,
                &[],
            );
            Ok(())
        })
    }

    fn heartbeats(
        &self,
        detail: HeartbeatDetail,
    ) -> BoxFuture<'_, Result<HeartbeatsOutput, LeaseError>> {
        Box::pin(async move {
            let mut tables = self.db.lock();
            let table = table_mut(&mut tables, &self.workers, "GetItem")?;
            let roster: Vec<WorkerId> = roster_of(table)
                .iter()
                .map(|id| WorkerId::new(id.as_str()))
                .collect();
            // The roster: a strongly consistent read (with the legacy roster, one
            // BatchGetItem).
            let roster_bytes = table.items.get(ROSTER_KEY).map_or(0, item_size);
            let mut out = HeartbeatsOutput {
                items_read: 1,
                read_units: ReadUnits::by_item([roster_bytes], true),
                ..HeartbeatsOutput::default()
            };
            let indexed = match (detail, &mut table.index) {
                (HeartbeatDetail::Summary, Some(index)) => Some(index.view()),
                _ => None,
            };
            let mut by_key = Vec::new();
            match &indexed {
                Some(view) => {
                    // One Query: eventually consistent, billed by the bytes returned.
                    out.summary = true;
                    out.items_read += view.len();
                    out.read_units += ReadUnits::by_page(view.values().map(item_size).sum(), false);
                    for worker in &roster {
                        match view.get(&heartbeat_key(worker)) {
                            Some(item) => push_heartbeat(&mut out, decode_row(item)),
                            // Not in the index (yet): read by key.
                            None => by_key.push(worker),
                        }
                    }
                }
                None => by_key.extend(&roster),
            }
            read_by_key(table, &by_key, &mut out);
            out.roster = roster;
            if !self.split() {
                return Ok(out);
            }
            // The legacy roster, in the same BatchGetItem as the roster, then the legacy
            // rows of the workers it names that the worker table does not show.
            let leases = table_mut(&mut tables, &self.name, "BatchGetItem")?;
            let legacy_names = legacy_roster(leases);
            out.items_read += 1;
            out.read_units +=
                ReadUnits::by_item([leases.items.get(ROSTER_KEY).map_or(0, item_size)], true);
            self.dual().saw_roster(legacy_names.is_some());
            let mut legacy = HeartbeatsOutput::default();
            if let Some(names) = &legacy_names {
                let unseen: Vec<&WorkerId> = names
                    .iter()
                    .filter(|w| !out.heartbeats.iter().any(|h| &h.worker == *w))
                    .collect();
                read_by_key(leases, &unseen, &mut legacy);
                let more: Vec<WorkerId> = names
                    .iter()
                    .filter(|w| !roster_has(&out.roster, w))
                    .cloned()
                    .collect();
                out.roster.extend(more);
            }
            out.items_read += legacy.items_read;
            out.read_units += legacy.read_units;
            out.malformed.extend(legacy.malformed);
            let own = std::mem::take(&mut out.heartbeats);
            (out.heartbeats, out.legacy) = layout::merge(own, legacy_names, legacy.heartbeats);
            Ok(out)
        })
    }

    fn remove_dead_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        counter: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            let mut tables = self.db.lock();
            let table = table_mut(&mut tables, &self.workers, "DeleteItem")?;
            if !remove_beat_if(table, worker, layout::BeatCheck::AbsentOrEquals(counter)) {
                return Ok(false);
            }
            edit_roster(table, &[], std::slice::from_ref(worker));
            if self.split() {
                let leases = table_mut(&mut tables, &self.name, "DeleteItem")?;
                if !remove_beat_if(leases, worker, layout::BeatCheck::AbsentOrAtMost(counter)) {
                    return Ok(false);
                }
                edit_roster(leases, &[], std::slice::from_ref(worker));
            }
            Ok(true)
        })
    }

    fn retire_legacy<'a>(
        &'a self,
        plan: &'a Retirement,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        Box::pin(async move {
            if !self.split() {
                return Ok(false);
            }
            let mut tables = self.db.lock();
            let leases = table_mut(&mut tables, &self.name, "DeleteItem")?;
            let names = |list: &[WorkerId]| -> std::collections::BTreeSet<String> {
                list.iter().map(|w| w.as_str().to_owned()).collect()
            };
            let now = legacy_roster(leases);
            if now.as_deref().map(names) != plan.roster.as_deref().map(names) {
                return Ok(false);
            }
            if leases.items.remove(ROSTER_KEY).is_some() {
                leases.touched(ROSTER_KEY);
            }
            for (worker, counter) in &plan.rows {
                let check = match counter {
                    Some(c) => layout::BeatCheck::AbsentOrEquals(*c),
                    None => layout::BeatCheck::AbsentOrAtMost(u64::MAX),
                };
                remove_beat_if(leases, worker, check);
            }
            let mut dual = self.dual();
            dual.saw_roster(false);
            Ok(true)
        })
    }
}
