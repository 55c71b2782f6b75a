// Y = X B / 2 to f32 accuracy on f16 matrix units, the state pass's product shape (X a chunk's
// 32 x 128 rows, B a 128 x 16 tile of the state): X and B split into f16 high and low parts
// in workgroup memory (x = hi + lo, lo the f16 rounding of x - hi), three products per
// 16 x 16 x 16 step (hi hi + hi lo + lo hi) accumulated in f32, the result scaled on the
// matrix and stored through workgroup memory. One subgroup of 32 invocations per batch entry,
// both 16-row tiles in turn; every cooperative operand is uniform.

enable f16;
enable wgpu_cooperative_matrix;

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

const ROWS: u32 = 32u;
const DEPTH: u32 = 128u;
const COLS: u32 = 16u;

var<workgroup> x_hi: array<f16, 4096>;
var<workgroup> x_lo: array<f16, 4096>;
var<workgroup> y_hi: array<f16, 2048>;
var<workgroup> y_lo: array<f16, 2048>;
var<workgroup> result: array<f32, 512>;

@compute @workgroup_size(32)
fn coop_split_product(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let entry = wid.x;
    for (var e = tid; e < ROWS * DEPTH; e += 32u) {
        let v = x[entry * ROWS * DEPTH + e];
        let hi = f16(v);
        x_hi[e] = hi;
        x_lo[e] = f16(v - f32(hi));
    }
    for (var e = tid; e < DEPTH * COLS; e += 32u) {
        let v = y[entry * DEPTH * COLS + e];
        let hi = f16(v);
        y_hi[e] = hi;
        y_lo[e] = f16(v - f32(hi));
    }
    workgroupBarrier();
    for (var row0 = 0u; row0 < ROWS; row0 += 16u) {
        var acc = coop_mat16x16<f32, C>();
        for (var k0 = 0u; k0 < DEPTH; k0 += 16u) {
            let a_hi = coopLoadT<coop_mat16x16<f16, A>>(&x_hi[row0 * DEPTH + k0], DEPTH);
            let a_lo = coopLoadT<coop_mat16x16<f16, A>>(&x_lo[row0 * DEPTH + k0], DEPTH);
            let b_hi = coopLoadT<coop_mat16x16<f16, B>>(&y_hi[k0 * COLS], COLS);
            let b_lo = coopLoadT<coop_mat16x16<f16, B>>(&y_lo[k0 * COLS], COLS);
            acc = coopMultiplyAdd(a_hi, b_hi, acc);
            acc = coopMultiplyAdd(a_hi, b_lo, acc);
            acc = coopMultiplyAdd(a_lo, b_hi, acc);
        }
        acc = acc * 0.5;
        coopStoreT(acc, &result[row0 * COLS], COLS);
    }
    workgroupBarrier();
    for (var e = tid; e < ROWS * COLS; e += 32u) {
        out[entry * ROWS * COLS + e] = result[e];
    }
}
