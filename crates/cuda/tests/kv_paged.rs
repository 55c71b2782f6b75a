//! The paged compressed KV cache on the GPU against the CPU's: the encode writes the same pool
//! word for word (codes and norms bit for bit, same pages), attention equals the f64 oracle
//! over the decoded vectors and the CPU path within f32 rounding at every bits pair, odd and
//! per-sequence lengths (1, 63, 65, 1000), GQA ratios, the causal-chunk form, dense-rotation
//! head dims; a failed append changes nothing. On a machine without a CUDA device every test
//! prints one "skipped (no CUDA device)" line and passes.

use deltakv_contract::kv::book::PagedCache;
use deltakv_contract::kv::case::PagedCase;
use deltakv_contract::kv::paged::PagedView;
use deltakv_contract::kv::{KvScheme, NormDType, PagedLayout};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::{DType, HostTensor};
use deltakv_cpu::kv::{AttnOptions, PagedKvCache, attend_paged};
use deltakv_cuda::kv::{AttnKernel, CudaAttnOptions, CudaPagedKvCache, prepare_attend};
use deltakv_cuda::{Cuda, CudaTensor};
use std::io::Write;

fn device(test: &str) -> Option<&'static Cuda> {
    match Cuda::get() {
        Ok(cuda) => Some(cuda),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "{test}: skipped (no CUDA device): {e}");
            None
        }
    }
}

/// Both caches filled with the same appends: chunks of up to `chunk` tokens per sequence per
/// launch (the GPU appends every sequence in one launch, each its own count).
fn fill(
    cuda: &Cuda,
    case: &PagedCase,
    layout: PagedLayout,
    chunk: usize,
    dtype: DType,
) -> (CudaPagedKvCache, PagedKvCache) {
    fill_from(cuda, case, layout, chunk, dtype, false)
}

/// `fill`, the chunks read through views one element past a 16-byte boundary when `misaligned`
/// (an engine's tensors borrowed with `from_device_ptr` need only element alignment).
fn fill_from(
    cuda: &Cuda,
    case: &PagedCase,
    layout: PagedLayout,
    chunk: usize,
    dtype: DType,
    misaligned: bool,
) -> (CudaPagedKvCache, PagedKvCache) {
    let lens = case.lens();
    let (hkv, d) = (case.dims.hkv, case.dims.d);
    let max_pages = lens.iter().map(|&l| layout.pages_for(l)).max().unwrap() + 1;
    let pages: usize = lens.iter().map(|&l| layout.pages_for(l)).sum::<usize>() + 2;
    let mut gpu = CudaPagedKvCache::new(cuda, layout, lens.len(), max_pages, pages).unwrap();
    let mut cpu = PagedKvCache::new(layout, lens.len(), max_pages, pages).unwrap();
    for part in case.chunks(chunk) {
        for b in (0..lens.len()).filter(|&b| part.counts[b] > 0) {
            let (k, v) = case.chunk_rows(&part, b);
            cpu.append(b, k, v).unwrap();
        }
        let shape = vec![lens.len(), part.tokens, hkv, d];
        let skip = usize::from(misaligned);
        let up = |x: &[f32]| {
            let mut padded = vec![0.0f32; skip];
            padded.extend_from_slice(x);
            CudaTensor::upload(
                cuda,
                &HostTensor::from_f32_as(vec![padded.len()], &padded, dtype).unwrap(),
            )
            .unwrap()
        };
        let (k_all, v_all) = (up(&part.k), up(&part.v));
        let view = |t: &CudaTensor| {
            let address = t.device_ptr(cuda) + (skip * dtype.size_in_bytes()) as u64;
            // SAFETY: the view lies inside `t`'s allocation, which outlives it (both end with
            // this loop iteration, after the append has run on deltakv's stream).
            unsafe { CudaTensor::from_device_ptr(address, shape.clone(), dtype) }.unwrap()
        };
        gpu.append(cuda, &view(&k_all), &view(&v_all), &part.counts)
            .unwrap();
    }
    (gpu, cpu)
}

const LENS: &[usize] = &[1, 63, 65, 1000];

/// (lens, Tq, Hq, Hkv, d, page)
type Shape = (&'static [usize], usize, usize, usize, usize, usize);

#[test]
fn encode_writes_the_cpu_pool_word_for_word() {
    let Some(cuda) = device("encode_writes_the_cpu_pool_word_for_word") else {
        return;
    };
    let schemes = [
        // (d, bits_k, bits_v, f16 norms, page, input dtype, chunk)
        (128, 4, 2, false, 64, DType::BF16, 300),
        (128, 3, 8, true, 16, DType::F32, 1),
        (64, 2, 3, false, 32, DType::F16, 77),
        (256, 8, 4, true, 64, DType::BF16, 500),
        (96, 4, 2, false, 64, DType::F32, 129),
        (100, 3, 3, true, 16, DType::BF16, 1000),
        // Every eight-lane Hadamard kernel (d 64, 128, 256 x each input dtype) at least once
        // (d 64 and 128 at <= 4 bits under DELTAKV_KV_ENCODE=lanes8, and below).
        (128, 2, 4, false, 32, DType::F16, 63),
        (64, 4, 8, true, 16, DType::BF16, 65),
        (64, 8, 2, false, 64, DType::F32, 1000),
        (256, 2, 3, false, 16, DType::F32, 33),
        (256, 4, 4, true, 64, DType::F16, 1000),
        // Every one-lane kernel (d 64 and 128 at <= 4 bits, each input dtype) at least once;
        // at d 128 a 2-bit stream takes its own kernel (beside the other stream's, or both
        // streams in one launch at 2/2 bits).
        (128, 3, 2, false, 64, DType::F32, 65),
        (128, 2, 2, true, 64, DType::BF16, 129),
        (64, 4, 3, true, 32, DType::BF16, 1000),
        (64, 2, 4, false, 16, DType::F32, 63),
        // From inputs one element past a 16-byte boundary: the eight-lane kernels' grid path
        // at d 128 for each input dtype (aligned, these schemes take the one-lane kernels),
        // then 8-bit and dense schemes.
        (128, 4, 2, false, 64, DType::BF16, 300),
        (128, 4, 4, false, 32, DType::F16, 129),
        (128, 2, 3, false, 64, DType::F32, 65),
        (64, 3, 8, false, 64, DType::F32, 1000),
        (96, 2, 2, true, 32, DType::F16, 1),
    ];
    let misaligned_from = schemes.len() - 5;
    for (i, &(d, bk, bv, f16, page, dtype, chunk)) in schemes.iter().enumerate() {
        let lens: &[usize] = if chunk == 1 { &[1, 63, 65] } else { LENS };
        let mut case = PagedCase::new(lens, 1, 4, 2, d, 40 + i as u64);
        if dtype != DType::F16 && !f16 {
            // Vectors whose f32 sum of squares overflows or falls below 1e-30 (the kernels'
            // f64 path), and zero vectors (norm 0); f16 inputs and norms cannot hold them.
            for x in case.keys.iter_mut().chain(case.values.iter_mut()) {
                for (v, vector) in x.chunks_mut(d).enumerate() {
                    let scale = match v % 13 {
                        3 => 1e22,
                        7 => 1e-22,
                        11 => 0.0,
                        _ => 1.0,
                    };
                    vector.iter_mut().for_each(|e| *e *= scale);
                }
            }
        }
        let case = case.rounded(dtype).unwrap();
        let mut scheme = KvScheme::new(d, 2, bk, bv);
        scheme.seed = 3 + i as u64;
        if f16 {
            scheme.norm_dtype = NormDType::F16;
        }
        let layout = PagedLayout::new(scheme, page).unwrap();
        let misaligned = i >= misaligned_from;
        let (gpu, cpu) = fill_from(cuda, &case, layout, chunk, dtype, misaligned);
        assert_eq!(gpu.lens(), cpu.lens());
        assert_eq!(gpu.block_table(), cpu.block_table());
        let pool = gpu.download_pool(cuda).unwrap();
        let differ = pool.iter().zip(cpu.pool()).filter(|(a, b)| a != b).count();
        assert_eq!(pool.len(), cpu.pool().len());
        assert_eq!(
            differ,
            0,
            "scheme {i} (d {d}, {bk}/{bv} bits): {differ} of {} pool words differ from the CPU's",
            pool.len()
        );
        println!(
            "encode scheme {i}: d {d}, {bk}/{bv} bits, {dtype}{}: pool identical ({} words)",
            if misaligned { ", misaligned input" } else { "" },
            pool.len()
        );
    }
}

#[test]
fn attention_equals_the_oracle_and_the_cpu_path() {
    let Some(cuda) = device("attention_equals_the_oracle_and_the_cpu_path") else {
        return;
    };
    let shapes: [Shape; 8] = [
        // (lens, Tq, Hq, Hkv, d, page)
        (LENS, 1, 8, 2, 128, 64),
        (&[700], 1, 32, 8, 128, 16),
        (&[70, 17, 300], 3, 6, 2, 128, 32),
        (&[130, 64], 2, 4, 4, 64, 64),
        (&[90, 1], 1, 8, 1, 256, 64),
        (&[150, 33], 1, 6, 3, 96, 16),
        (&[65, 200], 4, 16, 2, 100, 128),
        // Long enough for hundreds of tiles per split.
        (&[6000, 2500], 1, 8, 2, 128, 64),
    ];
    let mut worst: f64 = 0.0;
    let mut worst_mma: f64 = 0.0;
    for (i, &(lens, tq, hq, hkv, d, page)) in shapes.iter().enumerate() {
        let pairs: Vec<(u32, u32)> = if i == 0 {
            [2, 3, 4, 8]
                .iter()
                .flat_map(|&k| [2, 3, 4, 8].map(|v| (k, v)))
                .collect()
        } else {
            vec![(4, 2), (3, 8)]
        };
        for (bits_k, bits_v) in pairs {
            let case = PagedCase::new(lens, tq, hq, hkv, d, 100 + i as u64);
            let mut scheme = KvScheme::new(d, hkv, bits_k, bits_v);
            scheme.seed = i as u64;
            if (i + bits_k as usize).is_multiple_of(2) {
                scheme.norm_dtype = NormDType::F16;
            }
            let layout = PagedLayout::new(scheme, page).unwrap();
            let (gpu, cpu) = fill(cuda, &case, layout, 333, DType::F32);
            let view = PagedView {
                layout: &layout,
                pool: cpu.pool(),
                table: cpu.block_table(),
                max_pages: cpu.max_pages(),
                lens: cpu.lens(),
            };
            let ideal = case
                .decoded_reference(&view, cpu.key_quantizer(), cpu.value_quantizer())
                .unwrap();
            let on_cpu =
                attend_paged(&cpu, &case.q, tq, hq, case.scale, &AttnOptions::default()).unwrap();
            let on_cpu: Vec<f64> = on_cpu.iter().map(|&x| f64::from(x)).collect();
            let q = HostTensor::from_f32(vec![lens.len(), tq, hq, d], case.q.clone()).unwrap();
            let q = CudaTensor::upload(cuda, &q).unwrap();
            // Auto, the scalar kernel, and both tensor-core forms where they apply (2-, 4-,
            // 8-bit codes; every shape here fits the pages form's ring).
            let mma = [2, 4, 8].contains(&bits_k) && [2, 4, 8].contains(&bits_v);
            let kernels: &[AttnKernel] = if mma {
                &[
                    AttnKernel::Auto,
                    AttnKernel::Scalar,
                    AttnKernel::Mma,
                    AttnKernel::MmaPages,
                ]
            } else {
                &[AttnKernel::Auto, AttnKernel::Scalar]
            };
            for (kernel, splits) in kernels
                .iter()
                .flat_map(|&k| [None, Some(1), Some(3)].map(|s| (k, s)))
            {
                let options = CudaAttnOptions {
                    splits,
                    max_tokens: None,
                    kernel,
                };
                let launch = prepare_attend(cuda, &gpu, &q, Some(case.scale), &options).unwrap();
                // SAFETY: the cache and q outlive the launch, the cache unchanged.
                unsafe { launch.launch(cuda) }.unwrap();
                let name = launch.kernel_name();
                let o = launch
                    .output()
                    .download(cuda)
                    .unwrap()
                    .to_f32_vec("o")
                    .unwrap();
                assert!(
                    o.iter().all(|x| x.is_finite()),
                    "shape {i} {name}: unwritten or non-finite o"
                );
                let err = rel_rms(&o, &ideal);
                worst = worst.max(err);
                if name.starts_with("kv_attend_mma") || name.starts_with("kv_attend_pages") {
                    worst_mma = worst_mma.max(err);
                }
                assert!(
                    err < 1e-5,
                    "shape {i} bits {bits_k}/{bits_v} splits {splits:?} {name}: vs decoded oracle {err:.3e}"
                );
                let err = rel_rms(&o, &on_cpu);
                assert!(
                    err < 1e-5,
                    "shape {i} bits {bits_k}/{bits_v} splits {splits:?} {name}: vs CPU {err:.3e}"
                );
            }
        }
    }
    println!(
        "cuda paged attention: worst rel_rms against the decoded oracle {worst:.2e} (tensor-core kernels {worst_mma:.2e})"
    );
}

#[test]
fn a_prepared_launch_follows_the_cache_as_it_grows() {
    let Some(cuda) = device("a_prepared_launch_follows_the_cache_as_it_grows") else {
        return;
    };
    let (hq, hkv, d) = (8, 2, 128);
    let case = PagedCase::new(&[200, 90], 1, hq, hkv, d, 9);
    let layout = PagedLayout::new(KvScheme::new(d, hkv, 4, 2), 32).unwrap();
    let mut gpu = CudaPagedKvCache::new(cuda, layout, 2, 8, 16).unwrap();
    let mut cpu = PagedKvCache::new(layout, 2, 8, 16).unwrap();
    let row = hkv * d;
    let q = HostTensor::from_f32(vec![2, 1, hq, d], case.q.clone()).unwrap();
    let q = CudaTensor::upload(cuda, &q).unwrap();
    let mut launch = None;
    for (from, to) in [(0usize, 40usize), (40, 41), (41, 90)] {
        let tn = to - from;
        let mut k = Vec::new();
        let mut v = Vec::new();
        for b in 0..2 {
            k.extend_from_slice(&case.keys[b][from * row..to * row]);
            v.extend_from_slice(&case.values[b][from * row..to * row]);
            cpu.append(
                b,
                &case.keys[b][from * row..to * row],
                &case.values[b][from * row..to * row],
            )
            .unwrap();
        }
        let up = |x: &[f32]| {
            CudaTensor::upload(
                cuda,
                &HostTensor::from_f32(vec![2, tn, hkv, d], x.to_vec()).unwrap(),
            )
            .unwrap()
        };
        gpu.append_unchecked(cuda, &up(&k), &up(&v), &[tn, tn])
            .unwrap();
        let launch = launch.get_or_insert_with(|| {
            let options = CudaAttnOptions {
                splits: None,
                max_tokens: Some(90),
                kernel: AttnKernel::Auto,
            };
            prepare_attend(cuda, &gpu, &q, None, &options).unwrap()
        });
        // SAFETY: the cache and q live through the loop; the cache grows only by its own
        // appends, which the launch follows.
        unsafe { launch.launch(cuda) }.unwrap();
        let o = launch
            .output()
            .download(cuda)
            .unwrap()
            .to_f32_vec("o")
            .unwrap();
        let want = attend_paged(
            &cpu,
            &case.q,
            1,
            hq,
            1.0 / (d as f32).sqrt(),
            &AttnOptions::default(),
        )
        .unwrap();
        let want: Vec<f64> = want.iter().map(|&x| f64::from(x)).collect();
        let err = rel_rms(&o, &want);
        assert!(err < 1e-5, "after {to} tokens: {err:.3e}");
    }
}

#[test]
fn a_failed_append_changes_nothing() {
    let Some(cuda) = device("a_failed_append_changes_nothing") else {
        return;
    };
    let (hkv, d) = (2, 64);
    let mut scheme = KvScheme::new(d, hkv, 4, 2);
    scheme.norm_dtype = NormDType::F16;
    let layout = PagedLayout::new(scheme, 16).unwrap();
    let mut gpu = CudaPagedKvCache::new(cuda, layout, 1, 4, 4).unwrap();
    let good = vec![0.25f32; 20 * hkv * d];
    let up = |x: &[f32], tn: usize| {
        CudaTensor::upload(
            cuda,
            &HostTensor::from_f32(vec![1, tn, hkv, d], x.to_vec()).unwrap(),
        )
        .unwrap()
    };
    gpu.append(cuda, &up(&good, 20), &up(&good, 20), &[20])
        .unwrap();
    let (table, pool) = (gpu.block_table().to_vec(), gpu.download_pool(cuda).unwrap());
    let mut nan = vec![0.25f32; 30 * hkv * d];
    nan[777] = f32::NAN;
    let half = vec![0.5f32; 30 * hkv * d];
    assert!(
        gpu.append(cuda, &up(&nan, 30), &up(&half, 30), &[30])
            .is_err()
    );
    let huge = vec![1e5f32; 30 * hkv * d];
    assert!(
        gpu.append(cuda, &up(&huge, 30), &up(&huge, 30), &[30])
            .is_err()
    );
    assert!(
        gpu.append(cuda, &up(&huge, 30), &up(&huge, 30), &[45])
            .is_err()
    ); // count > Tn
    assert_eq!(gpu.lens(), &[20]);
    assert_eq!(gpu.block_table(), table.as_slice());
    // The pages past the held tokens may hold the refused codes; the held ones are unchanged.
    let after = gpu.download_pool(cuda).unwrap();
    let page_words = layout.page_words();
    let first = table[0] as usize * page_words;
    assert_eq!(
        &after[first..first + page_words],
        &pool[first..first + page_words]
    );
    // The cache still works: the next append lands at token 20.
    gpu.append(cuda, &up(&good, 20), &up(&good, 20), &[20])
        .unwrap();
    assert_eq!(gpu.lens(), &[40]);
}
