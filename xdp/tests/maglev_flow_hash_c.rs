//! `bpf/flow_hash.h` (what the XDP program runs) and `maglev::flow_hash` (what the Rust
//! side and the golden file use) must be the same function. This compiles the header with
//! the host C compiler into a tiny program that, like the BPF program, copies the raw
//! packet bytes into `__u32[4]` / `__u16` and hashes them, then compares thousands of
//! IPv4 and IPv6 5-tuples. It also checks the header still compiles for `-target bpf`.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ringlb_maglev::flow_hash;

const MAIN_C: &str = r#"
#include <stdio.h>
#include <string.h>
#include "flow_hash.h"

/* One 5-tuple per line: 37 hex bytes = saddr[16] daddr[16] sport[2] dport[2] proto,
 * in packet (network) order. Prints ringlb_flow_hash() as 8 hex digits. */
int main(void)
{
	char line[256];
	while (fgets(line, sizeof(line), stdin)) {
		unsigned char pkt[37];
		for (int i = 0; i < 37; i++) {
			unsigned int b;
			if (sscanf(line + 2 * i, "%2x", &b) != 1)
				return 2;
			pkt[i] = (unsigned char)b;
		}
		__u32 s[4], d[4];
		__u16 sp, dp;
		memcpy(s, pkt, 16);
		memcpy(d, pkt + 16, 16);
		memcpy(&sp, pkt + 32, 2);
		memcpy(&dp, pkt + 34, 2);
		printf("%08x\n", ringlb_flow_hash(s, d, sp, dp, pkt[36]));
	}
	return 0;
}
"#;

/// Removes the scratch directory however the test ends.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn scratch(tag: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("ringlb-maglev-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create scratch dir");
    TempDir(dir)
}

fn bpf_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("bpf")
}

fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// splitmix64: a fixed, seedable stream of test inputs (no rand dependency needed).
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

type Tuple = (IpAddr, IpAddr, u16, u16, u8);

fn inputs() -> Vec<Tuple> {
    let mut v: Vec<Tuple> = vec![
        (
            Ipv4Addr::UNSPECIFIED.into(),
            Ipv4Addr::UNSPECIFIED.into(),
            0,
            0,
            0,
        ),
        (
            Ipv4Addr::BROADCAST.into(),
            Ipv4Addr::BROADCAST.into(),
            u16::MAX,
            u16::MAX,
            u8::MAX,
        ),
        (
            Ipv6Addr::UNSPECIFIED.into(),
            Ipv6Addr::LOCALHOST.into(),
            1,
            2,
            6,
        ),
        ([10, 0, 0, 1].into(), [10, 0, 0, 2].into(), 80, 12345, 6),
        (
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
            443,
            50000,
            17,
        ),
    ];
    let mut r = Mix(0x5eed);
    for i in 0..4000 {
        let (s, d): (IpAddr, IpAddr) = if i % 2 == 0 {
            (
                Ipv4Addr::from(r.next() as u32).into(),
                Ipv4Addr::from(r.next() as u32).into(),
            )
        } else {
            let a = (u128::from(r.next()) << 64) | u128::from(r.next());
            let b = (u128::from(r.next()) << 64) | u128::from(r.next());
            (Ipv6Addr::from(a).into(), Ipv6Addr::from(b).into())
        };
        let x = r.next();
        v.push((s, d, x as u16, (x >> 16) as u16, (x >> 32) as u8));
    }
    v
}

fn packet_hex((s, d, sp, dp, proto): &Tuple) -> String {
    let mut bytes = Vec::with_capacity(37);
    for a in [s, d] {
        match a {
            IpAddr::V4(a) => {
                bytes.extend_from_slice(&a.octets());
                bytes.extend_from_slice(&[0; 12]);
            }
            IpAddr::V6(a) => bytes.extend_from_slice(&a.octets()),
        }
    }
    bytes.extend_from_slice(&sp.to_be_bytes());
    bytes.extend_from_slice(&dp.to_be_bytes());
    bytes.push(*proto);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn c_header_matches_rust_flow_hash() {
    if !have("cc") {
        ringlb_testkit::tier::skip(
            "c_header_matches_rust_flow_hash: no `cc` on PATH (CI installs gcc)",
        );
        return;
    }
    let dir = scratch("fh");
    let src = dir.0.join("main.c");
    let exe = dir.0.join("flow_hash_check");
    std::fs::write(&src, MAIN_C).unwrap();
    let out = Command::new("cc")
        .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-I"])
        .arg(bpf_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("run cc");
    assert!(
        out.status.success(),
        "cc failed on flow_hash.h:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let cases = inputs();
    let stdin: String = cases.iter().map(|t| packet_hex(t) + "\n").collect();
    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run the C checker");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "C checker exited with {}", out.status);
    let got: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(
        got.len(),
        cases.len(),
        "C checker printed the wrong number of lines"
    );
    let mut v4 = 0;
    for (t, c) in cases.iter().zip(got) {
        let rust = flow_hash(t.0, t.1, t.2, t.3, t.4);
        assert_eq!(format!("{rust:08x}"), c, "C and Rust disagree on {t:?}");
        v4 += usize::from(t.0.is_ipv4());
    }
    assert!(
        v4 > 1000 && cases.len() - v4 > 1000,
        "both families covered"
    );
}

#[test]
fn header_compiles_for_bpf() {
    if !have("clang") {
        ringlb_testkit::tier::skip(
            "header_compiles_for_bpf: no `clang` on PATH (CI installs clang)",
        );
        return;
    }
    let dir = scratch("fh-bpf");
    let src = dir.0.join("probe.c");
    std::fs::write(
        &src,
        "#include \"flow_hash.h\"\n\
         __u32 probe(const __u32 *s, const __u32 *d, __u16 a, __u16 b, __u8 p)\n\
         { return ringlb_flow_hash(s, d, a, b, p); }\n",
    )
    .unwrap();
    let out = Command::new("clang")
        .args(["-O2", "-target", "bpf", "-Wall", "-Werror", "-c"])
        .arg("-I")
        .arg(bpf_dir())
        .arg("-I/usr/include/x86_64-linux-gnu")
        .arg(&src)
        .arg("-o")
        .arg(dir.0.join("probe.o"))
        .output()
        .expect("run clang");
    assert!(
        out.status.success(),
        "clang -target bpf failed on flow_hash.h:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
