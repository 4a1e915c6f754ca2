//! Lease rows written by another KCL-compatible implementation (kcl-rs, a port of the
//! Java KCL), and the Java KCL's attribute list, from tests/fixtures/lease-table/ (its
//! README says where they came from).
//! Every row there must read correctly, and what flotilla writes must match them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::PathBuf;

use flotilla_actors::model::item::{
    AttrValue, Item, PENDING_ATTRS, Row, decode_row, encode_lease, pending_checkpoint_attrs,
};
use flotilla_actors::model::{Checkpoint, Lease, LeaseKey, ShardId, StreamIdentifier, WorkerId};

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/lease-table")
}

fn read(file: &str) -> String {
    let path = dir().join(file);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn items(file: &str) -> Vec<Item> {
    let doc: serde_json::Value = serde_json::from_str(&read(file)).unwrap();
    serde_json::from_value(doc["items"].clone()).unwrap()
}

fn lease(item: &Item) -> Lease {
    match decode_row(item) {
        Ok(Row::Lease(lease)) => *lease,
        other => panic!("{other:?} from {item:?}"),
    }
}

fn by_key<'a>(leases: &'a [Lease], key: &str) -> &'a Lease {
    leases.iter().find(|l| l.key.as_str() == key).unwrap()
}

const FILES: [&str; 3] = [
    "fixture-app.before-split.json",
    "fixture-app.after-split.json",
    "fixture-multi-app.json",
];

#[test]
fn every_fixture_row_reads_as_a_lease() {
    let mut rows = 0;
    for file in FILES {
        for item in items(file) {
            let lease = lease(&item);
            assert_eq!(lease.owner, Some(WorkerId::new("worker-1")), "{file}");
            rows += 1;
        }
    }
    assert_eq!(rows, 14);
}

#[test]
fn the_split_reads_as_the_java_kcl_wrote_it() {
    let leases: Vec<Lease> = items("fixture-app.after-split.json")
        .iter()
        .map(lease)
        .collect();
    let parent = by_key(&leases, "shardId-000000000000");
    assert_eq!(parent.checkpoint, Checkpoint::ShardEnd);
    let mut children = parent.child_shard_ids.clone();
    children.sort();
    assert_eq!(children, [ShardId::from_index(4), ShardId::from_index(5)]);
    assert_eq!(parent.counter, 11);
    let range = parent.hash_range.unwrap();
    assert_eq!(
        (range.start, range.end),
        (0, 85070591730234615865843651857942052862)
    );

    for child in ["shardId-000000000004", "shardId-000000000005"] {
        assert_eq!(
            by_key(&leases, child).parent_shard_ids,
            [ShardId::from_index(0)]
        );
    }
    // Shard 3 has only a prepared (two-phase) checkpoint: it still starts at TRIM_HORIZON.
    let prepared = by_key(&leases, "shardId-000000000003");
    assert_eq!(prepared.checkpoint, Checkpoint::TrimHorizon);
    assert_eq!(
        prepared
            .pending_checkpoint
            .as_ref()
            .unwrap()
            .sequence
            .as_str(),
        "49680458031214033458151125408336582481295989964940509234"
    );
    // Prepared without application state (kcl-rs has no state argument): none is read,
    // and flotilla's prepare writes the same two attributes for it.
    let pending = prepared.pending_checkpoint.as_ref().unwrap();
    assert_eq!(pending.sub_sequence, 0);
    assert_eq!(prepared.pending_checkpoint_state, None);
    let row = items("fixture-app.after-split.json")
        .into_iter()
        .find(|i| i.get("leaseKey") == Some(&AttrValue::S("shardId-000000000003".into())))
        .unwrap();
    let (set, remove) = pending_checkpoint_attrs(pending, None);
    for (name, value) in set {
        assert_eq!(row.get(name), Some(&value), "{name}");
    }
    assert_eq!(remove, ["pendingCheckpointState"]);
    // 56-digit checkpoints are sequence numbers, compared numerically.
    let one = by_key(&leases, "shardId-000000000001");
    let Checkpoint::At(at) = &one.checkpoint else {
        panic!("{:?}", one.checkpoint)
    };
    assert_eq!(at.sequence.as_str().len(), 56);
    assert_eq!(at.sub_sequence, 0);
}

#[test]
fn multi_stream_keys_name_their_shards() {
    let leases: Vec<Lease> = items("fixture-multi-app.json").iter().map(lease).collect();
    let shards: BTreeSet<String> = leases
        .iter()
        .map(|l| l.key.shard_id().to_string())
        .collect();
    assert_eq!(
        shards,
        BTreeSet::from(["shardId-000000000000".into(), "shardId-000000000001".into()])
    );
    assert!(
        leases
            .iter()
            .all(|l| l.key.as_str().starts_with("123456789012:fixture-ms-"))
    );
    // The key's stream part is the row's streamName, an identifier flotilla reads, and
    // the key flotilla would make for that stream and shard is the KCL's key.
    for item in items("fixture-multi-app.json") {
        let lease = lease(&item);
        let Some(AttrValue::S(stream_name)) = item.get("streamName") else {
            panic!("{item:?}")
        };
        assert_eq!(lease.key.stream_id(), Some(stream_name.as_str()));
        let id = StreamIdentifier::parse(stream_name).unwrap();
        assert_eq!(
            (id.account.as_str(), id.creation_epoch),
            ("123456789012", 1_795_345_735)
        );
        assert_eq!(id.lease_key(&lease.key.shard_id()), lease.key);
    }
}

/// A multi-stream row flotilla creates is the row the KCL created, attribute for
/// attribute (the conditional PutItems of the operation log), so either reads the
/// other's table.
#[test]
fn created_multi_stream_rows_are_written_as_the_kcl_writes_them() {
    let mut created = 0;
    for line in read("fixture-multi-app.dynamodb-ops.jsonl").lines() {
        let op: serde_json::Value = serde_json::from_str(line).unwrap();
        if op["target"] != "DynamoDB_20120810.PutItem" {
            continue;
        }
        let item: Item = serde_json::from_value(op["request"]["Item"].clone()).unwrap();
        let ours = encode_lease(&lease(&item));
        let theirs: BTreeSet<&String> = item.keys().collect();
        assert_eq!(ours.keys().collect::<BTreeSet<_>>(), theirs);
        for (name, value) in &ours {
            assert_eq!(sorted(value), sorted(&item[name]), "{name}");
        }
        created += 1;
    }
    assert_eq!(created, 4);
}

/// The KCL's checkpoint writes in the operation log remove the prepared checkpoint's
/// three attributes, the ones flotilla's checkpoint write removes.
#[test]
fn a_checkpoint_removes_the_pending_attributes_the_kcl_removes() {
    let mut checkpoints = 0;
    for line in read("fixture-multi-app.dynamodb-ops.jsonl").lines() {
        let op: serde_json::Value = serde_json::from_str(line).unwrap();
        let updates = &op["request"]["AttributeUpdates"];
        if updates["checkpoint"]["Action"] != "PUT" {
            continue;
        }
        let mut deleted: Vec<&str> = updates
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, u)| u["Action"] == "DELETE")
            .map(|(name, _)| name.as_str())
            .collect();
        deleted.sort();
        let mut ours = PENDING_ATTRS.to_vec();
        ours.sort();
        assert_eq!(deleted, ours, "{line}");
        checkpoints += 1;
    }
    assert_eq!(checkpoints, 4);
}

/// What flotilla writes for a lease is what the other implementation wrote: same names,
/// same types, same encodings. The attributes left over are the ones we do not write.
#[test]
fn flotilla_writes_the_same_attributes() {
    let mut unwritten = BTreeSet::new();
    for file in FILES {
        for item in items(file) {
            let ours = encode_lease(&lease(&item));
            for (name, value) in &ours {
                let theirs = item
                    .get(name)
                    .unwrap_or_else(|| panic!("{file}: we write {name}, they do not"));
                assert_eq!(sorted(value), sorted(theirs), "{file}: {name}");
            }
            unwritten.extend(item.keys().filter(|k| !ours.contains_key(*k)).cloned());
        }
    }
    // throughputKBps is KCL 3.x load data, not needed to resume from a checkpoint.
    // (streamName and shardId, the multi-stream extras, are written: the KCL's
    // multi-stream serializer needs them to read a row.)
    assert_eq!(unwritten, BTreeSet::from(["throughputKBps".into()]));
}

fn sorted(value: &AttrValue) -> AttrValue {
    match value {
        AttrValue::SS(v) => {
            let mut v = v.clone();
            v.sort();
            AttrValue::SS(v)
        }
        other => other.clone(),
    }
}

/// The rows kcl-rs created with conditional PutItems (from its recorded DynamoDB calls).
#[test]
fn created_rows_in_the_operation_log_read_as_new_leases() {
    let mut created = 0;
    for line in read("fixture-multi-app.dynamodb-ops.jsonl").lines() {
        let op: serde_json::Value = serde_json::from_str(line).unwrap();
        if op["target"] != "DynamoDB_20120810.PutItem" {
            continue;
        }
        let item: Item = serde_json::from_value(op["request"]["Item"].clone()).unwrap();
        let lease = lease(&item);
        assert_eq!(
            (lease.owner.as_ref(), lease.counter, &lease.checkpoint),
            (None, 0, &Checkpoint::TrimHorizon)
        );
        assert_eq!(
            op["request"]["Expected"]["leaseKey"]["Exists"], false,
            "creation is conditional"
        );
        created += 1;
    }
    assert_eq!(created, 4);
}

/// Every attribute the Java KCL can write (the table in the fixtures' README), in the
/// type it writes it, is accepted in a lease row; the ones flotilla reads it reads in
/// that type.
#[test]
fn every_java_kcl_attribute_is_accepted() {
    let readme = read("README.md");
    let section = readme
        .split("## Attributes the Java KCL writes")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let mut seen = 0;
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        let name = cells[1].trim_matches('`');
        let kind = cells[2].split_whitespace().next().unwrap();
        let sample = match (name, kind) {
            ("leaseKey", _) => continue,
            ("checkpoint" | "pendingCheckpoint", _) => {
                AttrValue::S("49680458031169431967754064162084943116060673600470908946".into())
            }
            ("startingHashKey" | "endingHashKey", _) => AttrValue::S("12345".into()),
            ("entityType", _) => AttrValue::S("LEASE".into()),
            (_, "S") => AttrValue::S("worker-9".into()),
            (_, "N") => AttrValue::N("3".into()),
            (_, "SS") => AttrValue::SS(vec!["shardId-000000000009".into()]),
            (_, "B") => AttrValue::B("AAEC".into()),
            other => panic!("unknown attribute type in the README: {other:?}"),
        };
        let mut row = encode_lease(&Lease::new(
            &ShardId::from_index(9),
            Checkpoint::Latest,
            vec![],
            None,
        ));
        if name == "endingHashKey" {
            row.insert("startingHashKey".into(), AttrValue::S("1".into()));
        }
        if name == "startingHashKey" {
            row.insert("endingHashKey".into(), AttrValue::S("99999".into()));
        }
        row.insert(name.into(), sample);
        let read = lease(&row);
        assert_eq!(read.key, LeaseKey::new("shardId-000000000009"), "{name}");
        if name == "pendingCheckpointState" {
            assert_eq!(read.pending_checkpoint_state, Some(vec![0, 1, 2]));
            // The KCL's create path can write it as a number (the README's upstream
            // quirk): the row stays readable, without a state.
            row.insert(name.into(), AttrValue::N("0".into()));
            assert_eq!(lease(&row).pending_checkpoint_state, None);
        }
        seen += 1;
    }
    assert_eq!(
        seen, 17,
        "the README lists 18 attributes, leaseKey included"
    );
}
