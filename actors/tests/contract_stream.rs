//! The `StreamClient` (and `StreamAdmin`) contract, run against every implementation:
//! `memory` (in-process, paused time), `ferrokinesis` (a Kinesis server started in this
//! test process) and, with the `external-servers` feature, `kinesis_mock` (started by
//! scripts/test.sh). Where an emulator falls short of Kinesis, the tier says so in its
//! `Expect`, and the test checks that declared behaviour instead of skipping.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use flotilla_actors::backend::aws::KinesisStream;
use flotilla_actors::backend::clock::Clock;
use flotilla_actors::backend::memory::{MemoryStreams, MemoryStreamsConfig};
use flotilla_actors::backend::{
    Capabilities, IteratorPosition, PutRecord, Record, StreamAdmin, StreamError,
};
use flotilla_actors::model::{
    HashKeyRange, SequenceNumber, Shard, ShardGraph, ShardId, partition_key_hash,
};
use support::servers;

/// How a tier's iterators can be made to expire within a test.
enum Expiry {
    /// Advance paused tokio time past the TTL.
    Advance(Duration),
    /// Sleep past a short TTL the server was started with.
    Sleep(Duration),
    /// The server's TTL is fixed at five minutes: the expiry path is exercised on the
    /// other tiers only, and this says why.
    Fixed(&'static str),
}

/// What a garbage iterator gets.
#[derive(Debug, Clone, Copy, PartialEq)]
enum GarbageIterator {
    InvalidArgument,
    /// kinesis-mock answers a bare HTTP 500.
    ServerError,
}

/// What the ending sequence number of a closed shard is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum EndingSequence {
    /// The last sequence number the shard can hold, as Kinesis reports it.
    Exact,
    /// kinesis-mock reports Java's Long.MAX_VALUE for every closed shard.
    Placeholder(&'static str),
}

/// What GetShardIterator answers for AT_SEQUENCE_NUMBER of a number from elsewhere.
#[derive(Debug, Clone, Copy, PartialEq)]
enum ForeignSequence {
    InvalidArgument,
    /// kinesis-mock looks the number up among the shard's records: ResourceNotFound.
    NotFound,
}

struct Expect {
    capabilities: Capabilities,
    expiry: Expiry,
    garbage_iterator: GarbageIterator,
    ending_sequence: EndingSequence,
    foreign_sequence: ForeignSequence,
}

struct Env {
    stream: Arc<dyn StreamAdmin>,
    expect: Expect,
    tier: &'static str,
    /// The memory stream's clock (it follows paused tokio time); `None`: the system clock.
    clock: Option<Clock>,
}

impl Env {
    async fn memory() -> Env {
        let config = MemoryStreamsConfig::default();
        let ttl = config.iterator_ttl;
        let stream = MemoryStreams::new(config);
        Env {
            clock: Some(stream.clock()),
            stream: Arc::new(stream),
            expect: Expect {
                capabilities: Capabilities::FULL,
                expiry: Expiry::Advance(ttl + Duration::from_secs(1)),
                garbage_iterator: GarbageIterator::InvalidArgument,
                ending_sequence: EndingSequence::Exact,
                foreign_sequence: ForeignSequence::InvalidArgument,
            },
            tier: "memory",
        }
    }

    /// A tier behind the real Kinesis adapter, at `endpoint`.
    async fn server(endpoint: &str, expect: Expect, tier: &'static str) -> Env {
        let sdk = servers::sdk_config();
        let stream = KinesisStream::new(&sdk, Some(endpoint))
            .with_capabilities(expect.capabilities)
            .with_list_page_size(LIST_PAGE);
        Env {
            stream: Arc::new(stream),
            expect,
            tier,
            clock: None,
        }
    }

    async fn ferrokinesis() -> Env {
        let endpoint = servers::start_ferrokinesis(4).await;
        let expect = Expect {
            // No ChildShards from GetRecords; 0 ms behind on open shards.
            capabilities: Capabilities {
                child_shards_in_get_records: false,
                millis_behind_latest: false,
            },
            expiry: Expiry::Sleep(Duration::from_millis(4500)),
            garbage_iterator: GarbageIterator::InvalidArgument,
            ending_sequence: EndingSequence::Exact,
            foreign_sequence: ForeignSequence::InvalidArgument,
        };
        Env::server(&endpoint, expect, "ferrokinesis").await
    }

    #[cfg_attr(not(feature = "external-servers"), allow(dead_code))]
    async fn kinesis_mock() -> Env {
        let endpoint = servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT");
        let expect = Expect {
            // ChildShards, yes; MillisBehindLatest is always 0.
            capabilities: Capabilities {
                child_shards_in_get_records: true,
                millis_behind_latest: false,
            },
            expiry: Expiry::Fixed("kinesis-mock's iterator TTL is a fixed five minutes"),
            garbage_iterator: GarbageIterator::ServerError,
            ending_sequence: EndingSequence::Placeholder("9223372036854775807"),
            foreign_sequence: ForeignSequence::NotFound,
        };
        Env::server(&endpoint, expect, "kinesis_mock").await
    }

    /// A fresh stream per test: kinesis-mock slows down past ~20k records in one stream.
    async fn fresh(&self, shards: u32) -> String {
        let name = servers::unique_name("stream");
        self.stream.create_stream(&name, shards).await.unwrap();
        name
    }

    async fn put(
        &self,
        stream: &str,
        keys: impl IntoIterator<Item = String>,
    ) -> Vec<(String, ShardId, SequenceNumber)> {
        let records: Vec<PutRecord> = keys
            .into_iter()
            .map(|k| PutRecord {
                data: Bytes::from(format!("data-{k}")),
                partition_key: k,
                explicit_hash_key: None,
            })
            .collect();
        let results = self.stream.put_records(stream, &records).await.unwrap();
        assert_eq!(results.len(), records.len());
        records
            .into_iter()
            .zip(results)
            .map(|(r, p)| (r.partition_key, p.shard, p.sequence_number))
            .collect()
    }

    async fn shard_map(&self, stream: &str) -> BTreeMap<ShardId, Shard> {
        self.stream
            .list_shards(stream)
            .await
            .unwrap()
            .into_iter()
            .map(|s| (s.id.clone(), s))
            .collect()
    }

    /// Reads a shard from `position` until it is caught up (or ends), a batch of `limit` at a time.
    async fn read_all(
        &self,
        stream: &str,
        shard: &ShardId,
        position: IteratorPosition,
        limit: u32,
    ) -> (Vec<Record>, bool) {
        let mut iterator = self
            .stream
            .get_shard_iterator(stream, shard, &position)
            .await
            .unwrap();
        let mut out = Vec::new();
        let mut empty_polls = 0;
        loop {
            let batch = self.stream.get_records(&iterator, limit).await.unwrap();
            assert!(batch.records.len() <= limit as usize);
            let got = batch.records.len();
            out.extend(batch.records);
            match batch.next_iterator {
                None => return (out, true),
                Some(next) => iterator = next,
            }
            // Some servers return an empty page before the data: poll a little longer.
            if got == 0 {
                empty_polls += 1;
                if empty_polls >= 3 {
                    return (out, false);
                }
            }
        }
    }
}

/// ListShards page size on the server tiers: small, so every listing paginates.
const LIST_PAGE: i32 = 2;

fn keys(n: usize, prefix: &str) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

mod cases {
    use super::*;

    pub async fn a_new_stream_lists_open_shards_covering_every_key(env: Env) {
        let stream = env.fresh(4).await;
        let shards = env.stream.list_shards(&stream).await.unwrap();
        assert_eq!(shards.len(), 4, "{}", env.tier);
        assert!(shards.iter().all(|s| s.is_open() && s.parent.is_none()));
        assert_eq!(ShardGraph::new(shards).check_coverage(), Ok(()));
        let summary = env.stream.describe_stream_summary(&stream).await.unwrap();
        assert_eq!(
            (
                summary.name.as_str(),
                summary.open_shard_count,
                summary.status.as_str()
            ),
            (stream.as_str(), 4, "ACTIVE")
        );
    }

    pub async fn listing_pages_through_every_shard(env: Env) {
        let stream = env.fresh(7).await;
        let ids: Vec<ShardId> = env
            .stream
            .list_shards(&stream)
            .await
            .unwrap()
            .into_iter()
            .map(|s| s.id)
            .collect();
        assert_eq!(
            ids,
            (0..7).map(ShardId::from_index).collect::<Vec<_>>(),
            "{}",
            env.tier
        );
    }

    pub async fn puts_route_by_the_md5_of_the_partition_key(env: Env) {
        let stream = env.fresh(4).await;
        let shards = env.shard_map(&stream).await;
        for (key, shard, _) in env.put(&stream, keys(200, "route")).await {
            let range = shards[&shard].hash_range;
            assert!(
                range.contains(partition_key_hash(&key)),
                "{key} went to {shard} {range} on {}",
                env.tier
            );
        }
        // An explicit hash key overrides the partition key.
        let last = shards.values().last().unwrap();
        let put = env
            .stream
            .put_records(
                &stream,
                &[PutRecord {
                    partition_key: "any".into(),
                    explicit_hash_key: Some(u128::MAX),
                    data: Bytes::from_static(b"x"),
                }],
            )
            .await
            .unwrap();
        assert_eq!(put[0].shard, last.id);
    }

    pub async fn records_come_back_in_order_once_each(env: Env) {
        let stream = env.fresh(2).await;
        let put = env.put(&stream, keys(300, "order")).await;
        let mut seen = 0;
        for shard in env.shard_map(&stream).await.keys() {
            let want: Vec<_> = put.iter().filter(|(_, s, _)| s == shard).collect();
            let (got, ended) = env
                .read_all(&stream, shard, IteratorPosition::TrimHorizon, 7)
                .await;
            assert!(!ended, "an open shard never ends");
            assert_eq!(got.len(), want.len(), "{shard} on {}", env.tier);
            for (record, (key, _, seq)) in got.iter().zip(&want) {
                assert_eq!(&record.partition_key, key);
                assert_eq!(&record.sequence_number, seq);
                assert_eq!(record.data, Bytes::from(format!("data-{key}")));
                assert_eq!(record.sub_sequence_number, 0);
                assert!(record.approximate_arrival.is_some());
            }
            assert!(
                got.windows(2)
                    .all(|w| w[0].sequence_number < w[1].sequence_number)
            );
            seen += got.len();
        }
        assert_eq!(seen, 300);
    }

    pub async fn iterator_positions(env: Env) {
        let stream = env.fresh(1).await;
        let shard = ShardId::from_index(0);
        let first = env.put(&stream, keys(5, "before")).await;
        let latest = env
            .stream
            .get_shard_iterator(&stream, &shard, &IteratorPosition::Latest)
            .await
            .unwrap();
        let third = first[2].2.clone();

        let (at, _) = env
            .read_all(
                &stream,
                &shard,
                IteratorPosition::AtSequence(third.clone()),
                100,
            )
            .await;
        assert_eq!(
            at.first().map(|r| &r.sequence_number),
            Some(&third),
            "{}",
            env.tier
        );
        assert_eq!(at.len(), 3);
        let (after, _) = env
            .read_all(
                &stream,
                &shard,
                IteratorPosition::AfterSequence(third.clone()),
                100,
            )
            .await;
        assert_eq!(after.len(), 2);
        assert!(after[0].sequence_number > third);

        // Gaps over a second: some servers keep arrival times to the second.
        env.pause(Duration::from_millis(1100)).await;
        let since = env.wall_now();
        env.pause(Duration::from_millis(1100)).await;
        let second = env.put(&stream, keys(3, "after")).await;

        let batch = env.stream.get_records(&latest, 100).await.unwrap();
        let mut from_latest = batch.records;
        if from_latest.is_empty() {
            // Some servers need a second poll before new records show up.
            from_latest = env
                .stream
                .get_records(&batch.next_iterator.unwrap(), 100)
                .await
                .unwrap()
                .records;
        }
        let got: Vec<_> = from_latest
            .iter()
            .map(|r| r.sequence_number.clone())
            .collect();
        let want: Vec<_> = second.iter().map(|p| p.2.clone()).collect();
        assert_eq!(
            got, want,
            "LATEST sees only what came after it on {}",
            env.tier
        );

        let (stamped, _) = env
            .read_all(&stream, &shard, IteratorPosition::AtTimestamp(since), 100)
            .await;
        assert_eq!(
            stamped
                .iter()
                .map(|r| r.sequence_number.clone())
                .collect::<Vec<_>>(),
            want
        );
        let (all, _) = env
            .read_all(&stream, &shard, IteratorPosition::TrimHorizon, 100)
            .await;
        assert_eq!(all.len(), 8);
    }

    pub async fn a_split_closes_the_parent_and_names_it_in_the_children(env: Env) {
        let stream = env.fresh(2).await;
        let parent = ShardId::from_index(0);
        let range = env.shard_map(&stream).await[&parent].hash_range;
        let before = env.put(&stream, keys(60, "pre")).await;
        let mid = range.start + (range.end - range.start) / 2;
        env.stream.split_shard(&stream, &parent, mid).await.unwrap();

        let shards = env.shard_map(&stream).await;
        assert_eq!(shards.len(), 4, "{}", env.tier);
        let closed = &shards[&parent];
        let end = closed
            .sequence_range
            .end
            .clone()
            .expect("the parent is closed");
        let children: Vec<&Shard> = shards
            .values()
            .filter(|s| s.parent.as_ref() == Some(&parent))
            .collect();
        assert_eq!(children.len(), 2);
        let mut ranges: Vec<HashKeyRange> = children.iter().map(|c| c.hash_range).collect();
        ranges.sort();
        assert_eq!(
            ranges,
            [
                HashKeyRange {
                    start: range.start,
                    end: mid - 1
                },
                HashKeyRange {
                    start: mid,
                    end: range.end
                }
            ]
        );
        assert!(
            children
                .iter()
                .all(|c| c.is_open() && c.adjacent_parent.is_none())
        );
        assert_eq!(
            ShardGraph::new(shards.values().cloned()).check_coverage(),
            Ok(())
        );

        // Reading the parent ends, after every record it held.
        let (got, ended) = env
            .read_all(&stream, &parent, IteratorPosition::TrimHorizon, 1000)
            .await;
        assert!(ended, "a closed shard ends on {}", env.tier);
        let want: Vec<_> = before
            .iter()
            .filter(|(_, s, _)| *s == parent)
            .map(|p| p.2.clone())
            .collect();
        assert_eq!(
            got.iter()
                .map(|r| r.sequence_number.clone())
                .collect::<Vec<_>>(),
            want
        );
        match env.expect.ending_sequence {
            EndingSequence::Exact => assert!(got.iter().all(|r| r.sequence_number <= end)),
            EndingSequence::Placeholder(text) => assert_eq!(end.as_str(), text, "{}", env.tier),
        }

        // The last batch names the children where the server reports them.
        let mut iterator = env
            .stream
            .get_shard_iterator(&stream, &parent, &IteratorPosition::TrimHorizon)
            .await
            .unwrap();
        let last = loop {
            let batch = env.stream.get_records(&iterator, 10_000).await.unwrap();
            match batch.next_iterator.clone() {
                Some(next) => iterator = next,
                None => break batch,
            }
        };
        if env.expect.capabilities.child_shards_in_get_records {
            let mut reported: Vec<ShardId> = last
                .child_shards
                .unwrap_or_default()
                .into_iter()
                .map(|c| c.id)
                .collect();
            reported.sort();
            let mut want: Vec<ShardId> = children.iter().map(|c| c.id.clone()).collect();
            want.sort();
            assert_eq!(reported, want);
        } else {
            assert!(
                last.child_shards.unwrap_or_default().is_empty(),
                "{} declared no ChildShards",
                env.tier
            );
        }

        // New records go to the children, by hash.
        for (key, shard, _) in env.put(&stream, keys(40, "post")).await {
            let s = &shards[&shard];
            assert!(
                s.is_open() && s.hash_range.contains(partition_key_hash(&key)),
                "{key} -> {shard}"
            );
        }
    }

    pub async fn a_merge_names_both_parents(env: Env) {
        let stream = env.fresh(3).await;
        let (a, b) = (ShardId::from_index(1), ShardId::from_index(2));
        env.put(&stream, keys(30, "m")).await;
        env.stream.merge_shards(&stream, &a, &b).await.unwrap();
        let shards = env.shard_map(&stream).await;
        let child = shards
            .values()
            .find(|s| s.parent.is_some())
            .expect("a merged child");
        let parents: HashSet<ShardId> = child.parents().cloned().collect();
        assert_eq!(
            parents,
            HashSet::from([a.clone(), b.clone()]),
            "{}",
            env.tier
        );
        assert!(!shards[&a].is_open() && !shards[&b].is_open() && child.is_open());
        assert_eq!(
            child.hash_range,
            HashKeyRange {
                start: shards[&a].hash_range.start,
                end: shards[&b].hash_range.end
            }
        );
        let graph = ShardGraph::new(shards.values().cloned());
        assert_eq!(graph.check_coverage(), Ok(()));
        assert_eq!(graph.children(&a), vec![child.id.clone()]);
        for parent in [&a, &b] {
            let (_, ended) = env
                .read_all(&stream, parent, IteratorPosition::TrimHorizon, 1000)
                .await;
            assert!(ended);
        }
    }

    pub async fn millis_behind_latest(env: Env) {
        let stream = env.fresh(1).await;
        env.put(&stream, keys(20, "lag")).await;
        env.pause(Duration::from_millis(1500)).await;
        let shard = ShardId::from_index(0);
        let iterator = env
            .stream
            .get_shard_iterator(&stream, &shard, &IteratorPosition::TrimHorizon)
            .await
            .unwrap();
        let first = env.stream.get_records(&iterator, 5).await.unwrap();
        let behind = first.millis_behind_latest.unwrap_or(0);
        if env.expect.capabilities.millis_behind_latest {
            assert!(behind >= 1000, "{} reported {behind} ms behind", env.tier);
        } else {
            assert_eq!(behind, 0, "{} declared it does not report lag", env.tier);
        }
        let mut iterator = first.next_iterator.unwrap();
        loop {
            let batch = env.stream.get_records(&iterator, 100).await.unwrap();
            iterator = batch.next_iterator.unwrap();
            if batch.records.is_empty() {
                assert_eq!(batch.millis_behind_latest.unwrap_or(0), 0, "caught up");
                break;
            }
        }
    }

    pub async fn errors_are_typed(env: Env) {
        let err = env.stream.list_shards("no-such-stream").await.unwrap_err();
        assert!(
            matches!(err, StreamError::NotFound { .. }),
            "{}: {err:?}",
            env.tier
        );
        let stream = env.fresh(1).await;
        let shard = ShardId::from_index(0);
        let err = env
            .stream
            .get_shard_iterator(
                &stream,
                &ShardId::from_index(42),
                &IteratorPosition::TrimHorizon,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                StreamError::NotFound { .. } | StreamError::InvalidArgument { .. }
            ),
            "{}: {err:?}",
            env.tier
        );
        env.put(&stream, keys(2, "err")).await;
        let foreign = SequenceNumber::parse("1").unwrap();
        let err = env
            .stream
            .get_shard_iterator(&stream, &shard, &IteratorPosition::AtSequence(foreign))
            .await
            .unwrap_err();
        match env.expect.foreign_sequence {
            ForeignSequence::InvalidArgument => assert!(
                matches!(err, StreamError::InvalidArgument { .. }),
                "{}: {err:?}",
                env.tier
            ),
            ForeignSequence::NotFound => assert!(
                matches!(err, StreamError::NotFound { .. }),
                "{}: {err:?}",
                env.tier
            ),
        }

        let garbage = flotilla_actors::backend::ShardIterator("not-an-iterator".into());
        let err = env.stream.get_records(&garbage, 10).await.unwrap_err();
        match env.expect.garbage_iterator {
            GarbageIterator::InvalidArgument => assert!(
                matches!(err, StreamError::InvalidArgument { .. }),
                "{}: {err:?}",
                env.tier
            ),
            GarbageIterator::ServerError => assert!(
                matches!(
                    err,
                    StreamError::Other { .. } | StreamError::Transient { .. }
                ),
                "{}: {err:?}",
                env.tier
            ),
        }
        let err = env
            .stream
            .get_records(
                &env.stream
                    .get_shard_iterator(&stream, &shard, &IteratorPosition::TrimHorizon)
                    .await
                    .unwrap(),
                0,
            )
            .await
            .unwrap_err();
        assert!(
            matches!(err, StreamError::InvalidArgument { .. }),
            "{}: {err:?}",
            env.tier
        );
    }

    pub async fn iterators_expire(env: Env) {
        let stream = env.fresh(1).await;
        let shard = ShardId::from_index(0);
        env.put(&stream, keys(3, "exp")).await;
        let iterator = env
            .stream
            .get_shard_iterator(&stream, &shard, &IteratorPosition::TrimHorizon)
            .await
            .unwrap();
        match env.expect.expiry {
            Expiry::Advance(d) => tokio::time::advance(d).await,
            Expiry::Sleep(d) => tokio::time::sleep(d).await,
            Expiry::Fixed(why) => {
                // Declared, not skipped: the iterator must still work within its TTL.
                eprintln!("{}: expiry not exercised: {why}", env.tier);
                assert_eq!(
                    env.stream
                        .get_records(&iterator, 10)
                        .await
                        .unwrap()
                        .records
                        .len(),
                    3
                );
                return;
            }
        }
        let err = env.stream.get_records(&iterator, 10).await.unwrap_err();
        assert!(
            matches!(err, StreamError::IteratorExpired { .. }),
            "{}: {err:?}",
            env.tier
        );
    }
}

impl Env {
    /// Lets time pass: tokio's paused clock on the memory tier, the real one elsewhere.
    async fn pause(&self, d: Duration) {
        if matches!(self.expect.expiry, Expiry::Advance(_)) {
            tokio::time::advance(d).await;
        } else {
            tokio::time::sleep(d).await;
        }
    }

    fn wall_now(&self) -> std::time::SystemTime {
        self.clock
            .map(|c| c.wall())
            .unwrap_or_else(std::time::SystemTime::now)
    }
}

macro_rules! suite {
    ($tier:ident, $env:expr, $test:meta) => {
        mod $tier {
            use super::*;
            suite!(@cases [$test] $env;
                a_new_stream_lists_open_shards_covering_every_key,
                listing_pages_through_every_shard,
                puts_route_by_the_md5_of_the_partition_key,
                records_come_back_in_order_once_each,
                iterator_positions,
                a_split_closes_the_parent_and_names_it_in_the_children,
                a_merge_names_both_parents,
                millis_behind_latest,
                errors_are_typed,
                iterators_expire,
            );
        }
    };
    (@cases [$test:meta] $env:expr; $($case:ident),* $(,)?) => {
        $(
            #[$test]
            async fn $case() {
                cases::$case($env).await
            }
        )*
    };
}

suite!(
    memory,
    Env::memory().await,
    tokio::test(start_paused = true)
);
suite!(
    ferrokinesis,
    Env::ferrokinesis().await,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);
#[cfg(feature = "external-servers")]
suite!(
    kinesis_mock,
    Env::kinesis_mock().await,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);

/// An unreachable Kinesis is an error that names the endpoint.
#[tokio::test]
async fn an_unreachable_endpoint_is_named_in_the_error() {
    let sdk = servers::sdk_config();
    let stream = KinesisStream::new(&sdk, Some("http://127.0.0.1:1"));
    let err = flotilla_actors::backend::StreamClient::list_shards(&stream, "s")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("http://127.0.0.1:1"), "{err}");
    assert!(err.is_retryable(), "{err:?}");
}
