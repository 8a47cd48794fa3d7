//! Kubernetes Events on Services (events.k8s.io/v1 via kube-runtime's `Recorder`,
//! which also folds repeats into an event series).

use k8s_openapi::api::core::v1::Service;
use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Publishes Events as `ringlb-controller`.
#[derive(Clone)]
pub struct Events {
    recorder: Recorder,
}

impl Events {
    pub fn new(client: kube::Client, instance: Option<String>) -> Self {
        let reporter = Reporter {
            controller: crate::status::FIELD_MANAGER.into(),
            instance,
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    async fn publish(
        &self,
        svc: &Service,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let ev = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note.chars().take(1000).collect()),
            action: action.to_string(),
            secondary: None,
        };
        // An Event that cannot be written must not stop the reconcile; log it instead.
        if let Err(e) = self.recorder.publish(&ev, &svc.object_ref(&())).await {
            tracing::warn!(error = %e, %reason, "writing Event failed");
        }
    }

    /// A user-facing problem (refusal, conflict, address outside pools).
    pub async fn warn(&self, svc: &Service, reason: &str, note: String) {
        self.publish(svc, EventType::Warning, reason, "AllocateIP", note)
            .await
    }

    /// A Service that cannot be served as it stands (a VIP without endpoints of its
    /// family).
    pub async fn warn_backends(&self, svc: &Service, reason: &str, note: String) {
        self.publish(svc, EventType::Warning, reason, "CheckBackends", note)
            .await
    }

    /// A normal outcome (address allocated or released).
    pub async fn normal(&self, svc: &Service, reason: &str, note: String) {
        self.publish(svc, EventType::Normal, reason, "AllocateIP", note)
            .await
    }
}
