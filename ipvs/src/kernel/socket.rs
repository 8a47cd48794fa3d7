//! A request/answer netlink socket (netlink-sys), for one protocol: generic
//! netlink or rtnetlink. The bytes are the codec's; this only sends, waits and
//! collects the answers to one sequence number.

use std::io;
use std::time::Duration;

use netlink_sys::Socket;

use crate::Error;
use crate::codec::{Answer, RawMsg, split};

/// How long one request waits for the kernel's answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// One datagram of a dump (the kernel fills at most 32 KiB).
const RECV_BUF: usize = 128 << 10;

pub(crate) struct Conn {
    sock: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl Conn {
    pub(super) fn open(protocol: isize, op: &'static str) -> Result<Self, Error> {
        let io = |source| Error::Io { op, source };
        let mut sock = Socket::new(protocol).map_err(io)?;
        sock.bind_auto().map_err(io)?;
        socket2::SockRef::from(&sock)
            .set_read_timeout(Some(REQUEST_TIMEOUT))
            .map_err(io)?;
        Ok(Conn {
            sock,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF),
        })
    }

    pub(super) fn next_seq(&mut self) -> u32 {
        self.seq = self.seq.wrapping_add(1);
        self.seq
    }

    /// Sends `req` (built with `seq`) and collects the messages that answer
    /// it, up to its ACK or NLMSG_DONE. A NACK is `Error::Kernel` with an
    /// empty target (the caller names it). Answers to older requests (one
    /// that timed out) are skipped.
    pub(super) fn transact(
        &mut self,
        op: &'static str,
        req: &[u8],
        seq: u32,
    ) -> Result<Vec<RawMsg>, Error> {
        self.sock
            .send(req, 0)
            .map_err(|source| Error::Io { op, source })?;
        let mut got = Vec::new();
        loop {
            self.buf.clear();
            match self.sock.recv(&mut self.buf, 0) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                    ) =>
                {
                    return Err(Error::Timeout { op });
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(source) => return Err(Error::Io { op, source }),
            }
            let msgs = split(&self.buf).map_err(|source| Error::Decode { op, source })?;
            for m in msgs.into_iter().filter(|m| m.seq == seq) {
                match m.answer().map_err(|source| Error::Decode { op, source })? {
                    Answer::Ack | Answer::Done => return Ok(got),
                    Answer::Error(errno) => {
                        return Err(Error::Kernel {
                            op,
                            target: String::new(),
                            errno,
                        });
                    }
                    Answer::Msg(m) => got.push(m),
                }
            }
        }
    }
}
