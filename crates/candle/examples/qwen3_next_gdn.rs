//! One Qwen3-Next Gated DeltaNet layer in candle, on deltakv: a prompt through the layer
//! (deltakv's chunked prefill), then a few tokens decoded one at a time (deltakv's decode,
//! updating the state pool in place), compared with the same layer on a plain-candle
//! recurrence, on the CPU or (built with `--features candle-cuda`) on candle's CUDA device 0.
//!
//!     cargo run --release -p deltakv-candle --example qwen3_next_gdn [-- TOKENS [cpu|cuda]]

use candle_core::{Device, Tensor};
use deltakv_candle::qwen3_next::{GatedDeltaNetLayer, GdnCore, GdnLayerConfig, LayerCache};
use std::time::Instant;

fn main() -> candle_core::Result<()> {
    let tokens: usize = match std::env::args().nth(1) {
        Some(arg) => arg
            .parse()
            .map_err(|e| candle_core::Error::Msg(format!("TOKENS `{arg}`: {e}")))?,
        None => 200,
    };
    let dev = match std::env::args().nth(2).as_deref() {
        None | Some("cpu") => Device::Cpu,
        Some("cuda") => Device::new_cuda(0)?,
        Some(other) => {
            return Err(candle_core::Error::Msg(format!(
                "device `{other}`: expected cpu or cuda"
            )));
        }
    };
    // Qwen3-Next's head layout (16 key heads, 32 value heads, 128 x 128), a narrow hidden size.
    let config = GdnLayerConfig {
        hidden: 256,
        ..GdnLayerConfig::qwen3_next_80b()
    };
    let layer = GatedDeltaNetLayer::random(config, 1)?.to_device(&dev)?;
    let decode_steps = 4;
    let x = Tensor::randn(
        0f32,
        1.0,
        (1, tokens + decode_steps, config.hidden),
        &Device::Cpu,
    )?
    .to_device(&dev)?;
    // On a GPU the first round compiles and loads the kernels; only the last is printed.
    let rounds = if dev.is_cpu() { 1 } else { 2 };
    let mut outputs = Vec::new();
    for core in [GdnCore::Deltakv, GdnCore::Reference] {
        for round in 0..rounds {
            let mut cache = LayerCache::new_on(&config, &[0], 4, &dev)?;
            let start = Instant::now();
            let mut ys = vec![layer.forward(&x.narrow(1, 0, tokens)?, &mut cache, core)?];
            for t in tokens..tokens + decode_steps {
                ys.push(layer.forward(&x.narrow(1, t, 1)?, &mut cache, core)?);
            }
            dev.synchronize()?;
            if round + 1 == rounds {
                println!(
                    "{core:?} on {dev:?}: {tokens}-token prompt + {decode_steps} decode steps in {:.1} ms",
                    start.elapsed().as_secs_f64() * 1e3
                );
                outputs.push(Tensor::cat(&ys, 1)?);
            }
        }
    }
    let diff = (&outputs[0] - &outputs[1])?
        .sqr()?
        .sum_all()?
        .to_scalar::<f32>()?;
    let norm = outputs[1].sqr()?.sum_all()?.to_scalar::<f32>()?;
    println!(
        "layer output {:?}, deltakv vs candle reference rel_rms {:.2e}",
        outputs[0].dims(),
        (diff / norm).sqrt()
    );
    Ok(())
}
