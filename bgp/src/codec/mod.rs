//! BGP-4 wire format: framing, OPEN, NOTIFICATION, KEEPALIVE, ROUTE-REFRESH (this file)
//! and UPDATE (`update.rs`).
//!
//! Encoding goes through the `bgp-rs` crate wherever it encodes correctly (OPEN with its
//! capabilities, NOTIFICATION, ROUTE-REFRESH, the message header, ORIGIN / NEXT_HOP /
//! MED / LOCAL_PREF / COMMUNITIES / MP_REACH_NLRI / MP_UNREACH_NLRI attributes). Our own
//! code fills the gaps it has: AS_PATH with 4-octet ASNs (bgp-rs picks 2 or 4 octets by
//! the ASN values, not by the negotiated capability), AS4_PATH for old peers, and
//! LARGE_COMMUNITY (bgp-rs panics with `unimplemented!` when asked to encode it).
//!
//! Decoding is our own code over a bounded byte slice. The bgp-rs decoder is not used on
//! the receive path because it can panic on malformed input (`unimplemented!()` for some
//! AFIs, integer underflow in PMSI_TUNNEL / ATTR_SET / MP_REACH lengths) and silently
//! skips attributes it cannot parse, which rules out the RFC 7606 error handling the
//! speaker must do. Every decode error carries the NOTIFICATION (RFC 4271 §6) to send.

mod update;

use std::fmt;
use std::net::Ipv4Addr;

pub use update::{DecodedUpdate, PathAttrs, Update, encode_updates, end_of_rib};

/// Message header length (marker 16 + length 2 + type 1).
pub const HEADER_LEN: usize = 19;
/// Largest BGP message (RFC 4271 §4.1; no extended messages).
pub const MAX_MESSAGE_LEN: usize = 4096;
/// AS_TRANS (RFC 6793): the 2-octet stand-in for a 4-octet ASN.
pub const AS_TRANS: u16 = 23456;

/// Message type codes (RFC 4271 §4.1, RFC 2918).
pub mod msg_type {
    pub const OPEN: u8 = 1;
    pub const UPDATE: u8 = 2;
    pub const NOTIFICATION: u8 = 3;
    pub const KEEPALIVE: u8 = 4;
    pub const ROUTE_REFRESH: u8 = 5;
}

/// Address family identifiers we speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Afi {
    Ipv4,
    Ipv6,
}

impl Afi {
    /// `IPv4` or `IPv6`, as messages and `BGPPeer` status name the family.
    pub fn name(self) -> &'static str {
        match self {
            Afi::Ipv4 => "IPv4",
            Afi::Ipv6 => "IPv6",
        }
    }

    pub fn code(self) -> u16 {
        match self {
            Afi::Ipv4 => 1,
            Afi::Ipv6 => 2,
        }
    }
    fn from_code(c: u16) -> Option<Afi> {
        match c {
            1 => Some(Afi::Ipv4),
            2 => Some(Afi::Ipv6),
            _ => None,
        }
    }
    fn to_bgp_rs(self) -> bgp_rs::AFI {
        match self {
            Afi::Ipv4 => bgp_rs::AFI::IPV4,
            Afi::Ipv6 => bgp_rs::AFI::IPV6,
        }
    }
}

/// SAFI unicast (the only one we announce).
pub const SAFI_UNICAST: u8 = 1;

/// An OPEN capability (RFC 5492).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Capability {
    /// Code 1, RFC 4760. `afi`/`safi` kept raw so unknown families round-trip.
    MultiProtocol { afi: u16, safi: u8 },
    /// Code 2, RFC 2918.
    RouteRefresh,
    /// Code 65, RFC 6793.
    FourOctetAsn(u32),
    /// Anything else: kept so it can be logged, otherwise ignored (RFC 5492 §3).
    Unknown { code: u8, value: Vec<u8> },
}

/// An OPEN message (RFC 4271 §4.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Open {
    pub version: u8,
    /// "My Autonomous System" field: AS_TRANS when the real ASN needs 4 octets.
    pub my_as: u16,
    pub hold_time: u16,
    pub bgp_id: Ipv4Addr,
    pub capabilities: Vec<Capability>,
}

impl Open {
    /// Our OPEN: version 4, 4-octet ASN, MP for each family, route refresh.
    pub fn new(asn: u32, hold_time: u16, bgp_id: Ipv4Addr, families: &[Afi]) -> Open {
        let mut capabilities: Vec<Capability> = families
            .iter()
            .map(|f| Capability::MultiProtocol {
                afi: f.code(),
                safi: SAFI_UNICAST,
            })
            .collect();
        capabilities.push(Capability::RouteRefresh);
        capabilities.push(Capability::FourOctetAsn(asn));
        Open {
            version: 4,
            my_as: u16::try_from(asn).unwrap_or(AS_TRANS),
            hold_time,
            bgp_id,
            capabilities,
        }
    }

    /// The sender's ASN: the 4-octet capability if present, else the 2-octet field.
    pub fn asn(&self) -> u32 {
        self.capabilities
            .iter()
            .find_map(|c| match c {
                Capability::FourOctetAsn(a) => Some(*a),
                _ => None,
            })
            .unwrap_or(u32::from(self.my_as))
    }

    pub fn four_octet_asn(&self) -> bool {
        self.capabilities
            .iter()
            .any(|c| matches!(c, Capability::FourOctetAsn(_)))
    }

    pub fn route_refresh(&self) -> bool {
        self.capabilities.contains(&Capability::RouteRefresh)
    }

    /// Families announced with the MP capability. A peer that sends no MP capability at
    /// all speaks IPv4 unicast only (RFC 4760 §8).
    pub fn families(&self) -> Vec<Afi> {
        let mp: Vec<Afi> = self
            .capabilities
            .iter()
            .filter_map(|c| match c {
                Capability::MultiProtocol { afi, safi } if *safi == SAFI_UNICAST => {
                    Afi::from_code(*afi)
                }
                _ => None,
            })
            .collect();
        let any_mp = self
            .capabilities
            .iter()
            .any(|c| matches!(c, Capability::MultiProtocol { .. }));
        if any_mp { mp } else { vec![Afi::Ipv4] }
    }
}

/// A NOTIFICATION message (RFC 4271 §4.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    pub code: u8,
    pub subcode: u8,
    pub data: Vec<u8>,
}

/// NOTIFICATION codes (RFC 4271 §4.5, RFC 4486 Cease subcodes).
pub mod notif {
    pub const HEADER: u8 = 1;
    pub const OPEN: u8 = 2;
    pub const UPDATE: u8 = 3;
    pub const HOLD_TIMER_EXPIRED: u8 = 4;
    pub const FSM: u8 = 5;
    pub const CEASE: u8 = 6;
    // Header subcodes
    pub const CONNECTION_NOT_SYNCHRONIZED: u8 = 1;
    pub const BAD_MESSAGE_LENGTH: u8 = 2;
    pub const BAD_MESSAGE_TYPE: u8 = 3;
    // OPEN subcodes
    pub const UNSUPPORTED_VERSION: u8 = 1;
    pub const BAD_PEER_AS: u8 = 2;
    pub const BAD_BGP_ID: u8 = 3;
    pub const UNSUPPORTED_OPT_PARAM: u8 = 4;
    pub const UNACCEPTABLE_HOLD_TIME: u8 = 6;
    // UPDATE subcodes
    pub const MALFORMED_ATTR_LIST: u8 = 1;
    pub const UNRECOGNIZED_WELL_KNOWN: u8 = 2;
    pub const ATTR_FLAGS_ERROR: u8 = 4;
    pub const ATTR_LENGTH_ERROR: u8 = 5;
    pub const OPTIONAL_ATTR_ERROR: u8 = 9;
    pub const INVALID_NETWORK_FIELD: u8 = 10;
    // Cease subcodes (RFC 4486)
    pub const ADMIN_SHUTDOWN: u8 = 2;
    pub const PEER_DECONFIGURED: u8 = 3;
    pub const ADMIN_RESET: u8 = 4;
    pub const CONNECTION_REJECTED: u8 = 5;
    pub const CONNECTION_COLLISION: u8 = 7;
}

impl Notification {
    pub fn new(code: u8, subcode: u8) -> Notification {
        Notification {
            code,
            subcode,
            data: Vec::new(),
        }
    }
    pub fn with_data(code: u8, subcode: u8, data: Vec<u8>) -> Notification {
        Notification {
            code,
            subcode,
            data,
        }
    }
}

impl fmt::Display for Notification {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let major = match self.code {
            notif::HEADER => "Message Header Error",
            notif::OPEN => "OPEN Message Error",
            notif::UPDATE => "UPDATE Message Error",
            notif::HOLD_TIMER_EXPIRED => "Hold Timer Expired",
            notif::FSM => "Finite State Machine Error",
            notif::CEASE => "Cease",
            _ => "Unknown",
        };
        write!(f, "{major} ({}/{})", self.code, self.subcode)?;
        // RFC 8203 shutdown communication: length-prefixed UTF-8 after Cease 2/4.
        if self.code == notif::CEASE
            && let Some((&len, rest)) = self.data.split_first()
            && usize::from(len) == rest.len()
            && let Ok(s) = std::str::from_utf8(rest)
        {
            write!(f, ": {s}")?;
        }
        Ok(())
    }
}

/// A whole BGP message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    Open(Open),
    Update(Update),
    Notification(Notification),
    Keepalive,
    /// ROUTE-REFRESH (RFC 2918): raw AFI and SAFI.
    RouteRefresh {
        afi: u16,
        safi: u8,
    },
}

/// A received message could not be decoded. Each variant maps to the NOTIFICATION to
/// send (RFC 4271 §6.1-6.3) through [`CodecError::notification`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("message header error subcode {subcode}: {reason}")]
    Header {
        subcode: u8,
        data: Vec<u8>,
        reason: &'static str,
    },
    #[error("OPEN message error subcode {subcode}: {reason}")]
    Open {
        subcode: u8,
        data: Vec<u8>,
        reason: &'static str,
    },
    #[error("UPDATE message error subcode {subcode}: {reason}")]
    Update {
        subcode: u8,
        data: Vec<u8>,
        reason: &'static str,
    },
    #[error("cannot encode: {0}")]
    Encode(String),
}

impl CodecError {
    /// The NOTIFICATION that tells the peer what was wrong.
    pub fn notification(&self) -> Notification {
        match self {
            CodecError::Header { subcode, data, .. } => {
                Notification::with_data(notif::HEADER, *subcode, data.clone())
            }
            CodecError::Open { subcode, data, .. } => {
                Notification::with_data(notif::OPEN, *subcode, data.clone())
            }
            CodecError::Update { subcode, data, .. } => {
                Notification::with_data(notif::UPDATE, *subcode, data.clone())
            }
            CodecError::Encode(_) => Notification::new(notif::CEASE, 0),
        }
    }

    pub fn metric_label(&self) -> &'static str {
        match self {
            CodecError::Header { .. } => "header_error",
            CodecError::Open { .. } => "open_error",
            CodecError::Update { .. } => "update_error",
            CodecError::Encode(_) => "encode_error",
        }
    }

    fn header(subcode: u8, data: Vec<u8>, reason: &'static str) -> CodecError {
        CodecError::Header {
            subcode,
            data,
            reason,
        }
    }
    fn open(subcode: u8, reason: &'static str) -> CodecError {
        CodecError::Open {
            subcode,
            data: Vec::new(),
            reason,
        }
    }
}

fn io_err(e: std::io::Error) -> CodecError {
    CodecError::Encode(e.to_string())
}

/// Frame a body with the 19-byte header (via bgp-rs).
fn frame(msg_type: u8, body: &[u8]) -> Result<Vec<u8>, CodecError> {
    let len = HEADER_LEN + body.len();
    if len > MAX_MESSAGE_LEN {
        return Err(CodecError::Encode(format!(
            "message of {len} bytes exceeds {MAX_MESSAGE_LEN}"
        )));
    }
    let mut out = Vec::with_capacity(len);
    bgp_rs::Header {
        marker: [0xff; 16],
        length: len as u16,
        record_type: msg_type,
    }
    .encode(&mut out)
    .map_err(io_err)?;
    out.extend_from_slice(body);
    Ok(out)
}

fn capability_to_bgp_rs(c: &Capability) -> Result<bgp_rs::OpenCapability, CodecError> {
    Ok(match c {
        Capability::MultiProtocol { afi, safi } => {
            let afi = bgp_rs::AFI::try_from(*afi).map_err(io_err)?;
            let safi = bgp_rs::SAFI::try_from(*safi).map_err(io_err)?;
            bgp_rs::OpenCapability::MultiProtocol((afi, safi))
        }
        Capability::RouteRefresh => bgp_rs::OpenCapability::RouteRefresh,
        Capability::FourOctetAsn(a) => bgp_rs::OpenCapability::FourByteASN(*a),
        Capability::Unknown { code, value } => bgp_rs::OpenCapability::Unknown {
            cap_code: *code,
            cap_length: u8::try_from(value.len())
                .map_err(|_| CodecError::Encode("capability longer than 255".into()))?,
            value: value.clone(),
        },
    })
}

impl Message {
    /// Encode one message, header included.
    pub fn encode(&self) -> Result<Vec<u8>, CodecError> {
        let mut body = Vec::new();
        let t = match self {
            Message::Open(o) => {
                let caps = o
                    .capabilities
                    .iter()
                    .map(capability_to_bgp_rs)
                    .collect::<Result<Vec<_>, _>>()?;
                bgp_rs::Open {
                    version: o.version,
                    peer_asn: o.my_as,
                    hold_timer: o.hold_time,
                    identifier: u32::from(o.bgp_id),
                    parameters: vec![bgp_rs::OpenParameter::Capabilities(caps)],
                }
                .encode(&mut body)
                .map_err(io_err)?;
                msg_type::OPEN
            }
            Message::Update(u) => {
                // A single-message encode; the session uses `encode_updates` to pack.
                let mut msgs = encode_updates(
                    &u.withdrawn,
                    u.attrs.as_ref().map(|a| (a, u.nlri.as_slice())),
                    true,
                )?;
                return match msgs.len() {
                    1 => Ok(msgs.remove(0)),
                    n => Err(CodecError::Encode(format!(
                        "UPDATE needs {n} messages; use encode_updates"
                    ))),
                };
            }
            Message::Notification(n) => {
                bgp_rs::Notification {
                    major_err_code: n.code,
                    minor_err_code: n.subcode,
                    data: n.data.clone(),
                }
                .encode(&mut body)
                .map_err(io_err)?;
                msg_type::NOTIFICATION
            }
            Message::Keepalive => msg_type::KEEPALIVE,
            Message::RouteRefresh { afi, safi } => {
                body.extend_from_slice(&afi.to_be_bytes());
                body.push(0);
                body.push(*safi);
                msg_type::ROUTE_REFRESH
            }
        };
        frame(t, &body)
    }
}

/// Check a received header (RFC 4271 §6.1). Returns (total length, type).
pub fn check_header(h: &[u8; HEADER_LEN]) -> Result<(usize, u8), CodecError> {
    if h[..16].iter().any(|&b| b != 0xff) {
        return Err(CodecError::header(
            notif::CONNECTION_NOT_SYNCHRONIZED,
            Vec::new(),
            "marker is not all ones",
        ));
    }
    let len = usize::from(u16::from_be_bytes([h[16], h[17]]));
    let t = h[18];
    let bad_len = || {
        CodecError::header(
            notif::BAD_MESSAGE_LENGTH,
            h[16..18].to_vec(),
            "length out of range for the message type",
        )
    };
    if !(HEADER_LEN..=MAX_MESSAGE_LEN).contains(&len) {
        return Err(bad_len());
    }
    let ok = match t {
        msg_type::OPEN => len >= 29,
        msg_type::UPDATE => len >= 23,
        msg_type::NOTIFICATION => len >= 21,
        msg_type::KEEPALIVE => len == 19,
        msg_type::ROUTE_REFRESH => len == 23,
        _ => {
            return Err(CodecError::header(
                notif::BAD_MESSAGE_TYPE,
                vec![t],
                "unknown message type",
            ));
        }
    };
    if !ok {
        return Err(bad_len());
    }
    Ok((len, t))
}

/// Decode one whole message (header included). `four_octet` says whether AS_PATH in
/// UPDATEs carries 4-octet ASNs (both sides sent the capability). UPDATE errors that
/// RFC 7606 handles with treat-as-withdraw come back inside `DecodedUpdate`.
pub fn decode(buf: &[u8], four_octet: bool) -> Result<Decoded, CodecError> {
    let head: &[u8; HEADER_LEN] = buf
        .get(..HEADER_LEN)
        .and_then(|s| s.try_into().ok())
        .ok_or_else(|| CodecError::header(notif::BAD_MESSAGE_LENGTH, Vec::new(), "short header"))?;
    let (len, t) = check_header(head)?;
    if buf.len() != len {
        return Err(CodecError::header(
            notif::BAD_MESSAGE_LENGTH,
            head[16..18].to_vec(),
            "buffer length differs from header length",
        ));
    }
    let body = &buf[HEADER_LEN..];
    Ok(match t {
        msg_type::OPEN => Decoded::Message(Message::Open(decode_open(body)?)),
        msg_type::UPDATE => Decoded::Update(update::decode_update(body, four_octet)?),
        msg_type::NOTIFICATION => Decoded::Message(Message::Notification(Notification {
            code: body[0],
            subcode: body[1],
            data: body[2..].to_vec(),
        })),
        msg_type::KEEPALIVE => Decoded::Message(Message::Keepalive),
        _ => Decoded::Message(Message::RouteRefresh {
            afi: u16::from_be_bytes([body[0], body[1]]),
            safi: body[3],
        }),
    })
}

/// Result of [`decode`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    Message(Message),
    Update(DecodedUpdate),
}

fn decode_open(body: &[u8]) -> Result<Open, CodecError> {
    // body >= 10 guaranteed by check_header (29 - 19).
    let version = body[0];
    if version != 4 {
        return Err(CodecError::Open {
            subcode: notif::UNSUPPORTED_VERSION,
            data: vec![0, 4],
            reason: "only BGP version 4 is supported",
        });
    }
    let my_as = u16::from_be_bytes([body[1], body[2]]);
    let hold_time = u16::from_be_bytes([body[3], body[4]]);
    let bgp_id = Ipv4Addr::new(body[5], body[6], body[7], body[8]);
    let opt_len = usize::from(body[9]);
    let params = &body[10..];
    if params.len() != opt_len {
        return Err(CodecError::header(
            notif::BAD_MESSAGE_LENGTH,
            Vec::new(),
            "OPEN optional parameters length does not match the message",
        ));
    }
    if hold_time == 1 || hold_time == 2 {
        return Err(CodecError::open(
            notif::UNACCEPTABLE_HOLD_TIME,
            "hold time 1 or 2 seconds",
        ));
    }
    if bgp_id.is_unspecified() {
        return Err(CodecError::open(
            notif::BAD_BGP_ID,
            "BGP identifier 0.0.0.0",
        ));
    }
    let mut capabilities = Vec::new();
    let mut p = params;
    while !p.is_empty() {
        let [ptype, plen, rest @ ..] = p else {
            return Err(CodecError::open(0, "truncated optional parameter"));
        };
        let plen = usize::from(*plen);
        let Some(value) = rest.get(..plen) else {
            return Err(CodecError::open(0, "optional parameter overruns OPEN"));
        };
        if *ptype != 2 {
            return Err(CodecError::open(
                notif::UNSUPPORTED_OPT_PARAM,
                "optional parameter other than capabilities",
            ));
        }
        let mut c = value;
        while !c.is_empty() {
            let [code, clen, crest @ ..] = c else {
                return Err(CodecError::open(0, "truncated capability"));
            };
            let clen = usize::from(*clen);
            let Some(v) = crest.get(..clen) else {
                return Err(CodecError::open(0, "capability overruns its parameter"));
            };
            capabilities.push(match (*code, clen) {
                (1, 4) => Capability::MultiProtocol {
                    afi: u16::from_be_bytes([v[0], v[1]]),
                    safi: v[3],
                },
                (2, 0) => Capability::RouteRefresh,
                (65, 4) => Capability::FourOctetAsn(u32::from_be_bytes([v[0], v[1], v[2], v[3]])),
                (1 | 2 | 65, _) => {
                    return Err(CodecError::open(0, "capability with a wrong length"));
                }
                (code, _) => Capability::Unknown {
                    code,
                    value: v.to_vec(),
                },
            });
            c = &crest[clen..];
        }
        p = &rest[plen..];
    }
    Ok(Open {
        version,
        my_as,
        hold_time,
        bgp_id,
        capabilities,
    })
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod fuzz;
