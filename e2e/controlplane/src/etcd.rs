//! The two things the harness asks etcd directly, over its JSON gateway on loopback:
//! is it healthy, and compact its history (for 410 Gone tests).

use std::net::SocketAddr;
use std::time::Duration;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// One plain-HTTP request with a 5 s limit; the body of a 200 answer, or why not.
async fn request(
    addr: SocketAddr,
    method: http::Method,
    path: &str,
    body: &str,
) -> Result<String, String> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .map_err(|e| e.to_string())?;
    let answer = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        let status = resp.status();
        let bytes = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let text = String::from_utf8_lossy(&bytes).into_owned();
        if status == http::StatusCode::OK {
            Ok(text)
        } else {
            Err(format!("{status}: {text}"))
        }
    };
    tokio::time::timeout(Duration::from_secs(5), answer)
        .await
        .map_err(|_| "no answer within 5 s".to_string())?
}

async fn post(addr: SocketAddr, path: &str, body: &str) -> Result<String, String> {
    request(addr, http::Method::POST, path, body).await
}

pub(crate) async fn healthy(addr: SocketAddr) -> bool {
    request(addr, http::Method::GET, "/health", "")
        .await
        .is_ok_and(|b| b.contains("\"health\":\"true\""))
}

/// Compacts to the current revision (physically); returns that revision.
pub(crate) async fn compact(addr: SocketAddr) -> Result<i64, String> {
    // Any range answers with the header's current revision. Key "/" in base64.
    let range = post(addr, "/v3/kv/range", r#"{"key":"Lw=="}"#).await?;
    let v: serde_json::Value =
        serde_json::from_str(&range).map_err(|e| format!("range answer {range:?}: {e}"))?;
    let rev: i64 = v["header"]["revision"]
        .as_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no header.revision in {range}"))?;
    post(
        addr,
        "/v3/kv/compaction",
        &format!(r#"{{"revision":"{rev}","physical":true}}"#),
    )
    .await?;
    Ok(rev)
}
