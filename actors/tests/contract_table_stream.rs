//! The DynamoDB Streams contract: [`StreamClient`] + [`TableStreamAdmin`] over a
//! table's change stream, the same cases on every backend. `dynoxide` (a DynamoDB with
//! streams, started in this test process) always runs; with the `external-servers`
//! feature, `dynamodb_local` (AWS's DynamoDB Local 1.25.1) and `moto` (5.2.5), both
//! started by scripts/test.sh, run too and fail loudly without their servers. Where a
//! server falls short of DynamoDB Streams, its tier says so in its [`Expect`], and the
//! case checks that declared behaviour (so a declaration that stops being true fails)
//! instead of skipping.
//!
//! Every case is an `async fn` over an [`Env`], whose backend is an
//! `Arc<dyn TableStreamAdmin>`: an in-memory implementation becomes a tier by adding
//! one `Env` constructor and one `suite!` line (paused time: `Expiry::Advance`,
//! `Rotation::Forced`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod support;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;

use flotilla_actors::backend::aws::DynamoStreams;
use flotilla_actors::backend::memory::{MemoryTableStreams, MemoryTableStreamsConfig};
use flotilla_actors::backend::{
    Capabilities, ItemWrite, IteratorPosition, Record, ShardIterator, StreamError, TABLE_KEY,
    TableStreamAdmin,
};
use flotilla_actors::model::change::{AttributeValue, ChangeKind, Item, item_key_text};
use flotilla_actors::model::{HashKeyRange, SequenceNumber, Shard, ShardId};
use support::servers;

/// How a tier's iterators can be made to expire within a test.
enum Expiry {
    /// Advance paused tokio time by this much: past the TTL.
    Advance(std::time::Duration),
    /// The server's TTL is fixed (15 minutes on DynamoDB): the expiry path is
    /// exercised on the tiers that can shorten it, and this says why not here.
    Fixed(&'static str),
}

/// Closes the open shards of the named table's stream, each continued by a child.
type Rotate = Box<dyn Fn(&str) -> BoxFuture<'static, ()> + Send + Sync>;

/// Whether a test can make the stream close a shard and open its child. DynamoDB
/// rotates a table's shards by itself (about every four hours); nothing asks it to.
enum Rotation {
    /// This closes the table's open shards, each continued by a child naming it.
    Forced(Rotate),
    /// The server never closes a shard within a test: checked (every shard stays open
    /// through the suite's writes), with why.
    Never(&'static str),
}

/// What an answer that a server gets wrong is, where it does.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Answer {
    /// What DynamoDB Streams answers.
    AsDynamoDb,
    /// A bare HTTP 500 (moto's Flask error page, DynamoDB Local's InternalFailure): a
    /// 5xx is always `Transient` to the adapter.
    ServerError(&'static str),
    /// The server gives an iterator anyway (which then reads nothing).
    Accepted(&'static str),
}

struct Expect {
    expiry: Expiry,
    rotation: Rotation,
    /// GetRecords of a garbage iterator: `InvalidArgument` on DynamoDB.
    garbage_iterator: Answer,
    /// GetShardIterator of a shard the stream does not have: `NotFound` on DynamoDB.
    unknown_shard: Answer,
    /// AT_SEQUENCE_NUMBER of a number the shard never held: `InvalidArgument` on
    /// DynamoDB (AWS documents a ValidationException; it is past the shard's end).
    foreign_sequence: Answer,
    /// An open shard with records is listed with an `EndingSequenceNumber` (its last
    /// record's), and yet keeps taking records and never ends: where a server does so.
    open_shard_has_end: Option<&'static str>,
}

struct Env {
    streams: Arc<dyn TableStreamAdmin>,
    expect: Expect,
    tier: &'static str,
    /// Makes a table without a stream, which [`TableStreamAdmin`] cannot: around the
    /// port, through the server's DynamoDB endpoint, or the memory backend's own call.
    plain_table: MakeTable,
}

/// Makes the named table, without a stream.
type MakeTable = Box<dyn Fn(&str) -> BoxFuture<'static, ()> + Send + Sync>;

impl Env {
    fn server(endpoint: String, expect: Expect, tier: &'static str) -> Env {
        Env {
            streams: Arc::new(DynamoStreams::new(&servers::sdk_config(), Some(&endpoint))),
            expect,
            tier,
            plain_table: Box::new(move |table| {
                let (endpoint, table) = (endpoint.clone(), table.to_owned());
                Box::pin(async move { plain_table(&endpoint, &table).await })
            }),
        }
    }

    /// The memory backend, in paused time: iterators expire when time is advanced past
    /// their 15 minutes, and shards rotate on demand.
    async fn memory() -> Env {
        let config = MemoryTableStreamsConfig::default();
        let ttl = config.iterator_ttl;
        let streams = MemoryTableStreams::new(config);
        let (rotating, plain) = (streams.clone(), streams.clone());
        Env {
            streams: Arc::new(streams),
            tier: "memory",
            plain_table: Box::new(move |table| {
                plain.create_table_without_stream(table).unwrap();
                Box::pin(async {})
            }),
            expect: Expect {
                expiry: Expiry::Advance(ttl + std::time::Duration::from_secs(1)),
                rotation: Rotation::Forced(Box::new(move |table| {
                    let arn = rotating.stream_arn(table).unwrap();
                    rotating.rotate_all(&arn).unwrap();
                    Box::pin(async {})
                })),
                garbage_iterator: Answer::AsDynamoDb,
                unknown_shard: Answer::AsDynamoDb,
                foreign_sequence: Answer::AsDynamoDb,
                open_shard_has_end: None,
            },
        }
    }

    async fn dynoxide() -> Env {
        Env::server(
            servers::start_dynoxide().await,
            Expect {
                expiry: Expiry::Fixed("dynoxide's iterators never expire"),
                rotation: Rotation::Never("dynoxide has one shard per table, for ever"),
                garbage_iterator: Answer::AsDynamoDb,
                unknown_shard: Answer::Accepted(
                    "dynoxide gives an iterator for any shard id (it reads nothing)",
                ),
                foreign_sequence: Answer::AsDynamoDb,
                open_shard_has_end: Some(
                    "dynoxide lists its one shard with EndingSequenceNumber = its last \
                     record, though the shard stays open",
                ),
            },
            "dynoxide",
        )
    }

    #[cfg(feature = "external-servers")]
    async fn dynamodb_local() -> Env {
        Env::server(
            servers::external_endpoint("FLOTILLA_TEST_DYNAMODB_LOCAL_ENDPOINT"),
            Expect {
                expiry: Expiry::Fixed("DynamoDB Local's iterators live 15 minutes"),
                rotation: Rotation::Never(
                    "DynamoDB Local keeps one open shard per stream within a test",
                ),
                garbage_iterator: Answer::AsDynamoDb,
                unknown_shard: Answer::AsDynamoDb,
                foreign_sequence: Answer::ServerError(
                    "DynamoDB Local answers AT_SEQUENCE_NUMBER past the shard's end with \
                     a 500 InternalFailure",
                ),
                open_shard_has_end: None,
            },
            "dynamodb_local",
        )
    }

    #[cfg(feature = "external-servers")]
    async fn moto() -> Env {
        Env::server(
            servers::external_endpoint("FLOTILLA_TEST_MOTO_ENDPOINT"),
            Expect {
                expiry: Expiry::Fixed("moto's iterators never expire"),
                rotation: Rotation::Never("moto has one shard per stream, for ever"),
                garbage_iterator: Answer::ServerError(
                    "moto answers a garbage iterator with a bare HTTP 500",
                ),
                unknown_shard: Answer::ServerError(
                    "moto answers an unknown shard with a bare HTTP 500",
                ),
                foreign_sequence: Answer::Accepted(
                    "moto gives an iterator for any sequence number",
                ),
                open_shard_has_end: None,
            },
            "moto",
        )
    }

    /// A new table with a stream: its name and the stream's ARN.
    async fn fresh(&self) -> (String, String) {
        let table = servers::unique_name("flotilla-ts");
        let arn = self
            .streams
            .create_table_with_stream(&table)
            .await
            .unwrap_or_else(|e| panic!("{}: create {table}: {e}", self.tier));
        (table, arn)
    }

    async fn write(&self, table: &str, writes: &[ItemWrite]) {
        self.streams
            .write_items(table, writes)
            .await
            .unwrap_or_else(|e| panic!("{}: write to {table}: {e}", self.tier));
    }

    async fn shards(&self, arn: &str) -> Vec<Shard> {
        self.streams
            .list_shards(arn)
            .await
            .unwrap_or_else(|e| panic!("{}: list {arn}: {e}", self.tier))
    }

    async fn iterator(&self, arn: &str, shard: &ShardId, at: &IteratorPosition) -> ShardIterator {
        self.streams
            .get_shard_iterator(arn, shard, at)
            .await
            .unwrap_or_else(|e| panic!("{}: iterator {shard} {at:?}: {e}", self.tier))
    }

    /// Reads from `iterator` in batches of `limit` until `want` records have come, the
    /// shard ends, or a batch is empty: what there is, and whether the shard ended.
    async fn read(&self, iterator: ShardIterator, limit: u32, want: usize) -> (Vec<Record>, bool) {
        let mut records = Vec::new();
        let mut next = Some(iterator);
        while let Some(iterator) = next.take() {
            let batch = self
                .streams
                .get_records(&iterator, limit)
                .await
                .unwrap_or_else(|e| panic!("{}: get_records: {e}", self.tier));
            assert!(
                batch.records.len() <= limit as usize,
                "{}: {} records for a limit of {limit}",
                self.tier,
                batch.records.len()
            );
            assert!(batch.child_shards.is_none() && batch.millis_behind_latest.is_none());
            let empty = batch.records.is_empty();
            records.extend(batch.records);
            if batch.next_iterator.is_none() {
                return (records, true);
            }
            if empty || records.len() >= want {
                return (records, false);
            }
            next = batch.next_iterator;
        }
        (records, false)
    }

    /// Every record of the stream from TRIM_HORIZON, shard by shard (parents first: the
    /// listing's order), in batches of `limit`.
    async fn read_all(&self, arn: &str, limit: u32, want: usize) -> Vec<Record> {
        let mut all = Vec::new();
        for shard in self.shards(arn).await {
            let iterator = self
                .iterator(arn, &shard.id, &IteratorPosition::TrimHorizon)
                .await;
            let (records, _) = self.read(iterator, limit, want).await;
            all.extend(records);
        }
        all
    }

    /// Checks the declared [`Rotation::Never`] and [`Expect::open_shard_has_end`]:
    /// after the case's writes, no shard was closed (an ending number only where the
    /// server is declared to report one on an open shard, which must still read on).
    async fn check_no_rotation(&self, arn: &str) {
        let Rotation::Never(why) = &self.expect.rotation else {
            return;
        };
        let shards = self.shards(arn).await;
        assert_eq!(
            shards.len(),
            1,
            "{}: one shard ({why}): {shards:?}",
            self.tier
        );
        let shard = &shards[0];
        match self.expect.open_shard_has_end {
            None => assert!(shard.is_open(), "{}: {why}: {shard:?}", self.tier),
            Some(gap) => {
                assert!(
                    !shard.is_open(),
                    "{}: declared ({gap}): {shard:?}",
                    self.tier
                );
                let iterator = self
                    .iterator(arn, &shard.id, &IteratorPosition::Latest)
                    .await;
                let batch = self.streams.get_records(&iterator, 10).await.unwrap();
                assert!(
                    !batch.is_shard_end(),
                    "{}: a shard listed with an end must still read on ({gap})",
                    self.tier
                );
                eprintln!("{}: {gap}", self.tier);
            }
        }
    }
}

fn item(key: &str, version: u32) -> Item {
    BTreeMap::from([
        (TABLE_KEY.to_owned(), AttributeValue::S(key.to_owned())),
        ("v".to_owned(), AttributeValue::N(version.to_string())),
        (
            "tags".to_owned(),
            AttributeValue::L(vec![
                AttributeValue::B("AAE=".to_owned()),
                AttributeValue::Bool(true),
                AttributeValue::Null(true),
            ]),
        ),
    ])
}

fn put(key: &str, version: u32) -> ItemWrite {
    ItemWrite::Put {
        attributes: item(key, version),
    }
}

fn key_of(key: &str) -> Item {
    BTreeMap::from([(TABLE_KEY.to_owned(), AttributeValue::S(key.to_owned()))])
}

/// What a change carries, in short: kind, new image's version, old image's version.
type Seen = (ChangeKind, Option<String>, Option<String>);

fn version(image: &Option<Item>) -> Option<String> {
    image.as_ref().map(|i| {
        i.get("v")
            .and_then(AttributeValue::as_n)
            .unwrap_or("?")
            .to_owned()
    })
}

mod cases {
    use super::*;

    pub async fn a_table_names_its_stream(env: Env) {
        let (table, arn) = env.fresh().await;
        let by_table = env
            .streams
            .describe_stream_summary(&format!("dynamodb:{table}"))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", env.tier));
        assert_eq!(by_table.arn, arn, "{}", env.tier);
        assert_eq!(by_table.name, table, "{}", env.tier);
        assert_eq!(by_table.status, "ENABLED", "{}", env.tier);
        assert_eq!(by_table.retention_hours, 24);
        assert!(by_table.open_shard_count >= 1, "{}: {by_table:?}", env.tier);
        let by_arn = env.streams.describe_stream_summary(&arn).await.unwrap();
        assert_eq!(by_arn, by_table, "{}", env.tier);
        assert_eq!(env.streams.capabilities(), Capabilities::TABLE_STREAM);

        let shards = env.shards(&arn).await;
        assert!(!shards.is_empty(), "{}", env.tier);
        eprintln!("{}: a new stream has {} shard(s)", env.tier, shards.len());
        for shard in &shards {
            assert_eq!(shard.hash_range, HashKeyRange::FULL, "{}", env.tier);
            assert_eq!(shard.adjacent_parent, None);
            assert!(
                shard.is_open(),
                "{}: a new stream's shard: {shard:?}",
                env.tier
            );
        }

        env.streams.delete_table(&table).await.unwrap();
    }

    pub async fn a_table_without_a_stream_says_how_to_enable_one(env: Env) {
        let missing = servers::unique_name("flotilla-none");
        let error = env
            .streams
            .describe_stream_summary(&format!("dynamodb:{missing}"))
            .await
            .unwrap_err();
        assert!(
            matches!(error, StreamError::NotFound { .. }),
            "{}: {error}",
            env.tier
        );

        let table = servers::unique_name("flotilla-plain");
        (env.plain_table)(&table).await;
        let error = env
            .streams
            .describe_stream_summary(&format!("dynamodb:{table}"))
            .await
            .unwrap_err();
        let StreamError::NotFound { message, .. } = &error else {
            panic!("{}: {error}", env.tier);
        };
        assert!(
            message.contains(&format!(
                "aws dynamodb update-table --table-name {table} --stream-specification \
                 StreamEnabled=true,StreamViewType=NEW_AND_OLD_IMAGES"
            )),
            "{}: {message}",
            env.tier
        );
    }

    pub async fn changes_arrive_per_item_in_order(env: Env) {
        let (table, arn) = env.fresh().await;
        let keys: Vec<String> = (0..12).map(|i| format!("item-{i}")).collect();
        let mut writes: Vec<ItemWrite> = keys.iter().map(|k| put(k, 1)).collect();
        writes.extend(keys[..6].iter().map(|k| put(k, 2)));
        writes.extend(
            keys[4..8]
                .iter()
                .map(|k| ItemWrite::Delete { key: k.clone() }),
        );
        // Deleting what is not there changes nothing: no record.
        writes.push(ItemWrite::Delete {
            key: "never-written".to_owned(),
        });
        env.write(&table, &writes).await;
        let expected = 12 + 6 + 4;

        let records = env.read_all(&arn, 5, expected).await;
        assert_eq!(records.len(), expected, "{}: {records:#?}", env.tier);
        let mut seen: BTreeMap<String, Vec<Seen>> = BTreeMap::new();
        for pair in records.windows(2) {
            assert!(
                pair[0].sequence_number < pair[1].sequence_number,
                "{}: out of order: {:?} then {:?}",
                env.tier,
                pair[0].sequence_number,
                pair[1].sequence_number
            );
        }
        for record in &records {
            let change = record
                .dynamodb_change()
                .unwrap_or_else(|e| panic!("{}: {e}", env.tier));
            let key = change.dynamodb.keys[TABLE_KEY].as_s().unwrap().to_owned();
            assert_eq!(change.dynamodb.keys, key_of(&key), "{}", env.tier);
            assert_eq!(record.partition_key, item_key_text(&key_of(&key)));
            assert_eq!(
                change.dynamodb.sequence_number,
                record.sequence_number.as_str(),
                "{}",
                env.tier
            );
            assert_eq!(record.sub_sequence_number, 0);
            assert!(record.approximate_arrival.is_some(), "{}", env.tier);
            assert!(!change.event_id.is_empty());
            if let Some(new) = &change.dynamodb.new_image {
                assert_eq!(new, &item(&key, new["v"].as_n().unwrap().parse().unwrap()));
            }
            seen.entry(key).or_default().push((
                change.event_name,
                version(&change.dynamodb.new_image),
                version(&change.dynamodb.old_image),
            ));
        }
        let v = |n: &str| Some(n.to_owned());
        for (i, key) in keys.iter().enumerate() {
            let mut want: Vec<Seen> = vec![(ChangeKind::Insert, v("1"), None)];
            let mut last = "1";
            if i < 6 {
                want.push((ChangeKind::Modify, v("2"), v("1")));
                last = "2";
            }
            if (4..8).contains(&i) {
                want.push((ChangeKind::Remove, None, v(last)));
            }
            assert_eq!(seen.get(key), Some(&want), "{}: {key}", env.tier);
        }
        env.check_no_rotation(&arn).await;
    }

    pub async fn get_records_caps_at_the_limit(env: Env) {
        let (table, arn) = env.fresh().await;
        let writes: Vec<ItemWrite> = (0..7).map(|i| put(&format!("k{i}"), 1)).collect();
        env.write(&table, &writes).await;
        let shard = env.shards(&arn).await.remove(0).id;
        for (limit, most) in [(1, 1), (3, 3), (5000, 7)] {
            let iterator = env
                .iterator(&arn, &shard, &IteratorPosition::TrimHorizon)
                .await;
            let batch = env
                .streams
                .get_records(&iterator, limit)
                .await
                .unwrap_or_else(|e| panic!("{}: limit {limit}: {e}", env.tier));
            assert!(
                !batch.records.is_empty() && batch.records.len() <= most,
                "{}: limit {limit}: {} records",
                env.tier,
                batch.records.len()
            );
        }
    }

    pub async fn iterator_positions(env: Env) {
        let (table, arn) = env.fresh().await;
        let writes: Vec<ItemWrite> = (0..6).map(|i| put(&format!("k{i}"), 1)).collect();
        env.write(&table, &writes).await;
        let shard = env.shards(&arn).await.remove(0).id;
        let all = env
            .read(
                env.iterator(&arn, &shard, &IteratorPosition::TrimHorizon)
                    .await,
                100,
                6,
            )
            .await
            .0;
        assert_eq!(all.len(), 6, "{}", env.tier);
        let seq: Vec<SequenceNumber> = all.iter().map(|r| r.sequence_number.clone()).collect();
        let first = |records: &[Record]| records.first().map(|r| r.sequence_number.clone());

        let cases = [
            (
                IteratorPosition::AtSequence(seq[2].clone()),
                Some(seq[2].clone()),
                4,
            ),
            (
                IteratorPosition::AfterSequence(seq[2].clone()),
                Some(seq[3].clone()),
                3,
            ),
            (IteratorPosition::AfterSequence(seq[5].clone()), None, 0),
            (IteratorPosition::Latest, None, 0),
        ];
        for (at, want_first, count) in cases {
            let (records, ended) = env
                .read(env.iterator(&arn, &shard, &at).await, 100, 6)
                .await;
            assert_eq!(first(&records), want_first, "{}: {at:?}", env.tier);
            assert_eq!(records.len(), count, "{}: {at:?}", env.tier);
            assert!(!ended, "{}: an open shard ended", env.tier);
        }

        // LATEST sees what is written after it was taken, and only that.
        let latest = env.iterator(&arn, &shard, &IteratorPosition::Latest).await;
        env.write(&table, &[put("late", 1)]).await;
        let (records, _) = env.read(latest, 100, 1).await;
        let keys: Vec<&str> = records.iter().map(|r| r.partition_key.as_str()).collect();
        assert_eq!(keys, [item_key_text(&key_of("late"))], "{}", env.tier);
    }

    pub async fn a_rotated_shard_ends_and_its_child_continues(env: Env) {
        let (table, arn) = env.fresh().await;
        env.write(&table, &[put("a", 1), put("b", 1)]).await;
        let rotate = match &env.expect.rotation {
            Rotation::Forced(rotate) => rotate,
            Rotation::Never(why) => {
                env.check_no_rotation(&arn).await;
                eprintln!("{}: shard end not exercised: {why}", env.tier);
                return;
            }
        };
        let parent = env.shards(&arn).await.remove(0);
        rotate(&table).await;
        env.write(&table, &[put("a", 2), put("c", 1)]).await;
        let shards = env.shards(&arn).await;
        let closed = shards.iter().find(|s| s.id == parent.id).unwrap();
        assert!(!closed.is_open(), "{}: {closed:?}", env.tier);
        let child = shards
            .iter()
            .find(|s| s.parent.as_ref() == Some(&parent.id))
            .unwrap_or_else(|| panic!("{}: no child of {}: {shards:?}", env.tier, parent.id));
        assert!(child.is_open());
        assert_eq!(child.hash_range, HashKeyRange::FULL);

        let it = env
            .iterator(&arn, &parent.id, &IteratorPosition::TrimHorizon)
            .await;
        let (records, ended) = env.read(it, 1, 100).await;
        assert_eq!(records.len(), 2, "{}", env.tier);
        // Read on past the last record: the shard ends with no next iterator.
        let ended = ended || {
            let it = env
                .iterator(
                    &arn,
                    &parent.id,
                    &IteratorPosition::AfterSequence(records[1].sequence_number.clone()),
                )
                .await;
            env.read(it, 10, 1).await.1
        };
        assert!(
            ended,
            "{}: a closed shard read to its end must end",
            env.tier
        );
        let it = env
            .iterator(&arn, &child.id, &IteratorPosition::TrimHorizon)
            .await;
        assert_eq!(env.read(it, 10, 2).await.0.len(), 2, "{}", env.tier);
    }

    pub async fn errors_are_typed(env: Env) {
        let (table, arn) = env.fresh().await;
        env.write(&table, &[put("a", 1)]).await;
        let shard = env.shards(&arn).await.remove(0).id;
        let tier = env.tier;

        let garbage = ShardIterator("not-an-iterator-at-all".repeat(4));
        let error = env.streams.get_records(&garbage, 10).await.unwrap_err();
        match env.expect.garbage_iterator {
            Answer::AsDynamoDb => {
                assert!(
                    matches!(error, StreamError::InvalidArgument { .. }),
                    "{tier}: {error}"
                )
            }
            Answer::ServerError(why) => {
                assert!(
                    matches!(error, StreamError::Transient { .. }),
                    "{tier} ({why}): {error}"
                )
            }
            Answer::Accepted(why) => panic!("{tier}: not a declarable answer here: {why}"),
        }

        // A stream ARN of the right shape that names nothing.
        let unknown = arn.replace(&table, &format!("{table}-gone"));
        for result in [
            env.streams.describe_stream_summary(&unknown).await.err(),
            env.streams.list_shards(&unknown).await.err(),
        ] {
            assert!(
                matches!(result, Some(StreamError::NotFound { .. })),
                "{tier}: {result:?}"
            );
        }

        let nowhere = ShardId::new("shardId-00000000000000000000-00000000");
        let answer = env
            .streams
            .get_shard_iterator(&arn, &nowhere, &IteratorPosition::TrimHorizon)
            .await;
        check_answer(
            tier,
            "unknown shard",
            env.expect.unknown_shard,
            answer,
            |e| matches!(e, StreamError::NotFound { .. }),
        );

        let foreign = SequenceNumber::parse("999999999999999999999999").unwrap();
        let answer = env
            .streams
            .get_shard_iterator(&arn, &shard, &IteratorPosition::AtSequence(foreign))
            .await;
        check_answer(
            tier,
            "foreign sequence",
            env.expect.foreign_sequence,
            answer,
            |e| {
                matches!(
                    e,
                    StreamError::InvalidArgument { .. } | StreamError::Trimmed { .. }
                )
            },
        );

        let at = IteratorPosition::AtTimestamp(std::time::SystemTime::now());
        let error = env
            .streams
            .get_shard_iterator(&arn, &shard, &at)
            .await
            .unwrap_err();
        assert!(
            matches!(error, StreamError::InvalidArgument { .. }),
            "{tier}: {error}"
        );
    }

    pub async fn iterators_expire(env: Env) {
        let duration = match env.expect.expiry {
            Expiry::Advance(duration) => duration,
            Expiry::Fixed(why) => {
                eprintln!("{}: expiry not exercised: {why}", env.tier);
                return;
            }
        };
        let (table, arn) = env.fresh().await;
        env.write(&table, &[put("a", 1)]).await;
        let shard = env.shards(&arn).await.remove(0).id;
        let iterator = env
            .iterator(&arn, &shard, &IteratorPosition::TrimHorizon)
            .await;
        tokio::time::advance(duration).await;
        let error = env.streams.get_records(&iterator, 10).await.unwrap_err();
        assert!(
            matches!(error, StreamError::IteratorExpired { .. }),
            "{}: {error}",
            env.tier
        );
    }
}

/// Checks a declared [`Answer`]: `as_dynamodb` says what DynamoDB's error is.
fn check_answer(
    tier: &str,
    what: &str,
    declared: Answer,
    answer: Result<ShardIterator, StreamError>,
    as_dynamodb: fn(&StreamError) -> bool,
) {
    match (declared, answer) {
        (Answer::AsDynamoDb, Err(e)) if as_dynamodb(&e) => {}
        (Answer::ServerError(_), Err(StreamError::Transient { .. })) => {}
        (Answer::Accepted(why), Ok(_)) => eprintln!("{tier}: {what}: {why}"),
        (declared, answer) => panic!("{tier}: {what}: declared {declared:?}, got {answer:?}"),
    }
}

/// A table without a stream, made with aws-sdk-dynamodb at `endpoint`.
async fn plain_table(endpoint: &str, table: &str) {
    use aws_sdk_dynamodb::types::{
        AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType,
    };
    let config = aws_sdk_dynamodb::config::Builder::from(&servers::sdk_config())
        .endpoint_url(endpoint)
        .build();
    aws_sdk_dynamodb::Client::from_conf(config)
        .create_table()
        .table_name(table)
        .attribute_definitions(
            AttributeDefinition::builder()
                .attribute_name(TABLE_KEY)
                .attribute_type(ScalarAttributeType::S)
                .build()
                .unwrap(),
        )
        .key_schema(
            KeySchemaElement::builder()
                .attribute_name(TABLE_KEY)
                .key_type(KeyType::Hash)
                .build()
                .unwrap(),
        )
        .billing_mode(BillingMode::PayPerRequest)
        .send()
        .await
        .unwrap_or_else(|e| panic!("create {table} without a stream: {e:?}"));
}

macro_rules! suite {
    ($tier:ident, $env:expr, $test:meta) => {
        mod $tier {
            use super::*;
            suite!(@cases [$test] $env;
                a_table_names_its_stream,
                a_table_without_a_stream_says_how_to_enable_one,
                changes_arrive_per_item_in_order,
                get_records_caps_at_the_limit,
                iterator_positions,
                a_rotated_shard_ends_and_its_child_continues,
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
    dynoxide,
    Env::dynoxide().await,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);
#[cfg(feature = "external-servers")]
suite!(
    dynamodb_local,
    Env::dynamodb_local().await,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);
#[cfg(feature = "external-servers")]
suite!(
    moto,
    Env::moto().await,
    tokio::test(flavor = "multi_thread", worker_threads = 2)
);
