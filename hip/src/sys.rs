//! The HIP runtime's types, status codes and struct layouts that libvgpu_hip uses, as ROCm 5.2's
//! `hip_runtime_api.h` (Debian 12's `libamdhip64-dev`) declares them; the 6.x additions are from
//! AMD's documentation and were never checked against a 6.x header or runtime here.
//!
//! Nothing outside this module reads a raw HIP struct: the accessors below do, by offset.

use std::ffi::c_void;

/// `hipError_t`.
pub type HipError = i32;
/// `hipDevice_t`: a HIP ordinal.
pub type HipDevice = i32;
/// `hipMemGenericAllocationHandle_t`: an opaque runtime pointer, kept as a number.
pub type MemHandle = u64;
/// `hipStream_t`, `hipMemPool_t`, `hipArray_t`: opaque runtime handles, never dereferenced.
pub type Opaque = *mut c_void;

pub const HIP_SUCCESS: HipError = 0;
pub const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
pub const HIP_ERROR_NOT_INITIALIZED: HipError = 3;
pub const HIP_ERROR_NOT_FOUND: HipError = 500;
pub const HIP_ERROR_UNKNOWN: HipError = 999;

/// `hipDeviceProp_t` of ROCm 5.x (the symbol `hipGetDeviceProperties`, 792 bytes there):
/// `char name[256]`, then `size_t totalGlobalMem`.
pub const PROP_R0000_TOTAL_GLOBAL_MEM: usize = 256;
/// `hipDeviceProp_tR0600` (ROCm 6.x, `hipGetDevicePropertiesR0600`, which the 6.x header's
/// `hipGetDeviceProperties` macro names): `char name[256]`, `hipUUID uuid` (16), `char luid[8]`,
/// `unsigned luidDeviceNodeMask`, padding, then `size_t totalGlobalMem` at 288.
pub const PROP_R0600_TOTAL_GLOBAL_MEM: usize = 288;

/// The first runtime version with the 6.x `hipMemAllocationProp` layout.
pub const VERSION_6: i32 = 60_000_000;

/// Where `hipMemAllocationProp` keeps `location.type` and `location.id` (32 bytes in both
/// layouts). ROCm 5.x: `unsigned char compressionType` first, the location at 4. ROCm 6.x (AMD's
/// documentation, CUDA's order): `type`, `requestedHandleType`, then the location at 8.
pub fn location_offsets(runtime_version: i32) -> (usize, usize) {
    if runtime_version >= VERSION_6 { (8, 12) } else { (4, 8) }
}

/// `hipMemLocationTypeDevice`.
pub const MEM_LOCATION_TYPE_DEVICE: i32 = 1;

/// Reads the device a `hipMemAllocationProp` places its memory on, if it is a device location.
///
/// # Safety
/// `prop` is NULL or points to a `hipMemAllocationProp` of the runtime's layout (32 bytes).
pub unsafe fn allocation_device(prop: *const u8, runtime_version: i32) -> Option<HipDevice> {
    if prop.is_null() {
        return None;
    }
    let (type_at, id_at) = location_offsets(runtime_version);
    // SAFETY: both offsets plus 4 lie within the 32-byte struct the caller vouches for.
    let (kind, id) = unsafe {
        (prop.add(type_at).cast::<i32>().read_unaligned(), prop.add(id_at).cast::<i32>().read_unaligned())
    };
    (kind == MEM_LOCATION_TYPE_DEVICE).then_some(id)
}

/// `hipMemcpyKind` values that say where a copy runs: device to device (also without compute
/// units, `hipMemcpyDeviceToDeviceNoCU`, ROCm 6.x), and "the runtime decides from the addresses".
pub const MEMCPY_DEVICE_TO_DEVICE: i32 = 3;
pub const MEMCPY_DEFAULT: i32 = 4;
pub const MEMCPY_DEVICE_TO_DEVICE_NO_CU: i32 = 1024;

/// `hipMemoryType`, whose values changed in ROCm 6.0 (5.x: host 0, device 1, array 2, unified 3,
/// managed 4; 6.x, CUDA's: unregistered 0, host 1, device 2, managed 3, array 10, unified 11).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryTypes {
    pub device: i32,
    pub array: i32,
    pub unified: i32,
    pub managed: i32,
}

pub fn memory_types(runtime_version: i32) -> MemoryTypes {
    if runtime_version >= VERSION_6 {
        MemoryTypes { device: 2, array: 10, unified: 11, managed: 3 }
    } else {
        MemoryTypes { device: 1, array: 2, unified: 3, managed: 4 }
    }
}

/// `hipPointerAttribute_t`: 32 bytes in both layouts, the memory type first, `int isManaged` at
/// 24 (ROCm 5.0 and 6.x documentation).
pub type PointerAttributes = [u64; 4];

/// Whether a `hipPointerAttribute_t` the runtime filled describes device or managed memory.
pub fn describes_device_memory(attributes: &PointerAttributes, runtime_version: i32) -> bool {
    let kind = attributes[0] as u32 as i32;
    let managed = attributes[3] as u32 != 0;
    let types = memory_types(runtime_version);
    kind == types.device || kind == types.managed || managed
}

/// The ends and kind of a `hipMemcpy3DParms`: `srcArray` at 0, `srcPos` (3 × size_t),
/// `srcPtr` (a `hipPitchedPtr`) at 32, the same for the destination from 64, `extent` at 128,
/// `kind` at 152. Leading fields of every version (ROCm 4.x appended driver-style fields after).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Copy3d {
    pub src_array: usize,
    pub src_ptr: usize,
    pub dst_array: usize,
    pub dst_ptr: usize,
    pub kind: i32,
}

/// Reads a `hipMemcpy3DParms`.
///
/// # Safety
/// `p` is NULL or points to a `hipMemcpy3DParms` (at least 156 bytes).
pub unsafe fn copy_3d(p: *const u8) -> Option<Copy3d> {
    if p.is_null() {
        return None;
    }
    // SAFETY: every offset plus its field's size lies within the struct the caller vouches for.
    let word = |at: usize| unsafe { p.add(at).cast::<usize>().read_unaligned() };
    Some(Copy3d {
        src_array: word(0),
        src_ptr: word(32),
        dst_array: word(64),
        dst_ptr: word(96),
        // SAFETY: as above.
        kind: unsafe { p.add(152).cast::<i32>().read_unaligned() },
    })
}

/// The ends of a copy described driver-style (`hip_Memcpy2D`, `HIP_MEMCPY3D`): each end's memory
/// type (a `hipMemoryType` of the runtime's numbering, [`memory_types`]) and device address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TypedEnds {
    pub src_type: i32,
    pub src_device: usize,
    pub dst_type: i32,
    pub dst_device: usize,
}

/// Reads a `hip_Memcpy2D` (128 bytes, the same in ROCm 5.x and 6.x: `srcMemoryType` at 16,
/// `srcDevice` at 32; `dstMemoryType` at 72, `dstDevice` at 88).
///
/// # Safety
/// `p` is NULL or points to a `hip_Memcpy2D`.
pub unsafe fn param_2d(p: *const u8) -> Option<TypedEnds> {
    if p.is_null() {
        return None;
    }
    // SAFETY: every offset plus its field's size lies within the 128-byte struct.
    unsafe {
        Some(TypedEnds {
            src_type: p.add(16).cast::<i32>().read_unaligned(),
            src_device: p.add(32).cast::<usize>().read_unaligned(),
            dst_type: p.add(72).cast::<i32>().read_unaligned(),
            dst_device: p.add(88).cast::<usize>().read_unaligned(),
        })
    }
}

/// `HIP_MEMCPY3D` (`hipDrvMemcpy3D`), field for field, its positions, pitches and sizes of width
/// `W`: `unsigned int` in ROCm 5.x (5.2's `driver_types.h`; 128 bytes), `size_t` from ROCm 6.0
/// (AMD's 6.0 documentation of the struct; 184 bytes), which moves every field after `srcXInBytes`.
/// Only its ends are read ([`drv_copy_3d`]); the other fields give the layout.
#[repr(C)]
#[allow(dead_code)]
struct HipMemcpy3d<W> {
    src_x_in_bytes: W,
    src_y: W,
    src_z: W,
    src_lod: W,
    src_memory_type: i32,
    src_host: usize,
    src_device: usize,
    src_array: usize,
    src_pitch: W,
    src_height: W,
    dst_x_in_bytes: W,
    dst_y: W,
    dst_z: W,
    dst_lod: W,
    dst_memory_type: i32,
    dst_host: usize,
    dst_device: usize,
    dst_array: usize,
    dst_pitch: W,
    dst_height: W,
    width_in_bytes: W,
    height: W,
    depth: W,
}

/// ROCm 5.x's `HIP_MEMCPY3D`.
type HipMemcpy3dR5 = HipMemcpy3d<u32>;
/// ROCm 6.x's `HIP_MEMCPY3D`.
type HipMemcpy3dR6 = HipMemcpy3d<usize>;

// The 5.x layout, measured with ROCm 5.2's header (gcc, x86_64); the 6.x one by the C rules from
// AMD's documentation.
const _: () = assert!(size_of::<HipMemcpy3dR5>() == 128);
const _: () = assert!(std::mem::offset_of!(HipMemcpy3dR5, src_memory_type) == 16);
const _: () = assert!(std::mem::offset_of!(HipMemcpy3dR5, src_device) == 32);
const _: () = assert!(std::mem::offset_of!(HipMemcpy3dR5, dst_memory_type) == 72);
const _: () = assert!(std::mem::offset_of!(HipMemcpy3dR5, dst_device) == 88);
const _: () = assert!(size_of::<HipMemcpy3dR6>() == 184);
const _: () = assert!(std::mem::offset_of!(HipMemcpy3dR6, src_memory_type) == 32);
const _: () = assert!(std::mem::offset_of!(HipMemcpy3dR6, src_device) == 48);
const _: () = assert!(std::mem::offset_of!(HipMemcpy3dR6, dst_memory_type) == 112);
const _: () = assert!(std::mem::offset_of!(HipMemcpy3dR6, dst_device) == 128);

/// Reads the ends of a `HIP_MEMCPY3D` in the layout of `runtime_version`'s major release: a
/// program built against a 5.x header runs on `libamdhip64.so.5`, one built against 6.x on
/// `.so.6`, so the runtime's version says which header the struct came from.
///
/// # Safety
/// `p` is NULL or points to a `HIP_MEMCPY3D` of the runtime's layout.
pub unsafe fn drv_copy_3d(p: *const u8, runtime_version: i32) -> Option<TypedEnds> {
    fn ends<W>(copy: HipMemcpy3d<W>) -> TypedEnds {
        TypedEnds {
            src_type: copy.src_memory_type,
            src_device: copy.src_device,
            dst_type: copy.dst_memory_type,
            dst_device: copy.dst_device,
        }
    }
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller vouches for a whole struct of this layout; every field is an integer,
    // valid for any bits, and the read needs no alignment.
    unsafe {
        Some(if runtime_version >= VERSION_6 {
            ends(p.cast::<HipMemcpy3dR6>().read_unaligned())
        } else {
            ends(p.cast::<HipMemcpy3dR5>().read_unaligned())
        })
    }
}

/// `hipMemPoolAttr`: the pool's backing memory and what of it is handed out (`uint64_t` each).
pub const POOL_ATTR_RESERVED_MEM_CURRENT: i32 = 5;
pub const POOL_ATTR_USED_MEM_CURRENT: i32 = 7;

/// Where a pool of `hipMemPoolProps` keeps its memory: `Some(device)` for a device location, `None`
/// for any other (host). The location is at 8 (`type`) and 12 (`id`) in ROCm 5.x and 6.x.
///
/// # Safety
/// `props` is non-null and points to a `hipMemPoolProps`.
pub unsafe fn pool_location(props: *const u8) -> Option<HipDevice> {
    // SAFETY: both offsets plus 4 lie within the struct (88 bytes or more).
    let (kind, id) = unsafe {
        (props.add(8).cast::<i32>().read_unaligned(), props.add(12).cast::<i32>().read_unaligned())
    };
    (kind == MEM_LOCATION_TYPE_DEVICE).then_some(id)
}

/// `dim3`: a launch's grid or block size.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}

/// `hipStreamPerThread`: the per-thread default stream, which a `_spt` call's NULL stream means.
pub const STREAM_PER_THREAD: usize = 2;

/// `hipChannelFormatDesc`: bits per channel x, y, z, w and a kind.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ChannelFormatDesc {
    pub x: i32,
    pub y: i32,
    pub z: i32,
    pub w: i32,
    pub f: i32,
}

impl ChannelFormatDesc {
    pub fn element_bytes(&self) -> u64 {
        [self.x, self.y, self.z, self.w].iter().map(|&bits| bits.max(0) as u64).sum::<u64>() / 8
    }
}

/// `hipExtent`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Extent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

/// `hipPitchedPtr`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct PitchedPtr {
    pub ptr: *mut c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `HIP_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: i32,
    pub num_channels: u32,
}

/// `HIP_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: i32,
    pub num_channels: u32,
    pub flags: u32,
}

// Sizes of ROCm 5.2's structs, measured with its header (gcc, x86_64).
const _: () = assert!(size_of::<Dim3>() == 12);
const _: () = assert!(size_of::<ChannelFormatDesc>() == 20);
const _: () = assert!(size_of::<Extent>() == 24);
const _: () = assert!(size_of::<PitchedPtr>() == 32);
const _: () = assert!(size_of::<ArrayDescriptor>() == 24);
const _: () = assert!(size_of::<Array3dDescriptor>() == 40);

/// Bytes of one channel of a `hipArray_Format` (`HIP_AD_FORMAT_*`: 8-bit 0x01/0x08, 16-bit
/// 0x02/0x09/half 0x10, 32-bit 0x03/0x0a/float 0x20).
pub fn format_bytes(format: i32) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        _ => 4,
    }
}

/// `rsmi_status_t` values (rocm_smi.h).
pub const RSMI_STATUS_SUCCESS: i32 = 0;
pub const RSMI_STATUS_NOT_SUPPORTED: i32 = 2;
pub const RSMI_STATUS_INIT_ERROR: i32 = 8;
/// `RSMI_MEM_TYPE_VRAM`: the device's own memory (the others are the visible part of it and GTT,
/// host memory the GPU maps).
pub const RSMI_MEM_TYPE_VRAM: i32 = 0;

/// `amdsmi_status_t` values (AMD SMI's `amdsmi.h`).
pub const AMDSMI_STATUS_SUCCESS: i32 = 0;
pub const AMDSMI_STATUS_NOT_SUPPORTED: i32 = 2;
pub const AMDSMI_STATUS_NOT_INIT: i32 = 32;
/// `AMDSMI_STATUS_UNKNOWN_ERROR`, 0xFFFFFFFF.
pub const AMDSMI_STATUS_UNKNOWN_ERROR: i32 = -1;
/// `AMDSMI_MEM_TYPE_VRAM` of `amdsmi_memory_type_t` (then `VIS_VRAM` 1, `GTT` 2).
pub const AMDSMI_MEM_TYPE_VRAM: i32 = 0;
/// `AMDSMI_GPU_UUID_SIZE`: the smallest buffer `amdsmi_get_gpu_device_uuid` accepts (a 36-character
/// UUID and its NUL, rounded up).
pub const AMDSMI_GPU_UUID_SIZE: usize = 38;

/// `amdsmi_processor_handle`: an opaque pointer of libamd_smi's, never dereferenced.
pub type AmdSmiProcessor = *mut c_void;

/// `amdsmi_vram_usage_t`: the device's VRAM and what is in use, in MiB (AMD's "MB": bytes / 2^20).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VramUsage {
    pub vram_total: u32,
    pub vram_used: u32,
    pub reserved: [u32; 2],
}

const _: () = assert!(size_of::<VramUsage>() == 16);
