//! Host pids of the regions' processes. A lease records the pid its process had in its own pid
//! namespace (the container's); the node sees another number. The process with a lease is the
//! one that maps the region file and whose innermost pid (`NSpid` in `/proc/PID/status`) is the
//! lease's pid: found by one scan of the node's `/proc` for every region of a listing
//! ([`crate::accounting`] reads those files as a tenant's). Another user's `/proc/PID/maps` is
//! refused to a root process with only a container runtime's default capabilities;
//! `CAP_SYS_PTRACE` lets it read them (docs/container-budget.md, "Under an OCI runtime"). Without
//! it such processes show no host pid, and one line on stderr says why. A process in a user
//! namespace of its own (Kubernetes `hostUsers: false`) is read without it, whatever its uid: the
//! host's root owns that namespace and holds every capability in it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::containers::Listing;

/// Per region file, the host pid of each lease's pid found mapping it; a pid with no such
/// process, or more than one, is left out.
#[derive(Debug, Default)]
pub struct HostPids(HashMap<PathBuf, HashMap<i32, i32>>);

impl HostPids {
    /// The host pids of every region of `listing`, from one scan of `/proc`.
    pub fn of(listing: &Listing) -> HostPids {
        let regions: Vec<(&Path, Vec<i32>)> = listing
            .containers
            .iter()
            .filter_map(|c| c.region.as_ref().ok())
            .map(|region| (region.path.as_path(), region.leases.iter().map(|lease| lease.pid).collect()))
            .collect();
        let found = crate::accounting::lease_holders(&regions);
        HostPids(regions.iter().map(|(path, _)| path.to_path_buf()).zip(found).collect())
    }

    /// The host pid of the process that holds lease pid `pid` of the region at `region`.
    pub fn get(&self, region: &Path, pid: i32) -> Option<i32> {
        self.0.get(region)?.get(&pid).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_found_mapping_a_file_it_maps() {
        let path = std::env::temp_dir().join(format!("vgpu-smi-host-pids-{}", std::process::id()));
        std::fs::write(&path, vec![0u8; 4096]).unwrap();
        let file = std::fs::File::open(&path).unwrap();
        // SAFETY: a read-only shared mapping of 4096 bytes of an open file; unmapped below.
        let map = unsafe {
            use std::os::fd::AsRawFd;
            libc::mmap(std::ptr::null_mut(), 4096, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0)
        };
        assert_ne!(map, libc::MAP_FAILED);
        // Run outside any pid namespace of its own, this process's innermost pid is its pid.
        let me = std::process::id() as i32;
        let found = crate::accounting::lease_holders(&[(path.as_path(), vec![me])]);
        assert_eq!(found, vec![HashMap::from([(me, me)])]);
        // SAFETY: the mapping made above, not used afterwards.
        unsafe { libc::munmap(map, 4096) };
        let found = crate::accounting::lease_holders(&[(path.as_path(), vec![me])]);
        assert_eq!(found, vec![HashMap::new()], "no longer mapped");
        std::fs::remove_file(&path).unwrap();
    }
}
