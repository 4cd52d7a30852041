//! Opening files a container's tenant can write, from a process outside the container (node-side
//! tools such as `vgpu-smi`), so that no such file can steer that process.
//!
//! A tenant may put anything where its region file is expected: a symbolic link to a node file or
//! to another container's region, a FIFO (opening it to read waits for a writer), a device node
//! (opening one can act on the device), a directory, a file of any size, a file under a lease (an
//! open waits until the lease breaks). So, inside a tree a tenant can write:
//! - every name is opened relative to an already-open directory, one component at a time, with
//!   `O_NOFOLLOW`: a link is never followed, in any component;
//! - a file is first opened with `O_PATH` (which opens nothing: no FIFO, device or lease is
//!   touched), its type checked with `fstat`, and only a regular file is then reopened for
//!   reading (through `/proc/self/fd`, so exactly the inode checked; where `/proc` is absent, by
//!   name with `O_NOFOLLOW`, and the inode compared);
//! - every open is `O_NONBLOCK | O_CLOEXEC | O_NOCTTY`; a file opened for writing must have one
//!   name only (a hard link could reach a file outside the tree);
//! - a directory is listed from its descriptor, up to a cap the caller gives;
//! - reads stop at a bound the caller gives ([`read_at_most`]), whatever the file's size.
//!
//! A path the caller names itself (the tree's root, or a file named on a command line with
//! [`open_named`]) is the caller's: links in it are followed, but what it names must still be a
//! regular file (or directory).

use std::ffi::{CStr, CString, OsStr, OsString};
use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

/// Why a name met in a tenant's tree was not opened (or, for writing, not used).
#[derive(Debug)]
pub enum Refusal {
    /// A symbolic link: never followed.
    Symlink,
    /// Something other than what was wanted (`found`: "a FIFO", "a directory", …).
    WrongType { found: &'static str, wanted: &'static str },
    /// A file to be written that has more than one name.
    HardLinked { links: u64 },
    /// The name was given to another file between the check and the open.
    Replaced,
    /// The name holds a NUL byte or a `/`: not one directory entry.
    BadName,
    /// The open or the `fstat` failed (missing, permissions, a lease held: `EWOULDBLOCK`).
    Io(io::Error),
}

impl Refusal {
    /// The same, as an I/O error (for callers that report one).
    pub fn into_io_error(self) -> io::Error {
        match self {
            Refusal::Io(error) => error,
            other => io::Error::other(other.to_string()),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::Symlink => write!(f, "a symbolic link (links are not followed)"),
            Refusal::WrongType { found, wanted } => write!(f, "not {wanted} ({found})"),
            Refusal::HardLinked { links } => {
                write!(f, "{links} names link to it (a file with more than one name is not written)")
            }
            Refusal::Replaced => write!(f, "replaced by another file while it was opened"),
            Refusal::BadName => write!(f, "not a single directory entry"),
            Refusal::Io(error) => write!(f, "{error}"),
        }
    }
}

/// How a file is opened once checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    ReadWrite,
}

/// A directory of a tenant's tree, open, reached without following a link.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
}

impl Dir {
    /// Opens the directory the caller named (links in that path are the caller's, followed).
    pub fn open(path: &Path) -> io::Result<Dir> {
        let name = c_path(path.as_os_str())?;
        let fd = openat(libc::AT_FDCWD, &name, libc::O_RDONLY | libc::O_DIRECTORY)?;
        Ok(Dir { fd, path: path.to_owned() })
    }

    /// Where this directory is, for messages.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Opens the entry `name` of this directory, which must be a directory and not a link.
    pub fn subdir(&self, name: &OsStr) -> Result<Dir, Refusal> {
        let c_name = entry_name(name)?;
        let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW;
        match openat(self.fd.as_raw_fd(), &c_name, flags) {
            Ok(fd) => Ok(Dir { fd, path: self.path.join(name) }),
            Err(error) if matches!(error.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => {
                Err(match self.kind_of(&c_name) {
                    Some(libc::S_IFLNK) => Refusal::Symlink,
                    Some(mode) => Refusal::WrongType { found: type_name(mode), wanted: "a directory" },
                    None => Refusal::Io(error),
                })
            }
            Err(error) => Err(Refusal::Io(error)),
        }
    }

    /// The type bits of entry `name`, not following a link; `None` if it cannot be told.
    fn kind_of(&self, name: &CStr) -> Option<libc::mode_t> {
        // SAFETY: `stat` is plain data, filled by the kernel.
        let mut stat: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid directory descriptor, a NUL-terminated name and a valid out-pointer.
        let status = unsafe {
            libc::fstatat(self.fd.as_raw_fd(), name.as_ptr(), &mut stat, libc::AT_SYMLINK_NOFOLLOW)
        };
        (status == 0).then_some(stat.st_mode & libc::S_IFMT)
    }

    /// The names of up to `cap` entries (`.` and `..` left out), in the order the directory
    /// gives them; `true` when more were left unread.
    pub fn names(&self, cap: usize) -> io::Result<(Vec<OsString>, bool)> {
        // A stream of its own, over a duplicate descriptor: closing the stream closes only that.
        // SAFETY: duplicating a valid descriptor.
        let copy = unsafe { libc::fcntl(self.fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if copy < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `copy` is a directory descriptor we own; on success the stream owns it.
        let stream = unsafe { libc::fdopendir(copy) };
        if stream.is_null() {
            let error = io::Error::last_os_error();
            // SAFETY: `copy` is ours and was not taken by a stream.
            unsafe { libc::close(copy) };
            return Err(error);
        }
        // The duplicate shares the read position with `self.fd`: start from the beginning.
        // SAFETY: a valid directory stream.
        unsafe { libc::rewinddir(stream) };
        let mut names = Vec::new();
        let mut more = false;
        let result = loop {
            // SAFETY: errno is this thread's; readdir reports an error only through it.
            unsafe { *libc::__errno_location() = 0 };
            // SAFETY: a valid directory stream; the entry lives until the next readdir call.
            let entry = unsafe { libc::readdir(stream) };
            if entry.is_null() {
                let error = io::Error::last_os_error();
                break if error.raw_os_error() == Some(0) { Ok(()) } else { Err(error) };
            }
            // SAFETY: `d_name` of an entry readdir returned is NUL-terminated.
            let name = unsafe { CStr::from_ptr((*entry).d_name.as_ptr()) }.to_bytes();
            if name == b"." || name == b".." {
                continue;
            }
            if names.len() == cap {
                more = true;
                break Ok(());
            }
            names.push(OsStr::from_bytes(name).to_owned());
        };
        // SAFETY: a valid stream, closed once (it closes `copy`).
        unsafe { libc::closedir(stream) };
        result.map(|()| (names, more))
    }

    /// Removes the entry `name` of this directory if it is a regular file (a link, or anything
    /// else, is left where it is).
    pub fn remove_file(&self, name: &OsStr) -> Result<(), Refusal> {
        let c_name = entry_name(name)?;
        match self.kind_of(&c_name) {
            Some(libc::S_IFREG) => {}
            Some(libc::S_IFLNK) => return Err(Refusal::Symlink),
            Some(mode) => {
                return Err(Refusal::WrongType { found: type_name(mode), wanted: "a regular file" });
            }
            None => return Err(Refusal::Io(io::Error::last_os_error())),
        }
        // SAFETY: a valid directory descriptor and a NUL-terminated name.
        if unsafe { libc::unlinkat(self.fd.as_raw_fd(), c_name.as_ptr(), 0) } != 0 {
            return Err(Refusal::Io(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Opens the entry `name` of this directory, which must be a regular file and not a link,
    /// for `access`, without opening anything else on the way.
    pub fn open_file(&self, name: &OsStr, access: Access) -> Result<File, Refusal> {
        let c_name = entry_name(name)?;
        open_regular(self.fd.as_raw_fd(), &c_name, false, access)
    }
}

/// Opens the file at `path`, a path the caller named (links in it are followed), only if it is a
/// regular file; nothing else is opened on the way (a FIFO does not make it wait, a device node
/// is not opened).
pub fn open_named(path: &Path, access: Access) -> Result<File, Refusal> {
    let name = c_path(path.as_os_str()).map_err(Refusal::Io)?;
    open_regular(libc::AT_FDCWD, &name, true, access)
}

/// Reads from the start of `file` until its end or `limit` bytes, whichever comes first: a file
/// that grows while it is read is read up to `limit`; one that shrinks, up to its new end.
pub fn read_at_most(file: &File, limit: usize) -> io::Result<Vec<u8>> {
    let expected = file.metadata().map(|m| m.len()).unwrap_or(0);
    let mut bytes = vec![0u8; limit.min(usize::try_from(expected).unwrap_or(limit))];
    let mut filled = 0;
    loop {
        if filled == bytes.len() {
            if bytes.len() == limit {
                break;
            }
            // It grew since the fstat: read on, in steps, up to the limit.
            bytes.resize(limit.min(bytes.len().max(4096) * 2), 0);
        }
        match file.read_at(&mut bytes[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    bytes.truncate(filled);
    Ok(bytes)
}

/// Opens `name` relative to `dir` as described in the module doc.
fn open_regular(dir: RawFd, name: &CStr, follow: bool, access: Access) -> Result<File, Refusal> {
    let nofollow = if follow { 0 } else { libc::O_NOFOLLOW };
    // O_PATH opens nothing: no FIFO, device or lease is touched; with O_NOFOLLOW a link is
    // opened as itself.
    let probe = openat(dir, name, libc::O_PATH | nofollow).map_err(Refusal::Io)?;
    let seen = fstat(probe.as_raw_fd()).map_err(Refusal::Io)?;
    match seen.st_mode & libc::S_IFMT {
        libc::S_IFREG => {}
        libc::S_IFLNK => return Err(Refusal::Symlink),
        mode => return Err(Refusal::WrongType { found: type_name(mode), wanted: "a regular file" }),
    }
    let flags = match access {
        Access::Read => libc::O_RDONLY,
        Access::ReadWrite => libc::O_RDWR,
    } | libc::O_NOCTTY;
    // Reopen exactly the inode checked; without /proc, the name again, and compare.
    let reopened =
        CString::new(format!("/proc/self/fd/{}", probe.as_raw_fd())).map_err(|_| Refusal::BadName)?;
    let fd = match openat(libc::AT_FDCWD, &reopened, flags) {
        Err(error) if error.raw_os_error() == Some(libc::ENOENT) => openat(dir, name, flags | nofollow),
        other => other,
    }
    .map_err(|error| match error.raw_os_error() {
        Some(libc::ELOOP) => Refusal::Replaced,
        _ => Refusal::Io(error),
    })?;
    let opened = fstat(fd.as_raw_fd()).map_err(Refusal::Io)?;
    if (opened.st_dev, opened.st_ino) != (seen.st_dev, seen.st_ino)
        || opened.st_mode & libc::S_IFMT != libc::S_IFREG
    {
        return Err(Refusal::Replaced);
    }
    let file = File::from(fd);
    if access == Access::ReadWrite {
        let links = file.metadata().map_err(Refusal::Io)?.nlink();
        if links != 1 {
            return Err(Refusal::HardLinked { links });
        }
    }
    Ok(file)
}

fn openat(dir: RawFd, name: &CStr, flags: libc::c_int) -> io::Result<OwnedFd> {
    let flags = flags | libc::O_CLOEXEC | libc::O_NONBLOCK;
    loop {
        // SAFETY: `dir` is a valid directory descriptor or AT_FDCWD, `name` is NUL-terminated;
        // no O_CREAT, so no mode argument is read.
        let fd = unsafe { libc::openat(dir, name.as_ptr(), flags) };
        if fd >= 0 {
            // SAFETY: a descriptor the kernel just gave us, owned by nobody else.
            return Ok(unsafe { OwnedFd::from_raw_fd(fd) });
        }
        let error = io::Error::last_os_error();
        if error.kind() != io::ErrorKind::Interrupted {
            return Err(error);
        }
    }
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    // SAFETY: `stat` is plain data, filled by the kernel.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor (O_PATH ones included) and a valid out-pointer.
    if unsafe { libc::fstat(fd, &mut stat) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat)
}

fn c_path(path: &OsStr) -> io::Result<CString> {
    CString::new(path.as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))
}

/// `name` as one directory entry: not empty, no `/`, no NUL, not `.` or `..`.
fn entry_name(name: &OsStr) -> Result<CString, Refusal> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(Refusal::BadName);
    }
    CString::new(bytes).map_err(|_| Refusal::BadName)
}

fn type_name(mode: libc::mode_t) -> &'static str {
    match mode {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFLNK => "a symbolic link",
        _ => "of an unknown type",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("vgpu-tenant-file-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn mkfifo(path: &Path) {
        let name = c_path(path.as_os_str()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o666) }, 0);
    }

    #[test]
    fn links_fifos_and_directories_are_refused_without_being_opened() {
        let dir = scratch("refuse");
        std::fs::write(dir.join("real"), b"region").unwrap();
        std::os::unix::fs::symlink(dir.join("real"), dir.join("link")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", dir.join("dangling")).unwrap();
        mkfifo(&dir.join("fifo"));
        std::fs::create_dir(dir.join("sub")).unwrap();
        std::os::unix::fs::symlink(dir.join("sub"), dir.join("sublink")).unwrap();
        let tree = Dir::open(&dir).unwrap();
        let open = |name: &str| tree.open_file(OsStr::new(name), Access::Read);

        assert_eq!(read_at_most(&open("real").unwrap(), 100).unwrap(), b"region");
        assert!(matches!(open("link"), Err(Refusal::Symlink)));
        assert!(matches!(open("dangling"), Err(Refusal::Symlink)));
        assert!(matches!(open("fifo"), Err(Refusal::WrongType { found: "a FIFO", .. })));
        assert!(matches!(open("sub"), Err(Refusal::WrongType { found: "a directory", .. })));
        assert!(matches!(open("missing"), Err(Refusal::Io(e)) if e.kind() == io::ErrorKind::NotFound));
        assert!(matches!(open("../real"), Err(Refusal::BadName)));
        assert!(matches!(open(".."), Err(Refusal::BadName)));

        assert!(tree.subdir(OsStr::new("sub")).is_ok());
        assert!(matches!(tree.subdir(OsStr::new("sublink")), Err(Refusal::Symlink)));
        assert!(matches!(tree.subdir(OsStr::new("fifo")), Err(Refusal::WrongType { found: "a FIFO", .. })));
        assert!(matches!(open_named(&dir.join("fifo"), Access::Read), Err(Refusal::WrongType { .. })));
        // A name the caller gives itself may go through a link.
        assert!(open_named(&dir.join("link"), Access::Read).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_with_two_names_is_not_opened_for_writing() {
        let dir = scratch("hardlink");
        std::fs::write(dir.join("a"), b"x").unwrap();
        std::fs::hard_link(dir.join("a"), dir.join("b")).unwrap();
        let tree = Dir::open(&dir).unwrap();
        assert!(tree.open_file(OsStr::new("a"), Access::Read).is_ok());
        let refused = tree.open_file(OsStr::new("a"), Access::ReadWrite).unwrap_err();
        assert!(matches!(refused, Refusal::HardLinked { links: 2 }), "{refused:?}");
        std::fs::remove_file(dir.join("b")).unwrap();
        assert!(tree.open_file(OsStr::new("a"), Access::ReadWrite).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn listings_and_reads_are_bounded() {
        let dir = scratch("bounds");
        for i in 0..10 {
            std::fs::write(dir.join(format!("f{i}")), b"").unwrap();
        }
        let tree = Dir::open(&dir).unwrap();
        let (names, more) = tree.names(4).unwrap();
        assert_eq!((names.len(), more), (4, true));
        let (names, more) = tree.names(100).unwrap();
        assert_eq!((names.len(), more), (10, false));
        // Listing twice from one descriptor starts over each time.
        assert_eq!(tree.names(100).unwrap().0.len(), 10);

        let big = File::create(dir.join("sparse")).unwrap();
        big.set_len(1 << 30).unwrap();
        let read = tree.open_file(OsStr::new("sparse"), Access::Read).unwrap();
        assert_eq!(read_at_most(&read, 5000).unwrap().len(), 5000);
        std::fs::write(dir.join("small"), [7u8; 10]).unwrap();
        let small = tree.open_file(OsStr::new("small"), Access::Read).unwrap();
        assert_eq!(read_at_most(&small, 5000).unwrap(), [7u8; 10]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
