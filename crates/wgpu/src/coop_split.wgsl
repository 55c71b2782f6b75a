// Y = X B / 2 to f32 accuracy on f16 matrix units (coop_split_step.wgsl), the state pass's
// product shape (X a chunk's 32 x 128 rows, B a 128 x 16 tile of the state), with X and B split
// into f16 halves in workgroup memory; the result is scaled on the matrix and stored straight
// to memory. One subgroup of 32 invocations per batch entry, both 16-row tiles in turn; every
// cooperative operand is uniform.
//
// The staged halves pass from plain stores through a workgroup barrier to cooperative loads;
// naga 30 declares the Vulkan memory model for modules with cooperative matrices without
// making those stores available (wgpu issue 8805), so `coop_split_storage.wgsl` reads
// host-split halves from storage instead, for comparison.

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

const ROWS: u32 = 32u;
const DEPTH: u32 = 128u;
const COLS: u32 = 16u;
// Row strides of the staged halves in f16 elements (16 bytes past a row): the 16 rows of a
// tile then start in different banks.
const X_STRIDE: u32 = 136u;
const Y_STRIDE: u32 = 24u;

var<workgroup> x_hi: array<f16, 4352>;
var<workgroup> x_lo: array<f16, 4352>;
var<workgroup> y_hi: array<f16, 3072>;
var<workgroup> y_lo: array<f16, 3072>;

@compute @workgroup_size(32)
fn coop_split_product(
    @builtin(local_invocation_index) tid: u32,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let entry = wid.x;
    for (var e = tid; e < ROWS * DEPTH; e += 32u) {
        let v = x[entry * ROWS * DEPTH + e];
        let halves = split_f16(v);
        let at = (e / DEPTH) * X_STRIDE + e % DEPTH;
        x_hi[at] = halves.x;
        x_lo[at] = halves.y;
    }
    for (var e = tid; e < DEPTH * COLS; e += 32u) {
        let v = y[entry * DEPTH * COLS + e];
        let halves = split_f16(v);
        let at = (e / COLS) * Y_STRIDE + e % COLS;
        y_hi[at] = halves.x;
        y_lo[at] = halves.y;
    }
    workgroupBarrier();
    for (var row0 = 0u; row0 < ROWS; row0 += 16u) {
        var high = coop_mat16x16<f32, C>();
        var cross = coop_mat16x16<f32, C>();
        for (var k0 = 0u; k0 < DEPTH; k0 += 16u) {
            let a_hi = coopLoadT<coop_mat16x16<f16, A>>(&x_hi[row0 * X_STRIDE + k0], X_STRIDE);
            let a_lo = coopLoadT<coop_mat16x16<f16, A>>(&x_lo[row0 * X_STRIDE + k0], X_STRIDE);
            let b_hi = coopLoadT<coop_mat16x16<f16, B>>(&y_hi[k0 * Y_STRIDE], Y_STRIDE);
            let b_lo = coopLoadT<coop_mat16x16<f16, B>>(&y_lo[k0 * Y_STRIDE], Y_STRIDE);
            add_split_products(&high, &cross, a_hi, a_lo, b_hi, b_lo);
        }
        let result = split_sum(high, cross) * 0.5;
        coopStoreT(result, &out[(entry * ROWS + row0) * COLS], COLS);
    }
}
