//! `processor.filter`: which records reach the processor, in AWS Lambda's filter-criteria
//! pattern syntax (issue 33), so that the patterns of a Lambda event source mapping
//! carry over unchanged. A record that matches none of them is checkpointed past without
//! a call, as Lambda advances its iterator past it.
//!
//! The syntax is Lambda's ("Control which events Lambda sends to your function", Filter
//! rule syntax), which is EventBridge's event-pattern syntax: a pattern is a JSON object
//! whose leaves are arrays of rules, any of which may match (OR), every named field
//! having to match (AND), `$or` for alternatives across fields. A record is seen as
//! Lambda's Kinesis event sees it: `data` is the payload read as JSON, `partitionKey`
//! the producer's key. Lambda's Kinesis page says it filters on `data` only; its older
//! filtering page shows `partitionKey` too, and issue 33 wants it, so both are accepted.
//! Every other key (Lambda's `sequenceNumber`, `approximateArrivalTimestamp`, …, or a
//! `kinesis` wrapper) is refused by name rather than silently never matching.
//!
//! As Lambda does, a pattern that names `data` never matches a record whose data is not
//! JSON (Lambda "drops the record"), and an exact number matches the same number as
//! written (Lambda: "300, 300.0, and 3.0e2 are not considered equal"), while `numeric`
//! compares values. Lambda's operators are all here: exact values (strings, numbers,
//! `true`, `false`, `null`), `prefix`, `suffix` (each also with `equals-ignore-case`),
//! `equals-ignore-case`, `anything-but` (values, `prefix`, `suffix`,
//! `equals-ignore-case`), `numeric`, `exists` and `$or`. EventBridge's `cidr` and
//! `wildcard`, which Lambda does not document, are refused by name.
//!
//! Pure: patterns are checked once, when settings are read, so a bad one stops the
//! worker at start instead of dropping records; matching reads the record only. It reads
//! a record's two fields, not the backend's `Record`, so the model imports nothing above
//! it. Here are the public types and the rule tree a pattern is read into; `parse` reads
//! a pattern's JSON into the tree (every fault it can have), `matching` matches a
//! record's fields against it.

mod matching;
mod parse;

use serde_json::Number;
use thiserror::Error;

/// The key of a record's payload in a pattern, as in Lambda's Kinesis event.
const DATA: &str = "data";
/// The key of a record's partition key in a pattern, as in Lambda's Kinesis event.
const PARTITION_KEY: &str = "partitionKey";
/// EventBridge's alternatives across fields, which Lambda documents as "Or (multiple
/// fields)".
const OR: &str = "$or";

/// `processor.filter`, parsed: a record passes if it matches any pattern, as Lambda ORs
/// the filters of one event source mapping.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordFilter {
    patterns: Vec<Pattern>,
}

/// Why `processor.filter` cannot be used: which pattern, by its place in the list, and
/// what is wrong with it. Refused at start, as Lambda refuses an event source mapping
/// with a bad pattern, so no record is dropped by a pattern that cannot mean anything.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("processor.filter[{index}]: {fault}")]
pub struct FilterError {
    /// The pattern's place in `processor.filter`, from 0.
    pub index: usize,
    /// The pattern as written.
    pub pattern: String,
    /// What is wrong with it.
    pub fault: PatternFault,
}

/// What is wrong with one pattern. `path` names the place in the pattern, dotted from
/// its top (`data.order.type`), so a long pattern's fault can be found.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum PatternFault {
    /// Not JSON at all; `text` is the pattern, since its place alone does not show it.
    #[error("{text} is not JSON: {error}")]
    NotJson {
        /// The pattern as written.
        text: String,
        /// The parser's complaint, with line and column.
        error: String,
    },
    /// JSON, but not an object.
    #[error(
        "a pattern is a JSON object naming \"data\" or \"partitionKey\", e.g. \
         {{\"data\": {{\"kind\": [\"order\"]}}}}, found {found}"
    )]
    NotAnObject {
        /// The value found, as JSON.
        found: String,
    },
    /// An object with no fields: it would match every record (the whole pattern) or
    /// cannot say anything (a nested one).
    #[error(
        "{path} names no field: a pattern must name at least one (to hand every record \
         over, leave processor.filter empty)"
    )]
    Empty {
        /// Where: `the pattern`, or the dotted path of the empty object.
        path: String,
    },
    /// A top-level key other than `data`, `partitionKey` and `$or`.
    #[error(
        "\"{key}\" cannot be filtered on: a pattern names \"data\" (the record's payload, \
         read as JSON) or \"partitionKey\" at its top, as Lambda's Kinesis filters do \
         (without a \"kinesis\" wrapper)"
    )]
    UnsupportedKey {
        /// The key as written.
        key: String,
    },
    /// A field whose value is neither an array of rules nor (inside `data`) an object.
    #[error(
        "{path} wants an array of rules, e.g. [\"buy\"] or [{{\"prefix\": \"eu-\"}}]{nested}, \
         found {found}"
    )]
    NotRules {
        /// The field's dotted path.
        path: String,
        /// `", or an object of fields"` where nesting is allowed.
        nested: &'static str,
        /// The value found, as JSON.
        found: String,
    },
    /// An empty array of rules: nothing could match it.
    #[error("{path} has no rules: an empty array matches nothing")]
    NoRules {
        /// The field's dotted path.
        path: String,
    },
    /// A rule that is neither a value nor an operator object (an array, say).
    #[error(
        "{path}: a rule is a string, a number, true, false, null or an operator object such \
         as {{\"prefix\": \"eu-\"}}, found {found}"
    )]
    NotARule {
        /// The field's dotted path.
        path: String,
        /// The rule found, as JSON.
        found: String,
    },
    /// An operator object with no key or more than one.
    #[error("{path}: an operator object has one key, e.g. {{\"prefix\": \"eu-\"}}, found {found}")]
    NotOneOperator {
        /// The field's dotted path.
        path: String,
        /// The object found, as JSON.
        found: String,
    },
    /// An operator Lambda does not have.
    #[error(
        "{path}: unknown operator \"{operator}\"; Lambda's are prefix, suffix, \
         equals-ignore-case, anything-but, numeric and exists"
    )]
    UnknownOperator {
        /// The field's dotted path.
        path: String,
        /// The operator as written.
        operator: String,
    },
    /// An EventBridge operator Lambda's filters do not document.
    #[error(
        "{path}: \"{operator}\" is not supported: it is EventBridge's, and Lambda's filter \
         rules do not have it"
    )]
    UnsupportedOperator {
        /// The field's dotted path.
        path: String,
        /// The operator as written.
        operator: String,
    },
    /// An operator whose operand is not of the shape it takes.
    #[error("{path}: \"{operator}\" wants {wants}, found {found}")]
    BadOperand {
        /// The field's dotted path.
        path: String,
        /// The operator.
        operator: &'static str,
        /// What it takes.
        wants: &'static str,
        /// The operand found, as JSON.
        found: String,
    },
}

impl RecordFilter {
    /// Checks and parses `processor.filter`: `None` for no patterns (every record is
    /// handed over), or the first fault found, naming its pattern.
    pub fn parse(patterns: &[String]) -> Result<Option<RecordFilter>, FilterError> {
        if patterns.is_empty() {
            return Ok(None);
        }
        let patterns = patterns
            .iter()
            .enumerate()
            .map(|(index, text)| {
                Pattern::parse(text).map_err(|fault| FilterError {
                    index,
                    pattern: text.clone(),
                    fault,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Some(RecordFilter { patterns }))
    }

    /// Whether a record is handed to the processor, by its two filtered fields: it
    /// matches at least one pattern. The data is parsed as JSON at most once, and only
    /// when a pattern gets to a `data` field.
    pub fn matches(&self, partition_key: &str, data: &[u8]) -> bool {
        matching::any_matches(&self.patterns, partition_key, data)
    }
}

/// One pattern: its top-level fields, `partitionKey` first so that a record it rejects
/// by key has its data never parsed.
#[derive(Debug, Clone, PartialEq)]
struct Pattern {
    top: Object,
    /// Whether it names `data` anywhere: then a record whose data is not JSON fails it.
    reads_data: bool,
}

/// One level of a pattern: every field must match, and, when there are alternatives
/// (`$or`), one of them.
#[derive(Debug, Clone, PartialEq)]
struct Object {
    fields: Vec<(String, Node)>,
    any_of: Vec<Object>,
}

/// A field's pattern: rules for its value, or the fields of the object it holds.
#[derive(Debug, Clone, PartialEq)]
enum Node {
    Rules(Vec<Rule>),
    Object(Object),
}

/// One rule of a field's array, any of which may match.
#[derive(Debug, Clone, PartialEq)]
enum Rule {
    Exact(Exact),
    Prefix(Text),
    Suffix(Text),
    /// Lower-cased.
    EqualsIgnoreCase(String),
    AnythingBut(Not),
    Numeric(Range),
    Exists(bool),
}

/// A value matched exactly. A number is matched as written, by serde_json's
/// representation (`5` and `5.0` differ), as Lambda matches numbers by their text.
#[derive(Debug, Clone, PartialEq)]
enum Exact {
    Str(String),
    Num(Number),
    Bool(bool),
    Null,
}

/// The operand of `prefix` or `suffix`: the text, lower-cased when case is ignored.
#[derive(Debug, Clone, PartialEq)]
struct Text {
    text: String,
    ignore_case: bool,
}

/// What `anything-but` excludes.
#[derive(Debug, Clone, PartialEq)]
enum Not {
    /// Strings and numbers, matched as exact values are.
    Values(Vec<Exact>),
    Prefix(String),
    Suffix(String),
    /// Lower-cased.
    IgnoreCase(Vec<String>),
}

/// A `numeric` range: each bound with whether it is included.
#[derive(Debug, Clone, PartialEq)]
struct Range {
    lower: Option<(f64, bool)>,
    upper: Option<(f64, bool)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_patterns_is_no_filter() {
        assert_eq!(RecordFilter::parse(&[]), Ok(None));
    }
}
