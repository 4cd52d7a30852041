//! GPU timestamps around paced submissions: the layer's own command buffers write a timestamp
//! before and after the application's command buffers in the same queue submission, so a
//! submission's GPU time is read from the GPU, as CUDA events time launches, instead of from when
//! the host saw its fence (docs/vulkan.md, "How a submission is timed").
//!
//! Per queue family, at its first paced submission, a ring of [`SLOTS`] slots: one command pool,
//! one query pool of two timestamp queries per slot, and per slot two command buffers recorded
//! once and submitted again and again. *Begin* resets the slot's two queries
//! (`vkCmdResetQueryPool`, Vulkan 1.0, ordered before later query commands on them) and writes a
//! timestamp; *end* writes the second. A slot is lent to one submission and comes back once that
//! submission is known finished (the pacer's fence on it, or behind it, has signalled) and its
//! stamps have been read.
//!
//! Both stamps are written at `BOTTOM_OF_PIPE`. A timestamp write's first synchronization scope
//! is every command earlier in submission order on the queue, limited to the stage given; at
//! `BOTTOM_OF_PIPE` that is all of their work. So *begin* is latched once everything queued
//! before it has finished, earlier submissions included: a submission queued behind another is
//! charged from the other's end, and the overlap of the two is charged once, to the earlier one.
//! `TOP_OF_PIPE` would be latched as soon as the command is reached, while the previous
//! submission may still run, and both would be charged the overlap. *End* is latched once the
//! application's command buffers have finished.
//!
//! A span between the two stamps holds more than the application's work: the stamps themselves
//! and the command-buffer boundaries around the application's command buffers (about 4 µs a
//! submission on an H100, 6.5 % of a 0.1 ms submission). So the layer calibrates what they cost
//! on each family: right before the family's first wrapped submission, and again after 10 ms,
//! 20 ms, ... then once a second, it queues [`CALIBRATION_PAIRS`] submissions of its own on the
//! application's queue, each a free slot's begin and end command buffers around an empty command
//! buffer (standing for the application's), with a fence of its own on the last. Nothing waits
//! for them: a later submission reads them once that fence has signalled. The least span ever
//! seen is the stamps' cost (a pair can be slowed, by a clock not yet raised or another context
//! on the GPU, never sped up), and every span read afterwards is charged that much less, never
//! below [`MIN_CHARGE_NS`] (or the span itself, if shorter). A pair's begin stamp waits for the
//! application's work queued before it like any other, so the spans are the pairs' own; the
//! application is not charged for them either, its next begin stamp waits for them.
//!
//! Families without timestamps (`timestampValidBits` 0) or that cannot reset queries in a
//! command buffer (neither graphics nor compute: transfer-only and video families), and a ring
//! that cannot be made, time their submissions on the host as before.

use std::collections::HashMap;
use std::ffi::{CStr, c_void};
use std::sync::{Mutex, MutexGuard, PoisonError};

use ash::vk;
use ash::vk::Handle;

use crate::dispatch::cast;
use crate::loader_abi::SetDeviceLoaderData;
use vgpu_ledger::pace;

/// Slots per queue family: submissions of that family timed on the GPU at once. More in flight
/// than this are timed on the host.
pub const SLOTS: u32 = 64;
/// Pairs of stamps submitted to calibrate their own cost, one submission each.
const CALIBRATION_PAIRS: u32 = 8;
/// The time from a family's first calibration to its second; it doubles after each, up to
/// [`CALIBRATION_INTERVAL_NS`]. The first pairs run on a queue just woken (a GPU's clocks not yet
/// raised, lavapipe's caches cold: 38-42 µs there where later pairs read 11-15), so the next few
/// come soon.
const FIRST_CALIBRATION_INTERVAL_NS: u64 = 10_000_000;
/// How often a family's calibration is repeated at most, while it has submissions to wrap.
const CALIBRATION_INTERVAL_NS: u64 = 1_000_000_000;
/// A calibrated cost above this is not the stamps' (the GPU was taken from the layer between
/// them): spans are not corrected.
const MAX_STAMP_COST_NS: u64 = 100_000;
/// How long `vkDestroyDevice` waits for a calibration still pending.
const DESTROY_WAIT_NS: u64 = 100_000_000;
/// The least a corrected span is charged (or the span itself, if shorter).
pub const MIN_CHARGE_NS: u64 = 1_000;

struct Fns {
    create_command_pool: vk::PFN_vkCreateCommandPool,
    destroy_command_pool: vk::PFN_vkDestroyCommandPool,
    allocate_command_buffers: vk::PFN_vkAllocateCommandBuffers,
    free_command_buffers: vk::PFN_vkFreeCommandBuffers,
    begin_command_buffer: vk::PFN_vkBeginCommandBuffer,
    end_command_buffer: vk::PFN_vkEndCommandBuffer,
    cmd_reset_query_pool: vk::PFN_vkCmdResetQueryPool,
    cmd_write_timestamp: vk::PFN_vkCmdWriteTimestamp,
    create_query_pool: vk::PFN_vkCreateQueryPool,
    destroy_query_pool: vk::PFN_vkDestroyQueryPool,
    get_query_pool_results: vk::PFN_vkGetQueryPoolResults,
    queue_submit: vk::PFN_vkQueueSubmit,
    create_fence: vk::PFN_vkCreateFence,
    destroy_fence: vk::PFN_vkDestroyFence,
    wait_for_fences: vk::PFN_vkWaitForFences,
    get_fence_status: vk::PFN_vkGetFenceStatus,
}

/// What the physical device and the loader say, for [`Timestamps::new`].
pub struct Source {
    /// `vkGetPhysicalDeviceQueueFamilyProperties`, by family index.
    pub families: Vec<vk::QueueFamilyProperties>,
    /// `VkPhysicalDeviceLimits::timestampPeriod`: nanoseconds per timestamp tick.
    pub period_ns: f32,
    /// The loader's callback from the device create-info chain.
    pub set_loader_data: Option<SetDeviceLoaderData>,
    /// Whether to calibrate the stamps' own cost (off under the test-only fault point
    /// `no-stamp-calibration`: spans are charged whole).
    pub calibrate: bool,
}

/// A slot lent to one submission.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Slot {
    family: u32,
    index: u32,
}

/// The two command buffers of a slot, to go around the application's.
#[derive(Clone, Copy, Debug)]
pub struct Wrap {
    pub begin: vk::CommandBuffer,
    pub end: vk::CommandBuffer,
}

struct Ring {
    command_pool: vk::CommandPool,
    query_pool: vk::QueryPool,
    begin: Vec<vk::CommandBuffer>,
    end: Vec<vk::CommandBuffer>,
    /// Empty, recorded for simultaneous use: what a calibration's stamps go around.
    empty: vk::CommandBuffer,
    free: Vec<u32>,
    /// The stamps' own cost on this family, nanoseconds, taken off every span read; none until
    /// a calibration has been read.
    cost_ns: Option<u64>,
    calibration: Calibration,
    /// The time from the latest calibration to the next.
    calibration_interval: u64,
}

/// Where a family's calibration of its stamps' cost stands.
enum Calibration {
    /// The next one is queued by the first wrapped submission at or after this time
    /// ([`pace::now`]).
    Due(u64),
    /// Queued, not yet seen finished: its fence, and the slots it holds until then.
    Pending { fence: vk::Fence, slots: Vec<u32> },
}

enum Family {
    /// No submission has asked for it yet.
    Untried,
    Ready(Ring),
    /// No timestamps, or its ring could not be made: timed on the host.
    Unusable,
}

/// The timestamp rings of one paced device.
pub struct Timestamps {
    device: vk::Device,
    fns: Fns,
    set_loader_data: SetDeviceLoaderData,
    period_ns: f64,
    /// Per family, the valid bits of its timestamps; 0 where it is not timed on the GPU.
    valid_bits: Vec<u32>,
    calibrate: bool,
    /// Each queue the application got, and its family.
    queues: Mutex<HashMap<u64, u32>>,
    /// Per family. Its lock also guards the command pools (externally synchronised objects):
    /// they are only touched while it is held.
    families: Mutex<Vec<Family>>,
}

impl Timestamps {
    /// Timestamps for `device`; `None` (every submission timed on the host) if the loader gave no
    /// `vkSetDeviceLoaderData` or the driver lacks an entry point.
    ///
    /// # Safety
    /// `gdpa` is the next layer's `vkGetDeviceProcAddr` and `device` the device it created on
    /// the physical device `source` describes.
    pub unsafe fn new(
        device: vk::Device,
        gdpa: vk::PFN_vkGetDeviceProcAddr,
        source: Source,
    ) -> Option<Timestamps> {
        // SAFETY: per the contract.
        let next = |name: &CStr| unsafe { gdpa(device, name.as_ptr()) };
        // SAFETY: each cast names the type of the entry point it was asked for.
        let fns = unsafe {
            Fns {
                create_command_pool: cast(next(c"vkCreateCommandPool"))?,
                destroy_command_pool: cast(next(c"vkDestroyCommandPool"))?,
                allocate_command_buffers: cast(next(c"vkAllocateCommandBuffers"))?,
                free_command_buffers: cast(next(c"vkFreeCommandBuffers"))?,
                begin_command_buffer: cast(next(c"vkBeginCommandBuffer"))?,
                end_command_buffer: cast(next(c"vkEndCommandBuffer"))?,
                cmd_reset_query_pool: cast(next(c"vkCmdResetQueryPool"))?,
                cmd_write_timestamp: cast(next(c"vkCmdWriteTimestamp"))?,
                create_query_pool: cast(next(c"vkCreateQueryPool"))?,
                destroy_query_pool: cast(next(c"vkDestroyQueryPool"))?,
                get_query_pool_results: cast(next(c"vkGetQueryPoolResults"))?,
                queue_submit: cast(next(c"vkQueueSubmit"))?,
                create_fence: cast(next(c"vkCreateFence"))?,
                destroy_fence: cast(next(c"vkDestroyFence"))?,
                wait_for_fences: cast(next(c"vkWaitForFences"))?,
                get_fence_status: cast(next(c"vkGetFenceStatus"))?,
            }
        };
        let valid_bits: Vec<u32> = source
            .families
            .iter()
            .map(|family| {
                // vkCmdResetQueryPool is for graphics and compute queues.
                let resettable =
                    family.queue_flags.intersects(vk::QueueFlags::GRAPHICS | vk::QueueFlags::COMPUTE);
                if resettable { family.timestamp_valid_bits.min(64) } else { 0 }
            })
            .collect();
        let period_ns = f64::from(source.period_ns);
        if period_ns.is_nan() || period_ns <= 0.0 || valid_bits.iter().all(|&bits| bits == 0) {
            return None;
        }
        let families = valid_bits.iter().map(|_| Family::Untried).collect();
        Some(Timestamps {
            device,
            fns,
            set_loader_data: source.set_loader_data?,
            period_ns,
            valid_bits,
            calibrate: source.calibrate,
            queues: Mutex::new(HashMap::new()),
            families: Mutex::new(families),
        })
    }

    /// The application got `queue`, of `family`, from `vkGetDeviceQueue`/`vkGetDeviceQueue2`.
    pub fn queue_created(&self, queue: vk::Queue, family: u32) {
        self.queues.lock().unwrap_or_else(PoisonError::into_inner).insert(queue.as_raw(), family);
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Family>> {
        self.families.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A free slot for a submission to `queue`: `None` when its family is not timed on the GPU,
    /// its ring could not be made, or every slot is lent. The family's first call makes its ring;
    /// now and then a call queues a calibration of the stamps on `queue` first.
    ///
    /// # Safety
    /// Called inside the application's submission call on `queue` (externally synchronised),
    /// before its work is submitted.
    pub unsafe fn take(&self, queue: vk::Queue) -> Option<(Slot, Wrap)> {
        let family = *self.queues.lock().unwrap_or_else(PoisonError::into_inner).get(&queue.as_raw())?;
        if self.valid_bits.get(family as usize).is_none_or(|&bits| bits == 0) {
            return None;
        }
        let mut families = self.lock();
        let state = families.get_mut(family as usize)?;
        if let Family::Untried = state {
            // SAFETY: `family` is one of the device's queue families; the families lock is held.
            *state = match unsafe { self.make_ring(family) } {
                Some(ring) => Family::Ready(ring),
                None => {
                    tracing::warn!(
                        "cannot set up GPU timestamps for Vulkan queue family {family}; its submissions are timed on the host"
                    );
                    Family::Unusable
                }
            };
        }
        let Family::Ready(ring) = state else { return None };
        if self.calibrate {
            let now = pace::now();
            match ring.calibration {
                Calibration::Due(at) if now >= at => {
                    // SAFETY: per the contract; the families lock is held.
                    unsafe { self.calibrate(ring, queue, now) };
                }
                Calibration::Pending { fence, .. }
                    // SAFETY: the calibration's own fence, alive while it is pending.
                    if unsafe { (self.fns.get_fence_status)(self.device, fence) } == vk::Result::SUCCESS =>
                {
                    self.finish_calibration(ring, family, now);
                }
                _ => {}
            }
        }
        let index = ring.free.pop()?;
        let wrap = Wrap { begin: ring.begin[index as usize], end: ring.end[index as usize] };
        Some((Slot { family, index }, wrap))
    }

    /// Queues [`CALIBRATION_PAIRS`] free slots on `queue`, each slot's begin and end command
    /// buffers around the empty one, with a fence of the layer's; they are read by a later
    /// [`Timestamps::take`] once it has signalled. Nothing waits for them.
    ///
    /// # Safety
    /// As for [`Timestamps::take`]; the families lock is held.
    unsafe fn calibrate(&self, ring: &mut Ring, queue: vk::Queue, now: u64) {
        let (device, fns) = (self.device, &self.fns);
        // Not when the application has most slots lent: try again later.
        ring.calibration = Calibration::Due(now + ring.calibration_interval);
        if ring.free.len() < 2 * CALIBRATION_PAIRS as usize {
            return;
        }
        let info = vk::FenceCreateInfo::default();
        let mut fence = vk::Fence::null();
        // SAFETY: valid create-info and out-pointer.
        if unsafe { (fns.create_fence)(device, &info, std::ptr::null(), &mut fence) } != vk::Result::SUCCESS {
            return;
        }
        // One submission per pair, as the application's work comes: on lavapipe the first batch
        // of a submission costs the stamps twice what later batches of the same call do.
        let mut slots = Vec::new();
        for pair in 0..CALIBRATION_PAIRS {
            let Some(index) = ring.free.pop() else { break };
            let three = [ring.begin[index as usize], ring.empty, ring.end[index as usize]];
            let batch = vk::SubmitInfo::default().command_buffers(&three);
            let signal = if pair + 1 == CALIBRATION_PAIRS { fence } else { vk::Fence::null() };
            // SAFETY: our own recorded command buffers, none pending (the slot was free; the
            // empty one allows simultaneous use), on `queue` inside the application's call on it.
            if unsafe { (fns.queue_submit)(queue, 1, &batch, signal) } != vk::Result::SUCCESS {
                ring.free.push(index);
                break;
            }
            slots.push(index);
        }
        let mut fenced = slots.len() == CALIBRATION_PAIRS as usize;
        if !fenced && !slots.is_empty() {
            // A submission failed midway: an empty one carries the fence behind those that went.
            // SAFETY: an empty submission with our unused fence, on `queue` inside the
            // application's call on it.
            fenced = unsafe { (fns.queue_submit)(queue, 0, std::ptr::null(), fence) } == vk::Result::SUCCESS;
        }
        if fenced {
            ring.calibration = Calibration::Pending { fence, slots };
            return;
        }
        // Nothing will say when pairs that went are done: their slots are not lent again.
        // SAFETY: our own fence, never submitted.
        unsafe { (fns.destroy_fence)(device, fence, std::ptr::null()) };
    }

    /// Reads a finished calibration: the least span of its pairs, if less than the family's cost
    /// so far, becomes its cost. Its slots go back to the ring and its fence is destroyed.
    fn finish_calibration(&self, ring: &mut Ring, family: u32, now: u64) {
        let due = Calibration::Due(now + ring.calibration_interval);
        ring.calibration_interval = (2 * ring.calibration_interval).min(CALIBRATION_INTERVAL_NS);
        let Calibration::Pending { fence, slots } = std::mem::replace(&mut ring.calibration, due) else {
            return;
        };
        let spans: Vec<u64> =
            slots.iter().filter_map(|&index| self.span(ring.query_pool, Slot { family, index })).collect();
        ring.free.extend(slots.iter().rev());
        // SAFETY: our own fence, signalled: no queue uses it any more.
        unsafe { (self.fns.destroy_fence)(self.device, fence, std::ptr::null()) };
        let Some(&least) = spans.iter().min() else { return };
        // A pair only ever takes longer than the stamps cost (the GPU busy with another context
        // between them, a clock not yet raised), never less: the least span seen is the cost.
        if least > MAX_STAMP_COST_NS || ring.cost_ns.is_some_and(|cost| cost <= least) {
            return;
        }
        ring.cost_ns = Some(least);
        tracing::debug!(
            "Vulkan timestamps on queue family {family}: the layer's own stamps take {least} ns on the GPU \
             (least of {} pairs around an empty command buffer, the longest {} ns); each span is charged that much less",
            spans.len(),
            spans.iter().max().copied().unwrap_or(least)
        );
    }

    /// The GPU time of the application's work in the slot's submission, in nanoseconds: the span
    /// between its two stamps less the stamps' own calibrated cost (at least [`MIN_CHARGE_NS`],
    /// or the span if shorter), if both stamps are available. Called once the submission is
    /// known finished (no wait asked of the driver).
    pub fn read(&self, slot: Slot) -> Option<u64> {
        let (query_pool, cost) = match self.lock().get(slot.family as usize)? {
            Family::Ready(ring) => (ring.query_pool, ring.cost_ns.unwrap_or(0)),
            _ => return None,
        };
        let span = self.span(query_pool, slot)?;
        Some(work_in(span, cost))
    }

    /// The GPU time between the slot's two stamps, in nanoseconds, if both are available.
    fn span(&self, query_pool: vk::QueryPool, slot: Slot) -> Option<u64> {
        let mut stamps = [0u64; 2];
        // SAFETY: two 64-bit results into `stamps` (16 bytes, stride 8); the slot's queries were
        // reset by its begin buffer, which ran: its submission is finished. The query pool lives
        // until `destroy`, which runs after every reader (the pacer's waiter is joined first).
        let status = unsafe {
            (self.fns.get_query_pool_results)(
                self.device,
                query_pool,
                2 * slot.index,
                2,
                std::mem::size_of_val(&stamps),
                stamps.as_mut_ptr().cast::<c_void>(),
                std::mem::size_of::<u64>() as vk::DeviceSize,
                vk::QueryResultFlags::TYPE_64,
            )
        };
        if status != vk::Result::SUCCESS {
            return None;
        }
        let bits = self.valid_bits[slot.family as usize];
        let mask = if bits >= 64 { u64::MAX } else { (1u64 << bits) - 1 };
        // The counter wraps at its valid bits; the difference modulo that is the elapsed count.
        let ticks = stamps[1].wrapping_sub(stamps[0]) & mask;
        Some((ticks as f64 * self.period_ns) as u64)
    }

    /// Gives `slot` back: its submission has finished and its stamps were read (or never will be).
    pub fn release(&self, slot: Slot) {
        if let Some(Family::Ready(ring)) = self.lock().get_mut(slot.family as usize) {
            ring.free.push(slot.index);
        }
    }

    /// Frees every command buffer, command pool and query pool. Called at `vkDestroyDevice`,
    /// after the application's waits and the pacer's waiter have ended.
    pub fn destroy(&self) {
        let mut families = self.lock();
        for state in families.iter_mut() {
            if let Family::Ready(ring) = std::mem::replace(state, Family::Unusable) {
                // SAFETY: our own objects, no longer in use (the device's work is done, a
                // calibration's included: it was queued before the application's work on its
                // queue).
                unsafe { self.destroy_ring(ring) };
            }
        }
    }

    /// The command pool, query pool and recorded slots of `family`.
    ///
    /// # Safety
    /// `family` is one of the device's queue families; the families lock is held.
    unsafe fn make_ring(&self, family: u32) -> Option<Ring> {
        let (device, fns) = (self.device, &self.fns);
        let pool_info = vk::CommandPoolCreateInfo::default().queue_family_index(family);
        let mut command_pool = vk::CommandPool::null();
        // SAFETY: valid create-info and out-pointer.
        if unsafe { (fns.create_command_pool)(device, &pool_info, std::ptr::null(), &mut command_pool) }
            != vk::Result::SUCCESS
        {
            return None;
        }
        let query_info =
            vk::QueryPoolCreateInfo::default().query_type(vk::QueryType::TIMESTAMP).query_count(2 * SLOTS);
        let mut query_pool = vk::QueryPool::null();
        // SAFETY: as above.
        if unsafe { (fns.create_query_pool)(device, &query_info, std::ptr::null(), &mut query_pool) }
            != vk::Result::SUCCESS
        {
            // SAFETY: the pool just made, holding nothing.
            unsafe { (fns.destroy_command_pool)(device, command_pool, std::ptr::null()) };
            return None;
        }
        let mut ring = Ring {
            command_pool,
            query_pool,
            begin: Vec::new(),
            end: Vec::new(),
            empty: vk::CommandBuffer::null(),
            free: Vec::new(),
            cost_ns: None,
            calibration: Calibration::Due(0),
            calibration_interval: FIRST_CALIBRATION_INTERVAL_NS,
        };
        // SAFETY: the ring's pools were just made; the families lock is held.
        if unsafe { self.record(&mut ring) }.is_none() {
            // SAFETY: our own objects, never submitted.
            unsafe { self.destroy_ring(ring) };
            return None;
        }
        Some(ring)
    }

    /// Allocates and records the ring's command buffers: a begin and an end per slot, and the
    /// empty one a calibration puts between them.
    ///
    /// # Safety
    /// `ring`'s pools are live and unused; the families lock is held.
    unsafe fn record(&self, ring: &mut Ring) -> Option<()> {
        let (device, fns) = (self.device, &self.fns);
        let info = vk::CommandBufferAllocateInfo::default()
            .command_pool(ring.command_pool)
            .level(vk::CommandBufferLevel::PRIMARY)
            .command_buffer_count(2 * SLOTS + 1);
        let mut buffers = vec![vk::CommandBuffer::null(); 2 * SLOTS as usize + 1];
        // SAFETY: `buffers` holds `2 * SLOTS + 1` elements, as `info` asks.
        if unsafe { (fns.allocate_command_buffers)(device, &info, buffers.as_mut_ptr()) }
            != vk::Result::SUCCESS
        {
            return None;
        }
        ring.empty = buffers.pop().unwrap_or_default();
        ring.end = buffers.split_off(SLOTS as usize);
        ring.begin = buffers;
        for &buffer in ring.begin.iter().chain(&ring.end).chain([&ring.empty]) {
            // A command buffer made below the loader carries the driver's loader magic, not the
            // loader's dispatch table; the loader's callback puts the table in, as the layers
            // below us (which find their state by it) and the loader expect.
            // SAFETY: a dispatchable object of `device`, just allocated.
            if unsafe { (self.set_loader_data)(device, buffer.as_raw() as *mut c_void) }
                != vk::Result::SUCCESS
            {
                return None;
            }
        }
        let begin_info = vk::CommandBufferBeginInfo::default();
        let stage = vk::PipelineStageFlags::BOTTOM_OF_PIPE;
        for slot in 0..SLOTS {
            let (begin, end, first) = (ring.begin[slot as usize], ring.end[slot as usize], 2 * slot);
            // SAFETY: command buffers of `ring.command_pool` in the initial state, recorded under
            // the families lock; the queries are the slot's own.
            unsafe {
                if (fns.begin_command_buffer)(begin, &begin_info) != vk::Result::SUCCESS {
                    return None;
                }
                (fns.cmd_reset_query_pool)(begin, ring.query_pool, first, 2);
                (fns.cmd_write_timestamp)(begin, stage, ring.query_pool, first);
                if (fns.end_command_buffer)(begin) != vk::Result::SUCCESS
                    || (fns.begin_command_buffer)(end, &begin_info) != vk::Result::SUCCESS
                {
                    return None;
                }
                (fns.cmd_write_timestamp)(end, stage, ring.query_pool, first + 1);
                if (fns.end_command_buffer)(end) != vk::Result::SUCCESS {
                    return None;
                }
            }
        }
        // A calibration submits it once per pair, in one call.
        let simultaneous =
            vk::CommandBufferBeginInfo::default().flags(vk::CommandBufferUsageFlags::SIMULTANEOUS_USE);
        // SAFETY: as above.
        unsafe {
            if (fns.begin_command_buffer)(ring.empty, &simultaneous) != vk::Result::SUCCESS
                || (fns.end_command_buffer)(ring.empty) != vk::Result::SUCCESS
            {
                return None;
            }
        }
        ring.free = (0..SLOTS).rev().collect();
        Some(())
    }

    /// # Safety
    /// `ring`'s objects are ours and no longer in use; the families lock is held.
    unsafe fn destroy_ring(&self, ring: Ring) {
        let (device, fns) = (self.device, &self.fns);
        let buffers: Vec<vk::CommandBuffer> = (ring.begin.iter().chain(&ring.end).chain([&ring.empty]))
            .copied()
            .filter(|b| *b != vk::CommandBuffer::null())
            .collect();
        // SAFETY: per the contract; each buffer was allocated from `ring.command_pool`, and a
        // pending calibration's fence is ours (its work was queued before the application's
        // next submission on that queue, so it has finished; the wait only bounds a surprise).
        unsafe {
            if let Calibration::Pending { fence, .. } = ring.calibration {
                let _ = (fns.wait_for_fences)(device, 1, &fence, vk::TRUE, DESTROY_WAIT_NS);
                (fns.destroy_fence)(device, fence, std::ptr::null());
            }
            if !buffers.is_empty() {
                (fns.free_command_buffers)(device, ring.command_pool, buffers.len() as u32, buffers.as_ptr());
            }
            (fns.destroy_query_pool)(device, ring.query_pool, std::ptr::null());
            (fns.destroy_command_pool)(device, ring.command_pool, std::ptr::null());
        }
    }
}

/// The application's share of a `span` whose stamps cost `cost` (nanoseconds): never negative,
/// never below [`MIN_CHARGE_NS`] unless the span itself is shorter, never more than the span.
fn work_in(span: u64, cost: u64) -> u64 {
    span.saturating_sub(cost).max(span.min(MIN_CHARGE_NS))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_is_charged_less_the_stamps_cost_but_never_below_the_floor() {
        assert_eq!(work_in(107_300, 4_100), 103_200);
        assert_eq!(work_in(107_300, 0), 107_300);
        assert_eq!(work_in(4_500, 4_100), MIN_CHARGE_NS);
        assert_eq!(work_in(3_000, 4_100), MIN_CHARGE_NS);
        assert_eq!(work_in(500, 4_100), 500);
        assert_eq!(work_in(0, 4_100), 0);
    }
}
