//! Which shards get a new lease row, and where each starts. Pure.
//!
//! The rule follows the KCL: a shard is leased when it is open, when one of its parents
//! is (or is about to be) leased, or always when the application starts from the oldest
//! records (TRIM_HORIZON / AT_TIMESTAMP). A shard whose parent is leased starts at
//! TRIM_HORIZON (even at LATEST): its first records follow its parent's last ones, and
//! skipping them would lose data. At AT_TIMESTAMP it starts at the time, as the KCL's
//! do: its changes from the time on follow its parent's, and those before it follow a
//! parent that ended before the time (a DynamoDB stream's shards rotate every few
//! hours), before where the application asked to start. Other shards start at the
//! initial position.
//!
//! A closed shard with no row whose child has one is finished: its row was deleted
//! after it ended and its children started. It is never leased again (reading it anew
//! would redeliver what was processed long ago).

use std::collections::BTreeSet;

use super::{Checkpoint, Lease, LeaseKey, Shard, ShardId};

/// The new lease rows for `shards`, given the shards that already have one. Parents come
/// before their children in the result.
pub fn plan_new_leases(
    shards: &[Shard],
    leased: &BTreeSet<ShardId>,
    initial: &Checkpoint,
) -> Vec<Lease> {
    let lease_everything = !matches!(initial, Checkpoint::Latest);
    let listed: BTreeSet<&ShardId> = shards.iter().map(|s| &s.id).collect();
    let mut leased = leased.clone();
    loop {
        let finished: Vec<ShardId> = shards
            .iter()
            .filter(|s| !s.is_open() && !leased.contains(&s.id))
            .filter(|s| {
                shards
                    .iter()
                    .any(|c| c.parents().any(|p| p == &s.id) && leased.contains(&c.id))
            })
            .map(|s| s.id.clone())
            .collect();
        if finished.is_empty() {
            break;
        }
        leased.extend(finished);
    }
    let leased = &leased;
    // Leased already or planned now.
    let mut known: BTreeSet<ShardId> = leased.clone();
    // Known, or looked at and left without a lease.
    let mut decided: BTreeSet<ShardId> = leased.clone();
    let mut planned = Vec::new();
    let mut pending: Vec<&Shard> = shards.iter().filter(|s| !leased.contains(&s.id)).collect();
    // Passes until nothing changes: a shard is decided once every listed parent is.
    while !pending.is_empty() {
        let before = pending.len();
        let mut rest = Vec::new();
        for shard in pending {
            if shard
                .parents()
                .any(|p| listed.contains(p) && !decided.contains(p))
            {
                rest.push(shard);
                continue;
            }
            decided.insert(shard.id.clone());
            let parent_leased = shard.parents().any(|p| known.contains(p));
            if lease_everything || shard.is_open() || parent_leased {
                let checkpoint = match initial {
                    Checkpoint::AtTimestamp => Checkpoint::AtTimestamp,
                    Checkpoint::TrimHorizon
                    | Checkpoint::Latest
                    | Checkpoint::At(_)
                    | Checkpoint::ShardEnd => {
                        if parent_leased {
                            Checkpoint::TrimHorizon
                        } else {
                            initial.clone()
                        }
                    }
                };
                known.insert(shard.id.clone());
                planned.push(lease_for(shard, checkpoint));
            }
        }
        pending = rest;
        if pending.len() == before {
            // A parent cycle, impossible from Kinesis: lease plainly rather than lose data.
            planned.extend(pending.drain(..).map(|s| lease_for(s, initial.clone())));
        }
    }
    planned
}

/// The rows that may be deleted: finished (SHARD_END), their shard gone from the
/// listing (past retention), and every child's row present and started (owned at least
/// once, or past its first record). Until then a parent's row is what tells a child
/// that it may start.
pub fn plan_cleanup<'a>(shards: &[Shard], leases: &'a [Lease]) -> Vec<&'a Lease> {
    let listed: BTreeSet<&ShardId> = shards.iter().map(|s| &s.id).collect();
    let started = |l: &Lease| {
        l.counter > 0 || matches!(l.checkpoint, Checkpoint::At(_) | Checkpoint::ShardEnd)
    };
    leases
        .iter()
        .filter(|l| l.checkpoint.is_shard_end() && !listed.contains(&l.key.shard_id()))
        .filter(|parent| {
            let shard = parent.key.shard_id();
            let mut children: Vec<&Lease> = leases
                .iter()
                .filter(|c| c.parent_shard_ids.contains(&shard))
                .collect();
            let named_missing = parent
                .child_shard_ids
                .iter()
                .any(|id| !children.iter().any(|c| &c.key.shard_id() == id));
            children.dedup_by(|a, b| a.key == b.key);
            !children.is_empty() && !named_missing && children.iter().all(|c| started(c))
        })
        .collect()
}

/// Lease rows the stream listing does not explain, split by how sure that is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Orphans<'a> {
    /// Not finished, not in a listing taken after the row was first seen: a row for a
    /// shard the stream does not have (a typo'd manual write, a row from another
    /// stream). Nobody takes it: every attempt would fail on the shard.
    pub confirmed: Vec<&'a Lease>,
    /// Not in the listing, but first seen after it was taken (a child created from a
    /// reader's report, a row another worker made from a newer listing): a newer
    /// listing decides. Treated as ordinary meanwhile.
    pub unconfirmed: Vec<&'a Lease>,
}

/// Which unfinished lease rows name a shard that the stream listing does not have.
/// `listed_at` is when the listing was requested; `first_seen` when this worker first
/// saw each row (any ordered time: the rule only compares them). A finished row is
/// never an orphan: its shard may have left the listing past retention.
pub fn orphans<'a, T: Ord + Copy>(
    leases: &'a [Lease],
    listed: &BTreeSet<LeaseKey>,
    listed_at: T,
    first_seen: impl Fn(&Lease) -> Option<T>,
) -> Orphans<'a> {
    let mut out = Orphans::default();
    for lease in leases {
        if lease.checkpoint.is_shard_end() || listed.contains(&lease.key) {
            continue;
        }
        match first_seen(lease) {
            Some(seen) if seen < listed_at => out.confirmed.push(lease),
            _ => out.unconfirmed.push(lease),
        }
    }
    out
}

fn lease_for(shard: &Shard, checkpoint: Checkpoint) -> Lease {
    let mut parents: Vec<ShardId> = shard.parents().cloned().collect();
    // Mutant ForgetMergeSecondParent: a merged child's row names its first parent only,
    // so nothing waits for the second.
    if crate::mutants::active(crate::mutants::Mutant::ForgetMergeSecondParent) {
        parents.truncate(1);
    }
    Lease::new(&shard.id, checkpoint, parents, Some(shard.hash_range))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{HashKeyRange, LeaseKey, SequenceNumber, SequenceRange};

    fn shard(i: u64, parents: &[u64], open: bool) -> Shard {
        Shard {
            id: ShardId::from_index(i),
            parent: parents.first().map(|p| ShardId::from_index(*p)),
            adjacent_parent: parents.get(1).map(|p| ShardId::from_index(*p)),
            hash_range: HashKeyRange {
                start: 0,
                end: u128::MAX,
            },
            sequence_range: SequenceRange {
                start: SequenceNumber::parse("1").unwrap(),
                end: if open {
                    None
                } else {
                    Some(SequenceNumber::parse("9").unwrap())
                },
            },
        }
    }

    /// The plan as (shard index, checkpoint), sorted; checks on the way that every
    /// planned parent comes before its children.
    fn plan(shards: &[Shard], leased: &[u64], initial: Checkpoint) -> Vec<(u64, Checkpoint)> {
        let leased: BTreeSet<ShardId> = leased.iter().map(|i| ShardId::from_index(*i)).collect();
        let planned = plan_new_leases(shards, &leased, &initial);
        for (i, lease) in planned.iter().enumerate() {
            for parent in &lease.parent_shard_ids {
                if let Some(p) = planned.iter().position(|l| l.key.shard_id() == *parent) {
                    assert!(
                        p < i,
                        "parent {parent} planned after its child {}",
                        lease.key
                    );
                }
            }
        }
        let mut got: Vec<(u64, Checkpoint)> = planned
            .into_iter()
            .map(|l| {
                let id = l.key.shard_id();
                let index = (0..100).find(|i| ShardId::from_index(*i) == id).unwrap();
                (index, l.checkpoint)
            })
            .collect();
        got.sort_by_key(|(i, _)| *i);
        got
    }

    /// 0 split into 1 and 2; 2 merged with 3 into 4. Open: 1 and 4.
    fn history() -> Vec<Shard> {
        vec![
            shard(4, &[2, 3], true),
            shard(1, &[0], true),
            shard(0, &[], false),
            shard(2, &[0], false),
            shard(3, &[], false),
        ]
    }

    #[test]
    fn trim_horizon_leases_every_shard_and_children_start_at_their_beginning() {
        let got = plan(&history(), &[], Checkpoint::TrimHorizon);
        assert_eq!(
            got,
            vec![
                (0, Checkpoint::TrimHorizon),
                (1, Checkpoint::TrimHorizon),
                (2, Checkpoint::TrimHorizon),
                (3, Checkpoint::TrimHorizon),
                (4, Checkpoint::TrimHorizon),
            ]
        );
    }

    #[test]
    fn latest_leases_open_shards_only_at_latest() {
        let got = plan(&history(), &[], Checkpoint::Latest);
        assert_eq!(got, vec![(1, Checkpoint::Latest), (4, Checkpoint::Latest)]);
    }

    #[test]
    fn a_new_child_of_a_leased_shard_starts_at_trim_horizon_even_at_latest() {
        // 1 was leased at LATEST; it split into 5 and 6, and 5 already closed again.
        let mut shards = vec![
            shard(1, &[], false),
            shard(5, &[1], false),
            shard(6, &[1], true),
        ];
        shards.push(shard(7, &[5], true));
        let got = plan(&shards, &[1], Checkpoint::Latest);
        assert_eq!(
            got,
            vec![
                (5, Checkpoint::TrimHorizon),
                (6, Checkpoint::TrimHorizon),
                (7, Checkpoint::TrimHorizon),
            ]
        );
    }

    #[test]
    fn at_timestamp_starts_every_shard_at_the_timestamp_children_too() {
        let got = plan(&history(), &[0, 1, 2, 3], Checkpoint::AtTimestamp);
        assert_eq!(got, vec![(4, Checkpoint::AtTimestamp)]);
        let got = plan(&[shard(3, &[], true)], &[], Checkpoint::AtTimestamp);
        assert_eq!(got, vec![(3, Checkpoint::AtTimestamp)]);
        // A shard that ended before the time starts at its end; its children at
        // TRIM_HORIZON would deliver their changes from before the time.
        let got = plan(&history(), &[], Checkpoint::AtTimestamp);
        let all: Vec<_> = (0..5).map(|i| (i, Checkpoint::AtTimestamp)).collect();
        assert_eq!(got, all);
    }

    #[test]
    fn a_finished_parent_whose_row_was_cleaned_up_is_not_leased_again() {
        // 0 and 2 finished and their rows were deleted; 1 and 4 are leased.
        assert!(plan(&history(), &[1, 3, 4], Checkpoint::TrimHorizon).is_empty());
        // 3 is done too once 4 is leased, even with no row of its own.
        assert!(plan(&history(), &[1, 4], Checkpoint::TrimHorizon).is_empty());
    }

    #[test]
    fn a_finished_row_is_cleaned_up_only_when_gone_from_the_listing_and_its_children_started() {
        let row = |i: u64, parents: &[u64], cp: Checkpoint, counter: u64| {
            let mut l = Lease::new(
                &ShardId::from_index(i),
                cp,
                parents.iter().map(|p| ShardId::from_index(*p)).collect(),
                None,
            );
            l.counter = counter;
            l
        };
        let mut parent = row(0, &[], Checkpoint::ShardEnd, 3);
        parent.child_shard_ids = vec![ShardId::from_index(1), ShardId::from_index(2)];
        let listed_children = [shard(1, &[0], true), shard(2, &[0], true)];
        let one_started = vec![
            parent.clone(),
            row(1, &[0], Checkpoint::TrimHorizon, 1),
            row(2, &[0], Checkpoint::TrimHorizon, 0),
        ];
        assert!(plan_cleanup(&listed_children, &one_started).is_empty());
        let both_started = vec![
            parent.clone(),
            row(1, &[0], Checkpoint::TrimHorizon, 1),
            row(2, &[0], Checkpoint::TrimHorizon, 2),
        ];
        let cleaned: Vec<&LeaseKey> = plan_cleanup(&listed_children, &both_started)
            .iter()
            .map(|l| &l.key)
            .collect();
        assert_eq!(cleaned, vec![&parent.key]);
        // Still listed: kept.
        let mut with_parent = listed_children.to_vec();
        with_parent.push(shard(0, &[], false));
        assert!(plan_cleanup(&with_parent, &both_started).is_empty());
        // A named child without a row: kept.
        assert!(plan_cleanup(&listed_children, &both_started[..2]).is_empty());
        // Not finished: kept, whatever the listing says.
        let mut open_parent = both_started.clone();
        open_parent[0].checkpoint = Checkpoint::TrimHorizon;
        assert!(plan_cleanup(&listed_children, &open_parent).is_empty());
    }

    #[test]
    fn leased_shards_are_not_planned_again() {
        assert!(plan(&history(), &[0, 1, 2, 3, 4], Checkpoint::TrimHorizon).is_empty());
    }

    #[test]
    fn rows_the_listing_does_not_explain_are_orphans_only_if_seen_before_it() {
        let lease = |i: u64, cp: Checkpoint| Lease::new(&ShardId::from_index(i), cp, vec![], None);
        let leases = vec![
            lease(0, Checkpoint::TrimHorizon), // listed
            lease(1, Checkpoint::TrimHorizon), // not listed, seen at 5 (before the listing)
            lease(2, Checkpoint::TrimHorizon), // not listed, seen at 15 (after it)
            lease(3, Checkpoint::ShardEnd),    // not listed, finished: gone past retention
            lease(4, Checkpoint::TrimHorizon), // not listed, never seen before
            // The listed shard's id, but of a stream not listed, seen at 5.
            Lease {
                key: LeaseKey::new("1:other:7:shardId-000000000000"),
                ..lease(0, Checkpoint::TrimHorizon)
            },
        ];
        let listed: BTreeSet<LeaseKey> = [LeaseKey::from(&ShardId::from_index(0))]
            .into_iter()
            .collect();
        let seen = |l: &Lease| match l.key.as_str() {
            "shardId-000000000001" | "1:other:7:shardId-000000000000" => Some(5),
            "shardId-000000000002" => Some(15),
            _ => None,
        };
        let found = orphans(&leases, &listed, 10, seen);
        let keys = |ls: &[&Lease]| {
            ls.iter()
                .map(|l| l.key.as_str().to_owned())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys(&found.confirmed),
            ["shardId-000000000001", "1:other:7:shardId-000000000000"]
        );
        assert_eq!(
            keys(&found.unconfirmed),
            ["shardId-000000000002", "shardId-000000000004"]
        );
    }
}
