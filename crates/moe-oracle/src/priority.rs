//! The per-platform priority list of a family's backends, and the backend a user's
//! `moe_backend` string names (spec sections 5.2, 7.7; seed 002).

use crate::backend::{Backend, Family, Strictness, backend_names};
use crate::error::OracleError;
use crate::platform::Platform;

/// vLLM's `_get_priority_backends` for a family on a platform. Native lists drop backends that
/// have no moe-rs kernel.
pub fn priority_backends(family: Family, platform: &Platform, mode: Strictness) -> Vec<Backend> {
    let list = match family {
        Family::W4A8Int8 => {
            if platform.is_cpu() {
                vec![Backend::W4A8CpuInt4]
            } else {
                vec![]
            }
        }
        Family::Int8 => {
            let mut l = vec![Backend::Int8Triton, Backend::Int8Humming, Backend::Int8Cpu];
            if platform.is_cpu() {
                l.retain(|b| *b != Backend::Int8Cpu);
                l.insert(0, Backend::Int8Cpu);
            }
            l
        }
        Family::Wna16 => vec![Backend::Wna16Marlin, Backend::Wna16BatchedMarlin],
        Family::Unquantized => vec![Backend::UnquantizedCpu],
    };
    match mode {
        Strictness::VllmCompat => list,
        Strictness::Native => list
            .into_iter()
            .filter(|b| !b.kernels(mode).is_empty())
            .collect(),
    }
}

/// vLLM's `map_*_backend`: the backend a user string names, or vLLM's `ValueError` text.
pub fn map_backend(family: Family, name: &str, mode: Strictness) -> Result<Backend, OracleError> {
    let names = backend_names(family, mode);
    names
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, b)| *b)
        .ok_or_else(|| OracleError::UnknownBackendName {
            family,
            requested: name.to_string(),
            expected: names.iter().map(|(n, _)| *n).collect(),
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::platform::{CpuArch, Gpu};

    #[test]
    fn int8_priority_moves_cpu_to_front_on_cpu() {
        let cpu = Platform::cpu(CpuArch::X86_64, &[]).unwrap();
        let gpu = cpu.clone().with_gpu(Gpu {
            name: "cuda".into(),
            capability: (9, 0),
        });
        assert_eq!(
            priority_backends(Family::Int8, &cpu, Strictness::VllmCompat),
            vec![Backend::Int8Cpu, Backend::Int8Triton, Backend::Int8Humming]
        );
        assert_eq!(
            priority_backends(Family::Int8, &gpu, Strictness::VllmCompat),
            vec![Backend::Int8Triton, Backend::Int8Humming, Backend::Int8Cpu]
        );
        assert_eq!(
            priority_backends(Family::Int8, &cpu, Strictness::Native),
            vec![Backend::Int8Cpu]
        );
        assert!(priority_backends(Family::W4A8Int8, &gpu, Strictness::Native).is_empty());
    }

    #[test]
    fn user_names() {
        let e = map_backend(Family::Int8, "cpu", Strictness::VllmCompat).unwrap_err();
        assert_eq!(
            e.to_string(),
            "moe_backend='cpu' is not supported for Int8 MoE. Expected one of ['triton', 'humming']."
        );
        assert_eq!(
            map_backend(Family::Int8, "cpu", Strictness::Native).unwrap(),
            Backend::Int8Cpu
        );
        let e = map_backend(Family::W4A8Int8, "triton", Strictness::Native).unwrap_err();
        assert_eq!(
            e.to_string(),
            "moe_backend='triton' is not supported for W4A8 Int8 MoE. Expected one of ['cpu']."
        );
    }
}
