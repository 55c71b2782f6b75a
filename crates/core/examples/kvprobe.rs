use deltakv_core::kv::*;
use deltakv_core::rng::Rng;
use std::time::Instant;
fn main() {
    let ctx: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse().unwrap())
        .unwrap_or(32768);
    let mode = std::env::args().nth(2).unwrap_or("c".into());
    let (hq, hkv, d) = (32, 8, 128);
    let mut cache = KvCache::new(KvScheme::new(d, hkv, 4, 2), 1).unwrap();
    let mut dense = DenseKvCache::new(d, hkv, 1).unwrap();
    let mut rng = Rng::new(1);
    let k = rng.uniform_vec(ctx * hkv * d, -1.0, 1.0);
    if mode == "c" {
        cache.append(0, &k, &k).unwrap();
    } else {
        dense.append(0, &k, &k).unwrap();
    }
    let q = rng.normal_vec(hq * d, 1.0);
    let o = AttnOptions::default();
    let cpu = || {
        let st = std::fs::read_to_string("/proc/self/stat").unwrap();
        let f: Vec<&str> = st.rsplit(')').next().unwrap().split_whitespace().collect();
        (f[11].parse::<f64>().unwrap() + f[12].parse::<f64>().unwrap()) * 10.0
    };
    let c0 = cpu();
    let mut times = vec![];
    for _ in 0..30 {
        let t = Instant::now();
        if mode == "c" {
            attend_compressed(&cache, &q, 1, hq, 0.1, &o).unwrap();
        } else {
            attend_dense(&dense, &q, 1, hq, 0.1, &o).unwrap();
        }
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    let cpu_ms = (cpu() - c0) / 30.0;
    times.sort_by(f64::total_cmp);
    println!("cpu ms per call {cpu_ms:.2}");
    println!(
        "{mode} ctx {ctx}: median {:.2} ms min {:.2}",
        times[15], times[0]
    );
}
