//! Decoding of Kubernetes protobuf request bodies into JSON, for the built-in types
//! kubectl's typed clients send as `application/vnd.kubernetes.protobuf` (kubectl
//! 1.33 `create deployment|service|namespace|configmap|secret`, `run`). Responses
//! are always JSON (kubectl accepts it).
//!
//! Wire format: the magic `k8s\0`, then a `runtime.Unknown` message
//! (1: typeMeta {1: apiVersion, 2: kind}, 2: raw object bytes). The object is
//! decoded with the field tables below (numbers from the `protobuf:` struct tags of
//! k8s.io/api). Fields not in the tables are skipped, empty strings, zero numbers,
//! false booleans and empty messages are left out (JSON `omitempty`), except where
//! the Go field is a pointer (`replicas`).

use serde_json::{Map, Value, json};

/// A protobuf body that could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum ProtoError {
    #[error("protobuf body does not start with the k8s magic")]
    Magic,
    #[error("truncated or malformed protobuf at byte {0}")]
    Malformed(usize),
    #[error("protobuf encoding of {0} is not supported by the simulator; send JSON")]
    Unsupported(String),
}

#[derive(Clone, Copy)]
enum K {
    Str,
    Int,
    /// An int from a pointer field: zero is kept.
    IntPtr,
    Bool,
    Msg(fn() -> &'static [F]),
    MapStr,
    MapBytes,
    MapQuantity,
    IntOrString,
}

#[derive(Clone, Copy)]
struct F(u32, &'static str, K, bool);

const fn f(n: u32, name: &'static str, k: K) -> F {
    F(n, name, k, false)
}
const fn rep(n: u32, name: &'static str, k: K) -> F {
    F(n, name, k, true)
}

fn object_meta() -> &'static [F] {
    const T: &[F] = &[
        f(1, "name", K::Str),
        f(2, "generateName", K::Str),
        f(3, "namespace", K::Str),
        f(5, "uid", K::Str),
        f(6, "resourceVersion", K::Str),
        f(11, "labels", K::MapStr),
        f(12, "annotations", K::MapStr),
        rep(13, "ownerReferences", K::Msg(owner_reference)),
        rep(14, "finalizers", K::Str),
    ];
    T
}

fn owner_reference() -> &'static [F] {
    const T: &[F] = &[
        f(5, "apiVersion", K::Str),
        f(1, "kind", K::Str),
        f(3, "name", K::Str),
        f(4, "uid", K::Str),
        f(6, "controller", K::Bool),
        f(7, "blockOwnerDeletion", K::Bool),
    ];
    T
}

fn label_selector() -> &'static [F] {
    const T: &[F] = &[
        f(1, "matchLabels", K::MapStr),
        rep(2, "matchExpressions", K::Msg(selector_requirement)),
    ];
    T
}

fn selector_requirement() -> &'static [F] {
    const T: &[F] = &[
        f(1, "key", K::Str),
        f(2, "operator", K::Str),
        rep(3, "values", K::Str),
    ];
    T
}

fn deployment() -> &'static [F] {
    const T: &[F] = &[
        f(1, "metadata", K::Msg(object_meta)),
        f(2, "spec", K::Msg(deployment_spec)),
    ];
    T
}

fn deployment_spec() -> &'static [F] {
    const T: &[F] = &[
        f(1, "replicas", K::IntPtr),
        f(2, "selector", K::Msg(label_selector)),
        f(3, "template", K::Msg(pod_template)),
        f(4, "strategy", K::Msg(strategy)),
        f(5, "minReadySeconds", K::Int),
        f(6, "revisionHistoryLimit", K::IntPtr),
        f(7, "paused", K::Bool),
        f(9, "progressDeadlineSeconds", K::IntPtr),
    ];
    T
}

fn strategy() -> &'static [F] {
    const T: &[F] = &[f(1, "type", K::Str)];
    T
}

fn pod_template() -> &'static [F] {
    const T: &[F] = &[
        f(1, "metadata", K::Msg(object_meta)),
        f(2, "spec", K::Msg(pod_spec)),
    ];
    T
}

fn pod() -> &'static [F] {
    const T: &[F] = &[
        f(1, "metadata", K::Msg(object_meta)),
        f(2, "spec", K::Msg(pod_spec)),
    ];
    T
}

fn pod_spec() -> &'static [F] {
    const T: &[F] = &[
        rep(2, "containers", K::Msg(container)),
        f(3, "restartPolicy", K::Str),
        f(4, "terminationGracePeriodSeconds", K::IntPtr),
        f(6, "dnsPolicy", K::Str),
        f(7, "nodeSelector", K::MapStr),
        f(8, "serviceAccountName", K::Str),
        f(10, "nodeName", K::Str),
        f(11, "hostNetwork", K::Bool),
        f(16, "hostname", K::Str),
        f(17, "subdomain", K::Str),
        f(19, "schedulerName", K::Str),
        rep(20, "initContainers", K::Msg(container)),
        f(24, "priorityClassName", K::Str),
    ];
    T
}

fn container() -> &'static [F] {
    const T: &[F] = &[
        f(1, "name", K::Str),
        f(2, "image", K::Str),
        rep(3, "command", K::Str),
        rep(4, "args", K::Str),
        f(5, "workingDir", K::Str),
        rep(6, "ports", K::Msg(container_port)),
        rep(7, "env", K::Msg(env_var)),
        f(8, "resources", K::Msg(resources)),
        f(14, "imagePullPolicy", K::Str),
        f(16, "stdin", K::Bool),
        f(17, "stdinOnce", K::Bool),
        f(18, "tty", K::Bool),
    ];
    T
}

fn container_port() -> &'static [F] {
    const T: &[F] = &[
        f(1, "name", K::Str),
        f(2, "hostPort", K::Int),
        f(3, "containerPort", K::IntPtr),
        f(4, "protocol", K::Str),
        f(5, "hostIP", K::Str),
    ];
    T
}

fn env_var() -> &'static [F] {
    const T: &[F] = &[f(1, "name", K::Str), f(2, "value", K::Str)];
    T
}

fn resources() -> &'static [F] {
    const T: &[F] = &[
        f(1, "limits", K::MapQuantity),
        f(2, "requests", K::MapQuantity),
    ];
    T
}

fn service() -> &'static [F] {
    const T: &[F] = &[
        f(1, "metadata", K::Msg(object_meta)),
        f(2, "spec", K::Msg(service_spec)),
    ];
    T
}

fn service_spec() -> &'static [F] {
    const T: &[F] = &[
        rep(1, "ports", K::Msg(service_port)),
        f(2, "selector", K::MapStr),
        f(3, "clusterIP", K::Str),
        f(4, "type", K::Str),
        rep(5, "externalIPs", K::Str),
        f(7, "sessionAffinity", K::Str),
        f(8, "loadBalancerIP", K::Str),
        rep(9, "loadBalancerSourceRanges", K::Str),
        f(10, "externalName", K::Str),
        f(11, "externalTrafficPolicy", K::Str),
        f(13, "publishNotReadyAddresses", K::Bool),
        f(17, "ipFamilyPolicy", K::Str),
        rep(18, "clusterIPs", K::Str),
        rep(19, "ipFamilies", K::Str),
        f(21, "loadBalancerClass", K::Str),
        f(22, "internalTrafficPolicy", K::Str),
    ];
    T
}

fn service_port() -> &'static [F] {
    const T: &[F] = &[
        f(1, "name", K::Str),
        f(2, "protocol", K::Str),
        f(3, "port", K::IntPtr),
        f(4, "targetPort", K::IntOrString),
        f(5, "nodePort", K::Int),
        f(6, "appProtocol", K::Str),
    ];
    T
}

fn namespace() -> &'static [F] {
    const T: &[F] = &[f(1, "metadata", K::Msg(object_meta))];
    T
}

fn config_map() -> &'static [F] {
    const T: &[F] = &[
        f(1, "metadata", K::Msg(object_meta)),
        f(2, "data", K::MapStr),
        f(3, "binaryData", K::MapBytes),
        f(4, "immutable", K::Bool),
    ];
    T
}

fn secret() -> &'static [F] {
    const T: &[F] = &[
        f(1, "metadata", K::Msg(object_meta)),
        f(2, "data", K::MapBytes),
        f(3, "type", K::Str),
        f(4, "stringData", K::MapStr),
        f(5, "immutable", K::Bool),
    ];
    T
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, ProtoError> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .b
                .get(self.pos)
                .ok_or(ProtoError::Malformed(self.pos))?;
            self.pos += 1;
            v |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(ProtoError::Malformed(self.pos))
    }

    fn bytes(&mut self) -> Result<&'a [u8], ProtoError> {
        let n = usize::try_from(self.varint()?).map_err(|_| ProtoError::Malformed(self.pos))?;
        let end = self
            .pos
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or(ProtoError::Malformed(self.pos))?;
        let out = &self.b[self.pos..end];
        self.pos = end;
        Ok(out)
    }

    /// Next (field number, wire type, payload) or `None` at the end.
    fn field(&mut self) -> Result<Option<(u32, Payload<'a>)>, ProtoError> {
        if self.pos >= self.b.len() {
            return Ok(None);
        }
        let key = self.varint()?;
        let num = u32::try_from(key >> 3).map_err(|_| ProtoError::Malformed(self.pos))?;
        let p = match key & 7 {
            0 => Payload::Varint(self.varint()?),
            2 => Payload::Bytes(self.bytes()?),
            1 => {
                self.pos += 8;
                Payload::Skipped
            }
            5 => {
                self.pos += 4;
                Payload::Skipped
            }
            _ => return Err(ProtoError::Malformed(self.pos)),
        };
        if self.pos > self.b.len() {
            return Err(ProtoError::Malformed(self.pos));
        }
        Ok(Some((num, p)))
    }
}

enum Payload<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Skipped,
}

fn base64(data: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(data.len().div_ceil(3) * 4);
    for c in data.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for i in 0..4 {
            if i <= c.len() {
                out.push(T[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn string(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A map entry message {1: key, 2: value}.
fn map_entry(b: &[u8]) -> Result<(String, Option<&[u8]>), ProtoError> {
    let mut r = Reader { b, pos: 0 };
    let (mut k, mut v) = (String::new(), None);
    while let Some((n, p)) = r.field()? {
        match (n, p) {
            (1, Payload::Bytes(x)) => k = string(x),
            (2, Payload::Bytes(x)) => v = Some(x),
            _ => {}
        }
    }
    Ok((k, v))
}

/// resource.Quantity {1: string}
fn quantity(b: &[u8]) -> Result<String, ProtoError> {
    let mut r = Reader { b, pos: 0 };
    let mut s = String::new();
    while let Some((n, p)) = r.field()? {
        if let (1, Payload::Bytes(x)) = (n, p) {
            s = string(x);
        }
    }
    Ok(s)
}

fn value(k: K, p: Payload<'_>) -> Result<Option<Value>, ProtoError> {
    Ok(match (k, p) {
        (K::Str, Payload::Bytes(b)) => Some(json!(string(b))).filter(|_| !b.is_empty()),
        (K::Int, Payload::Varint(v)) => Some(json!(v as i64)).filter(|_| v != 0),
        (K::IntPtr, Payload::Varint(v)) => Some(json!(v as i64)),
        (K::Bool, Payload::Varint(v)) => Some(json!(true)).filter(|_| v != 0),
        (K::Msg(fields), Payload::Bytes(b)) => {
            Some(message(b, fields())?).filter(|v| v.as_object().is_some_and(|m| !m.is_empty()))
        }
        (K::IntOrString, Payload::Bytes(b)) => {
            let mut r = Reader { b, pos: 0 };
            let (mut ty, mut int, mut s) = (0, 0i64, String::new());
            while let Some((n, p)) = r.field()? {
                match (n, p) {
                    (1, Payload::Varint(v)) => ty = v,
                    (2, Payload::Varint(v)) => int = v as i64,
                    (3, Payload::Bytes(x)) => s = string(x),
                    _ => {}
                }
            }
            match ty {
                0 if int != 0 => Some(json!(int)),
                1 if !s.is_empty() => Some(json!(s)),
                _ => None,
            }
        }
        _ => None,
    })
}

fn message(b: &[u8], fields: &[F]) -> Result<Value, ProtoError> {
    let mut r = Reader { b, pos: 0 };
    let mut out = Map::new();
    while let Some((num, p)) = r.field()? {
        let Some(&F(_, name, kind, repeated)) = fields.iter().find(|f| f.0 == num) else {
            continue;
        };
        match kind {
            K::MapStr | K::MapBytes | K::MapQuantity => {
                let Payload::Bytes(entry) = p else { continue };
                let (k, v) = map_entry(entry)?;
                let v = match (kind, v) {
                    (K::MapStr, v) => json!(string(v.unwrap_or_default())),
                    (K::MapBytes, v) => json!(base64(v.unwrap_or_default())),
                    (_, v) => json!(quantity(v.unwrap_or_default())?),
                };
                let m = out.entry(name).or_insert_with(|| json!({}));
                if let Some(m) = m.as_object_mut() {
                    m.insert(k, v);
                }
            }
            _ => {
                let v = if repeated && matches!(kind, K::Str) {
                    // repeated strings keep empty elements
                    match p {
                        Payload::Bytes(b) => Some(json!(string(b))),
                        _ => None,
                    }
                } else {
                    value(kind, p)?
                };
                if let Some(v) = v {
                    if repeated {
                        if let Some(a) = out.entry(name).or_insert_with(|| json!([])).as_array_mut()
                        {
                            a.push(v);
                        }
                    } else {
                        out.insert(name.into(), v);
                    }
                }
            }
        }
    }
    Ok(Value::Object(out))
}

/// Decodes a `k8s\0`-framed protobuf object into its JSON form.
pub fn decode(body: &[u8]) -> Result<Value, ProtoError> {
    let rest = body.strip_prefix(b"k8s\0").ok_or(ProtoError::Magic)?;
    let mut r = Reader { b: rest, pos: 0 };
    let (mut api_version, mut kind, mut raw) = (String::new(), String::new(), &[][..]);
    while let Some((n, p)) = r.field()? {
        match (n, p) {
            (1, Payload::Bytes(tm)) => {
                let mut t = Reader { b: tm, pos: 0 };
                while let Some((n, p)) = t.field()? {
                    match (n, p) {
                        (1, Payload::Bytes(x)) => api_version = string(x),
                        (2, Payload::Bytes(x)) => kind = string(x),
                        _ => {}
                    }
                }
            }
            (2, Payload::Bytes(x)) => raw = x,
            _ => {}
        }
    }
    let fields: fn() -> &'static [F] = match (api_version.as_str(), kind.as_str()) {
        ("apps/v1", "Deployment") => deployment,
        ("v1", "Pod") => pod,
        ("v1", "Service") => service,
        ("v1", "Namespace") => namespace,
        ("v1", "ConfigMap") => config_map,
        ("v1", "Secret") => secret,
        _ => return Err(ProtoError::Unsupported(format!("{api_version} {kind}"))),
    };
    let mut obj = message(raw, fields())?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exact body kubectl 1.33 sent for `kubectl create deployment web --image=nginx`.
    const CREATE_DEPLOYMENT: &[u8] = &[
        0x6b, 0x38, 0x73, 0x00, 0x0a, 0x15, 0x0a, 0x07, 0x61, 0x70, 0x70, 0x73, 0x2f, 0x76, 0x31,
        0x12, 0x0a, 0x44, 0x65, 0x70, 0x6c, 0x6f, 0x79, 0x6d, 0x65, 0x6e, 0x74, 0x12, 0xab, 0x01,
        0x0a, 0x1f, 0x0a, 0x03, 0x77, 0x65, 0x62, 0x12, 0x00, 0x1a, 0x00, 0x22, 0x00, 0x2a, 0x00,
        0x32, 0x00, 0x38, 0x00, 0x42, 0x00, 0x5a, 0x0a, 0x0a, 0x03, 0x61, 0x70, 0x70, 0x12, 0x03,
        0x77, 0x65, 0x62, 0x12, 0x7a, 0x08, 0x01, 0x12, 0x0c, 0x0a, 0x0a, 0x0a, 0x03, 0x61, 0x70,
        0x70, 0x12, 0x03, 0x77, 0x65, 0x62, 0x1a, 0x60, 0x0a, 0x1c, 0x0a, 0x00, 0x12, 0x00, 0x1a,
        0x00, 0x22, 0x00, 0x2a, 0x00, 0x32, 0x00, 0x38, 0x00, 0x42, 0x00, 0x5a, 0x0a, 0x0a, 0x03,
        0x61, 0x70, 0x70, 0x12, 0x03, 0x77, 0x65, 0x62, 0x12, 0x40, 0x12, 0x22, 0x0a, 0x05, 0x6e,
        0x67, 0x69, 0x6e, 0x78, 0x12, 0x05, 0x6e, 0x67, 0x69, 0x6e, 0x78, 0x2a, 0x00, 0x42, 0x00,
        0x6a, 0x00, 0x72, 0x00, 0x80, 0x01, 0x00, 0x88, 0x01, 0x00, 0x90, 0x01, 0x00, 0xa2, 0x01,
        0x00, 0x1a, 0x00, 0x32, 0x00, 0x42, 0x00, 0x4a, 0x00, 0x52, 0x00, 0x58, 0x00, 0x60, 0x00,
        0x68, 0x00, 0x82, 0x01, 0x00, 0x8a, 0x01, 0x00, 0x9a, 0x01, 0x00, 0xc2, 0x01, 0x00, 0x22,
        0x02, 0x0a, 0x00, 0x28, 0x00, 0x38, 0x00, 0x1a, 0x0c, 0x08, 0x00, 0x10, 0x00, 0x18, 0x00,
        0x20, 0x00, 0x28, 0x00, 0x38, 0x00, 0x1a, 0x00, 0x22, 0x00,
    ];

    #[test]
    fn decodes_kubectl_create_deployment() {
        let v = decode(CREATE_DEPLOYMENT).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "web", "labels": {"app": "web"}},
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}},
                        "spec": {"containers": [{"name": "nginx", "image": "nginx"}]}}}})
        );
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        assert!(matches!(decode(b"nope"), Err(ProtoError::Magic)));
        assert!(decode(&CREATE_DEPLOYMENT[..40]).is_err());
        let mut odd = b"k8s\0".to_vec();
        odd.extend_from_slice(&[0x0a, 0x05, 0x0a, 0x01, b'x', 0x12, 0x00]);
        assert!(matches!(decode(&odd), Err(ProtoError::Unsupported(_))));
        for cut in 4..CREATE_DEPLOYMENT.len() {
            let _ = decode(&CREATE_DEPLOYMENT[..cut]);
        }
        assert_eq!(base64(b"hello"), "aGVsbG8=");
    }
}

#[cfg(test)]
mod garbage {
    /// Random bodies after the magic never panic the decoder.
    #[test]
    fn random_bodies_do_not_panic() {
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        for len in 0..400usize {
            let mut b = b"k8s\0".to_vec();
            for _ in 0..len {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                b.push(x as u8);
            }
            let _ = super::decode(&b);
        }
    }
}
