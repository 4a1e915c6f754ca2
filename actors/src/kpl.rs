//! De-aggregation of records written by the Kinesis Producer Library (KPL).
//!
//! The KPL packs many user records into one Kinesis record to get past the per-record
//! limits of PutRecords. Its data blob is `MAGIC || PROTOBUF || MD5(PROTOBUF)`; see
//! `actors/tests/fixtures/kpl/README.md` for the format and the test vectors.
//!
//! A consumer that shares a lease table with the Java KCL must hand a processor the same
//! user records the Java KCL would, or checkpoints (sequence number plus sub-sequence
//! number) stop meaning the same thing on both sides. So [`deaggregate`] follows
//! `AggregatorUtil.deaggregate` (KCL 3.x), including where it is surprising:
//!
//! * Anything that is not a well-formed aggregate is delivered unchanged as one plain
//!   record: no magic, 16 bytes or fewer after it, a wrong MD5, or a protobuf that does
//!   not parse. "Does not parse" includes a missing proto2 `required` field, which
//!   protobuf-java rejects and prost does not, so the required fields are declared
//!   optional here and checked after decoding.
//! * An index outside a key table stops de-aggregation at that user record: the ones
//!   before it are delivered, the outer record is not. So does an explicit hash key that
//!   is not a number.
//! * Java compares every user record's effective hash key with the shard's range (the
//!   whole key space when the shard is not known) and, at the first one outside, drops
//!   every user record of the aggregate. After a reshard this is what removes the copies
//!   a producer with a stale shard map sent to the wrong shard.
//! * A user record has an explicit hash key only if it has an explicit-hash-key index;
//!   it does not inherit one from its neighbours.
//! * Table indexes are cast to a Java `int`: only the low 32 bits count, and a value
//!   with bit 31 set is out of range.
//! * Key-table entries are proto2 strings, which protobuf-java does not check for UTF-8:
//!   invalid bytes become U+FFFD when the key is read. They are decoded as bytes here and
//!   converted the same way.
//!
//! Known differences, all for blobs a KPL does not write and that also pass the MD5:
//! protobuf-java treats a known field with the wrong wire type as an unknown field, where
//! prost rejects the message (we then pass the record through, Java delivers it); Java's
//! `BigInteger` accepts non-ASCII decimal digits in an explicit hash key, where we treat
//! such a key as not a number.
//!
//! Memory: the whole protobuf is decoded before the first user record is delivered (Java
//! does the same, and must, to reject a message with a missing field anywhere). The
//! decoded tables are bounded by a small multiple of the blob size, never by a length
//! read from it. User-record data and key-table entries are slices of the outer record's
//! [`Bytes`], not copies.

use std::borrow::Cow;
use std::collections::HashMap;

use bytes::Bytes;
use md5::{Digest, Md5};
use prost::Message;

use crate::backend::Record;
use crate::model::{HashKeyRange, partition_key_hash};

/// The first four bytes of every KPL aggregate.
pub const MAGIC: [u8; 4] = [0xF3, 0x89, 0x9A, 0xC2];

const DIGEST_LEN: usize = 16;

/// The KPL's protobuf messages (`messages.proto`, proto2), declared by hand.
///
/// Every `required` field is declared `optional` so that a missing one can be told apart
/// from a zero or empty value; [`UserEntry::check`] then rejects it as protobuf-java does.
/// Strings are declared `bytes` because protobuf-java does not validate proto2 strings.
mod proto {
    use bytes::Bytes;

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct AggregatedRecord {
        #[prost(bytes = "bytes", repeated, tag = "1")]
        pub(super) partition_key_table: Vec<Bytes>,
        #[prost(bytes = "bytes", repeated, tag = "2")]
        pub(super) explicit_hash_key_table: Vec<Bytes>,
        #[prost(message, repeated, tag = "3")]
        pub(super) records: Vec<Record>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Record {
        /// Required.
        #[prost(uint64, optional, tag = "1")]
        pub(super) partition_key_index: Option<u64>,
        #[prost(uint64, optional, tag = "2")]
        pub(super) explicit_hash_key_index: Option<u64>,
        /// Required.
        #[prost(bytes = "bytes", optional, tag = "3")]
        pub(super) data: Option<Bytes>,
        #[prost(message, repeated, tag = "4")]
        pub(super) tags: Vec<Tag>,
    }

    #[derive(Clone, PartialEq, prost::Message)]
    pub(super) struct Tag {
        /// Required.
        #[prost(bytes = "bytes", optional, tag = "1")]
        pub(super) key: Option<Bytes>,
        #[prost(bytes = "bytes", optional, tag = "2")]
        pub(super) value: Option<Bytes>,
    }
}

/// What [`deaggregate`] did with one Kinesis record, for metrics and logs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Deaggregated {
    /// Records appended to `out` as user records of an aggregate (0 when passed through).
    pub user_records: usize,
    /// Set when the record was appended unchanged, and why.
    pub passed_through: Option<PassThrough>,
    /// User records not delivered because one of them lies outside the shard's range.
    /// It is the whole aggregate, as in Java.
    pub dropped_out_of_range: usize,
    /// Why de-aggregation stopped early; `user_records` were delivered before it.
    pub partial_error: Option<UserRecordError>,
}

/// Why a record was delivered as it came. Only [`PassThrough::NotAggregated`] is normal:
/// the others start with the magic, so a producer meant them to be aggregates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PassThrough {
    /// No magic: a plain record.
    NotAggregated,
    /// The magic, then 16 bytes or fewer.
    TooShort,
    /// The magic, but the trailing 16 bytes are not the MD5 of the protobuf between.
    ChecksumMismatch,
    /// The checksum matches but the protobuf does not parse (including a missing
    /// required field); the text says where.
    InvalidProtobuf(String),
}

/// Why de-aggregation stopped at a user record. Java logs these as "Unexpected
/// exception during deaggregation" and keeps the user records before it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UserRecordError {
    /// A user record's partition key index is outside the partition key table.
    #[error(
        "user record {record}: partition key index {index} is outside the {table_len}-entry table"
    )]
    PartitionKeyIndex {
        /// The user record's position in the aggregate (its sub-sequence number), from 0.
        record: u64,
        /// The index it carries.
        index: u64,
        /// Entries in the partition key table.
        table_len: usize,
    },
    /// A user record's explicit hash key index is outside the explicit hash key table.
    #[error(
        "user record {record}: explicit hash key index {index} is outside the {table_len}-entry table"
    )]
    ExplicitHashKeyIndex {
        /// The user record's position in the aggregate (its sub-sequence number), from 0.
        record: u64,
        /// The index it carries.
        index: u64,
        /// Entries in the explicit hash key table.
        table_len: usize,
    },
    /// A user record's explicit hash key is not a decimal integer (Java's `BigInteger` fails).
    #[error("user record {record}: explicit hash key {key:?} is not a decimal integer")]
    ExplicitHashKeyNotANumber {
        /// The user record's position in the aggregate (its sub-sequence number), from 0.
        record: u64,
        /// The key as found (invalid UTF-8 replaced by U+FFFD).
        key: String,
    },
}

/// One user record to [`aggregate`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserRecord {
    /// The user record's partition key; stored once per distinct key in the aggregate's table.
    pub partition_key: String,
    /// The explicit hash key (decimal, below 2^128) that picks the shard instead of the
    /// partition key's MD5; `None`: the MD5 picks it.
    pub explicit_hash_key: Option<String>,
    /// The user record's payload.
    pub data: Bytes,
}

/// Appends to `out` the user records of `record` if it is a KPL aggregate, or `record`
/// itself if it is not. `shard_range` is the range of the shard the record was read
/// from; `None` means the whole key space, as in Java when the shard is unknown.
///
/// Each user record keeps the outer sequence number and arrival time and gets its
/// position in the aggregate as its sub-sequence number, so a checkpoint can point
/// between two user records of one Kinesis record.
pub fn deaggregate(
    record: Record,
    shard_range: Option<&HashKeyRange>,
    out: &mut Vec<Record>,
) -> Deaggregated {
    let message = match unframe(&record.data) {
        Ok(message) => message,
        Err(reason) => {
            out.push(record);
            return Deaggregated {
                passed_through: Some(reason),
                ..Deaggregated::default()
            };
        }
    };
    let entries = match message
        .records
        .into_iter()
        .enumerate()
        .map(|(position, entry)| UserEntry::check(position, entry))
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(entries) => entries,
        Err(missing) => {
            out.push(record);
            return Deaggregated {
                passed_through: Some(PassThrough::InvalidProtobuf(missing)),
                ..Deaggregated::default()
            };
        }
    };

    let range = shard_range.copied().unwrap_or(HashKeyRange::FULL);
    let pks = &message.partition_key_table;
    let ehks = &message.explicit_hash_key_table;
    let start = out.len();
    out.reserve(entries.len());
    let total = entries.len();
    for (sub_sequence_number, entry) in (0u64..).zip(entries) {
        let delivered = out.len() - start;
        let stop = |error| Deaggregated {
            user_records: delivered,
            partial_error: Some(error),
            ..Deaggregated::default()
        };
        let Some(partition_key) = table_entry(pks, entry.partition_key_index) else {
            return stop(UserRecordError::PartitionKeyIndex {
                record: sub_sequence_number,
                index: entry.partition_key_index,
                table_len: pks.len(),
            });
        };
        let explicit_hash_key = match entry.explicit_hash_key_index {
            None => None,
            Some(index) => match table_entry(ehks, index) {
                Some(key) => Some(key),
                None => {
                    return stop(UserRecordError::ExplicitHashKeyIndex {
                        record: sub_sequence_number,
                        index,
                        table_len: ehks.len(),
                    });
                }
            },
        };
        let hash_key = match &explicit_hash_key {
            None => JavaHashKey::InKeySpace(partition_key_hash(&partition_key)),
            Some(key) => java_hash_key(key),
        };
        let in_range = match hash_key {
            JavaHashKey::InKeySpace(key) => range.contains(key),
            JavaHashKey::OutsideKeySpace => false,
            JavaHashKey::NotANumber => {
                return stop(UserRecordError::ExplicitHashKeyNotANumber {
                    record: sub_sequence_number,
                    key: explicit_hash_key.map(Cow::into_owned).unwrap_or_default(),
                });
            }
        };
        if !in_range {
            out.truncate(start);
            return Deaggregated {
                dropped_out_of_range: total,
                ..Deaggregated::default()
            };
        }
        out.push(Record {
            sequence_number: record.sequence_number.clone(),
            sub_sequence_number,
            partition_key: partition_key.into_owned(),
            explicit_hash_key: explicit_hash_key.map(Cow::into_owned),
            data: entry.data,
            approximate_arrival: record.approximate_arrival,
        });
    }
    Deaggregated {
        user_records: total,
        ..Deaggregated::default()
    }
}

/// Checks the frame around the protobuf and decodes it, in Java's order.
fn unframe(data: &Bytes) -> Result<proto::AggregatedRecord, PassThrough> {
    let rest = data
        .strip_prefix(&MAGIC[..])
        .ok_or(PassThrough::NotAggregated)?;
    let (body, digest) = match rest.split_last_chunk::<DIGEST_LEN>() {
        Some((body, digest)) if !body.is_empty() => (body, digest),
        _ => return Err(PassThrough::TooShort),
    };
    if Md5::digest(body).as_slice() != digest.as_slice() {
        return Err(PassThrough::ChecksumMismatch);
    }
    // Decoding from a `Bytes` lets every `bytes` field be a slice of the outer record.
    proto::AggregatedRecord::decode(data.slice_ref(body))
        .map_err(|error| PassThrough::InvalidProtobuf(error.to_string()))
}

/// A user record whose required fields are present.
struct UserEntry {
    partition_key_index: u64,
    explicit_hash_key_index: Option<u64>,
    data: Bytes,
}

impl UserEntry {
    fn check(position: usize, entry: proto::Record) -> Result<Self, String> {
        let missing = |field: &str| format!("user record {position}: required {field} missing");
        if let Some(tag) = entry.tags.iter().position(|tag| tag.key.is_none()) {
            return Err(missing(&format!("key of tag {tag}")));
        }
        Ok(Self {
            partition_key_index: entry
                .partition_key_index
                .ok_or_else(|| missing("partition_key_index"))?,
            explicit_hash_key_index: entry.explicit_hash_key_index,
            data: entry.data.ok_or_else(|| missing("data"))?,
        })
    }
}

/// Java reads the table with `list.get((int) index)`: the cast keeps the low 32 bits,
/// and a negative `int` is out of range.
fn table_entry(table: &[Bytes], index: u64) -> Option<Cow<'_, str>> {
    // Truncation is the point: it is what Java's `(int)` cast does.
    let java_int = index as u32 as i32;
    let entry = table.get(usize::try_from(java_int).ok()?)?;
    Some(String::from_utf8_lossy(entry))
}

/// An explicit hash key as `new BigInteger(text)` reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum JavaHashKey {
    InKeySpace(u128),
    /// Negative, or 2^128 and above: a number, but outside every shard.
    OutsideKeySpace,
    /// `BigInteger` throws `NumberFormatException`.
    NotANumber,
}

/// Accepts what `BigInteger(String)` accepts for ASCII text: one optional leading sign,
/// then at least one decimal digit, leading zeros allowed.
fn java_hash_key(text: &str) -> JavaHashKey {
    let (negative, digits) = match text.strip_prefix('-') {
        Some(digits) => (true, digits),
        None => (false, text.strip_prefix('+').unwrap_or(text)),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return JavaHashKey::NotANumber;
    }
    let value = digits.bytes().try_fold(0u128, |value, digit| {
        value.checked_mul(10)?.checked_add(u128::from(digit - b'0'))
    });
    match value {
        Some(0) => JavaHashKey::InKeySpace(0),
        Some(value) if !negative => JavaHashKey::InKeySpace(value),
        _ => JavaHashKey::OutsideKeySpace,
    }
}

/// The hash key Kinesis routes a user record by, as Java's
/// `AggregatorUtil.effectiveHashKey` computes it. `None` when the explicit hash key is not
/// a number in the key space: such a user record belongs to no shard.
pub fn effective_hash_key(partition_key: &str, explicit_hash_key: Option<&str>) -> Option<u128> {
    match explicit_hash_key.map(java_hash_key) {
        None => Some(partition_key_hash(partition_key)),
        Some(JavaHashKey::InKeySpace(key)) => Some(key),
        Some(JavaHashKey::OutsideKeySpace | JavaHashKey::NotANumber) => None,
    }
}

/// Builds an aggregate the way the KPL does: each distinct partition key and explicit
/// hash key stored once, user records in order. The outer Kinesis record should take the
/// first user record's keys. No size limit is enforced: keeping the blob (plus the outer
/// partition key) under the PutRecord limit is the caller's job. An empty slice gives a
/// blob that [`deaggregate`] passes through, since its protobuf is empty.
pub fn aggregate(records: &[UserRecord]) -> Bytes {
    let mut partition_keys = KeyTable::default();
    let mut explicit_hash_keys = KeyTable::default();
    let entries = records
        .iter()
        .map(|record| proto::Record {
            partition_key_index: Some(partition_keys.index_of(&record.partition_key)),
            explicit_hash_key_index: record
                .explicit_hash_key
                .as_deref()
                .map(|key| explicit_hash_keys.index_of(key)),
            data: Some(record.data.clone()),
            tags: Vec::new(),
        })
        .collect();
    let body = proto::AggregatedRecord {
        partition_key_table: partition_keys.entries,
        explicit_hash_key_table: explicit_hash_keys.entries,
        records: entries,
    }
    .encode_to_vec();
    let digest = Md5::digest(&body);
    let mut blob = Vec::with_capacity(MAGIC.len() + body.len() + DIGEST_LEN);
    blob.extend_from_slice(&MAGIC);
    blob.extend_from_slice(&body);
    blob.extend_from_slice(&digest);
    Bytes::from(blob)
}

#[derive(Default)]
struct KeyTable<'a> {
    entries: Vec<Bytes>,
    index: HashMap<&'a str, u64>,
}

impl<'a> KeyTable<'a> {
    fn index_of(&mut self, key: &'a str) -> u64 {
        let next = self.entries.len() as u64;
        *self.index.entry(key).or_insert_with(|| {
            self.entries.push(Bytes::copy_from_slice(key.as_bytes()));
            next
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SequenceNumber;
    use proptest::prelude::*;

    fn outer(data: Bytes) -> Record {
        Record {
            sequence_number: SequenceNumber::from_u128(49_590_338_271_490_256_608),
            sub_sequence_number: 0,
            partition_key: "outer".to_owned(),
            explicit_hash_key: None,
            data,
            approximate_arrival: Some(std::time::SystemTime::UNIX_EPOCH),
        }
    }

    /// Wraps a protobuf body in the magic and its MD5, so the decoder is reached.
    fn frame(body: &[u8]) -> Bytes {
        let mut blob = MAGIC.to_vec();
        blob.extend_from_slice(body);
        blob.extend_from_slice(&Md5::digest(body));
        Bytes::from(blob)
    }

    fn user(partition_key: &str, explicit_hash_key: Option<&str>, data: &[u8]) -> UserRecord {
        UserRecord {
            partition_key: partition_key.to_owned(),
            explicit_hash_key: explicit_hash_key.map(str::to_owned),
            data: Bytes::copy_from_slice(data),
        }
    }

    fn entry(partition_key_index: u64, explicit_hash_key_index: Option<u64>) -> proto::Record {
        proto::Record {
            partition_key_index: Some(partition_key_index),
            explicit_hash_key_index,
            data: Some(Bytes::from_static(b"d")),
            tags: Vec::new(),
        }
    }

    fn table(keys: &[&str]) -> Vec<Bytes> {
        keys.iter()
            .map(|k| Bytes::copy_from_slice(k.as_bytes()))
            .collect()
    }

    fn run(blob: Bytes, range: Option<&HashKeyRange>) -> (Vec<Record>, Deaggregated) {
        let mut out = Vec::new();
        let summary = deaggregate(outer(blob), range, &mut out);
        (out, summary)
    }

    /// What every outcome must look like, whatever the input.
    fn check_invariants(input: &Record, out: &[Record], summary: &Deaggregated) {
        if summary.passed_through.is_some() {
            assert_eq!(out, std::slice::from_ref(input));
            assert_eq!(summary.user_records, 0);
            return;
        }
        assert_eq!(out.len(), summary.user_records);
        for (i, record) in out.iter().enumerate() {
            assert_eq!(record.sub_sequence_number, i as u64);
            assert_eq!(record.sequence_number, input.sequence_number);
            assert_eq!(record.approximate_arrival, input.approximate_arrival);
        }
        if summary.dropped_out_of_range > 0 {
            assert!(out.is_empty());
        }
    }

    #[test]
    fn sub_sequence_numbers_count_from_zero() {
        let records: Vec<UserRecord> = (0..5)
            .map(|i| user(&format!("pk-{}", i % 2), None, &[i]))
            .collect();
        let (out, summary) = run(aggregate(&records), None);
        assert_eq!(summary.user_records, 5);
        let subs: Vec<u64> = out.iter().map(|r| r.sub_sequence_number).collect();
        assert_eq!(subs, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn aggregate_stores_each_key_once() {
        let records = [
            user("a", None, b"1"),
            user("b", Some("7"), b"2"),
            user("a", Some("7"), b"3"),
            user("a", Some("8"), b"4"),
        ];
        let blob = aggregate(&records);
        let body = &blob[MAGIC.len()..blob.len() - DIGEST_LEN];
        let message = proto::AggregatedRecord::decode(body).expect("decodes");
        assert_eq!(message.partition_key_table, table(&["a", "b"]));
        assert_eq!(message.explicit_hash_key_table, table(&["7", "8"]));
        let indexes: Vec<_> = message
            .records
            .iter()
            .map(|r| (r.partition_key_index, r.explicit_hash_key_index))
            .collect();
        assert_eq!(
            indexes,
            [
                (Some(0), None),
                (Some(1), Some(0)),
                (Some(0), Some(0)),
                (Some(0), Some(1))
            ]
        );
    }

    #[test]
    fn user_record_data_is_a_slice_of_the_outer_record() {
        let blob = aggregate(&[user("a", None, b"first"), user("b", None, b"second")]);
        let outer_range = blob.as_ptr_range();
        let (out, _) = run(blob.clone(), None);
        assert_eq!(out.len(), 2);
        for record in &out {
            let inner = record.data.as_ptr_range();
            assert!(outer_range.start <= inner.start && inner.end <= outer_range.end);
        }
    }

    #[test]
    fn an_empty_aggregate_is_too_short_to_be_one() {
        let (out, summary) = run(aggregate(&[]), None);
        assert_eq!(summary.passed_through, Some(PassThrough::TooShort));
        assert_eq!(out.len(), 1);
    }

    #[test]
    fn a_missing_required_field_anywhere_passes_the_record_through() {
        let mut no_tag_key = entry(0, None);
        no_tag_key.tags.push(proto::Tag {
            key: None,
            value: Some(Bytes::from_static(b"v")),
        });
        let mut no_pk_index = entry(0, None);
        no_pk_index.partition_key_index = None;
        for (broken, field) in [
            (no_tag_key, "key of tag 0"),
            (no_pk_index, "partition_key_index"),
        ] {
            let body = proto::AggregatedRecord {
                partition_key_table: table(&["a"]),
                explicit_hash_key_table: Vec::new(),
                records: vec![entry(0, None), broken],
            }
            .encode_to_vec();
            let (out, summary) = run(frame(&body), None);
            assert_eq!(out.len(), 1);
            assert_eq!(out[0].partition_key, "outer");
            assert_eq!(
                summary.passed_through,
                Some(PassThrough::InvalidProtobuf(format!(
                    "user record 1: required {field} missing"
                )))
            );
        }
    }

    #[test]
    fn table_indexes_are_read_as_a_java_int() {
        let body = |index| {
            proto::AggregatedRecord {
                partition_key_table: table(&["zero", "one"]),
                explicit_hash_key_table: Vec::new(),
                records: vec![entry(1, None), entry(index, None)],
            }
            .encode_to_vec()
        };
        // 2^32 + 1 keeps its low 32 bits: index 1.
        let (out, summary) = run(frame(&body((1 << 32) + 1)), None);
        assert_eq!(summary.partial_error, None);
        assert_eq!(out[1].partition_key, "one");
        // 2^31 is a negative int: out of range, after the first record was delivered.
        let (out, summary) = run(frame(&body(1 << 31)), None);
        assert_eq!(out.len(), 1);
        assert_eq!(summary.user_records, 1);
        assert_eq!(
            summary.partial_error,
            Some(UserRecordError::PartitionKeyIndex {
                record: 1,
                index: 1 << 31,
                table_len: 2,
            })
        );
    }

    #[test]
    fn explicit_hash_keys_read_as_java_big_integers() {
        let cases: [(&str, Option<u128>); 10] = [
            ("0", Some(0)),
            ("+5", Some(5)),
            ("-0", Some(0)),
            ("0007", Some(7)),
            ("340282366920938463463374607431768211455", Some(u128::MAX)),
            ("340282366920938463463374607431768211456", None),
            ("-1", None),
            ("", None),
            ("-", None),
            ("1 ", None),
        ];
        for (text, want) in cases {
            assert_eq!(effective_hash_key("pk", Some(text)), want, "{text:?}");
        }
        assert_eq!(
            effective_hash_key("pk", None),
            Some(partition_key_hash("pk"))
        );
    }

    #[test]
    fn a_key_outside_the_key_space_drops_the_aggregate_but_garbage_stops_it() {
        let blob = |ehk: &str| {
            aggregate(&[
                user("a", Some("1"), b"kept?"),
                user("b", Some(ehk), b"x"),
                user("c", None, b"never read"),
            ])
        };
        // A number outside [0, 2^128-1] is outside every shard, even with no shard range.
        for ehk in ["-1", "340282366920938463463374607431768211456"] {
            let mut out = vec![outer(Bytes::from_static(b"earlier"))];
            let summary = deaggregate(outer(blob(ehk)), None, &mut out);
            assert_eq!(
                out.len(),
                1,
                "{ehk}: earlier records stay, this aggregate goes"
            );
            assert_eq!(summary.dropped_out_of_range, 3);
        }
        // Not a number: Java's NumberFormatException, so partial delivery.
        let (out, summary) = run(blob("0x10"), None);
        assert_eq!(out.len(), 1);
        assert_eq!(
            summary.partial_error,
            Some(UserRecordError::ExplicitHashKeyNotANumber {
                record: 1,
                key: "0x10".to_owned()
            })
        );
    }

    #[test]
    fn an_explicit_hash_key_index_outside_its_table_stops_de_aggregation() {
        let body = proto::AggregatedRecord {
            partition_key_table: table(&["a"]),
            explicit_hash_key_table: table(&["9"]),
            records: vec![entry(0, Some(0)), entry(0, None), entry(0, Some(1))],
        }
        .encode_to_vec();
        let (out, summary) = run(frame(&body), None);
        let ehks: Vec<_> = out.iter().map(|r| r.explicit_hash_key.as_deref()).collect();
        assert_eq!(ehks, [Some("9"), None]);
        assert_eq!(
            summary.partial_error.map(|e| e.to_string()).as_deref(),
            Some("user record 2: explicit hash key index 1 is outside the 1-entry table")
        );
    }

    #[test]
    fn invalid_utf8_in_a_key_becomes_replacement_characters() {
        let body = proto::AggregatedRecord {
            partition_key_table: vec![Bytes::from_static(b"k\xFFey")],
            explicit_hash_key_table: Vec::new(),
            records: vec![entry(0, None)],
        }
        .encode_to_vec();
        let (out, summary) = run(frame(&body), None);
        assert_eq!(summary.user_records, 1);
        assert_eq!(out[0].partition_key, "k\u{FFFD}ey");
    }

    fn user_records() -> impl Strategy<Value = Vec<UserRecord>> {
        let one = (
            "\\PC{0,12}",
            proptest::option::of(any::<u128>()),
            proptest::collection::vec(any::<u8>(), 0..48),
        )
            .prop_map(|(partition_key, ehk, data)| UserRecord {
                partition_key,
                explicit_hash_key: ehk.map(|k| k.to_string()),
                data: Bytes::from(data),
            });
        proptest::collection::vec(one, 1..24)
    }

    /// Small tables and indexes that are often, but not always, in range.
    fn messages() -> impl Strategy<Value = proto::AggregatedRecord> {
        let key = proptest::collection::vec(any::<u8>(), 0..6).prop_map(Bytes::from);
        // Required fields are usually there, so most messages get past the parse.
        let tag = (
            proptest::option::weighted(0.95, key.clone()),
            proptest::option::of(key.clone()),
        )
            .prop_map(|(key, value)| proto::Tag { key, value });
        let record = (
            proptest::option::weighted(0.95, 0u64..4),
            proptest::option::of(0u64..4),
            proptest::option::weighted(0.95, key.clone()),
            proptest::collection::vec(tag, 0..2),
        )
            .prop_map(
                |(partition_key_index, explicit_hash_key_index, data, tags)| proto::Record {
                    partition_key_index,
                    explicit_hash_key_index,
                    data,
                    tags,
                },
            );
        let ehk = prop_oneof![
            any::<u128>().prop_map(|k| Bytes::from(k.to_string())),
            key.clone(),
        ];
        (
            proptest::collection::vec(key, 0..3),
            proptest::collection::vec(ehk, 0..3),
            proptest::collection::vec(record, 0..6),
        )
            .prop_map(|(partition_key_table, explicit_hash_key_table, records)| {
                proto::AggregatedRecord {
                    partition_key_table,
                    explicit_hash_key_table,
                    records,
                }
            })
    }

    proptest! {
        #[test]
        fn aggregate_then_deaggregate_gives_the_user_records_back(records in user_records()) {
            let (out, summary) = run(aggregate(&records), None);
            prop_assert_eq!(&summary, &Deaggregated { user_records: records.len(), ..Deaggregated::default() });
            prop_assert_eq!(out.len(), records.len());
            for (i, (got, want)) in out.iter().zip(&records).enumerate() {
                prop_assert_eq!(got.sub_sequence_number, i as u64);
                prop_assert_eq!(&got.partition_key, &want.partition_key);
                prop_assert_eq!(&got.explicit_hash_key, &want.explicit_hash_key);
                prop_assert_eq!(&got.data, &want.data);
            }
        }

        #[test]
        fn arbitrary_bytes_after_the_magic_never_panic(
            body in proptest::collection::vec(any::<u8>(), 0..600),
            with_md5 in any::<bool>(),
        ) {
            let blob = if with_md5 {
                frame(&body)
            } else {
                let mut blob = MAGIC.to_vec();
                blob.extend_from_slice(&body);
                Bytes::from(blob)
            };
            let input = outer(blob);
            let mut out = Vec::new();
            let summary = deaggregate(input.clone(), None, &mut out);
            check_invariants(&input, &out, &summary);
        }

        #[test]
        fn odd_but_well_framed_messages_keep_the_invariants(
            message in messages(),
            range in (any::<u128>(), any::<u128>()),
        ) {
            let range = HashKeyRange { start: range.0.min(range.1), end: range.0.max(range.1) };
            let input = outer(frame(&message.encode_to_vec()));
            let mut out = Vec::new();
            let summary = deaggregate(input.clone(), Some(&range), &mut out);
            check_invariants(&input, &out, &summary);
            let complete = summary.passed_through.is_none()
                && summary.partial_error.is_none()
                && summary.dropped_out_of_range == 0;
            if complete {
                prop_assert_eq!(out.len(), message.records.len());
            }
        }
    }
}
