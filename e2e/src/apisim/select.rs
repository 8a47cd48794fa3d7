//! Label selectors (`a=b,c!=d,e in (x,y),!f`) and field selectors (`a.b=c,d!=e`),
//! parsed once and matched against JSON objects. Also `matchLabels`/`matchExpressions`
//! selectors as they appear inside objects (Deployments, ReplicaSets).

use serde_json::Value;

/// A selector string that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to parse requirement {input:?}: {reason}")]
pub struct SelectorError {
    pub input: String,
    pub reason: &'static str,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Requirement {
    key: String,
    op: Op,
}

impl Requirement {
    fn matches(&self, value: Option<&str>) -> bool {
        match (&self.op, value) {
            (Op::Eq(v), Some(x)) => v == x,
            (Op::Eq(_), None) => false,
            (Op::NotEq(v), x) => x != Some(v.as_str()),
            (Op::In(vs), Some(x)) => vs.iter().any(|v| v == x),
            (Op::In(_), None) => false,
            (Op::NotIn(vs), x) => x.is_none_or(|x| !vs.iter().any(|v| v == x)),
            (Op::Exists, x) => x.is_some(),
            (Op::NotExists, x) => x.is_none(),
        }
    }
}

/// A parsed label selector; empty matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSelector(Vec<Requirement>);

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn parse_set(rest: &str, input: &str) -> Result<Vec<String>, SelectorError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| SelectorError {
            input: input.into(),
            reason: "expected a set in parentheses",
        })?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let err = |reason| SelectorError {
                input: p.to_string(),
                reason,
            };
            let req = if let Some(k) = p.strip_prefix('!') {
                Requirement {
                    key: k.trim().into(),
                    op: Op::NotExists,
                }
            } else if let Some((k, v)) = p.split_once("!=") {
                Requirement {
                    key: k.trim().into(),
                    op: Op::NotEq(v.trim().into()),
                }
            } else if let Some((k, v)) = p.split_once("==") {
                Requirement {
                    key: k.trim().into(),
                    op: Op::Eq(v.trim().into()),
                }
            } else if let Some((k, v)) = p.split_once('=') {
                Requirement {
                    key: k.trim().into(),
                    op: Op::Eq(v.trim().into()),
                }
            } else if let Some((k, rest)) = p.split_once(" notin ") {
                Requirement {
                    key: k.trim().into(),
                    op: Op::NotIn(parse_set(rest, p)?),
                }
            } else if let Some((k, rest)) = p.split_once(" in ") {
                Requirement {
                    key: k.trim().into(),
                    op: Op::In(parse_set(rest, p)?),
                }
            } else {
                Requirement {
                    key: p.into(),
                    op: Op::Exists,
                }
            };
            if !valid_key(&req.key) {
                return Err(err("invalid label key"));
            }
            reqs.push(req);
        }
        Ok(LabelSelector(reqs))
    }

    /// Selector from a plain `key: value` map (Service `spec.selector`).
    pub fn from_map(map: &serde_json::Map<String, Value>) -> Self {
        LabelSelector(
            map.iter()
                .map(|(k, v)| Requirement {
                    key: k.clone(),
                    op: Op::Eq(v.as_str().unwrap_or("").into()),
                })
                .collect(),
        )
    }

    /// Matches the object's `metadata.labels`.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels");
        self.0
            .iter()
            .all(|r| r.matches(labels.and_then(|l| l.get(&r.key)).and_then(Value::as_str)))
    }
}

/// A parsed field selector: `path=value` / `path==value` / `path!=value`, where the
/// path is a dotted JSON path (`metadata.name`, `spec.type`, `involvedObject.uid`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

impl FieldSelector {
    pub fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut out = Vec::new();
        for part in s.split(',') {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let (k, eq, v) = if let Some((k, v)) = p.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, true, v)
            } else {
                return Err(SelectorError {
                    input: p.into(),
                    reason: "expected field=value or field!=value",
                });
            };
            let k = k.trim();
            if k.is_empty() || !k.chars().all(|c| c.is_ascii_alphanumeric() || c == '.') {
                return Err(SelectorError {
                    input: p.into(),
                    reason: "invalid field path",
                });
            }
            out.push((k.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector(out))
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(path, eq, want)| {
            let mut cur = Some(obj);
            for seg in path.split('.') {
                cur = cur.and_then(|c| c.get(seg));
            }
            // Missing fields compare as the empty string, as the API server does.
            let have = match cur {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(s)) => s.clone(),
                Some(other) => other.to_string(),
            };
            (have == *want) == *eq
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "n1", "namespace": "ns", "labels": labels}, "spec": {"type": "LoadBalancer"}})
    }

    #[test]
    fn label_selector_forms() {
        let o = obj(json!({"app": "web", "tier": "fe"}));
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web,tier=fe", true),
            ("app!=web", false),
            ("app in (web, api)", true),
            ("app notin (web)", false),
            ("tier", true),
            ("!tier", false),
            ("missing!=x", true),
            ("app in (api),tier", false),
        ] {
            assert_eq!(
                LabelSelector::parse(sel).unwrap().matches(&o),
                want,
                "{sel}"
            );
        }
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a b=c").is_err());
    }

    #[test]
    fn field_selector_forms() {
        let o = obj(json!({}));
        let f = FieldSelector::parse("metadata.name=n1,spec.type!=ClusterIP").unwrap();
        assert!(f.matches(&o));
        assert!(
            !FieldSelector::parse("metadata.namespace=other")
                .unwrap()
                .matches(&o)
        );
        assert!(FieldSelector::parse("spec.clusterIP=").unwrap().matches(&o));
        assert!(FieldSelector::parse("nonsense").is_err());
    }
}
