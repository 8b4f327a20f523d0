//! The ISA ladder: the names of the rungs, their order, and the `MOE_KERNELS_MAX_ISA` cap.
//!
//! A rung is a set of CPU features that one family of kernels needs. The ladder is ordered per
//! architecture (x86: scalar < avx2 < avx-vnni < avx512-vnni < amx; aarch64: scalar < neon <
//! dotprod < i8mm). The names are the strings used by environment variables and reports, fixed
//! by the project conventions.

use std::fmt;
use std::str::FromStr;

/// One rung of the ISA ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Isa {
    /// Portable Rust, always available: the reference every other rung is tested against.
    Scalar,
    /// x86-64 AVX2 (`vpmaddubsw` + `vpmaddwd`).
    Avx2,
    /// x86-64 AVX-VNNI (`{vex} vpdpbusd` on ymm).
    AvxVnni,
    /// x86-64 AVX-512 F/BW with VNNI (`vpdpbusd` on zmm).
    Avx512Vnni,
    /// x86-64 AMX-INT8 tiles (`tdpbusd`), with AVX-512 VNNI for small M and epilogues.
    Amx,
    /// aarch64 Advanced SIMD.
    Neon,
    /// aarch64 dot product (`sdot`).
    NeonDot,
    /// aarch64 int8 matrix multiply (`smmla`).
    NeonI8mm,
}

/// Every rung, x86 ones first, each architecture's in ascending order.
pub const ALL_ISAS: [Isa; 8] = [
    Isa::Scalar,
    Isa::Avx2,
    Isa::AvxVnni,
    Isa::Avx512Vnni,
    Isa::Amx,
    Isa::Neon,
    Isa::NeonDot,
    Isa::NeonI8mm,
];

/// The CPU architecture a rung belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum IsaArch {
    /// Runs everywhere.
    Portable,
    /// x86-64 only.
    X86_64,
    /// aarch64 only.
    Aarch64,
}

impl Isa {
    /// The conventional name (`scalar`, `avx2`, `avx-vnni`, `avx512-vnni`, `amx`, `neon`,
    /// `dotprod`, `i8mm`).
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avx-vnni",
            Isa::Avx512Vnni => "avx512-vnni",
            Isa::Amx => "amx",
            Isa::Neon => "neon",
            Isa::NeonDot => "dotprod",
            Isa::NeonI8mm => "i8mm",
        }
    }

    /// Which architecture the rung needs.
    pub const fn arch(self) -> IsaArch {
        match self {
            Isa::Scalar => IsaArch::Portable,
            Isa::Avx2 | Isa::AvxVnni | Isa::Avx512Vnni | Isa::Amx => IsaArch::X86_64,
            Isa::Neon | Isa::NeonDot | Isa::NeonI8mm => IsaArch::Aarch64,
        }
    }

    /// Position on its architecture's ladder (scalar is 0 on both).
    pub const fn rank(self) -> u8 {
        match self {
            Isa::Scalar => 0,
            Isa::Avx2 | Isa::Neon => 1,
            Isa::AvxVnni | Isa::NeonDot => 2,
            Isa::Avx512Vnni | Isa::NeonI8mm => 3,
            Isa::Amx => 4,
        }
    }

    /// Whether `self` is allowed under the cap `cap`: same architecture (or scalar) and not
    /// higher on the ladder.
    pub fn within_cap(self, cap: Isa) -> bool {
        self == Isa::Scalar || (self.arch() == cap.arch() && self.rank() <= cap.rank())
    }

    /// The rungs of the architecture this binary was built for, ascending, scalar first.
    pub fn native_ladder() -> Vec<Isa> {
        let arch = if cfg!(target_arch = "x86_64") {
            IsaArch::X86_64
        } else if cfg!(target_arch = "aarch64") {
            IsaArch::Aarch64
        } else {
            IsaArch::Portable
        };
        ALL_ISAS
            .into_iter()
            .filter(|isa| *isa == Isa::Scalar || isa.arch() == arch)
            .collect()
    }
}

impl fmt::Display for Isa {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A string that names no rung.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown ISA name {name:?}; expected one of scalar, avx2, avx-vnni, avx512-vnni, amx, neon, dotprod, i8mm"
)]
pub struct UnknownIsa {
    /// The string that was given.
    pub name: String,
}

impl FromStr for Isa {
    type Err = UnknownIsa;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let wanted = s.trim().to_ascii_lowercase();
        ALL_ISAS
            .into_iter()
            .find(|isa| isa.name() == wanted)
            .ok_or_else(|| UnknownIsa {
                name: s.to_string(),
            })
    }
}

/// Name of the environment variable that caps the ladder.
pub const MAX_ISA_ENV: &str = "MOE_KERNELS_MAX_ISA";

/// What the `MOE_KERNELS_MAX_ISA` value means for this binary.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IsaCap {
    /// Unset or empty: no cap.
    None,
    /// A rung of this architecture (or scalar): nothing above it is selected.
    Capped(Isa),
    /// A name that is not a rung, or a rung of another architecture: ignored (and logged).
    Ignored {
        /// The value as given.
        value: String,
        /// Why it is ignored.
        reason: &'static str,
    },
}

impl IsaCap {
    /// Interprets a cap value for the architecture this binary was built for.
    pub fn parse(value: Option<&str>) -> IsaCap {
        let Some(value) = value.map(str::trim).filter(|v| !v.is_empty()) else {
            return IsaCap::None;
        };
        match value.parse::<Isa>() {
            Err(_) => IsaCap::Ignored {
                value: value.to_string(),
                reason: "not an ISA name",
            },
            Ok(isa) if Isa::native_ladder().contains(&isa) => IsaCap::Capped(isa),
            Ok(_) => IsaCap::Ignored {
                value: value.to_string(),
                reason: "names a rung of another architecture",
            },
        }
    }

    /// Whether the cap allows `isa`.
    pub fn allows(&self, isa: Isa) -> bool {
        match self {
            IsaCap::Capped(cap) => isa.within_cap(*cap),
            IsaCap::None | IsaCap::Ignored { .. } => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for isa in ALL_ISAS {
            assert_eq!(isa.name().parse::<Isa>(), Ok(isa));
        }
        assert!("sse2".parse::<Isa>().is_err());
    }

    #[test]
    fn cap_orders_the_ladder() {
        assert!(Isa::Avx2.within_cap(Isa::AvxVnni));
        assert!(!Isa::Avx512Vnni.within_cap(Isa::AvxVnni));
        assert!(Isa::Scalar.within_cap(Isa::Scalar));
        assert!(!Isa::Avx2.within_cap(Isa::Scalar));
        assert!(!Isa::Neon.within_cap(Isa::Amx));
        assert_eq!(IsaCap::parse(None), IsaCap::None);
        assert_eq!(IsaCap::parse(Some("")), IsaCap::None);
        assert!(matches!(
            IsaCap::parse(Some("bogus")),
            IsaCap::Ignored { .. }
        ));
        assert_eq!(IsaCap::parse(Some("scalar")), IsaCap::Capped(Isa::Scalar));
    }
}
