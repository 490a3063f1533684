// One (rows, cols) tile of the distance matrix between query rows and reference rows.
//
//   out[r * out_stride + out_col0 + c] = metric(queries[r], refs[c])
//
// The tile may be one column block of a wider row-major matrix (references split into pages):
// out_stride is that matrix's row length and out_col0 the block's first column. Reference c is
// row ref_row0 + c of the refs buffer, so a tile can start inside a page.
//
// Each workgroup owns a 64 x 64 block of the tile; each of its 16 x 16 invocations owns a 4 x 4
// register block. The dot products are accumulated over 16-wide slices of the dimension staged
// in workgroup memory (transposed, so that one vec4 read gives four rows or four columns), which
// makes every global load feed 64 multiply-adds. Rows are padded by the host to a multiple of 4
// floats with zeros, so vec4 loads need no tail handling and the zeros change no dot product.
//
// The metric is applied in the epilogue from the dot product and the squared norms (computed
// beforehand by row_norms.wgsl), exactly as torch.cdist does for large inputs:
//   d2 = |q|^2 + |r|^2 - 2 q.r, clamped at 0 against round-off.
// With normalisation, q and r are scaled by 1 / max(|x|, 1e-12) (torch F.normalize's rule).

struct Params {
    rows: u32,
    cols: u32,
    dim4: u32,
    // 0: Euclidean, 1: squared Euclidean, 2: cosine similarity, 3: dot product.
    metric: u32,
    normalize: u32,
    out_stride: u32,
    out_col0: u32,
    ref_row0: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> queries: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> refs: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> query_sq_norms: array<f32>;
@group(0) @binding(4) var<storage, read> ref_sq_norms: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

const BLOCK: u32 = 64u;      // rows and columns per workgroup
const THREADS: u32 = 16u;    // invocations per side
const SLAB4: u32 = 4u;       // vec4s of depth staged per step (16 floats)
const SLAB: u32 = 16u;       // floats of depth staged per step

// slab[d * 16 + i] holds rows (or columns) 4i .. 4i + 3 at depth d of the current slice.
var<workgroup> q_slab: array<vec4<f32>, 256>;
var<workgroup> r_slab: array<vec4<f32>, 256>;

fn finish(dot_raw: f32, row: u32, col: u32) -> f32 {
    var q2 = query_sq_norms[row];
    var r2 = ref_sq_norms[params.ref_row0 + col];
    var d = dot_raw;
    if (params.normalize != 0u) {
        let iq = 1.0 / max(sqrt(q2), 1e-12);
        let ir = 1.0 / max(sqrt(r2), 1e-12);
        d = d * iq * ir;
        q2 = q2 * iq * iq;
        r2 = r2 * ir * ir;
    }
    switch params.metric {
        case 0u: {
            return sqrt(max(q2 + r2 - 2.0 * d, 0.0));
        }
        case 1u: {
            return max(q2 + r2 - 2.0 * d, 0.0);
        }
        default: {
            return d;
        }
    }
}

@compute @workgroup_size(16, 16, 1)
fn main(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let tx = lid.x;
    let ty = lid.y;
    let flat = ty * THREADS + tx;
    let row0 = wid.y * BLOCK;
    let col0 = wid.x * BLOCK;

    // Each invocation stages one vec4 of the query slice and one of the reference slice.
    let load_item = flat / SLAB4;
    let load_k = flat % SLAB4;
    let q_row = row0 + load_item;
    let r_col = col0 + load_item;

    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);

    for (var k4 = 0u; k4 < params.dim4; k4 += SLAB4) {
        let k = k4 + load_k;
        var qv = vec4<f32>(0.0);
        var rv = vec4<f32>(0.0);
        if (q_row < params.rows && k < params.dim4) {
            qv = queries[q_row * params.dim4 + k];
        }
        if (r_col < params.cols && k < params.dim4) {
            rv = refs[(params.ref_row0 + r_col) * params.dim4 + k];
        }
        let slot = load_item / 4u;
        let lane = load_item % 4u;
        for (var c = 0u; c < 4u; c++) {
            let depth = load_k * 4u + c;
            q_slab[depth * THREADS + slot][lane] = qv[c];
            r_slab[depth * THREADS + slot][lane] = rv[c];
        }
        workgroupBarrier();
        for (var depth = 0u; depth < SLAB; depth++) {
            let a = q_slab[depth * THREADS + ty];
            let b = r_slab[depth * THREADS + tx];
            acc0 = fma(vec4<f32>(a.x), b, acc0);
            acc1 = fma(vec4<f32>(a.y), b, acc1);
            acc2 = fma(vec4<f32>(a.z), b, acc2);
            acc3 = fma(vec4<f32>(a.w), b, acc3);
        }
        workgroupBarrier();
    }

    let acc = array<vec4<f32>, 4>(acc0, acc1, acc2, acc3);
    for (var i = 0u; i < 4u; i++) {
        let row = row0 + ty * 4u + i;
        if (row >= params.rows) {
            break;
        }
        for (var j = 0u; j < 4u; j++) {
            let col = col0 + tx * 4u + j;
            if (col < params.cols) {
                out[row * params.out_stride + params.out_col0 + col] = finish(acc[i][j], row, col);
            }
        }
    }
}
