// Squared L2 norm of every row of a (rows, dim4 * 4) row-major f32 matrix.
//
// One invocation per row. Rows are stored as vec4 (the host pads dim to a multiple of 4 with
// zeros, which changes no norm), so each load moves 16 bytes. The dispatch may be 2-D when
// rows exceed 65 535 workgroups of 256: the row index folds y into x.

struct Params {
    rows: u32,
    dim4: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> params: Params;
@group(0) @binding(1) var<storage, read> matrix: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> sq_norms: array<f32>;

// Invocations per workgroup: set from Rust (row_norms::WORKGROUP_SIZE).
override WORKGROUP_SIZE: u32;

@compute @workgroup_size(WORKGROUP_SIZE, 1, 1)
fn main(
    @builtin(global_invocation_id) gid: vec3<u32>,
    @builtin(num_workgroups) groups: vec3<u32>,
) {
    let row = gid.x + gid.y * groups.x * WORKGROUP_SIZE;
    // The last workgroup overhangs the matrix; those invocations have nothing to do.
    if (row >= params.rows) {
        return;
    }
    var acc = 0.0;
    let base = row * params.dim4;
    for (var k = 0u; k < params.dim4; k++) {
        let v = matrix[base + k];
        acc += dot(v, v);
    }
    sq_norms[row] = acc;
}
