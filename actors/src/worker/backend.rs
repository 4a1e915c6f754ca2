//! [`Backend`]: the three outside systems a worker talks to (a stream service, the
//! lease tables, a metrics sink) and the choice between them: AWS, in memory, or any
//! implementation of the ports. Which client reads a source (Kinesis, or DynamoDB
//! Streams behind an AT_TIMESTAMP scan) is decided here, once, and so is what writes the
//! records `[failure]` discards (`failure.destination`).

use std::fmt;
use std::sync::Arc;

use super::error::WorkerError;
#[cfg(feature = "cloudwatch")]
use crate::backend::aws::CloudWatchMetrics;
use crate::backend::aws::{self, DynamoLeaseTable, DynamoStreams, KinesisStream};
use crate::backend::clock::Clock;
use crate::backend::memory::{MemoryDynamo, MemoryMetrics, MemoryStreams};
use crate::backend::time_scan::TimeScan;
use crate::backend::{LeaseTable, MetricsSink, StreamAdmin, StreamClient};
use crate::failure::{DeadLetters, FileDeadLetters, SqsDeadLetters, StreamDeadLetters};
use crate::model::SourceKind;
use crate::settings::{AwsSettings, Destination};

/// Opens a lease table by name (`Settings::lease_table`).
type OpenTable = Arc<dyn Fn(&str) -> Arc<dyn LeaseTable> + Send + Sync>;

/// The three outside systems a worker talks to. Cheap to clone.
#[derive(Clone)]
pub struct Backend {
    pub(super) streams: Arc<dyn StreamClient>,
    /// DynamoDB Streams, for a `worker.stream` that names a table's stream; `None` where
    /// the backend has none (a memory backend built without one).
    pub(super) table_streams: Option<Arc<dyn StreamClient>>,
    pub(super) tables: OpenTable,
    pub(super) metrics: Arc<dyn MetricsSink>,
    pub(super) clock: Clock,
    /// The settings an AWS backend was built from; the worker refuses to start on other
    /// ones (see [`WorkerError::BackendMismatch`]).
    pub(super) aws: Option<AwsSettings>,
    /// What puts records to a `kinesis:` dead-letter destination: the memory backend's
    /// streams, or the AWS backend's Kinesis client. A backend of any ports
    /// ([`Backend::new`]) has none: a [`StreamClient`] only reads.
    stream_admin: Option<Arc<dyn StreamAdmin>>,
    /// The AWS backend's SQS client, for an `sqs:` dead-letter destination.
    sqs: Option<aws_sdk_sqs::Client>,
    /// A destination given with [`Backend::with_dead_letters`], used whatever
    /// `failure.destination` names.
    dead_letters: Option<Arc<dyn DeadLetters>>,
}

impl fmt::Debug for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Backend")
    }
}

impl Backend {
    /// Any implementation of the ports, e.g. wrapped in [`crate::backend::faults::Faulty`].
    /// `tables` opens a lease table by its name (`Settings::lease_table`).
    pub fn new(
        streams: Arc<dyn StreamClient>,
        tables: impl Fn(&str) -> Arc<dyn LeaseTable> + Send + Sync + 'static,
        metrics: Arc<dyn MetricsSink>,
    ) -> Self {
        Self {
            streams,
            table_streams: None,
            tables: Arc::new(tables),
            metrics,
            clock: Clock::new(),
            aws: None,
            stream_admin: None,
            sqs: None,
            dead_letters: None,
        }
    }

    /// The in-memory services: the embedded default and the fast test double.
    pub fn memory(streams: MemoryStreams, dynamo: MemoryDynamo, metrics: MemoryMetrics) -> Self {
        let clock = streams.clock();
        let streams = Arc::new(streams);
        Self {
            stream_admin: Some(streams.clone()),
            sqs: None,
            dead_letters: None,
            streams,
            table_streams: None,
            tables: Arc::new(move |name: &str| -> Arc<dyn LeaseTable> {
                Arc::new(dynamo.lease_table(name))
            }),
            metrics: Arc::new(metrics),
            clock,
            aws: None,
        }
    }

    /// AWS as the worker's settings say: `aws.region` (else the SDK's default chain:
    /// `AWS_REGION`, the profile) and the `aws.*_endpoint` URLs (local servers; AWS's own
    /// where unset), with the default credential chain. Pass the same settings the worker
    /// gets, as `flotilla run` does:
    ///
    /// ```no_run
    /// # async fn run() -> Result<(), Box<dyn std::error::Error>> {
    /// let settings = flotilla_actors::Settings::load(None)?;
    /// let backend = flotilla_actors::Backend::aws(&settings.aws).await;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// A worker refuses to start on a backend built from other AWS settings than its own
    /// ([`WorkerError::BackendMismatch`]): it would read one place and be configured for
    /// another.
    pub async fn aws(settings: &AwsSettings) -> Self {
        let sdk = aws::load_sdk_config(settings.region.clone()).await;
        Self::from_sdk(&sdk, settings)
    }

    /// AWS adapters from an SDK configuration the caller built (credentials, HTTP client
    /// of its choosing). The endpoints are the settings' `aws.*_endpoint`, as in
    /// [`Backend::aws`], and `aws.region`, when set, replaces the SDK configuration's
    /// region; leave it unset to keep the one `sdk` carries. Call timeouts and retries
    /// are the settings' (`aws.*_timeout`, `aws.attempt_timeout`, `aws.max_attempts`), so
    /// they are set in one place whoever builds the SDK configuration.
    pub fn from_sdk(sdk: &aws_config::SdkConfig, settings: &AwsSettings) -> Self {
        let sdk = match &settings.region {
            Some(region) => sdk
                .to_builder()
                .region(aws_config::Region::new(region.clone()))
                .build(),
            None => sdk.clone(),
        };
        let endpoints = settings.endpoints();
        let dynamodb_endpoint = endpoints.dynamodb.clone();
        let stream_sdk = aws::tuned_for(&sdk, settings.call_limits(aws::Service::Stream));
        let table_sdk = aws::tuned_for(&sdk, settings.call_limits(aws::Service::LeaseTable));
        #[cfg(feature = "cloudwatch")]
        let metrics_sdk = aws::tuned_for(&sdk, settings.call_limits(aws::Service::Metrics));
        let sqs_sdk = aws::tuned_for(&sdk, settings.call_limits(aws::Service::DeadLetters));
        let kinesis = Arc::new(KinesisStream::new(
            &stream_sdk,
            endpoints.kinesis.as_deref(),
        ));
        Self {
            stream_admin: Some(kinesis.clone()),
            sqs: Some(crate::failure::sqs::client(
                &sqs_sdk,
                endpoints.sqs.as_deref(),
            )),
            dead_letters: None,
            streams: kinesis,
            // A local server serves DynamoDB Streams where it serves DynamoDB.
            table_streams: Some(Arc::new(DynamoStreams::new(
                &stream_sdk,
                endpoints.dynamodb.as_deref(),
            ))),
            tables: Arc::new(move |name: &str| -> Arc<dyn LeaseTable> {
                Arc::new(DynamoLeaseTable::new(
                    &table_sdk,
                    dynamodb_endpoint.as_deref(),
                    name,
                ))
            }),
            #[cfg(feature = "cloudwatch")]
            metrics: Arc::new(CloudWatchMetrics::new(
                &metrics_sdk,
                endpoints.cloudwatch.as_deref(),
            )),
            #[cfg(not(feature = "cloudwatch"))]
            metrics: Arc::new(aws::NoCloudWatch),
            clock: Clock::new(),
            aws: Some(settings.clone()),
        }
    }

    /// The DynamoDB Streams a worker reads when `worker.stream` names a table's stream
    /// (e.g. a [`crate::backend::memory::MemoryTableStreams`], or any implementation
    /// of the port wrapped in [`crate::backend::faults::Faulty`]). [`Backend::aws`]
    /// has them already.
    pub fn with_table_streams(mut self, streams: Arc<dyn StreamClient>) -> Self {
        self.table_streams = Some(streams);
        self
    }

    /// Where the worker writes the records `[failure]` discards, whatever
    /// `failure.destination` names: a destination of one's own (an implementation of
    /// [`DeadLetters`]), or one of the three kinds on a backend that cannot write it
    /// (a `kinesis:` stream beside a backend of any ports, say).
    pub fn with_dead_letters(mut self, dead_letters: Arc<dyn DeadLetters>) -> Self {
        self.dead_letters = Some(dead_letters);
        self
    }

    /// What writes discarded records to `destination`: the one given with
    /// [`Backend::with_dead_letters`] if any, else one of `destination`'s kind on this
    /// backend's clients. A file can be written from any backend; a stream needs one
    /// that puts records ([`Backend::memory`], [`Backend::aws`]); a queue needs
    /// [`Backend::aws`]'s SQS client.
    pub(crate) fn dead_letters(
        &self,
        destination: &Destination,
    ) -> Result<Arc<dyn DeadLetters>, WorkerError> {
        if let Some(given) = &self.dead_letters {
            return Ok(given.clone());
        }
        let missing = |needs| WorkerError::NoDeadLetters {
            destination: destination.to_string(),
            needs,
        };
        match destination {
            Destination::File(path) => Ok(Arc::new(FileDeadLetters::new(path))),
            Destination::Kinesis(stream) => {
                let admin = self.stream_admin.clone().ok_or_else(|| {
                    missing("a backend that can put records (Backend::memory or Backend::aws)")
                })?;
                Ok(Arc::new(StreamDeadLetters::new(admin, stream)))
            }
            Destination::Sqs(url) => {
                let client = self
                    .sqs
                    .clone()
                    .ok_or_else(|| missing("a backend with an SQS client (Backend::aws)"))?;
                Ok(Arc::new(SqsDeadLetters::new(client, url)))
            }
        }
    }

    /// The Kinesis client: what the worker lists and reads Kinesis streams with.
    pub fn streams(&self) -> &Arc<dyn StreamClient> {
        &self.streams
    }

    /// The client that reads `source`: Kinesis, or DynamoDB Streams (which gets
    /// AT_TIMESTAMP by a scan, see [`TimeScan`]).
    pub(super) fn reader_of(&self, kind: SourceKind) -> Result<Arc<dyn StreamClient>, WorkerError> {
        match kind {
            SourceKind::Kinesis => Ok(self.streams.clone()),
            SourceKind::DynamoDbStreams => {
                let streams = self
                    .table_streams
                    .clone()
                    .ok_or(WorkerError::NoTableStreams)?;
                Ok(Arc::new(TimeScan::new(streams)))
            }
        }
    }

    /// The lease table named `name` (a worker's is `Settings::lease_table`: the
    /// application's unless `lease.table` names another).
    pub fn lease_table(&self, name: &str) -> Arc<dyn LeaseTable> {
        (self.tables)(name)
    }

    /// Where the worker's metrics go (CloudWatch, on an AWS backend).
    pub fn metrics_sink(&self) -> &Arc<dyn MetricsSink> {
        &self.metrics
    }
}

/// The backend's AWS settings must be the worker's: region and every endpoint.
pub(super) fn check_aws_settings(
    backend: &AwsSettings,
    worker: &AwsSettings,
) -> Result<(), WorkerError> {
    let shown = |value: &Option<String>| match value {
        Some(text) => format!("{text:?}"),
        None => "unset".to_owned(),
    };
    let differences: Vec<String> = [
        ("aws.region", &backend.region, &worker.region),
        (
            "aws.kinesis_endpoint",
            &backend.kinesis_endpoint,
            &worker.kinesis_endpoint,
        ),
        (
            "aws.dynamodb_endpoint",
            &backend.dynamodb_endpoint,
            &worker.dynamodb_endpoint,
        ),
        (
            "aws.cloudwatch_endpoint",
            &backend.cloudwatch_endpoint,
            &worker.cloudwatch_endpoint,
        ),
        (
            "aws.sqs_endpoint",
            &backend.sqs_endpoint,
            &worker.sqs_endpoint,
        ),
    ]
    .into_iter()
    .filter(|(_, b, w)| b != w)
    .map(|(key, b, w)| {
        format!(
            "{key} is {} in the backend but {} in the settings",
            shown(b),
            shown(w)
        )
    })
    .collect();
    if differences.is_empty() {
        return Ok(());
    }
    Err(WorkerError::BackendMismatch {
        differences: differences.join(", "),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_backend_for_other_aws_settings_is_refused_naming_each_difference() {
        let worker = AwsSettings {
            region: Some("eu-west-1".to_owned()),
            kinesis_endpoint: Some("http://127.0.0.1:4567".to_owned()),
            ..AwsSettings::default()
        };
        assert!(check_aws_settings(&worker, &worker).is_ok());
        let other_queues = AwsSettings {
            sqs_endpoint: Some("http://127.0.0.1:9324".to_owned()),
            ..worker.clone()
        };
        let Err(WorkerError::BackendMismatch { differences }) =
            check_aws_settings(&other_queues, &worker)
        else {
            panic!("a mismatch");
        };
        assert_eq!(
            differences,
            "aws.sqs_endpoint is \"http://127.0.0.1:9324\" in the backend but unset in the \
             settings"
        );
        let backend = AwsSettings::default();
        let Err(WorkerError::BackendMismatch { differences }) =
            check_aws_settings(&backend, &worker)
        else {
            panic!("a mismatch");
        };
        assert_eq!(
            differences,
            "aws.region is unset in the backend but \"eu-west-1\" in the settings, \
             aws.kinesis_endpoint is unset in the backend but \"http://127.0.0.1:4567\" \
             in the settings"
        );
    }

    #[tokio::test]
    async fn each_destination_is_written_with_a_client_the_backend_has_or_the_one_given() {
        let names = |backend: &Backend, destinations: &[Destination]| -> Vec<String> {
            destinations
                .iter()
                .map(|d| match backend.dead_letters(d) {
                    Ok(written) => written.name(),
                    Err(e) => format!("error: {e}"),
                })
                .collect()
        };
        let all = [
            Destination::File("/var/lib/flotilla/dead.jsonl".into()),
            Destination::Kinesis("dead".into()),
            Destination::Sqs("https://sqs.eu-west-1.amazonaws.com/123456789012/dead".into()),
        ];
        let memory = Backend::memory(
            MemoryStreams::new(Default::default()),
            MemoryDynamo::new(),
            MemoryMetrics::new(),
        );
        assert_eq!(
            names(&memory, &all),
            [
                "file:/var/lib/flotilla/dead.jsonl",
                "kinesis:dead",
                "error: failure.destination = sqs:https://sqs.eu-west-1.amazonaws.com/\
                 123456789012/dead needs a backend with an SQS client (Backend::aws), or \
                 give one with Backend::with_dead_letters",
            ]
        );
        let dynamo = MemoryDynamo::new();
        let ports = Backend::new(
            Arc::new(MemoryStreams::new(Default::default())),
            move |name: &str| -> Arc<dyn LeaseTable> { Arc::new(dynamo.lease_table(name)) },
            Arc::new(MemoryMetrics::new()),
        );
        assert_eq!(
            names(&ports, &all[..2]),
            [
                "file:/var/lib/flotilla/dead.jsonl",
                "error: failure.destination = kinesis:dead needs a backend that can put \
                 records (Backend::memory or Backend::aws), or give one with \
                 Backend::with_dead_letters",
            ]
        );
        let given = ports.with_dead_letters(Arc::new(FileDeadLetters::new("/tmp/given")));
        assert_eq!(names(&given, &all), ["file:/tmp/given"; 3]);

        let sdk = aws_config::SdkConfig::builder()
            .behavior_version(aws_config::BehaviorVersion::latest())
            .build();
        let aws = Backend::from_sdk(
            &sdk,
            &AwsSettings {
                region: Some("eu-west-1".to_owned()),
                sqs_endpoint: Some("http://127.0.0.1:9324".to_owned()),
                ..AwsSettings::default()
            },
        );
        assert_eq!(
            names(&aws, &all),
            all.iter().map(ToString::to_string).collect::<Vec<_>>()
        );
    }

    #[tokio::test]
    async fn a_table_stream_needs_a_table_streams_client() {
        let memory = Backend::memory(
            MemoryStreams::new(Default::default()),
            MemoryDynamo::new(),
            MemoryMetrics::new(),
        );
        assert!(memory.reader_of(SourceKind::Kinesis).is_ok());
        assert!(matches!(
            memory.reader_of(SourceKind::DynamoDbStreams),
            Err(WorkerError::NoTableStreams)
        ));
        let with = memory
            .clone()
            .with_table_streams(Arc::new(MemoryStreams::new(Default::default())));
        assert!(with.reader_of(SourceKind::DynamoDbStreams).is_ok());
    }
}
