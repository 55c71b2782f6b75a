"""A real model on deltakv: transformers' Qwen3-Next (a tiny config built here, random
weights, nothing downloaded) with its gated-delta-rule calls replaced by deltakv's, against the
unpatched model (transformers' own torch path, float32) over a prompt and a few decode steps:
the logits of every step and the recurrent states in the cache; on the CPU, and on a CUDA GPU
with the tensors staying on the device (deltakv's CUDA kernels, on torch's current stream).

Skipped, with the reason on the pytest summary line, where torch or transformers (with
Qwen3-Next) is not installed, and the CUDA case without a CUDA torch or a `cuda` build."""

import numpy as np
import pytest

import deltakv

torch = pytest.importorskip("torch", reason="torch is not installed")
modeling = pytest.importorskip(
    "transformers.models.qwen3_next.modeling_qwen3_next",
    reason="transformers with Qwen3-Next is not installed",
)
from transformers import Qwen3NextConfig  # noqa: E402

# rel_rms bounds: both sides compute in float32 (deltakv's CPU kernels keep f32 intermediates;
# transformers' torch path is f32 too), so the differences are f32 rounding: measured 1.8e-7
# on the logits and 4.2e-8, 1.6e-7, 1.8e-7 on the three layers' states.
# On CUDA the chunked prefill multiplies bf16 operands (f32 accumulation and state, the Rust
# CUDA tests' 4e-3 bound per call) and the decode steps run the f32 recurrence; bounds 1e-2,
# the measured figures printed.
TOLERANCES = {"cpu": (1e-4, 1e-4), "cuda": (1e-2, 1e-2)}


def rel_rms(x, ref):
    x, ref = (t.detach().double() for t in (x, ref))
    return float(((x - ref).pow(2).sum() / ref.pow(2).sum()).sqrt())


def tiny_config():
    # Every 4th layer full attention, the rest Gated DeltaNet; GVA (2 key heads, 4 value
    # heads), K != V, a small MoE. Prompt length 70 crosses a 64-token chunk.
    return Qwen3NextConfig(
        vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16,
        linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16,
        linear_value_head_dim=24, linear_conv_kernel_dim=4, num_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        max_position_embeddings=256,
    )


def _fla_args(kwargs):
    """The FLA arguments of a call (the model also forwards its attention kwargs, which the
    gated delta rule does not read)."""
    keep = ("g", "beta", "scale", "initial_state", "output_final_state", "cu_seqlens",
            "use_qk_l2norm_in_kernel")
    return {k: v for k, v in kwargs.items() if k in keep}


def deltakv_chunk(query, key, value, **kwargs):
    return deltakv.chunk_gated_delta_rule(query, key, value, **_fla_args(kwargs))


def deltakv_recurrent(query, key, value, **kwargs):
    return deltakv.fused_recurrent_gated_delta_rule(query, key, value, **_fla_args(kwargs))


def deltakv_pool_decode(query, key, value, g, beta, initial_state=None, **kwargs):
    """The decode step as a serving engine runs it: the cached states ``[B, H, K, V]`` are a
    pool of B slots, advanced in place by deltakv's decode (row b in slot b)."""
    kwargs = _fla_args(kwargs)
    pool = initial_state
    slots = torch.arange(query.shape[0], dtype=torch.int64, device=query.device)
    o, _ = deltakv.gated_delta_rule_decode(
        query.contiguous(), key.contiguous(), value.contiguous(), pool, slots, g=g, beta=beta,
        use_qk_l2norm_in_kernel=kwargs.get("use_qk_l2norm_in_kernel", False))
    return o, pool


def recurrent_state(cache, layer):
    """The linear-attention layer's recurrent state: `get_recurrent_state` in transformers
    >= 5.23, the cache layer's `recurrent_states[0]` before (5.17 on the GPU machine)."""
    if hasattr(cache, "get_recurrent_state"):
        return cache.get_recurrent_state(layer)
    return cache.layers[layer].recurrent_states[0]


def generate(model, prompt, decode_tokens):
    """Logits of the prompt and of each decode step (fixed tokens, so both runs see the same
    inputs), and the recurrent state of every linear-attention layer at the end."""
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
        logits, cache = [out.logits], out.past_key_values
        for step in range(decode_tokens.shape[1]):
            out = model(input_ids=decode_tokens[:, step:step + 1], past_key_values=cache,
                        use_cache=True)
            logits.append(out.logits)
    layers = [i for i, t in enumerate(model.config.layer_types) if t == "linear_attention"]
    states = [recurrent_state(cache, i).clone() for i in layers]
    return torch.cat(logits, dim=1), states


def patch(monkeypatch, model, chunk, recurrent):
    """Routes the model's gated delta rule to `chunk` / `recurrent`: the module functions the
    layers call (transformers 5), and the layers' own attributes where a version keeps them."""
    monkeypatch.setattr(modeling, "torch_chunk_gated_delta_rule", chunk)
    monkeypatch.setattr(modeling, "torch_recurrent_gated_delta_rule", recurrent)
    for layer in model.modules():
        if hasattr(layer, "chunk_gated_delta_rule"):
            monkeypatch.setattr(layer, "chunk_gated_delta_rule", chunk)
        if hasattr(layer, "recurrent_gated_delta_rule"):
            monkeypatch.setattr(layer, "recurrent_gated_delta_rule", recurrent)


def device_or_skip(name):
    if name == "cuda":
        if not torch.cuda.is_available():
            pytest.skip("skipped: no CUDA GPU for torch here (runs on the GPU machine: "
                        "tools/gpu-check.sh py-cuda)")
        if not deltakv.CUDA_BUILT:
            pytest.skip("skipped: this deltakv was built without the cargo feature `cuda`")
    return torch.device(name)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("decode", ["fused_recurrent", "pool_in_place"])
def test_patched_qwen3_next_matches_the_unpatched_model(monkeypatch, decode, device):
    device = device_or_skip(device)
    torch.manual_seed(0)
    model = modeling.Qwen3NextForCausalLM(tiny_config()).eval().to(device)
    prompt = torch.randint(0, 97, (2, 70)).to(device)
    decode_tokens = torch.randint(0, 97, (2, 4)).to(device)
    ref_logits, ref_states = generate(model, prompt, decode_tokens)

    calls = {"chunk": 0, "recurrent": 0}

    def counted(kind, fn):
        def call(*args, **kwargs):
            calls[kind] += 1
            return fn(*args, **kwargs)
        return call

    recurrent = deltakv_recurrent if decode == "fused_recurrent" else deltakv_pool_decode
    patch(monkeypatch, model, counted("chunk", deltakv_chunk), counted("recurrent", recurrent))
    logits, states = generate(model, prompt, decode_tokens)

    # 3 GDN layers: one prefill call each, then one recurrent call per decode step.
    assert calls == {"chunk": 3, "recurrent": 12}
    assert logits.shape == ref_logits.shape == (2, 74, 97)
    err = rel_rms(logits, ref_logits)
    per_layer = [rel_rms(s, r) for s, r in zip(states, ref_states)]
    state_err = max(per_layer)
    agree = float((logits.argmax(-1) == ref_logits.argmax(-1)).double().mean())
    print(f"patched Qwen3-Next on {device} ({decode} decode): logits rel_rms {err:.2e}, "
          "recurrent states rel_rms " + ", ".join(f"{e:.2e}" for e in per_layer)
          + f", argmax agreement {agree:.4f}")
    logits_tolerance, state_tolerance = TOLERANCES[device.type]
    assert err < logits_tolerance and state_err < state_tolerance
    assert all(s.shape == (2, 4, 16, 24) and s.dtype == torch.float32 for s in states)
    assert all(s.device.type == logits.device.type == device.type for s in states)
    # f32 rounding on the CPU leaves every argmax; the bf16 products on the GPU may flip a
    # near tie.
    assert agree == 1.0 if device.type == "cpu" else agree >= 0.97
