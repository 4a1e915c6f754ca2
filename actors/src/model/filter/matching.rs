//! Matching a record's partition key and data against the rule tree of [`super`], as
//! Lambda's filters match a Kinesis event: the data read as JSON once, and only when a
//! pattern gets to it, so that records a pattern rejects by key cost no parse; numbers
//! exact as written except under `numeric`; arrays in the record matching by any element.
//! The tree was checked when read, so nothing here can fail.

use std::cell::OnceCell;

use serde_json::{Number, Value};

use super::{DATA, Exact, Node, Not, Object, PARTITION_KEY, Pattern, Range, Rule, Text};

/// What a record holds at a field: nothing, a JSON value, or (the partition key) text.
#[derive(Debug, Clone, Copy)]
enum Found<'a> {
    Missing,
    Json(&'a Value),
    Text(&'a str),
}

/// A leaf value of a record: what a rule is matched against.
#[derive(Debug, Clone, Copy)]
enum Scalar<'a> {
    Str(&'a str),
    Num(&'a Number),
    Bool(bool),
    Null,
}

/// Whether the record's fields match any of the patterns. A pattern that names `data`
/// fails a record whose data is not JSON, whatever its rules, as Lambda drops it.
pub(super) fn any_matches(patterns: &[Pattern], partition_key: &str, data: &[u8]) -> bool {
    let parsed: OnceCell<Option<Value>> = OnceCell::new();
    let json = || {
        parsed
            .get_or_init(|| serde_json::from_slice(data).ok())
            .as_ref()
    };
    let lookup = |key: &str| match key {
        PARTITION_KEY => Found::Text(partition_key),
        DATA => json().map_or(Found::Missing, Found::Json),
        _ => Found::Missing,
    };
    patterns
        .iter()
        .any(|p| p.top.matches(&lookup) && (!p.reads_data || json().is_some()))
}

impl Object {
    /// Every field matches the record's value at its key, and one alternative if any.
    fn matches<'a>(&self, lookup: &dyn Fn(&str) -> Found<'a>) -> bool {
        self.fields
            .iter()
            .all(|(key, node)| node.matches(lookup(key)))
            && (self.any_of.is_empty() || self.any_of.iter().any(|o| o.matches(lookup)))
    }

    /// Matches the object a field holds. An array holds several: one must match (all of
    /// this object's fields from the same element, as EventBridge matches). Anything
    /// else holds none of the fields, which only `exists: false` rules accept.
    fn matches_value(&self, value: Option<&Value>) -> bool {
        match value {
            Some(Value::Object(map)) => {
                self.matches(&|key: &str| map.get(key).map_or(Found::Missing, Found::Json))
            }
            Some(Value::Array(items)) => {
                let mut objects = Vec::new();
                objects_in(items, &mut objects);
                if objects.is_empty() {
                    self.matches_value(None)
                } else {
                    objects.into_iter().any(|o| self.matches_value(Some(o)))
                }
            }
            _ => self.matches(&|_: &str| Found::Missing),
        }
    }
}

/// The objects of an array, arrays within it flattened.
fn objects_in<'a>(items: &'a [Value], out: &mut Vec<&'a Value>) {
    for item in items {
        match item {
            Value::Object(_) => out.push(item),
            Value::Array(inner) => objects_in(inner, out),
            _ => {}
        }
    }
}

impl Node {
    fn matches(&self, found: Found<'_>) -> bool {
        match self {
            Node::Rules(rules) => rules_match(rules, found),
            Node::Object(object) => match found {
                Found::Json(value) => object.matches_value(Some(value)),
                Found::Missing | Found::Text(_) => object.matches_value(None),
            },
        }
    }
}

/// Any rule matches the field. A field is present when it holds a leaf value (an
/// object, or an array of nothing but objects, is not one: Lambda's `exists` "only
/// works on leaf nodes"); an array matches when any of its values does.
fn rules_match(rules: &[Rule], found: Found<'_>) -> bool {
    let present = any_scalar(found, &mut |_| true);
    rules.iter().any(|rule| match rule {
        Rule::Exists(wanted) => *wanted == present,
        _ => present && any_scalar(found, &mut |s| rule.accepts(s)),
    })
}

/// Whether `test` holds for any leaf value of the field.
fn any_scalar<'a>(found: Found<'a>, test: &mut dyn FnMut(Scalar<'a>) -> bool) -> bool {
    match found {
        Found::Missing => false,
        Found::Text(text) => test(Scalar::Str(text)),
        Found::Json(value) => any_leaf(value, test),
    }
}

fn any_leaf<'a>(value: &'a Value, test: &mut dyn FnMut(Scalar<'a>) -> bool) -> bool {
    match value {
        Value::String(s) => test(Scalar::Str(s)),
        Value::Number(n) => test(Scalar::Num(n)),
        Value::Bool(b) => test(Scalar::Bool(*b)),
        Value::Null => test(Scalar::Null),
        Value::Array(items) => items.iter().any(|item| any_leaf(item, test)),
        Value::Object(_) => false,
    }
}

impl Rule {
    fn accepts(&self, value: Scalar<'_>) -> bool {
        match self {
            Rule::Exact(exact) => exact.is(value),
            Rule::Prefix(text) => value
                .text()
                .is_some_and(|s| text.fits(s, |s, p| s.starts_with(p))),
            Rule::Suffix(text) => value
                .text()
                .is_some_and(|s| text.fits(s, |s, p| s.ends_with(p))),
            Rule::EqualsIgnoreCase(lower) => {
                value.text().is_some_and(|s| s.to_lowercase() == *lower)
            }
            Rule::AnythingBut(not) => not.accepts(value),
            Rule::Numeric(range) => value.number().is_some_and(|n| range.holds(n)),
            Rule::Exists(_) => false,
        }
    }
}

impl Exact {
    fn is(&self, value: Scalar<'_>) -> bool {
        match (self, value) {
            (Exact::Str(a), Scalar::Str(b)) => a == b,
            (Exact::Num(a), Scalar::Num(b)) => a == b,
            (Exact::Bool(a), Scalar::Bool(b)) => *a == b,
            (Exact::Null, Scalar::Null) => true,
            _ => false,
        }
    }
}

impl Text {
    fn fits(&self, value: &str, test: fn(&str, &str) -> bool) -> bool {
        if self.ignore_case {
            test(&value.to_lowercase(), &self.text)
        } else {
            test(value, &self.text)
        }
    }
}

impl Not {
    /// The value is not excluded. The text forms (`prefix`, `suffix`,
    /// `equals-ignore-case`) accept strings only, as their positive forms do.
    fn accepts(&self, value: Scalar<'_>) -> bool {
        match self {
            Not::Values(values) => !values.iter().any(|v| v.is(value)),
            Not::Prefix(prefix) => value
                .text()
                .is_some_and(|s| !s.starts_with(prefix.as_str())),
            Not::Suffix(suffix) => value.text().is_some_and(|s| !s.ends_with(suffix.as_str())),
            Not::IgnoreCase(lower) => value.text().is_some_and(|s| {
                let s = s.to_lowercase();
                !lower.contains(&s)
            }),
        }
    }
}

impl Range {
    fn holds(&self, n: f64) -> bool {
        let above = self
            .lower
            .is_none_or(|(low, inclusive)| if inclusive { n >= low } else { n > low });
        let below = self
            .upper
            .is_none_or(|(high, inclusive)| if inclusive { n <= high } else { n < high });
        above && below
    }
}

impl<'a> Scalar<'a> {
    fn text(self) -> Option<&'a str> {
        match self {
            Scalar::Str(s) => Some(s),
            _ => None,
        }
    }

    /// A JSON number's value; `numeric` never matches a string, however it reads.
    fn number(self) -> Option<f64> {
        match self {
            Scalar::Num(n) => n.as_f64(),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::RecordFilter;

    fn filter(patterns: &[&str]) -> RecordFilter {
        let patterns: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
        RecordFilter::parse(&patterns).unwrap().unwrap()
    }

    /// `(what, patterns, partition key, data, handed over)`. The examples marked
    /// "Lambda" are those of Lambda's developer guide: "Using event filtering with a
    /// Kinesis event source" (the order record), "Lambda event filtering" (Filtering
    /// examples: partitionKey and Location, Temperature; the exists note's person) and
    /// its table of comparison operators (UserID … FileName).
    #[test]
    fn records_match_as_lambda_matches_them() {
        const ORDER: &str =
            r#"{"record": 12345, "order": {"type": "buy", "stock": "ANYCO", "quantity": 1000}}"#;
        const SELL: &str = r#"{"record": 12346, "order": {"type": "sell", "stock": "ANYCO"}}"#;
        const LA: &str = r#"{"Location": "Los Angeles"}"#;
        const AND: &str = r#"{"partitionKey": ["1"], "data": {"Location": ["Los Angeles"]}}"#;
        const TEMPERATURE: &str =
            r#"{"data": {"Temperature": [{"numeric": [">", 50, "<=", 60]}]}}"#;
        const PERSON: &str = r#"{"person": {"name": "John Doe", "address": {"city": "Anytown"}}}"#;
        const OR_FIELDS: &str =
            r#"{"data": {"$or": [{"Location": ["New York"]}, {"Day": ["Monday"]}]}}"#;
        const ITEMS: &str = r#"{"data": {"items": {"sku": ["x"], "n": [1]}}}"#;
        let cases: &[(&str, &[&str], &str, &str, bool)] = &[
            // Exact values, nested objects (Lambda's order record).
            (
                "Lambda: buy",
                &[r#"{"data": {"order": {"type": ["buy"]}}}"#],
                "k",
                ORDER,
                true,
            ),
            (
                "Lambda: not buy",
                &[r#"{"data": {"order": {"type": ["buy"]}}}"#],
                "k",
                SELL,
                false,
            ),
            (
                "missing field",
                &[r#"{"data": {"order": {"side": ["buy"]}}}"#],
                "k",
                ORDER,
                false,
            ),
            (
                "exact number",
                &[r#"{"data": {"record": [12345]}}"#],
                "k",
                ORDER,
                true,
            ),
            (
                "a number as written: 5.0 is not 5",
                &[r#"{"data": {"n": [5]}}"#],
                "k",
                r#"{"n": 5.0}"#,
                false,
            ),
            (
                "a number is not its text",
                &[r#"{"data": {"n": [5]}}"#],
                "k",
                r#"{"n": "5"}"#,
                false,
            ),
            (
                "true",
                &[r#"{"data": {"ok": [true]}}"#],
                "k",
                r#"{"ok": true}"#,
                true,
            ),
            (
                "true is not \"true\"",
                &[r#"{"data": {"ok": [true]}}"#],
                "k",
                r#"{"ok": "true"}"#,
                false,
            ),
            (
                "Lambda: null",
                &[r#"{"data": {"UserID": [null]}}"#],
                "k",
                r#"{"UserID": null}"#,
                true,
            ),
            (
                "null is not missing",
                &[r#"{"data": {"UserID": [null]}}"#],
                "k",
                "{}",
                false,
            ),
            (
                "Lambda: empty",
                &[r#"{"data": {"LastName": [""]}}"#],
                "k",
                r#"{"LastName": ""}"#,
                true,
            ),
            (
                "data as a whole",
                &[r#"{"data": ["ping"]}"#],
                "k",
                r#""ping""#,
                true,
            ),
            // OR within a field, AND across fields, OR across fields and patterns.
            (
                "Lambda: or",
                &[r#"{"data": {"PaymentType": ["Credit", "Debit"]}}"#],
                "k",
                r#"{"PaymentType": "Debit"}"#,
                true,
            ),
            (
                "Lambda: neither",
                &[r#"{"data": {"PaymentType": ["Credit", "Debit"]}}"#],
                "k",
                r#"{"PaymentType": "Cash"}"#,
                false,
            ),
            ("Lambda: key and data", &[AND], "1", LA, true),
            ("Lambda: data, not key", &[AND], "2", LA, false),
            (
                "Lambda: key, not data",
                &[AND],
                "1",
                r#"{"Location": "Seattle"}"#,
                false,
            ),
            (
                "Lambda: $or, second",
                &[OR_FIELDS],
                "k",
                r#"{"Location": "Paris", "Day": "Monday"}"#,
                true,
            ),
            (
                "Lambda: $or, neither",
                &[OR_FIELDS],
                "k",
                r#"{"Location": "Paris", "Day": "Friday"}"#,
                false,
            ),
            (
                "$or at the top",
                &[r#"{"$or": [{"partitionKey": ["a"]}, {"data": {"x": [1]}}]}"#],
                "b",
                r#"{"x": 1}"#,
                true,
            ),
            (
                "second pattern",
                &[r#"{"data": {"x": [1]}}"#, r#"{"data": {"x": [2]}}"#],
                "k",
                r#"{"x": 2}"#,
                true,
            ),
            (
                "no pattern",
                &[r#"{"data": {"x": [1]}}"#, r#"{"data": {"x": [2]}}"#],
                "k",
                r#"{"x": 3}"#,
                false,
            ),
            // Arrays in the record: any element; an object's fields from one element.
            (
                "array, one matches",
                &[r#"{"data": {"tags": ["b"]}}"#],
                "k",
                r#"{"tags": ["a", "b"]}"#,
                true,
            ),
            (
                "array, none",
                &[r#"{"data": {"tags": ["c"]}}"#],
                "k",
                r#"{"tags": ["a", "b"]}"#,
                false,
            ),
            (
                "objects, one element",
                &[ITEMS],
                "k",
                r#"{"items": [{"sku": "y", "n": 2}, {"sku": "x", "n": 1}]}"#,
                true,
            ),
            (
                "objects, split",
                &[ITEMS],
                "k",
                r#"{"items": [{"sku": "x", "n": 2}, {"sku": "y", "n": 1}]}"#,
                false,
            ),
            // Data that is not JSON: a pattern on data fails, one on the key does not.
            ("not JSON", &[r#"{"data": {"x": [1]}}"#], "k", "x=1", false),
            (
                "not JSON, exists false",
                &[r#"{"data": {"x": [{"exists": false}]}}"#],
                "k",
                "x=1",
                false,
            ),
            (
                "not JSON, key only",
                &[r#"{"partitionKey": ["k"]}"#],
                "k",
                "x=1",
                true,
            ),
            (
                "not JSON, key pattern second",
                &[
                    r#"{"data": {"x": [1]}}"#,
                    r#"{"partitionKey": [{"prefix": "eu-"}]}"#,
                ],
                "eu-west",
                "\u{1}\u{2}",
                true,
            ),
            (
                "empty data",
                &[r#"{"data": {"x": [{"exists": false}]}}"#],
                "k",
                "",
                false,
            ),
            // prefix, suffix, equals-ignore-case.
            (
                "key prefix",
                &[r#"{"partitionKey": [{"prefix": "eu-"}]}"#],
                "eu-west-1",
                "",
                true,
            ),
            (
                "key prefix, no",
                &[r#"{"partitionKey": [{"prefix": "eu-"}]}"#],
                "us-east-1",
                "",
                false,
            ),
            (
                "Lambda: begins with",
                &[r#"{"data": {"Region": [{"prefix": "us-"}]}}"#],
                "k",
                r#"{"Region": "us-east-1"}"#,
                true,
            ),
            (
                "prefix of a number",
                &[r#"{"data": {"n": [{"prefix": "1"}]}}"#],
                "k",
                r#"{"n": 12}"#,
                false,
            ),
            (
                "prefix ignoring case",
                &[r#"{"data": {"service": [{"prefix": {"equals-ignore-case": "eventb"}}]}}"#],
                "k",
                r#"{"service": "EventBridge"}"#,
                true,
            ),
            (
                "Lambda: ends with",
                &[r#"{"data": {"FileName": [{"suffix": ".png"}]}}"#],
                "k",
                r#"{"FileName": "a.png"}"#,
                true,
            ),
            (
                "ends otherwise",
                &[r#"{"data": {"FileName": [{"suffix": ".png"}]}}"#],
                "k",
                r#"{"FileName": "a.PNG"}"#,
                false,
            ),
            (
                "suffix ignoring case",
                &[r#"{"data": {"FileName": [{"suffix": {"equals-ignore-case": ".png"}}]}}"#],
                "k",
                r#"{"FileName": "a.PNG"}"#,
                true,
            ),
            (
                "Lambda: equals ignoring case",
                &[r#"{"data": {"Name": [{"equals-ignore-case": "alice"}]}}"#],
                "k",
                r#"{"Name": "ALICE"}"#,
                true,
            ),
            (
                "another name",
                &[r#"{"data": {"Name": [{"equals-ignore-case": "alice"}]}}"#],
                "k",
                r#"{"Name": "Bob"}"#,
                false,
            ),
            // anything-but.
            (
                "Lambda: not raining",
                &[r#"{"data": {"Weather": [{"anything-but": ["Raining"]}]}}"#],
                "k",
                r#"{"Weather": "Sunny"}"#,
                true,
            ),
            (
                "Lambda: raining",
                &[r#"{"data": {"Weather": [{"anything-but": ["Raining"]}]}}"#],
                "k",
                r#"{"Weather": "Raining"}"#,
                false,
            ),
            (
                "anything-but, missing",
                &[r#"{"data": {"Weather": [{"anything-but": ["Raining"]}]}}"#],
                "k",
                "{}",
                false,
            ),
            (
                "anything-but one string",
                &[r#"{"data": {"state": [{"anything-but": "initializing"}]}}"#],
                "k",
                r#"{"state": "initializing"}"#,
                false,
            ),
            (
                "anything-but numbers",
                &[r#"{"data": {"n": [{"anything-but": [1, 2]}]}}"#],
                "k",
                r#"{"n": 3}"#,
                true,
            ),
            (
                "anything-but strings, a number",
                &[r#"{"data": {"n": [{"anything-but": ["a"]}]}}"#],
                "k",
                r#"{"n": 3}"#,
                true,
            ),
            (
                "anything-but prefix",
                &[r#"{"data": {"Region": [{"anything-but": {"prefix": "us-"}}]}}"#],
                "k",
                r#"{"Region": "eu-west-1"}"#,
                true,
            ),
            (
                "anything-but prefix, us",
                &[r#"{"data": {"Region": [{"anything-but": {"prefix": "us-"}}]}}"#],
                "k",
                r#"{"Region": "us-east-1"}"#,
                false,
            ),
            (
                "anything-but suffix",
                &[r#"{"data": {"FileName": [{"anything-but": {"suffix": ".png"}}]}}"#],
                "k",
                r#"{"FileName": "a.png"}"#,
                false,
            ),
            (
                "anything-but ignoring case",
                &[
                    r#"{"data": {"state": [{"anything-but": {"equals-ignore-case": ["initializing", "done"]}}]}}"#,
                ],
                "k",
                r#"{"state": "INITIALIZING"}"#,
                false,
            ),
            (
                "anything-but ignoring case, other",
                &[
                    r#"{"data": {"state": [{"anything-but": {"equals-ignore-case": "initializing"}}]}}"#,
                ],
                "k",
                r#"{"state": "running"}"#,
                true,
            ),
            // numeric.
            (
                "Lambda: 55 in (50, 60]",
                &[TEMPERATURE],
                "k",
                r#"{"Temperature": 55}"#,
                true,
            ),
            (
                "Lambda: 60 in (50, 60]",
                &[TEMPERATURE],
                "k",
                r#"{"Temperature": 60}"#,
                true,
            ),
            (
                "Lambda: 50 not in (50, 60]",
                &[TEMPERATURE],
                "k",
                r#"{"Temperature": 50}"#,
                false,
            ),
            (
                "Lambda: 61 not in (50, 60]",
                &[TEMPERATURE],
                "k",
                r#"{"Temperature": 61}"#,
                false,
            ),
            (
                "a numeric string is not a number",
                &[TEMPERATURE],
                "k",
                r#"{"Temperature": "55"}"#,
                false,
            ),
            (
                "Lambda: numeric equals",
                &[r#"{"data": {"Price": [{"numeric": ["=", 100]}]}}"#],
                "k",
                r#"{"Price": 100}"#,
                true,
            ),
            (
                "numeric equals compares values",
                &[r#"{"data": {"Price": [{"numeric": ["=", 100]}]}}"#],
                "k",
                r#"{"Price": 1.0e2}"#,
                true,
            ),
            (
                "below only",
                &[r#"{"data": {"n": [{"numeric": ["<", 0]}]}}"#],
                "k",
                r#"{"n": -0.5}"#,
                true,
            ),
            (
                "fractions",
                &[r#"{"data": {"n": [{"numeric": [">=", 0, "<", 1]}]}}"#],
                "k",
                r#"{"n": 1}"#,
                false,
            ),
            // exists.
            (
                "Lambda: exists",
                &[r#"{"data": {"ProductName": [{"exists": true}]}}"#],
                "k",
                r#"{"ProductName": "x"}"#,
                true,
            ),
            (
                "exists, missing",
                &[r#"{"data": {"ProductName": [{"exists": true}]}}"#],
                "k",
                "{}",
                false,
            ),
            (
                "Lambda: does not exist",
                &[r#"{"data": {"ProductName": [{"exists": false}]}}"#],
                "k",
                "{}",
                true,
            ),
            (
                "does not exist, but does",
                &[r#"{"data": {"ProductName": [{"exists": false}]}}"#],
                "k",
                r#"{"ProductName": null}"#,
                false,
            ),
            (
                "does not exist, nor its parent",
                &[r#"{"data": {"a": {"b": [{"exists": false}]}}}"#],
                "k",
                "{}",
                true,
            ),
            (
                "Lambda: exists is for leaves",
                &[r#"{"data": {"person": {"address": [{"exists": true}]}}}"#],
                "k",
                PERSON,
                false,
            ),
            (
                "exists, an empty array",
                &[r#"{"data": {"tags": [{"exists": true}]}}"#],
                "k",
                r#"{"tags": []}"#,
                false,
            ),
            (
                "exists or a value",
                &[r#"{"data": {"x": [{"exists": false}, 1]}}"#],
                "k",
                r#"{"x": 1}"#,
                true,
            ),
        ];
        for (what, patterns, key, data, passes) in cases {
            let filter = filter(patterns);
            assert_eq!(filter.matches(key, data.as_bytes()), *passes, "{what}");
        }
    }
}
