//! One memory budget for every un-acked record of a worker, shared among its shards.
//!
//! Each shard reader holds records in memory from the moment a read brings them until
//! the checkpoint watermark passes them. With a window per shard, a worker's memory
//! grows with the leases it holds; the [`Pool`] bounds the sum instead.
//!
//! The rule ([`Pool::grant`]), for a budget `B` and `n` shards holding a slot:
//!
//! * **Share.** Every shard is guaranteed `g = B / n`: what it holds below `g` is its
//!   own, and what a wanting shard lacks of `g` is *owed* to it, so no other shard may
//!   take it. A busy shard cannot starve the others.
//! * **Loans.** What nobody holds and nobody is owed is *free*. A shard below its share
//!   may take its headroom plus `free / wanting` on top (a loan), so the shares of idle
//!   shards are not wasted. A shard at or above its share takes nothing: it waits for
//!   its own acks.
//! * **Borrowing cannot starve a share.** A loan is only made below the share, so a
//!   borrower holds at most `g` plus its last loan, and the loan came from bytes nobody
//!   was owed then. If a shard starts wanting while borrowers hold its share, it gets
//!   the room their acks free, and they get no new loan while anything is owed
//!   (`free` counts owed bytes out). So a shard is held below its share at most until
//!   each borrower acks the batch its loan brought — or, for a stalled borrower, until
//!   `processor_timeout` fails it and its slot is released.
//! * **A slow processor holds only its share** (plus that last loan): its shard stops
//!   at `g`, and the rest of the budget keeps flowing to the others.
//!
//! A grant is *reserved* at once, so readers asking at the same time share the room
//! instead of each being told all of it; the reader then [`Pool::settle`]s what it
//! really holds. A read may bring more than its grant (the reader asks for records by
//! an estimate of their size, and a shard with nothing in flight may always read one
//! batch, else it could wait forever): the excess is bounded by the reader, not here.
//!
//! Pure: no I/O, no clock. [`WorkerBudget`] shares one pool among the readers of a
//! worker behind a mutex; [`BudgetSlot`] is one reader's place in it, released when
//! dropped, so every way a reader ends returns its bytes.

use std::sync::{Arc, Mutex, PoisonError};

/// One shard's place in the pool.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Slot {
    live: bool,
    /// Bytes of records in memory (read and not yet passed by the watermark).
    held: u64,
    /// Bytes granted and not yet settled (a read on its way).
    reserved: u64,
    /// The shard's last read brought records: it has a backlog and wants more.
    wants: bool,
}

impl Slot {
    fn charge(&self) -> u64 {
        self.held + self.reserved
    }
}

/// Names a slot of a [`Pool`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SlotId(usize);

/// The whole worker's budget, as a snapshot for status and metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BudgetUse {
    /// The whole budget in bytes (`reader.worker_budget_bytes`).
    pub total: u64,
    /// Bytes held and reserved by every shard.
    pub in_use: u64,
    /// What each shard is guaranteed now: `total / shards`.
    pub share: u64,
    /// Shard readers holding a slot now.
    pub shards: usize,
    /// The most ever in use at once (held and reserved).
    pub peak: u64,
}

/// The budget and every shard's part of it.
#[derive(Debug, Clone, Default)]
pub struct Pool {
    total: u64,
    slots: Vec<Slot>,
    free_slots: Vec<usize>,
    live: usize,
    /// Held and reserved by every live slot, kept as slots change.
    in_use: u64,
    peak: u64,
}

impl Pool {
    /// A pool of `total` bytes with no shard in it yet.
    pub fn new(total: u64) -> Self {
        Self {
            total,
            ..Self::default()
        }
    }

    /// A new shard: holds nothing, wants nothing yet. The shares of all shrink.
    pub fn join(&mut self) -> SlotId {
        self.live += 1;
        let slot = Slot {
            live: true,
            ..Slot::default()
        };
        match self.free_slots.pop() {
            Some(at) => {
                self.slots[at] = slot;
                SlotId(at)
            }
            None => {
                self.slots.push(slot);
                SlotId(self.slots.len() - 1)
            }
        }
    }

    /// The shard is gone: everything it held or reserved is returned. Idempotent.
    pub fn leave(&mut self, id: SlotId) {
        if let Some(slot) = self.slots.get_mut(id.0)
            && slot.live
        {
            self.in_use -= slot.charge();
            *slot = Slot::default();
            self.live -= 1;
            self.free_slots.push(id.0);
        }
    }

    /// What the shard holds in memory now, and whether it wants more; ends any
    /// reservation (the read it was for has answered or was given up).
    pub fn settle(&mut self, id: SlotId, held: u64, wants: bool) {
        if let Some(slot) = self.slots.get_mut(id.0).filter(|s| s.live) {
            self.in_use = self.in_use - slot.charge() + held;
            slot.held = held;
            slot.reserved = 0;
            slot.wants = wants;
            self.peak = self.peak.max(self.in_use);
        }
    }

    /// What the shard may take now (it asks, so it counts as wanting), reserved until
    /// its next [`Pool::settle`]. Zero: wait for acks.
    pub fn grant(&mut self, id: SlotId) -> u64 {
        let granted = self.allowance(id);
        if let Some(slot) = self.slots.get_mut(id.0).filter(|s| s.live) {
            slot.reserved += granted;
            slot.wants = true;
            self.in_use += granted;
            self.peak = self.peak.max(self.in_use);
        }
        granted
    }

    /// What [`Pool::grant`] would give now, without reserving it (for a read that
    /// cannot be limited, as a fan-out event: reserving for a pull that may wait
    /// minutes on a quiet shard would keep the room from the shards that are busy).
    pub fn allowance(&self, id: SlotId) -> u64 {
        let Some(me) = self.slots.get(id.0).filter(|s| s.live) else {
            return 0;
        };
        let share = self.share();
        let mine = me.charge();
        if mine >= share {
            return 0;
        }
        let mut used = 0u64;
        let mut owed_to_others = 0u64;
        let mut wanting = 1u64;
        for (at, slot) in self.slots.iter().enumerate() {
            if !slot.live {
                continue;
            }
            used += slot.charge();
            if at != id.0 && slot.wants {
                wanting += 1;
                owed_to_others += share.saturating_sub(slot.charge());
            }
        }
        let room = self.total.saturating_sub(used);
        let headroom = share - mine;
        let own = headroom.min(room);
        let free = room.saturating_sub(owed_to_others).saturating_sub(headroom);
        own + free / wanting
    }

    /// What each shard is guaranteed: the budget over the shards.
    pub fn share(&self) -> u64 {
        self.total / self.live.max(1) as u64
    }

    /// The budget's use now, for status and metrics.
    pub fn usage(&self) -> BudgetUse {
        BudgetUse {
            total: self.total,
            in_use: self.in_use,
            share: self.share(),
            shards: self.live,
            peak: self.peak,
        }
    }
}

/// The worker's pool, shared by its shard readers. Cheap to clone.
#[derive(Debug, Clone)]
pub struct WorkerBudget(Arc<Mutex<Pool>>);

impl WorkerBudget {
    /// A budget of `total` bytes for the worker's readers to share.
    pub fn new(total: u64) -> Self {
        Self(Arc::new(Mutex::new(Pool::new(total))))
    }

    /// A place in the pool for one reader, released when the slot is dropped.
    pub fn join(&self) -> BudgetSlot {
        let id = self.with(Pool::join);
        BudgetSlot {
            budget: self.clone(),
            id,
        }
    }

    /// The budget's use now, for status and metrics.
    pub fn usage(&self) -> BudgetUse {
        self.with(|pool| pool.usage())
    }

    /// Every step is a few arithmetic operations per shard, never an await: a poisoned
    /// lock (a panic inside one) left the pool consistent, so it is used as it is.
    fn with<R>(&self, f: impl FnOnce(&mut Pool) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// One reader's place in the [`WorkerBudget`]. Dropping it (the reader's state is
/// dropped on every way an actor ends: stop, failure, panic) returns its bytes.
#[derive(Debug)]
pub struct BudgetSlot {
    budget: WorkerBudget,
    id: SlotId,
}

impl BudgetSlot {
    /// See [`Pool::grant`].
    pub fn grant(&self) -> u64 {
        self.budget.with(|pool| pool.grant(self.id))
    }

    /// See [`Pool::allowance`].
    pub fn allowance(&self) -> u64 {
        self.budget.with(|pool| pool.allowance(self.id))
    }

    /// See [`Pool::settle`].
    pub fn settle(&self, held: u64, wants: bool) {
        self.budget.with(|pool| pool.settle(self.id, held, wants));
    }

    /// What this shard is guaranteed now.
    pub fn share(&self) -> u64 {
        self.budget.with(|pool| pool.share())
    }

    /// The whole worker's budget use now (not this shard's alone).
    pub fn usage(&self) -> BudgetUse {
        self.budget.usage()
    }
}

impl Drop for BudgetSlot {
    fn drop(&mut self) {
        let id = self.id;
        self.budget.with(|pool| pool.leave(id));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[derive(Debug, Clone, Copy)]
    enum Step {
        /// A shard joins (slots are numbered in joining order).
        Join,
        Leave(usize),
        /// Settle: the shard holds this much and does (or does not) want more.
        Settle(usize, u64, bool),
        /// The shard asks: expect this grant.
        Grant(usize, u64),
    }
    use Step::{Grant, Join, Leave, Settle};

    fn run(name: &str, total: u64, steps: &[Step]) {
        let mut pool = Pool::new(total);
        let mut ids = Vec::new();
        for (n, step) in steps.iter().enumerate() {
            match *step {
                Join => ids.push(pool.join()),
                Leave(i) => pool.leave(ids[i]),
                Settle(i, held, wants) => pool.settle(ids[i], held, wants),
                Grant(i, want) => {
                    assert_eq!(pool.grant(ids[i]), want, "{name}, step {n} {step:?}");
                }
            }
        }
    }

    #[test]
    fn scenarios() {
        let table: &[(&str, u64, &[Step])] = &[
            (
                "alone, a shard may take the whole budget",
                1000,
                &[Join, Grant(0, 1000)],
            ),
            (
                "a grant is reserved: asking again before settling gets nothing more",
                1000,
                &[Join, Grant(0, 1000), Grant(0, 0)],
            ),
            (
                "idle shares are lent: one busy shard of four takes its share and all free",
                1000,
                &[Join, Join, Join, Join, Grant(0, 1000)],
            ),
            (
                "two askers at once split the free bytes instead of each being told all",
                1000,
                // 0 gets its 250 and half of the 500 nobody is owed (1 wants too); then 1
                // gets its 250 and half of the 250 left free after 0's reservation.
                &[
                    Join,
                    Join,
                    Join,
                    Join,
                    Settle(1, 0, true),
                    Grant(0, 500),
                    Grant(1, 375),
                ],
            ),
            (
                "a wanting shard's share is owed: a borrower cannot take it",
                1000,
                &[
                    Join,
                    Join,
                    Settle(1, 100, true),
                    // 0: its 500; free = 1000 - 100 - 400 owed to 1 - 500 = 0.
                    Grant(0, 500),
                    Grant(1, 400),
                ],
            ),
            (
                "at or above its share a shard takes nothing, even with room free",
                1000,
                &[
                    Join,
                    Join,
                    Settle(0, 500, true),
                    Grant(0, 0),
                    Settle(0, 499, true),
                    Grant(0, 501),
                ],
            ),
            (
                "a stalled shard holding its share blocks only itself",
                1000,
                &[
                    Join,
                    Join,
                    Join,
                    Join,
                    Settle(0, 250, true),
                    Grant(0, 0),
                    // The others still get their share and loans from the free rest
                    // (split among the wanting, the stalled one counted: conservative)…
                    Grant(1, 500),
                    Settle(1, 500, true),
                    // …and a third still gets its whole share.
                    Grant(2, 250),
                ],
            ),
            (
                "a borrower over the share: the newcomer gets what the borrower's ack frees",
                1000,
                &[
                    Join,
                    Join,
                    // 0 borrowed 1's idle share and holds it all.
                    Settle(0, 1000, true),
                    // 1 has a backlog now: nothing is free, it waits.
                    Settle(1, 0, true),
                    Grant(1, 0),
                    Settle(1, 0, true),
                    // 0 acks the batch its loan brought: 1 is owed 500 and gets all of
                    // it; 0 (at its share) gets nothing back.
                    Settle(0, 500, true),
                    Grant(0, 0),
                    Grant(1, 500),
                ],
            ),
            (
                "below its share again, a borrower gets only its headroom while others are owed",
                1000,
                &[
                    Join,
                    Join,
                    Settle(0, 100, true),
                    Settle(1, 300, true),
                    // 0's headroom 400, owed to 1: 200, free = 600 - 200 - 400 = 0.
                    Grant(0, 400),
                ],
            ),
            (
                "a shard leaving returns its bytes and enlarges the shares",
                1000,
                &[
                    Join,
                    Join,
                    Settle(0, 500, true),
                    Settle(1, 500, true),
                    Grant(1, 0),
                    Leave(0),
                    Grant(1, 500),
                ],
            ),
            (
                "a slot is reused after a leave, empty",
                1000,
                &[Join, Settle(0, 900, true), Leave(0), Join, Grant(1, 1000)],
            ),
            (
                "not wanting: the share is lendable, what is held stays",
                900,
                &[
                    Join,
                    Join,
                    Join,
                    Settle(1, 100, false),
                    Settle(2, 0, false),
                    Grant(0, 800),
                ],
            ),
        ];
        for (name, total, steps) in table {
            run(name, *total, steps);
        }
    }

    #[test]
    fn usage_counts_held_and_reserved() {
        let mut pool = Pool::new(1000);
        let a = pool.join();
        let b = pool.join();
        pool.settle(a, 120, true);
        let granted = pool.grant(b);
        assert_eq!(
            pool.usage(),
            BudgetUse {
                total: 1000,
                in_use: 120 + granted,
                share: 500,
                shards: 2,
                peak: 120 + granted,
            }
        );
        pool.leave(a);
        pool.leave(a);
        assert_eq!(pool.usage().shards, 1);
        assert_eq!(pool.usage().in_use, granted);
    }

    #[test]
    fn a_dropped_slot_returns_its_bytes() {
        let budget = WorkerBudget::new(1000);
        let a = budget.join();
        let b = budget.join();
        a.settle(400, true);
        // 100 of the 600 left is owed to `a`, below its share and wanting.
        assert_eq!(b.grant(), 500);
        drop(b);
        assert_eq!(budget.usage().in_use, 400);
        drop(a);
        assert_eq!(
            budget.usage(),
            BudgetUse {
                total: 1000,
                in_use: 0,
                share: 1000,
                shards: 0,
                peak: 900,
            }
        );
    }

    #[derive(Debug, Clone)]
    enum Op {
        Join,
        Leave(usize),
        /// Shard asks, then its read brings this fraction (per mille) of the grant.
        Read(usize, u64),
        /// Shard acks this fraction (per mille) of what it holds.
        Ack(usize, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            1 => Just(Op::Join),
            1 => (0..64usize).prop_map(Op::Leave),
            6 => (0..64usize, 0..=1000u64).prop_map(|(s, f)| Op::Read(s, f)),
            4 => (0..64usize, 0..=1000u64).prop_map(|(s, f)| Op::Ack(s, f)),
        ]
    }

    proptest! {
        /// Reads that bring at most their grant never take the pool past its budget,
        /// and a shard below its share that asks while nothing is owed to others
        /// always gets at least its headroom, when the budget has that room.
        #[test]
        fn grants_never_overcommit(total in 1u64..1_000_000, ops in prop::collection::vec(op(), 1..300)) {
            let mut pool = Pool::new(total);
            let mut shards: Vec<(SlotId, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Join => shards.push((pool.join(), 0)),
                    Op::Leave(i) if !shards.is_empty() => {
                        let (id, _) = shards.swap_remove(i % shards.len());
                        pool.leave(id);
                    }
                    Op::Read(i, f) if !shards.is_empty() => {
                        let at = i % shards.len();
                        let (id, held) = shards[at];
                        let room = total - pool.usage().in_use;
                        let share = pool.share();
                        let granted = pool.grant(id);
                        prop_assert!(granted <= room, "granted {granted} with {room} free");
                        if held < share {
                            // Its headroom, as far as the budget has room: always.
                            prop_assert!(granted >= (share - held).min(room));
                        }
                        let got = granted * f / 1000;
                        shards[at].1 = held + got;
                        pool.settle(id, held + got, got > 0);
                    }
                    Op::Ack(i, f) if !shards.is_empty() => {
                        let at = i % shards.len();
                        let (id, held) = shards[at];
                        let left = held - held * f / 1000;
                        shards[at].1 = left;
                        pool.settle(id, left, true);
                    }
                    _ => {}
                }
                let in_use = pool.usage().in_use;
                prop_assert!(in_use <= total, "{in_use} in use of {total}");
                prop_assert!(pool.usage().peak <= total);
                let summed: u64 = pool.slots.iter().filter(|s| s.live).map(Slot::charge).sum();
                prop_assert_eq!(in_use, summed);
                prop_assert_eq!(in_use, shards.iter().map(|(_, h)| h).sum::<u64>());
            }
        }
    }
}
