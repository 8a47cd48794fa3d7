//! Errors of loading, pinning and attaching a BPF object, common to both
//! datapaths. Each datapath's `Error` wraps [`BpfError`]
//! (`#[error(transparent)] Bpf(#[from] BpfError)`) next to its own variants.

use std::path::PathBuf;

use aya::maps::MapError;
use aya::programs::ProgramError;

/// A BPF object, program, map, pin or interface operation failed.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("loading the BPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("BPF program {name}: {}", with_causes(source.as_ref()))]
    Program {
        name: &'static str,
        #[source]
        source: Box<ProgramError>,
    },
    #[error("BPF map {name}: {}", with_causes(source.as_ref()))]
    Map {
        name: &'static str,
        #[source]
        source: Box<MapError>,
    },
    /// A map's key/value size or capacity is not what this build's ABI says.
    #[error("BPF map {name}: {reason}")]
    Layout { name: &'static str, reason: String },
    /// A program or map the object should hold is not in it.
    #[error("{name} is missing from the object")]
    Missing { name: &'static str },
    #[error("pinning under {path}: {source}")]
    Pin {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A map to read is not pinned where it should be (nothing is pinned by a read).
    #[error("no pinned map at {}: is the edge running with this --pin-dir?", path.display())]
    NotPinned { path: PathBuf },
    #[error("interface {iface}: {reason}")]
    Interface { iface: String, reason: String },
}

impl BpfError {
    /// Label for a `..._errors_total{kind=...}` metric.
    pub const fn metric_label(&self) -> &'static str {
        match self {
            BpfError::Load(_) => "load",
            BpfError::Program { .. } => "program",
            BpfError::Map { .. } => "map",
            BpfError::Layout { .. } => "layout",
            BpfError::Missing { .. } => "missing",
            BpfError::Pin { .. } => "pin",
            BpfError::NotPinned { .. } => "not_pinned",
            BpfError::Interface { .. } => "interface",
        }
    }
}

/// For `.map_err(map_err(name))` on an operation on map `name`, into any error
/// that wraps [`BpfError`].
pub fn map_err<E: From<BpfError>>(name: &'static str) -> impl Fn(MapError) -> E {
    move |source| {
        BpfError::Map {
            name,
            source: Box::new(source),
        }
        .into()
    }
}

/// `e` and each error under it, joined by ": ": aya's errors keep the OS
/// error (`EMFILE`, `EPERM`, ...) as their source, which the log must show.
fn with_causes(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        out.push_str(": ");
        out.push_str(&c.to_string());
        cause = c.source();
    }
    out
}

/// For `.map_err(prog_err(name))` on an operation on program `name`, into any
/// error that wraps [`BpfError`].
pub fn prog_err<E: From<BpfError>>(name: &'static str) -> impl Fn(ProgramError) -> E {
    move |source| {
        BpfError::Program {
            name,
            source: Box::new(source),
        }
        .into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helpers_name_the_map_and_the_program() {
        let e: BpfError = map_err("vips")(MapError::KeyNotFound);
        assert_eq!(e.metric_label(), "map");
        assert!(e.to_string().starts_with("BPF map vips: "), "{e}");
        let e: BpfError = prog_err("ringlb_xdp")(ProgramError::AlreadyLoaded);
        assert_eq!(e.metric_label(), "program");
        assert!(e.to_string().starts_with("BPF program ringlb_xdp: "), "{e}");
    }

    #[test]
    fn the_os_error_under_a_map_error_is_shown() {
        let e: BpfError = map_err("ring")(MapError::CreateError {
            name: "standalone_array".into(),
            io_error: std::io::Error::from_raw_os_error(24),
        });
        assert!(
            e.to_string().ends_with(
                "failed to create map `standalone_array`: Too many open files (os error 24)"
            ),
            "{e}"
        );
    }
}
