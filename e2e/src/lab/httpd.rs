//! The lab pods' HTTP server (`ringlb-lab pod-http`): answers every request with
//! `NAME LOCAL-ADDR` so the client sees which pod served it and that the pod answered
//! as the VIP. `GET /slow` instead streams [`SLOW_LINES`] lines `NAME NNNN`, one every
//! [`SLOW_EVERY`], so a test can hold a connection open while it breaks something.
//! HTTP/1.0, one response per connection, a thread per connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

/// Largest request head accepted; anything bigger gets a 431 and the connection closes.
const MAX_HEAD: usize = 16 * 1024;

/// Lines of a `/slow` response.
pub const SLOW_LINES: usize = 40;
/// Pause between two `/slow` lines.
pub const SLOW_EVERY: Duration = Duration::from_millis(100);

/// Line `i` of a `/slow` response (all lines of one pod have the same length).
pub fn slow_line(name: &str, i: usize) -> String {
    format!("{name} {i:04}\n")
}

/// The body a pod answers with.
pub fn body(name: &str, local: &str) -> String {
    format!("{name} {local}\n")
}

/// The full response for a request head (`Ok`) or a refusal.
fn response(head: Result<String, u16>, body: &str) -> String {
    let (status, reason, body) = match head {
        Ok(_) => (200, "OK", body.to_string()),
        Err(431) => (
            431,
            "Request Header Fields Too Large",
            "request too large\n".into(),
        ),
        Err(_) => (400, "Bad Request", "bad request\n".into()),
    };
    format!(
        "HTTP/1.0 {status} {reason}\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

/// Reads a request head (until the empty line); the request path, or `Err(code)` for
/// a bad or huge head.
fn read_head(r: &mut impl BufRead) -> Result<String, u16> {
    let mut total = 0;
    let mut first = true;
    let mut path = String::new();
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).map_err(|_| 400u16)?;
        if n == 0 {
            return Err(400);
        }
        total += n;
        if total > MAX_HEAD {
            return Err(431);
        }
        if first {
            let mut w = line.split_whitespace();
            match (w.next(), w.next(), w.next()) {
                (Some(_), Some(p), Some(v)) if p.starts_with('/') && v.starts_with("HTTP/") => {
                    path = p.to_string()
                }
                _ => return Err(400),
            }
            first = false;
        }
        if line == "\r\n" || line == "\n" {
            return Ok(path);
        }
    }
}

fn handle(stream: TcpStream, name: &str) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let local = stream
        .local_addr()
        .map(|a| a.to_string())
        .unwrap_or_default();
    let Ok(mut w) = stream.try_clone() else {
        return;
    };
    // bounded: a client that never sends a newline cannot make us buffer without end
    let head = read_head(&mut BufReader::new(stream.take(MAX_HEAD as u64 + 1)));
    if head.as_deref() == Ok("/slow") {
        let len = slow_line(name, 0).len() * SLOW_LINES;
        let hdr = format!(
            "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
        );
        if w.write_all(hdr.as_bytes()).is_err() {
            return;
        }
        for i in 0..SLOW_LINES {
            if w.write_all(slow_line(name, i).as_bytes()).is_err() {
                return;
            }
            std::thread::sleep(SLOW_EVERY);
        }
        return;
    }
    let _ = w.write_all(response(head, &body(name, &local)).as_bytes());
}

/// Serves forever on `listener`.
pub fn serve(listener: TcpListener, name: &str) {
    for conn in listener.incoming() {
        match conn {
            Ok(c) => {
                let name = name.to_string();
                std::thread::spawn(move || handle(c, &name));
            }
            Err(e) => eprintln!("pod-http {name}: accept: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(addr: std::net::SocketAddr, req: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(req).unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        out
    }

    #[test]
    fn answers_with_name_and_local_address_and_refuses_garbage() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || serve(l, "pod7"));
        let ok = ask(addr, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(ok.starts_with("HTTP/1.0 200 OK\r\n"), "{ok}");
        assert!(ok.ends_with(&format!("\r\n\r\npod7 {addr}\n")), "{ok}");
        let bad = ask(addr, b"hello\r\n\r\n");
        assert!(bad.starts_with("HTTP/1.0 400"), "{bad}");
        let t = std::time::Instant::now();
        let slow = ask(addr, b"GET /slow HTTP/1.0\r\n\r\n");
        assert!(t.elapsed() >= SLOW_EVERY * (SLOW_LINES as u32 - 1));
        let body = slow.split("\r\n\r\n").nth(1).unwrap();
        assert_eq!(body.lines().count(), SLOW_LINES);
        assert_eq!(
            body.lines().last(),
            Some(format!("pod7 {:04}", SLOW_LINES - 1).as_str())
        );
    }

    #[test]
    fn read_head_limits() {
        let mut huge = b"GET / HTTP/1.1\r\n".to_vec();
        huge.extend(std::iter::repeat_n(b'a', MAX_HEAD + 10));
        huge.extend(b"\r\n\r\n");
        assert_eq!(read_head(&mut std::io::Cursor::new(huge)), Err(431));
        assert_eq!(
            read_head(&mut std::io::Cursor::new(b"GET / HTTP/1.0\r\n")),
            Err(400)
        );
        assert_eq!(
            read_head(&mut std::io::Cursor::new(b"GET /x HTTP/1.0\r\n\r\n")),
            Ok("/x".to_string())
        );
        assert!(response(Err(431), "x").starts_with("HTTP/1.0 431"));
    }
}
