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
    Capabilities, Consumer, ConsumerStatus, IteratorPosition, PutRecord, Record, ShardEvent,
    ShardIterator, StreamAdmin, StreamClient, StreamError, Subscription,
};
use flotilla_actors::model::{
    HashKeyRange, SequenceNumber, Shard, ShardGraph, ShardId, partition_key_hash,
};
use support::servers;
use support::stripping_proxy::{Fault, Options, StrippingProxy};

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
    /// moto gives an iterator for any number.
    Accepted,
}

/// How ListShards pages.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Paging {
    /// By `ExclusiveStartShardId`: the tier lists in pages of [`LIST_PAGE`].
    ExclusiveStart,
    /// The server ignores `ExclusiveStartShardId` (moto pages by `NextToken` only):
    /// the tier lists in one page, as a worker does with the default page size.
    OnePage(&'static str),
}

/// What a split or merge does beyond the listing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Resharding {
    /// Closed parents end (SHARD_END) after their records; new records go to children.
    Full,
    /// Only the listing changes: a closed shard never ends and still takes new records
    /// (moto). The listing is checked; reading parents to their end cannot be.
    ListingOnly(&'static str),
}

struct Expect {
    capabilities: Capabilities,
    expiry: Expiry,
    garbage_iterator: GarbageIterator,
    ending_sequence: EndingSequence,
    foreign_sequence: ForeignSequence,
    /// Records carry `ApproximateArrivalTimestamp` (optional in the API).
    arrival_times: bool,
    paging: Paging,
    resharding: Resharding,
    /// GetRecords refuses `Limit` 0 (moto answers it like no limit).
    zero_limit_refused: bool,
    /// Why a put at hash key 2^128 - 1 fails, where it does (moto's shards exclude
    /// their ending hash key).
    top_hash_key_refused: Option<&'static str>,
    /// Why SubscribeToShard cannot be used, where it cannot (moto lacks it).
    no_subscribe: Option<&'static str>,
    /// Why a subscription AT or AFTER a sequence number starts elsewhere, where it does
    /// (ferrokinesis starts it at the shard's start; the reader drops what it had).
    subscribe_positions_ignored: Option<&'static str>,
    /// A second subscription of one consumer to one shard while the first is open is
    /// refused (`InUse`); `Some(why)` where the server accepts it.
    second_subscription_accepted: Option<&'static str>,
    /// A second RegisterStreamConsumer of one name is `InUse`; `Some(why)` where the
    /// server registers the name twice.
    duplicate_consumer_accepted: Option<&'static str>,
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
                arrival_times: true,
                paging: Paging::ExclusiveStart,
                resharding: Resharding::Full,
                zero_limit_refused: true,
                top_hash_key_refused: None,
                no_subscribe: None,
                subscribe_positions_ignored: None,
                second_subscription_accepted: None,
                duplicate_consumer_accepted: None,
            },
            tier: "memory",
        }
    }

    /// A tier behind the real Kinesis adapter, at `endpoint`.
    async fn server(endpoint: &str, expect: Expect, tier: &'static str) -> Env {
        let sdk = servers::sdk_config();
        let stream =
            KinesisStream::new(&sdk, Some(endpoint)).with_capabilities(expect.capabilities);
        let stream = match expect.paging {
            Paging::ExclusiveStart => stream.with_list_page_size(LIST_PAGE),
            Paging::OnePage(why) => {
                eprintln!("{tier}: listing in one page: {why}");
                stream
            }
        };
        Env {
            stream: Arc::new(stream),
            expect,
            tier,
            clock: None,
        }
    }

    async fn ferrokinesis() -> Env {
        Env::ferrokinesis_at(&servers::start_ferrokinesis(4).await).await
    }

    /// A ferrokinesis started with a 4 s iterator TTL, at `endpoint`.
    async fn ferrokinesis_at(endpoint: &str) -> Env {
        let expect = Expect {
            // No ChildShards from GetRecords; 0 ms behind on open shards.
            capabilities: Capabilities {
                child_shards_in_get_records: false,
                millis_behind_latest: false,
                shard_end_in_subscriptions: true,
                hash_ranges: true,
                max_records_per_call: 10_000,
                calls_metered: true,
            },
            expiry: Expiry::Sleep(Duration::from_millis(4500)),
            garbage_iterator: GarbageIterator::InvalidArgument,
            ending_sequence: EndingSequence::Exact,
            foreign_sequence: ForeignSequence::InvalidArgument,
            arrival_times: true,
            paging: Paging::ExclusiveStart,
            resharding: Resharding::Full,
            zero_limit_refused: true,
            top_hash_key_refused: None,
            no_subscribe: None,
            subscribe_positions_ignored: Some(
                "ferrokinesis starts every AT/AFTER_SEQUENCE_NUMBER subscription at \
                 TRIM_HORIZON",
            ),
            second_subscription_accepted: Some(
                "ferrokinesis serves any number of subscriptions to one shard",
            ),
            duplicate_consumer_accepted: None,
        };
        Env::server(endpoint, expect, "ferrokinesis").await
    }

    /// ferrokinesis, answering only what Kinesis promises for each call: no
    /// MillisBehindLatest, no arrival timestamps (`support/stripping_proxy.rs`).
    async fn stripped_ferrokinesis() -> Env {
        let upstream = servers::start_ferrokinesis(4).await;
        let proxy = StrippingProxy::start(&upstream, Options::default()).await;
        let mut env = Env::ferrokinesis_at(proxy.url()).await;
        env.tier = "stripped_ferrokinesis";
        env.expect.arrival_times = false;
        env
    }

    #[cfg_attr(not(feature = "external-servers"), allow(dead_code))]
    async fn moto() -> Env {
        let endpoint = servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT");
        let expect = Expect {
            // ChildShards never (a closed shard never ends); MillisBehindLatest is
            // measured from the newest record, not from now.
            capabilities: Capabilities {
                child_shards_in_get_records: false,
                millis_behind_latest: false,
                shard_end_in_subscriptions: false,
                hash_ranges: true,
                max_records_per_call: 10_000,
                calls_metered: true,
            },
            expiry: Expiry::Fixed("moto's iterators never expire"),
            garbage_iterator: GarbageIterator::ServerError,
            ending_sequence: EndingSequence::Exact,
            foreign_sequence: ForeignSequence::Accepted,
            arrival_times: true,
            paging: Paging::OnePage("moto ignores ExclusiveStartShardId"),
            resharding: Resharding::ListingOnly(
                "moto never ends a closed shard, and routes new records to it",
            ),
            zero_limit_refused: false,
            top_hash_key_refused: Some("moto's shards exclude their EndingHashKey"),
            no_subscribe: Some("moto has no SubscribeToShard (it answers a bare 500)"),
            subscribe_positions_ignored: None,
            second_subscription_accepted: None,
            duplicate_consumer_accepted: Some(
                "moto registers a second consumer of the same name and ARN",
            ),
        };
        Env::server(&endpoint, expect, "moto").await
    }

    #[cfg_attr(not(feature = "external-servers"), allow(dead_code))]
    async fn kinesis_mock() -> Env {
        let endpoint = servers::external_endpoint("FLOTILLA_TEST_KINESIS_MOCK_ENDPOINT");
        let expect = Expect {
            // ChildShards, yes; MillisBehindLatest is always 0.
            // A closed shard's subscription never ends nor names the children.
            capabilities: Capabilities {
                child_shards_in_get_records: true,
                millis_behind_latest: false,
                shard_end_in_subscriptions: false,
                hash_ranges: true,
                max_records_per_call: 10_000,
                calls_metered: true,
            },
            expiry: Expiry::Fixed("kinesis-mock's iterator TTL is a fixed five minutes"),
            garbage_iterator: GarbageIterator::ServerError,
            ending_sequence: EndingSequence::Placeholder("9223372036854775807"),
            foreign_sequence: ForeignSequence::NotFound,
            arrival_times: true,
            paging: Paging::ExclusiveStart,
            resharding: Resharding::Full,
            zero_limit_refused: true,
            top_hash_key_refused: None,
            no_subscribe: None,
            subscribe_positions_ignored: None,
            second_subscription_accepted: None,
            duplicate_consumer_accepted: None,
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
    /// Whether the tier has no SubscribeToShard (declared, and said).
    fn no_fanout(&self) -> bool {
        if let Some(why) = self.expect.no_subscribe {
            eprintln!("{}: no fan-out ({why})", self.tier);
        }
        self.expect.no_subscribe.is_some()
    }

    /// The stream's ARN and an ACTIVE consumer of it, named for the test.
    async fn consumer(&self, stream: &str) -> (String, Consumer) {
        let arn = self
            .stream
            .describe_stream_summary(stream)
            .await
            .unwrap()
            .arn;
        let consumer = flotilla_actors::fanout::ensure_consumer(
            self.stream.as_ref(),
            stream,
            &arn,
            &servers::unique_name("consumer"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
        (arn, consumer)
    }

    /// Subscribes, retrying while the server still holds a previous subscription or
    /// asks to slow down (kinesis-mock keeps a closed one for 2-3 s). Errors that
    /// arrive as the first event (kinesis-mock sends them so) count as the subscribe's:
    /// the first event is pulled here and handed out first.
    async fn subscribe(
        &self,
        consumer: &Consumer,
        shard: &ShardId,
        position: IteratorPosition,
    ) -> Box<dyn Subscription> {
        for _ in 0..100 {
            let subscribed = self
                .stream
                .subscribe_to_shard(&consumer.arn, shard, &position)
                .await;
            let first = match subscribed {
                Ok(mut subscription) => match subscription.next_event().await {
                    Ok(first) => Ok((subscription, first)),
                    Err(error) => Err(error),
                },
                Err(error) => Err(error),
            };
            match first {
                Ok((inner, first)) => return Box::new(Primed { first, inner }),
                Err(StreamError::InUse { .. } | StreamError::Throttled { .. }) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => panic!("{}: SubscribeToShard: {error}", self.tier),
            }
        }
        panic!("{}: {shard} stayed in use for 20 s", self.tier);
    }

    /// Pulls events until `want` records came (or the subscription ended, or 30 s of
    /// waiting); the records and every event.
    async fn collect(
        &self,
        subscription: &mut Box<dyn Subscription>,
        want: usize,
    ) -> (Vec<Record>, Vec<ShardEvent>) {
        self.collect_until(subscription, |records| records.len() >= want)
            .await
    }

    /// Pulls events until `done` says so of the records so far (or the subscription
    /// ended, or 30 s of waiting).
    async fn collect_until(
        &self,
        subscription: &mut Box<dyn Subscription>,
        done: impl Fn(&[Record]) -> bool,
    ) -> (Vec<Record>, Vec<ShardEvent>) {
        let mut records = Vec::new();
        let mut events = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !done(&records) {
            let next = tokio::time::timeout_at(deadline, subscription.next_event()).await;
            match next {
                Ok(Ok(Some(event))) => {
                    records.extend(event.records.iter().cloned());
                    events.push(event);
                }
                Ok(Ok(None)) | Err(_) => break,
                Ok(Err(error)) => panic!("{}: subscription event: {error}", self.tier),
            }
        }
        (records, events)
    }

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

/// A subscription whose first event was pulled already: it comes first.
struct Primed {
    first: Option<ShardEvent>,
    inner: Box<dyn Subscription>,
}

impl Subscription for Primed {
    fn next_event(
        &mut self,
    ) -> futures::future::BoxFuture<'_, Result<Option<ShardEvent>, StreamError>> {
        match self.first.take() {
            Some(first) => Box::pin(async move { Ok(Some(first)) }),
            None => self.inner.next_event(),
        }
    }
}

/// The hash ranges of the two children of a split of `range` at `mid`.
fn halves(range: HashKeyRange, mid: u128) -> [HashKeyRange; 2] {
    [
        HashKeyRange {
            start: range.start,
            end: mid - 1,
        },
        HashKeyRange {
            start: mid,
            end: range.end,
        },
    ]
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
        let put_at = |key: u128| {
            let (stream, client) = (&stream, &env.stream);
            async move {
                client
                    .put_records(
                        stream,
                        &[PutRecord {
                            partition_key: "any".into(),
                            explicit_hash_key: Some(key),
                            data: Bytes::from_static(b"x"),
                        }],
                    )
                    .await
            }
        };
        let top = if let Some(why) = env.expect.top_hash_key_refused {
            // Declared: the top key fails; the one below it routes by the hash.
            let err = put_at(u128::MAX).await.unwrap_err();
            eprintln!("{}: the top hash key is refused ({why}): {err}", env.tier);
            u128::MAX - 1
        } else {
            u128::MAX
        };
        let put = put_at(top).await.unwrap();
        assert_eq!(put[0].shard, last.id, "{}", env.tier);
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
                assert_eq!(
                    record.approximate_arrival.is_some(),
                    env.expect.arrival_times
                );
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
        assert_eq!(ranges, halves(range, mid));
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
        if let Resharding::ListingOnly(why) = env.expect.resharding {
            assert!(!ended, "{} declared: {why}", env.tier);
            return;
        }
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
            match env.expect.resharding {
                Resharding::Full => assert!(ended, "{}", env.tier),
                Resharding::ListingOnly(why) => assert!(!ended, "{} declared: {why}", env.tier),
            }
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
        let answer = env
            .stream
            .get_shard_iterator(&stream, &shard, &IteratorPosition::AtSequence(foreign))
            .await;
        match env.expect.foreign_sequence {
            ForeignSequence::InvalidArgument => assert!(
                matches!(answer, Err(StreamError::InvalidArgument { .. })),
                "{}: {answer:?}",
                env.tier
            ),
            ForeignSequence::NotFound => assert!(
                matches!(answer, Err(StreamError::NotFound { .. })),
                "{}: {answer:?}",
                env.tier
            ),
            ForeignSequence::Accepted => assert!(answer.is_ok(), "{}: {answer:?}", env.tier),
        }

        let garbage = flotilla_actors::backend::ShardIterator("not-an-iterator".into());
        let err = env.stream.get_records(&garbage, 10).await.unwrap_err();
        match env.expect.garbage_iterator {
            GarbageIterator::InvalidArgument => assert!(
                matches!(err, StreamError::InvalidArgument { .. }),
                "{}: {err:?}",
                env.tier
            ),
            // A bare 500 cannot be told apart from a server fault: transient.
            GarbageIterator::ServerError => assert!(
                matches!(err, StreamError::Transient { .. }),
                "{}: {err:?}",
                env.tier
            ),
        }
        let iterator = env
            .stream
            .get_shard_iterator(&stream, &shard, &IteratorPosition::TrimHorizon)
            .await
            .unwrap();
        let answer = env.stream.get_records(&iterator, 0).await;
        if env.expect.zero_limit_refused {
            assert!(
                matches!(answer, Err(StreamError::InvalidArgument { .. })),
                "{}: {answer:?}",
                env.tier
            );
        } else {
            assert!(
                answer.is_ok(),
                "{} declared Limit 0 accepted: {answer:?}",
                env.tier
            );
        }
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

    pub async fn consumers_are_registered_once_listed_and_deregistered(env: Env) {
        let stream = env.fresh(1).await;
        let arn = env
            .stream
            .describe_stream_summary(&stream)
            .await
            .unwrap()
            .arn;
        let name = servers::unique_name("app");
        let registered = env
            .stream
            .register_stream_consumer(&arn, &name)
            .await
            .unwrap();
        assert_eq!(registered.name, name, "{}", env.tier);
        assert!(registered.arn.contains(&name), "{}", registered.arn);
        let again = env.stream.register_stream_consumer(&arn, &name).await;
        match env.expect.duplicate_consumer_accepted {
            None => assert!(
                matches!(again, Err(StreamError::InUse { .. })),
                "{}: {again:?}",
                env.tier
            ),
            Some(why) => eprintln!("{}: a duplicate consumer is accepted ({why})", env.tier),
        }
        let mut status = registered.status.clone();
        for _ in 0..300 {
            if status == ConsumerStatus::Active {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            status = env
                .stream
                .describe_stream_consumer(&arn, &name)
                .await
                .unwrap()
                .status;
        }
        assert_eq!(status, ConsumerStatus::Active, "{}", env.tier);
        let listed = env.stream.list_stream_consumers(&arn).await.unwrap();
        assert!(
            listed
                .iter()
                .any(|c| c.name == name && c.arn == registered.arn),
            "{}: {listed:?}",
            env.tier
        );
        env.stream
            .deregister_stream_consumer(&registered.arn)
            .await
            .unwrap();
        // DELETING for a while on some servers, then gone.
        let mut gone = None;
        for _ in 0..300 {
            match env.stream.describe_stream_consumer(&arn, &name).await {
                Err(error @ StreamError::NotFound { .. }) => {
                    gone = Some(error);
                    break;
                }
                Ok(c) if c.status == ConsumerStatus::Deleting => {}
                Ok(c) if env.expect.duplicate_consumer_accepted.is_some() => {
                    // The duplicate registered above; deregistered by the same ARN.
                    let _ = env.stream.deregister_stream_consumer(&c.arn).await;
                }
                other => panic!("{}: after deregistering: {other:?}", env.tier),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(gone.is_some(), "{}: the consumer was never gone", env.tier);
        let err = env
            .stream
            .describe_stream_consumer(&arn, "no-such-consumer")
            .await
            .unwrap_err();
        assert!(matches!(err, StreamError::NotFound { .. }), "{err:?}");
    }

    pub async fn a_subscription_delivers_in_order_and_resumes_after_its_continuation(env: Env) {
        let stream = env.fresh(1).await;
        let shard = ShardId::from_index(0);
        let (_, consumer) = env.consumer(&stream).await;
        if let Some(why) = env.expect.no_subscribe {
            let err = env
                .stream
                .subscribe_to_shard(&consumer.arn, &shard, &IteratorPosition::TrimHorizon)
                .await
                .map(|_| ())
                .unwrap_err();
            eprintln!("{}: no fan-out ({why}): {err}", env.tier);
            return;
        }
        let first = env.put(&stream, keys(50, "efo")).await;
        let mut subscription = env
            .subscribe(&consumer, &shard, IteratorPosition::TrimHorizon)
            .await;
        let (got, events) = env.collect(&mut subscription, first.len()).await;
        let sequences = |records: &[Record]| -> Vec<SequenceNumber> {
            records.iter().map(|r| r.sequence_number.clone()).collect()
        };
        let want: Vec<SequenceNumber> = first.iter().map(|(_, _, s)| s.clone()).collect();
        assert_eq!(sequences(&got), want, "{}", env.tier);
        assert!(
            got.iter()
                .zip(&first)
                .all(|(r, (key, _, _))| &r.partition_key == key && r.data == format!("data-{key}")),
            "{}",
            env.tier
        );
        let continuation = events
            .iter()
            .rev()
            .find_map(|e| e.continuation.clone())
            .expect("events carry a continuation");
        assert!(events.iter().all(|e| !e.is_shard_end()), "{}", env.tier);
        drop(subscription);

        // What comes after, from AT the continuation: the last record again where the
        // continuation is that record, nothing before it, and no gap. The reader drops
        // what it delivered already; so does this check.
        let last = got.last().unwrap().sequence_number.clone();
        let second = env.put(&stream, keys(20, "efo-next")).await;
        let newest = second.last().unwrap().2.clone();
        let mut subscription = env
            .subscribe(
                &consumer,
                &shard,
                IteratorPosition::AtSequence(continuation),
            )
            .await;
        let (got, _) = env
            .collect_until(&mut subscription, |r| {
                r.last().is_some_and(|r| r.sequence_number == newest)
            })
            .await;
        let (again, after): (Vec<SequenceNumber>, Vec<SequenceNumber>) =
            sequences(&got).into_iter().partition(|s| s <= &last);
        let want: Vec<SequenceNumber> = second.iter().map(|(_, _, s)| s.clone()).collect();
        assert_eq!(after, want, "{}: the seam", env.tier);
        match env.expect.subscribe_positions_ignored {
            None => assert!(again.len() <= 1, "{}: {again:?} again", env.tier),
            Some(why) => eprintln!(
                "{}: {} records before the seam sent again ({why})",
                env.tier,
                again.len()
            ),
        }
    }

    pub async fn a_closed_shards_subscription_ends_naming_its_children(env: Env) {
        if env.no_fanout() {
            return;
        }
        let stream = env.fresh(1).await;
        let parent = ShardId::from_index(0);
        let range = env.shard_map(&stream).await[&parent].hash_range;
        let put = env.put(&stream, keys(10, "pre")).await;
        let mid = range.start + (range.end - range.start) / 2;
        env.stream.split_shard(&stream, &parent, mid).await.unwrap();
        let (_, consumer) = env.consumer(&stream).await;
        let mut subscription = env
            .subscribe(&consumer, &parent, IteratorPosition::TrimHorizon)
            .await;
        let (got, mut events) = env.collect(&mut subscription, put.len()).await;
        assert_eq!(got.len(), put.len(), "{}", env.tier);
        if !env.expect.capabilities.shard_end_in_subscriptions {
            // Declared: for 3 s, only empty events that end nothing, and the subscription
            // stays open; the reader asks GetRecords instead.
            let deadline = tokio::time::Instant::now() + Duration::from_secs(3);
            let mut idle = Vec::new();
            while let Ok(next) = tokio::time::timeout_at(deadline, subscription.next_event()).await
            {
                match next.unwrap() {
                    Some(event) => idle.push(event),
                    None => panic!("{}: the subscription ended (no longer a gap?)", env.tier),
                }
            }
            assert!(!idle.is_empty(), "{}: no event in 3 s", env.tier);
            assert!(idle.iter().all(|e| e.records.is_empty()), "{}", env.tier);
            assert!(idle.iter().all(|e| !e.is_shard_end()), "{}", env.tier);
            eprintln!(
                "{}: a closed shard's subscription never ends (declared)",
                env.tier
            );
            return;
        }
        while !events.last().is_some_and(ShardEvent::is_shard_end) {
            match subscription.next_event().await.unwrap() {
                Some(event) => {
                    assert!(event.records.is_empty(), "{}", env.tier);
                    events.push(event);
                }
                None => panic!("{}: ended without naming the children", env.tier),
            }
        }
        let end = events.last().unwrap();
        let mut children: Vec<HashKeyRange> =
            end.child_shards.iter().map(|c| c.hash_range).collect();
        children.sort();
        assert_eq!(children, halves(range, mid), "{}", env.tier);
        assert!(
            end.child_shards
                .iter()
                .all(|c| c.parents == [parent.clone()]),
            "{}",
            env.tier
        );
        let after = tokio::time::timeout(Duration::from_secs(10), subscription.next_event())
            .await
            .expect("the subscription ends after the shard's end");
        assert!(matches!(after, Ok(None)), "{}: {after:?}", env.tier);
    }

    pub async fn a_second_subscription_to_a_shard_is_in_use(env: Env) {
        if env.no_fanout() {
            return;
        }
        let stream = env.fresh(1).await;
        let shard = ShardId::from_index(0);
        let (_, consumer) = env.consumer(&stream).await;
        let mut first = env
            .subscribe(&consumer, &shard, IteratorPosition::Latest)
            .await;
        assert!(first.next_event().await.unwrap().is_some());
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let second = match env
            .stream
            .subscribe_to_shard(&consumer.arn, &shard, &IteratorPosition::Latest)
            .await
        {
            Ok(mut second) => second.next_event().await.map(|_| ()),
            Err(error) => Err(error),
        };
        match env.expect.second_subscription_accepted {
            None => assert!(
                matches!(second, Err(StreamError::InUse { .. })),
                "{}: {second:?}",
                env.tier
            ),
            Some(why) => {
                assert!(second.is_ok(), "{}: {second:?}", env.tier);
                eprintln!("{}: a second subscription is accepted ({why})", env.tier);
            }
        }
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
                consumers_are_registered_once_listed_and_deregistered,
                a_subscription_delivers_in_order_and_resumes_after_its_continuation,
                a_closed_shards_subscription_ends_naming_its_children,
                a_second_subscription_to_a_shard_is_in_use,
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
suite!(
    stripped_ferrokinesis,
    Env::stripped_ferrokinesis().await,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);
#[cfg(feature = "external-servers")]
suite!(
    moto,
    Env::moto().await,
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

/// ferrokinesis behind a stripping proxy, a 1-shard stream with three records, and an
/// iterator at its start.
async fn proxied_stream() -> (StrippingProxy, KinesisStream, String, ShardIterator) {
    let upstream = servers::start_ferrokinesis(300).await;
    let proxy = StrippingProxy::start(&upstream, Options::default()).await;
    let stream = KinesisStream::new(&servers::sdk_config(), Some(proxy.url()));
    let name = servers::unique_name("stream");
    stream.create_stream(&name, 1).await.unwrap();
    let records: Vec<PutRecord> = keys(3, "k")
        .into_iter()
        .map(|k| PutRecord {
            partition_key: k,
            explicit_hash_key: None,
            data: Bytes::from_static(b"x"),
        })
        .collect();
    stream.put_records(&name, &records).await.unwrap();
    let iterator = stream
        .get_shard_iterator(
            &name,
            &ShardId::from_index(0),
            &IteratorPosition::TrimHorizon,
        )
        .await
        .unwrap();
    (proxy, stream, name, iterator)
}

/// An HTTP 500 without an error code is transient (a reader backs off and retries; it
/// does not restart the shard), and the next call goes through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_500_is_transient() {
    let (proxy, stream, name, iterator) = proxied_stream().await;
    // More than the SDK's own attempts (3), so the adapter sees the failure.
    proxy.fault_next("GetRecords", 3, Fault::Bare500);
    let err = stream.get_records(&iterator, 10).await.unwrap_err();
    assert!(
        matches!(err, StreamError::Transient { .. }) && err.is_retryable(),
        "{err:?}"
    );
    assert_eq!(proxy.calls("GetRecords"), 3, "the SDK tried three times");
    assert_eq!(
        stream
            .get_records(&iterator, 10)
            .await
            .unwrap()
            .records
            .len(),
        3
    );
    proxy.fault_next("ListShards", 3, Fault::Bare500);
    let err = stream.list_shards(&name).await.unwrap_err();
    assert!(matches!(err, StreamError::Transient { .. }), "{err:?}");
}

/// Children named without their hash ranges (a lease row needs them) are taken as not
/// reported: the batch still ends the shard, and the watcher lists the children.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn children_without_hash_ranges_are_left_to_the_listing() {
    let (proxy, stream, _, iterator) = proxied_stream().await;
    let child = |range: Option<(&str, &str)>| {
        let mut child = serde_json::json!({
            "ShardId": "shardId-000000000001",
            "ParentShards": ["shardId-000000000000"],
        });
        if let Some((start, end)) = range {
            child["HashKeyRange"] =
                serde_json::json!({"StartingHashKey": start, "EndingHashKey": end});
        }
        serde_json::json!({"Records": [], "ChildShards": [child]})
    };
    proxy.fault_next("GetRecords", 1, Fault::Answer(child(None)));
    let batch = stream.get_records(&iterator, 10).await.unwrap();
    assert!(batch.is_shard_end());
    assert_eq!(batch.child_shards, None);
    assert_eq!(batch.millis_behind_latest, None);

    proxy.fault_next("GetRecords", 1, Fault::Answer(child(Some(("0", "99")))));
    let batch = stream.get_records(&iterator, 10).await.unwrap();
    let children = batch.child_shards.unwrap();
    assert_eq!(
        (children[0].id.as_str(), children[0].hash_range),
        ("shardId-000000000001", HashKeyRange { start: 0, end: 99 })
    );
}

/// What a call truly needs and does not get is an error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_shard_iterator_is_named() {
    let (proxy, stream, name, _) = proxied_stream().await;
    proxy.fault_next("GetShardIterator", 1, Fault::Answer(serde_json::json!({})));
    let err = stream
        .get_shard_iterator(&name, &ShardId::from_index(0), &IteratorPosition::Latest)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            StreamError::IncompleteAnswer {
                missing: "ShardIterator",
                ..
            }
        ),
        "{err:?}"
    );
}
