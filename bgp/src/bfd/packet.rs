//! The BFD Control packet (RFC 5880 §4.1), without authentication:
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! |Vers |  Diag   |Sta|P|F|C|A|D|M|  Detect Mult  |    Length     |
//! |                       My Discriminator                        |
//! |                      Your Discriminator                       |
//! |                    Desired Min TX Interval                    |
//! |                   Required Min RX Interval                    |
//! |                 Required Min Echo RX Interval                 |
//! ```
//!
//! Intervals are in microseconds on the wire. [`Control::encode`] cannot fail;
//! [`decode`] applies every check of §6.8.6 that needs no session state and says
//! which one failed.

use std::time::Duration;

/// Length of a Control packet without authentication.
pub const LEN: usize = 24;

/// Session state (the `Sta` field).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    AdminDown = 0,
    Down = 1,
    Init = 2,
    Up = 3,
}

impl State {
    fn from_bits(b: u8) -> State {
        match b & 3 {
            0 => State::AdminDown,
            1 => State::Down,
            2 => State::Init,
            _ => State::Up,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            State::AdminDown => "AdminDown",
            State::Down => "Down",
            State::Init => "Init",
            State::Up => "Up",
        }
    }
}

/// Diagnostic codes (RFC 5880 §4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Diag {
    None,
    DetectionTimeExpired,
    EchoFailed,
    NeighborDown,
    ForwardingPlaneReset,
    PathDown,
    ConcatenatedPathDown,
    AdminDown,
    ReverseConcatenatedPathDown,
    /// A value RFC 5880 does not define (kept, not an error).
    Other(u8),
}

impl Diag {
    pub fn code(self) -> u8 {
        match self {
            Diag::None => 0,
            Diag::DetectionTimeExpired => 1,
            Diag::EchoFailed => 2,
            Diag::NeighborDown => 3,
            Diag::ForwardingPlaneReset => 4,
            Diag::PathDown => 5,
            Diag::ConcatenatedPathDown => 6,
            Diag::AdminDown => 7,
            Diag::ReverseConcatenatedPathDown => 8,
            Diag::Other(c) => c & 0x1f,
        }
    }
    pub fn from_code(c: u8) -> Diag {
        match c & 0x1f {
            0 => Diag::None,
            1 => Diag::DetectionTimeExpired,
            2 => Diag::EchoFailed,
            3 => Diag::NeighborDown,
            4 => Diag::ForwardingPlaneReset,
            5 => Diag::PathDown,
            6 => Diag::ConcatenatedPathDown,
            7 => Diag::AdminDown,
            8 => Diag::ReverseConcatenatedPathDown,
            o => Diag::Other(o),
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Diag::None => "no diagnostic",
            Diag::DetectionTimeExpired => "control detection time expired",
            Diag::EchoFailed => "echo function failed",
            Diag::NeighborDown => "neighbor signaled session down",
            Diag::ForwardingPlaneReset => "forwarding plane reset",
            Diag::PathDown => "path down",
            Diag::ConcatenatedPathDown => "concatenated path down",
            Diag::AdminDown => "administratively down",
            Diag::ReverseConcatenatedPathDown => "reverse concatenated path down",
            Diag::Other(_) => "unknown diagnostic",
        }
    }
}

/// One Control packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Control {
    pub diag: Diag,
    pub state: State,
    pub poll: bool,
    pub fin: bool,
    /// Control Plane Independent.
    pub cpi: bool,
    pub demand: bool,
    pub detect_mult: u8,
    pub my_disc: u32,
    pub your_disc: u32,
    pub desired_min_tx: Duration,
    pub required_min_rx: Duration,
    pub required_min_echo_rx: Duration,
}

/// Why a received packet was dropped (RFC 5880 §6.8.6, and RFC 5881 §5 for the TTL,
/// which the socket checks).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("packet of {0} bytes is shorter than 24")]
    Short(usize),
    #[error("version {0}, expected 1")]
    Version(u8),
    #[error("length field {field} does not fit a packet of {got} bytes")]
    Length { field: u8, got: usize },
    #[error("authentication present (A bit), none configured")]
    Auth,
    #[error("detect multiplier 0")]
    ZeroMultiplier,
    #[error("multipoint (M) bit set")]
    Multipoint,
    #[error("my discriminator 0")]
    ZeroMyDisc,
    #[error("your discriminator 0 in state {0}")]
    ZeroYourDisc(&'static str),
    #[error("received with TTL/hop limit {0}, expected 255")]
    Ttl(u8),
}

impl DecodeError {
    /// The `reason` label of `ringlb_bfd_packets_dropped_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            DecodeError::Short(_) => "short",
            DecodeError::Version(_) => "version",
            DecodeError::Length { .. } => "length",
            DecodeError::Auth => "auth",
            DecodeError::ZeroMultiplier => "zero_multiplier",
            DecodeError::Multipoint => "multipoint",
            DecodeError::ZeroMyDisc => "zero_my_discriminator",
            DecodeError::ZeroYourDisc(_) => "zero_your_discriminator",
            DecodeError::Ttl(_) => "ttl",
        }
    }
}

fn us(d: Duration) -> u32 {
    u32::try_from(d.as_micros()).unwrap_or(u32::MAX)
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Control {
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0] = (1 << 5) | self.diag.code();
        b[1] = (self.state as u8) << 6
            | u8::from(self.poll) << 5
            | u8::from(self.fin) << 4
            | u8::from(self.cpi) << 3
            | u8::from(self.demand) << 1;
        b[2] = self.detect_mult;
        b[3] = LEN as u8;
        b[4..8].copy_from_slice(&self.my_disc.to_be_bytes());
        b[8..12].copy_from_slice(&self.your_disc.to_be_bytes());
        b[12..16].copy_from_slice(&us(self.desired_min_tx).to_be_bytes());
        b[16..20].copy_from_slice(&us(self.required_min_rx).to_be_bytes());
        b[20..24].copy_from_slice(&us(self.required_min_echo_rx).to_be_bytes());
        b
    }
}

/// Decode and check one received packet. Bytes past the Length field are ignored
/// (RFC 5880 allows the UDP payload to be longer).
pub fn decode(b: &[u8]) -> Result<Control, DecodeError> {
    if b.len() < LEN {
        return Err(DecodeError::Short(b.len()));
    }
    let version = b[0] >> 5;
    if version != 1 {
        return Err(DecodeError::Version(version));
    }
    let auth = b[1] & 0x04 != 0;
    let field = b[3];
    let min = if auth { LEN + 2 } else { LEN };
    if usize::from(field) < min || usize::from(field) > b.len() {
        return Err(DecodeError::Length {
            field,
            got: b.len(),
        });
    }
    if auth {
        return Err(DecodeError::Auth);
    }
    if b[2] == 0 {
        return Err(DecodeError::ZeroMultiplier);
    }
    if b[1] & 0x01 != 0 {
        return Err(DecodeError::Multipoint);
    }
    let state = State::from_bits(b[1] >> 6);
    let my_disc = be32(b, 4);
    let your_disc = be32(b, 8);
    if my_disc == 0 {
        return Err(DecodeError::ZeroMyDisc);
    }
    if your_disc == 0 && !matches!(state, State::Down | State::AdminDown) {
        return Err(DecodeError::ZeroYourDisc(state.as_str()));
    }
    let micros = |at| Duration::from_micros(u64::from(be32(b, at)));
    Ok(Control {
        diag: Diag::from_code(b[0]),
        state,
        poll: b[1] & 0x20 != 0,
        fin: b[1] & 0x10 != 0,
        cpi: b[1] & 0x08 != 0,
        demand: b[1] & 0x02 != 0,
        detect_mult: b[2],
        my_disc,
        your_disc,
        desired_min_tx: micros(12),
        required_min_rx: micros(16),
        required_min_echo_rx: micros(20),
    })
}

#[cfg(test)]
#[path = "packet_tests.rs"]
mod tests;
