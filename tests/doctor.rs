//! `vgpu-smi doctor` against the fake driver: every hooked entry point resolves to a hooked
//! variant and every watched export is classified (exit 0); a driver that exports an allocation
//! entry point libvgpu does not know (`cuMemAlloc_v9`) is flagged (exit 1).

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Scratch, artifacts};

fn doctor(driver_dir: &Path, region: &Path) -> Output {
    doctor_with(driver_dir, region, &[])
}

fn doctor_with(driver_dir: &Path, region: &Path, env: &[(&str, &str)]) -> Output {
    let smi = common::smi_binary().to_path_buf();
    let mut command = Command::new(smi);
    command
        .args(["doctor", "--library"])
        .arg(&artifacts().libvgpu)
        .arg(region)
        .env("LD_LIBRARY_PATH", driver_dir);
    for (key, _) in std::env::vars() {
        if key.starts_with("CUDA_") || key.starts_with("LIBCUDA_") || key == "LD_PRELOAD" {
            command.env_remove(key);
        }
    }
    command.envs(env.iter().copied());
    command.output().expect("run vgpu-smi doctor")
}

#[test]
fn a_known_driver_is_healthy() {
    let s = Scratch::new("doctor-healthy");
    let out = doctor(&artifacts().fake_driver_dir, &s.path("none.cache"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    // The driver hands out _v2 at 12.0 and the variant libvgpu hooks is the one it names.
    assert!(
        stdout.lines().any(|l| l.starts_with("cuMemAlloc ") && l.contains("cuMemAlloc_v2 (hooked)")),
        "{stdout}"
    );
    // Older ABIs get the driver's own function: cuCtxCreate at 11.3 is _v2, at 12.0 _v3.
    assert!(
        stdout.lines().any(|l| l.starts_with("cuCtxCreate ") && l.contains("cuCtxCreate_v3")),
        "{stdout}"
    );
    assert!(stdout.contains("every one is hooked or known to create no device memory"), "{stdout}");
}

#[test]
fn doctor_says_which_developer_tools_hold_the_budget_and_names_an_injection() {
    let s = Scratch::new("doctor-tools");
    let region = s.path("none.cache");
    let out = doctor(&artifacts().fake_driver_dir, &region);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let tools =
        stdout.lines().find(|l| l.starts_with("developer tools: ")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        tools.contains("Nsight Compute")
            && tools.contains("Nsight Systems (nsys)")
            && tools.contains("held")
            && tools.contains("kernel replay"),
        "{tools}"
    );
    assert!(!stdout.contains("CUDA_INJECTION64_PATH"), "{stdout}");
    let with = doctor_with(
        &artifacts().fake_driver_dir,
        &region,
        &[("CUDA_INJECTION64_PATH", "/opt/tool/libinject.so")],
    );
    let stdout = String::from_utf8_lossy(&with.stdout);
    assert!(stdout.contains("CUDA_INJECTION64_PATH=/opt/tool/libinject.so is set here"), "{stdout}");
}

#[test]
fn an_unknown_allocation_entry_point_is_flagged() {
    let s = Scratch::new("doctor-v9");
    // A "driver" that is the fake plus one export libvgpu has never heard of.
    let dir = s.path("driver");
    std::fs::create_dir_all(&dir).expect("driver dir");
    let source = s.path("shim.c");
    std::fs::write(
        &source,
        "int cuMemAlloc_v9(unsigned long long *p, unsigned long size) { (void)p; (void)size; return 999; }\n",
    )
    .expect("write shim");
    let fake = std::fs::canonicalize(artifacts().fake_driver_dir.join("libcuda.so.1")).expect("fake driver");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-o"])
        .arg(dir.join("libcuda.so.1"))
        .arg(&source)
        .arg("-Wl,--no-as-needed")
        .arg(&fake)
        .arg(format!("-Wl,-rpath,{}", fake.parent().expect("dir").display()))
        .status()
        .expect("cc");
    assert!(status.success());
    let out = doctor(&dir, &s.path("none.cache"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let flagged =
        stdout.lines().find(|l| l.starts_with("NOT CLASSIFIED")).unwrap_or_else(|| panic!("{stdout}"));
    assert!(flagged.contains("cuMemAlloc_v9"), "{flagged}");
    assert!(stdout.contains("NOT healthy"), "{stdout}");
}

#[test]
fn a_corrupt_region_or_a_misread_variable_is_unhealthy() {
    let s = Scratch::new("doctor-region");
    let region = s.path("bad.cache");
    std::fs::write(&region, vec![7u8; 4096]).expect("write");
    let out = doctor(&artifacts().fake_driver_dir, &region);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.lines().any(|l| l.starts_with("region: ") && l.contains("bad.cache")), "{stdout}");

    let out = doctor_with(
        &artifacts().fake_driver_dir,
        &s.path("none.cache"),
        &[("CUDA_DEVICE_MEMORY_LIMIT_abc", "1g")],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.lines().any(|l| l.starts_with("environment: ") && l.contains("CUDA_DEVICE_MEMORY_LIMIT_abc")),
        "{stdout}"
    );
}
