//! Items written to a table with a stream and the changes the stream owes for them, per
//! item: shared by the table-stream worker tests (`table_stream_servers.rs`) and the
//! `flotilla run` fleet test on a table's stream (`tests/fleet_processes.rs`).
//!
//! Every put raises the item's counter attribute [`COUNTER`] to a value no earlier put
//! of any item had, so each change's images say which write made it, and no put is
//! unchanged (an unchanged put would make no record).

use std::collections::BTreeMap;

use flotilla_actors::backend::{ItemWrite, TABLE_KEY};
use flotilla_actors::model::change::{AttributeValue, ChangeKind, DynamoChange, Item};

/// One change, in short: kind, the new image's counter, the old image's counter.
pub type Change = (ChangeKind, Option<u64>, Option<u64>);

/// The counter attribute every put raises.
pub const COUNTER: &str = "n";

/// Item `key` with counter `n`, and a text attribute.
pub fn item(key: &str, n: u64) -> Item {
    BTreeMap::from([
        (TABLE_KEY.to_owned(), AttributeValue::S(key.to_owned())),
        (COUNTER.to_owned(), AttributeValue::N(n.to_string())),
        (
            "note".to_owned(),
            AttributeValue::S(format!("{key} at {n}")),
        ),
    ])
}

/// The key of item `key`, as a change's `Keys`.
pub fn key_item(key: &str) -> Item {
    BTreeMap::from([(TABLE_KEY.to_owned(), AttributeValue::S(key.to_owned()))])
}

/// The items as written, and the changes the stream owes for them, per item.
#[derive(Debug, Default, Clone)]
pub struct Model {
    /// Each item's counter, while it exists.
    pub items: BTreeMap<String, u64>,
    /// Every put's counter comes from here, so no two puts of an item are alike (an
    /// unchanged put would make no record).
    pub next: u64,
    pub expected: BTreeMap<String, Vec<Change>>,
}

impl Model {
    /// Round `round` over keys `item-0..keys`: each item is put (an INSERT, or a MODIFY
    /// with its old counter), except every seventh, rotating, which is deleted when it
    /// exists (a REMOVE; it comes back as an INSERT on a later round).
    pub fn round(&mut self, round: u64, keys: u64) -> Vec<ItemWrite> {
        (0..keys)
            .map(|i| {
                let key = format!("item-{i}");
                if (i + round).is_multiple_of(7) && self.items.contains_key(&key) {
                    self.delete(&key)
                } else {
                    self.put(&key)
                }
            })
            .collect()
    }

    pub fn put(&mut self, key: &str) -> ItemWrite {
        self.next += 1;
        let n = self.next;
        let old = self.items.insert(key.to_owned(), n);
        let kind = if old.is_some() {
            ChangeKind::Modify
        } else {
            ChangeKind::Insert
        };
        self.owe(key, (kind, Some(n), old));
        ItemWrite::Put {
            attributes: item(key, n),
        }
    }

    pub fn delete(&mut self, key: &str) -> ItemWrite {
        let old = self.items.remove(key);
        assert!(old.is_some(), "the model deletes only what exists: {key}");
        self.owe(key, (ChangeKind::Remove, None, old));
        ItemWrite::Delete {
            key: key.to_owned(),
        }
    }

    fn owe(&mut self, key: &str, change: Change) {
        self.expected
            .entry(key.to_owned())
            .or_default()
            .push(change);
    }

    pub fn total(&self) -> usize {
        self.expected.values().map(Vec::len).sum()
    }

    /// What is owed since `before` was taken (a copy of this model, earlier).
    pub fn since(&self, before: &Model) -> BTreeMap<String, Vec<Change>> {
        self.expected
            .iter()
            .filter_map(|(key, all)| {
                let skip = before.expected.get(key).map_or(0, Vec::len);
                (all.len() > skip).then(|| (key.clone(), all[skip..].to_vec()))
            })
            .collect()
    }
}

/// The counter of an image, if there is one (panics on an image without it).
pub fn counter(image: &Option<Item>) -> Option<u64> {
    image.as_ref().map(|i| {
        i.get(COUNTER)
            .and_then(AttributeValue::as_n)
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("an image without its counter: {i:?}"))
    })
}

/// What a change record says, in short.
pub fn change_of(change: &DynamoChange) -> Change {
    (
        change.event_name,
        counter(&change.dynamodb.new_image),
        counter(&change.dynamodb.old_image),
    )
}

/// The item key (the `pk` string) of a change.
pub fn item_of(change: &DynamoChange) -> String {
    change.dynamodb.keys[TABLE_KEY]
        .as_s()
        .expect("a string key")
        .to_owned()
}
