//! Finding a function in one loaded object's own symbol table, without the dynamic linker's
//! lookup: the only way to reach glibc's `dlopen` when another preloaded library exports a
//! `dlopen` of its own (a handle from `dladdr1` is not one `dlsym` accepts for an object loaded at
//! start-up, and `RTLD_NEXT` finds whichever library comes after the caller), and glibc's `dlvsym`
//! once this library exports `dlvsym` under glibc's own versions.
//!
//! The object's GNU hash table (`DT_GNU_HASH`) finds a name in a few probes; without one, the
//! symbols are read in order (glibc's libc has about 3 000: some 100 000 instructions, once per
//! process, that every process calling `dlsym` would pay at start-up).

use std::ffi::{CStr, c_int, c_void};

/// The dynamic section's tags read here (`<elf.h>`).
const DT_NULL: i64 = 0;
const DT_STRTAB: i64 = 5;
const DT_SYMTAB: i64 = 6;
const DT_STRSZ: i64 = 10;
const DT_SYMENT: i64 = 11;
const DT_GNU_HASH: i64 = 0x6fff_fef5;
/// `st_info`'s low nibble for a function, and the section index of an undefined symbol.
const STT_FUNC: u8 = 2;
const SHN_UNDEF: u16 = 0;
/// More symbols than any library has: a bound on a table whose end is inferred.
const MAX_SYMBOLS: usize = 1 << 20;

/// One entry of the dynamic section (`Elf64_Dyn`).
#[repr(C)]
struct Dyn {
    tag: i64,
    value: u64,
}

struct Search<'a> {
    inside: usize,
    name: &'a CStr,
    found: Option<usize>,
}

/// The address of function `name` as defined by the loaded object that contains address `inside`,
/// read from that object's dynamic symbol table; `None` when it defines none.
pub fn function_in_object_of(inside: usize, name: &CStr) -> Option<usize> {
    let mut search = Search { inside, name, found: None };
    // SAFETY: `visit` matches dl_iterate_phdr's callback type and `search` outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(visit), (&raw mut search).cast()) };
    search.found
}

unsafe extern "C" fn visit(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
    // SAFETY: dl_iterate_phdr hands a valid record and the `Search` passed to it.
    let (info, search) = unsafe { (&*info, &mut *data.cast::<Search>()) };
    let base = info.dlpi_addr as usize;
    // SAFETY: the loader's program headers for this object, `dlpi_phnum` of them.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let contains = headers.iter().any(|h| {
        let start = base + h.p_vaddr as usize;
        h.p_type == libc::PT_LOAD && (start..start + h.p_memsz as usize).contains(&search.inside)
    });
    if !contains {
        return 0;
    }
    if let Some(dynamic) = headers.iter().find(|h| h.p_type == libc::PT_DYNAMIC) {
        let dynamic = (base + dynamic.p_vaddr as usize) as *const Dyn;
        // SAFETY: the mapped dynamic section of a loaded object, ended by DT_NULL.
        search.found = unsafe { find(base, dynamic, search.name) };
    }
    1
}

/// Looks `name` up in the symbol table the dynamic section at `dynamic` describes.
///
/// # Safety
/// `dynamic` is the mapped dynamic section of the object loaded at `base`.
unsafe fn find(base: usize, dynamic: *const Dyn, name: &CStr) -> Option<usize> {
    let (mut symtab, mut strtab, mut strsz, mut syment, mut gnu_hash) =
        (0usize, 0usize, 0usize, 0usize, 0usize);
    for k in 0.. {
        // SAFETY: within the dynamic section, which ends with DT_NULL.
        let entry = unsafe { &*dynamic.add(k) };
        match entry.tag {
            DT_NULL => break,
            DT_SYMTAB => symtab = entry.value as usize,
            DT_STRTAB => strtab = entry.value as usize,
            DT_STRSZ => strsz = entry.value as usize,
            DT_SYMENT => syment = entry.value as usize,
            DT_GNU_HASH => gnu_hash = entry.value as usize,
            _ => {}
        }
    }
    // glibc relocates these addresses in place on x86_64 and AArch64; an object whose section is
    // read-only keeps them relative to its base.
    let absolute = |address: usize| if address < base { base + address } else { address };
    let (symtab, strtab) = (absolute(symtab), absolute(strtab));
    if symtab == 0 || strtab <= symtab || syment != size_of::<libc::Elf64_Sym>() {
        return None;
    }
    // The string table follows the symbol table in every linker's layout: its start ends the
    // symbols.
    let count = ((strtab - symtab) / syment).min(MAX_SYMBOLS);
    let wanted = name.to_bytes_with_nul();
    let matches = |k: usize| {
        // SAFETY: callers pass `k < count`, within the symbol table, which ends where the string
        // table starts.
        let symbol = unsafe { &*(symtab as *const libc::Elf64_Sym).add(k) };
        let at = symbol.st_name as usize;
        if symbol.st_info & 0xf != STT_FUNC || symbol.st_shndx == SHN_UNDEF || at + wanted.len() > strsz {
            return None;
        }
        // SAFETY: `at + wanted.len()` lies within the string table of `strsz` bytes.
        let text = unsafe { std::slice::from_raw_parts((strtab + at) as *const u8, wanted.len()) };
        (text == wanted).then_some(base + symbol.st_value as usize)
    };
    if gnu_hash != 0 {
        // SAFETY: the object's own hash table, whose symbol indices lie below `count`.
        return unsafe { candidates(absolute(gnu_hash), name.to_bytes(), count) }.find_map(matches);
    }
    (0..count).find_map(matches)
}

/// The indices of the symbols whose GNU hash is `name`'s (the chain of its bucket in the table at
/// `table`, laid out as the ELF gABI extension describes: a header of four words, the Bloom
/// filter, the buckets, then one hash word per symbol from `symoffset`).
///
/// # Safety
/// `table` is a loaded object's `DT_GNU_HASH` table, for a symbol table of `count` symbols.
unsafe fn candidates(table: usize, name: &[u8], count: usize) -> impl Iterator<Item = usize> {
    let hash = name.iter().fold(5381u32, |h, &byte| h.wrapping_mul(33).wrapping_add(u32::from(byte)));
    let words = table as *const u32;
    // SAFETY: the header's four words.
    let (nbuckets, symoffset, bloom_size) =
        unsafe { (*words as usize, *words.add(1) as usize, *words.add(2) as usize) };
    let buckets = table + 16 + bloom_size * size_of::<usize>();
    let first = match nbuckets {
        0 => 0,
        // SAFETY: bucket `hash % nbuckets` of `nbuckets`.
        n => (unsafe { *(buckets as *const u32).add(hash as usize % n) }) as usize,
    };
    let chain = (buckets + nbuckets * 4) as *const u32;
    let mut next = (first >= symoffset && nbuckets != 0).then_some(first);
    std::iter::from_fn(move || {
        loop {
            let k = next.filter(|&k| k < count)?;
            // SAFETY: the chain holds one word per symbol from `symoffset`, and `k < count`.
            let word = unsafe { *chain.add(k - symoffset) };
            // The low bit ends the chain.
            next = (word & 1 == 0).then_some(k + 1);
            if word | 1 == hash | 1 {
                return Some(k);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_glibcs_own_functions_in_the_object_that_holds_them() {
        let getpid = libc::getpid as *const () as usize;
        assert_eq!(function_in_object_of(getpid, c"getpid"), Some(getpid));
        let dlopen = function_in_object_of(getpid, c"dlopen").expect("glibc 2.34+ has dlopen in libc");
        assert_ne!(dlopen, 0);
        assert_eq!(function_in_object_of(getpid, c"no_such_function_here"), None);
        // Found through libc's GNU hash table, at the addresses the dynamic linker binds to.
        let dlvsym = libc::dlvsym as *const () as usize;
        let dladdr = libc::dladdr as *const () as usize;
        assert_eq!(function_in_object_of(getpid, c"dlvsym"), Some(dlvsym));
        assert_eq!(function_in_object_of(dladdr, c"dladdr"), Some(dladdr));
        // An address in no loaded object.
        assert_eq!(function_in_object_of(16, c"getpid"), None);
    }
}
