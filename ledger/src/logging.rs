//! Log lines to stderr through `tracing`, at the level `LIBCUDA_LOG_LEVEL` asks for, each tagged
//! `libvgpu[pid]` so that in an application's stderr they say where they come from.
//!
//! Both libraries log through this module: `libvgpu.so` and `libvgpu_vk.so` each install their
//! own subscriber, with the same format. Refused allocations go through [`refused`], which keeps a
//! program that retries in a loop from flooding its stderr.

use std::fmt;
use std::sync::Once;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// What every line starts with, before the process id.
pub const TAG: &str = "libvgpu";

/// Installs libvgpu's subscriber. It is global only to this library's copy of `tracing`, so it
/// never collides with a host application that uses `tracing` itself.
pub fn init(level: Level) {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_ansi(false)
        .event_format(Tagged)
        .try_init();
}

/// `libvgpu[1234] warning: message key=value …`: no timestamp (the application's log has its
/// own), the pid because every process of a container may write to one stream.
struct Tagged;

impl<S, N> FormatEvent<S, N> for Tagged
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let level = match *event.metadata().level() {
            Level::ERROR => "error",
            Level::WARN => "warning",
            Level::INFO => "info",
            _ => "debug",
        };
        write!(writer, "{TAG}[{}] {level}: ", std::process::id())?;
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

/// Refusal lines are at most one per this many nanoseconds, per process.
const REFUSAL_INTERVAL: u64 = 1_000_000_000;
/// `CLOCK_MONOTONIC` time of the last refusal line; 0 before the first.
static LAST_REFUSAL_LINE: AtomicU64 = AtomicU64::new(0);
/// Refusals since the last refusal line that were counted, not logged.
static UNLOGGED_REFUSALS: AtomicU64 = AtomicU64::new(0);
/// The process that counted them: a forked child starts its own count.
static UNLOGGED_BY: AtomicU32 = AtomicU32::new(0);

/// Logs an allocation refused because it would take `device` past its budget, at info level:
/// what was asked, the budget and what the container already holds there. `what` names the
/// call ("an allocation", "vkAllocateMemory").
pub fn refused(what: &str, device: usize, requested: u64, used: u64, limit: u64) {
    rate_limited(|unlogged| {
        let budget = if limit == 0 {
            "its zero budget (see the error logged at start-up)".to_owned()
        } else {
            format!("its {} budget", Size(limit))
        };
        tracing::info!(
            "refused {what} of {} on device {device}: the container uses {} of {budget}{}",
            Size(requested),
            Size(used),
            Unlogged(unlogged)
        );
    });
}

/// Logs an allocation refused for another reason than the budget, with the same rate limit.
pub fn refused_because(message: fmt::Arguments<'_>) {
    rate_limited(|unlogged| tracing::info!("{message}{}", Unlogged(unlogged)));
}

/// Runs `line` with the number of refusals not logged since the last line, if a refusal line
/// may be written now; otherwise counts this refusal. What is still uncounted at exit is logged
/// then.
fn rate_limited(line: impl FnOnce(u64)) {
    if !tracing::enabled!(Level::INFO) {
        return;
    }
    let now = crate::pace::now();
    let last = LAST_REFUSAL_LINE.load(Ordering::Relaxed);
    let due = last == 0 || now.saturating_sub(last) >= REFUSAL_INTERVAL;
    if due && LAST_REFUSAL_LINE.compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed).is_ok() {
        line(UNLOGGED_REFUSALS.swap(0, Ordering::Relaxed));
        return;
    }
    let pid = std::process::id();
    if UNLOGGED_BY.swap(pid, Ordering::Relaxed) != pid {
        UNLOGGED_REFUSALS.store(0, Ordering::Relaxed);
    }
    UNLOGGED_REFUSALS.fetch_add(1, Ordering::Relaxed);
    static AT_EXIT: Once = Once::new();
    // SAFETY: `report_unlogged_refusals` is an `extern "C"` function that lives as long as the
    // process (both libraries are linked with -z nodelete and never unloaded).
    AT_EXIT.call_once(|| unsafe {
        libc::atexit(report_unlogged_refusals);
    });
}

/// At exit, `tracing` can no longer be used (its thread-locals are gone), so the count is
/// written straight to stderr, in the same format. Refusals are counted only while info lines
/// are enabled.
extern "C" fn report_unlogged_refusals() {
    let _ = std::panic::catch_unwind(|| {
        let unlogged = UNLOGGED_REFUSALS.swap(0, Ordering::Relaxed);
        if unlogged == 0 || UNLOGGED_BY.load(Ordering::Relaxed) != std::process::id() {
            return;
        }
        let line = format!(
            "{TAG}[{}] info: {unlogged} more allocations were refused after the last refusal line (at \
             most one such line a second)\n",
            std::process::id()
        );
        // SAFETY: `line` is a live buffer of `line.len()` bytes; fd 2 is only written to.
        unsafe { libc::write(2, line.as_ptr().cast(), line.len()) };
    });
}

/// "; 12 more refused since the last such line", or nothing.
struct Unlogged(u64);

impl fmt::Display for Unlogged {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            0 => Ok(()),
            n => write!(f, "; {n} more refused since the last such line, not logged"),
        }
    }
}

/// A byte count for people: "64 MiB (67108864 bytes)".
pub struct Size(pub u64);

impl fmt::Display for Size {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bytes = self.0;
        let Some((unit, shift)) = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)]
            .into_iter()
            .find(|(_, shift)| bytes >> shift > 0)
        else {
            return write!(f, "{bytes} bytes");
        };
        if bytes.is_multiple_of(1 << shift) {
            write!(f, "{} {unit} ({bytes} bytes)", bytes >> shift)
        } else {
            write!(f, "{:.1} {unit} ({bytes} bytes)", bytes as f64 / (1u64 << shift) as f64)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_as_people_write_them() {
        assert_eq!(Size(0).to_string(), "0 bytes");
        assert_eq!(Size(1000).to_string(), "1000 bytes");
        assert_eq!(Size(64 << 20).to_string(), "64 MiB (67108864 bytes)");
        assert_eq!(Size(3 << 29).to_string(), "1.5 GiB (1610612736 bytes)");
        assert_eq!(Size(u64::MAX).to_string(), "16777216.0 TiB (18446744073709551615 bytes)");
    }
}
