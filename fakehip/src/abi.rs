//! The HIP types and status codes the fake uses, as ROCm 5.2's `hip_runtime_api.h` declares them
//! (the 6.x additions from AMD's documentation, marked).

pub type HipError = i32;

pub const HIP_SUCCESS: HipError = 0;
pub const HIP_ERROR_INVALID_VALUE: HipError = 1;
pub const HIP_ERROR_OUT_OF_MEMORY: HipError = 2;
pub const HIP_ERROR_INVALID_SYMBOL: HipError = 13;
pub const HIP_ERROR_NO_DEVICE: HipError = 100;
pub const HIP_ERROR_INVALID_DEVICE: HipError = 101;
pub const HIP_ERROR_INVALID_HANDLE: HipError = 400;
pub const HIP_ERROR_NOT_FOUND: HipError = 500;
pub const HIP_ERROR_NOT_READY: HipError = 600;
pub const HIP_ERROR_NOT_SUPPORTED: HipError = 801;
pub const HIP_ERROR_UNKNOWN: HipError = 999;

/// `hipStreamPerThread`: the calling thread's default stream.
pub const STREAM_PER_THREAD: u64 = 2;

/// `hipMemcpyKind`.
pub const MEMCPY_DEVICE_TO_DEVICE: i32 = 3;
pub const MEMCPY_DEFAULT: i32 = 4;

/// `hipMemoryType`, whose values changed in ROCm 6.0: (host, device, array, unified, managed).
pub fn memory_types(version: i32) -> [i32; 5] {
    if version >= 60_000_000 { [1, 2, 10, 11, 3] } else { [0, 1, 2, 3, 4] }
}

/// `hipPointerAttribute_t` (32 bytes in both layouts): the memory type at 0, `int device` at 4,
/// `int isManaged` at 24.
pub const POINTER_ATTRIBUTES_SIZE: usize = 32;

/// `hipMemcpy3DParms`: `srcArray`, `srcPos` (3 × size_t), `srcPtr` (a `hipPitchedPtr`),
/// the same three for the destination, `extent`, then `kind`; the offsets of the fields read.
pub const P3D_SRC_ARRAY: usize = 0;
pub const P3D_SRC_PTR: usize = 32;
pub const P3D_DST_ARRAY: usize = 64;
pub const P3D_DST_PTR: usize = 96;
pub const P3D_EXTENT: usize = 128;
pub const P3D_KIND: usize = 152;

/// `hip_Memcpy2D` (16 fields, 128 bytes): the offsets of the fields read.
pub const P2D_SRC_MEMORY_TYPE: usize = 16;
pub const P2D_SRC_DEVICE: usize = 32;
pub const P2D_DST_MEMORY_TYPE: usize = 72;
pub const P2D_DST_DEVICE: usize = 88;
pub const P2D_WIDTH: usize = 112;
pub const P2D_HEIGHT: usize = 120;

/// `HIP_MEMCPY3D` (`hipDrvMemcpy3D`): its positions, pitches and sizes are `unsigned int` in ROCm
/// 5.x (128 bytes) and `size_t` from 6.0 (184 bytes), which moves the fields read: the offsets of
/// `srcMemoryType`, `srcDevice`, `dstMemoryType`, `dstDevice` and `WidthInBytes` (then `Height`
/// and `Depth`), and the width of those sizes.
pub struct Drv3dLayout {
    pub src_memory_type: usize,
    pub src_device: usize,
    pub dst_memory_type: usize,
    pub dst_device: usize,
    pub width: usize,
    pub size_bytes: usize,
}

pub fn drv_3d_layout(version: i32) -> Drv3dLayout {
    if version >= 60_000_000 {
        Drv3dLayout {
            src_memory_type: 32,
            src_device: 48,
            dst_memory_type: 112,
            dst_device: 128,
            width: 160,
            size_bytes: 8,
        }
    } else {
        Drv3dLayout {
            src_memory_type: 16,
            src_device: 32,
            dst_memory_type: 72,
            dst_device: 88,
            width: 112,
            size_bytes: 4,
        }
    }
}

/// `hipDriverProcAddressQueryResult` (HIP 6.2).
pub const HIP_GET_PROC_ADDRESS_SUCCESS: i32 = 0;
pub const HIP_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND: i32 = 1;
pub const HIP_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT: i32 = 2;

/// `hipDeviceProp_t` of ROCm 5.x (`hipGetDeviceProperties`): 792 bytes, `totalGlobalMem` at 256.
pub const PROP_R0000_SIZE: usize = 792;
pub const PROP_R0000_TOTAL: usize = 256;
/// `hipDeviceProp_tR0600` (ROCm 6.x, `hipGetDevicePropertiesR0600`): `name[256]`, `hipUUID uuid`,
/// `char luid[8]`, `unsigned luidDeviceNodeMask`, then `size_t totalGlobalMem` at 288. The fake
/// writes only these leading fields: the full 6.x size was not checked against 6.x headers.
pub const PROP_R0600_UUID: usize = 256;
pub const PROP_R0600_TOTAL: usize = 288;

/// `hipMemLocation.id` inside `hipMemAllocationProp`: ROCm 5.x puts `unsigned char compressionType`
/// first (location at 4, its id at 8); ROCm 6.x starts with `type`, `requestedHandleType`, then the
/// location (id at 12), as CUDA does.
pub const PROP_LOCATION_ID_5: usize = 8;
pub const PROP_LOCATION_ID_6: usize = 12;

#[repr(C)]
#[derive(Clone, Copy)]
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

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Extent {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
}

#[repr(C)]
pub struct PitchedPtr {
    pub ptr: *mut std::ffi::c_void,
    pub pitch: usize,
    pub xsize: usize,
    pub ysize: usize,
}

/// `HIP_ARRAY_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ArrayDescriptor {
    pub width: usize,
    pub height: usize,
    pub format: i32,
    pub num_channels: u32,
}

/// `HIP_ARRAY3D_DESCRIPTOR`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Array3dDescriptor {
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub format: i32,
    pub num_channels: u32,
    pub flags: u32,
}

const _: () = assert!(size_of::<ChannelFormatDesc>() == 20);
const _: () = assert!(size_of::<Extent>() == 24);
const _: () = assert!(size_of::<PitchedPtr>() == 32);
const _: () = assert!(size_of::<ArrayDescriptor>() == 24);
const _: () = assert!(size_of::<Array3dDescriptor>() == 40);

/// Bytes of one channel of a `hipArray_Format` (`HIP_AD_FORMAT_*`).
pub fn format_bytes(format: i32) -> u64 {
    match format {
        0x01 | 0x08 => 1,
        0x02 | 0x09 | 0x10 => 2,
        _ => 4,
    }
}

/// Row pitch the fake gives pitched allocations.
pub const PITCH_ALIGNMENT: u64 = 256;

/// `dim3`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Dim3 {
    pub x: u32,
    pub y: u32,
    pub z: u32,
}
