//! GDN decode on the CPU: T = 1..=16 new tokens for each of B sequences, reading and updating a
//! pool of recurrent states in place.
//!
//! Layouts: q, k `[B, T, Hg, K]`; v `[B, T, H, V]`; g, beta `[B, T, H]` (or fused gating from
//! raw `a`, `b` `[B, T, H]` and per-head `A_log`, `dt_bias` `[H]`, see [`super::gating`]);
//! `state_pool [S, H, K, V]` in f32 or bf16; `slot_indices [B]` i32 or i64. Row `b` reads and
//! writes slot `slot_indices[b]`; a negative index skips the row (its outputs are zeros and no
//! slot is read or written). Two rows may not address the same slot.
//!
//! For each row `b` with slot `s`, value head `h` (key head `h / (H / Hg)`), and token
//! `t = 0..T` in order, with `S = pool[s, h]` (K x V, computed in f32):
//!
//! ```text
//! (optional) q_t <- q_t / sqrt(|q_t|^2 + 1e-6), k_t likewise        (use_qk_l2norm)
//! S   <- exp(g_t) * S
//! v'  <- beta_t * (v_t - S^T k_t)
//! S   <- S + k_t v'^T
//! o_t <- scale * S^T q_t                                            (scale = K^-0.5 by default)
//! intermediate_states[b, t, h] <- S                                 (optional, f32)
//! ```
//!
//! and `pool[s, h] <- S` after the last token.
//!
//! The kernel splits work over (row, value head, group of columns) with rayon, so even B = 1
//! keeps every core busy. A call reads each addressed slab and writes it back in place: one
//! read sweep for `S^T k` and `S^T q`, one update sweep of the rows still in cache, with up to
//! four tokens fused into each pair of sweeps on an f32 pool. A bf16 pool is widened into an f32
//! block once per call, runs all T tokens there and is rounded back once, so its rounding
//! happens once per call whatever T is.
//! Everything is validated before the pool is touched, so an error never leaves a partial
//! update. `docs/gdn-decode.md` has the per-CPU details.

use super::decode_kernel::run_prepared;
use super::decode_validate::prepare_decode;
use super::prefill::GdnOptions;
use super::validate::{GDN_OVERFLOW_CAUSE, GdnDims, check_result_finite, unravel};
use crate::error::{Error, Result};
use crate::tensor::{HostTensor, first_non_finite};

/// How the decay `g` and write strength `beta` are given. `T` is the tensor type of the
/// backend ([`HostTensor`] on the CPU).
#[derive(Debug)]
pub enum Gating<'a, T = HostTensor> {
    /// `g` and `beta`, both `[B, T, H]`.
    Direct { g: &'a T, beta: &'a T },
    /// Raw `a`, `b` `[B, T, H]` and per-head `A_log`, `dt_bias` `[H]`:
    /// `g = -exp(A_log) * softplus(a + dt_bias)`, `beta = sigmoid(b)`, in f32.
    Fused {
        a: &'a T,
        b: &'a T,
        a_log: &'a T,
        dt_bias: &'a T,
    },
}

impl<T> Clone for Gating<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Gating<'_, T> {}

impl<'a, T> Gating<'a, T> {
    /// The gating's tensors in order: `g, beta`, or `a, b, A_log, dt_bias`.
    pub fn tensors(&self) -> Vec<&'a T> {
        match *self {
            Gating::Direct { g, beta } => vec![g, beta],
            Gating::Fused {
                a,
                b,
                a_log,
                dt_bias,
            } => vec![a, b, a_log, dt_bias],
        }
    }

    /// A gating of the same kind over `tensors`, given in the order of [`Gating::tensors`]
    /// (the same tensors on another device, say).
    pub fn with_tensors<'b, U>(&self, tensors: &'b [U]) -> Result<Gating<'b, U>> {
        match (self, tensors) {
            (Gating::Direct { .. }, [g, beta]) => Ok(Gating::Direct { g, beta }),
            (Gating::Fused { .. }, [a, b, a_log, dt_bias]) => Ok(Gating::Fused {
                a,
                b,
                a_log,
                dt_bias,
            }),
            _ => Err(Error::InvalidValue(format!(
                "gating needs {} tensors, got {}",
                self.tensors().len(),
                tensors.len()
            ))),
        }
    }

    /// Picks the gating from optional tensors as found in a file: either both of `g`, `beta`
    /// or all four of `a`, `b`, `A_log`, `dt_bias`, and nothing of the other kind.
    pub fn from_parts(
        g: Option<&'a T>,
        beta: Option<&'a T>,
        a: Option<&'a T>,
        b: Option<&'a T>,
        a_log: Option<&'a T>,
        dt_bias: Option<&'a T>,
    ) -> Result<Self> {
        let direct = [("g", g.is_some()), ("beta", beta.is_some())];
        let fused = [
            ("a", a.is_some()),
            ("b", b.is_some()),
            ("A_log", a_log.is_some()),
            ("dt_bias", dt_bias.is_some()),
        ];
        let names = |set: &[(&str, bool)], present: bool| -> Vec<String> {
            set.iter()
                .filter(|(_, p)| *p == present)
                .map(|(n, _)| format!("`{n}`"))
                .collect()
        };
        let any_direct = direct.iter().any(|(_, p)| *p);
        let any_fused = fused.iter().any(|(_, p)| *p);
        if any_direct && any_fused {
            return Err(Error::InvalidValue(format!(
                "give either g and beta or fused gating (a, b, A_log, dt_bias), not both: found {} and {}",
                names(&direct, true).join(", "),
                names(&fused, true).join(", ")
            )));
        }
        match (g, beta, a, b, a_log, dt_bias) {
            (Some(g), Some(beta), None, None, None, None) => Ok(Gating::Direct { g, beta }),
            (None, None, Some(a), Some(b), Some(a_log), Some(dt_bias)) => Ok(Gating::Fused {
                a,
                b,
                a_log,
                dt_bias,
            }),
            _ if any_fused => Err(Error::InvalidValue(format!(
                "fused gating needs a, b, A_log and dt_bias, but {} missing",
                names(&fused, false).join(", ")
            ))),
            _ if any_direct => Err(Error::InvalidValue(format!(
                "gating needs both g and beta, but {} missing",
                names(&direct, false).join(", ")
            ))),
            _ => Err(Error::MissingTensor(
                "g and beta (or fused gating: a, b, A_log, dt_bias)".to_string(),
            )),
        }
    }
}

/// The tensors of one decode call (the pool is passed separately, mutably). `T` is the tensor
/// type of the backend ([`HostTensor`] on the CPU).
#[derive(Debug)]
pub struct DecodeInputs<'a, T = HostTensor> {
    pub q: &'a T,
    pub k: &'a T,
    pub v: &'a T,
    pub gating: Gating<'a, T>,
    /// `[B]` i32 or i64; negative = skip the row.
    pub slot_indices: &'a T,
}

impl<T> Clone for DecodeInputs<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for DecodeInputs<'_, T> {}

/// Options of one decode call.
#[derive(Clone, Debug, Default)]
pub struct DecodeOptions {
    /// Scale and l2 norm, as for prefill.
    pub gdn: GdnOptions,
    /// Also return the state after every token, `[B, T, H, K, V]` f32.
    pub intermediate_states: bool,
}

/// Decode results (the pool itself is updated in place).
#[derive(Clone, Debug)]
pub struct DecodeOutput {
    /// `[B, T, H, V]` in v's dtype; zeros for skipped rows.
    pub o: HostTensor,
    /// `[B, T, H, K, V]` f32 when asked; zeros for skipped rows.
    pub intermediate_states: Option<HostTensor>,
}

/// Runs GDN decode on the CPU, updating the addressed slots of `state_pool` (`[S, H, K, V]`,
/// f32 or bf16) in place. On a validation error nothing has been written. When finite inputs
/// overflow f32 during the update (huge v or beta), the result is an error naming `o` or
/// `intermediate_states` and the position; the addressed slots then hold the overflowed
/// states, so the caller drops them.
///
/// ```
/// use deltakv_core::gdn::decode_random::{DecodeCase, DecodeSpec};
/// use deltakv_core::gdn::{DecodeInputs, DecodeOptions, GdnOptions, Gating, gdn_decode};
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
/// # Ok::<(), deltakv_core::Error>(())
/// ```
pub fn gdn_decode(
    inputs: &DecodeInputs<'_>,
    state_pool: &mut HostTensor,
    options: &DecodeOptions,
) -> Result<DecodeOutput> {
    let p = prepare_decode(inputs, state_pool, &options.gdn)?;
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
    let output = DecodeOutput {
        o,
        intermediate_states,
    };
    output.check_finite()?;
    Ok(output)
}

impl DecodeOutput {
    /// Err when `o` or the intermediate states hold a non-finite value although the inputs
    /// were finite (an intermediate overflowed f32), naming the tensor and the position.
    pub fn check_finite(&self) -> Result<()> {
        check_result_finite("o", &self.o, "b, t, h, v", GDN_OVERFLOW_CAUSE)?;
        if let Some(states) = &self.intermediate_states {
            check_result_finite(
                "intermediate_states",
                states,
                "b, t, h, k, v",
                GDN_OVERFLOW_CAUSE,
            )?;
        }
        Ok(())
    }
}

/// [`gdn_decode`] writing into caller-owned f32 buffers, for a serving loop that reuses them
/// every step (no allocation proportional to B * T, and no page faults on a fresh
/// intermediate-states buffer): `o` is `[B, T, H, V]` and, when given, `intermediate_states` is
/// `[B, T, H, K, V]` (then `options.intermediate_states` is ignored). Every element is written
/// (zeros for skipped rows). Returns the call's sizes. On a validation error nothing has been
/// written; an `o` that overflowed f32 is an error after the update, as in [`gdn_decode`].
pub fn gdn_decode_into(
    inputs: &DecodeInputs<'_>,
    state_pool: &mut HostTensor,
    options: &GdnOptions,
    o: &mut [f32],
    intermediate_states: Option<&mut [f32]>,
) -> Result<GdnDims> {
    let p = prepare_decode(inputs, state_pool, options)?;
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
        return Err(Error::InvalidValue(format!(
            "the result `o` holds a non-finite value ({}) at [b, t, h, v] = {:?} although every input was finite: an intermediate overflowed f32 ({GDN_OVERFLOW_CAUSE})",
            o[i],
            unravel(i, &shape)
        )));
    }
    Ok(d)
}
