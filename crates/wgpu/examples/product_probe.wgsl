// Probes for `examples/product_probe.rs`: the f32 multiply-add rate of the device through WGSL,
// and the chunked prefill's W S product alone (32 chunk rows x 128 by 128 x 16 or 32 columns,
// both operands in workgroup memory) in the thread layouts of the state kernels, repeated REPS
// times per workgroup with a barrier after each repetition, as the walk does.

override REPS: u32 = 256u;

@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read_write> dst: array<vec4<f32>>;

// Eight independent vec4 chains per thread, REPS x 64 steps each: 2 x 4 x 8 x 64 x REPS flops
// per thread.
@compute @workgroup_size(256)
fn fma_peak(@builtin(global_invocation_id) gid: vec3<u32>) {
    let a = src[0];
    let b = src[1];
    var c0 = src[2];
    var c1 = src[3];
    var c2 = src[4];
    var c3 = src[5];
    var c4 = src[6];
    var c5 = src[7];
    var c6 = src[8];
    var c7 = src[9];
    for (var i = 0u; i < REPS * 64u; i++) {
        c0 = fma(c0, a, b);
        c1 = fma(c1, a, b);
        c2 = fma(c2, a, b);
        c3 = fma(c3, a, b);
        c4 = fma(c4, a, b);
        c5 = fma(c5, a, b);
        c6 = fma(c6, a, b);
        c7 = fma(c7, a, b);
    }
    dst[gid.x] = c0 + c1 + c2 + c3 + c4 + c5 + c6 + c7;
}

// W [32][33] vec4 (rows of 32 words, one word of padding) and S in the layout each probe
// names, both filled once from `src`.
var<workgroup> probe_w: array<vec4<f32>, 1056>;
var<workgroup> probe_s: array<vec4<f32>, 1056>;

fn fill(tid: u32) {
    for (var i = tid; i < 1056u; i += 256u) {
        probe_w[i] = src[i % 64u];
        probe_s[i] = src[(i + 7u) % 64u];
    }
    workgroupBarrier();
}

// The 16-column staged kernel's layout: thread (rg, cp) sums chunk rows rg and rg ^ 16 over one
// half of K at columns 2 cp, 2 cp + 1; S by columns ([16][33], even columns first). 256
// multiply-adds per thread and repetition.
@compute @workgroup_size(256)
fn ws_pairs(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    fill(tid);
    let cp = tid % 8u;
    let rg = tid / 8u;
    let first = (rg / 16u) * 16u;
    let own = rg * 33u;
    let other = (rg ^ 16u) * 33u;
    let even = cp * 33u;
    let odd = (8u + cp) * 33u;
    var a = vec2<f32>(0.0);
    var b = vec2<f32>(0.0);
    for (var rep = 0u; rep < REPS; rep++) {
        for (var r4 = first; r4 < first + 16u; r4++) {
            let sa = probe_s[even + r4];
            let sb = probe_s[odd + r4];
            let wa = probe_w[own + r4];
            let wb = probe_w[other + r4];
            a += vec2<f32>(dot(wa, sa), dot(wa, sb));
            b += vec2<f32>(dot(wb, sa), dot(wb, sb));
        }
        workgroupBarrier();
    }
    dst[wid.x * 256u + tid] = vec4<f32>(a, b);
}

// The wide kernel's layout: threads 0 .. 127 sum chunk rows 2 rp, 2 rp + 1 over K at columns
// 4 cq .. 4 cq + 3; S by rows ([128][8]). 1024 multiply-adds per working thread and repetition.
@compute @workgroup_size(256)
fn ws_rows2(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    fill(tid);
    let cq = tid % 8u;
    let rp = (tid / 8u) % 16u;
    let row_a = (2u * rp) * 33u;
    let row_b = row_a + 33u;
    var acc_a = vec4<f32>(0.0);
    var acc_b = vec4<f32>(0.0);
    for (var rep = 0u; rep < REPS; rep++) {
        if tid < 128u {
            for (var w = 0u; w < 32u; w++) {
                let xa = probe_w[row_a + w];
                let xb = probe_w[row_b + w];
                let k = 4u * w;
                let s0 = probe_s[k * 8u + cq];
                let s1 = probe_s[(k + 1u) * 8u + cq];
                let s2 = probe_s[(k + 2u) * 8u + cq];
                let s3 = probe_s[(k + 3u) * 8u + cq];
                acc_a += xa.x * s0 + xa.y * s1 + xa.z * s2 + xa.w * s3;
                acc_b += xb.x * s0 + xb.y * s1 + xb.z * s2 + xb.w * s3;
            }
        }
        workgroupBarrier();
    }
    dst[wid.x * 256u + tid] = acc_a + acc_b;
}

// The same as ws_rows2 with every thread working: threads 128 .. 255 sum the other half of K
// (their sums are not joined: a rate probe). 512 multiply-adds per thread and repetition.
@compute @workgroup_size(256)
fn ws_rows2_halves(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    fill(tid);
    let cq = tid % 8u;
    let rp = (tid / 8u) % 16u;
    let first = (tid / 128u) * 16u;
    let row_a = (2u * rp) * 33u;
    let row_b = row_a + 33u;
    var acc_a = vec4<f32>(0.0);
    var acc_b = vec4<f32>(0.0);
    for (var rep = 0u; rep < REPS; rep++) {
        for (var w = first; w < first + 16u; w++) {
            let xa = probe_w[row_a + w];
            let xb = probe_w[row_b + w];
            let k = 4u * w;
            let s0 = probe_s[k * 8u + cq];
            let s1 = probe_s[(k + 1u) * 8u + cq];
            let s2 = probe_s[(k + 2u) * 8u + cq];
            let s3 = probe_s[(k + 3u) * 8u + cq];
            acc_a += xa.x * s0 + xa.y * s1 + xa.z * s2 + xa.w * s3;
            acc_b += xb.x * s0 + xb.y * s1 + xb.z * s2 + xb.w * s3;
        }
        workgroupBarrier();
    }
    dst[wid.x * 256u + tid] = acc_a + acc_b;
}

// 4 x 4 blocks: threads 0 .. 63 sum chunk rows 4 rb .. 4 rb + 3 over K at columns
// 4 cq .. 4 cq + 3 (S by rows). 2048 multiply-adds per working thread and repetition.
@compute @workgroup_size(256)
fn ws_rows4(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    fill(tid);
    let cq = tid % 8u;
    let rb = (tid / 8u) % 8u;
    let row = (4u * rb) * 33u;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);
    for (var rep = 0u; rep < REPS; rep++) {
        if tid < 64u {
            for (var w = 0u; w < 32u; w++) {
                let x0 = probe_w[row + w];
                let x1 = probe_w[row + 33u + w];
                let x2 = probe_w[row + 66u + w];
                let x3 = probe_w[row + 99u + w];
                let k = 4u * w;
                let s0 = probe_s[k * 8u + cq];
                let s1 = probe_s[(k + 1u) * 8u + cq];
                let s2 = probe_s[(k + 2u) * 8u + cq];
                let s3 = probe_s[(k + 3u) * 8u + cq];
                acc0 += x0.x * s0 + x0.y * s1 + x0.z * s2 + x0.w * s3;
                acc1 += x1.x * s0 + x1.y * s1 + x1.z * s2 + x1.w * s3;
                acc2 += x2.x * s0 + x2.y * s1 + x2.z * s2 + x2.w * s3;
                acc3 += x3.x * s0 + x3.y * s1 + x3.z * s2 + x3.w * s3;
            }
        }
        workgroupBarrier();
    }
    dst[wid.x * 256u + tid] = acc0 + acc1 + acc2 + acc3;
}
