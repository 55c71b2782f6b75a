//! The paged compressed KV cache on wgpu against the CPU's: the encode writes the same pool
//! word for word (codes and norms bit for bit, same pages), attention equals the f64 oracle
//! over the decoded vectors and the CPU path within f32 rounding at every bits pair, odd and
//! per-sequence lengths (1, 63, 65, 1000), page boundaries, GQA ratios, the causal-chunk form,
//! dense-rotation head dims; a failed append changes nothing. On a machine without an adapter
//! every test prints one "skipped (no wgpu adapter)" line and passes, except in CI.

mod common;

use deltakv_contract::kv::book::PagedCache;
use deltakv_contract::kv::case::PagedCase;
use deltakv_contract::kv::paged::PagedView;
use deltakv_contract::kv::{KvScheme, NormDType, PagedLayout};
use deltakv_contract::metrics::rel_rms;
use deltakv_contract::{DType, HostTensor};
use deltakv_cpu::kv::{AttnOptions, PagedKvCache, attend_paged};
use deltakv_wgpu::kv::{WgpuAttnOptions, WgpuPagedKvCache, prepare_attend};
use deltakv_wgpu::{Wgpu, WgpuTensor};

/// Both caches filled with the same appends: chunks of up to `chunk` tokens per sequence per
/// dispatch (the device appends every sequence in one dispatch, each its own count).
fn fill(
    wgpu: &Wgpu,
    case: &PagedCase,
    layout: PagedLayout,
    chunk: usize,
    dtype: DType,
) -> (WgpuPagedKvCache, PagedKvCache) {
    let lens = case.lens();
    let (hkv, d) = (case.dims.hkv, case.dims.d);
    let max_pages = lens.iter().map(|&l| layout.pages_for(l)).max().unwrap() + 1;
    let pages: usize = lens.iter().map(|&l| layout.pages_for(l)).sum::<usize>() + 2;
    let mut gpu = WgpuPagedKvCache::new(wgpu, layout, lens.len(), max_pages, pages).unwrap();
    let mut cpu = PagedKvCache::new(layout, lens.len(), max_pages, pages).unwrap();
    for part in case.chunks(chunk) {
        for b in (0..lens.len()).filter(|&b| part.counts[b] > 0) {
            let (k, v) = case.chunk_rows(&part, b);
            cpu.append(b, k, v).unwrap();
        }
        let shape = vec![lens.len(), part.tokens, hkv, d];
        let up = |x: &[f32]| {
            WgpuTensor::upload(
                wgpu,
                &HostTensor::from_f32_as(shape.clone(), x, dtype).unwrap(),
            )
            .unwrap()
        };
        gpu.append(wgpu, &up(&part.k), &up(&part.v), &part.counts)
            .unwrap();
    }
    (gpu, cpu)
}

const LENS: &[usize] = &[1, 63, 65, 1000];

/// (lens, Tq, Hq, Hkv, d, page)
type Shape = (&'static [usize], usize, usize, usize, usize, usize);

#[test]
fn encode_writes_the_cpu_pool_word_for_word() {
    let Some(wgpu) = common::device("encode_writes_the_cpu_pool_word_for_word") else {
        return;
    };
    println!("device: {}", wgpu.describe());
    let schemes = [
        // (d, bits_k, bits_v, f16 norms, page, input dtype, chunk)
        (128, 4, 2, false, 64, DType::BF16, 300),
        (128, 3, 8, true, 16, DType::F32, 1),
        (64, 2, 3, false, 32, DType::F16, 77),
        (256, 8, 4, true, 64, DType::BF16, 500),
        (96, 4, 2, false, 64, DType::F32, 129),
        (100, 3, 3, true, 16, DType::BF16, 1000),
    ];
    for (i, &(d, bk, bv, f16, page, dtype, chunk)) in schemes.iter().enumerate() {
        let lens: &[usize] = if chunk == 1 { &[1, 63, 65] } else { LENS };
        let case = PagedCase::new(lens, 1, 4, 2, d, 40 + i as u64)
            .rounded(dtype)
            .unwrap();
        let mut scheme = KvScheme::new(d, 2, bk, bv);
        scheme.seed = 3 + i as u64;
        if f16 {
            scheme.norm_dtype = NormDType::F16;
        }
        let layout = PagedLayout::new(scheme, page).unwrap();
        let (gpu, cpu) = fill(wgpu, &case, layout, chunk, dtype);
        assert_eq!(gpu.lens(), cpu.lens());
        assert_eq!(gpu.block_table(), cpu.block_table());
        let pool = gpu.download_pool(wgpu).unwrap();
        assert_eq!(pool.len(), cpu.pool().len());
        let differ: Vec<usize> = (0..pool.len())
            .filter(|&w| pool[w] != cpu.pool()[w])
            .collect();
        if let Some(&w) = differ.first() {
            let page_words = layout.page_words();
            let at = w % page_words;
            panic!(
                "scheme {i} (d {d}, {bk}/{bv} bits): {} of {} pool words differ from the CPU's; first: page {} word {at} (head {}, offset {}): {:#010x} vs {:#010x}",
                differ.len(),
                pool.len(),
                w / page_words,
                at / layout.head_words(),
                at % layout.head_words(),
                pool[w],
                cpu.pool()[w]
            );
        }
        println!(
            "encode scheme {i}: d {d}, {bk}/{bv} bits, {dtype}: pool identical ({} words)",
            pool.len()
        );
    }
}

#[test]
fn attention_equals_the_oracle_and_the_cpu_path() {
    let Some(wgpu) = common::device("attention_equals_the_oracle_and_the_cpu_path") else {
        return;
    };
    // The lanes forms sum their dots by subgroup shuffles here when this says subgroups (of at
    // least d / 16), else through workgroup memory; lanes-noshuffle always takes the latter.
    println!("device: {}", wgpu.describe());
    let shapes: [Shape; 8] = [
        // (lens, Tq, Hq, Hkv, d, page)
        (LENS, 1, 8, 2, 128, 64),
        (&[700], 1, 32, 8, 128, 16),
        (&[70, 17, 300], 3, 6, 2, 128, 32),
        (&[130, 64], 2, 4, 4, 64, 64),
        (&[90, 1], 1, 8, 1, 256, 64),
        (&[150, 33], 1, 6, 3, 96, 16),
        (&[65, 200], 4, 16, 2, 100, 128),
        // Long enough for many tiles per split.
        (&[6000, 2500], 1, 8, 2, 128, 64),
    ];
    let mut worst: f64 = 0.0;
    for (i, &(lens, tq, hq, hkv, d, page)) in shapes.iter().enumerate() {
        let started = std::time::Instant::now();
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
            let (gpu, cpu) = fill(wgpu, &case, layout, 333, DType::F32);
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
            let q = WgpuTensor::upload(wgpu, &q).unwrap();
            // The automatic splits, then 1 and 3.
            for splits in [None, Some(1), Some(3)] {
                let options = WgpuAttnOptions {
                    splits,
                    max_tokens: None,
                };
                let launch = prepare_attend(wgpu, &gpu, &q, Some(case.scale), &options).unwrap();
                launch.submit(wgpu, 1).unwrap();
                let o = launch
                    .output()
                    .download(wgpu)
                    .unwrap()
                    .to_f32_vec("o")
                    .unwrap();
                assert!(
                    o.iter().all(|x| x.is_finite()),
                    "shape {i} splits {splits:?}: unwritten or non-finite o"
                );
                let err = rel_rms(&o, &ideal);
                worst = worst.max(err);
                assert!(
                    err < 1e-5,
                    "shape {i} bits {bits_k}/{bits_v} splits {splits:?}: vs decoded oracle {err:.3e}"
                );
                let err = rel_rms(&o, &on_cpu);
                assert!(
                    err < 1e-5,
                    "shape {i} bits {bits_k}/{bits_v} splits {splits:?}: vs CPU {err:.3e}"
                );
            }
        }
        println!(
            "attention shape {i} ({lens:?}, Tq {tq}, Hq {hq}, Hkv {hkv}, d {d}, page {page}): ok ({:.1} s)",
            started.elapsed().as_secs_f64()
        );
    }
    println!("wgpu paged attention: worst rel_rms against the decoded oracle {worst:.2e}");
}

#[test]
fn a_prepared_launch_follows_the_cache_as_it_grows() {
    let Some(wgpu) = common::device("a_prepared_launch_follows_the_cache_as_it_grows") else {
        return;
    };
    let (hq, hkv, d) = (8, 2, 128);
    let case = PagedCase::new(&[200, 90], 1, hq, hkv, d, 9);
    let layout = PagedLayout::new(KvScheme::new(d, hkv, 4, 2), 32).unwrap();
    let mut gpu = WgpuPagedKvCache::new(wgpu, layout, 2, 8, 16).unwrap();
    let mut cpu = PagedKvCache::new(layout, 2, 8, 16).unwrap();
    let row = hkv * d;
    let q = HostTensor::from_f32(vec![2, 1, hq, d], case.q.clone()).unwrap();
    let q = WgpuTensor::upload(wgpu, &q).unwrap();
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
            WgpuTensor::upload(
                wgpu,
                &HostTensor::from_f32(vec![2, tn, hkv, d], x.to_vec()).unwrap(),
            )
            .unwrap()
        };
        gpu.append_unchecked(wgpu, &up(&k), &up(&v), &[tn, tn])
            .unwrap();
        let launch = launch.get_or_insert_with(|| {
            let options = WgpuAttnOptions {
                splits: None,
                max_tokens: Some(90),
            };
            prepare_attend(wgpu, &gpu, &q, None, &options).unwrap()
        });
        launch.submit(wgpu, 1).unwrap();
        let o = launch
            .output()
            .download(wgpu)
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
    let Some(wgpu) = common::device("a_failed_append_changes_nothing") else {
        return;
    };
    let (hkv, d) = (2, 64);
    let mut scheme = KvScheme::new(d, hkv, 4, 2);
    scheme.norm_dtype = NormDType::F16;
    let layout = PagedLayout::new(scheme, 16).unwrap();
    let mut gpu = WgpuPagedKvCache::new(wgpu, layout, 1, 4, 4).unwrap();
    let good = vec![0.25f32; 20 * hkv * d];
    let up = |x: &[f32], tn: usize| {
        WgpuTensor::upload(
            wgpu,
            &HostTensor::from_f32(vec![1, tn, hkv, d], x.to_vec()).unwrap(),
        )
        .unwrap()
    };
    gpu.append(wgpu, &up(&good, 20), &up(&good, 20), &[20])
        .unwrap();
    let (table, pool) = (gpu.block_table().to_vec(), gpu.download_pool(wgpu).unwrap());
    let mut nan = vec![0.25f32; 30 * hkv * d];
    nan[777] = f32::NAN;
    let half = vec![0.5f32; 30 * hkv * d];
    assert!(
        gpu.append(wgpu, &up(&nan, 30), &up(&half, 30), &[30])
            .is_err()
    );
    let huge = vec![1e5f32; 30 * hkv * d];
    assert!(
        gpu.append(wgpu, &up(&huge, 30), &up(&huge, 30), &[30])
            .is_err()
    );
    assert!(
        gpu.append(wgpu, &up(&huge, 30), &up(&huge, 30), &[45])
            .is_err()
    ); // count > Tn
    assert_eq!(gpu.lens(), &[20]);
    assert_eq!(gpu.block_table(), table.as_slice());
    // The pages past the held tokens may hold the refused codes; the held ones are unchanged.
    let after = gpu.download_pool(wgpu).unwrap();
    let page_words = layout.page_words();
    let first = table[0] as usize * page_words;
    assert_eq!(
        &after[first..first + page_words],
        &pool[first..first + page_words]
    );
    // The cache still works: the next append lands at token 20.
    gpu.append(wgpu, &up(&good, 20), &up(&good, 20), &[20])
        .unwrap();
    assert_eq!(gpu.lens(), &[40]);
}

/// A prepared append submitted after another append moved the sequence past the pages the
/// preparation assigned (its `# Safety`-style misuse): the tokens whose page is not in the
/// table (an unassigned entry, or past the table's row) are refused by the shader, so the pool
/// stays as it was, where the clamped and defaulted indexing wrote page 0 or the next row's
/// pages. Both: a table with spare entries and a full one.
#[test]
fn a_prepared_append_submitted_after_the_table_moved_writes_no_page() {
    let Some(wgpu) = common::device("a_prepared_append_after_the_table_moved") else {
        return;
    };
    let (hkv, d, page) = (2, 64, 16);
    let layout = PagedLayout::new(KvScheme::new(d, hkv, 4, 2), page).unwrap();
    let up = |tn: usize, value: f32| {
        let x: Vec<f32> = (0..2 * tn * hkv * d)
            .map(|i| value + (i % 7) as f32 * 0.01)
            .collect();
        WgpuTensor::upload(wgpu, &HostTensor::from_f32(vec![2, tn, hkv, d], x).unwrap()).unwrap()
    };
    for max_pages in [4, 8] {
        let mut gpu = WgpuPagedKvCache::new(wgpu, layout, 2, max_pages, 2 * max_pages).unwrap();
        gpu.append(wgpu, &up(page, 0.5), &up(page, 0.25), &[page, page])
            .unwrap();
        let launch = gpu
            .prepare_append(wgpu, &up(page, 2.0), &up(page, 3.0), &[page, 0])
            .unwrap()
            .expect("one sequence appends");
        // Sequence 0 grows to four pages: the prepared tokens now fall on entry 4.
        gpu.append(
            wgpu,
            &up(3 * page, 0.75),
            &up(3 * page, 0.5),
            &[3 * page, 0],
        )
        .unwrap();
        let before = gpu.download_pool(wgpu).unwrap();
        launch.submit(wgpu, 1).unwrap();
        let after = gpu.download_pool(wgpu).unwrap();
        assert!(
            before == after,
            "max_pages {max_pages}: a page changed ({} of {} words)",
            before.iter().zip(&after).filter(|(a, b)| a != b).count(),
            before.len()
        );
        // The cache goes on: a checked append still lands where it should.
        gpu.append(wgpu, &up(1, 1.0), &up(1, 1.0), &[0, 1]).unwrap();
        assert_eq!(gpu.lens(), &[4 * page, page + 1]);
    }
    println!("prepared append after the table moved: no page written");
}
