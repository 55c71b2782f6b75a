//! One Qwen3-Next Gated DeltaNet layer in candle on deltakv's ops, against the same layer with
//! the recurrence in plain candle ops: a 70-token prompt (crossing a 64-token chunk) for two
//! sequences in slots of a pool, then decode steps (deltakv's in-place decode with fused
//! gating); and the prompt + decode equal one longer prefill.

mod common;

use candle_core::{Device, Tensor};
use common::tensor_rel_rms as rel_rms;
use deltakv_candle::qwen3_next::{GatedDeltaNetLayer, GdnCore, GdnLayerConfig, LayerCache};

fn config() -> GdnLayerConfig {
    GdnLayerConfig {
        hidden: 64,
        key_heads: 2,
        value_heads: 4,
        key_dim: 32,
        value_dim: 24,
        conv_kernel: 4,
        rms_eps: 1e-6,
    }
}

#[test]
fn the_layer_on_deltakv_matches_the_candle_reference() {
    let layer = GatedDeltaNetLayer::random(config(), 7).unwrap();
    let x = Tensor::randn(0f32, 1.0, (2, 73, 64), &Device::Cpu).unwrap();
    let slots = [3i64, 1];
    let mut ours = LayerCache::new(&layer.config, &slots, 5).unwrap();
    let mut reference = LayerCache::new(&layer.config, &slots, 5).unwrap();
    let prompt = x.narrow(1, 0, 70).unwrap();
    let y = layer.forward(&prompt, &mut ours, GdnCore::Deltakv).unwrap();
    let y_ref = layer
        .forward(&prompt, &mut reference, GdnCore::Reference)
        .unwrap();
    let err = rel_rms(&y, &y_ref);
    assert!(err < 1e-5, "prefill output rel_rms {err:.3e}");
    let mut outputs = vec![y];
    for t in 70..73 {
        let token = x.narrow(1, t, 1).unwrap();
        let y = layer.forward(&token, &mut ours, GdnCore::Deltakv).unwrap();
        let y_ref = layer
            .forward(&token, &mut reference, GdnCore::Reference)
            .unwrap();
        let err = rel_rms(&y, &y_ref);
        assert!(err < 1e-5, "decode step {t}: output rel_rms {err:.3e}");
        outputs.push(y);
    }
    let err = rel_rms(&ours.state_pool, &reference.state_pool);
    assert!(err < 1e-5, "pool rel_rms {err:.3e}");
    // Slots 0, 2 and 4 were never addressed.
    let norms: Vec<f32> = ours
        .state_pool
        .sqr()
        .unwrap()
        .sum((1, 2, 3))
        .unwrap()
        .to_vec1()
        .unwrap();
    assert!(norms[0] == 0.0 && norms[2] == 0.0 && norms[4] == 0.0 && norms[1] > 0.0);

    // One prefill of all 73 tokens gives the same outputs and states.
    let mut whole = LayerCache::new(&layer.config, &slots, 5).unwrap();
    let y_whole = layer.forward(&x, &mut whole, GdnCore::Deltakv).unwrap();
    let stepped = Tensor::cat(&outputs, 1).unwrap();
    let err = rel_rms(&stepped, &y_whole);
    assert!(
        err < 1e-5,
        "prompt + decode vs one prefill: rel_rms {err:.3e}"
    );
    let err = rel_rms(&ours.state_pool, &whole.state_pool);
    assert!(err < 1e-5, "pools: rel_rms {err:.3e}");
}
