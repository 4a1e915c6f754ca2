//! Which lane of a shard a record goes to (`processor.parallelism`): one rule, used by
//! the dealer that splits each batch and by the reader's view of each lane's lag.
//!
//! Records are dealt by a hash of their partition key, so all records of one key go to
//! one lane, where they are processed in order; the lanes work at once. The hash is
//! FNV-1a, fixed here rather than Rust's `DefaultHasher`, whose output may change
//! between Rust releases: a key keeps its lane across versions and processes, so a
//! processor that keeps per-key state in its lane sees the same keys after a restart.

/// The lane of a record with `partition_key`, among `lanes` (at least 1).
pub fn lane_of(partition_key: &str, lanes: u16) -> usize {
    let lanes = u64::from(lanes.max(1));
    if lanes == 1 {
        return 0;
    }
    (fnv1a(partition_key.as_bytes()) % lanes) as usize
}

/// Deals the records whose keys are `keys` (in order) to `lanes` lanes: for each lane,
/// the indices of its records, in order.
pub fn deal<'a>(keys: impl IntoIterator<Item = &'a str>, lanes: u16) -> Vec<Vec<usize>> {
    let mut dealt = vec![Vec::new(); usize::from(lanes.max(1))];
    for (index, key) in keys.into_iter().enumerate() {
        dealt[lane_of(key, lanes)].push(index);
    }
    dealt
}

/// FNV-1a, 64 bits: fast on short keys, and spreads keys that differ in one character.
fn fnv1a(bytes: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes.iter().fold(OFFSET, |hash, &byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_record_of_a_key_goes_to_one_lane_in_order() {
        let keys = ["a", "b", "a", "c", "b", "a"];
        for lanes in [1u16, 2, 4, 16, 100] {
            let dealt = deal(keys, lanes);
            assert_eq!(dealt.len(), usize::from(lanes));
            let mut all: Vec<usize> = dealt.iter().flatten().copied().collect();
            all.sort_unstable();
            assert_eq!(
                all,
                (0..keys.len()).collect::<Vec<_>>(),
                "{lanes}: each once"
            );
            for lane in &dealt {
                assert!(lane.windows(2).all(|w| w[0] < w[1]), "{lanes}: in order");
                for &i in lane {
                    assert_eq!(lane_of(keys[i], lanes), lane_of(keys[lane[0]], lanes));
                }
            }
            for key in ["a", "b", "c"] {
                let holding: Vec<usize> = (0..dealt.len())
                    .filter(|&l| dealt[l].iter().any(|&i| keys[i] == key))
                    .collect();
                assert_eq!(holding.len(), 1, "{lanes}: key {key} in one lane");
            }
        }
    }

    /// The hash is fixed: these values are what every flotilla version deals to.
    #[test]
    fn the_lane_of_a_key_is_stable() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(lane_of("anything", 1), 0);
        assert_eq!(lane_of("anything", 0), 0);
    }

    /// 100 keys over 16 lanes: no lane is empty and none holds more than a quarter, so
    /// the lanes share the work (the benchmark's keys).
    #[test]
    fn keys_spread_over_the_lanes() {
        let keys: Vec<String> = (0..100).map(|k| format!("key-{k}")).collect();
        let dealt = deal(keys.iter().map(String::as_str), 16);
        let sizes: Vec<usize> = dealt.iter().map(Vec::len).collect();
        assert!(sizes.iter().all(|&n| n > 0 && n <= 25), "{sizes:?}");
    }
}
