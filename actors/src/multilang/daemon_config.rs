//! A MultiLangDaemon properties file as flotilla settings: the child's command, and the
//! settings the file gives, as the lowest layer under flotilla's own (a settings file,
//! `FLOTILLA__…` variables). Pure: properties in; the command, the settings and what
//! was not used out.
//!
//! Every key the daemon reads is either mapped, accepted as meaningless here (said in a
//! warning), or refused where ignoring it would change what the application does (an
//! error naming the key and what to do).

use std::time::Duration;

use super::child::ChildCommand;
use super::properties::Properties;

/// What a properties file configures.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonConfig {
    pub command: ChildCommand,
    /// flotilla settings by dotted key (`worker.stream`), each as text the settings
    /// loader parses (`"500ms"`, `"TRIM_HORIZON"`).
    pub settings: Vec<(String, String)>,
    /// Keys read and not used, each with why.
    pub warnings: Vec<String>,
}

/// A properties file flotilla cannot run as the daemon would.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DaemonConfigError {
    #[error("{key} is required (the record processor's command)")]
    Missing { key: &'static str },
    #[error("{key} = {value:?}: {why}")]
    BadValue {
        key: String,
        value: String,
        why: String,
    },
    #[error("{key} = {value:?} is not supported: {what_to_do}")]
    Unsupported {
        key: String,
        value: String,
        what_to_do: String,
    },
}

/// Keys whose value is a number of milliseconds, and the setting each sets.
const MILLIS: &[(&str, &str)] = &[
    ("idleTimeBetweenReadsInMillis", "reader.poll_interval"),
    ("failoverTimeMillis", "lease.failover_time"),
    ("shardSyncIntervalMillis", "reader.shard_sync_interval"),
    (
        "parentShardPollIntervalMillis",
        "reader.parent_poll_interval",
    ),
    ("taskBackoffTimeMillis", "reader.backoff_min"),
    ("metricsBufferTimeMillis", "metrics.interval"),
];

/// Keys whose value is a count, and the setting each sets.
const COUNTS: &[(&str, &str)] = &[
    ("maxRecords", "reader.max_records"),
    ("maxLeasesForWorker", "lease.max_leases"),
    ("maxLeasesToStealAtOneTime", "lease.max_moves_per_round"),
];

/// Keys taken as text as they are.
const TEXTS: &[(&str, &str)] = &[
    ("streamName", "worker.stream"),
    ("streamArn", "worker.stream"),
    ("applicationName", "worker.application"),
    ("workerId", "worker.worker_id"),
    ("workerIdentifier", "worker.worker_id"),
    ("regionName", "aws.region"),
    ("kinesisEndpoint", "aws.kinesis_endpoint"),
    ("dynamoDBEndpoint", "aws.dynamodb_endpoint"),
    ("dynamoDbEndpoint", "aws.dynamodb_endpoint"),
    ("cloudWatchEndpoint", "aws.cloudwatch_endpoint"),
];

/// Keys of the daemon's that mean nothing to flotilla, with why they are not needed.
const IGNORED: &[(&str, &str)] = &[
    ("processingLanguage", "only a label in the KCL's user agent"),
    (
        "cleanupLeasesUponShardCompletion",
        "flotilla deletes a finished shard's row once its children have started and it is past retention",
    ),
    (
        "validateSequenceNumberBeforeCheckpointing",
        "flotilla checks every checkpoint against the records delivered",
    ),
    (
        "initialLeaseTableReadCapacity",
        "flotilla creates the lease table on demand (pay per request)",
    ),
    (
        "initialLeaseTableWriteCapacity",
        "flotilla creates the lease table on demand (pay per request)",
    ),
    (
        "listShardsBackoffTimeInMillis",
        "ListShards is retried with flotilla's own backoff",
    ),
    (
        "maxListShardsRetryAttempts",
        "ListShards is retried until it answers",
    ),
    (
        "shutdownGraceMillis",
        "the graceful shutdown is flotilla's supervision.shutdown_timeout",
    ),
    ("maxActiveThreads", "flotilla runs on tokio's threads"),
    ("userAgent", "not sent"),
    ("logLevel", "flotilla logs through RUST_LOG"),
];

impl DaemonConfig {
    pub fn from_properties(properties: &Properties) -> Result<Self, DaemonConfigError> {
        let mut settings = Vec::new();
        let mut warnings = Vec::new();
        let mut watchdog = None;
        let mut argv = Vec::new();
        for (key, raw) in properties.iter() {
            let value = raw.trim();
            let bad = |why: &str| DaemonConfigError::BadValue {
                key: key.to_owned(),
                value: raw.to_owned(),
                why: why.to_owned(),
            };
            if key == "executableName" {
                // Split as the daemon splits it: on runs of spaces.
                argv = value
                    .split(' ')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
            } else if let Some((_, setting)) = MILLIS.iter().find(|(k, _)| *k == key) {
                let millis: u64 = value
                    .parse()
                    .map_err(|_| bad("not a whole number of milliseconds"))?;
                settings.push(((*setting).to_owned(), format!("{millis}ms")));
            } else if let Some((_, setting)) = COUNTS.iter().find(|(k, _)| *k == key) {
                let count: u32 = value.parse().map_err(|_| bad("not a whole number"))?;
                settings.push(((*setting).to_owned(), count.to_string()));
            } else if let Some((_, setting)) = TEXTS.iter().find(|(k, _)| *k == key) {
                if !value.is_empty() {
                    settings.push(((*setting).to_owned(), value.to_owned()));
                }
            } else if key == "initialPositionInStream" {
                let position = match value {
                    "TRIM_HORIZON" | "LATEST" | "AT_TIMESTAMP" => value,
                    _ => return Err(bad("expected TRIM_HORIZON, LATEST or AT_TIMESTAMP")),
                };
                settings.push(("worker.initial_position".to_owned(), position.to_owned()));
            } else if key == "initialPositionInStreamExtended"
                || key == "timestampAtInitialPositionInStream"
            {
                // The time for AT_TIMESTAMP, as epoch milliseconds or RFC 3339.
                let text = match value.parse::<u64>() {
                    Ok(millis) => humantime::format_rfc3339_millis(
                        std::time::UNIX_EPOCH + Duration::from_millis(millis),
                    )
                    .to_string(),
                    Err(_) => value.to_owned(),
                };
                settings.push(("worker.initial_timestamp".to_owned(), text));
            } else if key == "metricsLevel" {
                let level = match value.to_ascii_uppercase().as_str() {
                    "NONE" => "none",
                    "SUMMARY" => "summary",
                    "DETAILED" => "detailed",
                    _ => return Err(bad("expected NONE, SUMMARY or DETAILED")),
                };
                settings.push(("metrics.level".to_owned(), level.to_owned()));
            } else if key == "timeoutInSeconds" {
                let secs: u64 = value
                    .parse()
                    .map_err(|_| bad("not a whole number of seconds"))?;
                if secs > 0 {
                    watchdog = Some(Duration::from_secs(secs));
                }
            } else if key == "callProcessRecordsEvenForEmptyRecordList" {
                match value.to_ascii_lowercase().as_str() {
                    "false" => {}
                    "true" => {
                        return Err(DaemonConfigError::Unsupported {
                            key: key.to_owned(),
                            value: raw.to_owned(),
                            what_to_do: "flotilla calls processRecords only with records; remove the key, and act on time in the processor if it relied on empty calls".to_owned(),
                        });
                    }
                    _ => return Err(bad("expected true or false")),
                }
            } else if key == "retrievalMode" {
                if !value.eq_ignore_ascii_case("POLLING") && !value.eq_ignore_ascii_case("DEFAULT")
                {
                    return Err(DaemonConfigError::Unsupported {
                        key: key.to_owned(),
                        value: raw.to_owned(),
                        what_to_do: "flotilla reads by polling; set retrievalMode = POLLING"
                            .to_owned(),
                    });
                }
            } else if key == "AWSCredentialsProvider" || key == "AwsCredentialsProvider" {
                let first = value.split([',', '|']).next().unwrap_or("").trim();
                let default_chain = [
                    "DefaultAWSCredentialsProviderChain",
                    "DefaultCredentialsProvider",
                    "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
                    "com.amazonaws.auth.DefaultAWSCredentialsProviderChain",
                ];
                if !default_chain.contains(&first) {
                    return Err(DaemonConfigError::Unsupported {
                        key: key.to_owned(),
                        value: raw.to_owned(),
                        what_to_do: "flotilla uses the AWS SDK's default chain (environment, profile via AWS_PROFILE, web identity, container and instance credentials); set DefaultCredentialsProvider and pick the credentials through that chain".to_owned(),
                    });
                }
            } else if let Some((_, why)) = IGNORED.iter().find(|(k, _)| *k == key) {
                warnings.push(format!("{key} is not used: {why}"));
            } else {
                warnings.push(format!("{key} is not a key flotilla knows; ignored"));
            }
        }
        if argv.is_empty() {
            return Err(DaemonConfigError::Missing {
                key: "executableName",
            });
        }
        Ok(Self {
            command: ChildCommand { argv, watchdog },
            settings,
            warnings,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn config(text: &str) -> Result<DaemonConfig, DaemonConfigError> {
        DaemonConfig::from_properties(&Properties::parse(text).unwrap())
    }

    fn setting<'a>(config: &'a DaemonConfig, key: &str) -> Option<&'a str> {
        config
            .settings
            .iter()
            .rev()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The npm sample's properties file, as published.
    const SAMPLE: &str = "\
executableName = node sample_kcl_app.js
streamName = kclnodejssample
applicationName = kclnodejssample
AWSCredentialsProvider = DefaultCredentialsProvider
processingLanguage = nodejs/0.10
initialPositionInStream = TRIM_HORIZON
regionName = us-east-1
";

    #[test]
    fn the_sample_file() {
        let c = config(SAMPLE).unwrap();
        assert_eq!(c.command.argv, ["node", "sample_kcl_app.js"]);
        assert_eq!(c.command.watchdog, None);
        let table = [
            ("worker.stream", "kclnodejssample"),
            ("worker.application", "kclnodejssample"),
            ("worker.initial_position", "TRIM_HORIZON"),
            ("aws.region", "us-east-1"),
        ];
        for (key, want) in table {
            assert_eq!(setting(&c, key), Some(want), "{key}");
        }
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].starts_with("processingLanguage"));
    }

    #[test]
    fn every_mapped_key() {
        let c = config(
            "executableName = python3  -u   app.py --flag\n\
             maxRecords = 2500\n\
             idleTimeBetweenReadsInMillis = 250\n\
             failoverTimeMillis = 20000\n\
             shardSyncIntervalMillis = 60000\n\
             parentShardPollIntervalMillis = 5000\n\
             maxLeasesForWorker = 40\n\
             maxLeasesToStealAtOneTime = 2\n\
             kinesisEndpoint = http://127.0.0.1:4567\n\
             dynamoDBEndpoint = http://127.0.0.1:8000\n\
             workerId = w-1\n\
             metricsLevel = summary\n\
             timeoutInSeconds = 90\n\
             callProcessRecordsEvenForEmptyRecordList = false\n\
             retrievalMode = POLLING\n\
             initialPositionInStream = AT_TIMESTAMP\n\
             initialPositionInStreamExtended = 1700000000000\n\
             someFutureKey = 1\n",
        )
        .unwrap();
        assert_eq!(c.command.argv, ["python3", "-u", "app.py", "--flag"]);
        assert_eq!(c.command.watchdog, Some(Duration::from_secs(90)));
        let table = [
            ("reader.max_records", "2500"),
            ("reader.poll_interval", "250ms"),
            ("lease.failover_time", "20000ms"),
            ("reader.shard_sync_interval", "60000ms"),
            ("reader.parent_poll_interval", "5000ms"),
            ("lease.max_leases", "40"),
            ("lease.max_moves_per_round", "2"),
            ("aws.kinesis_endpoint", "http://127.0.0.1:4567"),
            ("aws.dynamodb_endpoint", "http://127.0.0.1:8000"),
            ("worker.worker_id", "w-1"),
            ("metrics.level", "summary"),
            ("worker.initial_position", "AT_TIMESTAMP"),
            ("worker.initial_timestamp", "2023-11-14T22:13:20.000Z"),
        ];
        for (key, want) in table {
            assert_eq!(setting(&c, key), Some(want), "{key}");
        }
        assert_eq!(
            c.warnings,
            ["someFutureKey is not a key flotilla knows; ignored"]
        );
    }

    #[test]
    fn what_is_refused_and_why() {
        let table: &[(&str, &str)] = &[
            ("streamName = s\n", "executableName is required"),
            (
                "executableName = x\nmaxRecords = many\n",
                "maxRecords = \"many\": not a whole number",
            ),
            (
                "executableName = x\nfailoverTimeMillis = 1.5\n",
                "failoverTimeMillis",
            ),
            (
                "executableName = x\ninitialPositionInStream = EARLIEST\n",
                "expected TRIM_HORIZON",
            ),
            (
                "executableName = x\ncallProcessRecordsEvenForEmptyRecordList = true\n",
                "only with records",
            ),
            (
                "executableName = x\nretrievalMode = FANOUT\n",
                "retrievalMode = \"FANOUT\" is not supported",
            ),
            (
                "executableName = x\nAWSCredentialsProvider = ProfileCredentialsProvider|dev\n",
                "AWS_PROFILE",
            ),
            (
                "executableName = x\nmetricsLevel = LOUD\n",
                "expected NONE, SUMMARY or DETAILED",
            ),
        ];
        for (text, want) in table {
            let error = config(text).unwrap_err().to_string();
            assert!(error.contains(want), "{text:?}: {error}");
        }
    }
}
