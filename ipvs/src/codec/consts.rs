//! Numbers of the wire format, each from the kernel's uapi headers as Debian's
//! `linux-libc-dev` installs them (checked against 6.1.192):
//! `/usr/include/linux/netlink.h`, `/usr/include/linux/genetlink.h` and
//! `/usr/include/linux/ip_vs.h`. The header's enums are positional; the values
//! are written out here so a reader can check each against the header.

// ---- linux/netlink.h ----
/// `struct nlmsghdr`: len u32, type u16, flags u16, seq u32, pid u32.
pub const NLMSG_HDRLEN: usize = 16;
pub const NLMSG_ERROR: u16 = 2;
pub const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 0x1;
pub const NLM_F_MULTI: u16 = 0x2;
pub const NLM_F_ACK: u16 = 0x4;
/// `NLM_F_ROOT | NLM_F_MATCH`
pub const NLM_F_DUMP: u16 = 0x300;
/// `NLM_F_CREATE | NLM_F_EXCL` (for RTM_NEWADDR)
pub const NLM_F_CREATE_EXCL: u16 = 0x400 | 0x200;
/// `struct nlattr`: len u16, type u16.
pub const NLA_HDRLEN: usize = 4;
/// High bits of `nla_type` that are flags, not the type (`NLA_TYPE_MASK`).
pub const NLA_F_NESTED: u16 = 1 << 15;
pub const NLA_F_NET_BYTEORDER: u16 = 1 << 14;
pub const NLA_TYPE_MASK: u16 = !(NLA_F_NESTED | NLA_F_NET_BYTEORDER);

// ---- linux/genetlink.h ----
/// `struct genlmsghdr`: cmd u8, version u8, reserved u16.
pub const GENL_HDRLEN: usize = 4;
/// `GENL_ID_CTRL` (= `NLMSG_MIN_TYPE`, 0x10): the controller family.
pub const GENL_ID_CTRL: u16 = 0x10;
pub const CTRL_CMD_NEWFAMILY: u8 = 1;
pub const CTRL_CMD_GETFAMILY: u8 = 3;
pub const CTRL_ATTR_FAMILY_ID: u16 = 1;
pub const CTRL_ATTR_FAMILY_NAME: u16 = 2;
/// The version `genl-ctrl` requests carry (libnl and iproute2 send 1 too).
pub const CTRL_VERSION: u8 = 1;

// ---- linux/ip_vs.h ----
/// `IPVS_GENL_NAME`
pub const IPVS_GENL_NAME: &str = "IPVS";
/// `IPVS_GENL_VERSION`
pub const IPVS_GENL_VERSION: u8 = 0x1;

// enum IPVS_CMD_*
pub const IPVS_CMD_NEW_SERVICE: u8 = 1;
pub const IPVS_CMD_SET_SERVICE: u8 = 2;
pub const IPVS_CMD_DEL_SERVICE: u8 = 3;
pub const IPVS_CMD_GET_SERVICE: u8 = 4;
pub const IPVS_CMD_NEW_DEST: u8 = 5;
pub const IPVS_CMD_SET_DEST: u8 = 6;
pub const IPVS_CMD_DEL_DEST: u8 = 7;
pub const IPVS_CMD_GET_DEST: u8 = 8;

// enum IPVS_CMD_ATTR_*
pub const IPVS_CMD_ATTR_SERVICE: u16 = 1;
pub const IPVS_CMD_ATTR_DEST: u16 = 2;

// enum IPVS_SVC_ATTR_* (inside IPVS_CMD_ATTR_SERVICE)
pub const IPVS_SVC_ATTR_AF: u16 = 1;
pub const IPVS_SVC_ATTR_PROTOCOL: u16 = 2;
pub const IPVS_SVC_ATTR_ADDR: u16 = 3;
pub const IPVS_SVC_ATTR_PORT: u16 = 4;
pub const IPVS_SVC_ATTR_FWMARK: u16 = 5;
pub const IPVS_SVC_ATTR_SCHED_NAME: u16 = 6;
pub const IPVS_SVC_ATTR_FLAGS: u16 = 7;
pub const IPVS_SVC_ATTR_TIMEOUT: u16 = 8;
pub const IPVS_SVC_ATTR_NETMASK: u16 = 9;
pub const IPVS_SVC_ATTR_STATS: u16 = 10;
pub const IPVS_SVC_ATTR_PE_NAME: u16 = 11;
pub const IPVS_SVC_ATTR_STATS64: u16 = 12;

// enum IPVS_DEST_ATTR_* (inside IPVS_CMD_ATTR_DEST)
pub const IPVS_DEST_ATTR_ADDR: u16 = 1;
pub const IPVS_DEST_ATTR_PORT: u16 = 2;
pub const IPVS_DEST_ATTR_FWD_METHOD: u16 = 3;
pub const IPVS_DEST_ATTR_WEIGHT: u16 = 4;
pub const IPVS_DEST_ATTR_U_THRESH: u16 = 5;
pub const IPVS_DEST_ATTR_L_THRESH: u16 = 6;
pub const IPVS_DEST_ATTR_ACTIVE_CONNS: u16 = 7;
pub const IPVS_DEST_ATTR_INACT_CONNS: u16 = 8;
pub const IPVS_DEST_ATTR_PERSIST_CONNS: u16 = 9;
pub const IPVS_DEST_ATTR_STATS: u16 = 10;
pub const IPVS_DEST_ATTR_ADDR_FAMILY: u16 = 11;
pub const IPVS_DEST_ATTR_STATS64: u16 = 12;
pub const IPVS_DEST_ATTR_TUN_TYPE: u16 = 13;
pub const IPVS_DEST_ATTR_TUN_PORT: u16 = 14;
pub const IPVS_DEST_ATTR_TUN_FLAGS: u16 = 15;

// enum IPVS_STATS_ATTR_* (inside *_ATTR_STATS64; u64 each)
pub const IPVS_STATS_ATTR_CONNS: u16 = 1;
pub const IPVS_STATS_ATTR_INPKTS: u16 = 2;
pub const IPVS_STATS_ATTR_OUTPKTS: u16 = 3;
pub const IPVS_STATS_ATTR_INBYTES: u16 = 4;
pub const IPVS_STATS_ATTR_OUTBYTES: u16 = 5;

// Virtual service flags (`IP_VS_SVC_F_*`)
pub const IP_VS_SVC_F_PERSISTENT: u32 = 0x0001;
pub const IP_VS_SVC_F_HASHED: u32 = 0x0002;
pub const IP_VS_SVC_F_ONEPACKET: u32 = 0x0004;
/// `mh-fallback` for the mh scheduler (`IP_VS_SVC_F_SCHED_MH_FALLBACK` in
/// net/netfilter/ipvs/ip_vs_mh.c; the uapi names it `_SH_FALLBACK`).
pub const IP_VS_SVC_F_SCHED1: u32 = 0x0008;
/// `mh-port` for the mh scheduler (`IP_VS_SVC_F_SCHED_MH_PORT`).
pub const IP_VS_SVC_F_SCHED2: u32 = 0x0010;
pub const IP_VS_SVC_F_SCHED3: u32 = 0x0020;
/// The flags ringlb sets and compares; the mask of every `IPVS_SVC_ATTR_FLAGS`
/// it sends, so the kernel's own bits (`IP_VS_SVC_F_HASHED`) are left alone.
pub const SVC_FLAGS_MANAGED: u32 = IP_VS_SVC_F_PERSISTENT
    | IP_VS_SVC_F_ONEPACKET
    | IP_VS_SVC_F_SCHED1
    | IP_VS_SVC_F_SCHED2
    | IP_VS_SVC_F_SCHED3;

// Connection flags: forwarding methods (`IP_VS_CONN_F_*`, masked by FWD_MASK)
pub const IP_VS_CONN_F_FWD_MASK: u32 = 0x0007;
pub const IP_VS_CONN_F_MASQ: u32 = 0x0000;
pub const IP_VS_CONN_F_LOCALNODE: u32 = 0x0001;
pub const IP_VS_CONN_F_TUNNEL: u32 = 0x0002;
pub const IP_VS_CONN_F_DROUTE: u32 = 0x0003;

/// `IP_VS_CONN_F_TUNNEL_TYPE_IPIP`
pub const IP_VS_CONN_F_TUNNEL_TYPE_IPIP: u8 = 0;
/// `IP_VS_SCHEDNAME_MAXLEN` (with the NUL)
pub const IP_VS_SCHEDNAME_MAXLEN: usize = 16;

// ---- linux/socket.h ----
pub const AF_INET: u16 = 2;
pub const AF_INET6: u16 = 10;

// ---- linux/rtnetlink.h, linux/if_addr.h (binding VIPs on lo) ----
pub const RTM_NEWADDR: u16 = 20;
pub const RTM_DELADDR: u16 = 21;
pub const RTM_GETADDR: u16 = 22;
/// `struct ifaddrmsg`: family u8, prefixlen u8, flags u8, scope u8, index u32.
pub const IFADDRMSG_LEN: usize = 8;
pub const IFA_ADDRESS: u16 = 1;
pub const IFA_LOCAL: u16 = 2;
pub const IFA_LABEL: u16 = 3;
pub const IFA_FLAGS: u16 = 8;
pub const IFA_F_NODAD: u32 = 0x02;
pub const IFA_F_NOPREFIXROUTE: u32 = 0x200;
/// `RT_SCOPE_HOST`
pub const RT_SCOPE_HOST: u8 = 254;
