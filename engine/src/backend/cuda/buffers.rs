//! Where the backend's buffers come from: workspace buffers (the graphs' workspace in graph
//! mode), tensors with and without bf16 shadows, and the per-step index uploads.

use cleave_kernels::ptr;

use super::pool::{class_bytes, Buf, Elem};
use super::{kerr, Bf16In, CudaBackend, CudaTensor, Precision};
use crate::error::Result;

impl CudaBackend {
    /// A workspace buffer of at least `n` elements: an idle one of its size class, else a new
    /// one (when the device is out of memory, after freeing every idle buffer).
    #[track_caller]
    pub(super) fn buf<T: Elem>(&self, n: usize) -> Result<Buf<T>> {
        let class = class_bytes(n.max(1) * std::mem::size_of::<T>());
        let ws = if self.graphs.active() { &self.graphs.ws } else { &self.ws };
        if let Some(s) = ws.take::<T>(class) {
            return Ok(Buf::pooled(s, class, ws));
        }
        let len = class / std::mem::size_of::<T>();
        let mut misses = self.misses.borrow_mut();
        if misses.len() < 32 {
            let at = std::panic::Location::caller();
            misses.push(format!("{} x{len} at {}:{}", std::any::type_name::<T>(), at.file(), at.line()));
        }
        drop(misses);
        let s = match self.gpu.alloc::<T>(len) {
            Ok(s) => s,
            Err(_) if self.ws.clear() > 0 => self.gpu.alloc::<T>(len).map_err(kerr)?,
            Err(e) => return Err(kerr(e)),
        };
        Ok(Buf::pooled(s, class, ws))
    }

    /// `buf`, filled with NaN (all ones) first when poisoning (kernels-check).
    #[track_caller]
    pub(super) fn scratch<T: Elem>(&self, n: usize) -> Result<Buf<T>> {
        let b = self.buf::<T>(n)?;
        if self.poison.get() {
            // SAFETY: the address and byte count lie within one live allocation of this GPU.
            unsafe { self.gpu.memset(ptr(&b), 0xff, n * std::mem::size_of::<T>()) }.map_err(kerr)?;
        }
        Ok(b)
    }

    #[track_caller]
    pub(super) fn alloc_f32(&self, n: usize) -> Result<Buf<f32>> {
        self.scratch::<f32>(n)
    }

    #[track_caller]
    pub(super) fn alloc_u16(&self, n: usize) -> Result<Buf<u16>> {
        self.scratch::<u16>(n)
    }

    #[track_caller]
    pub(super) fn tensor(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        Ok(CudaTensor { buf: self.alloc_f32(rows * cols)?, bf16: None, rows, cols })
    }

    /// A tensor for a kernel that also writes its bf16 shadow: with one at `Precision::Bf16`.
    #[track_caller]
    pub(super) fn tensor_shadowed(&self, rows: usize, cols: usize) -> Result<CudaTensor> {
        let mut t = self.tensor(rows, cols)?;
        if self.precision == Precision::Bf16 {
            t.bf16 = Some(self.alloc_u16(rows * cols)?);
        }
        Ok(t)
    }

    /// Device copy of `data` under `key`, uploaded only when it differs from the last one, into
    /// the key's buffer while it is large enough.
    pub(super) fn upload_u32(&self, key: &'static str, data: &[u32]) -> Result<u64> {
        if self.graphs.active() {
            return self.graph_upload(key, data);
        }
        let mut up = self.uploads.borrow_mut();
        if let Some((v, buf)) = up.get_mut(key) {
            if v.as_slice() == data {
                return Ok(ptr(buf));
            }
            if data.len() <= buf.len() {
                // SAFETY: the destination is a live allocation of this GPU holding as many values as the
                // source.
                unsafe { self.gpu.htod(data, ptr(buf)) }.map_err(kerr)?;
                v.clear();
                v.extend_from_slice(data);
                return Ok(ptr(buf));
            }
        }
        // Outside the workspace: a key keeps its buffer across steps, and one taken from the pool
        // would make the next step's transient buffers of that class allocate again.
        let len = class_bytes(data.len().max(1) * 4) / 4;
        let buf = Buf::unpooled(self.gpu.alloc::<u32>(len).map_err(kerr)?);
        // SAFETY: the destination is a live allocation of this GPU holding as many values as the
        // source.
        unsafe { self.gpu.htod(data, ptr(&buf)) }.map_err(kerr)?;
        let p = ptr(&buf);
        up.insert(key, (data.to_vec(), buf));
        Ok(p)
    }

    /// `x` as bf16 (for GEMM operands), always a fresh cast.
    pub(super) fn to_bf16(&self, x: &CudaTensor) -> Result<Buf<u16>> {
        let b = self.buf::<u16>(x.len())?;
        // SAFETY: source and destination are live buffers of this GPU of n values.
        unsafe { self.gpu.cast_f32_bf16(x.ptr(), ptr(&b), x.len()) }.map_err(kerr)?;
        Ok(b)
    }

    /// `x` as a bf16 GEMM operand: its shadow when it has one, else a cast.
    pub(super) fn bf16_in<'a>(&self, x: &'a CudaTensor) -> Result<Bf16In<'a>> {
        match &x.bf16 {
            Some(b) => Ok(Bf16In::Shadow(b)),
            None => Ok(Bf16In::Cast(self.to_bf16(x)?)),
        }
    }
}
