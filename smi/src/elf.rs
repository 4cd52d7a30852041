//! The names a shared library exports: defined, global or weak functions of its dynamic symbol
//! table, read straight from the ELF file (no `nm` needed on a GPU node).

use std::path::Path;

/// Why a library's exports could not be read.
#[derive(Debug)]
pub enum ElfError {
    Io(std::io::Error),
    NotElf64,
    NoDynamicSymbols,
}

impl std::fmt::Display for ElfError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ElfError::Io(error) => write!(f, "{error}"),
            ElfError::NotElf64 => write!(f, "not a 64-bit little-endian ELF file"),
            ElfError::NoDynamicSymbols => write!(f, "no dynamic symbol table"),
        }
    }
}

const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const STB_GLOBAL: u8 = 1;
const STB_WEAK: u8 = 2;

fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(bytes: &[u8], at: usize) -> Option<usize> {
    usize::try_from(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?)).ok()
}

/// The exported function names of the library at `path`, sorted.
pub fn exported_functions(path: &Path) -> Result<Vec<String>, ElfError> {
    let bytes = std::fs::read(path).map_err(ElfError::Io)?;
    parse(&bytes)
}

fn parse(bytes: &[u8]) -> Result<Vec<String>, ElfError> {
    // e_ident: magic, ELFCLASS64 (2), ELFDATA2LSB (1).
    if bytes.get(..6) != Some(&[0x7f, b'E', b'L', b'F', 2, 1][..]) {
        return Err(ElfError::NotElf64);
    }
    let shoff = u64_at(bytes, 0x28).ok_or(ElfError::NotElf64)?;
    let shentsize = usize::from(u16_at(bytes, 0x3a).ok_or(ElfError::NotElf64)?);
    let shnum = usize::from(u16_at(bytes, 0x3c).ok_or(ElfError::NotElf64)?);
    let header = |i: usize| shoff + i * shentsize;
    let dynsym = (0..shnum)
        .find(|&i| u32_at(bytes, header(i) + 4) == Some(SHT_DYNSYM))
        .ok_or(ElfError::NoDynamicSymbols)?;
    let at = header(dynsym);
    let (offset, size, link, entsize) = (
        u64_at(bytes, at + 0x18),
        u64_at(bytes, at + 0x20),
        u32_at(bytes, at + 0x28),
        u64_at(bytes, at + 0x38),
    );
    let (Some(offset), Some(size), Some(link), Some(entsize)) = (offset, size, link, entsize) else {
        return Err(ElfError::NoDynamicSymbols);
    };
    let strtab = u64_at(bytes, header(link as usize) + 0x18).ok_or(ElfError::NoDynamicSymbols)?;
    let mut names = Vec::new();
    for symbol in (offset..offset + size).step_by(entsize.max(24)) {
        let (Some(name), Some(&info), Some(shndx)) =
            (u32_at(bytes, symbol), bytes.get(symbol + 4), u16_at(bytes, symbol + 6))
        else {
            break;
        };
        let binding = info >> 4;
        if shndx == 0 || info & 0xf != STT_FUNC || !(binding == STB_GLOBAL || binding == STB_WEAK) {
            continue;
        }
        let start = strtab + name as usize;
        let Some(rest) = bytes.get(start..) else { continue };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        if let Ok(text) = std::str::from_utf8(&rest[..end]) {
            names.push(text.to_owned());
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_exports_of_a_real_library() {
        // libc is on every machine the tests run on; it exports malloc and not our names.
        let libc =
            ["/lib/x86_64-linux-gnu/libc.so.6", "/lib/aarch64-linux-gnu/libc.so.6", "/usr/lib64/libc.so.6"]
                .into_iter()
                .map(Path::new)
                .find(|path| path.exists())
                .expect("a libc.so.6");
        let names = exported_functions(libc).expect("readable");
        assert!(names.iter().any(|n| n == "malloc"), "{} names", names.len());
        assert!(!names.iter().any(|n| n == "cuMemAlloc_v2"));
    }

    #[test]
    fn refuses_what_is_not_elf() {
        assert!(matches!(parse(b"#!/bin/sh\n"), Err(ElfError::NotElf64)));
        assert!(matches!(parse(&[]), Err(ElfError::NotElf64)));
    }
}
