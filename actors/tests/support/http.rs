//! A GET through hyper's client, for tests of the status endpoint.

use http_body_util::{BodyExt, Empty};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// Status code, content type and body of `GET url` with an `Accept` header.
pub async fn get(url: &str, accept: &str) -> (u16, String, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Empty<Bytes>>();
    let request = hyper::Request::get(url)
        .header("accept", accept)
        .body(Empty::new())
        .unwrap();
    let response = client
        .request(request)
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    let status = response.status().as_u16();
    let content_type = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let body = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        content_type,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

/// The URL of `path` on a worker's status endpoint.
pub fn url(worker: &flotilla_actors::Worker, path: &str) -> String {
    format!("http://{}{path}", worker.status_addr().unwrap())
}

/// Polls `GET path` (every 100 ms, 10 s at most) until `done` holds for the JSON body.
pub async fn json_until(
    worker: &flotilla_actors::Worker,
    path: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    for _ in 0..100 {
        let (code, _, body) = get(&url(worker, path), "application/json").await;
        if code == 200 {
            let value: serde_json::Value = serde_json::from_str(&body).unwrap();
            if done(&value) {
                return value;
            }
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    panic!("{path}: never {what}");
}
