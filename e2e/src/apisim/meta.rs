//! Object metadata helpers: timestamps, uids, generated names, name validation,
//! small JSON accessors.

use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Map, Value};

/// Now, as an RFC 3339 timestamp with second precision (`metav1.Time`).
pub fn now() -> String {
    jiff::Timestamp::from_second(jiff::Timestamp::now().as_second())
        .map(|t| t.to_string())
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".into())
}

/// Seconds since an RFC 3339 timestamp, if it parses.
pub fn age_seconds(ts: &str) -> Option<i64> {
    let t: jiff::Timestamp = ts.parse().ok()?;
    Some(jiff::Timestamp::now().as_second() - t.as_second())
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A pseudo-random 64-bit number (splitmix64 over a counter and the clock): unique
/// enough for uids and generated names, no RNG dependency.
pub fn random_u64() -> u64 {
    let seed = SEQ.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
        ^ (jiff::Timestamp::now().as_nanosecond() as u64)
        ^ (u64::from(std::process::id()) << 32);
    let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A random version-4-shaped UUID string.
pub fn new_uid() -> String {
    let (a, b) = (random_u64(), random_u64());
    format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        0x8000 | (b >> 48) & 0x3fff,
        b & 0xffff_ffff_ffff
    )
}

/// `n` characters from the alphabet Kubernetes uses for generated names.
pub fn random_suffix(n: usize) -> String {
    const ALPHA: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut x = random_u64();
    (0..n)
        .map(|_| {
            let c = ALPHA[(x % ALPHA.len() as u64) as usize] as char;
            x /= ALPHA.len() as u64;
            c
        })
        .collect()
}

/// Checks a name is a DNS-1123 subdomain (what most resources require).
pub fn validate_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("metadata.name: Required value: name or generateName is required".into());
    }
    let ok = name.len() <= 253
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.')
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(format!(
            "metadata.name: Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of \
             lower case alphanumeric characters, '-' or '.', and must start and end with an \
             alphanumeric character"
        ))
    }
}

/// `metadata` as a mutable map, created if missing.
pub fn meta_mut(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.is_object() {
        *obj = Value::Object(Map::new());
    }
    let o = obj.as_object_mut().expect("object ensured above");
    let m = o
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if !m.is_object() {
        *m = Value::Object(Map::new());
    }
    m.as_object_mut().expect("object ensured above")
}

pub fn meta_str<'a>(obj: &'a Value, field: &str) -> Option<&'a str> {
    obj.get("metadata")?.get(field)?.as_str()
}

pub fn name(obj: &Value) -> &str {
    meta_str(obj, "name").unwrap_or("")
}

pub fn namespace(obj: &Value) -> &str {
    meta_str(obj, "namespace").unwrap_or("")
}

pub fn uid(obj: &Value) -> &str {
    meta_str(obj, "uid").unwrap_or("")
}

pub fn finalizers(obj: &Value) -> usize {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .map_or(0, Vec::len)
}

/// The object without `metadata` and `status`: what `generation` tracks.
pub fn spec_part(obj: &Value) -> Value {
    match obj {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "kind" | "apiVersion")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        ),
        other => other.clone(),
    }
}

/// Kubernetes-style short age: `45s`, `3m12s`, `5h`, `2d3h`.
pub fn short_age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=599 => format!("{}m{}s", s / 60, s % 60),
        600..=10799 => format!("{}m", s / 60),
        10800..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d{}h", s / 86400, (s % 86400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uids_and_names() {
        let (a, b) = (new_uid(), new_uid());
        assert_ne!(a, b);
        assert_eq!(a.len(), 36);
        assert_eq!(random_suffix(5).len(), 5);
        assert!(validate_name("web-1.x").is_ok());
        assert!(validate_name("Web").is_err());
        assert!(validate_name("-a").is_err());
        assert!(validate_name("").is_err());
    }

    #[test]
    fn times() {
        let t = now();
        assert!(t.ends_with('Z') && !t.contains('.'), "{t}");
        assert!(age_seconds(&t).unwrap() <= 1);
        assert_eq!(short_age(5), "5s");
        assert_eq!(short_age(200), "3m20s");
        assert_eq!(short_age(7200), "120m");
        assert_eq!(short_age(90000), "25h");
    }
}
