//! The shard lineage of a stream: which shard came from which, and which may be read.
//!
//! Per-partition-key order across a reshard holds only if a child is read after every
//! one of its parents has been read to SHARD_END; `ready` is that rule.

use std::collections::{BTreeMap, BTreeSet};

use super::{HashKeyRange, Shard, ShardId};

/// Shards of one listing, indexed by id, with the parent → children edges.
#[derive(Debug, Clone, Default)]
pub struct ShardGraph {
    shards: BTreeMap<ShardId, Shard>,
    children: BTreeMap<ShardId, BTreeSet<ShardId>>,
}

/// What is wrong with the hash-key coverage of the open shards.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CoverageError {
    /// No open shard covers these hash keys (inclusive).
    #[error("no open shard covers hash keys {0}")]
    Gap(HashKeyRange),
    /// Two open shards cover the same hash keys.
    #[error("open shards {first} and {second} both cover hash keys {range}")]
    Overlap {
        /// The open shard that starts first.
        first: ShardId,
        /// The open shard that starts inside `first`'s keys.
        second: ShardId,
        /// The hash keys both cover (inclusive).
        range: HashKeyRange,
    },
}

impl ShardGraph {
    /// The graph of one listing; a parent not in it (trimmed) is still named by its children.
    pub fn new(shards: impl IntoIterator<Item = Shard>) -> Self {
        let shards: BTreeMap<ShardId, Shard> =
            shards.into_iter().map(|s| (s.id.clone(), s)).collect();
        let mut children: BTreeMap<ShardId, BTreeSet<ShardId>> = BTreeMap::new();
        for shard in shards.values() {
            for parent in shard.parents() {
                children
                    .entry(parent.clone())
                    .or_default()
                    .insert(shard.id.clone());
            }
        }
        Self { shards, children }
    }

    /// The listed shard `id`; `None` if the listing does not show it.
    pub fn get(&self, id: &ShardId) -> Option<&Shard> {
        self.shards.get(id)
    }

    /// Every listed shard, in shard-id order.
    pub fn shards(&self) -> impl Iterator<Item = &Shard> {
        self.shards.values()
    }

    /// How many shards the listing shows.
    pub fn len(&self) -> usize {
        self.shards.len()
    }

    /// Whether the listing shows no shard.
    pub fn is_empty(&self) -> bool {
        self.shards.is_empty()
    }

    /// The parents named by the shard (two for a merge), whether or not they are still
    /// listed: a parent past the retention period is no longer listed.
    pub fn parents(&self, id: &ShardId) -> Vec<ShardId> {
        self.shards
            .get(id)
            .map(|s| s.parents().cloned().collect())
            .unwrap_or_default()
    }

    /// The shards that name `id` as a parent.
    pub fn children(&self, id: &ShardId) -> Vec<ShardId> {
        self.children
            .get(id)
            .map(|c| c.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Shards that may be read now: not finished, and every parent either finished or
    /// gone from the listing (trimmed past retention, so nothing of it is left to read).
    pub fn ready(&self, finished: &BTreeSet<ShardId>) -> Vec<ShardId> {
        self.shards
            .values()
            .filter(|s| !finished.contains(&s.id))
            .filter(|s| {
                s.parents()
                    .all(|p| finished.contains(p) || !self.shards.contains_key(p))
            })
            .map(|s| s.id.clone())
            .collect()
    }

    /// Checks that the open shards cover every hash key exactly once, as they do in a
    /// healthy stream. A listing taken in the middle of a reshard can fail this; the
    /// caller lists again rather than act on it.
    pub fn check_coverage(&self) -> Result<(), CoverageError> {
        let mut open: Vec<&Shard> = self.shards.values().filter(|s| s.is_open()).collect();
        open.sort_by_key(|s| (s.hash_range.start, s.hash_range.end));
        let mut next: Option<u128> = Some(0); // first key not yet covered; None = all covered
        let mut previous: Option<&Shard> = None;
        for shard in open {
            let range = shard.hash_range;
            match next {
                Some(want) if range.start > want => {
                    return Err(CoverageError::Gap(HashKeyRange {
                        start: want,
                        end: range.start - 1,
                    }));
                }
                Some(want) if range.start == want => {}
                // Starts inside what is already covered (or after the end of the key space).
                _ => {
                    let covered_to = next.map_or(u128::MAX, |want| want - 1);
                    return Err(CoverageError::Overlap {
                        first: previous.map_or_else(|| shard.id.clone(), |p| p.id.clone()),
                        second: shard.id.clone(),
                        range: HashKeyRange {
                            start: range.start,
                            end: covered_to.min(range.end),
                        },
                    });
                }
            }
            next = range.end.checked_add(1);
            previous = Some(shard);
        }
        match next {
            None => Ok(()),
            Some(start) => Err(CoverageError::Gap(HashKeyRange {
                start,
                end: u128::MAX,
            })),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{SequenceNumber, SequenceRange};
    use proptest::prelude::*;

    fn shard(id: u64, parents: &[u64], range: (u128, u128), open: bool) -> Shard {
        Shard {
            id: ShardId::from_index(id),
            parent: parents.first().map(|p| ShardId::from_index(*p)),
            adjacent_parent: parents.get(1).map(|p| ShardId::from_index(*p)),
            hash_range: HashKeyRange {
                start: range.0,
                end: range.1,
            },
            sequence_range: SequenceRange {
                start: SequenceNumber::from_u128(u128::from(id) * 100),
                end: (!open).then(|| SequenceNumber::from_u128(u128::from(id) * 100 + 99)),
            },
        }
    }

    const HALF: u128 = u128::MAX / 2;

    /// 0 split into 1 and 2; 1 and 2 merged into 3.
    fn split_then_merge() -> ShardGraph {
        ShardGraph::new([
            shard(0, &[], (0, u128::MAX), false),
            shard(1, &[0], (0, HALF), false),
            shard(2, &[0], (HALF + 1, u128::MAX), false),
            shard(3, &[1, 2], (0, u128::MAX), true),
        ])
    }

    fn ids(list: &[u64]) -> Vec<ShardId> {
        list.iter().map(|i| ShardId::from_index(*i)).collect()
    }

    fn set(list: &[u64]) -> BTreeSet<ShardId> {
        ids(list).into_iter().collect()
    }

    #[test]
    fn parents_and_children() {
        let g = split_then_merge();
        assert_eq!(g.parents(&ShardId::from_index(3)), ids(&[1, 2]));
        assert_eq!(g.parents(&ShardId::from_index(1)), ids(&[0]));
        assert_eq!(g.children(&ShardId::from_index(0)), ids(&[1, 2]));
        assert_eq!(g.children(&ShardId::from_index(1)), ids(&[3]));
        assert!(g.children(&ShardId::from_index(3)).is_empty());
    }

    #[test]
    fn ready_waits_for_every_parent() {
        let g = split_then_merge();
        let table: [(&[u64], &[u64]); 5] = [
            (&[], &[0]),
            (&[0], &[1, 2]),
            (&[0, 1], &[2]), // the merge child waits for its second parent
            (&[0, 1, 2], &[3]),
            (&[0, 1, 2, 3], &[]),
        ];
        for (finished, want) in table {
            assert_eq!(g.ready(&set(finished)), ids(want), "finished {finished:?}");
        }
    }

    #[test]
    fn a_parent_gone_from_the_listing_does_not_block() {
        // Shard 0 was trimmed past retention: its children are listed alone.
        let g = ShardGraph::new([
            shard(1, &[0], (0, HALF), true),
            shard(2, &[0], (HALF + 1, u128::MAX), true),
        ]);
        assert_eq!(g.ready(&set(&[])), ids(&[1, 2]));
    }

    #[test]
    fn coverage_reports_gaps_and_overlaps() {
        assert_eq!(split_then_merge().check_coverage(), Ok(()));
        let gap = ShardGraph::new([
            shard(0, &[], (0, 10), true),
            shard(1, &[], (12, u128::MAX), true),
        ]);
        assert_eq!(
            gap.check_coverage(),
            Err(CoverageError::Gap(HashKeyRange { start: 11, end: 11 }))
        );
        let tail = ShardGraph::new([shard(0, &[], (0, 10), true)]);
        assert_eq!(
            tail.check_coverage(),
            Err(CoverageError::Gap(HashKeyRange {
                start: 11,
                end: u128::MAX
            }))
        );
        let head = ShardGraph::new([shard(0, &[], (5, u128::MAX), true)]);
        assert_eq!(
            head.check_coverage(),
            Err(CoverageError::Gap(HashKeyRange { start: 0, end: 4 }))
        );
        let overlap = ShardGraph::new([
            shard(0, &[], (0, 10), true),
            shard(1, &[], (8, u128::MAX), true),
        ]);
        assert_eq!(
            overlap.check_coverage(),
            Err(CoverageError::Overlap {
                first: ShardId::from_index(0),
                second: ShardId::from_index(1),
                range: HashKeyRange { start: 8, end: 10 },
            })
        );
        let twice = ShardGraph::new([
            shard(0, &[], (0, u128::MAX), true),
            shard(1, &[], (0, u128::MAX), true),
        ]);
        assert!(matches!(
            twice.check_coverage(),
            Err(CoverageError::Overlap { .. })
        ));
        assert!(matches!(
            ShardGraph::default().check_coverage(),
            Err(CoverageError::Gap(_))
        ));
    }

    /// A random history of splits and merges over an 8-shard stream.
    fn reshard_history() -> impl Strategy<Value = Vec<(bool, usize, u128)>> {
        prop::collection::vec((any::<bool>(), any::<usize>(), any::<u128>()), 0..40)
    }

    fn replay(history: &[(bool, usize, u128)]) -> Vec<Shard> {
        let mut all: Vec<Shard> = HashKeyRange::even_split(8)
            .into_iter()
            .enumerate()
            .map(|(i, r)| shard(i as u64, &[], (r.start, r.end), true))
            .collect();
        for &(split, pick, at) in history {
            let mut open: Vec<usize> = (0..all.len()).filter(|i| all[*i].is_open()).collect();
            open.sort_by_key(|i| all[*i].hash_range.start);
            let next = all.len() as u64;
            if split {
                let p = open[pick % open.len()];
                let r = all[p].hash_range;
                if r.start == r.end {
                    continue;
                }
                let mid = r.start + 1 + at % (r.end - r.start);
                all[p] = close(all[p].clone(), p as u64, r);
                all.push(shard(next, &[p as u64], (r.start, mid - 1), true));
                all.push(shard(next + 1, &[p as u64], (mid, r.end), true));
            } else if open.len() >= 2 {
                let k = pick % (open.len() - 1);
                let (a, b) = (open[k], open[k + 1]);
                let (ra, rb) = (all[a].hash_range, all[b].hash_range);
                all[a] = close(all[a].clone(), a as u64, ra);
                all[b] = close(all[b].clone(), b as u64, rb);
                all.push(shard(next, &[a as u64, b as u64], (ra.start, rb.end), true));
            }
        }
        all
    }

    fn close(mut s: Shard, id: u64, range: HashKeyRange) -> Shard {
        s.id = ShardId::from_index(id);
        s.hash_range = range;
        s.sequence_range.end = Some(SequenceNumber::from_u128(u128::from(id)));
        s
    }

    proptest! {
        #[test]
        fn resharding_keeps_coverage_and_reads_parents_first(history in reshard_history()) {
            let shards = replay(&history);
            let graph = ShardGraph::new(shards.clone());
            prop_assert_eq!(graph.check_coverage(), Ok(()));

            // Reading in `ready` order finishes every shard, and never a child before
            // all of its parents.
            let mut finished = BTreeSet::new();
            let mut order = Vec::new();
            loop {
                let ready = graph.ready(&finished);
                if ready.is_empty() {
                    break;
                }
                for id in ready {
                    for parent in graph.parents(&id) {
                        prop_assert!(finished.contains(&parent), "{id} before its parent {parent}");
                    }
                    finished.insert(id.clone());
                    order.push(id);
                }
            }
            prop_assert_eq!(order.len(), shards.len());
        }
    }
}
