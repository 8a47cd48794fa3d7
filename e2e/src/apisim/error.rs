//! API errors, rendered as `metav1.Status` the way kube-apiserver words them.

use serde_json::{Value, json};

/// An error response: HTTP code, Kubernetes reason, message, optional details.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, kind: &str, name: &str) -> Self {
        self.details = Some(json!({"name": name, "kind": kind}));
        self
    }

    pub fn bad_request(msg: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", msg)
    }

    /// `plural.group "name" not found`
    pub fn not_found(qualified: &str, name: &str) -> Self {
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with_details(qualified, name)
    }

    pub fn path_not_found(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    pub fn already_exists(qualified: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with_details(qualified, name)
    }

    pub fn conflict(qualified: &str, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been \
                 modified; please apply your changes to the latest version and try again"
            ),
        )
        .with_details(qualified, name)
    }

    /// A server-side apply that would change fields another manager owns.
    pub fn apply_conflict(qualified: &str, name: &str, conflicts: &[String]) -> Self {
        let n = conflicts.len();
        let s = if n == 1 { "" } else { "s" };
        Self::new(
            409,
            "Conflict",
            format!(
                "Apply failed with {n} conflict{s}: {}",
                conflicts.join(", ")
            ),
        )
        .with_details(qualified, name)
    }

    pub fn precondition(qualified: &str, name: &str, what: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!("Operation cannot be fulfilled on {qualified} \"{name}\": Precondition failed: {what}"),
        )
        .with_details(qualified, name)
    }

    pub fn invalid(kind: &str, name: &str, msg: impl std::fmt::Display) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {msg}"),
        )
        .with_details(kind, name)
    }

    pub fn method_not_allowed(what: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({what})"),
        )
    }

    pub fn gone(msg: impl Into<String>) -> Self {
        Self::new(410, "Expired", msg)
    }

    pub fn unsupported_media(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json; got {ct:?}"
            ),
        )
    }

    pub fn unsupported_media_msg(msg: impl Into<String>) -> Self {
        Self::new(415, "UnsupportedMediaType", msg)
    }

    pub fn too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "the request body is too large",
        )
    }

    pub fn internal(msg: impl Into<String>) -> Self {
        Self::new(500, "InternalError", msg)
    }

    pub fn forbidden(msg: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", msg)
    }

    /// The `metav1.Status` body.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_shape() {
        let s = ApiError::not_found("services", "web").to_status();
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["message"], "services \"web\" not found");
        assert_eq!(s["details"]["name"], "web");
    }
}
