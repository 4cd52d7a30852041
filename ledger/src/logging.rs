//! Log lines to stderr through `tracing`, at the level `LIBCUDA_LOG_LEVEL` asks for.

/// Installs libvgpu's subscriber. It is global only to this library's copy of `tracing`, so it
/// never collides with a host application that uses `tracing` itself.
pub fn init(level: tracing::Level) {
    let _ = tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(level)
        .with_target(false)
        .with_ansi(false)
        .try_init();
}
