//! The size parser of the environment contract (`vgpu_ledger::config::parse_size`): never a
//! panic, and what it accepts is what it says: digits and one of the documented units, the
//! number times the unit without overflow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vgpu_ledger::config::parse_size;

fuzz_target!(|input: &[u8]| {
    let text = String::from_utf8_lossy(input);
    let Some(bytes) = parse_size(&text) else { return };
    let trimmed = text.trim();
    let digits = trimmed.find(|c: char| !c.is_ascii_digit()).unwrap_or(trimmed.len());
    let number: u64 = trimmed[..digits].parse().expect("accepted sizes start with a u64");
    let shift = match trimmed[digits..].to_ascii_lowercase().as_str() {
        "" => 0,
        "k" | "ki" | "kib" => 10,
        "m" | "mi" | "mib" => 20,
        "g" | "gi" | "gib" => 30,
        "t" | "ti" | "tib" => 40,
        unit => panic!("accepted the unit {unit:?} in {text:?}"),
    };
    assert_eq!(number.checked_mul(1 << shift), Some(bytes), "{text:?}");
    // Plain bytes read back as themselves.
    assert_eq!(parse_size(&bytes.to_string()), Some(bytes));
});
