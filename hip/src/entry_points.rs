//! Every HIP (and ROCm SMI) entry point libvgpu_hip hooks or calls, each declared once.
//!
//! A `hooked` line gives the C signature and the hook's logic; from it come the exported shim
//! (under the runtime's name, so preloading interposes it), the entry in [`hooks`] that `dlsym`
//! and `hipGetProcAddress` hand out, and the field of [`Real`] that holds the runtime's own
//! function, with a method calling it. A `used` line gives only the [`Real`] part. To hook a new
//! entry point: one line here and its logic under `hooks`. ROCm SMI's and AMD SMI's entry points
//! are two more tables from the same macro, each resolved in its own library and run with its
//! own state.

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};

use crate::error::{HookError, check};
// Named by the `hooked` lines, which unit tests (exporting nothing) do not expand.
#[cfg_attr(test, allow(unused_imports))]
use crate::hooks::{amdsmi, arrays, copies, launch, memory, pools, query, smi, symbols, vmm};
use crate::loader::Library;
use crate::sys::*;

/// One of our entry points: the runtime symbol it replaces and our function.
#[derive(Clone, Copy, Debug)]
pub struct Hook {
    pub name: &'static CStr,
    pub address: unsafe extern "C" fn(),
}

/// `stringify!($name)` as a `&'static CStr`, at compile time.
macro_rules! symbol_name {
    ($name:ident) => {{
        const NAME: &CStr = match CStr::from_bytes_with_nul(concat!(stringify!($name), "\0").as_bytes()) {
            Ok(name) => name,
            Err(_) => panic!("symbol name with NUL"),
        };
        NAME
    }};
}

macro_rules! entry_points {
    (
        library $Real:ident, shim $shim:path, shims $shims:ident, table $TABLE:ident;
        hooked { $( fn $name:ident ( $($arg:ident : $ty:ty),* $(,)? ) => $logic:path; )* }
        used { $( fn $used:ident ( $($uarg:ident : $uty:ty),* $(,)? ); )* }
    ) => {
        /// The runtime's own functions, resolved once by name; `None` where it lacks one (ROCm
        /// 5.x has no `hipGetProcAddress`), which becomes an error when that hook is called.
        #[allow(non_snake_case)]
        pub struct $Real {
            $( $name: Option<unsafe extern "C" fn($($ty),*) -> HipError>, )*
            $( $used: Option<unsafe extern "C" fn($($uty),*) -> HipError>, )*
        }

        #[allow(non_snake_case, clippy::too_many_arguments)]
        impl $Real {
            pub fn resolve(library: Option<Library>) -> $Real {
                $Real {
                    $( $name: library.and_then(|l| l.symbol(symbol_name!($name))).map(|f| {
                        // SAFETY: the library exports this name with exactly this C signature
                        // (hip_runtime_api.h, rocm_smi.h, amdsmi.h).
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($ty),*) -> HipError>(f) }
                    }), )*
                    $( $used: library.and_then(|l| l.symbol(symbol_name!($used))).map(|f| {
                        // SAFETY: as above.
                        unsafe { std::mem::transmute::<*mut c_void, unsafe extern "C" fn($($uty),*) -> HipError>(f) }
                    }), )*
                }
            }

            /// The runtime's address of every hooked name, beside our hook for it.
            pub fn hooked_addresses(&self) -> Vec<(usize, &'static CStr)> {
                vec![ $( (self.$name.map_or(0, |f| f as usize), symbol_name!($name)), )* ]
            }

            $(
                /// Calls the runtime's own function.
                ///
                /// # Safety
                /// The arguments satisfy the runtime's contract for this entry point.
                pub unsafe fn $name(&self, $($arg: $ty),*) -> Result<(), HookError> {
                    let f = self.$name.ok_or(HookError::MissingEntryPoint(stringify!($name)))?;
                    // SAFETY: the caller's arguments, per this entry point's contract.
                    check(unsafe { f($($arg),*) })
                }
            )*
            $(
                /// Calls the runtime's own function.
                ///
                /// # Safety
                /// The arguments satisfy the runtime's contract for this entry point.
                pub unsafe fn $used(&self, $($uarg: $uty),*) -> Result<(), HookError> {
                    let f = self.$used.ok_or(HookError::MissingEntryPoint(stringify!($used)))?;
                    // SAFETY: the caller's arguments, per this entry point's contract.
                    check(unsafe { f($($uarg),*) })
                }
            )*
        }

        /// The exported shims: each runs its hook's logic with the runtime, and never lets an
        /// error or a panic out as anything but a `hipError_t`.
        #[cfg(not(test))]
        #[allow(non_snake_case, clippy::too_many_arguments)]
        mod $shims {
            use super::*;
            $(
                /// # Safety
                /// Called by C with the HIP runtime's contract for this entry point.
                #[unsafe(no_mangle)]
                pub unsafe extern "C" fn $name($($arg: $ty),*) -> HipError {
                    // The hook's logic, or straight to the library's own function when this thread is
                    // already inside a hook (the library calling its own exports through its PLT).
                    $shim(
                        // SAFETY: the application's arguments, as this entry point's contract gives them.
                        |runtime| unsafe { $logic(runtime, $($arg),*) },
                        // SAFETY: the same arguments, to the library's own function.
                        |runtime| unsafe { runtime.real.$name($($arg),*) },
                    )
                }
            )*

            pub static $TABLE: &[Hook] = &[ $(
                Hook {
                    name: symbol_name!($name),
                    // SAFETY: one function-pointer type to another of the same size; callers cast
                    // it back to the entry point's own type before calling it.
                    address: unsafe {
                        std::mem::transmute::<unsafe extern "C" fn($($ty),*) -> HipError, unsafe extern "C" fn()>($name)
                    },
                },
            )* ];
        }
    };
}

entry_points! {
    library Real, shim crate::exports::shim, shims hip_shims, table HIP_HOOKS;
    hooked {
        fn hipMalloc(ptr: *mut *mut c_void, size: usize) => memory::malloc;
        fn hipExtMallocWithFlags(ptr: *mut *mut c_void, size: usize, flags: c_uint) => memory::ext_malloc_with_flags;
        fn hipMallocManaged(ptr: *mut *mut c_void, size: usize, flags: c_uint) => memory::malloc_managed;
        fn hipFree(ptr: *mut c_void) => memory::free;
        fn hipDeviceReset() => memory::device_reset;
        fn hipMallocPitch(ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize) => memory::malloc_pitch;
        fn hipMemAllocPitch(ptr: *mut *mut c_void, pitch: *mut usize, width: usize, height: usize, element_size: c_uint) => memory::mem_alloc_pitch;
        fn hipMalloc3D(pitched: *mut PitchedPtr, extent: Extent) => memory::malloc_3d;
        fn hipMallocAsync(ptr: *mut *mut c_void, size: usize, stream: Opaque) => pools::malloc_async;
        fn hipMallocFromPoolAsync(ptr: *mut *mut c_void, size: usize, pool: Opaque, stream: Opaque) => pools::malloc_from_pool_async;
        fn hipFreeAsync(ptr: *mut c_void, stream: Opaque) => pools::free_async;
        fn hipMemPoolCreate(pool: *mut Opaque, props: *const u8) => pools::create;
        fn hipMemPoolDestroy(pool: Opaque) => pools::destroy;
        fn hipMemPoolTrimTo(pool: Opaque, keep: usize) => pools::trim_to;
        fn hipMallocArray(array: *mut Opaque, desc: *const ChannelFormatDesc, width: usize, height: usize, flags: c_uint) => arrays::malloc_array;
        fn hipMalloc3DArray(array: *mut Opaque, desc: *const ChannelFormatDesc, extent: Extent, flags: c_uint) => arrays::malloc_3d_array;
        fn hipArrayCreate(array: *mut Opaque, desc: *const ArrayDescriptor) => arrays::array_create;
        fn hipArray3DCreate(array: *mut Opaque, desc: *const Array3dDescriptor) => arrays::array_3d_create;
        fn hipFreeArray(array: Opaque) => arrays::free_array;
        fn hipMallocMipmappedArray(array: *mut Opaque, desc: *const ChannelFormatDesc, extent: Extent, levels: c_uint, flags: c_uint) => arrays::malloc_mipmapped_array;
        fn hipMipmappedArrayCreate(array: *mut Opaque, desc: *const Array3dDescriptor, levels: c_uint) => arrays::mipmapped_array_create;
        fn hipFreeMipmappedArray(array: Opaque) => arrays::free_mipmapped_array;
        fn hipMipmappedArrayDestroy(array: Opaque) => arrays::mipmapped_array_destroy;
        fn hipArrayDestroy(array: Opaque) => arrays::array_destroy;
        fn hipMemCreate(handle: *mut MemHandle, size: usize, prop: *const u8, flags: u64) => vmm::create;
        fn hipMemRelease(handle: MemHandle) => vmm::release;
        fn hipMemMap(ptr: *mut c_void, size: usize, offset: usize, handle: MemHandle, flags: u64) => vmm::map;
        fn hipMemUnmap(ptr: *mut c_void, size: usize) => vmm::unmap;
        fn hipMemRetainAllocationHandle(handle: *mut MemHandle, ptr: *mut c_void) => vmm::retain;
        fn hipMemGetInfo(free: *mut usize, total: *mut usize) => query::mem_get_info;
        fn hipDeviceTotalMem(bytes: *mut usize, device: HipDevice) => query::device_total_mem;
        fn hipGetDeviceProperties(prop: *mut u8, device: HipDevice) => query::device_properties;
        fn hipGetDevicePropertiesR0600(prop: *mut u8, device: HipDevice) => query::device_properties_r0600;
        fn hipLaunchKernel(function: *const c_void, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: usize, stream: Opaque) => launch::launch_kernel;
        fn hipLaunchKernel_spt(function: *const c_void, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: usize, stream: Opaque) => launch::launch_kernel_spt;
        fn hipLaunchCooperativeKernel(function: *const c_void, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: c_uint, stream: Opaque) => launch::launch_cooperative_kernel;
        fn hipLaunchCooperativeKernel_spt(function: *const c_void, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: c_uint, stream: Opaque) => launch::launch_cooperative_kernel_spt;
        fn hipExtLaunchKernel(function: *const c_void, grid: Dim3, block: Dim3, args: *mut *mut c_void, shared: usize, stream: Opaque, start: Opaque, stop: Opaque, flags: c_int) => launch::ext_launch_kernel;
        fn hipModuleLaunchKernel(function: Opaque, grid_x: c_uint, grid_y: c_uint, grid_z: c_uint, block_x: c_uint, block_y: c_uint, block_z: c_uint, shared: c_uint, stream: Opaque, params: *mut *mut c_void, extra: *mut *mut c_void) => launch::module_launch_kernel;
        fn hipGraphLaunch(graph: Opaque, stream: Opaque) => launch::graph_launch;
        fn hipMemcpy(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int) => copies::memcpy;
        fn hipMemcpyAsync(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int, stream: Opaque) => copies::memcpy_async;
        fn hipMemcpyDtoD(dst: *mut c_void, src: *mut c_void, size: usize) => copies::memcpy_dtod;
        fn hipMemcpyDtoDAsync(dst: *mut c_void, src: *mut c_void, size: usize, stream: Opaque) => copies::memcpy_dtod_async;
        fn hipMemset(dst: *mut c_void, value: c_int, size: usize) => copies::memset;
        fn hipMemsetAsync(dst: *mut c_void, value: c_int, size: usize, stream: Opaque) => copies::memset_async;
        fn hipMemsetD8(dst: *mut c_void, value: u8, count: usize) => copies::memset_d8;
        fn hipMemsetD8Async(dst: *mut c_void, value: u8, count: usize, stream: Opaque) => copies::memset_d8_async;
        fn hipMemsetD32(dst: *mut c_void, value: c_int, count: usize) => copies::memset_d32;
        fn hipMemsetD32Async(dst: *mut c_void, value: c_int, count: usize, stream: Opaque) => copies::memset_d32_async;
        fn hipMemcpyWithStream(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int, stream: Opaque) => copies::memcpy_with_stream;
        fn hipMemcpy_spt(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int) => copies::memcpy_spt;
        fn hipMemcpyAsync_spt(dst: *mut c_void, src: *const c_void, size: usize, kind: c_int, stream: Opaque) => copies::memcpy_async_spt;
        fn hipMemcpy2D(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int) => copies::memcpy_2d;
        fn hipMemcpy2DAsync(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int, stream: Opaque) => copies::memcpy_2d_async;
        fn hipMemcpy2D_spt(dst: *mut c_void, dpitch: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int) => copies::memcpy_2d_spt;
        fn hipMemcpy2DToArray(dst: Opaque, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int) => copies::memcpy_2d_to_array;
        fn hipMemcpy2DToArrayAsync(dst: Opaque, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int, stream: Opaque) => copies::memcpy_2d_to_array_async;
        fn hipMemcpy2DToArray_spt(dst: Opaque, w_offset: usize, h_offset: usize, src: *const c_void, spitch: usize, width: usize, height: usize, kind: c_int) => copies::memcpy_2d_to_array_spt;
        fn hipMemcpy2DFromArray(dst: *mut c_void, dpitch: usize, src: Opaque, w_offset: usize, h_offset: usize, width: usize, height: usize, kind: c_int) => copies::memcpy_2d_from_array;
        fn hipMemcpy2DFromArrayAsync(dst: *mut c_void, dpitch: usize, src: Opaque, w_offset: usize, h_offset: usize, width: usize, height: usize, kind: c_int, stream: Opaque) => copies::memcpy_2d_from_array_async;
        fn hipMemcpy2DFromArray_spt(dst: *mut c_void, dpitch: usize, src: Opaque, w_offset: usize, h_offset: usize, width: usize, height: usize, kind: c_int) => copies::memcpy_2d_from_array_spt;
        fn hipMemcpy3D(p: *const u8) => copies::memcpy_3d;
        fn hipMemcpy3DAsync(p: *const u8, stream: Opaque) => copies::memcpy_3d_async;
        fn hipMemcpy3D_spt(p: *const u8) => copies::memcpy_3d_spt;
        fn hipMemcpyParam2D(p: *const u8) => copies::memcpy_param_2d;
        fn hipMemcpyParam2DAsync(p: *const u8, stream: Opaque) => copies::memcpy_param_2d_async;
        fn hipMemcpyPeer(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, size: usize) => copies::memcpy_peer;
        fn hipMemcpyPeerAsync(dst: *mut c_void, dst_device: c_int, src: *const c_void, src_device: c_int, size: usize, stream: Opaque) => copies::memcpy_peer_async;
        fn hipMemset_spt(dst: *mut c_void, value: c_int, size: usize) => copies::memset_spt;
        fn hipMemsetD16(dst: *mut c_void, value: u16, count: usize) => copies::memset_d16;
        fn hipMemsetD16Async(dst: *mut c_void, value: u16, count: usize, stream: Opaque) => copies::memset_d16_async;
        fn hipMemset2D(dst: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize) => copies::memset_2d;
        fn hipMemset2DAsync(dst: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize, stream: Opaque) => copies::memset_2d_async;
        fn hipMemset2D_spt(dst: *mut c_void, pitch: usize, value: c_int, width: usize, height: usize) => copies::memset_2d_spt;
        fn hipMemset3D(pitched: PitchedPtr, value: c_int, extent: Extent) => copies::memset_3d;
        fn hipMemset3DAsync(pitched: PitchedPtr, value: c_int, extent: Extent, stream: Opaque) => copies::memset_3d_async;
        fn hipMemset3D_spt(pitched: PitchedPtr, value: c_int, extent: Extent) => copies::memset_3d_spt;
        fn hipDrvMemcpy3D(p: *const u8) => copies::drv_memcpy_3d;
        fn hipDrvMemcpy3DAsync(p: *const u8, stream: Opaque) => copies::drv_memcpy_3d_async;
        fn hipMemcpyToSymbol(symbol: *const c_void, src: *const c_void, size: usize, offset: usize, kind: c_int) => copies::memcpy_to_symbol;
        fn hipMemcpyToSymbolAsync(symbol: *const c_void, src: *const c_void, size: usize, offset: usize, kind: c_int, stream: Opaque) => copies::memcpy_to_symbol_async;
        fn hipMemcpyToSymbol_spt(symbol: *const c_void, src: *const c_void, size: usize, offset: usize, kind: c_int) => copies::memcpy_to_symbol_spt;
        fn hipMemcpyToSymbolAsync_spt(symbol: *const c_void, src: *const c_void, size: usize, offset: usize, kind: c_int, stream: Opaque) => copies::memcpy_to_symbol_async_spt;
        fn hipMemcpyFromSymbol(dst: *mut c_void, symbol: *const c_void, size: usize, offset: usize, kind: c_int) => copies::memcpy_from_symbol;
        fn hipMemcpyFromSymbolAsync(dst: *mut c_void, symbol: *const c_void, size: usize, offset: usize, kind: c_int, stream: Opaque) => copies::memcpy_from_symbol_async;
        fn hipMemcpyFromSymbol_spt(dst: *mut c_void, symbol: *const c_void, size: usize, offset: usize, kind: c_int) => copies::memcpy_from_symbol_spt;
        fn hipMemcpyFromSymbolAsync_spt(dst: *mut c_void, symbol: *const c_void, size: usize, offset: usize, kind: c_int, stream: Opaque) => copies::memcpy_from_symbol_async_spt;
        fn hipGetProcAddress(symbol: *const c_char, pfn: *mut *mut c_void, version: c_int, flags: u64, status: *mut c_int) => symbols::get_proc_address;
    }
    used {
        fn hipGetDevice(device: *mut HipDevice);
        fn hipGetDeviceCount(count: *mut c_int);
        fn hipDeviceGetUuid(uuid: *mut [u8; 16], device: HipDevice);
        fn hipRuntimeGetVersion(version: *mut c_int);
        fn hipEventCreateWithFlags(event: *mut Opaque, flags: c_uint);
        fn hipEventRecord(event: Opaque, stream: Opaque);
        fn hipEventQuery(event: Opaque);
        fn hipEventSynchronize(event: Opaque);
        fn hipEventElapsedTime(ms: *mut f32, start: Opaque, stop: Opaque);
        fn hipStreamGetDevice(stream: Opaque, device: *mut HipDevice);
        fn hipGetStreamDeviceId(stream: Opaque);
        fn hipDeviceGetMemPool(pool: *mut Opaque, device: HipDevice);
        fn hipDeviceGetDefaultMemPool(pool: *mut Opaque, device: HipDevice);
        fn hipMemPoolGetAttribute(pool: Opaque, attribute: c_int, value: *mut c_void);
        fn hipPointerGetAttributes(attributes: *mut u8, ptr: *const c_void);
        fn hipPeekAtLastError();
        fn hipGetLastError();
    }
}

impl Real {
    /// `hipGetStreamDeviceId` (ROCm 4.2 and later), which answers the stream's ordinal, or -1,
    /// rather than a status.
    ///
    /// # Safety
    /// `stream` is the application's stream handle.
    pub unsafe fn stream_device_id(&self, stream: Opaque) -> Option<HipDevice> {
        let f = self.hipGetStreamDeviceId?;
        // SAFETY: the runtime's function, declared `int hipGetStreamDeviceId(hipStream_t)`; the
        // field's `HipError` return type is that `int`.
        let device = unsafe { f(stream) };
        (device >= 0).then_some(device)
    }
}

// `rocm-smi`'s memory view (librocm_smi64): its own library and runtime, never the HIP runtime's.
entry_points! {
    library SmiReal, shim crate::exports::smi_shim, shims smi_shims, table SMI_HOOKS;
    hooked {
        fn rsmi_dev_memory_total_get(device: u32, kind: c_int, total: *mut u64) => smi::memory_total;
        fn rsmi_dev_memory_usage_get(device: u32, kind: c_int, used: *mut u64) => smi::memory_usage;
    }
    used {
        fn rsmi_dev_unique_id_get(device: u32, id: *mut u64);
    }
}

// `amd-smi`'s memory view (libamd_smi): the copy of the library the process loaded.
entry_points! {
    library AmdSmiReal, shim crate::exports::amdsmi_shim, shims amdsmi_shims, table AMDSMI_HOOKS;
    hooked {
        fn amdsmi_get_gpu_memory_total(processor: AmdSmiProcessor, kind: c_int, total: *mut u64) => amdsmi::memory_total;
        fn amdsmi_get_gpu_memory_usage(processor: AmdSmiProcessor, kind: c_int, used: *mut u64) => amdsmi::memory_usage;
        fn amdsmi_get_gpu_vram_usage(processor: AmdSmiProcessor, usage: *mut VramUsage) => amdsmi::vram_usage;
    }
    used {
        fn amdsmi_get_gpu_device_uuid(processor: AmdSmiProcessor, length: *mut c_uint, uuid: *mut c_char);
    }
}

/// The HIP hooks, which `hipGetProcAddress` may hand out.
#[cfg(not(test))]
pub fn hip_hooks() -> &'static [Hook] {
    hip_shims::HIP_HOOKS
}

/// Every hook `dlsym` may hand out.
#[cfg(not(test))]
pub fn hooks() -> impl Iterator<Item = &'static Hook> {
    hip_shims::HIP_HOOKS.iter().chain(smi_shims::SMI_HOOKS).chain(amdsmi_shims::AMDSMI_HOOKS)
}

/// Unit tests export nothing.
#[cfg(test)]
pub fn hip_hooks() -> &'static [Hook] {
    &[]
}

/// Unit tests export nothing.
#[cfg(test)]
pub fn hooks() -> impl Iterator<Item = &'static Hook> {
    [].iter()
}
