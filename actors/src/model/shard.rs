//! Shards as Kinesis lists them.

use std::fmt;

use md5::{Digest, Md5};

use super::SequenceNumber;

/// A shard id such as `shardId-000000000007`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct ShardId(String);

impl ShardId {
    /// A shard id as Kinesis or the lease table gives it (not checked).
    pub fn new(id: impl Into<String>) -> Self {
        Self(id.into())
    }

    /// The id Kinesis gives the `index`-th shard of a stream.
    pub fn from_index(index: u64) -> Self {
        Self(format!("shardId-{index:012}"))
    }

    /// The id as Kinesis writes it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ShardId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl From<&str> for ShardId {
    fn from(value: &str) -> Self {
        Self(value.to_owned())
    }
}

/// An inclusive range of 128-bit hash keys. Kinesis routes a record to the open shard
/// whose range holds the MD5 of its partition key (or its explicit hash key).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct HashKeyRange {
    /// The first hash key in the range.
    pub start: u128,
    /// The last hash key in the range (inclusive).
    pub end: u128,
}

/// Why a hash-key range is not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HashKeyError {
    /// The text is not a decimal integer that fits in 128 bits.
    #[error("hash key {text:?} is not a decimal integer between 0 and 2^128-1")]
    NotAHashKey {
        /// The text that was read.
        text: String,
    },
    /// The range would start after it ends.
    #[error("hash key range starts at {start} after it ends at {end}")]
    Inverted {
        /// The range's first key as given.
        start: u128,
        /// The range's last key as given, below `start`.
        end: u128,
    },
}

impl HashKeyRange {
    /// The whole key space: what a one-shard stream covers.
    pub const FULL: HashKeyRange = HashKeyRange {
        start: 0,
        end: u128::MAX,
    };

    /// The range `start..=end`; [`HashKeyError::Inverted`] if `start > end`.
    pub fn new(start: u128, end: u128) -> Result<Self, HashKeyError> {
        if start > end {
            return Err(HashKeyError::Inverted { start, end });
        }
        Ok(Self { start, end })
    }

    /// Parses the decimal strings Kinesis and the lease table use.
    pub fn parse(start: &str, end: &str) -> Result<Self, HashKeyError> {
        Self::new(parse_hash_key(start)?, parse_hash_key(end)?)
    }

    /// Whether `key` is in the range (both ends included).
    pub fn contains(&self, key: u128) -> bool {
        self.start <= key && key <= self.end
    }

    /// Splits the key space into `n` contiguous ranges the way CreateStream does:
    /// equal widths, the last one absorbing the remainder.
    pub fn even_split(n: u32) -> Vec<HashKeyRange> {
        let n = u128::from(n.max(1));
        let size = u128::MAX / n;
        (0..n)
            .map(|i| HashKeyRange {
                start: i * size,
                end: if i == n - 1 {
                    u128::MAX
                } else {
                    (i + 1) * size - 1
                },
            })
            .collect()
    }
}

impl fmt::Display for HashKeyRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}, {}]", self.start, self.end)
    }
}

/// Reads a hash key as Kinesis and the lease table write it: decimal digits only, at most
/// 2^128 − 1.
pub fn parse_hash_key(text: &str) -> Result<u128, HashKeyError> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(HashKeyError::NotAHashKey {
            text: text.to_owned(),
        });
    }
    text.parse().map_err(|_| HashKeyError::NotAHashKey {
        text: text.to_owned(),
    })
}

/// The hash key Kinesis derives from a partition key: MD5 of its UTF-8 bytes read as a
/// big-endian unsigned 128-bit integer.
pub fn partition_key_hash(partition_key: &str) -> u128 {
    u128::from_be_bytes(Md5::digest(partition_key.as_bytes()).into())
}

/// The sequence numbers a shard has held: `end` is set once the shard is closed
/// (split or merged), and is the last sequence number it will ever hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceRange {
    /// `StartingSequenceNumber`: the shard's first sequence number.
    pub start: SequenceNumber,
    /// `EndingSequenceNumber`: the last sequence number of a closed shard; `None` while open.
    pub end: Option<SequenceNumber>,
}

/// A shard from ListShards.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shard {
    /// The shard's id (`ShardId`).
    pub id: ShardId,
    /// The shard this one was split from, or the first of the two it was merged from.
    pub parent: Option<ShardId>,
    /// The second parent of a merge.
    pub adjacent_parent: Option<ShardId>,
    /// `HashKeyRange`: the hash keys whose records the shard takes (took, once closed).
    pub hash_range: HashKeyRange,
    /// `SequenceNumberRange`: the sequence numbers the shard has held.
    pub sequence_range: SequenceRange,
}

impl Shard {
    /// A closed shard takes no new records; reading it ends at SHARD_END.
    pub fn is_open(&self) -> bool {
        self.sequence_range.end.is_none()
    }

    /// The parents of this shard: none, one (a split) or two (a merge).
    pub fn parents(&self) -> impl Iterator<Item = &ShardId> {
        self.parent.iter().chain(self.adjacent_parent.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn partition_key_hash_matches_kinesis() {
        // Values from the KPL fixtures' effective_hash_key (Java's AggregatorUtil).
        assert_eq!(partition_key_hash(""), 0xd41d8cd98f00b204e9800998ecf8427e);
        assert_eq!(
            partition_key_hash("a"),
            u128::from_str_radix("0cc175b9c0f1b6a831c399e269772661", 16).unwrap()
        );
    }

    #[test]
    fn hash_keys_reject_garbage() {
        for bad in [
            "",
            "-1",
            "1e5",
            "340282366920938463463374607431768211456",
            " 1",
        ] {
            let err = parse_hash_key(bad).expect_err(bad);
            assert!(
                err.to_string().contains("is not a decimal integer"),
                "{err}"
            );
        }
        let err = HashKeyRange::parse("10", "9").expect_err("inverted");
        assert_eq!(
            err.to_string(),
            "hash key range starts at 10 after it ends at 9"
        );
    }

    proptest! {
        #[test]
        fn even_split_covers_the_key_space_without_gaps(n in 1u32..300) {
            let ranges = HashKeyRange::even_split(n);
            prop_assert_eq!(ranges.len() as u32, n);
            prop_assert_eq!(ranges[0].start, 0);
            prop_assert_eq!(ranges[ranges.len() - 1].end, u128::MAX);
            for pair in ranges.windows(2) {
                prop_assert!(pair[0].start <= pair[0].end);
                prop_assert_eq!(pair[0].end + 1, pair[1].start);
            }
        }
    }
}
