//! The call hook: each call of the two lease-table ports as a typed value ([`Call`]),
//! and decorators of those ports written once over it ([`Hook`]).
//!
//! A decorator that treats the calls alike (the fault injector, `lease.java_compat`'s
//! renewal wrapper, a test's row watcher) used to re-type every method of both ports
//! just to pass most of them on, so a new method cost a site in each. Now a decorator
//! implements [`Hook`]: one generic [`Hook::around`] that gets each call as a [`Call`]
//! and sends it on to the table it wraps, and the one generic impl of [`LeaseTable`] and
//! [`WorkerRows`] below builds each call for it. What a hook needs to know of a call
//! beyond sending it, it asks the call, never the method's name: its [`Op`], the fence
//! of a fenced write and what the write does to the holder ([`Fenced`]), what a read
//! cost ([`ReadCost`]), the lease rows in an answer ([`Rows`]), what a write did to its
//! row ([`Landed`]).
//!
//! A new method of a port costs its trait method, its call (a struct in `calls` or
//! `worker_calls`, and an [`Op`]) and its line below, besides each adapter; a hook
//! changes only if it treats the new call apart.
//!
//! Why a trait on the decorator rather than a `Hooked<H, B>` wrapper type: the fault
//! injector is one type over every port (`Faulty<B>` is the stream and metrics client
//! too), and the renewal wrapper's own task calls the table it wraps directly; each keeps
//! its type and names what it wraps with [`Hook::inner`].
//!
//! * this file: the hook, what a call tells it, and the generic impl of both ports.
//! * `calls`, `worker_calls`: one struct per method of [`LeaseTable`] and of
//!   [`WorkerRows`], each saying how it is sent and what it tells.

mod calls;
mod worker_calls;

use futures::future::BoxFuture;

use super::layout::Retirement;
use super::{
    HeartbeatDetail, HeartbeatsOutput, LeaseError, LeaseTable, ScanOutput, TableState, WorkerRows,
};
use crate::model::item::ReadUnits;
use crate::model::{
    Checkpoint, ExtendedSequenceNumber, Fence, Lease, LeaseKey, ShardId, WorkerId, WorkerLoad,
};

/// Which method a call is, one variant per async method of [`LeaseTable`] and
/// [`WorkerRows`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// [`LeaseTable::ensure_table`].
    EnsureTable,
    /// [`LeaseTable::scan`].
    Scan,
    /// [`LeaseTable::get`].
    Get,
    /// [`LeaseTable::create_if_absent`].
    CreateIfAbsent,
    /// [`LeaseTable::take`].
    Take,
    /// [`LeaseTable::take_expired`].
    TakeExpired,
    /// [`LeaseTable::release`].
    Release,
    /// [`LeaseTable::renew`].
    Renew,
    /// [`LeaseTable::checkpoint`].
    Checkpoint,
    /// [`LeaseTable::prepare_checkpoint`].
    PrepareCheckpoint,
    /// [`LeaseTable::delete`].
    Delete,
    /// [`LeaseTable::request_handoff`].
    RequestHandoff,
    /// [`LeaseTable::transfer`].
    Transfer,
    /// [`LeaseTable::clear_handoff`].
    ClearHandoff,
    /// [`LeaseTable::stamp_source`].
    StampSource,
    /// [`WorkerRows::heartbeat`].
    Heartbeat,
    /// [`WorkerRows::remove_heartbeat`].
    RemoveHeartbeat,
    /// [`WorkerRows::join_roster`].
    JoinRoster,
    /// [`WorkerRows::heartbeats`].
    Heartbeats,
    /// [`WorkerRows::remove_dead_heartbeat`].
    RemoveDeadHeartbeat,
    /// [`WorkerRows::retire_legacy`].
    RetireLegacy,
}

impl Op {
    /// The method's name (`"take_expired"`), for logs and counts.
    pub fn name(self) -> &'static str {
        match self {
            Op::EnsureTable => "ensure_table",
            Op::Scan => "scan",
            Op::Get => "get",
            Op::CreateIfAbsent => "create_if_absent",
            Op::Take => "take",
            Op::TakeExpired => "take_expired",
            Op::Release => "release",
            Op::Renew => "renew",
            Op::Checkpoint => "checkpoint",
            Op::PrepareCheckpoint => "prepare_checkpoint",
            Op::Delete => "delete",
            Op::RequestHandoff => "request_handoff",
            Op::Transfer => "transfer",
            Op::ClearHandoff => "clear_handoff",
            Op::StampSource => "stamp_source",
            Op::Heartbeat => "heartbeat",
            Op::RemoveHeartbeat => "remove_heartbeat",
            Op::JoinRoster => "join_roster",
            Op::Heartbeats => "heartbeats",
            Op::RemoveDeadHeartbeat => "remove_dead_heartbeat",
            Op::RetireLegacy => "retire_legacy",
        }
    }
}

/// What a fenced write does to the lease's holder once it lands (the contract on
/// [`LeaseTable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// Owner and counter unchanged: `checkpoint`, `prepare_checkpoint`,
    /// `request_handoff`.
    Keeps,
    /// The counter moves to another owner or to none, or the row goes: `take`,
    /// `take_expired`, `release`, `transfer`, `delete`.
    Ends,
    /// The counter moves and the owner stays: `renew`.
    Renews,
}

/// A fenced write's condition: the lease, the fence the caller sent it under, and what
/// it does to the holder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fenced<'a> {
    /// The lease row written.
    pub key: &'a LeaseKey,
    /// The owner and counter the row must still have.
    pub fence: &'a Fence,
    /// What the write does to the holder once it lands.
    pub effect: Effect,
}

impl<'a> Fenced<'a> {
    /// The condition of a write to `key` under `fence` that does `effect`.
    pub fn new(key: &'a LeaseKey, fence: &'a Fence, effect: Effect) -> Self {
        Fenced { key, fence, effect }
    }
}

/// What a successful read cost, as its answer reports it: what the read cost of the
/// lease table is counted in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadCost {
    /// Items read: rows a scan returned, the roster and heartbeat rows a `heartbeats`
    /// asked for, one per `get`.
    pub items: usize,
    /// The read units the answer says it was billed; `None` when it does not say
    /// (`get`).
    pub units: Option<ReadUnits>,
    /// Read through the heartbeat index (`HeartbeatsOutput::summary`).
    pub summary: bool,
}

/// The lease rows in a successful answer, for a hook that shows them otherwise.
#[derive(Debug, PartialEq)]
pub enum Rows<'o> {
    /// The answer holds no lease row.
    None,
    /// Rows as read (`scan`, `get`).
    Read(&'o mut [Lease]),
    /// The row as a take wrote it (`take`, `take_expired`).
    Taken(&'o mut Lease),
}

/// What a successful write did to its lease row, for a hook that follows the rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Landed<'o> {
    /// The row's owner and counter after the write.
    Row {
        /// The owner now; `None`: unowned.
        owner: Option<&'o WorkerId>,
        /// The counter now.
        counter: u64,
    },
    /// The row is gone.
    Deleted,
}

/// One call of [`LeaseTable`] or [`WorkerRows`], its arguments borrowed for `'a`.
///
/// Only the generic impls below build calls; a [`Hook`] receives them.
pub trait Call<'a>: Send + Sync + 'a {
    /// What the call returns on success.
    type Out: Send + 'static;

    /// Which method this is.
    const OP: Op;

    /// Sends the call to `table`. A fenced write (one whose [`Call::fenced`] is `Some`)
    /// goes out conditional on `fence` when given, in place of its own; every other call
    /// has no fence to replace and ignores it. The one place a call names its method.
    fn send_under<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: Option<&'s Fence>,
    ) -> BoxFuture<'s, Result<Self::Out, LeaseError>>;

    /// Sends the call to `table`, as its arguments say.
    fn send<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
    ) -> BoxFuture<'s, Result<Self::Out, LeaseError>> {
        self.send_under(table, None)
    }

    /// Sends the call to `table` conditional on `fence` in place of its own: for a
    /// fenced write; any other call is sent as [`Call::send`] sends it.
    fn send_fenced<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: &'s Fence,
    ) -> BoxFuture<'s, Result<Self::Out, LeaseError>> {
        self.send_under(table, Some(fence))
    }

    /// The condition of a fenced write; `None` for every other call.
    fn fenced(&self) -> Option<Fenced<'a>> {
        None
    }

    /// What a successful read cost; `None` for a call that is not a read of rows.
    fn read_cost(out: &Self::Out) -> Option<ReadCost> {
        let _ = out;
        None
    }

    /// The lease rows in a successful answer.
    fn rows(out: &mut Self::Out) -> Rows<'_> {
        let _ = out;
        Rows::None
    }

    /// What a successful write did to its lease row; `None` for a call that leaves the
    /// owner and counter as they were (or writes no lease row).
    fn landed<'s>(&'s self, out: &'s Self::Out) -> Option<Landed<'s>> {
        let _ = out;
        None
    }
}

/// A decorator of the lease-table ports, written once: every call of both ports goes
/// through [`Hook::around`], and a hook is a [`LeaseTable`] and a [`WorkerRows`] by the
/// impls below.
pub trait Hook: Send + Sync + 'static {
    /// The table the hook wraps.
    type Inner: LeaseTable + ?Sized;

    /// The table the hook wraps (where the table names come from).
    fn inner(&self) -> &Self::Inner;

    /// Makes `call`: as a rule by sending it to [`Hook::inner`] (`call.send(inner)`),
    /// with whatever the hook does around that.
    fn around<'a, C: Call<'a>>(&'a self, call: C) -> BoxFuture<'a, Result<C::Out, LeaseError>>;
}

impl<H: Hook> WorkerRows for H {
    fn worker_table_name(&self) -> &str {
        self.inner().worker_table_name()
    }

    fn heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        load: &'a WorkerLoad,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        self.around(worker_calls::Heartbeat { worker, load })
    }

    fn remove_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.around(worker_calls::RemoveHeartbeat { worker })
    }

    fn join_roster<'a>(&'a self, workers: &'a [WorkerId]) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.around(worker_calls::JoinRoster { workers })
    }

    fn heartbeats(
        &self,
        detail: HeartbeatDetail,
    ) -> BoxFuture<'_, Result<HeartbeatsOutput, LeaseError>> {
        self.around(worker_calls::Heartbeats { detail })
    }

    fn remove_dead_heartbeat<'a>(
        &'a self,
        worker: &'a WorkerId,
        counter: u64,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.around(worker_calls::RemoveDeadHeartbeat { worker, counter })
    }

    fn retire_legacy<'a>(
        &'a self,
        plan: &'a Retirement,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.around(worker_calls::RetireLegacy { plan })
    }
}

impl<H: Hook> LeaseTable for H {
    fn table_name(&self) -> &str {
        self.inner().table_name()
    }

    fn ensure_table(&self) -> BoxFuture<'_, Result<TableState, LeaseError>> {
        self.around(calls::EnsureTable)
    }

    fn scan(&self) -> BoxFuture<'_, Result<ScanOutput, LeaseError>> {
        self.around(calls::Scan)
    }

    fn get<'a>(&'a self, key: &'a LeaseKey) -> BoxFuture<'a, Result<Option<Lease>, LeaseError>> {
        self.around(calls::Get { key })
    }

    fn create_if_absent<'a>(&'a self, lease: &'a Lease) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.around(calls::CreateIfAbsent { lease })
    }

    fn take<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        self.around(calls::Take {
            key,
            expected,
            new_owner,
        })
    }

    fn take_expired<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        new_owner: &'a WorkerId,
        owner_heartbeat: Option<u64>,
    ) -> BoxFuture<'a, Result<Lease, LeaseError>> {
        self.around(calls::TakeExpired {
            key,
            expected,
            new_owner,
            owner_heartbeat,
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        self.around(calls::Release { key, expected })
    }

    fn renew<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        self.around(calls::Renew { key, expected })
    }

    fn checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        checkpoint: &'a Checkpoint,
        children: &'a [ShardId],
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.around(calls::Checkpoint {
            key,
            expected,
            checkpoint,
            children,
        })
    }

    fn prepare_checkpoint<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        pending: &'a ExtendedSequenceNumber,
        state: Option<&'a [u8]>,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.around(calls::PrepareCheckpoint {
            key,
            expected,
            pending,
            state,
        })
    }

    fn delete<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.around(calls::Delete { key, expected })
    }

    fn request_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.around(calls::RequestHandoff {
            key,
            expected,
            requester,
        })
    }

    fn transfer<'a>(
        &'a self,
        key: &'a LeaseKey,
        expected: &'a Fence,
        to: &'a WorkerId,
    ) -> BoxFuture<'a, Result<u64, LeaseError>> {
        self.around(calls::Transfer { key, expected, to })
    }

    fn clear_handoff<'a>(
        &'a self,
        key: &'a LeaseKey,
        requester: &'a WorkerId,
    ) -> BoxFuture<'a, Result<(), LeaseError>> {
        self.around(calls::ClearHandoff { key, requester })
    }

    fn stamp_source<'a>(
        &'a self,
        key: &'a LeaseKey,
        source: &'a str,
        created: Option<u64>,
        overwrite: bool,
    ) -> BoxFuture<'a, Result<bool, LeaseError>> {
        self.around(calls::StampSource {
            key,
            source,
            created,
            overwrite,
        })
    }
}

#[allow(clippy::unwrap_used, clippy::expect_used)]
#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::backend::memory::{MemoryDynamo, MemoryLeaseTable};

    /// What a hook saw of one call: before it was sent (its op and fence), and after
    /// (its read cost and what it landed, on success).
    #[derive(Debug, Clone, PartialEq)]
    struct Seen {
        op: Op,
        fenced: Option<(LeaseKey, Fence, Effect)>,
        cost: Option<ReadCost>,
        landed: Option<Option<(Option<WorkerId>, u64)>>,
        rows: Option<(&'static str, usize)>,
    }

    /// A hook that records every call and passes it on unchanged; with `fence` set, a
    /// fenced write goes out under that fence instead of the caller's.
    struct Recording {
        inner: MemoryLeaseTable,
        seen: Mutex<Vec<Seen>>,
        fence: Option<Fence>,
    }

    impl Hook for Recording {
        type Inner = MemoryLeaseTable;

        fn inner(&self) -> &MemoryLeaseTable {
            &self.inner
        }

        fn around<'a, C: Call<'a>>(&'a self, call: C) -> BoxFuture<'a, Result<C::Out, LeaseError>> {
            Box::pin(async move {
                let fenced = call.fenced();
                let result = match (&self.fence, fenced) {
                    (Some(fence), Some(_)) => call.send_fenced(&self.inner, fence).await,
                    _ => call.send(&self.inner).await,
                };
                let mut seen = Seen {
                    op: C::OP,
                    fenced: fenced.map(|f| (f.key.clone(), f.fence.clone(), f.effect)),
                    cost: None,
                    landed: None,
                    rows: None,
                };
                let mut result = result;
                if let Ok(out) = &mut result {
                    seen.cost = C::read_cost(out);
                    seen.landed = call.landed(out).map(|landed| match landed {
                        Landed::Row { owner, counter } => Some((owner.cloned(), counter)),
                        Landed::Deleted => None,
                    });
                    seen.rows = match C::rows(out) {
                        Rows::None => None,
                        Rows::Read(rows) => Some(("read", rows.len())),
                        Rows::Taken(_) => Some(("taken", 1)),
                    };
                }
                self.seen.lock().unwrap().push(seen);
                result
            })
        }
    }

    async fn recording(fence: Option<Fence>) -> (Recording, Lease) {
        let table = Recording {
            inner: MemoryDynamo::new().lease_table("t"),
            seen: Mutex::new(Vec::new()),
            fence,
        };
        table.inner.ensure_table().await.unwrap();
        let lease = Lease::new(
            &ShardId::from_index(0),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        assert!(table.inner.create_if_absent(&lease).await.unwrap());
        (table, lease)
    }

    fn me() -> WorkerId {
        WorkerId::new("me")
    }

    /// Every method of both ports reaches the hook as its own op, in the order called,
    /// with the fence and effect of a fenced write, the cost of a read, the rows of an
    /// answer and what a write landed: the table of what each call tells a hook.
    #[tokio::test(start_paused = true)]
    async fn every_method_reaches_the_hook_as_its_call() {
        let (table, lease) = recording(None).await;
        let key = lease.key.clone();
        let other = WorkerId::new("other");
        let at =
            |n: u128| ExtendedSequenceNumber::new(crate::model::SequenceNumber::from_u128(n), 0);
        table.ensure_table().await.unwrap();
        table.scan().await.unwrap();
        table.get(&key).await.unwrap();
        assert!(!table.create_if_absent(&lease).await.unwrap());
        let taken = table.take(&key, &lease.fence(), &me()).await.unwrap();
        let renewed = table.renew(&key, &taken.fence()).await.unwrap();
        let mut held = taken.fence();
        held.counter = renewed;
        table
            .checkpoint(&key, &held, &Checkpoint::At(at(1)), &[])
            .await
            .unwrap();
        table
            .prepare_checkpoint(&key, &held, &at(2), None)
            .await
            .unwrap();
        table.request_handoff(&key, &held, &other).await.unwrap();
        table.clear_handoff(&key, &other).await.unwrap();
        table.request_handoff(&key, &held, &other).await.unwrap();
        let moved = table.transfer(&key, &held, &other).await.unwrap();
        let theirs = Fence {
            owner: Some(other.clone()),
            counter: moved,
        };
        let taken = table
            .take_expired(&key, &theirs, &me(), None)
            .await
            .unwrap();
        let released = table.release(&key, &taken.fence()).await.unwrap();
        let unowned = Fence {
            owner: None,
            counter: released,
        };
        assert!(table.stamp_source(&key, "s", None, false).await.unwrap());
        table.delete(&key, &unowned).await.unwrap();
        let beat = table
            .heartbeat(&me(), &WorkerLoad::default())
            .await
            .unwrap();
        table.join_roster(&[me()]).await.unwrap();
        table.heartbeats(HeartbeatDetail::Full).await.unwrap();
        assert!(table.remove_dead_heartbeat(&other, 1).await.unwrap());
        table.remove_heartbeat(&me()).await.unwrap();
        table.retire_legacy(&Retirement::default()).await.unwrap();
        assert_eq!(table.table_name(), "t");
        assert_eq!(table.worker_table_name(), table.inner.worker_table_name());
        assert_eq!(beat, 1);

        check(
            &table, &key, &lease, &held, &theirs, &taken, &unowned, &other,
        );
    }

    /// The calls `every_method_reaches_the_hook_as_its_call` made, checked.
    #[allow(clippy::too_many_arguments)]
    fn check(
        table: &Recording,
        key: &LeaseKey,
        lease: &Lease,
        held: &Fence,
        theirs: &Fence,
        taken: &Lease,
        unowned: &Fence,
        other: &WorkerId,
    ) {
        use Op::*;
        let fenced = |fence: &Fence, effect| Some((key.clone(), fence.clone(), effect));
        let row = |owner: Option<&WorkerId>, counter| Some(Some((owner.cloned(), counter)));
        let seen = table.seen.lock().unwrap().clone();
        let ops: Vec<Op> = seen.iter().map(|s| s.op).collect();
        assert_eq!(
            ops,
            [
                EnsureTable,
                Scan,
                Get,
                CreateIfAbsent,
                Take,
                Renew,
                Checkpoint,
                PrepareCheckpoint,
                RequestHandoff,
                ClearHandoff,
                RequestHandoff,
                Transfer,
                TakeExpired,
                Release,
                StampSource,
                Delete,
                Heartbeat,
                JoinRoster,
                Heartbeats,
                RemoveDeadHeartbeat,
                RemoveHeartbeat,
                RetireLegacy,
            ]
        );
        let first = Fence {
            owner: Some(me()),
            counter: 1,
        };
        // (op, its fence and effect, what it landed, the rows in its answer)
        let table_of = [
            (
                Take,
                fenced(&lease.fence(), Effect::Ends),
                row(Some(&me()), 1),
                Some(("taken", 1)),
            ),
            (
                Renew,
                fenced(&first, Effect::Renews),
                row(Some(&me()), 2),
                None,
            ),
            (Checkpoint, fenced(held, Effect::Keeps), None, None),
            (PrepareCheckpoint, fenced(held, Effect::Keeps), None, None),
            (RequestHandoff, fenced(held, Effect::Keeps), None, None),
            (ClearHandoff, None, None, None),
            (
                Transfer,
                fenced(held, Effect::Ends),
                row(Some(other), 3),
                None,
            ),
            (
                TakeExpired,
                fenced(theirs, Effect::Ends),
                row(Some(&me()), 4),
                Some(("taken", 1)),
            ),
            (
                Release,
                fenced(&taken.fence(), Effect::Ends),
                row(None, 5),
                None,
            ),
            (StampSource, None, None, None),
            (Delete, fenced(unowned, Effect::Ends), Some(None), None),
            (Heartbeat, None, None, None),
        ];
        for (op, fence, landed, rows) in table_of {
            let s = seen.iter().find(|s| s.op == op).unwrap();
            assert_eq!(
                (&s.fenced, &s.landed, s.rows),
                (&fence, &landed, rows),
                "{op:?}"
            );
        }
        // Reads tell their cost (and a scan and a get their rows); nothing else does.
        let scan = &seen[1];
        assert_eq!(scan.rows, Some(("read", 1)));
        assert_eq!(scan.cost.map(|c| (c.items, c.summary)), Some((1, false)));
        assert!(scan.cost.unwrap().units.is_some());
        let get = &seen[2];
        assert_eq!(
            get.cost,
            Some(ReadCost {
                items: 1,
                units: None,
                summary: false
            })
        );
        assert_eq!(get.rows, Some(("read", 1)));
        let heartbeats = seen.iter().find(|s| s.op == Heartbeats).unwrap();
        let cost = heartbeats.cost.unwrap();
        assert!(cost.items >= 2 && !cost.summary, "{cost:?}");
        let costed: Vec<Op> = seen
            .iter()
            .filter(|s| s.cost.is_some())
            .map(|s| s.op)
            .collect();
        assert_eq!(costed, [Scan, Get, Heartbeats]);
    }

    /// A hook that sends a fenced write under a fence of its own is obeyed: the row is
    /// written under that fence, not the caller's.
    #[tokio::test(start_paused = true)]
    async fn a_fenced_write_goes_out_under_the_hooks_fence() {
        let (table, lease) = recording(None).await;
        let taken = table.take(&lease.key, &lease.fence(), &me()).await.unwrap();
        // The row moves on behind the caller's back (as a renewal moves it).
        let now = table.inner.renew(&lease.key, &taken.fence()).await.unwrap();
        let stale = taken.fence();
        let refused = table
            .checkpoint(&lease.key, &stale, &Checkpoint::TrimHorizon, &[])
            .await;
        assert!(
            matches!(refused, Err(LeaseError::ConditionFailed { .. })),
            "{refused:?}"
        );

        let current = Fence {
            owner: Some(me()),
            counter: now,
        };
        let rewriting = Recording {
            inner: table.inner.clone(),
            seen: Mutex::new(Vec::new()),
            fence: Some(current),
        };
        rewriting
            .checkpoint(&lease.key, &stale, &Checkpoint::TrimHorizon, &[])
            .await
            .expect("sent under the hook's fence");
        // What the hook was told is still the caller's fence.
        let seen = rewriting.seen.lock().unwrap();
        assert_eq!(seen[0].fenced.as_ref().map(|f| &f.1), Some(&stale));
    }
}
