//! UPDATE messages (RFC 4271 §4.3, RFC 4760 MP_REACH/MP_UNREACH, RFC 1997 communities,
//! RFC 8092 large communities) and the RFC 7606 revised error handling on receipt.

use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnetwork::IpNetwork;

use super::{AS_TRANS, Afi, CodecError, HEADER_LEN, MAX_MESSAGE_LEN, SAFI_UNICAST, frame, io_err};
use super::{msg_type, notif};

/// Path attribute type codes.
mod code {
    pub(super) const ORIGIN: u8 = 1;
    pub(super) const AS_PATH: u8 = 2;
    pub(super) const NEXT_HOP: u8 = 3;
    pub(super) const MED: u8 = 4;
    pub(super) const LOCAL_PREF: u8 = 5;
    pub(super) const ATOMIC_AGGREGATE: u8 = 6;
    pub(super) const AGGREGATOR: u8 = 7;
    pub(super) const COMMUNITIES: u8 = 8;
    pub(super) const MP_REACH: u8 = 14;
    pub(super) const MP_UNREACH: u8 = 15;
    pub(super) const AS4_PATH: u8 = 17;
    pub(super) const LARGE_COMMUNITY: u8 = 32;
}

/// Attribute codes this decoder knows (anything else that is not optional is an error).
const KNOWN: [u8; 13] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 14, 15, 32];

const FLAG_OPTIONAL: u8 = 0x80;
const FLAG_TRANSITIVE: u8 = 0x40;
const FLAG_EXTENDED: u8 = 0x10;

/// The attributes of one group of announced prefixes.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct PathAttrs {
    /// 0 IGP, 1 EGP, 2 INCOMPLETE.
    pub origin: u8,
    /// One AS_SEQUENCE (empty for iBGP-originated routes).
    pub as_path: Vec<u32>,
    /// NEXT_HOP for IPv4 NLRI, the MP_REACH next hop for IPv6 NLRI.
    pub next_hop: Option<IpAddr>,
    pub med: Option<u32>,
    pub local_pref: Option<u32>,
    /// RFC 1997 communities, `asn << 16 | value`.
    pub communities: Vec<u32>,
    /// RFC 8092 (global administrator, local data 1, local data 2).
    pub large_communities: Vec<[u32; 3]>,
}

/// One UPDATE: withdrawals of either family, and announcements of one family sharing
/// `attrs` (IPv4 in the NLRI field, IPv6 in MP_REACH_NLRI).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Update {
    pub withdrawn: Vec<IpNetwork>,
    pub attrs: Option<PathAttrs>,
    pub nlri: Vec<IpNetwork>,
}

/// A received UPDATE after RFC 7606 handling.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DecodedUpdate {
    pub update: Update,
    /// Set when "treat-as-withdraw" applied: the announced prefixes were moved into
    /// `update.withdrawn` and `attrs` cleared.
    pub treat_as_withdraw: Option<&'static str>,
    /// Codes of attributes dropped by "attribute discard" or as duplicates.
    pub discarded: Vec<u8>,
}

fn prefix_bytes(p: &IpNetwork) -> usize {
    1 + usize::from(p.prefix()).div_ceil(8)
}

fn push_prefix(out: &mut Vec<u8>, p: &IpNetwork) {
    let n = usize::from(p.prefix()).div_ceil(8);
    out.push(p.prefix());
    match p.network() {
        IpAddr::V4(a) => out.extend_from_slice(&a.octets()[..n]),
        IpAddr::V6(a) => out.extend_from_slice(&a.octets()[..n]),
    }
}

fn to_bgp_rs_nlri(p: &IpNetwork) -> bgp_rs::NLRIEncoding {
    bgp_rs::NLRIEncoding::IP(bgp_rs::Prefix::from((p.network(), p.prefix())))
}

fn attr_header(out: &mut Vec<u8>, flags: u8, code: u8, len: usize) {
    if len > 255 {
        out.extend_from_slice(&[flags | FLAG_EXTENDED, code]);
        out.extend_from_slice(&(len as u16).to_be_bytes());
    } else {
        out.extend_from_slice(&[flags, code, len as u8]);
    }
}

fn encode_as_path(out: &mut Vec<u8>, code: u8, path: &[u32], four_octet: bool) {
    let mut v = Vec::new();
    for chunk in path.chunks(255) {
        v.push(2); // AS_SEQUENCE
        v.push(chunk.len() as u8);
        for &asn in chunk {
            if four_octet {
                v.extend_from_slice(&asn.to_be_bytes());
            } else {
                let a = u16::try_from(asn).unwrap_or(AS_TRANS);
                v.extend_from_slice(&a.to_be_bytes());
            }
        }
    }
    let flags = if code == code::AS_PATH {
        FLAG_TRANSITIVE
    } else {
        FLAG_OPTIONAL | FLAG_TRANSITIVE
    };
    attr_header(out, flags, code, v.len());
    out.extend_from_slice(&v);
}

/// Encode every attribute except MP_REACH_NLRI, in type-code order.
fn encode_attrs(a: &PathAttrs, v4: bool, four_octet: bool) -> Result<Vec<u8>, CodecError> {
    use bgp_rs::PathAttribute as PA;
    let mut out = Vec::with_capacity(64);
    let origin = match a.origin {
        0 => bgp_rs::Origin::IGP,
        1 => bgp_rs::Origin::EGP,
        _ => bgp_rs::Origin::INCOMPLETE,
    };
    PA::ORIGIN(origin).encode(&mut out).map_err(io_err)?;
    encode_as_path(&mut out, code::AS_PATH, &a.as_path, four_octet);
    if v4 {
        match a.next_hop {
            Some(nh @ IpAddr::V4(_)) => PA::NEXT_HOP(nh).encode(&mut out).map_err(io_err)?,
            _ => {
                return Err(CodecError::Encode(
                    "IPv4 NLRI needs an IPv4 next hop".into(),
                ));
            }
        }
    }
    if let Some(med) = a.med {
        PA::MULTI_EXIT_DISC(med).encode(&mut out).map_err(io_err)?;
    }
    if let Some(lp) = a.local_pref {
        PA::LOCAL_PREF(lp).encode(&mut out).map_err(io_err)?;
    }
    if !a.communities.is_empty() {
        PA::COMMUNITY(a.communities.clone())
            .encode(&mut out)
            .map_err(io_err)?;
    }
    if !four_octet && a.as_path.iter().any(|&x| x > 0xffff) {
        encode_as_path(&mut out, code::AS4_PATH, &a.as_path, true);
    }
    if !a.large_communities.is_empty() {
        attr_header(
            &mut out,
            FLAG_OPTIONAL | FLAG_TRANSITIVE,
            code::LARGE_COMMUNITY,
            a.large_communities.len() * 12,
        );
        for lc in &a.large_communities {
            for part in lc {
                out.extend_from_slice(&part.to_be_bytes());
            }
        }
    }
    Ok(out)
}

fn mp_attr(reach: bool, body: bgp_rs::PathAttribute) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::new();
    body.encode(&mut out).map_err(io_err)?;
    debug_assert_eq!(
        out[1],
        if reach {
            code::MP_REACH
        } else {
            code::MP_UNREACH
        }
    );
    Ok(out)
}

fn update_msg(withdrawn_v4: &[u8], attrs: &[u8], nlri: &[u8]) -> Result<Vec<u8>, CodecError> {
    let mut body = Vec::with_capacity(4 + withdrawn_v4.len() + attrs.len() + nlri.len());
    body.extend_from_slice(&(withdrawn_v4.len() as u16).to_be_bytes());
    body.extend_from_slice(withdrawn_v4);
    body.extend_from_slice(&(attrs.len() as u16).to_be_bytes());
    body.extend_from_slice(attrs);
    body.extend_from_slice(nlri);
    frame(msg_type::UPDATE, &body)
}

/// Split `prefixes` into runs whose encoded size fits `budget` bytes each.
fn chunks_within(prefixes: &[IpNetwork], budget: usize) -> Vec<&[IpNetwork]> {
    let mut out = Vec::new();
    let (mut start, mut used) = (0, 0);
    for (i, p) in prefixes.iter().enumerate() {
        let n = prefix_bytes(p);
        if used + n > budget && i > start {
            out.push(&prefixes[start..i]);
            start = i;
            used = 0;
        }
        used += n;
    }
    if start < prefixes.len() {
        out.push(&prefixes[start..]);
    }
    out
}

/// Encode withdrawals and one group of announcements into as few UPDATEs as fit in
/// 4096 bytes each: IPv4 withdrawals in the withdrawn-routes field, IPv6 ones in
/// MP_UNREACH_NLRI, IPv4 announcements in the NLRI field, IPv6 ones in MP_REACH_NLRI.
/// All announced prefixes must be of one family, matching the next hop's.
pub fn encode_updates(
    withdrawn: &[IpNetwork],
    announce: Option<(&PathAttrs, &[IpNetwork])>,
    four_octet: bool,
) -> Result<Vec<Vec<u8>>, CodecError> {
    let mut msgs = Vec::new();
    let fixed = HEADER_LEN + 4;
    let (w4, w6): (Vec<IpNetwork>, Vec<IpNetwork>) = withdrawn.iter().partition(|p| p.is_ipv4());
    for chunk in chunks_within(&w4, MAX_MESSAGE_LEN - fixed) {
        let mut w = Vec::new();
        chunk.iter().for_each(|p| push_prefix(&mut w, p));
        msgs.push(update_msg(&w, &[], &[])?);
    }
    // MP_UNREACH: 4-byte attribute header + AFI/SAFI 3 bytes.
    for chunk in chunks_within(&w6, MAX_MESSAGE_LEN - fixed - 7) {
        let attr = mp_attr(
            false,
            bgp_rs::PathAttribute::MP_UNREACH_NLRI(bgp_rs::MPUnreachNLRI {
                afi: bgp_rs::AFI::IPV6,
                safi: bgp_rs::SAFI::Unicast,
                withdrawn_routes: chunk.iter().map(to_bgp_rs_nlri).collect(),
            }),
        )?;
        msgs.push(update_msg(&[], &attr, &[])?);
    }
    let Some((attrs, nlri)) = announce else {
        if msgs.is_empty() && withdrawn.is_empty() {
            // An empty UPDATE is the IPv4 End-of-RIB marker (RFC 4724).
            msgs.push(update_msg(&[], &[], &[])?);
        }
        return Ok(msgs);
    };
    if nlri.is_empty() {
        return Ok(msgs);
    }
    let v4 = nlri[0].is_ipv4();
    if nlri.iter().any(|p| p.is_ipv4() != v4) {
        return Err(CodecError::Encode(
            "one UPDATE group must hold prefixes of one family".into(),
        ));
    }
    let base = encode_attrs(attrs, v4, four_octet)?;
    if v4 {
        let budget = MAX_MESSAGE_LEN
            .checked_sub(fixed + base.len())
            .filter(|b| *b >= 5)
            .ok_or_else(|| CodecError::Encode("path attributes too large".into()))?;
        for chunk in chunks_within(nlri, budget) {
            let mut n = Vec::new();
            chunk.iter().for_each(|p| push_prefix(&mut n, p));
            msgs.push(update_msg(&[], &base, &n)?);
        }
    } else {
        let Some(IpAddr::V6(nh)) = attrs.next_hop else {
            return Err(CodecError::Encode(
                "IPv6 NLRI needs an IPv6 next hop".into(),
            ));
        };
        // MP_REACH: 4-byte header + AFI/SAFI 3 + NH len 1 + NH 16 + reserved 1.
        let budget = MAX_MESSAGE_LEN
            .checked_sub(fixed + base.len() + 25)
            .filter(|b| *b >= 17)
            .ok_or_else(|| CodecError::Encode("path attributes too large".into()))?;
        for chunk in chunks_within(nlri, budget) {
            let mp = mp_attr(
                true,
                bgp_rs::PathAttribute::MP_REACH_NLRI(bgp_rs::MPReachNLRI {
                    afi: Afi::Ipv6.to_bgp_rs(),
                    safi: bgp_rs::SAFI::Unicast,
                    next_hop: nh.octets().to_vec(),
                    announced_routes: chunk.iter().map(to_bgp_rs_nlri).collect(),
                }),
            )?;
            // Keep type-code order: MP_REACH (14) goes before LARGE_COMMUNITY (32).
            let split = large_community_offset(&base);
            let mut all = Vec::with_capacity(base.len() + mp.len());
            all.extend_from_slice(&base[..split]);
            all.extend_from_slice(&mp);
            all.extend_from_slice(&base[split..]);
            msgs.push(update_msg(&[], &all, &[])?);
        }
    }
    Ok(msgs)
}

/// The End-of-RIB marker of a family (RFC 4724 §2): an empty UPDATE for IPv4, an
/// UPDATE with an empty MP_UNREACH_NLRI for IPv6.
pub fn end_of_rib(afi: Afi) -> Result<Vec<u8>, CodecError> {
    match afi {
        Afi::Ipv4 => update_msg(&[], &[], &[]),
        Afi::Ipv6 => update_msg(
            &[],
            &[FLAG_OPTIONAL, code::MP_UNREACH, 3, 0, 2, SAFI_UNICAST],
            &[],
        ),
    }
}

/// Offset of the first attribute with a code above MP_REACH (our encoder emits only
/// AS4_PATH and LARGE_COMMUNITY there).
fn large_community_offset(attrs: &[u8]) -> usize {
    let mut i = 0;
    while i + 3 <= attrs.len() {
        let (flags, c) = (attrs[i], attrs[i + 1]);
        if c > code::MP_REACH {
            return i;
        }
        let (hl, len) = if flags & FLAG_EXTENDED != 0 {
            (
                4,
                usize::from(u16::from_be_bytes([attrs[i + 2], attrs[i + 3]])),
            )
        } else {
            (3, usize::from(attrs[i + 2]))
        };
        i += hl + len;
    }
    attrs.len()
}

/// Parse a run of prefixes of one family. `None` on any syntax error.
fn parse_prefixes(mut b: &[u8], afi: Afi) -> Option<Vec<IpNetwork>> {
    let max = if afi == Afi::Ipv4 { 32 } else { 128 };
    let mut out = Vec::new();
    while let Some((&len, rest)) = b.split_first() {
        if len > max {
            return None;
        }
        let n = usize::from(len).div_ceil(8);
        let bytes = rest.get(..n)?;
        let addr = match afi {
            Afi::Ipv4 => {
                let mut o = [0u8; 4];
                o[..n].copy_from_slice(bytes);
                IpAddr::V4(Ipv4Addr::from(o))
            }
            Afi::Ipv6 => {
                let mut o = [0u8; 16];
                o[..n].copy_from_slice(bytes);
                IpAddr::V6(Ipv6Addr::from(o))
            }
        };
        let net = IpNetwork::new(addr, len).ok()?;
        out.push(IpNetwork::new(net.network(), len).ok()?);
        b = &rest[n..];
    }
    Some(out)
}

fn upd_err(subcode: u8, data: Vec<u8>, reason: &'static str) -> CodecError {
    CodecError::Update {
        subcode,
        data,
        reason,
    }
}

fn be32(v: &[u8]) -> u32 {
    u32::from_be_bytes([v[0], v[1], v[2], v[3]])
}

fn parse_as_path(v: &[u8], four_octet: bool) -> Option<Vec<u32>> {
    let w = if four_octet { 4 } else { 2 };
    let mut out = Vec::new();
    let mut b = v;
    while !b.is_empty() {
        let [t, n, rest @ ..] = b else { return None };
        if !(1..=4).contains(t) || *n == 0 {
            return None;
        }
        let len = usize::from(*n) * w;
        let seg = rest.get(..len)?;
        for a in seg.chunks_exact(w) {
            out.push(if four_octet {
                be32(a)
            } else {
                u32::from(u16::from_be_bytes([a[0], a[1]]))
            });
        }
        b = &rest[len..];
    }
    Some(out)
}

/// MP_REACH / MP_UNREACH body: (afi, safi, next hop, nlri bytes).
fn split_mp(v: &[u8], reach: bool) -> Option<(u16, u8, &[u8], &[u8])> {
    let afi = u16::from_be_bytes([*v.first()?, *v.get(1)?]);
    let safi = *v.get(2)?;
    if !reach {
        return Some((afi, safi, &[], &v[3..]));
    }
    let nhl = usize::from(*v.get(3)?);
    let nh = v.get(4..4 + nhl)?;
    let rest = v.get(4 + nhl + 1..)?; // skip reserved octet
    Some((afi, safi, nh, rest))
}

/// Decode an UPDATE body (after the header) with RFC 7606 error handling.
pub(super) fn decode_update(body: &[u8], four_octet: bool) -> Result<DecodedUpdate, CodecError> {
    let UpdateFields {
        withdrawn: wd,
        attributes: attrs_b,
        nlri: nlri_b,
    } = split_update(body)?;
    let bad_net = || upd_err(notif::INVALID_NETWORK_FIELD, Vec::new(), "malformed prefix");
    let withdrawn = parse_prefixes(wd, Afi::Ipv4).ok_or_else(bad_net)?;
    let nlri = parse_prefixes(nlri_b, Afi::Ipv4).ok_or_else(bad_net)?;
    let mut d = UpdateDecoder {
        four_octet,
        has_v4_nlri: !nlri.is_empty(),
        withdrawn,
        nlri,
        out: DecodedUpdate::default(),
        attrs: PathAttrs::default(),
        seen: HashSet::new(),
        taw: None,
        have_origin: false,
        have_path: false,
        have_nh: false,
        mp_reach_nlri: false,
    };
    d.path_attributes(attrs_b)?;
    Ok(d.finish())
}

fn malformed(reason: &'static str) -> CodecError {
    upd_err(notif::MALFORMED_ATTR_LIST, Vec::new(), reason)
}

/// The three variable-length fields of an UPDATE body.
struct UpdateFields<'a> {
    withdrawn: &'a [u8],
    attributes: &'a [u8],
    nlri: &'a [u8],
}

fn split_update(body: &[u8]) -> Result<UpdateFields<'_>, CodecError> {
    let wlen = usize::from(u16::from_be_bytes([body[0], body[1]]));
    let wd = body
        .get(2..2 + wlen)
        .ok_or_else(|| malformed("withdrawn routes length overruns the message"))?;
    let alen_at = 2 + wlen;
    let alen = match body.get(alen_at..alen_at + 2) {
        Some(b) => usize::from(u16::from_be_bytes([b[0], b[1]])),
        None => return Err(malformed("no room for the total path attribute length")),
    };
    let attrs_b = body
        .get(alen_at + 2..alen_at + 2 + alen)
        .ok_or_else(|| malformed("total path attribute length overruns the message"))?;
    let nlri_b = &body[alen_at + 2 + alen..];
    Ok(UpdateFields {
        withdrawn: wd,
        attributes: attrs_b,
        nlri: nlri_b,
    })
}

/// One path attribute as it sits in the attribute field.
struct RawAttr<'a> {
    flags: u8,
    code: u8,
    value: &'a [u8],
    /// Flags, type, length and value: the data of a NOTIFICATION about it.
    whole: &'a [u8],
}

/// The first attribute of `b` and the rest of the field, or why the attribute
/// field ends there (treat-as-withdraw).
fn split_attr(b: &[u8]) -> Result<(RawAttr<'_>, &[u8]), &'static str> {
    if b.len() < 3 {
        return Err("truncated path attribute header");
    }
    let (flags, code) = (b[0], b[1]);
    let ext = flags & FLAG_EXTENDED != 0;
    let hl = if ext { 4 } else { 3 };
    let Some(len) = (if ext {
        b.get(2..4)
            .map(|l| usize::from(u16::from_be_bytes([l[0], l[1]])))
    } else {
        b.get(2).map(|&l| usize::from(l))
    }) else {
        return Err("truncated path attribute header");
    };
    let Some(value) = b.get(hl..hl + len) else {
        // RFC 7606 §4: the last attribute overruns the attribute field.
        return Err("path attribute overruns the attribute field");
    };
    let whole = &b[..hl + len];
    Ok((
        RawAttr {
            flags,
            code,
            value,
            whole,
        },
        &b[hl + len..],
    ))
}

/// One UPDATE being decoded: its prefixes, the attributes read so far, and the
/// first reason for "treat-as-withdraw", if any.
struct UpdateDecoder {
    four_octet: bool,
    has_v4_nlri: bool,
    withdrawn: Vec<IpNetwork>,
    nlri: Vec<IpNetwork>,
    out: DecodedUpdate,
    attrs: PathAttrs,
    seen: HashSet<u8>,
    taw: Option<&'static str>,
    have_origin: bool,
    have_path: bool,
    have_nh: bool,
    mp_reach_nlri: bool,
}

impl UpdateDecoder {
    /// Every attribute of the path attribute field, in order.
    fn path_attributes(&mut self, mut b: &[u8]) -> Result<(), CodecError> {
        while !b.is_empty() {
            let a = match split_attr(b) {
                Ok((a, rest)) => {
                    b = rest;
                    a
                }
                Err(reason) => {
                    self.taw.get_or_insert(reason);
                    break;
                }
            };
            let c = a.code;
            if !self.seen.insert(c) {
                if c == code::MP_REACH || c == code::MP_UNREACH {
                    return Err(malformed("MP_REACH/MP_UNREACH appears twice"));
                }
                self.out.discarded.push(c);
                continue;
            }
            let opt = a.flags & FLAG_OPTIONAL != 0;
            let well_known = matches!(
                c,
                code::ORIGIN
                    | code::AS_PATH
                    | code::NEXT_HOP
                    | code::LOCAL_PREF
                    | code::ATOMIC_AGGREGATE
            );
            if well_known && (opt || a.flags & FLAG_TRANSITIVE == 0) {
                // §3c: a flags error is handled like a malformed attribute of that type.
                if c == code::ATOMIC_AGGREGATE {
                    self.out.discarded.push(c);
                } else {
                    self.taw
                        .get_or_insert("attribute flags error on a well-known attribute");
                }
                continue;
            }
            self.attribute(&a, opt)?;
        }
        Ok(())
    }

    /// One attribute, the first of its type, with valid flags.
    fn attribute(&mut self, a: &RawAttr<'_>, opt: bool) -> Result<(), CodecError> {
        let (c, v, len) = (a.code, a.value, a.value.len());
        let (attrs, taw) = (&mut self.attrs, &mut self.taw);
        match c {
            code::ORIGIN => match v {
                [o] if *o <= 2 => {
                    attrs.origin = *o;
                    self.have_origin = true;
                }
                _ => {
                    taw.get_or_insert("malformed ORIGIN");
                }
            },
            code::AS_PATH => match parse_as_path(v, self.four_octet) {
                Some(p) => {
                    attrs.as_path = p;
                    self.have_path = true;
                }
                None => {
                    taw.get_or_insert("malformed AS_PATH");
                }
            },
            code::NEXT_HOP => {
                if len == 4 {
                    attrs.next_hop = Some(IpAddr::V4(Ipv4Addr::from(be32(v))));
                    self.have_nh = true;
                } else {
                    taw.get_or_insert("NEXT_HOP length is not 4");
                }
            }
            code::MED | code::LOCAL_PREF => {
                if len == 4 {
                    let x = Some(be32(v));
                    if c == code::MED {
                        attrs.med = x
                    } else {
                        attrs.local_pref = x
                    }
                } else {
                    taw.get_or_insert("MED/LOCAL_PREF length is not 4");
                }
            }
            code::ATOMIC_AGGREGATE if len != 0 => self.out.discarded.push(c),
            code::AGGREGATOR if len != 6 && len != 8 => self.out.discarded.push(c),
            code::COMMUNITIES => {
                if len > 0 && len % 4 == 0 {
                    attrs.communities = v.chunks_exact(4).map(be32).collect();
                } else {
                    taw.get_or_insert("COMMUNITIES length not a non-zero multiple of 4");
                }
            }
            code::LARGE_COMMUNITY => {
                if len > 0 && len % 12 == 0 {
                    attrs.large_communities = v
                        .chunks_exact(12)
                        .map(|x| [be32(&x[0..4]), be32(&x[4..8]), be32(&x[8..12])])
                        .collect();
                } else {
                    taw.get_or_insert("LARGE_COMMUNITY length not a non-zero multiple of 12");
                }
            }
            code::MP_REACH | code::MP_UNREACH => self.multiprotocol(a)?,
            _ if !opt && !KNOWN.contains(&c) => {
                return Err(upd_err(
                    notif::UNRECOGNIZED_WELL_KNOWN,
                    a.whole.to_vec(),
                    "unrecognized well-known attribute",
                ));
            }
            _ => {} // recognised-but-unused or unknown optional: ignore
        }
        Ok(())
    }

    /// MP_REACH_NLRI / MP_UNREACH_NLRI (RFC 4760): their prefixes join the
    /// announced / withdrawn ones.
    fn multiprotocol(&mut self, a: &RawAttr<'_>) -> Result<(), CodecError> {
        let reach = a.code == code::MP_REACH;
        let opt_err = |r| upd_err(notif::OPTIONAL_ATTR_ERROR, a.whole.to_vec(), r);
        let (afi, safi, nh, nb) =
            split_mp(a.value, reach).ok_or_else(|| opt_err("MP attribute too short"))?;
        let Some(fam) = Afi::from_code(afi).filter(|_| safi == SAFI_UNICAST) else {
            return Ok(()); // a family we did not negotiate: ignore
        };
        let prefixes = parse_prefixes(nb, fam).ok_or_else(|| opt_err("malformed MP NLRI"))?;
        if reach {
            let addr = match (fam, nh.len()) {
                (Afi::Ipv4, 4) => IpAddr::V4(Ipv4Addr::from(be32(nh))),
                (Afi::Ipv6, 16 | 32) => {
                    let mut o = [0u8; 16];
                    o.copy_from_slice(&nh[..16]);
                    IpAddr::V6(Ipv6Addr::from(o))
                }
                _ => return Err(opt_err("MP_REACH next hop length")),
            };
            self.mp_reach_nlri |= !prefixes.is_empty();
            if !self.has_v4_nlri {
                self.attrs.next_hop = Some(addr);
            }
            self.nlri.extend(prefixes);
        } else {
            self.withdrawn.extend(prefixes);
        }
        Ok(())
    }

    /// The missing-attribute checks, then "treat-as-withdraw" if anything was wrong.
    fn finish(mut self) -> DecodedUpdate {
        let mut taw = self.taw;
        if !self.nlri.is_empty() && taw.is_none() {
            if !self.have_origin || !self.have_path {
                taw = Some("missing well-known mandatory attribute ORIGIN or AS_PATH");
            } else if self.has_v4_nlri && !self.have_nh {
                taw = Some("missing NEXT_HOP for IPv4 NLRI");
            } else if self.mp_reach_nlri && self.attrs.next_hop.is_none() {
                taw = Some("missing next hop");
            }
        }
        if let Some(r) = taw {
            self.out.treat_as_withdraw = Some(r);
            self.withdrawn.append(&mut self.nlri);
        }
        self.out.update = Update {
            withdrawn: self.withdrawn,
            attrs: if self.nlri.is_empty() {
                None
            } else {
                Some(self.attrs)
            },
            nlri: self.nlri,
        };
        self.out
    }
}
