//! Marlin's weight tile layouts as a closed form (spec `marlin.md` §3.3): which `(k, n)` code
//! each bit field of each packed word holds, for 4- and 8-bit weights and for the 16×64 tiles
//! (16-bit activations) and 32×32 tiles (8-bit activations).
//!
//! Everything else in the module (repack, unpack, the executor) is driven by
//! [`MarlinLayout::field_coords`], so the layout is written down exactly once.

use super::error::MarlinError;

/// Weight bit width: the two widths Marlin has layouts for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightBits {
    /// 4-bit codes (`uint4b8`: value = code − 8), 8 per 32-bit word.
    B4,
    /// 8-bit codes (`uint8b128`: value = code − 128), 4 per 32-bit word.
    B8,
}

impl WeightBits {
    /// Parses a bit count, refusing anything but 4 and 8 with vLLM's message.
    pub fn new(num_bits: u32) -> Result<Self, MarlinError> {
        match num_bits {
            4 => Ok(Self::B4),
            8 => Ok(Self::B8),
            _ => Err(MarlinError::UnsupportedBits { num_bits }),
        }
    }

    /// Bits per code.
    pub const fn bits(self) -> u32 {
        match self {
            Self::B4 => 4,
            Self::B8 => 8,
        }
    }

    /// Codes per 32-bit word (`32 / bits`).
    pub const fn pack_factor(self) -> usize {
        (32 / self.bits()) as usize
    }

    /// Mask of one code.
    pub const fn mask(self) -> u32 {
        (1 << self.bits()) - 1
    }

    /// The bias of the symmetric code: value = code − bias (8 or 128).
    pub const fn bias(self) -> i32 {
        1 << (self.bits() - 1)
    }
}

/// One of Marlin's four weight layouts: bit width × activation width.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MarlinLayout {
    /// Weight bit width.
    pub bits: WeightBits,
    /// `is_a_8bit`: the 32×32-tile layout for int8/fp8 activations instead of the 16×64 one.
    pub a8: bool,
}

/// Codes in one tile, whichever the layout: 16·64 = 32·32.
pub const TILE_CODES: usize = 1024;

impl MarlinLayout {
    /// Tile height in rows of K (16, or 32 with 8-bit activations).
    pub const fn tile_k(self) -> usize {
        if self.a8 { 32 } else { 16 }
    }

    /// Tile width in columns of N (64, or 32 with 8-bit activations).
    pub const fn tile_n(self) -> usize {
        if self.a8 { 32 } else { 64 }
    }

    /// Packed words per tile (`1024 / pack_factor`).
    pub const fn words_per_tile(self) -> usize {
        TILE_CODES / self.bits.pack_factor()
    }

    /// The `(k, n)` inside its tile of the code held by field `t` of word `w` of a tile
    /// (`w < words_per_tile`, `t < pack_factor`). This is the table of spec §3.3.
    #[inline]
    pub const fn field_coords(self, w: usize, t: usize) -> (usize, usize) {
        match (self.bits, self.a8) {
            (WeightBits::B4, false) => {
                let (i, j) = (w / 4, w % 4);
                let c = (t / 2) % 2;
                let dk = t / 4 + 8 * (t % 2);
                (2 * (i % 4) + dk, 16 * j + i / 4 + 8 * c)
            }
            (WeightBits::B8, false) => {
                let (i, j, c) = (w / 8, (w % 8) / 2, w % 2);
                let dk = t / 2 + 8 * (t % 2);
                (2 * (i % 4) + dk, 16 * j + i / 4 + 8 * c)
            }
            (WeightBits::B4, true) => {
                let (i, j, c) = (w / 4, (w % 4) / 2, w % 2);
                let dk = t / 2 + 16 * (t % 2);
                (4 * (i % 4) + dk, 16 * j + i / 4 + 8 * c)
            }
            (WeightBits::B8, true) => {
                let (i, j, c, h) = (w / 8, (w % 8) / 4, (w % 4) / 2, w % 2);
                let dk = t + 16 * h;
                (4 * (i % 4) + dk, 16 * j + i / 4 + 8 * c)
            }
        }
    }

    /// The whole tile's coordinate table, `field_coords(w, t)` at `w·pack_factor + t`, with
    /// `k·tile_n + n` packed into one index (both fit a `u16`).
    ///
    /// The four tables are computed at compile time, so the executor reads them on every call
    /// without building (or allocating) anything.
    pub fn tile_table(self) -> &'static [u16; TILE_CODES] {
        match (self.bits, self.a8) {
            (WeightBits::B4, false) => &TILE_TABLES[0],
            (WeightBits::B8, false) => &TILE_TABLES[1],
            (WeightBits::B4, true) => &TILE_TABLES[2],
            (WeightBits::B8, true) => &TILE_TABLES[3],
        }
    }

    /// [`Self::tile_table`] of this layout, built by walking every field of a tile.
    const fn build_tile_table(self) -> [u16; TILE_CODES] {
        let pf = self.bits.pack_factor();
        let tn = self.tile_n();
        let mut table = [0u16; TILE_CODES];
        let mut w = 0;
        while w < self.words_per_tile() {
            let mut t = 0;
            while t < pf {
                let (k, n) = self.field_coords(w, t);
                table[w * pf + t] = (k * tn + n) as u16;
                t += 1;
            }
            w += 1;
        }
        table
    }
}

/// The tile tables of the four layouts, in the order [`MarlinLayout::tile_table`] reads them.
static TILE_TABLES: [[u16; TILE_CODES]; 4] = [
    MarlinLayout {
        bits: WeightBits::B4,
        a8: false,
    }
    .build_tile_table(),
    MarlinLayout {
        bits: WeightBits::B8,
        a8: false,
    }
    .build_tile_table(),
    MarlinLayout {
        bits: WeightBits::B4,
        a8: true,
    }
    .build_tile_table(),
    MarlinLayout {
        bits: WeightBits::B8,
        a8: true,
    }
    .build_tile_table(),
];

/// The size checks of the repack, in upstream's order, plus the project's a8 rule: `K` a
/// multiple of the tile height, `N` of 64, bits 4 or 8.
pub fn check_tile_shape(
    size_k: usize,
    size_n: usize,
    num_bits: u32,
    a8: bool,
) -> Result<MarlinLayout, MarlinError> {
    if !size_k.is_multiple_of(16) {
        return Err(MarlinError::SizeKNotMultiple { size_k, tile: 16 });
    }
    if !size_n.is_multiple_of(64) {
        return Err(MarlinError::SizeNNotMultiple { size_n, tile: 64 });
    }
    let bits = WeightBits::new(num_bits)?;
    if a8 && !size_k.is_multiple_of(32) {
        return Err(MarlinError::A8SizeKNotMultipleOf32 { size_k });
    }
    Ok(MarlinLayout { bits, a8 })
}

#[cfg(test)]
mod tests {
    use super::*;

    const B4: MarlinLayout = MarlinLayout {
        bits: WeightBits::B4,
        a8: false,
    };
    const B8: MarlinLayout = MarlinLayout {
        bits: WeightBits::B8,
        a8: false,
    };
    const B4A8: MarlinLayout = MarlinLayout {
        bits: WeightBits::B4,
        a8: true,
    };
    const B8A8: MarlinLayout = MarlinLayout {
        bits: WeightBits::B8,
        a8: true,
    };

    fn word(l: MarlinLayout, w: usize) -> Vec<(usize, usize)> {
        (0..l.bits.pack_factor())
            .map(|t| l.field_coords(w, t))
            .collect()
    }

    #[test]
    fn worked_examples_of_the_spec() {
        assert_eq!(
            word(B4, 0),
            [
                (0, 0),
                (8, 0),
                (0, 8),
                (8, 8),
                (1, 0),
                (9, 0),
                (1, 8),
                (9, 8)
            ]
        );
        assert_eq!(word(B4, 1)[0], (0, 16));
        assert_eq!(
            word(B4, 4),
            [
                (2, 0),
                (10, 0),
                (2, 8),
                (10, 8),
                (3, 0),
                (11, 0),
                (3, 8),
                (11, 8)
            ]
        );
        assert_eq!(word(B4, 16)[0], (0, 1));
        assert_eq!(
            word(B4, 127),
            [
                (6, 55),
                (14, 55),
                (6, 63),
                (14, 63),
                (7, 55),
                (15, 55),
                (7, 63),
                (15, 63)
            ]
        );
        assert_eq!(word(B8, 0), [(0, 0), (8, 0), (1, 0), (9, 0)]);
        assert_eq!(word(B8, 1)[0], (0, 8));
        assert_eq!(word(B8, 2)[0], (0, 16));
        assert_eq!(word(B8, 8), [(2, 0), (10, 0), (3, 0), (11, 0)]);
        assert_eq!(
            word(B4A8, 0),
            [
                (0, 0),
                (16, 0),
                (1, 0),
                (17, 0),
                (2, 0),
                (18, 0),
                (3, 0),
                (19, 0)
            ]
        );
        assert_eq!(word(B4A8, 1)[0], (0, 8));
        assert_eq!(word(B4A8, 2)[0], (0, 16));
        assert_eq!(word(B4A8, 4)[0], (4, 0));
        assert_eq!(word(B8A8, 0), [(0, 0), (1, 0), (2, 0), (3, 0)]);
        assert_eq!(word(B8A8, 1), [(16, 0), (17, 0), (18, 0), (19, 0)]);
        assert_eq!(word(B8A8, 2)[0], (0, 8));
    }

    #[test]
    fn every_layout_is_a_bijection_onto_its_tile() {
        for l in [B4, B8, B4A8, B8A8] {
            let mut seen = vec![false; TILE_CODES];
            for &idx in l.tile_table() {
                assert!(
                    !std::mem::replace(&mut seen[idx as usize], true),
                    "{l:?}: {idx} twice"
                );
            }
            assert!(seen.iter().all(|&s| s), "{l:?}");
        }
    }
}
