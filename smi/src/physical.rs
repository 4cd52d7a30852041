//! The physical devices as the NVIDIA driver sees them (through NVML, loaded at run time by
//! `nvml-wrapper`): total and used memory and the processes on each, matched to a region's devices
//! by UUID. Without a driver, a reason to show instead.

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::struct_wrappers::device::ProcessInfo;

/// What no driver leaves us to say.
pub const NO_DRIVER: &str = "no NVIDIA driver: physical view unavailable";

/// One physical GPU.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PhysicalDevice {
    /// NVML's index (PCI order, which need not be any container's CUDA order).
    pub index: u32,
    pub uuid: String,
    /// The product name, when the driver tells it.
    pub name: Option<String>,
    pub total: u64,
    pub used: u64,
    /// Processes with a context on it (every container's, and any outside containers), as the
    /// driver sees them: host pids.
    pub processes: Vec<PhysicalProcess>,
    /// How many processes run on it as MPS clients, by the driver's MPS process list; `None` when
    /// the driver cannot say.
    pub mps_clients: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PhysicalProcess {
    pub pid: u32,
    /// Its device memory, when the driver tells it.
    pub used: Option<u64>,
    /// In the driver's graphics process list (OpenGL, Vulkan, codecs), whether or not it is in the
    /// compute list too.
    pub graphics: bool,
}

/// The driver's view: its devices, or why there is none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PhysicalView {
    Devices(Vec<PhysicalDevice>),
    Unavailable(String),
}

impl PhysicalView {
    /// The device with this UUID (`GPU-…`, compared without regard to case).
    pub fn by_uuid(&self, uuid: &str) -> Option<&PhysicalDevice> {
        match self {
            PhysicalView::Devices(devices) => devices.iter().find(|d| d.uuid.eq_ignore_ascii_case(uuid)),
            PhysicalView::Unavailable(_) => None,
        }
    }
}

/// NVML, started once (a `watch` or `serve` asks it again on every round).
pub struct Driver {
    nvml: Result<Nvml, String>,
}

impl Driver {
    /// Loads `libnvidia-ml.so.1` and starts NVML; a machine without the driver gets a reason.
    pub fn start() -> Driver {
        let nvml = Nvml::init().map_err(|error| match error {
            NvmlError::LibloadingError(_) => NO_DRIVER.to_owned(),
            other => {
                format!("NVIDIA driver present but NVML did not start ({other}): physical view unavailable")
            }
        });
        Driver { nvml }
    }

    /// Every device the driver lists; a device that cannot be read is left out.
    pub fn view(&self) -> PhysicalView {
        let nvml = match &self.nvml {
            Ok(nvml) => nvml,
            Err(reason) => return PhysicalView::Unavailable(reason.clone()),
        };
        let count = match nvml.device_count() {
            Ok(count) => count,
            Err(error) => return PhysicalView::Unavailable(format!("NVML lists no devices ({error})")),
        };
        let devices = (0..count)
            .filter_map(|index| {
                let device = nvml.device_by_index(index).ok()?;
                let memory = device.memory_info().ok()?;
                let mut processes: Vec<PhysicalProcess> = Vec::new();
                let running = [
                    (device.running_compute_processes(), false),
                    (device.running_graphics_processes(), true),
                ];
                for (list, graphics) in running {
                    for info in list.into_iter().flatten() {
                        match processes.iter_mut().find(|p| p.pid == info.pid) {
                            Some(known) => known.graphics |= graphics,
                            None => processes.push(process(&info, graphics)),
                        }
                    }
                }
                processes.sort_by_key(|p| p.pid);
                let mps_clients = device.mps_running_compute_processes().ok().map(|list| list.len() as u32);
                Some(PhysicalDevice {
                    index,
                    uuid: device.uuid().ok()?,
                    name: device.name().ok(),
                    total: memory.total,
                    used: memory.used,
                    processes,
                    mps_clients,
                })
            })
            .collect();
        PhysicalView::Devices(devices)
    }
}

fn process(info: &ProcessInfo, graphics: bool) -> PhysicalProcess {
    let used = match info.used_gpu_memory {
        UsedGpuMemory::Used(bytes) => Some(bytes),
        UsedGpuMemory::Unavailable => None,
    };
    PhysicalProcess { pid: info.pid, used, graphics }
}
