//! The two things the harness asks etcd directly, over its JSON gateway on loopback:
//! is it healthy, and compact its history (for 410 Gone tests).

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One plain-HTTP/1.1 request; the response body, or an error string.
async fn post(addr: SocketAddr, path: &str, body: &str) -> Result<String, String> {
    let io = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    let text = tokio::time::timeout(Duration::from_secs(5), io)
        .await
        .map_err(|_| "no answer within 5 s".to_string())?
        .map_err(|e| e.to_string())?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(head.lines().next().unwrap_or("no status line").to_string());
    }
    Ok(dechunk(head, body))
}

/// The body of a `Transfer-Encoding: chunked` response, or `body` as it is.
fn dechunk(head: &str, body: &str) -> String {
    if !head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        return body.to_string();
    }
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, tail)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.trim(), 16) else {
            break;
        };
        if n == 0 || tail.len() < n {
            break;
        }
        out.push_str(&tail[..n]);
        rest = tail[n..].trim_start_matches("\r\n");
    }
    out
}

pub async fn healthy(addr: SocketAddr) -> bool {
    let get = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(b"GET /health HTTP/1.1\r\nHost: etcd\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out.contains("\"health\":\"true\""))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), get).await,
        Ok(Some(true))
    )
}

/// Compacts to the current revision (physically); returns that revision.
pub async fn compact(addr: SocketAddr) -> Result<i64, String> {
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

#[cfg(test)]
mod tests {
    #[test]
    fn dechunks() {
        let head = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked";
        assert_eq!(
            super::dechunk(head, "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"),
            "abcde"
        );
        assert_eq!(super::dechunk("HTTP/1.1 200 OK", "xyz"), "xyz");
    }
}
