//! GDN decode: T = 1..=16 new tokens for each of B sequences, reading and updating a pool of
//! recurrent states in place.
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
//! and `pool[s, h] <- S` after the last token. A bf16 pool is widened once per call, all T
//! tokens run in f32, and it is rounded once at the end, so its rounding does not grow with T.
//! Everything is validated before the pool is touched, so an error never leaves a partial
//! update.
//!
//! * [`validate`]: the shape rules (any device) and the value rules (host tensors).
//! * [`oracle`]: the f64 reference.
//! * [`random`]: seeded random problems.
//! * [`check`]: the suite of cases every backend runs against the oracle.

pub mod check;
pub mod oracle;
pub mod random;
pub mod through;
pub mod validate;

use super::GDN_OVERFLOW_CAUSE;
use super::prefill::GdnOptions;
use crate::error::{Error, Result};
use crate::tensor::{HostTensor, check_result_finite};

/// Most new tokens per row in one decode call (speculative decoding drafts are short; longer
/// inputs are a prefill).
pub const MAX_DECODE_TOKENS: usize = 16;

/// How the decay `g` and write strength `beta` are given. `T` is the tensor type of the
/// backend ([`HostTensor`] on the host).
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

    /// [`Gating::from_parts`] with each tensor looked up by its name (`g`, `beta`, `a`, `b`,
    /// `A_log`, `dt_bias`), as files and test cases carry them.
    pub fn from_lookup(get: impl Fn(&str) -> Option<&'a T>) -> Result<Self> {
        Self::from_parts(
            get("g"),
            get("beta"),
            get("a"),
            get("b"),
            get("A_log"),
            get("dt_bias"),
        )
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
/// type of the backend ([`HostTensor`] on the host).
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

/// The tensors of one decode call held by value, the pool apart (the inputs copied to a
/// device, say); [`DecodeTensors::inputs`] lends them as the call's [`DecodeInputs`].
#[derive(Debug)]
pub struct DecodeTensors<T> {
    q: T,
    k: T,
    v: T,
    gating: HeldGating<T>,
    slot_indices: T,
}

/// A [`Gating`]'s tensors held by value.
#[derive(Debug)]
enum HeldGating<T> {
    Direct { g: T, beta: T },
    Fused { a: T, b: T, a_log: T, dt_bias: T },
}

impl<T> DecodeTensors<T> {
    /// Each tensor of `inputs` passed through `copy` (an upload to a device, say): q, k, v,
    /// the gating's in the order of [`Gating::tensors`], then the slot indices.
    pub fn copied<S, E>(
        inputs: &DecodeInputs<'_, S>,
        mut copy: impl FnMut(&S) -> std::result::Result<T, E>,
    ) -> std::result::Result<Self, E> {
        let (q, k, v) = (copy(inputs.q)?, copy(inputs.k)?, copy(inputs.v)?);
        let gating = match inputs.gating {
            Gating::Direct { g, beta } => HeldGating::Direct {
                g: copy(g)?,
                beta: copy(beta)?,
            },
            Gating::Fused {
                a,
                b,
                a_log,
                dt_bias,
            } => HeldGating::Fused {
                a: copy(a)?,
                b: copy(b)?,
                a_log: copy(a_log)?,
                dt_bias: copy(dt_bias)?,
            },
        };
        Ok(Self {
            q,
            k,
            v,
            gating,
            slot_indices: copy(inputs.slot_indices)?,
        })
    }

    /// The call's inputs over the held tensors.
    pub fn inputs(&self) -> DecodeInputs<'_, T> {
        let gating = match &self.gating {
            HeldGating::Direct { g, beta } => Gating::Direct { g, beta },
            HeldGating::Fused {
                a,
                b,
                a_log,
                dt_bias,
            } => Gating::Fused {
                a,
                b,
                a_log,
                dt_bias,
            },
        };
        DecodeInputs {
            q: &self.q,
            k: &self.k,
            v: &self.v,
            gating,
            slot_indices: &self.slot_indices,
        }
    }
}

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

impl DecodeOutput {
    /// Err when `o` or the intermediate states hold a non-finite value although the inputs
    /// were finite (an intermediate overflowed f32), naming the tensor and the position. A
    /// serial scan; backends with threads scan their own way with the same error.
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

#[cfg(test)]
mod tests {
    use super::{DecodeInputs, DecodeTensors, Gating};

    /// Every tensor of `inputs` in the order the backends pass them to a kernel.
    fn in_order(inputs: &DecodeInputs<'_, i32>) -> Vec<i32> {
        let mut all = vec![*inputs.q, *inputs.k, *inputs.v];
        all.extend(inputs.gating.tensors().into_iter().copied());
        all.push(*inputs.slot_indices);
        all
    }

    #[test]
    fn copied_tensors_lend_the_same_call_for_either_gating() {
        let (q, k, v, slots) = (1, 2, 3, 9);
        let (g, beta, a, b, a_log, dt_bias) = (4, 5, 6, 7, 8, 10);
        let direct = DecodeInputs {
            q: &q,
            k: &k,
            v: &v,
            gating: Gating::Direct { g: &g, beta: &beta },
            slot_indices: &slots,
        };
        let fused = DecodeInputs {
            gating: Gating::Fused {
                a: &a,
                b: &b,
                a_log: &a_log,
                dt_bias: &dt_bias,
            },
            ..direct
        };
        for inputs in [direct, fused] {
            let mut seen = Vec::new();
            let held = DecodeTensors::copied(&inputs, |&x| {
                seen.push(x);
                Ok::<_, ()>(100 + x)
            })
            .unwrap();
            let lent = held.inputs();
            assert_eq!(seen, in_order(&inputs), "copies in the kernel's order");
            let expected: Vec<i32> = in_order(&inputs).iter().map(|x| 100 + x).collect();
            assert_eq!(in_order(&lent), expected);
            assert_eq!(
                matches!(lent.gating, Gating::Fused { .. }),
                matches!(inputs.gating, Gating::Fused { .. })
            );
        }
        let failed = DecodeTensors::copied(&direct, |&x| if x == 4 { Err(x) } else { Ok(x) });
        assert_eq!(failed.err(), Some(4), "the first failed copy is the error");
    }
}
