//! Finds the region files to show: one file, or every container of a directory laid out as HAMi's
//! monitor sees it (`DIR/<pod-uid>_<container>/*.cache`), and reads each without writing it.
//!
//! Every file under a container's directory is written by its tenant, and `vgpu-smi` runs as root
//! on the node, so each is opened as `vgpu_ledger::region::tenant_file` opens them: one component
//! at a time from an open directory, never following a link, only a regular file, without
//! blocking; listings stop at [`MAX_CONTAINERS`] and [`MAX_ENTRIES`], reads at the region's size.
//! What is refused is skipped and reported ([`Listing::skipped`]), and the rest is shown. A
//! region's swap table (in the region file), when the scan asks for it, is opened the same way
//! (`crate::swap_tables`).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::path::{Path, PathBuf};

use vgpu_ledger::inspect::{InspectError, Snapshot, inspect_file};
use vgpu_ledger::region::tenant_file::{Access, Dir, Refusal};

use crate::swap_tables::{self, MappedTable, SwapView};

/// Entries of the scanned directory read at most (a node runs far fewer containers).
pub const MAX_CONTAINERS: usize = 4096;
/// Entries of one container's directory read at most (HAMi puts a region file and the library
/// there; anything past this many is a tenant's doing).
pub const MAX_ENTRIES: usize = 256;

/// One container's region, as read.
#[derive(Debug)]
pub struct Container {
    /// From the directory name (`<pod-uid>_<container>`); `None` for a single file.
    pub pod_uid: Option<String>,
    pub name: Option<String>,
    pub path: PathBuf,
    pub region: Result<Snapshot, InspectError>,
    /// Its swap table's view of the live processes, or why the table was refused; `None` when
    /// it has none (or the scan did not ask).
    pub swap: Option<Result<SwapView, String>>,
}

/// Something met while scanning that was not opened or not read to the end, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Skipped {
    /// The path, printable: control characters escaped.
    pub path: String,
    pub reason: String,
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
    /// What the scan refused: links, FIFOs and other non-regular files, odd names, entries past
    /// the caps.
    pub skipped: Vec<Skipped>,
}

impl Listing {
    /// The worst error's exit status: 3 for a file that cannot be read, 4 for one read and found
    /// wrong, 0 when every region was read. Skipped entries are not regions and change nothing.
    pub fn exit_status(&self) -> i32 {
        self.containers.iter().filter_map(|c| c.region.as_ref().err()).map(exit_status).max().unwrap_or(0)
    }

    /// One line per skipped entry, for stderr.
    pub fn skipped_lines(&self) -> String {
        self.skipped.iter().map(|s| format!("vgpu-smi: skipped {}: {}\n", s.path, s.reason)).collect()
    }
}

/// Exit status for an error reading a region (documented in the usage text).
pub fn exit_status(error: &InspectError) -> i32 {
    if error.is_unreadable() { 3 } else { 4 }
}

/// Reads the region at `path`, or every container's under the directory `path`.
pub fn load(path: &Path) -> Listing {
    visit(path, Access::Read, false, |_, _, _| {})
}

/// As [`load`], with each region's swap table read too (what the table, `--json` and the
/// metrics show).
pub fn load_with_swap(path: &Path) -> Listing {
    visit(path, Access::Read, true, |_, _, _| {})
}

/// As [`load`], opening each region for `access`; `with_file` gets each region that was read,
/// with the very file it was read from (and may write through it: nothing else is opened), and,
/// with `swap`, its swap table mapped if it has one that could be read.
pub fn visit(
    path: &Path,
    access: Access,
    swap: bool,
    mut with_file: impl FnMut(&Container, File, Option<MappedTable>),
) -> Listing {
    let root = path.to_owned();
    let mut listing = Listing {
        root,
        directory: false,
        containers: Vec::new(),
        without_region: Vec::new(),
        skipped: Vec::new(),
    };
    // The directories above the path asked for are the caller's; its last component may be a
    // tenant's (a container's region file): a link there is not followed, to a file or a directory.
    if !std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir()) {
        let (region, file, table) = match open_single(path, access) {
            Ok((dir, name, file)) => {
                let region = inspect_file(&file, path);
                let table = (swap && region.is_ok()).then(|| swap_tables::open(&dir, name, path)).flatten();
                (region, Some(file), table)
            }
            Err(error) => (Err(error), None, None),
        };
        let (swap, table) = swap_view(table, region.as_ref().ok());
        let container = Container { pod_uid: None, name: None, path: path.to_owned(), region, swap };
        if let (Ok(_), Some(file)) = (&container.region, file) {
            with_file(&container, file, table);
        }
        listing.containers.push(container);
        return listing;
    }
    listing.directory = true;
    let listed = Dir::open(path).and_then(|dir| Ok((dir.names(MAX_CONTAINERS)?, dir)));
    let ((mut names, more), root) = match listed {
        Ok(listed) => listed,
        Err(error) => {
            let region = Err(InspectError::Unreadable { path: path.to_owned(), error });
            let path = path.to_owned();
            listing.containers.push(Container { pod_uid: None, name: None, path, region, swap: None });
            return listing;
        }
    };
    if more {
        listing.skip(path, format!("more than {MAX_CONTAINERS} entries; the rest were not read"));
    }
    names.sort();
    for name in names {
        let Some(dir_name) = clean_name(&name) else {
            listing.skip(&path.join(&name), NAME_REFUSED.into());
            continue;
        };
        match root.subdir(&name) {
            Ok(dir) => container_dir(&mut listing, &dir, dir_name, access, swap, &mut with_file),
            // Files beside the container directories are not containers (HAMi's monitor agrees).
            Err(Refusal::WrongType { .. }) => {}
            Err(refusal) => listing.skip(&path.join(&name), refusal.to_string()),
        }
    }
    listing
}

/// As [`visit`] of the directory `root`, for its container directory `name` alone (what changed
/// there, read again without reading every other container).
pub fn visit_container(
    root: &Path,
    name: &OsStr,
    access: Access,
    swap: bool,
    mut with_file: impl FnMut(&Container, File, Option<MappedTable>),
) -> Listing {
    let mut listing = Listing {
        root: root.to_owned(),
        directory: true,
        containers: Vec::new(),
        without_region: Vec::new(),
        skipped: Vec::new(),
    };
    let Some(dir_name) = clean_name(name) else {
        listing.skip(&root.join(name), NAME_REFUSED.into());
        return listing;
    };
    match Dir::open(root).map_err(Refusal::Io).and_then(|root| root.subdir(name)) {
        Ok(dir) => container_dir(&mut listing, &dir, dir_name, access, swap, &mut with_file),
        Err(Refusal::WrongType { .. }) => {}
        Err(refusal) => listing.skip(&root.join(name), refusal.to_string()),
    }
    listing
}

const NAME_REFUSED: &str = "its name is not UTF-8 or holds control characters";

impl Listing {
    fn skip(&mut self, path: &Path, reason: String) {
        self.skipped.push(Skipped { path: printable(path), reason });
    }
}

/// One container's directory: its region file as HAMi's monitor picks it (a name containing
/// `.cache` that is not the library, `libvgpu.so`, mounted beside it; the first by name), passing
/// over what cannot be opened as a regular file.
fn container_dir(
    listing: &mut Listing,
    dir: &Dir,
    dir_name: &str,
    access: Access,
    swap: bool,
    with_file: &mut impl FnMut(&Container, File, Option<MappedTable>),
) {
    // HAMi splits at the first '_': pod UIDs have none, container names cannot have one.
    let (pod_uid, name) = match dir_name.split_once('_') {
        Some((uid, name)) => (uid.to_owned(), name.to_owned()),
        None => (dir_name.to_owned(), String::new()),
    };
    let (names, more) = match dir.names(MAX_ENTRIES) {
        Ok(listed) => listed,
        Err(error) => {
            let region = Err(InspectError::Unreadable { path: dir.path().to_owned(), error });
            let path = dir.path().to_owned();
            let (pod_uid, name) = (Some(pod_uid), Some(name));
            listing.containers.push(Container { pod_uid, name, path, region, swap: None });
            return;
        }
    };
    if more {
        listing.skip(dir.path(), format!("more than {MAX_ENTRIES} entries; the rest were not read"));
    }
    let mut candidates: Vec<OsString> = Vec::new();
    for entry in names {
        let lossy = entry.to_string_lossy();
        if !lossy.contains(".cache") || lossy.contains("libvgpu.so") {
            continue;
        }
        match clean_name(&entry) {
            Some(_) => candidates.push(entry),
            None => listing.skip(&dir.path().join(&entry), NAME_REFUSED.into()),
        }
    }
    candidates.sort();
    for candidate in candidates {
        let path = dir.path().join(&candidate);
        match dir.open_file(&candidate, access) {
            Ok(file) => {
                let region = inspect_file(&file, &path);
                let table =
                    (swap && region.is_ok()).then(|| swap_tables::open(dir, &candidate, &path)).flatten();
                let (swap, table) = swap_view(table, region.as_ref().ok());
                let (pod_uid, name) = (Some(pod_uid), Some(name));
                let container = Container { pod_uid, name, path, region, swap };
                if container.region.is_ok() {
                    with_file(&container, file, table);
                }
                listing.containers.push(container);
                return;
            }
            Err(refusal) => listing.skip(&path, refusal.to_string()),
        }
    }
    listing.without_region.push(dir_name.to_owned());
}

/// The view of an opened swap table (the table kept only if it could be read), for the region
/// `snapshot`.
fn swap_view(
    table: Option<Result<MappedTable, String>>,
    snapshot: Option<&Snapshot>,
) -> (Option<Result<SwapView, String>>, Option<MappedTable>) {
    match (table, snapshot) {
        (Some(Ok(table)), Some(snapshot)) => match swap_tables::view(&table, snapshot) {
            Ok(view) => (Some(Ok(view)), Some(table)),
            Err(error) => (Some(Err(error)), None),
        },
        (Some(Err(error)), _) => (Some(Err(error)), None),
        _ => (None, None),
    }
}

/// Reads the one region file at `path`, opened as [`visit`] opens one, and its swap table (as
/// [`Container::swap`]).
pub fn read_single(path: &Path) -> (Result<Snapshot, InspectError>, Option<Result<SwapView, String>>) {
    let (dir, name, file) = match open_single(path, Access::Read) {
        Ok(opened) => opened,
        Err(error) => return (Err(error), None),
    };
    let region = inspect_file(&file, path);
    let table = region.is_ok().then(|| swap_tables::open(&dir, name, path)).flatten();
    let (swap, _) = swap_view(table, region.as_ref().ok());
    (region, swap)
}

/// Opens a file named on the command line: links in its directory's path are the caller's, but
/// the file itself is opened as a tenant's (a link there is refused, not followed). With the
/// directory it was opened from and its name there.
fn open_single(path: &Path, access: Access) -> Result<(Dir, &OsStr, File), InspectError> {
    let unreadable = |error: std::io::Error| match error.kind() {
        std::io::ErrorKind::NotFound => InspectError::Missing { path: path.to_owned() },
        _ => InspectError::Unreadable { path: path.to_owned(), error },
    };
    let (parent, name) = match (path.parent(), path.file_name()) {
        (Some(parent), Some(name)) => {
            (if parent.as_os_str().is_empty() { Path::new(".") } else { parent }, name)
        }
        _ => return Err(unreadable(std::io::Error::other("not a file name"))),
    };
    let dir = Dir::open(parent).map_err(unreadable)?;
    let file = dir.open_file(name, access).map_err(|refusal| unreadable(refusal.into_io_error()))?;
    Ok((dir, name, file))
}

/// `name` if it is UTF-8 without control characters (what a terminal can be shown safely).
fn clean_name(name: &OsStr) -> Option<&str> {
    name.to_str().filter(|text| !text.chars().any(char::is_control))
}

/// `path` as text with control characters escaped (`\u{1b}`), for messages.
pub fn printable(path: &Path) -> String {
    path.to_string_lossy()
        .chars()
        .map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// An empty folder of this test's own under the temporary directory.
    pub(crate) fn scratch(name: &str) -> PathBuf {
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
