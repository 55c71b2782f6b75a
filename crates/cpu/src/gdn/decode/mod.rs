//! GDN decode on the CPU: T = 1..=16 new tokens for each of B sequences, reading and updating a
//! pool of recurrent states in place. The math, layouts and rules are the contract's
//! (`deltakv_contract::gdn::decode`).
//!
//! The kernel splits work over (row, value head, group of columns) with rayon, so even B = 1
//! keeps every core busy. A call reads each addressed slab and writes it back in place: one
//! read sweep for `S^T k` and `S^T q`, one update sweep of the rows still in cache, with up to
//! four tokens fused into each pair of sweeps on an f32 pool (`fused.rs`, AVX-512; `avx512.rs`
//! for one token). A bf16 pool is widened into an f32 block once per call, runs all T tokens
//! there and is rounded back once, so its rounding happens once per call whatever T is
//! (`pool.rs`). Everything is validated before the pool is touched, so an error never leaves a
//! partial update. `docs/gdn-decode.md` has the per-CPU details.

mod avx512;
#[cfg(target_arch = "x86_64")]
mod fused;
mod kernel;
mod pool;

use super::prefill::prepare::l2_normalize_row;
use crate::scan::check_result_finite;
use deltakv_contract::gdn::decode::validate::{DecodeValues, prepare_decode};
use deltakv_contract::gdn::{
    DecodeInputs, DecodeOptions, DecodeOutput, GDN_OVERFLOW_CAUSE, GdnDims, GdnOptions,
};
use deltakv_contract::tensor::{HostTensor, TensorMeta, first_non_finite, overflowed_result};
use deltakv_contract::view::{HostData, HostDataMut};
use deltakv_contract::{Error, Result};
use kernel::run_prepared;

/// The contract's validation of a decode call (nothing is written before it passes), then the
/// optional l2 norm of q and k, once per key head.
fn prepare<T: HostData>(
    inputs: &DecodeInputs<'_, T>,
    state_pool: &(impl TensorMeta + ?Sized),
    options: &GdnOptions,
) -> Result<DecodeValues> {
    let mut p = prepare_decode(inputs, state_pool, options)?;
    if options.use_qk_l2norm {
        let key_dim = p.dims.key_dim;
        for values in [&mut p.q, &mut p.k] {
            values.chunks_exact_mut(key_dim).for_each(l2_normalize_row);
        }
    }
    Ok(p)
}

/// Runs GDN decode on the CPU, updating the addressed slots of `state_pool` (`[S, H, K, V]`,
/// f32 or bf16) in place. On a validation error nothing has been written. When finite inputs
/// overflow f32 during the update (huge v or beta), the result is an error naming `o` or
/// `intermediate_states` and the position; the addressed slots then hold the overflowed
/// states, so the caller drops them.
///
/// ```
/// use deltakv_contract::gdn::decode::random::{DecodeCase, DecodeSpec};
/// use deltakv_contract::gdn::{DecodeInputs, DecodeOptions, GdnOptions, Gating};
/// use deltakv_cpu::gdn::gdn_decode;
///
/// // 8 sequences, 1 new token each, Qwen3-Next shape; a pool of 10 slots.
/// let case = DecodeCase::random(&DecodeSpec::new(8, 1, 16, 32, 128, 128), 1)?;
/// let mut pool = case.state_pool.clone(); // [S, H, K, V], owned by the engine
/// let inputs = DecodeInputs {
///     q: &case.q,
///     k: &case.k,
///     v: &case.v,
///     gating: Gating::Direct { g: case.gate("g").unwrap(), beta: case.gate("beta").unwrap() },
///     slot_indices: &case.slot_indices,
/// };
/// let options = DecodeOptions {
///     gdn: GdnOptions { scale: None, use_qk_l2norm: false },
///     intermediate_states: false,
/// };
/// let out = gdn_decode(&inputs, &mut pool, &options)?; // the pool is updated in place
/// assert_eq!(out.o.shape(), &[8, 1, 32, 128]);
/// # Ok::<(), deltakv_contract::Error>(())
/// ```
///
/// The inputs and the pool are read where they are: owned [`HostTensor`]s, or views over a
/// caller's memory ([`deltakv_contract::view::HostView`] for the inputs,
/// [`deltakv_contract::view::HostViewMut`] for a pool updated in place).
pub fn gdn_decode<T: HostData>(
    inputs: &DecodeInputs<'_, T>,
    state_pool: &mut (impl HostDataMut + ?Sized),
    options: &DecodeOptions,
) -> Result<DecodeOutput> {
    let p = prepare(inputs, state_pool, &options.gdn)?;
    let d = p.dims;
    let rows = d.batch * d.tokens;
    // Poisoned so that any element a kernel forgets to write shows up as NaN.
    let mut o = vec![f32::NAN; rows * d.value_heads * d.value_dim];
    let mut states = if options.intermediate_states {
        vec![f32::NAN; rows * d.value_heads * d.key_dim * d.value_dim]
    } else {
        Vec::new()
    };
    run_prepared(&p, state_pool, &mut o, &mut states);
    let o = HostTensor::from_f32_as(
        vec![d.batch, d.tokens, d.value_heads, d.value_dim],
        &o,
        p.out_dtype,
    )?;
    let intermediate_states = if options.intermediate_states {
        Some(HostTensor::from_f32(
            vec![d.batch, d.tokens, d.value_heads, d.key_dim, d.value_dim],
            states,
        )?)
    } else {
        None
    };
    // Finite inputs can still overflow (huge v and beta); a NaN-filled result is refused.
    check_result_finite("o", &o, "b, t, h, v", GDN_OVERFLOW_CAUSE)?;
    if let Some(states) = &intermediate_states {
        check_result_finite(
            "intermediate_states",
            states,
            "b, t, h, k, v",
            GDN_OVERFLOW_CAUSE,
        )?;
    }
    Ok(DecodeOutput {
        o,
        intermediate_states,
    })
}

/// [`gdn_decode`] writing into caller-owned f32 buffers, for a serving loop that reuses them
/// every step (no allocation proportional to B * T, and no page faults on a fresh
/// intermediate-states buffer): `o` is `[B, T, H, V]` and, when given, `intermediate_states` is
/// `[B, T, H, K, V]` (then `options.intermediate_states` is ignored). Every element is written
/// (zeros for skipped rows). Returns the call's sizes. On a validation error nothing has been
/// written; an `o` that overflowed f32 is an error after the update, as in [`gdn_decode`].
pub fn gdn_decode_into<T: HostData>(
    inputs: &DecodeInputs<'_, T>,
    state_pool: &mut (impl HostDataMut + ?Sized),
    options: &GdnOptions,
    o: &mut [f32],
    intermediate_states: Option<&mut [f32]>,
) -> Result<GdnDims> {
    let p = prepare(inputs, state_pool, options)?;
    let d = p.dims;
    let rows = d.batch * d.tokens;
    let check = |name: &str, len: usize, expected: usize, layout: &str| {
        if len == expected {
            Ok(())
        } else {
            Err(Error::InvalidValue(format!(
                "output buffer `{name}` holds {len} values, expected {expected} ({layout} = {:?})",
                [d.batch, d.tokens, d.value_heads, d.key_dim, d.value_dim]
            )))
        }
    };
    check(
        "o",
        o.len(),
        rows * d.value_heads * d.value_dim,
        "B*T*H*V, [B, T, H, K, V]",
    )?;
    let states = match intermediate_states {
        Some(states) => {
            let expected = rows * d.value_heads * d.key_dim * d.value_dim;
            check(
                "intermediate_states",
                states.len(),
                expected,
                "B*T*H*K*V, [B, T, H, K, V]",
            )?;
            states
        }
        None => &mut [],
    };
    run_prepared(&p, state_pool, o, states);
    if let Some(i) = first_non_finite(o) {
        let shape = [d.batch, d.tokens, d.value_heads, d.value_dim];
        let cause = GDN_OVERFLOW_CAUSE;
        return Err(overflowed_result("o", &shape, "b, t, h, v", i, o[i], cause));
    }
    Ok(d)
}
