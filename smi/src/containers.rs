//! Finds the region files to show: one file, or every container of a directory laid out as HAMi's
//! monitor sees it (`DIR/<pod-uid>_<container>/*.cache`), and reads each without writing it.

use std::path::{Path, PathBuf};

use vgpu_ledger::inspect::{InspectError, Snapshot, inspect};

/// One container's region, as read.
#[derive(Debug)]
pub struct Container {
    /// From the directory name (`<pod-uid>_<container>`); `None` for a single file.
    pub pod_uid: Option<String>,
    pub name: Option<String>,
    pub path: PathBuf,
    pub region: Result<Snapshot, InspectError>,
}

/// What was found at the path asked for.
#[derive(Debug)]
pub struct Listing {
    /// The path asked for.
    pub root: PathBuf,
    pub directory: bool,
    pub containers: Vec<Container>,
    /// Container directories with no region file yet (no process there has started CUDA);
    /// HAMi's monitor skips them too.
    pub without_region: Vec<String>,
}

impl Listing {
    /// The worst error's exit status: 3 for a file that cannot be read, 4 for one read and found
    /// wrong, 0 when every region was read.
    pub fn exit_status(&self) -> i32 {
        self.containers.iter().filter_map(|c| c.region.as_ref().err()).map(exit_status).max().unwrap_or(0)
    }
}

/// Exit status for an error reading a region (documented in the usage text).
pub fn exit_status(error: &InspectError) -> i32 {
    if error.is_unreadable() { 3 } else { 4 }
}

/// Reads the region at `path`, or every container's under the directory `path`.
pub fn load(path: &Path) -> Listing {
    let root = path.to_owned();
    if !path.is_dir() {
        let region = inspect(path);
        let containers = vec![Container { pod_uid: None, name: None, path: root.clone(), region }];
        return Listing { root, directory: false, containers, without_region: Vec::new() };
    }
    let mut listing = Listing { root, directory: true, containers: Vec::new(), without_region: Vec::new() };
    let entries = match std::fs::read_dir(path) {
        Ok(entries) => entries,
        Err(error) => {
            let region = Err(InspectError::Unreadable { path: path.to_owned(), error });
            listing.containers.push(Container { pod_uid: None, name: None, path: path.to_owned(), region });
            return listing;
        }
    };
    let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).filter(|p| p.is_dir()).collect();
    dirs.sort();
    for dir in dirs {
        let dir_name = dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        // HAMi splits at the first '_': pod UIDs have none, container names cannot have one.
        let (pod_uid, name) = match dir_name.split_once('_') {
            Some((uid, name)) => (uid.to_owned(), name.to_owned()),
            None => (dir_name.clone(), String::new()),
        };
        match cache_file(&dir) {
            Some(file) => listing.containers.push(Container {
                pod_uid: Some(pod_uid),
                name: Some(name),
                region: inspect(&file),
                path: file,
            }),
            None => listing.without_region.push(dir_name),
        }
    }
    listing
}

/// The region file of a container directory as HAMi's monitor picks it: a name containing
/// `.cache` that is not the library (`libvgpu.so`) mounted beside it; the first by name.
fn cache_file(dir: &Path) -> Option<PathBuf> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".cache") && !name.contains("libvgpu.so"))
        .collect();
    names.sort();
    names.first().map(|name| dir.join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vgpu-smi-unit-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_directory_lists_containers_as_hami_names_them() {
        let dir = scratch("layout");
        for (sub, files) in [
            ("uid-b_main", &["cudevshr.cache", "libvgpu.so"][..]),
            ("uid-a_sidecar", &["x.cache"]),
            ("uid-c_idle", &["libvgpu.so"]),
        ] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
            for file in files {
                std::fs::write(dir.join(sub).join(file), b"junk").unwrap();
            }
        }
        std::fs::write(dir.join("stray.cache"), b"junk").unwrap();
        let listing = load(&dir);
        assert!(listing.directory);
        let names: Vec<_> = listing
            .containers
            .iter()
            .map(|c| (c.pod_uid.as_deref().unwrap(), c.name.as_deref().unwrap(), c.path.file_name().unwrap()))
            .collect();
        assert_eq!(
            names,
            [("uid-a", "sidecar", "x.cache".as_ref()), ("uid-b", "main", "cudevshr.cache".as_ref())]
        );
        assert_eq!(listing.without_region, ["uid-c_idle"]);
        // Four bytes of text: read, and found not to be a region.
        assert_eq!(listing.exit_status(), 4);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_file_is_status_3() {
        let listing = load(Path::new("/nonexistent/vgpu-smi.cache"));
        assert!(!listing.directory);
        assert_eq!(listing.exit_status(), 3);
    }
}
