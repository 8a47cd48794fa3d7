//! The client side of the test pods' line protocol: the netns traffic tests (xdp,
//! ipvs) run pods that answer each line with their name.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

/// A connection to a pod behind `to`, read by lines: 3 s to connect, 3 s to
/// wait for each answer.
pub fn connect(to: SocketAddr) -> std::io::Result<BufReader<TcpStream>> {
    let s = TcpStream::connect_timeout(&to, Duration::from_secs(3))?;
    s.set_read_timeout(Some(Duration::from_secs(3)))?;
    Ok(BufReader::new(s))
}

/// Sends one line and reads the answer (the pod's name).
pub fn ask(c: &mut BufReader<TcpStream>) -> std::io::Result<String> {
    c.get_mut().write_all(b"hello\n")?;
    let mut s = String::new();
    c.read_line(&mut s)?;
    if s.is_empty() {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(s.trim().to_string())
}
