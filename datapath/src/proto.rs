//! The L4 protocol of a service port, as every datapath keys its services (the BPF
//! maps by number; `ringlb-bpf-types` re-exports it for the BPF ABI mirrors).

/// Transport protocol of a VIP or Service port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    Tcp,
    Udp,
}

impl Proto {
    /// The IP protocol number (the `proto` byte of a map key).
    pub const fn number(self) -> u8 {
        match self {
            Proto::Tcp => 6,
            Proto::Udp => 17,
        }
    }

    /// Inverse of [`Proto::number`]; `None` for any other protocol.
    pub const fn from_number(n: u8) -> Option<Self> {
        match n {
            6 => Some(Proto::Tcp),
            17 => Some(Proto::Udp),
            _ => None,
        }
    }
}

impl std::str::FromStr for Proto {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "tcp" | "6" => Ok(Proto::Tcp),
            "udp" | "17" => Ok(Proto::Udp),
            other => Err(format!("unknown protocol {other:?} (want tcp or udp)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_names_round_trip() {
        for p in [Proto::Tcp, Proto::Udp] {
            assert_eq!(Proto::from_number(p.number()), Some(p));
            assert_eq!(p.number().to_string().parse::<Proto>(), Ok(p));
        }
        assert_eq!("TCP".parse::<Proto>(), Ok(Proto::Tcp));
        assert_eq!(Proto::from_number(1), None);
        assert!("sctp".parse::<Proto>().is_err());
    }
}
