//! Thin, explicit device plumbing: raw allocations that free themselves, copies, and kernel
//! launches from plain values. The backend launches by raw pointer so that a decode step can be
//! captured into a CUDA graph and replayed with no Rust-side bookkeeping per kernel.

use std::ffi::c_void;

use cudarc::driver::{result, sys, CudaFunction, CudaStream, DriverError};

use crate::error::{Error, Result};

pub fn driver_err(what: &str) -> impl Fn(DriverError) -> Error + '_ {
    move |e| Error::Internal {
        message: format!("CUDA {what} failed: {e:?}"),
    }
}

/// A device allocation, zero-filled, freed on drop.
pub struct DevBuf {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
}

impl DevBuf {
    pub fn zeroed(bytes: usize) -> Result<Self> {
        let bytes = bytes.max(4);
        // SAFETY: a plain allocation in the current context, freed exactly once in Drop.
        let ptr = unsafe { result::malloc_sync(bytes) }.map_err(driver_err("cuMemAlloc"))?;
        unsafe { result::memset_d8_sync(ptr, 0, bytes) }.map_err(driver_err("cuMemset"))?;
        Ok(Self { ptr, bytes })
    }

    /// The address of element `index` of a buffer of `elem`-byte elements.
    pub fn at(&self, index: usize, elem: usize) -> sys::CUdeviceptr {
        debug_assert!(index * elem <= self.bytes);
        self.ptr + (index * elem) as u64
    }

    /// Copies host bytes to `offset`, complete on the device when it returns, so a kernel
    /// launched after it on any stream reads them.
    pub fn write_bytes(&self, offset: usize, src: &[u8]) -> Result<()> {
        if offset + src.len() > self.bytes {
            return Err(Error::Internal {
                message: format!(
                    "device write of {} bytes at {offset} overruns a {}-byte buffer",
                    src.len(),
                    self.bytes
                ),
            });
        }
        // SAFETY: bounds checked above; src is a live host slice.
        unsafe { result::memcpy_htod_sync(self.ptr + offset as u64, src) }
            .map_err(driver_err("cuMemcpyHtoD"))?;
        // From pageable memory cuMemcpyHtoD returns once the bytes are staged, before their DMA
        // on the legacy stream lands, and the engine's streams do not wait on that stream: a
        // kernel launched at once read 4 MiB of SSM state half old (session 27, H100). Waiting
        // on the legacy stream ends the DMA.
        // SAFETY: the null stream is the context's legacy default stream.
        unsafe { result::stream::synchronize(std::ptr::null_mut()) }
            .map_err(driver_err("cuStreamSynchronize"))
    }

    pub fn write<T: Copy>(&self, offset_elems: usize, src: &[T]) -> Result<()> {
        let elem = std::mem::size_of::<T>();
        // SAFETY: T is Copy plain data; viewing it as bytes reads initialised memory.
        let bytes = unsafe {
            std::slice::from_raw_parts(src.as_ptr() as *const u8, std::mem::size_of_val(src))
        };
        self.write_bytes(offset_elems * elem, bytes)
    }

    /// Copies the first `dst.len()` elements to the host on `stream`, then waits for it.
    pub fn read<T: Copy>(&self, dst: &mut [T], stream: &CudaStream) -> Result<()> {
        self.read_at(0, dst, stream)
    }

    /// Copies `dst.len()` elements from element `offset_elems` on, as [`Self::read`].
    pub fn read_at<T: Copy>(
        &self,
        offset_elems: usize,
        dst: &mut [T],
        stream: &CudaStream,
    ) -> Result<()> {
        let offset = offset_elems * std::mem::size_of::<T>();
        if offset + std::mem::size_of_val(dst) > self.bytes {
            return Err(Error::Internal {
                message: "device read overruns its buffer".into(),
            });
        }
        // SAFETY: bounds checked; the copy completes before the slice is used (synchronize).
        unsafe {
            result::memcpy_dtoh_async(dst, self.ptr + offset as u64, stream.cu_stream())
                .map_err(driver_err("cuMemcpyDtoH"))?;
        }
        stream
            .synchronize()
            .map_err(driver_err("stream synchronize"))
    }
}

pub fn ptr_or_null(b: &Option<DevBuf>) -> sys::CUdeviceptr {
    b.as_ref().map_or(0, |b| b.ptr)
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by malloc_sync and freed only here.
        let _ = unsafe { result::free_sync(self.ptr) };
    }
}

/// A kernel argument as the 8 bytes cuLaunchKernel reads from: the driver reads as many bytes
/// as the kernel's parameter has, from the start, so little-endian scalars need no other care.
pub trait Arg {
    fn bits(self) -> u64;
}

impl Arg for u64 {
    fn bits(self) -> u64 {
        self
    }
}

impl Arg for i32 {
    fn bits(self) -> u64 {
        self as u32 as u64
    }
}

impl Arg for f32 {
    fn bits(self) -> u64 {
        self.to_bits() as u64
    }
}

/// Launches `f` on `stream`; `args` in the kernel's parameter order. With `pdl` (Hopper and
/// later), the launch allows programmatic dependent launch: the kernel may start while the one
/// before it finishes, runs what does not depend on it (loading weights), and waits for it in
/// `pdl_wait()` (common.cuh), which every kernel calls before touching its inputs.
pub fn launch(
    f: &CudaFunction,
    stream: &CudaStream,
    pdl: bool,
    grid: (u32, u32, u32),
    block: u32,
    shared: u32,
    args: &mut [u64],
) -> Result<()> {
    const MAX_ARGS: usize = 32;
    assert!(
        args.len() <= MAX_ARGS,
        "a kernel takes at most {MAX_ARGS} arguments here"
    );
    let mut params = [std::ptr::null_mut::<c_void>(); MAX_ARGS];
    for (p, a) in params.iter_mut().zip(args.iter_mut()) {
        *p = a as *mut u64 as *mut c_void;
    }
    let params = &mut params[..args.len()];
    if !pdl {
        // SAFETY: every parameter points at a live 8-byte value for the duration of the call,
        // which copies them; pointers among them are device addresses of live buffers.
        return unsafe {
            result::launch_kernel(
                f.cu_function(),
                grid,
                (block, 1, 1),
                shared,
                stream.cu_stream(),
                params,
            )
        }
        .map_err(driver_err("kernel launch"));
    }
    // SAFETY: a zeroed attribute is a valid plain-data value; only the fields set below are read.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: grid.0,
        gridDimY: grid.1,
        gridDimZ: grid.2,
        blockDimX: block,
        blockDimY: 1,
        blockDimZ: 1,
        sharedMemBytes: shared,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: 1,
    };
    // SAFETY: as above; `config` and `attr` outlive the call, which copies them.
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            f.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    }
    .result()
    .map_err(driver_err("kernel launch (programmatic dependent)"))
}

/// `launch!(f, stream, pdl, grid, block, shared; a, b, c)`: each argument converted by [`Arg`].
#[macro_export]
macro_rules! launch {
    ($f:expr, $stream:expr, $pdl:expr, $grid:expr, $block:expr, $shared:expr; $($arg:expr),* $(,)?) => {{
        use $crate::cuda::device::Arg as _;
        let mut args = [$( ($arg).bits() ),*];
        $crate::cuda::device::launch($f, $stream, $pdl, $grid, $block, $shared, &mut args)
    }};
}
