//! The lives of the leases this worker took: per lease, the counter it was taken with
//! (the fence everyone above holds) and the row's current counter, and what a read of an
//! unsure lease's row says. Pure: no I/O, no clock; [`super::Renewing`] holds it under a
//! lock and does the calls.

use std::collections::BTreeMap;

use tokio::time::Instant;

use crate::backend::LeaseError;
use crate::model::{Fence, Lease, LeaseKey, WorkerId};

/// One held lease's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Life {
    /// The counter the lease was taken with: the fence everyone above holds.
    taken: u64,
    /// The row's counter as of the last confirmed write.
    current: u64,
    /// A renewal sent at this time whose answer was lost: the row may be at
    /// `current + 1`.
    unsure: Option<Instant>,
}

/// What a read of an unsure lease's row says about the renewal whose answer was lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Resolution {
    /// It landed (sent at this time): the row is at `current + 1`.
    Landed(Instant),
    /// It did not land: the row is at `current`.
    NotLanded,
    /// The row is another owner's, at another counter, or gone.
    Lost,
}

/// The lives of the leases this worker took, by lease key. Pure: no I/O, no clock.
#[derive(Debug, Clone)]
pub(crate) struct Lives {
    me: WorkerId,
    lives: BTreeMap<LeaseKey, Life>,
}

impl Lives {
    pub fn new(me: WorkerId) -> Self {
        Self {
            me,
            lives: BTreeMap::new(),
        }
    }

    /// The worker whose lives these are.
    pub fn me(&self) -> &WorkerId {
        &self.me
    }

    /// The fence to send for a write the caller fenced with `fence`: the current
    /// counter when `fence` is this worker's fence of the lease's life, else `fence`
    /// itself (another owner's lease, or an older life, whose write must fail).
    pub fn to_row(&self, key: &LeaseKey, fence: &Fence) -> Fence {
        match self.lives.get(key) {
            Some(life) if fence.owner.as_ref() == Some(&self.me) && fence.counter == life.taken => {
                Fence {
                    owner: fence.owner.clone(),
                    counter: life.current,
                }
            }
            _ => fence.clone(),
        }
    }

    /// The counter to show for a row this worker read: the life's counter when the row
    /// is ours at the current counter (or at the next one while a renewal is unsure),
    /// else the row's own.
    pub fn shown(&self, key: &LeaseKey, owner: Option<&WorkerId>, counter: u64) -> u64 {
        match self.lives.get(key) {
            Some(life)
                if owner == Some(&self.me)
                    && (counter == life.current
                        || (life.unsure.is_some() && counter == life.current + 1)) =>
            {
                life.taken
            }
            _ => counter,
        }
    }

    /// This worker took the lease (any take): a new life at the counter written.
    pub fn took(&mut self, lease: &Lease) {
        if lease.owner.as_ref() == Some(&self.me) {
            self.lives.insert(
                lease.key.clone(),
                Life {
                    taken: lease.counter,
                    current: lease.counter,
                    unsure: None,
                },
            );
        }
    }

    /// The lease left this worker (released, handed over, deleted, lost).
    pub fn forget(&mut self, key: &LeaseKey) {
        self.lives.remove(key);
    }

    /// The leases to renew: every one held.
    pub fn due(&self) -> Vec<LeaseKey> {
        self.lives.keys().cloned().collect()
    }

    /// The life's fence as everyone above holds it.
    pub fn taken_fence(&self, key: &LeaseKey) -> Option<Fence> {
        self.lives.get(key).map(|life| Fence {
            owner: Some(self.me.clone()),
            counter: life.taken,
        })
    }

    /// The fence a renewal is sent under, unless the lease is unsure (read it first).
    pub fn renewal_fence(&self, key: &LeaseKey) -> Option<Fence> {
        self.lives
            .get(key)
            .filter(|life| life.unsure.is_none())
            .map(|life| Fence {
                owner: Some(self.me.clone()),
                counter: life.current,
            })
    }

    pub fn is_unsure(&self, key: &LeaseKey) -> bool {
        self.lives
            .get(key)
            .is_some_and(|life| life.unsure.is_some())
    }

    /// A renewal sent under `sent_at` (the row's counter) was confirmed at `counter`.
    pub fn renewed(&mut self, key: &LeaseKey, sent_at: u64, counter: u64) {
        if let Some(life) = self.lives.get_mut(key)
            && life.current == sent_at
        {
            life.current = counter;
            life.unsure = None;
        }
    }

    /// A renewal sent at `sent` got no answer: it may have landed.
    pub fn unsure(&mut self, key: &LeaseKey, sent: Instant) {
        if let Some(life) = self.lives.get_mut(key) {
            life.unsure = Some(sent);
        }
    }

    /// What a strongly consistent read of an unsure lease's row (`None`: no row) says;
    /// the life is updated (or forgotten, when lost) to match.
    pub fn resolve(&mut self, key: &LeaseKey, row: Option<&Lease>) -> Resolution {
        let Some(life) = self.lives.get_mut(key) else {
            return Resolution::Lost;
        };
        let ours = row.filter(|r| r.owner.as_ref() == Some(&self.me));
        match (ours.map(|r| r.counter), life.unsure) {
            (Some(c), Some(sent)) if c == life.current + 1 => {
                life.current = c;
                life.unsure = None;
                Resolution::Landed(sent)
            }
            (Some(c), _) if c == life.current => {
                life.unsure = None;
                Resolution::NotLanded
            }
            _ => {
                self.lives.remove(key);
                Resolution::Lost
            }
        }
    }

    /// A lease as this worker's callers must see it.
    pub fn show(&self, lease: &mut Lease) {
        lease.counter = self.shown(&lease.key, lease.owner.as_ref(), lease.counter);
    }

    /// An error as this worker's callers must see it (a refusal's counter shown as the
    /// life's while the row is still ours at the current counter).
    pub fn show_error(&self, error: LeaseError) -> LeaseError {
        match error {
            LeaseError::ConditionFailed {
                key,
                owner,
                counter: Some(counter),
            } => {
                let counter = Some(self.shown(&key, owner.as_ref(), counter));
                LeaseError::ConditionFailed {
                    key,
                    owner,
                    counter,
                }
            }
            other => other,
        }
    }
}

#[allow(clippy::unwrap_used, clippy::expect_used)]
#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Checkpoint, ShardId};

    fn me() -> WorkerId {
        WorkerId::new("me")
    }

    fn fence(owner: &str, counter: u64) -> Fence {
        Fence {
            owner: Some(WorkerId::new(owner)),
            counter,
        }
    }

    fn row(owner: Option<&str>, counter: u64) -> Lease {
        let mut lease = Lease::new(
            &ShardId::from_index(0),
            Checkpoint::TrimHorizon,
            vec![],
            None,
        );
        lease.owner = owner.map(WorkerId::new);
        lease.counter = counter;
        lease
    }

    /// The bookkeeping, step by step: what is sent, what is shown.
    #[test]
    fn lives_show_the_taken_counter_and_send_the_current_one() {
        let key = row(None, 0).key;
        let t0 = Instant::now();
        let mut lives = Lives::new(me());
        // Nothing held: everything passes through.
        assert_eq!(lives.to_row(&key, &fence("me", 5)), fence("me", 5));
        assert_eq!(lives.shown(&key, Some(&me()), 7), 7);
        lives.took(&row(Some("me"), 5));
        lives.renewed(&key, 5, 6);
        lives.renewed(&key, 6, 7);
        // Another renewal's answer for an old counter changes nothing.
        lives.renewed(&key, 5, 6);
        let cases: [(&str, Fence, Fence); 3] = [
            (
                "the life's fence goes out at the current counter",
                fence("me", 5),
                fence("me", 7),
            ),
            (
                "an older life's fence goes out as it is, to fail",
                fence("me", 4),
                fence("me", 4),
            ),
            (
                "another owner's fence goes out as it is",
                fence("java", 5),
                fence("java", 5),
            ),
        ];
        for (name, given, sent) in cases {
            assert_eq!(lives.to_row(&key, &given), sent, "{name}");
        }
        let me = me();
        let java = WorkerId::new("java");
        let shown: [(&str, Option<&WorkerId>, u64, u64); 4] = [
            ("ours at the current counter: the life's", Some(&me), 7, 5),
            (
                "ours one past it, no renewal unsure: as it is",
                Some(&me),
                8,
                8,
            ),
            ("another owner's: as it is", Some(&java), 7, 7),
            ("nobody's: as it is", None, 7, 7),
        ];
        for (name, owner, counter, want) in shown {
            assert_eq!(lives.shown(&key, owner, counter), want, "{name}");
        }
        // A renewal whose answer was lost: the row may be at 7 or 8.
        lives.unsure(&key, t0);
        assert_eq!(
            lives.renewal_fence(&key),
            None,
            "unsure: read before renewing"
        );
        assert_eq!(lives.shown(&key, Some(&me), 8), 5);
        assert_eq!(lives.shown(&key, Some(&me), 7), 5);
        assert_eq!(
            lives.resolve(&key, Some(&row(Some("me"), 8))),
            Resolution::Landed(t0)
        );
        assert_eq!(lives.to_row(&key, &fence("me", 5)), fence("me", 8));
        lives.unsure(&key, t0);
        assert_eq!(
            lives.resolve(&key, Some(&row(Some("me"), 8))),
            Resolution::NotLanded
        );
        assert_eq!(lives.renewal_fence(&key), Some(fence("me", 8)));
        lives.unsure(&key, t0);
        assert_eq!(
            lives.resolve(&key, Some(&row(Some("java"), 9))),
            Resolution::Lost
        );
        assert_eq!(
            lives.to_row(&key, &fence("me", 5)),
            fence("me", 5),
            "forgotten"
        );
        lives.took(&row(Some("me"), 10));
        lives.unsure(&key, t0);
        assert_eq!(
            lives.resolve(&key, None),
            Resolution::Lost,
            "the row is gone"
        );
    }
}
