//! Kubernetes label selectors (`matchLabels` + `matchExpressions`), compiled once and
//! checked against label maps. Used wherever a CRD selects Services, namespaces, nodes,
//! pools or peers, so every selector in ringlb means the same thing.

use std::collections::BTreeMap;

use crate::common::{LabelSelector, ValidationError};

/// A label map.
pub type Labels = BTreeMap<String, String>;

/// A validated selector. An absent selector is `None` at the call site; an empty one
/// (`{}`) has no requirements and matches everything, as in Kubernetes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Selector {
    requirements: Vec<Requirement>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Requirement {
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    DoesNotExist(String),
}

impl Selector {
    /// Compiles `sel`; `field` (e.g. `spec.serviceSelector`) names it in errors.
    /// `None` stays `None` (matches everything).
    pub fn parse(
        field: &str,
        sel: Option<&LabelSelector>,
    ) -> Result<Option<Selector>, ValidationError> {
        let Some(sel) = sel else { return Ok(None) };
        let mut requirements = Vec::new();
        for (k, v) in sel.match_labels.iter().flatten() {
            requirements.push(Requirement::In(k.clone(), vec![v.clone()]));
        }
        for (i, e) in sel.match_expressions.iter().flatten().enumerate() {
            let values = e.values.clone().unwrap_or_default();
            let field = format!("{field}.matchExpressions[{i}]");
            let req = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => {
                    return Err(ValidationError::new(
                        field,
                        format!("operator {} needs values", e.operator),
                    ));
                }
                "In" => Requirement::In(e.key.clone(), values),
                "NotIn" => Requirement::NotIn(e.key.clone(), values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(ValidationError::new(
                        field,
                        format!("operator {} takes no values", e.operator),
                    ));
                }
                "Exists" => Requirement::Exists(e.key.clone()),
                "DoesNotExist" => Requirement::DoesNotExist(e.key.clone()),
                other => {
                    return Err(ValidationError::new(
                        field,
                        format!("unknown operator {other:?} (In, NotIn, Exists, DoesNotExist)"),
                    ));
                }
            };
            requirements.push(req);
        }
        Ok(Some(Selector { requirements }))
    }

    /// Whether every requirement holds for `labels`.
    pub fn matches(&self, labels: &Labels) -> bool {
        self.requirements.iter().all(|r| match r {
            Requirement::In(k, vs) => labels.get(k).is_some_and(|v| vs.contains(v)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|v| !vs.contains(v)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::DoesNotExist(k) => !labels.contains_key(k),
        })
    }
}

/// One-shot form: whether `sel` (absent = everything) selects `labels`.
pub fn selects(
    field: &str,
    sel: Option<&LabelSelector>,
    labels: &Labels,
) -> Result<bool, ValidationError> {
    Ok(Selector::parse(field, sel)?.is_none_or(|s| s.matches(labels)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    fn labels(kv: &[(&str, &str)]) -> Labels {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn expr(key: &str, op: &str, values: &[&str]) -> LabelSelectorRequirement {
        LabelSelectorRequirement {
            key: key.into(),
            operator: op.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|s| s.to_string()).collect()),
        }
    }

    #[test]
    fn kubernetes_semantics() {
        let l = labels(&[("tier", "edge"), ("zone", "a")]);
        assert!(selects("s", None, &l).unwrap());
        assert!(selects("s", Some(&LabelSelector::default()), &l).unwrap());
        let sel = LabelSelector {
            match_labels: Some([("tier".to_string(), "edge".to_string())].into()),
            match_expressions: Some(vec![
                expr("zone", "In", &["a", "b"]),
                expr("drain", "DoesNotExist", &[]),
                expr("zone", "NotIn", &["c"]),
                expr("tier", "Exists", &[]),
            ]),
        };
        assert!(selects("s", Some(&sel), &l).unwrap());
        assert!(!selects("s", Some(&sel), &labels(&[("tier", "edge"), ("zone", "c")])).unwrap());
        assert!(!selects("s", Some(&sel), &labels(&[("zone", "a")])).unwrap());
    }

    /// A selector of this one expression.
    fn only(e: LabelSelectorRequirement) -> LabelSelector {
        LabelSelector {
            match_expressions: Some(vec![e]),
            ..Default::default()
        }
    }

    #[test]
    fn bad_selectors_name_the_field() {
        let bad = only(expr("a", "Near", &[]));
        let e = Selector::parse("spec.nodeSelector", Some(&bad)).unwrap_err();
        assert_eq!(e.field, "spec.nodeSelector.matchExpressions[0]");
        for (bad, words) in [
            (expr("a", "In", &[]), "needs values"),
            (expr("a", "Exists", &["x"]), "takes no values"),
        ] {
            let message = Selector::parse("s", Some(&only(bad))).unwrap_err().message;
            assert!(message.contains(words), "{message}");
        }
    }
}
