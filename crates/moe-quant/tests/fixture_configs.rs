//! Every fixture checkpoint's `config.json` carries a compressed-tensors `quantization_config`
//! that must parse and validate; the W4A8 fixture must select vLLM's W4A8-int MoE method and the
//! weight-only one must not.

use moe_quant::ct_args::{
    QuantizationConfig, QuantizationStrategy, check_w4a8_int_moe, is_dynamic_token_w4a8_int,
};
use moe_testutil::fixtures_dir;

#[test]
fn fixture_quantization_configs_parse_and_validate() {
    let dir = fixtures_dir();
    let mut seen = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fixtures {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("config.json").is_file())
        .collect();
    entries.sort();
    for path in entries {
        let text = std::fs::read_to_string(path.join("config.json")).unwrap();
        let qc = QuantizationConfig::from_model_config_str(&text)
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        qc.validate()
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(qc.quant_method, "compressed-tensors");
        assert_eq!(qc.quantization_status.as_deref(), Some("compressed"));
        assert!(!qc.config_groups.is_empty(), "{}", path.display());
        assert!(
            qc.ignore.iter().any(|m| m == "lm_head"),
            "{}",
            path.display()
        );
        for scheme in qc.config_groups.values() {
            let w = scheme.weights.as_ref().expect("weights are quantized");
            assert_eq!(w.num_bits, 4);
            assert_eq!(w.effective_strategy(), QuantizationStrategy::Group);
            assert!(w.group_size_usize().is_some());
            let input = scheme.input_activations.as_ref();
            let w4a8 = is_dynamic_token_w4a8_int(w, input);
            match qc.format.as_deref() {
                Some("int-quantized") => {
                    assert!(w4a8, "{}", path.display());
                    check_w4a8_int_moe(w, input).unwrap();
                }
                Some("pack-quantized") => {
                    assert!(!w4a8, "{}", path.display());
                    assert!(input.is_none());
                }
                other => panic!("{}: unexpected format {other:?}", path.display()),
            }
            assert_eq!(scheme.format, qc.format);
        }
        seen += 1;
    }
    assert!(seen >= 2, "expected both fixture checkpoints, saw {seen}");
}
