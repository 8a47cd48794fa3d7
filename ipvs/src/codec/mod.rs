//! The netlink wire format ringlb speaks to IPVS, pure (no sockets): generic
//! netlink messages of the `IPVS` family (`ipvs`), the controller request that
//! resolves the family's id (`ctrl`), and the rtnetlink address messages that
//! bind VIPs on `lo` (`addr`). Encoding cannot fail; decoding returns a typed
//! [`DecodeError`].
//!
//! Layout (linux/netlink.h, all integers in host order unless the uapi says
//! `__be`):
//!
//! ```text
//!  nlmsghdr   len:u32 type:u16 flags:u16 seq:u32 pid:u32      16 bytes
//!  genlmsghdr cmd:u8 version:u8 reserved:u16                   4 bytes
//!  nlattr*    len:u16 type:u16 payload, padded to 4            len excludes the pad
//! ```
//!
//! Why our own codec: no maintained crate fits. `ipvs` (0.1.1, 2017) is a name
//! reservation; `netlink-packet-ipvs` (0.0.1, one 2024 release) is built on
//! netlink-packet-core 0.7 and netlink-packet-utils, while the workspace is on
//! netlink-packet-core 0.9; `nlrs` brings its own socket layer. What IPVS needs
//! is a few dozen attributes, checked here against byte fixtures both ways.

pub mod addr;
pub mod consts;
pub mod ctrl;
pub mod ipvs;

#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod tests;

use consts::*;

/// Why bytes are not a message we understand.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("{what}: {len} bytes, need {need}")]
    Short {
        what: &'static str,
        len: usize,
        need: usize,
    },
    #[error("{what}: length field {len} does not fit the {room} bytes left")]
    BadLength {
        what: &'static str,
        len: usize,
        room: usize,
    },
    #[error("attribute {attr} of {within}: {len} bytes, want {want}")]
    AttrSize {
        within: &'static str,
        attr: u16,
        len: usize,
        want: &'static str,
    },
    #[error("{within}: attribute {attr} missing")]
    Missing { within: &'static str, attr: u16 },
    #[error("{what}: unexpected value {value}")]
    Value { what: &'static str, value: u64 },
    #[error("{what}: not a NUL-terminated UTF-8 string")]
    String { what: &'static str },
}

/// One netlink message of a datagram: its header fields and payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawMsg {
    pub ty: u16,
    pub flags: u16,
    pub seq: u32,
    pub payload: Vec<u8>,
}

/// What a request's answer holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    /// `NLMSG_ERROR` with 0: the request is done.
    Ack,
    /// `NLMSG_ERROR` with a negative errno.
    Error(i32),
    /// `NLMSG_DONE`: the dump is complete.
    Done,
    /// Any other message (a dump's part, a GETFAMILY reply).
    Msg(RawMsg),
}

/// Splits a datagram into its netlink messages.
pub fn split(buf: &[u8]) -> Result<Vec<RawMsg>, DecodeError> {
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        if rest.len() < NLMSG_HDRLEN {
            return Err(DecodeError::Short {
                what: "nlmsghdr",
                len: rest.len(),
                need: NLMSG_HDRLEN,
            });
        }
        let len = u32_at(rest, 0) as usize;
        if len < NLMSG_HDRLEN || len > rest.len() {
            return Err(DecodeError::BadLength {
                what: "nlmsghdr",
                len,
                room: rest.len(),
            });
        }
        out.push(RawMsg {
            ty: u16_at(rest, 4),
            flags: u16_at(rest, 6),
            seq: u32_at(rest, 8),
            payload: rest[NLMSG_HDRLEN..len].to_vec(),
        });
        rest = rest.get(align(len)..).unwrap_or(&[]);
    }
    Ok(out)
}

impl RawMsg {
    /// Classifies the message (`NLMSG_ERROR` into ack or errno, `NLMSG_DONE`).
    pub fn answer(self) -> Result<Answer, DecodeError> {
        match self.ty {
            NLMSG_ERROR => {
                let need = 4;
                if self.payload.len() < need {
                    return Err(DecodeError::Short {
                        what: "nlmsgerr",
                        len: self.payload.len(),
                        need,
                    });
                }
                let errno = i32::from_ne_bytes(self.payload[..4].try_into().expect("4 bytes"));
                Ok(if errno == 0 {
                    Answer::Ack
                } else {
                    Answer::Error(errno)
                })
            }
            NLMSG_DONE => Ok(Answer::Done),
            _ => Ok(Answer::Msg(self)),
        }
    }
}

pub(crate) const fn align(n: usize) -> usize {
    (n + 3) & !3
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Builds one netlink message: the header is filled in by [`Writer::finish`].
pub(crate) struct Writer {
    buf: Vec<u8>,
    nests: Vec<usize>,
}

impl Writer {
    pub(crate) fn new(ty: u16, flags: u16, seq: u32) -> Self {
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&0u32.to_ne_bytes());
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(&flags.to_ne_bytes());
        buf.extend_from_slice(&seq.to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // pid: the kernel fills it in
        Writer {
            buf,
            nests: Vec::new(),
        }
    }

    /// Raw bytes after the header (genlmsghdr, ifaddrmsg).
    pub(crate) fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }

    pub(crate) fn attr(&mut self, ty: u16, payload: &[u8]) -> &mut Self {
        let len = (NLA_HDRLEN + payload.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(payload);
        self.pad();
        self
    }

    pub(crate) fn u16(&mut self, ty: u16, v: u16) -> &mut Self {
        self.attr(ty, &v.to_ne_bytes())
    }
    pub(crate) fn be16(&mut self, ty: u16, v: u16) -> &mut Self {
        self.attr(ty, &v.to_be_bytes())
    }
    pub(crate) fn u32(&mut self, ty: u16, v: u32) -> &mut Self {
        self.attr(ty, &v.to_ne_bytes())
    }
    pub(crate) fn u64(&mut self, ty: u16, v: u64) -> &mut Self {
        self.attr(ty, &v.to_ne_bytes())
    }
    /// A NUL-terminated string.
    pub(crate) fn string(&mut self, ty: u16, s: &str) -> &mut Self {
        let mut b = s.as_bytes().to_vec();
        b.push(0);
        self.attr(ty, &b)
    }

    /// Opens a nested attribute (no `NLA_F_NESTED`, as libnl and ipvsadm send).
    pub(crate) fn nest(&mut self, ty: u16) -> &mut Self {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&0u16.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self
    }

    pub(crate) fn end_nest(&mut self) -> &mut Self {
        let at = self.nests.pop().expect("end_nest after nest");
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
        self
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    pub(crate) fn finish(&mut self) -> Vec<u8> {
        debug_assert!(self.nests.is_empty(), "unclosed nest");
        let len = self.buf.len() as u32;
        self.buf[..4].copy_from_slice(&len.to_ne_bytes());
        std::mem::take(&mut self.buf)
    }
}

/// One attribute: its type (flag bits removed) and payload.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Attr<'a> {
    pub ty: u16,
    pub payload: &'a [u8],
}

/// The attributes of `buf`, in order. A truncated trailing attribute is an error.
pub(crate) fn attrs<'a>(buf: &'a [u8], within: &'static str) -> Result<Vec<Attr<'a>>, DecodeError> {
    let mut out = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        if rest.len() < NLA_HDRLEN {
            return Err(DecodeError::Short {
                what: within,
                len: rest.len(),
                need: NLA_HDRLEN,
            });
        }
        let len = u16_at(rest, 0) as usize;
        if len < NLA_HDRLEN || len > rest.len() {
            return Err(DecodeError::BadLength {
                what: within,
                len,
                room: rest.len(),
            });
        }
        out.push(Attr {
            ty: u16_at(rest, 2) & NLA_TYPE_MASK,
            payload: &rest[NLA_HDRLEN..len],
        });
        rest = rest.get(align(len)..).unwrap_or(&[]);
    }
    Ok(out)
}

impl<'a> Attr<'a> {
    fn fixed<const N: usize>(
        &self,
        within: &'static str,
        want: &'static str,
    ) -> Result<[u8; N], DecodeError> {
        self.payload.try_into().map_err(|_| DecodeError::AttrSize {
            within,
            attr: self.ty,
            len: self.payload.len(),
            want,
        })
    }
    pub(crate) fn u8(&self, within: &'static str) -> Result<u8, DecodeError> {
        Ok(self.fixed::<1>(within, "1 (u8)")?[0])
    }
    pub(crate) fn u16(&self, within: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_ne_bytes(self.fixed(within, "2 (u16)")?))
    }
    pub(crate) fn be16(&self, within: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_be_bytes(self.fixed(within, "2 (be16)")?))
    }
    pub(crate) fn u32(&self, within: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_ne_bytes(self.fixed(within, "4 (u32)")?))
    }
    pub(crate) fn u64(&self, within: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_ne_bytes(self.fixed(within, "8 (u64)")?))
    }
    /// A NUL-terminated string (bytes after the first NUL are padding).
    pub(crate) fn string(&self, what: &'static str) -> Result<String, DecodeError> {
        let end = self
            .payload
            .iter()
            .position(|&b| b == 0)
            .ok_or(DecodeError::String { what })?;
        String::from_utf8(self.payload[..end].to_vec()).map_err(|_| DecodeError::String { what })
    }
}

/// The 4-byte genlmsghdr and the attributes after it.
pub(crate) fn genl_body(payload: &[u8]) -> Result<(u8, &[u8]), DecodeError> {
    if payload.len() < GENL_HDRLEN {
        return Err(DecodeError::Short {
            what: "genlmsghdr",
            len: payload.len(),
            need: GENL_HDRLEN,
        });
    }
    Ok((payload[0], &payload[GENL_HDRLEN..]))
}
