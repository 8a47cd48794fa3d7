//! The Kubernetes client of every ringlb program: kube-client's own stack, with
//! `TCP_NODELAY` on the connections to the API server.
//!
//! kube-client 5 builds its connector with `HttpConnector::new()`, which leaves
//! Nagle's algorithm on. Whenever a client writes twice before the server answers
//! (the last flight of a TLS handshake, then the first request on that connection),
//! the second write waits for the server's ACK of the first, and the server's kernel
//! holds that ACK back for its delayed-ACK timer (40 ms on Linux): every request on a
//! new connection started ~40 ms late. A watch holds its connection for as long as it
//! runs, so a program that watches and writes opens new connections all the time.
//! docs/bench-lab.md has the measurement.
//!
//! The stack mirrors kube-client's `ClientBuilder::try_from(Config)`: the connect,
//! read and write timeouts, the base URI, retries of 429/503/504, authentication, the
//! extra headers and a debug-level trace span per request. A kubeconfig with a proxy
//! URL gets kube-client's own client (its proxy connectors; Nagle on).

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use kube::client::ConfigExt;
use kube::client::retry::RetryPolicy;
use tower::retry::RetryLayer;
use tower::{BoxError, ServiceBuilder};
use tower_http::trace::TraceLayer;

/// A kube client for `config` whose TCP connections set `TCP_NODELAY`.
pub fn client(config: kube::Config) -> Result<kube::Client, kube::Error> {
    if config.proxy_url.is_some() {
        return kube::Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    http.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(http)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper: hyper_util::client::legacy::Client<_, kube::client::Body> =
        hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(
            config
                .default_retry
                .then(|| RetryLayer::new(RetryPolicy::server_retry())),
        )
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .layer(TraceLayer::new_for_http())
        .map_err(BoxError::from)
        .service(hyper);
    Ok(kube::Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::os::fd::BorrowedFd;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    const VERSION: &str = r#"{"major":"1","minor":"34","gitVersion":"v1.34.4","gitCommit":"c","gitTreeState":"clean","buildDate":"d","goVersion":"go1.24","compiler":"gc","platform":"linux/amd64"}"#;

    /// Answers one `GET /version` and returns the client's address; the connection
    /// stays open (the client pools it).
    async fn serve_version(listener: TcpListener) -> (tokio::net::TcpStream, SocketAddr) {
        let (mut s, peer) = listener.accept().await.unwrap();
        let mut req = Vec::new();
        let mut buf = [0u8; 1024];
        while !req.windows(4).any(|w| w == b"\r\n\r\n") {
            let n = s.read(&mut buf).await.unwrap();
            assert!(n > 0, "the client closed before its request");
            req.extend_from_slice(&buf[..n]);
        }
        let resp = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{VERSION}",
            VERSION.len()
        );
        s.write_all(resp.as_bytes()).await.unwrap();
        (s, peer)
    }

    /// `TCP_NODELAY` on this process's socket whose local address is `addr`.
    fn nodelay_of_local(addr: SocketAddr) -> bool {
        for entry in std::fs::read_dir("/proc/self/fd").unwrap() {
            let Some(fd) = entry
                .ok()
                .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
            else {
                continue;
            };
            // SAFETY: the client's socket stays open while its pooled connection
            // lives (the server half is still held by the caller); another fd of this
            // process that closes meanwhile only fails the calls below.
            #[allow(unsafe_code)]
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let sock = socket2::SockRef::from(&fd);
            if sock.local_addr().ok().and_then(|a| a.as_socket()) == Some(addr) {
                return sock.tcp_nodelay().unwrap();
            }
        }
        panic!("no socket of this process has local address {addr}");
    }

    async fn nodelay_with(build: fn(kube::Config) -> kube::Client) -> bool {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(serve_version(listener));
        let client = build(kube::Config::new(url.parse().unwrap()));
        let v = client.apiserver_version().await.unwrap();
        assert_eq!(v.git_version, "v1.34.4");
        let (_held, peer) = server.await.unwrap();
        nodelay_of_local(peer)
    }

    /// The connections of [`super::client`] set `TCP_NODELAY`.
    #[tokio::test]
    async fn api_connections_set_nodelay() {
        assert!(nodelay_with(|c| super::client(c).unwrap()).await);
    }

    /// kube-client's own stack does not (the reason for [`super::client`]): when this
    /// fails, kube-client sets it itself and the module can go.
    #[tokio::test]
    async fn kube_clients_own_stack_leaves_nagle_on() {
        assert!(!nodelay_with(|c| kube::Client::try_from(c).unwrap()).await);
    }
}
