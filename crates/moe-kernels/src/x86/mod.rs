//! x86-64 CPU detection and the ISA tokens that prove it, plus one module per x86 rung.
//!
//! A token is a zero-sized value that can only be obtained when the CPU (and, for AMX, the
//! operating system) supports its features. Kernels take the token by value, so holding one is
//! the proof that discharges the `#[target_feature]` call obligation. The AMX token also performs
//! the Linux permission request for the tile data state, once per process.

mod actquant;
pub(crate) mod amx;
pub(crate) mod avx2;
mod avx512_channel;
pub(crate) mod avx512vnni;
pub(crate) mod avxvnni;
mod bf16dot;
mod dense;
pub(crate) mod probe;
mod requant;
mod wna16;
pub(crate) mod wna16_i15;
pub(crate) mod wna16_i15_avx2;
mod wna16dot;
mod ymm;

use std::sync::OnceLock;

use crate::Isa;
use crate::wna16_i15::integer_wna16_setting;

/// Proof that AVX2 (and FMA/BMI-era baseline SSE) can be used.
#[derive(Debug, Clone, Copy)]
pub struct Avx2(());

/// Proof that AVX-VNNI (VEX-encoded `vpdpbusd` on ymm) and AVX2 can be used.
#[derive(Debug, Clone, Copy)]
pub struct AvxVnni(());

/// Proof that AVX-512 F, BW, VL and VNNI can be used.
#[derive(Debug, Clone, Copy)]
pub struct Avx512Vnni(());

/// Proof that AMX-TILE and AMX-INT8 can be used: the CPU has them, the OS enables their state
/// in XCR0, and this process was granted the tile data permission. Implies [`Avx512Vnni`].
#[derive(Debug, Clone, Copy)]
pub struct Amx(());

impl Avx2 {
    /// The token, when the CPU has AVX2.
    pub fn try_new() -> Option<Self> {
        Self::is_available().then_some(Self(()))
    }

    /// The token without checking.
    ///
    /// # Safety
    /// - The CPU running the program must support AVX2.
    pub unsafe fn new_unchecked() -> Self {
        Self(())
    }

    /// Whether the CPU has AVX2.
    pub fn is_available() -> bool {
        std::is_x86_feature_detected!("avx2")
    }
}

impl AvxVnni {
    /// The token, when the CPU has AVX-VNNI and AVX2.
    pub fn try_new() -> Option<Self> {
        Self::is_available().then_some(Self(()))
    }

    /// The token without checking.
    ///
    /// # Safety
    /// - The CPU running the program must support AVX2 and AVX-VNNI.
    pub unsafe fn new_unchecked() -> Self {
        Self(())
    }

    /// Whether the CPU has AVX-VNNI and AVX2.
    pub fn is_available() -> bool {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("avxvnni")
    }
}

impl Avx512Vnni {
    /// The token, when the CPU has AVX-512 F, BW, VL and VNNI.
    pub fn try_new() -> Option<Self> {
        Self::is_available().then_some(Self(()))
    }

    /// The token without checking.
    ///
    /// # Safety
    /// - The CPU running the program must support AVX-512 F, BW, VL and VNNI.
    pub unsafe fn new_unchecked() -> Self {
        Self(())
    }

    /// Whether the CPU has AVX-512 F, BW, VL and VNNI.
    pub fn is_available() -> bool {
        std::is_x86_feature_detected!("avx512f")
            && std::is_x86_feature_detected!("avx512bw")
            && std::is_x86_feature_detected!("avx512vl")
            && std::is_x86_feature_detected!("avx512vnni")
    }

    /// The AVX2 token that AVX-512 implies.
    pub fn avx2(self) -> Avx2 {
        Avx2(())
    }
}

impl Amx {
    /// The token, when AMX-INT8 is usable: CPU support, OS support (XCR0) and the Linux tile
    /// data permission, which this call requests the first time (the answer is cached).
    pub fn try_new() -> Option<Self> {
        Self::is_available().then_some(Self(()))
    }

    /// The token without checking.
    ///
    /// # Safety
    /// - The CPU must support AMX-TILE, AMX-INT8 and AVX-512 VNNI, the OS must enable the tile
    ///   state, and the process must hold the tile data permission (see [`Amx::try_new`]).
    pub unsafe fn new_unchecked() -> Self {
        Self(())
    }

    /// Whether AMX-INT8 is usable, requesting the tile data permission the first time.
    pub fn is_available() -> bool {
        static GRANTED: OnceLock<bool> = OnceLock::new();
        *GRANTED.get_or_init(|| {
            let f = detect();
            f.amx_tile && f.amx_int8 && f.os_tile_state && Avx512Vnni::is_available() && {
                request_tile_permission()
            }
        })
    }

    /// The AVX-512 VNNI token that AMX implies (checked by [`Amx::is_available`]).
    pub fn avx512vnni(self) -> Avx512Vnni {
        Avx512Vnni(())
    }
}

/// What CPUID and XCR0 say about the x86 features the ladder cares about.
#[derive(Debug, Clone, Copy, Default)]
pub struct X86Features {
    /// AVX2.
    pub avx2: bool,
    /// FMA.
    pub fma: bool,
    /// AVX-VNNI (VEX).
    pub avx_vnni: bool,
    /// AVX-512 Foundation.
    pub avx512f: bool,
    /// AVX-512 byte/word.
    pub avx512bw: bool,
    /// AVX-512 vector length extensions.
    pub avx512vl: bool,
    /// AVX-512 VNNI.
    pub avx512vnni: bool,
    /// AVX-512 BF16.
    pub avx512bf16: bool,
    /// AVX-512 VBMI (byte permutes across the vector).
    pub avx512vbmi: bool,
    /// AMX-TILE (CPUID.(7,0):EDX bit 24).
    pub amx_tile: bool,
    /// AMX-INT8 (CPUID.(7,0):EDX bit 25).
    pub amx_int8: bool,
    /// AMX-BF16 (CPUID.(7,0):EDX bit 22).
    pub amx_bf16: bool,
    /// The OS enables XTILECFG and XTILEDATA in XCR0 (bits 17 and 18).
    pub os_tile_state: bool,
}

/// Reads CPUID and XCR0 (no side effects; the AMX permission is not requested here).
pub fn detect() -> X86Features {
    use std::arch::x86_64::__cpuid_count;
    let max_leaf = __cpuid_count(0, 0).eax;
    let (leaf7_edx, osxsave) = if max_leaf >= 7 {
        (
            __cpuid_count(7, 0).edx,
            __cpuid_count(1, 0).ecx & (1 << 27) != 0,
        )
    } else {
        (0, false)
    };
    let xcr0 = if osxsave { read_xcr0() } else { 0 };
    let tile_bits = (1u64 << 17) | (1u64 << 18);
    X86Features {
        avx2: std::is_x86_feature_detected!("avx2"),
        fma: std::is_x86_feature_detected!("fma"),
        avx_vnni: std::is_x86_feature_detected!("avxvnni"),
        avx512f: std::is_x86_feature_detected!("avx512f"),
        avx512bw: std::is_x86_feature_detected!("avx512bw"),
        avx512vl: std::is_x86_feature_detected!("avx512vl"),
        avx512vnni: std::is_x86_feature_detected!("avx512vnni"),
        avx512bf16: std::is_x86_feature_detected!("avx512bf16"),
        avx512vbmi: std::is_x86_feature_detected!("avx512vbmi"),
        amx_tile: leaf7_edx & (1 << 24) != 0,
        amx_int8: leaf7_edx & (1 << 25) != 0,
        amx_bf16: leaf7_edx & (1 << 22) != 0,
        os_tile_state: xcr0 & tile_bits == tile_bits,
    }
}

/// Reads XCR0 with `xgetbv`; only called when CPUID reports OSXSAVE.
fn read_xcr0() -> u64 {
    let (lo, hi): (u32, u32);
    // SAFETY: the caller checked CPUID.1:ECX.OSXSAVE, which makes `xgetbv` with ECX = 0 a valid
    // instruction; it only writes EAX and EDX, declared as outputs.
    unsafe {
        std::arch::asm!("xgetbv", in("ecx") 0u32, out("eax") lo, out("edx") hi,
            options(nomem, nostack, preserves_flags));
    }
    (u64::from(hi) << 32) | u64::from(lo)
}

/// Asks Linux for permission to use the AMX tile data state (`ARCH_REQ_XCOMP_PERM`,
/// `XFEATURE_XTILEDATA`). Without it the first tile instruction raises SIGILL.
#[cfg(target_os = "linux")]
fn request_tile_permission() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: `arch_prctl(ARCH_REQ_XCOMP_PERM, feature)` takes two integers, touches no memory of
    // ours, and only changes which XSAVE features this process may use; a refusal is an error
    // return, handled below.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    rc == 0
}

/// Other x86-64 systems: no known permission protocol, so AMX is not used.
#[cfg(not(target_os = "linux"))]
fn request_tile_permission() -> bool {
    false
}

/// The kernel set of rung `isa` if this CPU supports it, built from the rung's token.
pub(crate) fn kernel_set(isa: crate::Isa) -> Option<crate::KernelSet> {
    match isa {
        Isa::Avx2 => Avx2::try_new().map(|t| with_avx2_bodies(avx2::kernel_set(t), t)),
        Isa::AvxVnni => AvxVnni::try_new().map(|t| {
            // SAFETY: the AVX-VNNI token includes AVX2.
            let avx2 = unsafe { Avx2::new_unchecked() };
            with_avx2_bodies(avxvnni::kernel_set(t), avx2)
        }),
        Isa::Avx512Vnni => Avx512Vnni::try_new().map(avx512vnni_kernel_set),
        Isa::Amx => Amx::try_new().map(amx::kernel_set).or_else(amx_cost_model),
        _ => None,
    }
}

/// Without AMX, the AMX rung on no-op tiles when the `tile-cost-model` feature and
/// `MOE_KERNELS_TILE_COST_MODEL=1` ask for it (benchmarks of the non-tile work only).
#[cfg(feature = "tile-cost-model")]
fn amx_cost_model() -> Option<crate::KernelSet> {
    amx::cost_model::kernel_set()
}

/// Without the `tile-cost-model` feature there is no AMX rung without AMX.
#[cfg(not(feature = "tile-cost-model"))]
fn amx_cost_model() -> Option<crate::KernelSet> {
    None
}

/// `ks` with the AVX2 builds of the activation quantisers and the WNA16 and dense bodies.
fn with_avx2_bodies(ks: crate::KernelSet, _token: Avx2) -> crate::KernelSet {
    // SAFETY: the token proves AVX2, all the quantisers need.
    let ks = unsafe {
        ks.with_act_quant(
            Isa::Avx2,
            actquant::quantize_row_asym_u8_avx2,
            actquant::quantize_row_sym_u8_avx2,
        )
    };
    let fma_f16c = std::is_x86_feature_detected!("fma") && std::is_x86_feature_detected!("f16c");
    let wna16_body: crate::wna16::Wna16PanelsFn = if fma_f16c {
        wna16::ymm::wna16_entry
    } else {
        wna16::panels_avx2
    };
    // SAFETY: the token proves AVX2, and FMA and F16C were detected just above: all either
    // body needs.
    let ks = unsafe { ks.with_wna16(Isa::Avx2, wna16_body) };
    let ks = if fma_f16c && integer_wna16_on() {
        // SAFETY: as above: the integer body needs AVX2, FMA and F16C.
        unsafe { ks.with_wna16_int4_dot(wna16_i15_avx2::body(1, usize::MAX)) }
    } else {
        ks
    };
    // SAFETY: the token proves AVX2, all the dense builds need.
    unsafe { ks.with_dense(dense::AVX2) }
}

/// The AVX-512 VNNI kernels.
pub(crate) fn avx512vnni_kernel_set(_token: Avx512Vnni) -> crate::KernelSet {
    use crate::ukernel::ActEncoding::{I8BlockCorrected, U8Offset128};
    // SAFETY: the token proves AVX-512 F/BW/VL/VNNI, all these entries need.
    let ks = unsafe {
        crate::KernelSet::from_entries(
            Isa::Avx512Vnni,
            (Isa::Avx512Vnni, I8BlockCorrected, avx512vnni::w4a8_entry),
            (Isa::Avx512Vnni, U8Offset128, avx512vnni::w8a8_entry),
        )
    };
    // SAFETY: the token proves AVX-512 F, all the quantiser needs.
    let ks = unsafe {
        ks.with_act_quant(
            Isa::Avx512Vnni,
            actquant::quantize_row_asym_u8,
            actquant::quantize_row_sym_u8,
        )
    };
    // SAFETY: the token proves AVX-512 F/BW/VL, all the WNA16 body needs.
    let ks = unsafe { ks.with_wna16(Isa::Avx512Vnni, wna16::zmm::wna16_entry) };
    let channel = crate::dispatch::W4A8Kernel {
        isa: Isa::Avx512Vnni,
        encoding: U8Offset128,
        entry: avx512_channel::entry,
        tile_a: None,
        tile_a_bytes: None,
        pairs: false,
    };
    // SAFETY: the token proves AVX-512 F/BW/VNNI, all the requantised body needs.
    let ks = unsafe { ks.with_w4a8_channel(channel, channel_min_rows()) };
    // SAFETY: the token proves AVX-512 F, all the dense builds need.
    let ks = unsafe { ks.with_dense(dense::AVX512) };
    if std::is_x86_feature_detected!("avx512bf16") && bf16_dot_is_fast() {
        // SAFETY: the token proves AVX-512 F/BW and BF16 was detected just above: all the
        // bf16 dot-product body and its layout need.
        let ks = unsafe {
            ks.with_bf16_tiles(
                "avx512-bf16 dot products",
                crate::dispatch::Bf16MinRows::all(bf16_dot_min_rows()),
                bf16dot::entry,
                bf16dot::tile_a,
            )
        };
        // The integer body, where asked for, goes first: it takes the integer codes and leaves
        // MXFP4 to the bf16 body.
        let ks = if integer_wna16_setting() == Some(true) {
            // SAFETY: the token proves AVX-512 F/BW/VL/VNNI, all the integer body needs.
            unsafe { ks.with_wna16_int4_dot(wna16_i15::body(1, usize::MAX)) }
        } else {
            ks
        };
        // SAFETY: as above, with AVX-512 VL (the token) for the layout's 256-bit permute.
        unsafe { ks.with_wna16_int4_dot(wna16dot::body(int4_dot_min_rows())) }
    } else if !integer_wna16_on() {
        ks
    } else {
        // SAFETY: the token proves AVX-512 F/BW/VL/VNNI, all the integer body and its layout
        // need.
        unsafe { ks.with_wna16_int4_dot(wna16_i15::body(1, usize::MAX)) }
    }
}

/// Whether a rung may register the integer body: neither [`BF16_DOT_ENV`] (`0`: f32 products
/// everywhere) nor [`INTEGER_WNA16_ENV`](crate::wna16_i15::INTEGER_WNA16_ENV) (`0`) turned it
/// off.
pub(crate) fn integer_wna16_on() -> bool {
    !bf16_paths_off() && integer_wna16_setting() != Some(false)
}

/// The AVX-512 VNNI rung with its requantised W4A8 body from one row on, when the CPU has it
/// (tests).
#[cfg(test)]
pub(crate) fn avx512_channel_kernel_set_from_one_row() -> Option<crate::KernelSet> {
    let ks = avx512vnni_kernel_set(Avx512Vnni::try_new()?);
    let (kernel, _) = ks.w4a8_channel_kernel()?;
    // SAFETY: the set was built from the token, so its kernel may be called on this CPU.
    Some(unsafe { ks.with_w4a8_channel(kernel, 1) })
}

/// Rows from which the AVX-512 VNNI rung runs W4A8 GEMMs on weights requantised per channel
/// under `W4A8Prefill::ChannelInt8`, unless `MOE_KERNELS_W4A8_CHANNEL_MIN_M` sets it (read
/// once).
fn channel_min_rows() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var("MOE_KERNELS_W4A8_CHANNEL_MIN_M")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .map_or(DEFAULT_CHANNEL_MIN_ROWS, |m| m.max(1))
    })
}

/// See [`channel_min_rows`]. Both bodies interleaved with the exact one (every token on all 8
/// experts of 2048 × 768, groups of 32, two threads, three alternations): the exact body's time
/// over the requantised one's 0.66 at 4 rows, 0.88 at 8, 0.98 at 12, 1.13 at 16, 1.26 at 24,
/// 1.42 at 32 and 1.88 at 64.
const DEFAULT_CHANNEL_MIN_ROWS: usize = 16;

/// Rows from which int4 WNA16 GEMMs run the bf16 dot-product body with in-register decoding
/// where the AVX-512 BF16 path is on: from the first, as it needs no per-call dequantization
/// to pay back. On one AMD core, int4 g128, N 1536, K 2048 (the gemm criterion bench), it runs
/// at 1.87× the f32 body's rate with 1 row and 1.93-1.97× from 16.
const DEFAULT_INT4_BF16_DOT_MIN_ROWS: usize = 1;

/// Rows from which the int4 bf16 dot-product body runs: [`BF16_DOT_MIN_ROWS_ENV`] when set
/// (it moves both AVX-512 BF16 bodies), else [`DEFAULT_INT4_BF16_DOT_MIN_ROWS`].
fn int4_dot_min_rows() -> usize {
    std::env::var(BF16_DOT_MIN_ROWS_ENV)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(DEFAULT_INT4_BF16_DOT_MIN_ROWS, |m| m.max(1))
}

/// The AVX-512 VNNI set with the AVX-512 BF16 path from one row whatever the vendor, where
/// the CPU has AVX-512 BF16 (tests).
#[cfg(test)]
pub(crate) fn bf16_dot_kernel_set() -> Option<crate::KernelSet> {
    let token = Avx512Vnni::try_new()?;
    if !std::is_x86_feature_detected!("avx512bf16") {
        return None;
    }
    let ks = avx512vnni_kernel_set(token).without_wna16_int4_dot();
    // SAFETY: AVX-512 F/BW (the token) and BF16 (detected above) are all the body needs.
    let ks = unsafe {
        ks.with_bf16_tiles(
            "avx512-bf16 dot products",
            crate::dispatch::Bf16MinRows::all(1),
            bf16dot::entry,
            bf16dot::tile_a,
        )
    };
    // SAFETY: as above, with AVX-512 VL (the token) for the layout's 256-bit permute.
    let ks = unsafe { ks.with_wna16_int4_dot(wna16dot::body(1)) };
    Some(ks.with_w4a8_prefill(crate::W4A8Prefill::Bf16Tiles))
}

/// The environment variable that turns the AVX-512 BF16 path for int4 and e4m3 weights on
/// (`1`) or off (`0`) whatever the CPU's vendor. `0` also keeps the AMX rung off its AMX-BF16
/// tiles and every rung off the integer body of int4 weights, so that it means f32 products
/// for weight-only and bf16 experts on every rung.
pub(crate) const BF16_DOT_ENV: &str = "MOE_KERNELS_BF16_DOT";

/// What [`BF16_DOT_ENV`] asks for: `Some(true)` for `1`, `Some(false)` for `0`, else `None`.
fn bf16_dot_setting() -> Option<bool> {
    match std::env::var(BF16_DOT_ENV).as_deref().map(str::trim) {
        Ok("1") => Some(true),
        Ok("0") => Some(false),
        _ => None,
    }
}

/// Whether [`BF16_DOT_ENV`] turns every bf16 path off.
pub(crate) fn bf16_paths_off() -> bool {
    bf16_dot_setting() == Some(false)
}

/// The environment variable that moves the row count from which that path runs.
pub(crate) const BF16_DOT_MIN_ROWS_ENV: &str = "MOE_KERNELS_BF16_DOT_MIN_M";

/// Rows from which the AVX-512 BF16 path runs unless [`BF16_DOT_MIN_ROWS_ENV`] says otherwise.
/// Each call dequantizes its panel pairs once, which the rows of the call share. Measured on
/// one AMD core with AVX-512 BF16, int4 g128, N 1536, K 2048, against the f32 FMA body: 0.93×
/// its rate at 8 rows, 1.12× at 10 (thread CPU time, builds alternating); 1.26× at 16, 1.74× at
/// 64, 1.95× at 256 (the gemm criterion bench, `wna16_gemm/avx512-vnni` against `-f32`).
pub(crate) const DEFAULT_BF16_DOT_MIN_ROWS: usize = 10;

/// Whether `vdpbf16ps` outruns f32 FMA here, so that the bf16 path is worth its other
/// numerics: AMD's AVX-512 cores issue one 512-bit `vdpbf16ps` (32 MACs) per cycle where they
/// issue one 16-lane FMA; Intel's run it at about half their FMA rate, and those with AMX take
/// the AMX-BF16 tiles instead. [`BF16_DOT_ENV`] overrides the vendor rule.
fn bf16_dot_is_fast() -> bool {
    bf16_dot_setting().unwrap_or_else(|| {
        let id = std::arch::x86_64::__cpuid_count(0, 0);
        // "AuthenticAMD" in EBX, EDX, ECX.
        (id.ebx, id.edx, id.ecx) == (0x6874_7541, 0x6974_6e65, 0x444d_4163)
    })
}

/// Rows from which the AVX-512 BF16 path runs (read once).
fn bf16_dot_min_rows() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var(BF16_DOT_MIN_ROWS_ENV)
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(DEFAULT_BF16_DOT_MIN_ROWS)
            .max(1)
    })
}

/// What quantises activations where a rung registers no quantiser of its own: the portable
/// loops of `moe_quant::act`, built for the x86-64 baseline.
pub(crate) const PORTABLE_ACT_QUANT: &str = "scalar";

/// The detected features as `(name, detected)` pairs (AMX availability includes the OS
/// permission, requested here if not yet done).
pub(crate) fn feature_report() -> Vec<(&'static str, bool)> {
    let f = detect();
    vec![
        ("avx2", f.avx2),
        ("fma", f.fma),
        ("avx-vnni", f.avx_vnni),
        ("avx512f", f.avx512f),
        ("avx512bw", f.avx512bw),
        ("avx512vl", f.avx512vl),
        ("avx512-vnni", f.avx512vnni),
        ("avx512-bf16", f.avx512bf16),
        ("avx512-vbmi", f.avx512vbmi),
        ("amx-tile", f.amx_tile),
        ("amx-int8", f.amx_int8),
        ("amx-bf16", f.amx_bf16),
        ("os tile state (XCR0 17/18)", f.os_tile_state),
        ("amx permission granted", Amx::is_available()),
    ]
}

/// Kernel sets that only tests use, when AVX-512 VNNI is available: the AVX-VNNI bodies on EVEX
/// `vpdpbusd ymm`, and the AMX tile bodies on the emulated tile unit from one row on.
#[cfg(test)]
pub(crate) fn test_only_kernel_sets() -> Vec<(&'static str, crate::KernelSet)> {
    let evex =
        avxvnni::evex_twin::kernel_set().map(|ks| ("avx-vnni bodies on evex vpdpbusd ymm", ks));
    let amx = amx::emulated::kernel_set().map(|ks| ("amx bodies on emulated tiles", ks));
    evex.into_iter().chain(amx).collect()
}
