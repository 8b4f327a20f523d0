//! [`WeightGroups`]: how the scales of a quantized weight `[N, K]` group its input columns, the
//! one descriptor a checkpoint's group size travels as from the parsed config to the oracle's
//! key and the packed formats.
//!
//! A checkpoint spells the grouping as one integer, `group_size`: `−1` for one scale per output
//! channel, `g > 0` for one scale per `g` consecutive input columns of each output row.
//! vLLM's oracle spells the same choice as a [`GroupShape`] tag: `(−1, 1)` per channel, `(1, g)`
//! per group. [`WeightGroups`] is parsed once from either spelling, with a typed error for
//! anything else, and converts back to both without loss.

use std::fmt;
use std::num::NonZeroUsize;

use crate::error::QuantError;
use crate::group_shape::GroupShape;

/// The scale grouping of a quantized weight `[N, K]`.
///
/// The checked constructors ([`Self::from_config`], [`Self::groups`], [`Self::from_group_size`],
/// [`Self::from_group_shape`]) accept group sizes up to `i64::MAX`, so that the config integer
/// and the [`GroupShape`] tag can always hold them; a larger size built by hand converts to
/// `i64::MAX` (no tensor has that many columns, so every size check refuses it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WeightGroups {
    /// One scale per output channel: config `group_size: -1`, tag `GroupShape(−1, 1)`.
    Channelwise,
    /// One scale per `g` consecutive input columns of each output row: config `group_size: g`,
    /// tag `GroupShape(1, g)`.
    Groups(NonZeroUsize),
}

impl WeightGroups {
    /// The config integer of channelwise scales.
    pub const CHANNELWISE_CONFIG: i64 = -1;

    /// Parses a checkpoint's `group_size`: `−1` is channelwise, `g > 0` groups of `g`. Rejects
    /// `0` and values below `−1` ([`QuantError::InvalidGroupSize`]) and a size that does not fit
    /// in `usize` ([`QuantError::GroupSizeOverflow`]).
    pub fn from_config(group_size: i64) -> Result<Self, QuantError> {
        const WHAT: &str = "group_size";
        match group_size {
            Self::CHANNELWISE_CONFIG => Ok(Self::Channelwise),
            g if g > 0 => {
                let g = usize::try_from(g).map_err(|_| QuantError::GroupSizeOverflow {
                    what: WHAT,
                    group_size: g.unsigned_abs(),
                    target: "usize",
                })?;
                Self::checked(WHAT, g)
            }
            g => Err(QuantError::InvalidGroupSize {
                what: WHAT,
                group_size: g,
            }),
        }
    }

    /// Groups of `g` input columns. Rejects `0` ([`QuantError::ZeroGroupSize`]) and a size above
    /// `i64::MAX` ([`QuantError::GroupSizeOverflow`]).
    pub fn groups(g: usize) -> Result<Self, QuantError> {
        Self::checked("WeightGroups::groups", g)
    }

    /// Groups of `g` input columns for `Some(g)`, channelwise for `None`: the spelling of
    /// command-line options and C callers. Rejects what [`Self::groups`] rejects.
    pub fn from_group_size(group_size: Option<usize>) -> Result<Self, QuantError> {
        group_size.map_or(Ok(Self::Channelwise), Self::groups)
    }

    /// Reads vLLM's weight tag: `(−1, 1)` is channelwise, `(1, g)` with `g > 0` groups of `g`.
    /// Any other shape is [`QuantError::NotAWeightGrouping`].
    pub fn from_group_shape(shape: GroupShape) -> Result<Self, QuantError> {
        if shape == GroupShape::PER_CHANNEL {
            return Ok(Self::Channelwise);
        }
        match usize::try_from(shape.col) {
            Ok(g) if shape.row == 1 && g > 0 => Self::checked("GroupShape", g),
            _ => Err(QuantError::NotAWeightGrouping { shape }),
        }
    }

    fn checked(what: &'static str, g: usize) -> Result<Self, QuantError> {
        let Some(nz) = NonZeroUsize::new(g) else {
            return Err(QuantError::ZeroGroupSize {
                what,
                group_size: g,
            });
        };
        if i64::try_from(g).is_err() {
            return Err(QuantError::GroupSizeOverflow {
                what,
                group_size: g as u64,
                target: "i64",
            });
        }
        Ok(Self::Groups(nz))
    }

    /// The input columns per scale group, or `None` for channelwise scales.
    pub fn group_size(self) -> Option<usize> {
        match self {
            Self::Channelwise => None,
            Self::Groups(g) => Some(g.get()),
        }
    }

    /// Whether there is one scale per output channel.
    pub fn is_channelwise(self) -> bool {
        self == Self::Channelwise
    }

    /// The checkpoint's `group_size`: `−1` for channelwise, else `g`.
    pub fn to_config(self) -> i64 {
        match self {
            Self::Channelwise => Self::CHANNELWISE_CONFIG,
            Self::Groups(g) => i64::try_from(g.get()).unwrap_or(i64::MAX),
        }
    }

    /// vLLM's weight tag: [`GroupShape::PER_CHANNEL`] or `(1, g)`.
    pub fn group_shape(self) -> GroupShape {
        match self {
            Self::Channelwise => GroupShape::PER_CHANNEL,
            Self::Groups(_) => GroupShape::new(1, self.to_config()),
        }
    }

    /// Scale columns per row of a weight with `k` input columns: `k / g`, or 1 channelwise.
    pub fn scale_cols(self, k: usize) -> usize {
        match self {
            Self::Channelwise => 1,
            Self::Groups(g) => k / g,
        }
    }
}

impl fmt::Display for WeightGroups {
    /// `channelwise` or `groups of {g}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Channelwise => f.write_str("channelwise"),
            Self::Groups(g) => write!(f, "groups of {g}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn g(n: usize) -> WeightGroups {
        WeightGroups::Groups(NonZeroUsize::new(n).unwrap())
    }

    #[test]
    fn config_integers_round_trip() {
        assert_eq!(
            WeightGroups::from_config(-1).unwrap(),
            WeightGroups::Channelwise
        );
        assert_eq!(WeightGroups::from_config(128).unwrap(), g(128));
        for c in [-1, 1, 32, 128, i64::MAX] {
            assert_eq!(WeightGroups::from_config(c).unwrap().to_config(), c);
        }
        for bad in [0, -2, i64::MIN] {
            assert_eq!(
                WeightGroups::from_config(bad),
                Err(QuantError::InvalidGroupSize {
                    what: "group_size",
                    group_size: bad
                })
            );
        }
    }

    #[test]
    fn group_sizes_are_checked() {
        assert_eq!(WeightGroups::groups(64).unwrap(), g(64));
        assert!(matches!(
            WeightGroups::groups(0),
            Err(QuantError::ZeroGroupSize { group_size: 0, .. })
        ));
        assert!(matches!(
            WeightGroups::groups(usize::MAX),
            Err(QuantError::GroupSizeOverflow { target: "i64", .. })
        ));
        assert_eq!(
            WeightGroups::from_group_size(None).unwrap(),
            WeightGroups::Channelwise
        );
        assert_eq!(WeightGroups::from_group_size(Some(32)).unwrap(), g(32));
        assert_eq!(g(32).group_size(), Some(32));
        assert_eq!(WeightGroups::Channelwise.group_size(), None);
        assert_eq!(g(usize::MAX).to_config(), i64::MAX);
    }

    #[test]
    fn group_shape_tags_round_trip() {
        assert_eq!(
            WeightGroups::Channelwise.group_shape(),
            GroupShape::PER_CHANNEL
        );
        assert_eq!(g(128).group_shape(), GroupShape::new(1, 128));
        for w in [WeightGroups::Channelwise, g(1), g(32), g(4096)] {
            assert_eq!(WeightGroups::from_group_shape(w.group_shape()), Ok(w));
        }
        for shape in [
            GroupShape::PER_TENSOR,
            GroupShape::PER_TOKEN,
            GroupShape::new(1, 0),
            GroupShape::new(128, 128),
        ] {
            assert_eq!(
                WeightGroups::from_group_shape(shape),
                Err(QuantError::NotAWeightGrouping { shape })
            );
        }
    }

    #[test]
    fn scale_columns_and_display() {
        assert_eq!(WeightGroups::Channelwise.scale_cols(256), 1);
        assert_eq!(g(32).scale_cols(256), 8);
        assert_eq!(WeightGroups::Channelwise.to_string(), "channelwise");
        assert_eq!(g(64).to_string(), "groups of 64");
        assert!(WeightGroups::Channelwise.is_channelwise() && !g(1).is_channelwise());
    }
}
