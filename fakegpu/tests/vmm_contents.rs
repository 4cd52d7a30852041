//! VMM memory holds bytes in the fake: copies and memsets move them across several mapped handles, an
//! access to reserved addresses that nothing maps is refused and counted (`fakegpu_unmapped_access`),
//! and so is a launch while a mapped range is out (`fakegpu_launch_while_unmapped`). Each test runs in
//! a child process (`common`).

#[macro_use]
mod common;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::{null, null_mut};

use common::*;

const INVALID_VALUE: c_int = 1;
const MIB: usize = 1 << 20;
/// The reservation: 1 GiB, mapped as 16 chunks of 64 MiB.
const RESERVED: usize = 1 << 30;
const CHUNK: usize = 64 * MIB;
/// A smaller reservation, for swapping out and in: 16 chunks of 4 MiB.
const SMALL_CHUNK: usize = 4 * MIB;
const SMALL_RESERVED: usize = 16 * SMALL_CHUNK;

/// `len` bytes that differ from their neighbours and from another `seed`'s.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

/// The driver calls these tests make, typed.
struct Cuda {
    driver: Driver,
    create: extern "C" fn(*mut u64, usize, *const MemoryProps, u64) -> c_int,
    release: extern "C" fn(u64) -> c_int,
    reserve: extern "C" fn(*mut u64, usize, usize, u64, u64) -> c_int,
    address_free: extern "C" fn(u64, usize) -> c_int,
    map: extern "C" fn(u64, usize, usize, u64, u64) -> c_int,
    unmap: extern "C" fn(u64, usize) -> c_int,
    set_access: extern "C" fn(u64, usize, *const [c_int; 3], usize) -> c_int,
    htod: extern "C" fn(u64, *const c_void, usize) -> c_int,
    dtoh: extern "C" fn(*mut c_void, u64, usize) -> c_int,
    dtod: extern "C" fn(u64, u64, usize) -> c_int,
    launch: extern "C" fn(
        *mut c_void,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        c_uint,
        *mut c_void,
        *mut *mut c_void,
        *mut *mut c_void,
    ) -> c_int,
    kernel: *mut c_void,
}

impl Cuda {
    /// Loads the fake and makes device 0's primary context current.
    fn open() -> Cuda {
        let driver = Driver::open("libcuda.so.1");
        bind_context(&driver, 0);
        let kernel = function!(driver, fakegpu_kernel: fn(u64) -> *mut c_void)(1000);
        assert!(!kernel.is_null());
        Cuda {
            create: function!(driver, cuMemCreate: fn(*mut u64, usize, *const MemoryProps, u64) -> c_int),
            release: function!(driver, cuMemRelease: fn(u64) -> c_int),
            reserve: function!(driver, cuMemAddressReserve: fn(*mut u64, usize, usize, u64, u64) -> c_int),
            address_free: function!(driver, cuMemAddressFree: fn(u64, usize) -> c_int),
            map: function!(driver, cuMemMap: fn(u64, usize, usize, u64, u64) -> c_int),
            unmap: function!(driver, cuMemUnmap: fn(u64, usize) -> c_int),
            set_access: function!(driver, cuMemSetAccess: fn(u64, usize, *const [c_int; 3], usize) -> c_int),
            htod: function!(driver, cuMemcpyHtoD_v2: fn(u64, *const c_void, usize) -> c_int),
            dtoh: function!(driver, cuMemcpyDtoH_v2: fn(*mut c_void, u64, usize) -> c_int),
            dtod: function!(driver, cuMemcpyDtoD_v2: fn(u64, u64, usize) -> c_int),
            launch: function!(
                driver,
                cuLaunchKernel: fn(
                    *mut c_void,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    c_uint,
                    *mut c_void,
                    *mut *mut c_void,
                    *mut *mut c_void
                ) -> c_int
            ),
            kernel,
            driver,
        }
    }

    fn reserve(&self, size: usize) -> u64 {
        let mut start = 0;
        assert_eq!((self.reserve)(&mut start, size, 0, 0, 0), SUCCESS);
        start
    }

    /// Maps fresh handles of `chunk` bytes over `[start, start + size)`, readable and writable;
    /// returns them.
    fn map_chunks(&self, start: u64, size: usize, chunk: usize) -> Vec<u64> {
        let handles: Vec<u64> = (0..size / chunk)
            .map(|i| {
                let mut handle = 0;
                assert_eq!((self.create)(&mut handle, chunk, &pinned_on(0), 0), SUCCESS);
                assert_eq!((self.map)(start + (i * chunk) as u64, chunk, 0, handle, 0), SUCCESS);
                handle
            })
            .collect();
        assert_eq!((self.set_access)(start, size, &[1, 0, 3], 1), SUCCESS);
        handles
    }

    /// Unmaps `[start, start + size)` and releases `handles`, keeping the reservation.
    fn unmap_chunks(&self, start: u64, size: usize, handles: &[u64]) {
        assert_eq!((self.unmap)(start, size), SUCCESS);
        for &handle in handles {
            assert_eq!((self.release)(handle), SUCCESS);
        }
    }

    fn write(&self, dst: u64, data: &[u8]) {
        assert_eq!((self.htod)(dst, data.as_ptr().cast(), data.len()), SUCCESS);
    }

    fn read(&self, src: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0xa5; len];
        assert_eq!((self.dtoh)(out.as_mut_ptr().cast(), src, len), SUCCESS);
        out
    }

    fn launch(&self) {
        let launch = self.launch;
        assert_eq!(launch(self.kernel, 1, 1, 1, 1, 1, 1, 0, null_mut(), null_mut(), null_mut()), SUCCESS);
    }

    fn unmapped_access(&self) -> u64 {
        function!(self.driver, fakegpu_unmapped_access: fn() -> u64)()
    }

    fn launch_while_unmapped(&self) -> u64 {
        function!(self.driver, fakegpu_launch_while_unmapped: fn() -> u64)()
    }
}

/// Asserts that `actual` equals `expected` byte for byte, naming the first difference.
fn assert_same(actual: &[u8], expected: &[u8], what: &str) {
    assert_eq!(actual.len(), expected.len(), "{what}: length");
    if let Some(at) = actual.iter().zip(expected).position(|(a, e)| a != e) {
        panic!("{what}: byte {at} is {:#04x}, expected {:#04x}", actual[at], expected[at]);
    }
}

#[test]
fn copies_and_memsets_move_bytes_across_chunks() {
    if !is_child() {
        return spawn_self("copies_and_memsets_move_bytes_across_chunks", &[("FAKEGPU_MEMORY", "2g")]);
    }
    let cuda = Cuda::open();
    let start = cuda.reserve(RESERVED);
    let handles = cuda.map_chunks(start, RESERVED, CHUNK);
    assert_eq!(handles.len(), 16);

    // Never written: zeros, wherever read.
    assert_same(&cuda.read(start + (RESERVED - 100) as u64, 100), &[0; 100], "fresh memory");

    // One write over three chunks (the last MiB of chunk 0 to the first of chunk 2), read back whole
    // and in pieces that straddle the chunk boundaries.
    let at = start + (63 * MIB) as u64;
    let data = pattern(1, 66 * MIB);
    cuda.write(at, &data);
    assert_same(&cuda.read(at, data.len()), &data, "HtoD then DtoH over three chunks");
    let boundary = start + CHUNK as u64;
    let offset = (boundary - at) as usize;
    assert_same(&cuda.read(boundary - 3, 7), &data[offset - 3..offset + 4], "across a boundary");
    assert_same(&cuda.read(at - 5, 5), &[0; 5], "before the write");
    let last = start + RESERVED as u64 - 1;
    cuda.write(last, &[0x5a]);
    assert_same(&cuda.read(last - 1, 2), &[0, 0x5a], "the reservation's last byte");

    // Async copies on a created stream into page-locked host memory, and back from it.
    let stream_create = function!(cuda.driver, cuStreamCreate: fn(*mut *mut c_void, c_uint) -> c_int);
    let sync = function!(cuda.driver, cuStreamSynchronize: fn(*mut c_void) -> c_int);
    let host_alloc = function!(cuda.driver, cuMemHostAlloc: fn(*mut *mut c_void, usize, c_uint) -> c_int);
    let free_host = function!(cuda.driver, cuMemFreeHost: fn(*mut c_void) -> c_int);
    let dtoh_async =
        function!(cuda.driver, cuMemcpyDtoHAsync_v2: fn(*mut c_void, u64, usize, *mut c_void) -> c_int);
    let htod_async =
        function!(cuda.driver, cuMemcpyHtoDAsync_v2: fn(u64, *const c_void, usize, *mut c_void) -> c_int);
    let mut stream = null_mut();
    assert_eq!(stream_create(&mut stream, 1), SUCCESS);
    let mut pinned = null_mut();
    assert_eq!(host_alloc(&mut pinned, data.len(), 0), SUCCESS);
    assert_eq!(dtoh_async(pinned, at, data.len(), stream), SUCCESS);
    assert_eq!(sync(stream), SUCCESS);
    // SAFETY: `pinned` is `data.len()` bytes of real memory from cuMemHostAlloc, written just now.
    let saved = unsafe { std::slice::from_raw_parts(pinned.cast::<u8>(), data.len()) };
    assert_same(saved, &data, "DtoHAsync into cuMemHostAlloc memory");
    let far = start + (700 * MIB) as u64;
    assert_eq!(htod_async(far, pinned, data.len(), stream), SUCCESS);
    assert_eq!(sync(stream), SUCCESS);
    assert_same(&cuda.read(far, data.len()), &data, "HtoDAsync from cuMemHostAlloc memory");
    assert_eq!(free_host(pinned), SUCCESS);

    // DtoD across chunk boundaries on both sides, and an overlapping one (as memmove).
    let copied = start + (620 * MIB) as u64;
    assert_eq!((cuda.dtod)(copied, at + 8, 40 * MIB), SUCCESS);
    assert_same(&cuda.read(copied, 40 * MIB), &data[8..8 + 40 * MIB], "DtoD");
    assert_eq!((cuda.dtod)(copied + 5, start + (900 * MIB) as u64, MIB), SUCCESS);
    assert_same(
        &cuda.read(copied, MIB + 10),
        &[&data[8..13], &vec![0; MIB][..], &data[13 + MIB..18 + MIB]].concat(),
        "DtoD of fresh memory",
    );
    assert_eq!((cuda.dtod)(far + 3, far, 3 * MIB), SUCCESS);
    assert_same(&cuda.read(far + 3, 3 * MIB), &data[..3 * MIB], "overlapping DtoD");

    // Unified copies: the fake tells device addresses from host pointers.
    let unified = function!(cuda.driver, cuMemcpy: fn(u64, u64, usize) -> c_int);
    let small = pattern(2, 4096);
    let mut back = vec![0; 4096];
    assert_eq!(unified(boundary - 100, small.as_ptr() as u64, small.len()), SUCCESS);
    assert_eq!(unified(back.as_mut_ptr() as u64, boundary - 100, back.len()), SUCCESS);
    assert_same(&back, &small, "cuMemcpy to and from the host");
    assert_eq!(unified(start, boundary - 100, small.len()), SUCCESS);
    assert_same(&cuda.read(start, small.len()), &small, "cuMemcpy device to device");

    // Memsets: each element in its own order from the first byte, across a boundary.
    let d8 = function!(cuda.driver, cuMemsetD8_v2: fn(u64, u8, usize) -> c_int);
    let d16 = function!(cuda.driver, cuMemsetD16Async: fn(u64, u16, usize, *mut c_void) -> c_int);
    let d32 = function!(cuda.driver, cuMemsetD32_v2_ptds: fn(u64, u32, usize) -> c_int);
    let d2d32 = function!(cuda.driver, cuMemsetD2D32_v2: fn(u64, usize, u32, usize, usize) -> c_int);
    let second = start + 2 * CHUNK as u64;
    assert_eq!(d8(second - 10, 0xee, 20), SUCCESS);
    let mut expected = data[offset + CHUNK - 11..offset + CHUNK + 11].to_vec();
    expected[1..21].fill(0xee);
    assert_same(&cuda.read(second - 11, 22), &expected, "D8");
    assert_eq!(d16(second - 6, 0xbbaa, 6, stream), SUCCESS);
    assert_same(&cuda.read(second - 6, 12), &0xbbaa_u16.to_ne_bytes().repeat(6), "D16");
    assert_eq!(d32(second - 2, 0x4433_2211, 3), SUCCESS);
    assert_same(
        &cuda.read(second - 2, 12),
        &0x4433_2211_u32.to_ne_bytes().repeat(3),
        "D32 from an odd address",
    );
    assert_eq!(d2d32(start + 16, 64, 0x0102_0304, 2, 3), SUCCESS);
    let rows = cuda.read(start + 16, 136);
    for row in 0..3 {
        let fill = 0x0102_0304_u32.to_ne_bytes().repeat(2);
        assert_same(&rows[row * 64..row * 64 + 8], &fill, "2D memset row");
    }
    assert_same(&rows[8..64], &small[24..80], "between 2D rows");
    assert_eq!(cuda.unmapped_access(), 0);
    assert_eq!(cuda.launch_while_unmapped(), 0);

    // Bytes belong to the handle: unmapped and mapped again elsewhere in the reservation, it shows them.
    let fifteenth = start + 15 * CHUNK as u64;
    assert_eq!((cuda.unmap)(fifteenth, CHUNK), SUCCESS);
    assert_eq!((cuda.unmap)(start + 14 * CHUNK as u64, CHUNK), SUCCESS);
    assert_eq!((cuda.map)(start + 14 * CHUNK as u64, CHUNK, 0, handles[15], 0), SUCCESS);
    assert_same(&cuda.read(fifteenth - 2, 2), &[0, 0x5a], "the same handle one chunk lower");
    assert_eq!((cuda.map)(fifteenth, CHUNK, 0, handles[15], 0), SUCCESS);
    assert_same(&cuda.read(last - 1, 2), &[0, 0x5a], "and at once where it was");

    // Linear memory stays addresses only: nothing moves, nothing is checked.
    let alloc = function!(cuda.driver, cuMemAlloc_v2: fn(*mut u64, usize) -> c_int);
    let mut linear = 0;
    assert_eq!(alloc(&mut linear, MIB), SUCCESS);
    assert_eq!((cuda.htod)(linear, null(), 1 << 40), SUCCESS, "no bytes read");
    let mut untouched = vec![7_u8; 64];
    assert_eq!((cuda.dtoh)(untouched.as_mut_ptr().cast(), linear, 64), SUCCESS);
    assert_same(&untouched, &[7; 64], "DtoH from linear memory writes nothing");
    assert_eq!((cuda.dtod)(start + 1000, linear, 64), SUCCESS);
    assert_same(&cuda.read(start + 1000, 64), &small[1000..1064], "DtoD from linear memory moves nothing");
    assert_eq!(cuda.unmapped_access(), 0);
}

#[test]
fn swapped_out_memory_is_refused_and_comes_back() {
    if !is_child() {
        return spawn_self("swapped_out_memory_is_refused_and_comes_back", &[("FAKEGPU_MEMORY", "1g")]);
    }
    let cuda = Cuda::open();
    let used = || {
        let hook =
            function!(cuda.driver, fakegpu_device_stats: fn(c_uint, *mut u64, *mut u64, *mut u64) -> c_int);
        let mut used = 0;
        assert_eq!(hook(0, &mut used, null_mut(), null_mut()), SUCCESS);
        used
    };
    let start = cuda.reserve(SMALL_RESERVED);
    let first = cuda.map_chunks(start, SMALL_RESERVED, SMALL_CHUNK);
    let data = pattern(3, 4 * SMALL_CHUNK);
    cuda.write(start, &data);
    cuda.launch();
    assert_eq!(cuda.launch_while_unmapped(), 0);

    // Swap out chunks 0-3: saved, unmapped and released; the reservation stays.
    let saved = cuda.read(start, data.len());
    cuda.unmap_chunks(start, 4 * SMALL_CHUNK, &first[..4]);
    assert_eq!(used(), (SMALL_RESERVED - 4 * SMALL_CHUNK) as u64, "the handles' memory is freed");

    let mut buffer = vec![0x77_u8; 16];
    let fourth = start + (4 * SMALL_CHUNK) as u64;
    assert_eq!((cuda.htod)(start + 8, buffer.as_ptr().cast(), 16), INVALID_VALUE);
    assert_eq!(cuda.unmapped_access(), 1);
    assert_eq!((cuda.dtoh)(buffer.as_mut_ptr().cast(), start, 16), INVALID_VALUE);
    assert_eq!((cuda.dtod)(fourth, start, 16), INVALID_VALUE, "source out");
    assert_eq!((cuda.dtod)(start, fourth, 16), INVALID_VALUE, "destination out");
    assert_eq!((cuda.dtoh)(buffer.as_mut_ptr().cast(), fourth - 8, 16), INVALID_VALUE, "straddling");
    let d32 = function!(cuda.driver, cuMemsetD32Async_ptsz: fn(u64, u32, usize, *mut c_void) -> c_int);
    assert_eq!(d32(start, 1, 4, null_mut()), INVALID_VALUE);
    let unified = function!(cuda.driver, cuMemcpy: fn(u64, u64, usize) -> c_int);
    assert_eq!(unified(buffer.as_mut_ptr() as u64, start, 16), INVALID_VALUE);
    assert_eq!(cuda.unmapped_access(), 7);
    assert_same(&buffer, &[0x77; 16], "a refused copy writes nothing");
    assert_eq!((cuda.dtoh)(buffer.as_mut_ptr().cast(), fourth, 16), SUCCESS, "chunk 4 stays in");
    assert_same(&buffer, &[0; 16], "chunk 4 was never written");

    // Launches while out are counted, kernel and graph alike, and still succeed.
    cuda.launch();
    assert_eq!(cuda.launch_while_unmapped(), 1);
    let graph_create = function!(cuda.driver, cuGraphCreate: fn(*mut *mut c_void, c_uint) -> c_int);
    let instantiate =
        function!(cuda.driver, cuGraphInstantiateWithFlags: fn(*mut *mut c_void, *mut c_void, u64) -> c_int);
    let graph_launch = function!(cuda.driver, cuGraphLaunch: fn(*mut c_void, *mut c_void) -> c_int);
    let (mut graph, mut exec) = (null_mut(), null_mut());
    assert_eq!(graph_create(&mut graph, 0), SUCCESS);
    assert_eq!(instantiate(&mut exec, graph, 0), SUCCESS);
    assert_eq!(graph_launch(exec, null_mut()), SUCCESS);
    assert_eq!(cuda.launch_while_unmapped(), 2);

    // Swap in with new handles of other sizes: zeros until the saved bytes are copied back.
    let low = cuda.map_chunks(start, 2 * SMALL_CHUNK, 2 * SMALL_CHUNK);
    cuda.launch();
    assert_eq!(cuda.launch_while_unmapped(), 3, "half is still out");
    let high = cuda.map_chunks(start + (2 * SMALL_CHUNK) as u64, 2 * SMALL_CHUNK, SMALL_CHUNK);
    assert_same(&cuda.read(start, data.len()), &vec![0; data.len()], "new handles are zeroed");
    cuda.write(start, &saved);
    assert_same(&cuda.read(start, data.len()), &data, "swapped out and in, bit for bit");
    cuda.launch();
    assert_eq!(graph_launch(exec, null_mut()), SUCCESS);
    assert_eq!(cuda.launch_while_unmapped(), 3, "all back in");
    assert_eq!(cuda.unmapped_access(), 7);

    // Freeing the reservation forgets what was out.
    cuda.unmap_chunks(start, SMALL_RESERVED, &[&first[4..], &low[..], &high[..]].concat());
    assert_eq!(used(), 0);
    cuda.launch();
    assert_eq!(cuda.launch_while_unmapped(), 4);
    assert_eq!((cuda.address_free)(start, SMALL_RESERVED), SUCCESS);
    cuda.launch();
    assert_eq!(cuda.launch_while_unmapped(), 4);
}
