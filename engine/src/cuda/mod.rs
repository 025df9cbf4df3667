//! The CUDA backend (cudarc, loaded at run time, so the crate builds where there is no CUDA).

pub mod backend;
pub mod bench;
pub mod device;
mod gemm;
pub mod kernels;
mod load;
mod ops;
mod paths;
pub mod plan;
mod profiler;
mod step;
mod tune;

#[cfg(test)]
mod attention_gpu_tests;
#[cfg(test)]
mod gemv_gpu_tests;
#[cfg(test)]
mod mamba_gpu_tests;
#[cfg(test)]
mod rmsnorm_gpu_tests;

pub use backend::CudaBackend;

/// How many CUDA devices this machine has; 0 where there is no driver.
pub fn device_count() -> usize {
    // SAFETY: only tries to dlopen the driver library.
    if !unsafe { cudarc::driver::sys::is_culib_present() } {
        return 0;
    }
    cudarc::driver::CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}
