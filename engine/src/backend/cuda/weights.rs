//! Linear and expert weights as the CUDA backend keeps them: bf16, f32 (reference precision and
//! the router gate) or compressed (AWQ int4, FP8; see `quant`).

use cleave_kernels::cudarc::driver::CudaSlice;
use cleave_kernels::ops::QWeights;
use cleave_kernels::ptr;

use super::quant::QuantWeight;

/// A linear weight `[out, in]` as the GPU keeps it: bf16; f32 for the MoE router's gate (as
/// transformers computes router logits in f32: bf16 rounding there flips near-tied expert
/// choices) and at `Precision::F32`; or compressed (AWQ int4, FP8) as the checkpoint stores it.
pub struct CudaWeight {
    pub(super) data: WeightData,
    pub out: usize,
    pub inp: usize,
}

pub(super) enum WeightData {
    Bf16(CudaSlice<u16>),
    F32(CudaSlice<f32>),
    Quant(QuantWeight),
}

impl CudaWeight {
    /// Device address of the bf16 values, when the weight is kept in bf16.
    pub fn bf16_ptr(&self) -> Option<u64> {
        match &self.data {
            WeightData::Bf16(b) => Some(ptr(b)),
            _ => None,
        }
    }
    pub(super) fn f32_ptr(&self) -> Option<u64> {
        match &self.data {
            WeightData::F32(b) => Some(ptr(b)),
            _ => None,
        }
    }
    /// The compressed weight, when kept compressed.
    pub fn quant(&self) -> Option<QWeights> {
        match &self.data {
            WeightData::Quant(q) => Some(q.view()),
            _ => None,
        }
    }
    /// Device address of an FP8 weight's scales per 128 x 128 block in cuBLASLt's layout, when
    /// its prefill linears can run on FP8 tensor cores.
    pub fn fp8_block_scales(&self) -> Option<u64> {
        match &self.data {
            WeightData::Quant(q) => q.block_scales(),
            _ => None,
        }
    }
}

/// Routed experts, stacked: `gate_up` `[E, 2I, H]` with gate and up rows interleaved (row 2j is
/// gate j, row 2j+1 up j) and `down` `[E, H, I]`; bf16, f32 (reference precision) or compressed.
/// The last `shared` of the stack are shared experts folded in.
pub struct CudaExperts {
    pub(super) data: ExpertData,
    pub experts: usize,
    pub shared: usize,
    /// The layer's id of the first expert held (expert parallelism).
    pub first: usize,
    pub hidden: usize,
    pub inter: usize,
}

// One per layer: boxing the compressed variant would save nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
pub(super) enum ExpertData {
    Bf16 { gate_up: CudaSlice<u16>, down: CudaSlice<u16> },
    F32 { gate_up: CudaSlice<f32>, down: CudaSlice<f32> },
    Quant { gate_up: QuantWeight, down: QuantWeight },
}

impl CudaExperts {
    /// The compressed stacks (gate/up, down), when kept compressed.
    pub fn quant(&self) -> Option<(QWeights, QWeights)> {
        match &self.data {
            ExpertData::Quant { gate_up, down } => Some((gate_up.view(), down.view())),
            _ => None,
        }
    }
}
