//! What ships: `ci/release` writes libvgpu.so, libvgpu_vk.so and libvgpu_hip.so stripped of their debug information,
//! each under 1.5 MB, with that information beside them, and the libraries still export, unwind
//! and name their functions as the unstripped build does; `ci/package` puts them in a versioned
//! archive.

mod common;

use std::path::Path;
use std::process::Command;

/// The largest a shipped library may be, in bytes: a device plugin mounts it into every container.
const MAX_SHIPPED: u64 = 1_500_000;

/// What `readelf WHAT` prints for an ELF file.
fn readelf(what: &str, file: &Path) -> String {
    let out = Command::new("readelf").arg(what).arg(file).output().expect("run readelf");
    assert!(out.status.success(), "readelf {what} {}", file.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Section names of an ELF file, from `readelf -S`.
fn sections(file: &Path) -> Vec<String> {
    readelf("-SW", file)
        .lines()
        .filter_map(|line| Some(line.split_once(']')?.1.split_whitespace().next()?.to_owned()))
        .collect()
}

/// The libraries an ELF file asks the dynamic linker for (`NEEDED`), from `readelf -d`.
fn needed(file: &Path) -> Vec<String> {
    readelf("-dW", file)
        .lines()
        .filter(|line| line.contains("(NEEDED)"))
        .filter_map(|line| Some(line.split_once('[')?.1.trim_end_matches(']').to_owned()))
        .collect()
}

/// `nm -D --defined-only`: what the dynamic linker sees.
fn dynamic_symbols(file: &Path) -> String {
    let out = Command::new("nm").args(["-D", "--defined-only"]).arg(file).output().expect("run nm");
    assert!(out.status.success(), "nm -D {}", file.display());
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn shipped_libraries_are_small_and_keep_their_debug_information_apart() {
    let target = common::target_dir();
    let out = common::scratch_root().join(format!("release-{}", std::process::id()));
    let status = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/release"))
        .arg(&out)
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("run ci/release");
    assert!(status.success(), "ci/release failed: {status}");
    for lib in ["libvgpu.so", "libvgpu_vk.so", "libvgpu_hip.so"] {
        let shipped = out.join(lib);
        let debug = out.join(format!("{lib}.debug"));
        let size = std::fs::metadata(&shipped).expect("shipped library").len();
        assert!(size < MAX_SHIPPED, "{lib} is {size} bytes, over {MAX_SHIPPED}");
        let shipped_sections = sections(&shipped);
        assert!(!shipped_sections.iter().any(|s| s.starts_with(".debug_")), "{lib}: {shipped_sections:?}");
        for kept in [".gnu_debuglink", ".eh_frame", ".eh_frame_hdr", ".symtab"] {
            assert!(shipped_sections.iter().any(|s| s == kept), "{lib} lost {kept}: {shipped_sections:?}");
        }
        assert!(sections(&debug).iter().any(|s| s == ".debug_info"), "{lib}.debug has no .debug_info");
        assert_eq!(dynamic_symbols(&shipped), dynamic_symbols(&target.join("release").join(lib)), "{lib}");
        // Loaded into processes that never use a GPU: nothing beyond the C library, whose
        // unwinder comes linked in (link/static_unwinder.rs).
        let libraries = needed(&shipped);
        assert!(
            libraries.iter().all(|name| name.starts_with("libc.so") || name.starts_with("ld-linux")),
            "{lib} needs {libraries:?}"
        );
    }
    assert!(out.join("VK_LAYER_LIBVGPU_budget.json").is_file());
    std::fs::remove_dir_all(&out).expect("remove the release folder");
}

/// `tar -tzf`: the archive's entries.
fn archive_entries(archive: &Path) -> Vec<String> {
    let out = Command::new("tar").arg("-tzf").arg(archive).output().expect("run tar");
    assert!(out.status.success(), "tar -tzf {}", archive.display());
    let mut entries: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect();
    entries.sort();
    entries
}

#[test]
fn the_release_archive_is_named_by_version_and_architecture_and_keeps_debug_information_apart() {
    let out = common::scratch_root().join(format!("package-{}", std::process::id()));
    let arch = std::env::consts::ARCH;
    let status = Command::new(Path::new(env!("CARGO_MANIFEST_DIR")).join("ci/package"))
        .arg(&out)
        .env("ARCHES", arch)
        .env("CARGO_TARGET_DIR", common::target_dir())
        .status()
        .expect("run ci/package");
    assert!(status.success(), "ci/package failed: {status}");
    let name = format!("libvgpu-{}-{arch}", env!("CARGO_PKG_VERSION"));
    let mut shipped = vec![
        "CHANGELOG.md",
        "LICENSE",
        "README",
        "VK_LAYER_LIBVGPU_budget.json",
        "install-manifest",
        "libvgpu.so",
        "libvgpu_hip.so",
        "libvgpu_vk.so",
    ];
    let mut debug = vec!["libvgpu.so.debug", "libvgpu_hip.so.debug", "libvgpu_vk.so.debug"];
    // vgpu-smi ships when the workspace builds it, as ci/release decides.
    if common::target_dir().join("release/vgpu-smi").is_file() {
        shipped.push("vgpu-smi");
        debug.push("vgpu-smi.debug");
    }
    let listing = |dir: &str, files: &[&str]| {
        let mut entries: Vec<String> = files.iter().map(|file| format!("{dir}/{file}")).collect();
        entries.push(format!("{dir}/"));
        entries.sort();
        entries
    };
    assert_eq!(archive_entries(&out.join(format!("{name}.tar.gz"))), listing(&name, &shipped));
    assert_eq!(
        archive_entries(&out.join(format!("{name}-debug.tar.gz"))),
        listing(&format!("{name}-debug"), &debug)
    );
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).expect("SHA256SUMS");
    assert!(
        sums.contains(&format!("  {name}.tar.gz\n")) && sums.contains(&format!("  {name}-debug.tar.gz\n"))
    );
    std::fs::remove_dir_all(&out).expect("remove the package folder");
}
