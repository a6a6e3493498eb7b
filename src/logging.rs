//! The process-wide log subscriber: JSON or plain lines on stderr, colours only when
//! stderr is a terminal, a level filter and an access-log mode that a reload can change
//! without restarting.

use std::io::IsTerminal;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::OnceLock;

use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{reload, EnvFilter, Layer, Registry};

use crate::telemetry::trace;

use crate::config::{AccessLog, ConfigError, Log, LogFormat};

/// Dependencies capped at `warn` unless `log.level` names them: their debug output can
/// carry header values.
const QUIET_DEPENDENCIES: &[&str] = &["hyper", "hyper_util", "h2", "rustls", "tokio_rustls"];

/// The access-log mode as a number, so every request reads it without a lock.
static ACCESS: AtomicU8 = AtomicU8::new(0);

/// The handle that swaps the level filter, set by [`init`].
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Whether the trace spans are enabled (tracing on), so a reloaded level keeps them.
static SPANS: AtomicBool = AtomicBool::new(false);

fn access_code(mode: AccessLog) -> u8 {
    match mode {
        AccessLog::All => 0,
        AccessLog::Errors => 1,
        AccessLog::None => 2,
    }
}

fn access_mode() -> AccessLog {
    match ACCESS.load(Ordering::Relaxed) {
        0 => AccessLog::All,
        1 => AccessLog::Errors,
        _ => AccessLog::None,
    }
}

/// Whether a request answered with `status` gets an access-log line (`log.access`).
pub fn access_logged(status: u16) -> bool {
    access_mode().logs(status)
}

/// The filter for `log.level`, with the dependency caps.
fn filter(level: &str) -> Result<EnvFilter, ConfigError> {
    let mut directives = level.trim().to_owned();
    for dep in QUIET_DEPENDENCIES {
        if !level.contains(dep) {
            directives.push_str(&format!(",{dep}=warn"));
        }
    }
    // The trace spans live at their own target and level; only tracing turns them on,
    // whatever the log level.
    let spans = if SPANS.load(Ordering::Relaxed) {
        "trace"
    } else {
        "off"
    };
    directives.push_str(&format!(",{}={spans}", trace::TARGET));
    EnvFilter::try_new(&directives)
        .map_err(|e| ConfigError::new("log.level", format!("not a valid filter: {e}")))
}

/// Installs the subscriber for `log`, with `tracer` exporting the trace spans when tracing
/// is on. A second call (tests, the demo after a test subscriber) leaves the first in
/// place but still applies the access mode.
pub fn init(
    log: &Log,
    tracer: Option<opentelemetry_sdk::trace::Tracer>,
) -> Result<(), ConfigError> {
    SPANS.store(tracer.is_some(), Ordering::Relaxed);
    let (filter, handle) = reload::Layer::new(filter(&log.level)?);
    ACCESS.store(access_code(log.access), Ordering::Relaxed);
    // Escape sequences in a file or a journal are noise; only a terminal gets colours.
    let ansi = std::io::stderr().is_terminal();
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    // Log lines never carry the trace spans' context: the access line says what it says.
    let fmt = match log.format {
        LogFormat::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(false)
            .with_span_list(false)
            .boxed(),
        LogFormat::Plain => fmt.boxed(),
    }
    .with_filter(filter_fn(|meta| meta.target() != trace::TARGET));
    // The exporter sees the trace spans and nothing else: no log event becomes a span
    // event, and no source location or thread is attached.
    let otel = tracer.map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_level(false)
            .with_tracked_inactivity(false)
            .with_filter(filter_fn(|meta| {
                meta.is_span() && meta.target() == trace::TARGET
            }))
    });
    if tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .is_ok()
    {
        let _ = FILTER.set(handle);
    }
    Ok(())
}

/// Applies a reloaded `log.level` and `log.access`. `log.format` is fixed at start.
pub fn reload(log: &Log) -> Result<(), ConfigError> {
    let new = filter(&log.level)?;
    if let Some(handle) = FILTER.get() {
        handle
            .reload(new)
            .map_err(|e| ConfigError::new("log.level", format!("cannot apply: {e}")))?;
    }
    ACCESS.store(access_code(log.access), Ordering::Relaxed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_modes() {
        for (mode, ok, err) in [
            (AccessLog::All, true, true),
            (AccessLog::Errors, false, true),
            (AccessLog::None, false, false),
        ] {
            assert_eq!(mode.logs(200), ok);
            assert_eq!(mode.logs(503), err);
            assert_eq!(mode.logs(404), err);
        }
    }

    #[test]
    fn filters_cap_dependencies_unless_named() {
        assert!(filter("info").is_ok());
        assert!(filter("info,hyper=debug").is_ok());
    }
}
