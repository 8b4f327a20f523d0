//! Backend selection, the algorithm of spec 7.7 shared by every family: an explicit
//! `moe_backend` is honoured or refused with its reason; otherwise the priority list is walked
//! and the first kernel whose support check passes wins. Every refusal is logged at debug
//! level; the choice is logged once at info level.

use std::collections::HashSet;
use std::sync::{Mutex, OnceLock};

use moe_quant::QuantKey;

use crate::backend::{Backend, Family, Strictness, no_native_kernel};
use crate::config::MoeConfig;
use crate::disabled::DisabledKernels;
use crate::error::{OracleError, Refusal, Unsupported, py_list, unsupported_message};
use crate::kernels::{Kernel, KernelId};
use crate::platform::Platform;
use crate::priority::{map_backend, priority_backends};
use crate::quant_config::{ScalarQuantKey, WeightKey};
use crate::support::{ActivationFormat, SupportQuery, is_supported_config};

/// Knobs of selection that are not part of the layer configuration. Start from
/// [`SelectOptions::native`] or [`SelectOptions::vllm_compat`] and adjust with the `with_*`
/// methods (the struct is `#[non_exhaustive]`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SelectOptions {
    /// Which kernels are candidates and which rules they apply.
    pub mode: Strictness,
    /// Kernels to skip (see [`DisabledKernels::from_env`]).
    pub disabled: DisabledKernels,
    /// Require batch-invariant kernels.
    pub batch_invariant: bool,
}

impl SelectOptions {
    /// Native moe-rs kernels, nothing disabled, no batch invariance required.
    pub fn native() -> Self {
        Self {
            mode: Strictness::Native,
            disabled: DisabledKernels::none(),
            batch_invariant: false,
        }
    }

    /// vLLM's kernel classes and rules, nothing disabled.
    pub fn vllm_compat() -> Self {
        Self {
            mode: Strictness::VllmCompat,
            ..Self::native()
        }
    }

    /// The same options with a deny-list.
    pub fn with_disabled(mut self, disabled: DisabledKernels) -> Self {
        self.disabled = disabled;
        self
    }

    /// The same options with another candidate set and rules.
    pub fn with_mode(mut self, mode: Strictness) -> Self {
        self.mode = mode;
        self
    }

    /// The same options, requiring batch-invariant kernels or not.
    pub fn with_batch_invariant(mut self, batch_invariant: bool) -> Self {
        self.batch_invariant = batch_invariant;
        self
    }
}

/// The oracle's answer: which backend, which kernel (and rung), and the activation format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Selection {
    /// The family backend.
    pub backend: Backend,
    /// The kernel that will run.
    pub kernel: Kernel,
    /// The activation format the kernel consumes.
    pub activation_format: ActivationFormat,
}

/// The message vLLM prints when the family has no backend on this platform.
fn no_platform_message(family: Family) -> &'static str {
    match family {
        Family::W4A8Int8 => "W4A8 Int8 MoE is only supported on CPU platforms",
        Family::Int8 => "Int8 MoE has no backend on this platform",
        Family::Wna16 => "WNA16 MoE has no backend on this platform",
        Family::Unquantized => "Unquantized MoE has no backend on this platform",
    }
}

fn log_choice(family: Family, backend: Backend, kernel: &Kernel, available: &[Backend]) {
    let message = match family {
        Family::Wna16 => format!("Using '{backend}' WNA16 MoE backend."),
        _ => {
            let names: Vec<&str> = available.iter().map(|b| b.value()).collect();
            format!(
                "Using {backend} {family} MoE backend out of potential backends: {}.",
                py_list(&names)
            )
        }
    };
    static SEEN: OnceLock<Mutex<HashSet<String>>> = OnceLock::new();
    let seen = SEEN.get_or_init(|| Mutex::new(HashSet::new()));
    // A poisoned lock only means another thread panicked while logging; keep logging.
    let first = seen
        .lock()
        .map(|mut s| s.insert(message.clone()))
        .unwrap_or(true);
    if first {
        tracing::info!(kernel = %kernel, "{message}");
    }
}

struct Walk<'a> {
    family: Family,
    query: SupportQuery<'a>,
    opts: &'a SelectOptions,
    refusals: Vec<Refusal>,
}

impl Walk<'_> {
    /// Tries every kernel of a backend; returns the first that accepts.
    fn try_backend(&mut self, backend: Backend) -> Option<Kernel> {
        let kernels = backend.kernels(self.opts.mode);
        if kernels.is_empty() {
            self.refuse(backend, None, no_native_kernel());
        }
        for &id in kernels {
            let kernel = Kernel::on(id, self.query.platform);
            let verdict = if self.opts.disabled.is_disabled(&kernel) {
                Err(Unsupported::new(format!(
                    "kernel {kernel} is disabled by {}",
                    crate::disabled::ENV_VAR
                )))
            } else {
                is_supported_config(id, &self.query)
            };
            match verdict {
                Ok(()) => return Some(kernel),
                Err(reason) => self.refuse(backend, Some(kernel), reason),
            }
        }
        None
    }

    fn refuse(&mut self, backend: Backend, kernel: Option<Kernel>, reason: Unsupported) {
        tracing::debug!(
            kernel = kernel.map(|k| k.to_string()),
            "{}",
            unsupported_message(self.family, backend, Some(&reason))
        );
        self.refusals.push(Refusal {
            backend,
            kernel,
            reason,
        });
    }
}

/// Selects a backend and kernel for a family (spec 7.7).
///
/// Errors: [`OracleError::NoPlatformBackend`] when the platform has no backend for the family,
/// [`OracleError::UnknownBackendName`] / [`OracleError::RequestedBackendUnsupported`] for an
/// explicit `moe_backend` that is unknown or refuses, and
/// [`OracleError::NoBackendSupports`] (with every candidate's refusal) when nothing accepts.
pub fn select_backend(
    family: Family,
    config: &MoeConfig,
    weight_key: Option<&WeightKey>,
    activation_key: Option<&QuantKey>,
    platform: &Platform,
    opts: &SelectOptions,
) -> Result<Selection, OracleError> {
    let available = priority_backends(family, platform, opts.mode);
    if available.is_empty() {
        return Err(OracleError::NoPlatformBackend {
            family,
            message: no_platform_message(family),
        });
    }
    let activation_format = ActivationFormat::for_config(config);
    let mut walk = Walk {
        family,
        query: SupportQuery {
            config,
            weight_key,
            activation_key,
            activation_format,
            platform,
            batch_invariant: opts.batch_invariant,
        },
        opts,
        refusals: Vec::new(),
    };
    // vLLM's WNA16 oracle ignores moe_backend; every other oracle honours it.
    let honours_request = !(family == Family::Wna16 && opts.mode == Strictness::VllmCompat);
    if config.moe_backend != "auto" && honours_request {
        let backend = map_backend(family, &config.moe_backend, opts.mode)?;
        return match walk.try_backend(backend) {
            Some(kernel) => {
                log_choice(family, backend, &kernel, &available);
                Ok(Selection {
                    backend,
                    kernel,
                    activation_format,
                })
            }
            None => Err(OracleError::RequestedBackendUnsupported {
                family,
                backend,
                reason: walk.refusals.last().map(|r| r.reason.clone()),
                refusals: walk.refusals,
            }),
        };
    }
    for &backend in &available {
        if let Some(kernel) = walk.try_backend(backend) {
            log_choice(family, backend, &kernel, &available);
            return Ok(Selection {
                backend,
                kernel,
                activation_format,
            });
        }
    }
    Err(OracleError::NoBackendSupports {
        family,
        refusals: walk.refusals,
    })
}

/// `select_w4a8_int8_moe_backend(config, weight_key, activation_key)`.
pub fn select_w4a8_int8_moe_backend(
    config: &MoeConfig,
    weight_key: Option<&QuantKey>,
    activation_key: Option<&QuantKey>,
    platform: &Platform,
    opts: &SelectOptions,
) -> Result<Selection, OracleError> {
    let w = weight_key.map(|k| WeightKey::Quant(*k));
    select_backend(
        Family::W4A8Int8,
        config,
        w.as_ref(),
        activation_key,
        platform,
        opts,
    )
}

/// `select_int8_moe_backend(config)` with its default keys: per-channel static int8 weights,
/// dynamic per-token int8 activations (asked for even though the online method builds a W8A16
/// quant config, spec 5.2).
pub fn select_int8_moe_backend(
    config: &MoeConfig,
    platform: &Platform,
    opts: &SelectOptions,
) -> Result<Selection, OracleError> {
    let w = WeightKey::Quant(QuantKey::INT8_STATIC_CHANNEL_SYM);
    select_backend(
        Family::Int8,
        config,
        Some(&w),
        Some(&QuantKey::INT8_DYNAMIC_TOKEN_SYM),
        platform,
        opts,
    )
}

/// `select_wna16_moe_backend(config, weight_key, weight_bits)`; the activation key is always
/// `None` ("always BF16 activation for WNA16 MoE").
pub fn select_wna16_moe_backend(
    config: &MoeConfig,
    weight_key: &ScalarQuantKey,
    platform: &Platform,
    opts: &SelectOptions,
) -> Result<Selection, OracleError> {
    let w = WeightKey::Scalar(*weight_key);
    select_backend(Family::Wna16, config, Some(&w), None, platform, opts)
}

/// Selection for FP8 experts (e4m3 weights with f32 scales) with float activations: the WNA16
/// family, whose native kernel decodes the e4m3 codes (moe-rs only; the checkpoint's fp8
/// activation quantization, dynamic or static, is not applied). `weight_key` says how the
/// weights are scaled: `QuantKey::FP8_STATIC_128_BLOCK_SYM` (a scale per `128 × 128` block),
/// `QuantKey::FP8_STATIC_CHANNEL_SYM` (per output channel) or `QuantKey::FP8_STATIC_TENSOR_SYM`
/// (per tensor); any other key is refused by every kernel.
pub fn select_fp8_moe_backend(
    weight_key: &QuantKey,
    config: &MoeConfig,
    platform: &Platform,
    opts: &SelectOptions,
) -> Result<Selection, OracleError> {
    let w = WeightKey::Quant(*weight_key);
    select_backend(Family::Wna16, config, Some(&w), None, platform, opts)
}

/// Selection for unquantized experts (moe-rs only).
pub fn select_unquantized_moe_backend(
    config: &MoeConfig,
    platform: &Platform,
    opts: &SelectOptions,
) -> Result<Selection, OracleError> {
    select_backend(Family::Unquantized, config, None, None, platform, opts)
}

/// `make_w4a8_int8_moe_kernel`'s guard: W4A8 experts must be monolithic.
pub fn check_w4a8_experts_monolithic(kernel: KernelId) -> Result<(), OracleError> {
    if kernel.is_monolithic() {
        Ok(())
    } else {
        Err(OracleError::NotMonolithic {
            kernel: kernel.name().to_string(),
        })
    }
}
