//! A DynamoDB Streams change record, as a processor receives it in [`crate::Record`]'s
//! `data` when the source is a table's stream.
//!
//! The JSON is the shape AWS documents for stream records (the one Lambda and the
//! DynamoDB Streams Kinesis adapter hand out): `eventID`, `eventName`, `dynamodb` with
//! `Keys` / `NewImage` / `OldImage` as attribute-value JSON, `SequenceNumber`,
//! `SizeBytes`, `StreamViewType`, `ApproximateCreationDateTime` (whole seconds since
//! the epoch), and `userIdentity` for deletes made by TTL. Users of other languages
//! (MultiLang, stdout) read it as JSON; Rust users call
//! [`crate::Record::dynamodb_change`] and get this type. Both adapters (AWS and memory)
//! build it, so the two cannot drift apart.

use std::fmt;

use serde::{Deserialize, Serialize};

/// One DynamoDB attribute value, in DynamoDB's JSON: `{"S": "text"}`, `{"N": "12.5"}`,
/// `{"B": "<base64>"}`, sets, `{"M": {...}}`, `{"L": [...]}`, `{"NULL": true}`,
/// `{"BOOL": false}`. Numbers stay text (DynamoDB's are 38 digits, wider than `f64`).
/// The lease-table codec's type: one definition of DynamoDB's values.
pub use super::item::AttrValue as AttributeValue;
/// An item (or a key) as a map of attribute names to values, ordered by name so that
/// its JSON is the same text for the same item.
pub use super::item::Item;

/// What happened to the item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum ChangeKind {
    /// A new item was put (`INSERT`).
    Insert,
    /// An existing item was changed (`MODIFY`).
    Modify,
    /// An item was deleted, by a user or by TTL (`REMOVE`; see [`DynamoChange::is_ttl_delete`]).
    Remove,
}

impl ChangeKind {
    /// `eventName` as DynamoDB Streams spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Insert => "INSERT",
            Self::Modify => "MODIFY",
            Self::Remove => "REMOVE",
        }
    }

    /// Reads `eventName`; `None` for a name this code does not know.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "INSERT" => Some(Self::Insert),
            "MODIFY" => Some(Self::Modify),
            "REMOVE" => Some(Self::Remove),
            _ => None,
        }
    }
}

impl fmt::Display for ChangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which images a stream's records carry (the table's `StreamViewType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StreamViewType {
    /// Only the item's key (`KEYS_ONLY`).
    KeysOnly,
    /// The item as it is after the change (`NEW_IMAGE`).
    NewImage,
    /// The item as it was before the change (`OLD_IMAGE`).
    OldImage,
    /// The item before and after the change (`NEW_AND_OLD_IMAGES`).
    NewAndOldImages,
}

impl StreamViewType {
    /// Reads `StreamViewType`; `None` for a view this code does not know.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "KEYS_ONLY" => Some(Self::KeysOnly),
            "NEW_IMAGE" => Some(Self::NewImage),
            "OLD_IMAGE" => Some(Self::OldImage),
            "NEW_AND_OLD_IMAGES" => Some(Self::NewAndOldImages),
            _ => None,
        }
    }

    /// `StreamViewType` as DynamoDB spells it.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::KeysOnly => "KEYS_ONLY",
            Self::NewImage => "NEW_IMAGE",
            Self::OldImage => "OLD_IMAGE",
            Self::NewAndOldImages => "NEW_AND_OLD_IMAGES",
        }
    }

    /// Whether records of this view carry the item after the change.
    pub fn has_new_image(&self) -> bool {
        matches!(self, Self::NewImage | Self::NewAndOldImages)
    }

    /// Whether records of this view carry the item before the change.
    pub fn has_old_image(&self) -> bool {
        matches!(self, Self::OldImage | Self::NewAndOldImages)
    }
}

/// Who made the change: present only for items deleted by DynamoDB's TTL, as
/// `{"type": "Service", "principalId": "dynamodb.amazonaws.com"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserIdentity {
    /// `type`: `Service` for a TTL delete.
    #[serde(rename = "type")]
    pub kind: String,
    /// `principalId`: `dynamodb.amazonaws.com` for a TTL delete.
    #[serde(rename = "principalId")]
    pub principal_id: String,
}

impl UserIdentity {
    /// The identity DynamoDB puts on a delete made by TTL.
    pub fn ttl() -> Self {
        Self {
            kind: "Service".to_owned(),
            principal_id: "dynamodb.amazonaws.com".to_owned(),
        }
    }
}

/// The `dynamodb` part of a change: the item's key, its images, and where it is in the
/// shard.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChangeBody {
    /// Whole seconds since the epoch (DynamoDB rounds down to the second).
    #[serde(
        rename = "ApproximateCreationDateTime",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub approximate_creation_secs: Option<i64>,
    /// `Keys`: the item's key attributes (always present, whatever the view type).
    #[serde(rename = "Keys")]
    pub keys: Item,
    /// `NewImage`: the item after the change; `None` for a removal, or when the view omits it.
    #[serde(rename = "NewImage", default, skip_serializing_if = "Option::is_none")]
    pub new_image: Option<Item>,
    /// `OldImage`: the item before the change; `None` for an insert, or when the view omits it.
    #[serde(rename = "OldImage", default, skip_serializing_if = "Option::is_none")]
    pub old_image: Option<Item>,
    /// `SequenceNumber`: the stream record's sequence number in its shard (decimal text), the
    /// same as the carrying record's.
    #[serde(rename = "SequenceNumber")]
    pub sequence_number: String,
    /// `SizeBytes`: the stream record's size in bytes, as DynamoDB reports it; `None` if absent.
    #[serde(rename = "SizeBytes", default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// `StreamViewType`: which images the stream carries; `None` if absent or unknown.
    #[serde(
        rename = "StreamViewType",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub stream_view_type: Option<StreamViewType>,
}

/// One change of one item: a record of a table's stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DynamoChange {
    /// `eventID`: the stream record's unique id.
    #[serde(rename = "eventID")]
    pub event_id: String,
    /// `eventName`: insert, modify or remove.
    #[serde(rename = "eventName")]
    pub event_name: ChangeKind,
    /// `eventVersion`: the record format's version (today [`Self::EVENT_VERSION`]); `None` if
    /// absent.
    #[serde(
        rename = "eventVersion",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub event_version: Option<String>,
    /// `eventSource`: always [`Self::EVENT_SOURCE`] from DynamoDB; `None` if absent.
    #[serde(
        rename = "eventSource",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub event_source: Option<String>,
    /// `awsRegion`: the table's region; `None` if absent.
    #[serde(rename = "awsRegion", default, skip_serializing_if = "Option::is_none")]
    pub aws_region: Option<String>,
    /// `dynamodb`: the key, the images and the record's place in the shard.
    pub dynamodb: ChangeBody,
    /// `userIdentity`: who made the change; only on deletes made by TTL, else `None`.
    #[serde(
        rename = "userIdentity",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub user_identity: Option<UserIdentity>,
}

/// Why a record's data is not a change record.
#[derive(Debug, thiserror::Error)]
#[error("the record is not a DynamoDB Streams change (JSON as AWS documents stream records): {0}")]
pub struct ChangeError(#[from] serde_json::Error);

impl DynamoChange {
    /// `eventSource` of every DynamoDB Streams record.
    pub const EVENT_SOURCE: &'static str = "aws:dynamodb";
    /// `eventVersion` DynamoDB Streams writes today.
    pub const EVENT_VERSION: &'static str = "1.1";

    /// The item's key as one text: its `Keys` as compact JSON, attributes in name order
    /// (`{"pk":{"S":"a"}}`). The same item always gives the same text, and two items
    /// never do, so it serves as the record's partition key: per-key order is per-item
    /// order.
    pub fn key_text(&self) -> String {
        item_key_text(&self.dynamodb.keys)
    }

    /// Whether DynamoDB's TTL deleted the item (not a user's DeleteItem).
    pub fn is_ttl_delete(&self) -> bool {
        self.event_name == ChangeKind::Remove
            && self
                .user_identity
                .as_ref()
                .is_some_and(|u| u.principal_id == "dynamodb.amazonaws.com")
    }

    /// The record's `data`: this change as JSON.
    pub fn to_json(&self) -> Vec<u8> {
        // Serializing these types cannot fail: string keys, no floats, no custom code.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Reads a record's `data` as a change; [`ChangeError`] if it is not one (not a table
    /// stream's record, or a shape this code does not know).
    pub fn from_json(data: &[u8]) -> Result<Self, ChangeError> {
        Ok(serde_json::from_slice(data)?)
    }
}

/// An item key as the text [`DynamoChange::key_text`] gives.
pub fn item_key_text(keys: &Item) -> String {
    serde_json::to_string(keys).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example of AWS's "DynamoDB Streams and AWS Lambda" documentation, as a
    /// Lambda event record carries it: every field this type reads, in AWS's spelling.
    const AWS_EXAMPLE: &str = r#"{
        "eventID": "c81e728d9d4c2f636f067f89cc14862c",
        "eventName": "MODIFY",
        "eventVersion": "1.1",
        "eventSource": "aws:dynamodb",
        "awsRegion": "us-east-1",
        "dynamodb": {
            "ApproximateCreationDateTime": 1428537600,
            "Keys": {"Id": {"N": "101"}},
            "NewImage": {"Message": {"S": "This item has changed"}, "Id": {"N": "101"}},
            "OldImage": {"Message": {"S": "New item!"}, "Id": {"N": "101"}},
            "SequenceNumber": "222",
            "SizeBytes": 59,
            "StreamViewType": "NEW_AND_OLD_IMAGES"
        },
        "eventSourceARN": "arn:aws:dynamodb:us-east-1:123456789012:table/ExampleTable/stream/2015-06-27T00:48:05.899"
    }"#;

    #[test]
    fn reads_the_documented_shape_and_ignores_what_it_does_not_use() {
        let change = DynamoChange::from_json(AWS_EXAMPLE.as_bytes()).unwrap();
        assert_eq!(change.event_name, ChangeKind::Modify);
        assert_eq!(change.dynamodb.keys["Id"].as_n(), Some("101"));
        assert_eq!(
            change.dynamodb.new_image.as_ref().unwrap()["Message"].as_s(),
            Some("This item has changed")
        );
        assert_eq!(change.dynamodb.sequence_number, "222");
        assert_eq!(
            change.dynamodb.approximate_creation_secs,
            Some(1_428_537_600)
        );
        assert_eq!(
            change.dynamodb.stream_view_type,
            Some(StreamViewType::NewAndOldImages)
        );
        assert_eq!(change.key_text(), r#"{"Id":{"N":"101"}}"#);
        assert!(!change.is_ttl_delete());
    }

    #[test]
    fn round_trips_every_attribute_type() {
        let mut image = Item::new();
        image.insert("s".into(), AttributeValue::S("x".into()));
        image.insert("n".into(), AttributeValue::N("-1.5e3".into()));
        image.insert("b".into(), AttributeValue::B("AAE=".into()));
        image.insert("ss".into(), AttributeValue::SS(vec!["a".into()]));
        image.insert("ns".into(), AttributeValue::NS(vec!["1".into()]));
        image.insert("bs".into(), AttributeValue::BS(vec!["AA==".into()]));
        image.insert(
            "m".into(),
            AttributeValue::M(Item::from([("k".into(), AttributeValue::Bool(true))])),
        );
        image.insert(
            "l".into(),
            AttributeValue::L(vec![AttributeValue::Null(true)]),
        );
        let change = DynamoChange {
            event_id: "1".into(),
            event_name: ChangeKind::Remove,
            event_version: Some(DynamoChange::EVENT_VERSION.into()),
            event_source: Some(DynamoChange::EVENT_SOURCE.into()),
            aws_region: None,
            dynamodb: ChangeBody {
                approximate_creation_secs: None,
                keys: Item::from([("s".into(), AttributeValue::S("x".into()))]),
                new_image: None,
                old_image: Some(image),
                sequence_number: "9".into(),
                size_bytes: Some(10),
                stream_view_type: Some(StreamViewType::OldImage),
            },
            user_identity: Some(UserIdentity::ttl()),
        };
        let json: serde_json::Value = serde_json::from_slice(&change.to_json()).unwrap();
        assert_eq!(
            json["dynamodb"]["OldImage"]["l"],
            serde_json::json!({"L": [{"NULL": true}]})
        );
        assert_eq!(
            json["dynamodb"]["OldImage"]["m"],
            serde_json::json!({"M": {"k": {"BOOL": true}}})
        );
        assert_eq!(
            json["userIdentity"]["principalId"],
            "dynamodb.amazonaws.com"
        );
        assert_eq!(json["eventName"], "REMOVE");
        assert!(json["dynamodb"].get("NewImage").is_none());
        assert_eq!(DynamoChange::from_json(&change.to_json()).unwrap(), change);
        assert!(change.is_ttl_delete());
    }

    #[test]
    fn a_record_that_is_not_a_change_says_so() {
        let error = DynamoChange::from_json(b"order-17").unwrap_err();
        assert!(
            error.to_string().contains("not a DynamoDB Streams change"),
            "{error}"
        );
    }

    #[test]
    fn the_key_text_is_the_same_whatever_order_the_attributes_came_in() {
        let a = r#"{"eventID":"1","eventName":"INSERT","dynamodb":{"Keys":{"pk":{"S":"a"},"sk":{"N":"1"}},"SequenceNumber":"1"}}"#;
        let b = r#"{"eventID":"2","eventName":"INSERT","dynamodb":{"Keys":{"sk":{"N":"1"},"pk":{"S":"a"}},"SequenceNumber":"2"}}"#;
        let (a, b) = (
            DynamoChange::from_json(a.as_bytes()).unwrap(),
            DynamoChange::from_json(b.as_bytes()).unwrap(),
        );
        assert_eq!(a.key_text(), b.key_text());
        assert_eq!(a.key_text(), r#"{"pk":{"S":"a"},"sk":{"N":"1"}}"#);
    }
}
