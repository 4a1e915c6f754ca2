//! Reading a pattern's JSON into the rule tree of [`super`], refusing what Lambda
//! refuses and what Lambda does not have, each fault with its dotted path in the
//! pattern: this runs once, when settings are read, so every way a pattern can be wrong
//! is found here and matching has nothing left to check.

use serde_json::{Map, Value};

use super::{
    DATA, Exact, Node, Not, OR, Object, PARTITION_KEY, Pattern, PatternFault, Range, Rule, Text,
};

impl Pattern {
    pub(super) fn parse(text: &str) -> Result<Pattern, PatternFault> {
        let value: Value = serde_json::from_str(text).map_err(|e| PatternFault::NotJson {
            text: text.to_owned(),
            error: e.to_string(),
        })?;
        let Value::Object(map) = value else {
            return Err(PatternFault::NotAnObject {
                found: shown(&value),
            });
        };
        let mut reads_data = false;
        let top = top_object(&map, &mut reads_data)?;
        Ok(Pattern { top, reads_data })
    }
}

/// The top of a pattern (or of one of its top-level `$or` alternatives): only `data`,
/// `partitionKey` and `$or`, the key first.
fn top_object(map: &Map<String, Value>, reads_data: &mut bool) -> Result<Object, PatternFault> {
    if map.is_empty() {
        return Err(PatternFault::Empty {
            path: "the pattern".to_owned(),
        });
    }
    let mut fields = Vec::new();
    let mut any_of = Vec::new();
    for (key, value) in map {
        match key.as_str() {
            PARTITION_KEY => fields.insert(
                0,
                (
                    key.clone(),
                    Node::Rules(rules(PARTITION_KEY, value, false)?),
                ),
            ),
            DATA => {
                *reads_data = true;
                fields.push((key.clone(), node(DATA, value)?));
            }
            OR => {
                for alternative in alternatives(OR, value)? {
                    any_of.push(top_object(alternative, reads_data)?);
                }
            }
            _ => return Err(PatternFault::UnsupportedKey { key: key.clone() }),
        }
    }
    Ok(Object { fields, any_of })
}

/// A field inside `data` (or `data` itself): rules, or an object of fields.
fn node(path: &str, value: &Value) -> Result<Node, PatternFault> {
    match value {
        Value::Object(map) => Ok(Node::Object(object(path, map)?)),
        _ => Ok(Node::Rules(rules(path, value, true)?)),
    }
}

fn object(path: &str, map: &Map<String, Value>) -> Result<Object, PatternFault> {
    if map.is_empty() {
        return Err(PatternFault::Empty {
            path: path.to_owned(),
        });
    }
    let mut fields = Vec::new();
    let mut any_of = Vec::new();
    for (key, value) in map {
        let inner = format!("{path}.{key}");
        if key == OR {
            for alternative in alternatives(&inner, value)? {
                any_of.push(object(&inner, alternative)?);
            }
        } else {
            fields.push((key.clone(), node(&inner, value)?));
        }
    }
    Ok(Object { fields, any_of })
}

/// The objects of a `$or`: an array of at least two, as EventBridge takes.
fn alternatives<'v>(
    path: &str,
    value: &'v Value,
) -> Result<Vec<&'v Map<String, Value>>, PatternFault> {
    let bad = || PatternFault::BadOperand {
        path: path.to_owned(),
        operator: OR,
        wants: "an array of two or more objects, each a pattern of its own",
        found: shown(value),
    };
    let Value::Array(items) = value else {
        return Err(bad());
    };
    if items.len() < 2 {
        return Err(bad());
    }
    items
        .iter()
        .map(|item| item.as_object().ok_or_else(bad))
        .collect()
}

fn rules(path: &str, value: &Value, nesting: bool) -> Result<Vec<Rule>, PatternFault> {
    let Value::Array(items) = value else {
        return Err(PatternFault::NotRules {
            path: path.to_owned(),
            nested: if nesting {
                ", or an object of fields"
            } else {
                ""
            },
            found: shown(value),
        });
    };
    if items.is_empty() {
        return Err(PatternFault::NoRules {
            path: path.to_owned(),
        });
    }
    items.iter().map(|item| rule(path, item)).collect()
}

fn rule(path: &str, value: &Value) -> Result<Rule, PatternFault> {
    if let Some(exact) = exact(value) {
        return Ok(Rule::Exact(exact));
    }
    let Value::Object(map) = value else {
        return Err(PatternFault::NotARule {
            path: path.to_owned(),
            found: shown(value),
        });
    };
    let mut entries = map.iter();
    let (Some((operator, operand)), None) = (entries.next(), entries.next()) else {
        return Err(PatternFault::NotOneOperator {
            path: path.to_owned(),
            found: shown(value),
        });
    };
    let bad = |operator: &'static str, wants: &'static str| PatternFault::BadOperand {
        path: path.to_owned(),
        operator,
        wants,
        found: shown(operand),
    };
    match operator.as_str() {
        "prefix" => text(operand)
            .map(Rule::Prefix)
            .ok_or_else(|| bad("prefix", "a string, or {\"equals-ignore-case\": a string}")),
        "suffix" => text(operand)
            .map(Rule::Suffix)
            .ok_or_else(|| bad("suffix", "a string, or {\"equals-ignore-case\": a string}")),
        "equals-ignore-case" => operand
            .as_str()
            .map(|s| Rule::EqualsIgnoreCase(s.to_lowercase()))
            .ok_or_else(|| bad("equals-ignore-case", "a string")),
        "anything-but" => anything_but(path, operand).map(Rule::AnythingBut),
        "numeric" => range(operand)
            .map(Rule::Numeric)
            .map_err(|wants| bad("numeric", wants)),
        "exists" => operand
            .as_bool()
            .map(Rule::Exists)
            .ok_or_else(|| bad("exists", "true or false")),
        "cidr" | "wildcard" => Err(PatternFault::UnsupportedOperator {
            path: path.to_owned(),
            operator: operator.clone(),
        }),
        _ => Err(PatternFault::UnknownOperator {
            path: path.to_owned(),
            operator: operator.clone(),
        }),
    }
}

fn exact(value: &Value) -> Option<Exact> {
    match value {
        Value::String(s) => Some(Exact::Str(s.clone())),
        Value::Number(n) => Some(Exact::Num(n.clone())),
        Value::Bool(b) => Some(Exact::Bool(*b)),
        Value::Null => Some(Exact::Null),
        Value::Array(_) | Value::Object(_) => None,
    }
}

/// `prefix` and `suffix` take a string, or `{"equals-ignore-case": string}`.
fn text(operand: &Value) -> Option<Text> {
    match operand {
        Value::String(s) => Some(Text {
            text: s.clone(),
            ignore_case: false,
        }),
        Value::Object(map) if map.len() == 1 => {
            let s = map.get("equals-ignore-case")?.as_str()?;
            Some(Text {
                text: s.to_lowercase(),
                ignore_case: true,
            })
        }
        _ => None,
    }
}

fn anything_but(path: &str, operand: &Value) -> Result<Not, PatternFault> {
    let bad = || PatternFault::BadOperand {
        path: path.to_owned(),
        operator: "anything-but",
        wants: "a string, a number, an array of them, or one of {\"prefix\": a string}, \
                {\"suffix\": a string}, {\"equals-ignore-case\": a string or strings}",
        found: shown(operand),
    };
    let value = |v: &Value| match v {
        Value::String(_) | Value::Number(_) => exact(v),
        _ => None,
    };
    match operand {
        Value::String(_) | Value::Number(_) => {
            Ok(Not::Values(value(operand).into_iter().collect()))
        }
        Value::Array(items) if !items.is_empty() => items
            .iter()
            .map(|item| value(item).ok_or_else(bad))
            .collect::<Result<Vec<_>, _>>()
            .map(Not::Values),
        Value::Object(map) if map.len() == 1 => {
            let Some((operator, inner)) = map.iter().next() else {
                return Err(bad());
            };
            match (operator.as_str(), inner) {
                ("prefix", Value::String(s)) => Ok(Not::Prefix(s.clone())),
                ("suffix", Value::String(s)) => Ok(Not::Suffix(s.clone())),
                ("equals-ignore-case", Value::String(s)) => {
                    Ok(Not::IgnoreCase(vec![s.to_lowercase()]))
                }
                ("equals-ignore-case", Value::Array(items)) if !items.is_empty() => items
                    .iter()
                    .map(|item| item.as_str().map(str::to_lowercase).ok_or_else(bad))
                    .collect::<Result<Vec<_>, _>>()
                    .map(Not::IgnoreCase),
                ("wildcard", _) => Err(PatternFault::UnsupportedOperator {
                    path: path.to_owned(),
                    operator: "anything-but wildcard".to_owned(),
                }),
                _ => Err(bad()),
            }
        }
        _ => Err(bad()),
    }
}

/// `numeric`: `["=", n]`, or one or two bounds (`>`/`>=` below, `<`/`<=` above) that
/// leave some number in between. On failure, what it wants.
fn range(operand: &Value) -> Result<Range, &'static str> {
    const PAIRS: &str = "pairs of an operator (=, <, <=, >, >=) and a number, e.g. \
                         [\">\", 0, \"<=\", 5]: \"=\" alone, or at most one lower and one \
                         upper bound";
    let Value::Array(items) = operand else {
        return Err(PAIRS);
    };
    if items.is_empty() || items.len() % 2 != 0 {
        return Err(PAIRS);
    }
    let mut range = Range {
        lower: None,
        upper: None,
    };
    let mut equals = false;
    for pair in items.chunks(2) {
        let (Some(op), Some(bound)) = (pair[0].as_str(), pair[1].as_f64()) else {
            return Err(PAIRS);
        };
        let (slot, inclusive) = match op {
            "=" => {
                equals = true;
                range.lower = Some((bound, true));
                range.upper = Some((bound, true));
                continue;
            }
            ">" => (&mut range.lower, false),
            ">=" => (&mut range.lower, true),
            "<" => (&mut range.upper, false),
            "<=" => (&mut range.upper, true),
            _ => return Err(PAIRS),
        };
        if slot.is_some() {
            return Err(PAIRS);
        }
        *slot = Some((bound, inclusive));
    }
    if equals && items.len() != 2 {
        return Err(PAIRS);
    }
    if let (Some((low, low_in)), Some((high, high_in))) = (range.lower, range.upper)
        && (low > high || (low == high && !(low_in && high_in)))
    {
        return Err("a range some number is in: its lower bound below its upper");
    }
    Ok(range)
}

/// A value for an error message: compact JSON, cut short past 80 characters.
fn shown(value: &Value) -> String {
    let text = value.to_string();
    match text.char_indices().nth(80) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::RecordFilter;

    /// `(what, patterns, index of the bad one, text its message must contain)`.
    #[test]
    fn bad_patterns_are_refused_by_place_and_fault() {
        const PAIRS: &str = "\"numeric\" wants pairs of an operator";
        let cases: &[(&str, &[&str], usize, &str)] = &[
            (
                "not JSON",
                &[r#"{"data": "#],
                0,
                r#"processor.filter[0]: {"data":  is not JSON"#,
            ),
            (
                "second not JSON",
                &[r#"{"partitionKey": ["a"]}"#, "{data: 1}"],
                1,
                "processor.filter[1]: {data: 1} is not JSON",
            ),
            (
                "not an object",
                &[r#"["buy"]"#],
                0,
                r#"a pattern is a JSON object naming "data" or "partitionKey", e.g. {"data": {"kind": ["order"]}}, found ["buy"]"#,
            ),
            ("empty", &["{}"], 0, "the pattern names no field"),
            ("empty data", &[r#"{"data": {}}"#], 0, "data names no field"),
            (
                "metadata",
                &[r#"{"sequenceNumber": ["1"]}"#],
                0,
                r#""sequenceNumber" cannot be filtered on"#,
            ),
            (
                "arrival",
                &[r#"{"approximateArrivalTimestamp": [{"numeric": [">", 0]}]}"#],
                0,
                r#""approximateArrivalTimestamp" cannot"#,
            ),
            (
                "wrapper",
                &[r#"{"kinesis": {"data": {"a": ["b"]}}}"#],
                0,
                r#""kinesis" cannot be filtered on"#,
            ),
            (
                "a value, not rules",
                &[r#"{"data": {"type": "buy"}}"#],
                0,
                r#"data.type wants an array of rules, e.g. ["buy"] or [{"prefix": "eu-"}], or an object of fields, found "buy""#,
            ),
            (
                "key is text",
                &[r#"{"partitionKey": {"a": ["b"]}}"#],
                0,
                r#"partitionKey wants an array of rules, e.g. ["buy"] or [{"prefix": "eu-"}], found {"a":["b"]}"#,
            ),
            (
                "no rules",
                &[r#"{"data": {"a": []}}"#],
                0,
                "data.a has no rules",
            ),
            (
                "array rule",
                &[r#"{"data": {"a": [[1]]}}"#],
                0,
                "data.a: a rule is a string",
            ),
            (
                "two operators",
                &[r#"{"data": {"a": [{"prefix": "x", "suffix": "y"}]}}"#],
                0,
                "data.a: an operator object has one key",
            ),
            (
                "no operator",
                &[r#"{"data": {"a": [{}]}}"#],
                0,
                "an operator object has one key",
            ),
            (
                "unknown operator",
                &[r#"{"data": {"a": [{"contains": "x"}]}}"#],
                0,
                r#"data.a: unknown operator "contains""#,
            ),
            (
                "cidr",
                &[r#"{"data": {"ip": [{"cidr": "10.0.0.0/8"}]}}"#],
                0,
                r#"data.ip: "cidr" is not supported"#,
            ),
            (
                "wildcard",
                &[r#"{"data": {"f": [{"wildcard": "*.png"}]}}"#],
                0,
                r#""wildcard" is not supported"#,
            ),
            (
                "anything-but wildcard",
                &[r#"{"data": {"f": [{"anything-but": {"wildcard": "*.png"}}]}}"#],
                0,
                r#""anything-but wildcard" is not supported"#,
            ),
            (
                "numeric, half a pair",
                &[r#"{"data": {"n": [{"numeric": [">"]}]}}"#],
                0,
                r#"data.n: "numeric" wants pairs of an operator (=, <, <=, >, >=) and a number, e.g. [">", 0, "<=", 5]: "=" alone, or at most one lower and one upper bound, found [">"]"#,
            ),
            (
                "numeric, a text bound",
                &[r#"{"data": {"n": [{"numeric": [">", "0"]}]}}"#],
                0,
                PAIRS,
            ),
            (
                "numeric, unknown operator",
                &[r#"{"data": {"n": [{"numeric": ["!=", 0]}]}}"#],
                0,
                PAIRS,
            ),
            (
                "numeric, two lower bounds",
                &[r#"{"data": {"n": [{"numeric": [">", 0, ">=", 1]}]}}"#],
                0,
                PAIRS,
            ),
            (
                "numeric, = and a bound",
                &[r#"{"data": {"n": [{"numeric": ["=", 1, "<", 2]}]}}"#],
                0,
                PAIRS,
            ),
            (
                "numeric, not an array",
                &[r#"{"data": {"n": [{"numeric": 5}]}}"#],
                0,
                PAIRS,
            ),
            (
                "numeric, empty",
                &[r#"{"data": {"n": [{"numeric": [">", 5, "<", 1]}]}}"#],
                0,
                "\"numeric\" wants a range some number is in",
            ),
            (
                "numeric, nothing between",
                &[r#"{"data": {"n": [{"numeric": [">", 1, "<=", 1]}]}}"#],
                0,
                "a range some number is in",
            ),
            (
                "prefix of a number",
                &[r#"{"data": {"a": [{"prefix": 5}]}}"#],
                0,
                r#""prefix" wants a string"#,
            ),
            (
                "suffix of nothing",
                &[r#"{"data": {"a": [{"suffix": {"x": "y"}}]}}"#],
                0,
                r#""suffix" wants a string"#,
            ),
            (
                "ignore case, a number",
                &[r#"{"data": {"a": [{"equals-ignore-case": 1}]}}"#],
                0,
                r#""equals-ignore-case" wants a string, found 1"#,
            ),
            (
                "exists, text",
                &[r#"{"data": {"a": [{"exists": "yes"}]}}"#],
                0,
                r#""exists" wants true or false, found "yes""#,
            ),
            (
                "anything-but, empty",
                &[r#"{"data": {"a": [{"anything-but": []}]}}"#],
                0,
                r#""anything-but" wants a string"#,
            ),
            (
                "anything-but, null",
                &[r#"{"data": {"a": [{"anything-but": null}]}}"#],
                0,
                r#""anything-but" wants"#,
            ),
            (
                "anything-but, other",
                &[r#"{"data": {"a": [{"anything-but": {"numeric": [">", 1]}}]}}"#],
                0,
                r#""anything-but" wants"#,
            ),
            (
                "$or of one",
                &[r#"{"$or": [{"partitionKey": ["a"]}]}"#],
                0,
                r#"$or: "$or" wants an array of two or more objects"#,
            ),
            (
                "$or of values",
                &[r#"{"data": {"$or": ["a", "b"]}}"#],
                0,
                r#"data.$or: "$or" wants"#,
            ),
            (
                "$or, bad key inside",
                &[r#"{"$or": [{"partitionKey": ["a"]}, {"eventName": ["x"]}]}"#],
                0,
                r#""eventName" cannot be filtered on"#,
            ),
        ];
        for (what, patterns, index, says) in cases {
            let texts: Vec<String> = patterns.iter().map(|p| (*p).to_owned()).collect();
            let error = RecordFilter::parse(&texts).unwrap_err();
            assert_eq!(error.index, *index, "{what}");
            assert_eq!(error.pattern, patterns[*index], "{what}");
            let message = error.to_string();
            assert!(
                message.starts_with(&format!("processor.filter[{index}]: ")),
                "{what}: {message}"
            );
            assert!(message.contains(says), "{what}: {message}");
        }
    }

    /// A long value is cut short in a message, on a character boundary.
    #[test]
    fn long_values_are_cut_short() {
        let long = format!(r#"{{"data": {{"a": "{}"}}}}"#, "é".repeat(200));
        let message = RecordFilter::parse(&[long]).unwrap_err().to_string();
        assert!(message.ends_with('…'), "{message}");
        assert!(message.len() < 400, "{message}");
    }
}
