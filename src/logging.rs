//! Logs on stderr: plain text (colour only on a terminal) or one JSON object per line
//! (`--log-format json`, for log collectors). Default level: info (`RUST_LOG` overrides).

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// How log lines are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// Installs the global subscriber.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info,warp=warn,hyper=warn"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match format {
        // Colour only on a terminal: redirected logs stay plain text.
        LogFormat::Text => builder.with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())).init(),
        LogFormat::Json => builder.with_ansi(false).event_format(Json).init(),
    }
}

/// One event as `{"timestamp", "level", "target", "message", fields...}`.
struct Json;

struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().into(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), Value::String(value.into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
}

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(&self, _: &FmtContext<'_, S, N>, mut w: Writer<'_>, event: &Event<'_>) -> fmt::Result {
        let mut time = String::new();
        SystemTime.format_time(&mut Writer::new(&mut time))?;
        let meta = event.metadata();
        let mut o = Map::new();
        o.insert("timestamp".into(), time.into());
        o.insert("level".into(), meta.level().as_str().into());
        o.insert("target".into(), meta.target().into());
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        o.extend(fields.0);
        writeln!(w, "{}", Value::Object(o))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

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

    #[test]
    fn json_lines_carry_the_message_and_the_fields() {
        let buf = Buf::default();
        let sink = buf.clone();
        let sub = tracing_subscriber::fmt().with_writer(move || sink.clone()).event_format(Json).finish();
        tracing::subscriber::with_default(sub, || {
            tracing::info!(pool = "decode", running = 3u64, usage = 0.5, "stats");
        });
        let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
        let v: Value = serde_json::from_str(text.trim()).unwrap();
        assert_eq!((v["level"].as_str(), v["message"].as_str()), (Some("INFO"), Some("stats")));
        assert_eq!(
            (v["pool"].as_str(), v["running"].as_u64(), v["usage"].as_f64()),
            (Some("decode"), Some(3), Some(0.5))
        );
        assert!(v["timestamp"].as_str().is_some_and(|t| t.starts_with("20")));
    }
}
