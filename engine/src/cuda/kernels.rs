//! The CUDA kernels (`engine/kernels/*.cu`), compiled by NVRTC for the device's own
//! architecture at start and cached on disk, keyed by the source's hash, the architecture and
//! the driver version, so only the first start on a machine pays for the compile. They compile
//! as several units at once, one thread each ([`UNITS`]): a cold start waits for the slowest
//! unit rather than for them all in turn.

use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction, CudaModule};
use cudarc::nvrtc::{self, Ptx};
use sha2::{Digest, Sha256};

use super::plan;
use crate::error::{Error, Result};
use crate::fault::{Fault, Faults};

/// Included first in every unit.
const COMMON: &str = include_str!("../../kernels/common.cuh");

/// Every kernel file.
const SOURCES: &[(&str, &str)] = &[
    ("embed.cu", include_str!("../../kernels/embed.cu")),
    ("rmsnorm.cu", include_str!("../../kernels/rmsnorm.cu")),
    ("gemv.cu", include_str!("../../kernels/gemv.cu")),
    ("rope_kv.cu", include_str!("../../kernels/rope_kv.cu")),
    ("attention.cu", include_str!("../../kernels/attention.cu")),
    (
        "attention_prefill.cu",
        include_str!("../../kernels/attention_prefill.cu"),
    ),
    (
        "attention_batch.cu",
        include_str!("../../kernels/attention_batch.cu"),
    ),
    ("swiglu.cu", include_str!("../../kernels/swiglu.cu")),
    ("argmax.cu", include_str!("../../kernels/argmax.cu")),
    ("score.cu", include_str!("../../kernels/score.cu")),
    ("mamba.cu", include_str!("../../kernels/mamba.cu")),
    ("mamba_ssd.cu", include_str!("../../kernels/mamba_ssd.cu")),
];

/// One NVRTC program: `common.cuh`, then `files` in order (a file may use what an earlier one
/// of its unit defines), with `defines` added to the options. gemv.cu is about two thirds of
/// the whole compile (16 of 24 s on one core), so its batch sizes are units of their own.
pub struct Unit {
    pub files: &'static [&'static str],
    pub defines: &'static [&'static str],
}

pub const UNITS: &[Unit] = &[
    Unit {
        files: &[
            "embed.cu",
            "rmsnorm.cu",
            "swiglu.cu",
            "argmax.cu",
            "score.cu",
        ],
        defines: &[],
    },
    Unit {
        files: &[
            "rope_kv.cu",
            "attention.cu",
            "attention_prefill.cu",
            "attention_batch.cu",
        ],
        defines: &[],
    },
    Unit {
        files: &["mamba.cu", "mamba_ssd.cu"],
        defines: &[],
    },
    gemv_unit(&["GEMV_B_FIRST=1", "GEMV_B_LAST=1"]),
    gemv_unit(&["GEMV_B_FIRST=2", "GEMV_B_LAST=2"]),
    gemv_unit(&["GEMV_B_FIRST=3", "GEMV_B_LAST=3"]),
    gemv_unit(&["GEMV_B_FIRST=4", "GEMV_B_LAST=4"]),
    gemv_unit(&["GEMV_B_FIRST=5", "GEMV_B_LAST=5"]),
    gemv_unit(&["GEMV_B_FIRST=6", "GEMV_B_LAST=6"]),
    gemv_unit(&["GEMV_B_FIRST=7", "GEMV_B_LAST=7"]),
    gemv_unit(&["GEMV_B_FIRST=8", "GEMV_B_LAST=8"]),
];

const fn gemv_unit(defines: &'static [&'static str]) -> Unit {
    Unit {
        files: &["gemv.cu"],
        defines,
    }
}

impl Unit {
    /// The program's source, with `#line` markers so compile errors name the real file.
    pub fn source(&self) -> String {
        let mut s = format!("#line 1 \"common.cuh\"\n{COMMON}\n");
        for name in self.files {
            let (_, text) = SOURCES
                .iter()
                .find(|(n, _)| n == name)
                .expect("a unit names kernel files of SOURCES");
            s.push_str(&format!("#line 1 \"{name}\"\n{text}\n"));
        }
        s
    }

    fn options(&self, arch: &str, faults: &[&str]) -> Vec<String> {
        let mut opts = options(arch, faults);
        opts.extend(self.defines.iter().map(|d| format!("-D{d}")));
        opts
    }

    /// What the unit's cubin depends on, for its cache file's name.
    fn key(&self, arch: &str, driver: i32, faults: &[&str]) -> String {
        let mut h = Sha256::new();
        h.update(self.source().as_bytes());
        h.update(self.options(arch, faults).join(" ").as_bytes());
        hex_key(h, arch, driver)
    }
}

fn hex_key(h: Sha256, arch: &str, driver: i32) -> String {
    let digest = h.finalize();
    let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
    format!("{hex}-{}", device_key(arch, driver))
}

/// The kernel files' names, reported in `ready.features.kernels`.
pub fn names() -> Vec<&'static str> {
    SOURCES.iter().map(|(n, _)| *n).collect()
}

/// The `-D` names of the faults planted in the kernels (fault.rs; attention.cu); the other faults
/// are planted by the host.
pub fn fault_defines(faults: &Faults) -> Vec<&'static str> {
    faults
        .iter()
        .filter_map(|f| match f {
            Fault::RopeShift => Some("FAULT_ROPE_SHIFT"),
            Fault::KvGroup => Some("FAULT_KV_GROUP"),
            Fault::NanPast512 => Some("FAULT_NAN_PAST_512"),
            _ => None,
        })
        .collect()
}

/// NVRTC's options: the architecture, exact arithmetic, the constants the kernels share with
/// plan.rs as `-D` defines, and the planted faults' defines (`faults`, from [`fault_defines`]).
fn options(arch: &str, faults: &[&str]) -> Vec<String> {
    let mut opts = vec![
        format!("--gpu-architecture={arch}"),
        "--std=c++17".into(),
        // Exact division and square root: the CPU reference is compared token for token.
        "--prec-div=true".into(),
        "--prec-sqrt=true".into(),
        "--fmad=true".into(),
    ];
    opts.extend(
        plan::KERNEL_DEFINES
            .iter()
            .map(|(name, value)| format!("-D{name}={value}")),
    );
    opts.extend(faults.iter().map(|name| format!("-D{name}")));
    opts
}

/// Compiles one unit to a cubin for `arch` (e.g. "sm_90"), with the fault defines `faults`.
pub fn compile(unit: &Unit, arch: &str, faults: &[&str]) -> Result<Vec<u8>> {
    use cudarc::nvrtc::{result, sys};
    let src = std::ffi::CString::new(unit.source()).expect("kernel sources contain no NUL");
    let name = std::ffi::CString::new("engine_kernels.cu").unwrap();
    let prog = result::create_program(&src, Some(&name)).map_err(|e| Error::Internal {
        message: format!("NVRTC could not create the kernel program: {e:?}"),
    })?;
    let opts = unit.options(arch, faults);
    // SAFETY: prog is a live program; it is destroyed below on every path.
    let compiled = unsafe { result::compile_program(prog, &opts) };
    let out = match compiled {
        Ok(()) => unsafe {
            let mut size = 0usize;
            sys::nvrtcGetCUBINSize(prog, &mut size)
                .result()
                .and_then(|_| {
                    let mut buf = vec![0u8; size];
                    sys::nvrtcGetCUBIN(prog, buf.as_mut_ptr() as *mut _)
                        .result()
                        .map(|_| buf)
                })
        }
        .map_err(|e| Error::Internal {
            message: format!("NVRTC compiled the kernels but gave no cubin: {e:?}"),
        }),
        Err(e) => {
            let log = unsafe { result::get_program_log(prog) }
                .map(|l| {
                    let bytes: Vec<u8> = l.iter().map(|&c| c as u8).collect();
                    String::from_utf8_lossy(&bytes)
                        .trim_end_matches('\0')
                        .to_string()
                })
                .unwrap_or_default();
            Err(Error::Internal {
                message: format!(
                    "the CUDA kernels ({}) do not compile for {arch} ({e:?}):\n{log}",
                    unit.files.join(", ")
                ),
            })
        }
    };
    let _ = unsafe { result::destroy_program(prog) };
    out
}

/// Compiles `units`, each on a thread of its own (NVRTC compiles separate programs
/// concurrently), in their order.
pub fn compile_all(units: &[&Unit], arch: &str, faults: &[&str]) -> Result<Vec<Vec<u8>>> {
    std::thread::scope(|s| {
        let handles: Vec<_> = units
            .iter()
            .map(|u| s.spawn(move || compile(u, arch, faults)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("an NVRTC compile thread panicked"))
            .collect()
    })
}

/// Where compiled kernels are cached: `$LLM_BENCH_KERNEL_CACHE`, else
/// `$XDG_CACHE_HOME/llm-bench/kernels`, else `~/.cache/llm-bench/kernels`.
pub(super) fn cache_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("LLM_BENCH_KERNEL_CACHE") {
        return Some(PathBuf::from(d));
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("llm-bench").join("kernels"))
}

/// The compiled kernels' cache key: every unit's source and options, the arch and the driver
/// (the GEMV tuning and step paths are cached under it, tune.rs).
pub fn cache_key(arch: &str, driver: i32, faults: &[&str]) -> String {
    let mut h = Sha256::new();
    for unit in UNITS {
        h.update(unit.source().as_bytes());
        h.update(unit.options(arch, faults).join(" ").as_bytes());
    }
    hex_key(h, arch, driver)
}

/// The key of what depends on the GPU and driver but not on these kernels (cuBLASLt's GEMM
/// algorithms, gemm.rs): builds that differ only in their own kernels share it.
pub fn device_key(arch: &str, driver: i32) -> String {
    format!("{arch}-driver{driver}")
}

/// How the module was obtained, for the `ready` event.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Provenance {
    pub arch: String,
    pub cache_key: String,
    /// [`device_key`].
    pub device_key: String,
    /// Every unit's cubin came from the cache.
    pub from_cache: bool,
    /// How many units this load compiled (the others came from the cache).
    pub units_compiled: usize,
    /// Seconds the units took to read from the cache or compile, on their own threads.
    pub compile_s: f64,
    /// Seconds of that the load waited for, having done all it could without the kernels: the
    /// compile's share of the load's wall.
    pub wait_s: f64,
}

/// The kernels' modules, one a unit; a kernel is looked up by name in whichever has it.
pub struct Kernels {
    modules: Vec<Arc<CudaModule>>,
}

/// The kernels being read from the cache or compiled on threads of their own, while the load
/// goes on with what needs none of them (the weights' upload, cuBLASLt's GEMM tuning).
pub struct Compiling {
    arch: String,
    /// [`cache_key`] and [`device_key`] of this arch, driver and faults, for the provenance.
    cache_key: String,
    device_key: String,
    paths: Vec<Option<PathBuf>>,
    cubins: std::thread::JoinHandle<Result<Cubins>>,
}

/// What the compile thread hands back.
struct Cubins {
    /// One a unit, in [`UNITS`]' order.
    cubins: Vec<Vec<u8>>,
    /// How many of them it compiled (the others came from the cache).
    compiled: usize,
    /// Its wall, reading the cache included.
    seconds: f64,
}

/// Starts reading or compiling every unit's cubin for `arch` and the driver; [`Compiling::finish`]
/// loads them. NVRTC needs no GPU, so nothing here touches the context.
pub fn start(arch: &str, driver: i32, faults: &[&'static str]) -> Compiling {
    start_in(cache_dir(), arch, driver, faults)
}

/// [`start`] with the cache in `dir` (none: compile everything, cache nothing).
fn start_in(dir: Option<PathBuf>, arch: &str, driver: i32, faults: &[&'static str]) -> Compiling {
    let paths: Vec<Option<PathBuf>> = UNITS
        .iter()
        .map(|u| {
            dir.as_ref()
                .map(|d| d.join(format!("{}.cubin", u.key(arch, driver, faults))))
        })
        .collect();
    let (thread_arch, thread_faults, thread_paths) =
        (arch.to_string(), faults.to_vec(), paths.clone());
    let cubins = std::thread::spawn(move || {
        let started = std::time::Instant::now();
        let mut cubins: Vec<Option<Vec<u8>>> = thread_paths
            .iter()
            .map(|p| p.as_ref().and_then(|p| std::fs::read(p).ok()))
            .collect();
        let missing: Vec<usize> = (0..UNITS.len()).filter(|&i| cubins[i].is_none()).collect();
        let units: Vec<&Unit> = missing.iter().map(|&i| &UNITS[i]).collect();
        for (i, c) in missing
            .iter()
            .zip(compile_all(&units, &thread_arch, &thread_faults)?)
        {
            if let Some(p) = &thread_paths[*i] {
                // A failed cache write only costs the next start a compile.
                if let Some(dir) = p.parent() {
                    let _ = std::fs::create_dir_all(dir);
                }
                let tmp = p.with_extension(format!("tmp{}", std::process::id()));
                if std::fs::write(&tmp, &c).is_ok() {
                    let _ = std::fs::rename(&tmp, p);
                }
            }
            cubins[*i] = Some(c);
        }
        Ok(Cubins {
            cubins: cubins
                .into_iter()
                .map(|c| c.expect("every unit was read or compiled"))
                .collect(),
            compiled: missing.len(),
            seconds: started.elapsed().as_secs_f64(),
        })
    });
    Compiling {
        arch: arch.to_string(),
        cache_key: cache_key(arch, driver, faults),
        device_key: device_key(arch, driver),
        paths,
        cubins,
    }
}

/// The compile thread's cubins, once it is done.
fn join(cubins: std::thread::JoinHandle<Result<Cubins>>) -> Result<Cubins> {
    cubins.join().expect("the NVRTC compile thread panicked")
}

impl Compiling {
    #[cfg(test)]
    fn wait(self) -> Result<Cubins> {
        join(self.cubins)
    }

    /// Waits for the cubins and loads them into `ctx`, one module a unit.
    pub fn finish(self, ctx: &Arc<CudaContext>) -> Result<(Kernels, Provenance)> {
        let waited = std::time::Instant::now();
        let done = join(self.cubins)?;
        let wait_s = waited.elapsed().as_secs_f64();
        let modules = done
            .cubins
            .into_iter()
            .zip(&self.paths)
            .map(|(cubin, p)| {
                ctx.load_module(Ptx::from_binary(cubin))
                    .map_err(|e| Error::Internal {
                        message: format!(
                            "the driver refused the compiled kernels ({e:?}); delete {} and retry",
                            p.as_ref()
                                .map(|p| p.display().to_string())
                                .unwrap_or_default()
                        ),
                    })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok((
            Kernels { modules },
            Provenance {
                arch: self.arch,
                cache_key: self.cache_key,
                device_key: self.device_key,
                from_cache: done.compiled == 0,
                units_compiled: done.compiled,
                compile_s: done.seconds,
                wait_s,
            },
        ))
    }
}

/// Reads or compiles the kernels and loads them, with nothing beside (the GPU tests).
pub fn load(
    ctx: &Arc<CudaContext>,
    arch: &str,
    driver: i32,
    faults: &[&'static str],
) -> Result<(Kernels, Provenance)> {
    start(arch, driver, faults).finish(ctx)
}

pub fn function(kernels: &Kernels, name: &str) -> Result<CudaFunction> {
    kernels
        .modules
        .iter()
        .find_map(|m| m.load_function(name).ok())
        .ok_or_else(|| Error::Internal {
            message: format!("kernel {name} is in none of the compiled modules"),
        })
}

/// Whether NVRTC can be loaded here (it needs no GPU).
pub fn nvrtc_present() -> bool {
    // SAFETY: only tries to dlopen the library.
    unsafe { nvrtc::sys::is_culib_present() }
}

#[cfg(test)]
mod tests {
    use super::plan::GemvMode;
    use super::*;

    /// Compiles every kernel for Hopper wherever NVRTC can be loaded (no GPU needed);
    /// `scripts/test` points the loader at the NVRTC that the Python environment's torch
    /// brings, so CI catches a kernel that does not compile.
    #[test]
    fn kernels_compile_for_sm90() {
        if !nvrtc_present() {
            eprintln!("skipped: NVRTC is not loadable here (set LD_LIBRARY_PATH to its lib dir)");
            assert!(
                std::env::var_os("LLM_BENCH_REQUIRE_NVRTC").is_none(),
                "LLM_BENCH_REQUIRE_NVRTC is set but NVRTC cannot be loaded"
            );
            return;
        }
        // Through the load's own path: compiled on its thread into an empty cache, then every
        // unit read back from it by the next start, byte for byte.
        let dir = std::env::temp_dir().join(format!("engine-kernels-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let first = start_in(Some(dir.clone()), "sm_90", 13000, &[])
            .wait()
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(first.compiled, UNITS.len());
        let cubins = first.cubins;
        assert!(
            cubins.iter().all(|c| c.starts_with(b"\x7fELF")),
            "a cubin is an ELF image"
        );
        let again = start_in(Some(dir.clone()), "sm_90", 13000, &[])
            .wait()
            .unwrap();
        assert_eq!(again.compiled, 0, "every unit was cached");
        assert!(again.cubins == cubins);
        let _ = std::fs::remove_dir_all(&dir);
        // Every kernel the backend looks up by name (load.rs Funcs::load) is in exactly one
        // unit's image: a name in two would be looked up in whichever came first.
        let has = |name: &str| {
            let units: Vec<usize> = (0..UNITS.len())
                .filter(|&u| holds_symbol(&cubins[u], name))
                .collect();
            assert!(units.len() <= 1, "{name} is in units {units:?}");
            units.len() == 1
        };
        for mode in GemvMode::ALL {
            for b in 1..=plan::MAX_GEMV_BATCH {
                assert!(has(&mode.kernel(b)), "{} missing", mode.kernel(b));
            }
        }
        for b in 1..=plan::MAX_GEMV_BATCH {
            for m in GemvMode::ALL.iter().filter(|m| m.is_lm_head()) {
                assert!(has(&m.logits_kernel(b)), "{} missing", m.logits_kernel(b));
            }
        }
        let attention = (0..=3)
            .map(|p| format!("attention_g{}", 1 << p))
            .chain(plan::ATT_PF_HEAD_DIMS.map(|d| format!("attention_prefill_d{d}")))
            .chain(plan::ATT_PF_HEAD_DIMS.map(|d| format!("attention_batch_rope_d{d}")));
        let others = [
            "embed_gather",
            "rmsnorm",
            "rope_kv",
            "swiglu",
            "argmax_final",
            "argmax_rows",
            "score_forced",
            "mamba_conv",
            "mamba_ssm",
            "mamba_ssm_step",
            "mamba_ssd",
            "mamba_gated_norm",
            "relu2",
        ];
        for name in attention.chain(others.iter().map(|s| s.to_string())) {
            assert!(has(&name), "{name} missing");
        }
    }

    /// The shared constants are defined once, in plan.rs: no kernel file defines them, and
    /// scripts/gemv-bench, which compiles the same program, passes the same `-D` options.
    #[test]
    fn shared_constants_come_from_plan_only() {
        for (file, text) in SOURCES.iter().chain([&("common.cuh", COMMON)]) {
            for (name, _) in plan::KERNEL_DEFINES {
                assert!(
                    !text.contains(&format!("#define {name}")),
                    "{file} defines {name}; it is plan.rs's, passed as -D{name}"
                );
            }
        }
        let bench = include_str!("../../../scripts/gemv-bench/compile.py");
        for (name, value) in plan::KERNEL_DEFINES {
            let want = format!("\"-D{name}={value}\"");
            assert!(bench.contains(&want), "compile.py lacks {want}");
        }
        let opts = options("sm_90", &[]);
        assert!(opts.contains(&format!("-DATT_MAX_SPLITS={}", plan::MAX_SPLITS)));
    }

    #[test]
    fn cache_key_depends_on_arch_driver_and_faults() {
        assert_ne!(
            cache_key("sm_90", 13000, &[]),
            cache_key("sm_80", 13000, &[])
        );
        assert_ne!(
            cache_key("sm_90", 13000, &[]),
            cache_key("sm_90", 13010, &[])
        );
        let kv = fault_defines(&Faults::parse("kv_group").unwrap());
        assert_eq!(kv, ["FAULT_KV_GROUP"]);
        assert_ne!(
            cache_key("sm_90", 13000, &[]),
            cache_key("sm_90", 13000, &kv)
        );
        // Host-side faults leave the kernels, and their cache entry, as they are.
        let host = Faults::parse("norm_skip,attn_scale_d,drop_bias,slow_step").unwrap();
        assert!(fault_defines(&host).is_empty());
        // The GEMMs' key names the arch and driver only: planted kernel faults (like any other
        // change to the kernels) leave it, and so the GEMM pins, as they are.
        assert_eq!(device_key("sm_90", 13000), "sm_90-driver13000");
        assert!(
            cache_key("sm_90", 13000, &kv).ends_with(&format!("-{}", device_key("sm_90", 13000)))
        );
        assert_ne!(device_key("sm_90", 13000), device_key("sm_90", 13010));
    }

    /// The kernel faults compile (all at once; each is an independent #ifdef).
    #[test]
    fn kernels_compile_with_the_kernel_faults() {
        if !nvrtc_present() {
            eprintln!("skipped: NVRTC is not loadable here (set LD_LIBRARY_PATH to its lib dir)");
            assert!(std::env::var_os("LLM_BENCH_REQUIRE_NVRTC").is_none());
            return;
        }
        let all = fault_defines(&Faults::parse("rope_shift,kv_group,nan_past_512").unwrap());
        assert_eq!(all.len(), 3);
        // Only the units whose files read a fault's define: the others' code is the same.
        let planted: Vec<&Unit> = UNITS
            .iter()
            .filter(|u| u.source().contains("FAULT_"))
            .collect();
        assert!(!planted.is_empty());
        let cubins = compile_all(&planted, "sm_90", &all).unwrap_or_else(|e| panic!("{e}"));
        assert!(cubins.iter().all(|c| c.starts_with(b"\x7fELF")));
    }

    /// A symbol `name` in an ELF image: the name whole in its string table (NUL after it, and
    /// NUL or a section prefix's dot before it), not a prefix of a longer name.
    fn holds_symbol(image: &[u8], name: &str) -> bool {
        let n = name.as_bytes();
        image
            .windows(n.len() + 2)
            .any(|w| (w[0] == 0 || w[0] == b'.') && &w[1..=n.len()] == n && w[n.len() + 1] == 0)
    }

    /// Every kernel file is in one unit, but gemv.cu, which is in one unit a batch size, each
    /// emitting one of 1 to MAX_GEMV_BATCH: together they compile what one program would.
    #[test]
    fn the_units_compile_every_file_once_and_gemv_once_a_batch_size() {
        for (file, _) in SOURCES {
            let holding: Vec<&Unit> = UNITS.iter().filter(|u| u.files.contains(file)).collect();
            if *file != "gemv.cu" {
                assert_eq!(holding.len(), 1, "{file}");
                assert!(holding[0].defines.is_empty(), "{file}");
                continue;
            }
            let mut batches: Vec<usize> = holding
                .iter()
                .map(|u| {
                    assert_eq!(u.files, ["gemv.cu"]);
                    let b = |key: &str| -> usize {
                        let d = u.defines.iter().find_map(|d| d.strip_prefix(key)).unwrap();
                        d.parse().unwrap()
                    };
                    assert_eq!(b("GEMV_B_FIRST="), b("GEMV_B_LAST="), "{:?}", u.defines);
                    b("GEMV_B_FIRST=")
                })
                .collect();
            batches.sort();
            assert_eq!(batches, (1..=plan::MAX_GEMV_BATCH).collect::<Vec<_>>());
        }
        // gemv.cu by itself emits every batch size (scripts/gemv-bench compiles it so).
        let gemv = SOURCES.iter().find(|(n, _)| *n == "gemv.cu").unwrap().1;
        assert!(
            gemv.contains("#ifndef GEMV_B_FIRST\n#define GEMV_B_FIRST 1\n#define GEMV_B_LAST 8\n")
        );
        assert_eq!(plan::MAX_GEMV_BATCH, 8);
    }
}
