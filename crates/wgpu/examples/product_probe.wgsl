// Probes for `examples/product_probe.rs` (with staged_s_columns.wgsl appended): the f32 multiply-add rate of the device through WGSL,
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

// W as the staged kernel keeps it ([32][33] vec4: rows of 32 words, one of padding), S by rows
// ([128][8] vec4) for the layouts below, and S by columns in the staged kernel's `block_s`
// (staged_s_columns.wgsl, appended to this file by the launcher), each filled from `src` by
// the probes that read it.
const STAGE_PAD: u32 = 1u;
var<workgroup> staged: array<vec4<f32>, 1056>;
var<workgroup> probe_s: array<vec4<f32>, 1024>;

fn fill_w(tid: u32) {
    for (var i = tid; i < 1056u; i += 256u) {
        staged[i] = src[i % 64u];
    }
    workgroupBarrier();
}

fn fill_s_rows(tid: u32) {
    for (var i = tid; i < 1024u; i += 256u) {
        probe_s[i] = src[(i + 7u) % 64u];
    }
    workgroupBarrier();
}

fn fill_s_columns(tid: u32) {
    for (var i = tid; i < 528u; i += 256u) {
        block_s[i] = src[(i + 7u) % 64u];
    }
    workgroupBarrier();
}

// The staged kernel's own products (`staged_half_products`): thread (rg, cp) sums chunk rows rg
// and rg ^ 16 over one half of K at columns 2 cp, 2 cp + 1. 256 multiply-adds per thread and
// repetition.
@compute @workgroup_size(256)
fn ws_pairs(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    fill_w(tid);
    fill_s_columns(tid);
    var acc = vec4<f32>(0.0);
    for (var rep = 0u; rep < REPS; rep++) {
        acc += staged_half_products(tid / 8u, 32u, tid % 8u);
        workgroupBarrier();
    }
    dst[wid.x * 256u + tid] = acc;
}

// Two chunk rows' sums at four columns.
struct Rows2 {
    a: vec4<f32>,
    b: vec4<f32>,
}

// Chunk rows 2 rp and 2 rp + 1 of W times S (by rows) at columns 4 cq .. 4 cq + 3 over the words
// first .. first + words of K, added to `acc`.
fn rows2_words(rp: u32, cq: u32, first: u32, words: u32, acc: Rows2) -> Rows2 {
    let row_a = (2u * rp) * 33u;
    let row_b = row_a + 33u;
    var sum = acc;
    for (var w = first; w < first + words; w++) {
        let xa = staged[row_a + w];
        let xb = staged[row_b + w];
        let k = 4u * w;
        let s0 = probe_s[k * 8u + cq];
        let s1 = probe_s[(k + 1u) * 8u + cq];
        let s2 = probe_s[(k + 2u) * 8u + cq];
        let s3 = probe_s[(k + 3u) * 8u + cq];
        sum.a += xa.x * s0 + xa.y * s1 + xa.z * s2 + xa.w * s3;
        sum.b += xb.x * s0 + xb.y * s1 + xb.z * s2 + xb.w * s3;
    }
    return sum;
}

// Two rows x four columns over K on threads 0 .. 127 (the wide kernel's layout of tuning log
// row 24). 1024 multiply-adds per working thread and repetition.
@compute @workgroup_size(256)
fn ws_rows2(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    fill_w(tid);
    fill_s_rows(tid);
    var acc = Rows2(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var rep = 0u; rep < REPS; rep++) {
        if tid < 128u {
            acc = rows2_words((tid / 8u) % 16u, tid % 8u, 0u, 32u, acc);
        }
        workgroupBarrier();
    }
    dst[wid.x * 256u + tid] = acc.a + acc.b;
}

// The same with every thread working: threads 128 .. 255 sum the other half of K (their sums are
// not joined: a rate probe). 512 multiply-adds per thread and repetition.
@compute @workgroup_size(256)
fn ws_rows2_halves(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    fill_w(tid);
    fill_s_rows(tid);
    var acc = Rows2(vec4<f32>(0.0), vec4<f32>(0.0));
    for (var rep = 0u; rep < REPS; rep++) {
        acc = rows2_words((tid / 8u) % 16u, tid % 8u, (tid / 128u) * 16u, 16u, acc);
        workgroupBarrier();
    }
    dst[wid.x * 256u + tid] = acc.a + acc.b;
}

// 4 x 4 blocks: threads 0 .. 63 sum chunk rows 4 rb .. 4 rb + 3 over K at columns
// 4 cq .. 4 cq + 3 (S by rows). 2048 multiply-adds per working thread and repetition.
@compute @workgroup_size(256)
fn ws_rows4(@builtin(local_invocation_index) tid: u32, @builtin(workgroup_id) wid: vec3<u32>) {
    fill_w(tid);
    fill_s_rows(tid);
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
                let x0 = staged[row + w];
                let x1 = staged[row + 33u + w];
                let x2 = staged[row + 66u + w];
                let x3 = staged[row + 99u + w];
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
