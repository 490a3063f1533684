// One (rows, cols) tile of the distance matrix between query rows and reference rows.
//
//   out[r * out_stride + out_col0 + c] = metric(queries[r], refs[c])
//
// The uniform block, the bindings and `load` are common/tile.wgsl's (composed in front),
// shared with the GEMM family; the epilogue is common/metric.wgsl's `metric_of`.
//
// Each workgroup owns a BLOCK x BLOCK block of the tile (BLOCK = 64, set from Rust); each of its
// THREADS x THREADS invocations owns a 4 x 4 register block. The dot products are accumulated
// over 16-wide slices of the dimension staged in workgroup memory (transposed, so that one vec4
// read gives four rows or four columns), which makes every global load feed 64 multiply-adds.
// Staging writes whole vectors: an invocation loads a 4 x 4 block (four rows, four depths),
// transposes it in registers and stores four vec4s, one per depth. (A store to one component
// of a vec4 in workgroup memory may rewrite the whole vector: Apple's compiler does, which
// would race the other three invocations writing the same vector.)
//
// The metric is applied in the epilogue from the dot product and the squared norms (computed
// beforehand by row_norms.wgsl), exactly as torch.cdist does for large inputs:
//   d2 = |q|^2 + |r|^2 - 2 q.r, clamped at 0 against round-off.
// With normalisation, q and r are scaled by 1 / max(|x|, 1e-12) (torch F.normalize's rule).

// Rows and columns per workgroup: set from Rust (distance_tile::BLOCK), a multiple of 32.
override BLOCK: u32;
// Invocations per side; each owns a 4 x 4 register block.
override THREADS: u32 = BLOCK / 4u;
const SLAB4: u32 = 4u;       // vec4s of depth staged per step (16 floats)
const SLAB: u32 = 16u;       // floats of depth staged per step
override SLAB_VECS: u32 = SLAB * THREADS;

// slab[d * THREADS + i] holds rows (or columns) 4i .. 4i + 3 at depth d of the current slice.
var<workgroup> q_slab: array<vec4<f32>, SLAB_VECS>;
var<workgroup> r_slab: array<vec4<f32>, SLAB_VECS>;

fn finish(dot_raw: f32, row: u32, col: u32) -> f32 {
    let q2 = query_sq_norms[row];
    let r2 = ref_sq_norms[params.ref_row0 + col];
    return metric_of(
        params.metric,
        params.normalize,
        dot_raw,
        vec2<f32>(q2, inv_norm(q2)),
        vec2<f32>(r2, inv_norm(r2)),
    );
}

@compute @workgroup_size(THREADS, THREADS, 1)
fn main(
    @builtin(local_invocation_id) lid: vec3<u32>,
    @builtin(workgroup_id) wid: vec3<u32>,
) {
    let tx = lid.x;
    let ty = lid.y;
    let flat = ty * THREADS + tx;
    let row0 = wid.y * BLOCK;
    let col0 = wid.x * BLOCK;

    // Staging: 4 * THREADS invocations per side, each a 4 x 4 block: rows 4g .. 4g + 3 at vec4
    // kq of the slice. Four neighbouring invocations read the four vec4s of the same rows, so
    // a row's 64 bytes are read together; the rest of the workgroup waits at the barrier.
    let stagers = 4u * THREADS;
    let side = flat / stagers;
    let kq = flat % 4u;
    let g = (flat / 4u) % THREADS;

    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);

    for (var k4 = 0u; k4 < params.dim4; k4 += SLAB4) {
        if (side < 2u) {
            let first = select(col0, row0, side == 0u) + 4u * g;
            let b0 = load(side, first, k4 + kq);
            let b1 = load(side, first + 1u, k4 + kq);
            let b2 = load(side, first + 2u, k4 + kq);
            let b3 = load(side, first + 3u, k4 + kq);
            // The 4 x 4 block transposed: for each depth 4 kq + c, the four rows as one vector.
            let at = kq * 4u * THREADS + g;
            let t0 = vec4<f32>(b0.x, b1.x, b2.x, b3.x);
            let t1 = vec4<f32>(b0.y, b1.y, b2.y, b3.y);
            let t2 = vec4<f32>(b0.z, b1.z, b2.z, b3.z);
            let t3 = vec4<f32>(b0.w, b1.w, b2.w, b3.w);
            if (side == 0u) {
                q_slab[at] = t0;
                q_slab[at + THREADS] = t1;
                q_slab[at + 2u * THREADS] = t2;
                q_slab[at + 3u * THREADS] = t3;
            } else {
                r_slab[at] = t0;
                r_slab[at + THREADS] = t1;
                r_slab[at + 2u * THREADS] = t2;
                r_slab[at + 3u * THREADS] = t3;
            }
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
