//! The application's batches of one `vkQueueSubmit`/`vkQueueSubmit2` with the layer's timestamp
//! command buffers around its work: copies of its arrays, never writes to them.
//!
//! The *begin* command buffer goes first in the first batch that has command buffers, after that
//! batch's semaphore waits, and the *end* one last in the last such batch. Semaphores, fences and
//! `pNext` chains stay the application's. A batch is only extended when nothing in its `pNext`
//! chain counts or qualifies its command buffers (a device-group mask per command buffer, a
//! protected submission, a structure this layer does not know): otherwise the submission is not
//! wrapped and is timed on the host.

use std::ffi::c_void;

use ash::vk;

/// Longest `pNext` chain walked; a longer one is not extended.
const CHAIN_LIMIT: usize = 64;

/// One batch of a queue submission, as the application passed it.
pub trait Batch: Copy {
    /// How the batch names a command buffer.
    type Buffer: Copy;

    /// The batch's command buffers.
    ///
    /// # Safety
    /// `self` is an element of the application's valid submission array.
    unsafe fn buffers(&self) -> &[Self::Buffer];

    /// A copy of the batch with `buffers` instead of its own.
    fn with_buffers(self, buffers: &[Self::Buffer]) -> Self;

    /// The layer's command buffer as this batch names one.
    fn buffer(command_buffer: vk::CommandBuffer) -> Self::Buffer;

    /// Whether command buffers may be added without changing what the batch asks for.
    ///
    /// # Safety
    /// As for [`Batch::buffers`].
    unsafe fn extendable(&self) -> bool;
}

impl<'a> Batch for vk::SubmitInfo<'a> {
    type Buffer = vk::CommandBuffer;

    unsafe fn buffers(&self) -> &[vk::CommandBuffer] {
        // SAFETY: a valid `VkSubmitInfo` names `commandBufferCount` command buffers.
        unsafe { slice(self.p_command_buffers, self.command_buffer_count) }
    }

    fn with_buffers(mut self, buffers: &[vk::CommandBuffer]) -> Self {
        self.command_buffer_count = buffers.len() as u32;
        self.p_command_buffers = buffers.as_ptr();
        self
    }

    fn buffer(command_buffer: vk::CommandBuffer) -> vk::CommandBuffer {
        command_buffer
    }

    unsafe fn extendable(&self) -> bool {
        // SAFETY: the batch's own chain, valid per the contract.
        unsafe {
            chain_allows(self.p_next, |s_type, element| match s_type {
                vk::StructureType::TIMELINE_SEMAPHORE_SUBMIT_INFO
                | vk::StructureType::PERFORMANCE_QUERY_SUBMIT_INFO_KHR => true,
                // Protected submissions take protected command buffers only; ours are not.
                vk::StructureType::PROTECTED_SUBMIT_INFO => {
                    element.cast::<vk::ProtectedSubmitInfo>().read().protected_submit == vk::FALSE
                }
                // Anything else, a device group's per-command-buffer masks among them.
                _ => false,
            })
        }
    }
}

impl<'a> Batch for vk::SubmitInfo2<'a> {
    type Buffer = vk::CommandBufferSubmitInfo<'a>;

    unsafe fn buffers(&self) -> &[vk::CommandBufferSubmitInfo<'a>] {
        // SAFETY: a valid `VkSubmitInfo2` names `commandBufferInfoCount` command buffer infos.
        unsafe { slice(self.p_command_buffer_infos, self.command_buffer_info_count) }
    }

    fn with_buffers(mut self, buffers: &[vk::CommandBufferSubmitInfo<'a>]) -> Self {
        self.command_buffer_info_count = buffers.len() as u32;
        self.p_command_buffer_infos = buffers.as_ptr();
        self
    }

    fn buffer(command_buffer: vk::CommandBuffer) -> vk::CommandBufferSubmitInfo<'a> {
        vk::CommandBufferSubmitInfo::default().command_buffer(command_buffer)
    }

    unsafe fn extendable(&self) -> bool {
        if self.flags.contains(vk::SubmitFlags::PROTECTED) {
            return false;
        }
        // SAFETY: the batch's own chain, valid per the contract.
        unsafe {
            chain_allows(self.p_next, |s_type, _| {
                s_type == vk::StructureType::PERFORMANCE_QUERY_SUBMIT_INFO_KHR
            })
        }
    }
}

/// `count` elements at `first` (none for a NULL pointer or a count of 0).
///
/// # Safety
/// `first` is NULL or points to `count` elements alive for `'a`.
unsafe fn slice<'a, T>(first: *const T, count: u32) -> &'a [T] {
    if first.is_null() || count == 0 {
        return &[];
    }
    // SAFETY: per the contract.
    unsafe { std::slice::from_raw_parts(first, count as usize) }
}

/// Whether `allowed(sType, element)` holds for every element of the `pNext` chain at `p_next`.
///
/// # Safety
/// `p_next` heads a valid chain; `allowed` reads an element only as the structure its `sType`
/// names.
unsafe fn chain_allows(
    mut p_next: *const c_void,
    allowed: impl Fn(vk::StructureType, *const c_void) -> bool,
) -> bool {
    for _ in 0..CHAIN_LIMIT {
        if p_next.is_null() {
            return true;
        }
        // SAFETY: every element of a valid chain starts with a `VkBaseInStructure` header.
        let header = unsafe { p_next.cast::<vk::BaseInStructure>().read() };
        if !allowed(header.s_type, p_next) {
            return false;
        }
        p_next = header.p_next.cast();
    }
    false
}

/// Which batches take the begin and end command buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    first: usize,
    last: usize,
}

/// Where the begin and end command buffers would go in `batches`, or `None` when the submission
/// cannot be wrapped: no command buffers, or a batch that would take one is not extendable.
///
/// # Safety
/// `batches` is the application's valid submission array.
pub unsafe fn plan<B: Batch>(batches: &[B]) -> Option<Plan> {
    // SAFETY: per the contract.
    let has_work = |batch: &B| !unsafe { batch.buffers() }.is_empty();
    let first = batches.iter().position(has_work)?;
    let last = batches.iter().rposition(has_work)?;
    // SAFETY: per the contract.
    let extendable = unsafe { batches[first].extendable() && batches[last].extendable() };
    extendable.then_some(Plan { first, last })
}

/// The application's batches with `begin` and `end` placed as `plan` says. The copies point into
/// storage this value owns: keep it alive across the call that uses them.
pub struct Wrapped<B: Batch> {
    batches: Vec<B>,
    /// The extended command buffer arrays the copies point at (a `Vec`'s heap block does not move
    /// when the `Vec` does).
    _buffers: Vec<Vec<B::Buffer>>,
}

impl<B: Batch> Wrapped<B> {
    /// The batches to submit in place of the application's.
    pub fn as_ptr(&self) -> *const B {
        self.batches.as_ptr()
    }
}

/// Copies `batches` with `begin` first in the plan's first batch and `end` last in its last.
///
/// # Safety
/// `batches` is the application's valid submission array and `plan` came from [`plan`] on it.
pub unsafe fn wrap<B: Batch>(
    batches: &[B],
    plan: Plan,
    begin: vk::CommandBuffer,
    end: vk::CommandBuffer,
) -> Wrapped<B> {
    let mut copies = batches.to_vec();
    let mut storage = Vec::with_capacity(2);
    let targets: &[usize] = if plan.first == plan.last { &[plan.first] } else { &[plan.first, plan.last] };
    for &index in targets {
        let mut buffers = Vec::new();
        if index == plan.first {
            buffers.push(B::buffer(begin));
        }
        // SAFETY: per the contract.
        buffers.extend_from_slice(unsafe { batches[index].buffers() });
        if index == plan.last {
            buffers.push(B::buffer(end));
        }
        copies[index] = copies[index].with_buffers(&buffers);
        storage.push(buffers);
    }
    Wrapped { batches: copies, _buffers: storage }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ash::vk::Handle;

    fn cb(raw: u64) -> vk::CommandBuffer {
        vk::CommandBuffer::from_raw(raw)
    }

    fn buffers_of(batch: &vk::SubmitInfo<'_>) -> Vec<u64> {
        // SAFETY: a batch built by the test or by `wrap`, whose arrays are alive.
        unsafe { batch.buffers() }.iter().map(|b| b.as_raw()).collect()
    }

    #[test]
    fn begin_and_end_go_around_the_work_and_the_original_is_untouched() {
        let (first, last) = ([cb(1), cb(2)], [cb(3)]);
        let waits = [vk::Semaphore::from_raw(9)];
        let stages = [vk::PipelineStageFlags::COMPUTE_SHADER];
        let batches = [
            vk::SubmitInfo::default().wait_semaphores(&waits).wait_dst_stage_mask(&stages),
            vk::SubmitInfo::default().command_buffers(&first),
            vk::SubmitInfo::default(),
            vk::SubmitInfo::default().command_buffers(&last),
        ];
        // SAFETY: arrays built above.
        let plan = unsafe { plan(&batches) }.expect("wrappable");
        assert_eq!(plan, Plan { first: 1, last: 3 });
        // SAFETY: as above.
        let wrapped = unsafe { wrap(&batches, plan, cb(100), cb(200)) };
        // SAFETY: `wrapped` holds `batches.len()` batches.
        let copies = unsafe { std::slice::from_raw_parts(wrapped.as_ptr(), batches.len()) };
        assert_eq!(buffers_of(&copies[0]), Vec::<u64>::new());
        assert_eq!(copies[0].p_wait_semaphores, waits.as_ptr());
        assert_eq!(buffers_of(&copies[1]), [100, 1, 2]);
        assert_eq!(buffers_of(&copies[2]), Vec::<u64>::new());
        assert_eq!(buffers_of(&copies[3]), [3, 200]);
        assert_eq!(buffers_of(&batches[1]), [1, 2]);
        assert_eq!(buffers_of(&batches[3]), [3]);

        let one = [vk::SubmitInfo::default().command_buffers(&first)];
        // SAFETY: as above.
        let wrapped = unsafe { wrap(&one, plan_of(&one), cb(100), cb(200)) };
        // SAFETY: one batch.
        assert_eq!(buffers_of(unsafe { &*wrapped.as_ptr() }), [100, 1, 2, 200]);
    }

    fn plan_of(batches: &[vk::SubmitInfo<'_>]) -> Plan {
        // SAFETY: arrays built by the test.
        unsafe { plan(batches) }.expect("wrappable")
    }

    #[test]
    fn batches_whose_chain_qualifies_command_buffers_are_not_wrapped() {
        let buffers = [cb(1)];
        // SAFETY: empty arrays.
        assert_eq!(unsafe { plan::<vk::SubmitInfo<'_>>(&[vk::SubmitInfo::default()]) }, None);
        let masks = [1u32];
        let mut group = vk::DeviceGroupSubmitInfo::default().command_buffer_device_masks(&masks);
        let batches = [vk::SubmitInfo::default().command_buffers(&buffers).push_next(&mut group)];
        // SAFETY: arrays built above.
        assert_eq!(unsafe { plan(&batches) }, None);
        let mut protected = vk::ProtectedSubmitInfo::default().protected_submit(true);
        let batches = [vk::SubmitInfo::default().command_buffers(&buffers).push_next(&mut protected)];
        // SAFETY: as above.
        assert_eq!(unsafe { plan(&batches) }, None);
        let mut unprotected = vk::ProtectedSubmitInfo::default();
        let mut timeline = vk::TimelineSemaphoreSubmitInfo::default();
        let batches = [vk::SubmitInfo::default()
            .command_buffers(&buffers)
            .push_next(&mut unprotected)
            .push_next(&mut timeline)];
        // SAFETY: as above.
        assert!(unsafe { plan(&batches) }.is_some());

        let infos = [vk::CommandBufferSubmitInfo::default().command_buffer(cb(1))];
        let protected2 =
            [vk::SubmitInfo2::default().command_buffer_infos(&infos).flags(vk::SubmitFlags::PROTECTED)];
        // SAFETY: as above.
        assert_eq!(unsafe { plan(&protected2) }, None);
        let plain2 = [vk::SubmitInfo2::default().command_buffer_infos(&infos)];
        // SAFETY: as above.
        let wrapped = unsafe { wrap(&plain2, plan(&plain2).expect("wrappable"), cb(100), cb(200)) };
        // SAFETY: one batch, whose infos `wrapped` holds.
        let copied = unsafe { (*wrapped.as_ptr()).buffers() };
        let raw: Vec<u64> = copied.iter().map(|info| info.command_buffer.as_raw()).collect();
        assert_eq!(raw, [100, 1, 200]);
    }
}
