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
    /// The record processor's command (`executableName`) and its watchdog (`timeoutInSeconds`).
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
    /// A key the daemon requires is absent: `executableName`, the child's command.
    #[error("{key} is required (the record processor's command)")]
    Missing {
        /// The key missing.
        key: &'static str,
    },
    /// A key flotilla maps has a value the daemon would not accept either (not a number, an
    /// unknown level, a malformed ARN): fix the value.
    #[error("{key} = {value:?}: {why}")]
    BadValue {
        /// The property's key.
        key: String,
        /// The value as written.
        value: String,
        /// What was expected instead.
        why: String,
    },
    /// A setting flotilla cannot honour as the daemon would (another credentials provider,
    /// a fan-out consumer named by its ARN); ignoring it would change what the
    /// application does.
    #[error("{key} = {value:?} is not supported: {what_to_do}")]
    Unsupported {
        /// The property's key.
        key: String,
        /// The value as written.
        value: String,
        /// What to change to run the file with flotilla.
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
    ("taskBackoffTimeMillis", "supervision.restart_backoff_min"),
    ("metricsBufferTimeMillis", "metrics.interval"),
];

/// The KCL's floor for `idleTimeBetweenReadsInMillis` (a lower value reads as this).
const MIN_IDLE_MILLIS: u64 = 200;

/// Keys whose value is a count, and the setting each sets.
const COUNTS: &[(&str, &str)] = &[
    ("maxRecords", "reader.max_records"),
    ("maxLeasesForWorker", "lease.max_leases"),
    ("maxLeasesToStealAtOneTime", "lease.max_moves_per_round"),
];

/// Keys taken as text as they are.
const TEXTS: &[(&str, &str)] = &[
    ("streamName", "worker.stream"),
    ("applicationName", "worker.application"),
    ("workerId", "worker.worker_id"),
    ("regionName", "aws.region"),
    ("kinesisEndpoint", "aws.kinesis_endpoint"),
    ("dynamoDBEndpoint", "aws.dynamodb_endpoint"),
];

/// Keys that make the daemon poll: with `retrievalMode` DEFAULT (or absent) it reads
/// with enhanced fan-out unless one of them is set (its `RetrievalMode.DEFAULT`: the
/// polling configuration's properties set or not).
const POLLING_KEYS: &[&str] = &[
    "maxRecords",
    "idleTimeBetweenReadsInMillis",
    "retryGetRecordsInSeconds",
    "maxGetRecordsThreadPool",
];

/// The credentials providers that are the AWS SDK's default chain, which flotilla uses.
const DEFAULT_CHAIN: &[&str] = &[
    "DefaultAWSCredentialsProviderChain",
    "DefaultCredentialsProvider",
    "software.amazon.awssdk.auth.credentials.DefaultCredentialsProvider",
    "com.amazonaws.auth.DefaultAWSCredentialsProviderChain",
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
        "no effect in the KCL 2.x and 3.x either; flotilla checks every checkpoint against the records delivered",
    ),
    (
        "ignoreUnexpectedChildShards",
        "flotilla follows every child the stream lists",
    ),
    (
        "skipShardSyncAtWorkerInitializationIfLeasesExist",
        "flotilla lists the stream at start; that creates no row that exists",
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
        "maxLeaseRenewalThreads",
        "flotilla renews no lease: one heartbeat row per worker",
    ),
    (
        "shutdownGraceMillis",
        "the graceful shutdown is flotilla's supervision.shutdown_timeout",
    ),
    ("maxActiveThreads", "flotilla runs on tokio's threads"),
    (
        "metricsMaxQueueSize",
        "flotilla aggregates metrics in place",
    ),
    (
        "metricsEnabledDimensions",
        "flotilla's dimensions follow metricsLevel",
    ),
    (
        "shardPrioritization",
        "flotilla reads every held shard at once; a child waits only for its parents",
    ),
    (
        "schedulerInitializationBackoffTimeMillis",
        "flotilla's start fails at once with the reason instead of retrying 20 times",
    ),
    (
        "logWarningForTaskAfterMillis",
        "a processor that acks nothing for reader.processor_timeout is reported as stalled and restarted",
    ),
    (
        "retryGetRecordsInSeconds",
        "GetRecords is retried with flotilla's own backoff (reader.backoff_max)",
    ),
    (
        "maxGetRecordsThreadPool",
        "flotilla reads on tokio's threads",
    ),
    (
        "listShardsCacheAllowedAgeInSeconds",
        "flotilla lists shards every reader.shard_sync_interval",
    ),
    (
        "cacheMissWarningModulus",
        "flotilla keeps no shard cache to miss",
    ),
    (
        "maxCacheMissesBeforeReload",
        "flotilla keeps no shard cache to miss",
    ),
    (
        "fanoutConfig.maxDescribeStreamSummaryRetries",
        "flotilla retries DescribeStreamSummary with its own backoff",
    ),
    (
        "fanoutConfig.maxDescribeStreamConsumerRetries",
        "flotilla waits for its consumer to be ACTIVE with its own backoff",
    ),
    (
        "fanoutConfig.registerStreamConsumerRetries",
        "flotilla retries RegisterStreamConsumer with its own backoff",
    ),
    (
        "fanoutConfig.retryBackoffMillis",
        "flotilla's fan-out calls back off as its other calls (reader.backoff_min, reader.backoff_max)",
    ),
    (
        "consumerName",
        "the daemon does not read it either (it reads fanoutConfig.consumerName), so the fan-out consumer is named after applicationName, as the daemon names it; write fanoutConfig.consumerName to name it",
    ),
];

impl DaemonConfig {
    /// Maps a parsed properties file; an error for the first key that cannot be run as the daemon
    /// would. The settings are not validated here: the settings loader does that
    /// ([`Settings::load_over`](crate::Settings::load_over)).
    pub fn from_properties(properties: &Properties) -> Result<Self, DaemonConfigError> {
        let mut settings = Vec::new();
        let mut warnings = Vec::new();
        let mut watchdog = None;
        let mut argv = Vec::new();
        let mut stream_arn = None;
        let mut position_key = None;
        let mut timestamp = None;
        let mut retrieval_mode: Option<String> = None;
        for (key, raw) in properties.iter() {
            let value = raw.trim();
            let bad = |why: &str| DaemonConfigError::BadValue {
                key: key.to_owned(),
                value: raw.to_owned(),
                why: why.to_owned(),
            };
            let unsupported = |what_to_do: &str| DaemonConfigError::Unsupported {
                key: key.to_owned(),
                value: raw.to_owned(),
                what_to_do: what_to_do.to_owned(),
            };
            if key == "executableName" {
                // Split as the daemon splits it: on runs of spaces, no quoting.
                argv = value
                    .split(' ')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
            } else if let Some((_, setting)) = MILLIS.iter().find(|(k, _)| *k == key) {
                let mut millis: u64 = value
                    .parse()
                    .map_err(|_| bad("not a whole number of milliseconds"))?;
                if key == "idleTimeBetweenReadsInMillis" && millis < MIN_IDLE_MILLIS {
                    warnings.push(format!(
                        "{key} = {millis} reads as {MIN_IDLE_MILLIS}, the KCL's floor"
                    ));
                    millis = MIN_IDLE_MILLIS;
                }
                settings.push(((*setting).to_owned(), format!("{millis}ms")));
            } else if let Some((_, setting)) = COUNTS.iter().find(|(k, _)| *k == key) {
                let count: u32 = value.parse().map_err(|_| bad("not a whole number"))?;
                settings.push(((*setting).to_owned(), count.to_string()));
            } else if let Some((_, setting)) = TEXTS.iter().find(|(k, _)| *k == key) {
                if !value.is_empty() {
                    settings.push(((*setting).to_owned(), value.to_owned()));
                }
            } else if key == "streamArn" {
                // The daemon takes the stream's name from the ARN, and prefers it.
                let name = value
                    .rsplit_once(":stream/")
                    .map(|(_, name)| name)
                    .filter(|name| !name.is_empty() && !name.contains('/'))
                    .ok_or_else(|| {
                        bad("not a Kinesis stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)")
                    })?;
                stream_arn = Some(name.to_owned());
            } else if key == "tableName" {
                // The lease table's name (the daemon's `ConfigsBuilder.tableName`);
                // its worker table is named after it.
                if !value.is_empty() {
                    settings.push(("lease.table".to_owned(), value.to_owned()));
                }
            } else if key == "fanoutConfig.consumerName" {
                // The enhanced fan-out consumer's name (the daemon's `FanOutConfig`;
                // without it, the application's name).
                if !value.is_empty() {
                    settings.push(("reader.consumer_name".to_owned(), value.to_owned()));
                }
            } else if key == "fanoutConfig.consumerArn" {
                return Err(unsupported(
                    "flotilla finds its fan-out consumer by name, registering it if absent; set fanoutConfig.consumerName to the consumer's name (the part of its ARN after `consumer/`, before `:`)",
                ));
            } else if key == "initialPositionInStream" {
                position_key = Some(match value.to_ascii_uppercase().as_str() {
                    "TRIM_HORIZON" => "TRIM_HORIZON",
                    "LATEST" => "LATEST",
                    _ => {
                        return Err(bad(
                            "expected TRIM_HORIZON or LATEST (for a time: initialPositionInStreamExtended = seconds since the epoch)",
                        ));
                    }
                });
            } else if key == "initialPositionInStreamExtended" {
                let secs: u64 = value
                    .parse()
                    .map_err(|_| bad("not a whole number of seconds since the epoch"))?;
                let at = std::time::UNIX_EPOCH + Duration::from_secs(secs);
                timestamp = Some(humantime::format_rfc3339_seconds(at).to_string());
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
                // The child is sent processRecords with `"records": []` as the KCL's
                // MultiLang daemon sends it (reader.call_on_empty).
                match value.to_ascii_lowercase().as_str() {
                    "false" => {}
                    "true" => settings.push(("reader.call_on_empty".to_owned(), "true".to_owned())),
                    _ => return Err(bad("expected true or false")),
                }
            } else if key == "retrievalMode" {
                let mode = value.to_ascii_uppercase();
                if !["FANOUT", "POLLING", "DEFAULT"].contains(&mode.as_str()) {
                    return Err(bad(
                        "expected FANOUT (enhanced fan-out), POLLING (GetRecords) or DEFAULT (fan-out unless a polling key such as maxRecords is set)",
                    ));
                }
                retrieval_mode = Some(mode);
            } else if key
                .to_ascii_lowercase()
                .starts_with("awscredentialsprovider")
            {
                // A chain is comma-separated, arguments follow `|`: flotilla uses the
                // SDK's default chain, so only that may be named.
                let all_default = value
                    .split(',')
                    .map(|p| p.split('|').next().unwrap_or("").trim())
                    .all(|p| DEFAULT_CHAIN.contains(&p));
                if !all_default {
                    return Err(unsupported(
                        "flotilla uses the AWS SDK's default chain (environment, a profile through AWS_PROFILE, web identity, container and instance credentials); set DefaultCredentialsProvider and choose the credentials through that chain",
                    ));
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
        if let Some(name) = stream_arn {
            settings.push(("worker.stream".to_owned(), name));
        }
        // Where a new application starts: AT_TIMESTAMP when a time is given, else
        // initialPositionInStream, else LATEST (the KCL's default, not flotilla's).
        let position = match (timestamp, position_key) {
            (Some(at), _) => {
                settings.push(("worker.initial_timestamp".to_owned(), at));
                "AT_TIMESTAMP"
            }
            (None, Some(position)) => position,
            (None, None) => "LATEST",
        };
        settings.push(("worker.initial_position".to_owned(), position.to_owned()));
        // How records are read, as the daemon decides it: FANOUT and POLLING say so;
        // DEFAULT (or no retrievalMode) is fan-out unless a polling key is set.
        let polls = POLLING_KEYS.iter().any(|k| properties.get(k).is_some());
        let mode = match retrieval_mode.as_deref() {
            Some("FANOUT") => "fanout",
            Some("POLLING") => "polling",
            _ if polls => "polling",
            _ => "fanout",
        };
        settings.push(("reader.mode".to_owned(), mode.to_owned()));
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

    /// The npm sample's properties file (samples/basic_sample/consumer), as published.
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
            // No retrievalMode and no polling key: the daemon reads with fan-out.
            ("reader.mode", "fanout"),
        ];
        for (key, want) in table {
            assert_eq!(setting(&c, key), Some(want), "{key}");
        }
        assert_eq!(setting(&c, "lease.table"), None);
        assert_eq!(setting(&c, "reader.consumer_name"), None);
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(c.warnings[0].starts_with("processingLanguage is not used"));
    }

    #[test]
    fn every_mapped_key() {
        let c = config(
            "executableName = python3  -u   app.py --flag\n\
             streamName = old-name\n\
             streamArn = arn:aws:kinesis:eu-west-1:123456789012:stream/orders\n\
             applicationName = orders-app\n\
             tableName = orders-leases\n\
             fanoutConfig.consumerName = orders-efo\n\
             maxRecords = 2500\n\
             idleTimeBetweenReadsInMillis = 50\n\
             failoverTimeMillis = 20000\n\
             shardSyncIntervalMillis = 60000\n\
             parentShardPollIntervalMillis = 5000\n\
             taskBackoffTimeMillis = 700\n\
             metricsBufferTimeMillis = 10000\n\
             maxLeasesForWorker = 40\n\
             maxLeasesToStealAtOneTime = 2\n\
             kinesisEndpoint = http://127.0.0.1:4567\n\
             dynamoDBEndpoint = http://127.0.0.1:8000\n\
             workerId = w-1\n\
             metricsLevel = summary\n\
             timeoutInSeconds = 90\n\
             callProcessRecordsEvenForEmptyRecordList = false\n\
             retrievalMode = polling\n\
             initialPositionInStream = TRIM_HORIZON\n\
             initialPositionInStreamExtended = 1700000000\n\
             AwsCredentialsProviderDynamoDB = DefaultCredentialsProvider\n\
             someFutureKey = 1\n",
        )
        .unwrap();
        assert_eq!(c.command.argv, ["python3", "-u", "app.py", "--flag"]);
        assert_eq!(c.command.watchdog, Some(Duration::from_secs(90)));
        let table = [
            ("worker.stream", "orders"),
            ("worker.application", "orders-app"),
            ("lease.table", "orders-leases"),
            ("reader.mode", "polling"),
            ("reader.consumer_name", "orders-efo"),
            ("reader.max_records", "2500"),
            ("reader.poll_interval", "200ms"),
            ("lease.failover_time", "20000ms"),
            ("reader.shard_sync_interval", "60000ms"),
            ("reader.parent_poll_interval", "5000ms"),
            ("supervision.restart_backoff_min", "700ms"),
            ("metrics.interval", "10000ms"),
            ("lease.max_leases", "40"),
            ("lease.max_moves_per_round", "2"),
            ("aws.kinesis_endpoint", "http://127.0.0.1:4567"),
            ("aws.dynamodb_endpoint", "http://127.0.0.1:8000"),
            ("worker.worker_id", "w-1"),
            ("metrics.level", "summary"),
            // A time wins over initialPositionInStream.
            ("worker.initial_position", "AT_TIMESTAMP"),
            ("worker.initial_timestamp", "2023-11-14T22:13:20Z"),
        ];
        for (key, want) in table {
            assert_eq!(setting(&c, key), Some(want), "{key}");
        }
        assert_eq!(
            c.warnings,
            [
                "idleTimeBetweenReadsInMillis = 50 reads as 200, the KCL's floor",
                "someFutureKey is not a key flotilla knows; ignored",
            ]
        );
    }

    #[test]
    fn empty_calls_are_asked_for_as_the_kcl_asks_for_them() {
        let on = config("executableName = x\ncallProcessRecordsEvenForEmptyRecordList = TRUE\n");
        assert_eq!(setting(&on.unwrap(), "reader.call_on_empty"), Some("true"));
        let off = config("executableName = x\ncallProcessRecordsEvenForEmptyRecordList = false\n");
        assert_eq!(setting(&off.unwrap(), "reader.call_on_empty"), None);
    }

    #[test]
    fn a_file_without_a_position_starts_at_latest_as_the_kcl_does() {
        let c = config("executableName = x\nmaxRecords = 100\n").unwrap();
        assert_eq!(setting(&c, "worker.initial_position"), Some("LATEST"));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
    }

    /// `retrievalMode` as the daemon reads it: FANOUT and POLLING say so; DEFAULT, or
    /// none, is fan-out unless a polling key is set.
    #[test]
    fn records_are_read_as_the_daemon_would_read_them() {
        let table: &[(&str, &str)] = &[
            ("", "fanout"),
            ("retrievalMode = DEFAULT\n", "fanout"),
            ("retrievalMode = FANOUT\n", "fanout"),
            ("retrievalMode = fanout\n", "fanout"),
            ("retrievalMode = POLLING\n", "polling"),
            ("maxRecords = 500\n", "polling"),
            ("idleTimeBetweenReadsInMillis = 1000\n", "polling"),
            ("retryGetRecordsInSeconds = 1\n", "polling"),
            ("maxGetRecordsThreadPool = 1\n", "polling"),
            ("retrievalMode = DEFAULT\nmaxRecords = 500\n", "polling"),
            // FANOUT said outright wins over a polling key, as in the daemon.
            ("retrievalMode = FANOUT\nmaxRecords = 500\n", "fanout"),
        ];
        for (text, want) in table {
            let c = config(&format!("executableName = x\n{text}")).unwrap();
            assert_eq!(setting(&c, "reader.mode"), Some(*want), "{text:?}");
        }
    }

    /// The lease table and the fan-out consumer may be named apart from the
    /// application, as the daemon lets them be.
    #[test]
    fn the_table_and_the_consumer_take_their_own_names() {
        let c = config(
            "executableName = x\napplicationName = orders-app\ntableName = orders-leases\n\
             fanoutConfig.consumerName = orders-efo\n",
        )
        .unwrap();
        assert_eq!(setting(&c, "worker.application"), Some("orders-app"));
        assert_eq!(setting(&c, "lease.table"), Some("orders-leases"));
        assert_eq!(setting(&c, "reader.consumer_name"), Some("orders-efo"));
        assert!(c.warnings.is_empty(), "{:?}", c.warnings);
        // As the worker gets them, under a settings file and variables (none here).
        let mut base = c.settings.clone();
        base.push(("worker.stream".to_owned(), "orders".to_owned()));
        base.push(("metrics.level".to_owned(), "none".to_owned()));
        base.push(("status.enabled".to_owned(), "false".to_owned()));
        let settings = crate::Settings::load_over(&base, "app.properties", None, []).unwrap();
        assert_eq!(settings.lease_table(), "orders-leases");
        assert_eq!(settings.reader.mode, crate::settings::ReadMode::Fanout);
        assert_eq!(
            settings
                .reader
                .consumer_name_for(&settings.worker.application),
            "orders-efo"
        );
        // A bare consumerName is not read by the daemon: said, and not used.
        let c = config("executableName = x\nconsumerName = other\n").unwrap();
        assert_eq!(setting(&c, "reader.consumer_name"), None);
        assert_eq!(c.warnings.len(), 1, "{:?}", c.warnings);
        assert!(
            c.warnings[0].contains("fanoutConfig.consumerName"),
            "{:?}",
            c.warnings
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
                "executableName = x\ninitialPositionInStream = AT_TIMESTAMP\n",
                "initialPositionInStreamExtended",
            ),
            (
                "executableName = x\ninitialPositionInStreamExtended = 2024-01-01\n",
                "seconds since the epoch",
            ),
            (
                "executableName = x\ncallProcessRecordsEvenForEmptyRecordList = yes\n",
                "expected true or false",
            ),
            (
                "executableName = x\nretrievalMode = PUSH\n",
                "retrievalMode = \"PUSH\": expected FANOUT (enhanced fan-out), POLLING \
                 (GetRecords) or DEFAULT",
            ),
            (
                "executableName = x\nfanoutConfig.consumerArn = arn:aws:kinesis:us-east-1:1:stream/s/consumer/c:1\n",
                "set fanoutConfig.consumerName",
            ),
            (
                "executableName = x\nAWSCredentialsProvider = ProfileCredentialsProvider|dev\n",
                "AWS_PROFILE",
            ),
            (
                "executableName = x\nAwsCredentialsProviderCloudWatch = DefaultCredentialsProvider,StaticCredentialsProvider|a|b\n",
                "default chain",
            ),
            (
                "executableName = x\nmetricsLevel = LOUD\n",
                "expected NONE, SUMMARY or DETAILED",
            ),
            (
                "executableName = x\nstreamArn = orders\n",
                "not a Kinesis stream ARN",
            ),
        ];
        for (text, want) in table {
            let error = config(text).unwrap_err().to_string();
            assert!(error.contains(want), "{text:?}: {error}");
        }
    }

    /// Every key the KCL 2.5.8 MultiLangDaemon reads from its file
    /// (`KinesisClientLibConfigurator` sets each on `MultiLangDaemonConfiguration` by
    /// name, and `MultiLangDaemonConfig` reads the first three itself; seen in the
    /// source at tag v2.5.8 and with the daemon of tests/kcl.rs), each with a value it
    /// accepts. The fan-out configuration's keys are written `fanoutConfig.NAME` (a
    /// nested property to the daemon's BeanUtils: its configurator, run on a file with
    /// a bare `consumerName`, leaves the consumer's name unset). flotilla maps each,
    /// says why it does not need it, or refuses it with what to do: none is "not a key
    /// flotilla knows".
    const KCL_2_5_8_KEYS: &[(&str, &str)] = &[
        ("executableName", "python3 app.py"),
        ("processingLanguage", "python/3.11"),
        ("maxActiveThreads", "0"),
        ("applicationName", "orders-app"),
        ("streamName", "orders"),
        (
            "streamArn",
            "arn:aws:kinesis:us-east-1:123456789012:stream/orders",
        ),
        ("tableName", "orders-leases"),
        ("workerId", "w-1"),
        (
            "AWSCredentialsProvider",
            "DefaultAWSCredentialsProviderChain",
        ),
        (
            "AWSCredentialsProviderDynamoDB",
            "DefaultAWSCredentialsProviderChain",
        ),
        (
            "AWSCredentialsProviderCloudWatch",
            "DefaultAWSCredentialsProviderChain",
        ),
        ("regionName", "us-east-1"),
        ("kinesisEndpoint", "http://127.0.0.1:4567"),
        ("dynamoDBEndpoint", "http://127.0.0.1:8000"),
        ("failoverTimeMillis", "10000"),
        ("shardSyncIntervalMillis", "60000"),
        ("cleanupLeasesUponShardCompletion", "true"),
        ("ignoreUnexpectedChildShards", "false"),
        ("maxLeasesForWorker", "20"),
        ("maxLeasesToStealAtOneTime", "1"),
        ("initialLeaseTableReadCapacity", "10"),
        ("initialLeaseTableWriteCapacity", "10"),
        ("maxLeaseRenewalThreads", "20"),
        ("listShardsBackoffTimeInMillis", "1500"),
        ("maxListShardsRetryAttempts", "50"),
        ("initialPositionInStream", "TRIM_HORIZON"),
        ("initialPositionInStreamExtended", "1700000000"),
        ("parentShardPollIntervalMillis", "10000"),
        ("shardPrioritization", "NoOpShardPrioritization"),
        ("skipShardSyncAtWorkerInitializationIfLeasesExist", "false"),
        ("schedulerInitializationBackoffTimeMillis", "1000"),
        ("taskBackoffTimeMillis", "500"),
        ("logWarningForTaskAfterMillis", "10000"),
        ("callProcessRecordsEvenForEmptyRecordList", "false"),
        ("metricsLevel", "NONE"),
        ("metricsBufferTimeMillis", "10000"),
        ("metricsMaxQueueSize", "10000"),
        ("metricsEnabledDimensions", "Operation,ShardId"),
        ("retrievalMode", "POLLING"),
        ("fanoutConfig.consumerName", "orders-app-efo"),
        (
            "fanoutConfig.consumerArn",
            "arn:aws:kinesis:us-east-1:123456789012:stream/orders/consumer/c:1",
        ),
        ("fanoutConfig.maxDescribeStreamSummaryRetries", "10"),
        ("fanoutConfig.maxDescribeStreamConsumerRetries", "10"),
        ("fanoutConfig.registerStreamConsumerRetries", "10"),
        ("fanoutConfig.retryBackoffMillis", "1000"),
        ("idleTimeBetweenReadsInMillis", "1000"),
        ("maxRecords", "10000"),
        ("retryGetRecordsInSeconds", "1"),
        ("maxGetRecordsThreadPool", "1"),
        ("shutdownGraceMillis", "3000"),
        ("timeoutInSeconds", "60"),
        ("validateSequenceNumberBeforeCheckpointing", "true"),
    ];

    #[test]
    fn every_key_the_java_daemon_reads_is_mapped_explained_or_refused() {
        let required = "executableName = python3 app.py\napplicationName = orders-app\n";
        for (key, value) in KCL_2_5_8_KEYS {
            let text = format!("{required}{key} = {value}\n");
            match config(&text) {
                Ok(c) => {
                    let unknown: Vec<&String> = c
                        .warnings
                        .iter()
                        .filter(|w| w.contains("not a key flotilla knows"))
                        .collect();
                    assert!(unknown.is_empty(), "{key}: {unknown:?}");
                }
                Err(DaemonConfigError::Unsupported { what_to_do, .. }) => {
                    assert!(!what_to_do.is_empty(), "{key}: refused without a way out")
                }
                Err(other) => panic!("{key} = {value}: {other}"),
            }
        }
    }
}
