//! Live resize: a container's budget or compute share changed in its region while its processes
//! run (`vgpu-smi resize`). The region is the authority, and processes read it at every charge
//! and query, so the change reaches all of them at their next call.
//!
//! Growing lets allocations through at once. Shrinking below what is held refuses new
//! allocations until usage is back under the new budget; nothing already allocated is touched.
//! HAMi's monitor reads the same limit and share fields, so its view follows.
//!
//! A device without a budget (or share) cannot be given one here: its processes pass those calls
//! straight to the driver and never counted them. Nor can one be taken away (0), for the same
//! reason seen from processes that start later.

use std::fmt;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::Ordering;

use crate::config::{NOT_A_SHARE, NOT_A_SIZE, parse_share, parse_size};
use crate::region::layout::{
    BYTE_MASK, LEASE_LIVE, MAX_DEVICES, MAX_PROCESSES, OWNER_FOLLOWS_RESIZE, UNLIMITED,
};
use crate::region::{Region, RegionError, field, i32_at, lease_is_held, u32_at, u64_at};

/// What to change on one device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// The memory budget, in bytes.
    Budget(u64),
    /// The compute share, in percent (1 to 99).
    Share(u64),
}

impl Change {
    /// A budget as the environment writes it (`8g`, `4000m`, bytes), with its messages.
    pub fn budget(text: &str) -> Result<Change, ResizeError> {
        match parse_size(text) {
            Some(0) => Err(ResizeError::WouldLift { what: "budget" }),
            Some(bytes) if bytes <= BYTE_MASK => Ok(Change::Budget(bytes)),
            Some(_) => Err(ResizeError::BadValue { value: text.to_owned(), why: "is larger than 256 TiB" }),
            None => Err(ResizeError::BadValue { value: text.to_owned(), why: NOT_A_SIZE }),
        }
    }

    /// A share as the environment writes it (a whole percentage).
    pub fn share(text: &str) -> Result<Change, ResizeError> {
        match parse_share(text) {
            Some(0 | 100) => Err(ResizeError::WouldLift { what: "compute share" }),
            Some(percent) => Ok(Change::Share(percent)),
            None => Err(ResizeError::BadValue { value: text.to_owned(), why: NOT_A_SHARE }),
        }
    }
}

/// Why a resize was refused; nothing was changed.
#[derive(Debug)]
pub enum ResizeError {
    Region(RegionError),
    BadValue {
        value: String,
        why: &'static str,
    },
    /// 0 (or 100 %) would lift the limit, which a running container cannot take back.
    WouldLift {
        what: &'static str,
    },
    NoSuchDevice {
        device: usize,
        devices: usize,
    },
    /// The device has no budget (or share) to change.
    NotLimited {
        device: usize,
        what: &'static str,
    },
}

impl fmt::Display for ResizeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ResizeError::Region(error) => write!(f, "{error}"),
            ResizeError::BadValue { value, why } => write!(f, "{value:?} {why}; nothing changed"),
            ResizeError::WouldLift { what } => write!(
                f,
                "a {what} of 0 would lift the limit, and processes that start later would then not count \
                 what they use; give a size (a share from 1 to 99); nothing changed"
            ),
            ResizeError::NoSuchDevice { device, devices } => {
                write!(f, "the region has no device {device} (it has {devices}); nothing changed")
            }
            ResizeError::NotLimited { device, what } => write!(
                f,
                "device {device} has no {what}: its processes pass those calls straight to the driver and \
                 never counted them, so one can only be set when the container starts; nothing changed"
            ),
        }
    }
}

impl From<RegionError> for ResizeError {
    fn from(error: RegionError) -> ResizeError {
        ResizeError::Region(error)
    }
}

/// What a resize did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Resized {
    pub device: usize,
    pub uuid: String,
    pub change: Change,
    /// The budget in bytes, or the share in percent, before.
    pub before: u64,
    /// The container's bytes on the device at the moment of the change.
    pub used: u64,
    /// Pids of live processes whose library keeps the budgets it started with (release 0.1.0).
    pub not_following: Vec<i32>,
}

/// Changes device `device` (region device index) of the region in `file`, which the caller opened
/// and checked as a tenant's file (`region::tenant_file`) from `path`: nothing else is opened.
pub fn resize_file(file: File, path: &Path, device: usize, change: Change) -> Result<Resized, ResizeError> {
    let region = Region::from_checked_file(file, path)?;
    let devices = (u64_at(field!(region, device_num)).load(Ordering::Acquire) as usize).min(MAX_DEVICES);
    if device >= devices {
        return Err(ResizeError::NoSuchDevice { device, devices });
    }
    let before = match change {
        Change::Budget(bytes) => {
            let budget = u64_at(field!(region, ledger.limit[device]));
            let before = budget.load(Ordering::Acquire);
            if before == UNLIMITED {
                return Err(ResizeError::NotLimited { device, what: "memory budget" });
            }
            // The ledger's budget is what every charge compares with; HAMi's copy is what the
            // monitor shows.
            budget.store(bytes, Ordering::Release);
            u64_at(field!(region, limit[device])).store(bytes, Ordering::Release);
            before
        }
        Change::Share(percent) => {
            let share = u64_at(field!(region, sm_limit[device]));
            let before = share.load(Ordering::Acquire);
            if before == 0 || before >= 100 {
                return Err(ResizeError::NotLimited { device, what: "compute share" });
            }
            share.store(percent, Ordering::Release);
            before
        }
    };
    let not_following = (0..MAX_PROCESSES)
        .filter(|&k| {
            u32_at(field!(region, ledger.leases[k].state)).load(Ordering::Acquire) == LEASE_LIVE
                && u32_at(field!(region, ledger.leases[k].slot)).load(Ordering::Acquire)
                    & OWNER_FOLLOWS_RESIZE
                    == 0
                && lease_is_held(region.fd(), k)
        })
        .map(|k| i32_at(field!(region, ledger.leases[k].pid)).load(Ordering::Acquire))
        .collect();
    Ok(Resized {
        device,
        uuid: String::from_utf8_lossy(&region.read_uuid(device)).into_owned(),
        change,
        before,
        used: u64_at(field!(region, ledger.used[device])).load(Ordering::Acquire) & BYTE_MASK,
        not_following,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_as_the_environment_reads_them() {
        assert_eq!(Change::budget("4000m").unwrap(), Change::Budget(4000 << 20));
        assert_eq!(Change::budget(" 2GiB ").unwrap(), Change::Budget(2 << 30));
        assert_eq!(Change::share("30").unwrap(), Change::Share(30));
        let bad = Change::budget("lots").unwrap_err().to_string();
        assert_eq!(bad, format!("\"lots\" {NOT_A_SIZE}; nothing changed"));
        assert!(Change::share("130").unwrap_err().to_string().contains(NOT_A_SHARE));
        assert!(matches!(Change::budget("0"), Err(ResizeError::WouldLift { .. })));
        assert!(matches!(Change::share("100"), Err(ResizeError::WouldLift { .. })));
    }
}
