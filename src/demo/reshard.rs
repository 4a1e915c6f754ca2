//! The demo's mid-run changes of shape: a stream's shard split at a third of the run and
//! two adjacent shards merged at two thirds; a table stream's shards all rotated, then
//! one split.

use std::time::Duration;

use anyhow::{Context as _, bail};
use flotilla_actors::backend::StreamAdmin as _;
use flotilla_actors::backend::StreamClient as _;
use flotilla_actors::backend::memory::MemoryStreams;
use flotilla_actors::model::Shard;
use tokio::time::Instant;

use super::producer::{Feed, STREAM};

/// Changes the shape of what the fleet reads at `split_at` and `merge_at` (from now):
/// a stream's shard splits, then two merge; a table stream's shards all rotate, then
/// one splits.
pub(super) async fn reshard(
    feed: Feed,
    split_at: Duration,
    merge_at: Duration,
) -> anyhow::Result<()> {
    match feed {
        Feed::Stream(streams) => reshard_stream(streams, split_at, merge_at).await,
        Feed::Table { tables, arn } => {
            let start = Instant::now();
            tokio::time::sleep_until(start + split_at).await;
            let rotated = tables
                .rotate_all(&arn)
                .context("cannot rotate the table stream's shards")?;
            eprintln!(
                "demo: rotated every shard of the table stream ({} new)",
                rotated.len()
            );
            tokio::time::sleep_until(start + merge_at).await;
            let Some(shard) = rotated.first() else {
                bail!("the table stream has no open shard to split");
            };
            let children = tables
                .split_shard(&arn, shard)
                .with_context(|| format!("cannot split {shard}"))?;
            eprintln!("demo: split {shard} into {} children", children.len());
            Ok(())
        }
    }
}

/// Splits a shard at `split_at` and merges two at `merge_at` (from now).
async fn reshard_stream(
    streams: MemoryStreams,
    split_at: Duration,
    merge_at: Duration,
) -> anyhow::Result<()> {
    let start = Instant::now();
    tokio::time::sleep_until(start + split_at).await;
    let shards = open_shards(&streams).await?;
    let Some((parent, at)) = split_point(&shards) else {
        bail!("no open shard is wide enough to split");
    };
    streams
        .split_shard(STREAM, &parent.id, at)
        .await
        .with_context(|| format!("cannot split {}", parent.id))?;
    eprintln!("demo: split {} at hash key {at}", parent.id);

    tokio::time::sleep_until(start + merge_at).await;
    let shards = open_shards(&streams).await?;
    let Some((a, b)) = adjacent_pair(&shards) else {
        bail!("no two open shards are adjacent");
    };
    streams
        .merge_shards(STREAM, &a.id, &b.id)
        .await
        .with_context(|| format!("cannot merge {} and {}", a.id, b.id))?;
    eprintln!("demo: merged {} and {}", a.id, b.id);
    Ok(())
}

/// Open shards, by hash-key range.
async fn open_shards(streams: &MemoryStreams) -> anyhow::Result<Vec<Shard>> {
    let mut shards: Vec<Shard> = streams
        .list_shards(STREAM)
        .await
        .context("cannot list shards")?
        .into_iter()
        .filter(Shard::is_open)
        .collect();
    shards.sort_by_key(|s| s.hash_range.start);
    Ok(shards)
}

/// The first shard (by hash key) with room to split, and the midpoint of its range: the
/// new starting hash key of the upper child.
fn split_point(open: &[Shard]) -> Option<(&Shard, u128)> {
    open.iter().find_map(|shard| {
        let range = shard.hash_range;
        (range.end > range.start).then(|| (shard, range.start + (range.end - range.start) / 2 + 1))
    })
}

/// The first two open shards (by hash key) whose ranges touch.
fn adjacent_pair(open: &[Shard]) -> Option<(&Shard, &Shard)> {
    open.windows(2).find_map(|pair| match pair {
        [a, b] if a.hash_range.end.checked_add(1) == Some(b.hash_range.start) => Some((a, b)),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use flotilla_actors::model::{HashKeyRange, SequenceNumber, SequenceRange, ShardId};

    use super::*;

    fn shard(index: u64, start: u128, end: u128, open: bool) -> Shard {
        Shard {
            id: ShardId::from_index(index),
            parent: None,
            adjacent_parent: None,
            hash_range: HashKeyRange::new(start, end).unwrap(),
            sequence_range: SequenceRange {
                start: SequenceNumber::from_u128(1),
                end: (!open).then(|| SequenceNumber::from_u128(9)),
            },
        }
    }

    #[test]
    fn the_split_takes_the_midpoint_of_the_first_wide_shard() {
        let shards = [shard(0, 5, 5, true), shard(1, 6, 9, true)];
        let (parent, at) = split_point(&shards).unwrap();
        assert_eq!((parent.id.as_str(), at), ("shardId-000000000001", 8));
        assert!(split_point(&shards[..1]).is_none());
        let full = [shard(0, 0, u128::MAX, true)];
        assert_eq!(split_point(&full).unwrap().1, u128::MAX / 2 + 1);
    }

    #[test]
    fn the_merge_takes_two_touching_shards() {
        let shards = [
            shard(0, 0, 9, true),
            shard(3, 20, 29, true),
            shard(4, 30, u128::MAX, true),
        ];
        let (a, b) = adjacent_pair(&shards).unwrap();
        assert_eq!(
            (a.id.as_str(), b.id.as_str()),
            ("shardId-000000000003", "shardId-000000000004")
        );
        assert!(adjacent_pair(&shards[..2]).is_none());
    }
}
