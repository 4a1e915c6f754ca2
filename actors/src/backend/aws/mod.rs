//! Adapters over the AWS SDK. Thin: each call is translated to one SDK call (or a
//! paginated series) and each SDK error to the port's typed error, nothing else.
//!
//! All three are built from one `aws_config::SdkConfig` (default credential chain and
//! region), with an optional endpoint URL per service for local servers (and so is the
//! SQS client of a dead-letter queue, `crate::failure::SqsDeadLetters`).
//!
//! `tuned_for` gives each service's configuration the `[aws]` call timeout of that
//! service (by default Kinesis and DynamoDB Streams 30 s, DynamoDB 1 min, CloudWatch
//! 30 s, as the KCL's; a dead-letter queue's SQS calls take Kinesis'), the optional attempt timeout and the SDK's standard retries with
//! `max_attempts`; `Backend::from_sdk` and every CLI command go through it, so the
//! settings are the one place these are set. A fan-out subscription is bounded by it
//! until its initial answer only (the SDK's operation timeout ends with the response
//! headers; `tests/aws_timeouts.rs` holds one open past it). `classify` sorts SDK
//! errors as the SDK's retry classifiers do (any 5xx, with or without an error code, is
//! transient), and errors name the endpoint they could not reach.

#[cfg(feature = "cloudwatch")]
mod cloudwatch;
mod dynamodb;
mod dynamodb_streams;
mod kinesis;

use aws_smithy_runtime_api::client::orchestrator::HttpResponse;
use aws_smithy_runtime_api::client::result::SdkError;
use aws_smithy_types::error::metadata::ProvideErrorMetadata;

#[cfg(feature = "cloudwatch")]
pub use cloudwatch::{CloudWatchMetrics, IAM_ACTIONS as CLOUDWATCH_IAM_ACTIONS};
pub use dynamodb::{
    Billing, DynamoLeaseTable, IAM_ACTIONS as DYNAMODB_IAM_ACTIONS, TableOptions, TableSettings,
    item_from_sdk, item_to_sdk,
};
pub use dynamodb_streams::{DynamoStreams, IAM_ACTIONS as DYNAMODB_STREAMS_IAM_ACTIONS};
pub use kinesis::{IAM_ACTIONS as KINESIS_IAM_ACTIONS, KinesisStream};

use crate::backend::StreamError;
#[cfg(not(feature = "cloudwatch"))]
use crate::backend::{MetricDatum, MetricsError, MetricsSink};

/// Why a `metrics.level` other than `none` is refused by a build without CloudWatch (the
/// settings' rule), and what the AWS backend's metrics sink answers in such a build.
pub const NO_CLOUDWATCH: &str =
    "built without the cloudwatch feature: set metrics.level = \"none\" or enable the feature";

/// The metrics sink of an AWS backend built without the `cloudwatch` feature: there is
/// no CloudWatch client to send with. Settings refuse every `metrics.level` but `none`
/// in such a build, so nothing is ever put here; if something is, it is refused with
/// the reason rather than dropped, so data cannot vanish without a word.
#[cfg(not(feature = "cloudwatch"))]
#[derive(Debug, Clone, Copy, Default)]
pub struct NoCloudWatch;

#[cfg(not(feature = "cloudwatch"))]
impl MetricsSink for NoCloudWatch {
    fn put<'a>(
        &'a self,
        _namespace: &'a str,
        _data: Vec<MetricDatum>,
    ) -> futures::future::BoxFuture<'a, Result<(), MetricsError>> {
        Box::pin(futures::future::ready(Err(MetricsError::Other {
            message: NO_CLOUDWATCH.to_owned(),
        })))
    }
}

/// Endpoint URLs that replace the AWS ones (local servers). `None` means AWS.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoints {
    /// The Kinesis Data Streams endpoint URL.
    pub kinesis: Option<String>,
    /// The DynamoDB endpoint URL: the lease table, and DynamoDB Streams too (a local
    /// server serves both).
    pub dynamodb: Option<String>,
    /// The CloudWatch endpoint URL, for the metrics.
    pub cloudwatch: Option<String>,
    /// The SQS endpoint URL, for a dead-letter queue (`failure.destination = "sqs:…"`).
    pub sqs: Option<String>,
}

/// Loads the SDK configuration: default credential chain, and the region given or the
/// default chain's.
pub async fn load_sdk_config(region: Option<String>) -> aws_config::SdkConfig {
    let mut loader = aws_config::defaults(aws_config::BehaviorVersion::latest());
    if let Some(region) = region {
        loader = loader.region(aws_config::Region::new(region));
    }
    loader.load().await
}

/// Which service a client is for: each has its own call timeout (`aws.*_timeout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Service {
    /// Kinesis Data Streams and DynamoDB Streams: the records.
    Stream,
    /// DynamoDB: the lease table.
    LeaseTable,
    /// CloudWatch: the metrics.
    Metrics,
    /// SQS: the dead-letter queue of `failure.destination = "sqs:…"`. Its calls take
    /// `aws.kinesis_timeout`, as the dead-letter stream's do: there is no setting of
    /// its own.
    DeadLetters,
}

/// How long one call of a service may take and how often it is tried: what
/// `AwsSettings::call_limits` gives each [`Service`] from `[aws]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallLimits {
    /// The whole call, every attempt and backoff included.
    pub operation: std::time::Duration,
    /// One attempt; `None`: an attempt may take the whole call's time.
    pub attempt: Option<std::time::Duration>,
    /// Attempts per call, the first included (the SDK's standard retries).
    pub max_attempts: u32,
}

/// `sdk` with `limits` on its calls. Every client flotilla makes (worker and command
/// line) goes through here with the limits `[aws]` gives its service, so the settings are
/// the one place they are set; the rest of `sdk` (credentials, region, HTTP client) is kept.
pub fn tuned_for(sdk: &aws_config::SdkConfig, limits: CallLimits) -> aws_config::SdkConfig {
    let CallLimits {
        operation,
        attempt,
        max_attempts,
    } = limits;
    let mut timeouts = match sdk.timeout_config() {
        Some(config) => config.to_builder(),
        None => aws_config::timeout::TimeoutConfig::builder(),
    }
    .operation_timeout(operation);
    timeouts = match attempt {
        Some(attempt) => timeouts.operation_attempt_timeout(attempt),
        None => timeouts.disable_operation_attempt_timeout(),
    };
    sdk.to_builder()
        .timeout_config(timeouts.build())
        .retry_config(aws_config::retry::RetryConfig::standard().with_max_attempts(max_attempts))
        .build()
}

/// The URL a client talks to, for error messages: the override, or the AWS endpoint of
/// the configured region.
pub(crate) fn endpoint_name(
    sdk: &aws_config::SdkConfig,
    service: &str,
    custom: Option<&str>,
) -> String {
    match custom {
        Some(url) => url.to_owned(),
        None => match sdk.region() {
            Some(region) => format!("https://{service}.{region}.amazonaws.com"),
            None => format!("{service} (no region configured)"),
        },
    }
}

/// Error codes the SDK's own retry classifier treats as throttling
/// (`aws_runtime::retries::classifiers::THROTTLING_ERRORS`), so that "throttled" means
/// the same here as in the SDK's retry decisions.
pub(crate) const THROTTLING_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "ThrottledException",
    "RequestThrottledException",
    "TooManyRequestsException",
    "ProvisionedThroughputExceededException",
    "TransactionInProgressException",
    "RequestLimitExceeded",
    "BandwidthLimitExceeded",
    "LimitExceededException",
    "RequestThrottled",
    "SlowDown",
    "PriorRequestNotComplete",
    "EC2ThrottledException",
];

/// Error codes that mean the credentials may not make the call or are not valid. The
/// same request fails the same way until IAM or the credentials change; the binary
/// says what to grant.
pub(crate) const DENIED_CODES: &[&str] = &[
    "AccessDeniedException",
    "AccessDenied",
    "UnrecognizedClientException",
    "InvalidSignatureException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "InvalidClientTokenId",
    "ExpiredTokenException",
    "ExpiredToken",
];

/// Error codes that say the service failed, not the request: retried like a 5xx.
/// DynamoDB names its 500s `InternalServerError`, Kinesis `InternalFailure`; both may
/// answer `ServiceUnavailable` (503). Matched whatever the HTTP status, because an
/// emulator may send them with a 400.
pub(crate) const TRANSIENT_CODES: &[&str] = &[
    "InternalFailure",
    "InternalServerError",
    "InternalServerErrorException",
    "ServiceUnavailable",
    "ServiceUnavailableException",
    "RequestTimeout",
    "RequestTimeoutException",
];

/// What an SDK error says apart from the codes an adapter maps itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Failure {
    /// A throttling code, or HTTP 429.
    Throttled,
    /// No answer, a timeout, an answer cut short, a 5xx (with or without an error
    /// code), or a [`TRANSIENT_CODES`] code: the service failed, not the request.
    Transient,
    /// A [`DENIED_CODES`] code, or HTTP 403.
    Denied,
    Other,
}

/// Sorts an SDK error the way the SDK's own retry classifiers do, so that what the
/// SDK retried and gave up on is retried again by the caller (with its backoff), and
/// not taken for a fault of the request. A 5xx is transient even without an error code
/// (a proxy's or load balancer's bare 500, an emulator's HTML error page): nothing in
/// such an answer says the request was wrong.
pub(crate) fn classify<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> Failure {
    let code = err.code();
    match (err, err.raw_response().map(|r| r.status().as_u16())) {
        _ if code.is_some_and(|c| THROTTLING_CODES.contains(&c)) => Failure::Throttled,
        _ if code.is_some_and(|c| TRANSIENT_CODES.contains(&c)) => Failure::Transient,
        _ if code.is_some_and(|c| DENIED_CODES.contains(&c)) => Failure::Denied,
        (SdkError::DispatchFailure(_) | SdkError::TimeoutError(_), _) => Failure::Transient,
        (SdkError::ResponseError(_), _) => Failure::Transient,
        (_, Some(429)) => Failure::Throttled,
        (_, Some(403)) => Failure::Denied,
        (_, Some(500..=599)) => Failure::Transient,
        _ => Failure::Other,
    }
}

/// Kinesis' throttling code for its KMS calls, throttling on top of [`THROTTLING_CODES`].
pub(crate) const KMS_THROTTLING: &str = "KMSThrottlingException";

/// The one mapping of a stream service's error to a [`StreamError`], by its code first
/// and its [`Failure`] second: Kinesis calls, Kinesis subscription events and DynamoDB
/// Streams calls all go through it, so the two sources cannot disagree on what a code
/// means. Codes only one service sends (`TrimmedDataAccessException` is DynamoDB
/// Streams', `KMSThrottlingException` Kinesis') never reach the other.
pub(crate) fn stream_error(
    op: &'static str,
    code: Option<&str>,
    failure: Failure,
    message: String,
    endpoint: &str,
) -> StreamError {
    match (code, failure) {
        (Some("ExpiredIteratorException"), _) => StreamError::IteratorExpired { op, message },
        (Some("ResourceNotFoundException"), _) => StreamError::NotFound { op, message },
        (Some("ResourceInUseException"), _) => StreamError::InUse { op, message },
        (Some("TrimmedDataAccessException"), _) => StreamError::Trimmed { op, message },
        (Some("InvalidArgumentException" | "ValidationException"), _) => {
            StreamError::InvalidArgument { op, message }
        }
        (Some(KMS_THROTTLING), _) | (_, Failure::Throttled) => {
            StreamError::Throttled { op, message }
        }
        (_, Failure::Transient) => StreamError::Transient {
            op,
            endpoint: endpoint.to_owned(),
            message,
        },
        (_, Failure::Denied) => StreamError::AccessDenied { op, message },
        (_, Failure::Other) => StreamError::Other { op, message },
    }
}

/// An SDK error of a stream service's call as a [`StreamError`] (see [`stream_error`]).
pub(crate) fn sdk_stream_error<E>(
    op: &'static str,
    err: SdkError<E, HttpResponse>,
    endpoint: &str,
) -> StreamError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
{
    let message = error_text(&err);
    stream_error(op, err.code(), classify(&err), message, endpoint)
}

/// A sequence number from a stream service's answer; `what` names where it was.
pub(crate) fn parse_sequence(
    op: &'static str,
    what: impl std::fmt::Display,
    text: &str,
) -> Result<crate::model::SequenceNumber, StreamError> {
    crate::model::SequenceNumber::parse(text).map_err(|e| StreamError::Other {
        op,
        message: format!("{what}: malformed sequence number from the server: {e}"),
    })
}

/// An error and its causes, `: `-separated, each said once.
pub(crate) fn cause_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        // Generated errors wrap a struct that displays the same text: say it once.
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// The error and its causes, `: `-separated (what `DisplayErrorContext` prints, without
/// its trailing Debug dump of the whole response), and the HTTP status if there was one.
pub(crate) fn error_text<E>(err: &SdkError<E, HttpResponse>) -> String
where
    E: std::error::Error + 'static,
{
    let mut text = cause_chain(err);
    if let Some(response) = err.raw_response() {
        text.push_str(&format!(" (HTTP {})", response.status().as_u16()));
    }
    text
}
