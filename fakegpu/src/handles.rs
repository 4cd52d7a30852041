//! Opaque handles for the objects the fake creates (contexts, streams, pools, arrays, VMM allocations,
//! graphs, graph nodes, executable graphs, kernels and events): numbers that encode a kind and a table
//! key, never the address of anything.
//!
//! Every handle lies above 2^59, outside the user address space of x86-64 and AArch64 (47, 48 or 56
//! bits), so none can equal a pointer into this process, such as the static primary-context handles.
//! Keys are never reused, so a stale handle stays unknown instead of naming a newer object.

/// 0x0fa6 in the top bits: "fake" handles.
const BASE: u64 = 0x0fa6 << 48;
const KIND_SHIFT: u32 = 40;
const KEY_SHIFT: u32 = 4;

/// What a handle names; part of the handle, so a handle of one kind is unknown to every other table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub enum Kind {
    Context = 1,
    Stream = 2,
    Pool = 3,
    Array = 4,
    MipmappedArray = 5,
    Allocation = 6,
    Graph = 7,
    GraphNode = 8,
    GraphExec = 9,
    Function = 10,
    Event = 11,
    Module = 12,
    Library = 13,
}

/// The handle of table entry `key` (< 2^36) of `kind`.
pub fn encode(kind: Kind, key: u64) -> u64 {
    debug_assert!(key < 1 << (KIND_SHIFT - KEY_SHIFT));
    BASE | (kind as u64) << KIND_SHIFT | key << KEY_SHIFT
}

/// The table key behind `handle`, if it is a handle of `kind`.
pub fn decode(kind: Kind, handle: u64) -> Option<u64> {
    let rest = handle.checked_sub(BASE | (kind as u64) << KIND_SHIFT)?;
    (rest < 1 << KIND_SHIFT && rest.is_multiple_of(1 << KEY_SHIFT)).then_some(rest >> KEY_SHIFT)
}

/// Hands out table keys from 1 upwards, never twice.
#[derive(Debug)]
pub struct Keys(u64);

impl Keys {
    pub const fn starting_at(first: u64) -> Keys {
        Keys(first)
    }

    pub fn next(&mut self) -> u64 {
        let key = self.0;
        self.0 += 1;
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_only_for_their_kind() {
        let handle = encode(Kind::Stream, 7);
        assert_eq!(decode(Kind::Stream, handle), Some(7));
        assert_eq!(decode(Kind::Pool, handle), None);
        assert_eq!(decode(Kind::Stream, handle + 1), None);
        assert_eq!(decode(Kind::Stream, 0), None);
        assert_eq!(decode(Kind::Stream, 2), None);
        assert!(handle > 1 << 59);
        let mut keys = Keys::starting_at(1);
        assert_eq!((keys.next(), keys.next()), (1, 2));
    }
}
