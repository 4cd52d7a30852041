//! The command line: which subcommand, its options and the region path, parsed without a framework.
//!
//! The subcommand, if any, is the first argument; options may come before or after the path, in
//! `--name VALUE` or `--name=VALUE` form, and `--` ends them (for a path that starts with `-`, or
//! is named like a subcommand: `./metrics` works too).

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// Where `serve` listens unless told: loopback only, on the port commonly used for GPU exporters.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:9400";

pub const USAGE: &str = "\
Usage:
  vgpu-smi [--json] [--watch SECONDS] [PATH]  what each container uses, per device and process
  vgpu-smi reclaim [--json] [PATH]            give back what dead processes still hold (writes PATH)
  vgpu-smi resize --device N [SIZE] [--share PERCENT] [PATH]
                                              change device N's budget (SIZE: 8g, 4000m, bytes) or
                                              compute share while the container runs (writes PATH)
  vgpu-smi metrics [PATH]                     the same as OpenMetrics text (Prometheus)
  vgpu-smi serve [--listen ADDR] [--no-reclaim] [--policy ACTION [--margin SIZE] [--grace SECONDS]]
                 [--swap [--swap-idle-ms MS] [--swap-force-ms MS] [--swap-quantum-ms MS]] [PATH]
                                              serve that on http://ADDR/metrics (default 127.0.0.1:9400),
                                              and give back what dead processes hold, as
                                              processes exit and once a second; with --policy
                                              (report, kill-newest or freeze; off unless named), act
                                              on a container whose processes NVML counts over its
                                              budget by more than SIZE (default 0) for SECONDS
                                              (default 10); what it did is on stderr and /events;
                                              with --swap (off unless named), when a process of an
                                              overcommitted container waits for room on a GPU, ask
                                              the least recently active process idle for MS
                                              (default 100) on that GPU to swap out, or after a
                                              wait of MS (default 5000; 0: never) with nobody
                                              idle, a busy one; a process of lower priority
                                              (CUDA_TASK_PRIORITY) than the waiter at once, and a
                                              process brought back not again for MS (default 1000)
                                              but for a higher priority (writes the containers'
                                              swap tables)
  vgpu-smi doctor [--library LIB] [PATH]      check libvgpu against the installed driver, the region
                                              and the environment (LIB: the libvgpu.so to check),
                                              and name cgroups that several budgets share
  vgpu-smi --version | --help

PATH is a region file (default: $CUDA_DEVICE_MEMORY_SHARED_CACHE, else /tmp/cudevshr.cache) or a
directory laid out as HAMi's monitor sees it (DIR/<pod-uid>_<container>/*.cache), one section per
container. Only `reclaim`, `resize` and `serve` (its reclaim) ever write to a region, and only `serve --swap` to a swap table; N is the region's device index, as
the table shows it.

Exit status: 0 ok; 2 usage; 3 a region file missing or unreadable; 4 not a region, corrupt or of
an unknown version; for doctor, 1 when anything is unknown or unhealthy.";

/// What to do.
#[derive(Clone, Debug, PartialEq)]
pub enum Command {
    /// Show the region(s): a table, or JSON; once, or every `watch`.
    Show {
        path: PathBuf,
        json: bool,
        watch: Option<Duration>,
    },
    /// Give back what dead processes hold.
    Reclaim {
        path: PathBuf,
        json: bool,
    },
    /// Change a device's budget and/or compute share (the values as given; checked when run).
    Resize {
        path: PathBuf,
        device: usize,
        size: Option<String>,
        share: Option<String>,
    },
    /// Print the OpenMetrics exposition once.
    Metrics {
        path: PathBuf,
    },
    /// Serve the exposition over HTTP.
    Serve {
        path: PathBuf,
        listen: SocketAddr,
        /// Give back what dead processes hold, as they exit and once a second (on unless
        /// `--no-reclaim`).
        reclaim: bool,
        /// The node's policy for containers over their budget by NVML's count; `None`: off.
        policy: Option<crate::policy::Policy>,
        /// The swap arbiter's settings (`--swap`); `None`: off.
        swap: Option<crate::arbiter::Settings>,
    },
    /// Check the installation against the driver; `library` is `None` for the default.
    Doctor {
        path: PathBuf,
        library: Option<PathBuf>,
    },
    Version,
    Help,
}

/// A command line that cannot be run, with what is wrong.
#[derive(Debug, PartialEq, Eq)]
pub struct UsageError(pub String);

/// Parses the arguments after the program name; `default_path` is used when no PATH is given.
pub fn parse(args: impl IntoIterator<Item = OsString>, default_path: PathBuf) -> Result<Command, UsageError> {
    let mut args = args.into_iter().peekable();
    let subcommand = match args.peek().and_then(|arg| arg.to_str()) {
        Some(name @ ("reclaim" | "resize" | "metrics" | "serve" | "doctor")) => {
            let name = name.to_owned();
            args.next();
            Some(name)
        }
        _ => None,
    };
    let mut positional: Vec<PathBuf> = Vec::new();
    let mut device = None;
    let mut share = None;
    let mut json = false;
    let mut no_reclaim = false;
    let mut watch = None;
    let mut listen = None;
    let mut library = None;
    let mut action = None;
    let mut margin = 0u64;
    let mut grace = Duration::from_secs(10);
    let mut swap = false;
    let mut swap_idle = None;
    let mut swap_force = None;
    let mut swap_quantum = None;
    let mut options_done = false;
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        if options_done || !text.starts_with('-') || text == "-" {
            positional.push(PathBuf::from(arg));
            continue;
        }
        let (name, inline) = match text.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name.to_owned(), Some(value.to_owned())),
            _ => (text.clone(), None),
        };
        let mut value = |what: &str| -> Result<String, UsageError> {
            match inline.clone() {
                Some(value) => Ok(value),
                None => args
                    .next()
                    .map(|v| v.to_string_lossy().into_owned())
                    .ok_or_else(|| UsageError(format!("{name} needs {what}"))),
            }
        };
        match (name.as_str(), subcommand.as_deref()) {
            ("--", _) => options_done = true,
            ("-h" | "--help", _) => return Ok(Command::Help),
            ("-V" | "--version", _) => return Ok(Command::Version),
            ("--json", None | Some("reclaim")) => json = true,
            ("--watch", None) => watch = Some(parse_interval(&value("a number of seconds")?)?),
            ("--library", Some("doctor")) => library = Some(PathBuf::from(value("a library path")?)),
            ("--device", Some("resize")) => {
                let text = value("a device index")?;
                let index = text.trim().parse().map_err(|_| {
                    UsageError(format!("--device {text}: give the region's device index (0, 1, …)"))
                })?;
                device = Some(index);
            }
            ("--share", Some("resize")) => share = Some(value("a percentage")?),
            ("--no-reclaim", Some("serve")) => no_reclaim = true,
            ("--policy", Some("serve")) => {
                let text = value("an action")?;
                action = Some(crate::policy::Action::parse(&text).ok_or_else(|| {
                    UsageError(format!("--policy {text}: give report, kill-newest or freeze"))
                })?);
            }
            ("--margin", Some("serve")) => {
                let text = value("a size")?;
                margin = vgpu_ledger::config::parse_size(&text)
                    .ok_or_else(|| UsageError(format!("--margin {text}: give a size (256m, 1g, bytes)")))?;
            }
            ("--grace", Some("serve")) => {
                let text = value("a number of seconds")?;
                grace = text
                    .parse::<f64>()
                    .ok()
                    .filter(|s| s.is_finite() && *s >= 0.0 && *s <= 86_400.0)
                    .map(Duration::from_secs_f64)
                    .ok_or_else(|| UsageError(format!("--grace {text}: give seconds between 0 and 86400")))?;
            }
            ("--swap", Some("serve")) => swap = true,
            ("--swap-idle-ms", Some("serve")) => {
                let text = value("milliseconds")?;
                let ms =
                    text.trim().parse::<u64>().ok().filter(|ms| (1..=3_600_000).contains(ms)).ok_or_else(
                        || UsageError(format!("--swap-idle-ms {text}: give milliseconds, 1 to 3600000")),
                    )?;
                swap_idle = Some(Duration::from_millis(ms));
            }
            ("--swap-quantum-ms", Some("serve")) => {
                let text = value("milliseconds")?;
                let ms = text.trim().parse::<u64>().ok().filter(|ms| *ms <= 3_600_000).ok_or_else(|| {
                    UsageError(format!("--swap-quantum-ms {text}: give milliseconds, 0 to 3600000"))
                })?;
                swap_quantum = Some(Duration::from_millis(ms));
            }
            ("--swap-force-ms", Some("serve")) => {
                let text = value("milliseconds")?;
                let ms = text.trim().parse::<u64>().ok().filter(|ms| *ms <= 3_600_000).ok_or_else(|| {
                    UsageError(format!("--swap-force-ms {text}: give milliseconds, 0 (never) to 3600000"))
                })?;
                swap_force = Some(ms);
            }
            ("--listen", Some("serve")) => {
                let text = value("an address")?;
                let addr = text.parse().map_err(|_| {
                    UsageError(format!("--listen {text}: not an address (IP:PORT, e.g. {DEFAULT_LISTEN})"))
                })?;
                listen = Some(addr);
            }
            _ => {
                let what = subcommand.as_deref().map_or(String::new(), |s| format!(" for {s}"));
                return Err(UsageError(format!("unknown option {name}{what}")));
            }
        }
    }
    if subcommand.as_deref() == Some("resize") {
        let device = device.ok_or_else(|| UsageError("resize needs --device N".into()))?;
        // SIZE PATH, or with --share alone: PATH.
        let (size, path) = match (positional.len(), share.is_some()) {
            (2, _) => (Some(positional.remove(0)), Some(positional.remove(0))),
            (1, false) => (Some(positional.remove(0)), None),
            (1, true) => (None, Some(positional.remove(0))),
            (0, true) => (None, None),
            (0, false) => return Err(UsageError("resize needs a SIZE, or --share PERCENT".into())),
            _ => return Err(UsageError("resize takes SIZE and PATH, no more".into())),
        };
        let size = size.map(|size| size.to_string_lossy().into_owned());
        return Ok(Command::Resize { path: path.unwrap_or(default_path), device, size, share });
    }
    if positional.len() > 1 {
        return Err(UsageError("more than one PATH".into()));
    }
    if (swap_idle.is_some() || swap_force.is_some() || swap_quantum.is_some()) && !swap {
        return Err(UsageError(
            "--swap-idle-ms, --swap-force-ms and --swap-quantum-ms are the arbiter's: give --swap too".into(),
        ));
    }
    let path = positional.pop().unwrap_or(default_path);
    Ok(match subcommand.as_deref() {
        None => Command::Show { path, json, watch },
        Some("reclaim") => Command::Reclaim { path, json },
        Some("metrics") => Command::Metrics { path },
        Some("doctor") => Command::Doctor { path, library },
        _ => Command::Serve {
            path,
            listen: listen.unwrap_or_else(|| DEFAULT_LISTEN.parse().expect("a valid default address")),
            reclaim: !no_reclaim,
            policy: action.map(|action| crate::policy::Policy { action, margin, grace }),
            swap: swap.then(|| {
                let default = crate::arbiter::Settings::default();
                crate::arbiter::Settings {
                    idle: swap_idle.unwrap_or(default.idle),
                    force: match swap_force {
                        Some(0) => None,
                        Some(ms) => Some(Duration::from_millis(ms)),
                        None => default.force,
                    },
                    quantum: swap_quantum.unwrap_or(default.quantum),
                }
            }),
        },
    })
}

fn parse_interval(text: &str) -> Result<Duration, UsageError> {
    text.parse::<f64>()
        .ok()
        .filter(|seconds| seconds.is_finite() && *seconds >= 0.1 && *seconds <= 86_400.0)
        .map(Duration::from_secs_f64)
        .ok_or_else(|| UsageError(format!("--watch {text}: give seconds between 0.1 and 86400")))
}

/// The region path when none is given: the container's own, as libvgpu finds it.
pub fn default_path() -> PathBuf {
    std::env::var_os("CUDA_DEVICE_MEMORY_SHARED_CACHE")
        .filter(|path| !path.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(vgpu_ledger::config::DEFAULT_SHARED_CACHE))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Command, UsageError> {
        parse(args.iter().map(OsString::from), PathBuf::from("/default.cache"))
    }

    fn show(path: &str, json: bool, watch: Option<f64>) -> Command {
        Command::Show { path: path.into(), json, watch: watch.map(Duration::from_secs_f64) }
    }

    #[test]
    fn show_is_the_default_command() {
        assert_eq!(run(&[]), Ok(show("/default.cache", false, None)));
        assert_eq!(run(&["/r.cache"]), Ok(show("/r.cache", false, None)));
        assert_eq!(run(&["--json", "/r.cache"]), Ok(show("/r.cache", true, None)));
        assert_eq!(run(&["/r.cache", "--watch", "2"]), Ok(show("/r.cache", false, Some(2.0))));
        assert_eq!(run(&["--watch=0.5", "--json"]), Ok(show("/default.cache", true, Some(0.5))));
        assert_eq!(run(&["--", "--odd.cache"]), Ok(show("--odd.cache", false, None)));
        assert_eq!(run(&["--", "metrics"]), Ok(show("metrics", false, None)));
    }

    #[test]
    fn subcommands_take_their_own_options() {
        assert_eq!(run(&["reclaim"]), Ok(Command::Reclaim { path: "/default.cache".into(), json: false }));
        assert_eq!(run(&["reclaim", "--json", "/r"]), Ok(Command::Reclaim { path: "/r".into(), json: true }));
        assert_eq!(run(&["metrics", "/r"]), Ok(Command::Metrics { path: "/r".into() }));
        let serve = |path: &str, addr: &str| Command::Serve {
            path: path.into(),
            listen: addr.parse().unwrap(),
            reclaim: true,
            policy: None,
            swap: None,
        };
        assert_eq!(run(&["serve"]), Ok(serve("/default.cache", "127.0.0.1:9400")));
        assert_eq!(run(&["serve", "--listen", "0.0.0.0:9000", "/d"]), Ok(serve("/d", "0.0.0.0:9000")));
        assert_eq!(run(&["serve", "--listen=[::1]:0"]), Ok(serve("/default.cache", "[::1]:0")));
        assert_eq!(
            run(&["serve", "--no-reclaim", "/d"]),
            Ok(Command::Serve {
                path: "/d".into(),
                listen: DEFAULT_LISTEN.parse().unwrap(),
                reclaim: false,
                policy: None,
                swap: None,
            })
        );
        let swap = |ms, force| Command::Serve {
            path: "/d".into(),
            listen: DEFAULT_LISTEN.parse().unwrap(),
            reclaim: true,
            policy: None,
            swap: Some(crate::arbiter::Settings {
                idle: Duration::from_millis(ms),
                force,
                quantum: Duration::from_secs(1),
            }),
        };
        let force = Some(Duration::from_secs(5));
        assert_eq!(run(&["serve", "--swap", "/d"]), Ok(swap(100, force)));
        assert_eq!(run(&["serve", "/d", "--swap-idle-ms", "250", "--swap"]), Ok(swap(250, force)));
        assert_eq!(
            run(&["serve", "--swap", "--swap-force-ms=1500", "/d"]),
            Ok(swap(100, Some(Duration::from_millis(1500))))
        );
        assert_eq!(run(&["serve", "--swap", "--swap-force-ms", "0", "/d"]), Ok(swap(100, None)));
        let policy = crate::policy::Policy {
            action: crate::policy::Action::KillNewest,
            margin: 64 << 20,
            grace: Duration::from_millis(1500),
        };
        assert_eq!(
            run(&["serve", "--policy", "kill-newest", "--margin=64m", "--grace", "1.5", "/d"]),
            Ok(Command::Serve {
                path: "/d".into(),
                listen: DEFAULT_LISTEN.parse().unwrap(),
                reclaim: true,
                policy: Some(policy),
                swap: None,
            })
        );
        assert_eq!(run(&["--version"]), Ok(Command::Version));
        assert_eq!(run(&["doctor"]), Ok(Command::Doctor { path: "/default.cache".into(), library: None }));
        assert_eq!(
            run(&["doctor", "--library", "/l.so", "/r"]),
            Ok(Command::Doctor { path: "/r".into(), library: Some("/l.so".into()) })
        );
        assert_eq!(run(&["metrics", "-h"]), Ok(Command::Help));
        let resize = |path: &str, size: Option<&str>, share: Option<&str>| Command::Resize {
            path: path.into(),
            device: 1,
            size: size.map(str::to_owned),
            share: share.map(str::to_owned),
        };
        assert_eq!(run(&["resize", "--device", "1", "3g", "/r"]), Ok(resize("/r", Some("3g"), None)));
        assert_eq!(run(&["resize", "--device=1", "3g"]), Ok(resize("/default.cache", Some("3g"), None)));
        assert_eq!(
            run(&["resize", "--device", "1", "--share", "40", "/r"]),
            Ok(resize("/r", None, Some("40")))
        );
        assert_eq!(
            run(&["resize", "--share=40", "--device", "1", "8g", "/r"]),
            Ok(resize("/r", Some("8g"), Some("40")))
        );
    }

    #[test]
    fn mistakes_are_usage_errors() {
        for args in [
            &["--watch"][..],
            &["--watch", "0"],
            &["--watch", "soon"],
            &["--bogus"],
            &["a", "b"],
            &["metrics", "--json"],
            &["reclaim", "--watch", "1"],
            &["--listen", "127.0.0.1:1"],
            &["serve", "--listen", "localhost"],
            &["resize", "3g", "/r"],
            &["resize", "--device", "one", "3g"],
            &["resize", "--device", "0"],
            &["resize", "--device", "0", "3g", "/r", "/s"],
            &["--device", "0"],
            &["serve", "--policy", "kill"],
            &["serve", "--policy"],
            &["serve", "--margin", "lots"],
            &["serve", "--grace", "-1"],
            &["--policy", "report"],
            &["--swap"],
            &["serve", "--swap-idle-ms", "100"],
            &["serve", "--swap", "--swap-idle-ms", "0"],
            &["serve", "--swap", "--swap-idle-ms", "soon"],
            &["serve", "--swap-force-ms", "100"],
            &["serve", "--swap", "--swap-force-ms", "-1"],
        ] {
            assert!(run(args).is_err(), "{args:?} was accepted");
        }
        assert_eq!(run(&["--bogus"]), Err(UsageError("unknown option --bogus".into())));
    }
}
