//! The weight formats an expert can hold ([`PackedW4A8`], [`PackedW8A8`], [`PackedDense`],
//! [`PackedWna16`], Marlin weights) behind one sealed
//! trait, so the pipeline is written once and each format brings its GEMM and its numerics.

use crate::{
    GemmScratch, KernelError, KernelSet, PackedDense, PackedW4A8, PackedW8A8, PackedWna16, Par,
};

/// The part of [`ExpertMatrix`] only this crate sees: what lets the pipeline quantise each
/// token once per call for the formats whose GEMMs quantise their input rows per token.
pub(crate) mod sealed {
    use crate::gemm::{TokenCodes, TokenQuant, w4a8_gemm_tokens, w8a8_gemm_tokens};
    use crate::{GemmScratch, KernelError, KernelSet, PackedW4A8, PackedW8A8, Par};

    pub trait Sealed {
        /// How this format's GEMM quantises its input rows, when it quantises each row by
        /// itself (per token), so that the rows of one token may share one quantisation.
        fn token_quant(&self) -> Option<TokenQuant> {
            None
        }

        /// `out[m, N]` from the codes of `tokens` (one output row per entry), quantised by
        /// the rule of [`Self::token_quant`]. `Ok(false)`, with nothing written, when this
        /// call's kernel multiplies float rows; the caller then runs the float GEMM.
        fn gemm_tokens(
            &self,
            _ks: &KernelSet,
            _tokens: &[usize],
            _codes: TokenCodes<'_>,
            _out: &mut [f32],
            _scratch: &mut GemmScratch,
            _par: Par,
        ) -> Result<bool, KernelError> {
            Ok(false)
        }
    }

    impl Sealed for PackedW4A8 {
        fn token_quant(&self) -> Option<TokenQuant> {
            Some(TokenQuant::Asym)
        }

        fn gemm_tokens(
            &self,
            ks: &KernelSet,
            tokens: &[usize],
            codes: TokenCodes<'_>,
            out: &mut [f32],
            scratch: &mut GemmScratch,
            par: Par,
        ) -> Result<bool, KernelError> {
            w4a8_gemm_tokens(ks, tokens, codes, self, out, scratch, par)
        }
    }

    impl Sealed for PackedW8A8 {
        fn token_quant(&self) -> Option<TokenQuant> {
            Some(TokenQuant::Sym)
        }

        fn gemm_tokens(
            &self,
            ks: &KernelSet,
            tokens: &[usize],
            codes: TokenCodes<'_>,
            out: &mut [f32],
            scratch: &mut GemmScratch,
            par: Par,
        ) -> Result<bool, KernelError> {
            w8a8_gemm_tokens(ks, tokens, codes, self, out, scratch, par).map(|()| true)
        }
    }

    impl Sealed for crate::PackedDense {}
    impl Sealed for crate::marlin::MarlinWeights {}
    impl Sealed for crate::PackedWna16 {}
}

/// Which quantised GEMM family a weight format uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum WeightFormat {
    /// int4 weights, dynamic asymmetric per-row int8 activations (spec §4).
    W4A8,
    /// int8 per-channel weights, dynamic symmetric per-token int8 activations (spec §5.3).
    W8A8,
    /// Float weights (f32 or bf16), float activations, f32 compute: unquantized experts.
    Dense,
    /// Weight-only int4/int8 (WNA16): in Marlin's layout ([`crate::marlin::MarlinWeights`]) or
    /// our panels ([`PackedWna16`]); float activations, f32 compute.
    Wna16,
}

/// A packed expert weight matrix `[N, K]` the fused pipeline can multiply with.
pub trait ExpertMatrix: Send + Sync + sealed::Sealed {
    /// The GEMM family.
    const FORMAT: WeightFormat;

    /// Output channels N.
    fn n(&self) -> usize;

    /// Reduction dimension K.
    fn k(&self) -> usize;

    /// Whether the scales are one per output channel (no groups).
    fn is_channelwise(&self) -> bool;

    /// Grows `scratch` so that this matrix's GEMM of up to `max_rows` rows allocates nothing,
    /// for formats whose GEMM needs buffers beyond what [`GemmScratch::with_capacity`] sizes
    /// (gathered activation rows, staged outputs). A scratch sized only by a warm-up call
    /// could still grow later: the rows an expert receives vary from call to call.
    #[doc(hidden)]
    fn reserve_scratch(&self, _ks: &KernelSet, _scratch: &mut GemmScratch, _max_rows: usize) {}

    /// `out[m, N] = GEMM(x[m, K])`, quantising the rows of `x` dynamically.
    #[doc(hidden)]
    fn gemm(
        &self,
        ks: &KernelSet,
        m: usize,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut GemmScratch,
        par: Par,
    ) -> Result<(), KernelError>;
}

impl ExpertMatrix for PackedW4A8 {
    const FORMAT: WeightFormat = WeightFormat::W4A8;

    fn n(&self) -> usize {
        PackedW4A8::n(self)
    }

    fn k(&self) -> usize {
        PackedW4A8::k(self)
    }

    fn is_channelwise(&self) -> bool {
        self.groups().is_channelwise()
    }

    fn reserve_scratch(&self, ks: &KernelSet, scratch: &mut GemmScratch, max_rows: usize) {
        // The activation layout of whichever large-row kernel the GEMM takes.
        scratch.reserve_tiles(ks.w4a8_layout_bytes(self, max_rows));
    }

    fn gemm(
        &self,
        ks: &KernelSet,
        m: usize,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut GemmScratch,
        par: Par,
    ) -> Result<(), KernelError> {
        crate::w4a8_gemm(ks, m, x, self, out, scratch, par)
    }
}

impl ExpertMatrix for PackedW8A8 {
    const FORMAT: WeightFormat = WeightFormat::W8A8;

    fn n(&self) -> usize {
        PackedW8A8::n(self)
    }

    fn k(&self) -> usize {
        PackedW8A8::k(self)
    }

    fn is_channelwise(&self) -> bool {
        true
    }

    fn reserve_scratch(&self, ks: &KernelSet, scratch: &mut GemmScratch, max_rows: usize) {
        // The activation layout of the large-row kernel, if the rung has one.
        scratch.reserve_tiles(ks.w8a8_layout_bytes(self.k_pad(), max_rows));
    }

    fn gemm(
        &self,
        ks: &KernelSet,
        m: usize,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut GemmScratch,
        par: Par,
    ) -> Result<(), KernelError> {
        crate::w8a8_gemm(ks, m, x, self, out, scratch, par)
    }
}

impl ExpertMatrix for PackedDense {
    const FORMAT: WeightFormat = WeightFormat::Dense;

    fn n(&self) -> usize {
        PackedDense::n(self)
    }

    fn k(&self) -> usize {
        PackedDense::k(self)
    }

    fn is_channelwise(&self) -> bool {
        true
    }

    fn reserve_scratch(&self, _ks: &KernelSet, scratch: &mut GemmScratch, max_rows: usize) {
        // bf16 weights take the bf16 path's activation tiles from its first row count.
        if self.is_bf16() {
            scratch.reserve_bf16_tiles(max_rows, self.k());
        }
    }

    fn gemm(
        &self,
        ks: &KernelSet,
        m: usize,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut GemmScratch,
        par: Par,
    ) -> Result<(), KernelError> {
        crate::dense::dense_expert_gemm(ks, m, x, self, out, scratch, par)
    }
}

impl ExpertMatrix for crate::marlin::MarlinWeights {
    const FORMAT: WeightFormat = WeightFormat::Wna16;

    fn n(&self) -> usize {
        self.size_n()
    }

    fn k(&self) -> usize {
        self.size_k()
    }

    fn is_channelwise(&self) -> bool {
        crate::marlin::MarlinWeights::is_channelwise(self)
    }

    fn reserve_scratch(&self, _ks: &KernelSet, scratch: &mut GemmScratch, max_rows: usize) {
        crate::marlin::MarlinWeights::reserve_scratch(self, scratch, max_rows);
    }

    fn gemm(
        &self,
        _ks: &KernelSet,
        m: usize,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut GemmScratch,
        par: Par,
    ) -> Result<(), KernelError> {
        self.gemm_with_scratch(x, m, out, scratch, par)
            .map_err(|e| KernelError::Marlin {
                reason: e.to_string(),
            })
    }
}

impl ExpertMatrix for PackedWna16 {
    const FORMAT: WeightFormat = WeightFormat::Wna16;

    fn n(&self) -> usize {
        PackedWna16::n(self)
    }

    fn k(&self) -> usize {
        PackedWna16::k(self)
    }

    fn is_channelwise(&self) -> bool {
        PackedWna16::is_channelwise(self)
    }

    fn reserve_scratch(&self, _ks: &KernelSet, scratch: &mut GemmScratch, max_rows: usize) {
        if self.perm().is_some() {
            scratch.reserve_f32_rows(max_rows.saturating_mul(self.k()));
        }
        // The activation layout and per-row sums of whichever dot-product body or bf16 tile
        // path the GEMM takes.
        scratch.reserve_tiles(crate::wna16::activation_layout_bytes(self, max_rows));
        scratch.reserve_group_sums(
            max_rows.saturating_mul(crate::wna16::activation_sums_per_row(self)),
        );
    }

    fn gemm(
        &self,
        ks: &KernelSet,
        m: usize,
        x: &[f32],
        out: &mut [f32],
        scratch: &mut GemmScratch,
        par: Par,
    ) -> Result<(), KernelError> {
        crate::wna16_gemm(ks, m, x, self, out, scratch, par)
    }
}
