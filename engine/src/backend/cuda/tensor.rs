//! The CUDA backend's device values: activations ([`CudaTensor`], f32 with an optional bf16
//! shadow), routing results, and the bf16 operand a GEMM reads.

use cleave_kernels::ptr;

use super::pool::Buf;

/// An f32 matrix on the device, optionally with a bf16 copy of its values (its "shadow").
pub struct CudaTensor {
    pub(super) buf: Buf<f32>,
    /// The values as bf16, written by the kernel that produced them (see the module docs). Only
    /// that kernel sets it; [`CudaTensor::ptr_mut`] clears it.
    pub(super) bf16: Option<Buf<u16>>,
    pub(super) rows: usize,
    pub(super) cols: usize,
}

impl CudaTensor {
    /// Device address of the f32 values, to read them (or to write a tensor just created). Any
    /// in-place change of an existing tensor must use [`CudaTensor::ptr_mut`].
    pub fn ptr(&self) -> u64 {
        ptr(&self.buf)
    }
    /// Device address of the f32 values for an in-place change: drops the bf16 shadow, which
    /// would no longer match.
    pub fn ptr_mut(&mut self) -> u64 {
        self.bf16 = None;
        ptr(&self.buf)
    }
    /// Device address of the bf16 shadow, when the tensor has one.
    pub fn bf16_ptr(&self) -> Option<u64> {
        self.bf16.as_ref().map(|b| ptr(b))
    }
    pub fn has_bf16(&self) -> bool {
        self.bf16.is_some()
    }
    pub fn len(&self) -> usize {
        self.rows * self.cols
    }
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Per-token expert ids and weights, on the device.
pub struct CudaRouting {
    pub(super) ids: Buf<u32>,
    pub(super) weights: Buf<f32>,
    pub rows: usize,
    pub top_k: usize,
}

/// A bf16 GEMM operand: a tensor's shadow, or a cast made for this use.
pub(crate) enum Bf16In<'a> {
    Shadow(&'a Buf<u16>),
    Cast(Buf<u16>),
}

impl Bf16In<'_> {
    pub(crate) fn ptr(&self) -> u64 {
        match self {
            Bf16In::Shadow(b) => ptr(b),
            Bf16In::Cast(b) => ptr(b),
        }
    }
}
