//! Types shared by several CRDs.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};

/// A spec that failed validation, naming the offending field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ValidationError {
    /// JSON path of the field, e.g. `spec.cidrs[0]`.
    pub field: String,
    /// What is wrong with it, in one line.
    pub message: String,
}

impl ValidationError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            field: field.into(),
            message: message.into(),
        }
    }

    /// Short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        "invalid_spec"
    }
}

/// Every problem found in one spec; `Display` joins them with `; `.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("; "))]
pub struct ValidationErrors(pub Vec<ValidationError>);

impl ValidationErrors {
    /// Short label for metrics.
    pub fn metric_label(&self) -> &'static str {
        "invalid_spec"
    }
}

/// Collects errors and turns them into a `Result` at the end.
#[derive(Debug, Default)]
pub(crate) struct Errors(pub(crate) Vec<ValidationError>);

impl Errors {
    pub(crate) fn push(&mut self, field: impl Into<String>, message: impl Into<String>) {
        self.0.push(ValidationError::new(field, message));
    }
    pub(crate) fn finish(self) -> Result<(), ValidationErrors> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ValidationErrors(self.0))
        }
    }
}

/// A reference to a key of a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Namespace of the Secret.
    #[schemars(length(min = 1, max = 63))]
    pub namespace: String,
    /// Key inside the Secret's data. Defaults to `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}
