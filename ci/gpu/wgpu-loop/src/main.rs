//! A wgpu compute loop that times every submission on the GPU, for ci/gpu-wgpu.
//!
//! It stands for the held-out wgpu client of docs/vulkan.md ("Shares on real work"): one compute
//! pass of an FMA-bound shader per submission, a few submissions in flight, waiting for the oldest
//! with `Device::poll` (wgpu's own way: no fences of ours). Each pass carries wgpu timestamp writes
//! (both latched at `BOTTOM_OF_PIPE` by wgpu's Vulkan backend, so a pass queued behind another is
//! timed from the other's end), resolved and read back per in-flight slot, so the run reports how
//! long the GPU took for each submission as well as how many it finished. The two part ways when
//! submissions take longer, as they would if a GPU left idle by a share ran at a lower clock (the
//! suspicion ci/gpu-wgpu checks).
//!
//!   wgpu-loop [--ms 3.4] [--in-flight 4] [--seconds 6] [--warmup 0.5] [--iterations N]
//!             [--workgroups 4096] [--adapter NAME] [--gap-ms 0] [--calibrate] [--no-timestamps]
//!
//! Without `--iterations` the shader's loop count is calibrated first so that one dispatch takes
//! about `--ms` of GPU time; `--calibrate` prints that count (`iterations=`) and stops, so a script
//! can calibrate once natively and run every case with the same work. `--gap-ms` sleeps that long
//! after each submission: the idle gaps a share makes, without the layer. Output: `key=value` lines.
//! Exit status 0; 1 when the GPU work fails; 2 for bad arguments.

use std::collections::VecDeque;
use std::fmt;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Threads per workgroup; the shader's `@workgroup_size` must match.
const WORKGROUP_SIZE: u32 = 256;

/// Four independent vec4 chains of FMAs per iteration (16 FMAs), each converging (factor < 1), so
/// values stay finite for any iteration count and the compiler cannot fold the loop away.
const SHADER: &str = r#"
struct Params { iterations: u32 }
@group(0) @binding(0) var<storage, read_write> data: array<vec4<f32>>;
@group(0) @binding(1) var<uniform> params: Params;

@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>) {
    let i = id.x;
    var a = data[i];
    var b = a + vec4<f32>(0.25);
    var c = a + vec4<f32>(0.5);
    var d = a + vec4<f32>(0.75);
    let m = vec4<f32>(0.99991, 0.99993, 0.99995, 0.99997);
    let k = vec4<f32>(1.0e-4, 2.0e-4, 3.0e-4, 4.0e-4);
    for (var n = 0u; n < params.iterations; n = n + 1u) {
        a = fma(a, m, k);
        b = fma(b, m, k);
        c = fma(c, m, k);
        d = fma(d, m, k);
    }
    data[i] = a + b + c + d;
}
"#;

/// What went wrong, named after what failed.
#[derive(Debug)]
enum Failure {
    Usage(String),
    NoAdapter { wanted: Option<String>, seen: Vec<String> },
    RequestDevice(wgpu::RequestDeviceError),
    Poll(wgpu::PollError),
    ReadbackNotMapped,
    CalibrationOutOfRange { iterations: u64, gpu_ms: f64 },
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Usage(why) => write!(f, "{why}\n{USAGE}"),
            Failure::NoAdapter { wanted: None, seen } => {
                write!(f, "no Vulkan adapter (others seen: {})", list(seen))
            }
            Failure::NoAdapter { wanted: Some(name), seen } => {
                write!(f, "no Vulkan adapter named like {name:?} (seen: {})", list(seen))
            }
            Failure::RequestDevice(e) => write!(f, "requesting a device failed: {e}"),
            Failure::Poll(e) => write!(f, "waiting for a submission failed: {e}"),
            Failure::ReadbackNotMapped => {
                write!(f, "a finished submission's timestamp buffer was not mapped")
            }
            Failure::CalibrationOutOfRange { iterations, gpu_ms } => write!(
                f,
                "calibration failed: {iterations} iterations took {gpu_ms:.4} ms; give --iterations"
            ),
        }
    }
}

fn list(names: &[String]) -> String {
    if names.is_empty() { "none".into() } else { names.join(", ") }
}

const USAGE: &str = "usage: wgpu-loop [--ms 3.4] [--in-flight 4] [--seconds 6] [--warmup 0.5] \
[--iterations N] [--workgroups 4096] [--adapter NAME] [--gap-ms 0] [--calibrate] [--no-timestamps]";

struct Options {
    ms: f64,
    in_flight: usize,
    seconds: f64,
    warmup: f64,
    iterations: Option<u32>,
    workgroups: u32,
    adapter: Option<String>,
    calibrate_only: bool,
    /// Not even ask for timestamps (to try the path of a device without them).
    no_timestamps: bool,
    /// Host sleep after each submission: natively, the idle gaps a share would make.
    gap: Duration,
}

impl Options {
    fn parse(args: impl Iterator<Item = String>) -> Result<Options, Failure> {
        let mut o = Options {
            ms: 3.4,
            in_flight: 4,
            seconds: 6.0,
            warmup: 0.5,
            iterations: None,
            workgroups: 4096,
            adapter: None,
            calibrate_only: false,
            no_timestamps: false,
            gap: Duration::ZERO,
        };
        let mut args = args;
        while let Some(arg) = args.next() {
            if arg == "--calibrate" || arg == "--no-timestamps" {
                o.calibrate_only |= arg == "--calibrate";
                o.no_timestamps |= arg == "--no-timestamps";
                continue;
            }
            let mut value =
                |name: &str| args.next().ok_or_else(|| Failure::Usage(format!("{name} needs a value")));
            match arg.as_str() {
                "--ms" => o.ms = number(&arg, &value(&arg)?, 0.001, 10_000.0)?,
                "--in-flight" => o.in_flight = number(&arg, &value(&arg)?, 1.0, 64.0)? as usize,
                "--seconds" => o.seconds = number(&arg, &value(&arg)?, 0.01, 3600.0)?,
                "--warmup" => o.warmup = number(&arg, &value(&arg)?, 0.0, 600.0)?,
                "--iterations" => {
                    o.iterations = Some(number(&arg, &value(&arg)?, 1.0, f64::from(u32::MAX))? as u32)
                }
                "--workgroups" => o.workgroups = number(&arg, &value(&arg)?, 1.0, 65535.0)? as u32,
                "--adapter" => o.adapter = Some(value(&arg)?),
                "--gap-ms" => {
                    o.gap = Duration::from_secs_f64(number(&arg, &value(&arg)?, 0.0, 10_000.0)? / 1e3)
                }
                "-h" | "--help" => return Err(Failure::Usage("".into())),
                other => return Err(Failure::Usage(format!("unknown argument {other:?}"))),
            }
        }
        if o.in_flight == 0 {
            return Err(Failure::Usage("--in-flight must be at least 1".into()));
        }
        Ok(o)
    }
}

/// VALUE as a number in [LOW, HIGH]; whole numbers where the option counts something.
fn number(option: &str, value: &str, low: f64, high: f64) -> Result<f64, Failure> {
    match value.parse::<f64>() {
        Ok(v) if v.is_finite() && (low..=high).contains(&v) => Ok(v),
        _ => Err(Failure::Usage(format!("{option} {value:?}: want a number from {low} to {high}"))),
    }
}

/// One in-flight slot: the pass's two timestamps, resolved, then copied to a buffer the host maps.
struct Slot {
    queries: Option<wgpu::QuerySet>,
    resolve: Option<wgpu::Buffer>,
    readback: Option<wgpu::Buffer>,
    /// 0: idle or pending; 1: mapped; 2: the mapping failed. Set by wgpu's map callback.
    mapped: Arc<AtomicU8>,
}

/// The device, the pipeline and the ring of slots.
struct Loop {
    device: wgpu::Device,
    queue: wgpu::Queue,
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    params: wgpu::Buffer,
    slots: Vec<Slot>,
    /// Nanoseconds per timestamp tick; `None` without `Features::TIMESTAMP_QUERY`.
    tick_ns: Option<f64>,
    workgroups: u32,
}

/// What a run of submissions measured.
#[derive(Default)]
struct Measured {
    submissions: u64,
    wall: Duration,
    /// GPU milliseconds per submission, from its pass's timestamps (empty without them).
    gpu_ms: Vec<f64>,
    /// Submissions whose stamps could not be used (end before begin, or zero).
    bad_stamps: u64,
}

/// How long to keep submitting.
#[derive(Clone, Copy)]
enum Until {
    Count(u64),
    Elapsed(Duration),
}

impl Loop {
    fn new(options: &Options) -> Result<(Loop, wgpu::AdapterInfo), Failure> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = wgpu::Backends::VULKAN;
        // Lavapipe reports no Vulkan conformance; wgpu hides such adapters unless told not to.
        desc.flags = wgpu::InstanceFlags::from_env_or_default()
            | wgpu::InstanceFlags::ALLOW_UNDERLYING_NONCOMPLIANT_ADAPTER;
        let instance = wgpu::Instance::new(desc);
        let adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::VULKAN));
        let seen: Vec<String> = adapters.iter().map(|a| a.get_info().name).collect();
        let adapter = adapters
            .into_iter()
            .find(|a| match &options.adapter {
                None => true,
                Some(name) => a.get_info().name.to_lowercase().contains(&name.to_lowercase()),
            })
            .ok_or_else(|| Failure::NoAdapter { wanted: options.adapter.clone(), seen })?;
        let info = adapter.get_info();
        let timestamps =
            !options.no_timestamps && adapter.features().contains(wgpu::Features::TIMESTAMP_QUERY);
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("wgpu-loop"),
            required_features: if timestamps {
                wgpu::Features::TIMESTAMP_QUERY
            } else {
                wgpu::Features::empty()
            },
            required_limits: adapter.limits(),
            ..Default::default()
        }))
        .map_err(Failure::RequestDevice)?;
        // A validation error or a lost device is a failed run, reported as such, not a panic.
        device.on_uncaptured_error(Arc::new(|error: wgpu::Error| {
            eprintln!("wgpu-loop: wgpu error: {error}");
            std::process::exit(1);
        }));
        device.set_device_lost_callback(|reason, message| {
            if reason != wgpu::DeviceLostReason::Destroyed {
                eprintln!("wgpu-loop: device lost ({reason:?}): {message}");
                std::process::exit(1);
            }
        });

        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("fma"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
        let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("fma"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let invocations = u64::from(options.workgroups) * u64::from(WORKGROUP_SIZE);
        let data = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("data"),
            size: invocations * 16,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: false,
        });
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: 16,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let bind_group = device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("fma"),
            layout: &pipeline.get_bind_group_layout(0),
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: data.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: params.as_entire_binding() },
            ],
        });
        let slots = (0..options.in_flight)
            .map(|_| Slot {
                queries: timestamps.then(|| {
                    device.create_query_set(&wgpu::QuerySetDescriptor {
                        label: Some("pass"),
                        ty: wgpu::QueryType::Timestamp,
                        count: 2,
                    })
                }),
                resolve: timestamps.then(|| {
                    device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("resolve"),
                        size: 16,
                        usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                        mapped_at_creation: false,
                    })
                }),
                readback: timestamps.then(|| {
                    device.create_buffer(&wgpu::BufferDescriptor {
                        label: Some("readback"),
                        size: 16,
                        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                        mapped_at_creation: false,
                    })
                }),
                mapped: Arc::new(AtomicU8::new(0)),
            })
            .collect();
        let tick_ns = timestamps.then(|| f64::from(queue.get_timestamp_period()));
        let this = Loop {
            device,
            queue,
            pipeline,
            bind_group,
            params,
            slots,
            tick_ns,
            workgroups: options.workgroups,
        };
        Ok((this, info))
    }

    fn set_iterations(&self, iterations: u32) -> Result<(), Failure> {
        self.queue.write_buffer(&self.params, 0, &iterations.to_le_bytes());
        // Let the write land before timing anything.
        let index = self.queue.submit([]);
        self.wait(index)
    }

    fn wait(&self, index: wgpu::SubmissionIndex) -> Result<(), Failure> {
        self.device
            .poll(wgpu::PollType::Wait { submission_index: Some(index), timeout: None })
            .map(|_| ())
            .map_err(Failure::Poll)
    }

    /// One compute pass, its stamps resolved into slot `k`, in one submission.
    fn submit(&self, k: usize) -> wgpu::SubmissionIndex {
        let slot = &self.slots[k];
        let mut encoder = self.device.create_command_encoder(&Default::default());
        {
            let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("fma"),
                timestamp_writes: slot.queries.as_ref().map(|query_set| wgpu::ComputePassTimestampWrites {
                    query_set,
                    beginning_of_pass_write_index: Some(0),
                    end_of_pass_write_index: Some(1),
                }),
            });
            pass.set_pipeline(&self.pipeline);
            pass.set_bind_group(0, &self.bind_group, &[]);
            pass.dispatch_workgroups(self.workgroups, 1, 1);
        }
        if let (Some(queries), Some(resolve), Some(readback)) = (&slot.queries, &slot.resolve, &slot.readback)
        {
            encoder.resolve_query_set(queries, 0..2, resolve, 0);
            encoder.copy_buffer_to_buffer(resolve, 0, readback, 0, 16);
            slot.mapped.store(0, Ordering::Relaxed);
            let mapped = Arc::clone(&slot.mapped);
            encoder.map_buffer_on_submit(readback, wgpu::MapMode::Read, .., move |result| {
                mapped.store(if result.is_ok() { 1 } else { 2 }, Ordering::Release);
            });
        }
        self.queue.submit([encoder.finish()])
    }

    /// The GPU milliseconds of slot `k`'s finished pass (`Ok(None)`: unusable stamps), and the
    /// slot made free again.
    fn read(&self, k: usize) -> Result<Option<f64>, Failure> {
        let (Some(readback), Some(tick_ns)) = (&self.slots[k].readback, self.tick_ns) else {
            return Ok(None);
        };
        if self.slots[k].mapped.load(Ordering::Acquire) != 1 {
            return Err(Failure::ReadbackNotMapped);
        }
        let stamps = {
            let view = readback.get_mapped_range(..).map_err(|_| Failure::ReadbackNotMapped)?;
            let word = |i: usize| u64::from_le_bytes(view[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
            (word(0), word(1))
        };
        readback.unmap();
        let (begin, end) = stamps;
        Ok((begin != 0 && end > begin).then(|| (end - begin) as f64 * tick_ns / 1e6))
    }

    /// Submits passes, keeping `in_flight` outstanding, waiting for the oldest, sleeping `gap`
    /// after each, until `until`; then waits for all of them.
    fn run(&self, until: Until, gap: Duration) -> Result<Measured, Failure> {
        let mut measured = Measured::default();
        let mut outstanding: VecDeque<(usize, wgpu::SubmissionIndex)> = VecDeque::new();
        let start = Instant::now();
        let mut next = 0usize;
        loop {
            let more = match until {
                Until::Count(n) => measured.submissions < n,
                Until::Elapsed(d) => start.elapsed() < d,
            };
            if !more {
                break;
            }
            if outstanding.len() == self.slots.len() {
                self.retire(&mut outstanding, &mut measured)?;
            }
            outstanding.push_back((next, self.submit(next)));
            next = (next + 1) % self.slots.len();
            measured.submissions += 1;
            if !gap.is_zero() {
                std::thread::sleep(gap);
            }
        }
        while !outstanding.is_empty() {
            self.retire(&mut outstanding, &mut measured)?;
        }
        measured.wall = start.elapsed();
        Ok(measured)
    }

    fn retire(
        &self,
        outstanding: &mut VecDeque<(usize, wgpu::SubmissionIndex)>,
        measured: &mut Measured,
    ) -> Result<(), Failure> {
        let Some((k, index)) = outstanding.pop_front() else { return Ok(()) };
        self.wait(index)?;
        match self.read(k)? {
            Some(ms) => measured.gpu_ms.push(ms),
            None if self.tick_ns.is_some() => measured.bad_stamps += 1,
            None => {}
        }
        Ok(())
    }

    /// Milliseconds one pass of `iterations` takes: the median of 8 by GPU timestamps, or without
    /// them the wall time of one submission waited for alone (median of 5).
    fn time_pass(&self, iterations: u32) -> Result<f64, Failure> {
        self.set_iterations(iterations)?;
        if self.tick_ns.is_some() {
            let m = self.run(Until::Count(8), Duration::ZERO)?;
            if let Some(ms) = median(&m.gpu_ms) {
                return Ok(ms);
            }
        }
        let mut walls = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            let index = self.submit(0);
            self.wait(index)?;
            let _ = self.read(0);
            walls.push(t.elapsed().as_secs_f64() * 1e3);
        }
        Ok(median(&walls).unwrap_or(0.0))
    }

    /// An iteration count for which one pass takes about `target_ms`. The dispatch is halved while
    /// one iteration alone takes over a quarter of the target (a slow device: lavapipe); the count
    /// grows by 8 until a pass takes a tenth of the target; then, on a warm GPU, a secant search
    /// kept inside the bracket of counts known too short and too long (bisected where the secant
    /// leaves it: timings are noisy) until within 3 %. The count closest to the target wins.
    fn calibrate(&mut self, target_ms: f64) -> Result<(u32, f64), Failure> {
        let mut ms = self.time_pass(1)?;
        while ms > target_ms / 4.0 && self.workgroups > 1 {
            self.workgroups /= 2;
            ms = self.time_pass(1)?;
        }
        let mut iterations: u64 = 1;
        while ms < target_ms / 10.0 && iterations < u64::from(u32::MAX) / 8 {
            iterations *= 8;
            ms = self.time_pass(iterations as u32)?;
        }
        // Half a second of back-to-back passes first: a GPU that was idle runs at a low clock, and
        // counts fitted to it would make passes shorter than the target once the clock is up.
        self.run(Until::Elapsed(Duration::from_millis(500)), Duration::ZERO)?;
        let mut points = vec![(1.0_f64, self.time_pass(1)?)];
        if iterations > 1 {
            points.push((iterations as f64, self.time_pass(iterations as u32)?));
        }
        let miss = |t: f64| (t / target_ms).ln().abs();
        for _ in 0..10 {
            let &(i2, t2) = points.last().unwrap_or(&(1.0, target_ms));
            if (t2 - target_ms).abs() <= target_ms * 0.03 {
                break;
            }
            let short = points.iter().filter(|p| p.1 < target_ms).map(|p| p.0).fold(1.0, f64::max);
            let long = points.iter().filter(|p| p.1 > target_ms).map(|p| p.0).fold(f64::INFINITY, f64::min);
            let (i1, t1) = points[points.len().saturating_sub(2)];
            let slope = if i2 != i1 { (t2 - t1) / (i2 - i1) } else { 0.0 };
            let mut next = if slope > 0.0 { i2 + (target_ms - t2) / slope } else { i2 * target_ms / t2 };
            if !next.is_finite() || next <= short || next >= long {
                next = if long.is_finite() { (short * long).sqrt() } else { short * 8.0 };
            }
            let next = next.round().clamp(1.0, f64::from(u32::MAX));
            if points.iter().any(|p| p.0 == next) {
                break; // the bracket has closed on whole counts
            }
            points.push((next, self.time_pass(next as u32)?));
        }
        let (best, ms) =
            points.iter().copied().min_by(|a, b| miss(a.1).total_cmp(&miss(b.1))).unwrap_or((1.0, 0.0));
        let iterations = best as u32;
        if !(ms > target_ms * 0.5 && ms < target_ms * 2.0) {
            return Err(Failure::CalibrationOutOfRange { iterations: u64::from(iterations), gpu_ms: ms });
        }
        // What the chosen count takes now, warm, as the run will see it.
        Ok((iterations, self.time_pass(iterations)?))
    }
}

fn median(values: &[f64]) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 })
}

fn percentile(values: &[f64], p: f64) -> Option<f64> {
    if values.is_empty() {
        return None;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let i = ((v.len() - 1) as f64 * p).round() as usize;
    Some(v[i])
}

fn run() -> Result<(), Failure> {
    let options = Options::parse(std::env::args().skip(1))?;
    let (mut gpu, info) = Loop::new(&options)?;
    println!("adapter={}", info.name);
    println!("backend={}", format!("{:?}", info.backend).to_lowercase());
    println!("driver={} {}", info.driver, info.driver_info);
    println!("timestamps={}", u8::from(gpu.tick_ns.is_some()));
    if let Some(tick_ns) = gpu.tick_ns {
        println!("timestamp_period_ns={tick_ns}");
    }

    let iterations = match options.iterations {
        Some(n) => {
            gpu.set_iterations(n)?;
            n
        }
        None => {
            let (n, ms) = gpu.calibrate(options.ms)?;
            println!("calibration_ms={ms:.4}");
            gpu.set_iterations(n)?;
            n
        }
    };
    println!("workgroups={}", gpu.workgroups);
    println!("in_flight={}", options.in_flight);
    println!("gap_ms={}", options.gap.as_secs_f64() * 1e3);
    if options.calibrate_only {
        println!("iterations={iterations}");
        return Ok(());
    }

    if options.warmup > 0.0 {
        gpu.run(Until::Elapsed(Duration::from_secs_f64(options.warmup)), options.gap)?;
    }
    // The measured window in Unix time, so a script can pick out what it sampled meanwhile (clocks).
    let unix = || SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64());
    let window_start = unix();
    let m = gpu.run(Until::Elapsed(Duration::from_secs_f64(options.seconds)), options.gap)?;
    let window_end = unix();
    let seconds = m.wall.as_secs_f64();
    println!("window_start_unix={window_start:.3}");
    println!("window_end_unix={window_end:.3}");
    println!("submissions={}", m.submissions);
    println!("seconds={seconds:.4}");
    println!("per_second={:.2}", m.submissions as f64 / seconds);
    if let (Some(mean), Some(med)) = (
        (!m.gpu_ms.is_empty()).then(|| m.gpu_ms.iter().sum::<f64>() / m.gpu_ms.len() as f64),
        median(&m.gpu_ms),
    ) {
        println!("gpu_ms_mean={mean:.4}");
        println!("gpu_ms_median={med:.4}");
        println!("gpu_ms_p10={:.4}", percentile(&m.gpu_ms, 0.1).unwrap_or(0.0));
        println!("gpu_ms_p90={:.4}", percentile(&m.gpu_ms, 0.9).unwrap_or(0.0));
        println!("gpu_busy={:.4}", m.gpu_ms.iter().sum::<f64>() / 1e3 / seconds);
        println!("timed_submissions={}", m.gpu_ms.len());
    }
    if gpu.tick_ns.is_some() {
        println!("bad_stamps={}", m.bad_stamps);
    }
    println!("iterations={iterations}");
    Ok(())
}

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("wgpu-loop: {e}");
            ExitCode::from(if matches!(e, Failure::Usage(_)) { 2 } else { 1 })
        }
    }
}
