//! Deliberate protocol bugs ("mutants"), switched on one at a time by the fault
//! simulator to check that it still finds what it is for (`tests/simulation.rs`).
//!
//! Compiled in only with the `mutants` feature (which `scripts/test.sh` turns on);
//! without it `active` is a constant `false` and every mutated branch is dead code
//! the compiler removes. Each site that reads a mutant names it in a comment, so
//! `grep -n 'mutants::active'` lists every place the protocol is broken on purpose.

use std::fmt;

/// One deliberate bug. The simulator's mutation table names, for each, the fault that
/// should expose it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mutant {
    /// The first heartbeat confirmed after a gap lifts the fence at once (the
    /// hardening issue's fix reverted): `fencing::Board::heartbeat_confirmed`.
    LiftFenceAfterGap,
    /// A take succeeds whatever the row's counter is now (the condition on the
    /// counter dropped): the memory lease table's `take`.
    TakeWithoutCounterCheck,
    /// A batch is acked (and so checkpointed) before the processor is handed it:
    /// the processor host.
    CheckpointBeforeProcessed,
    /// A merged child's lease row names only its first parent, so neither the
    /// balance nor the reader waits for the second: `model::lease_plan::lease_for`.
    ForgetMergeSecondParent,
    /// Releasing a lease leaves its counter as it was: the memory lease table's
    /// `release`. Equivalent in this protocol (no run can tell it apart): every
    /// conditional write names the owner as well as the counter, and every take and
    /// transfer bumps the counter, so the released row `(nobody, n)` matches no fence any
    /// worker holds, and no `(owner, counter)` pair is ever written twice. The mutation
    /// table runs it to confirm that the simulator raises no false alarm.
    ReleaseWithoutCounterBump,
}

// Without `testing` only the crate's `active` reads this: the table and the parser are
// the simulator's (`examples/simulate.rs`).
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
impl Mutant {
    /// Every mutant, in the order the simulator's mutation table runs them.
    pub const ALL: [Mutant; 5] = [
        Mutant::LiftFenceAfterGap,
        Mutant::TakeWithoutCounterCheck,
        Mutant::CheckpointBeforeProcessed,
        Mutant::ForgetMergeSecondParent,
        Mutant::ReleaseWithoutCounterBump,
    ];

    /// The name used on the command line (`--mutant lift-fence-after-gap`).
    pub fn name(self) -> &'static str {
        match self {
            Mutant::LiftFenceAfterGap => "lift-fence-after-gap",
            Mutant::TakeWithoutCounterCheck => "take-without-counter-check",
            Mutant::CheckpointBeforeProcessed => "checkpoint-before-processed",
            Mutant::ForgetMergeSecondParent => "forget-merge-second-parent",
            Mutant::ReleaseWithoutCounterBump => "release-without-counter-bump",
        }
    }

    /// Why no run can tell this mutant from the real protocol, if that is so: the
    /// simulator must then *not* catch it (a catch would be a false alarm, or a hole in
    /// the argument).
    pub fn equivalent(self) -> Option<&'static str> {
        match self {
            Mutant::ReleaseWithoutCounterBump => Some(
                "every conditional write names the owner as well as the counter, and takes \
                 and transfers bump the counter, so a released row matches no fence anyone \
                 holds and no (owner, counter) pair is ever written twice",
            ),
            _ => None,
        }
    }

    /// The mutant of a command-line [`name`](Self::name); `None` for a name of none.
    pub fn parse(name: &str) -> Option<Mutant> {
        Mutant::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl fmt::Display for Mutant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(feature = "mutants")]
mod switch {
    use super::Mutant;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// 0: none; otherwise the index in `Mutant::ALL` plus one.
    static ACTIVE: AtomicU8 = AtomicU8::new(0);

    #[cfg_attr(not(feature = "testing"), allow(dead_code))]
    pub fn set(mutant: Option<Mutant>) {
        let value = match mutant {
            None => 0,
            Some(m) => Mutant::ALL
                .iter()
                .position(|x| *x == m)
                .map_or(0, |i| i as u8 + 1),
        };
        ACTIVE.store(value, Ordering::SeqCst);
    }

    pub fn active(mutant: Mutant) -> bool {
        let value = ACTIVE.load(Ordering::Relaxed);
        value != 0 && Mutant::ALL.get(usize::from(value - 1)) == Some(&mutant)
    }
}

/// Switches a mutant on for the whole process (`None`: the real protocol). Only the
/// simulator calls this, one mutant at a time, with no other test in the process.
#[cfg(feature = "mutants")]
#[cfg_attr(not(feature = "testing"), allow(dead_code))]
pub fn set(mutant: Option<Mutant>) {
    switch::set(mutant);
}

/// Whether this deliberate bug is switched on.
#[cfg(feature = "mutants")]
#[inline]
pub(crate) fn active(mutant: Mutant) -> bool {
    switch::active(mutant)
}

#[cfg(not(feature = "mutants"))]
#[inline(always)]
pub(crate) const fn active(_mutant: Mutant) -> bool {
    false
}
