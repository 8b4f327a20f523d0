//! The tile unit the AMX kernels drive: a trait with the tile operations they use, the
//! hardware implementation (one `asm!` instruction per operation) and, for tests, an emulation
//! of the same instructions' documented semantics.
//!
//! The emulation exists because most machines have no AMX: with it, every line of the kernels
//! except the tile instructions themselves runs in the rung tests and is compared with the
//! scalar reference bit for bit. It also checks the shape rules the hardware would fault on
//! (rows ≤ 16, ≤ 64 bytes per row, matching A/B/C shapes), so a kernel that misconfigures a tile
//! fails the tests instead of the customer's machine.

use super::super::Amx;

/// Most rows a tile holds (palette 1).
pub(crate) const TILE_MAX_ROWS: usize = 16;
/// Most bytes per tile row (palette 1).
pub(crate) const TILE_MAX_COLSB: usize = 64;

/// The 64-byte palette-1 tile configuration that `ldtilecfg` reads.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    colsb: [u16; 16],
    rows: [u8; 16],
}

impl TileConfig {
    /// Palette 1 with every tile unused.
    pub(crate) fn new() -> Self {
        Self {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            colsb: [0; 16],
            rows: [0; 16],
        }
    }

    /// Shapes tile `t` as `rows × colsb` bytes.
    pub(crate) fn with_tile(mut self, t: u8, rows: usize, colsb: usize) -> Self {
        assert!(t < 8 && (1..=TILE_MAX_ROWS).contains(&rows));
        assert!((4..=TILE_MAX_COLSB).contains(&colsb) && colsb.is_multiple_of(4));
        self.rows[usize::from(t)] = rows as u8;
        self.colsb[usize::from(t)] = colsb as u16;
        self
    }
}

/// The tile operations the kernels use.
///
/// Implementations are trusted by the kernels: the methods are `unsafe` because the hardware
/// reads and writes raw memory and faults on a configuration it cannot run.
pub(crate) trait TileUnit {
    /// Loads `cfg` (`ldtilecfg`), zeroing every tile.
    ///
    /// # Safety
    /// - `cfg` was built with [`TileConfig::with_tile`] (so every shape is legal).
    unsafe fn configure(&mut self, cfg: &TileConfig);

    /// Zeroes tile `T` (`tilezero`).
    ///
    /// # Safety
    /// - The unit is configured and tile `T` is shaped.
    unsafe fn zero<const T: u8>(&mut self);

    /// Loads tile `T` from `rows(T)` rows of `colsb(T)` bytes at `base + r·stride`
    /// (`tileloadd`).
    ///
    /// # Safety
    /// - As [`TileUnit::zero`], and every byte `base + r·stride + c` (`r < rows`, `c < colsb`)
    ///   is readable.
    unsafe fn load<const T: u8>(&mut self, base: *const u8, stride: usize);

    /// `C += A·B` with unsigned A bytes and signed B bytes, four products per int32
    /// (`tdpbusd`).
    ///
    /// # Safety
    /// - The unit is configured with `rows(C) = rows(A)`, `colsb(C) = colsb(B)` and
    ///   `colsb(A) = 4·rows(B)`.
    unsafe fn dpbusd<const C: u8, const A: u8, const B: u8>(&mut self);

    /// `C += A·B` with signed A bytes and unsigned B bytes, four products per int32
    /// (`tdpbsud`).
    ///
    /// # Safety
    /// - As [`TileUnit::dpbusd`].
    unsafe fn dpbsud<const C: u8, const A: u8, const B: u8>(&mut self);

    /// `C += A·B` with bf16 pairs, f32 accumulators (`tdpbf16ps`): for each row `m`, K pair
    /// `k` and channel `n`, `C[m][n] += A[m][2k]·B[k][2n] + A[m][2k+1]·B[k][2n+1]`.
    ///
    /// # Safety
    /// - As [`TileUnit::dpbusd`] (the shapes are counted in bytes the same way), and the CPU
    ///   has AMX-BF16.
    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self);

    /// Stores tile `T` to `rows(T)` rows of `colsb(T)` bytes at `base + r·stride`
    /// (`tilestored`).
    ///
    /// # Safety
    /// - As [`TileUnit::zero`], and every byte `base + r·stride + c` is writable and not
    ///   accessed by anyone else meanwhile.
    unsafe fn store<const T: u8>(&mut self, base: *mut u8, stride: usize);

    /// Releases the tile state (`tilerelease`), so context switches stop saving it.
    fn release(&mut self);
}

/// The CPU's tile unit, usable because the AMX token proves CPU, OS and permission support.
#[derive(Debug)]
pub(crate) struct HwTiles {
    _token: Amx,
}

impl HwTiles {
    /// The unit of the current thread.
    pub(crate) fn new(token: Amx) -> Self {
        Self { _token: token }
    }
}

impl TileUnit for HwTiles {
    unsafe fn configure(&mut self, cfg: &TileConfig) {
        // SAFETY: the token proves AMX is usable by this process; `cfg` is a 64-byte aligned,
        // readable palette-1 configuration with legal shapes (caller contract).
        unsafe {
            std::arch::asm!("ldtilecfg [{0}]", in(reg) cfg, options(nostack, readonly));
        }
    }

    unsafe fn zero<const T: u8>(&mut self) {
        // SAFETY: AMX is usable (token) and tile `T` is configured (caller contract).
        unsafe { std::arch::asm!("tilezero tmm{t}", t = const T, options(nostack, nomem)) }
    }

    unsafe fn load<const T: u8>(&mut self, base: *const u8, stride: usize) {
        // SAFETY: AMX is usable (token); tile `T` is configured and every row the load reads is
        // readable (caller contract).
        unsafe {
            std::arch::asm!(
                "tileloadd tmm{t}, [{base} + {stride} * 1]",
                t = const T, base = in(reg) base, stride = in(reg) stride,
                options(nostack, readonly)
            );
        }
    }

    unsafe fn dpbusd<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: AMX-INT8 is usable (token) and the three shapes agree (caller contract).
        unsafe {
            std::arch::asm!(
                "tdpbusd tmm{c}, tmm{a}, tmm{b}",
                c = const C, a = const A, b = const B,
                options(nostack, nomem)
            );
        }
    }

    unsafe fn dpbsud<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: AMX-INT8 is usable (token) and the three shapes agree (caller contract).
        unsafe {
            std::arch::asm!(
                "tdpbsud tmm{c}, tmm{a}, tmm{b}",
                c = const C, a = const A, b = const B,
                options(nostack, nomem)
            );
        }
    }

    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        // SAFETY: AMX-BF16 is usable (caller contract) and the three shapes agree (caller
        // contract).
        unsafe {
            std::arch::asm!(
                "tdpbf16ps tmm{c}, tmm{a}, tmm{b}",
                c = const C, a = const A, b = const B,
                options(nostack, nomem)
            );
        }
    }

    unsafe fn store<const T: u8>(&mut self, base: *mut u8, stride: usize) {
        // SAFETY: AMX is usable (token); tile `T` is configured and every row written is
        // writable and exclusively ours (caller contract).
        unsafe {
            std::arch::asm!(
                "tilestored [{base} + {stride} * 1], tmm{t}",
                t = const T, base = in(reg) base, stride = in(reg) stride,
                options(nostack)
            );
        }
    }

    fn release(&mut self) {
        // SAFETY: AMX is usable (token); `tilerelease` is valid in any tile state.
        unsafe { std::arch::asm!("tilerelease", options(nostack, nomem)) }
    }
}

/// A software tile unit with the instructions' semantics, for testing the kernels anywhere.
#[cfg(test)]
pub(crate) struct EmulatedTiles {
    cfg: Option<TileConfig>,
    regs: Box<[[[u8; TILE_MAX_COLSB]; TILE_MAX_ROWS]; 8]>,
}

#[cfg(test)]
impl EmulatedTiles {
    /// An unconfigured unit.
    pub(crate) fn new() -> Self {
        Self {
            cfg: None,
            regs: Box::new([[[0; TILE_MAX_COLSB]; TILE_MAX_ROWS]; 8]),
        }
    }

    /// `(rows, colsb)` of tile `t`; panics like the hardware faults when it is not configured.
    fn shape(&self, t: u8) -> (usize, usize) {
        let cfg = self
            .cfg
            .as_ref()
            .expect("tile instruction before ldtilecfg");
        let (rows, colsb) = (cfg.rows[usize::from(t)], cfg.colsb[usize::from(t)]);
        assert!(rows > 0 && colsb > 0, "tile {t} is not configured");
        (usize::from(rows), usize::from(colsb))
    }

    /// `C += A·B` over groups of four bytes, each byte pair multiplied by `product` (which
    /// says how each side's bytes are signed), int32 sums wrapping as the hardware's do.
    fn int8_products(&mut self, c: u8, a: u8, b: u8, name: &str, product: fn(u8, u8) -> i32) {
        let ((c_rows, c_colsb), (a_rows, a_colsb), (b_rows, b_colsb)) =
            (self.shape(c), self.shape(a), self.shape(b));
        assert_eq!(c_rows, a_rows, "{name}: rows of C and A differ");
        assert_eq!(c_colsb, b_colsb, "{name}: bytes per row of C and B differ");
        assert_eq!(a_colsb, 4 * b_rows, "{name}: K of A and B differ");
        let (a, b) = (self.regs[usize::from(a)], self.regs[usize::from(b)]);
        let c = &mut self.regs[usize::from(c)];
        for m in 0..c_rows {
            for n in 0..c_colsb / 4 {
                let mut acc = i32::from_le_bytes(c[m][4 * n..4 * n + 4].try_into().unwrap());
                for k in 0..b_rows {
                    for i in 0..4 {
                        acc = acc.wrapping_add(product(a[m][4 * k + i], b[k][4 * n + i]));
                    }
                }
                c[m][4 * n..4 * n + 4].copy_from_slice(&acc.to_le_bytes());
            }
        }
    }
}

#[cfg(test)]
impl TileUnit for EmulatedTiles {
    unsafe fn configure(&mut self, cfg: &TileConfig) {
        assert_eq!(cfg.palette, 1);
        self.cfg = Some(*cfg);
        *self.regs = [[[0; TILE_MAX_COLSB]; TILE_MAX_ROWS]; 8];
    }

    unsafe fn zero<const T: u8>(&mut self) {
        self.shape(T);
        self.regs[usize::from(T)] = [[0; TILE_MAX_COLSB]; TILE_MAX_ROWS];
    }

    unsafe fn load<const T: u8>(&mut self, base: *const u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        let reg = &mut self.regs[usize::from(T)];
        *reg = [[0; TILE_MAX_COLSB]; TILE_MAX_ROWS];
        for (r, row) in reg.iter_mut().enumerate().take(rows) {
            // SAFETY: the caller guarantees `colsb` readable bytes at `base + r·stride`.
            let src = unsafe { std::slice::from_raw_parts(base.wrapping_add(r * stride), colsb) };
            row[..colsb].copy_from_slice(src);
        }
    }

    unsafe fn dpbusd<const C: u8, const A: u8, const B: u8>(&mut self) {
        self.int8_products(C, A, B, "tdpbusd", |a, b| i32::from(a) * i32::from(b as i8));
    }

    unsafe fn dpbsud<const C: u8, const A: u8, const B: u8>(&mut self) {
        self.int8_products(C, A, B, "tdpbsud", |a, b| i32::from(a as i8) * i32::from(b));
    }

    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {
        let ((c_rows, c_colsb), (a_rows, a_colsb), (b_rows, b_colsb)) =
            (self.shape(C), self.shape(A), self.shape(B));
        assert_eq!(c_rows, a_rows, "tdpbf16ps: rows of C and A differ");
        assert_eq!(
            c_colsb, b_colsb,
            "tdpbf16ps: bytes per row of C and B differ"
        );
        assert_eq!(a_colsb, 4 * b_rows, "tdpbf16ps: K of A and B differ");
        let (a, b) = (self.regs[usize::from(A)], self.regs[usize::from(B)]);
        let bf16 = |row: &[u8; TILE_MAX_COLSB], i: usize| {
            f32::from_bits(u32::from(u16::from_le_bytes([row[2 * i], row[2 * i + 1]])) << 16)
        };
        let c = &mut self.regs[usize::from(C)];
        for m in 0..c_rows {
            for n in 0..c_colsb / 4 {
                let mut acc = f32::from_le_bytes(c[m][4 * n..4 * n + 4].try_into().unwrap());
                for (k, b_row) in b.iter().enumerate().take(b_rows) {
                    // Each bf16 product is exact in f32; the unit adds them in this order.
                    acc += bf16(&a[m], 2 * k) * bf16(b_row, 2 * n);
                    acc += bf16(&a[m], 2 * k + 1) * bf16(b_row, 2 * n + 1);
                }
                c[m][4 * n..4 * n + 4].copy_from_slice(&acc.to_le_bytes());
            }
        }
    }

    unsafe fn store<const T: u8>(&mut self, base: *mut u8, stride: usize) {
        let (rows, colsb) = self.shape(T);
        for (r, row) in self.regs[usize::from(T)].iter().enumerate().take(rows) {
            // SAFETY: the caller guarantees `colsb` writable bytes at `base + r·stride`.
            let dst =
                unsafe { std::slice::from_raw_parts_mut(base.wrapping_add(r * stride), colsb) };
            dst.copy_from_slice(&row[..colsb]);
        }
    }

    fn release(&mut self) {
        self.cfg = None;
    }
}

/// A tile unit whose instructions do nothing, for timing the work around them (see the
/// `tile-cost-model` feature). Stores leave memory as it was.
#[cfg(feature = "tile-cost-model")]
pub(crate) struct NoopTiles;

#[cfg(feature = "tile-cost-model")]
impl TileUnit for NoopTiles {
    unsafe fn configure(&mut self, _cfg: &TileConfig) {}

    unsafe fn zero<const T: u8>(&mut self) {}

    unsafe fn load<const T: u8>(&mut self, base: *const u8, _stride: usize) {
        // Keeps the address computation alive, as the real load would.
        std::hint::black_box(base);
    }

    unsafe fn dpbusd<const C: u8, const A: u8, const B: u8>(&mut self) {}

    unsafe fn dpbsud<const C: u8, const A: u8, const B: u8>(&mut self) {}

    unsafe fn dpbf16ps<const C: u8, const A: u8, const B: u8>(&mut self) {}

    unsafe fn store<const T: u8>(&mut self, base: *mut u8, _stride: usize) {
        std::hint::black_box(base);
    }

    fn release(&mut self) {}
}
