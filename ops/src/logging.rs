//! Logging set-up: one place for the three programs (`ringlb-controller`,
//! `ringlb-edge run`, `ringlb-edge node`).
//!
//! Text logs are coloured only when standard output is a terminal: under a container
//! runtime it is a pipe or a file, and escape codes would end up in `kubectl logs` and
//! in log collectors. `--log-format json` writes one JSON object per line instead.

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

/// How log lines are written (`--log-format`, `RINGLB_LOG_FORMAT`).
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines; coloured only on a terminal.
    #[default]
    Text,
    /// One JSON object per line (timestamp, level, target, fields, spans), for log
    /// collectors.
    Json,
}

/// Installs the global `tracing` subscriber with the given filter directive and
/// format, writing to standard output. Fails with a clear message when the directive
/// does not parse.
pub fn init(filter: &str, format: LogFormat) -> Result<(), String> {
    let ansi = std::io::stdout().is_terminal();
    let dispatch = dispatch(filter, format, ansi, std::io::stdout)?;
    // Also routes `log` records from dependencies through the same subscriber.
    dispatch.try_init().map_err(|e| e.to_string())
}

/// The subscriber [`init`] installs, writing to `writer`; `ansi` turns colours on
/// (text format only).
pub fn dispatch<W>(
    filter: &str,
    format: LogFormat,
    ansi: bool,
    writer: W,
) -> Result<tracing::Dispatch, String>
where
    W: for<'w> MakeWriter<'w> + Send + Sync + 'static,
{
    let filter = EnvFilter::try_new(filter).map_err(|e| format!("--log-level {filter:?}: {e}"))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(true)
        .with_writer(writer);
    Ok(match format {
        LogFormat::Text => builder.with_ansi(ansi).into(),
        LogFormat::Json => builder
            .json()
            .with_ansi(false)
            .with_current_span(true)
            .with_span_list(false)
            .into(),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// A writer that keeps what it is given.
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'w> MakeWriter<'w> for Buf {
        type Writer = Buf;
        fn make_writer(&'w self) -> Buf {
            self.clone()
        }
    }

    fn log_with(format: LogFormat, ansi: bool) -> String {
        let buf = Buf::default();
        let d = dispatch("info", format, ansi, buf.clone()).unwrap();
        tracing::dispatcher::with_default(&d, || {
            let span = tracing::info_span!("svc", service = "ns/web");
            let _g = span.enter();
            tracing::info!(vip = "192.0.2.1", "announced");
            tracing::warn!("a warning");
        });
        let out = buf.0.lock().unwrap().clone();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn text_off_a_terminal_has_no_escapes() {
        let out = log_with(LogFormat::Text, false);
        assert!(
            out.contains("announced") && out.contains("vip=\"192.0.2.1\""),
            "{out}"
        );
        assert!(out.contains("INFO") && out.contains("WARN"), "{out}");
        assert!(!out.contains("\x1b["), "{out:?}");
        // On a terminal the same lines are coloured: the check above can fail.
        assert!(log_with(LogFormat::Text, true).contains("\x1b["));
    }

    #[test]
    fn json_is_one_object_per_line_without_escapes() {
        // Even when asked for colours, JSON has none.
        let out = log_with(LogFormat::Json, true);
        assert!(!out.contains("\x1b["), "{out:?}");
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        for l in &lines {
            assert!(l.starts_with('{') && l.ends_with('}'), "{l}");
        }
        assert!(lines[0].contains("\"level\":\"INFO\""), "{}", lines[0]);
        assert!(lines[0].contains("\"vip\":\"192.0.2.1\""), "{}", lines[0]);
        assert!(lines[0].contains("\"service\":\"ns/web\""), "{}", lines[0]);
        assert!(
            lines[0].contains("\"message\":\"announced\""),
            "{}",
            lines[0]
        );
    }

    #[test]
    fn a_bad_filter_names_the_flag() {
        let err = dispatch("info,[", LogFormat::Text, false, Buf::default()).unwrap_err();
        assert!(err.contains("--log-level"), "{err}");
    }
}
