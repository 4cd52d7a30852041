//! Opens a container's region inside a folder that every pod on the node can write (KAI-Scheduler's
//! layout, docs/container-budget.md): another pod may have put a symbolic link, a folder or a hard
//! link where this container's folder or region is expected, to move this container's processes
//! onto a region that is not theirs.
//!
//! The folder given as `below` is trusted (the node mounted it); every name under it is opened
//! relative to the folder above it, with `O_NOFOLLOW`, so no link is followed at any step, and the
//! region must be a regular file with one name. A folder that is missing is made, mode 0777 as
//! HAMi-core makes it (every process of the container, under any uid, must be able to add to it).

use std::ffi::{CString, OsStr};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path};

/// Whether a missing folder or region is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Make {
    /// Make what is missing: the process that attaches to the region.
    Missing,
    /// Make nothing; a missing name is `NotFound`.
    Nothing,
}

/// Opens `path`, which lies under `below`, without following a link under `below`; with
/// [`Make::Missing`] read-write, making the folders and the file that are missing.
pub fn open(below: &Path, path: &Path, make: Make) -> io::Result<File> {
    let names = names_below(below, path)?;
    let (file_name, folders) = names.split_last().ok_or_else(|| refused(path, "names no file"))?;
    let mut dir = open_at(libc::AT_FDCWD, &c_name(below.as_os_str())?, directory_flags(true))?;
    for name in folders {
        let c = c_name(name)?;
        dir = match open_at(dir.as_raw_fd(), &c, directory_flags(false)) {
            Err(error) if error.kind() == io::ErrorKind::NotFound && make == Make::Missing => {
                make_folder(dir.as_raw_fd(), &c)?;
                open_at(dir.as_raw_fd(), &c, directory_flags(false))
            }
            other => other,
        }
        .map_err(|error| explained(path, name, error, "is a symbolic link or not a folder"))?;
    }
    let c = c_name(file_name)?;
    // A name that exists must be a regular file before it is opened: opening a FIFO or a device
    // another pod put there could wait or act.
    if let Some(kind) = kind_at(dir.as_raw_fd(), &c)?
        && kind != libc::S_IFREG
    {
        return Err(refused(path, "is not a regular file (a symbolic link, a folder or a device)"));
    }
    let access = match make {
        Make::Missing => libc::O_RDWR | libc::O_CREAT,
        Make::Nothing => libc::O_RDONLY,
    };
    let flags = access | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY;
    let fd = open_at(dir.as_raw_fd(), &c, flags)
        .map_err(|error| explained(path, file_name, error, "is a symbolic link"))?;
    let file = File::from(fd);
    let meta = file.metadata()?;
    use std::os::unix::fs::MetadataExt;
    if !meta.is_file() {
        return Err(refused(path, "is not a regular file"));
    }
    // A second name may be another container's region linked into this folder.
    if meta.nlink() > 1 {
        return Err(refused(
            path,
            &format!("has {} names (a hard link): it may be another container's region", meta.nlink()),
        ));
    }
    Ok(file)
}

/// The names of `path` below `below`, each a plain name (no `.`, `..` or root).
fn names_below<'a>(below: &Path, path: &'a Path) -> io::Result<Vec<&'a OsStr>> {
    let rest =
        path.strip_prefix(below).map_err(|_| refused(path, &format!("is not in {}", below.display())))?;
    rest.components()
        .map(|component| match component {
            Component::Normal(name) => Ok(name),
            _ => Err(refused(path, "has a component that is not a plain name")),
        })
        .collect()
}

fn directory_flags(follow: bool) -> libc::c_int {
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC | nofollow
}

fn c_name(name: &OsStr) -> io::Result<CString> {
    CString::new(name.as_bytes()).map_err(|_| io::Error::other("a name holds a NUL byte"))
}

fn open_at(dir: RawFd, name: &CString, flags: libc::c_int) -> io::Result<OwnedFd> {
    // SAFETY: `name` is NUL-terminated; `dir` is an open directory or AT_FDCWD; the mode is read
    // only with O_CREAT.
    let fd = unsafe { libc::openat(dir, name.as_ptr(), flags, 0o666 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: openat returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Makes the folder `name` in `dir`, mode 0777 whatever the umask; one another process made
/// first is fine (it is checked when opened).
fn make_folder(dir: RawFd, name: &CString) -> io::Result<()> {
    // SAFETY: `name` is NUL-terminated and `dir` an open directory.
    if unsafe { libc::mkdirat(dir, name.as_ptr(), 0o777) } != 0 {
        let error = io::Error::last_os_error();
        return if error.kind() == io::ErrorKind::AlreadyExists { Ok(()) } else { Err(error) };
    }
    let made = open_at(dir, name, directory_flags(false))?;
    // SAFETY: `made` is an open descriptor of the folder just made.
    if unsafe { libc::fchmod(made.as_raw_fd(), 0o777) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The file type (`S_IFMT` bits) of `name` in `dir`, not following a link; `None` when absent.
fn kind_at(dir: RawFd, name: &CString) -> io::Result<Option<libc::mode_t>> {
    let mut stat = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `name` is NUL-terminated, `dir` an open directory, `stat` a valid out-pointer.
    let status = unsafe { libc::fstatat(dir, name.as_ptr(), stat.as_mut_ptr(), libc::AT_SYMLINK_NOFOLLOW) };
    if status != 0 {
        let error = io::Error::last_os_error();
        return if error.kind() == io::ErrorKind::NotFound { Ok(None) } else { Err(error) };
    }
    // SAFETY: fstatat succeeded, so it filled `stat`.
    Ok(Some(unsafe { stat.assume_init() }.st_mode & libc::S_IFMT))
}

fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::other(format!("{} {why}", path.display()))
}

/// An error opening `name` of `path`: a link or a wrong type said plainly, anything else as is.
fn explained(path: &Path, name: &OsStr, error: io::Error, why: &str) -> io::Error {
    match error.raw_os_error() {
        Some(libc::ELOOP | libc::ENOTDIR) => {
            io::Error::other(format!("{}: {} {why}", path.display(), name.to_string_lossy()))
        }
        _ => error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("vgpu-confined-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn missing_folders_are_made_open_to_every_uid() {
        let hook = scratch("make");
        let region = hook.join("containers/uid_main/usage.cache");
        open(&hook, &region, Make::Missing).unwrap();
        for folder in ["containers", "containers/uid_main"] {
            let mode = std::fs::metadata(hook.join(folder)).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o777, "{folder}");
        }
        assert!(region.is_file());
        std::fs::remove_dir_all(&hook).unwrap();
    }

    #[test]
    fn links_and_second_names_are_refused() {
        let hook = scratch("links");
        let other = hook.join("containers/other_x");
        std::fs::create_dir_all(&other).unwrap();
        std::fs::write(other.join("usage.cache"), b"theirs").unwrap();
        // A link to another container's folder, and one to its region in a folder of our own.
        std::os::unix::fs::symlink("other_x", hook.join("containers/a_main")).unwrap();
        let error = open(&hook, &hook.join("containers/a_main/usage.cache"), Make::Missing).unwrap_err();
        assert!(error.to_string().contains("a_main is a symbolic link"), "{error}");
        std::fs::create_dir_all(hook.join("containers/b_main")).unwrap();
        std::os::unix::fs::symlink("../other_x/usage.cache", hook.join("containers/b_main/usage.cache"))
            .unwrap();
        let error = open(&hook, &hook.join("containers/b_main/usage.cache"), Make::Nothing).unwrap_err();
        assert!(error.to_string().contains("not a regular file"), "{error}");
        std::fs::create_dir_all(hook.join("containers/c_main")).unwrap();
        std::fs::hard_link(other.join("usage.cache"), hook.join("containers/c_main/usage.cache")).unwrap();
        let error = open(&hook, &hook.join("containers/c_main/usage.cache"), Make::Missing).unwrap_err();
        assert!(error.to_string().contains("2 names"), "{error}");
        let error = open(&hook, &hook.join("containers/../x.cache"), Make::Missing).unwrap_err();
        assert!(error.to_string().contains("not a plain name"), "{error}");
        assert_eq!(std::fs::read(other.join("usage.cache")).unwrap(), b"theirs");
        std::fs::remove_dir_all(&hook).unwrap();
    }
}
