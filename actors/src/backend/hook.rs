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

    /// Sends the call to `table`, as its arguments say.
    fn send<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
    ) -> BoxFuture<'s, Result<Self::Out, LeaseError>>;

    /// Sends the call to `table` conditional on `fence` in place of its own: for a
    /// fenced write (one whose [`Call::fenced`] is `Some`); any other call is sent as
    /// [`Call::send`] sends it.
    fn send_fenced<'s, T: LeaseTable + ?Sized>(
        &'s self,
        table: &'s T,
        fence: &'s Fence,
    ) -> BoxFuture<'s, Result<Self::Out, LeaseError>> {
        let _ = fence;
        self.send(table)
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
