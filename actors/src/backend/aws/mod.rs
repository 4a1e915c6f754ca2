//! Adapters over the AWS SDK. Thin: each call is translated to one SDK call (or a
//! paginated series) and each SDK error to the port's typed error, nothing else.
//!
//! All three are built from one `aws_config::SdkConfig` (default credential chain and
//! region), with an optional endpoint URL per service for local servers.

mod cloudwatch;
mod dynamodb;
mod kinesis;

pub use cloudwatch::CloudWatchMetrics;
pub use dynamodb::DynamoLeaseTable;
pub use kinesis::KinesisStream;

/// Endpoint URLs that replace the AWS ones (local servers). `None` means AWS.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Endpoints {
    pub kinesis: Option<String>,
    pub dynamodb: Option<String>,
    pub cloudwatch: Option<String>,
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

/// The URL a client talks to, for error messages: the override, or the AWS endpoint of
/// the configured region.
pub(crate) fn endpoint_name(sdk: &aws_config::SdkConfig, service: &str, custom: Option<&str>) -> String {
    match custom {
        Some(url) => url.to_owned(),
        None => match sdk.region() {
            Some(region) => format!("https://{service}.{region}.amazonaws.com"),
            None => format!("{service} (no region configured)"),
        },
    }
}
