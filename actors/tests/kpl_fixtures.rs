//! KPL aggregates made by AWS's Python aggregator, from tests/fixtures/kpl/. Every
//! case must de-aggregate to its `expected` records (which follow the Java KCL where the
//! Python library and Java disagree), field by field.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use flotilla_actors::backend::Record;
use flotilla_actors::kpl::{PassThrough, deaggregate, effective_hash_key};
use flotilla_actors::model::{HashKeyRange, SequenceNumber};
use serde::Deserialize;

/// Every case the fixture README lists, so a lost or added file fails the test.
const CASES: [&str; 19] = [
    "a-single-record",
    "b-three-records-same-pk",
    "c-hundred-distinct-pks",
    "d-explicit-hash-keys",
    "e-binary-and-empty-data",
    "f-near-1mb-limit",
    "g-plain-record",
    "h1-bad-md5",
    "h2-truncated-record",
    "h3-truncated-protobuf-valid-md5",
    "h4-magic-only",
    "h5-magic-plus-md5-of-empty-body",
    "h6-bad-magic",
    "h7-pk-index-out-of-range",
    "h8-missing-required-data-field",
    "i-mixed-explicit-hash-keys",
    "j-unicode-partition-keys",
    "k-zero-user-records",
    "l-hash-range-filter",
];
const SEQUENCE: &str = "49590338271490256608559692538361571095921575989136588898";

#[derive(Debug, Deserialize)]
struct Fixture {
    case: String,
    kinesis_record: KinesisRecord,
    kinesis_record_data_length: usize,
    expected: Vec<Expected>,
    java_kcl_with_shard_range: Option<WithShardRange>,
}

#[derive(Debug, Deserialize)]
struct KinesisRecord {
    partition_key: String,
    explicit_hash_key: Option<String>,
    data_base64: String,
}

#[derive(Debug, Deserialize)]
struct Expected {
    partition_key: String,
    explicit_hash_key: Option<String>,
    data_base64: String,
    sub_sequence_number: u64,
    aggregated: bool,
    effective_hash_key: String,
}

#[derive(Debug, Deserialize)]
struct WithShardRange {
    starting_hash_key: String,
    ending_hash_key: String,
    expected: Vec<Expected>,
}

fn fixtures() -> Vec<Fixture> {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kpl"));
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("KPL fixtures folder {}: {e}", dir.display()));
    let mut paths: Vec<PathBuf> = entries
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .collect();
    paths.sort();
    assert!(!paths.is_empty(), "no *.json in {}", dir.display());
    paths
        .iter()
        .map(|path| {
            let text =
                std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let fixture: Fixture =
                serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            assert_eq!(
                path.file_stem().and_then(|s| s.to_str()),
                Some(fixture.case.as_str()),
                "file name and case differ"
            );
            fixture
        })
        .collect()
}

fn arrival() -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(1_700_000_000_123)
}

fn kinesis_record(fixture: &Fixture) -> Record {
    let data = STANDARD
        .decode(&fixture.kinesis_record.data_base64)
        .unwrap();
    assert_eq!(
        data.len(),
        fixture.kinesis_record_data_length,
        "{}",
        fixture.case
    );
    Record {
        sequence_number: SequenceNumber::parse(SEQUENCE).unwrap(),
        sub_sequence_number: 0,
        partition_key: fixture.kinesis_record.partition_key.clone(),
        explicit_hash_key: fixture.kinesis_record.explicit_hash_key.clone(),
        data: Bytes::from(data),
        approximate_arrival: Some(arrival()),
    }
}

/// Compares what came out with the fixture's list; `aggregated` is whether the record was
/// de-aggregated rather than passed through.
fn assert_matches(case: &str, got: &[Record], aggregated: bool, expected: &[Expected]) {
    assert_eq!(got.len(), expected.len(), "{case}: number of records");
    for (i, (got, want)) in got.iter().zip(expected).enumerate() {
        let at = format!("{case} record {i}");
        assert_eq!(got.partition_key, want.partition_key, "{at}: partition key");
        assert_eq!(
            got.explicit_hash_key, want.explicit_hash_key,
            "{at}: explicit hash key"
        );
        assert_eq!(
            got.data,
            STANDARD.decode(&want.data_base64).unwrap(),
            "{at}: data"
        );
        assert_eq!(
            got.sub_sequence_number, want.sub_sequence_number,
            "{at}: sub-sequence number"
        );
        assert_eq!(aggregated, want.aggregated, "{at}: aggregated");
        let hash_key = effective_hash_key(&got.partition_key, got.explicit_hash_key.as_deref());
        assert_eq!(
            hash_key.map(|k| k.to_string()),
            Some(want.effective_hash_key.clone()),
            "{at}: effective hash key"
        );
        assert_eq!(
            got.sequence_number.as_str(),
            SEQUENCE,
            "{at}: sequence number"
        );
        assert_eq!(got.approximate_arrival, Some(arrival()), "{at}: arrival");
    }
}

#[test]
fn every_fixture_deaggregates_as_expected() {
    let fixtures = fixtures();
    let names: Vec<&str> = fixtures.iter().map(|f| f.case.as_str()).collect();
    assert_eq!(names, CASES, "fixture files");
    for fixture in &fixtures {
        let case = fixture.case.as_str();
        let mut out = Vec::new();
        let summary = deaggregate(kinesis_record(fixture), None, &mut out);
        assert_matches(
            case,
            &out,
            summary.passed_through.is_none(),
            &fixture.expected,
        );
        assert_eq!(summary.dropped_out_of_range, 0, "{case}");
        if summary.passed_through.is_none() {
            assert_eq!(summary.user_records, out.len(), "{case}: user_records");
        } else {
            assert_eq!(summary.user_records, 0, "{case}: user_records");
        }
        // The cases whose outcome is not just "every record delivered".
        match case {
            "g-plain-record" | "h6-bad-magic" => {
                assert_eq!(summary.passed_through, Some(PassThrough::NotAggregated));
            }
            "h1-bad-md5" | "h2-truncated-record" => {
                assert_eq!(summary.passed_through, Some(PassThrough::ChecksumMismatch));
            }
            "h4-magic-only" | "h5-magic-plus-md5-of-empty-body" => {
                assert_eq!(summary.passed_through, Some(PassThrough::TooShort));
            }
            "h3-truncated-protobuf-valid-md5" | "h8-missing-required-data-field" => {
                assert!(
                    matches!(
                        summary.passed_through,
                        Some(PassThrough::InvalidProtobuf(_))
                    ),
                    "{case}: {summary:?}"
                );
            }
            "h7-pk-index-out-of-range" => {
                let error = summary.partial_error.as_ref().expect("partial error");
                assert_eq!(
                    error.to_string(),
                    "user record 2: partition key index 5 is outside the 1-entry table"
                );
            }
            _ => assert_eq!(summary.partial_error, None, "{case}"),
        }
    }
}

#[test]
fn a_shard_range_drops_the_whole_aggregate_as_java_does() {
    let fixtures = fixtures();
    let mut seen = 0;
    for fixture in &fixtures {
        let Some(java) = &fixture.java_kcl_with_shard_range else {
            continue;
        };
        seen += 1;
        let range = HashKeyRange::parse(&java.starting_hash_key, &java.ending_hash_key).unwrap();
        assert_eq!(range.end, (1u128 << 127) - 1);
        // Records already in `out` belong to earlier Kinesis records and must stay.
        let earlier = kinesis_record(fixture);
        let mut out = vec![earlier.clone()];
        let summary = deaggregate(kinesis_record(fixture), Some(&range), &mut out);
        assert_eq!(out.first(), Some(&earlier));
        assert_matches(&fixture.case, &out[1..], true, &java.expected);
        assert_eq!(summary.dropped_out_of_range, fixture.expected.len());
        assert_eq!(summary.user_records, 0);
        assert_eq!(summary.passed_through, None);
    }
    assert_eq!(seen, 1, "fixtures with java_kcl_with_shard_range");
}
