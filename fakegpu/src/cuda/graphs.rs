//! CUDA graphs with memory and kernel nodes: `cuGraphCreate`, `cuGraphDestroy`, `cuGraphAddEmptyNode`,
//! `cuGraphAddKernelNode` (and `_v2`), `cuGraphAddMemAllocNode`, `cuGraphAddMemFreeNode`,
//! `cuGraphGetNodes`, `cuGraphNodeGetType`, `cuGraphMemAllocNodeGetParams`, the instantiate calls
//! (`cuGraphInstantiate`, `_v2`, `WithFlags`, `WithParams` and its `_ptsz` twin), `cuGraphLaunch` (and
//! `_ptsz`), `cuGraphExecDestroy`, `cuDeviceGetGraphMemAttribute` and `cuDeviceGraphMemTrim`. The model
//! is `memory::graphs`; launches queue their kernel nodes on the `timeline`.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};
use std::mem::{offset_of, size_of};

use super::launches::{CUfunction, check_dimensions};
use super::{
    CUcontext, CUdevice, CUdeviceptr, CUresult, CUstream, CuError, MemoryPropsHead, answer, as_handle,
    as_pointer, get, initialized, non_null, physical, props_device, put,
};
use crate::memory::graphs::{AllocRequest, NewNode, NodeType, POOL_PROPS_BYTES};
use crate::state::Fake;
use crate::stats;
use crate::timeline::{DURATION_FROM_ARGUMENT, EntryPoint, Launch};

pub type CUgraph = *mut c_void;
pub type CUgraphNode = *mut c_void;
pub type CUgraphExec = *mut c_void;

/// `CUmemAccessDesc`: location type, location id, flags.
type AccessDesc = [c_int; 3];

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (x86-64 and AArch64 layout).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct MemAllocNodeParams {
    /// `CUmemPoolProps`: the fake reads its head (`MemoryPropsHead`) and keeps the rest as given.
    pool_props: [u8; POOL_PROPS_BYTES],
    access_descs: *const AccessDesc,
    access_desc_count: usize,
    bytesize: usize,
    /// Written by `cuGraphAddMemAllocNode`.
    dptr: CUdeviceptr,
}

const _: () = assert!(size_of::<MemAllocNodeParams>() == 120);
const _: () = assert!(offset_of!(MemAllocNodeParams, access_descs) == 88);
const _: () = assert!(offset_of!(MemAllocNodeParams, bytesize) == 104);
const _: () = assert!(offset_of!(MemAllocNodeParams, dptr) == 112);

/// `CUDA_KERNEL_NODE_PARAMS` as CUDA 10 and 11 define it (x86-64 and AArch64 layout); the fake reads the
/// function and dimensions only.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct KernelNodeParams {
    function: CUfunction,
    grid: [c_uint; 3],
    block: [c_uint; 3],
    shared_mem_bytes: c_uint,
    kernel_params: *mut *mut c_void,
    extra: *mut *mut c_void,
}

const _: () = assert!(size_of::<KernelNodeParams>() == 56);
const _: () = assert!(offset_of!(KernelNodeParams, shared_mem_bytes) == 32);
const _: () = assert!(offset_of!(KernelNodeParams, kernel_params) == 40);
const _: () = assert!(offset_of!(KernelNodeParams, extra) == 48);

/// `CUDA_KERNEL_NODE_PARAMS_v2` (CUDA 12): the v1 fields, then a `CUkernel` used when `func` is NULL
/// and the context to run in (ignored: a graph runs on its launch stream's device).
#[derive(Clone, Copy)]
#[repr(C)]
pub struct KernelNodeParamsV2 {
    v1: KernelNodeParams,
    kernel: *mut c_void,
    context: CUcontext,
}

const _: () = assert!(size_of::<KernelNodeParamsV2>() == 72);
const _: () = assert!(offset_of!(KernelNodeParamsV2, kernel) == 56);
const _: () = assert!(offset_of!(KernelNodeParamsV2, context) == 64);

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[derive(Clone, Copy)]
#[repr(C)]
pub struct GraphInstantiateParams {
    flags: u64,
    upload_stream: CUstream,
    err_node_out: CUgraphNode,
    result_out: c_int,
}

const _: () = assert!(size_of::<GraphInstantiateParams>() == 32);
const _: () = assert!(offset_of!(GraphInstantiateParams, result_out) == 24);

/// `CUgraphInstantiate_flags`: AUTO_FREE_ON_LAUNCH, UPLOAD, DEVICE_LAUNCH, USE_NODE_PRIORITY. UPLOAD is
/// for `cuGraphInstantiateWithParams` only.
const INSTANTIATE_UPLOAD: u64 = 2;
const INSTANTIATE_FLAGS: u64 = 0xf;
const INSTANTIATE_WITH_FLAGS_FLAGS: u64 = INSTANTIATE_FLAGS & !INSTANTIATE_UPLOAD;
/// `CUgraphInstantiateResult`: SUCCESS, ERROR.
const INSTANTIATE_SUCCESS: c_int = 0;
const INSTANTIATE_ERROR: c_int = 1;

/// `CUgraphNodeType`.
fn node_type_number(node_type: NodeType) -> c_int {
    match node_type {
        NodeType::Kernel => 0,
        NodeType::Empty => 2,
        NodeType::MemAlloc => 10,
        NodeType::MemFree => 11,
    }
}

/// `CUgraphMem_attribute`: USED_MEM_CURRENT, USED_MEM_HIGH, RESERVED_MEM_CURRENT, RESERVED_MEM_HIGH.
/// The fake reserves exactly what it uses, so used and reserved agree.
const GRAPH_MEM_ATTRIBUTES: std::ops::RangeInclusive<c_int> = 0..=3;

/// The dependency list of a node-adding call; NULL is allowed only for an empty one.
///
/// # Safety
/// `dependencies` must be NULL or valid for reading `count` handles.
unsafe fn dependencies(dependencies: *const CUgraphNode, count: usize) -> Result<Vec<u64>, CuError> {
    if count == 0 {
        return Ok(Vec::new());
    }
    non_null(dependencies)?;
    // SAFETY: non-NULL and valid for `count` handles by this function's contract.
    let listed = unsafe { std::slice::from_raw_parts(dependencies, count) };
    Ok(listed.iter().map(|&node| as_handle(node)).collect())
}

/// The common part of the node-adding calls: builds the node, adds it, writes its handle; returns the
/// address an alloc node hands out (0 for others).
///
/// # Safety
/// `node` must be NULL or valid for writing a `CUgraphNode`; `deps` NULL or valid for `count` handles.
unsafe fn add_node(
    node: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    count: usize,
    build: impl FnOnce(&Fake) -> Result<NewNode, CuError>,
) -> Result<u64, CuError> {
    let fake = initialized()?;
    non_null(node)?;
    // SAFETY: by this function's contract.
    let deps = unsafe { dependencies(deps, count) }?;
    let new = build(fake)?;
    let (handle, address) = fake.add_graph_node(as_handle(graph), &deps, new)?;
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(node, as_pointer(handle)) }?;
    Ok(address)
}

/// What an alloc node asks for: pinned memory on a visible device, a non-zero size, and the access
/// descriptors (copied, not checked).
///
/// # Safety
/// `params` must be valid for reading a `CUDA_MEM_ALLOC_NODE_PARAMS`, whose `accessDescs` is NULL or
/// valid for `accessDescCount` descriptors.
unsafe fn alloc_request(fake: &Fake, params: *const MemAllocNodeParams) -> Result<AllocRequest, CuError> {
    // SAFETY: `params` begins with a `CUmemPoolProps`, by this function's contract.
    let device = unsafe { props_device(fake, params.cast::<MemoryPropsHead>()) }?;
    // SAFETY: by this function's contract.
    let given = unsafe { params.read_unaligned() };
    if given.bytesize == 0 {
        return Err(CuError::InvalidValue);
    }
    let access = if given.access_desc_count == 0 {
        Vec::new()
    } else {
        non_null(given.access_descs)?;
        // SAFETY: non-NULL and valid for `accessDescCount` descriptors by this function's contract.
        unsafe { std::slice::from_raw_parts(given.access_descs, given.access_desc_count) }.to_vec()
    };
    Ok(AllocRequest { device, size: given.bytesize as u64, pool_props: given.pool_props, access })
}

/// The common part of every instantiate call.
///
/// # Safety
/// `exec` must be NULL or valid for writing a `CUgraphExec`.
unsafe fn instantiate(exec: *mut CUgraphExec, graph: CUgraph) -> Result<(), CuError> {
    let fake = initialized()?;
    non_null(exec)?;
    let handle = fake.instantiate_graph(as_handle(graph))?;
    // SAFETY: a non-NULL out-pointer by this function's contract.
    unsafe { put(exec, as_pointer(handle)) }
}

/// `cuGraphInstantiateWithParams`: flags and the upload stream from `params`, the outcome written back.
///
/// # Safety
/// `exec` must be NULL or valid for writing a `CUgraphExec`; `params` NULL or valid for reading and
/// writing a `CUDA_GRAPH_INSTANTIATE_PARAMS`.
unsafe fn instantiate_with_params(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut GraphInstantiateParams,
) -> Result<(), CuError> {
    let fake = initialized()?;
    non_null(params)?;
    // SAFETY: non-NULL and valid for reads by this function's contract.
    let given = unsafe { params.read_unaligned() };
    let outcome = if given.flags & !INSTANTIATE_FLAGS != 0 {
        Err(CuError::InvalidValue)
    } else if given.flags & INSTANTIATE_UPLOAD != 0
        && let Err(refusal) = fake.stream_device(as_handle(given.upload_stream))
    {
        Err(refusal.into())
    } else {
        // SAFETY: by this function's contract.
        unsafe { instantiate(exec, graph) }
    };
    let result = if outcome.is_ok() { INSTANTIATE_SUCCESS } else { INSTANTIATE_ERROR };
    // SAFETY: `params` is non-NULL and valid for writes by this function's contract.
    unsafe {
        (&raw mut (*params).err_node_out).write_unaligned(std::ptr::null_mut());
        (&raw mut (*params).result_out).write_unaligned(result);
    }
    outcome
}

/// A kernel node: a kernel from `fakegpu_kernel` (400 for any other handle; 1 for one whose duration
/// is its argument, which graphs do not model) with non-zero dimensions.
fn kernel_node(fake: &Fake, function: CUfunction, params: &KernelNodeParams) -> Result<NewNode, CuError> {
    let duration = fake.kernel_duration(as_handle(function))?;
    if duration == DURATION_FROM_ARGUMENT {
        return Err(CuError::InvalidValue);
    }
    check_dimensions(params.grid, params.block)?;
    Ok(NewNode::Kernel { duration })
}

/// The stream first (NULL is the per-thread default stream in `cuGraphLaunch_ptsz`), then the
/// executable graph, whose kernel nodes then take their time on the stream.
fn launch(exec: CUgraphExec, stream: CUstream, entry_point: EntryPoint) -> Result<(), CuError> {
    let fake = initialized()?;
    let resolved = fake.resolve_stream(as_handle(stream), entry_point.is_per_thread())?;
    let kernel_ns = fake.launch_graph(as_handle(exec))?;
    let record = Launch {
        entry_point,
        function: as_handle(exec),
        grid: [0; 3],
        block: [0; 3],
        shared_mem_bytes: 0,
        stream: as_handle(stream),
        kernel_params: 0,
        extra: 0,
    };
    fake.launch(record, resolved, kernel_ns);
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(graph: *mut CUgraph, flags: c_uint) -> CUresult {
    stats::record_call("cuGraphCreate");
    answer(|| {
        let fake = initialized()?;
        non_null(graph)?;
        if flags != 0 {
            return Err(CuError::InvalidValue);
        }
        // SAFETY: a non-NULL out-pointer per the cuGraphCreate contract.
        unsafe { put(graph, as_pointer(fake.create_graph())) }
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphDestroy(graph: CUgraph) -> CUresult {
    stats::record_call("cuGraphDestroy");
    answer(|| Ok(initialized()?.destroy_graph(as_handle(graph))?))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
) -> CUresult {
    stats::record_call("cuGraphAddEmptyNode");
    let build = |_: &Fake| Ok(NewNode::Empty);
    // SAFETY: `node` and `dependencies` are NULL or valid per the cuGraphAddEmptyNode contract.
    answer(|| unsafe { add_node(node, graph, dependencies, num_dependencies, build) }.map(drop))
}

/// The CUDA 10 ABI: `CUDA_KERNEL_NODE_PARAMS` without `kern` and `ctx`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    params: *const KernelNodeParams,
) -> CUresult {
    stats::record_call("cuGraphAddKernelNode");
    let build = |fake: &Fake| {
        // SAFETY: `params` is NULL or a `CUDA_KERNEL_NODE_PARAMS` per the cuGraphAddKernelNode contract.
        let given = unsafe { get(params) }?;
        kernel_node(fake, given.function, &given)
    };
    // SAFETY: `node` and `dependencies` are NULL or valid per the cuGraphAddKernelNode contract.
    answer(|| unsafe { add_node(node, graph, dependencies, num_dependencies, build) }.map(drop))
}

/// The CUDA 12 ABI: `func`, or `kern` when `func` is NULL; `ctx` is ignored.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    node: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    params: *const KernelNodeParamsV2,
) -> CUresult {
    stats::record_call("cuGraphAddKernelNode_v2");
    let build = |fake: &Fake| {
        // SAFETY: `params` is NULL or a `CUDA_KERNEL_NODE_PARAMS_v2` per the cuGraphAddKernelNode_v2
        // contract.
        let given = unsafe { get(params) }?;
        let function = if given.v1.function.is_null() { given.kernel } else { given.v1.function };
        kernel_node(fake, function, &given.v1)
    };
    // SAFETY: `node` and `dependencies` are NULL or valid per the cuGraphAddKernelNode_v2 contract.
    answer(|| unsafe { add_node(node, graph, dependencies, num_dependencies, build) }.map(drop))
}

/// Reserves a fresh address for `params->bytesize` bytes and writes it to `params->dptr`; charges
/// nothing (the first launch of an executable graph does).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemAllocNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    stats::record_call("cuGraphAddMemAllocNode");
    answer(|| {
        initialized()?;
        non_null(params)?;
        let build = |fake: &Fake| {
            // SAFETY: a non-NULL `CUDA_MEM_ALLOC_NODE_PARAMS` per the cuGraphAddMemAllocNode contract.
            unsafe { alloc_request(fake, params) }.map(NewNode::MemAlloc)
        };
        // SAFETY: `node` and `dependencies` are NULL or valid per the cuGraphAddMemAllocNode contract.
        let address = unsafe { add_node(node, graph, dependencies, num_dependencies, build) }?;
        // SAFETY: `params` is non-NULL and valid for writes per the cuGraphAddMemAllocNode contract.
        unsafe { put(&raw mut (*params).dptr, address) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddMemFreeNode(
    node: *mut CUgraphNode,
    graph: CUgraph,
    dependencies: *const CUgraphNode,
    num_dependencies: usize,
    dptr: CUdeviceptr,
) -> CUresult {
    stats::record_call("cuGraphAddMemFreeNode");
    let build = |_: &Fake| Ok(NewNode::MemFree(dptr));
    // SAFETY: `node` and `dependencies` are NULL or valid per the cuGraphAddMemFreeNode contract.
    answer(|| unsafe { add_node(node, graph, dependencies, num_dependencies, build) }.map(drop))
}

/// `nodes` NULL: writes the node count. Else `*num_nodes` is the array's size: fills it with nodes, then
/// NULLs, and writes how many nodes it holds.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(
    graph: CUgraph,
    nodes: *mut CUgraphNode,
    num_nodes: *mut usize,
) -> CUresult {
    stats::record_call("cuGraphGetNodes");
    answer(|| {
        let fake = initialized()?;
        non_null(num_nodes)?;
        let listed = fake.graph_nodes(as_handle(graph))?;
        if nodes.is_null() {
            // SAFETY: a non-NULL out-pointer per the cuGraphGetNodes contract.
            return unsafe { put(num_nodes, listed.len()) };
        }
        // SAFETY: a non-NULL in-out pointer per the cuGraphGetNodes contract.
        let capacity = unsafe { num_nodes.read() };
        for i in 0..capacity {
            let entry = listed.get(i).map_or(std::ptr::null_mut(), |&node| as_pointer(node));
            // SAFETY: `nodes` is valid for `*num_nodes` entries per the cuGraphGetNodes contract.
            unsafe { nodes.add(i).write(entry) };
        }
        // SAFETY: a non-NULL out-pointer per the cuGraphGetNodes contract.
        unsafe { put(num_nodes, capacity.min(listed.len())) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphNodeGetType(node: CUgraphNode, node_type: *mut c_int) -> CUresult {
    stats::record_call("cuGraphNodeGetType");
    answer(|| {
        let fake = initialized()?;
        non_null(node_type)?;
        let number = node_type_number(fake.node_type(as_handle(node))?);
        // SAFETY: a non-NULL out-pointer per the cuGraphNodeGetType contract.
        unsafe { put(node_type, number) }
    })
}

/// The parameters as given, `dptr` filled; `accessDescs` points to the node's own copy (NULL for none).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphMemAllocNodeGetParams(
    node: CUgraphNode,
    params: *mut MemAllocNodeParams,
) -> CUresult {
    stats::record_call("cuGraphMemAllocNodeGetParams");
    answer(|| {
        let fake = initialized()?;
        non_null(params)?;
        let view = fake.alloc_node(as_handle(node))?;
        let filled = MemAllocNodeParams {
            pool_props: view.pool_props,
            access_descs: view.access,
            access_desc_count: view.access_count,
            bytesize: view.size as usize,
            dptr: view.address,
        };
        // SAFETY: a non-NULL out-pointer per the cuGraphMemAllocNodeGetParams contract.
        unsafe { put(params, filled) }
    })
}

/// The 10.0 ABI; `errorNode` and `logBuffer` are not written (nothing fails per node in the fake).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _error_node: *mut CUgraphNode,
    _log_buffer: *mut c_char,
    _buffer_size: usize,
) -> CUresult {
    stats::record_call("cuGraphInstantiate");
    // SAFETY: `exec` is NULL or a valid out-pointer per the cuGraphInstantiate contract.
    answer(|| unsafe { instantiate(exec, graph) })
}

/// Same ABI as `cuGraphInstantiate`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    _error_node: *mut CUgraphNode,
    _log_buffer: *mut c_char,
    _buffer_size: usize,
) -> CUresult {
    stats::record_call("cuGraphInstantiate_v2");
    // SAFETY: `exec` is NULL or a valid out-pointer per the cuGraphInstantiate_v2 contract.
    answer(|| unsafe { instantiate(exec, graph) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    flags: c_ulonglong,
) -> CUresult {
    stats::record_call("cuGraphInstantiateWithFlags");
    answer(|| {
        initialized()?;
        if flags & !INSTANTIATE_WITH_FLAGS_FLAGS != 0 {
            return Err(CuError::InvalidValue);
        }
        // SAFETY: `exec` is NULL or a valid out-pointer per the cuGraphInstantiateWithFlags contract.
        unsafe { instantiate(exec, graph) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut GraphInstantiateParams,
) -> CUresult {
    stats::record_call("cuGraphInstantiateWithParams");
    // SAFETY: `exec` and `params` are NULL or valid per the cuGraphInstantiateWithParams contract.
    answer(|| unsafe { instantiate_with_params(exec, graph, params) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithParams_ptsz(
    exec: *mut CUgraphExec,
    graph: CUgraph,
    params: *mut GraphInstantiateParams,
) -> CUresult {
    stats::record_call("cuGraphInstantiateWithParams_ptsz");
    // SAFETY: `exec` and `params` are NULL or valid per the cuGraphInstantiateWithParams contract.
    answer(|| unsafe { instantiate_with_params(exec, graph, params) })
}

/// The first launch of an executable graph charges its alloc nodes' memory (→ 2 and nothing charged
/// or run when it does not fit); later launches charge nothing. Every launch runs its kernel nodes.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch(exec: CUgraphExec, stream: CUstream) -> CUresult {
    stats::record_call("cuGraphLaunch");
    answer(|| launch(exec, stream, EntryPoint::GraphLaunch))
}

#[unsafe(no_mangle)]
pub extern "C" fn cuGraphLaunch_ptsz(exec: CUgraphExec, stream: CUstream) -> CUresult {
    stats::record_call("cuGraphLaunch_ptsz");
    answer(|| launch(exec, stream, EntryPoint::GraphLaunchPtsz))
}

/// Credits the graph memory the executable graph's first launch charged.
#[unsafe(no_mangle)]
pub extern "C" fn cuGraphExecDestroy(exec: CUgraphExec) -> CUresult {
    stats::record_call("cuGraphExecDestroy");
    answer(|| Ok(initialized()?.destroy_exec(as_handle(exec))?))
}

/// A `cuuint64_t`: the graph memory this process's executable graphs hold on the device, or its peak.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetGraphMemAttribute(
    device: CUdevice,
    attribute: c_int,
    value: *mut c_void,
) -> CUresult {
    stats::record_call("cuDeviceGetGraphMemAttribute");
    answer(|| {
        let fake = initialized()?;
        let memory = fake.graph_memory(physical(fake, device)?);
        if !GRAPH_MEM_ATTRIBUTES.contains(&attribute) {
            return Err(CuError::InvalidValue);
        }
        let bytes = if attribute % 2 == 0 { memory.current } else { memory.high };
        // SAFETY: `value` is NULL or points to a `cuuint64_t` per the cuDeviceGetGraphMemAttribute
        // contract.
        unsafe { put(value.cast::<u64>(), bytes) }
    })
}

/// Nothing to trim: executable graphs hold exactly their memory, and no cache.
#[unsafe(no_mangle)]
pub extern "C" fn cuDeviceGraphMemTrim(device: CUdevice) -> CUresult {
    stats::record_call("cuDeviceGraphMemTrim");
    answer(|| {
        let fake = initialized()?;
        physical(fake, device)?;
        Ok(())
    })
}
