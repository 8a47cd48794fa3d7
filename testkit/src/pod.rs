//! The client side of the test pods' line protocol: the netns traffic tests (xdp,
//! ipvs) run pods that answer each line with their name.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;

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
