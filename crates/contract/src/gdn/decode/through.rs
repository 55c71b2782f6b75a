//! A decode call with a device in it, as the command line and one-off callers make it, written
//! once for every backend: the contract's value checks of inputs that live on a device (read
//! through a host copy), and a decode of host tensors through a device (the inputs and the pool
//! copied there, the results and the pool copied back). Each backend passes how it moves its
//! tensors and how it runs a checked call.

use super::validate::{DecodeShapes, check_decode_shapes, prepare_decode_values};
use super::{DecodeInputs, DecodeOptions, DecodeOutput, DecodeTensors};
use crate::error::Result;
use crate::gdn::prefill::GdnOptions;
use crate::tensor::{HostTensor, TensorMeta};

/// The contract's full check of a decode call whose tensors live on a device: the shapes, then
/// the values (finite activations and gates, slot indices in range) of the inputs as `download`
/// copies them to the host. For callers where a wait per call does not matter.
pub fn check_device_decode<T: TensorMeta>(
    inputs: &DecodeInputs<'_, T>,
    state_pool: &(impl TensorMeta + ?Sized),
    options: &GdnOptions,
    download: impl FnMut(&T) -> Result<HostTensor>,
) -> Result<DecodeShapes> {
    let shapes = check_decode_shapes(inputs, state_pool)?;
    let on_host = DecodeTensors::copied(inputs, download)?;
    prepare_decode_values(&on_host.inputs(), shapes, state_pool.dtype(), options)?;
    Ok(shapes)
}

/// A decode of host tensors through a device: the contract's full check on the host, every
/// input and the pool passed through `upload`, `run` (the backend's decode of a checked call,
/// updating the uploaded pool, returning `o` and the intermediate states when asked), then the
/// results and the updated pool passed back through `download`. As on the CPU, a result that
/// overflowed f32 is an error, and the addressed slots then hold the overflowed states.
pub fn decode_through_device<T>(
    inputs: &DecodeInputs<'_, HostTensor>,
    state_pool: &mut HostTensor,
    options: &DecodeOptions,
    upload: impl Fn(&HostTensor) -> Result<T>,
    download: impl Fn(&T) -> Result<HostTensor>,
    run: impl FnOnce(&DecodeInputs<'_, T>, &mut T, DecodeShapes) -> Result<(T, Option<T>)>,
) -> Result<DecodeOutput> {
    let shapes = check_decode_shapes(inputs, state_pool)?;
    prepare_decode_values(inputs, shapes, state_pool.dtype(), &options.gdn)?;
    let uploaded = DecodeTensors::copied(inputs, &upload)?;
    let mut pool = upload(state_pool)?;
    let (o, intermediate_states) = run(&uploaded.inputs(), &mut pool, shapes)?;
    let output = DecodeOutput {
        o: download(&o)?,
        intermediate_states: intermediate_states.as_ref().map(&download).transpose()?,
    };
    *state_pool = download(&pool)?;
    output.check_finite()?;
    Ok(output)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gdn::decode::oracle::gdn_decode_reference;
    use crate::gdn::decode::random::{DecodeCase, DecodeSpec};
    use crate::tensor::DType;

    /// A "device" that is the host: copies count, the decode is the f64 oracle rounded to f32.
    fn oracle_run(
        inputs: &DecodeInputs<'_, HostTensor>,
        pool: &mut HostTensor,
        poison_o: bool,
    ) -> Result<(HostTensor, Option<HostTensor>)> {
        let r = gdn_decode_reference(inputs, pool, &GdnOptions::default())?;
        let f32s = |x: &[f64]| x.iter().map(|&v| v as f32).collect::<Vec<_>>();
        *pool = HostTensor::from_f32(pool.shape().to_vec(), f32s(&r.state_pool))?;
        let mut o = f32s(&r.o);
        if poison_o {
            let middle = o.len() / 2;
            o[middle] = f32::INFINITY;
        }
        let shape = inputs.v.shape().to_vec();
        Ok((HostTensor::from_f32(shape, o)?, None))
    }

    #[test]
    fn a_host_call_goes_through_the_device_and_back() {
        let case = DecodeCase::random(&DecodeSpec::new(2, 1, 1, 2, 8, 8), 3).unwrap();
        let inputs = case.inputs().unwrap();
        let expected =
            gdn_decode_reference(&inputs, &case.state_pool, &GdnOptions::default()).unwrap();
        let copies = std::cell::Cell::new(0);
        let upload = |t: &HostTensor| {
            copies.set(copies.get() + 1);
            Ok(t.clone())
        };
        let mut pool = case.state_pool.clone();
        let out = decode_through_device(
            &inputs,
            &mut pool,
            &DecodeOptions::default(),
            upload,
            |t| Ok(t.clone()),
            |uploaded, pool, shapes| {
                assert_eq!(shapes.slots, 4);
                oracle_run(uploaded, pool, false)
            },
        )
        .unwrap();
        // q, k, v, g, beta, the slot indices and the pool.
        assert_eq!(copies.get(), 7);
        let back: Vec<f64> = pool.to_f64_vec("pool").unwrap();
        let near = |a: &[f64], b: &[f64]| {
            a.iter()
                .zip(b)
                .all(|(x, y)| (x - y).abs() <= 1e-6 * (1.0 + y.abs()))
        };
        assert!(
            near(&back, &expected.state_pool),
            "the updated pool comes back"
        );
        assert!(near(&out.o.to_f64_vec("o").unwrap(), &expected.o));
        assert_eq!(out.o.dtype(), DType::F32);
    }

    #[test]
    fn an_overflowed_result_is_an_error_and_bad_inputs_never_reach_the_device() {
        let case = DecodeCase::random(&DecodeSpec::new(2, 1, 1, 2, 8, 8), 4).unwrap();
        let inputs = case.inputs().unwrap();
        let mut pool = case.state_pool.clone();
        let err = decode_through_device(
            &inputs,
            &mut pool,
            &DecodeOptions::default(),
            |t| Ok(t.clone()),
            |t| Ok(t.clone()),
            |uploaded, pool, _| oracle_run(uploaded, pool, true),
        )
        .unwrap_err();
        assert!(err.to_string().contains("overflow"), "{err}");
        // A NaN in q: refused by the host check before any upload or run.
        let mut q = case.q.to_f32_vec("q").unwrap();
        q[0] = f32::NAN;
        let q = HostTensor::from_f32_as(case.q.shape().to_vec(), &q, case.q.dtype()).unwrap();
        let bad = DecodeInputs { q: &q, ..inputs };
        let err = decode_through_device(
            &bad,
            &mut pool,
            &DecodeOptions::default(),
            |_: &HostTensor| -> Result<HostTensor> { panic!("uploaded a refused call") },
            |t| Ok(t.clone()),
            |_, _, _| panic!("ran a refused call"),
        )
        .unwrap_err();
        assert!(err.to_string().contains('q'), "{err}");
        // The device-side check reads the same values through its download.
        let err = check_device_decode(&bad, &case.state_pool, &GdnOptions::default(), |t| {
            Ok(t.clone())
        });
        assert!(err.is_err());
    }
}
