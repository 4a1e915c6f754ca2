//! Where records come from: a Kinesis stream, or a DynamoDB table's change stream.
//!
//! One setting (`worker.stream`) names either, so that everything downstream (leases,
//! status, the CLI) stays the same: the source decides only which adapter reads and
//! what the stream identifier passed to it is.

use std::fmt;

/// The source of a worker's records, as `worker.stream` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A Kinesis data stream, by name.
    Kinesis {
        /// The stream's name (1 to 128 characters of A-Z a-z 0-9 _ . -).
        stream: String,
    },
    /// A DynamoDB table's stream, by its ARN
    /// (`arn:aws:dynamodb:REGION:ACCOUNT:table/NAME/stream/LABEL`).
    TableStream {
        /// The stream's ARN, as given.
        arn: String,
        /// The table's name, read from the ARN.
        table: String,
    },
    /// The current stream of a table (`dynamodb:TABLE`): DescribeTable's
    /// `LatestStreamArn`, looked up when the worker starts.
    Table {
        /// The table's name (after the `dynamodb:` prefix).
        table: String,
    },
}

/// The prefix that names a table's current stream.
pub const TABLE_PREFIX: &str = "dynamodb:";

impl Source {
    /// Reads `worker.stream`. The error says what is wrong with the text; the caller adds
    /// the key.
    pub fn parse(text: &str) -> Result<Self, String> {
        if let Some(table) = text.strip_prefix(TABLE_PREFIX) {
            check_table_name(table)?;
            return Ok(Self::Table {
                table: table.to_owned(),
            });
        }
        if text.starts_with("arn:") {
            return parse_arn(text);
        }
        if text.is_empty() {
            return Err(
                "must be set: it names the Kinesis stream (or the DynamoDB table \
                        stream, as dynamodb:TABLE or the stream's ARN) to consume"
                    .to_owned(),
            );
        }
        let allowed = |c: char| c.is_ascii_alphanumeric() || "_.-".contains(c);
        if text.len() > 128 || !text.chars().all(allowed) {
            return Err(
                "Kinesis stream names are 1 to 128 characters of A-Z a-z 0-9 _ . - \
                        (a DynamoDB table's stream is dynamodb:TABLE or the stream's ARN)"
                    .to_owned(),
            );
        }
        Ok(Self::Kinesis {
            stream: text.to_owned(),
        })
    }

    /// The table whose changes are read; `None` for Kinesis.
    pub fn table(&self) -> Option<&str> {
        match self {
            Self::Kinesis { .. } => None,
            Self::TableStream { table, .. } | Self::Table { table } => Some(table),
        }
    }

    /// Whether the records are a DynamoDB table's changes (not a Kinesis stream's).
    pub fn is_table_stream(&self) -> bool {
        self.table().is_some()
    }

    /// The kind of source, as position tokens and status name it.
    pub fn kind(&self) -> SourceKind {
        if self.is_table_stream() {
            SourceKind::DynamoDbStreams
        } else {
            SourceKind::Kinesis
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Kinesis { stream } => f.write_str(stream),
            Self::TableStream { arn, .. } => f.write_str(arn),
            Self::Table { table } => write!(f, "{TABLE_PREFIX}{table}"),
        }
    }
}

/// The two kinds of source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SourceKind {
    /// A Kinesis data stream (`kinesis`).
    Kinesis,
    /// A DynamoDB table's stream, read through DynamoDB Streams (`dynamodb-streams`).
    DynamoDbStreams,
}

impl SourceKind {
    /// The name position tokens and status use: `kinesis` or `dynamodb-streams`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Kinesis => "kinesis",
            Self::DynamoDbStreams => "dynamodb-streams",
        }
    }

    /// The kind of a stream identifier as the adapters get it (a name, a Kinesis ARN, or
    /// a DynamoDB stream ARN).
    pub fn of_stream(stream: &str) -> Self {
        if stream.starts_with(TABLE_PREFIX) || arn_service(stream) == Some("dynamodb") {
            Self::DynamoDbStreams
        } else {
            Self::Kinesis
        }
    }
}

impl fmt::Display for SourceKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The table a DynamoDB stream ARN belongs to; `None` for anything else.
pub fn table_of_stream_arn(arn: &str) -> Option<&str> {
    if arn_service(arn) != Some("dynamodb") {
        return None;
    }
    let resource = arn.splitn(6, ':').nth(5)?;
    let rest = resource.strip_prefix("table/")?;
    let (table, label) = rest.split_once("/stream/")?;
    (!table.is_empty() && !label.is_empty()).then_some(table)
}

fn arn_service(text: &str) -> Option<&str> {
    let mut parts = text.splitn(6, ':');
    (parts.next()? == "arn").then_some(())?;
    parts.next()?; // partition: aws, aws-cn, aws-us-gov
    parts.next()
}

fn parse_arn(text: &str) -> Result<Source, String> {
    match arn_service(text) {
        Some("dynamodb") => {}
        Some("kinesis") => {
            return Err("must be the Kinesis stream's name, not its ARN".to_owned());
        }
        _ => {
            return Err(
                "is an ARN of neither a Kinesis stream nor a DynamoDB table's \
                        stream (arn:aws:dynamodb:REGION:ACCOUNT:table/NAME/stream/LABEL)"
                    .to_owned(),
            );
        }
    }
    let table = table_of_stream_arn(text).ok_or_else(|| {
        "is a DynamoDB ARN but not a stream's: write \
         arn:aws:dynamodb:REGION:ACCOUNT:table/NAME/stream/LABEL, or dynamodb:NAME for the \
         table's current stream"
            .to_owned()
    })?;
    check_table_name(table)?;
    Ok(Source::TableStream {
        arn: text.to_owned(),
        table: table.to_owned(),
    })
}

/// Whether `table` is a valid DynamoDB table name; the error says what is wrong.
pub(crate) fn check_table_name(table: &str) -> Result<(), String> {
    let allowed = |c: char| c.is_ascii_alphanumeric() || "_.-".contains(c);
    if !(3..=255).contains(&table.len()) || !table.chars().all(allowed) {
        return Err(format!(
            "names the table {table:?}: DynamoDB table names are 3 to 255 characters of \
             A-Z a-z 0-9 _ . -"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ARN: &str =
        "arn:aws:dynamodb:us-east-1:123456789012:table/orders/stream/2024-05-01T00:00:00.000";

    #[test]
    fn reads_every_spelling_of_a_source() {
        let table = |t: &str| Some(t.to_owned());
        let cases: [(&str, Option<String>, SourceKind); 4] = [
            ("orders", None, SourceKind::Kinesis),
            (
                "dynamodb:orders",
                table("orders"),
                SourceKind::DynamoDbStreams,
            ),
            (ARN, table("orders"), SourceKind::DynamoDbStreams),
            (
                "arn:aws-cn:dynamodb:cn-north-1:1:table/a.b-c/stream/x",
                table("a.b-c"),
                SourceKind::DynamoDbStreams,
            ),
        ];
        for (text, want_table, kind) in cases {
            let source = Source::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(source.table().map(str::to_owned), want_table, "{text}");
            assert_eq!(source.kind(), kind, "{text}");
            assert_eq!(source.to_string(), text);
        }
    }

    #[test]
    fn refuses_what_names_no_source_and_says_why() {
        let cases = [
            ("", "must be set"),
            ("my stream", "1 to 128 characters"),
            ("arn:aws:kinesis:us-east-1:1:stream/orders", "not its ARN"),
            (
                "arn:aws:dynamodb:us-east-1:1:table/orders",
                "not a stream's",
            ),
            ("arn:aws:sqs:us-east-1:1:queue", "neither a Kinesis stream"),
            ("dynamodb:ab", "3 to 255 characters"),
            ("dynamodb:", "3 to 255 characters"),
        ];
        for (text, why) in cases {
            let error = Source::parse(text).expect_err(text);
            assert!(error.contains(why), "{text}: {error}");
        }
    }

    #[test]
    fn the_kind_of_a_stream_identifier() {
        assert_eq!(SourceKind::of_stream("orders"), SourceKind::Kinesis);
        assert_eq!(
            SourceKind::of_stream("arn:aws:kinesis:us-east-1:1:stream/orders"),
            SourceKind::Kinesis
        );
        assert_eq!(SourceKind::of_stream(ARN), SourceKind::DynamoDbStreams);
        assert_eq!(table_of_stream_arn(ARN), Some("orders"));
        assert_eq!(table_of_stream_arn("orders"), None);
    }
}
